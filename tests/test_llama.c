/*
 * test_llama.c — the Llama family's own rules, on ragged sizes (no width a multiple of 8 or 16):
 *  - the fast path (sgemm) against the plain scalar reference, element by element: logits and
 *    every gradient, for a tied GQA model with q/k/v biases and llama3 rope, and an untied one;
 *  - the kernels one by one, on sizes no SIMD width divides: the linear layers and grouped-query
 *    attention (T = 13, head_dim 7, 3 and 9 query heads) fast against reference, and 1 against 2
 *    threads bitwise (the linear layers: on AVX-512, where the products are memwall's own; OpenBLAS
 *    may round a slice of C differently from the whole); on an AVX-512 CPU also llama_avx512.c's sgemm (both transposes, alpha/beta,
 *    the causal skips, several cache blocks) against a double-precision product, a C split by
 *    rows or columns bitwise equal to the whole, and the softmax rows against scalar loops;
 *  - the seam's rules (docs/model.md): units and tensors tile the flat array; what unit_order says
 *    is what each pass acquires (batch-major and layer-major); recomputation, thread count and
 *    the layer-major step (3 micro-batches) give the batch-major bits;
 *  - the config: checkpoint encoding round trip and hostile bytes, config.json refusals by key;
 *  - safetensors: save/load round trip, a unit at a time, a corrupt file leaves the weights alone.
 */
#include "memwall/llama.h"
#include "memwall/model.h"
#include "memwall/optim.h"
#include "memwall/plan.h"
#include "memwall/common.h"
#include "model/llama_internal.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 3, T = 11, NMB = 3 };

static struct mw_llama_config ragged(int tied, int bias, int llama3)
{
    struct mw_llama_config c = {.n_layer = 2, .n_head = 6, .n_kv_head = 2, .head_dim = 6, .dim = 36, .ffn = 52,
                                .vocab = 83, .context = 13, .tied = tied, .qkv_bias = bias, .rms_eps = 1e-5f,
                                .rope_theta = 10000.0f};
    if (llama3) {
        c.rope_type = MW_LLAMA_ROPE_LLAMA3;
        c.rope_factor = 8.0f; c.rope_low = 1.0f; c.rope_high = 4.0f; c.rope_orig_ctx = 8;
    }
    return c;
}

static void tokens(int32_t *in, int32_t *tg, int n, int V, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(tu_rand(&seed) % (uint64_t)V);
        tg[i] = (int32_t)(tu_rand(&seed) % (uint64_t)V);
    }
}

static void mknet(struct mw_net *n, const struct mw_llama_config *c, int recompute, int nt)
{
    struct mw_net_config nc;
    mw_net_config_llama(&nc, c);
    struct mw_net_options o = {B, 0, recompute, nt};
    REQUIRE(mw_net_init(n, &nc, &o) == 0);
    mw_net_init_weights(n, 11);
    /* norms and biases away from 1 and 0, so their gradients matter */
    for (int i = 0; i < n->family->n_tensors(n); i++) {
        struct mw_net_tensor t;
        n->family->tensor(n, i, &t);
        if (t.ndim == 1)
            for (size_t j = 0; j < t.numel; j++) n->params[t.offset + j] += 0.1f * sinf((float)(j + 3 * i));
        else
            for (size_t j = 0; j < t.numel; j++) n->params[t.offset + j] *= 5.0f;
    }
}

static double rel_diff(const float *a, const float *b, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = isnan(d) ? INFINITY : d;
        mr = fmax(mr, fabs((double)b[i]));
    }
    return md / (mr > 0 ? mr : 1);
}

/* ------------------------------------------------------------------ kernels one by one */

static float *randbuf(size_t n, uint64_t seed)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    REQUIRE(p);
    for (size_t i = 0; i < n; i++) p[i] = tu_randf(&seed);
    return p;
}

static float *dup_buf(const float *a, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    REQUIRE(p);
    memcpy(p, a, n * sizeof(float));
    return p;
}

/* op(A) element (i, k); op(B) element (k, j) */
#define AEL(A, ta, lda, i, k) ((ta) ? (A)[(size_t)(k) * (size_t)(lda) + (i)] : (A)[(size_t)(i) * (size_t)(lda) + (k)])
#define BEL(B, tb, ldb, k, j) ((tb) ? (B)[(size_t)(j) * (size_t)(ldb) + (k)] : (B)[(size_t)(k) * (size_t)(ldb) + (j)])

