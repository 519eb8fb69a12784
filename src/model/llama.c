/*
 * llama.c — the Llama family's instance: layout, sizes, initialisation, forward and backward (the
 * layer-major step is llama_layer_major.c; the table that exposes them, llama_net.c).
 *
 * Memory, sized first (llama_acts_floats) and allocated once: parameters and gradients (flat,
 * page-aligned), one activation allocation for (max_batch, max_seq): each block's activations
 * (one shared set with recomputation), the block inputs res[0..L], the final norm, the logits and
 * the backward scratch.
 *
 * Gradient order, so that batch-major and layer-major give the same bits (the trainer checks it):
 * every gradient receives the micro-batches' contributions in micro-batch order, and the embedding
 * (which also takes the tied head's share) receives every micro-batch's head share before any
 * lookup share: batch-major keeps the lookups' residual gradients until the step's last
 * micro-batch (accum_set, as GPT-2 does), layer-major runs the head inside the forward pass and
 * the lookups last.
 *
 * Weight units (hook): 0 the embedding, 1..L the blocks, L+1 the final norm (+ untied head).
 * Forward acquires 0, 1..L, L+1 (and 0 again for a tied head); batch-major backward (0 when
 * tied), L+1, L..1; layer-major backward L..1 (the head's backward runs in its forward). The
 * lookups' share of the embedding gradient needs no weights: no unit is acquired for it.
 */
#include "llama_internal.h"
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void llama_tensor_layout(const struct mw_llama_config *c, size_t *off, size_t *block_numel, size_t *off_norm,
                         size_t *off_head, size_t *n_params)
{
    size_t C = (size_t)c->dim, QD = (size_t)c->n_head * (size_t)c->head_dim, KD = (size_t)c->n_kv_head * (size_t)c->head_dim;
    size_t F = (size_t)c->ffn, V = (size_t)c->vocab, bias = c->qkv_bias ? 1 : 0;
    size_t sz[LK_N] = {QD * C, QD * bias, KD * C, KD * bias, KD * C, KD * bias, C * QD, F * C, F * C, C * F, C, C};
    size_t o = V * C, b0 = o;
    for (int k = 0; k < LK_N; k++) { off[k] = o; o += sz[k]; }
    *block_numel = o - b0;
    *off_norm = b0 + (size_t)c->n_layer * *block_numel;
    *off_head = *off_norm + C;
    *n_params = *off_head + (c->tied ? 0 : V * C);
}

/* Carves n floats (16-aligned) from *p, or counts them when *p is NULL. */
static float *take(float **p, size_t *count, size_t n)
{
    n = MW_ALIGN_UP(n, 16);
    *count += n;
    if (!*p) return NULL;
    float *r = *p;
    *p += n;
    return r;
}

/* One block's activations from *p (advanced; NULL: only counted). Returns the floats taken. */
size_t llama_carve_block(const struct mw_llama_config *c, int B, int T, float **p, struct llama_acts *a)
{
    size_t N = (size_t)B * (size_t)T, C = (size_t)c->dim, QD = (size_t)c->n_head * (size_t)c->head_dim;
    size_t KD = (size_t)c->n_kv_head * (size_t)c->head_dim, F = (size_t)c->ffn, TT = (size_t)T * (size_t)T, cnt = 0;
    a->xn1 = take(p, &cnt, N * C); a->rstd1 = take(p, &cnt, N);
    a->q = take(p, &cnt, N * QD); a->k = take(p, &cnt, N * KD); a->v = take(p, &cnt, N * KD);
    a->att = take(p, &cnt, (size_t)B * (size_t)c->n_head * TT);
    a->atty = take(p, &cnt, N * QD); a->res2 = take(p, &cnt, N * C);
    a->xn2 = take(p, &cnt, N * C); a->rstd2 = take(p, &cnt, N);
    a->gate = take(p, &cnt, N * F); a->up = take(p, &cnt, N * F); a->h = take(p, &cnt, N * F);
    return cnt;
}

