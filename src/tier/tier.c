/*
 * tier.c — tier accounting: current/peak bytes, budgets, per-kind totals, trace events.
 *
 * Why atomics and not a lock: allocations come from the pipeline, the I/O completion thread
 * and the model at once; a CAS on the current-bytes word both checks the budget and claims
 * the bytes, so two threads can never jointly overshoot a budget. The memory itself comes from
 * the tier's buffer type (tier_buft.c), which is the part a CUDA backend replaces.
 */
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "tier/tier_impl.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mw_tier {
    enum mw_tier_id id;
    const struct mw_buft_iface *iface;
    void *ctx;
    struct mw_trace *trace;
    _Atomic uint64_t budget;                  /* bytes, 0 = unlimited */
    _Atomic uint64_t current, peak;           /* bytes */
    _Atomic uint64_t n_allocs, n_frees;
    _Atomic uint64_t by_kind[MW_KIND_COUNT];  /* current bytes per kind */
};

static const char *const tier_names[MW_TIER_COUNT] = {[MW_TIER_DRAM] = "host", [MW_TIER_NVME] = "nvme", [MW_TIER_DEVICE] = "device"};
static const char *const kind_names[MW_KIND_COUNT] = {"weights", "grads", "master", "moments",
                                                      "activations", "staging", "other"};

const char *mw_tier_name(enum mw_tier_id id)
{
    return (unsigned)id < MW_TIER_COUNT ? tier_names[id] : "unknown";
}

const char *mw_kind_name(enum mw_alloc_kind k)
{
    return (unsigned)k < MW_KIND_COUNT ? kind_names[k] : "unknown";
}

int mw_tier_init_custom(struct mw_tier **out, enum mw_tier_id id, uint64_t budget,
                        const struct mw_buft_iface *iface, void *ctx, struct mw_trace *trace)
{
    *out = NULL;
    if ((unsigned)id >= MW_TIER_COUNT || !iface || !iface->alloc || !iface->free)
        return mw_error_set(-EINVAL, "tier: invalid tier id %d or buffer type", (int)id);
    struct mw_tier *t = calloc(1, sizeof *t);
    if (!t) return mw_error_set(-ENOMEM, "tier: out of memory");
    t->id = id;
    t->iface = iface;
    t->ctx = ctx;
    t->trace = trace;
    atomic_store(&t->budget, budget);
    mw_trace_set_tier(trace, (int)id, tier_names[id], budget);
    *out = t;
    return 0;
}

int mw_tier_init(struct mw_tier **out, enum mw_tier_id id, uint64_t budget, struct mw_trace *trace)
{
    const struct mw_buft_iface *iface = mw_buft_builtin_(id);
    if (!iface) { *out = NULL; return mw_error_set(-EINVAL, "tier: invalid tier id %d", (int)id); }
    return mw_tier_init_custom(out, id, budget, iface, NULL, trace);
}

void mw_tier_free_tier(struct mw_tier *t)
{
    if (!t) return;
    uint64_t cur = atomic_load(&t->current);
    if (cur) {
        char b[32];
        mw_log(MW_LOG_WARN, "%s tier freed with %s still allocated (a leak in the caller)",
               tier_names[t->id], mw_fmt_bytes(b, sizeof b, cur));
    }
    if (t->iface->free_ctx) t->iface->free_ctx(t->ctx);
    free(t);
}

enum mw_tier_id mw_tier_id(const struct mw_tier *t) { return t->id; }
const char *mw_tier_buft_name(const struct mw_tier *t) { return t->iface->name ? t->iface->name(t->ctx) : "?"; }
int mw_tier_is_host(const struct mw_tier *t) { return t->iface->is_host ? t->iface->is_host(t->ctx) : 1; }

void mw_tier_set_budget(struct mw_tier *t, uint64_t budget)
{
    atomic_store(&t->budget, budget);
    mw_trace_set_tier(t->trace, (int)t->id, tier_names[t->id], budget);
}

void mw_tier_stats(const struct mw_tier *t, struct mw_tier_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!t) return;
    struct mw_tier *m = (struct mw_tier *)t; /* atomics loads on a const object */
    out->current = atomic_load(&m->current);
    out->peak = atomic_load(&m->peak);
    out->budget = atomic_load(&m->budget);
    out->n_allocs = atomic_load(&m->n_allocs);
    out->n_frees = atomic_load(&m->n_frees);
    for (int k = 0; k < MW_KIND_COUNT; k++) out->by_kind[k] = atomic_load(&m->by_kind[k]);
}

void mw_tier_reset_peak(struct mw_tier *t) { atomic_store(&t->peak, atomic_load(&t->current)); }

/* Claims n bytes against the budget; fails with the tier/budget/request message. */
static int account(struct mw_tier *t, uint64_t n, const char *label, uint64_t *after)
{
    uint64_t budget = atomic_load(&t->budget);
    uint64_t cur = atomic_load(&t->current);
    for (;;) {
        if (budget && (n > budget || cur > budget - n)) {
            char bb[32], bc[32], bn[32];
            return mw_error_set(MW_EBUDGET,
                                "%s tier: budget %s, in use %s, request %s for '%s' does not fit",
                                tier_names[t->id], mw_fmt_bytes(bb, sizeof bb, budget),
                                mw_fmt_bytes(bc, sizeof bc, cur), mw_fmt_bytes(bn, sizeof bn, n),
                                label ? label : "?");
        }
        if (atomic_compare_exchange_weak(&t->current, &cur, cur + n)) break;
    }
    *after = cur + n;
    uint64_t pk = atomic_load(&t->peak);
    while (pk < *after && !atomic_compare_exchange_weak(&t->peak, &pk, *after)) {}
    return 0;
}

