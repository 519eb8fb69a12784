/*
 * optim.c — the public step functions: check arguments, compute the per-step constants once
 * (in double, rounded to float once, so every variant and thread sees the same floats), pick
 * the kernel table, and split the slice over threads. Why contiguous runs of tiles per
 * thread: each thread then streams through memory sequentially (the prefetchers see one
 * stream per array), tiles keep Q8 blocks whole, and no element depends on the split.
 */
#include "optim/optim_internal.h"
#include "memwall/common.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

static const struct mw_optim_exec g_exec_default = {0, MW_SIMD_AUTO, 0};

const char *mw_optim_dtype_name(enum mw_optim_dtype dt)
{
    switch (dt) {
    case MW_OPTIM_NONE: return "none";
    case MW_OPTIM_F32: return "fp32";
    case MW_OPTIM_BF16: return "bf16";
    case MW_OPTIM_F16: return "fp16";
    case MW_OPTIM_Q8: return "q8";
    case MW_OPTIM_BF16_SR: return "bf16-sr";
    }
    return "?";
}

size_t mw_optim_array_bytes(enum mw_optim_dtype dt, size_t n)
{
    switch (dt) {
    case MW_OPTIM_F32: return 4 * n;
    case MW_OPTIM_BF16: case MW_OPTIM_F16: case MW_OPTIM_BF16_SR: return 2 * n;
    case MW_OPTIM_Q8: return n;
    default: return 0;
    }
}

size_t mw_optim_scale_bytes(enum mw_optim_dtype dt, size_t n)
{
    return dt == MW_OPTIM_Q8 ? 4 * ((n + MW_Q8_BLOCK - 1) / MW_Q8_BLOCK) : 0;
}

static int check_format(const struct mw_optim_format *f, int q8_ok)
{
    if (!f) return mw_error_set(-EINVAL, "optim: no format given");
    if (f->grad != MW_OPTIM_F32 && f->grad != MW_OPTIM_BF16 && f->grad != MW_OPTIM_F16)
        return mw_error_set(-EINVAL, "optim: gradients must be fp32, bf16 or fp16 (got %s)",
                            mw_optim_dtype_name(f->grad));
    if (f->moments != MW_OPTIM_F32 && f->moments != MW_OPTIM_BF16 && f->moments != MW_OPTIM_Q8 &&
        f->moments != MW_OPTIM_BF16_SR)
        return mw_error_set(-EINVAL, "optim: moments must be fp32, bf16, bf16-sr or q8 (got %s)",
                            mw_optim_dtype_name(f->moments));
    if ((f->moments == MW_OPTIM_Q8 || f->moments == MW_OPTIM_BF16_SR) && !q8_ok)
        return mw_error_set(-ENOTSUP, "optim: %s moments are supported by AdamW only", mw_optim_dtype_name(f->moments));
    if (f->weights_out != MW_OPTIM_NONE && f->weights_out != MW_OPTIM_BF16 && f->weights_out != MW_OPTIM_F16)
        return mw_error_set(-EINVAL, "optim: the weight copy must be none, bf16 or fp16 (got %s)",
                            mw_optim_dtype_name(f->weights_out));
    return 0;
}

int mw_optim_footprint(const struct mw_optim_format *fmt, int nmoments, struct mw_optim_footprint *o)
{
    int r = check_format(fmt, 1);
    if (r) return r;
    if (nmoments < 0 || nmoments > 2 || !o) return mw_error_set(-EINVAL, "optim: nmoments must be 0, 1 or 2");
    o->master = 4;
    o->grad = (double)mw_optim_array_bytes(fmt->grad, 1);
    o->moment = fmt->moments == MW_OPTIM_Q8 ? 1.0 + 4.0 / MW_Q8_BLOCK : (double)mw_optim_array_bytes(fmt->moments, 1);
    o->weights_out = (double)mw_optim_array_bytes(fmt->weights_out, 1);
    o->state = o->master + nmoments * o->moment;
    o->read = o->master + o->grad + nmoments * o->moment;
    o->written = o->master + nmoments * o->moment + o->weights_out;
    return 0;
}

