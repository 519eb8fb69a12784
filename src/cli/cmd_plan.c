/*
 * cmd_plan.c — `memwall plan`: resolve the model, layout and hardware from one option
 * table, run the planner, and print the table (or JSON, or a k8s resources block, or the
 * layouts --search finds). Printing lives in plan_print.c.
 *
 * Exit codes: 0 ok; 1 the planner failed at run time; 2 usage: bad option, unknown model,
 * malformed config.json, a layout whose degrees do not divide.
 * --estimator deepspeed-zero2|3 implies its ZeRO stage, as DeepSpeed's estimator functions do
 * (they take no stage): without --zero the plan is of that stage, so --offload-params needs no
 * --zero 3 with deepspeed-zero3; a --zero given explicitly still wins.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/plan_print.h"
#include "memwall/common.h"
#include "memwall/plan.h"
#include "memwall/train.h"

#include <omp.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const tiers[] = {"none", "cpu", "nvme", NULL};
static const char *const dtypes[] = {"fp32", "bf16", "fp16", "fp8", "int8", "int4", NULL};
static const char *const dtypes_none[] = {"fp32", "bf16", "fp16", "fp8", "int8", "none", NULL};
static const char *const recomputes[] = {"none", "selective", "full", NULL};
static const char *const act_models[] = {"detailed", "classic", "zero", "zero-infinity", NULL};
static const char *const estimators[] = {"none", "deepspeed-zero2", "deepspeed-zero3", "megatron",
                                         "accelerate", NULL};
static const char *const ds_versions[] = {"current", "legacy", NULL};
static const char *const emits[] = {"none", "k8s", NULL};
static const char *const stream_schedules[] = {"auto", "layer-major", "batch-major", NULL};
static const char *const hws[] = {"a100-40gb", "a100-80gb", "h100", "h200", "gh200", "rtx4090", NULL};

static enum mw_tier_id tier_of(const char *s)
{
    return !strcmp(s, "cpu") ? MW_TIER_DRAM : !strcmp(s, "nvme") ? MW_TIER_NVME : MW_TIER_DEVICE;
}

static enum mw_dtype dtype_of(const char *s)
{
    enum mw_dtype d = MW_DT_NONE;
    MW_ASSERT(mw_dtype_parse(s, &d) == 0); /* the option table only lets valid names through */
    return d;
}

static int is_config_path(const char *s)
{
    struct stat st;
    size_t n = strlen(s);
    return (n > 5 && !strcmp(s + n - 5, ".json")) || (strchr(s, '/') && stat(s, &st) == 0);
}

/* --stream: the plan of `memwall train --offload-params nvme` (mw_train_plan_stream: the very
 * code the trainer runs before its first step). */
