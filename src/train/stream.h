/*
 * stream.h — weights and gradients streamed from NVMe (internal; residency.h's "nvme").
 *
 * Why this shape: the fp32 master weights already live on NVMe in the offload engine's
 * subgroup objects, and they ARE the weights when the model computes in fp32, so a unit is
 * fetched straight from the committed master (no second copy on disk, nothing written back
 * after the update). The model's params and grads stay one flat page-aligned array each (its
 * code is unchanged), but only some pages are resident: the subgroups (page-aligned ranges of
 * the flat space) of the units in use or fetched ahead. A subgroup holds a reference per unit
 * that acquired it; at zero its pages go back to the OS (MADV_DONTNEED), unless one of the next
 * units of the schedule needs it. Gradients: at the last micro-step, once backward has passed a
 * subgroup's lowest element (it reports units in reverse flat order), the subgroup's gradients
 * are final: their squares are summed per fixed 2^20-element chunk (the engine's norm order, so
 * the norm is bitwise the resident one), they are written to the subgroup's gradient object and
 * the pages are dropped (a subgroup waits for the chunk it starts in; reading back as the zeros the next step accumulates into). The update
 * reads them back beside the state and drops them again (the engine does both). After a step the
 * weight pages still resident are stale: they go (st_after_step), and the next use fetches anew.
 *
 * Why a page pool: a dropped page comes back zeroed by the kernel at its next fault, and the read
 * that faults it in overwrites every byte: streaming a 0.5 B model with 8 micro-batches zeroed about
 * 30 GiB a step, a sixth of the process's CPU on 2 cores (perf: clear_page_erms under the O_DIRECT
 * read's get_user_pages). A released subgroup that a fetch of the next units will replace keeps its
 * pages instead: mremap moves them (page tables, no copy, no zeroing) to a pool slot, and the fetch
 * moves them into its own range before the read. The pool holds no more subgroups than the units
 * about to be fetched need, so the resident weights stay what the plan counts.
 *
 * Why a handoff: the update of step t runs behind the forward of step t+1, unit by unit, and the
 * forward needs each unit's updated weights. Reading them back from the master once its write has
 * landed put a write and a read on the forward's path for every subgroup, and 4 bytes a parameter
 * more on a disk the update already loads with 24 (without accumulation the step is bound by NVMe:
 * 8-9 s at Qwen2.5-0.5B, 2-4 s of it fetch waits). A fetch of a subgroup whose update has not run
 * yet asks the engine to copy the new master into its pages instead (mw_offload_master_handoff:
 * the kernel writes it as it goes); the read stays for the rest (the backward's fetches, an update
 * already being written).
 */
#ifndef MEMWALL_TRAIN_STREAM_H
#define MEMWALL_TRAIN_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/model.h"
#include "memwall/plan.h"
#include "memwall/offload.h"
#include "train/units.h"

struct mw_trace;
struct mw_train_opt;
struct mw_offload;
struct mw_train_zero;


