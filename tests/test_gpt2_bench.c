/*
 * test_gpt2_bench.c — training-step speed of the GPT-2 model, and (as a CTest) a small
 * "it learns" check.
 *
 * As a test (no arguments): a 2-layer model does 8 AdamW steps on one fixed batch; the loss
 * must fall by more than half a nat and stay finite. Nothing is timed in the assertions.
 * As a bench: `test_gpt2_bench --bench [--threads 2] [--steps 5] [--batch 4] [--seq 256]
 * [--recompute] [--tiny]` times full training steps (forward + backward + AdamW) of a
 * GPT-2 124M-shaped model (the reference shape: batch 4, context 256, 2 threads) and
 * prints the median tokens/s and the split between forward, backward and the update.
 * The AdamW here is a plain OpenMP loop, the stand-in for the optimizer kernels.
 */
#include "memwall/gpt2.h"
#include "memwall/common.h"
#include "testutil.h"

#include <math.h>
#include <omp.h>
#include <sys/resource.h>

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec +
           (double)u.ru_stime.tv_usec * 1e-6;
}

static void adamw(float *p, const float *g, float *m, float *v, size_t n, int t, float lr, int nt)
{
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.0f;
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] -= lr * ((m[i] / bc1) / (sqrtf(v[i] / bc2) + eps) + wd * p[i]);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    int bench = 0, nt = 2, steps = 5, B = 4, T = 256, recompute = 0, tiny = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) bench = 1;
        else if (!strcmp(argv[i], "--recompute")) recompute = 1;
        else if (!strcmp(argv[i], "--tiny")) tiny = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--threads")) nt = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--steps")) steps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--batch")) B = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--seq")) T = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--bench [--threads N] [--steps N] [--batch B] [--seq T] "
                       "[--recompute] [--tiny]]\n", argv[0]); return 2; }
    }
    struct mw_gpt2_config cfg;
    mw_gpt2_config_124m(&cfg);
    if (!bench || tiny) {
        cfg = (struct mw_gpt2_config){.n_layer = 2, .n_head = 4, .n_embd = 64, .max_seq_len = 64,
                                      .vocab_size = 256, .padded_vocab_size = 0};
        if (!bench) { B = 4; T = 64; steps = 8; }
        if (T > cfg.max_seq_len) T = cfg.max_seq_len;
    }
    if (steps < 1 || B < 1 || T < 1 || nt < 1) return 2;
    struct mw_gpt2_options o = {.max_batch = B, .max_seq = T, .recompute = recompute, .n_threads = nt};
    struct mw_gpt2 m;
    int rc = mw_gpt2_init(&m, &cfg, &o);
    if (rc) { fprintf(stderr, "init: %s\n", mw_error_msg()); return 1; }
    mw_gpt2_init_weights(&m, 42);
    char b1[32], b2[32], b3[32], b4[32];
    printf("model: L=%d NH=%d C=%d V=%d, %zu params; B=%d T=%d threads=%d recompute=%d\n",
           cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, m.sizes.n_params, B, T, nt, recompute);
    printf("memory: params %s, grads %s, activations %s (without recompute %s)\n",
           mw_fmt_bytes(b1, sizeof b1, m.sizes.params_bytes), mw_fmt_bytes(b2, sizeof b2, m.sizes.grads_bytes),
           mw_fmt_bytes(b3, sizeof b3, m.sizes.acts_bytes), mw_fmt_bytes(b4, sizeof b4, m.sizes.acts_bytes_full));

    size_t n = m.sizes.n_params, BT = (size_t)B * (size_t)T;
    float *am = calloc(n, 4), *av = calloc(n, 4);
    int32_t *in = malloc(BT * 4), *tg = malloc(BT * 4);
    REQUIRE(am && av && in && tg);
    uint64_t s = 7;
    for (size_t i = 0; i < BT; i++) in[i] = (int32_t)(tu_rand(&s) % (uint64_t)cfg.vocab_size);
    for (size_t i = 0; i < BT; i++) tg[i] = i + 1 < BT ? in[i + 1] : 0;

    double *tf = calloc((size_t)steps, 8), *tb = calloc((size_t)steps, 8), *tu = calloc((size_t)steps, 8),
           *tt = calloc((size_t)steps, 8), *tc = calloc((size_t)steps, 8);
    REQUIRE(tf && tb && tu && tt && tc);
    float first = 0, last = 0;
    int warm = bench ? 1 : 0;
    for (int it = -warm; it < steps; it++) {
        double c0 = cpu_s();
        uint64_t t0 = mw_now_ns();
        mw_gpt2_zero_grad(&m);
        REQUIRE(mw_gpt2_forward(&m, in, tg, B, T) == 0);
        uint64_t t1 = mw_now_ns();
        REQUIRE(mw_gpt2_backward(&m, 1.0f, NULL, NULL) == 0);
        uint64_t t2 = mw_now_ns();
        adamw(m.params, m.grads, am, av, n, it + warm + 1, bench ? 3e-4f : 1e-2f, nt);
        uint64_t t3 = mw_now_ns();
        double c1 = cpu_s();
        if (it == -warm) first = m.loss;
        last = m.loss;
        if (it >= 0) {
            tf[it] = (double)(t1 - t0) / 1e9; tb[it] = (double)(t2 - t1) / 1e9;
            tu[it] = (double)(t3 - t2) / 1e9; tt[it] = (double)(t3 - t0) / 1e9; tc[it] = c1 - c0;
        }
        if (bench) printf("step %d: loss %.4f, %.0f ms (fwd %.0f, bwd %.0f, adamw %.0f), %.1f tokens/s, "
                          "CPU %.1f s\n", it, m.loss, (double)(t3 - t0) / 1e6, (double)(t1 - t0) / 1e6,
                          (double)(t2 - t1) / 1e6, (double)(t3 - t2) / 1e6, (double)BT / ((double)(t3 - t0) / 1e9), c1 - c0);
    }
    double mf = median(tf, steps), mb = median(tb, steps), mu = median(tu, steps), mt = median(tt, steps);
    printf("median of %d steps: %.1f tokens/s full step (%.3f s: fwd %.3f s, bwd %.3f s, adamw %.3f s); "
           "fwd+bwd %.1f tokens/s\n", steps, (double)BT / mt, mt, mf, mb, mu, (double)BT / (mf + mb));
    double mc = median(tc, steps);
    /* On a shared machine wall time measures the neighbours too; CPU seconds / threads is what
     * the step would take on nt idle cores (an estimate: spinning and cache effects differ). */
    printf("CPU time per step %.2f s -> %.1f tokens/s on %d idle cores (estimate)\n", mc, (double)BT * nt / mc, nt);
    printf("loss %.4f -> %.4f\n", first, last);
    if (!bench) {
        CHECK(isfinite(first) && isfinite(last));
        CHECK_MSG(last < first - 0.5f, "loss did not fall: %.4f -> %.4f", first, last);
    }
    free(tf); free(tb); free(tu); free(tt); free(tc); free(am); free(av); free(in); free(tg);
    mw_gpt2_free(&m);
    TEST_END();
}
