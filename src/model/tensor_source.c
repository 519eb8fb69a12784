/*
 * tensor_source.c — one safetensors file, or a sharded checkpoint's index and its shards, behind
 * one lookup by tensor name (tensor_source.h).
 *
 * Why one seam: GPT-2's and the Llama family's loaders (whole, and a unit at a time for streamed
 * weights), the trainer's streamed start and the CLI all reach weights through a path. Making
 * that path mean "a file, or an index and its shards" here keeps sharding out of every family
 * and every caller: a loader asks for a tensor by name and reads it from whichever file holds it.
 *
 * Why the index is checked against its shards before any weight is read: the index is untrusted
 * JSON, and it decides which files are opened.
 *   - A shard is a file name inside the index's directory (no '/', no ".."): an index cannot
 *     make memwall read a file outside the model's directory. Symbolic links are followed (the
 *     Hugging Face cache links every file of a snapshot into blobs/); FIFOs and devices refused.
 *   - Every tensor the index names must be in the shard it names, every tensor of an opened
 *     shard must be named for that shard, and no name may appear twice (in the index, or in two
 *     shards): otherwise the weights would depend on which file a reader happens to trust.
 *   - Shards the index never names are not opened (as transformers does).
 *   - The index's size, the tensor and shard counts and every path length are bounded before
 *     anything is allocated from them; each shard is validated by mw_st_open (safetensors.c).
 * A directory with both model.safetensors and an index: the single file is read, as
 * transformers' from_pretrained does (the index is then not even parsed).
 *
 * Every shard stays open (one descriptor each, at most MW_TS_MAX_SHARDS) for the source's life:
 * a streamed load reads units in any order, and the headers validated at open stay the ones read.
 */
#include "tensor_source.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- the index, from memory */

void mw_ts_index_free(struct mw_ts_index *ix)
{
    for (int i = 0; ix->shard && i < ix->n_shards; i++) free(ix->shard[i]);
    for (int i = 0; ix->name && i < ix->n; i++) free(ix->name[i]);
    free(ix->shard);
    free(ix->name);
    free(ix->shard_of);
    memset(ix, 0, sizeof *ix);
}

/* Why a shard file name is refused, or NULL. */
static const char *bad_shard_name(const char *s)
{
    size_t l = strlen(s);
    if (!l) return "is empty";
    if (l > MW_TS_MAX_SHARD_NAME) return "is longer than 255 bytes";
    if (strchr(s, '/')) return "has a '/' (a shard is a file beside the index, never a path)";
    if (strstr(s, "..")) return "has \"..\" (a shard is a file beside the index, never a path)";
    if (!strcmp(s, ".")) return "is \".\" (a shard is a file beside the index)";
    return NULL;
}

struct ref { const char *key; int i; };

