/*
 * foreign.c — the "foreign" family (memwall/foreign.h): a model table filled from a caller's
 * description, for models whose passes run in another framework (PyTorch, issue 25).
 *
 * Why this shape: everything memwall does around a model (streaming a unit at a time from NVMe,
 * the optimizer over its tensors, the planner's walk, checking each acquire against the order)
 * reads only the table's flat arrays, unit ranges, names and unit orders. Those come from the
 * description; the passes do not exist here, so their entries refuse with a message and the
 * caller reports its units through mw_net_foreign_unit, which calls the weights hook the residency
 * machine set, exactly where a family's own pass would.
 *
 * Ownership: the config (mw_net_config.raw) holds a pointer to a description. Before a net is
 * built it is the caller's; init copies it into the net (arrays and names) and points the net's
 * config at the copy, so nothing in the net depends on the caller's memory afterwards.
 *
 * Checkpoint encoding (MW_NET_CONFIG_WIRE bytes, little-endian): u32 version (1), u32 units,
 * u64 parameters, u32 crc32c of the description (units, orders, names, tensors); the rest zero.
 * It tells two descriptions apart (mw_net_config_same) but cannot rebuild one: decode refuses.
 */
#include "memwall/foreign.h"
#include "memwall/common.h"
#include "memwall/offload.h"
#include "memwall/plan.h"
#include "gpt2_internal.h" /* mw_net_floats_alloc */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(MW_FOREIGN_NAME_MAX <= MW_OFFLOAD_NAME_MAX, "a foreign tensor name fits the optimizer's registry");

/* What mw_net_config.raw holds. */
struct foreign_cfg {
    const struct mw_foreign_desc *d;
    uint64_t n_params;
};
_Static_assert(sizeof(struct foreign_cfg) <= MW_NET_CONFIG_BYTES, "the foreign config fits mw_net_config.raw");

/* The net's instance: its own copy of the description, and the hook a residency machine set. */
struct foreign {
    struct mw_foreign_desc d;     /* points into the arrays below */
    uint64_t *unit_numel;         /* [n_units] */
    uint64_t *first;              /* [n_units + 1] first element of each unit; [n_units] = n_params */
    int *fwd, *bwd;               /* [n_fwd], [n_bwd] */
    char **unit_names;            /* [n_units] the caller's names, or "unit.<i>" */
    struct mw_foreign_tensor *tensors; /* [n_tensors] names owned */
    uint64_t *t_first;            /* [n_tensors] first element of each tensor */
    mw_net_weights_fn hook;
    void *user;
    int init_err;                 /* first error of init_unit in init_weights */
};

#define FCFG(raw) ((const struct foreign_cfg *)(raw))
#define FOR(n) ((struct foreign *)(n)->impl)

static int name_ok(const char *s) { return s && *s && strlen(s) < MW_FOREIGN_NAME_MAX; }

static int order_check(const int *o, int n, int n_units, const char *pass)
{
    if (n > 0 && !o) return mw_error_set(-EINVAL, "foreign model: the %s order of %d units is missing", pass, n);
    for (int p = 0; p < n; p++)
        if (o[p] < 0 || o[p] >= n_units)
            return mw_error_set(-EINVAL, "foreign model: the %s order names unit %d at position %d; the units are 0..%d",
                                pass, o[p], p, n_units - 1);
    return 0;
}

/* The tensors lie end to end over the units, none across a unit's end; names unique. */
static int tensors_check(const struct mw_foreign_desc *d, uint64_t n_params)
{
    if (!d->tensors) return mw_error_set(-EINVAL, "foreign model: %d tensors announced, none given", d->n_tensors);
    uint64_t off = 0;
    int u = 0;
    uint64_t unit_end = d->unit_numel[0];
    for (int i = 0; i < d->n_tensors; i++) {
        const struct mw_foreign_tensor *t = &d->tensors[i];
        if (!name_ok(t->name) || !t->numel)
            return mw_error_set(-EINVAL, "foreign model: tensor %d has no name, a name of %d or more characters, or no "
                                "elements", i, MW_FOREIGN_NAME_MAX);
        for (int j = 0; j < i; j++)
            if (!strcmp(d->tensors[j].name, t->name))
                return mw_error_set(-EINVAL, "foreign model: tensor '%s' is given twice (tensors %d and %d)", t->name, j, i);
        while (off >= unit_end && u + 1 < d->n_units) unit_end += d->unit_numel[++u];
        if (off + t->numel > unit_end || off + t->numel < off)
            return mw_error_set(-EINVAL, "foreign model: tensor '%s' (%llu elements from %llu) crosses the end of unit %d "
                                "at element %llu: a tensor belongs to one unit", t->name, (unsigned long long)t->numel,
                                (unsigned long long)off, u, (unsigned long long)unit_end);
        off += t->numel;
    }
    if (off != n_params)
        return mw_error_set(-EINVAL, "foreign model: the tensors hold %llu elements, the units %llu",
                            (unsigned long long)off, (unsigned long long)n_params);
    return 0;
}

