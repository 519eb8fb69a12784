/*
 * kernels_avx512.c — AVX-512 (F/BW/VL/DQ + F16C) kernels, 16 floats per vector, with the
 * AVX512-BF16 rounding instruction where the CPU has it (an integer emulation with the same
 * results otherwise). Each kernel is the scalar reference's operation sequence done by
 * intrinsics (mul and add apart, IEEE sqrt and div), so results are bitwise identical; the
 * formats are compile-time constants of an always-inlined body instantiated per format
 * combination, so the inner loop has no per-element switches. Ragged tails (< 16 elements,
 * or a last Q8 block shorter than MW_Q8_BLOCK) go to the scalar reference.
 */
#include "optim/optim_internal.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))
/* Software prefetch of the AdamW loop's streams, PF_DIST elements ahead, one per cache line
 * (fp32 streams every 16 elements, 16-bit streams every 32). With bf16 moments one thread does
 * not keep enough misses in flight from the hardware prefetchers alone while the divider is
 * busy: +5 % median over 5 side-by-side runs of the 1-thread step (124M parameters on huge
 * pages, distances rotated within one process; range -2 % to +13 %); 64-128 elements best,
 * 192 and more worse, as is a second, farther prefetch into L2. fp32 state is at the
 * bandwidth limit with or without it. */
#ifndef PF_DIST
#define PF_DIST 128
#endif

AI __m512 ld_g(int dt, const void *g, size_t i)
{
    if (dt == MW_OPTIM_BF16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    if (dt == MW_OPTIM_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i)));
    return _mm512_loadu_ps((const float *)g + i);
}

/* fp32 -> bf16, RNE, quiet NaN, denormals to +-0: the instruction, or the same in integers. */
AI __m256i bf16_rne(__m512 x, int hw)
{
    if (hw) {
        __m256bh h = _mm512_cvtneps_pbh(x);
        __m256i r;
        memcpy(&r, &h, sizeof r);
        return r;
    }
    __m512i u = _mm512_castps_si512(x);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    __mmask16 den = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    u = _mm512_mask_and_epi32(u, den, u, _mm512_set1_epi32((int)0x80000000u));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_mov_epi32(r, nan, q);
    return _mm512_cvtepi32_epi16(r);
}

AI __m512 ld_bf16(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* BF16_SR (see mw_sr_hash, mw_bf16_sr): the hash of element indices j0 + lane. */
AI __m512i sr_hash(uint32_t j0, uint32_t seed)
{
    __m512i j = _mm512_add_epi32(_mm512_set1_epi32((int)j0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i h = _mm512_xor_si512(j, _mm512_set1_epi32((int)seed));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0x7feb352d));
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
    h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x846ca68bu));
    return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

AI __m256i bf16_sr(__m512 x, __m512i h) /* rounds with the low 16 bits of h */
{
    __m512i u = _mm512_castps_si512(x);
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    __mmask16 den = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    u = _mm512_mask_and_epi32(u, den, u, _mm512_set1_epi32((int)0x80000000u));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_and_si512(h, _mm512_set1_epi32(0xffff))), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

AI __m512 ld_mom(int dt, const void *p, size_t i)
{
    if (dt == MW_OPTIM_BF16 || dt == MW_OPTIM_BF16_SR) return ld_bf16((const uint16_t *)p + i);
    return _mm512_loadu_ps((const float *)p + i);
}

AI void st_mom(int dt, void *p, size_t i, __m512 x, int hw, __m512i h)
{
    if (dt == MW_OPTIM_BF16) _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), bf16_rne(x, hw));
    else if (dt == MW_OPTIM_BF16_SR) _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), bf16_sr(x, h));
    else _mm512_storeu_ps((float *)p + i, x);
}

