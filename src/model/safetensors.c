/*
 * safetensors.c — minimal safetensors reader/writer with the header parsed by cJSON.
 *
 * Why validate everything up front: model files come from users and the network, and a file
 * cut short by a failed download must produce "truncated: tensor X needs bytes A..B, file has
 * C", not a segfault or silently wrong weights. The reader never maps the file; it preads
 * exactly the bytes of one tensor after checking they lie inside the data section.
 */
#include "safetensors.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER (256u << 20) /* a sane bound: GPT-2 XL's header is ~ 50 KiB */

static int read_full(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0) { if (errno == EINTR) continue; return -errno; }
        if (r == 0) return MW_EFORMAT;
        p += r; n -= (size_t)r; off += (uint64_t)r;
    }
    return 0;
}

static int dtype_of(const char *s, int *size)
{
    if (!strcmp(s, "F32")) { *size = 4; return MW_ST_F32; }
    if (!strcmp(s, "F16")) { *size = 2; return MW_ST_F16; }
    if (!strcmp(s, "BF16")) { *size = 2; return MW_ST_BF16; }
    static const struct { const char *n; int sz; } other[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2},
        {"I8", 1}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (!strcmp(s, other[i].n)) { *size = other[i].sz; return -1; }
    *size = 0;
    return -2;
}

void mw_st_close(struct mw_st_file *f)
{
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
    for (int i = 0; i < f->n_meta; i++) { free(f->meta_key[i]); free(f->meta_val[i]); }
    free(f->e);
    free(f->meta_key);
    free(f->meta_val);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

static int parse_entry(struct mw_st_file *f, struct mw_st_entry *e, const cJSON *item, uint64_t data_size)
{
    const char *nm = item->string;
    if (!*nm || strlen(nm) > 1024)
        return mw_error_set(MW_EFORMAT, "%s: a tensor name is empty or longer than 1024 bytes", f->path);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsObject(item) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
        cJSON_GetArraySize(of) != 2)
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" lacks dtype/shape/data_offsets", f->path, nm);
    int esz;
    e->dtype = dtype_of(dt->valuestring, &esz);
    if (e->dtype == -2)
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has unknown dtype \"%s\"", f->path, nm, dt->valuestring);
    e->ndim = cJSON_GetArraySize(sh);
    if (e->ndim > 4)
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has %d dimensions (at most 4 supported)",
                            f->path, nm, e->ndim);
    e->numel = 1;
    for (int d = 0; d < e->ndim; d++) {
        const cJSON *v = cJSON_GetArrayItem(sh, d);
        uint64_t dim;
        if (!cJSON_IsNumber(v) || mw_f64_to_u64(v->valuedouble, UINT64_MAX, 1, &dim))
            return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\": shape[%d] is not a non-negative integer", f->path,
                                nm, d);
        e->shape[d] = dim;
        if (mw_mul_u64(e->numel, dim, &e->numel))
            return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\": the product of its shape overflows 64 bits",
                                f->path, nm);
    }
    uint64_t nbytes;
    if (mw_mul_u64(e->numel, (uint64_t)esz, &nbytes))
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\": %llu elements x %d bytes overflows 64 bits", f->path,
                            nm, (unsigned long long)e->numel, esz);
    const cJSON *b = cJSON_GetArrayItem(of, 0), *en = cJSON_GetArrayItem(of, 1);
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(en) || mw_f64_to_u64(b->valuedouble, UINT64_MAX, 1, &e->begin) ||
        mw_f64_to_u64(en->valuedouble, UINT64_MAX, 1, &e->end) || e->end < e->begin)
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has bad data_offsets (two integers, begin <= end)",
                            f->path, nm);
    if (e->end - e->begin != nbytes)
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\": data_offsets span %llu bytes but shape x dtype "
                            "needs %llu", f->path, nm, (unsigned long long)(e->end - e->begin),
                            (unsigned long long)nbytes);
    if (e->end > data_size)
        return mw_error_set(MW_EFORMAT, "%s: truncated: tensor \"%s\" needs data bytes %llu..%llu but the "
                            "file holds only %llu data bytes", f->path, nm, (unsigned long long)e->begin,
                            (unsigned long long)e->end, (unsigned long long)data_size);
    e->name = strdup(nm);
    return e->name ? 0 : mw_error_set(-ENOMEM, "%s: no memory for a tensor name", f->path);
}

