/*
 * optimizer_step.c — AdamW over fp32 moments in DRAM through optim.h's slice kernel (see
 * optimizer_step.h for why this sits behind an interface).
 * Weight decay follows GPT-2 practice: 2-D tensors (embeddings and linear weights) decay,
 * biases and LayerNorm parameters do not. Adjacent tensors with the same decay are merged
 * into one range, so a step is a few calls per block rather than one per tensor; optim.h
 * guarantees that any cut of the array gives bitwise the same result.
 */
#include "train/optimizer_step.h"
#include "memwall/common.h"
#include "memwall/optim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int mw_train_opt_init(struct mw_train_opt *o, const struct mw_gpt2 *m, const struct mw_train_config *c)
{
    memset(o, 0, sizeof *o);
    if (c->tier != MW_OPT_TIER_DRAM)
        return mw_error_set(-ENOTSUP, "the NVMe optimizer tier needs the offload engine, which is not built yet; "
                            "use --optimizer-tier dram");
    int err = 0;
    o->tier = c->tier;
    o->n_params = m->sizes.n_params;
    o->beta1 = c->beta1;
    o->beta2 = c->beta2;
    o->eps = c->eps;
    o->threads = c->threads;
    size_t bytes = MW_ALIGN_UP(o->n_params * sizeof(float), 64);
    o->m = aligned_alloc(64, bytes);
    o->v = aligned_alloc(64, bytes);
    o->ranges = calloc((size_t)m->n_tensors, sizeof *o->ranges);
    if (!o->m || !o->v || !o->ranges) {
        err = mw_error_set(-ENOMEM, "no memory for the optimizer state (2 x %zu bytes)", bytes);
        goto err;
    }
    memset(o->m, 0, bytes);
    memset(o->v, 0, bytes);
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m->tensors[i];
        double wd = t->ndim == 2 ? c->weight_decay : 0.0;
        struct mw_train_opt_range *last = o->nranges ? &o->ranges[o->nranges - 1] : NULL;
        if (last && last->weight_decay == wd && last->first + last->n == t->offset) last->n += t->numel;
        else o->ranges[o->nranges++] = (struct mw_train_opt_range){t->offset, t->numel, wd};
    }
    return 0;
err:
    mw_train_opt_free(o);
    return err;
}

void mw_train_opt_free(struct mw_train_opt *o)
{
    free(o->m);
    free(o->v);
    free(o->ranges);
    memset(o, 0, sizeof *o);
}

int mw_train_opt_backward_begin(struct mw_train_opt *o, int last)
{
    (void)last; /* DRAM: the update runs after backward, in mw_train_opt_step */
    o->err = 0;
    return 0;
}

void mw_train_opt_grad_ready(size_t first_elem, size_t n_elems, void *user)
{
    (void)first_elem; (void)n_elems; (void)user; /* offload engine: mw_offload_grad_ready here */
}

int mw_train_opt_backward_end(struct mw_train_opt *o)
{
    return o->err;
}

int mw_train_opt_grad_norm(struct mw_train_opt *o, const float *grads, double *norm)
{
    const struct mw_optim_exec ex = {o->threads, MW_SIMD_AUTO, 0};
    double sumsq = 0;
    int err = mw_grad_sumsq(MW_OPTIM_F32, grads, o->n_params, 1.0f, &ex, &sumsq);
    *norm = sqrt(sumsq);
    if (err == 0 && !isfinite(*norm)) err = MW_EOVERFLOW;
    return err;
}

int mw_train_opt_step(struct mw_train_opt *o, float *params, const float *grads, double lr,
                      float grad_scale, int64_t t)
{
    const struct mw_optim_format fmt = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE};
    const struct mw_optim_exec ex = {o->threads, MW_SIMD_AUTO, 0};
    for (int i = 0; i < o->nranges; i++) {
        const struct mw_train_opt_range *r = &o->ranges[i];
        struct mw_adamw_hp hp = {lr, o->beta1, o->beta2, o->eps, r->weight_decay, t, grad_scale};
        struct mw_optim_slice s = {
            .n = r->n, .offset = r->first, .master = params + r->first, .grad = grads + r->first,
            .m = o->m + r->first, .v = o->v + r->first,
        };
        int err = mw_adamw_step(&fmt, &hp, &s, &ex);
        if (err) return err;
    }
    return 0;
}

void mw_train_opt_bytes(const struct mw_train_opt *o, uint64_t *dram, uint64_t *nvme)
{
    *dram = 2ull * o->n_params * sizeof(float);
    *nvme = 0;
}

uint64_t mw_train_opt_state_bytes(const struct mw_train_opt *o)
{
    return 2ull * o->n_params * sizeof(float);
}

int mw_train_opt_save(const struct mw_train_opt *o, mw_train_io_fn write, void *user)
{
    int err = write(user, o->m, o->n_params * sizeof(float));
    return err ? err : write(user, o->v, o->n_params * sizeof(float));
}

int mw_train_opt_load(struct mw_train_opt *o, mw_train_io_fn read, void *user)
{
    int err = read(user, o->m, o->n_params * sizeof(float));
    return err ? err : read(user, o->v, o->n_params * sizeof(float));
}
