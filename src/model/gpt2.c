/*
 * gpt2.c — configuration, tensor table, sizing and allocation of the GPT-2 model.
 *
 * Why one flat array per role: the offload engine cuts parameters, gradients and optimizer
 * state into subgroups of a single flat index space, and the safetensors loader and the
 * memory tiers want one pointer + byte count each. So parameters are registered in HF order
 * into one array, gradients mirror it, and all activations are carved from one allocation
 * whose size is computed first (mw_gpt2_sizes) — the same arithmetic sizes and places them.
 */
#include "gpt2_internal.h"
#include "memwall/common.h"

#include <cblas.h>

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ALIGN_FLOATS 16 /* 64-byte alignment of every carved buffer */

void mw_gpt2_config_124m(struct mw_gpt2_config *cfg)
{
    cfg->n_layer = 12;
    cfg->n_head = 12;
    cfg->n_embd = 768;
    cfg->max_seq_len = 1024;
    cfg->vocab_size = 50257;
    cfg->padded_vocab_size = 0;
}

int mw_gpt2_config_check(const struct mw_gpt2_config *c)
{
    if (c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0 || c->max_seq_len <= 0 || c->vocab_size <= 0)
        return mw_error_set(-EINVAL, "gpt2 config: n_layer=%d n_head=%d n_embd=%d max_seq_len=%d "
                            "vocab_size=%d must all be positive", c->n_layer, c->n_head, c->n_embd,
                            c->max_seq_len, c->vocab_size);
    if (c->n_embd % c->n_head)
        return mw_error_set(-EINVAL, "gpt2 config: n_embd=%d is not a multiple of n_head=%d",
                            c->n_embd, c->n_head);
    if (c->padded_vocab_size && c->padded_vocab_size < c->vocab_size)
        return mw_error_set(-EINVAL, "gpt2 config: padded_vocab_size=%d < vocab_size=%d",
                            c->padded_vocab_size, c->vocab_size);
    if (c->n_layer > 100000 || c->n_embd > (1 << 20) || c->max_seq_len > (1 << 20) ||
        c->vocab_size > (1 << 24) || c->padded_vocab_size > (1 << 24))
        return mw_error_set(-EINVAL, "gpt2 config: sizes out of range");
    return 0;
}

static size_t vp_of(const struct mw_gpt2_config *c)
{
    return (size_t)(c->padded_vocab_size ? c->padded_vocab_size : c->vocab_size);
}

/* Shapes of the 12 block tensors, in registration order. */
static void block_shape(int kind, size_t C, size_t shape[2], int *ndim)
{
    static const char k_in[MW_GPT2_BLOCK_KINDS] = {1, 1, 1, 3, 1, 1, 1, 1, 1, 4, 4, 1};
    static const char k_out[MW_GPT2_BLOCK_KINDS] = {0, 0, 3, 0, 1, 0, 0, 0, 4, 0, 1, 0};
    int i = kind - MW_GPT2_LN1_W;
    if (k_out[i]) { shape[0] = C * (size_t)k_in[i]; shape[1] = C * (size_t)k_out[i]; *ndim = 2; }
    else { shape[0] = C * (size_t)k_in[i]; shape[1] = 1; *ndim = 1; }
}

static const char *block_suffix[MW_GPT2_BLOCK_KINDS] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
};

int mw_gpt2_padded_vocab(int v) { return v > 1024 ? (int)MW_ALIGN_UP(v, 128) : (int)MW_ALIGN_UP(v, 8); }

size_t mw_gpt2_num_params(const struct mw_gpt2_config *c)
{
    size_t C = (size_t)c->n_embd;
    size_t per_block = 2 * C + C * 3 * C + 3 * C + C * C + C + 2 * C + C * 4 * C + 4 * C + 4 * C * C + C;
    return vp_of(c) * C + (size_t)c->max_seq_len * C + (size_t)c->n_layer * per_block + 2 * C;
}

/* a * b, or SIZE_MAX with *ovf set when it wraps (sizes may come from a file's header). */
static size_t mulc(int *ovf, size_t a, size_t b)
{
    size_t r;
    if (mw_mul_size(a, b, &r)) { *ovf = 1; return SIZE_MAX; }
    return r;
}

/* The layout walkers below: with base NULL only count; every piece rounded up to ALIGN_FLOATS;
 * a size that overflows sets *ovf. (Each walker has locals base, used and ovf.) */
