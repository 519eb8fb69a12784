/*
 * test_tensor_source.c — sharded checkpoints (model.safetensors.index.json and its shards) read
 * through the tensor source (src/model/tensor_source.c) by both families:
 *  - Hugging Face directories split into shards by the python-free splitter below (the Llama
 *    fixture tests/fixtures/llama/llama3_untied, and a GPT-2 model memwall saves, tensors dealt
 *    round-robin so a weight unit spans every shard): the config from the sharded directory is
 *    the unsharded one's, a whole load and a load a unit at a time (units in reverse) give its
 *    bits; so does the committed transformers-made tests/fixtures/llama/sharded;
 *  - hostile indexes, each refused with a message naming the key or file: not JSON, no or a
 *    non-object weight_map, weight_map twice, empty, a non-string shard, a shard name with '/',
 *    ".." or absolute, a missing shard, a FIFO shard, a corrupt shard, a tensor the named shard
 *    does not hold, a tensor in the wrong shard, a shard tensor the index does not list, a
 *    tensor in two shards, a tensor twice, 4097 shards, an index over 64 MiB;
 *  - the directory rules: model.safetensors preferred beside an index (even a broken one), an
 *    index given by its path, neither file (-ENOENT); mw_net_hf_weights picks the same.
 * `test_tensor_source split SRC OUT N` runs the splitter alone (tests/cli_hf_sharded.sh makes a
 * sharded GPT-2 directory with it).
 */
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/model.h"
#include "model/safetensors.h"
#include "model/tensor_source.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(data, 1, n, f) == n && fclose(f) == 0);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* SRC's tensors (any path mw_ts_open takes) as n shards OUT/model-0000k-of-0000n.safetensors
 * (fp32, each with the first file's __metadata__), the index transformers writes, and SRC's
 * config.json copied. Tensor i goes to shard i * n / count (transformers' contiguous runs) or,
 * interleaved, i % n. 0 or an error code. */
static int split(const char *src, const char *out, int n, int interleave)
{
    struct mw_ts s;
    int rc = mw_ts_open(&s, src);
    if (rc) return rc;
    struct mw_st_out *t = calloc((size_t)s.n + 1, sizeof *t);
    float **data = calloc((size_t)s.n + 1, sizeof *data);
    int *shard = calloc((size_t)s.n + 1, sizeof *shard);
    cJSON *ix = cJSON_CreateObject(), *wm = NULL;
    REQUIRE(t && data && shard && ix && n >= 1 && n <= 99999);
    uint64_t total = 0;
    char name[64], path[2048];
    for (int i = 0; i < s.n && !rc; i++) {
        const struct mw_st_entry *e = s.e[i].st;
        if (e->ndim < 1 || e->ndim > 2) { rc = mw_error_set(-EINVAL, "%s: %d-D tensor %s", src, e->ndim, e->name); break; }
        REQUIRE((data[i] = malloc((size_t)e->numel * sizeof(float) + 1)));
        rc = mw_ts_read_f32(&s.e[i], 0, e->numel, data[i]);
        t[i] = (struct mw_st_out){e->name, e->ndim, {e->shape[0], e->ndim == 2 ? e->shape[1] : 1}, data[i]};
        shard[i] = interleave ? i % n : (int)((int64_t)i * n / s.n);
        total += e->numel * 4;
    }
    const struct mw_st_file *f0 = &s.files[0];
    const char **meta = calloc(2 * (size_t)f0->n_meta + 1, sizeof *meta);
    REQUIRE(meta);
    for (int i = 0; i < f0->n_meta; i++) { meta[2 * i] = f0->meta_key[i]; meta[2 * i + 1] = f0->meta_val[i]; }
    for (int k = 0; k < n && !rc; k++) {
        struct mw_st_out *mine = calloc((size_t)s.n + 1, sizeof *mine);
        REQUIRE(mine);
        int m = 0;
        for (int i = 0; i < s.n; i++)
            if (shard[i] == k) mine[m++] = t[i];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n);
        snprintf(path, sizeof path, "%s/%s", out, name);
        rc = mw_st_write_f32(path, mine, m, meta, f0->n_meta);
        free(mine);
    }
    free(meta);
    if (!rc) {
        cJSON *md = cJSON_AddObjectToObject(ix, "metadata");
        cJSON_AddNumberToObject(md, "total_size", (double)total);
        wm = cJSON_AddObjectToObject(ix, "weight_map");
        for (int i = 0; i < s.n; i++) {
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard[i] + 1, n);
            cJSON_AddStringToObject(wm, t[i].name, name);
        }
        char *js = cJSON_Print(ix);
        REQUIRE(js);
        snprintf(path, sizeof path, "%s/" MW_TS_INDEX_NAME, out);
        write_text(path, js);
        free(js);
        char *cfg = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "%s/config.json", s.dir);
        if (!(rc = mw_read_small_file(path, "config.json", 1u << 20, &cfg, &len))) {
            snprintf(path, sizeof path, "%s/config.json", out);
            write_text(path, cfg);
        }
        free(cfg);
    }
    cJSON_Delete(ix);
    for (int i = 0; i < s.n; i++) free(data[i]);
    free(data);
    free(shard);
    free(t);
    mw_ts_close(&s);
    return rc;
}

