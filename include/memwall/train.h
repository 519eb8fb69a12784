/*
 * memwall/train.h — the training loop around the GPT-2 model: micro-batches with gradient
 * accumulation, global-norm clipping, warm-up + cosine learning rate, AdamW, validation,
 * sampling, and checkpoints that resume bitwise identically.
 *
 * Why a library part and a CLI part: the loop is what tests, benches and (later) the offload
 * engine drive; `memwall train` (src/cli/cmd_train.c) only parses options, prints progress
 * and writes the JSON log. Nothing here prints.
 *
 * Determinism: everything random comes from splitmix64 states (data.h) derived from the seed:
 * the weights from `seed`, the batches from one data-RNG word that the checkpoint stores. The
 * model and optimizer kernels are bitwise reproducible for a given thread count, so a run and
 * its resumption from any checkpoint produce bitwise identical losses.
 *
 * Checkpoint file (all integers little-endian; docs/train.md has the field list):
 *   header   "MWCKPT01", version, header bytes, model config, training config, step,
 *            data-RNG state, data path, element counts, section byte sizes
 *   params   n_params fp32
 *   opt      the optimizer state of the owned range (DRAM AdamW: m then v, fp32)
 *   trailer  "MWCKEND1", crc32c of everything before it, total file bytes
 * written to a temporary beside PATH, fsynced, renamed, directory fsynced: a file without its trailer was never complete.
 * Several ranks: each writes its own file (its optimizer shard; the params section is the
 * whole model on every rank) and the header records world size, rank, ZeRO stage, subgroup
 * size and owned range; a resume with another rank count or stage is refused.
 */
#ifndef MEMWALL_TRAIN_H
#define MEMWALL_TRAIN_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "memwall/data.h"
#include "memwall/gpt2.h"
#include "memwall/model.h"
#include "memwall/offload.h"

struct mw_trace; /* memwall/trace.h */

