/*
 * cmd_train.c — `memwall train`: options, presets, progress lines, the JSON log, checkpoints
 * and the final sample, around the library trainer (memwall/train.h).
 * Why presets are applied before parsing: the option table prints its defaults from the
 * destination variables, so `memwall train --preset tiny --help` shows tiny's real defaults.
 * On --resume the checkpoint's settings replace every default that the command line did not
 * give, so `memwall train --resume FILE` alone continues the run exactly.
 * --ds-config FILE: a DeepSpeed config read into the options it stands for (memwall/ds_config.h),
 * applied as if typed, to every option the command line did not give (so flags override it),
 * after MPI is up (its batch keys are per GPU) and before the rank-dependent paths are made.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/train_spec.h"
#include "memwall/comm.h"
#include "memwall/common.h"
#include "memwall/data.h"
#include "memwall/ds_config.h"
#include "memwall/fsutil.h"
#include "memwall/gpt2.h"
#include "memwall/offload.h"
#include "memwall/plan.h"
#include "memwall/report.h"
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "memwall/train.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUNDLED_CORPUS "data/kjv_excerpt.txt"

struct preset {
    const char *name;
    int64_t layers, heads, width, context, vocab;
    int64_t batch, seq, steps, warmup, val_every, val_batches, sample_len;
    double lr;
};

static const struct preset presets[] = {
    /* A few million parameters that learn English spelling and verse structure in two minutes. */
    {"demo", 4, 4, 256, 256, MW_TOK_BYTE_VOCAB, 8, 128, 400, 20, 50, 8, 300, 2e-3},
    /* HF gpt2 (124M) shapes; the step count is for measuring, not for converging. */
    {"gpt2-124m", 12, 12, 768, 1024, 50257, 4, 256, 20, 5, 0, 4, 64, 6e-4},
    /* For tests: trains in milliseconds. */
    {"tiny", 2, 2, 32, 64, MW_TOK_BYTE_VOCAB, 4, 32, 20, 2, 10, 2, 32, 1e-3},
};

struct args {
    const char *preset, *data, *out_dir, *resume, *init_st, *log_json, *trace, *tier, *nvme_dir, *policy, *hier, *comm_sum;
    const char *ds_config;
    uint64_t subgroup_size, dram_budget, nvme_budget, aio_block_size;
    int64_t buffer_count, aio_queue_depth;
    const char *offload_params, *schedule, *activations; /* --offload-params dram|nvme (streaming), --schedule,
                                                             --activations */
    const char *preread;                                 /* --preread auto|on|off */
    int64_t prefetch_depth;
    int64_t layers, heads, width, context, vocab;
    int64_t batch, seq, accum, steps, warmup, val_every, val_batches, ckpt_every, threads, sample_len, top_k;
    int64_t print_every, seed;
    double lr, min_lr_frac, wd, clip, beta1, beta2, eps, temperature, comm_timeout;
    int64_t zero;
    int recompute, sync_update;
};

/* The data-parallel job (mpirun); one rank without a launcher. */
static struct mw_comm *comm;
static int world = 1, rank = 0;

static const char *const preset_names[] = {"demo", "gpt2-124m", "tiny", NULL};
static const char *const tier_names[] = {"dram", "nvme", NULL};
static const char *const hier_names[] = {"global", "node", NULL};
static const char *const sum_names[] = {"ordered", "mpi", NULL};
static const char *const schedule_names[] = {"auto", "layer-major", "batch-major", NULL};
static const char *const acts_names[] = {"auto", "recompute", "nvme", NULL};
static const char *const preread_names[] = {"auto", "on", "off", NULL};

static struct args A;

static const struct mw_opt train_opts[] = {
    {"preset", MW_OPT_CHOICE, &A.preset, NULL, "model size and run length; the defaults below follow it", 0, 0, preset_names},
    {"layers", MW_OPT_INT, &A.layers, "N", "transformer blocks", 1, 1000, NULL},
    {"heads", MW_OPT_INT, &A.heads, "N", "attention heads (width must divide by it)", 1, 1000, NULL},
    {"width", MW_OPT_INT, &A.width, "N", "model width (channels)", 1, 65536, NULL},
    {"context", MW_OPT_INT, &A.context, "N", "the model's maximum sequence length, tokens", 1, 1 << 20, NULL},
    {"vocab", MW_OPT_INT, &A.vocab, "N", "vocabulary size, tokens (bytes: 257)", 2, 1 << 20, NULL},
    {"batch", MW_OPT_INT, &A.batch, "N", "sequences per micro-batch", 1, 1 << 20, NULL},
    {"seq", MW_OPT_INT, &A.seq, "N", "tokens per sequence (<= context)", 1, 1 << 20, NULL},
    {"grad-accum", MW_OPT_INT, &A.accum, "N", "micro-batches per optimizer step", 1, 1 << 20, NULL},
    {"steps", MW_OPT_INT, &A.steps, "N", "optimizer steps of the run", 0, 1e12, NULL},
    {"lr", MW_OPT_DOUBLE, &A.lr, "X", "peak learning rate", 0, 10, NULL},
    {"warmup", MW_OPT_INT, &A.warmup, "N", "linear warm-up, steps", 0, 1e12, NULL},
    {"min-lr-frac", MW_OPT_DOUBLE, &A.min_lr_frac, "X", "cosine decays to lr * X at the last step", 0, 1, NULL},
    {"weight-decay", MW_OPT_DOUBLE, &A.wd, "X", "AdamW decoupled weight decay (2-D tensors)", 0, 10, NULL},
    {"beta1", MW_OPT_DOUBLE, &A.beta1, "X", "AdamW first-moment decay", 0, 0.999999, NULL},
    {"beta2", MW_OPT_DOUBLE, &A.beta2, "X", "AdamW second-moment decay", 0, 0.999999, NULL},
    {"eps", MW_OPT_DOUBLE, &A.eps, "X", "AdamW epsilon (added to the root of the second moment)", 1e-30, 1, NULL},
    {"clip", MW_OPT_DOUBLE, &A.clip, "X", "global gradient-norm clip; 0 = off", 0, 1e9, NULL},
    {"val-every", MW_OPT_INT, &A.val_every, "N", "validation loss every N steps (and at start and end); 0 = never", 0, 1e12, NULL},
    {"val-batches", MW_OPT_INT, &A.val_batches, "N", "micro-batches per validation", 1, 1e9, NULL},
    {"ckpt-every", MW_OPT_INT, &A.ckpt_every, "N", "checkpoint every N steps (and at the end) into --out-dir; 0 = never", 0, 1e12, NULL},
    {"out-dir", MW_OPT_STRING, &A.out_dir, "DIR", "checkpoints and the final model.safetensors go here (none if unset)", 0, 0, NULL},
    {"resume", MW_OPT_STRING, &A.resume, "FILE|DIR", "continue a run: alone, it finishes what the run was started to do (every setting, the out-dir, log and trace are kept with the run; a flag given differs as listed in docs/resume.md: allowed, announced or refused). FILE: a checkpoint (several ranks: ckpt_N.r%r.mwck); DIR: the --nvme-dir of a run that stopped (--optimizer-tier nvme, one rank), from its last committed step", 0, 0, NULL},
    {"init-safetensors", MW_OPT_STRING, &A.init_st, "FILE", "start from these weights (HF gpt2 model.safetensors, with the config.json beside it when present); the files set the model shape, shape flags fill what they do not say", 0, 0, NULL},
    {"data", MW_OPT_STRING, &A.data, "FILE|DIR", "text file(s) or llm.c .bin shards (default: the bundled corpus " BUNDLED_CORPUS ")", 0, 0, NULL},
    {"seed", MW_OPT_INT, &A.seed, "N", "seed of the weights and the batch order (same seed: bitwise same run)", 0, 9.2e18, NULL},
    {"threads", MW_OPT_INT, &A.threads, "N", "CPU threads (OpenMP and OpenBLAS); 0 = all cores", 0, 4096, NULL},
    {"recompute", MW_OPT_FLAG, &A.recompute, NULL, "recompute activations in backward (less memory, same gradients)", 0, 0, NULL},
    {"log-json", MW_OPT_STRING, &A.log_json, "FILE", "one JSON object per step (step, loss, val_loss, tokens_per_s, ms, ...)", 0, 0, NULL},
    {"trace", MW_OPT_STRING, &A.trace, "FILE", "trace of the run (Chrome/Perfetto JSON, for 'memwall report'); a summary is printed at the end; several ranks: one per rank, put %r in FILE", 0, 0, NULL},
    {"optimizer-tier", MW_OPT_CHOICE, &A.tier, NULL, "where the AdamW state (master weights, moments) lives: host DRAM or NVMe files", 0, 0, tier_names},
    {"offload-params", MW_OPT_CHOICE, &A.offload_params, NULL, "where the weights and gradients live between uses: host DRAM, or streamed unit by unit from NVMe with the optimizer state (implies --optimizer-tier nvme; under mpirun each rank streams its own state: its ZeRO shard, or the whole model at --zero 0)", 0, 0, tier_names},
    {"prefetch-depth", MW_OPT_INT, &A.prefetch_depth, "N", "--offload-params nvme: weight units read ahead of their use", 0, 8, NULL},
    {"sync-update", MW_OPT_FLAG, &A.sync_update, NULL, "finish each optimizer step before the next forward pass (default with --optimizer-tier nvme on one rank: the update runs behind the next forward, each unit waiting for its own; same results)", 0, 0, NULL},
    {"schedule", MW_OPT_CHOICE, &A.schedule, NULL, "the step's micro-batches: one at a time through the whole model (batch-major), or all of them through each weight unit in turn (layer-major: the streamed weights are read once per step, not once per micro-batch, and on several ranks each unit's collectives run once per step); auto = layer-major with --offload-params nvme", 0, 0, schedule_names},
    {"activations", MW_OPT_CHOICE, &A.activations, NULL, "layer-major: how backward gets each block's activations: recompute them from the block's input, or read back what forward wrote to NVMe (--nvme-dir; same results, no recomputation); auto = nvme with --offload-params nvme unless --recompute is given", 0, 0, acts_names},
    {"nvme-dir", MW_OPT_STRING, &A.nvme_dir, "DIR", "directory for the NVMe tier's files (several: D1:D2); default run/nvme; %r = the rank (several ranks without %r: /rank<r> is appended)", 0, 0, NULL},
    {"subgroup-size", MW_OPT_SIZE, &A.subgroup_size, "N", "parameters per optimizer subgroup (the unit of NVMe I/O and update); default 4M = 4194304", 1, 1e15, NULL},
    {"buffer-count", MW_OPT_INT, &A.buffer_count, "N", "host staging buffers of the NVMe pipeline", 1, 1024, NULL},
    {"aio-block-size", MW_OPT_SIZE, &A.aio_block_size, "BYTES", "bytes per NVMe request piece, a multiple of 4096; 0 = 1 MiB", 0, 1 << 30, NULL},
    {"aio-queue-depth", MW_OPT_INT, &A.aio_queue_depth, "N", "NVMe request pieces in flight; 0 = 128", 0, 4096, NULL},
    {"preread", MW_OPT_CHOICE, &A.preread, NULL, "read the next step's first optimizer subgroups from NVMe between steps, into the free staging buffers during backward, checked by the update that uses them (docs/offload.md); auto = on with --optimizer-tier nvme (the streamed weights have their own read-ahead)", 0, 0, preread_names},
    {"offload-policy", MW_OPT_STRING, &A.policy, "P", "where subgroups are updated: all-cpu, auto, all-device, every-K (device: emulated accelerator)", 0, 0, NULL},
    {"dram-budget", MW_OPT_SIZE, &A.dram_budget, "BYTES", "DRAM for the whole run (model + optimizer), refused up front if short; 0 = no limit", 0, 0, NULL},
    {"nvme-budget", MW_OPT_SIZE, &A.nvme_budget, "BYTES", "NVMe bytes for the optimizer state, refused up front if short; 0 = the free space", 0, 0, NULL},
    {"sample-len", MW_OPT_INT, &A.sample_len, "N", "tokens of text generated at the end; 0 = none", 0, 1 << 20, NULL},
    {"temperature", MW_OPT_DOUBLE, &A.temperature, "X", "sampling temperature", 0.01, 100, NULL},
    {"top-k", MW_OPT_INT, &A.top_k, "N", "sample among the k likeliest tokens; 0 = all", 0, 1 << 20, NULL},
    {"print-every", MW_OPT_INT, &A.print_every, "N", "a progress line every N steps", 1, 1e12, NULL},
    {"zero", MW_OPT_INT, &A.zero, "S", "under mpirun: 0 replicate everything (allreduce gradients), 1 shard the optimizer state, 2 also the gradients, 3 also the weights", 0, 3, NULL},
    {"zero-hierarchy", MW_OPT_CHOICE, &A.hier, NULL, "ZeRO 1-3: shard over all ranks, or within each node and replicate across nodes", 0, 0, hier_names},
    {"comm-sum", MW_OPT_CHOICE, &A.comm_sum, NULL, "gradient sums: in rank order, bitwise reproducible (MPI_Ialltoallv + MPI_Iallgatherv), or MPI's own MPI_Iallreduce / MPI_Ireduce_scatter (order up to MPI)", 0, 0, sum_names},
    {"comm-timeout", MW_OPT_DOUBLE, &A.comm_timeout, "S", "a collective not finished after S seconds ends the job (a rank died or hangs)", 0.1, 1e6, NULL},
    {"ds-config", MW_OPT_STRING, &A.ds_config, "FILE", "a DeepSpeed config (ds_config.json): its keys set the options above that the command line does not give (docs/train.md)", 0, 0, NULL},
};

