/*
 * gpt2_forward.c — the forward pass: embeddings, L pre-LayerNorm blocks, final LayerNorm,
 * tied LM head, fused softmax + cross-entropy.
 *
 * Why block_fwd takes `keep_out`: with activation recomputation the backward pass re-runs a
 * block from its saved input to regenerate everything its backward needs; the block's output
 * (the input of the next block) is already saved, so the recompute skips the last linear
 * layer (mlp.c_proj, a third of the block's FLOPs). Forward and recompute run the very same
 * code on the same data, which is why recomputed gradients are bitwise identical.
 */
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <errno.h>
#include <string.h>

void mw_gpt2_block_fwd(struct mw_gpt2 *m, int l, int B, int T, int keep_out)
{
    struct mw_gpt2_impl *im = m->impl;
    struct mw_gpt2_layer_acts *a = &im->layer[l];
    const float *p = m->params;
    int C = m->cfg.n_embd, N = B * T, nt = m->opts.n_threads;
    const float *x = im->res[l];
    mw_k_layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, x, mw_gpt2_p(m, p, l, MW_GPT2_LN1_W),
                       mw_gpt2_p(m, p, l, MW_GPT2_LN1_B), N, C, nt);
    mw_k_matmul_fwd(a->qkv, a->ln1, mw_gpt2_p(m, p, l, MW_GPT2_QKV_W), mw_gpt2_p(m, p, l, MW_GPT2_QKV_B),
                    NULL, N, C, 3 * C, nt);
    mw_k_attention_fwd(a->atty, a->att, a->qkv, B, T, C, m->cfg.n_head, nt);
    mw_k_matmul_fwd(a->res2, a->atty, mw_gpt2_p(m, p, l, MW_GPT2_ATTPROJ_W),
                    mw_gpt2_p(m, p, l, MW_GPT2_ATTPROJ_B), x, N, C, C, nt);
    mw_k_layernorm_fwd(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, mw_gpt2_p(m, p, l, MW_GPT2_LN2_W),
                       mw_gpt2_p(m, p, l, MW_GPT2_LN2_B), N, C, nt);
    mw_k_matmul_fwd(a->fch, a->ln2, mw_gpt2_p(m, p, l, MW_GPT2_FC_W), mw_gpt2_p(m, p, l, MW_GPT2_FC_B),
                    NULL, N, C, 4 * C, nt);
    mw_k_gelu_fwd(a->fch_gelu, a->fch, (size_t)N * 4 * (size_t)C, nt);
    if (keep_out)
        mw_k_matmul_fwd(im->res[l + 1], a->fch_gelu, mw_gpt2_p(m, p, l, MW_GPT2_FCPROJ_W),
                        mw_gpt2_p(m, p, l, MW_GPT2_FCPROJ_B), a->res2, N, 4 * C, C, nt);
}

static int check_tokens(const int32_t *tok, size_t n, int V, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return mw_error_set(-EINVAL, "gpt2 forward: %s[%zu] = %d is outside the vocabulary 0..%d",
                                what, i, (int)tok[i], V - 1);
    return 0;
}

static int unit_hook(struct mw_gpt2 *m, int event, int unit)
{
    return m->weights_hook ? m->weights_hook(m->weights_user, event, unit, 0) : 0;
}

int mw_gpt2_forward(struct mw_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T)
{
    struct mw_gpt2_impl *im = m->impl;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->cfg.n_layer, nt = m->opts.n_threads;
    int Vp = m->cfg.padded_vocab_size ? m->cfg.padded_vocab_size : V;
    im->have_targets = 0;
    im->last_layer_live = 0;
    if (B <= 0 || T <= 0 || B > m->opts.max_batch || T > m->opts.max_seq)
        return mw_error_set(-EINVAL, "gpt2 forward: B=%d T=%d outside the sizes the model was built "
                            "for (max_batch=%d, max_seq=%d)", B, T, m->opts.max_batch, m->opts.max_seq);
    size_t N = (size_t)B * (size_t)T;
    int rc = check_tokens(inputs, N, V, "inputs");
    if (!rc && targets) rc = check_tokens(targets, N, V, "targets");
    if (rc) return rc;
    memcpy(im->inputs, inputs, N * sizeof(int32_t));
    if (targets) memcpy(im->targets, targets, N * sizeof(int32_t));
    m->B = B;
    m->T = T;
    openblas_set_num_threads(1); /* we split products over our own threads: mw_k_sgemm */

    const float *p = m->params;
    if ((rc = unit_hook(m, MW_GPT2_UNIT_ACQUIRE, 0))) return rc;
    mw_k_encoder_fwd(im->res[0], im->inputs, p + im->off_wte, p + im->off_wpe, B, T, C, nt);
    if ((rc = unit_hook(m, MW_GPT2_UNIT_RELEASE, 0))) return rc;
    for (int l = 0; l < L; l++) {
        if ((rc = unit_hook(m, MW_GPT2_UNIT_ACQUIRE, l + 1))) return rc;
        mw_gpt2_block_fwd(m, l, B, T, 1);
        if ((rc = unit_hook(m, MW_GPT2_UNIT_RELEASE, l + 1))) return rc;
    }
    if ((rc = unit_hook(m, MW_GPT2_UNIT_ACQUIRE, L + 1))) return rc;
    mw_k_layernorm_fwd(im->lnf, im->lnf_mean, im->lnf_rstd, im->res[L], p + im->off_lnfw,
                       p + im->off_lnfb, (int)N, C, nt);
    if ((rc = unit_hook(m, MW_GPT2_UNIT_RELEASE, L + 1))) return rc;
    if ((rc = unit_hook(m, MW_GPT2_UNIT_ACQUIRE, 0))) return rc;
    mw_k_sgemm(0, 1, (int)N, Vp, C, 1.0f, im->lnf, C, p + im->off_wte, C, 0.0f, im->logits, Vp, nt);
    if ((rc = unit_hook(m, MW_GPT2_UNIT_RELEASE, 0))) return rc;
    if (!targets) {
        m->loss = -1.0f;
        return 0;
    }
    mw_k_crossentropy_fwd(im->losses, im->lse, im->logits, im->targets, (int)N, V, Vp, nt);
    double s = 0.0;
    for (size_t i = 0; i < N; i++) s += im->losses[i];
    m->loss = (float)(s / (double)N);
    im->have_targets = 1;
    im->last_layer_live = m->opts.recompute;
    return 0;
}
