/*
 * test_llama.c — the Llama family's own rules, on ragged sizes (no width a multiple of 8 or 16):
 *  - the fast path (sgemm) against the plain scalar reference, element by element: logits and
 *    every gradient, for a tied GQA model with q/k/v biases and llama3 rope, and an untied one;
 *  - the seam's rules (docs/model.md): units and tensors tile the flat array; what unit_order says
 *    is what each pass acquires (batch-major and layer-major); recomputation, thread count and
 *    the layer-major step (3 micro-batches) give the batch-major bits;
 *  - the config: checkpoint encoding round trip and hostile bytes, config.json refusals by key;
 *  - safetensors: save/load round trip, a unit at a time, a corrupt file leaves the weights alone.
 */
#include "memwall/llama.h"
#include "memwall/model.h"
#include "memwall/plan.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 3, T = 11, NMB = 3 };

static struct mw_llama_config ragged(int tied, int bias, int llama3)
{
    struct mw_llama_config c = {.n_layer = 2, .n_head = 6, .n_kv_head = 2, .head_dim = 6, .dim = 36, .ffn = 52,
                                .vocab = 83, .context = 13, .tied = tied, .qkv_bias = bias, .rms_eps = 1e-5f,
                                .rope_theta = 10000.0f};
    if (llama3) {
        c.rope_type = MW_LLAMA_ROPE_LLAMA3;
        c.rope_factor = 8.0f; c.rope_low = 1.0f; c.rope_high = 4.0f; c.rope_orig_ctx = 8;
    }
    return c;
}

static void tokens(int32_t *in, int32_t *tg, int n, int V, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(tu_rand(&seed) % (uint64_t)V);
        tg[i] = (int32_t)(tu_rand(&seed) % (uint64_t)V);
    }
}

static void mknet(struct mw_net *n, const struct mw_llama_config *c, int recompute, int nt)
{
    struct mw_net_config nc;
    mw_net_config_llama(&nc, c);
    struct mw_net_options o = {B, 0, recompute, nt};
    REQUIRE(mw_net_init(n, &nc, &o) == 0);
    mw_net_init_weights(n, 11);
    /* norms and biases away from 1 and 0, so their gradients matter */
    for (int i = 0; i < n->family->n_tensors(n); i++) {
        struct mw_net_tensor t;
        n->family->tensor(n, i, &t);
        if (t.ndim == 1)
            for (size_t j = 0; j < t.numel; j++) n->params[t.offset + j] += 0.1f * sinf((float)(j + 3 * i));
        else
            for (size_t j = 0; j < t.numel; j++) n->params[t.offset + j] *= 5.0f;
    }
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = isnan(d) ? INFINITY : d;
        mr = fmax(mr, fabs((double)b[i]));
    }
    return md / (mr > 0 ? mr : 1);
}

static void ref_vs_fast(const struct mw_llama_config *c, const char *what)
{
    struct mw_net f, r;
    mknet(&f, c, 0, 2);
    mknet(&r, c, 0, 2);
    mw_llama_set_reference(&r, 1);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, B * T, c->vocab, 5);
    mw_net_zero_grad(&f);
    mw_net_zero_grad(&r);
    REQUIRE(mw_net_forward(&f, in, tg, B, T) == 0 && mw_net_forward(&r, in, tg, B, T) == 0);
    double dl = rel_diff(mw_net_logits(&f), mw_net_logits(&r), (size_t)B * T * (size_t)c->vocab);
    CHECK_MSG(dl <= 1e-5, "%s: logits fast vs reference %.3g", what, dl);
    REQUIRE(mw_net_backward(&f, 1.0f, NULL, NULL) == 0 && mw_net_backward(&r, 1.0f, NULL, NULL) == 0);
    double worst = 0;
    for (int i = 0; i < f.family->n_tensors(&f); i++) {
        struct mw_net_tensor t;
        f.family->tensor(&f, i, &t);
        double d = rel_diff(f.grads + t.offset, r.grads + t.offset, t.numel);
        worst = fmax(worst, d);
        CHECK_MSG(d <= 1e-4, "%s: gradient %s fast vs reference %.3g", what, t.name, d);
    }
    printf("%s: fast vs reference: logits %.3g, worst gradient %.3g (relative to the tensor's max)\n", what, dl, worst);
    mw_net_free(&f);
    mw_net_free(&r);
}

struct seen { int n, units[128], backward[128]; };

static int on_unit(void *user, int event, int unit, int backward)
{
    struct seen *s = user;
    if (event == MW_NET_UNIT_ACQUIRE) {
        if (s->n < 128) { s->units[s->n] = unit; s->backward[s->n] = backward; }
        s->n++;
    }
    return 0;
}

