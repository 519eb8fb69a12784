/*
 * store.c — the NVMe store's files and objects: opening and reserving the backing files,
 * placing objects in extents, striping, lookup. The data path is in store_io.c.
 *
 * Why a few big preallocated files: thousands of per-object files would cost metadata I/O and
 * fragment; one file per SSD, fallocated up front, turns "disk full" from a crash in hour three
 * into an error at start-up, and keeps each object's bytes contiguous per SSD for large reads.
 *
 * Why a hash index of the names: create, place and find look an object up by name, and a run
 * with small subgroups has hundreds of thousands of objects ("sg123456.slot1"); a scan of a list
 * made creating them quadratic (minutes for a 36 K-parameter model cut into 1-element
 * subgroups). The index keeps create, find and delete O(1) on average at any count.
 *
 * Why O_DIRECT is set after the open: on a file system that refuses it (ramfs; tmpfs before
 * Linux 6.6), open(O_CREAT | O_EXCL | O_DIRECT) creates the file and only then fails with
 * EINVAL, so a buffered retry with O_EXCL met our own empty file (EEXIST: "a run that did not
 * finish"). Opening once, buffered, and then asking for O_DIRECT with fcntl(F_SETFL), which the
 * kernel checks the same way, creates each file exactly once whatever the answer.
 */
#include "store/store_impl.h"
#include "aio/aio_impl.h"
#include "memwall/trace.h"
#include "memwall/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

void mw_store_config_default(struct mw_store_config *c)
{
    memset(c, 0, sizeof *c);
    c->stripe_size = (uint64_t)1 << 20;
    c->crc_block = (uint64_t)64 << 10;
    c->checksum = 1;
    c->direct = 1;
    c->preallocate = 1;
    c->file_prefix = "memwall";
    mw_aio_config_default(&c->aio_config);
}

static uint64_t free_bytes(const char *dir)
{
    struct statvfs v;
    if (statvfs(dir, &v)) return 0;
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* The backing files of this store's prefix already in dir (a run that did not finish), as
 * "a, b, c" into buf (at most n bytes, "..." when more). */
static void list_leftovers(const char *dir, const char *prefix, char *buf, size_t n)
{
    buf[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    size_t pl = strlen(prefix), used = 0;
    int more = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, pl) || e->d_name[pl] != '.' || l < 4 || strcmp(e->d_name + l - 4, ".dat"))
            continue;
        if (used + l + 3 >= n) { more = 1; break; }
        used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? ", " : "", e->d_name);
    }
    closedir(d);
    if (more && used + 5 < n) snprintf(buf + used, n - used, ", ...");
}

/* fallocate the whole file, so a full disk is found now. A file system without fallocate (ramfs,
 * some FUSE and network ones) gets the file's size without reserved blocks, as with
 * preallocate = 0, and the run is told once. */
static int reserve(struct mw_store_file *f, const char *dir)
{
    if (fallocate(f->fd, 0, 0, (off_t)f->size) == 0) return 0;
    int e = errno;
    if (e == EOPNOTSUPP && ftruncate(f->fd, (off_t)f->size) == 0) {
        static atomic_int warned;
        if (!atomic_exchange(&warned, 1))
            mw_log(MW_LOG_WARN, "the file system of %s cannot reserve space (no fallocate): a full disk will show "
                                "up as a failed write, not at start-up", dir);
        return 0;
    }
    char a[32], b[32], note[600];
    mw_fs_full_note(-e, f->path, note, sizeof note);
    if (!note[0]) snprintf(note, sizeof note, " (%s free there)", mw_fmt_bytes(b, sizeof b, free_bytes(dir)));
    return mw_error_set(-e, "store: cannot reserve %s in %s: %s%s%s", mw_fmt_bytes(a, sizeof a, f->size), f->path,
                        strerror(e), note, e == EFBIG ? " (the file size limit, ulimit -f, is lower)" : "");
}

