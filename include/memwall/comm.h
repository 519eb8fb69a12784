/*
 * memwall/comm.h — data-parallel communication (MPI) and the ZeRO partitioning math.
 *
 * Why: to train past one machine, ranks shard the training state (ZeRO stages 1-3) and
 * exchange gradients and weights with MPI collectives. This layer keeps MPI out of the rest
 * of memwall: it owns MPI_Init/Finalize, the communicators of the ZeRO hierarchy, and
 * non-blocking fp32 collectives issued per bucket so they overlap the backward pass. Every
 * collective lands in the trace (cat "comm") and in per-rank byte counters.
 *
 * Backends: MPI (Open MPI, launched by mpirun) when memwall was built with MPI
 * (mw_comm_have_mpi(); CMake also defines MEMWALL_HAVE_MPI for code built against the library,
 * memwall itself never tests it) and the process was started by a launcher; otherwise a single
 * rank whose collectives are copies, so that every code path runs the same without MPI. The
 * choice is made once, at mw_comm_init; the two sit behind one internal function table
 * (src/comm/comm_impl.h).
 *
 * Groups (communicators):
 *   WORLD    every rank.
 *   NODE     ranks on the same host (MPI_Comm_split_type SHARED, or cfg.ranks_per_node).
 *   CROSS    ranks with the same node-local rank, one per node.
 *   SHARD    the ranks that split the training state: WORLD (hierarchy "global") or NODE
 *            (hierarchy "node": shard within a node, replicate across nodes, MiCS-style).
 *   REPLICA  the ranks holding the same shard: just this rank (global) or CROSS (node).
 *
 * Determinism (cfg.deterministic, default on): a sum over a group is computed by each
 * block's owner as x_0 + x_1 + ... + x_{n-1} in group-rank order, from blocks exchanged
 * with MPI_Ialltoallv, then (allreduce) shared with MPI_Iallgatherv. So results are the same
 * bit for bit on every rank, from run to run, and whatever algorithm MPI picks; the bytes
 * each rank sends equal a ring reduce-scatter's (+ allgather's). With deterministic = 0 the
 * layer calls MPI_Iallreduce / MPI_Ireduce_scatter (MPI_SUM), whose summation order is the
 * MPI library's choice. Averages multiply the sum by (float)(1.0 / size).
 *
 * Progress and waits: Open MPI advances non-blocking collectives only inside MPI calls, so
 * call mw_comm_progress() now and then while computing (e.g. after each layer's backward).
 * mw_comm_wait() polls with a deadline (cfg.timeout_s): a peer that died or hangs makes it
 * fail with -ETIMEDOUT and a message instead of blocking forever; the caller then calls
 * mw_comm_abort(). Error handler: MPI_ERRORS_RETURN on every communicator.
 *
 * Threads: MPI is initialised MPI_THREAD_FUNNELED; call this layer from the thread that
 * called mw_comm_init only.
 *
 * Units: counts are fp32 elements (size_t); byte counters are bytes; times are ns.
 */
#ifndef MEMWALL_COMM_H
#define MEMWALL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mw_trace;    /* memwall/trace.h */
struct mw_comm;     /* opaque */
struct mw_comm_req; /* one collective in flight; released when it completes */

enum mw_comm_backend { MW_COMM_AUTO = 0, MW_COMM_SINGLE = 1, MW_COMM_MPI = 2 };
enum mw_comm_hierarchy { MW_COMM_HIER_GLOBAL = 0, MW_COMM_HIER_NODE = 1 };
enum mw_comm_group { MW_COMM_WORLD = 0, MW_COMM_NODE, MW_COMM_CROSS, MW_COMM_SHARD, MW_COMM_REPLICA,
                     MW_COMM_NGROUPS };
enum mw_comm_op { MW_COMM_ALLREDUCE = 0, MW_COMM_REDUCE_SCATTER = 1, MW_COMM_ALLGATHER = 2, MW_COMM_NOPS = 3 };

