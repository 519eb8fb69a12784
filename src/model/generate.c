/*
 * generate.c — the sampling loop (memwall/generate.h): prefill the prompt into the family's KV
 * cache, then sample a token from the last logits and decode it at the next position, until the
 * length, the eos token, the caller or the model's context says stop.
 *
 * The sampler works on (value, id) pairs: greedy is a scan for the first maximum; with a top-k
 * or top-p limit the pairs are sorted by value, ties by lower id (so top_k = 1 is the greedy
 * token), and cut; the draw walks the kept probabilities (summed in double) with a uniform from
 * a splitmix64 stream. Without a limit no sort is needed: the draw walks all V in id order.
 */
#include "memwall/generate.h"
#include "memwall/model.h"
#include "memwall/common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cand {
    float v;
    int32_t id;
};

void mw_gen_params_default(struct mw_gen_params *p)
{
    *p = (struct mw_gen_params){.max_new_tokens = 64, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 0, .eos = -1};
}

int mw_gen_params_check(const struct mw_gen_params *p)
{
    if (p->max_new_tokens < 0) return mw_error_set(-EINVAL, "generate: max_new_tokens %d is negative", p->max_new_tokens);
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return mw_error_set(-EINVAL, "generate: temperature %g is not a finite number >= 0", (double)p->temperature);
    if (p->top_k < 0) return mw_error_set(-EINVAL, "generate: top_k %d is negative", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return mw_error_set(-EINVAL, "generate: top_p %g is outside (0, 1]", (double)p->top_p);
    return 0;
}

const char *mw_gen_stop_name(enum mw_gen_stop s)
{
    switch (s) {
    case MW_GEN_STOP_LENGTH: return "length";
    case MW_GEN_STOP_EOS: return "eos";
    case MW_GEN_STOP_CONTEXT: return "context";
    case MW_GEN_STOP_CALLER: return "caller";
    }
    return "?";
}

size_t mw_gen_scratch_bytes(int V) { return (size_t)(V > 0 ? V : 1) * sizeof(struct cand); }

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int32_t mw_gen_pick(const float *logits, int V, const struct mw_gen_params *p, uint64_t *rng, void *scratch)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (p->temperature <= 0.0f || p->top_k == 1) return best;
    struct cand *c = scratch;
    float inv_t = 1.0f / p->temperature, mx = logits[best] * inv_t;
    for (int i = 0; i < V; i++) c[i] = (struct cand){logits[i] * inv_t, i};
    int n = V;
    int limited = (p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f;
    if (limited) {
        qsort(c, (size_t)V, sizeof *c, cand_cmp);
        if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        float e = expf(c[i].v - mx);
        c[i].v = e;
        total += e;
    }
    if (p->top_p < 1.0f) { /* the smallest prefix whose share reaches top_p, at least one */
        double cum = 0.0, want = (double)p->top_p * total;
        int keep = 0;
        while (keep < n) {
            cum += c[keep].v;
            keep++;
            if (cum >= want) break;
        }
        n = keep;
        total = cum;
    }
    double u = (double)(splitmix(rng) >> 11) * (1.0 / 9007199254740992.0) * total, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += c[i].v;
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id; /* u rounded up to the total */
}

int mw_net_generate(struct mw_net *n, const int32_t *prompt, int n_prompt, const struct mw_gen_params *p,
                    mw_gen_token_fn fn, void *user, int32_t *out, struct mw_gen_result *res)
{
    int err = mw_gen_params_check(p);
    res->n_new = 0;
    res->stop = MW_GEN_STOP_LENGTH;
    if (err) return err;
    if (n_prompt < 1) return mw_error_set(-EINVAL, "generate: the prompt is empty (it needs at least one token)");
    if (n_prompt > n->context)
        return mw_error_set(-EINVAL, "generate: the prompt has %d tokens, the model's context is %d", n_prompt, n->context);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n->vocab)
            return mw_error_set(-EINVAL, "generate: prompt token %d is %d, outside the model's vocabulary 0..%d", i,
                                (int)prompt[i], n->vocab - 1);
    if (p->max_new_tokens == 0) return 0;
    if (n_prompt == n->context) { res->stop = MW_GEN_STOP_CONTEXT; return 0; }
    /* Positions the cache holds: every token fed, the last sampled one never is. */
    long total = (long)n_prompt + p->max_new_tokens;
    int cap = (int)(total < n->context ? total : n->context);
    void *kv = NULL;
    float *logits = malloc((size_t)n->vocab * sizeof(float));
    void *scratch = malloc(mw_gen_scratch_bytes(n->vocab));
    if (!logits || !scratch) { err = mw_error_set(-ENOMEM, "generate: no memory for the logits"); goto out; }
    if ((err = mw_net_kv_init(n, cap, &kv))) goto out;
    if ((err = mw_net_decode(n, kv, prompt, n_prompt, 0, logits))) goto out;
    uint64_t rng = p->seed;
    for (int i = 0;; i++) {
        int32_t tok = mw_gen_pick(logits, n->vocab, p, &rng, scratch);
        if (out) out[i] = tok;
        res->n_new = i + 1;
        int rc = fn ? fn(user, tok, i) : 0;
        if (rc < 0) { err = rc; goto out; }
        if (rc > 0) { res->stop = MW_GEN_STOP_CALLER; break; }
        if (tok == p->eos) { res->stop = MW_GEN_STOP_EOS; break; }
        if (i + 1 == p->max_new_tokens) { res->stop = MW_GEN_STOP_LENGTH; break; }
        if (n_prompt + i + 1 >= n->context) { res->stop = MW_GEN_STOP_CONTEXT; break; }
        if ((err = mw_net_decode(n, kv, &tok, 1, n_prompt + i, logits))) goto out;
    }
out:
    mw_net_kv_free(n, kv);
    free(logits);
    free(scratch);
    return err;
}