static size_t carve(const struct mw_llama_config *c, int B, int T, int recompute, int nt, float *base,
                    struct llama *m)
{
    size_t N = (size_t)B * (size_t)T, C = (size_t)c->dim, QD = (size_t)c->n_head * (size_t)c->head_dim;
    size_t KD = (size_t)c->n_kv_head * (size_t)c->head_dim, F = (size_t)c->ffn, V = (size_t)c->vocab;
    size_t TT = (size_t)T * (size_t)T, cnt = 0;
    float *p = base;
    int L = c->n_layer, sets = recompute ? 1 : L;
    for (int s = 0; s < sets; s++) {
        struct llama_acts a;
        cnt += llama_carve_block(c, B, T, &p, &a);
        if (m)
            for (int l = s; l < L; l += sets) m->layer[l] = a;
    }
    for (int l = 0; l <= L; l++) {
        float *r = take(&p, &cnt, N * C);
        if (m) m->res[l] = r;
    }
    float *xnf = take(&p, &cnt, N * C), *rstdf = take(&p, &cnt, N), *logits = take(&p, &cnt, N * V);
    float *losses = take(&p, &cnt, N), *lse = take(&p, &cnt, N), *dres = take(&p, &cnt, N * C);
    float *dC = take(&p, &cnt, N * C), *dq = take(&p, &cnt, N * QD), *dk = take(&p, &cnt, N * KD);
    float *dv = take(&p, &cnt, N * KD), *datty = take(&p, &cnt, N * QD), *dgate = take(&p, &cnt, N * F);
    float *dup = take(&p, &cnt, N * F), *scratch = take(&p, &cnt, (size_t)nt * TT);
    if (m) {
        m->xnf = xnf; m->rstdf = rstdf; m->logits = logits; m->losses = losses; m->lse = lse; m->dres = dres;
        m->dC = dC; m->dq = dq; m->dk = dk; m->dv = dv; m->datty = datty; m->dgate = dgate; m->dup = dup;
        m->scratch = scratch;
    }
    return cnt;
}

size_t llama_acts_floats(const struct mw_llama_config *c, int B, int T, int recompute, int nt)
{
    return carve(c, B, T, recompute, nt, NULL, NULL);
}

/* ------------------------------------------------------------------ the passes */

int llama_hook(struct llama *m, int event, int unit, int backward)
{
    return m->hook ? m->hook(m->hook_user, event, unit, backward) : 0;
}

/* out = x + attn(norm1(x)); out += mlp(norm2(.)); out NULL: everything but the down projection
 * (the recomputation in backward: the block's output is kept already). */
void llama_block_fwd(struct llama *m, const float *p, int l, const float *x, float *out, int B, int T)
{
    const struct mw_llama_config *c = &m->c;
    struct llama_acts *a = &m->layer[l];
    int N = B * T, C = c->dim, hd = c->head_dim, QD = c->n_head * hd, KD = c->n_kv_head * hd, F = c->ffn;
    int nt = m->nt, ref = m->ref, bias = c->qkv_bias;
    lk_rmsnorm_fwd(a->xn1, a->rstd1, x, llama_w(m, p, l, LK_LN1_W), c->rms_eps, N, C, nt);
    lk_linear_fwd(a->q, a->xn1, llama_w(m, p, l, LK_Q_W), bias ? llama_w(m, p, l, LK_Q_B) : NULL, NULL, N, C, QD, ref, nt);
    lk_linear_fwd(a->k, a->xn1, llama_w(m, p, l, LK_K_W), bias ? llama_w(m, p, l, LK_K_B) : NULL, NULL, N, C, KD, ref, nt);
    lk_linear_fwd(a->v, a->xn1, llama_w(m, p, l, LK_V_W), bias ? llama_w(m, p, l, LK_V_B) : NULL, NULL, N, C, KD, ref, nt);
    lk_rope_fwd(a->q, m->cos, m->sin, N, T, c->n_head, hd, nt);
    lk_rope_fwd(a->k, m->cos, m->sin, N, T, c->n_kv_head, hd, nt);
    lk_attention_fwd(a->atty, a->att, a->q, a->k, a->v, B, T, c->n_head, c->n_kv_head, hd, ref, nt);
    lk_linear_fwd(a->res2, a->atty, llama_w(m, p, l, LK_O_W), NULL, x, N, QD, C, ref, nt);
    lk_rmsnorm_fwd(a->xn2, a->rstd2, a->res2, llama_w(m, p, l, LK_LN2_W), c->rms_eps, N, C, nt);
    lk_linear_fwd(a->gate, a->xn2, llama_w(m, p, l, LK_GATE_W), NULL, NULL, N, C, F, ref, nt);
    lk_linear_fwd(a->up, a->xn2, llama_w(m, p, l, LK_UP_W), NULL, NULL, N, C, F, ref, nt);
    lk_swiglu_fwd(a->h, a->gate, a->up, (size_t)N * (size_t)F, nt);
    if (out) lk_linear_fwd(out, a->h, llama_w(m, p, l, LK_DOWN_W), NULL, a->res2, N, F, C, ref, nt);
}

