/*
 * simd_vec.h — the vector layer under the optimizer kernels: one vocabulary, mapped onto AVX2
 * or onto AVX-512 by the define the build passes (MW_VEC_AVX2 or MW_VEC_AVX512, with that
 * instruction set's -m flags; CMakeLists.txt compiles kernels_simd.c once with each).
 *
 * Why a layer: both instruction sets run the same kernels at two widths. Written against these
 * names, kernels_simd.c says each kernel once, so a new format or a fix lands in both and the
 * two cannot drift apart; only this file knows the width and the intrinsics.
 *
 * Why so thin: the kernels must stay bitwise equal to the scalar reference (kernels_scalar.c),
 * so nothing here may round differently from it. Each float op is one IEEE instruction (mul,
 * add, sub, div, sqrt kept apart: no FMA even though -mfma is on, no approximate reciprocal);
 * everything else is integer work that is exact on the inputs its comment states. Each name is
 * one instruction of its ISA, or the short sequence a hand-written kernel for that ISA would
 * use, so the shared source costs nothing at run time.
 *
 * The types, W = MW_VEC_W lanes (8 for AVX2, 16 for AVX-512):
 *   mw_vf  W floats;  mw_vi  W 32-bit integers (also the raw bits of an mw_vf);
 *   mw_vh  W 16-bit integers (bf16, fp16), half an mw_vi;  mw_vq  W bytes (8-bit codes);
 *   mw_vm  a lane mask: AVX2 compares give a vector of all-ones lanes, AVX-512 compares give
 *          a mask register, so only the compares and the selects (mw_v?_sel) touch it.
 * Names are mw_<type>_<verb>. One-instruction ops are macros (their shift counts and rounding
 * modes must be immediates, also at -O0); the rest are always-inlined functions.
 */
#ifndef MEMWALL_OPTIM_SIMD_VEC_H
#define MEMWALL_OPTIM_SIMD_VEC_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MW_VEC_AI static inline __attribute__((always_inline))

#if defined(MW_VEC_AVX2) == defined(MW_VEC_AVX512)
#error "simd_vec.h: define exactly one of MW_VEC_AVX2, MW_VEC_AVX512 (CMakeLists.txt does, per build of kernels_simd.c)"
#endif

#if defined(MW_VEC_AVX2) /* ---------------------------------------- AVX2 + FMA + F16C, 8 lanes */

#define MW_VEC_W 8
#define MW_VEC_NAME(f) f##_avx2 /* the entry points' names carry the ISA (profiles, debuggers) */
#define MW_VEC_BF16_HW 0 /* no bf16 instruction: the kernels round by integer emulation */
/* AdamW software prefetch: elements ahead, and every how many elements a stream of esz-byte
 * elements gets one prefetch. Here one per 16 elements for every stream: one line of the
 * widest (fp32) stream (docs/optim.md has the measurement). */
#define MW_VEC_PF_DIST 512
#define MW_VEC_PF_EVERY(esz) 16

typedef __m256 mw_vf;
typedef __m256i mw_vi;
typedef __m128i mw_vh;
typedef __m128i mw_vq; /* the low 8 bytes */
typedef __m256i mw_vm;

#define mw_vf_ld(p) _mm256_loadu_ps(p)
#define mw_vf_st(p, x) _mm256_storeu_ps(p, x)
#define mw_vf_set1(f) _mm256_set1_ps(f)
#define mw_vf_zero() _mm256_setzero_ps()
#define mw_vf_add(a, b) _mm256_add_ps(a, b)
#define mw_vf_sub(a, b) _mm256_sub_ps(a, b)
#define mw_vf_mul(a, b) _mm256_mul_ps(a, b)
#define mw_vf_div(a, b) _mm256_div_ps(a, b)
#define mw_vf_sqrt(a) _mm256_sqrt_ps(a)
#define mw_vf_max(a, b) _mm256_max_ps(a, b)
#define mw_vf_abs(a) _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)))
#define mw_vf_lt(a, b) _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_LT_OQ))
#define mw_vf_sel(m, t, f) _mm256_blendv_ps(f, t, _mm256_castsi256_ps(m))
#define mw_vf_of_bits(x) _mm256_castsi256_ps(x)
#define mw_vf_of_int(x) _mm256_cvtepi32_ps(x) /* value conversion */
#define mw_vf_of_f16(h) _mm256_cvtph_ps(h)
#define mw_vf_to_f16(x) _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

