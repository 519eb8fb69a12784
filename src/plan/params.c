/*
 * params.c — exact parameter counts, block by block, split by how parallelism shards them.
 *
 * Every count is built from the per-module shapes of the reference implementations (HF
 * modeling_*.py), so totals match what `sum(p.numel())` prints: GPT-2 124,439,808; Llama-2-7B
 * 6,738,415,616; DeepSeek-V3 671,026,419,200. The TP split follows Megatron (column-parallel
 * weights and biases split, row-parallel biases replicated); for MLA it follows Zhang & Su
 * (arXiv 2502.07846): W_UQ, W_UK, W_UV, W_O split; W_DQ, W_DKV, W_QR, W_KR replicated.
 */
#include "memwall/plan.h"
#include "memwall/common.h"

#include <string.h>

static uint64_t norm_size(const struct mw_model *m, uint64_t width)
{
    return m->norm == MW_NORM_LAYER ? 2 * width : m->norm == MW_NORM_RMS ? width : 0;
}

static uint64_t total_blocks(const struct mw_model *m)
{
    return m->n_layer + (m->arch == MW_ARCH_T5 ? m->n_dec_layer : 0);
}

int mw_model_is_moe_layer(const struct mw_model *m, uint64_t layer)
{
    if (!m->n_routed_experts || layer < m->first_k_dense || layer >= m->n_layer) return 0;
    uint64_t f = m->moe_layer_freq ? m->moe_layer_freq : 1;
    return layer % f == 0;
}

static uint64_t mlp_params(const struct mw_model *m, uint64_t width)
{
    return (m->gated_mlp ? 3 : 2) * m->hidden * width;
}

void mw_model_layer_params(const struct mw_model *m, uint64_t layer, struct mw_layer_params *lp)
{
    memset(lp, 0, sizeof *lp);
    const uint64_t h = m->hidden;
    if (m->arch == MW_ARCH_BARE) return;
    if (m->arch == MW_ARCH_T5) {
        /* Encoder block: self-attention + MLP; decoder adds cross-attention and a third norm.
         * T5 has no biases; d_kv * heads need not equal d_model. */
        uint64_t inner = m->n_head * m->head_dim;
        int dec = layer >= m->n_layer;
        lp->attn_tp = (dec ? 8 : 4) * h * inner;
        lp->mlp_tp = mlp_params(m, m->ffn);
        lp->norms = (dec ? 3 : 2) * h;
    } else if (m->kv_lora_rank) {
        /* MLA (DeepSeek-V2/V3). */
        uint64_t a = m->n_head, qk = m->qk_nope_dim + m->qk_rope_dim;
        if (m->q_lora_rank) {
            lp->attn_rep += h * m->q_lora_rank;                  /* W_DQ (q_a_proj) */
            lp->attn_tp += m->q_lora_rank * a * m->qk_nope_dim;  /* W_UQ */
            lp->attn_rep += m->q_lora_rank * a * m->qk_rope_dim; /* W_QR */
            lp->norms += m->q_lora_rank;                         /* q_a_layernorm */
        } else {
            lp->attn_tp += h * a * qk;                           /* q_proj */
        }
        lp->attn_rep += h * m->kv_lora_rank;                     /* W_DKV */
        lp->attn_rep += h * m->qk_rope_dim;                      /* W_KR */
        lp->norms += m->kv_lora_rank;                            /* kv_a_layernorm */
        lp->attn_tp += m->kv_lora_rank * a * (m->qk_nope_dim + m->v_head_dim); /* W_UK, W_UV */
        lp->attn_tp += a * m->v_head_dim * h;                    /* W_O */
        lp->norms += 2 * norm_size(m, h);
    } else {
        uint64_t q = m->n_head * m->head_dim, kv = m->n_kv_head * m->head_dim;
        lp->attn_tp = h * (q + 2 * kv) + q * h;
        if (m->bias_linear || m->bias_qkv) lp->attn_tp += q + 2 * kv;
        if (m->bias_linear) lp->attn_rep += h;                   /* output-projection bias */
        lp->norms = 2 * norm_size(m, h);
    }
    if (m->arch != MW_ARCH_T5) {
        if (mw_model_is_moe_layer(m, layer)) {
            lp->n_routed = m->n_routed_experts;
            lp->expert = mlp_params(m, m->moe_ffn);
            lp->shared = m->n_shared_experts * lp->expert;
            lp->router = m->n_routed_experts * h + (m->router_bias ? m->n_routed_experts : 0);
        } else {
            lp->mlp_tp = mlp_params(m, m->ffn);
            if (m->bias_linear) { lp->mlp_tp += m->ffn; lp->mlp_rep += h; }
        }
    }
    lp->total = lp->attn_tp + lp->attn_rep + lp->mlp_tp + lp->mlp_rep + lp->norms +
                lp->n_routed * lp->expert + lp->shared + lp->router;
}

