/*
 * gpt2_layer_major.c — one training step's micro-batches run unit by unit ("layer-major",
 * GreedySnake's vertical schedule) instead of one micro-batch at a time.
 *
 * Why: when the weights stream from NVMe, the batch-major order reads every unit twice per
 * micro-batch; layer-major reads it twice per step, whatever the accumulation, and each unit's
 * gradient is final once its last micro-batch is done, so the gradients never all sit in DRAM.
 *
 * How, without a second copy of the model's code: every micro-batch keeps what crosses a unit
 * boundary (micro-batch 0 in the model's own buffers, the others in one extra mapping) (its block inputs res[0..L], ln_f's output and statistics, the residual-stream
 * gradient dres, its tokens); the model's own pointers are pointed at micro-batch k's copies
 * before the very same kernels run on it. Blocks recompute their insides in backward (block
 * inputs are what is kept). The LM head's logits are not kept (Vp columns per position): the
 * forward computes them for the loss and the head's whole backward (dlogits -> wte's head share,
 * ln_f -> dres) right there. The same kernels on the same inputs give the same bits, and every
 * gradient receives the micro-batches' contributions in the same order as batch-major (wte: all
 * head shares, then all lookups: mw_gpt2_accum_set), so the step is bitwise the batch-major one.
 *
 * Order of weight units (hook): forward 0, 1..L, L+1 and 0 together (ln_f and the tied head),
 * backward L..1 (the lookups' share needs no weights). Gradient-ready callbacks: ln_f after the
 * forward's head phase, blocks L-1..0, the embeddings last (descending flat order, as always).
 */
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void mw_gpt2_block_fwd(struct mw_gpt2 *m, int l, int B, int T, int keep_out); /* gpt2_forward.c */
void mw_gpt2_block_bwd_(struct mw_gpt2 *m, int l, int B, int T);               /* gpt2_backward.c */

/* The model's activation pointers that layer-major points at one micro-batch's copies: what a
 * micro-batch keeps between units (all [BT, ...]). */
struct lm_ptrs {
    float **res;                /* [L + 1] -> [BT, C] */
    float *lnf, *lnf_mean, *lnf_rstd, *dres;
    int32_t *inputs, *targets;
};

/* Block inputs a micro-batch keeps: all L + 1, or two in turn when the blocks' activations are
 * kept by the caller (calls->acts: each block's input goes with them). */
static size_t n_res(const struct mw_gpt2 *m, int acts) { return acts ? 2 : (size_t)m->cfg.n_layer + 1; }

static size_t per_mb_floats(const struct mw_gpt2 *m, int acts)
{
    size_t BT = (size_t)m->opts.max_batch * (size_t)m->opts.max_seq, C = (size_t)m->cfg.n_embd;
    return (n_res(m, acts) + 2) * BT * C + 2 * BT + 2 * BT; /* res, lnf, dres; mean, rstd; inputs, targets */
}

/* Micro-batch 0 uses the model's own buffers; the others get a copy each. */
size_t mw_gpt2_lm_bytes(const struct mw_gpt2 *m, int nmb, int acts)
{
    return nmb > 1 ? MW_ALIGN_UP(per_mb_floats(m, acts) * sizeof(float) * (size_t)(nmb - 1), 4096) : 0;
}

/* A slot: the block's input [BT, C] (padded to 16 floats), then its activations (gpt2.c's layout). */
static size_t slot_res_floats(const struct mw_gpt2 *m)
{
    return MW_ALIGN_UP((size_t)m->opts.max_batch * (size_t)m->opts.max_seq * (size_t)m->cfg.n_embd, 16);
}

size_t mw_gpt2_act_slot_bytes(const struct mw_gpt2 *m)
{
    return MW_ALIGN_UP((slot_res_floats(m) + mw_gpt2_block_acts_floats(m)) * sizeof(float), 4096);
}

size_t mw_gpt2_own_block_bytes(const struct mw_gpt2 *m)
{
    return mw_gpt2_block_acts_floats(m) * sizeof(float) * (m->opts.recompute ? 1 : (size_t)m->cfg.n_layer);
}

void mw_gpt2_acts_lend(struct mw_gpt2 *m, float *slot)
{
    for (int l = 0; l < m->cfg.n_layer; l++) mw_gpt2_block_acts_bind(m, l, slot + slot_res_floats(m));
}

static void ptrs_get(const struct mw_gpt2 *m, struct lm_ptrs *p)
{
    const struct mw_gpt2_impl *im = m->impl;
    memcpy(p->res, im->res, ((size_t)m->cfg.n_layer + 1) * sizeof *p->res);
    p->lnf = im->lnf; p->lnf_mean = im->lnf_mean; p->lnf_rstd = im->lnf_rstd; p->dres = im->dres;
    p->inputs = im->inputs; p->targets = im->targets;
}