static int cmp_begin(const void *a, const void *b)
{
    const struct mw_st_entry *x = *(const struct mw_st_entry *const *)a, *y = *(const struct mw_st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const struct mw_st_entry *const *)a)->name, (*(const struct mw_st_entry *const *)b)->name);
}

/* Two tensors with one name (cJSON keeps duplicate keys), or whose bytes overlap, make a file
 * whose meaning depends on the reader: refused. Empty tensors occupy no bytes and overlap nothing. */
static int check_unique(struct mw_st_file *f)
{
    if (f->n < 2) return 0;
    const struct mw_st_entry **v = malloc((size_t)f->n * sizeof *v);
    if (!v) return mw_error_set(-ENOMEM, "%s: no memory to check %d tensors", f->path, f->n);
    for (int i = 0; i < f->n; i++) v[i] = &f->e[i];
    int rc = 0;
    qsort(v, (size_t)f->n, sizeof *v, cmp_name);
    for (int i = 1; i < f->n && !rc; i++)
        if (!strcmp(v[i - 1]->name, v[i]->name))
            rc = mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" appears twice in the header", f->path, v[i]->name);
    qsort(v, (size_t)f->n, sizeof *v, cmp_begin);
    const struct mw_st_entry *prev = NULL;
    for (int i = 0; i < f->n && !rc; i++) {
        if (v[i]->begin == v[i]->end) continue;
        if (prev && v[i]->begin < prev->end)
            rc = mw_error_set(MW_EFORMAT, "%s: tensors \"%s\" (bytes %llu..%llu) and \"%s\" (bytes %llu..%llu) "
                              "overlap", f->path, prev->name, (unsigned long long)prev->begin,
                              (unsigned long long)prev->end, v[i]->name, (unsigned long long)v[i]->begin,
                              (unsigned long long)v[i]->end);
        prev = v[i];
    }
    free(v);
    return rc;
}

