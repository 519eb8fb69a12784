/*
 * memwall/plan.h — the planner: what fits where, and how fast, before a run.
 *
 * Pure arithmetic over three inputs: a model (built-in zoo, a Hugging Face config.json, or a
 * bare parameter count), a layout (DP/TP/PP/EP/ETP degrees, ZeRO stage, offload tiers, dtypes,
 * batch shape, recomputation) and a hardware profile. Size first, then decide: the runtime
 * uses the same numbers to budget its tiers, and `memwall plan` prints them.
 *
 * Units: parameter counts are elements (uint64_t); sizes are bytes; times are seconds (double);
 * rates are per second. Every per-device figure is for one GPU rank; per-node figures say so.
 *
 * Usage:
 *     struct mw_model m; struct mw_layout l;
 *     struct mw_plan_result *r = malloc(sizeof *r);  // large: one entry per pipeline stage
 *     mw_model_lookup("llama-3-70b", &m);            // or mw_model_from_config_file(path, &m)
 *     mw_layout_default(&l); l.gpus = 8; l.tp = 8; l.zero = 1;
 *     l.offload_optimizer = MW_TIER_NVME;
 *     if (mw_plan_compute(&m, &l, mw_hw_lookup("h100"), r) == 0)
 *         ... r->stage[r->worst].gpu.total, r->host_node, r->time.iter_s ...
 *
 * Conventions reproduced from published sources are documented where they are used
 * (docs/plan.md lists them): Korthikanti et al. for activations, Zhang & Su for DeepSeek
 * sharding, DeepSpeed / accelerate / Megatron for their estimators.
 */
#ifndef MEMWALL_PLAN_H
#define MEMWALL_PLAN_H

#include <stdint.h>

#include "memwall/common.h"
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- models ---------------------------------------------------------------------------- */

enum mw_arch {
    MW_ARCH_BARE = 0, /* only a parameter count (--params) */
    MW_ARCH_GPT,      /* GPT-2 / Megatron GPT: learned positions, LayerNorm, GeLU MLP */
    MW_ARCH_LLAMA,    /* Llama / Mistral / Qwen2 / Mixtral: RoPE, RMSNorm, SwiGLU, GQA */
    MW_ARCH_DEEPSEEK, /* DeepSeek-V2/V3: MLA attention, shared + routed experts */
    MW_ARCH_T5,       /* encoder-decoder (for the DeepSpeed estimator examples) */
    MW_ARCH_BERT,     /* encoder with pooler (for the accelerate estimator example) */
};

enum mw_norm { MW_NORM_NONE = 0, MW_NORM_LAYER, MW_NORM_RMS };

struct mw_model {
    char name[64];
    enum mw_arch arch;
    uint64_t n_layer;        /* transformer blocks (T5: encoder blocks) */
    uint64_t n_dec_layer;    /* T5 decoder blocks */
    uint64_t hidden;         /* model width h */
    uint64_t n_head;         /* query heads a */
    uint64_t n_kv_head;      /* key/value heads (GQA); == n_head for MHA */
    uint64_t head_dim;       /* q/k/v width per head (non-MLA) */
    uint64_t ffn;            /* dense MLP inner width */
    uint64_t vocab;          /* embedding rows (already padded if the framework pads) */
    uint64_t max_pos;        /* learned absolute position rows; 0 = rotary/relative */
    uint64_t type_vocab;     /* BERT token-type rows */
    uint64_t rel_buckets;    /* T5 relative-attention buckets (per stack) */
    int gated_mlp;           /* 3 matrices (SwiGLU/GeGLU) instead of 2 */
    enum mw_norm norm;       /* per-block norm kind (2 per block) and final norm */
    int bias_linear;         /* every linear has a bias (GPT-2, BERT) */
    int bias_qkv;            /* only q/k/v have biases (Qwen2) */
    int tied_embeddings;     /* LM head shares the input embedding */
    /* Mixture of experts (n_routed_experts == 0: dense). */
    uint64_t n_routed_experts, n_shared_experts, experts_per_tok;
    uint64_t moe_ffn;        /* inner width of one expert */
    uint64_t first_k_dense;  /* leading dense blocks (DeepSeek first_k_dense_replace) */
    uint64_t moe_layer_freq; /* after those, every k-th block is MoE (1 = all) */
    int router_bias;         /* per-expert score-correction bias (DeepSeek-V3) */
    /* Multi-head latent attention (kv_lora_rank == 0: ordinary attention). */
    uint64_t q_lora_rank;    /* 0 = plain q_proj (DeepSeek-V2-Lite) */
    uint64_t kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    uint64_t n_mtp_layers;   /* DeepSeek-V3 multi-token-prediction blocks (checkpoint only) */
    uint64_t buffer_bytes;   /* non-parameter buffers a framework loads with the weights */
    /* MW_ARCH_BARE */
    uint64_t bare_params;    /* total parameters */
    uint64_t bare_largest;   /* largest single layer (0 = unknown) */
};

