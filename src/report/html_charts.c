/*
 * html_charts.c — the report's SVG charts: bytes per tier stacked by kind with phases shaded,
 * the I/O timeline (requests in flight per tier pair), bandwidth against the calibrated limit,
 * the request-size histogram, time per step, and the one-step detail (Gantt + memory).
 * Every chart draws from the downsampled series, so its size is bounded whatever the trace.
 */
#include "report/svg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define W 960

static void time_axis(const struct mw_report *r, struct rp_chart *c, double span)
{
    c->x0 = 0;
    c->x1 = span;
    c->x_scale = span < 2 ? 1e3 : 1;
    c->xlabel = span < 2 ? "time since the first event (ms)" : "time since the first event (s)";
    (void)r;
}

static void shade_phases(const struct mw_report *r, struct rp_chart *c)
{
    if (!r->phases_resolved) return; /* a bin spans several steps: see the one-step detail */
    int b = 0;
    while (b < r->nbins) {
        int e = b;
        while (e + 1 < r->nbins && r->bin_phase[e + 1] == r->bin_phase[b]) e++;
        int ph = r->bin_phase[b];
        if (ph) {
            double x0 = rp_cx(c, b * r->bin_s), x1 = rp_cx(c, (e + 1) * r->bin_s);
            fprintf(c->f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>%s</title></rect>\n",
                    x0, c->mt, x1 - x0, c->h - c->mt - c->mb, rp_phase_color(ph), mw_report_phase_name(ph));
        }
        b = e + 1;
    }
}

void rp_html_memory(FILE *f, const struct mw_report *r)
{
    const int K = MW_REPORT_NKINDS, nb = r->nbins;
    double *cum = malloc((size_t)nb * (K + 1) * sizeof *cum);
    if (!cum) return;
    const char *names[MW_REPORT_NKINDS + MW_PHASE_COUNT], *colors[MW_REPORT_NKINDS + MW_PHASE_COUNT];
    for (int k = 0; k < K; k++) { names[k] = mw_report_kind_name(k); colors[k] = rp_kind_color(k); }
    for (int p = 1; p < MW_PHASE_COUNT; p++) {
        static char buf[MW_PHASE_COUNT][32];
        snprintf(buf[p], sizeof buf[p], "phase: %s", mw_report_phase_name(p));
        names[K + p - 1] = buf[p];
        colors[K + p - 1] = rp_phase_color(p);
    }
    rp_legend(f, names, colors, K + MW_PHASE_COUNT - 1);
    for (int ti = 0; ti < r->ntiers; ti++) {
        const struct mw_report_tier *T = &r->tiers[ti];
        const char *unit;
        int show_budget = T->budget_bytes && T->budget_bytes <= 4 * MW_MAX(T->peak_bytes, 1);
        double top = (double)MW_MAX(T->peak_bytes, show_budget ? T->budget_bytes : 0);
        double u = rp_bytes_unit(top, &unit);
        char ylab[48], title[160], pk[32], bd[32];
        snprintf(ylab, sizeof ylab, "bytes (%s)", unit);
        snprintf(title, sizeof title, "%s tier: peak %s%s%s", T->name, mw_fmt_bytes(pk, sizeof pk, T->peak_bytes),
                 T->budget_bytes ? ", budget " : "", T->budget_bytes ? mw_fmt_bytes(bd, sizeof bd, T->budget_bytes) : "");
        fprintf(f, "<h3>");
        rp_esc(f, title);
        fprintf(f, "</h3>\n");
        struct rp_chart c = {.f = f, .w = W, .h = 230, .ml = 60, .mr = 16, .mt = 10, .mb = 34};
        time_axis(r, &c, r->t1_s - r->t0_s);
        c.y0 = 0;
        c.y1 = top > 0 ? top / u * 1.08 : 1;
        c.ylabel = ylab;
        rp_chart_begin(&c, title);
        shade_phases(r, &c);
        rp_chart_axes(&c);
        for (int b = 0; b < nb; b++) {
            cum[(size_t)b * (K + 1)] = 0;
            for (int k = 0; k < K; k++)
                cum[(size_t)b * (K + 1) + k + 1] = cum[(size_t)b * (K + 1) + k] + (double)T->by_kind[(size_t)b * K + k] / u;
        }
        for (int k = 0; k < K; k++) {
            if (!T->peak_by_kind[k]) continue;
            fprintf(f, "<path fill=\"%s\" fill-opacity=\"0.85\" stroke=\"none\" d=\"M", rp_kind_color(k));
            for (int b = 0; b < nb; b++) {
                double y = rp_cy(&c, cum[(size_t)b * (K + 1) + k + 1]);
                fprintf(f, "%.1f %.1f L%.1f %.1f L", rp_cx(&c, b * r->bin_s), y, rp_cx(&c, (b + 1) * r->bin_s), y);
            }
            for (int b = nb - 1; b >= 0; b--) {
                double y = rp_cy(&c, cum[(size_t)b * (K + 1) + k]);
                fprintf(f, "%.1f %.1f L%.1f %.1f%s", rp_cx(&c, (b + 1) * r->bin_s), y, rp_cx(&c, b * r->bin_s), y,
                        b ? " L" : "Z");
            }
            fprintf(f, "\"><title>%s: peak %s</title></path>\n", mw_report_kind_name(k),
                    mw_fmt_bytes(pk, sizeof pk, T->peak_by_kind[k]));
        }
        if (show_budget) {
            double y = rp_cy(&c, (double)T->budget_bytes / u);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#c00\" stroke-dasharray=\"6,4\"/>"
                       "<text x=\"%d\" y=\"%.1f\" class=\"tk\" fill=\"#c00\" text-anchor=\"end\">budget</text>\n",
                    c.ml, y, W - c.mr, y, W - c.mr - 4, y - 4);
        }
        rp_chart_end(&c);
    }
    free(cum);
}

