/*
 * memwall/aio.h — the asynchronous I/O engine between host buffers and files (NVMe).
 *
 * Why: the offload engine streams optimizer state to and from SSD while the CPU updates other
 * subgroups. It needs many requests in flight, split into device-friendly pieces, with every
 * short transfer and transient error handled inside the engine so callers see one result per
 * request.
 *
 * Backends (same interface, same semantics, same tests):
 *   MW_AIO_URING    io_uring through liburing; one ring, at most queue_depth pieces in flight.
 *   MW_AIO_THREADS  a pool of threads doing pread/pwrite (config.threads, default
 *                   min(queue_depth, 64)).
 *   MW_AIO_AUTO     MEMWALL_AIO=uring|threads from the environment if set, else io_uring, falling
 *                   back to threads (with one log line) when io_uring cannot be set up.
 *
 * Requests: a caller-owned struct mw_aio_req names fd, buffer, length and file offset. The
 * engine splits it into block_size pieces, keeps at most queue_depth pieces in flight across all
 * requests (FIFO), resubmits the rest of a short read/write, retries -EAGAIN/-EINTR, and
 * completes the request once all pieces are done. For an O_DIRECT fd, buffer, offset and length
 * must be 4096-aligned (the kernel's -EINVAL is reported with that hint).
 *
 * Results: req->result is 0 or a negative code: -errno from the kernel (-EIO, -ENOSPC, -EFBIG,
 * ...), or MW_EFORMAT when a read reaches end of file before `len` bytes (unless
 * MW_AIO_ALLOW_SHORT, then result 0 and req->done_bytes says how many bytes were read).
 * req->errmsg holds a message naming object, file (path) and offset (of the failing piece with
 * the lowest offset, when several fail); mw_aio_wait and
 * mw_aio_wait_all copy it into the calling thread's mw_error_msg().
 *
 * Threading contract:
 *   - mw_aio_submit, mw_aio_wait, mw_aio_test, mw_aio_wait_all and mw_aio_stats may be called
 *     from any number of threads at once (e.g. submit from a pipeline thread, wait from another).
 *     On io_uring a submitting thread must outlive the requests it submitted: the kernel cancels
 *     a thread's pending requests when it exits (they end with -ECANCELED). memwall's submitters
 *     (the training thread, the pipeline and completion threads) live as long as the engine.
 *   - Completion callbacks run on an engine thread (the io_uring completion thread, or a pool
 *     worker). They must be short and must not wait on the engine (no mw_aio_wait/wait_all
 *     inside a callback); they MAY submit new requests. Callbacks of different requests may run
 *     concurrently on the threads backend.
 *   - A request is done when its callback is invoked (cb != NULL) or when mw_aio_test returns 1
 *     / mw_aio_wait returns (cb == NULL). With a callback, the engine's last access to the
 *     request is that call: the callback may free or resubmit it. Use either a callback or
 *     wait/test for one request, not both.
 *   - mw_aio_wait_all returns once no request is outstanding: every request submitted before
 *     the call (and any submitted meanwhile, e.g. from callbacks) has completed and its
 *     callback has returned.
 *   - mw_aio_free must not race with submitters; it waits for outstanding requests first.
 *
 * Usage:
 *   struct mw_aio_config c; mw_aio_config_default(&c); c.queue_depth = 32;
 *   struct mw_aio *aio; if (mw_aio_init(&aio, &c)) die(mw_error_msg());
 *   struct mw_aio_req r = { .op = MW_AIO_READ, .fd = fd, .buf = buf, .len = n, .offset = 0,
 *                           .object = "sg17.exp_avg", .path = "/nvme/memwall.0.dat" };
 *   mw_aio_submit(aio, &r);  ...  int rc = mw_aio_wait(aio, &r);
 *   mw_aio_free(aio);
 */
#ifndef MEMWALL_AIO_H
#define MEMWALL_AIO_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mw_trace;
struct mw_aio; /* opaque engine */

enum mw_aio_backend { MW_AIO_AUTO = 0, MW_AIO_URING = 1, MW_AIO_THREADS = 2 };
enum mw_aio_op { MW_AIO_READ = 0, MW_AIO_WRITE = 1 };

struct mw_aio_config {
    enum mw_aio_backend backend; /* default MW_AIO_AUTO */
    size_t block_size;           /* bytes per piece, multiple of 4096, <= 1 GiB; default 1 MiB */
    unsigned queue_depth;        /* pieces in flight, 1..4096; default 32 */
    unsigned threads;            /* threads backend: workers; 0 = queue_depth (capped at 64) */
    struct mw_trace *trace;      /* NULL: no tracing; else one I/O event per piece */
};
void mw_aio_config_default(struct mw_aio_config *c);

