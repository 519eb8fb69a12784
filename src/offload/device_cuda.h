/*
 * device_cuda.h — what the CUDA device's table (device_cuda.c, C) and its kernels
 * (device_cuda_kernels.cu, CUDA C++) share: one launch of AdamW over pieces of a region.
 *
 * Why a batch of pieces: ofl_update cuts a subgroup into runs of equal weight decay and step
 * (update.c, ofl_update_walk), each with its own AdamW constants. The table walks that cut on the
 * host, takes each piece's constants from mw_adamw_prepare (the CPU's own floats), and launches
 * up to OFL_CUDA_PIECES pieces at once as one kernel whose parameter block is this struct
 * (passed by value, __grid_constant__: no copy of it to device memory is queued). The same
 * batch can be run on the host by the kernels' own element code (ofl_cuda_run_host), which is
 * how a machine without a GPU checks their arithmetic against the CPU's (tests).
 *
 * C and C++ both include this header; it names no CUDA type (a stream travels as void *).
 */
#ifndef MEMWALL_OFFLOAD_DEVICE_CUDA_H
#define MEMWALL_OFFLOAD_DEVICE_CUDA_H

#include "memwall/optim.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OFL_CUDA_PIECES 32 /* pieces per launch: the parameter block stays under 4 KiB */
#define OFL_CUDA_SCALES 8  /* master *= factor segments per launch (8-bit blocks straddling a decay boundary) */
#define OFL_CUDA_BLOCK 256 /* threads per CUDA block: one 8-bit moment block (MW_Q8_BLOCK) per CUDA block */

/* One AdamW call: elements [off, off + n) of the region, with struct mw_adamw_k's floats. */
struct ofl_cuda_piece {
    uint64_t off, n;
    float gscale, b1, c1, b2, c2, decay, step_size, isb2, eps;
    uint32_t off32, seed; /* BF16_SR: element i of the piece rounds with mw_sr_hash(off32 + i, seed) */
};

/* master[lo, hi) *= factor, before the pieces of the same launch. */
struct ofl_cuda_scale {
    uint64_t lo, hi;
    float factor;
};

/* One launch over a region whose arrays start at these addresses (device memory, or host
 * memory for ofl_cuda_run_host), laid out as a struct mw_optim_slice's. */
struct ofl_cuda_batch {
    int grad, moments, weights_out; /* enum mw_optim_dtype */
    float *master;                  /* [n] */
    const void *grad_p;             /* [n] in grad */
    void *m, *v;                    /* [n] in moments (8-bit: code bytes) */
    float *m_scale, *v_scale;       /* 8-bit: [ceil(n / MW_Q8_BLOCK)] */
    void *w;                        /* [n] in weights_out, or NULL */
    uint32_t npieces, nscales;
    uint64_t max_n;                 /* the longest piece (the grid's width) */
    struct ofl_cuda_piece piece[OFL_CUDA_PIECES];
    struct ofl_cuda_scale scale[OFL_CUDA_SCALES];
};

/* Queues the batch on a cudaStream_t: its scales, then its pieces. 0, or the cudaError_t of the
 * launch (a configuration or a broken device; errors of the kernels themselves arrive through
 * the stream's events). */
int ofl_cuda_launch(const struct ofl_cuda_batch *b, void *stream);
/* The batch on the host, by the kernels' element code (same operations, same order), over host
 * arrays. */
void ofl_cuda_run_host(const struct ofl_cuda_batch *b);

struct ofl_dev_adamw;
/* The CUDA device's whole AdamW of one region (the walk, the batches, the element code) run on
 * the host over host arrays: 0, the error the device would carry late, or -ENOTSUP in a build
 * without CUDA (device_cuda_none.c). For tests: the kernels' arithmetic where no GPU is. */
int ofl_cuda_adamw_host(const struct ofl_dev_adamw *op);

#ifdef __cplusplus
}
#endif
#endif
