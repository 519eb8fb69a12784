/*
 * text.c — the plain-text summary: the same figures as the HTML report, for a terminal (the
 * end of `memwall train`, and `memwall report --text`). Per-step figures are medians over the
 * steps, because the first steps (allocation, warm-up) are not typical.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* Median over steps of the double field at byte offset off (NaNs skipped). */
double rp_step_median(const struct mw_report *r, size_t off)
{
    if (!r->nsteps) return NAN;
    double *v = malloc((size_t)r->nsteps * sizeof *v);
    if (!v) return NAN;
    int n = 0;
    for (int i = 0; i < r->nsteps; i++) {
        double x = *(const double *)(const void *)((const char *)&r->steps[i] + off);
        if (!isnan(x)) v[n++] = x;
    }
    double m = NAN;
    if (n) {
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        m = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
    free(v);
    return m;
}

static const char *ms(char *b, size_t n, double s)
{
    if (isnan(s)) snprintf(b, n, "-");
    else if (s >= 10) snprintf(b, n, "%.2f s", s);
    else snprintf(b, n, "%.3f ms", s * 1e3);
    return b;
}

static const char *frac(char *b, size_t n, double f)
{
    if (isnan(f)) snprintf(b, n, "-");
    else snprintf(b, n, "%.1f %%", f * 100);
    return b;
}

/* "12.3 %" of the step time, or of the trace when there are no steps. */
static const char *share(char *b, size_t n, const struct mw_report *r, double s)
{
    double whole = r->nsteps ? r->steps_wall_s : r->t1_s - r->t0_s;
    snprintf(b, n, "%.1f %% of %s time", whole > 0 ? 100 * s / whole : 0.0, r->nsteps ? "step" : "trace");
    return b;
}

static void comm_text(const struct mw_report *r, FILE *f)
{
    char a[48], b[48], c[48];
    if (!r->has_comm) { fprintf(f, "communication: none in this trace (a single-rank run)\n"); return; }
    fprintf(f, "communication per operation (achieved = payload / busy time):\n");
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) {
        const struct mw_report_comm *o = &r->comm[op];
        if (!o->calls) continue;
        fprintf(f, "  %-14s %llu calls over %d ranks, payload %s, sent %s, busy %.3f s, achieved %s, exposed wait %.3f s\n",
                mw_report_comm_op_name(op), (unsigned long long)o->calls, o->max_ranks,
                mw_fmt_bytes(a, sizeof a, o->payload_bytes), mw_fmt_bytes(b, sizeof b, o->sent_bytes), o->busy_s,
                mw_fmt_rate(c, sizeof c, o->achieved_bw), o->wait_s);
    }
    fprintf(f, "  all: sent %s, busy %.3f s, overlap with compute %s, exposed comm wait %.3f s (%s)",
            mw_fmt_bytes(a, sizeof a, r->comm_sent_bytes), r->comm_busy_s, frac(b, sizeof b, r->comm_overlap),
            r->comm_wait_s, share(c, sizeof c, r, r->comm_wait_s));
    if (r->comm_wait_unattributed_s > 0) fprintf(f, ", %.3f s of it matched to no collective", r->comm_wait_unattributed_s);
    fputc('\n', f);
}

/* Seconds at a readable scale: "41.3 s", "12.5 ms", "3.0 us". */
static const char *dur(char *b, size_t n, double s)
{
    if (isnan(s)) snprintf(b, n, "-");
    else if (s >= 1) snprintf(b, n, "%.1f s", s);
    else if (s >= 1e-3) snprintf(b, n, "%.1f ms", s * 1e3);
    else snprintf(b, n, "%.1f us", s * 1e6);
    return b;
}

