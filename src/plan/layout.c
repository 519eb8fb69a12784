/*
 * layout.c — parallel layouts: defaults, derived degrees, and the checks that reject a
 * layout no framework could run (degrees that do not divide, offloaded parameters without
 * ZeRO-3). Kept apart from the memory arithmetic so the search can resolve thousands of
 * candidate layouts cheaply.
 */
#include "memwall/plan.h"
#include "memwall/common.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

static const struct { const char *name; enum mw_dtype d; double bytes; } dtypes[] = {
    {"none", MW_DT_NONE, 0}, {"fp32", MW_DT_FP32, 4}, {"bf16", MW_DT_BF16, 2},
    {"fp16", MW_DT_FP16, 2}, {"fp8", MW_DT_FP8, 1}, {"int8", MW_DT_INT8, 1}, {"int4", MW_DT_INT4, 0.5},
};

double mw_dtype_bytes(enum mw_dtype d)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].d == d) return dtypes[i].bytes;
    return 0;
}

const char *mw_dtype_name(enum mw_dtype d)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].d == d) return dtypes[i].name;
    return "?";
}

int mw_dtype_parse(const char *s, enum mw_dtype *d)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcasecmp(dtypes[i].name, s)) { *d = dtypes[i].d; return 0; }
    if (!strcasecmp(s, "float32")) { *d = MW_DT_FP32; return 0; }
    if (!strcasecmp(s, "bfloat16")) { *d = MW_DT_BF16; return 0; }
    if (!strcasecmp(s, "float16")) { *d = MW_DT_FP16; return 0; }
    return mw_error_set(-EINVAL, "unknown dtype '%s' (fp32, bf16, fp16, fp8, int8, int4, none)", s);
}

const char *mw_plan_tier_name(enum mw_tier_id t)
{
    return t == MW_TIER_DRAM ? "cpu" : t == MW_TIER_NVME ? "nvme" : "none"; /* DEVICE: not offloaded */
}

void mw_layout_default(struct mw_layout *l)
{
    memset(l, 0, sizeof *l);
    l->offload_optimizer = l->offload_params = MW_TIER_DEVICE; /* nothing offloaded */
    l->tp = l->pp = l->ep = l->etp = l->interleave = 1;
    l->weight = MW_DT_BF16;
    l->grad = MW_DT_BF16;
    l->master = MW_DT_FP32;
    l->moment = MW_DT_FP32;
    l->grad_accum = MW_DT_NONE;
    l->act = MW_DT_BF16;
    l->micro_batch = 1;
    l->seq = 2048;
    l->recompute = MW_RECOMPUTE_SELECTIVE;
    l->batch = 1;
    l->kv = MW_DT_BF16;
}

uint64_t mw_layout_edp(const struct mw_layout *l)
{
    uint64_t d = l->ep * l->etp;
    return d ? MW_MAX(1, l->dp * l->tp / d) : l->dp;
}

uint64_t mw_layout_microbatches(const struct mw_layout *l)
{
    uint64_t per = l->micro_batch * l->dp;
    return per ? MW_MAX(1, l->global_batch / per) : 1;
}

static uint64_t model_blocks(const struct mw_model *m)
{
    return m->n_layer + (m->arch == MW_ARCH_T5 ? m->n_dec_layer : 0);
}

int mw_layout_resolve(const struct mw_model *m, struct mw_layout *l, uint64_t gpn_default)
{
    if (!l->gpus_per_node) l->gpus_per_node = gpn_default ? gpn_default : 8;
    if (!l->tp || !l->pp || !l->ep || !l->etp || !l->interleave || !l->micro_batch || !l->seq)
        return mw_error_set(-EINVAL, "parallel degrees, micro-batch and sequence must be positive");
    if (!l->dp) {
        uint64_t mp = l->tp * l->pp;
        if (!l->gpus) l->dp = 1;
        else if (l->gpus % mp)
            return mw_error_set(-EINVAL, "%llu GPUs are not a multiple of TP %llu x PP %llu",
                                (unsigned long long)l->gpus, (unsigned long long)l->tp,
                                (unsigned long long)l->pp);
        else l->dp = l->gpus / mp;
    }
    uint64_t want = l->dp * l->tp * l->pp;
    if (l->gpus && l->gpus != want)
        return mw_error_set(-EINVAL, "DP %llu x TP %llu x PP %llu = %llu ranks, but the GPU count (gpus) is %llu",
                            (unsigned long long)l->dp, (unsigned long long)l->tp,
                            (unsigned long long)l->pp, (unsigned long long)want,
                            (unsigned long long)l->gpus);
    l->gpus = want;
    if (l->ep > 1 || l->etp > 1) {
        if (!m->n_routed_experts)
            return mw_error_set(-EINVAL, "expert parallelism (ep, etp) needs a mixture-of-experts model");
        if (m->n_routed_experts % l->ep)
            return mw_error_set(-EINVAL, "EP %llu does not divide the %llu experts",
                                (unsigned long long)l->ep, (unsigned long long)m->n_routed_experts);
        if ((l->dp * l->tp) % (l->ep * l->etp))
            return mw_error_set(-EINVAL, "EP %llu x ETP %llu must divide DP x TP = %llu",
                                (unsigned long long)l->ep, (unsigned long long)l->etp,
                                (unsigned long long)(l->dp * l->tp));
    }
    if (m->arch != MW_ARCH_BARE) {
        uint64_t L = model_blocks(m);
        if (l->pp * l->interleave > L)
            return mw_error_set(-EINVAL, "PP %llu x %llu chunks exceeds the %llu blocks",
                                (unsigned long long)l->pp, (unsigned long long)l->interleave,
                                (unsigned long long)L);
        if (m->n_head % l->tp && !m->kv_lora_rank)
            return mw_error_set(-EINVAL, "TP %llu does not divide the %llu attention heads",
                                (unsigned long long)l->tp, (unsigned long long)m->n_head);
    }
    if (l->zero < 0 || l->zero > 3) return mw_error_set(-EINVAL, "ZeRO stage must be 0..3");
    if (l->offload_params != MW_TIER_DEVICE && l->zero != 3)
        return mw_error_set(-EINVAL, "offloading parameters (offload_params) needs ZeRO stage 3 (zero 3)");
    /* Default: one micro-batch per rank, or 4 x PP per pipeline so that every stage holds
     * the activations it would in real training (peak memory needs >= PP in flight). */
    if (!l->global_batch) l->global_batch = l->micro_batch * l->dp * (l->pp > 1 ? 4 * l->pp : 1);
    if (l->global_batch % (l->micro_batch * l->dp))
        return mw_error_set(-EINVAL, "global batch %llu is not a multiple of micro-batch %llu x DP %llu",
                            (unsigned long long)l->global_batch, (unsigned long long)l->micro_batch,
                            (unsigned long long)l->dp);
    if (mw_dtype_bytes(l->weight) == 0 || mw_dtype_bytes(l->act) == 0)
        return mw_error_set(-EINVAL, "weights and activations need a dtype (not none)");
    if (!l->batch) l->batch = 1;
    return 0;
}
