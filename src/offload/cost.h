/*
 * cost.h — the offload engine's cost model that learns from its own run (costlearn.c), and the
 * planner of `--offload-policy auto` that uses it (costplan.c).
 *
 * Why learn: the calibrated profile (memwall bench offload --calibrate) says what the CPU, the
 * accelerator, the link and the disk do alone and idle. In a training run the update shares the
 * cores with the forward and backward passes, the reads share the disk with the write-backs, and
 * the profile may come from another day or another load: `make demo` predicted 1.3 s of updates
 * and measured 12.6 s. The model keeps, per component and per context, a smoothed correction
 * factor (measured / profile) updated once per step from that step's measured times, so the
 * prediction of step s is the profile corrected by steps 1..s-1.
 *
 * Components (one subgroup's update; units: elements for compute, bytes for I/O and copies):
 *   cpu      the CPU update (kernel, fused checksums, working-copy refresh): n / cpu_params_per_s
 *   read     NVMe -> staging: bytes / nvme_read_bytes_per_s
 *   write    staging -> NVMe: bytes / nvme_write_bytes_per_s
 *   h2d      host -> device copies: bytes / link_bytes_per_s
 *   device   the device's AdamW: n / dev_params_per_s + dev_latency_s
 *   d2h      device -> host copies: bytes / link_bytes_per_s
 * State in DRAM is updated where it lives: no read or write component then.
 *
 * Contention, two ways:
 *   - compute and copies carry a context: SHARED when the caller is computing (backward, or the
 *     next forward with the update behind it), QUIET when the caller waits for the step; each
 *     context has its own factor (the other's, or 1, until it has one);
 *   - the disk is one resource: reads and writes are timed as the disk's busy time (the union of
 *     their transfers in flight, not each request's latency, which counts the queue), and the
 *     time both were in flight is split between them in proportion to their profile times. So a
 *     read is predicted to share the disk with the write-backs of the step, as it does.
 *
 * Threads: every entry is called with the engine's mutex held (completions take it anyway).
 */
#ifndef MEMWALL_OFFLOAD_COST_H
#define MEMWALL_OFFLOAD_COST_H

#include "memwall/offload.h"

#include <stdint.h>

struct mw_trace;

enum ofl_cost_comp {
    OFL_COST_CPU = 0,
    OFL_COST_READ,
    OFL_COST_WRITE,
    OFL_COST_H2D,
    OFL_COST_DEV,
    OFL_COST_D2H,
    OFL_COST_N
};
enum ofl_cost_ctx { OFL_CTX_QUIET = 0, OFL_CTX_SHARED = 1, OFL_CTX_N };

/* The smoothing of the correction factors: a factor is the median of the ratios (measured / profile)
 * of the last OFL_COST_WINDOW steps learned from (the middle two's geometric mean for an even
 * count), so the first step learned from replaces the profile's 1 at once, a change of level is
 * followed within three steps, and a burst of another tenant's load on one or two steps (a 5 ms
 * CPU update where the others take 1.3 ms, on a 2-core machine) does not move it. */
#define OFL_COST_WINDOW 5
struct ofl_cost_hist {
    double r[OFL_COST_WINDOW]; /* log ratios, a ring */
    uint32_t n;                /* learned */
    uint64_t at;               /* plan ratios: the step of the last */
    /* plan ratios: the count's level, the median of its last OFL_COST_WINDOW log ratios each paired
     * with home's (costplan.c), a ring of lvl_n; a probe run again replaces the one it added */
    double lv[OFL_COST_WINDOW];
    uint32_t lvl_n;
};
/* A component's first steps (in each context) are measured and reported but not learned from
 * (costlearn.c: warm-up). */
#define OFL_COST_WARMUP 1

struct ofl_cost_acc { double base_s, pred_s, meas_s, units; uint64_t n; };

struct ofl_cost {
    struct mw_offload_profile prof;
    double k[OFL_COST_N][OFL_CTX_N];          /* correction factor: measured / profile */
    struct ofl_cost_hist hist[OFL_COST_N][OFL_CTX_N]; /* the ratios it is the median of */
    uint32_t seen[OFL_COST_N][OFL_CTX_N];     /* steps that observed it (the first OFL_COST_WARMUP: not learned) */
    struct ofl_cost_acc step[OFL_COST_N][OFL_CTX_N]; /* this step's observations */
    double io_units[2];                       /* this step's disk bytes: read, write */
    uint64_t io_n[2];                         /* and its transfers that moved bytes */
    /* the disk's busy time this step: reads only, writes only, both in flight (ns) */
    uint64_t disk_ns[3];
    int disk_n[2];                            /* transfers in flight: read, write */
    uint64_t disk_t;                          /* when disk_n last changed */
    uint64_t steps;                           /* steps ended */
    /* The device's pipeline as a whole: measured span / simulated span of its jobs in a step (the
     * per-job factors cannot see how a device interleaves one job's copies with another's, or how
     * the host threads that feed it are scheduled); the planner scales the device's times by it. */
    double kspan;
    uint32_t kspan_seen;
    struct ofl_cost_hist kspan_hist;
    enum ofl_cost_ctx hint;                   /* the context most updates of the last step ran in */
    /* totals over the run, and over steps after learning (from OFL_COST_LEARNED_AFTER on) */
    struct ofl_cost_acc run[OFL_COST_N], late[OFL_COST_N];
};
#define OFL_COST_LEARNED_AFTER 5 /* steps: the report's "after learning" starts at step 6 */

