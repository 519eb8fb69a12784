/*
 * time.c — a per-iteration time model: compute from FLOPs, plus what communication and the
 * offload schedule add on top of it.
 *
 * Compute: Narayanan et al. 2021 count model FLOPs as 3 x (2 x matmul parameters + attention
 * 2 x s x (d_qk + d_v) x heads per block) per token — 72Bslh^2(1 + s/6h + V/12lh) for GPT.
 * Recomputation adds a forward (full) or the attention core's forward (selective); the
 * hardware runs at peak x efficiency. Pipeline fill/drain adds (PP-1)/(micro-batches x
 * chunks) of that.
 * Communication: TP moves 4 activation-sized collectives per block per micro-batch (6 with
 * full recomputation), ring factor 2(t-1)/t, on NVLink when the TP group fits in a node;
 * DP moves 2x the gradient shard (ZeRO-0/1/2) or 3x per micro-batch (ZeRO-3) (ZeRO paper
 * Sec. 7) and hides behind the backward pass (2/3 of compute); EP moves 4 all-to-alls of the
 * routed tokens per MoE block, not overlapped (DualPipe-style overlap would hide them); PP sends one activation each way per micro-batch and chunk,
 * split over the TP ranks (Narayanan et al.'s scatter/gather).
 * Offload: the optimizer step runs after the backward pass, pipelined over sub-groups, so it
 * costs the slowest of PCIe (gradients down, weights up), CPU AdamW and NVMe (read and write
 * master + moments); offloaded ZeRO-3 weights are fetched every micro-batch, forward and
 * backward, and hide behind compute.
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "plan/internal.h"

#include <math.h>

static double attn_width(const struct mw_model *m)
{
    if (m->kv_lora_rank) return (double)m->n_head * (double)(m->qk_nope_dim + m->qk_rope_dim + m->v_head_dim);
    return 2.0 * (double)(m->n_head * m->head_dim);
}

double mw_time_model_flops(const struct mw_model *m, double seq, double tokens)
{
    double pm = (double)mw_model_matmul_params(m);
    double attn = m->arch == MW_ARCH_BARE ? 0 : 2.0 * (double)mw_plan_blocks_(m) * seq * attn_width(m);
    return 3.0 * tokens * (2.0 * pm + attn);
}

double mw_time_training_days(double tokens, double params, double gpus, double x, int recompute)
{
    return (recompute ? 8.0 : 6.0) * tokens * params / (gpus * x) / 86400.0;
}

double mw_time_bw_efficiency(double ait, double bw, double peak)
{
    return ait * bw / (ait * bw + peak);
}

double mw_time_dp_volume_factor(int zero, int zeropp, double n, int exact_ring)
{
    double f = zero >= 3 ? (zeropp ? 0.75 : 3.0) : 2.0;
    return exact_ring && n > 0 ? f * (n - 1) / n : f;
}

void mw_time_compute(const struct mw_model *m, const struct mw_layout *l, const struct mw_hw *hw,
                     const struct mw_plan_result *r, struct mw_time *t)
{
    const double N = (double)l->gpus, gpn = (double)MW_MIN(l->gpus_per_node, l->gpus);
    const double seq = (double)l->seq, tokens = (double)(l->global_batch * l->seq);
    const double nmb = (double)mw_layout_microbatches(l);
    const double e = mw_dtype_bytes(l->act), h = (double)m->hidden, T = seq * (double)l->micro_batch;
    const struct mw_stage *s = &r->stage[r->worst];
    const double tpd = (double)l->tp;

    t->model_flops = mw_time_model_flops(m, seq, tokens);
    t->hw_flops = t->model_flops;
    if (l->recompute == MW_RECOMPUTE_FULL) t->hw_flops += t->model_flops / 3;
    else if (l->recompute == MW_RECOMPUTE_SELECTIVE && m->arch != MW_ARCH_BARE)
        t->hw_flops += tokens * 2.0 * (double)mw_plan_blocks_(m) * seq * attn_width(m);
    t->compute_s = t->hw_flops / (N * hw->peak_flops * hw->efficiency);
    t->bubble_s = t->compute_s * (double)(l->pp - 1) / (nmb * (double)l->interleave);

    /* Tensor parallel. */
    const double layers = m->arch == MW_ARCH_BARE ? 0 : (double)s->n_layers;
    if (l->tp > 1) {
        double ncoll = l->recompute == MW_RECOMPUTE_FULL ? 6 : 4;
        double bytes = layers * nmb * ncoll * 2 * (tpd - 1) / tpd * T * h * e;
        t->tp_comm_s = bytes / (l->tp <= l->gpus_per_node ? hw->intra_bw : hw->inter_bw);
    }
    /* Data parallel (and expert data parallel). */
    const double edp = (double)mw_layout_edp(l), dp = (double)l->dp;
    const double gb = mw_dtype_bytes(l->grad);
    double dpb = 0;
    if (dp > 1) dpb += (double)s->params_dense * gb * mw_time_dp_volume_factor(l->zero, l->zeropp, dp, 1);
    if (edp > 1) dpb += (double)s->params_expert * gb * mw_time_dp_volume_factor(l->zero, l->zeropp, edp, 1);
    if (l->zero >= 3) dpb *= nmb;
    t->dp_bytes = dpb;
    double dp_bw = l->tp * l->dp <= l->gpus_per_node ? hw->intra_bw : hw->inter_bw;
    t->dp_comm_s = fmax(0, dpb / dp_bw - t->compute_s * 2 / 3);
    /* Expert parallel all-to-all: of the (EP-1)/EP of routed tokens that leave the rank, those
     * for EP ranks on the same node use NVLink, the rest the network, concurrently. */
    if (l->ep > 1 && s->n_moe_layers) {
        double ncoll = l->recompute == MW_RECOMPUTE_FULL ? 6 : 4, ep = (double)l->ep;
        double local = fmin(ep, fmax(1, gpn / tpd));           /* EP ranks per node */
        double bytes = (double)s->n_moe_layers * nmb * ncoll * T * (double)m->experts_per_tok * h * e;
        double intra = bytes * (local - 1) / ep, inter = bytes * (ep - local) / ep;
        t->ep_comm_s = fmax(intra / hw->intra_bw, inter / hw->inter_bw);
    }
    /* Pipeline point-to-point. */
    if (l->pp > 1) {
        /* Each TP rank sends 1/t of the boundary activation (SP, or Megatron's scatter/gather). */
        double bytes = 2 * nmb * (double)l->interleave * T * h * e / tpd;
        t->pp_comm_s = bytes / (l->tp * l->dp < l->gpus_per_node ? hw->intra_bw : hw->inter_bw);
    }
    /* Offload schedule. */
    const double shard = (double)mw_cdiv_(s->params_dense, l->dp) + (double)mw_cdiv_(s->params_expert, mw_layout_edp(l));
    const double w = mw_dtype_bytes(l->weight);
    const double opt_b = mw_dtype_bytes(l->master) + 2 * mw_dtype_bytes(l->moment);
    double step = 0, fetch = 0;
    if (l->offload_optimizer != MW_TIER_DEVICE) {
        double pcie = shard * (gb + w);
        t->pcie_bytes += pcie;
        double t_pcie = pcie / hw->pcie_bw;
        double t_adam = gpn * shard / hw->cpu_adam;
        double t_nvme = 0;
        if (l->offload_optimizer == MW_TIER_NVME) {
            t->nvme_read_bytes += gpn * shard * opt_b;
            t->nvme_write_bytes += gpn * shard * opt_b;
            t_nvme = gpn * shard * opt_b / hw->nvme_read + gpn * shard * opt_b / hw->nvme_write;
        }
        step = fmax(t_pcie, fmax(t_adam, t_nvme));
    }
    if (l->offload_params != MW_TIER_DEVICE) {
        double bytes = 2 * nmb * shard * w;
        t->pcie_bytes += bytes;
        double tf = bytes / hw->pcie_bw;
        if (l->offload_params == MW_TIER_NVME) {
            t->nvme_read_bytes += gpn * bytes;
            t->nvme_write_bytes += gpn * shard * w;
            tf = fmax(tf, gpn * bytes / hw->nvme_read);
        }
        fetch = fmax(0, tf - t->compute_s);
    }
    t->offload_s = step + fetch;
    t->iter_s = t->compute_s + t->bubble_s + t->tp_comm_s + t->dp_comm_s + t->ep_comm_s +
                t->pp_comm_s + t->offload_s;
    t->mfu = t->iter_s > 0 ? t->model_flops / (N * hw->peak_flops * t->iter_s) : 0;
    t->tokens_per_s = t->iter_s > 0 ? tokens / t->iter_s : 0;
}
