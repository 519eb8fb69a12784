/*
 * optimizer_step.h — the trainer's one door to the optimizer (internal).
 * Why an interface: the offload engine (memwall/offload.h) owns the AdamW state — in DRAM, or
 * cut into subgroups on NVMe and streamed through staging buffers — and the trainer only asks
 * for a few things: bracket each backward pass, the gradient norm, the step, bytes per tier,
 * and streaming the state into and out of a checkpoint. Both tiers go through the engine, so
 * `--optimizer-tier dram` and `nvme` run the same kernel on the same bytes: bitwise the same
 * losses.
 */
#ifndef MEMWALL_TRAIN_OPTIMIZER_STEP_H
#define MEMWALL_TRAIN_OPTIMIZER_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/model.h"
#include "memwall/offload.h"
#include "memwall/train.h"
#include "memwall/optim.h"

struct mw_train_opt {
    enum mw_tier_id tier;
    uint64_t own_first;                /* first element of the model this optimizer owns (ZeRO) */
    size_t n_params;                   /* elements it owns (all of the model without ZeRO) */
    struct mw_offload_registry reg;    /* the model's tensors, in its flat order */
    struct mw_offload_config cfg;      /* ext_weights = model params, ext_grads = model grads */
    struct mw_offload_plan plan;       /* sized at init, before anything is allocated */
    struct mw_offload *eng;            /* created at first use, from the weights of that moment */
    float *params;                     /* the model's flat fp32 weights from own_first (the working copy) */
    double beta1, beta2, eps, weight_decay;
    int err;                           /* first error of a grad_ready callback, or 0 */
};

/* Builds the registry (1-D tensors: no decay), the engine config from c (tier, nvme_dir,
 * subgroup size, buffers, policy, budgets, trace) and its plan: a tier that does not fit is
 * refused here (MW_EBUDGET, message with the numbers). model_dram_bytes: the model's own DRAM
 * (params + grads + activations), charged against c->dram_budget first. The engine itself is
 * created at the first backward pass or checkpoint load, so weights loaded after init (from a
 * safetensors file) become its master copy. ZeRO: the optimizer holds only elements
 * [own_first, own_first + own_n) of the model (own_n = 0: all); tensors cut by the range are
 * registered as 1-D pieces "name[a:b]" with their decay flag. */
int mw_train_opt_init(struct mw_train_opt *o, struct mw_net *m, const struct mw_train_config *c,
                      uint64_t model_dram_bytes, uint64_t own_first, uint64_t own_n);
void mw_train_opt_free(struct mw_train_opt *o);
/* The plan alone (memwall plan --stream): nothing is created; a missing NVMe directory is not
 * made (its free space is then not checked). */
int mw_train_opt_plan_only(struct mw_train_opt *o, struct mw_net *m, const struct mw_train_config *c);

/* The backward pass of each micro-batch is bracketed (mw_offload_backward_begin / grad_ready /
 * backward_end). last: the optimizer step follows this micro-batch. mw_train_opt_grad_ready
 * has the model's mw_net_grad_ready_fn signature (user = the struct mw_train_opt); it cannot
 * return an error, so one is kept and returned by mw_train_opt_backward_end. */
int mw_train_opt_backward_begin(struct mw_train_opt *o, int last);
void mw_train_opt_grad_ready(size_t first_elem, size_t n_elems, void *user);
int mw_train_opt_backward_end(struct mw_train_opt *o);

/* Global L2 norm of the accumulated gradients (for clipping); MW_EOVERFLOW when one is
 * inf/NaN (then call mw_train_opt_skip). */
int mw_train_opt_grad_norm(struct mw_train_opt *o, double *norm);

/* AdamW step t (1-based) with grads multiplied by grad_scale first; the refreshed weights are
 * in the model's params afterwards. */
int mw_train_opt_step(struct mw_train_opt *o, double lr, float grad_scale, int64_t t);
/* The same, overlapped with what follows (the next forward pass): the step runs on the engine's
 * threads; mw_train_opt_wait_range says (block: waits until) the weights of model elements
 * [first, first+n) are updated in the working copy (1 yes, 0 not yet, < 0 the step failed; their
 * NVMe writes may still run: a failed one fails the step at finish); mw_train_opt_finish
 * waits for the whole step and commits it (0 when none is in flight; on failure the state of
 * the step before is intact and the engine is ready to retry). */
int mw_train_opt_step_start(struct mw_train_opt *o, double lr, float grad_scale, int64_t t);
int mw_train_opt_wait_range(struct mw_train_opt *o, uint64_t first, uint64_t n, int block);
int mw_train_opt_finish(struct mw_train_opt *o);
int mw_train_opt_in_flight(const struct mw_train_opt *o);
/* Step t is skipped (inf/NaN gradients): drop them, and count t as done for bias correction. */
int mw_train_opt_skip(struct mw_train_opt *o, int64_t t);

/* Engine bytes on each tier (the plan), and the engine's counters since init. */
void mw_train_opt_bytes(const struct mw_train_opt *o, uint64_t *dram, uint64_t *nvme);
void mw_train_opt_stats(const struct mw_train_opt *o, struct mw_offload_stats *s);

/* Streams the state out (save) or in (load) in pieces through fn; fn returns 0 or an error
 * code, which is passed back. Total bytes: mw_train_opt_state_bytes (exp_avg then exp_avg_sq,
 * fp32: the same file for every tier). load: the model's params must already hold the saved
 * weights (they become the master copy); step = the AdamW steps done. */
typedef int (*mw_train_io_fn)(void *user, void *buf, size_t n);
uint64_t mw_train_opt_state_bytes(const struct mw_train_opt *o);
int mw_train_opt_save(const struct mw_train_opt *o, mw_train_io_fn write, void *user);
int mw_train_opt_load(struct mw_train_opt *o, mw_train_io_fn read, void *user, int64_t step);
/* Creates the engine now (streamed weights: before the first forward pass). */
int mw_train_opt_ensure(struct mw_train_opt *o);
/* Streamed weights: the master of [first, first+n) (whole-model elements; the part in this rank's
 * shard is kept) from a checkpoint, with `step` steps done
 * (mw_train_opt_load then restores the moments and skips the master). */
int mw_train_opt_load_master(struct mw_train_opt *o, uint64_t first, uint64_t n, const float *src, int64_t step);

#endif
