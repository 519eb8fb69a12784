/*
 * memwall/optim.h — optimizer step kernels over one slice of the flat parameter space.
 *
 * Why this shape: in an offloaded run the optimizer step runs on the host CPU, one subgroup
 * at a time, from several engine threads at once, and it is memory-bound (AdamW reads p, g,
 * m, v and writes p, m, v). So the API is a stateless, reentrant step over a SLICE of raw
 * arrays: the caller owns every buffer, picks the storage format of each array, and picks
 * the thread count (1 = run on the calling thread, no OpenMP inside). Formats that store
 * fewer bytes per parameter (bf16 or 8-bit moments, bf16/fp16 gradients) cut DRAM traffic
 * and NVMe I/O; the low-precision weight copy for the compute device is written in the same
 * pass so the weights are not read a second time.
 *
 * Kernels: a scalar reference for every format, plus AVX2+FMA+F16C and AVX-512 variants
 * chosen at run time from CPUID (MEMWALL_SIMD=scalar|avx2|avx512 forces one). Every variant
 * performs the same IEEE operations in the same order (no FMA contraction, no approximate
 * reciprocals), so all variants give BITWISE identical results, and results do not depend
 * on the thread count or on how a tensor is cut into slices (see MW_Q8_BLOCK for the one
 * rule that 8-bit moments add). docs/optim.md has the exact math.
 *
 * Errors: 0, -EINVAL (bad arguments, message in mw_error_msg()), -ENOTSUP (an explicitly
 * requested SIMD level the CPU lacks, or a format the optimizer does not support), or
 * MW_EOVERFLOW (MW_OPTIM_CHECK_FINITE found inf/NaN: NOTHING was written).
 */
#ifndef MEMWALL_OPTIM_H
#define MEMWALL_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- formats */

/* Storage format of one array. Which formats each array accepts:
 *   master weights: F32 only (the slice's `master`);
 *   gradients:      F32, BF16, F16;
 *   moments:        F32, BF16 (round to nearest even), BF16_SR (AdamW only: bf16 with
 *                   reproducible stochastic rounding), Q8 (8-bit block-wise, AdamW only);
 *   weight copy:    NONE, BF16, F16 (round to nearest even).
 * Why BF16_SR: with round-to-nearest a bf16 v cannot decay when beta2 > 1 - 2^-9 (0.998):
 * 0.999*v rounds back to v, so v only ever grows (docs/optim.md). BF16_SR rounds up with
 * probability equal to the dropped fraction, using a 32-bit hash of (element index mod
 * 2^32, step) whose low 16 bits round m and high 16 bits round v: unbiased, yet bitwise
 * reproducible on any thread count and any slice split, provided every slice's `offset`
 * is its true index in the tensor. */
enum mw_optim_dtype {
    MW_OPTIM_NONE = 0,
    MW_OPTIM_F32  = 1,
    MW_OPTIM_BF16 = 2,
    MW_OPTIM_F16  = 3,
    MW_OPTIM_Q8   = 4,
    MW_OPTIM_BF16_SR = 5,
};

/* 8-bit block-wise moments: every MW_Q8_BLOCK consecutive elements share one fp32 scale
 * (the block's absolute maximum). Blocks start at the SLICE START. Consequence for callers
 * that cut one tensor into several slices (subgroups, per-thread chunks): the result is
 * bitwise the same as one call over the whole tensor iff every slice starts at a multiple
 * of MW_Q8_BLOCK of the whole tensor. The slice's `offset` field states where it starts and
 * Q8 steps reject (-EINVAL) an offset that is not such a multiple. Other formats have no
 * cross-element coupling: any cut gives bitwise the same result. */
#define MW_Q8_BLOCK 256

/* Tile of elements one OpenMP thread processes at a time (a multiple of MW_Q8_BLOCK,
 * ~450 KiB of fp32 AdamW state: fits L2). Threads take contiguous runs of tiles. */
#define MW_OPTIM_TILE 16384

struct mw_optim_format {
    enum mw_optim_dtype grad;        /* F32 | BF16 | F16 */
    enum mw_optim_dtype moments;     /* F32 | BF16 | BF16_SR | Q8 (m and v both; SGD: the momentum buffer, F32 | BF16) */
    enum mw_optim_dtype weights_out; /* NONE | BF16 | F16 */
};

