/*
 * memwall/report.h — `memwall report`: the I/O-pattern and memory-utilisation study of a run,
 * built from the Chrome/Perfetto JSON trace the recorder writes (memwall/trace.h). The event
 * names it relies on are fixed in docs/trace-conventions.md.
 *
 * Why: the question every offloaded run raises is "where did the time and the bytes go": how
 * each tier's bytes swing across forward/backward/update, what the I/O between tiers looks like
 * (request sizes, bandwidth against the calibrated limit, overlap with compute) and how much
 * I/O wait is left exposed. The analysis is a plain struct of series and tables, so tests check
 * its figures without any HTML; the writers (HTML with inline SVG, CSV, text) only format it.
 *
 * Scale: the loader streams the traceEvents array one event at a time (cJSON per event, never
 * the whole tree), keeps compact event records, and every time series is downsampled to
 * `bins` points (peak-preserving for memory), so a 10,000-step trace reports in seconds.
 *
 * Definitions (docs/report.md has the long form):
 *   compute  = time inside phase spans forward|backward|update, minus offload "wait" spans;
 *   exposed I/O wait = union of offload "wait" spans;
 *   I/O busy = union of the intervals of all cat "io" requests (any tier pair);
 *   overlap fraction = |I/O busy ∩ compute| / |I/O busy| (NaN when there was no I/O).
 *
 * Usage:
 *   struct mw_report *r;
 *   if (mw_report_load(&r, "run/trace.json", NULL)) die(mw_error_msg()); // names the file
 *   mw_report_write_html(r, "report.html"); mw_report_write_text(r, stdout);
 *   mw_report_free(r);
 * or, at the end of a run: mw_report_text_summary("run/trace.json", stdout);
 */
#ifndef MEMWALL_REPORT_H
#define MEMWALL_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "memwall/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kinds of state, in the order of enum mw_alloc_kind, plus "untracked": bytes a tier's "<tier>
 * bytes" counter shows that no alloc/free event explains (e.g. after dropped events). */
enum {
    MW_REPORT_KIND_UNTRACKED = 7,
    MW_REPORT_NKINDS = 8,
};
/* Phases (spans cat "phase"). */
enum { MW_PHASE_NONE = 0, MW_PHASE_FORWARD, MW_PHASE_BACKWARD, MW_PHASE_UPDATE, MW_PHASE_DATA,
       MW_PHASE_VALIDATION, MW_PHASE_COUNT };
/* Request-size histogram: bucket b holds sizes in [2^(b+MIN_LOG2-1), 2^(b+MIN_LOG2)) bytes; the
 * first bucket also takes everything smaller, the last everything larger. */
enum { MW_REPORT_HIST_MIN_LOG2 = 12, MW_REPORT_HIST_BUCKETS = 20 }; /* <=4 KiB ... >1 GiB */

const char *mw_report_kind_name(int kind);   /* "weights", ..., "other", "untracked" */
const char *mw_report_phase_name(int phase); /* "-", "forward", ..., "validation" */

struct mw_report_opts {
    int bins;          /* points per time series (charts and CSV); default 800 */
    int64_t detail_step; /* step shown at full resolution; -1 (or not in the trace) = the last one */
};
void mw_report_opts_default(struct mw_report_opts *o);

/* Bytes per tier over time, stacked by kind. Series are `nbins` points, one per bin: the state
 * at the instant of the bin's highest total (so peaks survive downsampling). */
struct mw_report_tier {
    char name[32];
    uint64_t budget_bytes;          /* from metadata; 0 = unknown/unlimited */
    uint64_t peak_bytes;            /* highest total over the run */
    double peak_t_s;                /* when (s, trace clock) */
    uint64_t final_bytes;           /* total after the last event */
    uint64_t peak_by_kind[MW_REPORT_NKINDS]; /* each kind's own highest value */
    uint64_t *by_kind;              /* [nbins][MW_REPORT_NKINDS] bytes */
    uint64_t *total;                /* [nbins] bytes */
    int has_counter;                /* a "<tier> bytes" counter was seen */
};

/* I/O between one ordered pair of tiers (cat "io" events). */
struct mw_report_pair {
    char from[32], to[32];
    uint64_t requests, bytes;
    uint64_t min_req, max_req;      /* bytes */
    double busy_s;                  /* union of the pair's request intervals */
    double mean_bw;                 /* bytes / busy_s (bytes/s): achieved while busy */
    double peak_bw;                 /* highest bin of the bandwidth series (bytes/s) */
    double limit_bw;                /* calibrated limit (bytes/s) from metadata; 0 = none */
    double mean_qd;                 /* mean "qd" at submit */
    uint64_t hist_count[MW_REPORT_HIST_BUCKETS];
    uint64_t hist_bytes[MW_REPORT_HIST_BUCKETS];
    double *bw;                     /* [nbins] bytes/s (request bytes spread over its duration) */
    double *bw_busy;                /* [nbins] bytes/s while busy: bin bytes / busy time in the bin
                                       (0 when idle); what compares with the limit */
    double *inflight;               /* [nbins] mean requests in flight */
};

