/*
 * train_ds_config.c — a DeepSpeed config file turned into `memwall train` options
 * (train_ds_config.h says why options; docs/train.md "DeepSpeed config" lists every key).
 *
 * Shape: one table of the keys this reader knows, by dotted path, each with what it does:
 * maps to an option (with the range memwall's option accepts), is accepted quietly, is accepted
 * with a note that it changes nothing, must be false / within a limit (else refused), or needs
 * code (the batch keys, the optimizer, the offload devices and paths). The walk checks each
 * value's type and range before converting it (doubles are compared with the bounds before any
 * cast), collects the settings into one slot per option, and a final pass resolves what depends
 * on several keys: the batch trio against the world size, Adam vs AdamW, and the NVMe directory
 * that both offload blocks may name. Nothing is printed; warnings are returned as lines.
 */
#include "cli/train_ds_config.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The options a DeepSpeed file can set, in the order the settings are returned. */
enum ds_opt {
    O_BATCH, O_ACCUM, O_CLIP, O_LR, O_BETA1, O_BETA2, O_EPS, O_WD, O_ZERO, O_OPT_TIER, O_OFF_PARAMS,
    O_NVME_DIR, O_BUFFER_COUNT, O_PREFETCH, O_SUBGROUP, O_AIO_BLOCK, O_AIO_DEPTH, O_COUNT
};
static const char *const opt_names[O_COUNT] = {
    "batch", "grad-accum", "clip", "lr", "beta1", "beta2", "eps", "weight-decay", "zero", "optimizer-tier",
    "offload-params", "nvme-dir", "buffer-count", "prefetch-depth", "subgroup-size", "aio-block-size",
    "aio-queue-depth",
};

enum kind {
    K_OBJ,     /* an object: its keys are in the table under "path." */
    K_INT,     /* an integer in [min, max] -> option */
    K_NUM,     /* a number in [min, max] -> option */
    K_QUIET,   /* accepted, nothing to do (logging, or what memwall always does) */
    K_NOTE,    /* accepted, no effect in memwall: one warning with `why` */
    K_FALSE,   /* must be false (or "auto"); true is refused with `why` */
    K_LIMIT,   /* a number that memwall honours only within [min, max]; else refused with `why` */
    K_SPECIAL, /* handled in code (enum special) */
};

enum special {
    S_NONE, S_TBS, S_MICRO, S_GAS, S_OPT_TYPE, S_BETAS, S_ADAMW_MODE, S_WD, S_SCHEDULER, S_OO_DEV, S_OO_PATH,
    S_OP_DEV, S_OP_PATH, S_OP_BUFCNT, S_PIN, S_AIO_BLOCK,
};

struct key {
    const char *path;
    enum kind kind;
    int opt;           /* enum ds_opt for K_INT / K_NUM */
    double min, max;
    enum special sp;
    const char *why;
};

#define NOPT (-1)
static const char BUCKETS[] = "memwall gathers, reduces and prefetches whole weight units (a transformer block), "
                              "so DeepSpeed's bucket and persistence sizes have no counterpart";

