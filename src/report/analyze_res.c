/*
 * analyze_res.c — weight residency (NVMe streaming of weights and gradients) and the per-step
 * roofline.
 *
 * Why: when weights and gradients stream from NVMe, a step cannot be shorter than the larger
 * of its compute and the time the one disk needs for the step's bytes. The fraction of that
 * bound a step reaches says whether the schedule hides the I/O (close to 1) or leaves the disk
 * and the CPU idle in turn. The per-unit table and lanes show how long each unit stayed in
 * DRAM, whether its fetch ran ahead of its use, and where the training thread still waited.
 *
 * Definitions (docs/report.md):
 *   per unit: fetches and bytes read = its "fetch" spans; grad writes = its "grad_write" spans;
 *     time resident = union of its "resident" spans (and of those with backward 0 / 1);
 *     exposed wait = sum of its "wait" spans (one training thread: they do not overlap);
 *   per step (exposed wait and bytes from analyze_steps.c):
 *     compute = wall - |(offload wait ∪ residency wait ∪ comm wait) ∩ step|;
 *     NVMe = bytes read from nvme / read bandwidth + bytes written to nvme / write bandwidth
 *       (reads and writes share the disk, so their times add);
 *     bound = max(compute, NVMe); achieved fraction = bound / wall;
 *   the run's figure: median of the fraction over the steady steps: all but the first (warm-up)
 *     and, with three or more, the last (drain: its update overlaps nothing).
 */
#include "report/report_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

int rp_res_wait_ivls(const struct rp_trace *t, struct rp_ivls *out)
{
    for (size_t i = 0; i < t->nres; i++)
        if (t->res[i].name == RP_RES_WAIT && rp_ivls_push(out, t->res[i].t0, t->res[i].t1)) return -ENOMEM;
    return 0;
}

