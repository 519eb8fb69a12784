/*
 * optim_state.h — test helper: one slice's arrays for a format, deterministic contents,
 * copy and bitwise comparison. Shared by the optimizer tests.
 */
#ifndef MEMWALL_TESTS_OPTIM_STATE_H
#define MEMWALL_TESTS_OPTIM_STATE_H

#include "memwall/optim.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>

struct ost {
    struct mw_optim_format f;
    size_t n;
    float *master;
    void *grad, *m, *v, *w;
    float *ms, *vs;
};

static inline void *ost_alloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    REQUIRE(p);
    return p;
}

static inline void ost_init(struct ost *s, const struct mw_optim_format *f, size_t n)
{
    s->f = *f;
    s->n = n;
    s->master = ost_alloc(4 * n);
    s->grad = ost_alloc(mw_optim_array_bytes(f->grad, n));
    s->m = ost_alloc(mw_optim_array_bytes(f->moments, n));
    s->v = ost_alloc(mw_optim_array_bytes(f->moments, n));
    s->w = ost_alloc(mw_optim_array_bytes(f->weights_out, n));
    s->ms = ost_alloc(mw_optim_scale_bytes(f->moments, n));
    s->vs = ost_alloc(mw_optim_scale_bytes(f->moments, n));
}

static inline void ost_free(struct ost *s)
{
    free(s->master); free(s->grad); free(s->m); free(s->v); free(s->w); free(s->ms); free(s->vs);
}

/* Stores x into element i of an array of format dt (moments: fp32/bf16 only). */
static inline void ost_put(enum mw_optim_dtype dt, void *a, size_t i, float x)
{
    if (dt == MW_OPTIM_F32) ((float *)a)[i] = x;
    else if (dt == MW_OPTIM_BF16 || dt == MW_OPTIM_BF16_SR) ((uint16_t *)a)[i] = mw_f32_to_bf16(x);
    else if (dt == MW_OPTIM_F16) ((uint16_t *)a)[i] = mw_f32_to_f16(x);
}

static inline float ost_get(enum mw_optim_dtype dt, const void *a, size_t i)
{
    if (dt == MW_OPTIM_F32) return ((const float *)a)[i];
    if (dt == MW_OPTIM_BF16 || dt == MW_OPTIM_BF16_SR) return mw_bf16_to_f32(((const uint16_t *)a)[i]);
    return mw_f16_to_f32(((const uint16_t *)a)[i]);
}

/* Random master in [-1, 1), gradients of magnitude ~gmag, moments (fp32/bf16) plausible. */
static inline void ost_fill(struct ost *s, uint64_t seed, float gmag)
{
    uint64_t r = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < s->n; i++) {
        s->master[i] = tu_randf(&r);
        ost_put(s->f.grad, s->grad, i, gmag * tu_randf(&r));
        if (s->f.moments != MW_OPTIM_Q8) {
            float g = gmag * tu_randf(&r);
            ost_put(s->f.moments, s->m, i, 0.1f * g);
            ost_put(s->f.moments, s->v, i, 0.01f * g * g);
        }
    }
}

static inline void ost_regrad(struct ost *s, uint64_t seed, float gmag)
{
    uint64_t r = seed * 0x9e3779b97f4a7c15ull + 7;
    for (size_t i = 0; i < s->n; i++) ost_put(s->f.grad, s->grad, i, gmag * tu_randf(&r));
}

static inline void ost_copy(struct ost *d, const struct ost *s)
{
    const struct mw_optim_format *f = &s->f;
    memcpy(d->master, s->master, 4 * s->n);
    memcpy(d->grad, s->grad, mw_optim_array_bytes(f->grad, s->n));
    memcpy(d->m, s->m, mw_optim_array_bytes(f->moments, s->n));
    memcpy(d->v, s->v, mw_optim_array_bytes(f->moments, s->n));
    memcpy(d->w, s->w, mw_optim_array_bytes(f->weights_out, s->n));
    memcpy(d->ms, s->ms, mw_optim_scale_bytes(f->moments, s->n));
    memcpy(d->vs, s->vs, mw_optim_scale_bytes(f->moments, s->n));
}

/* The slice of elements [off, off+len) of s. */
static inline struct mw_optim_slice ost_slice(const struct ost *s, size_t off, size_t len)
{
    const struct mw_optim_format *f = &s->f;
    struct mw_optim_slice sl = {0};
    sl.n = len;
    sl.offset = off;
    sl.master = s->master + off;
    sl.grad = (const char *)s->grad + mw_optim_array_bytes(f->grad, off);
    sl.m = (char *)s->m + mw_optim_array_bytes(f->moments, off);
    sl.v = (char *)s->v + mw_optim_array_bytes(f->moments, off);
    sl.m_scale = f->moments == MW_OPTIM_Q8 ? s->ms + off / MW_Q8_BLOCK : NULL;
    sl.v_scale = f->moments == MW_OPTIM_Q8 ? s->vs + off / MW_Q8_BLOCK : NULL;
    sl.weights_out = f->weights_out != MW_OPTIM_NONE ? (char *)s->w + mw_optim_array_bytes(f->weights_out, off) : NULL;
    return sl;
}

/* First index where two states differ bitwise (in any array), or -1. *what names the array. */
static inline long ost_diff(const struct ost *a, const struct ost *b, const char **what)
{
    const struct mw_optim_format *f = &a->f;
    size_t n = a->n;
    struct { const char *name; const void *x, *y; size_t esz, cnt; } arr[] = {
        {"master", a->master, b->master, 4, n},
        {"m", a->m, b->m, mw_optim_array_bytes(f->moments, 1), n},
        {"v", a->v, b->v, mw_optim_array_bytes(f->moments, 1), n},
        {"weights_out", a->w, b->w, mw_optim_array_bytes(f->weights_out, 1), n},
        {"m_scale", a->ms, b->ms, 4, mw_optim_scale_bytes(f->moments, n) / 4},
        {"v_scale", a->vs, b->vs, 4, mw_optim_scale_bytes(f->moments, n) / 4},
    };
    for (size_t k = 0; k < sizeof arr / sizeof arr[0]; k++) {
        if (!arr[k].esz) continue;
        for (size_t i = 0; i < arr[k].cnt; i++)
            if (memcmp((const char *)arr[k].x + i * arr[k].esz, (const char *)arr[k].y + i * arr[k].esz, arr[k].esz)) {
                *what = arr[k].name;
                return (long)i;
            }
    }
    *what = "";
    return -1;
}

#endif