/* Checks d; *n_params = its elements. */
static int desc_check(const struct mw_foreign_desc *d, uint64_t *n_params)
{
    if (!d) return mw_error_set(-EINVAL, "foreign model: no description");
    if (d->n_units < 1 || d->n_units > MW_FOREIGN_MAX_UNITS || !d->unit_numel)
        return mw_error_set(-EINVAL, "foreign model: %d units (1..%d, each with its element count)", d->n_units,
                            MW_FOREIGN_MAX_UNITS);
    uint64_t n = 0;
    for (int u = 0; u < d->n_units; u++) {
        const char *name = d->unit_names ? d->unit_names[u] : "x";
        if (!name_ok(name))
            return mw_error_set(-EINVAL, "foreign model: unit %d has no name or a name of %d or more characters", u,
                                MW_FOREIGN_NAME_MAX);
        /* An fp32 array of n elements must be addressable as bytes (and page-rounded). */
        if (!d->unit_numel[u] || mw_add_u64(n, d->unit_numel[u], &n) || n > (SIZE_MAX / 8))
            return mw_error_set(-EINVAL, "foreign model: unit %d (%s) has %llu elements: each unit needs some, and the "
                                "model at most %zu", u, name, (unsigned long long)d->unit_numel[u], SIZE_MAX / 8);
    }
    if (d->n_fwd < 1 || d->n_bwd < 0)
        return mw_error_set(-EINVAL, "foreign model: a forward order of %d units and a backward order of %d (>= 1, >= 0)",
                            d->n_fwd, d->n_bwd);
    int err = order_check(d->fwd_order, d->n_fwd, d->n_units, "forward");
    if (!err) err = order_check(d->bwd_order, d->n_bwd, d->n_units, "backward");
    if (!err && d->n_tensors < 0) err = mw_error_set(-EINVAL, "foreign model: %d tensors", d->n_tensors);
    if (!err && d->n_tensors > 0) err = tensors_check(d, n);
    if (!err) *n_params = n;
    return err;
}

/* ---------------------------------------------------------------- config */

static int cfg_check(const void *raw)
{
    uint64_t n;
    int err = desc_check(FCFG(raw)->d, &n);
    if (!err && n != FCFG(raw)->n_params)
        err = mw_error_set(-EINVAL, "foreign model: the description changed (%llu elements, the config says %llu)",
                           (unsigned long long)n, (unsigned long long)FCFG(raw)->n_params);
    return err;
}

static uint64_t largest_unit(const struct mw_foreign_desc *d)
{
    uint64_t m = 0;
    for (int u = 0; u < d->n_units; u++) m = MW_MAX(m, d->unit_numel[u]);
    return m;
}

/* The planner sees a bare parameter count; its stream walk takes the units and their order from
 * the table, with n_layer = the units between the first and the last (its layout's blocks). */
static void cfg_describe(const void *raw, struct mw_model *m)
{
    const struct foreign_cfg *c = raw;
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "foreign (%d units)", c->d->n_units);
    m->arch = MW_ARCH_BARE;
    m->n_layer = c->d->n_units >= 2 ? (uint64_t)c->d->n_units - 2 : 0;
    m->bare_params = c->n_params;
    m->bare_largest = largest_unit(c->d);
}

static void cfg_summary(const void *raw, char *b, size_t n)
{
    const struct foreign_cfg *c = raw;
    snprintf(b, n, "foreign units=%d params=%llu", c->d->n_units, (unsigned long long)c->n_params);
}

/* Unit u's name: the caller's, or "unit.<u>". */
static const char *unit_name_of(const struct mw_foreign_desc *d, int u, char *buf, size_t len)
{
    if (d->unit_names) snprintf(buf, len, "%s", d->unit_names[u]);
    else snprintf(buf, len, "unit.%d", u);
    return buf;
}

static uint32_t crc_str(uint32_t crc, const char *s) { return mw_crc32c(crc, s, strlen(s) + 1); }

