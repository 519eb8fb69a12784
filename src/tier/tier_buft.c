/*
 * tier_buft.c — the built-in buffer types.
 *
 * host:   page-aligned memory (O_DIRECT needs 4096), mlock'ed so the kernel never has to fault
 *         or migrate pages under an in-flight transfer; where RLIMIT_MEMLOCK refuses, one log
 *         line and the buffer stays pageable. I/O buffers (MW_ALLOC_IO) are 2 MiB-aligned and
 *         madvise(MADV_HUGEPAGE)d before first touch: on this machine's virtual disk a 1 MiB
 *         O_DIRECT request whose buffer spans 256 small pages is split, while one huge page
 *         keeps it whole (about 2x read throughput, docs/io.md). MW_ALLOC_HUGE madvises the same
 *         way without that alignment: the engine's DRAM state arrays, streamed by the update
 *         kernels, take fewer TLB misses (5-10 % faster updates on this machine).
 * device: an emulated accelerator arena — host memory, no locking — until a CUDA backend
 *         supplies its own mw_buft_iface.
 * nvme:   holds no memory; mw_tier_reserve does the accounting.
 */
#include "tier/tier_impl.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

static atomic_int g_mlock_warned;

static const char *host_name(void *ctx) { (void)ctx; return "host-pinned"; }

static int host_alloc(void *ctx, size_t bytes, size_t align, unsigned flags, void **out, unsigned *out_flags)
{
    (void)ctx;
    void *p = NULL;
    int rc = posix_memalign(&p, align, bytes);
    if (rc) {
        char b[32];
        return mw_error_set(-rc, "host tier: cannot allocate %s (alignment %zu): %s",
                            mw_fmt_bytes(b, sizeof b, bytes), align, strerror(rc));
    }
    unsigned bf = 0;
    /* MADV_HUGEPAGE must come before the first touch (mlock and memset fault pages in). */
    /* (MW_ALLOC_HUGE only from one huge page up: a smaller buffer may sit in the heap) */
    int huge = ((flags & MW_ALLOC_IO) && !(flags & MW_ALLOC_NO_HUGE)) || ((flags & MW_ALLOC_HUGE) && bytes >= MW_IO_ALIGN);
    if (huge && madvise(p, bytes, MADV_HUGEPAGE) == 0) bf |= MW_BUF_HUGE;
    if (!(flags & MW_ALLOC_NO_LOCK)) {
        if (mlock(p, bytes) == 0) bf |= MW_BUF_LOCKED;
        else if (!atomic_exchange(&g_mlock_warned, 1)) {
            struct rlimit rl = {0, 0};
            getrlimit(RLIMIT_MEMLOCK, &rl);
            char b[32], l[32];
            mw_log(MW_LOG_WARN,
                   "mlock of %s refused (%s; RLIMIT_MEMLOCK soft limit %s): host buffers stay "
                   "pageable. Raise it with 'ulimit -l unlimited' for pinned buffers.",
                   mw_fmt_bytes(b, sizeof b, bytes), strerror(errno),
                   rl.rlim_cur == RLIM_INFINITY ? "unlimited" : mw_fmt_bytes(l, sizeof l, rl.rlim_cur));
        }
    }
    if (flags & MW_ALLOC_ZERO) memset(p, 0, bytes);
    *out = p;
    *out_flags = bf;
    return 0;
}

static void host_free(void *ctx, void *p, size_t bytes, unsigned bf)
{
    (void)ctx;
    if (bf & MW_BUF_LOCKED) munlock(p, bytes);
    free(p);
}

static const struct mw_buft_iface host_iface = {
    .name = host_name,
    .alloc = host_alloc,
    .free = host_free,
};

static const char *dev_name(void *ctx) { (void)ctx; return "emulated-device"; }

static int dev_alloc(void *ctx, size_t bytes, size_t align, unsigned flags, void **out, unsigned *out_flags)
{
    (void)ctx;
    void *p = NULL;
    int rc = posix_memalign(&p, align, bytes);
    if (rc) {
        char b[32];
        return mw_error_set(-rc, "device tier: cannot allocate %s: %s", mw_fmt_bytes(b, sizeof b, bytes),
                            strerror(rc));
    }
    if (flags & MW_ALLOC_ZERO) memset(p, 0, bytes);
    *out = p;
    *out_flags = 0;
    return 0;
}

static void dev_free(void *ctx, void *p, size_t bytes, unsigned bf)
{
    (void)ctx; (void)bytes; (void)bf;
    free(p);
}

static const struct mw_buft_iface dev_iface = {
    .name = dev_name,
    .alloc = dev_alloc,
    .free = dev_free,
};

static const char *nvme_name(void *ctx) { (void)ctx; return "nvme-accounting"; }

static int nvme_alloc(void *ctx, size_t bytes, size_t align, unsigned flags, void **out, unsigned *out_flags)
{
    (void)ctx; (void)bytes; (void)align; (void)flags; (void)out; (void)out_flags;
    return mw_error_set(-EINVAL, "nvme tier holds no host memory: use mw_tier_reserve (bytes live in the store)");
}

static void nvme_free(void *ctx, void *p, size_t bytes, unsigned bf) { (void)ctx; (void)p; (void)bytes; (void)bf; }
static int nvme_is_host(void *ctx) { (void)ctx; return 0; }

static const struct mw_buft_iface nvme_iface = {
    .name = nvme_name,
    .alloc = nvme_alloc,
    .free = nvme_free,
    .is_host = nvme_is_host,
};

const struct mw_buft_iface *mw_buft_builtin_(enum mw_tier_id id)
{
    switch (id) {
    case MW_TIER_DRAM: return &host_iface;
    case MW_TIER_DEVICE: return &dev_iface;
    case MW_TIER_NVME: return &nvme_iface;
    default: return NULL;
    }
}
