/*
 * accel_emu.c — the emulated accelerator: the device table of device.h implemented on the host,
 * with a copy engine thread and a compute thread.
 *
 * Why emulate: the hybrid schedule (some subgroups updated on the accelerator while the CPU
 * updates others) is the part of the engine most likely to be wrong — queueing, slot reuse,
 * copy/compute overlap, results landing back in the right place. The emulator makes all of
 * that real, tested code today. It moves every byte through its own buffers (allocated from the
 * device tier, through the tier's buffer type, so the tier counts them) and runs the same CPU
 * kernel there (ofl_update on one thread), so its results are bitwise those of the CPU path.
 *
 * How it fills the table: each of the three queues is a FIFO of operations under one mutex. The
 * copy thread serves OUT and IN (one link: copies take turns, device-to-host first, since the
 * end of a job frees its slot), the compute thread serves COMPUTE; copies and kernels run with
 * the mutex released. An operation at the head of a queue waits for the event it names (if
 * any); a record completes when the thread serving its queue reaches it, so its time is that of
 * the work around it, and takes the first error of the work before it on that queue (synchronize
 * returns one no record took). A host callback runs on the thread serving its queue, with the
 * mutex released, so it may queue more work: the end of a job starts the next one without a
 * thread switch, as a copy engine would.
 * Settings of the emulation are this context's, not the table's: the environment's MEMWALL_EMU,
 * read at open, "key=value" items separated by commas (docs/offload.md, "The emulated device"):
 *   rate=P      its AdamW runs at P parameters/s: a kernel that finished sooner waits out the rest
 *   link=B      its copies move B bytes/s, likewise
 *   latency=S   seconds added to each kernel
 *   clock=virtual  event times are not the wall clock's but the device's own simulated time: each
 *               queue's clock advances by the modelled time of its work and takes the time of an
 *               event it waits for; copies in and out have a link each (full duplex). Nothing
 *               sleeps, and a job's measured times are exactly the modelled ones, whatever else the
 *               machine does: the deterministic clock the cost model's tests inject.
 *   work=none   copies and kernels are only timed, not done: the device uses no host core or memory
 *               bandwidth, as a real accelerator would not, but its results are not computed
 *               (placement benchmarks only: bench/policy_grid.sh)
 * Why a modelled speed: the grid of devices that `--offload-policy auto` is checked on (0.25x to 8x
 * the CPU, links of 1 to 64 GB/s) cannot come from a host thread running the CPU's own kernel.
 */
#include "offload/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum emu_kind { EMU_COPY_IN, EMU_COPY_OUT, EMU_ADAMW, EMU_RECORD, EMU_WAIT, EMU_HOST_FN };

struct emu_event {
    uint64_t recorded, done; /* generations: the last record queued, the last one completed */
    uint64_t t_ns;           /* when `done` completed */
    int err;                 /* the error of its queue's work since the record before */
    char msg[400];
    int waiters;             /* host threads in event_wait on it */
};

struct emu_op {
    enum emu_kind kind;
    const struct mw_buf *buf; /* copies: the device buffer, its byte offset, host memory, bytes */
    uint64_t off, bytes;
    void *host;               /* (and a host callback's argument) */
    void (*fn)(void *arg);    /* host callback */
    struct emu_event *ev;     /* record, wait: the event and its generation */
    uint64_t gen;
    struct ofl_dev_adamw adamw;
};

struct emu_queue {
    struct emu_op *ops;       /* ring of cap, n from head */
    uint32_t cap, head, n;
    int busy;                 /* its head operation is running (mutex released) */
    int err;                  /* the first error of its work since its last record */
    char msg[400];
    uint64_t tr_bytes, tr_t0, tr_t1; /* copies since its last record, traced as one transfer */
    int tr_h2d;
    uint64_t vt;              /* clock=virtual: the queue's own time (ns) */
};

/* MEMWALL_EMU (above); zeros: as fast as the host runs it. */
struct emu_cfg {
    double rate, link, latency; /* parameters/s, bytes/s, seconds */
    int virt, no_work;
};

