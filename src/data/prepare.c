/*
 * prepare.c — text files to llm.c .bin shards with a Hugging Face tokenizer (`memwall data`;
 * the contract is mw_data_prepare in data.h).
 *
 * Why this shape: a corpus can be far larger than memory, so nothing is kept but the current
 * document and two shard buffers (training and validation, shard_tokens each); a buffer is
 * written as soon as it is full, atomically (mw_shard_write_ids), so an interrupted run leaves
 * only whole shards. The validation split is decided by input bytes, which are known before the
 * first token (the files' sizes): the first val_frac of the bytes go to validation, which is
 * llm.c's "the first shard is val" for any fraction, works for one big file as for a million
 * JSONL documents, and needs no second pass.
 *
 * Documents as llm.c writes them: the document token (Llama-3: <|begin_of_text|>; GPT-2 and
 * Qwen2: <|endoftext|>) and then the document's ids, with special tokens in the text encoded as
 * plain text (llm.c: encode_ordinary / split_special_tokens=True), so that a document cannot
 * forge a boundary.
 */
#include "memwall/data.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/tok.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void mw_data_prep_opts_default(struct mw_data_prep_opts *o)
{
    memset(o, 0, sizeof *o);
    o->name = "data";
    o->val_frac = 0.1;
    o->shard_tokens = 100000000;
    o->doc_token = -1;
}

struct prep {
    const struct mw_data_prep_opts *o;
    struct mw_data_prep_stats *st;
    struct mw_tok *tok;
    uint64_t val_bytes;         /* the input bytes that go to validation */
    uint32_t *buf[2];           /* [0] train, [1] val: shard_tokens each */
    size_t len[2];
    struct mw_tok_ids ids;      /* the current document */
    uint64_t last_report_ns;
};

static int flush(struct prep *p, int val)
{
    if (!p->len[val]) return 0;
    int *count = val ? &p->st->val_shards : &p->st->train_shards;
    char path[1024];
    int w = snprintf(path, sizeof path, "%s/%s_%s_%06d.bin", p->o->out_dir, p->o->name, val ? "val" : "train", *count);
    if (w < 0 || (size_t)w >= sizeof path) return mw_error_set(-ENAMETOOLONG, "shard path under %s is too long", p->o->out_dir);
    int err = mw_shard_write_ids(path, p->buf[val], p->len[val], p->st->wide);
    if (err) return err;
    (*count)++;
    p->len[val] = 0;
    snprintf(p->st->last_shard, sizeof p->st->last_shard, "%s", path);
    if (p->o->progress) p->o->progress(p->st, p->o->user);
    return 0;
}

static int append(struct prep *p, int val, const int32_t *v, size_t n)
{
    while (n) {
        size_t k = MW_MIN(n, (size_t)p->o->shard_tokens - p->len[val]);
        for (size_t i = 0; i < k; i++) p->buf[val][p->len[val] + i] = (uint32_t)v[i];
        p->len[val] += k;
        v += k;
        n -= k;
        if (val) p->st->val_tokens += k;
        else p->st->train_tokens += k;
        int err;
        if (p->len[val] == p->o->shard_tokens && (err = flush(p, val))) return err;
    }
    return 0;
}

/* One document: text[0..n), occupying input bytes [b0, b1) of the whole corpus. */
static int document(struct prep *p, const char *text, size_t n, uint64_t b0, uint64_t b1)
{
    p->ids.n = 0;
    int err;
    if (!p->ids.cap) {
        if (!(p->ids.v = malloc(4096 * sizeof *p->ids.v))) return mw_error_set(-ENOMEM, "no memory");
        p->ids.cap = 4096;
    }
    p->ids.v[p->ids.n++] = p->st->doc_token;
    if ((err = mw_tok_encode(p->tok, text, n, MW_TOK_SPLIT_SPECIAL, &p->ids))) return err;
    size_t nval = 0;
    if (b1 <= p->val_bytes) nval = p->ids.n;
    else if (b0 < p->val_bytes)
        nval = (size_t)llround((double)p->ids.n * (double)(p->val_bytes - b0) / (double)(b1 - b0));
    nval = MW_MIN(nval, p->ids.n);
    if ((err = append(p, 1, p->ids.v, nval)) || (err = append(p, 0, p->ids.v + nval, p->ids.n - nval))) return err;
    p->st->docs++;
    p->st->bytes_done = b1;
    uint64_t now = mw_now_ns();
    if (p->o->progress && now - p->last_report_ns > 1000000000ull) {
        p->last_report_ns = now;
        p->o->progress(p->st, p->o->user);
    }
    return 0;
}

