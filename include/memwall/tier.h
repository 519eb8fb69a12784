/*
 * memwall/tier.h — memory tiers: device, host DRAM and NVMe, each with exact byte accounting.
 *
 * Why: the whole point of memwall is to place training state where it fits. That needs every
 * tier to know, at any moment, how many bytes it holds (current and peak) and to refuse an
 * allocation past a capacity budget with an error that says which tier, which budget and which
 * request — before the run is half way through.
 *
 * A tier is an accounting object (current/peak counters, budget, trace hook) plus a buffer type:
 * a small table of function pointers and a context, shaped like ggml's buffer-type interface, so
 * that a CUDA backend can later replace the emulated device arena without touching callers.
 *
 *   host   page-aligned buffers (usable for O_DIRECT), mlock'ed when RLIMIT_MEMLOCK allows
 *          (one log line when it does not). With MW_ALLOC_IO: 2 MiB-aligned and
 *          madvise(MADV_HUGEPAGE), because the virtual disk splits requests whose buffers span
 *          many 4 KiB pages (see docs/io.md for the measurement).
 *   device an accounting arena for now: memory comes from the host (aligned_alloc) through its
 *          buffer type; is_host() says 1. A real accelerator backend supplies its own iface.
 *   nvme   accounting only (mw_tier_reserve / mw_tier_release); the bytes live in the NVMe store.
 *
 * Threading: all functions are thread-safe; counters are atomics (peak via a CAS loop).
 *
 * Usage:
 *   struct mw_tier *host;
 *   mw_tier_init(&host, MW_TIER_DRAM, 8ull << 30, trace);           // 8 GiB budget
 *   struct mw_buf b;
 *   int rc = mw_tier_alloc(host, 64 << 20, MW_ALLOC_IO, MW_KIND_STAGING, "sg17 staging", &b);
 *   if (rc) ... mw_error_msg() says "host tier: budget 8.00 GiB, in use ..., request ..." ...
 *   mw_tier_free(&b);
 *   mw_tier_free_tier(host);
 */
#ifndef MEMWALL_TIER_H
#define MEMWALL_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mw_trace; /* memwall/trace.h */

/* The tier ids are core's enum mw_tier_id (memwall/common.h): DRAM ("host" here), NVMe, device. */

/* What an allocation is for (shown in the trace and the report). */
enum mw_alloc_kind {
    MW_KIND_WEIGHTS = 0,
    MW_KIND_GRADS,
    MW_KIND_MASTER,      /* fp32 master copy of the parameters */
    MW_KIND_MOMENTS,     /* Adam exp_avg / exp_avg_sq */
    MW_KIND_ACTIVATIONS,
    MW_KIND_STAGING,     /* I/O and transfer buffers */
    MW_KIND_OTHER,
    MW_KIND_COUNT,
};

const char *mw_tier_name(enum mw_tier_id id);       /* "device", "host", "nvme" */
const char *mw_kind_name(enum mw_alloc_kind kind);  /* "weights", "grads", ... */

/* Allocation flags. */
enum {
    MW_ALLOC_IO = 1u << 0,      /* 2 MiB-aligned, size rounded up to 2 MiB, MADV_HUGEPAGE (host) */
    MW_ALLOC_NO_HUGE = 1u << 1, /* with MW_ALLOC_IO: keep the 2 MiB alignment, skip MADV_HUGEPAGE */
    MW_ALLOC_NO_LOCK = 1u << 2, /* do not mlock (host) */
    MW_ALLOC_ZERO = 1u << 3,    /* zero-fill */
    MW_ALLOC_HUGE = 1u << 4,    /* host: MADV_HUGEPAGE without MW_ALLOC_IO's alignment and rounding (large
                                 * arrays streamed by the kernels: fewer TLB misses, 5-10 % on the update) */
};

/* Flags reported back in mw_buf.flags. */
enum {
    MW_BUF_LOCKED = 1u << 0, /* mlock succeeded */
    MW_BUF_HUGE = 1u << 1,   /* MADV_HUGEPAGE was applied */
};

/*
 * Buffer type (ggml-style): how a tier gets and returns memory. All entries take the context
 * given at mw_tier_init_custom. Entries marked (optional) may be NULL, with the stated default.
 */
