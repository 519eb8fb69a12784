/*
 * memwall/pyapi.h — a flat C entry point into the offload engine for language bindings.
 *
 * Why: the Python package (python/memwall, docs/python.md) reaches libmemwall.so through
 * ctypes, which is only safe with scalar and pointer arguments: mirroring struct
 * mw_offload_config or mw_offload_hparams field by field in Python would silently break the
 * day a field is added. These wrappers take scalars and strings, fill the structs here (from
 * their C defaults) and call the public API of memwall/offload.h; every other engine call
 * (grad_ready, backward_end, read_raw, write_raw, committed steps, recover, free) is used
 * as is, since its arguments are already scalars and pointers. mw_pyapi_version() lets the
 * binding refuse a library it was not written for.
 *
 * The session (mw_pysession_*, below) is the same idea one level up: the C trainer's step taken
 * apart into flat calls, for a model whose passes run in the caller (memwall.torch.offload).
 *
 * Errors: 0 or a negative errno / MW_E* code with the message in mw_error_msg(), as the rest
 * of the library.
 */
#ifndef MEMWALL_PYAPI_H
#define MEMWALL_PYAPI_H

#include <stdint.h>

#include "memwall/foreign.h"
#include "memwall/offload.h"
#include "memwall/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MW_PYAPI_VERSION 2 /* 2: the whole-state session (mw_pysession_*) */

int mw_pyapi_version(void);

/* Creates an engine over n tensors of numel[i] elements each (flags[i]: MW_OFFLOAD_NO_DECAY or
 * 0; flags may be NULL), laid end to end in the caller's flat arrays weights[total] (the
 * working copy in weight_format, refreshed in place; an fp32 master starts from it, a
 * bf16/fp16 one from zeros: then call mw_offload_set_master) and grads[total] (fp32; the
 * caller accumulates into it and zeroes it; the engine reads it at update time).
 *   placement:     as mw_offload_placement_parse ("all=dram", "optim=nvme", ...)
 *   moments:       "fp32", "bf16", "bf16-sr" or "8bit"
 *   weight_format: "fp32", "bf16" or "fp16" (the working copy; the master is always fp32)
 *   nvme_dir:      directory (or "d1:d2") for NVMe state; may be NULL for an all-DRAM placement;
 *                  the string must outlive the engine
 *   subgroup_size: elements per subgroup, 0 = the engine's default, balanced: as few subgroups
 *                  as it allows, of equal size
 *   buffer_count:  staging buffers, 0 = the engine's default; never more than there are
 *                  subgroups (so staging stays within what the model needs)
 *   cpu_threads:   optimizer kernel threads, 0 = OpenMP default
 *   budgets:       bytes, 0 = none (the real capacity is still checked)
 *   trace:         optional recorder (memwall/trace.h), may be NULL */
int mw_pyapi_create(struct mw_offload **out, uint32_t n, const uint64_t *numel, const unsigned *flags,
                    const char *placement, const char *moments, const char *weight_format, const char *nvme_dir,
                    uint64_t subgroup_size, int buffer_count, int cpu_threads,
                    uint64_t dram_budget, uint64_t nvme_budget,
                    void *weights, const float *grads, struct mw_trace *trace);

/* mw_offload_backward_begin with last = 1; arm != 0 arms the update with these AdamW
 * hyper-parameters (updates start as ranges are reported). */
int mw_pyapi_backward_begin(struct mw_offload *e, int arm, double lr, double beta1, double beta2,
                            double eps, double weight_decay, float grad_scale);
/* mw_offload_step: armed != 0 runs with the hyper-parameters given at backward_begin (the
 * others are ignored), else with these. */
int mw_pyapi_step(struct mw_offload *e, int armed, double lr, double beta1, double beta2,
                  double eps, double weight_decay, float grad_scale);

/* Counters and plan as numbers, in this fixed order (n: room in out; returns how many were
 * written, at most MW_PYAPI_NSTATS):
 *   0 steps, 1 nvme_read_bytes, 2 nvme_write_bytes, 3 step_s, 4 kernel_s, 5 io_wait_s,
 *   6 cpu_updates, 7 n_subgroups, 8 subgroup_size (elements), 9 dram bytes (plan),
 *   10 nvme bytes (plan), 11 staging bytes (plan) */
#define MW_PYAPI_NSTATS 12
int mw_pyapi_stats(const struct mw_offload *e, double *out, int n);

