/*
 * zero.c — ZeRO stages 0-3 for the trainer (see zero.h for the schedule and why it is here).
 * Buckets are the model's weight units (embeddings, each block, ln_f): the backward pass
 * reports them in reverse order as it finishes them, and each one's collective starts at
 * once, so communication overlaps the rest of the backward pass (mw_comm_progress between
 * units drives it; Open MPI has no progress thread).
 * ZeRO-3 memory is real, not bookkept: the model's weight array is page-aligned, a released
 * unit's pages outside the owned range are returned with madvise(MADV_DONTNEED) and faulted in
 * again (MADV_POPULATE_WRITE, the receive buffer's allocation) just before its all-gather is
 * issued; the resident bytes are measured with mincore() at every gather and release.
 * Gradients under stages 2-3 alike: a bucket's gradients outside the owned range are returned
 * to the OS as soon as its reduce-scatter has completed (pages read back as zeros, which is
 * what the next micro-step needs), so a rank holds its owned gradients plus the buckets not yet
 * reduced; measured with mincore() too.
 */
#include "train/zero.h"
#include "memwall/common.h"
#include "memwall/offload.h"
#include "memwall/plan.h"
#include "memwall/trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const struct mw_unit_source peers_source;

static size_t *cnt_of(struct mw_train_zero *z, int u) { return z->u_counts + (size_t)u * (size_t)z->nshard; }
static size_t *dsp_of(struct mw_train_zero *z, int u) { return z->u_displs + (size_t)u * (size_t)z->nshard; }

uint64_t mw_train_zero_sg_size(uint64_t total, int ranks, uint64_t want)
{
    uint64_t per = (total + 4ull * (uint64_t)ranks - 1) / (4ull * (uint64_t)ranks);
    uint64_t sg = MW_ALIGN_UP(MW_MAX(per, 1), 4096);
    return want && want < sg ? want : sg;
}

int mw_train_zero_init(struct mw_train_zero *z, struct mw_comm *comm, int stage, struct mw_net *m,
                       uint64_t sg_size, struct mw_trace *trace)
{
    memset(z, 0, sizeof *z);
    if (stage < 0 || stage > 3) return mw_error_set(-EINVAL, "ZeRO stage %d: use 0, 1, 2 or 3", stage);
    z->comm = comm;
    z->model = m;
    z->trace = trace;
    z->stage = stage;
    z->world = mw_comm_size(comm, MW_COMM_WORLD);
    z->wrank = mw_comm_rank(comm, MW_COMM_WORLD);
    z->nshard = stage >= 1 ? mw_comm_size(comm, MW_COMM_SHARD) : 1;
    z->srank = stage >= 1 ? mw_comm_rank(comm, MW_COMM_SHARD) : 0;
    z->nrep = stage >= 1 ? mw_comm_size(comm, MW_COMM_REPLICA) : 1;
    z->total = m->sizes.n_params;
    z->sg_size = sg_size;
    int err = mw_zero_shard(z->total, sg_size, z->nshard, z->srank, &z->own);
    if (err) return err;
    if (z->own.n == 0)
        return mw_error_set(-EINVAL, "ZeRO-%d: rank %d would own no parameters: %u subgroups of %llu for %d ranks; "
                            "use a subgroup size (subgroup_size) of %llu or less", stage, z->wrank,
                            mw_zero_subgroups(z->total, sg_size), (unsigned long long)sg_size, z->nshard,
                            (unsigned long long)(z->total / (uint64_t)z->nshard));
    z->n_units = m->n_units;
    if ((err = mw_units_init(&z->units, m, &peers_source, z, 1, "ZeRO-3"))) return err;
    size_t nu = (size_t)z->n_units, ns = (size_t)z->nshard;
    z->u_first = calloc(nu, sizeof *z->u_first);
    z->u_n = calloc(nu, sizeof *z->u_n);
    z->u_counts = calloc(nu * ns, sizeof *z->u_counts);
    z->u_displs = calloc(nu * ns, sizeof *z->u_displs);
    z->u_state = calloc(nu, 1);
    z->u_req = calloc(nu, sizeof *z->u_req);
    if (stage >= 1) {
        z->recv = malloc(z->own.n * sizeof(float));
        if (stage >= 2) z->acc = malloc(z->own.n * sizeof(float));
    }
    if (!z->u_first || !z->u_n || !z->u_counts || !z->u_displs || !z->u_state || !z->u_req ||
        (stage >= 1 && !z->recv) || (stage >= 2 && !z->acc)) {
        mw_train_zero_free(z);
        return mw_error_set(-ENOMEM, "no memory for the ZeRO buffers");
    }
    for (int u = 0; u < z->n_units; u++) {
        mw_net_unit_range(m, u, &z->u_first[u], &z->u_n[u]);
        if ((err = mw_zero_bucket_counts(z->total, sg_size, z->nshard, z->u_first[u], z->u_n[u], cnt_of(z, u),
                                         dsp_of(z, u)))) {
            mw_train_zero_free(z);
            return err;
        }
        z->u_state[u] = 2; /* the weights are whole after init */
    }
    z->page = (size_t)sysconf(_SC_PAGESIZE);
    z->map_bytes = MW_ALIGN_UP(m->sizes.params_bytes, z->page);
    if (stage >= 2) {
        z->mvec = malloc(z->map_bytes / z->page);
        if (!z->mvec) {
            mw_train_zero_free(z);
            return mw_error_set(-ENOMEM, "no memory for the residency vector");
        }
    }
    return 0;
}

