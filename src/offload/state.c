/*
 * state.c — reading and writing the committed optimizer state: raw regions (bitwise tests,
 * checkpoints), decoded fp32 views, the initial master weights and the step count.
 *
 * Why they go through the committed slot: after a failed step the state of the previous step
 * must be readable as it was, and a checkpoint must capture a state that a step completed.
 * These calls are only allowed between steps; on NVMe they use staging buffer 0 synchronously.
 */
#include "offload/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The base address of one region (master, m, v, or a moment's 8-bit scales) in a slice view. */
static char *region_base(const struct mw_optim_slice *s, int region)
{
    return ofl_slice_region(s, (enum ofl_region)region);
}

int mw_offload_read_raw(struct mw_offload *e, int region, uint64_t first, uint64_t n, void *dst)
{
    int rc = ofl_check_range(e, first, n, "read");
    if (rc) return rc;
    if (region < 0 || region >= OFL_NREGIONS) return mw_error_set(-EINVAL, "offload read: bad region %d", region);
    if ((rc = ofl_check_quiet(e, "read"))) return rc;
    enum ofl_region r = (enum ofl_region)region;
    int scale = ofl_regions[r].elem == OFL_ELEM_SCALE;
    if (scale && e->cfg.moments != MW_OFFLOAD_M_8BIT) return 0;
    if (scale && first % MW_Q8_BLOCK) return mw_error_set(-EINVAL, "offload read: scales start at a block");
    int cur = (int)(e->committed % 2);
    uint32_t lo, hi;
    ofl_sg_span(e, first, n, &lo, &hi);
    char *out = dst;
    for (uint32_t i = lo; i <= hi; i++) {
        const struct mw_offload_subgroup *g = &e->sgs[i];
        uint64_t a = MW_MAX(first, g->first), b = MW_MIN(first + n, g->first + g->n);
        struct mw_optim_slice s;
        if (e->txn) {
            if ((rc = ofl_slot_load(e, i, cur))) return rc;
            ofl_view_staging(e, i, 0, &s);
        } else ofl_view_home(e, i, 0, &s);
        char *src = region_base(&s, region);
        uint64_t so = ofl_region_offset(&e->cfg, r, a - g->first);
        uint64_t nb = ofl_region_bytes(&e->cfg, r, b - g->first) - so;
        memcpy(out, src + so, nb);
        out += nb;
    }
    return 0;
}

int mw_offload_read_state(struct mw_offload *e, enum mw_offload_kind kind, int which, uint64_t first, uint64_t n, float *dst)
{
    int rc = ofl_check_range(e, first, n, "read");
    if (rc) return rc;
    if (kind == MW_OFFLOAD_MASTER) return mw_offload_read_raw(e, OFL_R_MASTER, first, n, dst);
    if (kind == MW_OFFLOAD_WEIGHTS) {
        if (e->master_alias) return mw_offload_read_raw(e, OFL_R_MASTER, first, n, dst);
        const char *w = e->cfg.ext_weights ? (const char *)e->cfg.ext_weights : (const char *)e->weights.ptr;
        if (e->cfg.weights == MW_OFFLOAD_W_FP32) memcpy(dst, w + 4 * first, 4 * n);
        else if (e->cfg.weights == MW_OFFLOAD_W_BF16) mw_bf16_to_f32_n((const uint16_t *)w + first, dst, n);
        else mw_f16_to_f32_n((const uint16_t *)w + first, dst, n);
        return 0;
    }
    if (kind != MW_OFFLOAD_MOMENTS || which < 0 || which > 1)
        return mw_error_set(-EINVAL, "offload read: kind %d/%d is not readable", (int)kind, which);
    int reg = which ? OFL_R_V : OFL_R_M;
    if (e->cfg.moments == MW_OFFLOAD_M_FP32) return mw_offload_read_raw(e, reg, first, n, dst);
    if (e->cfg.moments == MW_OFFLOAD_M_8BIT)
        return mw_error_set(-ENOTSUP, "offload read: 8-bit moments are read raw (mw_offload_read_raw)");
    uint16_t *tmp = malloc(2 * n);
    if (!tmp) return mw_error_set(-ENOMEM, "offload read: out of memory");
    rc = mw_offload_read_raw(e, reg, first, n, tmp);
    if (!rc) mw_bf16_to_f32_n(tmp, dst, n);
    free(tmp);
    return rc;
}