int mw_st_open(struct mw_st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    snprintf(f->path, sizeof f->path, "%s", path);
    char *hdr = NULL;
    cJSON *root = NULL;
    int rc;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) { rc = -errno; mw_error_set(rc, "cannot open %s: %s", path, mw_strerror(rc)); goto err; }
    struct stat st;
    if (fstat(f->fd, &st)) { rc = -errno; mw_error_set(rc, "cannot stat %s", path); goto err; }
    f->file_size = (uint64_t)st.st_size;
    uint8_t lenb[8];
    if (f->file_size < 8 || read_full(f->fd, lenb, 8, 0)) {
        rc = mw_error_set(MW_EFORMAT, "%s: truncated: %llu bytes, not even the 8-byte header length",
                          path, (unsigned long long)f->file_size);
        goto err;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
    if (hlen < 2 || hlen > MAX_HEADER || hlen > f->file_size - 8) {
        rc = mw_error_set(MW_EFORMAT, "%s: header length %llu is impossible for a %llu-byte file (truncated "
                          "or not safetensors)", path, (unsigned long long)hlen, (unsigned long long)f->file_size);
        goto err;
    }
    hdr = malloc(hlen + 1);
    if (!hdr) { rc = mw_error_set(-ENOMEM, "%s: no memory for the header", path); goto err; }
    if ((rc = read_full(f->fd, hdr, hlen, 8))) { mw_error_set(rc, "%s: cannot read the header", path); goto err; }
    hdr[hlen] = 0;
    f->data_start = 8 + hlen;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    /* cJSON stops after the first complete value: only padding spaces may follow it. */
    for (const char *q = end; root && q && q < hdr + hlen; q++)
        if (*q != ' ' && *q != '\n' && *q != '\t' && *q != '\r') { cJSON_Delete(root); root = NULL; }
    if (!root || !cJSON_IsObject(root)) {
        rc = mw_error_set(MW_EFORMAT, "%s: the JSON header does not parse (corrupt or truncated file)", path);
        goto err;
    }
    int cnt = cJSON_GetArraySize(root);
    f->e = calloc((size_t)cnt + 1, sizeof *f->e);
    if (!f->e) { rc = mw_error_set(-ENOMEM, "%s: no memory for %d header entries", path, cnt); goto err; }
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (!item->string) continue;
        if (!strcmp(item->string, "__metadata__")) {
            if (!cJSON_IsObject(item) || f->meta_key) {
                rc = mw_error_set(MW_EFORMAT, "%s: __metadata__ is not an object or appears twice", path);
                goto err;
            }
            int nm = cJSON_GetArraySize(item);
            f->meta_key = calloc((size_t)nm + 1, sizeof(char *));
            f->meta_val = calloc((size_t)nm + 1, sizeof(char *));
            if (!f->meta_key || !f->meta_val) { rc = mw_error_set(-ENOMEM, "%s: no memory for metadata", path); goto err; }
            const cJSON *kv;
            cJSON_ArrayForEach(kv, item) {
                if (!cJSON_IsString(kv) || !kv->string) continue;
                f->meta_key[f->n_meta] = strdup(kv->string);
                f->meta_val[f->n_meta] = strdup(kv->valuestring);
                f->n_meta++;
                if (!f->meta_key[f->n_meta - 1] || !f->meta_val[f->n_meta - 1]) {
                    rc = mw_error_set(-ENOMEM, "%s: no memory for metadata", path);
                    goto err;
                }
            }
            continue;
        }
        if ((rc = parse_entry(f, &f->e[f->n], item, f->file_size - f->data_start))) goto err;
        f->n++;
    }
    if ((rc = check_unique(f))) goto err;
    cJSON_Delete(root);
    free(hdr);
    return 0;
err:
    cJSON_Delete(root);
    free(hdr);
    mw_st_close(f);
    return rc;
}

const struct mw_st_entry *mw_st_find(const struct mw_st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name)) return &f->e[i];
    return NULL;
}

const char *mw_st_meta(const struct mw_st_file *f, const char *key)
{
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_key[i], key)) return f->meta_val[i];
    return NULL;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 31, m = h & 1023u, bits;
    if (ex == 0) {
        if (!m) bits = s;
        else { /* subnormal: normalise */
            int e = -1;
            do { m <<= 1; e++; } while (!(m & 1024u));
            bits = s | ((uint32_t)(127 - 15 - e) << 23) | ((m & 1023u) << 13);
        }
    } else if (ex == 31) bits = s | 0x7F800000u | (m << 13);
    else bits = s | ((ex + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int mw_st_read_f32(const struct mw_st_file *f, const struct mw_st_entry *e, uint64_t first,
                   uint64_t n_elems, float *dst)
{
    if (e->dtype < 0)
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has a dtype memwall cannot convert to fp32",
                            f->path, e->name);
    if (first > e->numel || n_elems > e->numel - first)
        return mw_error_set(-EINVAL, "%s: read past tensor \"%s\"", f->path, e->name);
    int esz = e->dtype == MW_ST_F32 ? 4 : 2;
    /* begin + numel * esz <= data size was checked at open: these cannot wrap. */
    uint64_t off = f->data_start + e->begin + first * (uint64_t)esz;
    if (n_elems > SIZE_MAX / 4)
        return mw_error_set(-EINVAL, "%s: tensor \"%s\": %llu elements do not fit in memory", f->path, e->name,
                            (unsigned long long)n_elems);
    if (esz == 4) {
        int rc = read_full(f->fd, dst, (size_t)n_elems * 4, off);
        if (rc) return mw_error_set(rc == MW_EFORMAT ? MW_EFORMAT : rc, "%s: short read in tensor \"%s\" "
                                    "(file truncated while reading?)", f->path, e->name);
        return 0;
    }
    /* 16-bit: convert through a bounded bounce buffer. */
    enum { CH = 1 << 16 };
    uint16_t *tmp = malloc(CH * sizeof(uint16_t));
    if (!tmp) return mw_error_set(-ENOMEM, "%s: no memory to convert tensor \"%s\"", f->path, e->name);
    for (uint64_t i = 0; i < n_elems; i += CH) {
        size_t k = (size_t)MW_MIN((uint64_t)CH, n_elems - i);
        int rc = read_full(f->fd, tmp, k * 2, off + i * 2);
        if (rc) { free(tmp); return mw_error_set(rc, "%s: short read in tensor \"%s\"", f->path, e->name); }
        for (size_t j = 0; j < k; j++) {
            if (e->dtype == MW_ST_F16) dst[i + j] = f16_to_f32(tmp[j]);
            else { uint32_t b = (uint32_t)tmp[j] << 16; memcpy(&dst[i + j], &b, 4); }
        }
    }
    free(tmp);
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) { if (errno == EINTR) continue; return -errno; }
        p += w; n -= (size_t)w;
    }
    return 0;
}