static int cmp_ref(const void *a, const void *b)
{
    const struct ref *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

int mw_ts_index_parse(const char *text, size_t len, const char *path, struct mw_ts_index *ix)
{
    memset(ix, 0, sizeof *ix);
    struct ref *r = NULL;
    int rc = 0;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        rc = mw_error_set(MW_EFORMAT, "%s: not a JSON object (a sharded checkpoint's index: {\"metadata\": {...}, "
                          "\"weight_map\": {tensor name: shard file}})", path);
        goto out;
    }
    const cJSON *wm = NULL, *it;
    int n_wm = 0;
    cJSON_ArrayForEach(it, root) {
        if (!it->string) continue;
        if (!strcmp(it->string, "weight_map")) {
            if (!wm) wm = it;
            n_wm++;
        } else if (!strcmp(it->string, "metadata") && !cJSON_IsObject(it) && !cJSON_IsNull(it)) {
            rc = mw_error_set(MW_EFORMAT, "%s: \"metadata\" is not an object", path);
            goto out;
        }
    }
    if (!wm) {
        rc = mw_error_set(MW_EFORMAT, "%s: no \"weight_map\" (the index maps each tensor name to the shard file that "
                          "holds it)", path);
        goto out;
    }
    if (n_wm > 1) { rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" appears %d times", path, n_wm); goto out; }
    if (!cJSON_IsObject(wm)) {
        rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" is not an object ({tensor name: shard file name})", path);
        goto out;
    }
    int cnt = 0;
    cJSON_ArrayForEach(it, wm) if (++cnt > MW_TS_MAX_TENSORS) break;
    if (cnt == 0) { rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" is empty: no tensor to load", path); goto out; }
    if (cnt > MW_TS_MAX_TENSORS) {
        rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" lists more than %d tensors (more than memwall reads)", path,
                          MW_TS_MAX_TENSORS);
        goto out;
    }
    ix->name = calloc((size_t)cnt, sizeof *ix->name);
    ix->shard_of = calloc((size_t)cnt, sizeof *ix->shard_of);
    r = calloc((size_t)cnt, sizeof *r);
    if (!ix->name || !ix->shard_of || !r) {
        rc = mw_error_set(-ENOMEM, "%s: no memory for %d index entries", path, cnt);
        goto out;
    }
    ix->n = cnt;
    int i = 0;
    cJSON_ArrayForEach(it, wm) {
        const char *nm = it->string;
        if (!nm || !*nm || strlen(nm) > 1024) {
            rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\": entry %d's tensor name is empty or longer than 1024 "
                              "bytes", path, i);
            goto out;
        }
        if (!cJSON_IsString(it) || !it->valuestring) {
            rc = mw_error_set(MW_EFORMAT, "%s: weight_map[\"%s\"] is not a string (the name of the shard file that "
                              "holds the tensor)", path, nm);
            goto out;
        }
        const char *why = bad_shard_name(it->valuestring);
        if (why) {
            rc = mw_error_set(MW_EFORMAT, "%s: weight_map[\"%s\"]: shard file \"%.300s\" %s", path, nm,
                              it->valuestring, why);
            goto out;
        }
        if (!(ix->name[i] = strdup(nm))) { rc = mw_error_set(-ENOMEM, "%s: no memory for a tensor name", path); goto out; }
        r[i] = (struct ref){it->valuestring, i}; /* points into the JSON tree: used before it goes */
        i++;
    }
    /* The shards: sorted by name (transformers' model-0000k-of-0000n sort in their order). */
    qsort(r, (size_t)cnt, sizeof *r, cmp_ref);
    int k = 0;
    for (int j = 0; j < cnt; j++) k += !j || strcmp(r[j].key, r[j - 1].key);
    if (k > MW_TS_MAX_SHARDS) {
        rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" names %d shard files, more than memwall opens at once (%d)",
                          path, k, MW_TS_MAX_SHARDS);
        goto out;
    }
    if (!(ix->shard = calloc((size_t)k, sizeof *ix->shard))) {
        rc = mw_error_set(-ENOMEM, "%s: no memory for %d shard names", path, k);
        goto out;
    }
    for (int j = 0; j < cnt; j++) {
        if (!j || strcmp(r[j].key, r[j - 1].key)) {
            if (!(ix->shard[ix->n_shards] = strdup(r[j].key))) {
                rc = mw_error_set(-ENOMEM, "%s: no memory for a shard name", path);
                goto out;
            }
            ix->n_shards++;
        }
        ix->shard_of[r[j].i] = ix->n_shards - 1;
    }
    /* A tensor twice (cJSON keeps duplicate keys): which shard holds it would be the reader's guess. */
    for (int j = 0; j < cnt; j++) r[j] = (struct ref){ix->name[j], j};
    qsort(r, (size_t)cnt, sizeof *r, cmp_ref);
    for (int j = 1; j < cnt; j++)
        if (!strcmp(r[j].key, r[j - 1].key)) {
            rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" lists tensor \"%s\" twice (shards %s and %s)", path,
                              r[j].key, ix->shard[ix->shard_of[r[j - 1].i]], ix->shard[ix->shard_of[r[j].i]]);
            goto out;
        }