AI void st_w(int dt, void *p, size_t i, __m512 x, int hw)
{
    if (dt == MW_OPTIM_BF16) _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), bf16_rne(x, hw));
    else if (dt == MW_OPTIM_F16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* ---- 8-bit moment code (see mw_q8_enc_mag / mw_q8_dec_mag) */
AI __m512 q8_dec_mag(__m512i c, int B)
{
    __mmask16 sub = _mm512_cmplt_epu32_mask(c, _mm512_set1_epi32(8));
    __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_castsi512_ps(_mm512_set1_epi32((127 - B - 2) << 23)));
    __m512 nrm = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(c, _mm512_set1_epi32((127 - B) << 3)), 20));
    return _mm512_mask_mov_ps(nrm, sub, s);
}

AI __m512i q8_enc_mag(__m512 a, int B)
{
    __mmask16 sub = _mm512_cmp_ps_mask(a, _mm512_castsi512_ps(_mm512_set1_epi32((128 - B) << 23)), _CMP_LT_OQ);
    __m512 t = _mm512_mul_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32((127 + B + 2) << 23)));
    __m512i cs = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(t, _mm512_set1_ps(8388608.0f))),
                                  _mm512_set1_epi32(0x4b000000));
    __m512i u = _mm512_castps_si512(a);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1));
    __m512i cn = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7ffff)), odd), 20);
    cn = _mm512_sub_epi32(cn, _mm512_set1_epi32((127 - B) << 3));
    __m512i c = _mm512_mask_mov_epi32(cn, sub, cs);
    return _mm512_min_epu32(c, _mm512_set1_epi32(B << 3));
}

AI __m512 q8_dec_m(const uint8_t *p)
{
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512 a = q8_dec_mag(_mm512_and_si512(c, _mm512_set1_epi32(0x7f)), MW_Q8_BM);
    __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(c, 7), 31);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), sign));
}

AI __m512 q8_dec_v(const uint8_t *p)
{
    return q8_dec_mag(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)), MW_Q8_BV);
}

AI void q8_enc_m(uint8_t *p, __m512 y)
{
    __m512i u = _mm512_castps_si512(y);
    __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(u, 31), 7);
    __m512 a = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)));
    __m512i c = _mm512_or_si512(q8_enc_mag(a, MW_Q8_BM), sign);
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(c));
}

AI void q8_enc_v(uint8_t *p, __m512 y)
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(q8_enc_mag(y, MW_Q8_BV)));
}

/* ---- AdamW */
struct kv { __m512 gs, b1, c1, b2, c2, decay, ss, isb2, eps; };

AI struct kv kv_of(const struct mw_adamw_k *a)
{
    struct kv c = {_mm512_set1_ps(a->gscale), _mm512_set1_ps(a->b1), _mm512_set1_ps(a->c1),
                   _mm512_set1_ps(a->b2), _mm512_set1_ps(a->c2), _mm512_set1_ps(a->decay),
                   _mm512_set1_ps(a->step_size), _mm512_set1_ps(a->isb2), _mm512_set1_ps(a->eps)};
    return c;
}

AI __m512 adamw_v(const struct kv *c, __m512 p, __m512 graw, __m512 *m, __m512 *v)
{
    __m512 g = _mm512_mul_ps(graw, c->gs);
    __m512 mn = _mm512_add_ps(_mm512_mul_ps(c->b1, *m), _mm512_mul_ps(c->c1, g));
    __m512 gg = _mm512_mul_ps(g, g);
    __m512 vn = _mm512_add_ps(_mm512_mul_ps(c->b2, *v), _mm512_mul_ps(c->c2, gg));
    __m512 d = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vn), c->isb2), c->eps);
    __m512 u = _mm512_div_ps(mn, d);
    *m = mn;
    *v = vn;
    return _mm512_sub_ps(_mm512_mul_ps(p, c->decay), _mm512_mul_ps(c->ss, u));
}

