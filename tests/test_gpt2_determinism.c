/*
 * test_gpt2_determinism.c — bitwise reproducibility and the backward contract.
 *  - two models built and run the same way: bitwise equal loss, logits and gradients;
 *  - recomputation on vs off: bitwise equal gradients, and fewer activation bytes;
 *  - gradient accumulation: two backward passes with grad_scale 0.5 == one with 1.0 up to the
 *    rounding of adding into non-zero gradients (rows of wte/wpe are summed straight into the
 *    array, so (g + a + b) + a + b is not bitwise 2(a + b)): max diff <= 1e-5 * max |g|;
 *  - accumulation over 3 micro-batches with mw_gpt2_accum_set == the layer-major step, bitwise;
 *  - grad-ready callback: order ln_f, h.L-1 .. h.0, embeddings; the ranges tile the gradient
 *    array exactly once; and each range is already final when reported (a snapshot taken in the
 *    callback equals the gradients after backward);
 *  - misuse is refused with -EINVAL (backward without forward, token out of range, B too big).
 */
#include "memwall/gpt2.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>

static const struct mw_gpt2_config cfg = {.n_layer = 3, .n_head = 4, .n_embd = 64, .max_seq_len = 32,
                                          .vocab_size = 101, .padded_vocab_size = 128};
enum { B = 3, T = 32 };

struct rec {
    int n;
    size_t first[64], count[64];
    float *snap;
};

static void on_ready(size_t first, size_t n, void *user)
{
    struct rec *r = user;
    if (r->n < 64) { r->first[r->n] = first; r->count[r->n] = n; }
    r->n++;
    /* Snapshot the range now: if anything still adds to it later, the final compare fails. */
    extern float *g_grads;
    memcpy(r->snap + first, g_grads + first, n * sizeof(float));
}
float *g_grads;

/* Kept activations in memory (what the streaming trainer does through NVMe): a slot per
 * (layer, micro-batch); DONE poisons the slot so that a second use shows. */
struct keep {
    float **slot;
    int nmb, fills, gets;
    size_t bytes;
};

static int keep_acts(void *user, int event, int layer, int mb, float **buf)
{
    struct keep *k = user;
    float *s = k->slot[layer * k->nmb + mb];
    if (event == MW_GPT2_ACTS_FILL) { *buf = s; k->fills++; }
    if (event == MW_GPT2_ACTS_GET) { *buf = s; k->gets++; }
    if (event == MW_GPT2_ACTS_DONE) memset(s, 0xff, k->bytes);
    return 0;
}

static void make(struct mw_gpt2 *m, int recompute, int nt)
{
    struct mw_gpt2_options o = {.max_batch = B, .max_seq = T, .recompute = recompute, .n_threads = nt};
    REQUIRE(mw_gpt2_init(m, &cfg, &o) == 0);
    mw_gpt2_init_weights(m, 99);
    /* Larger than GPT-2's init so that every path carries visible signal. */
    for (size_t i = 0; i < m->sizes.n_params; i++) m->params[i] *= 3.0f;
}

static int step(struct mw_gpt2 *m, const int32_t *in, const int32_t *tg, float scale)
{
    int rc = mw_gpt2_forward(m, in, tg, B, T);
    return rc ? rc : mw_gpt2_backward(m, scale, NULL, NULL);
}

