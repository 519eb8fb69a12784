/*
 * cmd_tokenize.c — `memwall tokenize --tokenizer FILE|DIR [INPUT]`: the ids of a text under a
 * Hugging Face byte-level BPE tokenizer (src/tok/, docs/tokenizer.md), printed on one line,
 * separated by spaces; `--decode` turns ids (whitespace separated) back into bytes.
 *
 * INPUT is a file, or "-" (the default) for standard input; --text gives the text inline. No
 * special token is added unless --add-special asks for the post-processor's (Llama-3's
 * <|begin_of_text|>); special tokens written in the text are recognised unless --split-special.
 * --time prints the encode (or decode) throughput on stderr, the tokenizer's loading excluded
 * (bench/tok_vs_hf.sh reads it).
 *
 * Exit codes: 0 ok; 1 the tokenizer or the input could not be read or used; 2 usage.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/tok.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* All of standard input (any size; a pipe is fine here: it is read once). */
static int read_stdin(char **out, size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    if (!b) return mw_error_set(-ENOMEM, "no memory");
    for (;;) {
        if (len == cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(b, cap * 2);
            if (!nb) { free(b); return mw_error_set(-ENOMEM, "no memory for %zu bytes of standard input", cap * 2); }
            b = nb;
            cap *= 2;
        }
        ssize_t k = read(STDIN_FILENO, b + len, cap - len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { int e = errno; free(b); return mw_error_set(-e, "cannot read standard input: %s", strerror(e)); }
        if (k == 0) break;
        len += (size_t)k;
    }
    *out = b;
    *n = len;
    return 0;
}

/* Parses whitespace-separated decimal ids. */
static int parse_ids(const char *s, size_t n, const char *what, struct mw_tok_ids *ids)
{
    size_t i = 0;
    while (i < n) {
        if (isspace((unsigned char)s[i])) { i++; continue; }
        size_t start = i;
        int64_t v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9' && v <= INT32_MAX) v = v * 10 + (s[i++] - '0');
        if (i == start || v > INT32_MAX || (i < n && !isspace((unsigned char)s[i])))
            return mw_error_set(-EINVAL, "%s: '%.*s' at byte %zu is not a token id (a whole number, ids separated by "
                                "whitespace)", what, (int)MW_MIN(n - start, (size_t)20), s + start, start);
        if (ids->n == ids->cap) {
            size_t cap = ids->cap ? 2 * ids->cap : 1024;
            int32_t *v2 = realloc(ids->v, cap * sizeof *v2);
            if (!v2) return mw_error_set(-ENOMEM, "no memory for %zu ids", cap);
            ids->v = v2;
            ids->cap = cap;
        }
        ids->v[ids->n++] = (int32_t)v;
    }
    return 0;
}

/* Writes the ids as decimal text, one line. */
static int print_ids(const struct mw_tok_ids *ids, FILE *f)
{
    char buf[1 << 16];
    size_t o = 0;
    for (size_t i = 0; i < ids->n; i++) {
        if (o > sizeof buf - 16) {
            if (fwrite(buf, 1, o, f) != o) return -EIO;
            o = 0;
        }
        o += (size_t)snprintf(buf + o, sizeof buf - o, i ? " %d" : "%d", ids->v[i]);
    }
    buf[o++] = '\n';
    return fwrite(buf, 1, o, f) == o ? 0 : -EIO;
}

int mw_cmd_tokenize(int argc, char **argv)
{
    const char *tokenizer = NULL, *text = NULL;
    int decode = 0, add_special = 0, split_special = 0, skip_special = 0, timing = 0, count = 0;
    const struct mw_opt opts[] = {
        {"tokenizer", MW_OPT_STRING, &tokenizer, "FILE|DIR", "a Hugging Face tokenizer.json, or a directory holding "
         "one (required)", 0, 0, NULL},
        {"text", MW_OPT_STRING, &text, "TEXT", "tokenize TEXT instead of reading INPUT", 0, 0, NULL},
        {"decode", MW_OPT_FLAG, &decode, NULL, "read token ids (whitespace separated) and write their bytes", 0, 0, NULL},
        {"add-special", MW_OPT_FLAG, &add_special, NULL, "add the post-processor's special tokens, as HF's "
         "add_special_tokens=True (Llama-3: <|begin_of_text|> first; GPT-2, Qwen2: none)", 0, 0, NULL},
        {"split-special", MW_OPT_FLAG, &split_special, NULL, "encode special tokens written in the text as plain text "
         "(HF's split_special_tokens; what memwall data does)", 0, 0, NULL},
        {"skip-special", MW_OPT_FLAG, &skip_special, NULL, "--decode: leave special tokens out", 0, 0, NULL},
        {"count", MW_OPT_FLAG, &count, NULL, "print the number of tokens instead of the ids", 0, 0, NULL},
        {"time", MW_OPT_FLAG, &timing, NULL, "print bytes, tokens and throughput (MB/s, tokenizer loading excluded) "
         "on stderr", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {
        "tokenize", "[INPUT]",
        "Token ids of a text under a Hugging Face byte-level BPE tokenizer (tokenizer.json: GPT-2, Llama-3, Qwen2 "
        "and the like), printed on one line separated by spaces: the ids HF tokenizers gives for the same text. "
        "INPUT is a file or - for standard input (the default). Bytes that are not valid UTF-8 become one byte token "
        "each (docs/tokenizer.md). With --decode, INPUT holds ids and their bytes are written to standard output.",
        opts, MW_NOPTS(opts), 0, 1};
    char *pos[1];
    int npos = 0;
    int rc = mw_opts_parse(&spec, argc, argv, pos, &npos);
    if (rc) return rc == MW_OPTS_HELP ? 0 : 2;
    if (!tokenizer) {
        fprintf(stderr, "memwall tokenize: --tokenizer FILE|DIR is required\nrun 'memwall tokenize --help' for the options\n");
        return 2;
    }
    if (text && npos) {
        fprintf(stderr, "memwall tokenize: give --text or INPUT, not both\n");
        return 2;
    }
    if (skip_special && !decode) {
        fprintf(stderr, "memwall tokenize: --skip-special goes with --decode\n");
        return 2;
    }
    if (decode && (add_special || split_special || count)) {
        fprintf(stderr, "memwall tokenize: --add-special, --split-special and --count go with encoding, not --decode\n");
        return 2;
    }
    mw_tok_t *t = NULL;
    int err = mw_tok_load(&t, tokenizer, NULL);
    if (err) { mw_cli_fail("loading the tokenizer", err); return 1; }
    char *in = NULL;
    size_t n = 0;
    const char *src = text ? "--text" : npos && strcmp(pos[0], "-") ? pos[0] : "standard input";
    if (text) n = strlen(text);
    else if (npos && strcmp(pos[0], "-")) err = mw_read_small_file(pos[0], "input", SIZE_MAX, &in, &n);
    else err = read_stdin(&in, &n);
    if (err) { mw_cli_fail("reading the input", err); mw_tok_free(t); return 1; }
    const char *data = text ? text : in;
    struct mw_tok_ids ids = {0};
    char *out = NULL;
    size_t out_len = 0, out_cap = 0;
    uint64_t t0 = mw_now_ns();
    if (decode) {
        err = parse_ids(data, n, src, &ids);
        if (!err) err = mw_tok_decode_ids(t, ids.v, ids.n, skip_special ? MW_TOK_SKIP_SPECIAL : 0, &out, &out_len, &out_cap);
    } else {
        err = mw_tok_encode(t, data, n, (add_special ? MW_TOK_ADD_SPECIAL : 0) | (split_special ? MW_TOK_SPLIT_SPECIAL : 0),
                            &ids);
    }
    double secs = (double)(mw_now_ns() - t0) * 1e-9;
    if (err) {
        mw_cli_fail(decode ? "decoding" : "tokenizing", err);
        rc = 1;
        goto out;
    }
    if (decode) rc = out_len && fwrite(out, 1, out_len, stdout) != out_len;
    else if (count) rc = printf("%zu\n", ids.n) < 0;
    else rc = print_ids(&ids, stdout) != 0;
    if (fflush(stdout) != 0) rc = 1;
    if (rc) fprintf(stderr, "memwall tokenize: writing the output failed: %s\n", strerror(errno));
    if (timing)
        fprintf(stderr, "memwall tokenize: %zu bytes, %zu tokens in %.3f s: %.2f MB/s\n", decode ? out_len : n, ids.n,
                secs, (double)(decode ? out_len : n) / 1e6 / (secs > 0 ? secs : 1e-9));
out:
    mw_tok_ids_free(&ids);
    free(out);
    free(in);
    mw_tok_free(t);
    return rc;
}
