/*
 * pysession.c — whole-state offload for a model whose passes run in the caller (PyTorch; issue
 * 25): the session of memwall/pyapi.h. It is the C trainer's step taken apart into the calls a
 * framework's hooks can make, over the same pieces the trainer uses.
 *
 * Why this shape: the residency machine (src/train/residency.h: sources, the unit-order machine
 * of units.c, NVMe streaming of stream.c) and the optimizer seam (optimizer_step.h) already do
 * everything whole-state offload needs, and they read a model only through its table. So the
 * session builds a foreign net (memwall/foreign.h: the table from the caller's description) and
 * hands it to the same factory as `memwall train` (mw_residency_open/attach around
 * mw_train_opt_init), inside a struct mw_trainer that has no data: the factory reads only the
 * trainer's configuration and model. Then each session call is one piece of mw_trainer_step
 * (trainer.c, batch-major), in its order: pass_begin, the model's unit hook, backward_begin (at
 * micro-batch 0: the update before commits, step_begin zeroes the gradients), grad_ready,
 * backward_end, the gradient norm, clipping folded into the update's scale, the update (behind the
 * next forward when the optimizer is on NVMe), after_step. Nothing of that logic is repeated here.
 *
 * What the session adds is what a caller outside memwall can get wrong and the trainer cannot:
 * micro-batches out of sequence, gradients reported out of order (streaming writes everything above
 * a reported unit as final: a later report below would be lost), a step without the last
 * micro-batch. Each is refused with a message. With resident weights the acquires are checked
 * against the order too, by the same machine (units.c) with a source that only waits for the
 * overlapped update of the unit, so a changed module order is the same error in both placements.
 *
 * Crash-anywhere resume comes from the same engine: with the optimizer on NVMe every step is
 * committed with a record (docs/resume.md), whose caller part here is the session's own (section
 * "commit records, resume"): the foreign family's config cannot be rebuilt from a record, so the
 * session keeps its description's digest there and a resume is opened with the caller's
 * description again, checked against it.
 *
 * Threads: one caller thread at a time (the trainer's rule); the engine's own threads run the
 * update and the I/O behind it.
 */
#include "memwall/pyapi.h"
#include "memwall/common.h"
#include "memwall/foreign.h"
#include "memwall/trace.h"
#include "memwall/train.h"
#include "train/optimizer_step.h"
#include "train/residency.h"
#include "train/stream.h"
#include "train/units.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mw_pysession {
    struct mw_trainer tr;     /* the factory's trainer, without data: cfg, model, opt, res */
    struct mw_units check;    /* resident weights: the order check (streamed: the stream's machine) */
    int checking;
    char *nvme_dir;           /* owned: the engine borrows it */
    int64_t step;             /* steps taken */
    int next_micro;           /* the micro-batch backward_begin expects; -1: the step comes first */
    int in_backward, last;    /* inside a backward bracket; of the step's last micro-batch */
    int grads_final;          /* the last micro-batch's backward ended: the norm and the step may come */
    int grad_unit;            /* the unit whose gradients were reported last in this backward */
    int norm_known, norm_err; /* the step's norm, computed once */
    double norm;
    /* Commit records (the optimizer on NVMe; "resume" below): the record a resume reopened (the
     * engine borrows it at init), and the model description's wire encoding every record keeps. */
    struct mw_offload_record rec;
    int journal;
    uint8_t wire[MW_NET_CONFIG_WIRE];
};

/* ---------------------------------------------------------------- the resident order check */

static struct mw_residency *res_of(struct mw_pysession *s) { return s->tr.res; }

static int chk_issue(void *self, int u, int now) { (void)self; (void)u; (void)now; return 0; }
static int chk_wait(void *self, int u)
{
    struct mw_residency *r = res_of(self);
    return r->ops->weights(r->self, MW_NET_UNIT_ACQUIRE, u, 0);
}
static int chk_release(void *self, int u, int backward)
{
    struct mw_residency *r = res_of(self);
    return r->ops->weights(r->self, MW_NET_UNIT_RELEASE, u, backward);
}
static const struct mw_unit_source resident_check = {
    .name = "dram",
    .issue = chk_issue,
    .wait = chk_wait,
    .release = chk_release,
};
static int check_hook(void *user, int event, int unit, int backward)
{
    struct mw_pysession *s = user;
    return mw_units_hook(&s->check, event, unit, backward);
}

