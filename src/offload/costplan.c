/*
 * costplan.c — `--offload-policy auto`: the CPU/device split of the next step, chosen between
 * steps from the corrected cost model (costlearn.c) by simulating the step under each candidate.
 *
 * Why simulate whole steps and not decide per subgroup: the greedy "whichever engine finishes it
 * first" of policy.c's fixed-clock days lost to all-cpu by 1.48x when the device was slower than
 * the CPU: a decision that looks free for one subgroup (an idle device) holds the link, the
 * disk's write-back order and the step's end. A plan is one of the fixed policies (all-cpu,
 * all-device, every-K), or a split that sends d of the n subgroups to the device spread evenly;
 * each is simulated over the step's subgroups with the same model, and the fastest is taken.
 * Since the fixed policies are candidates, auto is never predicted slower than the best of them;
 * how close the prediction is to the run is what costlearn.c corrects every step. A split is taken
 * only when predicted more than OFL_PLAN_SPLIT_MARGIN ahead of the best fixed policy (cost.h: a
 * split predicted 1 or 2 % ahead is within the error of its own ratio, and ran behind).
 *
 * Why hysteresis: two plans within noise of each other would flap from step to step, and each
 * switch costs a step of learning the new side's factors. The current plan stays unless the best
 * is predicted faster by more than OFL_PLAN_HYST of it.
 *
 * Why probes: a plan the model ties with the one auto settled on (home), by its prediction or, when
 * it never ran (its plan ratio is a guess, ofl_plan_ratios), by its simulation alone, is run to be
 * measured; so is a fixed policy never run next to home's device count predicted within
 * OFL_PLAN_EXPLORE (a local search: the simulation can be wrong about where the best count lies).
 * On NVMe at 0.25x / 64 GB/s all-device ran 2.7 % ahead of every other plan, and auto, which gave
 * it the ratio of the counts it had measured and so never ran it, 4.6 % behind.
 *
 * Why a probe goes home (ofl_plan_next): a probe runs for one step; then home runs again for
 * OFL_PLAN_BACK steps, and only then do the plan ratios choose, home's ratio being the median of
 * its step before the probe and those after it (its older ones forgotten). Why around the probe:
 * the machine's other tenants load it in bursts that last many steps, so ratios measured far apart
 * compare two loads, not two plans; and three steps, because their median outvotes one of them
 * caught by a burst. When auto instead stayed on the probe until something beat it by the
 * hysteresis, the hysteresis protected a probe measured once against home's old ratio: on NVMe
 * every engine's first steps were slow, all-cpu's ratio came from them, and auto stayed on probes
 * ~10 % slower than all-cpu for most of a 41-step run. Why a probe ahead of home, but not by the
 * hysteresis, is run again (its ratios and home's kept: they cover the same steps), up to
 * OFL_COST_WINDOW times: one step of each cannot tell plans 3 % apart through steps that vary by as
 * much; on NVMe at 8x / 64 GB/s all-device ran ~4 % ahead of all-cpu, a probe of it measured 1 %
 * ahead, and auto kept all-cpu until the re-probe at step 40.
 *
 * Why levels (level_learn, ofl_plan_ratios_paired): judging a probe beside home's steps around it
 * compares the two under one load, but the next decision compared that probe's ratio with every
 * other count's own, measured under the loads of their own probes. Once the machine was slower for
 * good, a count probed in the quiet first steps looked ahead of home by the load alone: on NVMe at
 * 0.25x / 64 GB/s auto moved home to every-5, probed 7 steps before, right after a probe of
 * all-device that ran 5 % ahead of it. So what each probe measured beside home is kept as the
 * count's level (on home's, itself on its home's when it was probed: one chain from the first home,
 * level 0), the median of its last OFL_COST_WINDOW, and a count's ratio is home's median times its
 * level over home's: every comparison goes through steps that ran side by side. Why the home left
 * is probed after a move (OFL_PLAN_VERIFY, cost.h): a move is made on the probes that measured
 * ahead, and among many tied plans some do by noise; beside the new home, the old one comes back
 * when it is the faster.
 *
 * Why plan ratios (ofl_plan_predict): the simulation is built from per-job times, and a step that
 * uses both sides ends with the later of two paths, each with its own noise and host threads to
 * share; the engine (policy.c) keeps, per number of device subgroups, the ratio of the measured
 * step to its simulation, and the prediction of a plan is its simulation times that ratio. What a
 * plan did when it ran outweighs what the model says it should have done.
 *
 * The simulated step (seconds from the step's start, all subgroups ready at once):
 *   disk    reads back to back in subgroup order; write-backs after each update; the step ends no
 *           earlier than the disk's total busy time (reads and writes share it);
 *   cpu     one update at a time, each once its read is done;
 *   device  two job slots: a job's copy in waits for its read, the link and its slot (freed by the
 *           copy out of the job two before); its kernel for the copy in and the previous kernel;
 *           its copy out for the kernel and the link; copies out go first when both are ready,
 *           as the device's copy engine serves them (device.c, accel_emu.c).
 */
