/*
 * trace_continue.c — the trace of a resumed run continues the trace its stopped run wrote
 * (docs/resume.md, "What a resume keeps"): one file for the whole run, the earlier segments'
 * events first, the new ones after them on the same time axis.
 *
 * Why text, not a parse: the earlier file was written by mw_trace_write (trace_json.c), whose
 * layout is fixed: "{\"traceEvents\":[\n", the events, "\n],\n\"displayTimeUnit\"...". The events
 * between are copied as they are (a ring's worth is ~200 MB of JSON: no tree is built), and the
 * recorder's origin moves back by the earlier segment's end, so the new events follow. A file of
 * another layout (not ours, or cut short by a kill during its write, which the atomic write
 * prevents) is not continued: a warning, and the run's trace starts anew. Raw "\"ts\":" can occur
 * only as a key: inside a JSON string the quotes are escaped.
 */
#include "memwall/common.h"
#include "memwall/trace.h"
#include "trace/trace_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEAD "{\"traceEvents\":[\n"
#define TAIL "\n],\n\"displayTimeUnit\""
#define PRIOR_MAX ((uint64_t)1 << 30)

/* The largest number after each `key` in [p, p + n). */
static double max_after(const char *p, size_t n, const char *key)
{
    double best = 0;
    size_t kl = strlen(key);
    for (const char *q = p; (q = memmem(q, (size_t)(p + n - q), key, kl)); q += kl) {
        char *end;
        double v = strtod(q + kl, &end);
        if (end != q + kl && v > best && v < 1e15) best = v;
    }
    return best;
}

int mw_trace_continue(struct mw_trace *tr, const char *path)
{
    if (!tr) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno == ENOENT ? 0 : mw_error_set(-errno, "trace: cannot read %s: %s", path, strerror(errno));
    struct stat st;
    char *buf = NULL;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > PRIOR_MAX) {
        mw_log(MW_LOG_WARN, "trace %s: not a regular file of at most 1 GiB: the run's trace starts anew", path);
        goto out;
    }
    size_t n = (size_t)st.st_size, got = 0;
    if (!(buf = malloc(n + 1))) { rc = mw_error_set(-ENOMEM, "trace: no memory to continue %s", path); goto out; }
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { rc = mw_error_set(k < 0 ? -errno : -EIO, "trace: cannot read %s", path); goto out; }
        got += (size_t)k;
    }
    buf[n] = 0;
    const char *tail = NULL;
    for (const char *q = buf; (q = memmem(q, (size_t)(buf + n - q), TAIL, strlen(TAIL))); q++) tail = q;
    if (n < strlen(HEAD) || memcmp(buf, HEAD, strlen(HEAD)) || !tail || tail < buf + strlen(HEAD)) {
        mw_log(MW_LOG_WARN, "trace %s was not written by memwall: the run's trace starts anew (it is replaced at the end)", path);
        goto out;
    }
    const char *ev = buf + strlen(HEAD);
    size_t len = (size_t)(tail - ev);
    /* The new events start 1 ms after the last one ended (microseconds in the file). */
    double end_us = max_after(ev, len, "\"ts\":") + max_after(ev, len, "\"dur\":") + 1000.0;
    uint64_t shift = (uint64_t)(end_us * 1000.0);
    pthread_mutex_lock(&tr->mu);
    char *p = realloc(tr->prior, tr->prior_len + len + 3);
    if (!p) {
        pthread_mutex_unlock(&tr->mu);
        rc = mw_error_set(-ENOMEM, "trace: no memory to continue %s", path);
        goto out;
    }
    tr->prior = p;
    if (tr->prior_len) { memcpy(p + tr->prior_len, ",\n", 2); tr->prior_len += 2; }
    memcpy(p + tr->prior_len, ev, len);
    tr->prior_len += len;
    tr->segments++;
    if (tr->origin_ns > shift) tr->origin_ns -= shift;
    pthread_mutex_unlock(&tr->mu);
    char v[32];
    snprintf(v, sizeof v, "%d", tr->segments);
    mw_trace_meta(tr, "continued_segments", v);
out:
    free(buf);
    close(fd);
    return rc;
}