/* ---------------------------------------------------------------- commit records, resume
 *
 * With the optimizer state on NVMe the engine keeps a commit record of every step (docs/resume.md:
 * two slots per subgroup, the record replaced atomically once a step's writes landed), as for
 * `memwall train`. The session's part of the record (its blob) is what a reopen must match and
 * what the C trainer's blob cannot hold (the foreign family has no decodable config):
 *     "MWPYSES1", u64 step, the model description's wire encoding (MW_NET_CONFIG_WIRE bytes:
 *     units, parameters and a crc32c of sizes, names, orders and tensors; foreign.c),
 *     u32 weights tier, u32 grad_accum, u64 subgroup size
 * A resume reads the record, refuses another description (the digest) or another placement,
 * takes the record's subgroup size when the caller gave none, and lets the engine reopen the
 * committed slot (every object checked against the record's digests) instead of writing a fresh
 * state. The session's step count is the record's: the step in flight when the process died runs
 * again, with the caller's data for that step. */

#define PYS_BLOB_MAGIC "MWPYSES1"
enum { PB_STEP = 8, PB_WIRE = 16, PB_TIER = PB_WIRE + MW_NET_CONFIG_WIRE, PB_ACCUM = PB_TIER + 4, PB_SG = PB_ACCUM + 4,
       PB_BYTES = PB_SG + 8 };

