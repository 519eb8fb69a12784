/*
 * gpt2_net.c — GPT-2 as a model family of the seam (memwall/model.h): the table that the
 * trainer, checkpoints, streaming, ZeRO, the CLI and the planner use, filled with the GPT-2
 * implementation (gpt2*.c). Each entry is a cast and a call: the GPT-2 code keeps its own
 * types, and the numbers are the same bits whichever way it is called (tests/test_net.c).
 *
 * The config (struct mw_gpt2_config) lives in mw_net_config.raw; in a checkpoint it is six u32
 * (L, heads, width, context, vocabulary, padded vocabulary), the fields checkpoints have always
 * kept for GPT-2.
 */
#include "memwall/gpt2.h"
#include "memwall/model.h"
#include "memwall/common.h"
#include "memwall/plan.h"
#include "memwall/fsutil.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(struct mw_gpt2_config) <= MW_NET_CONFIG_BYTES, "GPT-2's config fits mw_net_config.raw");

/* gpt2_decode.c: the KV cache */
int mw_gpt2_kv_init(const struct mw_gpt2 *m, int max_tokens, void **kv);
int mw_gpt2_decode(struct mw_gpt2 *m, void *kv, const int32_t *tokens, int n_tokens, int pos, float *logits_last);
void mw_gpt2_kv_free(void *kv);

#define G(n) ((struct mw_gpt2 *)(n)->impl)
#define CG(n) ((const struct mw_gpt2 *)(n)->impl)

static int config_check(const void *cfg) { return mw_gpt2_config_check(cfg); }

static void config_describe(const void *cfg, struct mw_model *d)
{
    const struct mw_gpt2_config *c = cfg;
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "gpt2 L=%d C=%d", c->n_layer, c->n_embd);
    d->arch = MW_ARCH_GPT;
    d->n_layer = (uint64_t)c->n_layer;
    d->hidden = (uint64_t)c->n_embd;
    d->n_head = d->n_kv_head = (uint64_t)c->n_head;
    d->head_dim = (uint64_t)(c->n_embd / c->n_head);
    d->ffn = 4 * (uint64_t)c->n_embd;
    d->vocab = (uint64_t)(c->padded_vocab_size ? c->padded_vocab_size : c->vocab_size);
    d->max_pos = (uint64_t)c->max_seq_len;
    d->norm = MW_NORM_LAYER;
    d->bias_linear = 1;
    d->tied_embeddings = 1;
}

static void config_summary(const void *cfg, char *buf, size_t n)
{
    const struct mw_gpt2_config *c = cfg;
    snprintf(buf, n, "GPT-2 L=%d heads=%d width=%d context=%d vocab=%d", c->n_layer, c->n_head, c->n_embd,
             c->max_seq_len, c->vocab_size);
}

static void put32(uint8_t *b, uint32_t v) { for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *b) { uint32_t v = 0; for (int i = 0; i < 4; i++) v |= (uint32_t)b[i] << (8 * i); return v; }

static void config_encode(const void *cfg, uint8_t w[MW_NET_CONFIG_WIRE])
{
    const struct mw_gpt2_config *c = cfg;
    memset(w, 0, MW_NET_CONFIG_WIRE);
    int v[6] = {c->n_layer, c->n_head, c->n_embd, c->max_seq_len, c->vocab_size, c->padded_vocab_size};
    for (int i = 0; i < 6; i++) put32(w + 4 * i, (uint32_t)v[i]);
}

static int config_decode(const uint8_t w[MW_NET_CONFIG_WIRE], void *cfg)
{
    struct mw_gpt2_config *c = cfg;
    uint32_t v[6];
    for (int i = 0; i < 6; i++) v[i] = get32(w + 4 * i);
    for (int i = 0; i < 6; i++)
        if (v[i] > (1u << 30)) return mw_error_set(MW_EFORMAT, "GPT-2 config: field %d is %u, out of range", i, v[i]);
    *c = (struct mw_gpt2_config){(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5]};
    return mw_gpt2_config_check(c);
}

static int config_from_shape(const struct mw_net_shape *sh, void *cfg)
{
    struct mw_gpt2_config *c = cfg;
    *c = (struct mw_gpt2_config){sh->layers, sh->heads, sh->width, sh->context, sh->vocab, 0};
    /* The output rows padded to a multiple of 128 (50257 -> 50304) for the matmuls; a byte
     * vocabulary to 8. */
    if (sh->vocab > 0) c->padded_vocab_size = mw_gpt2_padded_vocab(sh->vocab);
    return mw_gpt2_config_check(c);
}

