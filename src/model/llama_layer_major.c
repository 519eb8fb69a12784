/*
 * llama_layer_major.c — the Llama family's layer-major step: all of a step's micro-batches run
 * through each weight unit in turn (GreedySnake's vertical schedule; gpt2_layer_major.c says why),
 * and the blocks' activations either recomputed in backward from each block's kept input or
 * taken from the caller's slots (calls->acts: the trainer writes them to NVMe in forward and reads
 * them back ahead of backward, src/train/acts.c).
 *
 * What a micro-batch keeps between units, in one mapping: its block inputs (res[0..L]; with the
 * caller's slots only two, used in turn, since each block's input travels with its activations),
 * the residual-stream gradient dres, its tokens. A slot is the block's input [BT, C] (padded to 16
 * floats) then its activations in llama_carve_block's layout; the model's own block pointers are
 * bound to a slot before the same kernels run, so both ways give the same bits (the trainer's
 * tests compare them with the batch-major step).
 *
 * Order of weight units (hook) and of gradient-ready callbacks: llama.c's header.
 */
#include "llama_internal.h"
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static size_t bt_c(const struct llama *m) { return MW_ALIGN_UP((size_t)m->max_batch * (size_t)m->max_seq * (size_t)m->c.dim, 16); }
static size_t n_res(const struct llama *m, int acts) { return acts ? 2 : (size_t)m->c.n_layer + 1; }

static size_t per_mb_floats(const struct llama *m, int acts)
{
    size_t BT = (size_t)m->max_batch * (size_t)m->max_seq;
    return (n_res(m, acts) + 1) * bt_c(m) + 2 * MW_ALIGN_UP(BT, 16);
}

size_t llama_lm_bytes(const struct mw_net *n, int nmb, int acts)
{
    return nmb > 0 ? MW_ALIGN_UP(per_mb_floats(CLL(n), acts) * sizeof(float) * (size_t)nmb, 4096) : 0;
}

static size_t block_floats(const struct llama *m)
{
    struct llama_acts a;
    float *none = NULL;
    return llama_carve_block(&m->c, m->max_batch, m->max_seq, &none, &a);
}

size_t llama_act_slot_bytes(const struct mw_net *n)
{
    return MW_ALIGN_UP((bt_c(CLL(n)) + block_floats(CLL(n))) * sizeof(float), 4096);
}

static void bind(struct llama *m, int l, float *slot)
{
    float *p = slot + bt_c(m);
    (void)llama_carve_block(&m->c, m->max_batch, m->max_seq, &p, &m->layer[l]);
}

void llama_acts_lend(struct mw_net *n, float *slot)
{
    struct llama *m = LL(n);
    for (int l = 0; l < m->c.n_layer; l++) bind(m, l, slot);
}

/* The model's own block activations the slots replace (left untouched once lent). */
size_t llama_own_block_bytes(const struct mw_net *n)
{
    return block_floats(CLL(n)) * sizeof(float) * (n->opts.recompute ? 1 : (size_t)n->n_layer);
}

struct lm_mb { float **res, *dres; int32_t *inputs, *targets; };

static void mb_at(const struct llama *m, float *base, int k, int acts, float **res, struct lm_mb *mb)
{
    size_t S = bt_c(m);
    float *p = base + per_mb_floats(m, acts) * (size_t)k;
    mb->res = res;
    for (int l = 0; l <= m->c.n_layer; l++) res[l] = p + S * (acts ? (size_t)(l & 1) : (size_t)l);
    p += S * n_res(m, acts);
    mb->dres = p; p += S;
    mb->inputs = (int32_t *)p; p += MW_ALIGN_UP((size_t)m->max_batch * (size_t)m->max_seq, 16);
    mb->targets = (int32_t *)p;
}

