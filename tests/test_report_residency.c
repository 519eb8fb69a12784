/*
 * test_report_residency.c — the report's weight residency and roofline figures against a trace
 * built here, event by event, as a streaming trainer emits them (docs/trace-conventions.md):
 * per step a data phase, then for each weight unit a fetch (io read nvme->host and residency
 * "fetch"), the training thread's residency "wait" when the fetch ends after the unit is
 * needed, the unit "resident" (forward, then in reverse order backward), gradient writes (io
 * write host->nvme and "grad_write"), an update with an offload wait and a comm wait that
 * overlap, and a "resident weights" counter. Durations and bytes come from a seeded generator.
 *
 * Every expected figure is computed here from the event lists, independently of the report's
 * interval code: unions are measured by counting the covered microsecond ticks (all times are
 * whole microseconds), medians by sorting. Checked: the per-unit table (fetches, bytes, time
 * resident as a union, forward/backward, grad writes, exposed wait), the lanes' coverage, unit
 * names (metadata, and derived for a unit the metadata does not name), the per-step roofline
 * (exposed wait, compute, NVMe bytes and time, bound, fraction) and its median over steps 2..N,
 * with the bandwidths from metadata, from the options, and absent; the text line, the CSV
 * columns and the HTML sections.
 *
 * `test_report_residency gen PATH [READ_GBS WRITE_GBS]` only writes the trace (without limits in
 * its metadata when bandwidths are given) and prints the roofline line `memwall report` must
 * print with those bandwidths (for tests/cli_report_roofline.sh).
 */
#include "testutil.h"
#include "memwall/report.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol) * fmax(1e-12, fabs((double)(b))))
#define NSTEPS 4
#define NUNITS 4          /* embeddings, h.0, h.1, ln_f */
#define MAXEV 512
#define META_READ_BW 2.5e9  /* bytes/s, metadata limit.nvme->host */
#define META_WRITE_BW 1.5e9 /* bytes/s, metadata limit.host->nvme */

enum { R_FETCH, R_RESIDENT, R_GRAD_WRITE, R_WAIT };
static const char *const rname[] = {"fetch", "resident", "grad_write", "wait"};

struct res_ev { int kind, unit, bwd; int64_t t0, t1, bytes, step; };
struct io_ev { int write; int64_t t0, t1, bytes; };
struct ivl { int64_t t0, t1; };
struct counter_ev { int64_t t; int64_t value; };

static struct {
    struct res_ev res[MAXEV]; int nres;
    struct io_ev io[MAXEV]; int nio;
    struct ivl step[NSTEPS], data[NSTEPS], fwd[NSTEPS], bwd[NSTEPS], upd[NSTEPS];
    struct ivl owait[NSTEPS], cwait[NSTEPS];
    struct counter_ev ctr[MAXEV]; int nctr;
} T;

static void add_res(int kind, int unit, int bwd, int64_t t0, int64_t t1, int64_t bytes, int64_t step)
{
    REQUIRE(T.nres < MAXEV);
    T.res[T.nres++] = (struct res_ev){kind, unit, bwd, t0, t1, bytes, step};
}

static void add_io(int write, int64_t t0, int64_t t1, int64_t bytes)
{
    REQUIRE(T.nio < MAXEV);
    T.io[T.nio++] = (struct io_ev){write, t0, t1, bytes};
}

/* Builds the run (times in us). Prefetch depth 1: a unit's fetch starts when the previous unit
 * becomes resident; when it ends after the unit is needed, the training thread waits. */
