/*
 * zero.h — data parallelism with ZeRO stages 0-3 inside the trainer (internal).
 * Why a separate part: the trainer's loop stays the same for one rank and for N; this part
 * owns what changes with N: which subgroups of the flat parameter space this rank owns
 * (mw_zero_shard), the collectives issued per bucket (one bucket = one weight unit of the
 * model, reported by the backward pass as it finishes), the ZeRO-3 gather/prefetch/release of
 * weight units around their use, and the small exchanges (loss, gradient norm). All of it
 * runs on the training thread (MPI is FUNNELED). docs/mpi.md has the per-stage schedule.
 *
 *   stage 0  allreduce (average) of each bucket at the last micro-step; update everything.
 *   stage 1  local accumulation; reduce-scatter each bucket to its owner at the last
 *            micro-step; update the owned subgroups; allgather the new weights per unit.
 *   stage 2  reduce-scatter every micro-step into an owned accumulator; else as stage 1.
 *   stage 3  as stage 2, and the weights outside the owned range are released (their pages
 *            returned to the OS): each unit is all-gathered before use, the next one is
 *            prefetched, and it is released after use. No allgather after the update.
 *            Batch-major or layer-major: the schedule's unit order (mw_plan_stream_unit).
 * Hierarchy "node": SHARD = the node's ranks, and each owner averages its gradient shard over
 * REPLICA (the same shard on the other nodes) before the update.
 */
#ifndef MEMWALL_TRAIN_ZERO_H
#define MEMWALL_TRAIN_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/comm.h"
#include "memwall/model.h"
#include "train/units.h"

struct mw_trace;

#define MW_ZERO_MAX_REQS 4096
/* Stages 2-3: gradient buckets (units) whose reduce-scatter may be in flight at once; an older
 * one is waited for, so a rank holds its owned gradients plus about this many units. */
#define MW_ZERO_GRAD_WINDOW 2

struct mw_train_zero {
    struct mw_comm *comm;      /* borrowed */
    struct mw_net *model;      /* borrowed */
    struct mw_trace *trace;    /* optional */
    int stage;                 /* 0..3 */
    int world, wrank;          /* WORLD size and rank */
    int nshard, srank;         /* SHARD group size and rank */
    int nrep;                  /* REPLICA group size (1 unless hierarchy node) */
    uint64_t total;            /* elements of the flat parameter space */
    uint64_t sg_size;          /* elements per subgroup (the engine's) */
    struct mw_zero_shard own;  /* this rank's subgroups and elements (stage 0: everything) */
    int n_units;               /* model weight units (= gradient buckets) */
    size_t *u_first, *u_n;     /* [n_units] element ranges */
    size_t *u_counts;          /* [n_units * nshard] elements of unit u owned by each shard rank */
    size_t *u_displs;          /* [n_units * nshard] where they start inside the unit */
    float *recv;               /* [own.n] reduce-scatter receive buffer (stages 1-3) */
    float *acc;                /* [own.n] gradient accumulator across micro-steps (stages 2-3) */
    struct mw_comm_req *reqs[MW_ZERO_MAX_REQS]; /* gradient collectives of this micro-step */
    int req_unit[MW_ZERO_MAX_REQS];             /* the unit of each (its gradients are released when done) */
    int n_reqs;
    int micro, last;           /* micro-step index in the step, last micro-step of the step */
    int err;                   /* first error of a grad-ready callback */
    /* ZeRO-3 residency of the weights. */
    unsigned char *u_state;    /* [n_units] 0 released, 1 gathering, 2 resident */
    struct mw_comm_req **u_req;/* [n_units] gather in flight */
    int started;               /* non-owned weights released since the last full write */
    struct mw_units units;     /* ZeRO-3: the residency machine (units.h) with this as its source "peers" */
    size_t page;               /* bytes per page */
    size_t map_bytes;          /* the params allocation, whole pages */
    unsigned char *mvec;       /* mincore vector */
    uint64_t resident_now, resident_peak; /* bytes of the weight array resident (mincore), peak since reset */
    uint64_t released_bytes;   /* bytes returned to the OS by releases (counter) */
    uint64_t grads_resident_now, grads_resident_peak; /* stages 2-3: the gradient array (mincore), bytes */
};

