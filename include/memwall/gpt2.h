/*
 * memwall/gpt2.h — the GPT-2 family on the CPU: forward, backward, safetensors.
 *
 * Why this shape of API: the offload engine owns the optimizer state and streams it from
 * DRAM/NVMe, so the model exposes exactly what the engine needs and nothing more:
 *  - ONE flat fp32 parameter array and ONE flat fp32 gradient array of the same layout,
 *    described by a tensor table in a fixed registration order (HF GPT-2 names, shapes,
 *    element offsets). The engine flattens its state in that order and cuts it into subgroups.
 *  - a grad-ready callback during backward: layer by layer in reverse order, the model says
 *    "elements [first, first+n) of the gradient array are final for this micro-batch", so the
 *    engine can start updating those subgroups while backward continues.
 *  - byte sizes of params / grads / activations, computable before anything is allocated
 *    (size first, then allocate), so they can be registered with the memory tiers.
 *
 * Architecture: learned positional embeddings, pre-LayerNorm blocks, GELU (tanh approximation),
 * causal multi-head self-attention, tied input/output embeddings, biases everywhere; exactly HF
 * "gpt2". All matrix products go through OpenBLAS cblas_sgemm; everything else is OpenMP with a
 * fixed partitioning, so results are bitwise reproducible run to run (same binary, same thread
 * count) — no atomics on floats, no reductions whose order depends on scheduling.
 *
 * Registration order and layout (element offsets into params/grads, all fp32, row-major):
 *   wte.weight                [Vp, C]   (rows >= vocab_size are padding, kept at zero)
 *   wpe.weight                [maxT, C]
 *   for l in 0..L-1:
 *     h.l.ln_1.weight         [C]        h.l.ln_1.bias          [C]
 *     h.l.attn.c_attn.weight  [C, 3C]    h.l.attn.c_attn.bias   [3C]
 *     h.l.attn.c_proj.weight  [C, C]     h.l.attn.c_proj.bias   [C]
 *     h.l.ln_2.weight         [C]        h.l.ln_2.bias          [C]
 *     h.l.mlp.c_fc.weight     [C, 4C]    h.l.mlp.c_fc.bias      [4C]
 *     h.l.mlp.c_proj.weight   [4C, C]    h.l.mlp.c_proj.bias    [C]
 *   ln_f.weight               [C]        ln_f.bias              [C]
 * Linear weights are stored [in, out] exactly like HF's Conv1D (y = x W + b), so a HF
 * model.safetensors maps 1:1 (no transposes). Each block (and ln_f, and the embeddings) is one
 * contiguous range, which is what the grad-ready callback reports.
 *
 * Threads: every entry point uses opts.n_threads OpenMP threads and sets OpenBLAS to the same
 * count (openblas_set_num_threads is process-global). Results are bitwise identical for a given
 * thread count; across thread counts our own kernels are identical, OpenBLAS usually is too.
 */
#ifndef MEMWALL_GPT2_H
#define MEMWALL_GPT2_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mw_gpt2_config {
    int n_layer;           /* L: transformer blocks */
    int n_head;            /* NH: attention heads; n_embd % n_head == 0 */
    int n_embd;            /* C: model width */
    int max_seq_len;       /* maxT: rows of wpe, longest sequence the model accepts */
    int vocab_size;        /* V: real vocabulary (softmax/loss run over these) */
    int padded_vocab_size; /* Vp: rows of wte (>= V; 0 means = V). Padding rows are zero, never
                              predicted (their logits are computed but excluded from softmax). */
};

/* HF "gpt2" (124M): L=12, NH=12, C=768, maxT=1024, V=50257, Vp=0 (= V). */
void mw_gpt2_config_124m(struct mw_gpt2_config *cfg);
/* 0 or -EINVAL with mw_error_set detail (non-positive sizes, C % NH, Vp < V, overflow). */
int mw_gpt2_config_check(const struct mw_gpt2_config *cfg);
/* The rows memwall gives the output layer for a vocabulary: a multiple of 128 (GPT-2: 50257 ->
 * 50304, as llm.c pads), 8 for a small (byte) vocabulary. */
int mw_gpt2_padded_vocab(int vocab_size);
/* Parameter count (elements of the flat array, padding rows included). cfg must be valid. */
size_t mw_gpt2_num_params(const struct mw_gpt2_config *cfg);

