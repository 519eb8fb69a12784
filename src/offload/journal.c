/*
 * journal.c — the engine's durable commit record: after every committed step, where each NVMe
 * object of the run lives, which slot holds the committed state, the digest of its checksums,
 * and an opaque blob of the caller's (the trainer's continuation state), so that a run killed at
 * any instant continues from its last committed step (docs/resume.md).
 *
 * Why this order: a step's writes go to the slot that is not committed, so the record of step
 * s stays true while step s+1 runs. Step s+1 is made durable first (fdatasync of the store
 * files: its data and the extents fallocate reserved), then its record replaces the old one
 * atomically (a temporary, fsync, rename, fsync of the directory: mw_atomic_write_file). A kill
 * before the rename leaves the record of step s, whose slot nothing has touched; after it, the
 * record of step s+1, whose bytes are on the device. The record carries a crc32c and its own
 * length, and the digests of the committed objects are checked when they are read back, so a
 * torn or stale record, or a file changed behind the run's back, is refused, never trusted.
 *
 * Format (version 1, little-endian, fixed order; docs/resume.md has the table):
 *   "MWCOMMIT" u32 version u32 flags(0) u64 record bytes u64 step
 *   u64 elements u64 subgroup size u32 subgroups u32 moments format u32 master tier u32 moments tier
 *   u32 streamed u32 dirs u64 stripe u64 crc block u64 capacity u32 dir-list bytes, the list
 *   u32 objects, each: u32 subgroup u8 kind (0 state, 1 gradients) u8 slot u8 has digest u8 0
 *                      u32 digest u32 0 u64 bytes u64 offset in each file [dirs]
 *   u32 blob bytes, the blob; u32 crc32c of everything before it
 */
#include "offload/internal.h"
#include "memwall/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REC_MAGIC "MWCOMMIT"
#define REC_VERSION 1u
#define REC_MAX_BYTES ((uint64_t)256 << 20) /* far above any real record: a bound on what is read */
#define REC_MAX_OBJECTS ((uint64_t)1 << 24)
#define REC_DIRLIST_MAX 65536u
#define STORE_LOCK_NAME "memwall.lock" /* the store's directory lock (src/store/store_impl.h) */

/* ------------------------------------------------------------------ byte buffer */

struct wbuf { uint8_t *p; size_t n, cap; int oom; };

static void put(struct wbuf *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put8(struct wbuf *b, uint8_t v) { put(b, &v, 1); }
static void put32(struct wbuf *b, uint32_t v) { uint8_t x[4]; for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i)); put(b, x, 4); }
static void put64(struct wbuf *b, uint64_t v) { uint8_t x[8]; for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i)); put(b, x, 8); }

struct rbuf { const uint8_t *p; size_t n, at; int short_; };

static const uint8_t *take(struct rbuf *r, size_t n)
{
    if (r->short_ || n > r->n - r->at) { r->short_ = 1; return NULL; }
    const uint8_t *q = r->p + r->at;
    r->at += n;
    return q;
}
static uint8_t get8(struct rbuf *r) { const uint8_t *q = take(r, 1); return q ? q[0] : 0; }
static uint32_t get32(struct rbuf *r)
{
    const uint8_t *q = take(r, 4);
    uint32_t v = 0;
    for (int i = 0; q && i < 4; i++) v |= (uint32_t)q[i] << (8 * i);
    return v;
}
static uint64_t get64(struct rbuf *r)
{
    const uint8_t *q = take(r, 8);
    uint64_t v = 0;
    for (int i = 0; q && i < 8; i++) v |= (uint64_t)q[i] << (8 * i);
    return v;
}

/* ------------------------------------------------------------------ parsing (hostile input) */

void mw_offload_record_free(struct mw_offload_record *r)
{
    free(r->nvme_dir);
    free(r->obj);
    free(r->ext_off);
    free(r->blob);
    memset(r, 0, sizeof *r);
}