extern const char *const ofl_cost_names[OFL_COST_N];

void ofl_cost_init(struct ofl_cost *c, const struct mw_offload_profile *p);
/* The profile's time for `units` of comp (seconds), and the corrected one in context ctx. */
double ofl_cost_base(const struct ofl_cost *c, enum ofl_cost_comp comp, double units);
double ofl_cost_factor(const struct ofl_cost *c, enum ofl_cost_comp comp, enum ofl_cost_ctx ctx);
double ofl_cost_predict(const struct ofl_cost *c, enum ofl_cost_comp comp, enum ofl_cost_ctx ctx, double units);
/* One compute or copy measured (seconds); returns what the model predicted for it. */
double ofl_cost_observe(struct ofl_cost *c, enum ofl_cost_comp comp, enum ofl_cost_ctx ctx, double units,
                        double meas_s);
/* A disk transfer starts / ends (write: 1 for a write-back, 0 for a read) at `now` (ns); bytes at
 * the end. */
void ofl_cost_io_begin(struct ofl_cost *c, int write, uint64_t now);
void ofl_cost_io_end(struct ofl_cost *c, int write, uint64_t bytes, uint64_t now);
/* The step's end: learns from its observations, traces one span per component observed (cat
 * "cost", [t0, t1], args step, n, predicted_ns, measured_ns) and its factor (counter "cost factor
 * <component>"), and clears the step. */
void ofl_cost_step_end(struct ofl_cost *c, struct mw_trace *tr, uint64_t step, uint64_t t0, uint64_t t1);

/* A step's device span: measured beside simulated (seconds); learned as the factors are (not from the
 * first step, then the median of the last OFL_COST_WINDOW); traced as counter "cost factor device
 * span" at t. */
void ofl_cost_learn_span(struct ofl_cost *c, struct mw_trace *tr, double measured_s, double simulated_s, uint64_t t);
/* Adds ratio r (> 0) to h; returns the median of its last OFL_COST_WINDOW ratios (1 when empty). */
double ofl_cost_hist_add(struct ofl_cost_hist *h, double r);
double ofl_cost_hist_median(const struct ofl_cost_hist *h);
/* The median of a ring of n values written as h->r is (its last OFL_COST_WINDOW; the middle two's mean
 * for an even count; 0 when n is 0): the log of ofl_cost_hist_median, and a plan count's level. */
double ofl_cost_ring_median(const double *ring, uint32_t n);
/* Forgets all but h's last ratio (none stays none). */
void ofl_cost_hist_keep_last(struct ofl_cost_hist *h);

/* ------------------------------------------------------------------ the auto planner (costplan.c) */

/* What one subgroup of the step costs on each side, from the corrected model (seconds). */
struct ofl_plan_sg {
    double read, write;       /* disk (0 with the state in DRAM) */
    double cpu;               /* the CPU update */
    double h2d, dev, d2h;     /* the device's copies and kernel */
};
/* The candidates a plan is chosen from: the fixed policies (all-cpu, all-device, every-K for K in
 * 2..OFL_PLAN_MAXK), then splits that send d subgroups to the device, spread evenly. */
#define OFL_PLAN_MAXK 8
struct ofl_plan_choice {
    int kind;                 /* enum mw_offload_policy of the fixed policy it is, or -1 (a split) */
    int k;                    /* every-K: K */
    uint32_t ndev;            /* subgroups on the device */
    double predicted_s;       /* the step's update phase, simulated */
};
/* Whether subgroup i of n goes to the device under choice ch. */
int ofl_plan_on_device(const struct ofl_plan_choice *ch, uint32_t i, uint32_t n);
/* The update phase of one step under ch: reads in order on the disk, each subgroup's update on
 * its side once read (the CPU one at a time; the device's copies on one link, its kernels one at
 * a time, two jobs in flight), write-backs after, reads and writes sharing the disk. */
double ofl_plan_simulate(const struct ofl_plan_sg *sg, uint32_t n, const struct ofl_plan_choice *ch);
/* The step where on_dev[i] says which subgroups the device had, and (dev_span, when not NULL) the
 * device's span in it: from its first copy in to its last copy out (0 without any). What the engine
 * measures beside them teaches the model how the device's jobs overlap (ofl_cost_learn_span) and how
 * far a plan's step is from its simulation (the plan ratios below). */