static uint32_t desc_digest(const struct mw_foreign_desc *d)
{
    uint32_t crc = mw_crc32c(0, d->unit_numel, (size_t)d->n_units * sizeof *d->unit_numel);
    crc = mw_crc32c(crc, d->fwd_order, (size_t)d->n_fwd * sizeof *d->fwd_order);
    if (d->n_bwd) crc = mw_crc32c(crc, d->bwd_order, (size_t)d->n_bwd * sizeof *d->bwd_order);
    for (int u = 0; u < d->n_units; u++) {
        char name[MW_FOREIGN_NAME_MAX];
        crc = crc_str(crc, unit_name_of(d, u, name, sizeof name));
    }
    for (int i = 0; i < d->n_tensors; i++) {
        crc = crc_str(crc, d->tensors[i].name);
        crc = mw_crc32c(crc, &d->tensors[i].numel, sizeof d->tensors[i].numel);
        crc = mw_crc32c(crc, &d->tensors[i].no_decay, sizeof d->tensors[i].no_decay);
    }
    return crc;
}

static void put_le(uint8_t *w, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) w[i] = (uint8_t)(v >> (8 * i));
}

static void cfg_encode(const void *raw, uint8_t wire[MW_NET_CONFIG_WIRE])
{
    const struct foreign_cfg *c = raw;
    memset(wire, 0, MW_NET_CONFIG_WIRE);
    put_le(wire, 1, 4);
    put_le(wire + 4, (uint64_t)c->d->n_units, 4);
    put_le(wire + 8, c->n_params, 8);
    put_le(wire + 16, desc_digest(c->d), 4);
}

static int cfg_decode(const uint8_t wire[MW_NET_CONFIG_WIRE], void *raw)
{
    (void)wire;
    (void)raw;
    return mw_error_set(-ENOTSUP, "a foreign model (one described by its caller, e.g. PyTorch) cannot be rebuilt from "
                        "a checkpoint: its description comes from the caller");
}

static int cfg_sizes(const void *raw, const struct mw_net_options *o, struct mw_net_sizes *s)
{
    (void)o;
    const struct foreign_cfg *c = raw;
    memset(s, 0, sizeof *s);
    s->n_params = (size_t)c->n_params;
    s->params_bytes = s->grads_bytes = (size_t)c->n_params * sizeof(float);
    return 0; /* activations are the caller's */
}

static int no_shape(const struct mw_net_shape *sh, void *raw)
{
    (void)sh;
    (void)raw;
    return mw_error_set(-ENOTSUP, "a foreign model is described by its caller, not by a shape");
}

static int no_file(const char *path, const struct mw_net_shape *given, void *raw, char *note, size_t n)
{
    (void)given;
    (void)raw;
    (void)note;
    (void)n;
    return mw_error_set(-ENOTSUP, "%s: a foreign model is described by its caller, not by a weights file", path);
}

static void to_shape(const void *raw, struct mw_net_shape *sh)
{
    (void)raw;
    memset(sh, 0, sizeof *sh);
}

int mw_foreign_config(struct mw_net_config *c, const struct mw_foreign_desc *d)
{
    memset(c, 0, sizeof *c);
    struct foreign_cfg fc = {d, 0};
    int err = desc_check(d, &fc.n_params);
    if (err) return err;
    c->family = &mw_net_foreign;
    memcpy(c->raw, &fc, sizeof fc);
    return 0;
}

/* ---------------------------------------------------------------- an instance */

static void f_free(struct mw_net *n)
{
    struct foreign *f = FOR(n);
    if (!f) return;
    mw_net_floats_free(n->params, n->sizes.n_params);
    mw_net_floats_free(n->grads, n->sizes.n_params);
    for (int u = 0; f->unit_names && u < f->d.n_units; u++) free(f->unit_names[u]);
    for (int i = 0; f->tensors && i < f->d.n_tensors; i++) free((char *)f->tensors[i].name);
    free(f->unit_names);
    free(f->tensors);
    free(f->t_first);
    free(f->unit_numel);
    free(f->first);
    free(f->fwd);
    free(f->bwd);
    free(f);
    n->impl = NULL;
    n->params = n->grads = NULL;
}