/* llama_avx512.c's sgemm against a product in double, every element (relative to the sum of
 * |terms|, which bounds fp32's rounding), the padding columns of C untouched; then C computed
 * in two row slices and in two column slices equals the whole bitwise. */
static void gemm_case(int ta, int tb, int M, int N, int K, float alpha, float beta, enum lk_tri tri, uint64_t seed)
{
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    size_t na = (size_t)(ta ? K : M) * (size_t)lda, nb = (size_t)(tb ? N : K) * (size_t)ldb, nc = (size_t)M * (size_t)ldc;
    float *A = randbuf(na, seed), *B = randbuf(nb, seed + 1), *C0 = randbuf(nc, seed + 2);
    if (tri == LK_TRI_IN_LOWER || tri == LK_TRI_IN_UPPER) /* op(A) zero above / below its diagonal */
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++)
                if (tri == LK_TRI_IN_LOWER ? k > i : k < i) {
                    if (ta) A[(size_t)k * (size_t)lda + i] = 0.0f;
                    else A[(size_t)i * (size_t)lda + k] = 0.0f;
                }
    float *C = dup_buf(C0, nc), *R = dup_buf(C0, nc), *S = dup_buf(C0, nc);
    lk_gemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, tri);
    double worst = 0;
    int pad_ok = 1;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            if (tri == LK_TRI_OUT_LOWER && j > i) continue;
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double t = (double)AEL(A, ta, lda, i, k) * BEL(B, tb, ldb, k, j);
                s += t;
                mag += fabs(t);
            }
            double c0 = C0[(size_t)i * (size_t)ldc + j], want = alpha * s + (beta != 0.0f ? beta * c0 : 0.0);
            double d = fabs(want - C[(size_t)i * (size_t)ldc + j]) / (fabs(alpha) * mag + fabs(beta * c0) + 1e-30);
            worst = fmax(worst, isnan(d) ? INFINITY : d);
        }
        for (int j = N; j < ldc; j++) pad_ok &= C[(size_t)i * (size_t)ldc + j] == C0[(size_t)i * (size_t)ldc + j];
    }
    CHECK_MSG(worst <= 4e-7 * sqrt((double)K + 1) && pad_ok, "sgemm ta=%d tb=%d %dx%dx%d alpha %g beta %g tri %d: worst %.3g%s",
              ta, tb, M, N, K, alpha, beta, tri, worst, pad_ok ? "" : ", padding written");
    if (tri == LK_TRI_NONE) {
        int m1 = M / 3, n1 = N / 2 + 1 < N ? N / 2 + 1 : N;
        lk_gemm_avx512(ta, tb, m1, N, K, alpha, A, lda, B, ldb, beta, R, ldc, tri);
        lk_gemm_avx512(ta, tb, M - m1, N, K, alpha, ta ? A + m1 : A + (size_t)m1 * (size_t)lda, lda, B, ldb, beta,
                       R + (size_t)m1 * (size_t)ldc, ldc, tri);
        lk_gemm_avx512(ta, tb, M, n1, K, alpha, A, lda, B, ldb, beta, S, ldc, tri);
        lk_gemm_avx512(ta, tb, M, N - n1, K, alpha, A, lda, tb ? B + (size_t)n1 * (size_t)ldb : B + n1, ldb, beta,
                       S + n1, ldc, tri);
        CHECK_MSG(!memcmp(C, R, nc * sizeof(float)) && !memcmp(C, S, nc * sizeof(float)),
                  "sgemm ta=%d tb=%d %dx%dx%d: a split C differs from the whole", ta, tb, M, N, K);
    }
    free(A); free(B); free(C0); free(C); free(R); free(S);
}

