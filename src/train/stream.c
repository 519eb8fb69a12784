/*
 * stream.c — weights and gradients streamed from NVMe, unit by unit (see stream.h for why
 * this shape). The schedule of a training pass is forward 0, 1..L, L+1, 0 (the tied LM head)
 * then backward L..1 (layer-major) or 0, L+1, L..1 (batch-major); an evaluation pass is the forward part alone. Fetches look ahead
 * along it by `depth` units but never across an optimizer step (the master changes there).
 */
#include "train/stream.h"
#include "memwall/common.h"
#include "memwall/offload.h"
#include "memwall/trace.h"
#include "train/optimizer_step.h"
#include "train/residency.h"
#include "train/zero.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const struct mw_unit_source nvme_source;

static struct mw_offload *eng(const struct mw_train_stream *s) { return s->opt->eng; }

/* Whether subgroup g is in this rank's engine (its master, moments and gradient objects). */
static int owned(const struct mw_train_stream *s, uint32_t g) { return g >= s->sg0 && g < s->sg_end; }

static void sg_range(const struct mw_train_stream *s, uint32_t sg, uint64_t *first, uint64_t *n)
{
    *first = (uint64_t)sg * s->sg_size;
    *n = MW_MIN(s->sg_size, (uint64_t)s->model->sizes.n_params - *first);
}

static uint64_t sg_bytes(const struct mw_train_stream *s, uint32_t sg)
{
    uint64_t a, n;
    sg_range(s, sg, &a, &n);
    return MW_ALIGN_UP(n * 4, s->page);
}

/* The pages of subgroup sg of a flat fp32 array go back to the OS (they read back as zeros). */
static int drop(struct mw_train_stream *s, float *arr, uint32_t sg, const char *what)
{
    uint64_t a, n;
    sg_range(s, sg, &a, &n);
    if (madvise(arr + a, MW_ALIGN_UP(n * 4, s->page), MADV_DONTNEED) != 0) {
        int e = errno;
        return mw_error_set(-e, "streaming: returning the %s pages of subgroup %u failed: %s", what, sg, strerror(e));
    }
    return 0;
}

static void count_resident(struct mw_train_stream *s, int64_t delta)
{
    s->resident_now = (uint64_t)((int64_t)s->resident_now + delta);
    if (s->resident_now > s->resident_peak) s->resident_peak = s->resident_now;
    if (s->trace) mw_trace_counter(s->trace, "resident weights", mw_now_ns(), (double)s->resident_now);
}

/* ---------------------------------------------------------------- the page pool (stream.h)
 *
 * A slot holds the pages of one whole subgroup (sg_size * 4 bytes). A release moves a subgroup's
 * pages into an empty slot while the next units' fetches need pages (pool_want), a fetch moves a
 * full slot's pages into its range, both by mremap(MREMAP_DONTUNMAP): the page tables move, the
 * range left behind stays mapped and reads back as zeros, as after MADV_DONTNEED. Whatever a
 * fetch's pages held before is overwritten by its read (the whole subgroup). Advice only: without
 * the pool (refused, an old kernel, MEMWALL_STREAM_POOL=0) a release drops the pages and the read
 * faults zeroed ones in, as before. Each moved range may become a mapping of its own, so the pool
 * is off above POOL_MAX_SUBGROUPS subgroups (vm.max_map_count is 65530 by default). */

#define POOL_MAX_SLOTS 64
#define POOL_MAX_SUBGROUPS 8192
#define POOL_ALIGN ((size_t)2 << 20) /* huge pages move as whole page-table entries */

static void pool_off(struct mw_train_stream *s)
{
    if (s->pool_map) (void)munmap(s->pool_map, s->pool_map_bytes); /* pages in full slots go with it */
    free(s->pool_full);
    free(s->pool_empty);
    s->pool = NULL;
    s->pool_map = NULL;
    s->pool_full = s->pool_empty = NULL;
    s->pool_map_bytes = 0;
    s->pool_slots = s->pool_nfull = s->pool_nempty = 0;
}

static void pool_init(struct mw_train_stream *s)
{
    const char *env = getenv("MEMWALL_STREAM_POOL");
    if ((env && !strcmp(env, "0")) || s->nsg < 2 || s->nsg > POOL_MAX_SUBGROUPS) return;
    uint32_t n = MW_MIN((uint32_t)POOL_MAX_SLOTS, s->nsg);
    size_t bytes = (size_t)n * s->sg_size * 4 + POOL_ALIGN;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;
    s->pool_map = p;
    s->pool_map_bytes = bytes;
    s->pool_full = malloc(n * sizeof *s->pool_full);
    s->pool_empty = malloc(n * sizeof *s->pool_empty);
    if (!s->pool_full || !s->pool_empty) {
        pool_off(s);
        return;
    }
    s->pool = (char *)MW_ALIGN_UP((uintptr_t)p, POOL_ALIGN);
    s->pool_slots = n;
    for (uint32_t i = 0; i < n; i++) s->pool_empty[i] = n - 1 - i;
    s->pool_nempty = n;
}

static char *pool_slot(const struct mw_train_stream *s, uint32_t i) { return s->pool + (uint64_t)i * s->sg_size * 4; }

/* Whether subgroup g is whole (the last one may be shorter: it never uses the pool). */
static int pool_fits(const struct mw_train_stream *s, uint32_t g)
{
    return (uint64_t)(g + 1) * s->sg_size <= (uint64_t)s->model->sizes.n_params;
}

