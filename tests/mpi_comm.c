/* Collectives over 2 ranks (run by ctest under mpirun -np 2): results against a serial
 * reference (bit for bit in the deterministic mode), uneven and empty blocks, in-place
 * allgather, handles that stay pending until the peer joins (really non-blocking), several
 * buckets in flight, the node hierarchy (simulated with one rank per "node"), byte counters
 * and trace spans. Every rank generates every rank's data, so each checks on its own. */
#include <math.h>
#include <mpi.h>

#include "memwall/comm.h"
#include "memwall/trace.h"
#include "testutil.h"

static float *gen(size_t n, int rank, uint64_t salt)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    uint64_t s = 0x9e3779b97f4a7c15ull ^ (salt * 7919 + (uint64_t)rank + 1);
    for (size_t i = 0; i < n; i++) p[i] = tu_randf(&s) * 100.0f;
    return p;
}

/* Sum over ranks 0..size-1 of element i of gen(n, r, salt), in rank order, scaled. */
static float ref_at(float **all, int size, size_t i, int avg)
{
    float s = all[0][i];
    for (int r = 1; r < size; r++) s += all[r][i];
    return avg ? s * (float)(1.0 / size) : s;
}

static void allreduce_case(struct mw_comm *c, enum mw_comm_group g, size_t n, int avg, int exact, uint64_t salt)
{
    int size = mw_comm_size(c, g), me = mw_comm_rank(c, g);
    float *all[8];
    for (int r = 0; r < size; r++) all[r] = gen(n, r, salt);
    float *buf = gen(n, me, salt);
    struct mw_comm_req *q;
    REQUIRE(mw_comm_iallreduce(c, g, buf, n, avg, &q) == 0);
    int rc = mw_comm_wait(c, &q);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = ref_at(all, size, i, avg);
        if (exact ? buf[i] != want : fabsf(buf[i] - want) > 1e-5f * fmaxf(1, fabsf(want))) bad++;
    }
    CHECK_MSG(bad == 0, "allreduce n=%zu avg=%d exact=%d: %zu wrong", n, avg, exact, bad);
    for (int r = 0; r < size; r++) free(all[r]);
    free(buf);
}

static void reduce_scatter_case(struct mw_comm *c, const size_t *counts, int avg, int exact, uint64_t salt)
{
    int size = mw_comm_size(c, MW_COMM_WORLD), me = mw_comm_rank(c, MW_COMM_WORLD);
    size_t total = 0, off = 0;
    for (int r = 0; r < size; r++) { if (r < me) off += counts[r]; total += counts[r]; }
    float *all[8];
    for (int r = 0; r < size; r++) all[r] = gen(total, r, salt);
    float *recv = malloc((counts[me] ? counts[me] : 1) * sizeof *recv);
    struct mw_comm_req *q;
    REQUIRE(mw_comm_ireduce_scatter(c, MW_COMM_WORLD, all[me], recv, counts, avg, &q) == 0);
    CHECK(mw_comm_wait(c, &q) == 0);
    size_t bad = 0;
    for (size_t i = 0; i < counts[me]; i++) {
        float want = ref_at(all, size, off + i, avg);
        if (exact ? recv[i] != want : fabsf(recv[i] - want) > 1e-5f * fmaxf(1, fabsf(want))) bad++;
    }
    CHECK_MSG(bad == 0, "reduce_scatter %zu/%zu: %zu wrong", counts[0], counts[1], bad);
    for (int r = 0; r < size; r++) free(all[r]);
    free(recv);
}

static void allgather_case(struct mw_comm *c, const size_t *counts, int in_place, uint64_t salt)
{
    int size = mw_comm_size(c, MW_COMM_WORLD), me = mw_comm_rank(c, MW_COMM_WORLD);
    size_t total = 0, off = 0;
    for (int r = 0; r < size; r++) { if (r < me) off += counts[r]; total += counts[r]; }
    float *all[8];
    for (int r = 0; r < size; r++) all[r] = gen(counts[r], r, salt);
    float *recv = calloc(total ? total : 1, sizeof *recv);
    if (in_place && counts[me]) memcpy(recv + off, all[me], counts[me] * sizeof(float));
    struct mw_comm_req *q;
    REQUIRE(mw_comm_iallgather(c, MW_COMM_WORLD, in_place ? recv + off : all[me], recv, counts, &q) == 0);
    CHECK(mw_comm_wait(c, &q) == 0);
    size_t at = 0, bad = 0;
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < counts[r]; i++) bad += recv[at++] != all[r][i];
    CHECK_MSG(bad == 0, "allgather %zu/%zu in_place=%d: %zu wrong", counts[0], counts[1], in_place, bad);
    for (int r = 0; r < size; r++) free(all[r]);
    free(recv);
}

