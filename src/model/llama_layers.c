/*
 * llama_layers.c — the layers of the Llama family: embedding lookup, RMSNorm, rotary embeddings
 * (HF rotate-half), grouped-query causal attention, SwiGLU, and the linear layers (nn.Linear
 * layout: W [out, in], y = x W^T + b).
 *
 * Two paths where it matters (the products, the attention's softmax): `ref` = plain scalar
 * loops, the reference the tests hold the fast path against element by element; otherwise the
 * products go through gemm() below: on an AVX-512 CPU memwall's own sgemm (llama_avx512.c,
 * which says why), elsewhere OpenBLAS through mw_k_sgemm (gpt2_layers.c). Either way one OpenMP
 * pool, C split by rows or columns among the threads, each piece a single-threaded product whose
 * bits do not depend on the split. The element-wise layers are the same loops for both paths.
 * Reductions into parameter gradients go by column blocks in fixed row order (gpt2_layers.c says
 * why): no float atomics, the same bits for any thread count.
 *
 * Causal attention, fast path: the products skip the tiles above the diagonal (score tiles right
 * of a row strip's last row; the terms of P V, dS K, dS^T Q, P^T dY that are zero), about half
 * the work at T = 256; the softmax rows are AVX-512 loops (llama_avx512.c).
 *
 * Grouped heads: query head h reads key/value head h / (NH / KV), as HF's repeat_kv. In backward
 * one thread owns a (batch, kv head) pair and adds its query heads' dk/dv in head order.
 */
#include "llama_internal.h"
#include "gpt2_internal.h"
#include "memwall/common.h"
#include "memwall/optim.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#define CB 64 /* column block of the fixed-order column reductions */

static int have_avx512(void) { return mw_simd_active() == MW_SIMD_AVX512; }

/* C[M, N] = alpha op(A) op(B) + beta C, row-major, over nt threads: each takes a slice of the
 * rows (M >= N) or columns and runs a single-threaded product on it (as mw_k_sgemm). Fewer than
 * 16 rows (decoding a token: 1) go to OpenBLAS, whose matrix-vector paths read a weight once,
 * where packing it would cost more than the product. */
static void gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc, int nt)
{
    if (!have_avx512() || M < 16) {
        mw_k_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nt);
        return;
    }
    int split_rows = M >= N, dim = split_rows ? M : N;
    if (nt > 1 && dim < 64 * nt) nt = MW_MAX(1, dim / 64);
    if (nt <= 1) {
        lk_gemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, LK_TRI_NONE);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), n = omp_get_num_threads();
        int chunk = MW_ALIGN_UP((dim + n - 1) / n, 16);
        int s = MW_MIN(dim, tid * chunk), e = MW_MIN(dim, s + chunk);
        if (e > s) {
            if (split_rows)
                lk_gemm_avx512(ta, tb, e - s, N, K, alpha, ta ? A + s : A + (size_t)s * (size_t)lda, lda, B, ldb, beta,
                               C + (size_t)s * (size_t)ldc, ldc, LK_TRI_NONE);
            else
                lk_gemm_avx512(ta, tb, M, e - s, K, alpha, A, lda, tb ? B + (size_t)s * (size_t)ldb : B + s, ldb, beta,
                               C + s, ldc, LK_TRI_NONE);
        }
    }
}

void lk_embed_fwd(float *out, const int32_t *tok, const float *E, int N, int C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) memcpy(out + (size_t)r * (size_t)C, E + (size_t)tok[r] * (size_t)C, (size_t)C * sizeof(float));
}

void lk_embed_bwd(float *dE, const float *dout, const int32_t *tok, int N, int C, int nt)
{
    int nblk = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = MW_MIN(C, c0 + CB);
        for (int r = 0; r < N; r++) {
            const float *d = dout + (size_t)r * (size_t)C;
            float *e = dE + (size_t)tok[r] * (size_t)C;
            for (int c = c0; c < c1; c++) e[c] += d[c];
        }
    }
}

/* HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in fp32. */
void lk_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, float eps, int N, int C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * (size_t)C;
        float *o = out + (size_t)r * (size_t)C;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int c = 0; c < C; c++) s += xr[c] * xr[c];
        float rs = 1.0f / sqrtf(s / (float)C + eps);
        for (int c = 0; c < C; c++) o[c] = w[c] * (xr[c] * rs);
        rstd[r] = rs;
    }
}

void lk_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                    int N, int C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * (size_t)C, *d = dout + (size_t)r * (size_t)C;
        float *o = dx + (size_t)r * (size_t)C, rs = rstd[r];
        float s = 0.0f; /* sum of dxhat * xhat */
#pragma omp simd reduction(+:s)
        for (int c = 0; c < C; c++) s += d[c] * w[c] * xr[c] * rs;
        s /= (float)C;
        for (int c = 0; c < C; c++) o[c] += rs * (d[c] * w[c] - xr[c] * rs * s);
    }
    int nblk = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = MW_MIN(C, c0 + CB);
        for (int r = 0; r < N; r++) {
            const float *xr = x + (size_t)r * (size_t)C, *d = dout + (size_t)r * (size_t)C;
            float rs = rstd[r];
            for (int c = c0; c < c1; c++) dw[c] += d[c] * (xr[c] * rs);
        }
    }
}

void lk_linear_fwd(float *out, const float *in, const float *W, const float *b, const float *resid, int N, int NI,
                   int NO, int ref, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        float *o = out + (size_t)r * (size_t)NO;
        const float *x = resid ? resid + (size_t)r * (size_t)NO : NULL;
        for (int c = 0; c < NO; c++) o[c] = (x ? x[c] : 0.0f) + (b ? b[c] : 0.0f);
    }
    if (!ref) {
        gemm(0, 1, N, NO, NI, 1.0f, in, NI, W, NI, 1.0f, out, NO, nt);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++)
        for (int o = 0; o < NO; o++) {
            const float *x = in + (size_t)r * (size_t)NI, *w = W + (size_t)o * (size_t)NI;
            float s = 0.0f;
            for (int i = 0; i < NI; i++) s += x[i] * w[i];
            out[(size_t)r * (size_t)NO + o] += s;
        }
}

void lk_linear_bwd(float *din, int acc, float *dW, float *db, const float *dout, const float *in, const float *W,
                   int N, int NI, int NO, int ref, int nt)
{
    if (!ref) {
        if (din) gemm(0, 0, N, NI, NO, 1.0f, dout, NO, W, NI, acc ? 1.0f : 0.0f, din, NI, nt);
        if (dW) gemm(1, 0, NO, NI, N, 1.0f, dout, NO, in, NI, 1.0f, dW, NI, nt);
    } else {
        if (din) {
#pragma omp parallel for num_threads(nt) schedule(static)
            for (int r = 0; r < N; r++)
                for (int i = 0; i < NI; i++) {
                    float s = 0.0f;
                    for (int o = 0; o < NO; o++) s += dout[(size_t)r * (size_t)NO + o] * W[(size_t)o * (size_t)NI + i];
                    din[(size_t)r * (size_t)NI + i] = (acc ? din[(size_t)r * (size_t)NI + i] : 0.0f) + s;
                }
        }
        if (dW) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int o = 0; o < NO; o++)
            for (int i = 0; i < NI; i++) {
                float s = 0.0f;
                for (int r = 0; r < N; r++) s += dout[(size_t)r * (size_t)NO + o] * in[(size_t)r * (size_t)NI + i];
                dW[(size_t)o * (size_t)NI + i] += s;
            }
        }
    }
    if (!db) return;
    int nblk = (NO + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = MW_MIN(NO, c0 + CB);
        for (int r = 0; r < N; r++)
            for (int c = c0; c < c1; c++) db[c] += dout[(size_t)r * (size_t)NO + c];
    }
}