/* Whole subgroups of unit u that a fetch would read (not resident, not on their way). */
static int64_t pool_fetches(const struct mw_train_stream *s, int u)
{
    int64_t n = 0;
    for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u]; g++)
        n += s->sg_state[g] == MW_UNIT_RELEASED && owned(s, g) && pool_fits(s, g);
    return n;
}

/* Pages worth keeping at a release: over the next POOL_AHEAD positions of the schedule, the most
 * by which the subgroups their acquires will fetch (each acquire issues the unit `depth` ahead)
 * run ahead of those their releases give back, less what the pool holds. Between equal units
 * that is about one unit's subgroups; before a large one (a tied head after the blocks) the pool
 * fills from the releases before it, never past what the window at its fetch holds anyway. */
#define POOL_AHEAD 12
static uint32_t pool_want(const struct mw_train_stream *s)
{
    if (!s->pool) return 0;
    int d = s->units.depth, pos = s->units.pos;
    int64_t fetch = 0, give = 0, best = 0;
    for (int k = 0; k <= POOL_AHEAD; k++) {
        int u = -1;
        for (int q = k ? pos + k + d : pos; q <= pos + k + d; q++) { /* k = 0: those not issued yet too */
            if ((u = mw_units_ahead(&s->units, q)) < 0) break;
            fetch += pool_fetches(s, u);
        }
        best = MW_MAX(best, fetch - give);
        if (u < 0 || (u = mw_units_ahead(&s->units, pos + k)) < 0) break;
        int v = mw_units_ahead(&s->units, pos + k + 1); /* a subgroup it shares with the next stays */
        for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u]; g++) give += v < 0 || g < s->u_lo[v] || g > s->u_hi[v];
    }
    return best > (int64_t)s->pool_nfull ? (uint32_t)(best - (int64_t)s->pool_nfull) : 0;
}

/* Subgroup g's pages go to an empty slot; 0 when they cannot (the caller drops them). */
static int pool_put(struct mw_train_stream *s, uint32_t g)
{
    if (!s->pool || !s->pool_nempty || !pool_fits(s, g)) return 0;
    uint32_t i = s->pool_empty[s->pool_nempty - 1];
    size_t bytes = s->sg_size * 4;
    if (mremap(s->model->params + (uint64_t)g * s->sg_size, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               pool_slot(s, i)) == MAP_FAILED) {
        pool_off(s);
        return 0;
    }
    s->pool_nempty--;
    s->pool_full[s->pool_nfull++] = i;
    return 1;
}

/* Before subgroup g's read: a full slot's pages move into its range (nothing when none); 1 if so. */
static int pool_take(struct mw_train_stream *s, uint32_t g)
{
    if (!s->pool || !s->pool_nfull || !pool_fits(s, g)) return 0;
    uint32_t i = s->pool_full[s->pool_nfull - 1];
    size_t bytes = s->sg_size * 4;
    if (mremap(pool_slot(s, i), bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               s->model->params + (uint64_t)g * s->sg_size) == MAP_FAILED) {
        pool_off(s);
        return 0;
    }
    s->pool_nfull--;
    s->pool_empty[s->pool_nempty++] = i;
    s->pool_moves++;
    count_resident(s, -(int64_t)bytes); /* counted while pooled; the fetch counts them again */
    return 1;
}

/* The pooled pages go back to the OS (after a step: no fetch follows before the next pass). */
static void pool_trim(struct mw_train_stream *s)
{
    while (s->pool && s->pool_nfull) {
        uint32_t i = s->pool_full[--s->pool_nfull];
        (void)madvise(pool_slot(s, i), s->sg_size * 4, MADV_DONTNEED); /* our own pages: cannot fail */
        s->pool_empty[s->pool_nempty++] = i;
        count_resident(s, -(int64_t)(s->sg_size * 4));
    }
}