struct mw_comm_config {
    enum mw_comm_backend backend;     /* AUTO: MPI when built with it and started by mpirun */
    enum mw_comm_hierarchy hierarchy; /* what SHARD and REPLICA mean */
    int deterministic;                /* 1: fixed rank-order sums (see above) */
    double timeout_s;                 /* a wait longer than this fails with -ETIMEDOUT */
    int ranks_per_node;               /* 0: real hosts; k > 0: pretend consecutive k ranks share a
                                         host (tests of the hierarchy on one machine) */
    struct mw_trace *trace;           /* optional: spans cat "comm" */
};
/* backend AUTO, hierarchy GLOBAL, deterministic 1, timeout 300 s, ranks_per_node 0, no trace. */
void mw_comm_config_default(struct mw_comm_config *cfg);
/* "node" / "global" -> hierarchy; -EINVAL with a message otherwise. */
int mw_comm_hierarchy_parse(const char *s, enum mw_comm_hierarchy *out);
const char *mw_comm_group_name(enum mw_comm_group g); /* "world", "node", ... */
const char *mw_comm_op_name(enum mw_comm_op op);      /* "allreduce", "reduce_scatter", "allgather" */

/* 1 when memwall was built with MPI. */
int mw_comm_have_mpi(void);
/* 1 when this process looks started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE, ...). */
int mw_comm_launched(void);

/* Initialises MPI (MPI_Init_thread, FUNNELED) for the MPI backend and builds the groups.
 * argc/argv may be NULL. -EINVAL when the hierarchy needs equal ranks per node and they
 * differ, -ENOTSUP when backend MPI is asked for without MPI support. */
int mw_comm_init(struct mw_comm **out, int *argc, char ***argv, const struct mw_comm_config *cfg);
/* Waits for nothing: collectives still in flight are an error (-EBUSY; MPI then stays
 * initialised, as it may still write their buffers). Finalises MPI when this handle
 * initialised it: with several handles (other configurations), free that one last. */
int mw_comm_free(struct mw_comm *c);
/* Ends every rank of the job with `code` (MPI_Abort; exit(code) for a single rank). */
void mw_comm_abort(struct mw_comm *c, int code) __attribute__((noreturn));

int mw_comm_rank(const struct mw_comm *c, enum mw_comm_group g); /* rank in the group */
int mw_comm_size(const struct mw_comm *c, enum mw_comm_group g); /* ranks in the group */
int mw_comm_node(const struct mw_comm *c);   /* index of this rank's host, 0..nodes-1 */
int mw_comm_nodes(const struct mw_comm *c);  /* hosts */
int mw_comm_is_mpi(const struct mw_comm *c);
void mw_comm_set_trace(struct mw_comm *c, struct mw_trace *tr);

/* ---------------------------------------------------------------- collectives (fp32) */

/* buf[n] in place becomes the sum over the group (times 1/size when avg). */
int mw_comm_iallreduce(struct mw_comm *c, enum mw_comm_group g, float *buf, size_t n, int avg,
                       struct mw_comm_req **req);
/* send[sum(counts)] holds one block per group rank, in rank order (counts[size], elements;
 * zeros allowed). Group rank r receives in recv[counts[r]] the sum of block r over the group
 * (times 1/size when avg). send and recv must not overlap. */
int mw_comm_ireduce_scatter(struct mw_comm *c, enum mw_comm_group g, const float *send, float *recv,
                            const size_t *counts, int avg, struct mw_comm_req **req);
/* Group rank r contributes send[counts[r]]; every rank receives all blocks in rank order in
 * recv[sum(counts)]. send == recv + (counts[0] + ... + counts[r-1]) means in place. */
int mw_comm_iallgather(struct mw_comm *c, enum mw_comm_group g, const float *send, float *recv,
                       const size_t *counts, struct mw_comm_req **req);

/* *req done: returns its result, frees it and sets *req = NULL, *done = 1. Not done: 0, *done 0.
 * *req == NULL counts as done. */
int mw_comm_test(struct mw_comm *c, struct mw_comm_req **req, int *done);
/* Waits (polling, bounded by cfg.timeout_s) until *req completes; frees it, *req = NULL.
 * -ETIMEDOUT with a message naming the collective when the deadline passes. */
int mw_comm_wait(struct mw_comm *c, struct mw_comm_req **req);
/* Advances every collective in flight (completes those that are done; their handles stay
 * valid until tested or waited). Returns the number still in flight, or a negative error. */
int mw_comm_progress(struct mw_comm *c);
/* Bounded barrier (Ibarrier + the same deadline). */
int mw_comm_barrier(struct mw_comm *c, enum mw_comm_group g);

