/*
 * comm_single.c — the collectives of a group of one rank: the sum over one rank is the
 * rank's own data, so allreduce leaves the buffer alone and reduce-scatter / allgather copy.
 * Used without MPI (a build without it, or a process not started by mpirun) and for the
 * groups of size 1 of an MPI run (REPLICA under hierarchy "global"), so that every caller
 * runs the same code path on one rank as on many.
 */
#include <string.h>

#include "comm/comm_impl.h"

void mw_comm_single_run(const struct mw_comm_args *a)
{
    switch (a->op) {
    case MW_COMM_REDUCE_SCATTER:
    case MW_COMM_ALLGATHER:
        if (a->counts[0] && a->send != a->recv) memmove(a->recv, a->send, a->counts[0] * sizeof(float));
        break;
    default: /* allreduce: sum (and average) over one rank is the identity; barrier: nothing */
        break;
    }
}