/* One entry of the tensor table. */
enum mw_gpt2_kind {
    MW_GPT2_WTE, MW_GPT2_WPE,
    MW_GPT2_LN1_W, MW_GPT2_LN1_B, MW_GPT2_QKV_W, MW_GPT2_QKV_B, MW_GPT2_ATTPROJ_W, MW_GPT2_ATTPROJ_B,
    MW_GPT2_LN2_W, MW_GPT2_LN2_B, MW_GPT2_FC_W, MW_GPT2_FC_B, MW_GPT2_FCPROJ_W, MW_GPT2_FCPROJ_B,
    MW_GPT2_LNF_W, MW_GPT2_LNF_B,
    MW_GPT2_NKINDS
};
struct mw_gpt2_tensor {
    char name[48];     /* HF name, e.g. "h.3.attn.c_attn.weight" */
    int kind;          /* enum mw_gpt2_kind */
    int layer;         /* block index, -1 for wte/wpe/ln_f */
    int ndim;          /* 1 or 2 */
    size_t shape[2];   /* elements; shape[1] = 1 for 1-D tensors */
    size_t offset;     /* first element in params/grads */
    size_t numel;      /* shape[0] * shape[1] */
};

struct mw_gpt2_options {
    int max_batch;     /* B: largest micro-batch forward() will be given (activations sized for it) */
    int max_seq;       /* T: longest sequence (<= cfg.max_seq_len; 0 means cfg.max_seq_len) */
    int recompute;     /* 1: keep only block inputs, recompute each block in backward (bitwise
                          identical gradients, far smaller activations) */
    int n_threads;     /* OpenMP and OpenBLAS threads; 0 = omp_get_max_threads() */
};

/* Byte sizes, computable before allocating (mw_gpt2_sizes) and stored in the model. */
struct mw_gpt2_sizes {
    size_t n_params;          /* elements of params (= of grads) */
    size_t params_bytes;      /* n_params * 4 */
    size_t grads_bytes;       /* n_params * 4 */
    size_t acts_bytes;        /* activations + backward scratch for (max_batch, max_seq), with
                                 the chosen recompute setting: one allocation */
    size_t acts_bytes_full;   /* the same without recomputation (for reporting the saving) */
};
int mw_gpt2_sizes(const struct mw_gpt2_config *cfg, const struct mw_gpt2_options *opts,
                  struct mw_gpt2_sizes *out);

struct mw_gpt2_impl; /* private: activation layout, scratch */
struct mw_gpt2;

/* Weight units: the contiguous ranges of params a pass reads one after another, for callers
 * that keep only part of the weights resident (ZeRO-3: gather a unit before use, release it
 * after). Unit 0 = the embeddings (wte + wpe, [0, tensors[2].offset)), units 1..L = blocks
 * h.0..h.L-1, unit L+1 = ln_f. Forward reads 0, 1, ..., L, L+1, 0 (the tied LM head); backward
 * reads 0 (LM head), L+1, L, ..., 1 (the embedding backward needs no weights). */
enum mw_gpt2_unit_event { MW_GPT2_UNIT_ACQUIRE = 0, MW_GPT2_UNIT_RELEASE = 1 };
/* Called with ACQUIRE before the pass reads unit `unit` and with RELEASE after its last read
 * (backward = 1 inside mw_gpt2_backward). A non-zero return ends the pass with that code. */
typedef int (*mw_gpt2_weights_fn)(void *user, int event, int unit, int backward);
int mw_gpt2_n_units(const struct mw_gpt2 *m); /* L + 2 */
/* Element range of a unit; -EINVAL outside [0, n_units). */
int mw_gpt2_unit_range(const struct mw_gpt2 *m, int unit, size_t *first, size_t *n);

/* A model. Fields are read-only for callers except the CONTENTS of params and grads: an
 * optimizer (or the offload engine) writes new weights into params and may zero grads. */
struct mw_gpt2 {
    struct mw_gpt2_config cfg;
    struct mw_gpt2_options opts;       /* as given, with 0s resolved */
    struct mw_gpt2_sizes sizes;
    int n_tensors;                     /* 2 + 12 * L + 2 */
    struct mw_gpt2_tensor *tensors;    /* [n_tensors] in registration order */
    float *params;                     /* [n_params] fp32, page-aligned, whole pages (a caller may
                                          madvise(MADV_DONTNEED) pages of units it released) */
    float *grads;                      /* [n_params] fp32, page-aligned, whole pages */
    float *acts;                       /* [acts_bytes / 4] the single activation allocation */
    int B, T;                          /* shape of the last forward() */
    float loss;                        /* mean cross-entropy of the last forward() with targets;
                                          -1 when it had no targets */
    mw_gpt2_weights_fn weights_hook;   /* optional (NULL): unit acquire/release, see above */
    void *weights_user;
    struct mw_gpt2_impl *impl;
};

