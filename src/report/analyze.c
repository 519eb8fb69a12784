/*
 * analyze.c — from compact trace records to the report's series and tables: the time range,
 * bytes per tier stacked by kind (peak-preserving downsampling), and per tier-pair I/O
 * figures (histogram, busy time, bandwidth and requests in flight over time). The step,
 * subgroup and detail tables are in analyze_steps.c, communication in analyze_comm.c, weight
 * residency and the roofline in analyze_res.c.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int rp_analyze_steps(struct mw_report *r, struct rp_trace *t, const struct mw_report_opts *o);

static int cmp_io(const void *x, const void *y)
{
    const struct rp_io *p = x, *q = y;
    return p->t0 < q->t0 ? -1 : p->t0 > q->t0 ? 1 : 0;
}

static int cmp_mem(const void *x, const void *y)
{
    const struct rp_mem *p = x, *q = y;
    if (p->t != q->t) return p->t < q->t ? -1 : 1;
    return p->seq < q->seq ? -1 : p->seq > q->seq ? 1 : 0;
}

static int cmp_span(const void *x, const void *y)
{
    const struct rp_span *p = x, *q = y;
    return p->t0 < q->t0 ? -1 : p->t0 > q->t0 ? 1 : 0;
}

static int cmp_comm(const void *x, const void *y)
{
    const struct rp_comm *p = x, *q = y;
    return p->t0 < q->t0 ? -1 : p->t0 > q->t0 ? 1 : 0;
}

static int bin_of(const struct mw_report *r, double t)
{
    double b = (t - r->t0_s) / r->bin_s;
    if (!(b >= 0)) return 0;
    return b >= r->nbins ? r->nbins - 1 : (int)b;
}

static void time_range(struct mw_report *r, const struct rp_trace *t)
{
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < t->nio; i++) { lo = MW_MIN(lo, t->io[i].t0); hi = MW_MAX(hi, t->io[i].t1); }
    for (size_t i = 0; i < t->nmem; i++) { lo = MW_MIN(lo, t->mem[i].t); hi = MW_MAX(hi, t->mem[i].t); }
    for (size_t i = 0; i < t->nspan; i++) { lo = MW_MIN(lo, t->span[i].t0); hi = MW_MAX(hi, t->span[i].t1); }
    for (size_t i = 0; i < t->ncomm; i++) { lo = MW_MIN(lo, t->comm[i].t0); hi = MW_MAX(hi, t->comm[i].t1); }
    for (size_t i = 0; i < t->nres; i++) { lo = MW_MIN(lo, t->res[i].t0); hi = MW_MAX(hi, t->res[i].t1); }
    if (!(lo <= hi)) lo = hi = 0;
    if (hi - lo < 1e-6) hi = lo + 1e-6;
    r->t0_s = lo;
    r->t1_s = hi;
    r->bin_s = (hi - lo) / r->nbins;
}

/* Bytes per tier: replay alloc/free and counters in time order. */
static int memory_series(struct mw_report *r, const struct rp_trace *t)
{
    const int K = MW_REPORT_NKINDS, nb = r->nbins;
    int64_t (*kinds)[MW_REPORT_NKINDS] = calloc((size_t)r->ntiers, sizeof *kinds);
    int64_t *counter = calloc((size_t)r->ntiers, sizeof *counter);
    /* Each tier's last state by kind, and their sum over tiers (for peak_kind_bytes). */
    uint64_t (*cur)[MW_REPORT_NKINDS] = calloc((size_t)MW_MAX(1, r->ntiers), sizeof *cur), all[MW_REPORT_NKINDS] = {0};
    uint8_t *filled = calloc((size_t)r->ntiers * (size_t)nb, 1);
    uint64_t *endstate = calloc((size_t)r->ntiers * (size_t)nb * (size_t)K, sizeof *endstate);
    int rc = -ENOMEM;
    if (!kinds || !counter || !filled || !endstate || !cur) goto out;
    for (int i = 0; i < r->ntiers; i++) {
        counter[i] = -1;
        r->tiers[i].by_kind = calloc((size_t)nb * (size_t)K, sizeof(uint64_t));
        r->tiers[i].total = calloc((size_t)nb, sizeof(uint64_t));
        if (!r->tiers[i].by_kind || !r->tiers[i].total) goto out;
    }
    for (size_t e = 0; e < t->nmem; e++) {
        const struct rp_mem *m = &t->mem[e];
        int ti = m->tier;
        struct mw_report_tier *T = &r->tiers[ti];
        if (m->kind >= 0) {
            kinds[ti][m->kind] += m->delta;
            if (kinds[ti][m->kind] < 0) { r->unmatched_frees++; kinds[ti][m->kind] = 0; }
        }
        if (m->has_value) { counter[ti] = (int64_t)m->value; T->has_counter = 1; }
        /* An alloc/free and its separate counter share a timestamp: take the state once both
         * are applied, so the counter's lag never shows as "untracked" bytes. */
        if (e + 1 < t->nmem && t->mem[e + 1].tier == ti && t->mem[e + 1].t == m->t) continue;
        /* The state: tracked kinds, plus "untracked" = counter - tracked when the counter says more. */
        uint64_t st[MW_REPORT_NKINDS], sum = 0;
        for (int k = 0; k < MW_REPORT_KIND_UNTRACKED; k++) { st[k] = (uint64_t)kinds[ti][k]; sum += st[k]; }
        st[MW_REPORT_KIND_UNTRACKED] = counter[ti] > (int64_t)sum ? (uint64_t)counter[ti] - sum : 0;
        uint64_t total = sum + st[MW_REPORT_KIND_UNTRACKED];
        if (total > T->peak_bytes) { T->peak_bytes = total; T->peak_t_s = m->t; }
        for (int k = 0; k < K; k++) {
            T->peak_by_kind[k] = MW_MAX(T->peak_by_kind[k], st[k]);
            all[k] += st[k] - cur[ti][k];
            cur[ti][k] = st[k];
            r->peak_kind_bytes[k] = MW_MAX(r->peak_kind_bytes[k], all[k]);
        }
        T->final_bytes = total;
        int b = bin_of(r, m->t);
        size_t row = (size_t)ti * (size_t)nb + (size_t)b;
        if (!filled[row] || total >= T->total[b]) {
            T->total[b] = total;
            memcpy(&T->by_kind[(size_t)b * K], st, sizeof st);
        }
        filled[row] = 1;
        memcpy(&endstate[row * K], st, sizeof st);
        /* Detail view: every change point inside the detail step. */
        if (r->detail_step >= 0 && m->t >= r->detail_t0_s && m->t <= r->detail_t1_s &&
            r->ndetail_points < RP_DETAIL_MAX_POINTS) {
            struct mw_report_point *p = &r->detail_points[r->ndetail_points++];
            p->t_s = m->t;
            p->tier = ti;
            memcpy(p->by_kind, st, sizeof st);
        }
    }
    /* Empty bins hold the state at the end of the previous bin. */
    for (int ti = 0; ti < r->ntiers; ti++) {
        struct mw_report_tier *T = &r->tiers[ti];
        for (int b = 0; b < nb; b++) {
            size_t row = (size_t)ti * (size_t)nb + (size_t)b;
            if (filled[row] || b == 0) continue;
            memcpy(&T->by_kind[(size_t)b * K], &endstate[(row - 1) * K], (size_t)K * sizeof(uint64_t));
            memcpy(&endstate[row * K], &endstate[(row - 1) * K], (size_t)K * sizeof(uint64_t));
            uint64_t s = 0;
            for (int k = 0; k < K; k++) s += T->by_kind[(size_t)b * K + k];
            T->total[b] = s;
        }
    }
    rc = 0;
out:
    free(kinds); free(counter); free(filled); free(endstate); free(cur);
    return rc;
}

