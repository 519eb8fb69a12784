/*
 * memwall/offload.h — the offload engine: the optimizer state of a model that does not fit,
 * cut into subgroups placed on tiers (host DRAM, NVMe), updated by an overlapped pipeline
 * (read -> update -> write-back -> working-copy refresh) on the CPU or on an accelerator,
 * whichever a cost model says finishes first.
 *
 * Life of a training run (see docs/offload.md for the full story):
 *
 *   registry:  mw_offload_registry_add() once per tensor, in the model's order; the flat
 *              parameter space is the concatenation of the tensors (element offsets).
 *   config:    subgroup size, staging buffer count, placement ("master=nvme,moments=nvme,
 *              grads=dram"), formats, budgets, policy, and optionally the caller's flat fp32
 *              weight and gradient arrays (the model's own arrays).
 *   plan:      mw_offload_plan_make() sizes every tier BEFORE anything is allocated and refuses
 *              a tier whose budget or real capacity is too small, with the numbers.
 *   init:      mw_offload_init() allocates exactly what the plan said and writes the initial
 *              master weights (from the caller's weight array, or zeros) to their homes.
 *   per step:  for each micro-step: mw_offload_backward_begin(last?, hparams-to-overlap?),
 *              mw_offload_grad_ready(first, n) as the backward pass finishes ranges,
 *              mw_offload_backward_end(); then mw_offload_step() runs what is left, waits,
 *              and commits. The refreshed weights are in the caller's weight array.
 *
 * Errors: 0 or a negative errno / MW_E* code, detail in mw_error_msg(). Units: elements for
 * positions in the flat parameter space, bytes for sizes, seconds in reports.
 */
#ifndef MEMWALL_OFFLOAD_H
#define MEMWALL_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/common.h"
#include "memwall/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- registry and subgroups */

#define MW_OFFLOAD_NAME_MAX 96
#define MW_OFFLOAD_MAX_DIMS 4

/* Tensor flags. */
#define MW_OFFLOAD_NO_DECAY 0x1u /* no weight decay (biases, LayerNorm gains: GPT-2's 1-D tensors) */

struct mw_offload_tensor {
    char name[MW_OFFLOAD_NAME_MAX];
    unsigned flags;        /* MW_OFFLOAD_NO_DECAY */
    int ndim;
    int64_t shape[MW_OFFLOAD_MAX_DIMS];
    uint64_t numel;        /* product of shape, elements */
    uint64_t first;        /* offset of element 0 in the flat parameter space, elements */
};

struct mw_offload_registry {
    struct mw_offload_tensor *tensors; /* [n], registration order */
    uint32_t n, cap;
    uint64_t total;        /* elements in the flat parameter space */
};

void mw_offload_registry_init(struct mw_offload_registry *r);
void mw_offload_registry_free(struct mw_offload_registry *r);
/* Appends a tensor; shape entries must be >= 1. -EINVAL on a bad shape or duplicate name. */
int mw_offload_registry_add(struct mw_offload_registry *r, const char *name, int ndim, const int64_t *shape);
int mw_offload_registry_add_ex(struct mw_offload_registry *r, const char *name, int ndim, const int64_t *shape,
                               unsigned flags);
/* Index of the tensor holding flat element `elem` (binary search), or -1 past the end. */
int mw_offload_registry_find(const struct mw_offload_registry *r, uint64_t elem);

/* A subgroup: a contiguous range of the flat parameter space, at most subgroup_size elements.
 * It may start or end inside a tensor (DeepSpeed never splits a tensor; see docs/offload.md). */
struct mw_offload_subgroup {
    uint32_t id;
    uint64_t first, n;               /* elements */
    uint32_t tensor_lo, tensor_hi;   /* first and last tensor it overlaps (inclusive) */
};

/* Cuts the registry into ceil(total / size) subgroups; *out is malloc'ed (free()). */
int mw_offload_cut(const struct mw_offload_registry *r, uint64_t subgroup_size,
                   struct mw_offload_subgroup **out, uint32_t *n_out);

/* ---------------------------------------------------------------- placement */

/* Tiers: core's enum mw_tier_id (memwall/common.h). */
/* The kinds of per-parameter state. MOMENTS covers both Adam moments (exp_avg, exp_avg_sq). */
enum mw_offload_kind { MW_OFFLOAD_MASTER = 0, MW_OFFLOAD_MOMENTS = 1, MW_OFFLOAD_GRADS = 2,
                       MW_OFFLOAD_WEIGHTS = 3, MW_OFFLOAD_NKINDS = 4 };

struct mw_offload_placement {
    enum mw_tier_id tier[MW_OFFLOAD_NKINDS];
};

