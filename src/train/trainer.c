/*
 * trainer.c — one optimizer step = grad_accum micro-batches of forward/backward, a global
 * gradient norm, clipping folded into the optimizer's grad_scale (no extra pass over the
 * gradients), warm-up + cosine learning rate, and AdamW; plus validation and sampling.
 * Why clipping as a scale: the norm needs one read of the gradients anyway; scaling them in
 * place would be a second read and write of 4 bytes/parameter, the kernel multiplies for free.
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "memwall/trace.h"
#include "memwall/plan.h"
#include "train/acts.h"
#include "train/optimizer_step.h"
#include "train/residency.h"
#include "train/resume.h"
#include "train/stream.h"
#include "train/zero.h"
#include "memwall/comm.h"

#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

double mw_train_lr(const struct mw_train_config *c, int64_t step)
{
    if (c->warmup > 0 && step <= c->warmup) return c->lr * (double)step / (double)c->warmup;
    if (c->steps <= c->warmup) return c->lr;
    double ratio = (double)(step - c->warmup) / (double)(c->steps - c->warmup);
    if (ratio > 1) ratio = 1;
    double min_lr = c->lr * c->min_lr_frac;
    return min_lr + 0.5 * (1.0 + cos(M_PI * ratio)) * (c->lr - min_lr);
}

static int check_config(const struct mw_net_sizes *ns, int context, int vocab, const struct mw_train_config *c,
                        const struct mw_data *d)
{
    if (c->batch < 1 || c->seq < 1 || c->grad_accum < 1 || c->steps < 0)
        return mw_error_set(-EINVAL, "batch (%d), sequence (%d) and grad-accum (%d) must be >= 1, steps >= 0",
                            c->batch, c->seq, c->grad_accum);
    (void)ns;
    if (c->seq > context)
        return mw_error_set(-EINVAL, "sequence length %d exceeds the model's context %d", c->seq, context);
    /* Written so that a NaN fails every test (it compares false). */
    if (!(c->lr >= 0 && c->lr <= 10) || !(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1) ||
        !(c->eps > 0 && c->eps <= 1))
        return mw_error_set(-EINVAL, "bad AdamW hyper-parameters (lr %g, betas %g %g, eps %g): lr in [0, 10], betas in "
                            "[0, 1), eps in (0, 1]", c->lr, c->beta1, c->beta2, c->eps);
    if (!(c->weight_decay >= 0 && c->weight_decay <= 10) || !(c->min_lr_frac >= 0 && c->min_lr_frac <= 1) ||
        !(c->clip >= 0 && c->clip <= 1e9))
        return mw_error_set(-EINVAL, "bad schedule or clipping (weight decay %g, minimum lr fraction %g, clip %g): weight "
                            "decay in [0, 10], the fraction in [0, 1], clip in [0, 1e9] (0: off)", c->weight_decay,
                            c->min_lr_frac, c->clip);
    if (c->warmup < 0 || c->val_every < 0 || c->val_batches < 0 || c->ckpt_every < 0 || c->threads < 0)
        return mw_error_set(-EINVAL, "warm-up, validation, checkpoint intervals and threads must be >= 0");
    if (d->max_token >= vocab)
        return mw_error_set(-EINVAL, "data %s holds token %d but the model's vocabulary is %d; use --vocab %d or more",
                            d->path, d->max_token, vocab, d->max_token + 1);
    return mw_data_check(d, c->seq);
}

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
     * checks the rest against --dram-budget). */
    if (opt_dram && (mw_add_u64(need, 2 * z.params_bytes, &need))) need = UINT64_MAX;
    if (!avail || need <= avail) return 0;
    char a[32], b[32], c[32];
    return mw_error_set(-ENOMEM, "the run's arrays need %s (activations %s for %d x %d tokens per micro-batch%s%s) and "
                        "this machine has %s available (MemAvailable): lower --batch or --seq, add --recompute%s%s",
                        mw_fmt_bytes(a, sizeof a, need), mw_fmt_bytes(b, sizeof b, z.acts_bytes), mo->max_batch,
                        mo->max_seq, streaming ? "" : ", weights and gradients", opt_dram ? ", the optimizer's moments" : "",
                        mw_fmt_bytes(c, sizeof c, avail), opt_dram ? ", put the optimizer on NVMe (--optimizer-tier nvme)" : "",
                        streaming ? "" : ", or stream the weights (--offload-params nvme)");
}

