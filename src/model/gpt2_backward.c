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
#include <sys/mman.h>

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

size_t mw_gpt2_defer_bytes(const struct mw_gpt2 *m, int count)
{
    size_t BT = (size_t)m->opts.max_batch * (size_t)m->opts.max_seq, C = (size_t)m->cfg.n_embd;
    return count > 1 ? MW_ALIGN_UP((BT * C + BT) * sizeof(float) * (size_t)(count - 1), 4096) : 0;
}

int mw_gpt2_accum_set(struct mw_gpt2 *m, int index, int count)
{
    struct mw_gpt2_impl *im = m->impl;
    if (count < 0 || (count > 1 && (index < 0 || index >= count)))
        return mw_error_set(-EINVAL, "gpt2: micro-batch %d of %d does not exist", index, count);
    size_t need = mw_gpt2_defer_bytes(m, count);
    if (need > im->defer_bytes) { /* mapped: its pages come and go with use */
        float *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return mw_error_set(-ENOMEM, "gpt2: no memory for %d micro-batches' residual gradients (%zu bytes)", count - 1,
                                need);
        if (im->defer) munmap(im->defer, im->defer_bytes);
        im->defer = p;
        im->defer_bytes = need;
    }
    im->acc_i = index;
    im->acc_n = count;
    return 0;
}

/* The token lookup's share of wte and wpe (dres is the gradient of the embeddings' output): kept
 * for the last micro-batch, which adds every micro-batch's in order (mw_gpt2_accum_set). */
static int lookup_bwd(struct mw_gpt2 *m, int B, int T)
{
    struct mw_gpt2_impl *im = m->impl;
    size_t BT = (size_t)m->opts.max_batch * (size_t)m->opts.max_seq, C = (size_t)m->cfg.n_embd;
    size_t N = (size_t)B * (size_t)T, per = BT * C + BT;
    float *g = m->grads;
    if (im->acc_n > 1 && im->acc_i == 0) { im->acc_B = B; im->acc_T = T; }
    if (im->acc_n > 1 && (B != im->acc_B || T != im->acc_T)) {
        im->acc_n = 0;
        return mw_error_set(-EINVAL, "gpt2 backward: micro-batch of B=%d T=%d in a step whose first was B=%d T=%d", B, T,
                            im->acc_B, im->acc_T);
    }
    if (im->acc_n > 1 && im->acc_i < im->acc_n - 1) {
        float *d = im->defer + per * (size_t)im->acc_i;
        memcpy(d, im->dres, N * C * sizeof(float));
        memcpy(d + BT * C, im->inputs, N * sizeof(int32_t));
        return 0;
    }
    for (int k = 0; im->acc_n > 1 && k < im->acc_i; k++) {
        float *d = im->defer + per * (size_t)k;
        mw_k_encoder_bwd(g + im->off_wte, g + im->off_wpe, d, (const int32_t *)(d + BT * C), B, T, m->cfg.n_embd,
                         m->opts.n_threads);
    }
    mw_k_encoder_bwd(g + im->off_wte, g + im->off_wpe, im->dres, im->inputs, B, T, m->cfg.n_embd, m->opts.n_threads);
    im->acc_n = 0;
    return 0;
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
     * caller hold them for the shortest time. Then the lookup's share, or kept for the step's
     * last micro-batch (mw_gpt2_accum_set). */
    mw_k_sgemm(1, 0, Vp, C, N, 1.0f, dlogits, Vp, im->lnf, C, 1.0f, g + im->off_wte, C, nt);
    if ((rc = lookup_bwd(m, B, T))) return rc;
    if (cb) cb(0, im->off[0], user);
    return 0;
}
