/*
 * pyapi.c — scalar wrappers over the offload engine for ctypes (see memwall/pyapi.h for why).
 * Nothing here knows engine internals: it fills the public config and hparams structs from
 * their defaults and forwards to memwall/offload.h.
 */
#include "memwall/pyapi.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "memwall/common.h"
#include "memwall/optim.h"

int mw_pyapi_version(void) { return MW_PYAPI_VERSION; }

static int moments_parse(const char *s, enum mw_offload_mfmt *out)
{
    static const struct { const char *name; enum mw_offload_mfmt f; } tab[] = {
        {"fp32", MW_OFFLOAD_M_FP32}, {"bf16", MW_OFFLOAD_M_BF16},
        {"bf16-sr", MW_OFFLOAD_M_BF16_SR}, {"8bit", MW_OFFLOAD_M_8BIT},
    };
    for (size_t i = 0; s && i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].name)) { *out = tab[i].f; return 0; }
    return mw_error_set(-EINVAL, "moment format '%s' is not one of fp32, bf16, bf16-sr, 8bit", s ? s : "(null)");
}

static int weights_parse(const char *s, enum mw_offload_wfmt *out)
{
    static const struct { const char *name; enum mw_offload_wfmt f; } tab[] = {
        {"fp32", MW_OFFLOAD_W_FP32}, {"bf16", MW_OFFLOAD_W_BF16}, {"fp16", MW_OFFLOAD_W_FP16},
    };
    for (size_t i = 0; s && i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].name)) { *out = tab[i].f; return 0; }
    return mw_error_set(-EINVAL, "weight format '%s' is not one of fp32, bf16, fp16", s ? s : "(null)");
}

/* Staging no larger than the model needs: the default subgroup size is balanced (as few subgroups
 * as it allows, of equal size, so no buffer is sized for a subgroup larger than any there is),
 * and there are no more staging buffers than subgroups (a buffer beyond that is never used).
 * A 4.19M-parameter model had 8 x 48 MiB of buffers for its two subgroups; now one of 48 MiB. */
static void staging_fit(struct mw_offload_config *c, uint64_t total, int size_given)
{
    uint64_t g = c->moments == MW_OFFLOAD_M_8BIT ? MW_Q8_BLOCK : 1;
    uint64_t whole = MW_ALIGN_UP(total, g);
    if (!size_given && c->subgroup_size < whole) {
        uint64_t k = (total + c->subgroup_size - 1) / c->subgroup_size;
        c->subgroup_size = MW_ALIGN_UP((total + k - 1) / k, g);
    }
    uint64_t sg = MW_ALIGN_UP(MW_MIN(c->subgroup_size, whole), g), nsg = (total + sg - 1) / sg;
    if ((uint64_t)c->buffer_count > nsg) c->buffer_count = (int)nsg;
}

int mw_pyapi_create(struct mw_offload **out, uint32_t n, const uint64_t *numel, const unsigned *flags,
                    const char *placement, const char *moments, const char *weight_format, const char *nvme_dir,
                    uint64_t subgroup_size, int buffer_count, int cpu_threads,
                    uint64_t dram_budget, uint64_t nvme_budget,
                    void *weights, const float *grads, struct mw_trace *trace)
{
    if (!out || !numel || n == 0 || !weights || !grads)
        return mw_error_set(-EINVAL, "pyapi create: no tensors, or no weight/gradient array");
    if (buffer_count < 0 || cpu_threads < 0)
        return mw_error_set(-EINVAL, "pyapi create: buffer_count %d and cpu_threads %d must be >= 0",
                            buffer_count, cpu_threads);
    *out = NULL;
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    mw_offload_placement_default(&c.place);
    int rc = mw_offload_placement_parse(placement ? placement : "all=dram", &c.place);
    if (rc) return rc;
    if ((rc = moments_parse(moments, &c.moments))) return rc;
    if ((rc = weights_parse(weight_format, &c.weights))) return rc;
    if (subgroup_size) c.subgroup_size = subgroup_size;
    if (buffer_count) c.buffer_count = buffer_count;
    c.cpu_threads = cpu_threads;
    c.ext_weights = weights;
    c.ext_grads = grads;
    c.ext_grads_accumulate = 1;
    c.nvme_dir = nvme_dir;
    c.budget[MW_TIER_DRAM] = dram_budget;
    c.budget[MW_TIER_NVME] = nvme_budget;
    c.trace = trace;

    struct mw_offload_registry reg;
    mw_offload_registry_init(&reg);
    for (uint32_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%u", i);
        if (numel[i] == 0 || numel[i] > (uint64_t)INT64_MAX) {
            mw_offload_registry_free(&reg);
            return mw_error_set(-EINVAL, "pyapi create: tensor %u has %llu elements", i,
                                (unsigned long long)numel[i]);
        }
        int64_t shape[1] = {(int64_t)numel[i]};
        rc = mw_offload_registry_add_ex(&reg, name, 1, shape, flags ? flags[i] : 0);
        if (rc) { mw_offload_registry_free(&reg); return rc; }
    }
    staging_fit(&c, reg.total, subgroup_size != 0);
    rc = mw_offload_init(out, &reg, &c);
    mw_offload_registry_free(&reg);
    return rc;
}

static struct mw_offload_hparams hparams(double lr, double beta1, double beta2, double eps,
                                         double weight_decay, float grad_scale)
{
    struct mw_offload_hparams h;
    mw_offload_hparams_default(&h);
    h.lr = lr;
    h.beta1 = beta1;
    h.beta2 = beta2;
    h.eps = eps;
    h.weight_decay = weight_decay;
    h.grad_scale = grad_scale;
    return h;
}

int mw_pyapi_backward_begin(struct mw_offload *e, int arm, double lr, double beta1, double beta2,
                            double eps, double weight_decay, float grad_scale)
{
    struct mw_offload_hparams h = hparams(lr, beta1, beta2, eps, weight_decay, grad_scale);
    return mw_offload_backward_begin(e, 1, arm ? &h : NULL);
}

int mw_pyapi_step(struct mw_offload *e, int armed, double lr, double beta1, double beta2,
                  double eps, double weight_decay, float grad_scale)
{
    struct mw_offload_hparams h = hparams(lr, beta1, beta2, eps, weight_decay, grad_scale);
    return mw_offload_step(e, armed ? NULL : &h);
}

int mw_pyapi_stats(const struct mw_offload *e, double *out, int n)
{
    if (!e || !out || n < 0) return mw_error_set(-EINVAL, "pyapi stats: bad arguments");
    struct mw_offload_stats s;
    mw_offload_stats_get(e, &s);
    const struct mw_offload_plan *p = mw_offload_get_plan(e);
    const double v[MW_PYAPI_NSTATS] = {
        (double)s.steps, (double)s.nvme_read_bytes, (double)s.nvme_write_bytes, s.step_s, s.kernel_s,
        s.io_wait_s, (double)s.cpu_updates, (double)p->n_subgroups, (double)p->subgroup_size,
        (double)p->tier_bytes[MW_TIER_DRAM], (double)p->tier_bytes[MW_TIER_NVME], (double)p->staging_bytes,
    };
    int k = n < MW_PYAPI_NSTATS ? n : MW_PYAPI_NSTATS;
    memcpy(out, v, (size_t)k * sizeof v[0]);
    return k;
}