/* Block l of micro-batch k forward; with slots, its input and activations go to one. */
static int block_fwd(struct llama *m, const float *p, int l, int k, struct lm_mb *mb, int B, int T,
                     const struct mw_net_lm_calls *calls)
{
    float *slot = NULL;
    int rc;
    if (calls && calls->acts) {
        if ((rc = calls->acts(calls->user, MW_NET_ACTS_FILL, l, k, &slot))) return rc;
        memcpy(slot, mb->res[l], (size_t)B * (size_t)T * (size_t)m->c.dim * sizeof(float));
        bind(m, l, slot);
    }
    llama_block_fwd(m, p, l, mb->res[l], mb->res[l + 1], B, T);
    return calls && calls->acts ? calls->acts(calls->user, MW_NET_ACTS_FILLED, l, k, &slot) : 0;
}

/* Block l of micro-batch k backward: from the slot, or recomputed from the kept input. */
static int block_bwd(struct llama *m, const float *p, float *g, int l, int k, struct lm_mb *mb, int B, int T,
                     const struct mw_net_lm_calls *calls)
{
    float *slot = NULL;
    const float *x = mb->res[l];
    int rc;
    if (calls && calls->acts) {
        if ((rc = calls->acts(calls->user, MW_NET_ACTS_GET, l, k, &slot))) return rc;
        bind(m, l, slot);
        x = slot;
    } else {
        llama_block_fwd(m, p, l, x, NULL, B, T);
    }
    float *own = m->dres;
    m->dres = mb->dres;
    llama_block_bwd(m, p, g, l, x, B, T);
    m->dres = own;
    return calls && calls->acts ? calls->acts(calls->user, MW_NET_ACTS_DONE, l, k, &slot) : 0;
}

/* The head of every micro-batch: loss, and backward down to each one's residual gradient. */
static void head_step(struct llama *m, const float *p, float *g, float *base, int nmb, int acts, float **res, int B,
                      int T, float grad_scale, float *losses)
{
    const struct mw_llama_config *c = &m->c;
    float *own = m->dres;
    int N = B * T, C = c->dim, V = c->vocab, L = c->n_layer;
    struct lm_mb mb;
    for (int k = 0; k < nmb; k++) {
        mb_at(m, base, k, acts, res, &mb);
        losses[k] = llama_head_fwd(m, p, mb.res[L], 0, mb.targets, N);
        mw_k_crossentropy_bwd(m->logits, m->lse, mb.targets, grad_scale / (float)N, N, V, V, m->nt);
        lk_linear_bwd(m->dC, 0, c->tied ? g + m->off_embed : g + m->off_head, NULL, m->logits, m->xnf,
                      llama_head_w(m, p), N, C, V, m->ref, m->nt);
        m->dres = mb.dres;
        llama_head_bwd_norm(m, p, g, mb.res[L], N);
        m->dres = own;
    }
}