int mw_train_stream_init(struct mw_train_stream *s, struct mw_net *m, struct mw_train_opt *opt, int depth,
                         uint64_t seed, struct mw_train_zero *zero, struct mw_trace *trace)
{
    memset(s, 0, sizeof *s);
    if (depth < 0 || depth > 8) return mw_error_set(-EINVAL, "prefetch depth %d: use 0..8 units", depth);
    int err;
    uint64_t S = opt->plan.subgroup_size, N = m->sizes.n_params;
    int gather = zero && zero->stage >= 1;
    if (gather ? opt->own_first != zero->own.first || opt->n_params != zero->own.n || S != zero->sg_size ||
                     opt->own_first % S
               : opt->own_first != 0 || opt->n_params != N)
        return mw_error_set(-ENOTSUP, "streaming weights needs the optimizer over %s", gather ? "exactly this rank's "
                            "ZeRO shard of whole subgroups" : "the whole model");
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!S || (S < N && (S * 4) % page))
        return mw_error_set(-EINVAL, "streaming weights needs subgroups of whole pages: a multiple of %zu elements; got "
                            "%llu: use a subgroup size (subgroup_size) of 4M elements (or 1M, 64K, ...)", page / 4,
                            (unsigned long long)S);
    s->model = m;
    s->opt = opt;
    s->trace = trace;
    s->zero = zero;
    s->gather = gather;
    s->seed = seed;
    s->sg_size = S;
    s->nsg = (uint32_t)((N + S - 1) / S);
    s->sg0 = (uint32_t)(opt->own_first / S);
    s->sg_end = (uint32_t)((opt->own_first + opt->n_params + S - 1) / S);
    s->norm_first = opt->own_first; /* ZeRO-1..3: the owned gradients' sum of squares (zero.c's chunks) */
    s->norm_n = opt->n_params;
    s->n_units = m->n_units;
    if ((err = mw_units_init(&s->units, m, &nvme_source, s, depth, "streaming"))) return err;
    s->nchunks = (s->norm_n + MW_OFFLOAD_NORM_CHUNK - 1) / MW_OFFLOAD_NORM_CHUNK;
    s->page = page;
    size_t nu = (size_t)s->n_units, ns = s->nsg;
    s->u_first = calloc(nu, sizeof *s->u_first);
    s->u_n = calloc(nu, sizeof *s->u_n);
    s->u_lo = calloc(nu, sizeof *s->u_lo);
    s->u_hi = calloc(nu, sizeof *s->u_hi);
    s->u_init = calloc(nu, 1);
    s->u_t0 = calloc(nu, sizeof *s->u_t0);
    s->sg_ref = calloc(ns, sizeof *s->sg_ref);
    s->sg_state = calloc(ns, 1);
    s->sg_hand = calloc(ns, 1);
    s->sg_unit = calloc(ns, sizeof *s->sg_unit);
    s->sg_io = calloc(ns, sizeof *s->sg_io);
    s->sg_t0 = calloc(ns, sizeof *s->sg_t0);
    s->sg_gdone = calloc(ns, 1);
    s->gw_pending = calloc(ns, 1);
    s->gw_io = calloc(ns, sizeof *s->gw_io);
    s->gw_t0 = calloc(ns, sizeof *s->gw_t0);
    s->gw_unit = calloc(ns, sizeof *s->gw_unit);
    s->chunk_sumsq = calloc(s->nchunks, sizeof *s->chunk_sumsq);
    s->chunk_done = calloc(s->nchunks, 1);
    if (!s->chunk_done || !s->u_first || !s->u_n || !s->u_lo || !s->u_hi || !s->u_init || !s->u_t0 || !s->sg_ref || !s->sg_state || !s->sg_hand ||
        !s->sg_unit || !s->sg_io || !s->sg_t0 || !s->sg_gdone || !s->chunk_sumsq || !s->gw_pending || !s->gw_io ||
        !s->gw_t0 || !s->gw_unit) {
        mw_train_stream_free(s);
        return mw_error_set(-ENOMEM, "no memory for the streaming tables");
    }
    for (int u = 0; u < s->n_units; u++) {
        mw_net_unit_range(m, u, &s->u_first[u], &s->u_n[u]);
        s->u_lo[u] = (uint32_t)(s->u_first[u] / S);
        s->u_hi[u] = (uint32_t)((s->u_first[u] + s->u_n[u] - 1) / S);
    }
    /* Subgroups of whole 2 MiB pages: back the arrays with huge pages (O_DIRECT into them runs
     * about twice as fast on the virtual disk; docs/io.md). Advice only: ignored if refused. */
    if ((S * 4) % ((size_t)2 << 20) == 0 && (uintptr_t)m->params % ((size_t)2 << 20) == 0 &&
        (uintptr_t)m->grads % ((size_t)2 << 20) == 0) {
        (void)madvise(m->params, MW_ALIGN_UP(m->sizes.params_bytes, page), MADV_HUGEPAGE);
        (void)madvise(m->grads, MW_ALIGN_UP(m->sizes.grads_bytes, page), MADV_HUGEPAGE);
    }
    /* Nothing of the weights or gradients is resident until it is used: the model's arrays are
     * fresh mappings (the model's init), never touched before this. */
    pool_init(s);
    const char *env = getenv("MEMWALL_STREAM_HANDOFF");
    s->handoff = !(env && !strcmp(env, "0")) && opt->cfg.weights == MW_OFFLOAD_W_FP32;
    return 0;
}

/* The initial weights, a subgroup at a time: the units it touches are made (from the seed or the
 * file, each unit once), its initial master written into the engine, its pages dropped. Then no
 * weight page stays resident (the initial weights of units that reach outside this rank's shard
 * were made whole). */
int mw_train_stream_ready(struct mw_train_stream *s)
{
    int err = 0;
    for (uint32_t g = s->sg0; g < s->sg_end && !err && mw_offload_master_uninit(eng(s)); g++) {
        for (int u = 0; u < s->n_units && !err; u++) {
            if (s->u_init[u] || g < s->u_lo[u] || g > s->u_hi[u]) continue;
            err = s->init ? s->model->family->loader_unit(s->init, s->model, u) : mw_net_init_weights_unit(s->model, s->seed, u);
            s->u_init[u] = 1;
        }
        uint64_t a, n;
        sg_range(s, g, &a, &n);
        if (!err) err = mw_offload_master_init(eng(s), g - s->sg0, s->model->params + a);
        if (!err) err = drop(s, s->model->params, g, "weight");
    }
    for (uint32_t g = 0; g < s->nsg && !err; g++)
        if (s->sg_state[g] == MW_UNIT_RELEASED) err = drop(s, s->model->params, g, "weight");
    return err;
}

