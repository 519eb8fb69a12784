/*
 * cmd_bench_adam.c — `memwall bench adam`: parameters/s and effective GB/s of the AdamW
 * step for each state format, and, in the same run and on the same buffers, the in-place
 * bandwidth pass that moves exactly the same bytes without arithmetic (the physical limit),
 * with the ratio of the two. Why interleave: the machine may be shared and noisy, so each
 * repetition times the step and the limit back to back and the medians are compared.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/common.h"
#include "memwall/optim.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bench_fmt {
    const char *name;
    struct mw_optim_format f;
};

static const struct bench_fmt FORMATS[] = {
    {"fp32", {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE}},
    {"bf16-grad", {MW_OPTIM_BF16, MW_OPTIM_F32, MW_OPTIM_NONE}},
    {"fp16-grad", {MW_OPTIM_F16, MW_OPTIM_F32, MW_OPTIM_NONE}},
    {"bf16-moments", {MW_OPTIM_BF16, MW_OPTIM_BF16, MW_OPTIM_NONE}},
    {"fp32-grad-bf16-moments", {MW_OPTIM_F32, MW_OPTIM_BF16, MW_OPTIM_NONE}},
    {"bf16-moments+bf16-weights", {MW_OPTIM_BF16, MW_OPTIM_BF16, MW_OPTIM_BF16}},
    {"bf16-sr-moments", {MW_OPTIM_BF16, MW_OPTIM_BF16_SR, MW_OPTIM_NONE}},
    {"8bit", {MW_OPTIM_BF16, MW_OPTIM_Q8, MW_OPTIM_NONE}},
};
#define NFORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

struct bench_result {
    const char *format;
    int threads;
    double bytes_per_param;
    double step_s, limit_s;  /* medians, seconds per step over n parameters */
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *alloc_fill(size_t bytes, int kind, uint64_t seed)
{
    void *p = aligned_alloc(64, MW_ALIGN_UP(bytes ? bytes : 64, 64));
    if (!p) return NULL;
    /* kind 0: fp32 values in [-1, 1); 1: 16-bit (bf16/fp16 of small values); 2: bytes */
    uint64_t s = seed | 1;
    if (kind == 0) {
        float *f = p;
        for (size_t i = 0; i < bytes / 4; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; f[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 23); }
    } else if (kind == 1) {
        uint16_t *h = p;
        for (size_t i = 0; i < bytes / 2; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; h[i] = (uint16_t)(0x3000 + (s >> 52)); }
    } else {
        memset(p, 0, bytes);
    }
    return p;
}

static int run_one(const struct bench_fmt *bf, size_t n, int threads, enum mw_simd simd, int reps,
                   struct bench_result *out)
{
    const struct mw_optim_format *f = &bf->f;
    int r = -ENOMEM;
    double *ts = calloc((size_t)reps, sizeof *ts), *tl = calloc((size_t)reps, sizeof *tl);
    float *master = alloc_fill(4 * n, 0, 1);
    void *grad = alloc_fill(mw_optim_array_bytes(f->grad, n), f->grad == MW_OPTIM_F32 ? 0 : 1, 2);
    /* moments start at zero bytes (0.0 in every format); scales too */
    void *m = alloc_fill(mw_optim_array_bytes(f->moments, n), 2, 0);
    void *v = alloc_fill(mw_optim_array_bytes(f->moments, n), 2, 0);
    float *ms = alloc_fill(mw_optim_scale_bytes(f->moments, n), 2, 0);
    float *vs = alloc_fill(mw_optim_scale_bytes(f->moments, n), 2, 0);
    void *w = alloc_fill(mw_optim_array_bytes(f->weights_out, n), 2, 0);
    if (!ts || !tl || !master || !grad || !m || !v || !ms || !vs || !w) {
        mw_error_set(-ENOMEM, "bench adam: cannot allocate the %s state for %zu parameters", bf->name, n);
        goto err;
    }
    struct mw_optim_slice s = {.n = n, .master = master, .grad = grad, .m = m, .v = v,
                               .m_scale = ms, .v_scale = vs,
                               .weights_out = f->weights_out != MW_OPTIM_NONE ? w : NULL};
    struct mw_optim_exec ex = {threads, simd, 0};
    struct mw_adamw_hp hp = mw_adamw_hp_default();
    /* warm-up: one of each (page faults, frequency) */
    if ((r = mw_adamw_step(f, &hp, &s, &ex)) || (r = mw_optim_bandwidth_pass(f, &s, &ex))) goto err;
    for (int i = 0; i < reps; i++) {
        hp.step = 2 + i;
        uint64_t t0 = mw_now_ns();
        if ((r = mw_adamw_step(f, &hp, &s, &ex))) goto err;
        uint64_t t1 = mw_now_ns();
        if ((r = mw_optim_bandwidth_pass(f, &s, &ex))) goto err;
        uint64_t t2 = mw_now_ns();
        ts[i] = (double)(t1 - t0) * 1e-9;
        tl[i] = (double)(t2 - t1) * 1e-9;
    }
    struct mw_optim_footprint fp;
    if ((r = mw_optim_footprint(f, 2, &fp))) goto err;
    out->format = bf->name;
    out->threads = threads;
    out->bytes_per_param = fp.read + fp.written;
    out->step_s = median(ts, reps);
    out->limit_s = median(tl, reps);
    r = 0;
err:
    free(ts); free(tl); free(master); free(grad); free(m); free(v); free(ms); free(vs); free(w);
    return r;
}

