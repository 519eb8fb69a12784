/*
 * report_internal.h — what the report's loader hands to its analysis, and the small helpers
 * they share. Not a public header.
 *
 * The loader turns each trace event into one compact record (times in seconds on the trace
 * clock) so the analysis never touches JSON and a 10,000-step trace stays a few hundred bytes
 * per event in memory.
 */
#ifndef MEMWALL_REPORT_INTERNAL_H
#define MEMWALL_REPORT_INTERNAL_H

#include "memwall/fsutil.h"
#include "memwall/report.h"

#include <stddef.h>
#include <stdint.h>

#define RP_MAX_TIERS 16
#define RP_MAX_PAIRS 64
#define RP_DETAIL_MAX_RECTS 4000
#define RP_DETAIL_MAX_POINTS 20000

enum rp_cat { RP_CAT_PHASE = 0, RP_CAT_STEP, RP_CAT_OFFLOAD, RP_CAT_DECISION };
enum rp_offload { RP_OFF_READ = 0, RP_OFF_UPDATE, RP_OFF_WRITE, RP_OFF_REFRESH, RP_OFF_WAIT,
                  RP_OFF_COUNT };
enum rp_decision { RP_DEC_CPU = 0, RP_DEC_DEVICE };

struct rp_io {            /* one cat "io" request */
    double t0, t1;        /* s: submit, completion */
    uint64_t bytes;
    int pair;             /* index into rp_trace.pair_from/to */
    uint32_t qd;          /* requests in flight at submit */
};

struct rp_mem {           /* alloc/free (delta) and/or the tier's bytes after it (value) */
    double t;             /* s */
    uint32_t seq;         /* file order, the tie-break for equal t */
    int16_t tier, kind;   /* kind: 0..6, or -1 for a bare "<tier> bytes" counter */
    int16_t has_value;    /* value is set (counter, or alloc/free args.tier_bytes) */
    int64_t delta;        /* bytes (+alloc, -free) */
    uint64_t value;       /* tier bytes after the event */
};

struct rp_span {          /* a span of one of the categories above */
    double t0, t1;        /* s */
    int8_t cat, name;     /* rp_cat; MW_PHASE_* / rp_offload / rp_decision / 0 for "step" */
    int8_t who;           /* RP_WHO_CALLER: an offload "wait" with arg caller = 1 (the training thread
                             blocked); RP_WHO_ENGINE: the "update" phase made of an offload "step" */
    int8_t synth;         /* derived: a decision from an offload "update" span's args.device, or
                             a step from an offload "step" span (used only if the trace has none
                             of its own); analyze.c drops them when real ones exist */
    int16_t tier;         /* arg "tier" resolved to a tier index, or -1 */
    int64_t step, tokens, sub, bytes, predicted_ns, measured_ns; /* -1 when absent */
};

enum { RP_WHO_ANY = 0, RP_WHO_CALLER = 1, RP_WHO_ENGINE = 2 };
#define RP_COMM_WAIT MW_REPORT_COMM_NOPS /* rp_comm.op of a comm "wait" span */

struct rp_comm {          /* one span cat "comm": a collective, or a wait on one */
    double t0, t1;        /* s: issue (or wait start), completion (or wait end) */
    int8_t op;            /* MW_REPORT_COMM_*, or RP_COMM_WAIT */
    int8_t group;         /* args "group" (enum mw_comm_group), -1 when absent */
    int32_t ranks;        /* args "ranks" (group size), -1 when absent */
    int64_t bytes, sent;  /* args "bytes" (payload), "sent"; -1 when absent */
};

enum rp_res_name { RP_RES_FETCH = 0, RP_RES_RESIDENT, RP_RES_GRAD_WRITE, RP_RES_WAIT, RP_RES_ACT_WRITE, RP_RES_ACT_READ,
                   RP_RES_COUNT };

struct rp_res {           /* one span cat "residency" */
    double t0, t1;        /* s */
    int64_t unit;         /* args "unit" (>= 0) */
    int64_t bytes;        /* args "bytes"; 0 when absent */
    int8_t name;          /* rp_res_name */
    int8_t backward;      /* "resident": args "backward" (0 forward, 1 backward) */
};

struct rp_cost {           /* one span cat "cost": a component's step, or a plan (comp = RP_COST_PLAN) */
    int64_t step, n;      /* args "step", "n" (plan: "device_subgroups") */
    double pred_s, meas_s; /* args "predicted_ns", "measured_ns" (plan: "best_fixed_ns") */
    int8_t comp;          /* 0..MW_REPORT_COST_NCOMP-1, or RP_COST_PLAN */
};
#define RP_COST_PLAN MW_REPORT_COST_NCOMP

struct rp_unit_name { int64_t id; char name[32]; };