/* Parameter counts of one model, all in elements. */
struct mw_param_count {
    uint64_t total;          /* every trainable parameter (MTP excluded) */
    uint64_t active;         /* used per token: dense + shared + top-k routed experts */
    uint64_t embedding;      /* token (+type) embedding rows */
    uint64_t position;       /* learned position embedding */
    uint64_t head;           /* untied LM head (0 when tied) */
    uint64_t vectors;        /* 1-D parameters: norms and biases (nanoGPT's "non-decayed") */
    uint64_t largest_layer;  /* largest single module's own parameters (DeepSpeed's "largest layer") */
    uint64_t dense_layer;    /* one dense block (0 if none) */
    uint64_t moe_layer;      /* one MoE block (0 if none) */
    uint64_t attn_layer;     /* attention of one block, incl. its norms (MLA: q_a/kv_a norms) */
    uint64_t expert;         /* one routed expert */
    uint64_t n_dense_layers, n_moe_layers;
};

/* One transformer block split by how parallelism shards it (elements). */
struct mw_layer_params {
    uint64_t attn_tp;        /* split over tensor parallel */
    uint64_t attn_rep;       /* replicated over TP (MLA down-projections, W_QR, W_KR, row biases) */
    uint64_t mlp_tp;         /* dense MLP, split over TP */
    uint64_t mlp_rep;        /* dense MLP row-parallel bias */
    uint64_t norms;          /* block norms incl. MLA's, replicated */
    uint64_t expert;         /* one routed expert (split over ETP) */
    uint64_t n_routed;       /* routed experts in this block (0 = dense) */
    uint64_t shared;         /* all shared experts of the block (split over ETP) */
    uint64_t router;         /* router weight + bias, replicated */
    uint64_t total;          /* all of the above, unsharded */
};

/* DeepSeek-V3-style FP8 checkpoint element counts (fp8 linears + f32 128x128 block scales). */
struct mw_ckpt_count { uint64_t fp8, bf16, f32, total; };

int mw_model_lookup(const char *name, struct mw_model *m);          /* -ENOENT if unknown */
/* The zoo's names, NULL-terminated (for --help and error messages). */
const char *const *mw_model_names(void);
/* Parse a Hugging Face config.json; MW_EFORMAT (message set) on malformed input. */
int mw_model_from_config_file(const char *path, struct mw_model *m);
int mw_model_from_config_json(const char *text, const char *name, struct mw_model *m);
void mw_model_bare(struct mw_model *m, uint64_t params, uint64_t largest_layer);
/* Checks the shape is usable (heads divide width, ...). */
int mw_model_validate(const struct mw_model *m);

int mw_model_is_moe_layer(const struct mw_model *m, uint64_t layer);
void mw_model_layer_params(const struct mw_model *m, uint64_t layer, struct mw_layer_params *lp);
void mw_model_count(const struct mw_model *m, struct mw_param_count *c);
/* Elements in the published FP8 checkpoint (MTP blocks, duplicated embeddings, scales). */
void mw_model_checkpoint_count(const struct mw_model *m, struct mw_ckpt_count *c);
/* Parameters multiplied in matmuls per token (active experts only, LM head included). */
uint64_t mw_model_matmul_params(const struct mw_model *m);

/* ---- layouts ----------------------------------------------------------------------------- */

enum mw_dtype { MW_DT_NONE = 0, MW_DT_FP32, MW_DT_BF16, MW_DT_FP16, MW_DT_FP8, MW_DT_INT8, MW_DT_INT4 };
/* Offload targets are core's enum mw_tier_id (memwall/common.h): DEVICE = not offloaded ("none"),
 * DRAM = "cpu", NVME = "nvme" (DeepSpeed's words, mw_plan_tier_name). */
