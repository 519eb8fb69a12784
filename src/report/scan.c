/*
 * scan.c — reads a Chrome/Perfetto JSON trace file, handing each event to load.c.
 *
 * Why a hand-written outer scanner: a long run's trace is hundreds of MB; parsing it as one
 * cJSON tree would cost GBs of nodes. The scanner walks the top-level object, finds each
 * element of "traceEvents" by brace matching (strings and escapes respected) and hands that
 * one event to cJSON, so memory stays one event deep and a malformed or truncated file is
 * reported with its byte offset and line. "metadata" (small) is parsed whole.
 *
 * Accepted: {"traceEvents": [...], "metadata": {...}} in any key order, or a bare [...] array.
 */
#include "report/report_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct scan { const char *b; size_t n, pos; const char *path; };

static void skip_ws(struct scan *s)
{
    while (s->pos < s->n && (s->b[s->pos] == ' ' || s->b[s->pos] == '\n' || s->b[s->pos] == '\r' ||
                             s->b[s->pos] == '\t'))
        s->pos++;
}

static int line_of(const struct scan *s, size_t pos)
{
    int line = 1;
    for (size_t i = 0; i < pos && i < s->n; i++) line += s->b[i] == '\n';
    return line;
}

/* The bytes of the file a parse error quotes. Why escaped: the message goes to a terminal, and a
 * hostile (or merely corrupt) trace must not be able to put control sequences there (ESC [ ...
 * moves the cursor, rewrites the title, hides text). Printable ASCII is kept, '"' and '\\' are
 * escaped, \n \r \t are written as such and every other byte (controls, DEL, non-ASCII) as
 * \xHH; at most SNIP_BYTES bytes of the file (4 characters each at worst), "..." when cut. */
enum { SNIP_BYTES = 40 };

static void quote_snippet(char *out, const char *b, size_t n, int cut)
{
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)b[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : NULL;
        if (esc) { memcpy(out + k, esc, 2); k += 2; }
        else if (c >= 0x20 && c < 0x7f) out[k++] = (char)c;
        else { out[k++] = '\\'; out[k++] = 'x'; out[k++] = hex[c >> 4]; out[k++] = hex[c & 15]; }
    }
    if (cut) { memcpy(out + k, "...", 3); k += 3; }
    out[k] = 0;
}

static int fail_at(const struct scan *s, size_t pos, const char *what)
{
    if (pos >= s->n)
        return mw_error_set(MW_EFORMAT, "%s: truncated trace: the file ends (at byte %zu) %s; was the "
                            "run killed before the trace was written?", s->path, s->n, what);
    char snip[SNIP_BYTES * 4 + 4];
    quote_snippet(snip, s->b + pos, MW_MIN(s->n - pos, (size_t)SNIP_BYTES), s->n - pos > SNIP_BYTES);
    return mw_error_set(MW_EFORMAT, "%s: malformed trace at byte %zu (line %d): %s, near \"%s\"",
                        s->path, pos, line_of(s, pos), what, snip);
}

/* End (exclusive) of the JSON value starting at s->pos; returns 0 and sets *end, or an error. */
static int value_end(struct scan *s, size_t *end)
{
    size_t i = s->pos;
    if (i >= s->n) return fail_at(s, i, "where a value was expected");
    char c = s->b[i];
    if (c == '"') {
        for (i++; i < s->n; i++) {
            if (s->b[i] == '\\') { i++; continue; }
            if (s->b[i] == '"') { *end = i + 1; return 0; }
        }
        return fail_at(s, s->n, "inside a string");
    }
    if (c == '{' || c == '[') {
        int depth = 0;
        for (; i < s->n; i++) {
            char d = s->b[i];
            if (d == '"') {
                for (i++; i < s->n && s->b[i] != '"'; i++)
                    if (s->b[i] == '\\') i++;
                if (i >= s->n) break;
            } else if (d == '{' || d == '[') depth++;
            else if (d == '}' || d == ']') {
                if (--depth == 0) { *end = i + 1; return 0; }
            }
        }
        return fail_at(s, s->n, "inside an unfinished object or array");
    }
    while (i < s->n && !strchr(",}] \n\r\t", s->b[i])) i++;
    if (i == s->pos) return fail_at(s, i, "expected a value");
    *end = i;
    return 0;
}

