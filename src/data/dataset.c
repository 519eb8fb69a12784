/*
 * dataset.c — opening text files and llm.c shards as token segments; training and
 * validation windows over them (see data.h for the contract).
 * Why mmap for shards: a GPT-2 shard of 100M tokens is 200 MB that the loader touches only
 * where a batch lands; the page cache keeps what is hot and nothing is copied. Text is small
 * (a corpus of a few MiB) and must be widened to uint16 for the EOT token, so it is read.
 *
 * Why each file is opened once, and only regular files are read: the data path is the user's,
 * and a FIFO, /dev/stdin or a device under it used to hang the run — the loader opened the file
 * once to sniff the shard magic and again to read it, and the second open of a FIFO waits for a
 * writer that has already gone. Every file is now opened exactly once, with O_NONBLOCK so that
 * the open itself never waits (on a FIFO without a writer, a tty, a serial line), then fstat'ed;
 * the kind, the shard magic (pread) and the contents all come from that one descriptor. A FIFO,
 * a character or block device or a socket is refused, naming the path and what it is, rather
 * than read once as a stream: a run reads its data again on --resume and on every MPI rank, and
 * the run record keeps the data path for exactly that, so data that can be read only once would
 * make a run that cannot be resumed. (Save the stream to a file first.) In a directory, entries
 * are classified with fstatat (no open): sub-directories and hidden files are skipped as before,
 * any other non-regular entry is refused the same way, and the files are opened relative to the
 * directory's descriptor, once each.
 */
#include "memwall/data.h"
#include "memwall/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void mw_data_opts_default(struct mw_data_opts *o) { o->val_frac = 0.1; }

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int is_val_name(const char *path)
{
    const char *base = strrchr(path, '/');
    return strstr(base ? base + 1 : path, "val") != NULL;
}

/* Maps and validates one shard, open on fd (a regular file of st_size bytes), into seg. Every
 * header field is hostile: the magic picks the width, the version must be the one that magic
 * goes with, and the byte count the token count implies is computed with overflow checks before
 * it is compared with the file's size (so no count can make the mapping look longer than it is). */
static int open_shard(int fd, const char *path, const struct stat *st, struct mw_data_segment *seg)
{
    size_t len = (size_t)st->st_size;
    if (len < MW_SHARD_HEADER_BYTES)
        return mw_error_set(MW_EFORMAT, "shard %s is truncated: %zu bytes, shorter than its %d-byte header",
                            path, len, MW_SHARD_HEADER_BYTES);
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    if (map == MAP_FAILED) return mw_error_set(-e, "cannot mmap %s: %s", path, strerror(e));
    int32_t hdr[3];
    memcpy(hdr, map, sizeof hdr);
    int err = 0, wide = hdr[0] == MW_SHARD32_MAGIC;
    int32_t version = wide ? MW_SHARD32_VERSION : MW_SHARD_VERSION;
    uint64_t want = 0;
    int wrap = hdr[2] >= 0 && (mw_mul_u64((uint64_t)hdr[2], wide ? 4 : 2, &want) ||
                               mw_add_u64(want, (uint64_t)MW_SHARD_HEADER_BYTES, &want));
    if (hdr[0] != MW_SHARD_MAGIC && hdr[0] != MW_SHARD32_MAGIC)
        err = mw_error_set(MW_EFORMAT, "%s is not a token shard: magic %d, expected %d (uint16 tokens) or %d (uint32 "
                           "tokens) (llm.c .bin format)", path, hdr[0], MW_SHARD_MAGIC, MW_SHARD32_MAGIC);
    else if (hdr[1] != version)
        err = mw_error_set(MW_EFORMAT, "shard %s has magic %d and version %d; that magic goes with version %d (%s "
                           "tokens) only", path, hdr[0], hdr[1], version, wide ? "uint32" : "uint16");
    else if (hdr[2] < 0 || wrap || want != (uint64_t)len)
        err = mw_error_set(MW_EFORMAT, "shard %s: header says %d tokens (%llu bytes in all) but the file has %zu bytes%s",
                           path, hdr[2], (unsigned long long)want, len,
                           hdr[2] >= 0 && want > (uint64_t)len ? ": truncated" : "");
    if (err) { munmap(map, len); return err; }
    seg->map = map;
    seg->map_len = len;
    if (wide) seg->tok32 = (const uint32_t *)((const char *)map + MW_SHARD_HEADER_BYTES);
    else seg->tok = (const uint16_t *)((const char *)map + MW_SHARD_HEADER_BYTES);
    seg->n = (size_t)hdr[2];
    madvise(map, len, MADV_RANDOM);
    return 0;
}

