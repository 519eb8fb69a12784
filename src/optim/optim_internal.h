/*
 * optim_internal.h — what the kernel files share: per-step constants computed once, the
 * range-kernel table each SIMD level fills in, and the scalar element rules (bf16/fp16
 * rounding, the 8-bit moment code) that every variant must reproduce bit for bit.
 * Why inline element rules here: the SIMD files call the scalar range kernels for ragged
 * tails, and the tests compare variants bitwise, so there must be exactly one definition.
 */
#ifndef MEMWALL_OPTIM_INTERNAL_H
#define MEMWALL_OPTIM_INTERNAL_H

#include "memwall/optim.h"

#include <stdint.h>
#include <string.h>

/* Per-step AdamW constants, all float, computed in double once per call (optim.c). */
struct mw_adamw_k {
    float gscale;       /* grad_scale */
    float b1, c1;       /* beta1, 1-beta1 */
    float b2, c2;       /* beta2, 1-beta2 */
    float decay;        /* 1 - lr*weight_decay */
    float step_size;    /* lr / (1 - beta1^t) */
    float isb2;         /* 1 / sqrt(1 - beta2^t) */
    float eps;
};

struct mw_sgd_k {
    float gscale, lr, momentum, wd;
    int nesterov;
    int use_buf;        /* momentum != 0 */
};

/* Everything a range kernel needs. Ranges [begin, end) are slice-relative; for Q8, begin is
 * a multiple of MW_Q8_BLOCK (tiles are), so block b of the slice is scale index b. */
struct mw_kargs {
    struct mw_optim_format fmt;
    struct mw_optim_slice s;
    struct mw_adamw_k a;
    struct mw_sgd_k sg;
    uint32_t off32;         /* (uint32_t)s.offset: BF16_SR hashes element index off32 + i */
    uint32_t seed;          /* BF16_SR: per-step seed; element i's hash: low 16 bits round m, high 16 v */
};

/* AdamW's checks and per-step constants for one slice (what mw_adamw_step does before it runs a
 * kernel): 0 with *k filled, or the error mw_adamw_step would return (message set). Another
 * implementation of the kernels (a CUDA device, src/offload/device_cuda.c) takes its constants
 * from here, so that they are the CPU's floats bit for bit. */
int mw_adamw_prepare(const struct mw_optim_format *fmt, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
                     struct mw_kargs *k);

typedef void (*mw_range_fn)(const struct mw_kargs *k, size_t begin, size_t end);
/* Sum of squares of one tile (<= MW_OPTIM_TILE elements), see mw_sumsq_tile_scalar. */
typedef double (*mw_sumsq_fn)(enum mw_optim_dtype dt, const void *g, size_t begin, size_t end, float scale);
typedef void (*mw_cvt_out_fn)(const float *src, uint16_t *dst, size_t n);
typedef void (*mw_cvt_in_fn)(const uint16_t *src, float *dst, size_t n);

struct mw_optim_kernels {
    mw_range_fn adamw;
    mw_range_fn sgd;
    mw_range_fn touch;  /* the bandwidth limit: AdamW's bytes, in place, no arithmetic */
    mw_sumsq_fn sumsq;
    mw_cvt_out_fn f32_to_bf16, f32_to_f16;
    mw_cvt_in_fn bf16_to_f32, f16_to_f32;
};

/* Tables per level (kernels_scalar.c; kernels_simd.c, built once for AVX2 and once for
 * AVX-512). AVX-512 has two, with and without the AVX512-BF16 instruction; simd.c picks one
 * from CPUID. */
extern const struct mw_optim_kernels mw_optim_kernels_scalar;
extern const struct mw_optim_kernels mw_optim_kernels_avx2;
const struct mw_optim_kernels *mw_optim_kernels_avx512(int has_bf16);

/* Scalar range kernels, also used by the SIMD files for tails. */
void mw_adamw_range_scalar(const struct mw_kargs *k, size_t begin, size_t end);
void mw_sgd_range_scalar(const struct mw_kargs *k, size_t begin, size_t end);
void mw_touch_range_scalar(const struct mw_kargs *k, size_t begin, size_t end);
/* Zero, read at run time: the touch kernels XOR it into what they write back, so they
 * store every byte they read without the compiler being able to drop the stores. */
extern volatile uint32_t mw_optim_zero;
/* Sum-of-squares lane rule: 16 fp32 lanes, element i of the tile goes to lane i % 16,
 * lane += g*g (no FMA); the tile's result is the lanes summed in double, lane 0 first.
 * mw_sumsq_lanes_scalar continues that rule for elements [i, end) (i relative to begin). */
