/*
 * analyze_cost.c — the offload cost model's account in the report: per component and per step, what
 * the model predicted beside what was measured (cat "cost" spans, docs/trace-conventions.md), the
 * sums over the run and after it learned, and auto's plans.
 *
 * Why from the trace and not from the engine's counters: the report reads any trace, a finished
 * run's or one from `memwall bench offload --trace`, and the same spans give the per-step series
 * (CSV, HTML) and the totals (text), so the two cannot disagree.
 *
 * "After learning" is the steps after the first MW_REPORT_COST_LEARN_STEPS that have cost spans:
 * the model's first step predicts from the profile alone, and its factors settle over a few steps
 * (docs/offload.md); the error that matters to a placement is the one it has then.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const cost_names[MW_REPORT_COST_NCOMP] = {"cpu", "read", "write", "h2d", "device", "d2h"};

const char *mw_report_cost_name(int comp)
{
    return comp >= 0 && comp < MW_REPORT_COST_NCOMP ? cost_names[comp] : "?";
}

int mw_report_cost_is_update(int comp) { return comp == 0 || comp == 3 || comp == 4 || comp == 5; }

static int cmp_cost(const void *a, const void *b)
{
    const struct rp_cost *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step ? 1 : x->comp - y->comp;
}

/* Auto's plans: how many, how often the number of device subgroups changed, the last one. */
static void plans(struct mw_report_cost *c, const struct rp_trace *t)
{
    int64_t prev = -1;
    for (size_t i = 0; i < t->ncost; i++) {
        const struct rp_cost *p = &t->cost[i];
        if (p->comp != RP_COST_PLAN) continue;
        if (c->nplans && p->n != prev) c->plan_switches++;
        c->nplans++;
        prev = p->n;
        c->plan_step = p->step;
        c->plan_device_subgroups = p->n;
        c->plan_predicted_s = p->pred_s;
        c->plan_best_fixed_s = p->meas_s;
    }
}

int rp_analyze_cost(struct mw_report *r, struct rp_trace *t)
{
    struct mw_report_cost *c = &r->cost;
    memset(c, 0, sizeof *c);
    if (!t->ncost) return 0;
    plans(c, t); /* in file order, before the sort below */
    qsort(t->cost, t->ncost, sizeof *t->cost, cmp_cost);
    c->steps = calloc(t->ncost, sizeof *c->steps);
    if (!c->steps) return -ENOMEM;
    for (size_t i = 0; i < t->ncost; i++) { /* in step order: one entry per step */
        const struct rp_cost *x = &t->cost[i];
        if (x->comp == RP_COST_PLAN || x->step < 0 || !(x->pred_s >= 0) || !(x->meas_s >= 0)) continue;
        if (!c->nsteps || c->steps[c->nsteps - 1].step != x->step) c->steps[c->nsteps++].step = x->step;
        struct mw_report_cost_step *s = &c->steps[c->nsteps - 1];
        s->predicted_s[x->comp] += x->pred_s;
        s->measured_s[x->comp] += x->meas_s;
        s->n[x->comp] += x->n > 0 ? x->n : 0;
    }
    for (int i = 0; i < c->nsteps; i++) {
        const struct mw_report_cost_step *s = &c->steps[i];
        int late = i >= MW_REPORT_COST_LEARN_STEPS;
        c->late_steps += late;
        for (int j = 0; j < MW_REPORT_COST_NCOMP; j++) {
            c->n[j] += s->n[j];
            c->predicted_s[j] += s->predicted_s[j];
            c->measured_s[j] += s->measured_s[j];
            if (!late) continue;
            c->late_predicted_s[j] += s->predicted_s[j];
            c->late_measured_s[j] += s->measured_s[j];
        }
    }
    return 0;
}
