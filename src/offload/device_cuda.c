/*
 * device_cuda.c — the device table of device.h on an NVIDIA GPU, through the CUDA runtime;
 * the kernels are device_cuda_kernels.cu.
 *
 * Why this shape: the table was written as CUDA's model, so each entry is one or two runtime
 * calls here, and the engine's side (device.c: jobs, two slots, overlap) is not repeated:
 *   memory     alloc: the bytes are reserved on the device tier (its budget and accounting,
 *              mw_tier_reserve) and cudaMalloc'd; host_register: cudaHostRegister (a failure is
 *              a warning: copies from pageable memory still work, slower).
 *   queues     IN, COMPUTE, OUT: one cudaStream each (non-blocking: no implicit order with the
 *              legacy default stream, which a PyTorch in the same process may use).
 *   copies     cudaMemcpyAsync on the queue's stream, after the span check the emulator makes.
 *   AdamW      the region's cut (ofl_update_walk, update.c) walked on the host: each piece's
 *              constants from mw_adamw_prepare (the CPU's floats), pieces gathered into batches
 *              of OFL_CUDA_PIECES, one kernel launch per batch (device_cuda.h). An argument the
 *              CPU kernel would refuse is not launched: its error is the queue's, carried by
 *              the next record (below), as the emulator reports its kernel's failure.
 *   events     a cudaEvent_t (timing, blocking sync) plus what the host keeps with its last
 *              record: the queue's error since the record before, and the clock anchor.
 *   host_fn    an item in a FIFO served by the device's own thread: an event recorded on the
 *              queue, which the thread waits for (cudaEventSynchronize) before calling fn — not
 *              cudaLaunchHostFunc, whose functions may not call CUDA, and the engine's
 *              callback queues the next job.
 *   errors     late, as device.h says: a host-side failure of queued work (bad AdamW arguments)
 *              is kept by its queue until the next record takes it, or synchronize returns it;
 *              a CUDA error of the work itself is sticky in the CUDA context, so every later
 *              event query, wait and synchronize returns it (the device is broken for good).
 *   times      event_time_ns must be the host clock (mw_now_ns) when an event completed, but
 *              CUDA times events on the GPU's clock, and only as float milliseconds between two
 *              events. So the device keeps an anchor: an event recorded on an idle stream of its
 *              own, polled until done, whose host time is the host clock read as soon as it is
 *              seen complete — an upper bound, so every time derived from it is late by at most
 *              that poll (microseconds), never early: a job's copy never seems to start before
 *              it was queued. The device's thread renews it every ANCHOR_NS (no drift between
 *              the clocks, and the float milliseconds stay short: no precision lost); each
 *              record keeps the anchor current when it was made, and its time is that anchor's
 *              host time plus the GPU time between them.
 *   trace      (when a trace is given) the copies of a queue between two of its records are one
 *              transfer, and each AdamW a "kernel" span, as the emulator traces them; their
 *              times come from events of their own, read by the device's thread.
 * Settings (the GPU's ordinal: MEMWALL_CUDA_DEVICE, default 0) live in this context.
 *
 * Threads and locks: every entry may be called from any thread (the engine calls from its own
 * threads, from the device's thread in callbacks, from a PyTorch thread); each makes the
 * device's GPU current for its CUDA calls and gives the caller back its own. x->mu guards the
 * host side (queue errors, events' records, anchors, the FIFO) and is never held across a call
 * that waits for the GPU. The device's thread waits for one item at a time, in the order they
 * were queued; an item's event depends only on work already queued, so it always completes.
 */
#include "offload/device_cuda.h"
#include "offload/internal.h"
#include "optim/optim_internal.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ANCHOR_NS 1000000000ull /* the clock anchor's renewal */
#define WHO "CUDA accelerator"

/* A host time known for a GPU event (see "times" above); freed when no record refers to it. */
struct cu_anchor {
    cudaEvent_t ev;
    uint64_t host_ns;
    int refs;
};

struct cu_event { /* struct ofl_dev_event */
    cudaEvent_t ev;
    int recorded;
    int err;                  /* the error of its queue's work before its last record, or 0 */
    char msg[400];
    struct cu_anchor *anchor; /* the anchor current at its last record */
};

enum cu_item_kind { CU_CALLBACK, CU_TRACE_COPY, CU_TRACE_KERNEL };

