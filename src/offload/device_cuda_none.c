/*
 * device_cuda_none.c — the device called "cuda" in a build without the CUDA toolkit: its open
 * fails, saying how to get the real one.
 *
 * Why a stand-in and not an #ifdef in the registry: the registry (device.c) names the same
 * devices in every build, so MEMWALL_DEVICE=cuda on a build without nvcc is answered with what
 * to do, not with "no accelerator called 'cuda'". CMake compiles exactly one of this file and
 * device_cuda.c (the way src/comm/comm_nompi.c stands in for src/mpi/, comm_impl.h says why a
 * second definition rather than a weak symbol). Nothing but open and close is ever called: the
 * engine calls nothing else on a device that did not open. ofl_cuda_adamw_host (the kernels'
 * arithmetic run on the host, for tests) answers -ENOTSUP here.
 */
#include "offload/device_cuda.h"
#include "offload/internal.h"

#include <errno.h>

static int none_open(void **ctx, struct mw_tier *dev_tier, struct mw_trace *tr)
{
    (void)dev_tier;
    (void)tr;
    *ctx = NULL;
    return mw_error_set(-ENOTSUP, "CUDA accelerator: this memwall was built without CUDA (configure with "
                        "-DMEMWALL_CUDA=ON and the CUDA toolkit's nvcc; docs/gpu.md)");
}

static void none_close(void *ctx) { (void)ctx; }

const struct ofl_device_iface ofl_device_cuda = {
    .name = "cuda",
    .open = none_open,
    .close = none_close,
};

int ofl_cuda_adamw_host(const struct ofl_dev_adamw *op)
{
    (void)op;
    return mw_error_set(-ENOTSUP, "CUDA accelerator: this memwall was built without CUDA");
}