#define M2(a, b) mulc(ovf, (a), (b))
#define TAKE(ptr, n) do { size_t n_ = (n), r_; \
        if (mw_add_size(n_, ALIGN_FLOATS - 1, &r_)) *ovf = 1; else n_ = r_ / ALIGN_FLOATS * ALIGN_FLOATS; \
        if (base) { (ptr) = base + used; } \
        if (mw_add_size(used, n_, &used)) *ovf = 1; } while (0)

/* One block's activations at base (NULL: only counts); floats used, each piece aligned. */
static size_t carve_layer(const struct mw_gpt2_config *c, const struct mw_gpt2_options *o, float *base,
                          struct mw_gpt2_layer_acts *a, int *ovf)
{
    size_t C = (size_t)c->n_embd, T = (size_t)o->max_seq;
    size_t NH = (size_t)c->n_head, B = (size_t)o->max_batch;
    size_t BT = mulc(ovf, B, T);
    size_t used = 0;
    TAKE(a->ln1, M2(BT, C)); TAKE(a->ln1_mean, BT); TAKE(a->ln1_rstd, BT);
    TAKE(a->qkv, M2(M2(BT, 3), C)); TAKE(a->atty, M2(BT, C)); TAKE(a->att, M2(M2(M2(B, NH), T), T));
    TAKE(a->res2, M2(BT, C)); TAKE(a->ln2, M2(BT, C)); TAKE(a->ln2_mean, BT); TAKE(a->ln2_rstd, BT);
    TAKE(a->fch, M2(M2(BT, 4), C)); TAKE(a->fch_gelu, M2(M2(BT, 4), C));
    return *ovf ? 0 : used;
}

size_t mw_gpt2_block_acts_floats(const struct mw_gpt2 *m)
{
    struct mw_gpt2_layer_acts a;
    int ovf = 0;
    return carve_layer(&m->cfg, &m->opts, NULL, &a, &ovf); /* sizes were checked at init */
}

void mw_gpt2_block_acts_bind(struct mw_gpt2 *m, int l, float *base)
{
    int ovf = 0;
    (void)carve_layer(&m->cfg, &m->opts, base, &m->impl->layer[l], &ovf);
}

/* Walks the activation layout. With base == NULL only counts; returns floats used, or 0 with
 * *ovf set when a size overflows size_t (only possible while counting: sizes() runs first). */
static size_t carve(const struct mw_gpt2_config *c, const struct mw_gpt2_options *o, float *base,
                    struct mw_gpt2_impl *im, int recompute, int *ovf)
{
    size_t C = (size_t)c->n_embd, T = (size_t)o->max_seq;
    size_t B = (size_t)o->max_batch, L = (size_t)c->n_layer;
    size_t BT = mulc(ovf, B, T);
    size_t used = 0;
    float *dummy;
    size_t nsets = recompute ? 1 : L;
    for (size_t l = 0; l < nsets; l++) {
        struct mw_gpt2_layer_acts a_, *a = base ? &im->layer[l] : &a_;
        TAKE(dummy, carve_layer(c, o, base ? base + used : NULL, a, ovf));
    }
    if (base && recompute)
        for (size_t l = 1; l < L; l++) im->layer[l] = im->layer[0];
    for (size_t l = 0; l <= L; l++) {
        if (base) { TAKE(im->res[l], M2(BT, C)); } else { TAKE(dummy, M2(BT, C)); }
    }
    if (base) {
        TAKE(im->lnf, M2(BT, C)); TAKE(im->lnf_mean, BT); TAKE(im->lnf_rstd, BT);
        TAKE(im->logits, M2(BT, vp_of(c))); TAKE(im->losses, BT); TAKE(im->lse, BT);
        TAKE(im->dres, M2(BT, C)); TAKE(im->dC, M2(BT, C)); TAKE(im->dbig, M2(M2(BT, 4), C));
        TAKE(im->datt, M2(M2((size_t)o->n_threads, T), T));
    } else {
        TAKE(dummy, M2(BT, C)); TAKE(dummy, BT); TAKE(dummy, BT);
        TAKE(dummy, M2(BT, vp_of(c))); TAKE(dummy, BT); TAKE(dummy, BT);
        TAKE(dummy, M2(BT, C)); TAKE(dummy, M2(BT, C)); TAKE(dummy, M2(M2(BT, 4), C));
        TAKE(dummy, M2(M2((size_t)o->n_threads, T), T));
    }
    (void)dummy;
#undef TAKE
#undef M2
    return *ovf ? 0 : used;
}

