/*
 * zoo.c — the built-in models, from their published architecture numbers (Hugging Face
 * config.json files and the papers' tables). Names are lower-case; lookup ignores case and
 * accepts '_' for '-'. The GPT shapes of the Megatron and ZeRO papers carry vocab 51200 and
 * learned positions for the sequence the paper trained with.
 */
#include "memwall/plan.h"
#include "memwall/common.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

#define GPT(nm, L, H, A, V, P) { .name = nm, .arch = MW_ARCH_GPT, .n_layer = L, .hidden = H, \
    .n_head = A, .n_kv_head = A, .head_dim = (H) / (A), .ffn = 4 * (H), .vocab = V, .max_pos = P, \
    .norm = MW_NORM_LAYER, .bias_linear = 1, .tied_embeddings = 1 }
#define LLAMA(nm, L, H, A, KV, F, V) { .name = nm, .arch = MW_ARCH_LLAMA, .n_layer = L, .hidden = H, \
    .n_head = A, .n_kv_head = KV, .head_dim = (H) / (A), .ffn = F, .vocab = V, .gated_mlp = 1, \
    .norm = MW_NORM_RMS }

#define LLAMA_TIED(nm, L, H, A, KV, F, V) { .name = nm, .arch = MW_ARCH_LLAMA, .n_layer = L, .hidden = H, \
    .n_head = A, .n_kv_head = KV, .head_dim = (H) / (A), .ffn = F, .vocab = V, .gated_mlp = 1, \
    .norm = MW_NORM_RMS, .tied_embeddings = 1 }
#define QWEN2(nm, L, H, A, KV, F, TIED) { .name = nm, .arch = MW_ARCH_LLAMA, .n_layer = L, .hidden = H, \
    .n_head = A, .n_kv_head = KV, .head_dim = (H) / (A), .ffn = F, .vocab = 151936, .gated_mlp = 1, \
    .norm = MW_NORM_RMS, .bias_qkv = 1, .tied_embeddings = TIED }

