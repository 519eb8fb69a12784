/*
 * test_offload_cost.c — the cost model that learns (src/offload/costlearn.c) and auto's planner
 * (src/offload/costplan.c).
 *
 * Why a virtual clock: the model learns from measured times, and a test that measured wall time on
 * a shared machine would pass or fail with the load. The emulated device's clock=virtual
 * (MEMWALL_EMU, accel_emu.c) makes each of its jobs take exactly its modelled time, whatever the
 * machine does, so "the error falls under 10 % within 5 steps" is checked on the real engine, its
 * real pipeline and the real device table, deterministically.
 *
 * What is checked:
 *   1. convergence: a profile that thinks the device 4x faster (and its link 4x faster) than the
 *      emulated device is; the first steps' prediction is off by about 75 %, and by step 5 the
 *      corrected prediction is within 10 % and stays there (here, exact: the clock is exact);
 *   1b. the report of that run's trace (memwall report: cost spans) has the engine's figures, per
 *      step and after learning;
 *   1c. the calibrated profile comes from the file MEMWALL_OFFLOAD_PROFILE names (unless the caller
 *      fixed its own), and a bad file fails the init naming it;
 *   2. the planner's choices over a grid of devices (0.25x..8x the CPU, links 1..64 GB/s, state in
 *      DRAM and on NVMe): auto's plan is never predicted slower than any fixed policy, a fixed plan
 *      it picks is the fastest fixed one, and the extremes go where they must (choices, not times);
 *   3. the schedule the planner simulates, by hand, on a case small enough to draw;
 *   4. hysteresis: a 1 % change keeps the plan, a plan twice as slow is left; plan ratios (a split
 *      measured 1.5x its simulation) turn the choice back to a side alone; a split must be ahead of
 *      the best fixed policy by the margin (1.6 % is not enough, 6 % is), and a plan never run is
 *      given the largest ratio measured (so a disk-bound tie stays all-cpu); tied plans are probed
 *      when never run, and re-measured when their ratio is old, one at a time; a probe runs one
 *      step and auto goes home, judging it beside home's steps around it: slow first steps or a
 *      burst on one of home's steps do not keep auto on a probe 10 % slower, a probe 10 % faster
 *      is taken, one 4 % faster measured within the hysteresis is probed again and taken;
 *   5. the engine: auto told by its profile that the device is fast, on a device 10^5x
 *      slower (virtual clock), moves everything to the CPU once it has measured, and stays there.
 */
#include "memwall/common.h"
#include "memwall/offload.h"
#include "memwall/report.h"
#include "memwall/trace.h"
#include "offload/cost.h"
#include "offload_util.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NSG 8
#define SG 65536

static struct mw_offload *open_engine(const struct mw_offload_registry *r, enum mw_offload_policy pol,
                                      const struct mw_offload_profile *p, struct mw_trace *tr)
{
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = SG;
    c.use_device = 1;
    c.policy = pol;
    c.profile = *p;
    c.profile_fixed = 1;
    c.trace = tr;
    struct mw_offload *e = NULL;
    int rc = mw_offload_init(&e, r, &c);
    CHECK_MSG(rc == 0, "init: %s", mw_error_msg());
    return e;
}

static int step(struct mw_offload *e, int s, float *g, uint64_t n, struct mw_offload_stats *st)
{
    struct mw_offload_hparams hp;
    ou_hparams(&hp, s);
    ou_grads(g, n, s, 0);
    mw_offload_stats_reset(e);
    int rc = mw_offload_backward_begin(e, 1, NULL);
    if (!rc) rc = mw_offload_grad_add(e, 0, n, g);
    if (!rc) rc = mw_offload_backward_end(e);
    if (!rc) rc = mw_offload_step(e, &hp);
    mw_offload_stats_get(e, st);
    return rc;
}

/* The report of the convergence run's trace (analyze_cost.c): the same figures as the engine's. */
static void report_of(const char *path, const struct mw_offload_cost *c, const double *pred, const double *meas)
{
    struct mw_report *rp;
    int rc = mw_report_load(&rp, path, NULL);
    CHECK_MSG(rc == 0, "report: %s", mw_error_msg());
    if (rc) return;
    const struct mw_report_cost *k = &rp->cost;
    CHECK_EQ_INT(k->nsteps, 10);
    CHECK_EQ_INT(k->late_steps, 10 - MW_REPORT_COST_LEARN_STEPS);
    for (int i = 0; i < k->nsteps && i < 10; i++) { /* per step: the update's components = the decisions' sums */
        double p = 0, m = 0;
        for (int j = 0; j < MW_REPORT_COST_NCOMP; j++)
            if (mw_report_cost_is_update(j)) { p += k->steps[i].predicted_s[j]; m += k->steps[i].measured_s[j]; }
        CHECK_EQ_INT(k->steps[i].step, i + 1);
        CHECK_MSG(fabs(p - pred[i + 1]) < 1e-6 && fabs(m - meas[i + 1]) < 1e-6, "report step %d: %.6f/%.6f, engine %.6f/%.6f",
                  i + 1, p, m, pred[i + 1], meas[i + 1]);
    }
    for (int j = 0; j < MW_REPORT_COST_NCOMP; j++) {
        CHECK_MSG(!strcmp(mw_report_cost_name(j), c->name[j]), "component %d: %s vs %s", j, mw_report_cost_name(j), c->name[j]);
        CHECK_EQ_INT(k->n[j], c->n[j]);
        CHECK(fabs(k->late_predicted_s[j] - c->late_predicted_s[j]) < 1e-6);
        CHECK(fabs(k->late_measured_s[j] - c->late_measured_s[j]) < 1e-6);
    }
    mw_report_free(rp);
}

