/*
 * cmd_generate.c — `memwall generate --init-hf DIR | --resume CKPT --prompt TEXT | --prompt-ids
 * IDS [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer
 * FILE|DIR] [--eos ID] [--ids]`: text after a prompt, sampled with the model's key/value cache
 * (memwall/generate.h), each new token written to stdout as it comes.
 *
 * The tokenizer: --tokenizer, else DIR/tokenizer.json of --init-hf when there is one, else the
 * byte tokenizer for a model of 257 tokens (a run trained on text: bytes and end-of-text), else
 * none: then the prompt is given as ids (--prompt-ids) and ids are printed. The prompt is
 * encoded with the tokenizer's special tokens added (as transformers' tokenizer(prompt) does:
 * Llama-3's <|begin_of_text|>). Generation stops after --max-new-tokens, at the end-of-text
 * token (--eos, or the tokenizer's <|endoftext|> / <|end_of_text|> / </s>; the byte tokenizer's
 * 256), or when prompt + generated tokens fill the model's context (said on stderr). Only the
 * new text is printed (special tokens left out), then a newline; a summary goes to stderr.
 *
 * Exit codes: 0 ok; 1 the model, the tokenizer or the prompt could not be read or used; 2 usage.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/common.h"
#include "memwall/data.h"
#include "memwall/generate.h"
#include "memwall/model.h"
#include "memwall/tok.h"
#include "memwall/train.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct out_state {
    mw_tok_t *tok;     /* NULL: bytes (byte_tok) or ids */
    int byte_tok, ids;
    int32_t eos;
    char *buf;
    size_t len, cap;
};

/* One token to stdout, now: ids as numbers, else its bytes (special tokens and eos left out). */
static int on_token(void *user, int32_t t, int index)
{
    struct out_state *o = user;
    if (o->ids) {
        printf("%s%d", index ? " " : "", (int)t);
    } else if (t == o->eos) {
        return 0;
    } else if (o->byte_tok) {
        char b[32];
        size_t n = mw_tok_decode(t, b, sizeof b);
        fwrite(b, 1, n, stdout);
    } else if (t >= mw_tok_vocab_size(o->tok)) {
        printf("<%d>", (int)t); /* an id of the model that the tokenizer does not have */
    } else {
        o->len = 0;
        int err = mw_tok_decode_ids(o->tok, &t, 1, MW_TOK_SKIP_SPECIAL, &o->buf, &o->len, &o->cap);
        if (err) return err;
        fwrite(o->buf, 1, o->len, stdout);
    }
    fflush(stdout);
    return 0;
}

/* "1,2, 3" or "1 2 3" into ids. 0 or 2 (usage, printed). */
static int parse_ids(const char *s, struct mw_tok_ids *ids)
{
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "memwall generate: --prompt-ids %s: expected token ids (whole numbers >= 0) separated by "
                    "commas or spaces\n", s);
            return 2;
        }
        if (ids->n == ids->cap) {
            size_t nc = ids->cap ? 2 * ids->cap : 64;
            int32_t *nv = realloc(ids->v, nc * sizeof *nv);
            if (!nv) { fprintf(stderr, "memwall generate: no memory\n"); return 1; }
            ids->v = nv;
            ids->cap = nc;
        }
        ids->v[ids->n++] = (int32_t)v;
        p = end;
    }
    if (!ids->n) { fprintf(stderr, "memwall generate: --prompt-ids is empty\n"); return 2; }
    return 0;
}

static int32_t tok_eos(const mw_tok_t *t)
{
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = mw_tok_token_id(t, names[i]);
        if (id >= 0) return id;
    }
    return -1;
}

