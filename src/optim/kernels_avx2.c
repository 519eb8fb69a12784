/*
 * kernels_avx2.c — AVX2 + F16C kernels, 8 floats per vector. Same operation sequence as
 * the scalar reference (no FMA even though -mfma is on: results stay bitwise identical),
 * bf16 rounding by integer emulation (AVX2 has no bf16 instruction), formats instantiated
 * as compile-time constants, ragged tails handed to the scalar reference.
 */
#include "optim/optim_internal.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))
#define I32(x) _mm256_set1_epi32((int)(x))
#ifndef PF_DIST
#define PF_DIST 512 /* elements ahead: software prefetch of the AdamW loop's streams (bf16 moments +30 % at 1 thread here) */
#endif

AI __m256 ld_bf16(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

AI __m256 ld_g(int dt, const void *g, size_t i)
{
    if (dt == MW_OPTIM_BF16) return ld_bf16((const uint16_t *)g + i);
    if (dt == MW_OPTIM_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)g + i)));
    return _mm256_loadu_ps((const float *)g + i);
}

AI __m128i pack16(__m256i r) /* 8 x u32 (<= 0xffff) -> 8 x u16 */
{
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

AI __m128i bf16_rne(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i a = _mm256_and_si256(u, I32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(a, I32(0x7f800000));
    __m256i den = _mm256_cmpeq_epi32(_mm256_and_si256(u, I32(0x7f800000)), _mm256_setzero_si256());
    u = _mm256_blendv_epi8(u, _mm256_and_si256(u, I32(0x80000000u)), den);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), I32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, I32(0x7fff)), odd), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), I32(0x40));
    return pack16(_mm256_blendv_epi8(r, q, nan));
}

/* BF16_SR (see mw_sr_hash, mw_bf16_sr): the hash of element indices j0 + lane. */
AI __m256i sr_hash(uint32_t j0, uint32_t seed)
{
    __m256i j = _mm256_add_epi32(I32(j0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i h = _mm256_xor_si256(j, I32(seed));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, I32(0x7feb352d));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
    h = _mm256_mullo_epi32(h, I32(0x846ca68bu));
    return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

AI __m128i bf16_sr(__m256 x, __m256i h) /* rounds with the low 16 bits of h */
{
    __m256i u = _mm256_castps_si256(x);
    __m256i a = _mm256_and_si256(u, I32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(a, I32(0x7f800000));
    __m256i den = _mm256_cmpeq_epi32(_mm256_and_si256(u, I32(0x7f800000)), _mm256_setzero_si256());
    u = _mm256_blendv_epi8(u, _mm256_and_si256(u, I32(0x80000000u)), den);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_and_si256(h, I32(0xffff))), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), I32(0x40));
    return pack16(_mm256_blendv_epi8(r, q, nan));
}

AI __m256 ld_mom(int dt, const void *p, size_t i)
{
    if (dt == MW_OPTIM_BF16 || dt == MW_OPTIM_BF16_SR) return ld_bf16((const uint16_t *)p + i);
    return _mm256_loadu_ps((const float *)p + i);
}

AI void st_mom(int dt, void *p, size_t i, __m256 x, __m256i h)
{
    if (dt == MW_OPTIM_BF16) _mm_storeu_si128((__m128i *)((uint16_t *)p + i), bf16_rne(x));
    else if (dt == MW_OPTIM_BF16_SR) _mm_storeu_si128((__m128i *)((uint16_t *)p + i), bf16_sr(x, h));
    else _mm256_storeu_ps((float *)p + i, x);
}

AI void st_w(int dt, void *p, size_t i, __m256 x)
{
    if (dt == MW_OPTIM_BF16) _mm_storeu_si128((__m128i *)((uint16_t *)p + i), bf16_rne(x));
    else if (dt == MW_OPTIM_F16)
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* ---- 8-bit moment code (see mw_q8_enc_mag / mw_q8_dec_mag) */
AI __m256 q8_dec_mag(__m256i c, int B)
{
    __m256i sub = _mm256_cmpgt_epi32(I32(8), c);
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_castsi256_ps(I32((127 - B - 2) << 23)));
    __m256 nrm = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(c, I32((127 - B) << 3)), 20));
    return _mm256_blendv_ps(nrm, s, _mm256_castsi256_ps(sub));
}

