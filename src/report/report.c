/*
 * report.c — the public entry points: load (parse + analyse), free, defaults, the one-call text
 * summary `memwall train` prints at the end of a run, and the writers' output files (mw_out, memwall/fsutil.h).
 */
#include "report/report_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void mw_report_opts_default(struct mw_report_opts *o)
{
    o->bins = 800;
    o->detail_step = -1;
    o->nvme_read_bw = o->nvme_write_bw = 0;
}

int mw_report_load(struct mw_report **out, const char *trace_path, const struct mw_report_opts *opts)
{
    *out = NULL;
    struct mw_report_opts o;
    mw_report_opts_default(&o);
    if (opts) o = *opts;
    if (o.bins < 1 || o.bins > 1000000)
        return mw_error_set(-EINVAL, "report: bins must be in [1, 1000000], got %d", o.bins);
    if (!(o.nvme_read_bw >= 0 && o.nvme_read_bw < INFINITY) || !(o.nvme_write_bw >= 0 && o.nvme_write_bw < INFINITY))
        return mw_error_set(-EINVAL, "report: NVMe bandwidths must be finite and >= 0 bytes/s (0 = from the trace), "
                            "got read %g, write %g", o.nvme_read_bw, o.nvme_write_bw);
    struct rp_trace t;
    int rc = rp_trace_load(&t, trace_path);
    if (rc) return rc;
    struct mw_report *r = calloc(1, sizeof *r);
    if (!r) { rp_trace_free(&t); return mw_error_set(-ENOMEM, "%s: out of memory", trace_path); }
    snprintf(r->path, sizeof r->path, "%s", trace_path);
    rc = rp_analyze(r, &t, &o);
    rp_trace_free(&t);
    if (rc) {
        mw_report_free(r);
        return mw_error_set(rc, "%s: out of memory analysing the trace", trace_path);
    }
    *out = r;
    return 0;
}

void mw_report_free(struct mw_report *r)
{
    if (!r) return;
    for (int i = 0; i < r->ntiers && r->tiers; i++) { free(r->tiers[i].by_kind); free(r->tiers[i].total); }
    for (int i = 0; i < r->npairs && r->pairs; i++) { free(r->pairs[i].bw); free(r->pairs[i].inflight); free(r->pairs[i].bw_busy); }
    free(r->tiers);
    free(r->pairs);
    free(r->steps);
    free(r->subgroups);
    free(r->cost.steps);
    free(r->bin_phase);
    free(r->detail_rects);
    free(r->detail_points);
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) free(r->comm[op].inflight);
    free(r->comm_wait_bins);
    free(r->ranks);
    for (int i = 0; i < r->nunits && r->units; i++) free(r->units[i].cov);
    free(r->units);
    free(r);
}

int mw_report_text_summary(const char *trace_path, FILE *out)
{
    struct mw_report *r;
    int rc = mw_report_load(&r, trace_path, NULL);
    if (rc) return rc;
    rc = mw_report_write_text(r, out);
    mw_report_free(r);
    return rc;
}

/* ------------------------------------------------------------------ output files */

