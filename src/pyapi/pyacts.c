/*
 * pyacts.c — the spill store of memwall.torch.offload(activations="nvme"): the tensors autograd
 * saves in forward go to NVMe as forward makes them and come back ahead of backward
 * (memwall/pyapi.h, "activations on NVMe"; python/memwall/_activations.py drives it from
 * torch.autograd.graph.saved_tensors_hooks; docs/python.md).
 *
 * Why this shape:
 * - One store object per saved tensor (its bytes, any dtype), in a store of its own (DIR, not the
 *   session's: the session's store is sized before the first step, while the caller learns the
 *   saved tensors' sizes only as forward runs). The store is opened without preallocation over
 *   the free space of DIR's file system: its file grows as far as the live activations reach
 *   (first-fit extents: a micro-batch's objects reuse the last one's) and a full disk is a failed
 *   write, named. crc32c per 64 KiB block, O_DIRECT, io_uring: the store's and the engine's.
 * - Writes go through a fixed staging pool (nstage buffers of `chunk` bytes, page-aligned with
 *   MADV_HUGEPAGE, the tensor copied in chunk by chunk): a put returns once the caller's bytes are copied, so the
 *   tensor can be freed at once; a put that finds the next buffer still writing waits for it
 *   (back-pressure: never more than nstage writes in flight, never an unbounded pool).
 * - Reads go straight into the caller's buffer (4096-aligned, the size rounded up to 4096: a
 *   torch tensor's storage), started ahead (read_start) and waited for when backward needs them
 *   (read_wait). The caller chooses the order and the window (how many ahead): it alone knows
 *   which tensor autograd unpacks next. A read first waits for its object's own writes.
 * - An object stays until dropped (a saved tensor may be unpacked again: retain_graph); drop
 *   waits for its I/O first, as the store requires.
 * - Failures: a failed write marks its object (reading it is refused: its unwritten blocks would
 *   read as anything, unchecked) and is returned by the next put or flush (sticky: the forward
 *   pass fails at once, naming the tensor); a failed read is returned by its read_wait, naming
 *   the tensor, its size and the store's message (crc32c mismatch, EIO).
 * Threads: every call takes the store's mutex (ctypes drops the GIL); completions arrive on the
 * engine's thread, but are only waited for here, never called back.
 */
#include "memwall/pyapi.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/store.h"
#include "store/store_impl.h" /* MW_STORE_LOCK_NAME */

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define ACT_ALIGN ((uint64_t)64 << 10)            /* chunks: whole crc32c blocks */
#define ACT_DEFAULT_CHUNK ((uint64_t)8 << 20)
#define ACT_DEFAULT_STAGING ((uint64_t)32 << 20)
#define ACT_MAX_STAGE 64
#define ACT_MAX_BYTES ((uint64_t)1 << 48)         /* one saved tensor: 256 TiB (a hostile size above) */
#define ACT_MAX_SLOTS (1u << 24)                  /* live tensors at once */

/* One saved tensor on NVMe (allocated one by one: the store keeps pointers to rio). */
struct act {
    uint32_t gen;           /* handle = gen << 32 | slot; bumped at each reuse */
    int live;
    uint64_t bytes;
    struct mw_store_obj *obj;
    int writes;             /* staging chunks of it still writing */
    int werr;               /* a write of it failed: never read back */
    int reading;            /* rio in flight */
    struct mw_store_io rio;
};

struct stage {
    struct mw_store_io io;
    struct act *owner;      /* NULL: idle */
};

struct mw_pyacts {
    pthread_mutex_t mu;
    struct mw_store *st;
    char dir[512];
    unsigned char *mem;     /* nstage * chunk, the staging pool */
    uint64_t chunk;
    int nstage, next;
    struct stage stage[ACT_MAX_STAGE];
    struct act **slot;      /* [cap] */
    uint32_t cap, nslot;
    uint32_t *free_slots;   /* [cap], a stack */
    uint32_t nfree;
    int err;                /* sticky: the first failed write */
    char errmsg[768];
    /* figures (mw_pyacts_stats) */
    uint64_t live, live_bytes, peak_bytes, written, read, puts, gets, write_wait_ns, read_wait_ns;
};

static int stage_finish(struct mw_pyacts *a, struct stage *s);
static int drop_locked(struct mw_pyacts *a, struct act *t, uint64_t h);

/* Opens the store; a file left there by a process that ended without closing (kill -9) is removed
 * first: saved tensors mean nothing after their process, and no live process holds the directory's
 * lock (one that does is -EBUSY, named). */