/* One lane of the timeline: a step area of series[nbins] scaled to its maximum. */
static void timeline_lane(struct rp_chart *c, const struct mw_report *r, int base, int lane, const double *series,
                          const char *color, const char *what)
{
    FILE *f = c->f;
    double mx = 0;
    for (int b = 0; b < r->nbins; b++) mx = MW_MAX(mx, series[b]);
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">max %.2f</text>\n", c->ml - 6, base - 4, mx);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", c->ml, base, W - c->mr, base);
    if (mx <= 0) return;
    fprintf(f, "<path fill=\"%s\" fill-opacity=\"0.8\" d=\"M%d %d", color, c->ml, base);
    for (int b = 0; b < r->nbins; b++) {
        double y = base - (lane - 8) * series[b] / mx;
        fprintf(f, " L%.1f %.1f L%.1f %.1f", rp_cx(c, b * r->bin_s), y, rp_cx(c, (b + 1) * r->bin_s), y);
    }
    fprintf(f, " L%d %d Z\"><title>%s per %.3f ms bin (max %.2f)</title></path>\n", W - c->mr, base, what,
            r->bin_s * 1e3, mx);
}

void rp_html_io_timeline(FILE *f, const struct mw_report *r)
{
    int ops[MW_REPORT_COMM_NOPS], nops = 0;
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++)
        if (r->comm[op].calls) ops[nops++] = op;
    int ncomm = r->has_comm ? nops + 1 : 0; /* the collectives present, and the exposed wait */
    if (!r->npairs && !ncomm) { fputs("<p class=\"note\">No I/O or communication events in this trace.</p>\n", f); return; }
    const int lane = 46, nl = r->npairs + ncomm;
    struct rp_chart c = {.f = f, .w = W, .h = 34 + lane * nl + 10, .ml = 130, .mr = 16, .mt = 10, .mb = 34};
    time_axis(r, &c, r->t1_s - r->t0_s);
    c.no_y = 1;
    c.y0 = 0; c.y1 = 1;
    rp_chart_begin(&c, ncomm ? "I/O and communication timeline: requests and collectives in flight, exposed comm wait"
                             : "I/O timeline: requests in flight per tier pair");
    rp_chart_axes(&c);
    for (int p = 0; p < r->npairs; p++) {
        const struct mw_report_pair *P = &r->pairs[p];
        int base = c.mt + lane * (p + 1) - 4;
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">", c.ml - 6, base - 18);
        rp_esc(f, P->from); fputs("-&gt;", f); rp_esc(f, P->to);
        fputs("</text>\n", f);
        timeline_lane(&c, r, base, lane, P->inflight, rp_pair_color(p), "mean requests in flight");
    }
    for (int i = 0; i < ncomm; i++) {
        int base = c.mt + lane * (r->npairs + i + 1) - 4, op = i < nops ? ops[i] : RP_COMM_WAIT;
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">comm %s</text>\n", c.ml - 6, base - 18,
                i < nops ? mw_report_comm_op_name(op) : "wait (exposed)");
        if (i < nops) timeline_lane(&c, r, base, lane, r->comm[op].inflight, rp_comm_color(op), "mean collectives in flight");
        else timeline_lane(&c, r, base, lane, r->comm_wait_bins, rp_comm_color(op), "share of time blocked on communication");
    }
    rp_chart_end(&c);
}