/* The streamed run's DRAM plan from the model and the optimizer's plan: the trainer and
 * mw_train_plan_stream (memwall plan --stream) both come here. */
static int stream_plan(const struct mw_net *m, const struct mw_train_opt *o, const struct mw_train_config *cfg,
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
        .acts_bytes = acts,
        .staging_bytes = o->plan.tier_bytes[MW_OFFLOAD_DRAM],
        .runtime_bytes = mw_proc_mem("VmRSS"),
    };
    if (d.arch != MW_ARCH_GPT) {
        /* The planner simulates GPT-2's schedule only (src/plan/stream.c); for another family the
         * bound with every weight and gradient resident at once stands in (never below the run). */
        memset(out, 0, sizeof *out);
        out->params = m->sizes.n_params;
        out->subgroup_size = o->plan.subgroup_size;
        out->weights_peak = m->sizes.params_bytes;
        out->grads_peak = m->sizes.grads_bytes;
        out->passes = m->sizes.params_bytes + m->sizes.grads_bytes;
        out->acts = pi.acts_bytes;
        out->staging = pi.staging_bytes;
        out->runtime = pi.runtime_bytes;
        out->total = out->runtime + out->acts + out->staging + out->passes;
        return 0;
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
    return mw_plan_stream_dram(&pi, out);
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
    c.tier = MW_OFFLOAD_NVME;
    c.dram_budget = 0;
    if (!(err = mw_train_opt_plan_only(&o, &m, &c))) {
        err = stream_plan(&m, &o, &c, NULL, out);
        if (nvme_bytes) *nvme_bytes = o.plan.tier_bytes[MW_OFFLOAD_NVME];
        mw_train_opt_free(&o);
    }
    mw_net_free(&m);
    return err;
}