/* 1-D parameters (norm weights/biases, linear biases, router bias) of one block. */
static uint64_t layer_vectors(const struct mw_model *m, uint64_t layer, const struct mw_layer_params *lp)
{
    uint64_t v = lp->norms;
    if (m->arch == MW_ARCH_T5) return v;
    if (!m->kv_lora_rank && (m->bias_linear || m->bias_qkv))
        v += m->n_head * m->head_dim + 2 * m->n_kv_head * m->head_dim;
    if (m->bias_linear) v += m->hidden;
    if (mw_model_is_moe_layer(m, layer)) {
        if (m->router_bias) v += m->n_routed_experts;
    } else if (m->bias_linear) {
        v += m->ffn + m->hidden;
    }
    return v;
}

void mw_model_count(const struct mw_model *m, struct mw_param_count *c)
{
    memset(c, 0, sizeof *c);
    const uint64_t h = m->hidden;
    if (m->arch == MW_ARCH_BARE) {
        c->total = c->active = m->bare_params;
        c->largest_layer = m->bare_largest;
        return;
    }
    c->embedding = m->vocab * h + m->type_vocab * h;
    c->position = m->max_pos * h;
    c->head = m->tied_embeddings ? 0 : m->vocab * h;
    uint64_t total = c->embedding + c->position + c->head, active = total, vec = 0;
    uint64_t largest = MW_MAX(m->vocab * h, c->position);
    for (uint64_t i = 0; i < total_blocks(m); i++) {
        struct mw_layer_params lp;
        mw_model_layer_params(m, i, &lp);
        total += lp.total;
        active += lp.total - (lp.n_routed ? (lp.n_routed - m->experts_per_tok) * lp.expert : 0);
        vec += layer_vectors(m, i, &lp);
        if (lp.n_routed) {
            c->n_moe_layers++;
            if (!c->moe_layer) c->moe_layer = lp.total;
        } else {
            c->n_dense_layers++;
            if (!c->dense_layer) c->dense_layer = lp.total;
        }
        if (!c->attn_layer) c->attn_layer = lp.attn_tp + lp.attn_rep + lp.norms - 2 * norm_size(m, h);
        if (lp.n_routed && !c->expert) c->expert = lp.expert;
    }
    /* Largest single module: the widest linear of a block (with its bias). */
    if (m->arch == MW_ARCH_GPT) largest = MW_MAX(largest, 3 * h * h + 3 * h); /* fused c_attn */
    if (m->ffn) largest = MW_MAX(largest, h * m->ffn + (m->bias_linear ? m->ffn : 0));
    if (m->kv_lora_rank)
        largest = MW_MAX(largest, (m->q_lora_rank ? m->q_lora_rank : h) * m->n_head *
                                      (m->qk_nope_dim + m->qk_rope_dim));
    /* Final norms: one per stack (T5 has two stacks, plus 32*heads relative-position biases). */
    uint64_t finals = norm_size(m, h);
    if (m->arch == MW_ARCH_T5) finals = 2 * (norm_size(m, h) + m->rel_buckets * m->n_head);
    if (m->arch == MW_ARCH_BERT) finals = norm_size(m, h) + h * h + h; /* embedding LN + pooler */
    total += finals;
    active += finals;
    vec += m->arch == MW_ARCH_T5 ? 2 * norm_size(m, h) :
           m->arch == MW_ARCH_BERT ? norm_size(m, h) + h : norm_size(m, h);
    c->total = total;
    c->active = active;
    c->vectors = vec;
    c->largest_layer = largest;
}

