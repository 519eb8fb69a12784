/*
 * residency.h — where each weight unit's weights and gradients live between uses (internal).
 *
 * Why one interface: the trainer's loop is the same whether the whole model sits in DRAM, a
 * ZeRO-3 rank gathers each unit from its peers before use, or the units stream from NVMe (and,
 * later, into a device's memory). The model already works in weight units (embeddings, each
 * block, the final norm; memwall/gpt2.h) and calls a hook around every use of one; this table is
 * what sits behind that hook, plus the few other moments where the placement matters: zeroing
 * the gradients, a unit's gradients becoming final, the gradient norm, the end of the step, and
 * reading the whole model out (checkpoint, safetensors). The trainer and the CLI carry no ZeRO
 * or NVMe branches: they call these.
 *
 *   resident  everything in DRAM: the hooks do nothing, gradients go to the optimizer.
 *   zero      data parallel (src/train/zero.c): per-unit collectives as gradients finish;
 *             ZeRO-3 gathers a unit before use and releases it after (enum mw_unit_state).
 *   stream    weights and gradients on NVMe (src/train/stream.c): a unit is fetched from the
 *             optimizer's fp32 master ahead of use (prefetch depth), released after; finished
 *             gradients are written to NVMe and read back by the update.
 */
#ifndef MEMWALL_TRAIN_RESIDENCY_H
#define MEMWALL_TRAIN_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/model.h"
#include "memwall/train.h"

/* The state of one weight unit (or piece of one) in DRAM. */
enum mw_unit_state {
    MW_UNIT_RELEASED = 0,  /* not in DRAM (pages returned to the OS) */
    MW_UNIT_FETCHING = 1,  /* a gather / NVMe read into DRAM is in flight */
    MW_UNIT_RESIDENT = 2,  /* usable */
};

struct mw_residency_ops {
    const char *name;                                           /* "resident", "zero", "nvme" */
    /* The model's unit hook (mw_net_weights_fn): acquire/release around each use. */
    int (*weights)(void *self, int event, int unit, int backward);
    /* Before a forward pass (training: a backward pass follows). */
    int (*pass_begin)(void *self, int training);
    /* At the start of a step: the gradients become zero. */
    int (*step_begin)(void *self);
    /* Around each micro-step's backward pass; grad_ready is the model's callback. */
    int (*backward_begin)(void *self, int micro, int last);
    void (*grad_ready)(size_t first, size_t n, void *self);
    int (*backward_end)(void *self);
    /* Global L2 norm of the step's gradients (MW_EOVERFLOW when not finite). */
    int (*grad_norm)(void *self, double *norm);
    /* After the optimizer step (e.g. ZeRO-1/2 all-gather the new weights). */
    int (*after_step)(void *self);
    /* Reading the whole model out: save_begin, then unit_get/unit_put around each unit (in
     * order 0..n_units-1; the unit is in the model's params between them), then save_end.
     * Collective under ZeRO-3 (every rank calls it). */
    int (*save_begin)(void *self);
    int (*unit_get)(void *self, int unit);
    int (*unit_put)(void *self, int unit);
    int (*save_end)(void *self);
    /* DRAM bytes of the weights and gradients at their peak (plan) for the progress line. */
    void (*bytes)(void *self, uint64_t *params, uint64_t *grads);
};

struct mw_residency {
    const struct mw_residency_ops *ops;
    void *self;
};

/* The three implementations; each returns 0 or an error with the message set. */
struct mw_train_opt;
struct mw_train_zero;
struct mw_train_stream;
void mw_residency_resident(struct mw_residency *r, struct mw_trainer *tr);
void mw_residency_zero(struct mw_residency *r, struct mw_trainer *tr);
void mw_residency_stream(struct mw_residency *r, struct mw_train_stream *s);

#endif