/* Builds the shard and buckets; stage 0..3; sg_size the engine's subgroup size. Fails with a
 * message when a shard rank would own nothing (subgroups larger than total / ranks). */
int mw_train_zero_init(struct mw_train_zero *z, struct mw_comm *comm, int stage, struct mw_net *m,
                       uint64_t sg_size, struct mw_trace *trace);
void mw_train_zero_free(struct mw_train_zero *z);

/* Subgroup size that gives every one of `ranks` at least 4 subgroups, a multiple of 4096
 * elements (whole pages of fp32), at most `want`. */
uint64_t mw_train_zero_sg_size(uint64_t total, int ranks, uint64_t want);

/* At the start of a step, instead of zeroing the model's gradients: stages 2-3 keep only the
 * owned range of the gradient array resident (the rest is returned to the OS, which reads back
 * as zeros), others zero it all. */
void mw_train_zero_step_begin(struct mw_train_zero *z);
/* Before a micro-step's backward (micro = index in the step, last = the step follows). */
void mw_train_zero_backward_begin(struct mw_train_zero *z, int micro, int last);
/* The model's grad-ready callback (user = z): issues the bucket's collective. */
void mw_train_zero_grad_ready(size_t first, size_t n, void *user);
/* After backward: waits for the bucket collectives and leaves this micro-step's reduced
 * gradients where the optimizer reads them (the owned range of the model's grads at the last
 * micro-step). */
int mw_train_zero_backward_end(struct mw_train_zero *z);

/* Global squared L2 norm from each shard rank's local sum of squares of its owned gradients
 * (summed in rank order: the same bits on every rank). Non-finite when any rank's is. */
int mw_train_zero_sumsq(struct mw_train_zero *z, double local, double *global);
/* Local sum of squares of the owned gradients (fp32, fixed chunks). */
int mw_train_zero_local_sumsq(struct mw_train_zero *z, double *out);
/* Average of v over all ranks (loss). */
int mw_train_zero_mean(struct mw_train_zero *z, float *v);
/* After the optimizer step: stages 1-2 all-gather the refreshed weights. */
int mw_train_zero_after_step(struct mw_train_zero *z);

/* ZeRO-3: the model's weights hook (install with m->weights_hook / weights_user = z). */
int mw_train_zero_weights_hook(void *user, int event, int unit, int backward);
/* ZeRO-3: before a pass (training: a backward follows; layer_major: the step runs layer-major,
 * the model's layer-major step, else batch-major). The gathers follow the order the model acquires
 * the units in, the one the streamed path and the planner walk (mw_plan_stream_unit). Releases
 * the non-owned weights the first time after they were written whole (init, load). */
int mw_train_zero_pass_begin(struct mw_train_zero *z, int training, int layer_major);
/* ZeRO-3: gather every unit (checkpoint, safetensors) / release them again. */
int mw_train_zero_gather_all(struct mw_train_zero *z);
int mw_train_zero_release_all(struct mw_train_zero *z);
/* Stages 1-3 with streamed weights (src/train/stream.c): this rank's owned part of unit u is in
 * the model's params (read from NVMe); all-gather the rest of the unit in place and wait. */
int mw_train_zero_unit_gather(struct mw_train_zero *z, int u);
/* ZeRO-3: the peak is reset (e.g. after the first step). */
void mw_train_zero_reset_peak(struct mw_train_zero *z);

/* Max over ranks of a uint64 (e.g. peak resident bytes), via an allgather. */
int mw_train_zero_max_u64(struct mw_train_zero *z, uint64_t v, uint64_t *max);
int mw_train_zero_sum_u64(struct mw_train_zero *z, uint64_t v, uint64_t *sum);

#endif
