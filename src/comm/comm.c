/*
 * comm.c — the generic half of memwall/comm.h: configuration, groups, the requests in flight,
 * bounded waits, byte counters and trace spans. Backends fill a struct mw_comm_iface
 * (comm_impl.h: comm_single.c, src/mpi/comm_mpi.c) and only build the groups, start
 * collectives and report completion, so accounting and failure handling are the same whichever
 * runs. mw_comm_init picks the table once (MPI when asked for or launched by mpirun and the MPI
 * table exists, else single); every later call goes through c->iface, except that a group of
 * one rank always runs on the single table, and each request polls the table that started it.
 *
 * Requests in flight form a list, oldest first; test, wait and progress advance all of them in
 * that order (a deterministic allreduce's second phase must start in issue order).
 *
 * Waits poll (MPI_Test through the backend) instead of blocking in MPI_Wait: that is what lets
 * a wait give up after cfg.timeout_s with a message when a peer died, instead of hanging. It
 * spins for the first ~1 ms (progress of a collective about to finish), then sleeps 20 us
 * between polls so a waiting rank leaves the core to the others.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "memwall/trace.h"

void mw_comm_config_default(struct mw_comm_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = MW_COMM_AUTO;
    cfg->hierarchy = MW_COMM_HIER_GLOBAL;
    cfg->deterministic = 1;
    cfg->timeout_s = 300;
}

int mw_comm_hierarchy_parse(const char *s, enum mw_comm_hierarchy *out)
{
    if (s && !strcasecmp(s, "global")) { *out = MW_COMM_HIER_GLOBAL; return 0; }
    if (s && !strcasecmp(s, "node")) { *out = MW_COMM_HIER_NODE; return 0; }
    return mw_error_set(-EINVAL, "unknown ZeRO hierarchy '%s' (expected node or global)", s ? s : "");
}

const char *mw_comm_group_name(enum mw_comm_group g)
{
    static const char *n[] = {"world", "node", "cross", "shard", "replica"};
    return (unsigned)g < MW_COMM_NGROUPS ? n[g] : "?";
}

const char *mw_comm_op_name(enum mw_comm_op op)
{
    static const char *n[] = {"allreduce", "reduce_scatter", "allgather", "barrier"};
    return (unsigned)op <= MW_COMM_NOPS ? n[op] : "?";
}

int mw_comm_have_mpi(void) { return mw_comm_mpi_iface_() != NULL; }

int mw_comm_launched(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

int mw_comm_init(struct mw_comm **out, int *argc, char ***argv, const struct mw_comm_config *cfg)
{
    *out = NULL;
    struct mw_comm *c = calloc(1, sizeof *c);
    if (!c) return mw_error_set(-ENOMEM, "comm: out of memory");
    if (cfg) c->cfg = *cfg;
    else mw_comm_config_default(&c->cfg);
    if (c->cfg.timeout_s <= 0) c->cfg.timeout_s = 300;
    c->trace = c->cfg.trace;
    const struct mw_comm_iface *mpi = mw_comm_mpi_iface_(); /* NULL: built without MPI */
    int want_mpi = c->cfg.backend == MW_COMM_MPI || (c->cfg.backend == MW_COMM_AUTO && mw_comm_launched());
    if (want_mpi && !mpi) {
        int autod = c->cfg.backend == MW_COMM_AUTO; /* launched by mpirun, but built without MPI */
        free(c);
        return mw_error_set(-ENOTSUP, "%smemwall was built without MPI (install libopenmpi-dev and rebuild)",
                            autod ? "started by an MPI launcher but " : "");
    }
    c->iface = want_mpi ? mpi : mw_comm_single_iface_();
    int rc = c->iface->init(c, argc, argv);
    if (rc) { free(c); return rc; }
    *out = c;
    return 0;
}

int mw_comm_free(struct mw_comm *c)
{
    if (!c) return 0;
    int inflight = 0;
    for (struct mw_comm_req *q = c->inflight, *nx; q; q = nx) {
        nx = q->next;
        if (!q->done) inflight++; /* the MPI state stays: MPI may still write the buffers */
        else free(q);
    }
    int rc = c->iface->free ? c->iface->free(c, inflight) : 0;
    if (inflight && !rc)
        rc = mw_error_set(-EBUSY, "comm: %d collective(s) still in flight at shutdown", inflight);
    free(c);
    return rc;
}

void mw_comm_abort(struct mw_comm *c, int code)
{
    if (c && c->iface->abort) c->iface->abort(c, code); /* every rank (MPI_Abort) */
    exit(code);
}

