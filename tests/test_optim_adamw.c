/*
 * test_optim_adamw.c — AdamW against PyTorch (fixtures from scripts/gen_fixtures.py), the
 * fp16 overflow path (step skipped and reported, state unchanged), bf16 and 8-bit moments
 * on a least-squares problem against fp32 moments, SGD against a hand-computed step, and
 * argument checks and footprints.
 */
#include "optim_state.h"
#include "memwall/common.h"

/* ---- fixtures: header read with memcpy, every size checked against the file size */
struct fixture {
    uint32_t n, steps;
    double lr, b1, b2, eps, wd;  /* stored as f64: 1-0.999 must not become 1-(float)0.999 */
    float *p0, *grads, *p, *m, *v;
    unsigned char *buf;
};

static int load_fixture(const char *name, struct fixture *fx)
{
    char path[1024];
    const char *src = getenv("MW_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", src ? src : ".", name);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s (run scripts/gen_fixtures.py --only optim)\n", path); return -1; }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (sz < 60) { fclose(f); fprintf(stderr, "%s: truncated header\n", path); return -1; }
    fx->buf = malloc((size_t)sz);
    REQUIRE(fx->buf);
    size_t got = fread(fx->buf, 1, (size_t)sz, f);
    fclose(f);
    if (got != (size_t)sz) { fprintf(stderr, "%s: short read\n", path); return -1; }
    uint32_t hdr[4];
    if (memcmp(fx->buf, "MWFX", 4)) { fprintf(stderr, "%s: bad magic\n", path); return -1; }
    memcpy(hdr, fx->buf + 4, 16);
    if (hdr[0] != 1 || hdr[1] != 1) { fprintf(stderr, "%s: version %u kind %u, want 1/1\n", path, hdr[0], hdr[1]); return -1; }
    fx->n = hdr[2];
    fx->steps = hdr[3];
    double hp[5];
    memcpy(hp, fx->buf + 20, 40);
    fx->lr = hp[0]; fx->b1 = hp[1]; fx->b2 = hp[2]; fx->eps = hp[3]; fx->wd = hp[4];
    uint64_t want = 60 + 4ull * fx->n * (4ull + fx->steps);
    if ((uint64_t)sz != want || fx->n == 0 || fx->n > (1u << 24) || fx->steps > 100000) {
        fprintf(stderr, "%s: size %ld, header says %llu\n", path, sz, (unsigned long long)want);
        return -1;
    }
    float *d = malloc(4ull * fx->n * (4ull + fx->steps));
    REQUIRE(d);
    memcpy(d, fx->buf + 60, 4ull * fx->n * (4ull + fx->steps));
    fx->p0 = d;
    fx->grads = d + fx->n;
    fx->p = fx->grads + (size_t)fx->n * fx->steps;
    fx->m = fx->p + fx->n;
    fx->v = fx->m + fx->n;
    return 0;
}

/* Tolerance against torch: torch computes m by lerp and divides by sqrt(1-beta2^t), memwall
 * multiplies by its reciprocal; each differs by about an ulp per step. After 100 steps we
 * require |p - p_torch| <= 1e-6 + 1e-6 |p|, and |m - m_torch| (|v - v_torch|) <= 1e-5 times
 * the rms of m_torch (v_torch): relative to rms, not to each element, because m is a running
 * sum of signed terms and may cancel to near zero. */
