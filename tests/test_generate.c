/*
 * test_generate.c — incremental decoding with the KV cache and the sampling loop
 * (memwall/generate.h, the families' kv_init / decode / kv_free).
 *
 * For each model — the three Llama-family fixtures of tests/fixtures/llama/ (grouped heads with
 * a tied head, Qwen2 with q/k/v biases, llama3 rope with an untied head), a synthetic Llama with
 * one kv head for four query heads and q/k/v biases, and a GPT-2 from mw_gpt2_config — and for
 * the scalar reference and the fast path:
 *   1. the cache's logits at every position equal the full forward's (mw_net_forward over the
 *      sequence, mw_net_logits), max |diff| <= 1e-5: one token at a time from position 0, a
 *      prefill then one at a time, and a prefill longer than a decode chunk (64 rows) in one call;
 *   2. greedy generation equals the argmax of repeated full forwards;
 *   3. a seeded sampled generation is reproducible, top_k = 1 and a tiny top_p equal greedy, an
 *      eos token stops after itself, the context stops with MW_GEN_STOP_CONTEXT, a prompt longer
 *      than the context is refused;
 * plus the sampler alone (frequencies, top-k and top-p cuts) and -ENOTSUP for a family without a
 * cache.
 */
#include "memwall/generate.h"
#include "memwall/gpt2.h"
#include "memwall/llama.h"
#include "memwall/model.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5

static double worst_diff; /* over every model and pattern, for the report line */

static void open_fixture(struct mw_net *m, const char *name)
{
    const char *src = getenv("MW_SOURCE_DIR");
    char dir[1024], wpath[1200], note[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/llama/%s", src ? src : ".", name);
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    const struct mw_net_family *fam = NULL;
    REQUIRE(mw_net_family_for_hf(dir, &fam) == 0 && fam);
    struct mw_net_config cfg = {fam, {0}};
    struct mw_net_shape none = {0};
    int err = fam->config_from_file(wpath, &none, cfg.raw, note, sizeof note);
    if (err) fprintf(stderr, "%s: %s\n", name, mw_error_msg());
    REQUIRE(err == 0);
    struct mw_net_options o = {.max_batch = 1, .max_seq = 0, .recompute = 0, .n_threads = 2};
    REQUIRE(mw_net_init(m, &cfg, &o) == 0);
    err = mw_net_load_safetensors(m, wpath);
    if (err) fprintf(stderr, "%s: %s\n", name, mw_error_msg());
    REQUIRE(err == 0);
}

static void noise(struct mw_net *m, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < m->sizes.n_params; i++) m->params[i] += 0.05f * tu_randf(&s);
}

static void open_llama_synth(struct mw_net *m)
{
    struct mw_llama_config c = {.n_layer = 2, .n_head = 4, .n_kv_head = 1, .head_dim = 8, .dim = 24, .ffn = 40,
                                .vocab = 53, .context = 160, .tied = 0, .qkv_bias = 1, .rope_type = MW_LLAMA_ROPE_DEFAULT,
                                .rms_eps = 1e-6f, .rope_theta = 10000.0f};
    struct mw_net_config cfg;
    mw_net_config_llama(&cfg, &c);
    struct mw_net_options o = {.max_batch = 1, .max_seq = 0, .recompute = 0, .n_threads = 2};
    REQUIRE(mw_net_init(m, &cfg, &o) == 0);
    mw_net_init_weights(m, 7);
    noise(m, 11); /* biases and norms away from their 0 / 1 start */
}

static void open_gpt2(struct mw_net *m)
{
    struct mw_gpt2_config g = {.n_layer = 2, .n_head = 4, .n_embd = 32, .max_seq_len = 160, .vocab_size = 257,
                               .padded_vocab_size = mw_gpt2_padded_vocab(257)};
    struct mw_net_config cfg;
    mw_net_config_gpt2(&cfg, &g);
    struct mw_net_options o = {.max_batch = 1, .max_seq = 0, .recompute = 0, .n_threads = 2};
    REQUIRE(mw_net_init(m, &cfg, &o) == 0);
    mw_net_init_weights(m, 5);
    noise(m, 13);
}

static void set_ref(struct mw_net *m, int ref)
{
    if (!strcmp(m->family->name, "llama")) mw_llama_set_reference(m, ref);
}

/* The full forward's logits of seq[0..T) (row stride padded_vocab) into full[T][V]. */
static void full_logits(struct mw_net *m, const int32_t *seq, int T, float *full)
{
    REQUIRE(mw_net_forward(m, seq, NULL, 1, T) == 0);
    const float *lg = mw_net_logits(m);
    for (int t = 0; t < T; t++)
        memcpy(full + (size_t)t * (size_t)m->vocab, lg + (size_t)t * (size_t)m->padded_vocab, (size_t)m->vocab * sizeof(float));
}