int mw_trainer_init(struct mw_trainer *tr, const struct mw_net_config *mcfg,
                    const struct mw_train_config *cfg, const struct mw_data *data)
{
    memset(tr, 0, sizeof *tr);
    struct mw_net_options one = {1, 1, 0, 1};
    struct mw_net_sizes ns;
    int err = mw_net_sizes(mcfg, &one, &ns); /* checks the config */
    if (err) return err;
    struct mw_model desc;
    mcfg->family->config_describe(mcfg->raw, &desc);
    if ((err = check_config(&ns, (int)desc.max_pos ? (int)desc.max_pos : INT32_MAX, (int)desc.vocab, cfg, data))) return err;
    tr->cfg = *cfg;
    tr->data = data;
    tr->world = cfg->comm ? mw_comm_size(cfg->comm, MW_COMM_WORLD) : 1;
    tr->rank = cfg->comm ? mw_comm_rank(cfg->comm, MW_COMM_WORLD) : 0;
    if (cfg->zero_stage < 0 || cfg->zero_stage > 3)
        return mw_error_set(-EINVAL, "ZeRO stage %d: use 0, 1, 2 or 3", cfg->zero_stage);
    if (cfg->batch % tr->world)
        return mw_error_set(-EINVAL, "the global batch (%d sequences) must divide by the %d ranks", cfg->batch, tr->world);
    tr->local_batch = cfg->batch / tr->world;
    int streaming = cfg->offload_params == MW_OFFLOAD_NVME;
    if (cfg->offload_params != MW_OFFLOAD_DRAM && !streaming)
        return mw_error_set(-EINVAL, "weights can be offloaded to dram or nvme");
    if (streaming && cfg->tier != MW_OFFLOAD_NVME)
        return mw_error_set(-EINVAL, "--offload-params nvme needs --optimizer-tier nvme: the fp32 master weights on "
                            "NVMe are the streamed weights");
    if (streaming && cfg->offload_policy && strcmp(cfg->offload_policy, "all-cpu"))
        return mw_error_set(-ENOTSUP, "--offload-params nvme updates on the CPU: use --offload-policy all-cpu");
    if (cfg->acts_nvme && (!streaming || !cfg->layer_major))
        return mw_error_set(-EINVAL, "activations on NVMe need streamed weights (--offload-params nvme) and the "
                            "layer-major schedule");
    /* Layer-major recomputes each block from its saved input (bitwise the same gradients), so
     * the model needs only one block's activations. */
    struct mw_net_options mo = {tr->local_batch, cfg->seq, cfg->recompute || cfg->layer_major, cfg->threads};
    if ((err = check_memory(mcfg, &mo, streaming, cfg->tier == MW_OFFLOAD_DRAM))) return err;
    if ((err = mw_net_init(&tr->model, mcfg, &mo))) return err;
    if (!streaming) mw_net_init_weights(&tr->model, cfg->seed); /* streamed: unit by unit at engine init */
    tr->res = calloc(1, sizeof *tr->res);
    if (!tr->res) { err = mw_error_set(-ENOMEM, "no memory"); goto err; }
    mw_residency_resident(tr->res, tr);
    size_t n = (size_t)tr->local_batch * (size_t)cfg->seq, ng = (size_t)cfg->batch * (size_t)cfg->seq;
    size_t nlm = cfg->layer_major ? (size_t)cfg->grad_accum : 1; /* layer-major: the step's micro-batches */
    tr->inputs = malloc(n * nlm * sizeof *tr->inputs);
    tr->targets = malloc(n * nlm * sizeof *tr->targets);
    tr->lm_losses = malloc(nlm * sizeof *tr->lm_losses);
    tr->opt = calloc(1, sizeof *tr->opt);
    if (!tr->inputs || !tr->targets || !tr->lm_losses || !tr->opt) { err = mw_error_set(-ENOMEM, "no memory for the batch"); goto err; }
    uint64_t own_first = 0, own_n = 0, sg = cfg->subgroup_size;
    if (tr->world > 1) {
        tr->g_inputs = malloc(ng * sizeof *tr->g_inputs);
        tr->g_targets = malloc(ng * sizeof *tr->g_targets);
        tr->zero = calloc(1, sizeof *tr->zero);
        if (!tr->g_inputs || !tr->g_targets || !tr->zero) { err = mw_error_set(-ENOMEM, "no memory for the batch"); goto err; }
        /* Under ZeRO the subgroups are the unit of ownership: enough of them for every rank. */
        if (cfg->zero_stage >= 1) {
            int shard = mw_comm_size(cfg->comm, MW_COMM_SHARD);
            if (!sg) sg = mw_train_zero_sg_size(tr->model.sizes.n_params, shard, 4ull << 20);
            tr->cfg.subgroup_size = sg;
        }
        if ((err = mw_train_zero_init(tr->zero, cfg->comm, cfg->zero_stage, &tr->model, sg ? sg : tr->model.sizes.n_params,
                                      cfg->trace))) {
            free(tr->zero);
            tr->zero = NULL;
            goto err;
        }
        if (cfg->zero_stage >= 1) { own_first = tr->zero->own.first; own_n = tr->zero->own.n; }
        mw_residency_zero(tr->res, tr);
    }
    tr->overlap = tr->world == 1 && cfg->tier == MW_OFFLOAD_NVME && !cfg->sync_update;
    const struct mw_net_sizes *z = &tr->model.sizes;
    uint64_t model_dram = z->params_bytes + z->grads_bytes + z->acts_bytes;
    if (streaming) {
        tr->stream = calloc(1, sizeof *tr->stream);
        if (!tr->stream) { err = mw_error_set(-ENOMEM, "no memory"); goto err; }
        model_dram = z->acts_bytes; /* the streamed part is planned below (stream_plan) */
    }
    {
        /* Streamed: the whole DRAM plan (mw_plan_stream_dram below) checks the budget. */
        struct mw_train_config oc = tr->cfg;
        if (streaming) oc.dram_budget = 0;
        if ((err = mw_train_opt_init(tr->opt, &tr->model, &oc, model_dram, own_first, own_n))) goto err;
    }
    if (streaming) {
        if ((err = mw_train_stream_init(tr->stream, &tr->model, tr->opt, cfg->prefetch_depth, cfg->seed, tr->zero,
                                        cfg->trace)))
            goto err;
        mw_residency_stream(tr->res, tr->stream);
        if (cfg->init_safetensors && (err = tr->model.family->loader_open(&tr->stream->init, &tr->model, cfg->init_safetensors)))
            goto err;
        tr->stream->layer_major = cfg->layer_major;
        if ((err = stream_plan(&tr->model, tr->opt, cfg, tr->zero, &tr->stream->plan))) goto err;
        if (cfg->dram_budget && tr->stream->plan.total > cfg->dram_budget) {
            const struct mw_plan_stream *p = &tr->stream->plan;
            char b[7][32];
            err = mw_error_set(MW_EBUDGET, "DRAM budget %s is too small for this streamed run: it needs %s at its peak "
                               "(runtime %s, activations %s, optimizer staging %s, weights and gradients %s%s%s); raise "
                               "--dram-budget, or lower --prefetch-depth, --subgroup-size, --buffer-count, --batch, "
                               "or add --recompute", mw_fmt_bytes(b[0], 32, cfg->dram_budget),
                               mw_fmt_bytes(b[1], 32, p->total), mw_fmt_bytes(b[2], 32, p->runtime),
                               mw_fmt_bytes(b[3], 32, p->acts), mw_fmt_bytes(b[4], 32, p->staging),
                               mw_fmt_bytes(b[5], 32, MW_MAX(p->passes, p->step_grads)),
                               p->dp_buffers ? ", collective buffers " : "",
                               p->dp_buffers ? mw_fmt_bytes(b[6], 32, p->dp_buffers) : "");
            goto err;
        }
        tr->opt->cfg.stream_user = tr->stream; /* the hook itself was planned by mw_train_opt_init */
        /* The engine (and with it the initial weights, unit by unit) exists before the first
         * forward pass: the weights are fetched from its master. */
        if ((err = mw_train_opt_ensure(tr->opt)) || (err = mw_train_stream_ready(tr->stream))) goto err;
        tr->model.family->loader_close(tr->stream->init); /* the master holds the weights now */
        tr->stream->init = NULL;
        if (cfg->acts_nvme) {
            if (!(tr->acts = calloc(1, sizeof *tr->acts))) { err = mw_error_set(-ENOMEM, "no memory"); goto err; }
            if ((err = mw_train_acts_init(tr->acts, tr->model.n_layer, cfg->grad_accum, mw_net_act_slot_bytes(&tr->model),
                                          cfg->trace))) {
                free(tr->acts);
                tr->acts = NULL;
                goto err;
            }
            tr->acts->eng = tr->opt->eng;
            mw_net_acts_lend(&tr->model, tr->acts->mem); /* slot 0 serves evaluation passes too */
        }
    }
    if (tr->res->ops->weights) {
        mw_net_set_weights_hook(&tr->model, tr->res->ops->weights, tr->res->self);
    }
    if (tr->zero && cfg->zero_stage >= 1 && tr->opt->plan.subgroup_size != sg) {
        err = mw_error_set(-EINVAL, "the optimizer rounded the subgroup size %llu to %llu; give --subgroup-size as a "
                           "multiple of 4096", (unsigned long long)sg, (unsigned long long)tr->opt->plan.subgroup_size);
        goto err;
    }
    /* The sampler's stream is derived from the seed but distinct from the weights' stream. */
    tr->data_rng = cfg->seed ^ 0xda7a5eedda7a5eedull;
    /* A run that did not finish: its committed state, step and data position (docs/resume.md). */
    if (cfg->resume && (err = mw_train_resume_apply(tr, cfg->resume))) goto err;
    return 0;
err:
    mw_trainer_free(tr);
    return err;
}