static void convergence(const struct mw_offload_registry *r, float *g, uint64_t n, const char *dir)
{
    struct mw_offload_profile p;
    mw_offload_profile_default(&p);
    p.dev_params_per_s = 1e9;
    p.link_bytes_per_s = 8e9;
    p.dev_latency_s = 0;
    /* the injected slowdown: the device computes and copies 4x slower than the profile says */
    setenv("MEMWALL_EMU", "rate=2.5e8,link=2e9,clock=virtual", 1);
    struct mw_trace *tr = NULL;
    REQUIRE(mw_trace_init(&tr, 0) == 0);
    struct mw_offload *e = open_engine(r, MW_OFFLOAD_POLICY_ALL_DEVICE, &p, tr);
    if (!e) { mw_trace_free(tr); return; }
    double err[12], pred[12], meas[12];
    int under = 0; /* the first step from which every error is under 10 % */
    for (int s = 1; s <= 10; s++) {
        struct mw_offload_stats st;
        REQUIRE(step(e, s, g, n, &st) == 0);
        CHECK_EQ_INT(st.dev_updates, NSG);
        REQUIRE(st.measured_s > 0);
        err[s] = (st.predicted_s - st.measured_s) / st.measured_s;
        pred[s] = st.predicted_s;
        meas[s] = st.measured_s;
        printf("step %2d: predicted %.6f s, measured %.6f s, error %+.2f %%\n", s, st.predicted_s, st.measured_s,
               100 * err[s]);
        if (fabs(err[s]) >= 0.10) under = 0;
        else if (!under) under = s;
    }
    /* the profile alone: the device's times predicted 4x too short */
    CHECK_MSG(err[1] < -0.70 && err[1] > -0.80, "step 1 error %+.3f, want about -75 %%", err[1]);
    CHECK_MSG(under >= 1 && under <= 5, "the error stays under 10 %% only from step %d (want <= 5)", under);
    /* with an exact clock the corrected model is exact once it has learned */
    for (int s = 3; s <= 10; s++) CHECK_MSG(fabs(err[s]) < 1e-3, "step %d error %+.2e", s, err[s]);
    struct mw_offload_cost c;
    mw_offload_cost_get(e, &c);
    CHECK_EQ_INT(c.steps, 10);
    for (int i = 0; i < MW_OFFLOAD_COST_NCOMP; i++) {
        int dev = !strcmp(c.name[i], "h2d") || !strcmp(c.name[i], "device") || !strcmp(c.name[i], "d2h");
        if (dev) CHECK_MSG(fabs(c.factor[i] - 4) < 1e-3, "%s factor %.4f, want 4", c.name[i], c.factor[i]);
        else CHECK_MSG(c.n[i] == 0, "%s observed %llu times on an all-device DRAM run", c.name[i],
                       (unsigned long long)c.n[i]);
        if (dev) /* after learning (steps 6..10): predicted = measured */
            CHECK_MSG(c.late_measured_s[i] > 0 && fabs(c.late_predicted_s[i] / c.late_measured_s[i] - 1) < 1e-3,
                      "%s after learning: %.6f vs %.6f", c.name[i], c.late_predicted_s[i], c.late_measured_s[i]);
    }
    mw_offload_free(e);
    unsetenv("MEMWALL_EMU");
    char path[512];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    REQUIRE(mw_trace_write(tr, path) == 0);
    mw_trace_free(tr);
    report_of(path, &c, pred, meas);
}

/* The calibrated profile from a file (MEMWALL_OFFLOAD_PROFILE, as `memwall bench offload --calibrate`
 * writes it): an engine without profile_fixed predicts from it at once (the first step exact on the
 * virtual clock), one with profile_fixed keeps the profile it was given (off by -75 %). */
static void profile_file(const struct mw_offload_registry *r, float *g, uint64_t n, const char *dir)
{
    struct mw_offload_profile p, wrong;
    mw_offload_profile_default(&p);
    p.dev_params_per_s = 2.5e8; /* what the emulated device below does */
    p.link_bytes_per_s = 2e9;
    p.dev_latency_s = 0;
    wrong = p;
    wrong.dev_params_per_s = 1e9;
    wrong.link_bytes_per_s = 8e9;
    char path[512];
    snprintf(path, sizeof path, "%s/profile.json", dir);
    REQUIRE(mw_offload_profile_save(path, &p) == 0);
    setenv("MEMWALL_EMU", "rate=2.5e8,link=2e9,clock=virtual", 1);
    setenv("MEMWALL_OFFLOAD_PROFILE", path, 1);
    for (int fixed = 0; fixed < 2; fixed++) {
        struct mw_offload_config c;
        mw_offload_config_default(&c);
        c.subgroup_size = SG;
        c.use_device = 1;
        c.policy = MW_OFFLOAD_POLICY_ALL_DEVICE;
        c.profile = wrong;
        c.profile_fixed = fixed;
        struct mw_offload *e = NULL;
        REQUIRE(mw_offload_init(&e, r, &c) == 0);
        struct mw_offload_stats st;
        REQUIRE(step(e, 1, g, n, &st) == 0 && st.measured_s > 0);
        double err = (st.predicted_s - st.measured_s) / st.measured_s;
        if (fixed) CHECK_MSG(err < -0.70, "profile_fixed: step 1 error %+.3f, want the given profile's -75 %%", err);
        else CHECK_MSG(fabs(err) < 1e-3, "MEMWALL_OFFLOAD_PROFILE: step 1 error %+.3f, want 0", err);
        mw_offload_free(e);
    }
    /* a profile file that is not one: init fails, naming the variable */
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("[1, 2]", f);
    fclose(f);
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = SG;
    struct mw_offload *e = NULL;
    CHECK(mw_offload_init(&e, r, &c) != 0 && strstr(mw_error_msg(), "MEMWALL_OFFLOAD_PROFILE"));
    mw_offload_free(e);
    unsetenv("MEMWALL_OFFLOAD_PROFILE");
    unsetenv("MEMWALL_EMU");
}