/* The model of an HF directory (weights: what mw_net_hf_weights picks), weights from the seed. */
static void mknet(struct mw_net *n, const char *dir, struct mw_net_config *nc)
{
    const struct mw_net_family *f;
    char w[4096], note[2048];
    struct mw_net_shape none = {0, 0, 0, 0, 0};
    REQUIRE(mw_net_family_for_hf(dir, &f) == 0);
    CHECK_MSG(mw_net_hf_weights(dir, w, sizeof w) == 0, "%s", mw_error_msg());
    memset(nc, 0, sizeof *nc);
    nc->family = f;
    REQUIRE(f->config_from_file(w, &none, nc->raw, note, sizeof note) == 0);
    struct mw_net_options o = {1, 0, 0, 1};
    REQUIRE(mw_net_init(n, nc, &o) == 0);
    mw_net_init_weights(n, 99);
}

/* dir and its sharded copy sdir hold the same model: config, whole load, unit-at-a-time load. */
static void same_model(const char *dir, const char *sdir, const char *what)
{
    struct mw_net a, b;
    struct mw_net_config ca, cb;
    char w[4096];
    mknet(&a, dir, &ca);
    mknet(&b, sdir, &cb);
    uint8_t wa[MW_NET_CONFIG_WIRE], wb[MW_NET_CONFIG_WIRE];
    ca.family->config_encode(ca.raw, wa);
    cb.family->config_encode(cb.raw, wb);
    CHECK_MSG(ca.family == cb.family && !memcmp(wa, wb, sizeof wa), "%s: the sharded directory's config differs", what);
    REQUIRE(mw_net_hf_weights(dir, w, sizeof w) == 0);
    REQUIRE(mw_net_load_safetensors(&a, w) == 0);
    REQUIRE(mw_net_hf_weights(sdir, w, sizeof w) == 0);
    CHECK_MSG(!strcmp(w, sdir), "%s: weights path %s", what, w);
    CHECK_MSG(mw_net_load_safetensors(&b, w) == 0, "%s: %s", what, mw_error_msg());
    CHECK_MSG(!memcmp(a.params, b.params, a.sizes.params_bytes), "%s: whole load differs", what);
    mw_net_init_weights(&b, 7);
    void *l = NULL;
    CHECK_MSG(b.family->loader_open(&l, &b, w) == 0, "%s: %s", what, mw_error_msg());
    for (int u = b.n_units - 1; l && u >= 0; u--) CHECK(b.family->loader_unit(l, &b, u) == 0);
    if (l) b.family->loader_close(l);
    CHECK_MSG(!memcmp(a.params, b.params, a.sizes.params_bytes), "%s: unit-at-a-time load differs", what);
    mw_net_free(&a);
    mw_net_free(&b);
}