const char *mw_offload_tier_name(enum mw_tier_id t);   /* "dram", "nvme", "device" */
const char *mw_offload_kind_name(enum mw_offload_kind k);   /* "master", "moments", ... */
/* Parses "master=nvme,moments=nvme,grads=dram,weights=dram"; "optim=T" sets master and moments,
 * "all=T" every kind; kinds not named keep their value in *p (initialise it first, e.g. with
 * mw_offload_placement_default: everything in dram). -EINVAL with a message otherwise. */
void mw_offload_placement_default(struct mw_offload_placement *p);
int mw_offload_placement_parse(const char *s, struct mw_offload_placement *p);
/* "master=nvme,moments=nvme,grads=dram,weights=dram" */
const char *mw_offload_placement_str(const struct mw_offload_placement *p, char *buf, size_t n);

/* ---------------------------------------------------------------- formats, policy, cost model */

enum mw_offload_wfmt { MW_OFFLOAD_W_FP32 = 0, MW_OFFLOAD_W_BF16 = 1, MW_OFFLOAD_W_FP16 = 2 };
/* BF16_SR: bf16 with the optimizer's reproducible stochastic rounding (v can decay; optim.h). */
enum mw_offload_mfmt { MW_OFFLOAD_M_FP32 = 0, MW_OFFLOAD_M_BF16 = 1, MW_OFFLOAD_M_8BIT = 2, MW_OFFLOAD_M_BF16_SR = 3 };

enum mw_offload_policy {
    MW_OFFLOAD_POLICY_AUTO = 0,       /* per subgroup: the engine predicted to finish it first */
    MW_OFFLOAD_POLICY_ALL_CPU = 1,
    MW_OFFLOAD_POLICY_ALL_DEVICE = 2,
    MW_OFFLOAD_POLICY_EVERY_K = 3,    /* subgroups with id % k == k - 1 on the device, the rest on the CPU */
};
int mw_offload_policy_parse(const char *s, enum mw_offload_policy *p, int *k); /* "auto", "all-cpu", "all-device", "every-3" */
const char *mw_offload_policy_name(enum mw_offload_policy p);

/* Calibration profile: what one machine measured (memwall bench offload --calibrate FILE). */
struct mw_offload_profile {
    double cpu_params_per_s;     /* CPU optimizer update rate, parameters/s (all kernel threads) */
    double dev_params_per_s;     /* accelerator update rate, parameters/s */
    double link_bytes_per_s;     /* host<->accelerator copy bandwidth, bytes/s (each direction) */
    double dev_latency_s;        /* fixed cost per accelerator update (launch + sync), seconds */
    double nvme_read_bytes_per_s, nvme_write_bytes_per_s; /* informational, bytes/s */
};
/* Conservative defaults used when no profile is given (a slow-link GPU-like device). */
void mw_offload_profile_default(struct mw_offload_profile *p);
int mw_offload_profile_load(const char *path, struct mw_offload_profile *p);
int mw_offload_profile_save(const char *path, const struct mw_offload_profile *p);

/* Predicted seconds to update one subgroup of n parameters whose host<->device traffic is
 * xfer_bytes (both directions summed), on each engine, excluding queueing. */
double mw_offload_predict_cpu_s(const struct mw_offload_profile *p, uint64_t n);
double mw_offload_predict_dev_s(const struct mw_offload_profile *p, uint64_t n, uint64_t xfer_bytes);

/* ---------------------------------------------------------------- configuration and plan */

struct mw_trace; /* memwall/trace.h; optional */
struct mw_offload_record; /* below: the durable commit record */

/* Streaming callers (cfg.stream; docs/offload.md, "Weights and gradients streamed"): the caller
 * keeps its weight and gradient arrays (whole pages; the subgroups page-aligned) only partly
 * resident. It writes each subgroup's initial master itself (mw_offload_master_init), reads the
 * committed master when it needs weights (mw_offload_master_fetch, after mw_offload_sg_wait: the
 * engine never writes the working copy) and drops its own weight pages after a step (they are
 * stale then). The engine keeps each subgroup's gradients in an NVMe object of its own
 * (mw_offload_grads_put_start by the caller once they are final), reads them back into ext_grads
 * beside the state before the update (those pages must be the caller's to overwrite then), and
 * returns them to the OS once the update has read them. Nothing is called back upward. */