static void put_le(uint8_t *b, uint64_t v, int n) { for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get_le(const uint8_t *b, int n) { uint64_t v = 0; for (int i = 0; i < n; i++) v |= (uint64_t)b[i] << (8 * i); return v; }

static void blob_make(const struct mw_pysession *s, int64_t step, uint8_t b[PB_BYTES])
{
    memset(b, 0, PB_BYTES);
    memcpy(b, PYS_BLOB_MAGIC, 8);
    put_le(b + PB_STEP, (uint64_t)step, 8);
    memcpy(b + PB_WIRE, s->wire, MW_NET_CONFIG_WIRE);
    put_le(b + PB_TIER, (uint64_t)s->tr.cfg.offload_params, 4);
    put_le(b + PB_ACCUM, (uint64_t)s->tr.cfg.grad_accum, 4);
    put_le(b + PB_SG, s->tr.opt ? s->tr.opt->plan.subgroup_size : s->tr.cfg.subgroup_size, 8);
}

/* The record of `step` (written by the engine when that step commits), or of the state now. */
static int journal_note(struct mw_pysession *s, int64_t step)
{
    uint8_t b[PB_BYTES];
    blob_make(s, step, b);
    return mw_offload_journal_note(s->tr.opt->eng, b, sizeof b);
}
static int journal_rewrite(struct mw_pysession *s)
{
    if (!s->journal) return 0;
    uint8_t b[PB_BYTES];
    blob_make(s, s->step, b);
    return mw_offload_journal_commit(s->tr.opt->eng, b, sizeof b);
}

/* The record in dir0 read and checked against this session (hostile input: every field of the
 * blob bounded before use). resume: 0 a fresh run (a record there is refused), 1 a resume (no
 * record is refused), 2 either. On a resume cfg.resume points at s->rec. */
static int resume_prepare(struct mw_pysession *s, int resume)
{
    struct mw_train_config *c = &s->tr.cfg;
    const char *dir = c->nvme_dir ? c->nvme_dir : "run/nvme";
    if (resume < 0 || resume > 2) return mw_error_set(-EINVAL, "session: resume %d: 0 (no), 1 (yes) or 2 (auto)", resume);
    if (!c->journal) {
        if (resume == 1)
            return mw_error_set(-EINVAL, "session: resuming needs the optimizer state on NVMe (optimizer \"nvme\"): only "
                                "then is every step committed to %s", dir);
        return 0;
    }
    int err = mw_offload_record_read(dir, &s->rec);
    if (err == -ENOENT) {
        if (resume == 1)
            return mw_error_set(-ENOENT, "session: nothing to resume in %s: it holds no commit record (%s); no step of a "
                                "session there was committed (or it ended and removed its state)", dir, MW_OFFLOAD_RECORD_NAME);
        return 0;
    }
    if (err) return err; /* a torn or corrupt record: its message */
    if (resume == 0) {
        int64_t step = (int64_t)s->rec.step;
        mw_offload_record_free(&s->rec);
        return mw_error_set(-EEXIST, "session: %s holds the committed state of an earlier session (step %lld): resume it "
                            "(resume) or remove %s/memwall-offload.* to start afresh", dir, (long long)step, dir);
    }
    const uint8_t *b = s->rec.blob;
    if (s->rec.blob_len != PB_BYTES || memcmp(b, PYS_BLOB_MAGIC, 8))
        return mw_error_set(MW_EFORMAT, "session: the commit record in %s was not written by a PyTorch session (%u bytes "
                            "of the caller's part): `memwall train --resume %s` continues a run of the C trainer", dir,
                            s->rec.blob_len, dir);
    if (get_le(b + PB_STEP, 8) != s->rec.step)
        return mw_error_set(MW_EFORMAT, "session: the commit record in %s: the session's step %llu is not the engine's "
                            "%llu (corrupt record?)", dir, (unsigned long long)get_le(b + PB_STEP, 8),
                            (unsigned long long)s->rec.step);
    if (memcmp(b + PB_WIRE, s->wire, MW_NET_CONFIG_WIRE)) {
        return mw_error_set(-EINVAL, "session: the committed state in %s was made for another model description (%llu "
                            "units, %llu parameters, digest 0x%08llx; this model: %llu units, %llu parameters, digest "
                            "0x%08llx; the digest covers the units' sizes and names, the unit orders and the tensors' "
                            "names, sizes and weight decay): resume with the model and units it was made for",
                            dir, (unsigned long long)get_le(b + PB_WIRE + 4, 4),
                            (unsigned long long)get_le(b + PB_WIRE + 8, 8), (unsigned long long)get_le(b + PB_WIRE + 16, 4),
                            (unsigned long long)get_le(s->wire + 4, 4), (unsigned long long)get_le(s->wire + 8, 8),
                            (unsigned long long)get_le(s->wire + 16, 4));
    }
    uint64_t tier = get_le(b + PB_TIER, 4), sg = get_le(b + PB_SG, 8);
    if (tier != (uint64_t)c->offload_params)
        return mw_error_set(-EINVAL, "session: the committed state in %s was made with the weights %s, this session "
                            "has them %s: resume with the placement it was made with", dir,
                            tier == MW_TIER_NVME ? "streamed (weights \"nvme\")" : "resident (weights \"dram\")",
                            c->offload_params == MW_TIER_NVME ? "streamed" : "resident");
    if (sg != s->rec.subgroup_size)
        return mw_error_set(MW_EFORMAT, "session: the commit record in %s: subgroup size %llu in the session's part, %llu "
                            "in the engine's (corrupt record?)", dir, (unsigned long long)sg,
                            (unsigned long long)s->rec.subgroup_size);
    if (!c->subgroup_size) c->subgroup_size = sg; /* the engine checks a given one against the record */
    c->resume = &s->rec;
    return 0;
}

/* After the factory: the engine (reopening the record's state on a resume) and the first record. */
static int journal_start(struct mw_pysession *s)
{
    if (!s->tr.cfg.journal) return 0;
    int err = mw_train_opt_ensure(s->tr.opt);
    if (err) return err;
    if (s->tr.cfg.resume) s->step = (int64_t)s->rec.step;
    s->tr.cfg.resume = NULL; /* borrowed for the engine's init only */
    s->tr.step = s->step;
    s->journal = 1;
    return journal_rewrite(s);
}

/* The units' names for the report's residency lanes, as `memwall train` writes them. */
static void trace_units(struct mw_pysession *s)
{
    struct mw_trace *t = s->tr.cfg.trace;
    if (!t) return;
    char k[32], v[MW_FOREIGN_NAME_MAX];
    int nu = s->tr.model.n_units;
    snprintf(v, sizeof v, "%d", nu);
    mw_trace_meta(t, "units", v);
    for (int u = 0; u < nu; u++) {
        snprintf(k, sizeof k, "unit.%d.name", u);
        mw_net_unit_name(&s->tr.model, u, v, sizeof v);
        mw_trace_meta(t, k, v);
    }
}

/* ---------------------------------------------------------------- open, close */

/* The description from the flat arguments; tensors into t[n_tensors] (the caller's memory). */
static int desc_from(struct mw_foreign_desc *d, struct mw_foreign_tensor **t, int n_tensors, const uint64_t *numel,
                     const char *const *names, const unsigned *flags)
{
    *t = NULL;
    if (n_tensors <= 0) return 0;
    if (!numel || !names) return mw_error_set(-EINVAL, "session: %d tensors without their sizes or names", n_tensors);
    if (!(*t = calloc((size_t)n_tensors, sizeof **t))) return mw_error_set(-ENOMEM, "no memory");
    for (int i = 0; i < n_tensors; i++) {
        unsigned f = flags ? flags[i] : 0;
        if (f & ~MW_OFFLOAD_NO_DECAY)
            return mw_error_set(-EINVAL, "session: tensor %d ('%s') has unknown flags 0x%x", i, names[i] ? names[i] : "",
                                f);
        (*t)[i] = (struct mw_foreign_tensor){names[i], numel[i], (f & MW_OFFLOAD_NO_DECAY) != 0};
    }
    d->tensors = *t;
    d->n_tensors = n_tensors;
    return 0;
}

/* The trainer's configuration for the session, placement through the library's resolver. */
static int config_make(struct mw_pysession *s, const char *weights, const char *optimizer, uint64_t dram_budget,
                       int grad_accum, int prefetch_depth, uint64_t subgroup_size, int buffer_count, int threads)
{
    struct mw_train_config *c = &s->tr.cfg;
    memset(c, 0, sizeof *c);
    if (grad_accum < 1 || grad_accum > 65536)
        return mw_error_set(-EINVAL, "session: %d micro-batches per step (grad_accum): 1..65536", grad_accum);
    c->batch = c->seq = 1; /* the foreign model's activations are the caller's */
    c->grad_accum = grad_accum; /* the streamed plan keeps the whole gradient array through accumulation */
    c->threads = threads;
    c->nvme_dir = s->nvme_dir;
    c->subgroup_size = subgroup_size;
    c->buffer_count = buffer_count;
    c->prefetch_depth = prefetch_depth;
    c->prefetch_next_micro = 1; /* the caller's micro-batches run one after the other */
    c->prefetch_by_size = 1;    /* a tied head's read starts blocks ahead of it (units.c) */
    c->dram_budget = dram_budget;
    struct mw_train_choices ch = {.tier = optimizer, .offload_params = weights ? weights : "dram",
                                  .schedule = "batch-major", .world = 1};
    int err = mw_train_config_resolve(&ch, c);
    if (err) return err; /* journal: commit records whenever the optimizer state is on NVMe ("resume" below) */
    if (threads < 0 || prefetch_depth < 0 || prefetch_depth > 8 || buffer_count < 0)
        return mw_error_set(-EINVAL, "session: threads %d, prefetch depth %d (0..8), staging buffers %d: none negative",
                            threads, prefetch_depth, buffer_count);
    s->tr.world = 1;
    s->tr.local_batch = 1;
    return 0;
}

/* A DRAM budget picks the knobs the caller left to memwall (subgroup size, staging buffers), as
 * `memwall train --dram-budget` does (src/train/budget.c): the largest that fit, so that a model the
 * defaults would put over the budget (a 1.5 B model's 4 Mi-element subgroups: 384 MiB of staging)
 * runs instead of being refused. The prefetch depth is the caller's (offload() always gives one). A
 * resumed session keeps the record's subgroup size. The plan counts the process's resident set now
 * and the session's arrays, not the caller's activations. */
static int budget_fit(struct mw_pysession *s, const struct mw_net_config *mc, uint64_t subgroup_size, int buffer_count)
{
    struct mw_train_config *c = &s->tr.cfg;
    unsigned free_knobs = (subgroup_size || c->resume ? 0u : MW_FIT_SUBGROUP) | (buffer_count ? 0u : MW_FIT_BUFFERS) |
                          MW_FIT_GRADS;
    if (!c->dram_budget || c->offload_params != MW_TIER_NVME || !free_knobs) return 0;
    struct mw_train_fit fit;
    uint64_t sg = c->subgroup_size;
    int buffers = c->buffer_count, depth = c->prefetch_depth, acts = c->acts_nvme;
    int err = mw_train_fit_budget(mc, c, free_knobs, &fit);
    if (err != MW_EBUDGET) return err;
    /* Nothing fits: the knobs as given, and the plan's own refusal in build(), which names the parts
     * of the peak with their bytes (the fit's message speaks of the C trainer's batch and length). */
    c->subgroup_size = sg;
    c->buffer_count = buffers;
    c->prefetch_depth = depth;
    c->acts_nvme = acts;
    c->keep_grads = 0;
    c->keep_tied = 0;
    return 0;
}

/* The factory, as mw_trainer_init calls it: the model and its residency, the optimizer, the
 * source (streamed: the plan against the budget, the initial weights unit by unit into the master). */
static int build(struct mw_pysession *s, const struct mw_net_config *mc)
{
    struct mw_trainer *tr = &s->tr;
    struct mw_residency_shape shape;
    int err = mw_residency_open(tr, mc, &shape);
    if (err) return err;
    if (!(tr->opt = calloc(1, sizeof *tr->opt))) return mw_error_set(-ENOMEM, "no memory");
    if ((err = mw_train_opt_init(tr->opt, &tr->model, &shape.opt_cfg, shape.model_dram, shape.own_first, shape.own_n)) ||
        (err = mw_residency_attach(tr)) || (err = mw_net_foreign_init_status(&tr->model)))
        return err;
    if (tr->res->stream) return 0; /* the stream's machine checks the order */
    if ((err = mw_units_init(&s->check, &tr->model, &resident_check, s, 0, "unit order"))) return err;
    s->checking = 1;
    mw_net_set_weights_hook(&tr->model, check_hook, s);
    return 0;
}

int mw_pysession_open(struct mw_pysession **out, int n_units, const uint64_t *unit_numel,
                      const char *const *unit_names, int n_fwd, const int *fwd_order, int n_bwd,
                      const int *bwd_order, int n_tensors, const uint64_t *tensor_numel,
                      const char *const *tensor_names, const unsigned *tensor_flags,
                      mw_foreign_init_fn init_unit, void *init_user, const char *weights,
                      const char *optimizer, const char *nvme_dir, uint64_t dram_budget, int grad_accum,
                      int prefetch_depth, uint64_t subgroup_size, int buffer_count, int threads)
{
    return mw_pysession_open2(out, n_units, unit_numel, unit_names, n_fwd, fwd_order, n_bwd, bwd_order, n_tensors,
                              tensor_numel, tensor_names, tensor_flags, init_unit, init_user, weights, optimizer,
                              nvme_dir, dram_budget, grad_accum, prefetch_depth, subgroup_size, buffer_count, threads, 0,
                              NULL);
}

int mw_pysession_open2(struct mw_pysession **out, int n_units, const uint64_t *unit_numel,
                       const char *const *unit_names, int n_fwd, const int *fwd_order, int n_bwd,
                       const int *bwd_order, int n_tensors, const uint64_t *tensor_numel,
                       const char *const *tensor_names, const unsigned *tensor_flags,
                       mw_foreign_init_fn init_unit, void *init_user, const char *weights,
                       const char *optimizer, const char *nvme_dir, uint64_t dram_budget, int grad_accum,
                       int prefetch_depth, uint64_t subgroup_size, int buffer_count, int threads, int resume,
                       struct mw_trace *trace)
{
    if (!out) return mw_error_set(-EINVAL, "session: no place for the session");
    *out = NULL;
    struct mw_foreign_desc d = {
        .n_units = n_units, .unit_numel = unit_numel, .unit_names = unit_names, .fwd_order = fwd_order,
        .n_fwd = n_fwd, .bwd_order = bwd_order, .n_bwd = n_bwd, .init_unit = init_unit, .init_user = init_user,
    };
    struct mw_foreign_tensor *t = NULL;
    struct mw_pysession *s = calloc(1, sizeof *s);
    int err = s ? 0 : mw_error_set(-ENOMEM, "no memory");
    if (!err && nvme_dir && !(s->nvme_dir = strdup(nvme_dir))) err = mw_error_set(-ENOMEM, "no memory");
    if (!err) err = desc_from(&d, &t, n_tensors, tensor_numel, tensor_names, tensor_flags);
    if (!err)
        err = config_make(s, weights, optimizer, dram_budget, grad_accum, prefetch_depth, subgroup_size, buffer_count,
                          threads);
    struct mw_net_config mc;
    if (!err) err = mw_foreign_config(&mc, &d);
    if (!err) {
        mw_net_foreign.config_encode(mc.raw, s->wire); /* the description a record is checked against */
        s->tr.cfg.trace = trace;
        err = resume_prepare(s, resume);
    }
    if (!err) err = budget_fit(s, &mc, subgroup_size, buffer_count);
    if (!err && s->tr.cfg.offload_params == MW_TIER_NVME && n_units < 2)
        err = mw_error_set(-EINVAL, "session: streamed weights need 2 units or more (the planner walks a first unit, "
                           "blocks and a last unit); this model has %d", n_units);
    if (!err) err = build(s, &mc); /* the net copies the description: d and t may go */
    if (!err) err = journal_start(s);
    if (!err) trace_units(s);
    free(t);
    if (err) {
        mw_pysession_close(s);
        return err;
    }
    *out = s;
    return 0;
}

void mw_pysession_close(struct mw_pysession *s)
{
    if (!s) return;
    if (s->checking) mw_units_free(&s->check);
    mw_trainer_free(&s->tr); /* the engine ends before the directory string goes */
    mw_offload_record_free(&s->rec);
    free(s->nvme_dir);
    free(s);
}

/* ---------------------------------------------------------------- the arrays */

float *mw_pysession_params(struct mw_pysession *s) { return s->tr.model.params; }
float *mw_pysession_grads(struct mw_pysession *s) { return s->tr.model.grads; }
uint64_t mw_pysession_n_params(const struct mw_pysession *s) { return s->tr.model.sizes.n_params; }

int mw_pysession_unit_range(const struct mw_pysession *s, int unit, uint64_t *first, uint64_t *n)
{
    size_t a, c;
    int err = mw_net_unit_range(&s->tr.model, unit, &a, &c);
    if (err) return err;
    *first = a;
    *n = c;
    return 0;
}

int mw_pysession_unit_trim(struct mw_pysession *s, int unit, uint64_t first, uint64_t n, int flags)
{
    if (flags & ~MW_PYSESSION_TRIM_NOW) return mw_error_set(-EINVAL, "session: trim flags 0x%x unknown", (unsigned)flags);
    uint64_t a, c;
    int err = mw_pysession_unit_range(s, unit, &a, &c);
    if (err) return err;
    if (first < a || first - a > c || n > c - (first - a))
        return mw_error_set(-EINVAL, "session: trim of elements [%" PRIu64 ", +%" PRIu64 ") outside unit %d's range "
                            "[%" PRIu64 ", +%" PRIu64 ")", first, n, unit, a, c);
    struct mw_residency *r = res_of(s);
    return r->stream ? mw_train_stream_trim(r->stream, unit, first, n, flags & MW_PYSESSION_TRIM_NOW) : 0; /* only streamed weights go */
}

/* ---------------------------------------------------------------- a step, piece by piece */

int mw_pysession_pass_begin(struct mw_pysession *s, int training)
{
    if (s->in_backward) return mw_error_set(-EINVAL, "session: pass_begin inside a backward pass (backward_end first)");
    if (s->checking) mw_units_pass_begin(&s->check, !!training, 0);
    struct mw_residency *r = res_of(s);
    return r->ops->pass_begin(r->self, !!training);
}

int mw_pysession_unit(struct mw_pysession *s, int event, int unit, int backward)
{
    return mw_net_foreign_unit(&s->tr.model, event, unit, backward);
}

/* Closes the optimizer's backward bracket; the first error (err, else its own) is the one told. */
static int opt_backward_close(struct mw_pysession *s, int err)
{
    if (!err) return mw_train_opt_backward_end(s->tr.opt);
    char why[512];
    snprintf(why, sizeof why, "%s", mw_error_msg());
    (void)mw_train_opt_backward_end(s->tr.opt); /* the first failure is the one told */
    return mw_error_set(err, "%s", why);
}

int mw_pysession_backward_begin(struct mw_pysession *s, int micro, int last)
{
    if (s->in_backward) return mw_error_set(-EINVAL, "session: backward_begin inside a backward pass (backward_end first)");
    if (s->next_micro < 0)
        return mw_error_set(-EINVAL, "session: micro-batch %d after the step's last one: step() comes first", micro);
    if (micro != s->next_micro)
        return mw_error_set(-EINVAL, "session: micro-batch %d, the step expects micro-batch %d next", micro, s->next_micro);
    if (micro >= s->tr.cfg.grad_accum) /* the plan (and the budget check) counted on no more */
        return mw_error_set(-EINVAL, "session: micro-batch %d of a step; the session was opened for %d (grad_accum)",
                            micro, s->tr.cfg.grad_accum);
    struct mw_residency *r = res_of(s);
    int err = 0;
    if (micro == 0) {
        /* The update of the step before ran behind this micro-batch's forward pass (each unit
         * waited for its own subgroups); it commits before this step's gradients exist. */
        if ((err = mw_train_opt_finish(s->tr.opt)) || (err = r->ops->step_begin(r->self))) return err;
    }
    if ((err = mw_train_opt_backward_begin(s->tr.opt, !!last))) return err;
    if ((err = r->ops->backward_begin(r->self, micro, !!last))) return opt_backward_close(s, err);
    s->in_backward = 1;
    s->last = !!last;
    s->next_micro = last ? -1 : micro + 1;
    s->grad_unit = INT_MAX;
    s->norm_known = 0;
    return 0;
}

int mw_pysession_grad_ready(struct mw_pysession *s, int unit)
{
    const struct mw_net *m = &s->tr.model;
    if (!s->in_backward) return mw_error_set(-EINVAL, "session: grad_ready(%d) outside a backward pass", unit);
    size_t first, n;
    int err = mw_net_unit_range(m, unit, &first, &n);
    if (err) return err;
    if (unit >= s->grad_unit) {
        char a[MW_FOREIGN_NAME_MAX], b[MW_FOREIGN_NAME_MAX];
        mw_net_unit_name(m, unit, a, sizeof a);
        mw_net_unit_name(m, s->grad_unit, b, sizeof b);
        return mw_error_set(-EINVAL, "session: the gradients of unit %d (%s) are reported after those of unit %d (%s): a "
                            "backward pass reports its units in decreasing order, each once (everything above a "
                            "reported unit is taken as final)", unit, a, s->grad_unit, b);
    }
    s->grad_unit = unit;
    struct mw_residency *r = res_of(s);
    r->ops->grad_ready(first, n, r->self); /* a failure is kept and told by backward_end */
    return 0;
}

int mw_pysession_backward_end(struct mw_pysession *s)
{
    if (!s->in_backward) return mw_error_set(-EINVAL, "session: backward_end without backward_begin");
    struct mw_residency *r = res_of(s);
    int err = opt_backward_close(s, r->ops->backward_end(r->self));
    s->in_backward = 0;
    if (!err && s->last) s->grads_final = 1;
    return err;
}

int mw_pysession_grad_norm(struct mw_pysession *s, double *norm)
{
    if (!s->grads_final)
        return mw_error_set(-EINVAL, "session: the gradient norm is known after the last micro-batch's backward_end");
    if (!s->norm_known) {
        struct mw_residency *r = res_of(s);
        s->norm_err = r->ops->grad_norm(r->self, &s->norm);
        s->norm_known = 1;
    }
    *norm = s->norm;
    return s->norm_err;
}

static int hparams_check(double lr, double beta1, double beta2, double eps, double wd, double clip)
{
    /* Written so that a NaN fails every test (it compares false); the trainer's ranges. */
    if (!(lr >= 0 && lr <= 10) || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0 && eps <= 1) ||
        !(wd >= 0 && wd <= 10) || !(clip >= 0 && clip <= 1e9))
        return mw_error_set(-EINVAL, "session: bad AdamW hyper-parameters (lr %g, betas %g %g, eps %g, weight decay %g, "
                            "clip %g): lr in [0, 10], betas in [0, 1), eps in (0, 1], weight decay in [0, 10], clip in "
                            "[0, 1e9] (0: off)", lr, beta1, beta2, eps, wd, clip);
    return 0;
}