static int hist_bucket(uint64_t bytes)
{
    int b = 0;
    /* bucket b: (2^(b+MIN-1), 2^(b+MIN)]; the first takes everything up to 2^MIN. */
    while (b < MW_REPORT_HIST_BUCKETS - 1 && bytes > (1ull << (b + MW_REPORT_HIST_MIN_LOG2))) b++;
    return b;
}

static int pair_series(struct mw_report *r, const struct rp_trace *t)
{
    const int nb = r->nbins;
    struct rp_ivls *busy = calloc((size_t)r->npairs, sizeof *busy);
    double *qdsum = calloc((size_t)r->npairs, sizeof *qdsum);
    int rc = -ENOMEM;
    if (!busy || !qdsum) goto out;
    for (int p = 0; p < r->npairs; p++) {
        r->pairs[p].bw = calloc((size_t)nb, sizeof(double));
        r->pairs[p].inflight = calloc((size_t)nb, sizeof(double));
        r->pairs[p].bw_busy = calloc((size_t)nb, sizeof(double));
        if (!r->pairs[p].bw || !r->pairs[p].inflight || !r->pairs[p].bw_busy) goto out;
    }
    for (size_t i = 0; i < t->nio; i++) {
        const struct rp_io *io = &t->io[i];
        struct mw_report_pair *P = &r->pairs[io->pair];
        if (!P->requests || io->bytes < P->min_req) P->min_req = io->bytes;
        P->max_req = MW_MAX(P->max_req, io->bytes);
        P->requests++;
        P->bytes += io->bytes;
        qdsum[io->pair] += io->qd;
        int hb = hist_bucket(io->bytes);
        P->hist_count[hb]++;
        P->hist_bytes[hb] += io->bytes;
        if (rp_ivls_push(&busy[io->pair], io->t0, io->t1)) goto out;
        int b0 = bin_of(r, io->t0), b1 = bin_of(r, io->t1);
        double d = io->t1 - io->t0;
        if (d <= 0 || b0 == b1) {
            P->bw[b0] += (double)io->bytes;
            P->inflight[b0] += d;
            continue;
        }
        for (int b = b0; b <= b1; b++) {
            double a = MW_MAX(io->t0, r->t0_s + b * r->bin_s), e = MW_MIN(io->t1, r->t0_s + (b + 1) * r->bin_s);
            if (b == b1) e = io->t1;
            if (e > a) {
                P->bw[b] += (double)io->bytes * (e - a) / d;
                P->inflight[b] += e - a;
            }
        }
    }
    for (int p = 0; p < r->npairs; p++) {
        struct mw_report_pair *P = &r->pairs[p];
        rp_ivls_normalize(&busy[p]);
        P->busy_s = rp_ivls_total(&busy[p]);
        P->mean_bw = P->busy_s > 0 ? (double)P->bytes / P->busy_s : 0;
        P->mean_qd = P->requests ? qdsum[p] / (double)P->requests : 0;
        size_t cur = 0;
        for (int b = 0; b < nb; b++) {
            double busy_b = rp_ivls_measure_in(&busy[p], r->t0_s + b * r->bin_s, r->t0_s + (b + 1) * r->bin_s, &cur);
            P->bw_busy[b] = busy_b > 0 ? P->bw[b] / busy_b : 0;
            P->bw[b] /= r->bin_s;
            P->inflight[b] /= r->bin_s;
            P->peak_bw = MW_MAX(P->peak_bw, P->bw[b]);
        }
    }
    rc = 0;
out:
    if (busy)
        for (int p = 0; p < r->npairs; p++) rp_ivls_free(&busy[p]);
    free(busy);
    free(qdsum);
    return rc;
}