static int store_open(struct mw_pyacts *a, const struct mw_store_config *c)
{
    int rc = mw_store_open(&a->st, c);
    if (rc != -EEXIST) return rc;
    char why[640];
    snprintf(why, sizeof why, "%s", mw_error_msg());
    struct mw_dir_lock *l;
    if (mw_dir_lock(&l, a->dir, MW_STORE_LOCK_NAME)) return mw_error_set(rc, "%s", why);
    char path[600];
    snprintf(path, sizeof path, "%s/%s.0.dat", a->dir, c->file_prefix);
    int gone = unlink(path) == 0; /* a planted symbolic link goes, not what it points to */
    mw_dir_unlock(l);
    if (!gone) return mw_error_set(rc, "%s", why);
    mw_log(MW_LOG_WARN, "activations on NVMe: removed %s, left by a run that ended without closing", path);
    return mw_store_open(&a->st, c);
}

int mw_pyacts_open(struct mw_pyacts **out, const char *dir, uint64_t staging_bytes, uint64_t chunk_bytes,
                   uint64_t capacity)
{
    *out = NULL;
    if (!dir || !*dir || strlen(dir) >= sizeof((struct mw_pyacts *)0)->dir)
        return mw_error_set(-EINVAL, "activations on NVMe: a directory of 1..511 bytes is needed");
    uint64_t chunk = chunk_bytes ? chunk_bytes : ACT_DEFAULT_CHUNK;
    uint64_t staging = staging_bytes ? staging_bytes : MW_MAX(ACT_DEFAULT_STAGING, chunk);
    if (chunk % ACT_ALIGN || chunk > ((uint64_t)1 << 30) || staging < chunk || staging / chunk > ACT_MAX_STAGE)
        return mw_error_set(-EINVAL, "activations on NVMe: staging of %llu bytes in chunks of %llu: a chunk is a "
                            "multiple of 64 KiB up to 1 GiB, and the staging holds 1..%d chunks",
                            (unsigned long long)staging, (unsigned long long)chunk, ACT_MAX_STAGE);
    int rc = mw_mkdir_p(dir, 0700);
    if (rc) return mw_error_prepend(rc, "activations on NVMe: ");
    if (!capacity) { /* the free space there: the file grows as far as the activations reach, no further */
        struct statvfs vs;
        if (statvfs(dir, &vs) != 0)
            return mw_error_set(-errno, "activations on NVMe: cannot read the free space of %s: %s", dir, strerror(errno));
        uint64_t free_bytes;
        if (mw_mul_u64((uint64_t)vs.f_bavail, (uint64_t)vs.f_frsize, &free_bytes)) free_bytes = UINT64_MAX / 2;
        capacity = MW_MAX(free_bytes, chunk);
    }
    struct mw_pyacts *a = calloc(1, sizeof *a);
    if (!a) return mw_error_set(-ENOMEM, "activations on NVMe: out of memory");
    pthread_mutex_init(&a->mu, NULL);
    snprintf(a->dir, sizeof a->dir, "%s", dir);
    a->chunk = chunk;
    a->nstage = (int)(staging / chunk);
    void *p = mmap(NULL, (size_t)(chunk * (uint64_t)a->nstage), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) {
        rc = mw_error_set(-ENOMEM, "activations on NVMe: no memory for %d staging buffers of %llu bytes", a->nstage,
                          (unsigned long long)chunk);
        goto err;
    }
    (void)madvise(p, (size_t)(chunk * (uint64_t)a->nstage), MADV_HUGEPAGE); /* advice only */
    a->mem = p;
    struct mw_store_config c;
    mw_store_config_default(&c);
    const char *dirs[1] = {a->dir};
    c.dirs = dirs;
    c.ndirs = 1;
    c.capacity = capacity;
    c.preallocate = 0;
    c.file_prefix = "memwall-acts";
    if ((rc = store_open(a, &c))) {
        mw_error_prepend(rc, "activations on NVMe: ");
        goto err;
    }
    *out = a;
    return 0;
err:
    mw_pyacts_close(a);
    return rc;
}