#include "offload/cost.h"
#include "memwall/common.h"

#include <math.h>
#include <string.h>


int ofl_plan_on_device(const struct ofl_plan_choice *ch, uint32_t i, uint32_t n)
{
    switch (ch->kind) {
    case MW_OFFLOAD_POLICY_ALL_CPU: return 0;
    case MW_OFFLOAD_POLICY_ALL_DEVICE: return 1;
    case MW_OFFLOAD_POLICY_EVERY_K: return ch->k >= 1 && (int)(i % (uint32_t)ch->k) == ch->k - 1;
    default: /* d of n, spread: i is on the device when floor((i+1) d / n) steps up at i */
        return n && (uint64_t)(i + 1) * ch->ndev / n > (uint64_t)i * ch->ndev / n;
    }
}

/* The device's side of the simulation: copies out waiting for the link (at most one per slot). */
struct dsim {
    double link, comp, slot[2];
    double first;                     /* the first copy in's start, or -1 */
    int np;                           /* pending copies out, oldest first */
    double k1[2], d2h[2], write[2];
    int pslot[2];
    double end;                       /* the latest write-back end so far */
};

static void dsim_flush(struct dsim *d)
{
    double o0 = MW_MAX(d->k1[0], d->link);
    d->link = o0 + d->d2h[0];
    d->slot[d->pslot[0]] = d->link;
    d->end = MW_MAX(d->end, d->link + d->write[0]);
    d->k1[0] = d->k1[1];
    d->d2h[0] = d->d2h[1];
    d->write[0] = d->write[1];
    d->pslot[0] = d->pslot[1];
    d->np--;
}

static void dsim_job(struct dsim *d, uint32_t j, double ready, const struct ofl_plan_sg *g)
{
    int s = (int)(j % 2);
    for (int i = 0; i < d->np; i++)
        if (d->pslot[i] == s) { /* the slot's last job must be out first (and those before it) */
            for (int f = 0; f <= i; f++) dsim_flush(d);
            break;
        }
    double t = MW_MAX(ready, MW_MAX(d->link, d->slot[s]));
    while (d->np && d->k1[0] <= t) { /* copies out that are ready go first */
        dsim_flush(d);
        t = MW_MAX(ready, MW_MAX(d->link, d->slot[s]));
    }
    if (d->first < 0) d->first = t;
    d->link = t + g->h2d;
    double k0 = MW_MAX(d->link, d->comp);
    d->comp = k0 + g->dev;
    d->k1[d->np] = d->comp;
    d->d2h[d->np] = g->d2h;
    d->write[d->np] = g->write;
    d->pslot[d->np] = s;
    d->np++;
}

/* The step under ch, or with mask (when not NULL) saying which subgroups the device has; *dev_span:
 * from the device's first copy in to its last copy out (0 without device work). */
static double simulate(const struct ofl_plan_sg *sg, uint32_t n, const struct ofl_plan_choice *ch,
                       const unsigned char *mask, double *dev_span)
{
    struct dsim d = {.first = -1};
    double rd = 0, cpu = 0, disk = 0, end = 0;
    uint32_t jobs = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct ofl_plan_sg *g = &sg[i];
        rd += g->read;
        disk += g->read + g->write;
        if (mask ? mask[i] : ofl_plan_on_device(ch, i, n)) {
            dsim_job(&d, jobs++, rd, g);
        } else {
            cpu = MW_MAX(rd, cpu) + g->cpu;
            end = MW_MAX(end, cpu + g->write);
        }
    }
    while (d.np) dsim_flush(&d);
    if (dev_span) *dev_span = jobs ? d.link - d.first : 0;
    return MW_MAX(MW_MAX(end, d.end), disk);
}