void mw_train_zero_free(struct mw_train_zero *z)
{
    mw_units_free(&z->units);
    free(z->u_first);
    free(z->u_n);
    free(z->u_counts);
    free(z->u_displs);
    free(z->u_state);
    free(z->u_req);
    free(z->recv);
    free(z->acc);
    free(z->mvec);
    memset(z, 0, sizeof *z);
}

/* ---------------------------------------------------------------- gradients */

/* The parts of unit u outside this rank's owned range, elements [ea[i], eb[i]): 0, 1 or 2. */
static int outside_owned(const struct mw_train_zero *z, int u, size_t ea[2], size_t eb[2])
{
    size_t a = z->u_first[u], b = a + z->u_n[u], oa = z->own.first, ob = oa + z->own.n;
    int n = 0;
    if (a < MW_MIN(b, oa)) { ea[n] = a; eb[n] = MW_MIN(b, oa); n++; }
    if (MW_MAX(a, ob) < b) { ea[n] = MW_MAX(a, ob); eb[n] = b; n++; }
    return n;
}

/* The whole pages inside elements [a, b) of an fp32 array, as byte offsets; 0 when none. Only
 * these may be returned to the OS: the pages at the ends are shared with other data. */
static int interior(const struct mw_train_zero *z, size_t a, size_t b, size_t *lo, size_t *hi)
{
    *lo = MW_ALIGN_UP(a * 4, z->page);
    *hi = b * 4 / z->page * z->page;
    return *lo < *hi;
}

static int drop_pages(struct mw_train_zero *z, void *arr, size_t lo, size_t hi, const char *what)
{
    if (madvise((char *)arr + lo, hi - lo, MADV_DONTNEED) != 0)
        return mw_error_set(-errno, "ZeRO: releasing %s pages failed: %s", what, strerror(errno));
    z->released_bytes += hi - lo;
    return 0;
}

/* The gradients of unit u outside the owned range become zero: whole pages are returned to the
 * OS (they read back as zeros), the bytes on the pages at the ends are written. */
static int grads_release_unit(struct mw_train_zero *z, int u)
{
    size_t ea[2], eb[2], lo, hi;
    char *g = (char *)z->model->grads;
    int n = outside_owned(z, u, ea, eb), err = 0;
    for (int i = 0; i < n && !err; i++) {
        if (!interior(z, ea[i], eb[i], &lo, &hi)) {
            memset(g + ea[i] * 4, 0, (eb[i] - ea[i]) * 4);
            continue;
        }
        memset(g + ea[i] * 4, 0, lo - ea[i] * 4);
        memset(g + hi, 0, eb[i] * 4 - hi);
        err = drop_pages(z, g, lo, hi, "gradient");
    }
    return err;
}

static uint64_t resident(struct mw_train_zero *z, const void *arr)
{
    if (mincore((void *)arr, z->map_bytes, z->mvec) != 0) return 0;
    size_t pages = z->map_bytes / z->page, res = 0;
    for (size_t i = 0; i < pages; i++) res += z->mvec[i] & 1;
    return (uint64_t)res * z->page;
}

static void sample_grads(struct mw_train_zero *z)
{
    z->grads_resident_now = resident(z, z->model->grads);
    if (z->grads_resident_now > z->grads_resident_peak) z->grads_resident_peak = z->grads_resident_now;
    if (z->trace) mw_trace_counter(z->trace, "zero resident grads", mw_now_ns(), (double)z->grads_resident_now);
}

