/*
 * device.c — the engine's side of the device table (device.h): which devices exist, and how one
 * subgroup update runs on the device the engine opened.
 *
 * Why here and not in each device: queueing a job, keeping two of them in flight, reading back
 * the times and handing the result to the pipeline is the same for every device; a device only
 * copies, computes and keeps events (src/aio/aio.c and its backends split the same way). A CUDA
 * device therefore gets the engine's overlap of copies and compute without writing any of it.
 *
 * Job number k (one subgroup) uses arena slot k % 2 and event set k % DEV_DEPTH, and is queued as
 *   IN       wait for d2h1 of job k-2 (the slot's last user), record h2d0, copy master, grad, m,
 *            [m scales], v, [v scales], [weights, when a run is not stepped], record h2d1
 *   COMPUTE  wait for h2d1, record k0, AdamW, record k1
 *   OUT      wait for k1, record d2h0, copy master, m, [scales], v, [weights], record d2h1,
 *            then a host callback: job_done_cb
 * Two slots: the copies of one job overlap the kernel of the other. Up to DEV_DEPTH jobs are on
 * the device at once, those past the first two already queued behind the slot they will use, so
 * the device goes from one job to the next by itself; more wait in a FIFO here. The callback runs
 * on the device's thread once the job is back in host memory (jobs finish in the order they were
 * queued: every queue runs in order): it reads the job's errors and times from its events, puts
 * the next waiting job on the device, then calls the job's done, as the copy engine would.
 *
 * A device that cannot queue a job (out of memory, a broken CUDA context) is broken for good: that
 * job and every later one fail, and the failure thread hands them back once the device has run
 * what was queued (never under the caller's locks, which the callbacks need).
 *
 * Locks: ofl_dev_submit may be called with the engine's mutex held; ofl_dev's mutex is taken
 * under it and the device's own under that, never the reverse. Callbacks run with none held and
 * never wait for the device; done runs with none held.
 */
#include "offload/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The registry: one line per device; the first is the default. "cuda" is in every build (without
 * nvcc, a stand-in whose open says how to build it: device_cuda_none.c). */
static const struct ofl_device_iface *const g_devices[] = {
    &ofl_device_emu,
    &ofl_device_cuda,
};
#define N_DEVICES (sizeof g_devices / sizeof g_devices[0])

