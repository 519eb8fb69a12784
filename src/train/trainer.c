/*
 * trainer.c — one optimizer step = grad_accum micro-batches of forward/backward, a global
 * gradient norm, clipping folded into the optimizer's grad_scale (no extra pass over the
 * gradients), warm-up + cosine learning rate, and AdamW; plus validation and sampling.
 * Why clipping as a scale: the norm needs one read of the gradients anyway; scaling them in
 * place would be a second read and write of 4 bytes/parameter, the kernel multiplies for free.
 */
#include "memwall/train.h"
#include "memwall/generate.h"
#include "memwall/common.h"
#include "memwall/trace.h"
#include "memwall/plan.h"
#include "train/acts.h"
#include "train/optimizer_step.h"
#include "train/residency.h"
#include "train/resume.h"
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
        return mw_error_set(-EINVAL, "data %s holds token %d but the model's vocabulary is %d; use a vocabulary "
                            "(vocab_size) of %d or more", d->path, d->max_token, vocab, d->max_token + 1);
    return mw_data_check(d, c->seq);
}

/* The step's schedule (docs/train.md): a table entry chosen once, at init, from the resolved
 * configuration; the step calls it and never asks which one it is. */
struct mw_train_schedule {
    const char *name;
    int (*passes)(struct mw_trainer *tr, int64_t step, struct mw_train_step_stats *st, float *loss_sum);
};
static int step_batch_major(struct mw_trainer *tr, int64_t step, struct mw_train_step_stats *st, float *loss_sum);
static int step_layer_major(struct mw_trainer *tr, int64_t step, struct mw_train_step_stats *st, float *loss_sum);
static const struct mw_train_schedule schedules[2] = {
    {"batch-major", step_batch_major},
    {"layer-major", step_layer_major},
};

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
    if (cfg->batch % tr->world)
        return mw_error_set(-EINVAL, "the global batch (%d sequences) must divide by the %d ranks", cfg->batch, tr->world);
    tr->local_batch = cfg->batch / tr->world;
    tr->schedule = &schedules[!!cfg->layer_major];
    /* The model, where its weights and gradients live, and the reduction over the ranks: the
     * factory (residency.c) builds them from the resolved configuration. */
    struct mw_residency_shape shape;
    if ((err = mw_residency_open(tr, mcfg, &shape))) goto err;
    size_t n = (size_t)tr->local_batch * (size_t)cfg->seq, ng = (size_t)cfg->batch * (size_t)cfg->seq;
    size_t na = (size_t)cfg->grad_accum; /* layer-major holds the step's micro-batches */
    tr->inputs = malloc(n * na * sizeof *tr->inputs);
    tr->targets = malloc(n * na * sizeof *tr->targets);
    tr->lm_losses = malloc(na * sizeof *tr->lm_losses);
    tr->opt = calloc(1, sizeof *tr->opt);
    if (!tr->inputs || !tr->targets || !tr->lm_losses || !tr->opt) { err = mw_error_set(-ENOMEM, "no memory for the batch"); goto err; }
    if (tr->world > 1) {
        tr->g_inputs = malloc(ng * sizeof *tr->g_inputs);
        tr->g_targets = malloc(ng * sizeof *tr->g_targets);
        if (!tr->g_inputs || !tr->g_targets) { err = mw_error_set(-ENOMEM, "no memory for the batch"); goto err; }
    }
    if ((err = mw_train_opt_init(tr->opt, &tr->model, &shape.opt_cfg, shape.model_dram, shape.own_first, shape.own_n)))
        goto err;
    if ((err = mw_residency_attach(tr))) goto err;
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
    mw_residency_close(tr, 0);       /* in-flight reads end before the engine goes */
    if (tr->opt) mw_train_opt_free(tr->opt);
    free(tr->opt);
    mw_residency_close(tr, 1);
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
    if (tr->world == 1) {
        mw_data_train_batch(tr->data, &tr->data_rng, c->batch, c->seq, inputs, targets, NULL);
        return;
    }
    mw_data_train_batch(tr->data, &tr->data_rng, c->batch, c->seq, tr->g_inputs, tr->g_targets, NULL);
    take_slice(tr, inputs, targets);
}

static void val_batch(struct mw_trainer *tr, uint64_t k)
{
    const struct mw_train_config *c = &tr->cfg;
    if (tr->world == 1) {
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
    return mw_train_acts_call(x->tr->res->acts, event, layer, mb, buf);
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
                                     tr->res->acts ? lm_acts : NULL, &x};
    err = mw_net_step_layer_major(&tr->model, c->grad_accum, tr->inputs, tr->targets, tr->local_batch, c->seq,
                                   1.0f / (float)c->grad_accum, &calls, tr->lm_losses);
    if (!err) err = tr->res->ops->backward_end(tr->res->self);
    if ((err = opt_backward_end(tr, err))) return err;
    for (int a = 0; a < c->grad_accum; a++) *loss_sum += tr->lm_losses[a];
    return 0;
}