static void test_fixture(const char *name)
{
    struct fixture fx;
    REQUIRE(load_fixture(name, &fx) == 0);
    struct mw_optim_format f = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE};
    struct ost s;
    ost_init(&s, &f, fx.n);
    memcpy(s.master, fx.p0, 4ull * fx.n);
    struct mw_adamw_hp hp = {fx.lr, fx.b1, fx.b2, fx.eps, fx.wd, 0, 1.0f};
    struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
    for (uint32_t t = 0; t < fx.steps; t++) {
        memcpy(s.grad, fx.grads + (size_t)t * fx.n, 4ull * fx.n);
        hp.step = t + 1;
        struct mw_optim_slice sl = ost_slice(&s, 0, fx.n);
        CHECK_EQ_INT(mw_adamw_step(&f, &hp, &sl, &ex), 0);
    }
    double worst_p = 0, worst_m = 0, worst_v = 0, rms_m = 0, rms_v = 0;
    int bad = 0;
    for (uint32_t i = 0; i < fx.n; i++) { rms_m += (double)fx.m[i] * fx.m[i]; rms_v += (double)fx.v[i] * fx.v[i]; }
    rms_m = sqrt(rms_m / fx.n);
    rms_v = sqrt(rms_v / fx.n);
    for (uint32_t i = 0; i < fx.n; i++) {
        float p = s.master[i], m = ((float *)s.m)[i], v = ((float *)s.v)[i];
        double ep = fabs((double)p - fx.p[i]), em = fabs((double)m - fx.m[i]), ev = fabs((double)v - fx.v[i]);
        worst_p = fmax(worst_p, ep); worst_m = fmax(worst_m, em / rms_m); worst_v = fmax(worst_v, ev / rms_v);
        if (ep > 1e-6 + 1e-6 * fabs(fx.p[i]) || em > 1e-5 * rms_m || ev > 1e-5 * rms_v) {
            if (bad++ < 5) CHECK_MSG(0, "%s[%u]: p %.9g vs %.9g, m %.9g vs %.9g, v %.9g vs %.9g", name, i,
                                     p, fx.p[i], m, fx.m[i], v, fx.v[i]);
        }
    }
    printf("%s: %u params x %u steps vs torch.optim.AdamW: max |dp| %.3g, max |dm|/rms %.3g, |dv|/rms %.3g\n",
           name, fx.n, fx.steps, worst_p, worst_m, worst_v);
    ost_free(&s);
    free(fx.p0);
    free(fx.buf);
}

/* ---- fp16 gradients with an overflow */
static void test_overflow(void)
{
    const size_t n = 5000;
    struct mw_optim_format f = {MW_OPTIM_F16, MW_OPTIM_BF16, MW_OPTIM_F16};
    struct ost a, b;
    ost_init(&a, &f, n);
    ost_init(&b, &f, n);
    ost_fill(&a, 11, 100.0f);
    ((uint16_t *)a.grad)[3333] = 0x7c00;            /* +inf */
    ost_copy(&b, &a);
    struct mw_adamw_hp hp = mw_adamw_hp_default();
    hp.grad_scale = 1.0f / 1024;                    /* loss scale 1024 */
    struct mw_optim_exec ex = {2, MW_SIMD_AUTO, MW_OPTIM_CHECK_FINITE};
    struct mw_optim_slice sl = ost_slice(&a, 0, n);
    mw_error_clear();
    CHECK_EQ_INT(mw_adamw_step(&f, &hp, &sl, &ex), MW_EOVERFLOW);
    CHECK_MSG(strstr(mw_error_msg(), "3333") != NULL, "message names the index: %s", mw_error_msg());
    const char *what;
    long d = ost_diff(&a, &b, &what);
    CHECK_MSG(d < 0, "state changed by a skipped step: %s[%ld]", what, d);
    double sq;
    CHECK_EQ_INT(mw_grad_sumsq(f.grad, a.grad, n, hp.grad_scale, NULL, &sq), MW_EOVERFLOW);
    ((uint16_t *)a.grad)[3333] = 0xfe01;            /* NaN */
    ((uint16_t *)b.grad)[3333] = 0xfe01;
    CHECK_EQ_INT(mw_adamw_step(&f, &hp, &sl, &ex), MW_EOVERFLOW);
    d = ost_diff(&a, &b, &what);
    CHECK_MSG(d < 0, "state changed by a skipped step (NaN): %s[%ld]", what, d);
    /* the caller lowers the loss scale and retries with finite gradients: the step runs */
    ((uint16_t *)a.grad)[3333] = mw_f32_to_f16(60000.0f);
    CHECK_EQ_INT(mw_adamw_step(&f, &hp, &sl, &ex), 0);
    d = ost_diff(&a, &b, &what);
    CHECK_MSG(d >= 0, "a finite step changed nothing");
    for (size_t i = 0; i < n; i++)                  /* the fp16 weight copy is the updated master, RNE */
        if (((uint16_t *)a.w)[i] != mw_f32_to_f16(a.master[i])) { CHECK_MSG(0, "weights_out[%zu]", i); break; }
    /* SGD has the same check */
    ((uint16_t *)a.grad)[10] = 0xfc00;              /* -inf */
    struct mw_sgd_hp sh = {0.1, 0.9, 0.0, 0, 1.0f};
    ost_copy(&b, &a);
    CHECK_EQ_INT(mw_sgd_step(&f, &sh, &sl, &ex), MW_EOVERFLOW);
    d = ost_diff(&a, &b, &what);
    CHECK_MSG(d < 0, "SGD state changed by a skipped step: %s[%ld]", what, d);
    ost_free(&a);
    ost_free(&b);
}

