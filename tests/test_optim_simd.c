/*
 * test_optim_simd.c — every SIMD variant against the scalar reference, element by element
 * and BITWISE, for every format combination, n = 0, 1, 7, 15, 4097 and a size above two
 * tiles; plus thread-count and slice-split independence, the conversions against the
 * hardware instructions (F16C, AVX512-BF16), and the sum of squares.
 * Bitwise everywhere: the kernels do the same IEEE operations in the same order (no FMA,
 * no approximate reciprocal), so no ulp bound is needed; a difference is a bug.
 * CTest variants: scalar avx2 avx512 avx512bf16
 */
#include "optim/optim_internal.h"
#include "optim_state.h"

#include <math.h>
#include <pthread.h>

struct variant { const char *name; const struct mw_optim_kernels *k; };

static const enum mw_optim_dtype G[] = {MW_OPTIM_F32, MW_OPTIM_BF16, MW_OPTIM_F16};
static const enum mw_optim_dtype M[] = {MW_OPTIM_F32, MW_OPTIM_BF16, MW_OPTIM_Q8, MW_OPTIM_BF16_SR};
#define NM ((int)(sizeof M / sizeof M[0]))
static const enum mw_optim_dtype W[] = {MW_OPTIM_NONE, MW_OPTIM_BF16, MW_OPTIM_F16};
static const size_t NS[] = {0, 1, 7, 15, 4097, 2 * MW_OPTIM_TILE + 300};

/* Three AdamW steps (then SGD for non-Q8) with kernel table kt on the calling thread. */
static void run_steps(const struct mw_optim_kernels *kt, struct ost *s, int sgd)
{
    struct mw_kargs k;
    memset(&k, 0, sizeof k);
    k.fmt = s->f;
    k.s = ost_slice(s, 0, s->n);
    k.off32 = 0xfffffff0u;                          /* BF16_SR indices wrap mod 2^32 */
    for (int t = 1; t <= 3; t++) {
        k.seed = 0x1234567u * (uint32_t)t;
        ost_regrad(s, (uint64_t)t, t == 2 ? 1e-3f : 1.0f);
        k.a = (struct mw_adamw_k){.gscale = t == 3 ? 0.5f : 1.0f, .b1 = 0.9f, .c1 = 0.1f, .b2 = 0.999f,
                                  .c2 = 0.001f, .decay = 0.9999f, .step_size = 1e-3f * t, .isb2 = 3.0f,
                                  .eps = 1e-8f};
        if (sgd) {
            k.sg = (struct mw_sgd_k){.gscale = 0.5f, .lr = 0.01f, .momentum = 0.9f, .wd = 1e-4f,
                                     .nesterov = t == 2, .use_buf = t != 3};
            kt->sgd(&k, 0, s->n);
        } else {
            kt->adamw(&k, 0, s->n);
        }
    }
}

static void test_variant(const struct variant *va)
{
    int combos = 0;
    for (size_t gi = 0; gi < 3; gi++)
        for (int mi = 0; mi < NM; mi++)
            for (size_t wi = 0; wi < 3; wi++)
                for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++)
                    for (int sgd = 0; sgd < 2; sgd++) {
                        if (sgd && (M[mi] == MW_OPTIM_Q8 || M[mi] == MW_OPTIM_BF16_SR)) continue;
                        struct mw_optim_format f = {G[gi], M[mi], W[wi]};
                        struct ost a, b;
                        ost_init(&a, &f, NS[ni]);
                        ost_init(&b, &f, NS[ni]);
                        ost_fill(&a, 42 + ni, 1.0f);
                        ost_copy(&b, &a);
                        run_steps(&mw_optim_kernels_scalar, &a, sgd);
                        run_steps(va->k, &b, sgd);
                        const char *what;
                        long d = ost_diff(&a, &b, &what);
                        CHECK_MSG(d < 0, "%s %s grad=%s moments=%s w=%s n=%zu: %s[%ld] differs from scalar",
                                  va->name, sgd ? "sgd" : "adamw", mw_optim_dtype_name(f.grad),
                                  mw_optim_dtype_name(f.moments), mw_optim_dtype_name(f.weights_out),
                                  NS[ni], what, d);
                        combos++;
                        ost_free(&a);
                        ost_free(&b);
                    }
    printf("%s: %d format/size combinations bitwise equal to scalar\n", va->name, combos);
}

