/*
 * aio_fault.c — MEMWALL_FAULT: I/O errors and latency injected into the engine's pieces, so
 * that the paths a failing or slow disk takes (a step not committed, "disk full", exposed wait)
 * run in tests and can be tried by hand on any machine.
 *
 * Why in the engine and behind an environment variable: every caller (store, offload engine,
 * trainer, bench io) sees exactly what a real failure looks like — the result on the piece,
 * the message naming object, file and offset — with no test-only branches above it, and a
 * normal run pays one branch per piece (no rules: nothing to do).
 *
 * Syntax (docs/io.md): rules separated by ',', each [read:|write:]KIND[:after=N][:count=N][:us=N]
 * with KIND eio, enospc or delay. The value comes from the environment, so it is parsed as
 * hostile: bounded length and rule count, plain decimal numbers with a ceiling, every key known
 * and given once; anything else is an error naming the rule, never ignored.
 */
#include "aio/aio_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX 255                     /* bytes of MEMWALL_FAULT */
#define NUM_MAX 1000000000000000ull      /* 1e15: after= and count= */
#define DELAY_US_MAX 10000000ull         /* 10 s per piece */
#define SYNTAX "[read:|write:]eio|enospc|delay[:after=N][:count=N][:us=N], rules separated by ','"

/* Plain decimal digits, at most max. Returns 0 or -EINVAL. */
static int parse_num(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    if (!n || n > 16) return -EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -EINVAL;
        v = v * 10 + (uint64_t)(s[i] - '0'); /* <= 16 digits: no overflow */
    }
    if (v > max) return -EINVAL;
    *out = v;
    return 0;
}

static int tok_is(const char *t, size_t n, const char *word) { return strlen(word) == n && !memcmp(t, word, n); }

/* One rule, the n bytes at s (no ','). Returns 0, or -EINVAL with why[] filled. */
static int parse_rule(const char *s, size_t n, struct mw_aio_fault_rule *r, char *why, size_t whyn)
{
    memset(r, 0, sizeof *r);
    r->op = -1;
    r->count = UINT64_MAX;
    int have_kind = 0, have_after = 0, have_count = 0, have_us = 0;
    const char *end = s + n;
    for (const char *t = s; t <= end;) {
        const char *c = memchr(t, ':', (size_t)(end - t));
        size_t tl = (size_t)((c ? c : end) - t);
        const char *eq = memchr(t, '=', tl);
        if (!tl) { snprintf(why, whyn, "an empty field"); return -EINVAL; }
        if (!have_kind && !eq) {
            if (r->op < 0 && (tok_is(t, tl, "read") || tok_is(t, tl, "write")) && c) {
                r->op = tok_is(t, tl, "read") ? MW_AIO_READ : MW_AIO_WRITE;
            } else if (tok_is(t, tl, "eio")) { r->err = -EIO; have_kind = 1; }
            else if (tok_is(t, tl, "enospc")) { r->err = -ENOSPC; have_kind = 1; }
            else if (tok_is(t, tl, "delay")) { have_kind = 1; }
            else { snprintf(why, whyn, "'%.*s' is not eio, enospc or delay", (int)MW_MIN(tl, 32), t); return -EINVAL; }
        } else if (!eq) {
            snprintf(why, whyn, "'%.*s' is not key=N", (int)MW_MIN(tl, 32), t);
            return -EINVAL;
        } else {
            size_t kl = (size_t)(eq - t), vl = tl - kl - 1;
            uint64_t *dst = NULL, max = NUM_MAX;
            int *seen = NULL;
            if (tok_is(t, kl, "after")) { dst = &r->after; seen = &have_after; }
            else if (tok_is(t, kl, "count")) { dst = &r->count; seen = &have_count; }
            else if (tok_is(t, kl, "us")) { dst = &r->delay_us; seen = &have_us; max = DELAY_US_MAX; }
            if (!dst) { snprintf(why, whyn, "unknown key '%.*s' (after, count or us)", (int)MW_MIN(kl, 32), t); return -EINVAL; }
            if (*seen) { snprintf(why, whyn, "'%.*s' given twice", (int)kl, t); return -EINVAL; }
            *seen = 1;
            if (parse_num(eq + 1, vl, max, dst)) {
                snprintf(why, whyn, "%.*s= needs a decimal number from 0 to %llu", (int)kl, t, (unsigned long long)max);
                return -EINVAL;
            }
        }
        if (!c) break;
        t = c + 1;
    }
    if (!have_kind) { snprintf(why, whyn, "no kind (eio, enospc or delay)"); return -EINVAL; }
    if (r->err && have_us) { snprintf(why, whyn, "us= belongs to delay, not to an error"); return -EINVAL; }
    if (!r->err && !r->delay_us) { snprintf(why, whyn, "delay needs us=N (1 to %llu)", DELAY_US_MAX); return -EINVAL; }
    if (have_count && !r->count) { snprintf(why, whyn, "count=0 would never apply"); return -EINVAL; }
    return 0;
}

int mw_aio_fault_parse(const char *spec, struct mw_aio_faults *out)
{
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) return 0;
    size_t len = strnlen(spec, SPEC_MAX + 1);
    if (len > SPEC_MAX)
        return mw_error_set(-EINVAL, "MEMWALL_FAULT: longer than %d bytes; expected " SYNTAX, SPEC_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)spec[i] < 0x21 || (unsigned char)spec[i] > 0x7e)
            return mw_error_set(-EINVAL, "MEMWALL_FAULT: byte %zu is not a printable character (spaces are not "
                                "allowed either); expected " SYNTAX, i);
    const char *s = spec, *end = spec + len;
    for (int k = 0; s <= end; k++) {
        const char *c = memchr(s, ',', (size_t)(end - s));
        size_t n = (size_t)((c ? c : end) - s);
        if (k == MW_AIO_FAULT_MAX)
            return mw_error_set(-EINVAL, "MEMWALL_FAULT='%s': more than %d rules; expected " SYNTAX, spec,
                                MW_AIO_FAULT_MAX);
        char why[128];
        if (parse_rule(s, n, &out->rule[k], why, sizeof why))
            return mw_error_set(-EINVAL, "MEMWALL_FAULT='%s': rule %d ('%.*s'): %s; expected " SYNTAX, spec, k + 1,
                                (int)n, s, why);
        out->n = k + 1;
        if (!c) break;
        s = c + 1;
    }
    return 0;
}

void mw_aio_fault_pick_(struct mw_aio_faults *f, enum mw_aio_op op, int *err, uint64_t *delay_us)
{
    for (int i = 0; i < f->n; i++) {
        struct mw_aio_fault_rule *r = &f->rule[i];
        if (r->op >= 0 && r->op != (int)op) continue;
        uint64_t k = r->seen++;
        if (k < r->after || k - r->after >= r->count) continue;
        if (r->err && !*err) *err = r->err;
        if (r->delay_us > *delay_us) *delay_us = r->delay_us;
    }
}
