/*
 * test_net_toy.c — the proof that a model family is added through the table alone (docs/model.md):
 * a toy family defined here, in the test (a token embedding E [V, C] and an output matrix W [C, V]:
 * two weight units, logits = E[x] W, cross-entropy), filled into struct mw_net_family and handed
 * to the trainer, which has never heard of it. It trains:
 *  - resident (everything in DRAM), with the optimizer state on NVMe, and with its weights and
 *    gradients streamed from NVMe, batch-major and layer-major: every run's losses and final
 *    weights bitwise the resident run's;
 *  - and it learns (the loss falls).
 * Nothing in src/train, src/cli or src/plan names this family.
 */
#include "memwall/model.h"
#include "memwall/plan.h"
#include "memwall/train.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct toy_cfg { int vocab, width, context; };
struct toy {
    float *params, *grads, *h, *logits; /* h [BT, C], logits [BT, V] (backward: dlogits) */
    int32_t *x, *t;
    int B, T, has_targets;
    mw_net_weights_fn hook;
    void *user;
};
#define TC(n) ((const struct toy_cfg *)(n)->cfg.raw)
#define TY(n) ((struct toy *)(n)->impl)

static int cfg_check(const void *c)
{
    const struct toy_cfg *t = c;
    return t->vocab > 1 && t->width > 0 && t->context > 0 ? 0 : mw_error_set(-EINVAL, "toy: bad config");
}
static void cfg_describe(const void *c, struct mw_model *d)
{
    const struct toy_cfg *t = c;
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "toy");
    d->arch = MW_ARCH_BARE;
    d->bare_params = 2ull * (uint64_t)t->vocab * (uint64_t)t->width;
    d->vocab = (uint64_t)t->vocab;
    d->hidden = (uint64_t)t->width;
    d->max_pos = (uint64_t)t->context;
}
static void cfg_summary(const void *c, char *b, size_t n)
{
    snprintf(b, n, "toy V=%d C=%d", ((const struct toy_cfg *)c)->vocab, ((const struct toy_cfg *)c)->width);
}
static void cfg_encode(const void *c, uint8_t w[MW_NET_CONFIG_WIRE]) { memset(w, 0, MW_NET_CONFIG_WIRE); memcpy(w, c, sizeof(struct toy_cfg)); }
static int cfg_decode(const uint8_t w[MW_NET_CONFIG_WIRE], void *c) { memcpy(c, w, sizeof(struct toy_cfg)); return cfg_check(c); }
static int sizes(const void *c, const struct mw_net_options *o, struct mw_net_sizes *s)
{
    const struct toy_cfg *t = c;
    size_t n = 2 * (size_t)t->vocab * (size_t)t->width, bt = (size_t)o->max_batch * (size_t)(o->max_seq ? o->max_seq : t->context);
    *s = (struct mw_net_sizes){n, n * 4, n * 4, bt * ((size_t)t->width + (size_t)t->vocab) * 4, 0};
    s->acts_bytes_full = s->acts_bytes;
    return 0;
}
static int from_shape(const struct mw_net_shape *sh, void *c)
{
    *(struct toy_cfg *)c = (struct toy_cfg){sh->vocab, sh->width, sh->context};
    return cfg_check(c);
}
static int from_file(const char *p, const struct mw_net_shape *g, void *c, char *note, size_t n)
{
    (void)p; (void)g; (void)c; (void)note; (void)n;
    return mw_error_set(-ENOTSUP, "toy: no files");
}
static void to_shape(const void *c, struct mw_net_shape *sh)
{
    const struct toy_cfg *t = c;
    *sh = (struct mw_net_shape){0, 0, t->width, t->context, t->vocab};
}
static float *pages(size_t n) { float *p = NULL; return posix_memalign((void **)&p, 4096, MW_ALIGN_UP(n * 4, 4096)) ? NULL : memset(p, 0, MW_ALIGN_UP(n * 4, 4096)); }
static int init(struct mw_net *n, const struct mw_net_options *o)
{
    const struct toy_cfg *c = TC(n);
    struct toy *t = calloc(1, sizeof *t);
    n->impl = t;
    n->opts = *o;
    if (!n->opts.max_seq) n->opts.max_seq = c->context;
    sizes(c, &n->opts, &n->sizes);
    size_t bt = (size_t)o->max_batch * (size_t)n->opts.max_seq;
    t->params = pages(n->sizes.n_params);
    t->grads = pages(n->sizes.n_params);
    t->h = pages(bt * (size_t)c->width);
    t->logits = pages(bt * (size_t)c->vocab);
    t->x = calloc(bt, sizeof *t->x);
    t->t = calloc(bt, sizeof *t->t);
    n->params = t->params;
    n->grads = t->grads;
    n->n_units = 2;
    n->n_layer = 0;
    n->vocab = n->padded_vocab = c->vocab;
    n->context = c->context;
    n->loss = -1;
    return 0;
}
static void net_free(struct mw_net *n)
{
    struct toy *t = TY(n);
    if (!t) return;
    free(t->params); free(t->grads); free(t->h); free(t->logits); free(t->x); free(t->t); free(t);
    n->impl = NULL;
}
static float initval(uint64_t seed, size_t i)
{
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((float)(z >> 40) / 16777216.0f - 0.5f) * 0.2f;
}
static int unit_range(const struct mw_net *n, int u, size_t *first, size_t *cnt)
{
    if (u < 0 || u > 1) return -EINVAL;
    size_t half = n->sizes.n_params / 2;
    *first = u ? half : 0;
    *cnt = half;
    return 0;
}
static void init_weights(struct mw_net *n, uint64_t seed) { for (size_t i = 0; i < n->sizes.n_params; i++) n->params[i] = initval(seed, i); }
static int init_weights_unit(struct mw_net *n, uint64_t seed, int u)
{
    size_t a, c;
    if (unit_range(n, u, &a, &c)) return -EINVAL;
    for (size_t i = a; i < a + c; i++) n->params[i] = initval(seed, i);
    return 0;
}
static void warm(const struct mw_net *n) { (void)n; }
static void unit_name(const struct mw_net *n, int u, char *b, size_t l) { (void)n; snprintf(b, l, u ? "head" : "embed"); }
static int unit_order(const struct mw_net *n, enum mw_net_pass pass, int lm, int *o, int max)
{
    (void)n; (void)lm;
    int seq[2] = {pass == MW_NET_FORWARD ? 0 : 1, pass == MW_NET_FORWARD ? 1 : 0};
    for (int k = 0; k < 2 && k < max; k++) o[k] = seq[k];
    return 2;
}
static int n_tensors(const struct mw_net *n) { (void)n; return 2; }
static void tensor(const struct mw_net *n, int i, struct mw_net_tensor *o)
{
    const struct toy_cfg *c = TC(n);
    size_t V = (size_t)c->vocab, C = (size_t)c->width;
    *o = (struct mw_net_tensor){i ? "head.weight" : "embed.weight", 2, {i ? C : V, i ? V : C}, i ? V * C : 0, V * C};
}
static void set_hook(struct mw_net *n, mw_net_weights_fn fn, void *user) { TY(n)->hook = fn; TY(n)->user = user; }
static int hook(struct mw_net *n, int ev, int u, int bw) { return TY(n)->hook ? TY(n)->hook(TY(n)->user, ev, u, bw) : 0; }