/* ---- whole-state offload: a session (src/pyapi/pysession.c; docs/python.md, "Whole-state offload:
 * the C session"; issue 25) ----
 *
 * A model whose passes run in the caller (PyTorch) gets memwall's residency machine: its weights
 * and gradients are one flat fp32 array each (params, grads: fresh mappings, untouched pages cost
 * nothing), cut into units; with weights = "nvme" they live on NVMe as the optimizer's fp32
 * master and a unit is fetched ahead of its use and released after it, its gradients written out
 * as they finish, exactly as `memwall train --offload-params nvme` does (the same factory, source
 * and optimizer: src/train). A step, in the trainer's order (src/train/trainer.c, batch-major):
 *
 *     for each micro-batch a (last = a == accum - 1):
 *         pass_begin(1)
 *         forward:  unit(ACQUIRE, u, 0) ... use params[unit u] ... unit(RELEASE, u, 0)   in fwd_order
 *         backward_begin(a, last)
 *         backward: unit(ACQUIRE, u, 1) ... add to grads[unit u] ... unit(RELEASE, u, 1)  in bwd_order
 *                   grad_ready(u) once u's gradients of this micro-batch are complete, units in
 *                   decreasing order (each unit's range lies above the next one's); u's gradients
 *                   are not written after it (streamed: they may be on their way to NVMe)
 *         backward_end()
 *     grad_norm(&norm)            (optional: the global L2 norm, as clip_grad_norm_ returns it)
 *     step(lr, betas, eps, weight_decay, clip)
 *
 * Each acquire is checked against the order given at open (resident or streamed: one machine,
 * src/train/units.c); a unit out of order is refused naming both units. Between an acquire and
 * its release the unit's params are valid; outside, streamed pages read as zeros. Gradients are
 * summed by the caller into grads (zero at the first micro-batch of a step); the loss scale
 * (1/accum) is the caller's. With the optimizer on NVMe the update of step s runs behind the next
 * forward pass (each unit waits for its own subgroups; finish() waits for all and commits). */
struct mw_pysession;

/* Opens a session over a model of n_units units (unit_numel[u] elements each, end to end in flat
 * order; names for messages, NULL: "unit.<u>"), acquired in fwd_order[n_fwd] by a forward pass and
 * bwd_order[n_bwd] by a backward pass; n_tensors tensors (tensor_numel, tensor_names, tensor_flags:
 * MW_OFFLOAD_NO_DECAY or 0; flags may be NULL) end to end over the units, each inside one unit
 * (n_tensors 0: one per unit, named as it, decayed). init_unit(init_user, u, dst, n) writes unit u's
 * initial weights (NULL: zeros), unit by unit (streamed: each straight into the NVMe master).
 *   weights:       "dram" (resident) or "nvme" (streamed from the optimizer's master)
 *   optimizer:     "dram", "nvme", or NULL (nvme when the weights stream, else dram)
 *   nvme_dir:      directory (or "d1:d2") of the NVMe state (NULL: ./run/nvme); created if missing
 *   dram_budget:   bytes of DRAM for the run (0: none); a streamed run's planned peak above it is
 *                  refused up front (MW_EBUDGET, the parts named with their bytes)
 *   grad_accum:    the most micro-batches a step will have (1..65536; the plan: with more than one
 *                  the whole gradient array stays in DRAM through the step); more are refused
 *   prefetch_depth units fetched ahead (0..8), subgroup_size elements per optimizer subgroup
 *                  (streamed: a multiple of 1024, whole pages; 0 = the engine's default),
 *                  buffer_count staging buffers (0 = default), threads (0 = OpenMP's default). */
int mw_pysession_open(struct mw_pysession **out, int n_units, const uint64_t *unit_numel,
                      const char *const *unit_names, int n_fwd, const int *fwd_order, int n_bwd,
                      const int *bwd_order, int n_tensors, const uint64_t *tensor_numel,
                      const char *const *tensor_names, const unsigned *tensor_flags,
                      mw_foreign_init_fn init_unit, void *init_user, const char *weights,
                      const char *optimizer, const char *nvme_dir, uint64_t dram_budget, int grad_accum,
                      int prefetch_depth, uint64_t subgroup_size, int buffer_count, int threads);
/* Waits for an update in flight (its failure is lost: call finish first to hear it), frees all. */
void mw_pysession_close(struct mw_pysession *s);
/* The flat arrays ([n_params] fp32, page-aligned) and their size; a unit's range in them. */
float *mw_pysession_params(struct mw_pysession *s);
float *mw_pysession_grads(struct mw_pysession *s);
uint64_t mw_pysession_n_params(const struct mw_pysession *s);
int mw_pysession_unit_range(const struct mw_pysession *s, int unit, uint64_t *first, uint64_t *n);
/* Elements [first, first+n) of unit `unit` (held now) are not read again in this use: streamed, the
 * optimizer subgroups wholly inside go before the unit's release (a vocabulary-sized head's backward
 * drops its weights chunk by chunk), unless the next units of the schedule need them. Flags:
 * MW_PYSESSION_TRIM_NOW: those go too (to the OS; the next use reads them again and waits: a head's
 * weights over the loss, between its forward and its backward). Advice: resident weights stay;
 * outside the unit or unknown flags: -EINVAL. */