double ofl_plan_simulate_mask(const struct ofl_plan_sg *sg, uint32_t n, const unsigned char *on_dev, double *dev_span);
/* The simulated step of ch times ratio[ch->ndev] (ratio: [n + 1], by the number of subgroups on the
 * device, measured / simulated of the steps run with that many; NULL: 1). Why by plan: the time of a
 * step that uses both sides is the later of two paths, each with its own noise and its own host
 * threads to share, and no sum of per-job factors sees that; a plan that was run says it. */
double ofl_plan_predict(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, const struct ofl_plan_choice *ch);
/* The fastest candidate by ofl_plan_predict (ties: the earlier, in the order above: fixed policies
 * first), except that a split must be predicted faster than the fastest fixed policy by more than
 * OFL_PLAN_SPLIT_MARGIN of its time, else that fixed policy is the best; best_fixed, when not NULL,
 * receives the fastest fixed policy. Why the margin: a split's step is the later of two paths,
 * each with its own noise, and its ratio (above) comes from fewer steps than the side it left;
 * on the 2-core VM, with the state on NVMe every plan waits for the same disk, and auto wandered
 * among splits predicted 1 or 2 % ahead that ran 5 to 15 % behind all-cpu. */
#define OFL_PLAN_SPLIT_MARGIN 0.03
void ofl_plan_best(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, struct ofl_plan_choice *best,
                   struct ofl_plan_choice *best_fixed);
/* The plan ratios from their histories (hist, ratio: [n + 1], by the number of subgroups on the
 * device): each count's median when it ran; for one that did not, the line between the nearest
 * counts that ran on either side of it, or the nearest one's where it has one side only (1 when
 * nothing ran). Why not the largest measured (this function's first version): a plan never measured
 * was then never ahead of those measured; on the 2-core VM with the state in DRAM, a device 8x the
 * CPU behind 64 GB/s, the simulation put the best split at 7 of 16 subgroups while 4 and 5 ran
 * fastest (14.5 ms against 17-19 ms): every count below 5 got 7's ratio, 1.1, and was never tried,
 * though 5's measured 0.8 said the simulation was wrong about the low side. Nor 1 for all: an
 * untried split then looked ahead of all-cpu by all-cpu's own error (1.08). A step's time is the
 * later of the CPU's path and the device's, each nearly linear in the count, so a ratio between two
 * measured counts is near the line between them. */
void ofl_plan_ratios(const struct ofl_cost_hist *hist, uint32_t n, double *ratio);
/* The same, each count's ratio from its level beside home's (ofl_plan_next: every probe's steps over
 * home's around it, paired) times home's median: ratios measured at different times are compared
 * through what each measured beside home, not under two loads (costplan.c: why). Counts without a
 * level: their own median, or the line between. Without home's median or level: ofl_plan_ratios. */
void ofl_plan_ratios_paired(const struct ofl_cost_hist *hist, uint32_t n, uint32_t home, double *ratio);
/* Ties: a fixed policy with a number of device subgroups other than best's, into *out: one never
 * run (tried[ndev] == 0, tried: [n + 1]) predicted within OFL_PLAN_TIE of best or simulated within
 * it (its ratio, never measured, is ofl_plan_ratios' guess), or predicted within OFL_PLAN_EXPLORE
 * when it is best's neighbour (below: the first in the candidates' order); else, when step `now` is
 * a multiple of OFL_PLAN_REPROBE, one whose plan ratio was last learned more than OFL_PLAN_REPROBE
 * steps before (hist: [n + 1], the plan ratios' histories, NULL: none such) and whose simulation
 * alone is within OFL_PLAN_TIE of best's, the one measured longest ago (the first in the
 * candidates' order among equals), so that every tie comes round in turn. 1, or 0 when there is
 * none. The caller (ofl_plan_next) forgets the re-measured plan's old ratios: they are what is in
 * doubt. The model cannot tell such plans apart (on NVMe every plan waits for the same disk, and
 * how the update's threads share the cores with the I/O's decides), so auto runs each and lets the
 * plan ratios, measured, choose (ofl_plan_next: beside home's steps around it); and again now and
 * then, because a ratio measured once, long ago, under another load, decides against the plan in
 * use measured every step: on the 2-core VM all-device ran 3 % ahead of all-cpu with the state on
 * NVMe, and auto, its one probe of all-device slower by noise, kept all-cpu for good. Why the one
 * measured longest ago (this rule first took the one measured last, the plan auto left last): with
 * seven fixed policies tied on NVMe, the re-probe went to the same two or three, and all-device,
 * probed once at step 3 and 2.6 % "behind" by noise, was never run again in a 46-step run where it
 * was 2.7 % ahead of the rest. */
