/*
 * model.h — the model seam (docs/model.md): a table a model family fills, and the instance of a
 * model (struct mw_net) that the trainer, checkpoints, streaming, ZeRO, the CLI and the planner
 * speak to. GPT-2 is the first family (src/model/gpt2_net.c); a family is added by filling one
 * table and one registry line (src/model/registry.c), without touching train/, cli/ or plan/.
 *
 * Why a table and not a model base struct with virtual fields: the families differ in everything
 * behind the flat arrays (GPT-2: LayerNorm and learned positions; Llama: RMSNorm, rotary, gated
 * MLP, grouped heads) and in nothing the callers use. What callers need is exactly what is here:
 *   - a config they can check, describe to the planner (struct mw_model of memwall/plan.h, the
 *     planner's description: one description for the trainer and the planner), print, and keep
 *     in a checkpoint (a fixed-size encoding with the family's stable id);
 *   - one flat fp32 array of parameters and one of gradients, in the family's tensor order, with
 *     HF names, cut into weight units (contiguous ranges that a pass reads one after another:
 *     the unit of ZeRO-3 gathers, of NVMe streaming and of checkpoint writes);
 *   - forward/backward of a micro-batch, and the layer-major step over a set of micro-batches,
 *     telling the caller when each unit's weights are needed (the weights hook) and when a range
 *     of gradients is final (grad_ready);
 *   - initialisation (whole, or a unit at a time) and safetensors load/save (whole, or a unit at
 *     a time).
 * The calls cost one indirect call per pass or unit, nothing per element.
 *
 * Unit order (one source for the trainer, ZeRO, streaming and the planner): units are numbered in
 * the order of the flat array; a pass acquires them in the order mw_net_unit_order gives for it
 * (forward or backward, batch-major or layer-major), which tests/test_net.c checks against what
 * the passes really acquire.
 */
#ifndef MEMWALL_MODEL_H
#define MEMWALL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mw_model; /* memwall/plan.h: the planner's description of a model */

#define MW_NET_CONFIG_BYTES 256u /* room for any family's config struct */
#define MW_NET_CONFIG_WIRE 128u  /* a family's config in a checkpoint header, little-endian */

struct mw_net_family;

/* A family and its config (the family's own struct in raw; only the family reads it). */
struct mw_net_config {
    const struct mw_net_family *family;
    _Alignas(8) unsigned char raw[MW_NET_CONFIG_BYTES];
};

struct mw_net_options {
    int max_batch;     /* largest micro-batch a pass is given (activations are sized for it) */
    int max_seq;       /* longest sequence (0: the model's context) */
    int recompute;     /* keep only each block's input, recompute in backward (same gradients) */
    int n_threads;     /* OpenMP/OpenBLAS threads; 0 = all */
};

struct mw_net_sizes {
    size_t n_params;        /* elements of params (= of grads) */
    size_t params_bytes, grads_bytes;
    size_t acts_bytes;      /* the one activation allocation for (max_batch, max_seq) */
    size_t acts_bytes_full; /* the same without recomputation */
};

/* One tensor of the flat array. */
struct mw_net_tensor {
    const char *name;  /* HF name, e.g. "h.3.attn.c_attn.weight" */
    int ndim;          /* 1 or 2 */
    size_t shape[2];   /* shape[1] = 1 for 1-D tensors */
    size_t offset;     /* first element in params/grads */
    size_t numel;
};

enum mw_net_pass { MW_NET_FORWARD = 0, MW_NET_BACKWARD = 1 };
enum mw_net_unit_event { MW_NET_UNIT_ACQUIRE = 0, MW_NET_UNIT_RELEASE = 1 };
/* ACQUIRE before a pass reads unit `unit`, RELEASE after its last read (backward = 1 in a
 * backward pass). Non-zero ends the pass with that code. */
typedef int (*mw_net_weights_fn)(void *user, int event, int unit, int backward);
/* grads[first, first + n) is final for this micro-batch (layer-major: for the step). */
typedef void (*mw_net_grad_ready_fn)(size_t first, size_t n, void *user);

/* What the caller hears during a layer-major step (the fields mean what memwall/gpt2.h's
 * mw_gpt2_lm_calls says; acts events: MW_NET_ACTS_*). */