int mw_comm_rank(const struct mw_comm *c, enum mw_comm_group g) { return (unsigned)g < MW_COMM_NGROUPS ? c->rank[g] : -1; }
int mw_comm_size(const struct mw_comm *c, enum mw_comm_group g) { return (unsigned)g < MW_COMM_NGROUPS ? c->size[g] : -1; }
int mw_comm_node(const struct mw_comm *c) { return c->node; }
int mw_comm_nodes(const struct mw_comm *c) { return c->nodes; }
int mw_comm_is_mpi(const struct mw_comm *c) { return c->iface == mw_comm_mpi_iface_(); }
void mw_comm_set_trace(struct mw_comm *c, struct mw_trace *tr) { c->trace = tr; }

/* ---------------------------------------------------------------- requests */

/* Bytes this rank sends with ring algorithms (see mw_comm_stats). */
static uint64_t ring_sent(const struct mw_comm_args *a, int me, int size)
{
    if (size < 2) return 0;
    size_t next = (size_t)(me + 1) % (size_t)size;
    if (a->op == MW_COMM_ALLREDUCE) {
        size_t n = a->n, own = n * (size_t)(me + 1) / (size_t)size - n * (size_t)me / (size_t)size;
        size_t nxt = n * (next + 1) / (size_t)size - n * next / (size_t)size;
        return (uint64_t)(2 * n - own - nxt) * sizeof(float);
    }
    if (a->op == MW_COMM_REDUCE_SCATTER) return (uint64_t)(a->total - a->counts[me]) * sizeof(float);
    if (a->op == MW_COMM_ALLGATHER) return (uint64_t)(a->total - a->counts[next]) * sizeof(float);
    return 0;
}

static void req_finish(struct mw_comm *c, struct mw_comm_req *q, int result)
{
    q->done = 1;
    q->result = result;
    if (q->op < MW_COMM_NOPS && c->trace) {
        struct mw_trace_arg args[4] = {
            {"bytes", (int64_t)q->payload_bytes}, {"ranks", q->ranks},
            {"group", q->group}, {"sent", (int64_t)q->sent_bytes}};
        mw_trace_span(c->trace, "comm", mw_comm_op_name((enum mw_comm_op)q->op), q->start_ns,
                      mw_trace_now(c->trace), args, 4);
    }
}

static int start(struct mw_comm *c, struct mw_comm_args *a, struct mw_comm_req **req)
{
    *req = NULL;
    if ((unsigned)a->group >= MW_COMM_NGROUPS)
        return mw_error_set(-EINVAL, "comm: unknown group %d", (int)a->group);
    const int size = c->size[a->group], me = c->rank[a->group];
    if (a->op == MW_COMM_REDUCE_SCATTER || a->op == MW_COMM_ALLGATHER) {
        if (!a->counts) return mw_error_set(-EINVAL, "comm %s: counts missing", mw_comm_op_name(a->op));
        a->total = 0;
        for (int r = 0; r < size; r++) a->total += a->counts[r];
        if (a->total && (!a->recv || !a->send))
            return mw_error_set(-EINVAL, "comm %s: NULL buffer", mw_comm_op_name(a->op));
        if (a->op == MW_COMM_REDUCE_SCATTER && a->total && a->counts[me] &&
            (const float *)a->recv < a->send + a->total && a->send < (const float *)a->recv + a->counts[me])
            return mw_error_set(-EINVAL, "comm reduce_scatter: send and recv overlap");
    } else if (a->op == MW_COMM_ALLREDUCE) {
        if (a->n && !a->recv) return mw_error_set(-EINVAL, "comm allreduce: NULL buffer");
        a->total = a->n;
    }
    struct mw_comm_req *q = calloc(1, sizeof *q);
    if (!q) return mw_error_set(-ENOMEM, "comm: out of memory");
    q->op = a->op;
    q->group = a->group;
    q->ranks = size;
    q->payload_bytes = (uint64_t)a->total * sizeof(float);
    q->sent_bytes = ring_sent(a, me, size);
    q->start_ns = mw_trace_now(c->trace);
    /* A group of one rank needs no peer: the single table serves it whatever the job's. */
    q->iface = size == 1 ? mw_comm_single_iface_() : c->iface;
    int done = 0, rc = q->iface->start(c, q, a, &done);
    if (rc) { free(q); return rc; }
    if (a->op < MW_COMM_NOPS) {
        c->stats.calls[a->op]++;
        c->stats.payload_bytes[a->op] += q->payload_bytes;
        c->stats.sent_bytes[a->op] += q->sent_bytes;
    }
    if (done) req_finish(c, q, 0);
    struct mw_comm_req **tail = &c->inflight; /* oldest first: progress goes in issue order */
    while (*tail) tail = &(*tail)->next;
    *tail = q;
    *req = q;
    return 0;
}

int mw_comm_iallreduce(struct mw_comm *c, enum mw_comm_group g, float *buf, size_t n, int avg,
                       struct mw_comm_req **req)
{
    struct mw_comm_args a = {.op = MW_COMM_ALLREDUCE, .group = g, .recv = buf, .n = n, .avg = avg};
    return start(c, &a, req);
}

