/*
 * acts.c — the blocks' activations of a layer-major step on NVMe (see acts.h for why).
 *
 * Entry (l, k) = block l's forward of micro-batch k; its tag l * nmb + k is also its place in
 * the scratch object (slot_bytes each). Forward fills entries in tag order, each into slot
 * tag % nslots, and writes it out at once (a slot is refilled only when its write is done).
 * Backward takes them in its own order (blocks L-1..0, micro-batches 0..nmb-1 inside each, the
 * order of the gradient sums) and keeps reads going for the next nslots entries into slots no
 * entry of that window needs; an entry still in a slot from forward (the last block's) is not
 * read back at all. Waits the training thread sees are traced as residency "wait" spans.
 */
#include "train/acts.h"
#include "memwall/common.h"
#include "memwall/model.h"
#include "memwall/offload.h"
#include "memwall/trace.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

size_t mw_train_acts_slot_bytes(size_t model_slot_bytes)
{
    return MW_ALIGN_UP(model_slot_bytes, (size_t)MW_OFFLOAD_SCRATCH_ALIGN);
}

uint64_t mw_train_acts_scratch_bytes(int L, int nmb, size_t model_slot_bytes)
{
    uint64_t r;
    if (L < 1 || nmb < 1 || mw_mul_u64((uint64_t)L * (uint64_t)nmb, mw_train_acts_slot_bytes(model_slot_bytes), &r))
        return UINT64_MAX;
    return r;
}

int mw_train_acts_init(struct mw_train_acts *a, int L, int nmb, size_t model_slot_bytes, struct mw_trace *trace)
{
    memset(a, 0, sizeof *a);
    size_t slot_bytes = mw_train_acts_slot_bytes(model_slot_bytes);
    if (L < 1 || nmb < 1 || !slot_bytes || slot_bytes % 4096)
        return mw_error_set(-EINVAL, "kept activations: %d blocks x %d micro-batches of %zu bytes", L, nmb, slot_bytes);
    a->L = L;
    a->nmb = nmb;
    a->nslots = MW_TRAIN_ACT_SLOTS;
    a->slot_bytes = slot_bytes;
    a->trace = trace;
    size_t bytes = slot_bytes * (size_t)a->nslots;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return mw_error_set(-ENOMEM, "kept activations: no memory for %d slots of %zu bytes", a->nslots, slot_bytes);
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice only */
    a->mem = p;
    for (int i = 0; i < a->nslots; i++) a->slot[i].tag = -1;
    return 0;
}

static float *buf_of(const struct mw_train_acts *a, const struct mw_train_act_slot *s)
{
    return a->mem + (size_t)(s - a->slot) * (a->slot_bytes / sizeof(float));
}

static void span(struct mw_train_acts *a, const char *name, int64_t tag, uint64_t bytes, uint64_t t0, uint64_t t1)
{
    if (!a->trace) return;
    struct mw_trace_arg w[3] = {{"unit", tag / a->nmb + 1}, {"bytes", (int64_t)bytes}, {"step", a->step}};
    mw_trace_span(a->trace, "residency", name, t0, t1, w, 3);
}

/* Ends the slot's I/O (waiting if it is not done: an exposed wait). */
static int io_finish(struct mw_train_acts *a, struct mw_train_act_slot *s)
{
    if (!s->io) return 0;
    uint64_t t0 = mw_now_ns();
    int done = mw_offload_io_test(&s->req);
    int err = mw_offload_io_wait(a->eng, &s->req);
    uint64_t t1 = mw_now_ns();
    int write = s->io == 1;
    s->io = 0;
    if (!done) {
        a->wait_ns += t1 - t0;
        span(a, "wait", s->tag, 0, t0, t1);
    }
    if (err) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mw_error_msg());
        s->valid = 0;
        return mw_error_set(err, "kept activations: %s block %lld, micro-batch %lld on NVMe failed: %s",
                            write ? "writing" : "reading", (long long)(s->tag / a->nmb), (long long)(s->tag % a->nmb),
                            why);
    }
    span(a, write ? "act_write" : "act_read", s->tag, a->slot_bytes, s->t0, t1);
    if (write) a->write_bytes += a->slot_bytes;
    else { a->read_bytes += a->slot_bytes; s->valid = 1; }
    return 0;
}

static int io_start(struct mw_train_acts *a, struct mw_train_act_slot *s, int write)
{
    int err = mw_offload_scratch_start(a->eng, write, (uint64_t)s->tag * a->slot_bytes, a->slot_bytes, buf_of(a, s),
                                       &s->req);
    if (err) return err;
    s->io = write ? 1 : 2;
    s->t0 = mw_now_ns();
    return 0;
}

/* Tag of backward's entry j (blocks from the last, micro-batches in order); -1 past the end. */
static int64_t bwd_tag(const struct mw_train_acts *a, int64_t j)
{
    if (j < 0 || j >= (int64_t)a->L * a->nmb) return -1;
    return (int64_t)(a->L - 1 - j / a->nmb) * a->nmb + j % a->nmb;
}