/* m->dres holds d(block output) and becomes d(x). */
void llama_block_bwd(struct llama *m, const float *p, float *g, int l, const float *x, int B, int T)
{
    const struct mw_llama_config *c = &m->c;
    struct llama_acts *a = &m->layer[l];
    int N = B * T, C = c->dim, hd = c->head_dim, QD = c->n_head * hd, KD = c->n_kv_head * hd, F = c->ffn;
    int nt = m->nt, ref = m->ref, bias = c->qkv_bias;
    float *dres = m->dres, *dC = m->dC, *dh = m->dup;
#define GW(kind) ((float *)llama_w(m, g, l, kind))
    lk_linear_bwd(dh, 0, GW(LK_DOWN_W), NULL, dres, a->h, llama_w(m, p, l, LK_DOWN_W), N, F, C, ref, nt);
    lk_swiglu_bwd(m->dgate, m->dup, dh, a->gate, a->up, (size_t)N * (size_t)F, nt);
    lk_linear_bwd(dC, 0, GW(LK_GATE_W), NULL, m->dgate, a->xn2, llama_w(m, p, l, LK_GATE_W), N, C, F, ref, nt);
    lk_linear_bwd(dC, 1, GW(LK_UP_W), NULL, m->dup, a->xn2, llama_w(m, p, l, LK_UP_W), N, C, F, ref, nt);
    lk_rmsnorm_bwd(dres, GW(LK_LN2_W), dC, a->res2, llama_w(m, p, l, LK_LN2_W), a->rstd2, N, C, nt);
    lk_linear_bwd(m->datty, 0, GW(LK_O_W), NULL, dres, a->atty, llama_w(m, p, l, LK_O_W), N, QD, C, ref, nt);
    lk_attention_bwd(m->dq, m->dk, m->dv, m->scratch, m->datty, a->q, a->k, a->v, a->att, B, T, c->n_head,
                     c->n_kv_head, hd, ref, nt);
    lk_rope_bwd(m->dq, m->cos, m->sin, N, T, c->n_head, hd, nt);
    lk_rope_bwd(m->dk, m->cos, m->sin, N, T, c->n_kv_head, hd, nt);
    lk_linear_bwd(dC, 0, GW(LK_Q_W), bias ? GW(LK_Q_B) : NULL, m->dq, a->xn1, llama_w(m, p, l, LK_Q_W), N, C, QD, ref, nt);
    lk_linear_bwd(dC, 1, GW(LK_K_W), bias ? GW(LK_K_B) : NULL, m->dk, a->xn1, llama_w(m, p, l, LK_K_W), N, C, KD, ref, nt);
    lk_linear_bwd(dC, 1, GW(LK_V_W), bias ? GW(LK_V_B) : NULL, m->dv, a->xn1, llama_w(m, p, l, LK_V_W), N, C, KD, ref, nt);
    lk_rmsnorm_bwd(dres, GW(LK_LN1_W), dC, x, llama_w(m, p, l, LK_LN1_W), a->rstd1, N, C, nt);
#undef GW
}

const float *llama_head_w(const struct llama *m, const float *p) { return p + (m->c.tied ? m->off_embed : m->off_head); }

/* The head of one micro-batch: the final norm of res_last (unless done: a tied head's norm runs
 * in its own unit), logits, loss (mean, returned). */
float llama_head_fwd(struct llama *m, const float *p, const float *res_last, int norm_done, const int32_t *targets, int N)
{
    const struct mw_llama_config *c = &m->c;
    int C = c->dim, V = c->vocab, nt = m->nt;
    if (!norm_done) lk_rmsnorm_fwd(m->xnf, m->rstdf, res_last, p + m->off_norm, c->rms_eps, N, C, nt);
    lk_linear_fwd(m->logits, m->xnf, llama_head_w(m, p), NULL, NULL, N, C, V, m->ref, nt);
    if (!targets) return -1.0f;
    mw_k_crossentropy_fwd(m->losses, m->lse, m->logits, targets, N, V, V, nt);
    double s = 0.0;
    for (int i = 0; i < N; i++) s += m->losses[i];
    return (float)(s / (double)N);
}

