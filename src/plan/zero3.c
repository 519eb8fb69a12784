/*
 * zero3.c — ZeRO-3's gathered working set, and the same figure for memwall's own GPT-2.
 *
 * Why units and not blocks: ZeRO-3 all-gathers one unit of weights (one contiguous range of
 * the flat array) just before its use and issues the gather of the next one, releasing each
 * after use, so at most two units are live per rank. memwall's GPT-2 runs E (wte + wpe),
 * B_0..B_{L-1}, F (ln_f), E (tied head) forward and E, F, B_{L-1}..B_0 backward; the largest
 * live pair is E + B_0, and E (Vp x C + maxT x C) is 5.6x a block for GPT-2 124M. Counting
 * only blocks, as this planner once did, predicted 14.2M gathered parameters instead of 46.5M.
 * The rule kept here is the two largest units of the rank: exact for a tied head, an upper
 * bound when an untied head is never adjacent to the embedding in the schedule.
 *
 * mw_plan_gpt2_zero3_weights goes through mw_plan_compute on purpose: `memwall train` prints
 * the planner's prediction, and `memwall plan` with the same config.json must print the same.
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "plan/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void offer(struct mw_stage *s, uint64_t n, const char *name)
{
    if (n > s->unit_params[0]) {
        s->unit_params[1] = s->unit_params[0];
        s->unit_name[1] = s->unit_name[0];
        s->unit_params[0] = n;
        s->unit_name[0] = name;
    } else if (n > s->unit_params[1]) {
        s->unit_params[1] = n;
        s->unit_name[1] = name;
    }
}

void mw_plan_stage_units_(const struct mw_model *m, const struct mw_layout *l, struct mw_stage *s)
{
    s->unit_params[0] = s->unit_params[1] = 0;
    s->unit_name[0] = s->unit_name[1] = "";
    if (m->arch == MW_ARCH_BARE) { /* no shapes: the largest layer, twice (an upper bound) */
        uint64_t big = mw_cdiv_(m->bare_largest, l->tp);
        offer(s, big, "largest layer");
        offer(s, big, "largest layer");
        return;
    }
    if (s->index == 0) offer(s, mw_plan_embed_params_(m, l), "embedding");
    for (uint64_t c = 0; c < l->interleave; c++) {
        uint64_t first, count;
        mw_plan_stage_layers(m, l, s->index, c, &first, &count);
        for (uint64_t i = first; i < first + count; i++) {
            uint64_t dense, expert;
            (void)mw_plan_block_params_(m, l, i, &dense, &expert);
            offer(s, dense + expert, "block");
        }
    }
    if (s->index == l->pp - 1) {
        offer(s, mw_plan_final_params_(m), "final norm");
        offer(s, mw_plan_head_params_(m, l), "head");
    }
}

static int dtype_of_bytes(double b, enum mw_dtype *d)
{
    static const enum mw_dtype k[] = {MW_DT_FP32, MW_DT_BF16, MW_DT_FP8, MW_DT_INT4};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (mw_dtype_bytes(k[i]) == b) { *d = k[i]; return 0; }
    return mw_error_set(-EINVAL, "ZeRO-3 weights: %g bytes per weight is not a dtype the planner "
                        "knows (4, 2, 1 or 0.5)", b);
}

int mw_plan_gpt2_zero3_weights(int n_layer, int n_embd, int n_head, int padded_vocab, int max_seq,
                               int ranks, double weight_bytes, struct mw_plan_zero3_weights *out)
{
    memset(out, 0, sizeof *out);
    if (n_layer <= 0 || n_embd <= 0 || n_head <= 0 || padded_vocab <= 0 || max_seq <= 0 || ranks <= 0)
        return mw_error_set(-EINVAL, "ZeRO-3 weights: layers %d, width %d, heads %d, vocab %d, "
                            "positions %d and ranks %d must be positive", n_layer, n_embd, n_head,
                            padded_vocab, max_seq, ranks);
    if (n_embd % n_head)
        return mw_error_set(-EINVAL, "ZeRO-3 weights: %d heads do not divide width %d", n_head, n_embd);
    struct mw_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "gpt2-L%d-C%d", n_layer, n_embd);
    m.arch = MW_ARCH_GPT;
    m.n_layer = (uint64_t)n_layer;
    m.hidden = (uint64_t)n_embd;
    m.n_head = m.n_kv_head = (uint64_t)n_head;
    m.head_dim = m.hidden / m.n_head;
    m.ffn = 4 * m.hidden;
    m.vocab = (uint64_t)padded_vocab; /* wte rows, padding included */
    m.max_pos = (uint64_t)max_seq;
    m.norm = MW_NORM_LAYER;
    m.bias_linear = 1;
    m.tied_embeddings = 1;
    return mw_plan_zero3_weights(&m, ranks, weight_bytes, out);
}

int mw_plan_zero3_weights(const struct mw_model *m, int ranks, double weight_bytes,
                          struct mw_plan_zero3_weights *out)
{
    memset(out, 0, sizeof *out);
    if (ranks <= 0) return mw_error_set(-EINVAL, "ZeRO-3 weights: ranks %d must be positive", ranks);
    struct mw_layout l;
    mw_layout_default(&l);
    l.gpus = l.dp = (uint64_t)ranks;
    l.zero = 3;
    /* Only the weights are read from the plan: the sequence sizes activations, not them. A
     * rotary model (max_pos 0) keeps the default. */
    if (m->max_pos) l.seq = m->max_pos;
    int err = dtype_of_bytes(weight_bytes, &l.weight);
    if (err) return err;

    struct mw_plan_result *r = malloc(sizeof *r);
    if (!r) return mw_error_set(-ENOMEM, "ZeRO-3 weights: out of memory");
    err = mw_plan_compute(m, &l, NULL, r);
    if (!err) {
        const struct mw_stage *s = &r->stage[0];
        out->params = r->count.total;
        out->largest_unit_params = s->unit_params[0];
        out->second_unit_params = s->unit_params[1];
        out->largest_unit = s->unit_name[0];
        out->second_unit = s->unit_name[1];
        out->shard_bytes = s->gpu.params; /* no offload: the shard is on the GPU */
        out->gathered_bytes = s->gathered;
        out->total_bytes = out->shard_bytes + out->gathered_bytes;
    }
    free(r);
    return err;
}
