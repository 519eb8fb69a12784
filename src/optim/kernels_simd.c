/*
 * kernels_simd.c — the SIMD kernels (AdamW, SGD, the bandwidth pass, sum of squares,
 * conversions), written once and compiled twice: with MW_VEC_AVX2 (8 lanes) into the table
 * mw_optim_kernels_avx2, and with MW_VEC_AVX512 (16 lanes) into mw_optim_kernels_avx512(),
 * which has two tables, with and without the AVX512-BF16 instruction. simd.c picks one from
 * CPUID at run time; simd_vec.h maps the vector names onto each instruction set.
 *
 * Why one source: the two instruction sets run the same kernels at two widths, and the tests
 * hold every variant to the scalar reference bit for bit (test_optim_simd.c), so two copies
 * could only differ by a bug. Each kernel is the scalar reference's operation sequence
 * (kernels_scalar.c: mul and add apart, IEEE sqrt and div, the bf16/fp16/8-bit rules of
 * optim_internal.h done in integers), so results do not depend on the width.
 *
 * Why always-inlined bodies with the formats as arguments: each format combination is
 * instantiated with constants (the DISPATCH tables at the end), so the inner loop has no
 * per-element switches. Ragged tails (fewer than W elements, or a last Q8 block shorter than
 * MW_Q8_BLOCK) go to the scalar reference, which gives the same bits.
 */
#include "optim/optim_internal.h"
#include "optim/simd_vec.h"

#define AI MW_VEC_AI
#define W MW_VEC_W
#ifndef PF_DIST
#define PF_DIST MW_VEC_PF_DIST /* -DPF_DIST=n to try another distance */
#endif

/* ---- loads and stores of each format */
AI mw_vf ld_bf16(const uint16_t *p) { return mw_vf_of_bits(mw_vi_slli(mw_vi_of_u16(mw_vh_ld(p)), 16)); }

AI mw_vf ld_g(int dt, const void *g, size_t i)
{
    if (dt == MW_OPTIM_BF16) return ld_bf16((const uint16_t *)g + i);
    if (dt == MW_OPTIM_F16) return mw_vf_of_f16(mw_vh_ld((const uint16_t *)g + i));
    return mw_vf_ld((const float *)g + i);
}

/* fp32 -> bf16, RNE, quiet NaN, denormals to +-0 (mw_bf16_rne): the instruction where the
 * table was built for it (hw), else the same in integers. */
AI mw_vh bf16_rne(mw_vf x, int hw)
{
#if MW_VEC_BF16_HW
    if (hw) return mw_vf_to_bf16_hw(x);
#else
    (void)hw;
#endif
    mw_vi u = mw_vi_of_bits(x);
    mw_vm nan = mw_vi_gt(mw_vi_and(u, mw_vi_set1(0x7fffffff)), mw_vi_set1(0x7f800000));
    mw_vm den = mw_vi_testz(u, mw_vi_set1(0x7f800000));
    u = mw_vi_sel(den, mw_vi_and(u, mw_vi_set1(0x80000000u)), u);
    mw_vi odd = mw_vi_and(mw_vi_srli(u, 16), mw_vi_set1(1));
    mw_vi r = mw_vi_srli(mw_vi_add(mw_vi_add(u, mw_vi_set1(0x7fff)), odd), 16);
    mw_vi q = mw_vi_or(mw_vi_srli(u, 16), mw_vi_set1(0x40));
    return mw_vi_pack16(mw_vi_sel(nan, q, r));
}

/* BF16_SR (see mw_sr_hash, mw_bf16_sr): the hash of element indices j0 + lane. */
AI mw_vi sr_hash(uint32_t j0, uint32_t seed)
{
    mw_vi h = mw_vi_xor(mw_vi_add(mw_vi_set1(j0), mw_vi_iota()), mw_vi_set1(seed));
    h = mw_vi_xor(h, mw_vi_srli(h, 16));
    h = mw_vi_mullo(h, mw_vi_set1(0x7feb352d));
    h = mw_vi_xor(h, mw_vi_srli(h, 15));
    h = mw_vi_mullo(h, mw_vi_set1(0x846ca68bu));
    return mw_vi_xor(h, mw_vi_srli(h, 16));
}