struct mw_offload_config {
    uint64_t subgroup_size;          /* elements per subgroup (rounded up to the moment format's block) */
    int buffer_count;                /* host staging buffers for the NVMe pipeline, >= 1 */
    struct mw_offload_placement place;
    enum mw_offload_mfmt moments;    /* moment storage format */
    enum mw_offload_wfmt weights;    /* working copy format (what the model reads) */
    /* The caller's flat arrays in registration order (GPT-2 model: fp32). ext_weights (format
     * `weights`) receives the refreshed working copy; when NULL the engine owns it (on the
     * weights tier). ext_grads (fp32) is where the backward pass leaves gradients:
     *   ext_grads_accumulate = 0: each micro-step overwrites them; the engine accumulates into
     *                             its own fp32 buffer (grads tier) at grad_ready;
     *   ext_grads_accumulate = 1: the caller accumulates (+=) across micro-steps itself and
     *                             zeroes them after mw_offload_step; the engine reads them at
     *                             update time and owns no gradient buffer.
     * Without ext_grads, gradients come in through mw_offload_grad_add(). */
    void *ext_weights;
    const float *ext_grads;
    int ext_grads_accumulate;
    /* With ext_grads_accumulate = 1 (and no stream function): once a subgroup's update has read
     * its gradients, the engine gives the whole pages of ext_grads in its range back to the OS
     * (madvise MADV_DONTNEED) and zeroes the bytes of partial pages, so the gradients read as
     * zeros after the step, which is what the next accumulation needs, and hold no memory until
     * the next backward writes them. ext_grads must then be private anonymous memory (mmap
     * MAP_PRIVATE|MAP_ANONYMOUS, or malloc'd), never mlock'ed or shared. */
    int ext_grads_release;
    /* Staging buffers are given back to the OS (MADV_DONTNEED) once a step has committed and
     * fault in again when the next step's reads start: the process holds them only during the
     * update phase (a few milliseconds per step to zero them again). They are not mlock'ed then. */
    int staging_release;
    /* 1: between steps the engine reads the next step's first subgroups (as many as there are free
     * staging buffers) from NVMe while the caller computes, so the update can start the moment
     * the step does (not with staging_release, nor when the weights stream: cfg.stream). 0: off. */
    int preread;
    const char *nvme_dir;            /* directory for the NVMe state (several: "d1:d2"), when any is on nvme */
    unsigned io_queue_depth;         /* NVMe requests (pieces) in flight, reads and writes together; 0 = 128 */
    uint64_t io_block_size;          /* bytes per NVMe piece, multiple of 4096; 0 = the engine's 1 MiB */
    uint64_t budget[MW_TIER_COUNT]; /* bytes per tier, 0 = no budget (real capacity still checked) */
    enum mw_offload_policy policy;
    int every_k;                     /* for MW_OFFLOAD_POLICY_EVERY_K, >= 1 */
    int use_device;                  /* create the emulated accelerator (hybrid schedule) */
    struct mw_offload_profile profile; /* cost model inputs (mw_offload_profile_default if unset) */
    /* 0: a profile file named by the environment's MEMWALL_OFFLOAD_PROFILE (memwall bench offload
     * --calibrate FILE writes one) replaces `profile` at init; 1: `profile` is used as given. */
    int profile_fixed;
    int cpu_threads;                 /* optimizer kernel threads on the CPU path, 0 = OpenMP default */
    struct mw_trace *trace;          /* optional recorder */
    int stream;                      /* 1: the caller streams its weights and gradients (above);
                                        needs the master on NVMe */
    int grads_dram;                  /* stream: every step's gradients stay in ext_grads (the caller's
                                        plan counts the whole array): the update reads them there, zeroes
                                        them after (memset: the pages stay, no kernel zeroing at the next
                                        fault), and the next step's first subgroups may be pre-read */
    uint64_t scratch_bytes;          /* NVMe space for the caller (kept activations), 0 = none:
                                        mw_offload_scratch_start; not state (never committed) */
    /* Durable commit record (docs/resume.md; needs master and moments on NVMe): journal = 1 keeps
     * one in the first NVMe directory from mw_offload_journal_commit on; resume (with journal)
     * reopens the run a record describes instead of writing a fresh state. */
    int journal;
    const struct mw_offload_record *resume; /* borrowed for mw_offload_init only */
};
void mw_offload_config_default(struct mw_offload_config *c);

/* Bytes the engine will hold, per tier and per kind, decided before anything is allocated. */
struct mw_offload_plan {
    uint64_t total_elems;
    uint64_t subgroup_size;          /* after rounding */
    uint32_t n_subgroups;
    int transactional;               /* optimizer state has two slots per subgroup (see docs) */
    uint64_t kind_bytes[MW_OFFLOAD_NKINDS][MW_TIER_COUNT]; /* engine-owned bytes */
    uint64_t staging_bytes;          /* host staging buffers (DRAM) */
    uint64_t scratch_bytes;          /* the caller's NVMe scratch (cfg.scratch_bytes, rounded) */
    uint64_t device_arena_bytes;     /* emulated accelerator arena */
    uint64_t tier_bytes[MW_TIER_COUNT];     /* totals */
    uint64_t tier_capacity[MW_TIER_COUNT];  /* min(budget, real capacity); 0 = unknown */
};
/* Sizes the state for (registry, config); -EINVAL for a bad config, MW_EBUDGET when a tier
 * does not fit (message names the tier, what is needed and what is available). */
