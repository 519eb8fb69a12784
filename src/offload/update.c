/*
 * update.c — one subgroup's AdamW update with per-tensor weight decay.
 *
 * Why here and not in the kernel: a subgroup may span tensors that decay (matrices) and
 * tensors that do not (biases, LayerNorm), and optim.h's step takes one weight decay per call.
 * The subgroup is cut into runs of equal decay, one kernel call each; AdamW has no coupling
 * between elements, so the cut does not change a bit (optim.h guarantees it). The cut is one
 * walk (ofl_update_walk) that ofl_update follows on the CPU and a device with kernels of its own
 * (device.h: CUDA) follows on the device, so both see the same pieces.
 * 8-bit moments couple the MW_Q8_BLOCK elements of a block through its scale, and calls must
 * start on a block, so a block that straddles a decay boundary cannot be split: it is stepped
 * with weight_decay 0 after its decaying elements were multiplied by the kernel's own factor
 * (float)(1 - lr*wd). The kernel computes p*decay - step (optim.h), and with decay exactly
 * 1.0f that is (p*decay_t) - step: bitwise what a call with the tensor's decay gives. Such
 * blocks are the same in every configuration (subgroups start on blocks), so results stay
 * bitwise independent of the subgroup size.
 *
 * Per-tensor steps (mw_offload_set_tensor_steps): torch.optim keeps a step count per parameter,
 * and a parameter without a gradient is not stepped at all, so a model whose parameters do not
 * all get gradients at every step has tensors at different AdamW steps (bias correction) and
 * tensors that must stay as they are. The runs are then cut by (decay, step) as well, each run
 * updated as its own step or not at all (a skipped run's bytes are written back as they were
 * read). A run keeps its step as a lag behind the engine's own number, so a table means the
 * same at every later step (a tensor stepped each time advances with the engine) and the
 * default is lag 0 whichever way it was given. Each subgroup keeps room for one run per tensor
 * piece, so one subgroup's runs can be rewritten while others are being updated (an overlapped
 * step corrects the table for the subgroups that have not begun). 8-bit blocks couple their
 * elements, so tensors that share a block must be stepped alike (refused otherwise).
 */
