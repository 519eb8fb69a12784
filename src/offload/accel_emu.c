/*
 * accel_emu.c — the emulated accelerator: a device arena with its own budget, a copy engine
 * thread and a compute worker thread, all on the host.
 *
 * Why emulate: the hybrid schedule (some subgroups updated on the accelerator while the CPU
 * updates others) is the part of the engine most likely to be wrong — queueing, slot reuse,
 * copy/compute overlap, results landing back in the right place. The emulator makes all of
 * that real, tested code today. It moves every byte through its own arena (allocated from the
 * device tier, through the tier's buffer type, so a CUDA buffer type can replace it) and runs
 * the same CPU kernel there, so its results are bitwise those of the CPU path.
 *
 * Pipelining: the arena holds two job slots. The copy engine copies job k+1 in (H2D) while
 * the worker computes job k, and copies job k-1 out (D2H, preferred, since it frees a slot).
 */
#include "offload/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DEV_ALIGN 64

struct ofl_dev {
    const struct mw_offload_config *cfg;
    struct mw_optim_format fmt;
    struct mw_trace *tr;
    struct mw_buf arena;
    uint64_t slot_bytes;
    int slot_busy[2];
    pthread_mutex_t mu;
    pthread_cond_t cv_copy, cv_work;
    pthread_t copy_thr, work_thr;
    int stop, threads;
    struct ofl_devjob *in_head, *in_tail;  /* waiting for H2D */
    struct ofl_devjob *cq_head, *cq_tail;  /* on the device, waiting for the kernel */
    struct ofl_devjob *out_head, *out_tail;/* computed, waiting for D2H */
};

/* Offsets of the arrays of one job of n elements inside a slot. */
struct dev_lay { uint64_t master, grad, m, ms, v, vs, w, total; };

static void dev_lay_make(const struct mw_offload_config *c, uint64_t n, struct dev_lay *L)
{
    uint64_t o = 0;
#define PUT(f, b) do { L->f = o; o += MW_ALIGN_UP((uint64_t)(b), (uint64_t)DEV_ALIGN); } while (0)
    PUT(master, 4 * n);
    PUT(grad, 4 * n);
    PUT(m, ofl_region_bytes(c, OFL_R_M, n));
    PUT(ms, ofl_region_bytes(c, OFL_R_MSCALE, n));
    PUT(v, ofl_region_bytes(c, OFL_R_V, n));
    PUT(vs, ofl_region_bytes(c, OFL_R_VSCALE, n));
    PUT(w, c->weights == MW_OFFLOAD_W_FP32 ? 0 : 2 * n);
#undef PUT
    L->total = o;
}

uint64_t ofl_dev_job_bytes(const struct mw_offload_config *c, uint64_t n)
{
    struct dev_lay L;
    dev_lay_make(c, n, &L);
    return L.total;
}

static void push(struct ofl_devjob **h, struct ofl_devjob **t, struct ofl_devjob *j)
{
    j->next_ = NULL;
    if (*t) (*t)->next_ = j;
    else *h = j;
    *t = j;
}

static struct ofl_devjob *pop(struct ofl_devjob **h, struct ofl_devjob **t)
{
    struct ofl_devjob *j = *h;
    if (j) { *h = j->next_; if (!*h) *t = NULL; }
    return j;
}

static char *slot_base(struct ofl_dev *d, int slot) { return (char *)d->arena.ptr + (uint64_t)slot * d->slot_bytes; }

/* The device-side view of a job (pointers into its arena slot). */
static void dev_view(struct ofl_dev *d, struct ofl_devjob *j, struct mw_optim_slice *s, struct dev_lay *L)
{
    dev_lay_make(d->cfg, j->host.n, L);
    char *b = slot_base(d, j->slot_);
    memset(s, 0, sizeof *s);
    s->n = j->host.n;
    s->offset = j->host.offset;
    s->master = (float *)(b + L->master);
    s->grad = b + L->grad;
    s->m = b + L->m;
    s->v = b + L->v;
    if (L->ms != L->v) s->m_scale = (float *)(b + L->ms);
    if (L->vs != L->w) s->v_scale = (float *)(b + L->vs);
    if (j->host.weights_out) s->weights_out = b + L->w;
}

