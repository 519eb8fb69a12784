/*
 * dataset.c — opening text files and llm.c shards as token segments; training and
 * validation windows over them (see data.h for the contract).
 * Why mmap for shards: a GPT-2 shard of 100M tokens is 200 MB that the loader touches only
 * where a batch lands; the page cache keeps what is hot and nothing is copied. Text is small
 * (a corpus of a few MiB) and must be widened to uint16 for the EOT token, so it is read.
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

/* Maps and validates one shard into seg. */
static int open_shard(const char *path, struct mw_data_segment *seg)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mw_error_set(-errno, "cannot open shard %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mw_error_set(-e, "cannot stat %s: %s", path, strerror(e));
    }
    size_t len = (size_t)st.st_size;
    if (len < MW_SHARD_HEADER_BYTES) {
        close(fd);
        return mw_error_set(MW_EFORMAT, "shard %s is truncated: %zu bytes, shorter than its %d-byte header",
                            path, len, MW_SHARD_HEADER_BYTES);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return mw_error_set(-e, "cannot mmap %s: %s", path, strerror(e));
    int32_t hdr[3];
    memcpy(hdr, map, sizeof hdr);
    int err = 0;
    /* The header's token count is hostile: the bytes it implies are computed with overflow checks. */
    uint64_t want = 0;
    int wrap = hdr[2] >= 0 && (mw_mul_u64((uint64_t)hdr[2], 2, &want) ||
                               mw_add_u64(want, (uint64_t)MW_SHARD_HEADER_BYTES, &want));
    if (hdr[0] != MW_SHARD_MAGIC)
        err = mw_error_set(MW_EFORMAT, "%s is not a token shard: magic %d, expected %d (llm.c .bin format)",
                           path, hdr[0], MW_SHARD_MAGIC);
    else if (hdr[1] != MW_SHARD_VERSION)
        err = mw_error_set(MW_EFORMAT, "shard %s has version %d; only version %d (uint16 tokens) is supported",
                           path, hdr[1], MW_SHARD_VERSION);
    else if (hdr[2] < 0 || wrap || want != (uint64_t)len)
        err = mw_error_set(MW_EFORMAT, "shard %s: header says %d tokens (%llu bytes in all) but the file has %zu bytes%s",
                           path, hdr[2], (unsigned long long)want, len,
                           hdr[2] >= 0 && want > (uint64_t)len ? ": truncated" : "");
    if (err) { munmap(map, len); return err; }
    seg->map = map;
    seg->map_len = len;
    seg->tok = (const uint16_t *)((const char *)map + MW_SHARD_HEADER_BYTES);
    seg->n = (size_t)hdr[2];
    madvise(map, len, MADV_RANDOM);
    return 0;
}

/* Reads a text file as EOT + its bytes. */
static int open_text(const char *path, struct mw_data_segment *seg)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mw_error_set(-errno, "cannot open %s: %s", path, strerror(errno));
    int err = 0;
    uint8_t *buf = NULL;
    uint16_t *tok = NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { err = mw_error_set(-errno, "cannot stat %s", path); goto err; }
    size_t n = (size_t)st.st_size;
    buf = malloc(n ? n : 1);
    tok = malloc((n + 1) * sizeof *tok);
    if (!buf || !tok) { err = mw_error_set(-ENOMEM, "no memory for the %zu bytes of %s", n, path); goto err; }
    if (n && fread(buf, 1, n, f) != n) { err = mw_error_set(-EIO, "short read of %s", path); goto err; }
    tok[0] = MW_TOK_EOT;
    mw_tok_encode_bytes(buf, n, tok + 1);
    seg->owned = tok;
    seg->tok = tok;
    seg->n = n + 1;
    free(buf);
    fclose(f);
    return 0;
err:
    free(buf);
    free(tok);
    fclose(f);
    return err;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists the regular, non-hidden files of dir, sorted; *out is an array of malloc'd paths. */
static int list_dir(const char *dir, char ***out, int *count)
{
    DIR *dp = opendir(dir);
    if (!dp) return mw_error_set(-errno, "cannot open directory %s: %s", dir, strerror(errno));
    char **v = NULL;
    int n = 0, cap = 0, err = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (de->d_name[0] == '.') continue;
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        char *p = malloc(len);
        if (!p) { err = -ENOMEM; break; }
        snprintf(p, len, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) { free(p); continue; }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) { free(p); err = -ENOMEM; break; }
            v = nv;
        }
        v[n++] = p;
    }
    closedir(dp);
    if (err) {
        for (int i = 0; i < n; i++) free(v[i]);
        free(v);
        return mw_error_set(err, "no memory listing %s", dir);
    }
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    *count = n;
    return 0;
}