/* A model whose profile is the cell's device; the plan's inputs for n subgroups of SGN elements. */
#define GRID_N 16
#define SGN ((uint64_t)4 << 20)
static void grid_sgs(double speed, double link, int nvme, struct ofl_plan_sg *sg)
{
    struct mw_offload_profile p;
    mw_offload_profile_default(&p);
    p.cpu_params_per_s = 1e9;
    p.dev_params_per_s = speed * p.cpu_params_per_s;
    p.link_bytes_per_s = link;
    p.nvme_read_bytes_per_s = p.nvme_write_bytes_per_s = 2e9;
    struct ofl_cost c;
    ofl_cost_init(&c, &p);
    for (int i = 0; i < GRID_N; i++) {
        double n = (double)SGN, state = 12 * n; /* fp32 master and moments */
        sg[i] = (struct ofl_plan_sg){nvme ? ofl_cost_predict(&c, OFL_COST_READ, OFL_CTX_QUIET, state) : 0,
                                     nvme ? ofl_cost_predict(&c, OFL_COST_WRITE, OFL_CTX_QUIET, state) : 0,
                                     ofl_cost_predict(&c, OFL_COST_CPU, OFL_CTX_QUIET, n),
                                     ofl_cost_predict(&c, OFL_COST_H2D, OFL_CTX_QUIET, state + 4 * n),
                                     ofl_cost_predict(&c, OFL_COST_DEV, OFL_CTX_QUIET, n),
                                     ofl_cost_predict(&c, OFL_COST_D2H, OFL_CTX_QUIET, state)};
    }
}

static void planner_grid(void)
{
    static const double speeds[] = {0.25, 0.5, 1, 2, 4, 8}, links[] = {1e9, 4e9, 16e9, 64e9};
    struct ofl_plan_sg sg[GRID_N];
    int dev_picked = 0, cpu_picked = 0, split_picked = 0;
    for (int nv = 0; nv < 2; nv++)
        for (size_t a = 0; a < sizeof speeds / sizeof *speeds; a++)
            for (size_t b = 0; b < sizeof links / sizeof *links; b++) {
                grid_sgs(speeds[a], links[b], nv, sg);
                struct ofl_plan_choice best, fixed;
                ofl_plan_best(sg, GRID_N, NULL, &best, &fixed);
                char cell[96];
                snprintf(cell, sizeof cell, "device %.2fx, link %.0f GB/s, state in %s", speeds[a], links[b] / 1e9,
                         nv ? "nvme" : "dram");
                /* never a plan it knows is slower than a fixed policy */
                struct ofl_plan_choice f[2 + OFL_PLAN_MAXK - 1];
                int nf = 0;
                f[nf++] = (struct ofl_plan_choice){MW_OFFLOAD_POLICY_ALL_CPU, 0, 0, 0};
                f[nf++] = (struct ofl_plan_choice){MW_OFFLOAD_POLICY_ALL_DEVICE, 0, GRID_N, 0};
                for (int k = 2; k <= OFL_PLAN_MAXK; k++) f[nf++] = (struct ofl_plan_choice){MW_OFFLOAD_POLICY_EVERY_K, k, 0, 0};
                double fmin = INFINITY;
                for (int i = 0; i < nf; i++) {
                    double t = ofl_plan_simulate(sg, GRID_N, &f[i]);
                    CHECK_MSG(best.predicted_s <= t, "%s: auto's plan %.4f s is slower than fixed %s/%d at %.4f s", cell,
                              best.predicted_s, mw_offload_policy_name((enum mw_offload_policy)f[i].kind), f[i].k, t);
                    fmin = fmin < t ? fmin : t;
                }
                CHECK_MSG(fabs(fixed.predicted_s - fmin) <= 1e-12 * fmin, "%s: best fixed %.6f, the fixed minimum %.6f",
                          cell, fixed.predicted_s, fmin);
                if (best.kind >= 0) /* a fixed plan: the fastest fixed one */
                    CHECK_MSG(best.predicted_s == fixed.predicted_s, "%s: picked fixed %.6f, fastest fixed %.6f", cell,
                              best.predicted_s, fixed.predicted_s);
                CHECK(fabs(ofl_plan_simulate(sg, GRID_N, &best) - best.predicted_s) <= 1e-12 * best.predicted_s);
                uint32_t nd = 0;
                for (uint32_t i = 0; i < GRID_N; i++) nd += (uint32_t)ofl_plan_on_device(&best, i, GRID_N);
                CHECK_EQ_INT(nd, best.ndev);
                dev_picked += nd == GRID_N;
                cpu_picked += nd == 0;
                split_picked += nd > 0 && nd < GRID_N;
                /* the extremes: a device 4x slower behind a 1 GB/s link gets nothing; one 8x faster
                 * behind 64 GB/s gets most of the DRAM-resident work */
                if (speeds[a] == 0.25 && links[b] == 1e9) CHECK_MSG(nd == 0, "%s: %u subgroups on the device", cell, nd);
                if (speeds[a] == 8 && links[b] == 64e9 && !nv)
                    CHECK_MSG(nd > GRID_N / 2, "%s: only %u subgroups on the device", cell, nd);
            }
    printf("planner grid: %d cells all-cpu, %d all-device, %d split\n", cpu_picked, dev_picked, split_picked);
    CHECK(cpu_picked > 0 && split_picked > 0); /* the grid spans both sides of the boundary */
}

/* By hand: two device jobs of h2d = dev = d2h = 1 s, state in DRAM. Job 0: in [0,1], kernel [1,2];
 * job 1 (the other slot): in [1,2], kernel [2,3]; job 0 out [2,3] (its kernel ended at 2, the link
 * freed at 2); job 1 out [3,4]. The step: 4 s. Two CPU updates of 1.5 s: 3 s. every-2 (job 1 on the
 * device, 0 on the CPU): max(1.5, 3) = 3 s. With reads of 1 s and writes of 0.5 s on the disk, all-cpu:
 * read 0 [0,1], update [1,2.5], read 1 [1,2], update [2.5,4], its write [4,4.5]; the disk's busy time,
 * 3 s, is less: 4.5 s. */
static void planner_by_hand(void)
{
    struct ofl_plan_sg sg[2] = {{0, 0, 1.5, 1, 1, 1}, {0, 0, 1.5, 1, 1, 1}};
    struct ofl_plan_choice dev = {MW_OFFLOAD_POLICY_ALL_DEVICE, 0, 2, 0}, cpu = {MW_OFFLOAD_POLICY_ALL_CPU, 0, 0, 0},
                           e2 = {MW_OFFLOAD_POLICY_EVERY_K, 2, 1, 0};
    CHECK(fabs(ofl_plan_simulate(sg, 2, &dev) - 4) < 1e-12);
    CHECK(fabs(ofl_plan_simulate(sg, 2, &cpu) - 3) < 1e-12);
    CHECK(fabs(ofl_plan_simulate(sg, 2, &e2) - 3) < 1e-12);
    for (int i = 0; i < 2; i++) { sg[i].read = 1; sg[i].write = 0.5; }
    CHECK(fabs(ofl_plan_simulate(sg, 2, &cpu) - 4.5) < 1e-12);
    /* a split of d of n spreads them: 3 of 8 are 2, 5, 7 (floor((i+1)3/8) steps up there) */
    struct ofl_plan_choice sp = {-1, 0, 3, 0};
    int want[8] = {0, 0, 1, 0, 0, 1, 0, 1};
    for (uint32_t i = 0; i < 8; i++) CHECK_EQ_INT(ofl_plan_on_device(&sp, i, 8), want[i]);
}