static int resolve_opts(const struct mw_gpt2_config *c, const struct mw_gpt2_options *in,
                        struct mw_gpt2_options *o)
{
    *o = *in;
    if (o->max_seq == 0) o->max_seq = c->max_seq_len;
    if (o->n_threads <= 0) o->n_threads = omp_get_max_threads();
    if (o->max_batch <= 0 || o->max_seq <= 0 || o->max_seq > c->max_seq_len)
        return mw_error_set(-EINVAL, "gpt2 options: max_batch=%d must be > 0 and max_seq=%d in 1..%d",
                            in->max_batch, o->max_seq, c->max_seq_len);
    if ((size_t)o->max_batch * (size_t)o->max_seq > (size_t)1 << 31)
        return mw_error_set(-EINVAL, "gpt2 options: max_batch * max_seq too large");
    return 0;
}

int mw_gpt2_sizes(const struct mw_gpt2_config *cfg, const struct mw_gpt2_options *opts,
                  struct mw_gpt2_sizes *out)
{
    int rc = mw_gpt2_config_check(cfg);
    if (rc) return rc;
    struct mw_gpt2_options o;
    if ((rc = resolve_opts(cfg, opts, &o))) return rc;
    memset(out, 0, sizeof *out);
    out->n_params = mw_gpt2_num_params(cfg);
    int ovf = 0;
    size_t acts = carve(cfg, &o, NULL, NULL, o.recompute, &ovf), full = carve(cfg, &o, NULL, NULL, 0, &ovf);
    if (ovf || mw_mul_size(acts, sizeof(float), &out->acts_bytes) ||
        mw_mul_size(full, sizeof(float), &out->acts_bytes_full) ||
        mw_mul_size(out->n_params, sizeof(float), &out->params_bytes))
        return mw_error_set(-EOVERFLOW, "gpt2: the activations of L=%d C=%d NH=%d V=%d for batch %d x %d tokens "
                            "(%d threads) overflow a 64-bit size", cfg->n_layer, cfg->n_embd, cfg->n_head,
                            cfg->vocab_size, o.max_batch, o.max_seq, o.n_threads);
    out->grads_bytes = out->params_bytes;
    return 0;
}

/* Page-aligned whole pages, mapped fresh: a caller that keeps only some units resident (ZeRO-3,
 * streaming) releases pages with madvise, which must not touch another allocation, and the
 * array is zero without being touched (an untouched page costs no memory: a streamed 1.5 B
 * parameter model never has its 6 GB of weights resident at once; MAP_NORESERVE lets a model
 * larger than DRAM be mapped at all, and the trainer checks what it will touch up front). */
static size_t map_bytes(size_t n) { return n ? MW_ALIGN_UP(n * sizeof(float), 4096) : 4096; }

/* Arrays of 2 MiB and more start on a 2 MiB boundary, so a caller may back whole-2-MiB ranges
 * with transparent huge pages (the virtual disk moves O_DIRECT buffers of huge pages about
 * twice as fast: docs/io.md). */
#define HUGE_ALIGN ((size_t)2 << 20)

