/*
 * update.c — one subgroup's AdamW update with per-tensor weight decay.
 *
 * Why here and not in the kernel: a subgroup may span tensors that decay (matrices) and
 * tensors that do not (biases, LayerNorm), and optim.h's step takes one weight decay per call.
 * The subgroup is cut into runs of equal decay, one kernel call each; AdamW has no coupling
 * between elements, so the cut does not change a bit (optim.h guarantees it).
 * 8-bit moments couple the MW_Q8_BLOCK elements of a block through its scale, and calls must
 * start on a block, so a block that straddles a decay boundary cannot be split: it is stepped
 * with weight_decay 0 after its decaying elements were multiplied by the kernel's own factor
 * (float)(1 - lr*wd). The kernel computes p*decay - step (optim.h), and with decay exactly
 * 1.0f that is (p*decay_t) - step: bitwise what a call with the tensor's decay gives. Such
 * blocks are the same in every configuration (subgroups start on blocks), so results stay
 * bitwise independent of the subgroup size.
 */
#include "offload/internal.h"

#include <errno.h>

#include <stdlib.h>
#include <string.h>

int ofl_runs_build(struct mw_offload *e, const struct mw_offload_registry *r)
{
    /* runs: maximal ranges of equal decay inside each subgroup, relative to its start */
    uint32_t cap = e->nsg + r->n + 1, n = 0;
    e->runs = malloc(cap * sizeof *e->runs);
    e->sg_run = malloc((e->nsg + 1) * sizeof *e->sg_run);
    if (!e->runs || !e->sg_run) return mw_error_set(-ENOMEM, "offload: out of memory for decay runs");
    for (uint32_t i = 0; i < e->nsg; i++) {
        const struct mw_offload_subgroup *g = &e->sgs[i];
        e->sg_run[i] = n;
        for (uint32_t t = g->tensor_lo; t <= g->tensor_hi; t++) {
            const struct mw_offload_tensor *x = &r->tensors[t];
            uint64_t a = MW_MAX(x->first, g->first), b = MW_MIN(x->first + x->numel, g->first + g->n);
            int decay = !(x->flags & MW_OFFLOAD_NO_DECAY);
            if (n > e->sg_run[i] && e->runs[n - 1].decay == decay) { e->runs[n - 1].n += b - a; continue; }
            MW_ASSERT(n < cap);
            e->runs[n++] = (struct ofl_run){a - g->first, b - a, decay};
        }
    }
    e->sg_run[e->nsg] = n;
    return 0;
}

static int step_piece(const struct mw_optim_format *f, struct mw_adamw_hp hp, const struct mw_optim_slice *s,
                      uint64_t off, uint64_t n, int decay, const struct mw_optim_exec *ex)
{
    struct mw_optim_slice p = *s;
    size_t mb = mw_optim_array_bytes(f->moments, off), wb = mw_optim_array_bytes(f->weights_out, off);
    p.n = n;
    p.offset = s->offset + off;
    p.master = s->master + off;
    p.grad = (const float *)s->grad + off;
    p.m = (char *)s->m + mb;
    p.v = (char *)s->v + mb;
    if (s->m_scale) { p.m_scale = s->m_scale + off / MW_Q8_BLOCK; p.v_scale = s->v_scale + off / MW_Q8_BLOCK; }
    if (s->weights_out) p.weights_out = (char *)s->weights_out + wb;
    if (!decay) hp.weight_decay = 0;
    return mw_adamw_step(f, &hp, &p, ex);
}

int ofl_update(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
               const struct ofl_run *runs, uint32_t nruns, const struct mw_optim_exec *ex)
{
    if (hp->weight_decay == 0 || nruns == 1) return step_piece(f, *hp, s, 0, s->n, nruns ? runs[0].decay : 1, ex);
    int rc = 0;
    if (f->moments != MW_OPTIM_Q8) {
        for (uint32_t i = 0; i < nruns && !rc; i++) rc = step_piece(f, *hp, s, runs[i].off, runs[i].n, runs[i].decay, ex);
        return rc;
    }
    const uint64_t B = MW_Q8_BLOCK;
    const float factor = (float)(1.0 - hp->lr * hp->weight_decay); /* the kernel's decay factor */
    uint64_t pos = 0; /* always a multiple of B */
    uint32_t i = 0;
    while (pos < s->n && !rc) {
        while (runs[i].off + runs[i].n <= pos) i++;
        uint64_t end = runs[i].off + runs[i].n;
        if (end == s->n || end % B == 0) {
            rc = step_piece(f, *hp, s, pos, end - pos, runs[i].decay, ex);
            pos = end;
            continue;
        }
        uint64_t bstart = end / B * B;
        if (bstart > pos) rc = step_piece(f, *hp, s, pos, bstart - pos, runs[i].decay, ex);
        uint64_t bend = MW_MIN(bstart + B, s->n);
        for (uint32_t j = i; j < nruns && runs[j].off < bend && !rc; j++) { /* the straddling block */
            if (!runs[j].decay) continue;
            uint64_t a = MW_MAX(runs[j].off, bstart), b = MW_MIN(runs[j].off + runs[j].n, bend);
            for (uint64_t k = a; k < b; k++) s->master[k] *= factor;
        }
        if (!rc) rc = step_piece(f, *hp, s, bstart, bend - bstart, 0, ex);
        pos = bend;
    }
    return rc;
}

int ofl_update_range(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
                     const struct ofl_run *runs, uint32_t nruns, uint64_t lo, uint64_t hi,
                     const struct mw_optim_exec *ex)
{
    MW_ASSERT(f->moments != MW_OPTIM_Q8 && lo <= hi && hi <= s->n);
    if (hp->weight_decay == 0 || nruns <= 1) return step_piece(f, *hp, s, lo, hi - lo, nruns ? runs[0].decay : 1, ex);
    int rc = 0;
    for (uint32_t i = 0; i < nruns && !rc; i++) {
        uint64_t a = MW_MAX(runs[i].off, lo), b = MW_MIN(runs[i].off + runs[i].n, hi);
        if (a < b) rc = step_piece(f, *hp, s, a, b - a, runs[i].decay, ex);
    }
    return rc;
}
