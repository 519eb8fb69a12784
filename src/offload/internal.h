/*
 * internal.h — what the offload engine's files share: the per-subgroup state layout, the
 * engine struct, the accelerator (device.h) and the pipeline entry points.
 *
 * Layout of one subgroup's optimizer state (host staging buffers and NVMe objects alike):
 * five regions, each padded to 4 KiB so that every region can be moved with O_DIRECT:
 *   [master fp32][m][m_scale][v][v_scale]   (the scale regions are empty unless moments are 8-bit)
 * A region of a kind placed in DRAM lives in a flat array over the whole parameter space
 * instead (pointer arithmetic by element), so a DRAM-resident state is one array, as the
 * model's own arrays are.
 */
#ifndef MEMWALL_OFFLOAD_INTERNAL_H
#define MEMWALL_OFFLOAD_INTERNAL_H

#include "memwall/offload.h"
#include "memwall/optim.h"
#include "memwall/store.h"
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "offload/cost.h"
#include "offload/device.h"

#include <pthread.h>
#include <stdatomic.h>

#define OFL_PAD ((uint64_t)4096)
#define OFL_FILE_PREFIX "memwall-offload" /* DIR/memwall-offload.<i>.dat, the store's backing files */

enum ofl_region { OFL_R_MASTER = 0, OFL_R_M, OFL_R_MSCALE, OFL_R_V, OFL_R_VSCALE, OFL_NREGIONS };

/* The optimizer's state regions, described once (placement.c): the engine lays them out, places,
 * moves, views and labels them from this table, not by their names. AdamW's: the fp32 master,
 * the two moments in the moment format, and the moments' block scales (8-bit moments only). */
enum ofl_elem {
    OFL_ELEM_FP32 = 0,  /* 4 bytes per element */
    OFL_ELEM_MOMENT,    /* the moment format's bytes per element (mw_optim_array_bytes) */
    OFL_ELEM_SCALE,     /* 4 bytes per MW_Q8_BLOCK elements with 8-bit moments; else empty */
};
struct ofl_region_desc {
    const char *label;          /* the tier accounting's name ("master", "exp_avg", ...) */
    enum mw_offload_kind kind;  /* the kind whose tier it follows */
    enum ofl_elem elem;         /* its bytes per element */
};
extern const struct ofl_region_desc ofl_regions[OFL_NREGIONS];
/* The region's array in a slice view (the one place that maps regions to the kernel's fields). */
void *ofl_slice_region(const struct mw_optim_slice *s, enum ofl_region r);
void ofl_slice_set(struct mw_optim_slice *s, enum ofl_region r, void *p);

/* Byte offsets and lengths of the regions of a subgroup of n elements (padded layout). */
struct ofl_layout {
    uint64_t off[OFL_NREGIONS], len[OFL_NREGIONS]; /* len unpadded */
    uint64_t total;                                /* padded, multiple of OFL_PAD */
};
void ofl_layout_make(const struct mw_offload_config *c, uint64_t n, struct ofl_layout *L);
/* The kind a region belongs to (MASTER or MOMENTS). */
enum mw_offload_kind ofl_region_kind(enum ofl_region r);
/* Bytes of region r for n elements (unpadded) and the byte offset of element `first`
 * within a flat array of region r (scales: first must be a multiple of MW_Q8_BLOCK). */
uint64_t ofl_region_bytes(const struct mw_offload_config *c, enum ofl_region r, uint64_t n);
uint64_t ofl_region_offset(const struct mw_offload_config *c, enum ofl_region r, uint64_t first);
enum mw_optim_dtype ofl_mdtype(enum mw_offload_mfmt f);
enum mw_optim_dtype ofl_wdtype(enum mw_offload_wfmt f);
uint64_t ofl_wbytes(enum mw_offload_wfmt f);       /* bytes per working-copy element */
uint64_t ofl_granule(const struct mw_offload_config *c); /* subgroup sizes are multiples */
/* Whether any optimizer-state kind is on NVMe: then each subgroup has two slots (see docs). */
int ofl_transactional(const struct mw_offload_config *c);

/* ------------------------------------------------------------------ the accelerator */
/* device.h: the device table (the emulated accelerator, accel_emu.c, is its first implementation)
 * and the engine's jobs over it (struct ofl_dev, struct ofl_devjob, device.c). */

/* ------------------------------------------------------------------ the engine */

