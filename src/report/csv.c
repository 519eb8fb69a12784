/*
 * csv.c — CSV exports of every series and table, for spreadsheets and notebooks. One file per
 * table, one header row, units in the column names (_bytes, _s, _bytes_per_s); times are
 * seconds since the first event. Series have the report's resolution (--bins points).
 */
#include "report/report_internal.h"
#include "memwall/fsutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* DIR/name, atomically (mw_out, memwall/fsutil.h): a failed export leaves the earlier files whole, none partial. */
static int open_csv(struct mw_out *o, const char *dir, const char *name, char *path, size_t n)
{
    if ((size_t)snprintf(path, n, "%s/%s", dir, name) >= n)
        return mw_error_set(-ENAMETOOLONG, "%s/%s: the path is too long", dir, name);
    return mw_out_open(o, path, "a CSV file");
}

/* A text field, quoted (RFC 4180) when it holds a comma, quote or line break. */
static void csv_str(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) { fputs(s, f); return; }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void num(FILE *f, double v)
{
    if (isnan(v)) fputs(",", f);
    else fprintf(f, ",%.9g", v);
}

static void csv_tiers(FILE *f, const struct mw_report *r)
{
    fprintf(f, "tier,budget_bytes,peak_bytes,peak_t_s,final_bytes");
    for (int k = 0; k < MW_REPORT_NKINDS; k++) fprintf(f, ",peak_%s_bytes", mw_report_kind_name(k));
    fputc('\n', f);
    for (int i = 0; i < r->ntiers; i++) {
        const struct mw_report_tier *T = &r->tiers[i];
        fprintf(f, "%s,%llu,%llu,%.9g,%llu", T->name, (unsigned long long)T->budget_bytes,
                (unsigned long long)T->peak_bytes, T->peak_t_s - r->t0_s, (unsigned long long)T->final_bytes);
        for (int k = 0; k < MW_REPORT_NKINDS; k++) fprintf(f, ",%llu", (unsigned long long)T->peak_by_kind[k]);
        fputc('\n', f);
    }
}

static void csv_memory(FILE *f, const struct mw_report *r)
{
    fprintf(f, "t_s,tier,phase");
    for (int k = 0; k < MW_REPORT_NKINDS; k++) fprintf(f, ",%s_bytes", mw_report_kind_name(k));
    fprintf(f, ",total_bytes\n");
    for (int i = 0; i < r->ntiers; i++) {
        const struct mw_report_tier *T = &r->tiers[i];
        for (int b = 0; b < r->nbins; b++) {
            fprintf(f, "%.9g,%s,%s", b * r->bin_s, T->name, mw_report_phase_name(r->bin_phase[b]));
            for (int k = 0; k < MW_REPORT_NKINDS; k++)
                fprintf(f, ",%llu", (unsigned long long)T->by_kind[(size_t)b * MW_REPORT_NKINDS + k]);
            fprintf(f, ",%llu\n", (unsigned long long)T->total[b]);
        }
    }
}

static void csv_io_pairs(FILE *f, const struct mw_report *r)
{
    fprintf(f, "pair,requests,bytes,min_request_bytes,max_request_bytes,busy_s,achieved_bytes_per_s,"
               "peak_bytes_per_s,limit_bytes_per_s,mean_queue_depth\n");
    for (int p = 0; p < r->npairs; p++) {
        const struct mw_report_pair *P = &r->pairs[p];
        fprintf(f, "%s->%s,%llu,%llu,%llu,%llu", P->from, P->to, (unsigned long long)P->requests,
                (unsigned long long)P->bytes, (unsigned long long)P->min_req, (unsigned long long)P->max_req);
        num(f, P->busy_s); num(f, P->mean_bw); num(f, P->peak_bw); num(f, P->limit_bw); num(f, P->mean_qd);
        fputc('\n', f);
    }
}

static void csv_io_bandwidth(FILE *f, const struct mw_report *r)
{
    fprintf(f, "t_s,pair,bytes_per_s,busy_bytes_per_s,requests_in_flight,limit_bytes_per_s\n");
    for (int p = 0; p < r->npairs; p++)
        for (int b = 0; b < r->nbins; b++) {
            const struct mw_report_pair *P = &r->pairs[p];
            fprintf(f, "%.9g,%s->%s,%.9g,%.9g,%.6g,%.9g\n", b * r->bin_s, P->from, P->to, P->bw[b], P->bw_busy[b],
                    P->inflight[b], P->limit_bw);
        }
}