int mw_offload_record_parse(const void *data, size_t n, struct mw_offload_record *out)
{
    memset(out, 0, sizeof *out);
    struct rbuf r = {data, n, 0, 0};
    if (n < 8 + 4 + 4 + 8 + 4 || memcmp(data, REC_MAGIC, 8))
        return mw_error_set(MW_EFORMAT, "not a memwall commit record (no MWCOMMIT magic)");
    take(&r, 8);
    out->version = get32(&r);
    uint32_t flags = get32(&r);
    if (out->version != REC_VERSION || flags)
        return mw_error_set(MW_EFORMAT, "commit record version %u (flags %u); this memwall reads version %u",
                            out->version, flags, REC_VERSION);
    uint64_t bytes = get64(&r);
    if (bytes != n) return mw_error_set(MW_EFORMAT, "commit record is %zu bytes, it says %llu: torn or truncated", n,
                                        (unsigned long long)bytes);
    const uint8_t *t = (const uint8_t *)data + n - 4;
    uint32_t want = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
    if (mw_crc32c(0, data, n - 4) != want)
        return mw_error_set(MW_ECHECKSUM, "commit record crc32c 0x%08x, it says 0x%08x: corrupt",
                            mw_crc32c(0, data, n - 4), want);
    out->step = get64(&r);
    out->total_elems = get64(&r);
    out->subgroup_size = get64(&r);
    out->n_subgroups = get32(&r);
    out->moments = get32(&r);
    out->master_tier = get32(&r);
    out->moments_tier = get32(&r);
    out->stream = get32(&r);
    out->ndirs = get32(&r);
    out->stripe_size = get64(&r);
    out->crc_block = get64(&r);
    out->capacity = get64(&r);
    uint32_t dl = get32(&r);
    int rc = MW_EFORMAT;
    const char *bad = NULL;
    if (r.short_) bad = "header cut short";
    else if (!out->n_subgroups || !out->total_elems || !out->subgroup_size || out->stream > 1 || out->moments > 2 ||
             out->master_tier > 2 || out->moments_tier > 2)
        bad = "engine settings out of range";
    else if (out->ndirs < 1 || out->ndirs > 64 || !out->stripe_size || !out->crc_block || !out->capacity)
        bad = "store settings out of range";
    else if (!dl || dl > REC_DIRLIST_MAX) bad = "directory list length";
    if (bad) return mw_error_set(rc, "commit record: %s", bad);
    const uint8_t *dirs = take(&r, dl);
    if (!dirs || memchr(dirs, 0, dl)) return mw_error_set(MW_EFORMAT, "commit record: directory list cut short or holds a NUL");
    uint32_t ncolon = 0;
    for (uint32_t i = 0; i < dl; i++) ncolon += dirs[i] == ':';
    if (ncolon + 1 != out->ndirs)
        return mw_error_set(MW_EFORMAT, "commit record: %u directories named, %u counted", ncolon + 1, out->ndirs);
    out->nvme_dir = malloc((size_t)dl + 1);
    if (!out->nvme_dir) return mw_error_set(-ENOMEM, "out of memory");
    memcpy(out->nvme_dir, dirs, dl);
    out->nvme_dir[dl] = 0;
    out->nobj = get32(&r);
    size_t per, all, offs;
    if (r.short_ || !out->nobj || out->nobj > REC_MAX_OBJECTS || mw_mul_size(out->ndirs, 8, &per) ||
        mw_add_size(per, 24, &per) || mw_mul_size(per, out->nobj, &all) || all > r.n - r.at ||
        mw_mul_size((size_t)out->nobj, out->ndirs, &offs)) {
        rc = mw_error_set(MW_EFORMAT, "commit record: object count %u does not fit its %zu bytes", out->nobj, n);
        goto err;
    }
    out->obj = calloc(out->nobj, sizeof *out->obj);
    out->ext_off = calloc(offs, sizeof *out->ext_off);
    if (!out->obj || !out->ext_off) { rc = mw_error_set(-ENOMEM, "out of memory"); goto err; }
    for (uint32_t i = 0; i < out->nobj; i++) {
        struct mw_offload_record_obj *o = &out->obj[i];
        o->sg = get32(&r);
        o->kind = get8(&r);
        o->slot = get8(&r);
        o->has_digest = get8(&r);
        uint8_t z0 = get8(&r);
        o->digest = get32(&r);
        uint32_t z1 = get32(&r);
        o->bytes = get64(&r);
        for (uint32_t f = 0; f < out->ndirs; f++) out->ext_off[(size_t)i * out->ndirs + f] = get64(&r);
        if (o->sg >= out->n_subgroups || o->kind > 1 || o->slot > 1 || o->has_digest > 1 || z0 || z1 || !o->bytes) {
            rc = mw_error_set(MW_EFORMAT, "commit record: object %u is invalid (subgroup %u, kind %u, slot %u)", i, o->sg,
                              o->kind, o->slot);
            goto err;
        }
    }
    out->blob_len = get32(&r);
    if (r.short_ || out->blob_len > MW_OFFLOAD_BLOB_MAX || out->blob_len != r.n - r.at - 4) {
        rc = mw_error_set(MW_EFORMAT, "commit record: blob of %u bytes does not fit", out->blob_len);
        goto err;
    }
    out->blob = malloc(out->blob_len ? out->blob_len : 1);
    if (!out->blob) { rc = mw_error_set(-ENOMEM, "out of memory"); goto err; }
    memcpy(out->blob, take(&r, out->blob_len), out->blob_len);
    return 0;
err:
    mw_offload_record_free(out);
    return rc;
}

