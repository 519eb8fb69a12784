/*
 * analyze_comm.c — communication beside I/O: per collective operation (allreduce,
 * reduce_scatter, allgather) the calls, payload and sent bytes, busy time and achieved
 * bandwidth; the exposed comm wait; per step the bytes sent and the wait; the series the I/O
 * timeline draws as comm lanes.
 *
 * Why these definitions: a collective's span runs from issue to the poll that saw it finish,
 * so spans of bucketed collectives overlap; their union is the time the network was busy with
 * that operation (summing durations would count the overlap twice), and payload / union is
 * the throughput the run got. The time that costs the step is only the "wait" spans: the
 * training thread blocked in mw_comm_wait. A wait names no operation, only bytes and ranks; it
 * is attributed to the collective of the same bytes and ranks that completed during it (its
 * span ends at the poll that ended the wait), else counted as unattributed.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int rp_comm_wait_ivls(const struct rp_trace *t, struct rp_ivls *out)
{
    for (size_t i = 0; i < t->ncomm; i++)
        if (t->comm[i].op == RP_COMM_WAIT && rp_ivls_push(out, t->comm[i].t0, t->comm[i].t1)) return -ENOMEM;
    return 0;
}

struct ended { double t1; int64_t bytes; int32_t ranks; int op; };

static int cmp_end(const void *x, const void *y)
{
    double a = ((const struct ended *)x)->t1, b = ((const struct ended *)y)->t1;
    return a < b ? -1 : a > b ? 1 : 0;
}

/* Per-op exposed wait: each wait goes to the collective with its bytes and ranks that ended
 * last within [wait start, wait end] (1 ns of slack for the trace's rounding to ns). */
static int attribute_waits(struct mw_report *r, const struct rp_trace *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->ncomm; i++) n += t->comm[i].op != RP_COMM_WAIT;
    struct ended *e = malloc(MW_MAX(n, 1) * sizeof *e);
    if (!e) return -ENOMEM;
    n = 0;
    for (size_t i = 0; i < t->ncomm; i++) {
        const struct rp_comm *c = &t->comm[i];
        if (c->op != RP_COMM_WAIT) e[n++] = (struct ended){c->t1, c->bytes, c->ranks, c->op};
    }
    qsort(e, n, sizeof *e, cmp_end);
    const double slack = 1e-9;
    for (size_t i = 0; i < t->ncomm; i++) {
        const struct rp_comm *w = &t->comm[i];
        if (w->op != RP_COMM_WAIT) continue;
        size_t lo = 0, hi = n; /* first collective ending after w->t1 + slack */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (e[mid].t1 <= w->t1 + slack) lo = mid + 1;
            else hi = mid;
        }
        int op = -1;
        for (size_t k = lo; k-- > 0;) {
            if (e[k].t1 < w->t0 - slack) break;
            if (e[k].bytes == w->bytes && e[k].ranks == w->ranks) { op = e[k].op; break; }
        }
        if (op >= 0) r->comm[op].wait_s += w->t1 - w->t0;
        else r->comm_wait_unattributed_s += w->t1 - w->t0;
    }
    free(e);
    return 0;
}

static int bin_of(const struct mw_report *r, double t)
{
    double b = (t - r->t0_s) / r->bin_s;
    if (!(b >= 0)) return 0;
    return b >= r->nbins ? r->nbins - 1 : (int)b;
}

/* Adds the time of [a, b) falling in each bin to series[bin] (seconds). */
static void spread(const struct mw_report *r, double *series, double a, double b)
{
    if (!(b > a)) return;
    for (int k = bin_of(r, a), e = bin_of(r, b); k <= e; k++) {
        double x0 = MW_MAX(a, r->t0_s + k * r->bin_s), x1 = k == e ? b : MW_MIN(b, r->t0_s + (k + 1) * r->bin_s);
        if (x1 > x0) series[k] += x1 - x0;
    }
}

int rp_analyze_comm(struct mw_report *r, const struct rp_trace *t, const struct rp_ivls *C)
{
    struct rp_ivls busy[MW_REPORT_COMM_NOPS] = {{0}}, all = {0}, Wc = {0}, ov = {0};
    int rc = -ENOMEM;
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++)
        if (!(r->comm[op].inflight = calloc((size_t)r->nbins, sizeof(double)))) goto out;
    if (!(r->comm_wait_bins = calloc((size_t)r->nbins, sizeof(double)))) goto out;
    r->comm_overlap = NAN;
    if (!t->ncomm) { rc = 0; goto out; }
    r->has_comm = 1;
    for (size_t i = 0; i < t->ncomm; i++) {
        const struct rp_comm *c = &t->comm[i];
        if (c->op == RP_COMM_WAIT) {
            spread(r, r->comm_wait_bins, c->t0, c->t1);
            continue;
        }
        struct mw_report_comm *o = &r->comm[c->op];
        o->calls++;
        o->payload_bytes += c->bytes > 0 ? (uint64_t)c->bytes : 0;
        o->sent_bytes += c->sent > 0 ? (uint64_t)c->sent : 0;
        o->max_ranks = MW_MAX(o->max_ranks, c->ranks);
        spread(r, o->inflight, c->t0, c->t1);
        if (rp_ivls_push(&busy[c->op], c->t0, c->t1) || rp_ivls_push(&all, c->t0, c->t1)) goto out;
    }
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) {
        struct mw_report_comm *o = &r->comm[op];
        rp_ivls_normalize(&busy[op]);
        o->busy_s = rp_ivls_total(&busy[op]);
        o->achieved_bw = o->busy_s > 0 ? (double)o->payload_bytes / o->busy_s : 0;
        r->comm_payload_bytes += o->payload_bytes;
        r->comm_sent_bytes += o->sent_bytes;
    }
    for (int b = 0; b < r->nbins; b++) {
        r->comm_wait_bins[b] /= r->bin_s;
        for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) r->comm[op].inflight[b] /= r->bin_s;
    }
    rp_ivls_normalize(&all);
    if (rp_comm_wait_ivls(t, &Wc) || rp_ivls_intersect(&all, C, &ov)) goto out;
    rp_ivls_normalize(&Wc);
    r->comm_busy_s = rp_ivls_total(&all);
    r->comm_wait_s = rp_ivls_total(&Wc);
    r->comm_overlap_s = rp_ivls_total(&ov);
    r->comm_overlap = r->comm_busy_s > 0 ? r->comm_overlap_s / r->comm_busy_s : NAN;
    if (attribute_waits(r, t)) goto out;

    /* Per step: bytes sent by the collectives issued inside it (comm is sorted by issue time),
     * and the exposed wait inside it. Steps are in time order. */
    size_t ci = 0, cw = 0;
    for (int k = 0; k < r->nsteps; k++) {
        struct mw_report_step *st = &r->steps[k];
        double a = st->start_s, b = st->start_s + st->wall_s;
        while (ci > 0 && t->comm[ci - 1].t0 >= a) ci--;
        while (ci < t->ncomm && t->comm[ci].t0 < a) ci++;
        for (size_t j = ci; j < t->ncomm && t->comm[j].t0 < b; j++)
            if (t->comm[j].op != RP_COMM_WAIT && t->comm[j].sent > 0) st->comm_sent_bytes += (uint64_t)t->comm[j].sent;
        st->comm_wait_s = rp_ivls_measure_in(&Wc, a, b, &cw);
    }
    rc = 0;
out:
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) rp_ivls_free(&busy[op]);
    rp_ivls_free(&all); rp_ivls_free(&Wc); rp_ivls_free(&ov);
    return rc;
}