/* The live tensor behind a handle, or NULL with the message set (a stale or made-up handle). */
static struct act *act_of(struct mw_pyacts *a, uint64_t h, const char *what)
{
    uint32_t slot = (uint32_t)(h & 0xffffffffu), gen = (uint32_t)(h >> 32);
    if (slot < a->nslot && a->slot[slot]->live && a->slot[slot]->gen == gen) return a->slot[slot];
    mw_error_set(-EINVAL, "activations on NVMe: %s: no saved tensor %llu (dropped, or never put)", what,
                 (unsigned long long)h);
    return NULL;
}

static uint64_t handle_of(const struct mw_pyacts *a, const struct act *t, uint32_t slot)
{
    (void)a;
    return (uint64_t)t->gen << 32 | slot;
}

/* A free slot (reused, or a new one; its act not live yet), or -ENOMEM. */
static int act_new(struct mw_pyacts *a, uint32_t *slot_out)
{
    if (a->nfree) {
        *slot_out = a->free_slots[--a->nfree];
        return 0;
    }
    if (a->nslot == a->cap) {
        uint32_t cap = a->cap ? a->cap * 2 : 64;
        if (cap > ACT_MAX_SLOTS)
            return mw_error_set(-ENOMEM, "activations on NVMe: more than %u saved tensors live at once", ACT_MAX_SLOTS);
        struct act **s = realloc(a->slot, sizeof *s * cap);
        if (!s) return mw_error_set(-ENOMEM, "activations on NVMe: out of memory");
        a->slot = s;
        uint32_t *f = realloc(a->free_slots, sizeof *f * cap);
        if (!f) return mw_error_set(-ENOMEM, "activations on NVMe: out of memory");
        a->free_slots = f;
        a->cap = cap;
    }
    struct act *t = calloc(1, sizeof *t);
    if (!t) return mw_error_set(-ENOMEM, "activations on NVMe: out of memory");
    a->slot[a->nslot] = t;
    *slot_out = a->nslot++;
    return 0;
}

/* Waits for a staging buffer's write (back-pressure) and frees it. A failure marks its tensor and
 * becomes the store's sticky error. */
static int stage_finish(struct mw_pyacts *a, struct stage *s)
{
    if (!s->owner) return 0;
    uint64_t t0 = mw_now_ns();
    int rc = mw_store_wait(a->st, &s->io);
    a->write_wait_ns += mw_now_ns() - t0;
    struct act *t = s->owner;
    s->owner = NULL;
    t->writes--;
    if (rc) {
        t->werr = rc;
        if (!a->err) {
            a->err = rc;
            snprintf(a->errmsg, sizeof a->errmsg, "activations on NVMe: writing a saved tensor (%llu bytes, %llu at "
                     "%llu) failed: %s", (unsigned long long)t->bytes, (unsigned long long)s->io.len,
                     (unsigned long long)s->io.offset, mw_error_msg());
        }
        return mw_error_set(a->err, "%s", a->errmsg);
    }
    a->written += s->io.len;
    return 0;
}

/* Waits for every write of tensor t (before it is read or deleted). */
static int writes_finish(struct mw_pyacts *a, struct act *t)
{
    int err = 0;
    for (int i = 0; i < a->nstage && t->writes; i++)
        if (a->stage[i].owner == t) {
            int e = stage_finish(a, &a->stage[i]);
            if (e && !err) err = e;
        }
    return err;
}

static int put_locked(struct mw_pyacts *a, const void *src, uint64_t bytes, uint64_t *handle)
{
    if (a->err) return mw_error_set(a->err, "%s", a->errmsg);
    if (!src || !bytes || bytes > ACT_MAX_BYTES)
        return mw_error_set(-EINVAL, "activations on NVMe: a saved tensor of %llu bytes (1 byte to 256 TiB, from a "
                            "buffer)", (unsigned long long)bytes);
    uint32_t slot = 0;
    int rc = act_new(a, &slot);
    if (rc) return rc;
    struct act *t = a->slot[slot];
    char name[64];
    snprintf(name, sizeof name, "act.%u.%u", slot, t->gen);
    if ((rc = mw_store_obj_create_ex(a->st, name, bytes, MW_KIND_ACTIVATIONS, &t->obj))) {
        a->free_slots[a->nfree++] = slot;
        return mw_error_prepend(rc, "activations on NVMe: ");
    }
    t->live = 1;
    t->bytes = bytes;
    t->werr = 0;
    t->writes = 0;
    t->reading = 0;
    *handle = handle_of(a, t, slot);
    for (uint64_t off = 0; off < bytes; off += a->chunk) {
        struct stage *s = &a->stage[a->next];
        a->next = (a->next + 1) % a->nstage;
        if ((rc = stage_finish(a, s))) break; /* the oldest write: back-pressure */
        uint64_t len = MW_MIN(a->chunk, bytes - off);
        unsigned char *buf = a->mem + (size_t)(s - a->stage) * a->chunk;
        memcpy(buf, (const unsigned char *)src + off, (size_t)len);
        memset(&s->io, 0, sizeof s->io);
        s->io.obj = t->obj;
        s->io.op = MW_AIO_WRITE;
        s->io.offset = off;
        s->io.len = len;
        s->io.buf = buf;
        if ((rc = mw_store_submit(a->st, &s->io))) break;
        s->owner = t;
        t->writes++;
    }
    a->puts++;
    a->live++;
    a->live_bytes += bytes;
    a->peak_bytes = MW_MAX(a->peak_bytes, a->live_bytes);
    if (rc) {
        if (!a->err) {
            a->err = rc;
            snprintf(a->errmsg, sizeof a->errmsg, "activations on NVMe: writing a saved tensor of %llu bytes failed: "
                     "%s", (unsigned long long)bytes, mw_error_msg());
        }
        (void)drop_locked(a, t, *handle); /* its own failure is the one told */
        *handle = 0;
        return mw_error_set(a->err, "%s", a->errmsg);
    }
    return 0;
}

