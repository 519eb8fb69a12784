/*
 * trace.c — the event recorder: a preallocated ring of fixed-size events, one atomic
 * fetch-add per event, drop-oldest on wrap.
 *
 * Why a ring and not per-thread buffers: the writers are a handful of engine and pipeline
 * threads emitting a few thousand events per second each; one shared atomic index costs a
 * few ns without contention and keeps a single global order, and the ring bounds memory for
 * runs of any length. Each slot carries a sequence word written last (release) so the JSON
 * writer can tell a complete slot from one overwritten or half written.
 *
 * Strings are not copied per event (too slow); callers intern dynamic names once.
 */
#include "memwall/trace.h"
#include "trace/trace_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Thread_local uint32_t tl_tid;

uint32_t mw_trace_tid_(void)
{
    if (!tl_tid) tl_tid = (uint32_t)syscall(SYS_gettid);
    return tl_tid;
}

int mw_trace_init(struct mw_trace **out, size_t capacity)
{
    *out = NULL;
    if (!capacity) capacity = MW_TRACE_DEFAULT_CAPACITY;
    size_t cap = 1;
    while (cap < capacity) cap <<= 1; /* power of two: the slot is idx & mask */
    struct mw_trace *tr = calloc(1, sizeof *tr);
    if (!tr) return mw_error_set(-ENOMEM, "trace: cannot allocate the recorder");
    /* calloc: pages are touched only as events arrive, so a large ring costs little until used. */
    tr->ring = calloc(cap, sizeof *tr->ring);
    if (!tr->ring) {
        free(tr);
        return mw_error_set(-ENOMEM, "trace: cannot allocate %zu events (%zu bytes each)", cap,
                            sizeof(struct mw_trace_ev));
    }
    tr->cap = cap;
    tr->mask = cap - 1;
    tr->origin_ns = mw_now_ns();
    tr->pid = (int)getpid();
    pthread_mutex_init(&tr->mu, NULL);
    for (int i = 0; i < MW_TRACE_MAX_TIERS; i++) tr->tiers[i].budget = 0;
    *out = tr;
    return 0;
}

void mw_trace_free(struct mw_trace *tr)
{
    if (!tr) return;
    for (size_t i = 0; i < tr->intern_cap; i++) free(tr->intern[i]);
    free(tr->intern);
    for (int i = 0; i < tr->nmeta; i++) { free(tr->meta[i].key); free(tr->meta[i].value); }
    for (int i = 0; i < tr->nthreads; i++) free(tr->threads[i].name);
    pthread_mutex_destroy(&tr->mu);
    free(tr->ring);
    free(tr->prior);
    free(tr);
}

uint64_t mw_trace_now(const struct mw_trace *tr) { return tr ? mw_now_ns() : 0; }

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Open addressing, grown at half full. Called with tr->mu held. */
static int intern_grow(struct mw_trace *tr)
{
    size_t ncap = tr->intern_cap ? tr->intern_cap * 2 : 256;
    char **n = calloc(ncap, sizeof *n);
    if (!n) return -ENOMEM;
    for (size_t i = 0; i < tr->intern_cap; i++) {
        char *s = tr->intern[i];
        if (!s) continue;
        size_t j = hash_str(s) & (ncap - 1);
        while (n[j]) j = (j + 1) & (ncap - 1);
        n[j] = s;
    }
    free(tr->intern);
    tr->intern = n;
    tr->intern_cap = ncap;
    return 0;
}

const char *mw_trace_intern(struct mw_trace *tr, const char *s)
{
    if (!tr || !s) return s;
    const char *res = NULL;
    pthread_mutex_lock(&tr->mu);
    if (tr->intern_n * 2 >= tr->intern_cap && intern_grow(tr)) goto out;
    size_t j = hash_str(s) & (tr->intern_cap - 1);
    while (tr->intern[j]) {
        if (!strcmp(tr->intern[j], s)) { res = tr->intern[j]; goto out; }
        j = (j + 1) & (tr->intern_cap - 1);
    }
    tr->intern[j] = strdup(s);
    if (tr->intern[j]) tr->intern_n++;
    res = tr->intern[j];
out:
    pthread_mutex_unlock(&tr->mu);
    return res;
}

void mw_trace_set_tier(struct mw_trace *tr, int tier, const char *name, uint64_t budget_bytes)
{
    if (!tr || tier < 0 || tier >= MW_TRACE_MAX_TIERS) return;
    pthread_mutex_lock(&tr->mu);
    snprintf(tr->tiers[tier].name, sizeof tr->tiers[tier].name, "%s", name ? name : "?");
    tr->tiers[tier].budget = budget_bytes;
    tr->tiers[tier].set = 1;
    pthread_mutex_unlock(&tr->mu);
}

void mw_trace_meta(struct mw_trace *tr, const char *key, const char *value)
{
    if (!tr || !key || !value) return;
    pthread_mutex_lock(&tr->mu);
    int i;
    for (i = 0; i < tr->nmeta; i++)
        if (!strcmp(tr->meta[i].key, key)) break;
    if (i == tr->nmeta) {
        if (tr->nmeta == MW_TRACE_MAX_META) goto out;
        tr->meta[i].key = strdup(key);
        tr->meta[i].value = NULL;
        if (!tr->meta[i].key) goto out;
        tr->nmeta++;
    }
    char *v = strdup(value);
    if (v) { free(tr->meta[i].value); tr->meta[i].value = v; }
out:
    pthread_mutex_unlock(&tr->mu);
}