struct mw_buft_iface {
    const char *(*name)(void *ctx);
    /* Allocate bytes (already rounded to the alignment) with at least `align` alignment.
     * flags are MW_ALLOC_*; *out_flags receives MW_BUF_*. Returns 0 or -errno
     * (with mw_error_set). */
    int (*alloc)(void *ctx, size_t bytes, size_t align, unsigned flags, void **out, unsigned *out_flags);
    void (*free)(void *ctx, void *ptr, size_t bytes, unsigned buf_flags);
    /* (optional) minimum alignment in bytes; default 4096. */
    size_t (*alignment)(void *ctx);
    /* (optional) 1 when the CPU may dereference the memory; default 1. */
    int (*is_host)(void *ctx);
    /* (optional) copy host memory into / out of a buffer of this type; default memcpy. */
    void (*copy_in)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*copy_out)(void *ctx, void *host_dst, const void *src, size_t bytes);
    /* (optional) release the context at mw_tier_free_tier. */
    void (*free_ctx)(void *ctx);
};

struct mw_tier; /* opaque */

/* One allocation. Caller-owned; filled by mw_tier_alloc, emptied by mw_tier_free. */
struct mw_buf {
    void *ptr;                 /* NULL for accounting-only reservations */
    size_t bytes;              /* bytes requested */
    size_t reserved;           /* bytes counted against the tier (rounded up to the alignment) */
    struct mw_tier *tier;
    enum mw_alloc_kind kind;
    unsigned flags;            /* MW_BUF_* */
    char label[48];            /* what it is for, e.g. "sg17.exp_avg" (truncated copy) */
};

struct mw_tier_stats {
    uint64_t current;          /* bytes now allocated or reserved */
    uint64_t peak;             /* highest `current` since init or mw_tier_reset_peak */
    uint64_t budget;           /* bytes; 0 = unlimited */
    uint64_t n_allocs;         /* allocations + reservations made so far */
    uint64_t n_frees;
    uint64_t by_kind[MW_KIND_COUNT]; /* current bytes per kind */
};

/* A tier with its built-in buffer type (host: page-aligned/mlock/THP; device: emulated arena;
 * nvme: accounting only, mw_tier_alloc fails with -EINVAL — use mw_tier_reserve).
 * budget: bytes, 0 = unlimited. trace may be NULL; the tier registers itself (name, budget)
 * in the trace metadata and records every alloc/free. */
int mw_tier_init(struct mw_tier **out, enum mw_tier_id id, uint64_t budget, struct mw_trace *trace);
/* A tier with a caller-supplied buffer type (e.g. a CUDA device). iface must outlive the tier. */
int mw_tier_init_custom(struct mw_tier **out, enum mw_tier_id id, uint64_t budget,
                        const struct mw_buft_iface *iface, void *ctx, struct mw_trace *trace);
/* Frees the tier object (not outstanding buffers: those are a caller bug, logged once). */
void mw_tier_free_tier(struct mw_tier *t);

enum mw_tier_id mw_tier_id(const struct mw_tier *t);
const char *mw_tier_buft_name(const struct mw_tier *t);
int mw_tier_is_host(const struct mw_tier *t);
void mw_tier_set_budget(struct mw_tier *t, uint64_t budget);   /* bytes, 0 = unlimited */
void mw_tier_stats(const struct mw_tier *t, struct mw_tier_stats *out);
void mw_tier_reset_peak(struct mw_tier *t);

/*
 * Allocate `bytes` on tier t (t == NULL: an untracked host allocation with the same alignment
 * rules, for tools and tests). The budget is checked against the rounded size first; past the
 * budget it returns MW_EBUDGET with "<tier> tier: budget X GiB, in use Y GiB, request Z GiB for
 * '<label>'" in mw_error_msg(). On failure *out is zeroed.
 */
int mw_tier_alloc(struct mw_tier *t, size_t bytes, unsigned flags, enum mw_alloc_kind kind,
                  const char *label, struct mw_buf *out);
/* Frees and uncounts b (NULL or an empty buf is a no-op); leaves *b zeroed. */
void mw_tier_free(struct mw_buf *b);

/* Accounting only (nvme tier, or memory owned elsewhere): count bytes against the budget
 * without allocating. out->ptr is NULL. Release with mw_tier_free. */
int mw_tier_reserve(struct mw_tier *t, uint64_t bytes, enum mw_alloc_kind kind, const char *label,
                    struct mw_buf *out);

/* Copy host memory into/out of a buffer of this tier (through the buffer type). */
void mw_tier_copy_in(const struct mw_buf *dst, size_t dst_off, const void *src, size_t bytes);
void mw_tier_copy_out(void *dst, const struct mw_buf *src, size_t src_off, size_t bytes);

/* The 2 MiB alignment used for I/O buffers. */
#define MW_IO_ALIGN ((size_t)2 << 20)
/* The page alignment used for host buffers (O_DIRECT needs 4096). */
#define MW_PAGE_ALIGN ((size_t)4096)

#ifdef __cplusplus
}
#endif
#endif