#define MW_PYSESSION_TRIM_NOW 1
int mw_pysession_unit_trim(struct mw_pysession *s, int unit, uint64_t first, uint64_t n, int flags);
/* Before each forward pass (training: a backward pass follows; 0: an evaluation pass). */
int mw_pysession_pass_begin(struct mw_pysession *s, int training);
/* event 0 (MW_NET_UNIT_ACQUIRE) before the pass reads unit `unit`, 1 (RELEASE) after; backward. */
int mw_pysession_unit(struct mw_pysession *s, int event, int unit, int backward);
/* Brackets micro-batch `micro` (0, 1, ... of the step) of the backward pass; last: the step
 * follows it. Micro-batch 0 commits the update before it and zeroes the gradients. */
int mw_pysession_backward_begin(struct mw_pysession *s, int micro, int last);
int mw_pysession_grad_ready(struct mw_pysession *s, int unit);
int mw_pysession_backward_end(struct mw_pysession *s);
/* After the last micro-batch's backward_end: the global L2 norm of the step's gradients; 0, or
 * MW_EOVERFLOW when it is not finite (step then skips). */
int mw_pysession_grad_norm(struct mw_pysession *s, double *norm);
/* AdamW step (the gradients scaled by clip / norm first when clip > 0 and the norm exceeds it).
 * 0: stepped; 1: skipped (inf/NaN gradients: the weights stay, the step counts); < 0: an error. */
int mw_pysession_step(struct mw_pysession *s, double lr, double beta1, double beta2, double eps,
                      double weight_decay, double clip);
/* Waits for the update in flight and commits it (0 when none). */
int mw_pysession_finish(struct mw_pysession *s);
/* Unit `unit`'s current weights into dst[unit's n] (waits for an update in flight; streamed: read
 * from the NVMe master through the machine's save path). */
int mw_pysession_unit_read(struct mw_pysession *s, int unit, float *dst);
/* Unit `unit`'s weights := src[unit's n] (load_state_dict): the optimizer's master and, resident,
 * params; between steps (not inside one: -EINVAL). The moments and the step count stay. */
int mw_pysession_unit_write(struct mw_pysession *s, int unit, const float *src);
/* Figures as numbers, in this fixed order (n: room in out; returns how many were written):
 *   0 steps, 1 n_params, 2 n_units, 3 planned DRAM peak (streamed; 0 resident), 4 weight bytes
 *   resident at the peak (streamed), 5 weight bytes fetched, 6 gradient bytes written (streamed),
 *   7 s waited for fetches, 8 optimizer NVMe bytes read, 9 written, 10 subgroup size (elements),
 *   11 prefetch depth, 12 weight bytes handed over by the update instead of fetched (streamed), 13 1
 *   when every step's gradients stay in DRAM (streamed: kept by the budget, or accumulated) */
#define MW_PYSESSION_NSTATS 14
int mw_pysession_stats(const struct mw_pysession *s, double *out, int n);

/* ---- the session's commit records and resume (src/pyapi/pysession.c; docs/python.md, "Resume") ----
 *
 * With the optimizer state on NVMe every step of a session is committed as `memwall train`'s are
 * (docs/resume.md): a process killed at any instant leaves DIR0/memwall-offload.commit naming the
 * last committed step, and a session opened on that directory with resume continues from it,
 * bitwise (the step in flight runs again). The record keeps the model description's digest (the
 * units' sizes and names, the unit orders, the tensors): another description is refused. */

/* mw_pysession_open, plus:
 *   resume: 0 a fresh session (a committed state in nvme_dir is refused, -EEXIST, naming its step),
 *           1 continue the committed state in nvme_dir (none: -ENOENT; another model description or
 *           placement: -EINVAL; a corrupt record or object: MW_EFORMAT / MW_ECHECKSUM, naming it),
 *           2 continue it when there is one, else fresh. init_unit is not called for a streamed
 *           resume (the weights are the committed master); subgroup_size 0 takes the record's.
 *   trace:  an optional recorder (memwall/trace.h) for the engine, the stream's residency events
 *           and the units' names (metadata "units", "unit.<u>.name"), as `memwall train --trace`:
 *           `memwall report` draws the same unit lanes. It must outlive the session. */
int mw_pysession_open2(struct mw_pysession **out, int n_units, const uint64_t *unit_numel,
                       const char *const *unit_names, int n_fwd, const int *fwd_order, int n_bwd,
                       const int *bwd_order, int n_tensors, const uint64_t *tensor_numel,
                       const char *const *tensor_names, const unsigned *tensor_flags,
                       mw_foreign_init_fn init_unit, void *init_user, const char *weights,
                       const char *optimizer, const char *nvme_dir, uint64_t dram_budget, int grad_accum,
                       int prefetch_depth, uint64_t subgroup_size, int buffer_count, int threads, int resume,
                       struct mw_trace *trace);
