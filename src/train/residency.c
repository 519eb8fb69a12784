/*
 * residency.c — the factory of the unit-residency machine (residency.h) and the two
 * implementations that keep every weight in this rank's address space: "resident" (one process)
 * and "zero" (data parallel over MPI; under ZeRO-3 the source "peers" gathers and releases units
 * through units.c). The NVMe source is stream.c. Why the factory is here and not in the trainer:
 * which source, which reduction and which schedule a run has is decided once, from the resolved
 * configuration, and the trainer's loop then reads the same for all of them.
 *
 *   source (where a unit's bytes come from)   reduction (how its gradients leave)
 *   dram     resident, nothing to do            none            one rank: to the optimizer
 *   peers    ZeRO-3 all-gather (zero.c)         allreduce       ZeRO-0 (zero.c)
 *   nvme     the optimizer's master (stream.c)  reduce-scatter  ZeRO-1..3 to the owner (zero.c)
 *
 * Every source works with every reduction and both schedules (tests/mpi_train_layer_major.sh,
 * mpi_train_stream.sh, cli_train_stream.sh).
 */
#include "train/residency.h"
#include "memwall/comm.h"
#include "memwall/common.h"
#include "memwall/plan.h"
#include "train/acts.h"
#include "train/optimizer_step.h"
#include "train/stream.h"
#include "train/zero.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

static void use_resident(struct mw_residency *r, struct mw_trainer *tr)
{
    r->ops = &resident_ops;
    r->self = tr;
}

/* ---------------------------------------------------------------- zero (data parallel) */

static struct mw_train_zero *zof(void *self) { return ((struct mw_trainer *)self)->res->zero; }