int mw_st_write_f32(const char *path, const struct mw_st_out *t, int n, const char *const *meta_kv, int n_meta)
{
    return mw_st_write_f32_cb(path, t, n, meta_kv, n_meta, NULL, NULL);
}

int mw_st_write_f32_cb(const char *path, const struct mw_st_out *t, int n, const char *const *meta_kv, int n_meta,
                       mw_st_data_fn data_fn, void *user)
{
    char *js = NULL;
    int fd = -1, rc = 0;
    struct mw_atomic_file af = {NULL, -1, NULL, NULL};
    cJSON *root = cJSON_CreateObject();
    if (!root) return mw_error_set(-ENOMEM, "save %s: no memory for the header", path);
    if (n_meta) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; md && i < n_meta; i++) cJSON_AddStringToObject(md, meta_kv[2 * i], meta_kv[2 * i + 1]);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_AddObjectToObject(root, t[i].name);
        if (!o) { rc = mw_error_set(-ENOMEM, "save %s: no memory for the header", path); goto out; }
        cJSON_AddStringToObject(o, "dtype", "F32");
        cJSON *sh = cJSON_AddArrayToObject(o, "shape"), *of = cJSON_AddArrayToObject(o, "data_offsets");
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
            numel *= t[i].shape[d];
        }
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        off += numel * 4;
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
    }
    js = cJSON_PrintUnformatted(root);
    if (!js) { rc = mw_error_set(-ENOMEM, "save %s: no memory for the header", path); goto out; }
    size_t jl = strlen(js), padded = MW_ALIGN_UP(jl, 8);
    if ((rc = mw_atomic_open(&af, path))) goto out;
    fd = af.fd;
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "       ";
    if ((rc = write_full(fd, lenb, 8)) || (rc = write_full(fd, js, jl)) ||
        (rc = write_full(fd, spaces, padded - jl)))
        goto werr;
    for (int i = 0; i < n; i++) {
        size_t numel = t[i].ndim == 2 ? t[i].shape[0] * t[i].shape[1] : t[i].shape[0];
        if (data_fn && (rc = data_fn(user, i))) goto out; /* its message stands */
        if ((rc = write_full(fd, t[i].data, numel * 4))) goto werr;
    }
    if (data_fn && (rc = data_fn(user, n))) goto out;
    rc = mw_atomic_commit(&af); /* fsync, rename over path, fsync of the directory */
    goto out;
werr:
    mw_error_set(rc, "cannot write %s: %s", af.tmp, mw_strerror(rc));
out:
    mw_atomic_abort(&af); /* no-op after commit */
    free(js);
    cJSON_Delete(root);
    return rc;
}
