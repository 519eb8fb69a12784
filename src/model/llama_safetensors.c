/*
 * llama_safetensors.c — the Llama family's weights in safetensors files with HF names
 * (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight,
 * lm_head.weight when untied), read through a tensor source (tensor_source.h: one file, or a
 * sharded checkpoint's index and its shards; F32, F16 and BF16 read as fp32) and written by
 * safetensors.c as one F32 file.
 *
 * Verify, then apply: opening checks that every tensor the model has is in the file with its
 * shape, and that the file has nothing else (a tied model's lm_head.weight, which some writers
 * keep, is accepted and ignored); a unit's values are read and checked finite into scratch
 * before the unit's weights are written, and a whole load reads everything before writing any,
 * so a failed load leaves the weights bitwise unchanged.
 */
#include "llama_internal.h"
#include "memwall/common.h"
#include "safetensors.h"
#include "tensor_source.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct llama_loader { struct mw_ts s; };

static int check_file(const struct mw_ts *s, const struct llama *m)
{
    const char *path = s->path;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_net_tensor *t = &m->tensors[i];
        const struct mw_ts_entry *te = mw_ts_find(s, t->name);
        if (!te) return mw_error_set(MW_EFORMAT, "%s: tensor %s is missing", path, t->name);
        const struct mw_st_entry *e = te->st;
        int ok = e->dtype >= 0 && e->ndim == t->ndim && e->shape[0] == t->shape[0] && (t->ndim == 1 || e->shape[1] == t->shape[1]);
        if (!ok)
            return mw_error_set(MW_EFORMAT, "%s: tensor %s is not fp32/fp16/bf16 [%zu%s%zu] as the model's", path,
                                t->name, t->shape[0], t->ndim == 2 ? ", " : "", t->ndim == 2 ? t->shape[1] : (size_t)0);
    }
    for (int i = 0; i < s->n; i++) {
        const char *nm = s->e[i].st->name;
        int known = m->c.tied && !strcmp(nm, "lm_head.weight");
        for (int k = 0; !known && k < m->n_tensors; k++) known = !strcmp(nm, m->tensors[k].name);
        if (!known) return mw_error_set(MW_EFORMAT, "%s: tensor %s is not part of this model (%s)", path, nm,
                                        "a different config.json, or a layer memwall does not implement");
    }
    return 0;
}

int llama_loader_open(void **loader, const struct mw_net *n, const char *path)
{
    struct llama_loader *l = calloc(1, sizeof *l);
    if (!l) return mw_error_set(-ENOMEM, "no memory");
    int err = mw_ts_open(&l->s, path);
    if (err) { free(l); return err; }
    if ((err = check_file(&l->s, CLL(n)))) {
        mw_ts_close(&l->s);
        free(l);
        return err;
    }
    *loader = l;
    return 0;
}

void llama_loader_close(void *loader)
{
    struct llama_loader *l = loader;
    if (!l) return;
    mw_ts_close(&l->s);
    free(l);
}

/* The tensors inside [first, first + count) into dst (dst[0] = element `first`). */
static int read_range(const struct mw_ts *s, const struct llama *m, size_t first, size_t count, float *dst)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_net_tensor *t = &m->tensors[i];
        if (t->offset < first || t->offset + t->numel > first + count) continue;
        const struct mw_ts_entry *e = mw_ts_find(s, t->name); /* present: check_file */
        int err = mw_ts_read_f32(e, 0, t->numel, dst + (t->offset - first));
        if (err) return err;
        for (size_t j = 0; j < t->numel; j++)
            if (!isfinite(dst[t->offset - first + j]))
                return mw_error_set(MW_EFORMAT, "%s: %s[%zu] is not finite", e->file->path, t->name, j);
    }
    return 0;
}

int llama_loader_unit(void *loader, struct mw_net *n, int unit)
{
    struct llama_loader *l = loader;
    size_t first, count;
    int err = llama_unit_range(n, unit, &first, &count);
    if (err) return err;
    float *tmp = malloc(count * sizeof(float));
    if (!tmp) return mw_error_set(-ENOMEM, "no memory for unit %d (%zu floats)", unit, count);
    if (!(err = read_range(&l->s, CLL(n), first, count, tmp))) memcpy(n->params + first, tmp, count * sizeof(float));
    free(tmp);
    return err;
}

int llama_load_safetensors(struct mw_net *n, const char *path)
{
    void *l;
    int err = llama_loader_open(&l, n, path);
    if (err) return err;
    size_t np = CLL(n)->n_params;
    float *tmp = malloc(np * sizeof(float));
    if (!tmp) err = mw_error_set(-ENOMEM, "no memory for %zu floats", np);
    else if (!(err = read_range(&((struct llama_loader *)l)->s, CLL(n), 0, np, tmp))) memcpy(n->params, tmp, np * sizeof(float));
    free(tmp);
    llama_loader_close(l);
    return err;
}

/* With a unit function, each unit is acquired before its first tensor and released after its
 * last (the tensors are in unit order). */
struct save_units { const struct mw_net *n; int cur; mw_net_weights_fn fn; void *user; };

static int unit_of(const struct mw_net *n, size_t off)
{
    for (int u = 0; u < n->n_units; u++) {
        size_t a, k;
        llama_unit_range(n, u, &a, &k);
        if (off >= a && off < a + k) return u;
    }
    return -1;
}

static int save_units_fn(void *user, int i)
{
    struct save_units *su = user;
    const struct llama *m = CLL(su->n);
    int u = i < m->n_tensors ? unit_of(su->n, m->tensors[i].offset) : -1, rc = 0;
    if (u == su->cur) return 0;
    if (su->cur >= 0) rc = su->fn(su->user, MW_NET_UNIT_RELEASE, su->cur, 0);
    su->cur = u;
    if (!rc && u >= 0) rc = su->fn(su->user, MW_NET_UNIT_ACQUIRE, u, 0);
    return rc;
}

int llama_save_safetensors_units(const struct mw_net *n, const char *path, mw_net_weights_fn fn, void *user)
{
    const struct llama *m = CLL(n);
    struct mw_st_out *t = calloc((size_t)m->n_tensors, sizeof *t);
    if (!t) return mw_error_set(-ENOMEM, "save %s: no memory", path);
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_net_tensor *s = &m->tensors[i];
        t[i] = (struct mw_st_out){s->name, s->ndim, {s->shape[0], s->shape[1]}, n->params + s->offset};
    }
    const char *meta[] = {"format", "pt", "producer", "memwall"};
    struct save_units su = {n, -1, fn, user};
    int rc = fn ? mw_st_write_f32_cb(path, t, m->n_tensors, meta, 2, save_units_fn, &su)
                : mw_st_write_f32(path, t, m->n_tensors, meta, 2);
    if (rc && su.cur >= 0) (void)fn(user, MW_NET_UNIT_RELEASE, su.cur, 0);
    free(t);
    return rc;
}