#include "offload/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Subgroup i's runs from its tensor pieces: adjacent pieces of equal decay and lag merged, the
 * slots left over empty (n = 0, at the end). steps: per tensor as mw_offload_set_tensor_steps, or
 * NULL (every run the step's own number, lag 0). */
static void fill_runs(const struct mw_offload *e, uint32_t i, const uint64_t *steps, struct ofl_run *out)
{
    uint32_t a = e->sg_run[i], cap = e->sg_run[i + 1] - a, n = 0;
    int64_t own = (int64_t)e->committed + 1;
    for (uint32_t k = 0; k < cap; k++) {
        const struct ofl_piece *p = &e->pieces[a + k];
        int64_t lag = !steps ? 0 : steps[p->tensor] ? own - (int64_t)steps[p->tensor] : OFL_LAG_SKIP;
        if (n && out[n - 1].decay == p->decay && out[n - 1].lag == lag) { out[n - 1].n += p->n; continue; }
        out[n++] = (struct ofl_run){p->off, p->n, p->decay, lag};
    }
    for (uint32_t k = n; k < cap; k++) out[k] = (struct ofl_run){e->sgs[i].n, 0, out[n - 1].decay, out[n - 1].lag};
}

int ofl_runs_build(struct mw_offload *e, const struct mw_offload_registry *r)
{
    /* room for one run per tensor piece in each subgroup (at most nsg + ntensors - 1 in all) */
    e->sg_run = malloc((e->nsg + 1) * sizeof *e->sg_run);
    if (!e->sg_run) return mw_error_set(-ENOMEM, "offload: out of memory for decay runs");
    uint32_t cap = 0;
    for (uint32_t i = 0; i < e->nsg; i++) {
        e->sg_run[i] = cap;
        cap += e->sgs[i].tensor_hi - e->sgs[i].tensor_lo + 1;
    }
    e->sg_run[e->nsg] = cap;
    e->ntensors = r->n;
    e->runs = malloc(cap * sizeof *e->runs);
    e->pieces = malloc(cap * sizeof *e->pieces);
    if (!e->runs || !e->pieces) return mw_error_set(-ENOMEM, "offload: out of memory for decay runs");
    for (uint32_t i = 0; i < e->nsg; i++) {
        const struct mw_offload_subgroup *g = &e->sgs[i];
        for (uint32_t t = g->tensor_lo; t <= g->tensor_hi; t++) {
            const struct mw_offload_tensor *x = &r->tensors[t];
            uint64_t a = MW_MAX(x->first, g->first), b = MW_MIN(x->first + x->numel, g->first + g->n);
            e->pieces[e->sg_run[i] + (t - g->tensor_lo)] =
                (struct ofl_piece){a - g->first, b - a, t, !(x->flags & MW_OFFLOAD_NO_DECAY)};
        }
        fill_runs(e, i, NULL, e->runs + e->sg_run[i]);
    }
    return 0;
}

static const char *step_name(const struct mw_offload *e, int64_t lag, char *buf, size_t n)
{
    if (lag == OFL_LAG_SKIP) snprintf(buf, n, "not updated");
    else snprintf(buf, n, "step %lld", (long long)((int64_t)e->committed + 1 - lag));
    return buf;
}

/* 8-bit moments: a block whose elements would be stepped differently (one tensor skipped or at
 * another step than its neighbour in the block) cannot be updated. */
static int q8_check(const struct mw_offload *e, uint32_t i, const struct ofl_run *runs)
{
    uint32_t a = e->sg_run[i], cap = e->sg_run[i + 1] - a;
    for (uint32_t j = 1; j < cap && runs[j].n; j++) {
        if (runs[j].lag == runs[j - 1].lag || runs[j].off % MW_Q8_BLOCK == 0) continue;
        uint32_t k = 1;
        while (k + 1 < cap && e->pieces[a + k].off != runs[j].off) k++;
        char s0[32], s1[32];
        return mw_error_set(-EINVAL, "offload: with 8-bit moments, tensors %u and %u share a block of %d elements "
                            "(one scale), so they must be stepped alike (given: %s and %s)",
                            e->pieces[a + k - 1].tensor, e->pieces[a + k].tensor, MW_Q8_BLOCK,
                            step_name(e, runs[j - 1].lag, s0, sizeof s0), step_name(e, runs[j].lag, s1, sizeof s1));
    }
    return 0;
}

static int runs_equal(const struct ofl_run *x, const struct ofl_run *y, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        if (x[k].off != y[k].off || x[k].n != y[k].n || x[k].decay != y[k].decay || x[k].lag != y[k].lag) return 0;
    return 1;
}

/* Whether subgroup i's update has not begun (its runs may still change): between steps, or
 * during one before it was loaded and handed to an update engine. e->mu held. */
static int sg_unbegun(const struct mw_offload *e, uint32_t i)
{
    if (!e->n_started && !e->in_backward && !e->in_flight) return 1;
    switch (e->st[i].state) {
    case OFL_SG_IDLE: case OFL_SG_READY: case OFL_SG_READING: case OFL_SG_PREREADING: case OFL_SG_PRELOADED: return 1;
    default: return 0;
    }
}

int mw_offload_set_tensor_steps(struct mw_offload *e, uint32_t n, const uint64_t *steps)
{
    if (!e) return mw_error_set(-EINVAL, "offload set_tensor_steps: no engine");
    if (steps && n != e->ntensors)
        return mw_error_set(-EINVAL, "offload set_tensor_steps: %u steps for %u tensors", n, e->ntensors);
    for (uint32_t t = 0; steps && t < n; t++)
        if (steps[t] > (uint64_t)INT64_MAX)
            return mw_error_set(-EINVAL, "offload set_tensor_steps: tensor %u: step %llu out of range", t,
                                (unsigned long long)steps[t]);
    uint32_t cap = e->sg_run[e->nsg];
    struct ofl_run *next = malloc(cap * sizeof *next);
    if (!next) return mw_error_set(-ENOMEM, "offload set_tensor_steps: out of memory");
    int rc = 0;
    for (uint32_t i = 0; i < e->nsg && !rc; i++) {
        fill_runs(e, i, steps, next + e->sg_run[i]);
        if (e->fmt.moments == MW_OPTIM_Q8) rc = q8_check(e, i, next + e->sg_run[i]);
    }
    pthread_mutex_lock(&e->mu);
    for (uint32_t i = 0; i < e->nsg && !rc; i++) {
        uint32_t off = e->sg_run[i], len = e->sg_run[i + 1] - off;
        if (!runs_equal(e->runs + off, next + off, len) && !sg_unbegun(e, i))
            rc = mw_error_set(-EBUSY, "offload set_tensor_steps: subgroup %u has begun its update in this step; the "
                              "steps of its tensors can no longer change", i);
    }
    for (uint32_t i = 0; i < e->nsg && !rc; i++) { /* all or nothing; runs being read are never written */
        uint32_t off = e->sg_run[i], len = e->sg_run[i + 1] - off;
        if (!runs_equal(e->runs + off, next + off, len)) memcpy(e->runs + off, next + off, len * sizeof *next);
    }
    pthread_mutex_unlock(&e->mu);
    free(next);
    return rc;
}

struct mw_optim_slice ofl_piece_slice(const struct mw_optim_format *f, const struct mw_optim_slice *s, uint64_t off,
                                     uint64_t n)
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
    return p;
}

struct mw_adamw_hp ofl_piece_hp(const struct mw_adamw_hp *hp, int decay, int64_t lag)
{
    struct mw_adamw_hp h = *hp;
    if (!decay) h.weight_decay = 0;
    h.step -= lag;
    return h;
}