int mw_offload_record_path(const char *nvme_dir, char *buf, size_t n)
{
    size_t dl = strcspn(nvme_dir, ":");
    int k = snprintf(buf, n, "%.*s/%s", (int)dl, nvme_dir, MW_OFFLOAD_RECORD_NAME);
    if (k < 0 || (size_t)k >= n) return mw_error_set(-ENAMETOOLONG, "the NVMe directory %.*s is too long", (int)dl, nvme_dir);
    return 0;
}

/* The record lives in the first directory of its run: whatever that directory was called when
 * the record was written (a run copied or moved elsewhere), it is the one it is read from now.
 * The other directories are kept as written (absolute since records name them so). */
static int relocate(struct mw_offload_record *r, const char *dir)
{
    size_t d0 = strcspn(dir, ":"), rest = strcspn(r->nvme_dir, ":");
    size_t tail = strlen(r->nvme_dir + rest);
    char *p = malloc(d0 + tail + 1);
    if (!p) return mw_error_set(-ENOMEM, "out of memory");
    memcpy(p, dir, d0);
    memcpy(p + d0, r->nvme_dir + rest, tail + 1);
    free(r->nvme_dir);
    r->nvme_dir = p;
    return 0;
}

int mw_offload_record_read(const char *dir, struct mw_offload_record *out)
{
    memset(out, 0, sizeof *out);
    char path[4200];
    int rc = mw_offload_record_path(dir, path, sizeof path);
    if (rc) return rc;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return mw_error_set(-ENOENT, "%s holds no commit record (%s): no step of a run there was committed", dir,
                                MW_OFFLOAD_RECORD_NAME);
        return mw_error_set(-e, "cannot open the commit record %s: %s", path, strerror(e));
    }
    struct stat st;
    uint8_t *buf = NULL;
    if (fstat(fd, &st) != 0) { rc = mw_error_set(-errno, "cannot stat %s: %s", path, strerror(errno)); goto out; }
    if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > REC_MAX_BYTES) {
        rc = mw_error_set(MW_EFORMAT, "%s is not a commit record (not a regular file, or %lld bytes)", path,
                          (long long)st.st_size);
        goto out;
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = malloc(n ? n : 1);
    if (!buf) { rc = mw_error_set(-ENOMEM, "out of memory reading %s", path); goto out; }
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { rc = mw_error_set(k < 0 ? -errno : MW_EFORMAT, "cannot read %s", path); goto out; }
        got += (size_t)k;
    }
    if ((rc = mw_offload_record_parse(buf, n, out))) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mw_error_msg());
        rc = mw_error_set(rc, "%s: %s", path, msg);
    } else if ((rc = relocate(out, dir))) {
        mw_offload_record_free(out);
    }
out:
    free(buf);
    close(fd);
    return rc;
}

int mw_offload_record_file_path(const struct mw_offload_record *r, int i, char *buf, size_t n)
{
    const char *d = r->nvme_dir;
    for (int k = 0; k < i && d; k++) {
        d = strchr(d, ':');
        if (d) d++;
    }
    if (!d || i < 0 || (uint32_t)i >= r->ndirs) return mw_error_set(-EINVAL, "commit record: no directory %d", i);
    size_t dl = strcspn(d, ":");
    int k = snprintf(buf, n, "%.*s/%s.%d.dat", (int)dl, d, OFL_FILE_PREFIX, i);
    if (k < 0 || (size_t)k >= n) return mw_error_set(-ENAMETOOLONG, "path too long");
    return 0;
}

/* ------------------------------------------------------------------ the engine's side */

/* Objects of subgroup sg in record order: slot 0, slot 1, then its gradients when streamed. */
static uint32_t objs_per_sg(const struct mw_offload *e) { return e->gobj ? 3u : 2u; }
static struct mw_store_obj *obj_at(const struct mw_offload *e, uint32_t sg, uint32_t j)
{
    return j < 2 ? e->obj[2 * sg + j] : e->gobj[sg];
}