int mw_offload_plan_make(const struct mw_offload_registry *r, const struct mw_offload_config *c,
                         struct mw_offload_plan *plan);
/* Human table of the plan, one line per tier ("nvme: 3.00 GiB (master 1.00 GiB, ...)"). */
int mw_offload_plan_format(const struct mw_offload_plan *plan, char *buf, size_t n);

/* ---------------------------------------------------------------- the engine */

struct mw_offload;

/* AdamW hyper-parameters of one step. grad_scale multiplies every gradient before the update
 * (1/loss_scale, times a clipping coefficient computed from mw_offload_grad_norm()). */
struct mw_offload_hparams {
    double lr, beta1, beta2, eps, weight_decay; /* as struct mw_adamw_hp (memwall/optim.h) */
    float grad_scale;                           /* > 0 */
};
void mw_offload_hparams_default(struct mw_offload_hparams *h);

/* Counters of the engine since init (or the last mw_offload_stats_reset). Seconds are wall time. */
struct mw_offload_stats {
    uint64_t steps;
    uint64_t nvme_read_bytes, nvme_write_bytes;
    uint64_t h2d_bytes, d2h_bytes;
    uint64_t cpu_updates, dev_updates;     /* subgroup updates on each engine */
    uint64_t prereads;                     /* subgroups read ahead between steps (cfg.preread) */
    uint64_t fused_checksums;              /* write-backs whose checksums the CPU update took, chunk by
                                              chunk while in cache (else the store sums them) */
    uint64_t fused_verifies;               /* reads whose checksums the CPU update checked the same way */
    double step_s;                         /* wall time inside steps (first ready subgroup to commit) */
    double kernel_s;                       /* CPU time spent in the optimizer kernel on the CPU path */
    double io_wait_s;                      /* time the update thread sat idle waiting for NVMe reads */
    double predicted_s, measured_s;        /* summed over decisions (AUTO policy accounting) */
};

/* Plans (as mw_offload_plan_make), allocates, writes the initial master weights: from
 * cfg->ext_weights when it is fp32, else zeros (then call mw_offload_set_master). */
int mw_offload_init(struct mw_offload **out, const struct mw_offload_registry *r,
                    const struct mw_offload_config *cfg);
void mw_offload_free(struct mw_offload *e);
const struct mw_offload_plan *mw_offload_get_plan(const struct mw_offload *e);
/* Between steps: the policy the next steps run. A fixed one (every-K: k >= 1) on any engine (a device
 * policy only with the accelerator); auto only on an engine made with auto, which stops re-planning
 * while it runs a fixed one and resumes from what it had learned. -EINVAL, or -EBUSY with a step in
 * progress. (memwall bench offload --policies: every engine runs the best fixed policy's placement
 * to measure what the engines alone differ by.) */
int mw_offload_set_policy(struct mw_offload *e, enum mw_offload_policy p, int k);
const struct mw_offload_subgroup *mw_offload_subgroups(const struct mw_offload *e, uint32_t *n);

/* Overwrites master weights [first, first+n) of the committed state (and the working copy). */
int mw_offload_set_master(struct mw_offload *e, uint64_t first, uint64_t n, const float *src);

/* A micro-step's backward pass. last != 0: the optimizer step follows this micro-step.
 * hp != NULL (only with last): arms the update, so each subgroup's update starts as soon as
 * its gradients are final (overlapping the rest of the backward pass); the grads must not be
 * clipped by a norm that is not known yet (see docs: two-phase clipping). */
int mw_offload_backward_begin(struct mw_offload *e, int last, const struct mw_offload_hparams *hp);
/* Gradients of [first, first+n) are final for this micro-step (read from ext_grads). Callable
 * from one thread at a time, in any order, ranges of one micro-step disjoint. */
int mw_offload_grad_ready(struct mw_offload *e, uint64_t first, uint64_t n);
/* Without ext_grads: add src[0..n) to the gradients of [first, first+n), then as grad_ready. */
int mw_offload_grad_add(struct mw_offload *e, uint64_t first, uint64_t n, const float *src);
/* Ends the micro-step: ranges not reported are taken as final (read from ext_grads). */
int mw_offload_backward_end(struct mw_offload *e);
/* Elements per chunk of the gradient norm: each chunk's sum of squares is taken alone and the
 * chunks are added in order, so the norm does not depend on the subgroup size (and a caller that
 * streams the gradients can sum the same chunks as they finish). */
#define MW_OFFLOAD_NORM_CHUNK ((uint64_t)1 << 20)
/* Sum of squares of norm chunk c of the fp32 gradients g[0, n): elements [c * MW_OFFLOAD_NORM_CHUNK,
 * min(n, (c + 1) * MW_OFFLOAD_NORM_CHUNK)), in mw_grad_sumsq's fixed order (the same bits for every
 * thread count). Every gradient norm in memwall (the engine's, the streamed run's as gradients
 * finish, a ZeRO rank's over its shard) is these chunks of its range added in chunk order, so
 * they agree bit for bit. Returns 0, MW_EOVERFLOW with *sumsq non-finite (message set), or
 * another error (*sumsq 0). There are (n + MW_OFFLOAD_NORM_CHUNK - 1) / MW_OFFLOAD_NORM_CHUNK. */
int mw_offload_norm_chunk(const float *g, uint64_t n, uint64_t c, int threads, double *sumsq);
/* Global L2 norm of the accumulated gradients (times nothing: raw), summed in subgroup order so
 * it is the same for every subgroup size. Only between the last backward_end and an unarmed
 * mw_offload_step. Non-finite on overflow (then call mw_offload_skip_step). */
int mw_offload_grad_norm(struct mw_offload *e, double *norm);
/* Runs the update of every subgroup not yet started (when armed, the hyper-parameters given to
 * mw_offload_backward_begin apply and hp is ignored: one step never mixes two), waits for all,
 * commits the step, resets the gradient accumulators. On failure the previous step stays the
 * committed one: call mw_offload_recover() before anything else. */
int mw_offload_step(struct mw_offload *e, const struct mw_offload_hparams *hp);
/* The same in two halves, so the caller can run while the step does (update overlapped with
 * the next forward pass): start enqueues every subgroup and returns; wait blocks until all are
 * written and commits (0 when no step is in flight). In between: mw_offload_sg_wait tells
 * whether subgroup sg's update is written (block: wait for it; returns 1 done, 0 not yet, or
 * an error code when the step failed), mw_offload_master_fetch reads updated subgroups, and the
 * caller must not touch the weights or gradients of subgroups not yet done. */
int mw_offload_step_start(struct mw_offload *e, const struct mw_offload_hparams *hp);
int mw_offload_step_wait(struct mw_offload *e);
int mw_offload_step_in_flight(const struct mw_offload *e);
int mw_offload_sg_wait(struct mw_offload *e, uint32_t sg, int block);
/* The same for the working copy alone: 1 once subgroup sg's updated weights are in it (its NVMe
 * write may still be in flight; a failed write still fails the step at mw_offload_step_wait),
 * which is all a forward pass over resident weights needs. With cfg.stream, mw_offload_sg_wait
 * (the caller reads the master). */
int mw_offload_sg_wait_weights(struct mw_offload *e, uint32_t sg, int block);
/* Streaming (cfg.stream, fp32 weights): the caller wants subgroup sg's updated master in its pages of
 * the working copy (cfg.ext_weights, resident now) for a pass that follows the update, rather than
 * reading it from NVMe once the write has landed: the update refreshes them as it refreshes a
 * resident working copy (the CPU kernel chunk by chunk, cache-hot; else the write-back before its
 * write). The update is the step in flight's, or between steps the next step's. on = 1: returns 1
 * when that is arranged (the pages are the engine's until mw_offload_master_handoff_wait returns 1
 * or a cancel returns; then cancel to end it), 0 when it is too late (the subgroup being updated,
 * written, or done: mw_offload_sg_wait then mw_offload_master_fetch) or one is pending, or an
 * error. on = 0 ends or cancels sg's handoff, waiting out a copy in progress (before the caller
 * drops those pages). */
int mw_offload_master_handoff(struct mw_offload *e, uint32_t sg, int on);
/* Waits for a handoff: 1 once the pages hold the updated master (its write may still be in flight; a
 * failed write fails the step at mw_offload_step_wait), 0 when it will not (no step in flight: a
 * pass before the step reads the committed master; the caller cancels, then reads), an error when
 * the step failed (cancel the handoff, then drop the pages). */
int mw_offload_master_handoff_wait(struct mw_offload *e, uint32_t sg);
/* Drops the accumulated gradients without an update (overflow). */
int mw_offload_skip_step(struct mw_offload *e);
/* After a failed step: rewrites the working copy from the committed master weights and makes
 * the engine ready to retry the step (the accumulated gradients are kept). */
