/*
 * optimizer_step.c — the trainer's optimizer is the offload engine (see optimizer_step.h for
 * why it sits behind an interface).
 * Weight decay follows GPT-2 practice: 2-D tensors (embeddings and linear weights) decay,
 * biases and LayerNorm parameters (1-D) are registered with MW_OFFLOAD_NO_DECAY. The model
 * accumulates its gradients itself (zero_grad, then backward adds), so the engine reads the
 * model's gradient array at update time (ext_grads_accumulate) and owns no gradient buffer; the
 * model's fp32 params are the engine's working copy (and, all in DRAM, its master).
 * The update is not armed during backward: global-norm clipping needs the whole norm before
 * the first subgroup is updated (docs/offload.md, two-phase clipping).
 */
#include "train/optimizer_step.h"
#include "train/acts.h"
#include "train/stream.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* mkdir -p for each ':'-separated NVMe directory (private: 0700 where created). */
static int mkdir_nvme(const char *dirs)
{
    char *p = strdup(dirs);
    if (!p) return mw_error_set(-ENOMEM, "out of memory");
    int err = 0;
    char *save = NULL;
    for (char *d = strtok_r(p, ":", &save); d && !err; d = strtok_r(NULL, ":", &save)) err = mw_mkdir_p(d, 0700);
    free(p);
    return err;
}

static int opt_init(struct mw_train_opt *o, struct mw_net *m, const struct mw_train_config *c,
                    uint64_t model_dram_bytes, uint64_t own_first, uint64_t own_n, int plan_only);

int mw_train_opt_init(struct mw_train_opt *o, struct mw_net *m, const struct mw_train_config *c,
                      uint64_t model_dram_bytes, uint64_t own_first, uint64_t own_n)
{
    return opt_init(o, m, c, model_dram_bytes, own_first, own_n, 0);
}

int mw_train_opt_plan_only(struct mw_train_opt *o, struct mw_net *m, const struct mw_train_config *c)
{
    return opt_init(o, m, c, 0, 0, 0, 1);
}