void mw_train_zero_step_begin(struct mw_train_zero *z)
{
    if (z->stage < 2) {
        mw_net_zero_grad(z->model);
        return;
    }
    for (int u = 0; u < z->n_units; u++) (void)grads_release_unit(z, u); /* madvise of our own pages: cannot fail */
    memset(z->model->grads + z->own.first, 0, z->own.n * sizeof(float));
    sample_grads(z);
}

static int unit_of(const struct mw_train_zero *z, size_t first, size_t n)
{
    for (int u = 0; u < z->n_units; u++)
        if (z->u_first[u] == first && z->u_n[u] == n) return u;
    return -1;
}

void mw_train_zero_backward_begin(struct mw_train_zero *z, int micro, int last)
{
    z->micro = micro;
    z->last = last;
    z->err = 0;
    z->n_reqs = 0;
}

void mw_train_zero_grad_ready(size_t first, size_t n, void *user)
{
    struct mw_train_zero *z = user;
    if (z->err) return;
    int u = unit_of(z, first, n);
    if (u < 0) {
        z->err = mw_error_set(-EINVAL, "ZeRO: gradient range [%zu, +%zu) is not a weight unit", first, n);
        return;
    }
    if (z->n_reqs == MW_ZERO_MAX_REQS) {
        z->err = mw_error_set(-EOVERFLOW, "ZeRO: more than %d buckets in one micro-step", MW_ZERO_MAX_REQS);
        return;
    }
    float *g = z->model->grads + first;
    struct mw_comm_req **req = &z->reqs[z->n_reqs];
    int err = 0;
    if (z->stage == 0) {
        if (!z->last) return; /* accumulate locally; one allreduce per step */
        err = mw_comm_iallreduce(z->comm, MW_COMM_WORLD, g, n, 1, req);
    } else {
        if (z->stage == 1 && !z->last) return;
        const size_t *cnt = cnt_of(z, u), *dsp = dsp_of(z, u);
        float *dst = cnt[z->srank] ? z->recv + (first + dsp[z->srank] - z->own.first) : z->recv;
        err = mw_comm_ireduce_scatter(z->comm, MW_COMM_SHARD, g, dst, cnt, 1, req);
    }
    if (err) { z->err = err; return; }
    z->req_unit[z->n_reqs++] = u;
    if (z->stage < 2) {
        int r = mw_comm_progress(z->comm);
        if (r < 0) z->err = r;
        return;
    }
    sample_grads(z);
    /* Buckets already reduced give their gradient pages back; at most MW_ZERO_GRAD_WINDOW stay
     * in flight (the oldest is waited for), which bounds the gradient memory. */
    int pending = 0;
    for (int i = z->n_reqs - 1; i >= 0 && !z->err; i--) {
        if (!z->reqs[i]) continue;
        int done = 0;
        if (++pending > MW_ZERO_GRAD_WINDOW) {
            err = mw_comm_wait(z->comm, &z->reqs[i]);
            done = 1;
        } else {
            err = mw_comm_test(z->comm, &z->reqs[i], &done);
        }
        if (err) z->err = err;
        else if (done) z->err = grads_release_unit(z, z->req_unit[i]);
    }
}

int mw_train_zero_backward_end(struct mw_train_zero *z)
{
    /* After a failure (a timed-out wait: a rank died) the job must end: waiting for the other
     * buckets would only add one deadline each. */
    if (z->err) return z->err;
    int err = 0;
    if (z->stage >= 2) sample_grads(z);
    for (int i = 0; i < z->n_reqs && !err; i++) {
        int was_pending = z->reqs[i] != NULL;
        err = mw_comm_wait(z->comm, &z->reqs[i]);
        if (!err && was_pending && z->stage >= 2) err = grads_release_unit(z, z->req_unit[i]);
    }
    if (err) return err;
    z->n_reqs = 0;
    float *g = z->model->grads;
    const size_t on = z->own.n;
    float *gown = g + z->own.first;
    if (z->stage == 1 && z->last) {
        memcpy(gown, z->recv, on * sizeof(float));
    } else if (z->stage >= 2) {
        if (z->micro == 0) memcpy(z->acc, z->recv, on * sizeof(float));
        else for (size_t i = 0; i < on; i++) z->acc[i] += z->recv[i];
        /* The rest of the array is zero again (released after its reduce-scatter); the owned
         * range holds the accumulated sum at the last micro-step, zeros before. */
        if (z->last) memcpy(gown, z->acc, on * sizeof(float));
        else memset(gown, 0, on * sizeof(float));
    }
    if (z->stage >= 1 && z->last && z->nrep > 1) {
        struct mw_comm_req *req = NULL;
        if ((err = mw_comm_iallreduce(z->comm, MW_COMM_REPLICA, gown, on, 1, &req))) return err;
        if ((err = mw_comm_wait(z->comm, &req))) return err;
    }
    return 0;
}

