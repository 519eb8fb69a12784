/*
 * html.c — the report page: one self-contained HTML file (inline CSS and SVG, no script, no
 * network) with the summary, the charts (html_charts.c) and the tables. Long tables are
 * sampled to a readable number of rows; the CSV export has every row.
 */
#include "report/svg.h"

#include <errno.h>
#include <math.h>
#include <string.h>

void rp_html_memory(FILE *f, const struct mw_report *r);
void rp_html_io_timeline(FILE *f, const struct mw_report *r);
void rp_html_bandwidth(FILE *f, const struct mw_report *r);
void rp_html_histogram(FILE *f, const struct mw_report *r);
void rp_html_steps_chart(FILE *f, const struct mw_report *r);
void rp_html_detail(FILE *f, const struct mw_report *r);
void rp_html_comm(FILE *f, const struct mw_report *r);
void rp_html_ranks(FILE *f, const struct mw_report *r);
void rp_html_roofline(FILE *f, const struct mw_report *r);
void rp_html_residency(FILE *f, const struct mw_report *r);

#define MAX_ROWS 200

static const char *css =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222}"
    "h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}"
    "h3{font-size:14px;margin:14px 0 4px}table{border-collapse:collapse;font-size:12px;margin:6px 0}"
    "td,th{border:1px solid #ddd;padding:2px 7px;text-align:right}td{white-space:nowrap}th{background:#f4f4f4}"
    "td:first-child,th:first-child{text-align:left}.note{color:#666;font-size:12px}"
    ".tk{font-size:10px;fill:#555}.ax{font-size:11px;fill:#333}"
    ".legend span{display:inline-block;margin:0 12px 4px 0;font-size:12px}"
    ".legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border:1px solid #aaa}"
    ".kpi{display:flex;flex-wrap:wrap;gap:10px}.kpi div{border:1px solid #ddd;border-radius:4px;padding:6px 10px}"
    ".kpi b{display:block;font-size:18px}";

static void td_time(FILE *f, double s)
{
    if (isnan(s)) fputs("<td>-</td>", f);
    else fprintf(f, "<td>%.3f</td>", s * 1e3);
}

static void td_frac(FILE *f, double x)
{
    if (isnan(x)) fputs("<td>-</td>", f);
    else fprintf(f, "<td>%.1f %%</td>", x * 100);
}

static void kpi(FILE *f, const char *label, const char *value)
{
    fputs("<div><b>", f);
    rp_esc(f, value);
    fputs("</b>", f);
    rp_esc(f, label);
    fputs("</div>", f);
}