struct emu {
    struct mw_tier *tier;
    struct mw_trace *tr;
    pthread_mutex_t mu;
    pthread_cond_t cv_copy, cv_work, cv_host; /* copy thread, compute thread, host waiters */
    int sync_waiters;                         /* host threads in synchronize */
    struct emu_queue q[OFL_DEVQ_N];
    pthread_t copy_thr, work_thr;
    int stop;
    struct emu_cfg cfg;
};

static struct emu_event *ev_of(struct ofl_dev_event *e) { return (struct emu_event *)(void *)e; }

static pthread_cond_t *cv_of(struct emu *x, int q) { return q == OFL_DEVQ_COMPUTE ? &x->cv_work : &x->cv_copy; }

static struct emu_op *q_head(struct emu_queue *q) { return q->n ? &q->ops[q->head] : NULL; }

static void q_pop(struct emu_queue *q)
{
    q->head = (q->head + 1) % q->cap;
    q->n--;
}

/* x->mu held. */
static int q_push(struct emu_queue *q, const struct emu_op *op)
{
    if (q->n == q->cap) {
        uint32_t cap = q->cap ? 2 * q->cap : 64;
        struct emu_op *a = malloc((size_t)cap * sizeof *a);
        if (!a) return mw_error_set(-ENOMEM, "emulated accelerator: out of memory for its queue");
        for (uint32_t i = 0; i < q->n; i++) a[i] = q->ops[(q->head + i) % q->cap];
        free(q->ops);
        q->ops = a;
        q->cap = cap;
        q->head = 0;
    }
    q->ops[(q->head + q->n) % q->cap] = *op;
    q->n++;
    return 0;
}

/* x->mu held: an event completed; wake whoever waits for it (a queue's head, the host). */
static void wake_for(struct emu *x, const struct emu_event *ev)
{
    for (int i = 0; i < OFL_DEVQ_N; i++) {
        const struct emu_op *h = q_head(&x->q[i]);
        if (h && h->kind == EMU_WAIT && h->ev == ev) pthread_cond_signal(cv_of(x, i));
    }
    if (ev->waiters) pthread_cond_broadcast(&x->cv_host);
}

/* x->mu held: q may have become idle; wake synchronize. */
static void idle_check(struct emu *x, const struct emu_queue *q)
{
    if (x->sync_waiters && !q->n && !q->busy) pthread_cond_broadcast(&x->cv_host);
}

/* A host<->device transfer is I/O of that tier pair (docs/trace-conventions.md, cat "io"). The
 * copies of a queue between two of its records are traced as one transfer (the engine records
 * after each job's copies: one event per job and direction), by the thread that made them. */
static void trace_flush(struct emu *x, struct emu_queue *q)
{
    if (!q->tr_bytes) return;
    int h2d = q->tr_h2d;
    struct mw_trace_io io = {h2d ? MW_TRACE_WRITE : MW_TRACE_READ, h2d ? MW_TIER_DRAM : MW_TIER_DEVICE,
                             h2d ? MW_TIER_DEVICE : MW_TIER_DRAM, q->tr_bytes, 0, 1, q->tr_t0, q->tr_t1,
                             "emulated accelerator", 0};
    if (x->tr) mw_trace_io(x->tr, &io);
    q->tr_bytes = 0;
}

static void trace_copy(struct emu *x, struct emu_queue *q, const struct emu_op *op, uint64_t t0, uint64_t t1)
{
    int h2d = op->kind == EMU_COPY_IN;
    if (q->tr_bytes && q->tr_h2d != h2d) trace_flush(x, q);
    if (!q->tr_bytes) { q->tr_t0 = t0; q->tr_h2d = h2d; }
    q->tr_bytes += op->bytes;
    q->tr_t1 = t1;
}

/* x->mu held, by the thread serving q: completes the records and the satisfied waits at its head. */
static void settle_locked(struct emu *x, struct emu_queue *q)
{
    struct emu_op *h;
    while ((h = q_head(q))) {
        struct emu_event *ev = h->ev;
        if (h->kind == EMU_RECORD) {
            trace_flush(x, q);
            if (h->gen > ev->done) ev->done = h->gen;
            ev->t_ns = x->cfg.virt ? q->vt : mw_now_ns();
            ev->err = q->err; /* the record takes its queue's error */
            if (q->err) memcpy(ev->msg, q->msg, sizeof ev->msg);
            q->err = 0;
            q_pop(q);
            wake_for(x, ev);
        } else if (h->kind == EMU_WAIT && ev->done >= h->gen) {
            if (x->cfg.virt && ev->t_ns > q->vt) q->vt = ev->t_ns; /* it starts after what it waited for */
            q_pop(q);
        } else {
            break;
        }
    }
    idle_check(x, q);
}

