/* A miniature ZeRO data-parallel training run over 2 ranks (ctest: mpirun -np 2), built only
 * from the comm layer and the partition math, as `memwall train` will use them:
 *
 *   model    linear regression, P fp32 weights in "layers" (ranges of LAYER elements),
 *            loss 0.5 (w.x - y)^2 averaged over the global batch, AdamW on the owned shard;
 *   data     each rank takes its contiguous slice of every micro-batch;
 *   stage 0  bucketed allreduce of the gradients (one bucket per layer, issued as "backward"
 *            finishes the layer), update everything;
 *   stage 1  local accumulation, bucketed reduce-scatter to the owners once per step, update
 *            the owned shard, bucketed allgather of the new weights;
 *   stage 2  reduce-scatter every micro-step (accumulate the owned shard);
 *   stage 3  weights sharded: allgather each layer before forward and again before backward
 *            (prefetching the next layer, releasing after use), reduce-scatter per layer.
 *
 * Checks: with one micro-step every stage gives bit for bit the losses and weights of a serial
 * emulation of the same rank-order sums, and all stages equal each other; with two micro-steps
 * stages 1 and 3 match their own emulations bit for bit; everything is within fp32 tolerance of
 * a plain single-rank run; the bytes each rank sends per step equal mw_zero_volume's figure;
 * ZeRO-3 never holds more than two gathered layers.
 *
 * Modes: no argument = the test; "hash FILE" = rank 0 writes the losses and a hash of the final
 * weights (mpi_twice.sh compares two runs); "die" = rank 1 exits(3) at step 2 and rank 0 must
 * fail with a clear message (mpi_death.sh). MW_COMM_TIMEOUT sets the wait deadline (s). */
#include <math.h>
#include <mpi.h>

#include "memwall/comm.h"
#include "testutil.h"

enum { P = 4099, LAYER = 1000, NL = (P + LAYER - 1) / LAYER, SG = 256, B = 8, STEPS = 5, MAXR = 8 };

struct result {
    float loss[STEPS];
    float w[P];
    uint64_t sent[STEPS];      /* bytes this rank sent per step (ring model) */
    size_t peak_gathered;      /* stage 3: most gathered weight elements held at once */
};

static size_t lfirst(int l) { return (size_t)l * LAYER; }
static size_t llen(int l) { return MW_MIN((size_t)LAYER, (size_t)P - lfirst(l)); }

/* Sample j of step t: features x[P] and target y (a fixed "true" model plus noise). */
static void sample(int t, int j, float *x, float *y)
{
    uint64_t s = 0x1234567ull + (uint64_t)t * 1000 + (uint64_t)j;
    float acc = 0;
    for (int i = 0; i < P; i++) {
        x[i] = tu_randf(&s);
        acc += x[i] * (float)((i % 7) - 3) * 0.01f;
    }
    *y = acc + 0.01f * tu_randf(&s);
}

static void init_weights(float *w, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) w[i] = 0.001f * (float)((first + i) % 13);
}

/* AdamW on elements [first, first+n) of the flat space, step t (0-based). */
static void adamw(float *w, float *m, float *v, const float *g, size_t n, int t)
{
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    const float c1 = 1.0f - powf(b1, (float)(t + 1)), c2 = 1.0f - powf(b2, (float)(t + 1));
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        w[i] -= lr * (m[i] / c1 / (sqrtf(v[i] / c2) + eps) + wd * w[i]);
    }
}

/* Rank r's samples of micro-step k: [lo, hi) of the step's B. */
static void slice(int micro, int k, int ranks, int r, int *lo, int *hi)
{
    int per = B / micro;
    *lo = k * per + r * per / ranks;
    *hi = k * per + (r + 1) * per / ranks;
}

/* err[j] = w.x_j - y_j computed layer by layer (the order every path uses); loss += 0.5 err^2 / B.
 * wl(l) gives layer l's weights. */