AI mw_vh bf16_sr(mw_vf x, mw_vi h) /* rounds with the low 16 bits of h */
{
    mw_vi u = mw_vi_of_bits(x);
    mw_vm nan = mw_vi_gt(mw_vi_and(u, mw_vi_set1(0x7fffffff)), mw_vi_set1(0x7f800000));
    mw_vm den = mw_vi_testz(u, mw_vi_set1(0x7f800000));
    u = mw_vi_sel(den, mw_vi_and(u, mw_vi_set1(0x80000000u)), u);
    mw_vi r = mw_vi_srli(mw_vi_add(u, mw_vi_and(h, mw_vi_set1(0xffff))), 16);
    mw_vi q = mw_vi_or(mw_vi_srli(u, 16), mw_vi_set1(0x40));
    return mw_vi_pack16(mw_vi_sel(nan, q, r));
}

AI mw_vf ld_mom(int dt, const void *p, size_t i)
{
    if (dt == MW_OPTIM_BF16 || dt == MW_OPTIM_BF16_SR) return ld_bf16((const uint16_t *)p + i);
    return mw_vf_ld((const float *)p + i);
}

AI void st_mom(int dt, void *p, size_t i, mw_vf x, int hw, mw_vi h)
{
    if (dt == MW_OPTIM_BF16) mw_vh_st((uint16_t *)p + i, bf16_rne(x, hw));
    else if (dt == MW_OPTIM_BF16_SR) mw_vh_st((uint16_t *)p + i, bf16_sr(x, h));
    else mw_vf_st((float *)p + i, x);
}

AI void st_w(int dt, void *p, size_t i, mw_vf x, int hw)
{
    if (dt == MW_OPTIM_BF16) mw_vh_st((uint16_t *)p + i, bf16_rne(x, hw));
    else if (dt == MW_OPTIM_F16) mw_vh_st((uint16_t *)p + i, mw_vf_to_f16(x));
}

/* ---- 8-bit moment code (see mw_q8_enc_mag / mw_q8_dec_mag); codes are <= 255 */
AI mw_vf q8_dec_mag(mw_vi c, int B)
{
    mw_vm sub = mw_vi_gt(mw_vi_set1(8), c);
    mw_vf s = mw_vf_mul(mw_vf_of_int(c), mw_vf_of_bits(mw_vi_set1((127 - B - 2) << 23)));
    mw_vf nrm = mw_vf_of_bits(mw_vi_slli(mw_vi_add(c, mw_vi_set1((127 - B) << 3)), 20));
    return mw_vf_sel(sub, s, nrm);
}

AI mw_vi q8_enc_mag(mw_vf a, int B)
{
    mw_vm sub = mw_vf_lt(a, mw_vf_of_bits(mw_vi_set1((128 - B) << 23)));
    mw_vf t = mw_vf_mul(a, mw_vf_of_bits(mw_vi_set1((127 + B + 2) << 23)));
    mw_vi cs = mw_vi_sub(mw_vi_of_bits(mw_vf_add(t, mw_vf_set1(8388608.0f))), mw_vi_set1(0x4b000000));
    mw_vi u = mw_vi_of_bits(a);
    mw_vi odd = mw_vi_and(mw_vi_srli(u, 20), mw_vi_set1(1));
    mw_vi cn = mw_vi_srli(mw_vi_add(mw_vi_add(u, mw_vi_set1(0x7ffff)), odd), 20);
    cn = mw_vi_sub(cn, mw_vi_set1((127 - B) << 3));
    return mw_vi_minu(mw_vi_sel(sub, cs, cn), mw_vi_set1(B << 3));
}

AI mw_vi ld_u8(const uint8_t *p) { return mw_vi_of_u8(mw_vq_ld(p)); }

AI mw_vf q8_dec_m(const uint8_t *p)
{
    mw_vi c = ld_u8(p);
    mw_vf a = q8_dec_mag(mw_vi_and(c, mw_vi_set1(0x7f)), MW_Q8_BM);
    mw_vi sign = mw_vi_slli(mw_vi_srli(c, 7), 31);
    return mw_vf_of_bits(mw_vi_or(mw_vi_of_bits(a), sign));
}

