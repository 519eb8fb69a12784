/*
 * config.c — a model from a Hugging Face config.json (cJSON).
 *
 * The key names differ by family; model_type picks the reader: gpt2 (n_layer, n_embd, ...),
 * llama/mistral/qwen2/mixtral (hidden_size, num_key_value_heads, intermediate_size, MoE
 * keys num_local_experts / num_experts_per_tok), deepseek_v2/v3 (MLA ranks and head widths,
 * n_routed_experts, n_shared_experts, moe_intermediate_size, first_k_dense_replace,
 * moe_layer_freq, topk_method "noaux_tc" = router score-correction bias), t5 and bert.
 * Defaults are the ones the transformers classes apply when a key is absent. Anything else
 * — not JSON, not an object, an unknown model_type, a missing or non-integer size — is
 * MW_EFORMAT with a message naming the file and the key.
 *
 * Hostile input: every integer is at most 2^32 before any arithmetic, the model's rough
 * parameter count is computed with overflow checks and must stay below 2^50, so the planner's
 * byte products (x 16 bytes, x ranks) cannot wrap, and layer and expert counts (which the
 * planner walks one by one) are at most 100000.
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct reader { const cJSON *root; const char *name; int err; };

/* A non-negative integer; `def` < 0 means the key is required. null counts as absent. */
static uint64_t geti(struct reader *r, const char *key, long long def)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (!it || cJSON_IsNull(it)) {
        if (def < 0 && !r->err)
            r->err = mw_error_set(MW_EFORMAT, "%s: missing required key \"%s\"", r->name, key);
        return def < 0 ? 0 : (uint64_t)def;
    }
    uint64_t v;
    if (!cJSON_IsNumber(it) || mw_f64_to_u64(it->valuedouble, (uint64_t)1 << 32, 1, &v)) {
        if (!r->err)
            r->err = mw_error_set(MW_EFORMAT, "%s: \"%s\" must be a non-negative integer (at most 2^32)", r->name,
                                  key);
        return 0;
    }
    return v;
}

static int getb(struct reader *r, const char *key, int def)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->root, key);
    if (!it || cJSON_IsNull(it)) return def;
    if (!cJSON_IsBool(it)) {
        if (!r->err) r->err = mw_error_set(MW_EFORMAT, "%s: \"%s\" must be true or false", r->name, key);
        return def;
    }
    return cJSON_IsTrue(it);
}