static void hysteresis(void)
{
    struct ofl_plan_sg sg[GRID_N];
    grid_sgs(2, 64e9, 0, sg);
    struct ofl_plan_choice best, bf;
    ofl_plan_best(sg, GRID_N, NULL, &best, &bf);
    /* a split clear of the margin over the fixed policies (cost.h), so that only hysteresis decides */
    REQUIRE(best.kind < 0 && best.predicted_s < bf.predicted_s * (1 - OFL_PLAN_SPLIT_MARGIN - 0.02));
    /* the model moves by 1 % in the device's favour: the plan stays */
    for (int i = 0; i < GRID_N; i++) { sg[i].dev *= 0.99; sg[i].h2d *= 0.99; sg[i].d2h *= 0.99; }
    struct ofl_plan_choice again;
    ofl_plan_best(sg, GRID_N, NULL, &again, NULL);
    CHECK(!ofl_plan_switch(sg, GRID_N, NULL, &best, &again));
    /* all-device when the device has become 10x slower: left for the new best */
    struct ofl_plan_choice all_dev = {MW_OFFLOAD_POLICY_ALL_DEVICE, 0, GRID_N, 0};
    for (int i = 0; i < GRID_N; i++) sg[i].dev *= 10;
    ofl_plan_best(sg, GRID_N, NULL, &again, NULL);
    CHECK(ofl_plan_switch(sg, GRID_N, NULL, &all_dev, &again));
    CHECK(!ofl_plan_switch(sg, GRID_N, NULL, &again, &again));
}

/* Plan ratios (measured / simulated steps, by the number of subgroups on the device): a split that ran
 * 50 % slower than simulated is no longer chosen over the sides alone; the one split measured as
 * simulated still is. */
static void plan_ratios(void)
{
    struct ofl_plan_sg sg[GRID_N];
    grid_sgs(1, 64e9, 0, sg); /* a device as fast as the CPU behind a fast link: a split wins */
    struct ofl_plan_choice best;
    ofl_plan_best(sg, GRID_N, NULL, &best, NULL);
    REQUIRE(best.ndev > 0 && best.ndev < GRID_N);
    double ratio[GRID_N + 1];
    for (int d = 0; d <= GRID_N; d++) ratio[d] = d == 0 || d == GRID_N ? 1 : 1.5;
    struct ofl_plan_choice r;
    ofl_plan_best(sg, GRID_N, ratio, &r, NULL);
    struct ofl_plan_choice cpu = {MW_OFFLOAD_POLICY_ALL_CPU, 0, 0, 0}, dev = {MW_OFFLOAD_POLICY_ALL_DEVICE, 0, GRID_N, 0};
    double tc = ofl_plan_simulate(sg, GRID_N, &cpu), td = ofl_plan_simulate(sg, GRID_N, &dev);
    int hybrid_wins = 0;
    for (int d = 1; d < GRID_N; d++) {
        struct ofl_plan_choice x = {-1, 0, (uint32_t)d, 0};
        hybrid_wins += 1.5 * ofl_plan_simulate(sg, GRID_N, &x) < (tc < td ? tc : td);
    }
    if (!hybrid_wins) { /* then only a side alone may be chosen, the faster */
        CHECK_MSG(r.ndev == 0 || r.ndev == GRID_N, "a split (%u) chosen though every split is 1.5x its simulation", r.ndev);
        CHECK(fabs(r.predicted_s - (tc < td ? tc : td)) <= 1e-12 * r.predicted_s);
    }
    CHECK(r.predicted_s >= best.predicted_s);
    ratio[best.ndev] = 1; /* the split measured as simulated */
    ofl_plan_best(sg, GRID_N, ratio, &r, NULL);
    CHECK_EQ_INT(r.ndev, best.ndev);
    CHECK(fabs(r.predicted_s - best.predicted_s) <= 1e-12 * best.predicted_s);
}

