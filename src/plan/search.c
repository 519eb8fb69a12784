/*
 * search.c — `memwall plan --search`: every layout of the cluster that fits, fastest first.
 *
 * The space is the product of TP (powers of two up to a node), PP (divisors of the rest, up
 * to the block count), EP (divisors of the experts that divide DP x TP), ZeRO 0-3, the five
 * offload choices (none; optimizer on cpu or nvme; optimizer and weights on cpu or nvme with
 * ZeRO-3), recomputation and micro-batch 1..8; options the user fixed stay fixed. ZeRO-2/3
 * with PP > 1 is skipped (DeepSpeed refuses it; Megatron's distributed optimizer is ZeRO-1). The
 * global batch (tokens per iteration) is held constant so iteration times compare. A layout
 * fits when its most loaded GPU stays under 95% of the GPU's memory (the rest is the CUDA
 * context and allocator slack) and host and NVMe fit per node.
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "plan/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct { enum mw_tier_id opt, par; int min_zero; } offloads[] = {
    {MW_TIER_DEVICE, MW_TIER_DEVICE, 0}, {MW_TIER_DRAM, MW_TIER_DEVICE, 1}, {MW_TIER_NVME, MW_TIER_DEVICE, 1},
    {MW_TIER_DRAM, MW_TIER_DRAM, 3}, {MW_TIER_NVME, MW_TIER_NVME, 3},
};

/* Keeps hits[0..*n) sorted by iteration time, at most max of them. */
static void insert(struct mw_search_hit *hits, int *n, int max, const struct mw_search_hit *h)
{
    if (*n == max && hits[max - 1].iter_s <= h->iter_s) return;
    int i = *n < max ? (*n)++ : max - 1;
    while (i > 0 && hits[i - 1].iter_s > h->iter_s) { hits[i] = hits[i - 1]; i--; }
    hits[i] = *h;
}

int mw_plan_search(const struct mw_model *m, const struct mw_layout *base, unsigned fix,
                   const struct mw_hw *hw, struct mw_search_hit *hits, int max)
{
    if (!hw) return mw_error_set(-EINVAL, "a layout search needs a hardware profile (hw)");
    if (max <= 0) return 0;
    const uint64_t G = base->gpus ? base->gpus : base->dp * base->tp * base->pp;
    if (!G) return mw_error_set(-EINVAL, "a layout search needs the GPU count (gpus)");
    const uint64_t gpn = base->gpus_per_node ? base->gpus_per_node : hw->gpus_per_node;
    const uint64_t L = m->arch == MW_ARCH_BARE ? 1 : mw_plan_blocks_(m);
    const uint64_t gbatch = base->global_batch ? base->global_batch : G;
    struct mw_plan_result *r = malloc(sizeof *r);
    if (!r) return mw_error_set(-ENOMEM, "out of memory");
    int n = 0;
    const double cap = 0.95 * (double)hw->gpu_mem;
    for (uint64_t tp = 1; tp <= MW_MIN(gpn, G); tp *= 2) {
        if ((fix & MW_FIX_TP) && tp != base->tp) continue;
        if (G % tp) continue;
        for (uint64_t pp = 1; pp <= MW_MIN(L, G / tp); pp++) {
            if ((fix & MW_FIX_PP) && pp != base->pp) continue;
            if ((G / tp) % pp) continue;
            uint64_t dp = G / (tp * pp);
            for (uint64_t ep = 1; ep <= (m->n_routed_experts ? m->n_routed_experts : 1); ep++) {
                if ((fix & MW_FIX_EP) && ep != base->ep) continue;
                if (m->n_routed_experts && (m->n_routed_experts % ep || (dp * tp) % (ep * base->etp)))
                    continue;
                for (int z = 0; z <= 3; z++) {
                    if ((fix & MW_FIX_ZERO) && z != base->zero) continue;
                    if (pp > 1 && z >= 2) continue; /* no framework pipelines ZeRO-2/3 */
                    for (size_t o = 0; o < sizeof offloads / sizeof offloads[0]; o++) {
                        if ((fix & MW_FIX_OFFLOAD) && (offloads[o].opt != base->offload_optimizer ||
                                                       offloads[o].par != base->offload_params))
                            continue;
                        if (z < offloads[o].min_zero) continue;
                        for (int rc = MW_RECOMPUTE_NONE; rc <= MW_RECOMPUTE_FULL; rc++) {
                            if ((fix & MW_FIX_RECOMPUTE) && rc != (int)base->recompute) continue;
                            for (uint64_t mb = 1; mb <= 8; mb *= 2) {
                                if ((fix & MW_FIX_MICRO) && mb != base->micro_batch) continue;
                                if (gbatch % (mb * dp)) continue;
                                struct mw_layout l = *base;
                                l.gpus = G; l.gpus_per_node = gpn;
                                l.tp = tp; l.pp = pp; l.dp = dp; l.ep = ep;
                                l.zero = z; l.offload_optimizer = offloads[o].opt;
                                l.offload_params = offloads[o].par;
                                l.recompute = (enum mw_recompute)rc;
                                l.micro_batch = mb; l.global_batch = gbatch;
                                if (l.interleave > 1 && pp * l.interleave > L) l.interleave = 1;
                                if (mw_plan_compute(m, &l, hw, r)) continue;
                                const struct mw_stage *s = &r->stage[r->worst];
                                if ((double)(s->gpu.total + r->kv_per_gpu) > cap || !r->fits_host ||
                                    !r->fits_nvme)
                                    continue;
                                struct mw_search_hit h = { l, r->time.iter_s, s->gpu.total, r->host_node };
                                insert(hits, &n, max, &h);
                            }
                        }
                    }
                }
            }
        }
    }
    free(r);
    mw_error_clear();
    return n;
}
