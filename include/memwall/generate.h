/*
 * memwall/generate.h — text generation with a model of the seam (memwall/model.h): the prompt
 * is prefilled into the family's key/value cache in one call, then each new token is sampled
 * from the last position's logits and decoded one position at a time (src/model/generate.c).
 *
 * Sampling, in the order transformers applies it: logits / temperature, keep the top_k largest
 * (0: all), keep the smallest set of the largest whose probabilities sum to top_p (1: all; at
 * least one token always stays), renormalise and draw with a seeded generator (the same seed,
 * model and thread count give the same tokens). temperature 0 is greedy: the argmax, the lowest
 * id on a tie; top_k = 1 and a small enough top_p pick that same token.
 *
 * Stopping: after max_new_tokens, after the eos token (which is returned and passed to the
 * callback, as transformers returns it), when the callback asks, or when the sequence fills the
 * model's context (prompt + generated = context: every token keeps a position the model has;
 * the result says MW_GEN_STOP_CONTEXT so the caller can say why). A prompt longer than the
 * context is -EINVAL.
 *
 *     struct mw_gen_params gp;
 *     mw_gen_params_default(&gp);
 *     gp.temperature = 0.0f;                     // greedy
 *     struct mw_gen_result r;
 *     rc = mw_net_generate(&net, prompt, n_prompt, &gp, on_token, user, out, &r);
 *
 * Errors: 0 or a negative code with mw_error_set (never prints); -ENOTSUP for a family without a
 * KV cache.
 */
#ifndef MEMWALL_GENERATE_H
#define MEMWALL_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mw_net;

struct mw_gen_params {
    int max_new_tokens; /* at most this many new tokens (>= 0) */
    float temperature;  /* 0: greedy; > 0: logits / temperature */
    int top_k;          /* 0: no limit */
    float top_p;        /* (0, 1]; 1: no limit */
    uint64_t seed;      /* the sampler's generator */
    int32_t eos;        /* stop after this token; -1: none */
};
/* 64 tokens, temperature 1, top_k 0, top_p 1, seed 0, no eos. */
void mw_gen_params_default(struct mw_gen_params *p);
/* 0 or -EINVAL naming the bad field. */
int mw_gen_params_check(const struct mw_gen_params *p);

enum mw_gen_stop {
    MW_GEN_STOP_LENGTH = 0,  /* max_new_tokens reached */
    MW_GEN_STOP_EOS = 1,     /* the eos token was generated */
    MW_GEN_STOP_CONTEXT = 2, /* prompt + generated fill the model's context */
    MW_GEN_STOP_CALLER = 3,  /* the callback returned > 0 */
};
const char *mw_gen_stop_name(enum mw_gen_stop s); /* "length", "eos", "context", "caller" */

struct mw_gen_result {
    int n_new;             /* tokens generated (and written to out, passed to the callback) */
    enum mw_gen_stop stop;
};

/* Called with each new token as it is sampled (index 0, 1, ...): 0 goes on, > 0 stops
 * (MW_GEN_STOP_CALLER), < 0 ends generation with that error. */
typedef int (*mw_gen_token_fn)(void *user, int32_t token, int index);

/* Generates after prompt[0..n_prompt) (n_prompt >= 1, ids below the model's vocabulary). out
 * (optional) gets the new tokens, room for max_new_tokens; fn (optional) hears each as it comes. */
int mw_net_generate(struct mw_net *n, const int32_t *prompt, int n_prompt, const struct mw_gen_params *p,
                    mw_gen_token_fn fn, void *user, int32_t *out, struct mw_gen_result *res);

/* One sampling step on logits[0..V) (what mw_net_generate does per token). scratch: room for
 * V floats and V ints (mw_gen_scratch_bytes); *rng advances. Returns the token. */
size_t mw_gen_scratch_bytes(int V);
int32_t mw_gen_pick(const float *logits, int V, const struct mw_gen_params *p, uint64_t *rng, void *scratch);

#ifdef __cplusplus
}
#endif
#endif
