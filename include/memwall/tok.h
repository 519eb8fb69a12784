/*
 * memwall/tok.h — a byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2,
 * Llama-3, Qwen2 and other byte-level BPE models): text -> token ids, ids -> bytes.
 *
 * What it does, in Hugging Face's order (docs/tokenizer.md has the details):
 *   1. added tokens (the file's "added_tokens": special ones such as <|endoftext|> and plain
 *      ones) are split out first, longest match leftmost, with their single_word / lstrip /
 *      rstrip options; tokens marked "normalized" are matched after normalization;
 *   2. the normalizer: none, or NFC (Qwen2), or a Sequence of those;
 *   3. the pre-tokenizer: Split steps with the file's own regex (compiled with Oniguruma, the
 *      engine HF tokenizers uses: \p{L}, \p{N} and friends) or a literal string, with any of
 *      HF's five split behaviours, then ByteLevel (with its built-in GPT-2 regex when
 *      use_regex is true, and add_prefix_space): every byte maps to one vocabulary symbol;
 *   4. the BPE model: merges applied lowest rank first (leftmost on a tie), from "a b" strings
 *      or ["a", "b"] pairs; ignore_merges (Llama-3: a word found whole in the vocabulary is
 *      taken as is); unk_token / fuse_unk / byte_fallback;
 *   5. with MW_TOK_ADD_SPECIAL, the post-processor's tokens for a single sequence
 *      (TemplateProcessing such as Llama-3's <|begin_of_text|>, Roberta/Bert, ByteLevel: none).
 * Anything else in the file (a WordPiece or Unigram model, a Metaspace pre-tokenizer, a
 * lowercasing normalizer...) is refused at load with a message naming it; a tokenizer that
 * loads gives HF's ids for every valid UTF-8 text (tests/test_tok.c checks three trained ones
 * element by element).
 *
 * Text is bytes. HF takes a Python str, which is always valid UTF-8; memwall takes any bytes
 * and splits them first into maximal valid UTF-8 runs and single invalid bytes. Each run is
 * encoded exactly as HF encodes it as a string of its own; each invalid byte becomes the token
 * of that byte (byte-level BPE has one for each of the 256 bytes). So decode(encode(x)) == x for
 * every byte string x when the tokenizer has no normalizer and no added token with lstrip or
 * rstrip (which swallow whitespace, as in HF).
 *
 * Decoding maps each id to its bytes: a vocabulary token through the byte-to-unicode map, an
 * added token as its content's UTF-8 bytes. (HF passes added tokens through the byte-level
 * decoder too, which turns an added token such as "café" into "caf\xe9" and then into U+FFFD;
 * memwall gives "café" back. The two agree on every token made of ASCII, e.g. <|endoftext|>.)
 *
 * Errors: 0 or a negative code with mw_error_set; MW_EFORMAT for a file memwall cannot use.
 * A loaded mw_tok_t is read-only except for a word cache: use one handle per thread.
 *
 *     mw_tok_t *t;
 *     if ((rc = mw_tok_load(&t, "llama3/", NULL))) return rc;   // a file, or a dir with tokenizer.json
 *     struct mw_tok_ids ids = {0};
 *     rc = mw_tok_encode(t, text, len, 0, &ids);               // appends to ids.v[0..ids.n)
 *     ...
 *     mw_tok_ids_free(&ids);
 *     mw_tok_free(t);
 */
#ifndef MEMWALL_TOK_H
#define MEMWALL_TOK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mw_tok mw_tok_t;

/* Limits on what a tokenizer.json may declare (hostile input): ids below MW_TOK_MAX_VOCAB, a
 * file of at most MW_TOK_MAX_FILE bytes. */
#define MW_TOK_MAX_VOCAB (1 << 24)
#define MW_TOK_MAX_FILE ((size_t)1 << 30)

/* Loads path: a tokenizer.json, or a directory holding one. what (optional) names it in
 * messages. */
int mw_tok_load(mw_tok_t **out, const char *path, const char *what);
/* The same from the bytes of a tokenizer.json (need not be NUL-terminated). */
int mw_tok_load_json(mw_tok_t **out, const char *json, size_t len, const char *what);
void mw_tok_free(mw_tok_t *t);

/* Number of ids: the largest id of the vocabulary or the added tokens, plus one. */
int32_t mw_tok_vocab_size(const mw_tok_t *t);
/* The id of a token given by its text (an added token's content, or a vocabulary entry as
 * written in the file, e.g. "Ġthe"), or -1. */
int32_t mw_tok_token_id(const mw_tok_t *t, const char *token);
/* 1 when id is an added token marked special. */
int mw_tok_is_special(const mw_tok_t *t, int32_t id);
/* The token llm.c puts before every document: the post-processor's first special token when it
 * adds one (Llama-3: <|begin_of_text|>), else the added token <|endoftext|> (GPT-2, Qwen2);
 * -1 when neither exists. */
int32_t mw_tok_doc_token(const mw_tok_t *t);

/* A growable array of ids. Start from {0}; free with mw_tok_ids_free. */
struct mw_tok_ids {
    int32_t *v;
    size_t n, cap;
};
void mw_tok_ids_free(struct mw_tok_ids *ids);

enum mw_tok_flags {
    MW_TOK_ADD_SPECIAL = 1,   /* encode: add the post-processor's tokens (HF add_special_tokens) */
    MW_TOK_SPLIT_SPECIAL = 2, /* encode: special added tokens in the text are plain text (HF
                                 encode_special_tokens / transformers' split_special_tokens;
                                 what llm.c's data scripts do for documents) */
    MW_TOK_SKIP_SPECIAL = 4,  /* decode: leave special tokens out */
};

/* Encodes text[0..len) (any bytes) and appends the ids to *out. */
int mw_tok_encode(mw_tok_t *t, const char *text, size_t len, unsigned flags, struct mw_tok_ids *out);

/* Appends the bytes of ids[0..n) to *buf (malloc'd, grown as needed; *len and *cap its size
 * and capacity, both 0 with *buf NULL to start). An id outside the vocabulary is -EINVAL. */
int mw_tok_decode_ids(const mw_tok_t *t, const int32_t *ids, size_t n, unsigned flags,
                      char **buf, size_t *len, size_t *cap);

#ifdef __cplusplus
}
#endif
#endif
