/*
 * internal.h — helpers shared by the planner's files, not part of the public API.
 */
#ifndef MEMWALL_PLAN_INTERNAL_H
#define MEMWALL_PLAN_INTERNAL_H

#include "memwall/plan.h"

/* Transformer blocks in pipeline order (T5: encoder then decoder). */
static inline uint64_t mw_plan_blocks_(const struct mw_model *m)
{
    return m->n_layer + (m->arch == MW_ARCH_T5 ? m->n_dec_layer : 0);
}

static inline uint64_t mw_cdiv_(uint64_t a, uint64_t b) { return b ? (a + b - 1) / b : a; }

/* activations.c: fills act_layers, act_other, act_per_layer, inflight (and the GPU working
 * set of full recomputation) for the rank s->index. */
void mw_plan_stage_act_(const struct mw_model *m, const struct mw_layout *l, struct mw_stage *s);

#endif