static const struct mw_cmd_spec train_spec = {
    "train", "",
    "Train a GPT-2-family model on the CPU: micro-batches with gradient accumulation, AdamW with "
    "warm-up + cosine learning rate and global-norm clipping, validation, checkpoints that resume "
    "bitwise, and a generated sample at the end. Defaults follow --preset ('--preset tiny --help' "
    "shows tiny's). Data parallel over MPI: 'mpirun -np N memwall train --zero S ...' (--batch is the "
    "global batch; %r in --nvme-dir, --trace and --resume is the rank).",
    train_opts, MW_NOPTS(train_opts), 0, 0,
};

static void set_defaults(const struct preset *p)
{
    A.layers = p->layers; A.heads = p->heads; A.width = p->width; A.context = p->context; A.vocab = p->vocab;
    A.batch = p->batch; A.seq = p->seq; A.steps = p->steps; A.warmup = p->warmup;
    A.val_every = p->val_every; A.val_batches = p->val_batches; A.sample_len = p->sample_len; A.lr = p->lr;
    A.accum = 1; A.min_lr_frac = 0.1; A.wd = 0.1; A.clip = 1.0; A.beta1 = 0.9; A.beta2 = 0.95;
    A.ckpt_every = 0; A.seed = 1337; A.threads = 0; A.temperature = 0.8; A.top_k = 40; A.print_every = 1;
    A.tier = "dram"; A.buffer_count = 8; A.eps = 1e-8; A.offload_params = "dram"; A.prefetch_depth = 2;
    A.schedule = "auto";
    A.activations = "auto";
    A.preread = "auto";
    A.zero = 0; A.hier = "global"; A.comm_timeout = 300; A.comm_sum = "ordered";
}

static const struct preset *find_preset(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

/* The preset named on the command line (last one wins), before the real parse. */
static const struct preset *prescan_preset(int argc, char **argv)
{
    const struct preset *p = &presets[0];
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--preset=", 9)) v = argv[i] + 9;
        if (v && find_preset(v)) p = find_preset(v);
    }
    return p;
}

static int usage_error(const char *fmt, const char *a)
{
    fprintf(stderr, "memwall train: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\nrun 'memwall train --help' for the options\n");
    return 2;
}

#define GIVEN(name) mw_opts_given(&train_spec, name)

/* The checkpoint's settings for every option the command line did not give. */
static int apply_checkpoint(const struct mw_ckpt_info *ci)
{
    static const char *const shape[] = {"layers", "heads", "width", "context", "vocab", "preset", "init-safetensors"};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (GIVEN(shape[i])) return usage_error("--%s cannot be combined with --resume (the checkpoint fixes the model)", shape[i]);
    struct mw_gpt2_config g;
    if (mw_net_gpt2_config(&ci->net, &g)) return usage_error("--resume: %s (memwall train trains GPT-2 for now)", mw_error_msg());
    A.layers = g.n_layer; A.heads = g.n_head; A.width = g.n_embd;
    A.context = g.max_seq_len; A.vocab = g.vocab_size;
    const struct mw_train_config *t = &ci->train;
    if (!GIVEN("batch")) A.batch = t->batch;
    if (!GIVEN("seq")) A.seq = t->seq;
    if (!GIVEN("grad-accum")) A.accum = t->grad_accum;
    if (!GIVEN("steps")) A.steps = t->steps;
    if (!GIVEN("lr")) A.lr = t->lr;
    if (!GIVEN("warmup")) A.warmup = t->warmup;
    if (!GIVEN("min-lr-frac")) A.min_lr_frac = t->min_lr_frac;
    if (!GIVEN("weight-decay")) A.wd = t->weight_decay;
    if (!GIVEN("beta1")) A.beta1 = t->beta1;
    if (!GIVEN("beta2")) A.beta2 = t->beta2;
    if (!GIVEN("eps")) A.eps = t->eps;
    if (!GIVEN("clip")) A.clip = t->clip;
    if (!GIVEN("val-every")) A.val_every = t->val_every;
    if (!GIVEN("val-batches")) A.val_batches = t->val_batches;
    if (!GIVEN("ckpt-every")) A.ckpt_every = A.out_dir ? t->ckpt_every : 0;
    if (!GIVEN("seed")) A.seed = (int64_t)t->seed;
    if (!GIVEN("threads")) A.threads = t->threads;
    if (!GIVEN("recompute")) A.recompute = t->recompute;
    if (!GIVEN("zero")) A.zero = ci->zero_stage;
    if (!GIVEN("subgroup-size") && ci->world > 1 && ci->zero_stage >= 1) A.subgroup_size = ci->subgroup_size;
    if (!GIVEN("data") && ci->data_path[0]) A.data = ci->data_path;
    /* The checkpoint holds the state in one format for every tier: resuming may change it. */
    if (!GIVEN("optimizer-tier")) A.tier = t->tier == MW_OFFLOAD_NVME ? "nvme" : "dram";
    return 0;
}

