/*
 * zero.c — which rank owns which part of the training state under ZeRO, and how many bytes
 * each rank sends per step. Pure functions (no MPI), so every rank computes the same answer
 * on its own and the unit tests need no launcher.
 *
 * Why whole subgroups: the offload engine cuts the flat parameter space into subgroups and
 * keeps state, files and pipeline per subgroup. Giving each rank a contiguous run of whole
 * subgroups keeps those unchanged (a rank runs the engine on the subgroups it owns), keeps each
 * rank's shard contiguous (one block per rank in reduce-scatter / allgather), and is balanced
 * to within one subgroup.
 */
#include <errno.h>

#include "memwall/comm.h"

uint32_t mw_zero_subgroups(uint64_t total, uint64_t sg_size)
{
    if (!sg_size) return 0;
    return (uint32_t)((total + sg_size - 1) / sg_size);
}

static int check(uint64_t total, uint64_t sg_size, int ranks)
{
    if (!total || !sg_size || ranks < 1)
        return mw_error_set(-EINVAL, "ZeRO partition: total %llu elements, subgroup %llu, %d ranks",
                            (unsigned long long)total, (unsigned long long)sg_size, ranks);
    if ((total + sg_size - 1) / sg_size > UINT32_MAX)
        return mw_error_set(-EINVAL, "ZeRO partition: more than 2^32 subgroups (subgroup size %llu)",
                            (unsigned long long)sg_size);
    return 0;
}

/* First subgroup of rank r (r == ranks gives S). */
static uint32_t sg_begin(uint32_t S, int ranks, int r)
{
    return (uint32_t)((uint64_t)S * (uint64_t)r / (uint64_t)ranks);
}

int mw_zero_shard(uint64_t total, uint64_t sg_size, int ranks, int rank, struct mw_zero_shard *out)
{
    int rc = check(total, sg_size, ranks);
    if (rc) return rc;
    if (rank < 0 || rank >= ranks) return mw_error_set(-EINVAL, "ZeRO partition: rank %d of %d", rank, ranks);
    uint32_t S = mw_zero_subgroups(total, sg_size);
    uint32_t a = sg_begin(S, ranks, rank), b = sg_begin(S, ranks, rank + 1);
    out->sg_first = a;
    out->sg_count = b - a;
    out->first = MW_MIN((uint64_t)a * sg_size, total);
    out->n = MW_MIN((uint64_t)b * sg_size, total) - out->first;
    return 0;
}

int mw_zero_owner_sg(uint64_t total, uint64_t sg_size, int ranks, uint32_t sg)
{
    int rc = check(total, sg_size, ranks);
    if (rc) return rc;
    uint32_t S = mw_zero_subgroups(total, sg_size);
    if (sg >= S) return mw_error_set(-EINVAL, "ZeRO partition: subgroup %u of %u", sg, S);
    /* The largest r with floor(S*r/ranks) <= sg: r = floor(((sg+1)*ranks - 1) / S). */
    int r = (int)((((uint64_t)sg + 1) * (uint64_t)ranks - 1) / S);
    MW_ASSERT(sg_begin(S, ranks, r) <= sg && sg < sg_begin(S, ranks, r + 1));
    return r;
}

int mw_zero_owner_elem(uint64_t total, uint64_t sg_size, int ranks, uint64_t e)
{
    int rc = check(total, sg_size, ranks);
    if (rc) return rc;
    if (e >= total) return mw_error_set(-EINVAL, "ZeRO partition: element %llu of %llu",
                                        (unsigned long long)e, (unsigned long long)total);
    return mw_zero_owner_sg(total, sg_size, ranks, (uint32_t)(e / sg_size));
}

int mw_zero_bucket_counts(uint64_t total, uint64_t sg_size, int ranks, uint64_t first, uint64_t n,
                          size_t *counts, size_t *displs)
{
    int rc = check(total, sg_size, ranks);
    if (rc) return rc;
    if (first > total || n > total - first)
        return mw_error_set(-EINVAL, "ZeRO bucket [%llu, +%llu) outside the %llu elements",
                            (unsigned long long)first, (unsigned long long)n, (unsigned long long)total);
    /* Shards are contiguous and in rank order, so the pieces of the bucket are too: each
     * rank's piece starts where the previous rank's ends. */
    size_t at = 0;
    for (int r = 0; r < ranks; r++) {
        struct mw_zero_shard s;
        MW_ASSERT(mw_zero_shard(total, sg_size, ranks, r, &s) == 0); /* arguments checked above */
        uint64_t lo = MW_MAX(s.first, first), hi = MW_MIN(s.first + s.n, first + n);
        counts[r] = hi > lo ? (size_t)(hi - lo) : 0;
        if (displs) displs[r] = at;
        at += counts[r];
    }
    MW_ASSERT(at == n);
    return 0;
}

/* Ring reduce-scatter: rank r sends every block except its own; ring allgather: every block
 * except its successor's (which it receives last). */
static double ring_rs(uint64_t total, const struct mw_zero_shard *own) { return (double)(total - own->n); }
static double ring_ag(uint64_t total, const struct mw_zero_shard *next) { return (double)(total - next->n); }

int mw_zero_volume(int stage, uint64_t total, uint64_t sg_size, int ranks, int rank, int replicas,
                   int micro_steps, size_t grad_bytes, size_t weight_bytes, struct mw_zero_volume *out)
{
    *out = (struct mw_zero_volume){0};
    if (stage < 0 || stage > 3 || replicas < 1 || micro_steps < 1 || !grad_bytes || !weight_bytes)
        return mw_error_set(-EINVAL, "ZeRO volume: stage %d, %d replicas, %d micro-steps", stage,
                            replicas, micro_steps);
    struct mw_zero_shard own, next;
    int rc = mw_zero_shard(total, sg_size, ranks, rank, &own);
    if (rc) return rc;
    MW_ASSERT(mw_zero_shard(total, sg_size, ranks, (rank + 1) % ranks, &next) == 0); /* checked with own */
    const double gb = (double)grad_bytes, wb = (double)weight_bytes, m = micro_steps;
    const double R = replicas;
    if (stage == 0) {
        /* One allreduce over every rank (shard group x replicas), equal blocks. */
        double N = (double)ranks * R;
        out->allreduce = 2.0 * (N - 1) / N * (double)total * gb;
    } else {
        double rs = ring_rs(total, &own) * gb, ag = ring_ag(total, &next) * wb;
        if (ranks == 1) rs = ag = 0;
        if (stage == 1) { out->reduce_scatter = rs; out->allgather = ag; }
        if (stage == 2) { out->reduce_scatter = m * rs; out->allgather = ag; }
        if (stage == 3) { out->reduce_scatter = m * rs; out->allgather = 2.0 * m * ag; }
        out->replica = 2.0 * (R - 1) / R * (double)own.n * gb;
    }
    out->total = out->allreduce + out->reduce_scatter + out->allgather + out->replica;
    out->psi_factor = out->total / ((double)total * gb);
    return 0;
}