/* Bytes per parameter of a format (Q8 includes the amortized 4-byte scale per block). */
struct mw_optim_footprint {
    double master;      /* 4 */
    double grad;        /* 4, 2 */
    double moment;      /* one moment array: 4, 2 (BF16, BF16_SR) or 1 + 4/MW_Q8_BLOCK */
    double weights_out; /* 0, 2 */
    double state;       /* what persists between steps: master + nmoments * moment */
    double read;        /* bytes one step reads: master + grad + moments */
    double written;     /* bytes one step writes: master + moments + weights_out */
};
/* nmoments: 2 for AdamW, 1 for SGD with momentum, 0 for plain SGD. Returns 0 or -EINVAL. */
int mw_optim_footprint(const struct mw_optim_format *fmt, int nmoments, struct mw_optim_footprint *out);

/* Bytes of one array of n elements in a format (Q8: the n code bytes only), and of the Q8
 * scale array (ceil(n / MW_Q8_BLOCK) floats; 0 for other formats). NONE: 0. */
size_t mw_optim_array_bytes(enum mw_optim_dtype dt, size_t n);
size_t mw_optim_scale_bytes(enum mw_optim_dtype dt, size_t n);
const char *mw_optim_dtype_name(enum mw_optim_dtype dt); /* "fp32", "bf16", "fp16", "q8", "bf16-sr", "none" */

/* ---------------------------------------------------------------- one slice */

/* The arrays of one slice of n parameters. All pointers are caller-owned; any alignment
 * works (64-byte alignment is faster). Arrays must not overlap one another. */
struct mw_optim_slice {
    size_t n;             /* number of parameters in the slice */
    size_t offset;        /* index of element 0 within the whole tensor/flat space: checked
                             for Q8 (multiple of MW_Q8_BLOCK), seeds BF16_SR rounding;
                             other formats ignore it */
    float *master;        /* [n] fp32 master weights, updated in place */
    const void *grad;     /* [n] gradients in fmt->grad; read only */
    void *m;              /* [n] first moment (AdamW) / momentum buffer (SGD), fmt->moments */
    void *v;              /* [n] second moment (AdamW only; SGD: ignored) */
    float *m_scale;       /* Q8 only: [ceil(n/MW_Q8_BLOCK)] absmax of each block of m */
    float *v_scale;       /* Q8 only: [ceil(n/MW_Q8_BLOCK)] absmax of each block of v */
    void *weights_out;    /* [n] low-precision copy of the UPDATED master, fmt->weights_out; NULL if NONE */
};
/* Fresh state: m, v (and Q8 scales) all zero bytes — that is 0.0 in every format. */

/* ---------------------------------------------------------------- how to run */

enum mw_simd { MW_SIMD_AUTO = 0, MW_SIMD_SCALAR = 1, MW_SIMD_AVX2 = 2, MW_SIMD_AVX512 = 3 };

#define MW_OPTIM_CHECK_FINITE 0x1u /* scan the (scaled) gradients of the slice first; on inf/NaN
                                      return MW_EOVERFLOW and write nothing. Costs one extra read
                                      of the gradients; a caller that needs ONE decision for all
                                      slices (fp16 loss scaling) uses mw_grad_sumsq over all of
                                      them first and steps without this flag. */

struct mw_optim_exec {
    int nthreads;      /* 0: OpenMP default team; 1: the calling thread only, no OpenMP; T: team of T */
    enum mw_simd simd; /* AUTO: mw_simd_active(); an explicit level the CPU lacks: -ENOTSUP */
    unsigned flags;    /* MW_OPTIM_CHECK_FINITE */
};
/* Wherever a `const struct mw_optim_exec *` is taken, NULL means {0, AUTO, 0}. */

/* Best level this CPU (and OS: XSAVE state) supports, from CPUID. */
enum mw_simd mw_simd_detect(void);
/* What AUTO resolves to: MEMWALL_SIMD=scalar|avx2|avx512 if set (a level the CPU lacks falls
 * back to mw_simd_detect() with one warning through mw_log), else mw_simd_detect(). Read once. */
enum mw_simd mw_simd_active(void);
int mw_simd_supported(enum mw_simd level);
/* Whether the CPU has AVX512-BF16 (vcvtne2ps2bf16); the AVX-512 kernels use it when present
 * and an integer emulation with identical results otherwise. */
int mw_simd_has_avx512bf16(void);
const char *mw_simd_name(enum mw_simd level); /* "auto", "scalar", "avx2", "avx512" */

/* ---------------------------------------------------------------- AdamW */