AI mw_vf q8_dec_v(const uint8_t *p) { return q8_dec_mag(ld_u8(p), MW_Q8_BV); }

AI void q8_enc_m(uint8_t *p, mw_vf y)
{
    mw_vi u = mw_vi_of_bits(y);
    mw_vi sign = mw_vi_slli(mw_vi_srli(u, 31), 7);
    mw_vf a = mw_vf_of_bits(mw_vi_and(u, mw_vi_set1(0x7fffffff)));
    mw_vq_st(p, mw_vi_pack8(mw_vi_or(q8_enc_mag(a, MW_Q8_BM), sign)));
}

AI void q8_enc_v(uint8_t *p, mw_vf y) { mw_vq_st(p, mw_vi_pack8(q8_enc_mag(y, MW_Q8_BV))); }

/* ---- AdamW */
struct kv { mw_vf gs, b1, c1, b2, c2, decay, ss, isb2, eps; };

AI struct kv kv_of(const struct mw_adamw_k *a)
{
    struct kv c = {mw_vf_set1(a->gscale), mw_vf_set1(a->b1), mw_vf_set1(a->c1),
                   mw_vf_set1(a->b2), mw_vf_set1(a->c2), mw_vf_set1(a->decay),
                   mw_vf_set1(a->step_size), mw_vf_set1(a->isb2), mw_vf_set1(a->eps)};
    return c;
}

AI mw_vf adamw_v(const struct kv *c, mw_vf p, mw_vf graw, mw_vf *m, mw_vf *v)
{
    mw_vf g = mw_vf_mul(graw, c->gs);
    mw_vf mn = mw_vf_add(mw_vf_mul(c->b1, *m), mw_vf_mul(c->c1, g));
    mw_vf gg = mw_vf_mul(g, g);
    mw_vf vn = mw_vf_add(mw_vf_mul(c->b2, *v), mw_vf_mul(c->c2, gg));
    mw_vf d = mw_vf_add(mw_vf_mul(mw_vf_sqrt(vn), c->isb2), c->eps);
    mw_vf u = mw_vf_div(mn, d);
    *m = mn;
    *v = vn;
    return mw_vf_sub(mw_vf_mul(p, c->decay), mw_vf_mul(c->ss, u));
}

AI void adamw_q8(const struct mw_kargs *k, size_t begin, size_t end, int G, int Wo, int hw)
{
    const struct mw_optim_slice *s = &k->s;
    struct kv c = kv_of(&k->a);
    size_t b0 = begin;
    for (; b0 + MW_Q8_BLOCK <= end; b0 += MW_Q8_BLOCK) {
        uint8_t *mq = (uint8_t *)s->m + b0, *vq = (uint8_t *)s->v + b0;
        size_t bi = b0 / MW_Q8_BLOCK;
        mw_vf ms = mw_vf_set1(s->m_scale[bi]), vs = mw_vf_set1(s->v_scale[bi]);
        mw_vf mt[MW_Q8_BLOCK / W], vt[MW_Q8_BLOCK / W];
        mw_vf am = mw_vf_zero(), av = mw_vf_zero();
        for (int j = 0; j < MW_Q8_BLOCK / W; j++) {
            size_t i = b0 + W * (size_t)j;
            mw_vf m = mw_vf_mul(q8_dec_m(mq + W * j), ms);
            mw_vf v = mw_vf_mul(q8_dec_v(vq + W * j), vs);
            mw_vf p = adamw_v(&c, mw_vf_ld(s->master + i), ld_g(G, s->grad, i), &m, &v);
            mw_vf_st(s->master + i, p);
            st_w(Wo, s->weights_out, i, p, hw);
            mt[j] = m;
            vt[j] = v;
            am = mw_vf_max(am, mw_vf_abs(m));
            av = mw_vf_max(av, v);
        }
        float amax = mw_vf_hmax(am), vmax = mw_vf_hmax(av);
        mw_vf im = mw_vf_set1(amax > 0.0f ? 1.0f / amax : 0.0f);
        mw_vf iv = mw_vf_set1(vmax > 0.0f ? 1.0f / vmax : 0.0f);
        for (int j = 0; j < MW_Q8_BLOCK / W; j++) {
            q8_enc_m(mq + W * j, mw_vf_mul(mt[j], im));
            q8_enc_v(vq + W * j, mw_vf_mul(vt[j], iv));
        }
        s->m_scale[bi] = amax;
        s->v_scale[bi] = vmax;
    }
    if (b0 < end) mw_adamw_range_scalar(k, b0, end);
}