#define mw_vi_ld(p) _mm256_loadu_si256((const __m256i *)(p))
#define mw_vi_st(p, x) _mm256_storeu_si256((__m256i *)(p), x)
#define mw_vi_set1(u) _mm256_set1_epi32((int)(u))
#define mw_vi_zero() _mm256_setzero_si256()
#define mw_vi_iota() _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define mw_vi_of_bits(x) _mm256_castps_si256(x)
#define mw_vi_add(a, b) _mm256_add_epi32(a, b)
#define mw_vi_sub(a, b) _mm256_sub_epi32(a, b)
#define mw_vi_mullo(a, b) _mm256_mullo_epi32(a, b)
#define mw_vi_and(a, b) _mm256_and_si256(a, b)
#define mw_vi_or(a, b) _mm256_or_si256(a, b)
#define mw_vi_xor(a, b) _mm256_xor_si256(a, b)
#define mw_vi_srli(a, n) _mm256_srli_epi32(a, n)
#define mw_vi_slli(a, n) _mm256_slli_epi32(a, n)
#define mw_vi_minu(a, b) _mm256_min_epu32(a, b)
#define mw_vi_gt(a, b) _mm256_cmpgt_epi32(a, b) /* both operands in [0, 2^31) */
#define mw_vi_testz(a, b) _mm256_cmpeq_epi32(_mm256_and_si256(a, b), _mm256_setzero_si256()) /* (a & b) == 0 */
#define mw_vi_sel(m, t, f) _mm256_blendv_epi8(f, t, m)
#define mw_vi_of_u16(h) _mm256_cvtepu16_epi32(h)
#define mw_vi_of_u8(q) _mm256_cvtepu8_epi32(q)
#define mw_vi_lo_vh(x) _mm256_castsi256_si128(x)
#define mw_vi_lo_vq(x) _mm256_castsi256_si128(x)
#define mw_vi_of_vh(h) _mm256_castsi128_si256(h) /* upper lanes undefined */
#define mw_vi_of_vq(q) _mm256_castsi128_si256(q) /* upper lanes undefined */

#define mw_vh_ld(p) _mm_loadu_si128((const __m128i *)(p))
#define mw_vh_st(p, x) _mm_storeu_si128((__m128i *)(p), x)
#define mw_vh_xor(a, b) _mm_xor_si128(a, b)
#define mw_vq_ld(p) _mm_loadl_epi64((const __m128i *)(p))
#define mw_vq_st(p, x) _mm_storel_epi64((__m128i *)(p), x)
#define mw_vq_xor(a, b) _mm_xor_si128(a, b)

/* Lanes in [0, 0xffff] to 16 bits. */
MW_VEC_AI mw_vh mw_vi_pack16(mw_vi x)
{
    return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}
/* Any lanes: their low 16 bits. */
MW_VEC_AI mw_vh mw_vi_lo16(mw_vi x) { return mw_vi_pack16(_mm256_and_si256(x, _mm256_set1_epi32(0xffff))); }
/* Lanes in [0, 0xff] to bytes. */
MW_VEC_AI mw_vq mw_vi_pack8(mw_vi x)
{
    __m128i w = mw_vi_pack16(x);
    return _mm_packus_epi16(w, w);
}
/* The largest lane, at least 0 (exact: max is order-independent for non-NaN values). */
MW_VEC_AI float mw_vf_hmax(mw_vf x)
{
    float l[8], r = 0.0f;
    _mm256_storeu_ps(l, x);
    for (int i = 0; i < 8; i++) r = l[i] > r ? l[i] : r;
    return r;
}

#else /* ---------------------------------- AVX-512 F/BW/VL/DQ (+ BF16 where present), 16 lanes */

#define MW_VEC_W 16
#define MW_VEC_NAME(f) f##_avx512
/* The AVX512-BF16 instruction (vcvtneps2bf16: RNE, quiet NaN, denormals to +-0, the scalar
 * rule exactly) is compiled in; the kernels are instantiated with and without it and the CPU
 * decides at run time (simd.c), since AVX-512 CPUs without it exist. */
#define MW_VEC_BF16_HW 1
/* AdamW software prefetch: one prefetch per cache line of each stream (fp32 every 16
 * elements, 16-bit every 32), 128 elements ahead. With bf16 moments one thread does not keep
 * enough misses in flight from the hardware prefetchers alone while the divider is busy;
 * 64-128 elements ahead measured best, farther (or a second prefetch into L2) worse; fp32
 * state is at the bandwidth limit with or without it. */
#define MW_VEC_PF_DIST 128
#define MW_VEC_PF_EVERY(esz) (64 / (esz))

typedef __m512 mw_vf;
typedef __m512i mw_vi;
typedef __m256i mw_vh;
typedef __m128i mw_vq;
typedef __mmask16 mw_vm;