static void summary(FILE *f, const struct mw_report *r)
{
    char b[64], c[64];
    fputs("<div class=\"kpi\">", f);
    snprintf(b, sizeof b, "%.3f s", r->t1_s - r->t0_s);
    kpi(f, "trace duration", b);
    snprintf(b, sizeof b, "%d", r->nsteps);
    kpi(f, "steps", b);
    if (r->nsteps) { snprintf(b, sizeof b, "%.3f ms", r->step_wall_median_s * 1e3); kpi(f, "median step", b); }
    for (int i = 0; i < r->ntiers; i++) {
        snprintf(c, sizeof c, "peak %s bytes", r->tiers[i].name);
        kpi(f, c, mw_fmt_bytes(b, sizeof b, r->tiers[i].peak_bytes));
    }
    kpi(f, "moved between tiers", mw_fmt_bytes(b, sizeof b, r->bytes_moved));
    if (isnan(r->overlap)) snprintf(b, sizeof b, "-");
    else snprintf(b, sizeof b, "%.1f %%", r->overlap * 100);
    kpi(f, "overlap fraction (I/O busy under compute)", b);
    snprintf(b, sizeof b, "%.3f s", r->wait_s);
    kpi(f, "exposed I/O wait", b);
    if (r->has_comm) {
        kpi(f, "communication sent", mw_fmt_bytes(b, sizeof b, r->comm_sent_bytes));
        snprintf(b, sizeof b, "%.3f s", r->comm_wait_s);
        kpi(f, "exposed comm wait", b);
    }
    if (r->has_resident) kpi(f, "peak zero3 resident weights", mw_fmt_bytes(b, sizeof b, r->resident_peak_bytes));
    if (r->has_roofline) {
        if (isnan(r->roof_median_fraction)) snprintf(b, sizeof b, "-");
        else snprintf(b, sizeof b, "%.2f", r->roof_median_fraction);
        kpi(f, "of the roofline bound (median, steady steps)", b);
    }
    if (r->has_residency) {
        snprintf(b, sizeof b, "%.3f s", r->res_wait_s);
        kpi(f, "exposed wait for weight fetches", b);
    }
    if (r->has_resident_weights)
        kpi(f, "peak resident weights", mw_fmt_bytes(b, sizeof b, r->resident_weights_peak_bytes));
    fputs("</div>\n", f);
    fprintf(f, "<p class=\"note\">%llu events read, %llu of kinds the report does not use",
            (unsigned long long)r->n_events, (unsigned long long)r->n_ignored);
    if (r->dropped_events)
        fprintf(f, "; <b>the recorder dropped the oldest %llu events</b> (bytes allocated before the first "
                   "kept event show as \"untracked\")", (unsigned long long)r->dropped_events);
    if (r->unmatched_frees) fprintf(f, "; %llu frees without their alloc", (unsigned long long)r->unmatched_frees);
    fprintf(f, ". Series have %d points (%.3f ms each).</p>\n", r->nbins, r->bin_s * 1e3);
}

