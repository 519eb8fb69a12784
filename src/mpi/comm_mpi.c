/*
 * comm_mpi.c — the MPI backend of memwall/comm.h (built only when CMake finds MPI): fills the
 * struct mw_comm_iface of comm_impl.h and hands it to comm.c through mw_comm_mpi_iface_()
 * (a build without MPI compiles src/comm/comm_nompi.c instead, whose answer is NULL). The only
 * file that includes mpi.h; nothing else in memwall tests MEMWALL_HAVE_MPI.
 *
 * Groups: WORLD is a dup of MPI_COMM_WORLD; NODE comes from MPI_Comm_split_type(SHARED) (or
 * rank / ranks_per_node for tests); CROSS splits WORLD by node-local rank; SHARD and REPLICA
 * are dups of WORLD/NODE and SELF/CROSS by hierarchy. Every communicator returns errors
 * (MPI_ERRORS_RETURN) rather than aborting inside MPI, so failures reach the caller with a
 * message.
 *
 * Deterministic sums (see comm.h): an MPI_Ialltoallv hands every rank the N copies of the
 * block it owns; once it completes, the owner adds them in rank order (phase 1) and, for an
 * allreduce, an MPI_Iallgatherv shares the sums (phase 2). Each poll advances one phase.
 * A rank's own block never travels: the sum reads it where it is. Scratch buffers for the
 * received blocks are kept in a small pool (MW_SCRATCH_POOL, the largest kept): a fresh
 * malloc of hundreds of MiB per bucket would cost page faults on every call.
 *
 * Ordering: MPI matches collectives on a communicator by the order they are called, which
 * must be the same on every rank. Phase-1 calls happen in program order; phase-2 calls happen
 * whenever a rank notices its phase 1 is done, which differs between ranks. So phase 2 runs
 * on its own duplicate communicator (comm2) and starts strictly in issue order (seq numbers
 * per group): a request whose phase 1 finished waits for the earlier ones to start theirs.
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

#define MW_SCRATCH_POOL 32

struct scratch { float *p; size_t cap; /* elements */ };

struct mpi_state {
    struct scratch pool[MW_SCRATCH_POOL]; /* free scratch buffers (p == NULL: empty slot) */
    MPI_Comm comm[MW_COMM_NGROUPS];
    MPI_Comm comm2[MW_COMM_NGROUPS];  /* phase 2 of deterministic allreduces */
    uint64_t p2_issued[MW_COMM_NGROUPS], p2_started[MW_COMM_NGROUPS];
    int we_initialised; /* MPI_Init_thread was ours: MPI_Finalize is too */
};

struct mpi_req {
    MPI_Request r;
    int phase;          /* 1: exchange (or the only call), 2: allgather of the sums */
    int summed;         /* phase 1 done and summed, phase 2 not yet started */
    uint64_t seq;       /* order of phase 2 within the group (det allreduce) */
    enum mw_comm_group group;
    int det;            /* the deterministic two-step path */
    int size, me;
    float *buf;         /* result: allreduce buffer / reduce-scatter recv */
    struct scratch tmp; /* [(size-1) * n_me] blocks from the other ranks (det), group order */
    const float *own;   /* this rank's own block (det) */
    size_t n_me;        /* elements this rank owns (det) / receives */
    size_t own_displ;   /* where this rank's block starts in buf (det allreduce) */
    float scale;        /* 1/size when averaging, else 1 */
    int *cnt, *dsp;     /* [size] block counts and displacements (elements) */
    int *scnt, *rcnt, *rdsp; /* [size] alltoallv sides (nothing to or from itself) */
    MPI_Comm comm;
};

static int mpi_err(int e, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(e, msg, &len);
    return mw_error_set(-EIO, "MPI %s failed: %s", what, msg);
}

#define MPI_TRY(call, what) do { int e_ = (call); if (e_ != MPI_SUCCESS) { rc = mpi_err(e_, what); goto err; } } while (0)

static int prep(MPI_Comm cm, MPI_Comm *dst)
{
    *dst = cm;
    return MPI_Comm_set_errhandler(cm, MPI_ERRORS_RETURN);
}