int mw_train_zero_local_sumsq(struct mw_train_zero *z, double *out)
{
    const float *g = z->model->grads + z->own.first;
    double sum = 0;
    /* The engine's chunks over the owned range, added in order (non-finite on overflow, as there). */
    for (uint64_t c = 0; c * MW_OFFLOAD_NORM_CHUNK < z->own.n; c++) {
        double s = 0;
        int r = mw_offload_norm_chunk(g, z->own.n, c, z->model->opts.n_threads, &s);
        if (r && r != MW_EOVERFLOW) return r;
        sum += s;
    }
    *out = sum;
    return 0;
}

/* Allgather of one 8-byte value per rank of group g (2 floats: bits are moved, not summed). */
static int gather8(struct mw_train_zero *z, enum mw_comm_group grp, const void *mine, void *all)
{
    int n = mw_comm_size(z->comm, grp), r = mw_comm_rank(z->comm, grp);
    size_t counts[n];
    float *buf = malloc((size_t)n * 8);
    if (!buf) return mw_error_set(-ENOMEM, "no memory");
    for (int i = 0; i < n; i++) counts[i] = 2;
    memcpy(buf + 2 * r, mine, 8);
    struct mw_comm_req *req = NULL;
    int err = mw_comm_iallgather(z->comm, grp, buf + 2 * r, buf, counts, &req);
    if (!err) err = mw_comm_wait(z->comm, &req);
    if (!err) memcpy(all, buf, (size_t)n * 8);
    free(buf);
    return err;
}

int mw_train_zero_sumsq(struct mw_train_zero *z, double local, double *global)
{
    if (z->stage == 0 || z->nshard == 1) { *global = local; return 0; }
    double all[z->nshard];
    int err = gather8(z, MW_COMM_SHARD, &local, all);
    if (err) return err;
    double s = 0;
    for (int i = 0; i < z->nshard; i++) s += all[i];
    *global = s;
    return 0;
}

int mw_train_zero_mean(struct mw_train_zero *z, float *v)
{
    struct mw_comm_req *req = NULL;
    int err = mw_comm_iallreduce(z->comm, MW_COMM_WORLD, v, 1, 1, &req);
    return err ? err : mw_comm_wait(z->comm, &req);
}

int mw_train_zero_max_u64(struct mw_train_zero *z, uint64_t v, uint64_t *max)
{
    uint64_t all[z->world];
    int err = gather8(z, MW_COMM_WORLD, &v, all);
    if (err) return err;
    *max = 0;
    for (int i = 0; i < z->world; i++) *max = MW_MAX(*max, all[i]);
    return 0;
}

int mw_train_zero_sum_u64(struct mw_train_zero *z, uint64_t v, uint64_t *sum)
{
    uint64_t all[z->world];
    int err = gather8(z, MW_COMM_WORLD, &v, all);
    if (err) return err;
    *sum = 0;
    for (int i = 0; i < z->world; i++) *sum += all[i];
    return 0;
}

/* In-place allgather of unit u over SHARD. */
static int unit_gather(struct mw_train_zero *z, int u, struct mw_comm_req **req)
{
    float *base = z->model->params + z->u_first[u];
    return mw_comm_iallgather(z->comm, MW_COMM_SHARD, base + dsp_of(z, u)[z->srank], base, cnt_of(z, u), req);
}

int mw_train_zero_after_step(struct mw_train_zero *z)
{
    if (z->stage != 1 && z->stage != 2) return 0;
    struct mw_comm_req *req[z->n_units];
    int err = 0, n = 0;
    for (int u = 0; u < z->n_units && !err; u++)
        if (!(err = unit_gather(z, u, &req[n]))) n++;
    for (int i = 0; i < n && !err; i++) err = mw_comm_wait(z->comm, &req[i]);
    return err;
}

/* ---------------------------------------------------------------- ZeRO-3 residency */

static void sample_resident(struct mw_train_zero *z)
{
    z->resident_now = resident(z, z->model->params);
    if (z->resident_now > z->resident_peak) z->resident_peak = z->resident_now;
    if (z->trace) mw_trace_counter(z->trace, "zero3 resident weights", mw_now_ns(), (double)z->resident_now);
}