/* HF's default and llama3 inverse frequencies (modeling_rope_utils), then cos/sin of t * f as
 * HF computes them in fp32 (inv_freq fp32, the product fp32, cos of that). */
void lk_rope_tables(const struct mw_llama_config *c, float *cos_t, float *sin_t)
{
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float f = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / (double)c->head_dim));
        if (c->rope_type == MW_LLAMA_ROPE_LLAMA3) {
            double lo_wl = (double)c->rope_orig_ctx / c->rope_low, hi_wl = (double)c->rope_orig_ctx / c->rope_high;
            double wl = 2.0 * 3.14159265358979323846 / (double)f;
            double fl = wl > lo_wl ? (double)f / c->rope_factor : (double)f;
            if (!(wl < hi_wl) && !(wl > lo_wl)) {
                double sm = ((double)c->rope_orig_ctx / wl - c->rope_low) / (c->rope_high - c->rope_low);
                fl = (1.0 - sm) * fl / c->rope_factor + sm * fl;
            }
            f = (float)fl;
        }
        for (int t = 0; t < c->context; t++) {
            float a = (float)t * f;
            cos_t[(size_t)t * (size_t)half + (size_t)i] = (float)cos((double)a);
            sin_t[(size_t)t * (size_t)half + (size_t)i] = (float)sin((double)a);
        }
    }
}

/* out = x * cos + rotate_half(x) * sin; rotate_half(x) = (-x2, x1). */
void lk_rope_fwd(float *x, const float *cos_t, const float *sin_t, int N, int T, int H, int hd, int nt)
{
    int half = hd / 2;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *cs = cos_t + (size_t)(r % T) * (size_t)half, *sn = sin_t + (size_t)(r % T) * (size_t)half;
        for (int h = 0; h < H; h++) {
            float *v = x + (size_t)r * (size_t)H * (size_t)hd + (size_t)h * (size_t)hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}

/* The transpose of the rotation. */
void lk_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int N, int T, int H, int hd, int nt)
{
    int half = hd / 2;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *cs = cos_t + (size_t)(r % T) * (size_t)half, *sn = sin_t + (size_t)(r % T) * (size_t)half;
        for (int h = 0; h < H; h++) {
            float *v = dx + (size_t)r * (size_t)H * (size_t)hd + (size_t)h * (size_t)hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] + b * sn[i];
                v[i + half] = b * cs[i] - a * sn[i];
            }
        }
    }
}

/* C[M, N] = op(A) op(B) (+ C with acc), row-major, one thread: sgemm (on AVX-512 memwall's, which
 * skips what `tri` allows) or the scalar loops (every term). */
static void mm(int ref, enum lk_tri tri, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, int acc, float *C, int ldc)
{
    if (!ref && have_avx512()) {
        lk_gemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, acc ? 1.0f : 0.0f, C, ldc, tri);
        return;
    }
    if (!ref) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                    lda, B, ldb, acc ? 1.0f : 0.0f, C, ldc);
        return;
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += (ta ? A[(size_t)k * (size_t)lda + i] : A[(size_t)i * (size_t)lda + k]) *
                     (tb ? B[(size_t)j * (size_t)ldb + k] : B[(size_t)k * (size_t)ldb + j]);
            C[(size_t)i * (size_t)ldc + j] = (acc ? C[(size_t)i * (size_t)ldc + j] : 0.0f) + alpha * s;
        }
}

