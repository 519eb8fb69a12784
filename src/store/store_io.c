/*
 * store_io.c — the store's data path: an object range becomes one engine request per stripe
 * unit it touches; crc32c computed on write (or taken from the caller, io->crcs), checked on read
 * once the last part lands (or by the caller, MW_STORE_VERIFY_LATER and mw_store_io_verify).
 *
 * Why checksums in DRAM: a crc per 64 KiB block is 1/16384 of the data, cheap to keep, and it
 * catches what O_DIRECT makes easy to miss — a torn or misdirected write, a bad sector, a
 * wrong offset in our own extent arithmetic — at the first read instead of as a silently
 * diverging loss curve.
 */
#include "store/store_impl.h"
#include "memwall/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IO_IDLE = 0, IO_INFLIGHT = 1, IO_DONE = 2 };

static void set_msg(struct mw_store_io *io, const char *fmt, const char *a, unsigned long long b,
                    const char *c, unsigned long long d, unsigned e, unsigned f)
{
    snprintf(io->errmsg, sizeof io->errmsg, fmt, a, b, c, d, e, f);
}

/* Checks the blocks [b0, b1) that the read covers completely. Returns 0 or MW_ECHECKSUM
 * (message set). */
static int verify(struct mw_store *st, struct mw_store_io *io, uint64_t b0, uint64_t b1)
{
    struct mw_store_obj *o = io->obj;
    uint64_t cb = st->cfg.crc_block, end = io->offset + io->len;
    for (uint64_t b = MW_MAX(b0, (io->offset + cb - 1) / cb); b < MW_MIN(b1, o->nblocks); b++) {
        uint64_t bs = b * cb, be = MW_MIN(bs + cb, o->size);
        if (be > end) break;
        if (!o->crc_valid[b]) continue;
        uint32_t got = mw_crc32c(0, (const char *)io->buf + (bs - io->offset), (size_t)(be - bs));
        if (got == o->crc[b]) continue;
        atomic_fetch_add(&st->checksum_failures, 1);
        const char *path = "?";
        uint64_t foff = 0;
        mw_store_locate(st, o, bs, NULL, &path, &foff);
        set_msg(io, "checksum mismatch in object '%s' at object offset %llu (file %s, offset %llu): "
                    "crc32c stored 0x%08x, read 0x%08x — the data on disk is corrupt",
                o->name, (unsigned long long)bs, path, (unsigned long long)foff, o->crc[b], got);
        return MW_ECHECKSUM;
    }
    return 0;
}

int mw_store_io_verify(struct mw_store *st, struct mw_store_io *io, uint64_t lo, uint64_t hi)
{
    if (io->op != MW_AIO_READ || io->result || lo > hi || hi > io->len)
        return mw_error_set(-EINVAL, "store: verify needs a finished read and a range inside it");
    if (!st->cfg.checksum || lo == hi) return 0;
    uint64_t cb = st->cfg.crc_block;
    int rc = verify(st, io, (io->offset + lo) / cb, (io->offset + hi + cb - 1) / cb);
    if (rc) mw_error_set(rc, "%s", io->errmsg);
    return rc;
}

