/*
 * memwall/trace.h — the event recorder behind `memwall report`.
 *
 * Why: to study where a run spends its time and bytes, every I/O request, every allocation and
 * every pipeline stage must be recorded with its timestamps, cheaply enough to leave on.
 *
 * Events: I/O (op, tier pair, bytes, offset, queue depth at submit, submit and completion ns,
 * object), alloc/free (tier, kind, bytes, label, tier bytes after), generic spans (category,
 * name, start/end ns, up to MW_TRACE_MAX_ARGS named integer args) and counters (name, ns, value).
 *
 * Memory: BOUNDED RING, DROP OLDEST. The recorder preallocates `capacity` fixed-size events
 * (default MW_TRACE_DEFAULT_CAPACITY, 128 bytes each; pages are touched only as events
 * arrive). A writer takes a slot with one atomic
 * fetch-add; once the ring wraps, the oldest events are overwritten and counted in `dropped`
 * (reported by mw_trace_stats and in the JSON metadata as "dropped_events"). No locks and no
 * allocation on the hot path.
 *
 * Strings: events keep `const char *` pointers, not copies. Pass string literals or strings
 * that outlive the recorder; for dynamic names ("sg17.exp_avg") call mw_trace_intern once and
 * keep the returned pointer (owned by the recorder, deduplicated).
 *
 * Threading: every mw_trace_* emit function may be called from any thread concurrently.
 * mw_trace_write / mw_trace_free must not race with emitters (call them after the run's threads
 * are joined or quiescent); an event still being written when mw_trace_write runs is skipped.
 *
 * Disabled: every function accepts tr == NULL and returns at once (one branch), so callers pass
 * their possibly-NULL recorder without checking. mw_trace_now(NULL) returns 0 without reading
 * the clock.
 *
 * Output (mw_trace_write): Chrome/Perfetto JSON {"traceEvents": [...], "metadata": {...}}.
 *   I/O      "X" events, cat "io", name "read"/"write", args {object, bytes, offset, qd, from, to}
 *   spans    "X" events with their category, name and args
 *   alloc    "i" instant events, cat "mem", name "alloc"/"free", args {tier, kind, bytes, label};
 *            plus a "C" counter "<tier> bytes" with the tier's current bytes after the event
 *   counters "C" events, args {value}
 *   threads  "M" thread_name events for threads named with mw_trace_thread_name
 *   metadata {"tool": "memwall", "tiers": [{"name", "budget_bytes"}], "dropped_events", ...}
 *   ts/dur are microseconds (floats) since the recorder was created.
 */
#ifndef MEMWALL_TRACE_H
#define MEMWALL_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mw_trace; /* opaque */

#define MW_TRACE_DEFAULT_CAPACITY ((size_t)1 << 19) /* events (64 MiB when full) */
#define MW_TRACE_MAX_ARGS 4

enum mw_trace_io_op { MW_TRACE_READ = 0, MW_TRACE_WRITE = 1 };

struct mw_trace_arg {
    const char *key; /* static or interned */
    int64_t value;
};

/* One I/O request as the engine saw it. */
struct mw_trace_io {
    enum mw_trace_io_op op;
    int from_tier, to_tier;    /* enum mw_tier_id: read = nvme -> host, write = host -> nvme */
    uint64_t bytes;
    uint64_t offset;           /* byte offset in the file */
    uint32_t queue_depth;      /* requests in flight when this one was submitted (incl. itself) */
    uint64_t submit_ns;        /* mw_now_ns() at submit */
    uint64_t complete_ns;      /* mw_now_ns() at completion */
    const char *object;        /* static or interned; may be NULL */
    int result;                /* 0 or -errno */
};

/* capacity: events kept in memory (0 = MW_TRACE_DEFAULT_CAPACITY). */
int mw_trace_init(struct mw_trace **out, size_t capacity);
void mw_trace_free(struct mw_trace *tr);

/* Current time in ns for a span start (0 when tr == NULL). */
uint64_t mw_trace_now(const struct mw_trace *tr);
static inline int mw_trace_enabled(const struct mw_trace *tr) { return tr != 0; }

/* A stable, deduplicated copy of s owned by the recorder (s itself when tr == NULL, or NULL
 * when out of memory). Takes a lock: call once per name, not per event. */
const char *mw_trace_intern(struct mw_trace *tr, const char *s);

/* Metadata. */
void mw_trace_set_tier(struct mw_trace *tr, int tier, const char *name, uint64_t budget_bytes);
void mw_trace_meta(struct mw_trace *tr, const char *key, const char *value); /* strings copied */
void mw_trace_thread_name(struct mw_trace *tr, const char *name);           /* calling thread */

/* Emitters. */
void mw_trace_io(struct mw_trace *tr, const struct mw_trace_io *io);
void mw_trace_alloc(struct mw_trace *tr, int tier, int kind, uint64_t bytes, const char *label,
                    uint64_t tier_bytes_after);
void mw_trace_free_event(struct mw_trace *tr, int tier, int kind, uint64_t bytes, const char *label,
                         uint64_t tier_bytes_after);
/* A completed span [start_ns, end_ns]; args may be NULL; at most MW_TRACE_MAX_ARGS are kept. */
void mw_trace_span(struct mw_trace *tr, const char *cat, const char *name, uint64_t start_ns,
                   uint64_t end_ns, const struct mw_trace_arg *args, int nargs);
void mw_trace_counter(struct mw_trace *tr, const char *name, uint64_t ns, double value);

struct mw_trace_stats {
    uint64_t recorded;  /* events emitted since init */
    uint64_t kept;      /* events now in memory */
    uint64_t dropped;   /* oldest events overwritten */
    size_t capacity;
};
void mw_trace_stats(const struct mw_trace *tr, struct mw_trace_stats *out);

/* Writes the Chrome/Perfetto JSON file. Returns 0 or -errno (message names the path). */
int mw_trace_write(struct mw_trace *tr, const char *path);
/* A resumed run: the events of the trace an earlier segment wrote at path come first in the file
 * mw_trace_write writes, and this recorder's times follow them. No file: nothing to continue (0);
 * a file memwall did not write: a warning, the trace starts anew. */
int mw_trace_continue(struct mw_trace *tr, const char *path);

#ifdef __cplusplus
}
#endif
#endif