/* Moments whose rounding takes the special lanes (zero, denormal, infinite, NaN), mixed into
 * vectors of ordinary ones: every lane of every moment format bitwise equal to scalar. */
static void test_special_lanes(const struct variant *va)
{
    for (int mi = 0; mi < NM; mi++) {
        if (M[mi] == MW_OPTIM_Q8) continue;
        struct mw_optim_format f = {MW_OPTIM_F32, M[mi], MW_OPTIM_BF16};
        struct ost a, b;
        size_t n = 4097;
        ost_init(&a, &f, n);
        ost_init(&b, &f, n);
        ost_fill(&a, 77, 1.0f);
        for (size_t i = 0; i < n; i++) {
            float *g = a.grad;
            if (i % 13 == 0) { /* a NaN whose low payload bits would round it (bf16 must keep it a quiet NaN) */
                uint32_t u = i % 26 ? 0x7fc0ffffu : 0xffc08001u;
                memcpy(&g[i], &u, 4);
            }
            else if (i % 17 == 0) { g[i] = 0.0f; ost_put(f.moments, a.m, i, 0.0f); ost_put(f.moments, a.v, i, 0.0f); }
            else if (i % 19 == 0) { g[i] = 0.0f; ost_put(f.moments, a.m, i, -1e-39f); ost_put(f.moments, a.v, i, 1e-39f); }
            else if (i % 31 == 0) { g[i] = 1e-38f; ost_put(f.moments, a.m, i, 0.0f); ost_put(f.moments, a.v, i, 0.0f); } /* m becomes denormal */
            else if (i % 23 == 0) g[i] = INFINITY;
            else if (i % 29 == 0) g[i] = 1e-30f; /* g^2 underflows */
        }
        ost_copy(&b, &a);
        struct mw_kargs k;
        memset(&k, 0, sizeof k);
        k.fmt = f;
        k.a = (struct mw_adamw_k){.gscale = 1.0f, .b1 = 0.9f, .c1 = 0.1f, .b2 = 0.999f, .c2 = 0.001f,
                                  .decay = 0.9999f, .step_size = 1e-3f, .isb2 = 3.0f, .eps = 1e-8f};
        k.seed = 99;
        k.s = ost_slice(&a, 0, n);
        mw_optim_kernels_scalar.adamw(&k, 0, n);
        k.s = ost_slice(&b, 0, n);
        va->k->adamw(&k, 0, n);
        const char *what;
        long d = ost_diff(&a, &b, &what);
        CHECK_MSG(d < 0, "%s moments=%s special lanes: %s[%ld] differs from scalar", va->name,
                  mw_optim_dtype_name(f.moments), what, d);
        ost_free(&a);
        ost_free(&b);
    }
}

/* The bandwidth-limit pass must leave the state as it was. */
static void test_touch(const struct variant *va)
{
    for (int mi = 0; mi < NM; mi++) {
        struct mw_optim_format f = {MW_OPTIM_BF16, M[mi], MW_OPTIM_NONE};
        struct ost a, b;
        ost_init(&a, &f, 4097); ost_init(&b, &f, 4097);
        ost_fill(&a, 5, 1.0f);
        run_steps(&mw_optim_kernels_scalar, &a, 0);
        ost_copy(&b, &a);
        struct mw_kargs k;
        memset(&k, 0, sizeof k);
        k.fmt = f;
        k.s = ost_slice(&a, 0, a.n);
        va->k->touch(&k, 0, a.n);
        const char *what;
        long d = ost_diff(&a, &b, &what);
        CHECK_MSG(d < 0, "%s bandwidth pass changed %s[%ld]", va->name, what, d);
        ost_free(&a); ost_free(&b);
    }
}

/* Conversions: scalar element rules against the variant's arrays over a strided sweep of
 * all 2^32 float bit patterns (every 997th, plus every fp16/bf16 value and halfway point). */
