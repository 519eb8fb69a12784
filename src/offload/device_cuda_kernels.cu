/*
 * device_cuda_kernels.cu — the CUDA device's AdamW: the CPU reference's element rule
 * (src/optim/kernels_scalar.c, src/optim/optim_internal.h) as CUDA kernels, and the same code
 * run on the host (ofl_cuda_run_host) so that a machine without a GPU checks it.
 *
 * Why bitwise the CPU's: the hybrid update sends any subgroup to the CPU or to the device, and a
 * run must not depend on where each went (tests/test_offload_device.c compares element by
 * element). So every float operation is the reference's, in its order, rounded once to
 * nearest even: each one is an explicit _rn intrinsic (__fmul_rn, __fadd_rn, __fsub_rn,
 * __fdiv_rn, __fsqrt_rn), which nvcc never contracts into an FMA nor replaces by an
 * approximation, whatever the flags (the build adds -fmad=false, --prec-div=true,
 * --prec-sqrt=true, --ftz=false all the same). The reference keeps mul and add apart (no FMA),
 * divides and takes square roots exactly (divss, sqrtss), keeps denormals, and computes every
 * constant in double once per call: the constants come from the CPU's own mw_adamw_prepare, in
 * the batch (device_cuda.h). The format rules (bf16 round to nearest even with denormals to
 * zero, fp16, the 8-bit minifloat code, the stochastic rounding's lowbias32 hash of the element
 * index and the step) are integer operations on the float's bits, ported line for line; the
 * host build of this file uses the same lines with plain float operators (the host compiler
 * gets -ffp-contract=off, and x86-64 without -mfma has no FMA to contract to). The one thing
 * that can differ is a NaN's payload: x86 passes an operand's NaN through, the GPU makes the
 * canonical one (docs/gpu.md); finite values, infinities and signed zeros are the CPU's bits.
 *
 * Shape: an elementwise kernel for fp32, bf16 and bf16-sr moments (grid-stride over the piece,
 * blockIdx.y = the piece), and for 8-bit moments one CUDA block of 256 threads per moment block:
 * each thread updates one element, the block's absolute maxima (the new scales) are reduced in
 * shared memory, then each thread encodes its moments against them. The reference's running
 * maximum (am = |m| > am ? |m| : am from 0, NaN never taken) equals the tree's maximum over
 * leaves max(x, +0) with NaN mapped to +0: the same floats, in any order. A third kernel applies
 * the batch's scale segments first (update.c: an 8-bit block straddling a decay boundary).
 */
#include "offload/device_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if MW_Q8_BLOCK != OFL_CUDA_BLOCK
#error "one CUDA block per 8-bit moment block: OFL_CUDA_BLOCK must be MW_Q8_BLOCK"
#endif

/* Passed by value to every launch: the classic 4 KiB limit of a kernel's parameters. */
static_assert(sizeof(struct ofl_cuda_batch) <= 4000, "a batch must fit a kernel's parameter block");

#define HD static __host__ __device__ __forceinline__

/* ---------------------------------------------------------------- operations, rounded once */

#if defined(__CUDA_ARCH__)
#define F_MUL(a, b) __fmul_rn((a), (b))
#define F_ADD(a, b) __fadd_rn((a), (b))
#define F_SUB(a, b) __fsub_rn((a), (b))
#define F_DIV(a, b) __fdiv_rn((a), (b))
#define F_SQRT(a) __fsqrt_rn(a)
HD uint32_t f2u(float f) { return __float_as_uint(f); }
HD float u2f(uint32_t u) { return __uint_as_float(u); }
#else
#define F_MUL(a, b) ((a) * (b))
#define F_ADD(a, b) ((a) + (b))
#define F_SUB(a, b) ((a) - (b))
#define F_DIV(a, b) ((a) / (b))
#define F_SQRT(a) sqrtf(a)
HD uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
HD float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
#endif

/* ---------------------------------------------------------------- the element rules (optim_internal.h) */