struct mw_adamw_hp mw_adamw_hp_default(void)
{
    struct mw_adamw_hp h = {1e-3, 0.9, 0.999, 1e-8, 1e-2, 1, 1.0f};
    return h;
}

static int check_slice(const struct mw_optim_format *f, const struct mw_optim_slice *s, int need_m, int need_v)
{
    if (!s) return mw_error_set(-EINVAL, "optim: no slice given");
    if (s->n == 0) return 0;
    if (!s->master || !s->grad) return mw_error_set(-EINVAL, "optim: slice has no master or grad array");
    if ((need_m && !s->m) || (need_v && !s->v))
        return mw_error_set(-EINVAL, "optim: slice lacks a moment array");
    if (f->weights_out != MW_OPTIM_NONE && !s->weights_out)
        return mw_error_set(-EINVAL, "optim: format asks for a %s weight copy but weights_out is NULL",
                            mw_optim_dtype_name(f->weights_out));
    if (f->moments == MW_OPTIM_Q8) {
        if ((need_m && !s->m_scale) || (need_v && !s->v_scale))
            return mw_error_set(-EINVAL, "optim: 8-bit moments need m_scale and v_scale arrays");
        if (s->offset % MW_Q8_BLOCK)
            return mw_error_set(-EINVAL, "optim: 8-bit moments: slice offset %zu is not a multiple of the "
                                "block size %d", s->offset, MW_Q8_BLOCK);
    }
    return 0;
}

static int resolve(const struct mw_optim_exec **ex, const struct mw_optim_kernels **kt)
{
    if (!*ex) *ex = &g_exec_default;
    if ((*ex)->nthreads < 0) return mw_error_set(-EINVAL, "optim: nthreads %d < 0", (*ex)->nthreads);
    *kt = mw_optim_kernels_for((*ex)->simd);
    if (!*kt) return mw_error_set(-ENOTSUP, "optim: this CPU cannot run the %s kernels", mw_simd_name((*ex)->simd));
    return 0;
}

/* Runs fn over [0, n), each thread a contiguous run of whole tiles. */
static void run_tiles(mw_range_fn fn, const struct mw_kargs *k, size_t n, int nthreads)
{
    size_t ntiles = (n + MW_OPTIM_TILE - 1) / MW_OPTIM_TILE;
    int t = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (t <= 1 || ntiles <= 1) { fn(k, 0, n); return; }
    if ((size_t)t > ntiles) t = (int)ntiles;
#pragma omp parallel num_threads(t)
    {
        size_t me = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        size_t b = ntiles * me / nt * MW_OPTIM_TILE, e = ntiles * (me + 1) / nt * MW_OPTIM_TILE;
        if (e > n) e = n;
        if (b < e) fn(k, b, e);
    }
}

static int sumsq_with(const struct mw_optim_kernels *kt, enum mw_optim_dtype dt, const void *g, size_t n,
                      float scale, int nthreads, double *out)
{
    size_t ntiles = (n + MW_OPTIM_TILE - 1) / MW_OPTIM_TILE;
    double one, *part = ntiles <= 1 ? &one : malloc(ntiles * sizeof *part);
    if (!part) return mw_error_set(-ENOMEM, "optim: no memory for %zu partial sums", ntiles);
    int t = nthreads > 0 ? nthreads : omp_get_max_threads();
    if (t <= 1 || ntiles <= 1) {
        for (size_t i = 0; i < ntiles; i++)
            part[i] = kt->sumsq(dt, g, i * MW_OPTIM_TILE, MW_MIN_SZ(n, (i + 1) * MW_OPTIM_TILE), scale);
    } else {
        if ((size_t)t > ntiles) t = (int)ntiles;
#pragma omp parallel for schedule(static) num_threads(t)
        for (size_t i = 0; i < ntiles; i++)
            part[i] = kt->sumsq(dt, g, i * MW_OPTIM_TILE, MW_MIN_SZ(n, (i + 1) * MW_OPTIM_TILE), scale);
    }
    double s = 0.0;
    for (size_t i = 0; i < ntiles; i++) s += part[i];
    if (part != &one) free(part);
    *out = s;
    return isfinite(s) ? 0 : MW_EOVERFLOW;
}