/* The bundled corpus: ./data/..., else next to the binary (build/memwall -> ../data/...). */
static const char *find_bundled_corpus(char *buf, size_t n)
{
    if (access(BUNDLED_CORPUS, R_OK) == 0) return BUNDLED_CORPUS;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0;
            if ((size_t)snprintf(buf, n, "%s/%s", exe, BUNDLED_CORPUS) < n && access(buf, R_OK) == 0) return buf;
        }
    }
    return NULL;
}

static void fmt_mib(char *b, size_t n, uint64_t bytes, int gib)
{
    if (gib) snprintf(b, n, "%.2f", (double)bytes / 1073741824.0);
    else snprintf(b, n, "%.1f", (double)bytes / 1048576.0);
}

/* "DRAM MiB params/grads/optim/acts 12.6/12.6/25.2/210.0 | NVMe -" */
static void fmt_tiers(char *out, size_t n, const struct mw_train_bytes *b)
{
    uint64_t dram = b->params + b->grads + b->opt_dram + b->acts;
    int gib = dram >= 10ull << 30;
    char p[32], g[32], o[32], a[32], nv[48];
    fmt_mib(p, sizeof p, b->params, gib); fmt_mib(g, sizeof g, b->grads, gib);
    fmt_mib(o, sizeof o, b->opt_dram, gib); fmt_mib(a, sizeof a, b->acts, gib);
    if (b->opt_nvme) mw_fmt_bytes(nv, sizeof nv, b->opt_nvme);
    else snprintf(nv, sizeof nv, "-");
    snprintf(out, n, "DRAM %s params/grads/optim/acts %s/%s/%s/%s | NVMe optim %s",
             gib ? "GiB" : "MiB", p, g, o, a, nv);
}

static void print_sample(const int32_t *tok, int n, enum mw_tokenizer kind)
{
    char buf[32];
    for (int i = 0; i < n; i++) {
        if (kind != MW_TOKENIZER_BYTES) printf("%s%d", i ? " " : "", tok[i]);
        else if (tok[i] < 256 && (tok[i] == '\n' || (tok[i] >= 32 && tok[i] < 127))) putchar(tok[i]);
        else if (tok[i] < 256) printf("\\x%02x", tok[i]); /* not printable ASCII: escaped */
        else { mw_tok_decode(tok[i], buf, sizeof buf); fputs(buf, stdout); }
    }
    putchar('\n');
}

static int run(const char *data_path, const struct mw_gpt2_config *mc, const struct mw_train_config *tc,
               const struct mw_ckpt_info *resume_info);

/* Copies in with every "%r" replaced by the rank; 0 when something was replaced, 1 when not,
 * -1 when the result (with room for a "/rank<r>" suffix) does not fit in n bytes. */
static int expand_rank(const char *in, char *out, size_t n)
{
    size_t o = 0;
    int found = 0;
    for (const char *p = in; *p; p++) {
        if (o + 24 >= n) return -1;
        if (p[0] == '%' && p[1] == 'r') {
            o += (size_t)snprintf(out + o, n - o, "%d", rank);
            p++;
            found = 1;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = 0;
    return found ? 0 : 1;
}

/* MPI (when started by mpirun); the output of rank 0 only. */
static int comm_start(void)
{
    struct mw_comm_config cc;
    mw_comm_config_default(&cc);
    cc.timeout_s = A.comm_timeout;
    cc.deterministic = !strcmp(A.comm_sum, "ordered");
    if (mw_comm_hierarchy_parse(A.hier, &cc.hierarchy)) return usage_error("--zero-hierarchy: %s", mw_error_msg());
    const char *rpn = getenv("MEMWALL_RANKS_PER_NODE"); /* tests: simulated nodes on one host */
    if (rpn) cc.ranks_per_node = atoi(rpn);
    int err = mw_comm_init(&comm, NULL, NULL, &cc);
    if (err) { mw_cli_fail("starting MPI", err); return 1; }
    world = mw_comm_size(comm, MW_COMM_WORLD);
    rank = mw_comm_rank(comm, MW_COMM_WORLD);
    mw_cli_set_rank(rank, world);
    if (world > 1 && rank != 0) {
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout)) { /* rank 0 alone prints progress */
            int e = errno;
            mw_cli_fail("starting MPI", mw_error_set(-e, "cannot send this rank's output to /dev/null: %s", strerror(e)));
            return 1;
        }
    }
    return 0;
}

/* What depends on the rank: the paths with %r. */
static int rank_paths(void)
{
    static char nvme[PATH_MAX], trace[PATH_MAX], resume[PATH_MAX];
    if (world == 1) {
        if (A.zero > 0) mw_log(MW_LOG_WARN, "--zero %d with one rank: nothing to shard (start with mpirun -np N)", (int)A.zero);
        return 0;
    }
    if ((A.nvme_dir && expand_rank(A.nvme_dir, nvme, sizeof nvme) < 0) || (A.trace && expand_rank(A.trace, trace, sizeof trace) < 0) ||
        (A.resume && expand_rank(A.resume, resume, sizeof resume) < 0))
        return usage_error("a path given (--nvme-dir, --trace or --resume) is too long: %s", "more than PATH_MAX bytes with the rank");
    if (A.nvme_dir) {
        if (expand_rank(A.nvme_dir, nvme, sizeof nvme)) snprintf(nvme + strlen(nvme), sizeof nvme - strlen(nvme), "/rank%d", rank);
        A.nvme_dir = nvme;
    } else if (!strcmp(A.tier, "nvme")) {
        snprintf(nvme, sizeof nvme, "run/nvme/rank%d", rank);
        A.nvme_dir = nvme;
    }
    if (A.trace) {
        if (expand_rank(A.trace, trace, sizeof trace))
            return usage_error("--trace %s would be written by every rank: put %%r (the rank) in it, e.g. run/trace.%%r.json", A.trace);
        A.trace = trace;
    }
    if (A.resume) {
        if (expand_rank(A.resume, resume, sizeof resume))
            return usage_error("--resume %s: each rank resumes from its own file; put %%r (the rank) in the path, e.g. "
                               "run/ckpt_00000100.r%%r.mwck", A.resume);
        A.resume = resume;
    }
    return 0;
}

static int train_main(int argc, char **argv);

/* --resume DIR: the commit record of the run in that NVMe directory (docs/resume.md). */
static struct mw_train_resume rsm;
static int resume_dir;
/* --resume: the run's kept settings (train_spec.c), which the option table points into. */
static struct train_spec_applied spec_applied;
static char *ckpt_spec;

/* The first directory of a "d1:d2" list, as "%.*s" arguments. */
#define DIR0(list) (int)strcspn(list, ":"), list

/* A fresh run refused on a directory holding a run that did not finish: how to continue it. */
static void leftover_hint(int err, const char *dirs)
{
    if (err != -EEXIST || !strstr(mw_error_msg(), "did not finish")) return;
    char msg[1400];
    snprintf(msg, sizeof msg, "%s", mw_error_msg());
    struct mw_offload_record rec;
    int has = mw_offload_record_read(dirs, &rec) == 0;
    if (has) mw_offload_record_free(&rec);
    if (has)
        mw_error_set(err, "%s; 'memwall train --resume %.*s' continues it from its last committed step", msg, DIR0(dirs));
    else
        mw_error_set(err, "%s; it stopped before its first step was committed (no %s): there is nothing to resume", msg,
                     MW_OFFLOAD_RECORD_NAME);
}

/* Prints one file of the resumed run with its size. */
static void print_found(const char *path)
{
    struct stat st;
    char b[32];
    if (stat(path, &st) == 0) printf("  found and used: %s (%s)\n", path, mw_fmt_bytes(b, sizeof b, (uint64_t)st.st_size));
    else printf("  found and used: %s (cannot stat: %s)\n", path, strerror(errno));
}

/* The files of the resumed run, each with its size. */
static void list_resume_files(void)
{
    char path[PATH_MAX];
    if (!mw_offload_record_path(rsm.rec.nvme_dir, path, sizeof path)) print_found(path);
    for (uint32_t i = 0; i < rsm.rec.ndirs; i++)
        if (!mw_offload_record_file_path(&rsm.rec, (int)i, path, sizeof path)) print_found(path);
    fflush(stdout);
}

/* --resume DIR: reads the record, makes its settings the defaults of everything the command line
 * did not give (as a checkpoint's), and lists the files of the run that are used. */