static int opt_init(struct mw_train_opt *o, struct mw_net *m, const struct mw_train_config *c,
                    uint64_t model_dram_bytes, uint64_t own_first, uint64_t own_n, int plan_only)
{
    memset(o, 0, sizeof *o);
    mw_offload_registry_init(&o->reg);
    int err = 0;
    if (own_n == 0) { own_first = 0; own_n = m->sizes.n_params; }
    if (own_first + own_n > m->sizes.n_params) {
        err = mw_error_set(-EINVAL, "owned range [%llu, +%llu) is outside the model's %zu parameters",
                           (unsigned long long)own_first, (unsigned long long)own_n, m->sizes.n_params);
        goto err;
    }
    o->tier = c->tier;
    o->own_first = own_first;
    o->n_params = own_n;
    o->params = m->params + own_first;
    o->beta1 = c->beta1;
    o->beta2 = c->beta2;
    o->eps = c->eps;
    o->weight_decay = c->weight_decay;
    /* The engine's flat space is the owned range: the tensors (or their pieces) inside it. */
    for (int i = 0; i < m->family->n_tensors(m); i++) {
        struct mw_net_tensor tt, *t = &tt;
        m->family->tensor(m, i, &tt);
        uint64_t a = MW_MAX((uint64_t)t->offset, own_first), b = MW_MIN((uint64_t)(t->offset + t->numel), own_first + own_n);
        if (a >= b) continue;
        unsigned flags = t->ndim == 2 ? 0 : MW_OFFLOAD_NO_DECAY;
        if (a == t->offset && b == t->offset + t->numel) {
            int64_t shape[2] = {(int64_t)t->shape[0], (int64_t)t->shape[1]};
            err = mw_offload_registry_add_ex(&o->reg, t->name, t->ndim, shape, flags);
        } else {
            char name[MW_OFFLOAD_NAME_MAX];
            snprintf(name, sizeof name, "%s[%llu:%llu]", t->name, (unsigned long long)(a - t->offset),
                     (unsigned long long)(b - t->offset));
            int64_t shape[1] = {(int64_t)(b - a)};
            err = mw_offload_registry_add_ex(&o->reg, name, 1, shape, flags);
        }
        if (err) goto err;
    }
    if (o->reg.total != o->n_params) {
        err = mw_error_set(-EINVAL, "model tensors hold %llu elements of the owned %zu",
                           (unsigned long long)o->reg.total, o->n_params);
        goto err;
    }
    struct mw_offload_config *cfg = &o->cfg;
    mw_offload_config_default(cfg);
    if (c->subgroup_size) cfg->subgroup_size = c->subgroup_size;
    if (c->buffer_count) cfg->buffer_count = c->buffer_count;
    if (c->io_block_size) cfg->io_block_size = c->io_block_size;
    if (c->io_queue_depth) cfg->io_queue_depth = c->io_queue_depth;
    cfg->preread = c->preread;
    if (c->tier == MW_TIER_NVME) {
        cfg->place.tier[MW_OFFLOAD_MASTER] = MW_TIER_NVME;
        cfg->place.tier[MW_OFFLOAD_MOMENTS] = MW_TIER_NVME;
        cfg->nvme_dir = c->nvme_dir ? c->nvme_dir : "run/nvme";
    }
    if (c->offload_policy) {
        int k = 2;
        if ((err = mw_offload_policy_parse(c->offload_policy, &cfg->policy, &k))) goto err;
        cfg->every_k = k;
        cfg->use_device = cfg->policy != MW_OFFLOAD_POLICY_ALL_CPU;
    }
    cfg->ext_weights = m->params + own_first;
    cfg->ext_grads = m->grads + own_first;
    cfg->ext_grads_accumulate = 1;
    /* Streamed weights (src/train/stream.c): the hook is planned for now (gradient objects on
     * NVMe), its user is set by the trainer once the stream exists. */
    cfg->stream = c->offload_params == MW_TIER_NVME;
    cfg->grads_dram = cfg->stream && c->keep_grads; /* (residency.c: kept or accumulated, one rank, batch-major) */
    if (c->acts_nvme) { /* the blocks' kept activations (src/train/acts.c) */
        cfg->scratch_bytes = mw_train_acts_scratch_bytes(m->n_layer, c->grad_accum, mw_net_act_slot_bytes(m));
        if (cfg->scratch_bytes == UINT64_MAX) {
            err = mw_error_set(-EOVERFLOW, "the kept activations of %d blocks x %d micro-batches overflow", m->n_layer,
                               c->grad_accum);
            goto err;
        }
    }
    cfg->cpu_threads = c->threads;
    cfg->trace = c->trace;
    cfg->journal = c->journal && c->tier == MW_TIER_NVME;
    cfg->resume = c->resume;
    if (c->dram_budget) {
        if (model_dram_bytes >= c->dram_budget) {
            char a[32], b[32];
            err = mw_error_set(MW_EBUDGET, "DRAM budget %s is used up by the model alone (params, grads and "
                               "activations: %s) before the optimizer state",
                               mw_fmt_bytes(a, sizeof a, c->dram_budget), mw_fmt_bytes(b, sizeof b, model_dram_bytes));
            goto err;
        }
        cfg->budget[MW_TIER_DRAM] = c->dram_budget - model_dram_bytes;
    }
    cfg->budget[MW_TIER_NVME] = c->nvme_budget;
    if (cfg->nvme_dir && !plan_only) {
        /* The plan checks the free space of the directory, so it must exist. */
        if ((err = mkdir_nvme(cfg->nvme_dir))) goto err;
    }
    if ((err = mw_offload_plan_make(&o->reg, cfg, &o->plan))) goto err;
    return 0;
err:
    mw_train_opt_free(o);
    return err;
}

void mw_train_opt_free(struct mw_train_opt *o)
{
    if (o->eng) mw_offload_free(o->eng);
    mw_offload_registry_free(&o->reg);
    memset(o, 0, sizeof *o);
}

/* The engine is created at first use, so weights loaded after mw_train_opt_init (safetensors,
 * checkpoint) are the master copy it writes to its tiers. */
static int ensure_engine(struct mw_train_opt *o)
{
    if (o->eng) return 0;
    return mw_offload_init(&o->eng, &o->reg, &o->cfg);
}

int mw_train_opt_ensure(struct mw_train_opt *o) { return ensure_engine(o); }