out:
    free(r);
    cJSON_Delete(root);
    if (rc) mw_ts_index_free(ix);
    return rc;
}

/* ---------------------------------------------------------------- the source */

void mw_ts_close(struct mw_ts *s)
{
    for (int k = 0; s->files && k < s->n_files; k++) mw_st_close(&s->files[k]);
    free(s->files);
    free(s->e);
    free(s->by_name);
    memset(s, 0, sizeof *s);
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp((*(const struct mw_ts_entry *const *)a)->st->name, (*(const struct mw_ts_entry *const *)b)->st->name);
}

static int cmp_key_entry(const void *key, const void *b)
{
    return strcmp(key, (*(const struct mw_ts_entry *const *)b)->st->name);
}

const struct mw_ts_entry *mw_ts_find(const struct mw_ts *s, const char *name)
{
    if (!s->n) return NULL;
    const struct mw_ts_entry *const *p = bsearch(name, s->by_name, (size_t)s->n, sizeof *s->by_name, cmp_key_entry);
    return p ? *p : NULL;
}

const char *mw_ts_meta(const struct mw_ts *s, const char *key)
{
    for (int k = 0; k < s->n_files; k++) {
        const char *v = mw_st_meta(&s->files[k], key);
        if (v) return v;
    }
    return NULL;
}

int mw_ts_read_f32(const struct mw_ts_entry *e, uint64_t first, uint64_t n, float *dst)
{
    return mw_st_read_f32(e->file, e->st, first, n, dst);
}

/* Every tensor of every file, and the by-name view. */
static int list_entries(struct mw_ts *s)
{
    int64_t tot = 0;
    for (int k = 0; k < s->n_files; k++) tot += s->files[k].n;
    if (tot > MW_TS_MAX_TENSORS)
        return mw_error_set(MW_EFORMAT, "%s: %lld tensors, more than memwall reads (%d)", s->path, (long long)tot,
                            MW_TS_MAX_TENSORS);
    s->e = calloc((size_t)tot + 1, sizeof *s->e);
    s->by_name = calloc((size_t)tot + 1, sizeof *s->by_name);
    if (!s->e || !s->by_name) return mw_error_set(-ENOMEM, "%s: no memory for %lld tensors", s->path, (long long)tot);
    for (int k = 0; k < s->n_files; k++)
        for (int i = 0; i < s->files[k].n; i++) {
            s->e[s->n] = (struct mw_ts_entry){&s->files[k].e[i], &s->files[k]};
            s->by_name[s->n] = &s->e[s->n];
            s->n++;
        }
    qsort(s->by_name, (size_t)s->n, sizeof *s->by_name, cmp_entry_name);
    return 0;
}

/* The directory part of file ("." when none), as the GPT-2 loader always looked for config.json. */
static int set_dir(struct mw_ts *s, const char *file)
{
    const char *sl = strrchr(file, '/');
    int w = sl ? snprintf(s->dir, sizeof s->dir, "%.*s", (int)(sl - file), file) : snprintf(s->dir, sizeof s->dir, ".");
    return w < 0 || (size_t)w >= sizeof s->dir ? mw_error_set(-ENAMETOOLONG, "%s: path too long", file) : 0;
}

/* A FIFO would block the open and a device is not a model: only regular files (or links to them). */
static int check_regular(const char *path, const char *what, const char *index, const char *tensor)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        if (!index) return 0; /* a single file: mw_st_open says why it cannot be opened */
        return mw_error_set(-e, "%s: shard %s (weight_map puts \"%s\" there): %s: %s", index, what, tensor, path,
                            strerror(e));
    }
    if (S_ISREG(st.st_mode)) return 0;
    if (index)
        return mw_error_set(MW_EFORMAT, "%s: shard %s (weight_map puts \"%s\" there) is not a regular file", index, what,
                            tensor);
    return mw_error_set(MW_EFORMAT, "%s is not a regular file (a safetensors file is)", path);
}

