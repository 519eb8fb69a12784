/*
 * budget.c — a DRAM budget picks the streamed run's knobs (issue "A house for every model",
 * "A budget picks the knobs"): with --dram-budget and the pipeline knobs left to memwall, the
 * subgroup size, the staging buffers, the prefetch depth and where the blocks' activations go are
 * chosen so that the run fits, by the same plan the trainer checks before its first step
 * (mw_train_plan_stream), and the run is refused only when nothing fits, naming the smallest
 * budget that would.
 *
 * Why this order of preference: what the measurements (docs/train.md, "Streaming") say costs
 * least when it shrinks comes first. The prefetch depth is kept longest (a unit not read ahead
 * is a stall in every pass), then the staging buffers down to 3 (the update's read, update and
 * write overlap), the subgroup size down to 256 Ki elements (below that the I/O pieces get small),
 * then 2 buffers and prefetch 1, and last the activations recomputed instead of written to NVMe.
 * With the knobs chosen and room left, a batch-major run without accumulation keeps each step's
 * gradients in DRAM too (MW_FIT_GRADS: 2 x 4 bytes a parameter of disk traffic less a step, and no
 * kernel zeroing of their pages; docs/train.md), then keeps a tied embedding resident from its
 * lookup to the LM head (no second fetch in the forward), the other choices unchanged.
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "memwall/plan.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const uint64_t sg_sizes[] = {4u << 20, 2u << 20, 1u << 20, 512u << 10, 256u << 10};
static const int buffer_counts[] = {8, 6, 4, 3, 2};
static const int depths[] = {2, 1, 0};

struct cand { uint64_t sg; int buffers, depth, acts_nvme, keep_grads, keep_tied; };

/* The plan's runtime part is the resident set measured now; the trainer measures it again just
 * before its own check, a little later (the data mapped, the trace recorder made). A plan is
 * taken only with this much room to spare, and a refusal names a budget with it. */
static uint64_t margin(uint64_t total) { return ((uint64_t)4 << 20) + total / 100; }

static int plan_of(const struct mw_net_config *mc, const struct mw_train_config *cfg, const struct cand *c,
                   uint64_t *total)
{
    struct mw_train_config t = *cfg;
    t.subgroup_size = c->sg;
    t.buffer_count = c->buffers;
    t.prefetch_depth = c->depth;
    t.acts_nvme = c->acts_nvme;
    t.keep_grads = c->keep_grads;
    t.keep_tied = c->keep_tied;
    struct mw_plan_stream p;
    int err = mw_train_plan_stream(mc, &t, &p, NULL);
    if (!err) *total = p.total;
    return err;
}

/* With the knobs of c fitting the budget: *flag = 1 stays when that plan fits too (*total its peak),
 * else *flag goes back to was. */
static int try_keep(const struct mw_net_config *mc, const struct mw_train_config *cfg, struct cand *c, int *flag,
                    int was, uint64_t *total, struct mw_train_fit *out)
{
    uint64_t t = 0;
    *flag = 1;
    int err = plan_of(mc, cfg, c, &t);
    if (err) return err;
    out->tried++;
    if (t + margin(t) <= cfg->dram_budget) *total = t;
    else *flag = was;
    return 0;
}

int mw_train_fit_budget(const struct mw_net_config *mc, struct mw_train_config *cfg, unsigned free_knobs,
                        struct mw_train_fit *out)
{
    memset(out, 0, sizeof *out);
    if (!cfg->dram_budget || cfg->offload_params != MW_TIER_NVME || !free_knobs) return 0;
    /* The candidates: each free knob over its values, the given ones as given. */
    struct cand c;
    uint64_t best_need = UINT64_MAX;
    struct cand best = {0};
    int nacts = (free_knobs & MW_FIT_ACTS) && cfg->layer_major && cfg->acts_nvme ? 2 : 1;
    int nd = free_knobs & MW_FIT_PREFETCH ? 3 : 1, ns = free_knobs & MW_FIT_SUBGROUP ? 5 : 1;
    int nb = free_knobs & MW_FIT_BUFFERS ? 5 : 1;
    /* Gradients kept between steps: batch-major without accumulation (with it they are kept anyway). */
    int keeps_free = (free_knobs & MW_FIT_GRADS) && !cfg->keep_grads && !cfg->layer_major && cfg->grad_accum == 1;
    for (int a = 0; a < nacts; a++)
        for (int d = 0; d < nd; d++)
            for (int si = 0; si < ns; si++)
                for (int b = 0; b < nb; b++) {
                    c.acts_nvme = a ? 0 : cfg->acts_nvme;
                    c.depth = free_knobs & MW_FIT_PREFETCH ? depths[d] : cfg->prefetch_depth;
                    c.sg = free_knobs & MW_FIT_SUBGROUP ? sg_sizes[si] : cfg->subgroup_size;
                    c.buffers = free_knobs & MW_FIT_BUFFERS ? buffer_counts[b] : cfg->buffer_count;
                    c.keep_grads = cfg->keep_grads;
                    c.keep_tied = cfg->keep_tied;
                    /* 2 buffers only with prefetch 1 or less: the preference order above */
                    if (c.buffers == 2 && c.depth == 2 && nd > 1) continue;
                    uint64_t total = 0;
                    int err = plan_of(mc, cfg, &c, &total);
                    if (err) return err;
                    out->tried++;
                    uint64_t need = total + margin(total);
                    if (need <= cfg->dram_budget) {
                        /* With room left, the same knobs otherwise: the step's gradients kept in
                         * DRAM (MW_FIT_GRADS), then a tied embedding from its lookup to the head. */
                        if (keeps_free && ((err = try_keep(mc, cfg, &c, &c.keep_grads, cfg->keep_grads, &total, out)) ||
                                           (err = try_keep(mc, cfg, &c, &c.keep_tied, cfg->keep_tied, &total, out))))
                            return err;
                        out->changed = c.sg != (cfg->subgroup_size ? cfg->subgroup_size : sg_sizes[0]) ||
                                       c.buffers != cfg->buffer_count || c.keep_grads != cfg->keep_grads ||
                                       c.keep_tied != cfg->keep_tied ||
                                       c.depth != cfg->prefetch_depth || c.acts_nvme != cfg->acts_nvme;
                        cfg->subgroup_size = c.sg;
                        cfg->buffer_count = c.buffers;
                        cfg->prefetch_depth = c.depth;
                        cfg->acts_nvme = c.acts_nvme;
                        cfg->keep_grads = c.keep_grads;
                        cfg->keep_tied = c.keep_tied;
                        out->chosen_total = total;
                        return 0;
                    }
                    if (need < best_need) { best_need = need; best = c; }
                }
    char b1[32], b2[32];
    /* Named with 2 % more: the next process measures its own resident set again. */
    if (best_need < UINT64_MAX - best_need / 50) best_need += best_need / 50;
    out->need_min = best_need;
    return mw_error_set(MW_EBUDGET, "DRAM budget %s is too small for this streamed run with any subgroup size, staging "
                        "buffer count, prefetch depth and activation placement: the smallest plan needs %s (subgroups of "
                        "%llu parameters, %d buffers, prefetch depth %d, activations %s); raise the DRAM budget "
                        "(dram_budget) to that, or lower the batch (batch) or the sequence length (seq)", mw_fmt_bytes(b1, sizeof b1, cfg->dram_budget),
                        mw_fmt_bytes(b2, sizeof b2, best_need), (unsigned long long)best.sg, best.buffers, best.depth,
                        best.acts_nvme ? "on NVMe" : "recomputed");
}