static int read_resume_dir(struct mw_ckpt_info *ci)
{
    if (world > 1)
        return usage_error("--resume %s: resuming from the NVMe state runs on one rank for now; resume a multi-rank "
                           "run from its checkpoints (--resume ckpt_N.r%%r.mwck)", A.resume);
    int err = mw_train_resume_read(A.resume, &rsm);
    char done[1024];
    if (err == -ENOENT && mw_offload_run_done_read(A.resume, done, sizeof done) == 0) {
        (void)mw_offload_run_tidy(A.resume); /* a retire cut short: its leftovers */
        printf("the run in %s finished; nothing to resume:\n%s", A.resume, done);
        return 3; /* finished: rc 0 */
    }
    if (err) {
        mw_cli_fail("reading the commit record", err);
        if (err == -ENOENT)
            fprintf(stderr, "memwall train: %s: a run killed before its first step was committed, or one that "
                    "finished, leaves nothing to resume (remove %s/%s.* and start again)\n", A.resume, A.resume,
                    "memwall-offload");
        return 1;
    }
    resume_dir = 1;
    *ci = rsm.info;
    if (rsm.run_spec) { /* the whole run as it was started (train_spec.c) */
        if (GIVEN("nvme-dir") && strcmp(A.nvme_dir, rsm.rec.nvme_dir)) {
            char a[PATH_MAX], b[PATH_MAX];
            if (mw_train_abs_path(A.nvme_dir, a, sizeof a) || mw_train_abs_path(rsm.rec.nvme_dir, b, sizeof b) || strcmp(a, b))
                return usage_error("--nvme-dir differs from the directory given to --resume, %s: give --resume alone", A.resume);
        }
        printf("resuming the run in %s from its last committed step, %" PRId64 " of %" PRId64 " (a step in flight when it "
               "stopped runs again)\n", A.resume, ci->step, ci->train.steps);
        int r = train_spec_apply(&train_spec, rsm.run_spec, A.resume, NULL, ci->step, &spec_applied);
        if (r) return r;
        A.nvme_dir = rsm.rec.nvme_dir; /* where the record is now, whatever the run called it */
        A.tier = "nvme";
        list_resume_files();
        return 0;
    }
    int r = apply_checkpoint(ci);
    if (r) return r;
    if (!GIVEN("offload-params")) A.offload_params = rsm.offload_params == MW_OFFLOAD_NVME ? "nvme" : "dram";
    if (!GIVEN("schedule")) A.schedule = rsm.layer_major ? "layer-major" : "batch-major";
    if (!GIVEN("sync-update")) A.sync_update = rsm.sync_update;
    if (!GIVEN("prefetch-depth")) A.prefetch_depth = rsm.prefetch_depth;
    if (!GIVEN("buffer-count")) A.buffer_count = rsm.buffer_count;
    if (!GIVEN("subgroup-size")) A.subgroup_size = rsm.subgroup_size;
    if (!GIVEN("aio-block-size")) A.aio_block_size = rsm.io_block_size;
    if (!GIVEN("aio-queue-depth")) A.aio_queue_depth = rsm.io_queue_depth;
    if (!GIVEN("nvme-dir")) A.nvme_dir = rsm.rec.nvme_dir;
    A.tier = "nvme";
    printf("resuming the run in %s from its last committed step, %" PRId64 " of %" PRId64 " (a step in flight when it "
           "stopped runs again)\n", A.resume, ci->step, ci->train.steps);
    list_resume_files();
    return 0;
}

/* The settings read from --ds-config: string options point into it until the command ends. */
static struct mw_ds_config ds;

/* --ds-config: every setting of the file whose option the command line did not give, applied
 * through the option table (same checks as typed flags); warnings and what was applied are
 * printed by rank 0. */
static int apply_ds_config(void)
{
    int err = mw_ds_config_load(A.ds_config, world, &ds);
    if (err) {
        fprintf(stderr, "memwall train: --ds-config: %s\n", mw_error_msg());
        return err == -ENOMEM ? 1 : 2;
    }
    if (rank == 0)
        for (int i = 0; i < ds.n_warnings; i++) fprintf(stderr, "memwall train: warning: %s\n", ds.warnings[i]);
    char applied[2048] = "", kept[512] = "";
    for (int i = 0; i < ds.n_settings; i++) {
        const struct mw_ds_setting *st = &ds.settings[i];
        char *dst = GIVEN(st->option) ? kept : applied;
        size_t cap = dst == kept ? sizeof kept : sizeof applied, l = strlen(dst);
        snprintf(dst + l, cap - l, " --%s %s", st->option, st->value);
        if (dst == kept) continue;
        char origin[600];
        snprintf(origin, sizeof origin, "%s: %s", A.ds_config, st->key);
        if (mw_opts_set(&train_spec, st->option, st->value, origin) != MW_OPTS_OK) return 2;
    }
    printf("ds-config %s:%s%s%s\n", A.ds_config, applied[0] ? applied : " (no settings)",
           kept[0] ? " | overridden by the command line:" : "", kept);
    return 0;
}

int mw_cmd_train(int argc, char **argv)
{
    comm = NULL;
    world = 1;
    rank = 0;
    int sig = mw_cli_signals_start("memwall train");
    int rc = train_main(argc, argv);
    if (rc == 3) rc = 0; /* a finished run, resumed: said so */
    if (!sig) mw_cli_signals_stop();
    mw_ds_config_free(&ds);
    mw_train_resume_free(&rsm);
    train_spec_applied_free(&spec_applied);
    free(ckpt_spec);
    ckpt_spec = NULL;
    if (comm) {
        fflush(stdout);
        /* A runtime failure on one rank would leave the others waiting in a collective. */
        if (rc == 1 && world > 1) mw_comm_abort(comm, 1);
        int err = mw_comm_free(comm);
        if (err && !rc) { mw_cli_fail("shutting MPI down", err); rc = 1; }
        comm = NULL;
    }
    mw_cli_set_rank(0, 1);
    return rc;
}