int mw_trainer_finish(struct mw_trainer *tr)
{
    return tr->opt ? mw_train_opt_finish(tr->opt) : 0;
}

void mw_trainer_free(struct mw_trainer *tr)
{
    if (tr->opt) (void)mw_train_opt_finish(tr->opt); /* a failure here has no one to tell */
    if (tr->stream) mw_train_stream_free(tr->stream);
    if (tr->acts) mw_train_acts_free(tr->acts);
    free(tr->acts);
    if (tr->opt) mw_train_opt_free(tr->opt);
    free(tr->opt);
    free(tr->stream);
    free(tr->res);
    if (tr->zero) mw_train_zero_free(tr->zero);
    free(tr->zero);
    free(tr->inputs);
    free(tr->targets);
    free(tr->lm_losses);
    free(tr->g_inputs);
    free(tr->g_targets);
    free(tr->journal_data);
    free(tr->run_spec);
    if (tr->model.family) mw_net_free(&tr->model);
    memset(tr, 0, sizeof *tr);
}

/* This rank's slice of a global micro-batch: sequences [rank*b, (rank+1)*b) of it. */
static void take_slice(struct mw_trainer *tr, int32_t *inputs, int32_t *targets)
{
    size_t n = (size_t)tr->local_batch * (size_t)tr->cfg.seq, off = (size_t)tr->rank * n;
    memcpy(inputs, tr->g_inputs + off, n * sizeof *inputs);
    memcpy(targets, tr->g_targets + off, n * sizeof *targets);
}