static void ptrs_set(struct mw_gpt2 *m, const struct lm_ptrs *p)
{
    struct mw_gpt2_impl *im = m->impl;
    memcpy(im->res, p->res, ((size_t)m->cfg.n_layer + 1) * sizeof *im->res);
    im->lnf = p->lnf; im->lnf_mean = p->lnf_mean; im->lnf_rstd = p->lnf_rstd; im->dres = p->dres;
    im->inputs = p->inputs; im->targets = p->targets;
}

/* Points the model's activation pointers at micro-batch k's copies: k = 0 the model's own
 * buffers (own), the others carved from base; cur->res is the caller's [L + 1] array. */
static void use_mb(struct mw_gpt2 *m, float *base, int k, int acts, const struct lm_ptrs *own, struct lm_ptrs *cur)
{
    if (k == 0) {
        ptrs_set(m, own);
        return;
    }
    size_t BT = (size_t)m->opts.max_batch * (size_t)m->opts.max_seq, C = (size_t)m->cfg.n_embd;
    float *p = base + per_mb_floats(m, acts) * (size_t)(k - 1);
    for (int l = 0; l <= m->cfg.n_layer; l++) cur->res[l] = p + BT * C * (acts ? (size_t)(l & 1) : (size_t)l);
    p += BT * C * n_res(m, acts);
    cur->lnf = p; p += BT * C;
    cur->dres = p; p += BT * C;
    cur->lnf_mean = p; p += BT;
    cur->lnf_rstd = p; p += BT;
    cur->inputs = (int32_t *)p; p += BT;
    cur->targets = (int32_t *)p;
    ptrs_set(m, cur);
}

static int hook(struct mw_gpt2 *m, int event, int unit, int backward)
{
    return m->weights_hook ? m->weights_hook(m->weights_user, event, unit, backward) : 0;
}