static int open_file(struct mw_store *st, int i)
{
    struct mw_store_file *f = &st->files[i];
    const char *dir = st->dirs[i];
    /* Private where created: the files hold the model's optimizer state. */
    int rc = mw_mkdir_p(dir, 0700);
    if (rc) return mw_error_prepend(rc, "store: ");
    /* One run per directory, for the life of the store (the second is refused naming the first). */
    if ((rc = mw_dir_lock(&f->lock, dir, MW_STORE_LOCK_NAME))) return mw_error_prepend(rc, "store: ");
    size_t n = strlen(dir) + strlen(st->cfg.file_prefix) + 32;
    f->path = malloc(n);
    if (!f->path) return mw_error_set(-ENOMEM, "store: out of memory");
    snprintf(f->path, n, "%s/%s.%d.dat", dir, st->cfg.file_prefix, i);
    f->fd = -1;
    /* Created exclusively and never through a symlink: a file already there belongs to a run that
     * did not finish (kept for its resume), and a planted link must not redirect our writes. A
     * resume (reopen) opens that run's file instead: never created, still never through a link. */
    const int flags = st->cfg.reopen ? O_RDWR | O_NOFOLLOW | O_CLOEXEC : O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    f->fd = open(f->path, flags, 0600);
    int e = f->fd < 0 ? errno : 0;
    if (f->fd >= 0 && st->cfg.direct) {
        int fl = fcntl(f->fd, F_GETFL);
        if (fl != -1 && fcntl(f->fd, F_SETFL, fl | O_DIRECT) == 0) f->direct = 1;
        else {
            static atomic_int warned;
            if (!atomic_exchange(&warned, 1))
                mw_log(MW_LOG_WARN, "the file system of %s refuses O_DIRECT: using buffered I/O there "
                                    "(reads may come from the page cache)", dir);
        }
    }
    if (f->fd < 0 && st->cfg.reopen)
        return mw_error_set(-e, "store: cannot open %s to resume the run that wrote it: %s%s", f->path, strerror(e),
                            e == ELOOP ? " (it is a symbolic link: refused)" : "");
    if (f->fd < 0) {
        struct stat ls;
        if (e == EEXIST && lstat(f->path, &ls) == 0 && S_ISLNK(ls.st_mode))
            return mw_error_set(-EEXIST, "store: %s is a symbolic link: refusing to write the store through it "
                                "(remove it, or use a directory only this run writes to)", f->path);
        if (e == EEXIST) {
            char left[600];
            list_leftovers(dir, st->cfg.file_prefix, left, sizeof left);
            return mw_error_set(-EEXIST, "store: %s already exists: %s holds the files of a run that did not finish "
                                "(killed or crashed; they are kept for its resume): %s. Remove them (rm %s/%s.*) "
                                "or give this run another directory", f->path, dir, left[0] ? left : f->path, dir,
                                st->cfg.file_prefix);
        }
        return mw_error_set(-e, "store: cannot create %s: %s", f->path, strerror(e));
    }
    f->created = 1; /* reopened: the run's own file, removed when that run finishes */
    if (st->cfg.reopen) {
        struct stat fs;
        if (fstat(f->fd, &fs) != 0) return mw_error_set(-errno, "store: cannot stat %s: %s", f->path, strerror(errno));
        if (!S_ISREG(fs.st_mode) || (uint64_t)fs.st_size < f->size) {
            char a[32], b[32];
            return mw_error_set(MW_EFORMAT, "store: %s is %s, the run that wrote it reserved %s: it was truncated or "
                                "replaced; the run cannot be resumed from it", f->path,
                                mw_fmt_bytes(a, sizeof a, (uint64_t)fs.st_size), mw_fmt_bytes(b, sizeof b, f->size));
        }
    } else if (st->cfg.preallocate && (rc = reserve(f, dir))) {
        return rc;
    }
    f->free_ext = malloc(sizeof *f->free_ext * 8);
    if (!f->free_ext) return mw_error_set(-ENOMEM, "store: out of memory");
    f->free_cap = 8;
    f->free_ext[0].off = 0;
    f->free_ext[0].len = f->size;
    f->nfree = 1;
    return 0;
}