static int config_from_model(const struct mw_model *d, int context, void *cfg)
{
    (void)context; /* GPT-2's positions are rows of its own */
    if (d->arch != MW_ARCH_GPT || d->n_dec_layer || !d->max_pos || !d->tied_embeddings) return -ENOTSUP;
    if (d->n_layer > (1u << 20) || d->n_head > (1u << 20) || d->hidden > (1u << 20) || d->max_pos > (1u << 30) ||
        d->vocab > (1u << 30))
        return mw_error_set(-EINVAL, "%s is larger than memwall's GPT-2 takes (layers, heads and width up to 2^20, "
                            "context and vocabulary up to 2^30)", d->name);
    struct mw_net_shape sh = {(int)d->n_layer, (int)d->n_head, (int)d->hidden, (int)d->max_pos, (int)d->vocab};
    return config_from_shape(&sh, cfg);
}

static int config_from_file(const char *path, const struct mw_net_shape *given, void *cfg, char *note, size_t n)
{
    struct mw_gpt2_config flags = {given->layers, given->heads, given->width, given->context, given->vocab, 0}, *c = cfg;
    struct mw_gpt2_provenance pv;
    int err = mw_gpt2_config_resolve(path, &flags, c, &pv);
    if (err) return err;
    int k = snprintf(note, n, "model from %s%s%s:\n  n_layer %d (%s), n_head %d (%s), n_embd %d (%s), context %d (%s), "
                     "vocab %d (%s)\n", path, pv.config_json[0] ? " and " : " (no config.json beside it)", pv.config_json,
                     c->n_layer, mw_gpt2_source_name(pv.n_layer), c->n_head, mw_gpt2_source_name(pv.n_head), c->n_embd,
                     mw_gpt2_source_name(pv.n_embd), c->max_seq_len, mw_gpt2_source_name(pv.max_seq_len), c->vocab_size,
                     mw_gpt2_source_name(pv.vocab_size));
    if (pv.n_head == MW_GPT2_FROM_GUESS && k > 0 && (size_t)k < n)
        snprintf(note + k, n - (size_t)k, "memwall: warning: %s: nothing says the head count; guessed %d (width / 64); "
                 "give the head count (n_head) or put the model's config.json beside the file\n", path, c->n_head);
    return 0;
}

static void config_shape(const void *cfg, struct mw_net_shape *sh)
{
    const struct mw_gpt2_config *c = cfg;
    *sh = (struct mw_net_shape){c->n_layer, c->n_head, c->n_embd, c->max_seq_len, c->vocab_size};
}

static void to_gpt2_opts(const struct mw_net_options *o, struct mw_gpt2_options *g)
{
    *g = (struct mw_gpt2_options){o->max_batch, o->max_seq, o->recompute, o->n_threads};
}

static void from_gpt2_sizes(const struct mw_gpt2_sizes *g, struct mw_net_sizes *s)
{
    *s = (struct mw_net_sizes){g->n_params, g->params_bytes, g->grads_bytes, g->acts_bytes, g->acts_bytes_full};
}

static int sizes(const void *cfg, const struct mw_net_options *o, struct mw_net_sizes *out)
{
    struct mw_gpt2_options go;
    struct mw_gpt2_sizes gs;
    to_gpt2_opts(o, &go);
    int err = mw_gpt2_sizes(cfg, &go, &gs);
    if (!err) from_gpt2_sizes(&gs, out);
    return err;
}

static int init(struct mw_net *n, const struct mw_net_options *o)
{
    struct mw_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return mw_error_set(-ENOMEM, "gpt2: no memory");
    struct mw_gpt2_options go;
    to_gpt2_opts(o, &go);
    int err = mw_gpt2_init(m, (const struct mw_gpt2_config *)n->cfg.raw, &go);
    if (err) { free(m); return err; }
    n->impl = m;
    n->opts = (struct mw_net_options){m->opts.max_batch, m->opts.max_seq, m->opts.recompute, m->opts.n_threads};
    from_gpt2_sizes(&m->sizes, &n->sizes);
    n->params = m->params;
    n->grads = m->grads;
    n->n_units = mw_gpt2_n_units(m);
    n->n_layer = m->cfg.n_layer;
    n->vocab = m->cfg.vocab_size;
    n->padded_vocab = m->cfg.padded_vocab_size ? m->cfg.padded_vocab_size : m->cfg.vocab_size;
    n->context = m->cfg.max_seq_len;
    n->loss = -1.0f;
    return 0;
}

static void net_free(struct mw_net *n)
{
    if (!n->impl) return;
    mw_gpt2_free(G(n));
    free(n->impl);
    n->impl = NULL;
}