enum mw_recompute { MW_RECOMPUTE_NONE = 0, MW_RECOMPUTE_SELECTIVE, MW_RECOMPUTE_FULL };
/* Which activation formula: DETAILED generalizes Korthikanti et al. Table 2 to GQA, SwiGLU,
 * MLA and MoE (identical to it for GPT shapes); CLASSIC applies the paper's GPT constants
 * (34sbh + 5as^2b per block) to any model, as the Ultra-Scale Playbook does; ZERO is the
 * ZeRO paper's 12*h*b*s elements per block; ZERO_INFINITY is (16h + 2as)*b*s elements. */
enum mw_act_model { MW_ACT_DETAILED = 0, MW_ACT_CLASSIC, MW_ACT_ZERO, MW_ACT_ZERO_INFINITY };

double mw_dtype_bytes(enum mw_dtype d);  /* 0.5 for int4, 0 for none */
const char *mw_dtype_name(enum mw_dtype d);
int mw_dtype_parse(const char *s, enum mw_dtype *d); /* -EINVAL */
const char *mw_plan_tier_name(enum mw_tier_id t);

struct mw_layout {
    uint64_t gpus;           /* total ranks (0 = dp*tp*pp) */
    uint64_t gpus_per_node;  /* ranks sharing one host (0 = the hardware profile's) */
    uint64_t dp, tp, pp;     /* data, tensor, pipeline parallel degrees (0 = derive dp) */
    uint64_t ep, etp;        /* expert and expert-tensor parallel degrees */
    uint64_t interleave;     /* virtual pipeline chunks per rank (1 = none) */
    int sequence_parallel;   /* shard the TP-replicated activations over TP */
    int zero;                /* ZeRO stage 0..3 (stage 1 = Megatron's distributed optimizer) */
    int zeropp;              /* ZeRO++ (qwZ+hpZ+qgZ) communication */
    enum mw_tier_id offload_optimizer, offload_params;
    enum mw_dtype weight, grad, master, moment;
    enum mw_dtype grad_accum;/* extra gradient-accumulation buffer (none or fp32) */
    enum mw_dtype act;       /* activation dtype (2 bytes in every published formula) */
    uint64_t micro_batch;    /* sequences per micro-batch per rank */
    uint64_t seq;            /* tokens per sequence */
    uint64_t global_batch;   /* sequences per iteration, all ranks (0 = micro_batch*dp, x 4pp if pp > 1) */
    enum mw_recompute recompute;
    enum mw_act_model act_model;
    /* Inference KV cache (context == 0: not planned). */
    int inference;           /* weights + KV cache only: no gradients, optimizer, activations */
    uint64_t context, batch;
    enum mw_dtype kv;
};

void mw_layout_default(struct mw_layout *l);
/* Fills the derived degrees (dp from gpus, gpus from degrees) and checks divisibility. */
int mw_layout_resolve(const struct mw_model *m, struct mw_layout *l, uint64_t gpus_per_node_default);
/* Expert-data-parallel degree: ranks holding the same expert shard = dp*tp/(ep*etp). */
uint64_t mw_layout_edp(const struct mw_layout *l);
uint64_t mw_layout_microbatches(const struct mw_layout *l); /* per pipeline, per iteration */

/* ---- hardware ---------------------------------------------------------------------------- */

struct mw_hw {
    char name[32];
    double peak_flops;       /* dense bf16/fp16 FLOP/s per GPU */
    double efficiency;       /* fraction of peak large GEMMs reach */
    uint64_t gpu_mem;        /* bytes per GPU */
    uint64_t gpus_per_node;
    double intra_bw;         /* collective bus bandwidth inside a node, bytes/s per GPU */
    double inter_bw;         /* collective bandwidth across nodes, bytes/s per GPU */
    double pcie_bw;          /* host<->GPU, bytes/s per GPU, each direction */
    uint64_t host_mem;       /* bytes of DRAM per node */
    double cpu_adam;         /* parameters/s the node's CPUs update (AdamW) */
    double nvme_read, nvme_write; /* bytes/s per node */
    uint64_t nvme_bytes;     /* NVMe capacity per node */
};
const struct mw_hw *mw_hw_lookup(const char *name); /* NULL if unknown */
const char *const *mw_hw_names(void);
/* Overrides host fields from a calibration JSON written by `memwall bench` (keys in
 * docs/plan.md). Returns 0, -errno or MW_EFORMAT. */
