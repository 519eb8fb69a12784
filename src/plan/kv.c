/*
 * kv.c — inference KV-cache bytes.
 *
 * Per token and block: 2 (K and V) x KV heads x head width x dtype bytes (MHA, GQA). MLA
 * caches one compressed latent of kv_lora_rank plus the shared RoPE key of qk_rope_dim
 * (DeepSeek-V3: 576 elements per block, 70,272 bytes per token in bf16 over 61 blocks).
 * Tensor parallelism splits KV heads over ranks; when TP exceeds the KV heads each rank
 * still holds one head (replicated TP / KV times). MLA's latent is needed whole by every
 * head, so every TP rank holds all of it.
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "plan/internal.h"

static double per_block(const struct mw_model *m, enum mw_dtype kv, uint64_t tp)
{
    double e = mw_dtype_bytes(kv);
    if (m->kv_lora_rank) return (double)(m->kv_lora_rank + m->qk_rope_dim) * e;
    uint64_t heads = m->n_kv_head;
    if (tp > 1) heads = heads >= tp ? mw_cdiv_(heads, tp) : 1;
    return 2.0 * (double)(heads * m->head_dim) * e;
}

uint64_t mw_kv_bytes_per_token_rank(const struct mw_model *m, enum mw_dtype kv, uint64_t tp)
{
    if (m->arch == MW_ARCH_BARE) return 0;
    /* Decoder blocks only for T5 (its encoder output is computed once, not cached per token). */
    uint64_t L = m->arch == MW_ARCH_T5 ? m->n_dec_layer : m->n_layer;
    return (uint64_t)(per_block(m, kv, tp) * (double)L);
}

uint64_t mw_kv_bytes_per_token(const struct mw_model *m, enum mw_dtype kv)
{
    return mw_kv_bytes_per_token_rank(m, kv, 1);
}