/* Sizes and allocates params, grads (zeroed) and activations. Weights are zero until
 * mw_gpt2_init_weights or a load. Returns 0, -EINVAL or -ENOMEM (message set). */
int mw_gpt2_init(struct mw_gpt2 *m, const struct mw_gpt2_config *cfg, const struct mw_gpt2_options *opts);
void mw_gpt2_free(struct mw_gpt2 *m);

/* GPT-2 initialisation, deterministic from seed: weights N(0, 0.02), the two residual
 * projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weight 1,
 * bias 0, wte padding rows 0. Independent of the thread count. */
void mw_gpt2_init_weights(struct mw_gpt2 *m, uint64_t seed);
/* The same for the tensors of one weight unit only (bitwise what mw_gpt2_init_weights writes
 * there): callers that stream weights initialise a unit at a time. -EINVAL for a bad unit. */
int mw_gpt2_init_weights_unit(struct mw_gpt2 *m, uint64_t seed, int unit);

/* Runs one large matrix product on scratch memory (freed again), so that what the process keeps
 * for the rest of its life (the matrix library's per-thread buffers) is resident before a
 * caller measures its baseline (the streamed run's DRAM plan). */
void mw_gpt2_warm_runtime(const struct mw_gpt2 *m);

/* Finds a tensor by HF name; NULL if absent. */
const struct mw_gpt2_tensor *mw_gpt2_find_tensor(const struct mw_gpt2 *m, const char *name);

/* Forward of a micro-batch: inputs [B, T] token ids in [0, V), targets [B, T] in [0, V) or NULL.
 * B <= max_batch, T <= max_seq. With targets, m->loss is the mean cross-entropy over the B*T
 * positions and backward() may follow. Returns 0 or -EINVAL (bad shape or token, message set). */
int mw_gpt2_forward(struct mw_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T);

/* Logits of the last forward: [B, T, Vp] fp32 (row stride Vp; columns >= V are padding). Valid
 * until the next backward() (which turns them into logit gradients in place) or forward(). */
const float *mw_gpt2_logits(const struct mw_gpt2 *m);
/* Per-position losses of the last forward with targets: [B, T]. */
const float *mw_gpt2_losses(const struct mw_gpt2 *m);

/* Called during backward when grads[first_elem, first_elem + n_elems) is final for this
 * micro-batch. Order: ln_f, h.L-1, ..., h.0, then the embeddings (wte + wpe, which is range
 * [0, tensors[2].offset)). Together the calls cover the whole array exactly once. Runs on
 * the calling thread between layers; keep it short (signal a worker, don't compute). */
typedef void (*mw_gpt2_grad_ready_fn)(size_t first_elem, size_t n_elems, void *user);

/* Backward of the last forward (which must have had targets). ACCUMULATES into m->grads
 * (+=) the gradient of grad_scale * loss: pass 1.0f for one micro-batch, 1.0f/accum_steps to
 * average over gradient-accumulation micro-batches. cb may be NULL. Returns 0 or -EINVAL
 * (no forward with targets before it). */
int mw_gpt2_backward(struct mw_gpt2 *m, float grad_scale, mw_gpt2_grad_ready_fn cb, void *user);

/* Gradient accumulation over `count` micro-batches: the next backward is micro-batch `index`.
 * wte receives every micro-batch's LM-head share first and the token lookups' shares after them
 * (the order the layer-major step can keep without the logits), so backward keeps each earlier
 * micro-batch's residual gradient and tokens (mw_gpt2_defer_bytes) and adds the lookups at the
 * last. count <= 1 (the default): nothing is kept. -EINVAL outside 0 <= index < count. */
int mw_gpt2_accum_set(struct mw_gpt2 *m, int index, int count);
size_t mw_gpt2_defer_bytes(const struct mw_gpt2 *m, int count);

/* ---- layer-major steps (src/model/gpt2_layer_major.c) ---- */

