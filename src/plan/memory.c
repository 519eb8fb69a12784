/*
 * memory.c — bytes per rank on each tier (GPU, host, NVMe) by kind of state.
 *
 * Every pipeline rank is computed, because the most loaded one is not always the first:
 * with DeepSeek-V3 on PP16 the middle ranks hold four MoE blocks while rank 0 holds three
 * dense ones. Blocks are placed as Megatron does with uneven counts: ceil(L / chunks) per
 * virtual chunk, the last chunk taking the remainder (DeepSeek-V3 PP16: 4,4,...,4,1), and
 * virtual chunk v of V = PP*interleave lives on rank v % PP.
 *
 * ZeRO shards non-expert state over DP and expert state over the expert-data-parallel group
 * EDP = DP*TP/(EP*ETP): stage 1 the optimizer (fp32 master + moments), stage 2 also the
 * gradients, stage 3 also the weights. Shared experts are data-parallel like dense weights
 * and split over ETP, as Zhang & Su and Megatron-Core count them. ZeRO-3's gathered working
 * set is the rank's two largest units (zero3.c): the embedding often outweighs a block.
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "plan/internal.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

#define blocks mw_plan_blocks_
#define cdiv mw_cdiv_

void mw_plan_stage_layers(const struct mw_model *m, const struct mw_layout *l, uint64_t stage,
                          uint64_t chunk, uint64_t *first, uint64_t *count)
{
    uint64_t L = blocks(m), V = l->pp * l->interleave, v = chunk * l->pp + stage;
    uint64_t per = cdiv(L, V);
    if ((V - 1) * per < L) { /* ceil placement leaves no chunk empty */
        *first = MW_MIN(L, v * per);
        *count = MW_MIN(L, (v + 1) * per) - *first;
    } else {                 /* balanced: the first L % V chunks get one more */
        uint64_t base = L / V, extra = L % V;
        *first = v * base + MW_MIN(v, extra);
        *count = base + (v < extra);
    }
}

int mw_plan_block_params_(const struct mw_model *m, const struct mw_layout *l, uint64_t layer,
                          uint64_t *dense, uint64_t *expert)
{
    struct mw_layer_params lp;
    mw_model_layer_params(m, layer, &lp);
    *dense = cdiv(lp.attn_tp, l->tp) + lp.attn_rep + cdiv(lp.mlp_tp, l->tp) + lp.mlp_rep + lp.norms +
             lp.router + cdiv(lp.shared, l->etp);
    *expert = lp.n_routed ? lp.n_routed / l->ep * cdiv(lp.expert, l->etp) : 0;
    return lp.n_routed != 0;
}

uint64_t mw_plan_embed_params_(const struct mw_model *m, const struct mw_layout *l)
{
    return cdiv((m->vocab + m->type_vocab) * m->hidden, l->tp) + m->max_pos * m->hidden;
}

uint64_t mw_plan_head_params_(const struct mw_model *m, const struct mw_layout *l)
{
    return (!m->tied_embeddings || l->pp > 1) ? cdiv(m->vocab * m->hidden, l->tp) : 0;
}

uint64_t mw_plan_final_params_(const struct mw_model *m)
{
    const uint64_t h = m->hidden;
    uint64_t fnorm = m->norm == MW_NORM_LAYER ? 2 * h : m->norm == MW_NORM_RMS ? h : 0;
    if (m->arch == MW_ARCH_T5) fnorm = 2 * (fnorm + m->rel_buckets * m->n_head);
    if (m->arch == MW_ARCH_BERT) fnorm += h * h + h;
    return fnorm;
}

