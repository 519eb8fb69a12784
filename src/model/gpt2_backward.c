/*
 * gpt2_backward.c — the backward pass, accumulating into the flat gradient array and telling
 * the caller, block by block in reverse order, when a contiguous gradient range is final.
 *
 * Why the order of the callbacks: the LM head and ln_f are done first, then blocks L-1..0,
 * and wte last (the tied embedding collects gradient from the LM head at the start AND from
 * the token lookup at the end), so wte + wpe form the final range. Each block's 12 tensors are
 * contiguous in the flat array, so each callback is a single (first, count) range.
 * Activation gradients need only three scratch buffers (dres [BT,C] along the residual
 * stream, dC [BT,C], dbig [BT,4C]) reused by every block; logits become dlogits in place.
 */
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <errno.h>
#include <string.h>

void mw_gpt2_block_fwd(struct mw_gpt2 *m, int l, int B, int T, int keep_out); /* gpt2_forward.c */
void mw_gpt2_block_bwd_(struct mw_gpt2 *m, int l, int B, int T);               /* also gpt2_layer_major.c */

void mw_gpt2_block_bwd_(struct mw_gpt2 *m, int l, int B, int T)
{
    struct mw_gpt2_impl *im = m->impl;
    struct mw_gpt2_layer_acts *a = &im->layer[l];
    const float *p = m->params;
    float *g = m->grads;
    int C = m->cfg.n_embd, N = B * T, nt = m->opts.n_threads;
    float *dres = im->dres, *dC = im->dC, *dbig = im->dbig;

    /* out = res2 + gelu(fc(ln2(res2))) @ Wfp + bfp */
    mw_k_matmul_bwd(dbig, mw_gpt2_p(m, g, l, MW_GPT2_FCPROJ_W), mw_gpt2_p(m, g, l, MW_GPT2_FCPROJ_B),
                    dres, a->fch_gelu, mw_gpt2_p(m, p, l, MW_GPT2_FCPROJ_W), N, 4 * C, C, nt);
    mw_k_gelu_bwd(dbig, a->fch, (size_t)N * 4 * (size_t)C, nt);
    mw_k_matmul_bwd(dC, mw_gpt2_p(m, g, l, MW_GPT2_FC_W), mw_gpt2_p(m, g, l, MW_GPT2_FC_B),
                    dbig, a->ln2, mw_gpt2_p(m, p, l, MW_GPT2_FC_W), N, C, 4 * C, nt);
    mw_k_layernorm_bwd(dres, mw_gpt2_p(m, g, l, MW_GPT2_LN2_W), mw_gpt2_p(m, g, l, MW_GPT2_LN2_B),
                       dC, a->res2, mw_gpt2_p(m, p, l, MW_GPT2_LN2_W), a->ln2_mean, a->ln2_rstd, N, C, nt);
    /* res2 = x + attn(ln1(x)) @ Wap + bap; dres now holds d(res2) */
    mw_k_matmul_bwd(dC, mw_gpt2_p(m, g, l, MW_GPT2_ATTPROJ_W), mw_gpt2_p(m, g, l, MW_GPT2_ATTPROJ_B),
                    dres, a->atty, mw_gpt2_p(m, p, l, MW_GPT2_ATTPROJ_W), N, C, C, nt);
    mw_k_attention_bwd(dbig, im->datt, dC, a->qkv, a->att, B, T, C, m->cfg.n_head, nt);
    mw_k_matmul_bwd(dC, mw_gpt2_p(m, g, l, MW_GPT2_QKV_W), mw_gpt2_p(m, g, l, MW_GPT2_QKV_B),
                    dbig, a->ln1, mw_gpt2_p(m, p, l, MW_GPT2_QKV_W), N, C, 3 * C, nt);
    mw_k_layernorm_bwd(dres, mw_gpt2_p(m, g, l, MW_GPT2_LN1_W), mw_gpt2_p(m, g, l, MW_GPT2_LN1_B),
                       dC, im->res[l], mw_gpt2_p(m, p, l, MW_GPT2_LN1_W), a->ln1_mean, a->ln1_rstd, N, C, nt);
}