int ofl_journal_write(struct mw_offload *e, uint64_t step)
{
    int rc = mw_store_sync(e->store); /* the step's bytes first, then the record that points at them */
    if (rc) return rc;
    struct wbuf b = {0};
    put(&b, REC_MAGIC, 8);
    put32(&b, REC_VERSION);
    put32(&b, 0);
    size_t len_at = b.n;
    put64(&b, 0); /* the record's length, filled in below */
    put64(&b, step);
    put64(&b, e->plan.total_elems);
    put64(&b, e->plan.subgroup_size);
    put32(&b, e->nsg);
    put32(&b, (uint32_t)e->cfg.moments);
    put32(&b, (uint32_t)e->cfg.place.tier[MW_OFFLOAD_MASTER]);
    put32(&b, (uint32_t)e->cfg.place.tier[MW_OFFLOAD_MOMENTS]);
    put32(&b, e->gobj ? 1u : 0u);
    put32(&b, (uint32_t)e->sto_ndirs);
    put64(&b, e->sto_stripe);
    put64(&b, e->sto_crc_block);
    put64(&b, e->sto_capacity);
    put32(&b, (uint32_t)strlen(e->rec_dirs));
    put(&b, e->rec_dirs, strlen(e->rec_dirs));
    uint32_t per = objs_per_sg(e);
    put32(&b, e->nsg * per);
    for (uint32_t i = 0; i < e->nsg && !rc; i++)
        for (uint32_t j = 0; j < per; j++) {
            struct mw_store_obj *o = obj_at(e, i, j);
            uint32_t digest = 0;
            int committed = j < 2 && j == (uint32_t)(step % 2);
            if (committed && (rc = mw_store_obj_digest(e->store, o, &digest))) break;
            put32(&b, i);
            put8(&b, j < 2 ? 0 : 1);
            put8(&b, j < 2 ? (uint8_t)j : 0);
            put8(&b, committed ? 1 : 0);
            put8(&b, 0);
            put32(&b, digest);
            put32(&b, 0);
            put64(&b, mw_store_obj_size(o));
            for (int f = 0; f < e->sto_ndirs; f++) put64(&b, mw_store_obj_file_offset(o, f));
        }
    put32(&b, (uint32_t)e->jblob_len);
    if (e->jblob_len) put(&b, e->jblob, e->jblob_len);
    if (!rc && !b.oom) {
        uint64_t total = b.n + 4;
        for (int i = 0; i < 8; i++) b.p[len_at + (size_t)i] = (uint8_t)(total >> (8 * i));
        put32(&b, mw_crc32c(0, b.p, b.n));
    }
    if (!rc && b.oom) rc = mw_error_set(-ENOMEM, "offload: out of memory building the commit record");
    if (!rc) rc = mw_atomic_write_file(e->jpath, b.p, b.n);
    free(b.p);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mw_error_msg());
        return mw_error_set(rc, "offload: the commit record of step %llu could not be written: %s",
                            (unsigned long long)step, msg);
    }
    if (!e->jkeep) { /* from the first record on, a crash keeps the files for the resume */
        mw_store_set_keep_files(e->store, 1);
        e->jkeep = 1;
    }
    return 0;
}

/* Temporaries of a record write cut short (PATH.tmp.*), in the record's directory. */
void ofl_journal_sweep(const char *record_path)
{
    const char *slash = strrchr(record_path, '/');
    if (!slash) return;
    char *dir = strndup(record_path, (size_t)(slash - record_path));
    if (!dir) return;
    DIR *d = opendir(*dir ? dir : "/");
    size_t pl = strlen(MW_OFFLOAD_RECORD_NAME);
    for (struct dirent *x; d && (x = readdir(d));) {
        if (strncmp(x->d_name, MW_OFFLOAD_RECORD_NAME, pl) || strncmp(x->d_name + pl, ".tmp.", 5)) continue;
        char p[4400];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, x->d_name) < sizeof p) unlink(p);
    }
    if (d) closedir(d);
    free(dir);
}