/* After an overflow: find the first bad index for the message (the rare path, scalar). */
static int overflow_error(enum mw_optim_dtype dt, const void *g, size_t n, float scale, double s)
{
    for (size_t i = 0; i < n; i++) {
        float x = dt == MW_OPTIM_F32 ? ((const float *)g)[i]
                : dt == MW_OPTIM_BF16 ? mw_bf16_f32(((const uint16_t *)g)[i]) : mw_f16_f32(((const uint16_t *)g)[i]);
        float y = x * scale;
        float yy = y * y;
        if (!isfinite(yy))
            return mw_error_set(MW_EOVERFLOW, "optim: gradient %zu is %g (scaled: %g): inf/NaN or its square "
                                "overflows fp32; step skipped", i, (double)x, (double)y);
    }
    return mw_error_set(MW_EOVERFLOW, "optim: sum of squared gradients overflows (%g); step skipped", s);
}

int mw_grad_sumsq(enum mw_optim_dtype dt, const void *grad, size_t n, float scale,
                  const struct mw_optim_exec *ex, double *sumsq)
{
    const struct mw_optim_kernels *kt;
    int r = resolve(&ex, &kt);
    if (r) return r;
    if (dt != MW_OPTIM_F32 && dt != MW_OPTIM_BF16 && dt != MW_OPTIM_F16)
        return mw_error_set(-EINVAL, "optim: gradients must be fp32, bf16 or fp16");
    if (!sumsq || (n && !grad)) return mw_error_set(-EINVAL, "optim: sumsq: NULL argument");
    r = sumsq_with(kt, dt, grad, n, scale, ex->nthreads, sumsq);
    if (r == MW_EOVERFLOW) return overflow_error(dt, grad, n, scale, *sumsq);
    return r;
}

static int check_finite(const struct mw_optim_kernels *kt, const struct mw_optim_format *f,
                        const struct mw_optim_slice *s, float scale, int nthreads)
{
    double sq;
    int r = sumsq_with(kt, f->grad, s->grad, s->n, scale, nthreads, &sq);
    if (r == MW_EOVERFLOW) return overflow_error(f->grad, s->grad, s->n, scale, sq);
    return r;
}

static int scale_ok(float sc)
{
    return isfinite(sc) && sc > 0.0f;
}

int mw_adamw_prepare(const struct mw_optim_format *fmt, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
                     struct mw_kargs *k)
{
    int r = check_format(fmt, 1);
    if (!r) r = check_slice(fmt, s, 1, 1);
    if (r) return r;
    if (!hp) return mw_error_set(-EINVAL, "adamw: no hyper-parameters");
    if (hp->step < 1) return mw_error_set(-EINVAL, "adamw: step %lld < 1", (long long)hp->step);
    if (!(hp->beta1 >= 0.0 && hp->beta1 < 1.0 && hp->beta2 >= 0.0 && hp->beta2 < 1.0))
        return mw_error_set(-EINVAL, "adamw: betas (%g, %g) must lie in [0, 1)", hp->beta1, hp->beta2);
    if (!scale_ok(hp->grad_scale) || !isfinite(hp->lr) || !isfinite(hp->eps) || !isfinite(hp->weight_decay))
        return mw_error_set(-EINVAL, "adamw: grad_scale must be > 0 and lr/eps/weight_decay finite");
    memset(k, 0, sizeof *k);
    k->fmt = *fmt;
    k->s = *s;
    double t = (double)hp->step, b1 = hp->beta1, b2 = hp->beta2;
    k->a.gscale = hp->grad_scale;
    k->a.b1 = (float)b1;
    k->a.c1 = (float)(1.0 - b1);
    k->a.b2 = (float)b2;
    k->a.c2 = (float)(1.0 - b2);
    k->a.decay = (float)(1.0 - hp->lr * hp->weight_decay);
    k->a.step_size = (float)(hp->lr / (1.0 - pow(b1, t)));
    k->a.isb2 = (float)(1.0 / sqrt(1.0 - pow(b2, t)));
    k->a.eps = (float)hp->eps;
    k->off32 = (uint32_t)s->offset;
    k->seed = mw_sr_hash((uint32_t)hp->step, 0x6d0f27bdu);
    return 0;
}