/* Names the input file in front of the message of a failure inside it. */
static int in_file(int err, const char *path)
{
    char pre[1100];
    snprintf(pre, sizeof pre, "%s: ", path);
    return mw_error_prepend(err, pre);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* A JSONL file: one document per non-blank line, its "text" string. */
static int jsonl(struct prep *p, const char *path, const char *buf, size_t n, uint64_t base)
{
    size_t line = 0;
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(buf + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - buf) : n, next = nl ? end + 1 : n;
        line++;
        size_t a = i;
        while (a < end && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\r')) a++;
        if (a == end) { i = next; continue; }
        cJSON *j = cJSON_ParseWithLength(buf + i, end - i);
        const cJSON *text = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
        if (!cJSON_IsString(text)) {
            cJSON_Delete(j);
            return mw_error_set(MW_EFORMAT, "%s line %zu: %s", path, line,
                                j ? "no \"text\" string in this JSON object" : "not a JSON object");
        }
        /* cJSON strings end at the first NUL: a "\u0000" in the text cuts the document there. */
        int err = document(p, text->valuestring, strlen(text->valuestring), base + i, base + next);
        cJSON_Delete(j);
        if (err) return in_file(err, path);
        i = next;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The input files: each path, or a directory's regular non-hidden files sorted by name. */
static int list_inputs(const char *const *inputs, int n, char ***out, int *nout, uint64_t *bytes)
{
    char **v = NULL;
    int k = 0, cap = 0, err = 0;
    *bytes = 0;
    for (int i = 0; i < n && !err; i++) {
        struct stat st;
        if (stat(inputs[i], &st) != 0) { err = mw_error_set(-errno, "cannot open %s: %s", inputs[i], strerror(errno)); break; }
        char **names = NULL;
        int nn = 0;
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(inputs[i]);
            if (!d) { err = mw_error_set(-errno, "cannot open directory %s: %s", inputs[i], strerror(errno)); break; }
            struct dirent *de;
            while (!err && (de = readdir(d))) {
                if (de->d_name[0] == '.') continue;
                size_t len = strlen(inputs[i]) + strlen(de->d_name) + 2;
                char *path = malloc(len);
                char **nv = realloc(names, (size_t)(nn + 1) * sizeof *nv);
                if (!path || !nv) { free(path); if (nv) names = nv; err = mw_error_set(-ENOMEM, "no memory"); break; }
                names = nv;
                snprintf(path, len, "%s/%s", inputs[i], de->d_name);
                struct stat fs;
                if (stat(path, &fs) != 0 || S_ISDIR(fs.st_mode)) { free(path); continue; }
                names[nn++] = path;
            }
            closedir(d);
            if (nn) qsort(names, (size_t)nn, sizeof *names, cmp_str);
        } else {
            names = malloc(sizeof *names);
            if (!names || !(names[0] = strdup(inputs[i]))) { free(names); names = NULL; err = mw_error_set(-ENOMEM, "no memory"); }
            else nn = 1;
        }
        for (int j = 0; j < nn; j++) {
            struct stat fs;
            if (!err && stat(names[j], &fs) == 0 && !S_ISREG(fs.st_mode))
                err = mw_error_set(-EINVAL, "input %s is not a regular file (a FIFO, device or socket): save it to a "
                                   "file first", names[j]);
            if (!err && k == cap) {
                cap = cap ? 2 * cap : 16;
                char **nv = realloc(v, (size_t)cap * sizeof *nv);
                if (!nv) err = mw_error_set(-ENOMEM, "no memory");
                else v = nv;
            }
            if (err) { free(names[j]); continue; }
            v[k++] = names[j];
            *bytes += (uint64_t)fs.st_size;
        }
        free(names);
    }
    if (!err && k == 0) err = mw_error_set(-ENOENT, "no input files (directories hold none?)");
    if (err) {
        for (int i = 0; i < k; i++) free(v[i]);
        free(v);
        return err;
    }
    *out = v;
    *nout = k;
    return 0;
}

/* Refuses an output directory that already holds shards of this name: a second run with fewer
 * shards would otherwise leave the first run's extra shards to be trained on. */
static int check_out_dir(const struct mw_data_prep_opts *o)
{
    int err = mw_mkdir_p(o->out_dir, 0777);
    if (err) return err;
    DIR *d = opendir(o->out_dir);
    if (!d) return mw_error_set(-errno, "cannot open %s: %s", o->out_dir, strerror(errno));
    size_t nl = strlen(o->name);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, o->name, nl) || !ends_with(de->d_name, ".bin")) continue;
        if (!strncmp(de->d_name + nl, "_train_", 7) || !strncmp(de->d_name + nl, "_val_", 5)) {
            err = mw_error_set(-EEXIST, "%s already holds shards named %s_*.bin (%s): remove them or choose another "
                               "name", o->out_dir, o->name, de->d_name);
            break;
        }
    }
    closedir(d);
    return err;
}