/* What the caller hears during a layer-major step. before_grads: once, after the forward pass
 * over the blocks and before the first gradient is written (e.g. finish the previous update);
 * non-zero ends the step. grad_ready: as mw_gpt2_grad_ready_fn, a range is final for the whole
 * step. forward_done / backward_done: the time each part took, ns. Any may be NULL. */
struct mw_gpt2_lm_calls {
    int (*before_grads)(void *user);
    mw_gpt2_grad_ready_fn grad_ready;
    void (*forward_done)(void *user, uint64_t ns);
    void (*backward_done)(void *user, uint64_t ns);
    /* Optional: keep each block's activations (with its input) instead of recomputing them in
     * backward. FILL: a buffer of mw_gpt2_act_slot_bytes (4096-aligned) for block `layer`'s
     * forward of micro-batch `mb`; FILLED: it is written and the model is done with it; GET: the
     * buffer holding (layer, mb) again, for its backward; DONE: the backward is done with it.
     * FILL and GET set *buf; a non-zero return ends the step with that code (message set). */
    int (*acts)(void *user, int event, int layer, int mb, float **buf);
    void *user;
};
enum mw_gpt2_acts_event { MW_GPT2_ACTS_FILL = 0, MW_GPT2_ACTS_FILLED = 1, MW_GPT2_ACTS_GET = 2, MW_GPT2_ACTS_DONE = 3 };
/* Forward and backward of nmb micro-batches (inputs/targets [nmb][B * T]) unit by unit: each
 * weight unit is acquired once for all micro-batches in forward and once in backward (hook order:
 * forward 0, 1..L, L+1 with 0; backward L..1). ACCUMULATES grad_scale times each micro-batch's
 * loss gradient into grads, bitwise as nmb calls of forward + backward (mw_gpt2_accum_set) would;
 * losses[k] = micro-batch k's mean loss. Needs mw_gpt2_lm_bytes(m, nmb, acts) of extra memory
 * during the call (each micro-batch's block inputs (all of them, or two with calls->acts), ln_f
 * output and residual gradient). */
int mw_gpt2_step_layer_major(struct mw_gpt2 *m, int nmb, const int32_t *inputs, const int32_t *targets, int B, int T,
                             float grad_scale, const struct mw_gpt2_lm_calls *calls, float *losses);
size_t mw_gpt2_lm_bytes(const struct mw_gpt2 *m, int nmb, int acts);
/* Bytes of one block's kept activations and its input (calls->acts' buffers), whole pages. */
size_t mw_gpt2_act_slot_bytes(const struct mw_gpt2 *m);
/* A caller that keeps the blocks' activations in its own slots lends the model one of them
 * (a buffer of mw_gpt2_act_slot_bytes) for every other pass (evaluation, plain forward/backward)
 * of a model built with recompute: the model's own block activations (mw_gpt2_own_block_bytes
 * of its activation bytes) are then never touched, so never resident. Only between steps. */
void mw_gpt2_acts_lend(struct mw_gpt2 *m, float *slot);
size_t mw_gpt2_own_block_bytes(const struct mw_gpt2 *m);

/* grads = 0 (call between optimizer steps; backward never clears). */
void mw_gpt2_zero_grad(struct mw_gpt2 *m);

/* ---- safetensors (HF GPT-2 names and layouts) ---- */

/* Where each value of a resolved config came from. */
enum mw_gpt2_source {
    MW_GPT2_FROM_NONE = 0,
    MW_GPT2_FROM_TENSORS,      /* the shapes of wte / wpe / h.N in the safetensors file */
    MW_GPT2_FROM_CONFIG_JSON,  /* Hugging Face's config.json beside the file */
    MW_GPT2_FROM_METADATA,     /* memwall's __metadata__ in the file */
    MW_GPT2_FROM_FLAG,         /* the caller's (command line's) value */
    MW_GPT2_FROM_GUESS,        /* n_head = n_embd / 64 when nothing says it (every HF GPT-2 size) */
};
struct mw_gpt2_provenance {
    int n_layer, n_head, n_embd, max_seq_len, vocab_size; /* enum mw_gpt2_source each */
    char config_json[512];     /* the config.json that was read; "" when there was none */
};
const char *mw_gpt2_source_name(int src); /* "config.json", "tensor shapes", ... */