typedef const float *(*layer_fn)(void *ctx, int l);
static void forward(float x[][P], const float *y, int nj, layer_fn wl, void *ctx, float *err, float *loss)
{
    for (int j = 0; j < nj; j++) err[j] = 0;
    for (int l = 0; l < NL; l++) {
        const float *w = wl(ctx, l);
        for (int j = 0; j < nj; j++) {
            float d = 0;
            for (size_t i = 0; i < llen(l); i++) d += w[i] * x[j][lfirst(l) + i];
            err[j] += d;
        }
    }
    for (int j = 0; j < nj; j++) {
        err[j] -= y[j];
        *loss += 0.5f * err[j] * err[j] / (float)B;
    }
}

/* g[layer l] = sum_j (err_j / B) x_j[layer l] */
static void layer_grad(float x[][P], const float *err, int nj, int l, float *g)
{
    for (size_t i = 0; i < llen(l); i++) g[i] = 0;
    for (int j = 0; j < nj; j++) {
        float e = err[j] / (float)B;
        for (size_t i = 0; i < llen(l); i++) g[i] += e * x[j][lfirst(l) + i];
    }
}

static const float *full_layer(void *ctx, int l) { return (const float *)ctx + lfirst(l); }

/* ---------------------------------------------------------------- serial emulation */

/* `ranks` virtual ranks summed in rank order. each_micro: reduce every micro-step (stages 2-3)
 * rather than accumulate locally and reduce once (stages 0-1). ranks = 1: a plain serial run. */
static void serial(int ranks, int micro, int each_micro, struct result *out)
{
    static float x[B][P], w[P], m[P], v[P], acc[MAXR][P], tot[P], g[LAYER];
    float y[B], err[B];
    init_weights(w, 0, P);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    for (int t = 0; t < STEPS; t++) {
        float loss_r[MAXR] = {0};
        for (int k = 0; k < micro; k++) {
            for (int r = 0; r < ranks; r++) {
                int lo, hi;
                slice(micro, k, ranks, r, &lo, &hi);
                for (int j = lo; j < hi; j++) sample(t, j, x[j - lo], &y[j - lo]);
                forward(x, y, hi - lo, full_layer, w, err, &loss_r[r]);
                for (int l = NL - 1; l >= 0; l--) {
                    layer_grad(x, err, hi - lo, l, g);
                    float *a = acc[r] + lfirst(l);
                    for (size_t i = 0; i < llen(l); i++) a[i] = (k && !each_micro) ? a[i] + g[i] : g[i];
                }
            }
            if (each_micro || k == micro - 1)
                for (int i = 0; i < P; i++) {
                    float s = acc[0][i];
                    for (int r = 1; r < ranks; r++) s += acc[r][i];
                    tot[i] = (k && each_micro) ? tot[i] + s : s;
                }
        }
        float loss = loss_r[0];
        for (int r = 1; r < ranks; r++) loss += loss_r[r];
        out->loss[t] = loss;
        adamw(w, m, v, tot, P, t);
    }
    memcpy(out->w, w, sizeof w);
}

/* ---------------------------------------------------------------- the distributed run */

struct gather_ctx { /* stage 3: gathered layers in flight or in use */
    struct mw_comm *c;
    float *buf[NL];
    struct mw_comm_req *req[NL];
    const float *shard;       /* owned weights */
    struct mw_zero_shard s;
    size_t live, peak;        /* gathered elements held */
    int failed;
};

static void gather_issue(struct gather_ctx *g, int l)
{
    if (l < 0 || l >= NL || g->buf[l]) return;
    int n = mw_comm_size(g->c, MW_COMM_SHARD), me = mw_comm_rank(g->c, MW_COMM_SHARD);
    size_t counts[MAXR], displs[MAXR];
    mw_zero_bucket_counts(P, SG, n, lfirst(l), llen(l), counts, displs);
    g->buf[l] = malloc(llen(l) * sizeof(float));
    g->live += llen(l);
    g->peak = MW_MAX(g->peak, g->live);
    const float *mine = g->shard + (counts[me] ? lfirst(l) + displs[me] - g->s.first : 0);
    if (mw_comm_iallgather(g->c, MW_COMM_SHARD, mine, g->buf[l], counts, &g->req[l])) g->failed = 1;
}