AI void adamw_q8(const struct mw_kargs *k, size_t begin, size_t end, int G, int W, int hw)
{
    const struct mw_optim_slice *s = &k->s;
    struct kv c = kv_of(&k->a);
    size_t b0 = begin;
    for (; b0 + MW_Q8_BLOCK <= end; b0 += MW_Q8_BLOCK) {
        uint8_t *mq = (uint8_t *)s->m + b0, *vq = (uint8_t *)s->v + b0;
        size_t bi = b0 / MW_Q8_BLOCK;
        __m512 ms = _mm512_set1_ps(s->m_scale[bi]), vs = _mm512_set1_ps(s->v_scale[bi]);
        __m512 mt[MW_Q8_BLOCK / 16], vt[MW_Q8_BLOCK / 16];
        __m512 am = _mm512_setzero_ps(), av = _mm512_setzero_ps();
        const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
        for (int j = 0; j < MW_Q8_BLOCK / 16; j++) {
            size_t i = b0 + 16 * (size_t)j;
            __m512 m = _mm512_mul_ps(q8_dec_m(mq + 16 * j), ms);
            __m512 v = _mm512_mul_ps(q8_dec_v(vq + 16 * j), vs);
            __m512 p = adamw_v(&c, _mm512_loadu_ps(s->master + i), ld_g(G, s->grad, i), &m, &v);
            _mm512_storeu_ps(s->master + i, p);
            st_w(W, s->weights_out, i, p, hw);
            mt[j] = m;
            vt[j] = v;
            am = _mm512_max_ps(am, _mm512_and_ps(m, absmask));
            av = _mm512_max_ps(av, v);
        }
        float amax = _mm512_reduce_max_ps(am), vmax = _mm512_reduce_max_ps(av);
        __m512 im = _mm512_set1_ps(amax > 0.0f ? 1.0f / amax : 0.0f);
        __m512 iv = _mm512_set1_ps(vmax > 0.0f ? 1.0f / vmax : 0.0f);
        for (int j = 0; j < MW_Q8_BLOCK / 16; j++) {
            q8_enc_m(mq + 16 * j, _mm512_mul_ps(mt[j], im));
            q8_enc_v(vq + 16 * j, _mm512_mul_ps(vt[j], iv));
        }
        s->m_scale[bi] = amax;
        s->v_scale[bi] = vmax;
    }
    if (b0 < end) mw_adamw_range_scalar(k, b0, end);
}

AI void adamw_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int W, int hw)
{
    if (M == MW_OPTIM_Q8) { adamw_q8(k, begin, end, G, W, hw); return; }
    const struct mw_optim_slice *s = &k->s;
    struct kv c = kv_of(&k->a);
    size_t i = begin;
    const int msz = mw_esz(M), gsz = G == MW_OPTIM_F32 ? 4 : 2;
    for (; i + 16 <= end; i += 16) {
        /* prefetches never fault, so reaching past `end` is harmless (addresses formed as
         * integers: no out-of-bounds pointer arithmetic) */
        const uintptr_t ahead = (uintptr_t)(i + PF_DIST);
        _mm_prefetch((const char *)((uintptr_t)s->master + ahead * 4), _MM_HINT_T0);
        if (gsz == 4 || (i & 31) == 0) _mm_prefetch((const char *)((uintptr_t)s->grad + ahead * (uintptr_t)gsz), _MM_HINT_T0);
        if (msz == 4 || (i & 31) == 0) {
            _mm_prefetch((const char *)((uintptr_t)s->m + ahead * (uintptr_t)msz), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)s->v + ahead * (uintptr_t)msz), _MM_HINT_T0);
        }
        __m512 m = ld_mom(M, s->m, i), v = ld_mom(M, s->v, i);
        __m512 p = adamw_v(&c, _mm512_loadu_ps(s->master + i), ld_g(G, s->grad, i), &m, &v);
        _mm512_storeu_ps(s->master + i, p);
        __m512i h = M == MW_OPTIM_BF16_SR ? sr_hash(k->off32 + (uint32_t)i, k->seed) : _mm512_setzero_si512();
        st_mom(M, s->m, i, m, hw, h);
        st_mom(M, s->v, i, v, hw, _mm512_srli_epi32(h, 16));
        st_w(W, s->weights_out, i, p, hw);
    }
    if (i < end) mw_adamw_range_scalar(k, i, end);
}