void mw_sumsq_lanes_scalar(float lanes[16], enum mw_optim_dtype dt, const void *g,
                           size_t begin, size_t i, size_t end, float scale);
double mw_sumsq_finish(const float lanes[16]);

const struct mw_optim_kernels *mw_optim_kernels_for(enum mw_simd level);

/* ---------------------------------------------------------------- element rules */

static inline uint32_t mw_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float mw_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t mw_bf16_rne(float x)
{
    uint32_t u = mw_f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;                               /* denormal -> +-0 */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float mw_bf16_f32(uint16_t h) { return mw_u2f((uint32_t)h << 16); }

/* BF16_SR: 32 random bits for element index j (mod 2^32) under a seed (lowbias32 mixer),
 * and the rounding: add 16 of them below the kept bits, truncate (NaN, denormals as RNE). */
static inline uint32_t mw_sr_hash(uint32_t j, uint32_t seed)
{
    uint32_t x = j ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
static inline uint16_t mw_bf16_sr(float x, uint32_t r)
{
    uint32_t u = mw_f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}
/* Bytes per element of an array format (Q8: the code byte). */
static inline int mw_esz(int dt)
{
    return dt == MW_OPTIM_F32 ? 4 : dt == MW_OPTIM_Q8 ? 1 : dt == MW_OPTIM_NONE ? 0 : 2;
}

static inline uint16_t mw_f16_rne(float x)
{
    uint32_t u = mw_f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quieted */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                      /* below 2^-14: fp16 subnormal */
        /* adding 0.5 (ulp 2^-24) rounds to nearest even multiple of 2^-24 */
        float f = mw_u2f(a) + 0.5f;
        return (uint16_t)(sign | (mw_f2u(f) - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd;                                     /* rebias 127 -> 15, round */
    return (uint16_t)(sign | (a >> 13));
}
static inline float mw_f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = h & 0x7c00u, m = h & 0x3ffu;
    if (e == 0x7c00u) return mw_u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) return mw_u2f(sign | mw_f2u((float)m * 0x1p-24f));
    return mw_u2f(sign | ((((uint32_t)h & 0x7fffu) << 13) + 0x38000000u));
}

/* 8-bit moment code: a minifloat of y = x / absmax(block), |y| <= 1, exponent bias B, 3
 * mantissa bits, subnormals, no inf/NaN, largest code = 1.0 exactly:
 *   magnitude code c: c < 8: c * 2^-(B+2); c >= 8: 2^((c>>3) - B) * (1 + (c&7)/8).
 * m (signed): bit 7 = sign bit of y, bits 0..6 = magnitude code with B = 15 (max 120);
 * v (>= 0):   8-bit magnitude code with B = 31 (max 248).
 * Encoding rounds to nearest, ties to even. */
#define MW_MIN_SZ(a, b) ((a) < (b) ? (a) : (b))
#define MW_Q8_BM 15
#define MW_Q8_BV 31
static inline uint32_t mw_q8_enc_mag(float a, int B)
{
    uint32_t c;
    if (a < mw_u2f((uint32_t)(128 - B) << 23)) {             /* a < 2^(1-B) */
        float t = a * mw_u2f((uint32_t)(127 + B + 2) << 23); /* exact: a * 2^(B+2) < 8 */
        c = mw_f2u(t + 8388608.0f) - 0x4b000000u;            /* RNE to integer 0..8 */
    } else {
        uint32_t u = mw_f2u(a);
        c = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - ((uint32_t)(127 - B) << 3);
    }
    uint32_t cmax = (uint32_t)B << 3;
    return c < cmax ? c : cmax;
}
static inline float mw_q8_dec_mag(uint32_t c, int B)
{
    if (c < 8) return (float)c * mw_u2f((uint32_t)(127 - B - 2) << 23);
    return mw_u2f((c + ((uint32_t)(127 - B) << 3)) << 20);
}
static inline uint8_t mw_q8_enc_m(float y)
{
    uint32_t s = mw_f2u(y) >> 31;
    return (uint8_t)((s << 7) | mw_q8_enc_mag(mw_u2f(mw_f2u(y) & 0x7fffffffu), MW_Q8_BM));
}
static inline float mw_q8_dec_m(uint8_t c)
{
    float a = mw_q8_dec_mag(c & 0x7fu, MW_Q8_BM);
    return mw_u2f(mw_f2u(a) | ((uint32_t)(c >> 7) << 31));
}
static inline uint8_t mw_q8_enc_v(float y) { return (uint8_t)mw_q8_enc_mag(y, MW_Q8_BV); }
static inline float mw_q8_dec_v(uint8_t c) { return mw_q8_dec_mag(c, MW_Q8_BV); }

#endif
