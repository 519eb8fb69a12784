/*
 * llama_avx512.c — the Llama family's AVX-512 kernels: a single-threaded sgemm for the products,
 * and the causal softmax rows of attention (compiled with the AVX-512 flags only; llama_layers.c
 * calls them on its fast path when mw_simd_active() says avx512, and OpenBLAS through mw_k_sgemm
 * and its scalar loops otherwise).
 *
 * Why memwall carries its own product here: OpenBLAS picks its kernels from the CPU models it
 * knows, and a release older than the CPU (Debian 12's 0.3.21 on AMD family 1Ah, Zen 5) runs its
 * AVX2 ("Haswell") kernels on an AVX-512 machine, with half the vector width. The products are
 * almost all of a training step, so they decide its time (bench/llama_vs_torch.sh measures it).
 * This product also lets causal attention skip the work above the diagonal (`tri`).
 *
 * Shape: the BLIS loop nest. C [M, N] is cut into NC-column panels; K into KC slices; for each
 * slice the B panel is packed into NR-wide column strips (k-major, zero-padded), and each
 * MC-row block of A into MR-row strips (k-major, zero-padded); the micro-kernel multiplies one
 * MR x KC strip of A by one KC x NR strip of B into MR x NR accumulators held in 24 zmm registers
 * (MR = 12 rows, NR = 32 columns: two vectors per row) and adds the tile to C once per slice.
 *
 * Bits: every element of C is one chain of FMAs over k within a slice, slices in order, then
 * alpha * sum + beta * C (beta 0: C is not read) at the first slice and + C after it; the same
 * operations whatever the element's place in a tile, the tile's place in a block, M, N or how the
 * caller splits C among threads. So the result does not depend on the thread count (the caller
 * splits C by rows or columns).
 *
 * Packing buffers: one pair per thread (MC x KC and KC x NC floats, 1.4 MiB), allocated at the
 * thread's first product and kept for the process (a registry keeps them reachable).
 */
#include "llama_internal.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#define MR 12
#define NR 32
#define KC 256
#define MC 384  /* a multiple of MR: the packed A block, 384 KiB, stays in L2 */
#define NC 1024 /* a multiple of NR: the packed B panel, 1 MiB */

struct pack_bufs {
    struct pack_bufs *next;
    float *a; /* [MC * KC] */
    float *b; /* [KC * NC] */
};

static _Thread_local struct pack_bufs *t_bufs;
static struct pack_bufs *g_bufs; /* every thread's pair, so that they stay reachable */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static struct pack_bufs *bufs(void)
{
    if (t_bufs) return t_bufs;
    struct pack_bufs *p = malloc(sizeof *p);
    if (!p) return NULL;
    p->a = aligned_alloc(64, (size_t)MC * KC * sizeof(float));
    p->b = aligned_alloc(64, (size_t)KC * NC * sizeof(float));
    if (!p->a || !p->b) {
        free(p->a);
        free(p->b);
        free(p);
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    p->next = g_bufs;
    g_bufs = p;
    pthread_mutex_unlock(&g_lock);
    t_bufs = p;
    return p;
}

/* r[0..15] (rows) -> r[j] = column j of the 16 x 16 block: 32-bit, 64-bit, then two 128-bit
 * interleaving stages. */
static inline void tr16(__m512 *r)
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xdd);
    }
}

/* rows src[c * ld + 0..kc) for c < n (n <= 16) -> d[k * dld + c] (the lanes of `keep`), 16 k at
 * a time through tr16; lanes c >= n are zero. */
static void pack_tr(float *d, int dld, __mmask16 keep, const float *src, int ld, int n, int kc)
{
    __m512 r[16];
    for (int k = 0; k < kc; k += 16) {
        int w = kc - k < 16 ? kc - k : 16;
        __mmask16 m = (__mmask16)((1u << w) - 1);
        for (int c = 0; c < 16; c++)
            r[c] = c < n ? _mm512_maskz_loadu_ps(m, src + (size_t)c * (size_t)ld + k) : _mm512_setzero_ps();
        tr16(r);
        for (int i = 0; i < w; i++) _mm512_mask_storeu_ps(d + (size_t)(k + i) * (size_t)dld, keep, r[i]);
    }
}

/* A [i0.., p0..] (mc x kc of op(A)) -> MR-row strips, each [kc][MR], rows past mc zero. */
static void pack_a(float *d, int ta, const float *A, int lda, int i0, int mc, int p0, int kc)
{
    for (int s = 0; s < mc; s += MR, d += (size_t)MR * (size_t)kc) {
        int mr = mc - s < MR ? mc - s : MR;
        if (!ta) {
            pack_tr(d, MR, 0x0fff, A + (size_t)(i0 + s) * (size_t)lda + p0, lda, mr, kc);
        } else {
            __mmask16 m = (__mmask16)((1u << mr) - 1);
            for (int k = 0; k < kc; k++) {
                const float *src = A + (size_t)(p0 + k) * (size_t)lda + i0 + s;
                /* 12 of 16 lanes: the store's mask keeps the next k's row intact */
                _mm512_mask_storeu_ps(d + (size_t)k * MR, 0x0fff, _mm512_maskz_loadu_ps(m, src));
            }
        }
    }
}

/* B [p0.., j0..] (kc x nc of op(B)) -> NR-column strips, each [kc][NR], columns past nc zero. */
static void pack_b(float *d, int tb, const float *B, int ldb, int p0, int kc, int j0, int nc)
{
    for (int s = 0; s < nc; s += NR, d += (size_t)NR * (size_t)kc) {
        int nr = nc - s < NR ? nc - s : NR;
        if (!tb) {
            __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
            __mmask16 m1 = nr >= 32 ? 0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
            for (int k = 0; k < kc; k++) {
                const float *src = B + (size_t)(p0 + k) * (size_t)ldb + j0 + s;
                _mm512_store_ps(d + (size_t)k * NR, _mm512_maskz_loadu_ps(m0, src));
                _mm512_store_ps(d + (size_t)k * NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        } else {
            const float *src = B + (size_t)(j0 + s) * (size_t)ldb + p0;
            pack_tr(d, NR, 0xffff, src, ldb, nr < 16 ? nr : 16, kc);
            pack_tr(d + 16, NR, 0xffff, nr > 16 ? src + 16 * (size_t)ldb : src, ldb, nr > 16 ? nr - 16 : 0, kc);
        }
    }
}

/* C[mr, nr] = alpha * (a strip x b strip over kc) + beta * C (beta 0: C not read). */
static void kern(int kc, const float *a, const float *b, float *c, int ldc, int mr, int nr, float alpha, float beta)
{
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    __m512 c80 = c00, c81 = c00, c90 = c00, c91 = c00, ca0 = c00, ca1 = c00, cb0 = c00, cb1 = c00;
    for (int k = 0; k < kc; k++, a += MR, b += NR) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), x;
#define ROW(r, i) x = _mm512_set1_ps(a[i]); c##r##0 = _mm512_fmadd_ps(x, b0, c##r##0); c##r##1 = _mm512_fmadd_ps(x, b1, c##r##1)
        ROW(0, 0); ROW(1, 1); ROW(2, 2); ROW(3, 3); ROW(4, 4); ROW(5, 5);
        ROW(6, 6); ROW(7, 7); ROW(8, 8); ROW(9, 9); ROW(a, 10); ROW(b, 11);
#undef ROW
    }
    __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xffff : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1) : 0;
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __m512 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51},
                         {c60, c61}, {c70, c71}, {c80, c81}, {c90, c91}, {ca0, ca1}, {cb0, cb1}};
    for (int r = 0; r < mr; r++) {
        float *cr = c + (size_t)r * (size_t)ldc;
        __m512 x0 = _mm512_mul_ps(va, acc[r][0]), x1 = _mm512_mul_ps(va, acc[r][1]);
        if (beta == 1.0f) {
            x0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), x0);
            x1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), x1);
        } else if (beta != 0.0f) {
            x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
            x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
        }
        _mm512_mask_storeu_ps(cr, m0, x0);
        _mm512_mask_storeu_ps(cr + 16, m1, x1);
    }
}

