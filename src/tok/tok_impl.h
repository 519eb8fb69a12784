/*
 * tok_impl.h — the inside of mw_tok_t, shared by the files of src/tok/ only:
 *   tok.c     loading tokenizer.json (cJSON), encode/decode, the post-processor;
 *   pretok.c  the stages before the model: UTF-8 runs, added tokens, Split / ByteLevel steps
 *             (Oniguruma);
 *   bpe.c     the BPE model: vocabulary and merge tables, the merge loop, the word cache;
 *   nfc.c     the NFC normalizer (tables in nfc_table.h, generated).
 *
 * Byte-level BPE works on bytes here, not on the byte-to-unicode characters of the file: at load
 * every vocabulary string is mapped back to the bytes it stands for (tok_bytes), so a
 * pre-tokenized word (raw bytes) is looked up without building its "Ġ..." spelling, and decoding
 * is a table copy. Strings that are not made of byte-level characters (an added token's content,
 * a stray entry) keep their UTF-8 bytes: they can never come out of the merges, only be decoded.
 */
#ifndef MEMWALL_TOK_IMPL_H
#define MEMWALL_TOK_IMPL_H

#include "memwall/tok.h"

#include <stddef.h>
#include <stdint.h>

/* ---- hash tables (bpe.c) ---- */

/* Byte strings (stored in a caller-owned arena: offset + length) -> int32 value. */
struct tok_strmap {
    uint64_t *slot;   /* [cap]: (off << 24 | len) + 1, 0 = empty; len < 2^24 */
    int32_t *val;     /* [cap] */
    uint32_t *hash;   /* [cap] */
    size_t cap, n;    /* cap a power of two, n <= cap / 2 */
};
/* (a, b) id pairs -> (rank, new id). */
struct tok_pairmap {
    uint64_t *key;    /* [cap]: a << 32 | b, UINT64_MAX = empty */
    uint64_t *val;    /* [cap]: rank << 32 | new id */
    size_t cap, n;
};

uint32_t tok_hash_bytes(const void *p, size_t n);
int tok_strmap_init(struct tok_strmap *m, size_t expect);
void tok_strmap_free(struct tok_strmap *m);
/* Inserts (or overwrites) key = arena[off, off + len). */
int tok_strmap_put(struct tok_strmap *m, const char *arena, size_t off, size_t len, int32_t v);
/* The value of key, or -1. */
int32_t tok_strmap_get(const struct tok_strmap *m, const char *arena, const void *key, size_t len);
int tok_pairmap_init(struct tok_pairmap *m, size_t expect);
void tok_pairmap_free(struct tok_pairmap *m);
int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
/* 1 and *rank, *id when the pair merges. */
int tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id);

/* ---- pre-tokenizer steps (pretok.c) ---- */

enum tok_split_behavior {
    TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT, TOK_SPLIT_CONTIGUOUS,
};
enum tok_step_kind { TOK_STEP_REGEX, TOK_STEP_STRING, TOK_STEP_BYTELEVEL };
struct tok_step {
    enum tok_step_kind kind;
    void *re;                       /* regex_t * (Oniguruma): REGEX, and BYTELEVEL with use_regex */
    char *lit;                      /* STRING: the literal */
    size_t lit_len;
    enum tok_split_behavior behavior;
    int invert;
    int add_prefix_space;           /* BYTELEVEL */
};
#define TOK_MAX_STEPS 16

/* Compiles pattern[0..len) (UTF-8, HF's Oniguruma syntax); *re receives a regex_t *. */
int tok_regex_compile(void **re, const char *pattern, size_t len, const char *what);
void tok_regex_free(void *re);
/* The GPT-2 pattern ByteLevel uses when use_regex is true. */
extern const char tok_gpt2_pattern[];

/* ---- the tokenizer ---- */

struct tok_added {
    char *content;       /* UTF-8 as in the file */
    size_t len;
    char *norm;          /* normalized content (== content without a normalizer) */
    size_t norm_len;
    int32_t id;
    unsigned char special, lstrip, rstrip, single_word, normalized;
};

struct tok_cache; /* bpe.c */

struct mw_tok {
    char what[256];                 /* for messages */
    /* Vocabulary: id -> bytes for decoding, bytes -> id for the model. */
    int32_t n_ids;                  /* max id + 1 over vocabulary and added tokens */
    char *arena;                    /* every token's bytes, back to back */
    size_t arena_len, arena_cap;
    uint64_t *id_span;              /* [n_ids]: off << 24 | len of the decoded bytes; UINT64_MAX = no token */
    struct tok_strmap by_text;      /* file spelling -> id (vocabulary and added tokens), in text_arena */
    char *text_arena;
    size_t text_len, text_cap;
    struct tok_strmap by_bytes;     /* byte-level vocabulary entries: bytes -> id, in arena */
    struct tok_pairmap merges;
    int32_t byte_id[256];           /* the vocabulary id of each single byte, -1 if absent */
    int32_t fallback_ids[256][2];   /* byte_fallback: the "<0xXX>" ids of the byte's character ... */
    unsigned char fallback_n[256];  /* ... how many (0: none, or byte_fallback off) */
    int32_t unk_id;                 /* -1: none */
    int fuse_unk, byte_fallback, ignore_merges;
    /* Added tokens. */
    struct tok_added *added;
    int n_added;
    int32_t *added_order[2];        /* pass 0 (raw content) and 1 (normalized): indices into added, */
    uint32_t added_first[2][257];   /* by first byte [added_first[c], added_first[c+1]), longest first */
    unsigned char *is_special;      /* [n_ids] */
    /* Normalizer. */
    int nfc;
    /* Pre-tokenizer: steps[0..nsteps), the last one ByteLevel. */
    struct tok_step steps[TOK_MAX_STEPS];
    int nsteps;
    /* Post-processor for a single sequence: prefix + ids + suffix. */
    int32_t post_prefix[8], post_suffix[8];
    int n_prefix, n_suffix;
    char post_unsupported[128];     /* non-empty: why MW_TOK_ADD_SPECIAL is refused */
    /* Scratch and cache (the reason a handle is single-threaded). */
    struct tok_cache *cache;
    struct tok_scratch *scratch;
};

/* pretok.c: the whole encode of one tokenizer (flags as mw_tok_encode). */
int tok_encode_text(mw_tok_t *t, const char *text, size_t len, unsigned flags, struct mw_tok_ids *out);
void tok_scratch_free(struct tok_scratch *s);
/* The Unicode classes added tokens use (single_word, lstrip, rstrip): HF's \w and \s. */
int tok_is_word_cp(uint32_t cp);
int tok_is_space_cp(uint32_t cp);
/* Length of the valid UTF-8 sequence at s[0..n) and its code point, or 0 when s[0] does not
 * start one (overlong, surrogate, > U+10FFFF, truncated). */
size_t tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

/* bpe.c: appends the ids of one pre-tokenized word (raw bytes). */
int tok_bpe_word(mw_tok_t *t, const unsigned char *w, size_t n, struct mw_tok_ids *out);
int tok_ids_push(struct mw_tok_ids *ids, int32_t id);
int tok_cache_new(struct tok_cache **c);
void tok_cache_free(struct tok_cache *c);

/* nfc.c: NFC of valid UTF-8 s[0..n) into *out (malloc'd, *out_len bytes); *out NULL with 0
 * returned when s is already NFC (the common case, found without copying). */
int tok_nfc(const char *s, size_t n, char **out, size_t *out_len);

#endif
