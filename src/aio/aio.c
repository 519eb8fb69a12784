/*
 * aio.c — the backend-independent half of the I/O engine: request validation, the pending
 * FIFO, splitting into pieces, completion accounting, errors, waiting.
 *
 * Why split requests in the engine: callers think in objects (a 64 MiB moment tensor), the
 * device wants ~1 MiB requests with a bounded number in flight. Keeping the FIFO and the piece
 * slots here means both backends throttle, split, trace and report errors identically; a
 * backend only has to move one piece and call mw_aio_piece_done_.
 */
#include "aio/aio_impl.h"
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "memwall/fsutil.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { REQ_IDLE = 0, REQ_QUEUED = 1, REQ_DONE = 2 };

void mw_aio_config_default(struct mw_aio_config *c)
{
    memset(c, 0, sizeof *c);
    c->backend = MW_AIO_AUTO;
    c->block_size = (size_t)1 << 20;
    c->queue_depth = 32;
}

const char *mw_aio_backend_name(enum mw_aio_backend b)
{
    switch (b) {
    case MW_AIO_URING: return "uring";
    case MW_AIO_THREADS: return "threads";
    default: return "auto";
    }
}

int mw_aio_backend_parse(const char *s, enum mw_aio_backend *out)
{
    if (!s) return -EINVAL;
    if (!strcmp(s, "uring") || !strcmp(s, "io_uring")) *out = MW_AIO_URING;
    else if (!strcmp(s, "threads")) *out = MW_AIO_THREADS;
    else if (!strcmp(s, "auto") || !*s) *out = MW_AIO_AUTO;
    else return -EINVAL;
    return 0;
}

enum mw_aio_backend mw_aio_backend(const struct mw_aio *aio) { return aio->backend; }

int mw_aio_init(struct mw_aio **out, const struct mw_aio_config *cin)
{
    *out = NULL;
    struct mw_aio_config c;
    if (cin) c = *cin;
    else mw_aio_config_default(&c);
    if (!c.block_size) c.block_size = (size_t)1 << 20;
    if (!c.queue_depth) c.queue_depth = 32;
    if (c.block_size % 4096 || c.block_size > ((size_t)1 << 30) || c.queue_depth > 4096)
        return mw_error_set(-EINVAL, "aio: block size %zu must be a multiple of 4096 up to 1 GiB and queue depth "
                                     "%u at most 4096", c.block_size, c.queue_depth);
    enum mw_aio_backend want = c.backend;
    const char *env = getenv("MEMWALL_AIO");
    if (want == MW_AIO_AUTO && env && *env && mw_aio_backend_parse(env, &want))
        return mw_error_set(-EINVAL, "MEMWALL_AIO='%s': expected uring, threads or auto", env);

    struct mw_aio_faults faults;
    int frc = mw_aio_fault_parse(getenv("MEMWALL_FAULT"), &faults);
    if (frc) return frc;
    if (faults.n) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            mw_log(MW_LOG_WARN, "MEMWALL_FAULT=%s: injecting I/O faults (a test setting)", getenv("MEMWALL_FAULT"));
    }

    struct mw_aio *aio = calloc(1, sizeof *aio);
    if (!aio) return mw_error_set(-ENOMEM, "aio: out of memory");
    aio->cfg = c;
    aio->env_faults = faults;
    aio->pieces = calloc(c.queue_depth, sizeof *aio->pieces);
    if (!aio->pieces) { free(aio); return mw_error_set(-ENOMEM, "aio: out of memory"); }
    for (unsigned i = 0; i < c.queue_depth; i++) {
        aio->pieces[i].next_free = aio->free_pieces;
        aio->free_pieces = &aio->pieces[i];
    }
    pthread_mutex_init(&aio->mu, NULL);
    pthread_cond_init(&aio->cv_done, NULL);
    pthread_cond_init(&aio->cv_work, NULL);

    int rc = -ENOSYS;
    if (want != MW_AIO_THREADS) {
        rc = mw_aio_uring_start_(aio);
        if (rc == 0) aio->backend = MW_AIO_URING;
        else if (want == MW_AIO_URING) goto err;
        else {
            static atomic_int warned;
            if (!atomic_exchange(&warned, 1))
                mw_log(MW_LOG_WARN, "io_uring unavailable (%s); using the pread/pwrite thread pool",
                       mw_error_msg());
        }
    }
    if (rc) {
        rc = mw_aio_threads_start_(aio);
        if (rc) goto err;
        aio->backend = MW_AIO_THREADS;
    }
    *out = aio;
    return 0;
