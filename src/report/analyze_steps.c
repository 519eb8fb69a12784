/*
 * analyze_steps.c — the per-step table, the whole-run time budget, the per-subgroup table and
 * the one-step detail view. The definitions (docs/report.md) as set algebra on intervals:
 *   C  (compute)  = ∪ phase spans forward|backward|update  \  (W ∪ Wc)
 *   W  (exposed I/O wait) = ∪ (the update thread's offload "wait" spans ∩ update phases; all of
 *        them in a trace without phases) ∪ the caller's offload "wait" spans ∪ residency "wait"
 *   Wc (exposed comm wait) = ∪ comm "wait" spans (analyze_comm.c)
 *   IO (I/O busy) = ∪ cat "io" request intervals, all tier pairs
 *   overlap fraction = |IO ∩ C| / |IO|
 * each measured inside a step's [start, end) for the table, and over the whole trace.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b ? 1 : 0;
}

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return a < b ? -1 : a > b ? 1 : 0;
}

static int is_compute(const struct rp_span *s)
{
    return s->cat == RP_CAT_PHASE &&
           (s->name == MW_PHASE_FORWARD || s->name == MW_PHASE_BACKWARD || s->name == MW_PHASE_UPDATE);
}

static int steps_table(struct mw_report *r, const struct rp_trace *t)
{
    struct rp_ivls raw = {0}, W = {0}, WA = {0}, C = {0}, IO = {0}, OV = {0}, ph[MW_PHASE_COUNT], ow = {0}, owu = {0}, upd = {0};
    memset(ph, 0, sizeof ph);
    double *walls = NULL;
    int rc = -ENOMEM;
    /* The update thread's I/O waits are exposed where the training thread waits for the update:
     * inside the trainer's update phases (an overlapped update's waits during the next forward
     * pass block no one), or everywhere in a trace without the trainer's phases (memwall bench
     * offload, whose offload "step" spans stand for update phases). The training
     * thread's own waits for the update (arg caller = 1) always are. */
    int phases = 0;
    for (size_t i = 0; i < t->nspan; i++) {
        const struct rp_span *s = &t->span[i];
        if (is_compute(s) && rp_ivls_push(&raw, s->t0, s->t1)) goto out;
        if (s->cat == RP_CAT_PHASE && rp_ivls_push(&ph[s->name], s->t0, s->t1)) goto out;
        if (s->cat == RP_CAT_PHASE && s->who != RP_WHO_ENGINE) phases = 1;
        if (s->cat == RP_CAT_PHASE && s->name == MW_PHASE_UPDATE && s->who != RP_WHO_ENGINE &&
            rp_ivls_push(&upd, s->t0, s->t1)) goto out;
        if (s->cat == RP_CAT_OFFLOAD && s->name == RP_OFF_WAIT && s->who == RP_WHO_CALLER &&
            (rp_ivls_push(&W, s->t0, s->t1) || rp_ivls_push(&WA, s->t0, s->t1))) goto out;
        if (s->cat == RP_CAT_OFFLOAD && s->name == RP_OFF_WAIT && s->who != RP_WHO_CALLER && rp_ivls_push(&ow, s->t0, s->t1))
            goto out;
        if (s->cat == RP_CAT_STEP) r->nsteps++;
    }
    rp_ivls_normalize(&ow);
    rp_ivls_normalize(&upd);
    if (phases && rp_ivls_intersect(&ow, &upd, &owu)) goto out;
    for (size_t i = 0; i < (phases ? owu.n : ow.n); i++) {
        const struct rp_ivl *v = phases ? &owu.v[i] : &ow.v[i];
        if (rp_ivls_push(&W, v->a, v->b) || rp_ivls_push(&WA, v->a, v->b)) goto out;
    }
    /* The training thread blocked on a weight unit's fetch is exposed I/O wait too. */
    if (rp_res_wait_ivls(t, &W) || rp_res_wait_ivls(t, &WA)) goto out;
    if (rp_comm_wait_ivls(t, &WA)) goto out; /* blocked on communication is not compute either */
    for (size_t i = 0; i < t->nio; i++)
        if (rp_ivls_push(&IO, t->io[i].t0, t->io[i].t1)) goto out;
    rp_ivls_normalize(&raw);
    rp_ivls_normalize(&W);
    rp_ivls_normalize(&WA);
    rp_ivls_normalize(&IO);
    for (int p = 0; p < MW_PHASE_COUNT; p++) rp_ivls_normalize(&ph[p]);
    if (rp_ivls_subtract(&raw, &WA, &C) || rp_ivls_intersect(&IO, &C, &OV)) goto out;

    r->compute_s = rp_ivls_total(&C);
    r->wait_s = rp_ivls_total(&W);
    r->io_busy_s = rp_ivls_total(&IO);
    r->overlap_s = rp_ivls_total(&OV);
    r->overlap = r->io_busy_s > 0 ? r->overlap_s / r->io_busy_s : NAN;
    for (size_t i = 0; i < t->nio; i++) r->bytes_moved += t->io[i].bytes;

    r->steps = calloc((size_t)MW_MAX(1, r->nsteps), sizeof *r->steps);
    walls = calloc((size_t)MW_MAX(1, r->nsteps), sizeof *walls);
    if (!r->steps || !walls) goto out;
    size_t cC = 0, cW = 0, cWA = 0, cIO = 0, cOV = 0, cph[MW_PHASE_COUNT] = {0}, io_i = 0;
    /* Tier pairs that read from / write to the nvme tier (the roofline's disk traffic). */
    uint8_t from_nvme[RP_MAX_PAIRS] = {0}, to_nvme[RP_MAX_PAIRS] = {0};
    for (int p = 0; p < r->npairs && p < RP_MAX_PAIRS; p++) {
        from_nvme[p] = !strcmp(r->pairs[p].from, "nvme");
        to_nvme[p] = !strcmp(r->pairs[p].to, "nvme");
    }
    int k = 0;
    for (size_t i = 0; i < t->nspan; i++) {
        const struct rp_span *s = &t->span[i];
        if (s->cat != RP_CAT_STEP) continue;
        struct mw_report_step *st = &r->steps[k];
        st->step = s->step >= 0 ? s->step : k;
        st->tokens = s->tokens;
        st->start_s = s->t0;
        st->wall_s = s->t1 - s->t0;
        walls[k] = st->wall_s;
        r->steps_wall_s += st->wall_s;
        for (int p = 1; p < MW_PHASE_COUNT; p++) st->phase_s[p] = rp_ivls_measure_in(&ph[p], s->t0, s->t1, &cph[p]);
        st->compute_s = rp_ivls_measure_in(&C, s->t0, s->t1, &cC);
        st->wait_s = rp_ivls_measure_in(&W, s->t0, s->t1, &cW);
        st->io_busy_s = rp_ivls_measure_in(&IO, s->t0, s->t1, &cIO);
        st->overlap_s = rp_ivls_measure_in(&OV, s->t0, s->t1, &cOV);
        st->overlap = st->io_busy_s > 0 ? st->overlap_s / st->io_busy_s : NAN;
        st->exposed_wait_s = rp_ivls_measure_in(&WA, s->t0, s->t1, &cWA);
        st->roof_compute_s = MW_MAX(0.0, st->wall_s - st->exposed_wait_s);
        st->roof_nvme_s = st->roof_bound_s = st->roof_fraction = NAN; /* rp_analyze_residency */
        /* Requests submitted inside [t0, t1): io is sorted by submit time. */
        while (io_i > 0 && t->io[io_i - 1].t0 >= s->t0) io_i--;
        while (io_i < t->nio && t->io[io_i].t0 < s->t0) io_i++;
        for (size_t j = io_i; j < t->nio && t->io[j].t0 < s->t1; j++) {
            const struct rp_io *io = &t->io[j];
            st->bytes_moved += io->bytes;
            if (from_nvme[io->pair]) st->nvme_read_bytes += io->bytes;
            if (to_nvme[io->pair]) st->nvme_written_bytes += io->bytes;
        }
        k++;
    }
    if (r->nsteps) {
        qsort(walls, (size_t)r->nsteps, sizeof *walls, cmp_double);
        int m = r->nsteps;
        r->step_wall_median_s = m % 2 ? walls[m / 2] : 0.5 * (walls[m / 2 - 1] + walls[m / 2]);
    }
    rc = rp_analyze_comm(r, t, &C);