static void engine_auto(const struct mw_offload_registry *r, float *g, uint64_t n)
{
    struct mw_offload_profile p;
    mw_offload_profile_default(&p);
    p.cpu_params_per_s = 1e8;     /* the CPU, a little slower than it is (learned from step 3 on) */
    p.dev_params_per_s = 1e12;    /* the device, as the profile says: far faster */
    p.link_bytes_per_s = 1e12;
    p.dev_latency_s = 0;
    setenv("MEMWALL_EMU", "rate=1e4,link=1e6,clock=virtual", 1); /* as it is: 8 s per subgroup (virtual) */
    struct mw_offload *e = open_engine(r, MW_OFFLOAD_POLICY_AUTO, &p, NULL);
    if (!e) return;
    uint64_t dev[9] = {0};
    for (int s = 1; s <= 8; s++) {
        struct mw_offload_stats st;
        REQUIRE(step(e, s, g, n, &st) == 0);
        dev[s] = st.dev_updates;
    }
    /* steps 1-2 from the profile (step 1 is not learned from): all on the device; then measured */
    CHECK_EQ_INT(dev[1], NSG);
    CHECK_EQ_INT(dev[2], NSG);
    for (int s = 3; s <= 8; s++) CHECK_MSG(dev[s] == 0, "step %d: %llu updates on the device it knows is slower", s,
                                           (unsigned long long)dev[s]);
    struct mw_offload_cost c;
    mw_offload_cost_get(e, &c);
    CHECK_EQ_INT(c.plan_switches, 1); /* once, and no flapping back */
    CHECK_EQ_INT(c.plan_device_subgroups, 0);
    CHECK(c.plan_predicted_s > 0 && c.plan_predicted_s <= c.best_fixed_predicted_s);

    /* mw_offload_set_policy between steps: a fixed policy runs (auto no longer re-plans), then auto
     * again, from what it had learned; not during a step, not every-0 */
    struct mw_offload_stats st;
    CHECK(mw_offload_set_policy(e, MW_OFFLOAD_POLICY_EVERY_K, 0) == -EINVAL);
    REQUIRE(mw_offload_set_policy(e, MW_OFFLOAD_POLICY_EVERY_K, 2) == 0);
    REQUIRE(step(e, 9, g, n, &st) == 0);
    CHECK_EQ_INT(st.dev_updates, NSG / 2);
    REQUIRE(mw_offload_set_policy(e, MW_OFFLOAD_POLICY_ALL_DEVICE, 0) == 0);
    REQUIRE(step(e, 10, g, n, &st) == 0);
    CHECK_EQ_INT(st.dev_updates, NSG);
    mw_offload_cost_get(e, &c);
    CHECK_EQ_INT(c.plan_switches, 1); /* a fixed policy set: auto's plan not touched */
    REQUIRE(mw_offload_set_policy(e, MW_OFFLOAD_POLICY_AUTO, 0) == 0);
    REQUIRE(step(e, 11, g, n, &st) == 0);
    CHECK_EQ_INT(st.dev_updates, 0); /* auto's plan: the device it measured slower gets nothing */
    REQUIRE(mw_offload_backward_begin(e, 1, NULL) == 0);
    CHECK(mw_offload_set_policy(e, MW_OFFLOAD_POLICY_ALL_CPU, 0) == -EBUSY);
    REQUIRE(mw_offload_backward_end(e) == 0);
    mw_offload_free(e);
    e = open_engine(r, MW_OFFLOAD_POLICY_ALL_CPU, &p, NULL); /* made without auto: no plan to run */
    if (e) {
        CHECK(mw_offload_set_policy(e, MW_OFFLOAD_POLICY_AUTO, 0) == -EINVAL);
        CHECK(mw_offload_set_policy(e, MW_OFFLOAD_POLICY_ALL_DEVICE, 0) == 0);
        mw_offload_free(e);
    }
    unsetenv("MEMWALL_EMU");
}

/* The split margin (cost.h, OFL_PLAN_SPLIT_MARGIN): 16 subgroups of 1 s on either side, no copies (state
 * in DRAM); every plan's ratio 1.2 but one split's. every-2 is then 8 s x 1.2 = 9.6 s, the split of 7
 * on the device 9 s x its ratio: at 1.05 (9.45 s, 1.6 % ahead) every-2 stays the plan, at 1.0 (9 s,
 * 6 % ahead) the split is taken. And the ratios of plans never run (ofl_plan_ratios): the largest
 * measured, at least 1, so an untried split never looks ahead of all-cpu by all-cpu's own error. */
static void split_margin(void)
{
    struct ofl_plan_sg sg[GRID_N];
    for (int i = 0; i < GRID_N; i++) sg[i] = (struct ofl_plan_sg){0, 0, 1, 0, 1, 0};
    double ratio[GRID_N + 1];
    for (int d = 0; d <= GRID_N; d++) ratio[d] = 1.2;
    struct ofl_plan_choice best, bf;
    ratio[7] = 1.05;
    ofl_plan_best(sg, GRID_N, ratio, &best, &bf);
    CHECK_MSG(best.kind == MW_OFFLOAD_POLICY_EVERY_K && best.k == 2, "a split 1.6 %% ahead taken: kind %d, %u on the device",
              best.kind, best.ndev);
    CHECK(fabs(best.predicted_s - 9.6) < 1e-9 && fabs(bf.predicted_s - 9.6) < 1e-9);
    ratio[7] = 1.0;
    ofl_plan_best(sg, GRID_N, ratio, &best, &bf);
    CHECK_MSG(best.kind < 0 && best.ndev == 7, "a split 6 %% ahead not taken: kind %d, %u on the device", best.kind,
              best.ndev);
    CHECK(fabs(best.predicted_s - 9.0) < 1e-9 && fabs(bf.predicted_s - 9.6) < 1e-9);

    struct ofl_cost_hist h[GRID_N + 1];
    memset(h, 0, sizeof h);
    ofl_plan_ratios(h, GRID_N, ratio);
    for (int d = 0; d <= GRID_N; d++) CHECK(ratio[d] == 1); /* nothing measured: the simulation as it is */
    ofl_cost_hist_add(&h[0], 1.08); /* all-cpu ran 8 % over its simulation */
    ofl_plan_ratios(h, GRID_N, ratio);
    for (int d = 0; d <= GRID_N; d++) CHECK(fabs(ratio[d] - 1.08) < 1e-12);
    ofl_cost_hist_add(&h[4], 1.3); /* between two measured counts: the line; beyond the last: its own */
    ofl_plan_ratios(h, GRID_N, ratio);
    CHECK(fabs(ratio[0] - 1.08) < 1e-12 && fabs(ratio[4] - 1.3) < 1e-12 && fabs(ratio[7] - 1.3) < 1e-12 &&
          fabs(ratio[GRID_N] - 1.3) < 1e-12);
    CHECK(fabs(ratio[1] - 1.135) < 1e-12 && fabs(ratio[3] - 1.245) < 1e-12);
    ofl_cost_hist_add(&h[12], 0.9); /* 4 .. 12: 1.3 down to 0.9 */
    ofl_plan_ratios(h, GRID_N, ratio);
    CHECK(fabs(ratio[6] - 1.2) < 1e-12 && fabs(ratio[8] - 1.1) < 1e-12 && fabs(ratio[11] - 0.95) < 1e-12 &&
          fabs(ratio[GRID_N] - 0.9) < 1e-12 && fabs(ratio[2] - 1.19) < 1e-12);
    memset(h, 0, sizeof h);
    ofl_cost_hist_add(&h[5], 0.9); /* only one measured, faster than simulated: every count takes it */
    ofl_plan_ratios(h, GRID_N, ratio);
    for (int d = 0; d <= GRID_N; d++) CHECK(fabs(ratio[d] - 0.9) < 1e-12);
    /* with all-cpu at 1.08 and nothing else run, the model's tie stays a tie: all-cpu, not a split */
    for (int i = 0; i < GRID_N; i++) sg[i] = (struct ofl_plan_sg){1, 1, 0.5, 0.1, 0.5, 0.1}; /* disk-bound */
    memset(h, 0, sizeof h);
    ofl_cost_hist_add(&h[0], 1.08);
    ofl_plan_ratios(h, GRID_N, ratio);
    ofl_plan_best(sg, GRID_N, ratio, &best, NULL);
    CHECK_MSG(best.kind == MW_OFFLOAD_POLICY_ALL_CPU, "disk-bound tie: kind %d, %u on the device", best.kind, best.ndev);
}