/* ---- least squares: min 1/(2N) |A x - y|^2, A: N x D, y = A x* + noise */
#define LS_N 256
#define LS_D 64
static float ls_A[LS_N][LS_D], ls_y[LS_N];

static double ls_loss_grad(const float *x, float *g)
{
    double loss = 0;
    float r[LS_N];
    for (int i = 0; i < LS_N; i++) {
        float s = 0;
        for (int j = 0; j < LS_D; j++) s += ls_A[i][j] * x[j];
        r[i] = s - ls_y[i];
        loss += 0.5 * (double)r[i] * r[i] / LS_N;
    }
    if (g)
        for (int j = 0; j < LS_D; j++) {
            float s = 0;
            for (int i = 0; i < LS_N; i++) s += ls_A[i][j] * r[i];
            g[j] = s / LS_N;
        }
    return loss;
}

static double ls_run(enum mw_optim_dtype mom, int steps, double *loss0)
{
    struct mw_optim_format f = {MW_OPTIM_F32, mom, MW_OPTIM_NONE};
    struct ost s;
    ost_init(&s, &f, LS_D);                         /* zero x, zero moments */
    struct mw_adamw_hp hp = {0.02, 0.9, 0.999, 1e-8, 0.0, 0, 1.0f};
    struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
    *loss0 = ls_loss_grad(s.master, NULL);
    for (int t = 1; t <= steps; t++) {
        ls_loss_grad(s.master, s.grad);
        hp.step = t;
        struct mw_optim_slice sl = ost_slice(&s, 0, LS_D);
        REQUIRE(mw_adamw_step(&f, &hp, &sl, &ex) == 0);
    }
    double l = ls_loss_grad(s.master, NULL);
    ost_free(&s);
    return l;
}

static void test_least_squares(void)
{
    uint64_t r = 99;
    float xs[LS_D];
    for (int j = 0; j < LS_D; j++) xs[j] = 3.0f * tu_randf(&r);
    for (int i = 0; i < LS_N; i++) {
        float s = 0;
        for (int j = 0; j < LS_D; j++) { ls_A[i][j] = tu_randf(&r); s += ls_A[i][j] * xs[j]; }
        ls_y[i] = s + 0.1f * tu_randf(&r);
    }
    /* Tolerances: mid-way (200 steps, loss still falling fast) within 10 % of fp32 moments;
     * at 1500 steps (noise floor ~0.00113) within 1 %. */
    static const int steps[2] = {200, 1500};
    static const double tol[2] = {0.10, 0.01};
    for (int k = 0; k < 2; k++) {
        double l0, lf = ls_run(MW_OPTIM_F32, steps[k], &l0);
        double lb = ls_run(MW_OPTIM_BF16, steps[k], &l0);
        double lq = ls_run(MW_OPTIM_Q8, steps[k], &l0);
        double ls = ls_run(MW_OPTIM_BF16_SR, steps[k], &l0);
        printf("least squares (N=%d, D=%d, %d AdamW steps): loss %.6g -> fp32 moments %.6g, bf16 %.6g, "
               "bf16-sr %.6g, q8 %.6g\n", LS_N, LS_D, steps[k], l0, lf, lb, ls, lq);
        CHECK_MSG(fabs(ls - lf) <= tol[k] * lf, "bf16-sr moments: loss %g vs fp32 %g", ls, lf);
        CHECK_MSG(lf < 1e-2 * l0, "fp32 moments did not converge: %g of %g", lf, l0);
        CHECK_MSG(fabs(lb - lf) <= tol[k] * lf, "bf16 moments: loss %g vs fp32 %g", lb, lf);
        CHECK_MSG(fabs(lq - lf) <= tol[k] * lf, "8-bit moments: loss %g vs fp32 %g", lq, lf);
    }
}

