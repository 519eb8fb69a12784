/*
 * stream.c — the DRAM peak of `memwall train --offload-params nvme` (weights, gradients and
 * optimizer state on NVMe, streamed a weight unit at a time), before the run.
 *
 * Why a simulation and not a formula: what is resident is decided by the trainer's schedule
 * (src/train/stream.c): a unit's subgroups (page-aligned pieces of the flat parameter space,
 * the optimizer's unit of I/O) are fetched ahead of use by `depth` units and dropped after use,
 * and gradients leave DRAM once backward has passed the start of the 2^20-element norm chunk a
 * subgroup starts in. Units are not whole subgroups, so rounding decides a fair part of the
 * answer; walking the same schedule over the same cut gives the number the run will meet, and
 * the trainer prints it and refuses a budget below it (one code path: this file).
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "memwall/offload.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK MW_OFFLOAD_NORM_CHUNK /* the gradient norm's chunks (memwall/offload.h) */

/* The weight units: the model table's (in->unit_n), or GPT-2's as memwall lays them out
 * (embeddings wte + wpe, blocks, ln_f). */
static int units_of(const struct mw_plan_stream_in *in, uint64_t *first, uint64_t *n)
{
    uint64_t C = (uint64_t)in->n_embd, L = (uint64_t)in->n_layer;
    if (in->unit_n) {
        memcpy(n, in->unit_n, (L + 2) * sizeof *n);
    } else {
        n[0] = (uint64_t)in->padded_vocab * C + (uint64_t)in->max_seq * C;
        for (uint64_t l = 0; l < L; l++) n[1 + l] = 12 * C * C + 13 * C;
        n[L + 1] = 2 * C;
    }
    uint64_t off = 0;
    for (uint64_t u = 0; u < L + 2; u++) {
        if (!n[u] || off + n[u] < off)
            return mw_error_set(-EINVAL, "stream plan: unit %llu has %llu elements", (unsigned long long)u,
                                (unsigned long long)n[u]);
        first[u] = off;
        off += n[u];
    }
    return 0;
}

