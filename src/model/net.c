/*
 * net.c — the model seam's registry and the calls through a family's table (memwall/model.h).
 * Adding a family: its table in its own file, and one line in `families` below.
 */
#include "memwall/model.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/plan.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct mw_net_family mw_net_gpt2;  /* gpt2_net.c */
extern const struct mw_net_family mw_net_llama; /* llama_net.c */

static const struct mw_net_family *const families[] = {
    &mw_net_gpt2,
    &mw_net_llama,
};
#define N_FAMILIES (int)(sizeof families / sizeof families[0])

const struct mw_net_family *mw_net_family_find(const char *name)
{
    for (int i = 0; name && i < N_FAMILIES; i++)
        if (!strcmp(families[i]->name, name)) return families[i];
    return NULL;
}

const struct mw_net_family *mw_net_family_by_id(uint32_t id)
{
    for (int i = 0; i < N_FAMILIES; i++)
        if (families[i]->id == id) return families[i];
    return NULL;
}

const struct mw_net_family *mw_net_family_default(void) { return families[0]; }

const struct mw_net_family *mw_net_family_at(int i) { return i >= 0 && i < N_FAMILIES ? families[i] : NULL; }

int mw_net_config_from_model(const struct mw_model *d, int context, struct mw_net_config *out)
{
    memset(out, 0, sizeof *out);
    char names[128] = "";
    for (int i = 0; i < N_FAMILIES; i++) {
        const struct mw_net_family *f = families[i];
        size_t k = strlen(names);
        snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "", f->name);
        if (!f->config_from_model) continue;
        int err = f->config_from_model(d, context, out->raw);
        if (err == -ENOTSUP) continue;
        if (!err) out->family = f;
        return err;
    }
    return mw_error_set(-ENOTSUP, "%s is not a model memwall trains (its families: %s)", d->name, names);
}

int mw_net_family_for_hf(const char *dir, const struct mw_net_family **out)
{
    *out = NULL;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return mw_error_set(-ENAMETOOLONG, "%s: path too long", dir);
    char *text = NULL;
    size_t len = 0;
    int err = mw_read_small_file(path, "the model's config.json", 1u << 20, &text, &len);
    if (err) return mw_error_set(err, "%s is not a Hugging Face model directory: %s", dir, mw_error_msg());
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    if (!j || !cJSON_IsString(mt)) {
        cJSON_Delete(j);
        return mw_error_set(MW_EFORMAT, "%s: not a JSON object with a \"model_type\" string", path);
    }
    char known[256] = "";
    for (int i = 0; i < N_FAMILIES; i++)
        for (const char *const *t = families[i]->hf_model_types; t && *t; t++) {
            if (!strcmp(*t, mt->valuestring)) {
                *out = families[i];
                cJSON_Delete(j);
                return 0;
            }
            size_t l = strlen(known);
            snprintf(known + l, sizeof known - l, "%s%s", l ? ", " : "", *t);
        }
    err = mw_error_set(-ENOTSUP, "%s: model_type \"%.64s\" is not one memwall trains (%s)", path, mt->valuestring, known);
    cJSON_Delete(j);
    return err;
}

int mw_net_config_check(const struct mw_net_config *c)
{
    if (!c->family) return mw_error_set(-EINVAL, "model config without a family");
    return c->family->config_check(c->raw);
}

int mw_net_sizes(const struct mw_net_config *c, const struct mw_net_options *o, struct mw_net_sizes *out)
{
    int err = mw_net_config_check(c);
    return err ? err : c->family->sizes(c->raw, o, out);
}

int mw_net_init(struct mw_net *n, const struct mw_net_config *c, const struct mw_net_options *o)
{
    memset(n, 0, sizeof *n);
    int err = mw_net_config_check(c);
    if (err) return err;
    n->family = c->family;
    n->cfg = *c;
    if ((err = c->family->init(n, o))) memset(n, 0, sizeof *n);
    return err;
}

void mw_net_free(struct mw_net *n)
{
    if (n->family) n->family->free(n);
    memset(n, 0, sizeof *n);
}

int mw_net_unit_range(const struct mw_net *n, int unit, size_t *first, size_t *count)
{
    return n->family->unit_range(n, unit, first, count);
}

int mw_net_unit_order(const struct mw_net *n, enum mw_net_pass pass, int layer_major, int *order, int max)
{
    return n->family->unit_order(n, pass, layer_major, order, max);
}

void mw_net_unit_name(const struct mw_net *n, int unit, char *buf, size_t len)
{
    n->family->unit_name(n, unit, buf, len);
}

int mw_net_config_same(const struct mw_net_config *a, const struct mw_net_config *b)
{
    if (!a->family || a->family != b->family) return 0;
    uint8_t wa[MW_NET_CONFIG_WIRE], wb[MW_NET_CONFIG_WIRE];
    a->family->config_encode(a->raw, wa);
    b->family->config_encode(b->raw, wb);
    return !memcmp(wa, wb, sizeof wa);
}

int mw_net_sched_init(struct mw_net_sched *sc, const struct mw_net *n)
{
    memset(sc, 0, sizeof *sc);
    for (int lm = 0; lm < 2; lm++) {
        int nf = mw_net_unit_order(n, MW_NET_FORWARD, lm, NULL, 0), nb = mw_net_unit_order(n, MW_NET_BACKWARD, lm, NULL, 0);
        if (nf < 0 || nb < 0 || !(sc->seq[lm] = malloc(((size_t)nf + (size_t)nb + 1) * sizeof(int)))) {
            mw_net_sched_free(sc);
            return mw_error_set(-ENOMEM, "no memory for the unit order");
        }
        mw_net_unit_order(n, MW_NET_FORWARD, lm, sc->seq[lm], nf);
        mw_net_unit_order(n, MW_NET_BACKWARD, lm, sc->seq[lm] + nf, nb);
        sc->nf[lm] = nf;
        sc->nb[lm] = nb;
    }
    return 0;
}

void mw_net_sched_free(struct mw_net_sched *sc)
{
    free(sc->seq[0]);
    free(sc->seq[1]);
    memset(sc, 0, sizeof *sc);
}

int mw_net_kv_init(const struct mw_net *n, int max_tokens, void **kv)
{
    *kv = NULL;
    if (!n->family->kv_init || !n->family->decode)
        return mw_error_set(-ENOTSUP, "the %s family has no incremental decoding (no KV cache)", n->family->name);
    if (max_tokens < 1 || max_tokens > n->context)
        return mw_error_set(-EINVAL, "a KV cache for %d positions: the model's context is %d", max_tokens, n->context);
    return n->family->kv_init(n, max_tokens, kv);
}

int mw_net_decode(struct mw_net *n, void *kv, const int32_t *tokens, int n_tokens, int pos, float *logits_last)
{
    if (!n->family->decode || !kv) return mw_error_set(-EINVAL, "decode without a KV cache (mw_net_kv_init)");
    if (n_tokens < 1 || pos < 0) return mw_error_set(-EINVAL, "decode of %d tokens at position %d", n_tokens, pos);
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= n->vocab)
            return mw_error_set(-EINVAL, "decode: token %d (%d of %d) is outside the vocabulary 0..%d", (int)tokens[i], i,
                                n_tokens, n->vocab - 1);
    return n->family->decode(n, kv, tokens, n_tokens, pos, logits_last);
}

void mw_net_kv_free(const struct mw_net *n, void *kv)
{
    if (kv && n->family->kv_free) n->family->kv_free(kv);
}