out:
    rp_ivls_free(&raw); rp_ivls_free(&W); rp_ivls_free(&WA); rp_ivls_free(&C); rp_ivls_free(&IO); rp_ivls_free(&OV);
    rp_ivls_free(&ow); rp_ivls_free(&owu); rp_ivls_free(&upd);
    for (int p = 0; p < MW_PHASE_COUNT; p++) rp_ivls_free(&ph[p]);
    free(walls);
    return rc;
}

static int subgroups_table(struct mw_report *r, const struct rp_trace *t)
{
    size_t n = 0;
    for (size_t i = 0; i < t->nspan; i++)
        n += (t->span[i].cat == RP_CAT_OFFLOAD || t->span[i].cat == RP_CAT_DECISION) && t->span[i].sub >= 0;
    if (!n) return 0;
    int64_t *ids = malloc(n * sizeof *ids);
    if (!ids) return -ENOMEM;
    n = 0;
    for (size_t i = 0; i < t->nspan; i++)
        if ((t->span[i].cat == RP_CAT_OFFLOAD || t->span[i].cat == RP_CAT_DECISION) && t->span[i].sub >= 0)
            ids[n++] = t->span[i].sub;
    qsort(ids, n, sizeof *ids, cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || ids[i] != ids[u - 1]) ids[u++] = ids[i];
    r->subgroups = calloc(u, sizeof *r->subgroups);
    if (!r->subgroups) { free(ids); return -ENOMEM; }
    r->nsubgroups = (int)u;
    for (size_t i = 0; i < u; i++) { r->subgroups[i].id = ids[i]; r->subgroups[i].tier = -1; }
    for (size_t i = 0; i < t->nspan; i++) {
        const struct rp_span *s = &t->span[i];
        if (!((s->cat == RP_CAT_OFFLOAD || s->cat == RP_CAT_DECISION) && s->sub >= 0)) continue;
        int64_t *hit = bsearch(&s->sub, ids, u, sizeof *ids, cmp_i64);
        struct mw_report_subgroup *g = &r->subgroups[hit - ids];
        double d = s->t1 - s->t0;
        if (s->tier >= 0) g->tier = s->tier;
        if (s->cat == RP_CAT_DECISION) {
            g->n_decisions++;
            if (s->name == RP_DEC_CPU) g->n_cpu++;
            else g->n_device++;
            if (s->predicted_ns >= 0) g->predicted_s += (double)s->predicted_ns * 1e-9;
            g->measured_s += s->measured_ns >= 0 ? (double)s->measured_ns * 1e-9 : d;
            continue;
        }
        uint64_t b = s->bytes > 0 ? (uint64_t)s->bytes : 0;
        switch (s->name) {
        case RP_OFF_READ: g->read_s += d; g->bytes_read += b; break;
        case RP_OFF_UPDATE: g->update_s += d; break;
        case RP_OFF_WRITE: g->write_s += d; g->bytes_written += b; break;
        case RP_OFF_WAIT: g->wait_s += d; break;
        default: break;
        }
    }
    /* Tier not given as an arg: read/write traffic means the state lives on nvme, else host. */
    int nvme = -1, host = -1;
    for (int i = 0; i < r->ntiers; i++) {
        if (!strcmp(r->tiers[i].name, "nvme")) nvme = i;
        if (!strcmp(r->tiers[i].name, "host")) host = i;
    }
    for (size_t i = 0; i < u; i++) {
        struct mw_report_subgroup *g = &r->subgroups[i];
        if (g->tier < 0) g->tier = (g->bytes_read || g->bytes_written || g->read_s > 0) ? nvme : host;
    }
    free(ids);
    return 0;
}

