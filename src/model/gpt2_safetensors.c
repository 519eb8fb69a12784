/*
 * gpt2_safetensors.c — GPT-2 weights in and out of safetensors with Hugging Face's names.
 *
 * Where the tensors come from: a tensor source (tensor_source.h), so `path` may be one file, a
 * directory, or a sharded checkpoint's index, and each tensor is read from the file that holds it.
 *
 * Why no transposes: memwall stores linear weights [in, out] exactly like HF's Conv1D, so each
 * HF tensor is one contiguous read into its place in the flat parameter array. HF files carry
 * buffers that are not parameters (h.N.attn.bias / masked_bias: the causal mask) and may carry
 * the tied "lm_head.weight"; those are skipped. Names may be prefixed "transformer." (files
 * saved from GPT2LMHeadModel).
 *
 * Why the config is resolved from several places, each value with its source: the tensor shapes
 * fix L, C, maxT and the rows of wte, but not the head count, which HF keeps in the config.json
 * that save_pretrained writes beside model.safetensors (memwall's own files say it in
 * __metadata__). Guessing C/64 loads a model with another head size silently wrong, so the
 * config.json is read when present, settings memwall does not implement are refused by name,
 * the user's shape flags fill only what no file says, and a value stated twice must agree.
 *
 * Why verify, then apply: a load that fails half-way must leave the model as it was. The load
 * checks the whole header and every shape, then reads every tensor once into a bounded scratch
 * buffer (catching short reads, non-finite and absurd values) before a second read writes the model.
 *
 * Why a bound on magnitude, not only isfinite: a finite 1e34 (fp32 and BF16 both hold it) passes
 * isfinite, then LayerNorm squares it (1e68: inf), and every step is skipped as inf/NaN while the
 * run ends with rc 0 and writes a model. Trained weights are of order 1 (initialised at 0.02,
 * LayerNorm gains near 1); MW_GPT2_MAX_ABS_WEIGHT = 1e9 is orders of magnitude beyond any
 * trained network's, and still far below where two such values multiplied and summed over the
 * width (1e18 x 2^20) reach fp32's 3.4e38: a bound that refuses garbage, never a real
 * checkpoint. The check runs on the converted fp32 value, so F16 and BF16 files are held to the
 * same rule (an F16 inf or NaN converts to an fp32 one).
 */
#include "gpt2_internal.h"
#include "safetensors.h"
#include "tensor_source.h"
#include "memwall/common.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
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

/* The one entry for a model tensor name; an error when two entries strip to it (e.g. both
 * "wte.weight" and "transformer.wte.weight"). */
static int find_one(const struct mw_ts *s, const char *name, const struct mw_ts_entry **out)
{
    *out = NULL;
    for (int i = 0; i < s->n; i++) {
        if (strcmp(strip_prefix(s->e[i].st->name), name)) continue;
        if (*out)
            return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" is given twice (\"%s\" and \"%s\")", s->path, name,
                                (*out)->st->name, s->e[i].st->name);
        *out = &s->e[i];
    }
    return 0;
}

/* "h.<digits>." -> layer index (at most 99999), else -1. Not sscanf: "%d" on a hostile number
 * is undefined behaviour. */
static int layer_of(const char *n)
{
    if (strncmp(n, "h.", 2)) return -1;
    int l = 0, k = 0;
    for (n += 2; *n >= '0' && *n <= '9'; n++, k++) {
        if (k == 5) return -1;
        l = l * 10 + (*n - '0');
    }
    return k && *n == '.' ? l : -1;
}

static int meta_int(const struct mw_ts *f, const char *key, int *out)
{
    const char *v = mw_ts_meta(f, key);
    if (!v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x <= 0 || x > (1L << 30))
        return mw_error_set(MW_EFORMAT, "%s: metadata %s=\"%s\" is not a positive integer", f->path, key, v);
    *out = (int)x;
    return 1;
}