int mw_pysession_step(struct mw_pysession *s, double lr, double beta1, double beta2, double eps,
                      double weight_decay, double clip)
{
    int err = hparams_check(lr, beta1, beta2, eps, weight_decay, clip);
    if (err) return err;
    if (!s->grads_final)
        return mw_error_set(-EINVAL, "session: step without a finished last micro-batch (backward_begin(micro, last=1) "
                            "... backward_end)");
    int64_t t = s->step + 1;
    double norm;
    struct mw_train_opt *o = s->tr.opt;
    struct mw_residency *r = res_of(s);
    err = mw_pysession_grad_norm(s, &norm);
    int skipped = err == MW_EOVERFLOW;
    /* The record that commits step t (written by the engine once its writes landed). */
    if ((!err || skipped) && s->journal) {
        int jerr = journal_note(s, t);
        if (jerr) return jerr;
    }
    if (skipped) {
        err = mw_train_opt_skip(o, t); /* the weights stay; the step counts for bias correction */
    } else if (!err) {
        float scale = clip > 0 && norm > clip ? (float)(clip / norm) : 1.0f;
        o->beta1 = beta1; /* the optimizer's AdamW settings, read by its next step */
        o->beta2 = beta2;
        o->eps = eps;
        o->weight_decay = weight_decay;
        /* Overlapped (the optimizer on NVMe): the update runs behind the next forward pass. */
        err = s->tr.overlap ? mw_train_opt_step_start(o, lr, scale, t) : mw_train_opt_step(o, lr, scale, t);
        if (!err) err = r->ops->after_step(r->self);
    }
    if (err) return err;
    s->step = t;
    s->grads_final = 0;
    s->norm_known = 0;
    s->next_micro = 0;
    return skipped;
}

