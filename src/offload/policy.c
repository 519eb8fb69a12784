/*
 * policy.c — which engine updates a subgroup: the CPU or the accelerator.
 *
 * The fixed policies say it by the subgroup's number; auto follows the plan chosen between steps
 * from the corrected cost model (costplan.c: the whole step simulated under each candidate, with
 * hysteresis), not a per-subgroup greedy choice (which lost to all-cpu by 1.48x when the device
 * was the slower engine). Every decision carries both sides' corrected predictions, so their
 * accuracy can be read from every run, whatever the policy.
 */
#include "offload/internal.h"

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <errno.h>

const char *mw_offload_policy_name(enum mw_offload_policy p)
{
    switch (p) {
    case MW_OFFLOAD_POLICY_AUTO: return "auto";
    case MW_OFFLOAD_POLICY_ALL_CPU: return "all-cpu";
    case MW_OFFLOAD_POLICY_ALL_DEVICE: return "all-device";
    case MW_OFFLOAD_POLICY_EVERY_K: return "every-k";
    }
    return "?";
}

int mw_offload_policy_parse(const char *s, enum mw_offload_policy *p, int *k)
{
    if (!strcmp(s, "auto")) { *p = MW_OFFLOAD_POLICY_AUTO; return 0; }
    if (!strcmp(s, "all-cpu")) { *p = MW_OFFLOAD_POLICY_ALL_CPU; return 0; }
    if (!strcmp(s, "all-device")) { *p = MW_OFFLOAD_POLICY_ALL_DEVICE; return 0; }
    if (!strncmp(s, "every-", 6)) {
        char *end;
        long v = strtol(s + 6, &end, 10);
        if (end != s + 6 && !*end && v >= 1 && v <= 1000000) {
            *p = MW_OFFLOAD_POLICY_EVERY_K;
            if (k) *k = (int)v;
            return 0;
        }
    }
    return mw_error_set(-EINVAL, "policy '%s': expected auto, all-cpu, all-device or every-K (K >= 1)", s);
}

int mw_offload_set_policy(struct mw_offload *e, enum mw_offload_policy p, int k)
{
    if (e->n_started || e->in_backward || e->in_flight)
        return mw_error_set(-EBUSY, "offload set_policy: not allowed while a step is in progress");
    if (p == MW_OFFLOAD_POLICY_AUTO && !e->plan_sg)
        return mw_error_set(-EINVAL, "offload set_policy: auto needs an engine made with auto and the accelerator");
    if (p == MW_OFFLOAD_POLICY_EVERY_K && k < 1)
        return mw_error_set(-EINVAL, "offload set_policy: every-k needs k >= 1 (got %d)", k);
    if (p != MW_OFFLOAD_POLICY_ALL_CPU && !e->dev)
        return mw_error_set(-EINVAL, "offload set_policy: policy %s needs the accelerator (use_device)",
                            mw_offload_policy_name(p));
    if (p != MW_OFFLOAD_POLICY_AUTO && p != MW_OFFLOAD_POLICY_ALL_CPU && p != MW_OFFLOAD_POLICY_ALL_DEVICE &&
        p != MW_OFFLOAD_POLICY_EVERY_K)
        return mw_error_set(-EINVAL, "offload set_policy: unknown policy %d", (int)p);
    e->cfg.policy = p;
    if (p == MW_OFFLOAD_POLICY_EVERY_K) e->cfg.every_k = k;
    return 0;
}

/* The corrected model's times of subgroup sg in context ctx (cost.h, costplan.c). Bytes: the
 * subgroup's NVMe object read and written (none with the state in DRAM), and the device job's copies
 * (device.c: in the state, the gradients and a weight copy; out all but the gradients). */
static void plan_sg_fill(const struct mw_offload *e, uint32_t sg, enum ofl_cost_ctx ctx, struct ofl_plan_sg *g)
{
    const struct ofl_cost *c = &e->cost;
    uint64_t n = e->sgs[sg].n;
    memset(g, 0, sizeof *g);
    if (e->txn) {
        uint64_t off, len;
        ofl_nvme_span((struct mw_offload *)e, sg, &off, &len);
        g->read = ofl_cost_predict(c, OFL_COST_READ, OFL_CTX_QUIET, (double)len);
        g->write = ofl_cost_predict(c, OFL_COST_WRITE, OFL_CTX_QUIET, (double)len);
    }
    g->cpu = ofl_cost_predict(c, OFL_COST_CPU, ctx, (double)n);
    uint64_t in = ofl_dev_job_bytes(&e->cfg, n), out = in > 4 * n ? in - 4 * n : in;
    g->h2d = ofl_cost_predict(c, OFL_COST_H2D, ctx, (double)in);
    g->dev = ofl_cost_predict(c, OFL_COST_DEV, ctx, (double)n);
    g->d2h = ofl_cost_predict(c, OFL_COST_D2H, ctx, (double)out);
}

