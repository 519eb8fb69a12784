/*
 * train_opts.c — `memwall train`'s presets and option table (the table points into one invocation's
 * arguments, so it is made per invocation: train_opts_init). Why presets are applied before
 * parsing: the table prints its defaults from the destinations, so `memwall train --preset tiny
 * --help` shows tiny's real defaults.
 */
#include "cli/train_cli.h"

static const struct preset presets[] = {
    /* A few million parameters that learn English spelling and verse structure in two minutes. */
    {"demo", 4, 4, 256, 256, MW_TOK_BYTE_VOCAB, 8, 128, 400, 20, 50, 8, 300, 2e-3},
    /* HF gpt2 (124M) shapes; the step count is for measuring, not for converging. */
    {"gpt2-124m", 12, 12, 768, 1024, 50257, 4, 256, 20, 5, 0, 4, 64, 6e-4},
    /* For tests: trains in milliseconds. */
    {"tiny", 2, 2, 32, 64, MW_TOK_BYTE_VOCAB, 4, 32, 20, 2, 10, 2, 32, 1e-3},
};

static const char *const preset_names[] = {"demo", "gpt2-124m", "tiny", NULL};
static const char *const tier_names[] = {"dram", "nvme", NULL};
static const char *const hier_names[] = {"global", "node", NULL};
static const char *const sum_names[] = {"ordered", "mpi", NULL};
static const char *const schedule_names[] = {"auto", "layer-major", "batch-major", NULL};
static const char *const acts_names[] = {"auto", "recompute", "nvme", NULL};
static const char *const preread_names[] = {"auto", "on", "off", NULL};