int mw_pysession_finish(struct mw_pysession *s) { return mw_train_opt_finish(s->tr.opt); }

/* Through the residency's save path (mw_trainer_save_safetensors' moves): the unit is in params
 * between unit_get and unit_put. */
int mw_pysession_unit_read(struct mw_pysession *s, int unit, float *dst)
{
    size_t first, n;
    int err = mw_net_unit_range(&s->tr.model, unit, &first, &n);
    if (err) return err;
    struct mw_residency *r = res_of(s);
    if ((err = mw_train_opt_finish(s->tr.opt)) || (err = r->ops->save_begin(r->self))) return err;
    if (!(err = r->ops->unit_get(r->self, unit))) {
        memcpy(dst, s->tr.model.params + first, n * sizeof *dst);
        err = r->ops->unit_put(r->self, unit);
    }
    int e2 = r->ops->save_end(r->self);
    return err ? err : e2;
}

/* The master of the unit's range from src (the engine writes its committed state; resident
 * weights are refreshed with it, streamed ones drop their stale pages and fetch it at next use). */
int mw_pysession_unit_write(struct mw_pysession *s, int unit, const float *src)
{
    size_t first, n;
    int err = mw_net_unit_range(&s->tr.model, unit, &first, &n);
    if (err) return err;
    if (s->in_backward || s->grads_final || s->next_micro != 0)
        return mw_error_set(-EINVAL, "session: unit %d written inside a step (between backward_begin of micro-batch 0 "
                            "and step); write units between steps", unit);
    struct mw_train_opt *o = s->tr.opt;
    struct mw_residency *r = res_of(s);
    if ((err = mw_train_opt_finish(o)) || (err = mw_train_opt_ensure(o))) return err;
    if ((err = mw_offload_write_raw(o->eng, MW_OFFLOAD_R_MASTER, first, n, src))) return err;
    /* The committed slot changed in place: the record's digests are rewritten to match it. */
    if ((err = journal_rewrite(s))) return err;
    return r->ops->after_step(r->self); /* streamed: weight pages still resident are stale now */
}