static void families(const char *src, const char *tmp)
{
    char fx[1024], out[1024], g[1024];
    /* Llama: the transformers fixture, split here; and the one transformers sharded */
    snprintf(fx, sizeof fx, "%s/tests/fixtures/llama/llama3_untied", src);
    snprintf(out, sizeof out, "%s/llama_sharded", tmp);
    REQUIRE(mkdir(out, 0755) == 0);
    CHECK_MSG(split(fx, out, 3, 1) == 0, "%s", mw_error_msg());
    same_model(fx, out, "llama3_untied split in 3");
    snprintf(out, sizeof out, "%s/tests/fixtures/llama/sharded", src);
    same_model(fx, out, "tests/fixtures/llama/sharded (transformers)");
    /* GPT-2: a model memwall writes as a Hugging Face directory, split */
    const struct mw_net_family *gf = mw_net_family_find("gpt2");
    REQUIRE(gf && gf->hf_config_write);
    struct mw_net_config nc = {gf, {0}};
    struct mw_net_shape sh = {2, 2, 16, 16, 50};
    REQUIRE(gf->config_from_shape(&sh, nc.raw) == 0);
    struct mw_net m;
    struct mw_net_options o = {1, 0, 0, 1};
    REQUIRE(mw_net_init(&m, &nc, &o) == 0);
    mw_net_init_weights(&m, 3);
    snprintf(g, sizeof g, "%s/gpt2", tmp);
    REQUIRE(mkdir(g, 0755) == 0);
    char p[1100];
    snprintf(p, sizeof p, "%s/model.safetensors", g);
    REQUIRE(mw_net_save_safetensors_units(&m, p, NULL, NULL) == 0);
    snprintf(p, sizeof p, "%s/config.json", g);
    REQUIRE(gf->hf_config_write(nc.raw, p) == 0);
    mw_net_free(&m);
    snprintf(out, sizeof out, "%s/gpt2_sharded", tmp);
    REQUIRE(mkdir(out, 0755) == 0);
    CHECK_MSG(split(g, out, 4, 1) == 0, "%s", mw_error_msg());
    same_model(g, out, "GPT-2 split in 4");
}

/* ---- hostile indexes over three small shards: a = {x, y}, b = {z}, c = {y} ---- */

static char hdir[1024];

static void shards(void)
{
    static const float x[6] = {1, 2, 3, 4, 5, 6}, y[2] = {7, 8}, z[3] = {9, 10, 11};
    struct mw_st_out a[2] = {{"x", 2, {2, 3}, x}, {"y", 1, {2, 1}, y}}, b[1] = {{"z", 1, {3, 1}, z}},
                     c[1] = {{"y", 1, {2, 1}, y}};
    char p[1100];
    snprintf(p, sizeof p, "%s/a.safetensors", hdir);
    REQUIRE(mw_st_write_f32(p, a, 2, NULL, 0) == 0);
    snprintf(p, sizeof p, "%s/b.safetensors", hdir);
    REQUIRE(mw_st_write_f32(p, b, 1, NULL, 0) == 0);
    snprintf(p, sizeof p, "%s/c.safetensors", hdir);
    REQUIRE(mw_st_write_f32(p, c, 1, NULL, 0) == 0);
}

/* The index text in hdir, opened: want rc, and the message holds each of the NULL-ended words. */
static void refused(const char *index, int want, ...)
{
    char p[1100];
    snprintf(p, sizeof p, "%s/" MW_TS_INDEX_NAME, hdir);
    write_text(p, index);
    struct mw_ts s;
    int rc = mw_ts_open(&s, hdir);
    CHECK_MSG(rc == want, "index %.120s: rc %d, want %d (%s)", index, rc, want, mw_error_msg());
    va_list ap;
    va_start(ap, want);
    for (const char *w; (w = va_arg(ap, const char *));)
        CHECK_MSG(strstr(mw_error_msg(), w), "index %.120s: \"%s\" not in \"%s\"", index, w, mw_error_msg());
    va_end(ap);
    if (!rc) mw_ts_close(&s);
    CHECK(s.n == 0 && s.files == NULL); /* a refusal keeps nothing */
}

#define AB "\"x\": \"a.safetensors\", \"y\": \"a.safetensors\", \"z\": \"b.safetensors\""

