/*
 * safetensors.h — private reader/writer of the safetensors format (8-byte little-endian header
 * length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {..}}, then the
 * raw tensor bytes). Used by gpt2_safetensors.c; every header field is validated against the
 * file size before any data is touched, so a truncated or corrupt file is an error, not a crash.
 */
#ifndef MEMWALL_MODEL_SAFETENSORS_H
#define MEMWALL_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum mw_st_dtype { MW_ST_F32, MW_ST_F16, MW_ST_BF16 };

struct mw_st_entry {
    char *name;          /* as in the file */
    int dtype;           /* enum mw_st_dtype */
    int ndim;            /* 0..4 */
    uint64_t shape[4];
    uint64_t numel;
    uint64_t begin, end; /* byte offsets relative to the data section */
};

struct mw_st_file {
    int fd;
    char path[512];
    uint64_t file_size;
    uint64_t data_start; /* 8 + header length */
    int n;
    struct mw_st_entry *e;
    int n_meta;
    char **meta_key, **meta_val;
};

/* Opens and validates. 0, -errno, or MW_EFORMAT; message set. Entries with unsupported dtypes
 * are still listed but with dtype -1 (reading them fails). */
int mw_st_open(struct mw_st_file *f, const char *path);
void mw_st_close(struct mw_st_file *f);
const struct mw_st_entry *mw_st_find(const struct mw_st_file *f, const char *name);
const char *mw_st_meta(const struct mw_st_file *f, const char *key);
/* Reads n_elems elements starting at element `first` of entry e as fp32 into dst. */
int mw_st_read_f32(const struct mw_st_file *f, const struct mw_st_entry *e, uint64_t first,
                   uint64_t n_elems, float *dst);

/* Writes n fp32 tensors and string metadata to path (atomically: mw_atomic_open/commit, memwall/fsutil.h). */
struct mw_st_out {
    const char *name;
    int ndim;
    uint64_t shape[2];
    const float *data;   /* shape[0] * shape[1] (ndim 1: shape[0]) elements */
};
int mw_st_write_f32(const char *path, const struct mw_st_out *t, int n, const char *const *meta_kv,
                    int n_meta);
/* The same, calling data_fn(user, i) before tensor i's data is read (and once more with i = n
 * at the end), so a caller can bring weights in a piece at a time; non-zero ends the write. */
typedef int (*mw_st_data_fn)(void *user, int i);
int mw_st_write_f32_cb(const char *path, const struct mw_st_out *t, int n, const char *const *meta_kv,
                       int n_meta, mw_st_data_fn data_fn, void *user);

#endif