int mw_train_opt_load_master(struct mw_train_opt *o, uint64_t first, uint64_t n, const float *src, int64_t step)
{
    int err = ensure_engine(o);
    if (!err) err = mw_offload_set_committed_steps(o->eng, (uint64_t)step);
    /* first counts over the whole model; the engine holds [own_first, +n_params) of it. */
    uint64_t a = MW_MAX(first, o->own_first), b = MW_MIN(first + n, o->own_first + o->n_params);
    if (err || a >= b) return err;
    return mw_offload_write_raw(o->eng, MW_OFFLOAD_R_MASTER, a - o->own_first, b - a, src + (a - first));
}

int mw_train_opt_backward_begin(struct mw_train_opt *o, int last)
{
    o->err = 0;
    int err = ensure_engine(o);
    return err ? err : mw_offload_backward_begin(o->eng, last, NULL);
}

void mw_train_opt_grad_ready(size_t first_elem, size_t n_elems, void *user)
{
    struct mw_train_opt *o = user;
    if (o->err) return;
    uint64_t a = MW_MAX((uint64_t)first_elem, o->own_first);
    uint64_t b = MW_MIN((uint64_t)(first_elem + n_elems), o->own_first + o->n_params);
    if (a < b) o->err = mw_offload_grad_ready(o->eng, a - o->own_first, b - a);
}

int mw_train_opt_backward_end(struct mw_train_opt *o)
{
    int err = mw_offload_backward_end(o->eng);
    return o->err ? o->err : err;
}

int mw_train_opt_grad_norm(struct mw_train_opt *o, double *norm)
{
    int err = mw_offload_grad_norm(o->eng, norm);
    if (err == 0 && !isfinite(*norm)) err = MW_EOVERFLOW;
    return err;
}

static int align_steps(struct mw_train_opt *o, uint64_t done)
{
    return mw_offload_committed_steps(o->eng) == done ? 0 : mw_offload_set_committed_steps(o->eng, done);
}

/* After a failed step (err, message set): the committed state (the step before) is intact; put
 * the working copy back to it. Keeps the step's message, adding a failure of the recovery. */
static int recover_after(struct mw_train_opt *o, int err)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mw_error_msg());
    if (mw_offload_recover(o->eng))
        return mw_error_set(err, "%s; reading the committed state back failed too: %s", msg, mw_error_msg());
    return mw_error_set(err, "%s", msg);
}

static int step_(struct mw_train_opt *o, double lr, float grad_scale, int64_t t, int async)
{
    /* The engine's AdamW step number is its committed steps + 1; skipped steps keep it aligned. */
    int err = align_steps(o, (uint64_t)(t - 1));
    if (err) return err;
    struct mw_offload_hparams hp;
    mw_offload_hparams_default(&hp);
    hp.lr = lr;
    hp.beta1 = o->beta1;
    hp.beta2 = o->beta2;
    hp.eps = o->eps;
    hp.weight_decay = o->weight_decay;
    hp.grad_scale = grad_scale;
    err = async ? mw_offload_step_start(o->eng, &hp) : mw_offload_step(o->eng, &hp);
    return err && !async ? recover_after(o, err) : err;
}

int mw_train_opt_step(struct mw_train_opt *o, double lr, float grad_scale, int64_t t)
{
    return step_(o, lr, grad_scale, t, 0);
}

int mw_train_opt_step_start(struct mw_train_opt *o, double lr, float grad_scale, int64_t t)
{
    return step_(o, lr, grad_scale, t, 1);
}

int mw_train_opt_finish(struct mw_train_opt *o)
{
    if (!o->eng || !mw_offload_step_in_flight(o->eng)) return 0;
    int err = mw_offload_step_wait(o->eng);
    return err ? recover_after(o, err) : 0;
}

int mw_train_opt_in_flight(const struct mw_train_opt *o) { return o->eng && mw_offload_step_in_flight(o->eng); }

int mw_train_opt_wait_range(struct mw_train_opt *o, uint64_t first, uint64_t n, int block)
{
    if (!mw_train_opt_in_flight(o) || !n) return 1;
    uint64_t a = MW_MAX(first, o->own_first), b = MW_MIN(first + n, o->own_first + o->n_params);
    if (a >= b) return 1;
    uint64_t S = o->plan.subgroup_size;
    for (uint64_t g = (a - o->own_first) / S; g <= (b - 1 - o->own_first) / S; g++) {
        int r = mw_offload_sg_wait_weights(o->eng, (uint32_t)g, block);
        /* A failed step: wait for its end, which says what stays committed, and recover. */
        if (r < 0) return mw_train_opt_finish(o);
        if (r == 0) return 0;
    }
    return 1;
}