int mw_offload_write_raw(struct mw_offload *e, int region, uint64_t first, uint64_t n, const void *src)
{
    int rc = ofl_check_range(e, first, n, "write_raw");
    if (rc || (rc = ofl_check_quiet(e, "write_raw"))) return rc;
    if (region < 0 || region >= OFL_NREGIONS) return mw_error_set(-EINVAL, "offload write_raw: bad region %d", region);
    enum ofl_region r = (enum ofl_region)region;
    int scale = ofl_regions[r].elem == OFL_ELEM_SCALE;
    if (scale && e->cfg.moments != MW_OFFLOAD_M_8BIT) return 0;
    if (e->cfg.moments == MW_OFFLOAD_M_8BIT && region != OFL_R_MASTER && first % MW_Q8_BLOCK)
        return mw_error_set(-EINVAL, "offload write_raw: 8-bit moments start at a multiple of %d", MW_Q8_BLOCK);
    int cur = (int)(e->committed % 2);
    uint32_t lo, hi;
    ofl_sg_span(e, first, n, &lo, &hi);
    const char *in = src;
    for (uint32_t i = lo; i <= hi; i++) {
        const struct mw_offload_subgroup *g = &e->sgs[i];
        uint64_t a = MW_MAX(first, g->first), b = MW_MIN(first + n, g->first + g->n);
        struct mw_optim_slice s;
        if (e->txn) {
            if ((rc = ofl_slot_load(e, i, cur))) return rc;
            ofl_view_staging(e, i, 0, &s);
        } else ofl_view_home(e, i, 0, &s);
        char *dst = region_base(&s, region);
        uint64_t so = ofl_region_offset(&e->cfg, r, a - g->first);
        uint64_t nb = ofl_region_bytes(&e->cfg, r, b - g->first) - so;
        memcpy(dst + so, in, nb);
        in += nb;
        if (e->txn && (rc = ofl_slot_store(e, i, cur))) return rc;
        if (region == OFL_R_MASTER) ofl_refresh_weights(e, a, b - a, s.master + (a - g->first));
    }
    return 0;
}

int mw_offload_set_master(struct mw_offload *e, uint64_t first, uint64_t n, const float *src)
{
    if (e->master_alias && src == (const float *)e->cfg.ext_weights + first) return ofl_check_range(e, first, n, "set_master");
    return mw_offload_write_raw(e, OFL_R_MASTER, first, n, src);
}

int mw_offload_set_committed_steps(struct mw_offload *e, uint64_t steps)
{
    int rc = ofl_check_quiet(e, "set_committed_steps");
    if (!rc) rc = ofl_journal_settle(e);
    if (rc) return rc;
    if (e->txn && steps % 2 != e->committed % 2) { /* the committed slot moves: copy every subgroup over */
        for (uint32_t i = 0; i < e->nsg; i++) {
            if ((rc = ofl_slot_load(e, i, (int)(e->committed % 2)))) return rc;
            if ((rc = ofl_slot_store(e, i, (int)(steps % 2)))) return rc;
        }
    }
    e->committed = steps;
    /* The committed slot moved (or the step count did): the record must say so before a step
     * writes into the slot the old record points at. */
    return e->jon ? ofl_journal_write(e, steps) : 0;
}

int mw_offload_set_release(struct mw_offload *e, int grads, int staging)
{
    int rc = ofl_check_quiet(e, "set_release");
    if (!rc) rc = ofl_journal_settle(e);
    if (rc) return rc;
    if (grads && (!e->cfg.ext_grads || !e->cfg.ext_grads_accumulate || e->cfg.stream))
        return mw_error_set(-EINVAL, "offload: releasing gradients needs the caller's accumulated ext_grads "
                            "(ext_grads_accumulate = 1) and no stream function");
    e->cfg.ext_grads_release = grads != 0;
    e->cfg.staging_release = staging != 0;
    for (int b = 0; staging && b < e->nbuf; b++) /* MADV_DONTNEED leaves locked pages alone */
        if ((e->staging[b].flags & MW_BUF_LOCKED) && munlock(e->staging[b].ptr, e->staging[b].reserved) == 0)
            e->staging[b].flags &= ~MW_BUF_LOCKED;
    return 0;
}
