/*
 * llama_net.c — the Llama family as a model of the table (memwall/model.h): its config (checked,
 * described to the planner, kept in checkpoints, read from an HF config.json) and the table that
 * the trainer, checkpoints, streaming, ZeRO and the CLI call (the model itself: llama.c; files:
 * llama_safetensors.c).
 *
 * The checkpoint encoding (MW_NET_CONFIG_WIRE bytes, little-endian): u32 version (1), then the
 * twelve integers of struct mw_llama_config in declaration order, then its five floats as IEEE
 * bits; the rest zero. A decoded config passes config_check or is refused.
 */
#include "llama_internal.h"
#include "gpt2_internal.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/plan.h"
#include "safetensors.h"
#include "tensor_source.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

_Static_assert(sizeof(struct mw_llama_config) <= MW_NET_CONFIG_BYTES, "Llama's config fits mw_net_config.raw");

/* llama.c */
int llama_forward(struct mw_net *n, const int32_t *inputs, const int32_t *targets, int B, int T);
int llama_backward(struct mw_net *n, float grad_scale, mw_net_grad_ready_fn cb, void *user);
int llama_accum_set(struct mw_net *n, int index, int count);
size_t llama_defer_bytes(const struct mw_net *n, int count);
void llama_free(struct mw_net *n);
int llama_sizes(const void *cfg, const struct mw_net_options *o, struct mw_net_sizes *out);
int llama_init(struct mw_net *n, const struct mw_net_options *o);
int llama_unit_range(const struct mw_net *n, int unit, size_t *first, size_t *count);
void llama_init_weights(struct mw_net *n, uint64_t seed);
int llama_init_weights_unit(struct mw_net *n, uint64_t seed, int unit);
void llama_zero_grad(struct mw_net *n);

#define LIM (1 << 24)

int mw_llama_config_check(const struct mw_llama_config *c)
{
    if (c->n_layer < 1 || c->n_layer > 4096 || c->n_head < 1 || c->n_head > 4096 || c->n_kv_head < 1 ||
        c->n_head % c->n_kv_head || c->head_dim < 2 || c->head_dim % 2 || c->head_dim > 4096 || c->dim < 1 ||
        c->dim > LIM || c->ffn < 1 || c->ffn > LIM || c->vocab < 2 || c->vocab > LIM || c->context < 1 ||
        c->context > LIM || (c->tied != 0 && c->tied != 1) || (c->qkv_bias != 0 && c->qkv_bias != 1))
        return mw_error_set(-EINVAL, "llama config: L=%d heads=%d kv_heads=%d head_dim=%d width=%d ffn=%d vocab=%d "
                            "context=%d tied=%d qkv_bias=%d: a size is out of range, the kv heads do not divide the "
                            "heads, or the head width is odd", c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->dim,
                            c->ffn, c->vocab, c->context, c->tied, c->qkv_bias);
    /* Every tensor and the flat array stay far below 2^40 elements. */
    double np = (double)c->vocab * c->dim * (c->tied ? 1 : 2) +
                (double)c->n_layer * ((double)c->dim * c->head_dim * (2.0 * c->n_head + 2.0 * c->n_kv_head) + 3.0 * c->dim * c->ffn);
    if (np > 1e12) return mw_error_set(-EINVAL, "llama config: %.3g parameters is beyond what memwall sizes", np);
    if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f) || !(c->rope_theta > 1.0f && isfinite(c->rope_theta)))
        return mw_error_set(-EINVAL, "llama config: rms_norm_eps %g or rope_theta %g out of range", (double)c->rms_eps,
                            (double)c->rope_theta);
    if (c->rope_type == MW_LLAMA_ROPE_LLAMA3) {
        if (!(c->rope_factor >= 1.0f && c->rope_factor < 1e6f) || !(c->rope_low > 0.0f) ||
            !(c->rope_high > c->rope_low && c->rope_high < 1e6f) || c->rope_orig_ctx < 1 || c->rope_orig_ctx > LIM)
            return mw_error_set(-EINVAL, "llama config: llama3 rope scaling factor %g, low_freq_factor %g, "
                                "high_freq_factor %g, original_max_position_embeddings %d out of range",
                                (double)c->rope_factor, (double)c->rope_low, (double)c->rope_high, c->rope_orig_ctx);
    } else if (c->rope_type != MW_LLAMA_ROPE_DEFAULT) {
        return mw_error_set(-EINVAL, "llama config: rope type %d unknown", c->rope_type);
    }
    return 0;
}