static double maxdiff(const float *a, const float *b, int n)
{
    double d = 0.0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

/* Decodes seq[0..T) with a prefill of `pre` tokens, then one at a time; the worst difference. */
static double cache_vs_full(struct mw_net *m, const int32_t *seq, int T, int pre, const float *full)
{
    int V = m->vocab;
    void *kv = NULL;
    float *lg = malloc((size_t)V * sizeof(float));
    REQUIRE(lg && mw_net_kv_init(m, T, &kv) == 0);
    double worst = 0.0;
    REQUIRE(mw_net_decode(m, kv, seq, pre, 0, lg) == 0);
    worst = fmax(worst, maxdiff(lg, full + (size_t)(pre - 1) * (size_t)V, V));
    for (int t = pre; t < T; t++) {
        REQUIRE(mw_net_decode(m, kv, seq + t, 1, t, lg) == 0);
        worst = fmax(worst, maxdiff(lg, full + (size_t)t * (size_t)V, V));
    }
    /* Past the cache, and at a position that is not the cache's length: refused. */
    if (T < m->context) CHECK(mw_net_decode(m, kv, seq, 1, T, lg) == -EINVAL);
    CHECK(mw_net_decode(m, kv, seq, 1, 0, lg) == -EINVAL);
    int32_t bad = m->vocab;
    CHECK(mw_net_decode(m, kv, &bad, 1, T, lg) == -EINVAL);
    mw_net_kv_free(m, kv);
    free(lg);
    return worst;
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

static void check_generation(struct mw_net *m, const char *name)
{
    int V = m->vocab, ctx = m->context, np = 3, N = MW_MIN(12, ctx - np);
    int32_t prompt[3] = {1 % V, 5 % V, 2 % V};
    struct mw_gen_params gp;
    mw_gen_params_default(&gp);
    gp.max_new_tokens = N;
    gp.temperature = 0.0f;
    int32_t *greedy = calloc((size_t)N, sizeof(int32_t)), *b = calloc((size_t)N, sizeof(int32_t));
    int32_t *seq = calloc((size_t)ctx + 1, sizeof(int32_t));
    REQUIRE(greedy && b && seq);
    struct mw_gen_result r;
    REQUIRE(mw_net_generate(m, prompt, np, &gp, NULL, NULL, greedy, &r) == 0);
    CHECK_EQ_INT(r.n_new, N);
    CHECK_EQ_INT(r.stop, MW_GEN_STOP_LENGTH);
    /* 2. the argmax of repeated full forwards */
    memcpy(seq, prompt, sizeof prompt);
    int same = 1;
    for (int i = 0; i < N; i++) {
        REQUIRE(mw_net_forward(m, seq, NULL, 1, np + i) == 0);
        seq[np + i] = argmax(mw_net_logits(m) + (size_t)(np + i - 1) * (size_t)m->padded_vocab, V);
        same &= seq[np + i] == greedy[i];
    }
    CHECK_MSG(same, "%s: greedy generation differs from the full forwards' argmax", name);
    /* 3. seeded sampling: reproducible; top_k = 1 and a tiny top_p are greedy */
    gp.temperature = 0.9f;
    gp.seed = 1234;
    REQUIRE(mw_net_generate(m, prompt, np, &gp, NULL, NULL, b, &r) == 0);
    int32_t *c = calloc((size_t)N, sizeof(int32_t));
    REQUIRE(c && mw_net_generate(m, prompt, np, &gp, NULL, NULL, c, &r) == 0);
    CHECK_MSG(!memcmp(b, c, (size_t)N * sizeof(int32_t)), "%s: a seeded generation is not reproducible", name);
    gp.top_k = 1;
    REQUIRE(mw_net_generate(m, prompt, np, &gp, NULL, NULL, c, &r) == 0);
    CHECK_MSG(!memcmp(greedy, c, (size_t)N * sizeof(int32_t)), "%s: top_k=1 is not greedy", name);
    gp.top_k = 0;
    gp.top_p = 1e-6f;
    REQUIRE(mw_net_generate(m, prompt, np, &gp, NULL, NULL, c, &r) == 0);
    CHECK_MSG(!memcmp(greedy, c, (size_t)N * sizeof(int32_t)), "%s: top_p=1e-6 is not greedy", name);
    /* eos: stops after itself */
    gp.top_p = 1.0f;
    gp.temperature = 0.0f;
    gp.eos = greedy[1];
    int stop_at = greedy[0] == gp.eos ? 1 : 2;
    REQUIRE(mw_net_generate(m, prompt, np, &gp, NULL, NULL, c, &r) == 0);
    CHECK_EQ_INT(r.n_new, stop_at);
    CHECK_EQ_INT(r.stop, MW_GEN_STOP_EOS);
    gp.eos = -1;
    /* the context: prompt + generated = context at most */
    int lp = ctx - 2;
    for (int i = 0; i < lp; i++) seq[i] = (int32_t)((i * 7 + 3) % V);
    gp.max_new_tokens = 10;
    REQUIRE(mw_net_generate(m, seq, lp, &gp, NULL, NULL, c, &r) == 0);
    CHECK_EQ_INT(r.n_new, 2);
    CHECK_EQ_INT(r.stop, MW_GEN_STOP_CONTEXT);
    CHECK(mw_net_generate(m, seq, ctx + 1, &gp, NULL, NULL, c, &r) == -EINVAL);
    CHECK(mw_net_generate(m, seq, 0, &gp, NULL, NULL, c, &r) == -EINVAL);
    gp.top_p = 0.0f;
    CHECK(mw_net_generate(m, prompt, np, &gp, NULL, NULL, c, &r) == -EINVAL);
    free(greedy); free(b); free(c); free(seq);
}

static void check_model(struct mw_net *m, const char *name)
{
    int T = m->context < 150 ? m->context : 150, V = m->vocab;
    int32_t *seq = malloc((size_t)T * sizeof(int32_t));
    float *full = malloc((size_t)T * (size_t)V * sizeof(float));
    REQUIRE(seq && full);
    uint64_t s = 99;
    for (int t = 0; t < T; t++) seq[t] = (int32_t)(tu_rand(&s) % (uint64_t)V);
    for (int ref = 1; ref >= 0; ref--) {
        set_ref(m, ref);
        full_logits(m, seq, T, full);
        double d1 = cache_vs_full(m, seq, T, 1, full);
        double d2 = cache_vs_full(m, seq, T, 5, full);
        double d3 = cache_vs_full(m, seq, T, T - 1, full); /* > 64 rows: chunked prefill when T > 65 */
        double d = fmax(d1, fmax(d2, d3));
        worst_diff = fmax(worst_diff, d);
        printf("%-16s %s T=%3d  max|cache - full| one-by-one %.2e  prefill 5 %.2e  prefill %d %.2e\n", name,
               ref ? "ref " : "fast", T, d1, d2, T - 1, d3);
        CHECK_MSG(d <= TOL, "%s (%s): max |cache - full| = %.3e > %.0e", name, ref ? "ref" : "fast", d, TOL);
    }
    check_generation(m, name);
    free(seq);
    free(full);
}

static void check_sampler(void)
{
    struct mw_gen_params p;
    mw_gen_params_default(&p);
    float lg[4] = {logf(0.5f), logf(0.3f), logf(0.2f), -INFINITY};
    void *scratch = malloc(mw_gen_scratch_bytes(4));
    REQUIRE(scratch);
    uint64_t rng = 42;
    int cnt[4] = {0}, n = 40000;
    for (int i = 0; i < n; i++) cnt[mw_gen_pick(lg, 4, &p, &rng, scratch)]++;
    CHECK(fabs(cnt[0] / (double)n - 0.5) < 0.015 && fabs(cnt[1] / (double)n - 0.3) < 0.015 && cnt[3] == 0);
    p.top_k = 2;
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < n; i++) cnt[mw_gen_pick(lg, 4, &p, &rng, scratch)]++;
    CHECK(cnt[2] == 0 && cnt[3] == 0 && fabs(cnt[0] / (double)n - 0.625) < 0.015);
    p.top_k = 0;
    p.top_p = 0.75f; /* 0.5 + 0.3 reaches it: two tokens */
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < n; i++) cnt[mw_gen_pick(lg, 4, &p, &rng, scratch)]++;
    CHECK(cnt[2] == 0 && cnt[3] == 0 && cnt[1] > 0);
    p.top_p = 0.4f;
    for (int i = 0; i < 100; i++) CHECK_EQ_INT(mw_gen_pick(lg, 4, &p, &rng, scratch), 0);
    float tie[3] = {1.0f, 3.0f, 3.0f}; /* greedy: the lower id of a tie, as top_k = 1 */
    p.temperature = 0.0f;
    CHECK_EQ_INT(mw_gen_pick(tie, 3, &p, &rng, scratch), 1);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.top_k = 1;
    CHECK_EQ_INT(mw_gen_pick(tie, 3, &p, &rng, scratch), 1);
    free(scratch);
}

int main(void)
{
    check_sampler();
    const char *fixtures[] = {"llama_gqa_tied", "qwen2_bias", "llama3_untied"};
    for (int i = 0; i < 3; i++) {
        struct mw_net m;
        open_fixture(&m, fixtures[i]);
        check_model(&m, fixtures[i]);
        mw_net_free(&m);
    }
    struct mw_net m;
    open_llama_synth(&m);
    check_model(&m, "llama_synth_gqa");
    mw_net_free(&m);
    open_gpt2(&m);
    check_model(&m, "gpt2");
    /* A family without a cache: -ENOTSUP, nothing allocated. */
    struct mw_net_family bare = *m.family;
    bare.kv_init = NULL;
    bare.decode = NULL;
    bare.kv_free = NULL;
    struct mw_net fake = m;
    fake.family = &bare;
    void *kv = (void *)&fake;
    CHECK(mw_net_kv_init(&fake, 4, &kv) == -ENOTSUP && kv == NULL);
    mw_net_kv_free(&fake, NULL);
    mw_net_free(&m);
    printf("worst max |cache - full| over every model: %.3e (tolerance %.0e)\n", worst_diff, TOL);
    TEST_END();
}