/* The unit at position p of the pass (forward then backward), -1 past its end. */
static int unit_at(const struct mw_plan_stream_in *in, int p)
{
    if (!in->order) return mw_plan_stream_unit(in->n_layer, in->layer_major, p);
    return p >= 0 && p < in->n_fwd + in->n_bwd ? in->order[p] : -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void mw_plan_stream_leads(const uint64_t *n, int nu, int depth, int *lead)
{
    uint64_t *s = malloc((size_t)MW_MAX(nu, 1) * sizeof *s), ref = 0;
    if (s && nu > 0) {
        memcpy(s, n, (size_t)nu * sizeof *s);
        qsort(s, (size_t)nu, sizeof *s, cmp_u64);
        ref = s[nu / 2];
    }
    free(s);
    for (int u = 0; u < nu; u++) {
        uint64_t k = ref ? (n[u] + ref - 1) / ref : 1; /* no memory for the median: depth, as without */
        lead[u] = depth * (int)MW_MAX(1, MW_MIN(k, (uint64_t)MW_PLAN_LEAD_MAX));
    }
}

int mw_plan_stream_unit(int L, int layer_major, int p)
{
    int nf = L + 3;
    if (p < 0) return -1;
    if (p < nf) return p == L + 2 ? 0 : p;
    p -= nf;
    if (layer_major) return p >= L ? -1 : L - p; /* the lookups' share needs no weights */
    if (p > L + 1) return -1;
    return p == 0 ? 0 : L + 2 - p;
}

static uint64_t sg_bytes(uint64_t g, uint64_t S, uint64_t N, uint64_t page)
{
    uint64_t a = g * S, n = MW_MIN(S, N - a);
    return MW_ALIGN_UP(n * 4, page);
}

int mw_plan_stream_dram(const struct mw_plan_stream_in *in, struct mw_plan_stream *out)
{
    memset(out, 0, sizeof *out);
    int gpt = !in->order; /* else the model table's units (n_layer may be 0: embedding and head only) */
    if (in->n_layer < !!gpt || (gpt && (in->n_embd < 1 || in->padded_vocab < 1 || in->max_seq < 1)) || in->prefetch_depth < 0 ||
        in->prefetch_depth > 8 || in->grad_accum < 1 || !in->subgroup_size)
        return mw_error_set(-EINVAL, "stream plan: bad shape (layers %d, width %d, vocab %d, context %d, depth %d, "
                            "accumulation %d, subgroup %llu)", in->n_layer, in->n_embd, in->padded_vocab, in->max_seq,
                            in->prefetch_depth, in->grad_accum, (unsigned long long)in->subgroup_size);
    int L = in->n_layer, nu = L + 2;
    uint64_t *first = calloc((size_t)nu, sizeof *first), *n = calloc((size_t)nu, sizeof *n);
    if (!first || !n) {
        free(first);
        free(n);
        return mw_error_set(-ENOMEM, "stream plan: out of memory");
    }
    int tied = in->order ? in->tied : 1;
    if (in->order && (in->n_fwd < L + 2 || in->n_fwd > L + 3 || in->n_bwd < L || in->n_bwd > L + 2)) {
        free(first);
        free(n);
        return mw_error_set(-EINVAL, "stream plan: a pass of %d + %d units for %d blocks", in->n_fwd, in->n_bwd, L);
    }
    for (int p = 0; in->order && p < in->n_fwd + in->n_bwd; p++)
        if (in->order[p] < 0 || in->order[p] > L + 1) {
            free(first);
            free(n);
            return mw_error_set(-EINVAL, "stream plan: unit %d at position %d of %d units", in->order[p], p, L + 2);
        }
    if (units_of(in, first, n)) {
        free(first);
        free(n);
        return -EINVAL;
    }
    uint64_t N = first[nu - 1] + n[nu - 1], S = MW_MIN(in->subgroup_size, N), page = 4096;
    uint64_t nsg = (N + S - 1) / S;
    unsigned char *mark = calloc((size_t)nsg, 1);
    int *lead = calloc((size_t)nu, sizeof *lead);
    if (!mark || !lead) {
        free(first);
        free(n);
        free(mark);
        free(lead);
        return mw_error_set(-ENOMEM, "stream plan: out of memory");
    }
    /* At each position p of a training pass: the weights of the units at p..p+depth (resident
     * or being fetched; a released unit's subgroups stay only when the next one needs them) and,
     * leading by size, those further ahead within their own lead (mw_plan_stream_leads),
     * plus the gradients resident then. Gradients: with accumulation (or keep_grads) the whole array
     * lives through the step (and stays, zeroed, for the next); else at the last micro-batch, unit
     * u's backward touches its range from first[u] up, the subgroups that start in a norm chunk below
     * the previous mark wait for the rest of their chunk, and those finished at the previous mark are
     * being written. The LM head (backward position 0) and the blocks write nothing below them; the
     * embeddings' gradients come last, after every weight is gone.
     * Layer-major adds wte's head share in the forward's head phase: the embeddings' gradients
     * are resident from there to the end (an untied head's own gradients are written then).
     * Another family's pass (in->order) walks the same way over its own units. */
    int lm = in->layer_major, nf = in->order ? in->n_fwd : L + 3, npos = nf + (in->order ? in->n_bwd : lm ? L : L + 2);
    uint64_t emb_hi = (n[0] - 1) / S; /* the last subgroup holding embedding gradients */
    /* How far ahead each unit is fetched: depth, or by its size (units.c does the same). */
    int lead_max = in->prefetch_depth;
    if (in->lead_by_size) {
        mw_plan_stream_leads(n, nu, in->prefetch_depth, lead);
        for (int u = 0; u < nu; u++) lead_max = MW_MAX(lead_max, lead[u]);
    }
    uint64_t full = MW_ALIGN_UP(N * 4, page);
    for (int p = 0; p <= npos; p++) {
        memset(mark, 0, (size_t)nsg);
        uint64_t wbytes = 0, gbytes = 0;
        for (int k = 0; k <= lead_max && p < npos; k++) {
            int u = unit_at(in, p + k);
            if (u < 0 && in->wrap_micro && in->grad_accum > 1 && !lm && p + k >= npos && p + k - npos < nf)
                u = unit_at(in, p + k - npos); /* the next micro-batch's first units (stream.c's wrap) */
            if (u < 0) break;
            if (k > in->prefetch_depth && (!in->lead_by_size || k > lead[u])) continue;
            for (uint64_t g = first[u] / S; g <= (first[u] + n[u] - 1) / S; g++)
                if (!mark[g]) { mark[g] = 1; wbytes += sg_bytes(g, S, N, page); }
        }
        for (int q = 0; in->keep_tied && p > 0 && p < nf && q < p; q++) { /* kept from a use before p to one after */
            int u = unit_at(in, q), again = 0;
            for (int r = p + 1; r < nf && !again; r++) again = unit_at(in, r) == u;
            for (uint64_t g = first[u] / S; again && g <= (first[u] + n[u] - 1) / S; g++)
                if (!mark[g]) { mark[g] = 1; wbytes += sg_bytes(g, S, N, page); }
        }
        if (lm && tied && p == nf - 1) /* layer-major's tied head holds ln_f and the embeddings together */
            for (uint64_t g = first[L + 1] / S; g <= (N - 1) / S; g++)
                if (!mark[g]) { mark[g] = 1; wbytes += sg_bytes(g, S, N, page); }
        int backward = p >= nf, u = p < npos ? unit_at(in, p) : 0;
        if (in->dp_grads_bytes) { /* data parallel: as the ZeRO stage keeps them (the trainer's figure) */
            gbytes = in->dp_grads_bytes;
        } else if ((in->grad_accum > 1 || in->keep_grads) && !lm) {
            gbytes = full;
        } else if (backward && (lm || p != nf || !tied)) { /* batch-major's tied LM head (position nf) writes none */
            /* The writes of the previous unit's subgroups are still in flight during this unit's
             * backward (their pages go at its end): the window reaches two marks back. */
            uint64_t prev2 = u + 2 <= L + 1 ? first[u + 2] : N;
            memset(mark, 0, (size_t)nsg);
            for (uint64_t g = first[u] / S; g < nsg; g++)
                if ((g * S) / CHUNK * CHUNK < prev2) { mark[g] = 1; gbytes += sg_bytes(g, S, N, page); }
            for (uint64_t g = 0; lm && tied && g <= emb_hi; g++)
                if (!mark[g]) gbytes += sg_bytes(g, S, N, page);
        } else if (lm && p == nf - 1) { /* the head's gradients: the embedding's (tied) or its own */
            for (uint64_t g = tied ? 0 : first[L + 1] / S; g <= (tied ? emb_hi : (N - 1) / S); g++)
                gbytes += sg_bytes(g, S, N, page);
        }
        /* The update of the step before runs behind the forward pass: its subgroups' gradients
         * (one per staging buffer) are in DRAM beside the forward's weights. */
        if (in->overlap && !backward) gbytes += (uint64_t)in->buffer_count * sg_bytes(0, S, N, page);
        if (wbytes > out->weights_peak) { out->weights_peak = wbytes; out->weights_peak_unit = u; }
        out->grads_peak = MW_MAX(out->grads_peak, gbytes);
        out->passes = MW_MAX(out->passes, wbytes + gbytes);
    }
    /* The optimizer step: each staging buffer in use has its subgroup's gradients in. */
    out->step_grads = (uint64_t)in->buffer_count * sg_bytes(0, S, N, page); /* a step of its own */
    out->acts = in->acts_bytes;
    out->staging = in->staging_bytes;
    out->runtime = in->runtime_bytes;
    out->dp_buffers = in->dp_buffer_bytes;
    out->params = N;
    out->subgroup_size = S;
    out->total = out->runtime + out->acts + out->staging + out->dp_buffers + MW_MAX(out->passes, out->step_grads);
    free(first);
    free(n);
    free(mark);
    free(lead);
    return 0;
}