static int train_main(int argc, char **argv)
{
    memset(&A, 0, sizeof A);
    A.preset = prescan_preset(argc, argv)->name;
    set_defaults(find_preset(A.preset));
    char *pos[1];
    int npos = 0;
    int r = mw_opts_parse(&train_spec, argc, argv, pos, &npos);
    if (r == MW_OPTS_HELP) return 0;
    if (r != MW_OPTS_OK) return 2;
    if ((r = comm_start())) return r;
    if (A.ds_config && (r = apply_ds_config())) return r;
    if ((r = rank_paths())) return r;

    struct mw_ckpt_info ci;
    struct stat rst;
    resume_dir = 0;
    if (A.resume && stat(A.resume, &rst) != 0) {
        int e = errno;
        mw_cli_fail("resuming", mw_error_set(-e, "--resume %s: %s (neither a checkpoint nor the NVMe directory of a run)",
                                             A.resume, strerror(e)));
        return 1;
    }
    if (A.resume && S_ISDIR(rst.st_mode)) {
        if ((r = read_resume_dir(&ci))) return r;
    } else if (A.resume) {
        int err = mw_ckpt_read_info(A.resume, &ci);
        if (!err) err = mw_ckpt_read_spec(A.resume, &ckpt_spec);
        if (err) { mw_cli_fail("reading the checkpoint", err); return 1; }
        if (ckpt_spec) {
            printf("resuming the run of %s at step %" PRId64 " of %" PRId64 "\n", A.resume, ci.step, ci.train.steps);
            if ((r = train_spec_apply(&train_spec, ckpt_spec, NULL, A.resume, ci.step, &spec_applied))) return r;
        } else if ((r = apply_checkpoint(&ci))) {
            return r;
        }
    }
    if (A.batch % world) {
        fprintf(stderr, "memwall train: --batch %d is the global batch and must divide by the %d ranks\n"
                "run 'memwall train --help' for the options\n", (int)A.batch, world);
        return 2;
    }
    if (A.policy) {
        enum mw_offload_policy pol;
        int k;
        if (mw_offload_policy_parse(A.policy, &pol, &k)) return usage_error("--offload-policy: %s", mw_error_msg());
    }
    if (A.aio_block_size % 4096) return usage_error("--aio-block-size must be a multiple of 4096 bytes (O_DIRECT)%s", "");
    if (A.ckpt_every > 0 && !A.out_dir) return usage_error("--ckpt-every needs --out-dir%s", "");
    if (!strcmp(A.offload_params, "nvme")) {
        if (!GIVEN("optimizer-tier")) A.tier = "nvme"; /* the streamed weights are the master on NVMe */
        if (strcmp(A.tier, "nvme"))
            return usage_error("--offload-params nvme needs --optimizer-tier nvme: the fp32 master weights on NVMe are the "
                               "streamed weights%s", "");
    } else if (GIVEN("prefetch-depth")) {
        mw_log(MW_LOG_WARN, "--prefetch-depth is used with --offload-params nvme only");
    }
    int streamed = !strcmp(A.offload_params, "nvme");
    int layer_major = !strcmp(A.schedule, "layer-major") || (!strcmp(A.schedule, "auto") && streamed);
    if (!strcmp(A.activations, "nvme") && (!streamed || !layer_major))
        return usage_error("--activations nvme needs --offload-params nvme and the layer-major schedule%s", "");
    if (!strcmp(A.activations, "nvme") && A.recompute)
        return usage_error("--activations nvme keeps the activations that --recompute would recompute: give one%s", "");
    if (A.resume && A.init_st) return usage_error("--init-safetensors cannot be combined with --resume%s", "");
    if (!A.init_st) {
        if (A.seq > A.context) return usage_error("--seq is longer than the model's --context%s", "");
        if (A.width % A.heads) return usage_error("--width must be a multiple of --heads%s", "");
    }

    struct mw_gpt2_config mc = {(int)A.layers, (int)A.heads, (int)A.width, (int)A.context, (int)A.vocab, 0};
    if (A.init_st) {
        /* The files say the shape; a shape flag fills what they do not and must agree with what they do. */
        struct mw_gpt2_config flags = {GIVEN("layers") ? (int)A.layers : 0, GIVEN("heads") ? (int)A.heads : 0,
                                       GIVEN("width") ? (int)A.width : 0, GIVEN("context") ? (int)A.context : 0,
                                       GIVEN("vocab") ? (int)A.vocab : 0, 0};
        struct mw_gpt2_provenance pv;
        int err = mw_gpt2_config_resolve(A.init_st, &flags, &mc, &pv);
        if (err) { mw_cli_fail("reading --init-safetensors", err); return 1; }
        if (rank == 0) {
            printf("model from %s%s%s:\n", A.init_st, pv.config_json[0] ? " and " : " (no config.json beside it)",
                   pv.config_json);
            printf("  n_layer %d (%s), n_head %d (%s), n_embd %d (%s), context %d (%s), vocab %d (%s)\n",
                   mc.n_layer, mw_gpt2_source_name(pv.n_layer), mc.n_head, mw_gpt2_source_name(pv.n_head),
                   mc.n_embd, mw_gpt2_source_name(pv.n_embd), mc.max_seq_len, mw_gpt2_source_name(pv.max_seq_len),
                   mc.vocab_size, mw_gpt2_source_name(pv.vocab_size));
            if (pv.n_head == MW_GPT2_FROM_GUESS)
                mw_log(MW_LOG_WARN, "%s: nothing says the head count; guessed %d (width / 64); give --heads or put "
                       "the model's config.json beside the file", A.init_st, mc.n_head);
        }
        if (A.seq > mc.max_seq_len) return usage_error("--seq is longer than the context of %s", A.init_st);
    } else if (A.resume) {
        struct mw_gpt2_config g;
        if (mw_net_gpt2_config(&ci.net, &g)) return usage_error("--resume: %s (memwall train trains GPT-2 for now)", mw_error_msg());
        mc.padded_vocab_size = g.padded_vocab_size;
    } else {
        /* Pad the output rows to a multiple of 128 (GPT-2: 50257 -> 50304) for the matmuls;
         * a byte vocabulary gets 8. */
        mc.padded_vocab_size = mw_gpt2_padded_vocab(mc.vocab_size);
    }
    struct mw_train_config tc = {
        .batch = (int)A.batch, .seq = (int)A.seq, .grad_accum = (int)A.accum, .steps = A.steps, .lr = A.lr,
        .warmup = A.warmup, .min_lr_frac = A.min_lr_frac, .weight_decay = A.wd, .beta1 = A.beta1,
        .beta2 = A.beta2, .eps = A.eps, .clip = A.clip, .val_every = A.val_every, .val_batches = A.val_batches,
        .ckpt_every = A.ckpt_every, .seed = (uint64_t)A.seed, .threads = (int)A.threads,
        .recompute = A.recompute, .tier = !strcmp(A.tier, "nvme") ? MW_OFFLOAD_NVME : MW_OFFLOAD_DRAM,
        .nvme_dir = A.nvme_dir ? A.nvme_dir : "run/nvme", .subgroup_size = A.subgroup_size,
        .buffer_count = (int)A.buffer_count, .offload_policy = A.policy, .dram_budget = A.dram_budget,
        .nvme_budget = A.nvme_budget, .comm = world > 1 ? comm : NULL, .zero_stage = (int)A.zero,
        .offload_params = !strcmp(A.offload_params, "nvme") ? MW_OFFLOAD_NVME : MW_OFFLOAD_DRAM,
        .prefetch_depth = (int)A.prefetch_depth, .sync_update = A.sync_update,
        .init_safetensors = streamed ? A.init_st : NULL, /* streamed: a unit at a time into the master */
        .layer_major = layer_major,
        .acts_nvme = !strcmp(A.activations, "nvme") ||
                     (!strcmp(A.activations, "auto") && streamed && layer_major && !A.recompute),
        .io_block_size = A.aio_block_size, .io_queue_depth = (unsigned)A.aio_queue_depth, .preread = strcmp(A.preread, "off") != 0,
        .journal = world == 1 && !strcmp(A.tier, "nvme"), .resume = resume_dir ? &rsm.rec : NULL,
    };
    if (tc.threads == 0) tc.threads = omp_get_max_threads();
    /* What the run resolved is what its record keeps (train_spec.c): a resume decides nothing anew. */
    A.threads = tc.threads;
    A.layers = mc.n_layer; A.heads = mc.n_head; A.width = mc.n_embd; A.context = mc.max_seq_len; A.vocab = mc.vocab_size;
    A.schedule = layer_major ? "layer-major" : "batch-major";
    if (streamed && layer_major) A.activations = tc.acts_nvme ? "nvme" : "recompute";
    if (!strcmp(A.tier, "nvme")) A.nvme_dir = tc.nvme_dir;
    char corpus[PATH_MAX];
    const char *data_path = A.data;
    if (!data_path) {
        data_path = find_bundled_corpus(corpus, sizeof corpus);
        if (!data_path) {
            mw_error_set(-ENOENT, "the bundled corpus %s was found neither in the current directory nor next to "
                         "the memwall binary; run from the source tree or give --data FILE", BUNDLED_CORPUS);
            mw_cli_fail("finding the training data", -ENOENT);
            return 1;
        }
    }
    if ((A.nvme_dir || A.nvme_budget) && !strcmp(A.tier, "dram"))
        mw_log(MW_LOG_WARN, "--nvme-dir and --nvme-budget are unused with --optimizer-tier dram");
    return run(data_path, &mc, &tc, A.resume && !resume_dir ? &ci : NULL);
}

struct run_state {
    const char *data_path;        /* absolute */
    char abs_data[PATH_MAX];
    struct mw_train_bytes tb;     /* the model's bytes per tier, as the header printed them */
    int streamed;                 /* weights streamed from NVMe */
    uint64_t tokens_run;          /* tokens trained by this invocation */
    struct mw_train_log log;
    struct mw_train_outlock *outlock;
    struct mw_trace *trace;
    struct mw_trainer tr;
    struct mw_data data;
    char tiers[256];
};

/* The model's own arrays are plain host allocations (the engine's go through its tiers, which
 * record themselves): account them in the trace as host memory. */
static void trace_model_memory(struct run_state *s, const struct mw_train_bytes *tb)
{
    uint64_t total = 0;
    total += tb->params;
    mw_trace_alloc(s->trace, MW_TIER_HOST, MW_KIND_WEIGHTS, tb->params,
                   world > 1 && A.zero == 3 ? "model params (ZeRO-3 shard)" : "model params", total);
    total += tb->grads;
    mw_trace_alloc(s->trace, MW_TIER_HOST, MW_KIND_GRADS, tb->grads, "model grads", total);
    total += tb->acts;
    mw_trace_alloc(s->trace, MW_TIER_HOST, MW_KIND_ACTIVATIONS, tb->acts, "model activations", total);
}

static int do_eval(struct run_state *s, int64_t step, float *val)
{
    int err = mw_trainer_eval(&s->tr, val);
    if (err) { mw_cli_fail("validation", err); return 1; }
    printf("val   step %6" PRId64 " | val_loss %.6f\n", step, *val);
    fflush(stdout);
    return 0;
}

/* The last checkpoint this run wrote, named after a failure (what a re-run resumes from). */
static char last_ckpt[PATH_MAX];
static int64_t last_ckpt_step;

static void ckpt_hint(void)
{
    if (last_ckpt[0])
        fprintf(stderr, "memwall: the last checkpoint, %s (step %" PRId64 "), is intact: continue with --resume %s\n",
                last_ckpt, last_ckpt_step, last_ckpt);
}

static int save_ckpt(struct run_state *s, const char *data_path)
{
    char path[PATH_MAX];
    int pl = world > 1 ? snprintf(path, sizeof path, "%s/ckpt_%08" PRId64 ".r%d.mwck", A.out_dir, s->tr.step, rank)
                       : snprintf(path, sizeof path, "%s/ckpt_%08" PRId64 ".mwck", A.out_dir, s->tr.step);
    if (pl < 0 || (size_t)pl >= sizeof path) {
        mw_cli_fail("writing the checkpoint", mw_error_set(-ENAMETOOLONG, "--out-dir %s is too long for a checkpoint path", A.out_dir));
        return 1;
    }
    uint64_t t0 = mw_now_ns();
    /* ZeRO-3: every rank writes the whole weights beside its optimizer shard. */
    int err = mw_trainer_save(&s->tr, data_path, path);
    if (err) { mw_cli_fail("writing the checkpoint", err); ckpt_hint(); return 1; }
    if (world == 1) {
        snprintf(last_ckpt, sizeof last_ckpt, "%s", path);
        last_ckpt_step = s->tr.step;
    }
    if (world > 1)
        printf("ckpt  step %6" PRId64 " | %s/ckpt_%08" PRId64 ".r%%r.mwck, one per rank (%.1f s)\n", s->tr.step, A.out_dir,
               s->tr.step, (double)(mw_now_ns() - t0) / 1e9);
    else
        printf("ckpt  step %6" PRId64 " | %s (%.1f s)\n", s->tr.step, path, (double)(mw_now_ns() - t0) / 1e9);
    return 0;
}

/* Tests of a disk that fills up during a run: MEMWALL_TEST_STOP_AT=S stops the process (SIGSTOP)
 * after step S and its checkpoint, for the test to fill the disk and continue it (SIGCONT). */
static void test_stop_hook(int64_t step)
{
    const char *e = getenv("MEMWALL_TEST_STOP_AT");
    if (e && atoll(e) == step) {
        fflush(NULL);
        raise(SIGSTOP);
        usleep(300 * 1000); /* a signal sent while stopped is taken (signals.c) before the next step */
    }
}