struct mw_net_lm_calls {
    int (*before_grads)(void *user);
    mw_net_grad_ready_fn grad_ready;
    void (*forward_done)(void *user, uint64_t ns);
    void (*backward_done)(void *user, uint64_t ns);
    int (*acts)(void *user, int event, int layer, int mb, float **buf);
    void *user;
};
enum mw_net_acts_event { MW_NET_ACTS_FILL = 0, MW_NET_ACTS_FILLED = 1, MW_NET_ACTS_GET = 2, MW_NET_ACTS_DONE = 3 };

/* An instance. Callers read the fields and write only the CONTENTS of params and grads. */
struct mw_net {
    const struct mw_net_family *family;
    struct mw_net_config cfg;
    struct mw_net_options opts;  /* as given, 0s resolved */
    struct mw_net_sizes sizes;
    float *params, *grads;       /* [n_params] fp32, page-aligned whole pages */
    int n_units;
    int n_layer;                 /* transformer blocks (units that hold activations) */
    int vocab, padded_vocab;     /* tokens the softmax runs over; rows of the output layer */
    int context;                 /* the longest sequence the model accepts */
    float loss;                  /* mean loss of the last forward with targets; -1 without */
    void *impl;                  /* the family's instance */
};

/* The shape a command line gives, field by field (0: not given). */
struct mw_net_shape { int layers, heads, width, context, vocab; };

/* The table a family fills. Every entry is required unless marked optional. */
struct mw_net_family {
    const char *name;  /* "gpt2": the registry key and what `memwall train --model` names */
    uint32_t id;       /* stable, kept in checkpoints (GPT-2: 0, what checkpoints before the seam hold) */
    /* ---- config (cfg points at mw_net_config.raw) ---- */
    int (*config_check)(const void *cfg);                         /* 0 or -EINVAL, message set */
    void (*config_describe)(const void *cfg, struct mw_model *d); /* the planner's description */
    void (*config_summary)(const void *cfg, char *buf, size_t n); /* "L=12 heads=12 width=768 ..." */
    void (*config_encode)(const void *cfg, uint8_t wire[MW_NET_CONFIG_WIRE]);
    int (*config_decode)(const uint8_t wire[MW_NET_CONFIG_WIRE], void *cfg); /* hostile: checked */
    int (*sizes)(const void *cfg, const struct mw_net_options *o, struct mw_net_sizes *out);
    /* A config from a command line's shape (every field given), from a weights file (what the
     * files say; given fields fill the rest and must agree: note gets lines saying where each
     * value came from, for the user), and back to a shape (for the run's record). */
    int (*config_from_shape)(const struct mw_net_shape *sh, void *cfg);
    int (*config_from_file)(const char *path, const struct mw_net_shape *given, void *cfg, char *note, size_t n);
    void (*config_shape)(const void *cfg, struct mw_net_shape *sh);
    /* Optional: a config from the planner's description (config_describe's inverse; context:
     * the positions to build for when d has none); -ENOTSUP (no message) when d is not this
     * family's, -EINVAL (message) when it is but uses what the family does not implement. */
    int (*config_from_model)(const struct mw_model *d, int context, void *cfg);
    /* ---- an instance ---- */
    int (*init)(struct mw_net *n, const struct mw_net_options *o); /* n->cfg set; fills the rest */
    void (*free)(struct mw_net *n);
    void (*init_weights)(struct mw_net *n, uint64_t seed);
    int (*init_weights_unit)(struct mw_net *n, uint64_t seed, int unit);
    void (*warm_runtime)(const struct mw_net *n);
    int (*unit_range)(const struct mw_net *n, int unit, size_t *first, size_t *count);
    void (*unit_name)(const struct mw_net *n, int unit, char *buf, size_t len);
    /* The units a pass acquires, in order (a unit may come twice: GPT-2's tied head), into
     * order[0..max): the count (may exceed max). layer_major: the layer-major step's passes. */
    int (*unit_order)(const struct mw_net *n, enum mw_net_pass pass, int layer_major, int *order, int max);
    int (*n_tensors)(const struct mw_net *n);
    void (*tensor)(const struct mw_net *n, int i, struct mw_net_tensor *out);
    void (*set_weights_hook)(struct mw_net *n, mw_net_weights_fn fn, void *user);
    int (*forward)(struct mw_net *n, const int32_t *inputs, const int32_t *targets, int B, int T);
    const float *(*logits)(const struct mw_net *n); /* [B, T, padded_vocab] of the last forward */
    int (*backward)(struct mw_net *n, float grad_scale, mw_net_grad_ready_fn cb, void *user);
    int (*accum_set)(struct mw_net *n, int index, int count);
    size_t (*defer_bytes)(const struct mw_net *n, int count);
    int (*step_layer_major)(struct mw_net *n, int nmb, const int32_t *inputs, const int32_t *targets, int B, int T,
                            float grad_scale, const struct mw_net_lm_calls *calls, float *losses);
    size_t (*lm_bytes)(const struct mw_net *n, int nmb, int acts);
    size_t (*act_slot_bytes)(const struct mw_net *n);
    void (*acts_lend)(struct mw_net *n, float *slot);
    size_t (*own_block_bytes)(const struct mw_net *n);
    void (*zero_grad)(struct mw_net *n);
    /* ---- weights in files ---- */
    int (*load_safetensors)(struct mw_net *n, const char *path);
    int (*loader_open)(void **loader, const struct mw_net *n, const char *path); /* a unit at a time */
    int (*loader_unit)(void *loader, struct mw_net *n, int unit);
    void (*loader_close)(void *loader);
    int (*save_safetensors_units)(const struct mw_net *n, const char *path, mw_net_weights_fn fn, void *user);
    /* ---- Hugging Face model directories (optional: NULL, a family without them) ---- */
    const char *const *hf_model_types; /* config.json "model_type" values it reads, NULL-terminated */
    /* Writes config.json for cfg (atomically) so that transformers' from_pretrained loads the
     * directory with the model.safetensors beside it. */
    int (*hf_config_write)(const void *cfg, const char *path);
    /* ---- incremental decoding with a key/value cache (optional: all three NULL, a family that
     * generates only by full forwards; mw_net_kv_init then says -ENOTSUP) ---- */
    /* A cache for max_tokens positions (<= context) of one sequence, empty: *kv is the family's. */
    int (*kv_init)(const struct mw_net *n, int max_tokens, void **kv);
    /* Runs tokens[0..n_tokens) at positions pos.. (pos = the tokens the cache holds: a prompt
     * prefilled at 0, then one token at a time), appends their keys and values, and writes the
     * logits of the last one to logits_last[0..vocab). The same numbers as a full forward over
     * the sequence (to rounding: tests/test_generate.c). */
    int (*decode)(struct mw_net *n, void *kv, const int32_t *tokens, int n_tokens, int pos, float *logits_last);
    void (*kv_free)(void *kv); /* NULL-safe */
};