/* Software prefetch, PF_DIST elements ahead: is element i where a stream of esz-byte
 * elements gets its next one (MW_VEC_PF_EVERY: the instruction set's rule)? */
#define PF_DUE(i, esz) (MW_VEC_PF_EVERY(esz) <= W || ((i) & (MW_VEC_PF_EVERY(esz) - 1)) == 0)

AI void adamw_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int Wo, int hw)
{
    if (M == MW_OPTIM_Q8) { adamw_q8(k, begin, end, G, Wo, hw); return; }
    const struct mw_optim_slice *s = &k->s;
    struct kv c = kv_of(&k->a);
    size_t i = begin;
    const int msz = mw_esz(M), gsz = G == MW_OPTIM_F32 ? 4 : 2;
    for (; i + W <= end; i += W) {
        /* prefetches never fault, so reaching past `end` is harmless (addresses formed as
         * integers: no out-of-bounds pointer arithmetic) */
        const uintptr_t ahead = (uintptr_t)(i + PF_DIST);
        if (PF_DUE(i, 4)) mw_vec_prefetch((uintptr_t)s->master + ahead * 4);
        if (PF_DUE(i, gsz)) mw_vec_prefetch((uintptr_t)s->grad + ahead * (uintptr_t)gsz);
        if (PF_DUE(i, msz)) {
            mw_vec_prefetch((uintptr_t)s->m + ahead * (uintptr_t)msz);
            mw_vec_prefetch((uintptr_t)s->v + ahead * (uintptr_t)msz);
        }
        mw_vf m = ld_mom(M, s->m, i), v = ld_mom(M, s->v, i);
        mw_vf p = adamw_v(&c, mw_vf_ld(s->master + i), ld_g(G, s->grad, i), &m, &v);
        mw_vf_st(s->master + i, p);
        mw_vi h = M == MW_OPTIM_BF16_SR ? sr_hash(k->off32 + (uint32_t)i, k->seed) : mw_vi_zero();
        st_mom(M, s->m, i, m, hw, h);
        st_mom(M, s->v, i, v, hw, mw_vi_srli(h, 16));
        st_w(Wo, s->weights_out, i, p, hw);
    }
    if (i < end) mw_adamw_range_scalar(k, i, end);
}

/* ---- SGD with momentum */
AI void sgd_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int Wo, int hw)
{
    const struct mw_optim_slice *s = &k->s;
    const struct mw_sgd_k *c = &k->sg;
    mw_vf gs = mw_vf_set1(c->gscale), lr = mw_vf_set1(c->lr);
    mw_vf mu = mw_vf_set1(c->momentum), wd = mw_vf_set1(c->wd);
    size_t i = begin;
    for (; i + W <= end; i += W) {
        mw_vf p = mw_vf_ld(s->master + i);
        mw_vf g = mw_vf_add(mw_vf_mul(ld_g(G, s->grad, i), gs), mw_vf_mul(wd, p));
        mw_vf d = g;
        if (c->use_buf) {
            mw_vf b = mw_vf_add(mw_vf_mul(mu, ld_mom(M, s->m, i)), g);
            st_mom(M, s->m, i, b, hw, mw_vi_zero());
            d = c->nesterov ? mw_vf_add(g, mw_vf_mul(mu, b)) : b;
        }
        p = mw_vf_sub(p, mw_vf_mul(lr, d));
        mw_vf_st(s->master + i, p);
        st_w(Wo, s->weights_out, i, p, hw);
    }
    if (i < end) mw_sgd_range_scalar(k, i, end);
}