int mw_data_prepare(struct mw_tok *tok, const char *const *inputs, int n, const struct mw_data_prep_opts *o,
                    struct mw_data_prep_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!o->out_dir || !o->name || !*o->name || strchr(o->name, '/'))
        return mw_error_set(-EINVAL, "shard name '%s' must be non-empty, without '/'", o->name ? o->name : "");
    if (strstr(o->name, "val"))
        return mw_error_set(-EINVAL, "shard name '%s' contains \"val\": memwall train would take its training shards "
                            "for validation (it goes by \"val\" in the file name)", o->name);
    if (!(o->val_frac >= 0 && o->val_frac < 1))
        return mw_error_set(-EINVAL, "validation fraction %g must lie in [0, 1)", o->val_frac);
    if (o->shard_tokens < 1 || o->shard_tokens > INT32_MAX)
        return mw_error_set(-EINVAL, "shard size %llu tokens must lie in [1, %d]", (unsigned long long)o->shard_tokens,
                            INT32_MAX);
    int32_t vocab = mw_tok_vocab_size(tok);
    st->wide = vocab > 65536;
    st->doc_token = o->doc_token >= 0 ? o->doc_token : mw_tok_doc_token(tok);
    if (st->doc_token < 0)
        return mw_error_set(-EINVAL, "the tokenizer has no document token (no BOS added by its post-processor, no "
                            "<|endoftext|>): name one (memwall data --doc-token)");
    if (st->doc_token >= vocab)
        return mw_error_set(-EINVAL, "document token %d is outside the vocabulary (%d ids)", st->doc_token, vocab);
    char **files = NULL;
    int nf = 0, err;
    if ((err = list_inputs(inputs, n, &files, &nf, &st->bytes_total))) return err;
    struct prep p = {.o = o, .st = st, .tok = tok};
    p.val_bytes = (uint64_t)llround((double)st->bytes_total * o->val_frac);
    if ((err = check_out_dir(o))) goto out;
    for (int v = 0; v < 2; v++)
        if (!(p.buf[v] = malloc((size_t)o->shard_tokens * sizeof *p.buf[v]))) {
            err = mw_error_set(-ENOMEM, "no memory for a shard of %llu tokens (--shard-tokens)",
                               (unsigned long long)o->shard_tokens);
            goto out;
        }
    p.last_report_ns = mw_now_ns();
    uint64_t base = 0;
    for (int i = 0; i < nf && !err; i++) {
        char *buf = NULL;
        size_t len = 0;
        if ((err = mw_read_small_file(files[i], "input", SIZE_MAX, &buf, &len))) break;
        if (ends_with(files[i], ".jsonl")) err = jsonl(&p, files[i], buf, len, base);
        else if ((err = document(&p, buf, len, base, base + len))) err = in_file(err, files[i]);
        base += len;
        free(buf);
    }
    if (!err && st->val_tokens + st->train_tokens == 0) err = mw_error_set(-EINVAL, "the inputs hold no document");
    if (!err) err = flush(&p, 1);
    if (!err) err = flush(&p, 0);
out:
    for (int i = 0; i < nf; i++) free(files[i]);
    free(files);
    free(p.buf[0]);
    free(p.buf[1]);
    mw_tok_ids_free(&p.ids);
    return err;
}