double ofl_plan_simulate(const struct ofl_plan_sg *sg, uint32_t n, const struct ofl_plan_choice *ch)
{
    return simulate(sg, n, ch, NULL, NULL);
}

double ofl_plan_simulate_mask(const struct ofl_plan_sg *sg, uint32_t n, const unsigned char *on_dev, double *dev_span)
{
    return simulate(sg, n, NULL, on_dev, dev_span);
}

double ofl_plan_predict(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, const struct ofl_plan_choice *ch)
{
    double t = simulate(sg, n, ch, NULL, NULL);
    return ratio && ch->ndev <= n ? t * ratio[ch->ndev] : t;
}

/* The candidates, in preference order for ties: fixed policies, then splits. */
static uint32_t candidates(uint32_t n, struct ofl_plan_choice *out)
{
    uint32_t c = 0;
    out[c++] = (struct ofl_plan_choice){MW_OFFLOAD_POLICY_ALL_CPU, 0, 0, 0};
    out[c++] = (struct ofl_plan_choice){MW_OFFLOAD_POLICY_ALL_DEVICE, 0, n, 0};
    for (int k = 2; k <= OFL_PLAN_MAXK; k++)
        out[c++] = (struct ofl_plan_choice){MW_OFFLOAD_POLICY_EVERY_K, k, n / (uint32_t)k, 0};
    /* splits: every d in 1..n-1, or 64 of them spread over that range for a large n */
    uint32_t m = n > 1 ? MW_MIN(n - 1, 64u) : 0;
    for (uint32_t i = 1; i <= m; i++) {
        uint32_t d = n - 1 <= 64 ? i : (uint32_t)((uint64_t)i * (n - 1) / m);
        out[c++] = (struct ofl_plan_choice){-1, 0, d, 0};
    }
    return c;
}

void ofl_plan_best(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, struct ofl_plan_choice *best,
                   struct ofl_plan_choice *best_fixed)
{
    struct ofl_plan_choice c[OFL_PLAN_MAXK + 2 + 64];
    uint32_t nc = candidates(n, c);
    int b = -1, bf = -1;
    for (uint32_t i = 0; i < nc; i++) {
        c[i].predicted_s = ofl_plan_predict(sg, n, ratio, &c[i]);
        if (b < 0 || c[i].predicted_s < c[b].predicted_s) b = (int)i; /* strict: ties keep the earlier */
        if (c[i].kind >= 0 && (bf < 0 || c[i].predicted_s < c[bf].predicted_s)) bf = (int)i;
    }
    if (c[b].kind < 0 && c[b].predicted_s > c[bf].predicted_s * (1 - OFL_PLAN_SPLIT_MARGIN)) b = bf; /* cost.h */
    *best = c[b];
    if (best_fixed) *best_fixed = c[bf];
}

/* The ratios from known[d] (> 0: that count's ratio; 0: not known), the unknown ones on the line
 * between the nearest known counts (ofl_plan_ratios): one pass, the next known count found once. */
static void ratios_between(const double *known, uint32_t n, double *ratio)
{
    int lo = -1;     /* the last known count below d */
    uint32_t hi = 0; /* the first known count from d on (n + 1: none) */
    double rhi = 1;  /* its ratio */
    for (uint32_t d = 0; d <= n; d++) {
        if (d == 0 || d > hi) { /* one pass: hi moves on only once d has passed it */
            for (hi = d; hi <= n && !(known[hi] > 0); hi++) {}
            rhi = hi <= n ? known[hi] : 1;
        }
        if (hi == d) {
            ratio[d] = rhi;
            lo = (int)d;
        } else if (lo < 0) {
            ratio[d] = rhi; /* the nearest above, or 1 when nothing ran: the simulation as it is */
        } else if (hi > n) {
            ratio[d] = ratio[lo];
        } else {
            ratio[d] = ratio[lo] + (rhi - ratio[lo]) * (double)(d - (uint32_t)lo) / (double)(hi - (uint32_t)lo);
        }
    }
}

void ofl_plan_ratios(const struct ofl_cost_hist *hist, uint32_t n, double *ratio)
{
    for (uint32_t d = 0; d <= n; d++) ratio[d] = hist[d].n ? ofl_cost_hist_median(&hist[d]) : 0;
    ratios_between(ratio, n, ratio); /* in place: known[d] is read before ratio[d] is written */
}

