/*
 * gpt2_layers.c — the element-wise and row-wise layers of GPT-2: embeddings, LayerNorm, GELU,
 * residual add, linear layers (OpenBLAS sgemm) and the fused softmax + cross-entropy.
 *
 * Why the column-block reductions: parameter gradients of biases, LayerNorm and embeddings are
 * sums over all B*T rows. Splitting rows among threads and adding partial sums would make the
 * result depend on the thread count and need a second pass; instead each thread owns a block
 * of columns and walks all rows in order, so every gradient element is summed in one fixed
 * order (bitwise reproducible for any thread count) and no two threads write the same float.
 * Sums inside a row use `omp simd` reductions: a fixed (compile-time) vector order.
 *
 * Why mw_k_sgemm splits the product itself and keeps OpenBLAS at one thread: with the pthread
 * OpenBLAS, its worker threads spin (sched_yield) after each call while our OpenMP threads run
 * the element-wise layers, and the OpenMP threads spin while OpenBLAS runs: on 2 cores the two
 * pools steal time from each other. One pool (OpenMP) running one single-threaded sgemm per
 * thread on a slice of C avoids that, and each element of C is still computed by exactly one
 * kernel call in one fixed K order.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* The clamps in mw_expf are float compares; under gcc's default -ftrapping-math they may not be
 * if-converted, which leaves the GELU / softmax / loss loops scalar. memwall never relies on FP
 * exceptions, so allow it here (clang vectorises these loops without being told). */
#pragma GCC optimize("no-trapping-math")
#endif
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#define CB 64 /* column block of the fixed-order column reductions */

void mw_k_encoder_fwd(float *out, const int32_t *inp, const float *wte, const float *wpe,
                      int B, int T, int C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < B * T; r++) {
        const float *e = wte + (size_t)inp[r] * (size_t)C, *p = wpe + (size_t)(r % T) * (size_t)C;
        float *o = out + (size_t)r * (size_t)C;
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

void mw_k_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                      int B, int T, int C, int nt)
{
    int nblk = (C + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = MW_MIN(C, c0 + CB);
        for (int r = 0; r < B * T; r++) {
            const float *d = dout + (size_t)r * (size_t)C;
            float *we = dwte + (size_t)inp[r] * (size_t)C, *wp = dwpe + (size_t)(r % T) * (size_t)C;
            for (int c = c0; c < c1; c++) { we[c] += d[c]; wp[c] += d[c]; }
        }
    }
}

void mw_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
                        const float *w, const float *b, int N, int C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *x = inp + (size_t)r * (size_t)C;
        float *o = out + (size_t)r * (size_t)C;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int c = 0; c < C; c++) s += x[c];
        float m = s / (float)C;
        float v = 0.0f;
#pragma omp simd reduction(+:v)
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        float rs = 1.0f / sqrtf(v / (float)C + 1e-5f);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * rs * w[c] + b[c];
        mean[r] = m;
        rstd[r] = rs;
    }
}

void mw_k_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C, int nt)
{
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < N; r++) {
            const float *x = inp + (size_t)r * (size_t)C, *d = dout + (size_t)r * (size_t)C;
            float *dx = dinp + (size_t)r * (size_t)C;
            float m = mean[r], rs = rstd[r], s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+:s1, s2)
            for (int c = 0; c < C; c++) {
                float dn = w[c] * d[c];
                s1 += dn;
                s2 += dn * (x[c] - m) * rs;
            }
            s1 /= (float)C;
            s2 /= (float)C;
            for (int c = 0; c < C; c++) {
                float n = (x[c] - m) * rs;
                dx[c] += (w[c] * d[c] - s1 - n * s2) * rs;
            }
        }
        int nblk = (C + CB - 1) / CB;
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            int c0 = blk * CB, c1 = MW_MIN(C, c0 + CB);
            float aw[CB] = {0}, ab[CB] = {0};
            for (int r = 0; r < N; r++) {
                const float *x = inp + (size_t)r * (size_t)C, *d = dout + (size_t)r * (size_t)C;
                float m = mean[r], rs = rstd[r];
                for (int c = c0; c < c1; c++) {
                    aw[c - c0] += d[c] * ((x[c] - m) * rs);
                    ab[c - c0] += d[c];
                }
            }
            for (int c = c0; c < c1; c++) { dw[c] += aw[c - c0]; db[c] += ab[c - c0]; }
        }
    }
}