static int open_single(struct mw_ts *s, const char *file)
{
    int rc;
    if ((size_t)snprintf(s->path, sizeof s->path, "%s", file) >= sizeof s->path)
        return mw_error_set(-ENAMETOOLONG, "%s: path too long", file);
    if ((rc = set_dir(s, file)) || (rc = check_regular(file, NULL, NULL, NULL))) return rc;
    if (!(s->files = calloc(1, sizeof *s->files))) return mw_error_set(-ENOMEM, "%s: no memory", file);
    if ((rc = mw_st_open(&s->files[0], file))) return rc;
    s->n_files = 1;
    return list_entries(s);
}

/* The shard's name (for messages) of an entry. */
static const char *shard_of_entry(const struct mw_ts *s, const struct mw_ts_index *ix, const struct mw_ts_entry *e)
{
    return ix->shard[e->file - s->files];
}

/* The index's entries against what the opened shards hold (the file comment says why). */
static int cross_check(struct mw_ts *s, const struct mw_ts_index *ix)
{
    for (int j = 1; j < s->n; j++)
        if (!strcmp(s->by_name[j]->st->name, s->by_name[j - 1]->st->name))
            return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" is in two shards, %s and %s", s->path,
                                s->by_name[j]->st->name, shard_of_entry(s, ix, s->by_name[j - 1]),
                                shard_of_entry(s, ix, s->by_name[j]));
    struct ref *r = malloc((size_t)ix->n * sizeof *r);
    if (!r) return mw_error_set(-ENOMEM, "%s: no memory", s->path);
    for (int i = 0; i < ix->n; i++) r[i] = (struct ref){ix->name[i], i};
    qsort(r, (size_t)ix->n, sizeof *r, cmp_ref); /* names are unique: mw_ts_index_parse */
    int rc = 0;
    for (int j = 0; j < s->n && !rc; j++) {
        const struct mw_ts_entry *e = s->by_name[j];
        size_t lo = 0, hi = (size_t)ix->n; /* the first index name >= the tensor's */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(r[mid].key, e->st->name) < 0) lo = mid + 1;
            else hi = mid;
        }
        const struct ref *hit = lo < (size_t)ix->n && !strcmp(r[lo].key, e->st->name) ? &r[lo] : NULL;
        if (!hit)
            rc = mw_error_set(MW_EFORMAT, "%s: shard %s holds tensor \"%s\", which \"weight_map\" does not list (a stale "
                              "or edited index)", s->path, shard_of_entry(s, ix, e), e->st->name);
        else if (&s->files[ix->shard_of[hit->i]] != e->file)
            rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" puts tensor \"%s\" in %s, but it is in %s", s->path,
                              e->st->name, ix->shard[ix->shard_of[hit->i]], shard_of_entry(s, ix, e));
    }
    /* Every shard tensor is listed once for its own shard; what is left is listed but absent. */
    for (int i = 0; i < ix->n && !rc; i++)
        if (!mw_ts_find(s, ix->name[i]))
            rc = mw_error_set(MW_EFORMAT, "%s: \"weight_map\" puts tensor \"%s\" in %s, which does not hold it", s->path,
                              ix->name[i], ix->shard[ix->shard_of[i]]);
    free(r);
    return rc;
}