#define mw_vf_ld(p) _mm512_loadu_ps(p)
#define mw_vf_st(p, x) _mm512_storeu_ps(p, x)
#define mw_vf_set1(f) _mm512_set1_ps(f)
#define mw_vf_zero() _mm512_setzero_ps()
#define mw_vf_add(a, b) _mm512_add_ps(a, b)
#define mw_vf_sub(a, b) _mm512_sub_ps(a, b)
#define mw_vf_mul(a, b) _mm512_mul_ps(a, b)
#define mw_vf_div(a, b) _mm512_div_ps(a, b)
#define mw_vf_sqrt(a) _mm512_sqrt_ps(a)
#define mw_vf_max(a, b) _mm512_max_ps(a, b)
#define mw_vf_abs(a) _mm512_and_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff)))
#define mw_vf_lt(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define mw_vf_sel(m, t, f) _mm512_mask_mov_ps(f, m, t)
#define mw_vf_of_bits(x) _mm512_castsi512_ps(x)
#define mw_vf_of_int(x) _mm512_cvtepi32_ps(x) /* value conversion */
#define mw_vf_of_f16(h) _mm512_cvtph_ps(h)
#define mw_vf_to_f16(x) _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define mw_vf_hmax(x) _mm512_reduce_max_ps(x) /* inputs >= 0, not NaN: exact in any order */

#define mw_vi_ld(p) _mm512_loadu_si512(p)
#define mw_vi_st(p, x) _mm512_storeu_si512(p, x)
#define mw_vi_set1(u) _mm512_set1_epi32((int)(u))
#define mw_vi_zero() _mm512_setzero_si512()
#define mw_vi_iota() _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define mw_vi_of_bits(x) _mm512_castps_si512(x)
#define mw_vi_add(a, b) _mm512_add_epi32(a, b)
#define mw_vi_sub(a, b) _mm512_sub_epi32(a, b)
#define mw_vi_mullo(a, b) _mm512_mullo_epi32(a, b)
#define mw_vi_and(a, b) _mm512_and_si512(a, b)
#define mw_vi_or(a, b) _mm512_or_si512(a, b)
#define mw_vi_xor(a, b) _mm512_xor_si512(a, b)
#define mw_vi_srli(a, n) _mm512_srli_epi32(a, n)
#define mw_vi_slli(a, n) _mm512_slli_epi32(a, n)
#define mw_vi_minu(a, b) _mm512_min_epu32(a, b)
#define mw_vi_gt(a, b) _mm512_cmpgt_epu32_mask(a, b) /* both operands in [0, 2^31) */
#define mw_vi_testz(a, b) _mm512_testn_epi32_mask(a, b) /* (a & b) == 0 */
#define mw_vi_sel(m, t, f) _mm512_mask_mov_epi32(f, m, t)
#define mw_vi_of_u16(h) _mm512_cvtepu16_epi32(h)
#define mw_vi_of_u8(q) _mm512_cvtepu8_epi32(q)
#define mw_vi_lo_vh(x) _mm512_castsi512_si256(x)
#define mw_vi_lo_vq(x) _mm512_castsi512_si128(x)
#define mw_vi_of_vh(h) _mm512_castsi256_si512(h) /* upper lanes undefined */
#define mw_vi_of_vq(q) _mm512_castsi128_si512(q) /* upper lanes undefined */
#define mw_vi_pack16(x) _mm512_cvtepi32_epi16(x) /* lanes in [0, 0xffff] to 16 bits */
#define mw_vi_lo16(x) _mm512_cvtepi32_epi16(x)   /* any lanes: their low 16 bits */
#define mw_vi_pack8(x) _mm512_cvtepi32_epi8(x)   /* lanes in [0, 0xff] to bytes */

#define mw_vh_ld(p) _mm256_loadu_si256((const __m256i *)(p))
#define mw_vh_st(p, x) _mm256_storeu_si256((__m256i *)(p), x)
#define mw_vh_xor(a, b) _mm256_xor_si256(a, b)
#define mw_vq_ld(p) _mm_loadu_si128((const __m128i *)(p))
#define mw_vq_st(p, x) _mm_storeu_si128((__m128i *)(p), x)
#define mw_vq_xor(a, b) _mm_xor_si128(a, b)

/* fp32 -> bf16 by the instruction (the caller checked the CPU has it). */
MW_VEC_AI mw_vh mw_vf_to_bf16_hw(mw_vf x)
{
    __m256bh h = _mm512_cvtneps_pbh(x);
    mw_vh r;
    memcpy(&r, &h, sizeof r);
    return r;
}

#endif

/* A software prefetch into L1 (never faults: the address may lie past the array). */
#define mw_vec_prefetch(addr) _mm_prefetch((const char *)(addr), _MM_HINT_T0)

#endif