static int cmp_res(const void *x, const void *y)
{
    const struct rp_res *p = x, *q = y;
    if (p->unit != q->unit) return p->unit < q->unit ? -1 : 1;
    return p->t0 < q->t0 ? -1 : p->t0 > q->t0 ? 1 : 0;
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b ? 1 : 0;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* A running union of intervals arriving in order of start time. */
struct run_union { double a, b, total; int open; };

static void union_add(struct run_union *u, double a, double b)
{
    if (!(b > a)) return;
    if (u->open && a <= u->b) { u->b = MW_MAX(u->b, b); return; }
    if (u->open) u->total += u->b - u->a;
    u->a = a; u->b = b; u->open = 1;
}

static double union_end(struct run_union *u)
{
    if (u->open) u->total += u->b - u->a;
    u->open = 0;
    return u->total;
}

/* The unit's name: the metadata's (the last one given), else from the layout of the units
 * (0 embeddings, 1..L blocks h.0..h.L-1, L+1 ln_f) when "units" is known, else "unit <id>". */
static void unit_name(const struct rp_trace *t, int64_t id, char *b, size_t n)
{
    for (size_t i = t->nunit_names; i-- > 0;)
        if (t->unit_names[i].id == id) { snprintf(b, n, "%s", t->unit_names[i].name); return; }
    int64_t L = t->units_declared - 2;
    if (L >= 0 && id == 0) snprintf(b, n, "embeddings");
    else if (L >= 0 && id == L + 1) snprintf(b, n, "ln_f");
    else if (L >= 0 && id <= L) snprintf(b, n, "h.%lld", (long long)(id - 1));
    else snprintf(b, n, "unit %lld", (long long)id);
}

static int bin_of(const struct mw_report *r, double x)
{
    double b = (x - r->t0_s) / r->bin_s;
    if (!(b >= 0)) return 0;
    return b >= r->nbins ? r->nbins - 1 : (int)b;
}

/* Adds the seconds of [a, b) falling in each bin to cov[bin * NLANE + lane]. */
static void spread(const struct mw_report *r, double *cov, int lane, double a, double b)
{
    if (!(b > a)) return;
    for (int k = bin_of(r, a), e = bin_of(r, b); k <= e; k++) {
        double x0 = MW_MAX(a, r->t0_s + k * r->bin_s), x1 = k == e ? b : MW_MIN(b, r->t0_s + (k + 1) * r->bin_s);
        if (x1 > x0) cov[(size_t)k * MW_REPORT_RES_NLANE + lane] += x1 - x0;
    }
}

static int units_table(struct mw_report *r, struct rp_trace *t)
{
    size_t n = t->nres + t->nunit_names;
    if (!n) return 0;
    int64_t *ids = malloc(n * sizeof *ids);
    if (!ids) return -ENOMEM;
    for (size_t i = 0; i < t->nres; i++) ids[i] = t->res[i].unit;
    for (size_t i = 0; i < t->nunit_names; i++) ids[t->nres + i] = t->unit_names[i].id;
    qsort(ids, n, sizeof *ids, cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || ids[i] != ids[u - 1]) ids[u++] = ids[i];
    r->units = calloc(u, sizeof *r->units);
    if (!r->units) { free(ids); return -ENOMEM; }
    r->nunits = (int)u;
    int lanes = u <= MW_REPORT_MAX_UNIT_LANES;
    for (size_t i = 0; i < u; i++) {
        struct mw_report_unit *U = &r->units[i];
        U->id = ids[i];
        unit_name(t, U->id, U->name, sizeof U->name);
        if (lanes && !(U->cov = calloc((size_t)r->nbins * MW_REPORT_RES_NLANE, sizeof *U->cov))) {
            free(ids);
            return -ENOMEM;
        }
    }
    /* One pass over the spans grouped by unit, each group in time order. */
    if (t->nres) qsort(t->res, t->nres, sizeof *t->res, cmp_res);
    size_t k = 0;
    for (size_t i = 0; i < u; i++) {
        struct mw_report_unit *U = &r->units[i];
        struct run_union all = {0}, fwd = {0}, bwd = {0};
        for (; k < t->nres && t->res[k].unit == U->id; k++) {
            const struct rp_res *s = &t->res[k];
            double d = s->t1 - s->t0;
            uint64_t b = (uint64_t)s->bytes;
            int lane = -1;
            switch (s->name) {
            case RP_RES_FETCH: U->fetches++; U->bytes_read += b; U->fetch_s += d; lane = MW_REPORT_RES_FETCH; break;
            case RP_RES_GRAD_WRITE:
                U->grad_writes++; U->bytes_written += b; U->write_s += d; lane = MW_REPORT_RES_WRITE;
                break;
            case RP_RES_WAIT: U->waits++; U->wait_s += d; lane = MW_REPORT_RES_WAIT; break;
            case RP_RES_ACT_WRITE: lane = MW_REPORT_RES_WRITE; break; /* the disk busy for the unit: lanes only */
            case RP_RES_ACT_READ: lane = MW_REPORT_RES_FETCH; break;
            case RP_RES_RESIDENT:
                U->residencies++;
                union_add(&all, s->t0, s->t1);
                union_add(s->backward ? &bwd : &fwd, s->t0, s->t1);
                lane = s->backward ? MW_REPORT_RES_BWD : MW_REPORT_RES_FWD;
                break;
            default: break;
            }
            if (U->cov && lane >= 0) spread(r, U->cov, lane, s->t0, s->t1);
        }
        U->resident_s = union_end(&all);
        U->resident_fwd_s = union_end(&fwd);
        U->resident_bwd_s = union_end(&bwd);
    }
    free(ids);
    return 0;
}

/* Median of x[i * stride] over the steady steps; NaNs skipped. */
static double steady_median(const struct mw_report *r, size_t off, double *buf)
{
    int n = 0;
    for (int i = r->roof_first; i <= r->roof_last; i++) {
        double x = *(const double *)(const void *)((const char *)&r->steps[i] + off);
        if (!isnan(x)) buf[n++] = x;
    }
    if (!n) return NAN;
    qsort(buf, (size_t)n, sizeof *buf, cmp_double);
    return n % 2 ? buf[n / 2] : 0.5 * (buf[n / 2 - 1] + buf[n / 2]);
}

static double pair_limit(const struct mw_report *r, const char *from, const char *to)
{
    for (int p = 0; p < r->npairs; p++)
        if (!strcmp(r->pairs[p].from, from) && !strcmp(r->pairs[p].to, to)) return r->pairs[p].limit_bw;
    return 0;
}

static int roofline(struct mw_report *r, const struct mw_report_opts *o)
{
    r->roof_median_fraction = r->roof_median_nvme_s = r->roof_median_compute_s = NAN;
    r->roof_median_bound_s = r->roof_median_wall_s = NAN;
    double rd = pair_limit(r, "nvme", "host"), wr = pair_limit(r, "host", "nvme");
    if (o->nvme_read_bw > 0) { r->nvme_read_bw = o->nvme_read_bw; r->nvme_read_bw_from = "option"; }
    else if (rd > 0) { r->nvme_read_bw = rd; r->nvme_read_bw_from = "trace metadata"; }
    if (o->nvme_write_bw > 0) { r->nvme_write_bw = o->nvme_write_bw; r->nvme_write_bw_from = "option"; }
    else if (wr > 0) { r->nvme_write_bw = wr; r->nvme_write_bw_from = "trace metadata"; }
    if (!(r->nvme_read_bw > 0 && r->nvme_write_bw > 0) || !r->nsteps) return 0;
    r->has_roofline = 1;
    for (int i = 0; i < r->nsteps; i++) {
        struct mw_report_step *s = &r->steps[i];
        s->roof_nvme_s = (double)s->nvme_read_bytes / r->nvme_read_bw + (double)s->nvme_written_bytes / r->nvme_write_bw;
        s->roof_bound_s = MW_MAX(s->roof_compute_s, s->roof_nvme_s);
        s->roof_fraction = s->wall_s > 0 ? s->roof_bound_s / s->wall_s : NAN;
    }
    /* Steady state: not the first step (warm-up), nor the last of three or more (drain: its
     * update has no next forward pass to hide behind). */
    r->roof_first = r->nsteps >= 2 ? 1 : 0;
    r->roof_last = r->nsteps >= 3 ? r->nsteps - 2 : r->nsteps - 1;
    double *buf = malloc((size_t)r->nsteps * sizeof *buf);
    if (!buf) return -ENOMEM;
    r->roof_median_fraction = steady_median(r, offsetof(struct mw_report_step, roof_fraction), buf);
    r->roof_median_nvme_s = steady_median(r, offsetof(struct mw_report_step, roof_nvme_s), buf);
    r->roof_median_compute_s = steady_median(r, offsetof(struct mw_report_step, roof_compute_s), buf);
    r->roof_median_bound_s = steady_median(r, offsetof(struct mw_report_step, roof_bound_s), buf);
    r->roof_median_wall_s = steady_median(r, offsetof(struct mw_report_step, wall_s), buf);
    free(buf);
    return 0;
}

int rp_analyze_residency(struct mw_report *r, struct rp_trace *t, const struct mw_report_opts *o)
{
    r->has_residency = t->nres > 0;
    r->units_declared = t->units_declared;
    r->has_resident_weights = t->has_resw;
    r->resident_weights_peak_bytes = (uint64_t)t->resw_peak;
    r->resident_weights_final_bytes = (uint64_t)t->resw_final;
    r->resident_weights_peak_t_s = t->resw_peak_t;
    struct rp_ivls w = {0};
    if (rp_res_wait_ivls(t, &w)) return -ENOMEM;
    rp_ivls_normalize(&w);
    r->res_wait_s = rp_ivls_total(&w);
    rp_ivls_free(&w);
    int rc = units_table(r, t);
    if (!rc) rc = roofline(r, o);
    return rc;
}