/* Hyper-parameters of one AdamW step (decoupled weight decay, Loshchilov & Hutter; the same
 * update as torch.optim.AdamW with amsgrad=False, maximize=False):
 *   g  = grad * grad_scale
 *   m  = beta1*m + (1-beta1)*g
 *   v  = beta2*v + (1-beta2)*g*g
 *   p  = p*(1 - lr*weight_decay) - lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
 * The kernels work in float; the constants derived from these (1-beta1, 1-beta2, the bias
 * corrections, 1-lr*weight_decay) are computed in double and rounded to float once per call
 * (exact order of the float operations: docs/optim.md). */
struct mw_adamw_hp {     /* double: 1-beta2 must be 1-0.999, not 1-(float)0.999 (1.3e-5 off) */
    double lr;           /* learning rate */
    double beta1, beta2; /* moment decay rates, in [0, 1) */
    double eps;          /* added to the bias-corrected sqrt(v) */
    double weight_decay; /* decoupled: master *= 1 - lr*weight_decay */
    int64_t step;        /* t >= 1: the number of this step, for bias correction */
    float grad_scale;    /* > 0: multiplies every gradient first (1/loss_scale, clip factor); 1 = none */
};
/* torch.optim.AdamW defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2,
 * step 1, grad_scale 1. */
struct mw_adamw_hp mw_adamw_hp_default(void);

/* One AdamW step over a slice. Reentrant: no global state is written, so several threads may
 * step disjoint slices at once. n == 0 is a no-op. Returns 0, -EINVAL, -ENOTSUP or
 * MW_EOVERFLOW (with MW_OPTIM_CHECK_FINITE; state untouched; mw_error_msg() names the first
 * bad index). Without the flag, inf/NaN gradients propagate into the state. */
int mw_adamw_step(const struct mw_optim_format *fmt, const struct mw_adamw_hp *hp,
                  const struct mw_optim_slice *s, const struct mw_optim_exec *ex);

/* ---------------------------------------------------------------- SGD with momentum */

/* torch.optim.SGD with dampening 0 (buf starts at zero, which equals torch's first-step copy):
 *   g   = grad*grad_scale + weight_decay*p      (L2, coupled, as torch)
 *   buf = momentum*buf + g
 *   d   = nesterov ? g + momentum*buf : buf
 *   p   = p - lr*d
 * momentum == 0: no buffer is read or written (s->m may be NULL). Moments: F32 or BF16. */
struct mw_sgd_hp {
    double lr;
    double momentum;     /* in [0, 1) */
    double weight_decay; /* L2 penalty added to the gradient */
    int nesterov;        /* 0 or 1 */
    float grad_scale;    /* > 0, as for AdamW */
};
int mw_sgd_step(const struct mw_optim_format *fmt, const struct mw_sgd_hp *hp,
                const struct mw_optim_slice *s, const struct mw_optim_exec *ex);

/* ---------------------------------------------------------------- helpers */

/* Benchmark helper, the physical limit of an AdamW step: moves exactly the bytes one
 * mw_adamw_step of this format moves (reads master, grad, m, v and Q8 scales; writes master,
 * m, v, scales and the weight copy), in place, with the same SIMD level and thread split,
 * but computes nothing: the state keeps its values (a run-time zero is XORed in), the weight
 * copy gets garbage. Used by `memwall bench adam`. Returns 0, -EINVAL or -ENOTSUP. */
int mw_optim_bandwidth_pass(const struct mw_optim_format *fmt, const struct mw_optim_slice *s,
                            const struct mw_optim_exec *ex);

/* Sum of squares of grad[0..n) * scale, accumulated per tile in 16 fp32 lanes and across
 * tiles in double, in a fixed order: bitwise the same for every thread count and SIMD level
 * (docs/optim.md). For gradient clipping
 * (global norm = sqrt of the sum over all slices) and the fp16-loss-scaling overflow check:
 * returns MW_EOVERFLOW if any scaled gradient is inf/NaN (*sumsq is then +inf or NaN). */
int mw_grad_sumsq(enum mw_optim_dtype grad_dtype, const void *grad, size_t n, float scale,
                  const struct mw_optim_exec *ex, double *sumsq);

/* Conversions, round to nearest even. bf16: NaN stays a quiet NaN; fp32 denormal inputs
 * become signed zero (that is what the AVX512-BF16 instruction does; memwall's scalar code
 * does the same so that every variant agrees). fp16: IEEE binary16 with subnormals, overflow
 * to inf, NaN stays NaN. Single values: */
uint16_t mw_f32_to_bf16(float x);
float mw_bf16_to_f32(uint16_t h);
uint16_t mw_f32_to_f16(float x);
float mw_f16_to_f32(uint16_t h);
/* Arrays (SIMD, on the calling thread; src and dst must not overlap): */
void mw_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
void mw_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void mw_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
void mw_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif
