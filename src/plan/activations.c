/*
 * activations.c — bytes a rank keeps for the backward pass.
 *
 * Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
 * Table 2) count, per GPT block and micro-batch, 34sbh + 5as^2b bytes: 10sbh that tensor
 * parallelism replicates (norm inputs/outputs, dropout masks), 24sbh it splits (Q, K, V,
 * projection input, the two MLP intermediates of width 4h), and 5as^2b of attention scores
 * (softmax output, dropout mask and output). Sequence parallelism splits the replicated part
 * too; selective recomputation drops the score term (as FlashAttention does); full
 * recomputation keeps only each block's input, 2sbh.
 *
 * DETAILED (the default) keeps that itemization but sizes each item from the real shapes:
 * GQA's narrower K/V, SwiGLU's three intermediates of width ffn, MLA's compressed q/kv and
 * their norms, MoE's router logits, permuted expert inputs and k active experts (Zhang & Su,
 * arXiv 2502.07846), and dropout only for the architectures that train with it. For a GPT
 * block it is exactly Table 2. CLASSIC applies Table 2's GPT constants to any model (the
 * Ultra-Scale Playbook's convention); ZERO and ZERO_INFINITY reproduce those papers' simpler
 * estimates.
 *
 * A pipeline rank holds min(PP - rank, micro-batches) micro-batches in flight (1F1B); with
 * interleaving, rank 0 holds (1 + (PP-1)/(PP*chunks)) times more (Korthikanti eq. 5).
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "plan/internal.h"

double mw_act_korthikanti(double s, double b, double h, double a, double t, int sp,
                          enum mw_recompute rc)
{
    double sbh = s * b * h;
    if (rc == MW_RECOMPUTE_FULL) return 2 * sbh / (sp ? t : 1);
    double rep = sp ? 10 / t : 10, split = 24 / t, score = rc == MW_RECOMPUTE_SELECTIVE ? 0 : 5 * a * s / (h * t);
    return sbh * (rep + split + score);
}

static int has_dropout(const struct mw_model *m)
{
    return m->arch == MW_ARCH_GPT || m->arch == MW_ARCH_BERT || m->arch == MW_ARCH_T5;
}

uint64_t mw_act_layer_bytes(const struct mw_model *m, const struct mw_layout *l, uint64_t layer)
{
    const double s = (double)l->seq, b = (double)l->micro_batch, T = s * b;
    const double h = (double)m->hidden, a = (double)m->n_head, t = (double)l->tp;
    const double e = mw_dtype_bytes(l->act), rdiv = l->sequence_parallel ? t : 1;
    const int moe = mw_model_is_moe_layer(m, layer);
    const double k = (double)m->experts_per_tok;
    if (m->arch == MW_ARCH_BARE) return 0;

    switch (l->act_model) {
    case MW_ACT_CLASSIC:
        return (uint64_t)(mw_act_korthikanti(s, b, h, a, t, l->sequence_parallel, l->recompute) + 0.5);
    case MW_ACT_ZERO:
        return (uint64_t)(l->recompute == MW_RECOMPUTE_FULL ? T * e * h : T * 12 * h * e);
    case MW_ACT_ZERO_INFINITY:
        return (uint64_t)(l->recompute == MW_RECOMPUTE_FULL ? T * e * h : T * (16 * h + 2 * a * s) * e);
    case MW_ACT_DETAILED:
        break;
    }
    if (l->recompute == MW_RECOMPUTE_FULL) {
        /* The block input; a MoE block also checkpoints the MoE input and its routing map. */
        double bytes = T * e * h / rdiv;
        if (moe) bytes += T * e * h / rdiv + T * 2 * k;
        return (uint64_t)(bytes + 0.5);
    }
    double rep = 4 * h, split = 0, masks = 0, score = 0, score_mask = 0;
    /* Attention. */
    if (m->kv_lora_rank) {
        double q = a * (double)(m->qk_nope_dim + m->qk_rope_dim), v = a * (double)m->v_head_dim;
        rep += 2.0 * (double)m->q_lora_rank + (double)(m->kv_lora_rank + m->qk_rope_dim) +
               (double)m->kv_lora_rank;
        split += 2 * q + 2 * v;                 /* Q, K, V, projection input */
    } else {
        double q = a * (double)m->head_dim, kv = (double)(m->n_kv_head * m->head_dim);
        split += 2 * q + 2 * kv;
    }
    score = (has_dropout(m) ? 2 : 1) * a * s;   /* softmax output (+ dropout output) */
    if (has_dropout(m)) { score_mask = a * s; masks += 2 * h; }
    if (l->recompute == MW_RECOMPUTE_SELECTIVE) score = score_mask = 0;
    /* MLP or MoE. */
    double per_mlp = m->gated_mlp ? 3 : 2;      /* intermediates of width ffn kept */
    double split_expert = 0;
    if (moe) {
        rep += 2 * (double)m->n_routed_experts;  /* router logits and probabilities */
        split_expert = k * h + (k + (double)m->n_shared_experts) * per_mlp * (double)m->moe_ffn;
    } else {
        split += per_mlp * (double)m->ffn;
    }
    if (m->arch == MW_ARCH_T5 && layer >= m->n_layer) { /* cross-attention: Q, K, V, proj, norm */
        split += 4 * a * (double)m->head_dim;
        rep += 2 * h;
        score *= 2;
        score_mask *= 2;
    }
    double bytes = T * (e * rep / rdiv + masks / rdiv + e * split / t + e * split_expert / l->etp +
                        (e * score + score_mask) / t);
    return (uint64_t)(bytes + 0.5);
}

void mw_plan_stage_act_(const struct mw_model *m, const struct mw_layout *l, struct mw_stage *s)
{
    if (m->arch == MW_ARCH_BARE || l->inference) return; /* inference keeps no activations */
    const uint64_t nmb = mw_layout_microbatches(l);
    const uint64_t inflight = MW_MIN(l->pp - s->index, nmb);
    double factor = 1;
    if (l->interleave > 1 && s->index == 0)
        factor = 1 + (double)(l->pp - 1) / (double)(l->pp * l->interleave);
    double layers = 0;
    uint64_t worst_block = 0;
    s->act_per_layer = 0;
    for (uint64_t c = 0; c < l->interleave; c++) {
        uint64_t first, count;
        mw_plan_stage_layers(m, l, s->index, c, &first, &count);
        for (uint64_t i = first; i < first + count; i++) {
            uint64_t b = mw_act_layer_bytes(m, l, i);
            if (!s->act_per_layer) s->act_per_layer = b;
            layers += (double)b;
            if (l->recompute == MW_RECOMPUTE_FULL) {
                struct mw_layout nr = *l;
                nr.recompute = MW_RECOMPUTE_SELECTIVE;
                worst_block = MW_MAX(worst_block, mw_act_layer_bytes(m, &nr, i));
            }
        }
    }
    s->inflight = inflight;
    s->act_layers = (uint64_t)(layers * (double)inflight * factor + 0.5);
    /* Full recomputation re-materializes one block at a time during the backward pass. */
    s->gpu.buffers += worst_block;

    const double T = (double)(l->seq * l->micro_batch), h = (double)m->hidden;
    const double e = mw_dtype_bytes(l->act), rdiv = l->sequence_parallel ? (double)l->tp : 1;
    double other = 0;
    if (s->has_embedding) /* token ids (int64) and the embedding output (dropout mask or copy) */
        other += (double)inflight * factor * (8 * T + (has_dropout(m) ? 1 : e) * T * h / rdiv);
    if (s->has_head)      /* final-norm input, head input, fp32 logits: one micro-batch */
        other += 2 * e * T * h / rdiv + 4 * T * (double)m->vocab / (double)l->tp;
    s->act_other = (uint64_t)other;
}