static void build(void)
{
    memset(&T, 0, sizeof T);
    uint64_t seed = 0x5eed5eedull;
    int64_t t = 100, resident_now = 0;
    for (int k = 0; k < NSTEPS; k++) {
        int64_t S = t;
        T.data[k] = (struct ivl){S, S + 20 + (int64_t)(tu_rand(&seed) % 30)};
        t = T.data[k].t1;
        for (int pass = 0; pass < 2; pass++) {
            int64_t fetch_at = t;
            for (int j = 0; j < NUNITS; j++) {
                int u = pass ? NUNITS - 1 - j : j;
                int64_t bytes = 50000 + (int64_t)(tu_rand(&seed) % 100000);
                int64_t fd = bytes / 1600 + (int64_t)(tu_rand(&seed) % 20); /* ~1.6 GB/s */
                int64_t fend = fetch_at + fd;
                add_res(R_FETCH, u, pass, fetch_at, fend, bytes, k + 1);
                add_io(0, fetch_at, fend, bytes);
                if (fend > t) { add_res(R_WAIT, u, pass, t, fend, bytes, k + 1); t = fend; }
                int64_t rd = 30 + (int64_t)(tu_rand(&seed) % 60);
                add_res(R_RESIDENT, u, pass, t, t + rd, bytes, k + 1);
                T.ctr[T.nctr++] = (struct counter_ev){t, resident_now += bytes};
                T.ctr[T.nctr++] = (struct counter_ev){t + rd, resident_now -= bytes};
                if (k == 0 && u == 1 && !pass) /* a repeated, overlapping span: counted once */
                    add_res(R_RESIDENT, u, pass, t + rd / 2, t + rd + 7, bytes, k + 1);
                fetch_at = t; /* the next unit's fetch starts as this one becomes usable */
                t += rd;
                if (pass) {
                    int64_t gb = bytes / 2, gd = gb / 1000 + 3;
                    add_res(R_GRAD_WRITE, u, 1, t, t + gd, gb, k + 1);
                    add_io(1, t, t + gd, gb);
                }
            }
            if (!pass) T.fwd[k] = (struct ivl){T.data[k].t1, t};
            else T.bwd[k] = (struct ivl){T.fwd[k].t1, t};
        }
        int64_t ud = 60 + (int64_t)(tu_rand(&seed) % 40);
        T.upd[k] = (struct ivl){t, t + ud};
        T.owait[k] = (struct ivl){t + 5, t + 25};
        T.cwait[k] = (struct ivl){t + 15, t + 35}; /* overlaps the offload wait: union 30 us */
        add_io(0, t + 5, t + 25, 300000);           /* the optimizer's state read */
        add_io(1, t + 40, t + 58, 200000);          /* and written back */
        t += ud;
        T.step[k] = (struct ivl){S, t};
        t += 10 + (int64_t)(tu_rand(&seed) % 10); /* a gap before the next step */
    }
}

static void write_trace(const char *path, int with_limits)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"traceEvents\": [\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"train\"}}", f);
    static const char *const ph[] = {"data", "forward", "backward", "update"};
    for (int k = 0; k < NSTEPS; k++) {
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"step\",\"ts\":%lld,\"dur\":%lld,\"pid\":1,\"tid\":1,"
                   "\"args\":{\"step\":%d,\"tokens\":256}}",
                (long long)T.step[k].t0, (long long)(T.step[k].t1 - T.step[k].t0), k + 1);
        const struct ivl *p[] = {&T.data[k], &T.fwd[k], &T.bwd[k], &T.upd[k]};
        for (int i = 0; i < 4; i++)
            fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"%s\",\"ts\":%lld,\"dur\":%lld,\"pid\":1,\"tid\":1,"
                       "\"args\":{\"step\":%d}}", ph[i], (long long)p[i]->t0, (long long)(p[i]->t1 - p[i]->t0), k + 1);
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"wait\",\"ts\":%lld,\"dur\":%lld,\"pid\":1,\"tid\":1,"
                   "\"args\":{\"subgroup\":0,\"bytes\":300000}}",
                (long long)T.owait[k].t0, (long long)(T.owait[k].t1 - T.owait[k].t0));
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"wait\",\"ts\":%lld,\"dur\":%lld,\"pid\":1,\"tid\":1,"
                   "\"args\":{\"bytes\":4096,\"ranks\":2}}",
                (long long)T.cwait[k].t0, (long long)(T.cwait[k].t1 - T.cwait[k].t0));
    }
    for (int i = 0; i < T.nres; i++) {
        const struct res_ev *e = &T.res[i];
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"%s\",\"ts\":%lld,\"dur\":%lld,\"pid\":1,\"tid\":%d,"
                   "\"args\":{\"unit\":%d,\"bytes\":%lld,", rname[e->kind], (long long)e->t0, (long long)(e->t1 - e->t0),
                e->kind == R_RESIDENT || e->kind == R_WAIT ? 1 : 2, e->unit, (long long)e->bytes);
        if (e->kind == R_RESIDENT) fprintf(f, "\"backward\":%d,", e->bwd);
        fprintf(f, "\"step\":%lld}}", (long long)e->step);
    }
    for (int i = 0; i < T.nio; i++) {
        const struct io_ev *e = &T.io[i];
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"%s\",\"ts\":%lld,\"dur\":%lld,\"pid\":1,\"tid\":3,"
                   "\"args\":{\"object\":\"u\",\"bytes\":%lld,\"offset\":0,\"qd\":1,\"from\":\"%s\",\"to\":\"%s\"}}",
                e->write ? "write" : "read", (long long)e->t0, (long long)(e->t1 - e->t0), (long long)e->bytes,
                e->write ? "host" : "nvme", e->write ? "nvme" : "host");
    }
    for (int i = 0; i < T.nctr; i++)
        fprintf(f, ",\n{\"ph\":\"C\",\"name\":\"resident weights\",\"ts\":%lld,\"pid\":1,\"args\":{\"value\":%lld}}",
                (long long)T.ctr[i].t, (long long)T.ctr[i].value);
    /* Unit 2 has no name in the metadata: the report derives "h.1" from "units". */
    fputs("\n],\n\"metadata\": {\"units\":\"4\",\"unit.0.name\":\"embeddings\",\"unit.1.name\":\"h.0\","
          "\"unit.3.name\":\"ln_f\"", f);
    if (with_limits) fprintf(f, ",\"limit.nvme->host.bytes_per_s\":%g,\"limit.host->nvme.bytes_per_s\":\"%g\"",
                             META_READ_BW, META_WRITE_BW);
    fputs("}}\n", f);
    REQUIRE(fclose(f) == 0);
}