int mw_pysession_stats(const struct mw_pysession *s, double *out, int n)
{
    struct mw_train_residency_info ri;
    struct mw_offload_stats os;
    int err = mw_residency_info(s->tr.res, &ri, 0);
    if (err) return err;
    mw_train_opt_stats(s->tr.opt, &os);
    const struct mw_train_stream_info *si = &ri.stream;
    double v[MW_PYSESSION_NSTATS] = {
        (double)s->step, (double)s->tr.model.sizes.n_params, (double)s->tr.model.n_units, (double)si->planned_total,
        (double)si->resident_peak, (double)si->fetch_bytes, (double)si->grad_write_bytes, si->wait_s,
        (double)os.nvme_read_bytes, (double)os.nvme_write_bytes, (double)s->tr.opt->plan.subgroup_size,
        (double)si->prefetch_depth, (double)si->handoff_bytes, (double)(si->active && s->tr.opt->cfg.grads_dram),
    };
    int k = n < MW_PYSESSION_NSTATS ? n : MW_PYSESSION_NSTATS;
    for (int i = 0; i < k; i++) out[i] = v[i];
    return k < 0 ? 0 : k;
}

/* ---------------------------------------------------------------- the optimizer's state, the end
 * (docs/python.md, "Resume"): what OffloadAdamW.state_dict()/load_state_dict() read and write, so
 * that a checkpoint of a framework (transformers' Trainer) holds the session's moments and step
 * count by content, and the end of a session that finished (its committed state removed). */