static void copy_job(struct ofl_dev *d, struct ofl_devjob *j, int in)
{
    struct mw_optim_slice ds;
    struct dev_lay L;
    dev_view(d, j, &ds, &L);
    const struct mw_offload_config *c = d->cfg;
    uint64_t n = j->host.n, bytes = 0;
    uint64_t b[4] = {4 * n, ofl_region_bytes(c, OFL_R_M, n), ofl_region_bytes(c, OFL_R_MSCALE, n), 0};
#define XFER(devp, hostp, nb) do { if ((nb) != 0 && (hostp) != NULL) { size_t off_ = (size_t)((char *)(devp) - (char *)d->arena.ptr); \
        if (in) mw_tier_copy_in(&d->arena, off_, (hostp), (nb)); else mw_tier_copy_out((void *)(hostp), &d->arena, off_, (nb)); \
        bytes += (nb); } } while (0)
    XFER(ds.master, j->host.master, b[0]);
    if (in) XFER(ds.grad, j->host.grad, b[0]);
    XFER(ds.m, j->host.m, b[1]);
    XFER(ds.m_scale, j->host.m_scale, b[2]);
    XFER(ds.v, j->host.v, b[1]);
    XFER(ds.v_scale, j->host.v_scale, b[2]);
    if (!in) XFER(ds.weights_out, j->host.weights_out, 2 * n);
#undef XFER
    if (in) j->h2d_bytes = bytes;
    else j->d2h_bytes = bytes;
}

/* A host<->device copy is I/O of that tier pair (docs/trace-conventions.md, cat "io"). */
static void trace_copy(struct ofl_dev *d, int h2d, uint64_t bytes, uint64_t t0, uint64_t t1)
{
    if (!d->tr) return;
    struct mw_trace_io io = {h2d ? MW_TRACE_WRITE : MW_TRACE_READ, h2d ? MW_TIER_HOST : MW_TIER_DEVICE,
                             h2d ? MW_TIER_DEVICE : MW_TIER_HOST, bytes, 0, 1, t0, t1, "emulated accelerator", 0};
    mw_trace_io(d->tr, &io);
}

