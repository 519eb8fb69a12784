/*
 * policy.c — which engine updates a subgroup: the CPU or the accelerator.
 *
 * Why "whichever finishes first" and not "whichever is faster": the two engines run at the same
 * time, so a slower engine that is idle beats a faster one with a queue. Each engine keeps a
 * predicted busy-until clock (seconds since the step started); a subgroup goes where
 * max(now, busy_until) + predicted time is smaller (the greedy list schedule of "Deep
 * Optimizer States"). The fixed policies ignore the clocks (for experiments), but the
 * predictions are still traced so their accuracy can be read from every run.
 */
#include "offload/internal.h"

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <errno.h>

const char *mw_offload_policy_name(enum mw_offload_policy p)
{
    switch (p) {
    case MW_OFFLOAD_POLICY_AUTO: return "auto";
    case MW_OFFLOAD_POLICY_ALL_CPU: return "all-cpu";
    case MW_OFFLOAD_POLICY_ALL_DEVICE: return "all-device";
    case MW_OFFLOAD_POLICY_EVERY_K: return "every-k";
    }
    return "?";
}

int mw_offload_policy_parse(const char *s, enum mw_offload_policy *p, int *k)
{
    if (!strcmp(s, "auto")) { *p = MW_OFFLOAD_POLICY_AUTO; return 0; }
    if (!strcmp(s, "all-cpu")) { *p = MW_OFFLOAD_POLICY_ALL_CPU; return 0; }
    if (!strcmp(s, "all-device")) { *p = MW_OFFLOAD_POLICY_ALL_DEVICE; return 0; }
    if (!strncmp(s, "every-", 6)) {
        char *end;
        long v = strtol(s + 6, &end, 10);
        if (end != s + 6 && !*end && v >= 1 && v <= 1000000) {
            *p = MW_OFFLOAD_POLICY_EVERY_K;
            if (k) *k = (int)v;
            return 0;
        }
    }
    return mw_error_set(-EINVAL, "policy '%s': expected auto, all-cpu, all-device or every-K (K >= 1)", s);
}

int ofl_policy_decide(struct mw_offload *e, uint32_t sg, double now)
{
    const struct mw_offload_profile *pr = &e->cfg.profile;
    uint64_t n = e->sgs[sg].n;
    struct ofl_sg *s = &e->st[sg];
    s->pred_cpu_s = mw_offload_predict_cpu_s(pr, n);
    s->pred_dev_s = e->dev ? mw_offload_predict_dev_s(pr, n, ofl_dev_job_bytes(&e->cfg, n) * 2) : 1e30;
    double cpu_fin = MW_MAX(now, e->cpu_busy_until) + s->pred_cpu_s;
    double dev_fin = MW_MAX(now, e->dev_busy_until) + s->pred_dev_s;
    int dev = 0;
    switch (e->cfg.policy) {
    case MW_OFFLOAD_POLICY_ALL_CPU: dev = 0; break;
    case MW_OFFLOAD_POLICY_ALL_DEVICE: dev = 1; break;
    case MW_OFFLOAD_POLICY_EVERY_K: dev = (int)(sg % (uint32_t)e->cfg.every_k) == e->cfg.every_k - 1; break;
    case MW_OFFLOAD_POLICY_AUTO: dev = dev_fin < cpu_fin; break;
    }
    if (!e->dev) dev = 0;
    if (dev) e->dev_busy_until = dev_fin;
    else e->cpu_busy_until = cpu_fin;
    return dev;
}