/* ---- the bandwidth limit: the same bytes as AdamW of this format, in place, XOR a run-time
 * zero into what is written back; reads of the gradients are folded into an accumulator. */
AI mw_vi rw(void *a, size_t i, int esz, mw_vi z) /* W elements of esz bytes at index i */
{
    char *p = (char *)a + i * (size_t)esz;
    if (esz == 4) { mw_vi x = mw_vi_xor(mw_vi_ld(p), z); mw_vi_st(p, x); return x; }
    if (esz == 2) { mw_vh x = mw_vh_xor(mw_vh_ld(p), mw_vi_lo_vh(z)); mw_vh_st(p, x); return mw_vi_of_vh(x); }
    mw_vq x = mw_vq_xor(mw_vq_ld(p), mw_vi_lo_vq(z));
    mw_vq_st(p, x);
    return mw_vi_of_vq(x);
}

AI mw_vi rd(const void *a, size_t i, int esz) /* gradients: esz 4 or 2 */
{
    const char *p = (const char *)a + i * (size_t)esz;
    if (esz == 4) return mw_vi_ld(p);
    return mw_vi_of_vh(mw_vh_ld(p));
}

AI void touch_body(const struct mw_kargs *k, size_t begin, size_t end, int G, int M, int Wo, int hw)
{
    (void)hw;
    const struct mw_optim_slice *s = &k->s;
    const int gs = G == MW_OPTIM_F32 ? 4 : 2, ms = mw_esz(M);
    mw_vi z = mw_vi_set1(mw_optim_zero), acc = mw_vi_zero();
    size_t i = begin;
    for (; i + W <= end; i += W) {
        mw_vi p = rw(s->master, i, 4, z);
        acc = mw_vi_add(acc, rd(s->grad, i, gs));
        rw(s->m, i, ms, z);
        rw(s->v, i, ms, z);
        if (M == MW_OPTIM_Q8 && (i % MW_Q8_BLOCK) == 0) {
            s->m_scale[i / MW_Q8_BLOCK] += 0.0f * (float)mw_optim_zero;
            s->v_scale[i / MW_Q8_BLOCK] += 0.0f * (float)mw_optim_zero;
        }
        if (Wo != MW_OPTIM_NONE) mw_vh_st((uint16_t *)s->weights_out + i, mw_vi_lo16(p));
    }
    uint32_t l[W];
    mw_vi_st(l, acc);
    volatile uint32_t sink = l[0] ^ l[W - 1];   /* keeps the reads of grad */
    (void)sink;
    if (i < end) mw_touch_range_scalar(k, i, end);
}