static int plan_stream(const struct mw_model *m, const char *model_arg, int64_t micro, int64_t seq, int recompute, int64_t accum,
                       int64_t depth, int64_t buffers, int64_t threads, uint64_t budget, uint64_t sg,
                       const char *schedule, const char *dir, int json)
{
    if (m->max_pos && seq > (int64_t)m->max_pos) {
        fprintf(stderr, "memwall plan: --seq %lld is longer than %s's context %llu\n", (long long)seq, m->name,
                (unsigned long long)m->max_pos);
        return 2;
    }
    /* The model as memwall train builds it (GPT-2 pads its output rows; a rotary model is built
     * for --seq positions: its tables are all that depends on the context). */
    struct mw_net_config nc;
    int ferr = mw_net_config_from_model(m, (int)seq, &nc);
    if (ferr) {
        fprintf(stderr, "memwall plan: --stream plans memwall's own trainer (GPT-2 and the Llama family: give such a "
                        "--model, a name from 'memwall plan --list-models' or a config.json): %s\n", mw_error_msg());
        return 2;
    }
    /* A Llama-family config file is read as the trainer reads it (--init-hf): its context and
     * RoPE exact, not the planner's description of its shape. */
    char note[1024];
    struct mw_net_shape none = {0};
    if (model_arg && is_config_path(model_arg) && nc.family != mw_net_family_default() &&
        nc.family->config_from_file(model_arg, &none, nc.raw, note, sizeof note)) {
        fprintf(stderr, "memwall plan: --stream: %s\n", mw_error_msg());
        return 2;
    }
    struct mw_train_config tc;
    memset(&tc, 0, sizeof tc);
    tc.batch = (int)micro; tc.seq = (int)seq; tc.grad_accum = (int)accum; tc.recompute = recompute;
    tc.threads = threads ? (int)threads : omp_get_max_threads();
    tc.tier = MW_TIER_NVME; tc.offload_params = MW_TIER_NVME; tc.nvme_dir = dir;
    tc.subgroup_size = sg; tc.buffer_count = (int)buffers; tc.prefetch_depth = (int)depth;
    tc.layer_major = !strcmp(schedule, "layer-major") || !strcmp(schedule, "auto");
    tc.acts_nvme = tc.layer_major && !recompute; /* memwall train's --activations auto */
    struct mw_plan_stream p;
    uint64_t nvme = 0;
    int err = mw_train_plan_stream(&nc, &tc, &p, &nvme);
    if (err) { mw_cli_fail("planning the streamed run", err); return err == -EINVAL ? 2 : 1; }
    int fits = !budget || p.total <= budget;
    if (json) {
        printf("{\"model\":\"%s\",\"params\":%llu,\"schedule\":\"%s\",\"dram_peak_bytes\":%llu,\"runtime_bytes\":%llu,"
               "\"activations_bytes\":%llu,\"staging_bytes\":%llu,\"streamed_bytes\":%llu,\"weights_peak_bytes\":%llu,"
               "\"grads_peak_bytes\":%llu,\"nvme_bytes\":%llu,\"dram_budget_bytes\":%llu,\"fits\":%s}\n",
               m->name, (unsigned long long)p.params, tc.layer_major ? "layer-major" : "batch-major",
               (unsigned long long)p.total, (unsigned long long)p.runtime, (unsigned long long)p.acts,
               (unsigned long long)p.staging, (unsigned long long)MW_MAX(p.passes, p.step_grads),
               (unsigned long long)p.weights_peak, (unsigned long long)MW_MAX(p.grads_peak, p.step_grads),
               (unsigned long long)nvme, (unsigned long long)budget, fits ? "true" : "false");
        return fits ? 0 : 1;
    }
    char b[9][32];
    printf("memwall train --offload-params nvme: %s, %llu parameters, micro-batch %lld x seq %lld x grad-accum %lld, "
           "%s, block activations %s, prefetch depth %lld, subgroups of %llu parameters, %lld staging buffers, %d "
           "threads\n", m->name, (unsigned long long)p.params, (long long)micro, (long long)seq, (long long)accum,
           tc.layer_major ? "layer-major" : "batch-major", tc.acts_nvme ? "on NVMe" : "recomputed", (long long)depth, (unsigned long long)p.subgroup_size,
           (long long)buffers, tc.threads);
    printf("  planned DRAM peak %s = runtime %s + activations %s + optimizer staging %s + streamed weights and gradients "
           "%s (weights at most %s, gradients at most %s)\n", mw_fmt_bytes(b[0], 32, p.total),
           mw_fmt_bytes(b[1], 32, p.runtime), mw_fmt_bytes(b[2], 32, p.acts), mw_fmt_bytes(b[3], 32, p.staging),
           mw_fmt_bytes(b[4], 32, MW_MAX(p.passes, p.step_grads)), mw_fmt_bytes(b[5], 32, p.weights_peak),
           mw_fmt_bytes(b[6], 32, MW_MAX(p.grads_peak, p.step_grads)));
    printf("  NVMe: %s (fp32 master and moments in two slots, gradients in one%s)\n", mw_fmt_bytes(b[7], 32, nvme),
           tc.acts_nvme ? ", the blocks' activations of a step" : "");
    if (budget)
        printf("  --dram-budget %s: %s\n", mw_fmt_bytes(b[8], 32, budget),
               fits ? "fits" : "does not fit (memwall train would refuse it before the first step)");
    return fits ? 0 : 1;
}

/* --model NAME|CONFIG.json|DIR or --params N: the model's description. 0, or 2 (printed). */
static int resolve_model(const char *model, double params, double largest, struct mw_model *mp)
{
    if (model && params > 0) {
        fprintf(stderr, "memwall plan: give --model or --params, not both\n");
        return 2;
    }
    if (model) {
        /* A checkpoint directory stands for its config.json. */
        char cfg[4096];
        struct stat st;
        if (stat(model, &st) == 0 && S_ISDIR(st.st_mode)) {
            if ((size_t)snprintf(cfg, sizeof cfg, "%s/config.json", model) >= sizeof cfg) {
                fprintf(stderr, "memwall plan: --model %s: the path is too long\n", model);
                return 2;
            }
            model = cfg;
        }
        int err = is_config_path(model) ? mw_model_from_config_file(model, mp) : mw_model_lookup(model, mp);
        if (err) {
            fprintf(stderr, "memwall plan: %s\n", mw_error_msg());
            if (err == -ENOENT && !is_config_path(model))
                fprintf(stderr, "run 'memwall plan --list-models' for the built-in names\n");
            return 2;
        }
    } else if (params > 0) {
        mw_model_bare(mp, (uint64_t)params, (uint64_t)largest);
    } else {
        fprintf(stderr, "memwall plan: give --model NAME|CONFIG.json or --params N\n"
                        "run 'memwall plan --help' for the options\n");
        return 2;
    }

    return 0;
}

