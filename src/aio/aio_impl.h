/*
 * aio_impl.h — private to src/aio: the engine object shared by the common request logic
 * (aio.c) and the two backends (aio_uring.c, aio_threads.c).
 *
 * Locking: one mutex (mu) guards the pending FIFO, the piece slots, the counters and — for
 * io_uring — the submission queue. The completion side of the ring is read only by the
 * completion thread. Callbacks always run with mu released.
 */
#ifndef MEMWALL_AIO_IMPL_H
#define MEMWALL_AIO_IMPL_H

#include "memwall/aio.h"

#include <liburing.h>
#include <pthread.h>
#include <stdint.h>

/* MEMWALL_FAULT (aio_fault.c; syntax in docs/io.md). */
#define MW_AIO_FAULT_MAX 4
struct mw_aio_fault_rule {
    int op;                    /* MW_AIO_READ, MW_AIO_WRITE, or -1: both */
    int err;                   /* -EIO, -ENOSPC; 0: a delay rule */
    uint64_t delay_us;
    uint64_t after;            /* pieces of op that pass before the rule applies */
    uint64_t count;            /* pieces it applies to from then on (UINT64_MAX: all) */
    uint64_t seen;             /* pieces of op issued so far (engine mutex) */
};
struct mw_aio_faults { int n; struct mw_aio_fault_rule rule[MW_AIO_FAULT_MAX]; };
/* Parses a MEMWALL_FAULT value (NULL or "": no rules). Returns 0 or -EINVAL with the message. */
int mw_aio_fault_parse(const char *spec, struct mw_aio_faults *out);
/* mu held: counts one issued piece of op against the rules; sets *err (if 0) and raises
 * *delay_us for the rules that apply to it. */
void mw_aio_fault_pick_(struct mw_aio_faults *f, enum mw_aio_op op, int *err, uint64_t *delay_us);

/* One in-flight piece (<= block_size bytes) of a request. */
struct mw_aio_piece {
    struct mw_aio_req *req;
    uint64_t off;              /* file offset of the piece start */
    uint64_t len;              /* bytes in the piece */
    uint64_t done;             /* bytes transferred so far (short transfers resubmit the rest) */
    uint64_t submit_ns;
    uint32_t qd;               /* pieces in flight when issued (including this one) */
    int inject;                /* injected failure (0: none) */
    int inject_env;            /* ... and it came from MEMWALL_FAULT (said in the message) */
    uint64_t delay_us;         /* MEMWALL_FAULT latency still to add before the transfer */
    struct __kernel_timespec delay_ts; /* io_uring: the timeout SQE's time (kept until it fires) */
    int retries;               /* -EAGAIN/-EINTR retries of this piece */
    int shorts;                /* short transfers whose rest was resubmitted */
    struct mw_aio_piece *next_free;
};

struct mw_aio {
    struct mw_aio_config cfg;
    enum mw_aio_backend backend;
    pthread_mutex_t mu;
    pthread_cond_t cv_done;    /* a request completed (waiters) */
    pthread_cond_t cv_work;    /* threads backend: a piece is ready / stop */
    struct mw_aio_req *pend_head, *pend_tail; /* requests with bytes not yet issued */
    struct mw_aio_req *pend_urgent;           /* the last MW_AIO_URGENT one among them (they lead) */
    struct mw_aio_piece *pieces;              /* [queue_depth] */
    struct mw_aio_piece *free_pieces;
    struct mw_aio_piece *retry_head;          /* io_uring: pieces to reissue (still in flight) */
    uint32_t in_flight;        /* pieces issued and not completed */
    uint64_t outstanding;      /* requests submitted and not yet finished (callback returned) */
    int first_err;             /* first failure since the last wait_all */
    char first_msg[MW_AIO_ERRMSG_LEN];
    struct mw_aio_stats stats;
    struct { int err; enum mw_aio_op op; uint64_t from; } fault; /* mw_aio_inject_fault */
    struct mw_aio_faults env_faults;                              /* MEMWALL_FAULT */
    int stop;
    /* io_uring backend */
    struct io_uring ring;
    int ring_ok;
    pthread_t cq_thread;
    int cq_thread_ok;
    /* threads backend */
    pthread_t *workers;
    unsigned nworkers;
};

/* Common logic (aio.c), called with mu held unless stated. */
struct mw_aio_piece *mw_aio_take_piece_(struct mw_aio *aio);
/* Records a finished piece (res: 0 or -errno; eof: the read hit end of file at file offset
 * eof_off). Returns the request if this was its last piece, else NULL. */
struct mw_aio_req *mw_aio_piece_done_(struct mw_aio *aio, struct mw_aio_piece *p, int res, int eof,
                                      uint64_t eof_off);
/* Finishes a request: callback or done flag, counters, wake-ups. Called WITHOUT mu. */
void mw_aio_finish_(struct mw_aio *aio, struct mw_aio_req *req);
/* Buffer address for the untransferred rest of a piece. */
static inline char *mw_aio_piece_buf_(const struct mw_aio_piece *p)
{
    return (char *)p->req->buf + (p->off - p->req->offset) + p->done;
}
/* fstat-based: does a short read at file offset `end` stop at end of file? */
int mw_aio_at_eof_(int fd, uint64_t end);

/* Backends. */
int mw_aio_uring_start_(struct mw_aio *aio);   /* 0 or -errno (io_uring unavailable) */
void mw_aio_uring_kick_(struct mw_aio *aio);   /* issue pending pieces; mu held */
void mw_aio_uring_stop_(struct mw_aio *aio);
int mw_aio_threads_start_(struct mw_aio *aio);
void mw_aio_threads_kick_(struct mw_aio *aio); /* mu held */
void mw_aio_threads_stop_(struct mw_aio *aio);

#endif