static int scan_events(struct scan *s, struct rp_trace *t)
{
    s->pos++; /* '[' */
    skip_ws(s);
    if (s->pos < s->n && s->b[s->pos] == ']') { s->pos++; return 0; }
    for (uint64_t idx = 0;; idx++) {
        skip_ws(s);
        size_t start = s->pos, end;
        if (start < s->n && s->b[start] != '{') return fail_at(s, start, "a trace event must be an object");
        int rc = value_end(s, &end);
        if (rc) return rc;
        cJSON *e = cJSON_ParseWithLength(s->b + start, end - start);
        if (!e) {
            const char *ep = cJSON_GetErrorPtr();
            size_t at = ep && ep >= s->b + start && ep <= s->b + end ? (size_t)(ep - s->b) : start;
            char what[64];
            snprintf(what, sizeof what, "event #%llu is not valid JSON", (unsigned long long)idx);
            return fail_at(s, at, what);
        }
        const char *why = NULL;
        rc = rp_take_event(t, e, &why);
        cJSON_Delete(e);
        if (rc < 0) return mw_error_set(rc, "%s: out of memory reading the trace", s->path);
        if (rc > 0) {
            char what[96];
            snprintf(what, sizeof what, "event #%llu: %s", (unsigned long long)idx, why);
            return fail_at(s, start, what);
        }
        s->pos = end;
        skip_ws(s);
        if (s->pos >= s->n) return fail_at(s, s->n, "inside the traceEvents array");
        if (s->b[s->pos] == ']') { s->pos++; return 0; }
        if (s->b[s->pos] != ',') return fail_at(s, s->pos, "expected ',' or ']' after an event");
        s->pos++;
    }
}

static int scan_top(struct scan *s, struct rp_trace *t)
{
    skip_ws(s);
    if (s->pos >= s->n) return mw_error_set(MW_EFORMAT, "%s: empty file, not a trace", s->path);
    if (s->b[s->pos] == '[') return scan_events(s, t);
    if (s->b[s->pos] != '{') return fail_at(s, s->pos, "not a JSON trace (expected '{' or '[')");
    s->pos++;
    int saw_events = 0;
    for (;;) {
        skip_ws(s);
        if (s->pos >= s->n) return fail_at(s, s->n, "inside the top-level object");
        if (s->b[s->pos] == '}') { s->pos++; break; }
        if (s->b[s->pos] != '"') return fail_at(s, s->pos, "expected a key");
        size_t kend;
        int rc = value_end(s, &kend);
        if (rc) return rc;
        const char *key = s->b + s->pos + 1;
        size_t klen = kend - s->pos - 2;
        s->pos = kend;
        skip_ws(s);
        if (s->pos >= s->n || s->b[s->pos] != ':') return fail_at(s, s->pos, "expected ':' after a key");
        s->pos++;
        skip_ws(s);
        if (klen == 11 && !memcmp(key, "traceEvents", 11)) {
            if (s->pos >= s->n || s->b[s->pos] != '[') return fail_at(s, s->pos, "traceEvents must be an array");
            rc = scan_events(s, t);
            if (rc) return rc;
            saw_events = 1;
        } else {
            size_t vend;
            rc = value_end(s, &vend);
            if (rc) return rc;
            if (klen == 8 && !memcmp(key, "metadata", 8)) {
                cJSON *md = cJSON_ParseWithLength(s->b + s->pos, vend - s->pos);
                if (!md) return fail_at(s, s->pos, "metadata is not valid JSON");
                rp_take_metadata(t, md);
                cJSON_Delete(md);
            }
            s->pos = vend;
        }
        skip_ws(s);
        if (s->pos >= s->n) return fail_at(s, s->n, "inside the top-level object");
        if (s->b[s->pos] == ',') { s->pos++; continue; }
        if (s->b[s->pos] == '}') { s->pos++; break; }
        return fail_at(s, s->pos, "expected ',' or '}'");
    }
    if (!saw_events) return mw_error_set(MW_EFORMAT, "%s: no \"traceEvents\" array: not a Chrome/Perfetto trace", s->path);
    skip_ws(s);
    if (s->pos < s->n) return fail_at(s, s->pos, "unexpected data after the trace object");
    return 0;
}

int rp_trace_load(struct rp_trace *t, const char *path)
{
    memset(t, 0, sizeof *t);
    t->path = path;
    t->rank = t->world_size = t->zero_stage = -1;
    t->units_declared = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mw_error_set(-errno, "%s: cannot open the trace: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return mw_error_set(-EINVAL, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n ? n : 1);
    if (!buf) { close(fd); return mw_error_set(-ENOMEM, "%s: cannot hold %zu bytes", path, n); }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? -errno : -EIO;
            free(buf); close(fd);
            return mw_error_set(e, "%s: read failed at byte %zu: %s", path, got, strerror(-e));
        }
        got += (size_t)k;
    }
    close(fd);
    struct scan s = {buf, n, 0, path};
    int rc = scan_top(&s, t);
    free(buf);
    if (rc) rp_trace_free(t);
    return rc;
}

