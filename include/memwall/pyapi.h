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
 * Errors: 0 or a negative errno / MW_E* code with the message in mw_error_msg(), as the rest
 * of the library.
 */
#ifndef MEMWALL_PYAPI_H
#define MEMWALL_PYAPI_H

#include <stdint.h>

#include "memwall/offload.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MW_PYAPI_VERSION 1

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

#ifdef __cplusplus
}
#endif
#endif