static void check_order(const struct mw_net *n, const struct seen *s, int lm, const char *what)
{
    for (int pass = 0; pass < 2; pass++) {
        int got[128], want[128], ng = 0;
        for (int i = 0; i < s->n && i < 128; i++)
            if (s->backward[i] == pass) got[ng++] = s->units[i];
        int nw = mw_net_unit_order(n, pass ? MW_NET_BACKWARD : MW_NET_FORWARD, lm, want, 128);
        CHECK_MSG(ng == nw && !memcmp(got, want, (size_t)ng * sizeof *got), "%s %s %s: acquired %d units, the order says %d",
                  what, lm ? "layer-major" : "batch-major", pass ? "backward" : "forward", ng, nw);
    }
}

/* A step of NMB micro-batches, batch-major through forward/backward (rec: recomputation, nt threads). */
static void step_bm(struct mw_net *n, const int32_t *in, const int32_t *tg, float *losses, struct seen *s)
{
    mw_net_zero_grad(n);
    for (int k = 0; k < NMB; k++) {
        if (s) memset(s, 0, sizeof *s);
        REQUIRE(mw_net_forward(n, in + k * B * T, tg + k * B * T, B, T) == 0);
        losses[k] = n->loss;
        REQUIRE(mw_net_accum_set(n, k, NMB) == 0);
        REQUIRE(mw_net_backward(n, 1.0f / NMB, NULL, NULL) == 0);
    }
}

static void seam_rules(const struct mw_llama_config *c, const char *what)
{
    struct mw_net n, r, t1, lm;
    mknet(&n, c, 0, 2);
    mknet(&r, c, 1, 2);
    mknet(&t1, c, 0, 1);
    mknet(&lm, c, 0, 2);
    int32_t in[NMB * B * T], tg[NMB * B * T];
    tokens(in, tg, NMB * B * T, c->vocab, 9);
    float l0[NMB], l1[NMB], l2[NMB], l3[NMB];
    struct seen s;
    mw_net_set_weights_hook(&n, on_unit, &s);
    step_bm(&n, in, tg, l0, &s);
    check_order(&n, &s, 0, what); /* the last micro-batch's passes */
    step_bm(&r, in, tg, l1, NULL);
    step_bm(&t1, in, tg, l2, NULL);
    CHECK_MSG(!memcmp(l0, l1, sizeof l0) && !memcmp(n.grads, r.grads, n.sizes.grads_bytes), "%s: recompute changes bits", what);
    CHECK_MSG(!memcmp(l0, l2, sizeof l0) && !memcmp(n.grads, t1.grads, n.sizes.grads_bytes), "%s: 1 thread changes bits", what);
    memset(&s, 0, sizeof s);
    mw_net_set_weights_hook(&lm, on_unit, &s);
    mw_net_zero_grad(&lm);
    REQUIRE(mw_net_step_layer_major(&lm, NMB, in, tg, B, T, 1.0f / NMB, NULL, l3) == 0);
    check_order(&lm, &s, 1, what);
    CHECK_MSG(!memcmp(l0, l3, sizeof l0), "%s: layer-major losses differ", what);
    CHECK_MSG(!memcmp(n.grads, lm.grads, n.sizes.grads_bytes), "%s: layer-major gradients differ from batch-major", what);

    /* units and tensors tile the flat array */
    size_t next = 0;
    for (int u = 0; u < n.n_units; u++) {
        size_t first, cnt;
        REQUIRE(mw_net_unit_range(&n, u, &first, &cnt) == 0);
        CHECK(first == next && cnt > 0);
        next = first + cnt;
    }
    CHECK(next == n.sizes.n_params && n.n_units == c->n_layer + 2);
    next = 0;
    for (int i = 0; i < n.family->n_tensors(&n); i++) {
        struct mw_net_tensor t;
        n.family->tensor(&n, i, &t);
        CHECK(t.offset == next && t.numel == t.shape[0] * t.shape[1]);
        next = t.offset + t.numel;
    }
    CHECK(next == n.sizes.n_params);
    /* the planner's description counts the same parameters */
    struct mw_model d;
    struct mw_param_count pc;
    n.family->config_describe(n.cfg.raw, &d);
    mw_model_count(&d, &pc);
    CHECK_MSG(pc.total == n.sizes.n_params, "%s: the planner counts %llu parameters, the model has %zu", what,
              (unsigned long long)pc.total, n.sizes.n_params);
    mw_net_free(&n);
    mw_net_free(&r);
    mw_net_free(&t1);
    mw_net_free(&lm);
}

