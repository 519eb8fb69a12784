/*
 * units.h — the unit-residency machine (internal): one state machine for every source a weight
 * unit's bytes can come from.
 *
 * Why one: ZeRO-3 all-gathers a unit from its peers before use and releases it after; streaming
 * reads it from NVMe ahead of use and releases it after; a device will copy it in. The walk is
 * the same for all of them: the model acquires units in the order of its table (mw_net_sched:
 * forward, then backward batch-major or layer-major), each acquire is checked against that
 * order (a model that strays is an error naming both units, never a silent wrong fetch), the
 * unit is waited for, the next `depth` units of the order are issued ahead, and at a release the
 * source drops what the order does not need soon. Only the moves differ, and those are the
 * source's table (issue, wait, release). The granularity of what a source holds (whole units for
 * peers, page-aligned subgroups for NVMe) stays inside the source; it asks the machine which
 * units come next (mw_units_at).
 *
 *   acquire u:  (first backward acquire: position = the forward's length)
 *               order[pos] == u, else -EINVAL naming both units
 *               src->wait(u)                       issues first when nothing is in flight
 *               pos++; src->issue(order[pos + k], 0) for k < depth, skipping u itself
 *               src->acquired(u)                   optional: measurements
 *   release u:  src->release(u, backward)          the source keeps what order[pos..] needs
 */
#ifndef MEMWALL_TRAIN_UNITS_H
#define MEMWALL_TRAIN_UNITS_H

#include "memwall/model.h"

struct mw_unit_source {
    const char *name;                                 /* "peers", "nvme" */
    /* Start bringing unit u's bytes into DRAM. now: it is needed at once (a source may wait for
     * what the bytes depend on, e.g. the update of the unit's subgroups); else a prefetch, which a
     * source may skip (nothing to do, or not ready). Nothing in flight twice. */
    int (*issue)(void *self, int u, int now);
    /* Until unit u is usable, issuing it first if nothing is in flight. */
    int (*wait)(void *self, int u);
    /* After a use of u (backward: in the backward pass). */
    int (*release)(void *self, int u, int backward);
    /* Optional: after an acquire and its prefetches were issued. */
    void (*acquired)(void *self, int u);
};

struct mw_units {
    const struct mw_unit_source *src;
    void *self;                /* the source's state */
    const char *who;           /* names the machine in messages ("ZeRO-3", "streaming") */
    const struct mw_net *net;  /* borrowed: the units' names in messages */
    struct mw_net_sched sched; /* the order of the model's table */
    int depth;                 /* units issued ahead of use */
    int training;              /* the pass's forward is followed by backward */
    int layer_major;           /* the pass runs the layer-major step's order */
    int pos;                   /* position in the current pass's order */
    int in_backward;
    int wrap;                  /* the next pass is a training pass over the same weights (the next
                                  micro-batch of the step): the look-ahead runs on into its forward */
    int *lead;                 /* NULL, or [n_units]: positions ahead each unit is issued, by its size
                                  (mw_units_lead_by_size); the look-ahead reaches lead_max */
    int lead_max;
};

/* 0, or -ENOMEM / -EINVAL with the message set. depth 0..8. */
int mw_units_init(struct mw_units *m, const struct mw_net *net, const struct mw_unit_source *src, void *self,
                  int depth, const char *who);
void mw_units_free(struct mw_units *m);
/* Larger units are issued further ahead, in proportion to their size (mw_plan_stream_leads, which
 * the stream plan uses too). 0 or -ENOMEM. */
int mw_units_lead_by_size(struct mw_units *m);
/* Whether the look-ahead from position pos has issued the unit at pos + k (k >= 0). */
static inline int mw_units_in_reach(const struct mw_units *m, int k, int u)
{
    return k < m->depth || (m->lead && u >= 0 && k < m->lead[u]);
}
/* Before a pass (training: a backward follows). */
void mw_units_pass_begin(struct mw_units *m, int training, int layer_major);
/* The model's unit hook (mw_net_weights_fn's event, unit, backward). */
int mw_units_hook(struct mw_units *m, int event, int unit, int backward);
/* The unit at position p of the current pass's order; -1 past its end. */
static inline int mw_units_at(const struct mw_units *m, int p)
{
    return mw_net_sched_unit(&m->sched, m->layer_major, m->training, p);
}

/* The look-ahead's unit at position p: the pass's order, then with wrap the next pass's forward
 * (positions past the end continue at its start); -1 past what is known. Acquires are checked
 * against mw_units_at only. */
static inline int mw_units_ahead(const struct mw_units *m, int p)
{
    int u = mw_units_at(m, p);
    if (u >= 0 || !m->wrap || p < 0) return u;
    int lm = !!m->layer_major, end = m->sched.nf[lm] + (m->training ? m->sched.nb[lm] : 0);
    return p - end < m->sched.nf[lm] ? mw_net_sched_unit(&m->sched, m->layer_major, 1, p - end) : -1;
}

#endif