enum ofl_cost_ctx ofl_policy_ctx(const struct mw_offload *e)
{
    int computing = e->in_backward || (e->in_flight && !e->caller_waiting && !e->caller_sync);
    return computing ? OFL_CTX_SHARED : OFL_CTX_QUIET;
}

int ofl_policy_decide(struct mw_offload *e, uint32_t sg)
{
    struct ofl_sg *s = &e->st[sg];
    struct ofl_plan_sg g;
    s->ctx = ofl_policy_ctx(e);
    plan_sg_fill(e, sg, s->ctx, &g);
    s->pred_cpu_s = g.cpu;
    s->pred_dev_s = e->dev ? g.h2d + g.dev + g.d2h : 1e30;
    int dev = 0;
    switch (e->cfg.policy) {
    case MW_OFFLOAD_POLICY_ALL_CPU: dev = 0; break;
    case MW_OFFLOAD_POLICY_ALL_DEVICE: dev = 1; break;
    case MW_OFFLOAD_POLICY_EVERY_K: dev = (int)(sg % (uint32_t)e->cfg.every_k) == e->cfg.every_k - 1; break;
    case MW_OFFLOAD_POLICY_AUTO: dev = e->plan_auto.set && ofl_plan_on_device(&e->plan_auto.cur, sg, e->nsg); break;
    }
    return e->dev ? dev : 0;
}

static int64_t plan_ns(double s) { return s > 0 ? (s < 9e9 ? (int64_t)(s * 1e9) : (int64_t)9e18) : 0; }

/* The plan ratios' history (cost.h, ofl_plan_predict) after a step run with `ndev` subgroups on the
 * device that took measured_s, simulated_s by the model (each count's ratio is made from the
 * histories by ofl_plan_next). */
static void plan_ratios(struct mw_offload *e, uint32_t ndev, double measured_s, double simulated_s)
{
    if (measured_s > 0 && simulated_s > 0) {
        ofl_cost_hist_add(&e->plan_hist[ndev], measured_s / simulated_s);
        e->plan_hist[ndev].at = e->committed;
    }
}

/* The corrected model's times for the next step, and what the last one taught beyond the components:
 * how the device's jobs overlapped (the device span) and how far the plan's step was from its
 * simulation (the plan ratio; not from the first step, which is cold). */
static void plan_inputs(struct mw_offload *e)
{
    uint32_t ndev = 0;
    for (uint32_t i = 0; i < e->nsg; i++) {
        plan_sg_fill(e, i, e->cost.hint, &e->plan_sg[i]);
        e->plan_mask[i] = (unsigned char)e->st[i].on_dev;
        ndev += e->plan_mask[i];
    }
    int ran = e->committed > 0, dev_ran = e->dev_t1 > e->dev_t0 && e->dev_t0;
    if (e->committed > 1) e->plan_mask_tried[ndev] = 1; /* run after the cold first step (measured or not) */
    double span = 0;
    if (dev_ran) {
        ofl_plan_simulate_mask(e->plan_sg, e->nsg, e->plan_mask, &span);
        ofl_cost_learn_span(&e->cost, e->tr, (double)(e->dev_t1 - e->dev_t0) * 1e-9, span, mw_now_ns());
    }
    for (uint32_t i = 0; i < e->nsg; i++) {
        e->plan_sg[i].h2d *= e->cost.kspan;
        e->plan_sg[i].dev *= e->cost.kspan;
        e->plan_sg[i].d2h *= e->cost.kspan;
    }
    double meas = ran && e->committed > 1 && e->t_last_done > e->step_t0 ? (double)(e->t_last_done - e->step_t0) * 1e-9 : 0;
    /* A step is no shorter than its device's span, unless the device keeps its own time (the
     * emulator's clock=virtual): then the step's wall time says nothing about the plan. */
    if (dev_ran && (double)(e->dev_t1 - e->dev_t0) * 1e-9 > 1.05 * meas) meas = 0;
    plan_ratios(e, ndev, meas, ran ? ofl_plan_simulate_mask(e->plan_sg, e->nsg, e->plan_mask, NULL) : 0);
}

void ofl_policy_replan(struct mw_offload *e)
{
    if (e->cfg.policy != MW_OFFLOAD_POLICY_AUTO || !e->dev || !e->plan_sg) return;
    plan_inputs(e);
    ofl_plan_next(&e->plan_auto, e->plan_sg, e->nsg, e->plan_hist, e->plan_ratio, e->plan_mask_tried, e->committed,
                  &e->plan_fixed);
    /* docs/trace-conventions.md: cat "cost", "plan": the next step's split and the best fixed policy's time */
    uint64_t now = mw_now_ns();
    struct mw_trace_arg a[4] = {{"step", (int64_t)e->committed + 1},
                                {"device_subgroups", (int64_t)e->plan_auto.cur.ndev},
                                {"predicted_ns", plan_ns(e->plan_auto.cur.predicted_s)},
                                {"best_fixed_ns", plan_ns(e->plan_fixed.predicted_s)}};
    mw_trace_span(e->tr, "cost", "plan", now, now, a, 4);
}
