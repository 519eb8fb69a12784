/*
 * memwall/data.h — training data: a byte-level tokenizer, llm.c's pre-tokenised .bin
 * shards (and writing them from text with a Hugging Face tokenizer, memwall/tok.h), seeded
 * random training batches and a fixed held-out validation split.
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
 * Shard formats (llm.c's): 256 little-endian int32 header words — [0] magic, [1] version,
 * [2] token count, the rest reserved (written 0, not read) — then that many tokens:
 *   magic 20240520, version 1: uint16 tokens (GPT-2 and any vocabulary of at most 65536 ids);
 *   magic 20240801, version 7: uint32 tokens (Llama-3 and larger vocabularies; llm.c's
 *                              data_common.py writes this pair for its "llama-3" model).
 * The file size must be exactly 1024 + width * count (computed with overflow checks); any other
 * magic, version or size is MW_EFORMAT naming the file. One directory holds one kind of shard.
 * A uint32 token above INT32_MAX is read as INT32_MAX (no model has that many ids, so the
 * vocabulary checks refuse it by its size instead of it wrapping to a small id).
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
#define MW_SHARD32_MAGIC 20240801
#define MW_SHARD32_VERSION 7
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
/* Writes tokens[0..n) as a uint16 version-1 shard (wide = 0: every token must be below 65536,
 * else -ERANGE) or a uint32 version-7 shard (wide = 1), the same way. */
int mw_shard_write_ids(const char *path, const uint32_t *tokens, size_t n, int wide);

/* ---- preparing shards from text (memwall data) ---- */

struct mw_tok; /* memwall/tok.h */
struct mw_data_prep_stats;

struct mw_data_prep_opts {
    const char *out_dir;      /* created if missing; must not hold shards of this name already */
    const char *name;         /* shard names: <name>_train_NNNNNN.bin, <name>_val_NNNNNN.bin */
    double val_frac;          /* the first val_frac of the input bytes go to validation, [0, 1) */
    uint64_t shard_tokens;    /* tokens per shard, [1, INT32_MAX] (the last of each split is shorter) */
    int32_t doc_token;        /* written before every document; -1: mw_tok_doc_token */
    /* Called after each shard written and about once a second (optional). */
    void (*progress)(const struct mw_data_prep_stats *s, void *user);
    void *user;
};

struct mw_data_prep_stats {
    uint64_t bytes_total;     /* of all input files */
    uint64_t bytes_done;
    uint64_t docs;
    uint64_t train_tokens, val_tokens;
    int train_shards, val_shards;
    int wide;                 /* 1: uint32 shards (vocabulary over 65536 ids) */
    int32_t doc_token;
    char last_shard[1024];    /* the shard written last ("" before the first) */
};

/* Defaults: name "data", val_frac 0.1, shard_tokens 10^8 (llm.c's), doc_token -1. */
void mw_data_prep_opts_default(struct mw_data_prep_opts *o);

/* Tokenizes inputs[0..n) with tok into shards, as llm.c's data scripts do: every document is the
 * document token followed by its ids (special tokens in the text are encoded as text, so a
 * document cannot forge one); uint16 shards when the vocabulary has at most 65536 ids, else
 * uint32 (version 7). An input is a file or a directory (its regular, non-hidden files, sorted by
 * name; sub-directories skipped); a file named *.jsonl holds one JSON object per line whose
 * "text" string is a document, any other file is one document. Documents are taken in order, and
 * the first val_frac of the input bytes go to validation (a document across the boundary is cut
 * at the token in the same proportion), the rest to training. Each file is read whole.
 * On failure shards already written stay (complete, each written atomically); the message names
 * the file, and for JSONL the line. */
int mw_data_prepare(struct mw_tok *tok, const char *const *inputs, int n, const struct mw_data_prep_opts *o,
                    struct mw_data_prep_stats *st);

/* ---- dataset ---- */

struct mw_data_segment {
    const uint16_t *tok;   /* tokens [0, n): uint16 shards and text; NULL for a uint32 shard ... */
    const uint32_t *tok32; /* ... whose tokens are here (use mw_data_seg_token for either) */
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
                                text; the first 2^20 tokens of each shard (uint32 ids above
                                INT32_MAX count as INT32_MAX) */
    int wide;                /* 1: uint32 shards (version 7) */
    char path[512];          /* what was opened, for messages */
};

/* Token i of a segment, whichever width it is stored in. */
static inline uint32_t mw_data_seg_token(const struct mw_data_segment *s, size_t i)
{
    return s->tok32 ? s->tok32[i] : s->tok[i];
}

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