struct rp_trace {
    const char *path;
    int ntiers;
    char tier_name[RP_MAX_TIERS][32];
    uint64_t tier_budget[RP_MAX_TIERS];
    int tier_id[RP_MAX_TIERS];         /* recorder's numeric id when known, else -1 */
    int npairs;
    int pair_from[RP_MAX_PAIRS], pair_to[RP_MAX_PAIRS]; /* tier indices */
    double pair_limit[RP_MAX_PAIRS];   /* bytes/s, 0 = none */
    struct rp_io *io; size_t nio, capio;
    struct rp_mem *mem; size_t nmem, capmem;
    struct rp_span *span; size_t nspan, capspan;
    struct rp_comm *comm; size_t ncomm, capcomm;
    struct rp_res *res; size_t nres, capres;
    struct rp_cost *cost; size_t ncost, capcost;
    struct rp_unit_name *unit_names; size_t nunit_names, capunit_names; /* metadata */
    int64_t units_declared;            /* metadata "units"; -1 when absent */
    int has_resw;                      /* counter "resident weights" */
    double resw_peak, resw_peak_t, resw_final; /* bytes, s, bytes */
    uint64_t n_events, n_ignored, dropped;
    int rank, world_size, zero_stage;  /* metadata; -1 when absent */
    int has_resident;                  /* counter "zero3 resident weights" */
    double resident_peak, resident_peak_t, resident_final; /* bytes, s, bytes */
};

/* scan.c: the file, event by event (0, or -errno / MW_EFORMAT with a message naming it) */
int rp_trace_load(struct rp_trace *t, const char *path);
/* load.c: one event / the metadata into records */
struct cJSON;
int rp_take_event(struct rp_trace *t, const struct cJSON *e, const char **why); /* 0, -ENOMEM, 1 bad */
void rp_take_metadata(struct rp_trace *t, const struct cJSON *md);
void rp_trace_free(struct rp_trace *t);
int rp_tier_index(struct rp_trace *t, const char *name); /* adds it when new; -1 when full */

/* analyze.c */
int rp_analyze(struct mw_report *r, struct rp_trace *t, const struct mw_report_opts *o);

/* intervals.c: sorted, disjoint interval lists [a, b) in seconds. */
struct rp_ivl { double a, b; };
struct rp_ivls { struct rp_ivl *v; size_t n, cap; };
int rp_ivls_push(struct rp_ivls *l, double a, double b);
void rp_ivls_normalize(struct rp_ivls *l);  /* sort + merge overlapping/touching */
int rp_ivls_subtract(const struct rp_ivls *x, const struct rp_ivls *y, struct rp_ivls *out);
int rp_ivls_intersect(const struct rp_ivls *x, const struct rp_ivls *y, struct rp_ivls *out);
double rp_ivls_total(const struct rp_ivls *l);
/* Measure of l inside [a, b); *cursor is a hint for increasing a (start it at 0). */
double rp_ivls_measure_in(const struct rp_ivls *l, double a, double b, size_t *cursor);
void rp_ivls_free(struct rp_ivls *l);

/* analyze_comm.c: the comm tables, series and per-step figures. C is the compute set (phases
 * minus all waits); called by analyze_steps.c once the steps exist. rp_comm_wait_ivls pushes the
 * comm "wait" spans (not normalized). */
int rp_comm_wait_ivls(const struct rp_trace *t, struct rp_ivls *out);
int rp_analyze_comm(struct mw_report *r, const struct rp_trace *t, const struct rp_ivls *C);
/* What the rank rows share, for the Ranks table's header: world size and ZeRO stage (-1 when
 * no trace says), kinds with bytes on some rank, whether some rank has the resident counter. */
void rp_ranks_summary(const struct mw_report *r, int *ws, int *zs, int kinds[MW_REPORT_NKINDS], int *res);

/* analyze_cost.c: the cost model's tables (r->cost) from the cost spans. */
int rp_analyze_cost(struct mw_report *r, struct rp_trace *t);

/* analyze_res.c: the per-unit table and lanes, and the per-step roofline (after the steps). */
int rp_analyze_residency(struct mw_report *r, struct rp_trace *t, const struct mw_report_opts *o);
int rp_res_wait_ivls(const struct rp_trace *t, struct rp_ivls *out); /* residency "wait" spans */

/* Growth helper for the record arrays: ensures room for one more; 0 or -ENOMEM. */
int rp_grow(void **v, size_t *cap, size_t n, size_t elem);

/* text.c */
double rp_step_median(const struct mw_report *r, size_t off);


/* writers' shared helpers (html_svg.c) */
const char *rp_kind_color(int kind);
const char *rp_phase_color(int phase);
const char *rp_pair_color(int pair);
const char *rp_comm_color(int op); /* MW_REPORT_COMM_* or RP_COMM_WAIT */

#endif