/* ---- the registry (src/model/net.c) ---- */
/* The family a command line trains unless told otherwise (the registry's first). */
const struct mw_net_family *mw_net_family_default(void);
const struct mw_net_family *mw_net_family_find(const char *name); /* NULL: unknown */
const struct mw_net_family *mw_net_family_by_id(uint32_t id);     /* NULL: unknown */
const struct mw_net_family *mw_net_family_at(int i);               /* NULL past the last */
/* The model memwall trains for the planner's description d (memwall plan --stream): the first
 * family whose config_from_model takes it; -ENOTSUP naming the families otherwise. */
int mw_net_config_from_model(const struct mw_model *d, int context, struct mw_net_config *out);
/* The family of a Hugging Face model directory, from DIR/config.json's "model_type"; -ENOENT,
 * MW_EFORMAT or -ENOTSUP (naming the model_type and the ones memwall reads) otherwise. */
int mw_net_family_for_hf(const char *dir, const struct mw_net_family **out);
/* The weights of a Hugging Face model directory, as the path a family's loaders take
 * (src/model/tensor_source.h): DIR/model.safetensors when it exists (preferred even beside an
 * index, as transformers' from_pretrained does), else DIR itself when it holds
 * model.safetensors.index.json (a sharded checkpoint: each tensor is read from the shard the
 * index names). The files' headers and the index are checked here (no weights read), so a bad
 * directory fails before a model is built, naming the file and the key. 0, -ENOENT (neither
 * file), MW_EFORMAT, or -errno; message set. */
int mw_net_hf_weights(const char *dir, char *path, size_t n);

