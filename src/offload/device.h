/*
 * device.h — the accelerator behind a table: what the offload engine asks of a device
 * (struct ofl_device_iface), and the engine's side of it (struct ofl_dev: subgroup updates run
 * as jobs over two slots of a device arena).
 *
 * Why a table: the hybrid update (some subgroups on the CPU, others on the accelerator) must not
 * know which accelerator it drives. Today that is the emulated one (accel_emu.c: host memory and
 * two threads); a CUDA device fills the same table with device buffers, streams and a kernel, and
 * the engine (device.c, pipeline.c, policy.c, engine.c) does not change. The shape is the house's
 * backend seam (src/tier/tier_buft.c, struct mw_buft_iface): a small table of functions taking a
 * context, optional entries marked "(optional)" with their default, one implementation per
 * device, and the caller never asks which one it has.
 *
 * The model is CUDA's, so that each entry is one or two runtime calls there:
 *   memory   device buffers are struct mw_buf of the device tier (the tier counts them; a CUDA
 *            device cudaMallocs and reserves the bytes on the tier), host memory the engine copies
 *            from can be pinned (cudaHostRegister);
 *   queues   three in-order queues (streams): IN (host->device copies), COMPUTE (kernels), OUT
 *            (device->host copies). Work on one queue runs in the order it was queued; between
 *            queues, order comes only from events. Queued work never blocks the caller.
 *   events   recorded on a queue (cudaEventRecord: complete once everything queued before it
 *            there is), waited for by a queue (cudaStreamWaitEvent) or by the host (event_wait,
 *            event_query), with the host-clock time (mw_now_ns) it completed at. An event never
 *            recorded is complete.
 *   callbacks  host_fn: a function called on a thread of the device once the work queued before
 *            it on a queue is done; it may call the table (query events, queue more work) but
 *            never waits for the device. This is how a job's end reaches the engine and starts
 *            the next one without a thread switch. (CUDA: an event and a thread of the device's
 *            own, not cudaLaunchHostFunc, whose functions may not call CUDA.)
 *   errors   of queued work arrive late: the first error of the work queued on a queue since its
 *            previous record is carried by its next record (event_wait / event_query return it,
 *            with its message); synchronize returns one that no record carried. A wait does not
 *            pass errors on. A device whose errors are permanent (a CUDA context after a fault)
 *            fails every later event as well. Queueing itself fails only for bad arguments or a
 *            broken device.
 *   AdamW    over a region already on the device, every state format the CPU kernels have
 *            (fp32, bf16, bf16 with stochastic rounding, 8-bit moments; optional bf16/fp16
 *            weight copy), over the subgroup's runs of equal weight decay. The reference is
 *            ofl_update (update.c) on the CPU: a device's results must be bitwise its results
 *            (tests/test_offload_device.c checks each device element by element). A run that is
 *            not stepped (OFL_LAG_SKIP) is left as it is in device memory, its weight copy too.
 * Settings of one device (the emulator's, a CUDA ordinal) live in its own context, not here.
 *
 * Adding a device: an implementation file defining `const struct ofl_device_iface
 * ofl_device_<name>`, its declaration below, and its line in the registry of device.c; then
 * tests/test_offload_device.c's checks for it (one more of its "CTest variants").
 * A device whose kernels are not ofl_update itself (CUDA) walks the region with ofl_update_walk
 * below, the cut ofl_update makes, and takes each piece's constants from mw_adamw_prepare
 * (src/optim/optim_internal.h): the same pieces, the same floats, then the same element rule.
 *
 * Which device an engine opens: ofl_dev_init's name, else the environment's MEMWALL_DEVICE
 * ("emu", "cuda"), else the registry's first. The CUDA device (device_cuda.c, docs/gpu.md) is
 * built when CMake finds nvcc (MEMWALL_CUDA); a build without it registers a stand-in
 * (device_cuda_none.c) whose open says so, so that the name is known in every build.
 */
#ifndef MEMWALL_OFFLOAD_DEVICE_H
#define MEMWALL_OFFLOAD_DEVICE_H

#include "memwall/optim.h"
#include "memwall/tier.h"