/* The moments must be fp32 for these calls: the session's state is (the trainer's default). */
static int state_ready(struct mw_pysession *s, uint64_t first, uint64_t n, const char *what)
{
    if (first > s->tr.model.sizes.n_params || n > s->tr.model.sizes.n_params - first)
        return mw_error_set(-EINVAL, "session: %s of elements [%llu, +%llu) outside the model's %llu", what,
                            (unsigned long long)first, (unsigned long long)n,
                            (unsigned long long)s->tr.model.sizes.n_params);
    if (s->tr.opt->cfg.moments != MW_OFFLOAD_M_FP32)
        return mw_error_set(-ENOTSUP, "session: %s needs fp32 moments", what);
    if (s->in_backward || s->grads_final || s->next_micro != 0)
        return mw_error_set(-EINVAL, "session: %s inside a step (between backward_begin of micro-batch 0 and step); "
                            "between steps only", what);
    int err = mw_train_opt_finish(s->tr.opt);
    return err ? err : mw_train_opt_ensure(s->tr.opt);
}

int mw_pysession_state_read(struct mw_pysession *s, uint64_t first, uint64_t n, float *exp_avg, float *exp_avg_sq)
{
    int err = state_ready(s, first, n, "reading the optimizer state");
    if (err || !n) return err;
    const int regions[2] = {MW_OFFLOAD_R_EXP_AVG, MW_OFFLOAD_R_EXP_AVG_SQ};
    void *const dst[2] = {exp_avg, exp_avg_sq};
    return mw_offload_read_regions(s->tr.opt->eng, first, n, 2, regions, dst);
}