/* The next training batch into inputs/targets (this rank's slice of the global batch). */
static void train_batch(struct mw_trainer *tr, int32_t *inputs, int32_t *targets)
{
    const struct mw_train_config *c = &tr->cfg;
    if (!tr->zero) {
        mw_data_train_batch(tr->data, &tr->data_rng, c->batch, c->seq, inputs, targets, NULL);
        return;
    }
    mw_data_train_batch(tr->data, &tr->data_rng, c->batch, c->seq, tr->g_inputs, tr->g_targets, NULL);
    take_slice(tr, inputs, targets);
}

static void val_batch(struct mw_trainer *tr, uint64_t k)
{
    const struct mw_train_config *c = &tr->cfg;
    if (!tr->zero) {
        mw_data_val_batch(tr->data, k, c->batch, c->seq, tr->inputs, tr->targets, NULL);
        return;
    }
    mw_data_val_batch(tr->data, k, c->batch, c->seq, tr->g_inputs, tr->g_targets, NULL);
    take_slice(tr, tr->inputs, tr->targets);
}

static int pass_begin(struct mw_trainer *tr, int training)
{
    return tr->res->ops->pass_begin(tr->res->self, training);
}

/* A phase span (docs/trace-conventions.md) from t0 to now; returns the duration. */
static uint64_t phase(struct mw_trace *trace, const char *name, uint64_t t0, int64_t step)
{
    uint64_t t1 = mw_now_ns();
    struct mw_trace_arg a[1] = {{"step", step}};
    mw_trace_span(trace, "phase", name, t0, t1, a, 1);
    return t1 - t0;
}

/* Closes the optimizer's backward bracket; the first error (err, else its own) is the one told. */
static int opt_backward_end(struct mw_trainer *tr, int err)
{
    if (!err) return mw_train_opt_backward_end(tr->opt);
    char why[512];
    snprintf(why, sizeof why, "%s", mw_error_msg());
    (void)mw_train_opt_backward_end(tr->opt);
    return mw_error_set(err, "%s", why);
}

/* Layer-major (docs/train.md): all micro-batches of the step go through the model unit by unit
 * (the layer-major step of the model table); the same data, the same sums in the same order. */
struct lm_ctx { struct mw_trainer *tr; struct mw_train_step_stats *st; int64_t step; };

static int lm_before_grads(void *user)
{
    struct lm_ctx *x = user;
    struct mw_trainer *tr = x->tr;
    int err = mw_train_opt_finish(tr->opt);
    if (!err) err = tr->res->ops->step_begin(tr->res->self);
    if (!err) err = mw_train_opt_backward_begin(tr->opt, 1);
    if (!err) err = tr->res->ops->backward_begin(tr->res->self, 0, 1);
    return err;
}

static void lm_grad_ready(size_t first, size_t n, void *user)
{
    struct lm_ctx *x = user;
    x->tr->res->ops->grad_ready(first, n, x->tr->res->self);
}

static void lm_forward_done(void *user, uint64_t ns)
{
    struct lm_ctx *x = user;
    x->st->forward_ns += ns;
    if (x->tr->cfg.trace) phase(x->tr->cfg.trace, "forward", mw_now_ns() - ns, x->step);
}

static void lm_backward_done(void *user, uint64_t ns)
{
    struct lm_ctx *x = user;
    x->st->backward_ns += ns;
    if (x->tr->cfg.trace) phase(x->tr->cfg.trace, "backward", mw_now_ns() - ns, x->step);
}

static int lm_acts(void *user, int event, int layer, int mb, float **buf)
{
    struct lm_ctx *x = user;
    return mw_train_acts_call(x->tr->acts, event, layer, mb, buf);
}

static int step_layer_major(struct mw_trainer *tr, int64_t step, struct mw_train_step_stats *st, float *loss_sum)
{
    const struct mw_train_config *c = &tr->cfg;
    size_t n = (size_t)tr->local_batch * (size_t)c->seq;
    uint64_t t = mw_now_ns();
    for (int a = 0; a < c->grad_accum; a++) /* the batches batch-major would draw, in its order */
        train_batch(tr, tr->inputs + (size_t)a * n, tr->targets + (size_t)a * n);
    if (c->trace) phase(c->trace, "data", t, step);
    int err = pass_begin(tr, 1);
    if (err) return err;
    struct lm_ctx x = {tr, st, step};
    struct mw_net_lm_calls calls = {lm_before_grads, lm_grad_ready, lm_forward_done, lm_backward_done,
                                     tr->acts ? lm_acts : NULL, &x};
    if (tr->acts) tr->acts->step = (int)step;
    err = mw_net_step_layer_major(&tr->model, c->grad_accum, tr->inputs, tr->targets, tr->local_batch, c->seq,
                                   1.0f / (float)c->grad_accum, &calls, tr->lm_losses);
    if (!err) err = tr->res->ops->backward_end(tr->res->self);
    if ((err = opt_backward_end(tr, err))) return err;
    for (int a = 0; a < c->grad_accum; a++) *loss_sum += tr->lm_losses[a];
    return 0;
}

