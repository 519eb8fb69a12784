/*
 * pipeline.c — the update pipeline: read -> update -> write-back -> working-copy refresh.
 *
 * Why this shape: on NVMe the step is I/O-bound, so the disk must never wait for the CPU and
 * the CPU should wait for the disk as little as possible. Three threads cooperate:
 *   - the pipeline thread (this file's pipe_main) admits READY subgroups into free staging
 *     buffers and submits their reads, and performs the write-back of UPDATED ones (DRAM
 *     copies, working-copy refresh, NVMe write submission);
 *   - the CPU update thread runs the optimizer kernel (OpenMP inside) on one subgroup at a time;
 *   - the store's completion thread calls back when a read or write finishes; a finished read
 *     makes the subgroup LOADED and the policy (policy.c) sends it to the CPU queue or to the
 *     accelerator right there (in DRAM mode, that happens when it becomes READY).
 * With buffer_count >= 3, the read of subgroup i+1, the update of i and the write of i-1 are
 * in flight together. Each subgroup moves through the states of enum ofl_sg_state under the
 * engine mutex; the heavy work (kernels, memcpy, I/O submission) runs with the mutex released.
 *
 * Atomic steps: when any optimizer state is on NVMe, every subgroup has two slots and step
 * t+1 reads slot t%2 and writes slot (t+1)%2. The step commits (the committed counter moves)
 * only after every write of the step completed; a failed or torn write leaves the committed
 * slot untouched, so the previous step's state stays readable (docs/offload.md).
 */
#include "offload/internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static double secs(uint64_t ns) { return (double)ns * 1e-9; }

/* ------------------------------------------------------------------ views of a subgroup */

void ofl_view_home(struct mw_offload *e, uint32_t sg, int slot, struct mw_optim_slice *s)
{
    const struct mw_offload_subgroup *g = &e->sgs[sg];
    memset(s, 0, sizeof *s);
    s->n = g->n;
    s->offset = g->first;
    for (int r = 0; r < OFL_NREGIONS; r++)
        if (e->home[r][slot].ptr)
            ofl_slice_set(s, (enum ofl_region)r,
                          (char *)e->home[r][slot].ptr + ofl_region_offset(&e->cfg, (enum ofl_region)r, g->first));
}

void ofl_view_staging(struct mw_offload *e, uint32_t sg, int b, struct mw_optim_slice *s)
{
    const struct mw_offload_subgroup *g = &e->sgs[sg];
    struct ofl_layout L;
    ofl_layout_make(&e->cfg, g->n, &L);
    char *base = e->staging[b].ptr;
    memset(s, 0, sizeof *s);
    s->n = g->n;
    s->offset = g->first;
    for (int r = 0; r < OFL_NREGIONS; r++) /* an empty scale region stays NULL */
        if (L.len[r] || ofl_regions[r].elem != OFL_ELEM_SCALE) ofl_slice_set(s, (enum ofl_region)r, base + L.off[r]);
}

const float *ofl_grads_of(struct mw_offload *e, uint32_t sg)
{
    const float *g = e->grads.ptr ? (const float *)e->grads.ptr : e->cfg.ext_grads;
    return g + e->sgs[sg].first;
}

void *ofl_weights_of(struct mw_offload *e, uint32_t sg)
{
    char *w = e->cfg.ext_weights ? (char *)e->cfg.ext_weights : (char *)e->weights.ptr;
    return w + e->sgs[sg].first * ofl_wbytes(e->cfg.weights);
}

static void *region_ptr(const struct mw_optim_slice *s, int r) { return ofl_slice_region(s, (enum ofl_region)r); }

/* The byte range of a staging buffer that is the subgroup's NVMe object. */
void ofl_nvme_span(struct mw_offload *e, uint32_t sg, uint64_t *off, uint64_t *len)
{
    struct ofl_layout L;
    ofl_layout_make(&e->cfg, e->sgs[sg].n, &L);
    int master_nv = e->cfg.place.tier[MW_OFFLOAD_MASTER] == MW_TIER_NVME;
    int mom_nv = e->cfg.place.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME;
    *off = master_nv ? 0 : L.off[OFL_R_M];
    *len = (mom_nv ? L.total : MW_ALIGN_UP(L.len[OFL_R_MASTER], OFL_PAD)) - *off;
}

/* DRAM-resident regions between a staging buffer and home slot `slot` (to_home: direction). */
static void dram_copy(struct mw_offload *e, uint32_t sg, int b, int slot, int to_home)
{
    struct mw_optim_slice h, s;
    ofl_view_home(e, sg, slot, &h);
    ofl_view_staging(e, sg, b, &s);
    for (int r = 0; r < OFL_NREGIONS; r++) {
        void *hp = region_ptr(&h, r), *sp = region_ptr(&s, r);
        uint64_t n = ofl_region_bytes(&e->cfg, (enum ofl_region)r, e->sgs[sg].n);
        if (!hp || !sp || !n) continue;
        if (to_home) memcpy(hp, sp, n);
        else memcpy(sp, hp, n);
    }
}

int ofl_slot_load(struct mw_offload *e, uint32_t sg, int slot)
{
    dram_copy(e, sg, 0, slot, 0);
    if (!e->store) return 0;
    uint64_t off, len;
    ofl_nvme_span(e, sg, &off, &len);
    int rc = mw_store_read(e->store, e->obj[2 * sg + slot], 0, len, (char *)e->staging[0].ptr + off);
    if (!rc) e->stats.nvme_read_bytes += len;
    return rc;
}

