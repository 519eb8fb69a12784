/*
 * comm_impl.h — what the generic layer (comm.c) shares with its backends. A backend fills a
 * struct mw_comm_iface (the shape of mw_buft_iface in memwall/tier.h); comm.c chooses one at
 * mw_comm_init and from then on calls only through it, never asking which one it has:
 *   single  comm_single.c, always built: every group one rank, collectives are copies that
 *           complete when started. It also serves any group of one rank in a multi-rank job
 *           (REPLICA under hierarchy "global"), so one rank runs the same path as many.
 *   mpi     src/mpi/comm_mpi.c, built only when CMake finds MPI.
 * The generic layer validates arguments, keeps the list of requests in flight, counts bytes
 * and writes the trace; a backend only builds the groups, starts a collective and reports
 * when it is done.
 *
 * How comm.c learns whether the MPI table exists, without an #ifdef: it calls
 * mw_comm_mpi_iface_(), defined twice, and CMake compiles exactly one of the two — in
 * src/mpi/comm_mpi.c (returns the table) when MPI is found, in src/comm/comm_nompi.c (returns
 * NULL) otherwise. An ordinary strong reference, unlike a weak symbol: a weak undefined
 * reference does not pull comm_mpi.o out of the static libmemwall.a, so with a weak symbol a
 * program linked against the archive would silently lose MPI; a strong one links the same way
 * with gcc and clang, static and shared.
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

struct mw_comm_iface;

struct mw_comm_req {
    struct mw_comm_req *next; /* in c->inflight */
    const struct mw_comm_iface *iface; /* the backend that started it (polls go there) */
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
    const struct mw_comm_iface *iface;    /* the job's backend, chosen at mw_comm_init */
    int rank[MW_COMM_NGROUPS], size[MW_COMM_NGROUPS];
    int node, nodes;
    void *be;                             /* backend state (the MPI communicators) */
    struct mw_trace *trace;
    struct mw_comm_stats stats;
    struct mw_comm_req *inflight;         /* not yet completed or not yet collected */
};

/*
 * A communication backend. Entries marked (optional) may be NULL, with the stated default.
 * Errors are returned as negative codes with a message (mw_error_set).
 */
struct mw_comm_iface {
    const char *name; /* "single", "mpi" */
    /* Builds the groups: fills c->rank, c->size, c->node, c->nodes and its state in c->be
     * (c->cfg is set). On failure, releases what it made and leaves c->be NULL. */
    int (*init)(struct mw_comm *c, int *argc, char ***argv);
    /* (optional) Releases c->be. inflight > 0: requests still in flight, whose buffers the
     * backend may still write (it then returns -EBUSY with its own message and keeps what they
     * use). Default: nothing to release. */
    int (*free)(struct mw_comm *c, int inflight);
    /* (optional) Ends every rank of the job; may return, the caller then exit(code)s.
     * Default: nothing (the caller's exit ends this one rank, the whole job). */
    void (*abort)(struct mw_comm *c, int code);
    /* Starts the collective a over q->group (arguments checked, q->op/group/ranks set).
     * Either completes it now (*done = 1) or keeps its state in q->be for poll (*done stays 0).
     * On failure q->be stays NULL. */
    int (*start)(struct mw_comm *c, struct mw_comm_req *q, const struct mw_comm_args *a, int *done);
    /* Advances q (not done); *done = 1 once finished (q->be then released); returns 0 or the
     * error (q is then finished too). Must not block. */
    int (*poll)(struct mw_comm *c, struct mw_comm_req *q, int *done);
};

/* The single-rank table (comm_single.c). */
const struct mw_comm_iface *mw_comm_single_iface_(void);
/* The MPI table (src/mpi/comm_mpi.c), or NULL when memwall was built without MPI
 * (comm_nompi.c). */
const struct mw_comm_iface *mw_comm_mpi_iface_(void);

#endif