/* Runs one copy, kernel or host callback, mutex released; 0 or the error (message in msg). */
static int run_op(struct emu *x, const struct emu_op *op, char *msg, size_t msg_len)
{
    if (op->kind == EMU_HOST_FN) {
        op->fn(op->host);
        return 0;
    }
    if (op->kind == EMU_COPY_IN) {
        if (!x->cfg.no_work) mw_tier_copy_in(op->buf, op->off, op->host, op->bytes);
        return 0;
    }
    if (op->kind == EMU_COPY_OUT) {
        if (!x->cfg.no_work) mw_tier_copy_out(op->host, op->buf, op->off, op->bytes);
        return 0;
    }
    uint64_t t0 = mw_now_ns();
    const struct ofl_dev_adamw *a = &op->adamw;
    struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0}; /* the device's own single worker */
    int rc = x->cfg.no_work ? 0 : ofl_update(&a->fmt, &a->hp, &a->s, a->runs, a->nruns, &ex);
    if (rc) snprintf(msg, msg_len, "AdamW on the emulated accelerator: %s", mw_error_msg());
    struct mw_trace_arg args[2] = {{"subgroup", a->tag}, {"elems", (int64_t)a->s.n}};
    mw_trace_span(x->tr, "device", "kernel", t0, mw_now_ns(), args, 2);
    return rc;
}

/* The modelled time of a copy or kernel (ns), or 0 where MEMWALL_EMU sets none. */
static uint64_t emu_model_ns(const struct emu *x, const struct emu_op *op)
{
    double s = 0;
    if ((op->kind == EMU_COPY_IN || op->kind == EMU_COPY_OUT) && x->cfg.link > 0) s = (double)op->bytes / x->cfg.link;
    if (op->kind == EMU_ADAMW && (x->cfg.rate > 0 || x->cfg.latency > 0))
        s = (x->cfg.rate > 0 ? (double)op->adamw.s.n / x->cfg.rate : 0) + x->cfg.latency;
    return s > 0 ? (uint64_t)(s * 1e9) : 0;
}

/* After an operation that started at t0: with a modelled time, the wall clock waits it out (it
 * sleeps for the rest) or, with clock=virtual, the operation takes exactly that long on the
 * queue's clock. Returns the operation's end on the clock that counts. */
static uint64_t emu_pace(struct emu *x, const struct emu_op *op, uint64_t t0)
{
    uint64_t now = mw_now_ns(), m = emu_model_ns(x, op);
    if (x->cfg.virt) return op->kind == EMU_HOST_FN ? t0 : t0 + (m ? m : now - t0);
    while (m && now < t0 + m) {
        uint64_t left = t0 + m - now;
        struct timespec ts = {(time_t)(left / 1000000000u), (long)(left % 1000000000u)};
        nanosleep(&ts, NULL);
        now = mw_now_ns();
    }
    return now;
}

/* A worker: serves queues qs[0..nq) in that priority, one operation at a time. */
static void serve(struct emu *x, const int *qs, int nq, pthread_cond_t *cv)
{
    char msg[400];
    pthread_mutex_lock(&x->mu);
    for (;;) {
        int ran = 0;
        for (int i = 0; i < nq && !ran; i++) {
            struct emu_queue *q = &x->q[qs[i]];
            settle_locked(x, q);
            struct emu_op *h = q_head(q);
            if (!h || h->kind == EMU_WAIT) continue; /* empty, or waiting for an event */
            struct emu_op op = *h;
            q_pop(q);
            q->busy = 1;
            pthread_mutex_unlock(&x->mu);
            uint64_t t0 = mw_now_ns();
            int rc = run_op(x, &op, msg, sizeof msg);
            uint64_t t1 = emu_pace(x, &op, t0);
            pthread_mutex_lock(&x->mu);
            if (x->cfg.virt) q->vt += t1 - t0;
            q->busy = 0;
            if (op.kind == EMU_COPY_IN || op.kind == EMU_COPY_OUT) trace_copy(x, q, &op, t0, t1);
            if (rc && !q->err) { q->err = rc; snprintf(q->msg, sizeof q->msg, "%s", msg); }
            settle_locked(x, q); /* the record behind it completes now, not at the next wake */
            ran = 1;
        }
        if (ran) continue;
        if (x->stop) break;
        pthread_cond_wait(cv, &x->mu);
    }
    pthread_mutex_unlock(&x->mu);
}

