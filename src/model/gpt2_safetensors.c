/*
 * gpt2_safetensors.c — GPT-2 weights in and out of safetensors with Hugging Face's names.
 *
 * Why no transposes: memwall stores linear weights [in, out] exactly like HF's Conv1D, so each
 * HF tensor is one contiguous read into its place in the flat parameter array. HF files carry
 * buffers that are not parameters (h.N.attn.bias / masked_bias: the causal mask) and may carry
 * the tied "lm_head.weight"; those are skipped. Names may be prefixed "transformer." (files
 * saved from GPT2LMHeadModel).
 */
#include "gpt2_internal.h"
#include "safetensors.h"
#include "memwall/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *strip_prefix(const char *n)
{
    return strncmp(n, "transformer.", 12) ? n : n + 12;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int ignored(const char *n)
{
    return !strcmp(n, "lm_head.weight") || ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias");
}

static const struct mw_st_entry *find_any(const struct mw_st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(strip_prefix(f->e[i].name), name)) return &f->e[i];
    return NULL;
}

static int meta_int(const struct mw_st_file *f, const char *key, int *out)
{
    const char *v = mw_st_meta(f, key);
    if (!v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x <= 0 || x > (1L << 30))
        return mw_error_set(MW_EFORMAT, "%s: metadata %s=\"%s\" is not a positive integer", f->path, key, v);
    *out = (int)x;
    return 1;
}

int mw_gpt2_config_from_safetensors(const char *path, struct mw_gpt2_config *cfg)
{
    struct mw_st_file f;
    int rc = mw_st_open(&f, path);
    if (rc) return rc;
    memset(cfg, 0, sizeof *cfg);
    const struct mw_st_entry *wte = find_any(&f, "wte.weight"), *wpe = find_any(&f, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1]) {
        rc = mw_error_set(MW_EFORMAT, "%s: not a GPT-2 checkpoint (needs 2-D wte.weight and wpe.weight of "
                          "the same width)", path);
        goto out;
    }
    int maxl = -1;
    for (int i = 0; i < f.n; i++) {
        const char *n = strip_prefix(f.e[i].name);
        int l;
        if (sscanf(n, "h.%d.", &l) == 1 && l > maxl) maxl = l;
    }
    cfg->n_layer = maxl + 1;
    cfg->n_embd = (int)wte->shape[1];
    cfg->vocab_size = (int)wte->shape[0];
    cfg->max_seq_len = (int)wpe->shape[0];
    cfg->n_head = cfg->n_embd % 64 == 0 ? cfg->n_embd / 64 : 1;
    if ((rc = meta_int(&f, "n_head", &cfg->n_head)) < 0) goto out;
    if ((rc = meta_int(&f, "vocab_size", &cfg->vocab_size)) < 0) goto out;
    if ((rc = meta_int(&f, "padded_vocab_size", &cfg->padded_vocab_size)) < 0) goto out;
    if (cfg->vocab_size > (int)wte->shape[0]) {
        rc = mw_error_set(MW_EFORMAT, "%s: vocab_size %d > rows of wte %llu", path, cfg->vocab_size,
                          (unsigned long long)wte->shape[0]);
        goto out;
    }
    if ((uint64_t)cfg->padded_vocab_size < wte->shape[0] && wte->shape[0] > (uint64_t)cfg->vocab_size)
        cfg->padded_vocab_size = (int)wte->shape[0];
    rc = mw_gpt2_config_check(cfg);
    if (rc) rc = mw_error_set(MW_EFORMAT, "%s: %s", path, mw_error_msg());
out:
    mw_st_close(&f);
    return rc;
}

