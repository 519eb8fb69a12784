/*
 * gpt2_attention.c — causal multi-head self-attention, forward and backward.
 *
 * Why sgemm per (batch, head) (OpenBLAS is held at one thread, see gpt2_layers.c): the products are small
 * (T x T x head_size) and there are B * NH of them, so running independent heads on the
 * OpenMP threads is better than splitting each little product across threads. Each (b, h)
 * writes only its own slice of the output, so there are no races and no float atomics, and
 * the result does not depend on which thread ran which head. The full T x T score matrix is
 * computed and the upper triangle zeroed: attention is a few percent of GPT-2's FLOPs at
 * T = 256, so the 2x waste on this part is cheaper than a triangular kernel.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* The clamps in mw_expf are float compares; under gcc's default -ftrapping-math they may not be
 * if-converted, which leaves the GELU / softmax / loss loops scalar. memwall never relies on FP
 * exceptions, so allow it here (clang vectorises these loops without being told). */
#pragma GCC optimize("no-trapping-math")
#endif
#include "gpt2_internal.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>

void mw_k_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH, int nt)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = 3 * (size_t)C, TT = (size_t)T * (size_t)T;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = qkv + (size_t)b * (size_t)T * C3 + (size_t)h * (size_t)hs;
        const float *k = q + C, *v = q + 2 * (size_t)C;
        float *S = att + (size_t)bh * TT;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, (int)C3, k, (int)C3,
                    0.0f, S, T);
        for (int i = 0; i < T; i++) {
            float *row = S + (size_t)i * (size_t)T;
            float mx = -INFINITY;
            for (int j = 0; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
            float s = 0.0f;
#pragma omp simd reduction(+:s)
            for (int j = 0; j <= i; j++) { float e = mw_expf(row[j] - mx); row[j] = e; s += e; }
            float inv = 1.0f / s;
            for (int j = 0; j <= i; j++) row[j] *= inv;
            for (int j = i + 1; j < T; j++) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, S, T, v, (int)C3,
                    0.0f, out + (size_t)b * (size_t)T * (size_t)C + (size_t)h * (size_t)hs, C);
    }
}

void mw_k_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH, int nt)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = 3 * (size_t)C, TT = (size_t)T * (size_t)T;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t qo = (size_t)b * (size_t)T * C3 + (size_t)h * (size_t)hs;
        const float *q = qkv + qo, *k = q + C, *v = q + 2 * (size_t)C;
        float *dq = dqkv + qo, *dk = dq + C, *dv = dq + 2 * (size_t)C;
        const float *P = att + (size_t)bh * TT;
        const float *dy = dout + (size_t)b * (size_t)T * (size_t)C + (size_t)h * (size_t)hs;
        float *dS = scratch + (size_t)omp_get_thread_num() * TT;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, (int)C3,
                    0.0f, dS, T);
        for (int i = 0; i < T; i++) {
            const float *p = P + (size_t)i * (size_t)T;
            float *d = dS + (size_t)i * (size_t)T;
            float s = 0.0f;
#pragma omp simd reduction(+:s)
            for (int j = 0; j <= i; j++) s += p[j] * d[j];
            for (int j = 0; j <= i; j++) d[j] = p[j] * (d[j] - s) * scale;
            for (int j = i + 1; j < T; j++) d[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, dS, T, k, (int)C3,
                    0.0f, dq, (int)C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, dS, T, q, (int)C3,
                    0.0f, dk, (int)C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, dy, C,
                    0.0f, dv, (int)C3);
    }
}