/* ---- v decays with zero gradients: 1000 steps of beta2 = 0.999 leave 0.999^1000 = 0.368 of v.
 * fp32 does; bf16 with round-to-nearest cannot (0.999 v rounds back to v: stays 1.0); bf16-sr
 * does on average (mean over 4096 elements within 2 %); q8 does (block-relative codes). */
static void test_decay(void)
{
    const size_t n = 4096;
    const enum mw_optim_dtype mom[4] = {MW_OPTIM_F32, MW_OPTIM_BF16, MW_OPTIM_BF16_SR, MW_OPTIM_Q8};
    double mean[4];
    for (int k = 0; k < 4; k++) {
        struct mw_optim_format f = {MW_OPTIM_F32, mom[k], MW_OPTIM_NONE};
        struct ost s;
        ost_init(&s, &f, n);
        for (size_t i = 0; i < n; i++) ((float *)s.grad)[i] = 1.0f;
        struct mw_adamw_hp hp = mw_adamw_hp_default();
        struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
        struct mw_optim_slice sl = ost_slice(&s, 0, n);
        REQUIRE(mw_adamw_step(&f, &hp, &sl, &ex) == 0);          /* v = 0.001 */
        double v0 = 0;
        for (size_t i = 0; i < n; i++) v0 += f.moments == MW_OPTIM_Q8 ? 0.001 : ost_get(f.moments, s.v, i);
        v0 /= n;
        memset(s.grad, 0, 4 * n);
        for (int t = 2; t <= 1001; t++) { hp.step = t; REQUIRE(mw_adamw_step(&f, &hp, &sl, &ex) == 0); }
        double sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += f.moments == MW_OPTIM_Q8 ? (double)s.vs[i / MW_Q8_BLOCK] * (((uint8_t *)s.v)[i] == 248)
                                            : ost_get(f.moments, s.v, i);
        mean[k] = sum / n / v0;
        ost_free(&s);
    }
    printf("v after 1000 zero-gradient steps, relative to its start (exact 0.3677): fp32 %.4f, bf16 %.4f, "
           "bf16-sr %.4f, q8 %.4f\n", mean[0], mean[1], mean[2], mean[3]);
    CHECK(fabs(mean[0] - 0.36770) < 1e-3);
    CHECK(mean[1] == 1.0);                           /* the documented limitation of RNE */
    CHECK_MSG(fabs(mean[2] / mean[0] - 1) < 0.02, "bf16-sr mean %g vs fp32 %g", mean[2], mean[0]);
    CHECK_MSG(fabs(mean[3] / mean[0] - 1) < 0.01, "q8 %g vs fp32 %g", mean[3], mean[0]);
}

/* ---- SGD against hand-computed steps (torch.optim.SGD, dampening 0) */
static void test_sgd(void)
{
    struct mw_optim_format f = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_BF16};
    float p[1] = {1.0f}, g[1] = {0.5f}, buf[1] = {0};
    uint16_t w[1];
    struct mw_optim_slice sl = {.n = 1, .master = p, .grad = g, .m = buf, .weights_out = w};
    struct mw_sgd_hp hp = {0.1, 0.9, 0.0, 0, 1.0f};
    CHECK_EQ_INT(mw_sgd_step(&f, &hp, &sl, NULL), 0);  /* buf = 0.5, p = 1 - 0.05 */
    CHECK(buf[0] == 0.5f && p[0] == 1.0f - 0.1f * 0.5f && w[0] == mw_f32_to_bf16(p[0]));
    CHECK_EQ_INT(mw_sgd_step(&f, &hp, &sl, NULL), 0);  /* buf = 0.95 */
    CHECK(buf[0] == 0.9f * 0.5f + 0.5f && p[0] == 0.95f - 0.1f * (0.9f * 0.5f + 0.5f));
    hp.nesterov = 1; hp.momentum = 0.5f; hp.weight_decay = 0.25f;
    float p1 = p[0], gg = 0.5f + 0.25f * p1, b = 0.5f * buf[0] + gg;
    CHECK_EQ_INT(mw_sgd_step(&f, &hp, &sl, NULL), 0);
    float bm = 0.5f * b;
    float d = gg + bm, step = 0.1f * d;
    CHECK_MSG(p[0] == p1 - step && buf[0] == b, "nesterov: p %.9g want %.9g", p[0], p1 - step);
    f.moments = MW_OPTIM_Q8;
    CHECK_EQ_INT(mw_sgd_step(&f, &hp, &sl, NULL), -ENOTSUP);
}