int mw_pysession_state_write(struct mw_pysession *s, uint64_t first, uint64_t n, const float *exp_avg,
                             const float *exp_avg_sq, int64_t steps)
{
    int err = state_ready(s, first, n, "writing the optimizer state");
    if (err) return err;
    if (steps < 0 || steps > ((int64_t)1 << 53))
        return mw_error_set(-EINVAL, "session: %lld optimizer steps (0..2^53)", (long long)steps);
    struct mw_offload *e = s->tr.opt->eng;
    const int regions[2] = {MW_OFFLOAD_R_EXP_AVG, MW_OFFLOAD_R_EXP_AVG_SQ};
    const void *const src[2] = {exp_avg, exp_avg_sq};
    if (n && (err = mw_offload_write_regions(e, first, n, 2, regions, src))) return err;
    if (steps != s->step) {
        /* The step count moves with the committed slot; the record says the new step. */
        if (s->journal && (err = journal_note(s, steps))) return err;
        if ((err = mw_offload_set_committed_steps(e, (uint64_t)steps))) return err;
        s->step = s->tr.step = steps;
    }
    return journal_rewrite(s);
}

int mw_pysession_end(struct mw_pysession *s)
{
    int err = mw_train_opt_finish(s->tr.opt);
    if (err || !s->journal) return err;
    err = mw_offload_journal_end(s->tr.opt->eng);
    if (!err) s->journal = 0;
    return err;
}

int mw_pysession_resumable(const struct mw_pysession *s) { return s->journal; }