/* --estimator: another tool's figures beside the plan. */
static void estimate(const char *est, int ds_stage, const char *dsv, int64_t zero_init, const struct mw_model *mp,
                     const struct mw_layout *lp, const struct mw_plan_result *res, struct mw_plan_estimate *pe)
{
    const struct mw_model m = *mp;
    const struct mw_layout l = *lp;
    *pe = (struct mw_plan_estimate){ .name = est, .ds_stage = ds_stage };
    if (strcmp(est, "none")) {
        struct mw_ds_input in = {
            .total_params = (double)res->count.total, .largest_layer_params = (double)res->count.largest_layer,
            .gpus_per_node = (double)MW_MIN(l.gpus_per_node, l.gpus),
            .nodes = (double)((l.gpus + l.gpus_per_node - 1) / l.gpus_per_node), .buffer_factor = 1.5,
            .offload_params = l.offload_params, .offload_optimizer = l.offload_optimizer,
            .zero_init = (int)zero_init, .version = !strcmp(dsv, "legacy") ? MW_DS_LEGACY : MW_DS_CURRENT,
        };
        pe->ds = in;
        if (!strcmp(est, "deepspeed-zero3")) mw_est_ds_zero3(&in, &pe->gpu_bytes, &pe->cpu_bytes);
        else if (!strcmp(est, "deepspeed-zero2")) mw_est_ds_zero2(&in, &pe->gpu_bytes, &pe->cpu_bytes);
        else if (!strcmp(est, "megatron")) {
            struct mw_megatron_est me;
            mw_est_megatron(&m, &l, l.zero >= 1, &me);
            pe->gpu_bytes = me.weight_optimizer + me.activation;
            pe->cpu_bytes = 0;
        } else {
            struct mw_accel_usage u;
            mw_est_accelerate((double)res->count.total, (double)m.buffer_bytes,
                              (double)res->count.largest_layer, l.weight, &u);
            pe->gpu_bytes = u.train;
            pe->cpu_bytes = 0;
        }
    }
}

/* --search: the best layouts with what the command line fixed kept. 0, 1 or 2 (printed). */
static int plan_search(const struct mw_cmd_spec *spec, int ds_stage, const struct mw_model *m, struct mw_layout *l,
                       const struct mw_hw *hw, int64_t top, int json)
{
    unsigned fix = 0;
    if (mw_opts_given(spec, "tp")) fix |= MW_FIX_TP;
    if (mw_opts_given(spec, "pp")) fix |= MW_FIX_PP;
    if (mw_opts_given(spec, "ep")) fix |= MW_FIX_EP;
    if (mw_opts_given(spec, "zero") || ds_stage) fix |= MW_FIX_ZERO;
    if (mw_opts_given(spec, "offload-optimizer") || mw_opts_given(spec, "offload-params")) fix |= MW_FIX_OFFLOAD;
    if (mw_opts_given(spec, "recompute")) fix |= MW_FIX_RECOMPUTE;
    if (mw_opts_given(spec, "micro-batch")) fix |= MW_FIX_MICRO;
    struct mw_search_hit *hits = calloc((size_t)top, sizeof *hits);
    if (!hits) { fprintf(stderr, "memwall plan: out of memory\n"); return 1; }
    int n = mw_plan_search(m, l, fix, hw, hits, (int)top);
    if (n < 0) {
        free(hits);
        fprintf(stderr, "memwall plan: %s\n", mw_error_msg());
        mw_opts_hint(stderr, "memwall plan", mw_error_msg());
        return 2;
    }
    mw_plan_print_search(stdout, m, hw, hits, n, json);
    free(hits);
    return 0;
}