err:
    pthread_cond_destroy(&aio->cv_work);
    pthread_cond_destroy(&aio->cv_done);
    pthread_mutex_destroy(&aio->mu);
    free(aio->pieces);
    free(aio);
    return rc;
}

void mw_aio_free(struct mw_aio *aio)
{
    if (!aio) return;
    mw_aio_wait_all(aio);
    if (aio->backend == MW_AIO_URING) mw_aio_uring_stop_(aio);
    else mw_aio_threads_stop_(aio);
    pthread_cond_destroy(&aio->cv_work);
    pthread_cond_destroy(&aio->cv_done);
    pthread_mutex_destroy(&aio->mu);
    free(aio->pieces);
    free(aio);
}

static void kick(struct mw_aio *aio)
{
    if (aio->backend == MW_AIO_URING) mw_aio_uring_kick_(aio);
    else mw_aio_threads_kick_(aio);
}

int mw_aio_submit(struct mw_aio *aio, struct mw_aio_req *r)
{
    const char *obj = r->object ? r->object : "?";
    if (r->op != MW_AIO_READ && r->op != MW_AIO_WRITE)
        return mw_error_set(-EINVAL, "aio: request for '%s' has invalid op %d", obj, (int)r->op);
    if (!r->buf || !r->len || r->fd < 0)
        return mw_error_set(-EINVAL, "aio: request for '%s' needs fd >= 0, a buffer and len > 0", obj);
    if (r->offset > UINT64_MAX - r->len)
        return mw_error_set(-EINVAL, "aio: request for '%s' overflows the file offset range", obj);
    if (__atomic_load_n(&r->state_, __ATOMIC_ACQUIRE) == REQ_QUEUED)
        return mw_error_set(-EBUSY, "aio: request for '%s' submitted again while in flight", obj);
    r->result = 0;
    r->done_bytes = 0;
    r->errmsg[0] = 0;
    r->next_ = NULL;
    r->issued_ = 0;
    r->pieces_left_ = 0;
    r->eof_at_ = UINT64_MAX;
    r->err_at_ = UINT64_MAX;
    r->complete_ns = 0;
    r->submit_ns = mw_now_ns();
    __atomic_store_n(&r->state_, REQ_QUEUED, __ATOMIC_RELAXED);

    pthread_mutex_lock(&aio->mu);
    if (r->flags & MW_AIO_URGENT) { /* behind the urgent ones, ahead of the rest */
        struct mw_aio_req **at = aio->pend_urgent ? &aio->pend_urgent->next_ : &aio->pend_head;
        r->next_ = *at;
        *at = r;
        if (!r->next_) aio->pend_tail = r;
        aio->pend_urgent = r;
    } else {
        if (aio->pend_tail) aio->pend_tail->next_ = r;
        else aio->pend_head = r;
        aio->pend_tail = r;
    }
    aio->outstanding++;
    kick(aio);
    pthread_mutex_unlock(&aio->mu);
    return 0;
}