/* Rank 0 issues, finds the handle pending (rank 1 has not joined: it waits for rank 0's go),
 * then releases rank 1 and waits. Then 4 buckets in flight at once, completed by progress. */
static void nonblocking(struct mw_comm *c)
{
    int me = mw_comm_rank(c, MW_COMM_WORLD), done = 1, go = 1;
    float v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (float)(me + 1);
    struct mw_comm_req *q;
    if (me == 0) {
        REQUIRE(mw_comm_iallreduce(c, MW_COMM_WORLD, v, 1000, 0, &q) == 0);
        CHECK(mw_comm_test(c, &q, &done) == 0);
        CHECK_MSG(!done && q != NULL, "allreduce completed before the other rank joined");
        CHECK(mw_comm_progress(c) == 1);
        MPI_Send(&go, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
    } else {
        MPI_Recv(&go, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        REQUIRE(mw_comm_iallreduce(c, MW_COMM_WORLD, v, 1000, 0, &q) == 0);
    }
    CHECK(mw_comm_wait(c, &q) == 0 && q == NULL);
    CHECK(v[0] == 3.0f && v[999] == 3.0f);

    enum { NB = 4, BN = 4096 };
    float *b[NB];
    struct mw_comm_req *h[NB];
    for (int k = 0; k < NB; k++) {
        b[k] = malloc(BN * sizeof(float));
        for (int i = 0; i < BN; i++) b[k][i] = (float)(k * 10 + me);
        REQUIRE(mw_comm_iallreduce(c, MW_COMM_WORLD, b[k], BN, 1, &h[k]) == 0);
    }
    int left = NB, spins = 0;
    while ((left = mw_comm_progress(c)) > 0 && spins < 100000000) spins++;
    CHECK_EQ_INT(left, 0);
    for (int k = 0; k < NB; k++) {
        CHECK(mw_comm_test(c, &h[k], &done) == 0 && done && h[k] == NULL);
        CHECK(b[k][0] == (float)(k * 10) + 0.5f && b[k][BN - 1] == (float)(k * 10) + 0.5f);
        free(b[k]);
    }
}

static void hierarchy(void)
{
    struct mw_comm *c;
    struct mw_comm_config cfg;
    mw_comm_config_default(&cfg);
    cfg.backend = MW_COMM_MPI;
    cfg.hierarchy = MW_COMM_HIER_NODE;
    cfg.ranks_per_node = 1; /* two "nodes" of one rank */
    REQUIRE(mw_comm_init(&c, NULL, NULL, &cfg) == 0);
    int wr = mw_comm_rank(c, MW_COMM_WORLD);
    CHECK_EQ_INT(mw_comm_nodes(c), 2);
    CHECK_EQ_INT(mw_comm_node(c), wr);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_NODE), 1);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_CROSS), 2);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_SHARD), 1);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_REPLICA), 2);
    CHECK_EQ_INT(mw_comm_rank(c, MW_COMM_REPLICA), wr);
    allreduce_case(c, MW_COMM_REPLICA, 777, 1, 1, 11);
    allreduce_case(c, MW_COMM_SHARD, 777, 1, 1, 12); /* one rank: unchanged */
    CHECK(mw_comm_free(c) == 0);
}