static int open_sharded(struct mw_ts *s, const char *index)
{
    int rc;
    if ((size_t)snprintf(s->path, sizeof s->path, "%s", index) >= sizeof s->path)
        return mw_error_set(-ENAMETOOLONG, "%s: path too long", index);
    if ((rc = set_dir(s, index))) return rc;
    s->sharded = 1;
    char *text = NULL;
    size_t len = 0;
    if ((rc = mw_read_small_file(index, "sharded checkpoint's index", MW_TS_MAX_INDEX_BYTES, &text, &len))) return rc;
    struct mw_ts_index ix;
    rc = mw_ts_index_parse(text, len, index, &ix);
    free(text);
    if (rc) return rc;
    int *first = malloc((size_t)ix.n_shards * sizeof *first); /* a tensor of each shard, for messages */
    s->files = calloc((size_t)ix.n_shards, sizeof *s->files);
    if (!first || !s->files) { rc = mw_error_set(-ENOMEM, "%s: no memory for %d shards", index, ix.n_shards); goto out; }
    for (int k = 0; k < ix.n_shards; k++) first[k] = -1;
    for (int i = ix.n - 1; i >= 0; i--) first[ix.shard_of[i]] = i;
    for (int k = 0; k < ix.n_shards; k++) {
        char p[sizeof s->dir + MW_TS_MAX_SHARD_NAME + 2];
        snprintf(p, sizeof p, "%s/%s", s->dir, ix.shard[k]); /* fits: both lengths are bounded */
        if ((rc = check_regular(p, ix.shard[k], index, ix.name[first[k]]))) goto out;
        if ((rc = mw_st_open(&s->files[k], p))) {
            rc = mw_error_set(rc, "%s (a shard named by %s)", mw_error_msg(), index);
            goto out;
        }
        s->n_files = k + 1;
    }
    if (!(rc = list_entries(s))) rc = cross_check(s, &ix);
out:
    free(first);
    mw_ts_index_free(&ix);
    return rc;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

int mw_ts_open(struct mw_ts *s, const char *path)
{
    memset(s, 0, sizeof *s);
    struct stat st;
    int rc;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        char single[sizeof s->path], index[sizeof s->path];
        if ((size_t)snprintf(single, sizeof single, "%s/model.safetensors", path) >= sizeof single ||
            (size_t)snprintf(index, sizeof index, "%s/" MW_TS_INDEX_NAME, path) >= sizeof index)
            return mw_error_set(-ENAMETOOLONG, "%s: path too long", path);
        if (stat(single, &st) == 0) rc = open_single(s, single); /* preferred, as transformers does */
        else if (stat(index, &st) == 0) rc = open_sharded(s, index);
        else
            return mw_error_set(-ENOENT, "%s holds neither model.safetensors nor " MW_TS_INDEX_NAME " (the index of a "
                                "sharded checkpoint)", path);
    } else if (ends_with(path, ".index.json")) {
        rc = open_sharded(s, path);
    } else {
        rc = open_single(s, path);
    }
    if (rc) mw_ts_close(s);
    return rc;
}

/* ---------------------------------------------------------------- memwall/model.h */

int mw_net_hf_weights(const char *dir, char *out, size_t n)
{
    char single[4096], index[4096];
    struct stat st;
    if ((size_t)snprintf(single, sizeof single, "%s/model.safetensors", dir) >= sizeof single ||
        (size_t)snprintf(index, sizeof index, "%s/" MW_TS_INDEX_NAME, dir) >= sizeof index)
        return mw_error_set(-ENAMETOOLONG, "%s: path too long", dir);
    /* The single file when it is there (even beside an index), else the directory: mw_ts_open
     * reads its index. Neither: say what was looked for. */
    const char *pick = stat(single, &st) == 0 ? single : stat(index, &st) == 0 ? dir : NULL;
    if (!pick)
        return mw_error_set(-ENOENT, "%s holds neither model.safetensors nor " MW_TS_INDEX_NAME " (the index of a "
                            "sharded checkpoint)", dir);
    if ((size_t)snprintf(out, n, "%s", pick) >= n) return mw_error_set(-ENAMETOOLONG, "%s: path too long", pick);
    /* Open once (headers and the index against its shards, no weights): a bad directory fails
     * here, naming the file and the key, for every family alike. */
    struct mw_ts s;
    int rc = mw_ts_open(&s, pick);
    mw_ts_close(&s);
    return rc;
}