/* f->d := a copy of d (checked before) that owns its arrays and names. */
static int desc_copy(struct foreign *f, const struct mw_foreign_desc *d)
{
    size_t nu = (size_t)d->n_units, nt = (size_t)d->n_tensors;
    f->d = *d;
    f->d.unit_names = NULL;
    f->d.tensors = NULL;
    f->d.n_tensors = 0; /* counts the names copied so far (f_free frees those) */
    f->unit_numel = malloc(nu * sizeof *f->unit_numel);
    f->first = malloc((nu + 1) * sizeof *f->first);
    f->fwd = malloc((size_t)d->n_fwd * sizeof *f->fwd);
    f->bwd = malloc(((size_t)d->n_bwd + 1) * sizeof *f->bwd);
    f->unit_names = calloc(nu, sizeof *f->unit_names); /* the caller's names, or "unit.<i>" */
    f->tensors = nt ? calloc(nt, sizeof *f->tensors) : NULL;
    f->t_first = nt ? calloc(nt, sizeof *f->t_first) : NULL;
    if (!f->unit_numel || !f->first || !f->fwd || !f->bwd || !f->unit_names || (nt && (!f->tensors || !f->t_first)))
        return mw_error_set(-ENOMEM, "foreign model: no memory for the description of %d units", d->n_units);
    memcpy(f->unit_numel, d->unit_numel, nu * sizeof *f->unit_numel);
    memcpy(f->fwd, d->fwd_order, (size_t)d->n_fwd * sizeof *f->fwd);
    if (d->n_bwd) memcpy(f->bwd, d->bwd_order, (size_t)d->n_bwd * sizeof *f->bwd);
    f->first[0] = 0;
    for (size_t u = 0; u < nu; u++) f->first[u + 1] = f->first[u] + d->unit_numel[u];
    for (size_t u = 0; u < nu; u++) {
        char name[MW_FOREIGN_NAME_MAX];
        if (!(f->unit_names[u] = strdup(unit_name_of(d, (int)u, name, sizeof name))))
            return mw_error_set(-ENOMEM, "foreign model: no memory for the unit names");
    }
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++, f->d.n_tensors++) {
        f->tensors[i] = d->tensors[i];
        if (!(f->tensors[i].name = strdup(d->tensors[i].name)))
            return mw_error_set(-ENOMEM, "foreign model: no memory for the tensor names");
        f->t_first[i] = off;
        off += d->tensors[i].numel;
    }
    f->d.unit_numel = f->unit_numel;
    f->d.fwd_order = f->fwd;
    f->d.bwd_order = f->bwd;
    f->d.unit_names = (const char *const *)f->unit_names;
    f->d.tensors = f->tensors;
    return 0;
}

static int f_init(struct mw_net *n, const struct mw_net_options *o)
{
    struct foreign_cfg *c = (struct foreign_cfg *)n->cfg.raw;
    struct foreign *f = calloc(1, sizeof *f);
    if (!f) return mw_error_set(-ENOMEM, "foreign model: no memory");
    n->impl = f;
    int err = desc_copy(f, c->d);
    if (err) {
        f_free(n);
        return err;
    }
    c->d = &f->d; /* the net's own copy from here on */
    n->opts = *o;
    cfg_sizes(c, o, &n->sizes);
    /* Fresh mappings: untouched pages cost nothing, and streaming returns pages with madvise. */
    n->params = mw_net_floats_alloc(n->sizes.n_params);
    n->grads = mw_net_floats_alloc(n->sizes.n_params);
    if (!n->params || !n->grads) {
        f_free(n);
        return mw_error_set(-ENOMEM, "foreign model: no address space for 2 x %llu fp32 elements",
                            (unsigned long long)c->n_params);
    }
    n->n_units = f->d.n_units;
    n->n_layer = f->d.n_units >= 2 ? f->d.n_units - 2 : 0;
    n->loss = -1;
    return 0;
}

static void unit_name_(const struct foreign *f, int u, char *buf, size_t len) { snprintf(buf, len, "%s", f->unit_names[u]); }

static int f_init_weights_unit(struct mw_net *n, uint64_t seed, int u)
{
    (void)seed; /* the weights are the caller's */
    struct foreign *f = FOR(n);
    if (u < 0 || u >= f->d.n_units) return mw_error_set(-EINVAL, "foreign model: no unit %d (0..%d)", u, f->d.n_units - 1);
    float *dst = n->params + f->first[u];
    if (!f->d.init_unit) {
        memset(dst, 0, f->unit_numel[u] * sizeof *dst);
        return 0;
    }
    mw_error_clear();
    int err = f->d.init_unit(f->d.init_user, u, dst, f->unit_numel[u]);
    if (!err) return 0;
    char name[MW_FOREIGN_NAME_MAX];
    unit_name_(f, u, name, sizeof name);
    const char *why = mw_error_msg();
    return mw_error_set(err < 0 ? err : -EINVAL, "the initial weights of unit %d (%s): %s", u, name,
                        why && *why ? why : "the caller's init_unit failed");
}