static void init_weights(struct mw_net *n, uint64_t seed) { mw_gpt2_init_weights(G(n), seed); }
static int init_weights_unit(struct mw_net *n, uint64_t seed, int unit) { return mw_gpt2_init_weights_unit(G(n), seed, unit); }
static void warm_runtime(const struct mw_net *n) { mw_gpt2_warm_runtime(CG(n)); }
static int unit_range(const struct mw_net *n, int unit, size_t *first, size_t *count)
{
    return mw_gpt2_unit_range(CG(n), unit, first, count);
}

static void unit_name(const struct mw_net *n, int unit, char *buf, size_t len)
{
    if (unit == 0) snprintf(buf, len, "embeddings");
    else if (unit == n->n_units - 1) snprintf(buf, len, "ln_f");
    else snprintf(buf, len, "h.%d", unit - 1);
}

/* As gpt2_forward.c, gpt2_backward.c and gpt2_layer_major.c acquire them (memwall/gpt2.h). */
static int unit_order(const struct mw_net *n, enum mw_net_pass pass, int layer_major, int *order, int max)
{
    int L = n->n_layer, k = 0;
#define PUT(u) do { if (k < max) order[k] = (u); k++; } while (0)
    if (pass == MW_NET_FORWARD) {
        for (int u = 0; u <= L + 1; u++) PUT(u);
        PUT(0); /* the tied LM head */
    } else {
        if (!layer_major) { PUT(0); PUT(L + 1); } /* layer-major: the head's backward ran in forward */
        for (int l = L; l >= 1; l--) PUT(l);
    }
#undef PUT
    return k;
}

static int n_tensors(const struct mw_net *n) { return CG(n)->n_tensors; }
static void tensor(const struct mw_net *n, int i, struct mw_net_tensor *out)
{
    const struct mw_gpt2_tensor *t = &CG(n)->tensors[i];
    *out = (struct mw_net_tensor){t->name, t->ndim, {t->shape[0], t->shape[1]}, t->offset, t->numel};
}

static void set_weights_hook(struct mw_net *n, mw_net_weights_fn fn, void *user)
{
    G(n)->weights_hook = fn;
    G(n)->weights_user = user;
}

static int forward(struct mw_net *n, const int32_t *in, const int32_t *tg, int B, int T)
{
    int err = mw_gpt2_forward(G(n), in, tg, B, T);
    n->loss = G(n)->loss;
    return err;
}
static const float *logits(const struct mw_net *n) { return mw_gpt2_logits(CG(n)); }
static int kv_init(const struct mw_net *n, int max_tokens, void **kv) { return mw_gpt2_kv_init(CG(n), max_tokens, kv); }
static int decode(struct mw_net *n, void *kv, const int32_t *tok, int nt, int pos, float *lg)
{
    return mw_gpt2_decode(G(n), kv, tok, nt, pos, lg);
}
static int backward(struct mw_net *n, float s, mw_net_grad_ready_fn cb, void *user) { return mw_gpt2_backward(G(n), s, cb, user); }
static int accum_set(struct mw_net *n, int index, int count) { return mw_gpt2_accum_set(G(n), index, count); }
static size_t defer_bytes(const struct mw_net *n, int count) { return mw_gpt2_defer_bytes(CG(n), count); }

_Static_assert(sizeof(struct mw_net_lm_calls) == sizeof(struct mw_gpt2_lm_calls), "the layer-major calls match");
_Static_assert((int)MW_NET_ACTS_GET == (int)MW_GPT2_ACTS_GET && (int)MW_NET_ACTS_DONE == (int)MW_GPT2_ACTS_DONE, "the acts events match");

static int step_layer_major(struct mw_net *n, int nmb, const int32_t *in, const int32_t *tg, int B, int T, float s,
                            const struct mw_net_lm_calls *c, float *losses)
{
    struct mw_gpt2_lm_calls g = {0};
    if (c) g = (struct mw_gpt2_lm_calls){c->before_grads, c->grad_ready, c->forward_done, c->backward_done, c->acts, c->user};
    return mw_gpt2_step_layer_major(G(n), nmb, in, tg, B, T, s, c ? &g : NULL, losses);
}
static size_t lm_bytes(const struct mw_net *n, int nmb, int acts) { return mw_gpt2_lm_bytes(CG(n), nmb, acts); }
static size_t act_slot_bytes(const struct mw_net *n) { return mw_gpt2_act_slot_bytes(CG(n)); }
static void acts_lend(struct mw_net *n, float *slot) { mw_gpt2_acts_lend(G(n), slot); }
static size_t own_block_bytes(const struct mw_net *n) { return mw_gpt2_own_block_bytes(CG(n)); }
static void zero_grad(struct mw_net *n) { mw_gpt2_zero_grad(G(n)); }
static int load_safetensors(struct mw_net *n, const char *path) { return mw_gpt2_load_safetensors(G(n), path); }
static int loader_open(void **l, const struct mw_net *n, const char *path)
{
    return mw_gpt2_st_loader_open((struct mw_gpt2_st_loader **)l, CG(n), path);
}
static int loader_unit(void *l, struct mw_net *n, int unit) { return mw_gpt2_st_loader_unit(l, G(n), unit); }
static void loader_close(void *l) { mw_gpt2_st_loader_close(l); }
static int save_units(const struct mw_net *n, const char *path, mw_net_weights_fn fn, void *user)
{
    return mw_gpt2_save_safetensors_units(CG(n), path, fn, user);
}