static int config_check(const void *cfg) { return mw_llama_config_check(cfg); }

static void config_describe(const void *cfg, struct mw_model *d)
{
    const struct mw_llama_config *c = cfg;
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "llama L=%d C=%d", c->n_layer, c->dim);
    d->arch = MW_ARCH_LLAMA;
    d->n_layer = (uint64_t)c->n_layer;
    d->hidden = (uint64_t)c->dim;
    d->n_head = (uint64_t)c->n_head;
    d->n_kv_head = (uint64_t)c->n_kv_head;
    d->head_dim = (uint64_t)c->head_dim;
    d->ffn = (uint64_t)c->ffn;
    d->vocab = (uint64_t)c->vocab;
    d->max_pos = 0; /* rotary: no position rows */
    d->gated_mlp = 1;
    d->norm = MW_NORM_RMS;
    d->bias_qkv = c->qkv_bias;
    d->tied_embeddings = c->tied;
}

static void config_summary(const void *cfg, char *buf, size_t n)
{
    const struct mw_llama_config *c = cfg;
    snprintf(buf, n, "Llama L=%d heads=%d kv_heads=%d width=%d ffn=%d context=%d vocab=%d%s%s%s", c->n_layer, c->n_head,
             c->n_kv_head, c->dim, c->ffn, c->context, c->vocab, c->tied ? " tied" : " untied",
             c->qkv_bias ? " qkv_bias" : "", c->rope_type == MW_LLAMA_ROPE_LLAMA3 ? " rope=llama3" : "");
}

static void put32(uint8_t *b, uint32_t v) { for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *b) { uint32_t v = 0; for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i); return v; }
static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#define N_INTS 12
#define N_FLOATS 5

static void config_encode(const void *cfg, uint8_t w[MW_NET_CONFIG_WIRE])
{
    const struct mw_llama_config *c = cfg;
    int iv[N_INTS] = {c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->dim, c->ffn, c->vocab, c->context,
                      c->tied, c->qkv_bias, c->rope_type, c->rope_orig_ctx};
    float fv[N_FLOATS] = {c->rms_eps, c->rope_theta, c->rope_factor, c->rope_low, c->rope_high};
    memset(w, 0, MW_NET_CONFIG_WIRE);
    put32(w, 1);
    for (int i = 0; i < N_INTS; i++) put32(w + 4 + 4 * i, (uint32_t)iv[i]);
    for (int i = 0; i < N_FLOATS; i++) put32(w + 4 + 4 * N_INTS + 4 * i, fbits(fv[i]));
}

static int config_decode(const uint8_t w[MW_NET_CONFIG_WIRE], void *cfg)
{
    struct mw_llama_config *c = cfg;
    if (get32(w) != 1) return mw_error_set(MW_EFORMAT, "llama config: encoding version %u, this memwall reads 1", get32(w));
    for (size_t i = 4 + 4 * (N_INTS + N_FLOATS); i < MW_NET_CONFIG_WIRE; i++)
        if (w[i]) return mw_error_set(MW_EFORMAT, "llama config: byte %zu past the fields is not zero", i);
    uint32_t iv[N_INTS];
    for (int i = 0; i < N_INTS; i++)
        if ((iv[i] = get32(w + 4 + 4 * i)) > (1u << 30))
            return mw_error_set(MW_EFORMAT, "llama config: field %d is %u, out of range", i, iv[i]);
    struct mw_llama_config d = {(int)iv[0], (int)iv[1], (int)iv[2], (int)iv[3], (int)iv[4], (int)iv[5], (int)iv[6],
                                (int)iv[7], (int)iv[8], (int)iv[9], (int)iv[10], (int)iv[11], 0, 0, 0, 0, 0};
    float fv[N_FLOATS];
    for (int i = 0; i < N_FLOATS; i++) fv[i] = bitsf(get32(w + 4 + 4 * N_INTS + 4 * i));
    d.rms_eps = fv[0]; d.rope_theta = fv[1]; d.rope_factor = fv[2]; d.rope_low = fv[3]; d.rope_high = fv[4];
    int err = mw_llama_config_check(&d);
    if (err) return mw_error_set(MW_EFORMAT, "%s", mw_error_msg());
    *c = d;
    return 0;
}