static int in_window(const struct mw_train_acts *a, int64_t tag)
{
    for (int64_t j = a->bwd_pos; j < a->bwd_pos + a->nslots; j++)
        if (tag >= 0 && bwd_tag(a, j) == tag) return 1;
    return 0;
}

static struct mw_train_act_slot *find(struct mw_train_acts *a, int64_t tag)
{
    for (int i = 0; i < a->nslots; i++)
        if (a->slot[i].tag == tag && (a->slot[i].valid || a->slot[i].io == 2)) return &a->slot[i];
    return NULL;
}

/* Reads for backward's next nslots entries, each into a slot that no entry of the window needs
 * (block = 0: not into one whose write is still in flight). */
static int issue_window(struct mw_train_acts *a, int block)
{
    for (int64_t j = a->bwd_pos; j < a->bwd_pos + a->nslots; j++) {
        int64_t t = bwd_tag(a, j);
        if (t < 0) break;
        if (find(a, t)) continue;
        struct mw_train_act_slot *v = NULL;
        for (int pass = 0; pass < 2 && !v; pass++)
            for (int i = 0; i < a->nslots && !v; i++) {
                struct mw_train_act_slot *s = &a->slot[i];
                if (s->busy || (in_window(a, s->tag) && (s->valid || s->io == 2))) continue;
                if (s->io && (pass == 0 || !block)) continue; /* idle slots first */
                v = s;
            }
        if (!v) break;
        int err = io_finish(a, v);
        if (err) return err;
        v->tag = t;
        v->valid = 0;
        if ((err = io_start(a, v, 0))) return err;
    }
    return 0;
}

static int finish_all(struct mw_train_acts *a)
{
    int err = 0;
    for (int i = 0; i < a->nslots; i++) {
        int e = io_finish(a, &a->slot[i]);
        if (e && !err) err = e;
    }
    return err;
}

int mw_train_acts_call(void *user, int event, int layer, int mb, float **buf)
{
    struct mw_train_acts *a = user;
    if (!a->eng) return mw_error_set(-EINVAL, "kept activations: no engine (internal)");
    if (layer < 0 || layer >= a->L || mb < 0 || mb >= a->nmb)
        return mw_error_set(-EINVAL, "kept activations: block %d, micro-batch %d outside %d x %d", layer, mb, a->L, a->nmb);
    int64_t t = (int64_t)layer * a->nmb + mb;
    struct mw_train_act_slot *s;
    int err;
    switch (event) {
    case MW_NET_ACTS_FILL:
        if (t == 0) { /* a new step: nothing of the last one is needed */
            if ((err = finish_all(a))) return err;
            for (int i = 0; i < a->nslots; i++) { a->slot[i].tag = -1; a->slot[i].valid = a->slot[i].busy = 0; }
            a->in_backward = 0;
            a->bwd_pos = 0;
        }
        s = &a->slot[t % a->nslots];
        if (a->in_backward || s->busy)
            return mw_error_set(-EINVAL, "kept activations: block %d, micro-batch %d filled out of order", layer, mb);
        if ((err = io_finish(a, s))) return err;
        s->tag = t;
        s->valid = 0;
        s->busy = 1;
        *buf = buf_of(a, s);
        return 0;
    case MW_NET_ACTS_FILLED:
        s = &a->slot[t % a->nslots];
        if (s->tag != t || !s->busy)
            return mw_error_set(-EINVAL, "kept activations: block %d, micro-batch %d was not being filled", layer, mb);
        s->busy = 0;
        s->valid = 1;
        if ((err = io_start(a, s, 1))) return err;
        if (t == (int64_t)a->L * a->nmb - 1) { /* forward is over: backward's first reads can start */
            a->in_backward = 1;
            a->bwd_pos = 0;
            return issue_window(a, 0);
        }
        return 0;
    case MW_NET_ACTS_GET:
        if (!a->in_backward || bwd_tag(a, a->bwd_pos) != t)
            return mw_error_set(-EINVAL, "kept activations: backward asked for block %d, micro-batch %d out of order",
                                layer, mb);
        if ((err = issue_window(a, 1))) return err;
        if (!(s = find(a, t))) return mw_error_set(-EINVAL, "kept activations: no slot for block %d (internal)", layer);
        if (s->io == 2 && (err = io_finish(a, s))) return err;
        s->busy = 1;
        *buf = buf_of(a, s);
        return 0;
    case MW_NET_ACTS_DONE:
        s = find(a, t);
        if (!s || !s->busy)
            return mw_error_set(-EINVAL, "kept activations: block %d, micro-batch %d was not in use", layer, mb);
        s->busy = 0;
        a->bwd_pos++;
        if (a->bwd_pos == (int64_t)a->L * a->nmb) return finish_all(a); /* the step leaves nothing in flight */
        return issue_window(a, 0);
    default:
        return mw_error_set(-EINVAL, "kept activations: unknown event %d", event);
    }
}

void mw_train_acts_free(struct mw_train_acts *a)
{
    if (a->eng) (void)finish_all(a); /* a failure here has no one to tell */
    if (a->mem) munmap(a->mem, a->slot_bytes * (size_t)a->nslots);
    memset(a, 0, sizeof *a);
}