int mw_hw_load_host_profile(const char *path, struct mw_hw *hw);

/* ---- results ----------------------------------------------------------------------------- */

struct mw_plan_tier_bytes {
    uint64_t params, grads, optimizer, activations;
    uint64_t buffers;        /* working sets: gathered ZeRO-3 layer, offload staging, buckets */
    uint64_t total;
};

/* One GPU rank of a pipeline stage (all TP/DP/EP ranks of a stage hold the same amounts). */
struct mw_stage {
    uint64_t index;
    uint64_t n_layers, n_moe_layers;
    int has_embedding, has_head;
    uint64_t params_dense;   /* non-expert parameters on this rank after TP (elements) */
    uint64_t params_expert;  /* expert parameters after EP/ETP */
    uint64_t params;         /* the sum: what this rank computes with */
    struct mw_plan_tier_bytes gpu, host, nvme;
    uint64_t opt_master;     /* bytes of fp32 master copy held for this rank (any tier) */
    uint64_t opt_moments;    /* bytes of Adam moments held for this rank (any tier) */
    uint64_t act_layers;     /* activation bytes of the transformer blocks */
    uint64_t act_other;      /* embedding and output-layer activations */
    uint64_t act_per_layer;  /* one block, one micro-batch (dense block, or MoE if all MoE) */
    uint64_t inflight;       /* micro-batches whose activations the rank holds */
    /* ZeRO-3 gathers each unit of weights whole (after TP/EP) just before use and prefetches
     * the next one, so at most two units are live: the planner holds the two largest units
     * of this rank. Units: the embedding (token rows + learned positions, first stage), each
     * block, the final norm and an untied (or, with PP > 1, copied tied) head (last stage). */
    uint64_t unit_params[2]; /* largest, second-largest unit on this rank (elements) */
    const char *unit_name[2];/* "embedding", "block", "final norm", "head", "largest layer" or "" */
    uint64_t gathered;       /* bytes of the two gathered units under ZeRO-3 (part of gpu.buffers) */
};

struct mw_time {
    double model_flops;      /* per iteration, Narayanan et al. (no recompute) */
    double hw_flops;         /* incl. recomputation */
    double compute_s;        /* hardware FLOPs / (gpus * peak * efficiency) */
    double bubble_s;         /* pipeline fill/drain */
    double tp_comm_s, dp_comm_s, ep_comm_s, pp_comm_s; /* exposed communication */
    double offload_s;        /* exposed PCIe/NVMe/CPU-Adam time of the offload schedule */
    double pcie_bytes;       /* per GPU per iteration, both directions */
    double nvme_read_bytes, nvme_write_bytes; /* per node per iteration */
    double dp_bytes;         /* data-parallel traffic per GPU per iteration */
    double iter_s;
    double mfu;              /* model FLOPs / (gpus * peak * iter_s) */
    double tokens_per_s;
};

#define MW_PLAN_MAX_STAGES 1024

struct mw_plan_result {
    struct mw_param_count count;
    uint64_t n_stages;
    uint64_t worst;          /* index of the rank with the largest GPU total */
    uint64_t host_node;      /* host bytes per node (worst rank * gpus per node) */
    uint64_t nvme_node;      /* NVMe bytes per node */
    int fits_gpu, fits_host, fits_nvme;
    struct mw_time time;
    /* KV cache (layout.context > 0) */
    uint64_t kv_bytes_per_token; /* whole model, one token */
    uint64_t kv_total;           /* context * batch tokens, whole model */
    uint64_t kv_per_gpu;         /* one TP rank of one pipeline stage (worst) */
    struct mw_stage stage[MW_PLAN_MAX_STAGES]; /* [n_stages]; last, so only the used part is cleared */
};

/* Per-rank memory for every pipeline stage, time, and KV cache. hw may be NULL (no time,
 * no fit checks). The result is large (per-stage array): allocate it, don't put it on a
 * small stack. */
int mw_plan_compute(const struct mw_model *m, const struct mw_layout *l, const struct mw_hw *hw,
                    struct mw_plan_result *r);
