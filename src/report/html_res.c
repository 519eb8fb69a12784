/*
 * html_res.c — the report page's roofline paragraph and its weight-residency section: one lane
 * per weight unit over the whole run (resident for forward / for backward, fetch from NVMe,
 * gradient write-back, the training thread's wait) and the per-unit table.
 *
 * The lanes are drawn from the per-bin coverage the analysis keeps (analyze_res.c), one
 * rectangle per run of bins with the same state, so the page stays bounded whatever the run's
 * length: at most nbins rectangles per row and unit.
 */
#include "report/svg.h"

#include <math.h>
#include <string.h>

#define W 960
#define MAX_ROWS 200

static const char *const res_colors[MW_REPORT_RES_NLANE] = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759"};
static const char *const res_names[MW_REPORT_RES_NLANE] = {"resident (forward)", "resident (backward)",
                                                           "fetch (NVMe read)", "gradient write (NVMe)",
                                                           "exposed wait for the fetch"};

static void dur_cell(FILE *f, double s)
{
    if (isnan(s)) fputs("<td>-</td>", f);
    else fprintf(f, "<td>%.3f</td>", s * 1e3);
}

/* Seconds at a readable scale: "41.3 s", "12.5 ms", "3.0 us". */
static const char *secs(char *b, size_t n, double s)
{
    if (isnan(s)) snprintf(b, n, "-");
    else if (s >= 1) snprintf(b, n, "%.1f s", s);
    else if (s >= 1e-3) snprintf(b, n, "%.1f ms", s * 1e3);
    else snprintf(b, n, "%.1f us", s * 1e6);
    return b;
}

void rp_html_roofline(FILE *f, const struct mw_report *r)
{
    if (!r->has_roofline) {
        if (r->has_residency)
            fputs("<p class=\"note\">Roofline: unknown: the trace gives no NVMe read and write bandwidth (metadata "
                  "limit.nvme-&gt;host.bytes_per_s and limit.host-&gt;nvme.bytes_per_s); memwall report "
                  "--nvme-read-bw GB/s --nvme-write-bw GB/s sets them.</p>\n", f);
        return;
    }
    const struct mw_report_step *s0 = &r->steps[r->roof_first], *s1 = &r->steps[r->roof_last];
    if (isnan(r->roof_median_fraction)) fputs("<p><b>Roofline: - of bound</b> (", f); /* every step 0 s long */
    else fprintf(f, "<p><b>Roofline: %.2f of bound</b> (", r->roof_median_fraction);
    if (r->roof_first == r->roof_last) fprintf(f, "step %lld only", (long long)s0->step);
    else fprintf(f, "median of steps %lld..%lld", (long long)s0->step, (long long)s1->step);
    char a[32], b[32], c[32], d[32];
    fprintf(f, "; medians: bound %s, NVMe %s, compute %s, wall %s).</p>\n", secs(a, sizeof a, r->roof_median_bound_s),
            secs(b, sizeof b, r->roof_median_nvme_s), secs(c, sizeof c, r->roof_median_compute_s),
            secs(d, sizeof d, r->roof_median_wall_s));
    fprintf(f, "<p class=\"note\">Per step: compute = wall time minus exposed waits (offload, residency and comm "
               "waits); NVMe time = bytes read from NVMe / read bandwidth (%.2f GB/s, %s) + bytes written to NVMe / write "
               "bandwidth (%.2f GB/s, %s): one disk, so reads and writes add; bound = the larger of the two; of "
               "bound = bound / wall. The first step (warm-up) is left out of the median. GB/s = 10^9 bytes/s.</p>\n",
            r->nvme_read_bw * 1e-9, r->nvme_read_bw_from, r->nvme_write_bw * 1e-9, r->nvme_write_bw_from);
}

/* What one bin shows in one row of a lane: row 0 the resident bar (forward or backward,
 * whichever covers more of the bin), other rows their own class; -1 = nothing. */
static int bin_class(const double *v, int row)
{
    if (row) return v[row] > 0 ? row : -1;
    if (v[MW_REPORT_RES_FWD] + v[MW_REPORT_RES_BWD] <= 0) return -1;
    return v[MW_REPORT_RES_BWD] > v[MW_REPORT_RES_FWD] ? MW_REPORT_RES_BWD : MW_REPORT_RES_FWD;
}

/* One row of a unit's lane: one rectangle per run of bins of the same class. */
static void lane_row(FILE *f, const struct rp_chart *c, const struct mw_report *r, const struct mw_report_unit *U,
                     int y, int h, int row)
{
    int b = 0;
    while (b < r->nbins) {
        int cls = bin_class(&U->cov[(size_t)b * MW_REPORT_RES_NLANE], row), e = b;
        while (e + 1 < r->nbins && bin_class(&U->cov[(size_t)(e + 1) * MW_REPORT_RES_NLANE], row) == cls) e++;
        if (cls >= 0) {
            double x0 = rp_cx(c, b * r->bin_s), x1 = rp_cx(c, (e + 1) * r->bin_s);
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>", x0, y,
                    MW_MAX(0.5, x1 - x0), h, res_colors[cls]);
            rp_esc(f, U->name);
            fprintf(f, ": %s</title></rect>\n", res_names[cls]);
        }
        b = e + 1;
    }
}