void rp_html_bandwidth(FILE *f, const struct mw_report *r)
{
    if (!r->npairs) return;
    double mx = 0;
    for (int p = 0; p < r->npairs; p++) {
        mx = MW_MAX(mx, MW_MAX(r->pairs[p].peak_bw, r->pairs[p].limit_bw));
        for (int b = 0; b < r->nbins; b++) mx = MW_MAX(mx, r->pairs[p].bw_busy[b]);
    }
    const char *unit;
    double u = rp_rate_unit(mx, &unit);
    char ylab[48];
    snprintf(ylab, sizeof ylab, "bandwidth (%s)", unit);
    struct rp_chart c = {.f = f, .w = W, .h = 240, .ml = 60, .mr = 16, .mt = 10, .mb = 34};
    time_axis(r, &c, r->t1_s - r->t0_s);
    c.y0 = 0;
    c.y1 = mx > 0 ? mx / u * 1.08 : 1;
    c.ylabel = ylab;
    rp_chart_begin(&c, "bandwidth per tier pair over time (line: while busy; area: bin average), against the calibrated limit");
    shade_phases(r, &c);
    rp_chart_axes(&c);
    const char *names[RP_MAX_PAIRS], *colors[RP_MAX_PAIRS];
    static char nb[RP_MAX_PAIRS][72];
    for (int p = 0; p < r->npairs && p < RP_MAX_PAIRS; p++) {
        const struct mw_report_pair *P = &r->pairs[p];
        /* Bin average as a light area; bandwidth while busy as the line (what meets the limit). */
        fprintf(f, "<path fill=\"%s\" fill-opacity=\"0.25\" stroke=\"none\" d=\"M%d %.1f", rp_pair_color(p), c.ml,
                rp_cy(&c, 0));
        for (int b = 0; b < r->nbins; b++) {
            double y = rp_cy(&c, P->bw[b] / u);
            fprintf(f, " L%.1f %.1f L%.1f %.1f", rp_cx(&c, b * r->bin_s), y, rp_cx(&c, (b + 1) * r->bin_s), y);
        }
        fprintf(f, " L%d %.1f Z\"><title>bin average</title></path>\n", W - c.mr, rp_cy(&c, 0));
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.3\" d=\"M", rp_pair_color(p));
        for (int b = 0; b < r->nbins; b++) {
            double y = rp_cy(&c, P->bw_busy[b] / u);
            fprintf(f, "%s%.1f %.1f L%.1f %.1f", b ? " L" : "", rp_cx(&c, b * r->bin_s), y, rp_cx(&c, (b + 1) * r->bin_s), y);
        }
        fputs("\"><title>while busy</title></path>\n", f);
        if (P->limit_bw > 0) {
            double y = rp_cy(&c, P->limit_bw / u);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"7,4\"/>"
                       "<text x=\"%d\" y=\"%.1f\" class=\"tk\" text-anchor=\"end\" fill=\"%s\">limit ",
                    c.ml, y, W - c.mr, y, rp_pair_color(p), W - c.mr - 4 - 150 * p, y - 4, rp_pair_color(p));
            rp_esc(f, P->from); fputs("-&gt;", f); rp_esc(f, P->to);
            fputs("</text>\n", f);
        }
        snprintf(nb[p], sizeof nb[p], "%s->%s", P->from, P->to);
        names[p] = nb[p];
        colors[p] = rp_pair_color(p);
    }
    rp_chart_end(&c);
    rp_legend(f, names, colors, MW_MIN(r->npairs, RP_MAX_PAIRS));
}