static void test_conversions(const struct variant *va)
{
    const size_t n = (1ull << 32) / 997 + 1 + 4 * 65536;
    float *x = malloc(n * 4);
    uint16_t *h1 = malloc(n * 2), *h2 = malloc(n * 2);
    float *y1 = malloc(n * 4), *y2 = malloc(n * 4);
    REQUIRE(x && h1 && h2 && y1 && y2);
    size_t k = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 997) { uint32_t b = (uint32_t)u; memcpy(&x[k++], &b, 4); }
    for (uint32_t h = 0; h < 65536; h++) {
        x[k++] = mw_f16_f32((uint16_t)h);
        uint32_t b = (uint32_t)h << 16; memcpy(&x[k++], &b, 4);
        b |= 0x8000; memcpy(&x[k++], &b, 4);                                  /* bf16 halfway */
        float f = mw_f16_f32((uint16_t)h); uint32_t fb; memcpy(&fb, &f, 4);
        fb += 1u << 12; memcpy(&x[k++], &fb, 4);                              /* fp16 halfway */
    }
    REQUIRE(k <= n);
    int bad = 0;
    for (size_t i = 0; i < k; i++) h1[i] = mw_bf16_rne(x[i]);
    va->k->f32_to_bf16(x, h2, k);
    for (size_t i = 0; i < k && bad < 5; i++)
        if (h1[i] != h2[i]) { bad++; uint32_t b; memcpy(&b, &x[i], 4);
            CHECK_MSG(0, "%s f32->bf16 of 0x%08x: scalar 0x%04x, simd 0x%04x", va->name, b, h1[i], h2[i]); }
    for (size_t i = 0; i < k; i++) h1[i] = mw_f16_rne(x[i]);
    va->k->f32_to_f16(x, h2, k);
    for (size_t i = 0; i < k && bad < 10; i++)
        if (h1[i] != h2[i]) { bad++; uint32_t b; memcpy(&b, &x[i], 4);
            CHECK_MSG(0, "%s f32->f16 of 0x%08x: scalar 0x%04x, simd 0x%04x", va->name, b, h1[i], h2[i]); }
    for (uint32_t i = 0; i < 65536; i++) h1[i] = (uint16_t)i;
    for (uint32_t i = 0; i < 65536; i++) y1[i] = mw_f16_f32((uint16_t)i);
    va->k->f16_to_f32(h1, y2, 65536);
    CHECK_MSG(!memcmp(y1, y2, 65536 * 4), "%s f16->f32 differs from scalar", va->name);
    for (uint32_t i = 0; i < 65536; i++) y1[i] = mw_bf16_f32((uint16_t)i);
    va->k->bf16_to_f32(h1, y2, 65536);
    CHECK_MSG(!memcmp(y1, y2, 65536 * 4), "%s bf16->f32 differs from scalar", va->name);
    free(x); free(h1); free(h2); free(y1); free(y2);
}

static void test_sumsq(const struct variant *va)
{
    for (size_t gi = 0; gi < 3; gi++)
        for (size_t ni = 0; ni < sizeof NS / sizeof NS[0]; ni++) {
            struct mw_optim_format f = {G[gi], MW_OPTIM_F32, MW_OPTIM_NONE};
            struct ost a;
            ost_init(&a, &f, NS[ni]);
            ost_fill(&a, 7, 3.0f);
            size_t n = NS[ni], end = MW_MIN_SZ(n, MW_OPTIM_TILE);
            double s1 = mw_optim_kernels_scalar.sumsq(f.grad, a.grad, 0, end, 0.25f);
            double s2 = va->k->sumsq(f.grad, a.grad, 0, end, 0.25f);
            CHECK_MSG(!memcmp(&s1, &s2, 8), "%s sumsq grad=%s n=%zu: %.17g vs %.17g", va->name,
                      mw_optim_dtype_name(f.grad), n, s1, s2);
            double ref = 0;
            for (size_t i = 0; i < end; i++) { double g = 0.25 * ost_get(f.grad, a.grad, i); ref += g * g; }
            CHECK_MSG(fabs(s1 - ref) <= 1e-5 * ref, "sumsq %.9g vs double %.9g", s1, ref);
            ost_free(&a);
        }
}

/* Several caller threads stepping disjoint slices at once (the offload engine's pattern). */
struct worker { const struct mw_optim_format *f; const struct mw_adamw_hp *hp; struct mw_optim_slice sl; int rc; };
static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct mw_optim_exec ex = {2, MW_SIMD_AUTO, MW_OPTIM_CHECK_FINITE};   /* OpenMP inside, too */
    w->rc = mw_adamw_step(w->f, w->hp, &w->sl, &ex);
    return NULL;
}