/* Layer range [first, first+count) of virtual chunk c on pipeline rank `stage`. */
void mw_plan_stage_layers(const struct mw_model *m, const struct mw_layout *l, uint64_t stage,
                          uint64_t chunk, uint64_t *first, uint64_t *count);
/* Parameters on one rank (elements): dense (after TP) and expert (after EP/ETP). */
void mw_plan_stage_params(const struct mw_model *m, const struct mw_layout *l, uint64_t stage,
                          struct mw_stage *s);

/* ---- ZeRO-3 weights of memwall's GPT-2 (zero3.c) ----------------------------------------- */

/* Peak weight memory of one rank of `memwall train --zero 3` over `ranks` data-parallel
 * ranks (TP = PP = 1). Computed by mw_plan_compute for a GPT model of these dims (wte [Vp, C],
 * wpe [maxT, C], biases everywhere, tied head), so `memwall plan` prints the same numbers
 * for the same config.json, --gpus and --weight-dtype. */
struct mw_plan_zero3_weights {
    uint64_t params;              /* whole model (elements); equals mw_gpt2_num_params() */
    uint64_t largest_unit_params; /* elements; for GPT-2 the embedding (wte + wpe) */
    uint64_t second_unit_params;  /* elements; for GPT-2 one block (12C^2 + 13C) */
    const char *largest_unit, *second_unit; /* their names ("embedding", "block", ...) */
    uint64_t shard_bytes;         /* ceil(params / ranks) x weight bytes: this rank's shard */
    uint64_t gathered_bytes;      /* (largest + second) x weight bytes: gathered + prefetched */
    uint64_t total_bytes;         /* shard + gathered */
};
/* weight_bytes: 4 (fp32), 2 (bf16), 1 (fp8) or 0.5 (int4). -EINVAL (message set) on sizes the
 * planner rejects (non-positive, n_embd % n_head). */
int mw_plan_gpt2_zero3_weights(int n_layer, int n_embd, int n_head, int padded_vocab, int max_seq,
                               int ranks, double weight_bytes, struct mw_plan_zero3_weights *out);
/* The same for any model the planner describes (a family's config_describe: GPT-2, Llama, ...):
 * `memwall train --zero 3` prints this for the model it trains. -EINVAL (message set) on a
 * description the planner rejects or ranks <= 0. */
int mw_plan_zero3_weights(const struct mw_model *m, int ranks, double weight_bytes,
                          struct mw_plan_zero3_weights *out);

/* ---- streamed training on the CPU (stream.c) --------------------------------------------- */

/* `memwall train --offload-params nvme`: weights, gradients and the optimizer state on NVMe,
 * a weight unit at a time in DRAM. The trainer prints this plan before its first step and
 * refuses a --dram-budget below its total; `memwall plan --stream` prints the same. */