HD uint16_t bf16_rne(float x)
{
    uint32_t u = f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;                               /* denormal -> +-0 */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
HD float bf16_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

HD uint32_t sr_hash(uint32_t j, uint32_t seed)
{
    uint32_t x = j ^ seed;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
HD uint16_t bf16_sr(float x, uint32_t r)
{
    uint32_t u = f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

HD uint16_t f16_rne(float x)
{
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        float f = F_ADD(u2f(a), 0.5f);
        return (uint16_t)(sign | (f2u(f) - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd;
    return (uint16_t)(sign | (a >> 13));
}
HD float f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = h & 0x7c00u, m = h & 0x3ffu;
    if (e == 0x7c00u) return u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) return u2f(sign | f2u(F_MUL((float)m, u2f(0x33800000u)))); /* m * 2^-24, exact */
    return u2f(sign | ((((uint32_t)h & 0x7fffu) << 13) + 0x38000000u));
}

#define Q8_BM 15
#define Q8_BV 31
HD uint32_t q8_enc_mag(float a, int B)
{
    uint32_t c;
    if (a < u2f((uint32_t)(128 - B) << 23)) {
        float t = F_MUL(a, u2f((uint32_t)(127 + B + 2) << 23));
        c = f2u(F_ADD(t, 8388608.0f)) - 0x4b000000u;
    } else {
        uint32_t u = f2u(a);
        c = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - ((uint32_t)(127 - B) << 3);
    }
    uint32_t cmax = (uint32_t)B << 3;
    return c < cmax ? c : cmax;
}
HD float q8_dec_mag(uint32_t c, int B)
{
    if (c < 8) return F_MUL((float)c, u2f((uint32_t)(127 - B - 2) << 23));
    return u2f((c + ((uint32_t)(127 - B) << 3)) << 20);
}
HD uint8_t q8_enc_m(float y)
{
    uint32_t s = f2u(y) >> 31;
    return (uint8_t)((s << 7) | q8_enc_mag(u2f(f2u(y) & 0x7fffffffu), Q8_BM));
}
HD float q8_dec_m(uint8_t c)
{
    float a = q8_dec_mag(c & 0x7fu, Q8_BM);
    return u2f(f2u(a) | ((uint32_t)(c >> 7) << 31));
}
HD uint8_t q8_enc_v(float y) { return (uint8_t)q8_enc_mag(y, Q8_BV); }
HD float q8_dec_v(uint8_t c) { return q8_dec_mag(c, Q8_BV); }

HD float load_g(int dt, const void *g, uint64_t i)
{
    if (dt == MW_OPTIM_BF16) return bf16_f32(((const uint16_t *)g)[i]);
    if (dt == MW_OPTIM_F16) return f16_f32(((const uint16_t *)g)[i]);
    return ((const float *)g)[i];
}
HD float load_mom(int dt, const void *p, uint64_t i)
{
    if (dt == MW_OPTIM_BF16 || dt == MW_OPTIM_BF16_SR) return bf16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
HD void store_mom(int dt, void *p, uint64_t i, float x, uint32_t r)
{
    if (dt == MW_OPTIM_BF16) ((uint16_t *)p)[i] = bf16_rne(x);
    else if (dt == MW_OPTIM_BF16_SR) ((uint16_t *)p)[i] = bf16_sr(x, r);
    else ((float *)p)[i] = x;
}
HD void store_w(int dt, void *p, uint64_t i, float x)
{
    if (dt == MW_OPTIM_BF16) ((uint16_t *)p)[i] = bf16_rne(x);
    else if (dt == MW_OPTIM_F16) ((uint16_t *)p)[i] = f16_rne(x);
}

/* kernels_scalar.c's adamw_elem: returns the new master weight. */
HD float adamw_elem(const struct ofl_cuda_piece *a, float p, float graw, float *m, float *v)
{
    float g = F_MUL(graw, a->gscale);
    float mn = F_ADD(F_MUL(a->b1, *m), F_MUL(a->c1, g));
    float gg = F_MUL(g, g);
    float vn = F_ADD(F_MUL(a->b2, *v), F_MUL(a->c2, gg));
    float d = F_ADD(F_MUL(F_SQRT(vn), a->isb2), a->eps);
    float u = F_DIV(mn, d);
    *m = mn;
    *v = vn;
    return F_SUB(F_MUL(p, a->decay), F_MUL(a->step_size, u));
}

/* Element i of piece a (fp32, bf16, bf16-sr moments): mw_adamw_range_scalar's loop body. */
HD void elem_at(const struct ofl_cuda_batch *b, const struct ofl_cuda_piece *a, uint64_t i)
{
    uint64_t j = a->off + i;
    float m = load_mom(b->moments, b->m, j), v = load_mom(b->moments, b->v, j);
    float p = adamw_elem(a, b->master[j], load_g(b->grad, b->grad_p, j), &m, &v);
    b->master[j] = p;
    uint32_t r = b->moments == MW_OPTIM_BF16_SR ? sr_hash(a->off32 + (uint32_t)i, a->seed) : 0;
    store_mom(b->moments, b->m, j, m, r);
    store_mom(b->moments, b->v, j, v, r >> 16);
    store_w(b->weights_out, b->w, j, p);
}

/* 8-bit: element t of the block at b0 of piece a, before its block's scales are known: the new
 * master (stored) and the new moments (returned). */
HD void q8_elem(const struct ofl_cuda_batch *b, const struct ofl_cuda_piece *a, uint64_t b0, uint32_t t, float *m,
                float *v)
{
    uint64_t j = a->off + b0 + t, bi = (a->off + b0) / MW_Q8_BLOCK;
    *m = F_MUL(q8_dec_m(((const uint8_t *)b->m)[j]), b->m_scale[bi]);
    *v = F_MUL(q8_dec_v(((const uint8_t *)b->v)[j]), b->v_scale[bi]);
    float p = adamw_elem(a, b->master[j], load_g(b->grad, b->grad_p, j), m, v);
    b->master[j] = p;
    store_w(b->weights_out, b->w, j, p);
}

/* A leaf of the block maxima: max(x, +0), NaN as +0 (see the design comment). */
HD float max_leaf(float x) { return x > 0.0f ? x : 0.0f; }
HD float max2(float acc, float x) { return x > acc ? x : acc; }
HD float abs_bits(float x) { return u2f(f2u(x) & 0x7fffffffu); } /* fabsf */
HD float inv_or_zero(float a) { return a > 0.0f ? F_DIV(1.0f, a) : 0.0f; }

HD void q8_store(const struct ofl_cuda_batch *b, const struct ofl_cuda_piece *a, uint64_t b0, uint32_t t, float m,
                 float v, float im, float iv)
{
    uint64_t j = a->off + b0 + t;
    ((uint8_t *)b->m)[j] = q8_enc_m(F_MUL(m, im));
    ((uint8_t *)b->v)[j] = q8_enc_v(F_MUL(v, iv));
}

/* ---------------------------------------------------------------- kernels */

__global__ void __launch_bounds__(OFL_CUDA_BLOCK) k_scale(const __grid_constant__ struct ofl_cuda_batch b)
{
    const struct ofl_cuda_scale *sc = &b.scale[blockIdx.y];
    for (uint64_t i = sc->lo + (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < sc->hi;
         i += (uint64_t)gridDim.x * blockDim.x)
        b.master[i] = F_MUL(b.master[i], sc->factor);
}

__global__ void __launch_bounds__(OFL_CUDA_BLOCK) k_adamw(const __grid_constant__ struct ofl_cuda_batch b)
{
    const struct ofl_cuda_piece *a = &b.piece[blockIdx.y];
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a->n; i += (uint64_t)gridDim.x * blockDim.x)
        elem_at(&b, a, i);
}

__global__ void __launch_bounds__(OFL_CUDA_BLOCK) k_adamw_q8(const __grid_constant__ struct ofl_cuda_batch b)
{
    __shared__ float sm[OFL_CUDA_BLOCK], sv[OFL_CUDA_BLOCK];
    const struct ofl_cuda_piece *a = &b.piece[blockIdx.y];
    const uint32_t t = threadIdx.x;
    const uint64_t nblk = (a->n + MW_Q8_BLOCK - 1) / MW_Q8_BLOCK;
    for (uint64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) { /* uniform in the block: barriers are safe */
        uint64_t b0 = blk * MW_Q8_BLOCK, len = a->n - b0 < MW_Q8_BLOCK ? a->n - b0 : MW_Q8_BLOCK;
        float m = 0.0f, v = 0.0f;
        if (t < len) q8_elem(&b, a, b0, t, &m, &v);
        sm[t] = t < len ? max_leaf(abs_bits(m)) : 0.0f;
        sv[t] = t < len ? max_leaf(v) : 0.0f;
        __syncthreads();
        for (uint32_t s = OFL_CUDA_BLOCK / 2; s > 0; s >>= 1) {
            if (t < s) { sm[t] = max2(sm[t], sm[t + s]); sv[t] = max2(sv[t], sv[t + s]); }
            __syncthreads();
        }
        float am = sm[0], av = sv[0];
        __syncthreads(); /* every thread has read the maxima before the next block overwrites them */
        if (t < len) q8_store(&b, a, b0, t, m, v, inv_or_zero(am), inv_or_zero(av));
        if (t == 0) {
            uint64_t bi = (a->off + b0) / MW_Q8_BLOCK;
            b.m_scale[bi] = am;
            b.v_scale[bi] = av;
        }
    }
}

/* Blocks across one piece: enough to fill a large GPU, grid-stride past that. */
static unsigned grid_x(uint64_t n)
{
    uint64_t blocks = (n + OFL_CUDA_BLOCK - 1) / OFL_CUDA_BLOCK;
    return (unsigned)(blocks < 1 ? 1 : blocks > 8192 ? 8192 : blocks);
}

extern "C" int ofl_cuda_launch(const struct ofl_cuda_batch *b, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    cudaGetLastError(); /* clears what this thread left (a query's NotReady): launches are checked below */
    if (b->nscales) {
        k_scale<<<dim3(1, b->nscales), OFL_CUDA_BLOCK, 0, s>>>(*b);
        cudaError_t r = cudaGetLastError();
        if (r != cudaSuccess) return (int)r;
    }
    if (b->npieces) {
        dim3 grid(grid_x(b->max_n), b->npieces);
        if (b->moments == MW_OPTIM_Q8) k_adamw_q8<<<grid, OFL_CUDA_BLOCK, 0, s>>>(*b);
        else k_adamw<<<grid, OFL_CUDA_BLOCK, 0, s>>>(*b);
        cudaError_t r = cudaGetLastError();
        if (r != cudaSuccess) return (int)r;
    }
    return 0;
}

/* ---------------------------------------------------------------- the same on the host */

extern "C" void ofl_cuda_run_host(const struct ofl_cuda_batch *b)
{
    for (uint32_t k = 0; k < b->nscales; k++)
        for (uint64_t i = b->scale[k].lo; i < b->scale[k].hi; i++)
            b->master[i] = F_MUL(b->master[i], b->scale[k].factor);
    for (uint32_t k = 0; k < b->npieces; k++) {
        const struct ofl_cuda_piece *a = &b->piece[k];
        if (b->moments != MW_OPTIM_Q8) {
            for (uint64_t i = 0; i < a->n; i++) elem_at(b, a, i);
            continue;
        }
        for (uint64_t b0 = 0; b0 < a->n; b0 += MW_Q8_BLOCK) { /* the kernel's block, one thread after another */
            uint32_t len = (uint32_t)(a->n - b0 < MW_Q8_BLOCK ? a->n - b0 : MW_Q8_BLOCK);
            float m[MW_Q8_BLOCK], v[MW_Q8_BLOCK], am = 0.0f, av = 0.0f;
            for (uint32_t t = 0; t < len; t++) {
                q8_elem(b, a, b0, t, &m[t], &v[t]);
                am = max2(am, max_leaf(abs_bits(m[t])));
                av = max2(av, max_leaf(v[t]));
            }
            for (uint32_t t = 0; t < len; t++) q8_store(b, a, b0, t, m[t], v[t], inv_or_zero(am), inv_or_zero(av));
            uint64_t bi = (a->off + b0) / MW_Q8_BLOCK;
            b->m_scale[bi] = am;
            b->v_scale[bi] = av;
        }
    }
}
