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
 * or NVMe branches: a factory (residency.c, mw_residency_open/attach) builds the machine from the
 * resolved configuration, and the trainer calls it.
 *
 * Two axes: a unit's bytes come from a source, its gradients leave through a reduction.
 *   source  dram    everything resident: the hooks do nothing (residency.c "resident").
 *           peers   ZeRO-3: a unit is all-gathered before use and released after (zero.c).
 *           nvme    the optimizer's fp32 master on NVMe, fetched ahead of use; finished gradients
 *                   written to NVMe and read back by the update (stream.c).
 *   reduction none (one rank), allreduce (ZeRO-0), reduce-scatter to the owner (ZeRO-1..3).
 * peers and nvme are one state machine (units.h: issue, wait, release, prefetch depth) with two
 * source tables; the reduction is zero.c's, which the nvme source calls when there are ranks.
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

struct mw_train_zero;
struct mw_train_stream;
struct mw_train_acts;
struct mw_train_opt;
struct mw_plan_stream;

/* What the factory built; the trainer goes through ops and the calls below, nothing else. */
struct mw_residency {
    const struct mw_residency_ops *ops;
    void *self;
    const char *source;              /* "dram", "peers", "nvme" */
    const char *reduction;           /* "none", "allreduce", "reduce-scatter" */
    struct mw_train_zero *zero;      /* the reduction over the ranks (zero.c); NULL on one rank */
    struct mw_train_stream *stream;  /* the source "nvme" (stream.c); NULL when weights stay in DRAM */
    struct mw_train_acts *acts;      /* block activations on NVMe (acts.c); NULL otherwise */
    uint64_t subgroup_size;          /* the subgroups ZeRO shards by (0: the optimizer's choice) */
};

/* The factory, in two halves around the optimizer's construction. open: checks the placement,
 * builds the model (tr->model; initial weights unless streamed) and the reduction, and says what
 * the optimizer covers (this rank's shard) and with what configuration. attach: with the
 * optimizer built, the source (NVMe: stream, DRAM plan against the budget, initial weights into
 * the engine, activations' slots) and the model's unit hook. Both 0 or an error with the message
 * set; mw_residency_close(tr, 0) then (tr, 1) around freeing the optimizer undoes them. */
struct mw_residency_shape {
    struct mw_train_config opt_cfg;  /* the optimizer's configuration */
    uint64_t own_first, own_n;       /* its part of the flat parameter space (0, 0: all of it) */
    uint64_t model_dram;             /* DRAM the model's arrays keep beside it, bytes */
};
int mw_residency_open(struct mw_trainer *tr, const struct mw_net_config *mcfg, struct mw_residency_shape *out);
int mw_residency_attach(struct mw_trainer *tr);
void mw_residency_close(struct mw_trainer *tr, int phase);

/* Around a step: the step number for traces, the communication figures of the step. */
void mw_residency_step_begin(struct mw_residency *r, int64_t step);
int mw_residency_step_end(struct mw_residency *r, struct mw_train_step_stats *st);
/* The mean of v / the largest v over the ranks (collectives under data parallelism). */
int mw_residency_mean(struct mw_residency *r, float *v);
int mw_residency_max_u64(struct mw_residency *r, uint64_t v, uint64_t *max);
int mw_residency_info(struct mw_residency *r, struct mw_train_residency_info *ri, int collective);
/* The streamed run's DRAM plan (the trainer's and memwall plan --stream's). */
int mw_residency_stream_plan(const struct mw_net *m, const struct mw_train_opt *o, const struct mw_train_config *cfg,
                             const struct mw_train_zero *z, struct mw_plan_stream *out);

/* The NVMe source's ops (stream.c). */
void mw_residency_stream(struct mw_residency *r, struct mw_train_stream *s);

#endif