int mw_offload_recover(struct mw_offload *e);
/* Steps committed so far (the AdamW step number of the last update). */
uint64_t mw_offload_committed_steps(const struct mw_offload *e);

/* Reads the committed state of [first, first+n) as fp32 (moments decoded from their format):
 * kind MASTER, MOMENTS (which = 0: exp_avg, 1: exp_avg_sq), WEIGHTS (working copy, converted
 * to fp32). Works on the committed state even after a failed step. */
int mw_offload_read_state(struct mw_offload *e, enum mw_offload_kind kind, int which,
                          uint64_t first, uint64_t n, float *dst);

/* The raw bytes of one region of the committed state for elements [first, first+n), exactly as
 * stored (for bitwise comparisons and checkpoints). Region sizes: master 4n; moments n times
 * 4 (fp32), 2 (bf16) or 1 (8-bit); scales (8-bit only, first a multiple of MW_Q8_BLOCK)
 * 4 * ceil(n / MW_Q8_BLOCK); a scale region of another format reads nothing. */
enum mw_offload_region { MW_OFFLOAD_R_MASTER = 0, MW_OFFLOAD_R_EXP_AVG = 1, MW_OFFLOAD_R_EXP_AVG_SCALE = 2,
                         MW_OFFLOAD_R_EXP_AVG_SQ = 3, MW_OFFLOAD_R_EXP_AVG_SQ_SCALE = 4 };
int mw_offload_read_raw(struct mw_offload *e, int region, uint64_t first, uint64_t n, void *dst);
/* The same for nreg distinct regions at once (dst[j] receives regions[j]): each subgroup is read
 * from NVMe once for all of them (read_raw reads it once per call). */
int mw_offload_read_regions(struct mw_offload *e, uint64_t first, uint64_t n, int nreg, const int *regions,
                            void *const *dst);

/* Checkpoint restore: overwrite raw bytes of one region of the committed state (the inverse of
 * mw_offload_read_raw; a MASTER write also refreshes the working copy), and set the number of
 * committed steps (the AdamW step count used for bias correction). Not during a step. */
int mw_offload_write_raw(struct mw_offload *e, int region, uint64_t first, uint64_t n, const void *src);
/* The same for nreg distinct regions at once (src[j] holds regions[j]): each subgroup is written
 * to NVMe once, and not read first when the call covers it whole with every region its state has
 * (master, moments and, for 8-bit moments, their scales). */
int mw_offload_write_regions(struct mw_offload *e, uint64_t first, uint64_t n, int nreg, const int *regions,
                             const void *const *src);
int mw_offload_set_committed_steps(struct mw_offload *e, uint64_t steps);
/* Per-tensor AdamW steps (torch.optim keeps a step count per parameter and skips a parameter
 * without a gradient): steps[t] for tensor t of the registry (n = the registry's count) is 0 to
 * leave the tensor as it is (master, moments and working copy unchanged; its gradients are still
 * read, and released with ext_grads_release), or k >= 1 to update it as AdamW step k (its bias
 * correction) in the coming step, k + 1 in the step after, and so on: its count advances with the
 * engine's, as a tensor's that gets a gradient at every step. NULL (n ignored): every tensor as
 * the step's own number, committed + 1 (the default). The table stays until it is set again.
 * Between steps; during an armed step only entries whose subgroups have not begun their update
 * may change (-EBUSY otherwise, and nothing changes). 8-bit moments: tensors that share a block
 * of MW_Q8_BLOCK elements must be stepped alike (-EINVAL). */
int mw_offload_set_tensor_steps(struct mw_offload *e, uint32_t n, const uint64_t *steps);
/* Sets cfg.ext_grads_release and cfg.staging_release after init (non-zero: on; staging buffers
 * are unlocked then); -EINVAL when grads is on and the engine does not read the caller's
 * accumulated gradients (ext_grads_accumulate = 1, no stream function), -EBUSY during a step. */
int mw_offload_set_release(struct mw_offload *e, int grads, int staging);

/* Bytes the engine holds now on each tier (its tiers' counters): equal to the plan's tier_bytes. */
void mw_offload_tier_usage(const struct mw_offload *e, uint64_t bytes[MW_TIER_COUNT]);

void mw_offload_stats_get(const struct mw_offload *e, struct mw_offload_stats *s);
void mw_offload_stats_reset(struct mw_offload *e);