int main(void)
{
    int32_t in[B * T], tg[B * T];
    uint64_t s = 3;
    for (int i = 0; i < B * T; i++) { in[i] = (int32_t)(tu_rand(&s) % 101); tg[i] = (int32_t)(tu_rand(&s) % 101); }

    struct mw_gpt2 a, b, r;
    make(&a, 0, 2);
    make(&b, 0, 2);
    make(&r, 1, 2);
    size_t nb = a.sizes.grads_bytes;

    /* Run to run. */
    REQUIRE(step(&a, in, tg, 1.0f) == 0 && step(&b, in, tg, 1.0f) == 0);
    CHECK(a.loss == b.loss && isfinite(a.loss));
    float loss0 = a.loss;
    CHECK(!memcmp(a.grads, b.grads, nb));
    REQUIRE(mw_gpt2_forward(&a, in, NULL, B, T) == 0 && mw_gpt2_forward(&b, in, NULL, B, T) == 0);
    CHECK(!memcmp(mw_gpt2_logits(&a), mw_gpt2_logits(&b), (size_t)B * T * 128 * sizeof(float)));

    /* Recompute on/off. */
    REQUIRE(step(&r, in, tg, 1.0f) == 0);
    CHECK(r.loss == loss0);
    CHECK_MSG(!memcmp(r.grads, b.grads, nb), "recompute changes the gradients");
    CHECK(r.sizes.acts_bytes < r.sizes.acts_bytes_full && r.sizes.acts_bytes_full == b.sizes.acts_bytes);
    printf("activations: %zu bytes, %zu with recompute\n", b.sizes.acts_bytes, r.sizes.acts_bytes);

    /* Accumulation: 0.5 + 0.5 == 1.0 bitwise; and the same model again after zero_grad. */
    mw_gpt2_zero_grad(&a);
    REQUIRE(step(&a, in, tg, 0.5f) == 0 && step(&a, in, tg, 0.5f) == 0);
    double md = 0, mg = 0;
    for (size_t i = 0; i < a.sizes.n_params; i++) {
        double d = fabs((double)a.grads[i] - b.grads[i]);
        md = d > md || isnan(d) ? d : md;
        mg = fabs(b.grads[i]) > mg ? fabs(b.grads[i]) : mg;
    }
    printf("accumulation 0.5 + 0.5 vs 1.0: max diff %.3g, max |g| %.3g\n", md, mg);
    CHECK_MSG(md <= 1e-5 * mg && mg > 0, "two half-scaled micro-batches differ from one full: %g", md);
    mw_gpt2_zero_grad(&r);
    REQUIRE(step(&r, in, tg, 1.0f) == 0);
    CHECK(!memcmp(r.grads, b.grads, nb));

    /* Grad-ready callback. */
    struct rec rc = {0};
    rc.snap = calloc(a.sizes.n_params, sizeof(float));
    REQUIRE(rc.snap);
    g_grads = r.grads;
    mw_gpt2_zero_grad(&r);
    REQUIRE(mw_gpt2_forward(&r, in, tg, B, T) == 0);
    REQUIRE(mw_gpt2_backward(&r, 1.0f, on_ready, &rc) == 0);
    CHECK_EQ_INT(rc.n, cfg.n_layer + 2);
    CHECK(rc.first[0] == mw_gpt2_find_tensor(&r, "ln_f.weight")->offset && rc.count[0] == 2 * 64);
    for (int l = cfg.n_layer - 1, k = 1; l >= 0; l--, k++) {
        char nm[48];
        snprintf(nm, sizeof nm, "h.%d.ln_1.weight", l);
        CHECK_MSG(rc.first[k] == mw_gpt2_find_tensor(&r, nm)->offset, "call %d is not block %d", k, l);
    }
    CHECK(rc.first[rc.n - 1] == 0);
    size_t covered = 0;
    for (int i = 0; i < rc.n; i++) covered += rc.count[i];
    /* Tiling: sorted by offset the ranges are back to back from 0 to n_params. */
    size_t pos = 0;
    for (int pass = 0; pass < rc.n; pass++)
        for (int i = 0; i < rc.n; i++)
            if (rc.first[i] == pos) { pos += rc.count[i]; break; }
    CHECK(covered == r.sizes.n_params && pos == r.sizes.n_params);
    CHECK_MSG(!memcmp(rc.snap, r.grads, nb), "a range changed after it was reported final");
    CHECK(!memcmp(r.grads, b.grads, nb));

    /* Accumulation over 3 micro-batches (mw_gpt2_accum_set: wte takes every head share, then the
     * lookups) == the layer-major step, bitwise, losses and gradients; and the same sums as the
     * eager order (lookup after each head share) up to rounding. */
    {
        enum { NMB = 3 };
        int32_t in3[NMB * B * T], tg3[NMB * B * T];
        for (int i = 0; i < NMB * B * T; i++) { in3[i] = (int32_t)(tu_rand(&s) % 101); tg3[i] = (int32_t)(tu_rand(&s) % 101); }
        struct mw_gpt2 bm, lm, ea;
        make(&bm, 1, 2);
        make(&lm, 1, 2);
        make(&ea, 1, 2);
        float bl[NMB], ll[NMB];
        for (int k = 0; k < NMB; k++) {
            REQUIRE(mw_gpt2_forward(&bm, in3 + k * B * T, tg3 + k * B * T, B, T) == 0);
            bl[k] = bm.loss;
            REQUIRE(mw_gpt2_accum_set(&bm, k, NMB) == 0);
            REQUIRE(mw_gpt2_backward(&bm, 1.0f / NMB, NULL, NULL) == 0);
            REQUIRE(step(&ea, in3 + k * B * T, tg3 + k * B * T, 1.0f / NMB) == 0);
        }
        REQUIRE(mw_gpt2_step_layer_major(&lm, NMB, in3, tg3, B, T, 1.0f / NMB, NULL, ll) == 0);
        CHECK(!memcmp(bl, ll, sizeof bl));
        CHECK_MSG(!memcmp(bm.grads, lm.grads, nb), "layer-major gradients differ from batch-major's");
        /* The blocks' activations kept (not recomputed): the same bits. */
        struct keep kp = {.nmb = NMB, .bytes = mw_gpt2_act_slot_bytes(&lm)};
        REQUIRE((kp.slot = calloc((size_t)cfg.n_layer * NMB, sizeof *kp.slot)));
        for (int i = 0; i < cfg.n_layer * NMB; i++) REQUIRE((kp.slot[i] = aligned_alloc(4096, kp.bytes)));
        struct mw_gpt2_lm_calls kc = {.acts = keep_acts, .user = &kp};
        mw_gpt2_zero_grad(&lm);
        REQUIRE(mw_gpt2_step_layer_major(&lm, NMB, in3, tg3, B, T, 1.0f / NMB, &kc, ll) == 0);
        CHECK(kp.fills == cfg.n_layer * NMB && kp.gets == cfg.n_layer * NMB);
        CHECK(!memcmp(bl, ll, sizeof bl));
        CHECK_MSG(!memcmp(bm.grads, lm.grads, nb), "kept activations change the gradients");
        CHECK(mw_gpt2_lm_bytes(&lm, NMB, 1) < mw_gpt2_lm_bytes(&lm, NMB, 0));
        for (int i = 0; i < cfg.n_layer * NMB; i++) free(kp.slot[i]);
        free(kp.slot);
        /* ... and the model's own activations are its own again: a plain step still matches. */
        mw_gpt2_zero_grad(&lm);
        mw_gpt2_zero_grad(&r);
        REQUIRE(step(&lm, in, tg, 1.0f) == 0 && step(&r, in, tg, 1.0f) == 0);
        CHECK(!memcmp(lm.grads, r.grads, nb));
        size_t wte = mw_gpt2_find_tensor(&bm, "wte.weight")->offset;
        double d3 = 0, m3 = 0;
        for (size_t i = 0; i < bm.sizes.n_params; i++) {
            double d = fabs((double)bm.grads[i] - ea.grads[i]);
            d3 = d > d3 || isnan(d) ? d : d3;
            m3 = fabs(ea.grads[i]) > m3 ? fabs(ea.grads[i]) : m3;
        }
        printf("3 micro-batches, deferred lookups vs eager: max diff %.3g (max |g| %.3g)\n", d3, m3);
        CHECK(d3 <= 1e-5 * m3 && m3 > 0);
        CHECK_MSG(!memcmp(bm.grads + 64 * 128, ea.grads + 64 * 128, nb - 64 * 128 * sizeof(float)) && wte == 0,
                  "only wte's rows may differ between the two orders");
        CHECK(mw_gpt2_accum_set(&bm, 3, NMB) == -EINVAL && mw_gpt2_accum_set(&bm, -1, 2) == -EINVAL);
        /* A micro-batch of another shape inside one step is refused, not mixed up. */
        REQUIRE(mw_gpt2_accum_set(&bm, 0, 2) == 0);
        REQUIRE(mw_gpt2_forward(&bm, in3, tg3, B, T) == 0 && mw_gpt2_backward(&bm, 1.0f, NULL, NULL) == 0);
        REQUIRE(mw_gpt2_accum_set(&bm, 1, 2) == 0);
        REQUIRE(mw_gpt2_forward(&bm, in3, tg3, B - 1, T) == 0);
        CHECK(mw_gpt2_backward(&bm, 1.0f, NULL, NULL) == -EINVAL);
        mw_gpt2_free(&bm);
        mw_gpt2_free(&lm);
        mw_gpt2_free(&ea);
    }

    /* Thread count: our kernels are partitioned independently of it; OpenBLAS usually is too.
     * Reported, not asserted. */
    struct mw_gpt2 one;
    make(&one, 0, 1);
    REQUIRE(step(&one, in, tg, 1.0f) == 0);
    printf("1 thread vs 2 threads: gradients %s\n", memcmp(one.grads, b.grads, nb) ? "differ" : "bitwise equal");
    mw_gpt2_free(&one);

    /* Misuse. */
    CHECK(mw_gpt2_backward(&a, 1.0f, NULL, NULL) == -EINVAL); /* logits already consumed */
    int32_t badtok[B * T];
    memcpy(badtok, in, sizeof badtok);
    badtok[5] = 101;
    CHECK(mw_gpt2_forward(&a, badtok, tg, B, T) == -EINVAL);
    CHECK(mw_gpt2_backward(&a, 1.0f, NULL, NULL) == -EINVAL);
    CHECK(mw_gpt2_forward(&a, in, tg, B + 1, T) == -EINVAL);
    CHECK(mw_gpt2_forward(&a, in, tg, B, T + 1) == -EINVAL);
    struct mw_gpt2_config badc = cfg;
    badc.n_head = 5;
    struct mw_gpt2 x;
    struct mw_gpt2_options o = {.max_batch = 1};
    CHECK(mw_gpt2_init(&x, &badc, &o) == -EINVAL);

    free(rc.snap);
    mw_gpt2_free(&a);
    mw_gpt2_free(&b);
    mw_gpt2_free(&r);
    TEST_END();
}