int ofl_slot_store(struct mw_offload *e, uint32_t sg, int slot)
{
    dram_copy(e, sg, 0, slot, 1);
    if (!e->store) return 0;
    uint64_t off, len;
    ofl_nvme_span(e, sg, &off, &len);
    int rc = mw_store_write(e->store, e->obj[2 * sg + slot], 0, len, (char *)e->staging[0].ptr + off);
    if (!rc) e->stats.nvme_write_bytes += len;
    return rc;
}

/* ------------------------------------------------------------------ completions */

static void dispatch_locked(struct mw_offload *e, uint32_t sg);

static void fail_locked(struct mw_offload *e, int err, const char *msg)
{
    if (!e->failed) {
        e->failed = 1;
        e->err = err;
        snprintf(e->errmsg, sizeof e->errmsg, "%s", msg);
    }
}

/* A subgroup leaves the step (done or aborted): give back its buffer. */
static void finish_locked(struct mw_offload *e, uint32_t sg, int ok)
{
    struct ofl_sg *s = &e->st[sg];
    if (s->buf >= 0) { e->free_bufs[e->nfree++] = s->buf; s->buf = -1; }
    s->state = ok ? OFL_SG_DONE : OFL_SG_IDLE;
    e->n_done++;
    if (ok) e->t_last_done = mw_now_ns();
    pthread_cond_broadcast(&e->cv_done);
    pthread_cond_signal(&e->cv_pipe);
}

/* What an NVMe object of subgroup sg holds, for messages. */
static const char *obj_what(const struct mw_offload *e, uint32_t sg, const struct mw_store_io *io)
{
    if (e->gobj && io->obj == e->gobj[sg]) return "gradients";
    int master_nv = e->cfg.place.tier[MW_OFFLOAD_MASTER] == MW_TIER_NVME;
    int mom_nv = e->cfg.place.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME;
    return master_nv && mom_nv ? "master weights and Adam moments" : master_nv ? "master weights" : "Adam moments";
}