int mw_store_open(struct mw_store **out, const struct mw_store_config *c)
{
    *out = NULL;
    if (!c || !c->dirs || c->ndirs < 1 || c->ndirs > MW_STORE_MAX_DIRS || !c->capacity)
        return mw_error_set(-EINVAL, "store: need 1..%d directories and a capacity > 0", MW_STORE_MAX_DIRS);
    struct mw_store *st = calloc(1, sizeof *st);
    if (!st) return mw_error_set(-ENOMEM, "store: out of memory");
    st->cfg = *c;
    if (!st->cfg.stripe_size) st->cfg.stripe_size = (uint64_t)1 << 20;
    if (!st->cfg.crc_block) st->cfg.crc_block = (uint64_t)64 << 10;
    if (!st->cfg.file_prefix) st->cfg.file_prefix = "memwall";
    int rc;
    if (st->cfg.stripe_size % MW_STORE_ALIGN || st->cfg.crc_block % MW_STORE_ALIGN) {
        rc = mw_error_set(-EINVAL, "store: stripe size and crc block must be multiples of 4096 bytes");
        goto err0;
    }
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    st->ndirs = c->ndirs;
    st->dirs = calloc((size_t)c->ndirs, sizeof *st->dirs);
    st->files = calloc((size_t)c->ndirs, sizeof *st->files);
    if (!st->dirs || !st->files) { rc = mw_error_set(-ENOMEM, "store: out of memory"); goto err; }
    for (int i = 0; i < st->ndirs; i++) st->files[i].fd = -1;
    uint64_t per_file = MW_ALIGN_UP((c->capacity + (uint64_t)c->ndirs - 1) / (uint64_t)c->ndirs, MW_STORE_ALIGN);
    for (int i = 0; i < st->ndirs; i++) {
        st->dirs[i] = strdup(c->dirs[i]);
        if (!st->dirs[i]) { rc = mw_error_set(-ENOMEM, "store: out of memory"); goto err; }
        st->files[i].size = per_file;
        if ((rc = open_file(st, i))) goto err;
    }
    if (c->aio) st->aio = c->aio;
    else {
        struct mw_aio_config ac = c->aio_config;
        if (!ac.block_size) mw_aio_config_default(&ac);
        if (!ac.trace) ac.trace = c->trace;
        if ((rc = mw_aio_init(&st->aio, &ac))) goto err;
        st->own_aio = 1;
    }
    st->trace = c->trace ? c->trace : st->aio->cfg.trace;
    *out = st;
    return 0;
err:
    st->cfg.keep_files = st->cfg.reopen; /* a failed reopen leaves the run's files as they were */
    mw_store_close(st);
    return rc;
err0:
    free(st);
    return rc;
}

static void obj_free(struct mw_store_obj *o)
{
    mw_tier_free(&o->acct);
    free(o->ext_off);
    free(o->ext_len);
    free(o->crc);
    free(o->crc_valid);
    free(o);
}