struct mw_plan_stream_in {
    int n_layer, n_embd, padded_vocab, max_seq; /* GPT-2 shape (memwall's layout) */
    int grad_accum;               /* micro-batches per step (> 1, batch-major: the gradients stay resident) */
    int layer_major;              /* the step's micro-batches go through the model unit by unit */
    int overlap;                  /* the optimizer step runs behind the next forward pass */
    int wrap_micro;               /* with grad_accum > 1, batch-major: the look-ahead at the end of a
                                     backward pass runs on into the next micro-batch's forward */
    int prefetch_depth;           /* units fetched ahead of use */
    int lead_by_size;             /* larger units fetched further ahead (mw_plan_stream_leads) */
    int keep_grads;               /* batch-major: every step's gradients stay in DRAM (the whole array,
                                     at every position, as with accumulation) */
    int keep_tied;                /* a unit used twice in the forward (a tied embedding and head) stays
                                     resident between its two uses */
    uint64_t subgroup_size;       /* elements per optimizer subgroup (the engine's, after rounding) */
    int buffer_count;             /* optimizer staging buffers */
    uint64_t acts_bytes;          /* the model's activation allocation (mw_gpt2_sizes), plus layer-major's
                                     saved micro-batches (mw_gpt2_lm_bytes) */
    uint64_t staging_bytes;       /* the optimizer's staging buffers (its plan) */
    uint64_t runtime_bytes;       /* the process before the model: code, libraries, thread stacks */
    /* Data parallel over MPI (0 on one rank): the gradient bytes a rank holds through a pass (its
     * ZeRO stage decides: the whole array for stages 0-1, the owned shard plus the buckets being
     * reduced for 2-3) and its collectives' whole-shard buffers (receive, accumulate). */
    uint64_t dp_grads_bytes, dp_buffer_bytes;
    /* Another family's units (the model table's, memwall/model.h), NULL: GPT-2's from the shape
     * above. unit_n[n_layer + 2]: elements of each unit in flat order (0 the embedding, 1..L the
     * blocks, L+1 the final norm with an untied head); order[n_fwd + n_bwd]: the units a forward
     * then a backward pass acquire (mw_net_unit_order); tied: the forward ends on the embedding
     * again (the head), whose gradient then takes the head's share. */
    const uint64_t *unit_n;
    const int *order;
    int n_fwd, n_bwd, tied;
};
struct mw_plan_stream {
    uint64_t params;              /* elements */
    uint64_t subgroup_size;       /* elements */
    uint64_t weights_peak;        /* bytes of weight subgroups resident at once, at most */
    int weights_peak_unit;        /* the unit in use then */
    uint64_t grads_peak;          /* bytes of gradient subgroups resident during a pass, at most */
    uint64_t step_grads;          /* bytes of gradients read back during the optimizer step */
    uint64_t passes;              /* weights + gradients at the worst moment of a pass (<= the sum
                                     of the two peaks, which come at different moments) */
    uint64_t acts, staging, runtime; /* bytes, as given */
    uint64_t dp_buffers;          /* bytes, as given (dp_buffer_bytes) */
    uint64_t total;               /* runtime + acts + staging + dp_buffers + max(passes, step_grads) */
};
int mw_plan_stream_dram(const struct mw_plan_stream_in *in, struct mw_plan_stream *out);
/* The weight unit at position p of a training pass of an L-block GPT-2 (units: 0 embeddings,
 * 1..L blocks, L+1 ln_f), -1 past its end: forward 0, 1..L, L+1, 0 (the tied head); backward
 * (batch-major) 0, L+1, L..1, or (layer-major) L..1, 0. The trainer's stream walks the same. */
int mw_plan_stream_unit(int L, int layer_major, int p);
/* How far ahead of its use each of n units is fetched (positions of the schedule), when larger
 * units lead by their size: depth x ceil(n[u] / the median unit), at most MW_PLAN_LEAD_MAX x
 * depth. A read of a unit k times the typical one then has about k times the compute of the
 * typical unit to hide behind (a vocabulary-sized tied head: 9 blocks' worth at Qwen2.5-0.5B).
 * The streamed trainer's look-ahead (src/train/units.c) and this plan both use it. */
#define MW_PLAN_LEAD_MAX 4
void mw_plan_stream_leads(const uint64_t *n, int nu, int depth, int *lead);

/* ---- activations (activations.c) --------------------------------------------------------- */

/* Bytes one block keeps for backward for one micro-batch on one rank. */
uint64_t mw_act_layer_bytes(const struct mw_model *m, const struct mw_layout *l, uint64_t layer);
/* Korthikanti et al. Table 2 per-block bytes for a GPT block (s, b, h, a, t). */
double mw_act_korthikanti(double s, double b, double h, double a, double t, int sp,
                          enum mw_recompute rc);

/* ---- KV cache (kv.c) --------------------------------------------------------------------- */

uint64_t mw_kv_bytes_per_token(const struct mw_model *m, enum mw_dtype kv);
/* Bytes per token on one TP rank: KV heads split over TP (replicated when tp > kv heads),
 * MLA's latent cache replicated. */
uint64_t mw_kv_bytes_per_token_rank(const struct mw_model *m, enum mw_dtype kv, uint64_t tp);

/* ---- estimators (estimators.c) ----------------------------------------------------------- */

enum mw_ds_version { MW_DS_CURRENT = 0, MW_DS_LEGACY /* before DeepSpeed PR #5099 (2024) */ };