/* The roofline line (docs/report.md): what the "Done when" reads. */
static void roofline_text(const struct mw_report *r, FILE *f)
{
    char a[48], b[48], c[48];
    if (!r->has_roofline) {
        int nvme_io = 0;
        for (int p = 0; p < r->npairs; p++) nvme_io |= !strcmp(r->pairs[p].from, "nvme") || !strcmp(r->pairs[p].to, "nvme");
        if (!(nvme_io || r->has_residency)) return; /* nothing on the disk: no roofline to speak of */
        if (!r->nsteps) { fprintf(f, "roofline: no step spans in the trace\n"); return; }
        fprintf(f, "roofline: unknown: no NVMe %s bandwidth (trace metadata limit.%s.bytes_per_s); give "
                   "--nvme-read-bw and --nvme-write-bw in GB/s (memwall bench io measures them)\n",
                r->nvme_read_bw > 0 ? "write" : "read", r->nvme_read_bw > 0 ? "host->nvme" : "nvme->host");
        return;
    }
    const struct mw_report_step *s0 = &r->steps[r->roof_first], *s1 = &r->steps[r->roof_last];
    if (isnan(r->roof_median_fraction)) fprintf(f, "roofline: - of bound ("); /* every step 0 s long */
    else fprintf(f, "roofline: %.2f of bound (", r->roof_median_fraction);
    if (r->roof_first == r->roof_last) fprintf(f, "step %lld only", (long long)s0->step);
    else fprintf(f, "median of steps %lld..%lld", (long long)s0->step, (long long)s1->step);
    fprintf(f, "; bound = NVMe %s, compute %s)\n", dur(a, sizeof a, r->roof_median_nvme_s),
            dur(b, sizeof b, r->roof_median_compute_s));
    fprintf(f, "  median step %s; NVMe read %.2f GB/s (%s), write %.2f GB/s (%s), one disk: NVMe time = read "
               "bytes / read bandwidth + written bytes / write bandwidth; compute = wall - exposed waits\n",
            dur(c, sizeof c, r->roof_median_wall_s), r->nvme_read_bw * 1e-9, r->nvme_read_bw_from,
            r->nvme_write_bw * 1e-9, r->nvme_write_bw_from);
}

#define TEXT_MAX_UNITS 64

static void residency_text(const struct mw_report *r, FILE *f)
{
    if (!r->has_residency) return;
    char a[48], b[48], c[48], d[48], e[48];
    uint64_t fetches = 0, rd = 0, wr = 0;
    for (int i = 0; i < r->nunits; i++) {
        fetches += r->units[i].fetches;
        rd += r->units[i].bytes_read;
        wr += r->units[i].bytes_written;
    }
    fprintf(f, "weight residency: %d units", r->nunits);
    if (r->units_declared >= 0 && r->units_declared != r->nunits) fprintf(f, " (metadata: %lld)", (long long)r->units_declared);
    fprintf(f, ", %llu fetches, %s read, %s of gradients written, exposed wait %s (%s)",
            (unsigned long long)fetches, mw_fmt_bytes(a, sizeof a, rd), mw_fmt_bytes(b, sizeof b, wr),
            dur(e, sizeof e, r->res_wait_s), share(c, sizeof c, r, r->res_wait_s));
    if (r->has_resident_weights)
        fprintf(f, "; resident weights peak %s", mw_fmt_bytes(d, sizeof d, r->resident_weights_peak_bytes));
    fprintf(f, "\n  %6s %-12s %8s %11s %11s %11s %11s %8s %11s %11s\n", "unit", "name", "fetches", "read",
            "resident", "forward", "backward", "writes", "written", "wait");
    for (int i = 0; i < r->nunits && i < TEXT_MAX_UNITS; i++) {
        const struct mw_report_unit *U = &r->units[i];
        fprintf(f, "  %6lld %-12s %8llu %11s %11s", (long long)U->id, U->name, (unsigned long long)U->fetches,
                mw_fmt_bytes(a, sizeof a, U->bytes_read), dur(b, sizeof b, U->resident_s));
        fprintf(f, " %11s %11s %8llu", dur(c, sizeof c, U->resident_fwd_s), dur(d, sizeof d, U->resident_bwd_s),
                (unsigned long long)U->grad_writes);
        fprintf(f, " %11s %11s\n", mw_fmt_bytes(a, sizeof a, U->bytes_written), dur(e, sizeof e, U->wait_s));
    }
    if (r->nunits > TEXT_MAX_UNITS)
        fprintf(f, "  ... %d more units (units.csv has every unit)\n", r->nunits - TEXT_MAX_UNITS);
}