int mw_aio_init(struct mw_aio **out, const struct mw_aio_config *c);
void mw_aio_free(struct mw_aio *aio);

enum mw_aio_backend mw_aio_backend(const struct mw_aio *aio); /* the one in use (never AUTO) */
const char *mw_aio_backend_name(enum mw_aio_backend b);     /* "auto", "uring", "threads" */
/* Parses "uring" / "threads" / "auto"; returns 0 or -EINVAL. */
int mw_aio_backend_parse(const char *s, enum mw_aio_backend *out);

struct mw_aio_req;
typedef void (*mw_aio_cb)(struct mw_aio_req *req, void *user);

/* Request flags. */
enum {
    MW_AIO_ALLOW_SHORT = 1u << 0, /* a read ending at EOF is not an error (see done_bytes) */
    MW_AIO_URGENT = 1u << 1,      /* someone waits on it: its pieces are issued before those of
                                     queued requests without the flag (FIFO among urgent ones);
                                     pieces already in flight are not preempted */
};

#define MW_AIO_ERRMSG_LEN 512

/* One request. Caller-owned; zero-initialise, fill the first block, keep it alive and
 * untouched until done. */
struct mw_aio_req {
    /* --- set by the caller --- */
    enum mw_aio_op op;
    int fd;
    void *buf;                 /* host memory, len bytes */
    uint64_t len;              /* bytes */
    uint64_t offset;           /* byte offset in the file */
    unsigned flags;            /* MW_AIO_* request flags */
    mw_aio_cb cb;              /* NULL: poll with mw_aio_test / mw_aio_wait */
    void *user;                /* passed to cb */
    const char *object;        /* for messages and the trace: static/interned; may be NULL */
    const char *path;          /* file name for messages; may be NULL */
    /* --- set by the engine --- */
    int result;                /* 0 or negative code; valid once done */
    uint64_t done_bytes;       /* bytes transferred (== len on success without ALLOW_SHORT) */
    uint64_t submit_ns, complete_ns; /* mw_now_ns() at submit and at completion */
    char errmsg[MW_AIO_ERRMSG_LEN];  /* "" or the detail of a failure */
    /* --- engine private --- */
    struct mw_aio_req *next_;  /* pending FIFO link */
    uint64_t issued_;          /* bytes handed to pieces so far */
    uint32_t pieces_left_;     /* pieces issued and not yet completed */
    int state_;                /* 0 idle, 1 queued, 2 done (atomic access) */
    uint64_t eof_at_;          /* lowest file offset where a read saw EOF (UINT64_MAX: none) */
    uint64_t err_at_;          /* file offset of the reported failure (the lowest failing piece) */
};

/* Queue a request (never blocks on I/O; pieces beyond queue_depth wait in a FIFO, urgent requests
 * first). Returns 0, or
 * -EINVAL for a malformed request (nothing queued, message set). The request then completes
 * asynchronously with its result. */
int mw_aio_submit(struct mw_aio *aio, struct mw_aio_req *req);
/* 1 when req (submitted without a callback) is done, else 0. */
int mw_aio_test(struct mw_aio_req *req);
/* Blocks until req (submitted without a callback) is done; returns req->result and puts
 * req->errmsg into this thread's mw_error_msg() on failure. */
int mw_aio_wait(struct mw_aio *aio, struct mw_aio_req *req);
/* Blocks until no request is outstanding; returns 0 or the first failure's result seen since
 * the previous wait_all (with its message). */
int mw_aio_wait_all(struct mw_aio *aio);

/* Synchronous convenience: one request, submitted and waited for. */
int mw_aio_pread(struct mw_aio *aio, int fd, void *buf, uint64_t len, uint64_t offset,
                 const char *object, const char *path);
int mw_aio_pwrite(struct mw_aio *aio, int fd, const void *buf, uint64_t len, uint64_t offset,
                  const char *object, const char *path);

struct mw_aio_stats {
    uint64_t bytes_read, bytes_written;
    uint64_t requests, pieces;   /* completed */
    uint64_t short_resubmits;    /* short read/write remainders resubmitted */
    uint64_t eagain_retries;     /* -EAGAIN / -EINTR retries */
    uint64_t errors;             /* requests completed with result < 0 */
    uint32_t max_in_flight;      /* most pieces in flight at once */
};
void mw_aio_stats(struct mw_aio *aio, struct mw_aio_stats *out);

/*
 * Fault injection for tests: every piece of operation `op` whose file offset range reaches
 * `from_offset` or beyond fails with `err` (e.g. -ENOSPC) without touching the file, until
 * cleared with err == 0. Applies to requests submitted after the call.
 */
void mw_aio_inject_fault(struct mw_aio *aio, enum mw_aio_op op, uint64_t from_offset, int err);

#ifdef __cplusplus
}
#endif
#endif