/* config.json as transformers' GPT2Config writes it: what from_pretrained needs to load the
 * model.safetensors beside it (tied head, GELU tanh, LayerNorm eps 1e-5, no dropout in training's
 * numbers; the file's wte holds the real vocabulary's rows). */
static int hf_config_write(const void *cfg, const char *path)
{
    const struct mw_gpt2_config *c = cfg;
    cJSON *j = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    int ok = j && arch && cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel")) &&
             cJSON_AddItemToObject(j, "architectures", arch);
    if (!ok) cJSON_Delete(arch);
    ok = ok && cJSON_AddStringToObject(j, "model_type", "gpt2") && cJSON_AddNumberToObject(j, "n_layer", c->n_layer) &&
         cJSON_AddNumberToObject(j, "n_head", c->n_head) && cJSON_AddNumberToObject(j, "n_embd", c->n_embd) &&
         cJSON_AddNumberToObject(j, "n_positions", c->max_seq_len) && cJSON_AddNumberToObject(j, "n_ctx", c->max_seq_len) &&
         cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size) &&
         /* GPT-2's <|endoftext|> is its last id (50256), as is the byte tokenizer's (256) */
         cJSON_AddNumberToObject(j, "bos_token_id", c->vocab_size - 1) &&
         cJSON_AddNumberToObject(j, "eos_token_id", c->vocab_size - 1) &&
         cJSON_AddStringToObject(j, "activation_function", "gelu_new") &&
         cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5) && cJSON_AddTrueToObject(j, "tie_word_embeddings") &&
         cJSON_AddNumberToObject(j, "resid_pdrop", 0) && cJSON_AddNumberToObject(j, "embd_pdrop", 0) &&
         cJSON_AddNumberToObject(j, "attn_pdrop", 0) && cJSON_AddStringToObject(j, "torch_dtype", "float32");
    char *text = ok ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text) return mw_error_set(-ENOMEM, "no memory for config.json");
    int err = mw_atomic_write_file(path, text, strlen(text));
    cJSON_free(text);
    return err;
}

static const char *const hf_types[] = {"gpt2", NULL};

const struct mw_net_family mw_net_gpt2 = {
    .name = "gpt2", .id = 0,
    .config_check = config_check, .config_describe = config_describe, .config_summary = config_summary,
    .config_encode = config_encode, .config_decode = config_decode, .sizes = sizes,
    .config_from_shape = config_from_shape, .config_from_file = config_from_file, .config_shape = config_shape,
    .config_from_model = config_from_model,
    .init = init, .free = net_free, .init_weights = init_weights, .init_weights_unit = init_weights_unit,
    .warm_runtime = warm_runtime, .unit_range = unit_range, .unit_name = unit_name, .unit_order = unit_order,
    .n_tensors = n_tensors, .tensor = tensor, .set_weights_hook = set_weights_hook,
    .forward = forward, .logits = logits, .backward = backward, .accum_set = accum_set, .defer_bytes = defer_bytes,
    .step_layer_major = step_layer_major, .lm_bytes = lm_bytes, .act_slot_bytes = act_slot_bytes,
    .acts_lend = acts_lend, .own_block_bytes = own_block_bytes, .zero_grad = zero_grad,
    .load_safetensors = load_safetensors, .loader_open = loader_open, .loader_unit = loader_unit,
    .loader_close = loader_close, .save_safetensors_units = save_units,
    .hf_model_types = hf_types, .hf_config_write = hf_config_write,
    .kv_init = kv_init, .decode = decode, .kv_free = mw_gpt2_kv_free,
};

void mw_net_config_gpt2(struct mw_net_config *out, const struct mw_gpt2_config *g)
{
    memset(out, 0, sizeof *out);
    out->family = &mw_net_gpt2;
    memcpy(out->raw, g, sizeof *g);
}

int mw_net_gpt2_config(const struct mw_net_config *c, struct mw_gpt2_config *g)
{
    if (c->family != &mw_net_gpt2) return mw_error_set(-EINVAL, "the model is a %s, not a GPT-2", c->family ? c->family->name : "(none)");
    memcpy(g, c->raw, sizeof *g);
    return 0;
}