int llama_check_tokens(const int32_t *tok, size_t n, int V, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= V)
            return mw_error_set(-EINVAL, "llama: %s[%zu] = %d is outside the vocabulary 0..%d", what, i, (int)tok[i], V - 1);
    return 0;
}

int llama_forward(struct mw_net *n, const int32_t *inputs, const int32_t *targets, int B, int T)
{
    struct llama *m = LL(n);
    const struct mw_llama_config *c = &m->c;
    int L = c->n_layer, rc;
    m->have_targets = 0;
    m->last_live = 0;
    n->loss = -1.0f;
    if (B <= 0 || T <= 0 || B > m->max_batch || T > m->max_seq)
        return mw_error_set(-EINVAL, "llama forward: B=%d T=%d outside the sizes the model was built for "
                            "(max_batch=%d, max_seq=%d)", B, T, m->max_batch, m->max_seq);
    size_t N = (size_t)B * (size_t)T;
    if ((rc = llama_check_tokens(inputs, N, c->vocab, "inputs")) || (targets && (rc = llama_check_tokens(targets, N, c->vocab, "targets"))))
        return rc;
    memcpy(m->inputs, inputs, N * sizeof(int32_t));
    if (targets) memcpy(m->targets, targets, N * sizeof(int32_t));
    m->B = B;
    m->T = T;
    openblas_set_num_threads(1); /* products are split over our own threads: mw_k_sgemm */
    const float *p = n->params;
    if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, 0, 0))) return rc;
    lk_embed_fwd(m->res[0], m->inputs, p + m->off_embed, (int)N, c->dim, m->nt);
    if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, 0, 0))) return rc;
    for (int l = 0; l < L; l++) {
        if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, l + 1, 0))) return rc;
        llama_block_fwd(m, p, l, m->res[l], m->res[l + 1], B, T);
        if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, l + 1, 0))) return rc;
    }
    if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, L + 1, 0))) return rc;
    if (c->tied) { /* the norm's unit, then the embedding's for the head */
        lk_rmsnorm_fwd(m->xnf, m->rstdf, m->res[L], p + m->off_norm, c->rms_eps, (int)N, c->dim, m->nt);
        if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, L + 1, 0)) || (rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, 0, 0))) return rc;
    }
    float loss = llama_head_fwd(m, p, m->res[L], c->tied, targets, (int)N);
    if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, c->tied ? 0 : L + 1, 0))) return rc;
    if (!targets) return 0;
    n->loss = loss;
    m->have_targets = 1;
    m->last_live = n->opts.recompute;
    return 0;
}

/* Head backward of one micro-batch whose logits hold dlogits: dC, the head's weight gradient
 * (untied: here; tied: the caller adds it to the embedding), the norm's, and dres = d(res_last). */
void llama_head_bwd_norm(struct llama *m, const float *p, float *g, const float *res_last, int N)
{
    const struct mw_llama_config *c = &m->c;
    memset(m->dres, 0, (size_t)N * (size_t)c->dim * sizeof(float));
    lk_rmsnorm_bwd(m->dres, g + m->off_norm, m->dC, res_last, p + m->off_norm, m->rstdf, N, c->dim, m->nt);
}

size_t llama_head_grad_numel(const struct llama *m)
{
    return (size_t)m->c.dim + (m->c.tied ? 0 : (size_t)m->c.vocab * (size_t)m->c.dim);
}

int llama_accum_set(struct mw_net *n, int index, int count)
{
    struct llama *m = LL(n);
    if (count < 0 || (count > 1 && (index < 0 || index >= count)))
        return mw_error_set(-EINVAL, "llama: micro-batch %d of %d does not exist", index, count);
    size_t BT = (size_t)m->max_batch * (size_t)m->max_seq, need = count > 1 ? (BT * (size_t)m->c.dim + BT) * sizeof(float) * (size_t)(count - 1) : 0;
    need = MW_ALIGN_UP(need, 4096);
    if (need > m->defer_bytes) {
        float *d = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (d == MAP_FAILED)
            return mw_error_set(-ENOMEM, "llama: no memory for %d micro-batches' residual gradients (%zu bytes)", count - 1, need);
        if (m->defer) munmap(m->defer, m->defer_bytes);
        m->defer = d;
        m->defer_bytes = need;
    }
    m->acc_i = index;
    m->acc_n = count;
    return 0;
}