int mw_comm_ireduce_scatter(struct mw_comm *c, enum mw_comm_group g, const float *send, float *recv,
                            const size_t *counts, int avg, struct mw_comm_req **req)
{
    struct mw_comm_args a = {.op = MW_COMM_REDUCE_SCATTER, .group = g, .send = send, .recv = recv,
                             .counts = counts, .avg = avg};
    return start(c, &a, req);
}

int mw_comm_iallgather(struct mw_comm *c, enum mw_comm_group g, const float *send, float *recv,
                       const size_t *counts, struct mw_comm_req **req)
{
    struct mw_comm_args a = {.op = MW_COMM_ALLGATHER, .group = g, .send = send, .recv = recv, .counts = counts};
    return start(c, &a, req);
}

/* Advances q once (no-op when done). */
static int poll_one(struct mw_comm *c, struct mw_comm_req *q)
{
    if (q->done) return 0;
    int done = 0, rc = q->iface->poll(c, q, &done);
    if (rc || done) req_finish(c, q, rc);
    return rc;
}

static void unlink_req(struct mw_comm *c, struct mw_comm_req *q)
{
    for (struct mw_comm_req **p = &c->inflight; *p; p = &(*p)->next)
        if (*p == q) { *p = q->next; return; }
}

static int collect(struct mw_comm *c, struct mw_comm_req **req)
{
    struct mw_comm_req *q = *req;
    int rc = q->result;
    unlink_req(c, q);
    free(q);
    *req = NULL;
    return rc;
}

int mw_comm_test(struct mw_comm *c, struct mw_comm_req **req, int *done)
{
    *done = 1;
    if (!*req) return 0;
    (void)mw_comm_progress(c); /* each request's error stays in its own result: collect() returns ours */
    if (!(*req)->done) { *done = 0; return 0; }
    return collect(c, req);
}

int mw_comm_progress(struct mw_comm *c)
{
    int left = 0, err = 0;
    for (struct mw_comm_req *q = c->inflight; q; q = q->next) {
        int rc = poll_one(c, q);
        if (rc && !err) err = rc;
        if (!q->done) left++;
    }
    return err ? err : left;
}

static void pause_poll(uint64_t waited_ns)
{
    if (waited_ns < 1000000) return; /* spin the first millisecond */
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

int mw_comm_wait(struct mw_comm *c, struct mw_comm_req **req)
{
    if (!*req) return 0;
    struct mw_comm_req *q = *req;
    const uint64_t t0 = mw_now_ns(), limit = (uint64_t)(c->cfg.timeout_s * 1e9);
    const uint64_t tr0 = mw_trace_now(c->trace);
    int blocked = 0;
    for (;;) {
        /* Advance every request, oldest first: q may depend on earlier ones (comm_mpi.c). */
        (void)mw_comm_progress(c); /* another request's error stays in its own result */
        if (q->done) break;
        blocked = 1;
        uint64_t waited = mw_now_ns() - t0;
        if (waited > limit) {
            c->stats.wait_ns += waited;
            return mw_error_set(-ETIMEDOUT, "rank %d: %s over %d ranks (%s group) not finished after %.0f s: "
                                "another rank probably died or hangs (the job must be aborted)",
                                c->rank[MW_COMM_WORLD], mw_comm_op_name((enum mw_comm_op)q->op), q->ranks,
                                mw_comm_group_name(q->group), c->cfg.timeout_s);
        }
        pause_poll(waited);
    }
    if (blocked) {
        c->stats.wait_ns += mw_now_ns() - t0;
        if (c->trace && q->op < MW_COMM_NOPS) {
            struct mw_trace_arg args[2] = {{"bytes", (int64_t)q->payload_bytes}, {"ranks", q->ranks}};
            mw_trace_span(c->trace, "comm", "wait", tr0, mw_trace_now(c->trace), args, 2);
        }
    }
    return collect(c, req);
}

int mw_comm_barrier(struct mw_comm *c, enum mw_comm_group g)
{
    struct mw_comm_args a = {.op = MW_COMM_OP_BARRIER, .group = g};
    struct mw_comm_req *q;
    int rc = start(c, &a, &q);
    return rc ? rc : mw_comm_wait(c, &q);
}

void mw_comm_stats_get(const struct mw_comm *c, struct mw_comm_stats *out) { *out = c->stats; }
void mw_comm_stats_reset(struct mw_comm *c) { memset(&c->stats, 0, sizeof c->stats); }

uint64_t mw_comm_stats_sent_total(const struct mw_comm_stats *s)
{
    uint64_t t = 0;
    for (int i = 0; i < MW_COMM_NOPS; i++) t += s->sent_bytes[i];
    return t;
}