/* Ties re-measured (ofl_plan_untried, OFL_PLAN_REPROBE): with the state on NVMe every fixed policy
 * waits for the same disk. A plan never run is probed first, at any step; one run long ago (its ratio
 * older than OFL_PLAN_REPROBE steps) only at a multiple of OFL_PLAN_REPROBE, the one measured longest
 * ago, not when its ratio is recent, and whatever that old ratio says (the simulation ties it). */
static void reprobe(void)
{
    struct ofl_plan_sg sg[GRID_N];
    for (int i = 0; i < GRID_N; i++) sg[i] = (struct ofl_plan_sg){1, 1, 0.5, 0.1, 0.5, 0.1}; /* disk-bound */
    double ratio[GRID_N + 1];
    struct ofl_cost_hist h[GRID_N + 1];
    unsigned char tried[GRID_N + 1];
    memset(h, 0, sizeof h);
    memset(tried, 0, sizeof tried);
    static const uint32_t fixed_ndev[] = {0, GRID_N, 8, 5, 4, 3, 2}; /* all-cpu, all-device, every-2..8 */
    for (size_t i = 0; i < sizeof fixed_ndev / sizeof *fixed_ndev; i++) {
        ofl_cost_hist_add(&h[fixed_ndev[i]], 1.0);
        h[fixed_ndev[i]].at = 0;
        tried[fixed_ndev[i]] = 1;
    }
    ofl_plan_ratios(h, GRID_N, ratio);
    struct ofl_plan_choice best, probe;
    ofl_plan_best(sg, GRID_N, ratio, &best, NULL);
    REQUIRE(best.kind == MW_OFFLOAD_POLICY_ALL_CPU);
    const uint64_t R = OFL_PLAN_REPROBE, at = 4 * R; /* the step asked about */
    for (size_t i = 0; i < sizeof fixed_ndev / sizeof *fixed_ndev; i++) h[fixed_ndev[i]].at = at - 2 * R;
    CHECK(!ofl_plan_untried(sg, GRID_N, ratio, tried, h, at + 3, &best, &probe));  /* not a multiple */
    CHECK(!ofl_plan_untried(sg, GRID_N, ratio, tried, h, at - R, &best, &probe));  /* not older */
    CHECK(!ofl_plan_untried(sg, GRID_N, ratio, tried, NULL, at, &best, &probe));
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, h, at, &best, &probe));
    CHECK_MSG(probe.kind == MW_OFFLOAD_POLICY_ALL_DEVICE, "re-probed kind %d, %u on the device", probe.kind, probe.ndev);
    h[GRID_N].at = at - R / 2; /* all-device measured lately: the next tie in the candidates' order */
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, h, at, &best, &probe));
    CHECK(probe.kind == MW_OFFLOAD_POLICY_EVERY_K && probe.k == 2);
    h[8].at = at - R - 1; /* every-2 measured after the rest: they come first, every-3 (5) now */
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, h, at, &best, &probe));
    CHECK(probe.kind == MW_OFFLOAD_POLICY_EVERY_K && probe.k == 3);
    h[4].at = at - 3 * R; /* every-4 measured longest ago: before every-3 */
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, h, at, &best, &probe));
    CHECK(probe.kind == MW_OFFLOAD_POLICY_EVERY_K && probe.k == 4);
    /* an old ratio that makes it look 20 % slower does not keep a plan the simulation ties from it */
    ofl_cost_hist_add(&h[4], 1.2);
    ofl_cost_hist_add(&h[4], 1.2);
    ofl_plan_ratios(h, GRID_N, ratio);
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, h, at, &best, &probe));
    CHECK(probe.kind == MW_OFFLOAD_POLICY_EVERY_K && probe.k == 4);
    tried[5] = 0; /* every-3 never ran: probed at once, before any re-measurement */
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, h, at + 1, &best, &probe));
    CHECK(probe.kind == MW_OFFLOAD_POLICY_EVERY_K && probe.k == 3);
}

/* A local search (ofl_plan_untried, OFL_PLAN_EXPLORE): 16 subgroups of 1 s on either side, no copies,
 * so a plan of d on the device simulates max(16 - d, d) s; home every-2 (8 s). Its neighbours among
 * the fixed policies are every-3 (5 subgroups) and all-device (16). every-3, never run, predicted 20 %
 * slower, is probed; predicted 30 % slower it is not. every-4 (4 subgroups, not a neighbour) is not
 * probed 20 % slower, but is 2.5 % slower: a tie (OFL_PLAN_TIE), probed wherever it lies. */
