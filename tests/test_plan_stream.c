/*
 * test_plan_stream.c — the streamed run's DRAM plan (src/plan/stream.c) on shapes worked out by
 * hand, plus the properties the trainer relies on (more prefetch never plans less; accumulation
 * keeps every gradient; bad input refused with a message).
 */
#include "memwall/common.h"
#include "memwall/plan.h"
#include "testutil.h"

#include <errno.h>
#include <string.h>

static struct mw_plan_stream_in shape(int L, int C, int V, int T, uint64_t sg, int depth, int accum)
{
    struct mw_plan_stream_in in;
    memset(&in, 0, sizeof in);
    in.n_layer = L; in.n_embd = C; in.padded_vocab = V; in.max_seq = T;
    in.subgroup_size = sg; in.prefetch_depth = depth; in.grad_accum = accum; in.buffer_count = 3;
    in.acts_bytes = 1000; in.staging_bytes = 20000; in.runtime_bytes = 300;
    return in;
}

int main(void)
{
    struct mw_plan_stream p;
    /* One subgroup (the model is 284 elements: 32 + 244 + 8): one page of weights, one of
     * gradients, both resident during backward. */
    struct mw_plan_stream_in in = shape(1, 4, 4, 4, 1024, 2, 1);
    CHECK(mw_plan_stream_dram(&in, &p) == 0);
    CHECK(p.params == 284);
    CHECK(p.subgroup_size == 284);
    CHECK(p.weights_peak == 4096);
    CHECK(p.grads_peak == 4096);
    CHECK(p.passes == 8192);
    CHECK(p.step_grads == 3 * 4096);
    CHECK(p.total == 300 + 1000 + 20000 + 3 * 4096);

    /* Two blocks of width 64, vocab 64, context 64: units [0, 8192) [8192, 58176)
     * [58176, 108160) [108160, 108288); subgroups of 4096 (16 KiB), 27 of them, the last 1792
     * elements (8 KiB). Worked by hand in the comments of the file's history: */
    in = shape(2, 64, 64, 64, 4096, 0, 1);
    CHECK(mw_plan_stream_dram(&in, &p) == 0);
    CHECK(p.params == 108288);
    CHECK(p.weights_peak == 13 * 16384);              /* a block: subgroups 2..14 */
    CHECK(p.grads_peak == 26 * 16384 + 8192);         /* the embeddings' turn: every subgroup */
    in.prefetch_depth = 1;
    CHECK(mw_plan_stream_dram(&in, &p) == 0);
    CHECK(p.weights_peak == 24 * 16384 + 8192);       /* both blocks: subgroups 2..26 */
    CHECK(p.passes == 13 * 16384 + 24 * 16384 + 8192);/* block 1's backward: its weights + grads 2..26 */
    CHECK(p.weights_peak_unit == 1);

    /* Accumulation keeps the whole gradient array through the step. */
    in.grad_accum = 4;
    CHECK(mw_plan_stream_dram(&in, &p) == 0);
    CHECK(p.grads_peak == MW_ALIGN_UP(108288 * 4, 4096));

    /* Kept gradients (keep_grads) without accumulation: the whole array too. A tied embedding kept
     * from its lookup to the head (keep_tied): a block's 13 subgroups plus the embeddings' 2 at
     * prefetch depth 0 (without it: the block alone). */
    in = shape(2, 64, 64, 64, 4096, 0, 1);
    in.keep_grads = 1;
    CHECK(mw_plan_stream_dram(&in, &p) == 0);
    CHECK(p.grads_peak == MW_ALIGN_UP(108288 * 4, 4096));
    in.keep_grads = 0;
    CHECK(mw_plan_stream_dram(&in, &p) == 0 && p.weights_peak == 13 * 16384);
    in.keep_tied = 1;
    CHECK(mw_plan_stream_dram(&in, &p) == 0);
    CHECK(p.weights_peak == 15 * 16384);

    /* Data parallel: the gradients are what the trainer says its ZeRO stage keeps, at every
     * position; the collectives' buffers are added to the total. */
    in = shape(2, 64, 64, 64, 4096, 1, 1);
    in.dp_grads_bytes = 100000;
    in.dp_buffer_bytes = 70000;
    CHECK(mw_plan_stream_dram(&in, &p) == 0);
    CHECK(p.grads_peak == 100000);
    CHECK(p.weights_peak == 24 * 16384 + 8192);       /* the weights as on one rank */
    CHECK(p.passes == 24 * 16384 + 8192 + 100000);
    CHECK(p.dp_buffers == 70000);
    CHECK(p.total == p.runtime + p.acts + p.staging + 70000 + p.passes);

    /* GPT-2 124M: more prefetch never plans less, and the total holds its parts. */
    uint64_t last = 0;
    for (int d = 0; d <= 8; d++) {
        in = shape(12, 768, 50304, 1024, 4u << 20, d, 1);
        CHECK(mw_plan_stream_dram(&in, &p) == 0);
        CHECK(p.weights_peak >= last);
        CHECK(p.passes <= p.weights_peak + p.grads_peak);
        CHECK(p.total >= p.runtime + p.acts + p.staging + p.passes);
        last = p.weights_peak;
    }
    CHECK(p.params == 124475904);

    /* Another family's units and order (the model table's): given GPT-2's own, the same plan in
     * every schedule, depth and accumulation. */
    for (int lm = 0; lm < 2; lm++)
        for (int d = 0; d <= 3; d++)
            for (int acc = 1; acc <= 2; acc++) {
                struct mw_plan_stream a, b;
                in = shape(2, 64, 64, 64, 4096, d, acc);
                in.layer_major = lm;
                in.overlap = d & 1;
                CHECK(mw_plan_stream_dram(&in, &a) == 0);
                uint64_t un[4] = {64 * 64 + 64 * 64, 12 * 64 * 64 + 13 * 64, 12 * 64 * 64 + 13 * 64, 2 * 64};
                int order[16], k = 0;
                for (int p = 0; mw_plan_stream_unit(2, lm, p) >= 0; p++) order[k++] = mw_plan_stream_unit(2, lm, p);
                in.unit_n = un;
                in.order = order;
                in.n_fwd = 5;
                in.n_bwd = k - 5;
                in.tied = 1;
                CHECK(mw_plan_stream_dram(&in, &b) == 0);
                CHECK_MSG(!memcmp(&a, &b, sizeof a), "lm %d depth %d accum %d: the table's units plan differently", lm, d, acc);
            }
    /* Leading by size: the median unit sets the scale; a unit k times it is issued k x depth
     * positions ahead (at most MW_PLAN_LEAD_MAX x depth); depth 0 stays 0. */
    {
        uint64_t un[6] = {9000, 1000, 1000, 1000, 1000, 2500};
        int lead[6];
        mw_plan_stream_leads(un, 6, 2, lead);
        CHECK(lead[0] == 2 * MW_PLAN_LEAD_MAX && lead[1] == 2 && lead[4] == 2 && lead[5] == 6);
        mw_plan_stream_leads(un, 6, 0, lead);
        CHECK(lead[0] == 0 && lead[5] == 0);
        /* The plan holds the large unit over its lead: a tied embedding of 4 subgroups among
         * 4 blocks and a norm of 1 (subgroups of 4096), depth 1. Without the lead the window
         * peaks at the head with the norm (5 subgroups); with it, the head is fetched 4
         * positions ahead: from block 2's forward on, beside two other units (6). */
        uint64_t un2[6] = {16384, 4096, 4096, 4096, 4096, 4096};
        int order[] = {0, 1, 2, 3, 4, 5, 0, 0, 5, 4, 3, 2, 1};
        struct mw_plan_stream a, b;
        in = shape(4, 64, 64, 64, 4096, 1, 1);
        in.unit_n = un2; in.order = order; in.n_fwd = 7; in.n_bwd = 6; in.tied = 1;
        CHECK(mw_plan_stream_dram(&in, &a) == 0);
        in.lead_by_size = 1;
        CHECK(mw_plan_stream_dram(&in, &b) == 0);
        CHECK_MSG(a.weights_peak == 5 * 16384, "without the lead: %llu", (unsigned long long)a.weights_peak);
        CHECK_MSG(b.weights_peak == 6 * 16384, "with the lead: %llu", (unsigned long long)b.weights_peak);
        CHECK(b.passes >= a.passes && b.total >= a.total);
    }

    /* An untied head (Llama's: the final norm and the head one unit, the forward ends there):
     * layer-major's head phase holds that unit alone, not the embedding too, and its gradients
     * (not the embedding's) are resident then. Units: 16384 + 3 x 8192 + 12288 elements. */
    {
        uint64_t un[5] = {16384, 8192, 8192, 8192, 12288};
        int order[] = {0, 1, 2, 3, 4, 3, 2, 1}; /* forward 0..4, backward (layer-major) 3..1 */
        in = shape(3, 64, 64, 64, 4096, 0, 2);
        in.layer_major = 1;
        in.unit_n = un; in.order = order; in.n_fwd = 5; in.n_bwd = 3; in.tied = 0;
        CHECK(mw_plan_stream_dram(&in, &p) == 0);
        CHECK(p.params == 53248);
        CHECK(p.weights_peak == 4 * 16384);             /* the embedding, or the head: 4 subgroups each */
        in.n_fwd = 1; in.n_bwd = 7; /* a forward that does not cover 3 blocks: refused */
        CHECK(mw_plan_stream_dram(&in, &p) == -EINVAL);
        in.n_bwd = 3;
        int bad_unit[] = {0, 1, 2, 3, 9, 3, 2, 1};
        in.order = bad_unit; in.n_fwd = 5;
        CHECK(mw_plan_stream_dram(&in, &p) == -EINVAL);
        CHECK(strstr(mw_error_msg(), "unit 9") != NULL);
    }

    /* Bad input: refused with a message, nothing computed. */
    in = shape(0, 64, 64, 64, 4096, 1, 1);
    CHECK(mw_plan_stream_dram(&in, &p) == -EINVAL);
    CHECK(strstr(mw_error_msg(), "bad shape") != NULL);
    in = shape(2, 64, 64, 64, 4096, 9, 1);
    CHECK(mw_plan_stream_dram(&in, &p) == -EINVAL);
    in = shape(2, 64, 64, 64, 0, 1, 1);
    CHECK(mw_plan_stream_dram(&in, &p) == -EINVAL);
    TEST_END();
}