static int gather_issue(struct mw_train_zero *z, int u)
{
    size_t ea[2], eb[2], lo, hi;
    char *p = (char *)z->model->params;
    int n = outside_owned(z, u, ea, eb);
    for (int i = 0; i < n; i++) {
        if (!interior(z, ea[i], eb[i], &lo, &hi)) continue;
        /* The receive buffer's allocation: fault the pages in before the data arrives. */
        if (madvise(p + lo, hi - lo, MADV_POPULATE_WRITE) != 0)
            for (size_t o = lo; o < hi; o += z->page) ((volatile char *)p)[o] = 0;
    }
    int err = unit_gather(z, u, &z->u_req[u]);
    if (err) return err;
    z->u_state[u] = 1;
    return 0;
}

/* The weights of unit u outside the owned range: their whole pages go back to the OS. */
static int unit_release(struct mw_train_zero *z, int u)
{
    size_t ea[2], eb[2], lo, hi;
    int n = outside_owned(z, u, ea, eb), err = 0;
    for (int i = 0; i < n && !err; i++)
        if (interior(z, ea[i], eb[i], &lo, &hi)) err = drop_pages(z, z->model->params, lo, hi, "weight");
    if (err) return err;
    z->u_state[u] = 0;
    return 0;
}

static int unit_wait(struct mw_train_zero *z, int u)
{
    if (z->u_state[u] == 0) {
        int err = gather_issue(z, u);
        if (err) return err;
    }
    if (z->u_state[u] == 1) {
        int err = mw_comm_wait(z->comm, &z->u_req[u]);
        if (err) return err;
        z->u_state[u] = 2;
    }
    return 0;
}

int mw_train_zero_unit_gather(struct mw_train_zero *z, int u)
{
    if (u < 0 || u >= z->n_units) return mw_error_set(-EINVAL, "ZeRO: no weight unit %d", u);
    int err = gather_issue(z, u);
    if (!err) err = mw_comm_wait(z->comm, &z->u_req[u]);
    if (err) return err;
    z->u_state[u] = 2;
    return 0;
}

int mw_train_zero_release_all(struct mw_train_zero *z)
{
    if (z->stage != 3) return 0;
    for (int u = 0; u < z->n_units; u++) {
        if (z->u_state[u] == 1) {
            int err = mw_comm_wait(z->comm, &z->u_req[u]);
            if (err) return err;
        }
        int err = unit_release(z, u);
        if (err) return err;
    }
    z->started = 1;
    sample_resident(z);
    return 0;
}

int mw_train_zero_gather_all(struct mw_train_zero *z)
{
    if (z->stage != 3) return 0;
    for (int u = 0; u < z->n_units; u++)
        if (z->u_state[u] == 0) {
            int err = gather_issue(z, u);
            if (err) return err;
        }
    for (int u = 0; u < z->n_units; u++) {
        int err = unit_wait(z, u);
        if (err) return err;
    }
    return 0;
}

void mw_train_zero_reset_peak(struct mw_train_zero *z)
{
    z->resident_peak = z->resident_now;
    z->grads_resident_peak = z->grads_resident_now;
}

int mw_train_zero_pass_begin(struct mw_train_zero *z, int training, int layer_major)
{
    if (z->stage != 3) return 0;
    mw_units_pass_begin(&z->units, training, layer_major);
    if (!z->started) return mw_train_zero_release_all(z);
    return 0;
}

int mw_train_zero_weights_hook(void *user, int event, int unit, int backward)
{
    struct mw_train_zero *z = user;
    if (z->stage != 3) return 0;
    return mw_units_hook(&z->units, event, unit, backward);
}

/* ---------------------------------------------------------------- the source "peers" (units.h) */

static int peers_issue(void *self, int u, int now)
{
    struct mw_train_zero *z = self;
    (void)now;
    return z->u_state[u] == 0 ? gather_issue(z, u) : 0;
}

static int peers_wait(void *self, int u) { return unit_wait(self, u); }

static int peers_release(void *self, int u, int backward)
{
    struct mw_train_zero *z = self;
    (void)backward;
    sample_resident(z);
    /* A unit the order acquires next stays (batch-major's LM head: the end of the forward pass
     * and the start of backward). */
    int err;
    if (mw_units_at(&z->units, z->units.pos) != u && (err = unit_release(z, u))) return err;
    int r = mw_comm_progress(z->comm);
    return r < 0 ? r : 0;
}

static void peers_acquired(void *self, int u)
{
    (void)u;
    sample_resident(self);
}

static const struct mw_unit_source peers_source = {
    .name = "peers",
    .issue = peers_issue,
    .wait = peers_wait,
    .release = peers_release,
    .acquired = peers_acquired,
};