/* Reads a text file, open on fd (a regular file of st_size bytes), as EOT + its bytes. */
static int open_text(int fd, const char *path, const struct stat *st, struct mw_data_segment *seg)
{
    size_t n = (size_t)st->st_size;
    uint8_t *buf = malloc(n ? n : 1);
    uint16_t *tok = malloc((n + 1) * sizeof *tok);
    int err = 0;
    if (!buf || !tok) { err = mw_error_set(-ENOMEM, "no memory for the %zu bytes of %s", n, path); goto err; }
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { err = mw_error_set(-errno, "cannot read %s: %s", path, strerror(errno)); goto err; }
        if (r == 0) {
            err = mw_error_set(-EIO, "short read of %s: %zu of %zu bytes (file shrank?)", path, got, n);
            goto err;
        }
        got += (size_t)r;
    }
    tok[0] = MW_TOK_EOT;
    mw_tok_encode_bytes(buf, n, tok + 1);
    seg->owned = tok;
    seg->tok = tok;
    seg->n = n + 1;
    free(buf);
    return 0;
err:
    free(buf);
    free(tok);
    return err;
}

/* What a non-regular file is, for the refusal. */
static const char *file_kind(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO (named pipe)" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : S_ISDIR(m) ? "a directory" : "not a regular file";
}

static int refuse_kind(const char *path, mode_t m)
{
    return mw_error_set(-EINVAL, "data %s is %s: memwall reads its data again on a resume and on every rank, so it "
                        "takes regular files (or a directory of them) only; save the stream to a file first",
                        path, file_kind(m));
}

/* Opens name (relative to dirfd, or AT_FDCWD) once, without blocking whatever it is, and fstats
 * it. A regular file's descriptor is returned (blocking again); anything else is refused. */
static int open_data_file(int dirfd, const char *name, const char *path, int *fd_out, struct stat *st)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return mw_error_set(-errno, "cannot open data %s: %s", path, strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return mw_error_set(-e, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode) && !S_ISDIR(st->st_mode)) {
        close(fd);
        return refuse_kind(path, st->st_mode);
    }
    /* Back to blocking reads (Linux ignores O_NONBLOCK on regular files; a FUSE file system may not). */
    int fl = S_ISREG(st->st_mode) ? fcntl(fd, F_GETFL) : 0;
    if (fl < 0 || (S_ISREG(st->st_mode) && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)) {
        int e = errno;
        close(fd);
        return mw_error_set(-e, "cannot set %s to blocking reads: %s", path, strerror(e));
    }
    *fd_out = fd;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists the regular, non-hidden files of the directory open as dp (path dir, for messages),
 * sorted by name; *out is an array of malloc'd names. Sub-directories are skipped; any other
 * kind of entry is refused (refuse_kind). No file is opened here. */
static int list_dir(DIR *dp, const char *dir, char ***out, int *count)
{
    char **v = NULL;
    int n = 0, cap = 0, err = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (de->d_name[0] == '.') continue;
        struct stat st;
        if (fstatat(dirfd(dp), de->d_name, &st, 0) != 0) {
            err = mw_error_set(-errno, "cannot stat %s/%s: %s", dir, de->d_name, strerror(errno));
            break;
        }
        if (S_ISDIR(st.st_mode)) continue;
        if (!S_ISREG(st.st_mode)) {
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            err = refuse_kind(p, st.st_mode);
            break;
        }
        char *name = strdup(de->d_name);
        if (!name) { err = mw_error_set(-ENOMEM, "no memory listing %s", dir); break; }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) { free(name); err = mw_error_set(-ENOMEM, "no memory listing %s", dir); break; }
            v = nv;
        }
        v[n++] = name;
    }
    if (err) {
        for (int i = 0; i < n; i++) free(v[i]);
        free(v);
        return err;
    }
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    *count = n;
    return 0;
}

/* A file is a shard if it is named *.bin or starts with the shard magic (read from fd). */
static int looks_like_shard(int fd, const char *path)
{
    if (ends_with(path, ".bin")) return 1;
    int32_t m = 0;
    return pread(fd, &m, sizeof m, 0) == (ssize_t)sizeof m && (m == MW_SHARD_MAGIC || m == MW_SHARD32_MAGIC);
}