static void csv_io_sizes(FILE *f, const struct mw_report *r)
{
    fprintf(f, "pair,min_bytes_exclusive,max_bytes,requests,bytes\n");
    for (int p = 0; p < r->npairs; p++)
        for (int h = 0; h < MW_REPORT_HIST_BUCKETS; h++) {
            const struct mw_report_pair *P = &r->pairs[p];
            unsigned long long lo = h ? 1ull << (h + MW_REPORT_HIST_MIN_LOG2 - 1) : 0;
            fprintf(f, "%s->%s,%llu,", P->from, P->to, lo);
            if (h < MW_REPORT_HIST_BUCKETS - 1) fprintf(f, "%llu", 1ull << (h + MW_REPORT_HIST_MIN_LOG2));
            fprintf(f, ",%llu,%llu\n", (unsigned long long)P->hist_count[h], (unsigned long long)P->hist_bytes[h]);
        }
}

static void csv_steps(FILE *f, const struct mw_report *r)
{
    fprintf(f, "step,tokens,start_s,wall_s");
    for (int p = 1; p < MW_PHASE_COUNT; p++) fprintf(f, ",%s_s", mw_report_phase_name(p));
    fprintf(f, ",compute_s,exposed_io_wait_s,io_busy_s,overlap_s,overlap_fraction,bytes_moved,comm_sent_bytes,"
               "exposed_comm_wait_s,nvme_read_bytes,nvme_written_bytes,exposed_wait_s,roofline_compute_s,"
               "roofline_nvme_s,roofline_bound_s,roofline_fraction\n");
    for (int i = 0; i < r->nsteps; i++) {
        const struct mw_report_step *s = &r->steps[i];
        fprintf(f, "%lld,%lld,%.9g,%.9g", (long long)s->step, (long long)s->tokens, s->start_s - r->t0_s, s->wall_s);
        for (int p = 1; p < MW_PHASE_COUNT; p++) num(f, s->phase_s[p]);
        num(f, s->compute_s); num(f, s->wait_s); num(f, s->io_busy_s); num(f, s->overlap_s); num(f, s->overlap);
        fprintf(f, ",%llu,%llu", (unsigned long long)s->bytes_moved, (unsigned long long)s->comm_sent_bytes);
        num(f, s->comm_wait_s);
        /* The roofline: its NVMe, bound and fraction columns are empty when a bandwidth is unknown. */
        fprintf(f, ",%llu,%llu", (unsigned long long)s->nvme_read_bytes, (unsigned long long)s->nvme_written_bytes);
        num(f, s->exposed_wait_s); num(f, s->roof_compute_s); num(f, s->roof_nvme_s); num(f, s->roof_bound_s);
        num(f, s->roof_fraction);
        fputc('\n', f);
    }
}

static void csv_subgroups(FILE *f, const struct mw_report *r)
{
    fprintf(f, "subgroup,tier,updates_cpu,updates_device,decisions,predicted_s,measured_s,bytes_read,"
               "bytes_written,read_s,update_s,write_s,wait_s\n");
    for (int i = 0; i < r->nsubgroups; i++) {
        const struct mw_report_subgroup *g = &r->subgroups[i];
        fprintf(f, "%lld,%s,%lld,%lld,%lld", (long long)g->id, g->tier >= 0 ? r->tiers[g->tier].name : "",
                (long long)g->n_cpu, (long long)g->n_device, (long long)g->n_decisions);
        num(f, g->predicted_s); num(f, g->measured_s);
        fprintf(f, ",%llu,%llu", (unsigned long long)g->bytes_read, (unsigned long long)g->bytes_written);
        num(f, g->read_s); num(f, g->update_s); num(f, g->write_s); num(f, g->wait_s);
        fputc('\n', f);
    }
}

