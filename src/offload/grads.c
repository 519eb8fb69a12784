/*
 * grads.c — gradients: micro-steps, accumulation, readiness and the global norm.
 *
 * Why readiness per subgroup: the optimizer step can overlap the backward pass only if a
 * subgroup's update starts the moment its last gradient is final. The caller reports element
 * ranges as the backward pass finishes them; the engine counts, per subgroup, the elements
 * reported in this micro-step, and when the count reaches the subgroup's size (and the step is
 * armed with its hyper-parameters) hands the subgroup to the pipeline (pipeline.c). Ranges
 * never reported are taken as final at backward_end.
 */
#include "offload/internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int mark_ready(struct mw_offload *e, uint64_t first, uint64_t n)
{
    if (e->nranges == e->cap_ranges) {
        uint32_t cap = e->cap_ranges ? 2 * e->cap_ranges : 256;
        struct ofl_range *r = realloc(e->ranges, cap * sizeof *r);
        if (!r) return mw_error_set(-ENOMEM, "offload: out of memory");
        e->ranges = r;
        e->cap_ranges = cap;
    }
    e->ranges[e->nranges++] = (struct ofl_range){first, n};
    uint32_t lo, hi;
    ofl_sg_span(e, first, n, &lo, &hi);
    pthread_mutex_lock(&e->mu);
    for (uint32_t i = lo; i <= hi; i++) {
        const struct mw_offload_subgroup *g = &e->sgs[i];
        uint64_t a = MW_MAX(first, g->first), b = MW_MIN(first + n, g->first + g->n);
        e->st[i].ready_elems += b - a;
        if (e->st[i].ready_elems > g->n) {
            pthread_mutex_unlock(&e->mu);
            return mw_error_set(-EINVAL, "offload grad_ready: subgroup %u reported more than once in a micro-step", i);
        }
        if (e->armed && e->st[i].ready_elems == g->n) ofl_pipe_enqueue_locked(e, i);
    }
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* Accumulates src (or zeros when src is NULL) into the engine's gradient buffer. */
static void accumulate(struct mw_offload *e, uint64_t first, uint64_t n, const float *src)
{
    if (!e->grads.ptr) return;
    float *g = (float *)e->grads.ptr + first;
    if (e->micro_index == 0) {
        if (src) memcpy(g, src, 4 * n);
        else memset(g, 0, 4 * n);
    } else if (src) {
        for (uint64_t i = 0; i < n; i++) g[i] += src[i];
    }
}

int mw_offload_backward_begin(struct mw_offload *e, int last, const struct mw_offload_hparams *hp)
{
    if (e->failed) return mw_error_set(-EBUSY, "offload: the last step failed; call mw_offload_recover first");
    if (e->in_backward) return mw_error_set(-EINVAL, "offload: backward_begin twice without backward_end");
    if (e->in_flight) return mw_error_set(-EBUSY, "offload: backward_begin while the last step runs (mw_offload_step_wait)");
    if (hp && !last) return mw_error_set(-EINVAL, "offload: only the last micro-step can be armed");
    int jrc = hp ? ofl_journal_settle(e) : 0; /* armed: updates may write slots during backward */
    if (jrc) return jrc;
    e->in_backward = 1;
    e->nranges = 0;
    for (uint32_t i = 0; i < e->nsg; i++) e->st[i].ready_elems = 0;
    if (hp) {
        pthread_mutex_lock(&e->mu);
        e->hp = *hp;
        e->armed = 1;
        pthread_mutex_unlock(&e->mu);
    }
    return 0;
}

int mw_offload_grad_ready(struct mw_offload *e, uint64_t first, uint64_t n)
{
    int rc = ofl_check_range(e, first, n, "grad_ready");
    if (rc) return rc;
    if (!e->in_backward) return mw_error_set(-EINVAL, "offload grad_ready: outside backward_begin/backward_end");
    if (!e->cfg.ext_grads) return mw_error_set(-EINVAL, "offload grad_ready: no ext_grads array (use mw_offload_grad_add)");
    if (!e->cfg.ext_grads_accumulate) accumulate(e, first, n, e->cfg.ext_grads + first);
    return mark_ready(e, first, n);
}

int mw_offload_grad_add(struct mw_offload *e, uint64_t first, uint64_t n, const float *src)
{
    int rc = ofl_check_range(e, first, n, "grad_add");
    if (rc) return rc;
    if (!e->in_backward) return mw_error_set(-EINVAL, "offload grad_add: outside backward_begin/backward_end");
    if (!e->grads.ptr) return mw_error_set(-EINVAL, "offload grad_add: the caller accumulates (ext_grads_accumulate)");
    accumulate(e, first, n, src);
    return mark_ready(e, first, n);
}

static int cmp_range(const void *a, const void *b)
{
    const struct ofl_range *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

int mw_offload_backward_end(struct mw_offload *e)
{
    if (!e->in_backward) return mw_error_set(-EINVAL, "offload: backward_end without backward_begin");
    if (e->nranges > 1) qsort(e->ranges, e->nranges, sizeof *e->ranges, cmp_range);
    uint32_t nr = e->nranges;
    uint64_t pos = 0;
    int rc = 0;
    for (uint32_t i = 0; i <= nr && !rc; i++) {
        uint64_t next = i < nr ? e->ranges[i].first : e->plan.total_elems;
        if (next > pos) { /* a gap nobody reported: final as the caller's array has it */
            const float *src = e->cfg.ext_grads ? e->cfg.ext_grads + pos : NULL;
            if (!e->cfg.ext_grads_accumulate) accumulate(e, pos, next - pos, src);
            rc = mark_ready(e, pos, next - pos);
        }
        if (i < nr) pos = MW_MAX(pos, e->ranges[i].first + e->ranges[i].n);
    }
    e->in_backward = 0;
    e->micro_index++;
    return rc;
}

int mw_offload_norm_chunk(const float *g, uint64_t n, uint64_t c, int threads, double *sumsq)
{
    uint64_t a = c * MW_OFFLOAD_NORM_CHUNK;
    *sumsq = 0;
    if (a >= n) return mw_error_set(-EINVAL, "gradient norm: chunk %llu starts past the %llu elements",
                                    (unsigned long long)c, (unsigned long long)n);
    struct mw_optim_exec ex = {threads, MW_SIMD_AUTO, 0};
    return mw_grad_sumsq(MW_OPTIM_F32, g + a, MW_MIN(MW_OFFLOAD_NORM_CHUNK, n - a), 1.0f, &ex, sumsq);
}

int mw_offload_grad_norm(struct mw_offload *e, double *norm)
{
    if (e->in_backward || e->armed || e->micro_index == 0)
        return mw_error_set(-EINVAL, "offload grad_norm: only after the last backward_end of an unarmed step");
    const float *g = e->grads.ptr ? (const float *)e->grads.ptr : e->cfg.ext_grads;
    const uint64_t total = e->plan.total_elems;
    double sum = 0;
    int rc = 0;
    /* Fixed chunks of the flat space (independent of subgroups), added in order. */
    for (uint64_t c = 0; c * MW_OFFLOAD_NORM_CHUNK < total; c++) {
        double s = 0;
        int r = mw_offload_norm_chunk(g, total, c, e->cfg.cpu_threads, &s);
        if (r && !rc) rc = r;
        sum += s;
    }
    *norm = sqrt(sum);
    return rc == MW_EOVERFLOW ? 0 : rc;
}