static int comm_mpi_init(struct mw_comm *c, int *argc, char ***argv)
{
    int rc = 0, flag = 0, *leaders = NULL;
    struct mpi_state *s = calloc(1, sizeof *s);
    if (!s) return mw_error_set(-ENOMEM, "comm: out of memory");
    for (int g = 0; g < MW_COMM_NGROUPS; g++) s->comm[g] = s->comm2[g] = MPI_COMM_NULL;
    c->be = s;
    MPI_Initialized(&flag);
    if (!flag) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            rc = mw_error_set(-EIO, "MPI_Init_thread failed");
            goto err;
        }
        s->we_initialised = 1;
        if (provided < MPI_THREAD_FUNNELED)
            mw_log(MW_LOG_WARN, "MPI provides thread level %d < FUNNELED; memwall calls MPI from one thread only",
                   provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm w, tmp;
    MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &w), "Comm_dup");
    MPI_TRY(prep(w, &s->comm[MW_COMM_WORLD]), "set_errhandler");
    int wr, ws;
    MPI_Comm_rank(w, &wr);
    MPI_Comm_size(w, &ws);
    if (c->cfg.ranks_per_node > 0)
        MPI_TRY(MPI_Comm_split(w, wr / c->cfg.ranks_per_node, wr, &tmp), "Comm_split (node)");
    else
        MPI_TRY(MPI_Comm_split_type(w, MPI_COMM_TYPE_SHARED, wr, MPI_INFO_NULL, &tmp), "Comm_split_type");
    MPI_TRY(prep(tmp, &s->comm[MW_COMM_NODE]), "set_errhandler");
    int lr, ls;
    MPI_Comm_rank(tmp, &lr);
    MPI_Comm_size(tmp, &ls);
    MPI_TRY(MPI_Comm_split(w, lr, wr, &tmp), "Comm_split (cross)");
    MPI_TRY(prep(tmp, &s->comm[MW_COMM_CROSS]), "set_errhandler");

    /* Node index: nodes numbered by their lowest world rank. */
    int leader = wr;
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_MIN, s->comm[MW_COMM_NODE]), "Allreduce");
    leaders = malloc((size_t)ws * sizeof *leaders);
    if (!leaders) { rc = mw_error_set(-ENOMEM, "comm: out of memory"); goto err; }
    MPI_TRY(MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, w), "Allgather");
    c->node = 0;
    c->nodes = 0;
    for (int r = 0; r < ws; r++)
        if (leaders[r] == r) { c->nodes++; if (r < leader) c->node++; }
    int mm[2] = {-ls, ls};
    MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, mm, 2, MPI_INT, MPI_MAX, w), "Allreduce");
    if (c->cfg.hierarchy == MW_COMM_HIER_NODE && -mm[0] != mm[1]) {
        rc = mw_error_set(-EINVAL, "the ZeRO hierarchy (hierarchy) node needs the same number of ranks on "
                          "every node (between %d and %d here); use global", -mm[0], mm[1]);
        goto err;
    }
    int node = c->cfg.hierarchy == MW_COMM_HIER_NODE;
    MPI_TRY(MPI_Comm_dup(node ? s->comm[MW_COMM_NODE] : w, &tmp), "Comm_dup");
    MPI_TRY(prep(tmp, &s->comm[MW_COMM_SHARD]), "set_errhandler");
    MPI_TRY(MPI_Comm_dup(node ? s->comm[MW_COMM_CROSS] : MPI_COMM_SELF, &tmp), "Comm_dup");
    MPI_TRY(prep(tmp, &s->comm[MW_COMM_REPLICA]), "set_errhandler");
    for (int g = 0; g < MW_COMM_NGROUPS; g++) {
        MPI_TRY(MPI_Comm_dup(s->comm[g], &tmp), "Comm_dup");
        MPI_TRY(prep(tmp, &s->comm2[g]), "set_errhandler");
        MPI_Comm_rank(s->comm[g], &c->rank[g]);
        MPI_Comm_size(s->comm[g], &c->size[g]);
    }
    free(leaders);
    return 0;
err:
    free(leaders);
    for (int g = 0; g < MW_COMM_NGROUPS; g++)
        for (int k = 0; k < 2; k++) {
            MPI_Comm *cm = k ? &s->comm2[g] : &s->comm[g];
            if (*cm != MPI_COMM_NULL) MPI_Comm_free(cm);
        }
    if (s->we_initialised) MPI_Finalize();
    free(s);
    c->be = NULL;
    return rc;
}

static int comm_mpi_free(struct mw_comm *c, int inflight)
{
    struct mpi_state *s = c->be;
    if (!s) return 0;
    if (inflight) /* MPI may still use the buffers: neither free the communicators nor finalise */
        return mw_error_set(-EBUSY, "comm: %d collective(s) still in flight at shutdown (MPI not finalised)",
                            inflight);
    for (int g = 0; g < MW_COMM_NGROUPS; g++)
        for (int k = 0; k < 2; k++) {
            MPI_Comm *cm = k ? &s->comm2[g] : &s->comm[g];
            if (*cm != MPI_COMM_NULL) MPI_Comm_free(cm);
        }
    for (int i = 0; i < MW_SCRATCH_POOL; i++) free(s->pool[i].p);
    int rc = 0;
    if (s->we_initialised && MPI_Finalize() != MPI_SUCCESS) rc = mw_error_set(-EIO, "MPI_Finalize failed");
    free(s);
    c->be = NULL;
    return rc;
}