static const struct key keys[] = {
    /* batch */
    {"train_batch_size", K_SPECIAL, NOPT, 0, 0, S_TBS, NULL},
    {"train_micro_batch_size_per_gpu", K_SPECIAL, NOPT, 0, 0, S_MICRO, NULL},
    {"gradient_accumulation_steps", K_SPECIAL, NOPT, 0, 0, S_GAS, NULL},
    {"gradient_clipping", K_NUM, O_CLIP, 0, 1e9, S_NONE, NULL},
    /* optimizer */
    {"optimizer", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"optimizer.type", K_SPECIAL, NOPT, 0, 0, S_OPT_TYPE, NULL},
    {"optimizer.params", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"optimizer.params.lr", K_NUM, O_LR, 0, 10, S_NONE, NULL},
    {"optimizer.params.betas", K_SPECIAL, NOPT, 0, 0, S_BETAS, NULL},
    {"optimizer.params.eps", K_NUM, O_EPS, 1e-30, 1, S_NONE, NULL},
    {"optimizer.params.weight_decay", K_SPECIAL, NOPT, 0, 10, S_WD, NULL},
    {"optimizer.params.adam_w_mode", K_SPECIAL, NOPT, 0, 0, S_ADAMW_MODE, NULL},
    {"optimizer.params.torch_adam", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"optimizer.params.bias_correction", K_LIMIT, NOPT, 1, 1, S_NONE,
     "memwall's AdamW always corrects the moments' bias: set it to true or remove it"},
    {"optimizer.params.amsgrad", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall's AdamW has no AMSGrad variant: set it to false or remove it"},
    {"scheduler", K_SPECIAL, NOPT, 0, 0, S_SCHEDULER, NULL},
    /* precision: memwall trains in fp32 */
    {"fp16", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"fp16.enabled", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall trains in fp32 (weights, gradients and optimizer state): set it to false or remove the block"},
    {"fp16.auto_cast", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"fp16.loss_scale", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"fp16.loss_scale_window", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"fp16.initial_scale_power", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"fp16.hysteresis", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"fp16.consecutive_hysteresis", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"fp16.min_loss_scale", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"bf16", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"bf16.enabled", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall trains in fp32 (weights, gradients and optimizer state): set it to false or remove the block"},
    {"bfloat16", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"bfloat16.enabled", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall trains in fp32 (weights, gradients and optimizer state): set it to false or remove the block"},
    {"amp", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"amp.enabled", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall trains in fp32, without Apex AMP: set it to false or remove the block"},
    {"amp.opt_level", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    /* harmless */
    {"steps_per_print", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"wall_clock_breakdown", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"dump_state", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"memory_breakdown", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_allow_untested_optimizer", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_force_ds_cpu_optimizer", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"prescale_gradients", K_NOTE, NOPT, 0, 0, S_NONE,
     "memwall sums gradients in its own fixed order and divides once (--comm-sum)"},
    {"gradient_predivide_factor", K_NOTE, NOPT, 0, 0, S_NONE,
     "memwall sums gradients in its own fixed order and divides once (--comm-sum)"},
    {"communication_data_type", K_NOTE, NOPT, 0, 0, S_NONE, "memwall communicates fp32 gradients and weights"},
    {"activation_checkpointing", K_NOTE, NOPT, 0, 0, S_NONE,
     "memwall recomputes whole blocks with --recompute; give that flag instead"},
    {"flops_profiler", K_NOTE, NOPT, 0, 0, S_NONE, "use --trace (and memwall report) or --log-json"},
    {"tensorboard", K_NOTE, NOPT, 0, 0, S_NONE, "use --trace (and memwall report) or --log-json"},
    {"wandb", K_NOTE, NOPT, 0, 0, S_NONE, "use --trace (and memwall report) or --log-json"},
    {"csv_monitor", K_NOTE, NOPT, 0, 0, S_NONE, "use --trace (and memwall report) or --log-json"},
    {"comms_logger", K_NOTE, NOPT, 0, 0, S_NONE, "use --trace: it records every collective"},
    /* ZeRO */
    {"zero_optimization", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.stage", K_INT, O_ZERO, 0, 3, S_NONE, "ZeRO stages are 0, 1, 2 and 3"},
    {"zero_optimization.sub_group_size", K_INT, O_SUBGROUP, 1, 1e15, S_NONE, NULL},
    {"zero_optimization.offload_optimizer", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.offload_optimizer.device", K_SPECIAL, NOPT, 0, 0, S_OO_DEV, NULL},
    {"zero_optimization.offload_optimizer.nvme_path", K_SPECIAL, NOPT, 0, 0, S_OO_PATH, NULL},
    {"zero_optimization.offload_optimizer.buffer_count", K_INT, O_BUFFER_COUNT, 1, 1024, S_NONE, NULL},
    {"zero_optimization.offload_optimizer.pin_memory", K_SPECIAL, NOPT, 0, 0, S_PIN, NULL},
    {"zero_optimization.offload_optimizer.pipeline_read", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.offload_optimizer.pipeline_write", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.offload_optimizer.pipeline", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.offload_optimizer.fast_init", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.offload_optimizer.ratio", K_LIMIT, NOPT, 1, 1, S_NONE,
     "memwall offloads the whole optimizer state, not a fraction: set it to 1 or remove it"},
    {"zero_optimization.offload_param", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.offload_param.device", K_SPECIAL, NOPT, 0, 0, S_OP_DEV, NULL},
    {"zero_optimization.offload_param.nvme_path", K_SPECIAL, NOPT, 0, 0, S_OP_PATH, NULL},
    {"zero_optimization.offload_param.buffer_count", K_SPECIAL, NOPT, 0, 0, S_OP_BUFCNT, NULL},
    {"zero_optimization.offload_param.buffer_size", K_NOTE, NOPT, 0, 0, S_NONE,
     "memwall sizes each weight unit's buffer to the unit"},
    {"zero_optimization.offload_param.max_in_cpu", K_NOTE, NOPT, 0, 0, S_NONE,
     "memwall keeps in DRAM only the units in use and the prefetched ones (--prefetch-depth, --dram-budget)"},
    {"zero_optimization.offload_param.pin_memory", K_SPECIAL, NOPT, 0, 0, S_PIN, NULL},
    {"zero_optimization.contiguous_gradients", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.overlap_comm", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.reduce_scatter", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.allgather_partitions", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.round_robin_gradients", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.elastic_checkpoint", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.ignore_unused_parameters", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.load_from_fp32_weights", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"zero_optimization.reduce_bucket_size", K_NOTE, NOPT, 0, 0, S_NONE, BUCKETS},
    {"zero_optimization.allgather_bucket_size", K_NOTE, NOPT, 0, 0, S_NONE, BUCKETS},
    {"zero_optimization.stage3_prefetch_bucket_size", K_NOTE, NOPT, 0, 0, S_NONE, BUCKETS},
    {"zero_optimization.stage3_param_persistence_threshold", K_NOTE, NOPT, 0, 0, S_NONE, BUCKETS},
    {"zero_optimization.stage3_model_persistence_threshold", K_NOTE, NOPT, 0, 0, S_NONE, BUCKETS},
    {"zero_optimization.stage3_max_live_parameters", K_NOTE, NOPT, 0, 0, S_NONE, BUCKETS},
    {"zero_optimization.stage3_max_reuse_distance", K_NOTE, NOPT, 0, 0, S_NONE, BUCKETS},
    {"zero_optimization.zero_hpz_partition_size", K_LIMIT, NOPT, 1, 1, S_NONE,
     "memwall has no ZeRO++ secondary weight partition; --zero-hierarchy node shards within a node instead"},
    {"zero_optimization.zero_quantized_weights", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall communicates fp32 weights (no ZeRO++ quantization): set it to false"},
    {"zero_optimization.zero_quantized_gradients", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall communicates fp32 gradients (no ZeRO++ quantization): set it to false"},
    {"zero_optimization.mics_shard_size", K_LIMIT, NOPT, -1, 0, S_NONE,
     "memwall has no MiCS sub-groups; --zero-hierarchy node shards within a node instead"},
    /* asynchronous I/O */
    {"aio", K_OBJ, NOPT, 0, 0, S_NONE, NULL},
    {"aio.block_size", K_SPECIAL, NOPT, 4096, 1 << 30, S_AIO_BLOCK, NULL},
    {"aio.queue_depth", K_INT, O_AIO_DEPTH, 1, 4096, S_NONE, "memwall keeps at most 4096 requests in flight"},
    {"aio.thread_count", K_NOTE, NOPT, 0, 0, S_NONE, "memwall drives one io_uring ring with one completion thread"},
    {"aio.intra_op_parallelism", K_NOTE, NOPT, 0, 0, S_NONE,
     "memwall drives one io_uring ring with one completion thread"},
    {"aio.single_submit", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"aio.overlap_events", K_QUIET, NOPT, 0, 0, S_NONE, NULL},
    {"aio.use_gds", K_FALSE, NOPT, 0, 0, S_NONE,
     "memwall reads NVMe into host memory (no GPUDirect Storage): set it to false"},
};

#define MAX_KEYS_PER_OBJECT 1024
#define MAX_WARNINGS 256

struct rd {
    const char *src;
    struct mw_ds_config *out;
    char *slot_val[O_COUNT];
    char *slot_key[O_COUNT];
    int dropped_warnings;
    /* resolved at the end */
    int have_tbs, have_micro, have_gas;
    long long tbs, micro, gas;
    int opt_present, opt_type_seen, opt_is_adam; /* "Adam" (not "AdamW") */
    int adamw_mode_false;
    int have_wd;
    double wd;
    const char *oo_dev, *op_dev;         /* "none", "cpu", "nvme" */
    const char *oo_path, *op_path;
};

static const char *type_name(const cJSON *c)
{
    if (cJSON_IsNumber(c)) return "a number";
    if (cJSON_IsString(c)) return "a string";
    if (cJSON_IsBool(c)) return "a boolean";
    if (cJSON_IsArray(c)) return "an array";
    if (cJSON_IsObject(c)) return "an object";
    if (cJSON_IsNull(c)) return "null";
    return "an invalid value";
}

static int warn(struct rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int warn(struct rd *r, const char *fmt, ...)
{
    struct mw_ds_config *o = r->out;
    if (o->n_warnings >= MAX_WARNINGS) { r->dropped_warnings++; return 0; }
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **w = realloc(o->warnings, (size_t)(o->n_warnings + 1) * sizeof *w);
    if (!w) return mw_error_set(-ENOMEM, "out of memory reading %s", r->src);
    o->warnings = w;
    if (!(w[o->n_warnings] = strdup(buf))) return mw_error_set(-ENOMEM, "out of memory reading %s", r->src);
    o->n_warnings++;
    return 0;
}

static int set_opt(struct rd *r, int opt, const char *key, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int set_opt(struct rd *r, int opt, const char *key, const char *fmt, ...)
{
    char buf[4200];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf) return mw_error_set(-EINVAL, "%s: %s: the value is too long", r->src, key);
    free(r->slot_val[opt]);
    free(r->slot_key[opt]);
    r->slot_val[opt] = strdup(buf);
    r->slot_key[opt] = strdup(key);
    if (!r->slot_val[opt] || !r->slot_key[opt]) return mw_error_set(-ENOMEM, "out of memory reading %s", r->src);
    return 0;
}

/* The shortest of %.15g / %.17g that reads back as the same double (0.9, not 0.90000000000000002). */
static int set_num(struct rd *r, int opt, const char *key, double v)
{
    char b[40];
    snprintf(b, sizeof b, "%.15g", v);
    if (strtod(b, NULL) != v) snprintf(b, sizeof b, "%.17g", v);
    return set_opt(r, opt, key, "%s", b);
}

/* 1: the string "auto" (the Hugging Face Trainer fills those in; memwall leaves the option at
 * its own value), 0: *v is a finite number, < 0: the message is set. */
static int get_num(struct rd *r, const cJSON *c, const char *path, double *v)
{
    if (cJSON_IsString(c) && !strcmp(c->valuestring, "auto")) return 1;
    if (!cJSON_IsNumber(c))
        return mw_error_set(MW_EFORMAT, "%s: %s: expected a number, got %s", r->src, path, type_name(c));
    if (!isfinite(c->valuedouble))
        return mw_error_set(-EINVAL, "%s: %s: the number is too large", r->src, path);
    *v = c->valuedouble;
    return 0;
}

static int range_err(struct rd *r, const char *path, double v, double min, double max, const char *why)
{
    return mw_error_set(-EINVAL, "%s: %s: %g is out of range [%g, %g]%s%s", r->src, path, v, min, max,
                        why ? ": " : "", why ? why : "");
}

/* An integer in [min, max] (bounds below 2^53, so the cast after the check is exact). */
static int get_int(struct rd *r, const cJSON *c, const char *path, double min, double max, const char *why,
                   long long *out)
{
    double v;
    int rc = get_num(r, c, path, &v);
    if (rc) return rc;
    if (v != floor(v)) return mw_error_set(-EINVAL, "%s: %s: expected an integer, got %g", r->src, path, v);
    if (v < min || v > max) return range_err(r, path, v, min, max, why);
    *out = (long long)v;
    return 0;
}

static int get_bool(struct rd *r, const cJSON *c, const char *path, int *out)
{
    if (cJSON_IsString(c) && !strcmp(c->valuestring, "auto")) return 1;
    if (!cJSON_IsBool(c))
        return mw_error_set(MW_EFORMAT, "%s: %s: expected true or false, got %s", r->src, path, type_name(c));
    *out = cJSON_IsTrue(c);
    return 0;
}

static int get_str(struct rd *r, const cJSON *c, const char *path, const char **out)
{
    *out = NULL;
    if (!cJSON_IsString(c) || !c->valuestring)
        return mw_error_set(MW_EFORMAT, "%s: %s: expected a string, got %s", r->src, path, type_name(c));
    *out = c->valuestring;
    return 0;
}

static const struct key *lookup(const char *path)
{
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(keys[i].path, path)) return &keys[i];
    return NULL;
}

static int device_of(struct rd *r, const cJSON *c, const char *path, const char **dev)
{
    const char *s;
    int err = get_str(r, c, path, &s);
    if (err) return err;
    if (!strcmp(s, "none") || !strcmp(s, "cpu") || !strcmp(s, "nvme")) { *dev = s; return 0; }
    return mw_error_set(-ENOTSUP, "%s: %s: \"%.40s\" is not a device memwall has: \"none\", \"cpu\" or \"nvme\"",
                        r->src, path, s);
}

static int path_of(struct rd *r, const cJSON *c, const char *path, const char **p)
{
    int err = get_str(r, c, path, p);
    if (err) return err;
    if (!**p) return mw_error_set(-EINVAL, "%s: %s: the path is empty", r->src, path);
    if (strlen(*p) >= 4096) return mw_error_set(-EINVAL, "%s: %s: the path is over 4095 bytes", r->src, path);
    return 0;
}

static int special(struct rd *r, const struct key *k, const cJSON *c, const char *path)
{
    long long n;
    double v;
    int b, rc;
    const char *s = NULL;
    switch (k->sp) {
    case S_TBS:
        if ((rc = get_int(r, c, path, 1, 1e15, NULL, &n)) < 0) return rc;
        if (rc == 0) { r->have_tbs = 1; r->tbs = n; }
        return 0;
    case S_MICRO:
        if ((rc = get_int(r, c, path, 1, 1 << 20, NULL, &n)) < 0) return rc;
        if (rc == 0) { r->have_micro = 1; r->micro = n; }
        return 0;
    case S_GAS:
        if ((rc = get_int(r, c, path, 1, 1 << 20, NULL, &n)) < 0) return rc;
        if (rc == 0) { r->have_gas = 1; r->gas = n; }
        return 0;
    case S_OPT_TYPE:
        if ((rc = get_str(r, c, path, &s))) return rc;
        r->opt_type_seen = 1;
        /* DeepSpeed compares optimizer names case-insensitively. */
        if (!strcasecmp(s, "adamw")) r->opt_is_adam = 0;
        else if (!strcasecmp(s, "adam")) r->opt_is_adam = 1;
        else
            return mw_error_set(-ENOTSUP, "%s: %s: \"%.40s\": memwall's optimizer is AdamW; use \"type\": \"AdamW\" "
                                "(or \"Adam\") or remove the optimizer block", r->src, path, s);
        return 0;
    case S_BETAS: {
        if (cJSON_IsString(c) && !strcmp(c->valuestring, "auto")) return 0;
        if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) != 2)
            return mw_error_set(MW_EFORMAT, "%s: %s: expected an array of two numbers, got %s", r->src, path,
                                cJSON_IsArray(c) ? "an array of another length" : type_name(c));
        double beta[2];
        for (int i = 0; i < 2; i++) {
            char p[300];
            snprintf(p, sizeof p, "%s[%d]", path, i);
            if ((rc = get_num(r, cJSON_GetArrayItem(c, i), p, &beta[i])) < 0) return rc;
            if (rc == 1) return mw_error_set(MW_EFORMAT, "%s: %s: expected a number, got \"auto\"", r->src, p);
            if (beta[i] < 0 || beta[i] > 0.999999) return range_err(r, p, beta[i], 0, 0.999999, NULL);
        }
        if ((rc = set_num(r, O_BETA1, path, beta[0]))) return rc;
        return set_num(r, O_BETA2, path, beta[1]);
    }
    case S_WD:
        if ((rc = get_num(r, c, path, &v)) < 0) return rc;
        if (rc == 1) return 0;
        if (v < k->min || v > k->max) return range_err(r, path, v, k->min, k->max, NULL);
        r->have_wd = 1;
        r->wd = v;
        return set_num(r, O_WD, path, v);
    case S_ADAMW_MODE:
        if ((rc = get_bool(r, c, path, &b)) < 0) return rc;
        if (rc == 0) r->adamw_mode_false = !b;
        return 0;
    case S_SCHEDULER:
        if (cJSON_IsObject(c)) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "type");
            s = cJSON_IsString(t) ? t->valuestring : "?";
        } else {
            s = "?";
        }
        return mw_error_set(-ENOTSUP, "%s: %s: memwall has its own learning-rate schedule, not DeepSpeed's \"%.40s\" "
                            "(linear warm-up, then a cosine to lr x min-lr-frac at the last step): remove the "
                            "scheduler block and give --warmup, --min-lr-frac and --steps", r->src, path, s);
    case S_OO_DEV: return device_of(r, c, path, &r->oo_dev);
    case S_OP_DEV: return device_of(r, c, path, &r->op_dev);
    case S_OO_PATH: return path_of(r, c, path, &r->oo_path);
    case S_OP_PATH: return path_of(r, c, path, &r->op_path);
    case S_OP_BUFCNT:
        /* DeepSpeed's parameter swap buffers: one holds the unit in use, the others hold units
         * read ahead; memwall's prefetch depth counts only the latter. */
        if ((rc = get_int(r, c, path, 1, 1025, NULL, &n))) return rc < 0 ? rc : 0;
        return set_opt(r, O_PREFETCH, path, "%lld", n - 1);
    case S_PIN:
        if ((rc = get_bool(r, c, path, &b))) return rc < 0 ? rc : 0;
        if (!b) return warn(r, "%s: %s: false has no effect: memwall always pins its host staging buffers", r->src, path);
        return 0;
    case S_AIO_BLOCK:
        if ((rc = get_int(r, c, path, k->min, k->max, NULL, &n))) return rc < 0 ? rc : 0;
        if (n % 4096)
            return mw_error_set(-EINVAL, "%s: %s: %lld is not a multiple of 4096 (memwall's NVMe I/O is O_DIRECT)",
                                r->src, path, n);
        return set_opt(r, O_AIO_BLOCK, path, "%lld", n);
    case S_NONE: break;
    }
    return mw_error_set(-EINVAL, "%s: %s: internal error (no handler)", r->src, path);
}

static int walk(struct rd *r, const cJSON *obj, const char *prefix);

static int one_key(struct rd *r, const cJSON *c, const char *path)
{
    const struct key *k = lookup(path);
    if (!k) return warn(r, "%s: %s: unknown key, ignored", r->src, path);
    if (cJSON_IsNull(c)) return 0; /* DeepSpeed's None: its default; memwall keeps its own */
    long long n;
    double v;
    int b, rc;
    switch (k->kind) {
    case K_OBJ:
        if (!cJSON_IsObject(c))
            return mw_error_set(MW_EFORMAT, "%s: %s: expected an object, got %s", r->src, path, type_name(c));
        if (!strcmp(path, "optimizer")) r->opt_present = 1;
        return walk(r, c, path);
    case K_INT:
        if ((rc = get_int(r, c, path, k->min, k->max, k->why, &n))) return rc < 0 ? rc : 0;
        return set_opt(r, k->opt, path, "%lld", n);
    case K_NUM:
        if ((rc = get_num(r, c, path, &v))) return rc < 0 ? rc : 0;
        if (v < k->min || v > k->max) return range_err(r, path, v, k->min, k->max, k->why);
        return set_num(r, k->opt, path, v);
    case K_QUIET: return 0;
    case K_NOTE: return warn(r, "%s: %s: accepted, no effect: %s", r->src, path, k->why);
    case K_FALSE:
        if ((rc = get_bool(r, c, path, &b))) return rc < 0 ? rc : 0;
        if (b) return mw_error_set(-ENOTSUP, "%s: %s: true is not supported: %s", r->src, path, k->why);
        return 0;
    case K_LIMIT:
        if (cJSON_IsBool(c)) v = cJSON_IsTrue(c);
        else if ((rc = get_num(r, c, path, &v))) return rc < 0 ? rc : 0;
        if (v < k->min || v > k->max)
            return mw_error_set(-ENOTSUP, "%s: %s: %g is not supported: %s", r->src, path, v, k->why);
        return 0;
    case K_SPECIAL: return special(r, k, c, path);
    }
    return 0;
}

static int walk(struct rd *r, const cJSON *obj, const char *prefix)
{
    int n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        if (++n > MAX_KEYS_PER_OBJECT)
            return mw_error_set(MW_EFORMAT, "%s: %s: more than %d keys in one object", r->src,
                                prefix ? prefix : "(top level)", MAX_KEYS_PER_OBJECT);
        if (!c->string) return mw_error_set(MW_EFORMAT, "%s: a key without a name", r->src);
        for (const cJSON *d = obj->child; d != c; d = d->next)
            if (!strcmp(d->string, c->string))
                return mw_error_set(MW_EFORMAT, "%s: %s%s%.100s: the key appears twice", r->src, prefix ? prefix : "",
                                    prefix ? "." : "", c->string);
        char path[256];
        int len = snprintf(path, sizeof path, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", c->string);
        int err;
        if (len < 0 || (size_t)len >= sizeof path)
            err = warn(r, "%s: a key of %zu bytes: unknown, ignored", r->src, strlen(c->string));
        else
            err = one_key(r, c, path);
        if (err) return err;
    }
    return 0;
}

/* Micro-batch per GPU, accumulation and train_batch_size, as DeepSpeed resolves them
 * (train_batch_size = micro x accumulation x world; any two give the third). */
static int resolve_batch(struct rd *r, int world)
{
    long long W = world, M = r->micro, G = r->gas, T = r->tbs;
    int hm = r->have_micro, hg = r->have_gas;
    if (r->have_tbs) {
        if (hm && hg) {
            if (M * G * W != T)
                return mw_error_set(-EINVAL, "%s: train_batch_size %lld is not train_micro_batch_size_per_gpu %lld x "
                                    "gradient_accumulation_steps %lld x %lld rank%s = %lld: fix one of them", r->src,
                                    T, M, G, W, W == 1 ? "" : "s", M * G * W);
        } else if (hm) {
            if (T % (M * W))
                return mw_error_set(-EINVAL, "%s: train_batch_size %lld does not divide by train_micro_batch_size_per_gpu "
                                    "%lld x %lld rank%s", r->src, T, M, W, W == 1 ? "" : "s");
            G = T / (M * W);
            hg = 1;
        } else if (hg) {
            if (T % (G * W))
                return mw_error_set(-EINVAL, "%s: train_batch_size %lld does not divide by gradient_accumulation_steps "
                                    "%lld x %lld rank%s", r->src, T, G, W, W == 1 ? "" : "s");
            M = T / (G * W);
            hm = 1;
        } else {
            if (T % W)
                return mw_error_set(-EINVAL, "%s: train_batch_size %lld does not divide by the %lld ranks", r->src, T, W);
            M = T / W;
            G = 1;
            hm = hg = 1;
        }
        if (G > (1 << 20))
            return mw_error_set(-EINVAL, "%s: train_batch_size %lld implies %lld accumulation steps (at most %d)", r->src,
                                T, G, 1 << 20);
    }
    int err;
    if (hm) {
        /* memwall's --batch is the global micro-batch: every rank runs micro of it. */
        if (M * W > (1 << 20))
            return mw_error_set(-EINVAL, "%s: train_micro_batch_size_per_gpu %lld x %lld ranks is over memwall's "
                                "largest --batch (%d)", r->src, M, W, 1 << 20);
        if ((err = set_opt(r, O_BATCH, r->have_micro ? "train_micro_batch_size_per_gpu" : "train_batch_size",
                           "%lld", M * W)))
            return err;
    }
    if (hg && (err = set_opt(r, O_ACCUM, r->have_gas ? "gradient_accumulation_steps" : "train_batch_size", "%lld", G)))
        return err;
    return 0;
}

static int resolve(struct rd *r, int world)
{
    int err = resolve_batch(r, world);
    if (err) return err;
    if (r->opt_present && !r->opt_type_seen)
        return mw_error_set(-ENOTSUP, "%s: optimizer: no \"type\": memwall's optimizer is AdamW; add \"type\": \"AdamW\"",
                            r->src);
    /* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false; then weight decay would be an L2
     * term in the gradient, which memwall's AdamW does not do (the same update when it is 0). */
    if (r->opt_is_adam && r->adamw_mode_false && (!r->have_wd || r->wd != 0))
        return mw_error_set(-ENOTSUP, "%s: optimizer.params.adam_w_mode: false (Adam with L2 weight decay) is not "
                            "supported: memwall's optimizer is AdamW with decoupled weight decay; set adam_w_mode to "
                            "true, or weight_decay to 0 (then both are the same update)", r->src);
    /* Where each state lives: memwall's optimizer always runs on the host, so "none" and "cpu"
     * both mean host DRAM. */
    if (r->oo_dev && (err = set_opt(r, O_OPT_TIER, "zero_optimization.offload_optimizer.device", "%s",
                                    strcmp(r->oo_dev, "nvme") ? "dram" : "nvme")))
        return err;
    if (r->op_dev && (err = set_opt(r, O_OFF_PARAMS, "zero_optimization.offload_param.device", "%s",
                                    strcmp(r->op_dev, "nvme") ? "dram" : "nvme")))
        return err;
    int oo_nvme = r->oo_dev && !strcmp(r->oo_dev, "nvme"), op_nvme = r->op_dev && !strcmp(r->op_dev, "nvme");
    const char *oo_path = oo_nvme ? r->oo_path : NULL, *op_path = op_nvme ? r->op_path : NULL;
    if (r->oo_path && !oo_nvme &&
        (err = warn(r, "%s: zero_optimization.offload_optimizer.nvme_path: ignored: the device is not \"nvme\"", r->src)))
        return err;
    if (r->op_path && !op_nvme &&
        (err = warn(r, "%s: zero_optimization.offload_param.nvme_path: ignored: the device is not \"nvme\"", r->src)))
        return err;
    if (oo_path && op_path && strcmp(oo_path, op_path))
        return mw_error_set(-ENOTSUP, "%s: zero_optimization.offload_param.nvme_path \"%.200s\" and offload_optimizer."
                            "nvme_path \"%.200s\" differ: memwall keeps weights and optimizer state under one --nvme-dir "
                            "(several directories: D1:D2); give both the same path", r->src, op_path, oo_path);
    const char *p = oo_path ? oo_path : op_path;
    if (p && (err = set_opt(r, O_NVME_DIR, oo_path ? "zero_optimization.offload_optimizer.nvme_path"
                                                   : "zero_optimization.offload_param.nvme_path", "%s", p)))
        return err;
    if (r->dropped_warnings) {
        r->out->n_warnings--; /* room for the summary line: the cap is MAX_WARNINGS lines */
        free(r->out->warnings[r->out->n_warnings]);
        int d = r->dropped_warnings + 1;
        r->dropped_warnings = 0;
        if ((err = warn(r, "%s: %d more warnings not shown", r->src, d))) return err;
    }
    return 0;
}

void mw_ds_config_free(struct mw_ds_config *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_settings; i++) {
        free(c->settings[i].value);
        free(c->settings[i].key);
    }
    for (int i = 0; i < c->n_warnings; i++) free(c->warnings[i]);
    free(c->settings);
    free(c->warnings);
    memset(c, 0, sizeof *c);
}

int mw_ds_config_parse(const char *text, size_t len, const char *source, int world, struct mw_ds_config *out)
{
    memset(out, 0, sizeof *out);
    struct rd r;
    memset(&r, 0, sizeof r);
    r.src = source ? source : "ds_config";
    r.out = out;
    if (world < 1 || world > (1 << 20)) return mw_error_set(-EINVAL, "%s: world size %d out of range", r.src, world);
    if (len > MW_DS_CONFIG_MAX_BYTES)
        return mw_error_set(MW_EFORMAT, "%s: %zu bytes: a DeepSpeed config is at most %u bytes here", r.src, len,
                            MW_DS_CONFIG_MAX_BYTES);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        return mw_error_set(MW_EFORMAT, "%s: not valid JSON (near byte %zu)", r.src, off);
    }
    int err = 0;
    /* Only whitespace may follow the object. */
    for (const char *q = end; q && q < text + len; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r' && *q != 0) {
            err = mw_error_set(MW_EFORMAT, "%s: not valid JSON (text after the object, byte %zu)", r.src,
                               (size_t)(q - text));
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        err = mw_error_set(MW_EFORMAT, "%s: expected a JSON object (a DeepSpeed config), got %s", r.src, type_name(root));
        goto out;
    }
    if ((err = walk(&r, root, NULL))) goto out;
    if ((err = resolve(&r, world))) goto out;
    int n = 0;
    for (int i = 0; i < O_COUNT; i++) n += r.slot_val[i] != NULL;
    if (n && !(out->settings = calloc((size_t)n, sizeof *out->settings))) {
        err = mw_error_set(-ENOMEM, "out of memory reading %s", r.src);
        goto out;
    }
    for (int i = 0; i < O_COUNT; i++) {
        if (!r.slot_val[i]) continue;
        struct mw_ds_setting *s = &out->settings[out->n_settings++];
        s->option = opt_names[i];
        s->value = r.slot_val[i];
        s->key = r.slot_key[i];
        r.slot_val[i] = r.slot_key[i] = NULL;
    }
out:
    for (int i = 0; i < O_COUNT; i++) {
        free(r.slot_val[i]);
        free(r.slot_key[i]);
    }
    cJSON_Delete(root);
    if (err) mw_ds_config_free(out);
    return err;
}

int mw_ds_config_load(const char *path, int world, struct mw_ds_config *out)
{
    memset(out, 0, sizeof *out);
    char *buf = NULL;
    size_t n = 0;
    int err = mw_read_small_file(path, "DeepSpeed config", MW_DS_CONFIG_MAX_BYTES, &buf, &n);
    if (!err) err = mw_ds_config_parse(buf, n, path, world, out);
    free(buf);
    return err;
}

const struct mw_ds_setting *mw_ds_config_find(const struct mw_ds_config *c, const char *option)
{
    for (int i = 0; i < c->n_settings; i++)
        if (!strcmp(c->settings[i].option, option)) return &c->settings[i];
    return NULL;
}