/* The phase covering most of each bin, for shading. */
static int phase_bins(struct mw_report *r, const struct rp_trace *t)
{
    const int nb = r->nbins;
    double *acc = calloc((size_t)nb * MW_PHASE_COUNT, sizeof *acc);
    r->bin_phase = calloc((size_t)nb, 1);
    if (!acc || !r->bin_phase) { free(acc); return -ENOMEM; }
    for (size_t i = 0; i < t->nspan; i++) {
        const struct rp_span *s = &t->span[i];
        if (s->cat != RP_CAT_PHASE) continue;
        int b0 = bin_of(r, s->t0), b1 = bin_of(r, s->t1);
        for (int b = b0; b <= b1; b++) {
            double a = MW_MAX(s->t0, r->t0_s + b * r->bin_s), e = MW_MIN(s->t1, r->t0_s + (b + 1) * r->bin_s);
            if (e > a) acc[(size_t)b * MW_PHASE_COUNT + s->name] += e - a;
        }
    }
    for (int b = 0; b < nb; b++) {
        int best = 0;
        double bv = 0;
        for (int p = 1; p < MW_PHASE_COUNT; p++)
            if (acc[(size_t)b * MW_PHASE_COUNT + p] > bv) { bv = acc[(size_t)b * MW_PHASE_COUNT + p]; best = p; }
        r->bin_phase[b] = (uint8_t)best;
    }
    free(acc);
    return 0;
}

