/*
 * cmd_report.c — `memwall report TRACE... [-o report.html] [--csv DIR] [--text]`: the I/O,
 * communication and memory study of a run from its trace (src/report). Writes the HTML report
 * (default report.html) unless only --text is asked for; prints where it wrote what.
 * Several traces (one per rank), or one path holding %r (expanded for r = 0, 1, ... while the
 * file exists): the report of rank 0 plus a per-rank table. Traces of different runs
 * (world_size differs, a rank twice) are a usage error (exit 2).
 * --nvme-read-bw / --nvme-write-bw (GB/s) set the disk's bandwidth for the roofline when the
 * trace's metadata lacks it or was measured elsewhere.
 * The option table has long options only; "-o" is mapped to "--output" before parsing.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mw_cmd_report(int argc, char **argv)
{
    const char *output = "report.html", *csv = NULL;
    int text = 0;
    int64_t bins = 800, step = -1;
    double read_gbs = 0, write_gbs = 0; /* GB/s (10^9 bytes/s); 0 = the trace's metadata */
    const struct mw_opt opts[] = {
        {"output", MW_OPT_STRING, &output, "FILE", "the HTML report to write (also -o)", 0, 0, NULL},
        {"csv", MW_OPT_STRING, &csv, "DIR", "also write every series and table as CSV files into DIR", 0, 0, NULL},
        {"text", MW_OPT_FLAG, &text, NULL, "print the plain-text summary (alone: no HTML unless --output is given)", 0, 0, NULL},
        {"bins", MW_OPT_INT, &bins, "N", "points per time series in the charts and CSV", 10, 5000, NULL},
        {"step", MW_OPT_INT, &step, "N", "step shown in detail (-1: the last one in the trace)", -1, 1e15, NULL},
        {"nvme-read-bw", MW_OPT_DOUBLE, &read_gbs, "GB/s", "NVMe read bandwidth for the roofline in GB/s (10^9 "
         "bytes/s), as memwall bench io measures it; not given: the trace's limit.nvme->host.bytes_per_s", 1e-6, 1e4, NULL},
        {"nvme-write-bw", MW_OPT_DOUBLE, &write_gbs, "GB/s", "NVMe write bandwidth for the roofline in GB/s (10^9 "
         "bytes/s); not given: the trace's limit.host->nvme.bytes_per_s", 1e-6, 1e4, NULL},
    };
    const struct mw_cmd_spec spec = {
        "report", "TRACE [TRACE...]",
        "The I/O-pattern and memory-utilisation study of a run, from its Chrome/Perfetto JSON trace "
        "(memwall train --trace): bytes per tier over time by kind with the phases shaded, the I/O "
        "and communication timeline, request sizes and bandwidth per tier pair against the calibrated "
        "limit, collectives and exposed comm wait, per-step and per-subgroup tables. One self-contained "
        "HTML file (inline SVG, no network). Several traces of one multi-rank run (one per rank, or one "
        "path with %r for the rank: run/trace.%r.json): rank 0's report plus a per-rank table. With NVMe "
        "bandwidths (from the trace or --nvme-read-bw/--nvme-write-bw), each step's roofline: the larger of "
        "compute and NVMe time, and the fraction of it the step reached; with streamed weights, a residency "
        "lane and a table per weight unit.",
        opts, MW_NOPTS(opts), 1, MW_MAX(1, argc)};

    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) { fprintf(stderr, "memwall report: out of memory\n"); return 1; }
    for (int i = 0; i < argc; i++) av[i] = !strcmp(argv[i], "-o") ? "--output" : argv[i];
    char **pos = calloc((size_t)MW_MAX(1, argc), sizeof *pos);
    if (!pos) { free(av); fprintf(stderr, "memwall report: out of memory\n"); return 1; }
    int npos = 0;
    int rc = mw_opts_parse(&spec, argc, av, pos, &npos);
    if (rc) { free(pos); free(av); return rc == MW_OPTS_HELP ? 0 : 2; }
    int want_html = !text || mw_opts_given(&spec, "output");
    /* The option table checks the range; a NaN passes any range, so say so here. */
    if (isnan(read_gbs) || isnan(write_gbs)) {
        fprintf(stderr, "memwall report: --nvme-%s-bw: not a number; give the bandwidth in GB/s (10^9 bytes/s), "
                        "e.g. 3.2 (memwall bench io measures it)\n", isnan(read_gbs) ? "read" : "write");
        free(pos); free(av);
        return 2;
    }

    struct mw_report_opts ro;
    mw_report_opts_default(&ro);
    ro.bins = (int)bins;
    ro.detail_step = step;
    ro.nvme_read_bw = read_gbs * 1e9;
    ro.nvme_write_bw = write_gbs * 1e9;
    struct mw_report *r = NULL;
    int err;
    if (npos == 1 && !strstr(pos[0], "%r")) {
        err = mw_report_load(&r, pos[0], &ro);
    } else {
        char **paths = NULL;
        int n = npos;
        for (int i = 0; i < npos; i++)
            if (strstr(pos[i], "%r") && npos > 1) {
                fprintf(stderr, "memwall report: %s: a path with %%r stands for every rank; give it alone\n", pos[i]);
                free(pos); free(av);
                return 2;
            }
        if (npos == 1) {
            n = mw_report_expand_ranks(pos[0], 1 << 16, &paths);
            if (n < 0) { free(pos); free(av); mw_cli_fail("report", n); return 1; }
        }
        err = mw_report_load_ranks(&r, paths ? (const char *const *)paths : (const char *const *)pos, n, &ro);
        mw_report_paths_free(paths, paths ? n : 0);
    }
    free(pos);
    free(av);
    if (err == MW_REPORT_EMISMATCH) { fprintf(stderr, "memwall report: %s\n", mw_error_msg()); return 2; }
    if (err) { mw_cli_fail("report", err); return 1; }
    if (step >= 0 && r->detail_step != step)
        fprintf(stderr, "memwall report: step %lld is not in the trace; showing step %lld in detail\n",
                (long long)step, (long long)r->detail_step);
    if (want_html && (err = mw_report_write_html(r, output))) goto fail;
    if (csv && (err = mw_report_write_csv(r, csv))) goto fail;
    if (text && (err = mw_report_write_text(r, stdout))) goto fail;
    if (want_html) printf("memwall report: wrote %s\n", output);
    if (csv) printf("memwall report: wrote CSV files into %s/\n", csv);
    mw_report_free(r);
    return 0;
fail:
    mw_report_free(r);
    mw_cli_fail("report", err);
    return 1;
}
