/*
 * tensor_source.h — where a model's weights come from: one safetensors file, or a sharded
 * checkpoint (what transformers' save_pretrained(max_shard_size=...) writes: DIR/
 * model.safetensors.index.json, {"metadata": {...}, "weight_map": {"tensor": "shard file", ...}},
 * and the shard files beside it). Both look the same to a loader: a list of tensors, each with
 * its header entry (safetensors.h) and the file it lives in, found by name and read as fp32.
 *
 * The path a loader is given (the families' load_safetensors / loader_open, the trainer's
 * init_safetensors) may be:
 *   - a safetensors file                    one file;
 *   - a file whose name ends ".index.json"  that index and its shards;
 *   - a directory                           DIR/model.safetensors when it exists (preferred even
 *                                           beside an index, as transformers' from_pretrained
 *                                           does), else DIR/model.safetensors.index.json.
 * mw_net_hf_weights (memwall/model.h) turns an --init-hf DIR into such a path.
 *
 * Usage:
 *     struct mw_ts s;
 *     if ((err = mw_ts_open(&s, path))) return err;          // message names the file and key
 *     const struct mw_ts_entry *e = mw_ts_find(&s, "model.norm.weight");
 *     if (e) err = mw_ts_read_f32(e, 0, e->st->numel, dst);
 *     mw_ts_close(&s);
 */
#ifndef MEMWALL_MODEL_TENSOR_SOURCE_H
#define MEMWALL_MODEL_TENSOR_SOURCE_H

#include "safetensors.h"

#include <stddef.h>
#include <stdint.h>

#define MW_TS_INDEX_NAME "model.safetensors.index.json"
#define MW_TS_MAX_INDEX_BYTES (64u << 20) /* DeepSeek-V3's index (~91k tensors) is ~9 MB */
#define MW_TS_MAX_TENSORS (1 << 21)
#define MW_TS_MAX_SHARDS 4096             /* each shard stays open (one descriptor) while loading */
#define MW_TS_MAX_SHARD_NAME 255          /* a file name, not a path */

struct mw_ts_entry {
    const struct mw_st_entry *st;  /* name, dtype, shape, byte range within its file */
    const struct mw_st_file *file; /* the file that holds it (one of the source's files) */
};

struct mw_ts {
    char path[1024];      /* what messages name: the safetensors file, or the index */
    char dir[1024];       /* the directory of the files (config.json is looked for there) */
    int sharded;          /* 1: an index and its shards */
    int n_files;
    struct mw_st_file *files;            /* [n_files] each validated by mw_st_open */
    int n;
    struct mw_ts_entry *e;               /* [n] file by file, each in its header's order */
    const struct mw_ts_entry **by_name;  /* [n] sorted by name (names are unique) */
};

/* Opens path (above) and validates everything: each file's header (mw_st_open), and for an
 * index, its JSON against its shards: every tensor it names is in the shard it names, every
 * tensor of those shards is named, none twice. 0, -errno or MW_EFORMAT, message set. */
int mw_ts_open(struct mw_ts *s, const char *path);
void mw_ts_close(struct mw_ts *s); /* safe on a closed or zeroed source */
const struct mw_ts_entry *mw_ts_find(const struct mw_ts *s, const char *name); /* NULL: absent */
/* A __metadata__ value: the single file's, or the first shard's (in name order) that has key. */
const char *mw_ts_meta(const struct mw_ts *s, const char *key);
/* n elements from element `first` of e, as fp32 (mw_st_read_f32 on the file that holds it). */
int mw_ts_read_f32(const struct mw_ts_entry *e, uint64_t first, uint64_t n, float *dst);

/* The index alone, parsed and checked from memory (no file is opened: mw_ts_open cross-checks
 * the shards; fuzz/fuzz_safetensors_index.c drives both). path names the index in messages. */
struct mw_ts_index {
    int n_shards;
    char **shard;   /* [n_shards] distinct shard file names, sorted */
    int n;
    char **name;    /* [n] tensor names, in the index's order */
    int *shard_of;  /* [n] the shard (into shard[]) of each tensor */
};
int mw_ts_index_parse(const char *text, size_t len, const char *path, struct mw_ts_index *ix);
void mw_ts_index_free(struct mw_ts_index *ix);

#endif
