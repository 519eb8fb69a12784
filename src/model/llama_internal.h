/*
 * llama_internal.h — private layout of the Llama family shared by llama*.c: the instance, where
 * each activation lives, and the layer kernels (RMSNorm, rotary, grouped-query attention, SwiGLU,
 * linear layers) that forward and backward are built from.
 *
 * Every kernel takes `ref`: 1 runs the plain scalar loops (the reference), 0 the fast path
 * (OpenBLAS sgemm split over OpenMP threads by mw_k_sgemm, gpt2_layers.c). Parameter gradients
 * of vectors (norm weights, biases, embedding rows) are summed by column blocks in fixed row
 * order, so both paths are bitwise reproducible for any thread count.
 */
#ifndef MEMWALL_LLAMA_INTERNAL_H
#define MEMWALL_LLAMA_INTERNAL_H

#include "memwall/llama.h"
#include "memwall/model.h"

#include <stddef.h>
#include <stdint.h>

/* Tensors of a block, in flat order (the biases only with qkv_bias). */
enum llama_kind {
    LK_Q_W, LK_Q_B, LK_K_W, LK_K_B, LK_V_W, LK_V_B, LK_O_W, LK_GATE_W, LK_UP_W, LK_DOWN_W, LK_LN1_W, LK_LN2_W,
    LK_N
};

struct llama_acts {                   /* one block's activations, [N = B*T rows] */
    float *xn1, *rstd1;               /* [N, C], [N] input RMSNorm */
    float *q, *k, *v;                 /* [N, QD], [N, KD], [N, KD] (q, k after rotary) */
    float *att;                       /* [B, NH, T, T] softmax probabilities */
    float *atty;                      /* [N, QD] attention output before o_proj */
    float *res2;                      /* [N, C] x + attention branch */
    float *xn2, *rstd2;               /* [N, C], [N] */
    float *gate, *up, *h;             /* [N, F] each; h = silu(gate) * up */
};

struct llama {
    struct mw_llama_config c;
    int B, T, nt, ref;
    int max_batch, max_seq;
    size_t off[LK_N];                 /* block 0's tensor offsets (block l: + l * block_numel) */
    size_t block_numel, off_embed, off_norm, off_head, n_params;
    int n_tensors;
    struct mw_net_tensor *tensors;
    char *names;                      /* the tensors' names */
    float *cos, *sin;                 /* [context, hd/2] rotary tables */
    float *acts_mem;                  /* the one activation allocation (acts_floats) */
    size_t acts_floats;
    struct llama_acts *layer;         /* [L] (recompute: all alias one set) */
    float **res;                      /* [L + 1] block inputs; res[L] the last block's output */
    float *xnf, *rstdf;               /* [N, C], [N] final norm */
    float *logits, *losses, *lse;     /* [N, V], [N], [N] (backward: dlogits in place) */
    float *dres, *dC;                 /* [N, C] */
    float *dq, *dk, *dv, *datty;      /* [N, QD], [N, KD], [N, KD], [N, QD] */
    float *dgate, *dup;               /* [N, F] */
    float *scratch;                   /* [nt, T, T] attention backward */
    int32_t *inputs, *targets;        /* [N] */
    int have_targets, last_live;      /* recompute: block L-1's activations still live */
    int acc_i, acc_n, acc_B, acc_T;
    float *defer;                     /* [acc_n - 1][N*C + N] earlier micro-batches' dres, tokens */
    size_t defer_bytes;
    mw_net_weights_fn hook;
    void *hook_user;
};

#define LL(n) ((struct llama *)(n)->impl)
#define CLL(n) ((const struct llama *)(n)->impl)

static inline const float *llama_w(const struct llama *m, const float *base, int l, int kind)
{
    return base + m->off[kind] + (size_t)l * m->block_numel;
}

/* llama.c */
size_t llama_acts_floats(const struct mw_llama_config *c, int B, int T, int recompute, int nt);
void llama_block_fwd(struct llama *m, const float *p, int l, const float *x, float *out, int B, int T);
void llama_block_bwd(struct llama *m, const float *p, float *g, int l, const float *x, int B, int T);
void llama_tensor_layout(const struct mw_llama_config *c, size_t *off, size_t *block_numel, size_t *off_norm,
                         size_t *off_head, size_t *n_params);

int llama_unit_range(const struct mw_net *n, int unit, size_t *first, size_t *count);
/* One block's activations carved from *p (advanced; *p NULL: counted only); returns floats. */
size_t llama_carve_block(const struct mw_llama_config *c, int B, int T, float **p, struct llama_acts *a);
int llama_hook(struct llama *m, int event, int unit, int backward);
int llama_check_tokens(const int32_t *tok, size_t n, int V, const char *what);
const float *llama_head_w(const struct llama *m, const float *p);
/* The head of one micro-batch (llama.c): final norm unless norm_done, logits, mean loss. */
float llama_head_fwd(struct llama *m, const float *p, const float *res_last, int norm_done, const int32_t *targets, int N);
void llama_head_bwd_norm(struct llama *m, const float *p, float *g, const float *res_last, int N);
size_t llama_head_grad_numel(const struct llama *m);