static void gemm_avx512_rules(void)
{
    /* ragged sizes; 400 x 1100 x 600 crosses the cache blocks (MC 384, NC 1024, KC 256) */
    static const int sz[][3] = {{1, 1, 1}, {13, 7, 5}, {12, 32, 256}, {13, 33, 257}, {25, 65, 300}, {37, 19, 513},
                                {1, 100, 70}, {100, 1, 70}, {400, 1100, 600}};
    for (size_t s = 0; s < sizeof sz / sizeof sz[0]; s++)
        for (int t = 0; t < 4; t++)
            gemm_case(t >> 1, t & 1, sz[s][0], sz[s][1], sz[s][2], 1.0f, 0.0f, LK_TRI_NONE, 100 + s * 4 + (uint64_t)t);
    gemm_case(0, 1, 50, 40, 30, 0.125f, 1.0f, LK_TRI_NONE, 7);
    gemm_case(1, 0, 50, 40, 30, 2.0f, 0.5f, LK_TRI_NONE, 8);
    gemm_case(1, 1, 29, 45, 0, 1.0f, 0.5f, LK_TRI_NONE, 9); /* K = 0: C = beta C */
    static const int tn[] = {13, 77, 400};                   /* T: one strip, several, several KC slices */
    for (int i = 0; i < 3; i++) {
        int T = tn[i];
        gemm_case(0, 1, T, T, 7, 0.125f, 0.0f, LK_TRI_OUT_LOWER, 20 + (uint64_t)i); /* scores */
        gemm_case(0, 0, T, 7, T, 1.0f, 0.0f, LK_TRI_IN_LOWER, 30 + (uint64_t)i);    /* P V, dS K */
        gemm_case(1, 0, T, 7, T, 1.0f, 0.0f, LK_TRI_IN_UPPER, 40 + (uint64_t)i);    /* dS^T Q, P^T dY */
        gemm_case(1, 0, T, 33, T, 1.0f, 1.0f, LK_TRI_IN_UPPER, 50 + (uint64_t)i);   /* (accumulated) */
    }
}

static void softmax_avx512_rules(void)
{
    enum { TT = 41 };
    uint64_t seed = 61;
    double worst = 0, worst_b = 0;
    int zeros = 1;
    for (int n = 1; n <= TT; n++) {
        float row[TT], ref[TT], d[TT], dref[TT], p[TT];
        for (int j = 0; j < TT; j++) {
            row[j] = ref[j] = 6.0f * tu_randf(&seed);
            d[j] = dref[j] = tu_randf(&seed);
        }
        lk_softmax_row_avx512(row, n, TT);
        float mx = -INFINITY, s = 0.0f;
        for (int j = 0; j < n; j++) mx = ref[j] > mx ? ref[j] : mx;
        for (int j = 0; j < n; j++) { ref[j] = expf(ref[j] - mx); s += ref[j]; }
        for (int j = 0; j < n; j++) ref[j] /= s;
        for (int j = 0; j < n; j++) worst = fmax(worst, fabs((double)row[j] - ref[j]) / ref[j]);
        for (int j = n; j < TT; j++) zeros &= row[j] == 0.0f;
        memcpy(p, ref, sizeof p);
        lk_softmax_bwd_row_avx512(d, p, n, TT, 0.375f);
        float sd = 0.0f, mag = 0.0f;
        for (int j = 0; j < n; j++) { sd += p[j] * dref[j]; mag += fabsf(p[j] * dref[j]); }
        for (int j = 0; j < n; j++) {
            float want = p[j] * (dref[j] - sd) * 0.375f;
            worst_b = fmax(worst_b, fabs((double)d[j] - want) / (p[j] * (fabsf(dref[j]) + mag) * 0.375f + 1e-30));
        }
        for (int j = n; j < TT; j++) zeros &= d[j] == 0.0f;
    }
    CHECK_MSG(worst <= 1e-6 && worst_b <= 1e-6 && zeros, "softmax rows: forward %.3g, backward %.3g (relative)%s", worst,
              worst_b, zeros ? "" : ", the part past n not zeroed");
}

/* Grouped-query attention and the linear layers: fast against reference element by element,
 * 1 against 2 threads bitwise (the fast path), on sizes no SIMD width divides. */