struct mw_aio_piece *mw_aio_take_piece_(struct mw_aio *aio)
{
    struct mw_aio_req *r = aio->pend_head;
    if (!r || !aio->free_pieces) return NULL;
    struct mw_aio_piece *p = aio->free_pieces;
    aio->free_pieces = p->next_free;
    p->req = r;
    p->off = r->offset + r->issued_;
    p->len = MW_MIN((uint64_t)aio->cfg.block_size, r->len - r->issued_);
    p->done = 0;
    p->retries = 0;
    p->shorts = 0;
    p->inject = 0;
    p->inject_env = 0;
    p->delay_us = 0;
    if (aio->fault.err && aio->fault.op == r->op && p->off + p->len > aio->fault.from)
        p->inject = aio->fault.err;
    if (aio->env_faults.n) {
        int err = p->inject;
        mw_aio_fault_pick_(&aio->env_faults, r->op, &err, &p->delay_us);
        if (err != p->inject) { p->inject = err; p->inject_env = 1; }
    }
    r->issued_ += p->len;
    r->pieces_left_++;
    if (r->issued_ == r->len) { /* fully issued: leave the FIFO */
        aio->pend_head = r->next_;
        if (!aio->pend_head) aio->pend_tail = NULL;
        if (aio->pend_urgent == r) aio->pend_urgent = NULL;
        r->next_ = NULL;
    }
    aio->in_flight++;
    if (aio->in_flight > aio->stats.max_in_flight) aio->stats.max_in_flight = aio->in_flight;
    p->qd = aio->in_flight;
    p->submit_ns = mw_now_ns();
    return p;
}

int mw_aio_at_eof_(int fd, uint64_t end)
{
    struct stat st;
    return fstat(fd, &st) == 0 && (uint64_t)st.st_size <= end;
}

static void set_error(struct mw_aio_req *r, const struct mw_aio_piece *p, int res)
{
    /* Report the failing piece with the lowest offset: deterministic whatever the completion order. */
    if (r->result && r->err_at_ <= p->off) return;
    r->result = res;
    r->err_at_ = p->off;
    const char *op = r->op == MW_AIO_READ ? "read" : "write";
    char hint[400] = "";
    if (res == -EINVAL) snprintf(hint, sizeof hint, " (with O_DIRECT, buffer address, file offset and length must be 4096-aligned)");
    else if (res == -EFBIG) snprintf(hint, sizeof hint, " (the file size limit, ulimit -f, is reached)");
    else mw_fs_full_note(res, r->path, hint, sizeof hint);
    char b[32];
    snprintf(r->errmsg, sizeof r->errmsg, "%s of %s at offset %llu in %s (object '%s') failed: %s%s%s", op,
             mw_fmt_bytes(b, sizeof b, p->len), (unsigned long long)(p->off + p->done),
             r->path ? r->path : "(fd)", r->object ? r->object : "?", mw_strerror(res), hint,
             p->inject_env ? " [injected by MEMWALL_FAULT]" : "");
}

struct mw_aio_req *mw_aio_piece_done_(struct mw_aio *aio, struct mw_aio_piece *p, int res, int eof,
                                      uint64_t eof_off)
{
    struct mw_aio_req *r = p->req;
    uint64_t now = mw_now_ns();
    if (res < 0) set_error(r, p, res);
    if (eof && eof_off < r->eof_at_) r->eof_at_ = eof_off;
    r->done_bytes += p->done;
    if (r->op == MW_AIO_READ) aio->stats.bytes_read += p->done;
    else aio->stats.bytes_written += p->done;
    aio->stats.pieces++;
    aio->stats.eagain_retries += (uint64_t)p->retries;
    aio->stats.short_resubmits += (uint64_t)p->shorts;
    if (aio->cfg.trace) {
        struct mw_trace_io ev = {
            .op = r->op == MW_AIO_READ ? MW_TRACE_READ : MW_TRACE_WRITE,
            .from_tier = r->op == MW_AIO_READ ? MW_TIER_NVME : MW_TIER_DRAM,
            .to_tier = r->op == MW_AIO_READ ? MW_TIER_DRAM : MW_TIER_NVME,
            .bytes = p->len, .offset = p->off, .queue_depth = p->qd,
            .submit_ns = p->submit_ns, .complete_ns = now, .object = r->object, .result = res,
        };
        mw_trace_io(aio->cfg.trace, &ev);
    }
    p->req = NULL;
    p->next_free = aio->free_pieces;
    aio->free_pieces = p;
    aio->in_flight--;
    r->pieces_left_--;
    if (r->pieces_left_ || r->issued_ < r->len) return NULL;

    r->complete_ns = now;
    if (!r->result && r->eof_at_ != UINT64_MAX && !(r->flags & MW_AIO_ALLOW_SHORT)) {
        r->result = MW_EFORMAT;
        snprintf(r->errmsg, sizeof r->errmsg,
                 "short read of %s (object '%s'): the file ends at byte %llu, inside the requested range "
                 "[%llu, %llu)", r->path ? r->path : "(fd)", r->object ? r->object : "?",
                 (unsigned long long)r->eof_at_, (unsigned long long)r->offset,
                 (unsigned long long)(r->offset + r->len));
    }
    aio->stats.requests++;
    if (r->result) {
        aio->stats.errors++;
        if (!aio->first_err) {
            aio->first_err = r->result;
            memcpy(aio->first_msg, r->errmsg, sizeof aio->first_msg);
        }
    }
    return r;
}