static int config_from_shape(const struct mw_net_shape *sh, void *cfg)
{
    struct mw_llama_config *c = cfg;
    memset(c, 0, sizeof *c);
    c->n_layer = sh->layers;
    c->n_head = c->n_kv_head = sh->heads;
    c->dim = sh->width;
    c->head_dim = sh->heads > 0 ? sh->width / sh->heads : 0;
    if (c->head_dim * sh->heads != sh->width)
        return mw_error_set(-EINVAL, "llama: width %d is not a multiple of the head count %d", sh->width, sh->heads);
    c->ffn = (int)MW_ALIGN_UP((8 * (int64_t)sh->width) / 3, 16); /* Llama's 8/3 width, rounded */
    c->vocab = sh->vocab;
    c->context = sh->context;
    c->tied = 1;
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    return mw_llama_config_check(c);
}

static int config_from_model(const struct mw_model *d, int context, void *cfg)
{
    if (d->arch != MW_ARCH_LLAMA) return -ENOTSUP;
    const char *why = d->n_routed_experts ? "mixture of experts" : d->kv_lora_rank ? "latent attention"
                      : !d->gated_mlp || d->norm != MW_NORM_RMS ? "not a SwiGLU/RMSNorm block"
                      : d->bias_linear ? "biases on every linear" : NULL;
    if (why) return mw_error_set(-EINVAL, "%s: %s is not implemented in memwall's Llama family", d->name, why);
    uint64_t hd = d->head_dim ? d->head_dim : d->n_head ? d->hidden / d->n_head : 0;
    if (d->n_layer > (1u << 20) || d->n_head > (1u << 20) || d->n_kv_head > (1u << 20) || d->hidden > (1u << 20) ||
        hd > (1u << 20) || d->ffn > (1u << 24) || d->vocab > (1u << 30) || context <= 0)
        return mw_error_set(-EINVAL, "%s is larger than memwall's Llama family takes", d->name);
    struct mw_llama_config *c = cfg;
    memset(c, 0, sizeof *c);
    *c = (struct mw_llama_config){.n_layer = (int)d->n_layer, .n_head = (int)d->n_head,
                                  .n_kv_head = (int)(d->n_kv_head ? d->n_kv_head : d->n_head), .head_dim = (int)hd,
                                  .dim = (int)d->hidden, .ffn = (int)d->ffn, .vocab = (int)d->vocab, .context = context,
                                  .tied = d->tied_embeddings, .qkv_bias = d->bias_qkv, .rms_eps = 1e-5f,
                                  .rope_theta = 10000.0f}; /* RoPE's constants do not change sizes */
    return mw_llama_config_check(c);
}

static void config_shape(const void *cfg, struct mw_net_shape *sh)
{
    const struct mw_llama_config *c = cfg;
    *sh = (struct mw_net_shape){c->n_layer, c->n_head, c->dim, c->context, c->vocab};
}

/* ------------------------------------------------------------------ config.json */

static int js_int(const cJSON *o, const char *key, const char *path, int required, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    int64_t x;
    if (!v || cJSON_IsNull(v)) {
        if (required) return mw_error_set(MW_EFORMAT, "%s: \"%s\" is missing", path, key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || mw_f64_to_i64(v->valuedouble, 0, 1 << 30, 1, &x))
        return mw_error_set(MW_EFORMAT, "%s: \"%s\" is not an integer in 0..2^30", path, key);
    *out = (int)x;
    return 0;
}

static int js_num(const cJSON *o, const char *key, const char *path, int required, double def, float *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return mw_error_set(MW_EFORMAT, "%s: \"%s\" is missing", path, key);
        *out = (float)def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > 1e30)
        return mw_error_set(MW_EFORMAT, "%s: \"%s\" is not a finite number", path, key);
    *out = (float)v->valuedouble;
    return 0;
}