const char *mw_gpt2_source_name(int src)
{
    switch (src) {
    case MW_GPT2_FROM_TENSORS: return "tensor shapes";
    case MW_GPT2_FROM_CONFIG_JSON: return "config.json";
    case MW_GPT2_FROM_METADATA: return "safetensors metadata";
    case MW_GPT2_FROM_FLAG: return "command line";
    case MW_GPT2_FROM_GUESS: return "guess (width / 64, GPT-2's head size)";
    default: return "unset";
    }
}

/* ---- config.json (Hugging Face GPT2Config) ---- */

struct hf_cfg {
    int n_layer, n_head, n_embd, n_positions, vocab_size; /* 0: absent */
};

/* A positive integer key (absent or null: 0). */
static int hf_int(const cJSON *root, const char *path, const char *key, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    int64_t x;
    if (!cJSON_IsNumber(v) || mw_f64_to_i64(v->valuedouble, 1, 1 << 30, 1, &x))
        return mw_error_set(MW_EFORMAT, "%s: \"%s\" must be a positive integer (at most 2^30)", path, key);
    *out = (int)x;
    return 0;
}

static int hf_bool(const cJSON *root, const char *key, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* Parses config.json text (len bytes). Refuses settings that change the math memwall does. */
int mw_gpt2_hf_config_parse(const char *text, size_t len, const char *path, int *n_layer, int *n_head,
                            int *n_embd, int *n_positions, int *vocab_size)
{
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mw_error_set(MW_EFORMAT, "%s: not a JSON object (a Hugging Face config.json)", path);
    }
    int rc = 0;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gpt2")))
        rc = mw_error_set(MW_EFORMAT, "%s: model_type %s%s%s is not \"gpt2\"; memwall trains GPT-2 only", path,
                          cJSON_IsString(mt) ? "\"" : "", cJSON_IsString(mt) ? mt->valuestring : "(not a string)",
                          cJSON_IsString(mt) ? "\"" : "");
    else if ((rc = hf_int(root, path, "n_layer", n_layer)) || (rc = hf_int(root, path, "n_head", n_head)) ||
             (rc = hf_int(root, path, "n_embd", n_embd)) ||
             (rc = hf_int(root, path, "n_positions", n_positions)) ||
             (rc = hf_int(root, path, "vocab_size", vocab_size)))
        ;
    else if (act && !(cJSON_IsString(act) && (!strcmp(act->valuestring, "gelu_new") ||
                                              !strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        rc = mw_error_set(MW_EFORMAT, "%s: activation_function \"%s\" is not implemented (memwall has GPT-2's tanh "
                          "GELU: gelu_new or gelu_pytorch_tanh)", path,
                          cJSON_IsString(act) ? act->valuestring : "(not a string)");
    else if (eps && !cJSON_IsNumber(eps))
        rc = mw_error_set(MW_EFORMAT, "%s: layer_norm_epsilon is not a number", path);
    else if (eps && !(fabs(eps->valuedouble - 1e-5) <= 1e-12))
        rc = mw_error_set(MW_EFORMAT, "%s: layer_norm_epsilon %g is not implemented (memwall's LayerNorm uses 1e-5)",
                          path, eps->valuedouble);
    else if (inner && !cJSON_IsNull(inner) &&
             !(cJSON_IsNumber(inner) && *n_embd && inner->valuedouble == 4.0 * *n_embd))
        rc = mw_error_set(MW_EFORMAT, "%s: n_inner %g is not implemented (memwall's MLP width is 4 x n_embd)", path,
                          cJSON_IsNumber(inner) ? inner->valuedouble : -1.0);
    else if (!hf_bool(root, "scale_attn_weights", 1))
        rc = mw_error_set(MW_EFORMAT, "%s: scale_attn_weights false is not implemented (memwall scales attention "
                          "by 1/sqrt(head size))", path);
    else if (hf_bool(root, "scale_attn_by_inverse_layer_idx", 0))
        rc = mw_error_set(MW_EFORMAT, "%s: scale_attn_by_inverse_layer_idx is not implemented", path);
    else if (hf_bool(root, "add_cross_attention", 0))
        rc = mw_error_set(MW_EFORMAT, "%s: add_cross_attention is not implemented (memwall is decoder-only)", path);
    else if (!hf_bool(root, "tie_word_embeddings", 1))
        rc = mw_error_set(MW_EFORMAT, "%s: tie_word_embeddings false is not implemented (memwall ties the LM head "
                          "to wte)", path);
    cJSON_Delete(root);
    return rc;
}

static int read_hf_config(const char *path, struct hf_cfg *h, int *found)
{
    memset(h, 0, sizeof *h);
    *found = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? 0 : mw_error_set(-errno, "cannot open %s: %s", path, strerror(errno));
    *found = 1;
    char *buf = malloc(1 << 20);
    if (!buf) { fclose(f); return mw_error_set(-ENOMEM, "no memory to read %s", path); }
    size_t n = fread(buf, 1, 1 << 20, f);
    int rc = 0;
    if (ferror(f)) rc = mw_error_set(-EIO, "cannot read %s", path);
    else if (n == 1 << 20) rc = mw_error_set(MW_EFORMAT, "%s: larger than 1 MiB, not a config.json", path);
    else rc = mw_gpt2_hf_config_parse(buf, n, path, &h->n_layer, &h->n_head, &h->n_embd, &h->n_positions,
                                      &h->vocab_size);
    free(buf);
    fclose(f);
    return rc;
}

/* Sets *v from a candidate value of source src; a value already set must agree. */
static int take(const char *path, const char *what, int cand, int src, int *v, int *vsrc)
{
    if (cand <= 0) return 0;
    if (*vsrc == MW_GPT2_FROM_NONE) { *v = cand; *vsrc = src; return 0; }
    if (*v != cand)
        return mw_error_set(MW_EFORMAT, "%s: %s is %d by the %s but %d by the %s", path, what, *v,
                            mw_gpt2_source_name(*vsrc), cand, mw_gpt2_source_name(src));
    return 0;
}

int mw_gpt2_config_resolve(const char *path, const struct mw_gpt2_config *flags, struct mw_gpt2_config *cfg,
                           struct mw_gpt2_provenance *prov)
{
    struct mw_gpt2_provenance pv;
    memset(&pv, 0, sizeof pv);
    memset(cfg, 0, sizeof *cfg);
    struct mw_ts f;
    int rc = mw_ts_open(&f, path);
    if (rc) return rc;
    path = f.path; /* the file, or the index, in messages */
    const struct mw_ts_entry *wte_e, *wpe_e;
    const struct mw_st_entry *wte = NULL, *wpe = NULL;
    if ((rc = find_one(&f, "wte.weight", &wte_e)) || (rc = find_one(&f, "wpe.weight", &wpe_e))) goto out;
    if (wte_e) wte = wte_e->st;
    if (wpe_e) wpe = wpe_e->st;
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1]) {
        rc = mw_error_set(MW_EFORMAT, "%s: not a GPT-2 checkpoint (needs 2-D wte.weight and wpe.weight of "
                          "the same width)", path);
        goto out;
    }
    if (wte->shape[0] == 0 || wte->shape[0] > (1u << 24) || wte->shape[1] == 0 || wte->shape[1] > (1u << 20) ||
        wpe->shape[0] == 0 || wpe->shape[0] > (1u << 20)) {
        rc = mw_error_set(MW_EFORMAT, "%s: wte [%llu, %llu] / wpe [%llu, %llu] are outside memwall's limits "
                          "(vocabulary 1..2^24, width and context 1..2^20)", path,
                          (unsigned long long)wte->shape[0], (unsigned long long)wte->shape[1],
                          (unsigned long long)wpe->shape[0], (unsigned long long)wpe->shape[1]);
        goto out;
    }
    int maxl = -1;
    for (int i = 0; i < f.n; i++) {
        const char *n = strip_prefix(f.e[i].st->name);
        int l = layer_of(n);
        if (l > maxl) maxl = l;
        if (l < 0 && !strncmp(n, "h.", 2)) {
            rc = mw_error_set(MW_EFORMAT, "%s: tensor \"%s\": no block index (h.0 .. h.99999)", path, f.e[i].st->name);
            goto out;
        }
    }
    /* The tensors fix L, C, maxT and the rows of wte. */
    pv.n_layer = pv.n_embd = pv.max_seq_len = MW_GPT2_FROM_TENSORS;
    cfg->n_layer = maxl + 1;
    cfg->n_embd = (int)wte->shape[1];
    cfg->max_seq_len = (int)wpe->shape[0];

    /* config.json beside the weights (Hugging Face save_pretrained). */
    if (snprintf(pv.config_json, sizeof pv.config_json, "%s/config.json", f.dir) >= (int)sizeof pv.config_json) {
        rc = mw_error_set(-ENAMETOOLONG, "%s: path too long to look for config.json beside it", path);
        goto out;
    }
    struct hf_cfg h;
    int found;
    if ((rc = read_hf_config(pv.config_json, &h, &found))) goto out;
    if (!found) pv.config_json[0] = 0;
    const char *cj = pv.config_json;
    if (found && ((rc = take(cj, "n_layer", h.n_layer, MW_GPT2_FROM_CONFIG_JSON, &cfg->n_layer, &pv.n_layer)) ||
                  (rc = take(cj, "n_embd", h.n_embd, MW_GPT2_FROM_CONFIG_JSON, &cfg->n_embd, &pv.n_embd)) ||
                  (rc = take(cj, "n_positions", h.n_positions, MW_GPT2_FROM_CONFIG_JSON, &cfg->max_seq_len,
                             &pv.max_seq_len)) ||
                  (rc = take(cj, "n_head", h.n_head, MW_GPT2_FROM_CONFIG_JSON, &cfg->n_head, &pv.n_head)) ||
                  (rc = take(cj, "vocab_size", h.vocab_size, MW_GPT2_FROM_CONFIG_JSON, &cfg->vocab_size,
                             &pv.vocab_size))))
        goto out;
    /* memwall's own __metadata__. */
    int mh = 0, mv = 0, mp = 0;
    if ((rc = meta_int(&f, "n_head", &mh)) < 0 || (rc = meta_int(&f, "vocab_size", &mv)) < 0 ||
        (rc = meta_int(&f, "padded_vocab_size", &mp)) < 0)
        goto out;
    if ((rc = take(path, "n_head", mh, MW_GPT2_FROM_METADATA, &cfg->n_head, &pv.n_head)) ||
        (rc = take(path, "vocab_size", mv, MW_GPT2_FROM_METADATA, &cfg->vocab_size, &pv.vocab_size)))
        goto out;
    /* The user's shape flags: fill what no file says, agree with what one does. */
    if (flags && ((rc = take(path, "the layer count (n_layer)", flags->n_layer, MW_GPT2_FROM_FLAG,
                             &cfg->n_layer, &pv.n_layer)) ||
                  (rc = take(path, "the width (n_embd)", flags->n_embd, MW_GPT2_FROM_FLAG, &cfg->n_embd,
                             &pv.n_embd)) ||
                  (rc = take(path, "the context (max_seq_len)", flags->max_seq_len, MW_GPT2_FROM_FLAG,
                             &cfg->max_seq_len, &pv.max_seq_len)) ||
                  (rc = take(path, "the head count (n_head)", flags->n_head, MW_GPT2_FROM_FLAG, &cfg->n_head,
                             &pv.n_head)) ||
                  (rc = take(path, "the vocabulary (vocab_size)", flags->vocab_size, MW_GPT2_FROM_FLAG,
                             &cfg->vocab_size, &pv.vocab_size))))
        goto out;
    if (pv.vocab_size == MW_GPT2_FROM_NONE) { cfg->vocab_size = (int)wte->shape[0]; pv.vocab_size = MW_GPT2_FROM_TENSORS; }
    if (pv.n_head == MW_GPT2_FROM_NONE) {
        cfg->n_head = cfg->n_embd % 64 == 0 ? cfg->n_embd / 64 : 1;
        pv.n_head = MW_GPT2_FROM_GUESS;
    }
    if (cfg->vocab_size > (int)wte->shape[0]) {
        rc = mw_error_set(MW_EFORMAT, "%s: vocab_size %d (%s) > rows of wte %llu", path, cfg->vocab_size,
                          mw_gpt2_source_name(pv.vocab_size), (unsigned long long)wte->shape[0]);
        goto out;
    }
    cfg->padded_vocab_size = mp;
    if ((uint64_t)cfg->padded_vocab_size < wte->shape[0] && wte->shape[0] > (uint64_t)cfg->vocab_size)
        cfg->padded_vocab_size = (int)wte->shape[0];
    rc = mw_gpt2_config_check(cfg);
    if (rc) rc = mw_error_set(MW_EFORMAT, "%s: %s", path, mw_error_msg());
out:
    mw_ts_close(&f);
    if (!rc && prov) *prov = pv;
    return rc;
}

int mw_gpt2_config_from_safetensors(const char *path, struct mw_gpt2_config *cfg)
{
    return mw_gpt2_config_resolve(path, NULL, cfg, NULL);
}

/* Pass 1 of a load: every model tensor present once, with its shape and a convertible dtype;
 * no tensor the model does not have. Fills ents[i] (the entry of model tensor i) and rows[i]. */
static int check_tensors(const struct mw_gpt2 *m, const struct mw_ts *f, const struct mw_ts_entry **ents,
                         uint64_t *rows_out)
{
    const char *path = f->path;
    int rc;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m->tensors[i];
        const struct mw_ts_entry *te;
        if ((rc = find_one(f, t->name, &te))) return rc;
        if (!te) return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" is missing", path, t->name);
        const struct mw_st_entry *e = te->st;
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
                return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has shape [%s], the model needs [%zu, %zu]",
                                    path, t->name, got, t->shape[0], t->shape[1]);
            return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has shape [%s], the model needs [%zu]",
                                path, t->name, got, t->shape[0]);
        }
        if (e->dtype < 0)
            return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" has a dtype memwall cannot convert to fp32 (F32, "
                                "F16 or BF16)", path, e->name);
        ents[i] = te;
        rows_out[i] = rows * cols;
    }
    for (int i = 0; i < f->n; i++) {
        const char *n = strip_prefix(f->e[i].st->name);
        if (!ignored(n) && !mw_gpt2_find_tensor(m, n))
            return mw_error_set(MW_EFORMAT, "%s: unexpected tensor \"%s\" (a different model or config?)",
                                path, f->e[i].st->name);
    }
    return 0;
}

