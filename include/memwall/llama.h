/*
 * memwall/llama.h — the Llama family (HF LlamaForCausalLM / Qwen2ForCausalLM) as a model of the
 * table (memwall/model.h, docs/model.md "The Llama family"). Callers train it through the table
 * (mw_net_family_find("llama")); this header adds only what the table does not say: the config
 * struct (what mw_net_config.raw holds), building a config from an HF config.json, and the switch
 * to the plain scalar reference kernels the tests check the fast path against.
 *
 * Architecture: token embedding; per block RMSNorm -> grouped-query attention (q/k/v
 * projections, optional q/k/v bias as Qwen2, no o bias; rotary embeddings in HF's rotate-half
 * convention with rope_theta, optionally the "llama3" frequency scaling) -> residual; RMSNorm ->
 * SwiGLU MLP (down(silu(gate(x)) * up(x))) -> residual; final RMSNorm; LM head tied to the
 * embedding or its own matrix. Loss: mean causal cross-entropy over the B*T positions.
 *
 * Flat layout (fp32, row-major, HF names and shapes; linear weights [out, in] as nn.Linear):
 *   model.embed_tokens.weight                       [V, C]
 *   for l in 0..L-1 (model.layers.l.):
 *     self_attn.q_proj.weight [NH*hd, C]  (.bias [NH*hd] with qkv_bias)
 *     self_attn.k_proj.weight [KV*hd, C]  (.bias [KV*hd])
 *     self_attn.v_proj.weight [KV*hd, C]  (.bias [KV*hd])
 *     self_attn.o_proj.weight [C, NH*hd]
 *     mlp.gate_proj.weight [F, C]   mlp.up_proj.weight [F, C]   mlp.down_proj.weight [C, F]
 *     input_layernorm.weight [C]    post_attention_layernorm.weight [C]
 *   model.norm.weight                               [C]
 *   lm_head.weight                                  [V, C]   (untied only)
 * Units: 0 the embedding, 1..L the blocks, L+1 the final norm (and the untied head).
 */
#ifndef MEMWALL_LLAMA_H
#define MEMWALL_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mw_net;
struct mw_net_config;

enum mw_llama_rope { MW_LLAMA_ROPE_DEFAULT = 0, MW_LLAMA_ROPE_LLAMA3 = 1 };

struct mw_llama_config {
    int n_layer;      /* L */
    int n_head;       /* NH query heads */
    int n_kv_head;    /* KV key/value heads; divides NH */
    int head_dim;     /* hd, even */
    int dim;          /* C hidden size */
    int ffn;          /* F intermediate size */
    int vocab;        /* V embedding rows = logits columns */
    int context;      /* max_position_embeddings: the longest sequence accepted */
    int tied;         /* LM head = embed_tokens */
    int qkv_bias;     /* q/k/v projections have biases (Qwen2) */
    int rope_type;    /* enum mw_llama_rope */
    int rope_orig_ctx;            /* llama3: original_max_position_embeddings */
    float rms_eps;
    float rope_theta;
    float rope_factor, rope_low, rope_high; /* llama3: factor, low_freq_factor, high_freq_factor */
};

/* 0 or -EINVAL with the reason in mw_error_msg(). */
int mw_llama_config_check(const struct mw_llama_config *c);
/* Parses the text of an HF config.json (model_type "llama" or "qwen2"; rope in transformers v4's
 * rope_theta + rope_scaling or v5's rope_parameters). Settings memwall does not implement are
 * refused with the key named (MW_EFORMAT). `path` only names the file in messages. */
int mw_llama_config_parse(const char *text, size_t len, const char *path, struct mw_llama_config *c);
/* A config in the table's form (family "llama"). */
void mw_net_config_llama(struct mw_net_config *out, const struct mw_llama_config *c);
/* The plain scalar kernels (1) or the fast path (0, the default) for this instance's passes. */
void mw_llama_set_reference(struct mw_net *n, int on);

#ifdef __cplusplus
}
#endif
#endif