int mw_data_open(struct mw_data *d, const char *path, const struct mw_data_opts *o)
{
    memset(d, 0, sizeof *d);
    struct mw_data_opts defo;
    if (!o) { mw_data_opts_default(&defo); o = &defo; }
    if (!(o->val_frac > 0 && o->val_frac < 1))
        return mw_error_set(-EINVAL, "validation fraction %g must lie in (0, 1)", o->val_frac);
    snprintf(d->path, sizeof d->path, "%s", path);
    char **names = NULL; /* file names: relative to the directory, or the path itself */
    int nfiles = 0, err = 0, fd = -1, dfd = AT_FDCWD;
    DIR *dp = NULL;
    struct stat st;
    if ((err = open_data_file(AT_FDCWD, path, path, &fd, &st))) return err;
    if (S_ISDIR(st.st_mode)) {
        if (!(dp = fdopendir(fd))) {
            err = mw_error_set(-errno, "cannot open directory %s: %s", path, strerror(errno));
            close(fd);
            return err;
        }
        fd = -1; /* owned by dp */
        dfd = dirfd(dp);
        if ((err = list_dir(dp, path, &names, &nfiles))) { closedir(dp); return err; }
        if (nfiles == 0) {
            free(names);
            closedir(dp);
            return mw_error_set(-ENOENT, "data directory %s has no files", path);
        }
    } else {
        names = malloc(sizeof *names);
        if (!names || !(names[0] = strdup(path))) {
            free(names);
            close(fd);
            return mw_error_set(-ENOMEM, "no memory");
        }
        nfiles = 1;
    }
    d->seg = calloc((size_t)nfiles, sizeof *d->seg);
    if (!d->seg) { err = mw_error_set(-ENOMEM, "no memory"); goto err; }
    int any_val = 0, kind = -1; /* kind: 1 shards, 0 text; set by the first file, kept by all */
    for (int i = 0; i < nfiles; i++) any_val |= is_val_name(names[i]) && nfiles > 1;
    for (int i = 0; i < nfiles; i++) {
        char fpath[1024];
        if (dp) snprintf(fpath, sizeof fpath, "%s/%s", path, names[i]);
        else snprintf(fpath, sizeof fpath, "%s", path);
        /* The one open of this file (the single-file case opened it above already). */
        if (dp && (err = open_data_file(dfd, names[i], fpath, &fd, &st))) goto err;
        if (S_ISDIR(st.st_mode)) { err = refuse_kind(fpath, st.st_mode); goto err; } /* raced */
        int shard = looks_like_shard(fd, names[i]); /* the name, not fpath: never truncated */
        if (kind >= 0 && shard != kind) {
            err = mw_error_set(-EINVAL, "data directory %s mixes .bin shards and text files (%s is %s); use one kind",
                               path, fpath, shard ? "a shard" : "text");
            goto err;
        }
        kind = shard;
        struct mw_data_segment *s = &d->seg[i];
        err = shard ? open_shard(fd, fpath, &st, s) : open_text(fd, fpath, &st, s);
        close(fd);
        fd = -1;
        if (err) goto err;
        if (i > 0 && shard && (s->tok32 != NULL) != d->wide) {
            d->nseg = i + 1;
            err = mw_error_set(-EINVAL, "data directory %s mixes uint16 (version 1) and uint32 (version 7) shards "
                               "(%s is %s): they come from different tokenizers; use one kind", path, fpath,
                               s->tok32 ? "uint32" : "uint16");
            goto err;
        }
        d->wide = s->tok32 != NULL;
        d->nseg = i + 1;
        s->base = d->n_tokens;
        d->n_tokens += s->n;
        if (any_val) s->train_end = is_val_name(names[i]) ? 0 : s->n;
        else s->train_end = s->n - (size_t)llround((double)s->n * o->val_frac);
        d->n_train_tokens += s->train_end;
        d->n_val_tokens += s->n - s->train_end;
        /* Text is scanned whole; a shard only at its start, so that opening 10B tokens of
         * shards does not read 20 GB (the model rejects an out-of-range token anyway). */
        size_t scan = shard ? MW_MIN(s->n, (size_t)1 << 20) : s->n;
        if (s->tok32) {
            for (size_t k = 0; k < scan; k++)
                if (s->tok32[k] > (uint32_t)d->max_token) d->max_token = s->tok32[k] > INT32_MAX ? INT32_MAX : (int)s->tok32[k];
        } else
            for (size_t k = 0; k < scan; k++)
                if (s->tok[k] > d->max_token) d->max_token = s->tok[k];
    }
    d->tokenizer = kind == 1 ? MW_TOKENIZER_IDS : MW_TOKENIZER_BYTES;
    for (int i = 0; i < nfiles; i++) free(names[i]);
    free(names);
    if (dp) closedir(dp);
    return 0;
err:
    if (fd >= 0) close(fd);
    for (int i = 0; i < nfiles; i++) free(names[i]);
    free(names);
    if (dp) closedir(dp);
    mw_data_free(d);
    return err;
}