/* The refusal of element idx of e, value v: the tensor as the file names it, the element (with
 * its row and column for a matrix), the value, why, and what to do. */
static int bad_value(const struct mw_ts_entry *te, uint64_t idx, float v)
{
    const struct mw_st_file *f = te->file; /* the shard that holds it */
    const struct mw_st_entry *e = te->st;
    char at[64] = "";
    if (e->ndim == 2 && e->shape[1])
        snprintf(at, sizeof at, " (row %llu, column %llu)", (unsigned long long)(idx / e->shape[1]),
                 (unsigned long long)(idx % e->shape[1]));
    if (!isfinite(v))
        return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" element %llu%s is %g: corrupt weights (a NaN or infinite "
                            "weight makes every step's loss NaN); re-download or re-export the checkpoint", f->path,
                            e->name, (unsigned long long)idx, at, (double)v);
    return mw_error_set(MW_EFORMAT, "%s: tensor \"%s\" element %llu%s is %g, beyond %g, which no trained network's "
                        "weight comes near (the forward pass squares and sums weights in fp32, which overflows at "
                        "3.4e38): corrupt or not a model's weights; re-download or re-export the checkpoint", f->path,
                        e->name, (unsigned long long)idx, at, (double)v, MW_GPT2_MAX_ABS_WEIGHT);
}

