/*
 * memwall/common.h — conventions shared by every subsystem.
 *
 * Errors: library functions return 0 on success and a negative errno-style code on
 * failure (like liburing: -EINVAL, -ENOSPC, -EIO, ...). They never print and never exit.
 * The human-readable "what went wrong and what to do" goes into a per-thread message
 * buffer (mw_error_set / mw_error_msg) that the CLI prints. memwall-specific failures use
 * the MW_E* codes below, which sit outside the errno range.
 *
 * Logging: the few one-time notices the library must give (mlock refused, O_DIRECT
 * unavailable) go through mw_log(), whose sink the CLI or a test may replace.
 *
 * Units: sizes are bytes (size_t / uint64_t); times are nanoseconds from mw_now_ns()
 * (CLOCK_MONOTONIC). Human output uses GiB = 2^30 and GB = 10^9, never mixed.
 */
#ifndef MEMWALL_COMMON_H
#define MEMWALL_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* memwall-specific error codes (negative, beyond any errno). */
enum {
    MW_EBUDGET   = -10001, /* an allocation would exceed a tier's capacity budget */
    MW_ECHECKSUM = -10002, /* a crc32c mismatch on read */
    MW_EFORMAT   = -10003, /* a malformed or truncated file */
    MW_EOVERFLOW = -10004, /* inf/NaN found in gradients (step skipped) */
};

/* A short name for an error code ("ENOSPC: No space left on device", "budget exceeded", ...). */
const char *mw_strerror(int err);

/* Per-thread detailed message of the last failure. mw_error_set formats it; it returns err
 * so that `return mw_error_set(-EIO, "...")` reads naturally. */
int mw_error_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *mw_error_msg(void);
/* Puts prefix in front of this thread's message (context added by a caller); returns err. */
int mw_error_prepend(int err, const char *prefix);
void mw_error_clear(void);

/* Logging. */
enum mw_log_level { MW_LOG_DEBUG = 0, MW_LOG_INFO = 1, MW_LOG_WARN = 2, MW_LOG_ERROR = 3 };
typedef void (*mw_log_fn)(enum mw_log_level level, const char *msg, void *user);
void mw_log(enum mw_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Replace the sink (NULL restores the default: stderr, WARN and above). */
void mw_log_set(mw_log_fn fn, void *user);
void mw_log_set_level(enum mw_log_level min_level);

/* Monotonic clock in nanoseconds. */
uint64_t mw_now_ns(void);

/* Formatting helpers for human output: "1.50 GiB", "2.41 GB/s". buf needs >= 32 bytes. */
const char *mw_fmt_bytes(char *buf, size_t n, uint64_t bytes);
/* A memory figure of this process from /proc/self/status, in bytes: field "VmRSS" (resident
 * now) or "VmHWM" (peak resident set); 0 when unavailable. */
uint64_t mw_proc_mem(const char *field);
/* A "Field: N kB" line of a /proc file (status, meminfo, smaps_rollup), in bytes; 0 when absent. */
uint64_t mw_proc_field(const char *path, const char *field);
uint64_t mw_mem_available(void);          /* MemAvailable of /proc/meminfo, bytes; 0 when unknown */   /* binary units: KiB, MiB, GiB */
const char *mw_fmt_rate(char *buf, size_t n, double bytes_per_s); /* decimal: MB/s, GB/s */

/* Parse a size: "4096", "64K", "1M", "4G", "1GiB" (binary: 2^10, 2^20, 2^30, 2^40) or
 * "1KB", "1MB", "1GB", "1TB" (decimal: 10^3 ...). Returns 0 or -EINVAL. */
int mw_parse_size(const char *s, uint64_t *out);

/* crc32c (Castagnoli), the one checksum of the project (store blocks, checkpoints, commit
 * records). mw_crc32c is ISA-L's crc32_iscsi (the widest path the CPU has, chosen at run time);
 * _sw is the scalar reference. Both continue from `crc` (start with 0); the usual pre/post
 * inversion is inside. mw_crc32c_hw_available: whether the CPU has SSE4.2's crc32 instruction. */
uint32_t mw_crc32c(uint32_t crc, const void *data, size_t len);
uint32_t mw_crc32c_sw(uint32_t crc, const void *data, size_t len);
int mw_crc32c_hw_available(void);
/* ---- Untrusted numbers ----
 * Every size computed from a file or the command line goes through these: a header field that
 * makes a product or sum wrap must be an error with a message, never a short allocation or an
 * out-of-bounds offset. They return 0, or -EOVERFLOW (the caller's message names the field);
 * *out is written only on success. */
static inline int mw_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) return -EOVERFLOW;
    *out = r;
    return 0;
}
static inline int mw_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) return -EOVERFLOW;
    *out = r;
    return 0;
}
static inline int mw_mul_size(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r)) return -EOVERFLOW;
    *out = r;
    return 0;
}
static inline int mw_add_size(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r)) return -EOVERFLOW;
    *out = r;
    return 0;
}
/* A double from JSON (or strtod) as an integer: 0, or -ERANGE when it is NaN, infinite,
 * outside [lo, hi] or (integral = 1) not a whole number. Converting an out-of-range double to
 * an integer type is undefined behaviour in C, so no cast happens before this check. */
int mw_f64_to_i64(double d, int64_t lo, int64_t hi, int integral, int64_t *out);
int mw_f64_to_u64(double d, uint64_t hi, int integral, uint64_t *out);

/* Always-on invariant check (never compiled out); aborts through a replaceable hook. */
typedef void (*mw_abort_fn)(const char *file, int line, const char *expr);
void mw_set_abort_callback(mw_abort_fn fn);
void mw_abort_(const char *file, int line, const char *expr) __attribute__((noreturn));
#define MW_ASSERT(x) do { if (!(x)) mw_abort_(__FILE__, __LINE__, #x); } while (0)

#define MW_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MW_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MW_ALIGN_UP(x, a) ((((x) + (a) - 1) / (a)) * (a))

/* The memory tiers: one enum for tier, offload, plan and trace. The optimizer's tier is written
 * into checkpoints and commit records with these values: never reorder. Zero is DRAM, what a
 * zero-initialised configuration means. Names: mw_offload_tier_name ("dram", "nvme", "device"),
 * mw_tier_name (the trace's "host", "nvme", "device"), mw_plan_tier_name (DeepSpeed's "cpu",
 * "nvme", "none"). */
enum mw_tier_id { MW_TIER_DRAM = 0, MW_TIER_NVME = 1, MW_TIER_DEVICE = 2, MW_TIER_COUNT = 3 };

#ifdef __cplusplus
}
#endif
#endif
