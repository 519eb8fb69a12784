/*
 * fuzz_safetensors_index.c — a sharded checkpoint's model.safetensors.index.json: the index
 * parser from memory (mw_ts_index_parse), then the whole tensor source (mw_ts_open) on a scratch
 * directory that holds the input as its index beside two fixed shards, so a fuzzed index meets
 * real files: a shard it names that exists, one that does not, a tensor in the wrong shard or in
 * none. What is accepted must hold together: shard names are plain file names, each tensor once
 * in the shard the index names, every tensor found by name and readable.
 *
 * The shards (written once per process): model-00001-of-00002.safetensors = {a [2, 3], b [4]},
 * model-00002-of-00002.safetensors = {c [3], d [1, 1]}; seeds in fuzz/corpus/safetensors_index.
 */
#include "fuzz.h"
#include "model/safetensors.h"
#include "model/tensor_source.h"

static void write_shards(void)
{
    static const float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {7, 8, 9, 10}, c[3] = {11, 12, 13}, d[1] = {14};
    struct mw_st_out s1[2] = {{"a", 2, {2, 3}, a}, {"b", 1, {4, 1}, b}}, s2[2] = {{"c", 1, {3, 1}, c}, {"d", 2, {1, 1}, d}};
    char p[400];
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", fz_scratch());
    if (mw_st_write_f32(p, s1, 2, NULL, 0)) abort();
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", fz_scratch());
    if (mw_st_write_f32(p, s2, 2, NULL, 0)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int shards;
    if (!shards++) write_shards();
    /* the index alone */
    struct mw_ts_index ix;
    if (mw_ts_index_parse((const char *)data, size, "index.json", &ix) == 0) {
        if (ix.n < 1 || ix.n_shards < 1 || ix.n_shards > ix.n) abort();
        for (int k = 0; k < ix.n_shards; k++)
            if (strchr(ix.shard[k], '/') || strstr(ix.shard[k], "..") || !ix.shard[k][0] ||
                (k && strcmp(ix.shard[k - 1], ix.shard[k]) >= 0))
                abort(); /* plain file names, distinct, sorted */
        for (int i = 0; i < ix.n; i++)
            if (ix.shard_of[i] < 0 || ix.shard_of[i] >= ix.n_shards || !ix.name[i][0]) abort();
        mw_ts_index_free(&ix);
    }
    /* the index among its shards */
    (void)fz_write(data, size, MW_TS_INDEX_NAME);
    struct mw_ts s;
    if (mw_ts_open(&s, fz_scratch()) == 0) {
        if (!s.sharded || s.n < 1 || s.n > 4) abort();
        float buf[8];
        for (int i = 0; i < s.n; i++) {
            const struct mw_ts_entry *e = &s.e[i];
            if (mw_ts_find(&s, e->st->name) != e) abort(); /* each name once, found */
            if (e->file < s.files || e->file >= s.files + s.n_files) abort();
            if (e->st->numel > 8 || mw_ts_read_f32(e, 0, e->st->numel, buf) != 0) abort();
        }
        (void)mw_ts_meta(&s, "format");
        mw_ts_close(&s);
    }
    return 0;
}