/* The option table, pointing into this invocation's arguments (c->A). */
void train_opts_init(struct train_cli *c)
{
    const struct mw_opt t[] = {
        {"preset", MW_OPT_CHOICE, &c->A.preset, NULL, "model size and run length; the defaults below follow it", 0, 0, preset_names},
        {"layers", MW_OPT_INT, &c->A.layers, "N", "transformer blocks", 1, 1000, NULL},
        {"heads", MW_OPT_INT, &c->A.heads, "N", "attention heads (width must divide by it)", 1, 1000, NULL},
        {"width", MW_OPT_INT, &c->A.width, "N", "model width (channels)", 1, 65536, NULL},
        {"context", MW_OPT_INT, &c->A.context, "N", "the model's maximum sequence length, tokens", 1, 1 << 20, NULL},
        {"vocab", MW_OPT_INT, &c->A.vocab, "N", "vocabulary size, tokens (bytes: 257)", 2, 1 << 20, NULL},
        {"batch", MW_OPT_INT, &c->A.batch, "N", "sequences per micro-batch", 1, 1 << 20, NULL},
        {"seq", MW_OPT_INT, &c->A.seq, "N", "tokens per sequence (<= context)", 1, 1 << 20, NULL},
        {"grad-accum", MW_OPT_INT, &c->A.accum, "N", "micro-batches per optimizer step", 1, 1 << 20, NULL},
        {"steps", MW_OPT_INT, &c->A.steps, "N", "optimizer steps of the run", 0, 1e12, NULL},
        {"lr", MW_OPT_DOUBLE, &c->A.lr, "X", "peak learning rate", 0, 10, NULL},
        {"warmup", MW_OPT_INT, &c->A.warmup, "N", "linear warm-up, steps", 0, 1e12, NULL},
        {"min-lr-frac", MW_OPT_DOUBLE, &c->A.min_lr_frac, "X", "cosine decays to lr * X at the last step", 0, 1, NULL},
        {"weight-decay", MW_OPT_DOUBLE, &c->A.wd, "X", "AdamW decoupled weight decay (2-D tensors)", 0, 10, NULL},
        {"beta1", MW_OPT_DOUBLE, &c->A.beta1, "X", "AdamW first-moment decay", 0, 0.999999, NULL},
        {"beta2", MW_OPT_DOUBLE, &c->A.beta2, "X", "AdamW second-moment decay", 0, 0.999999, NULL},
        {"eps", MW_OPT_DOUBLE, &c->A.eps, "X", "AdamW epsilon (added to the root of the second moment)", 1e-30, 1, NULL},
        {"clip", MW_OPT_DOUBLE, &c->A.clip, "X", "global gradient-norm clip; 0 = off", 0, 1e9, NULL},
        {"val-every", MW_OPT_INT, &c->A.val_every, "N", "validation loss every N steps (and at start and end); 0 = never", 0, 1e12, NULL},
        {"val-batches", MW_OPT_INT, &c->A.val_batches, "N", "micro-batches per validation", 1, 1e9, NULL},
        {"ckpt-every", MW_OPT_INT, &c->A.ckpt_every, "N", "checkpoint every N steps (and at the end) into --out-dir; 0 = never", 0, 1e12, NULL},
        {"out-dir", MW_OPT_STRING, &c->A.out_dir, "DIR", "checkpoints and the final model.safetensors go here (none if unset)", 0, 0, NULL},
        {"resume", MW_OPT_STRING, &c->A.resume, "FILE|DIR", "continue a run: alone, it finishes what the run was started to do (every setting, the out-dir, log and trace are kept with the run; a flag given differs as listed in docs/resume.md: allowed, announced or refused). FILE: a checkpoint (several ranks: ckpt_N.r%r.mwck); DIR: the --nvme-dir of a run that stopped (--optimizer-tier nvme, one rank), from its last committed step", 0, 0, NULL},
        {"init-hf", MW_OPT_STRING, &c->A.init_hf, "DIR", "start from a Hugging Face model directory (config.json, and model.safetensors or a sharded checkpoint's model.safetensors.index.json and shards; fp32/bf16/fp16 as the family reads them): its model_type picks the model family, its files set the shape", 0, 0, NULL},
        {"save-hf", MW_OPT_STRING, &c->A.save_hf, "DIR", "at the end, write the model as a Hugging Face directory (config.json + model.safetensors) that transformers' from_pretrained loads; --out-dir gets the same two files", 0, 0, NULL},
        {"tokenizer", MW_OPT_STRING, &c->A.tokenizer, "FILE|DIR", "a Hugging Face tokenizer.json (or a directory holding one) for the end-of-run sample's text and --save-hf's directory (default: --init-hf's, when it has one)", 0, 0, NULL},
        {"init-safetensors", MW_OPT_STRING, &c->A.init_st, "FILE", "start from these weights (HF gpt2 model.safetensors, with the config.json beside it when present); the files set the model shape, shape flags fill what they do not say", 0, 0, NULL},
        {"data", MW_OPT_STRING, &c->A.data, "FILE|DIR", "text file(s) or llm.c .bin shards (default: the bundled corpus " BUNDLED_CORPUS ")", 0, 0, NULL},
        {"seed", MW_OPT_INT, &c->A.seed, "N", "seed of the weights and the batch order (same seed: bitwise same run)", 0, 9.2e18, NULL},
        {"threads", MW_OPT_INT, &c->A.threads, "N", "CPU threads (OpenMP and OpenBLAS); 0 = all cores", 0, 4096, NULL},
        {"recompute", MW_OPT_FLAG, &c->A.recompute, NULL, "recompute activations in backward (less memory, same gradients)", 0, 0, NULL},
        {"log-json", MW_OPT_STRING, &c->A.log_json, "FILE", "one JSON object per step (step, loss, val_loss, tokens_per_s, ms, ...)", 0, 0, NULL},
        {"trace", MW_OPT_STRING, &c->A.trace, "FILE", "trace of the run (Chrome/Perfetto JSON, for 'memwall report'); a summary is printed at the end; several ranks: one per rank, put %r in FILE", 0, 0, NULL},
        {"optimizer-tier", MW_OPT_CHOICE, &c->A.tier, NULL, "where the AdamW state (master weights, moments) lives: host DRAM or NVMe files", 0, 0, tier_names},
        {"offload-params", MW_OPT_CHOICE, &c->A.offload_params, NULL, "where the weights and gradients live between uses: host DRAM, or streamed unit by unit from NVMe with the optimizer state (implies --optimizer-tier nvme; under mpirun each rank streams its own state: its ZeRO shard, or the whole model at --zero 0)", 0, 0, tier_names},
        {"prefetch-depth", MW_OPT_INT, &c->A.prefetch_depth, "N", "--offload-params nvme: weight units read ahead of their use", 0, 8, NULL},
        {"sync-update", MW_OPT_FLAG, &c->A.sync_update, NULL, "finish each optimizer step before the next forward pass (default with --optimizer-tier nvme on one rank: the update runs behind the next forward, each unit waiting for its own; same results)", 0, 0, NULL},
        {"schedule", MW_OPT_CHOICE, &c->A.schedule, NULL, "the step's micro-batches: one at a time through the whole model (batch-major), or all of them through each weight unit in turn (layer-major: the streamed weights are read once per step, not once per micro-batch, and on several ranks each unit's collectives run once per step); auto = layer-major with --offload-params nvme", 0, 0, schedule_names},
        {"activations", MW_OPT_CHOICE, &c->A.activations, NULL, "layer-major: how backward gets each block's activations: recompute them from the block's input, or read back what forward wrote to NVMe (--nvme-dir; same results, no recomputation); auto = nvme with --offload-params nvme unless --recompute is given", 0, 0, acts_names},
        {"nvme-dir", MW_OPT_STRING, &c->A.nvme_dir, "DIR", "directory for the NVMe tier's files (several: D1:D2); default run/nvme; %r = the rank (several ranks without %r: /rank<r> is appended)", 0, 0, NULL},
        {"subgroup-size", MW_OPT_SIZE, &c->A.subgroup_size, "N", "parameters per optimizer subgroup (the unit of NVMe I/O and update); default 4M = 4194304", 1, 1e15, NULL},
        {"buffer-count", MW_OPT_INT, &c->A.buffer_count, "N", "host staging buffers of the NVMe pipeline", 1, 1024, NULL},
        {"aio-block-size", MW_OPT_SIZE, &c->A.aio_block_size, "BYTES", "bytes per NVMe request piece, a multiple of 4096; 0 = 1 MiB", 0, 1 << 30, NULL},
        {"aio-queue-depth", MW_OPT_INT, &c->A.aio_queue_depth, "N", "NVMe request pieces in flight; 0 = 128", 0, 4096, NULL},
        {"preread", MW_OPT_CHOICE, &c->A.preread, NULL, "read the next step's first optimizer subgroups from NVMe between steps, into the free staging buffers during backward, checked by the update that uses them (docs/offload.md); auto = on with --optimizer-tier nvme (the streamed weights have their own read-ahead)", 0, 0, preread_names},
        {"offload-policy", MW_OPT_STRING, &c->A.policy, "P", "where subgroups are updated: all-cpu, auto, all-device, every-K (device: the emulated accelerator, or the GPU with MEMWALL_DEVICE=cuda: docs/gpu.md)", 0, 0, NULL},
        {"dram-budget", MW_OPT_SIZE, &c->A.dram_budget, "BYTES", "DRAM for the whole run (model + optimizer), refused up front if short; streamed: picks the knobs left unset and, with room, keeps the gradients in DRAM; 0 = no limit", 0, 0, NULL},
        {"nvme-budget", MW_OPT_SIZE, &c->A.nvme_budget, "BYTES", "NVMe bytes for the optimizer state, refused up front if short; 0 = the free space", 0, 0, NULL},
        {"sample-len", MW_OPT_INT, &c->A.sample_len, "N", "tokens of text generated at the end; 0 = none", 0, 1 << 20, NULL},
        {"temperature", MW_OPT_DOUBLE, &c->A.temperature, "X", "sampling temperature", 0.01, 100, NULL},
        {"top-k", MW_OPT_INT, &c->A.top_k, "N", "sample among the k likeliest tokens; 0 = all", 0, 1 << 20, NULL},
        {"print-every", MW_OPT_INT, &c->A.print_every, "N", "a progress line every N steps", 1, 1e12, NULL},
        {"zero", MW_OPT_INT, &c->A.zero, "S", "under mpirun: 0 replicate everything (allreduce gradients), 1 shard the optimizer state, 2 also the gradients, 3 also the weights", 0, 3, NULL},
        {"zero-hierarchy", MW_OPT_CHOICE, &c->A.hier, NULL, "ZeRO 1-3: shard over all ranks, or within each node and replicate across nodes", 0, 0, hier_names},
        {"comm-sum", MW_OPT_CHOICE, &c->A.comm_sum, NULL, "gradient sums: in rank order, bitwise reproducible (MPI_Ialltoallv + MPI_Iallgatherv), or MPI's own MPI_Iallreduce / MPI_Ireduce_scatter (order up to MPI)", 0, 0, sum_names},
        {"comm-timeout", MW_OPT_DOUBLE, &c->A.comm_timeout, "S", "a collective not finished after S seconds ends the job (a rank died or hangs)", 0.1, 1e6, NULL},
        {"ds-config", MW_OPT_STRING, &c->A.ds_config, "FILE", "a DeepSpeed config (ds_config.json): its keys set the options above that the command line does not give (docs/train.md)", 0, 0, NULL},
    };
    _Static_assert(sizeof t / sizeof t[0] <= sizeof c->opts / sizeof c->opts[0], "room for every option");
    memcpy(c->opts, t, sizeof t);
    c->spec = (struct mw_cmd_spec){
        "train", "",
        "Train a GPT-2 (--preset, shape flags) or a Hugging Face model directory (--init-hf: GPT-2, Llama, Qwen2) on the CPU: micro-batches with gradient accumulation, AdamW with "
        "warm-up + cosine learning rate and global-norm clipping, validation, checkpoints that resume "
        "bitwise, and a generated sample at the end. Defaults follow --preset ('--preset tiny --help' "
        "shows tiny's). Data parallel over MPI: 'mpirun -np N memwall train --zero S ...' (--batch is the "
        "global batch; %r in --nvme-dir, --trace and --resume is the rank).",
        c->opts, MW_NOPTS(t), 0, 0,
    };
}