void mw_train_stream_free(struct mw_train_stream *s)
{
    if (s->sg_state && s->opt && s->opt->eng)
        for (uint32_t i = 0; i < s->nsg; i++) {
            if (s->sg_state[i] == MW_UNIT_FETCHING && s->sg_hand[i]) (void)mw_offload_master_handoff(eng(s), i - s->sg0, 0);
            else if (s->sg_state[i] == MW_UNIT_FETCHING) (void)mw_offload_io_wait(eng(s), &s->sg_io[i]);
            if (s->gw_pending && s->gw_pending[i]) (void)mw_offload_io_wait(eng(s), &s->gw_io[i]);
        }
    free(s->u_first);
    free(s->u_n);
    free(s->u_lo);
    free(s->u_hi);
    free(s->u_init);
    free(s->u_t0);
    free(s->sg_ref);
    free(s->sg_state);
    free(s->sg_hand);
    free(s->sg_unit);
    free(s->sg_io);
    free(s->sg_t0);
    free(s->sg_gdone);
    free(s->gw_pending);
    free(s->gw_io);
    free(s->gw_t0);
    free(s->gw_unit);
    free(s->chunk_sumsq);
    free(s->chunk_done);
    pool_off(s);
    if (s->init) s->model->family->loader_close(s->init);
    mw_units_free(&s->units);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- the source "nvme" (units.h) */

/* Subgroup sg (released, or resident with stale weights and held by none) takes the weights of the
 * update in flight, or between steps the next one, from the engine (stream.h, "a handoff"): 1 if
 * arranged (FETCHING), 0 if not (as it was), or an error. */
static int hand_over(struct mw_train_stream *s, uint32_t sg, int unit)
{
    /* Pooled pages first: the update may write into the range as soon as the handoff is made. */
    int was = s->sg_state[sg], took = was == MW_UNIT_RELEASED && pool_take(s, sg), e = 0;
    int h = mw_offload_master_handoff(eng(s), sg - s->sg0, 1);
    if (h == 1) {
        s->sg_state[sg] = MW_UNIT_FETCHING;
        s->sg_hand[sg] = 1;
        s->sg_unit[sg] = unit;
        s->sg_t0[sg] = mw_now_ns();
        if (was == MW_UNIT_RELEASED) count_resident(s, (int64_t)sg_bytes(s, sg));
        return 1;
    }
    if (took && pool_put(s, sg)) count_resident(s, (int64_t)sg_bytes(s, sg)); /* back, for a read */
    else if (took) e = drop(s, s->model->params, sg, "weight");
    return h < 0 ? h : e;
}

/* block: the unit is needed now (wait for the update of its subgroups, if one runs); else a
 * prefetch. A subgroup whose update has not been written yet is handed over by the update (stream.h)
 * when the engine can still arrange it; else a prefetch skips it and an acquire waits, then reads. */
static int fetch_issue(struct mw_train_stream *s, uint32_t sg, int unit, int block)
{
    if (s->sg_state[sg] != MW_UNIT_RELEASED || !owned(s, sg)) return 0; /* others: gathered (unit_get_) */
    uint64_t tw = mw_now_ns();
    int ready = mw_offload_sg_wait(eng(s), sg - s->sg0, 0);
    if (ready < 0) return ready;
    if (!ready && s->handoff) { /* its update has not been written: the update hands the weights over */
        int h = hand_over(s, sg, unit);
        if (h) return h < 0 ? h : 0;
    }
    if (!ready && block) ready = mw_offload_sg_wait(eng(s), sg - s->sg0, 1);
    if (ready < 0) return ready;
    if (!ready) return 0;
    if (block && mw_now_ns() - tw > 1000) { /* waited for the update: exposed too */
        uint64_t t1 = mw_now_ns();
        s->wait_ns += t1 - tw;
        struct mw_trace_arg w[3] = {{"unit", unit}, {"bytes", 0}, {"step", s->step}};
        mw_trace_span(s->trace, "residency", "wait", tw, t1, w, 3);
    }
    uint64_t a, n;
    sg_range(s, sg, &a, &n);
    pool_take(s, sg);
    s->sg_t0[sg] = mw_now_ns();
    int err = mw_offload_master_fetch(eng(s), sg - s->sg0, s->model->params + a, &s->sg_io[sg]);
    if (err) {
        (void)drop(s, s->model->params, sg, "weight"); /* pages pool_take moved in */
        return err;
    }
    s->sg_state[sg] = MW_UNIT_FETCHING;
    s->sg_unit[sg] = unit;
    count_resident(s, (int64_t)sg_bytes(s, sg)); /* its pages fill as the read lands */
    return 0;
}

/* A handoff (fetch_issue): waits for the update to copy the weights in; when it will not after all,
 * they are read as a fetch would. */
static int hand_wait(struct mw_train_stream *s, uint32_t sg)
{
    uint64_t t0 = mw_now_ns(), a, n;
    sg_range(s, sg, &a, &n);
    int r = mw_offload_master_handoff_wait(eng(s), sg - s->sg0);
    uint64_t t1 = mw_now_ns();
    s->sg_hand[sg] = 0;
    if (r == 0) { /* the update did not hand them over: read them (pages as they are) */
        (void)mw_offload_master_handoff(eng(s), sg - s->sg0, 0);
        if ((r = mw_offload_sg_wait(eng(s), sg - s->sg0, 1)) >= 0) {
            s->sg_t0[sg] = mw_now_ns();
            r = mw_offload_master_fetch(eng(s), sg - s->sg0, s->model->params + a, &s->sg_io[sg]);
            if (!r) return 1; /* a read in flight now: the caller waits for it */
        }
    }
    if (r < 0) {
        (void)mw_offload_master_handoff(eng(s), sg - s->sg0, 0);
        s->sg_state[sg] = MW_UNIT_RELEASED;
        count_resident(s, -(int64_t)sg_bytes(s, sg));
        (void)drop(s, s->model->params, sg, "weight");
        return mw_error_set(r, "streaming: the updated weights of subgroup %u (unit %d) failed: %s", sg, s->sg_unit[sg],
                            mw_error_msg());
    }
    if (t1 - t0 > 1000) {
        s->wait_ns += t1 - t0;
        struct mw_trace_arg w[3] = {{"unit", s->sg_unit[sg]}, {"bytes", 0}, {"step", s->step}};
        mw_trace_span(s->trace, "residency", "wait", t0, t1, w, 3);
    }
    struct mw_trace_arg f[4] = {{"unit", s->sg_unit[sg]}, {"bytes", 0}, {"step", s->step}, {"handoff", 1}};
    mw_trace_span(s->trace, "residency", "fetch", s->sg_t0[sg], t1, f, 4); /* arrived, nothing read */
    (void)mw_offload_master_handoff(eng(s), sg - s->sg0, 0); /* done: the next one is another step's */
    s->sg_state[sg] = MW_UNIT_RESIDENT;
    s->handoff_bytes += sg_bytes(s, sg);
    return 0;
}

static int fetch_wait(struct mw_train_stream *s, uint32_t sg)
{
    if (s->sg_state[sg] != MW_UNIT_FETCHING) return 0;
    if (s->sg_hand[sg]) {
        int r = hand_wait(s, sg);
        if (r <= 0) return r; /* r == 1: read after all, below */
    }
    uint64_t t0 = mw_now_ns();
    int done = mw_offload_io_test(&s->sg_io[sg]);
    int err = mw_offload_io_wait(eng(s), &s->sg_io[sg]);
    uint64_t t1 = mw_now_ns();
    if (err) {
        s->sg_state[sg] = MW_UNIT_RELEASED;
        count_resident(s, -(int64_t)sg_bytes(s, sg));
        (void)drop(s, s->model->params, sg, "weight"); /* whatever the read left */
        return mw_error_set(err, "streaming: fetching the weights of subgroup %u (unit %d) failed: %s", sg,
                            s->sg_unit[sg], mw_error_msg());
    }
    uint64_t bytes = sg_bytes(s, sg);
    if (!done) {
        s->wait_ns += t1 - t0;
        struct mw_trace_arg w[3] = {{"unit", s->sg_unit[sg]}, {"bytes", (int64_t)bytes}, {"step", s->step}};
        mw_trace_span(s->trace, "residency", "wait", t0, t1, w, 3);
    }
    struct mw_trace_arg a[3] = {{"unit", s->sg_unit[sg]}, {"bytes", (int64_t)bytes}, {"step", s->step}};
    mw_trace_span(s->trace, "residency", "fetch", s->sg_t0[sg], t1, a, 3);
    s->sg_state[sg] = MW_UNIT_RESIDENT;
    s->fetch_bytes += bytes;
    return 0;
}

static int unit_get_(struct mw_train_stream *s, int u)
{
    if (s->saving) return 0; /* every unit is held until save_end */
    int err = 0;
    for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u] && !err; g++) err = fetch_issue(s, g, u, 1);
    for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u] && !err; g++) err = fetch_wait(s, g);
    if (!err && s->gather) {
        /* The owned subgroups are in; the owners of the rest send theirs (every rank acquires the
         * units in the same order: the schedule). */
        err = mw_train_zero_unit_gather(s->zero, u);
        for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u] && !err; g++)
            if (!owned(s, g) && s->sg_state[g] == MW_UNIT_RELEASED) {
                s->sg_state[g] = MW_UNIT_RESIDENT;
                count_resident(s, (int64_t)sg_bytes(s, g));
            }
    }
    if (err) return err;
    for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u]; g++) s->sg_ref[g]++;
    s->u_t0[u] = mw_now_ns();
    return 0;
}