/* Pass 2: reads each tensor through a bounded buffer: every byte readable, every value finite
 * and at most MW_GPT2_MAX_ABS_WEIGHT in magnitude. */
static int check_data(const struct mw_gpt2 *m, const struct mw_ts *f, const struct mw_ts_entry **ents,
                      const uint64_t *numel)
{
    enum { CH = 1 << 18 };
    float *buf = malloc(CH * sizeof *buf);
    if (!buf) return mw_error_set(-ENOMEM, "%s: no memory for a scratch buffer", f->path);
    int rc = 0;
    for (int i = 0; i < m->n_tensors && !rc; i++)
        for (uint64_t a = 0; a < numel[i] && !rc; a += CH) {
            uint64_t k = MW_MIN((uint64_t)CH, numel[i] - a);
            if ((rc = mw_ts_read_f32(ents[i], a, k, buf))) break;
            for (uint64_t j = 0; j < k; j++)
                if (!(fabsf(buf[j]) <= (float)MW_GPT2_MAX_ABS_WEIGHT)) { /* NaN fails this too */
                    rc = bad_value(ents[i], a + j, buf[j]);
                    break;
                }
        }
    free(buf);
    return rc;
}

/* A verified file, loaded a weight unit at a time (streamed weights: never all in DRAM). */
struct mw_gpt2_st_loader {
    struct mw_ts f;
    const struct mw_ts_entry **ents; /* [n_tensors] */
    uint64_t *numel;                 /* [n_tensors] elements in the file (wte may have fewer rows) */
};