/* A count's level: the median of its last OFL_COST_WINDOW (0 without any): one probe caught by a
 * burst is outvoted once the count has three. */
static double level(const struct ofl_cost_hist *h) { return ofl_cost_ring_median(h->lv, h->lvl_n); }

static void level_add(struct ofl_cost_hist *h, double x) { h->lv[h->lvl_n++ % OFL_COST_WINDOW] = x; }

void ofl_plan_ratios_paired(const struct ofl_cost_hist *hist, uint32_t n, uint32_t home, double *ratio)
{
    if (home > n || !hist[home].n || !hist[home].lvl_n) {
        ofl_plan_ratios(hist, n, ratio);
        return;
    }
    double rh = ofl_cost_hist_median(&hist[home]), lh = level(&hist[home]);
    for (uint32_t d = 0; d <= n; d++)
        ratio[d] = d == home        ? rh
                 : hist[d].lvl_n    ? rh * exp(level(&hist[d]) - lh)
                 : hist[d].n        ? ofl_cost_hist_median(&hist[d])
                                    : 0;
    ratios_between(ratio, n, ratio);
}

/* The fixed candidates' device counts nearest home's below and above (-1: none), among c[0..nc). */
static void neighbours(const struct ofl_plan_choice *c, uint32_t nc, uint32_t home, int *below, int *above)
{
    *below = *above = -1;
    for (uint32_t i = 0; i < nc; i++) {
        if (c[i].kind < 0) continue;
        int d = (int)c[i].ndev;
        if (c[i].ndev < home && d > *below) *below = d;
        if (c[i].ndev > home && (*above < 0 || d < *above)) *above = d;
    }
}

int ofl_plan_untried(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, const unsigned char *tried,
                     const struct ofl_cost_hist *hist, uint64_t now, const struct ofl_plan_choice *best,
                     struct ofl_plan_choice *out)
{
    struct ofl_plan_choice c[OFL_PLAN_MAXK + 2 + 64];
    uint32_t nc = candidates(n, c);
    int found = 0;
    uint64_t found_at = 0;
    double sim_best = ofl_plan_simulate(sg, n, best);
    int below, above;
    neighbours(c, nc, best->ndev, &below, &above);
    for (uint32_t i = 0; i < nc; i++) {
        if (c[i].kind < 0 || c[i].ndev > n || c[i].ndev == best->ndev) continue;
        c[i].predicted_s = ofl_plan_predict(sg, n, ratio, &c[i]);
        if (!tried[c[i].ndev]) { /* never run: the first tied one, or a neighbour within reach, at once */
            int near = (int)c[i].ndev == below || (int)c[i].ndev == above;
            int tie = c[i].predicted_s <= best->predicted_s * (1 + OFL_PLAN_TIE) ||
                      ofl_plan_simulate(sg, n, &c[i]) <= sim_best * (1 + OFL_PLAN_TIE);
            if (!tie && !(near && c[i].predicted_s <= best->predicted_s * (1 + OFL_PLAN_EXPLORE))) continue;
            *out = c[i];
            return 1;
        }
        /* run, long ago: tied by the simulation alone (its old ratio is what is in doubt), at most one
         * every OFL_PLAN_REPROBE steps, the one measured longest ago (so each tie comes round) */
        const struct ofl_cost_hist *h = hist ? &hist[c[i].ndev] : NULL;
        if (h && h->n && now > h->at + OFL_PLAN_REPROBE && now % OFL_PLAN_REPROBE == 0 &&
            ofl_plan_simulate(sg, n, &c[i]) <= sim_best * (1 + OFL_PLAN_TIE) && (!found || h->at < found_at)) {
            *out = c[i];
            found = 1;
            found_at = h->at;
        }
    }
    return found;
}

int ofl_plan_switch(const struct ofl_plan_sg *sg, uint32_t n, const double *ratio, const struct ofl_plan_choice *cur,
                    const struct ofl_plan_choice *best)
{
    double tc = ofl_plan_predict(sg, n, ratio, cur), tb = ofl_plan_predict(sg, n, ratio, best);
    return tb < tc * (1 - OFL_PLAN_HYST);
}

static int same_plan(const struct ofl_plan_choice *a, const struct ofl_plan_choice *b)
{
    return a->kind == b->kind && a->k == b->k && a->ndev == b->ndev;
}