static int step_piece(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
                      uint64_t off, uint64_t n, int decay, int64_t lag, const struct mw_optim_exec *ex)
{
    if (lag == OFL_LAG_SKIP) return 0; /* left as read: its bytes are written back unchanged */
    struct mw_optim_slice p = ofl_piece_slice(f, s, off, n);
    struct mw_adamw_hp h = ofl_piece_hp(hp, decay, lag);
    return mw_adamw_step(f, &h, &p, ex);
}

/* The runs in use (trailing empty slots dropped), and whether they all share one step. */
static uint32_t runs_used(const struct ofl_run *runs, uint32_t nruns, int *one_step)
{
    while (nruns > 1 && runs[nruns - 1].n == 0) nruns--;
    *one_step = 1;
    for (uint32_t i = 1; i < nruns; i++) *one_step &= runs[i].lag == runs[0].lag;
    return nruns;
}

int ofl_update_walk(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, uint64_t n,
                    const struct ofl_run *runs, uint32_t nruns, const struct ofl_update_walker *w)
{
    int one_step;
    nruns = runs_used(runs, nruns, &one_step);
    if ((hp->weight_decay == 0 && one_step) || nruns <= 1)
        return w->step(w->user, 0, n, nruns ? runs[0].decay : 1, nruns ? runs[0].lag : 0);
    int rc = 0;
    if (f->moments != MW_OPTIM_Q8) {
        for (uint32_t i = 0; i < nruns && !rc; i++)
            rc = w->step(w->user, runs[i].off, runs[i].n, runs[i].decay, runs[i].lag);
        return rc;
    }
    /* 8-bit: the runs of one block share their lag (mw_offload_set_tensor_steps refuses otherwise) */
    const uint64_t B = MW_Q8_BLOCK;
    const float factor = (float)(1.0 - hp->lr * hp->weight_decay); /* the kernel's decay factor */
    uint64_t pos = 0; /* always a multiple of B */
    uint32_t i = 0;
    while (pos < n && !rc) {
        while (runs[i].off + runs[i].n <= pos) i++;
        uint64_t end = runs[i].off + runs[i].n;
        if (end == n || end % B == 0) {
            rc = w->step(w->user, pos, end - pos, runs[i].decay, runs[i].lag);
            pos = end;
            continue;
        }
        uint64_t bstart = end / B * B;
        if (bstart > pos) rc = w->step(w->user, pos, bstart - pos, runs[i].decay, runs[i].lag);
        uint64_t bend = MW_MIN(bstart + B, n);
        int skip = runs[i].lag == OFL_LAG_SKIP;
        for (uint32_t j = i; j < nruns && runs[j].off < bend && !rc && !skip; j++) { /* the straddling block */
            if (!runs[j].decay) continue;
            uint64_t a = MW_MAX(runs[j].off, bstart), b = MW_MIN(runs[j].off + runs[j].n, bend);
            if (a < b) rc = w->scale(w->user, a, b, factor);
        }
        if (!rc) rc = w->step(w->user, bstart, bend - bstart, 0, runs[i].lag);
        pos = bend;
    }
    return rc;
}

/* ofl_update's walker: each piece stepped by the CPU kernel at once, in place. */
struct cpu_walk {
    const struct mw_optim_format *f;
    const struct mw_adamw_hp *hp;
    const struct mw_optim_slice *s;
    const struct mw_optim_exec *ex;
};

static int cpu_step(void *user, uint64_t off, uint64_t n, int decay, int64_t lag)
{
    const struct cpu_walk *c = user;
    return step_piece(c->f, c->hp, c->s, off, n, decay, lag, c->ex);
}

static int cpu_scale(void *user, uint64_t lo, uint64_t hi, float factor)
{
    const struct cpu_walk *c = user;
    for (uint64_t k = lo; k < hi; k++) c->s->master[k] *= factor;
    return 0;
}

int ofl_update(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
               const struct ofl_run *runs, uint32_t nruns, const struct mw_optim_exec *ex)
{
    struct cpu_walk c = {f, hp, s, ex};
    const struct ofl_update_walker w = {cpu_step, cpu_scale, &c};
    return ofl_update_walk(f, hp, s->n, runs, nruns, &w);
}

int ofl_update_range(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
                     const struct ofl_run *runs, uint32_t nruns, uint64_t lo, uint64_t hi,
                     const struct mw_optim_exec *ex)
{
    MW_ASSERT(f->moments != MW_OPTIM_Q8 && lo <= hi && hi <= s->n);
    int one_step;
    nruns = runs_used(runs, nruns, &one_step);
    if ((hp->weight_decay == 0 && one_step) || nruns <= 1)
        return step_piece(f, hp, s, lo, hi - lo, nruns ? runs[0].decay : 1, nruns ? runs[0].lag : 0, ex);
    int rc = 0;
    for (uint32_t i = 0; i < nruns && !rc; i++) {
        uint64_t a = MW_MAX(runs[i].off, lo), b = MW_MIN(runs[i].off + runs[i].n, hi);
        if (a < b) rc = step_piece(f, hp, s, a, b - a, runs[i].decay, runs[i].lag, ex);
    }
    return rc;
}