/* The cost model per step and component (analyze_cost.c): what it predicted, what was measured. */
static void csv_cost(FILE *f, const struct mw_report *r)
{
    fprintf(f, "step,component,n,predicted_s,measured_s\n");
    for (int i = 0; i < r->cost.nsteps; i++) {
        const struct mw_report_cost_step *s = &r->cost.steps[i];
        for (int j = 0; j < MW_REPORT_COST_NCOMP; j++) {
            if (!s->n[j]) continue;
            fprintf(f, "%lld,%s,%lld", (long long)s->step, mw_report_cost_name(j), (long long)s->n[j]);
            num(f, s->predicted_s[j]); num(f, s->measured_s[j]);
            fputc('\n', f);
        }
    }
}

/* The one-step detail: every span and request, and each tier's bytes at every change. */
static void csv_detail_spans(FILE *f, const struct mw_report *r)
{
    fprintf(f, "step,lane,name,t0_s,t1_s,subgroup,bytes\n");
    static const char *const off[] = {"read", "update", "write", "refresh", "wait"};
    const int comm_lane = 1 + RP_OFF_COUNT + r->npairs;
    for (int i = 0; i < r->ndetail_rects; i++) {
        const struct mw_report_rect *q = &r->detail_rects[i];
        fprintf(f, "%lld,", (long long)r->detail_step);
        if (q->lane == 0) fprintf(f, "phase,%s", mw_report_phase_name(q->kind));
        else if (q->lane <= RP_OFF_COUNT) fprintf(f, "offload,%s", off[q->lane - 1]);
        else if (q->lane >= comm_lane) fprintf(f, "comm,%s", mw_report_comm_op_name(q->kind));
        else fprintf(f, "io,%s->%s", r->pairs[q->kind].from, r->pairs[q->kind].to);
        fprintf(f, ",%.9g,%.9g,", q->t0_s - r->t0_s, q->t1_s - r->t0_s);
        if (q->sub >= 0) fprintf(f, "%lld", (long long)q->sub);
        fprintf(f, ",%llu\n", (unsigned long long)q->bytes);
    }
}

static void csv_detail_memory(FILE *f, const struct mw_report *r)
{
    fprintf(f, "step,t_s,tier");
    for (int k = 0; k < MW_REPORT_NKINDS; k++) fprintf(f, ",%s_bytes", mw_report_kind_name(k));
    fputc('\n', f);
    for (int i = 0; i < r->ndetail_points; i++) {
        const struct mw_report_point *q = &r->detail_points[i];
        fprintf(f, "%lld,%.9g,%s", (long long)r->detail_step, q->t_s - r->t0_s, r->tiers[q->tier].name);
        for (int k = 0; k < MW_REPORT_NKINDS; k++) fprintf(f, ",%llu", (unsigned long long)q->by_kind[k]);
        fputc('\n', f);
    }
}

/* Communication: one row per operation and a total ("all"; its busy time is the union). */
static void csv_comm(FILE *f, const struct mw_report *r)
{
    fprintf(f, "op,calls,max_ranks,payload_bytes,sent_bytes,busy_s,achieved_bytes_per_s,exposed_wait_s,"
               "exposed_wait_share_of_step_time\n");
    double whole = r->nsteps ? r->steps_wall_s : r->t1_s - r->t0_s;
    uint64_t calls = 0;
    int mr = 0;
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) {
        const struct mw_report_comm *o = &r->comm[op];
        calls += o->calls;
        mr = MW_MAX(mr, o->max_ranks);
        if (!o->calls) continue;
        fprintf(f, "%s,%llu,%d,%llu,%llu", mw_report_comm_op_name(op), (unsigned long long)o->calls, o->max_ranks,
                (unsigned long long)o->payload_bytes, (unsigned long long)o->sent_bytes);
        num(f, o->busy_s); num(f, o->achieved_bw); num(f, o->wait_s); num(f, whole > 0 ? o->wait_s / whole : NAN);
        fputc('\n', f);
    }
    if (r->has_comm) {
        fprintf(f, "all,%llu,%d,%llu,%llu", (unsigned long long)calls, mr, (unsigned long long)r->comm_payload_bytes,
                (unsigned long long)r->comm_sent_bytes);
        num(f, r->comm_busy_s); num(f, r->comm_busy_s > 0 ? (double)r->comm_payload_bytes / r->comm_busy_s : 0);
        num(f, r->comm_wait_s); num(f, whole > 0 ? r->comm_wait_s / whole : NAN);
        fputc('\n', f);
    }
}