void train_set_defaults(struct train_cli *c, const struct preset *p)
{
    c->A.layers = p->layers; c->A.heads = p->heads; c->A.width = p->width; c->A.context = p->context; c->A.vocab = p->vocab;
    c->A.batch = p->batch; c->A.seq = p->seq; c->A.steps = p->steps; c->A.warmup = p->warmup;
    c->A.val_every = p->val_every; c->A.val_batches = p->val_batches; c->A.sample_len = p->sample_len; c->A.lr = p->lr;
    c->A.accum = 1; c->A.min_lr_frac = 0.1; c->A.wd = 0.1; c->A.clip = 1.0; c->A.beta1 = 0.9; c->A.beta2 = 0.95;
    c->A.ckpt_every = 0; c->A.seed = 1337; c->A.threads = 0; c->A.temperature = 0.8; c->A.top_k = 40; c->A.print_every = 1;
    c->A.tier = "dram"; c->A.buffer_count = 8; c->A.eps = 1e-8; c->A.offload_params = "dram"; c->A.prefetch_depth = 2;
    c->A.schedule = "auto";
    c->A.activations = "auto";
    c->A.preread = "auto";
    c->A.zero = 0; c->A.hier = "global"; c->A.comm_timeout = 300; c->A.comm_sum = "ordered";
}

const struct preset *train_find_preset(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) return &presets[i];
    return NULL;
}

/* The preset named on the command line (last one wins), before the real parse. */
const struct preset *train_prescan_preset(int argc, char **argv)
{
    const struct preset *p = &presets[0];
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--")) break;
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--preset=", 9)) v = argv[i] + 9;
        if (v && train_find_preset(v)) p = train_find_preset(v);
    }
    return p;
}

int train_usage_error(const char *fmt, const char *a)
{
    fprintf(stderr, "memwall train: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    mw_opts_hint(stderr, "memwall train", a); /* a library message names settings, not flags */
    fprintf(stderr, "run 'memwall train --help' for the options\n");
    return 2;
}