static int js_bool(const cJSON *o, const char *key, const char *path, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) { *out = def; return 0; }
    if (!cJSON_IsBool(v)) return mw_error_set(MW_EFORMAT, "%s: \"%s\" is not true or false", path, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* The rope: v5's rope_parameters (theta inside), or v4's rope_theta + rope_scaling. */
static int parse_rope(const cJSON *root, const char *path, struct mw_llama_config *c)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const char *where = "rope_parameters";
    int err;
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp)) return mw_error_set(MW_EFORMAT, "%s: \"rope_parameters\" is not an object", path);
        if ((err = js_num(rp, "rope_theta", path, 0, 10000.0, &c->rope_theta))) return err;
    } else {
        if ((err = js_num(root, "rope_theta", path, 0, 10000.0, &c->rope_theta))) return err;
        rp = rs && !cJSON_IsNull(rs) ? rs : NULL;
        where = "rope_scaling";
        if (rp && !cJSON_IsObject(rp)) return mw_error_set(MW_EFORMAT, "%s: \"rope_scaling\" is not an object", path);
    }
    c->rope_type = MW_LLAMA_ROPE_DEFAULT;
    if (!rp) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rp, "type");
    if (t && !cJSON_IsString(t)) return mw_error_set(MW_EFORMAT, "%s: %s.rope_type is not a string", path, where);
    const char *type = t ? t->valuestring : "default";
    const cJSON *prf = cJSON_GetObjectItemCaseSensitive(rp, "partial_rotary_factor");
    if (prf && !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0))
        return mw_error_set(MW_EFORMAT, "%s: %s.partial_rotary_factor other than 1 is not implemented", path, where);
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return mw_error_set(MW_EFORMAT, "%s: %s.rope_type \"%s\" is not implemented (memwall's Llama has \"default\" "
                            "and \"llama3\")", path, where, type);
    c->rope_type = MW_LLAMA_ROPE_LLAMA3;
    if ((err = js_num(rp, "factor", path, 1, 0, &c->rope_factor)) ||
        (err = js_num(rp, "low_freq_factor", path, 1, 0, &c->rope_low)) ||
        (err = js_num(rp, "high_freq_factor", path, 1, 0, &c->rope_high)) ||
        (err = js_int(rp, "original_max_position_embeddings", path, 1, 0, &c->rope_orig_ctx)))
        return err;
    return 0;
}

/* A setting that changes the math and memwall does not implement: refused by its key. */
static int refuse_if(const cJSON *root, const char *path, const char *key, int (*bad)(const cJSON *), const char *why)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (v && !cJSON_IsNull(v) && bad(v)) return mw_error_set(MW_EFORMAT, "%s: \"%s\": %s", path, key, why);
    return 0;
}
static int is_true(const cJSON *v) { return !cJSON_IsFalse(v); }
static int positive(const cJSON *v) { return !(cJSON_IsNumber(v) && v->valuedouble == 0); }
static int not_silu(const cJSON *v) { return !(cJSON_IsString(v) && !strcmp(v->valuestring, "silu")); }
static int not_full_attention(const cJSON *v)
{
    if (!cJSON_IsArray(v)) return 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, v)
        if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention")) return 1;
    return 0;
}