int ofl_journal_check(struct mw_offload *e, const struct mw_offload_record *r)
{
    const char *what = NULL;
    unsigned long long rec = 0, now = 0;
#define CHECK(name, a, b) if (!what && (uint64_t)(a) != (uint64_t)(b)) { what = name; rec = (a); now = (b); }
    CHECK("parameters", r->total_elems, e->plan.total_elems);
    CHECK("subgroup size", r->subgroup_size, e->plan.subgroup_size);
    CHECK("subgroups", r->n_subgroups, e->nsg);
    CHECK("moment format", r->moments, e->cfg.moments);
    CHECK("master weights tier", r->master_tier, e->cfg.place.tier[MW_OFFLOAD_MASTER]);
    CHECK("moments tier", r->moments_tier, e->cfg.place.tier[MW_OFFLOAD_MOMENTS]);
    CHECK("streamed weights", r->stream, e->cfg.stream ? 1 : 0);
    CHECK("NVMe directories", r->ndirs, e->sto_ndirs);
    CHECK("stripe size", r->stripe_size, e->sto_stripe);
    CHECK("checksum block", r->crc_block, e->sto_crc_block);
    CHECK("NVMe capacity", r->capacity, e->sto_capacity);
    CHECK("objects", r->nobj, (uint64_t)e->nsg * (e->cfg.stream ? 3 : 2));
#undef CHECK
    if (what)
        return mw_error_set(-EINVAL, "the commit record in %s was written by a run with %s %llu, this one has %llu: "
                            "resume with the settings of that run", e->cfg.nvme_dir, what, rec, now);
    /* The first directory is the one the record lies in, whatever it was called (relocate). */
    if (strcmp(r->nvme_dir + strcspn(r->nvme_dir, ":"), e->cfg.nvme_dir + strcspn(e->cfg.nvme_dir, ":")))
        return mw_error_set(-EINVAL, "the commit record in %s names the NVMe directories %s, this run %s", e->cfg.nvme_dir,
                            r->nvme_dir, e->cfg.nvme_dir);
    uint32_t per = e->cfg.stream ? 3 : 2;
    for (uint32_t k = 0; k < r->nobj; k++) {
        const struct mw_offload_record_obj *o = &r->obj[k];
        uint32_t sg = k / per, j = k % per;
        uint64_t off, len;
        ofl_nvme_span(e, sg, &off, &len);
        if (j == 2) len = MW_ALIGN_UP(4 * e->sgs[sg].n, OFL_PAD);
        int committed = j < 2 && j == r->step % 2;
        if (o->sg != sg || o->kind != (j == 2) || (j < 2 && o->slot != j) || o->bytes != len || o->has_digest != committed)
            return mw_error_set(MW_EFORMAT, "the commit record in %s does not describe this run's objects (object %u: "
                                "subgroup %u, %llu bytes; expected subgroup %u, %llu bytes)", e->cfg.nvme_dir, k, o->sg,
                                (unsigned long long)o->bytes, sg, (unsigned long long)len);
    }
    return 0;
}

int ofl_journal_restore(struct mw_offload *e, const struct mw_offload_record *r)
{
    int cur = (int)(r->step % 2);
    uint32_t per = e->cfg.stream ? 3 : 2;
    for (uint32_t i = 0; i < e->nsg; i++) {
        uint64_t off, len;
        ofl_nvme_span(e, i, &off, &len);
        struct mw_store_obj *o = e->obj[2 * i + cur];
        char *dst = (char *)e->staging[0].ptr + off;
        int rc = mw_store_read(e->store, o, 0, len, dst);
        if (!rc) rc = mw_store_obj_adopt(e->store, o, dst, r->obj[i * per + (uint32_t)cur].digest);
        if (rc) return rc;
        e->stats.nvme_read_bytes += len;
        struct mw_optim_slice s;
        ofl_view_staging(e, i, 0, &s);
        ofl_refresh_weights(e, e->sgs[i].first, e->sgs[i].n, s.master);
    }
    e->committed = r->step;
    return 0;
}

/* ------------------------------------------------------------------ the end of a run */

static int dir0_path(const char *dirs, const char *name, char *buf, size_t n)
{
    size_t dl = strcspn(dirs, ":");
    int k = snprintf(buf, n, "%.*s/%s", (int)dl, dirs, name);
    if (k < 0 || (size_t)k >= n) return mw_error_set(-ENAMETOOLONG, "the NVMe directory %.*s is too long", (int)dl, dirs);
    return 0;
}

