/*
 * gpt2_internal.h — private layout of the GPT-2 model shared by gpt2*.c: where each activation
 * lives inside the single activation allocation, and the layer kernels (layernorm, GELU,
 * matmul, attention, cross-entropy) that forward and backward are built from.
 *
 * Every buffer is sized for (max_batch, max_seq) but a forward with smaller (B, T) packs its
 * data densely at the start of each buffer ([B*T, C] row-major), so kernels take (B, T).
 * Determinism: kernels partition work by rows or by column blocks in a fixed way; a value is
 * only ever written by one thread and summed in one fixed order.
 */
#ifndef MEMWALL_GPT2_INTERNAL_H
#define MEMWALL_GPT2_INTERNAL_H

#include "memwall/gpt2.h"

/* Kinds inside one block, in registration order (MW_GPT2_LN1_W .. MW_GPT2_FCPROJ_B). */
#define MW_GPT2_BLOCK_KINDS 12

struct mw_gpt2_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [BT, C], [BT], [BT] */
    float *qkv;                       /* [BT, 3C] q | k | v, head h at columns h*hs */
    float *atty;                      /* [BT, C] attention output before c_proj */
    float *att;                       /* [B, NH, T, T] softmax probabilities (j > i are 0) */
    float *res2;                      /* [BT, C] x + attention branch */
    float *ln2, *ln2_mean, *ln2_rstd; /* [BT, C], [BT], [BT] */
    float *fch;                       /* [BT, 4C] before GELU */
    float *fch_gelu;                  /* [BT, 4C] after GELU */
};

struct mw_gpt2_impl {
    struct mw_gpt2_layer_acts *layer; /* [L]; with recompute all entries alias one set */
    float **res;                      /* [L + 1]: res[0] embeddings, res[l + 1] output of block l */
    float *lnf, *lnf_mean, *lnf_rstd; /* [BT, C], [BT], [BT] */
    float *logits;                    /* [BT, Vp]; backward turns it into dlogits in place */
    float *losses;                    /* [BT] per-position cross-entropy */
    float *lse;                       /* [BT] log-sum-exp of each logits row (for backward) */
    float *dres;                      /* [BT, C] gradient flowing along the residual stream */
    float *dC;                        /* [BT, C] scratch gradient */
    float *dbig;                      /* [BT, 4C] scratch gradient (dqkv uses the first 3C cols) */
    float *datt;                      /* [n_threads, T, T] per-thread attention scratch */
    size_t *off;                      /* [L * 12] element offsets of block tensors */
    size_t off_wte, off_wpe, off_lnfw, off_lnfb;
    int32_t *inputs, *targets;        /* [BT] copies of the last forward's tokens */
    int have_targets;                 /* last forward had targets and backward may run */
    int last_layer_live;              /* recompute: scratch still holds block L-1 of this forward */
    int acc_i, acc_n;                 /* mw_gpt2_accum_set: this backward is micro-batch acc_i of acc_n */
    int acc_B, acc_T;                 /* the shape of micro-batch 0 (all must have it) */
    float *defer;                     /* [acc_n - 1][BT * C + BT] earlier micro-batches' dres, tokens */
    size_t defer_bytes;               /* its size (0 = none yet) */
};

/* One block's activations: floats (aligned pieces, gpt2.c), and layer l's pointed at base. */
size_t mw_gpt2_block_acts_floats(const struct mw_gpt2 *m);
void mw_gpt2_block_acts_bind(struct mw_gpt2 *m, int l, float *base);

static inline float *mw_gpt2_p(const struct mw_gpt2 *m, const float *base, int layer, int kind)
{
    return (float *)base + m->impl->off[(size_t)layer * MW_GPT2_BLOCK_KINDS + (kind - MW_GPT2_LN1_W)];
}

/* Whole pages mapped fresh, zero and untouched, for any family's flat arrays (gpt2.c says why:
 * streaming and ZeRO-3 release pages of them with madvise). NULL: no memory. */
void *mw_net_floats_alloc(size_t n);
void mw_net_floats_free(void *p, size_t n);
/* Runs each product shape of a training step once (lin[i] = {in, out} of each linear layer; the
 * LM head's over vocabulary V) into out[out_n] (returned to the system after), so the matrix
 * library's per-thread buffers are resident before a caller measures its baseline (gpt2.c). */
void mw_net_warm_products(const int (*lin)[2], int nlin, int N, int C, int V, int nt, float *out, size_t out_n);

/* C[M, N] = alpha * op(A) @ op(B) + beta * C, row-major, split over nt OpenMP threads by
 * rows or columns of C, each piece a single-threaded OpenBLAS sgemm (gpt2_layers.c). */
void mw_k_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc, int nt);

/* Layer kernels (gpt2_layers.c, gpt2_attention.c). N rows of width C; nt = OpenMP threads. */
void mw_k_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe,
                      int B, int T, int C, int nt);
void mw_k_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                      int B, int T, int C, int nt);
void mw_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                        const float *w, const float *b, int N, int C, int nt);
/* dinp += d(LN)/dinp * dout; dw += ..., db += ... (column sums in fixed row order). */
void mw_k_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C, int nt);
/* out[N, OC] = resid[N, OC] + b[OC] + inp[N, IC] @ w[IC, OC] (resid and b may be NULL):
 * the residual add and the bias are fused into sgemm's beta = 1 accumulation. */
void mw_k_matmul_fwd(float *out, const float *inp, const float *w, const float *b, const float *resid,
                     int N, int IC, int OC, int nt);
/* dinp[N, IC] = dout @ w^T (overwritten; skipped if dinp NULL); dw += inp^T @ dout; db += colsum(dout). */
void mw_k_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, int N, int IC, int OC, int nt);
void mw_k_gelu_fwd(float *out, const float *inp, size_t n, int nt);
/* dinout = dinout * gelu'(inp), in place. */
void mw_k_gelu_bwd(float *dinout, const float *inp, size_t n, int nt);
/* losses[i], lse[i] of rows of logits [N, Vp] over the first V columns. Returns nothing. */
void mw_k_crossentropy_fwd(float *losses, float *lse, const float *logits, const int32_t *targets,
                           int N, int V, int Vp, int nt);
/* In place: logits -> scale * (softmax - onehot(target)); padding columns -> 0. */
void mw_k_crossentropy_bwd(float *logits, const float *lse, const int32_t *targets, float scale,
                           int N, int V, int Vp, int nt);
void mw_k_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int nt);
/* dqkv overwritten [BT, 3C]; scratch [nt, T, T]. */
void mw_k_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH, int nt);

/* Vectorisable exp (rel. error ~2e-7, flushes below -87 to 0) used by softmax, GELU, loss. */
static inline float mw_expf(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float t = x * 1.44269504088896341f + 12582912.0f; /* round to nearest via 1.5 * 2^23 */
    float n = t - 12582912.0f;
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; int32_t i; } s;
    s.i = ((int32_t)n + 127) << 23;
    return p * s.f;
}

/* Parses the text of a Hugging Face GPT-2 config.json (gpt2_safetensors.c; also the fuzzing
 * entry point): the five sizes (0 when absent) or MW_EFORMAT naming a setting memwall does not
 * implement. */
int mw_gpt2_hf_config_parse(const char *text, size_t len, const char *path, int *n_layer, int *n_head,
                            int *n_embd, int *n_positions, int *vocab_size);

#endif
