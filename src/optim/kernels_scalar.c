/*
 * kernels_scalar.c — the reference kernels: one plain loop per optimizer, written as the
 * exact sequence of float operations that every SIMD variant repeats (mul and add kept
 * apart, no FMA: the compiler cannot contract them here because this file is built without
 * -mfma and as ISO C, and the SIMD files call the same operations by intrinsics). Formats
 * are switched per element; this file is the definition, not the fast path.
 */
#include "optim/optim_internal.h"

#include <math.h>

static inline float load_g(enum mw_optim_dtype dt, const void *g, size_t i)
{
    switch (dt) {
    case MW_OPTIM_BF16: return mw_bf16_f32(((const uint16_t *)g)[i]);
    case MW_OPTIM_F16: return mw_f16_f32(((const uint16_t *)g)[i]);
    default: return ((const float *)g)[i];
    }
}

static inline float load_mom(enum mw_optim_dtype dt, const void *p, size_t i)
{
    if (dt == MW_OPTIM_BF16 || dt == MW_OPTIM_BF16_SR) return mw_bf16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* r: BF16_SR random bits (low 16 used) */
static inline void store_mom(enum mw_optim_dtype dt, void *p, size_t i, float x, uint32_t r)
{
    if (dt == MW_OPTIM_BF16) ((uint16_t *)p)[i] = mw_bf16_rne(x);
    else if (dt == MW_OPTIM_BF16_SR) ((uint16_t *)p)[i] = mw_bf16_sr(x, r);
    else ((float *)p)[i] = x;
}

static inline void store_w(enum mw_optim_dtype dt, void *p, size_t i, float x)
{
    if (dt == MW_OPTIM_BF16) ((uint16_t *)p)[i] = mw_bf16_rne(x);
    else if (dt == MW_OPTIM_F16) ((uint16_t *)p)[i] = mw_f16_rne(x);
}

/* The AdamW element update; returns the new master weight. */
static inline float adamw_elem(const struct mw_adamw_k *a, float p, float graw, float *m, float *v)
{
    float g = graw * a->gscale;
    float mn = a->b1 * *m + a->c1 * g;
    float gg = g * g;
    float vn = a->b2 * *v + a->c2 * gg;
    float d = sqrtf(vn) * a->isb2 + a->eps;
    float u = mn / d;
    *m = mn;
    *v = vn;
    return p * a->decay - a->step_size * u;
}

static void adamw_q8_block(const struct mw_kargs *k, size_t b0, size_t len)
{
    const struct mw_optim_slice *s = &k->s;
    uint8_t *mq = (uint8_t *)s->m + b0, *vq = (uint8_t *)s->v + b0;
    size_t bi = b0 / MW_Q8_BLOCK;
    float ms = s->m_scale[bi], vs = s->v_scale[bi];
    float mt[MW_Q8_BLOCK], vt[MW_Q8_BLOCK];
    float am = 0.0f, av = 0.0f;
    for (size_t i = 0; i < len; i++) {
        float m = mw_q8_dec_m(mq[i]) * ms;
        float v = mw_q8_dec_v(vq[i]) * vs;
        float p = adamw_elem(&k->a, s->master[b0 + i], load_g(k->fmt.grad, s->grad, b0 + i), &m, &v);
        s->master[b0 + i] = p;
        store_w(k->fmt.weights_out, s->weights_out, b0 + i, p);
        mt[i] = m;
        vt[i] = v;
        float fm = fabsf(m);
        am = fm > am ? fm : am;
        av = v > av ? v : av;
    }
    float im = am > 0.0f ? 1.0f / am : 0.0f;
    float iv = av > 0.0f ? 1.0f / av : 0.0f;
    for (size_t i = 0; i < len; i++) {
        mq[i] = mw_q8_enc_m(mt[i] * im);
        vq[i] = mw_q8_enc_v(vt[i] * iv);
    }
    s->m_scale[bi] = am;
    s->v_scale[bi] = av;
}

void mw_adamw_range_scalar(const struct mw_kargs *k, size_t begin, size_t end)
{
    const struct mw_optim_slice *s = &k->s;
    const struct mw_optim_format *f = &k->fmt;
    if (f->moments == MW_OPTIM_Q8) {
        for (size_t b = begin; b < end; b += MW_Q8_BLOCK)
            adamw_q8_block(k, b, MW_MIN_SZ(MW_Q8_BLOCK, end - b));
        return;
    }
    for (size_t i = begin; i < end; i++) {
        float m = load_mom(f->moments, s->m, i), v = load_mom(f->moments, s->v, i);
        float p = adamw_elem(&k->a, s->master[i], load_g(f->grad, s->grad, i), &m, &v);
        s->master[i] = p;
        uint32_t r = f->moments == MW_OPTIM_BF16_SR ? mw_sr_hash(k->off32 + (uint32_t)i, k->seed) : 0;
        store_mom(f->moments, s->m, i, m, r);
        store_mom(f->moments, s->v, i, v, r >> 16);
        store_w(f->weights_out, s->weights_out, i, p);
    }
}

void mw_sgd_range_scalar(const struct mw_kargs *k, size_t begin, size_t end)
{
    const struct mw_optim_slice *s = &k->s;
    const struct mw_optim_format *f = &k->fmt;
    const struct mw_sgd_k *c = &k->sg;
    for (size_t i = begin; i < end; i++) {
        float p = s->master[i];
        float g = load_g(f->grad, s->grad, i) * c->gscale;
        float wp = c->wd * p;
        g = g + wp;
        float d = g;
        if (c->use_buf) {
            float bm = c->momentum * load_mom(f->moments, s->m, i);
            float b = bm + g;
            store_mom(f->moments, s->m, i, b, 0);
            if (c->nesterov) { float nb = c->momentum * b; d = g + nb; }
            else d = b;
        }
        float step = c->lr * d;
        p = p - step;
        s->master[i] = p;
        store_w(f->weights_out, s->weights_out, i, p);
    }
}

volatile uint32_t mw_optim_zero;

/* XOR z into bytes [b, e) of an array of elements of esz bytes (in place). */
static void xor_bytes(void *a, size_t esz, size_t b, size_t e, uint32_t z)
{
    if (esz == 4) for (size_t i = b; i < e; i++) ((uint32_t *)a)[i] ^= z;
    else if (esz == 2) for (size_t i = b; i < e; i++) ((uint16_t *)a)[i] ^= (uint16_t)z;
    else if (esz == 1) for (size_t i = b; i < e; i++) ((uint8_t *)a)[i] ^= (uint8_t)z;
}

void mw_touch_range_scalar(const struct mw_kargs *k, size_t begin, size_t end)
{
    const struct mw_optim_slice *s = &k->s;
    const struct mw_optim_format *f = &k->fmt;
    uint32_t z = mw_optim_zero, acc = 0;
    size_t gs = (size_t)mw_esz(f->grad), ms = (size_t)mw_esz(f->moments);
    xor_bytes(s->master, 4, begin, end, z);
    for (size_t i = begin * gs; i < end * gs; i++) acc += ((const uint8_t *)s->grad)[i];
    xor_bytes(s->m, ms, begin, end, z);
    xor_bytes(s->v, ms, begin, end, z);
    if (f->moments == MW_OPTIM_Q8) {
        size_t b0 = begin / MW_Q8_BLOCK, b1 = (end + MW_Q8_BLOCK - 1) / MW_Q8_BLOCK;
        xor_bytes(s->m_scale, 4, b0, b1, z);
        xor_bytes(s->v_scale, 4, b0, b1, z);
    }
    size_t ws = (size_t)mw_esz(f->weights_out);
    for (size_t i = begin; i < end && ws; i++) {
        if (ws == 2) ((uint16_t *)s->weights_out)[i] = (uint16_t)(s->master[i] != 0.0f);
    }
    volatile uint32_t sink = acc;                 /* keeps the reads of grad */
    (void)sink;
}

void mw_sumsq_lanes_scalar(float lanes[16], enum mw_optim_dtype dt, const void *g,
                           size_t begin, size_t i, size_t end, float scale)
{
    for (size_t j = begin + i; j < end; j++) {
        float x = load_g(dt, g, j) * scale;
        float sq = x * x;
        lanes[(j - begin) & 15] = lanes[(j - begin) & 15] + sq;
    }
}

double mw_sumsq_finish(const float lanes[16])
{
    double s = 0.0;
    for (int l = 0; l < 16; l++) s += (double)lanes[l];
    return s;
}

static double sumsq_scalar(enum mw_optim_dtype dt, const void *g, size_t begin, size_t end, float scale)
{
    float lanes[16] = {0};
    mw_sumsq_lanes_scalar(lanes, dt, g, begin, 0, end, scale);
    return mw_sumsq_finish(lanes);
}

static void f32_to_bf16_scalar(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mw_bf16_rne(src[i]);
}
static void f32_to_f16_scalar(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mw_f16_rne(src[i]);
}
static void bf16_to_f32_scalar(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mw_bf16_f32(src[i]);
}
static void f16_to_f32_scalar(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = mw_f16_f32(src[i]);
}

const struct mw_optim_kernels mw_optim_kernels_scalar = {
    .adamw = mw_adamw_range_scalar,
    .sgd = mw_sgd_range_scalar,
    .touch = mw_touch_range_scalar,
    .sumsq = sumsq_scalar,
    .f32_to_bf16 = f32_to_bf16_scalar,
    .f32_to_f16 = f32_to_f16_scalar,
    .bf16_to_f32 = bf16_to_f32_scalar,
    .f16_to_f32 = f16_to_f32_scalar,
};
