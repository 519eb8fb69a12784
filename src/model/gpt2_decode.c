/*
 * gpt2_decode.c — incremental decoding for GPT-2: a multi-head key/value cache and the forward
 * pass of a few new tokens against it (model.h's kv_init / decode / kv_free, through
 * gpt2_net.c; the sampling loop is generate.c).
 *
 * The cache keeps, per block, the keys and values of every position so far ([L][cap][C]: all
 * n_head heads, GPT-2 has no grouped heads). A call runs its tokens in chunks of at most
 * DEC_CHUNK rows (scratch for DEC_CHUNK rows, the MLP's [rows, 4C] the large piece). Each chunk
 * is mw_gpt2_block_fwd's block on those rows: learned positions at pos.., the same LayerNorm,
 * matmul and GELU kernels, and causal attention over cache positions 0..pos+i with the
 * forward's exp (mw_expf); only the last token's row goes through ln_f and the tied head. The
 * attention is a direct loop per query row, which is where the numbers differ from the full
 * forward, by rounding (tests/test_generate.c holds them to 1e-5).
 *
 * Weight units are acquired and released as the forward does (0, 1..L, L+1, 0 for the head).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math") /* mw_expf's clamps: see gpt2_attention.c */
#endif
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define DEC_CHUNK 64

struct gpt2_kv {
    int cap, len, rows, nt;             /* positions held at most / now; scratch rows; threads */
    float *k, *v;                       /* [L][cap][C] */
    float *x, *res2, *ln, *mean, *rstd; /* [rows, C] x3, [rows] x2 */
    float *qkv;                         /* [rows, 3C] */
    float *atty;                        /* [rows, C] */
    float *fch, *fchg;                  /* [rows, 4C] */
    float *scores;                      /* [nt][cap] */
    float *xl;                          /* [C] the last row after ln_f */
};

void mw_gpt2_kv_free(void *kvp)
{
    struct gpt2_kv *kv = kvp;
    if (!kv) return;
    free(kv->k); free(kv->v); free(kv->x); free(kv->res2); free(kv->ln); free(kv->mean); free(kv->rstd);
    free(kv->qkv); free(kv->atty); free(kv->fch); free(kv->fchg); free(kv->scores); free(kv->xl);
    free(kv);
}