void mw_data_free(struct mw_data *d)
{
    for (int i = 0; i < d->nseg; i++) {
        if (d->seg[i].map) munmap(d->seg[i].map, d->seg[i].map_len);
        free(d->seg[i].owned);
    }
    free(d->seg);
    d->seg = NULL;
    d->nseg = 0;
}

static uint64_t seg_train_windows(const struct mw_data_segment *s, int T)
{
    return s->train_end > (size_t)T ? s->train_end - (size_t)T : 0;
}

static uint64_t seg_val_windows(const struct mw_data_segment *s, int T)
{
    return (s->n - s->train_end) / ((size_t)T + 1);
}

uint64_t mw_data_train_windows(const struct mw_data *d, int T)
{
    uint64_t n = 0;
    for (int i = 0; i < d->nseg; i++) n += seg_train_windows(&d->seg[i], T);
    return n;
}

uint64_t mw_data_val_windows(const struct mw_data *d, int T)
{
    uint64_t n = 0;
    for (int i = 0; i < d->nseg; i++) n += seg_val_windows(&d->seg[i], T);
    return n;
}

int mw_data_check(const struct mw_data *d, int T)
{
    if (T < 1) return mw_error_set(-EINVAL, "sequence length %d must be at least 1", T);
    if (mw_data_train_windows(d, T) == 0)
        return mw_error_set(-EINVAL, "data %s: its training part (%llu tokens) holds no window of %d tokens "
                            "(sequence length + 1); use more data or a shorter sequence length (seq)",
                            d->path, (unsigned long long)d->n_train_tokens, T + 1);
    if (mw_data_val_windows(d, T) == 0)
        return mw_error_set(-EINVAL, "data %s: its validation part (%llu tokens) holds no window of %d tokens "
                            "(sequence length + 1); use more data or a shorter sequence length (seq)",
                            d->path, (unsigned long long)d->n_val_tokens, T + 1);
    return 0;
}

/* Window [off, off + T] of segment s as inputs and targets. A uint32 token above INT32_MAX
 * becomes INT32_MAX, which every model refuses as outside its vocabulary (data.h). */
static void fill_row(const struct mw_data_segment *s, size_t off, int T, int32_t *in, int32_t *tg)
{
    if (s->tok32) {
        const uint32_t *w = s->tok32 + off;
        for (int t = 0; t < T; t++) {
            in[t] = w[t] > INT32_MAX ? INT32_MAX : (int32_t)w[t];
            tg[t] = w[t + 1] > INT32_MAX ? INT32_MAX : (int32_t)w[t + 1];
        }
        return;
    }
    const uint16_t *w = s->tok + off;
    for (int t = 0; t < T; t++) {
        in[t] = w[t];
        tg[t] = w[t + 1];
    }
}

void mw_data_train_batch(const struct mw_data *d, uint64_t *rng, int B, int T,
                         int32_t *inputs, int32_t *targets, uint64_t *starts)
{
    uint64_t total = mw_data_train_windows(d, T);
    MW_ASSERT(total > 0);
    for (int b = 0; b < B; b++) {
        uint64_t u = mw_rng_below(rng, total);
        int i = 0;
        while (u >= seg_train_windows(&d->seg[i], T)) u -= seg_train_windows(&d->seg[i++], T);
        fill_row(&d->seg[i], u, T, inputs + (size_t)b * T, targets + (size_t)b * T);
        if (starts) starts[b] = d->seg[i].base + u;
    }
}

void mw_data_val_batch(const struct mw_data *d, uint64_t k, int B, int T,
                       int32_t *inputs, int32_t *targets, uint64_t *starts)
{
    uint64_t total = mw_data_val_windows(d, T);
    MW_ASSERT(total > 0);
    for (int b = 0; b < B; b++) {
        uint64_t u = (k * (uint64_t)B + (uint64_t)b) % total;
        int i = 0;
        while (u >= seg_val_windows(&d->seg[i], T)) u -= seg_val_windows(&d->seg[i++], T);
        size_t off = d->seg[i].train_end + u * ((size_t)T + 1);
        fill_row(&d->seg[i], off, T, inputs + (size_t)b * T, targets + (size_t)b * T);
        if (starts) starts[b] = d->seg[i].base + off;
    }
}