/* Whether subgroup sg belongs to one of the next `ahead` units of the schedule from pos. */
static int needed_soon(const struct mw_train_stream *s, uint32_t sg, int pos, int ahead)
{
    for (int k = 0; k < MW_MAX(ahead, s->units.lead_max); k++) {
        int u = mw_units_ahead(&s->units, pos + k);
        if (u < 0) return 0;
        if ((k < ahead || mw_units_in_reach(&s->units, k, u)) && sg >= s->u_lo[u] && sg <= s->u_hi[u]) return 1;
    }
    return 0;
}

/* Subgroup g (resident, held by none) is released: its pages go to the pool while the next fetches
 * want them (*want), else back to the OS. */
static int sg_put(struct mw_train_stream *s, uint32_t g, uint32_t *want)
{
    s->sg_state[g] = MW_UNIT_RELEASED;
    if (*want && pool_put(s, g)) { /* still resident, in the pool */
        --*want;
        return 0;
    }
    count_resident(s, -(int64_t)sg_bytes(s, g));
    return drop(s, s->model->params, g, "weight");
}

/* Whether unit u comes again later in the forward being run (a tied head after its embedding). */
static int again_in_forward(const struct mw_train_stream *s, int u)
{
    if (s->units.in_backward) return 0;
    int nf = s->units.sched.nf[!!s->units.layer_major];
    for (int p = s->units.pos; p < nf; p++)
        if (mw_units_at(&s->units, p) == u) return 1;
    return 0;
}

