/*
 * aio_uring.c — the io_uring backend: one ring, one completion thread.
 *
 * Why one completion thread: the offload pipeline submits from one thread and waits from
 * another, and callbacks must fire even when nobody is waiting. Submitting threads prepare
 * SQEs under the engine mutex (the SQ side); only the completion thread reads the CQ, so the
 * ring is never used by two threads on the same side at once. After the first burst nearly
 * all submissions come from the completion thread itself: every completed piece frees a slot
 * that it refills before it goes back to waiting (the io_uring-cp.c loop).
 *
 * Each SQE carries its piece pointer in user_data; a NULL user_data is the shutdown NOP, and a
 * pointer with its low bit set is the timeout of a MEMWALL_FAULT delay (aio_fault.c).
 */
#include "aio/aio_impl.h"

#include <errno.h>
#include <string.h>

#define MAX_RETRIES 10000 /* -EAGAIN/-EINTR retries of one piece before giving up */
#define DELAY_TAG ((uintptr_t)1) /* user_data of a piece's MEMWALL_FAULT delay timeout */

static void prep_piece(struct mw_aio *aio, struct mw_aio_piece *p)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&aio->ring);
    if (!sqe) { /* cannot happen with entries > queue_depth + 1, but stay safe */
        io_uring_submit(&aio->ring);
        sqe = io_uring_get_sqe(&aio->ring);
        MW_ASSERT(sqe);
    }
    struct mw_aio_req *r = p->req;
    if (p->delay_us) { /* MEMWALL_FAULT delay: a timeout first; its completion issues the piece */
        p->delay_ts.tv_sec = (long long)(p->delay_us / 1000000);
        p->delay_ts.tv_nsec = (long long)(p->delay_us % 1000000) * 1000;
        io_uring_prep_timeout(sqe, &p->delay_ts, 0, 0);
        io_uring_sqe_set_data(sqe, (void *)((uintptr_t)p | DELAY_TAG));
        return;
    }
    if (p->inject) io_uring_prep_nop(sqe);
    else if (r->op == MW_AIO_READ)
        io_uring_prep_read(sqe, r->fd, mw_aio_piece_buf_(p), (unsigned)(p->len - p->done), p->off + p->done);
    else
        io_uring_prep_write(sqe, r->fd, mw_aio_piece_buf_(p), (unsigned)(p->len - p->done), p->off + p->done);
    io_uring_sqe_set_data(sqe, p);
}

static void submit_all(struct mw_aio *aio)
{
    for (int tries = 0; tries < 1000; tries++) {
        int rc = io_uring_submit(&aio->ring);
        if (rc >= 0 || (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY)) {
            if (rc < 0) mw_log(MW_LOG_ERROR, "io_uring_submit failed: %s", strerror(-rc));
            return;
        }
    }
}

void mw_aio_uring_kick_(struct mw_aio *aio)
{
    unsigned n = 0;
    while (aio->retry_head) {
        struct mw_aio_piece *p = aio->retry_head;
        aio->retry_head = p->next_free;
        p->next_free = NULL;
        prep_piece(aio, p);
        n++;
    }
    struct mw_aio_piece *p;
    while ((p = mw_aio_take_piece_(aio))) {
        prep_piece(aio, p);
        n++;
    }
    if (n) submit_all(aio);
}

static void requeue(struct mw_aio *aio, struct mw_aio_piece *p)
{
    p->next_free = aio->retry_head;
    aio->retry_head = p;
}