/* llama_layer_major.c: the layer-major step and the caller's activation slots (model.h) */
int llama_step_layer_major(struct mw_net *n, int nmb, const int32_t *inputs, const int32_t *targets, int B, int T,
                           float grad_scale, const struct mw_net_lm_calls *calls, float *losses);
size_t llama_lm_bytes(const struct mw_net *n, int nmb, int acts);
size_t llama_act_slot_bytes(const struct mw_net *n);
void llama_acts_lend(struct mw_net *n, float *slot);
size_t llama_own_block_bytes(const struct mw_net *n);

/* llama_layers.c. N rows; nt threads. */
void lk_embed_fwd(float *out, const int32_t *tok, const float *E, int N, int C, int nt);
void lk_embed_bwd(float *dE, const float *dout, const int32_t *tok, int N, int C, int nt);
void lk_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, float eps, int N, int C, int nt);
/* dx += ...; dw += ... */
void lk_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                    int N, int C, int nt);
/* out[N, NO] = (resid) + (b) + in[N, NI] @ W[NO, NI]^T */
void lk_linear_fwd(float *out, const float *in, const float *W, const float *b, const float *resid, int N, int NI,
                   int NO, int ref, int nt);
/* din[N, NI] (= or += with acc) dout @ W; dW += dout^T @ in; db += colsum(dout) (each skipped if NULL). */
void lk_linear_bwd(float *din, int acc, float *dW, float *db, const float *dout, const float *in, const float *W,
                   int N, int NI, int NO, int ref, int nt);
/* In place on x [N, H*hd], position of row r = r % T. */
void lk_rope_fwd(float *x, const float *cos, const float *sin, int N, int T, int H, int hd, int nt);
void lk_rope_bwd(float *dx, const float *cos, const float *sin, int N, int T, int H, int hd, int nt);
void lk_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int NH,
                      int KV, int hd, int ref, int nt);
/* dq, dk, dv overwritten; scratch [nt, T, T]. */
void lk_attention_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *q,
                      const float *k, const float *v, const float *att, int B, int T, int NH, int KV, int hd, int ref,
                      int nt);
void lk_swiglu_fwd(float *h, const float *gate, const float *up, size_t n, int nt);
/* dh -> dgate (in place of nothing: written to dgate), dup. */
void lk_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n, int nt);
void lk_rope_tables(const struct mw_llama_config *c, float *cos, float *sin);

/* llama_avx512.c: AVX-512 kernels (call them only when mw_simd_active() is MW_SIMD_AVX512).
 * lk_gemm_avx512: C[M, N] = alpha op(A) op(B) + beta C, row-major, one thread. tri: what a
 * causal product may skip: OUT_LOWER computes C only where column <= row (elements above are
 * left as they are or written); IN_LOWER / IN_UPPER say op(A) is zero above / below its
 * diagonal (the terms are skipped). Bits do not depend on how the caller splits C among threads. */
enum lk_tri { LK_TRI_NONE, LK_TRI_OUT_LOWER, LK_TRI_IN_LOWER, LK_TRI_IN_UPPER };
void lk_gemm_avx512(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    int ldb, float beta, float *C, int ldc, enum lk_tri tri);
/* Causal softmax rows: row[0..n) <- softmax(row[0..n)), row[n..T) <- 0; and its backward,
 * d[j] <- p[j] (d[j] - sum_k<n p[k] d[k]) scale for j < n, d[n..T) <- 0. */
void lk_softmax_row_avx512(float *row, int n, int T);
void lk_softmax_bwd_row_avx512(float *d, const float *p, int n, int T, float scale);

/* llama_net.c / llama_safetensors.c */
int llama_load_safetensors(struct mw_net *n, const char *path);
int llama_loader_open(void **loader, const struct mw_net *n, const char *path);
int llama_loader_unit(void *loader, struct mw_net *n, int unit);
void llama_loader_close(void *loader);
int llama_save_safetensors_units(const struct mw_net *n, const char *path, mw_net_weights_fn fn, void *user);

/* llama_decode.c: the KV cache (model.h's kv_init / decode / kv_free) */
int llama_kv_init(const struct mw_net *n, int max_tokens, void **kv);
int llama_decode(struct mw_net *n, void *kv, const int32_t *tokens, int n_tokens, int pos, float *logits_last);
void llama_kv_free(void *kv);

#endif
