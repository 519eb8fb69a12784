/*
 * residency.c — the two residency implementations that keep every weight in DRAM on this
 * rank's address space: "resident" (one process, today's single-rank path) and "zero" (data
 * parallel over MPI; ZeRO-3 gathers and releases units). The NVMe one is stream.c. Why here
 * and not in the trainer: the trainer's loop then reads the same for all of them
 * (residency.h).
 */
#include "train/residency.h"
#include "memwall/common.h"
#include "train/optimizer_step.h"
#include "train/zero.h"

#include <math.h>

/* ---------------------------------------------------------------- resident */

static int res_pass_begin(void *self, int training) { (void)self; (void)training; return 0; }

/* The update of the last step may still be running (overlapped): a unit waits for its own
 * subgroups before the pass reads it. */
static int res_weights(void *self, int event, int unit, int backward)
{
    struct mw_trainer *tr = self;
    (void)backward;
    if (event != MW_NET_UNIT_ACQUIRE || !tr->overlap) return 0;
    size_t a, n;
    int err = mw_net_unit_range(&tr->model, unit, &a, &n);
    if (!err) err = mw_train_opt_wait_range(tr->opt, a, n, 1);
    return err < 0 ? err : 0;
}
static int res_noop(void *self) { (void)self; return 0; }
static int res_unit_noop(void *self, int unit) { (void)self; (void)unit; return 0; }

static int res_step_begin(void *self)
{
    struct mw_trainer *tr = self;
    mw_net_zero_grad(&tr->model);
    return 0;
}

static int res_backward_begin(void *self, int micro, int last) { (void)self; (void)micro; (void)last; return 0; }

static void res_grad_ready(size_t first, size_t n, void *self)
{
    struct mw_trainer *tr = self;
    mw_train_opt_grad_ready(first, n, tr->opt);
}

static int res_grad_norm(void *self, double *norm)
{
    struct mw_trainer *tr = self;
    return mw_train_opt_grad_norm(tr->opt, norm);
}

static void res_bytes(void *self, uint64_t *params, uint64_t *grads)
{
    struct mw_trainer *tr = self;
    *params = tr->model.sizes.params_bytes;
    *grads = tr->model.sizes.grads_bytes;
}

static const struct mw_residency_ops resident_ops = {
    .name = "resident",
    .weights = res_weights,
    .pass_begin = res_pass_begin,
    .step_begin = res_step_begin,
    .backward_begin = res_backward_begin,
    .grad_ready = res_grad_ready,
    .backward_end = res_noop,
    .grad_norm = res_grad_norm,
    .after_step = res_noop,
    .save_begin = res_noop,
    .unit_get = res_unit_noop,
    .unit_put = res_unit_noop,
    .save_end = res_noop,
    .bytes = res_bytes,
};

void mw_residency_resident(struct mw_residency *r, struct mw_trainer *tr)
{
    r->ops = &resident_ops;
    r->self = tr;
}

/* ---------------------------------------------------------------- zero (data parallel) */

static struct mw_train_zero *zof(void *self) { return ((struct mw_trainer *)self)->zero; }

static int z_weights(void *self, int event, int unit, int backward)
{
    return mw_train_zero_weights_hook(zof(self), event, unit, backward);
}
static int z_pass_begin(void *self, int training)
{
    struct mw_trainer *tr = self;
    return mw_train_zero_pass_begin(tr->zero, training, tr->cfg.layer_major);
}
static int z_step_begin(void *self)
{
    mw_train_zero_step_begin(zof(self));
    return 0;
}
static int z_backward_begin(void *self, int micro, int last)
{
    mw_train_zero_backward_begin(zof(self), micro, last);
    return 0;
}
static void z_grad_ready(size_t first, size_t n, void *self) { mw_train_zero_grad_ready(first, n, zof(self)); }
static int z_backward_end(void *self) { return mw_train_zero_backward_end(zof(self)); }

/* Stage 0: the engine's norm of the averaged gradients; stages 1-3: each shard rank's owned
 * sum of squares, exchanged and summed in rank order. */
static int z_grad_norm(void *self, double *norm)
{
    struct mw_trainer *tr = self;
    struct mw_train_zero *z = tr->zero;
    if (z->stage == 0) return mw_train_opt_grad_norm(tr->opt, norm);
    double local, global;
    int err = mw_train_zero_local_sumsq(z, &local);
    if (!err) err = mw_train_zero_sumsq(z, local, &global);
    if (err) return err;
    *norm = sqrt(global);
    return isfinite(*norm) ? 0 : MW_EOVERFLOW;
}
static int z_after_step(void *self) { return mw_train_zero_after_step(zof(self)); }
static int z_save_begin(void *self) { return mw_train_zero_gather_all(zof(self)); }
static int z_save_end(void *self) { return mw_train_zero_release_all(zof(self)); }

static void z_bytes(void *self, uint64_t *params, uint64_t *grads)
{
    struct mw_trainer *tr = self;
    const struct mw_train_zero *z = tr->zero;
    /* ZeRO-3 keeps only the owned shard of the weights; gathered units come and go (measured:
     * mw_trainer_zero_info, trace counter "zero3 resident weights"). ZeRO-2/3 keep the owned
     * gradients; the other buckets live only until they are reduced. */
    *params = z->stage == 3 ? z->own.n * sizeof(float) : tr->model.sizes.params_bytes;
    *grads = z->stage >= 2 ? z->own.n * sizeof(float) : tr->model.sizes.grads_bytes;
}

static const struct mw_residency_ops zero_ops = {
    .name = "zero",
    .weights = z_weights,
    .pass_begin = z_pass_begin,
    .step_begin = z_step_begin,
    .backward_begin = z_backward_begin,
    .grad_ready = z_grad_ready,
    .backward_end = z_backward_end,
    .grad_norm = z_grad_norm,
    .after_step = z_after_step,
    .save_begin = z_save_begin,
    .unit_get = res_unit_noop,
    .unit_put = res_unit_noop,
    .save_end = z_save_end,
    .bytes = z_bytes,
};

void mw_residency_zero(struct mw_residency *r, struct mw_trainer *tr)
{
    r->ops = &zero_ops;
    r->self = tr;
}