struct mw_train_stream {
    struct mw_net *model;         /* borrowed */
    struct mw_train_opt *opt;     /* borrowed: its engine holds the master and the gradient objects */
    struct mw_trace *trace;       /* optional */
    struct mw_train_zero *zero;   /* data parallel (borrowed; NULL on one rank): its collectives */
    int gather;                   /* ZeRO stages 1-3: this rank's engine holds its shard only; a unit's
                                     other parts are all-gathered from their owners after the fetch */
    uint32_t sg0, sg_end;         /* subgroups in this rank's engine: [sg0, sg_end); engine index g - sg0 */
    uint64_t norm_first, norm_n;  /* elements whose gradient norm this rank sums, in chunks from norm_first */
    int saving;                   /* between save_begin and save_end with gather: every unit is held */
    uint64_t seed;                /* initial weights (unit by unit, at engine init) ... */
    void *init;                    /* ... or from this file (owned; closed once the engine has them) */
    int n_units;
    struct mw_units units;        /* the residency machine (units.h) with this as its source "nvme";
                                     its depth: units fetched ahead of use */
    size_t *u_first, *u_n;        /* [n_units] element ranges */
    uint32_t *u_lo, *u_hi;        /* [n_units] subgroups a unit overlaps (inclusive) */
    unsigned char *u_init;        /* [n_units] initial weights written (engine init) */
    uint64_t sg_size;             /* elements per subgroup (whole pages of fp32) */
    uint32_t nsg;
    int *sg_ref;                  /* [nsg] units holding it */
    unsigned char *sg_state;      /* [nsg] enum mw_unit_state of its weights */
    unsigned char *sg_hand;       /* [nsg] FETCHING by a handoff from the update, not a read */
    int handoff;                  /* handoffs on (MEMWALL_STREAM_HANDOFF=0: off) */
    int *sg_unit;                 /* [nsg] the unit whose acquire/prefetch fetched it (trace) */
    struct mw_offload_io *sg_io;    /* [nsg] fetch in flight */
    uint64_t *sg_t0;              /* [nsg] fetch start, ns */
    unsigned char *sg_gdone;      /* [nsg] gradients final and their write started this step */
    unsigned char *gw_pending;    /* [nsg] that write still in flight (pages kept until done) */
    struct mw_offload_io *gw_io;    /* [nsg] */
    uint64_t *gw_t0;              /* [nsg] ns */
    int *gw_unit;                 /* [nsg] the unit whose gradients completed it (trace) */
    uint64_t *u_t0;               /* [n_units] became usable, ns (resident spans) */
    double *chunk_sumsq;          /* [nchunks] sums of squares of the step's final gradients */
    unsigned char *chunk_done;    /* [nchunks] */
    uint64_t nchunks;
    int last, step;
    int layer_major;              /* the schedule's backward order (set by the trainer) */
    int prefetch_next_micro;      /* cfg.prefetch_next_micro (set by the trainer) */
    int grads_kept;               /* this step's final gradients stay in DRAM for the update (batch-major
                                     with accumulation: they were all resident anyway), not written */
    int keep_grads;               /* cfg.keep_grads: so at every step (set by the trainer) */
    int keep_tied;                /* cfg.keep_tied: a unit the forward uses again stays resident till then */
    int grads_clean;              /* the update zeroes every gradient in place (engine's grads_dram) ... */
    uint64_t clean_at;            /* ... once the engine has committed this many steps */
    uint64_t begun_at;            /* the engine's committed steps at the last step_begin */
    int err;                      /* first error of a grad-ready callback */
    size_t page;
    struct mw_plan_stream plan;   /* the planned DRAM peak (src/plan/stream.c) */
    /* measured */
    uint64_t resident_now, resident_peak;   /* weight bytes resident (subgroups), peak */
    uint64_t fetch_bytes, grad_write_bytes; /* since init */
    uint64_t handoff_bytes;                 /* weights taken from the update instead of read, since init */
    uint64_t wait_ns;                       /* training thread blocked on fetches */
    /* The page pool (stream.c, "the page pool"): pages of released subgroups moved (mremap) to
     * the fetches that follow, so that a read lands in pages the kernel need not zero first. */
    char *pool;                   /* pool_slots slots of sg_size * 4 bytes, 2 MiB-aligned; NULL: off */
    void *pool_map;               /* the reservation (munmap) */
    size_t pool_map_bytes;
    uint32_t pool_slots, pool_nfull, pool_nempty;
    uint32_t *pool_full, *pool_empty; /* stacks of slot indices: with pages / without */
    uint64_t pool_moves;          /* subgroups whose fetch took pooled pages */
};

/* Builds the stream over the model and the optimizer (whose plan fixed the subgroups: whole
 * pages of fp32, or one subgroup for the whole model). The optimizer covers the whole model,
 * or under ZeRO stages 1-3 (zero given) exactly the rank's shard. depth: units read ahead
 * (0..8). Nothing is fetched yet. */
int mw_train_stream_init(struct mw_train_stream *s, struct mw_net *m, struct mw_train_opt *opt, int depth,
                         uint64_t seed, struct mw_train_zero *zero, struct mw_trace *trace);
/* After the engine wrote the initial master: no weight page stays resident (the initial weights
 * of units that reach outside this rank's shard were written whole). */
int mw_train_stream_ready(struct mw_train_stream *s);
void mw_train_stream_free(struct mw_train_stream *s);
/* Part of a unit in use is done with before the unit's release (a vocabulary-sized head's backward,
 * chunk by chunk): the subgroups wholly inside elements [first, first+n) of unit u that u alone holds
 * and that the next units do not need go now (pool or OS), as its release would send them; the
 * release then skips them. now: those the next units need go too, to the OS (the next use fetches
 * them again, and waits for it). Advice: what it cannot drop stays until the release. 0 or an error. */
int mw_train_stream_trim(struct mw_train_stream *s, int u, uint64_t first, uint64_t n, int now);

#endif