/* One micro-batch's forward into h/logits (at offset `at` rows); returns the mean loss. */
static float fwd_rows(struct mw_net *n, const int32_t *x, const int32_t *tg, int N, float *h, float *lg)
{
    const struct toy_cfg *c = TC(n);
    int V = c->vocab, C = c->width;
    const float *E = n->params, *W = n->params + (size_t)V * C;
    double loss = 0;
    for (int i = 0; i < N; i++) {
        memcpy(h + (size_t)i * C, E + (size_t)x[i] * C, (size_t)C * 4);
        float *l = lg + (size_t)i * V, mx = -INFINITY;
        for (int v = 0; v < V; v++) {
            float s = 0;
            for (int k = 0; k < C; k++) s += h[(size_t)i * C + k] * W[(size_t)k * V + v];
            l[v] = s;
            mx = fmaxf(mx, s);
        }
        double z = 0;
        for (int v = 0; v < V; v++) z += exp((double)(l[v] - mx));
        if (tg) loss += log(z) + mx - l[tg[i]];
        for (int v = 0; v < V && tg; v++) l[v] = (float)(exp((double)(l[v] - mx)) / z); /* softmax kept for backward */
    }
    return (float)(loss / N);
}
static void bwd_head(struct mw_net *n, const int32_t *tg, int N, const float *h, float *lg, float scale)
{
    const struct toy_cfg *c = TC(n);
    int V = c->vocab, C = c->width;
    float *dW = n->grads + (size_t)V * C;
    for (int i = 0; i < N; i++) {
        float *d = lg + (size_t)i * V;
        d[tg[i]] -= 1.0f;
        for (int v = 0; v < V; v++) d[v] *= scale / (float)N;
        for (int k = 0; k < C; k++)
            for (int v = 0; v < V; v++) dW[(size_t)k * V + v] += h[(size_t)i * C + k] * d[v];
    }
}
static void bwd_embed(struct mw_net *n, const int32_t *x, int N, const float *lg)
{
    const struct toy_cfg *c = TC(n);
    int V = c->vocab, C = c->width;
    const float *W = n->params + (size_t)V * C;
    for (int i = 0; i < N; i++)
        for (int k = 0; k < C; k++) {
            float s = 0;
            for (int v = 0; v < V; v++) s += lg[(size_t)i * V + v] * W[(size_t)k * V + v];
            n->grads[(size_t)x[i] * C + k] += s;
        }
}
static int forward(struct mw_net *n, const int32_t *x, const int32_t *tg, int B, int T)
{
    struct toy *t = TY(n);
    int N = B * T, rc;
    if ((rc = hook(n, MW_NET_UNIT_ACQUIRE, 0, 0)) || (rc = hook(n, MW_NET_UNIT_RELEASE, 0, 0)) ||
        (rc = hook(n, MW_NET_UNIT_ACQUIRE, 1, 0)))
        return rc;
    n->loss = fwd_rows(n, x, tg, N, t->h, t->logits);
    if ((rc = hook(n, MW_NET_UNIT_RELEASE, 1, 0))) return rc;
    memcpy(t->x, x, (size_t)N * sizeof *x);
    if (tg) memcpy(t->t, tg, (size_t)N * sizeof *tg);
    t->B = B; t->T = T; t->has_targets = tg != NULL;
    if (!tg) n->loss = -1;
    return 0;
}
static const float *logits(const struct mw_net *n) { return TY(n)->logits; }
static int backward(struct mw_net *n, float scale, mw_net_grad_ready_fn cb, void *user)
{
    struct toy *t = TY(n);
    int N = t->B * t->T, rc;
    size_t half = n->sizes.n_params / 2;
    if (!t->has_targets) return -EINVAL;
    /* Gradients are final from the top of the flat array down: the head, then the embedding. */
    if ((rc = hook(n, MW_NET_UNIT_ACQUIRE, 1, 1))) return rc;
    bwd_head(n, t->t, N, t->h, t->logits, scale);
    bwd_embed(n, t->x, N, t->logits);
    if ((rc = hook(n, MW_NET_UNIT_RELEASE, 1, 1))) return rc;
    if (cb) cb(half, half, user);
    if ((rc = hook(n, MW_NET_UNIT_ACQUIRE, 0, 1)) || (rc = hook(n, MW_NET_UNIT_RELEASE, 0, 1))) return rc;
    if (cb) cb(0, half, user);
    t->has_targets = 0;
    return 0;
}
static int accum_set(struct mw_net *n, int i, int c) { (void)n; return i >= 0 && (i < c || c <= 1) ? 0 : -EINVAL; }
static size_t defer_bytes(const struct mw_net *n, int c) { (void)n; (void)c; return 0; }
static size_t lm_bytes(const struct mw_net *n, int nmb, int acts)
{
    (void)acts;
    const struct toy_cfg *c = TC(n);
    return (size_t)nmb * (size_t)n->opts.max_batch * (size_t)n->opts.max_seq * ((size_t)c->width + (size_t)c->vocab) * 4;
}
/* Every micro-batch through each unit in turn: the same sums in the same order as nmb forward +
 * backward calls (the head's gradient, then the embedding's, each over the micro-batches in order). */