void mw_store_close(struct mw_store *st)
{
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    while (st->outstanding) pthread_cond_wait(&st->cv, &st->mu);
    pthread_mutex_unlock(&st->mu);
    if (st->own_aio) mw_aio_free(st->aio);
    for (size_t b = 0; b < st->nbuckets; b++)
        for (struct mw_store_obj *o = st->buckets[b], *next; o; o = next) {
            next = o->hnext;
            obj_free(o);
        }
    free(st->buckets);
    for (int i = 0; st->files && i < st->ndirs; i++) {
        struct mw_store_file *f = &st->files[i];
        if (f->fd >= 0) close(f->fd);
        if (f->created && !st->cfg.keep_files) unlink(f->path); /* never a file that is not this store's own */
        mw_dir_unlock(f->lock);                                   /* after the files are gone */
        free(f->path);
        free(f->free_ext);
    }
    for (int i = 0; st->dirs && i < st->ndirs; i++) free(st->dirs[i]);
    free(st->dirs);
    free(st->files);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* First-fit allocation of len bytes in file f; returns the offset or UINT64_MAX. mu held. */
static uint64_t ext_alloc(struct mw_store_file *f, uint64_t len)
{
    for (int i = 0; i < f->nfree; i++) {
        if (f->free_ext[i].len < len) continue;
        uint64_t off = f->free_ext[i].off;
        f->free_ext[i].off += len;
        f->free_ext[i].len -= len;
        if (!f->free_ext[i].len) {
            memmove(&f->free_ext[i], &f->free_ext[i + 1], sizeof *f->free_ext * (size_t)(f->nfree - i - 1));
            f->nfree--;
        }
        return off;
    }
    return UINT64_MAX;
}

/* The first free extent of file f that starts at or after off (nfree when none): a binary
 * search, so returning and claiming extents stays cheap with many holes. */
static int ext_lower_bound(const struct mw_store_file *f, uint64_t off)
{
    int lo = 0, hi = f->nfree;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (f->free_ext[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Returns an extent to file f, coalescing with its neighbours. mu held. */
static int ext_release(struct mw_store_file *f, uint64_t off, uint64_t len)
{
    int i = ext_lower_bound(f, off);
    int merge_prev = i > 0 && f->free_ext[i - 1].off + f->free_ext[i - 1].len == off;
    int merge_next = i < f->nfree && off + len == f->free_ext[i].off;
    if (merge_prev && merge_next) {
        f->free_ext[i - 1].len += len + f->free_ext[i].len;
        memmove(&f->free_ext[i], &f->free_ext[i + 1], sizeof *f->free_ext * (size_t)(f->nfree - i - 1));
        f->nfree--;
    } else if (merge_prev) {
        f->free_ext[i - 1].len += len;
    } else if (merge_next) {
        f->free_ext[i].off = off;
        f->free_ext[i].len += len;
    } else {
        if (f->nfree == f->free_cap) {
            struct mw_store_extent *n = realloc(f->free_ext, sizeof *n * (size_t)f->free_cap * 2);
            if (!n) return -ENOMEM;
            f->free_ext = n;
            f->free_cap *= 2;
        }
        memmove(&f->free_ext[i + 1], &f->free_ext[i], sizeof *f->free_ext * (size_t)(f->nfree - i));
        f->free_ext[i].off = off;
        f->free_ext[i].len = len;
        f->nfree++;
    }
    return 0;
}

static uint64_t largest_free(const struct mw_store_file *f)
{
    uint64_t m = 0;
    for (int i = 0; i < f->nfree; i++) m = MW_MAX(m, f->free_ext[i].len);
    return m;
}

/* ------------------------------------------------------------------ the name index */

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static struct mw_store_obj **bucket_of(struct mw_store *st, uint64_t hash)
{
    return &st->buckets[hash & (st->nbuckets - 1)];
}

static struct mw_store_obj *find_locked(struct mw_store *st, const char *name)
{
    if (!st->nbuckets) return NULL;
    uint64_t h = name_hash(name);
    for (struct mw_store_obj *o = *bucket_of(st, h); o; o = o->hnext)
        if (o->hash == h && !strcmp(o->name, name)) return o;
    return NULL;
}

/* Room for one more object: the first table, or twice the buckets once every bucket holds one
 * on average. -ENOMEM only when there is no table at all; a failed doubling keeps the old one
 * (longer chains, still correct). mu held. */
static int index_reserve(struct mw_store *st)
{
    if (st->nbuckets && st->n_objects < st->nbuckets) return 0;
    size_t nb = st->nbuckets ? st->nbuckets * 2 : 64;
    struct mw_store_obj **b = calloc(nb, sizeof *b);
    if (!b) return st->nbuckets ? 0 : -ENOMEM;
    for (size_t i = 0; i < st->nbuckets; i++)
        for (struct mw_store_obj *o = st->buckets[i], *next; o; o = next) {
            next = o->hnext;
            o->hnext = b[o->hash & (nb - 1)];
            b[o->hash & (nb - 1)] = o;
        }
    free(st->buckets);
    st->buckets = b;
    st->nbuckets = nb;
    return 0;
}

/* Takes obj out of the index; 0, or -1 when it is not this store's. mu held. */
static int index_remove(struct mw_store *st, struct mw_store_obj *obj)
{
    if (!st->nbuckets) return -1;
    struct mw_store_obj **pp = bucket_of(st, obj->hash);
    while (*pp && *pp != obj) pp = &(*pp)->hnext;
    if (!*pp) return -1;
    *pp = obj->hnext;
    return 0;
}

/* Takes [off, off+len) out of file f's free list: it must lie inside one free extent (else -1:
 * it overlaps an object already placed, or lies past the file's end). mu held. */
static int ext_claim(struct mw_store_file *f, uint64_t off, uint64_t len)
{
    /* Only the last free extent starting at or before off can hold it (they are disjoint). */
    int i = off == UINT64_MAX ? f->nfree - 1 : ext_lower_bound(f, off + 1) - 1;
    if (i < 0) return -1;
    struct mw_store_extent x = f->free_ext[i];
    if (off - x.off > x.len || len > x.len - (off - x.off)) return -1;
    uint64_t head = off - x.off, tail = x.len - head - len;
    if (head && tail) { /* split in two: the head stays at i, the tail goes after it */
        f->free_ext[i].len = head;
        if (ext_release(f, off + len, tail)) return -1;
    } else if (head) {
        f->free_ext[i].len = head;
    } else if (tail) {
        f->free_ext[i].off = off + len;
        f->free_ext[i].len = tail;
    } else {
        memmove(&f->free_ext[i], &f->free_ext[i + 1], sizeof *f->free_ext * (size_t)(f->nfree - i - 1));
        f->nfree--;
    }
    return 0;
}

static int obj_make(struct mw_store *st, const char *name, uint64_t size, enum mw_alloc_kind kind,
                    const uint64_t *at, struct mw_store_obj **out);

int mw_store_obj_create_ex(struct mw_store *st, const char *name, uint64_t size, enum mw_alloc_kind kind,
                           struct mw_store_obj **out)
{
    return obj_make(st, name, size, kind, NULL, out);
}

int mw_store_obj_place(struct mw_store *st, const char *name, uint64_t size, enum mw_alloc_kind kind,
                       const uint64_t *file_offsets, struct mw_store_obj **out)
{
    return obj_make(st, name, size, kind, file_offsets, out);
}

/* Creates the object: first fit, or (at != NULL) at the given offset in each file. */
static int obj_make(struct mw_store *st, const char *name, uint64_t size, enum mw_alloc_kind kind,
                    const uint64_t *at, struct mw_store_obj **out)
{
    *out = NULL;
    if (!name || !*name || strlen(name) >= sizeof((struct mw_store_obj *)0)->name || !size)
        return mw_error_set(-EINVAL, "store: object needs a name of 1..127 bytes and a size > 0");
    struct mw_store_obj *o = calloc(1, sizeof *o);
    if (!o) return mw_error_set(-ENOMEM, "store: out of memory");
    snprintf(o->name, sizeof o->name, "%s", name);
    o->size = size;
    int nd = st->ndirs;
    /* One directory: one unit spanning the object (no striping, no padding beyond 4 KiB). */
    o->stripe = nd == 1 ? MW_ALIGN_UP(size, MW_STORE_ALIGN) : st->cfg.stripe_size;
    uint64_t units = (size + o->stripe - 1) / o->stripe;
    o->nblocks = (size + st->cfg.crc_block - 1) / st->cfg.crc_block;
    o->ext_off = calloc((size_t)nd, sizeof *o->ext_off);
    o->ext_len = calloc((size_t)nd, sizeof *o->ext_len);
    o->crc = calloc(o->nblocks, sizeof *o->crc);
    o->crc_valid = calloc(o->nblocks, 1);
    int rc = 0;
    if (!o->ext_off || !o->ext_len || !o->crc || !o->crc_valid) {
        rc = mw_error_set(-ENOMEM, "store: out of memory for object '%s'", name);
        goto err;
    }
    uint64_t total = 0;
    for (int f = 0; f < nd; f++) {
        uint64_t nu = units / (uint64_t)nd + ((uint64_t)f < units % (uint64_t)nd);
        o->ext_len[f] = nu * o->stripe;
        total += o->ext_len[f];
    }
    if ((rc = mw_tier_reserve(st->cfg.tier, total, kind, name, &o->acct))) goto err;

    o->hash = name_hash(o->name);
    pthread_mutex_lock(&st->mu);
    if (find_locked(st, name)) {
        pthread_mutex_unlock(&st->mu);
        rc = mw_error_set(-EEXIST, "store: object '%s' already exists", name);
        goto err;
    }
    if (index_reserve(st)) {
        pthread_mutex_unlock(&st->mu);
        rc = mw_error_set(-ENOMEM, "store: out of memory for the index of object '%s'", name);
        goto err;
    }
    for (int f = 0; f < nd; f++) {
        if (!o->ext_len[f]) continue;
        if (at) {
            o->ext_off[f] = at[f];
            if (at[f] % MW_STORE_ALIGN == 0 && !ext_claim(&st->files[f], at[f], o->ext_len[f])) continue;
            rc = mw_error_set(MW_EFORMAT, "store: object '%s' cannot be placed at offset %llu (%llu bytes) of %s: it "
                              "overlaps another object or lies past the file's end (%llu bytes)", name,
                              (unsigned long long)at[f], (unsigned long long)o->ext_len[f], st->files[f].path,
                              (unsigned long long)st->files[f].size);
            for (int g = 0; g < f; g++)
                if (o->ext_len[g]) ext_release(&st->files[g], o->ext_off[g], o->ext_len[g]);
            pthread_mutex_unlock(&st->mu);
            goto err;
        }
        o->ext_off[f] = ext_alloc(&st->files[f], o->ext_len[f]);
        if (o->ext_off[f] != UINT64_MAX) continue;
        char a[32], b[32], c[32], d[32];
        rc = mw_error_set(-ENOSPC, "store full: object '%s' (%s) needs %s in %s, whose largest free extent is %s "
                                   "(capacity %s per file)", name, mw_fmt_bytes(a, sizeof a, size),
                          mw_fmt_bytes(b, sizeof b, o->ext_len[f]), st->files[f].path,
                          mw_fmt_bytes(c, sizeof c, largest_free(&st->files[f])),
                          mw_fmt_bytes(d, sizeof d, st->files[f].size));
        for (int g = 0; g < f; g++)
            if (o->ext_len[g]) ext_release(&st->files[g], o->ext_off[g], o->ext_len[g]);
        pthread_mutex_unlock(&st->mu);
        goto err;
    }
    o->iname = st->trace ? mw_trace_intern(st->trace, name) : NULL;
    if (!o->iname) o->iname = o->name;
    struct mw_store_obj **b = bucket_of(st, o->hash);
    o->hnext = *b;
    *b = o;
    st->n_objects++;
    st->used += total;
    pthread_mutex_unlock(&st->mu);
    *out = o;
    return 0;
err:
    obj_free(o);
    return rc;
}

int mw_store_obj_create(struct mw_store *st, const char *name, uint64_t size, struct mw_store_obj **out)
{
    return mw_store_obj_create_ex(st, name, size, MW_KIND_OTHER, out);
}

struct mw_store_obj *mw_store_obj_find(struct mw_store *st, const char *name)
{
    pthread_mutex_lock(&st->mu);
    struct mw_store_obj *o = find_locked(st, name);
    pthread_mutex_unlock(&st->mu);
    return o;
}

int mw_store_obj_delete(struct mw_store *st, struct mw_store_obj *obj)
{
    pthread_mutex_lock(&st->mu);
    if (!obj || index_remove(st, obj)) {
        pthread_mutex_unlock(&st->mu);
        return mw_error_set(-ENOENT, "store: object not found");
    }
    int rc = 0;
    for (int f = 0; f < st->ndirs; f++) {
        if (!obj->ext_len[f]) continue;
        if (ext_release(&st->files[f], obj->ext_off[f], obj->ext_len[f]) && !rc)
            rc = mw_error_set(-ENOMEM, "store: out of memory returning the extent of '%s' in %s: its %llu bytes "
                              "stay unusable until the store is closed", obj->name, st->files[f].path,
                              (unsigned long long)obj->ext_len[f]);
        else st->used -= obj->ext_len[f];
    }
    st->n_objects--;
    pthread_mutex_unlock(&st->mu);
    obj_free(obj);
    return rc;
}

const char *mw_store_obj_name(const struct mw_store_obj *obj) { return obj->iname; }
uint64_t mw_store_obj_size(const struct mw_store_obj *obj) { return obj->size; }
struct mw_aio *mw_store_aio(struct mw_store *st) { return st->aio; }

int mw_store_locate(struct mw_store *st, const struct mw_store_obj *obj, uint64_t offset, int *file_index,
                    const char **path, uint64_t *file_offset)
{
    if (offset >= obj->size) return mw_error_set(-EINVAL, "store: offset %llu is past the end of '%s'",
                                                 (unsigned long long)offset, obj->name);
    uint64_t k = offset / obj->stripe;
    int f = (int)(k % (uint64_t)st->ndirs);
    if (file_index) *file_index = f;
    if (path) *path = st->files[f].path;
    if (file_offset) *file_offset = obj->ext_off[f] + (k / (uint64_t)st->ndirs) * obj->stripe + offset % obj->stripe;
    return 0;
}

void mw_store_stats(struct mw_store *st, struct mw_store_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&st->mu);
    out->direct = 1;
    for (int i = 0; i < st->ndirs; i++) {
        out->capacity += st->files[i].size;
        if (!st->files[i].direct) out->direct = 0;
    }
    out->used = st->used;
    out->n_objects = st->n_objects;
    pthread_mutex_unlock(&st->mu);
    out->bytes_read = atomic_load(&st->bytes_read);
    out->bytes_written = atomic_load(&st->bytes_written);
    out->checksum_failures = atomic_load(&st->checksum_failures);
}

uint64_t mw_store_obj_file_offset(const struct mw_store_obj *obj, int file) { return obj->ext_off[file]; }

void mw_store_set_keep_files(struct mw_store *st, int keep)
{
    pthread_mutex_lock(&st->mu);
    st->cfg.keep_files = keep;
    pthread_mutex_unlock(&st->mu);
}

int mw_store_sync(struct mw_store *st)
{
    for (int i = 0; i < st->ndirs; i++)
        if (fdatasync(st->files[i].fd) != 0) {
            int e = errno;
            return mw_error_set(-e, "store: flushing %s to disk (fdatasync) failed: %s", st->files[i].path, strerror(e));
        }
    return 0;
}

/* The digest of a list of block crcs: their crc32c, each as 4 little-endian bytes. */
static uint32_t crcs_digest(const uint32_t *crc, uint64_t n)
{
    uint32_t d = 0;
    for (uint64_t b = 0; b < n; b++) {
        uint8_t le[4] = {(uint8_t)crc[b], (uint8_t)(crc[b] >> 8), (uint8_t)(crc[b] >> 16), (uint8_t)(crc[b] >> 24)};
        d = mw_crc32c(d, le, 4);
    }
    return d;
}

int mw_store_obj_digest(struct mw_store *st, const struct mw_store_obj *obj, uint32_t *digest)
{
    if (!st->cfg.checksum) return mw_error_set(-EINVAL, "store: '%s' has no checksums (checksum = 0)", obj->name);
    for (uint64_t b = 0; b < obj->nblocks; b++)
        if (!obj->crc_valid[b])
            return mw_error_set(-ENODATA, "store: block %llu of '%s' was never written: it has no checksum",
                                (unsigned long long)b, obj->name);
    *digest = crcs_digest(obj->crc, obj->nblocks);
    return 0;
}

int mw_store_obj_adopt(struct mw_store *st, struct mw_store_obj *obj, const void *data, uint32_t digest)
{
    if (!st->cfg.checksum) return mw_error_set(-EINVAL, "store: '%s' has no checksums (checksum = 0)", obj->name);
    uint64_t cb = st->cfg.crc_block;
    uint32_t *crc = malloc(sizeof *crc * (size_t)obj->nblocks);
    if (!crc) return mw_error_set(-ENOMEM, "store: out of memory");
    for (uint64_t b = 0; b < obj->nblocks; b++) {
        uint64_t bs = b * cb, be = MW_MIN(bs + cb, obj->size);
        crc[b] = mw_crc32c(0, (const char *)data + bs, (size_t)(be - bs));
    }
    uint32_t got = crcs_digest(crc, obj->nblocks);
    if (got != digest) {
        free(crc);
        const char *path = "?";
        uint64_t foff = 0;
        mw_store_locate(st, obj, 0, NULL, &path, &foff);
        atomic_fetch_add(&st->checksum_failures, 1);
        return mw_error_set(MW_ECHECKSUM, "store: object '%s' (file %s, offset %llu) does not hold what was committed: "
                            "digest 0x%08x, the record says 0x%08x — the data on disk is corrupt or was overwritten",
                            obj->name, path, (unsigned long long)foff, got, digest);
    }
    memcpy(obj->crc, crc, sizeof *crc * (size_t)obj->nblocks);
    memset(obj->crc_valid, 1, (size_t)obj->nblocks);
    free(crc);
    return 0;
}