int mw_offload_run_done_read(const char *dirs, char *buf, size_t n)
{
    char path[4200];
    int rc = dir0_path(dirs, MW_OFFLOAD_DONE_NAME, path, sizeof path);
    if (rc) return rc;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t k = n ? read(fd, buf, n - 1) : -1;
    int e = errno;
    close(fd);
    if (k < 0) return mw_error_set(-e, "cannot read %s: %s", path, strerror(e));
    buf[k] = 0;
    for (ssize_t i = 0; i < k; i++) /* shown to the user: printable text only */
        if (((unsigned char)buf[i] < 0x20 && buf[i] != '\n') || (unsigned char)buf[i] >= 0x7f) buf[i] = '?';
    return 0;
}

/* Temporaries of a done marker whose write was cut short (DIR0/memwall-run.done.tmp.*): only
 * under the directory's lock, where no other writer of ours can be. */
static void sweep_done_tmp(const char *dir0)
{
    DIR *d = opendir(dir0);
    size_t pl = strlen(MW_OFFLOAD_DONE_NAME);
    char p[4400];
    for (struct dirent *x; d && (x = readdir(d));)
        if (!strncmp(x->d_name, MW_OFFLOAD_DONE_NAME, pl) && !strncmp(x->d_name + pl, ".tmp.", 5) &&
            (size_t)snprintf(p, sizeof p, "%s/%s", dir0, x->d_name) < sizeof p)
            unlink(p);
    if (d) closedir(d);
}

/* Order: the marker (durable), then the record (the run can no longer be resumed: it is done),
 * then the files the record names. A crash between leaves a marker and files that the next run
 * on the directory sweeps (they belong to a finished run), never a record of a finished run. */
int mw_offload_run_retire(const char *dirs, const char *done_text)
{
    struct mw_offload_record rec;
    int rc = mw_offload_record_read(dirs, &rec);
    if (rc) return rc;
    char dir0[4200], path[4400];
    size_t dl = strcspn(dirs, ":");
    snprintf(dir0, sizeof dir0, "%.*s", (int)(dl < sizeof dir0 ? dl : sizeof dir0 - 1), dirs);
    struct mw_dir_lock *lock = NULL;
    if ((rc = mw_dir_lock(&lock, dir0, STORE_LOCK_NAME))) goto out;
    sweep_done_tmp(dir0);
    if ((rc = dir0_path(dirs, MW_OFFLOAD_DONE_NAME, path, sizeof path)) ||
        (rc = mw_atomic_write_file(path, done_text, strlen(done_text))))
        goto out;
    if ((rc = mw_offload_record_path(dirs, path, sizeof path))) goto out;
    if (unlink(path) != 0 && errno != ENOENT) {
        rc = mw_error_set(-errno, "cannot remove the commit record %s: %s", path, strerror(errno));
        goto out;
    }
    ofl_journal_sweep(path);
    if ((rc = mw_fsync_parent(path))) goto out;
    for (uint32_t i = 0; i < rec.ndirs; i++)
        if (!mw_offload_record_file_path(&rec, (int)i, path, sizeof path) && unlink(path) != 0 && errno != ENOENT)
            rc = mw_error_set(-errno, "cannot remove the run's file %s: %s", path, strerror(errno));
out:
    if (lock) mw_dir_unlock(lock);
    mw_offload_record_free(&rec);
    return rc;
}

int mw_offload_run_tidy(const char *dirs)
{
    char path[4400], dir0[4200];
    struct stat st;
    size_t dl = strcspn(dirs, ":");
    snprintf(dir0, sizeof dir0, "%.*s", (int)(dl < sizeof dir0 ? dl : sizeof dir0 - 1), dirs);
    if (dir0_path(dirs, MW_OFFLOAD_RECORD_NAME, path, sizeof path) || stat(path, &st) == 0) return 0; /* not finished */
    if (dir0_path(dirs, MW_OFFLOAD_DONE_NAME, path, sizeof path) || stat(path, &st) != 0) return 0;
    struct mw_dir_lock *lock = NULL;
    int rc = mw_dir_lock(&lock, dir0, STORE_LOCK_NAME); /* a live run there: leave it alone */
    if (rc) return rc;
    sweep_done_tmp(dir0);
    DIR *d = opendir(dir0);
    size_t pl = strlen(OFL_FILE_PREFIX);
    for (struct dirent *x; d && (x = readdir(d));) {
        size_t n = strlen(x->d_name);
        if (strncmp(x->d_name, OFL_FILE_PREFIX ".", pl + 1) || n < pl + 5 || strcmp(x->d_name + n - 4, ".dat")) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir0, x->d_name) < sizeof path) unlink(path);
    }
    if (d) closedir(d);
    mw_dir_unlock(lock); /* and with it a lock file a killed process left */
    return 0;
}