static void io_finish(struct mw_store *st, struct mw_store_io *io)
{
    int rc = 0;
    for (uint32_t i = 0; i < io->nparts_; i++) {
        if (!io->parts_[i].result) continue;
        rc = io->parts_[i].result;
        /* The engine's message already names the object, the file and the offset. */
        snprintf(io->errmsg, sizeof io->errmsg, "%s", io->parts_[i].errmsg);
        break;
    }
    if (!rc && io->op == MW_AIO_READ && st->cfg.checksum && !(io->flags & MW_STORE_VERIFY_LATER))
        rc = verify(st, io, 0, UINT64_MAX);
    if (!rc) atomic_fetch_add(io->op == MW_AIO_READ ? &st->bytes_read : &st->bytes_written, io->len);
    io->result = rc;
    free(io->parts_);
    io->parts_ = NULL;
    if (io->cb) {
        __atomic_store_n(&io->state_, IO_DONE, __ATOMIC_RELEASE);
        io->cb(io, io->user); /* last access to io */
        pthread_mutex_lock(&st->mu);
    } else {
        pthread_mutex_lock(&st->mu);
        __atomic_store_n(&io->state_, IO_DONE, __ATOMIC_RELEASE);
    }
    st->outstanding--;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

static void part_done(struct mw_aio_req *req, void *user)
{
    (void)req;
    struct mw_store_io *io = user;
    /* acq_rel: the last part sees every other part's result. */
    if (__atomic_sub_fetch(&io->parts_left_, 1, __ATOMIC_ACQ_REL) == 0) io_finish(io->st_, io);
}

static int validate(struct mw_store *st, const struct mw_store_io *io)
{
    const struct mw_store_obj *o = io->obj;
    if (!o || !io->buf || !io->len || (io->op != MW_AIO_READ && io->op != MW_AIO_WRITE))
        return mw_error_set(-EINVAL, "store: I/O needs an object, a buffer, len > 0 and a read/write op");
    uint64_t end = io->offset + io->len;
    if (end < io->offset || end > o->size)
        return mw_error_set(-EINVAL, "store: range [%llu, %llu) is past the end of '%s' (%llu bytes)",
                            (unsigned long long)io->offset, (unsigned long long)end, o->name,
                            (unsigned long long)o->size);
    if (io->offset % MW_STORE_ALIGN || (uintptr_t)io->buf % MW_STORE_ALIGN ||
        (io->len % MW_STORE_ALIGN && end != o->size))
        return mw_error_set(-EINVAL, "store: I/O on '%s' at offset %llu, %llu bytes: offset, buffer and length "
                                     "must be 4096-aligned (the length may end at the object's end)",
                            o->name, (unsigned long long)io->offset, (unsigned long long)io->len);
    uint64_t cb = st->cfg.crc_block;
    if (st->cfg.checksum && io->op == MW_AIO_WRITE && (io->offset % cb || (end % cb && end != o->size)))
        return mw_error_set(-EINVAL, "store: write to '%s' at offset %llu, %llu bytes must start and end on "
                                     "%llu-byte checksum blocks (or end at the object's end)",
                            o->name, (unsigned long long)io->offset, (unsigned long long)io->len,
                            (unsigned long long)cb);
    return 0;
}

int mw_store_submit(struct mw_store *st, struct mw_store_io *io)
{
    int rc = validate(st, io);
    if (rc) return rc;
    struct mw_store_obj *o = io->obj;
    uint64_t end = io->offset + io->len;
    uint64_t k0 = io->offset / o->stripe, k1 = (end - 1) / o->stripe;
    uint32_t n = (uint32_t)(k1 - k0 + 1);
    io->parts_ = calloc(n, sizeof *io->parts_);
    if (!io->parts_) return mw_error_set(-ENOMEM, "store: out of memory for %u request parts", n);
    io->nparts_ = n;
    io->result = 0;
    io->errmsg[0] = 0;
    io->st_ = st;

    if (io->op == MW_AIO_WRITE && st->cfg.checksum) {
        /* Blocks are whole (validated), so each crc covers exactly one block. */
        uint64_t cb = st->cfg.crc_block, b0 = io->offset / cb;
        for (uint64_t b = b0; b * cb < end; b++) {
            uint64_t bs = b * cb, be = MW_MIN(bs + cb, o->size);
            o->crc[b] = io->crcs ? io->crcs[b - b0]
                                 : mw_crc32c(0, (const char *)io->buf + (bs - io->offset), (size_t)(be - bs));
            o->crc_valid[b] = 1;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t k = k0 + i;
        uint64_t us = MW_MAX(k * o->stripe, io->offset), ue = MW_MIN((k + 1) * o->stripe, end);
        int f = (int)(k % (uint64_t)st->ndirs);
        struct mw_aio_req *r = &io->parts_[i];
        r->op = io->op;
        r->flags = io->flags & MW_AIO_URGENT;
        r->fd = st->files[f].fd;
        r->buf = (char *)io->buf + (us - io->offset);
        /* The object's tail is transferred padded to 4096 (its extent has the room). */
        r->len = MW_ALIGN_UP(ue - us, MW_STORE_ALIGN);
        r->offset = o->ext_off[f] + (k / (uint64_t)st->ndirs) * o->stripe + us % o->stripe;
        r->cb = part_done;
        r->user = io;
        r->object = o->iname;
        r->path = st->files[f].path;
    }
    __atomic_store_n(&io->parts_left_, n, __ATOMIC_RELAXED);
    __atomic_store_n(&io->state_, IO_INFLIGHT, __ATOMIC_RELAXED);
    pthread_mutex_lock(&st->mu);
    st->outstanding++;
    pthread_mutex_unlock(&st->mu);
    for (uint32_t i = 0; i < n; i++) {
        rc = mw_aio_submit(st->aio, &io->parts_[i]);
        MW_ASSERT(rc == 0); /* parts are built valid above */
    }
    return 0;
}

int mw_store_test(struct mw_store_io *io) { return __atomic_load_n(&io->state_, __ATOMIC_ACQUIRE) == IO_DONE; }

int mw_store_wait(struct mw_store *st, struct mw_store_io *io)
{
    pthread_mutex_lock(&st->mu);
    while (__atomic_load_n(&io->state_, __ATOMIC_ACQUIRE) == IO_INFLIGHT) pthread_cond_wait(&st->cv, &st->mu);
    pthread_mutex_unlock(&st->mu);
    if (io->result) mw_error_set(io->result, "%s", io->errmsg);
    return io->result;
}

static int sync_io(struct mw_store *st, struct mw_store_obj *obj, enum mw_aio_op op, uint64_t off, uint64_t len,
                   void *buf)
{
    struct mw_store_io io;
    memset(&io, 0, sizeof io);
    io.obj = obj;
    io.op = op;
    io.offset = off;
    io.len = len;
    io.buf = buf;
    int rc = mw_store_submit(st, &io);
    if (rc) return rc;
    return mw_store_wait(st, &io);
}

int mw_store_read(struct mw_store *st, struct mw_store_obj *obj, uint64_t offset, uint64_t len, void *buf)
{
    return sync_io(st, obj, MW_AIO_READ, offset, len, buf);
}

int mw_store_write(struct mw_store *st, struct mw_store_obj *obj, uint64_t offset, uint64_t len, const void *buf)
{
    return sync_io(st, obj, MW_AIO_WRITE, offset, len, (void *)buf);
}