static int step_lm(struct mw_net *n, int nmb, const int32_t *x, const int32_t *tg, int B, int T, float scale,
                   const struct mw_net_lm_calls *calls, float *losses)
{
    const struct toy_cfg *c = TC(n);
    int N = B * T, rc = 0;
    size_t half = n->sizes.n_params / 2;
    float *h = malloc((size_t)nmb * N * c->width * 4), *lg = malloc((size_t)nmb * N * c->vocab * 4);
    if (!h || !lg) { free(h); free(lg); return -ENOMEM; }
    if ((rc = hook(n, MW_NET_UNIT_ACQUIRE, 0, 0)) || (rc = hook(n, MW_NET_UNIT_RELEASE, 0, 0)) ||
        (rc = hook(n, MW_NET_UNIT_ACQUIRE, 1, 0)))
        goto out;
    for (int k = 0; k < nmb; k++)
        losses[k] = fwd_rows(n, x + (size_t)k * N, tg + (size_t)k * N, N, h + (size_t)k * N * c->width,
                             lg + (size_t)k * N * c->vocab);
    if ((rc = hook(n, MW_NET_UNIT_RELEASE, 1, 0))) goto out;
    if (calls && calls->before_grads && (rc = calls->before_grads(calls->user))) goto out;
    if ((rc = hook(n, MW_NET_UNIT_ACQUIRE, 1, 1))) goto out;
    for (int k = 0; k < nmb; k++)
        bwd_head(n, tg + (size_t)k * N, N, h + (size_t)k * N * c->width, lg + (size_t)k * N * c->vocab, scale);
    for (int k = 0; k < nmb; k++) bwd_embed(n, x + (size_t)k * N, N, lg + (size_t)k * N * c->vocab);
    if ((rc = hook(n, MW_NET_UNIT_RELEASE, 1, 1))) goto out;
    if (calls && calls->grad_ready) calls->grad_ready(half, half, calls->user);
    if ((rc = hook(n, MW_NET_UNIT_ACQUIRE, 0, 1)) || (rc = hook(n, MW_NET_UNIT_RELEASE, 0, 1))) goto out;
    if (calls && calls->grad_ready) calls->grad_ready(0, half, calls->user);
out:
    free(h);
    free(lg);
    return rc;
}
static size_t slot_bytes(const struct mw_net *n) { (void)n; return 4096; }
static void acts_lend(struct mw_net *n, float *s) { (void)n; (void)s; }
static size_t own_block(const struct mw_net *n) { (void)n; return 0; }
static void zero_grad(struct mw_net *n) { memset(n->grads, 0, n->sizes.grads_bytes); }
static int no_files(struct mw_net *n, const char *p) { (void)n; (void)p; return mw_error_set(-ENOTSUP, "toy: no files"); }
static int no_open(void **l, const struct mw_net *n, const char *p) { (void)l; (void)n; (void)p; return mw_error_set(-ENOTSUP, "toy: no files"); }
static int no_unit(void *l, struct mw_net *n, int u) { (void)l; (void)n; (void)u; return -ENOTSUP; }
static void no_close(void *l) { (void)l; }
static int no_save(const struct mw_net *n, const char *p, mw_net_weights_fn f, void *u) { (void)n; (void)p; (void)f; (void)u; return -ENOTSUP; }