static void residency_lanes(FILE *f, const struct mw_report *r)
{
    if (!r->nunits || !r->units[0].cov) {
        fprintf(f, "<p class=\"note\">%d units: too many to draw one lane each (at most %d); the table and "
                   "units.csv have every unit.</p>\n", r->nunits, MW_REPORT_MAX_UNIT_LANES);
        return;
    }
    const int lane = 16, every = r->nunits > 60 ? (r->nunits + 59) / 60 : 1; /* labelled lanes */
    struct rp_chart c = {.f = f, .w = W, .h = 10 + lane * r->nunits + 34, .ml = 110, .mr = 16, .mt = 10, .mb = 34};
    double span = r->t1_s - r->t0_s;
    c.x0 = 0; c.x1 = span;
    c.x_scale = span < 2 ? 1e3 : 1;
    c.xlabel = span < 2 ? "time since the first event (ms)" : "time since the first event (s)";
    c.no_y = 1; c.y0 = 0; c.y1 = 1;
    rp_chart_begin(&c, "weight residency per unit: resident (forward, backward), fetch, gradient write, wait");
    rp_chart_axes(&c);
    for (int i = 0; i < r->nunits; i++) {
        const struct mw_report_unit *U = &r->units[i];
        int y = c.mt + lane * i;
        if (i % every == 0) {
            fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">", c.ml - 6, y + 11);
            rp_esc(f, U->name);
            fputs("</text>\n", f);
        }
        lane_row(f, &c, r, U, y + 1, 8, 0);                     /* resident, forward or backward */
        lane_row(f, &c, r, U, y + 10, 2, MW_REPORT_RES_FETCH);  /* under it: fetches */
        lane_row(f, &c, r, U, y + 13, 2, MW_REPORT_RES_WRITE);  /* and gradient writes */
        lane_row(f, &c, r, U, y + 1, 3, MW_REPORT_RES_WAIT);    /* waits on top of the resident bar */
    }
    rp_chart_end(&c);
    rp_legend(f, res_names, res_colors, MW_REPORT_RES_NLANE);
}

static void units_table(FILE *f, const struct mw_report *r)
{
    int every = (r->nunits + MAX_ROWS - 1) / MAX_ROWS;
    if (every > 1) fprintf(f, "<p class=\"note\">Every %d-th unit shown; all are in units.csv.</p>\n", every);
    fputs("<table><tr><th>unit</th><th>name</th><th>fetches</th><th>bytes read</th><th>fetch (ms)</th>"
          "<th>resident (ms)</th><th>forward (ms)</th><th>backward (ms)</th><th>gradient writes</th>"
          "<th>bytes written</th><th>write (ms)</th><th>waits</th><th>exposed wait (ms)</th></tr>\n", f);
    char a[32], b[32];
    for (int i = 0; i < r->nunits; i += every) {
        const struct mw_report_unit *U = &r->units[i];
        fprintf(f, "<tr><td>%lld</td><td>", (long long)U->id);
        rp_esc(f, U->name);
        fprintf(f, "</td><td>%llu</td><td>%s</td>", (unsigned long long)U->fetches, mw_fmt_bytes(a, sizeof a, U->bytes_read));
        dur_cell(f, U->fetch_s); dur_cell(f, U->resident_s); dur_cell(f, U->resident_fwd_s); dur_cell(f, U->resident_bwd_s);
        fprintf(f, "<td>%llu</td><td>%s</td>", (unsigned long long)U->grad_writes, mw_fmt_bytes(b, sizeof b, U->bytes_written));
        dur_cell(f, U->write_s);
        fprintf(f, "<td>%llu</td>", (unsigned long long)U->waits);
        dur_cell(f, U->wait_s);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

void rp_html_residency(FILE *f, const struct mw_report *r)
{
    if (!r->has_residency) {
        fputs("<p class=\"note\">No weight residency in this trace (no spans of category \"residency\": the "
              "weights were not streamed from NVMe).</p>\n", f);
        return;
    }
    char a[32], b[32];
    fprintf(f, "<p class=\"note\">One lane per weight unit: the bar is the time its weights were resident in DRAM "
               "(forward or backward), below it its fetches from NVMe and its gradient writes; red marks on the bar "
               "are the training thread waiting for its fetch (exposed, %s in all). Each point covers %s.",
            secs(a, sizeof a, r->res_wait_s), secs(b, sizeof b, r->bin_s));
    if (r->has_resident_weights)
        fprintf(f, " Resident weights peaked at %s.", mw_fmt_bytes(a, sizeof a, r->resident_weights_peak_bytes));
    fputs("</p>\n", f);
    residency_lanes(f, r);
    units_table(f, r);
}