static void comm_mpi_abort(struct mw_comm *c, int code)
{
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code); /* not reached */
}

static struct scratch scratch_get(struct mpi_state *s, size_t n)
{
    int best = -1;
    for (int i = 0; i < MW_SCRATCH_POOL; i++)
        if (s->pool[i].p && s->pool[i].cap >= n && (best < 0 || s->pool[i].cap < s->pool[best].cap)) best = i;
    if (best >= 0) {
        struct scratch t = s->pool[best];
        s->pool[best].p = NULL;
        return t;
    }
    struct scratch t = {malloc(n * sizeof(float)), n};
    return t;
}

static void scratch_put(struct mpi_state *s, struct scratch t)
{
    if (!t.p) return;
    int slot = -1;
    for (int i = 0; i < MW_SCRATCH_POOL; i++) {
        if (!s->pool[i].p) { slot = i; break; }
        if (slot < 0 || s->pool[i].cap < s->pool[slot].cap) slot = i; /* else evict the smallest */
    }
    if (s->pool[slot].p && s->pool[slot].cap >= t.cap) { free(t.p); return; }
    free(s->pool[slot].p);
    s->pool[slot] = t;
}

static void req_free(struct mpi_state *s, struct mpi_req *m)
{
    if (!m) return;
    scratch_put(s, m->tmp);
    free(m->cnt);
    free(m);
}

static int to_int(size_t v, const char *what, int *out)
{
    if (v > INT_MAX)
        return mw_error_set(-EOVERFLOW, "comm %s: %zu elements exceed MPI's int counts; use smaller buckets",
                            what, v);
    *out = (int)v;
    return 0;
}

/* Owner's sum of the N copies of its block, in group-rank order ((x0 + x1) + x2) ..., times
 * scale, into dst[n_me]. Chunked so the partial sums stay in L1; dst may be m->own (in place:
 * each chunk is read before it is written). */
static void ordered_sum(const struct mpi_req *m, float *dst)
{
    enum { CH = 2048 };
    float acc[CH];
    const size_t n = m->n_me;
    for (size_t at = 0; at < n; at += CH) {
        const size_t k = MW_MIN((size_t)CH, n - at);
        for (int j = 0; j < m->size; j++) {
            const float *b = j == m->me ? m->own + at : m->tmp.p + (size_t)(j < m->me ? j : j - 1) * n + at;
            if (j == 0) memcpy(acc, b, k * sizeof(float));
            else for (size_t i = 0; i < k; i++) acc[i] += b[i];
        }
        if (m->scale != 1.0f)
            for (size_t i = 0; i < k; i++) acc[i] *= m->scale;
        memcpy(dst + at, acc, k * sizeof(float));
    }
}