void *mw_net_floats_alloc(size_t n)
{
    if (n > (SIZE_MAX - 8 * HUGE_ALIGN) / sizeof(float)) return NULL;
    size_t bytes = map_bytes(n), extra = bytes >= HUGE_ALIGN ? HUGE_ALIGN : 0;
    char *p = mmap(NULL, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (!extra) return p;
    size_t head = (HUGE_ALIGN - (uintptr_t)p % HUGE_ALIGN) % HUGE_ALIGN;
    if (head) munmap(p, head);
    if (extra - head) munmap(p + head + bytes, extra - head);
    return p + head;
}

void mw_net_floats_free(void *p, size_t n)
{
    if (p) munmap(p, map_bytes(n));
}

int mw_gpt2_n_units(const struct mw_gpt2 *m) { return m->cfg.n_layer + 2; }

int mw_gpt2_unit_range(const struct mw_gpt2 *m, int unit, size_t *first, size_t *n)
{
    const struct mw_gpt2_impl *im = m->impl;
    int L = m->cfg.n_layer;
    if (unit < 0 || unit > L + 1) return mw_error_set(-EINVAL, "gpt2: no weight unit %d (0..%d)", unit, L + 1);
    if (unit == 0) { *first = 0; *n = im->off[0]; return 0; }
    if (unit == L + 1) { *first = im->off_lnfw; *n = 2 * (size_t)m->cfg.n_embd; return 0; }
    size_t a = im->off[(size_t)(unit - 1) * MW_GPT2_BLOCK_KINDS];
    size_t b = unit < L ? im->off[(size_t)unit * MW_GPT2_BLOCK_KINDS] : im->off_lnfw;
    *first = a;
    *n = b - a;
    return 0;
}

int mw_gpt2_init(struct mw_gpt2 *m, const struct mw_gpt2_config *cfg, const struct mw_gpt2_options *opts)
{
    memset(m, 0, sizeof *m);
    int rc = mw_gpt2_sizes(cfg, opts, &m->sizes);
    if (rc) return rc;
    m->cfg = *cfg;
    resolve_opts(cfg, opts, &m->opts);
    size_t C = (size_t)cfg->n_embd, L = (size_t)cfg->n_layer;
    m->n_tensors = 2 + MW_GPT2_BLOCK_KINDS * cfg->n_layer + 2;
    m->tensors = calloc((size_t)m->n_tensors, sizeof *m->tensors);
    m->impl = calloc(1, sizeof *m->impl);
    if (!m->tensors || !m->impl) goto nomem;
    struct mw_gpt2_impl *im = m->impl;
    im->off = calloc(L * MW_GPT2_BLOCK_KINDS, sizeof *im->off);
    im->layer = calloc(L, sizeof *im->layer);
    im->res = calloc(L + 1, sizeof *im->res);
    im->inputs = calloc((size_t)m->opts.max_batch * (size_t)m->opts.max_seq, sizeof(int32_t));
    im->targets = calloc((size_t)m->opts.max_batch * (size_t)m->opts.max_seq, sizeof(int32_t));
    if (!im->off || !im->layer || !im->res || !im->inputs || !im->targets) goto nomem;

    /* Tensor table in registration order. */
    size_t off = 0;
    int n = 0;
    struct mw_gpt2_tensor *t;
#define ADD(nm, k, lay, d, s0, s1) do { t = &m->tensors[n++]; snprintf(t->name, sizeof t->name, "%s", nm); \
        t->kind = (k); t->layer = (lay); t->ndim = (d); t->shape[0] = (s0); t->shape[1] = (s1); \
        t->offset = off; t->numel = (s0) * (s1); off += t->numel; } while (0)
    ADD("wte.weight", MW_GPT2_WTE, -1, 2, vp_of(cfg), C);
    im->off_wte = t->offset;
    ADD("wpe.weight", MW_GPT2_WPE, -1, 2, (size_t)cfg->max_seq_len, C);
    im->off_wpe = t->offset;
    for (size_t l = 0; l < L; l++) {
        for (int k = 0; k < MW_GPT2_BLOCK_KINDS; k++) {
            char nm[48];
            size_t sh[2];
            int nd;
            snprintf(nm, sizeof nm, "h.%zu.%s", l, block_suffix[k]);
            block_shape(MW_GPT2_LN1_W + k, C, sh, &nd);
            ADD(nm, MW_GPT2_LN1_W + k, (int)l, nd, sh[0], sh[1]);
            im->off[l * MW_GPT2_BLOCK_KINDS + (size_t)k] = t->offset;
        }
    }
    ADD("ln_f.weight", MW_GPT2_LNF_W, -1, 1, C, 1);
    im->off_lnfw = t->offset;
    ADD("ln_f.bias", MW_GPT2_LNF_B, -1, 1, C, 1);
    im->off_lnfb = t->offset;
#undef ADD
    MW_ASSERT(n == m->n_tensors && off == m->sizes.n_params);

    m->params = mw_net_floats_alloc(m->sizes.n_params);
    m->grads = mw_net_floats_alloc(m->sizes.n_params);
    m->acts = mw_net_floats_alloc(m->sizes.acts_bytes / sizeof(float));
    if (!m->params || !m->grads || !m->acts) goto nomem;
    int ovf = 0;
    size_t used = carve(cfg, &m->opts, m->acts, im, m->opts.recompute, &ovf);
    MW_ASSERT(!ovf && used * sizeof(float) == m->sizes.acts_bytes);
    m->loss = -1.0f;
    return 0;
nomem:;
    char b1[32], b2[32];
    mw_gpt2_free(m);
    return mw_error_set(-ENOMEM, "gpt2: cannot allocate params+grads %s and activations %s",
                        mw_fmt_bytes(b1, sizeof b1, 2 * mw_gpt2_num_params(cfg) * sizeof(float)),
                        mw_fmt_bytes(b2, sizeof b2, m->sizes.acts_bytes));
}