static void *copy_main(void *arg)
{
    struct ofl_dev *d = arg;
    mw_trace_thread_name(d->tr, "offload-dev-copy");
    pthread_mutex_lock(&d->mu);
    for (;;) {
        struct ofl_devjob *j = pop(&d->out_head, &d->out_tail);
        if (j) { /* D2H first: it frees a slot */
            pthread_mutex_unlock(&d->mu);
            j->t_d2h0 = mw_now_ns();
            copy_job(d, j, 0);
            j->t_d2h1 = mw_now_ns();
            trace_copy(d, 0, j->d2h_bytes, j->t_d2h0, j->t_d2h1);
            pthread_mutex_lock(&d->mu);
            d->slot_busy[j->slot_] = 0;
            pthread_mutex_unlock(&d->mu);
            j->done(j, j->user); /* may submit the next job */
            pthread_mutex_lock(&d->mu);
            continue;
        }
        int slot = !d->slot_busy[0] ? 0 : !d->slot_busy[1] ? 1 : -1;
        if (slot >= 0 && d->in_head) {
            j = pop(&d->in_head, &d->in_tail);
            d->slot_busy[slot] = 1;
            j->slot_ = slot;
            pthread_mutex_unlock(&d->mu);
            j->t_h2d0 = mw_now_ns();
            copy_job(d, j, 1);
            j->t_h2d1 = mw_now_ns();
            trace_copy(d, 1, j->h2d_bytes, j->t_h2d0, j->t_h2d1);
            pthread_mutex_lock(&d->mu);
            push(&d->cq_head, &d->cq_tail, j);
            pthread_cond_signal(&d->cv_work);
            continue;
        }
        if (d->stop) break;
        pthread_cond_wait(&d->cv_copy, &d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static void *work_main(void *arg)
{
    struct ofl_dev *d = arg;
    mw_trace_thread_name(d->tr, "offload-dev-worker");
    pthread_mutex_lock(&d->mu);
    for (;;) {
        struct ofl_devjob *j = pop(&d->cq_head, &d->cq_tail);
        if (!j) {
            if (d->stop) break;
            pthread_cond_wait(&d->cv_work, &d->mu);
            continue;
        }
        pthread_mutex_unlock(&d->mu);
        struct mw_optim_slice ds;
        struct dev_lay L;
        dev_view(d, j, &ds, &L);
        struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0}; /* the device's own single worker */
        j->t_k0 = mw_now_ns();
        j->result = ofl_update(&d->fmt, &j->hp, &ds, j->runs, j->nruns, &ex);
        j->t_k1 = mw_now_ns();
        struct mw_trace_arg a[2] = {{"subgroup", j->sg}, {"elems", (int64_t)j->host.n}};
        mw_trace_span(d->tr, "device", "kernel", j->t_k0, j->t_k1, a, 2);
        pthread_mutex_lock(&d->mu);
        push(&d->out_head, &d->out_tail, j);
        pthread_cond_signal(&d->cv_copy);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int ofl_dev_init(struct ofl_dev **out, struct mw_tier *dev_tier, uint64_t slot_bytes,
                 const struct mw_offload_config *c, struct mw_trace *tr)
{
    *out = NULL;
    struct ofl_dev *d = calloc(1, sizeof *d);
    if (!d) return mw_error_set(-ENOMEM, "emulated accelerator: out of memory");
    d->cfg = c;
    d->tr = tr;
    d->fmt.grad = MW_OPTIM_F32;
    d->fmt.moments = ofl_mdtype(c->moments);
    d->fmt.weights_out = c->weights == MW_OFFLOAD_W_FP32 ? MW_OPTIM_NONE : ofl_wdtype(c->weights);
    d->slot_bytes = MW_ALIGN_UP(slot_bytes, (uint64_t)MW_PAGE_ALIGN);
    int rc = mw_tier_alloc(dev_tier, 2 * d->slot_bytes, 0, MW_KIND_STAGING, "accelerator arena", &d->arena);
    if (rc) { free(d); return rc; }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_copy, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    if (pthread_create(&d->copy_thr, NULL, copy_main, d)) goto err_thr;
    if (pthread_create(&d->work_thr, NULL, work_main, d)) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_broadcast(&d->cv_copy);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->copy_thr, NULL);
        goto err_thr;
    }
    d->threads = 1;
    *out = d;
    return 0;
err_thr:
    pthread_cond_destroy(&d->cv_copy);
    pthread_cond_destroy(&d->cv_work);
    pthread_mutex_destroy(&d->mu);
    mw_tier_free(&d->arena);
    free(d);
    return mw_error_set(-EAGAIN, "emulated accelerator: cannot start its threads");
}

void ofl_dev_free(struct ofl_dev *d)
{
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv_copy);
    pthread_cond_broadcast(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->copy_thr, NULL);
    pthread_join(d->work_thr, NULL);
    pthread_cond_destroy(&d->cv_copy);
    pthread_cond_destroy(&d->cv_work);
    pthread_mutex_destroy(&d->mu);
    mw_tier_free(&d->arena);
    free(d);
}

void ofl_dev_submit(struct ofl_dev *d, struct ofl_devjob *j)
{
    j->t_queued = mw_now_ns();
    j->result = 0;
    pthread_mutex_lock(&d->mu);
    push(&d->in_head, &d->in_tail, j);
    pthread_cond_signal(&d->cv_copy);
    pthread_mutex_unlock(&d->mu);
}
