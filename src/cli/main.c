/*
 * main.c — the one `memwall` binary: a table of subcommands, dispatched by name.
 * Exit codes: 0 success, 1 runtime failure, 2 usage error (unknown command, bad option).
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/common.h"

#include <stdio.h>
#include <string.h>

#define MEMWALL_VERSION "0.1.0"

struct mw_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct mw_command bench_cmds[] = {
    {"io", mw_cmd_bench_io, "sequential write/read throughput of the async I/O engine (O_DIRECT)"},
    {"adam", mw_cmd_bench_adam, "AdamW kernel throughput per state format against the memory-bandwidth limit"},
    {"offload", mw_cmd_bench_offload, "the offloaded optimizer update phase, state in DRAM or on NVMe"},
};

static const struct mw_command top_cmds[] = {
    {"train", mw_cmd_train, "train a GPT-2-family model, optimizer state on a chosen tier"},
    {"report", mw_cmd_report, "the I/O and memory study of a run, from its trace"},
    {"plan", mw_cmd_plan, "what fits where, and how fast, for a model and cluster"},
    {"eval", mw_cmd_eval, "the mean next-token loss over a file's consecutive windows (HF directory or checkpoint)"},
    {"generate", mw_cmd_generate, "text after a prompt, sampled with a KV cache (HF directory or checkpoint)"},
    {"tokenize", mw_cmd_tokenize, "token ids of a text under a Hugging Face tokenizer.json (and --decode)"},
    {"data", mw_cmd_data, "tokenize text files into llm.c .bin shards for training"},
    {"bench", NULL, "benchmarks: io, adam, offload"},
};

#define N_OF(t) (sizeof(t) / sizeof((t)[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: memwall <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < N_OF(top_cmds); i++) fprintf(f, "  %-10s %s\n", top_cmds[i].name, top_cmds[i].summary);
    fprintf(f, "\nbench subcommands (memwall bench <name>):\n");
    for (size_t i = 0; i < N_OF(bench_cmds); i++) fprintf(f, "  %-10s %s\n", bench_cmds[i].name, bench_cmds[i].summary);
    fprintf(f, "\n  version    print the version\n\nrun 'memwall <command> --help' for its options\n");
}

static char cli_who[48] = "memwall";

void mw_cli_set_rank(int rank, int world)
{
    if (world > 1) snprintf(cli_who, sizeof cli_who, "memwall (rank %d of %d)", rank, world);
    else snprintf(cli_who, sizeof cli_who, "memwall");
}

void mw_cli_fail(const char *what, int err)
{
    fprintf(stderr, "%s: %s failed: %s\n", cli_who, what, mw_error_msg());
    mw_opts_hint(stderr, cli_who, mw_error_msg());
    /* The code only where the message says nothing (it names what was wrong otherwise). */
    if (err && !*mw_error_msg()) fprintf(stderr, "%s: (error code %d: %s)\n", cli_who, err, mw_strerror(err));
}

static int dispatch(const struct mw_command *t, size_t n, const char *group, int argc, char **argv)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(argv[0], t[i].name)) return t[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "memwall: unknown %s '%s'\n", group, argv[0]);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) { usage(stderr); return 2; }
    const char *c = argv[1];
    if (!strcmp(c, "-h") || !strcmp(c, "--help") || !strcmp(c, "help")) { usage(stdout); return 0; }
    if (!strcmp(c, "version") || !strcmp(c, "--version")) { printf("memwall %s\n", MEMWALL_VERSION); return 0; }
    if (!strcmp(c, "bench")) {
        if (argc < 3 || !strcmp(argv[2], "-h") || !strcmp(argv[2], "--help")) {
            usage(argc < 3 ? stderr : stdout);
            return argc < 3 ? 2 : 0;
        }
        return dispatch(bench_cmds, N_OF(bench_cmds), "bench subcommand", argc - 2, argv + 2);
    }
    return dispatch(top_cmds, N_OF(top_cmds) - 1, "command", argc - 1, argv + 1);
}
