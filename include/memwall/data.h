/*
 * memwall/data.h — training data: a byte-level tokenizer, llm.c's pre-tokenised .bin
 * shards, seeded random training batches and a fixed held-out validation split.
 *
 * Why this shape: the training loop only ever needs "B windows of T+1 consecutive tokens".
 * Everything the loader opens (a text file, one shard, a directory of shards or texts) is
 * turned into a list of token segments (shards memory-mapped in place, text converted once
 * to uint16 in memory), each cut into a training part and a validation part. A training
 * window is drawn uniformly over all training windows of all segments from a caller-owned
 * 64-bit RNG state, so a run is deterministic given the seed and resumable from that one
 * word. Validation windows are a fixed, non-overlapping tiling of the validation parts, so
 * every evaluation of a run sees the same tokens.
 *
 * Shard format (llm.c, version 1): 256 little-endian int32 header words — [0] = 20240520
 * (magic), [1] = 1 (version: uint16 tokens), [2] = token count — then that many uint16
 * tokens; the file size must be exactly 1024 + 2 * count. Anything else is MW_EFORMAT.
 *
 * Byte tokenizer: token = byte value (0..255), plus MW_TOK_EOT = 256 written before each
 * text document; vocabulary 257.
 */
#ifndef MEMWALL_DATA_H
#define MEMWALL_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MW_SHARD_MAGIC 20240520
#define MW_SHARD_VERSION 1
#define MW_SHARD_HEADER_INTS 256
#define MW_SHARD_HEADER_BYTES (MW_SHARD_HEADER_INTS * 4)

enum { MW_TOK_EOT = 256, MW_TOK_BYTE_VOCAB = 257 };

/* What the tokens mean. Text is tokenized by bytes; shards carry ids of some tokenizer we
 * may not have (GPT-2 BPE for llm.c's shards), so they can be trained on but not decoded. */
enum mw_tokenizer { MW_TOKENIZER_BYTES = 0, MW_TOKENIZER_IDS = 1 };

/* ---- byte tokenizer ---- */

/* Writes n tokens (the bytes of text) to out[0..n). */
void mw_tok_encode_bytes(const uint8_t *text, size_t n, uint16_t *out);
/* Human text of one token for printing: the byte itself for 0..255 (as a 1-byte string),
 * "\n<|endoftext|>\n" for MW_TOK_EOT, "<id>" for anything else. buf needs >= 24 bytes.
 * Returns the number of bytes written (not NUL-terminated counts; buf is NUL-terminated). */
size_t mw_tok_decode(int token, char *buf, size_t n);

/* ---- shards ---- */

/* Writes tokens[0..n) as a version-1 shard at path (through path.tmp + rename, so a
 * crash never leaves a half-written shard under the final name). */
int mw_shard_write(const char *path, const uint16_t *tokens, size_t n);

/* ---- dataset ---- */

struct mw_data_segment {
    const uint16_t *tok;   /* tokens [0, n) */
    size_t n;              /* tokens */
    size_t train_end;      /* [0, train_end) train, [train_end, n) validation */
    uint64_t base;         /* global token index of tok[0] (sum of previous segments' n) */
    void *map;             /* mmap of a shard (NULL for text) */
    size_t map_len;        /* bytes */
    uint16_t *owned;       /* malloc'd tokens of a text file (NULL for shards) */
};

struct mw_data_opts {
    double val_frac;       /* fraction of each segment held out at its end (default 0.1);
                              ignored for segments whose file name contains "val", which
                              are all validation (llm.c's *_val_*.bin convention) */
};

struct mw_data {
    struct mw_data_segment *seg;
    int nseg;
    enum mw_tokenizer tokenizer;
    uint64_t n_tokens;       /* all segments */
    uint64_t n_train_tokens; /* sum of train parts */
    uint64_t n_val_tokens;   /* sum of validation parts */
    int max_token;           /* largest token id seen (vocabulary must exceed it): all of a
                                text; the first 2^20 tokens of each shard */
    char path[512];          /* what was opened, for messages */
};

/* Defaults for mw_data_opts. */
void mw_data_opts_default(struct mw_data_opts *o);

/* Opens a text file, a shard, or a directory of either kind (not mixed; files sorted by
 * name; hidden files and sub-directories skipped; text = any file not ending in .bin).
 * Each file is opened once and must be a regular file (symbolic links are followed): a FIFO,
 * a device or a socket — as the path or inside the directory — is -EINVAL with the path and
 * its kind in the message, never waited on (the data is read again on resume and by every
 * rank, which a stream cannot give).
 * Errors: -ENOENT and friends with the path in the message; MW_EFORMAT for a bad shard. */
int mw_data_open(struct mw_data *d, const char *path, const struct mw_data_opts *o);
void mw_data_free(struct mw_data *d);

/* 0 if the data can feed windows of T+1 tokens for both training and validation, else
 * -EINVAL with a message naming the shortfall. */
int mw_data_check(const struct mw_data *d, int T);

/* Number of distinct training windows of T+1 tokens (start positions), and of the fixed
 * validation windows (non-overlapping, stride T+1). */
uint64_t mw_data_train_windows(const struct mw_data *d, int T);
uint64_t mw_data_val_windows(const struct mw_data *d, int T);

/* Fills inputs and targets, both (B, T) row-major, with B windows drawn uniformly from all
 * training windows using *rng (advanced by exactly B draws). starts (optional, B entries)
 * receives each window's global token index. Requires mw_data_check(d, T) == 0. */
void mw_data_train_batch(const struct mw_data *d, uint64_t *rng, int B, int T,
                         int32_t *inputs, int32_t *targets, uint64_t *starts);

/* Validation batch k: windows (k*B + b) mod mw_data_val_windows(d, T), b in [0, B). */
void mw_data_val_batch(const struct mw_data *d, uint64_t k, int B, int T,
                       int32_t *inputs, int32_t *targets, uint64_t *starts);

/* ---- the RNG every seeded part of training uses (splitmix64) ---- */

static inline uint64_t mw_rng_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, n) (n > 0), by a 128-bit multiply. */
static inline uint64_t mw_rng_below(uint64_t *s, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)mw_rng_u64(s) * n) >> 64);
}
/* Uniform float in [0, 1) with 24 bits. */
static inline float mw_rng_f32(uint64_t *s)
{
    return (float)(mw_rng_u64(s) >> 40) * (1.0f / 16777216.0f);
}

#ifdef __cplusplus
}
#endif
#endif