enum ofl_sg_state {
    OFL_SG_IDLE = 0,   /* waiting for its gradients */
    OFL_SG_READY,      /* gradients final, update may start */
    OFL_SG_READING,    /* staging buffer taken, NVMe/DRAM reads in flight */
    OFL_SG_LOADED,     /* state in staging (or at home), waiting for an update engine */
    OFL_SG_UPDATING,
    OFL_SG_UPDATED,    /* updated, write-back not started */
    OFL_SG_WRITING,
    OFL_SG_DONE,
    OFL_SG_PREREADING, /* between steps: staging buffer taken, read of the next step's state in flight */
    OFL_SG_PRELOADED,  /* between steps: that state is in its staging buffer */
};

struct ofl_sg {
    enum ofl_sg_state state;
    uint64_t ready_elems;      /* gradient elements final in this micro-step */
    int buf;                   /* staging buffer index, -1 */
    int on_dev;                /* update runs on the device */
    int io_err;                /* the request is an injected (torn) write failure */
    int fresh;                 /* this step: the working copy holds the updated weights (write may be in flight) */
    /* Streaming's handoff (mw_offload_master_handoff): the caller's pages of the working copy
     * (cfg.ext_weights) take the updated master from the update, as a resident working copy is
     * refreshed, instead of reading it after the write. */
    int handoff;               /* asked for */
    int handed;                /* the pages hold it */
    int hand_busy;             /* an update thread or the write-back is copying into them now */
    int wb;                    /* the write-back took it (too late to register a handoff) */
    int crcs;                  /* bufcrc of its buffer holds its write-back's block checksums (fused) */
    int verify_later;          /* its read (io) is checked by the update (MW_STORE_VERIFY_LATER) */
    struct mw_store_io io;     /* read or write of its slot object (one at a time) */
    struct mw_store_io gio;    /* streaming: read of its gradient object, beside io */
    int reads_left;            /* reads of this admission still in flight (1, or 2 with gio) */
    int read_rc;               /* first failure among them */
    char read_msg[800];
    struct ofl_devjob job;
    double pred_cpu_s, pred_dev_s; /* decision inputs: the corrected model's, at dispatch */
    enum ofl_cost_ctx ctx;         /* its update's context (cost.h): the caller computing or not */
    uint64_t t_ready, t_loaded;    /* ns: became READY; current I/O started */
    struct mw_offload *e;
};

struct ofl_range { uint64_t first, n; };
/* A run of equal weight decay and step inside a subgroup (elements relative to its start).
 * lag: the run is updated as AdamW step (committed + 1) - lag (0: the step's own number), or not
 * at all with OFL_LAG_SKIP (mw_offload_set_tensor_steps). A subgroup's runs may end with empty
 * ones (n = 0). */
#define OFL_LAG_SKIP INT64_MIN
struct ofl_run { uint64_t off, n; int decay; int64_t lag; };
/* One tensor's piece of a subgroup (update.c rebuilds the runs from them). */
struct ofl_piece { uint64_t off, n; uint32_t tensor; int decay; };

/* update.c: the decay runs of every subgroup, and one subgroup's update over them. */
int ofl_runs_build(struct mw_offload *e, const struct mw_offload_registry *r);
int ofl_update(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
               const struct ofl_run *runs, uint32_t nruns, const struct mw_optim_exec *ex);
/* Elements [lo, hi) of it (not for 8-bit moments, whose blocks couple elements). */
int ofl_update_range(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, const struct mw_optim_slice *s,
                     const struct ofl_run *runs, uint32_t nruns, uint64_t lo, uint64_t hi,
                     const struct mw_optim_exec *ex);

struct mw_offload {
    struct mw_offload_config cfg;
    struct mw_offload_plan plan;
    struct mw_optim_format fmt;
    struct mw_offload_subgroup *sgs;
    uint32_t nsg;
    struct ofl_run *runs;      /* decay runs; subgroup i has runs[sg_run[i] .. sg_run[i+1]) */
    uint32_t *sg_run;          /* [nsg + 1] */
    struct ofl_piece *pieces;  /* [sg_run[nsg]]: subgroup i's tensor pieces at the same indices */
    uint32_t ntensors;
    struct ofl_sg *st;         /* [nsg] */
    int txn;                   /* transactional: two slots per optimizer-state kind */
    struct mw_trace *tr;