void mw_plan_stage_params(const struct mw_model *m, const struct mw_layout *l, uint64_t stage,
                          struct mw_stage *s)
{
    memset(s, 0, sizeof *s);
    s->index = stage;
    if (m->arch == MW_ARCH_BARE) { /* no shapes: everything divides over TP and PP */
        s->params_dense = cdiv(m->bare_params, l->tp * l->pp);
        s->params = s->params_dense;
        s->has_embedding = stage == 0;
        s->has_head = stage == l->pp - 1;
        return;
    }
    for (uint64_t c = 0; c < l->interleave; c++) {
        uint64_t first, count;
        mw_plan_stage_layers(m, l, stage, c, &first, &count);
        for (uint64_t i = first; i < first + count; i++) {
            uint64_t dense, expert;
            s->n_layers++;
            s->n_moe_layers += (uint64_t)mw_plan_block_params_(m, l, i, &dense, &expert);
            s->params_dense += dense;
            s->params_expert += expert;
        }
    }
    /* Embedding (vocab-parallel) and learned positions (replicated) on rank 0; the head on
     * the last rank, which also keeps a copy of a tied embedding when PP > 1. */
    if (stage == 0) {
        s->has_embedding = 1;
        s->params_dense += mw_plan_embed_params_(m, l);
    }
    if (stage == l->pp - 1) {
        s->has_head = 1;
        s->params_dense += mw_plan_head_params_(m, l) + mw_plan_final_params_(m);
    }
    s->params = s->params_dense + s->params_expert;
}

static void tier_add(struct mw_plan_tier_bytes *t)
{
    t->total = t->params + t->grads + t->optimizer + t->activations + t->buffers;
}

static struct mw_plan_tier_bytes *tier_of(struct mw_stage *s, enum mw_tier_id t)
{
    return t == MW_TIER_DRAM ? &s->host : t == MW_TIER_NVME ? &s->nvme : &s->gpu;
}

/* Offload staging: NVMe swaps go through pinned host buffers of two sub-groups of 2^27
 * parameters (in and out), capped at the shard. Gradient reduce buckets hold 2^28 bytes. */
#define MW_SUBGROUP_PARAMS (1ull << 27)
#define MW_GRAD_BUCKET_BYTES (1ull << 28)

static void stage_memory(const struct mw_layout *l, struct mw_stage *s)
{
    const double w = mw_dtype_bytes(l->weight);
    const int train = !l->inference;
    const double g = train ? mw_dtype_bytes(l->grad) : 0, ga = train ? mw_dtype_bytes(l->grad_accum) : 0;
    const double ms = train ? mw_dtype_bytes(l->master) : 0, mo = train ? 2 * mw_dtype_bytes(l->moment) : 0;
    const uint64_t dp = l->dp, edp = mw_layout_edp(l);
    const uint64_t D = s->params_dense, E = s->params_expert;
    const double shard = (double)cdiv(D, dp) + (double)cdiv(E, edp), full = (double)(D + E);

    /* Weights: under ZeRO-3 the shard, plus the unit in use and the one prefetched on the
     * GPU (the two largest units bound them); NVMe-offloaded weights also pass through pinned
     * host buffers of that size. */
    double pbytes = (l->zero >= 3 ? shard : full) * w;
    const uint64_t work = (uint64_t)((double)(s->unit_params[0] + s->unit_params[1]) * w);
    tier_of(s, l->offload_params)->params += (uint64_t)pbytes;
    if (l->zero >= 3) {
        s->gathered = work;
        s->gpu.buffers += work;
    }
    if (l->offload_params == MW_TIER_NVME) s->host.buffers += work;

    /* Gradients: the shard goes where the optimizer steps; without ZeRO-2 the GPU keeps them
     * all until the reduce. */
    double gshard = (l->zero >= 2 ? shard : full) * g;
    if (!train) {
        /* inference: no gradients */
    } else if (l->offload_optimizer == MW_TIER_DEVICE) {
        s->gpu.grads += (uint64_t)gshard;
    } else {
        s->host.grads += (uint64_t)(shard * g);
        if (l->zero >= 2) s->gpu.buffers += (uint64_t)MW_MIN(gshard, (double)MW_GRAD_BUCKET_BYTES);
        else s->gpu.grads += (uint64_t)(full * g);
    }

    /* Optimizer: fp32 master + two moments. The fp32 gradient copy (Megatron's main_grad,
     * DeepSpeed's fp32 partition) belongs to the optimizer: sharded from ZeRO-1 on, kept on
     * the optimizer's tier, reported as gradients. */
    double n_opt = l->zero >= 1 ? shard : full;
    tier_of(s, l->offload_optimizer)->grads += (uint64_t)(n_opt * ga);
    s->opt_master = (uint64_t)(n_opt * ms);
    s->opt_moments = (uint64_t)(n_opt * mo);
    tier_of(s, l->offload_optimizer)->optimizer += s->opt_master + s->opt_moments;
    if (train && l->offload_optimizer == MW_TIER_NVME)
        s->host.buffers += (uint64_t)(2 * MW_MIN(n_opt, (double)MW_SUBGROUP_PARAMS) * (ms + mo));

    s->gpu.activations = s->act_layers + s->act_other;
    tier_add(&s->gpu);
    tier_add(&s->host);
    tier_add(&s->nvme);
}