#ifdef __cplusplus
extern "C" {
#endif

/* Tiers are memwall/offload.h's enum mw_tier_id (MW_TIER_DRAM, MW_TIER_NVME): one
 * enum for the optimizer state, the streamed weights and the engine. */

struct mw_train_config {
    int batch;             /* B: sequences per micro-batch */
    int seq;               /* T: tokens per sequence */
    int grad_accum;        /* micro-batches per optimizer step */
    int64_t steps;         /* optimizer steps of the whole run */
    double lr;             /* peak learning rate */
    int64_t warmup;        /* steps of linear warm-up from lr/warmup to lr */
    double min_lr_frac;    /* the cosine decays to lr * min_lr_frac at the last step */
    double weight_decay;   /* AdamW decoupled decay, applied to 2-D tensors only */
    double beta1, beta2, eps;
    double clip;           /* global gradient-norm limit; 0 = no clipping */
    int64_t val_every;     /* validate every N steps (and at step 0 and the last); 0 = never */
    int64_t val_batches;   /* micro-batches of B x T per validation */
    int64_t ckpt_every;    /* checkpoint every N steps (and at the last); 0 = never */
    uint64_t seed;         /* weights and data order */
    int threads;           /* OpenMP / OpenBLAS threads; 0 = all */
    int recompute;         /* activation recomputation in backward */
    enum mw_tier_id tier; /* optimizer-state tier (master weights and moments) */
    /* Offload engine settings (not saved in checkpoints; 0 / NULL = the engine's default). */
    const char *nvme_dir;       /* NVMe tier directory (tier nvme; NULL = ./run/nvme) */
    uint64_t subgroup_size;     /* elements per subgroup */
    int buffer_count;           /* NVMe staging buffers */
    const char *offload_policy; /* "auto", "all-cpu", "all-device", "every-K"; NULL = all-cpu */
    uint64_t dram_budget;       /* bytes for the whole run in DRAM (model + optimizer); 0 = none */
    uint64_t nvme_budget;       /* bytes for the optimizer state on NVMe; 0 = none */
    struct mw_trace *trace;     /* optional recorder (memwall/trace.h), borrowed */
    /* Data parallelism (docs/mpi.md). comm NULL or one rank: a single-process run. Otherwise
     * `batch` is the GLOBAL micro-batch (it must divide by the ranks); each rank runs batch/N
     * sequences of it, and the loss is the mean over the global batch on every rank. */
    struct mw_comm *comm;       /* borrowed (memwall/comm.h) */
    int zero_stage;             /* 0: replicate and allreduce; 1, 2, 3: ZeRO (saved in checkpoints) */
    /* Weights and gradients (docs/train.md, "Streaming"): MW_TIER_DRAM keeps them resident;
     * MW_TIER_NVME streams them unit by unit from the optimizer's fp32 master on NVMe (needs
     * tier = MW_TIER_NVME, one rank). Not saved in checkpoints. */
    enum mw_tier_id offload_params;
    const char *init_safetensors; /* streaming only: the initial weights, loaded a unit at a time as the
                                     engine writes its master (else cfg.seed); non-streamed runs load
                                     the file into the model after mw_trainer_init */
    int prefetch_depth;         /* streaming: units fetched ahead of use (0..8) */
    int prefetch_next_micro;    /* streaming, batch-major, one rank: a micro-batch's backward fetches the
                                   next micro-batch's first units ahead, as it does its own (the PyTorch
                                   session, whose micro-batches run one after the other) */
    int prefetch_by_size;       /* streaming: a unit larger than the model's typical one is fetched
                                   further ahead, in proportion (mw_plan_stream_leads; the PyTorch
                                   session: a tied head's read starts blocks before its use) */
    int keep_grads;             /* streaming, batch-major, one rank: every step's gradients stay in DRAM
                                   for the update (the plan counts the whole array), as they do with
                                   accumulation, instead of a write to NVMe and a read back: 2 x 4 bytes a
                                   parameter less disk traffic a step; --dram-budget chooses it when it
                                   fits (MW_FIT_GRADS) */
    int keep_tied;              /* streaming: a unit the forward uses twice (a tied embedding and LM head)
                                   stays resident from its first use to its second instead of a second
                                   fetch; --dram-budget chooses it when it fits (MW_FIT_GRADS) */
    int sync_update;            /* 1: the optimizer step finishes inside its step; 0 (default): with
                                   the optimizer state on NVMe and one rank, it runs behind the next
                                   step's forward pass (bitwise the same results) */
    int layer_major;            /* 1: each step's micro-batches go through the model unit by unit
                                   (the model's layer-major step); 0: one micro-batch at a time */
    int acts_nvme;              /* layer-major with streamed weights: each block's activations are
                                   written to NVMe in forward and read back in backward (src/train/acts.c)
                                   instead of recomputed; bitwise the same results */
    /* The offload engine's NVMe I/O (not saved in checkpoints; 0 = the engine's default;
     * DeepSpeed's aio.block_size / aio.queue_depth). */
    uint64_t io_block_size;     /* bytes per NVMe request piece, a multiple of 4096 (default 1 MiB) */
    unsigned io_queue_depth;    /* NVMe pieces in flight, at most 4096 (default 128) */
    int preread;                /* 1: pre-reads of the next step's first subgroups between steps
                                   (mw_offload_config.preread; memwall train: on unless --preread off) */
    /* Crash-anywhere resume (docs/resume.md; tier nvme, one rank). journal: the engine keeps a
     * durable commit record of every step (mw_trainer_journal_begin starts it). resume: the
     * record of a run that did not finish (mw_train_resume_read); the trainer continues it
     * from its last committed step instead of starting (borrowed for mw_trainer_init). */
    int journal;
    const struct mw_offload_record *resume;
};

/* Learning rate at optimizer step `step` (1-based): linear warm-up over `warmup` steps to lr,
 * then cosine from lr down to lr*min_lr_frac at step == steps. */
double mw_train_lr(const struct mw_train_config *c, int64_t step);

/* Statistics of one optimizer step. */
struct mw_train_step_stats {
    int64_t step;          /* 1-based number of the step just taken */
    float loss;            /* mean training loss over the step's micro-batches */
    double lr;             /* learning rate used */
    double grad_norm;      /* global L2 norm of the (averaged) gradient before clipping */
    int clipped;           /* 1 if the gradient was scaled down to cfg.clip */
    int skipped;           /* 1 if the gradient held inf/NaN and no update was made */
    uint64_t tokens;       /* B * T * grad_accum */
    uint64_t ns;           /* wall time of the step */
    uint64_t nvme_read_bytes, nvme_write_bytes; /* optimizer state moved this step, bytes */
    double io_wait_s;      /* time the optimizer's update thread waited for NVMe this step, s */
    uint64_t forward_ns, backward_ns, update_ns; /* phase times of this step (summed over micro-batches) */
    uint64_t comm_sent_bytes;  /* bytes this rank sent in collectives this step (ring model) */
    uint64_t comm_sent_mean_bytes; /* the mean of comm_sent_bytes over the ranks */
    double comm_wait_s;        /* time this rank was blocked waiting for collectives this step, s */
};

/* Bytes each part of the training state occupies, per tier (for the progress line and the
 * trace). */
struct mw_train_bytes {
    uint64_t params, grads, acts;  /* DRAM (ZeRO-3: params, ZeRO-2/3: grads = this rank's shard) */
    uint64_t opt_dram, opt_nvme;   /* optimizer engine (moments, master unless it is the params,
                                      staging buffers; on NVMe both slots) */
};

struct mw_train_opt;   /* src/train/optimizer_step.h: the optimizer behind a small interface */
struct mw_train_zero;  /* src/train/zero.h: data parallelism and ZeRO */
struct mw_train_stream;/* src/train/stream.h: weights and gradients streamed from NVMe */
struct mw_residency;   /* src/train/residency.h: where each weight unit lives between uses */

struct mw_trainer {
    struct mw_train_config cfg;
    struct mw_net model;           /* the model, through its family's table (memwall/model.h) */
    const struct mw_data *data;    /* borrowed: must outlive the trainer */
    struct mw_train_opt *opt;
    int64_t step;                  /* optimizer steps completed */
    uint64_t data_rng;             /* state of the batch sampler */
    int32_t *inputs, *targets;     /* [B * T] the current micro-batch (this rank's slice); layer-major:
                                      [grad_accum][B * T] the step's micro-batches */
    float *lm_losses;              /* [grad_accum] layer-major: each micro-batch's loss */
    int32_t *g_inputs, *g_targets; /* [B * T] the global micro-batch (several ranks only) */
    struct mw_residency *res;      /* where the weights live and how gradients leave (src/train/residency.h):
                                      the factory builds it from cfg; the trainer calls nothing else */
    const struct mw_train_schedule *schedule; /* batch-major or layer-major (trainer.c), chosen at init */
    int world, rank;               /* ranks of the run and this one's (1, 0 without MPI) */
    int local_batch;               /* sequences this rank runs per micro-batch */
    int overlap;                   /* the update runs behind the next forward (cfg.sync_update) */
    char *journal_data;            /* commit records are written (the data path they name); NULL: not */
    char *run_spec;                /* the caller's settings of the run (mw_trainer_set_run_spec), kept in
                                      every commit record and checkpoint; NULL: none */
};

/* Builds the model (weights initialised from cfg->seed), the optimizer and the batch buffers.
 * The data must hold windows of cfg->seq + 1 tokens (mw_data_check) with tokens < vocab.
 * Returns 0 or a negative code with the message set. */
int mw_trainer_init(struct mw_trainer *tr, const struct mw_net_config *mcfg,
                    const struct mw_train_config *cfg, const struct mw_data *data);
void mw_trainer_free(struct mw_trainer *tr);

/* One optimizer step: grad_accum micro-batches of forward + backward, clipping, AdamW. With
 * tr->overlap the AdamW update of step s is still running when this returns (for s < steps); the
 * next step's forward pass waits unit by unit for it, saving and mw_trainer_finish for all. */
int mw_trainer_step(struct mw_trainer *tr, struct mw_train_step_stats *st);
/* Waits for an update still running and commits it (0 when none). */
int mw_trainer_finish(struct mw_trainer *tr);

/* Mean validation loss over cfg.val_batches fixed batches (the same ones every call). */
int mw_trainer_eval(struct mw_trainer *tr, float *val_loss);

/* Generates n tokens after the prompt tokens (n_prompt >= 1), feeding at most the model's
 * context; seeded sampling with temperature (> 0) and top-k (0 = all). out receives the n
 * new tokens. */
int mw_trainer_sample(struct mw_trainer *tr, const int32_t *prompt, int n_prompt, int n,
                      float temperature, int top_k, uint64_t seed, int32_t *out);

void mw_trainer_bytes(const struct mw_trainer *tr, struct mw_train_bytes *b);

/* ZeRO facts of a multi-rank run (all zero for one rank). */
struct mw_train_zero_info {
    int stage, world, rank, shard_ranks, replicas;
    uint64_t subgroup_size;           /* elements */
    uint64_t own_first, own_n;        /* owned elements of the flat parameter space */
    uint64_t weights_resident_peak;   /* ZeRO-3: peak bytes of the weight array resident (mincore) */
    uint64_t weights_resident_now;
    uint64_t grads_resident_peak;     /* ZeRO-2/3: peak bytes of the gradient array resident (mincore) */
};
/* The largest v over the ranks (collective under data parallelism; v itself on one rank). */
int mw_trainer_max_u64(struct mw_trainer *tr, uint64_t v, uint64_t *max);
/* Writes the model as model.safetensors (HF names) through the residency interface: a unit at a
 * time is brought into DRAM (streamed weights, ZeRO-3 gathered). Collective under ZeRO-3 (every
 * rank calls it); only a rank with write != 0 writes the file. */
int mw_trainer_save_safetensors(struct mw_trainer *tr, const char *path, int write);
/* The plan of a streamed run (--offload-params nvme) without running it: the DRAM peak the
 * trainer would print and check against cfg->dram_budget (out, memwall/plan.h), and the NVMe
 * bytes of its state. Nothing is allocated on any tier. */
struct mw_plan_stream;
int mw_train_plan_stream(const struct mw_net_config *mcfg, const struct mw_train_config *cfg,
                         struct mw_plan_stream *out, uint64_t *nvme_bytes);
/* The run's placement and schedule, as the user chose them (NULL or "auto": memwall decides). */
struct mw_train_choices {
    const char *tier;           /* the optimizer state: "dram" | "nvme"; NULL: nvme when the weights stream */
    const char *offload_params; /* the weights between uses: "dram" | "nvme" (streamed) */
    const char *schedule;       /* "auto" (layer-major when streamed) | "layer-major" | "batch-major" */
    const char *activations;    /* "auto" (nvme when streamed layer-major without recompute) | "recompute" | "nvme" */
    const char *preread;        /* "auto" | "on" | "off" */
    int recompute;              /* the user asked for recomputation */
    int world;                  /* ranks of the run */
    const char *init_safetensors; /* initial weights (NULL: from the seed); streamed: a unit at a time */
    int prefetch_given;         /* the user set prefetch_depth (it serves streamed weights only) */
};
/* Decides tc's tier, offload_params, layer_major, acts_nvme, preread and journal from ch, and
 * checks them with tc's offload_policy, io_block_size and batch: -EINVAL naming every conflict in
 * one message (src/train/resolve.c). */
int mw_train_config_resolve(const struct mw_train_choices *ch, struct mw_train_config *tc);
/* What a resolved configuration decided, in the words a run's record keeps: tier "dram" | "nvme",
 * schedule "layer-major" | "batch-major", activations "nvme" | "recompute" (streamed layer-major
 * runs; NULL: not decided by memwall), nvme_dir (the optimizer on NVMe; NULL otherwise). */
struct mw_train_names { const char *tier, *schedule, *activations, *nvme_dir; };
void mw_train_config_names(const struct mw_train_config *tc, struct mw_train_names *out);

/* A DRAM budget picks the streamed run's knobs (src/train/budget.c): for a run with
 * offload_params = NVMe and dram_budget > 0, the knobs named in free_knobs (the caller left them
 * to memwall) are set in *cfg to the most preferred values whose plan fits the budget; when none
 * fits, MW_EBUDGET naming the smallest budget that would (out->need_min). Nothing to choose: 0. */
enum { MW_FIT_SUBGROUP = 1, MW_FIT_BUFFERS = 2, MW_FIT_PREFETCH = 4, MW_FIT_ACTS = 8, MW_FIT_GRADS = 16 };
struct mw_train_fit {
    int tried, changed;     /* plans evaluated; knobs set */
    uint64_t chosen_total;  /* the chosen plan's DRAM peak, bytes */
    uint64_t need_min;      /* none fits: the smallest plan's peak, bytes */
};
int mw_train_fit_budget(const struct mw_net_config *mc, struct mw_train_config *cfg, unsigned free_knobs,
                        struct mw_train_fit *out);

/* The streamed weights' figures (zero when weights are resident). */
struct mw_train_stream_info {
    int active, prefetch_depth;
    uint64_t resident_peak;        /* bytes of weights resident at the peak (subgroups) */
    uint64_t fetch_bytes, grad_write_bytes; /* NVMe traffic of the stream since init */
    uint64_t handoff_bytes;       /* weights the update handed over instead of a fetch, since init */
    double wait_s;                 /* training thread blocked on weight fetches, s */
    /* The planned DRAM peak (bytes, src/plan mw_plan_stream_dram) and its parts. */
    uint64_t planned_total, planned_runtime, planned_acts, planned_staging, planned_weights, planned_grads;
    uint64_t planned_streamed;     /* weights + gradients at their worst moment (or the step's) */
    uint64_t planned_dp;           /* data parallel: the ZeRO collectives' shard buffers (0 on one rank) */
};

/* Where the run's weights live and how its gradients leave, with the figures of each. */
struct mw_train_residency_info {
    const char *source;       /* "dram", "peers" (ZeRO-3 all-gather), "nvme" (streamed) */
    const char *reduction;    /* "none" (one rank), "allreduce" (ZeRO-0), "reduce-scatter" (ZeRO-1..3) */
    struct mw_train_zero_info zero;
    struct mw_train_stream_info stream;
};
/* collective != 0: every rank calls it, and the resident peaks (zero.*_peak) are the largest over
 * the ranks; 0 otherwise (this rank's own figures). */
int mw_trainer_info(struct mw_trainer *tr, struct mw_train_residency_info *ri, int collective);

/* ---- checkpoints ---- */

/* What a checkpoint says about its run, readable without building a model. */
struct mw_ckpt_info {
    uint32_t version;

    struct mw_train_config train;
    int64_t step;
    uint64_t data_rng;
    char data_path[512];
    uint64_t n_params;
    uint64_t opt_bytes;
    /* Data parallelism: ranks of the run that wrote it, the writer's rank, the ZeRO stage, the
     * subgroup size and the owned range (0 in single-rank checkpoints: world 1). */
    int world, rank, zero_stage;
    uint64_t subgroup_size, own_first, own_n;
    uint32_t spec_bytes;   /* version 2: bytes of the run's settings after the header (mw_ckpt_read_spec) */
    struct mw_net_config net; /* the model family and its config (version 1: GPT-2, from `model`) */
};

/* Writes the trainer's state to path (atomically: a temporary in the same directory, fsync,
 * rename, fsync of the directory). The weights are read a unit at a time through the residency
 * interface (collective under ZeRO-3: every rank calls it). */
int mw_trainer_save(struct mw_trainer *tr, const char *data_path, const char *path);
/* The bytes of a checkpoint of this trainer (mw_trainer_save). */
uint64_t mw_trainer_ckpt_bytes(const struct mw_trainer *tr);
/* Reads and validates the header only (magic, version, sizes against the file length). */
int mw_ckpt_read_info(const char *path, struct mw_ckpt_info *info);
/* The run's settings a checkpoint keeps (mw_trainer_set_run_spec) into *spec (malloc'd, NUL-
 * terminated); *spec = NULL for a checkpoint without them (written before memwall kept them). */
int mw_ckpt_read_spec(const char *path, char **spec);

/* ---- a run's outputs, checked before its first step (src/train/outputs.c) ---- */

struct mw_train_outputs {
    const char *out_dir;       /* NULL: none (the final model and checkpoints go there) */
    const char *log_path, *trace_path, *data_path; /* NULL: none */
    uint64_t model_bytes;      /* the final model file */
    uint64_t ckpt_bytes;       /* one checkpoint; 0: none are written */
};
struct mw_train_outlock;
/* Takes the out-dir's lock (-EBUSY naming the holder when another live run has it), removes the
 * temporaries of dead runs there and beside the log and trace, and refuses (a message naming the
 * setting, e.g. out_dir) an output that cannot be written, two outputs that are one file or an
 * output that is the data, and an out-dir without the free space for the final model and two
 * checkpoints. Release the lock when the run ends. */
int mw_train_outputs_check(const struct mw_train_outputs *o, struct mw_train_outlock **lock);
void mw_train_outputs_release(struct mw_train_outlock *lock);
/* Removes PREFIX*.tmp.<pid>.<n> files of processes that are not alive from dir (prefix NULL:
 * any); *removed (optional) counts them. */
int mw_train_sweep_tmp(const char *dir, const char *prefix, int *removed);
/* An absolute path for path, which need not exist (its directory must). */
int mw_train_abs_path(const char *path, char *out, size_t n);

/* ---- the JSON step log (src/train/runlog.c): one object per line ---- */
struct mw_train_log { FILE *f; char *path; };
/* resume_step < 0: a new log (truncated). Otherwise the log of a resumed run: the lines of steps
 * after resume_step are dropped (*dropped, optional, counts them) and the log goes on after it. */
int mw_train_log_open(struct mw_train_log *l, const char *path, int64_t resume_step, int *dropped);
int mw_train_log_val(struct mw_train_log *l, int64_t step, float val_loss); /* {"step":S,"val_loss":X} */
/* A step's line (val_loss: NULL when the step had no validation); flushed. */
int mw_train_log_step(struct mw_train_log *l, const struct mw_train_step_stats *st, const float *val_loss,
                      const struct mw_train_bytes *tb, int ranks, int zero);
/* Flushed, synced and closed; the real errno of a failure. Idempotent. */
int mw_train_log_close(struct mw_train_log *l);

/* The caller's settings of the run, as text of at most MW_TRAIN_SPEC_MAX bytes without NULs, kept
 * opaque in every commit record and checkpoint from now on (memwall train: every option, so that
 * --resume alone continues the run as it was started). */
#define MW_TRAIN_SPEC_MAX 32768u
int mw_trainer_set_run_spec(struct mw_trainer *tr, const char *spec);
/* Restores params, optimizer state, step and data-RNG state into a trainer built with the
 * checkpoint's model config. Verify, then apply: the header, the length, the completion marker
 * and the crc32c of the whole file are checked before anything is written, so a mismatch
 * (MW_EFORMAT / MW_ECHECKSUM, or -EINVAL for another model or rank layout) leaves the trainer
 * exactly as it was. Only an I/O error of the offload engine while applying, or the file
 * changing during the load, leaves it partly loaded (the message says so; it is then unusable). */
int mw_trainer_load(struct mw_trainer *tr, const char *path);
/* The weights of checkpoint path (verified whole first) into m, built from the checkpoint's model
 * config (mw_ckpt_read_info's net): for evaluation and export without a trainer. */
int mw_ckpt_load_weights(const char *path, struct mw_net *m);

/* ---- evaluation (src/train/eval.c) ---- */
/* The mean next-token loss, in nats, over every whole window of T + 1 tokens of every segment of
 * d (tokens iT..iT+T-1 predict iT+1..iT+T; the split into training and validation is ignored),
 * B windows per forward pass of m (built for at least B x T). 0, or an error with the message set
 * (no whole window: -EINVAL naming the tokens and T). */
struct mw_eval_result { uint64_t windows, tokens; double loss; };
int mw_train_eval_windows(struct mw_net *m, const struct mw_data *d, int T, int B, struct mw_eval_result *out);

/* ---- crash-anywhere resume (docs/resume.md) ---- */

/* What the commit record of a run in an NVMe directory says: the trainer's part (its settings
 * and continuation state, as a checkpoint header holds them, plus the offload settings a
 * checkpoint does not keep) and the engine's record. */
struct mw_train_resume {
    struct mw_ckpt_info info;            /* model, training settings, step, data-RNG state, data path */
    char *run_spec;                      /* the run's settings as its caller kept them; NULL in records
                                            written before memwall kept them */
    enum mw_tier_id offload_params; /* streamed weights or not */
    int layer_major, sync_update, prefetch_depth, buffer_count;
    uint64_t subgroup_size, io_block_size;
    unsigned io_queue_depth;
    struct mw_offload_record rec;        /* pass &rec as mw_train_config.resume */
};
/* Reads and validates DIR's commit record (hostile input; -ENOENT when there is none). */
int mw_train_resume_read(const char *dir, struct mw_train_resume *out);
int mw_train_resume_parse(const void *data, size_t n, struct mw_train_resume *out); /* the record's bytes */
void mw_train_resume_free(struct mw_train_resume *r);
/* Starts the commit records (cfg.journal): the engine is created if it is not yet, and the
 * state as it is now (step 0, a loaded checkpoint's, or a resumed one's) is recorded; from then
 * on every step is. data_path is recorded for `memwall train --resume DIR`. */
int mw_trainer_journal_begin(struct mw_trainer *tr, const char *data_path);
/* For a caller that keeps its own account of every step (memwall train: the --log-json line, which
 * a resume keeps up to the committed step): the records of steps after the current one are held
 * until the next call, made once that account of the step is written, so that no step is
 * committed without it. The first call (after mw_trainer_journal_begin) starts holding. A held
 * record is written when the next step (or a skipped one, or mw_trainer_journal_end) needs it;
 * mw_trainer_free drops it: the step was not committed, and a resume runs it again. */
int mw_trainer_journal_allow(struct mw_trainer *tr);
/* The run finished: its record and store files are removed (the files at mw_trainer_free). */
int mw_trainer_journal_end(struct mw_trainer *tr);

#ifdef __cplusplus
}
#endif
#endif