#define OFL_PLAN_TIE 0.03
/* ... and a fixed policy never run whose device count is next to best's (the nearest of the fixed
 * policies below it or above it) is probed when predicted within OFL_PLAN_EXPLORE: a local search
 * on measured steps, because the simulation can be wrong about where the best count lies (the
 * device's copies share the host with the CPU's updates); one step of a plan 20 % slower costs
 * less than a run spent on the wrong side of the best. */
#define OFL_PLAN_EXPLORE 0.25
/* A re-probe every 10 steps: each costs one step of a plan the simulation ties (3 %), so a tenth of
 * that at most, and seven ties come round within 70 steps. */
#define OFL_PLAN_REPROBE 10
int ofl_plan_untried(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, const unsigned char *tried,
                     const struct ofl_cost_hist *hist, uint64_t now, const struct ofl_plan_choice *best,
                     struct ofl_plan_choice *out);
/* Hysteresis: keep `cur` unless `best` is predicted faster by more than OFL_PLAN_HYST of cur's
 * time (both simulated on the same model). Returns 1 when best should replace cur. */
#define OFL_PLAN_HYST 0.02
int ofl_plan_switch(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, const struct ofl_plan_choice *cur,
                    const struct ofl_plan_choice *best);

/* Auto's choice between steps (the engine keeps one; policy.c adds each step's plan ratio to hist). */
struct ofl_plan_auto {
    struct ofl_plan_choice cur;   /* the next step's plan */
    struct ofl_plan_choice home;  /* the plan auto settled on: the one a probe returns to */
    int set;                      /* cur holds a plan */
    struct ofl_plan_choice probe; /* the last probe */
    int probes;                   /* times it was probed in a row (0: none being judged) */
    int wait;                     /* steps before auto decides again: the probe's, then home's after it */
    int pending;                  /* the probe ran, its level beside home's not yet learned */
    struct ofl_plan_choice left;  /* the home auto last moved from */
    int verify;                   /* it is the next probe */
    uint32_t switches;            /* steps whose plan differed from the step before's */
};
/* The plan of the step after step `now` into a->cur (and the fastest fixed policy into *best_fixed,
 * when not NULL), from the model's times sg[n] and the plan ratios (hist, ratio, tried: [n + 1], as
 * above; hist already holds what step `now` measured). At the first call (now 0): the best by
 * the model. Otherwise home, or the best when ofl_plan_switch says so (the new home runs first);
 * or, from step 2 on, after a step of home, a probe, run for one step, then home for OFL_PLAN_BACK
 * steps before auto decides again, whatever the probe measured (a probe the ratios choose is taken
 * only after OFL_PLAN_TAKE_AFTER of its steps: probed again until then). The probe: the last one
 * again when it is predicted ahead of home, but not by the hysteresis (at most OFL_COST_WINDOW
 * times in a row, its ratios and home's kept); else the tie ofl_plan_untried finds, whose start
 * forgets its old ratios and all of home's but the last. So a probe is judged beside home's steps
 * just around it: the median of home's step before it and those after it (costplan.c: why); what it
 * measured there is added to its levels, and ratio (out, [n + 1]) is made from hist: at the first
 * call by ofl_plan_ratios, then by ofl_plan_ratios_paired. After a move, the home left is the next
 * probe (OFL_PLAN_VERIFY). */
#define OFL_PLAN_BACK 2
/* A probe is taken (made home) only once it has been measured OFL_PLAN_TAKE_AFTER times: ahead by
 * the hysteresis after one step, it is probed again. Why: one step varies by 3-4 % on the 2-core
 * VM, and with seven plans tied on NVMe, a probe 2.7 % slower than home measured 2 % ahead once in
 * about ten probes and was taken; auto then ran it until a re-probe brought the better plan back
 * (in a 46-step run, 10 to 20 steps on the slower plan). */
#define OFL_PLAN_TAKE_AFTER 2
/* After auto moves home, the home it left is the next probe when predicted within OFL_PLAN_VERIFY of
 * the new one: a move is made on the probe's steps that measured it ahead by the hysteresis, and among
 * seven plans tied on NVMe, some probe measures ahead by noise (the winner's curse); measured again
 * beside the new home, the one left comes back when it is the faster. On NVMe at 2x / 64 GB/s auto
 * started on all-device, the best fixed policy there (4 % ahead), and walked through every-2 and
 * every-3 to every-4, each move on a probe measured 2-3 % ahead, and stayed there (1.041). */
#define OFL_PLAN_VERIFY 0.10
void ofl_plan_next(struct ofl_plan_auto *a, const struct ofl_plan_sg *sg, uint32_t n, struct ofl_cost_hist *hist,
                   double *ratio, const unsigned char *tried, uint64_t now, struct ofl_plan_choice *best_fixed);

#endif
