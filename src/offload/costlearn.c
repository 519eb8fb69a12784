/*
 * costlearn.c — the cost model corrected by the run's own measurements (design: cost.h).
 *
 * Why a factor per component and not a fitted rate: the profile's shape (time linear in elements
 * or bytes) is right for a subgroup's update; what it gets wrong is the constant (another load,
 * contention, a profile from another machine or none). One multiplicative factor per component
 * and context, smoothed over steps, corrects the constant without throwing the profile away, and
 * it is what the report can show: predicted = profile x factor of the steps before, beside the
 * measured time of the same step.
 *
 * Why a component's first step is not learned from: it pays for what only a first step does (page
 * faults on fresh staging and device buffers, cold caches, the kernel's thread team starting):
 * `memwall bench offload`'s warm-up step measured 56 ms of updates where the later ones took 2 ms,
 * and a factor learned from it took four steps to forget. The same holds for a side that auto
 * sends work to for the first time in a later step: learning from its cold step made the plan
 * flap back to the side it had just left. Those steps' predictions and measurements are still
 * reported.
 *
 * Why per step and not per observation: the policy re-plans between steps (costplan.c); a factor
 * that moved inside a step would make the step's own predictions depend on the order in which its
 * subgroups finished. The step's observations are summed and learned from at its end.
 */
#include "offload/cost.h"
#include "memwall/common.h"
#include "memwall/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const ofl_cost_names[OFL_COST_N] = {"cpu", "read", "write", "h2d", "device", "d2h"};
/* The factors as trace counters (of the context most of the step's observations had). */
static const char *const factor_names[OFL_COST_N] = {"cost factor cpu", "cost factor read", "cost factor write",
                                                     "cost factor h2d", "cost factor device", "cost factor d2h"};

