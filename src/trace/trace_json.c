/*
 * trace_json.c — writes the recorder's ring as a Chrome/Perfetto JSON trace.
 *
 * Why hand-written JSON and not cJSON: a full ring is a million events; building a cJSON tree
 * for it would need several times the ring's memory. Streaming with stdio is linear and small.
 * Events are written oldest first (ring order = emission order of the slot claims).
 *
 * Why a temporary and a rename: the trace is written once, at the end of a run, often over the
 * previous run's trace; a full disk or a kill halfway must leave that file (or nothing), never a
 * truncated JSON with the temporary beside it (mw_atomic_open: PATH.tmp.<pid>.<n>, renamed
 * over PATH once written and synced, removed on failure). A path that exists and is not a
 * regular file (/dev/stdout, a FIFO) is written in place. The stream keeps the errno of the first
 * failed write(2), so the message says "No space left on device", not a generic I/O error.
 */
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "trace/trace_impl.h"

#include "memwall/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { fputc('\\', f); fputc(c, f); }
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static const char *tier_str(int t)
{
    return t >= 0 && t < MW_TIER_COUNT ? mw_tier_name((enum mw_tier_id)t) : "?";
}

static const char *kind_str(int k)
{
    return k >= 0 && k < MW_KIND_COUNT ? mw_kind_name((enum mw_alloc_kind)k) : "?";
}

/* Microseconds since the recorder's origin (may be negative for events stamped before it). */
static double us(const struct mw_trace *tr, uint64_t ns)
{
    return ((double)(int64_t)(ns - tr->origin_ns)) / 1000.0;
}

static void head(FILE *f, const struct mw_trace *tr, const struct mw_trace_ev *e, const char *ph,
                 const char *cat, const char *name, uint64_t ts)
{
    fprintf(f, "{\"ph\":\"%s\",\"cat\":", ph);
    put_str(f, cat ? cat : "");
    fputs(",\"name\":", f);
    put_str(f, name ? name : "");
    fprintf(f, ",\"pid\":%d,\"tid\":%" PRIu32 ",\"ts\":%.3f", tr->pid, e->tid, us(tr, ts));
}

static void write_event(FILE *f, const struct mw_trace *tr, const struct mw_trace_ev *e)
{
    switch (e->type) {
    case MW_EV_IO:
        head(f, tr, e, "X", "io", e->op == MW_TRACE_WRITE ? "write" : "read", e->t0);
        fprintf(f, ",\"dur\":%.3f,\"args\":{\"object\":", (double)(e->t1 - e->t0) / 1000.0);
        put_str(f, e->name ? e->name : "");
        fprintf(f, ",\"bytes\":%" PRIu64 ",\"offset\":%" PRIu64 ",\"qd\":%" PRIu32
                   ",\"from\":\"%s\",\"to\":\"%s\",\"result\":%d}}",
                e->u.io.bytes, e->u.io.offset, e->qd, tier_str(e->tier_a), tier_str(e->tier_b),
                (int)e->result);
        break;
    case MW_EV_ALLOC:
    case MW_EV_FREE: {
        const char *what = e->type == MW_EV_ALLOC ? "alloc" : "free";
        head(f, tr, e, "i", "mem", what, e->t0);
        fprintf(f, ",\"s\":\"t\",\"args\":{\"tier\":\"%s\",\"kind\":\"%s\",\"bytes\":%" PRIu64
                   ",\"tier_bytes\":%" PRIu64 ",\"label\":",
                tier_str(e->tier_a), kind_str(e->kind), e->u.io.bytes, e->u.io.offset);
        put_str(f, e->name ? e->name : "");
        fputs("}},\n", f);
        char cname[48];
        snprintf(cname, sizeof cname, "%s bytes", tier_str(e->tier_a));
        head(f, tr, e, "C", "mem", cname, e->t0);
        fprintf(f, ",\"args\":{\"bytes\":%" PRIu64 "}}", e->u.io.offset);
        break;
    }
    case MW_EV_SPAN:
        head(f, tr, e, "X", e->cat, e->name, e->t0);
        fprintf(f, ",\"dur\":%.3f,\"args\":{", (double)(e->t1 - e->t0) / 1000.0);
        for (int i = 0; i < e->nargs && i < MW_TRACE_MAX_ARGS; i++) {
            if (i) fputc(',', f);
            put_str(f, e->u.args[i].key ? e->u.args[i].key : "arg");
            fprintf(f, ":%" PRId64, e->u.args[i].value);
        }
        fputs("}}", f);
        break;
    case MW_EV_COUNTER:
        head(f, tr, e, "C", e->cat, e->name, e->t0);
        fprintf(f, ",\"args\":{\"value\":%.17g}}", e->u.value);
        break;
    default:
        fputs("{}", f); /* unreachable for committed slots */
        break;
    }
}