    /* tiers and memory */
    struct mw_tier *tier[MW_TIER_COUNT];
    struct mw_buf home[OFL_NREGIONS][2];   /* DRAM-resident regions: flat arrays, slot 0/1 */
    struct mw_buf grads;                   /* engine-owned fp32 accumulation buffer */
    struct mw_buf weights;                 /* engine-owned working copy (no ext_weights) */
    struct mw_buf *staging;                /* [buffer_count] */
    int nbuf;
    uint32_t *bufcrc;                      /* [nbuf][bufcrc_n]: write-back checksums taken by the update */
    uint64_t bufcrc_n;                     /* checksum blocks of a full staging buffer */
    struct mw_buf nvme_res;                /* accounting reservation on the nvme tier */
    struct ofl_layout lay;                 /* layout of a full-size subgroup */
    uint64_t nvme_obj_bytes;               /* bytes of one slot object (nvme regions only) */
    int nvme_regions;                      /* bitmask of regions stored on NVMe */
    struct mw_store *store;
    struct mw_store_obj **obj;             /* [nsg][2] */
    struct mw_store_obj **gobj;            /* [nsg] gradients (streaming only), one slot */
    int grads_resident;                    /* streaming: this step's gradients are in ext_grads already
                                              (mw_offload_grads_resident): not read from gobj */
    unsigned char *uninit;                 /* [nsg] streaming: initial master not written yet (mw_offload_master_init) */
    uint32_t n_uninit;
    struct mw_store_obj *scratch;          /* the caller's (cfg.scratch_bytes), or NULL */
    struct ofl_dev *dev;
    int sto_ndirs;                         /* the store's settings, as the commit record keeps them */
    uint64_t sto_stripe, sto_crc_block, sto_capacity;

    /* durable commit record (journal.c; cfg.journal) */
    char *jpath;                           /* DIR0/MW_OFFLOAD_RECORD_NAME */
    char *rec_dirs;                        /* the directory list as records name it: "." (the record's own
                                              directory, wherever it is now), then the others absolute */
    uint8_t *jblob;                        /* the caller's blob for the next record */
    size_t jblob_len;
    int jon;                               /* records are written at every commit */
    /* The record of a finished step is written by the pipeline thread behind the caller's work
     * (its fdatasync can take a second); whatever would write the slot it leaves behind (the next
     * step), move the slots or end the run waits for it first: ofl_journal_settle. */
    int jstate;                            /* 0 none pending, 1 asked for (step jstep), 2 being written,
                                              3 held (step jstep: its writes landed, the caller has not
                                              allowed its record yet) */
    uint64_t jstep;                        /* the last step whose record was asked for */
    /* mw_offload_journal_allow: records of steps after jallow wait for the caller (its own account
     * of the step, a log line, is written first); UINT64_MAX (the default): none waits. */
    uint64_t jallow;
    int jerr;                              /* a record that failed (sticky), message in jmsg */
    char jmsg[600];
    int jkeep;                             /* a record exists: the files stay for a resume */

    /* step state (guarded by mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv_pipe, cv_cpu, cv_done;
    pthread_t pipe_thr, cpu_thr;
    int threads_up, stop;
    uint64_t committed;        /* steps committed; slot of the committed state = committed % 2 */
    int in_backward, armed, micro_index, failed;
    int in_flight;             /* a step started (mw_offload_step_start) and not yet waited for */
    uint64_t step_call_t0;     /* ns: when it was started */
    struct mw_offload_hparams hp;
    /* FIFOs of subgroup ids, [nsg] each; head/tail count up within a step */
    uint32_t *readyq; uint32_t ready_head, ready_tail; /* READY: waiting for a staging buffer */
    uint32_t *cpuq; uint32_t cpu_head, cpu_tail;       /* for the CPU update thread */
    uint32_t *updq; uint32_t upd_head, upd_tail;       /* UPDATED: waiting for write-back */
    uint32_t n_done, n_started;                        /* subgroups finished / enqueued this step */
    int n_reading, n_writing;                          /* NVMe reads / writes in flight */
    /* pre-reads between steps (pipeline.c): subgroups pre_next.. are still to be read ahead */
    int pre_on, n_prereading; uint32_t pre_next;
    int master_alias;          /* the master weights ARE the caller's fp32 weight array (all-DRAM) */
    int *free_bufs; int nfree;
    int err; char errmsg[1024];
    uint64_t writes_until_fail;    /* 0: no injected failure */
    /* The cost model that learns (cost.h) and auto's plan for the next step (costplan.c). */
    struct ofl_cost cost;
    struct ofl_plan_auto plan_auto;        /* auto's plan: the next step's (cur), home, a probe's wait */
    struct ofl_plan_choice plan_fixed;     /* the best fixed policy beside it */
    struct ofl_plan_sg *plan_sg;           /* [nsg] the model's times, refreshed between steps */
    unsigned char *plan_mask;              /* [nsg] where the last step's updates ran */
    struct ofl_cost_hist *plan_hist;       /* [nsg + 1] by subgroups on the device: measured / simulated steps */
    double *plan_ratio;                    /* [nsg + 1] the ratios ofl_plan_predict applies */
    unsigned char *plan_mask_tried;        /* [nsg + 1] a plan with that many device subgroups ran (not cold) */
    uint64_t t_last_done;                  /* ns: the step's last subgroup finished */
    uint64_t dev_t0, dev_t1;               /* this step's device jobs: first copy in, last copy out (ns, the
                                              device's clock), 0 when none */
    int caller_waiting;                    /* the caller is blocked on the step (contention context) */
    int caller_sync;                       /* mw_offload_step: the caller waits from the start */
    uint64_t step_t0;
    struct ofl_range *ranges; uint32_t nranges, cap_ranges; /* ranges reported this micro-step */