static void f_init_weights(struct mw_net *n, uint64_t seed)
{
    struct foreign *f = FOR(n);
    for (int u = 0; u < f->d.n_units; u++) {
        int err = f_init_weights_unit(n, seed, u);
        if (err && !f->init_err) f->init_err = err;
    }
}

int mw_net_foreign_init_status(const struct mw_net *n)
{
    return n->family == &mw_net_foreign && n->impl ? FOR(n)->init_err : 0;
}

static void f_warm(const struct mw_net *n) { (void)n; }

static int f_unit_range(const struct mw_net *n, int u, size_t *first, size_t *count)
{
    const struct foreign *f = FOR(n);
    if (u < 0 || u >= f->d.n_units) return mw_error_set(-EINVAL, "foreign model: no unit %d (0..%d)", u, f->d.n_units - 1);
    *first = (size_t)f->first[u];
    *count = (size_t)f->unit_numel[u];
    return 0;
}

static void f_unit_name(const struct mw_net *n, int u, char *buf, size_t len)
{
    const struct foreign *f = FOR(n);
    if (u >= 0 && u < f->d.n_units) unit_name_(f, u, buf, len);
    else snprintf(buf, len, "(no unit %d)", u);
}

/* A foreign model has no layer-major step: both schedules read the batch-major order (the
 * residency machine builds both; the factory is never asked for layer-major with it). */
static int f_unit_order(const struct mw_net *n, enum mw_net_pass pass, int layer_major, int *order, int max)
{
    (void)layer_major;
    const struct foreign *f = FOR(n);
    const int *o = pass == MW_NET_FORWARD ? f->d.fwd_order : f->d.bwd_order;
    int k = pass == MW_NET_FORWARD ? f->d.n_fwd : f->d.n_bwd;
    for (int p = 0; order && p < k && p < max; p++) order[p] = o[p];
    return k;
}

static int f_n_tensors(const struct mw_net *n)
{
    const struct foreign *f = FOR(n);
    return f->d.n_tensors ? f->d.n_tensors : f->d.n_units;
}

/* The optimizer decides weight decay by a tensor's dimensions (GPT-2 practice: 1-D tensors do not
 * decay; src/train/optimizer_step.c), so the caller's flag is told that way: a decayed tensor is
 * [numel, 1], an undecayed one [numel]. */
static void f_tensor(const struct mw_net *n, int i, struct mw_net_tensor *out)
{
    const struct foreign *f = FOR(n);
    memset(out, 0, sizeof *out);
    int no_decay = 0;
    if (f->d.n_tensors) {
        out->name = f->tensors[i].name;
        out->offset = (size_t)f->t_first[i];
        out->numel = (size_t)f->tensors[i].numel;
        no_decay = f->tensors[i].no_decay;
    } else {
        out->name = f->unit_names[i];
        out->offset = (size_t)f->first[i];
        out->numel = (size_t)f->unit_numel[i];
    }
    out->ndim = no_decay ? 1 : 2;
    out->shape[0] = out->numel;
    out->shape[1] = 1;
}

static void f_set_hook(struct mw_net *n, mw_net_weights_fn fn, void *user)
{
    FOR(n)->hook = fn;
    FOR(n)->user = user;
}

int mw_net_foreign_unit(struct mw_net *n, int event, int unit, int backward)
{
    if (n->family != &mw_net_foreign || !n->impl) return mw_error_set(-EINVAL, "not a foreign model");
    struct foreign *f = FOR(n);
    if (unit < 0 || unit >= f->d.n_units || (event != MW_NET_UNIT_ACQUIRE && event != MW_NET_UNIT_RELEASE))
        return mw_error_set(-EINVAL, "foreign model: event %d of unit %d (events: 0 acquire, 1 release; units 0..%d)",
                            event, unit, f->d.n_units - 1);
    return f->hook ? f->hook(f->user, event, unit, !!backward) : 0;
}

/* ---------------------------------------------------------------- what the caller does itself */