static int unit_put_(struct mw_train_stream *s, int u, int backward, int keep_ahead)
{
    if (s->saving) return 0;
    int again = keep_ahead && s->keep_tied && !backward && again_in_forward(s, u); /* cfg.keep_tied */
    struct mw_trace_arg a[4] = {{"unit", u}, {"bytes", (int64_t)(s->u_n[u] * 4)}, {"backward", backward}, {"step", s->step}};
    mw_trace_span(s->trace, "residency", "resident", s->u_t0[u], mw_now_ns(), a, 4);
    int err = 0;
    uint32_t want = keep_ahead ? pool_want(s) : 0; /* pages the next fetches will take (the pool) */
    for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u] && !err; g++) {
        if (s->sg_ref[g] > 0) s->sg_ref[g]--;
        if (s->sg_ref[g] || s->sg_state[g] != MW_UNIT_RESIDENT) continue;
        /* (A gathered subgroup is gathered again at its next use: nothing to keep.) */
        if (keep_ahead && owned(s, g) && (again || needed_soon(s, g, s->units.pos, MW_MAX(s->units.depth, 1)))) continue;
        err = sg_put(s, g, &want);
    }
    return err;
}

int mw_train_stream_trim(struct mw_train_stream *s, int u, uint64_t first, uint64_t n, int now)
{
    if (s->saving || u < 0 || u >= s->n_units) return 0;
    uint64_t lo = s->u_first[u], hi = lo + s->u_n[u];
    uint32_t want = now ? 0 : pool_want(s); /* now: to the OS, the next use reads them again */
    int err = 0;
    for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u] && !err; g++) {
        uint64_t a, k;
        sg_range(s, g, &a, &k);
        /* whole inside the range and the unit (a subgroup it shares is another unit's too), held by
         * this unit alone, and not wanted by the next units of the schedule */
        if (a < first || a - first + k > n || a < lo || a + k > hi) continue;
        if (s->sg_ref[g] != 1 || s->sg_state[g] != MW_UNIT_RESIDENT || !owned(s, g)) continue;
        if (!now && needed_soon(s, g, s->units.pos, MW_MAX(s->units.depth, 1))) continue;
        err = sg_put(s, g, &want); /* its reference goes at the unit's release, which skips it */
    }
    return err;
}

static int nvme_issue(void *self, int u, int now)
{
    struct mw_train_stream *s = self;
    int err = 0;
    for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u] && !err; g++) err = fetch_issue(s, g, u, now);
    return err;
}

static int nvme_wait(void *self, int u) { return unit_get_(self, u); }
static int nvme_release(void *self, int u, int backward) { return unit_put_(self, u, backward, 1); }

static const struct mw_unit_source nvme_source = {
    .name = "nvme",
    .issue = nvme_issue,
    .wait = nvme_wait,
    .release = nvme_release,
};

static int st_weights(void *self, int event, int unit, int backward)
{
    struct mw_train_stream *s = self;
    return mw_units_hook(&s->units, event, unit, backward);
}

static int st_pass_begin(void *self, int training)
{
    struct mw_train_stream *s = self;
    mw_units_pass_begin(&s->units, training, s->layer_major);
    return 0;
}

/* ---------------------------------------------------------------- gradients */

static int st_step_begin(void *self)
{
    struct mw_train_stream *s = self;
    memset(s->sg_gdone, 0, s->nsg);
    memset(s->chunk_sumsq, 0, s->nchunks * sizeof *s->chunk_sumsq);
    memset(s->chunk_done, 0, s->nchunks);
    s->err = 0;
    /* Zero gradients without touching them: every page goes back to the OS (no update runs
     * now: the trainer finished it before this). With the engine's grads_dram the update zeroed
     * them in place as it read them, and they stay (grads_clean: a skipped or failed step did not). */
    uint64_t committed = mw_offload_committed_steps(eng(s));
    int clean = s->grads_clean && !mw_offload_step_in_flight(eng(s)) && committed == s->clean_at;
    s->grads_clean = 0;
    s->begun_at = committed;
    if (clean) return 0;
    if (madvise(s->model->grads, MW_ALIGN_UP(s->model->sizes.grads_bytes, s->page), MADV_DONTNEED) != 0) {
        int e = errno;
        return mw_error_set(-e, "streaming: returning the gradient pages failed: %s", strerror(e));
    }
    return 0;
}

static int st_backward_begin(void *self, int micro, int last)
{
    struct mw_train_stream *s = self;
    s->last = last;
    s->err = 0;
    /* The next micro-batch's forward reads the same weights: its first units are fetched during
     * this backward's last ones (never across a step: not after the step's last micro-batch). */
    s->units.wrap = s->prefetch_next_micro && !last && !s->layer_major && !s->zero;
    /* Batch-major accumulation keeps every gradient in DRAM through the step (the plan counts the
     * whole array): the update reads them there (mw_offload_grads_resident) and drops each
     * subgroup's pages once it has, so writing them out and reading them back would be 2 x the
     * gradients' bytes of disk traffic for nothing, in the step's busiest stretch. */
    if (last) s->grads_kept = (micro > 0 || s->keep_grads) && !s->layer_major && !s->zero;
    if (s->zero) mw_train_zero_backward_begin(s->zero, micro, last);
    return 0;
}

