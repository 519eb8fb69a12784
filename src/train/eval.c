/*
 * eval.c — the held-out figure users compare (memwall eval): the mean next-token loss over a
 * file's consecutive windows. Why consecutive windows and not the trainer's sampled batches: the
 * number must be the same for every tool that reads the same tokens (transformers' loss over the
 * same windows gives it to 1e-4), and must not depend on a seed or on how a run drew its batches.
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "memwall/data.h"
#include "memwall/model.h"

#include <errno.h>
#include <stdlib.h>

int mw_train_eval_windows(struct mw_net *m, const struct mw_data *d, int T, int B, struct mw_eval_result *out)
{
    out->windows = out->tokens = 0;
    out->loss = 0;
    if (T < 1 || B < 1) return mw_error_set(-EINVAL, "evaluation needs a sequence length and batch of at least 1");
    uint64_t total = 0;
    for (int s = 0; s < d->nseg; s++) total += d->seg[s].n > 0 ? (d->seg[s].n - 1) / (uint64_t)T : 0;
    if (!total)
        return mw_error_set(-EINVAL, "%s has %llu tokens: no whole window of %d + 1 tokens to evaluate; use a shorter "
                            "sequence length (seq)", d->path, (unsigned long long)d->n_tokens, T);
    size_t bt = (size_t)B * (size_t)T;
    int32_t *in = malloc(bt * sizeof *in), *tg = malloc(bt * sizeof *tg);
    if (!in || !tg) {
        free(in);
        free(tg);
        return mw_error_set(-ENOMEM, "no memory for the evaluation batch");
    }
    double sum = 0;
    int err = 0;
    for (int s = 0; s < d->nseg && !err; s++) {
        const struct mw_data_segment *g = &d->seg[s];
        uint64_t nw = g->n > 0 ? (g->n - 1) / (uint64_t)T : 0;
        for (uint64_t w = 0; w < nw && !err;) {
            int b = (int)MW_MIN((uint64_t)B, nw - w);
            for (int k = 0; k < b; k++)
                for (int t = 0; t < T; t++) {
                    size_t i = (size_t)(w + (uint64_t)k) * (size_t)T + (size_t)t;
                    in[(size_t)k * (size_t)T + (size_t)t] = (int32_t)MW_MIN(mw_data_seg_token(g, i), (uint32_t)INT32_MAX);
                    tg[(size_t)k * (size_t)T + (size_t)t] = (int32_t)MW_MIN(mw_data_seg_token(g, i + 1), (uint32_t)INT32_MAX);
                }
            if (!(err = mw_net_forward(m, in, tg, b, T))) sum += (double)m->loss * (double)b;
            w += (uint64_t)b;
        }
    }
    free(in);
    free(tg);
    if (err) return err;
    out->windows = total;
    out->tokens = total * (uint64_t)T;
    out->loss = sum / (double)total;
    return 0;
}