size_t llama_defer_bytes(const struct mw_net *n, int count)
{
    const struct llama *m = CLL(n);
    size_t BT = (size_t)m->max_batch * (size_t)m->max_seq;
    return count > 1 ? MW_ALIGN_UP((BT * (size_t)m->c.dim + BT) * sizeof(float) * (size_t)(count - 1), 4096) : 0;
}

/* The lookups' share of the embedding gradient, kept until the step's last micro-batch. */
static int lookup_bwd(struct mw_net *n, int B, int T)
{
    struct llama *m = LL(n);
    size_t BT = (size_t)m->max_batch * (size_t)m->max_seq, C = (size_t)m->c.dim, N = (size_t)B * (size_t)T;
    size_t per = BT * C + BT;
    float *g = n->grads + m->off_embed;
    if (m->acc_n > 1 && m->acc_i == 0) { m->acc_B = B; m->acc_T = T; }
    if (m->acc_n > 1 && (B != m->acc_B || T != m->acc_T)) {
        m->acc_n = 0;
        return mw_error_set(-EINVAL, "llama backward: micro-batch of B=%d T=%d in a step whose first was B=%d T=%d", B, T,
                            m->acc_B, m->acc_T);
    }
    if (m->acc_n > 1 && m->acc_i < m->acc_n - 1) {
        float *d = m->defer + per * (size_t)m->acc_i;
        memcpy(d, m->dres, N * C * sizeof(float));
        memcpy(d + BT * C, m->inputs, N * sizeof(int32_t));
        return 0;
    }
    for (int k = 0; m->acc_n > 1 && k < m->acc_i; k++) {
        float *d = m->defer + per * (size_t)k;
        lk_embed_bwd(g, d, (const int32_t *)(d + BT * C), (int)N, (int)C, m->nt);
    }
    lk_embed_bwd(g, m->dres, m->inputs, (int)N, (int)C, m->nt);
    m->acc_n = 0;
    return 0;
}

int llama_backward(struct mw_net *n, float grad_scale, mw_net_grad_ready_fn cb, void *user)
{
    struct llama *m = LL(n);
    const struct mw_llama_config *c = &m->c;
    if (!m->have_targets) return mw_error_set(-EINVAL, "llama backward: needs a forward with targets just before it");
    int B = m->B, T = m->T, N = B * T, L = c->n_layer, C = c->dim, V = c->vocab, nt = m->nt, rc;
    const float *p = n->params;
    float *g = n->grads;
    openblas_set_num_threads(1);
    m->have_targets = 0;
    mw_k_crossentropy_bwd(m->logits, m->lse, m->targets, grad_scale / (float)N, N, V, V, nt);
    if (c->tied) {
        if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, 0, 1))) return rc;
        lk_linear_bwd(m->dC, 0, NULL, NULL, m->logits, m->xnf, llama_head_w(m, p), N, C, V, m->ref, nt);
        if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, 0, 1))) return rc;
        if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, L + 1, 1))) return rc;
    } else {
        if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, L + 1, 1))) return rc;
        lk_linear_bwd(m->dC, 0, g + m->off_head, NULL, m->logits, m->xnf, llama_head_w(m, p), N, C, V, m->ref, nt);
    }
    llama_head_bwd_norm(m, p, g, m->res[L], N);
    if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, L + 1, 1))) return rc;
    if (cb) cb(m->off_norm, llama_head_grad_numel(m), user);
    for (int l = L - 1; l >= 0; l--) {
        if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, l + 1, 1))) return rc;
        if (n->opts.recompute && !(l == L - 1 && m->last_live)) llama_block_fwd(m, p, l, m->res[l], NULL, B, T);
        llama_block_bwd(m, p, g, l, m->res[l], B, T);
        if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, l + 1, 1))) return rc;
        if (cb) cb(m->off[0] + (size_t)l * m->block_numel, m->block_numel, user);
    }
    m->last_live = 0;
    /* The tied head's share of the embedding last (its gradient range is reported last), then
     * the lookups'. */
    if (c->tied) lk_linear_bwd(NULL, 0, g + m->off_embed, NULL, m->logits, m->xnf, NULL, N, C, V, m->ref, nt);
    if ((rc = lookup_bwd(n, B, T))) return rc; /* (needs no weights: no unit acquired) */
    if (cb) cb(m->off_embed, (size_t)V * (size_t)C, user);
    return 0;
}

/* ------------------------------------------------------------------ instance */