/* ---- SGD with momentum */
AI void sgd_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int W, int hw)
{
    const struct mw_optim_slice *s = &k->s;
    const struct mw_sgd_k *c = &k->sg;
    __m512 gs = _mm512_set1_ps(c->gscale), lr = _mm512_set1_ps(c->lr);
    __m512 mu = _mm512_set1_ps(c->momentum), wd = _mm512_set1_ps(c->wd);
    size_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m512 p = _mm512_loadu_ps(s->master + i);
        __m512 g = _mm512_add_ps(_mm512_mul_ps(ld_g(G, s->grad, i), gs), _mm512_mul_ps(wd, p));
        __m512 d = g;
        if (c->use_buf) {
            __m512 b = _mm512_add_ps(_mm512_mul_ps(mu, ld_mom(M, s->m, i)), g);
            st_mom(M, s->m, i, b, hw, _mm512_setzero_si512());
            d = c->nesterov ? _mm512_add_ps(g, _mm512_mul_ps(mu, b)) : b;
        }
        p = _mm512_sub_ps(p, _mm512_mul_ps(lr, d));
        _mm512_storeu_ps(s->master + i, p);
        st_w(W, s->weights_out, i, p, hw);
    }
    if (i < end) mw_sgd_range_scalar(k, i, end);
}

/* ---- the bandwidth limit: the same bytes as AdamW of this format, in place, XOR a run-time
 * zero into what is written back; reads of the gradients are folded into an accumulator. */
AI __m512i rw(void *a, size_t i, int esz, __m512i z) /* 16 elements of esz bytes at index i */
{
    char *p = (char *)a + i * (size_t)esz;
    if (esz == 4) { __m512i x = _mm512_xor_si512(_mm512_loadu_si512(p), z); _mm512_storeu_si512(p, x); return x; }
    if (esz == 2) { __m256i x = _mm256_xor_si256(_mm256_loadu_si256((__m256i *)p), _mm512_castsi512_si256(z));
                    _mm256_storeu_si256((__m256i *)p, x); return _mm512_castsi256_si512(x); }
    __m128i x = _mm_xor_si128(_mm_loadu_si128((__m128i *)p), _mm512_castsi512_si128(z));
    _mm_storeu_si128((__m128i *)p, x);
    return _mm512_castsi128_si512(x);
}

AI __m512i rd(const void *a, size_t i, int esz)
{
    const char *p = (const char *)a + i * (size_t)esz;
    if (esz == 4) return _mm512_loadu_si512(p);
    if (esz == 2) return _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
}

AI void touch_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int W, int hw)
{
    (void)hw;
    const struct mw_optim_slice *s = &k->s;
    const int gs = G == MW_OPTIM_F32 ? 4 : 2, ms = mw_esz(M);
    __m512i z = _mm512_set1_epi32((int)mw_optim_zero), acc = _mm512_setzero_si512();
    size_t i = begin;
    for (; i + 16 <= end; i += 16) {
        __m512i p = rw(s->master, i, 4, z);
        acc = _mm512_add_epi32(acc, rd(s->grad, i, gs));
        rw(s->m, i, ms, z);
        rw(s->v, i, ms, z);
        if (M == MW_OPTIM_Q8 && (i % MW_Q8_BLOCK) == 0) {
            s->m_scale[i / MW_Q8_BLOCK] += 0.0f * (float)mw_optim_zero;
            s->v_scale[i / MW_Q8_BLOCK] += 0.0f * (float)mw_optim_zero;
        }
        if (W != MW_OPTIM_NONE) _mm256_storeu_si256((__m256i *)((uint16_t *)s->weights_out + i), _mm512_cvtepi32_epi16(p));
    }
    volatile int sink = _mm512_reduce_or_epi32(acc);   /* keeps the reads of grad (or: no signed overflow) */
    (void)sink;
    if (i < end) mw_touch_range_scalar(k, i, end);
}