void lk_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int NH,
                      int KV, int hd, int ref, int nt)
{
    int rep = NH / KV, QD = NH * hd, KD = KV * hd, fast = !ref && have_avx512();
    float scale = 1.0f / sqrtf((float)hd);
    size_t TT = (size_t)T * (size_t)T;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, kh = h / rep;
        const float *qb = q + (size_t)b * (size_t)T * (size_t)QD + (size_t)h * (size_t)hd;
        const float *kb = k + (size_t)b * (size_t)T * (size_t)KD + (size_t)kh * (size_t)hd;
        const float *vb = v + (size_t)b * (size_t)T * (size_t)KD + (size_t)kh * (size_t)hd;
        float *S = att + (size_t)bh * TT;
        mm(ref, LK_TRI_OUT_LOWER, 0, 1, T, T, hd, scale, qb, QD, kb, KD, 0, S, T);
        for (int i = 0; i < T; i++) {
            float *row = S + (size_t)i * (size_t)T, mx = -INFINITY, s = 0.0f;
            if (fast) {
                lk_softmax_row_avx512(row, i + 1, T);
                continue;
            }
            for (int j = 0; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
            for (int j = 0; j <= i; j++) { float e = expf(row[j] - mx); row[j] = e; s += e; }
            float inv = 1.0f / s;
            for (int j = 0; j <= i; j++) row[j] *= inv;
            for (int j = i + 1; j < T; j++) row[j] = 0.0f;
        }
        mm(ref, LK_TRI_IN_LOWER, 0, 0, T, hd, T, 1.0f, S, T, vb, KD, 0,
           out + (size_t)b * (size_t)T * (size_t)QD + (size_t)h * (size_t)hd, QD);
    }
}

void lk_attention_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *q,
                      const float *k, const float *v, const float *att, int B, int T, int NH, int KV, int hd, int ref,
                      int nt)
{
    int rep = NH / KV, QD = NH * hd, KD = KV * hd, fast = !ref && have_avx512();
    float scale = 1.0f / sqrtf((float)hd);
    size_t TT = (size_t)T * (size_t)T;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bk = 0; bk < B * KV; bk++) {
        int b = bk / KV, kh = bk % KV;
        size_t ko = (size_t)b * (size_t)T * (size_t)KD + (size_t)kh * (size_t)hd;
        float *dS = scratch + (size_t)omp_get_thread_num() * TT;
        for (int r = 0; r < rep; r++) {
            int h = kh * rep + r;
            size_t qo = (size_t)b * (size_t)T * (size_t)QD + (size_t)h * (size_t)hd;
            const float *P = att + ((size_t)b * (size_t)NH + (size_t)h) * TT, *dy = dout + qo;
            mm(ref, LK_TRI_OUT_LOWER, 0, 1, T, T, hd, 1.0f, dy, QD, v + ko, KD, 0, dS, T);
            for (int i = 0; i < T; i++) {
                const float *p = P + (size_t)i * (size_t)T;
                float *d = dS + (size_t)i * (size_t)T, s = 0.0f;
                if (fast) {
                    lk_softmax_bwd_row_avx512(d, p, i + 1, T, scale);
                    continue;
                }
                for (int j = 0; j <= i; j++) s += p[j] * d[j];
                for (int j = 0; j <= i; j++) d[j] = p[j] * (d[j] - s) * scale;
                for (int j = i + 1; j < T; j++) d[j] = 0.0f;
            }
            mm(ref, LK_TRI_IN_LOWER, 0, 0, T, hd, T, 1.0f, dS, T, k + ko, KD, 0, dq + qo, QD);
            mm(ref, LK_TRI_IN_UPPER, 1, 0, T, hd, T, 1.0f, dS, T, q + qo, QD, r > 0, dk + ko, KD);
            mm(ref, LK_TRI_IN_UPPER, 1, 0, T, hd, T, 1.0f, P, T, dy, QD, r > 0, dv + ko, KD);
        }
    }
}

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

void lk_swiglu_fwd(float *h, const float *gate, const float *up, size_t n, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) h[i] = gate[i] * sigmoidf_(gate[i]) * up[i];
}

void lk_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up, size_t n, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], s = sigmoidf_(g), d = dh[i];
        dup[i] = d * g * s;
        dgate[i] = d * up[i] * (s + g * s * (1.0f - s));
    }
}