static const char *kind_name[LK_N] = {
    "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias",
    "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
};

static int build_tensors(struct llama *m)
{
    const struct mw_llama_config *c = &m->c;
    size_t C = (size_t)c->dim, QD = (size_t)c->n_head * (size_t)c->head_dim, KD = (size_t)c->n_kv_head * (size_t)c->head_dim;
    size_t F = (size_t)c->ffn, V = (size_t)c->vocab;
    size_t shape[LK_N][2] = {{QD, C}, {QD, 1}, {KD, C}, {KD, 1}, {KD, C}, {KD, 1}, {C, QD}, {F, C}, {F, C}, {C, F}, {C, 1}, {C, 1}};
    int per = c->qkv_bias ? LK_N : LK_N - 3, nt = 2 + per * c->n_layer + (c->tied ? 0 : 1);
    m->tensors = calloc((size_t)nt, sizeof *m->tensors);
    m->names = calloc((size_t)nt, 64);
    if (!m->tensors || !m->names) return -ENOMEM;
    int i = 0;
#define ADD(nm_fmt, nd, s0, s1, o, ...) do { \
        char *nm = m->names + (size_t)i * 64; snprintf(nm, 64, nm_fmt, __VA_ARGS__); \
        m->tensors[i] = (struct mw_net_tensor){nm, nd, {s0, s1}, o, (s0) * (s1)}; i++; } while (0)
    ADD("%s", 2, V, C, m->off_embed, "model.embed_tokens.weight");
    for (int l = 0; l < c->n_layer; l++)
        for (int k = 0; k < LK_N; k++) {
            if (!c->qkv_bias && (k == LK_Q_B || k == LK_K_B || k == LK_V_B)) continue;
            ADD("model.layers.%d.%s", shape[k][1] == 1 ? 1 : 2, shape[k][0], shape[k][1],
                m->off[k] + (size_t)l * m->block_numel, l, kind_name[k]);
        }
    ADD("%s", 1, C, (size_t)1, m->off_norm, "model.norm.weight");
    if (!c->tied) ADD("%s", 2, V, C, m->off_head, "lm_head.weight");
#undef ADD
    m->n_tensors = i;
    return 0;
}

void llama_free(struct mw_net *n)
{
    struct llama *m = LL(n);
    if (!m) return;
    mw_net_floats_free(n->params, m->n_params);
    mw_net_floats_free(n->grads, m->n_params);
    mw_net_floats_free(m->acts_mem, m->acts_floats);
    free(m->layer);
    free(m->res);
    free(m->cos);
    free(m->sin);
    free(m->inputs);
    free(m->targets);
    free(m->tensors);
    free(m->names);
    if (m->defer) munmap(m->defer, m->defer_bytes);
    free(m);
    n->impl = NULL;
    n->params = n->grads = NULL;
}

int llama_sizes(const void *cfg, const struct mw_net_options *o, struct mw_net_sizes *out)
{
    const struct mw_llama_config *c = cfg;
    size_t off[LK_N], bn, on, oh, np;
    int B = o->max_batch, T = o->max_seq ? o->max_seq : c->context;
    if (B <= 0 || T <= 0 || T > c->context)
        return mw_error_set(-EINVAL, "llama: max_batch %d / max_seq %d outside 1..(context %d)", B, T, c->context);
    int nt = o->n_threads > 0 ? o->n_threads : omp_get_max_threads();
    llama_tensor_layout(c, off, &bn, &on, &oh, &np);
    out->n_params = np;
    out->params_bytes = out->grads_bytes = np * sizeof(float);
    out->acts_bytes = llama_acts_floats(c, B, T, o->recompute, nt) * sizeof(float);
    out->acts_bytes_full = llama_acts_floats(c, B, T, 0, nt) * sizeof(float);
    return 0;
}

