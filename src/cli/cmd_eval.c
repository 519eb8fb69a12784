/*
 * cmd_eval.c — `memwall eval --init-hf DIR | --resume CKPT --data FILE --seq T [--json]`: the mean
 * next-token loss in nats over the file's consecutive windows (tokens iT..iT+T-1 predict
 * iT+1..iT+T, every whole window; src/train/eval.c), the held-out figure users compare with
 * transformers. The model comes from a Hugging Face directory (its config.json picks the family)
 * or a memwall checkpoint (verified whole); it is evaluated in DRAM, B windows per forward pass.
 *
 * Exit codes: 0 ok; 1 the model or the data could not be read or used; 2 usage.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/common.h"
#include "memwall/data.h"
#include "memwall/model.h"
#include "memwall/train.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

int mw_cmd_eval(int argc, char **argv)
{
    const char *hf = NULL, *ckpt = NULL, *data = NULL;
    int64_t seq = 256, batch = 4, threads = 0;
    int json = 0;
    const struct mw_opt opts[] = {
        {"init-hf", MW_OPT_STRING, &hf, "DIR", "the model: a Hugging Face directory (config.json, and model.safetensors or a sharded checkpoint's model.safetensors.index.json)", 0, 0, NULL},
        {"resume", MW_OPT_STRING, &ckpt, "CKPT", "the model: a memwall checkpoint (.mwck)", 0, 0, NULL},
        {"data", MW_OPT_STRING, &data, "FILE|DIR", "the tokens: a text file (bytes), an llm.c .bin shard or a directory of "
         "either (required)", 0, 0, NULL},
        {"seq", MW_OPT_INT, &seq, "T", "tokens per window (the model's context at most)", 1, 1 << 20, NULL},
        {"batch", MW_OPT_INT, &batch, "B", "windows per forward pass", 1, 4096, NULL},
        {"threads", MW_OPT_INT, &threads, "N", "threads (0: OpenMP's default)", 0, 1024, NULL},
        {"json", MW_OPT_FLAG, &json, NULL, "print one JSON object instead of a line", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {
        "eval", "",
        "The mean next-token loss in nats over the consecutive windows of a file (tokens iT..iT+T-1 predict "
        "iT+1..iT+T, every whole window), for a Hugging Face model directory or a memwall checkpoint: the held-out "
        "figure to compare with transformers' loss over the same windows.",
        opts, MW_NOPTS(opts), 0, 0};
    int rc = mw_opts_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == MW_OPTS_HELP ? 0 : 2;
    if (!!hf == !!ckpt || !data) {
        fprintf(stderr, "memwall eval: give the model (--init-hf DIR or --resume CKPT, one of them) and --data FILE\n");
        return 2;
    }
    struct mw_net_config nc;
    memset(&nc, 0, sizeof nc);
    char weights[PATH_MAX];
    if ((rc = mw_cli_model_config("eval", hf, ckpt, &nc, weights, sizeof weights))) return rc;
    struct mw_net_shape sh;
    nc.family->config_shape(nc.raw, &sh);
    if (seq > sh.context) {
        fprintf(stderr, "memwall eval: --seq %" PRId64 " is longer than the model's context %d\n", seq, sh.context);
        return 2;
    }
    struct mw_data d;
    struct mw_data_opts dop;
    mw_data_opts_default(&dop); /* the split is ignored: every window of every segment */
    int err = mw_data_open(&d, data, &dop);
    if (err) { mw_cli_fail("reading --data", err); return 1; }
    struct mw_net m;
    struct mw_net_options mo = {(int)batch, (int)seq, 0, threads ? (int)threads : omp_get_max_threads()};
    if ((err = mw_net_init(&m, &nc, &mo))) {
        mw_data_free(&d);
        mw_cli_fail("building the model", err);
        return 1;
    }
    err = hf ? mw_net_load_safetensors(&m, weights) : mw_ckpt_load_weights(ckpt, &m);
    struct mw_eval_result r;
    if (!err && d.max_token >= m.vocab)
        err = mw_error_set(-EINVAL, "%s holds token %d, the model's vocabulary is %d", data, d.max_token, m.vocab);
    if (!err) err = mw_train_eval_windows(&m, &d, (int)seq, (int)batch, &r);
    mw_net_free(&m);
    mw_data_free(&d);
    if (err) { mw_cli_fail("evaluating", err); return 1; }
    if (json)
        printf("{\"loss\": %.8f, \"windows\": %" PRIu64 ", \"tokens\": %" PRIu64 ", \"seq\": %" PRId64 "}\n", r.loss,
               r.windows, r.tokens, seq);
    else
        printf("eval: loss %.6f nats per token over %" PRIu64 " windows of %" PRId64 " tokens (%" PRIu64 " tokens) of %s\n",
               r.loss, r.windows, seq, r.tokens, data);
    return 0;
}
