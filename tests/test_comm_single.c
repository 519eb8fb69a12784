/* The single-rank backend (what memwall uses without MPI or without mpirun): every group has
 * one rank, collectives are copies that complete at once, and the byte counters and trace
 * spans are the same as with MPI. */
#include <errno.h>

#include "memwall/comm.h"
#include "memwall/trace.h"
#include "testutil.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

int main(void)
{
    enum mw_comm_hierarchy h;
    CHECK(mw_comm_hierarchy_parse("node", &h) == 0 && h == MW_COMM_HIER_NODE);
    CHECK(mw_comm_hierarchy_parse("GLOBAL", &h) == 0 && h == MW_COMM_HIER_GLOBAL);
    CHECK_EQ_INT(mw_comm_hierarchy_parse("rack", &h), -EINVAL);
    CHECK(strstr(mw_error_msg(), "rack") != NULL);

    struct mw_comm *c;
    struct mw_comm_config cfg;
    mw_comm_config_default(&cfg);
    if (!mw_comm_have_mpi()) {
        cfg.backend = MW_COMM_MPI;
        CHECK_EQ_INT(mw_comm_init(&c, NULL, NULL, &cfg), -ENOTSUP);
        CHECK(c == NULL);
        CHECK(strstr(mw_error_msg(), "memwall was built without MPI") != NULL);
        if (!getenv("OMPI_COMM_WORLD_SIZE")) { /* AUTO under a launcher, built without MPI */
            cfg.backend = MW_COMM_AUTO;
            setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
            CHECK(mw_comm_launched());
            CHECK_EQ_INT(mw_comm_init(&c, NULL, NULL, &cfg), -ENOTSUP);
            CHECK(c == NULL);
            CHECK(strstr(mw_error_msg(), "started by an MPI launcher but memwall was built without MPI") != NULL);
            unsetenv("OMPI_COMM_WORLD_SIZE");
        }
    }
    if (!mw_comm_launched()) { /* AUTO without mpirun: one rank, MPI never initialised */
        cfg.backend = MW_COMM_AUTO;
        REQUIRE(mw_comm_init(&c, NULL, NULL, &cfg) == 0);
        CHECK(!mw_comm_is_mpi(c) && mw_comm_size(c, MW_COMM_WORLD) == 1);
        CHECK(mw_comm_free(c) == 0);
    }
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 1024) == 0);
    cfg.backend = MW_COMM_SINGLE;
    cfg.hierarchy = MW_COMM_HIER_NODE;
    cfg.trace = tr;
    REQUIRE(mw_comm_init(&c, NULL, NULL, &cfg) == 0);
    CHECK(!mw_comm_is_mpi(c));
    for (int g = 0; g < MW_COMM_NGROUPS; g++) {
        CHECK_EQ_INT(mw_comm_size(c, (enum mw_comm_group)g), 1);
        CHECK_EQ_INT(mw_comm_rank(c, (enum mw_comm_group)g), 0);
    }
    CHECK_EQ_INT(mw_comm_nodes(c), 1);

    float buf[5] = {1, 2, 3, 4, 5}, out[5] = {0};
    struct mw_comm_req *q;
    int done = 0;
    REQUIRE(mw_comm_iallreduce(c, MW_COMM_WORLD, buf, 5, 1, &q) == 0);
    CHECK(q != NULL);
    CHECK(mw_comm_test(c, &q, &done) == 0 && done && q == NULL);
    CHECK(buf[0] == 1 && buf[4] == 5); /* the average over one rank */

    size_t counts[1] = {5};
    REQUIRE(mw_comm_ireduce_scatter(c, MW_COMM_SHARD, buf, out, counts, 0, &q) == 0);
    CHECK(mw_comm_wait(c, &q) == 0 && q == NULL);
    CHECK(memcmp(buf, out, sizeof buf) == 0);
    CHECK_EQ_INT(mw_comm_ireduce_scatter(c, MW_COMM_SHARD, buf, buf + 1, counts, 0, &q), -EINVAL);

    float g[5] = {0};
    counts[0] = 3;
    REQUIRE(mw_comm_iallgather(c, MW_COMM_REPLICA, buf, g, counts, &q) == 0);
    CHECK(mw_comm_progress(c) == 0);
    CHECK(mw_comm_wait(c, &q) == 0);
    CHECK(g[0] == 1 && g[2] == 3 && g[3] == 0);
    REQUIRE(mw_comm_iallgather(c, MW_COMM_REPLICA, g, g, counts, &q) == 0); /* in place */
    CHECK(mw_comm_wait(c, &q) == 0 && g[1] == 2);
    CHECK(mw_comm_barrier(c, MW_COMM_WORLD) == 0);

    struct mw_comm_stats st;
    mw_comm_stats_get(c, &st);
    CHECK_EQ_INT(st.calls[MW_COMM_ALLREDUCE], 1);
    CHECK_EQ_INT(st.calls[MW_COMM_REDUCE_SCATTER], 1); /* the refused one is not counted */
    CHECK_EQ_INT(st.calls[MW_COMM_ALLGATHER], 2);
    CHECK_EQ_INT(st.payload_bytes[MW_COMM_ALLREDUCE], 20);
    CHECK_EQ_INT(st.payload_bytes[MW_COMM_ALLGATHER], 24);
    CHECK_EQ_INT(mw_comm_stats_sent_total(&st), 0); /* one rank sends nothing */
    mw_comm_stats_reset(c);
    mw_comm_stats_get(c, &st);
    CHECK_EQ_INT(st.calls[MW_COMM_ALLGATHER], 0);
    CHECK(mw_comm_free(c) == 0);

    const char *dir = tu_scratch_dir("comm_single");
    char path[600];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    REQUIRE(mw_trace_write(tr, path) == 0);
    char *js = slurp(path);
    REQUIRE(js);
    CHECK(strstr(js, "\"cat\":\"comm\"") != NULL);
    CHECK(strstr(js, "\"name\":\"allreduce\"") != NULL);
    CHECK(strstr(js, "\"name\":\"reduce_scatter\"") != NULL);
    CHECK(strstr(js, "\"name\":\"allgather\"") != NULL);
    CHECK(strstr(js, "\"bytes\":20,\"ranks\":1") != NULL);
    CHECK(strstr(js, "\"name\":\"barrier\"") == NULL);
    free(js);
    mw_trace_free(tr);
    tu_rm_rf(dir);
    TEST_END();
}