AI __m256i q8_enc_mag(__m256 a, int B)
{
    __m256 sub = _mm256_cmp_ps(a, _mm256_castsi256_ps(I32((128 - B) << 23)), _CMP_LT_OQ);
    __m256 t = _mm256_mul_ps(a, _mm256_castsi256_ps(I32((127 + B + 2) << 23)));
    __m256i cs = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(t, _mm256_set1_ps(8388608.0f))), I32(0x4b000000));
    __m256i u = _mm256_castps_si256(a);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 20), I32(1));
    __m256i cn = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, I32(0x7ffff)), odd), 20);
    cn = _mm256_sub_epi32(cn, I32((127 - B) << 3));
    __m256i c = _mm256_blendv_epi8(cn, cs, _mm256_castps_si256(sub));
    return _mm256_min_epu32(c, I32(B << 3));
}

AI __m256i ld_u8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
AI void st_u8(uint8_t *p, __m256i c)
{
    __m128i w = pack16(c);
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}

AI __m256 q8_dec_m(const uint8_t *p)
{
    __m256i c = ld_u8(p);
    __m256 a = q8_dec_mag(_mm256_and_si256(c, I32(0x7f)), MW_Q8_BM);
    __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(c, 7), 31);
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(a), sign));
}

AI void q8_enc_m(uint8_t *p, __m256 y)
{
    __m256i u = _mm256_castps_si256(y);
    __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(u, 31), 7);
    __m256 a = _mm256_castsi256_ps(_mm256_and_si256(u, I32(0x7fffffff)));
    st_u8(p, _mm256_or_si256(q8_enc_mag(a, MW_Q8_BM), sign));
}

AI float hmax(__m256 x) /* exact: max is order-independent for non-NaN values */
{
    float l[8], r = 0.0f;
    _mm256_storeu_ps(l, x);
    for (int i = 0; i < 8; i++) r = l[i] > r ? l[i] : r;
    return r;
}

/* ---- AdamW */
struct kv { __m256 gs, b1, c1, b2, c2, decay, ss, isb2, eps; };

AI struct kv kv_of(const struct mw_adamw_k *a)
{
    struct kv c = {_mm256_set1_ps(a->gscale), _mm256_set1_ps(a->b1), _mm256_set1_ps(a->c1),
                   _mm256_set1_ps(a->b2), _mm256_set1_ps(a->c2), _mm256_set1_ps(a->decay),
                   _mm256_set1_ps(a->step_size), _mm256_set1_ps(a->isb2), _mm256_set1_ps(a->eps)};
    return c;
}

AI __m256 adamw_v(const struct kv *c, __m256 p, __m256 graw, __m256 *m, __m256 *v)
{
    __m256 g = _mm256_mul_ps(graw, c->gs);
    __m256 mn = _mm256_add_ps(_mm256_mul_ps(c->b1, *m), _mm256_mul_ps(c->c1, g));
    __m256 gg = _mm256_mul_ps(g, g);
    __m256 vn = _mm256_add_ps(_mm256_mul_ps(c->b2, *v), _mm256_mul_ps(c->c2, gg));
    __m256 d = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vn), c->isb2), c->eps);
    __m256 u = _mm256_div_ps(mn, d);
    *m = mn;
    *v = vn;
    return _mm256_sub_ps(_mm256_mul_ps(p, c->decay), _mm256_mul_ps(c->ss, u));
}

AI void adamw_q8(const struct mw_kargs *k, size_t begin, size_t end, int G, int W)
{
    const struct mw_optim_slice *s = &k->s;
    struct kv c = kv_of(&k->a);
    size_t b0 = begin;
    for (; b0 + MW_Q8_BLOCK <= end; b0 += MW_Q8_BLOCK) {
        uint8_t *mq = (uint8_t *)s->m + b0, *vq = (uint8_t *)s->v + b0;
        size_t bi = b0 / MW_Q8_BLOCK;
        __m256 ms = _mm256_set1_ps(s->m_scale[bi]), vs = _mm256_set1_ps(s->v_scale[bi]);
        __m256 mt[MW_Q8_BLOCK / 8], vt[MW_Q8_BLOCK / 8];
        __m256 am = _mm256_setzero_ps(), av = _mm256_setzero_ps();
        const __m256 absmask = _mm256_castsi256_ps(I32(0x7fffffff));
        for (int j = 0; j < MW_Q8_BLOCK / 8; j++) {
            size_t i = b0 + 8 * (size_t)j;
            __m256 m = _mm256_mul_ps(q8_dec_m(mq + 8 * j), ms);
            __m256 v = _mm256_mul_ps(q8_dec_mag(ld_u8(vq + 8 * j), MW_Q8_BV), vs);
            __m256 p = adamw_v(&c, _mm256_loadu_ps(s->master + i), ld_g(G, s->grad, i), &m, &v);
            _mm256_storeu_ps(s->master + i, p);
            st_w(W, s->weights_out, i, p);
            mt[j] = m;
            vt[j] = v;
            am = _mm256_max_ps(am, _mm256_and_ps(m, absmask));
            av = _mm256_max_ps(av, v);
        }
        float amax = hmax(am), vmax = hmax(av);
        __m256 im = _mm256_set1_ps(amax > 0.0f ? 1.0f / amax : 0.0f);
        __m256 iv = _mm256_set1_ps(vmax > 0.0f ? 1.0f / vmax : 0.0f);
        for (int j = 0; j < MW_Q8_BLOCK / 8; j++) {
            q8_enc_m(mq + 8 * j, _mm256_mul_ps(mt[j], im));
            st_u8(vq + 8 * j, q8_enc_mag(_mm256_mul_ps(vt[j], iv), MW_Q8_BV));
        }
        s->m_scale[bi] = amax;
        s->v_scale[bi] = vmax;
    }
    if (b0 < end) mw_adamw_range_scalar(k, b0, end);
}