#include <stdint.h>

struct mw_trace;
struct mw_offload_config;
struct ofl_run; /* internal.h: a run of equal weight decay inside a subgroup */

enum ofl_devq { OFL_DEVQ_IN = 0, OFL_DEVQ_COMPUTE = 1, OFL_DEVQ_OUT = 2, OFL_DEVQ_N = 3 };

/* An event handle: opaque, never defined; each device casts it to its own type. */
struct ofl_dev_event;

/* One AdamW update of a region on the device: s's arrays are device addresses (inside device
 * buffers), s->grad fp32; fmt, hp as memwall/optim.h; runs (host memory, valid until the work
 * is done) cut s into runs of equal decay, exactly as ofl_update takes them. */
struct ofl_dev_adamw {
    struct mw_optim_format fmt;
    struct mw_adamw_hp hp;
    struct mw_optim_slice s;
    const struct ofl_run *runs;
    uint32_t nruns;
    int64_t tag; /* for the device's trace: the subgroup */
};

/*
 * The device table. Every entry takes the context open returned. Entries that queue work (copy_in,
 * copy_out, adamw, host_fn, record, wait_event) return 0 once it is queued, or an error (with
 * mw_error_set) when it could not be; the errors of the work itself arrive through events.
 * All entries may be called from any thread; the caller orders its own calls.
 */
struct ofl_device_iface {
    const char *name;              /* what a configuration names: "emu", "cuda" */
    /* Start the device: allocations are counted on dev_tier (a tier of MW_TIER_DEVICE that
     * outlives the device); tr (optional) receives its copies and kernels. */
    int (*open)(void **ctx, struct mw_tier *dev_tier, struct mw_trace *tr);
    /* After synchronize; everything allocated and every event freed. */
    void (*close)(void *ctx);

    /* Device memory: bytes of kind for label (tier accounting and trace), *out filled. */
    int (*alloc)(void *ctx, uint64_t bytes, enum mw_alloc_kind kind, const char *label, struct mw_buf *out);
    void (*free)(void *ctx, struct mw_buf *b);
    /* (optional) pin host memory that copies will read or write, until unregistered; default:
     * nothing to do (host memory is as good as any for this device). */
    int (*host_register)(void *ctx, void *ptr, uint64_t bytes);
    void (*host_unregister)(void *ctx, void *ptr);

    /* Queued copies: bytes from host src to dst's bytes [off, off + bytes), and back. */
    int (*copy_in)(void *ctx, enum ofl_devq q, const struct mw_buf *dst, uint64_t off, const void *src,
                   uint64_t bytes);
    int (*copy_out)(void *ctx, enum ofl_devq q, void *dst, const struct mw_buf *src, uint64_t off,
                    uint64_t bytes);
    /* Queued AdamW (the op is copied: it may live on the caller's stack). */
    int (*adamw)(void *ctx, enum ofl_devq q, const struct ofl_dev_adamw *op);
    /* Queued host callback: fn(arg) on a thread of the device once the work before it on q is
     * done (see above: it may queue work and query events, never wait). */
    int (*host_fn)(void *ctx, enum ofl_devq q, void (*fn)(void *arg), void *arg);

    /* Events: created, (re-)recorded on a queue any number of times, freed when nothing queued
     * refers to them any more. */
    int (*event_new)(void *ctx, struct ofl_dev_event **ev);
    void (*event_free)(void *ctx, struct ofl_dev_event *ev);
    int (*record)(void *ctx, enum ofl_devq q, struct ofl_dev_event *ev);
    int (*wait_event)(void *ctx, enum ofl_devq q, struct ofl_dev_event *ev); /* q waits for ev */
    /* The last record of ev: 1 complete, 0 not yet, or its error. */
    int (*event_query)(void *ctx, struct ofl_dev_event *ev);
    /* Blocks until the last record of ev completed: 0 or its error (message set). */
    int (*event_wait)(void *ctx, struct ofl_dev_event *ev);
    /* mw_now_ns() when the last record of ev completed (complete events only). */
    uint64_t (*event_time_ns)(void *ctx, const struct ofl_dev_event *ev);
    /* Blocks until every queue is empty (callbacks included); returns an error of queued work that
     * no record carried (message set), or 0. */
    int (*synchronize)(void *ctx);
};