/* 1 when the session commits every step (the optimizer state on NVMe), else 0. */
int mw_pysession_resumable(const struct mw_pysession *s);
/* The AdamW moments of elements [first, first+n) (fp32, n each; between steps; waits for the
 * update in flight), read from the committed state, each subgroup once. */
int mw_pysession_state_read(struct mw_pysession *s, uint64_t first, uint64_t n, float *exp_avg, float *exp_avg_sq);
/* Writes them (n may be 0) and sets the step count to `steps` (the bias correction of the next step
 * is steps + 1); the record is rewritten to match. Between steps. */
int mw_pysession_state_write(struct mw_pysession *s, uint64_t first, uint64_t n, const float *exp_avg,
                             const float *exp_avg_sq, int64_t steps);
/* The session finished: waits for the update in flight, removes the commit record; the store
 * files go at close. Without it a closed session keeps its committed state for a resume. */
int mw_pysession_end(struct mw_pysession *s);

/* ---- activations on NVMe: the spill store of saved tensors (src/pyapi/pyacts.c; memwall.torch.offload(
 * activations="nvme"), python/memwall/_activations.py; docs/python.md) ----
 *
 * A store of byte strings (the tensors autograd saves in forward), one NVMe object each, in a
 * directory of its own (its file grows with the live tensors; crc32c per 64 KiB block, O_DIRECT,
 * io_uring). put copies the bytes through a fixed staging pool (staging_bytes in chunks of
 * chunk_bytes; a put waits for the oldest chunk's write when all are writing) and returns once
 * they are copied. Backward reads a tensor back straight into the caller's buffer, started ahead
 * (read_start) and waited for when needed (read_wait); the caller picks the order and how many
 * ahead. drop deletes one (waiting for its I/O); close drops all and removes the files.
 *
 *     mw_pyacts_open(&a, "/nvme/run/activations", 0, 0, 0);
 *     forward:  mw_pyacts_put(a, t.data, t.nbytes, &h)           (t may be freed on return)
 *     backward: buf = 4096-aligned, mw_pyacts_room(t.nbytes) bytes
 *               mw_pyacts_read_start(a, h, buf, room) ... mw_pyacts_read_wait(a, h)  -> t's bytes in buf
 *               mw_pyacts_drop(a, h)                            (once no one needs them again)
 *     mw_pyacts_close(a);
 *
 * Handles are checked (a dropped or made-up one is -EINVAL); a failed write makes the next put or
 * flush fail and its tensor unreadable; a failed read (EIO, a crc32c mismatch) is its read_wait's
 * error, naming the tensor. */
struct mw_pyacts;

/* staging_bytes 0: 32 MiB; chunk_bytes 0: 8 MiB (a multiple of 64 KiB, 1..64 chunks of staging);
 * capacity 0: the free space of dir's file system (nothing is reserved up front). */
int mw_pyacts_open(struct mw_pyacts **out, const char *dir, uint64_t staging_bytes, uint64_t chunk_bytes,
                   uint64_t capacity);
void mw_pyacts_close(struct mw_pyacts *a);
int mw_pyacts_put(struct mw_pyacts *a, const void *src, uint64_t bytes, uint64_t *handle);
/* Bytes a read buffer must have for a tensor of `bytes` (rounded up to 4096); 0 for a size put refuses. */
uint64_t mw_pyacts_room(uint64_t bytes);
int mw_pyacts_bytes(struct mw_pyacts *a, uint64_t handle, uint64_t *bytes);
int mw_pyacts_read_start(struct mw_pyacts *a, uint64_t handle, void *dst, uint64_t room);
int mw_pyacts_read_wait(struct mw_pyacts *a, uint64_t handle);
int mw_pyacts_drop(struct mw_pyacts *a, uint64_t handle);
/* Waits for every write; returns the first failed one's error. */
int mw_pyacts_flush(struct mw_pyacts *a);
/* Figures, in this order (returns how many were written, at most n):
 *   0 tensors live, 1 bytes live, 2 peak bytes live, 3 bytes written, 4 bytes read, 5 puts,
 *   6 reads, 7 s waited for writes (back-pressure and before reads), 8 s waited for reads,
 *   9 staging bytes, 10 O_DIRECT (1) or buffered (0) */
#define MW_PYACTS_NSTATS 11
int mw_pyacts_stats(struct mw_pyacts *a, double *out, int n);

#ifdef __cplusplus
}
#endif
#endif