/* Detail lanes: 0 phases, 1..5 offload read/update/write/refresh/wait, 6.. I/O per tier pair,
 * then (traces with comm) 6 + npairs + op: allreduce, reduce_scatter, allgather, comm wait. */
static int detail_view(struct mw_report *r, const struct rp_trace *t, const struct mw_report_opts *o)
{
    r->detail_step = -1;
    const struct rp_span *pick = NULL, *last = NULL; /* the asked-for step, else the last one */
    for (size_t i = 0; i < t->nspan; i++) {
        const struct rp_span *s = &t->span[i];
        if (s->cat != RP_CAT_STEP) continue;
        last = s;
        if (o->detail_step >= 0 && s->step == o->detail_step && !pick) pick = s;
    }
    if (!pick) pick = last;
    if (!pick) return 0;
    r->detail_step = pick->step >= 0 ? pick->step : 0;
    r->detail_t0_s = pick->t0;
    r->detail_t1_s = pick->t1;
    r->detail_rects = calloc(RP_DETAIL_MAX_RECTS, sizeof *r->detail_rects);
    r->detail_points = calloc(RP_DETAIL_MAX_POINTS, sizeof *r->detail_points);
    if (!r->detail_rects || !r->detail_points) return -ENOMEM;
    for (size_t i = 0; i < t->nspan; i++) {
        const struct rp_span *s = &t->span[i];
        if (s->t0 > pick->t1) break;
        /* (a span that merely ends where the step starts is not part of it) */
        if (s->t1 < pick->t0 || (s->t1 == pick->t0 && s->t0 < s->t1) ||
            !(s->cat == RP_CAT_PHASE || s->cat == RP_CAT_OFFLOAD)) continue;
        if (r->ndetail_rects >= RP_DETAIL_MAX_RECTS) { r->detail_truncated = 1; break; }
        struct mw_report_rect *q = &r->detail_rects[r->ndetail_rects++];
        q->t0_s = MW_MAX(s->t0, pick->t0);
        q->t1_s = MW_MIN(s->t1, pick->t1);
        q->lane = s->cat == RP_CAT_PHASE ? 0 : 1 + s->name;
        q->kind = s->name;
        q->sub = s->sub;
        q->bytes = s->bytes > 0 ? (uint64_t)s->bytes : 0;
    }
    for (size_t i = 0; i < t->nio; i++) {
        const struct rp_io *io = &t->io[i];
        if (io->t0 > pick->t1) break;
        if (io->t1 < pick->t0 || (io->t1 == pick->t0 && io->t0 < io->t1)) continue;
        if (r->ndetail_rects >= RP_DETAIL_MAX_RECTS) { r->detail_truncated = 1; break; }
        struct mw_report_rect *q = &r->detail_rects[r->ndetail_rects++];
        q->t0_s = MW_MAX(io->t0, pick->t0);
        q->t1_s = MW_MIN(io->t1, pick->t1);
        q->lane = 1 + RP_OFF_COUNT + io->pair;
        q->kind = io->pair;
        q->sub = -1;
        q->bytes = io->bytes;
    }
    for (size_t i = 0; i < t->ncomm; i++) {
        const struct rp_comm *c = &t->comm[i];
        if (c->t0 > pick->t1) break;
        if (c->t1 < pick->t0 || (c->t1 == pick->t0 && c->t0 < c->t1)) continue;
        if (r->ndetail_rects >= RP_DETAIL_MAX_RECTS) { r->detail_truncated = 1; break; }
        struct mw_report_rect *q = &r->detail_rects[r->ndetail_rects++];
        q->t0_s = MW_MAX(c->t0, pick->t0);
        q->t1_s = MW_MIN(c->t1, pick->t1);
        q->lane = 1 + RP_OFF_COUNT + r->npairs + c->op;
        q->kind = c->op;
        q->sub = -1;
        q->bytes = c->bytes > 0 ? (uint64_t)c->bytes : 0;
    }
    return 0;
}

int rp_analyze_steps(struct mw_report *r, struct rp_trace *t, const struct mw_report_opts *o)
{
    int rc = steps_table(r, t);
    if (!rc) rc = subgroups_table(r, t);
    if (!rc) rc = detail_view(r, t, o);
    return rc;
}
