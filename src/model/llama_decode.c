/*
 * llama_decode.c — incremental decoding for the Llama family (Llama, Qwen2): a grouped-query
 * key/value cache and the forward pass of a few new tokens against it (model.h's kv_init /
 * decode / kv_free; the sampling loop is generate.c).
 *
 * The cache keeps, per block, the keys (after rotary, at their absolute positions) and values of
 * every position so far: n_kv_heads * head_dim floats each, not n_heads * head_dim (query head h
 * reads kv head h / (n_heads / n_kv_heads), as the full forward and HF's repeat_kv do). Layout
 * [L][cap][KD] so that the k/v projections of a chunk write straight into the cache rows.
 *
 * A call runs its tokens in chunks of at most DEC_CHUNK rows, so a long prompt needs scratch for
 * DEC_CHUNK rows only (the MLP's [rows, ffn] is the large piece). Each chunk is the full
 * forward's block on those rows, with rotary at positions pos.. and causal attention over the
 * cache positions 0..pos+i; only the last token's row goes through the final norm and the head.
 * The kernels are the forward's (llama_layers.c: RMSNorm, linear layers, SwiGLU, rotary with the
 * same tables); attention is a direct loop (one query row at a time), which is where the
 * numbers differ from the full forward, by rounding (tests/test_generate.c holds them to 1e-5).
 *
 * Weight units are acquired and released as the forward does (0, 1..L, L+1, 0 for a tied head),
 * so a caller that keeps weights elsewhere can decode through the same hook.
 */
#include "llama_internal.h"
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define DEC_CHUNK 64

struct llama_kv {
    int cap, len, rows, nt;            /* positions held at most / now; scratch rows; threads */
    float *k, *v;                      /* [L][cap][KD] keys (rotated), values */
    float *x, *res2, *xn, *rstd;       /* [rows, C] x3, [rows] */
    float *q, *atty;                   /* [rows, QD] */
    float *gate, *up, *h;              /* [rows, F] */
    float *scores;                     /* [nt][cap] */
    float *xl;                         /* [C] the last row's final norm */
};

void llama_kv_free(void *kvp)
{
    struct llama_kv *kv = kvp;
    if (!kv) return;
    free(kv->k); free(kv->v); free(kv->x); free(kv->res2); free(kv->xn); free(kv->rstd); free(kv->q); free(kv->atty);
    free(kv->gate); free(kv->up); free(kv->h); free(kv->scores); free(kv->xl);
    free(kv);
}