struct mw_ds_input {
    double total_params, largest_layer_params;
    double gpus_per_node, nodes;
    double buffer_factor;    /* additional_buffer_factor, 1.5 */
    enum mw_tier_id offload_params, offload_optimizer; /* NONE or CPU (nvme is priced as cpu) */
    int zero_init;
    enum mw_ds_version version;
};
/* estimate_zero3_model_states_mem_needs / estimate_zero2_...: bytes per GPU and per node. */
void mw_est_ds_zero3(const struct mw_ds_input *in, double *gpu_bytes, double *cpu_bytes);
void mw_est_ds_zero2(const struct mw_ds_input *in, double *gpu_bytes, double *cpu_bytes);
/* DeepSpeed's estimate_zero{2,3}_model_states_mem_needs_all_cold table: every option it prints,
 * in its order, from total/largest params, GPUs per node and nodes of `in` (its offload and
 * zero_init fields are ignored). ZeRO-3: offload_param/offload_optimizer cpu+cpu, none+cpu,
 * none+none, each with zero_init 1 then 0 (6 rows); ZeRO-2: offload_optimizer cpu, none (2 rows,
 * zero_init -1; in->version picks the no-offload formula). Bytes truncated as DeepSpeed's int().
 * Returns the row count, or -EINVAL for another stage. */
struct mw_ds_row {
    enum mw_tier_id offload_params, offload_optimizer; /* NONE or CPU */
    int zero_init;                                       /* 1, 0; -1 for ZeRO-2 rows */
    double gpu_bytes, cpu_bytes;                         /* per GPU; per node ("per CPU") */
};
#define MW_DS_MAX_ROWS 6
int mw_est_ds_table(int stage, const struct mw_ds_input *in, struct mw_ds_row rows[MW_DS_MAX_ROWS]);

/* accelerate estimate-memory: load size and Adam training peak at a dtype. */
struct mw_accel_usage { double largest, total, train; double model, gradients, optimizer, step; };
void mw_est_accelerate(double params, double buffer_bytes, double largest_layer, enum mw_dtype d,
                       struct mw_accel_usage *u);

/* Megatron-LM report_theoretical_memory (weights+optimizer and activations, bytes). */
struct mw_megatron_est {
    double shard_params;     /* "parameters in most loaded shard" */
    double total_params;
    double weight_optimizer; /* bytes */
    double activation;       /* bytes (no-SP path) */
    double per_layer;        /* bytes per block, precise */
};
void mw_est_megatron(const struct mw_model *m, const struct mw_layout *l, int distributed_optimizer,
                     struct mw_megatron_est *e);

/* ---- time (time.c) ----------------------------------------------------------------------- */

/* Narayanan et al. model FLOPs per iteration for `tokens` tokens. */
double mw_time_model_flops(const struct mw_model *m, double seq, double tokens);
/* End-to-end training days: 8TP/(nX) with recomputation, 6TP/(nX) without. */
double mw_time_training_days(double tokens, double params, double gpus, double flops_per_gpu,
                             int recompute);
/* ZeRO-Infinity's efficiency of a transfer: ait*bw / (ait*bw + peak). */
double mw_time_bw_efficiency(double ait, double bw, double peak);
/* Data-parallel traffic per GPU per iteration, in units of the gradient/param shard bytes:
 * 2 for DDP and ZeRO-1/2, 3 for ZeRO-3; ring exactness (N-1)/N when exact_ring. With
 * zeropp, the cross-node volume of ZeRO-3 under ZeRO++ (0.75). */
double mw_time_dp_volume_factor(int zero, int zeropp, double n, int exact_ring);
void mw_time_compute(const struct mw_model *m, const struct mw_layout *l, const struct mw_hw *hw,
                     const struct mw_plan_result *r, struct mw_time *t);

/* ---- search and emit --------------------------------------------------------------------- */

struct mw_search_hit { struct mw_layout layout; double iter_s; uint64_t gpu_total, host_node; };
/* Layouts over gpus that fit hw, fastest first. Options the caller fixed (fixed_mask bits,
 * MW_FIX_*) are kept. Returns the number of hits written (<= max), or a negative error. */
enum { MW_FIX_TP = 1, MW_FIX_PP = 2, MW_FIX_EP = 4, MW_FIX_ZERO = 8, MW_FIX_OFFLOAD = 16,
       MW_FIX_RECOMPUTE = 32, MW_FIX_MICRO = 64 };
int mw_plan_search(const struct mw_model *m, const struct mw_layout *base, unsigned fixed_mask,
                   const struct mw_hw *hw, struct mw_search_hit *hits, int max);

/* A Kubernetes pod `resources:` block (plus /dev/shm volume) for one node of the plan. */
void mw_plan_emit_k8s(const struct mw_plan_result *r, const struct mw_layout *l,
                      const struct mw_hw *hw, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