AI void adamw_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int W)
{
    if (M == MW_OPTIM_Q8) { adamw_q8(k, begin, end, G, W); return; }
    const struct mw_optim_slice *s = &k->s;
    struct kv c = kv_of(&k->a);
    size_t i = begin;
    const size_t ms = (size_t)mw_esz(M), gs = G == MW_OPTIM_F32 ? 4 : 2;
    for (; i + 8 <= end; i += 8) {
        if ((i & 15) == 0) { /* PF_DIST elements ahead: one cache line of the widest stream per 16 elements
                                (addresses formed as integers: past `end` is harmless for a prefetch) */
            const uintptr_t ahead = (uintptr_t)(i + PF_DIST);
            _mm_prefetch((const char *)((uintptr_t)s->master + ahead * 4), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)s->grad + ahead * gs), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)s->m + ahead * ms), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)s->v + ahead * ms), _MM_HINT_T0);
        }
        __m256 m = ld_mom(M, s->m, i), v = ld_mom(M, s->v, i);
        __m256 p = adamw_v(&c, _mm256_loadu_ps(s->master + i), ld_g(G, s->grad, i), &m, &v);
        _mm256_storeu_ps(s->master + i, p);
        __m256i h = M == MW_OPTIM_BF16_SR ? sr_hash(k->off32 + (uint32_t)i, k->seed) : _mm256_setzero_si256();
        st_mom(M, s->m, i, m, h);
        st_mom(M, s->v, i, v, _mm256_srli_epi32(h, 16));
        st_w(W, s->weights_out, i, p);
    }
    if (i < end) mw_adamw_range_scalar(k, i, end);
}

/* ---- SGD with momentum */
AI void sgd_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int W)
{
    const struct mw_optim_slice *s = &k->s;
    const struct mw_sgd_k *c = &k->sg;
    __m256 gs = _mm256_set1_ps(c->gscale), lr = _mm256_set1_ps(c->lr);
    __m256 mu = _mm256_set1_ps(c->momentum), wd = _mm256_set1_ps(c->wd);
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256 p = _mm256_loadu_ps(s->master + i);
        __m256 g = _mm256_add_ps(_mm256_mul_ps(ld_g(G, s->grad, i), gs), _mm256_mul_ps(wd, p));
        __m256 d = g;
        if (c->use_buf) {
            __m256 b = _mm256_add_ps(_mm256_mul_ps(mu, ld_mom(M, s->m, i)), g);
            st_mom(M, s->m, i, b, _mm256_setzero_si256());
            d = c->nesterov ? _mm256_add_ps(g, _mm256_mul_ps(mu, b)) : b;
        }
        p = _mm256_sub_ps(p, _mm256_mul_ps(lr, d));
        _mm256_storeu_ps(s->master + i, p);
        st_w(W, s->weights_out, i, p);
    }
    if (i < end) mw_sgd_range_scalar(k, i, end);
}

/* ---- the bandwidth limit (see kernels_avx512.c) */
AI __m256i rw(void *a, size_t i, int esz, __m256i z) /* 8 elements of esz bytes at index i */
{
    char *p = (char *)a + i * (size_t)esz;
    if (esz == 4) { __m256i x = _mm256_xor_si256(_mm256_loadu_si256((__m256i *)p), z); _mm256_storeu_si256((__m256i *)p, x); return x; }
    if (esz == 2) { __m128i x = _mm_xor_si128(_mm_loadu_si128((__m128i *)p), _mm256_castsi256_si128(z));
                    _mm_storeu_si128((__m128i *)p, x); return _mm256_castsi128_si256(x); }
    __m128i x = _mm_xor_si128(_mm_loadl_epi64((__m128i *)p), _mm256_castsi256_si128(z));
    _mm_storel_epi64((__m128i *)p, x);
    return _mm256_castsi128_si256(x);
}