static int no_pass(const char *what)
{
    return mw_error_set(-ENOTSUP, "a foreign model's %s runs in its caller (which reports each unit through "
                        "mw_net_foreign_unit), not in memwall", what);
}
static int f_forward(struct mw_net *n, const int32_t *x, const int32_t *t, int B, int T)
{
    (void)n; (void)x; (void)t; (void)B; (void)T;
    return no_pass("forward pass");
}
static const float *f_logits(const struct mw_net *n) { (void)n; return NULL; }
static int f_backward(struct mw_net *n, float scale, mw_net_grad_ready_fn cb, void *user)
{
    (void)n; (void)scale; (void)cb; (void)user;
    return no_pass("backward pass");
}
static int f_accum_set(struct mw_net *n, int index, int count) { (void)n; (void)index; (void)count; return 0; }
static size_t f_zero_bytes(const struct mw_net *n, int count) { (void)n; (void)count; return 0; }
static int f_step_lm(struct mw_net *n, int nmb, const int32_t *x, const int32_t *t, int B, int T, float scale,
                     const struct mw_net_lm_calls *calls, float *losses)
{
    (void)n; (void)nmb; (void)x; (void)t; (void)B; (void)T; (void)scale; (void)calls; (void)losses;
    return mw_error_set(-ENOTSUP, "a foreign model has no layer-major step: use the batch-major schedule");
}
static size_t f_lm_bytes(const struct mw_net *n, int nmb, int acts) { (void)n; (void)nmb; (void)acts; return 0; }
static size_t f_no_bytes(const struct mw_net *n) { (void)n; return 0; }
static void f_acts_lend(struct mw_net *n, float *slot) { (void)n; (void)slot; }
static void f_zero_grad(struct mw_net *n) { memset(n->grads, 0, n->sizes.grads_bytes); }

static int no_files(const char *what)
{
    return mw_error_set(-ENOTSUP, "a foreign model's weights are its caller's: no %s here", what);
}
static int f_load(struct mw_net *n, const char *path) { (void)n; (void)path; return no_files("safetensors load"); }
static int f_loader_open(void **l, const struct mw_net *n, const char *path)
{
    (void)n; (void)path;
    *l = NULL;
    return no_files("safetensors load");
}
static int f_loader_unit(void *l, struct mw_net *n, int u) { (void)l; (void)n; (void)u; return no_files("safetensors load"); }
static void f_loader_close(void *l) { (void)l; }
static int f_save(const struct mw_net *n, const char *path, mw_net_weights_fn fn, void *user)
{
    (void)n; (void)path; (void)fn; (void)user;
    return no_files("safetensors save (read the units out instead)");
}

const struct mw_net_family mw_net_foreign = {
    .name = "foreign",
    .id = 0x46524e00u, /* "FRN": never in a checkpoint that can be loaded (decode refuses) */
    .config_check = cfg_check,
    .config_describe = cfg_describe,
    .config_summary = cfg_summary,
    .config_encode = cfg_encode,
    .config_decode = cfg_decode,
    .sizes = cfg_sizes,
    .config_from_shape = no_shape,
    .config_from_file = no_file,
    .config_shape = to_shape,
    .init = f_init,
    .free = f_free,
    .init_weights = f_init_weights,
    .init_weights_unit = f_init_weights_unit,
    .warm_runtime = f_warm,
    .unit_range = f_unit_range,
    .unit_name = f_unit_name,
    .unit_order = f_unit_order,
    .n_tensors = f_n_tensors,
    .tensor = f_tensor,
    .set_weights_hook = f_set_hook,
    .forward = f_forward,
    .logits = f_logits,
    .backward = f_backward,
    .accum_set = f_accum_set,
    .defer_bytes = f_zero_bytes,
    .step_layer_major = f_step_lm,
    .lm_bytes = f_lm_bytes,
    .act_slot_bytes = f_no_bytes,
    .acts_lend = f_acts_lend,
    .own_block_bytes = f_no_bytes,
    .zero_grad = f_zero_grad,
    .load_safetensors = f_load,
    .loader_open = f_loader_open,
    .loader_unit = f_loader_unit,
    .loader_close = f_loader_close,
    .save_safetensors_units = f_save,
};

int mw_net_foreign_init(struct mw_net *n, const struct mw_foreign_desc *d, int n_threads)
{
    memset(n, 0, sizeof *n);
    struct mw_net_config c;
    int err = mw_foreign_config(&c, d);
    if (err) return err;
    struct mw_net_options o = {1, 1, 0, n_threads};
    return mw_net_init(n, &c, &o);
}