int mw_gpt2_load_safetensors(struct mw_gpt2 *m, const char *path)
{
    struct mw_st_file f;
    int rc = mw_st_open(&f, path);
    if (rc) return rc;
    int used = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m->tensors[i];
        const struct mw_st_entry *e = find_any(&f, t->name);
        if (!e) { rc = mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" is missing", path, t->name); goto out; }
        used++;
        uint64_t rows = t->shape[0], cols = t->shape[1];
        int ok;
        if (t->kind == MW_GPT2_WTE) {
            ok = e->ndim == 2 && e->shape[1] == cols && e->shape[0] >= (uint64_t)m->cfg.vocab_size &&
                 e->shape[0] <= rows;
            if (ok) rows = e->shape[0];
        } else if (t->ndim == 2) {
            ok = e->ndim == 2 && e->shape[0] == rows && e->shape[1] == cols;
        } else {
            ok = e->ndim == 1 && e->shape[0] == rows;
        }
        if (!ok) {
            char got[96] = "";
            for (int d = 0; d < e->ndim; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", d ? ", " : "",
                         (unsigned long long)e->shape[d]);
            if (t->ndim == 2)
                rc = mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has shape [%s], the model needs [%zu, %zu]",
                                  path, t->name, got, t->shape[0], t->shape[1]);
            else
                rc = mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has shape [%s], the model needs [%zu]",
                                  path, t->name, got, t->shape[0]);
            goto out;
        }
        float *dst = m->params + t->offset;
        if ((rc = mw_st_read_f32(&f, e, 0, rows * cols, dst))) goto out;
        if (rows * cols < t->numel) memset(dst + rows * cols, 0, (t->numel - rows * cols) * sizeof(float));
    }
    for (int i = 0; i < f.n; i++) {
        const char *n = strip_prefix(f.e[i].name);
        if (!ignored(n) && !mw_gpt2_find_tensor(m, n)) {
            rc = mw_error_set(MW_EFORMAT, "%s: unexpected tensor \"%s\" (a different model or config?)",
                              path, f.e[i].name);
            goto out;
        }
    }
    (void)used;
out:
    mw_st_close(&f);
    return rc;
}

/* With a unit function, each unit is acquired before its first tensor and released after its
 * last, so a caller that streams weights never holds more than one unit for the save. */
struct save_units { const struct mw_gpt2 *m; int cur; mw_gpt2_weights_fn fn; void *user; };

static int unit_of_offset(const struct mw_gpt2 *m, size_t off)
{
    for (int u = 0; u < mw_gpt2_n_units(m); u++) {
        size_t a, n;
        mw_gpt2_unit_range(m, u, &a, &n);
        if (off >= a && off < a + n) return u;
    }
    return -1;
}

static int save_units_fn(void *user, int i)
{
    struct save_units *su = user;
    const struct mw_gpt2 *m = su->m;
    int u = i < m->n_tensors ? unit_of_offset(m, m->tensors[i].offset) : -1;
    if (u == su->cur) return 0;
    int rc = 0;
    if (su->cur >= 0) rc = su->fn(su->user, MW_GPT2_UNIT_RELEASE, su->cur, 0);
    su->cur = u;
    if (!rc && u >= 0) rc = su->fn(su->user, MW_GPT2_UNIT_ACQUIRE, u, 0);
    return rc;
}

int mw_gpt2_save_safetensors(const struct mw_gpt2 *m, const char *path)
{
    return mw_gpt2_save_safetensors_units(m, path, NULL, NULL);
}

int mw_gpt2_save_safetensors_units(const struct mw_gpt2 *m, const char *path, mw_gpt2_weights_fn fn, void *user)
{
    struct mw_st_out *t = calloc((size_t)m->n_tensors, sizeof *t);
    if (!t) return mw_error_set(-ENOMEM, "save %s: no memory", path);
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_gpt2_tensor *s = &m->tensors[i];
        t[i].name = s->name;
        t[i].ndim = s->ndim;
        t[i].shape[0] = s->kind == MW_GPT2_WTE ? (uint64_t)m->cfg.vocab_size : s->shape[0];
        t[i].shape[1] = s->shape[1];
        t[i].data = m->params + s->offset;
    }
    char v[5][16];
    snprintf(v[0], 16, "%d", m->cfg.n_layer);
    snprintf(v[1], 16, "%d", m->cfg.n_head);
    snprintf(v[2], 16, "%d", m->cfg.n_embd);
    snprintf(v[3], 16, "%d", m->cfg.max_seq_len);
    snprintf(v[4], 16, "%d", m->cfg.vocab_size);
    char vp[16];
    snprintf(vp, sizeof vp, "%d", m->cfg.padded_vocab_size ? m->cfg.padded_vocab_size : m->cfg.vocab_size);
    const char *meta[] = {"format", "pt", "producer", "memwall", "n_layer", v[0], "n_head", v[1],
                          "n_embd", v[2], "max_seq_len", v[3], "vocab_size", v[4], "padded_vocab_size", vp};
    struct save_units su = {m, -1, fn, user};
    int rc = fn ? mw_st_write_f32_cb(path, t, m->n_tensors, meta, 8, save_units_fn, &su)
                : mw_st_write_f32(path, t, m->n_tensors, meta, 8);
    if (rc && su.cur >= 0) (void)fn(user, MW_GPT2_UNIT_RELEASE, su.cur, 0);
    free(t);
    return rc;
}