/* Norm chunk c's gradients are final: its sum of squares, as the engine computes it. */
static int chunk_finish(struct mw_train_stream *s, uint64_t c)
{
    double sum = 0;
    int r = mw_offload_norm_chunk(s->model->grads + s->norm_first, s->norm_n, c, s->opt->cfg.cpu_threads, &sum);
    if (r && r != MW_EOVERFLOW) return r;
    s->chunk_sumsq[c] = sum; /* non-finite on overflow, as in the engine */
    s->chunk_done[c] = 1;
    return 0;
}

/* Subgroup sg's gradients are final and summed: their write to NVMe starts; the pages go when
 * it is done (grads_reap), so the write overlaps the next unit's backward. */
static int grads_finish(struct mw_train_stream *s, uint32_t sg, int unit)
{
    if (s->grads_kept) { /* the update reads them in DRAM */
        s->sg_gdone[sg] = 1;
        return 0;
    }
    uint64_t a, n;
    sg_range(s, sg, &a, &n);
    s->gw_t0[sg] = mw_now_ns();
    s->gw_unit[sg] = unit;
    int err = mw_offload_grads_put_start(eng(s), sg - s->sg0, s->model->grads + a, &s->gw_io[sg]);
    if (err) return err;
    s->sg_gdone[sg] = 1;
    s->gw_pending[sg] = 1;
    return 0;
}

/* Writes of gradients that are done (all of them with wait): their pages go back to the OS. */
static int grads_reap(struct mw_train_stream *s, int wait)
{
    int err = 0;
    for (uint32_t g = 0; g < s->nsg; g++) {
        if (!s->gw_pending[g] || (!wait && !mw_offload_io_test(&s->gw_io[g]))) continue;
        int e = mw_offload_io_wait(eng(s), &s->gw_io[g]);
        s->gw_pending[g] = 0;
        uint64_t a, n;
        sg_range(s, g, &a, &n);
        uint64_t bytes = MW_ALIGN_UP(n * 4, 4096);
        struct mw_trace_arg ta[3] = {{"unit", s->gw_unit[g]}, {"bytes", (int64_t)bytes}, {"step", s->step}};
        mw_trace_span(s->trace, "residency", "grad_write", s->gw_t0[g], mw_now_ns(), ta, 3);
        s->grad_write_bytes += bytes;
        if (!e) e = drop(s, s->model->grads, g, "gradient");
        if (e && !err) err = e;
    }
    return err;
}

/* Everything from element `mark` up is final: sum the chunks that lie there, then write out
 * the subgroups whose chunks are all summed. */
static int grads_advance(struct mw_train_stream *s, uint64_t mark, int unit)
{
    int err = 0;
    for (uint64_t c = s->nchunks; c-- > 0 && !err;) {
        if (s->norm_first + c * MW_OFFLOAD_NORM_CHUNK < mark) break;
        if (!s->chunk_done[c]) err = chunk_finish(s, c);
    }
    for (uint32_t g = s->sg_end; g-- > s->sg0 && !err;) {
        uint64_t a = (uint64_t)g * s->sg_size, c = (a - s->norm_first) / MW_OFFLOAD_NORM_CHUNK;
        if (a < mark && !s->chunk_done[c]) break;
        if (!s->sg_gdone[g] && s->chunk_done[c]) err = grads_finish(s, g, unit);
        if (a < mark) break;
    }
    return err;
}

static int unit_of_first(const struct mw_train_stream *s, size_t first)
{
    for (int u = 0; u < s->n_units; u++)
        if (s->u_first[u] == first) return u;
    return -1;
}

static void st_grad_ready(size_t first, size_t n, void *self)
{
    struct mw_train_stream *s = self;
    if (s->zero) { /* the unit's collective starts; its result is final at backward_end */
        mw_train_zero_grad_ready(first, n, s->zero);
        return;
    }
    mw_train_opt_grad_ready(first, n, s->opt);
    if (s->err || !s->last) return;
    /* Backward reports units in reverse flat order: everything from `first` up is final. The
     * writes of the unit before had this unit's backward to finish (waited for if not): their
     * pages go, which bounds the gradients in DRAM as planned. */
    s->err = grads_reap(s, 1);
    if (!s->err) s->err = grads_advance(s, first, unit_of_first(s, first));
}

/* Data parallel: the collectives end, then this rank's final gradients are summed and written
 * (after backward, not during it: the reduced values exist only once each bucket's collective is
 * waited for); the gradients of the subgroups other ranks own leave DRAM. */
static int zero_backward_end(struct mw_train_stream *s)
{
    int err = mw_train_zero_backward_end(s->zero);
    if (err || !s->last) return err;
    for (uint32_t g = 0; g < s->nsg && !err; g++)
        if (!owned(s, g)) err = drop(s, s->model->grads, g, "gradient");
    if (!err) err = grads_advance(s, 0, -1);
    int e2 = grads_reap(s, 1);
    return err ? err : e2;
}

/* The step's last backward ended: the first units of the next forward (those its first acquire
 * waits for or issues ahead) take their weights from the coming update (stream.h). */
