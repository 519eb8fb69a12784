/*
 * comm_impl.h — what the generic layer (comm.c) shares with its backends: the single-rank
 * copies (comm_single.c, always built) and MPI (src/mpi/comm_mpi.c, built with MPI only).
 * The generic layer validates arguments, keeps the list of requests in flight, counts bytes
 * and writes the trace; a backend only starts a collective and reports when it is done.
 */
#ifndef MW_COMM_IMPL_H
#define MW_COMM_IMPL_H

#include "memwall/comm.h"

#define MW_COMM_OP_BARRIER MW_COMM_NOPS /* requests only: not counted, not traced */

/* What a collective was asked to do (pointers are the caller's; counts has size entries). */
struct mw_comm_args {
    int op;                   /* enum mw_comm_op or MW_COMM_OP_BARRIER */
    enum mw_comm_group group;
    const float *send;        /* reduce-scatter, allgather */
    float *recv;              /* allreduce: the buffer; reduce-scatter / allgather: the result */
    size_t n;                 /* allreduce: elements */
    const size_t *counts;     /* reduce-scatter / allgather: per group rank, elements */
    size_t total;             /* sum(counts) (allreduce: n) */
    int avg;
};

struct mw_comm_req {
    struct mw_comm_req *next; /* in c->inflight */
    int op;
    enum mw_comm_group group;
    int ranks;                /* group size */
    uint64_t payload_bytes, sent_bytes;
    uint64_t start_ns;        /* issue */
    int done, result;         /* done: result is final and the backend state is released */
    void *be;                 /* backend state (MPI requests, phase, scratch) */
};

struct mw_comm {
    struct mw_comm_config cfg;
    int mpi;                              /* MPI backend in use */
    int rank[MW_COMM_NGROUPS], size[MW_COMM_NGROUPS];
    int node, nodes;
    void *be;                             /* MPI backend state */
    struct mw_trace *trace;
    struct mw_comm_stats stats;
    struct mw_comm_req *inflight;         /* not yet completed or not yet collected */
};

/* Single rank (and any group of size 1): performs the collective now. */
void mw_comm_single_run(const struct mw_comm_args *a);

#ifdef MEMWALL_HAVE_MPI
int mw_comm_mpi_init(struct mw_comm *c, int *argc, char ***argv);
/* -EBUSY (no MPI_Finalize) when requests are still in flight. */
int mw_comm_mpi_free(struct mw_comm *c, int inflight);
void mw_comm_mpi_abort(struct mw_comm *c, int code) __attribute__((noreturn));
/* Starts a collective of a group of size >= 2; q->be receives the backend state. */
int mw_comm_mpi_start(struct mw_comm *c, struct mw_comm_req *q, const struct mw_comm_args *a);
/* Advances q; *done = 1 once finished (q->be then released); returns 0 or the error. */
int mw_comm_mpi_poll(struct mw_comm *c, struct mw_comm_req *q, int *done);
#endif

#endif