void mw_k_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                const float *B, int ldb, float beta, float *C, int ldc, int nt)
{
    enum CBLAS_TRANSPOSE ta = transA ? CblasTrans : CblasNoTrans, tb = transB ? CblasTrans : CblasNoTrans;
    int split_rows = M >= N;
    int dim = split_rows ? M : N;
    if (nt > 1 && dim < 64 * nt) nt = MW_MAX(1, dim / 64);
    if (nt <= 1) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), n = omp_get_num_threads();
        int chunk = MW_ALIGN_UP((dim + n - 1) / n, 16);
        int s = MW_MIN(dim, tid * chunk), e = MW_MIN(dim, s + chunk);
        if (e > s) {
            if (split_rows) {
                const float *a = transA ? A + s : A + (size_t)s * (size_t)lda;
                cblas_sgemm(CblasRowMajor, ta, tb, e - s, N, K, alpha, a, lda, B, ldb, beta,
                            C + (size_t)s * (size_t)ldc, ldc);
            } else {
                const float *b = transB ? B + (size_t)s * (size_t)ldb : B + s;
                cblas_sgemm(CblasRowMajor, ta, tb, M, e - s, K, alpha, A, lda, b, ldb, beta, C + s, ldc);
            }
        }
    }
}

void mw_k_matmul_fwd(float *out, const float *inp, const float *w, const float *b, const float *resid,
                     int N, int IC, int OC, int nt)
{
    if (b || resid) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int r = 0; r < N; r++) {
            float *o = out + (size_t)r * (size_t)OC;
            const float *x = resid ? resid + (size_t)r * (size_t)OC : NULL;
            if (x && b) for (int c = 0; c < OC; c++) o[c] = x[c] + b[c];
            else memcpy(o, x ? x : b, (size_t)OC * sizeof(float));
        }
    }
    mw_k_sgemm(0, 0, N, OC, IC, 1.0f, inp, IC, w, OC, (b || resid) ? 1.0f : 0.0f, out, OC, nt);
}

static void colsum_add(float *db, const float *d, int N, int OC, int nt)
{
    int nblk = (OC + CB - 1) / CB;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * CB, c1 = MW_MIN(OC, c0 + CB);
        float a[CB] = {0};
        for (int r = 0; r < N; r++) {
            const float *row = d + (size_t)r * (size_t)OC;
            for (int c = c0; c < c1; c++) a[c - c0] += row[c];
        }
        for (int c = c0; c < c1; c++) db[c] += a[c - c0];
    }
}

void mw_k_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, int N, int IC, int OC, int nt)
{
    if (dinp) mw_k_sgemm(0, 1, N, IC, OC, 1.0f, dout, OC, w, OC, 0.0f, dinp, IC, nt);
    mw_k_sgemm(1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC, nt);
    if (db) colsum_add(db, dout, N, OC, nt);
}

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

void mw_k_gelu_fwd(float *out, const float *inp, size_t n, int nt)
{
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_S * (x + 0.044715f * x * x * x);
        float th = 1.0f - 2.0f / (1.0f + mw_expf(2.0f * u));
        out[i] = 0.5f * x * (1.0f + th);
    }
}

void mw_k_gelu_bwd(float *dinout, const float *inp, size_t n, int nt)
{
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_S * (x + 0.044715f * x * x * x);
        float th = 1.0f - 2.0f / (1.0f + mw_expf(2.0f * u));
        float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
        dinout[i] *= g;
    }
}

void mw_k_crossentropy_fwd(float *losses, float *lse, const float *logits, const int32_t *targets,
                           int N, int V, int Vp, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        const float *x = logits + (size_t)r * (size_t)Vp;
        /* 16 running maxima (a max is exact, so any order gives the same result). */
        float m16[16];
        for (int k = 0; k < 16; k++) m16[k] = -INFINITY;
        int j = 0;
        for (; j + 16 <= V; j += 16)
            for (int k = 0; k < 16; k++) m16[k] = x[j + k] > m16[k] ? x[j + k] : m16[k];
        float mx = -INFINITY;
        for (int k = 0; k < 16; k++) mx = m16[k] > mx ? m16[k] : mx;
        for (; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        float s = 0.0f;
#pragma omp simd reduction(+:s)
        for (int j = 0; j < V; j++) s += mw_expf(x[j] - mx);
        float l = mx + logf(s);
        lse[r] = l;
        if (targets) losses[r] = l - x[targets[r]];
    }
}

void mw_k_crossentropy_bwd(float *logits, const float *lse, const int32_t *targets, float scale,
                           int N, int V, int Vp, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < N; r++) {
        float *x = logits + (size_t)r * (size_t)Vp;
        float l = lse[r];
#pragma omp simd
        for (int j = 0; j < V; j++) x[j] = mw_expf(x[j] - l) * scale;
        x[targets[r]] -= scale;
        for (int j = V; j < Vp; j++) x[j] = 0.0f;
    }
}