int main(int argc, char **argv)
{
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 4096) == 0);
    struct mw_comm *c, *nd;
    struct mw_comm_config cfg;
    mw_comm_config_default(&cfg);
    cfg.backend = MW_COMM_MPI;
    cfg.trace = tr;
    cfg.timeout_s = 60;
    int rc = mw_comm_init(&c, &argc, &argv, &cfg);
    if (rc) { fprintf(stderr, "mw_comm_init: %s\n", mw_error_msg()); return 1; }
    int me = mw_comm_rank(c, MW_COMM_WORLD);
    REQUIRE(mw_comm_is_mpi(c));
    REQUIRE(mw_comm_size(c, MW_COMM_WORLD) == 2);
    /* Global hierarchy on one host: the shard group is everyone, replicas are just us. */
    CHECK_EQ_INT(mw_comm_nodes(c), 1);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_NODE), 2);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_CROSS), 1);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_SHARD), 2);
    CHECK_EQ_INT(mw_comm_size(c, MW_COMM_REPLICA), 1);
    CHECK(mw_comm_have_mpi());
    {   /* A group of one rank in an MPI job runs on the single-rank table: done when issued,
         * the average over one rank leaves the buffer as it was. */
        float one[3] = {1, 2, 3};
        struct mw_comm_req *q1;
        int done = 0;
        REQUIRE(mw_comm_iallreduce(c, MW_COMM_REPLICA, one, 3, 1, &q1) == 0);
        CHECK(mw_comm_test(c, &q1, &done) == 0 && done && q1 == NULL);
        CHECK(one[0] == 1 && one[1] == 2 && one[2] == 3);
    }

    static const size_t ns[] = {0, 1, 2, 3, 1000, 65537, 1u << 20};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int avg = 0; avg <= 1; avg++) allreduce_case(c, MW_COMM_WORLD, ns[i], avg, 1, i);
    static const size_t cs[][2] = {{5, 7}, {0, 9}, {9, 0}, {0, 0}, {100000, 100001}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        reduce_scatter_case(c, cs[i], (int)(i & 1), 1, 100 + i);
        allgather_case(c, cs[i], 0, 200 + i);
        allgather_case(c, cs[i], 1, 300 + i);
    }
    /* Counters: allreduce of 1000 floats on 2 ranks sends half of it twice (4000 bytes). */
    mw_comm_stats_reset(c);
    allreduce_case(c, MW_COMM_WORLD, 1000, 0, 1, 42);
    struct mw_comm_stats st;
    mw_comm_stats_get(c, &st);
    CHECK_EQ_INT(st.calls[MW_COMM_ALLREDUCE], 1);
    CHECK_EQ_INT(st.payload_bytes[MW_COMM_ALLREDUCE], 4000);
    CHECK_EQ_INT(st.sent_bytes[MW_COMM_ALLREDUCE], 4000);
    size_t uc[2] = {5, 7};
    reduce_scatter_case(c, uc, 0, 1, 43);
    mw_comm_stats_get(c, &st);
    CHECK_EQ_INT(st.sent_bytes[MW_COMM_REDUCE_SCATTER], me == 0 ? 28 : 20); /* all blocks but its own */

    nonblocking(c);

    /* The library's own MPI sums (deterministic = 0) against the reference, with a tolerance,
     * on a second set of communicators (MPI is initialised once; this one does not finalise). */
    mw_comm_config_default(&cfg);
    cfg.backend = MW_COMM_MPI;
    cfg.deterministic = 0;
    REQUIRE(mw_comm_init(&nd, NULL, NULL, &cfg) == 0);
    allreduce_case(nd, MW_COMM_WORLD, 100003, 1, 0, 51);
    size_t rc2[2] = {4000, 3000};
    reduce_scatter_case(nd, rc2, 1, 0, 52);
    CHECK(mw_comm_free(nd) == 0);

    hierarchy();

    /* Trace: each rank writes its own; the spans name the collective, bytes and ranks. */
    char path[600];
    snprintf(path, sizeof path, "%s/mpi_comm_trace.%d.json", getenv("MW_BUILD_DIR") ? getenv("MW_BUILD_DIR") : "/tmp", me);
    REQUIRE(mw_trace_write(tr, path) == 0);
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    static char js[1 << 20];
    size_t len = fread(js, 1, sizeof js - 1, f);
    js[len] = 0;
    fclose(f);
    remove(path);
    CHECK(strstr(js, "\"cat\":\"comm\",\"name\":\"allreduce\"") != NULL);
    CHECK(strstr(js, "\"cat\":\"comm\",\"name\":\"reduce_scatter\"") != NULL);
    CHECK(strstr(js, "\"cat\":\"comm\",\"name\":\"allgather\"") != NULL);
    CHECK(strstr(js, "\"bytes\":4000,\"ranks\":2") != NULL);
    CHECK(strstr(js, "\"name\":\"wait\"") != NULL);

    CHECK(mw_comm_barrier(c, MW_COMM_WORLD) == 0);
    CHECK(mw_comm_free(c) == 0);
    mw_trace_free(tr);
    printf("rank %d: ", me);
    TEST_END();
}