static const struct mw_net_family toy_family = {
    .name = "toy", .id = 0x70790000u,
    .config_check = cfg_check, .config_describe = cfg_describe, .config_summary = cfg_summary,
    .config_encode = cfg_encode, .config_decode = cfg_decode, .sizes = sizes,
    .config_from_shape = from_shape, .config_from_file = from_file, .config_shape = to_shape,
    .init = init, .free = net_free, .init_weights = init_weights, .init_weights_unit = init_weights_unit,
    .warm_runtime = warm, .unit_range = unit_range, .unit_name = unit_name, .unit_order = unit_order,
    .n_tensors = n_tensors, .tensor = tensor, .set_weights_hook = set_hook,
    .forward = forward, .logits = logits, .backward = backward, .accum_set = accum_set, .defer_bytes = defer_bytes,
    .step_layer_major = step_lm, .lm_bytes = lm_bytes, .act_slot_bytes = slot_bytes, .acts_lend = acts_lend,
    .own_block_bytes = own_block, .zero_grad = zero_grad,
    .load_safetensors = no_files, .loader_open = no_open, .loader_unit = no_unit, .loader_close = no_close,
    .save_safetensors_units = no_save,
};

/* ------------------------------------------------------------------ the runs */

static char g_dir[600];

struct result { float loss[16]; uint8_t *state; size_t n; };