/* A FIFO item for the device's thread: a callback, or a transfer or kernel to trace. */
struct cu_item {
    enum cu_item_kind kind;
    cudaEvent_t start, end;   /* end: recorded after the work (callback: before fn); start: traces */
    struct cu_anchor *anchor;
    void (*fn)(void *arg);
    void *arg;
    uint64_t bytes;           /* a traced transfer */
    int h2d;
    int64_t tag, n;           /* a traced kernel */
    struct cu_item *next;
};

struct cu_queue {
    cudaStream_t s;
    int err;                  /* the first host-side error of its work since its last record */
    char msg[400];
    struct cu_item *copies;   /* trace: the transfer its copies since the last record make */
};

struct cu_dev {
    int ordinal;
    struct mw_tier *tier;
    struct mw_trace *tr;
    struct cu_queue q[OFL_DEVQ_N];
    cudaStream_t aux;         /* the anchors' own stream: always idle */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* the device's thread: an item, stop, or the anchor's time */
    pthread_cond_t cv_idle;   /* synchronize: no item queued or running */
    struct cu_item *head, *tail, *spare;
    int running, stop;
    pthread_t thr;
    struct cu_anchor *anchor; /* current (the device holds one reference) */
    uint64_t anchor_next;     /* when the thread renews it (mw_now_ns) */
};

static struct cu_event *ev_of(struct ofl_dev_event *e) { return (struct cu_event *)(void *)e; }

/* ------------------------------------------------------------------ errors and the current GPU */

static int errno_of(cudaError_t r)
{
    switch (r) {
    case cudaErrorMemoryAllocation: return -ENOMEM;
    case cudaErrorInvalidValue: return -EINVAL;
    case cudaErrorNoDevice: case cudaErrorInsufficientDriver: case cudaErrorInvalidDevice: return -ENODEV;
    default: return -EIO;
    }
}

static int cu_fail(cudaError_t r, const char *what)
{
    return mw_error_set(errno_of(r), WHO ": %s: %s (%s)", what, cudaGetErrorString(r), cudaGetErrorName(r));
}

/* The device's GPU made current for the calling thread; returns the caller's, for cu_leave. */
static int cu_enter(const struct cu_dev *x)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != x->ordinal) cudaSetDevice(x->ordinal);
    return cur;
}

static void cu_leave(const struct cu_dev *x, int prev)
{
    if (prev >= 0 && prev != x->ordinal) cudaSetDevice(prev);
}

/* ------------------------------------------------------------------ clock anchors */

/* x->mu held. */
static void anchor_put(struct cu_anchor *a)
{
    if (a && --a->refs == 0) {
        cudaEventDestroy(a->ev);
        free(a);
    }
}

static struct cu_anchor *anchor_get(struct cu_anchor *a)
{
    a->refs++;
    return a;
}

/* A new anchor; current device set. 0 or the error. */
static int anchor_make(struct cu_dev *x, struct cu_anchor **out)
{
    struct cu_anchor *a = calloc(1, sizeof *a);
    if (!a) return mw_error_set(-ENOMEM, WHO ": out of memory for a clock anchor");
    cudaError_t r = cudaEventCreateWithFlags(&a->ev, cudaEventDefault); /* spins: seen as soon as done */
    if (r != cudaSuccess) { free(a); return cu_fail(r, "creating a clock anchor"); }
    r = cudaEventRecord(a->ev, x->aux);
    while (r == cudaSuccess && (r = cudaEventQuery(a->ev)) == cudaErrorNotReady) {}
    uint64_t t_seen = mw_now_ns();
    if (r != cudaSuccess) {
        cudaEventDestroy(a->ev);
        free(a);
        return cu_fail(r, "timing a clock anchor");
    }
    a->host_ns = t_seen;
    a->refs = 1;
    *out = a;
    return 0;
}

/* The device's thread: a new anchor replaces the current one (records keep theirs). */
static void anchor_renew(struct cu_dev *x)
{
    struct cu_anchor *a = NULL;
    int rc = anchor_make(x, &a);
    pthread_mutex_lock(&x->mu);
    if (!rc) { /* (a broken device keeps its last one: its events fail anyway) */
        anchor_put(x->anchor);
        x->anchor = a;
    }
    x->anchor_next = mw_now_ns() + ANCHOR_NS;
    pthread_mutex_unlock(&x->mu);
}

/* The host time at which ev completed (both complete), from anchor a. */
static uint64_t anchor_time(const struct cu_anchor *a, cudaEvent_t ev)
{
    float ms;
    if (!a || cudaEventElapsedTime(&ms, a->ev, ev) != cudaSuccess || !(ms >= 0.0f)) return a ? a->host_ns : 0;
    return a->host_ns + (uint64_t)((double)ms * 1e6);
}