static void plan_set(struct ofl_plan_auto *a, const struct ofl_plan_choice *next)
{
    a->switches += (uint32_t)(a->set && !same_plan(&a->cur, next));
    a->cur = *next;
    a->set = 1;
}

/* A level for `to`, never measured beside home, that auto moves home to: what the ratios guess (the
 * line between known counts), until a probe of it beside another home measures one. */
static void level_guess(struct ofl_cost_hist *hist, const double *ratio, uint32_t from, uint32_t to)
{
    if (!hist[to].lvl_n) level_add(&hist[to], level(&hist[from]) + log(ratio[to] / ratio[from]));
}

/* The probe's steps over home's around them (the same steps: costplan.c), added to the probe's
 * levels on home's level; a probe run again adds one more, over all of its steps and home's since
 * it started. */
static void level_learn(struct ofl_plan_auto *a, struct ofl_cost_hist *hist)
{
    struct ofl_cost_hist *p = &hist[a->probe.ndev], *h = &hist[a->home.ndev];
    a->pending = 0;
    if (!p->n || !h->n || !h->lvl_n || p == h) return;
    level_add(p, level(h) + log(ofl_cost_hist_median(p) / ofl_cost_hist_median(h)));
}

void ofl_plan_next(struct ofl_plan_auto *a, const struct ofl_plan_sg *sg, uint32_t n, struct ofl_cost_hist *hist,
                   double *ratio, const unsigned char *tried, uint64_t now, struct ofl_plan_choice *best_fixed)
{
    struct ofl_plan_choice best, probe;
    if (!a->set) {
        ofl_plan_ratios(hist, n, ratio);
        ofl_plan_best(sg, n, ratio, &best, best_fixed);
        a->home = best;
        level_add(&hist[best.ndev], 0); /* the first home: level 0, what the others are measured from */
        plan_set(a, &best);
        return;
    }
    int home_ran = !a->wait; /* the step just measured ran home, and auto may decide */
    if (a->wait) a->wait--;
    if (home_ran && a->pending) level_learn(a, hist);
    ofl_plan_ratios_paired(hist, n, a->home.ndev, ratio);
    ofl_plan_best(sg, n, ratio, &best, best_fixed);
    /* a probe measured once is not taken on that one step: probed again (below) first */
    int once = a->probes && a->probes < OFL_COST_WINDOW && best.ndev == a->probe.ndev &&
               hist[best.ndev].n < OFL_PLAN_TAKE_AFTER;
    if (home_ran && !once && ofl_plan_switch(sg, n, ratio, &a->home, &best)) {
        level_guess(hist, ratio, a->home.ndev, best.ndev);
        a->left = a->home;
        a->verify = 1;
        a->home = best;
        a->probes = 0;
        home_ran = 0; /* the new home runs before anything is probed beside it */
    }
    a->home.predicted_s = ofl_plan_predict(sg, n, ratio, &a->home);
    plan_set(a, &a->home);
    if (!home_ran || now < 2 || !tried[a->home.ndev]) return;
    if (a->probes && a->probes < OFL_COST_WINDOW && !same_plan(&a->probe, &a->home) &&
        ofl_plan_predict(sg, n, ratio, &a->probe) < a->home.predicted_s) {
        probe = a->probe; /* ahead, not by the hysteresis: again, home's ratios and its kept (the same steps) */
    } else {
        a->probes = 0;
        if (a->verify && !same_plan(&a->left, &a->home) &&
            ofl_plan_predict(sg, n, ratio, &a->left) <= a->home.predicted_s * (1 + OFL_PLAN_VERIFY)) {
            probe = a->left; /* the home just left, measured beside the new one (costplan.c: why) */
        } else if (!ofl_plan_untried(sg, n, ratio, tried, hist, now, &a->home, &probe)) {
            a->verify = 0;
            return;
        }
        a->verify = 0;
        /* a new probe: its old ratios (if any) were another load's, and so were home's but the last
         * (its level, measured beside a home, stays) */
        ofl_cost_hist_keep_last(&hist[a->home.ndev]);
        hist[probe.ndev].n = 0;
        hist[probe.ndev].at = 0;
        ofl_plan_ratios_paired(hist, n, a->home.ndev, ratio);
    }
    probe.predicted_s = ofl_plan_predict(sg, n, ratio, &probe);
    a->probe = probe;
    a->probes++;
    a->pending = 1;
    a->wait = OFL_PLAN_BACK;
    plan_set(a, &probe);
}