/* Tests of rank failure: MEMWALL_TEST_EXIT_AT=R:S makes rank R exit(3) after step S. */
static void test_exit_hook(int64_t step)
{
    const char *e = getenv("MEMWALL_TEST_EXIT_AT");
    int r;
    long long st;
    if (e && sscanf(e, "%d:%lld", &r, &st) == 2 && r == rank && st == step) {
        fprintf(stderr, "memwall (rank %d): MEMWALL_TEST_EXIT_AT: exiting with status 3 after step %lld\n", rank, st);
        fflush(NULL);
        exit(3);
    }
}

/* ZeRO-2/3: the gradient and (ZeRO-3) weight memory each rank held, measured; the weights
 * against what the planner predicts for the layout. */
static int report_zero_memory(struct run_state *s, const struct mw_gpt2_config *mc)
{
    struct mw_train_zero_info zi;
    mw_trainer_zero_info(&s->tr, &zi);
    if (zi.stage < 2) return 0;
    uint64_t peak, gpeak;
    int err = mw_trainer_zero_grads_peak(&s->tr, &gpeak);
    if (!err && zi.stage == 3) err = mw_trainer_zero_peak(&s->tr, &peak, 0);
    if (err) { mw_cli_fail("collecting the ZeRO memory figures", err); return 1; }
    {
        char a[32], b[32], c[32];
        printf("ZeRO-%d gradients per rank: peak resident %s (%" PRIu64 " bytes; the largest over the %d ranks, measured "
               "with mincore) of %s for the whole model; owned shard %s, the rest only until each bucket is reduced\n",
               zi.stage, mw_fmt_bytes(a, sizeof a, gpeak), gpeak, world,
               mw_fmt_bytes(b, sizeof b, s->tr.model.sizes.grads_bytes), mw_fmt_bytes(c, sizeof c, zi.own_n * sizeof(float)));
    }
    if (zi.stage != 3) return 0;
    struct mw_plan_zero3_weights pz;
    int vp = mc->padded_vocab_size ? mc->padded_vocab_size : mc->vocab_size;
    if ((err = mw_plan_gpt2_zero3_weights(mc->n_layer, mc->n_embd, mc->n_head, vp, mc->max_seq_len, zi.shard_ranks, 4.0, &pz))) {
        mw_cli_fail("the planner's ZeRO-3 prediction", err);
        return 1;
    }
    char a[32], b[32], c[32];
    printf("ZeRO-3 weights per rank: peak resident %s (%" PRIu64 " bytes; the largest over the %d ranks, measured with "
           "mincore) | rank 0's shard %s | whole model %zu bytes (%s)\n", mw_fmt_bytes(a, sizeof a, peak), peak, world,
           mw_fmt_bytes(b, sizeof b, zi.own_n * sizeof(float)), s->tr.model.sizes.params_bytes,
           mw_fmt_bytes(c, sizeof c, s->tr.model.sizes.params_bytes));
    printf("  planner predicts %s (%" PRIu64 " bytes: shard %s + gathered %s, the %s and a %s); measured/predicted %.3f\n",
           mw_fmt_bytes(a, sizeof a, pz.total_bytes), pz.total_bytes, mw_fmt_bytes(b, sizeof b, pz.shard_bytes),
           mw_fmt_bytes(c, sizeof c, pz.gathered_bytes), pz.largest_unit, pz.second_unit,
           (double)peak / (double)pz.total_bytes);
    return 0;
}

/* The trace, once the trainer is gone (its tiers record their frees). 0 or 1 (printed). */
static int write_trace(struct run_state *s)
{
    mw_trainer_free(&s->tr);
    int err = mw_trace_write(s->trace, A.trace);
    if (err) { mw_cli_fail("writing the trace", err); return 1; }
    printf("trace: %s\n", A.trace);
    fflush(stdout);
    if ((err = mw_report_text_summary(A.trace, stdout))) { mw_cli_fail("summarising the trace", err); return 1; }
    return 0;
}

/* Every output is durable: the NVMe state goes, a marker of the finished run stays. */
static int retire_state(const struct mw_train_config *tc)
{
    char done[PATH_MAX + 256];
    snprintf(done, sizeof done, "finished all %" PRId64 " steps%s%s\n", tc->steps, A.out_dir ? "; the model: " : "",
             A.out_dir ? A.out_dir : "");
    if (A.out_dir) snprintf(done + strlen(done) - 1, sizeof done - strlen(done) + 1, "/model.safetensors\n");
    return mw_offload_run_retire(tc->nvme_dir, done);
}

/* SIGINT/SIGTERM (signals.c), the same answer on every rank (they stop after the same step). */
static int stop_requested(struct run_state *s)
{
    uint64_t sig = (uint64_t)mw_cli_stop_signal(), any = sig;
    if (world > 1 && mw_trainer_max_u64(&s->tr, sig, &any)) return 0;
    return (int)any;
}

/* The run stops between steps: the step in flight committed, a checkpoint where there is no
 * commit record, the log and the trace written, and how to continue. Returns 128 + the signal. */
static int stop_run(struct run_state *s, int sig, const char *data_path)
{
    const struct mw_train_config *tc = &s->tr.cfg;
    int journal = tc->journal, err = mw_trainer_finish(&s->tr);
    if (err) mw_cli_fail("finishing the step in flight", err);
    char how[PATH_MAX + 64] = "";
    int64_t step = s->tr.step, steps = tc->steps;
    if (!err && journal)
        snprintf(how, sizeof how, "memwall train --resume %.*s", DIR0(tc->nvme_dir));
    else if (!err && A.out_dir && !save_ckpt(s, data_path) && world == 1)
        snprintf(how, sizeof how, "memwall train --resume %s", last_ckpt);
    else if (!err && A.out_dir && world > 1)
        snprintf(how, sizeof how, "mpirun -np %d memwall train --resume %s/ckpt_%08" PRId64 ".r%%r.mwck", world, A.out_dir, step);
    if ((err = mw_train_log_close(&s->log))) mw_cli_fail("writing --log-json", err);
    if (s->trace) write_trace(s);
    fprintf(stderr, "memwall train: stopped by %s after step %" PRId64 " of %" PRId64 "; %s%s\n",
            sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal", step, steps,
            how[0] ? "continue with: " : "nothing was saved to continue from (give --out-dir, or --optimizer-tier nvme)",
            how);
    return 128 + sig;
}

/* --dram-budget with the streamed run's knobs left to memwall: the budget picks them
 * (mw_train_fit_budget); a resumed run keeps its own. 0 or 1 (printed). */
static int fit_budget(const struct mw_gpt2_config *mc, struct mw_train_config *tc)
{
    if (A.resume || world > 1) return 0;
    unsigned free_knobs = (GIVEN("subgroup-size") ? 0u : MW_FIT_SUBGROUP) | (GIVEN("buffer-count") ? 0u : MW_FIT_BUFFERS) |
                          (GIVEN("prefetch-depth") ? 0u : MW_FIT_PREFETCH) |
                          (!strcmp(A.activations, "auto") || !GIVEN("activations") ? MW_FIT_ACTS : 0u);
    struct mw_train_fit fit;
    struct mw_net_config nc;
    mw_net_config_gpt2(&nc, mc);
    int err = mw_train_fit_budget(&nc, tc, free_knobs, &fit);
    if (err) { mw_cli_fail("fitting the run into --dram-budget", err); return 1; }
    if (!fit.changed) return 0;
    char b1[32], b2[32];
    printf("  --dram-budget %s chose: subgroups of %llu parameters, %d staging buffers, prefetch depth %d, block "
           "activations %s (planned peak %s; %d plan%s tried)\n", mw_fmt_bytes(b1, sizeof b1, tc->dram_budget),
           (unsigned long long)tc->subgroup_size, tc->buffer_count, tc->prefetch_depth,
           tc->acts_nvme ? "on NVMe" : "recomputed", mw_fmt_bytes(b2, sizeof b2, fit.chosen_total), fit.tried,
           fit.tried == 1 ? "" : "s");
    /* What the run resolved is what its record keeps. */
    A.subgroup_size = tc->subgroup_size;
    A.buffer_count = tc->buffer_count;
    A.prefetch_depth = tc->prefetch_depth;
    if (tc->layer_major) A.activations = tc->acts_nvme ? "nvme" : "recompute";
    return 0;
}

