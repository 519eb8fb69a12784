/*
 * objects.c — the engine's NVMe object service: the objects a caller reads and writes beside the
 * update (a subgroup's committed fp32 master, its gradient object, the scratch that holds kept
 * activations), each transfer a handle (struct mw_offload_io) the caller polls
 * (mw_offload_io_test) or waits on (mw_offload_io_wait). Why apart from the update pipeline
 * (pipeline.c): these transfers run on the training thread's schedule, not the update's; they
 * share only the store and the committed slot, and the caller never touches the store itself
 * (src/train includes no store.h).
 */
#include "memwall/offload.h"
#include "memwall/common.h"
#include "offload/internal.h"

#include <pthread.h>
#include <string.h>

int mw_offload_io_test(struct mw_offload_io *h)
{
    return mw_store_test(&h->s);
}

int mw_offload_master_fetch(struct mw_offload *e, uint32_t sg, void *dst, struct mw_offload_io *h)
{
    struct mw_store_io *io = &h->s;
    if (!e->store || e->cfg.place.tier[MW_OFFLOAD_MASTER] != MW_TIER_NVME)
        return mw_error_set(-EINVAL, "offload master fetch: the master weights are not on NVMe");
    if (sg >= e->nsg) return mw_error_set(-EINVAL, "offload master fetch: no subgroup %u (%u)", sg, e->nsg);
    if ((uintptr_t)dst % MW_STORE_ALIGN) return mw_error_set(-EINVAL, "offload master fetch: buffer not 4096-aligned");
    /* During a step in flight a subgroup already written reads from the slot being committed. */
    pthread_mutex_lock(&e->mu);
    int inflight = e->in_flight, done = e->st[sg].state == OFL_SG_DONE;
    pthread_mutex_unlock(&e->mu);
    if (inflight && !done)
        return mw_error_set(-EBUSY, "offload master fetch: subgroup %u is being updated (mw_offload_sg_wait first)", sg);
    ofl_obj_io(io, e->obj[2 * sg + (int)((e->committed + (inflight ? 1 : 0)) % 2)], MW_AIO_READ,
               MW_ALIGN_UP(4 * e->sgs[sg].n, OFL_PAD), dst);
    io->flags = MW_AIO_URGENT; /* a forward or backward pass will wait for it */
    return mw_store_submit(e->store, io);
}

int mw_offload_grads_put_start(struct mw_offload *e, uint32_t sg, const void *src, struct mw_offload_io *h)
{
    struct mw_store_io *io = &h->s;
    if (!e->gobj) return mw_error_set(-EINVAL, "offload: gradients are kept on NVMe only when streaming");
    if (sg >= e->nsg) return mw_error_set(-EINVAL, "offload: no subgroup %u (%u)", sg, e->nsg);
    ofl_obj_io(io, e->gobj[sg], MW_AIO_WRITE, MW_ALIGN_UP(4 * e->sgs[sg].n, OFL_PAD), (void *)src);
    return mw_store_submit(e->store, io);
}

void mw_offload_grads_resident(struct mw_offload *e, int on)
{
    pthread_mutex_lock(&e->mu); /* the pipe thread reads it under the mutex when a step runs */
    e->grads_resident = on && e->gobj;
    pthread_mutex_unlock(&e->mu);
}

int mw_offload_scratch_start(struct mw_offload *e, int write, uint64_t offset, uint64_t len, void *buf,
                             struct mw_offload_io *h)
{
    struct mw_store_io *io = &h->s;
    if (!e->scratch) return mw_error_set(-EINVAL, "offload: no NVMe scratch (config scratch_bytes is 0)");
    uint64_t end;
    if (offset % MW_OFFLOAD_SCRATCH_ALIGN || len % MW_OFFLOAD_SCRATCH_ALIGN || (uintptr_t)buf % MW_STORE_ALIGN || mw_add_u64(offset, len, &end) ||
        end > e->plan.scratch_bytes)
        return mw_error_set(-EINVAL, "offload scratch: %llu bytes at %llu: not whole 64 KiB blocks from an aligned "
                            "buffer inside the %llu bytes of scratch", (unsigned long long)len,
                            (unsigned long long)offset, (unsigned long long)e->plan.scratch_bytes);
    ofl_obj_io(io, e->scratch, write ? MW_AIO_WRITE : MW_AIO_READ, len, buf);
    io->offset = offset;
    if (!write) io->flags = MW_AIO_URGENT; /* the backward pass waits for saved activations */
    return mw_store_submit(e->store, io);
}

int mw_offload_io_wait(struct mw_offload *e, struct mw_offload_io *h)
{
    struct mw_store_io *io = &h->s;
    int rc = mw_store_wait(e->store, io);
    if (rc && e->scratch && io->obj == e->scratch)
        return mw_error_set(rc, "offload: %s of %llu bytes of the scratch (kept activations) failed: %s",
                            io->op == MW_AIO_WRITE ? "a write" : "a read", (unsigned long long)io->len, mw_error_msg());
    if (rc) { /* the objects these transfers move: a subgroup's gradients, or its master weights */
        uint32_t sg = 0;
        while (sg < e->nsg && io->obj != e->obj[2 * sg] && io->obj != e->obj[2 * sg + 1] && !(e->gobj && io->obj == e->gobj[sg]))
            sg++;
        return mw_error_set(rc, "offload: %s of subgroup %u's %s (%llu bytes) failed: %s",
                            io->op == MW_AIO_WRITE ? "a write" : "a read", sg,
                            e->gobj && sg < e->nsg && io->obj == e->gobj[sg] ? "gradients" : "master weights",
                            (unsigned long long)io->len, mw_error_msg());
    }
    pthread_mutex_lock(&e->mu);
    if (io->op == MW_AIO_WRITE) e->stats.nvme_write_bytes += io->len;
    else e->stats.nvme_read_bytes += io->len;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