int mw_cmd_bench_adam(int argc, char **argv)
{
    int64_t n = 1 << 24, threads = 0, reps = 7;
    int json = 0;
    const char *simd_s = "auto", *only = "all";
    static const char *const simd_choices[] = {"auto", "scalar", "avx2", "avx512", NULL};
    static const char *const fmt_choices[] = {"all", "fp32", "bf16-grad", "fp16-grad", "bf16-moments", "fp32-grad-bf16-moments",
                                              "bf16-moments+bf16-weights", "bf16-sr-moments", "8bit", NULL};
    const struct mw_opt opts[] = {
        {"n", MW_OPT_INT, &n, "N", "parameters per step (should be well above the L3 cache)", 1, 1e10, NULL},
        {"threads", MW_OPT_INT, &threads, "T", "OpenMP threads; 0 = 1, 2, 4, ... and all cores", 0, 1024, NULL},
        {"reps", MW_OPT_INT, &reps, "R", "timed repetitions per format (medians are reported)", 1, 1000, NULL},
        {"format", MW_OPT_CHOICE, &only, NULL, "state format to measure", 0, 0, fmt_choices},
        {"simd", MW_OPT_CHOICE, &simd_s, NULL, "kernel variant (auto: CPUID, or MEMWALL_SIMD)", 0, 0, simd_choices},
        {"json", MW_OPT_FLAG, &json, NULL, "print a JSON list of result objects instead of the table", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {
        "bench adam", "",
        "Measures the AdamW step (parameters/s, GB/s moved) for each state format and, in the same run\n"
        "on the same buffers, an in-place pass that moves the same bytes without arithmetic (the\n"
        "memory-bandwidth limit); ratio = limit time / step time (1.0 = at the limit).",
        opts, MW_NOPTS(opts), 0, 0};
    int pr = mw_opts_parse(&spec, argc, argv, NULL, NULL);
    if (pr == MW_OPTS_HELP) return 0;
    if (pr) return 2;
    enum mw_simd simd = !strcmp(simd_s, "scalar") ? MW_SIMD_SCALAR : !strcmp(simd_s, "avx2") ? MW_SIMD_AVX2
                      : !strcmp(simd_s, "avx512") ? MW_SIMD_AVX512 : MW_SIMD_AUTO;
    if (!mw_simd_supported(simd)) {
        fprintf(stderr, "memwall bench adam: this CPU cannot run the %s kernels (best: %s)\n", simd_s,
                mw_simd_name(mw_simd_detect()));
        return 1;
    }
    int tl[64], nt = 0, maxt = omp_get_max_threads();
    if (threads > 0) tl[nt++] = (int)threads;
    else for (int t = 1; t <= maxt && nt < 64; t = t < maxt && t * 2 > maxt ? maxt : t * 2) { tl[nt++] = t; if (t == maxt) break; }
    struct bench_result res[64 * NFORMATS];
    int nres = 0;
    const char *kernel = mw_simd_name(simd == MW_SIMD_AUTO ? mw_simd_active() : simd);
    char b1[32];
    if (!json)
        printf("bench adam: %lld parameters, %s kernels%s, median of %lld repetitions; limit = in-place pass over the same bytes\n"
               "%-27s %7s %8s %12s %10s %10s %7s\n", (long long)n, kernel,
               mw_simd_has_avx512bf16() && !strcmp(kernel, "avx512") ? " (+AVX512-BF16)" : "", (long long)reps,
               "format", "threads", "B/param", "Mparams/s", "step GB/s", "limit GB/s", "ratio");
    for (int ti = 0; ti < nt; ti++)
        for (int fi = 0; fi < NFORMATS; fi++) {
            if (strcmp(only, "all") && strcmp(only, FORMATS[fi].name)) continue;
            struct bench_result *x = &res[nres];
            int r = run_one(&FORMATS[fi], (size_t)n, tl[ti], simd, (int)reps, x);
            if (r) { mw_cli_fail("bench adam", r); return 1; }
            nres++;
            if (!json) {
                double bytes = x->bytes_per_param * (double)n;
                printf("%-27s %7d %8.2f %12.1f %10s", x->format, x->threads, x->bytes_per_param,
                       (double)n / x->step_s / 1e6, mw_fmt_rate(b1, sizeof b1, bytes / x->step_s));
                printf(" %10s %7.3f\n", mw_fmt_rate(b1, sizeof b1, bytes / x->limit_s), x->limit_s / x->step_s);
                fflush(stdout);
            }
        }
    if (json) {
        printf("[");
        for (int i = 0; i < nres; i++) {
            struct bench_result *x = &res[i];
            double bytes = x->bytes_per_param * (double)n;
            printf("%s\n  {\"format\": \"%s\", \"threads\": %d, \"simd\": \"%s\", \"n\": %lld, \"bytes_per_param\": %.4f, "
                   "\"params_per_s\": %.6g, \"bytes_per_s\": %.6g, \"limit_bytes_per_s\": %.6g, \"ratio\": %.4f, "
                   "\"step_s\": %.6g, \"limit_s\": %.6g, \"reps\": %lld}",
                   i ? "," : "", x->format, x->threads, kernel, (long long)n, x->bytes_per_param,
                   (double)n / x->step_s, bytes / x->step_s, bytes / x->limit_s, x->limit_s / x->step_s,
                   x->step_s, x->limit_s, (long long)reps);
        }
        printf("\n]\n");
    }
    return 0;
}