static void test_concurrent(void)
{
    const size_t n = 4 * MW_OPTIM_TILE + 777, part = MW_OPTIM_TILE + 256;
    for (int mi = 0; mi < NM; mi++) {
        struct mw_optim_format f = {MW_OPTIM_F16, M[mi], MW_OPTIM_BF16};
        struct ost a, b;
        ost_init(&a, &f, n); ost_init(&b, &f, n);
        ost_fill(&a, 21, 0.5f);
        ost_copy(&b, &a);
        struct mw_adamw_hp hp = mw_adamw_hp_default();
        hp.step = 3;
        struct mw_optim_slice whole = ost_slice(&a, 0, n);
        CHECK_EQ_INT(mw_adamw_step(&f, &hp, &whole, NULL), 0);
        pthread_t th[8];
        struct worker w[8];
        int nw = 0;
        for (size_t off = 0; off < n; off += part, nw++) {
            w[nw] = (struct worker){&f, &hp, ost_slice(&b, off, MW_MIN_SZ(part, n - off)), -1};
            REQUIRE(pthread_create(&th[nw], NULL, worker_main, &w[nw]) == 0);
        }
        for (int i = 0; i < nw; i++) { pthread_join(th[i], NULL); CHECK_EQ_INT(w[i].rc, 0); }
        const char *what;
        long d = ost_diff(&a, &b, &what);
        CHECK_MSG(d < 0, "moments=%s: %d concurrent callers differ from one call at %s[%ld]",
                  mw_optim_dtype_name(f.moments), nw, what, d);
        ost_free(&a); ost_free(&b);
    }
}

/* Public API: threads and slice splits give bitwise the same result as one call. */
static void test_splits(void)
{
    const size_t n = 3 * MW_OPTIM_TILE + 1000;
    for (int mi = 0; mi < NM; mi++) {
        struct mw_optim_format f = {MW_OPTIM_BF16, M[mi], MW_OPTIM_BF16};
        struct ost a, b, c;
        ost_init(&a, &f, n); ost_init(&b, &f, n); ost_init(&c, &f, n);
        ost_fill(&a, 3, 1.0f);
        ost_copy(&b, &a); ost_copy(&c, &a);
        struct mw_adamw_hp hp = mw_adamw_hp_default();
        for (int t = 1; t <= 3; t++) {
            hp.step = t;
            ost_regrad(&a, (uint64_t)t, 1.0f); ost_regrad(&b, (uint64_t)t, 1.0f); ost_regrad(&c, (uint64_t)t, 1.0f);
            struct mw_optim_exec one = {1, MW_SIMD_AUTO, 0}, two = {2, MW_SIMD_AUTO, 0};
            struct mw_optim_slice sa = ost_slice(&a, 0, n), sb = ost_slice(&b, 0, n);
            CHECK_EQ_INT(mw_adamw_step(&f, &hp, &sa, &one), 0);
            CHECK_EQ_INT(mw_adamw_step(&f, &hp, &sb, &two), 0);
            /* subgroups of 5 blocks, then the rest, each from its own call */
            for (size_t off = 0; off < n; off += 5 * MW_Q8_BLOCK) {
                struct mw_optim_slice sc = ost_slice(&c, off, MW_MIN_SZ(5 * MW_Q8_BLOCK, n - off));
                CHECK_EQ_INT(mw_adamw_step(&f, &hp, &sc, &one), 0);
            }
        }
        const char *what;
        long d = ost_diff(&a, &b, &what);
        CHECK_MSG(d < 0, "moments=%s: 2 threads differ from 1 at %s[%ld]", mw_optim_dtype_name(f.moments), what, d);
        d = ost_diff(&a, &c, &what);
        CHECK_MSG(d < 0, "moments=%s: block-aligned slices differ from one call at %s[%ld]",
                  mw_optim_dtype_name(f.moments), what, d);
        if (f.moments == MW_OPTIM_Q8) {   /* a misaligned Q8 slice is refused */
            struct mw_optim_slice bad = ost_slice(&c, 100, 1000);
            CHECK_EQ_INT(mw_adamw_step(&f, &hp, &bad, NULL), -EINVAL);
        }
        ost_free(&a); ost_free(&b); ost_free(&c);
    }
    double s1, s2;
    struct mw_optim_format f = {MW_OPTIM_F16, MW_OPTIM_F32, MW_OPTIM_NONE};
    struct ost a;
    ost_init(&a, &f, n);
    ost_fill(&a, 9, 2.0f);
    struct mw_optim_exec one = {1, MW_SIMD_AUTO, 0}, two = {2, MW_SIMD_AUTO, 0};
    CHECK_EQ_INT(mw_grad_sumsq(f.grad, a.grad, n, 1.0f, &one, &s1), 0);
    CHECK_EQ_INT(mw_grad_sumsq(f.grad, a.grad, n, 1.0f, &two, &s2), 0);
    CHECK_MSG(s1 == s2 && s1 > 0, "sumsq depends on the thread count: %.17g vs %.17g", s1, s2);
    ost_free(&a);
}