static void hostile(const char *tmp)
{
    snprintf(hdir, sizeof hdir, "%s/hostile", tmp);
    REQUIRE(mkdir(hdir, 0755) == 0);
    shards();
    char p[1100], w[4096];
    /* the good index, by its directory and by its own path */
    snprintf(p, sizeof p, "%s/" MW_TS_INDEX_NAME, hdir);
    write_text(p, "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {" AB "}}");
    struct mw_ts s;
    for (int k = 0; k < 2; k++) {
        REQUIRE(mw_ts_open(&s, k ? p : hdir) == 0);
        CHECK(s.sharded && s.n == 3 && s.n_files == 2 && strstr(s.path, MW_TS_INDEX_NAME));
        const struct mw_ts_entry *z = mw_ts_find(&s, "z"), *x = mw_ts_find(&s, "x");
        float v[6];
        CHECK(z && strstr(z->file->path, "/b.safetensors") && mw_ts_read_f32(z, 1, 2, v) == 0 && v[0] == 10 && v[1] == 11);
        CHECK(x && mw_ts_read_f32(x, 0, 6, v) == 0 && v[5] == 6);
        CHECK(!mw_ts_find(&s, "w") && !mw_ts_find(&s, ""));
        mw_ts_close(&s);
    }
    CHECK(mw_net_hf_weights(hdir, w, sizeof w) == 0 && !strcmp(w, hdir));

    refused("not json", MW_EFORMAT, "not a JSON object", MW_TS_INDEX_NAME, NULL);
    refused("[1, 2]", MW_EFORMAT, "not a JSON object", NULL);
    refused("{\"metadata\": {}}", MW_EFORMAT, "no \"weight_map\"", NULL);
    refused("{\"weight_map\": [\"a.safetensors\"]}", MW_EFORMAT, "\"weight_map\" is not an object", NULL);
    refused("{\"weight_map\": null}", MW_EFORMAT, "\"weight_map\" is not an object", NULL);
    refused("{\"weight_map\": {}}", MW_EFORMAT, "\"weight_map\" is empty", NULL);
    refused("{\"weight_map\": {" AB "}, \"weight_map\": {" AB "}}", MW_EFORMAT, "\"weight_map\" appears 2 times", NULL);
    refused("{\"metadata\": 3, \"weight_map\": {" AB "}}", MW_EFORMAT, "\"metadata\" is not an object", NULL);
    refused("{\"weight_map\": {\"x\": 3}}", MW_EFORMAT, "weight_map[\"x\"] is not a string", NULL);
    refused("{\"weight_map\": {\"\": \"a.safetensors\"}}", MW_EFORMAT, "tensor name is empty", NULL);
    refused("{\"weight_map\": {\"x\": \"../hostile/a.safetensors\"}}", MW_EFORMAT, "weight_map[\"x\"]", "'/'", NULL);
    refused("{\"weight_map\": {\"x\": \"..\"}}", MW_EFORMAT, "\"..\"", NULL);
    refused("{\"weight_map\": {\"x\": \"/etc/passwd\"}}", MW_EFORMAT, "\"/etc/passwd\"", "'/'", NULL);
    refused("{\"weight_map\": {\"x\": \"sub/a.safetensors\"}}", MW_EFORMAT, "'/'", NULL);
    refused("{\"weight_map\": {\"x\": \".\"}}", MW_EFORMAT, "is \".\"", NULL);
    refused("{\"weight_map\": {\"x\": \"\"}}", MW_EFORMAT, "is empty", NULL);
    refused("{\"weight_map\": {" AB ", \"w\": \"nope.safetensors\"}}", -ENOENT, "shard nope.safetensors",
            "\"w\"", "No such file", NULL);
    refused("{\"weight_map\": {" AB ", \"w\": \"b.safetensors\"}}", MW_EFORMAT,
            "puts tensor \"w\" in b.safetensors, which does not hold it", NULL);
    refused("{\"weight_map\": {\"x\": \"b.safetensors\", \"y\": \"a.safetensors\", \"z\": \"b.safetensors\"}}",
            MW_EFORMAT, "puts tensor \"x\" in b.safetensors, but it is in a.safetensors", NULL);
    refused("{\"weight_map\": {\"x\": \"a.safetensors\", \"z\": \"b.safetensors\"}}", MW_EFORMAT,
            "a.safetensors holds tensor \"y\", which \"weight_map\" does not list", NULL);
    refused("{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"c.safetensors\", \"z\": \"b.safetensors\"}}",
            MW_EFORMAT, "tensor \"y\" is in two shards, a.safetensors and c.safetensors", NULL);
    refused("{\"weight_map\": {" AB ", \"x\": \"a.safetensors\"}}", MW_EFORMAT, "lists tensor \"x\" twice", NULL);
    /* a shard that is a FIFO (never opened: it would block), and one that is not safetensors */
    snprintf(p, sizeof p, "%s/fifo.safetensors", hdir);
    REQUIRE(mkfifo(p, 0644) == 0);
    refused("{\"weight_map\": {" AB ", \"w\": \"fifo.safetensors\"}}", MW_EFORMAT, "fifo.safetensors", "not a regular file",
            NULL);
    snprintf(p, sizeof p, "%s/junk.safetensors", hdir);
    write_bytes(p, "\x10\0\0\0\0\0\0\0{\"w\": 1}        ", 24);
    refused("{\"weight_map\": {" AB ", \"w\": \"junk.safetensors\"}}", MW_EFORMAT, "junk.safetensors",
            "(a shard named by", NULL);
    /* 4097 shards: refused before any is opened */
    size_t cap = 4200 * 64;
    char *big = malloc(cap);
    REQUIRE(big);
    size_t o = (size_t)snprintf(big, cap, "{\"weight_map\": {");
    for (int i = 0; i <= MW_TS_MAX_SHARDS; i++)
        o += (size_t)snprintf(big + o, cap - o, "%s\"t%d\": \"s%d.safetensors\"", i ? ", " : "", i, i);
    snprintf(big + o, cap - o, "}}");
    refused(big, MW_EFORMAT, "names 4097 shard files", NULL);
    free(big);
    /* an index over 64 MiB (sparse): refused by its size, unread */
    snprintf(p, sizeof p, "%s/" MW_TS_INDEX_NAME, hdir);
    REQUIRE(truncate(p, (off_t)MW_TS_MAX_INDEX_BYTES + 1) == 0);
    CHECK(mw_ts_open(&s, hdir) == MW_EFORMAT && strstr(mw_error_msg(), "more than the"));
    /* the index straight from memory: a shard name over 255 bytes */
    struct mw_ts_index ix;
    char longname[400] = "{\"weight_map\": {\"x\": \"";
    memset(longname + strlen(longname), 'a', 300);
    strcpy(longname + strlen(longname), "\"}}");
    CHECK(mw_ts_index_parse(longname, strlen(longname), "i.json", &ix) == MW_EFORMAT &&
          strstr(mw_error_msg(), "longer than 255"));
    const char *ok = "{\"weight_map\": {\"b\": \"s2\", \"a\": \"s1\", \"c\": \"s2\"}}";
    REQUIRE(mw_ts_index_parse(ok, strlen(ok), "i.json", &ix) == 0);
    CHECK(ix.n == 3 && ix.n_shards == 2 && !strcmp(ix.shard[0], "s1") && ix.shard_of[0] == 1 && ix.shard_of[1] == 0 &&
          !strcmp(ix.name[2], "c"));
    mw_ts_index_free(&ix);

    /* model.safetensors beside an index (here a broken one) is preferred; neither: -ENOENT */
    snprintf(p, sizeof p, "%s/" MW_TS_INDEX_NAME, hdir);
    write_text(p, "broken");
    char single[1100];
    snprintf(single, sizeof single, "%s/model.safetensors", hdir);
    struct mw_st_out one[1] = {{"q", 1, {1, 1}, (const float[]){5}}};
    REQUIRE(mw_st_write_f32(single, one, 1, NULL, 0) == 0);
    CHECK(mw_ts_open(&s, hdir) == 0 && !s.sharded && s.n == 1 && mw_ts_find(&s, "q"));
    mw_ts_close(&s);
    CHECK(mw_net_hf_weights(hdir, w, sizeof w) == 0 && !strcmp(w, single));
    snprintf(p, sizeof p, "%s/empty", tmp);
    REQUIRE(mkdir(p, 0755) == 0);
    CHECK(mw_ts_open(&s, p) == -ENOENT && strstr(mw_error_msg(), "neither model.safetensors nor " MW_TS_INDEX_NAME));
    CHECK(mw_net_hf_weights(p, w, sizeof w) == -ENOENT);
    mw_ts_close(&s); /* closing a closed source is a no-op */
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "split")) {
        int rc = split(argv[2], argv[3], atoi(argv[4]), 0);
        if (rc) fprintf(stderr, "split: %s\n", mw_error_msg());
        return rc ? 1 : 0;
    }
    const char *src = getenv("MW_SOURCE_DIR");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s", tu_scratch_dir("tensor_source"));
    families(src ? src : ".", tmp);
    hostile(tmp);
    tu_rm_rf(tmp);
    TEST_END();
}