static int step_run(struct mw_trainer *tr, struct mw_train_step_stats *st)
{
    const struct mw_train_config *c = &tr->cfg;
    struct mw_trace *trace = c->trace;
    struct mw_train_zero *zr = tr->zero;
    uint64_t t0 = mw_now_ns(), t;
    memset(st, 0, sizeof *st);
    int64_t step = tr->step + 1;
    struct mw_offload_stats s0, s1;
    mw_train_opt_stats(tr->opt, &s0);
    const struct mw_residency *res = tr->res;
    if (zr) mw_comm_stats_reset(c->comm);
    if (tr->stream) tr->stream->step = (int)step;
    int err;
    float loss_sum = 0;
    if (c->layer_major) {
        if ((err = step_layer_major(tr, step, st, &loss_sum))) return err;
    }
    for (int a = 0; a < c->grad_accum && !c->layer_major; a++) {
        int last = a == c->grad_accum - 1;
        t = mw_now_ns();
        train_batch(tr, tr->inputs, tr->targets);
        if (trace) phase(trace, "data", t, step);
        t = mw_now_ns();
        if ((err = pass_begin(tr, 1))) return err;
        if ((err = mw_net_forward(&tr->model, tr->inputs, tr->targets, tr->local_batch, c->seq))) return err;
        st->forward_ns += phase(trace, "forward", t, step);
        loss_sum += tr->model.loss;
        t = mw_now_ns();
        if (a == 0) {
            /* The previous step's update ran behind this forward pass (each unit waited for its
             * own subgroups); it commits now, before this step's gradients exist. */
            if ((err = mw_train_opt_finish(tr->opt))) return err;
            if ((err = res->ops->step_begin(res->self))) return err;
        }
        if ((err = mw_train_opt_backward_begin(tr->opt, last))) return err;
        if ((err = mw_net_accum_set(&tr->model, a, c->grad_accum))) return err;
        if (!(err = res->ops->backward_begin(res->self, a, last))) {
            err = mw_net_backward(&tr->model, 1.0f / (float)c->grad_accum, res->ops->grad_ready, res->self);
            /* After a failure the job ends (a collective cannot be cancelled): no more waits. */
            if (!err) err = res->ops->backward_end(res->self);
        }
        if ((err = opt_backward_end(tr, err))) return err;
        st->backward_ns += phase(trace, "backward", t, step);
    }
    t = mw_now_ns();
    st->step = step;
    st->loss = loss_sum / (float)c->grad_accum;
    if (zr && (err = mw_train_zero_mean(zr, &st->loss))) return err;
    st->lr = mw_train_lr(c, step);
    st->tokens = (uint64_t)c->batch * (uint64_t)c->seq * (uint64_t)c->grad_accum;
    err = res->ops->grad_norm(res->self, &st->grad_norm);
    /* Every batch of this step is drawn, none of the next: what the commit of this step records. */
    if ((!err || err == MW_EOVERFLOW) && tr->journal_data) {
        int jerr = mw_train_journal_note(tr, step);
        if (jerr) return jerr;
    }
    if (err == MW_EOVERFLOW) {
        st->skipped = 1; /* keep the weights; the step still counts for the schedule */
        if ((err = mw_train_opt_skip(tr->opt, step))) return err;
    } else if (err) {
        return err;
    } else {
        float scale = 1.0f;
        if (c->clip > 0 && st->grad_norm > c->clip) {
            scale = (float)(c->clip / st->grad_norm);
            st->clipped = 1;
        }
        /* Overlapped: the update runs on the engine's threads while the next forward pass
         * follows behind it, unit by unit (not after the last step: the run ends committed). */
        if (tr->overlap && step < c->steps) err = mw_train_opt_step_start(tr->opt, st->lr, scale, step);
        else err = mw_train_opt_step(tr->opt, st->lr, scale, step);
        if (err) return err;
        if ((err = res->ops->after_step(res->self))) return err;
    }
    st->update_ns = phase(trace, "update", t, step);
    tr->step = step;
    uint64_t t1 = mw_now_ns();
    st->ns = t1 - t0;
    mw_train_opt_stats(tr->opt, &s1);
    st->nvme_read_bytes = s1.nvme_read_bytes - s0.nvme_read_bytes;
    st->nvme_write_bytes = s1.nvme_write_bytes - s0.nvme_write_bytes;
    st->io_wait_s = s1.io_wait_s - s0.io_wait_s;
    if (zr) {
        struct mw_comm_stats cs;
        mw_comm_stats_get(c->comm, &cs);
        st->comm_sent_bytes = mw_comm_stats_sent_total(&cs);
        st->comm_wait_s = (double)cs.wait_ns / 1e9;
        /* Shards are whole subgroups, so ranks send unequal shares; their mean is the ZeRO
         * paper's per-rank volume. (This exchange is not counted in the step's figures.) */
        uint64_t sum;
        if ((err = mw_train_zero_sum_u64(zr, st->comm_sent_bytes, &sum))) return err;
        st->comm_sent_mean_bytes = sum / (uint64_t)tr->world;
    }
    if (trace) {
        struct mw_trace_arg a[2] = {{"step", step}, {"tokens", (int64_t)st->tokens}};
        mw_trace_span(trace, "step", "step", t0, t1, a, 2);
        mw_trace_counter(trace, "loss", t1, st->loss);
    }
    return 0;
}