static void config_rules(void)
{
    const struct mw_net_family *f = mw_net_family_find("llama");
    REQUIRE(f && mw_net_family_by_id(f->id) == f && f->id != 0);
    struct mw_llama_config c = ragged(0, 1, 1), d;
    uint8_t w[MW_NET_CONFIG_WIRE];
    f->config_encode(&c, w);
    CHECK(f->config_decode(w, &d) == 0 && !memcmp(&c, &d, sizeof c));
    uint8_t h[MW_NET_CONFIG_WIRE];
    memcpy(h, w, sizeof h); h[4 + 4 * 2] = 5; /* 6 heads over 5 kv heads */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); h[7] = 0x80;      /* layers 2^31 */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); h[0] = 9;         /* version */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); h[120] = 1;       /* past the fields */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); memset(h + 4 + 4 * 12, 0xff, 4); /* eps NaN */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);

    const char *base = "{\"model_type\":\"llama\",\"hidden_size\":36,\"intermediate_size\":52,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":6,\"num_key_value_heads\":2,\"vocab_size\":83,"
                       "\"max_position_embeddings\":13,\"rms_norm_eps\":1e-5";
    struct { const char *tail; const char *key; } bad[] = {
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", "yarn"},
        {",\"mlp_bias\":true}", "mlp_bias"},
        {",\"attention_bias\":true}", "attention_bias"},
        {",\"use_sliding_window\":true}", "use_sliding_window"},
        {",\"num_local_experts\":8}", "num_local_experts"},
        {",\"hidden_act\":\"gelu\"}", "hidden_act"},
        {",\"layer_types\":[\"sliding_attention\",\"full_attention\"]}", "layer_types"},
        {",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8}}", "low_freq_factor"},
    };
    char txt[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(txt, sizeof txt, "%s%s", base, bad[i].tail);
        CHECK_MSG(mw_llama_config_parse(txt, strlen(txt), "config.json", &d) == MW_EFORMAT &&
                  strstr(mw_error_msg(), bad[i].key), "%s: not refused by its key: %s", bad[i].tail, mw_error_msg());
    }
    snprintf(txt, sizeof txt, "%s}", base);
    CHECK(mw_llama_config_parse(txt, strlen(txt), "config.json", &d) == 0 && d.head_dim == 6 && !d.tied && !d.qkv_bias &&
          d.rope_theta == 10000.0f);
    const char *mistral = "{\"model_type\":\"mistral\",\"hidden_size\":36}";
    CHECK(mw_llama_config_parse(mistral, strlen(mistral), "config.json", &d) == MW_EFORMAT &&
          strstr(mw_error_msg(), "mistral"));
    const char *q = "{\"model_type\":\"qwen2\",\"hidden_size\":36,\"intermediate_size\":52,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":6,\"num_key_value_heads\":2,\"vocab_size\":83,\"max_position_embeddings\":13,"
                    "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0},\"tie_word_embeddings\":true}";
    CHECK(mw_llama_config_parse(q, strlen(q), "config.json", &d) == 0 && d.qkv_bias && d.tied && d.rope_theta == 1e6f);
    CHECK(mw_llama_config_parse("[1]", 3, "config.json", &d) == MW_EFORMAT);
    CHECK(mw_llama_config_parse("{\"model_type\":\"llama\"", 21, "config.json", &d) == MW_EFORMAT);
}

static void files(const struct mw_llama_config *c, const char *dir)
{
    struct mw_net a, b;
    mknet(&a, c, 0, 2);
    mknet(&b, c, 0, 2);
    mw_net_init_weights(&b, 99);
    char path[700];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    REQUIRE(mw_net_save_safetensors_units(&a, path, NULL, NULL) == 0);
    REQUIRE(mw_net_load_safetensors(&b, path) == 0);
    CHECK(!memcmp(a.params, b.params, a.sizes.params_bytes));
    mw_net_init_weights(&b, 99);
    void *l;
    REQUIRE(b.family->loader_open(&l, &b, path) == 0);
    for (int u = b.n_units - 1; u >= 0; u--) CHECK(b.family->loader_unit(l, &b, u) == 0);
    b.family->loader_close(l);
    CHECK(!memcmp(a.params, b.params, a.sizes.params_bytes));
    /* a NaN in the last tensor: refused, nothing written */
    mw_net_init_weights(&b, 99);
    float *keep = malloc(b.sizes.params_bytes);
    REQUIRE(keep);
    memcpy(keep, b.params, b.sizes.params_bytes);
    FILE *f = fopen(path, "r+b");
    REQUIRE(f && !fseek(f, -4, SEEK_END));
    uint32_t nan = 0x7fc00000u;
    REQUIRE(fwrite(&nan, 4, 1, f) == 1);
    fclose(f);
    CHECK(mw_net_load_safetensors(&b, path) == MW_EFORMAT);
    CHECK(!memcmp(keep, b.params, b.sizes.params_bytes));
    /* a model of another shape is refused at open */
    struct mw_llama_config o = *c;
    o.ffn += 1;
    struct mw_net x;
    mknet(&x, &o, 0, 1);
    CHECK(mw_net_load_safetensors(&x, path) == MW_EFORMAT && strstr(mw_error_msg(), "mlp"));
    free(keep);
    mw_net_free(&x);
    mw_net_free(&a);
    mw_net_free(&b);
}

int main(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tu_scratch_dir("llama"));
    struct mw_llama_config tied = ragged(1, 1, 1), untied = ragged(0, 0, 0);
    ref_vs_fast(&tied, "tied+bias+llama3");
    ref_vs_fast(&untied, "untied");
    seam_rules(&tied, "tied+bias+llama3");
    seam_rules(&untied, "untied");
    config_rules();
    files(&tied, dir);
    files(&untied, dir);
    tu_rm_rf(dir);
    TEST_END();
}