/* One CQE for piece p; mu held. Returns a finished request or NULL. */
static struct mw_aio_req *on_cqe(struct mw_aio *aio, struct mw_aio_piece *p, int res)
{
    struct mw_aio_req *r = p->req;
    if (p->inject) return mw_aio_piece_done_(aio, p, p->inject, 0, 0);
    if ((res == -EAGAIN || res == -EINTR) && p->retries < MAX_RETRIES) {
        p->retries++;
        requeue(aio, p);
        return NULL;
    }
    if (res < 0) return mw_aio_piece_done_(aio, p, res, 0, 0);
    if (res == 0) {
        if (r->op == MW_AIO_READ) return mw_aio_piece_done_(aio, p, 0, 1, p->off + p->done);
        return mw_aio_piece_done_(aio, p, -EIO, 0, 0); /* a write that made no progress */
    }
    p->done += (uint64_t)res;
    if (p->done == p->len) return mw_aio_piece_done_(aio, p, 0, 0, 0);
    /* Short transfer. A short read at end of file ends the piece (the rest would start at an
     * unaligned offset, which O_DIRECT refuses); anything else resubmits the remainder. */
    if (r->op == MW_AIO_READ && mw_aio_at_eof_(r->fd, p->off + p->done))
        return mw_aio_piece_done_(aio, p, 0, 1, p->off + p->done);
    p->shorts++;
    requeue(aio, p);
    return NULL;
}

static void *cq_main(void *arg)
{
    struct mw_aio *aio = arg;
    for (;;) {
        struct io_uring_cqe *cqe;
        int rc = io_uring_wait_cqe(&aio->ring, &cqe);
        if (rc == -EINTR || rc == -EAGAIN) continue;
        if (rc < 0) {
            mw_log(MW_LOG_ERROR, "io_uring_wait_cqe failed: %s", strerror(-rc));
            continue;
        }
        struct mw_aio_req *done_head = NULL, *done_tail = NULL;
        int stop = 0;
        unsigned head, n = 0;
        pthread_mutex_lock(&aio->mu);
        io_uring_for_each_cqe(&aio->ring, head, cqe) {
            n++;
            struct mw_aio_piece *p = io_uring_cqe_get_data(cqe);
            if (!p) { stop = 1; continue; }
            if ((uintptr_t)p & DELAY_TAG) { /* the delay is over: now the transfer itself */
                p = (struct mw_aio_piece *)((uintptr_t)p & ~DELAY_TAG);
                p->delay_us = 0;
                requeue(aio, p);
                continue;
            }
            struct mw_aio_req *r = on_cqe(aio, p, cqe->res);
            if (r) { /* reuse the FIFO link: r has left the pending FIFO */
                r->next_ = NULL;
                if (done_tail) done_tail->next_ = r;
                else done_head = r;
                done_tail = r;
            }
        }
        io_uring_cq_advance(&aio->ring, n);
        mw_aio_uring_kick_(aio);
        pthread_mutex_unlock(&aio->mu);
        while (done_head) {
            struct mw_aio_req *r = done_head;
            done_head = r->next_;
            mw_aio_finish_(aio, r); /* r may be freed or resubmitted from here on */
        }
        if (stop) break;
    }
    return NULL;
}

int mw_aio_uring_start_(struct mw_aio *aio)
{
    unsigned entries = 8;
    while (entries < aio->cfg.queue_depth + 2) entries <<= 1;
    int rc = io_uring_queue_init(entries, &aio->ring, 0);
    if (rc < 0) return mw_error_set(rc, "io_uring_queue_init(%u) failed: %s", entries, strerror(-rc));
    aio->ring_ok = 1;
    rc = pthread_create(&aio->cq_thread, NULL, cq_main, aio);
    if (rc) {
        io_uring_queue_exit(&aio->ring);
        aio->ring_ok = 0;
        return mw_error_set(-rc, "aio: cannot start the io_uring completion thread: %s", strerror(rc));
    }
    pthread_setname_np(aio->cq_thread, "mw-aio-cq");
    aio->cq_thread_ok = 1;
    return 0;
}

void mw_aio_uring_stop_(struct mw_aio *aio)
{
    if (aio->cq_thread_ok) {
        pthread_mutex_lock(&aio->mu);
        struct io_uring_sqe *sqe = io_uring_get_sqe(&aio->ring);
        if (!sqe) { io_uring_submit(&aio->ring); sqe = io_uring_get_sqe(&aio->ring); }
        MW_ASSERT(sqe);
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data(sqe, NULL);
        submit_all(aio);
        pthread_mutex_unlock(&aio->mu);
        pthread_join(aio->cq_thread, NULL);
        aio->cq_thread_ok = 0;
    }
    if (aio->ring_ok) io_uring_queue_exit(&aio->ring);
    aio->ring_ok = 0;
}
