/*
 * acts.h — the blocks' activations of a layer-major step kept on NVMe (internal;
 * `--offload-activations nvme`, docs/train.md).
 *
 * Why: the layer-major schedule runs a block over every micro-batch before the next block, so
 * backward meets block l's micro-batches only after all later blocks. Keeping their
 * activations in DRAM would cost L x micro-batches of them; recomputing them costs one more
 * forward pass of every block (a third more compute on the CPU, where compute is the bound).
 * The disk is idle most of a step, so each block's activations (with its input) are written to
 * NVMe as soon as its forward is done and read back, a few ahead, in backward's order. Two DRAM
 * slots are enough when a block's compute outlasts the I/O of its slot (the plan counts them).
 */
#ifndef MEMWALL_TRAIN_ACTS_H
#define MEMWALL_TRAIN_ACTS_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/offload.h"

struct mw_offload;
struct mw_trace;

#define MW_TRAIN_ACT_SLOTS 2 /* DRAM slots (mw_net_act_slot_bytes each) */

struct mw_train_act_slot {
    int64_t tag;                 /* layer * nmb + micro-batch held, -1 none */
    int valid;                   /* the buffer holds tag's activations */
    int busy;                    /* the model is filling or reading it */
    int io;                      /* 0 none, 1 write, 2 read in flight */
    uint64_t t0;                 /* that I/O's start, ns */
    struct mw_offload_io req;
};

struct mw_train_acts {
    struct mw_offload *eng;      /* borrowed: its scratch object holds the slots' copies */
    struct mw_trace *trace;      /* optional */
    int L, nmb, nslots;
    size_t slot_bytes;           /* mw_train_acts_slot_bytes */
    float *mem;                  /* [nslots][slot_bytes / 4], one mapping */
    struct mw_train_act_slot slot[MW_TRAIN_ACT_SLOTS];
    int in_backward;
    int64_t bwd_pos;             /* backward entries done this step */
    int step;                    /* for the trace */
    uint64_t write_bytes, read_bytes, wait_ns; /* totals */
};

/* A slot's bytes for the model's mw_net_act_slot_bytes: whole checksum blocks of the store
 * (MW_OFFLOAD_SCRATCH_ALIGN), what the plan counts per slot. */
size_t mw_train_acts_slot_bytes(size_t model_slot_bytes);
/* NVMe bytes the scratch needs for L blocks x nmb micro-batches of the model's slot. */
uint64_t mw_train_acts_scratch_bytes(int L, int nmb, size_t model_slot_bytes);
int mw_train_acts_init(struct mw_train_acts *a, int L, int nmb, size_t model_slot_bytes, struct mw_trace *trace);
void mw_train_acts_free(struct mw_train_acts *a); /* waits for I/O in flight */
/* The model's calls->acts (user = the struct mw_train_acts; eng set before the first step). */
int mw_train_acts_call(void *user, int event, int layer, int mb, float **buf);

#endif
