/*
 * comm_single.c — the single-rank backend: every group has one rank, and the sum over one rank
 * is the rank's own data, so allreduce leaves the buffer alone and reduce-scatter / allgather
 * copy; every collective completes when it starts.
 * Used without MPI (a build without it, or a process not started by mpirun) and, by comm.c,
 * for the groups of size 1 of a multi-rank job (REPLICA under hierarchy "global"), so that
 * every caller runs the same code path on one rank as on many. It keeps no state (c->be and
 * q->be stay NULL), so it needs neither free nor abort.
 */
#include <errno.h>
#include <string.h>

#include "comm/comm_impl.h"

static int single_init(struct mw_comm *c, int *argc, char ***argv)
{
    (void)argc; (void)argv;
    for (int g = 0; g < MW_COMM_NGROUPS; g++) { c->rank[g] = 0; c->size[g] = 1; }
    c->node = 0;
    c->nodes = 1;
    return 0;
}

static int single_start(struct mw_comm *c, struct mw_comm_req *q, const struct mw_comm_args *a, int *done)
{
    (void)c;
    if (q->ranks != 1) /* comm.c sends only groups of one rank here */
        return mw_error_set(-ENOTSUP, "comm: a group of %d ranks without MPI", q->ranks);
    switch (a->op) {
    case MW_COMM_REDUCE_SCATTER:
    case MW_COMM_ALLGATHER:
        if (a->counts[0] && a->send != a->recv) memmove(a->recv, a->send, a->counts[0] * sizeof(float));
        break;
    default: /* allreduce: sum (and average) over one rank is the identity; barrier: nothing */
        break;
    }
    *done = 1;
    return 0;
}

static int single_poll(struct mw_comm *c, struct mw_comm_req *q, int *done)
{
    (void)c; (void)q; /* not reached: single_start completes every request */
    *done = 1;
    return 0;
}

static const struct mw_comm_iface single_iface = {
    .name = "single",
    .init = single_init,
    .start = single_start,
    .poll = single_poll,
};

const struct mw_comm_iface *mw_comm_single_iface_(void) { return &single_iface; }