static void test_api(void)
{
    struct mw_optim_footprint fp;
    struct mw_optim_format f32 = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE};
    struct mw_optim_format lean = {MW_OPTIM_BF16, MW_OPTIM_BF16, MW_OPTIM_BF16};
    struct mw_optim_format q8 = {MW_OPTIM_BF16, MW_OPTIM_Q8, MW_OPTIM_NONE};
    CHECK_EQ_INT(mw_optim_footprint(&f32, 2, &fp), 0);
    CHECK(fp.state == 12 && fp.read == 16 && fp.written == 12);
    CHECK_EQ_INT(mw_optim_footprint(&lean, 2, &fp), 0);
    CHECK(fp.state == 8 && fp.read == 10 && fp.written == 10);
    CHECK_EQ_INT(mw_optim_footprint(&q8, 2, &fp), 0);
    CHECK(fabs(fp.moment - (1 + 4.0 / 256)) < 1e-12 && fabs(fp.state - (4 + 2 * (1 + 4.0 / 256))) < 1e-12);
    CHECK_EQ_INT(mw_optim_scale_bytes(MW_OPTIM_Q8, 257), 8);
    CHECK_EQ_INT(mw_optim_array_bytes(MW_OPTIM_BF16, 10), 20);
    float p = 1, g = 1, m = 0, v = 0;
    struct mw_optim_slice sl = {.n = 1, .master = &p, .grad = &g, .m = &m, .v = &v};
    struct mw_adamw_hp hp = mw_adamw_hp_default();
    hp.step = 0;
    CHECK_EQ_INT(mw_adamw_step(&f32, &hp, &sl, NULL), -EINVAL);
    hp.step = 1; hp.grad_scale = 0;
    CHECK_EQ_INT(mw_adamw_step(&f32, &hp, &sl, NULL), -EINVAL);
    hp.grad_scale = 1;
    struct mw_optim_format bad = {MW_OPTIM_Q8, MW_OPTIM_F32, MW_OPTIM_NONE};
    CHECK_EQ_INT(mw_adamw_step(&bad, &hp, &sl, NULL), -EINVAL);
    struct mw_optim_format wants_w = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_F16};
    CHECK_EQ_INT(mw_adamw_step(&wants_w, &hp, &sl, NULL), -EINVAL);
    struct mw_optim_exec ex = {-1, MW_SIMD_AUTO, 0};
    CHECK_EQ_INT(mw_adamw_step(&f32, &hp, &sl, &ex), -EINVAL);
    /* first step from zero state: m = 0.1, v = 0.001, p = 1*(1-1e-5) - 1e-3 * 1/(1+1e-8) */
    CHECK_EQ_INT(mw_adamw_step(&f32, &hp, &sl, NULL), 0);
    CHECK(fabsf(p - (1.0f - 1e-5f - 1e-3f)) < 1e-7f && fabsf(m - 0.1f) < 1e-8f && fabsf(v - 0.001f) < 1e-9f);
    struct mw_optim_slice empty = {0};
    CHECK_EQ_INT(mw_adamw_step(&f32, &hp, &empty, NULL), 0);
    CHECK(!strcmp(mw_simd_name(MW_SIMD_AVX512), "avx512") && mw_simd_supported(MW_SIMD_SCALAR));
}

int main(void)
{
    test_fixture("adamw_default.bin");
    test_fixture("adamw_fast.bin");
    test_overflow();
    test_least_squares();
    test_decay();
    test_sgd();
    test_api();
    TEST_END();
}
