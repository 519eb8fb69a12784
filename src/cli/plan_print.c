/*
 * plan_print.c — `memwall plan` output. The table is for a person at a glance: one row per
 * kind of state, one column per tier, GiB (2^30 bytes) throughout, and "<< DOES NOT FIT"
 * beside any total over its capacity. The JSON is for scripts: every size an integer number
 * of bytes, times in seconds.
 */
#include "cli/plan_print.h"
#include "memwall/common.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#define GIB 1073741824.0

static double gib(uint64_t b) { return (double)b / GIB; }

static const char *rc_name(enum mw_recompute r)
{
    return r == MW_RECOMPUTE_FULL ? "full" : r == MW_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

static void row(FILE *f, const char *name, uint64_t g, uint64_t h, uint64_t n)
{
    fprintf(f, "  %-13s %10.2f %10.2f %10.2f\n", name, gib(g), gib(h), gib(n));
}

/* DeepSpeed's offload option as its table spells it: "cpu " (padded to 4) or "none". */
static const char *ds_dev(enum mw_tier_id t) { return t == MW_TIER_DEVICE ? "none" : "cpu "; }

/* What estimate_zero{2,3}_model_states_mem_needs_all_cold prints, line for line (its "GB" are
 * GiB), then which row this plan's layout is. */
static void print_ds_table(FILE *f, const struct mw_plan_estimate *e, int plan_stage)
{
    struct mw_ds_row rows[MW_DS_MAX_ROWS];
    int n = mw_est_ds_table(e->ds_stage, &e->ds, rows);
    if (n < 0) return;
    const double nodes = e->ds.nodes ? e->ds.nodes : 1;
    fprintf(f, "\nDeepSpeed estimate_zero%d_model_states_mem_needs_all_cold (its \"GB\" are GiB):\n", e->ds_stage);
    fprintf(f, "Estimated memory needed for params, optim states and gradients for a:\n"
               "HW: Setup with %.0f %s, %.0f %s per node.\n", nodes, nodes > 1 ? "nodes" : "node", e->ds.gpus_per_node,
            e->ds.gpus_per_node > 1 ? "GPUs" : "GPU");
    if (e->ds_stage == 3)
        fprintf(f, "SW: Model with %.0fM total params, %.0fM largest layer params.\n", floor(e->ds.total_params / 1e6),
                floor(e->ds.largest_layer_params / 1e6));
    else
        fprintf(f, "SW: Model with %.0fM total params.\n", floor(e->ds.total_params / 1e6));
    fprintf(f, "  per CPU  |  per GPU |   Options\n");
    for (int i = 0; i < n; i++) {
        fprintf(f, " %7.2fGB | %6.2fGB | ", rows[i].cpu_bytes / GIB, rows[i].gpu_bytes / GIB);
        if (e->ds_stage == 3)
            fprintf(f, "offload_param=%s, offload_optimizer=%s, zero_init=%d\n", ds_dev(rows[i].offload_params),
                    ds_dev(rows[i].offload_optimizer), rows[i].zero_init);
        else
            fprintf(f, "offload_optimizer=%s\n", rows[i].offload_optimizer == MW_TIER_DEVICE ? "none" : "cpu");
    }
    const int po = e->ds.offload_params != MW_TIER_DEVICE, oo = e->ds.offload_optimizer != MW_TIER_DEVICE;
    const int nv = e->ds.offload_params == MW_TIER_NVME || e->ds.offload_optimizer == MW_TIER_NVME;
    if (e->ds_stage == 3)
        fprintf(f, "this layout: offload_param=%s, offload_optimizer=%s, zero_init=%d%s\n", po ? "cpu" : "none",
                oo ? "cpu" : "none", e->ds.zero_init, nv ? " (nvme is priced as cpu)" : "");
    else
        fprintf(f, "this layout: offload_optimizer=%s%s\n", oo ? "cpu" : "none", nv ? " (nvme is priced as cpu)" : "");
    if (plan_stage != e->ds_stage)
        fprintf(f, "(these are DeepSpeed's ZeRO-%d figures; the plan above is ZeRO-%d, as --zero asks)\n", e->ds_stage,
                plan_stage);
}

void mw_plan_print_table(FILE *f, const struct mw_model *m, const struct mw_layout *l,
                         const struct mw_hw *hw, const struct mw_plan_result *r,
                         const struct mw_plan_estimate *e)
{
    const struct mw_stage *s = &r->stage[r->worst];
    const uint64_t gpn = MW_MIN(l->gpus_per_node, l->gpus);
    fprintf(f, "memwall plan: %s, %.2f B parameters (%.2f B active per token)\n", m->name,
            (double)r->count.total / 1e9, (double)r->count.active / 1e9);
    fprintf(f, "cluster: %" PRIu64 " x %s (%.1f GiB each), %" PRIu64 " per node\n", l->gpus, hw->name,
            gib(hw->gpu_mem), gpn);
    fprintf(f, "layout:  DP %" PRIu64 " x TP %" PRIu64 " x PP %" PRIu64, l->dp, l->tp, l->pp);
    if (l->interleave > 1) fprintf(f, " (x%" PRIu64 " chunks)", l->interleave);
    if (m->n_routed_experts)
        fprintf(f, ", EP %" PRIu64 " x ETP %" PRIu64 " (expert DP %" PRIu64 ")", l->ep, l->etp, mw_layout_edp(l));
    fprintf(f, ", ZeRO-%d%s, SP %s, recompute %s\n", l->zero, l->zeropp ? "++" : "",
            l->sequence_parallel ? "on" : "off", rc_name(l->recompute));
    fprintf(f, "         weights %s, grads %s%s%s, master %s, moments 2 x %s; offload: optimizer %s, weights %s\n",
            mw_dtype_name(l->weight), mw_dtype_name(l->grad), l->grad_accum ? " + accum " : "",
            l->grad_accum ? mw_dtype_name(l->grad_accum) : "", mw_dtype_name(l->master),
            mw_dtype_name(l->moment), mw_plan_tier_name(l->offload_optimizer), mw_plan_tier_name(l->offload_params));
    fprintf(f, "         micro-batch %" PRIu64 " x %" PRIu64 " tokens, global batch %" PRIu64
            " sequences (%" PRIu64 " micro-batches per pipeline)\n",
            l->micro_batch, l->seq, l->global_batch, mw_layout_microbatches(l));
    fprintf(f, "most loaded GPU: pipeline stage %" PRIu64 " of %" PRIu64 ": %" PRIu64 " blocks",
            s->index, r->n_stages, s->n_layers);
    if (s->n_moe_layers) fprintf(f, " (%" PRIu64 " MoE)", s->n_moe_layers);
    fprintf(f, "%s%s, %.3f B parameters", s->has_embedding ? " + embedding" : "",
            s->has_head ? " + head" : "", (double)s->params / 1e9);
    if (s->params_expert) fprintf(f, " (%.3f B in experts)", (double)s->params_expert / 1e9);
    fprintf(f, ", %" PRIu64 " micro-batches in flight\n\n", s->inflight);

    fprintf(f, "  per GPU, GiB        GPU       host       NVMe\n");
    const int z3 = l->zero >= 3;
    row(f, z3 ? "weight shard" : "weights", s->gpu.params, s->host.params, s->nvme.params);
    row(f, "gradients", s->gpu.grads, s->host.grads, s->nvme.grads);
    row(f, "optimizer", s->gpu.optimizer, s->host.optimizer, s->nvme.optimizer);
    row(f, "activations", s->gpu.activations, s->host.activations, s->nvme.activations);
    if (z3) row(f, "ZeRO-3 gather", s->gathered, 0, 0);
    row(f, z3 ? "other buffers" : "buffers", s->gpu.buffers - s->gathered, s->host.buffers, s->nvme.buffers);
    if (r->kv_per_gpu) row(f, "KV cache", r->kv_per_gpu, 0, 0);
    row(f, "total", s->gpu.total + r->kv_per_gpu, s->host.total, s->nvme.total);
    fprintf(f, "  %-13s %10.2f %10.2f %10.2f\n", "capacity", gib(hw->gpu_mem), gib(hw->host_mem) / (double)gpn,
            gib(hw->nvme_bytes) / (double)gpn);
    fprintf(f, "  %-13s %10s %10s %10s\n", "", r->fits_gpu ? "fits" : "NO FIT <<", r->fits_host ? "fits" : "NO FIT <<",
            r->fits_nvme ? "fits" : "NO FIT <<");
    fprintf(f, "\nper node (%" PRIu64 " GPUs): host %.2f GiB of %.0f GiB%s, NVMe %.2f GiB of %.0f GiB%s\n", gpn,
            gib(r->host_node), gib(hw->host_mem), r->fits_host ? "" : " << DOES NOT FIT",
            gib(r->nvme_node), gib(hw->nvme_bytes), r->fits_nvme ? "" : " << DOES NOT FIT");
    if (z3) {
        const uint64_t shard = s->gpu.params + s->host.params + s->nvme.params;
        fprintf(f, "ZeRO-3 weights per GPU (%s): shard %.3f GiB (%" PRIu64 " bytes%s) + gathered %.3f GiB "
                "(%" PRIu64 " bytes: two largest units, %s %" PRIu64 " + %s %" PRIu64 " params) = %.3f GiB (%"
                PRIu64 " bytes)\n", mw_dtype_name(l->weight), gib(shard), shard,
                l->offload_params == MW_TIER_DEVICE ? "" : l->offload_params == MW_TIER_DRAM ? ", on the host" : ", on NVMe",
                gib(s->gathered), s->gathered, s->unit_name[0], s->unit_params[0], s->unit_name[1],
                s->unit_params[1], gib(shard + s->gathered), shard + s->gathered);
    }
    if (!r->fits_gpu)
        fprintf(f, "GPU: %.2f GiB needed on stage %" PRIu64 ", %.2f GiB available << DOES NOT FIT\n",
                gib(s->gpu.total + r->kv_per_gpu), s->index, gib(hw->gpu_mem));
    if (r->n_stages > 1 && r->n_stages <= 64) {
        fprintf(f, "GPU total by pipeline stage, GiB:");
        for (uint64_t i = 0; i < r->n_stages; i++)
            fprintf(f, "%s%.1f", i % 16 ? " " : "\n  ", gib(r->stage[i].gpu.total));
        fprintf(f, "\n");
    }
    const struct mw_time *t = &r->time;
    if (l->inference) fprintf(f, "\n(inference plan: weights and KV cache; no training time modelled)\n");
    else fprintf(f, "\ntime per iteration: %.3f s = compute %.3f + bubble %.3f + TP %.3f + DP %.3f + EP %.3f"
            " + PP %.3f + offload %.3f (s)\n", t->iter_s, t->compute_s, t->bubble_s, t->tp_comm_s,
            t->dp_comm_s, t->ep_comm_s, t->pp_comm_s, t->offload_s);
    if (!l->inference) {
        fprintf(f, "  MFU %.1f%%, %.0f tokens/s; %.3g model FLOPs per iteration", 100 * t->mfu, t->tokens_per_s,
                t->model_flops);
        if (t->pcie_bytes > 0) fprintf(f, "; PCIe %.2f GB per GPU", t->pcie_bytes / 1e9);
        if (t->nvme_read_bytes > 0)
            fprintf(f, "; NVMe %.2f GB read + %.2f GB written per node", t->nvme_read_bytes / 1e9,
                    t->nvme_write_bytes / 1e9);
        fprintf(f, " (per iteration; GB = 10^9 bytes)\n");
    }
    if (l->context) {
        fprintf(f, "\nKV cache (%s): %.1f KiB per token; %.2f GiB for %" PRIu64 " tokens x batch %" PRIu64
                "; %.2f GiB per GPU at TP %" PRIu64 "\n", mw_dtype_name(l->kv), (double)r->kv_bytes_per_token / 1024,
                gib(r->kv_total), l->context, l->batch, gib(r->kv_per_gpu), l->tp);
    }
    if (e && e->ds_stage) print_ds_table(f, e, l->zero);
    if (e && e->name && strcmp(e->name, "none"))
        fprintf(f, "\nestimator %s: %.2f GiB per GPU, %.2f GiB per node on the CPU side "
                "(DeepSpeed and accelerate print GiB as \"GB\")\n", e->name, e->gpu_bytes / GIB, e->cpu_bytes / GIB);
}

/* A JSON string body: names come from file paths, so escape quotes, backslashes, controls. */
static const char *jstr(const char *in, char *out, size_t n)
{
    size_t o = 0;
    for (; *in && o + 7 < n; in++) {
        unsigned char ch = (unsigned char)*in;
        if (ch == '"' || ch == '\\') { out[o++] = '\\'; out[o++] = (char)ch; }
        else if (ch < 0x20) o += (size_t)snprintf(out + o, n - o, "\\u%04x", ch);
        else out[o++] = (char)ch;
    }
    out[o] = 0;
    return out;
}

static void tier_json(FILE *f, const char *name, const struct mw_plan_tier_bytes *t, uint64_t extra, int last)
{
    fprintf(f, "    \"%s\": {\"params\": %" PRIu64 ", \"grads\": %" PRIu64 ", \"optimizer\": %" PRIu64
            ", \"activations\": %" PRIu64 ", \"buffers\": %" PRIu64 ", \"total\": %" PRIu64 "}%s\n",
            name, t->params, t->grads, t->optimizer, t->activations, t->buffers + extra, t->total + extra,
            last ? "" : ",");
}

void mw_plan_print_json(FILE *f, const struct mw_model *m, const struct mw_layout *l,
                        const struct mw_hw *hw, const struct mw_plan_result *r,
                        const struct mw_plan_estimate *e)
{
    const struct mw_stage *s = &r->stage[r->worst];
    const struct mw_time *t = &r->time;
    char name[256];
    fprintf(f, "{\n  \"model\": {\"name\": \"%s\", \"params_total\": %" PRIu64 ", \"params_active\": %" PRIu64
            ", \"largest_layer\": %" PRIu64 ", \"layers\": %" PRIu64 ", \"hidden\": %" PRIu64 "},\n",
            jstr(m->name, name, sizeof name), r->count.total, r->count.active, r->count.largest_layer, m->n_layer, m->hidden);
    fprintf(f, "  \"layout\": {\"gpus\": %" PRIu64 ", \"gpus_per_node\": %" PRIu64 ", \"dp\": %" PRIu64
            ", \"tp\": %" PRIu64 ", \"pp\": %" PRIu64 ", \"ep\": %" PRIu64 ", \"etp\": %" PRIu64
            ", \"edp\": %" PRIu64 ", \"interleave\": %" PRIu64 ", \"sequence_parallel\": %s, \"zero\": %d"
            ", \"offload_optimizer\": \"%s\", \"offload_params\": \"%s\", \"weight_dtype\": \"%s\""
            ", \"grad_dtype\": \"%s\", \"master_dtype\": \"%s\", \"moment_dtype\": \"%s\""
            ", \"micro_batch\": %" PRIu64 ", \"seq\": %" PRIu64 ", \"global_batch\": %" PRIu64
            ", \"recompute\": \"%s\"},\n",
            l->gpus, MW_MIN(l->gpus_per_node, l->gpus), l->dp, l->tp, l->pp, l->ep, l->etp, mw_layout_edp(l),
            l->interleave, l->sequence_parallel ? "true" : "false", l->zero, mw_plan_tier_name(l->offload_optimizer),
            mw_plan_tier_name(l->offload_params), mw_dtype_name(l->weight), mw_dtype_name(l->grad),
            mw_dtype_name(l->master), mw_dtype_name(l->moment), l->micro_batch, l->seq, l->global_batch,
            rc_name(l->recompute));
    fprintf(f, "  \"hardware\": {\"name\": \"%s\", \"gpu_bytes\": %" PRIu64 ", \"host_bytes_per_node\": %" PRIu64
            ", \"nvme_bytes_per_node\": %" PRIu64 "},\n", hw->name, hw->gpu_mem, hw->host_mem, hw->nvme_bytes);
    fprintf(f, "  \"per_device\": {\n    \"stage\": %" PRIu64 ", \"layers\": %" PRIu64 ", \"params_on_device\": %" PRIu64
            ", \"params_expert\": %" PRIu64 ",\n", s->index, s->n_layers, s->params, s->params_expert);
    if (l->zero >= 3) {
        const uint64_t shard = s->gpu.params + s->host.params + s->nvme.params;
        fprintf(f, "    \"zero3\": {\"shard_bytes\": %" PRIu64 ", \"gathered_bytes\": %" PRIu64
                ", \"total_bytes\": %" PRIu64 ", \"largest_unit\": \"%s\", \"largest_unit_params\": %" PRIu64
                ", \"second_unit\": \"%s\", \"second_unit_params\": %" PRIu64 "},\n", shard, s->gathered,
                shard + s->gathered, s->unit_name[0], s->unit_params[0], s->unit_name[1], s->unit_params[1]);
    }
    tier_json(f, "gpu", &s->gpu, r->kv_per_gpu, 0);
    tier_json(f, "host", &s->host, 0, 0);
    tier_json(f, "nvme", &s->nvme, 0, 1);
    fprintf(f, "  },\n  \"per_node\": {\"host\": %" PRIu64 ", \"nvme\": %" PRIu64 "},\n", r->host_node, r->nvme_node);
    fprintf(f, "  \"fits\": {\"gpu\": %s, \"host\": %s, \"nvme\": %s},\n", r->fits_gpu ? "true" : "false",
            r->fits_host ? "true" : "false", r->fits_nvme ? "true" : "false");
    fprintf(f, "  \"stages\": [");
    for (uint64_t i = 0; i < r->n_stages; i++)
        fprintf(f, "%s{\"layers\": %" PRIu64 ", \"params\": %" PRIu64 ", \"gpu_total\": %" PRIu64 "}",
                i ? ", " : "", r->stage[i].n_layers, r->stage[i].params, r->stage[i].gpu.total);
    fprintf(f, "],\n");
    fprintf(f, "  \"time\": {\"iter_s\": %.6g, \"compute_s\": %.6g, \"bubble_s\": %.6g, \"tp_comm_s\": %.6g"
            ", \"dp_comm_s\": %.6g, \"ep_comm_s\": %.6g, \"pp_comm_s\": %.6g, \"offload_s\": %.6g"
            ", \"model_flops\": %.6g, \"mfu\": %.4f, \"tokens_per_s\": %.6g, \"pcie_bytes\": %.0f"
            ", \"nvme_read_bytes\": %.0f, \"nvme_write_bytes\": %.0f, \"dp_bytes\": %.0f}",
            t->iter_s, t->compute_s, t->bubble_s, t->tp_comm_s, t->dp_comm_s, t->ep_comm_s, t->pp_comm_s,
            t->offload_s, t->model_flops, t->mfu, t->tokens_per_s, t->pcie_bytes, t->nvme_read_bytes,
            t->nvme_write_bytes, t->dp_bytes);
    if (l->context)
        fprintf(f, ",\n  \"kv_cache\": {\"bytes_per_token\": %" PRIu64 ", \"total\": %" PRIu64 ", \"per_gpu\": %" PRIu64
                ", \"context\": %" PRIu64 ", \"batch\": %" PRIu64 "}", r->kv_bytes_per_token, r->kv_total,
                r->kv_per_gpu, l->context, l->batch);
    if (e && e->name && strcmp(e->name, "none")) {
        fprintf(f, ",\n  \"estimator\": {\"name\": \"%s\", \"gpu_bytes\": %.0f, \"cpu_bytes\": %.0f", e->name,
                e->gpu_bytes, e->cpu_bytes);
        struct mw_ds_row rows[MW_DS_MAX_ROWS];
        int n = e->ds_stage ? mw_est_ds_table(e->ds_stage, &e->ds, rows) : -1;
        if (n > 0) {
            fprintf(f, ", \"stage\": %d, \"options\": [", e->ds_stage);
            for (int i = 0; i < n; i++) {
                fprintf(f, "%s{\"offload_param\": \"%s\", \"offload_optimizer\": \"%s\"", i ? ", " : "",
                        rows[i].offload_params == MW_TIER_DEVICE ? "none" : "cpu",
                        rows[i].offload_optimizer == MW_TIER_DEVICE ? "none" : "cpu");
                if (rows[i].zero_init >= 0) fprintf(f, ", \"zero_init\": %d", rows[i].zero_init);
                fprintf(f, ", \"gpu_bytes\": %.0f, \"cpu_bytes\": %.0f}", rows[i].gpu_bytes, rows[i].cpu_bytes);
            }
            fprintf(f, "]");
        }
        fprintf(f, "}");
    }
    fprintf(f, "\n}\n");
}

void mw_plan_print_search(FILE *f, const struct mw_model *m, const struct mw_hw *hw,
                          const struct mw_search_hit *hits, int n, int json)
{
    if (json) {
        char name[256];
        fprintf(f, "{\"model\": \"%s\", \"hardware\": \"%s\", \"layouts\": [", jstr(m->name, name, sizeof name),
                hw->name);
        for (int i = 0; i < n; i++) {
            const struct mw_layout *l = &hits[i].layout;
            fprintf(f, "%s\n  {\"dp\": %" PRIu64 ", \"tp\": %" PRIu64 ", \"pp\": %" PRIu64 ", \"ep\": %" PRIu64
                    ", \"zero\": %d, \"offload_optimizer\": \"%s\", \"offload_params\": \"%s\", \"recompute\": \"%s\""
                    ", \"micro_batch\": %" PRIu64 ", \"gpu_bytes\": %" PRIu64 ", \"host_bytes_per_node\": %" PRIu64
                    ", \"iter_s\": %.6g}", i ? "," : "", l->dp, l->tp, l->pp, l->ep, l->zero,
                    mw_plan_tier_name(l->offload_optimizer), mw_plan_tier_name(l->offload_params), rc_name(l->recompute),
                    l->micro_batch, hits[i].gpu_total, hits[i].host_node, hits[i].iter_s);
        }
        fprintf(f, "\n]}\n");
        return;
    }
    if (!n) {
        fprintf(f, "memwall plan --search: no layout of %s fits on these %s GPUs\n", m->name, hw->name);
        return;
    }
    const struct mw_layout *l0 = &hits[0].layout;
    fprintf(f, "memwall plan --search: %s on %" PRIu64 " x %s, global batch %" PRIu64 " x %" PRIu64
            " tokens; fastest first\n\n", m->name, l0->gpus, hw->name, l0->global_batch, l0->seq);
    fprintf(f, "   #   DP  TP  PP  EP ZeRO opt-off  par-off recompute  mb  GPU GiB host GiB/node  iter s\n");
    for (int i = 0; i < n; i++) {
        const struct mw_layout *l = &hits[i].layout;
        fprintf(f, "%4d %4" PRIu64 " %3" PRIu64 " %3" PRIu64 " %3" PRIu64 " %4d %-7s %-7s %-9s %3" PRIu64
                " %8.2f %13.2f %7.3f\n", i + 1, l->dp, l->tp, l->pp, l->ep, l->zero,
                mw_plan_tier_name(l->offload_optimizer), mw_plan_tier_name(l->offload_params), rc_name(l->recompute),
                l->micro_batch, gib(hits[i].gpu_total), gib(hits[i].host_node), hits[i].iter_s);
    }
}
