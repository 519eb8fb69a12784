/*
 * estimators.c — other tools' memory estimators, reproduced to the printed digit, because
 * users compare memwall's plan with them and should see where (and why) the numbers differ.
 *
 * - DeepSpeed estimate_zero3_model_states_mem_needs and estimate_zero2_... (per GPU and
 *   per node; additional_buffer_factor 1.5). ZeRO-2 without offload changed in DeepSpeed
 *   PR #5099 (2024) from 4P + 16P/N to 2P + 18P/N on the GPU; MW_DS_LEGACY gives the old
 *   formula, which is what the published docs print.
 * - accelerate estimate-memory: parameters and buffers at the dtype, Adam training = 4x.
 * - Megatron-LM report_theoretical_memory: its parameter formula (LayerNorm-sized norms, no
 *   biases, no position embedding), 18 bytes/param or 6 + 12/DP with the distributed
 *   optimizer, and the no-SP activation formula of its GPT-2 XL log.
 * All arithmetic is in double, as the Python originals compute it; int() truncations are
 * kept where the originals have them. mw_est_ds_table lists every option of DeepSpeed's
 * *_all_cold table in its order, so `memwall plan --estimator` can print what DeepSpeed prints.
 */
#include "memwall/plan.h"
#include "memwall/common.h"

#include <errno.h>
#include <math.h>

void mw_est_ds_zero3(const struct mw_ds_input *in, double *gpu, double *cpu)
{
    const double P = in->total_params, L = in->largest_layer_params;
    const double gpn = in->gpus_per_node, nodes = in->nodes ? in->nodes : 1;
    const double N = gpn * nodes, gf = 1.0 / nodes, abf = in->buffer_factor ? in->buffer_factor : 1.5;
    const double largest = 4 * L;
    if (in->offload_optimizer != MW_TIER_DEVICE) {
        if (in->offload_params != MW_TIER_DEVICE) {
            *gpu = largest;
            *cpu = in->zero_init ? P * 18 * gf * abf : P * fmax(4 * gpn, 18 * gf) * abf;
        } else {
            *gpu = largest + floor(2 * P / N);
            *cpu = in->zero_init ? P * 16 * gf * abf : P * fmax(4 * gpn, 16 * gf) * abf;
        }
    } else {
        *gpu = largest + floor(18 * P / N);
        *cpu = in->zero_init ? L * 4 * gpn * abf : P * 4 * gpn * abf;
    }
}

void mw_est_ds_zero2(const struct mw_ds_input *in, double *gpu, double *cpu)
{
    const double P = in->total_params;
    const double gpn = in->gpus_per_node, nodes = in->nodes ? in->nodes : 1;
    const double N = gpn * nodes, abf = in->buffer_factor ? in->buffer_factor : 1.5;
    if (in->offload_optimizer != MW_TIER_DEVICE) {
        *gpu = 2 * P;
        *cpu = P * fmax(4 * N, 16) * abf;
    } else {
        *gpu = in->version == MW_DS_LEGACY ? 4 * P + floor(16 * P / N) : 2 * P + floor(18 * P / N);
        *cpu = P * 4 * gpn * abf;
    }
}