int mw_llama_config_parse(const char *text, size_t len, const char *path, struct mw_llama_config *c)
{
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mw_error_set(MW_EFORMAT, "%s: not a JSON object", path);
    }
    struct mw_llama_config d;
    memset(&d, 0, sizeof d);
    int err = 0, qwen2 = 0, attn_bias = 0;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt) || (strcmp(mt->valuestring, "llama") && strcmp(mt->valuestring, "qwen2"))) {
        err = mw_error_set(MW_EFORMAT, "%s: \"model_type\" %s%s%s is not one the Llama family reads (\"llama\", "
                           "\"qwen2\")", path, cJSON_IsString(mt) ? "\"" : "",
                           cJSON_IsString(mt) ? mt->valuestring : "(missing or not a string)", cJSON_IsString(mt) ? "\"" : "");
        goto out;
    }
    qwen2 = !strcmp(mt->valuestring, "qwen2");
    if ((err = js_int(root, "hidden_size", path, 1, 0, &d.dim)) ||
        (err = js_int(root, "intermediate_size", path, 1, 0, &d.ffn)) ||
        (err = js_int(root, "num_hidden_layers", path, 1, 0, &d.n_layer)) ||
        (err = js_int(root, "num_attention_heads", path, 1, 0, &d.n_head)) ||
        (err = js_int(root, "num_key_value_heads", path, 0, d.n_head, &d.n_kv_head)) ||
        (err = js_int(root, "head_dim", path, 0, d.n_head > 0 ? d.dim / d.n_head : 0, &d.head_dim)) ||
        (err = js_int(root, "vocab_size", path, 1, 0, &d.vocab)) ||
        (err = js_int(root, "max_position_embeddings", path, 1, 0, &d.context)) ||
        (err = js_num(root, "rms_norm_eps", path, 0, 1e-6, &d.rms_eps)) ||
        (err = js_bool(root, "tie_word_embeddings", path, 0, &d.tied)) ||
        (err = js_bool(root, "attention_bias", path, qwen2, &attn_bias)) || (err = parse_rope(root, path, &d)))
        goto out;
    /* Llama's attention_bias also gives o_proj a bias, which memwall does not have; Qwen2's is q/k/v only. */
    if (!qwen2 && attn_bias) {
        err = mw_error_set(MW_EFORMAT, "%s: \"attention_bias\": true (biases on q/k/v and o_proj) is not implemented "
                           "for model_type llama", path);
        goto out;
    }
    d.qkv_bias = attn_bias;
    if ((err = refuse_if(root, path, "mlp_bias", is_true, "MLP biases are not implemented")) ||
        (err = refuse_if(root, path, "hidden_act", not_silu, "only \"silu\" (SwiGLU) is implemented")) ||
        (err = refuse_if(root, path, "use_sliding_window", is_true, "sliding-window attention is not implemented")) ||
        (err = refuse_if(root, path, "layer_types", not_full_attention, "only \"full_attention\" layers are implemented")) ||
        (err = refuse_if(root, path, "num_experts", positive, "mixture of experts is not implemented")) ||
        (err = refuse_if(root, path, "num_local_experts", positive, "mixture of experts is not implemented")) ||
        (err = refuse_if(root, path, "n_routed_experts", positive, "mixture of experts is not implemented")))
        goto out;
    if ((err = mw_llama_config_check(&d))) {
        err = mw_error_set(MW_EFORMAT, "%s: %s", path, mw_error_msg());
        goto out;
    }
    *c = d;
out:
    cJSON_Delete(root);
    return err;
}

static int read_text(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mw_error_set(-errno, "%s: %s", path, strerror(errno));
    long n = -1;
    if (!fseek(f, 0, SEEK_END)) n = ftell(f);
    if (n < 0 || n > (16 << 20) || fseek(f, 0, SEEK_SET)) {
        fclose(f);
        return mw_error_set(MW_EFORMAT, "%s: unreadable or larger than 16 MiB", path);
    }
    *text = malloc((size_t)n + 1);
    if (!*text) { fclose(f); return mw_error_set(-ENOMEM, "no memory"); }
    size_t got = fread(*text, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) { free(*text); return mw_error_set(-EIO, "%s: short read", path); }
    (*text)[n] = 0;
    *len = (size_t)n;
    return 0;
}