static int unit_hook(struct mw_gpt2 *m, int event, int unit)
{
    return m->weights_hook ? m->weights_hook(m->weights_user, event, unit, 1) : 0;
}

int mw_gpt2_backward(struct mw_gpt2 *m, float grad_scale, mw_gpt2_grad_ready_fn cb, void *user)
{
    struct mw_gpt2_impl *im = m->impl;
    if (!im->have_targets)
        return mw_error_set(-EINVAL, "gpt2 backward: needs a forward with targets just before it");
    int B = m->B, T = m->T, N = B * T;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->cfg.n_layer, nt = m->opts.n_threads;
    int Vp = m->cfg.padded_vocab_size ? m->cfg.padded_vocab_size : V;
    const float *p = m->params;
    float *g = m->grads;
    openblas_set_num_threads(1); /* we split products over our own threads: mw_k_sgemm */

    /* Loss -> logits -> ln_f output, and wte's LM-head share. */
    float *dlogits = im->logits;
    int rc;
    im->have_targets = 0; /* logits become their gradients (also when a hook fails below) */
    mw_k_crossentropy_bwd(dlogits, im->lse, im->targets, grad_scale / (float)N, N, V, Vp, nt);
    if ((rc = unit_hook(m, MW_GPT2_UNIT_ACQUIRE, 0))) return rc;
    mw_k_sgemm(0, 0, N, C, Vp, 1.0f, dlogits, Vp, p + im->off_wte, C, 0.0f, im->dC, C, nt);
    if ((rc = unit_hook(m, MW_GPT2_UNIT_RELEASE, 0))) return rc;
    memset(im->dres, 0, (size_t)N * (size_t)C * sizeof(float));
    if ((rc = unit_hook(m, MW_GPT2_UNIT_ACQUIRE, L + 1))) return rc;
    mw_k_layernorm_bwd(im->dres, g + im->off_lnfw, g + im->off_lnfb, im->dC, im->res[L],
                       p + im->off_lnfw, im->lnf_mean, im->lnf_rstd, N, C, nt);
    if ((rc = unit_hook(m, MW_GPT2_UNIT_RELEASE, L + 1))) return rc;
    if (cb) cb(im->off_lnfw, 2 * (size_t)C, user);

    /* (off[] has 12 entries per block: with one block, off[12] is past its end.) */
    size_t block_numel = (L > 1 ? im->off[MW_GPT2_BLOCK_KINDS] : im->off_lnfw) - im->off[0];
    for (int l = L - 1; l >= 0; l--) {
        if ((rc = unit_hook(m, MW_GPT2_UNIT_ACQUIRE, l + 1))) return rc;
        if (m->opts.recompute && !(l == L - 1 && im->last_layer_live))
            mw_gpt2_block_fwd(m, l, B, T, 0);
        mw_gpt2_block_bwd_(m, l, B, T);
        if ((rc = unit_hook(m, MW_GPT2_UNIT_RELEASE, l + 1))) return rc;
        if (cb) cb(im->off[(size_t)l * MW_GPT2_BLOCK_KINDS], block_numel, user);
    }
    im->last_layer_live = 0;

    /* wte's LM-head share, computed last (dlogits and ln_f's output are kept until here): the
     * embeddings' gradients are then written only at the end of the pass, which lets a ZeRO
     * caller hold them for the shortest time. Same additions in the same order as before. */
    mw_k_sgemm(1, 0, Vp, C, N, 1.0f, dlogits, Vp, im->lnf, C, 1.0f, g + im->off_wte, C, nt);
    mw_k_encoder_bwd(g + im->off_wte, g + im->off_wpe, im->dres, im->inputs, B, T, C, nt);
    if (cb) cb(0, im->off[0], user);
    return 0;
}
