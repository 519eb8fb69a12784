/* ZeRO partitioning math (no MPI): every element has exactly one owner, shards are contiguous
 * runs of whole subgroups balanced to within one subgroup, bucket counts match a brute-force
 * owner lookup, and the per-rank volumes reproduce the ZeRO paper's 2 Psi / 3 Psi (and the
 * planner's factor). */
#include <errno.h>
#include <math.h>

#include "memwall/comm.h"
#include "memwall/plan.h"
#include "testutil.h"

static void exhaustive(void)
{
    int bad = 0;
    for (uint64_t total = 1; total <= 120 && !bad; total++)
        for (uint64_t sg = 1; sg <= 13 && !bad; sg++)
            for (int ranks = 1; ranks <= 7 && !bad; ranks++) {
                uint32_t S = mw_zero_subgroups(total, sg);
                uint64_t next = 0, nmin = UINT64_MAX, nmax = 0;
                uint32_t next_sg = 0, cmin = UINT32_MAX, cmax = 0;
                for (int r = 0; r < ranks; r++) {
                    struct mw_zero_shard s;
                    if (mw_zero_shard(total, sg, ranks, r, &s)) { bad = 1; break; }
                    if (s.first != next || s.sg_first != next_sg) bad = 2;        /* contiguous, in order */
                    if (s.sg_count && s.first != (uint64_t)s.sg_first * sg) bad = 3; /* whole subgroups */
                    next = s.first + s.n;
                    next_sg = s.sg_first + s.sg_count;
                    nmin = MW_MIN(nmin, s.n); nmax = MW_MAX(nmax, s.n);
                    cmin = MW_MIN(cmin, s.sg_count); cmax = MW_MAX(cmax, s.sg_count);
                    for (uint32_t g = s.sg_first; g < s.sg_first + s.sg_count; g++)
                        if (mw_zero_owner_sg(total, sg, ranks, g) != r) bad = 4;
                    for (uint64_t e = s.first; e < s.first + s.n; e++)
                        if (mw_zero_owner_elem(total, sg, ranks, e) != r) bad = 5;
                }
                if (!bad && (next != total || next_sg != S)) bad = 6;              /* covers everything */
                if (!bad && (cmax - cmin > 1 || nmax - nmin > sg)) bad = 7;        /* balanced */
                /* Every bucket: counts per rank == elements each rank owns in it. */
                for (uint64_t f = 0; f < total && !bad; f += 1 + total / 9)
                    for (uint64_t n = 0; f + n <= total && !bad; n += 1 + total / 7) {
                        size_t counts[8], displs[8], want[8] = {0};
                        if (mw_zero_bucket_counts(total, sg, ranks, f, n, counts, displs)) { bad = 8; break; }
                        for (uint64_t e = f; e < f + n; e++) want[mw_zero_owner_elem(total, sg, ranks, e)]++;
                        size_t at = 0;
                        for (int r = 0; r < ranks; r++) {
                            if (counts[r] != want[r] || displs[r] != at) bad = 9;
                            at += counts[r];
                        }
                    }
                if (bad)
                    fprintf(stderr, "partition failure %d at total %llu sg %llu ranks %d\n", bad,
                            (unsigned long long)total, (unsigned long long)sg, ranks);
            }
    CHECK_EQ_INT(bad, 0);
}

static void examples(void)
{
    struct mw_zero_shard s;
    /* 10 elements, subgroups of 3: [0,3) [3,6) [6,9) [9,10); 2 ranks own 2 subgroups each. */
    CHECK_EQ_INT(mw_zero_subgroups(10, 3), 4);
    CHECK(mw_zero_shard(10, 3, 2, 0, &s) == 0 && s.sg_first == 0 && s.sg_count == 2 && s.first == 0 && s.n == 6);
    CHECK(mw_zero_shard(10, 3, 2, 1, &s) == 0 && s.sg_first == 2 && s.sg_count == 2 && s.first == 6 && s.n == 4);
    /* 5 subgroups on 2 ranks: the later rank takes the extra (and the short last) one. */
    CHECK(mw_zero_shard(13, 3, 2, 0, &s) == 0 && s.sg_count == 2 && s.n == 6);
    CHECK(mw_zero_shard(13, 3, 2, 1, &s) == 0 && s.sg_count == 3 && s.n == 7);
    /* Fewer subgroups than ranks: someone owns nothing. */
    CHECK(mw_zero_shard(4, 4, 2, 0, &s) == 0 && s.n == 0);
    CHECK(mw_zero_shard(4, 4, 2, 1, &s) == 0 && s.n == 4);
    /* Large: 1.5e9 elements (GPT-2 XL), 100M subgroups, 3 ranks. */
    CHECK(mw_zero_shard(1558000000ull, 100000000ull, 3, 2, &s) == 0 && s.first + s.n == 1558000000ull);
    CHECK_EQ_INT(mw_zero_owner_elem(1558000000ull, 100000000ull, 3, 1557999999ull), 2);
    /* Errors. */
    CHECK_EQ_INT(mw_zero_shard(0, 3, 2, 0, &s), -EINVAL);
    CHECK_EQ_INT(mw_zero_shard(10, 0, 2, 0, &s), -EINVAL);
    CHECK_EQ_INT(mw_zero_shard(10, 3, 2, 2, &s), -EINVAL);
    CHECK_EQ_INT(mw_zero_owner_sg(10, 3, 2, 4), -EINVAL);
    CHECK_EQ_INT(mw_zero_owner_elem(10, 3, 2, 10), -EINVAL);
    size_t c[2];
    CHECK_EQ_INT(mw_zero_bucket_counts(10, 3, 2, 8, 3, c, NULL), -EINVAL);
}

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1, fabs(b)); }