/* The cost model as it has learned (docs/offload.md, "A cost model that learns"): per component of
 * a subgroup's update (cpu, read, write, h2d, device, d2h), the correction factor it applies to the
 * profile (measured / profile time, smoothed over steps), and its predictions beside the measured
 * times, over the whole run and over the steps after it learned (step 6 on); with auto, the plan of
 * the next step and the best fixed policy's predicted time beside it. Seconds. */
#define MW_OFFLOAD_COST_NCOMP 6
struct mw_offload_cost {
    const char *name[MW_OFFLOAD_COST_NCOMP];
    double factor[MW_OFFLOAD_COST_NCOMP];
    uint64_t n[MW_OFFLOAD_COST_NCOMP];              /* observations over the run */
    double predicted_s[MW_OFFLOAD_COST_NCOMP], measured_s[MW_OFFLOAD_COST_NCOMP];
    double late_predicted_s[MW_OFFLOAD_COST_NCOMP], late_measured_s[MW_OFFLOAD_COST_NCOMP];
    uint64_t steps;                                 /* steps learned from */
    int plan_policy, plan_k;                        /* auto: enum mw_offload_policy, or -1 for a split */
    uint32_t plan_device_subgroups, plan_switches;
    double plan_predicted_s, best_fixed_predicted_s; /* the next step's update phase, simulated */
};
void mw_offload_cost_get(const struct mw_offload *e, struct mw_offload_cost *c);

/* ---------------------------------------------------------------- the NVMe object service
 * (src/offload/objects.c): transfers beside the update, each a handle the caller polls or waits on. */
struct mw_offload_io {
    struct mw_store_io s; /* the engine's; the caller only passes the handle */
};
/* 1 when the transfer has completed (mw_offload_io_wait still finishes it), 0 while in flight. */
int mw_offload_io_test(struct mw_offload_io *io);

/* Streaming (cfg.stream): the engine does not write the initial master at init; the caller writes
 * each subgroup's, once, from src (its n fp32 weights; NULL: zeros) as it makes the weights, a
 * subgroup at a time, before the first step (which refuses while any is missing). */
int mw_offload_master_init(struct mw_offload *e, uint32_t sg, const float *src);
/* Subgroups whose initial master is still to be written (0 after a resume: the record's state). */
uint32_t mw_offload_master_uninit(const struct mw_offload *e);

/* Streaming: starts reading the committed fp32 master weights of subgroup sg (whole) from its
 * NVMe slot into dst, which must be 4096-aligned with room for MW_ALIGN_UP(4 n, 4096) bytes;
 * io is the caller's (filled in by this call), finished with mw_offload_io_wait. Only between
 * steps (the committed slot must not move meanwhile); several fetches may be in flight. Needs
 * the master on NVMe (-EINVAL otherwise). */
int mw_offload_master_fetch(struct mw_offload *e, uint32_t sg, void *dst, struct mw_offload_io *io);

/* Streaming: starts writing the final gradients of subgroup sg (4 n bytes, fp32; src 4096-aligned
 * with room for MW_ALIGN_UP(4 n, 4096) bytes, untouched until done) to its NVMe object; io is the
 * caller's. mw_offload_io_wait finishes it, or a master fetch: it counts the bytes and names the
 * object on a failure (mw_offload_io_test(io) polls). */
int mw_offload_grads_put_start(struct mw_offload *e, uint32_t sg, const void *src, struct mw_offload_io *io);
/* Streaming: whether the next step's gradients stay in the caller's array (ext_grads) instead of
 * going through their NVMe objects: set between steps (no update running), before the step starts.
 * With gradient accumulation every gradient is resident through the step anyway (the stream
 * plan counts them), so writing them out and reading them back is I/O for nothing. The update
 * still drops each subgroup's pages once it has read them. */
void mw_offload_grads_resident(struct mw_offload *e, int on);
int mw_offload_io_wait(struct mw_offload *e, struct mw_offload_io *io);
/* The caller's scratch on NVMe (cfg.scratch_bytes): an async write (write = 1) or read of len
 * bytes at offset (multiples of MW_OFFLOAD_SCRATCH_ALIGN) from or into a 4096-aligned buffer; mw_offload_io_wait
 * ends it. Checksummed like all store I/O; -EINVAL outside the scratch. */
#define MW_OFFLOAD_SCRATCH_ALIGN ((uint64_t)64 << 10) /* scratch writes start on it: the store's checksum block */
int mw_offload_scratch_start(struct mw_offload *e, int write, uint64_t offset, uint64_t len, void *buf,
                             struct mw_offload_io *io);