static float *fl(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

int mw_gpt2_kv_init(const struct mw_gpt2 *m, int max_tokens, void **out)
{
    *out = NULL;
    if (max_tokens < 1 || max_tokens > m->cfg.max_seq_len)
        return mw_error_set(-EINVAL, "gpt2: a KV cache for %d positions, the context is %d", max_tokens, m->cfg.max_seq_len);
    struct gpt2_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return mw_error_set(-ENOMEM, "gpt2: no memory for a KV cache");
    size_t L = (size_t)m->cfg.n_layer, C = (size_t)m->cfg.n_embd, cap = (size_t)max_tokens;
    kv->cap = max_tokens;
    kv->rows = MW_MIN(max_tokens, DEC_CHUNK);
    kv->nt = m->opts.n_threads > 0 ? m->opts.n_threads : 1;
    size_t R = (size_t)kv->rows;
    kv->k = fl(L * cap * C); kv->v = fl(L * cap * C);
    kv->x = fl(R * C); kv->res2 = fl(R * C); kv->ln = fl(R * C); kv->mean = fl(R); kv->rstd = fl(R);
    kv->qkv = fl(R * 3 * C); kv->atty = fl(R * C); kv->fch = fl(R * 4 * C); kv->fchg = fl(R * 4 * C);
    kv->scores = fl((size_t)kv->nt * cap); kv->xl = fl(C);
    if (!kv->k || !kv->v || !kv->x || !kv->res2 || !kv->ln || !kv->mean || !kv->rstd || !kv->qkv || !kv->atty ||
        !kv->fch || !kv->fchg || !kv->scores || !kv->xl) {
        mw_gpt2_kv_free(kv);
        return mw_error_set(-ENOMEM, "gpt2: no memory for a KV cache of %d positions (%zu MiB of keys and values)",
                            max_tokens, (2 * L * cap * C * sizeof(float)) >> 20);
    }
    *out = kv;
    return 0;
}

static int hook(struct mw_gpt2 *m, int event, int unit)
{
    return m->weights_hook ? m->weights_hook(m->weights_user, event, unit, 0) : 0;
}

/* atty[M, C] = causal attention of the M queries (in qkv) at positions pos.. over block l's
 * cache rows 0..pos+i. */
static void attend(const struct mw_gpt2 *m, struct gpt2_kv *kv, int l, int M, int pos)
{
    int C = m->cfg.n_embd, NH = m->cfg.n_head, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    const float *K = kv->k + (size_t)l * (size_t)kv->cap * (size_t)C, *V = kv->v + (size_t)l * (size_t)kv->cap * (size_t)C;
#pragma omp parallel for num_threads(kv->nt) schedule(static)
    for (int ih = 0; ih < M * NH; ih++) {
        int i = ih / NH, h = ih % NH, last = pos + i;
        const float *q = kv->qkv + (size_t)i * 3 * (size_t)C + (size_t)h * (size_t)hs;
        float *s = kv->scores + (size_t)omp_get_thread_num() * (size_t)kv->cap, mx = -INFINITY, sum = 0.0f;
        for (int j = 0; j <= last; j++) {
            const float *k = K + (size_t)j * (size_t)C + (size_t)h * (size_t)hs;
            float d = 0.0f;
            for (int e = 0; e < hs; e++) d += q[e] * k[e];
            s[j] = d * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j <= last; j++) { s[j] = mw_expf(s[j] - mx); sum += s[j]; }
        float inv = 1.0f / sum, *o = kv->atty + (size_t)i * (size_t)C + (size_t)h * (size_t)hs;
        for (int e = 0; e < hs; e++) o[e] = 0.0f;
        for (int j = 0; j <= last; j++) {
            const float *v = V + (size_t)j * (size_t)C + (size_t)h * (size_t)hs;
            float p = s[j] * inv;
            for (int e = 0; e < hs; e++) o[e] += p * v[e];
        }
    }
}

/* M tokens at positions pos..pos+M-1 through every block; kv->x ends as the last block's output. */
static int chunk_fwd(struct mw_gpt2 *m, struct gpt2_kv *kv, const int32_t *tok, int M, int pos)
{
    const struct mw_gpt2_impl *im = m->impl;
    const float *p = m->params;
    int C = m->cfg.n_embd, nt = kv->nt, rc;
    if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, 0))) return rc;
    for (int r = 0; r < M; r++) {
        const float *e = p + im->off_wte + (size_t)tok[r] * (size_t)C;
        const float *w = p + im->off_wpe + (size_t)(pos + r) * (size_t)C;
        float *o = kv->x + (size_t)r * (size_t)C;
        for (int c = 0; c < C; c++) o[c] = e[c] + w[c];
    }
    if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, 0))) return rc;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, l + 1))) return rc;
        mw_k_layernorm_fwd(kv->ln, kv->mean, kv->rstd, kv->x, mw_gpt2_p(m, p, l, MW_GPT2_LN1_W),
                           mw_gpt2_p(m, p, l, MW_GPT2_LN1_B), M, C, nt);
        mw_k_matmul_fwd(kv->qkv, kv->ln, mw_gpt2_p(m, p, l, MW_GPT2_QKV_W), mw_gpt2_p(m, p, l, MW_GPT2_QKV_B), NULL, M,
                        C, 3 * C, nt);
        for (int r = 0; r < M; r++) {
            size_t at = ((size_t)l * (size_t)kv->cap + (size_t)(pos + r)) * (size_t)C;
            const float *row = kv->qkv + (size_t)r * 3 * (size_t)C;
            memcpy(kv->k + at, row + C, (size_t)C * sizeof(float));
            memcpy(kv->v + at, row + 2 * (size_t)C, (size_t)C * sizeof(float));
        }
        attend(m, kv, l, M, pos);
        mw_k_matmul_fwd(kv->res2, kv->atty, mw_gpt2_p(m, p, l, MW_GPT2_ATTPROJ_W), mw_gpt2_p(m, p, l, MW_GPT2_ATTPROJ_B),
                        kv->x, M, C, C, nt);
        mw_k_layernorm_fwd(kv->ln, kv->mean, kv->rstd, kv->res2, mw_gpt2_p(m, p, l, MW_GPT2_LN2_W),
                           mw_gpt2_p(m, p, l, MW_GPT2_LN2_B), M, C, nt);
        mw_k_matmul_fwd(kv->fch, kv->ln, mw_gpt2_p(m, p, l, MW_GPT2_FC_W), mw_gpt2_p(m, p, l, MW_GPT2_FC_B), NULL, M, C,
                        4 * C, nt);
        mw_k_gelu_fwd(kv->fchg, kv->fch, (size_t)M * 4 * (size_t)C, nt);
        mw_k_matmul_fwd(kv->x, kv->fchg, mw_gpt2_p(m, p, l, MW_GPT2_FCPROJ_W), mw_gpt2_p(m, p, l, MW_GPT2_FCPROJ_B),
                        kv->res2, M, 4 * C, C, nt);
        if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, l + 1))) return rc;
    }
    return 0;
}

int mw_gpt2_decode(struct mw_gpt2 *m, void *kvp, const int32_t *tokens, int n_tokens, int pos, float *logits_last)
{
    struct gpt2_kv *kv = kvp;
    const struct mw_gpt2_impl *im = m->impl;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->cfg.n_layer, rc;
    if (pos != kv->len)
        return mw_error_set(-EINVAL, "gpt2 decode: position %d, the cache holds %d positions", pos, kv->len);
    if (n_tokens > kv->cap - pos)
        return mw_error_set(-EINVAL, "gpt2 decode: %d tokens at position %d do not fit the cache of %d positions "
                            "(the model's context is %d)", n_tokens, pos, kv->cap, m->cfg.max_seq_len);
    openblas_set_num_threads(1); /* products are split over our own threads: mw_k_sgemm */
    int M = 0;
    for (int done = 0; done < n_tokens; done += M) {
        M = MW_MIN(kv->rows, n_tokens - done);
        if ((rc = chunk_fwd(m, kv, tokens + done, M, pos + done))) return rc;
        kv->len = pos + done + M;
    }
    const float *p = m->params;
    float mean, rstd;
    if ((rc = hook(m, MW_GPT2_UNIT_ACQUIRE, L + 1))) return rc;
    mw_k_layernorm_fwd(kv->xl, &mean, &rstd, kv->x + (size_t)(M - 1) * (size_t)C, p + im->off_lnfw, p + im->off_lnfb, 1,
                       C, 1);
    if ((rc = hook(m, MW_GPT2_UNIT_RELEASE, L + 1)) || (rc = hook(m, MW_GPT2_UNIT_ACQUIRE, 0))) return rc;
    mw_k_sgemm(0, 1, 1, V, C, 1.0f, kv->xl, C, p + im->off_wte, C, 0.0f, logits_last, V, kv->nt);
    return hook(m, MW_GPT2_UNIT_RELEASE, 0);
}