int mw_est_ds_table(int stage, const struct mw_ds_input *in, struct mw_ds_row rows[MW_DS_MAX_ROWS])
{
    if (stage != 2 && stage != 3) return mw_error_set(-EINVAL, "DeepSpeed's estimators are for ZeRO stages 2 and 3, not %d", stage);
    struct mw_ds_input x = *in;
    int n = 0;
    if (stage == 2) {
        static const enum mw_tier_id opt[2] = {MW_TIER_DRAM, MW_TIER_DEVICE};
        for (int i = 0; i < 2; i++, n++) {
            x.offload_params = MW_TIER_DEVICE;
            x.offload_optimizer = opt[i];
            mw_est_ds_zero2(&x, &rows[n].gpu_bytes, &rows[n].cpu_bytes);
            rows[n].offload_params = MW_TIER_DEVICE;
            rows[n].offload_optimizer = opt[i];
            rows[n].zero_init = -1;
        }
    } else {
        /* DeepSpeed's loops: optimizer offload (cpu, none) x param offload (cpu, none), param
         * offload without optimizer offload skipped, x zero_init (1, 0). */
        static const enum mw_tier_id combo[3][2] = {
            {MW_TIER_DRAM, MW_TIER_DRAM}, {MW_TIER_DEVICE, MW_TIER_DRAM}, {MW_TIER_DEVICE, MW_TIER_DEVICE}};
        for (int c = 0; c < 3; c++)
            for (int zi = 1; zi >= 0; zi--, n++) {
                x.offload_params = combo[c][0];
                x.offload_optimizer = combo[c][1];
                x.zero_init = zi;
                mw_est_ds_zero3(&x, &rows[n].gpu_bytes, &rows[n].cpu_bytes);
                rows[n].offload_params = combo[c][0];
                rows[n].offload_optimizer = combo[c][1];
                rows[n].zero_init = zi;
            }
    }
    for (int i = 0; i < n; i++) { /* DeepSpeed returns int(cpu_mem), int(gpu_mem) */
        rows[i].gpu_bytes = floor(rows[i].gpu_bytes);
        rows[i].cpu_bytes = floor(rows[i].cpu_bytes);
    }
    return n;
}

void mw_est_accelerate(double params, double buffer_bytes, double largest_layer, enum mw_dtype d,
                       struct mw_accel_usage *u)
{
    const double div = 4 / mw_dtype_bytes(d == MW_DT_NONE ? MW_DT_FP32 : d);
    const double F = params * 4 + buffer_bytes; /* the model loaded in fp32 */
    u->largest = largest_layer * 4 / div;
    u->total = F / div;
    u->train = 4 * u->total;
    /* estimate_training_usage: fp32 keeps weights, grads, two moments, and a step peak of
     * 4x; fp16/bf16 mixed precision keeps fp32 weights, grads in both precisions, and the
     * step peaks at the optimizer's 2x. */
    u->model = F;
    u->optimizer = 2 * F;
    if (d == MW_DT_FP16 || d == MW_DT_BF16) {
        u->gradients = F + F / 2;
        u->step = 2 * F;
    } else {
        u->gradients = F;
        u->step = 4 * F;
    }
}

void mw_est_megatron(const struct mw_model *m, const struct mw_layout *l, int distopt,
                     struct mw_megatron_est *e)
{
    const double h = (double)m->hidden, L = (double)m->n_layer;
    const double tp = (double)(l->tp ? l->tp : 1), pp = (double)(l->pp ? l->pp : 1);
    const double dp = (double)(l->dp ? l->dp : 1);
    /* Vocabulary padded to a multiple of 128 * TP, as Megatron pads it. */
    const double mult = 128 * tp, V = ceil((double)m->vocab / mult) * mult;
    const double gated = m->gated_mlp ? 1.5 : 1.0;
    const double heads = (double)m->n_head, kv = (double)(m->n_kv_head ? m->n_kv_head : m->n_head);
    const double qratio = heads * (double)m->head_dim / h;
    const double ffn = (double)(m->n_routed_experts ? m->moe_ffn * m->experts_per_tok : m->ffn);
    double layers = 2 * L * h * h * ((1 + kv / heads) * qratio + ffn / h * gated + 2 / h) + 2 * h;
    double emb = h * V;
    e->total_params = layers + (m->tied_embeddings ? emb : 2 * emb);
    e->shard_params = (layers / pp + emb) / tp;
    if (!m->tied_embeddings && pp == 1) e->shard_params += emb / tp;
    e->weight_optimizer = e->shard_params * (distopt ? 6 + 12 / dp : 18);

    const double s = (double)l->seq, b = (double)l->micro_batch, sbh = s * b * h;
    e->per_layer = sbh * (10 + 24 / tp);
    double act = L * e->per_layer + 8 * s * b * pp + sbh * pp;
    if (pp == 1) act += 2 * (s * b * V / tp + sbh);
    e->activation = act * 1.05;
}
