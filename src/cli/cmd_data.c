/*
 * cmd_data.c — `memwall data --tokenizer FILE|DIR --out DIR FILE|DIR...`: text files (one
 * document each) and JSONL files (a document per line, its "text") tokenized into llm.c .bin
 * shards that `memwall train --data DIR` reads: uint16 shards (version 1) for a vocabulary of
 * at most 65536 ids, uint32 (version 7) above. The work is mw_data_prepare (src/data/prepare.c);
 * this file parses, reports progress on stderr and prints the summary.
 *
 * Exit codes: 0 ok; 1 the tokenizer, an input or a shard could not be read or written; 2 usage.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/common.h"
#include "memwall/data.h"
#include "memwall/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct progress {
    uint64_t t0;
    int shards_seen;
};

static void report(const struct mw_data_prep_stats *s, void *user)
{
    struct progress *p = user;
    double secs = (double)(mw_now_ns() - p->t0) * 1e-9;
    char a[32], b[32];
    int shards = s->train_shards + s->val_shards;
    if (shards != p->shards_seen) {
        p->shards_seen = shards;
        fprintf(stderr, "memwall data: wrote %s\n", s->last_shard);
        return;
    }
    fprintf(stderr, "memwall data: %s of %s read (%.0f%%), %llu documents, %llu tokens, %.2f MB/s\n",
            mw_fmt_bytes(a, sizeof a, s->bytes_done), mw_fmt_bytes(b, sizeof b, s->bytes_total),
            s->bytes_total ? 100.0 * (double)s->bytes_done / (double)s->bytes_total : 100.0,
            (unsigned long long)s->docs, (unsigned long long)(s->train_tokens + s->val_tokens),
            (double)s->bytes_done / 1e6 / (secs > 0 ? secs : 1e-9));
}

int mw_cmd_data(int argc, char **argv)
{
    struct mw_data_prep_opts o;
    mw_data_prep_opts_default(&o);
    const char *tokenizer = NULL, *doc_token = NULL;
    int64_t shard_tokens = (int64_t)o.shard_tokens;
    int quiet = 0;
    const struct mw_opt opts[] = {
        {"tokenizer", MW_OPT_STRING, &tokenizer, "FILE|DIR", "a Hugging Face tokenizer.json, or a directory holding "
         "one (required)", 0, 0, NULL},
        {"out", MW_OPT_STRING, &o.out_dir, "DIR", "where the shards go (created; must not hold shards of --name "
         "already) (required)", 0, 0, NULL},
        {"name", MW_OPT_STRING, &o.name, "NAME", "shard names: NAME_val_000000.bin, NAME_train_000000.bin, ...", 0, 0, NULL},
        {"val-fraction", MW_OPT_DOUBLE, &o.val_frac, "F", "the first F of the input bytes go to the validation shards "
         "(0: none; memwall train then holds out each shard's tail)", 0, 0.99, NULL},
        {"shard-tokens", MW_OPT_INT, &shard_tokens, "N", "tokens per shard (llm.c's default)", 1, 2147483647.0, NULL},
        {"doc-token", MW_OPT_STRING, &doc_token, "TOKEN", "the token written before every document (default: the "
         "BOS the post-processor adds, e.g. Llama-3's <|begin_of_text|>, else <|endoftext|>)", 0, 0, NULL},
        {"quiet", MW_OPT_FLAG, &quiet, NULL, "no progress on stderr", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {
        "data", "FILE|DIR...",
        "Tokenizes text into llm.c .bin shards for memwall train --data DIR, as llm.c's data scripts do: every "
        "document is the document token and then its ids (special tokens inside the text are encoded as text). A "
        "FILE is one document, or one per line when it is *.jsonl (the line's \"text\"); a DIR stands for its files, "
        "sorted. Shards are uint16 (magic 20240520, version 1) for a vocabulary of at most 65536 ids, else uint32 "
        "(magic 20240801, version 7). The first --val-fraction of the input bytes become NAME_val_*.bin, the rest "
        "NAME_train_*.bin.",
        opts, MW_NOPTS(opts), 1, MW_MAX(1, argc)};
    char **pos = calloc((size_t)MW_MAX(1, argc), sizeof *pos);
    if (!pos) { fprintf(stderr, "memwall data: out of memory\n"); return 1; }
    int npos = 0;
    int rc = mw_opts_parse(&spec, argc, argv, pos, &npos);
    if (rc) { free(pos); return rc == MW_OPTS_HELP ? 0 : 2; }
    if (!tokenizer || !o.out_dir) {
        fprintf(stderr, "memwall data: --tokenizer and --out are required\nrun 'memwall data --help' for the options\n");
        free(pos);
        return 2;
    }
    o.shard_tokens = (uint64_t)shard_tokens;
    mw_tok_t *t = NULL;
    int err = mw_tok_load(&t, tokenizer, NULL);
    if (err) { mw_cli_fail("loading the tokenizer", err); free(pos); return 1; }
    if (doc_token) {
        o.doc_token = mw_tok_token_id(t, doc_token);
        if (o.doc_token < 0) {
            fprintf(stderr, "memwall data: --doc-token '%s' is not a token of %s\n", doc_token, tokenizer);
            mw_tok_free(t);
            free(pos);
            return 2;
        }
    }
    struct progress pr = {mw_now_ns(), 0};
    if (!quiet) { o.progress = report; o.user = &pr; }
    struct mw_data_prep_stats st;
    err = mw_data_prepare(t, (const char *const *)pos, npos, &o, &st);
    mw_tok_free(t);
    free(pos);
    if (err) { mw_cli_fail("preparing the data", err); return 1; }
    double secs = (double)(mw_now_ns() - pr.t0) * 1e-9;
    printf("memwall data: %llu documents, %llu bytes -> %llu tokens in %.1f s; %s shards (%s tokens, document token "
           "%d) in %s: %d train (%llu tokens), %d val (%llu tokens)\n",
           (unsigned long long)st.docs, (unsigned long long)st.bytes_total,
           (unsigned long long)(st.train_tokens + st.val_tokens), secs, st.wide ? "version-7" : "version-1",
           st.wide ? "uint32" : "uint16", st.doc_token, o.out_dir, st.train_shards,
           (unsigned long long)st.train_tokens, st.val_shards, (unsigned long long)st.val_tokens);
    return 0;
}