/* Tiers in a stable order: device, host, nvme first, then the rest as seen. */
static int tier_rank(const char *n)
{
    return !strcmp(n, "device") ? 0 : !strcmp(n, "host") ? 1 : !strcmp(n, "nvme") ? 2 : 3;
}

int rp_analyze(struct mw_report *r, struct rp_trace *t, const struct mw_report_opts *o)
{
    r->nbins = o->bins;
    r->n_events = t->n_events;
    r->n_ignored = t->n_ignored;
    r->dropped_events = t->dropped;
    r->rank = t->rank;
    r->world_size = t->world_size;
    r->zero_stage = t->zero_stage;
    r->has_resident = t->has_resident;
    r->resident_peak_bytes = (uint64_t)t->resident_peak;
    r->resident_final_bytes = (uint64_t)t->resident_final;
    if (t->ncomm) qsort(t->comm, t->ncomm, sizeof *t->comm, cmp_comm);
    if (t->nio) qsort(t->io, t->nio, sizeof *t->io, cmp_io);
    if (t->nmem) qsort(t->mem, t->nmem, sizeof *t->mem, cmp_mem);
    /* Derived steps/decisions (load.c) only stand in when the trace has no real ones. */
    int real[4] = {0};
    for (size_t i = 0; i < t->nspan; i++) real[t->span[i].cat] |= !t->span[i].synth;
    size_t w = 0;
    for (size_t i = 0; i < t->nspan; i++)
        if (!(t->span[i].synth && real[t->span[i].cat])) t->span[w++] = t->span[i];
    t->nspan = w;
    if (t->nspan) qsort(t->span, t->nspan, sizeof *t->span, cmp_span);
    time_range(r, t);
    r->resident_peak_t_s = t->resident_peak_t;

    /* Reorder tiers; remap the records' tier indices. */
    int order[RP_MAX_TIERS], remap[RP_MAX_TIERS], n = 0;
    for (int rank = 0; rank < 4; rank++)
        for (int i = 0; i < t->ntiers; i++)
            if (tier_rank(t->tier_name[i]) == rank) order[n++] = i;
    for (int i = 0; i < n; i++) remap[order[i]] = i;
    r->ntiers = t->ntiers;
    r->tiers = calloc((size_t)MW_MAX(1, r->ntiers), sizeof *r->tiers);
    r->npairs = t->npairs;
    r->pairs = calloc((size_t)MW_MAX(1, r->npairs), sizeof *r->pairs);
    if (!r->tiers || !r->pairs) return -ENOMEM;
    for (int i = 0; i < n; i++) {
        snprintf(r->tiers[i].name, sizeof r->tiers[i].name, "%s", t->tier_name[order[i]]);
        r->tiers[i].budget_bytes = t->tier_budget[order[i]];
    }
    for (size_t i = 0; i < t->nmem; i++) t->mem[i].tier = (int16_t)remap[t->mem[i].tier];
    for (size_t i = 0; i < t->nspan; i++)
        if (t->span[i].tier >= 0) t->span[i].tier = (int16_t)remap[t->span[i].tier];
    for (int p = 0; p < t->npairs; p++) {
        snprintf(r->pairs[p].from, sizeof r->pairs[p].from, "%s", t->tier_name[t->pair_from[p]]);
        snprintf(r->pairs[p].to, sizeof r->pairs[p].to, "%s", t->tier_name[t->pair_to[p]]);
        r->pairs[p].limit_bw = t->pair_limit[p];
    }

    int rc = rp_analyze_steps(r, t, o); /* also fixes the detail window used below */
    if (!rc) rc = rp_analyze_residency(r, t, o); /* after the steps: the roofline uses them */
    if (!rc) rc = rp_analyze_cost(r, t);
    if (!rc) rc = memory_series(r, t);
    if (!rc) rc = pair_series(r, t);
    if (!rc) rc = phase_bins(r, t);
    r->phases_resolved = !r->nsteps || r->bin_s * 10 <= r->step_wall_median_s;
    return rc;
}