int llama_init(struct mw_net *n, const struct mw_net_options *o)
{
    const struct mw_llama_config *c = (const struct mw_llama_config *)n->cfg.raw;
    struct llama *m = calloc(1, sizeof *m);
    if (!m) return mw_error_set(-ENOMEM, "llama: no memory");
    n->impl = m;
    m->c = *c;
    n->opts = *o;
    if (!n->opts.max_seq) n->opts.max_seq = c->context;
    if (n->opts.n_threads <= 0) n->opts.n_threads = omp_get_max_threads();
    m->max_batch = n->opts.max_batch;
    m->max_seq = n->opts.max_seq;
    m->nt = n->opts.n_threads;
    int err = llama_sizes(c, &n->opts, &n->sizes);
    if (err) { llama_free(n); return err; }
    llama_tensor_layout(c, m->off, &m->block_numel, &m->off_norm, &m->off_head, &m->n_params);
    m->off_embed = 0;
    size_t BT = (size_t)m->max_batch * (size_t)m->max_seq, half = (size_t)c->head_dim / 2;
    m->acts_floats = llama_acts_floats(c, m->max_batch, m->max_seq, n->opts.recompute, m->nt);
    n->params = mw_net_floats_alloc(m->n_params); /* fresh pages: untouched, they cost nothing */
    n->grads = mw_net_floats_alloc(m->n_params);
    m->acts_mem = mw_net_floats_alloc(m->acts_floats);
    m->layer = calloc((size_t)c->n_layer, sizeof *m->layer);
    m->res = calloc((size_t)c->n_layer + 1, sizeof *m->res);
    m->cos = malloc((size_t)c->context * half * sizeof(float));
    m->sin = malloc((size_t)c->context * half * sizeof(float));
    m->inputs = calloc(BT, sizeof(int32_t));
    m->targets = calloc(BT, sizeof(int32_t));
    if (!n->params || !n->grads || !m->acts_mem || !m->layer || !m->res || !m->cos || !m->sin || !m->inputs ||
        !m->targets || build_tensors(m)) {
        llama_free(n);
        return mw_error_set(-ENOMEM, "llama: no memory for the model (%zu parameters, %zu activation bytes)",
                            n->sizes.n_params, n->sizes.acts_bytes);
    }
    carve(c, m->max_batch, m->max_seq, n->opts.recompute, m->nt, m->acts_mem, m);
    lk_rope_tables(c, m->cos, m->sin);
    n->n_units = c->n_layer + 2;
    n->n_layer = c->n_layer;
    n->vocab = n->padded_vocab = c->vocab;
    n->context = c->context;
    n->loss = -1.0f;
    return 0;
}

void mw_llama_set_reference(struct mw_net *n, int on) { LL(n)->ref = !!on; }

int llama_unit_range(const struct mw_net *n, int unit, size_t *first, size_t *count)
{
    const struct llama *m = CLL(n);
    int L = m->c.n_layer;
    if (unit < 0 || unit > L + 1) return mw_error_set(-EINVAL, "llama: no unit %d (0..%d)", unit, L + 1);
    if (unit == 0) { *first = m->off_embed; *count = (size_t)m->c.vocab * (size_t)m->c.dim; }
    else if (unit <= L) { *first = m->off[0] + (size_t)(unit - 1) * m->block_numel; *count = m->block_numel; }
    else { *first = m->off_norm; *count = m->n_params - m->off_norm; }
    return 0;
}

/* HF's init (normal, std 0.02, for matrices; norms 1; biases 0), a value per flat index, so the
 * whole and a unit at a time give the same numbers. */
static float init_value(uint64_t seed, size_t i)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + 0xd1b54a32d192ed03ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    double u1 = ((double)(z >> 40) + 0.5) / 16777216.0, u2 = (double)(z & 0xffffff) / 16777216.0;
    return (float)(0.02 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void init_range(struct mw_net *n, uint64_t seed, size_t first, size_t count)
{
    const struct llama *m = CLL(n);
    for (int t = 0; t < m->n_tensors; t++) {
        const struct mw_net_tensor *tt = &m->tensors[t];
        size_t a = MW_MAX(first, tt->offset), b = MW_MIN(first + count, tt->offset + tt->numel);
        int norm = strstr(tt->name, "norm") != NULL, bias = strstr(tt->name, ".bias") != NULL;
        for (size_t i = a; i < b; i++) n->params[i] = norm ? 1.0f : bias ? 0.0f : init_value(seed, i);
    }
}

void llama_init_weights(struct mw_net *n, uint64_t seed) { init_range(n, seed, 0, CLL(n)->n_params); }

int llama_init_weights_unit(struct mw_net *n, uint64_t seed, int unit)
{
    size_t a, k;
    int err = llama_unit_range(n, unit, &a, &k);
    if (!err) init_range(n, seed, a, k);
    return err;
}

void llama_zero_grad(struct mw_net *n) { memset(n->grads, 0, CLL(n)->n_params * sizeof(float)); }