int mw_trace_write(struct mw_trace *tr, const char *path)
{
    if (!tr) return 0;
    struct mw_out o; /* atomic, the real errno of a failed write (memwall/fsutil.h) */
    int rc = mw_out_open(&o, path, "the trace");
    if (rc) return mw_error_prepend(rc, "trace: ");
    FILE *f = o.f;

    struct mw_trace_stats st;
    mw_trace_stats(tr, &st);
    uint64_t end = st.recorded, begin = st.recorded - st.kept, skipped = 0;

    fputs("{\"traceEvents\":[\n", f);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"memwall\"}}",
            tr->pid);
    pthread_mutex_lock(&tr->mu);
    for (int i = 0; i < tr->nthreads; i++) {
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%" PRIu32 ",\"args\":{\"name\":",
                tr->pid, tr->threads[i].tid);
        put_str(f, tr->threads[i].name);
        fputs("}}", f);
    }
    if (tr->prior_len) { /* a resumed run: the earlier segments first (trace_continue.c) */
        fputs(",\n", f);
        fwrite(tr->prior, 1, tr->prior_len, f);
    }
    pthread_mutex_unlock(&tr->mu);
    for (uint64_t i = begin; i < end; i++) {
        const struct mw_trace_ev *e = &tr->ring[i & tr->mask];
        /* A slot whose sequence is not ours was overwritten or is still being written. */
        if (atomic_load_explicit(&e->seq, memory_order_acquire) != i + 1) { skipped++; continue; }
        fputs(",\n", f);
        write_event(f, tr, e);
    }
    fputs("\n],\n\"displayTimeUnit\":\"ms\",\n\"metadata\":{\"tool\":\"memwall\",\"tiers\":[", f);
    pthread_mutex_lock(&tr->mu);
    int first = 1;
    for (int i = 0; i < MW_TRACE_MAX_TIERS; i++) {
        if (!tr->tiers[i].set) continue;
        fprintf(f, "%s{\"id\":%d,\"name\":", first ? "" : ",", i);
        put_str(f, tr->tiers[i].name);
        fprintf(f, ",\"budget_bytes\":%" PRIu64 "}", tr->tiers[i].budget);
        first = 0;
    }
    fprintf(f, "],\"recorded_events\":%" PRIu64 ",\"dropped_events\":%" PRIu64
               ",\"skipped_events\":%" PRIu64 ",\"ring_capacity\":%zu,\"drop_policy\":\"oldest\"",
            st.recorded, st.dropped, skipped, st.capacity);
    for (int i = 0; i < tr->nmeta; i++) {
        fputc(',', f);
        put_str(f, tr->meta[i].key);
        fputc(':', f);
        put_str(f, tr->meta[i].value);
    }
    pthread_mutex_unlock(&tr->mu);
    fputs("}}\n", f);

    rc = mw_out_close(&o);
    return rc ? mw_error_prepend(rc, "trace: ") : 0;
}