static void tiers_table(FILE *f, const struct mw_report *r)
{
    char b[32];
    fputs("<table><tr><th>tier</th><th>budget</th><th>peak</th><th>peak at (s)</th><th>final</th>", f);
    for (int k = 0; k < MW_REPORT_NKINDS; k++) fprintf(f, "<th>peak %s</th>", mw_report_kind_name(k));
    fputs("</tr>\n", f);
    for (int i = 0; i < r->ntiers; i++) {
        const struct mw_report_tier *T = &r->tiers[i];
        fputs("<tr><td>", f);
        rp_esc(f, T->name);
        fprintf(f, "</td><td>%s</td>", T->budget_bytes ? mw_fmt_bytes(b, sizeof b, T->budget_bytes) : "-");
        fprintf(f, "<td>%s</td><td>%.3f</td>", mw_fmt_bytes(b, sizeof b, T->peak_bytes), T->peak_t_s - r->t0_s);
        fprintf(f, "<td>%s</td>", mw_fmt_bytes(b, sizeof b, T->final_bytes));
        for (int k = 0; k < MW_REPORT_NKINDS; k++)
            fprintf(f, "<td>%s</td>", T->peak_by_kind[k] ? mw_fmt_bytes(b, sizeof b, T->peak_by_kind[k]) : "-");
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void pairs_table(FILE *f, const struct mw_report *r)
{
    if (!r->npairs) return;
    char a[32], b[32], c[32], d[32];
    fputs("<table><tr><th>tier pair</th><th>requests</th><th>bytes</th><th>mean request</th><th>busy (s)</th>"
          "<th>achieved while busy</th><th>peak (bin average)</th><th>calibrated limit</th><th>of limit</th>"
          "<th>mean queue depth</th></tr>\n", f);
    for (int p = 0; p < r->npairs; p++) {
        const struct mw_report_pair *P = &r->pairs[p];
        fputs("<tr><td>", f);
        rp_esc(f, P->from); fputs("-&gt;", f); rp_esc(f, P->to);
        fprintf(f, "</td><td>%llu</td><td>%s</td><td>%s</td><td>%.3f</td><td>%s</td><td>%s</td>",
                (unsigned long long)P->requests, mw_fmt_bytes(a, sizeof a, P->bytes),
                mw_fmt_bytes(b, sizeof b, P->requests ? P->bytes / P->requests : 0), P->busy_s,
                mw_fmt_rate(c, sizeof c, P->mean_bw), mw_fmt_rate(d, sizeof d, P->peak_bw));
        if (P->limit_bw > 0)
            fprintf(f, "<td>%s</td><td>%.0f %%</td>", mw_fmt_rate(a, sizeof a, P->limit_bw), 100 * P->mean_bw / P->limit_bw);
        else fputs("<td>-</td><td>-</td>", f);
        fprintf(f, "<td>%.1f</td></tr>\n", P->mean_qd);
    }
    fputs("</table>\n", f);
}

static void steps_table(FILE *f, const struct mw_report *r)
{
    if (!r->nsteps) { fputs("<p class=\"note\">No step spans in this trace.</p>\n", f); return; }
    int every = (r->nsteps + MAX_ROWS - 1) / MAX_ROWS;
    char b[32];
    if (every > 1)
        fprintf(f, "<p class=\"note\">Every %d-th step of %d shown, and the last; all of them are in steps.csv.</p>\n",
                every, r->nsteps);
    fputs("<div style=\"overflow-x:auto\"><table><tr><th>step</th><th>tokens</th><th>wall (ms)</th><th>forward (ms)</th><th>backward (ms)</th>"
          "<th>update (ms)</th><th>compute (ms)</th><th>exposed I/O wait (ms)</th><th>I/O busy (ms)</th>"
          "<th>overlap fraction</th><th>bytes moved</th>", f);
    if (r->has_comm) fputs("<th>comm sent</th><th>exposed comm wait (ms)</th>", f);
    int nvme = r->has_roofline;
    for (int i = 0; i < r->nsteps && !nvme; i++) nvme = r->steps[i].nvme_read_bytes || r->steps[i].nvme_written_bytes;
    if (nvme) fputs("<th>NVMe read</th><th>NVMe written</th>", f);
    if (r->has_roofline)
        fputs("<th>roofline compute (ms)</th><th>NVMe time (ms)</th><th>bound (ms)</th><th>of bound</th>", f);
    fputs("</tr>\n", f);
    for (int i = 0; i < r->nsteps; i++) {
        if (i % every && i != r->nsteps - 1) continue;
        const struct mw_report_step *s = &r->steps[i];
        fprintf(f, "<tr><td>%lld</td>", (long long)s->step);
        if (s->tokens >= 0) fprintf(f, "<td>%lld</td>", (long long)s->tokens);
        else fputs("<td>-</td>", f);
        td_time(f, s->wall_s);
        td_time(f, s->phase_s[MW_PHASE_FORWARD]);
        td_time(f, s->phase_s[MW_PHASE_BACKWARD]);
        td_time(f, s->phase_s[MW_PHASE_UPDATE]);
        td_time(f, s->compute_s);
        td_time(f, s->wait_s);
        td_time(f, s->io_busy_s);
        td_frac(f, s->overlap);
        fprintf(f, "<td>%s</td>", mw_fmt_bytes(b, sizeof b, s->bytes_moved));
        if (r->has_comm) {
            fprintf(f, "<td>%s</td>", mw_fmt_bytes(b, sizeof b, s->comm_sent_bytes));
            td_time(f, s->comm_wait_s);
        }
        if (nvme) {
            fprintf(f, "<td>%s</td>", mw_fmt_bytes(b, sizeof b, s->nvme_read_bytes));
            fprintf(f, "<td>%s</td>", mw_fmt_bytes(b, sizeof b, s->nvme_written_bytes));
        }
        if (r->has_roofline) {
            td_time(f, s->roof_compute_s);
            td_time(f, s->roof_nvme_s);
            td_time(f, s->roof_bound_s);
            if (isnan(s->roof_fraction)) fputs("<td>-</td>", f);
            else fprintf(f, "<td>%.2f</td>", s->roof_fraction);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table></div>\n", f);
}

static void subgroups_table(FILE *f, const struct mw_report *r)
{
    if (!r->nsubgroups) { fputs("<p class=\"note\">No offload or decision spans in this trace.</p>\n", f); return; }
    int every = (r->nsubgroups + MAX_ROWS - 1) / MAX_ROWS;
    char a[32], b[32];
    if (every > 1) fprintf(f, "<p class=\"note\">Every %d-th subgroup shown; all are in subgroups.csv.</p>\n", every);
    fputs("<table><tr><th>subgroup</th><th>tier</th><th>updated on cpu</th><th>updated on device</th>"
          "<th>predicted (ms, mean)</th><th>measured (ms, mean)</th><th>error</th><th>read</th><th>written</th>"
          "<th>read (ms)</th><th>update (ms)</th><th>write (ms)</th><th>wait (ms)</th></tr>\n", f);
    for (int i = 0; i < r->nsubgroups; i += every) {
        const struct mw_report_subgroup *g = &r->subgroups[i];
        fprintf(f, "<tr><td>%lld</td><td>", (long long)g->id);
        rp_esc(f, g->tier >= 0 ? r->tiers[g->tier].name : "?");
        fprintf(f, "</td><td>%lld</td><td>%lld</td>", (long long)g->n_cpu, (long long)g->n_device);
        double n = (double)MW_MAX(g->n_decisions, 1);
        if (g->n_decisions && g->predicted_s > 0 && g->measured_s > 0)
            fprintf(f, "<td>%.3f</td><td>%.3f</td><td>%+.1f %%</td>", g->predicted_s / n * 1e3, g->measured_s / n * 1e3,
                    100 * (g->predicted_s - g->measured_s) / g->measured_s);
        else fputs("<td>-</td><td>-</td><td>-</td>", f);
        fprintf(f, "<td>%s</td><td>%s</td>", mw_fmt_bytes(a, sizeof a, g->bytes_read), mw_fmt_bytes(b, sizeof b, g->bytes_written));
        td_time(f, g->read_s); td_time(f, g->update_s); td_time(f, g->write_s); td_time(f, g->wait_s);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void cost_err_td(FILE *f, double pred, double meas)
{
    if (meas > 0) fprintf(f, "<td>%+.1f %%</td>", 100 * (pred - meas) / meas);
    else fputs("<td>-</td>", f);
}

/* The cost model (analyze_cost.c): per component, whole run and after learning; then per step, the
 * update's components (every step when they fit, else spread; all are in cost.csv). */
static void cost_table(FILE *f, const struct mw_report *r)
{
    const struct mw_report_cost *c = &r->cost;
    if (!c->nsteps) { fputs("<p class=\"note\">No cost-model spans in this trace.</p>\n", f); return; }
    fprintf(f, "<p class=\"note\">Predicted = the calibrated profile corrected by the steps before; after learning = "
            "steps %d..%d. Seconds; error = (predicted - measured) / measured.</p>\n", MW_REPORT_COST_LEARN_STEPS + 1,
            c->nsteps);
    fputs("<table><tr><th>component</th><th>n</th><th>predicted (s)</th><th>measured (s)</th><th>error</th>"
          "<th>after learning: predicted (s)</th><th>measured (s)</th><th>error</th></tr>\n", f);
    for (int j = 0; j < MW_REPORT_COST_NCOMP; j++) {
        if (!c->n[j]) continue;
        fprintf(f, "<tr><td>%s</td><td>%lld</td><td>%.4f</td><td>%.4f</td>", mw_report_cost_name(j), (long long)c->n[j],
                c->predicted_s[j], c->measured_s[j]);
        cost_err_td(f, c->predicted_s[j], c->measured_s[j]);
        fprintf(f, "<td>%.4f</td><td>%.4f</td>", c->late_predicted_s[j], c->late_measured_s[j]);
        cost_err_td(f, c->late_predicted_s[j], c->late_measured_s[j]);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n<table><tr><th>step</th>", f);
    for (int j = 0; j < MW_REPORT_COST_NCOMP; j++)
        if (c->n[j]) fprintf(f, "<th>%s predicted (ms)</th><th>measured (ms)</th><th>error</th>", mw_report_cost_name(j));
    fputs("</tr>\n", f);
    int every = (c->nsteps + MAX_ROWS - 1) / MAX_ROWS;
    for (int i = 0; i < c->nsteps; i += every) {
        const struct mw_report_cost_step *s = &c->steps[i];
        fprintf(f, "<tr><td>%lld</td>", (long long)s->step);
        for (int j = 0; j < MW_REPORT_COST_NCOMP; j++) {
            if (!c->n[j]) continue;
            fprintf(f, "<td>%.3f</td><td>%.3f</td>", s->predicted_s[j] * 1e3, s->measured_s[j] * 1e3);
            cost_err_td(f, s->predicted_s[j], s->measured_s[j]);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    if (c->nplans)
        fprintf(f, "<p>auto: %lld subgroups on the device in the plan for step %lld, predicted %.4f s (best fixed "
                "policy %.4f s); the split changed %d times in %d plans.</p>\n", (long long)c->plan_device_subgroups,
                (long long)c->plan_step, c->plan_predicted_s, c->plan_best_fixed_s, c->plan_switches, c->nplans);
}

int mw_report_write_html(const struct mw_report *r, const char *path)
{
    struct mw_out out;
    int rc = mw_out_open(&out, path, "the report");
    if (rc) return rc;
    FILE *f = out.f;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>memwall report: ");
    rp_esc(f, r->path);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>memwall report</h1>\n<p class=\"note\">Trace: ", css);
    rp_esc(f, r->path);
    if (r->rank >= 0) fprintf(f, " (rank %d", r->rank);
    if (r->rank >= 0 && r->world_size > 0) fprintf(f, " of %d", r->world_size);
    if (r->rank >= 0 && r->zero_stage >= 0) fprintf(f, ", ZeRO stage %d", r->zero_stage);
    if (r->rank >= 0) fputs(")", f);
    fputs(". Definitions: compute = time in forward/backward/update phases outside offload and comm waits; "
          "overlap fraction = I/O busy time that coincides with compute / all I/O busy time (docs/report.md).</p>\n", f);
    summary(f, r);
    rp_html_ranks(f, r);
    fputs("<h2>Bytes per tier over time, by kind of state</h2>\n<p class=\"note\">Stacked by kind; background: "
          "the phase covering most of each time bin. Each point is the bin's highest total, so peaks are kept.</p>\n", f);
    if (!r->phases_resolved)
        fprintf(f, "<p class=\"note\">Each point covers %.1f steps, too many to shade phases or show the swing "
                   "inside a step: see \"Step %lld in detail\" below.</p>\n",
                r->bin_s / r->step_wall_median_s, (long long)r->detail_step);
    rp_html_memory(f, r);
    tiers_table(f, r);
    fputs(r->has_comm ? "<h2>I/O between tiers and communication</h2>\n" : "<h2>I/O between tiers</h2>\n", f);
    rp_html_io_timeline(f, r);
    fputs("<p class=\"note\">Bandwidth: the line is the rate while the pair is busy (bytes in the bin / time "
          "with a request in flight), the light area the bin average.</p>\n", f);
    rp_html_bandwidth(f, r);
    rp_html_histogram(f, r);
    pairs_table(f, r);
    fputs("<h2>Communication</h2>\n", f);
    rp_html_comm(f, r);
    fputs("<h2>Steps</h2>\n", f);
    rp_html_roofline(f, r);
    rp_html_steps_chart(f, r);
    steps_table(f, r);
    if (r->detail_step >= 0) {
        fprintf(f, "<h2>Step %lld in detail</h2>\n", (long long)r->detail_step);
        if (r->detail_truncated) fputs("<p class=\"note\">Too many events: the first ones are shown.</p>\n", f);
        rp_html_detail(f, r);
    }
    fputs("<h2>Weight residency</h2>\n", f);
    rp_html_residency(f, r);
    fputs("<h2>Optimizer subgroups</h2>\n", f);
    subgroups_table(f, r);
    fputs("<h2>Cost model</h2>\n", f);
    cost_table(f, r);
    fputs("<p class=\"note\">Generated by memwall report. Units: GiB/MiB = 2^30/2^20 bytes; GB/s = 10^9 bytes/s.</p>\n"
          "</body></html>\n", f);
    return mw_out_close(&out);
}