void mw_aio_finish_(struct mw_aio *aio, struct mw_aio_req *r)
{
    if (r->cb) {
        __atomic_store_n(&r->state_, REQ_DONE, __ATOMIC_RELEASE);
        r->cb(r, r->user); /* last access to r: the callback may free or resubmit it */
        pthread_mutex_lock(&aio->mu);
    } else {
        pthread_mutex_lock(&aio->mu);
        /* Under mu so a waiter cannot miss the broadcast; r is not touched afterwards. */
        __atomic_store_n(&r->state_, REQ_DONE, __ATOMIC_RELEASE);
    }
    aio->outstanding--;
    pthread_cond_broadcast(&aio->cv_done);
    pthread_mutex_unlock(&aio->mu);
}

int mw_aio_test(struct mw_aio_req *r)
{
    return __atomic_load_n(&r->state_, __ATOMIC_ACQUIRE) == REQ_DONE;
}

int mw_aio_wait(struct mw_aio *aio, struct mw_aio_req *r)
{
    pthread_mutex_lock(&aio->mu);
    while (__atomic_load_n(&r->state_, __ATOMIC_ACQUIRE) == REQ_QUEUED)
        pthread_cond_wait(&aio->cv_done, &aio->mu);
    pthread_mutex_unlock(&aio->mu);
    if (r->result) mw_error_set(r->result, "%s", r->errmsg);
    return r->result;
}

int mw_aio_wait_all(struct mw_aio *aio)
{
    pthread_mutex_lock(&aio->mu);
    while (aio->outstanding) pthread_cond_wait(&aio->cv_done, &aio->mu);
    int rc = aio->first_err;
    char msg[MW_AIO_ERRMSG_LEN];
    memcpy(msg, aio->first_msg, sizeof msg);
    aio->first_err = 0;
    aio->first_msg[0] = 0;
    pthread_mutex_unlock(&aio->mu);
    if (rc) mw_error_set(rc, "%s", msg);
    return rc;
}

static int sync_rw(struct mw_aio *aio, enum mw_aio_op op, int fd, void *buf, uint64_t len, uint64_t off,
                   const char *object, const char *path)
{
    struct mw_aio_req r;
    memset(&r, 0, sizeof r);
    r.op = op;
    r.fd = fd;
    r.buf = buf;
    r.len = len;
    r.offset = off;
    r.object = object;
    r.path = path;
    int rc = mw_aio_submit(aio, &r);
    if (rc) return rc;
    return mw_aio_wait(aio, &r);
}

int mw_aio_pread(struct mw_aio *aio, int fd, void *buf, uint64_t len, uint64_t offset, const char *object,
                 const char *path)
{
    return sync_rw(aio, MW_AIO_READ, fd, buf, len, offset, object, path);
}

int mw_aio_pwrite(struct mw_aio *aio, int fd, const void *buf, uint64_t len, uint64_t offset,
                  const char *object, const char *path)
{
    return sync_rw(aio, MW_AIO_WRITE, fd, (void *)buf, len, offset, object, path);
}

void mw_aio_stats(struct mw_aio *aio, struct mw_aio_stats *out)
{
    pthread_mutex_lock(&aio->mu);
    *out = aio->stats;
    pthread_mutex_unlock(&aio->mu);
}

void mw_aio_inject_fault(struct mw_aio *aio, enum mw_aio_op op, uint64_t from_offset, int err)
{
    pthread_mutex_lock(&aio->mu);
    aio->fault.err = err;
    aio->fault.op = op;
    aio->fault.from = from_offset;
    pthread_mutex_unlock(&aio->mu);
}