static const struct mw_model zoo[] = {
    GPT("gpt2", 12, 768, 12, 50257, 1024),
    GPT("gpt2-medium", 24, 1024, 16, 50257, 1024),
    GPT("gpt2-large", 36, 1280, 20, 50257, 1024),
    GPT("gpt2-xl", 48, 1600, 25, 50257, 1024),
    LLAMA("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
    LLAMA("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
    LLAMA("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
    LLAMA("llama-3-8b", 32, 4096, 32, 8, 14336, 128256),
    LLAMA("llama-3-70b", 80, 8192, 64, 8, 28672, 128256),
    LLAMA("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256),
    LLAMA("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256),
    LLAMA("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256),
    LLAMA("mistral-7b", 32, 4096, 32, 8, 14336, 32000),
    { .name = "mixtral-8x7b", .arch = MW_ARCH_LLAMA, .n_layer = 32, .hidden = 4096, .n_head = 32,
      .n_kv_head = 8, .head_dim = 128, .ffn = 14336, .vocab = 32000, .gated_mlp = 1,
      .norm = MW_NORM_RMS, .n_routed_experts = 8, .experts_per_tok = 2, .moe_ffn = 14336,
      .moe_layer_freq = 1 },
    /* The small models people fine-tune on one machine (their config.json files): tied heads. */
    LLAMA_TIED("smollm2-135m", 30, 576, 9, 3, 1536, 49152),
    LLAMA_TIED("smollm2-360m", 32, 960, 15, 5, 2560, 49152),
    LLAMA_TIED("smollm2-1.7b", 24, 2048, 32, 32, 8192, 49152),
    LLAMA_TIED("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256),
    LLAMA_TIED("llama-3.2-3b", 28, 3072, 24, 8, 8192, 128256),
    LLAMA("tinyllama-1.1b", 22, 2048, 32, 4, 5632, 32000),
    QWEN2("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 1),
    QWEN2("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 1),
    QWEN2("qwen2.5-3b", 36, 2048, 16, 2, 11008, 1),
    QWEN2("qwen2.5-7b", 28, 3584, 28, 4, 18944, 0),
    { .name = "qwen2.5-72b", .arch = MW_ARCH_LLAMA, .n_layer = 80, .hidden = 8192, .n_head = 64,
      .n_kv_head = 8, .head_dim = 128, .ffn = 29568, .vocab = 152064, .gated_mlp = 1,
      .norm = MW_NORM_RMS, .bias_qkv = 1 },
    { .name = "deepseek-v2", .arch = MW_ARCH_DEEPSEEK, .n_layer = 60, .hidden = 5120, .n_head = 128,
      .n_kv_head = 128, .ffn = 12288, .vocab = 102400, .gated_mlp = 1, .norm = MW_NORM_RMS,
      .n_routed_experts = 160, .n_shared_experts = 2, .experts_per_tok = 6, .moe_ffn = 1536,
      .first_k_dense = 1, .moe_layer_freq = 1, .q_lora_rank = 1536, .kv_lora_rank = 512,
      .qk_nope_dim = 128, .qk_rope_dim = 64, .v_head_dim = 128 },
    { .name = "deepseek-v3", .arch = MW_ARCH_DEEPSEEK, .n_layer = 61, .hidden = 7168, .n_head = 128,
      .n_kv_head = 128, .ffn = 18432, .vocab = 129280, .gated_mlp = 1, .norm = MW_NORM_RMS,
      .n_routed_experts = 256, .n_shared_experts = 1, .experts_per_tok = 8, .moe_ffn = 2048,
      .first_k_dense = 3, .moe_layer_freq = 1, .router_bias = 1, .q_lora_rank = 1536,
      .kv_lora_rank = 512, .qk_nope_dim = 128, .qk_rope_dim = 64, .v_head_dim = 128,
      .n_mtp_layers = 1 },
    /* Encoders for the DeepSpeed / accelerate estimator examples. */
    { .name = "t5-large", .arch = MW_ARCH_T5, .n_layer = 24, .n_dec_layer = 24, .hidden = 1024,
      .n_head = 16, .n_kv_head = 16, .head_dim = 64, .ffn = 4096, .vocab = 32128,
      .rel_buckets = 32, .norm = MW_NORM_RMS, .tied_embeddings = 1 },
    { .name = "t5-3b", .arch = MW_ARCH_T5, .n_layer = 24, .n_dec_layer = 24, .hidden = 1024,
      .n_head = 32, .n_kv_head = 32, .head_dim = 128, .ffn = 16384, .vocab = 32128,
      .rel_buckets = 32, .norm = MW_NORM_RMS, .tied_embeddings = 1 },
    { .name = "t0-3b", .arch = MW_ARCH_T5, .n_layer = 24, .n_dec_layer = 24, .hidden = 2048,
      .n_head = 32, .n_kv_head = 32, .head_dim = 64, .ffn = 5120, .vocab = 32128, .gated_mlp = 1,
      .rel_buckets = 32, .norm = MW_NORM_RMS, .tied_embeddings = 1 },
    { .name = "bert-base-cased", .arch = MW_ARCH_BERT, .n_layer = 12, .hidden = 768, .n_head = 12,
      .n_kv_head = 12, .head_dim = 64, .ffn = 3072, .vocab = 28996, .max_pos = 512,
      .type_vocab = 2, .norm = MW_NORM_LAYER, .bias_linear = 1, .tied_embeddings = 1,
      .buffer_bytes = 2 * 512 * 8 /* position_ids + token_type_ids, int64 */ },
    /* Narayanan et al. 2021, Table 1 (seq 2048). */
    GPT("megatron-1.7b", 24, 2304, 24, 51200, 2048),
    GPT("megatron-3.6b", 30, 3072, 32, 51200, 2048),
    GPT("megatron-7.5b", 36, 4096, 32, 51200, 2048),
    GPT("megatron-18b", 40, 6144, 48, 51200, 2048),
    GPT("megatron-39b", 48, 8192, 64, 51200, 2048),
    GPT("megatron-76b", 60, 10240, 80, 51200, 2048),
    GPT("megatron-146b", 80, 12288, 96, 51200, 2048),
    GPT("megatron-310b", 96, 16384, 128, 51200, 2048),
    GPT("megatron-530b", 105, 20480, 128, 51200, 2048),
    GPT("megatron-1t", 128, 25600, 160, 51200, 2048),
    /* Korthikanti et al. 2022, Figure 1 (22B; 175B is GPT-3). */
    GPT("megatron-22b", 48, 6144, 64, 51200, 2048),
    GPT("gpt3-175b", 96, 12288, 96, 51200, 2048),
    /* ZeRO-Infinity, Figure 2(a) (seq 1024). */
    GPT("zero-inf-0.1t", 80, 10240, 128, 51200, 1024),
    GPT("zero-inf-0.5t", 100, 20480, 160, 51200, 1024),
    GPT("zero-inf-1t", 128, 25600, 256, 51200, 1024),
    GPT("zero-inf-10t", 195, 65536, 512, 51200, 1024),
    GPT("zero-inf-100t", 315, 163840, 1024, 51200, 1024),
};

#define N_ZOO (sizeof zoo / sizeof zoo[0])

static const char *names[N_ZOO + 1];

const char *const *mw_model_names(void)
{
    if (!names[0])
        for (size_t i = 0; i < N_ZOO; i++) names[i] = zoo[i].name;
    return names;
}

static int name_eq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = (char)tolower((unsigned char)*a), y = (char)tolower((unsigned char)*b);
        if (x == '_') x = '-';
        if (y == '_') y = '-';
        if (x != y) return 0;
    }
    return *a == *b;
}

int mw_model_lookup(const char *name, struct mw_model *m)
{
    /* Accept Hugging Face ids too: "meta-llama/Llama-2-7b-hf" -> "llama-2-7b". */
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s", base);
    size_t n = strlen(tmp);
    if (n > 3 && name_eq(tmp + n - 3, "-hf")) tmp[n - 3] = 0;
    for (size_t i = 0; i < N_ZOO; i++)
        if (name_eq(zoo[i].name, tmp) || name_eq(zoo[i].name, name)) {
            *m = zoo[i];
            return 0;
        }
    return mw_error_set(-ENOENT, "unknown model '%s' (built-in: gpt2 ... deepseek-v3, listed in docs/plan.md; "
                        "or give a config.json path)", name);
}

void mw_model_bare(struct mw_model *m, uint64_t params, uint64_t largest_layer)
{
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", "bare");
    m->arch = MW_ARCH_BARE;
    m->bare_params = params;
    m->bare_largest = largest_layer;
}

int mw_model_validate(const struct mw_model *m)
{
    if (m->arch == MW_ARCH_BARE)
        return m->bare_params ? 0 : mw_error_set(-EINVAL, "a bare model's parameter count (bare_params) must be positive");
    if (!m->n_layer || !m->hidden || !m->n_head)
        return mw_error_set(MW_EFORMAT, "model '%s': layers, hidden size and heads must be positive",
                            m->name);
    if (!m->kv_lora_rank && (!m->head_dim || !m->n_kv_head || m->n_head % m->n_kv_head))
        return mw_error_set(MW_EFORMAT, "model '%s': %llu query heads are not a multiple of %llu "
                            "key/value heads", m->name, (unsigned long long)m->n_head,
                            (unsigned long long)m->n_kv_head);
    if (m->n_routed_experts && (!m->experts_per_tok || m->experts_per_tok > m->n_routed_experts ||
                                !m->moe_ffn))
        return mw_error_set(MW_EFORMAT, "model '%s': experts per token must be in [1, %llu] and the "
                            "expert width positive", m->name, (unsigned long long)m->n_routed_experts);
    if (m->first_k_dense > m->n_layer)
        return mw_error_set(MW_EFORMAT, "model '%s': first_k_dense_replace exceeds the layer count",
                            m->name);
    return 0;
}