int llama_step_layer_major(struct mw_net *n, int nmb, const int32_t *inputs, const int32_t *targets, int B, int T,
                           float grad_scale, const struct mw_net_lm_calls *calls, float *losses)
{
    struct llama *m = LL(n);
    const struct mw_llama_config *c = &m->c;
    int L = c->n_layer, C = c->dim, V = c->vocab, nt = m->nt, rc = 0, acts = calls && calls->acts;
    if (nmb < 1 || B <= 0 || T <= 0 || B > m->max_batch || T > m->max_seq)
        return mw_error_set(-EINVAL, "llama layer-major step: %d micro-batches of B=%d T=%d outside the sizes the model "
                            "was built for (max_batch=%d, max_seq=%d)", nmb, B, T, m->max_batch, m->max_seq);
    size_t N = (size_t)B * (size_t)T, bytes = llama_lm_bytes(n, nmb, acts);
    if ((rc = llama_check_tokens(inputs, N * (size_t)nmb, V, "inputs")) ||
        (rc = llama_check_tokens(targets, N * (size_t)nmb, V, "targets")))
        return rc;
    float *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float **res = malloc(((size_t)L + 1) * sizeof *res);
    struct llama_acts *own_layer = malloc((size_t)L * sizeof *own_layer); /* slots rebind them */
    if (base == MAP_FAILED || !res || !own_layer) {
        if (base != MAP_FAILED) munmap(base, bytes);
        free(res);
        free(own_layer);
        return mw_error_set(-ENOMEM, "llama layer-major step: no memory for %d micro-batches' block inputs (%zu bytes)",
                            nmb, bytes);
    }
    memcpy(own_layer, m->layer, (size_t)L * sizeof *own_layer);
    const float *p = n->params;
    float *g = n->grads;
    struct lm_mb mb;
    m->have_targets = 0;
    m->last_live = 0;
    m->B = B;
    m->T = T;
    openblas_set_num_threads(1);
    uint64_t t0 = mw_now_ns();
    for (int k = 0; k < nmb; k++) {
        mb_at(m, base, k, acts, res, &mb);
        memcpy(mb.inputs, inputs + (size_t)k * N, N * sizeof(int32_t));
        memcpy(mb.targets, targets + (size_t)k * N, N * sizeof(int32_t));
    }
    if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, 0, 0))) goto out;
    for (int k = 0; k < nmb; k++) {
        mb_at(m, base, k, acts, res, &mb);
        lk_embed_fwd(mb.res[0], mb.inputs, p + m->off_embed, (int)N, C, nt);
    }
    if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, 0, 0))) goto out;
    for (int l = 0; l < L; l++) {
        if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, l + 1, 0))) goto out;
        for (int k = 0; k < nmb; k++) {
            mb_at(m, base, k, acts, res, &mb);
            if ((rc = block_fwd(m, p, l, k, &mb, B, T, calls))) goto out;
        }
        if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, l + 1, 0))) goto out;
    }
    if (calls && calls->before_grads && (rc = calls->before_grads(calls->user))) goto out;
    if (calls && calls->forward_done) calls->forward_done(calls->user, mw_now_ns() - t0);
    t0 = mw_now_ns();
    if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, L + 1, 0))) goto out;
    if (c->tied && (rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, 0, 0))) goto out;
    head_step(m, p, g, base, nmb, acts, res, B, T, grad_scale, losses);
    if (c->tied && (rc = llama_hook(m, MW_NET_UNIT_RELEASE, 0, 0))) goto out;
    if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, L + 1, 0))) goto out;
    if (calls && calls->grad_ready) calls->grad_ready(m->off_norm, llama_head_grad_numel(m), calls->user);
    for (int l = L - 1; l >= 0; l--) {
        if ((rc = llama_hook(m, MW_NET_UNIT_ACQUIRE, l + 1, 1))) goto out;
        for (int k = 0; k < nmb; k++) {
            mb_at(m, base, k, acts, res, &mb);
            if ((rc = block_bwd(m, p, g, l, k, &mb, B, T, calls))) goto out;
        }
        if ((rc = llama_hook(m, MW_NET_UNIT_RELEASE, l + 1, 1))) goto out;
        if (calls && calls->grad_ready) calls->grad_ready(m->off[0] + (size_t)l * m->block_numel, m->block_numel, calls->user);
    }
    for (int k = 0; k < nmb; k++) {
        mb_at(m, base, k, acts, res, &mb);
        lk_embed_bwd(g + m->off_embed, mb.dres, mb.inputs, (int)N, C, nt);
    }
    if (calls && calls->grad_ready) calls->grad_ready(m->off_embed, (size_t)V * (size_t)C, calls->user);
    if (calls && calls->backward_done) calls->backward_done(calls->user, mw_now_ns() - t0);
out:
    memcpy(m->layer, own_layer, (size_t)L * sizeof *own_layer);
    free(own_layer);
    n->loss = -1.0f;
    munmap(base, bytes);
    free(res);
    return rc;
}