static int comm_mpi_start(struct mw_comm *c, struct mw_comm_req *q, const struct mw_comm_args *a, int *done)
{
    (void)done; /* completes in comm_mpi_poll, never at once */
    struct mpi_state *s = c->be;
    const int size = c->size[a->group], me = c->rank[a->group];
    const char *what = a->op < MW_COMM_NOPS ? mw_comm_op_name((enum mw_comm_op)a->op) : "barrier";
    int rc = 0, tmp;
    struct mpi_req *m = calloc(1, sizeof *m);
    if (!m) return mw_error_set(-ENOMEM, "comm: out of memory");
    m->comm = s->comm[a->group];
    m->group = a->group;
    m->size = size;
    m->me = me;
    m->phase = 1;
    m->scale = a->avg ? (float)(1.0 / size) : 1.0f;
    m->det = c->cfg.deterministic && (a->op == MW_COMM_ALLREDUCE || a->op == MW_COMM_REDUCE_SCATTER);
    m->cnt = calloc((size_t)size * 5, sizeof(int));
    if (!m->cnt) { rc = mw_error_set(-ENOMEM, "comm: out of memory"); goto err; }
    m->dsp = m->cnt + size;
    m->scnt = m->dsp + size;
    m->rcnt = m->scnt + size;
    m->rdsp = m->rcnt + size;
    if ((rc = to_int(a->total, what, &tmp))) goto err; /* displacements must fit too */

    /* Blocks: reduce-scatter / allgather take the caller's; allreduce splits n evenly. */
    size_t at = 0;
    for (int r = 0; r < size; r++) {
        size_t k = a->op == MW_COMM_ALLREDUCE ? a->n * (size_t)(r + 1) / (size_t)size - a->n * (size_t)r / (size_t)size
                 : a->op == MW_COMM_OP_BARRIER ? 0 : a->counts[r];
        m->cnt[r] = (int)k;
        m->dsp[r] = (int)at;
        at += k;
    }
    m->n_me = (size_t)m->cnt[me];
    m->own_displ = (size_t)m->dsp[me];
    m->buf = a->recv;

    int e = MPI_SUCCESS;
    if (a->op == MW_COMM_OP_BARRIER) {
        e = MPI_Ibarrier(m->comm, &m->r);
    } else if (m->det) {
        if (m->n_me) {
            const size_t need = m->n_me * (size_t)(size - 1);
            if ((rc = to_int(need, what, &tmp))) goto err;
            m->tmp = scratch_get(s, need);
            if (!m->tmp.p) { rc = mw_error_set(-ENOMEM, "comm %s: out of memory (%zu elements)", what, need); goto err; }
        }
        for (int r = 0; r < size; r++) {
            int slot = r < me ? r : r - 1;
            m->scnt[r] = r == me ? 0 : m->cnt[r];
            m->rcnt[r] = r == me ? 0 : (int)m->n_me;
            m->rdsp[r] = r == me ? 0 : slot * (int)m->n_me;
        }
        const float *src = a->op == MW_COMM_ALLREDUCE ? a->recv : a->send;
        m->own = src + m->own_displ;
        e = MPI_Ialltoallv(src, m->scnt, m->dsp, MPI_FLOAT, m->tmp.p, m->rcnt, m->rdsp, MPI_FLOAT, m->comm, &m->r);
    } else if (a->op == MW_COMM_ALLREDUCE) {
        e = MPI_Iallreduce(MPI_IN_PLACE, a->recv, (int)a->n, MPI_FLOAT, MPI_SUM, m->comm, &m->r);
        m->n_me = a->n;
    } else if (a->op == MW_COMM_REDUCE_SCATTER) {
        e = MPI_Ireduce_scatter(a->send, a->recv, m->cnt, MPI_FLOAT, MPI_SUM, m->comm, &m->r);
    } else { /* allgather */
        const void *src = a->send == a->recv + m->own_displ ? MPI_IN_PLACE : (const void *)a->send;
        e = MPI_Iallgatherv(src, m->cnt[me], MPI_FLOAT, a->recv, m->cnt, m->dsp, MPI_FLOAT, m->comm, &m->r);
        m->scale = 1.0f;
    }
    if (e != MPI_SUCCESS) { rc = mpi_err(e, what); goto err; }
    if (m->det && a->op == MW_COMM_ALLREDUCE) m->seq = s->p2_issued[a->group]++;
    q->be = m;
    return 0;
err:
    req_free(s, m);
    return rc;
}

static int comm_mpi_poll(struct mw_comm *c, struct mw_comm_req *q, int *done)
{
    struct mpi_state *s = c->be;
    struct mpi_req *m = q->be;
    int flag = 0, rc = 0, e;
    *done = 0;
    if (!m->summed) {
        e = MPI_Test(&m->r, &flag, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) {
            rc = mpi_err(e, q->op < MW_COMM_NOPS ? mw_comm_op_name((enum mw_comm_op)q->op) : "barrier");
            goto finish;
        }
        if (!flag) return 0;
        if (m->det && m->phase == 1) {
            if (q->op == MW_COMM_ALLREDUCE) {
                ordered_sum(m, m->buf + m->own_displ);
                m->summed = 1;
            } else {
                ordered_sum(m, m->buf);
                goto finish;
            }
        } else {
            if (!m->det && m->scale != 1.0f)
                for (size_t i = 0; i < m->n_me; i++) m->buf[i] *= m->scale;
            goto finish;
        }
    }
    /* Deterministic allreduce, sums ready: share them once every earlier one has started. */
    if (s->p2_started[m->group] != m->seq) return 0;
    s->p2_started[m->group]++;
    m->summed = 0;
    m->phase = 2;
    e = MPI_Iallgatherv(MPI_IN_PLACE, m->cnt[m->me], MPI_FLOAT, m->buf, m->cnt, m->dsp, MPI_FLOAT,
                        s->comm2[m->group], &m->r);
    if (e != MPI_SUCCESS) { rc = mpi_err(e, "allreduce (allgather phase)"); goto finish; }
    return 0;
finish:
    req_free(s, m);
    q->be = NULL;
    *done = 1;
    return rc;
}

static const struct mw_comm_iface mpi_iface = {
    .name = "mpi",
    .init = comm_mpi_init,
    .free = comm_mpi_free,
    .abort = comm_mpi_abort,
    .start = comm_mpi_start,
    .poll = comm_mpi_poll,
};

const struct mw_comm_iface *mw_comm_mpi_iface_(void) { return &mpi_iface; }
