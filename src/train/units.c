/*
 * units.c — the unit-residency machine (see units.h for why one machine and how it walks).
 */
#include "train/units.h"
#include "memwall/common.h"

#include "memwall/plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mw_units_init(struct mw_units *m, const struct mw_net *net, const struct mw_unit_source *src, void *self,
                  int depth, const char *who)
{
    memset(m, 0, sizeof *m);
    if (depth < 0 || depth > 8) return mw_error_set(-EINVAL, "prefetch depth %d: use 0..8 units", depth);
    if (mw_net_sched_init(&m->sched, net)) return mw_error_set(-ENOMEM, "no memory for the %s schedule", who);
    m->src = src;
    m->self = self;
    m->who = who;
    m->net = net;
    m->depth = depth;
    return 0;
}

int mw_units_lead_by_size(struct mw_units *m)
{
    int nu = m->net->n_units;
    uint64_t *n = calloc((size_t)MW_MAX(nu, 1), sizeof *n);
    int *lead = calloc((size_t)MW_MAX(nu, 1), sizeof *lead);
    if (!n || !lead) {
        free(n);
        free(lead);
        return mw_error_set(-ENOMEM, "no memory for the %s look-ahead", m->who);
    }
    for (int u = 0; u < nu; u++) {
        size_t first = 0, cnt = 0;
        (void)mw_net_unit_range(m->net, u, &first, &cnt); /* u < n_units: cannot fail */
        n[u] = cnt;
    }
    mw_plan_stream_leads(n, nu, m->depth, lead);
    free(n);
    free(m->lead);
    m->lead = lead;
    m->lead_max = m->depth;
    for (int u = 0; u < nu; u++) m->lead_max = MW_MAX(m->lead_max, lead[u]);
    return 0;
}

void mw_units_free(struct mw_units *m)
{
    free(m->lead);
    mw_net_sched_free(&m->sched);
    memset(m, 0, sizeof *m);
}

void mw_units_pass_begin(struct mw_units *m, int training, int layer_major)
{
    m->training = training;
    m->layer_major = layer_major;
    m->pos = 0;
    m->in_backward = 0;
    m->wrap = 0;
}

int mw_units_hook(struct mw_units *m, int event, int unit, int backward)
{
    if (event != MW_NET_UNIT_ACQUIRE) return m->src->release(m->self, unit, backward);
    if (backward && !m->in_backward) {
        m->in_backward = 1;
        m->pos = m->sched.nf[!!m->layer_major]; /* the forward part's length */
    }
    int want = mw_units_at(m, m->pos);
    if (want != unit) {
        /* Named: a model whose order changed (a caller's module order, issue 25) is told which. */
        char got[128] = "no such unit", exp[128] = "the end of the pass";
        if (unit >= 0 && unit < m->net->n_units) mw_net_unit_name(m->net, unit, got, sizeof got);
        if (want >= 0) mw_net_unit_name(m->net, want, exp, sizeof exp);
        return mw_error_set(-EINVAL, "%s: the model acquired weight unit %d (%s), the schedule expected %d (%s) (%s %s "
                            "position %d)", m->who, unit, got, want, exp, m->layer_major ? "layer-major" : "batch-major",
                            backward ? "backward" : "forward", m->pos);
    }
    int err = m->src->wait(m->self, unit);
    if (err) return err;
    m->pos++;
    for (int k = 0; k < MW_MAX(m->depth, m->lead_max) && !err; k++) {
        int u = mw_units_ahead(m, m->pos + k);
        if (u < 0) break;
        if (u != unit && mw_units_in_reach(m, k, u)) err = m->src->issue(m->self, u, 0);
    }
    if (!err && m->src->acquired) m->src->acquired(m->self, unit);
    return err;
}