AI __m256i rd(const void *a, size_t i, int esz)
{
    const char *p = (const char *)a + i * (size_t)esz;
    if (esz == 4) return _mm256_loadu_si256((const __m256i *)p);
    return _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

AI void touch_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int W)
{
    const struct mw_optim_slice *s = &k->s;
    const int gs = G == MW_OPTIM_F32 ? 4 : 2, ms = mw_esz(M);
    __m256i z = I32(mw_optim_zero), acc = _mm256_setzero_si256();
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
        __m256i p = rw(s->master, i, 4, z);
        acc = _mm256_add_epi32(acc, rd(s->grad, i, gs));
        rw(s->m, i, ms, z);
        rw(s->v, i, ms, z);
        if (M == MW_OPTIM_Q8 && (i % MW_Q8_BLOCK) == 0) {
            s->m_scale[i / MW_Q8_BLOCK] += 0.0f * (float)mw_optim_zero;
            s->v_scale[i / MW_Q8_BLOCK] += 0.0f * (float)mw_optim_zero;
        }
        if (W != MW_OPTIM_NONE) _mm_storeu_si128((__m128i *)((uint16_t *)s->weights_out + i), pack16(_mm256_and_si256(p, I32(0xffff))));
    }
    uint32_t l[8];
    _mm256_storeu_si256((__m256i *)l, acc);
    volatile uint32_t sink = l[0] ^ l[7];   /* keeps the reads of grad */
    (void)sink;
    if (i < end) mw_touch_range_scalar(k, i, end);
}

#define C3(fn, g, m) \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && W == MW_OPTIM_NONE) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_NONE); return; } \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && W == MW_OPTIM_BF16) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_BF16); return; } \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && W == MW_OPTIM_F16) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_F16); return; }
#define CM(fn, m) C3(fn, F32, m) C3(fn, BF16, m) C3(fn, F16, m)
#define DISPATCH(name, fn, scalar)                                                       \
    static void name(const struct mw_kargs *k, size_t b, size_t e)                       \
    {                                                                                    \
        const int G = k->fmt.grad, M = k->fmt.moments, W = k->fmt.weights_out;           \
        CM(fn, F32) CM(fn, BF16) CM(fn, Q8) CM(fn, BF16_SR)                                              \
        scalar(k, b, e);                                                                 \
    }
DISPATCH(adamw_avx2, adamw_body, mw_adamw_range_scalar)
DISPATCH(sgd_avx2, sgd_body, mw_sgd_range_scalar)
DISPATCH(touch_avx2, touch_body, mw_touch_range_scalar)

/* ---- sum of squares (lanes 0-7 in a0, 8-15 in a1: the scalar lane rule) and conversions */
static double sumsq(enum mw_optim_dtype dt, const void *g, size_t begin, size_t end, float scale)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), sc = _mm256_set1_ps(scale);
    size_t i = begin;
#define SUMSQ_LOOP(D) for (; i + 16 <= end; i += 16) {                                       \
        __m256 x0 = _mm256_mul_ps(ld_g(D, g, i), sc), x1 = _mm256_mul_ps(ld_g(D, g, i + 8), sc); \
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(x0, x0));                                      \
        a1 = _mm256_add_ps(a1, _mm256_mul_ps(x1, x1)); }
    if (dt == MW_OPTIM_BF16) SUMSQ_LOOP(MW_OPTIM_BF16)
    else if (dt == MW_OPTIM_F16) SUMSQ_LOOP(MW_OPTIM_F16)
    else SUMSQ_LOOP(MW_OPTIM_F32)
    float lanes[16];
    _mm256_storeu_ps(lanes, a0);
    _mm256_storeu_ps(lanes + 8, a1);
    mw_sumsq_lanes_scalar(lanes, dt, g, begin, i - begin, end, scale);
    return mw_sumsq_finish(lanes);
}

static void to_bf16(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(dst + i), bf16_rne(_mm256_loadu_ps(src + i)));
    for (; i < n; i++) dst[i] = mw_bf16_rne(src[i]);
}
static void to_f16(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) dst[i] = mw_f16_rne(src[i]);
}
static void from_bf16(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld_bf16(src + i));
    for (; i < n; i++) dst[i] = mw_bf16_f32(src[i]);
}
static void from_f16(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = mw_f16_f32(src[i]);
}

const struct mw_optim_kernels mw_optim_kernels_avx2 = {adamw_avx2, sgd_avx2, touch_avx2, sumsq, to_bf16, to_f16, from_bf16, from_f16};