static void gather_release(struct gather_ctx *g, int l)
{
    free(g->buf[l]);
    g->buf[l] = NULL;
    g->live -= llen(l);
}

__attribute__((noreturn)) static void fail(struct mw_comm *c, const char *what)
{
    fprintf(stderr, "mpi_train: rank %d: %s: %s\n", mw_comm_rank(c, MW_COMM_WORLD), what, mw_error_msg());
    mw_comm_abort(c, 1);
}

/* Forward-pass hook for stage 3: wait for layer l, prefetch l+1. */
static const float *gathered_fwd(void *ctx, int l)
{
    struct gather_ctx *g = ctx;
    if (l > 0) gather_release(g, l - 1);
    gather_issue(g, l + 1);
    if (mw_comm_wait(g->c, &g->req[l])) fail(g->c, "allgather (forward)");
    return g->buf[l];
}

static void run(struct mw_comm *c, int stage, int micro, int die_at, struct result *out)
{
    /* acc: local gradient accumulation (stages 0-1); gsh: the reduced gradient of what this rank
     * updates (stage 0: all, else its shard, gsh[0] = element s.first); rsb: reduce-scatter
     * results per layer until the backward pass ends. */
    static float x[B][P], w[P], m[P], v[P], acc[P], gsh[P], gl[NL][LAYER], rsb[NL][LAYER];
    float y[B], err[B];
    const int N = mw_comm_size(c, MW_COMM_SHARD), me = mw_comm_rank(c, MW_COMM_SHARD);
    struct mw_zero_shard s;
    REQUIRE(mw_zero_shard(P, SG, N, me, &s) == 0);
    /* Stage 3 keeps only its shard (at w[0..s.n)); the others a full working copy. The
     * optimizer state m, v and the reduced gradients (acc) are the shard (stage 0: all). */
    const size_t own = stage == 0 ? P : s.n, own_first = stage == 0 ? 0 : s.first;
    if (stage == 3) init_weights(w, s.first, s.n);
    else init_weights(w, 0, P);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    float *master = stage == 3 ? w : w + own_first;
    struct gather_ctx gc = {.c = c, .shard = w, .s = s};
    out->peak_gathered = 0;
    for (int t = 0; t < STEPS; t++) {
        if (t == die_at && mw_comm_rank(c, MW_COMM_WORLD) == 1) {
            fprintf(stderr, "mpi_train: rank 1 exits(3) at step %d on purpose\n", t);
            exit(3);
        }
        mw_comm_stats_reset(c);
        float loss = 0;
        for (int k = 0; k < micro; k++) {
            int lo, hi;
            slice(micro, k, N, me, &lo, &hi);
            for (int j = lo; j < hi; j++) sample(t, j, x[j - lo], &y[j - lo]);
            if (stage == 3) {
                gather_issue(&gc, 0);
                forward(x, y, hi - lo, gathered_fwd, &gc, err, &loss);
                gather_release(&gc, NL - 1);
            } else {
                forward(x, y, hi - lo, full_layer, w, err, &loss);
            }
            const int reduce_now = stage >= 2 || k == micro - 1;
            struct mw_comm_req *rq[NL] = {0};
            if (stage == 3) gather_issue(&gc, NL - 1);
            for (int l = NL - 1; l >= 0; l--) { /* "backward", last layer first */
                if (stage == 3) { /* needs the layer's weights: prefetch the next, wait */
                    gather_issue(&gc, l - 1);
                    if (mw_comm_wait(c, &gc.req[l])) fail(c, "allgather (backward)");
                }
                float *g = gl[l];
                layer_grad(x, err, hi - lo, l, g);
                if (stage == 3) gather_release(&gc, l); /* done with the layer's weights */
                if (stage <= 1) { /* accumulate the full gradient locally */
                    float *a = acc + lfirst(l);
                    for (size_t i = 0; i < llen(l); i++) a[i] = k ? a[i] + g[i] : g[i];
                    if (reduce_now) memcpy(g, a, llen(l) * sizeof(float));
                }
                if (!reduce_now) continue;
                if (stage == 0) {
                    if (mw_comm_iallreduce(c, MW_COMM_SHARD, g, llen(l), 0, &rq[l])) fail(c, "allreduce");
                } else {
                    size_t counts[MAXR], displs[MAXR];
                    mw_zero_bucket_counts(P, SG, N, lfirst(l), llen(l), counts, displs);
                    if (mw_comm_ireduce_scatter(c, MW_COMM_SHARD, g, rsb[l], counts, 0, &rq[l]))
                        fail(c, "reduce_scatter");
                }
                mw_comm_progress(c); /* advance what is in flight while "computing" */
            }
            if (!reduce_now) continue;
            for (int l = 0; l < NL; l++) {
                if (mw_comm_wait(c, &rq[l])) fail(c, "gradient reduction");
                if (stage == 0) { memcpy(gsh + lfirst(l), gl[l], llen(l) * sizeof(float)); continue; }
                size_t counts[MAXR], displs[MAXR];
                mw_zero_bucket_counts(P, SG, N, lfirst(l), llen(l), counts, displs);
                float *a = gsh + (lfirst(l) + displs[me] - s.first);
                for (size_t i = 0; i < counts[me]; i++) a[i] = (k && stage >= 2) ? a[i] + rsb[l][i] : rsb[l][i];
            }
        }
        adamw(master, m, v, gsh, own, t);
        if (stage == 1 || stage == 2) { /* share the new weights, per layer, in place */
            struct mw_comm_req *aq[NL];
            for (int l = 0; l < NL; l++) {
                size_t counts[MAXR], displs[MAXR];
                mw_zero_bucket_counts(P, SG, N, lfirst(l), llen(l), counts, displs);
                float *dst = w + lfirst(l);
                if (mw_comm_iallgather(c, MW_COMM_SHARD, dst + displs[me], dst, counts, &aq[l])) fail(c, "allgather");
            }
            for (int l = 0; l < NL; l++)
                if (mw_comm_wait(c, &aq[l])) fail(c, "allgather (weights)");
        }
        struct mw_comm_stats st;
        mw_comm_stats_get(c, &st);
        out->sent[t] = mw_comm_stats_sent_total(&st);
        /* Global mean loss (for the log; not part of ZeRO's volume). */
        struct mw_comm_req *lq;
        float lsum = loss;
        if (mw_comm_iallreduce(c, MW_COMM_WORLD, &lsum, 1, 0, &lq) || mw_comm_wait(c, &lq)) fail(c, "loss");
        out->loss[t] = lsum;
    }
    out->peak_gathered = gc.peak;
    if (gc.failed) fail(c, "allgather issue");
    if (stage == 3) { /* the full weights, for the checks */
        size_t counts[MAXR];
        for (int r = 0; r < N; r++) { struct mw_zero_shard q; mw_zero_shard(P, SG, N, r, &q); counts[r] = q.n; }
        struct mw_comm_req *q;
        if (mw_comm_iallgather(c, MW_COMM_SHARD, w, out->w, counts, &q) || mw_comm_wait(c, &q)) fail(c, "final gather");
    } else {
        memcpy(out->w, w, sizeof w);
    }
}