/* path: a directory (its config.json), a config.json, or a weights file with config.json beside it. */
static int config_from_file(const char *path, const struct mw_net_shape *given, void *cfg, char *note, size_t n)
{
    char js[1024];
    struct stat st;
    size_t pl = strlen(path);
    int is_dir = !stat(path, &st) && S_ISDIR(st.st_mode), is_index = pl >= 11 && !strcmp(path + pl - 11, ".index.json");
    int is_json = !is_index && pl >= 5 && !strcmp(path + pl - 5, ".json"); /* a config; an index is weights */
    if (is_dir) snprintf(js, sizeof js, "%s/config.json", path);
    else if (is_json) snprintf(js, sizeof js, "%s", path);
    else {
        const char *sl = strrchr(path, '/');
        snprintf(js, sizeof js, "%.*sconfig.json", sl ? (int)(sl - path + 1) : 0, path);
    }
    char *text = NULL;
    size_t len = 0;
    struct mw_llama_config c;
    int err = read_text(js, &text, &len);
    if (err) return mw_error_set(err, "llama: a model's config.json is needed: %s", mw_error_msg());
    err = mw_llama_config_parse(text, len, js, &c);
    free(text);
    if (err) return err;
    int gv[5] = {given->layers, given->heads, given->width, given->context, given->vocab};
    int fv[5] = {c.n_layer, c.n_head, c.dim, c.context, c.vocab};
    const char *nm[5] = {"layers", "heads", "width", "context", "vocab"};
    for (int i = 0; i < 5; i++)
        if (gv[i] && gv[i] != fv[i])
            return mw_error_set(-EINVAL, "llama: %s %d given, but %s says %d", nm[i], gv[i], js, fv[i]);
    if (!is_dir && !is_json) { /* the weights' embedding (a file or a sharded index) must be this config's */
        struct mw_ts f;
        if ((err = mw_ts_open(&f, path))) return err;
        const struct mw_ts_entry *te = mw_ts_find(&f, "model.embed_tokens.weight");
        const struct mw_st_entry *e = te ? te->st : NULL;
        if (!e || e->ndim != 2 || e->shape[0] != (uint64_t)c.vocab || e->shape[1] != (uint64_t)c.dim)
            err = mw_error_set(MW_EFORMAT, "%s: model.embed_tokens.weight is missing or not [%d, %d] as %s says", path,
                               c.vocab, c.dim, js);
        mw_ts_close(&f);
        if (err) return err;
    }
    *(struct mw_llama_config *)cfg = c;
    if (n) {
        char s[256];
        config_summary(&c, s, sizeof s);
        snprintf(note, n, "model from %s: %s (every value from %s)\n", path, s, js);
    }
    return 0;
}

/* ------------------------------------------------------------------ the table */

static void unit_name(const struct mw_net *n, int unit, char *buf, size_t len)
{
    if (unit == 0) snprintf(buf, len, "embed_tokens");
    else if (unit == n->n_units - 1) snprintf(buf, len, "%s", CLL(n)->c.tied ? "norm" : "norm+lm_head");
    else snprintf(buf, len, "layers.%d", unit - 1);
}

/* As llama.c's passes acquire them (its header comment). */
static int unit_order(const struct mw_net *n, enum mw_net_pass pass, int layer_major, int *order, int max)
{
    int L = n->n_layer, tied = CLL(n)->c.tied, k = 0;
#define PUT(u) do { if (k < max) order[k] = (u); k++; } while (0)
    if (pass == MW_NET_FORWARD) {
        for (int u = 0; u <= L + 1; u++) PUT(u);
        if (tied) PUT(0);
    } else {
        if (!layer_major) {
            if (tied) PUT(0);
            PUT(L + 1);
        }
        for (int l = L; l >= 1; l--) PUT(l);
    }
#undef PUT
    return k;
}

static int n_tensors(const struct mw_net *n) { return CLL(n)->n_tensors; }
static void tensor(const struct mw_net *n, int i, struct mw_net_tensor *out) { *out = CLL(n)->tensors[i]; }
static void set_weights_hook(struct mw_net *n, mw_net_weights_fn fn, void *user) { LL(n)->hook = fn; LL(n)->hook_user = user; }
static const float *logits(const struct mw_net *n) { return CLL(n)->logits; }
static void warm_runtime(const struct mw_net *n)
{
    const struct llama *m = CLL(n);
    const struct mw_llama_config *c = &m->c;
    int C = c->dim, QD = c->n_head * c->head_dim, KD = c->n_kv_head * c->head_dim, F = c->ffn;
    const int lin[5][2] = {{C, QD}, {C, KD}, {QD, C}, {C, F}, {F, C}}; /* q, k and v, o, gate and up, down */
    mw_net_warm_products(lin, 5, m->max_batch * m->max_seq, C, c->vocab, m->nt, m->logits,
                         (size_t)m->max_batch * (size_t)m->max_seq * (size_t)c->vocab);
}

/* A float as the decimal it was written as (1e-06, not 9.99999997e-07): what config.json says. */
static double dec(float f)
{
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)f);
    return strtod(b, NULL);
}

/* config.json as transformers' LlamaConfig / Qwen2Config writes it (q/k/v bias: Qwen2), what
 * from_pretrained needs to load the model.safetensors beside it. */
