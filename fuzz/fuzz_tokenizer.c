/*
 * fuzz_tokenizer.c — a Hugging Face tokenizer.json (mw_tok_load: JSON, vocabulary, merges, added
 * tokens, normalizer, regex pre-tokenizer, post-processor) and, when it loads, an encode and a
 * decode of a text through it. Input layout: byte 0 = k; the last k % 97 bytes are the text
 * (any bytes, often not UTF-8), the bytes between are the file. Every id encode gives must be
 * inside the vocabulary and decode must take it back.
 */
#include "fuzz.h"
#include "memwall/tok.h"

static void run(mw_tok_t *t, const char *text, size_t n, unsigned flags)
{
    struct mw_tok_ids ids = {0};
    if (mw_tok_encode(t, text, n, flags, &ids) == 0) {
        for (size_t i = 0; i < ids.n; i++)
            if (ids.v[i] < 0 || ids.v[i] >= mw_tok_vocab_size(t)) abort();
        char *out = NULL;
        size_t len = 0, cap = 0;
        if (mw_tok_decode_ids(t, ids.v, ids.n, flags & MW_TOK_SKIP_SPECIAL, &out, &len, &cap) != 0) abort();
        free(out);
    }
    mw_tok_ids_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    fz_scratch(); /* silences logging */
    if (size < 1) return 0;
    size_t tl = MW_MIN((size_t)d[0] % 97, size - 1);
    const char *json = (const char *)d + 1, *text = (const char *)d + size - tl;
    mw_tok_t *t = NULL;
    if (mw_tok_load_json(&t, json, size - 1 - tl, "fuzz") != 0) return 0;
    static const char mixed[] = "Hello, world! It's 2024: 12345 <|endoftext|> caf\xc3\xa9 e\xcc\x81 \xe4\xb8\xad\xe6\x96\x87 "
                                "\xf0\x9f\x98\x80  \t\n\n x\xff\xfe";
    run(t, text, tl, d[0] & 3);
    run(t, mixed, sizeof mixed - 1, MW_TOK_ADD_SPECIAL | MW_TOK_SKIP_SPECIAL);
    if (mw_tok_doc_token(t) >= mw_tok_vocab_size(t)) abort();
    mw_tok_free(t);
    return 0;
}