static void run(const struct mw_net_config *nc, const struct mw_data *d, const char *how, struct result *r)
{
    struct mw_train_config c = {
        .batch = 4, .seq = 8, .grad_accum = 2, .steps = 12, .lr = 0.05, .warmup = 2, .min_lr_frac = 0.1,
        .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .clip = 1.0, .val_every = 0,
        .val_batches = 1, .seed = 5, .threads = 2, .tier = MW_TIER_DRAM, .subgroup_size = 4096, .buffer_count = 3,
        .prefetch_depth = 1,
    };
    char nv[700];
    snprintf(nv, sizeof nv, "%s/%s", g_dir, how);
    c.nvme_dir = nv;
    if (strcmp(how, "dram")) c.tier = MW_TIER_NVME;
    if (!strcmp(how, "stream-bm") || !strcmp(how, "stream-lm")) c.offload_params = MW_TIER_NVME;
    if (!strcmp(how, "stream-lm")) c.layer_major = 1;
    if (!strcmp(how, "stream-bm")) c.sync_update = 1; /* either way: same results */
    struct mw_trainer tr;
    int err = mw_trainer_init(&tr, nc, &c, d);
    CHECK_MSG(err == 0, "%s: %s", how, mw_error_msg());
    if (err) return;
    for (int s = 0; s < 12; s++) {
        struct mw_train_step_stats st;
        err = mw_trainer_step(&tr, &st);
        CHECK_MSG(err == 0, "%s step %d: %s", how, s, mw_error_msg());
        if (err) break;
        r->loss[s] = st.loss;
    }
    CHECK(mw_trainer_finish(&tr) == 0);
    /* The state as the run ends, through a checkpoint (the residency interface brings each unit
     * in, streamed ones from NVMe): the weights and the optimizer's moments after the header. */
    char ck[800];
    snprintf(ck, sizeof ck, "%s/%s.mwck", g_dir, how);
    CHECK_MSG(mw_trainer_save(&tr, "", ck) == 0, "%s: %s", how, mw_error_msg());
    FILE *f = fopen(ck, "rb");
    if (f && !fseek(f, 0, SEEK_END)) {
        long len = ftell(f);
        r->n = len > 1024 + 24 ? (size_t)len - 1024 - 24 : 0;
        r->state = malloc(r->n ? r->n : 1);
        CHECK(!fseek(f, 1024, SEEK_SET) && fread(r->state, 1, r->n, f) == r->n);
    }
    if (f) fclose(f);
    mw_trainer_free(&tr);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", tu_scratch_dir("net_toy"));
    char path[700];
    snprintf(path, sizeof path, "%s/text.txt", g_dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    for (int i = 0; i < 4000; i++) fputc("abcab cba "[i % 10], f);
    fclose(f);
    struct mw_data d;
    struct mw_data_opts o;
    mw_data_opts_default(&o);
    REQUIRE(mw_data_open(&d, path, &o) == 0);
    struct toy_cfg tc = {MW_TOK_BYTE_VOCAB, 8, 16};
    struct mw_net_config nc = {&toy_family, {0}};
    memcpy(nc.raw, &tc, sizeof tc);

    const char *how[] = {"dram", "nvme", "stream-bm", "stream-lm"};
    struct result r[4];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 4; i++) run(&nc, &d, how[i], &r[i]);
    CHECK_MSG(r[0].loss[11] < r[0].loss[0] - 0.5f, "the toy does not learn: %g -> %g", r[0].loss[0], r[0].loss[11]);
    for (int i = 1; i < 4; i++) {
        CHECK_MSG(!memcmp(r[i].loss, r[0].loss, sizeof r[0].loss), "%s: losses differ from the resident run's", how[i]);
        CHECK_MSG(r[i].state && r[0].state && r[i].n == r[0].n && r[0].n > 0 && !memcmp(r[i].state, r[0].state, r[0].n),
                  "%s: final weights or moments differ from the resident run's", how[i]);
    }
    for (int i = 0; i < 4; i++) free(r[i].state);
    mw_data_free(&d);
    tu_rm_rf(g_dir);
    TEST_END();
}