static void fill_buf(struct mw_buf *b, struct mw_tier *t, size_t bytes, size_t reserved,
                     enum mw_alloc_kind kind, const char *label)
{
    b->bytes = bytes;
    b->reserved = reserved;
    b->tier = t;
    b->kind = kind;
    snprintf(b->label, sizeof b->label, "%s", label ? label : "");
}

int mw_tier_alloc(struct mw_tier *t, size_t bytes, unsigned flags, enum mw_alloc_kind kind,
                  const char *label, struct mw_buf *out)
{
    memset(out, 0, sizeof *out);
    if ((unsigned)kind >= MW_KIND_COUNT) kind = MW_KIND_OTHER;
    if (!bytes) return mw_error_set(-EINVAL, "tier: zero-byte allocation for '%s'", label ? label : "?");
    const struct mw_buft_iface *iface = t ? t->iface : mw_buft_builtin_(MW_TIER_DRAM);
    void *ctx = t ? t->ctx : NULL;
    size_t align = iface->alignment ? iface->alignment(ctx) : MW_PAGE_ALIGN;
    if ((flags & MW_ALLOC_IO) && align < MW_IO_ALIGN) align = MW_IO_ALIGN;
    if (bytes > SIZE_MAX - align) return mw_error_set(-ENOMEM, "tier: request too large");
    size_t rounded = MW_ALIGN_UP(bytes, align);

    uint64_t after = 0;
    if (t) {
        int rc = account(t, rounded, label, &after);
        if (rc) return rc;
    }
    void *p = NULL;
    unsigned bflags = 0;
    int rc = iface->alloc(ctx, rounded, align, flags, &p, &bflags);
    if (rc) {
        if (t) atomic_fetch_sub(&t->current, rounded);
        return rc;
    }
    out->ptr = p;
    out->flags = bflags;
    fill_buf(out, t, bytes, rounded, kind, label);
    if (t) {
        atomic_fetch_add(&t->n_allocs, 1);
        atomic_fetch_add(&t->by_kind[kind], rounded);
        if (t->trace)
            mw_trace_alloc(t->trace, (int)t->id, (int)kind, rounded, mw_trace_intern(t->trace, out->label), after);
    }
    return 0;
}

int mw_tier_reserve(struct mw_tier *t, uint64_t bytes, enum mw_alloc_kind kind, const char *label,
                    struct mw_buf *out)
{
    memset(out, 0, sizeof *out);
    if (!t) return 0;
    if ((unsigned)kind >= MW_KIND_COUNT) kind = MW_KIND_OTHER;
    uint64_t after;
    int rc = account(t, bytes, label, &after);
    if (rc) return rc;
    fill_buf(out, t, (size_t)bytes, (size_t)bytes, kind, label);
    atomic_fetch_add(&t->n_allocs, 1);
    atomic_fetch_add(&t->by_kind[kind], bytes);
    if (t->trace)
        mw_trace_alloc(t->trace, (int)t->id, (int)kind, bytes, mw_trace_intern(t->trace, out->label), after);
    return 0;
}

void mw_tier_free(struct mw_buf *b)
{
    if (!b) return;
    struct mw_tier *t = b->tier;
    if (b->ptr) {
        const struct mw_buft_iface *iface = t ? t->iface : mw_buft_builtin_(MW_TIER_DRAM);
        iface->free(t ? t->ctx : NULL, b->ptr, b->reserved, b->flags);
    }
    if (t && b->reserved) {
        uint64_t after = atomic_fetch_sub(&t->current, b->reserved) - b->reserved;
        atomic_fetch_sub(&t->by_kind[b->kind], b->reserved);
        atomic_fetch_add(&t->n_frees, 1);
        if (t->trace)
            mw_trace_free_event(t->trace, (int)t->id, (int)b->kind, b->reserved,
                                mw_trace_intern(t->trace, b->label), after);
    }
    memset(b, 0, sizeof *b);
}

void mw_tier_copy_in(const struct mw_buf *dst, size_t dst_off, const void *src, size_t bytes)
{
    MW_ASSERT(dst->ptr && dst_off + bytes <= dst->reserved);
    const struct mw_tier *t = dst->tier;
    if (t && t->iface->copy_in) t->iface->copy_in(t->ctx, (char *)dst->ptr + dst_off, src, bytes);
    else memcpy((char *)dst->ptr + dst_off, src, bytes);
}

void mw_tier_copy_out(void *dst, const struct mw_buf *src, size_t src_off, size_t bytes)
{
    MW_ASSERT(src->ptr && src_off + bytes <= src->reserved);
    const struct mw_tier *t = src->tier;
    if (t && t->iface->copy_out) t->iface->copy_out(t->ctx, dst, (const char *)src->ptr + src_off, bytes);
    else memcpy(dst, (const char *)src->ptr + src_off, bytes);
}
