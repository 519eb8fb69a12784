/*
 * aio_threads.c — the pread/pwrite thread-pool backend.
 *
 * Why: io_uring may be disabled (kernel.io_uring_disabled, seccomp in containers, old kernels).
 * The pool keeps exactly the engine's semantics — same pieces, same queue_depth cap (the piece
 * slots), same short/EAGAIN handling, same errors and trace — so every test runs on both.
 * Each worker takes one piece at a time from the shared FIFO and finishes it synchronously.
 */
#include "aio/aio_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_RETRIES 10000

/* Moves one piece; returns 0 or -errno; *eof set when a read hit end of file. */
static int do_piece(struct mw_aio_piece *p, int *eof)
{
    struct mw_aio_req *r = p->req;
    *eof = 0;
    if (p->inject) return p->inject;
    while (p->done < p->len) {
        size_t want = (size_t)(p->len - p->done);
        off_t off = (off_t)(p->off + p->done);
        ssize_t n = r->op == MW_AIO_READ ? pread(r->fd, mw_aio_piece_buf_(p), want, off)
                                         : pwrite(r->fd, mw_aio_piece_buf_(p), want, off);
        if (n < 0) {
            if ((errno == EINTR || errno == EAGAIN) && p->retries < MAX_RETRIES) { p->retries++; continue; }
            return -errno;
        }
        if (n == 0) {
            if (r->op == MW_AIO_READ) { *eof = 1; return 0; }
            return -EIO;
        }
        p->done += (uint64_t)n;
        if (p->done < p->len) {
            /* Same rule as io_uring: a short read at end of file ends the piece. */
            if (r->op == MW_AIO_READ && mw_aio_at_eof_(r->fd, p->off + p->done)) { *eof = 1; return 0; }
            p->shorts++;
        }
    }
    return 0;
}

static void *worker_main(void *arg)
{
    struct mw_aio *aio = arg;
    pthread_mutex_lock(&aio->mu);
    for (;;) {
        struct mw_aio_piece *p = mw_aio_take_piece_(aio);
        if (!p) {
            if (aio->stop) break;
            pthread_cond_wait(&aio->cv_work, &aio->mu);
            continue;
        }
        /* Chain the wake-ups: one signal per available piece instead of waking every worker
         * on every submit (a thundering herd on a 2-core machine). */
        if (aio->pend_head && aio->free_pieces) pthread_cond_signal(&aio->cv_work);
        pthread_mutex_unlock(&aio->mu);
        if (p->delay_us) { /* MEMWALL_FAULT delay: this worker is the slow disk */
            struct timespec ts = {(time_t)(p->delay_us / 1000000), (long)(p->delay_us % 1000000) * 1000};
            while (nanosleep(&ts, &ts) && errno == EINTR) {}
        }
        int eof = 0;
        int res = do_piece(p, &eof);
        pthread_mutex_lock(&aio->mu);
        struct mw_aio_req *r = mw_aio_piece_done_(aio, p, res, eof, p->off + p->done);
        if (r) {
            pthread_mutex_unlock(&aio->mu);
            mw_aio_finish_(aio, r); /* r may be freed or resubmitted from here on */
            pthread_mutex_lock(&aio->mu);
        }
    }
    pthread_mutex_unlock(&aio->mu);
    return NULL;
}

void mw_aio_threads_kick_(struct mw_aio *aio)
{
    if (aio->pend_head && aio->free_pieces) pthread_cond_signal(&aio->cv_work);
}

int mw_aio_threads_start_(struct mw_aio *aio)
{
    unsigned n = aio->cfg.threads ? aio->cfg.threads : MW_MIN(aio->cfg.queue_depth, 64u);
    if (n > aio->cfg.queue_depth) n = aio->cfg.queue_depth; /* more could never be busy */
    aio->workers = calloc(n, sizeof *aio->workers);
    if (!aio->workers) return mw_error_set(-ENOMEM, "aio: out of memory");
    for (unsigned i = 0; i < n; i++) {
        int rc = pthread_create(&aio->workers[i], NULL, worker_main, aio);
        if (rc) {
            aio->nworkers = i;
            mw_aio_threads_stop_(aio);
            return mw_error_set(-rc, "aio: cannot start I/O worker %u: %s", i, strerror(rc));
        }
        char name[24];
        snprintf(name, sizeof name, "mw-aio-%u", i);
        name[15] = 0; /* the kernel's limit for thread names */
        pthread_setname_np(aio->workers[i], name);
    }
    aio->nworkers = n;
    return 0;
}

void mw_aio_threads_stop_(struct mw_aio *aio)
{
    pthread_mutex_lock(&aio->mu);
    aio->stop = 1;
    pthread_cond_broadcast(&aio->cv_work);
    pthread_mutex_unlock(&aio->mu);
    for (unsigned i = 0; i < aio->nworkers; i++) pthread_join(aio->workers[i], NULL);
    free(aio->workers);
    aio->workers = NULL;
    aio->nworkers = 0;
}