static void size_label(char *b, size_t n, int log2)
{
    if (log2 >= 30) snprintf(b, n, "%dG", 1 << (log2 - 30));
    else if (log2 >= 20) snprintf(b, n, "%dM", 1 << (log2 - 20));
    else snprintf(b, n, "%dK", 1 << (log2 - 10));
}

void rp_html_histogram(FILE *f, const struct mw_report *r)
{
    if (!r->npairs) return;
    int lo = MW_REPORT_HIST_BUCKETS, hi = -1;
    uint64_t mx = 0;
    for (int p = 0; p < r->npairs; p++)
        for (int h = 0; h < MW_REPORT_HIST_BUCKETS; h++)
            if (r->pairs[p].hist_count[h]) {
                lo = MW_MIN(lo, h); hi = MW_MAX(hi, h);
                mx = MW_MAX(mx, r->pairs[p].hist_count[h]);
            }
    if (hi < 0) return;
    lo = MW_MAX(0, lo - 1);
    hi = MW_MIN(MW_REPORT_HIST_BUCKETS - 1, hi + 1);
    int nbk = hi - lo + 1;
    struct rp_chart c = {.f = f, .w = W, .h = 230, .ml = 60, .mr = 16, .mt = 10, .mb = 34};
    c.x0 = 0; c.x1 = nbk; c.no_x = 1;
    c.y0 = 0; c.y1 = (double)mx * 1.1;
    c.ylabel = "requests";
    rp_chart_begin(&c, "request sizes per tier pair");
    rp_chart_axes(&c);
    double bw = (rp_cx(&c, 1) - rp_cx(&c, 0)) * 0.8 / r->npairs;
    char lab[16];
    for (int h = lo; h <= hi; h++) {
        double x = rp_cx(&c, h - lo);
        size_label(lab, sizeof lab, h + MW_REPORT_HIST_MIN_LOG2 - (h == MW_REPORT_HIST_BUCKETS - 1));
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tk\" text-anchor=\"middle\">%s%s</text>\n",
                x + (rp_cx(&c, 1) - rp_cx(&c, 0)) / 2, c.h - c.mb + 14, h == 0 ? "&lt;=" : h == MW_REPORT_HIST_BUCKETS - 1 ? "&gt;" : "&lt;=", lab);
        for (int p = 0; p < r->npairs; p++) {
            uint64_t n = r->pairs[p].hist_count[h];
            if (!n) continue;
            double y = rp_cy(&c, (double)n);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>",
                    x + (rp_cx(&c, 1) - rp_cx(&c, 0)) * 0.1 + p * bw, y, bw, c.h - c.mb - y, rp_pair_color(p));
            rp_esc(f, r->pairs[p].from);
            fputs("-&gt;", f);
            rp_esc(f, r->pairs[p].to);
            fprintf(f, ", %s%s: %llu requests</title></rect>\n", h == MW_REPORT_HIST_BUCKETS - 1 ? "&gt;" : "&lt;=",
                    lab, (unsigned long long)n);
        }
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"ax\" text-anchor=\"end\">request size (bytes, power-of-two buckets)</text>\n",
            W - c.mr, c.h - 4);
    rp_chart_end(&c);
}