static void explore(void)
{
    struct ofl_plan_sg sg[GRID_N];
    for (int i = 0; i < GRID_N; i++) sg[i] = (struct ofl_plan_sg){0, 0, 1, 0, 1, 0};
    double ratio[GRID_N + 1];
    unsigned char tried[GRID_N + 1];
    for (int d = 0; d <= GRID_N; d++) ratio[d] = 10; /* far behind */
    memset(tried, 0, sizeof tried);
    struct ofl_plan_choice home = {MW_OFFLOAD_POLICY_EVERY_K, 2, 8, 0}, probe;
    ratio[8] = 1;
    tried[8] = 1;
    home.predicted_s = ofl_plan_predict(sg, GRID_N, ratio, &home);
    REQUIRE(fabs(home.predicted_s - 8) < 1e-9);
    ratio[5] = 1.2 * 8 / 11;
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, NULL, 3, &home, &probe));
    CHECK_MSG(probe.kind == MW_OFFLOAD_POLICY_EVERY_K && probe.k == 3 && probe.ndev == 5, "probe: kind %d k %d, %u",
              probe.kind, probe.k, probe.ndev);
    ratio[5] = 1.3 * 8 / 11;
    CHECK(!ofl_plan_untried(sg, GRID_N, ratio, tried, NULL, 3, &home, &probe));
    ratio[4] = 1.2 * 8 / 12; /* not a neighbour: 20 % is too far */
    CHECK(!ofl_plan_untried(sg, GRID_N, ratio, tried, NULL, 3, &home, &probe));
    ratio[4] = 1.025 * 8 / 12; /* a tie: probed wherever it is */
    REQUIRE(ofl_plan_untried(sg, GRID_N, ratio, tried, NULL, 3, &home, &probe));
    CHECK(probe.kind == MW_OFFLOAD_POLICY_EVERY_K && probe.k == 4);
    tried[4] = 1; /* run: a tie again only at a re-probe, and only when the simulation alone ties */
    CHECK(!ofl_plan_untried(sg, GRID_N, ratio, tried, NULL, 3, &home, &probe));
}

/* The engine's plan loop (policy.c) on a disk-bound tie (every fixed policy simulates the same), with
 * each step's measured / simulated ratio given: truth[d] for a plan with d device subgroups, times
 * load[s] (the machine's other tenants). Learned as policy.c does: not step 1 (cold), then each
 * step's ratio for its number of device subgroups. ndev[s]: step s's device subgroups, home[s] (when
 * not NULL): home after step s (s = 1..PROBE_S). */
#define PROBE_S 45
static void plan_loop(const double *truth, const double *load, uint32_t *ndev, uint32_t *home, uint32_t *switches)
{
    struct ofl_plan_sg sg[GRID_N];
    for (int i = 0; i < GRID_N; i++) sg[i] = (struct ofl_plan_sg){1, 1, 0.5, 0.1, 0.5, 0.1}; /* disk-bound */
    struct ofl_cost_hist h[GRID_N + 1];
    double ratio[GRID_N + 1];
    unsigned char tried[GRID_N + 1];
    memset(h, 0, sizeof h);
    memset(tried, 0, sizeof tried);
    struct ofl_plan_auto a;
    memset(&a, 0, sizeof a);
    ofl_plan_next(&a, sg, GRID_N, h, ratio, tried, 0, NULL); /* ratio: made from h, as in the engine */
    for (uint64_t s = 1; s <= PROBE_S; s++) {
        uint32_t d = a.cur.ndev;
        ndev[s] = d;
        if (s > 1) {
            tried[d] = 1;
            ofl_cost_hist_add(&h[d], truth[d] * load[s]);
            h[d].at = s;
        }
        ofl_plan_next(&a, sg, GRID_N, h, ratio, tried, s, NULL);
        if (home) home[s] = a.home.ndev;
    }
    *switches = a.switches;
}

/* Probes go home (ofl_plan_next, OFL_PLAN_BACK): the plan loop with the machine's `dev` for a plan
 * with device subgroups, 1 for all-cpu. */
static void probe_run(double dev, const double *load, uint32_t *ndev, uint32_t *switches)
{
    double truth[GRID_N + 1];
    for (int d = 0; d <= GRID_N; d++) truth[d] = d ? dev : 1.0;
    plan_loop(truth, load, ndev, NULL, switches);
}

/* Step s's device subgroups against want: home, except the probes listed as {step, device subgroups}
 * (a zero-terminated list). */
static void probe_expect(const char *what, const uint32_t *ndev, uint32_t home_before, int switch_at, uint32_t home,
                         const int (*probes)[2])
{
    for (int s = 1; s <= PROBE_S; s++) {
        uint32_t want = s < switch_at ? home_before : home;
        for (int i = 0; probes[i][0]; i++)
            if (probes[i][0] == s) want = (uint32_t)probes[i][1];
        CHECK_MSG(ndev[s] == want, "%s: step %d ran %u device subgroups, not %u", what, s, ndev[s], want);
    }
}

static void probe_home(void)
{
    _Static_assert(OFL_PLAN_REPROBE == 10, "the steps below are for a re-probe every 10 steps");
    double load[PROBE_S + 1];
    uint32_t ndev[PROBE_S + 1], sw;
    for (int s = 0; s <= PROBE_S; s++) load[s] = 1;
    /* the grid's bad cell: the first steps slow (all-cpu learned 1.3), the probe of all-device
     * measured at 1.1, all-cpu at 1.0 after it. The simulation ties every fixed policy (the disk
     * decides), so each device count never run is probed once, in the candidates' order: all-device
     * (step 3), every-2, -3, -4, -5, -6 (8, 5, 4, 3, 2 subgroups), each measured 1.1; then every 10
     * steps the one measured longest ago (all-device at 21, every-2 at 31, every-3 at 41); auto goes
     * home after each */
    static const int slow_first[][2] = {{3, GRID_N}, {6, 8},       {9, 5},  {12, 4}, {15, 3},
                                        {18, 2},     {21, GRID_N}, {31, 8}, {41, 5}, {0, 0}};
    load[1] = load[2] = 1.3;
    probe_run(1.1, load, ndev, &sw);
    probe_expect("slow first steps", ndev, 0, 0, 0, slow_first);
    CHECK_EQ_INT(sw, 18); /* nine probes, each there and back */
    /* a clean start, and a burst on home's first step after the probe: outvoted by the other two */
    for (int s = 0; s <= PROBE_S; s++) load[s] = 1;
    load[4] = 1.3;
    probe_run(1.1, load, ndev, &sw);
    probe_expect("burst after the probe", ndev, 0, 0, 0, slow_first);
    /* a probe 4 % faster, measured 1 % ahead the first time (within the hysteresis), is probed again
     * (step 6: 2.6 % ahead over both, its level the median of 1 and 2.6: 1.9 %, still within) and a
     * third time (step 9: 2.6 %), and taken (step 12 on); all-cpu, the home it left, is probed next
     * (step 13, OFL_PLAN_VERIFY); then the fixed policies between (every-2, -3, -4, -5, -6: 8, 5, 4,
     * 3, 2 subgroups), never run and tied by the simulation, are each probed once; all-cpu is
     * re-probed at step 31, every-2 at 41 */
    load[3] = 1.03;
    probe_run(0.96, load, ndev, &sw);
    static const int ahead[][2] = {{3, GRID_N}, {6, GRID_N}, {9, GRID_N}, {13, 0}, {16, 8}, {19, 5},
                                   {22, 4},     {25, 3},     {28, 2},     {31, 0}, {41, 8}, {0, 0}};
    probe_expect("probe ahead", ndev, 0, 12, GRID_N, ahead);
    /* a probe that IS faster (0.9) is probed again (step 6: measured once, it is not taken,
     * OFL_PLAN_TAKE_AFTER) and taken after home's steps (step 9 on); all-cpu, left 11 % behind, is
     * not probed back (OFL_PLAN_VERIFY); the other fixed policies are probed once each as above,
     * all-cpu again at 31, every-2 at 41 */
    load[3] = 1;
    load[4] = 1;
    probe_run(0.9, load, ndev, &sw);
    static const int faster[][2] = {{3, GRID_N}, {6, GRID_N}, {10, 8}, {13, 5}, {16, 4},
                                    {19, 3},     {22, 2},     {31, 0}, {41, 8}, {0, 0}};
    probe_expect("faster probe", ndev, 0, 9, GRID_N, faster);
}