/* ------------------------------------------------------------------ the device's thread */

/* x->mu held: an item with its events (kept when it goes back to the spares). */
static int item_get(struct cu_dev *x, enum cu_item_kind kind, struct cu_item **out)
{
    struct cu_item *it = x->spare;
    if (it) {
        x->spare = it->next;
    } else {
        it = calloc(1, sizeof *it);
        if (!it) return mw_error_set(-ENOMEM, WHO ": out of memory for a queued item");
        cudaError_t r = cudaEventCreateWithFlags(&it->start, cudaEventBlockingSync);
        if (r == cudaSuccess) r = cudaEventCreateWithFlags(&it->end, cudaEventBlockingSync);
        if (r != cudaSuccess) {
            if (it->start) cudaEventDestroy(it->start);
            free(it);
            return cu_fail(r, "creating an event");
        }
    }
    cudaEvent_t s = it->start, e = it->end;
    memset(it, 0, sizeof *it);
    it->start = s;
    it->end = e;
    it->kind = kind;
    *out = it;
    return 0;
}

/* x->mu held. */
static void item_put(struct cu_dev *x, struct cu_item *it)
{
    anchor_put(it->anchor);
    it->anchor = NULL;
    it->next = x->spare;
    x->spare = it;
}

/* x->mu held: the thread takes it once everything before it is done. */
static void item_push(struct cu_dev *x, struct cu_item *it)
{
    it->next = NULL;
    if (x->tail) x->tail->next = it;
    else x->head = it;
    x->tail = it;
    pthread_cond_signal(&x->cv);
}

static void item_run(struct cu_dev *x, struct cu_item *it)
{
    cudaEventSynchronize(it->end); /* a failure is the events' to report: the callback reads them */
    if (it->kind == CU_CALLBACK) {
        it->fn(it->arg);
        return;
    }
    uint64_t t0 = anchor_time(it->anchor, it->start), t1 = anchor_time(it->anchor, it->end);
    if (it->kind == CU_TRACE_COPY) {
        int h2d = it->h2d;
        struct mw_trace_io io = {h2d ? MW_TRACE_WRITE : MW_TRACE_READ, h2d ? MW_TIER_DRAM : MW_TIER_DEVICE,
                                 h2d ? MW_TIER_DEVICE : MW_TIER_DRAM, it->bytes, 0, 1, t0, t1, "CUDA accelerator", 0};
        mw_trace_io(x->tr, &io);
    } else {
        struct mw_trace_arg args[2] = {{"subgroup", it->tag}, {"elems", it->n}};
        mw_trace_span(x->tr, "device", "kernel", t0, t1, args, 2);
    }
}

