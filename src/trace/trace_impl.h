/*
 * trace_impl.h — the recorder's private layout, shared by trace.c (emitters) and
 * trace_json.c (the Chrome/Perfetto writer).
 */
#ifndef MEMWALL_TRACE_IMPL_H
#define MEMWALL_TRACE_IMPL_H

#include "memwall/trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

enum { MW_EV_IO = 1, MW_EV_ALLOC, MW_EV_FREE, MW_EV_SPAN, MW_EV_COUNTER };

#define MW_TRACE_MAX_TIERS 8
#define MW_TRACE_MAX_META 64
#define MW_TRACE_MAX_THREADS 256

/* One event slot (128 bytes: two cache lines at most, usually one store burst). */
struct mw_trace_ev {
    _Atomic uint64_t seq;      /* ring index + 1 once complete; 0 while being written */
    uint8_t type;              /* MW_EV_* */
    uint8_t op;                /* io: enum mw_trace_io_op */
    int8_t tier_a, tier_b;     /* io: from/to tier; alloc/free: tier */
    int8_t kind;               /* alloc/free: enum mw_alloc_kind */
    uint8_t nargs;             /* span: args used */
    uint16_t pad_;
    uint32_t tid;              /* kernel thread id */
    uint32_t qd;               /* io: queue depth at submit */
    int32_t result;            /* io: 0 or -errno */
    uint64_t t0, t1;           /* ns (mw_now_ns): start/submit and end/complete */
    const char *cat, *name;    /* io: name = object; alloc/free: name = label */
    union {
        struct { uint64_t bytes, offset; } io; /* alloc/free: offset = tier bytes after */
        struct mw_trace_arg args[MW_TRACE_MAX_ARGS];
        double value;          /* counter */
    } u;
};

_Static_assert(sizeof(struct mw_trace_ev) == 128, "trace.h documents 128-byte events");

struct mw_trace {
    _Atomic uint64_t head;     /* next ring index (events emitted so far) */
    char pad_[56];             /* keep the hot index on its own cache line */
    struct mw_trace_ev *ring;  /* [cap] */
    size_t cap, mask;
    uint64_t origin_ns;        /* ts 0 of the JSON */
    int pid;
    pthread_mutex_t mu;        /* intern table, metadata, thread names */
    char **intern;             /* open-addressing table [intern_cap] */
    size_t intern_cap, intern_n;
    struct { char name[32]; uint64_t budget; int set; } tiers[MW_TRACE_MAX_TIERS];
    struct { char *key, *value; } meta[MW_TRACE_MAX_META];
    int nmeta;
    struct { uint32_t tid; char *name; } threads[MW_TRACE_MAX_THREADS];
    int nthreads;
    char *prior;               /* events of the earlier segments of a resumed run (trace_continue.c) */
    size_t prior_len;
    int segments;
};

uint32_t mw_trace_tid_(void);

#endif