/* Data, trace, the trainer and its outputs checked, the log opened: 0, or 1 (printed). */
static int run_setup(struct run_state *s, const char *data_path, const struct mw_gpt2_config *mc,
                     const struct mw_train_config *tc, const struct mw_ckpt_info *resume_info)
{
    int err;
    struct mw_data_opts dopt;
    mw_data_opts_default(&dopt);
    if ((err = mw_data_open(&s->data, data_path, &dopt))) { mw_cli_fail("opening the data", err); return 1; }
    /* Checkpoints record the absolute path, so --resume works from any directory. */
    if (!realpath(data_path, s->abs_data)) snprintf(s->abs_data, sizeof s->abs_data, "%s", data_path);
    data_path = s->data_path = s->abs_data;
    struct mw_ckpt_info ck_probe;
    if (tc->ckpt_every > 0 && strlen(data_path) >= sizeof ck_probe.data_path) { /* refused now, not at the first checkpoint */
        err = mw_error_set(-ENAMETOOLONG, "the data path is %zu bytes, and a checkpoint records at most %zu (move or "
                           "link the data to a shorter path): %s", strlen(data_path), sizeof ck_probe.data_path - 1, data_path);
        mw_cli_fail("checking --ckpt-every", err);
        return 1;
    }
    struct mw_train_config tcfg = *tc;
    if (A.trace) {
        if ((err = mw_trace_init(&s->trace, 0))) { mw_cli_fail("creating the trace recorder", err); return 1; }
        mw_trace_thread_name(s->trace, "train");
        mw_trace_meta(s->trace, "command", "memwall train");
        char v[32];
        snprintf(v, sizeof v, "%d", rank);
        mw_trace_meta(s->trace, "rank", v);
        snprintf(v, sizeof v, "%d", world);
        mw_trace_meta(s->trace, "world_size", v);
        snprintf(v, sizeof v, "%d", world > 1 ? (int)A.zero : 0);
        mw_trace_meta(s->trace, "zero_stage", v);
        tcfg.trace = s->trace;
        if (comm) mw_comm_set_trace(comm, s->trace);
        if ((resume_info || resume_dir) && (err = mw_trace_continue(s->trace, A.trace))) {
            mw_cli_fail("continuing the trace", err);
            return 1;
        }
    }
    if ((err = fit_budget(mc, &tcfg))) return 1;
    struct mw_net_config nc;
    mw_net_config_gpt2(&nc, mc);
    if ((err = mw_trainer_init(&s->tr, &nc, &tcfg, &s->data))) {
        leftover_hint(err, tc->nvme_dir);
        mw_cli_fail(resume_dir ? "resuming from the NVMe state" : "building the model", err);
        return 1;
    }
    {
        A.data = data_path; /* absolute */
        char *spec = NULL;
        if ((err = train_spec_build(&train_spec, A.out_dir, tc->journal ? tc->nvme_dir : NULL, &spec)) ||
            (err = mw_trainer_set_run_spec(&s->tr, spec))) {
            free(spec);
            mw_cli_fail("recording the run's settings", err);
            return 1;
        }
        free(spec);
    }
    if (rank == 0 || world == 1) {
        /* Every output before the first step (src/train/outputs.c), the out-dir locked for this run. */
        uint64_t mb = s->tr.model.sizes.params_bytes + (1u << 20);
        struct mw_train_outputs oo = {A.out_dir, A.log_json, A.trace, data_path, mb,
                                      A.out_dir && tc->ckpt_every > 0 ? mw_trainer_ckpt_bytes(&s->tr) : 0};
        if ((err = mw_train_outputs_check(&oo, &s->outlock))) { mw_cli_fail("checking the outputs", err); return 1; }
    }
    if (A.init_st && !tcfg.init_safetensors && (err = mw_net_load_safetensors(&s->tr.model, A.init_st))) {
        mw_cli_fail("loading --init-safetensors", err);
        return 1;
    }
    if (resume_info && (err = mw_trainer_load(&s->tr, A.resume))) { mw_cli_fail("resuming from the checkpoint", err); return 1; }
    /* From here on every committed step is durable: a kill leaves a run that --resume DIR continues. */
    if (tc->journal && (err = mw_trainer_journal_begin(&s->tr, data_path))) {
        leftover_hint(err, tc->nvme_dir);
        mw_cli_fail("starting the commit records", err);
        return 1;
    }
    if (A.out_dir && (err = mw_mkdir_p(A.out_dir, 0777))) { mw_cli_fail("creating --out-dir", err); return 1; }
    if (A.log_json && rank == 0) {
        int dropped = 0;
        if ((err = mw_train_log_open(&s->log, A.log_json, resume_info || resume_dir ? s->tr.step : -1, &dropped))) {
            mw_cli_fail("opening --log-json", err);
            return 1;
        }
        if (dropped)
            printf("  log %s: %d line%s after step %" PRId64 " dropped (they run again)\n", A.log_json, dropped,
                   dropped == 1 ? "" : "s", s->tr.step);
    }
    return 0;
}

/* What the run is, before its first step. */
static void print_header(struct run_state *s, const struct mw_gpt2_config *mc, const struct mw_train_config *tc,
                         const struct mw_ckpt_info *resume_info)
{
    const char *data_path = s->data_path;
    struct mw_train_bytes tb;
    mw_trainer_bytes(&s->tr, &tb);
    s->tb = tb;
    if (s->trace) trace_model_memory(s, &tb);
    fmt_tiers(s->tiers, sizeof s->tiers, &tb);
    char b1[32], b2[32];
    printf("memwall train: GPT-2 L=%d heads=%d width=%d context=%d vocab=%d (%zu params, %s fp32)\n",
           mc->n_layer, mc->n_head, mc->n_embd, mc->max_seq_len, mc->vocab_size, s->tr.model.sizes.n_params,
           mw_fmt_bytes(b1, sizeof b1, s->tr.model.sizes.params_bytes));
    printf("  data %s: %" PRIu64 " tokens (%s), %" PRIu64 " train / %" PRIu64 " validation\n", data_path,
           s->data.n_tokens, s->data.tokenizer == MW_TOKENIZER_BYTES ? "byte tokenizer" : "pre-tokenised shards",
           s->data.n_train_tokens, s->data.n_val_tokens);
    printf("  batch %d x seq %d x grad-accum %d = %d tokens/step, %" PRId64 " steps, lr %g (warm-up %" PRId64
           ", cosine to %g), threads %d, optimizer AdamW in %s%s\n",
           tc->batch, tc->seq, tc->grad_accum, tc->batch * tc->seq * tc->grad_accum, tc->steps, tc->lr,
           tc->warmup, tc->lr * tc->min_lr_frac, tc->threads, A.tier, tc->recompute ? ", recompute" : "");
    printf("  AdamW betas %g/%g, eps %g, weight decay %g, clip %g\n", tc->beta1, tc->beta2, tc->eps, tc->weight_decay,
           tc->clip);
    printf("  memory: %s (activations %s)\n", s->tiers, mw_fmt_bytes(b2, sizeof b2, tb.acts));
    if (!strcmp(A.tier, "nvme"))
        printf("  optimizer state (fp32 master + moments, two slots) on NVMe in %s: %s; I/O in pieces of %s, "
               "%u in flight, %d staging buffers\n", tc->nvme_dir, mw_fmt_bytes(b1, sizeof b1, tb.opt_nvme),
               mw_fmt_bytes(b2, sizeof b2, tc->io_block_size ? tc->io_block_size : 1u << 20),
               tc->io_queue_depth ? tc->io_queue_depth : 128u, tc->buffer_count);
    if (world > 1) {
        struct mw_train_zero_info zi;
        mw_trainer_zero_info(&s->tr, &zi);
        printf("  data parallel: %d ranks on %d node%s (MPI), global batch %d = %d per rank, ZeRO-%d", world,
               mw_comm_nodes(comm), mw_comm_nodes(comm) == 1 ? "" : "s", tc->batch, tc->batch / world, zi.stage);
        if (zi.stage >= 1)
            printf(", hierarchy %s (shard over %d rank%s, %d replica%s), subgroups of %" PRIu64 " params, rank 0 owns %" PRIu64
                   " of them", A.hier, zi.shard_ranks, zi.shard_ranks == 1 ? "" : "s", zi.replicas, zi.replicas == 1 ? "" : "s",
                   zi.subgroup_size, zi.own_n);
        printf("\n");
    }
    struct mw_train_stream_info si;
    mw_trainer_stream_info(&s->tr, &si);
    s->streamed = si.active;
    if (si.active && s->trace) { /* the residency lanes of the report name the units */
        char k[32], v[32];
        int nu = s->tr.model.n_units;
        snprintf(v, sizeof v, "%d", nu);
        mw_trace_meta(s->trace, "units", v);
        for (int u = 0; u < nu; u++) {
            snprintf(k, sizeof k, "unit.%d.name", u);
            mw_net_unit_name(&s->tr.model, u, v, sizeof v);
            mw_trace_meta(s->trace, k, v);
        }
    }
    if (si.active) {
        char b[9][32];
        printf("  streaming: weights and gradients on NVMe with the optimizer state, a weight unit at a time in DRAM "
               "(prefetch depth %d, schedule %s, block activations %s)%s\n", si.prefetch_depth,
               tc->layer_major ? "layer-major" : "batch-major",
               tc->acts_nvme ? "on NVMe" : tc->layer_major || tc->recompute ? "recomputed" : "in DRAM",
               world > 1 && A.zero >= 1 ? "; each rank reads its own shard and all-gathers the rest of a unit"
               : world > 1 ? "; each rank streams the whole model from its own NVMe directory" : "");
        printf("  planned DRAM peak %s = runtime %s + activations %s + optimizer staging %s + streamed weights and "
               "gradients %s (weights at most %s, gradients at most %s)%s%s%s%s\n", mw_fmt_bytes(b[0], 32, si.planned_total),
               mw_fmt_bytes(b[1], 32, si.planned_runtime), mw_fmt_bytes(b[2], 32, si.planned_acts),
               mw_fmt_bytes(b[3], 32, si.planned_staging), mw_fmt_bytes(b[4], 32, si.planned_streamed),
               mw_fmt_bytes(b[5], 32, si.planned_weights), mw_fmt_bytes(b[6], 32, si.planned_grads),
               si.planned_dp ? " + collective buffers " : "", si.planned_dp ? mw_fmt_bytes(b[8], 32, si.planned_dp) : "",
               tc->dram_budget ? ", budget " : "", tc->dram_budget ? mw_fmt_bytes(b[7], 32, tc->dram_budget) : "");
    }
    if (A.trace) printf("  trace: %s%s\n", A.trace, world > 1 ? " (this rank's; one file per rank)" : "");
    if (resume_info || resume_dir) printf("  resumed from %s at step %" PRId64 "\n", A.resume, s->tr.step);
    if (tc->journal)
        printf("  commit record: %.*s/%s after every step (kill -9 loses at most the step in flight; "
               "'memwall train --resume %.*s' continues)\n", DIR0(tc->nvme_dir), MW_OFFLOAD_RECORD_NAME, DIR0(tc->nvme_dir));
    fflush(stdout);
}