static int hand_next_forward(struct mw_train_stream *s)
{
    if (!s->handoff || s->zero || s->layer_major) return 0;
    int err = 0, reach = MW_MAX(s->units.depth, s->units.lead_max);
    for (int k = 0; k <= reach && !err; k++) { /* position 0, and those its acquire issues ahead */
        int u = mw_net_sched_unit(&s->units.sched, 0, 1, k);
        if (u < 0) break;
        if (k > 0 && !mw_units_in_reach(&s->units, k - 1, u)) continue;
        for (uint32_t g = s->u_lo[u]; g <= s->u_hi[u] && !err; g++) {
            if (!owned(s, g) || s->sg_ref[g] || (s->sg_state[g] != MW_UNIT_RELEASED && s->sg_state[g] != MW_UNIT_RESIDENT))
                continue;
            int h = hand_over(s, g, u);
            if (h < 0) err = h;
        }
    }
    return err;
}

static int st_backward_end(void *self)
{
    struct mw_train_stream *s = self;
    if (s->zero && !s->err) return s->err = zero_backward_end(s);
    if (s->err || !s->last) return s->err;
    s->err = grads_advance(s, 0, -1);
    int err = grads_reap(s, 1); /* the update reads them back: every write done */
    mw_offload_grads_resident(eng(s), s->grads_kept); /* no update runs: its step starts after this */
    if (!s->err && !err) err = hand_next_forward(s);
    return s->err ? s->err : (s->err = err);
}

/* The engine's norm: fixed chunks of the flat space, summed in order. */
static int st_grad_norm(void *self, double *norm)
{
    struct mw_train_stream *s = self;
    double sum = 0;
    for (uint64_t c = 0; c < s->nchunks; c++) sum += s->chunk_sumsq[c];
    if (s->gather) { /* the shards' sums, in rank order (zero.c) */
        double local = sum;
        int err = mw_train_zero_sumsq(s->zero, local, &sum);
        if (err) return err;
    }
    *norm = sqrt(sum);
    return isfinite(*norm) ? 0 : MW_EOVERFLOW;
}

/* After an optimizer step the master changed: weight pages still resident (a unit kept for the
 * next one at the end of a pass) hold the old weights; they go, and the next use fetches anew.
 * (No fetch is in flight: look-ahead never crosses a step.) */
static int st_after_step(void *self)
{
    struct mw_train_stream *s = self;
    int err = 0;
    /* The update started zeroes each subgroup's gradients in place as it reads them (grads_dram):
     * once it has committed, the next step_begin has nothing to zero. */
    uint64_t committed = mw_offload_committed_steps(eng(s));
    int running = mw_offload_step_in_flight(eng(s));
    if (s->opt->cfg.grads_dram && !s->zero && (running || committed > s->begun_at)) { /* (not a skipped step) */
        s->grads_clean = 1;
        s->clean_at = committed + (running ? 1 : 0);
    }
    for (uint32_t g = 0; g < s->nsg && !err; g++) {
        if (s->sg_hand[g]) continue; /* the updated weights, handed over (hand_next_forward) */
        if (s->sg_state[g] == MW_UNIT_FETCHING && (err = fetch_wait(s, g))) break;
        if (s->sg_state[g] != MW_UNIT_RESIDENT || s->sg_ref[g]) continue;
        if ((err = drop(s, s->model->params, g, "weight"))) break;
        s->sg_state[g] = MW_UNIT_RELEASED;
        count_resident(s, -(int64_t)sg_bytes(s, g));
    }
    pool_trim(s);
    return err;
}

/* ---------------------------------------------------------------- saving, bytes */

static int st_unit_get(void *self, int unit) { return unit_get_(self, unit); }
static int st_unit_put(void *self, int unit) { return unit_put_(self, unit, 0, 0); }

/* With gather, reading a unit is a collective that only the writing rank would call (rank 0
 * writes model.safetensors): every rank gathers the whole model here instead, as ZeRO-3 does. */
static int st_save_begin(void *self)
{
    struct mw_train_stream *s = self;
    if (!s->gather || s->saving) return 0;
    int err = 0, u;
    for (u = 0; u < s->n_units && !err; u++) err = unit_get_(s, u);
    if (!err) { s->saving = 1; return 0; }
    while (--u > 0) (void)unit_put_(s, u - 1, 0, 0);
    return err;
}

static int st_save_end(void *self)
{
    struct mw_train_stream *s = self;
    if (!s->saving) return 0;
    s->saving = 0;
    int err = 0;
    for (int u = 0; u < s->n_units; u++) {
        int e = unit_put_(s, u, 0, 0);
        if (!err) err = e;
    }
    return err;
}

static void st_bytes(void *self, uint64_t *params, uint64_t *grads)
{
    struct mw_train_stream *s = self;
    *params = s->plan.weights_peak;
    *grads = MW_MAX(s->plan.grads_peak, s->plan.step_grads);
}

static const struct mw_residency_ops stream_ops = {
    .name = "nvme",
    .weights = st_weights,
    .pass_begin = st_pass_begin,
    .step_begin = st_step_begin,
    .backward_begin = st_backward_begin,
    .grad_ready = st_grad_ready,
    .backward_end = st_backward_end,
    .grad_norm = st_grad_norm,
    .after_step = st_after_step,
    .save_begin = st_save_begin,
    .unit_get = st_unit_get,
    .unit_put = st_unit_put,
    .save_end = st_save_end,
    .bytes = st_bytes,
};

void mw_residency_stream(struct mw_residency *r, struct mw_train_stream *s)
{
    r->ops = &stream_ops;
    r->self = s;
}
