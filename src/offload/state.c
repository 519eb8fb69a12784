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

/* The regions of a read or write of [first, first+n): valid, each at most once; *skip[j] for a
 * scale region of a format that has none (it moves nothing). */
static int regions_check(const struct mw_offload *e, uint64_t first, int nreg, const int *regions, int write,
                         int *skip)
{
    const char *what = write ? "write_raw" : "read";
    if (nreg < 1 || nreg > OFL_NREGIONS || !regions)
        return mw_error_set(-EINVAL, "offload %s: %d regions (1 to %d)", what, nreg, OFL_NREGIONS);
    for (int j = 0; j < nreg; j++) {
        int region = regions[j];
        if (region < 0 || region >= OFL_NREGIONS) return mw_error_set(-EINVAL, "offload %s: bad region %d", what, region);
        for (int k = 0; k < j; k++)
            if (regions[k] == region) return mw_error_set(-EINVAL, "offload %s: region %d given twice", what, region);
        int scale = ofl_regions[region].elem == OFL_ELEM_SCALE, q8 = e->cfg.moments == MW_OFFLOAD_M_8BIT;
        skip[j] = scale && !q8;
        if (!write && scale && q8 && first % MW_Q8_BLOCK)
            return mw_error_set(-EINVAL, "offload read: scales start at a block");
        if (write && q8 && region != OFL_R_MASTER && first % MW_Q8_BLOCK)
            return mw_error_set(-EINVAL, "offload write_raw: 8-bit moments start at a multiple of %d", MW_Q8_BLOCK);
    }
    return 0;
}

int mw_offload_read_regions(struct mw_offload *e, uint64_t first, uint64_t n, int nreg, const int *regions,
                            void *const *dst)
{
    int skip[OFL_NREGIONS], rc = ofl_check_range(e, first, n, "read");
    if (rc || (rc = regions_check(e, first, nreg, regions, 0, skip))) return rc;
    int any = 0;
    for (int j = 0; j < nreg; j++) any |= !skip[j];
    if (!any) return 0; /* scales of a format without them */
    if ((rc = ofl_check_quiet(e, "read"))) return rc;
    int cur = (int)(e->committed % 2);
    uint32_t lo, hi;
    ofl_sg_span(e, first, n, &lo, &hi);
    char *out[OFL_NREGIONS];
    for (int j = 0; j < nreg; j++) out[j] = dst[j];
    for (uint32_t i = lo; i <= hi; i++) {
        const struct mw_offload_subgroup *g = &e->sgs[i];
        uint64_t a = MW_MAX(first, g->first), b = MW_MIN(first + n, g->first + g->n);
        struct mw_optim_slice s;
        if (e->txn) { /* once for all the regions */
            if ((rc = ofl_slot_load(e, i, cur))) return rc;
            ofl_view_staging(e, i, 0, &s);
        } else ofl_view_home(e, i, 0, &s);
        for (int j = 0; j < nreg; j++) {
            if (skip[j]) continue;
            enum ofl_region r = (enum ofl_region)regions[j];
            uint64_t so = ofl_region_offset(&e->cfg, r, a - g->first);
            uint64_t nb = ofl_region_bytes(&e->cfg, r, b - g->first) - so;
            memcpy(out[j], region_base(&s, r) + so, nb);
            out[j] += nb;
        }
    }
    return 0;
}

int mw_offload_read_raw(struct mw_offload *e, int region, uint64_t first, uint64_t n, void *dst)
{
    return mw_offload_read_regions(e, first, n, 1, &region, &dst);
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

int mw_offload_write_regions(struct mw_offload *e, uint64_t first, uint64_t n, int nreg, const int *regions,
                             const void *const *src)
{
    int skip[OFL_NREGIONS], rc = ofl_check_range(e, first, n, "write_raw");
    if (rc || (rc = ofl_check_quiet(e, "write_raw"))) return rc;
    if ((rc = regions_check(e, first, nreg, regions, 1, skip))) return rc;
    int cur = (int)(e->committed % 2), master = 0, given = 0;
    for (int j = 0; j < nreg; j++) {
        master |= regions[j] == OFL_R_MASTER;
        given |= skip[j] ? 0 : 1 << regions[j];
    }
    if (!given) return 0; /* scales of a format without them */
    int present = 0; /* the regions a subgroup's state has: when all are written, nothing is read first */
    for (int r = 0; r < OFL_NREGIONS; r++)
        if (ofl_region_bytes(&e->cfg, (enum ofl_region)r, e->sgs[0].n)) present |= 1 << r;
    uint32_t lo, hi;
    ofl_sg_span(e, first, n, &lo, &hi);
    const char *in[OFL_NREGIONS];
    for (int j = 0; j < nreg; j++) in[j] = src[j];
    for (uint32_t i = lo; i <= hi; i++) {
        const struct mw_offload_subgroup *g = &e->sgs[i];
        uint64_t a = MW_MAX(first, g->first), b = MW_MIN(first + n, g->first + g->n);
        struct mw_optim_slice s;
        if (e->txn) {
            int whole = a == g->first && b == g->first + g->n && (given & present) == present;
            if (!whole && (rc = ofl_slot_load(e, i, cur))) return rc;
            ofl_view_staging(e, i, 0, &s);
        } else ofl_view_home(e, i, 0, &s);
        for (int j = 0; j < nreg; j++) {
            if (skip[j]) continue;
            enum ofl_region r = (enum ofl_region)regions[j];
            uint64_t so = ofl_region_offset(&e->cfg, r, a - g->first);
            uint64_t nb = ofl_region_bytes(&e->cfg, r, b - g->first) - so;
            memcpy(region_base(&s, r) + so, in[j], nb);
            in[j] += nb;
        }
        if (e->txn && (rc = ofl_slot_store(e, i, cur))) return rc;
        if (master) ofl_refresh_weights(e, a, b - a, s.master + (a - g->first));
    }
    return 0;
}

int mw_offload_write_raw(struct mw_offload *e, int region, uint64_t first, uint64_t n, const void *src)
{
    return mw_offload_write_regions(e, first, n, 1, &region, &src);
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
     * writes into the slot the old record points at (a held one: ofl_journal_settle, at the latest). */
    if (!e->jon) return 0;
    pthread_mutex_lock(&e->mu);
    int held = steps > e->jallow; /* the caller allows it later (mw_offload_journal_allow) */
    if (held) {
        e->jstep = steps;
        e->jstate = 3;
    }
    pthread_mutex_unlock(&e->mu);
    return held ? 0 : ofl_journal_write(e, steps);
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