/* Microsecond ticks of [a, b) covered by at least one of the n intervals given (brute force). */
static int64_t covered(const struct ivl *v, int n, int64_t a, int64_t b)
{
    int64_t c = 0;
    for (int64_t x = a; x < b; x++)
        for (int i = 0; i < n; i++)
            if (v[i].t0 <= x && x < v[i].t1) { c++; break; }
    return c;
}

/* The exposed waits of the run: offload waits, residency waits, comm waits. */
static int exposed_set(struct ivl *v, int with_comm, int with_res, int with_offload)
{
    int n = 0;
    for (int k = 0; k < NSTEPS; k++) {
        if (with_offload) v[n++] = T.owait[k];
        if (with_comm) v[n++] = T.cwait[k];
    }
    for (int i = 0; i < T.nres && with_res; i++)
        if (T.res[i].kind == R_WAIT) v[n++] = (struct ivl){T.res[i].t0, T.res[i].t1};
    return n;
}

struct expect_step { double wall, exposed, compute, nvme, bound, fraction; int64_t rd, wr; };

static void expect_steps(struct expect_step *x, double rbw, double wbw)
{
    static struct ivl ws[MAXEV];
    int n = exposed_set(ws, 1, 1, 1);
    for (int k = 0; k < NSTEPS; k++) {
        struct expect_step *e = &x[k];
        memset(e, 0, sizeof *e);
        e->wall = (double)(T.step[k].t1 - T.step[k].t0) * 1e-6;
        e->exposed = (double)covered(ws, n, T.step[k].t0, T.step[k].t1) * 1e-6;
        e->compute = e->wall - e->exposed;
        for (int i = 0; i < T.nio; i++)
            if (T.io[i].t0 >= T.step[k].t0 && T.io[i].t0 < T.step[k].t1) *(T.io[i].write ? &e->wr : &e->rd) += T.io[i].bytes;
        e->nvme = (double)e->rd / rbw + (double)e->wr / wbw;
        e->bound = e->compute > e->nvme ? e->compute : e->nvme;
        e->fraction = e->bound / e->wall;
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median over steps 2..N (indices 1..N-1) of the field at offset off of expect_step. */
static double median_steady(const struct expect_step *x, size_t off)
{
    double v[NSTEPS];
    int n = 0;
    for (int k = 1; k < NSTEPS - 1; k++) v[n++] = *(const double *)(const void *)((const char *)&x[k] + off);
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void check_roofline(const struct mw_report *r, double rbw, double wbw)
{
    struct expect_step x[NSTEPS];
    expect_steps(x, rbw, wbw);
    REQUIRE(r->nsteps == NSTEPS);
    CHECK(r->has_roofline);
    CHECK(NEAR(r->nvme_read_bw, rbw, 1e-12));
    CHECK(NEAR(r->nvme_write_bw, wbw, 1e-12));
    for (int k = 0; k < NSTEPS; k++) {
        const struct mw_report_step *s = &r->steps[k];
        CHECK_EQ_INT(s->step, k + 1);
        CHECK(NEAR(s->wall_s, x[k].wall, 1e-9));
        CHECK_MSG(NEAR(s->exposed_wait_s, x[k].exposed, 1e-9), "step %d: exposed %g, want %g", k, s->exposed_wait_s,
                  x[k].exposed);
        CHECK(NEAR(s->roof_compute_s, x[k].compute, 1e-9));
        CHECK_EQ_INT(s->nvme_read_bytes, x[k].rd);
        CHECK_EQ_INT(s->nvme_written_bytes, x[k].wr);
        CHECK(NEAR(s->roof_nvme_s, x[k].nvme, 1e-9));
        CHECK(NEAR(s->roof_bound_s, x[k].bound, 1e-9));
        CHECK_MSG(NEAR(s->roof_fraction, x[k].fraction, 1e-9), "step %d: fraction %g, want %g", k, s->roof_fraction,
                  x[k].fraction);
    }
    CHECK_EQ_INT(r->roof_first, 1);
    CHECK_EQ_INT(r->roof_last, NSTEPS - 2); /* the last step drains */
    CHECK(NEAR(r->roof_median_fraction, median_steady(x, offsetof(struct expect_step, fraction)), 1e-9));
    CHECK(NEAR(r->roof_median_nvme_s, median_steady(x, offsetof(struct expect_step, nvme)), 1e-9));
    CHECK(NEAR(r->roof_median_compute_s, median_steady(x, offsetof(struct expect_step, compute)), 1e-9));
    CHECK(NEAR(r->roof_median_wall_s, median_steady(x, offsetof(struct expect_step, wall)), 1e-9));
}

static void check_units(const struct mw_report *r)
{
    static const char *const names[NUNITS] = {"embeddings", "h.0", "h.1", "ln_f"};
    REQUIRE(r->nunits == NUNITS);
    CHECK(r->has_residency);
    CHECK_EQ_INT(r->units_declared, NUNITS);
    static struct ivl v[MAXEV], f[MAXEV], b[MAXEV];
    for (int u = 0; u < NUNITS; u++) {
        const struct mw_report_unit *U = &r->units[u];
        CHECK_EQ_INT(U->id, u);
        CHECK_MSG(!strcmp(U->name, names[u]), "unit %d named '%s', want '%s'", u, U->name, names[u]);
        int64_t fetches = 0, rd = 0, writes = 0, wr = 0, waits = 0, wait_us = 0, fetch_us = 0, write_us = 0;
        double cov_want[MW_REPORT_RES_NLANE] = {0};
        int n = 0, nf = 0, nb = 0;
        for (int i = 0; i < T.nres; i++) {
            const struct res_ev *e = &T.res[i];
            if (e->unit != u) continue;
            int64_t d = e->t1 - e->t0;
            switch (e->kind) {
            case R_FETCH: fetches++; rd += e->bytes; fetch_us += d; cov_want[MW_REPORT_RES_FETCH] += d * 1e-6; break;
            case R_GRAD_WRITE: writes++; wr += e->bytes; write_us += d; cov_want[MW_REPORT_RES_WRITE] += d * 1e-6; break;
            case R_WAIT: waits++; wait_us += d; cov_want[MW_REPORT_RES_WAIT] += d * 1e-6; break;
            case R_RESIDENT:
                v[n++] = (struct ivl){e->t0, e->t1};
                if (e->bwd) b[nb++] = v[n - 1]; else f[nf++] = v[n - 1];
                cov_want[e->bwd ? MW_REPORT_RES_BWD : MW_REPORT_RES_FWD] += d * 1e-6;
                break;
            }
        }
        int64_t lo = T.step[0].t0, hi = T.step[NSTEPS - 1].t1 + 100;
        CHECK_EQ_INT(U->fetches, fetches);
        CHECK_EQ_INT(U->fetches, 2 * NSTEPS); /* forward and backward, every step */
        CHECK_EQ_INT(U->bytes_read, rd);
        CHECK(NEAR(U->fetch_s, fetch_us * 1e-6, 1e-9));
        CHECK_EQ_INT(U->grad_writes, writes);
        CHECK_EQ_INT(U->bytes_written, wr);
        CHECK(NEAR(U->write_s, write_us * 1e-6, 1e-9));
        CHECK_EQ_INT(U->waits, waits);
        CHECK(NEAR(U->wait_s, wait_us * 1e-6, 1e-9));
        CHECK_EQ_INT(U->residencies, n);
        CHECK_MSG(NEAR(U->resident_s, covered(v, n, lo, hi) * 1e-6, 1e-9), "unit %d: resident %g", u, U->resident_s);
        CHECK(NEAR(U->resident_fwd_s, covered(f, nf, lo, hi) * 1e-6, 1e-9));
        CHECK(NEAR(U->resident_bwd_s, covered(b, nb, lo, hi) * 1e-6, 1e-9));
        /* The lanes keep every second of every span: their bins add up to the durations. */
        REQUIRE(U->cov);
        for (int l = 0; l < MW_REPORT_RES_NLANE; l++) {
            double s = 0;
            for (int k = 0; k < r->nbins; k++) s += U->cov[(size_t)k * MW_REPORT_RES_NLANE + l];
            CHECK_MSG(NEAR(s, cov_want[l], 1e-9), "unit %d lane %d: %g s, want %g", u, l, s, cov_want[l]);
        }
    }
    /* The repeated span of unit 1 overlaps: its union is less than the sum of its spans. */
    double sum1 = 0;
    for (int i = 0; i < T.nres; i++)
        if (T.res[i].unit == 1 && T.res[i].kind == R_RESIDENT) sum1 += (T.res[i].t1 - T.res[i].t0) * 1e-6;
    CHECK(r->units[1].resident_s < sum1 - 1e-7);
    /* Exposed residency wait (all units) and the exposed I/O wait that now includes it. */
    static struct ivl ws[MAXEV];
    int nw = exposed_set(ws, 0, 1, 0);
    CHECK(NEAR(r->res_wait_s, covered(ws, nw, 0, T.step[NSTEPS - 1].t1) * 1e-6, 1e-9));
    nw = exposed_set(ws, 0, 1, 1);
    CHECK(NEAR(r->wait_s, covered(ws, nw, 0, T.step[NSTEPS - 1].t1) * 1e-6, 1e-9));
    for (int k = 0; k < NSTEPS; k++)
        CHECK(NEAR(r->steps[k].wait_s, covered(ws, nw, T.step[k].t0, T.step[k].t1) * 1e-6, 1e-9));
    /* The counter: its highest and last values. */
    int64_t peak = 0;
    for (int i = 0; i < T.nctr; i++) peak = T.ctr[i].value > peak ? T.ctr[i].value : peak;
    CHECK(r->has_resident_weights);
    CHECK_EQ_INT(r->resident_weights_peak_bytes, peak);
    CHECK_EQ_INT(r->resident_weights_final_bytes, T.ctr[T.nctr - 1].value);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    REQUIRE(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

/* The line `memwall report` prints (text.c), up to the NVMe time (its format is the writer's). */
static void roofline_prefix(char *b, size_t n, double rbw, double wbw)
{
    struct expect_step x[NSTEPS];
    expect_steps(x, rbw, wbw);
    snprintf(b, n, "roofline: %.2f of bound (median of steps 2..%d; bound = NVMe ",
             median_steady(x, offsetof(struct expect_step, fraction)), NSTEPS - 1);
}

static void check_writers(const struct mw_report *r, const char *dir)
{
    char path[700], want[160];
    snprintf(path, sizeof path, "%s/summary.txt", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    CHECK(mw_report_write_text(r, f) == 0);
    fclose(f);
    char *txt = slurp(path);
    REQUIRE(txt);
    roofline_prefix(want, sizeof want, META_READ_BW, META_WRITE_BW);
    CHECK_MSG(strstr(txt, want) != NULL, "text lacks '%s':\n%s", want, txt);
    CHECK(strstr(txt, "(trace metadata)"));
    CHECK(strstr(txt, "weight residency: 4 units"));
    CHECK(strstr(txt, " ln_f "));
    free(txt);

    snprintf(path, sizeof path, "%s/csv", dir);
    CHECK(mw_report_write_csv(r, path) == 0);
    snprintf(path, sizeof path, "%s/csv/units.csv", dir);
    char *csv = slurp(path);
    REQUIRE(csv);
    int lines = 0;
    for (char *p = csv; *p; p++) lines += *p == '\n';
    CHECK_EQ_INT(lines, 1 + NUNITS);
    CHECK(strstr(csv, "\n2,h.1,8,"));
    free(csv);
    /* steps.csv: the last column is each step's achieved fraction. */
    struct expect_step x[NSTEPS];
    expect_steps(x, META_READ_BW, META_WRITE_BW);
    snprintf(path, sizeof path, "%s/csv/steps.csv", dir);
    csv = slurp(path);
    REQUIRE(csv);
    CHECK(strstr(csv, ",roofline_nvme_s,roofline_bound_s,roofline_fraction\n"));
    char *line = strchr(csv, '\n');
    for (int k = 0; k < NSTEPS && line; k++) {
        char *end = strchr(line + 1, '\n');
        REQUIRE(end);
        *end = 0;
        const char *last = strrchr(line + 1, ',');
        REQUIRE(last);
        CHECK_MSG(NEAR(strtod(last + 1, NULL), x[k].fraction, 1e-8), "steps.csv step %d: %s, want %.9g", k, last + 1,
                  x[k].fraction);
        line = end;
    }
    free(csv);

    snprintf(path, sizeof path, "%s/r.html", dir);
    CHECK(mw_report_write_html(r, path) == 0);
    char *html = slurp(path);
    REQUIRE(html);
    CHECK(strstr(html, "<h2>Weight residency</h2>"));
    CHECK(strstr(html, "weight residency per unit"));
    snprintf(want, sizeof want, "Roofline: %.2f of bound</b> (median of steps 2..%d", r->roof_median_fraction, NSTEPS - 1);
    CHECK_MSG(strstr(html, want) != NULL, "html lacks '%s'", want);
    CHECK(strstr(html, ">h.1</text>") && strstr(html, ">embeddings</text>"));
    CHECK(strstr(html, "h.0: resident (backward)"));
    CHECK(strstr(html, "h.1: exposed wait for the fetch") || strstr(html, "embeddings: exposed wait for the fetch"));
    CHECK(!strstr(html, "nan") && !strstr(html, "<script"));
    free(html);
}

static void test_roofline(const char *dir)
{
    char path[600];
    build();
    snprintf(path, sizeof path, "%s/res.json", dir);
    write_trace(path, 1);
    struct mw_report_opts o;
    mw_report_opts_default(&o);
    o.bins = 400;
    struct mw_report *r;
    int rc = mw_report_load(&r, path, &o);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    check_units(r);
    check_roofline(r, META_READ_BW, META_WRITE_BW);
    CHECK(!strcmp(r->nvme_read_bw_from, "trace metadata"));
    check_writers(r, dir);
    /* Both bandwidths matter: the steps read from and write to the disk. */
    CHECK(r->steps[1].nvme_read_bytes > 0 && r->steps[1].nvme_written_bytes > 0);
    mw_report_free(r);

    /* Options override the metadata (here: a slow disk, so the NVMe term binds). */
    o.nvme_read_bw = 0.4e9;
    o.nvme_write_bw = 0.3e9;
    REQUIRE(mw_report_load(&r, path, &o) == 0);
    check_roofline(r, 0.4e9, 0.3e9);
    CHECK(!strcmp(r->nvme_read_bw_from, "option") && !strcmp(r->nvme_write_bw_from, "option"));
    struct expect_step x[NSTEPS];
    expect_steps(x, 0.4e9, 0.3e9);
    CHECK(x[2].nvme > x[2].compute); /* so the bound is the NVMe term there */
    CHECK(NEAR(r->steps[2].roof_bound_s, x[2].nvme, 1e-9));
    mw_report_free(r);
    /* A fast disk: the steps are bound by compute. */
    o.nvme_read_bw = o.nvme_write_bw = 100e9;
    REQUIRE(mw_report_load(&r, path, &o) == 0);
    check_roofline(r, 100e9, 100e9);
    expect_steps(x, 100e9, 100e9);
    CHECK(x[2].nvme < x[2].compute);
    CHECK(NEAR(r->steps[2].roof_bound_s, x[2].compute, 1e-9));
    mw_report_free(r);
    o.nvme_read_bw = 0.4e9;
    o.nvme_write_bw = 0;                 /* only one overrides: the other from the metadata */
    REQUIRE(mw_report_load(&r, path, &o) == 0);
    check_roofline(r, 0.4e9, META_WRITE_BW);
    mw_report_free(r);

    /* No bandwidth: no roofline (NaN per step), and the text says how to give one. */
    snprintf(path, sizeof path, "%s/nolimit.json", dir);
    write_trace(path, 0);
    REQUIRE(mw_report_load(&r, path, NULL) == 0);
    CHECK(!r->has_roofline);
    CHECK(isnan(r->steps[1].roof_fraction) && isnan(r->roof_median_fraction));
    CHECK(NEAR(r->steps[1].roof_compute_s, x[1].compute, 1e-9)); /* compute does not need a bandwidth */
    check_units(r);
    char out[700];
    snprintf(out, sizeof out, "%s/nolimit.txt", dir);
    FILE *f = fopen(out, "w");
    REQUIRE(f);
    CHECK(mw_report_write_text(r, f) == 0);
    fclose(f);
    char *txt = slurp(out);
    REQUIRE(txt);
    CHECK(strstr(txt, "roofline: unknown: no NVMe read bandwidth"));
    CHECK(strstr(txt, "--nvme-read-bw"));
    free(txt);
    snprintf(out, sizeof out, "%s/nolimit.html", dir);
    CHECK(mw_report_write_html(r, out) == 0);
    mw_report_free(r);
    /* A write bandwidth alone is not enough. */
    mw_report_opts_default(&o);
    o.nvme_write_bw = 1e9;
    REQUIRE(mw_report_load(&r, path, &o) == 0);
    CHECK(!r->has_roofline);
    mw_report_free(r);

    /* Bad bandwidths from a library caller: -EINVAL with a message, no report. */
    o.nvme_read_bw = -1;
    r = (struct mw_report *)1;
    CHECK(mw_report_load(&r, path, &o) == -EINVAL && r == NULL);
    CHECK(strstr(mw_error_msg(), "bandwidth") != NULL);
    o.nvme_read_bw = NAN;
    CHECK(mw_report_load(&r, path, &o) == -EINVAL);
    o.nvme_read_bw = INFINITY;
    CHECK(mw_report_load(&r, path, &o) == -EINVAL);
}

/* Hostile residency events: no unit, negative or huge unit, unknown name, huge bytes and counter
 * values; they are skipped (counted as ignored), never a crash; a single step has no "steady"
 * steps, so the median is that step's. */
static void test_hostile(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/hostile.json", dir);
    const char *tr =
        "{\"traceEvents\":[\n"
        "{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"step\",\"ts\":0,\"dur\":100,\"args\":{\"step\":7}},\n"
        "{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"fetch\",\"ts\":1,\"dur\":2,\"args\":{\"bytes\":10}},\n"
        "{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"fetch\",\"ts\":1,\"dur\":2,\"args\":{\"unit\":-3,\"bytes\":10}},\n"
        "{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"fetch\",\"ts\":1,\"dur\":2,\"args\":{\"unit\":1e300}},\n"
        "{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"evict\",\"ts\":1,\"dur\":2,\"args\":{\"unit\":1}},\n"
        "{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"fetch\",\"ts\":10,\"dur\":20,\"args\":{\"unit\":\"5\",\"bytes\":1e300}},\n"
        "{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"wait\",\"ts\":10,\"dur\":20,\"args\":{\"unit\":5,\"bytes\":8}},\n"
        "{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"read\",\"ts\":10,\"dur\":20,\"args\":{\"bytes\":50000,\"from\":\"nvme\",\"to\":\"host\"}},\n"
        "{\"ph\":\"C\",\"name\":\"resident weights\",\"ts\":5,\"args\":{\"value\":1e300}}\n"
        "],\"metadata\":{\"units\":\"1e300\",\"unit.x.name\":\"a\",\"unit.-1.name\":\"b\",\"unit.5.name\":7,"
        "\"unit.5.name.x\":\"c\",\"limit.nvme->host.bytes_per_s\":1e9,\"limit.host->nvme.bytes_per_s\":1e9}}\n";
    FILE *f = fopen(path, "w");
    REQUIRE(f && fputs(tr, f) >= 0 && fclose(f) == 0);
    struct mw_report *r;
    int rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    REQUIRE(r->nunits == 1);
    CHECK_EQ_INT(r->units[0].id, 5);
    CHECK(!strcmp(r->units[0].name, "unit 5"));
    CHECK_EQ_INT(r->units[0].fetches, 1);
    CHECK_EQ_INT(r->units[0].bytes_read, 0);
    CHECK(!r->has_resident_weights);
    CHECK_EQ_INT(r->units_declared, -1);
    REQUIRE(r->nsteps == 1 && r->has_roofline);
    CHECK_EQ_INT(r->roof_first, 0);
    double wall = 100e-6, compute = wall - 20e-6, nvme = 50000 / 1e9;
    CHECK(NEAR(r->steps[0].roof_fraction, fmax(compute, nvme) / wall, 1e-9));
    CHECK(NEAR(r->roof_median_fraction, r->steps[0].roof_fraction, 1e-12));
    char out[700];
    snprintf(out, sizeof out, "%s/hostile.txt", dir);
    f = fopen(out, "w");
    REQUIRE(f);
    CHECK(mw_report_write_text(r, f) == 0);
    fclose(f);
    char *txt = slurp(out);
    REQUIRE(txt);
    CHECK(strstr(txt, "(step 7 only; bound = NVMe "));
    free(txt);
    snprintf(out, sizeof out, "%s/hostile.html", dir);
    CHECK(mw_report_write_html(r, out) == 0);
    mw_report_free(r);

    /* Steps of no length: no fraction (not "nan"), in the text and the HTML. */
    const char *zero =
        "{\"traceEvents\":[\n"
        "{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"step\",\"ts\":0,\"dur\":0,\"args\":{\"step\":1}},\n"
        "{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"step\",\"ts\":5,\"dur\":0,\"args\":{\"step\":2}},\n"
        "{\"ph\":\"X\",\"cat\":\"residency\",\"name\":\"fetch\",\"ts\":1,\"dur\":2,\"args\":{\"unit\":0,\"bytes\":8}}\n"
        "],\"metadata\":{\"limit.nvme->host.bytes_per_s\":1e9,\"limit.host->nvme.bytes_per_s\":1e9}}\n";
    snprintf(path, sizeof path, "%s/zero.json", dir);
    f = fopen(path, "w");
    REQUIRE(f && fputs(zero, f) >= 0 && fclose(f) == 0);
    REQUIRE(mw_report_load(&r, path, NULL) == 0);
    CHECK(r->has_roofline && isnan(r->roof_median_fraction));
    snprintf(out, sizeof out, "%s/zero.txt", dir);
    f = fopen(out, "w");
    REQUIRE(f);
    CHECK(mw_report_write_text(r, f) == 0);
    fclose(f);
    txt = slurp(out);
    REQUIRE(txt);
    CHECK(strstr(txt, "roofline: - of bound (step 2 only;"));
    free(txt);
    snprintf(out, sizeof out, "%s/zero.html", dir);
    CHECK(mw_report_write_html(r, out) == 0);
    char *html = slurp(out);
    REQUIRE(html);
    CHECK(strstr(html, "Roofline: - of bound") && !strstr(html, "nan"));
    free(html);
    mw_report_free(r);
}

int main(int argc, char **argv)
{
    if ((argc == 3 || argc == 5) && !strcmp(argv[1], "gen")) {
        build();
        write_trace(argv[2], argc == 3);
        char line[160];
        if (argc == 5) roofline_prefix(line, sizeof line, atof(argv[3]) * 1e9, atof(argv[4]) * 1e9);
        else roofline_prefix(line, sizeof line, META_READ_BW, META_WRITE_BW);
        printf("%s\n", line);
        return 0;
    }
    const char *dir = tu_scratch_dir("report_residency");
    test_roofline(dir);
    test_hostile(dir);
    if (!tu_failures) tu_rm_rf(dir);
    TEST_END();
}