/* One step (span cat "step", name "step"). Times in seconds. */
struct mw_report_step {
    int64_t step, tokens;           /* tokens: -1 when not given */
    double start_s, wall_s;
    double phase_s[MW_PHASE_COUNT]; /* union of each phase's spans inside the step */
    double compute_s, wait_s, io_busy_s, overlap_s;
    double overlap;                 /* overlap_s / io_busy_s; NaN without I/O */
    uint64_t bytes_moved;           /* bytes of the I/O requests submitted inside the step */
};

/* One optimizer subgroup (offload and decision spans with arg "subgroup"). */
struct mw_report_subgroup {
    int64_t id;
    int tier;                       /* index into tiers, or -1 (unknown) */
    uint64_t bytes_read, bytes_written; /* offload read/write spans' "bytes" */
    int64_t n_cpu, n_device;        /* decisions: where it was updated */
    int64_t n_decisions;
    double predicted_s, measured_s; /* sums over decisions */
    double read_s, update_s, write_s, wait_s; /* sums of offload span durations */
};

/* The per-step detail view: one step at full resolution (bounded). */
struct mw_report_rect { double t0_s, t1_s; int lane; int kind; int64_t sub; uint64_t bytes; };
struct mw_report_point { double t_s; int tier; uint64_t by_kind[MW_REPORT_NKINDS]; };

struct mw_report {
    char path[512];
    double t0_s, t1_s;              /* first/last event time (s, trace clock) */
    uint64_t n_events, n_ignored;   /* events read; events of unknown kind skipped */
    uint64_t dropped_events;        /* from metadata (recorder ring overwrote the oldest) */
    uint64_t unmatched_frees;       /* frees that drove a kind below zero */

    int nbins; double bin_s;        /* series resolution: bin width in s, starting at t0_s */
    uint8_t *bin_phase;             /* [nbins] phase covering most of the bin (MW_PHASE_*) */
    int phases_resolved;            /* bins are short enough (>= 10 per median step) to shade phases */

    int ntiers; struct mw_report_tier *tiers;
    int npairs; struct mw_report_pair *pairs;
    int nsteps; struct mw_report_step *steps;
    int nsubgroups; struct mw_report_subgroup *subgroups;

    /* Whole-run totals (same definitions as per step). */
    double compute_s, wait_s, io_busy_s, overlap_s, overlap;
    uint64_t bytes_moved;
    double step_wall_median_s;

    /* Detail of one step: phases, offload/io rectangles, memory change points. */
    int64_t detail_step;            /* -1 = none */
    double detail_t0_s, detail_t1_s;
    int ndetail_rects; struct mw_report_rect *detail_rects; /* lane: see report_detail_lane */
    int ndetail_points; struct mw_report_point *detail_points;
    int detail_truncated;           /* more rectangles than kept */
};

/* Loads and analyses a trace. Returns 0, or -errno / MW_EFORMAT with a message naming the file
 * (and the byte offset for malformed or truncated JSON). opts may be NULL (defaults). */
int mw_report_load(struct mw_report **out, const char *trace_path, const struct mw_report_opts *opts);
void mw_report_free(struct mw_report *r);

/* Writers. Each returns 0 or -errno with a message naming the path. */
int mw_report_write_html(const struct mw_report *r, const char *path);
int mw_report_write_csv(const struct mw_report *r, const char *dir); /* creates dir if needed */
int mw_report_write_text(const struct mw_report *r, FILE *out);

/* Load + text summary in one call (what `memwall train` prints at the end of a run). */
int mw_report_text_summary(const char *trace_path, FILE *out);

/* A synthetic trace in the conventions' format, with figures known in closed form; for tests
 * and for measuring the report on long runs. See src/report/synth.c for the layout. */
struct mw_report_synth {
    int64_t steps;          /* default 10 */
    int subgroups;          /* default 4 */
    uint64_t sg_bytes;      /* bytes per subgroup state object; default 64 MiB */
    uint64_t req_bytes;     /* I/O request size; default 8 MiB */
    double step_us;         /* step length in microseconds; default 100000 */
};
void mw_report_synth_default(struct mw_report_synth *s);
int mw_report_synth_write(const struct mw_report_synth *s, const char *path);

#ifdef __cplusplus
}
#endif
#endif