static void ranks_text(const struct mw_report *r, FILE *f)
{
    if (!r->nranks) return;
    char a[48];
    int ws = -1, zs = -1, kinds[MW_REPORT_NKINDS] = {0}, res = 0;
    rp_ranks_summary(r, &ws, &zs, kinds, &res);
    fprintf(f, "ranks: %d traces", r->nranks);
    if (ws > 0) fprintf(f, " of world size %d%s", ws, ws != r->nranks ? " (not all ranks given)" : "");
    if (zs >= 0) fprintf(f, ", ZeRO stage %d", zs);
    fprintf(f, " (peak bytes per tier and per kind over all tiers; step = median)\n  rank %11s %11s %11s", "device",
            "host", "nvme");
    for (int j = 0; j < MW_REPORT_NKINDS; j++)
        if (kinds[j]) fprintf(f, " %11s", mw_report_kind_name(j));
    if (res) fprintf(f, " %11s", "zero3 res.");
    fprintf(f, " %11s %11s %11s %11s %11s\n", "comm sent", "comm wait", "nvme read", "nvme write", "step");
    for (int i = 0; i < r->nranks; i++) {
        const struct mw_report_rank *k = &r->ranks[i];
        fprintf(f, "  %4d %11s", k->rank, mw_fmt_bytes(a, sizeof a, k->peak_device_bytes));
        fprintf(f, " %11s", mw_fmt_bytes(a, sizeof a, k->peak_host_bytes));
        fprintf(f, " %11s", mw_fmt_bytes(a, sizeof a, k->peak_nvme_bytes));
        for (int j = 0; j < MW_REPORT_NKINDS; j++)
            if (kinds[j]) fprintf(f, " %11s", mw_fmt_bytes(a, sizeof a, k->peak_kind_bytes[j]));
        if (res) fprintf(f, " %11s", k->has_resident ? mw_fmt_bytes(a, sizeof a, k->resident_peak_bytes) : "-");
        fprintf(f, " %11s", mw_fmt_bytes(a, sizeof a, k->comm_sent_bytes));
        fprintf(f, " %11s", ms(a, sizeof a, k->comm_wait_s));
        fprintf(f, " %11s", mw_fmt_bytes(a, sizeof a, k->nvme_read_bytes));
        fprintf(f, " %11s", mw_fmt_bytes(a, sizeof a, k->nvme_written_bytes));
        fprintf(f, " %11s\n", ms(a, sizeof a, k->step_median_s));
    }
}

/* Error of a prediction, as text: "+12.3 %", or "-" without a measurement. */
static const char *err_pct(char *b, size_t n, double pred, double meas)
{
    if (meas > 0) snprintf(b, n, "%+.1f %%", 100 * (pred - meas) / meas);
    else snprintf(b, n, "-");
    return b;
}

/* One step's (or a sum's) update time: the components a decision covers (cpu, h2d, device, d2h). */
static void update_sum(const double *pred, const double *meas, double *p, double *m)
{
    *p = *m = 0;
    for (int j = 0; j < MW_REPORT_COST_NCOMP; j++)
        if (mw_report_cost_is_update(j)) { *p += pred[j]; *m += meas[j]; }
}

/* The cost model (analyze_cost.c): per component, whole run and after learning; the update's
 * per-step error for the first steps and the last; auto's last plan. */
static void cost_text(const struct mw_report *r, FILE *f)
{
    const struct mw_report_cost *c = &r->cost;
    if (!c->nsteps) return;
    char a[32], b[32], e[32];
    fprintf(f, "cost model (offload updates; predicted vs measured, s; error = (predicted - measured) / measured; "
            "after learning = steps %d..%d of %d):\n", MW_REPORT_COST_LEARN_STEPS + 1, c->nsteps, c->nsteps);
    fprintf(f, "  %-8s %10s %11s %11s %9s  | after learning: %11s %11s %9s\n", "part", "n", "predicted", "measured",
            "error", "predicted", "measured", "error");
    for (int j = 0; j < MW_REPORT_COST_NCOMP; j++) {
        if (!c->n[j]) continue;
        fprintf(f, "  %-8s %10lld %11.4f %11.4f %9s  | %27.4f %11.4f %9s\n", mw_report_cost_name(j), (long long)c->n[j],
                c->predicted_s[j], c->measured_s[j], err_pct(a, sizeof a, c->predicted_s[j], c->measured_s[j]),
                c->late_predicted_s[j], c->late_measured_s[j],
                err_pct(b, sizeof b, c->late_predicted_s[j], c->late_measured_s[j]));
    }
    double p, m;
    fprintf(f, "  update time per step (cpu + h2d + device + d2h), predicted / measured:");
    for (int i = 0; i < c->nsteps; i++) {
        if (i == MW_REPORT_COST_LEARN_STEPS + 1 && i < c->nsteps - 1) { fprintf(f, " ..."); i = c->nsteps - 1; }
        update_sum(c->steps[i].predicted_s, c->steps[i].measured_s, &p, &m);
        fprintf(f, " %lld: %s/%s (%s)", (long long)c->steps[i].step, ms(a, sizeof a, p), ms(b, sizeof b, m),
                err_pct(e, sizeof e, p, m));
    }
    fputc('\n', f);
    if (c->nplans)
        fprintf(f, "  auto: %lld subgroups on the device in the plan for step %lld, predicted %.4f s (best fixed "
                "policy %.4f s); the split changed %d times in %d plans\n", (long long)c->plan_device_subgroups,
                (long long)c->plan_step, c->plan_predicted_s, c->plan_best_fixed_s, c->plan_switches, c->nplans);
}