void mw_gpt2_free(struct mw_gpt2 *m)
{
    if (m->impl) {
        free(m->impl->off);
        free(m->impl->layer);
        free(m->impl->res);
        free(m->impl->inputs);
        free(m->impl->targets);
        if (m->impl->defer) munmap(m->impl->defer, m->impl->defer_bytes);
        free(m->impl);
    }
    free(m->tensors);
    mw_net_floats_free(m->params, m->sizes.n_params);
    mw_net_floats_free(m->grads, m->sizes.n_params);
    mw_net_floats_free(m->acts, m->sizes.acts_bytes / sizeof(float));
    struct mw_gpt2_sizes s = m->sizes;
    memset(m, 0, sizeof *m);
    m->sizes = s; /* keep the sizes readable for error messages */
}

const struct mw_gpt2_tensor *mw_gpt2_find_tensor(const struct mw_gpt2 *m, const char *name)
{
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

void mw_gpt2_zero_grad(struct mw_gpt2 *m)
{
    size_t n = m->sizes.n_params;
    int nt = m->opts.n_threads;
    /* Fixed chunks; the order does not matter for a store, only that each byte is written once. */
#pragma omp parallel for num_threads(nt) schedule(static)
    for (size_t i = 0; i < n; i += 65536) {
        size_t e = MW_MIN(i + 65536, n);
        memset(m->grads + i, 0, (e - i) * sizeof(float));
    }
}

/* splitmix64 + Box-Muller: a deterministic normal stream, one state per tensor so the
 * initialisation of one tensor does not depend on the others' sizes. */
static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void fill_normal(float *p, size_t n, float std, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((double)(splitmix(&s) >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
        double u2 = (double)(splitmix(&s) >> 11) / 9007199254740992.0;
        double r = sqrt(-2.0 * log(u1));
        p[i] = (float)(r * cos(6.283185307179586 * u2) * std);
        if (i + 1 < n) p[i + 1] = (float)(r * sin(6.283185307179586 * u2) * std);
    }
}

/* Each tensor has its own random stream (seed, index): a unit initialises alone. */
int mw_gpt2_init_weights_unit(struct mw_gpt2 *m, uint64_t seed, int unit)
{
    size_t ufirst, un;
    int rc = mw_gpt2_unit_range(m, unit, &ufirst, &un);
    if (rc) return rc;
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    size_t V = (size_t)m->cfg.vocab_size, C = (size_t)m->cfg.n_embd;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m->tensors[i];
        if (t->offset < ufirst || t->offset >= ufirst + un) continue;
        float *p = m->params + t->offset;
        uint64_t ts = seed * 0x2545F4914F6CDD1Dull + (uint64_t)i * 0x9E3779B97F4A7C15ull + 1;
        switch (t->kind) {
        case MW_GPT2_WTE:
            fill_normal(p, V * C, 0.02f, ts);
            memset(p + V * C, 0, (t->numel - V * C) * sizeof(float));
            break;
        case MW_GPT2_WPE: case MW_GPT2_QKV_W: case MW_GPT2_FC_W:
            fill_normal(p, t->numel, 0.02f, ts);
            break;
        case MW_GPT2_ATTPROJ_W: case MW_GPT2_FCPROJ_W:
            fill_normal(p, t->numel, resid_std, ts);
            break;
        case MW_GPT2_LN1_W: case MW_GPT2_LN2_W: case MW_GPT2_LNF_W:
            for (size_t j = 0; j < t->numel; j++) p[j] = 1.0f;
            break;
        default: /* biases */
            memset(p, 0, t->numel * sizeof(float));
            break;
        }
    }
    return 0;
}

void mw_gpt2_init_weights(struct mw_gpt2 *m, uint64_t seed)
{
    for (int u = 0; u < mw_gpt2_n_units(m); u++) (void)mw_gpt2_init_weights_unit(m, seed, u); /* valid units */
}

const float *mw_gpt2_logits(const struct mw_gpt2 *m) { return m->impl->logits; }
const float *mw_gpt2_losses(const struct mw_gpt2 *m) { return m->impl->losses; }

void mw_gpt2_warm_runtime(const struct mw_gpt2 *m)
{
    const struct mw_gpt2_impl *im = m->impl;
    int C = m->cfg.n_embd, Vp = m->cfg.padded_vocab_size ? m->cfg.padded_vocab_size : m->cfg.vocab_size;
    const int lin[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* (in, out) of each linear */
    mw_net_warm_products(lin, 4, m->opts.max_batch * m->opts.max_seq, C, Vp, m->opts.n_threads, im->logits,
                         (size_t)m->opts.max_batch * (size_t)m->opts.max_seq * (size_t)Vp);
}

void mw_net_warm_products(const int (*lin)[2], int nlin, int N, int C, int V, int nt, float *out, size_t out_n)
{
    /* The matrix library keeps per-thread packing buffers for the life of the process, touched as
     * far as each product shape's panels reach. Run every product shape of a training step once
     * (forward, both backward products of each linear layer, the LM head's three), on inputs that
     * are a fresh zero mapping (read, never written: it costs no memory) into the logits buffer,
     * whose pages are returned afterwards (the first forward pass writes them anyway), so the
     * buffers are resident before the caller measures its baseline. */
    int widest = 4 * C;
    unsigned long long key = 0; /* a hash of the shapes (wraps) */
    for (int i = 0; i < nlin; i++) {
        widest = MW_MAX(widest, MW_MAX(lin[i][0], lin[i][1]));
        key = key * 1000003u + (unsigned long long)lin[i][0] * 31u + (unsigned long long)lin[i][1];
    }
    /* The same shapes again (a planner trying knobs on one model) touch nothing new: done once. */
    static _Atomic long long warmed[4];
    static _Atomic unsigned long long warmed_key;
    if (warmed[0] == N && warmed[1] == C && warmed[2] == V && warmed[3] == nt && warmed_key == key) return;
    size_t in_bytes = map_bytes(MW_MAX((size_t)N, (size_t)widest) * (size_t)MW_MAX(V, widest) + (size_t)V * (size_t)C);
    float *in = mmap(NULL, in_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (in == MAP_FAILED) return;
    openblas_set_num_threads(1);
    for (int i = 0; i < nlin; i++) {
        int IC = lin[i][0], OC = lin[i][1];
        if ((size_t)N * (size_t)MW_MAX(IC, OC) > out_n) continue; /* no room in out: skipped */
        mw_k_sgemm(0, 0, N, OC, IC, 1.0f, in, IC, in, OC, 0.0f, out, OC, nt); /* forward */
        mw_k_sgemm(0, 1, N, IC, OC, 1.0f, in, OC, in, OC, 0.0f, out, IC, nt); /* dinp */
        if ((size_t)IC * (size_t)OC <= out_n)
            mw_k_sgemm(1, 0, IC, OC, N, 1.0f, in, IC, in, OC, 0.0f, out, OC, nt); /* dw */
    }
    int rows = (int)MW_MIN((size_t)V, out_n / (size_t)C);
    mw_k_sgemm(0, 1, N, V, C, 1.0f, in, C, in, C, 0.0f, out, V, nt);        /* logits */
    mw_k_sgemm(0, 0, N, C, V, 1.0f, in, V, in, C, 0.0f, out, C, nt);        /* dlogits @ embedding */
    mw_k_sgemm(1, 0, rows, C, N, 1.0f, in, V, in, C, 0.0f, out, C, nt);    /* the embedding's share (rows of it) */
    munmap(in, in_bytes);
    size_t page = 4096, lo = MW_ALIGN_UP((uintptr_t)out, page), hi = ((uintptr_t)(out + out_n)) / page * page;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* contents are rewritten before use */
    warmed[0] = N;
    warmed[1] = C;
    warmed[2] = V;
    warmed[3] = nt;
    warmed_key = key;
}