static void *cu_thread(void *arg)
{
    struct cu_dev *x = arg;
    cudaSetDevice(x->ordinal);
    if (x->tr) mw_trace_thread_name(x->tr, "offload-dev-cuda");
    pthread_mutex_lock(&x->mu);
    for (;;) {
        if (mw_now_ns() >= x->anchor_next && !x->stop) {
            pthread_mutex_unlock(&x->mu);
            anchor_renew(x);
            pthread_mutex_lock(&x->mu);
            continue;
        }
        struct cu_item *it = x->head;
        if (it) {
            x->head = it->next;
            if (!x->head) x->tail = NULL;
            x->running = 1;
            pthread_mutex_unlock(&x->mu);
            item_run(x, it);
            pthread_mutex_lock(&x->mu);
            item_put(x, it);
            x->running = 0;
            if (!x->head) pthread_cond_broadcast(&x->cv_idle);
            continue;
        }
        if (x->stop) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts); /* (pthread_cond_timedwait's clock) */
        ts.tv_sec += 1;
        pthread_cond_timedwait(&x->cv, &x->mu, &ts);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* ------------------------------------------------------------------ memory */

static int cu_alloc(void *ctx, uint64_t bytes, enum mw_alloc_kind kind, const char *label, struct mw_buf *out)
{
    struct cu_dev *x = ctx;
    int rc = mw_tier_reserve(x->tier, bytes, kind, label, out); /* the tier's budget and accounting */
    if (rc) return rc;
    int prev = cu_enter(x);
    void *p = NULL;
    cudaError_t r = cudaMalloc(&p, bytes ? bytes : 1);
    cu_leave(x, prev);
    if (r != cudaSuccess) {
        mw_tier_free(out);
        cudaGetLastError();
        char what[160];
        snprintf(what, sizeof what, "cudaMalloc of %llu bytes for '%s'", (unsigned long long)bytes, label ? label : "");
        return cu_fail(r, what);
    }
    out->ptr = p;
    return 0;
}

static void cu_free(void *ctx, struct mw_buf *b)
{
    struct cu_dev *x = ctx;
    if (!b || (!b->ptr && !b->reserved)) return;
    void *p = b->ptr;
    b->ptr = NULL; /* the tier frees a reservation, not memory it did not give */
    if (p) {
        int prev = cu_enter(x);
        cudaFree(p);
        cu_leave(x, prev);
    }
    mw_tier_free(b);
}

static int cu_host_register(void *ctx, void *ptr, uint64_t bytes)
{
    struct cu_dev *x = ctx;
    int prev = cu_enter(x);
    cudaError_t r = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    cu_leave(x, prev);
    if (r == cudaSuccess) return 0;
    cudaGetLastError(); /* not sticky: clear it */
    if (r != cudaErrorHostMemoryAlreadyRegistered)
        mw_log(MW_LOG_WARN, WHO ": cudaHostRegister of %llu bytes failed (%s): copies from them are not asynchronous",
               (unsigned long long)bytes, cudaGetErrorString(r));
    return 0;
}

static void cu_host_unregister(void *ctx, void *ptr)
{
    struct cu_dev *x = ctx;
    int prev = cu_enter(x);
    if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError(); /* never registered (see above) */
    cu_leave(x, prev);
}

/* ------------------------------------------------------------------ copies */

static int check_span(const struct mw_buf *b, uint64_t off, uint64_t bytes, const char *what)
{
    if (b && b->ptr && off <= b->bytes && bytes <= b->bytes - off) return 0;
    return mw_error_set(-EINVAL, WHO ": %s of %llu bytes at %llu outside the %llu-byte buffer '%s'", what,
                        (unsigned long long)bytes, (unsigned long long)off, (unsigned long long)(b ? b->bytes : 0),
                        b ? b->label : "(none)");
}

static int check_queue(enum ofl_devq q)
{
    return (unsigned)q < OFL_DEVQ_N ? 0 : mw_error_set(-EINVAL, WHO ": no queue %d", (int)q);
}

/* Trace: the first copy after a record starts a transfer (an event before it). x->mu held. */
static int trace_copy(struct cu_dev *x, struct cu_queue *q, uint64_t bytes, int h2d)
{
    if (!x->tr) return 0;
    struct cu_item *it = q->copies;
    if (it && it->h2d != h2d) return 0; /* both ways between two records: traced as the first */
    if (!it) {
        int rc = item_get(x, CU_TRACE_COPY, &it);
        if (rc) return rc;
        cudaError_t r = cudaEventRecord(it->start, q->s);
        if (r != cudaSuccess) { item_put(x, it); return cu_fail(r, "recording an event"); }
        it->h2d = h2d;
        it->anchor = anchor_get(x->anchor);
        q->copies = it;
    }
    it->bytes += bytes;
    return 0;
}

static int cu_copy(struct cu_dev *x, enum ofl_devq qi, void *dst, const void *src, uint64_t bytes, int h2d)
{
    struct cu_queue *q = &x->q[qi];
    int prev = cu_enter(x);
    pthread_mutex_lock(&x->mu);
    int rc = trace_copy(x, q, bytes, h2d);
    pthread_mutex_unlock(&x->mu);
    cudaError_t r = rc ? cudaSuccess
                       : cudaMemcpyAsync(dst, src, bytes, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, q->s);
    cu_leave(x, prev);
    if (!rc && r != cudaSuccess) rc = cu_fail(r, h2d ? "a copy to the device" : "a copy from the device");
    return rc;
}

static int cu_copy_in(void *ctx, enum ofl_devq q, const struct mw_buf *dst, uint64_t off, const void *src,
                      uint64_t bytes)
{
    int rc = check_queue(q);
    if (!rc) rc = check_span(dst, off, bytes, "copy in");
    if (rc || !bytes) return rc;
    return cu_copy(ctx, q, (char *)dst->ptr + off, src, bytes, 1);
}

static int cu_copy_out(void *ctx, enum ofl_devq q, void *dst, const struct mw_buf *src, uint64_t off, uint64_t bytes)
{
    int rc = check_queue(q);
    if (!rc) rc = check_span(src, off, bytes, "copy out");
    if (rc || !bytes) return rc;
    return cu_copy(ctx, q, dst, (const char *)src->ptr + off, bytes, 0);
}

/* ------------------------------------------------------------------ AdamW */

/* The walk of one region (ofl_update_walk) into batches; flush launches or runs one. */
struct cu_walk {
    const struct ofl_dev_adamw *op;
    struct ofl_cuda_batch b;
    int (*flush)(struct cu_walk *w);
    void *stream;             /* the launch's (NULL: on the host) */
    int prep_err;             /* a piece the CPU kernel refuses: its error, message in prep_msg */
    char prep_msg[400];
};

static void batch_reset(struct cu_walk *w)
{
    const struct ofl_dev_adamw *op = w->op;
    struct ofl_cuda_batch *b = &w->b;
    b->grad = (int)op->fmt.grad;
    b->moments = (int)op->fmt.moments;
    b->weights_out = (int)op->fmt.weights_out;
    b->master = op->s.master;
    b->grad_p = op->s.grad;
    b->m = op->s.m;
    b->v = op->s.v;
    b->m_scale = op->s.m_scale;
    b->v_scale = op->s.v_scale;
    b->w = op->s.weights_out;
    b->npieces = b->nscales = 0;
    b->max_n = 0;
}

static int walk_flush(struct cu_walk *w)
{
    if (!w->b.npieces && !w->b.nscales) return 0;
    int rc = w->flush(w);
    batch_reset(w);
    return rc;
}

static int walk_step(void *user, uint64_t off, uint64_t n, int decay, int64_t lag)
{
    struct cu_walk *w = user;
    if (lag == OFL_LAG_SKIP) return 0; /* left as read (update.c) */
    const struct ofl_dev_adamw *op = w->op;
    struct mw_optim_slice p = ofl_piece_slice(&op->fmt, &op->s, off, n);
    struct mw_adamw_hp hp = ofl_piece_hp(&op->hp, decay, lag);
    struct mw_kargs k;
    int rc = mw_adamw_prepare(&op->fmt, &hp, &p, &k); /* mw_adamw_step's checks and constants */
    if (rc) {
        w->prep_err = rc;
        snprintf(w->prep_msg, sizeof w->prep_msg, "AdamW on the " WHO ": %s", mw_error_msg());
        return rc;
    }
    if (!n) return 0;
    if (w->b.npieces == OFL_CUDA_PIECES && (rc = walk_flush(w))) return rc;
    w->b.piece[w->b.npieces++] = (struct ofl_cuda_piece){off, n, k.a.gscale, k.a.b1, k.a.c1, k.a.b2, k.a.c2,
                                                         k.a.decay, k.a.step_size, k.a.isb2, k.a.eps, k.off32, k.seed};
    if (n > w->b.max_n) w->b.max_n = n;
    return 0;
}

/* A scale segment covers elements of a step that comes later in the walk, never one already in
 * this batch or flushed, so the launch's order (scales first, then steps) is the walk's. */
static int walk_scale(void *user, uint64_t lo, uint64_t hi, float factor)
{
    struct cu_walk *w = user;
    int rc = 0;
    if (w->b.nscales == OFL_CUDA_SCALES && (rc = walk_flush(w))) return rc;
    w->b.scale[w->b.nscales++] = (struct ofl_cuda_scale){lo, hi, factor};
    return 0;
}

/* The whole region; 0, a launch's error (rc, prep_err 0), or a refused piece (prep_err). */
static int walk_region(struct cu_walk *w)
{
    batch_reset(w);
    const struct ofl_update_walker walker = {walk_step, walk_scale, w};
    int rc = ofl_update_walk(&w->op->fmt, &w->op->hp, w->op->s.n, w->op->runs, w->op->nruns, &walker);
    if (!rc) rc = walk_flush(w);
    return rc;
}

static int flush_launch(struct cu_walk *w)
{
    int r = ofl_cuda_launch(&w->b, w->stream);
    return r ? cu_fail((cudaError_t)r, "launching AdamW") : 0;
}

static int flush_host(struct cu_walk *w)
{
    ofl_cuda_run_host(&w->b);
    return 0;
}

int ofl_cuda_adamw_host(const struct ofl_dev_adamw *op)
{
    struct cu_walk *w = calloc(1, sizeof *w);
    if (!w) return mw_error_set(-ENOMEM, WHO ": out of memory");
    w->op = op;
    w->flush = flush_host;
    int rc = walk_region(w);
    if (rc && w->prep_err) rc = mw_error_set(w->prep_err, "%s", w->prep_msg);
    free(w);
    return rc;
}

static int cu_adamw(void *ctx, enum ofl_devq qi, const struct ofl_dev_adamw *op)
{
    struct cu_dev *x = ctx;
    int rc = check_queue(qi);
    if (rc) return rc;
    struct cu_queue *q = &x->q[qi];
    struct cu_walk w = {.op = op, .flush = flush_launch, .stream = q->s};
    struct cu_item *it = NULL;
    int prev = cu_enter(x);
    if (x->tr) {
        pthread_mutex_lock(&x->mu);
        rc = item_get(x, CU_TRACE_KERNEL, &it);
        if (!rc) {
            it->anchor = anchor_get(x->anchor);
            it->tag = op->tag;
            it->n = (int64_t)op->s.n;
            cudaError_t r = cudaEventRecord(it->start, q->s);
            if (r != cudaSuccess) rc = cu_fail(r, "recording an event");
        }
        pthread_mutex_unlock(&x->mu);
    }
    if (!rc) rc = walk_region(&w);
    pthread_mutex_lock(&x->mu);
    if (rc && w.prep_err) { /* refused by the kernel's checks: late, the queue's error */
        if (!q->err) {
            q->err = w.prep_err;
            snprintf(q->msg, sizeof q->msg, "%s", w.prep_msg);
        }
        rc = 0;
    }
    if (it && !rc && cudaEventRecord(it->end, q->s) == cudaSuccess) item_push(x, it);
    else if (it) item_put(x, it);
    pthread_mutex_unlock(&x->mu);
    cu_leave(x, prev);
    return rc;
}

/* ------------------------------------------------------------------ callbacks, events */

static int cu_host_fn(void *ctx, enum ofl_devq qi, void (*fn)(void *arg), void *arg)
{
    struct cu_dev *x = ctx;
    int rc = check_queue(qi);
    if (rc) return rc;
    int prev = cu_enter(x);
    pthread_mutex_lock(&x->mu);
    struct cu_item *it = NULL;
    rc = item_get(x, CU_CALLBACK, &it);
    if (!rc) {
        cudaError_t r = cudaEventRecord(it->end, x->q[qi].s);
        if (r != cudaSuccess) {
            item_put(x, it);
            rc = cu_fail(r, "queueing a host callback");
        } else {
            it->fn = fn;
            it->arg = arg;
            item_push(x, it);
        }
    }
    pthread_mutex_unlock(&x->mu);
    cu_leave(x, prev);
    return rc;
}

static int cu_event_new(void *ctx, struct ofl_dev_event **out)
{
    struct cu_dev *x = ctx;
    *out = NULL;
    struct cu_event *e = calloc(1, sizeof *e);
    if (!e) return mw_error_set(-ENOMEM, WHO ": out of memory for an event");
    int prev = cu_enter(x);
    cudaError_t r = cudaEventCreateWithFlags(&e->ev, cudaEventBlockingSync);
    cu_leave(x, prev);
    if (r != cudaSuccess) {
        free(e);
        return cu_fail(r, "creating an event");
    }
    *out = (struct ofl_dev_event *)(void *)e;
    return 0;
}

static void cu_event_free(void *ctx, struct ofl_dev_event *ev)
{
    struct cu_dev *x = ctx;
    struct cu_event *e = ev_of(ev);
    if (!e) return;
    int prev = cu_enter(x);
    pthread_mutex_lock(&x->mu);
    anchor_put(e->anchor);
    pthread_mutex_unlock(&x->mu);
    cudaEventDestroy(e->ev);
    cu_leave(x, prev);
    free(e);
}

static int cu_record(void *ctx, enum ofl_devq qi, struct ofl_dev_event *ev)
{
    struct cu_dev *x = ctx;
    int rc = check_queue(qi);
    if (rc) return rc;
    struct cu_queue *q = &x->q[qi];
    struct cu_event *e = ev_of(ev);
    int prev = cu_enter(x);
    pthread_mutex_lock(&x->mu);
    struct cu_item *copies = q->copies;
    cudaError_t r = copies ? cudaEventRecord(copies->end, q->s) : cudaSuccess;
    if (r == cudaSuccess) r = cudaEventRecord(e->ev, q->s);
    if (r != cudaSuccess) {
        rc = cu_fail(r, "recording an event");
    } else {
        e->recorded = 1;
        e->err = q->err; /* the record takes its queue's error */
        if (q->err) memcpy(e->msg, q->msg, sizeof e->msg);
        q->err = 0;
        struct cu_anchor *a = anchor_get(x->anchor);
        anchor_put(e->anchor);
        e->anchor = a;
        if (copies) { item_push(x, copies); q->copies = NULL; }
    }
    pthread_mutex_unlock(&x->mu);
    cu_leave(x, prev);
    return rc;
}

static int cu_wait_event(void *ctx, enum ofl_devq qi, struct ofl_dev_event *ev)
{
    struct cu_dev *x = ctx;
    int rc = check_queue(qi);
    struct cu_event *e = ev_of(ev);
    if (rc || !e->recorded) return rc; /* never recorded: complete */
    int prev = cu_enter(x);
    cudaError_t r = cudaStreamWaitEvent(x->q[qi].s, e->ev, 0);
    cu_leave(x, prev);
    return r == cudaSuccess ? 0 : cu_fail(r, "a queue waiting for an event");
}

/* ev complete: its record's own error, if any. */
static int event_err(struct cu_dev *x, struct cu_event *e)
{
    pthread_mutex_lock(&x->mu);
    char msg[sizeof e->msg];
    int err = e->err;
    if (err) memcpy(msg, e->msg, sizeof msg);
    pthread_mutex_unlock(&x->mu);
    return err ? mw_error_set(err, "%s", msg) : 0;
}

static int cu_event_query(void *ctx, struct ofl_dev_event *ev)
{
    struct cu_dev *x = ctx;
    struct cu_event *e = ev_of(ev);
    if (!e->recorded) return 1;
    int prev = cu_enter(x);
    cudaError_t r = cudaEventQuery(e->ev);
    cu_leave(x, prev);
    if (r == cudaErrorNotReady) return 0;
    if (r != cudaSuccess) return cu_fail(r, "the device's work");
    int rc = event_err(x, e);
    return rc ? rc : 1;
}

static int cu_event_wait(void *ctx, struct ofl_dev_event *ev)
{
    struct cu_dev *x = ctx;
    struct cu_event *e = ev_of(ev);
    if (!e->recorded) return 0;
    int prev = cu_enter(x);
    cudaError_t r = cudaEventSynchronize(e->ev);
    cu_leave(x, prev);
    if (r != cudaSuccess) return cu_fail(r, "the device's work");
    return event_err(x, e);
}

static uint64_t cu_event_time_ns(void *ctx, const struct ofl_dev_event *ev)
{
    struct cu_dev *x = ctx;
    const struct cu_event *e = (const struct cu_event *)(const void *)ev;
    if (!e->recorded) return 0;
    int prev = cu_enter(x);
    pthread_mutex_lock(&x->mu);
    uint64_t t = anchor_time(e->anchor, e->ev);
    pthread_mutex_unlock(&x->mu);
    cu_leave(x, prev);
    return t;
}

static int cu_synchronize(void *ctx)
{
    struct cu_dev *x = ctx;
    int prev = cu_enter(x);
    cudaError_t sticky = cudaSuccess;
    for (;;) { /* callbacks may queue more work: until the queues and the FIFO are empty together */
        for (int i = 0; i < OFL_DEVQ_N; i++) {
            cudaError_t r = cudaStreamSynchronize(x->q[i].s);
            if (r != cudaSuccess && sticky == cudaSuccess) sticky = r;
        }
        pthread_mutex_lock(&x->mu);
        while (x->head || x->running) pthread_cond_wait(&x->cv_idle, &x->mu);
        int idle = 1;
        for (int i = 0; i < OFL_DEVQ_N; i++) idle &= cudaStreamQuery(x->q[i].s) != cudaErrorNotReady;
        if (idle) break; /* (with the lock) */
        pthread_mutex_unlock(&x->mu);
    }
    int rc = 0;
    for (int i = 0; i < OFL_DEVQ_N; i++) {
        if (x->q[i].err && !rc) rc = mw_error_set(x->q[i].err, "%s", x->q[i].msg);
        x->q[i].err = 0;
    }
    pthread_mutex_unlock(&x->mu);
    cu_leave(x, prev);
    if (sticky != cudaSuccess) rc = cu_fail(sticky, "the device's work"); /* broken for good: it wins */
    return rc;
}

/* ------------------------------------------------------------------ open and close */

static void cu_destroy(struct cu_dev *x, int thread_up)
{
    if (thread_up) {
        pthread_mutex_lock(&x->mu);
        x->stop = 1;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->thr, NULL);
    }
    int prev = cu_enter(x);
    pthread_mutex_lock(&x->mu);
    for (int i = 0; i < OFL_DEVQ_N; i++)
        if (x->q[i].copies) { item_put(x, x->q[i].copies); x->q[i].copies = NULL; } /* copies no record followed */
    for (struct cu_item *it = x->head, *next; it; it = next) { next = it->next; item_put(x, it); }
    for (struct cu_item *it = x->spare, *next; it; it = next) {
        next = it->next;
        cudaEventDestroy(it->start);
        cudaEventDestroy(it->end);
        free(it);
    }
    anchor_put(x->anchor);
    pthread_mutex_unlock(&x->mu);
    for (int i = 0; i < OFL_DEVQ_N; i++)
        if (x->q[i].s) cudaStreamDestroy(x->q[i].s);
    if (x->aux) cudaStreamDestroy(x->aux);
    cu_leave(x, prev);
    pthread_cond_destroy(&x->cv);
    pthread_cond_destroy(&x->cv_idle);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

static void cu_close(void *ctx) { cu_destroy(ctx, 1); }

/* The GPU's ordinal: MEMWALL_CUDA_DEVICE, default 0; 0 or the error. */
static int pick_ordinal(int count, int *out)
{
    const char *s = getenv("MEMWALL_CUDA_DEVICE");
    *out = 0;
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v >= count)
        return mw_error_set(-EINVAL, WHO ": MEMWALL_CUDA_DEVICE=%s is not a device of this machine (0 to %d)", s,
                            count - 1);
    *out = (int)v;
    return 0;
}