/* Per-rank counters since init or the last reset (e.g. one optimizer step). payload: the
 * collective's buffer (allreduce n, reduce-scatter / allgather sum(counts)), x 4 bytes; sent:
 * what this rank sends with a bandwidth-optimal ring algorithm (what the ZeRO paper counts:
 * allreduce 2(N-1)/N x payload). wait_ns: time blocked in mw_comm_wait / barrier. */
struct mw_comm_stats {
    uint64_t calls[MW_COMM_NOPS];
    uint64_t payload_bytes[MW_COMM_NOPS];
    uint64_t sent_bytes[MW_COMM_NOPS];
    uint64_t wait_ns;
};
void mw_comm_stats_get(const struct mw_comm *c, struct mw_comm_stats *out);
void mw_comm_stats_reset(struct mw_comm *c);
uint64_t mw_comm_stats_sent_total(const struct mw_comm_stats *s);

/* ---------------------------------------------------------------- ZeRO partitioning (pure) */

/* The flat parameter space [0, total) is cut into subgroups of sg_size elements (the last may
 * be shorter), as the offload engine cuts it (mw_offload_cut). Each of `ranks` shard ranks
 * owns a contiguous run of whole subgroups: rank r owns subgroups
 * [floor(r*S/ranks), floor((r+1)*S/ranks)) of the S subgroups — balanced to within one
 * subgroup, deterministic, and the later ranks take the short last subgroup. A rank owns no
 * subgroup when S < ranks (choose sg_size <= total / ranks). */
struct mw_zero_shard {
    uint32_t sg_first, sg_count; /* owned subgroups */
    uint64_t first, n;           /* owned elements [first, first + n) */
};
uint32_t mw_zero_subgroups(uint64_t total, uint64_t sg_size);
/* -EINVAL on total 0, sg_size 0, ranks < 1, rank outside [0, ranks). */
int mw_zero_shard(uint64_t total, uint64_t sg_size, int ranks, int rank, struct mw_zero_shard *out);
/* Owning rank of subgroup sg / of element e (-EINVAL when outside). */
int mw_zero_owner_sg(uint64_t total, uint64_t sg_size, int ranks, uint32_t sg);
int mw_zero_owner_elem(uint64_t total, uint64_t sg_size, int ranks, uint64_t e);
/* For a bucket [first, first+n) of the flat space: counts[r] = elements of it rank r owns,
 * displs[r] = where they start relative to first (displs may be NULL). These are the counts
 * of mw_comm_ireduce_scatter / mw_comm_iallgather on that bucket. */
int mw_zero_bucket_counts(uint64_t total, uint64_t sg_size, int ranks, uint64_t first, uint64_t n,
                          size_t *counts, size_t *displs);

/* Bytes ONE rank sends per optimizer step with ring collectives (the ZeRO paper's model):
 *   stage 0  allreduce grads once per step (accumulated locally)           2 Psi (N-1)/N
 *   stage 1  reduce-scatter grads once per step + allgather new weights    2 Psi (N-1)/N
 *   stage 2  reduce-scatter grads every micro-step + allgather weights     (m+1) Psi (N-1)/N
 *   stage 3  per micro-step: allgather weights for forward and backward,
 *            reduce-scatter grads; no weight allgather after the update     3 m Psi (N-1)/N
 * (Psi in bytes: grads x grad_bytes, weights x weight_bytes; m micro-steps; exact per-rank
 * figures from the shard sizes: a ring reduce-scatter sends all blocks but one's own, a ring
 * allgather all but the successor's.) With replicas R > 1 (hierarchy "node": `ranks` is the
 * shard group), each rank also allreduces its owned gradient shard over R replicas once per
 * step (stages 1-3), 2 (R-1)/R x shard bytes; stage 0 then is one allreduce over ranks x R. */
struct mw_zero_volume {
    double allreduce, reduce_scatter, allgather; /* bytes sent within the shard group */
    double replica;                              /* bytes sent across replicas */
    double total;                                /* the sum */
    double psi_factor;                           /* total / (total elements x grad_bytes) */
};
int mw_zero_volume(int stage, uint64_t total, uint64_t sg_size, int ranks, int rank, int replicas,
                   int micro_steps, size_t grad_bytes, size_t weight_bytes, struct mw_zero_volume *out);

#ifdef __cplusplus
}
#endif
#endif