static void layer_kernels(int NH, int KV)
{
    enum { KB = 2, KT = 13, HD = 7 };
    int QD = NH * HD, KD = KV * HD, N = KB * KT;
    size_t TT = (size_t)KT * KT;
    float *q = randbuf((size_t)N * QD, 1), *k = randbuf((size_t)N * KD, 2), *v = randbuf((size_t)N * KD, 3);
    float *dy = randbuf((size_t)N * QD, 4);
    float *o[3], *att[3], *dq[3], *dk[3], *dv[3], *scr = malloc(2 * TT * sizeof(float));
    REQUIRE(scr);
    for (int p = 0; p < 3; p++) { /* 0 reference, 1 fast on 2 threads, 2 fast on 1 thread */
        o[p] = randbuf((size_t)N * QD, 5); att[p] = randbuf((size_t)KB * NH * TT, 6);
        dq[p] = randbuf((size_t)N * QD, 7); dk[p] = randbuf((size_t)N * KD, 8); dv[p] = randbuf((size_t)N * KD, 9);
        int ref = p == 0, nt = p == 2 ? 1 : 2;
        lk_attention_fwd(o[p], att[p], q, k, v, KB, KT, NH, KV, HD, ref, nt);
        lk_attention_bwd(dq[p], dk[p], dv[p], scr, dy, q, k, v, att[p], KB, KT, NH, KV, HD, ref, nt);
    }
    double d_o = rel_diff(o[1], o[0], (size_t)N * QD), d_q = rel_diff(dq[1], dq[0], (size_t)N * QD);
    double d_k = rel_diff(dk[1], dk[0], (size_t)N * KD), d_v = rel_diff(dv[1], dv[0], (size_t)N * KD);
    CHECK_MSG(d_o <= 1e-6 && d_q <= 1e-6 && d_k <= 1e-6 && d_v <= 1e-6,
              "attention %d/%d heads fast vs reference: out %.3g dq %.3g dk %.3g dv %.3g", NH, KV, d_o, d_q, d_k, d_v);
    CHECK_MSG(!memcmp(o[1], o[2], (size_t)N * QD * sizeof(float)) && !memcmp(dq[1], dq[2], (size_t)N * QD * sizeof(float)) &&
              !memcmp(dk[1], dk[2], (size_t)N * KD * sizeof(float)) && !memcmp(dv[1], dv[2], (size_t)N * KD * sizeof(float)),
              "attention %d/%d heads: 1 and 2 threads differ", NH, KV);
    for (int p = 0; p < 3; p++) { free(o[p]); free(att[p]); free(dq[p]); free(dk[p]); free(dv[p]); }
    free(q); free(k); free(v); free(dy); free(scr);

    /* linear: 203 x 37 -> 150 splits rows among threads, 70 x 37 -> 301 columns */
    static const int shp[][3] = {{203, 37, 150}, {70, 37, 301}};
    for (int s = 0; s < 2; s++) {
        int R = shp[s][0], NI = shp[s][1], NO = shp[s][2];
        float *in = randbuf((size_t)R * NI, 11), *W = randbuf((size_t)NO * NI, 12), *b = randbuf((size_t)NO, 13);
        float *res = randbuf((size_t)R * NO, 14), *dout = randbuf((size_t)R * NO, 15);
        float *y[3], *din[3], *dW[3], *db[3];
        for (int p = 0; p < 3; p++) {
            int ref = p == 0, nt = p == 2 ? 1 : 2;
            y[p] = randbuf((size_t)R * NO, 16); din[p] = randbuf((size_t)R * NI, 17);
            dW[p] = randbuf((size_t)NO * NI, 18); db[p] = randbuf((size_t)NO, 19);
            lk_linear_fwd(y[p], in, W, b, res, R, NI, NO, ref, nt);
            lk_linear_bwd(din[p], 1, dW[p], db[p], dout, in, W, R, NI, NO, ref, nt);
        }
        double dy_ = rel_diff(y[1], y[0], (size_t)R * NO), dx = rel_diff(din[1], din[0], (size_t)R * NI);
        double dw = rel_diff(dW[1], dW[0], (size_t)NO * NI), dbb = rel_diff(db[1], db[0], (size_t)NO);
        CHECK_MSG(dy_ <= 1e-6 && dx <= 1e-6 && dw <= 1e-6 && dbb <= 1e-6,
                  "linear %dx%d->%d fast vs reference: out %.3g din %.3g dW %.3g db %.3g", R, NI, NO, dy_, dx, dw, dbb);
        /* (OpenBLAS, the fallback, may round a slice of C differently from the whole) */
        CHECK_MSG(mw_simd_active() != MW_SIMD_AVX512 ||
                  (!memcmp(y[1], y[2], (size_t)R * NO * sizeof(float)) && !memcmp(din[1], din[2], (size_t)R * NI * sizeof(float)) &&
                   !memcmp(dW[1], dW[2], (size_t)NO * NI * sizeof(float)) && !memcmp(db[1], db[2], (size_t)NO * sizeof(float))),
                  "linear %dx%d->%d: 1 and 2 threads differ", R, NI, NO);
        for (int p = 0; p < 3; p++) { free(y[p]); free(din[p]); free(dW[p]); free(db[p]); }
        free(in); free(W); free(b); free(res); free(dout);
    }
}