void mw_trace_thread_name(struct mw_trace *tr, const char *name)
{
    if (!tr || !name) return;
    uint32_t tid = mw_trace_tid_();
    pthread_mutex_lock(&tr->mu);
    int i;
    for (i = 0; i < tr->nthreads; i++)
        if (tr->threads[i].tid == tid) break;
    if (i == tr->nthreads) {
        if (tr->nthreads == MW_TRACE_MAX_THREADS) goto out;
        tr->threads[i].tid = tid;
        tr->threads[i].name = NULL;
        tr->nthreads++;
    }
    char *n = strdup(name);
    if (n) { free(tr->threads[i].name); tr->threads[i].name = n; }
out:
    pthread_mutex_unlock(&tr->mu);
}

/* Claims the next slot; the caller fills it and calls ev_commit. */
static inline struct mw_trace_ev *ev_claim(struct mw_trace *tr, uint64_t *idx)
{
    *idx = atomic_fetch_add_explicit(&tr->head, 1, memory_order_relaxed);
    struct mw_trace_ev *e = &tr->ring[*idx & tr->mask];
    /* Mark busy first so a reader never takes a half-written slot for the previous lap's. */
    atomic_store_explicit(&e->seq, 0, memory_order_relaxed);
    e->tid = mw_trace_tid_();
    return e;
}

static inline void ev_commit(struct mw_trace_ev *e, uint64_t idx)
{
    atomic_store_explicit(&e->seq, idx + 1, memory_order_release);
}

void mw_trace_io(struct mw_trace *tr, const struct mw_trace_io *io)
{
    if (!tr) return;
    uint64_t idx;
    struct mw_trace_ev *e = ev_claim(tr, &idx);
    e->type = MW_EV_IO;
    e->op = (uint8_t)io->op;
    e->tier_a = (int8_t)io->from_tier;
    e->tier_b = (int8_t)io->to_tier;
    e->qd = io->queue_depth;
    e->result = io->result;
    e->t0 = io->submit_ns;
    e->t1 = io->complete_ns;
    e->cat = "io";
    e->name = io->object;
    e->u.io.bytes = io->bytes;
    e->u.io.offset = io->offset;
    ev_commit(e, idx);
}

static void mem_event(struct mw_trace *tr, uint8_t type, int tier, int kind, uint64_t bytes,
                      const char *label, uint64_t after)
{
    uint64_t idx;
    struct mw_trace_ev *e = ev_claim(tr, &idx);
    e->type = type;
    e->tier_a = (int8_t)tier;
    e->kind = (int8_t)kind;
    e->t0 = e->t1 = mw_now_ns();
    e->cat = "mem";
    e->name = label;
    e->u.io.bytes = bytes;
    e->u.io.offset = after;
    ev_commit(e, idx);
}

void mw_trace_alloc(struct mw_trace *tr, int tier, int kind, uint64_t bytes, const char *label,
                    uint64_t tier_bytes_after)
{
    if (tr) mem_event(tr, MW_EV_ALLOC, tier, kind, bytes, label, tier_bytes_after);
}

void mw_trace_free_event(struct mw_trace *tr, int tier, int kind, uint64_t bytes, const char *label,
                         uint64_t tier_bytes_after)
{
    if (tr) mem_event(tr, MW_EV_FREE, tier, kind, bytes, label, tier_bytes_after);
}

void mw_trace_span(struct mw_trace *tr, const char *cat, const char *name, uint64_t start_ns,
                   uint64_t end_ns, const struct mw_trace_arg *args, int nargs)
{
    if (!tr) return;
    uint64_t idx;
    struct mw_trace_ev *e = ev_claim(tr, &idx);
    e->type = MW_EV_SPAN;
    e->t0 = start_ns;
    e->t1 = end_ns;
    e->cat = cat;
    e->name = name;
    if (!args || nargs < 0) nargs = 0;
    if (nargs > MW_TRACE_MAX_ARGS) nargs = MW_TRACE_MAX_ARGS;
    e->nargs = (uint8_t)nargs;
    for (int i = 0; i < nargs; i++) e->u.args[i] = args[i];
    ev_commit(e, idx);
}

void mw_trace_counter(struct mw_trace *tr, const char *name, uint64_t ns, double value)
{
    if (!tr) return;
    uint64_t idx;
    struct mw_trace_ev *e = ev_claim(tr, &idx);
    e->type = MW_EV_COUNTER;
    e->t0 = e->t1 = ns;
    e->cat = "counter";
    e->name = name;
    e->u.value = value;
    ev_commit(e, idx);
}

void mw_trace_stats(const struct mw_trace *tr, struct mw_trace_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!tr) return;
    uint64_t head = atomic_load_explicit(&tr->head, memory_order_acquire);
    out->recorded = head;
    out->capacity = tr->cap;
    out->kept = head < tr->cap ? head : tr->cap;
    out->dropped = head - out->kept;
}