static void io_done(struct mw_store_io *io, void *user)
{
    struct ofl_sg *s = user;
    struct mw_offload *e = s->e;
    uint32_t sg = (uint32_t)(s - e->st);
    uint64_t now = mw_now_ns();
    int is_read = io->op == MW_AIO_READ;
    int rc = io->result;
    char msg[800];
    if (s->io_err) {
        rc = -EIO;
        snprintf(msg, sizeof msg, "offload: injected write failure on subgroup %u (torn write: %llu bytes written)",
                 sg, (unsigned long long)(io->result ? 0 : io->len));
    } else if (rc) {
        snprintf(msg, sizeof msg, "offload: %s of subgroup %u's %s failed: %s", is_read ? "read" : "write", sg,
                 obj_what(e, sg, io), io->errmsg[0] ? io->errmsg : mw_strerror(rc));
    }
    struct mw_trace_arg a[3] = {{"subgroup", sg}, {"bytes", (int64_t)io->len}, {"result", rc}};
    mw_trace_span(e->tr, "offload", is_read ? "read" : "write", s->t_loaded, now, a, 3);
    pthread_mutex_lock(&e->mu);
    ofl_cost_io_end(&e->cost, !is_read, rc ? 0 : io->len, now);
    if (is_read) {
        /* An admission may read two objects (state, gradients): it moves on when both are in. */
        e->stats.nvme_read_bytes += rc ? 0 : io->len;
        if (rc && !s->read_rc) {
            s->read_rc = rc;
            snprintf(s->read_msg, sizeof s->read_msg, "%s", msg);
        }
        if (--s->reads_left > 0) {
            pthread_mutex_unlock(&e->mu);
            return;
        }
        rc = s->read_rc;
        if (rc) snprintf(msg, sizeof msg, "%s", s->read_msg);
    }
    if (is_read && s->state == OFL_SG_PREREADING) { /* a read between steps */
        e->n_prereading--;
        s->state = OFL_SG_PRELOADED; /* a failure (s->read_rc) fails the step that uses it */
        e->stats.prereads++;
        pthread_cond_broadcast(&e->cv_done);
        pthread_cond_signal(&e->cv_pipe);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (is_read) e->n_reading--;
    else e->n_writing--;
    if (rc) {
        fail_locked(e, rc, msg);
        finish_locked(e, sg, 0);
    } else if (is_read) {
        if (e->failed) finish_locked(e, sg, 0);
        else dispatch_locked(e, sg);
    } else {
        e->stats.nvme_write_bytes += io->len;
        finish_locked(e, sg, 1);
    }
    pthread_mutex_unlock(&e->mu);
}

/* The update of one subgroup and where it ran (docs/trace-conventions.md: offload "update" and
 * a "decision" span over the same interval, with the corrected model's predictions for both
 * places and the measured time of the side it ran on: the CPU update, or the device job's copies
 * and kernel without its waits in the device's queues). */
static void trace_update(struct mw_offload *e, uint32_t sg, int on_dev, uint64_t t0, uint64_t t1, uint64_t meas_ns)
{
    if (!e->tr) return;
    const struct ofl_sg *s = &e->st[sg];
    struct mw_trace_arg u[1] = {{"subgroup", sg}};
    mw_trace_span(e->tr, "offload", "update", t0, t1, u, 1);
    /* predictions in ns, clamped (no device: +inf seconds) so the cast is defined */
    int64_t cpu_ns = !(s->pred_cpu_s > 0) ? 0 : s->pred_cpu_s >= 9e9 ? (int64_t)9e18 : (int64_t)(s->pred_cpu_s * 1e9);
    int64_t dev_ns = !(s->pred_dev_s > 0) ? 0 : s->pred_dev_s >= 9e9 ? (int64_t)9e18 : (int64_t)(s->pred_dev_s * 1e9);
    struct mw_trace_arg d[4] = {{"subgroup", sg}, {"predicted_ns", on_dev ? dev_ns : cpu_ns},
                                {"measured_ns", meas_ns < (uint64_t)INT64_MAX ? (int64_t)meas_ns : INT64_MAX},
                                {"alt_predicted_ns", on_dev ? cpu_ns : dev_ns}};
    mw_trace_span(e->tr, "decision", on_dev ? "device" : "cpu", t0, t1, d, 4);
}

static void dev_done(struct ofl_devjob *j, void *user)
{
    struct mw_offload *e = user;
    struct ofl_sg *s = &e->st[j->sg];
    /* the job's own time: its copies and kernel, not its waits in the device's queues */
    uint64_t in = j->t_h2d1 - j->t_h2d0, k = j->t_k1 - j->t_k0, out = j->t_d2h1 - j->t_d2h0;
    pthread_mutex_lock(&e->mu);
    if (!j->result) {
        if (!e->dev_t0 || j->t_h2d0 < e->dev_t0) e->dev_t0 = j->t_h2d0;
        if (j->t_d2h1 > e->dev_t1) e->dev_t1 = j->t_d2h1;
        double n = (double)e->sgs[j->sg].n;
        s->pred_dev_s = ofl_cost_observe(&e->cost, OFL_COST_H2D, s->ctx, (double)j->h2d_bytes, secs(in)) +
                        ofl_cost_observe(&e->cost, OFL_COST_DEV, s->ctx, n, secs(k)) +
                        ofl_cost_observe(&e->cost, OFL_COST_D2H, s->ctx, (double)j->d2h_bytes, secs(out));
    }
    trace_update(e, j->sg, 1, j->t_h2d0, j->t_d2h1, in + k + out);
    e->stats.h2d_bytes += j->h2d_bytes;
    e->stats.d2h_bytes += j->d2h_bytes;
    e->stats.dev_updates++;
    e->stats.predicted_s += s->pred_dev_s;
    e->stats.measured_s += secs(in + k + out);
    if (j->result) {
        char msg[560];
        snprintf(msg, sizeof msg, "offload: subgroup %u: %s", j->sg, j->msg);
        fail_locked(e, j->result, msg);
        finish_locked(e, j->sg, 0);
    } else {
        s->state = OFL_SG_UPDATED;
        e->updq[e->upd_tail++ % e->nsg] = j->sg;
        pthread_cond_signal(&e->cv_pipe);
    }
    pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------------------ the stages */

static void current_view(struct mw_offload *e, uint32_t sg, struct mw_optim_slice *s)
{
    if (e->txn) ofl_view_staging(e, sg, e->st[sg].buf, s);
    else ofl_view_home(e, sg, 0, s);
    s->grad = ofl_grads_of(e, sg);
    s->weights_out = e->cfg.weights != MW_OFFLOAD_W_FP32 ? ofl_weights_of(e, sg) : NULL;
}

static struct mw_adamw_hp step_hp(struct mw_offload *e)
{
    struct mw_adamw_hp h = mw_adamw_hp_default();
    h.lr = e->hp.lr;
    h.beta1 = e->hp.beta1;
    h.beta2 = e->hp.beta2;
    h.eps = e->hp.eps;
    h.weight_decay = e->hp.weight_decay;
    h.grad_scale = e->hp.grad_scale;
    h.step = (int64_t)e->committed + 1;
    return h;
}

/* Whether (fused checksums, below) the update of this engine takes the checksums of its subgroups' I/O. */
static int fuse_possible(const struct mw_offload *e)
{
    return e->bufcrc && e->txn && !e->cfg.use_device && e->fmt.moments != MW_OPTIM_Q8;
}

/* Pipe thread, mutex released: start reading subgroup sg into staging buffer b. */
static void stage_read(struct mw_offload *e, uint32_t sg)
{
    struct ofl_sg *s = &e->st[sg];
    int cur = (int)(e->committed % 2);
    s->t_loaded = mw_now_ns();
    s->crcs = 0;
    s->read_rc = 0;
    s->read_msg[0] = 0;
    int gread = e->gobj && !e->grads_resident && s->state != OFL_SG_PREREADING;
    s->reads_left = gread ? 2 : 1;
    if (gread) { /* streaming: the gradients come back from their object into the caller's array */
        ofl_obj_io(&s->gio, e->gobj[sg], MW_AIO_READ, MW_ALIGN_UP(4 * e->sgs[sg].n, OFL_PAD),
                   (void *)(e->cfg.ext_grads + e->sgs[sg].first));
        s->gio.cb = io_done;
        s->gio.user = s;
        s->gio.flags = MW_AIO_URGENT;
        int rc = mw_store_submit(e->store, &s->gio);
        if (rc) {
            s->gio.result = rc;
            snprintf(s->gio.errmsg, sizeof s->gio.errmsg, "%s", mw_error_msg());
            io_done(&s->gio, s);
        }
    }
    dram_copy(e, sg, s->buf, cur, 0);
    uint64_t off, len;
    ofl_nvme_span(e, sg, &off, &len);
    memset(&s->io, 0, sizeof s->io);
    s->io.obj = e->obj[2 * sg + cur];
    s->io.op = MW_AIO_READ;
    s->io.len = len;
    s->io.buf = (char *)e->staging[s->buf].ptr + off;
    s->io.cb = io_done;
    s->io.user = s;
    /* Reads go ahead of queued write-backs: the update (and the forward pass behind it) waits
     * for a read, nobody waits for a write until the commit. */
    s->io.flags = MW_AIO_URGENT;
    /* The update checks the read chunk by chunk while it has the bytes in cache (fuse_begin). */
    s->verify_later = fuse_possible(e) && s->buf >= 0;
    if (s->verify_later) s->io.flags |= MW_STORE_VERIFY_LATER;
    s->io_err = 0;
    int rc = mw_store_submit(e->store, &s->io);
    if (rc) {
        s->io.result = rc;
        snprintf(s->io.errmsg, sizeof s->io.errmsg, "%s", mw_error_msg());
        io_done(&s->io, s);
    }
}

/* e->mu held: sg is LOADED (in its staging buffer, or at home in DRAM): the policy decides,
 * and it goes to the CPU queue or to the device. Runs on whichever thread made it LOADED (the
 * store's completion thread, or the thread that made it READY), so no hand-off through the
 * pipeline thread delays the next update. */
static void dispatch_locked(struct mw_offload *e, uint32_t sg)
{
    struct ofl_sg *s = &e->st[sg];
    s->state = OFL_SG_LOADED;
    int on_dev = ofl_policy_decide(e, sg);
    s->on_dev = on_dev;
    if (!on_dev) {
        e->cpuq[e->cpu_tail++ % e->nsg] = sg;
        pthread_cond_signal(&e->cv_cpu);
        return;
    }
    struct ofl_devjob *j = &s->job;
    memset(j, 0, sizeof *j);
    j->sg = sg;
    current_view(e, sg, &j->host);
    j->fmt = &e->fmt;
    j->hp = step_hp(e);
    j->runs = e->runs + e->sg_run[sg];
    j->nruns = e->sg_run[sg + 1] - e->sg_run[sg];
    j->done = dev_done;
    j->user = e;
    ofl_dev_submit(e->dev, j); /* lock order: e->mu, then the device's (never the reverse) */
}

/* cfg.ext_grads_release: the update of sg has read its gradients; the whole pages of its range
 * go back to the OS (they read as zeros), the bytes of partial pages (shared with a neighbour,
 * which may be being updated now) are zeroed, as is everything if madvise refuses. */
static void release_grads(struct mw_offload *e, uint32_t sg)
{
    const struct mw_offload_subgroup *g = &e->sgs[sg];
    char *a = (char *)(uintptr_t)(e->cfg.ext_grads + g->first), *b = a + 4 * g->n;
    char *pa = (char *)MW_ALIGN_UP((uintptr_t)a, (uintptr_t)OFL_PAD), *pb = (char *)((uintptr_t)b / OFL_PAD * OFL_PAD);
    if (pb > pa && madvise(pa, (size_t)(pb - pa), MADV_DONTNEED) == 0) {
        memset(a, 0, (size_t)(pa - a));
        memset(pb, 0, (size_t)(b - pb));
    } else {
        memset(a, 0, (size_t)(b - a));
    }
}

/* cfg.stream: the update of sg has read the gradients the engine read back into the caller's
 * array; its pages (whole: the caller's array is whole pages, the subgroups page-aligned) go back
 * to the OS the moment the update is done with them, zeroed if madvise refuses. */
static void stream_release_grads(struct mw_offload *e, uint32_t sg)
{
    const struct mw_offload_subgroup *g = &e->sgs[sg];
    char *a = (char *)(uintptr_t)(e->cfg.ext_grads + g->first);
    size_t len = (size_t)MW_ALIGN_UP(4 * g->n, OFL_PAD);
    /* cfg.grads_dram: the pages stay for the next step (its plan counts them), zeroed here: a page
     * given back comes back zeroed by the kernel at its next fault, which on the 2-vCPU guest cost a
     * fifth of the process's CPU (perf: clear_page_erms under do_huge_pmd_wp_page, the backward's
     * first add into each gradient) against a memset at memory speed. */
    if (e->cfg.grads_dram || madvise(a, len, MADV_DONTNEED) != 0) memset(a, 0, 4 * g->n);
}

/* Pipe thread, mutex released: write-back and working-copy refresh of an updated subgroup. */
static void stage_writeback(struct mw_offload *e, uint32_t sg, int hand)
{
    struct ofl_sg *s = &e->st[sg];
    const struct mw_offload_subgroup *g = &e->sgs[sg];
    struct mw_optim_slice v;
    current_view(e, sg, &v);
    uint64_t t0 = mw_now_ns();
    if (e->cfg.stream) stream_release_grads(e, sg);
    else if (e->cfg.ext_grads_release) release_grads(e, sg);
    /* (streamed: only the pages a handoff asked for are there to refresh) */
    if (e->cfg.weights == MW_OFFLOAD_W_FP32 && !e->master_alias && (e->cfg.stream ? hand : !s->fresh)) /* else done */
        memcpy(ofl_weights_of(e, sg), v.master, 4 * g->n);
    if (!e->txn) {
        uint64_t t1 = mw_now_ns();
        struct mw_trace_arg a[1] = {{"subgroup", sg}};
        mw_trace_span(e->tr, "offload", "refresh", t0, t1, a, 1);
        pthread_mutex_lock(&e->mu);
        if (hand) s->handed = 1, s->hand_busy = 0;
        finish_locked(e, sg, 1);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    int next = (int)((e->committed + 1) % 2);
    dram_copy(e, sg, s->buf, next, 1);
    uint64_t t1 = mw_now_ns();
    struct mw_trace_arg a[1] = {{"subgroup", sg}};
    mw_trace_span(e->tr, "offload", "refresh", t0, t1, a, 1);
    uint64_t off, len;
    ofl_nvme_span(e, sg, &off, &len);
    memset(&s->io, 0, sizeof s->io);
    s->io.obj = e->obj[2 * sg + next];
    s->io.op = MW_AIO_WRITE;
    s->io.len = len;
    s->io.buf = (char *)e->staging[s->buf].ptr + off;
    s->io.crcs = s->crcs ? e->bufcrc + (size_t)s->buf * e->bufcrc_n : NULL;
    s->io.cb = io_done;
    s->io.user = s;
    s->io_err = 0;
    s->t_loaded = t1;
    pthread_mutex_lock(&e->mu);
    int inject = e->writes_until_fail && --e->writes_until_fail == 0;
    e->n_writing++;
    ofl_cost_io_begin(&e->cost, 1, mw_now_ns());
    s->fresh = 1; /* a forward pass over these weights need not wait for their write */
    if (hand) s->handed = 1, s->hand_busy = 0;
    pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
    if (inject) { /* torn write: the first half (whole checksum blocks) lands, then -EIO */
        s->io_err = 1;
        s->io.len = (len / 2) / (64u << 10) * (64u << 10);
        if (!s->io.len) { io_done(&s->io, s); return; }
    }
    int rc = mw_store_submit(e->store, &s->io);
    if (rc) {
        s->io.result = rc;
        snprintf(s->io.errmsg, sizeof s->io.errmsg, "%s", mw_error_msg());
        io_done(&s->io, s);
    }
}

/* ------------------------------------------------------------------ threads */

/* The pipeline thread. Priorities: write-backs first (they free staging buffers), then
 * admission of READY subgroups into free buffers (NVMe reads). */
static void *pipe_main(void *arg)
{
    struct mw_offload *e = arg;
    mw_trace_thread_name(e->tr, "offload-pipeline");
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        if (e->upd_head != e->upd_tail) {
            uint32_t sg = e->updq[e->upd_head++ % e->nsg];
            if (e->failed) { finish_locked(e, sg, 0); continue; }
            struct ofl_sg *s = &e->st[sg];
            int hand = s->handoff && !s->handed; /* a device update's, or one asked for after the kernel */
            s->wb = 1;
            s->hand_busy = hand;
            pthread_mutex_unlock(&e->mu);
            stage_writeback(e, sg, hand);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        if (e->ready_head != e->ready_tail && (e->nfree > 0 || e->failed)) {
            uint32_t sg = e->readyq[e->ready_head++ % e->nsg];
            struct ofl_sg *s = &e->st[sg];
            if (e->failed) { finish_locked(e, sg, 0); continue; }
            s->buf = e->free_bufs[--e->nfree];
            s->state = OFL_SG_READING;
            e->n_reading++;
            for (int r = e->gobj && !e->grads_resident ? 2 : 1; r > 0; r--) ofl_cost_io_begin(&e->cost, 0, mw_now_ns());
            mw_trace_counter(e->tr, "offload staging buffers in use", mw_now_ns(), e->nbuf - e->nfree);
            pthread_mutex_unlock(&e->mu);
            stage_read(e, sg);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        /* Between steps, the next step's first subgroups into the free buffers (no gradients are
         * read: streaming pre-reads only with cfg.grads_dram, the gradients in DRAM). */
        if (e->pre_on && !e->in_flight && !e->n_started && !e->failed && e->nfree > 0) {
            while (e->pre_next < e->nsg && e->st[e->pre_next].state != OFL_SG_IDLE) e->pre_next++;
            if (e->pre_next < e->nsg) {
                uint32_t sg = e->pre_next++;
                struct ofl_sg *s = &e->st[sg];
                s->buf = e->free_bufs[--e->nfree];
                s->state = OFL_SG_PREREADING;
                e->n_prereading++;
                ofl_cost_io_begin(&e->cost, 0, mw_now_ns());
                pthread_mutex_unlock(&e->mu);
                stage_read(e, sg);
                pthread_mutex_lock(&e->mu);
                continue;
            }
        }
        /* Every subgroup of the step in flight is written: its record can start now (unless the
         * caller holds it: mw_offload_journal_allow). */
        if (e->jon && e->in_flight && e->jstate == 0 && e->jstep < e->committed + 1 && e->committed < e->jallow && !e->failed &&
            e->n_started == e->nsg && e->n_done == e->n_started && !e->n_reading && !e->n_writing &&
            e->upd_head == e->upd_tail) {
            e->jstep = e->committed + 1;
            e->jstate = 1;
        }
        if (e->jstate == 1) { /* durable, then recorded, while the caller computes */
            ofl_journal_record_locked(e);
            continue;
        }
        pthread_cond_wait(&e->cv_pipe, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Fused checksums. The update runs in chunks of FUSE_CHUNK elements. Before each chunk, the
 * checksum blocks of the slot object that the chunk will touch are checked (a read submitted
 * with MW_STORE_VERIFY_LATER); after it, the crc32c of every block the chunk finished is taken
 * for the write-back while its bytes are still in cache, and the working copy (fp32) is
 * refreshed the same way. Without this the store checked the 48 MiB read and summed the 48 MiB
 * written of a GPT-2 124M subgroup in two more passes from DRAM, beside the kernel's own (the
 * largest part of the engine's CPU work on a 2-vCPU machine, on the cores and the memory bus the
 * forward and backward passes use). Blocks that no chunk has wholly (one straddling two
 * regions, the padding, the tail) are checked before the first chunk and summed after the
 * last. The object's bytes are the staging buffer's NVMe span; a block belongs to region r
 * when its bytes are all inside r's unpadded bytes. */
#define FUSE_CHUNK ((uint64_t)1 << 18) /* elements: 1 MiB of fp32 master, ~5 MiB touched */

struct fuse {
    const char *obj;                 /* the object's bytes (staging + span offset) */
    uint64_t len, cb, nb;            /* object bytes, checksum block, blocks */
    uint32_t *crc;                   /* [nb] */
    struct mw_store *st;
    struct mw_store_io *rd;          /* the read to check (MW_STORE_VERIFY_LATER), or NULL */
    int nr;
    int reg[OFL_NREGIONS];           /* regions in the span, written by the kernel */
    uint64_t rs[OFL_NREGIONS];       /* region start in the object */
    uint64_t first[OFL_NREGIONS], end[OFL_NREGIONS]; /* blocks wholly inside: [first, end) */
    uint64_t next[OFL_NREGIONS];     /* first block not summed yet */
    uint64_t vnext[OFL_NREGIONS];    /* first block not checked yet */
};

static void fuse_block(struct fuse *f, uint64_t b)
{
    uint64_t bs = b * f->cb, be = MW_MIN(bs + f->cb, f->len);
    f->crc[b] = mw_crc32c(0, f->obj + bs, (size_t)(be - bs));
}

static int fuse_inside(const struct fuse *f, uint64_t b)
{
    for (int i = 0; i < f->nr; i++)
        if (b >= f->first[i] && b < f->end[i]) return 1;
    return 0;
}

/* Sets f up and checks the blocks outside the regions. Returns 1 (fused), 0 (not possible:
 * the caller checks the whole read itself) or a negative error (a checksum mismatch). */
static int fuse_begin(struct mw_offload *e, uint32_t sg, struct fuse *f)
{
    if (!fuse_possible(e) || e->st[sg].buf < 0) return 0;
    uint64_t off, len;
    ofl_nvme_span(e, sg, &off, &len);
    struct ofl_layout L;
    ofl_layout_make(&e->cfg, e->sgs[sg].n, &L);
    memset(f, 0, sizeof *f);
    f->obj = (const char *)e->staging[e->st[sg].buf].ptr + off;
    f->len = len;
    f->cb = e->sto_crc_block;
    f->nb = (len + f->cb - 1) / f->cb;
    if (f->nb > e->bufcrc_n) return 0;
    f->crc = e->bufcrc + (size_t)e->st[sg].buf * e->bufcrc_n;
    f->st = e->store;
    f->rd = e->st[sg].verify_later ? &e->st[sg].io : NULL;
    static const int kernel_regions[] = {OFL_R_MASTER, OFL_R_M, OFL_R_V};
    for (int i = 0; i < 3; i++) {
        int r = kernel_regions[i];
        if (!L.len[r] || L.off[r] < off || L.off[r] + L.len[r] > off + len) continue;
        uint64_t rs = L.off[r] - off;
        f->reg[f->nr] = r;
        f->rs[f->nr] = rs;
        f->first[f->nr] = f->next[f->nr] = f->vnext[f->nr] = (rs + f->cb - 1) / f->cb;
        f->end[f->nr] = MW_MAX((rs + L.len[r]) / f->cb, f->first[f->nr]);
        f->nr++;
    }
    for (uint64_t b = 0; b < f->nb && f->rd; b++)
        if (!fuse_inside(f, b)) {
            int rc = mw_store_io_verify(f->st, f->rd, b * f->cb, MW_MIN((b + 1) * f->cb, f->len));
            if (rc) return rc;
        }
    return 1;
}

/* Elements [lo, hi) are next: check the blocks they touch. */
static int fuse_check(struct mw_offload *e, struct fuse *f, uint64_t hi)
{
    for (int i = 0; i < f->nr && f->rd; i++) {
        uint64_t need = f->rs[i] + ofl_region_bytes(&e->cfg, (enum ofl_region)f->reg[i], hi);
        uint64_t b1 = MW_MIN(f->end[i], (need + f->cb - 1) / f->cb);
        if (f->vnext[i] >= b1) continue;
        int rc = mw_store_io_verify(f->st, f->rd, f->vnext[i] * f->cb, b1 * f->cb);
        if (rc) return rc;
        f->vnext[i] = b1;
    }
    return 0;
}

/* Elements [0, hi) are final: sum the blocks they complete. */
static void fuse_advance(struct mw_offload *e, struct fuse *f, uint64_t hi)
{
    for (int i = 0; i < f->nr; i++) {
        uint64_t done = f->rs[i] + ofl_region_bytes(&e->cfg, (enum ofl_region)f->reg[i], hi);
        while (f->next[i] < f->end[i] && (f->next[i] + 1) * f->cb <= done) fuse_block(f, f->next[i]++);
    }
}

/* Every block not summed by fuse_advance (region ranges are disjoint). */
static void fuse_end(struct fuse *f)
{
    for (uint64_t b = 0; b < f->nb; b++) {
        int summed = 0;
        for (int i = 0; i < f->nr && !summed; i++) summed = b >= f->first[i] && b < f->next[i];
        if (!summed) fuse_block(f, b);
    }
}

/* With e->mu held and cpuq not empty: runs the next CPU update (the mutex is released during
 * the kernel). */
static void cpu_update_one_locked(struct mw_offload *e)
{
    uint32_t sg = e->cpuq[e->cpu_head++ % e->nsg];
    struct ofl_sg *s = &e->st[sg];
    s->state = OFL_SG_UPDATING;
    s->ctx = ofl_policy_ctx(e); /* the context it runs in, now (it may have waited in the queue) */
    s->pred_cpu_s = ofl_cost_predict(&e->cost, OFL_COST_CPU, s->ctx, (double)e->sgs[sg].n);
    struct mw_adamw_hp hp = step_hp(e);
    /* Streaming: a pass waiting for these weights takes them from the kernel (handoff). */
    int hand = e->cfg.stream && s->handoff && !s->handed;
    s->hand_busy = hand;
    pthread_mutex_unlock(&e->mu);
    struct mw_optim_slice v;
    current_view(e, sg, &v);
    struct mw_optim_exec ex = {e->cfg.cpu_threads, MW_SIMD_AUTO, 0};
    const struct ofl_run *runs = e->runs + e->sg_run[sg];
    uint32_t nruns = e->sg_run[sg + 1] - e->sg_run[sg];
    /* The working copy is refreshed here, not behind the previous subgroup's write-back on the
     * pipeline thread: a forward pass waiting for these weights waits for the update alone. */
    int refresh = e->txn && (!e->cfg.stream || hand) && e->cfg.weights == MW_OFFLOAD_W_FP32 && !e->master_alias;
    float *wcopy = refresh ? ofl_weights_of(e, sg) : NULL;
    struct fuse fz;
    uint64_t t0 = mw_now_ns(), n = e->sgs[sg].n, kernel_ns = 0, t1;
    int rc = fuse_begin(e, sg, &fz), fused = rc == 1;
    if (rc == 1) rc = 0;
    else if (!rc && s->verify_later) rc = mw_store_io_verify(e->store, &s->io, 0, s->io.len); /* all of it, first */
    int checked = fused && fz.rd; /* the read's checks taken chunk by chunk */
    s->verify_later = 0;
    if (rc) {
        t1 = mw_now_ns();
    } else if (!fused) {
        rc = ofl_update(&e->fmt, &hp, &v, runs, nruns, &ex);
        t1 = mw_now_ns();
        kernel_ns = t1 - t0;
        trace_update(e, sg, 0, t0, t1, t1 - t0);
        if (!rc && wcopy) {
            memcpy(wcopy, v.master, 4 * n);
            struct mw_trace_arg a[1] = {{"subgroup", sg}};
            mw_trace_span(e->tr, "offload", "refresh", t1, mw_now_ns(), a, 1);
        }
    } else {
        for (uint64_t lo = 0, hi; lo < n && !rc; lo = hi) {
            hi = MW_MIN(n, lo + FUSE_CHUNK);
            if ((rc = fuse_check(e, &fz, hi))) break;
            uint64_t k0 = mw_now_ns();
            rc = ofl_update_range(&e->fmt, &hp, &v, runs, nruns, lo, hi, &ex);
            kernel_ns += mw_now_ns() - k0;
            if (rc) break;
            if (wcopy) memcpy(wcopy + lo, v.master + lo, 4 * (hi - lo));
            fuse_advance(e, &fz, hi);
        }
        if (!rc) fuse_end(&fz);
        t1 = mw_now_ns();
        trace_update(e, sg, 0, t0, t1, t1 - t0); /* the kernel with the checksums and the refresh inside */
        if (!rc && wcopy) {
            struct mw_trace_arg a[1] = {{"subgroup", sg}};
            mw_trace_span(e->tr, "offload", "refresh", t1, t1, a, 1); /* done inside the update */
        }
    }
    refresh = !rc && e->txn && !e->cfg.stream;
    pthread_mutex_lock(&e->mu);
    s->crcs = fused && !rc;
    e->stats.fused_checksums += (uint64_t)s->crcs;
    e->stats.fused_verifies += (uint64_t)checked;
    e->stats.kernel_s += secs(kernel_ns);
    e->stats.cpu_updates++;
    /* The update as the CPU thread spends it (kernel, fused checksums, refresh): what the model
     * predicts and the plan schedules. */
    if (!rc) ofl_cost_observe(&e->cost, OFL_COST_CPU, s->ctx, (double)n, secs(t1 - t0));
    e->stats.predicted_s += s->pred_cpu_s;
    e->stats.measured_s += secs(t1 - t0);
    if (rc) {
        char msg[300];
        snprintf(msg, sizeof msg, "offload: update of subgroup %u failed: %s", sg, mw_error_msg());
        s->hand_busy = 0; /* (finish_locked wakes a cancel waiting for it) */
        fail_locked(e, rc, msg);
        finish_locked(e, sg, 0);
        return;
    }
    s->state = OFL_SG_UPDATED;
    if (refresh) { /* bf16/fp16 working copies were written by the kernel itself */
        s->fresh = 1;
        pthread_cond_broadcast(&e->cv_done);
    }
    if (hand) {
        s->handed = 1;
        s->hand_busy = 0;
        pthread_cond_broadcast(&e->cv_done);
    }
    e->updq[e->upd_tail++ % e->nsg] = sg;
    pthread_cond_signal(&e->cv_pipe);
}

/* Waits (e->mu held) for CPU work; the time counts as I/O wait when subgroups are being read
 * or written, or wait for a staging buffer (i.e. for a write). */
static void cpu_wait_locked(struct mw_offload *e, pthread_cond_t *cv)
{
    /* Waiting counts as I/O wait only while this step still has subgroups to update (upd_tail
     * counts the updated ones; it stays at nsg between steps). Without that guard the wait after
     * the step's last update, with its write-backs still in flight, ran on through the next
     * forward and backward and was booked as I/O wait. */
    int io_bound = e->upd_tail < e->nsg &&
                   (e->n_reading > 0 || e->n_writing > 0 || (e->ready_head != e->ready_tail && e->nfree == 0));
    uint64_t t0 = mw_now_ns();
    pthread_cond_wait(cv, &e->mu);
    if (io_bound) {
        uint64_t t1 = mw_now_ns();
        e->stats.io_wait_s += secs(t1 - t0);
        /* The report's "exposed I/O wait" (docs/trace-conventions.md): the update thread blocked on I/O. */
        mw_trace_span(e->tr, "offload", "wait", t0, t1, NULL, 0);
    }
}

/* The CPU update thread: one subgroup at a time, the kernel's OpenMP team inside.
 * (Running an unarmed step's updates on the caller's thread instead was tried: on this shared
 * 2-core machine it made the DRAM update phase 2-3x slower than the bare kernel, against
 * 1.0-1.1x with this dedicated thread.) */
static void *cpu_main(void *arg)
{
    struct mw_offload *e = arg;
    mw_trace_thread_name(e->tr, "offload-cpu-update");
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->cpu_head == e->cpu_tail) {
            if (e->stop) break;
            cpu_wait_locked(e, &e->cv_cpu);
            continue;
        }
        cpu_update_one_locked(e);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int ofl_pipe_start(struct mw_offload *e)
{
    e->stop = 0;
    if (pthread_create(&e->pipe_thr, NULL, pipe_main, e))
        return mw_error_set(-EAGAIN, "offload: cannot start the pipeline thread");
    if (pthread_create(&e->cpu_thr, NULL, cpu_main, e)) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_broadcast(&e->cv_pipe);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->pipe_thr, NULL);
        return mw_error_set(-EAGAIN, "offload: cannot start the CPU update thread");
    }
    e->threads_up = 1;
    return 0;
}

void ofl_pipe_stop(struct mw_offload *e)
{
    if (!e->threads_up) return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv_pipe);
    pthread_cond_broadcast(&e->cv_cpu);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->pipe_thr, NULL);
    pthread_join(e->cpu_thr, NULL);
    e->threads_up = 0;
}

void ofl_pipe_enqueue_locked(struct mw_offload *e, uint32_t sg)
{
    struct ofl_sg *s = &e->st[sg];
    if (s->state == OFL_SG_PREREADING || s->state == OFL_SG_PRELOADED) { /* read ahead: no admission */
        if (e->n_started == 0) e->step_t0 = mw_now_ns();
        s->t_ready = mw_now_ns();
        e->n_started++;
        if (s->state == OFL_SG_PRELOADED) {
            if (s->read_rc) { /* the read failed: as it would have in the step */
                fail_locked(e, s->read_rc, s->read_msg);
                finish_locked(e, sg, 0);
            } else dispatch_locked(e, sg);
            return;
        }
        s->state = OFL_SG_READING; /* its completion dispatches it */
        e->n_prereading--;
        e->n_reading++;
        return;
    }
    if (s->state != OFL_SG_IDLE) return;
    if (e->n_started == 0) e->step_t0 = mw_now_ns();
    s->state = OFL_SG_READY;
    s->t_ready = mw_now_ns();
    e->n_started++;
    if (!e->txn) { /* the state is at home: nothing to read */
        dispatch_locked(e, sg);
        return;
    }
    e->readyq[e->ready_tail++ % e->nsg] = sg;
    pthread_cond_signal(&e->cv_pipe);
    pthread_cond_signal(&e->cv_cpu); /* so an idle CPU thread re-evaluates whether it waits for I/O */
}

void ofl_preread_allow(struct mw_offload *e)
{
    /* (streaming: only when every step's gradients stay in DRAM; a pre-read reads no gradients) */
    if (!e->txn || !e->store || ((e->gobj || e->cfg.stream) && !e->cfg.grads_dram) || e->cfg.staging_release ||
        !e->cfg.preread || !e->threads_up)
        return;
    pthread_mutex_lock(&e->mu);
    e->pre_on = 1;
    e->pre_next = 0;
    pthread_cond_signal(&e->cv_pipe);
    pthread_mutex_unlock(&e->mu);
}

void ofl_preread_drop(struct mw_offload *e)
{
    pthread_mutex_lock(&e->mu);
    if (e->pre_on || e->pre_next) {
        e->pre_on = 0;
        e->pre_next = 0;
        while (e->n_prereading > 0) pthread_cond_wait(&e->cv_done, &e->mu);
        for (uint32_t i = 0; i < e->nsg; i++)
            if (e->st[i].state == OFL_SG_PRELOADED) {
                e->free_bufs[e->nfree++] = e->st[i].buf;
                e->st[i].buf = -1;
                e->st[i].state = OFL_SG_IDLE;
            }
    }
    pthread_mutex_unlock(&e->mu);
}

/* Writes the record of e->jstep with the lock dropped meanwhile (e->mu held on entry and on
 * return); a failure is kept for ofl_journal_settle; waiters on cv_done are woken. */
void ofl_journal_record_locked(struct mw_offload *e)
{
    e->jstate = 2;
    uint64_t step = e->jstep;
    pthread_mutex_unlock(&e->mu);
    int jrc = ofl_journal_write(e, step);
    char msg[480];
    if (jrc) snprintf(msg, sizeof msg, "%s", mw_error_msg());
    pthread_mutex_lock(&e->mu);
    if (jrc && !e->jerr) {
        e->jerr = jrc;
        snprintf(e->jmsg, sizeof e->jmsg, "recording step %llu failed (a resume finds step %llu): %s",
                 (unsigned long long)step, (unsigned long long)step - 1, msg);
    }
    e->jstate = 0;
    pthread_cond_broadcast(&e->cv_done);
}