int mw_trainer_step(struct mw_trainer *tr, struct mw_train_step_stats *st)
{
    int err = step_run(tr, st);
    if (!err || !tr->opt || !tr->opt->eng || tr->opt->tier != MW_OFFLOAD_NVME) return err;
    /* The step failed (a read, a write, the data...): an update of the step before may still run
     * behind it; let it end, then say which step the NVMe state holds. A failed update says so
     * itself (mw_offload_step_wait: "step N not committed; ..."). */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mw_error_msg());
    if (mw_train_opt_in_flight(tr->opt) && mw_train_opt_finish(tr->opt)) {
        size_t l = strlen(msg);
        if (strstr(mw_error_msg(), msg)) snprintf(msg, sizeof msg, "%s", mw_error_msg()); /* the same failure */
        else snprintf(msg + l, sizeof msg - l, "; the update behind it failed too: %s", mw_error_msg());
    }
    if (strstr(msg, "not committed")) return mw_error_set(err, "%s", msg);
    return mw_error_set(err, "%s (step %lld not committed; the optimizer state of step %llu is intact)", msg,
                        (long long)tr->step + 1, (unsigned long long)mw_offload_committed_steps(tr->opt->eng));
}

int mw_trainer_eval(struct mw_trainer *tr, float *val_loss)
{
    const struct mw_train_config *c = &tr->cfg;
    int64_t nb = c->val_batches > 0 ? c->val_batches : 1;
    uint64_t t0 = mw_now_ns();
    double sum = 0;
    for (int64_t k = 0; k < nb; k++) {
        val_batch(tr, (uint64_t)k);
        int err = pass_begin(tr, 0);
        if (!err) err = mw_net_forward(&tr->model, tr->inputs, tr->targets, tr->local_batch, c->seq);
        if (err) return err;
        sum += tr->model.loss;
    }
    *val_loss = (float)(sum / (double)nb);
    if (tr->zero) {
        int err = mw_train_zero_mean(tr->zero, val_loss);
        if (err) return err;
    }
    if (c->trace) phase(c->trace, "validation", t0, tr->step);
    return 0;
}

struct cand { float logit; int id; };