static void ref_vs_fast(const struct mw_llama_config *c, const char *what)
{
    struct mw_net f, r;
    mknet(&f, c, 0, 2);
    mknet(&r, c, 0, 2);
    mw_llama_set_reference(&r, 1);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg, B * T, c->vocab, 5);
    mw_net_zero_grad(&f);
    mw_net_zero_grad(&r);
    REQUIRE(mw_net_forward(&f, in, tg, B, T) == 0 && mw_net_forward(&r, in, tg, B, T) == 0);
    double dl = rel_diff(mw_net_logits(&f), mw_net_logits(&r), (size_t)B * T * (size_t)c->vocab);
    CHECK_MSG(dl <= 1e-5, "%s: logits fast vs reference %.3g", what, dl);
    REQUIRE(mw_net_backward(&f, 1.0f, NULL, NULL) == 0 && mw_net_backward(&r, 1.0f, NULL, NULL) == 0);
    double worst = 0;
    for (int i = 0; i < f.family->n_tensors(&f); i++) {
        struct mw_net_tensor t;
        f.family->tensor(&f, i, &t);
        double d = rel_diff(f.grads + t.offset, r.grads + t.offset, t.numel);
        worst = fmax(worst, d);
        CHECK_MSG(d <= 1e-4, "%s: gradient %s fast vs reference %.3g", what, t.name, d);
    }
    printf("%s: fast vs reference: logits %.3g, worst gradient %.3g (relative to the tensor's max)\n", what, dl, worst);
    mw_net_free(&f);
    mw_net_free(&r);
}

struct seen { int n, units[128], backward[128]; };

static int on_unit(void *user, int event, int unit, int backward)
{
    struct seen *s = user;
    if (event == MW_NET_UNIT_ACQUIRE) {
        if (s->n < 128) { s->units[s->n] = unit; s->backward[s->n] = backward; }
        s->n++;
    }
    return 0;
}

static void check_order(const struct mw_net *n, const struct seen *s, int lm, const char *what)
{
    for (int pass = 0; pass < 2; pass++) {
        int got[128], want[128], ng = 0;
        for (int i = 0; i < s->n && i < 128; i++)
            if (s->backward[i] == pass) got[ng++] = s->units[i];
        int nw = mw_net_unit_order(n, pass ? MW_NET_BACKWARD : MW_NET_FORWARD, lm, want, 128);
        CHECK_MSG(ng == nw && !memcmp(got, want, (size_t)ng * sizeof *got), "%s %s %s: acquired %d units, the order says %d",
                  what, lm ? "layer-major" : "batch-major", pass ? "backward" : "forward", ng, nw);
    }
}

/* A step of NMB micro-batches, batch-major through forward/backward (rec: recomputation, nt threads). */
static void step_bm(struct mw_net *n, const int32_t *in, const int32_t *tg, float *losses, struct seen *s)
{
    mw_net_zero_grad(n);
    for (int k = 0; k < NMB; k++) {
        if (s) memset(s, 0, sizeof *s);
        REQUIRE(mw_net_forward(n, in + k * B * T, tg + k * B * T, B, T) == 0);
        losses[k] = n->loss;
        REQUIRE(mw_net_accum_set(n, k, NMB) == 0);
        REQUIRE(mw_net_backward(n, 1.0f / NMB, NULL, NULL) == 0);
    }
}