    struct mw_offload_stats stats;
};

/* pipeline.c */
int ofl_pipe_start(struct mw_offload *e);
void ofl_pipe_stop(struct mw_offload *e);
/* With e->mu held: subgroup became READY. */
void ofl_pipe_enqueue_locked(struct mw_offload *e, uint32_t sg);
/* Pre-reads between steps: allow them (after a commit), or stop them and give their buffers
 * back (before anything else uses the staging buffers or the slots). Neither holds e->mu. */
void ofl_preread_allow(struct mw_offload *e);
void ofl_preread_drop(struct mw_offload *e);
/* Slot views: the arrays of subgroup sg in slot `slot` of its DRAM home, or in staging buffer b. */
void ofl_view_home(struct mw_offload *e, uint32_t sg, int slot, struct mw_optim_slice *s);
void ofl_view_staging(struct mw_offload *e, uint32_t sg, int b, struct mw_optim_slice *s);
const float *ofl_grads_of(struct mw_offload *e, uint32_t sg);
void *ofl_weights_of(struct mw_offload *e, uint32_t sg);
/* Synchronous load/store of the whole state of sg in slot `slot` to/from staging buffer 0
 * (only outside steps: init, readers, writers, recovery). */
int ofl_slot_load(struct mw_offload *e, uint32_t sg, int slot);
int ofl_slot_store(struct mw_offload *e, uint32_t sg, int slot);
/* The byte range of a staging buffer that is subgroup sg's NVMe object (its whole content). */
void ofl_nvme_span(struct mw_offload *e, uint32_t sg, uint64_t *off, uint64_t *len);

/* engine.c: helpers for state.c and grads.c */
/* Zeroes io and fills in one whole-object transfer from offset 0 (callback and user left to set). */
void ofl_obj_io(struct mw_store_io *io, struct mw_store_obj *obj, enum mw_aio_op op, uint64_t len, void *buf);
void ofl_sg_span(const struct mw_offload *e, uint64_t first, uint64_t n, uint32_t *lo, uint32_t *hi);
int ofl_check_range(const struct mw_offload *e, uint64_t first, uint64_t n, const char *what);
int ofl_check_quiet(struct mw_offload *e, const char *what);       /* -EBUSY during a step */
/* Writes master[0..n) (the master of elements first..) into the working copy, converted. */
void ofl_refresh_weights(struct mw_offload *e, uint64_t first, uint64_t n, const float *master);

/* journal.c: the commit record of `step` (its slot step % 2) after an fdatasync of the store;
 * the check of a record against this engine's settings and objects; the restore of its
 * committed state (read, checksums adopted, working copy refreshed); stale temporaries. */
int ofl_journal_write(struct mw_offload *e, uint64_t step);
/* pipeline.c: ofl_journal_write of e->jstep with e->mu dropped meanwhile (held on entry and return). */
void ofl_journal_record_locked(struct mw_offload *e);
int ofl_journal_settle(struct mw_offload *e); /* engine.c: waits for a pending record (a held one is allowed); its error */
int ofl_journal_check(struct mw_offload *e, const struct mw_offload_record *r);
int ofl_journal_restore(struct mw_offload *e, const struct mw_offload_record *r);
void ofl_journal_sweep(const char *record_path);

/* policy.c */
/* 1: run on the device, 0: on the CPU; sets the subgroup's corrected predictions and context. */
int ofl_policy_decide(struct mw_offload *e, uint32_t sg);
/* The context an update started now runs in (e->mu held). */
enum ofl_cost_ctx ofl_policy_ctx(const struct mw_offload *e);
/* Auto: the next step's plan from the corrected model (hysteresis against the current one), and
 * its trace; e->mu held (or no thread started yet). */
void ofl_policy_replan(struct mw_offload *e);

/* placement.c: real capacity of a tier (bytes, 0 = unknown) */
uint64_t ofl_dram_available(void);
uint64_t ofl_dir_available(const char *dirs);

#endif