static float *fl(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

int llama_kv_init(const struct mw_net *n, int max_tokens, void **out)
{
    const struct llama *m = CLL(n);
    const struct mw_llama_config *c = &m->c;
    *out = NULL;
    if (max_tokens < 1 || max_tokens > c->context)
        return mw_error_set(-EINVAL, "llama: a KV cache for %d positions, the context is %d", max_tokens, c->context);
    struct llama_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return mw_error_set(-ENOMEM, "llama: no memory for a KV cache");
    size_t L = (size_t)c->n_layer, C = (size_t)c->dim, QD = (size_t)c->n_head * (size_t)c->head_dim;
    size_t KD = (size_t)c->n_kv_head * (size_t)c->head_dim, F = (size_t)c->ffn, cap = (size_t)max_tokens;
    kv->cap = max_tokens;
    kv->rows = MW_MIN(max_tokens, DEC_CHUNK);
    kv->nt = m->nt > 0 ? m->nt : 1;
    size_t R = (size_t)kv->rows;
    kv->k = fl(L * cap * KD); kv->v = fl(L * cap * KD);
    kv->x = fl(R * C); kv->res2 = fl(R * C); kv->xn = fl(R * C); kv->rstd = fl(R);
    kv->q = fl(R * QD); kv->atty = fl(R * QD);
    kv->gate = fl(R * F); kv->up = fl(R * F); kv->h = fl(R * F);
    kv->scores = fl((size_t)kv->nt * cap); kv->xl = fl(C);
    if (!kv->k || !kv->v || !kv->x || !kv->res2 || !kv->xn || !kv->rstd || !kv->q || !kv->atty || !kv->gate || !kv->up ||
        !kv->h || !kv->scores || !kv->xl) {
        llama_kv_free(kv);
        return mw_error_set(-ENOMEM, "llama: no memory for a KV cache of %d positions (%zu MiB of keys and values)",
                            max_tokens, (2 * L * cap * KD * sizeof(float)) >> 20);
    }
    *out = kv;
    return 0;
}

static int hook(struct llama *m, int event, int unit)
{
    return m->hook ? m->hook(m->hook_user, event, unit, 0) : 0;
}

/* atty[M, QD] = causal attention of the M queries at positions pos.. over cache rows 0..pos+i of
 * block l (K, V rows [cap][KD]). */
static void attend(const struct llama *m, struct llama_kv *kv, int l, int M, int pos)
{
    const struct mw_llama_config *c = &m->c;
    int NH = c->n_head, hd = c->head_dim, rep = c->n_head / c->n_kv_head, QD = NH * hd, KD = c->n_kv_head * hd;
    float scale = 1.0f / sqrtf((float)hd);
    const float *K = kv->k + (size_t)l * (size_t)kv->cap * (size_t)KD, *V = kv->v + (size_t)l * (size_t)kv->cap * (size_t)KD;
#pragma omp parallel for num_threads(kv->nt) schedule(static)
    for (int ih = 0; ih < M * NH; ih++) {
        int i = ih / NH, h = ih % NH, kh = h / rep, last = pos + i;
        const float *q = kv->q + (size_t)i * (size_t)QD + (size_t)h * (size_t)hd;
        float *s = kv->scores + (size_t)omp_get_thread_num() * (size_t)kv->cap, mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j <= last; j++) {
            const float *k = K + (size_t)j * (size_t)KD + (size_t)kh * (size_t)hd;
            float d = 0.0f;
            for (int e = 0; e < hd; e++) d += q[e] * k[e];
            s[j] = d * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j <= last; j++) { s[j] = expf(s[j] - mx); sum += s[j]; }
        float inv = 1.0f / sum, *o = kv->atty + (size_t)i * (size_t)QD + (size_t)h * (size_t)hd;
        for (int e = 0; e < hd; e++) o[e] = 0.0f;
        for (int j = 0; j <= last; j++) {
            const float *v = V + (size_t)j * (size_t)KD + (size_t)kh * (size_t)hd;
            float p = s[j] * inv;
            for (int e = 0; e < hd; e++) o[e] += p * v[e];
        }
    }
}

