/*
 * optimizer_step.h — the trainer's one door to the optimizer (internal).
 * Why an interface and not a direct call: today AdamW runs over fp32 moments in DRAM through
 * optim.h's kernel; when the offload engine lands it will own the state (DRAM or NVMe
 * subgroups, streamed while backward runs), and only this file pair changes. The trainer asks
 * for four things: step, state bytes per tier, and streaming the state into and out of a
 * checkpoint.
 */
#ifndef MEMWALL_TRAIN_OPTIMIZER_STEP_H
#define MEMWALL_TRAIN_OPTIMIZER_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/gpt2.h"
#include "memwall/train.h"

struct mw_train_opt_range {
    size_t first, n;       /* elements of the flat parameter array */
    double weight_decay;   /* decay for this range (2-D tensors: cfg.weight_decay, else 0) */
};

struct mw_train_opt {
    enum mw_opt_tier tier;
    size_t n_params;
    float *m, *v;                      /* [n_params] fp32 AdamW moments (DRAM tier) */
    struct mw_train_opt_range *ranges; /* contiguous runs of tensors with one decay */
    int nranges;
    double beta1, beta2, eps;
    int threads;
    int err;                           /* first error of a grad_ready callback, or 0 */
};

/* Sizes and allocates the state for model m (zeroed moments). MW_OPT_TIER_NVME: -ENOTSUP
 * until the offload engine lands. */
int mw_train_opt_init(struct mw_train_opt *o, const struct mw_gpt2 *m, const struct mw_train_config *c);
void mw_train_opt_free(struct mw_train_opt *o);

/* The backward pass of each micro-batch is bracketed, so that an engine that updates
 * subgroups while backward still runs (the offload engine: mw_offload_backward_begin /
 * grad_ready / backward_end) can hook in; with the state in DRAM all three do nothing.
 * last: the optimizer step follows this micro-batch. mw_train_opt_grad_ready has the model's
 * mw_gpt2_grad_ready_fn signature (user = the struct mw_train_opt); it cannot return an error,
 * so one is kept and returned by mw_train_opt_backward_end. */
int mw_train_opt_backward_begin(struct mw_train_opt *o, int last);
void mw_train_opt_grad_ready(size_t first_elem, size_t n_elems, void *user);
int mw_train_opt_backward_end(struct mw_train_opt *o);

/* Global L2 norm of the accumulated gradients (for clipping); MW_EOVERFLOW when one is
 * inf/NaN (then the step is skipped). */
int mw_train_opt_grad_norm(struct mw_train_opt *o, const float *grads, double *norm);

/* One AdamW step t (1-based) on params with grads multiplied by grad_scale first. */
int mw_train_opt_step(struct mw_train_opt *o, float *params, const float *grads, double lr,
                      float grad_scale, int64_t t);

/* State bytes on each tier. */
void mw_train_opt_bytes(const struct mw_train_opt *o, uint64_t *dram, uint64_t *nvme);

/* Streams the state out (save) or in (load) in pieces through fn; fn returns 0 or an error
 * code, which is passed back. Total bytes: mw_train_opt_state_bytes. */
typedef int (*mw_train_io_fn)(void *user, void *buf, size_t n);
uint64_t mw_train_opt_state_bytes(const struct mw_train_opt *o);
int mw_train_opt_save(const struct mw_train_opt *o, mw_train_io_fn write, void *user);
int mw_train_opt_load(struct mw_train_opt *o, mw_train_io_fn read, void *user);

#endif