static void *copy_main(void *arg)
{
    struct emu *x = arg;
    mw_trace_thread_name(x->tr, "offload-dev-copy");
    static const int qs[2] = {OFL_DEVQ_OUT, OFL_DEVQ_IN}; /* device-to-host first: it frees a slot */
    serve(x, qs, 2, &x->cv_copy);
    return NULL;
}

static void *work_main(void *arg)
{
    struct emu *x = arg;
    mw_trace_thread_name(x->tr, "offload-dev-worker");
    static const int qs[1] = {OFL_DEVQ_COMPUTE};
    serve(x, qs, 1, &x->cv_work);
    return NULL;
}

/* ------------------------------------------------------------------ the table */

static int enqueue(struct emu *x, enum ofl_devq q, struct emu_op *op)
{
    if ((unsigned)q >= OFL_DEVQ_N) return mw_error_set(-EINVAL, "emulated accelerator: no queue %d", (int)q);
    pthread_mutex_lock(&x->mu);
    if (op->kind == EMU_RECORD) op->gen = op->ev->recorded + 1;
    if (op->kind == EMU_WAIT) op->gen = op->ev->recorded;
    int rc = q_push(&x->q[q], op);
    if (!rc && op->kind == EMU_RECORD) op->ev->recorded = op->gen;
    /* The serving thread needs a wake only for a new head it can run: behind other work it gets
     * there by itself, and a wait is woken by its event. */
    if (!rc && x->q[q].n == 1 && !(op->kind == EMU_WAIT && op->ev->done < op->gen)) pthread_cond_signal(cv_of(x, q));
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static int check_span(const struct mw_buf *b, uint64_t off, uint64_t bytes, const char *what)
{
    if (b && b->ptr && off <= b->bytes && bytes <= b->bytes - off) return 0;
    return mw_error_set(-EINVAL, "emulated accelerator: %s of %llu bytes at %llu outside the %llu-byte buffer '%s'", what,
                        (unsigned long long)bytes, (unsigned long long)off, (unsigned long long)(b ? b->bytes : 0),
                        b ? b->label : "(none)");
}

static int emu_copy_in(void *ctx, enum ofl_devq q, const struct mw_buf *dst, uint64_t off, const void *src, uint64_t bytes)
{
    int rc = check_span(dst, off, bytes, "copy in");
    if (rc) return rc;
    struct emu_op op = {.kind = EMU_COPY_IN, .buf = dst, .off = off, .bytes = bytes, .host = (void *)(uintptr_t)src};
    return enqueue(ctx, q, &op);
}

static int emu_copy_out(void *ctx, enum ofl_devq q, void *dst, const struct mw_buf *src, uint64_t off, uint64_t bytes)
{
    int rc = check_span(src, off, bytes, "copy out");
    if (rc) return rc;
    struct emu_op op = {.kind = EMU_COPY_OUT, .buf = src, .off = off, .bytes = bytes, .host = dst};
    return enqueue(ctx, q, &op);
}

static int emu_adamw(void *ctx, enum ofl_devq q, const struct ofl_dev_adamw *a)
{
    struct emu_op op = {.kind = EMU_ADAMW, .adamw = *a};
    return enqueue(ctx, q, &op);
}

static int emu_record(void *ctx, enum ofl_devq q, struct ofl_dev_event *ev)
{
    struct emu_op op = {.kind = EMU_RECORD, .ev = ev_of(ev)};
    return enqueue(ctx, q, &op);
}

static int emu_wait_event(void *ctx, enum ofl_devq q, struct ofl_dev_event *ev)
{
    struct emu_op op = {.kind = EMU_WAIT, .ev = ev_of(ev)};
    return enqueue(ctx, q, &op);
}

static int emu_host_fn(void *ctx, enum ofl_devq q, void (*fn)(void *arg), void *arg)
{
    struct emu_op op = {.kind = EMU_HOST_FN, .fn = fn, .host = arg};
    return enqueue(ctx, q, &op);
}

static int emu_event_new(void *ctx, struct ofl_dev_event **out)
{
    (void)ctx;
    *out = calloc(1, sizeof(struct emu_event));
    return *out ? 0 : mw_error_set(-ENOMEM, "emulated accelerator: out of memory for an event");
}

static void emu_event_free(void *ctx, struct ofl_dev_event *ev)
{
    (void)ctx;
    free(ev);
}

static int emu_event_query(void *ctx, struct ofl_dev_event *e)
{
    struct emu *x = ctx;
    struct emu_event *ev = ev_of(e);
    pthread_mutex_lock(&x->mu);
    int rc = ev->done < ev->recorded ? 0 : ev->err ? mw_error_set(ev->err, "%s", ev->msg) : 1;
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static int emu_event_wait(void *ctx, struct ofl_dev_event *e)
{
    struct emu *x = ctx;
    struct emu_event *ev = ev_of(e);
    pthread_mutex_lock(&x->mu);
    uint64_t gen = ev->recorded;
    ev->waiters++;
    while (ev->done < gen) pthread_cond_wait(&x->cv_host, &x->mu);
    ev->waiters--;
    int rc = ev->err ? mw_error_set(ev->err, "%s", ev->msg) : 0;
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static uint64_t emu_event_time_ns(void *ctx, const struct ofl_dev_event *e)
{
    struct emu *x = ctx;
    pthread_mutex_lock(&x->mu);
    uint64_t t = ((const struct emu_event *)(const void *)e)->t_ns;
    pthread_mutex_unlock(&x->mu);
    return t;
}

static int emu_synchronize(void *ctx)
{
    struct emu *x = ctx;
    pthread_mutex_lock(&x->mu);
    x->sync_waiters++;
    for (;;) {
        int idle = 1;
        for (int i = 0; i < OFL_DEVQ_N; i++) idle &= !x->q[i].n && !x->q[i].busy;
        if (idle) break;
        pthread_cond_wait(&x->cv_host, &x->mu);
    }
    x->sync_waiters--;
    int rc = 0;
    for (int i = 0; i < OFL_DEVQ_N; i++) {
        if (x->q[i].err && !rc) rc = mw_error_set(x->q[i].err, "%s", x->q[i].msg);
        x->q[i].err = 0;
    }
    pthread_mutex_unlock(&x->mu);
    return rc;
}

static int emu_alloc(void *ctx, uint64_t bytes, enum mw_alloc_kind kind, const char *label, struct mw_buf *out)
{
    struct emu *x = ctx;
    return mw_tier_alloc(x->tier, bytes, 0, kind, label, out);
}

static void emu_free(void *ctx, struct mw_buf *b)
{
    (void)ctx;
    mw_tier_free(b);
}

/* Stops the threads that were started (up of them) and frees everything. */
static void emu_destroy(struct emu *x, int up)
{
    pthread_mutex_lock(&x->mu);
    x->stop = 1;
    pthread_cond_broadcast(&x->cv_copy);
    pthread_cond_broadcast(&x->cv_work);
    pthread_mutex_unlock(&x->mu);
    if (up > 0) pthread_join(x->copy_thr, NULL);
    if (up > 1) pthread_join(x->work_thr, NULL);
    for (int i = 0; i < OFL_DEVQ_N; i++) {
        trace_flush(x, &x->q[i]); /* copies after the last record */
        free(x->q[i].ops);
    }
    pthread_cond_destroy(&x->cv_copy);
    pthread_cond_destroy(&x->cv_work);
    pthread_cond_destroy(&x->cv_host);
    pthread_mutex_destroy(&x->mu);
    free(x);
}

static void emu_close(void *ctx) { emu_destroy(ctx, 2); }

/* MEMWALL_EMU's items (above) into c; 0, or -EINVAL naming the item. */
static int emu_cfg_parse(const char *spec, struct emu_cfg *c)
{
    memset(c, 0, sizeof *c);
    for (const char *p = spec; p && *p;) {
        const char *end = strchr(p, ','), *eq = strchr(p, '=');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (!eq || eq > p + len) goto bad;
        size_t kl = (size_t)(eq - p);
        const char *v = eq + 1;
        char *vend;
        if (kl == 5 && !strncmp(p, "clock", 5) && !strncmp(v, "virtual", 7) && v + 7 == p + len) c->virt = 1;
        else if (kl == 5 && !strncmp(p, "clock", 5) && !strncmp(v, "wall", 4) && v + 4 == p + len) c->virt = 0;
        else if (kl == 4 && !strncmp(p, "work", 4) && !strncmp(v, "none", 4) && v + 4 == p + len) c->no_work = 1;
        else if (kl == 4 && !strncmp(p, "work", 4) && !strncmp(v, "all", 3) && v + 3 == p + len) c->no_work = 0;
        else {
            double d = strtod(v, &vend);
            if (vend != p + len || !(d >= 0 && d <= 1e18)) goto bad;
            if (kl == 4 && !strncmp(p, "rate", 4)) c->rate = d;
            else if (kl == 4 && !strncmp(p, "link", 4)) c->link = d;
            else if (kl == 7 && !strncmp(p, "latency", 7)) c->latency = d;
            else goto bad;
        }
        p = end ? end + 1 : NULL;
        continue;
    bad:
        return mw_error_set(-EINVAL, "MEMWALL_EMU='%s': bad item '%.*s' (rate=PARAMS_PER_S, link=BYTES_PER_S, "
                            "latency=SECONDS, clock=wall|virtual, work=all|none)", spec, (int)len, p);
    }
    return 0;
}

static int emu_open(void **ctx, struct mw_tier *dev_tier, struct mw_trace *tr)
{
    *ctx = NULL;
    struct emu_cfg cfg;
    int rc = emu_cfg_parse(getenv("MEMWALL_EMU"), &cfg);
    if (rc) return rc;
    struct emu *x = calloc(1, sizeof *x);
    if (!x) return mw_error_set(-ENOMEM, "emulated accelerator: out of memory");
    x->cfg = cfg;
    x->tier = dev_tier;
    x->tr = tr;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_copy, NULL);
    pthread_cond_init(&x->cv_work, NULL);
    pthread_cond_init(&x->cv_host, NULL);
    /* Room for what the engine keeps queued (device.c: four jobs), so that queueing its work
     * never allocates; more grows the rings. */
    int ok = 1;
    uint64_t now = mw_now_ns();
    for (int i = 0; i < OFL_DEVQ_N; i++) {
        x->q[i].vt = now; /* clock=virtual starts at the wall clock's now (traces stay in place) */
        x->q[i].ops = malloc(64 * sizeof *x->q[i].ops);
        x->q[i].cap = 64;
        ok &= x->q[i].ops != NULL;
    }
    if (!ok) {
        emu_destroy(x, 0);
        return mw_error_set(-ENOMEM, "emulated accelerator: out of memory for its queues");
    }
    int up = 0;
    if (!pthread_create(&x->copy_thr, NULL, copy_main, x)) up++;
    if (up == 1 && !pthread_create(&x->work_thr, NULL, work_main, x)) up++;
    if (up < 2) {
        emu_destroy(x, up);
        return mw_error_set(-EAGAIN, "emulated accelerator: cannot start its threads");
    }
    *ctx = x;
    return 0;
}

const struct ofl_device_iface ofl_device_emu = {
    .name = "emu",
    .open = emu_open,
    .close = emu_close,
    .alloc = emu_alloc,
    .free = emu_free,
    .copy_in = emu_copy_in,
    .copy_out = emu_copy_out,
    .adamw = emu_adamw,
    .host_fn = emu_host_fn,
    .event_new = emu_event_new,
    .event_free = emu_event_free,
    .record = emu_record,
    .wait_event = emu_wait_event,
    .event_query = emu_event_query,
    .event_wait = emu_event_wait,
    .event_time_ns = emu_event_time_ns,
    .synchronize = emu_synchronize,
};