/* Resolves the model config of a GPT-2 safetensors file, in this order:
 *  1. the tensors: L from the h.N indices, C from wte, maxT from the rows of wpe;
 *  2. config.json in the same directory, when present (n_layer, n_head, n_embd, n_positions,
 *     vocab_size; activation_function, layer_norm_epsilon, n_inner, scale_attn_weights,
 *     scale_attn_by_inverse_layer_idx, add_cross_attention, tie_word_embeddings are checked and
 *     a setting memwall does not implement is refused by name; dropout is not applied);
 *  3. memwall's __metadata__ (n_head, vocab_size, padded_vocab_size);
 *  4. flags (may be NULL; 0 fields = not given: the caller's shape options) fill what 1-3 leave;
 *  5. otherwise V = rows of wte, NH = C / 64 (source MW_GPT2_FROM_GUESS).
 * A value given by two sources must agree (MW_EFORMAT naming both). prov (may be NULL) gets the
 * source of each value. Returns 0, -errno (cannot open/read) or MW_EFORMAT, message set. */
int mw_gpt2_config_resolve(const char *path, const struct mw_gpt2_config *flags, struct mw_gpt2_config *cfg,
                           struct mw_gpt2_provenance *prov);
/* mw_gpt2_config_resolve(path, NULL, cfg, NULL). */
int mw_gpt2_config_from_safetensors(const char *path, struct mw_gpt2_config *cfg);

/* Loads weights into an initialised model. Every model tensor must be present once with the exact
 * shape (wte may have V..Vp rows; missing padding rows are zeroed); dtypes F32, F16, BF16 are
 * converted to fp32; "lm_head.weight" (tied) and "h.N.attn.bias"/"masked_bias" buffers are
 * ignored; a "transformer." name prefix is accepted. Verify, then apply: the header, every shape
 * and every value (readable, finite) are checked before the first weight is written, so a
 * truncated or corrupt file, an unknown, duplicate, overlapping or missing tensor, a wrong shape
 * (MW_EFORMAT) leaves the model's params bitwise unchanged. Only an I/O error while applying the
 * verified file (or the file changed during the load) leaves them partly written (said so). */
int mw_gpt2_load_safetensors(struct mw_gpt2 *m, const char *path);
/* The same a weight unit at a time, for callers that stream the weights: open verifies the whole
 * file against the model (shapes, dtypes, every value finite) through a bounded buffer, loading
 * nothing; unit loads the tensors of one unit (mw_gpt2_unit_range) into m->params. */
struct mw_gpt2_st_loader;
int mw_gpt2_st_loader_open(struct mw_gpt2_st_loader **out, const struct mw_gpt2 *m, const char *path);
int mw_gpt2_st_loader_unit(struct mw_gpt2_st_loader *l, struct mw_gpt2 *m, int unit);
void mw_gpt2_st_loader_close(struct mw_gpt2_st_loader *l);
/* Both loads also refuse (MW_EFORMAT, naming the file's tensor name, the element and its value)
 * any weight whose magnitude exceeds this: no trained network comes within orders of magnitude
 * of it, and the forward pass squares and sums weights (LayerNorm variance, logits) in fp32,
 * which overflows at 3.4e38, so a 1e34 entry made every step's loss inf ("skipped") while the
 * run still ended with rc 0. */
#define MW_GPT2_MAX_ABS_WEIGHT 1e9

/* Writes all tensors (F32, HF names and shapes; wte with its V real rows, so HF loads it) plus
 * __metadata__ with n_layer, n_head, n_embd, max_seq_len, vocab_size, padded_vocab_size.
 * Written atomically (memwall/fsutil.h: temporary, fsync, rename, fsync of the directory). 0 or -errno (message set). */
int mw_gpt2_save_safetensors(const struct mw_gpt2 *m, const char *path);
/* The same, calling fn(user, ACQUIRE, unit, 0) before the first tensor of each weight unit is
 * written and RELEASE after its last (callers that keep only some units resident). */
int mw_gpt2_save_safetensors_units(const struct mw_gpt2 *m, const char *path, mw_gpt2_weights_fn fn, void *user);

/* GPT-2 as a family of the model seam (memwall/model.h, src/model/gpt2_net.c): its config as a
 * seam config, and back (-EINVAL when the config is another family's). */
struct mw_net_config;
void mw_net_config_gpt2(struct mw_net_config *out, const struct mw_gpt2_config *g);
int mw_net_gpt2_config(const struct mw_net_config *c, struct mw_gpt2_config *g);

#ifdef __cplusplus
}
#endif
#endif