int mw_train_opt_skip(struct mw_train_opt *o, int64_t t)
{
    int err = mw_offload_skip_step(o->eng);
    return err ? err : align_steps(o, (uint64_t)t);
}

void mw_train_opt_bytes(const struct mw_train_opt *o, uint64_t *dram, uint64_t *nvme)
{
    *dram = o->plan.tier_bytes[MW_TIER_DRAM];
    *nvme = o->plan.tier_bytes[MW_TIER_NVME];
}

void mw_train_opt_stats(const struct mw_train_opt *o, struct mw_offload_stats *s)
{
    if (o->eng) mw_offload_stats_get(o->eng, s);
    else memset(s, 0, sizeof *s);
}

uint64_t mw_train_opt_state_bytes(const struct mw_train_opt *o)
{
    return 2ull * o->n_params * sizeof(float);
}

/* Pieces of one subgroup: the engine reads and writes the state a subgroup at a time. */
static uint64_t piece_elems(const struct mw_train_opt *o)
{
    uint64_t n = o->plan.subgroup_size ? o->plan.subgroup_size : (1u << 20);
    return MW_MIN(n, (uint64_t)o->n_params);
}

int mw_train_opt_save(const struct mw_train_opt *o, mw_train_io_fn write, void *user)
{
    static const int regions[2] = {MW_OFFLOAD_R_EXP_AVG, MW_OFFLOAD_R_EXP_AVG_SQ};
    struct mw_train_opt *mo = (struct mw_train_opt *)o; /* the engine reads its tiers: not const */
    int err = ensure_engine(mo);
    if (err) return err;
    uint64_t piece = piece_elems(o);
    float *buf = malloc(piece * sizeof *buf);
    if (!buf) return mw_error_set(-ENOMEM, "no memory for a checkpoint piece (%llu elements)", (unsigned long long)piece);
    for (int r = 0; r < 2 && !err; r++)
        for (uint64_t a = 0; a < o->n_params && !err; a += piece) {
            uint64_t n = MW_MIN(piece, o->n_params - a);
            if (!(err = mw_offload_read_raw(mo->eng, regions[r], a, n, buf))) err = write(user, buf, n * sizeof *buf);
        }
    free(buf);
    return err;
}

int mw_train_opt_load(struct mw_train_opt *o, mw_train_io_fn read, void *user, int64_t step)
{
    static const int regions[2] = {MW_OFFLOAD_R_EXP_AVG, MW_OFFLOAD_R_EXP_AVG_SQ};
    int err = ensure_engine(o);
    /* Move the committed slot first: the writes below then land in it. */
    if (!err) err = mw_offload_set_committed_steps(o->eng, (uint64_t)step);
    if (err) return err;
    uint64_t piece = piece_elems(o);
    float *buf = malloc(piece * sizeof *buf);
    if (!buf) return mw_error_set(-ENOMEM, "no memory for a checkpoint piece (%llu elements)", (unsigned long long)piece);
    for (int r = 0; r < 2 && !err; r++)
        for (uint64_t a = 0; a < o->n_params && !err; a += piece) {
            uint64_t n = MW_MIN(piece, o->n_params - a);
            if (!(err = read(user, buf, n * sizeof *buf))) err = mw_offload_write_raw(o->eng, regions[r], a, n, buf);
        }
    /* The master copy from the checkpoint's weights (already in the model's params). Through a
     * copy: a MASTER write also refreshes the working copy, which is those params. Streamed
     * weights were written by mw_train_opt_load_master instead. */
    for (uint64_t a = 0; a < o->n_params && !err && !o->cfg.stream; a += piece) {
        uint64_t n = MW_MIN(piece, o->n_params - a);
        memcpy(buf, o->params + a, n * sizeof *buf);
        err = mw_offload_write_raw(o->eng, MW_OFFLOAD_R_MASTER, a, n, buf);
    }
    free(buf);
    return err;
}