/* Weight residency: one row per unit (only the header when the trace has none). */
static void csv_units(FILE *f, const struct mw_report *r)
{
    fprintf(f, "unit,name,fetches,bytes_read,fetch_s,resident_spans,resident_s,resident_forward_s,resident_backward_s,"
               "grad_writes,bytes_written,grad_write_s,waits,exposed_wait_s\n");
    for (int i = 0; i < r->nunits; i++) {
        const struct mw_report_unit *U = &r->units[i];
        fprintf(f, "%lld,", (long long)U->id);
        csv_str(f, U->name);
        fprintf(f, ",%llu,%llu", (unsigned long long)U->fetches, (unsigned long long)U->bytes_read);
        num(f, U->fetch_s);
        fprintf(f, ",%llu", (unsigned long long)U->residencies);
        num(f, U->resident_s); num(f, U->resident_fwd_s); num(f, U->resident_bwd_s);
        fprintf(f, ",%llu,%llu", (unsigned long long)U->grad_writes, (unsigned long long)U->bytes_written);
        num(f, U->write_s);
        fprintf(f, ",%llu", (unsigned long long)U->waits);
        num(f, U->wait_s);
        fputc('\n', f);
    }
}

/* Several ranks' traces: one row per rank. */
static void csv_ranks(FILE *f, const struct mw_report *r)
{
    fprintf(f, "rank,trace,world_size,zero_stage,peak_device_bytes,peak_host_bytes,peak_nvme_bytes");
    for (int k = 0; k < MW_REPORT_NKINDS; k++) fprintf(f, ",peak_%s_bytes", mw_report_kind_name(k));
    fprintf(f, ",peak_zero3_resident_weights_bytes,comm_sent_bytes,exposed_comm_wait_s,nvme_read_bytes,"
               "nvme_written_bytes,steps,step_median_s\n");
    for (int i = 0; i < r->nranks; i++) {
        const struct mw_report_rank *k = &r->ranks[i];
        fprintf(f, "%d,", k->rank);
        csv_str(f, k->path);
        fprintf(f, ",%d,%d,%llu,%llu,%llu", k->world_size, k->zero_stage, (unsigned long long)k->peak_device_bytes,
                (unsigned long long)k->peak_host_bytes, (unsigned long long)k->peak_nvme_bytes);
        for (int j = 0; j < MW_REPORT_NKINDS; j++) fprintf(f, ",%llu", (unsigned long long)k->peak_kind_bytes[j]);
        if (k->has_resident) fprintf(f, ",%llu", (unsigned long long)k->resident_peak_bytes);
        else fputc(',', f);
        fprintf(f, ",%llu", (unsigned long long)k->comm_sent_bytes);
        num(f, k->comm_wait_s);
        fprintf(f, ",%llu,%llu,%d", (unsigned long long)k->nvme_read_bytes, (unsigned long long)k->nvme_written_bytes,
                k->nsteps);
        num(f, k->step_median_s);
        fputc('\n', f);
    }
}

static const struct { const char *name; void (*write)(FILE *f, const struct mw_report *r); } csv_files[] = {
    {"tiers.csv", csv_tiers},
    {"memory.csv", csv_memory},
    {"io_pairs.csv", csv_io_pairs},
    {"io_bandwidth.csv", csv_io_bandwidth},
    {"io_sizes.csv", csv_io_sizes},
    {"steps.csv", csv_steps},
    {"subgroups.csv", csv_subgroups},
    {"cost.csv", csv_cost},
    {"detail_spans.csv", csv_detail_spans},
    {"detail_memory.csv", csv_detail_memory},
    {"comm.csv", csv_comm},
    {"units.csv", csv_units},
    {"ranks.csv", csv_ranks},
};

int mw_report_write_csv(const struct mw_report *r, const char *dir)
{
    int rc = mw_mkdir_p(dir, 0777);
    if (rc) return rc;
    char path[1100];
    for (size_t i = 0; i < sizeof csv_files / sizeof csv_files[0]; i++) {
        if (!strcmp(csv_files[i].name, "ranks.csv") && !r->nranks) continue; /* one trace: no ranks table */
        struct mw_out out;
        if ((rc = open_csv(&out, dir, csv_files[i].name, path, sizeof path))) return rc;
        csv_files[i].write(out.f, r);
        if ((rc = mw_out_close(&out))) return rc;
    }
    return 0;
}