void mw_gpt2_st_loader_close(struct mw_gpt2_st_loader *l)
{
    if (!l) return;
    free(l->ents);
    free(l->numel);
    mw_ts_close(&l->f);
    free(l);
}

int mw_gpt2_st_loader_open(struct mw_gpt2_st_loader **out, const struct mw_gpt2 *m, const char *path)
{
    *out = NULL;
    struct mw_gpt2_st_loader *l = calloc(1, sizeof *l);
    if (!l) return mw_error_set(-ENOMEM, "%s: no memory", path);
    int rc = mw_ts_open(&l->f, path);
    if (rc) { free(l); return rc; }
    l->ents = calloc((size_t)m->n_tensors, sizeof *l->ents);
    l->numel = calloc((size_t)m->n_tensors, sizeof *l->numel);
    if (!l->ents || !l->numel) rc = mw_error_set(-ENOMEM, "%s: no memory", path);
    /* Verify everything before anything is applied. */
    if (!rc && !(rc = check_tensors(m, &l->f, l->ents, l->numel))) rc = check_data(m, &l->f, l->ents, l->numel);
    if (rc) { mw_gpt2_st_loader_close(l); return rc; }
    *out = l;
    return 0;
}

int mw_gpt2_st_loader_unit(struct mw_gpt2_st_loader *l, struct mw_gpt2 *m, int unit)
{
    size_t a, n;
    int rc = mw_gpt2_unit_range(m, unit, &a, &n);
    if (rc) return rc;
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m->tensors[i];
        if (t->offset < a || t->offset >= a + n) continue;
        float *dst = m->params + t->offset;
        if ((rc = mw_ts_read_f32(l->ents[i], 0, l->numel[i], dst)))
            return mw_error_set(rc, "%s (while applying the verified file: the model's weights are now partly "
                                "loaded)", mw_error_msg());
        if (l->numel[i] < t->numel) memset(dst + l->numel[i], 0, (t->numel - l->numel[i]) * sizeof(float));
    }
    return 0;
}

int mw_gpt2_load_safetensors(struct mw_gpt2 *m, const char *path)
{
    struct mw_gpt2_st_loader *l;
    int rc = mw_gpt2_st_loader_open(&l, m, path); /* verify (the model untouched on any failure)... */
    /* ...then apply. Only an I/O error or a file changed under us can fail from here. */
    for (int u = 0; !rc && u < mw_gpt2_n_units(m); u++) rc = mw_gpt2_st_loader_unit(l, m, u);
    mw_gpt2_st_loader_close(l);
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