int mw_cmd_generate(int argc, char **argv)
{
    const char *hf = NULL, *ckpt = NULL, *prompt = NULL, *prompt_ids = NULL, *tokenizer = NULL;
    int64_t max_new = 64, top_k = 0, seed = 0, eos = -1, threads = 0;
    double temperature = 1.0, top_p = 1.0;
    int ids = 0;
    const struct mw_opt opts[] = {
        {"init-hf", MW_OPT_STRING, &hf, "DIR", "the model: a Hugging Face directory (config.json, and model.safetensors or a sharded checkpoint's model.safetensors.index.json)", 0, 0, NULL},
        {"resume", MW_OPT_STRING, &ckpt, "CKPT", "the model: a memwall checkpoint (.mwck)", 0, 0, NULL},
        {"prompt", MW_OPT_STRING, &prompt, "TEXT", "the text to continue (encoded with the tokenizer)", 0, 0, NULL},
        {"prompt-ids", MW_OPT_STRING, &prompt_ids, "IDS", "the prompt as token ids, separated by commas or spaces "
         "(instead of --prompt)", 0, 0, NULL},
        {"max-new-tokens", MW_OPT_INT, &max_new, "N", "at most N new tokens", 0, 1 << 24, NULL},
        {"temperature", MW_OPT_DOUBLE, &temperature, "T", "logits / T before sampling; 0: greedy (the argmax)", 0, 1000, NULL},
        {"top-k", MW_OPT_INT, &top_k, "K", "sample among the K most likely tokens (0: all)", 0, 1 << 24, NULL},
        {"top-p", MW_OPT_DOUBLE, &top_p, "P", "sample among the most likely tokens whose probabilities reach P "
         "(nucleus; 1: all; > 0)", 0, 1, NULL},
        {"seed", MW_OPT_INT, &seed, "S", "the sampler's seed (same seed, model and threads: same text)", 0, 0, NULL},
        {"tokenizer", MW_OPT_STRING, &tokenizer, "FILE|DIR", "a tokenizer.json (or a directory holding one); default: "
         "the one in --init-hf DIR, or bytes for a model of 257 tokens", 0, 0, NULL},
        {"eos", MW_OPT_INT, &eos, "ID", "stop after token ID (-1: the tokenizer's end-of-text token, none without a "
         "tokenizer)", -1, INT32_MAX, NULL},
        {"ids", MW_OPT_FLAG, &ids, NULL, "print the new token ids instead of text", 0, 0, NULL},
        {"threads", MW_OPT_INT, &threads, "N", "threads (0: OpenMP's default)", 0, 1024, NULL},
    };
    const struct mw_cmd_spec spec = {
        "generate", "",
        "Text after a prompt from a Hugging Face model directory or a memwall checkpoint, sampled token by token "
        "with a key/value cache (temperature, top-k, top-p; greedy with --temperature 0) and written to stdout as "
        "it comes; the new text only, then a newline, and a summary on stderr. It stops after --max-new-tokens, at "
        "the end-of-text token, or when prompt and new tokens fill the model's context.",
        opts, MW_NOPTS(opts), 0, 0};
    int rc = mw_opts_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == MW_OPTS_HELP ? 0 : 2;
    if (!!hf == !!ckpt || !!prompt == !!prompt_ids) {
        fprintf(stderr, "memwall generate: give the model (--init-hf DIR or --resume CKPT, one of them) and the prompt "
                "(--prompt TEXT or --prompt-ids IDS, one of them)\n");
        return 2;
    }
    if (prompt && !*prompt) { fprintf(stderr, "memwall generate: --prompt is empty\n"); return 2; }
    if (!(top_p > 0.0)) { fprintf(stderr, "memwall generate: --top-p must be above 0 (1: no limit)\n"); return 2; }
    struct mw_tok_ids pids = {0};
    if (prompt_ids && (rc = parse_ids(prompt_ids, &pids))) { mw_tok_ids_free(&pids); return rc; }

    struct mw_net_config nc;
    memset(&nc, 0, sizeof nc);
    char weights[PATH_MAX];
    if ((rc = mw_cli_model_config("generate", hf, ckpt, &nc, weights, sizeof weights))) { mw_tok_ids_free(&pids); return rc; }

    /* The tokenizer. */
    struct out_state o = {.ids = ids, .eos = -1};
    int err = 0;
    char tpath[PATH_MAX];
    const char *tfile = tokenizer;
    if (!tfile && hf && (size_t)snprintf(tpath, sizeof tpath, "%s/tokenizer.json", hf) < sizeof tpath &&
        access(tpath, R_OK) == 0)
        tfile = tpath;
    if (tfile && (err = mw_tok_load(&o.tok, tfile, "the tokenizer"))) {
        mw_tok_ids_free(&pids);
        mw_cli_fail("reading the tokenizer", err);
        return 1;
    }

    struct mw_net m;
    memset(&m, 0, sizeof m);
    /* Decoding keeps its own buffers (the KV cache): the forward's activations need one position. */
    struct mw_net_options mo = {1, 1, 0, threads ? (int)threads : omp_get_max_threads()};
    if ((err = mw_net_init(&m, &nc, &mo))) { mw_cli_fail("building the model", err); rc = 1; goto out; }
    if ((err = hf ? mw_net_load_safetensors(&m, weights) : mw_ckpt_load_weights(ckpt, &m))) {
        mw_cli_fail("loading the weights", err);
        rc = 1;
        goto out;
    }
    if (!o.tok && m.vocab == MW_TOK_BYTE_VOCAB) o.byte_tok = 1;
    if (!o.tok && !o.byte_tok) {
        if (prompt) {
            fprintf(stderr, "memwall generate: no tokenizer for --prompt: %s; give --tokenizer FILE|DIR, or the prompt "
                    "as --prompt-ids (new ids are then printed)\n", hf ? "the directory has no tokenizer.json" :
                    "the checkpoint's model is not a byte-level one (257 tokens)");
            rc = 1;
            goto out;
        }
        o.ids = 1;
    }
    o.eos = eos >= 0 ? (int32_t)eos : o.tok ? tok_eos(o.tok) : o.byte_tok ? MW_TOK_EOT : -1;
    if (prompt) {
        size_t n = strlen(prompt);
        if (o.tok) {
            err = mw_tok_encode(o.tok, prompt, n, MW_TOK_ADD_SPECIAL, &pids);
            if (err) { mw_cli_fail("encoding the prompt", err); rc = 1; goto out; }
        } else {
            pids.v = malloc(n * sizeof(int32_t));
            if (!pids.v) { fprintf(stderr, "memwall generate: no memory\n"); rc = 1; goto out; }
            for (size_t i = 0; i < n; i++) pids.v[i] = (unsigned char)prompt[i];
            pids.n = pids.cap = n;
        }
    }
    if (pids.n > (size_t)INT_MAX) { fprintf(stderr, "memwall generate: the prompt is too long\n"); rc = 1; goto out; }

    struct mw_gen_params gp;
    mw_gen_params_default(&gp);
    gp.max_new_tokens = (int)max_new;
    gp.temperature = (float)temperature;
    gp.top_k = (int)top_k;
    gp.top_p = (float)top_p;
    gp.seed = (uint64_t)seed;
    gp.eos = o.eos;
    struct mw_gen_result r;
    double t0 = (double)mw_now_ns() / 1e9;
    err = mw_net_generate(&m, pids.v, (int)pids.n, &gp, on_token, &o, NULL, &r);
    double dt = (double)mw_now_ns() / 1e9 - t0;
    if (r.n_new) putchar('\n');
    fflush(stdout);
    if (err) { mw_cli_fail("generating", err); rc = 1; goto out; }
    if (r.stop == MW_GEN_STOP_CONTEXT)
        fprintf(stderr, "memwall generate: stopped at the model's context: the prompt's %zu tokens and %d new ones fill "
                "its %d positions (ask for fewer tokens or give a shorter prompt)\n", pids.n, r.n_new, m.context);
    fprintf(stderr, "generate: %zu prompt tokens, %d new (stop: %s) in %.3f s, %.1f tokens/s\n", pids.n, r.n_new,
            mw_gen_stop_name(r.stop), dt, dt > 0 ? r.n_new / dt : 0.0);
    rc = 0;
out:
    if (m.family) mw_net_free(&m);
    mw_tok_free(o.tok);
    free(o.buf);
    mw_tok_ids_free(&pids);
    return rc;
}