/* A file is a shard if it is named *.bin or starts with the shard magic. */
static int looks_like_shard(const char *path)
{
    if (ends_with(path, ".bin")) return 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t m = 0;
    int r = fread(&m, sizeof m, 1, f) == 1 && m == MW_SHARD_MAGIC;
    fclose(f);
    return r;
}

int mw_data_open(struct mw_data *d, const char *path, const struct mw_data_opts *o)
{
    memset(d, 0, sizeof *d);
    struct mw_data_opts defo;
    if (!o) { mw_data_opts_default(&defo); o = &defo; }
    if (!(o->val_frac > 0 && o->val_frac < 1))
        return mw_error_set(-EINVAL, "validation fraction %g must lie in (0, 1)", o->val_frac);
    snprintf(d->path, sizeof d->path, "%s", path);
    char **files = NULL;
    int nfiles = 0, err = 0;
    struct stat st;
    if (stat(path, &st) != 0) return mw_error_set(-errno, "cannot open data %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if ((err = list_dir(path, &files, &nfiles))) return err;
        if (nfiles == 0) { free(files); return mw_error_set(-ENOENT, "data directory %s has no files", path); }
    } else {
        files = malloc(sizeof *files);
        if (!files || !(files[0] = strdup(path))) { free(files); return mw_error_set(-ENOMEM, "no memory"); }
        nfiles = 1;
    }
    d->seg = calloc((size_t)nfiles, sizeof *d->seg);
    if (!d->seg) { err = mw_error_set(-ENOMEM, "no memory"); goto err; }
    int nshard = 0, any_val = 0;
    for (int i = 0; i < nfiles; i++) {
        nshard += looks_like_shard(files[i]);
        any_val |= is_val_name(files[i]) && nfiles > 1;
    }
    if (nshard && nshard != nfiles) {
        err = mw_error_set(-EINVAL, "data directory %s mixes .bin shards and text files; use one kind", path);
        goto err;
    }
    d->tokenizer = nshard ? MW_TOKENIZER_IDS : MW_TOKENIZER_BYTES;
    for (int i = 0; i < nfiles; i++) {
        struct mw_data_segment *s = &d->seg[i];
        err = nshard ? open_shard(files[i], s) : open_text(files[i], s);
        if (err) goto err;
        d->nseg = i + 1;
        s->base = d->n_tokens;
        d->n_tokens += s->n;
        if (any_val) s->train_end = is_val_name(files[i]) ? 0 : s->n;
        else s->train_end = s->n - (size_t)llround((double)s->n * o->val_frac);
        d->n_train_tokens += s->train_end;
        d->n_val_tokens += s->n - s->train_end;
        /* Text is scanned whole; a shard only at its start, so that opening 10B tokens of
         * shards does not read 20 GB (the model rejects an out-of-range token anyway). */
        size_t scan = nshard ? MW_MIN(s->n, (size_t)1 << 20) : s->n;
        for (size_t k = 0; k < scan; k++)
            if (s->tok[k] > d->max_token) d->max_token = s->tok[k];
    }
    for (int i = 0; i < nfiles; i++) free(files[i]);
    free(files);
    return 0;
err:
    for (int i = 0; i < nfiles; i++) free(files[i]);
    free(files);
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
                            "(sequence length + 1); use more data or a shorter --seq",
                            d->path, (unsigned long long)d->n_train_tokens, T + 1);
    if (mw_data_val_windows(d, T) == 0)
        return mw_error_set(-EINVAL, "data %s: its validation part (%llu tokens) holds no window of %d tokens "
                            "(sequence length + 1); use more data or a shorter --seq",
                            d->path, (unsigned long long)d->n_val_tokens, T + 1);
    return 0;
}

static void fill_row(const uint16_t *w, int T, int32_t *in, int32_t *tg)
{
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
        fill_row(d->seg[i].tok + u, T, inputs + (size_t)b * T, targets + (size_t)b * T);
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
        fill_row(d->seg[i].tok + off, T, inputs + (size_t)b * T, targets + (size_t)b * T);
        if (starts) starts[b] = d->seg[i].base + off;
    }
}