static void seam_rules(const struct mw_llama_config *c, const char *what)
{
    struct mw_net n, r, t1, lm;
    mknet(&n, c, 0, 2);
    mknet(&r, c, 1, 2);
    mknet(&t1, c, 0, 1);
    mknet(&lm, c, 0, 2);
    int32_t in[NMB * B * T], tg[NMB * B * T];
    tokens(in, tg, NMB * B * T, c->vocab, 9);
    float l0[NMB], l1[NMB], l2[NMB], l3[NMB];
    struct seen s;
    mw_net_set_weights_hook(&n, on_unit, &s);
    step_bm(&n, in, tg, l0, &s);
    check_order(&n, &s, 0, what); /* the last micro-batch's passes */
    step_bm(&r, in, tg, l1, NULL);
    step_bm(&t1, in, tg, l2, NULL);
    CHECK_MSG(!memcmp(l0, l1, sizeof l0) && !memcmp(n.grads, r.grads, n.sizes.grads_bytes), "%s: recompute changes bits", what);
    CHECK_MSG(!memcmp(l0, l2, sizeof l0) && !memcmp(n.grads, t1.grads, n.sizes.grads_bytes), "%s: 1 thread changes bits", what);
    memset(&s, 0, sizeof s);
    mw_net_set_weights_hook(&lm, on_unit, &s);
    mw_net_zero_grad(&lm);
    REQUIRE(mw_net_step_layer_major(&lm, NMB, in, tg, B, T, 1.0f / NMB, NULL, l3) == 0);
    check_order(&lm, &s, 1, what);
    CHECK_MSG(!memcmp(l0, l3, sizeof l0), "%s: layer-major losses differ", what);
    CHECK_MSG(!memcmp(n.grads, lm.grads, n.sizes.grads_bytes), "%s: layer-major gradients differ from batch-major", what);

    /* units and tensors tile the flat array */
    size_t next = 0;
    for (int u = 0; u < n.n_units; u++) {
        size_t first, cnt;
        REQUIRE(mw_net_unit_range(&n, u, &first, &cnt) == 0);
        CHECK(first == next && cnt > 0);
        next = first + cnt;
    }
    CHECK(next == n.sizes.n_params && n.n_units == c->n_layer + 2);
    next = 0;
    for (int i = 0; i < n.family->n_tensors(&n); i++) {
        struct mw_net_tensor t;
        n.family->tensor(&n, i, &t);
        CHECK(t.offset == next && t.numel == t.shape[0] * t.shape[1]);
        next = t.offset + t.numel;
    }
    CHECK(next == n.sizes.n_params);
    /* the planner's description counts the same parameters */
    struct mw_model d;
    struct mw_param_count pc;
    n.family->config_describe(n.cfg.raw, &d);
    mw_model_count(&d, &pc);
    CHECK_MSG(pc.total == n.sizes.n_params, "%s: the planner counts %llu parameters, the model has %zu", what,
              (unsigned long long)pc.total, n.sizes.n_params);
    mw_net_free(&n);
    mw_net_free(&r);
    mw_net_free(&t1);
    mw_net_free(&lm);
}

static void config_rules(void)
{
    const struct mw_net_family *f = mw_net_family_find("llama");
    REQUIRE(f && mw_net_family_by_id(f->id) == f && f->id != 0);
    struct mw_llama_config c = ragged(0, 1, 1), d;
    uint8_t w[MW_NET_CONFIG_WIRE];
    f->config_encode(&c, w);
    CHECK(f->config_decode(w, &d) == 0 && !memcmp(&c, &d, sizeof c));
    uint8_t h[MW_NET_CONFIG_WIRE];
    memcpy(h, w, sizeof h); h[4 + 4 * 2] = 5; /* 6 heads over 5 kv heads */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); h[7] = 0x80;      /* layers 2^31 */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); h[0] = 9;         /* version */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); h[120] = 1;       /* past the fields */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);
    memcpy(h, w, sizeof h); memset(h + 4 + 4 * 12, 0xff, 4); /* eps NaN */
    CHECK(f->config_decode(h, &d) == MW_EFORMAT);

    const char *base = "{\"model_type\":\"llama\",\"hidden_size\":36,\"intermediate_size\":52,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":6,\"num_key_value_heads\":2,\"vocab_size\":83,"
                       "\"max_position_embeddings\":13,\"rms_norm_eps\":1e-5";
    struct { const char *tail; const char *key; } bad[] = {
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", "yarn"},
        {",\"mlp_bias\":true}", "mlp_bias"},
        {",\"attention_bias\":true}", "attention_bias"},
        {",\"use_sliding_window\":true}", "use_sliding_window"},
        {",\"num_local_experts\":8}", "num_local_experts"},
        {",\"hidden_act\":\"gelu\"}", "hidden_act"},
        {",\"layer_types\":[\"sliding_attention\",\"full_attention\"]}", "layer_types"},
        {",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8}}", "low_freq_factor"},
    };
    char txt[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(txt, sizeof txt, "%s%s", base, bad[i].tail);
        CHECK_MSG(mw_llama_config_parse(txt, strlen(txt), "config.json", &d) == MW_EFORMAT &&
                  strstr(mw_error_msg(), bad[i].key), "%s: not refused by its key: %s", bad[i].tail, mw_error_msg());
    }
    snprintf(txt, sizeof txt, "%s}", base);
    CHECK(mw_llama_config_parse(txt, strlen(txt), "config.json", &d) == 0 && d.head_dim == 6 && !d.tied && !d.qkv_bias &&
          d.rope_theta == 10000.0f);
    const char *mistral = "{\"model_type\":\"mistral\",\"hidden_size\":36}";
    CHECK(mw_llama_config_parse(mistral, strlen(mistral), "config.json", &d) == MW_EFORMAT &&
          strstr(mw_error_msg(), "mistral"));
    const char *q = "{\"model_type\":\"qwen2\",\"hidden_size\":36,\"intermediate_size\":52,\"num_hidden_layers\":2,"
                    "\"num_attention_heads\":6,\"num_key_value_heads\":2,\"vocab_size\":83,\"max_position_embeddings\":13,"
                    "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0},\"tie_word_embeddings\":true}";
    CHECK(mw_llama_config_parse(q, strlen(q), "config.json", &d) == 0 && d.qkv_bias && d.tied && d.rope_theta == 1e6f);
    CHECK(mw_llama_config_parse("[1]", 3, "config.json", &d) == MW_EFORMAT);
    CHECK(mw_llama_config_parse("{\"model_type\":\"llama\"", 21, "config.json", &d) == MW_EFORMAT);
}