static void text_body(const struct mw_report *r, FILE *f)
{
    char a[48], b[48], c[48], d[48], e[48];
    fprintf(f, "memwall report: %s", r->path);
    if (r->rank >= 0) fprintf(f, " (rank %d", r->rank);
    if (r->rank >= 0 && r->world_size > 0) fprintf(f, " of %d", r->world_size);
    if (r->rank >= 0 && r->zero_stage >= 0) fprintf(f, ", ZeRO stage %d", r->zero_stage);
    fprintf(f, "%s\n", r->rank >= 0 ? ")" : "");
    fprintf(f, "  trace: %llu events, %llu dropped by the recorder, %.3f s, %d steps",
            (unsigned long long)r->n_events, (unsigned long long)r->dropped_events, r->t1_s - r->t0_s, r->nsteps);
    if (r->nsteps) fprintf(f, " (median %s per step)", ms(a, sizeof a, r->step_wall_median_s));
    fputc('\n', f);
    if (r->dropped_events)
        fprintf(f, "  note: the recorder dropped the oldest %llu events; early bytes show as 'untracked'\n",
                (unsigned long long)r->dropped_events);

    fprintf(f, "memory per tier (peak over the run):\n");
    if (!r->ntiers) fprintf(f, "  (no alloc/free events)\n");
    for (int i = 0; i < r->ntiers; i++) {
        const struct mw_report_tier *T = &r->tiers[i];
        int big = 0;
        for (int k = 1; k < MW_REPORT_NKINDS; k++)
            if (T->peak_by_kind[k] > T->peak_by_kind[big]) big = k;
        fprintf(f, "  %-8s peak %12s", T->name, mw_fmt_bytes(a, sizeof a, T->peak_bytes));
        if (T->budget_bytes)
            fprintf(f, " of %s budget (%.1f %%)", mw_fmt_bytes(b, sizeof b, T->budget_bytes),
                    100.0 * (double)T->peak_bytes / (double)T->budget_bytes);
        fprintf(f, " at %.3f s; largest kind %s (%s)\n", T->peak_t_s - r->t0_s, mw_report_kind_name(big),
                mw_fmt_bytes(c, sizeof c, T->peak_by_kind[big]));
    }
    if (r->has_resident)
        fprintf(f, "  zero3 resident weights: peak %s at %.3f s, final %s\n", mw_fmt_bytes(a, sizeof a, r->resident_peak_bytes),
                r->resident_peak_t_s - r->t0_s, mw_fmt_bytes(b, sizeof b, r->resident_final_bytes));

    fprintf(f, "I/O per tier pair (bandwidth while busy; peak of %.3f ms bins):\n", r->bin_s * 1e3);
    if (!r->npairs) fprintf(f, "  (no I/O events)\n");
    for (int p = 0; p < r->npairs; p++) {
        const struct mw_report_pair *P = &r->pairs[p];
        char pn[72];
        snprintf(pn, sizeof pn, "%s->%s", P->from, P->to);
        fprintf(f, "  %-12s %llu requests, %s, mean request %s, busy %.3f s, achieved %s, peak %s", pn,
                (unsigned long long)P->requests, mw_fmt_bytes(a, sizeof a, P->bytes),
                mw_fmt_bytes(b, sizeof b, P->requests ? P->bytes / P->requests : 0), P->busy_s,
                mw_fmt_rate(c, sizeof c, P->mean_bw), mw_fmt_rate(d, sizeof d, P->peak_bw));
        if (P->limit_bw > 0)
            fprintf(f, ", limit %s (achieved %.0f %% of it)", mw_fmt_rate(e, sizeof e, P->limit_bw),
                    100 * P->mean_bw / P->limit_bw);
        fprintf(f, ", mean queue depth %.1f\n", P->mean_qd);
    }

    comm_text(r, f);
    fprintf(f, "time (whole run): compute %.3f s, exposed I/O wait %.3f s, I/O busy %.3f s, overlap fraction %s,"
            " %s moved\n", r->compute_s, r->wait_s, r->io_busy_s, frac(a, sizeof a, r->overlap),
            mw_fmt_bytes(b, sizeof b, r->bytes_moved));
    if (r->nsteps) {
        fprintf(f, "per step (median of %d): wall %s, compute %s, exposed I/O wait %s, I/O busy %s, overlap %s,",
                r->nsteps, ms(a, sizeof a, r->step_wall_median_s),
                ms(b, sizeof b, rp_step_median(r, offsetof(struct mw_report_step, compute_s))),
                ms(c, sizeof c, rp_step_median(r, offsetof(struct mw_report_step, wait_s))),
                ms(d, sizeof d, rp_step_median(r, offsetof(struct mw_report_step, io_busy_s))),
                frac(e, sizeof e, rp_step_median(r, offsetof(struct mw_report_step, overlap))));
        const struct mw_report_step *last = &r->steps[r->nsteps - 1];
        fprintf(f, " %s moved in the last step\n", mw_fmt_bytes(a, sizeof a, last->bytes_moved));
        if (r->has_comm)
            fprintf(f, "per step (median): exposed comm wait %s; %s sent in the last step\n",
                    ms(a, sizeof a, rp_step_median(r, offsetof(struct mw_report_step, comm_wait_s))),
                    mw_fmt_bytes(b, sizeof b, last->comm_sent_bytes));
    } else fprintf(f, "per step: (no step spans in the trace)\n");
    roofline_text(r, f);
    residency_text(r, f);

    if (r->nsubgroups) {
        int64_t ncpu = 0, ndev = 0, ndec = 0;
        double pred = 0, meas = 0;
        int on[RP_MAX_TIERS + 1] = {0};
        for (int i = 0; i < r->nsubgroups; i++) {
            const struct mw_report_subgroup *g = &r->subgroups[i];
            ncpu += g->n_cpu; ndev += g->n_device; ndec += g->n_decisions;
            pred += g->predicted_s; meas += g->measured_s;
            on[g->tier >= 0 && g->tier < RP_MAX_TIERS ? g->tier : RP_MAX_TIERS]++;
        }
        fprintf(f, "subgroups: %d (", r->nsubgroups);
        int first = 1;
        for (int i = 0; i <= RP_MAX_TIERS; i++) {
            if (!on[i]) continue;
            fprintf(f, "%s%d on %s", first ? "" : ", ", on[i], i < r->ntiers ? r->tiers[i].name : "?");
            first = 0;
        }
        fprintf(f, "); updates: %lld on cpu, %lld on device", (long long)ncpu, (long long)ndev);
        if (ndec && pred > 0 && meas > 0)
            fprintf(f, "; predicted %.3f s vs measured %.3f s (%+.1f %%)", pred, meas, 100 * (pred - meas) / meas);
        const struct mw_report_cost *c = &r->cost;
        double lp, lm;
        update_sum(c->late_predicted_s, c->late_measured_s, &lp, &lm);
        if (c->late_steps && lp > 0 && lm > 0)
            fprintf(f, "; after learning (steps %d..%d) %.3f s vs %.3f s (%+.1f %%)", MW_REPORT_COST_LEARN_STEPS + 1,
                    c->nsteps, lp, lm, 100 * (lp - lm) / lm);
        fputc('\n', f);
        cost_text(r, f);
    }
    ranks_text(r, f);
}

/* Composed in memory, then handed to `out` in one write, so a failure is seen (with its errno:
 * stdio's error flag forgets it, and the caller's stream may be a full disk or a closed pipe)
 * at the one call that makes it. */
int mw_report_write_text(const struct mw_report *r, FILE *out)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    if (!m) return mw_error_set(-ENOMEM, "report: out of memory for the text summary");
    text_body(r, m);
    if (fclose(m) != 0) { free(buf); return mw_error_set(-ENOMEM, "report: out of memory for the text summary"); }
    errno = 0;
    int e = fwrite(buf, 1, n, out) == n ? 0 : errno ? errno : EIO;
    if (!e && fflush(out) != 0) e = errno ? errno : EIO;
    free(buf);
    if (e) return mw_error_set(-e, "report: writing the text summary failed: %s", strerror(e));
    return 0;
}