int mw_plan_compute(const struct mw_model *m, const struct mw_layout *lin, const struct mw_hw *hw,
                    struct mw_plan_result *r)
{
    memset(r, 0, offsetof(struct mw_plan_result, stage));
    struct mw_layout lv = *lin;
    struct mw_layout *l = &lv;
    int err = mw_model_validate(m);
    if (err) return err;
    err = mw_layout_resolve(m, l, hw ? hw->gpus_per_node : 0);
    if (err) return err;
    if (l->pp > MW_PLAN_MAX_STAGES)
        return mw_error_set(-EINVAL, "at most %d pipeline stages", MW_PLAN_MAX_STAGES);
    mw_model_count(m, &r->count);
    r->n_stages = l->pp;
    uint64_t worst_host = 0, worst_nvme = 0;
    for (uint64_t st = 0; st < l->pp; st++) {
        struct mw_stage *s = &r->stage[st];
        mw_plan_stage_params(m, l, st, s);
        mw_plan_stage_units_(m, l, s);
        mw_plan_stage_act_(m, l, s);
        stage_memory(l, s);
        if (s->gpu.total > r->stage[r->worst].gpu.total) r->worst = st;
        worst_host = MW_MAX(worst_host, s->host.total);
        worst_nvme = MW_MAX(worst_nvme, s->nvme.total);
    }
    const uint64_t gpn = MW_MIN(l->gpus_per_node, l->gpus);
    r->host_node = worst_host * gpn;
    r->nvme_node = worst_nvme * gpn;
    if (l->context) {
        r->kv_bytes_per_token = mw_kv_bytes_per_token(m, l->kv);
        r->kv_total = r->kv_bytes_per_token * l->context * l->batch;
        /* One rank of the pipeline stage with the most blocks. */
        uint64_t most = 0;
        for (uint64_t st = 0; st < l->pp; st++) most = MW_MAX(most, r->stage[st].n_layers);
        uint64_t L = m->arch == MW_ARCH_T5 ? m->n_dec_layer : m->n_layer; /* blocks with a cache */
        if (L) r->kv_per_gpu = mw_kv_bytes_per_token_rank(m, l->kv, l->tp) / L * MW_MIN(most, L) *
                               l->context * l->batch;
    }
    if (hw) {
        r->fits_gpu = r->stage[r->worst].gpu.total + r->kv_per_gpu <= hw->gpu_mem;
        r->fits_host = r->host_node <= hw->host_mem;
        r->fits_nvme = r->nvme_node <= hw->nvme_bytes;
        if (!l->inference) mw_time_compute(m, l, hw, r, &r->time);
    } else {
        r->fits_gpu = r->fits_host = r->fits_nvme = 1;
    }
    return 0;
}
