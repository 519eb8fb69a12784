/*
 * test_gpt2_gradcheck.c — finite-difference check of the analytic gradients.
 *
 * For a tiny model (2 layers, 2 heads, width 16, vocab 13 padded to 16, B=2, T=7) and for a
 * few elements of EVERY tensor (the element with the largest |gradient| and three pseudo-random
 * ones), compare dL/dp from backward with the central difference (L(p+h) - L(p-h)) / 2h.
 * The loss is re-summed in double from the per-position losses, h = 3e-3 (fp32 forward: a
 * smaller step drowns in rounding), and the stated tolerance is
 *     |fd - analytic| <= 5e-5 + 5e-3 * |analytic|     for every checked element.
 * A wrong sign, a missing term or a transposed index gives errors orders of magnitude larger.
 */
#include "memwall/gpt2.h"
#include "memwall/common.h"
#include "testutil.h"

#include <math.h>

enum { B = 2, T = 7 };
static const struct mw_gpt2_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .max_seq_len = 8,
                                          .vocab_size = 13, .padded_vocab_size = 16};

static double loss_d(struct mw_gpt2 *m, const int32_t *in, const int32_t *tg)
{
    REQUIRE(mw_gpt2_forward(m, in, tg, B, T) == 0);
    const float *l = mw_gpt2_losses(m);
    double s = 0;
    for (int i = 0; i < B * T; i++) s += l[i];
    return s / (B * T);
}

int main(void)
{
    struct mw_gpt2_options o = {.max_batch = B, .max_seq = 8, .n_threads = 2};
    struct mw_gpt2 m;
    REQUIRE(mw_gpt2_init(&m, &cfg, &o) == 0);
    mw_gpt2_init_weights(&m, 17);
    uint64_t s = 11;
    /* Larger weights and non-trivial LayerNorm/bias values so that every path matters. */
    for (int i = 0; i < m.n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m.tensors[i];
        for (size_t j = 0; j < t->numel; j++) {
            float *p = &m.params[t->offset + j];
            if (t->kind == MW_GPT2_WTE && j >= (size_t)cfg.vocab_size * 16) continue; /* padding stays 0 */
            *p = *p * 2.0f + 0.02f * tu_randf(&s);
        }
    }
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) { in[i] = (int32_t)(tu_rand(&s) % 13); tg[i] = (int32_t)(tu_rand(&s) % 13); }

    REQUIRE(mw_gpt2_forward(&m, in, tg, B, T) == 0);
    REQUIRE(mw_gpt2_backward(&m, 1.0f, NULL, NULL) == 0);
    float *g = malloc(m.sizes.grads_bytes);
    REQUIRE(g);
    memcpy(g, m.grads, m.sizes.grads_bytes);

    const double h = 3e-3;
    double worst = 0;
    int checked = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m.tensors[i];
        size_t n = t->kind == MW_GPT2_WTE ? (size_t)cfg.vocab_size * 16 : t->numel;
        size_t idx[4], best = 0;
        for (size_t j = 1; j < n; j++)
            if (fabsf(g[t->offset + j]) > fabsf(g[t->offset + best])) best = j;
        idx[0] = best;
        for (int k = 1; k < 4; k++) idx[k] = (size_t)(tu_rand(&s) % n);
        for (int k = 0; k < 4; k++) {
            size_t e = t->offset + idx[k];
            float p0 = m.params[e];
            m.params[e] = (float)(p0 + h);
            double lp = loss_d(&m, in, tg);
            m.params[e] = (float)(p0 - h);
            double lm = loss_d(&m, in, tg);
            m.params[e] = p0;
            double step = (double)(float)(p0 + h) - (double)(float)(p0 - h);
            double fd = (lp - lm) / step, an = g[e];
            double err = fabs(fd - an);
            double rel = err / (5e-5 + 5e-3 * fabs(an));
            if (rel > worst) worst = rel;
            checked++;
            CHECK_MSG(err <= 5e-5 + 5e-3 * fabs(an), "%s[%zu]: analytic %.6g, finite difference %.6g",
                      t->name, idx[k], an, fd);
        }
    }
    printf("%d elements checked over %d tensors; worst error / tolerance = %.3f\n", checked, m.n_tensors, worst);
    free(g);
    mw_gpt2_free(&m);
    TEST_END();
}