void ofl_cost_init(struct ofl_cost *c, const struct mw_offload_profile *p)
{
    memset(c, 0, sizeof *c);
    c->prof = *p;
    for (int i = 0; i < OFL_COST_N; i++)
        for (int x = 0; x < OFL_CTX_N; x++) c->k[i][x] = 1.0;
    c->kspan = 1.0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ofl_cost_hist_add(struct ofl_cost_hist *h, double r)
{
    h->r[h->n++ % OFL_COST_WINDOW] = log(r);
    return ofl_cost_hist_median(h);
}

void ofl_cost_hist_keep_last(struct ofl_cost_hist *h)
{
    if (!h->n) return;
    h->r[0] = h->r[(h->n - 1) % OFL_COST_WINDOW];
    h->n = 1;
}

double ofl_cost_ring_median(const double *ring, uint32_t n)
{
    uint32_t m = MW_MIN(n, (uint32_t)OFL_COST_WINDOW);
    if (!m) return 0;
    double v[OFL_COST_WINDOW];
    memcpy(v, ring, m * sizeof *v);
    qsort(v, m, sizeof *v, cmp_d);
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

double ofl_cost_hist_median(const struct ofl_cost_hist *h) { return h->n ? exp(ofl_cost_ring_median(h->r, h->n)) : 1; }

void ofl_cost_learn_span(struct ofl_cost *c, struct mw_trace *tr, double measured_s, double simulated_s, uint64_t t)
{
    if (!(measured_s > 0) || !(simulated_s > 0) || ++c->kspan_seen <= OFL_COST_WARMUP) return;
    c->kspan = ofl_cost_hist_add(&c->kspan_hist, measured_s / simulated_s);
    mw_trace_counter(tr, "cost factor device span", t, c->kspan);
}

static double per(double units, double rate) { return rate > 0 ? units / rate : 0; }

double ofl_cost_base(const struct ofl_cost *c, enum ofl_cost_comp comp, double units)
{
    const struct mw_offload_profile *p = &c->prof;
    switch (comp) {
    case OFL_COST_CPU: return per(units, p->cpu_params_per_s);
    case OFL_COST_READ: return per(units, p->nvme_read_bytes_per_s);
    case OFL_COST_WRITE: return per(units, p->nvme_write_bytes_per_s);
    case OFL_COST_H2D:
    case OFL_COST_D2H: return per(units, p->link_bytes_per_s);
    case OFL_COST_DEV: return per(units, p->dev_params_per_s) + p->dev_latency_s;
    default: return 0;
    }
}

/* A context without a measurement of its own borrows the other's (a shared update measured,
 * a quiet one not yet), else the profile's 1. */
double ofl_cost_factor(const struct ofl_cost *c, enum ofl_cost_comp comp, enum ofl_cost_ctx ctx)
{
    if ((unsigned)comp >= OFL_COST_N || (unsigned)ctx >= OFL_CTX_N) return 1;
    if (c->hist[comp][ctx].n) return c->k[comp][ctx];
    int other = ctx == OFL_CTX_QUIET ? OFL_CTX_SHARED : OFL_CTX_QUIET;
    return c->hist[comp][other].n ? c->k[comp][other] : 1;
}

double ofl_cost_predict(const struct ofl_cost *c, enum ofl_cost_comp comp, enum ofl_cost_ctx ctx, double units)
{
    return ofl_cost_base(c, comp, units) * ofl_cost_factor(c, comp, ctx);
}

double ofl_cost_observe(struct ofl_cost *c, enum ofl_cost_comp comp, enum ofl_cost_ctx ctx, double units,
                        double meas_s)
{
    if ((unsigned)comp >= OFL_COST_N || (unsigned)ctx >= OFL_CTX_N) return 0;
    struct ofl_cost_acc *a = &c->step[comp][ctx];
    double base = ofl_cost_base(c, comp, units), pred = base * ofl_cost_factor(c, comp, ctx);
    a->base_s += base;
    a->pred_s += pred;
    a->meas_s += meas_s > 0 ? meas_s : 0;
    a->units += units;
    a->n++;
    return pred;
}

/* The disk's busy time since the last change, into its bucket: reads only, writes only, both. */
static void disk_tick(struct ofl_cost *c, uint64_t now)
{
    if (c->disk_t && now > c->disk_t && (c->disk_n[0] || c->disk_n[1]))
        c->disk_ns[c->disk_n[0] && c->disk_n[1] ? 2 : c->disk_n[0] ? 0 : 1] += now - c->disk_t;
    c->disk_t = now;
}

void ofl_cost_io_begin(struct ofl_cost *c, int write, uint64_t now)
{
    disk_tick(c, now);
    c->disk_n[write ? 1 : 0]++;
}

void ofl_cost_io_end(struct ofl_cost *c, int write, uint64_t bytes, uint64_t now)
{
    disk_tick(c, now);
    int w = write ? 1 : 0;
    if (c->disk_n[w] > 0) c->disk_n[w]--;
    c->io_units[w] += (double)bytes;
    c->io_n[w] += bytes > 0;
}

/* The step's disk bytes become one observation each for reads and writes, timed by the disk's
 * busy time; the time both were in flight is split in proportion to their profile times. */
static void disk_observe(struct ofl_cost *c)
{
    double br = ofl_cost_base(c, OFL_COST_READ, c->io_units[0]);
    double bw = ofl_cost_base(c, OFL_COST_WRITE, c->io_units[1]);
    double both = (double)c->disk_ns[2] * 1e-9, share = br + bw > 0 ? br / (br + bw) : 0.5;
    static const enum ofl_cost_comp comp[2] = {OFL_COST_READ, OFL_COST_WRITE};
    double meas[2] = {(double)c->disk_ns[0] * 1e-9 + both * share, (double)c->disk_ns[1] * 1e-9 + both * (1 - share)};
    for (int w = 0; w < 2; w++) {
        if (!(c->io_units[w] > 0)) continue;
        ofl_cost_observe(c, comp[w], OFL_CTX_QUIET, c->io_units[w], meas[w]);
        c->step[comp[w]][OFL_CTX_QUIET].n += c->io_n[w] - 1; /* n counts the transfers */
    }
    memset(c->io_units, 0, sizeof c->io_units);
    memset(c->io_n, 0, sizeof c->io_n);
    memset(c->disk_ns, 0, sizeof c->disk_ns);
}

static void acc_add(struct ofl_cost_acc *to, const struct ofl_cost_acc *a)
{
    to->base_s += a->base_s;
    to->pred_s += a->pred_s;
    to->meas_s += a->meas_s;
    to->units += a->units;
    to->n += a->n;
}

/* Seconds as ns, clamped so the cast is defined. */
static int64_t ns_of(double s) { return s > 0 ? (s < 9e9 ? (int64_t)(s * 1e9) : (int64_t)9e18) : 0; }

void ofl_cost_step_end(struct ofl_cost *c, struct mw_trace *tr, uint64_t step, uint64_t t0, uint64_t t1)
{
    disk_tick(c, t1);
    disk_observe(c);
    c->steps++;
    uint64_t nctx[OFL_CTX_N] = {0};
    for (int x = 0; x < OFL_CTX_N; x++) nctx[x] = c->step[OFL_COST_CPU][x].n + c->step[OFL_COST_DEV][x].n;
    if (nctx[0] || nctx[1]) c->hint = nctx[OFL_CTX_SHARED] > nctx[OFL_CTX_QUIET] ? OFL_CTX_SHARED : OFL_CTX_QUIET;
    for (int i = 0; i < OFL_COST_N; i++) {
        struct ofl_cost_acc sum = {0};
        for (int x = 0; x < OFL_CTX_N; x++) {
            struct ofl_cost_acc *a = &c->step[i][x];
            acc_add(&sum, a);
            if (!a->n || !(a->base_s > 0) || !(a->meas_s > 0) || ++c->seen[i][x] <= OFL_COST_WARMUP) continue;
            double r = a->meas_s / a->base_s;
            c->k[i][x] = ofl_cost_hist_add(&c->hist[i][x], r);
        }
        if (!sum.n) continue;
        acc_add(&c->run[i], &sum);
        if (c->steps > OFL_COST_LEARNED_AFTER) acc_add(&c->late[i], &sum);
        int dom = c->step[i][OFL_CTX_SHARED].n > c->step[i][OFL_CTX_QUIET].n ? OFL_CTX_SHARED : OFL_CTX_QUIET;
        struct mw_trace_arg a[4] = {{"step", (int64_t)step},
                                    {"n", (int64_t)sum.n},
                                    {"predicted_ns", ns_of(sum.pred_s)},
                                    {"measured_ns", ns_of(sum.meas_s)}};
        mw_trace_span(tr, "cost", ofl_cost_names[i], t0, t1, a, 4);
        mw_trace_counter(tr, factor_names[i], t1, c->k[i][dom]);
    }
    memset(c->step, 0, sizeof c->step);
}