/* M tokens at positions pos..pos+M-1 through every block; kv->x ends as the last block's output. */
static int chunk_fwd(struct mw_net *n, struct llama_kv *kv, const int32_t *tok, int M, int pos)
{
    struct llama *m = LL(n);
    const struct mw_llama_config *c = &m->c;
    const float *p = n->params;
    int C = c->dim, hd = c->head_dim, QD = c->n_head * hd, KD = c->n_kv_head * hd, F = c->ffn, half = hd / 2;
    int nt = kv->nt, ref = m->ref, bias = c->qkv_bias, rc;
    if ((rc = hook(m, MW_NET_UNIT_ACQUIRE, 0))) return rc;
    lk_embed_fwd(kv->x, tok, p + m->off_embed, M, C, nt);
    if ((rc = hook(m, MW_NET_UNIT_RELEASE, 0))) return rc;
    const float *cs = m->cos + (size_t)pos * (size_t)half, *sn = m->sin + (size_t)pos * (size_t)half;
    for (int l = 0; l < c->n_layer; l++) {
        if ((rc = hook(m, MW_NET_UNIT_ACQUIRE, l + 1))) return rc;
        size_t at = ((size_t)l * (size_t)kv->cap + (size_t)pos) * (size_t)KD;
        float *k = kv->k + at, *v = kv->v + at;
        lk_rmsnorm_fwd(kv->xn, kv->rstd, kv->x, llama_w(m, p, l, LK_LN1_W), c->rms_eps, M, C, nt);
        lk_linear_fwd(kv->q, kv->xn, llama_w(m, p, l, LK_Q_W), bias ? llama_w(m, p, l, LK_Q_B) : NULL, NULL, M, C, QD, ref, nt);
        lk_linear_fwd(k, kv->xn, llama_w(m, p, l, LK_K_W), bias ? llama_w(m, p, l, LK_K_B) : NULL, NULL, M, C, KD, ref, nt);
        lk_linear_fwd(v, kv->xn, llama_w(m, p, l, LK_V_W), bias ? llama_w(m, p, l, LK_V_B) : NULL, NULL, M, C, KD, ref, nt);
        /* Rotary at the absolute positions: the tables from row pos, row r of the chunk = pos + r. */
        lk_rope_fwd(kv->q, cs, sn, M, M, c->n_head, hd, nt);
        lk_rope_fwd(k, cs, sn, M, M, c->n_kv_head, hd, nt);
        attend(m, kv, l, M, pos);
        lk_linear_fwd(kv->res2, kv->atty, llama_w(m, p, l, LK_O_W), NULL, kv->x, M, QD, C, ref, nt);
        lk_rmsnorm_fwd(kv->xn, kv->rstd, kv->res2, llama_w(m, p, l, LK_LN2_W), c->rms_eps, M, C, nt);
        lk_linear_fwd(kv->gate, kv->xn, llama_w(m, p, l, LK_GATE_W), NULL, NULL, M, C, F, ref, nt);
        lk_linear_fwd(kv->up, kv->xn, llama_w(m, p, l, LK_UP_W), NULL, NULL, M, C, F, ref, nt);
        lk_swiglu_fwd(kv->h, kv->gate, kv->up, (size_t)M * (size_t)F, nt);
        lk_linear_fwd(kv->x, kv->h, llama_w(m, p, l, LK_DOWN_W), NULL, kv->res2, M, F, C, ref, nt);
        if ((rc = hook(m, MW_NET_UNIT_RELEASE, l + 1))) return rc;
    }
    return 0;
}

int llama_decode(struct mw_net *n, void *kvp, const int32_t *tokens, int n_tokens, int pos, float *logits_last)
{
    struct llama *m = LL(n);
    struct llama_kv *kv = kvp;
    const struct mw_llama_config *c = &m->c;
    int C = c->dim, L = c->n_layer, rc;
    if (pos != kv->len)
        return mw_error_set(-EINVAL, "llama decode: position %d, the cache holds %d positions", pos, kv->len);
    if (n_tokens > kv->cap - pos)
        return mw_error_set(-EINVAL, "llama decode: %d tokens at position %d do not fit the cache of %d positions "
                            "(the model's context is %d)", n_tokens, pos, kv->cap, c->context);
    openblas_set_num_threads(1); /* products are split over our own threads: mw_k_sgemm */
    int M = 0;
    for (int done = 0; done < n_tokens; done += M) {
        M = MW_MIN(kv->rows, n_tokens - done);
        if ((rc = chunk_fwd(n, kv, tokens + done, M, pos + done))) return rc;
        kv->len = pos + done + M; /* the chunk's keys and values are in */
    }
    const float *xlast = kv->x + (size_t)(M - 1) * (size_t)C;
    const float *p = n->params;
    float rstd;
    if ((rc = hook(m, MW_NET_UNIT_ACQUIRE, L + 1))) return rc;
    lk_rmsnorm_fwd(kv->xl, &rstd, xlast, p + m->off_norm, c->rms_eps, 1, C, 1);
    if (c->tied && ((rc = hook(m, MW_NET_UNIT_RELEASE, L + 1)) || (rc = hook(m, MW_NET_UNIT_ACQUIRE, 0)))) return rc;
    const float *W = p + (c->tied ? m->off_embed : m->off_head);
    lk_linear_fwd(logits_last, kv->xl, W, NULL, NULL, 1, C, c->vocab, m->ref, kv->nt);
    return hook(m, MW_NET_UNIT_RELEASE, c->tied ? 0 : L + 1);
}
