/*
 * comm_bw.c — bandwidth of memwall's collectives (include/memwall/comm.h) against plain MPI,
 * run under mpirun by bench/comm_bw.sh. Rank 0 prints one line per operation and mode:
 * median seconds of --iters timed calls (after one warm-up), algorithm bandwidth
 * (payload / time) and bus bandwidth (the bytes each rank moves with a ring algorithm / time:
 * allreduce 2(N-1)/N x payload, reduce-scatter and allgather (N-1)/N x payload), in GB/s.
 *
 * usage: memwall_comm_bw [--bytes SIZE] [--iters N] [--buckets K]
 *   --bytes    payload per collective (default 256MiB, fp32 elements = bytes / 4)
 *   --buckets  split the payload into K buckets issued back to back, all in flight, then
 *              waited (as the training loop does; default 1)
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memwall/comm.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { MODE_DET = 0, MODE_MPI_SUM = 1, MODE_RAW = 2 };
static const char *mode_name[] = {"memwall deterministic", "memwall MPI sum", "plain MPI (blocking)"};

static struct mw_comm *comms[2];
static float *buf, *out;
static size_t n;
static int buckets = 1;

static int one(int mode, int op)
{
    struct mw_comm *c = comms[mode == MODE_DET ? 0 : 1];
    const int N = mw_comm_size(c, MW_COMM_WORLD);
    struct mw_comm_req **q = calloc((size_t)buckets, sizeof *q);
    size_t *counts = malloc((size_t)N * sizeof *counts);
    int rc = 0;
    for (int k = 0; k < buckets && !rc; k++) {
        size_t lo = n * (size_t)k / (size_t)buckets, hi = n * (size_t)(k + 1) / (size_t)buckets, len = hi - lo;
        for (int r = 0; r < N; r++) counts[r] = len * (size_t)(r + 1) / (size_t)N - len * (size_t)r / (size_t)N;
        size_t mine = 0;
        for (int r = 0; r < mw_comm_rank(c, MW_COMM_WORLD); r++) mine += counts[r];
        if (mode == MODE_RAW) {
            int *ic = malloc((size_t)N * 2 * sizeof *ic);
            for (int r = 0; r < N; r++) ic[r] = (int)counts[r];
            for (int r = 0, at = 0; r < N; r++) { ic[N + r] = at; at += ic[r]; }
            int me = mw_comm_rank(c, MW_COMM_WORLD);
            if (op == MW_COMM_ALLREDUCE) MPI_Allreduce(MPI_IN_PLACE, buf + lo, (int)len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (op == MW_COMM_REDUCE_SCATTER) MPI_Reduce_scatter(buf + lo, out + lo, ic, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (op == MW_COMM_ALLGATHER) MPI_Allgatherv(MPI_IN_PLACE, ic[me], MPI_FLOAT, buf + lo, ic, ic + N, MPI_FLOAT, MPI_COMM_WORLD);
            free(ic);
            continue;
        }
        if (op == MW_COMM_ALLREDUCE) rc = mw_comm_iallreduce(c, MW_COMM_WORLD, buf + lo, len, 1, &q[k]);
        if (op == MW_COMM_REDUCE_SCATTER) rc = mw_comm_ireduce_scatter(c, MW_COMM_WORLD, buf + lo, out + lo, counts, 1, &q[k]);
        if (op == MW_COMM_ALLGATHER) rc = mw_comm_iallgather(c, MW_COMM_WORLD, buf + lo + mine, buf + lo, counts, &q[k]);
    }
    for (int k = 0; k < buckets && !rc; k++) rc = mw_comm_wait(c, &q[k]);
    free(q);
    free(counts);
    return rc;
}

int main(int argc, char **argv)
{
    uint64_t bytes = 256ull << 20;
    int iters = 5;
    struct mw_comm_config cfg;
    mw_comm_config_default(&cfg);
    cfg.backend = MW_COMM_MPI;
    if (mw_comm_init(&comms[0], &argc, &argv, &cfg)) { fprintf(stderr, "comm_bw: %s\n", mw_error_msg()); return 1; }
    cfg.deterministic = 0;
    if (mw_comm_init(&comms[1], NULL, NULL, &cfg)) { fprintf(stderr, "comm_bw: %s\n", mw_error_msg()); return 1; }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bytes") && i + 1 < argc) {
            if (mw_parse_size(argv[++i], &bytes)) { fprintf(stderr, "comm_bw: bad --bytes\n"); return 2; }
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--buckets") && i + 1 < argc) {
            buckets = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--bytes SIZE] [--iters N] [--buckets K]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || buckets < 1) { fprintf(stderr, "comm_bw: --iters and --buckets must be >= 1\n"); return 2; }
    n = bytes / sizeof(float);
    buf = malloc(n * sizeof *buf);
    out = malloc(n * sizeof *out);
    if (!buf || !out) { fprintf(stderr, "comm_bw: out of memory\n"); return 1; }
    for (size_t i = 0; i < n; i++) buf[i] = out[i] = 1.0f;
    const int me = mw_comm_rank(comms[0], MW_COMM_WORLD), N = mw_comm_size(comms[0], MW_COMM_WORLD);
    if (me == 0)
        printf("# %d ranks, %.1f MiB fp32 payload, %d bucket(s), median of %d; GB/s = 10^9 bytes/s\n", N,
               (double)bytes / 1048576.0, buckets, iters);
    double *t = malloc((size_t)iters * sizeof *t);
    for (int op = 0; op < MW_COMM_NOPS; op++)
        for (int mode = 0; mode < 3; mode++) {
            if (mode == MODE_MPI_SUM && op == MW_COMM_ALLGATHER) continue; /* no sum: same call as det */
            for (int it = -1; it < iters; it++) {
                mw_comm_barrier(comms[0], MW_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (one(mode, op)) { fprintf(stderr, "comm_bw: %s\n", mw_error_msg()); mw_comm_abort(comms[0], 1); }
                double dt = MPI_Wtime() - t0;
                MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); /* slowest rank */
                if (it >= 0) t[it] = dt;
            }
            qsort(t, (size_t)iters, sizeof *t, cmp_d);
            double med = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
            double alg = (double)bytes / med, bus = alg * (N - 1) / N * (op == MW_COMM_ALLREDUCE ? 2 : 1);
            if (me == 0)
                printf("%-15s %-22s median %8.4f s   algbw %6.2f GB/s   busbw %6.2f GB/s\n",
                       mw_comm_op_name((enum mw_comm_op)op), mode_name[mode], med, alg / 1e9, bus / 1e9);
        }
    free(t);
    free(buf);
    free(out);
    mw_comm_free(comms[1]);
    return mw_comm_free(comms[0]) ? 1 : 0;
}
