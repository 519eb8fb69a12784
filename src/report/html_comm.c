/*
 * html_comm.c — the report page's communication section (per collective operation, exposed
 * wait) and the per-rank table of a multi-rank run. The comm lanes of the I/O timeline and of
 * the one-step detail are drawn in html_charts.c with the I/O they sit beside.
 */
#include "report/svg.h"

#include <math.h>
#include <string.h>

void rp_html_comm(FILE *f, const struct mw_report *r)
{
    if (!r->has_comm) {
        fputs("<p class=\"note\">No communication in this trace (a single-rank run: no spans of category "
              "\"comm\").</p>\n", f);
        return;
    }
    char a[32], b[32], c[32];
    double whole = r->nsteps ? r->steps_wall_s : r->t1_s - r->t0_s;
    const char *of = r->nsteps ? "step time" : "trace time";
    fprintf(f, "<p class=\"note\">Busy = union of the operation's collectives from issue to completion (overlapping "
               "collectives count once); achieved = payload / busy. Exposed wait = time the training thread was "
               "blocked waiting for a collective (comm \"wait\" spans), attributed to the collective of the same "
               "bytes and ranks that completed during the wait; %% of %s.</p>\n", of);
    fputs("<table><tr><th>operation</th><th>calls</th><th>ranks</th><th>payload</th><th>sent</th><th>busy (s)</th>"
          "<th>achieved</th><th>exposed wait (s)</th><th>of step time</th></tr>\n", f);
    uint64_t calls = 0;
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) {
        const struct mw_report_comm *o = &r->comm[op];
        calls += o->calls;
        if (!o->calls) continue;
        fprintf(f, "<tr><td>%s</td><td>%llu</td><td>%d</td><td>%s</td><td>%s</td><td>%.3f</td><td>%s</td>"
                   "<td>%.3f</td><td>%.1f %%</td></tr>\n",
                mw_report_comm_op_name(op), (unsigned long long)o->calls, o->max_ranks,
                mw_fmt_bytes(a, sizeof a, o->payload_bytes), mw_fmt_bytes(b, sizeof b, o->sent_bytes), o->busy_s,
                mw_fmt_rate(c, sizeof c, o->achieved_bw), o->wait_s, whole > 0 ? 100 * o->wait_s / whole : 0.0);
    }
    fprintf(f, "<tr><th>all</th><th>%llu</th><th></th><th>%s</th><th>%s</th><th>%.3f</th><th>%s</th><th>%.3f</th>"
               "<th>%.1f %%</th></tr>\n</table>\n",
            (unsigned long long)calls, mw_fmt_bytes(a, sizeof a, r->comm_payload_bytes),
            mw_fmt_bytes(b, sizeof b, r->comm_sent_bytes), r->comm_busy_s,
            mw_fmt_rate(c, sizeof c, r->comm_busy_s > 0 ? (double)r->comm_payload_bytes / r->comm_busy_s : 0),
            r->comm_wait_s, whole > 0 ? 100 * r->comm_wait_s / whole : 0.0);
    fprintf(f, "<p class=\"note\">Communication busy time under compute: ");
    if (isnan(r->comm_overlap)) fputs("-", f);
    else fprintf(f, "%.1f %%", 100 * r->comm_overlap);
    if (r->comm_wait_unattributed_s > 0)
        fprintf(f, "; %.3f s of the exposed wait matched no collective (counted in \"all\" only)",
                r->comm_wait_unattributed_s);
    fputs(".</p>\n", f);
}

void rp_html_ranks(FILE *f, const struct mw_report *r)
{
    if (!r->nranks) return;
    int ws = -1, zs = -1, kinds[MW_REPORT_NKINDS] = {0}, res = 0;
    rp_ranks_summary(r, &ws, &zs, kinds, &res);
    fprintf(f, "<h2>Ranks</h2>\n<p class=\"note\">%d traces", r->nranks);
    if (ws > 0) fprintf(f, " of world size %d%s", ws, ws != r->nranks ? " (<b>not all ranks given</b>)" : "");
    if (zs >= 0) fprintf(f, ", ZeRO stage %d", zs);
    fputs(". Peaks over the run: per tier, and per kind summed over the tiers. The rest of this page is rank ", f);
    fprintf(f, "%d's report; ranks.csv (--csv) has every column.</p>\n", r->rank >= 0 ? r->rank : r->ranks[0].rank);
    int nk = 0;
    for (int j = 0; j < MW_REPORT_NKINDS; j++) nk += kinds[j];
    fprintf(f, "<div style=\"overflow-x:auto\"><table><tr><th rowspan=\"2\">rank</th><th colspan=\"3\">peak per tier</th>");
    if (nk) fprintf(f, "<th colspan=\"%d\">peak per kind (all tiers)</th>", nk);
    if (res) fputs("<th rowspan=\"2\">peak zero3 resident weights</th>", f);
    fputs("<th colspan=\"2\">communication</th><th colspan=\"2\">nvme</th><th rowspan=\"2\">step (ms, median)</th>"
          "<th rowspan=\"2\">trace</th></tr>\n<tr><th>device</th><th>host</th><th>nvme</th>", f);
    for (int j = 0; j < MW_REPORT_NKINDS; j++)
        if (kinds[j]) fprintf(f, "<th>%s</th>", mw_report_kind_name(j));
    fputs("<th>sent</th><th>exposed wait (s)</th><th>read</th><th>written</th></tr>\n", f);
    char a[32];
    for (int i = 0; i < r->nranks; i++) {
        const struct mw_report_rank *k = &r->ranks[i];
        fprintf(f, "<tr><td>%d</td><td>%s</td>", k->rank, mw_fmt_bytes(a, sizeof a, k->peak_device_bytes));
        fprintf(f, "<td>%s</td>", mw_fmt_bytes(a, sizeof a, k->peak_host_bytes));
        fprintf(f, "<td>%s</td>", mw_fmt_bytes(a, sizeof a, k->peak_nvme_bytes));
        for (int j = 0; j < MW_REPORT_NKINDS; j++)
            if (kinds[j]) fprintf(f, "<td>%s</td>", mw_fmt_bytes(a, sizeof a, k->peak_kind_bytes[j]));
        if (res) fprintf(f, "<td>%s</td>", k->has_resident ? mw_fmt_bytes(a, sizeof a, k->resident_peak_bytes) : "-");
        fprintf(f, "<td>%s</td><td>%.3f</td>", mw_fmt_bytes(a, sizeof a, k->comm_sent_bytes), k->comm_wait_s);
        fprintf(f, "<td>%s</td>", mw_fmt_bytes(a, sizeof a, k->nvme_read_bytes));
        fprintf(f, "<td>%s</td>", mw_fmt_bytes(a, sizeof a, k->nvme_written_bytes));
        if (isnan(k->step_median_s)) fputs("<td>-</td>", f);
        else fprintf(f, "<td>%.3f</td>", k->step_median_s * 1e3);
        const char *base = strrchr(k->path, '/'); /* the name; the whole path as its tooltip */
        fputs("<td title=\"", f);
        rp_esc(f, k->path);
        fputs("\">", f);
        rp_esc(f, base ? base + 1 : k->path);
        fputs("</td></tr>\n", f);
    }
    fputs("</table></div>\n", f);
}