void rp_html_steps_chart(FILE *f, const struct mw_report *r)
{
    if (r->nsteps < 2) return;
    int groups = MW_MIN(r->nsteps, 1000), per = (r->nsteps + groups - 1) / groups;
    groups = (r->nsteps + per - 1) / per;
    double mx = 0;
    for (int i = 0; i < r->nsteps; i++) mx = MW_MAX(mx, r->steps[i].wall_s);
    struct rp_chart c = {.f = f, .w = W, .h = 230, .ml = 60, .mr = 16, .mt = 10, .mb = 34};
    c.x0 = 0; c.x1 = r->nsteps; c.x_scale = 1; c.xlabel = "step (index in the trace)";
    c.y0 = 0; c.y1 = mx * 1e3 * 1.08; c.ylabel = "time (ms)";
    rp_chart_begin(&c, "time per step");
    rp_chart_axes(&c);
    static const char *const names[] = {"wall", "compute", "exposed I/O wait", "I/O busy", "exposed comm wait",
                                        "roofline bound"};
    static const char *const colors[] = {"#333333", "#4e79a7", "#e15759", "#f28e2b", "#17becf", "#59a14f"};
    const int nlines = 6;
    const char *shown[6];
    for (int s = 0; s < nlines; s++) {
        shown[s] = (s == 4 && !r->has_comm) || (s == 5 && !r->has_roofline) ? NULL : names[s];
        if (!shown[s]) continue;
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.2\" d=\"M", colors[s]);
        for (int g = 0; g < groups; g++) {
            double v = 0; /* the group's maximum, so outliers stay visible */
            for (int i = g * per; i < MW_MIN(r->nsteps, (g + 1) * per); i++) {
                const struct mw_report_step *st = &r->steps[i];
                double x = s == 0 ? st->wall_s : s == 1 ? st->compute_s : s == 2 ? st->wait_s
                         : s == 3 ? st->io_busy_s : s == 4 ? st->comm_wait_s : st->roof_bound_s;
                v = MW_MAX(v, x);
            }
            fprintf(f, "%s%.1f %.1f", g ? " L" : "", rp_cx(&c, (g + 0.5) * per), rp_cy(&c, v * 1e3));
        }
        fputs("\"/>\n", f);
    }
    rp_chart_end(&c);
    rp_legend(f, shown, colors, nlines);
}