uint64_t mw_model_matmul_params(const struct mw_model *m)
{
    if (m->arch == MW_ARCH_BARE) return m->bare_params;
    uint64_t p = m->vocab * m->hidden; /* LM head (tied or not) */
    for (uint64_t i = 0; i < total_blocks(m); i++) {
        struct mw_layer_params lp;
        mw_model_layer_params(m, i, &lp);
        uint64_t bias = 0;
        if (!m->kv_lora_rank && (m->bias_linear || m->bias_qkv))
            bias += m->n_head * m->head_dim + 2 * m->n_kv_head * m->head_dim;
        if (m->bias_linear && !m->kv_lora_rank) bias += m->hidden; /* output-projection bias */
        p += lp.attn_tp + lp.attn_rep - bias;
        if (lp.n_routed) {
            p += m->experts_per_tok * lp.expert + lp.shared + m->n_routed_experts * m->hidden;
        } else {
            p += lp.mlp_tp - (m->bias_linear ? m->ffn : 0);
        }
    }
    return p;
}

static uint64_t ceil128(uint64_t x) { return (x + 127) / 128; }

/* One FP8 linear [out, in]: its elements and its f32 128x128 block scales. */
static void fp8_linear(struct mw_ckpt_count *c, uint64_t out, uint64_t in, uint64_t copies)
{
    c->fp8 += copies * out * in;
    c->f32 += copies * ceil128(out) * ceil128(in);
}

void mw_model_checkpoint_count(const struct mw_model *m, struct mw_ckpt_count *c)
{
    memset(c, 0, sizeof *c);
    struct mw_param_count pc;
    mw_model_count(m, &pc);
    if (m->arch != MW_ARCH_DEEPSEEK) { /* no FP8 layout known: everything in bf16 */
        c->bf16 = c->total = pc.total;
        return;
    }
    /* DeepSeek-V3 release: every block linear in FP8 with block scales; embeddings, head,
     * norms, router and the MTP eh_proj in bf16; the router bias in f32. The MTP blocks
     * repeat a MoE block and add enorm, hnorm, eh_proj[h, 2h], shared_head.norm and a copy
     * of the embedding and head. */
    const uint64_t h = m->hidden, a = m->n_head;
    const uint64_t nblk = m->n_layer + m->n_mtp_layers;
    for (uint64_t i = 0; i < nblk; i++) {
        uint64_t li = i < m->n_layer ? i : m->n_layer - 1; /* MTP blocks are MoE blocks */
        if (m->q_lora_rank) {
            fp8_linear(c, m->q_lora_rank, h, 1);
            fp8_linear(c, a * (m->qk_nope_dim + m->qk_rope_dim), m->q_lora_rank, 1);
            c->bf16 += m->q_lora_rank;
        } else {
            fp8_linear(c, a * (m->qk_nope_dim + m->qk_rope_dim), h, 1);
        }
        fp8_linear(c, m->kv_lora_rank + m->qk_rope_dim, h, 1);
        fp8_linear(c, a * (m->qk_nope_dim + m->v_head_dim), m->kv_lora_rank, 1);
        fp8_linear(c, h, a * m->v_head_dim, 1);
        c->bf16 += m->kv_lora_rank + 2 * norm_size(m, h);
        if (mw_model_is_moe_layer(m, li)) {
            uint64_t n = m->n_routed_experts + m->n_shared_experts;
            fp8_linear(c, m->moe_ffn, h, 2 * n);
            fp8_linear(c, h, m->moe_ffn, n);
            c->bf16 += m->n_routed_experts * h;
            if (m->router_bias) c->f32 += m->n_routed_experts;
        } else {
            fp8_linear(c, m->ffn, h, 2);
            fp8_linear(c, h, m->ffn, 1);
        }
    }
    c->bf16 += (1 + m->n_mtp_layers) * (m->vocab * h + (m->tied_embeddings ? 0 : m->vocab * h));
    c->bf16 += norm_size(m, h);                                         /* final norm */
    c->bf16 += m->n_mtp_layers * (3 * norm_size(m, h) + 2 * h * h);     /* enorm, hnorm, head norm, eh_proj */
    c->total = c->fp8 + c->bf16 + c->f32;
}