/* ---------------------------------------------------------------- durable commit record
 *
 * With cfg.journal, every commit (a step, mw_offload_set_committed_steps, or
 * mw_offload_journal_commit) first fdatasyncs the store files, then atomically replaces
 * DIR0/memwall-offload.commit (format: src/offload/journal.c, docs/resume.md) with: the step,
 * the engine and store settings a reopen must match, every object's place in the files, the
 * digest of the committed slot's checksums, and the caller's blob (what it needs to continue,
 * bitwise; at most MW_OFFLOAD_BLOB_MAX bytes). A step whose record cannot be written fails (not
 * committed). From the first record on the store files are kept at free (a crash, or an error,
 * leaves a resumable run) until mw_offload_journal_end says the run finished. */
#define MW_OFFLOAD_RECORD_NAME "memwall-offload.commit"
#define MW_OFFLOAD_BLOB_MAX 65536u

struct mw_offload_record_obj {
    uint32_t sg;                 /* subgroup */
    uint8_t kind, slot;          /* kind 0: optimizer state in slot 0/1; 1: gradients (streamed) */
    uint8_t has_digest;          /* the committed slot's objects */
    uint32_t digest;             /* crc32c of the object's block checksums (mw_store_obj_digest) */
    uint64_t bytes;
};
struct mw_offload_record {
    uint32_t version;
    uint64_t step;               /* committed steps */
    uint64_t total_elems, subgroup_size;
    uint32_t n_subgroups, moments, master_tier, moments_tier, stream, ndirs;
    uint64_t stripe_size, crc_block, capacity;
    char *nvme_dir;              /* the run's "d1:d2" */
    uint32_t nobj;
    struct mw_offload_record_obj *obj; /* [nobj] subgroup by subgroup: slot 0, slot 1 (, gradients) */
    uint64_t *ext_off;           /* [nobj * ndirs] each object's offset in each backing file */
    uint8_t *blob;
    uint32_t blob_len;
};
/* Parses a record (hostile input: lengths and counts checked, crc32c and length verified before
 * any field is used); MW_EFORMAT / MW_ECHECKSUM with a message. Free with _free. */
int mw_offload_record_parse(const void *data, size_t n, struct mw_offload_record *out);
/* Reads DIR/MW_OFFLOAD_RECORD_NAME (DIR: the first of "d1:d2"); -ENOENT when there is none. */
int mw_offload_record_read(const char *dir, struct mw_offload_record *out);
void mw_offload_record_free(struct mw_offload_record *r);
/* The record's path for an NVMe directory list, and the path of backing file i of a record. */
int mw_offload_record_path(const char *nvme_dir, char *buf, size_t n);
int mw_offload_record_file_path(const struct mw_offload_record *r, int i, char *buf, size_t n);

/* The end of a run (docs/resume.md): once its outputs are durable, DIR0/MW_OFFLOAD_DONE_NAME is
 * written with done_text (what a later --resume of the directory prints), then the record and
 * the store files it names are removed, in that order, under the directory's lock. The engine
 * must be freed first (its files are kept while a record exists). */
#define MW_OFFLOAD_DONE_NAME "memwall-run.done"
int mw_offload_run_retire(const char *dirs, const char *done_text);
/* A finished run's directory (done marker, no record): what a retire cut short left behind (its
 * store files in DIR0, a lock file of the killed process) goes. 0 when there is nothing to do. */
int mw_offload_run_tidy(const char *dirs);
/* DIR0's done marker as printable text into buf; -ENOENT (no message) when there is none. */
int mw_offload_run_done_read(const char *dirs, char *buf, size_t n);

/* The blob the next record carries (copied). */
int mw_offload_journal_note(struct mw_offload *e, const void *blob, size_t n);
/* Notes the blob and writes the record of the committed state now (not during a step). */
int mw_offload_journal_commit(struct mw_offload *e, const void *blob, size_t n);
/* The run finished: the record goes now, the store files at mw_offload_free. */
int mw_offload_journal_end(struct mw_offload *e);
/* For a caller whose own account of each step (a log line) must exist before the step counts as
 * committed: records of steps after `step` are held, a step's record written only once a later
 * call allows it (the pipeline thread writes it then, behind the caller's work). The first call
 * starts holding (before it no record waits). Whatever needs a held record (the next step, a
 * change of the committed slot, mw_offload_journal_commit, _end) writes it first; mw_offload_free
 * drops it: the record of the step before stays, and a resume runs the step again. A failed
 * record is told by what waits for it next, as without holding. */
void mw_offload_journal_allow(struct mw_offload *e, uint64_t step);

/* Testing: the k-th NVMe write from now (k >= 1) fails with -EIO after writing half its bytes
 * (a torn write); 0 disarms. */
void mw_offload_inject_write_failure(struct mw_offload *e, uint64_t k);

#ifdef __cplusplus
}
#endif
#endif
