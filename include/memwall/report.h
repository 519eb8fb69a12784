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
 *   overlap fraction = |I/O busy ∩ compute| / |I/O busy| (NaN when there was no I/O);
 *   exposed comm wait = union of comm "wait" spans (also taken out of compute);
 *   comm busy of an operation = union of its collectives' spans (issue to completion);
 *   achieved comm bandwidth = payload bytes / comm busy (GB/s = 10^9 bytes/s).
 *   exposed I/O wait also takes the residency "wait" spans (the training thread blocked on a
 *   weight unit's NVMe fetch);
 *   roofline of a step: compute = wall - |exposed I/O wait ∪ exposed comm wait| inside it;
 *   NVMe time = bytes read from nvme / read bandwidth + bytes written to nvme / write bandwidth
 *   (one disk: reads and writes share it); bound = max(compute, NVMe time); achieved fraction =
 *   bound / wall. Only with both bandwidths known (metadata limit.nvme->host / host->nvme, or
 *   opts); the run's figure is the median over all steps but the first.
 *
 * Several ranks: mw_report_load_ranks() reads one trace per rank (mpirun ... --trace
 * run/trace.%r.json), gives the full report of rank 0 and one row per rank (peaks per tier
 * and kind, ZeRO-3 resident weights, comm bytes and wait, NVMe bytes, median step).
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

/* Collectives (spans cat "comm"), in the order of enum mw_comm_op (memwall/comm.h). */
enum { MW_REPORT_COMM_ALLREDUCE = 0, MW_REPORT_COMM_REDUCE_SCATTER, MW_REPORT_COMM_ALLGATHER,
       MW_REPORT_COMM_NOPS };

const char *mw_report_kind_name(int kind);   /* "weights", ..., "other", "untracked" */
const char *mw_report_phase_name(int phase); /* "-", "forward", ..., "validation" */
const char *mw_report_comm_op_name(int op);  /* "allreduce", "reduce_scatter", "allgather" */

struct mw_report_opts {
    int bins;          /* points per time series (charts and CSV); default 800 */
    int64_t detail_step; /* step shown at full resolution; -1 (or not in the trace) = the last one */
    double nvme_read_bw, nvme_write_bw; /* bytes/s for the roofline; > 0 overrides the trace's
                                           metadata limit.nvme->host / host->nvme; 0 = metadata */
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
    uint64_t comm_sent_bytes;       /* "sent" bytes of the collectives issued inside the step */
    double comm_wait_s;             /* exposed comm wait inside the step */
    /* Roofline (docs/report.md). Bytes of the requests submitted inside the step. */
    uint64_t nvme_read_bytes;       /* cat "io" requests from the nvme tier */
    uint64_t nvme_written_bytes;    /* cat "io" requests to the nvme tier */
    double exposed_wait_s;          /* |(offload wait ∪ residency wait ∪ comm wait) ∩ step| */
    double roof_compute_s;          /* wall_s - exposed_wait_s */
    double roof_nvme_s;             /* read bytes / read bw + written bytes / write bw; NaN: bw unknown */
    double roof_bound_s;            /* max(roof_compute_s, roof_nvme_s); NaN: bw unknown */
    double roof_fraction;           /* roof_bound_s / wall_s; NaN: bw unknown or wall 0 */
};

/* Residency lanes: per weight unit and bin, the seconds of each kind of span in the bin. */
enum { MW_REPORT_RES_FWD = 0,  /* resident for the forward pass */
       MW_REPORT_RES_BWD,       /* resident for the backward pass */
       MW_REPORT_RES_FETCH,     /* weights read from NVMe */
       MW_REPORT_RES_WRITE,     /* gradients written to NVMe */
       MW_REPORT_RES_WAIT,      /* the training thread waiting for the fetch */
       MW_REPORT_RES_NLANE };

/* One weight unit streamed through DRAM (spans cat "residency" with arg "unit"). */
struct mw_report_unit {
    int64_t id;                     /* 0 embeddings, 1..L blocks, L+1 final norm */
    char name[32];                  /* metadata unit.<id>.name, else derived from "units" */
    uint64_t fetches, bytes_read;   /* "fetch" spans and their bytes */
    double fetch_s;                 /* sum of the fetch spans' durations */
    uint64_t grad_writes, bytes_written; /* "grad_write" spans and their bytes */
    double write_s;                 /* sum of their durations */
    uint64_t residencies;           /* "resident" spans */
    double resident_s;              /* union of its resident spans */
    double resident_fwd_s, resident_bwd_s; /* union of those with backward 0 / 1 */
    uint64_t waits;                 /* "wait" spans (the training thread blocked on its fetch) */
    double wait_s;                  /* their total: the unit's exposed wait */
    double *cov;                    /* [nbins][MW_REPORT_RES_NLANE] s; NULL when lanes were not
                                       kept (more than MW_REPORT_MAX_UNIT_LANES units) */
};
enum { MW_REPORT_MAX_UNIT_LANES = 512 };

/* One collective operation over the run (spans cat "comm" of that name). */
struct mw_report_comm {
    uint64_t calls;
    uint64_t payload_bytes;         /* sum of args "bytes" (the collective's buffer) */
    uint64_t sent_bytes;            /* sum of args "sent" (what this rank sends, ring algorithm) */
    int max_ranks;                  /* largest group size seen (args "ranks"); 0 unknown */
    double busy_s;                  /* union of the op's spans */
    double achieved_bw;             /* payload_bytes / busy_s (bytes/s); 0 without busy time */
    double wait_s;                  /* exposed wait attributed to this op: sum of the comm "wait"
                                       spans during which a collective of this op with the same
                                       bytes and ranks completed */
    double *inflight;               /* [nbins] mean collectives of this op in flight */
};

/* One row of the per-rank table (mw_report_load_ranks). Bytes are bytes, times seconds. */
struct mw_report_rank {
    char path[512];
    int rank;                       /* metadata "rank", else the trace's position in the list */
    int world_size, zero_stage;     /* metadata; -1 when absent */
    uint64_t peak_device_bytes, peak_host_bytes, peak_nvme_bytes; /* each tier's peak */
    uint64_t peak_kind_bytes[MW_REPORT_NKINDS]; /* each kind's peak summed over tiers */
    int has_resident;               /* the trace has a "zero3 resident weights" counter */
    uint64_t resident_peak_bytes;   /* its highest value */
    uint64_t comm_sent_bytes;       /* all collectives */
    double comm_wait_s;             /* exposed comm wait, whole run */
    uint64_t nvme_read_bytes, nvme_written_bytes; /* I/O from / to the nvme tier */
    double step_median_s;           /* NaN without steps */
    int nsteps;
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

/* The offload engine's cost model (cat "cost" spans, one per component and step: docs/offload.md,
 * "A cost model that learns"): what it predicted for each component of the updates beside what was
 * measured, per step and summed, over the whole run and after learning (steps after the first
 * MW_REPORT_COST_LEARN_STEPS that have cost spans); auto's plans (cat "cost", name "plan"). */
#define MW_REPORT_COST_NCOMP 6
#define MW_REPORT_COST_LEARN_STEPS 5
struct mw_report_cost_step {
    int64_t step;
    double predicted_s[MW_REPORT_COST_NCOMP], measured_s[MW_REPORT_COST_NCOMP];
    int64_t n[MW_REPORT_COST_NCOMP];  /* observations (0: the component was not seen that step) */
};
struct mw_report_cost {
    int nsteps; struct mw_report_cost_step *steps; /* in step order */
    int64_t n[MW_REPORT_COST_NCOMP];
    double predicted_s[MW_REPORT_COST_NCOMP], measured_s[MW_REPORT_COST_NCOMP];           /* whole run */
    int late_steps;
    double late_predicted_s[MW_REPORT_COST_NCOMP], late_measured_s[MW_REPORT_COST_NCOMP]; /* after learning */
    int nplans, plan_switches;        /* auto: plans traced, and how often the split changed */
    int64_t plan_step, plan_device_subgroups; /* the last plan */
    double plan_predicted_s, plan_best_fixed_s;
};
const char *mw_report_cost_name(int comp); /* "cpu", "read", "write", "h2d", "device", "d2h" */
/* The update's own components (the compute and copies a decision's prediction covers: cpu, h2d,
 * device, d2h; not the disk's): 1 for those. */
int mw_report_cost_is_update(int comp);

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
    struct mw_report_cost cost;

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

    /* Run identity from metadata (-1 when absent). */
    int rank, world_size, zero_stage;
    uint64_t peak_kind_bytes[MW_REPORT_NKINDS]; /* each kind's highest total over all tiers */
    /* ZeRO-3: counter "zero3 resident weights" (bytes of the weights resident on this rank). */
    int has_resident;
    uint64_t resident_peak_bytes, resident_final_bytes;
    double resident_peak_t_s;

    /* Communication (spans cat "comm"); has_comm = 0 for single-rank runs. */
    int has_comm;
    struct mw_report_comm comm[MW_REPORT_COMM_NOPS];
    uint64_t comm_payload_bytes, comm_sent_bytes; /* all ops */
    double comm_busy_s;             /* union of all collectives */
    double comm_wait_s;             /* exposed comm wait: union of comm "wait" spans */
    double comm_wait_unattributed_s;/* wait spans matched to no collective */
    double comm_overlap_s, comm_overlap; /* |comm busy ∩ compute|, / comm busy (NaN: none) */
    double steps_wall_s;            /* sum of the steps' wall times ("% of step time") */
    double *comm_wait_bins;         /* [nbins] share of each bin spent in exposed comm wait */

    /* Weight residency (spans cat "residency"; NVMe streaming of weights and gradients). */
    int has_residency;
    int nunits; struct mw_report_unit *units; /* sorted by id */
    int64_t units_declared;         /* metadata "units"; -1 when absent */
    double res_wait_s;              /* union of the residency "wait" spans */
    int has_resident_weights;       /* a "resident weights" counter was seen */
    uint64_t resident_weights_peak_bytes, resident_weights_final_bytes;
    double resident_weights_peak_t_s;

    /* Roofline: the NVMe bandwidths used (bytes/s, 0 = unknown) and where they came from. */
    double nvme_read_bw, nvme_write_bw;
    const char *nvme_read_bw_from, *nvme_write_bw_from; /* "trace metadata", "option" or NULL */
    int has_roofline;               /* both known and the trace has steps */
    double roof_median_fraction;    /* median over the steady steps of roof_fraction */
    double roof_median_nvme_s, roof_median_compute_s, roof_median_bound_s, roof_median_wall_s;
    int roof_first, roof_last;      /* indices into steps of the steady range (all but the
                                       first step; the only step when there is one) */

    /* Per-rank table: filled by mw_report_load_ranks, else nranks 0. */
    int nranks; struct mw_report_rank *ranks;
};

/* Loads and analyses a trace. Returns 0, or -errno / MW_EFORMAT with a message naming the file
 * (and the byte offset for malformed or truncated JSON). opts may be NULL (defaults). */
int mw_report_load(struct mw_report **out, const char *trace_path, const struct mw_report_opts *opts);
void mw_report_free(struct mw_report *r);

/* Writers. Each returns 0 or -errno with a message naming the path. */
int mw_report_write_html(const struct mw_report *r, const char *path);
int mw_report_write_csv(const struct mw_report *r, const char *dir); /* creates dir if needed;
                                                                        ranks.csv when nranks > 0 */
int mw_report_write_text(const struct mw_report *r, FILE *out);

/* Several ranks' traces of one run. Loads each trace in turn (one full report in memory at a
 * time besides the kept one), keeps the full report of rank 0 (metadata "rank" 0, else the
 * first path) and puts one row per trace, sorted by rank, into (*out)->ranks. The writers then
 * add a "Ranks" table (CSV: ranks.csv). Returns 0; the first trace's load error (names the
 * file); or MW_REPORT_EMISMATCH when the traces are not of one run: world_size differs (the
 * message names the file that differs and the one it is compared with) or a rank repeats. */
enum { MW_REPORT_EMISMATCH = -10101 };
int mw_report_load_ranks(struct mw_report **out, const char *const *paths, int n,
                         const struct mw_report_opts *opts);
/* The ranks-table row of one loaded report (rank = metadata, else `index`). */
void mw_report_rank_row(const struct mw_report *r, int index, struct mw_report_rank *row);
/* Expands a path holding "%r" (every occurrence) for r = 0, 1, ... while the file exists, up
 * to max_ranks. *paths is malloc'ed (free each and the array: mw_report_paths_free). Returns
 * the count (>= 1), or -ENOENT with a message naming the pattern when rank 0's file is absent. */
int mw_report_expand_ranks(const char *pattern, int max_ranks, char ***paths);
void mw_report_paths_free(char **paths, int n);

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
    int world_size;         /* > 0: also comm spans, metadata rank/world_size/zero_stage and the
                               "zero3 resident weights" counter; default 0 (none) */
    int rank;               /* with world_size: this trace's rank; default 0 */
};
void mw_report_synth_default(struct mw_report_synth *s);
int mw_report_synth_write(const struct mw_report_synth *s, const char *path);

#ifdef __cplusplus
}
#endif
#endif