/* Without packing buffers (no memory): the same operations element by element. */
static void gemm_plain(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float *c = C + (size_t)i * (size_t)ldc + j;
            for (int p0 = 0; p0 < K || p0 == 0; p0 += KC) {
                float s = 0.0f;
                for (int k = p0; k < K && k < p0 + KC; k++)
                    s = fmaf(ta ? A[(size_t)k * (size_t)lda + i] : A[(size_t)i * (size_t)lda + k],
                             tb ? B[(size_t)j * (size_t)ldb + k] : B[(size_t)k * (size_t)ldb + j], s);
                float be = p0 == 0 ? beta : 1.0f;
                *c = be == 0.0f ? alpha * s : be == 1.0f ? *c + alpha * s : fmaf(be, *c, alpha * s);
            }
        }
}

void lk_gemm_avx512(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    int ldb, float beta, float *C, int ldc, enum lk_tri tri)
{
    if (M <= 0 || N <= 0) return;
    struct pack_bufs *pb = bufs();
    if (!pb || K <= 0) {
        gemm_plain(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    for (int jc = 0; jc < N; jc += NC) {
        int nc = N - jc < NC ? N - jc : NC;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC;
            float be = pc == 0 ? beta : 1.0f;
            pack_b(pb->b, tb, B, ldb, pc, kc, jc, nc);
            for (int ic = 0; ic < M; ic += MC) {
                int mc = M - ic < MC ? M - ic : MC;
                pack_a(pb->a, ta, A, lda, ic, mc, pc, kc);
                for (int jr = 0; jr < nc; jr += NR) {
                    int nr = nc - jr < NR ? nc - jr : NR, j0 = jc + jr;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR, i0 = ic + ir, k0 = 0, k1 = kc;
                        /* the strip's rows i0..i0+mr-1: what the triangle leaves of this slice */
                        if (tri == LK_TRI_OUT_LOWER && j0 > i0 + mr - 1) continue;
                        if (tri == LK_TRI_IN_LOWER && i0 + mr - pc < k1) k1 = i0 + mr - pc < 0 ? 0 : i0 + mr - pc;
                        if (tri == LK_TRI_IN_UPPER && i0 - pc > k0) k0 = i0 - pc > kc ? kc : i0 - pc;
                        kern(k1 - k0, pb->a + (size_t)ir * (size_t)kc + (size_t)k0 * MR,
                             pb->b + (size_t)jr * (size_t)kc + (size_t)k0 * NR, C + (size_t)i0 * (size_t)ldc + j0, ldc,
                             mr, nr, alpha, be);
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ softmax rows */

/* e^x for x <= 0 (softmax arguments; clamped at -87 like mw_expf): x = n ln2 + r, a degree-7
 * polynomial in r, times 2^n. Within 2 ulp of expf. */
static inline __m512 exp_le0(__m512 x)
{
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

void lk_softmax_row_avx512(float *row, int n, int T)
{
    __m512 mx = _mm512_set1_ps(-INFINITY), s = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, row + j));
    }
    __m512 vmx = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512 e = exp_le0(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vmx));
        _mm512_mask_storeu_ps(row + j, m, e);
        s = _mm512_mask_add_ps(s, m, s, e);
    }
    __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(s));
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
    }
    for (int j = n; j < T; j++) row[j] = 0.0f;
}

void lk_softmax_bwd_row_avx512(float *d, const float *p, int n, int T, float scale)
{
    __m512 s = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p + j), _mm512_maskz_loadu_ps(m, d + j), s);
    }
    __m512 vs = _mm512_set1_ps(_mm512_reduce_add_ps(s)), vc = _mm512_set1_ps(scale);
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + j), _mm512_sub_ps(_mm512_maskz_loadu_ps(m, d + j), vs));
        _mm512_mask_storeu_ps(d + j, m, _mm512_mul_ps(x, vc));
    }
    for (int j = n; j < T; j++) d[j] = 0.0f;
}