int mw_pyacts_put(struct mw_pyacts *a, const void *src, uint64_t bytes, uint64_t *handle)
{
    if (!a || !handle) return mw_error_set(-EINVAL, "activations on NVMe: put without a store or a handle");
    *handle = 0;
    pthread_mutex_lock(&a->mu);
    int rc = put_locked(a, src, bytes, handle);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

uint64_t mw_pyacts_room(uint64_t bytes)
{
    if (!bytes || bytes > ACT_MAX_BYTES) return 0;
    return MW_ALIGN_UP(bytes, (uint64_t)MW_STORE_ALIGN);
}

int mw_pyacts_bytes(struct mw_pyacts *a, uint64_t handle, uint64_t *bytes)
{
    if (!a || !bytes) return mw_error_set(-EINVAL, "activations on NVMe: bytes without a store");
    pthread_mutex_lock(&a->mu);
    struct act *t = act_of(a, handle, "bytes");
    if (t) *bytes = t->bytes;
    pthread_mutex_unlock(&a->mu);
    return t ? 0 : -EINVAL;
}

static int read_start_locked(struct mw_pyacts *a, uint64_t h, void *dst, uint64_t room)
{
    struct act *t = act_of(a, h, "read");
    if (!t) return -EINVAL;
    if (t->reading)
        return mw_error_set(-EBUSY, "activations on NVMe: saved tensor %llu is being read already", (unsigned long long)h);
    if (!dst || (uintptr_t)dst % MW_STORE_ALIGN || room < mw_pyacts_room(t->bytes))
        return mw_error_set(-EINVAL, "activations on NVMe: reading saved tensor %llu (%llu bytes) needs a 4096-aligned "
                            "buffer of %llu bytes (got %llu at %p)", (unsigned long long)h,
                            (unsigned long long)t->bytes, (unsigned long long)mw_pyacts_room(t->bytes),
                            (unsigned long long)room, dst);
    int rc = writes_finish(a, t);
    if (t->werr)
        return mw_error_set(t->werr, "activations on NVMe: saved tensor %llu (%llu bytes) cannot be read back: its "
                            "write failed (%s)", (unsigned long long)h, (unsigned long long)t->bytes,
                            a->err ? a->errmsg : "see the earlier error");
    if (rc) return rc;
    memset(&t->rio, 0, sizeof t->rio);
    t->rio.obj = t->obj;
    t->rio.op = MW_AIO_READ;
    t->rio.len = t->bytes;
    t->rio.buf = dst;
    t->rio.flags = MW_AIO_URGENT; /* the backward pass waits for it */
    if ((rc = mw_store_submit(a->st, &t->rio))) return mw_error_prepend(rc, "activations on NVMe: ");
    t->reading = 1;
    return 0;
}

int mw_pyacts_read_start(struct mw_pyacts *a, uint64_t handle, void *dst, uint64_t room)
{
    if (!a) return mw_error_set(-EINVAL, "activations on NVMe: read without a store");
    pthread_mutex_lock(&a->mu);
    int rc = read_start_locked(a, handle, dst, room);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

/* Waits for t's read; its failure named. */
static int read_finish(struct mw_pyacts *a, struct act *t, uint64_t h)
{
    if (!t->reading) return 0;
    uint64_t t0 = mw_now_ns();
    int rc = mw_store_wait(a->st, &t->rio);
    a->read_wait_ns += mw_now_ns() - t0;
    t->reading = 0;
    if (rc)
        return mw_error_set(rc, "activations on NVMe: reading saved tensor %llu (%llu bytes) back for the backward "
                            "pass failed: %s", (unsigned long long)h, (unsigned long long)t->bytes, mw_error_msg());
    a->read += t->bytes;
    a->gets++;
    return 0;
}

int mw_pyacts_read_wait(struct mw_pyacts *a, uint64_t handle)
{
    if (!a) return mw_error_set(-EINVAL, "activations on NVMe: wait without a store");
    pthread_mutex_lock(&a->mu);
    struct act *t = act_of(a, handle, "wait");
    int rc = !t ? -EINVAL
                : !t->reading ? mw_error_set(-EINVAL, "activations on NVMe: saved tensor %llu has no read in flight",
                                             (unsigned long long)handle)
                              : read_finish(a, t, handle);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

/* Ends t's I/O and deletes its object; the slot goes back. Returns the first failure (the object
 * is gone either way). */
static int drop_locked(struct mw_pyacts *a, struct act *t, uint64_t h)
{
    int err = writes_finish(a, t);
    int e = read_finish(a, t, h);
    if (e && !err) err = e;
    e = mw_store_obj_delete(a->st, t->obj);
    if (e && !err) err = e;
    t->obj = NULL;
    t->live = 0;
    t->gen++;
    a->free_slots[a->nfree++] = (uint32_t)(h & 0xffffffffu);
    a->live--;
    a->live_bytes -= t->bytes;
    return err;
}

int mw_pyacts_drop(struct mw_pyacts *a, uint64_t handle)
{
    if (!a) return mw_error_set(-EINVAL, "activations on NVMe: drop without a store");
    pthread_mutex_lock(&a->mu);
    struct act *t = act_of(a, handle, "drop");
    int rc = t ? drop_locked(a, t, handle) : -EINVAL;
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int mw_pyacts_flush(struct mw_pyacts *a)
{
    if (!a) return mw_error_set(-EINVAL, "activations on NVMe: flush without a store");
    pthread_mutex_lock(&a->mu);
    int err = 0;
    for (int i = 0; i < a->nstage; i++) {
        int e = stage_finish(a, &a->stage[i]);
        if (e && !err) err = e;
    }
    if (!err && a->err) err = mw_error_set(a->err, "%s", a->errmsg);
    pthread_mutex_unlock(&a->mu);
    return err;
}

int mw_pyacts_stats(struct mw_pyacts *a, double *out, int n)
{
    if (!a || !out || n < 0) return mw_error_set(-EINVAL, "activations on NVMe: stats without a store or room");
    pthread_mutex_lock(&a->mu);
    struct mw_store_stats ss;
    mw_store_stats(a->st, &ss);
    double v[MW_PYACTS_NSTATS] = {(double)a->live, (double)a->live_bytes, (double)a->peak_bytes, (double)a->written,
                                  (double)a->read, (double)a->puts, (double)a->gets, a->write_wait_ns / 1e9,
                                  a->read_wait_ns / 1e9, (double)(a->chunk * (uint64_t)a->nstage), (double)ss.direct};
    pthread_mutex_unlock(&a->mu);
    int k = MW_MIN(n, MW_PYACTS_NSTATS);
    memcpy(out, v, sizeof *v * (size_t)k);
    return k;
}

void mw_pyacts_close(struct mw_pyacts *a)
{
    if (!a) return;
    for (uint32_t i = 0; i < a->nslot; i++) {
        struct act *t = a->slot[i];
        if (t->live && a->st) (void)drop_locked(a, t, handle_of(a, t, i)); /* no one left to tell */
        free(t);
    }
    for (int i = 0; a->st && i < a->nstage; i++) /* nothing owns these now; wait before the buffers go */
        if (a->stage[i].owner) (void)mw_store_wait(a->st, &a->stage[i].io);
    if (a->st) mw_store_close(a->st); /* removes its file and its lock */
    (void)rmdir(a->dir);               /* the directory, when empty (not when it holds anything else) */
    if (a->mem) munmap(a->mem, (size_t)(a->chunk * (uint64_t)a->nstage));
    free(a->slot);
    free(a->free_slots);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