/* Batch-major (the default): each micro-batch goes through the whole model, forward then
 * backward; the gradients accumulate across them. */
static int step_batch_major(struct mw_trainer *tr, int64_t step, struct mw_train_step_stats *st, float *loss_sum)
{
    const struct mw_train_config *c = &tr->cfg;
    struct mw_trace *trace = c->trace;
    const struct mw_residency *res = tr->res;
    uint64_t t;
    int err;
    for (int a = 0; a < c->grad_accum; a++) {
        int last = a == c->grad_accum - 1;
        t = mw_now_ns();
        train_batch(tr, tr->inputs, tr->targets);
        if (trace) phase(trace, "data", t, step);
        t = mw_now_ns();
        if ((err = pass_begin(tr, 1))) return err;
        if ((err = mw_net_forward(&tr->model, tr->inputs, tr->targets, tr->local_batch, c->seq))) return err;
        st->forward_ns += phase(trace, "forward", t, step);
        *loss_sum += tr->model.loss;
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
    return 0;
}

static int step_run(struct mw_trainer *tr, struct mw_train_step_stats *st)
{
    const struct mw_train_config *c = &tr->cfg;
    struct mw_trace *trace = c->trace;
    uint64_t t0 = mw_now_ns(), t;
    memset(st, 0, sizeof *st);
    int64_t step = tr->step + 1;
    struct mw_offload_stats s0, s1;
    mw_train_opt_stats(tr->opt, &s0);
    struct mw_residency *res = tr->res;
    mw_residency_step_begin(res, step);
    int err;
    float loss_sum = 0;
    if ((err = tr->schedule->passes(tr, step, st, &loss_sum))) return err;
    t = mw_now_ns();
    st->step = step;
    st->loss = loss_sum / (float)c->grad_accum;
    if ((err = mw_residency_mean(res, &st->loss))) return err;
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
    if ((err = mw_residency_step_end(res, st))) return err;
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
    if (!err || !tr->opt || !tr->opt->eng || tr->opt->tier != MW_TIER_NVME) return err;
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
    int err = mw_residency_mean(tr->res, val_loss);
    if (err) return err;
    if (c->trace) phase(c->trace, "validation", t0, tr->step);
    return 0;
}

/* The end of a run's sample: the sampler of `memwall generate` (mw_gen_pick: temperature, top-k,
 * the same seeded draw) over full forward passes through the residency interface, so that streamed
 * weights are fetched unit by unit as for any pass (the family's KV cache reads resident weights),
 * and a sequence longer than the context slides. */
int mw_trainer_sample(struct mw_trainer *tr, const int32_t *prompt, int n_prompt, int n,
                      float temperature, int top_k, uint64_t seed, int32_t *out)
{
    if (n_prompt < 1 || n < 0 || !(temperature > 0))
        return mw_error_set(-EINVAL, "sampling needs a prompt of >= 1 token and a temperature > 0");
    const int V = tr->model.vocab, Vp = tr->model.padded_vocab;
    const int ctx = tr->model.opts.max_seq;
    struct mw_gen_params gp;
    mw_gen_params_default(&gp);
    gp.temperature = temperature;
    gp.top_k = top_k > 0 ? top_k : 0;
    gp.seed = seed;
    int32_t *seq = malloc(((size_t)n_prompt + (size_t)n) * sizeof *seq);
    void *scratch = malloc(mw_gen_scratch_bytes(V));
    int err = 0;
    if (!seq || !scratch) { err = mw_error_set(-ENOMEM, "no memory for sampling"); goto out; }
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    uint64_t rng = seed;
    int len = n_prompt;
    for (int i = 0; i < n; i++) {
        int w = len < ctx ? len : ctx;
        if ((err = pass_begin(tr, 0))) goto out;
        if ((err = mw_net_forward(&tr->model, seq + len - w, NULL, 1, w))) goto out;
        const float *lg = mw_net_logits(&tr->model) + (size_t)(w - 1) * (size_t)Vp;
        seq[len] = mw_gen_pick(lg, V, &gp, &rng, scratch);
        out[i] = seq[len++];
    }
out:
    free(seq);
    free(scratch);
    return err;
}

void mw_trainer_bytes(const struct mw_trainer *tr, struct mw_train_bytes *b)
{
    tr->res->ops->bytes(tr->res->self, &b->params, &b->grads);
    b->acts = tr->model.sizes.acts_bytes;
    mw_train_opt_bytes(tr->opt, &b->opt_dram, &b->opt_nvme);
}

int mw_trainer_info(struct mw_trainer *tr, struct mw_train_residency_info *ri, int collective)
{
    return mw_residency_info(tr->res, ri, collective);
}

int mw_trainer_max_u64(struct mw_trainer *tr, uint64_t v, uint64_t *max)
{
    return mw_residency_max_u64(tr->res, v, max);
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
