/*
 * registry.c — the parameter registry and its cut into subgroups.
 *
 * Why a flat space cut at fixed element counts: the model keeps its parameters and gradients
 * in one flat array each, in tensor-registration order, so a subgroup is just an element
 * range of those arrays and the pipeline never needs per-tensor bookkeeping. Fixed-size
 * subgroups give equal pipeline stages (equal I/O and update times), which is what makes the
 * overlap work. DeepSpeed instead packs whole tensors into each sub-group and lets a large
 * tensor form an over-sized group; we split tensors instead (see docs/offload.md).
 */
#include "memwall/offload.h"
#include "memwall/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void mw_offload_registry_init(struct mw_offload_registry *r)
{
    memset(r, 0, sizeof *r);
}

void mw_offload_registry_free(struct mw_offload_registry *r)
{
    free(r->tensors);
    memset(r, 0, sizeof *r);
}

int mw_offload_registry_add(struct mw_offload_registry *r, const char *name, int ndim, const int64_t *shape)
{
    return mw_offload_registry_add_ex(r, name, ndim, shape, 0);
}

int mw_offload_registry_add_ex(struct mw_offload_registry *r, const char *name, int ndim, const int64_t *shape,
                               unsigned flags)
{
    if (flags & ~MW_OFFLOAD_NO_DECAY) return mw_error_set(-EINVAL, "offload registry: unknown tensor flags 0x%x", flags);
    if (!name || !*name || strlen(name) >= MW_OFFLOAD_NAME_MAX)
        return mw_error_set(-EINVAL, "offload registry: tensor name missing or longer than %d characters",
                            MW_OFFLOAD_NAME_MAX - 1);
    if (ndim < 1 || ndim > MW_OFFLOAD_MAX_DIMS || !shape)
        return mw_error_set(-EINVAL, "offload registry: tensor '%s' has %d dimensions (1..%d allowed)",
                            name, ndim, MW_OFFLOAD_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || (uint64_t)shape[i] > (UINT64_C(1) << 40) / numel)
            return mw_error_set(-EINVAL, "offload registry: tensor '%s' dimension %d is %lld",
                                name, i, (long long)shape[i]);
        numel *= (uint64_t)shape[i];
    }
    for (uint32_t i = 0; i < r->n; i++)
        if (!strcmp(r->tensors[i].name, name))
            return mw_error_set(-EINVAL, "offload registry: tensor '%s' registered twice", name);
    if (r->n == r->cap) {
        uint32_t cap = r->cap ? r->cap * 2 : 16;
        struct mw_offload_tensor *t = realloc(r->tensors, cap * sizeof *t);
        if (!t) return mw_error_set(-ENOMEM, "offload registry: out of memory");
        r->tensors = t;
        r->cap = cap;
    }
    struct mw_offload_tensor *t = &r->tensors[r->n++];
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = numel;
    t->flags = flags;
    t->first = r->total;
    r->total += numel;
    return 0;
}

int mw_offload_registry_find(const struct mw_offload_registry *r, uint64_t elem)
{
    if (elem >= r->total) return -1;
    uint32_t lo = 0, hi = r->n - 1;
    while (lo < hi) { /* last tensor with first <= elem */
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (r->tensors[mid].first <= elem) lo = mid;
        else hi = mid - 1;
    }
    return (int)lo;
}

int mw_offload_cut(const struct mw_offload_registry *r, uint64_t size,
                   struct mw_offload_subgroup **out, uint32_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    if (r->total == 0) return mw_error_set(-EINVAL, "offload: the parameter registry is empty");
    if (size == 0) return mw_error_set(-EINVAL, "offload: subgroup size must be at least 1 element");
    uint64_t n = (r->total + size - 1) / size;
    if (n > UINT32_MAX / 2)
        return mw_error_set(-EINVAL, "offload: %llu subgroups is too many (raise the subgroup size, subgroup_size)",
                            (unsigned long long)n);
    struct mw_offload_subgroup *sg = calloc(n, sizeof *sg);
    if (!sg) return mw_error_set(-ENOMEM, "offload: out of memory for %llu subgroups", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        sg[i].id = (uint32_t)i;
        sg[i].first = i * size;
        sg[i].n = MW_MIN(size, r->total - sg[i].first);
        sg[i].tensor_lo = (uint32_t)mw_offload_registry_find(r, sg[i].first);
        sg[i].tensor_hi = (uint32_t)mw_offload_registry_find(r, sg[i].first + sg[i].n - 1);
    }
    *out = sg;
    *n_out = (uint32_t)n;
    return 0;
}