const struct ofl_device_iface *ofl_device_find(const char *name)
{
    if (!name) return g_devices[0];
    char names[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < N_DEVICES; i++) {
        if (!strcmp(g_devices[i]->name, name)) return g_devices[i];
        if (used < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", g_devices[i]->name);
    }
    mw_error_set(-EINVAL, "offload: no accelerator called '%s' (built in: %s)", name, names);
    return NULL;
}

/* ------------------------------------------------------------------ layout of a job in a slot */

#define DEV_ALIGN 64

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

/* ------------------------------------------------------------------ jobs */

enum { EV_H2D0, EV_H2D1, EV_K0, EV_K1, EV_D2H0, EV_D2H1, EV_N };
#define DEV_DEPTH 4 /* jobs on the device at once: one per slot, and one queued behind each */

struct job_ref { struct ofl_dev *d; struct ofl_devjob *j; uint64_t k; }; /* a callback's argument */

struct ofl_dev {
    const struct ofl_device_iface *dv;
    void *ctx;                                 /* the open device */
    const struct mw_offload_config *cfg;
    struct mw_buf arena;                       /* two job slots of slot_bytes */
    int have_arena;
    uint64_t slot_bytes;
    struct ofl_dev_event *ev[DEV_DEPTH][EV_N]; /* event sets: job k uses set k % DEV_DEPTH */
    struct job_ref ref[DEV_DEPTH];             /* job k's callback argument */
    uint64_t next_k, done_k;                   /* jobs queued on the device, and finished */
    struct ofl_devjob *wait_head, *wait_tail;  /* jobs waiting for room on the device */
    int broken;                                /* a job could not be queued: every job fails */
    char broken_msg[400];
    struct ofl_devjob *fail_head, *fail_tail;  /* failed jobs for the failure thread */
    void **pinned;                             /* host memory registered with the device */
    int npinned, cap_pinned;
    pthread_mutex_t mu;
    pthread_cond_t cv;                         /* the failure thread: failed jobs, or stop */
    pthread_t thr;
    int thread_up, stop;
};

static void job_done_cb(void *arg);

/* The first failure of a job, with what failed and the message of the failing call. */
static void job_fail(struct ofl_devjob *j, int rc, const char *what)
{
    if (!rc || j->result) return;
    j->result = rc;
    snprintf(j->msg, sizeof j->msg, "%s: %s", what, mw_error_msg());
}

struct xfer { uint64_t off; void *host; uint64_t bytes; };

/* Queues the work of job j, number k (the design comment above); 0 or the first error. */
static int queue_job(struct ofl_dev *d, struct ofl_devjob *j, uint64_t k)
{
    const struct ofl_device_iface *dv = d->dv;
    void *x = d->ctx;
    struct ofl_dev_event **ev = d->ev[k % DEV_DEPTH];
    uint64_t slot = k % 2;
    const struct mw_offload_config *c = d->cfg;
    const struct mw_optim_slice *h = &j->host;
    uint64_t n = h->n, mb = ofl_region_bytes(c, OFL_R_M, n), sb = ofl_region_bytes(c, OFL_R_MSCALE, n);
    uint64_t base = slot * d->slot_bytes;
    struct dev_lay L;
    dev_lay_make(c, n, &L);
    /* A run not stepped (per-tensor steps, update.c) keeps its weight copy as it is on the host: the
     * copy goes in too, so that what comes back there is what went in, not the slot's last job's. */
    int skips = 0;
    for (uint32_t i = 0; i < j->nruns; i++) skips |= j->runs[i].n && j->runs[i].lag == OFL_LAG_SKIP;
    const struct xfer in[7] = {{L.master, h->master, 4 * n}, {L.grad, (void *)(uintptr_t)h->grad, 4 * n},
                               {L.m, h->m, mb}, {L.ms, h->m_scale, sb}, {L.v, h->v, mb}, {L.vs, h->v_scale, sb},
                               {L.w, skips ? h->weights_out : NULL, 2 * n}};
    const struct xfer out[6] = {{L.master, h->master, 4 * n}, {L.m, h->m, mb}, {L.ms, h->m_scale, sb},
                                {L.v, h->v, mb}, {L.vs, h->v_scale, sb}, {L.w, h->weights_out, 2 * n}};
    int rc = k >= 2 ? dv->wait_event(x, OFL_DEVQ_IN, d->ev[(k - 2) % DEV_DEPTH][EV_D2H1]) : 0;
    if (!rc) rc = dv->record(x, OFL_DEVQ_IN, ev[EV_H2D0]);
    for (int i = 0; i < 7 && !rc; i++) {
        if (!in[i].host || !in[i].bytes) continue;
        rc = dv->copy_in(x, OFL_DEVQ_IN, &d->arena, base + in[i].off, in[i].host, in[i].bytes);
        j->h2d_bytes += in[i].bytes;
    }
    if (!rc) rc = dv->record(x, OFL_DEVQ_IN, ev[EV_H2D1]);

    /* the device's view of the slot: the same arrays at device addresses */
    char *b = (char *)d->arena.ptr + base;
    struct ofl_dev_adamw op = {*j->fmt, j->hp, {0}, j->runs, j->nruns, j->sg};
    op.s.n = n;
    op.s.offset = h->offset;
    op.s.master = (float *)(b + L.master);
    op.s.grad = b + L.grad;
    op.s.m = b + L.m;
    op.s.v = b + L.v;
    if (sb) { op.s.m_scale = (float *)(b + L.ms); op.s.v_scale = (float *)(b + L.vs); }
    if (h->weights_out) op.s.weights_out = b + L.w;
    if (!rc) rc = dv->wait_event(x, OFL_DEVQ_COMPUTE, ev[EV_H2D1]);
    if (!rc) rc = dv->record(x, OFL_DEVQ_COMPUTE, ev[EV_K0]);
    if (!rc) rc = dv->adamw(x, OFL_DEVQ_COMPUTE, &op);
    if (!rc) rc = dv->record(x, OFL_DEVQ_COMPUTE, ev[EV_K1]);

    if (!rc) rc = dv->wait_event(x, OFL_DEVQ_OUT, ev[EV_K1]);
    if (!rc) rc = dv->record(x, OFL_DEVQ_OUT, ev[EV_D2H0]);
    for (int i = 0; i < 6 && !rc; i++) {
        if (!out[i].host || !out[i].bytes) continue;
        rc = dv->copy_out(x, OFL_DEVQ_OUT, out[i].host, &d->arena, base + out[i].off, out[i].bytes);
        j->d2h_bytes += out[i].bytes;
    }
    if (!rc) rc = dv->record(x, OFL_DEVQ_OUT, ev[EV_D2H1]);
    d->ref[k % DEV_DEPTH] = (struct job_ref){d, j, k};
    if (!rc) rc = dv->host_fn(x, OFL_DEVQ_OUT, job_done_cb, &d->ref[k % DEV_DEPTH]);
    return rc;
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

/* d->mu held: j fails (the device is broken) and goes to the failure thread. */
static void fail_locked(struct ofl_dev *d, struct ofl_devjob *j)
{
    if (!j->result) {
        j->result = d->broken;
        snprintf(j->msg, sizeof j->msg, "%s", d->broken_msg);
    }
    push(&d->fail_head, &d->fail_tail, j);
    pthread_cond_signal(&d->cv);
}

/* d->mu held, fewer than DEV_DEPTH jobs on the device: j goes on it. */
static void start_locked(struct ofl_dev *d, struct ofl_devjob *j)
{
    if (d->broken) { fail_locked(d, j); return; }
    uint64_t k = d->next_k++;
    int rc = queue_job(d, j, k);
    if (!rc) return;
    job_fail(j, rc, "queueing an update on the accelerator");
    d->broken = j->result;
    snprintf(d->broken_msg, sizeof d->broken_msg, "the accelerator failed before: %.360s", j->msg);
    fail_locked(d, j);
    for (struct ofl_devjob *w; (w = pop(&d->wait_head, &d->wait_tail));) fail_locked(d, w);
}

/* The errors and times of job j, number k, whose events are all complete. */
static void job_read_events(struct ofl_dev *d, struct ofl_devjob *j, uint64_t k)
{
    const struct ofl_device_iface *dv = d->dv;
    struct ofl_dev_event **ev = d->ev[k % DEV_DEPTH];
    static const char *const what[EV_N] = {"the accelerator", "copying to the accelerator", "the accelerator",
                                           "the accelerator's update", "the accelerator",
                                           "copying from the accelerator"};
    for (int i = 0; i < EV_N; i++) {
        int rc = dv->event_query(d->ctx, ev[i]);
        if (rc < 0) job_fail(j, rc, what[i]);
        else if (rc == 0) job_fail(j, mw_error_set(-EPROTO, "an event was not complete in the job's callback"), what[i]);
    }
    j->t_h2d0 = dv->event_time_ns(d->ctx, ev[EV_H2D0]);
    j->t_h2d1 = dv->event_time_ns(d->ctx, ev[EV_H2D1]);
    j->t_k0 = dv->event_time_ns(d->ctx, ev[EV_K0]);
    j->t_k1 = dv->event_time_ns(d->ctx, ev[EV_K1]);
    j->t_d2h0 = dv->event_time_ns(d->ctx, ev[EV_D2H0]);
    j->t_d2h1 = dv->event_time_ns(d->ctx, ev[EV_D2H1]);
}

/* The device's thread, once job k is back in host memory. */
static void job_done_cb(void *arg)
{
    struct job_ref r = *(struct job_ref *)arg; /* the slot is reused once done_k moves */
    job_read_events(r.d, r.j, r.k);
    pthread_mutex_lock(&r.d->mu);
    r.d->done_k++;
    struct ofl_devjob *next = pop(&r.d->wait_head, &r.d->wait_tail);
    if (next) start_locked(r.d, next);
    pthread_mutex_unlock(&r.d->mu);
    r.j->done(r.j, r.j->user); /* may submit the next job */
}

/* Hands failed jobs back once the device has run everything queued (their partial work too). */
static void *fail_main(void *arg)
{
    struct ofl_dev *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        if (!d->fail_head) {
            if (d->stop) break;
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        pthread_mutex_unlock(&d->mu);
        int rc = d->dv->synchronize(d->ctx); /* an error no event carried: the failed job's */
        pthread_mutex_lock(&d->mu);
        struct ofl_devjob *j = d->fail_head;
        d->fail_head = d->fail_tail = NULL;
        pthread_mutex_unlock(&d->mu);
        for (struct ofl_devjob *next; j; j = next) {
            next = j->next_;
            job_fail(j, rc, "the accelerator"); /* (it has failed already: its first error stays) */
            j->t_h2d0 = j->t_h2d1 = j->t_k0 = j->t_k1 = j->t_d2h0 = j->t_d2h1 = mw_now_ns();
            j->done(j, j->user);
        }
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

void ofl_dev_submit(struct ofl_dev *d, struct ofl_devjob *j)
{
    j->t_queued = mw_now_ns();
    j->result = 0;
    j->msg[0] = 0;
    j->h2d_bytes = j->d2h_bytes = 0;
    pthread_mutex_lock(&d->mu);
    if (d->wait_head || d->next_k - d->done_k == DEV_DEPTH) push(&d->wait_head, &d->wait_tail, j);
    else start_locked(d, j);
    pthread_mutex_unlock(&d->mu);
}

/* ------------------------------------------------------------------ open and close */

int ofl_dev_pin(struct ofl_dev *d, void *ptr, uint64_t bytes)
{
    if (!d->dv->host_register || !ptr || !bytes) return 0;
    if (d->npinned == d->cap_pinned) {
        int cap = d->cap_pinned ? 2 * d->cap_pinned : 16;
        void **p = realloc(d->pinned, (size_t)cap * sizeof *p);
        if (!p) return mw_error_set(-ENOMEM, "offload: out of memory for the accelerator's pinned buffers");
        d->pinned = p;
        d->cap_pinned = cap;
    }
    int rc = d->dv->host_register(d->ctx, ptr, bytes);
    if (rc) return rc;
    d->pinned[d->npinned++] = ptr;
    return 0;
}

void ofl_dev_free(struct ofl_dev *d)
{
    if (!d) return;
    if (d->thread_up) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thr, NULL);
    }
    if (d->ctx) {
        /* Every job has finished (the engine waits for its steps), so nothing should be left. */
        int rc = d->dv->synchronize(d->ctx);
        if (rc) mw_log(MW_LOG_WARN, "offload: closing the accelerator: %s", mw_error_msg());
        for (int i = 0; i < d->npinned; i++) d->dv->host_unregister(d->ctx, d->pinned[i]);
        for (int s = 0; s < DEV_DEPTH; s++)
            for (int k = 0; k < EV_N; k++)
                if (d->ev[s][k]) d->dv->event_free(d->ctx, d->ev[s][k]);
        if (d->have_arena) d->dv->free(d->ctx, &d->arena);
        d->dv->close(d->ctx);
    }
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d->pinned);
    free(d);
}

int ofl_dev_init(struct ofl_dev **out, const char *name, struct mw_tier *dev_tier, uint64_t slot_bytes,
                 const struct mw_offload_config *c, struct mw_trace *tr)
{
    *out = NULL;
    const char *env = getenv("MEMWALL_DEVICE"); /* the choice of a run that does not name one (docs/gpu.md) */
    if (!name && env && *env) name = env;
    const struct ofl_device_iface *dv = ofl_device_find(name);
    if (!dv && name == env) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mw_error_msg());
        return mw_error_set(-EINVAL, "MEMWALL_DEVICE=%s: %s", env, msg);
    }
    if (!dv) return -EINVAL;
    struct ofl_dev *d = calloc(1, sizeof *d);
    if (!d) return mw_error_set(-ENOMEM, "offload: out of memory for the accelerator");
    d->dv = dv;
    d->cfg = c;
    d->slot_bytes = MW_ALIGN_UP(slot_bytes, (uint64_t)MW_PAGE_ALIGN);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    int rc = dv->open(&d->ctx, dev_tier, tr);
    if (!rc) rc = dv->alloc(d->ctx, 2 * d->slot_bytes, MW_KIND_STAGING, "accelerator arena", &d->arena);
    d->have_arena = d->ctx && !rc;
    for (int s = 0; s < DEV_DEPTH && !rc; s++)
        for (int k = 0; k < EV_N && !rc; k++) rc = dv->event_new(d->ctx, &d->ev[s][k]);
    if (!rc && pthread_create(&d->thr, NULL, fail_main, d))
        rc = mw_error_set(-EAGAIN, "offload: cannot start the accelerator's failure thread");
    d->thread_up = !rc;
    if (rc) {
        char msg[800];
        snprintf(msg, sizeof msg, "%s", mw_error_msg());
        ofl_dev_free(d);
        return mw_error_set(rc, "%s", msg);
    }
    *out = d;
    return 0;
}