static void volumes(void)
{
    /* 4 ranks, 1200 elements in 12 subgroups of 100: shards of 300, Psi = 4800 bytes. */
    const uint64_t total = 1200;
    const double psi = 1200.0 * 4;
    struct mw_zero_volume v;
    for (int stage = 0; stage <= 3; stage++)
        for (int r = 0; r < 4; r++) {
            CHECK(mw_zero_volume(stage, total, 100, 4, r, 1, 1, 4, 4, &v) == 0);
            double paper = (stage == 3 ? 3.0 : 2.0) * 3.0 / 4.0; /* 2 or 3 Psi x (N-1)/N */
            CHECK_MSG(near(v.psi_factor, paper), "stage %d rank %d: %g Psi, paper %g", stage, r, v.psi_factor, paper);
            CHECK(near(v.total, paper * psi));
            CHECK(near(v.psi_factor, mw_time_dp_volume_factor(stage, 0, 4, 1))); /* the planner agrees */
            CHECK(v.replica == 0);
        }
    CHECK(mw_zero_volume(1, total, 100, 4, 0, 1, 1, 4, 4, &v) == 0);
    CHECK(near(v.reduce_scatter, 900 * 4) && near(v.allgather, 900 * 4) && v.allreduce == 0);
    /* Gradient accumulation over 4 micro-steps: stage 1 reduces once, stage 2 every micro-step,
     * stage 3 gathers twice and reduces once per micro-step. */
    CHECK(mw_zero_volume(1, total, 100, 4, 0, 1, 4, 4, 4, &v) == 0 && near(v.psi_factor, 2 * 0.75));
    CHECK(mw_zero_volume(2, total, 100, 4, 0, 1, 4, 4, 4, &v) == 0 && near(v.psi_factor, 5 * 0.75));
    CHECK(mw_zero_volume(3, total, 100, 4, 0, 1, 4, 4, 4, &v) == 0 && near(v.psi_factor, 12 * 0.75));
    /* bf16 weights halve the allgather. */
    CHECK(mw_zero_volume(1, total, 100, 4, 0, 1, 1, 4, 2, &v) == 0 && near(v.allgather, 900 * 2));
    /* Uneven shards: 13 elements, subgroups of 3, 2 ranks (6 and 7): rank 0 sends 7 in the
     * reduce-scatter (not its own 6) and 6 in the allgather (not its successor's 7). */
    CHECK(mw_zero_volume(1, 13, 3, 2, 0, 1, 1, 1, 1, &v) == 0 && near(v.reduce_scatter, 7) && near(v.allgather, 6));
    CHECK(mw_zero_volume(1, 13, 3, 2, 1, 1, 1, 1, 1, &v) == 0 && near(v.reduce_scatter, 6) && near(v.allgather, 7));
    /* Hierarchy: 2 ranks per node shard, 3 nodes replicate: + allreduce of the 600-element
     * shard over 3 replicas, 2 x 2/3 x 600 x 4 bytes. */
    CHECK(mw_zero_volume(2, total, 100, 2, 0, 3, 1, 4, 4, &v) == 0);
    CHECK(near(v.replica, 2.0 * 2.0 / 3.0 * 600 * 4));
    CHECK(near(v.total, 600 * 4 + 600 * 4 + v.replica));
    /* Stage 0 ignores the shards: one allreduce over all 6 ranks. */
    CHECK(mw_zero_volume(0, total, 100, 2, 0, 3, 1, 4, 4, &v) == 0 && near(v.psi_factor, 2 * 5.0 / 6.0));
    /* One rank sends nothing. */
    CHECK(mw_zero_volume(3, total, 100, 1, 0, 1, 1, 4, 4, &v) == 0 && v.total == 0);
    CHECK_EQ_INT(mw_zero_volume(4, total, 100, 4, 0, 1, 1, 4, 4, &v), -EINVAL);
    CHECK_EQ_INT(mw_zero_volume(1, total, 100, 4, 0, 0, 1, 4, 4, &v), -EINVAL);
}

int main(void)
{
    exhaustive();
    examples();
    volumes();
    TEST_END();
}