void rp_html_detail(FILE *f, const struct mw_report *r)
{
    if (r->detail_step < 0) return;
    static const char *const lane_names[] = {"phase", "offload read", "offload update", "offload write",
                                             "offload refresh", "offload wait"};
    const int comm_lane = 1 + RP_OFF_COUNT + r->npairs; /* then allreduce .. allgather, wait */
    int nl = comm_lane + (r->has_comm ? RP_COMM_WAIT + 1 : 0), lane = 22;
    double span = r->detail_t1_s - r->detail_t0_s;
    struct rp_chart c = {.f = f, .w = W, .h = 10 + lane * nl + 34, .ml = 130, .mr = 16, .mt = 10, .mb = 34};
    c.x0 = 0; c.x1 = span > 0 ? span : 1e-6;
    c.x_scale = 1e3; c.xlabel = "time since the step started (ms)";
    c.no_y = 1; c.y0 = 0; c.y1 = 1;
    rp_chart_begin(&c, "one step in detail");
    rp_chart_axes(&c);
    for (int l = 0; l < nl; l++) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">", c.ml - 6, c.mt + lane * l + 15);
        if (l <= RP_OFF_COUNT) rp_esc(f, lane_names[l]);
        else if (l >= comm_lane) fprintf(f, "comm %s", mw_report_comm_op_name(l - comm_lane));
        else {
            const struct mw_report_pair *P = &r->pairs[l - 1 - RP_OFF_COUNT];
            fputs("io ", f); rp_esc(f, P->from); fputs("-&gt;", f); rp_esc(f, P->to);
        }
        fputs("</text>\n", f);
    }
    char b[32];
    for (int i = 0; i < r->ndetail_rects; i++) {
        const struct mw_report_rect *q = &r->detail_rects[i];
        double x0 = rp_cx(&c, q->t0_s - r->detail_t0_s), x1 = rp_cx(&c, q->t1_s - r->detail_t0_s);
        const char *col = q->lane == 0 ? rp_phase_color(q->kind)
                        : q->lane <= RP_OFF_COUNT ? rp_kind_color(q->lane - 1)
                        : q->lane >= comm_lane ? rp_comm_color(q->kind) : rp_pair_color(q->kind);
        fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"%s\" "
                   "stroke-width=\"0.3\"><title>",
                x0, c.mt + lane * q->lane + 2, MW_MAX(0.5, x1 - x0), lane - 4, col, q->lane == 0 ? "#999" : "#fff");
        if (q->lane == 0) fprintf(f, "%s", mw_report_phase_name(q->kind));
        else if (q->lane >= comm_lane) fprintf(f, "%s", mw_report_comm_op_name(q->kind));
        else if (q->sub >= 0) fprintf(f, "subgroup %lld", (long long)q->sub);
        if (q->bytes) fprintf(f, " %s", mw_fmt_bytes(b, sizeof b, q->bytes));
        fprintf(f, ", %.3f ms</title></rect>\n", (q->t1_s - q->t0_s) * 1e3);
    }
    rp_chart_end(&c);
    /* Memory inside the step, per tier with change points. */
    for (int ti = 0; ti < r->ntiers; ti++) {
        double mx = 0;
        int n = 0;
        for (int i = 0; i < r->ndetail_points; i++) {
            const struct mw_report_point *p = &r->detail_points[i];
            if (p->tier != ti) continue;
            double s = 0;
            for (int k = 0; k < MW_REPORT_NKINDS; k++) s += (double)p->by_kind[k];
            mx = MW_MAX(mx, s);
            n++;
        }
        if (!n || mx <= 0) continue;
        const char *unit;
        double u = rp_bytes_unit(mx, &unit);
        char ylab[48], title[96];
        snprintf(ylab, sizeof ylab, "bytes (%s)", unit);
        snprintf(title, sizeof title, "%s tier during step %lld (total; %d changes)", r->tiers[ti].name,
                 (long long)r->detail_step, n);
        struct rp_chart m = {.f = f, .w = W, .h = 150, .ml = 130, .mr = 16, .mt = 10, .mb = 34};
        m.x0 = c.x0; m.x1 = c.x1; m.x_scale = 1e3; m.xlabel = "time since the step started (ms)";
        m.y0 = 0; m.y1 = mx / u * 1.1; m.ylabel = ylab;
        rp_chart_begin(&m, title);
        rp_chart_axes(&m);
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tk\" text-anchor=\"end\">", m.ml - 40, m.mt + 14);
        rp_esc(f, r->tiers[ti].name);
        fprintf(f, "</text><path fill=\"none\" stroke=\"#4e79a7\" stroke-width=\"1.5\" d=\"M");
        double prev = -1;
        int first = 1;
        for (int i = 0; i < r->ndetail_points; i++) {
            const struct mw_report_point *p = &r->detail_points[i];
            if (p->tier != ti) continue;
            double s = 0;
            for (int k = 0; k < MW_REPORT_NKINDS; k++) s += (double)p->by_kind[k];
            double x = rp_cx(&m, p->t_s - r->detail_t0_s);
            if (!first) fprintf(f, " L%.1f %.1f", x, rp_cy(&m, prev / u));
            fprintf(f, "%s%.1f %.1f", first ? "" : " L", x, rp_cy(&m, s / u));
            prev = s;
            first = 0;
        }
        fprintf(f, " L%.1f %.1f\"/>\n", rp_cx(&m, m.x1), rp_cy(&m, prev / u));
        rp_chart_end(&m);
    }
}