int mw_adamw_step(const struct mw_optim_format *fmt, const struct mw_adamw_hp *hp,
                  const struct mw_optim_slice *s, const struct mw_optim_exec *ex)
{
    const struct mw_optim_kernels *kt;
    int r = check_format(fmt, 1);
    if (!r) r = resolve(&ex, &kt);
    struct mw_kargs k;
    if (!r) r = mw_adamw_prepare(fmt, hp, s, &k);
    if (r || s->n == 0) return r;
    if (ex->flags & MW_OPTIM_CHECK_FINITE) {
        r = check_finite(kt, fmt, s, hp->grad_scale, ex->nthreads);
        if (r) return r;
    }
    run_tiles(kt->adamw, &k, s->n, ex->nthreads);
    return 0;
}

int mw_sgd_step(const struct mw_optim_format *fmt, const struct mw_sgd_hp *hp,
                const struct mw_optim_slice *s, const struct mw_optim_exec *ex)
{
    const struct mw_optim_kernels *kt;
    int r = check_format(fmt, 0);
    if (!r) r = resolve(&ex, &kt);
    if (r) return r;
    if (!hp) return mw_error_set(-EINVAL, "sgd: no hyper-parameters");
    if (!(hp->momentum >= 0.0 && hp->momentum < 1.0) || !scale_ok(hp->grad_scale) || !isfinite(hp->lr) ||
        !isfinite(hp->weight_decay) || (hp->nesterov != 0 && hp->nesterov != 1))
        return mw_error_set(-EINVAL, "sgd: momentum must lie in [0, 1), grad_scale > 0, nesterov 0 or 1");
    r = check_slice(fmt, s, hp->momentum != 0.0, 0);
    if (r || s->n == 0) return r;
    if (ex->flags & MW_OPTIM_CHECK_FINITE) {
        r = check_finite(kt, fmt, s, hp->grad_scale, ex->nthreads);
        if (r) return r;
    }
    struct mw_kargs k;
    memset(&k, 0, sizeof k);
    k.fmt = *fmt;
    k.s = *s;
    k.sg.gscale = hp->grad_scale;
    k.sg.lr = (float)hp->lr;
    k.sg.momentum = (float)hp->momentum;
    k.sg.wd = (float)hp->weight_decay;
    k.sg.nesterov = hp->nesterov;
    k.sg.use_buf = hp->momentum != 0.0;
    run_tiles(kt->sgd, &k, s->n, ex->nthreads);
    return 0;
}

int mw_optim_bandwidth_pass(const struct mw_optim_format *fmt, const struct mw_optim_slice *s,
                            const struct mw_optim_exec *ex)
{
    const struct mw_optim_kernels *kt;
    int r = check_format(fmt, 1);
    if (!r) r = resolve(&ex, &kt);
    if (!r) r = check_slice(fmt, s, 1, 1);
    if (r || s->n == 0) return r;
    struct mw_kargs k;
    memset(&k, 0, sizeof k);
    k.fmt = *fmt;
    k.s = *s;
    run_tiles(kt->touch, &k, s->n, ex->nthreads);
    return 0;
}

/* ---------------------------------------------------------------- conversions */

uint16_t mw_f32_to_bf16(float x) { return mw_bf16_rne(x); }
float mw_bf16_to_f32(uint16_t h) { return mw_bf16_f32(h); }
uint16_t mw_f32_to_f16(float x) { return mw_f16_rne(x); }
float mw_f16_to_f32(uint16_t h) { return mw_f16_f32(h); }

void mw_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n) { mw_optim_kernels_for(MW_SIMD_AUTO)->f32_to_bf16(src, dst, n); }
void mw_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n) { mw_optim_kernels_for(MW_SIMD_AUTO)->bf16_to_f32(src, dst, n); }
void mw_f32_to_f16_n(const float *src, uint16_t *dst, size_t n) { mw_optim_kernels_for(MW_SIMD_AUTO)->f32_to_f16(src, dst, n); }
void mw_f16_to_f32_n(const uint16_t *src, float *dst, size_t n) { mw_optim_kernels_for(MW_SIMD_AUTO)->f16_to_f32(src, dst, n); }