static void files(const struct mw_llama_config *c, const char *dir)
{
    struct mw_net a, b;
    mknet(&a, c, 0, 2);
    mknet(&b, c, 0, 2);
    mw_net_init_weights(&b, 99);
    char path[700];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    REQUIRE(mw_net_save_safetensors_units(&a, path, NULL, NULL) == 0);
    REQUIRE(mw_net_load_safetensors(&b, path) == 0);
    CHECK(!memcmp(a.params, b.params, a.sizes.params_bytes));
    mw_net_init_weights(&b, 99);
    void *l;
    REQUIRE(b.family->loader_open(&l, &b, path) == 0);
    for (int u = b.n_units - 1; u >= 0; u--) CHECK(b.family->loader_unit(l, &b, u) == 0);
    b.family->loader_close(l);
    CHECK(!memcmp(a.params, b.params, a.sizes.params_bytes));
    /* a NaN in the last tensor: refused, nothing written */
    mw_net_init_weights(&b, 99);
    float *keep = malloc(b.sizes.params_bytes);
    REQUIRE(keep);
    memcpy(keep, b.params, b.sizes.params_bytes);
    FILE *f = fopen(path, "r+b");
    REQUIRE(f && !fseek(f, -4, SEEK_END));
    uint32_t nan = 0x7fc00000u;
    REQUIRE(fwrite(&nan, 4, 1, f) == 1);
    fclose(f);
    CHECK(mw_net_load_safetensors(&b, path) == MW_EFORMAT);
    CHECK(!memcmp(keep, b.params, b.sizes.params_bytes));
    /* a model of another shape is refused at open */
    struct mw_llama_config o = *c;
    o.ffn += 1;
    struct mw_net x;
    mknet(&x, &o, 0, 1);
    CHECK(mw_net_load_safetensors(&x, path) == MW_EFORMAT && strstr(mw_error_msg(), "mlp"));
    free(keep);
    mw_net_free(&x);
    mw_net_free(&a);
    mw_net_free(&b);
}

int main(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tu_scratch_dir("llama"));
    struct mw_llama_config tied = ragged(1, 1, 1), untied = ragged(0, 0, 0);
    layer_kernels(3, 1);
    layer_kernels(9, 3);
    if (mw_simd_active() == MW_SIMD_AVX512) {
        gemm_avx512_rules();
        softmax_avx512_rules();
    } else {
        printf("no AVX-512 here (or MEMWALL_SIMD): llama_avx512.c's own checks skipped\n");
    }
    ref_vs_fast(&tied, "tied+bias+llama3");
    ref_vs_fast(&untied, "untied");
    seam_rules(&tied, "tied+bias+llama3");
    seam_rules(&untied, "untied");
    config_rules();
    files(&tied, dir);
    files(&untied, dir);
    tu_rm_rf(dir);
    TEST_END();
}