/* ---- instantiation per format combination (Wo: the weight copy's format) */
#define C3(fn, g, m, hw) \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && Wo == MW_OPTIM_NONE) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_NONE, hw); return; } \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && Wo == MW_OPTIM_BF16) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_BF16, hw); return; } \
    if (G == MW_OPTIM_##g && M == MW_OPTIM_##m && Wo == MW_OPTIM_F16) { fn(k, b, e, MW_OPTIM_##g, MW_OPTIM_##m, MW_OPTIM_F16, hw); return; }
#define CM(fn, m, hw) C3(fn, F32, m, hw) C3(fn, BF16, m, hw) C3(fn, F16, m, hw)
#define DISPATCH(name, fn, hw, scalar)                                                   \
    static void name(const struct mw_kargs *k, size_t b, size_t e)                       \
    {                                                                                    \
        const int G = k->fmt.grad, M = k->fmt.moments, Wo = k->fmt.weights_out;          \
        CM(fn, F32, hw) CM(fn, BF16, hw) CM(fn, Q8, hw) CM(fn, BF16_SR, hw)              \
        scalar(k, b, e);                                                                 \
    }
#define ENTRY(f) MW_VEC_NAME(f) /* adamw_emu_avx2, ...: the two builds' functions told apart */
DISPATCH(ENTRY(adamw_emu), adamw_body, 0, mw_adamw_range_scalar)
DISPATCH(ENTRY(sgd_emu), sgd_body, 0, mw_sgd_range_scalar)
DISPATCH(ENTRY(touch), touch_body, 0, mw_touch_range_scalar)
#if MW_VEC_BF16_HW
DISPATCH(ENTRY(adamw_hw), adamw_body, 1, mw_adamw_range_scalar)
DISPATCH(ENTRY(sgd_hw), sgd_body, 1, mw_sgd_range_scalar)
#endif

/* ---- sum of squares (the scalar lane rule: element i of the tile to lane i % 16, held in
 * 16 / W vectors) and conversions */
#define NACC (16 / W)
static double ENTRY(sumsq)(enum mw_optim_dtype dt, const void *g, size_t begin, size_t end, float scale)
{
    mw_vf acc[NACC], sc = mw_vf_set1(scale);
    for (int a = 0; a < NACC; a++) acc[a] = mw_vf_zero();
    size_t i = begin;
#define SUMSQ_LOOP(D) for (; i + 16 <= end; i += 16) {                                    \
        mw_vf x[NACC];                                                                     \
        for (int a = 0; a < NACC; a++) x[a] = mw_vf_mul(ld_g(D, g, i + (size_t)a * W), sc); \
        for (int a = 0; a < NACC; a++) acc[a] = mw_vf_add(acc[a], mw_vf_mul(x[a], x[a])); }
    if (dt == MW_OPTIM_BF16) SUMSQ_LOOP(MW_OPTIM_BF16)
    else if (dt == MW_OPTIM_F16) SUMSQ_LOOP(MW_OPTIM_F16)
    else SUMSQ_LOOP(MW_OPTIM_F32)
    float lanes[16];
    for (int a = 0; a < NACC; a++) mw_vf_st(lanes + a * W, acc[a]);
    mw_sumsq_lanes_scalar(lanes, dt, g, begin, i - begin, end, scale);
    return mw_sumsq_finish(lanes);
}

AI void to_bf16(const float *src, uint16_t *dst, size_t n, int hw)
{
    size_t i = 0;
    for (; i + W <= n; i += W) mw_vh_st(dst + i, bf16_rne(mw_vf_ld(src + i), hw));
    for (; i < n; i++) dst[i] = mw_bf16_rne(src[i]);
}
static void ENTRY(to_bf16_emu)(const float *s, uint16_t *d, size_t n) { to_bf16(s, d, n, 0); }

static void ENTRY(to_f16)(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + W <= n; i += W) mw_vh_st(dst + i, mw_vf_to_f16(mw_vf_ld(src + i)));
    for (; i < n; i++) dst[i] = mw_f16_rne(src[i]);
}
static void ENTRY(from_bf16)(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + W <= n; i += W) mw_vf_st(dst + i, ld_bf16(src + i));
    for (; i < n; i++) dst[i] = mw_bf16_f32(src[i]);
}
static void ENTRY(from_f16)(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + W <= n; i += W) mw_vf_st(dst + i, mw_vf_of_f16(mw_vh_ld(src + i)));
    for (; i < n; i++) dst[i] = mw_f16_f32(src[i]);
}

/* ---- the tables simd.c asks for, under each instruction set's name */
#define TABLE(adamw_fn, sgd_fn, to_bf16_fn)                                                        \
    {ENTRY(adamw_fn), ENTRY(sgd_fn), ENTRY(touch), ENTRY(sumsq), ENTRY(to_bf16_fn), ENTRY(to_f16), \
     ENTRY(from_bf16), ENTRY(from_f16)}
#if defined(MW_VEC_AVX2)
const struct mw_optim_kernels mw_optim_kernels_avx2 = TABLE(adamw_emu, sgd_emu, to_bf16_emu);
#else
static void ENTRY(to_bf16_hw)(const float *s, uint16_t *d, size_t n) { to_bf16(s, d, n, 1); }
static const struct mw_optim_kernels k_hw = TABLE(adamw_hw, sgd_hw, to_bf16_hw);
static const struct mw_optim_kernels k_emu = TABLE(adamw_emu, sgd_emu, to_bf16_emu);

const struct mw_optim_kernels *mw_optim_kernels_avx512(int has_bf16) { return has_bf16 ? &k_hw : &k_emu; }
#endif