/* One CTest entry per variant (argument): a variant this CPU cannot run exits 77 (CTest
 * SKIP_RETURN_CODE), so a machine without AVX-512 shows "skipped", never "passed". "scalar"
 * runs the reference's own checks and the variant-independent ones (AUTO dispatch: thread and
 * slice splits, concurrent callers, conversions of single values). No argument: all that run. */
int main(int argc, char **argv)
{
    const char *want = argc > 1 ? argv[1] : "all";
    int all = !strcmp(want, "all");
    printf("detected: %s, active: %s\n", mw_simd_name(mw_simd_detect()), mw_simd_name(mw_simd_active()));
    struct variant v;
    int ran = 0;
    if (!strcmp(want, "avx2") || all) {
        if (mw_simd_supported(MW_SIMD_AVX2)) {
            v = (struct variant){"avx2", &mw_optim_kernels_avx2};
            test_variant(&v); test_special_lanes(&v); test_touch(&v); test_conversions(&v); test_sumsq(&v);
            ran = 1;
        } else if (!all) SKIP("avx2 variant: this CPU lacks AVX2/FMA/F16C");
    }
    if (!strcmp(want, "avx512") || all) {
        if (mw_simd_supported(MW_SIMD_AVX512)) {
            v = (struct variant){"avx512 (bf16 emulated)", mw_optim_kernels_avx512(0)};
            test_variant(&v); test_special_lanes(&v); test_touch(&v); test_conversions(&v); test_sumsq(&v);
            ran = 1;
        } else if (!all) SKIP("avx512 variant: this CPU lacks AVX-512 F/BW/VL/DQ");
    }
    if (!strcmp(want, "avx512bf16") || all) {
        if (mw_simd_supported(MW_SIMD_AVX512) && mw_simd_has_avx512bf16()) {
            v = (struct variant){"avx512 (AVX512-BF16)", mw_optim_kernels_avx512(1)};
            test_variant(&v); test_special_lanes(&v); test_touch(&v); test_conversions(&v); test_sumsq(&v);
            ran = 1;
        } else if (!all) SKIP("avx512bf16 variant: this CPU lacks AVX-512 F/BW/VL/DQ or AVX512-BF16");
    }
    if (!strcmp(want, "scalar") || all) {
        v = (struct variant){"scalar", &mw_optim_kernels_scalar};
        test_touch(&v);
        test_sumsq(&v); /* against the sum in double */
        test_splits();
        test_concurrent();
        CHECK_EQ_INT(mw_f32_to_bf16(1.0f), 0x3f80);
        CHECK_EQ_INT(mw_f32_to_bf16(1.00390625f), 0x3f80);      /* halfway, even stays */
        CHECK_EQ_INT(mw_f32_to_bf16(1.01171875f), 0x3f82);      /* halfway, odd rounds up */
        CHECK_EQ_INT(mw_f32_to_f16(65504.0f), 0x7bff);
        CHECK_EQ_INT(mw_f32_to_f16(65520.0f), 0x7c00);
        CHECK_EQ_INT(mw_f32_to_f16(5.9604645e-08f), 0x0001);   /* smallest fp16 subnormal */
        CHECK(mw_f16_to_f32(0x3c00) == 1.0f && mw_bf16_to_f32(0xc000) == -2.0f);
        ran = 1;
    }
    if (!ran) { fprintf(stderr, "unknown variant '%s': scalar, avx2, avx512, avx512bf16\n", want); return 2; }
    TEST_END();
}