/* Paired levels (ofl_plan_ratios_paired): a count's ratio is home's median times the count's level
 * over home's (each measured as a probe's steps over home's around them), not its own old median,
 * which came from another load. By hand, then in the plan loop. */
static void paired_levels(void)
{
    struct ofl_cost_hist h[GRID_N + 1];
    double ratio[GRID_N + 1], plain[GRID_N + 1];
    memset(h, 0, sizeof h);
    for (int i = 0; i < 3; i++) ofl_cost_hist_add(&h[0], 1.3); /* home, now: 1.3 */
    h[0].lvl_n = 1;                                             /* level 0 */
    ofl_cost_hist_add(&h[GRID_N], 1.2);                         /* ran at a quieter time ... */
    h[GRID_N].lv[0] = log(0.95);                                /* ... 5 % ahead of home beside it */
    h[GRID_N].lvl_n = 1;
    ofl_cost_hist_add(&h[8], 1.0); /* as fast as home beside it, its own median from a quiet time */
    h[8].lvl_n = 1;
    ofl_cost_hist_add(&h[4], 0.9); /* no level: its own median */
    ofl_plan_ratios_paired(h, GRID_N, 0, ratio);
    CHECK(fabs(ratio[0] - 1.3) < 1e-12 && fabs(ratio[GRID_N] - 1.235) < 1e-12 && fabs(ratio[8] - 1.3) < 1e-12 &&
          fabs(ratio[4] - 0.9) < 1e-12);
    CHECK(fabs(ratio[12] - 1.2675) < 1e-12 && fabs(ratio[2] - 1.1) < 1e-12 && fabs(ratio[6] - 1.1) < 1e-12);
    h[0].lvl_n = 0; /* home without a level: the plain medians */
    ofl_plan_ratios_paired(h, GRID_N, 0, ratio);
    ofl_plan_ratios(h, GRID_N, plain);
    for (int d = 0; d <= GRID_N; d++) CHECK(ratio[d] == plain[d]);
    CHECK(fabs(plain[GRID_N] - 1.2) < 1e-12 && fabs(plain[8] - 1.0) < 1e-12);

    /* The loop on a disk-bound tie: all-device 5 % faster than all-cpu, every other count as fast as
     * all-cpu; its first probe (step 3) caught by a burst (+10 %). The other fixed policies are probed
     * in the quiet first steps; from step 20 the machine is 30 % slower for good. Their own medians
     * (1.0) then look 23 % ahead of home's (1.3); paired, none is taken, and all-device, re-probed
     * beside home, becomes home. */
    double truth[GRID_N + 1], load[PROBE_S + 1];
    for (int d = 0; d <= GRID_N; d++) truth[d] = d == GRID_N ? 0.95 : 1.0;
    for (int s = 0; s <= PROBE_S; s++) load[s] = s >= 20 ? 1.3 : s == 3 ? 1.1 : 1.0;
    uint32_t home[PROBE_S + 1], ran[PROBE_S + 1], sw;
    plan_loop(truth, load, ran, home, &sw);
    /* the probes in the quiet steps (all-device at 3, in the burst; every-2..-6 after it), all-device
     * re-probed at 21 and run again at 24 (5 % ahead beside home, but its level the median of that and
     * the burst's +4.5 %: within the hysteresis), taken after it (its levels: -5, -5, +4.5 %); all-cpu,
     * left, probed beside it (28); then the re-probes of the oldest ties (every-2 at 31, every-3 at 41) */
    static const int want[][2] = {{3, GRID_N},  {6, 8},       {9, 5},  {12, 4}, {15, 3}, {18, 2},
                                  {21, GRID_N}, {24, GRID_N}, {28, 0}, {31, 8}, {41, 5}, {0, 0}};
    probe_expect("paired levels", ran, 0, 27, GRID_N, want);
    for (int s = 20; s <= PROBE_S; s++) /* never home on a count whose old median looked 23 % ahead */
        CHECK_MSG(home[s] == 0 || home[s] == GRID_N, "step %d: home is %u device subgroups", s, home[s]);
}

int main(void)
{
    struct mw_offload_registry r;
    int64_t sizes[] = {3 * SG, 5 * SG}; /* NSG subgroups, one tensor decayed, one not */
    ou_model(&r, sizes, 2);
    uint64_t n = (uint64_t)NSG * SG;
    float *g = malloc(4 * n);
    REQUIRE(g);
    const char *dir = ou_scratch_dir("offload_cost");
    convergence(&r, g, n, dir);
    profile_file(&r, g, n, dir);
    planner_by_hand();
    planner_grid();
    hysteresis();
    plan_ratios();
    split_margin();
    reprobe();
    explore();
    probe_home();
    paired_levels();
    engine_auto(&r, g, n);
    free(g);
    mw_offload_registry_free(&r);
    tu_rm_rf(dir);
    TEST_END();
}