static int z_weights(void *self, int event, int unit, int backward)
{
    return mw_train_zero_weights_hook(zof(self), event, unit, backward);
}
static int z_pass_begin(void *self, int training)
{
    struct mw_trainer *tr = self;
    return mw_train_zero_pass_begin(tr->res->zero, training, tr->cfg.layer_major);
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
    struct mw_train_zero *z = tr->res->zero;
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
    const struct mw_train_zero *z = tr->res->zero;
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

static void use_zero(struct mw_residency *r, struct mw_trainer *tr)
{
    r->ops = &zero_ops;
    r->self = tr;
}

/* ---------------------------------------------------------------- the streamed source's plan */

/* The model's arrays are allocated lazily by the kernel: a run that asks for more than the machine
 * has starts, and is killed by the OOM killer in its first forward pass. Refused here instead,
 * against what the machine has available now, with the numbers and what to lower. */
static int check_memory(const struct mw_net_config *mc, const struct mw_net_options *mo, int streaming, int opt_dram)
{
    struct mw_net_sizes z;
    int err = mw_net_sizes(mc, mo, &z);
    if (err) return err;
    uint64_t need = z.acts_bytes, avail = mw_mem_available();
    if (!streaming && (mw_add_u64(need, z.params_bytes, &need) || mw_add_u64(need, z.grads_bytes, &need)))
        need = UINT64_MAX;
    /* The optimizer in DRAM: two fp32 moments per parameter at least (the engine's own plan
     * checks the rest against the DRAM budget, dram_budget). */
    if (opt_dram && (mw_add_u64(need, 2 * z.params_bytes, &need))) need = UINT64_MAX;
    if (!avail || need <= avail) return 0;
    char a[32], b[32], c[32];
    return mw_error_set(-ENOMEM, "the run's arrays need %s (activations %s for %d x %d tokens per micro-batch%s%s) and "
                        "this machine has %s available (MemAvailable): lower the micro-batch (batch) or the sequence "
                        "length (seq), turn on recomputation (recompute)%s%s",
                        mw_fmt_bytes(a, sizeof a, need), mw_fmt_bytes(b, sizeof b, z.acts_bytes), mo->max_batch,
                        mo->max_seq, streaming ? "" : ", weights and gradients", opt_dram ? ", the optimizer's moments" : "",
                        mw_fmt_bytes(c, sizeof c, avail), opt_dram ? ", put the optimizer state on NVMe (tier nvme)" : "",
                        streaming ? "" : ", or stream the weights from NVMe (offload_params nvme)");
}

/* The streamed run's DRAM plan from the model and the optimizer's plan: the trainer and
 * mw_train_plan_stream (memwall plan --stream) both come here. */
int mw_residency_stream_plan(const struct mw_net *m, const struct mw_train_opt *o, const struct mw_train_config *cfg,
                       const struct mw_train_zero *z, struct mw_plan_stream *out)
{
    mw_net_warm_runtime(m); /* the baseline includes the matrix library's buffers */
    struct mw_model d; /* the family's description: what the planner reads */
    m->family->config_describe(m->cfg.raw, &d);
    /* The model's activations (with kept activations on NVMe its own block set is lent out:
     * slot 0 stands in, never touched), what a layer-major step or the lookups keep per
     * micro-batch, the kept activations' slots. */
    uint64_t acts = m->sizes.acts_bytes - (cfg->acts_nvme ? mw_net_own_block_bytes(m) : 0);
    acts += cfg->layer_major ? mw_net_lm_bytes(m, cfg->grad_accum, cfg->acts_nvme) : mw_net_defer_bytes(m, cfg->grad_accum);
    if (cfg->acts_nvme) acts += MW_TRAIN_ACT_SLOTS * mw_train_acts_slot_bytes(mw_net_act_slot_bytes(m));
    struct mw_plan_stream_in pi = {
        .n_layer = (int)d.n_layer, .n_embd = (int)d.hidden, .padded_vocab = (int)d.vocab,
        .max_seq = m->context, .grad_accum = cfg->grad_accum, .prefetch_depth = cfg->prefetch_depth,
        .subgroup_size = o->plan.subgroup_size, .buffer_count = o->cfg.buffer_count,
        .layer_major = cfg->layer_major, .overlap = !cfg->sync_update,
        .wrap_micro = cfg->prefetch_next_micro && cfg->grad_accum > 1 && !cfg->layer_major,
        .lead_by_size = cfg->prefetch_by_size,
        .keep_grads = cfg->keep_grads && !cfg->layer_major,
        .keep_tied = cfg->keep_tied,
        .acts_bytes = acts,
        .staging_bytes = o->plan.tier_bytes[MW_TIER_DRAM],
        .runtime_bytes = mw_proc_mem("VmRSS"),
    };
    /* Another family: its units and their order from the model table (GPT-2's are the
     * planner's own; both ways give the same for it). */
    int L = m->n_layer, lm = cfg->layer_major, nf = 0, nb = 0, err = 0;
    uint64_t *un = NULL;
    int *order = NULL;
    if (d.arch != MW_ARCH_GPT) {
        nf = mw_net_unit_order(m, MW_NET_FORWARD, lm, NULL, 0);
        nb = mw_net_unit_order(m, MW_NET_BACKWARD, lm, NULL, 0);
        un = calloc((size_t)L + 2, sizeof *un);
        order = nf > 0 && nb > 0 ? calloc((size_t)nf + (size_t)nb, sizeof *order) : NULL;
        if (!un || !order) {
            free(un);
            free(order);
            return mw_error_set(-ENOMEM, "no memory for the stream plan's units");
        }
        for (int u = 0; u < L + 2; u++) {
            size_t first, count;
            if ((err = mw_net_unit_range(m, u, &first, &count))) break;
            un[u] = count;
        }
        mw_net_unit_order(m, MW_NET_FORWARD, lm, order, nf);
        mw_net_unit_order(m, MW_NET_BACKWARD, lm, order + nf, nb);
        pi.unit_n = un;
        pi.order = order;
        pi.n_fwd = nf;
        pi.n_bwd = nb;
        pi.tied = order[nf - 1] == 0;
    }
    if (z) { /* data parallel: zero.c's gradient arrays and buffers (zero.h) */
        uint64_t page = 4096, full = MW_ALIGN_UP(m->sizes.grads_bytes, page), own = MW_ALIGN_UP(z->own.n * 4, page);
        uint64_t unit = 0;
        for (int u = 0; u < z->n_units; u++) unit = MW_MAX(unit, (uint64_t)z->u_n[u] * 4);
        pi.dp_grads_bytes = z->stage < 2 ? full : MW_MIN(full, own + MW_ZERO_GRAD_WINDOW * unit);
        /* The receive and accumulate shards, and the deterministic sum's scratch (src/mpi): the
         * other ranks' copies of this rank's block of about one bucket in flight. */
        pi.dp_buffer_bytes = (z->stage >= 1 ? own : 0) + (z->stage >= 2 ? own : 0) +
                             unit * (uint64_t)(z->world - 1) / (uint64_t)z->world;
    }
    if (!err) err = mw_plan_stream_dram(&pi, out);
    free(un);
    free(order);
    return err;
}

int mw_train_plan_stream(const struct mw_net_config *mcfg, const struct mw_train_config *cfg,
                         struct mw_plan_stream *out, uint64_t *nvme_bytes)
{
    struct mw_net m;
    struct mw_train_opt o;
    /* The model's arrays are fresh mappings never touched here: they cost address space only. */
    struct mw_net_options mo = {cfg->batch, cfg->seq, cfg->recompute || cfg->layer_major, cfg->threads};
    int err = mw_net_init(&m, mcfg, &mo);
    if (err) return err;
    struct mw_train_config c = *cfg;
    c.tier = MW_TIER_NVME;
    c.dram_budget = 0;
    if (!(err = mw_train_opt_plan_only(&o, &m, &c))) {
        err = mw_residency_stream_plan(&m, &o, &c, NULL, out);
        if (nvme_bytes) *nvme_bytes = o.plan.tier_bytes[MW_TIER_NVME];
        mw_train_opt_free(&o);
    }
    mw_net_free(&m);
    return err;
}


/* ---------------------------------------------------------------- the factory */

int mw_residency_open(struct mw_trainer *tr, const struct mw_net_config *mcfg, struct mw_residency_shape *out)
{
    const struct mw_train_config *cfg = &tr->cfg;
    memset(out, 0, sizeof *out);
    if (cfg->zero_stage < 0 || cfg->zero_stage > 3)
        return mw_error_set(-EINVAL, "ZeRO stage %d: use 0, 1, 2 or 3", cfg->zero_stage);
    int streaming = cfg->offload_params == MW_TIER_NVME;
    if (cfg->offload_params != MW_TIER_DRAM && !streaming)
        return mw_error_set(-EINVAL, "weights can be offloaded to dram or nvme");
    if (streaming && cfg->tier != MW_TIER_NVME)
        return mw_error_set(-EINVAL, "streamed weights (offload_params nvme) need the optimizer on NVMe (tier nvme): "
                            "the fp32 master weights on NVMe are the streamed weights");
    if (streaming && cfg->offload_policy && strcmp(cfg->offload_policy, "all-cpu"))
        return mw_error_set(-ENOTSUP, "streamed weights (offload_params nvme) update on the CPU: use the offload "
                            "policy all-cpu");
    if (cfg->acts_nvme && (!streaming || !cfg->layer_major))
        return mw_error_set(-EINVAL, "activations on NVMe need streamed weights (offload_params nvme) and the "
                            "layer-major schedule");
    /* Layer-major recomputes each block from its saved input (bitwise the same gradients), so
     * the model needs only one block's activations. */
    struct mw_net_options mo = {tr->local_batch, cfg->seq, cfg->recompute || cfg->layer_major, cfg->threads};
    int err = check_memory(mcfg, &mo, streaming, cfg->tier == MW_TIER_DRAM);
    if (err || (err = mw_net_init(&tr->model, mcfg, &mo))) return err;
    if (!streaming) mw_net_init_weights(&tr->model, cfg->seed); /* streamed: unit by unit at engine init */
    struct mw_residency *r = calloc(1, sizeof *r);
    if (!r) return mw_error_set(-ENOMEM, "no memory");
    tr->res = r;
    use_resident(r, tr);
    r->source = "dram";
    r->reduction = "none";
    uint64_t sg = cfg->subgroup_size;
    if (tr->world > 1) {
        if (!(r->zero = calloc(1, sizeof *r->zero))) return mw_error_set(-ENOMEM, "no memory");
        /* Under ZeRO the subgroups are the unit of ownership: enough of them for every rank. */
        if (cfg->zero_stage >= 1) {
            int shard = mw_comm_size(cfg->comm, MW_COMM_SHARD);
            if (!sg) sg = mw_train_zero_sg_size(tr->model.sizes.n_params, shard, 4ull << 20);
            tr->cfg.subgroup_size = sg;
        }
        if ((err = mw_train_zero_init(r->zero, cfg->comm, cfg->zero_stage, &tr->model, sg ? sg : tr->model.sizes.n_params,
                                      cfg->trace))) {
            free(r->zero);
            r->zero = NULL;
            return err;
        }
        if (cfg->zero_stage >= 1) {
            out->own_first = r->zero->own.first;
            out->own_n = r->zero->own.n;
        }
        use_zero(r, tr);
        r->reduction = cfg->zero_stage ? "reduce-scatter" : "allreduce";
        if (cfg->zero_stage == 3) r->source = "peers";
    }
    r->subgroup_size = sg;
    tr->overlap = tr->world == 1 && cfg->tier == MW_TIER_NVME && !cfg->sync_update;
    const struct mw_net_sizes *z = &tr->model.sizes;
    /* Streamed: the streamed part is planned at attach (the plan checks the whole budget). */
    out->model_dram = streaming ? z->acts_bytes : z->params_bytes + z->grads_bytes + z->acts_bytes;
    if (cfg->keep_grads && (!streaming || cfg->layer_major || tr->world > 1))
        return mw_error_set(-EINVAL, "gradients kept in DRAM (keep_grads) need streamed weights (offload_params nvme), "
                            "the batch-major schedule and one rank");
    out->opt_cfg = tr->cfg;
    if (streaming) out->opt_cfg.dram_budget = 0;
    /* The engine's cfg.grads_dram: every step's gradients stay in DRAM (kept, or with batch-major
     * accumulation), so the update zeroes them in place and may pre-read between steps. */
    out->opt_cfg.keep_grads = streaming && !cfg->layer_major && tr->world == 1 && (cfg->keep_grads || cfg->grad_accum > 1);
    return 0;
}

/* The source "nvme": the stream over the optimizer's master, its plan against the budget, the
 * initial weights written unit by unit into the engine, the activations' slots on NVMe. */
static int attach_stream(struct mw_trainer *tr, struct mw_residency *r)
{
    const struct mw_train_config *cfg = &tr->cfg;
    if (!(r->stream = calloc(1, sizeof *r->stream))) return mw_error_set(-ENOMEM, "no memory");
    struct mw_train_stream *s = r->stream;
    int err = mw_train_stream_init(s, &tr->model, tr->opt, cfg->prefetch_depth, cfg->seed, r->zero, cfg->trace);
    if (err) {
        free(s);
        r->stream = NULL;
        return err;
    }
    mw_residency_stream(r, s);
    r->source = "nvme";
    if (cfg->init_safetensors && (err = tr->model.family->loader_open(&s->init, &tr->model, cfg->init_safetensors)))
        return err;
    s->layer_major = cfg->layer_major;
    s->prefetch_next_micro = cfg->prefetch_next_micro;
    s->keep_grads = cfg->keep_grads;
    s->keep_tied = cfg->keep_tied;
    if (cfg->prefetch_by_size && (err = mw_units_lead_by_size(&s->units))) return err;
    if ((err = mw_residency_stream_plan(&tr->model, tr->opt, cfg, r->zero, &s->plan))) return err;
    if (cfg->dram_budget && s->plan.total > cfg->dram_budget) {
        const struct mw_plan_stream *p = &s->plan;
        char b[7][32];
        return mw_error_set(MW_EBUDGET, "DRAM budget %s is too small for this streamed run: it needs %s at its peak "
                            "(runtime %s, activations %s, optimizer staging %s, weights and gradients %s%s%s); raise "
                            "the DRAM budget (dram_budget), or lower the prefetch depth (prefetch_depth), the "
                            "subgroup size (subgroup_size), the staging buffers (buffer_count) or the batch (batch), "
                            "or turn on recomputation (recompute)", mw_fmt_bytes(b[0], 32, cfg->dram_budget),
                            mw_fmt_bytes(b[1], 32, p->total), mw_fmt_bytes(b[2], 32, p->runtime),
                            mw_fmt_bytes(b[3], 32, p->acts), mw_fmt_bytes(b[4], 32, p->staging),
                            mw_fmt_bytes(b[5], 32, MW_MAX(p->passes, p->step_grads)),
                            p->dp_buffers ? ", collective buffers " : "",
                            p->dp_buffers ? mw_fmt_bytes(b[6], 32, p->dp_buffers) : "");
    }
    /* The engine (and with it the initial weights, unit by unit) exists before the first
     * forward pass: the weights are fetched from its master. */
    if ((err = mw_train_opt_ensure(tr->opt)) || (err = mw_train_stream_ready(s))) return err;
    tr->model.family->loader_close(s->init); /* the master holds the weights now */
    s->init = NULL;
    if (!cfg->acts_nvme) return 0;
    if (!(r->acts = calloc(1, sizeof *r->acts))) return mw_error_set(-ENOMEM, "no memory");
    if ((err = mw_train_acts_init(r->acts, tr->model.n_layer, cfg->grad_accum, mw_net_act_slot_bytes(&tr->model),
                                  cfg->trace))) {
        free(r->acts);
        r->acts = NULL;
        return err;
    }
    r->acts->eng = tr->opt->eng;
    mw_net_acts_lend(&tr->model, r->acts->mem); /* slot 0 serves evaluation passes too */
    return 0;
}

int mw_residency_attach(struct mw_trainer *tr)
{
    struct mw_residency *r = tr->res;
    int err;
    if (tr->cfg.offload_params == MW_TIER_NVME && (err = attach_stream(tr, r))) return err;
    if (r->ops->weights) mw_net_set_weights_hook(&tr->model, r->ops->weights, r->self);
    if (r->zero && tr->cfg.zero_stage >= 1 && tr->opt->plan.subgroup_size != r->subgroup_size)
        return mw_error_set(-EINVAL, "the optimizer rounded the subgroup size %llu to %llu; use a subgroup size "
                            "(subgroup_size) that is a multiple of 4096", (unsigned long long)r->subgroup_size,
                            (unsigned long long)tr->opt->plan.subgroup_size);
    return 0;
}

void mw_residency_close(struct mw_trainer *tr, int phase)
{
    struct mw_residency *r = tr->res;
    if (!r) return;
    if (phase == 0) { /* before the optimizer's engine goes: reads in flight end */
        if (r->stream) mw_train_stream_free(r->stream);
        free(r->stream);
        r->stream = NULL;
        if (r->acts) mw_train_acts_free(r->acts);
        free(r->acts);
        r->acts = NULL;
        return;
    }
    if (r->zero) mw_train_zero_free(r->zero);
    free(r->zero);
    free(r);
    tr->res = NULL;
}

/* ---------------------------------------------------------------- the step's figures, the ranks */

void mw_residency_step_begin(struct mw_residency *r, int64_t step)
{
    if (r->zero) mw_comm_stats_reset(r->zero->comm);
    if (r->stream) r->stream->step = (int)step;
    if (r->acts) r->acts->step = (int)step;
}

int mw_residency_step_end(struct mw_residency *r, struct mw_train_step_stats *st)
{
    if (!r->zero) return 0;
    struct mw_comm_stats cs;
    mw_comm_stats_get(r->zero->comm, &cs);
    st->comm_sent_bytes = mw_comm_stats_sent_total(&cs);
    st->comm_wait_s = (double)cs.wait_ns / 1e9;
    /* Shards are whole subgroups, so ranks send unequal shares; their mean is the ZeRO paper's
     * per-rank volume. (This exchange is not counted in the step's figures.) */
    uint64_t sum;
    int err = mw_train_zero_sum_u64(r->zero, st->comm_sent_bytes, &sum);
    if (!err) st->comm_sent_mean_bytes = sum / (uint64_t)r->zero->world;
    return err;
}

int mw_residency_mean(struct mw_residency *r, float *v)
{
    return r->zero ? mw_train_zero_mean(r->zero, v) : 0;
}

int mw_residency_max_u64(struct mw_residency *r, uint64_t v, uint64_t *max)
{
    *max = v;
    return r->zero ? mw_train_zero_max_u64(r->zero, v, max) : 0;
}

int mw_residency_info(struct mw_residency *r, struct mw_train_residency_info *ri, int collective)
{
    memset(ri, 0, sizeof *ri);
    ri->source = r->source;
    ri->reduction = r->reduction;
    const struct mw_train_zero *z = r->zero;
    if (z) {
        struct mw_train_zero_info *zi = &ri->zero;
        zi->stage = z->stage;
        zi->world = z->world;
        zi->rank = z->wrank;
        zi->shard_ranks = z->nshard;
        zi->replicas = z->nrep;
        zi->subgroup_size = z->sg_size;
        zi->own_first = z->own.first;
        zi->own_n = z->own.n;
        zi->weights_resident_peak = z->resident_peak;
        zi->weights_resident_now = z->resident_now;
        zi->grads_resident_peak = z->grads_resident_peak;
        int err;
        if (collective && ((err = mw_residency_max_u64(r, z->resident_peak, &zi->weights_resident_peak)) ||
                           (err = mw_residency_max_u64(r, z->grads_resident_peak, &zi->grads_resident_peak))))
            return err;
    }
    const struct mw_train_stream *s = r->stream;
    if (!s) return 0;
    struct mw_train_stream_info *si = &ri->stream;
    si->active = 1;
    si->prefetch_depth = s->units.depth;
    si->resident_peak = s->resident_peak;
    si->fetch_bytes = s->fetch_bytes;
    si->grad_write_bytes = s->grad_write_bytes;
    si->handoff_bytes = s->handoff_bytes;
    si->wait_s = (double)s->wait_ns / 1e9;
    si->planned_total = s->plan.total;
    si->planned_runtime = s->plan.runtime;
    si->planned_acts = s->plan.acts;
    si->planned_staging = s->plan.staging;
    si->planned_weights = s->plan.weights_peak;
    si->planned_grads = MW_MAX(s->plan.grads_peak, s->plan.step_grads);
    si->planned_streamed = MW_MAX(s->plan.passes, s->plan.step_grads);
    si->planned_dp = s->plan.dp_buffers;
    return 0;
}