/* ---- calls through the table (src/model/net.c) ---- */
int mw_net_config_check(const struct mw_net_config *c);
int mw_net_sizes(const struct mw_net_config *c, const struct mw_net_options *o, struct mw_net_sizes *out);
int mw_net_init(struct mw_net *n, const struct mw_net_config *c, const struct mw_net_options *o);
void mw_net_free(struct mw_net *n);
int mw_net_unit_range(const struct mw_net *n, int unit, size_t *first, size_t *count);
int mw_net_unit_order(const struct mw_net *n, enum mw_net_pass pass, int layer_major, int *order, int max);
void mw_net_unit_name(const struct mw_net *n, int unit, char *buf, size_t len);

static inline int mw_net_forward(struct mw_net *n, const int32_t *in, const int32_t *tg, int B, int T)
{
    return n->family->forward(n, in, tg, B, T);
}
static inline int mw_net_backward(struct mw_net *n, float scale, mw_net_grad_ready_fn cb, void *user)
{
    return n->family->backward(n, scale, cb, user);
}
static inline const float *mw_net_logits(const struct mw_net *n) { return n->family->logits(n); }
static inline int mw_net_accum_set(struct mw_net *n, int index, int count) { return n->family->accum_set(n, index, count); }
static inline size_t mw_net_defer_bytes(const struct mw_net *n, int count) { return n->family->defer_bytes(n, count); }
static inline int mw_net_step_layer_major(struct mw_net *n, int nmb, const int32_t *in, const int32_t *tg, int B, int T,
                                          float scale, const struct mw_net_lm_calls *c, float *losses)
{
    return n->family->step_layer_major(n, nmb, in, tg, B, T, scale, c, losses);
}
static inline size_t mw_net_lm_bytes(const struct mw_net *n, int nmb, int acts) { return n->family->lm_bytes(n, nmb, acts); }
static inline size_t mw_net_act_slot_bytes(const struct mw_net *n) { return n->family->act_slot_bytes(n); }
static inline void mw_net_acts_lend(struct mw_net *n, float *slot) { n->family->acts_lend(n, slot); }
static inline size_t mw_net_own_block_bytes(const struct mw_net *n) { return n->family->own_block_bytes(n); }
static inline void mw_net_zero_grad(struct mw_net *n) { n->family->zero_grad(n); }
static inline void mw_net_init_weights(struct mw_net *n, uint64_t seed) { n->family->init_weights(n, seed); }
static inline int mw_net_init_weights_unit(struct mw_net *n, uint64_t seed, int unit)
{
    return n->family->init_weights_unit(n, seed, unit);
}
static inline void mw_net_warm_runtime(const struct mw_net *n) { n->family->warm_runtime(n); }
static inline void mw_net_set_weights_hook(struct mw_net *n, mw_net_weights_fn fn, void *user)
{
    n->family->set_weights_hook(n, fn, user);
}
static inline int mw_net_load_safetensors(struct mw_net *n, const char *path) { return n->family->load_safetensors(n, path); }
static inline int mw_net_save_safetensors_units(const struct mw_net *n, const char *path, mw_net_weights_fn fn, void *user)
{
    return n->family->save_safetensors_units(n, path, fn, user);
}
/* The units a training pass acquires, position by position (forward, then backward), for both
 * schedules: built once from mw_net_unit_order, read per hook event by the residency machines
 * (ZeRO-3's gathers, NVMe streaming). */
struct mw_net_sched {
    int *seq[2];     /* [layer_major][nf + nb] */
    int nf[2], nb[2];
};
int mw_net_sched_init(struct mw_net_sched *sc, const struct mw_net *n);
void mw_net_sched_free(struct mw_net_sched *sc);
/* Unit at position p of a pass (training: forward and backward; else the forward alone); -1 past
 * its end. */
static inline int mw_net_sched_unit(const struct mw_net_sched *sc, int layer_major, int training, int p)
{
    int lm = !!layer_major, end = sc->nf[lm] + (training ? sc->nb[lm] : 0);
    return p >= 0 && p < end ? sc->seq[lm][p] : -1;
}

/* ---- incremental decoding (src/model/net.c): the family's KV cache, -ENOTSUP without one ---- */
int mw_net_kv_init(const struct mw_net *n, int max_tokens, void **kv);
int mw_net_decode(struct mw_net *n, void *kv, const int32_t *tokens, int n_tokens, int pos, float *logits_last);
void mw_net_kv_free(const struct mw_net *n, void *kv); /* NULL kv: nothing */

/* Two configs of the same model (family and every field, by their checkpoint encoding)? */
int mw_net_config_same(const struct mw_net_config *a, const struct mw_net_config *b);

#ifdef __cplusplus
}
#endif
#endif