int mw_gpt2_step_layer_major(struct mw_gpt2 *m, int nmb, const int32_t *inputs, const int32_t *targets, int B, int T,
                             float grad_scale, const struct mw_gpt2_lm_calls *calls, float *losses)
{
    struct mw_gpt2_impl *im = m->impl;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->cfg.n_layer, nt = m->opts.n_threads;
    int Vp = m->cfg.padded_vocab_size ? m->cfg.padded_vocab_size : V;
    if (nmb < 1 || B <= 0 || T <= 0 || B > m->opts.max_batch || T > m->opts.max_seq)
        return mw_error_set(-EINVAL, "gpt2 layer-major step: %d micro-batches of B=%d T=%d outside the sizes the model "
                            "was built for (max_batch=%d, max_seq=%d)", nmb, B, T, m->opts.max_batch, m->opts.max_seq);
    int acts = calls && calls->acts;
    size_t N = (size_t)B * (size_t)T, bytes = mw_gpt2_lm_bytes(m, nmb, acts), rf = slot_res_floats(m);
    for (size_t i = 0; i < N * (size_t)nmb; i++)
        if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V)
            return mw_error_set(-EINVAL, "gpt2 layer-major step: token %d or target %d at %zu is outside the vocabulary "
                                "0..%d", (int)inputs[i], (int)targets[i], i, V - 1);
    float *base = bytes ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : NULL;
    float **res = malloc(2 * ((size_t)L + 1) * sizeof *res); /* the model's own, then the current one */
    struct mw_gpt2_layer_acts *own_layer = malloc((size_t)L * sizeof *own_layer); /* slots rebind them */
    if (base == MAP_FAILED || !res || !own_layer) {
        if (base && base != MAP_FAILED) munmap(base, bytes);
        free(res);
        free(own_layer);
        return mw_error_set(-ENOMEM, "gpt2 layer-major step: no memory for %d micro-batches' saved activations (%zu bytes)",
                            nmb, bytes);
    }
    struct lm_ptrs keep = {.res = res}, cur = {.res = res + L + 1};
    ptrs_get(m, &keep);
    memcpy(own_layer, im->layer, (size_t)L * sizeof *own_layer);
    m->B = B;
    m->T = T;
    im->have_targets = 0;
    im->last_layer_live = 0;
    openblas_set_num_threads(1);
    const float *p = m->params;
    float *g = m->grads;
    int rc = 0;
    uint64_t t0 = mw_now_ns();

    for (int k = 0; k < nmb; k++) {
        use_mb(m, base, k, acts, &keep, &cur);
        memcpy(im->inputs, inputs + (size_t)k * N, N * sizeof(int32_t));
        memcpy(im->targets, targets + (size_t)k * N, N * sizeof(int32_t));
    }
    /* Forward: the embeddings, then each block, over every micro-batch. */
    if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, 0, 0))) goto out;
    for (int k = 0; k < nmb; k++) {
        use_mb(m, base, k, acts, &keep, &cur);
        mw_k_encoder_fwd(im->res[0], im->inputs, p + im->off_wte, p + im->off_wpe, B, T, C, nt);
    }
    if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, 0, 0))) goto out;
    for (int l = 0; l < L; l++) {
        if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, l + 1, 0))) goto out;
        for (int k = 0; k < nmb; k++) {
            use_mb(m, base, k, acts, &keep, &cur);
            float *slot = NULL;
            if (acts) { /* the input goes with the activations; the output stays here */
                if ((rc = calls->acts(calls->user, MW_GPT2_ACTS_FILL, l, k, &slot))) goto out;
                memcpy(slot, im->res[l], N * (size_t)C * sizeof(float));
                mw_gpt2_block_acts_bind(m, l, slot + rf);
            }
            mw_gpt2_block_fwd(m, l, B, T, 1);
            if (acts && (rc = calls->acts(calls->user, MW_GPT2_ACTS_FILLED, l, k, &slot))) goto out;
        }
        if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, l + 1, 0))) goto out;
    }
    /* The head: loss, and the start of backward down to the residual stream (dres). */
    if (calls && calls->before_grads && (rc = calls->before_grads(calls->user))) goto out;
    if (calls && calls->forward_done) calls->forward_done(calls->user, mw_now_ns() - t0);
    t0 = mw_now_ns();
    if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, L + 1, 0))) goto out;
    if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, 0, 0))) goto out;
    for (int k = 0; k < nmb; k++) {
        use_mb(m, base, k, acts, &keep, &cur);
        mw_k_layernorm_fwd(im->lnf, im->lnf_mean, im->lnf_rstd, im->res[L], p + im->off_lnfw, p + im->off_lnfb, (int)N,
                           C, nt);
        mw_k_sgemm(0, 1, (int)N, Vp, C, 1.0f, im->lnf, C, p + im->off_wte, C, 0.0f, im->logits, Vp, nt);
        mw_k_crossentropy_fwd(im->losses, im->lse, im->logits, im->targets, (int)N, V, Vp, nt);
        double s = 0.0;
        for (size_t i = 0; i < N; i++) s += im->losses[i];
        losses[k] = (float)(s / (double)N);
        mw_k_crossentropy_bwd(im->logits, im->lse, im->targets, grad_scale / (float)N, (int)N, V, Vp, nt);
        mw_k_sgemm(0, 0, (int)N, C, Vp, 1.0f, im->logits, Vp, p + im->off_wte, C, 0.0f, im->dC, C, nt);
        mw_k_sgemm(1, 0, Vp, C, (int)N, 1.0f, im->logits, Vp, im->lnf, C, 1.0f, g + im->off_wte, C, nt);
        memset(im->dres, 0, N * (size_t)C * sizeof(float));
        mw_k_layernorm_bwd(im->dres, g + im->off_lnfw, g + im->off_lnfb, im->dC, im->res[L], p + im->off_lnfw,
                           im->lnf_mean, im->lnf_rstd, (int)N, C, nt);
    }
    if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, 0, 0))) goto out;
    if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, L + 1, 0))) goto out;
    if (calls && calls->grad_ready) calls->grad_ready(im->off_lnfw, 2 * (size_t)C, calls->user);

    /* Backward: each block over every micro-batch, recomputed from its saved input or with the
     * activations the caller kept. */
    size_t block_numel = L == 1 ? im->off_lnfw - im->off[0] : im->off[MW_GPT2_BLOCK_KINDS] - im->off[0];
    for (int l = L - 1; l >= 0; l--) {
        if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, l + 1, 1))) goto out;
        for (int k = 0; k < nmb; k++) {
            use_mb(m, base, k, acts, &keep, &cur);
            float *slot = NULL;
            if (acts) {
                if ((rc = calls->acts(calls->user, MW_GPT2_ACTS_GET, l, k, &slot))) goto out;
                im->res[l] = slot;
                mw_gpt2_block_acts_bind(m, l, slot + rf);
            } else {
                mw_gpt2_block_fwd(m, l, B, T, 0);
            }
            mw_gpt2_block_bwd_(m, l, B, T);
            if (acts && (rc = calls->acts(calls->user, MW_GPT2_ACTS_DONE, l, k, &slot))) goto out;
        }
        if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, l + 1, 1))) goto out;
        if (calls && calls->grad_ready) calls->grad_ready(im->off[(size_t)l * MW_GPT2_BLOCK_KINDS], block_numel, calls->user);
    }
    /* The token lookups' share of wte and wpe (no weights needed), micro-batch by micro-batch. */
    for (int k = 0; k < nmb; k++) {
        use_mb(m, base, k, acts, &keep, &cur);
        mw_k_encoder_bwd(g + im->off_wte, g + im->off_wpe, im->dres, im->inputs, B, T, C, nt);
    }
    if (calls && calls->grad_ready) calls->grad_ready(0, im->off[0], calls->user);
    if (calls && calls->backward_done) calls->backward_done(calls->user, mw_now_ns() - t0);
out:
    ptrs_set(m, &keep);
    memcpy(im->layer, own_layer, (size_t)L * sizeof *own_layer);
    free(own_layer);
    m->loss = -1.0f;
    if (base) munmap(base, bytes);
    free(res);
    return rc;
}