/* ---- instantiation per format combination */
#define C3(fn, g, m, hw) \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && W == MW_OPTIM_NONE) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_NONE, hw); return; } \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && W == MW_OPTIM_BF16) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_BF16, hw); return; } \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && W == MW_OPTIM_F16) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_F16, hw); return; }
#define CM(fn, m, hw) C3(fn, F32, m, hw) C3(fn, BF16, m, hw) C3(fn, F16, m, hw)
#define DISPATCH(name, fn, hw, scalar)                                                   \
    static void name(const struct mw_kargs *k, size_t b, size_t e)                       \
    {                                                                                    \
        const int G = k->fmt.grad, M = k->fmt.moments, W = k->fmt.weights_out;           \
        CM(fn, F32, hw) CM(fn, BF16, hw) CM(fn, Q8, hw) CM(fn, BF16_SR, hw)                                  \
        scalar(k, b, e);                                                                 \
    }
DISPATCH(adamw_hw, adamw_body, 1, mw_adamw_range_scalar)
DISPATCH(adamw_emu, adamw_body, 0, mw_adamw_range_scalar)
DISPATCH(sgd_hw, sgd_body, 1, mw_sgd_range_scalar)
DISPATCH(sgd_emu, sgd_body, 0, mw_sgd_range_scalar)
DISPATCH(touch, touch_body, 0, mw_touch_range_scalar)

/* ---- sum of squares and conversions */
static double sumsq(enum mw_optim_dtype dt, const void *g, size_t begin, size_t end, float scale)
{
    __m512 acc = _mm512_setzero_ps(), sc = _mm512_set1_ps(scale);
    size_t i = begin;
#define SUMSQ_LOOP(D) for (; i + 16 <= end; i += 16) { __m512 x = _mm512_mul_ps(ld_g(D, g, i), sc); \
                                                       acc = _mm512_add_ps(acc, _mm512_mul_ps(x, x)); }
    if (dt == MW_OPTIM_BF16) SUMSQ_LOOP(MW_OPTIM_BF16)
    else if (dt == MW_OPTIM_F16) SUMSQ_LOOP(MW_OPTIM_F16)
    else SUMSQ_LOOP(MW_OPTIM_F32)
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    mw_sumsq_lanes_scalar(lanes, dt, g, begin, i - begin, end, scale);
    return mw_sumsq_finish(lanes);
}

AI void to_bf16(const float *src, uint16_t *dst, size_t n, int hw)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), bf16_rne(_mm512_loadu_ps(src + i), hw));
    for (; i < n; i++) dst[i] = mw_bf16_rne(src[i]);
}
static void to_bf16_hw(const float *s, uint16_t *d, size_t n) { to_bf16(s, d, n, 1); }
static void to_bf16_emu(const float *s, uint16_t *d, size_t n) { to_bf16(s, d, n, 0); }

static void to_f16(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = mw_f16_rne(src[i]);
}
static void from_bf16(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, ld_bf16(src + i));
    for (; i < n; i++) dst[i] = mw_bf16_f32(src[i]);
}
static void from_f16(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++) dst[i] = mw_f16_f32(src[i]);
}

static const struct mw_optim_kernels k_hw = {adamw_hw, sgd_hw, touch, sumsq, to_bf16_hw, to_f16, from_bf16, from_f16};
static const struct mw_optim_kernels k_emu = {adamw_emu, sgd_emu, touch, sumsq, to_bf16_emu, to_f16, from_bf16, from_f16};

const struct mw_optim_kernels *mw_optim_kernels_avx512(int has_bf16) { return has_bf16 ? &k_hw : &k_emu; }