int mw_cmd_plan(int argc, char **argv)
{
    const char *model = NULL, *host_profile = NULL;
    double params = 0, largest = 0;
    int64_t gpus = 0, gpn = 0, dp = 0, tp = 1, pp = 1, ep = 1, etp = 1, zero = 0, micro = 1, seq = 2048;
    int64_t gbatch = 0, interleave = 1, context = 0, batch = 1, zero_init = 1, top = 10;
    int sp = 0, json = 0, search = 0, list = 0, zeropp = 0, inference = 0;
    const char *off_opt = "none", *off_par = "none", *wdt = "bf16", *gdt = "bf16", *mdt = "fp32";
    const char *modt = "fp32", *gadt = "none", *kvdt = "bf16", *rc = "selective", *actm = "detailed";
    const char *est = "none", *dsv = "current", *emit = "none", *hwname = "h100";
    /* --stream: memwall train --offload-params nvme on this CPU */
    int stream = 0;
    int64_t s_accum = 1, s_depth = 2, s_buffers = 8, s_threads = 0;
    uint64_t s_budget = 0, s_sg = 0;
    const char *s_schedule = "auto", *s_dir = ".";

    const struct mw_opt opts[] = {
        {"model", MW_OPT_STRING, &model, "NAME|CONFIG.json", "built-in model name or a Hugging Face config.json", 0, 0, NULL},
        {"params", MW_OPT_DOUBLE, &params, "N", "bare parameter count instead of a model, e.g. 7e9", 1, 1e16, NULL},
        {"largest-layer", MW_OPT_DOUBLE, &largest, "N", "with --params: parameters of the largest layer", 0, 1e16, NULL},
        {"gpus", MW_OPT_INT, &gpus, "N", "total GPUs; 0 = DP x TP x PP", 0, 1 << 24, NULL},
        {"gpus-per-node", MW_OPT_INT, &gpn, "G", "GPUs sharing one host; 0 = the hardware profile's", 0, 1024, NULL},
        {"dp", MW_OPT_INT, &dp, "N", "data-parallel degree; 0 = GPUs / (TP x PP)", 0, 1 << 24, NULL},
        {"tp", MW_OPT_INT, &tp, "N", "tensor-parallel degree", 1, 1024, NULL},
        {"pp", MW_OPT_INT, &pp, "N", "pipeline-parallel degree", 1, MW_PLAN_MAX_STAGES, NULL},
        {"ep", MW_OPT_INT, &ep, "N", "expert-parallel degree", 1, 1 << 20, NULL},
        {"etp", MW_OPT_INT, &etp, "N", "expert tensor-parallel degree", 1, 1024, NULL},
        {"interleave", MW_OPT_INT, &interleave, "N", "virtual pipeline chunks per rank", 1, 1024, NULL},
        {"sequence-parallel", MW_OPT_FLAG, &sp, NULL, "shard TP-replicated activations (Megatron SP)", 0, 0, NULL},
        {"zero", MW_OPT_INT, &zero, "0|1|2|3", "ZeRO stage (1 = distributed optimizer)", 0, 3, NULL},
        {"zeropp", MW_OPT_FLAG, &zeropp, NULL, "ZeRO++ communication (quantized weights/grads, hpZ)", 0, 0, NULL},
        {"offload-optimizer", MW_OPT_CHOICE, &off_opt, NULL, "tier of the optimizer state", 0, 0, tiers},
        {"offload-params", MW_OPT_CHOICE, &off_par, NULL, "tier of the weights (needs --zero 3, which --estimator deepspeed-zero3 implies)", 0, 0, tiers},
        {"weight-dtype", MW_OPT_CHOICE, &wdt, NULL, "dtype of the working weights", 0, 0, dtypes},
        {"grad-dtype", MW_OPT_CHOICE, &gdt, NULL, "dtype of the gradients", 0, 0, dtypes},
        {"master-dtype", MW_OPT_CHOICE, &mdt, NULL, "dtype of the master weights", 0, 0, dtypes_none},
        {"moment-dtype", MW_OPT_CHOICE, &modt, NULL, "dtype of each Adam moment", 0, 0, dtypes},
        {"grad-accum-dtype", MW_OPT_CHOICE, &gadt, NULL, "extra gradient-accumulation buffer", 0, 0, dtypes_none},
        {"micro-batch", MW_OPT_INT, &micro, "N", "sequences per micro-batch per rank", 1, 1 << 20, NULL},
        {"seq", MW_OPT_INT, &seq, "N", "tokens per sequence", 1, 1 << 26, NULL},
        {"global-batch", MW_OPT_INT, &gbatch, "N", "sequences per iteration; 0 = micro-batch x DP (x 4 PP with PP)", 0, 1 << 30, NULL},
        {"recompute", MW_OPT_CHOICE, &rc, NULL, "activation recomputation", 0, 0, recomputes},
        {"act-model", MW_OPT_CHOICE, &actm, NULL, "activation formula (see docs/plan.md)", 0, 0, act_models},
        {"inference", MW_OPT_FLAG, &inference, NULL, "serving: weights and KV cache only (no training state)", 0, 0, NULL},
        {"context", MW_OPT_INT, &context, "N", "inference: KV-cache context length in tokens", 0, 1 << 30, NULL},
        {"batch", MW_OPT_INT, &batch, "N", "inference: sequences sharing the KV cache", 1, 1 << 24, NULL},
        {"kv-dtype", MW_OPT_CHOICE, &kvdt, NULL, "dtype of the KV cache", 0, 0, dtypes},
        {"estimator", MW_OPT_CHOICE, &est, NULL, "also print another tool's estimate; deepspeed-zero2|3 imply --zero 2|3 (unless given) and print DeepSpeed's whole table", 0, 0, estimators},
        {"zero-init", MW_OPT_INT, &zero_init, "0|1", "DeepSpeed estimator: zero.Init used", 0, 1, NULL},
        {"ds-version", MW_OPT_CHOICE, &dsv, NULL, "DeepSpeed estimator: legacy = before PR #5099", 0, 0, ds_versions},
        {"hw", MW_OPT_CHOICE, &hwname, NULL, "hardware profile", 0, 0, hws},
        {"host-profile", MW_OPT_STRING, &host_profile, "FILE", "host figures from a memwall bench calibration JSON", 0, 0, NULL},
        {"search", MW_OPT_FLAG, &search, NULL, "list the layouts that fit --gpus, fastest first", 0, 0, NULL},
        {"top", MW_OPT_INT, &top, "N", "with --search: how many layouts to list", 1, 1000, NULL},
        {"emit", MW_OPT_CHOICE, &emit, NULL, "print a Kubernetes pod resources block", 0, 0, emits},
        {"stream", MW_OPT_FLAG, &stream, NULL, "describe 'memwall train --offload-params nvme' of a GPT-2 or Llama-family --model on this CPU (one rank): its planned DRAM peak, the same figures the trainer prints and checks; uses --micro-batch, --seq and the options below (--recompute full: the blocks recomputed, not kept on NVMe)", 0, 0, NULL},
        {"grad-accum", MW_OPT_INT, &s_accum, "N", "--stream: micro-batches per step", 1, 1 << 20, NULL},
        {"dram-budget", MW_OPT_SIZE, &s_budget, "BYTES", "--stream: DRAM budget to check the plan against; 0 = none", 0, 0, NULL},
        {"prefetch-depth", MW_OPT_INT, &s_depth, "N", "--stream: weight units read ahead of use", 0, 8, NULL},
        {"subgroup-size", MW_OPT_SIZE, &s_sg, "N", "--stream: parameters per optimizer subgroup; 0 = the trainer's default", 0, 1e15, NULL},
        {"buffer-count", MW_OPT_INT, &s_buffers, "N", "--stream: optimizer staging buffers", 1, 64, NULL},
        {"schedule", MW_OPT_CHOICE, &s_schedule, NULL, "--stream: auto (= layer-major, as memwall train streams), layer-major or batch-major", 0, 0, stream_schedules},
        {"threads", MW_OPT_INT, &s_threads, "N", "--stream: CPU threads (sizes the attention scratch); 0 = all", 0, 4096, NULL},
        {"nvme-dir", MW_OPT_STRING, &s_dir, "DIR", "--stream: where the state would go (its free space is checked when it exists)", 0, 0, NULL},
        {"json", MW_OPT_FLAG, &json, NULL, "one JSON object, sizes in bytes (integers)", 0, 0, NULL},
        {"list-models", MW_OPT_FLAG, &list, NULL, "list the built-in models and exit", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {
        "plan", "",
        "What fits where, and how fast: bytes per GPU on each tier (GPU, host, NVMe) by kind of "
        "state for a model, a parallel layout and a hardware profile; the time per iteration; "
        "KV-cache sizes; other tools' estimates. Sizes print in GiB (2^30 bytes).",
        opts, MW_NOPTS(opts), 0, 0,
    };
    int r = mw_opts_parse(&spec, argc, argv, NULL, NULL);
    if (r == MW_OPTS_HELP) return 0;
    if (r) return 2;
    if (list) {
        for (const char *const *n = mw_model_names(); *n; n++) printf("%s\n", *n);
        return 0;
    }
    /* DeepSpeed's estimators are per stage and take no stage argument: the estimator sets the
     * stage unless --zero is given (then its figures stand beside a plan of another stage). */
    const int ds_stage = !strcmp(est, "deepspeed-zero3") ? 3 : !strcmp(est, "deepspeed-zero2") ? 2 : 0;
    if (ds_stage && !mw_opts_given(&spec, "zero")) {
        if (ds_stage == 2 && strcmp(off_par, "none")) {
            fprintf(stderr, "memwall plan: --estimator deepspeed-zero2: ZeRO-2 keeps the weights on the GPU "
                            "(DeepSpeed's ZeRO-2 estimator has no parameter offload): drop --offload-params, or use "
                            "--estimator deepspeed-zero3\nrun 'memwall plan --help' for the options\n");
            return 2;
        }
        zero = ds_stage;
    }

    struct mw_model m;
    if ((r = resolve_model(model, params, largest, &m))) return r;

    if (stream) return plan_stream(&m, model, micro, seq, !strcmp(rc, "full"), s_accum, s_depth, s_buffers, s_threads, s_budget,
                                   s_sg, s_schedule, s_dir, json);

    struct mw_hw hw = *mw_hw_lookup(hwname);
    if (host_profile) {
        int err = mw_hw_load_host_profile(host_profile, &hw);
        if (err) { mw_cli_fail("reading the host profile", err); return err == MW_EFORMAT ? 2 : 1; }
    }

    struct mw_layout l;
    mw_layout_default(&l);
    l.gpus = (uint64_t)gpus; l.gpus_per_node = (uint64_t)gpn; l.dp = (uint64_t)dp;
    l.tp = (uint64_t)tp; l.pp = (uint64_t)pp; l.ep = (uint64_t)ep; l.etp = (uint64_t)etp;
    l.interleave = (uint64_t)interleave; l.sequence_parallel = sp; l.zero = (int)zero; l.zeropp = zeropp;
    l.offload_optimizer = tier_of(off_opt); l.offload_params = tier_of(off_par);
    l.weight = dtype_of(wdt); l.grad = dtype_of(gdt); l.master = dtype_of(mdt);
    l.moment = dtype_of(modt); l.grad_accum = dtype_of(gadt); l.kv = dtype_of(kvdt);
    l.micro_batch = (uint64_t)micro; l.seq = (uint64_t)seq; l.global_batch = (uint64_t)gbatch;
    l.recompute = !strcmp(rc, "none") ? MW_RECOMPUTE_NONE : !strcmp(rc, "full") ? MW_RECOMPUTE_FULL
                                                                                 : MW_RECOMPUTE_SELECTIVE;
    l.act_model = !strcmp(actm, "classic") ? MW_ACT_CLASSIC : !strcmp(actm, "zero") ? MW_ACT_ZERO :
                  !strcmp(actm, "zero-infinity") ? MW_ACT_ZERO_INFINITY : MW_ACT_DETAILED;
    l.context = (uint64_t)context; l.batch = (uint64_t)batch; l.inference = inference;

    if (search) return plan_search(&spec, ds_stage, &m, &l, &hw, top, json);

    struct mw_plan_result *res = malloc(sizeof *res);
    if (!res) { fprintf(stderr, "memwall plan: out of memory\n"); return 1; }
    int err = mw_plan_compute(&m, &l, &hw, res);
    if (err) {
        fprintf(stderr, "memwall plan: %s\n", mw_error_msg());
        mw_opts_hint(stderr, "memwall plan", mw_error_msg());
        free(res);
        return err == -EINVAL || err == MW_EFORMAT ? 2 : 1;
    }
    /* The resolved degrees, for printing: mw_plan_compute resolved the same layout already. */
    MW_ASSERT(mw_layout_resolve(&m, &l, hw.gpus_per_node) == 0);

    struct mw_plan_estimate pe;
    estimate(est, ds_stage, dsv, zero_init, &m, &l, res, &pe);
    if (!strcmp(emit, "k8s")) mw_plan_emit_k8s(res, &l, &hw, stdout);
    else if (json) mw_plan_print_json(stdout, &m, &l, &hw, res, &pe);
    else mw_plan_print_table(stdout, &m, &l, &hw, res, &pe);
    free(res);
    return 0;
}