static int same(const struct result *a, const struct result *b)
{
    return !memcmp(a->loss, b->loss, sizeof a->loss) && !memcmp(a->w, b->w, sizeof a->w);
}

static int close_to(const struct result *a, const struct result *b)
{
    for (int t = 0; t < STEPS; t++)
        if (fabsf(a->loss[t] - b->loss[t]) > 1e-4f * fabsf(b->loss[t])) return 0;
    for (int i = 0; i < P; i++)
        if (fabsf(a->w[i] - b->w[i]) > 1e-5f) return 0;
    return 1;
}

int main(int argc, char **argv)
{
    struct mw_comm *c;
    struct mw_comm_config cfg;
    mw_comm_config_default(&cfg);
    cfg.backend = MW_COMM_MPI;
    if (getenv("MW_COMM_TIMEOUT")) cfg.timeout_s = atof(getenv("MW_COMM_TIMEOUT"));
    if (mw_comm_init(&c, &argc, &argv, &cfg)) { fprintf(stderr, "mw_comm_init: %s\n", mw_error_msg()); return 1; }
    const int N = mw_comm_size(c, MW_COMM_SHARD), me = mw_comm_rank(c, MW_COMM_WORLD);
    REQUIRE(N >= 2 && N <= MAXR && B % N == 0);
    static struct result r, ref, plain, first;

    if (argc > 1 && !strcmp(argv[1], "die")) {
        run(c, 2, 1, 2, &r);
        fprintf(stderr, "mpi_train: rank %d finished although rank 1 died\n", me);
        mw_comm_free(c);
        return 1;
    }
    if (argc > 2 && !strcmp(argv[1], "hash")) {
        run(c, 3, 2, -1, &r);
        if (me == 0) {
            FILE *f = fopen(argv[2], "w");
            REQUIRE(f);
            uint64_t h = 1469598103934665603ull;
            const unsigned char *p = (const unsigned char *)r.w;
            for (size_t i = 0; i < sizeof r.w; i++) h = (h ^ p[i]) * 1099511628211ull;
            for (int t = 0; t < STEPS; t++) fprintf(f, "step %d loss %a\n", t, (double)r.loss[t]);
            fprintf(f, "weights fnv1a %016llx\n", (unsigned long long)h);
            fclose(f);
        }
        mw_comm_free(c);
        return 0;
    }

    serial(N, 1, 0, &ref);
    serial(1, 1, 0, &plain);
    for (int stage = 0; stage <= 3; stage++) {
        run(c, stage, 1, -1, &r);
        CHECK_MSG(same(&r, &ref), "stage %d differs from the rank-order serial sums", stage);
        CHECK_MSG(close_to(&r, &plain), "stage %d not within tolerance of one rank", stage);
        if (stage == 0) first = r;
        else CHECK_MSG(same(&r, &first), "stage %d differs from stage 0", stage);
        struct mw_zero_volume vol;
        REQUIRE(mw_zero_volume(stage, P, SG, N, mw_comm_rank(c, MW_COMM_SHARD), 1, 1, 4, 4, &vol) == 0);
        /* Exact for stages 1-3 (the same shard blocks); stage 0's model assumes blocks of exactly
         * n/N, the layer rounds each bucket's blocks to whole elements. */
        const double slack = stage == 0 ? 2.0 * N * NL * sizeof(float) : 0;
        for (int t = 0; t < STEPS; t++)
            CHECK_MSG(fabs((double)r.sent[t] - vol.total) <= slack, "stage %d step %d: sent %llu bytes, model %.0f",
                      stage, t, (unsigned long long)r.sent[t], vol.total);
        if (stage == 3)
            CHECK_MSG(r.peak_gathered <= 2 * LAYER && r.peak_gathered >= LAYER,
                      "ZeRO-3 held %zu gathered elements (layer %d)", r.peak_gathered, LAYER);
        if (me == 0)
            printf("stage %d: loss %.6f -> %.6f, %llu bytes sent per step by rank 0 (%.3f Psi)\n", stage,
                   (double)r.loss[0], (double)r.loss[STEPS - 1], (unsigned long long)r.sent[0], vol.psi_factor);
    }
    /* Two micro-steps: stage 1 accumulates locally, stage 3 reduces every micro-step. */
    serial(N, 2, 0, &ref);
    run(c, 1, 2, -1, &r);
    CHECK_MSG(same(&r, &ref), "stage 1 x2 micro-steps differs from its emulation");
    serial(N, 2, 1, &ref);
    run(c, 3, 2, -1, &r);
    CHECK_MSG(same(&r, &ref), "stage 3 x2 micro-steps differs from its emulation");
    serial(1, 2, 0, &plain);
    CHECK(close_to(&r, &plain));
    struct mw_zero_volume vol;
    REQUIRE(mw_zero_volume(3, P, SG, N, mw_comm_rank(c, MW_COMM_SHARD), 1, 2, 4, 4, &vol) == 0);
    CHECK((double)r.sent[0] == vol.total);

    CHECK(mw_comm_free(c) == 0);
    printf("rank %d: ", me);
    TEST_END();
}