/* The steps until the last, or a stop: 0, 1 (printed) or 128 + the signal. */
static int train_steps(struct run_state *s, const struct mw_train_config *tc, const struct mw_ckpt_info *resume_info)
{
    int err;
    if ((resume_info || resume_dir) && s->tr.step >= tc->steps)
        printf("all %" PRId64 " steps of the run were committed before it stopped: finishing its outputs\n", tc->steps);
    float val = 0;
    if (tc->val_every > 0 && s->tr.step == 0) {
        if (do_eval(s, 0, &val)) return 1;
        if ((err = mw_train_log_val(&s->log, 0, val))) { mw_cli_fail("writing --log-json", err); return 1; }
    }
    while (s->tr.step < tc->steps) {
        int stop = stop_requested(s);
        if (stop) return stop_run(s, stop, s->data_path);
        struct mw_train_step_stats st;
        if ((err = mw_trainer_step(&s->tr, &st))) {
            mw_cli_fail("the training step", err);
            ckpt_hint();
            if (tc->journal)
                fprintf(stderr, "memwall train: the NVMe state of the last committed step is kept in %.*s: "
                        "'memwall train --resume %.*s' continues the run\n", DIR0(tc->nvme_dir), DIR0(tc->nvme_dir));
            return 1;
        }
        s->tokens_run += st.tokens;
        double ms = (double)st.ns / 1e6, tps = (double)st.tokens / ((double)st.ns / 1e9);
        test_exit_hook(st.step);
        char io[160] = "";
        if (st.nvme_read_bytes + st.nvme_write_bytes) {
            char r1[32], r2[32];
            snprintf(io, sizeof io, " | NVMe %s (%s)", mw_fmt_bytes(r1, sizeof r1, st.nvme_read_bytes + st.nvme_write_bytes),
                     mw_fmt_rate(r2, sizeof r2, (double)(st.nvme_read_bytes + st.nvme_write_bytes) / ((double)st.ns / 1e9)));
        }
        if (world > 1) {
            char c1[32];
            size_t l = strlen(io);
            snprintf(io + l, sizeof io - l, " | comm %s sent, %.1f ms waited", mw_fmt_bytes(c1, sizeof c1, st.comm_sent_bytes),
                     st.comm_wait_s * 1e3);
        }
        int last = st.step == tc->steps;
        int have_val = tc->val_every > 0 && (st.step % tc->val_every == 0 || last);
        if (st.step % A.print_every == 0 || last || st.step == 1 || st.skipped)
            printf("step %6" PRId64 "/%" PRId64 " | loss %.6f | lr %.2e | norm %6.3f%s | %7.0f tok/s | %8.1f ms | %s%s\n",
                   st.step, tc->steps, st.loss, st.lr, st.grad_norm,
                   st.skipped ? " (inf/NaN: skipped)" : st.clipped ? " (clipped)" : "", tps, ms, s->tiers, io);
        fflush(stdout);
        if (have_val && do_eval(s, st.step, &val)) return 1;
        if ((err = mw_train_log_step(&s->log, &st, have_val ? &val : NULL, &s->tb, world, world > 1 ? (int)A.zero : 0))) {
            mw_cli_fail("writing --log-json", err);
            return 1;
        }
        if (tc->ckpt_every > 0 && (st.step % tc->ckpt_every == 0 || last) && save_ckpt(s, s->data_path)) return 1;
        test_stop_hook(st.step);
    }
    return 0;
}

/* Streamed runs: the measured peak beside the plan. 0 or 1 (printed). */
static int report_streaming(struct run_state *s, const struct mw_train_config *tc)
{
    int err;
    if (s->streamed) {
        struct mw_train_stream_info se;
        mw_trainer_stream_info(&s->tr, &se);
        /* Several ranks: the largest figures over them, and the worst rank's ratio. */
        uint64_t hwm = mw_proc_mem("VmHWM"), planned = se.planned_total, ratio = planned ? hwm * 1000000 / planned : 0;
        if ((err = mw_trainer_max_u64(&s->tr, hwm, &hwm)) || (err = mw_trainer_max_u64(&s->tr, planned, &planned)) ||
            (err = mw_trainer_max_u64(&s->tr, ratio, &ratio))) {
            mw_cli_fail("collecting the memory figures", err);
            return 1;
        }
        char b[6][32];
        printf("streaming: measured peak resident set (VmHWM) %s vs planned %s (measured/planned %.3f%s)%s%s; weights "
               "resident at most %s; NVMe: weights fetched %s, gradients written %s; blocked on fetches %.2f s\n",
               mw_fmt_bytes(b[0], 32, hwm), mw_fmt_bytes(b[1], 32, planned), (double)ratio / 1e6,
               world > 1 ? ", the largest over the ranks" : "", tc->dram_budget ? ", budget " : "",
               tc->dram_budget ? mw_fmt_bytes(b[2], 32, tc->dram_budget) : "", mw_fmt_bytes(b[3], 32, se.resident_peak),
               mw_fmt_bytes(b[4], 32, se.fetch_bytes), mw_fmt_bytes(b[5], 32, se.grad_write_bytes), se.wait_s);
    }
    return 0;
}

/* The final outputs, durable, then the NVMe state goes. 0 or 1 (printed). */
static int finish_outputs(struct run_state *s, const struct mw_gpt2_config *mc, const struct mw_train_config *tc)
{
    int err;
    if (A.out_dir) {
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", A.out_dir) >= sizeof path) {
            err = mw_error_set(-ENAMETOOLONG, "--out-dir %s is too long for %s/model.safetensors", A.out_dir, A.out_dir);
            mw_cli_fail("writing the model", err);
            return 1;
        }
        err = mw_trainer_save_safetensors(&s->tr, path, rank == 0);
        if (err) { mw_cli_fail("writing the model", err); return 1; }
        printf("model: %s\n", path);
    }
    if ((err = mw_train_log_close(&s->log))) { mw_cli_fail("writing --log-json", err); return 1; }
    if (A.sample_len > 0) {
        int32_t prompt = s->data.tokenizer == MW_TOKENIZER_BYTES ? MW_TOK_EOT : (mc->vocab_size > 50256 ? 50256 : 0);
        int32_t *out = malloc((size_t)A.sample_len * sizeof *out);
        if (!out) { mw_error_set(-ENOMEM, "no memory"); mw_cli_fail("sampling", -ENOMEM); return 1; }
        err = mw_trainer_sample(&s->tr, &prompt, 1, (int)A.sample_len, (float)A.temperature, (int)A.top_k,
                                (uint64_t)A.seed, out);
        if (err) { free(out); mw_cli_fail("sampling", err); return 1; }
        printf("sample (%" PRId64 " tokens, temperature %g, top-k %" PRId64 ", seed %" PRId64 "):\n"
               "----------------------------------------\n", A.sample_len, A.temperature, A.top_k, A.seed);
        print_sample(out, (int)A.sample_len, s->data.tokenizer);
        printf("----------------------------------------\n");
        free(out);
    }
    if (A.log_json) printf("log: %s\n", A.log_json);
    /* The commit record and the store files are kept at free; they go once every output is written. */
    if (tc->journal && (err = mw_trainer_finish(&s->tr))) { mw_cli_fail("finishing the last step", err); return 1; }
    if (s->trace && write_trace(s)) return 1;
    mw_trainer_free(&s->tr);
    if (tc->journal && (err = retire_state(tc))) { mw_cli_fail("removing the run's NVMe files", err); return 1; }
    return 0;
}

static int run(const char *data_path, const struct mw_gpt2_config *mc, const struct mw_train_config *tc,
               const struct mw_ckpt_info *resume_info)
{
    struct run_state s;
    memset(&s, 0, sizeof s);
    int rc = run_setup(&s, data_path, mc, tc, resume_info);
    if (rc) goto out;
    print_header(&s, mc, tc, resume_info);
    uint64_t t_run = mw_now_ns();
    if ((rc = train_steps(&s, tc, resume_info))) goto out;
    double secs = (double)(mw_now_ns() - t_run) / 1e9;
    if (s.tokens_run)
        printf("done: %" PRIu64 " tokens in %.1f s, %.0f tokens/s\n", s.tokens_run, secs, (double)s.tokens_run / secs);
    if (world > 1 && s.tr.zero && !s.tr.stream && report_zero_memory(&s, mc)) { rc = 1; goto out; }
    if ((rc = report_streaming(&s, tc)) || (rc = finish_outputs(&s, mc, tc))) goto out;
out:
    mw_train_log_close(&s.log);
    mw_trainer_free(&s.tr);
    mw_train_outputs_release(s.outlock);
    if (comm) mw_comm_set_trace(comm, NULL); /* the recorder goes; MPI stays until mw_cmd_train ends */
    mw_trace_free(s.trace);
    mw_data_free(&s.data);
    return rc;
}