/* The implementations (registered in device.c's table, the first is the default). */
extern const struct ofl_device_iface ofl_device_emu;  /* accel_emu.c */
extern const struct ofl_device_iface ofl_device_cuda; /* device_cuda.c, or device_cuda_none.c without nvcc */

/* The registered device called name (NULL: the default), or NULL with a message naming them all. */
const struct ofl_device_iface *ofl_device_find(const char *name);

/* ------------------------------------------------------------------ the cut of a region (update.c) */

/* How ofl_update cuts a region of n elements into kernel calls, for a device that runs them its
 * own way. step: one AdamW call over elements [off, off + n) with the run's decay (0: weight
 * decay 0) and lag (the step is hp->step - lag; OFL_LAG_SKIP: not stepped, left as read);
 * scale: master[lo, hi) *= factor before the step that covers them (an 8-bit block straddling a
 * decay boundary, update.c). Calls come in ofl_update's order; a nonzero return stops the walk
 * and is returned. */
struct ofl_update_walker {
    int (*step)(void *user, uint64_t off, uint64_t n, int decay, int64_t lag);
    int (*scale)(void *user, uint64_t lo, uint64_t hi, float factor);
    void *user;
};
int ofl_update_walk(const struct mw_optim_format *f, const struct mw_adamw_hp *hp, uint64_t n,
                    const struct ofl_run *runs, uint32_t nruns, const struct ofl_update_walker *w);
/* A step's slice (elements [off, off + n) of s) and hyper-parameters (decay, lag), as
 * ofl_update passes them to mw_adamw_step. */
struct mw_optim_slice ofl_piece_slice(const struct mw_optim_format *f, const struct mw_optim_slice *s, uint64_t off,
                                     uint64_t n);
struct mw_adamw_hp ofl_piece_hp(const struct mw_adamw_hp *hp, int decay, int64_t lag);

/* ------------------------------------------------------------------ the engine's side (device.c) */

struct ofl_dev;
struct ofl_devjob;
typedef void (*ofl_devjob_done)(struct ofl_devjob *j, void *user);
/* One subgroup update on the device: host arrays copied in, updated, copied out. */
struct ofl_devjob {
    uint32_t sg;
    struct mw_optim_slice host;           /* host arrays (staging or DRAM homes); grad is fp32 */
    const struct mw_optim_format *fmt;
    struct mw_adamw_hp hp;
    const struct ofl_run *runs;           /* the subgroup's decay runs */
    uint32_t nruns;
    ofl_devjob_done done;                 /* called once the results are in host memory, on a thread of
                                             the device (or of device.c when it failed); may submit */
    void *user;
    int result;                           /* 0, or the error, with its message in msg */
    char msg[400];
    uint64_t h2d_bytes, d2h_bytes;
    uint64_t t_queued, t_h2d0, t_h2d1, t_k0, t_k1, t_d2h0, t_d2h1; /* ns */
    struct ofl_devjob *next_;
};
/* Opens the device called name (NULL: MEMWALL_DEVICE, else the default) and its arena of two job
 * slots of slot_bytes (copies of one job overlap the kernel of the other). */
int ofl_dev_init(struct ofl_dev **out, const char *name, struct mw_tier *dev_tier, uint64_t slot_bytes,
                 const struct mw_offload_config *c, struct mw_trace *tr);
void ofl_dev_free(struct ofl_dev *d);
/* Queues a job; j->done runs when its results are in host memory. Never blocks on the device. */
void ofl_dev_submit(struct ofl_dev *d, struct ofl_devjob *j);
/* Pins host memory the jobs copy from and to (no-op for devices without host_register); it is
 * unpinned at ofl_dev_free. */
int ofl_dev_pin(struct ofl_dev *d, void *ptr, uint64_t bytes);
/* Device-side bytes one job of n elements needs. */
uint64_t ofl_dev_job_bytes(const struct mw_offload_config *c, uint64_t n);

#endif