static int hf_config_write(const void *cfg, const char *path)
{
    const struct mw_llama_config *c = cfg;
    cJSON *j = cJSON_CreateObject(), *arch = cJSON_CreateArray(), *rs = NULL;
    int ok = j && arch &&
             cJSON_AddItemToArray(arch, cJSON_CreateString(c->qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM")) &&
             cJSON_AddItemToObject(j, "architectures", arch);
    if (!ok) cJSON_Delete(arch);
    ok = ok && cJSON_AddStringToObject(j, "model_type", c->qkv_bias ? "qwen2" : "llama") &&
         cJSON_AddNumberToObject(j, "hidden_size", c->dim) && cJSON_AddNumberToObject(j, "intermediate_size", c->ffn) &&
         cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layer) &&
         cJSON_AddNumberToObject(j, "num_attention_heads", c->n_head) &&
         cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_head) &&
         cJSON_AddNumberToObject(j, "head_dim", c->head_dim) && cJSON_AddNumberToObject(j, "vocab_size", c->vocab) &&
         cJSON_AddNumberToObject(j, "max_position_embeddings", c->context) &&
         cJSON_AddNumberToObject(j, "rms_norm_eps", dec(c->rms_eps)) &&
         cJSON_AddNumberToObject(j, "rope_theta", dec(c->rope_theta)) && cJSON_AddStringToObject(j, "hidden_act", "silu") &&
         cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tied) && cJSON_AddStringToObject(j, "torch_dtype", "float32");
    if (ok && !c->qkv_bias) ok = cJSON_AddFalseToObject(j, "attention_bias") && cJSON_AddFalseToObject(j, "mlp_bias");
    if (ok && c->rope_type == MW_LLAMA_ROPE_LLAMA3) {
        ok = (rs = cJSON_AddObjectToObject(j, "rope_scaling")) && cJSON_AddStringToObject(rs, "rope_type", "llama3") &&
             cJSON_AddNumberToObject(rs, "factor", dec(c->rope_factor)) &&
             cJSON_AddNumberToObject(rs, "low_freq_factor", dec(c->rope_low)) &&
             cJSON_AddNumberToObject(rs, "high_freq_factor", dec(c->rope_high)) &&
             cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_ctx);
    }
    char *text = ok ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text) return mw_error_set(-ENOMEM, "no memory for config.json");
    int err = mw_atomic_write_file(path, text, strlen(text));
    cJSON_free(text);
    return err;
}

static const char *const hf_types[] = {"llama", "qwen2", NULL};

const struct mw_net_family mw_net_llama = {
    .name = "llama", .id = 1,
    .config_check = config_check, .config_describe = config_describe, .config_summary = config_summary,
    .config_encode = config_encode, .config_decode = config_decode, .sizes = llama_sizes,
    .config_from_shape = config_from_shape, .config_from_file = config_from_file, .config_shape = config_shape,
    .config_from_model = config_from_model,
    .init = llama_init, .free = llama_free, .init_weights = llama_init_weights, .init_weights_unit = llama_init_weights_unit,
    .warm_runtime = warm_runtime, .unit_range = llama_unit_range, .unit_name = unit_name, .unit_order = unit_order,
    .n_tensors = n_tensors, .tensor = tensor, .set_weights_hook = set_weights_hook,
    .forward = llama_forward, .logits = logits, .backward = llama_backward, .accum_set = llama_accum_set,
    .defer_bytes = llama_defer_bytes, .step_layer_major = llama_step_layer_major, .lm_bytes = llama_lm_bytes,
    .act_slot_bytes = llama_act_slot_bytes, .acts_lend = llama_acts_lend, .own_block_bytes = llama_own_block_bytes,
    .zero_grad = llama_zero_grad, .load_safetensors = llama_load_safetensors, .loader_open = llama_loader_open,
    .loader_unit = llama_loader_unit, .loader_close = llama_loader_close,
    .save_safetensors_units = llama_save_safetensors_units,
    .hf_model_types = hf_types, .hf_config_write = hf_config_write,
    .kv_init = llama_kv_init, .decode = llama_decode, .kv_free = llama_kv_free,
};

void mw_net_config_llama(struct mw_net_config *out, const struct mw_llama_config *c)
{
    memset(out, 0, sizeof *out);
    out->family = &mw_net_llama;
    memcpy(out->raw, c, sizeof *c);
}
