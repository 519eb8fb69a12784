/*
 * common.c — error messages, logging, clock, unit formatting and parsing.
 * Why a per-thread message buffer: the engine runs on worker threads, and an error code
 * alone cannot say which object, file and offset failed. Each thread keeps its own last
 * message so concurrent failures do not overwrite each other.
 */
#include "memwall/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <ctype.h>
#include <math.h>
#include <pthread.h>

static _Thread_local char tl_msg[1024];

const char *mw_strerror(int err)
{
    switch (err) {
    case 0: return "success";
    case MW_EBUDGET: return "tier budget exceeded";
    case MW_ECHECKSUM: return "checksum mismatch";
    case MW_EFORMAT: return "malformed or truncated file";
    case MW_EOVERFLOW: return "inf/NaN in gradients";
    default: break;
    }
    if (err < 0 && err > -4096) return strerror(-err);
    return "unknown error";
}

int mw_error_set(int err, const char *fmt, ...)
{
    /* Through a copy: callers often wrap the last message, mw_error_set(e, "%s: %s", path,
     * mw_error_msg()), and formatting a buffer into itself is undefined. */
    char buf[sizeof tl_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(tl_msg, buf, sizeof tl_msg);
    return err;
}

const char *mw_error_msg(void) { return tl_msg[0] ? tl_msg : "(no detail)"; }

int mw_error_prepend(int err, const char *prefix)
{
    size_t pl = strlen(prefix), ml = strnlen(tl_msg, sizeof tl_msg - 1);
    if (pl >= sizeof tl_msg - 1) pl = sizeof tl_msg - 1;
    if (pl + ml > sizeof tl_msg - 1) ml = sizeof tl_msg - 1 - pl; /* the tail of the old message goes */
    memmove(tl_msg + pl, tl_msg, ml);
    memcpy(tl_msg, prefix, pl);
    tl_msg[pl + ml] = 0;
    return err;
}
void mw_error_clear(void) { tl_msg[0] = 0; }

static mw_log_fn g_log_fn;
static void *g_log_user;
static enum mw_log_level g_log_level = MW_LOG_WARN;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

void mw_log_set(mw_log_fn fn, void *user) { g_log_fn = fn; g_log_user = user; }
void mw_log_set_level(enum mw_log_level l) { g_log_level = l; }

void mw_log(enum mw_log_level level, const char *fmt, ...)
{
    if (level < g_log_level) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (g_log_fn) { g_log_fn(level, buf, g_log_user); return; }
    static const char *names[] = {"debug", "info", "warning", "error"};
    pthread_mutex_lock(&g_log_mu);
    fprintf(stderr, "memwall: %s: %s\n", names[level], buf);
    pthread_mutex_unlock(&g_log_mu);
}

uint64_t mw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *mw_fmt_bytes(char *buf, size_t n, uint64_t b)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024.0 && i < 5) { v /= 1024.0; i++; }
    if (i == 0) snprintf(buf, n, "%llu B", (unsigned long long)b);
    else snprintf(buf, n, "%.2f %s", v, u[i]);
    return buf;
}

const char *mw_fmt_rate(char *buf, size_t n, double r)
{
    if (r >= 1e9) snprintf(buf, n, "%.2f GB/s", r / 1e9);
    else if (r >= 1e6) snprintf(buf, n, "%.1f MB/s", r / 1e6);
    else snprintf(buf, n, "%.1f kB/s", r / 1e3);
    return buf;
}

int mw_f64_to_i64(double d, int64_t lo, int64_t hi, int integral, int64_t *out)
{
    /* 2^63 is exactly representable; every double below it converts without UB. */
    if (!isfinite(d) || d < (double)lo || d > (double)hi || d >= 9223372036854775808.0 ||
        d < -9223372036854775808.0 || (integral && d != floor(d)))
        return -ERANGE;
    int64_t v = (int64_t)d;
    if (v < lo || v > hi) return -ERANGE; /* (double)hi rounded up */
    *out = v;
    return 0;
}

int mw_f64_to_u64(double d, uint64_t hi, int integral, uint64_t *out)
{
    if (!isfinite(d) || d < 0 || d > (double)hi || d >= 18446744073709551616.0 || (integral && d != floor(d)))
        return -ERANGE;
    uint64_t v = (uint64_t)d;
    if (v > hi) return -ERANGE;
    *out = v;
    return 0;
}

int mw_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s) return -EINVAL;
    /* Decimal digits and one point only: strtod alone would also take "nan", "inf", "1e3" and
     * hex floats. */
    const char *q = s;
    while (isspace((unsigned char)*q)) q++;
    size_t nlen = strspn(q, "0123456789.");
    char num[48];
    if (nlen == 0 || nlen >= sizeof num) return -EINVAL;
    memcpy(num, q, nlen);
    num[nlen] = 0;
    errno = 0;
    char *nend;
    double v = strtod(num, &nend);
    if (errno || *nend || !(v >= 0)) return -EINVAL;
    const char *end = q + nlen;
    while (isspace((unsigned char)*end)) end++;
    double mul = 1;
    if (*end) {
        struct { const char *suf; double mul; } t[] = {
            {"B", 1}, {"K", 1024.0}, {"KIB", 1024.0}, {"KB", 1e3},
            {"M", 1048576.0}, {"MIB", 1048576.0}, {"MB", 1e6},
            {"G", 1073741824.0}, {"GIB", 1073741824.0}, {"GB", 1e9},
            {"T", 1099511627776.0}, {"TIB", 1099511627776.0}, {"TB", 1e12},
        };
        size_t i;
        for (i = 0; i < sizeof t / sizeof t[0]; i++)
            if (!strcasecmp(end, t[i].suf)) break;
        if (i == sizeof t / sizeof t[0]) return -EINVAL;
        mul = t[i].mul;
    }
    double r = v * mul + 0.5;
    uint64_t x;
    if (mw_f64_to_u64(floor(r), UINT64_MAX, 1, &x)) return -ERANGE;
    *out = x;
    return 0;
}

static mw_abort_fn g_abort_fn;
void mw_set_abort_callback(mw_abort_fn fn) { g_abort_fn = fn; }
void mw_abort_(const char *file, int line, const char *expr)
{
    if (g_abort_fn) g_abort_fn(file, line, expr);
    fprintf(stderr, "memwall: internal error at %s:%d: assertion '%s' failed\n", file, line, expr);
    abort();
}

uint64_t mw_mem_available(void) { return mw_proc_field("/proc/meminfo", "MemAvailable"); }

uint64_t mw_proc_mem(const char *field) { return mw_proc_field("/proc/self/status", field); }

uint64_t mw_proc_field(const char *path, const char *field)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t fl = strlen(field);
    uint64_t kib = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, field, fl) || line[fl] != ':') continue;
        unsigned long long v;
        if (sscanf(line + fl + 1, "%llu", &v) == 1) kib = v;
        break;
    }
    fclose(f);
    return kib * 1024;
}
