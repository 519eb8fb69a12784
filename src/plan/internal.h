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

/* memory.c: parameters of one rank by unit, after TP (elements). A block's non-expert part
 * goes to *dense and its routed experts (after EP/ETP) to *expert; returns 1 for a MoE block.
 * The embedding (vocab-parallel rows + replicated learned positions) lives on the first
 * pipeline rank; the head (untied, or a tied copy when PP > 1) and the final norm(s) on the
 * last. Every parameter of a rank is in exactly one of these units. */
int mw_plan_block_params_(const struct mw_model *m, const struct mw_layout *l, uint64_t layer,
                          uint64_t *dense, uint64_t *expert);
uint64_t mw_plan_embed_params_(const struct mw_model *m, const struct mw_layout *l);
uint64_t mw_plan_head_params_(const struct mw_model *m, const struct mw_layout *l);
uint64_t mw_plan_final_params_(const struct mw_model *m);

/* zero3.c: fills s->unit_params / unit_name (the two largest units of the rank s->index). */
void mw_plan_stage_units_(const struct mw_model *m, const struct mw_layout *l, struct mw_stage *s);

/* activations.c: fills act_layers, act_other, act_per_layer, inflight (and the GPU working
 * set of full recomputation) for the rank s->index. */
void mw_plan_stage_act_(const struct mw_model *m, const struct mw_layout *l, struct mw_stage *s);

#endif