static const char *gets(struct reader *r, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->root, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static void read_gpt2(struct reader *r, struct mw_model *m)
{
    m->arch = MW_ARCH_GPT;
    m->n_layer = geti(r, "n_layer", -1);
    m->hidden = geti(r, "n_embd", -1);
    m->n_head = m->n_kv_head = geti(r, "n_head", -1);
    m->ffn = geti(r, "n_inner", 0);
    if (!m->ffn) m->ffn = 4 * m->hidden;
    m->vocab = geti(r, "vocab_size", 50257);
    m->max_pos = geti(r, "n_positions", 1024);
    m->norm = MW_NORM_LAYER;
    m->bias_linear = 1;
    m->tied_embeddings = getb(r, "tie_word_embeddings", 1);
    if (m->n_head) m->head_dim = m->hidden / m->n_head;
}

static void read_llama(struct reader *r, struct mw_model *m, const char *type)
{
    m->arch = MW_ARCH_LLAMA;
    m->n_layer = geti(r, "num_hidden_layers", -1);
    m->hidden = geti(r, "hidden_size", -1);
    m->n_head = geti(r, "num_attention_heads", -1);
    m->n_kv_head = geti(r, "num_key_value_heads", (long long)m->n_head);
    m->ffn = geti(r, "intermediate_size", -1);
    m->vocab = geti(r, "vocab_size", -1);
    m->head_dim = geti(r, "head_dim", m->n_head ? (long long)(m->hidden / m->n_head) : 0);
    m->gated_mlp = 1;
    m->norm = MW_NORM_RMS;
    m->tied_embeddings = getb(r, "tie_word_embeddings", 0);
    m->bias_qkv = !strcmp(type, "qwen2") ? 1 : getb(r, "attention_bias", 0);
    if (!strcmp(type, "mixtral") || !strcmp(type, "qwen2_moe") ||
        cJSON_GetObjectItemCaseSensitive(r->root, "num_local_experts")) {
        m->n_routed_experts = geti(r, "num_local_experts", -1);
        m->experts_per_tok = geti(r, "num_experts_per_tok", 2);
        m->moe_ffn = m->ffn;
        m->moe_layer_freq = 1;
    }
}

static void read_deepseek(struct reader *r, struct mw_model *m, const char *type)
{
    m->arch = MW_ARCH_DEEPSEEK;
    m->n_layer = geti(r, "num_hidden_layers", -1);
    m->hidden = geti(r, "hidden_size", -1);
    m->n_head = m->n_kv_head = geti(r, "num_attention_heads", -1);
    m->ffn = geti(r, "intermediate_size", -1);
    m->vocab = geti(r, "vocab_size", -1);
    m->gated_mlp = 1;
    m->norm = MW_NORM_RMS;
    m->tied_embeddings = getb(r, "tie_word_embeddings", 0);
    m->q_lora_rank = geti(r, "q_lora_rank", 0);
    m->kv_lora_rank = geti(r, "kv_lora_rank", -1);
    m->qk_nope_dim = geti(r, "qk_nope_head_dim", -1);
    m->qk_rope_dim = geti(r, "qk_rope_head_dim", -1);
    m->v_head_dim = geti(r, "v_head_dim", -1);
    m->n_routed_experts = geti(r, "n_routed_experts", 0);
    if (m->n_routed_experts) {
        m->n_shared_experts = geti(r, "n_shared_experts", 0);
        m->experts_per_tok = geti(r, "num_experts_per_tok", -1);
        m->moe_ffn = geti(r, "moe_intermediate_size", -1);
        m->first_k_dense = geti(r, "first_k_dense_replace", 0);
        m->moe_layer_freq = geti(r, "moe_layer_freq", 1);
    }
    const char *topk = gets(r, "topk_method");
    m->router_bias = !strcmp(type, "deepseek_v3") || (topk && !strcmp(topk, "noaux_tc"));
    m->n_mtp_layers = geti(r, "num_nextn_predict_layers", 0);
}

static void read_t5(struct reader *r, struct mw_model *m)
{
    m->arch = MW_ARCH_T5;
    m->hidden = geti(r, "d_model", -1);
    m->ffn = geti(r, "d_ff", -1);
    m->n_layer = geti(r, "num_layers", -1);
    m->n_dec_layer = geti(r, "num_decoder_layers", (long long)m->n_layer);
    m->n_head = m->n_kv_head = geti(r, "num_heads", -1);
    m->head_dim = geti(r, "d_kv", -1);
    m->vocab = geti(r, "vocab_size", -1);
    m->rel_buckets = geti(r, "relative_attention_num_buckets", 32);
    const char *ff = gets(r, "feed_forward_proj");
    m->gated_mlp = ff && !strncmp(ff, "gated-", 6);
    m->norm = MW_NORM_RMS;
    m->tied_embeddings = getb(r, "tie_word_embeddings", 1);
}

static void read_bert(struct reader *r, struct mw_model *m)
{
    m->arch = MW_ARCH_BERT;
    m->n_layer = geti(r, "num_hidden_layers", -1);
    m->hidden = geti(r, "hidden_size", -1);
    m->n_head = m->n_kv_head = geti(r, "num_attention_heads", -1);
    m->ffn = geti(r, "intermediate_size", -1);
    m->vocab = geti(r, "vocab_size", -1);
    m->max_pos = geti(r, "max_position_embeddings", 512);
    m->type_vocab = geti(r, "type_vocab_size", 2);
    m->norm = MW_NORM_LAYER;
    m->bias_linear = 1;
    m->tied_embeddings = 1;
    m->buffer_bytes = 8 * (m->max_pos + m->max_pos); /* position_ids + token_type_ids, int64 */
    if (m->n_head) m->head_dim = m->hidden / m->n_head;
}

/* a * b * c with overflow checks, accumulated into *sum; 1 on overflow. */
static int acc3(uint64_t *sum, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t p;
    return mw_mul_u64(a, b, &p) || mw_mul_u64(p, c, &p) || mw_add_u64(*sum, p, sum);
}

/* An upper bound of the parameter count, overflow-checked: the sizes of a real model. */
static int check_scale(const struct mw_model *m, const char *name)
{
    uint64_t h = m->hidden, L = m->n_layer + m->n_dec_layer + m->n_mtp_layers, sum = 0;
    uint64_t e = m->n_routed_experts + m->n_shared_experts + 1;
    /* Each term is below 2^34 (every field is at most 2^32), so the sums here cannot wrap. */
    uint64_t qkv = h + m->q_lora_rank + m->kv_lora_rank, le;
    uint64_t ffn = MW_MAX(m->ffn, m->moe_ffn);
    int ovf = acc3(&qkv, m->n_head + 2 * m->n_kv_head, m->head_dim ? m->head_dim : 1, 1) ||
              acc3(&qkv, m->qk_nope_dim + m->qk_rope_dim + m->v_head_dim, m->n_head, 1) ||
              acc3(&sum, m->vocab + m->max_pos + m->type_vocab + 1, h, 1) || acc3(&sum, L, h, qkv) ||
              mw_mul_u64(L, e, &le) || acc3(&sum, le, ffn, 3 * h) || acc3(&sum, m->rel_buckets, m->n_head, 1);
    if (ovf || sum > ((uint64_t)1 << 50))
        return mw_error_set(MW_EFORMAT, "%s: the sizes describe more than 2^50 parameters (hidden %llu, %llu layers, "
                            "ffn %llu, vocabulary %llu, %llu experts): not a real model", name,
                            (unsigned long long)h, (unsigned long long)L, (unsigned long long)ffn,
                            (unsigned long long)m->vocab, (unsigned long long)m->n_routed_experts);
    /* The planner walks layers and experts one by one: a hostile count must not make it spin. */
    if (L > 100000 || m->n_routed_experts > 100000 || m->rel_buckets > 100000)
        return mw_error_set(MW_EFORMAT, "%s: %llu layers or %llu experts or %llu relative buckets: more than the "
                            "100000 the planner accepts", name, (unsigned long long)L,
                            (unsigned long long)m->n_routed_experts, (unsigned long long)m->rel_buckets);
    if (m->n_routed_experts && !m->moe_layer_freq)
        return mw_error_set(MW_EFORMAT, "%s: \"moe_layer_freq\" must be at least 1", name);
    return 0;
}

int mw_model_from_config_json(const char *text, const char *name, struct mw_model *m)
{
    memset(m, 0, sizeof *m);
    const char *base = strrchr(name, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : name);
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text ? (size_t)(at - text) : 0;
        return mw_error_set(MW_EFORMAT, "%s: not valid JSON (near byte %zu)", name, off);
    }
    struct reader r = { root, name, 0 };
    int err = 0;
    if (!cJSON_IsObject(root)) {
        err = mw_error_set(MW_EFORMAT, "%s: expected a JSON object (a Hugging Face config.json)", name);
        goto err;
    }
    const char *type = gets(&r, "model_type");
    if (!type) {
        err = mw_error_set(MW_EFORMAT, "%s: no \"model_type\" key; is this a Hugging Face config.json?", name);
        goto err;
    }
    if (!strcmp(type, "gpt2")) read_gpt2(&r, m);
    else if (!strcmp(type, "llama") || !strcmp(type, "mistral") || !strcmp(type, "qwen2") ||
             !strcmp(type, "mixtral"))
        read_llama(&r, m, type);
    else if (!strcmp(type, "deepseek_v2") || !strcmp(type, "deepseek_v3")) read_deepseek(&r, m, type);
    else if (!strcmp(type, "t5")) read_t5(&r, m);
    else if (!strcmp(type, "bert")) read_bert(&r, m);
    else {
        err = mw_error_set(MW_EFORMAT, "%s: model_type \"%s\" is not supported (gpt2, llama, mistral, "
                           "qwen2, mixtral, deepseek_v2, deepseek_v3, t5, bert)", name, type);
        goto err;
    }
    if (r.err) { err = r.err; goto err; }
    if ((err = check_scale(m, name))) goto err;
    err = mw_model_validate(m);
err:
    cJSON_Delete(root);
    return err;
}

int mw_model_from_config_file(const char *path, struct mw_model *m)
{
    char *buf = NULL;
    int err = mw_read_small_file(path, "model config", 16u << 20, &buf, NULL);
    if (!err) err = mw_model_from_config_json(buf, path, m);
    free(buf);
    return err;
}