static int cmp_cand(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* Draws one token from logits[0..V) with temperature and top-k. */
static int32_t pick(const float *logits, int V, float temperature, int top_k, uint64_t *rng, struct cand *c)
{
    for (int i = 0; i < V; i++) c[i] = (struct cand){logits[i], i};
    int k = V;
    if (top_k > 0 && top_k < V) {
        qsort(c, (size_t)V, sizeof *c, cmp_cand);
        k = top_k;
    }
    float mx = c[0].logit;
    for (int i = 1; i < k; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0;
    for (int i = 0; i < k; i++) sum += exp(((double)c[i].logit - mx) / temperature);
    double u = (double)mw_rng_f32(rng) * sum, acc = 0;
    for (int i = 0; i < k; i++) {
        acc += exp(((double)c[i].logit - mx) / temperature);
        if (u < acc) return c[i].id;
    }
    return c[k - 1].id;
}

int mw_trainer_sample(struct mw_trainer *tr, const int32_t *prompt, int n_prompt, int n,
                      float temperature, int top_k, uint64_t seed, int32_t *out)
{
    if (n_prompt < 1 || n < 0 || !(temperature > 0))
        return mw_error_set(-EINVAL, "sampling needs a prompt of >= 1 token and a temperature > 0");
    const int V = tr->model.vocab, Vp = tr->model.padded_vocab;
    const int ctx = tr->model.opts.max_seq;
    int32_t *seq = malloc(((size_t)n_prompt + (size_t)n) * sizeof *seq);
    struct cand *cand = malloc((size_t)V * sizeof *cand);
    int err = 0;
    if (!seq || !cand) { err = mw_error_set(-ENOMEM, "no memory for sampling"); goto out; }
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    uint64_t rng = seed;
    int len = n_prompt;
    for (int i = 0; i < n; i++) {
        int w = len < ctx ? len : ctx;
        if ((err = pass_begin(tr, 0))) goto out;
        if ((err = mw_net_forward(&tr->model, seq + len - w, NULL, 1, w))) goto out;
        const float *lg = mw_net_logits(&tr->model) + (size_t)(w - 1) * (size_t)Vp;
        seq[len] = pick(lg, V, temperature, top_k, &rng, cand);
        out[i] = seq[len++];
    }
out:
    free(seq);
    free(cand);
    return err;
}

void mw_trainer_bytes(const struct mw_trainer *tr, struct mw_train_bytes *b)
{
    tr->res->ops->bytes(tr->res->self, &b->params, &b->grads);
    b->acts = tr->model.sizes.acts_bytes;
    mw_train_opt_bytes(tr->opt, &b->opt_dram, &b->opt_nvme);
}

void mw_trainer_stream_info(const struct mw_trainer *tr, struct mw_train_stream_info *si)
{
    memset(si, 0, sizeof *si);
    const struct mw_train_stream *s = tr->stream;
    if (!s) return;
    si->active = 1;
    si->prefetch_depth = s->depth;
    si->resident_peak = s->resident_peak;
    si->fetch_bytes = s->fetch_bytes;
    si->grad_write_bytes = s->grad_write_bytes;
    si->wait_s = (double)s->wait_ns / 1e9;
    si->planned_total = s->plan.total;
    si->planned_runtime = s->plan.runtime;
    si->planned_acts = s->plan.acts;
    si->planned_staging = s->plan.staging;
    si->planned_weights = s->plan.weights_peak;
    si->planned_grads = MW_MAX(s->plan.grads_peak, s->plan.step_grads);
    si->planned_streamed = MW_MAX(s->plan.passes, s->plan.step_grads);
    si->planned_dp = s->plan.dp_buffers;
}

void mw_trainer_zero_info(const struct mw_trainer *tr, struct mw_train_zero_info *zi)
{
    memset(zi, 0, sizeof *zi);
    const struct mw_train_zero *z = tr->zero;
    if (!z) return;
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
}

int mw_trainer_zero_peak(struct mw_trainer *tr, uint64_t *max_bytes, int reset)
{
    *max_bytes = 0;
    if (!tr->zero) return 0;
    int err = mw_train_zero_max_u64(tr->zero, tr->zero->resident_peak, max_bytes);
    if (!err && reset) mw_train_zero_reset_peak(tr->zero);
    return err;
}

int mw_trainer_max_u64(struct mw_trainer *tr, uint64_t v, uint64_t *max)
{
    *max = v;
    return tr->zero ? mw_train_zero_max_u64(tr->zero, v, max) : 0;
}

int mw_trainer_zero_grads_peak(struct mw_trainer *tr, uint64_t *max_bytes)
{
    *max_bytes = 0;
    return tr->zero ? mw_train_zero_max_u64(tr->zero, tr->zero->grads_resident_peak, max_bytes) : 0;
}

static int save_unit_fn(void *user, int event, int unit, int backward)
{
    struct mw_residency *r = user;
    (void)backward;
    return event == MW_NET_UNIT_ACQUIRE ? r->ops->unit_get(r->self, unit) : r->ops->unit_put(r->self, unit);
}

int mw_trainer_save_safetensors(struct mw_trainer *tr, const char *path, int write)
{
    struct mw_residency *r = tr->res;
    int err = mw_trainer_finish(tr);
    if (!err) err = r->ops->save_begin(r->self);
    if (!err && write) err = mw_net_save_safetensors_units(&tr->model, path, save_unit_fn, r);
    int err2 = r->ops->save_end(r->self);
    return err ? err : err2;
}