static int cu_open(void **ctx, struct mw_tier *dev_tier, struct mw_trace *tr)
{
    *ctx = NULL;
    int count = 0;
    cudaError_t r = cudaGetDeviceCount(&count);
    if (r != cudaSuccess || count == 0) {
        cudaGetLastError();
        if (r != cudaSuccess)
            return mw_error_set(-ENODEV, WHO ": no CUDA device: cudaGetDeviceCount returned %d (%s: %s)%s", (int)r,
                                cudaGetErrorName(r), cudaGetErrorString(r),
                                r == cudaErrorInsufficientDriver
                                    ? "; no NVIDIA driver, or one older than this CUDA runtime (build with a toolkit "
                                      "no newer than the \"CUDA Version\" nvidia-smi shows)"
                                    : "");
        return mw_error_set(-ENODEV, WHO ": no CUDA device: cudaGetDeviceCount returned 0 devices");
    }
    int ordinal;
    int rc = pick_ordinal(count, &ordinal);
    if (rc) return rc;
    struct cu_dev *x = calloc(1, sizeof *x);
    if (!x) return mw_error_set(-ENOMEM, WHO ": out of memory");
    x->ordinal = ordinal;
    x->tier = dev_tier;
    x->tr = tr;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    pthread_cond_init(&x->cv_idle, NULL);
    int prev = cu_enter(x);
    r = cudaSetDevice(ordinal);
    for (int i = 0; i < OFL_DEVQ_N && r == cudaSuccess; i++)
        r = cudaStreamCreateWithFlags(&x->q[i].s, cudaStreamNonBlocking);
    if (r == cudaSuccess) r = cudaStreamCreateWithFlags(&x->aux, cudaStreamNonBlocking);
    rc = r != cudaSuccess ? cu_fail(r, "starting the device") : anchor_make(x, &x->anchor);
    x->anchor_next = mw_now_ns() + ANCHOR_NS;
    cu_leave(x, prev);
    if (!rc && pthread_create(&x->thr, NULL, cu_thread, x))
        rc = mw_error_set(-EAGAIN, WHO ": cannot start its thread");
    if (rc) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mw_error_msg());
        cu_destroy(x, 0);
        return mw_error_set(rc, "%s", msg);
    }
    *ctx = x;
    return 0;
}

const struct ofl_device_iface ofl_device_cuda = {
    .name = "cuda",
    .open = cu_open,
    .close = cu_close,
    .alloc = cu_alloc,
    .free = cu_free,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .copy_in = cu_copy_in,
    .copy_out = cu_copy_out,
    .adamw = cu_adamw,
    .host_fn = cu_host_fn,
    .event_new = cu_event_new,
    .event_free = cu_event_free,
    .record = cu_record,
    .wait_event = cu_wait_event,
    .event_query = cu_event_query,
    .event_wait = cu_event_wait,
    .event_time_ns = cu_event_time_ns,
    .synchronize = cu_synchronize,
};
