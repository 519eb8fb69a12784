/*
 * test_report_comm.c — communication and several ranks in `memwall report`:
 *   1. a hand-written trace with known comm spans (overlapping collectives, waits attributed
 *      or not): exact calls, bytes, busy time (union, not the sum), bandwidth, exposed wait,
 *      compute without the waits, per-step sent bytes and wait, the ZeRO-3 resident counter,
 *      peaks per kind over tiers, the detail lanes, and the writers;
 *   2. the synthetic generator's rank traces against its closed forms;
 *   3. a trace without comm events still reports (and says so);
 *   4. several traces: the ranks table (rank 0's report kept whatever the order, rows by rank,
 *      per-rank peaks), world_size that differs or a rank given twice refused naming the
 *      file, %r expansion.
 */
#include "testutil.h"
#include "memwall/report.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol) * fmax(1e-12, fabs((double)(b))))

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    REQUIRE(fputs(s, f) >= 0);
    REQUIRE(fclose(f) == 0);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    REQUIRE(b && fread(b, 1, (size_t)len, f) == (size_t)len);
    b[len] = 0;
    fclose(f);
    return b;
}

static int count_lines(const char *path)
{
    char *c = read_file(path);
    if (!c) return -1;
    int n = 0;
    for (char *x = c; *x; x++) n += *x == '\n';
    free(c);
    return n;
}

/* Times in us. One step [0,100): forward [0,40), backward [40,80), update [80,100).
 * Collectives (bytes / ranks / sent):
 *   allreduce      A1 [10,30)  4000/2/4000   A2 [20,50) 2000/2/2000  -> union [10,50) = 40 us
 *   reduce_scatter R1 [45,75)  8000/4/6000                             -> 30 us
 *   allgather      G1 [85,95)  1000/4/750    G2 [120,130) (after the step) -> 20 us
 * Waits: [40,50) 2000/2 -> A2 (ends at 50); [70,75) 8000/4 -> R1; [90,92) 999/4 -> none.
 *   comm busy = [10,75) + [85,95) + [120,130) = 85 us; exposed comm wait 17 us (2 unattributed);
 *   compute = 100 - 17 = 83 us; comm busy under compute = (65 - 15) + (10 - 2) = 58 us.
 *   step 0: sent 4000+2000+6000+750 = 12750 B (G2 is issued after it), wait 17 us.
 * A "barrier" comm span is not a collective the report counts (ignored).
 * Memory: host weights 100 B [0,60); device weights 300 B at 5, +200 B at 70: per tier peaks
 * host 100, device 500; weights over all tiers peak 500 (not 600). Counter "zero3 resident
 * weights" 100 at 0, 400 at 10, 250 at 50. I/O: one read nvme->host [60,70). */
static const char *hand_trace =
    "{\"traceEvents\":[\n"
    "{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"step\",\"ts\":0,\"dur\":100,\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"forward\",\"ts\":0,\"dur\":40,\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"backward\",\"ts\":40,\"dur\":40,\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"update\",\"ts\":80,\"dur\":20,\"args\":{\"step\":0}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":0,\"s\":\"t\",\"args\":{\"tier\":\"host\",\"kind\":\"weights\",\"bytes\":100}},\n"
    "{\"ph\":\"C\",\"cat\":\"counter\",\"name\":\"zero3 resident weights\",\"ts\":0,\"args\":{\"value\":100}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":5,\"s\":\"t\",\"args\":{\"tier\":\"device\",\"kind\":\"weights\",\"bytes\":300}},\n"
    "{\"ph\":\"C\",\"cat\":\"counter\",\"name\":\"zero3 resident weights\",\"ts\":10,\"args\":{\"value\":400}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"allreduce\",\"ts\":20,\"dur\":30,\"args\":{\"bytes\":2000,\"ranks\":2,\"group\":0,\"sent\":2000}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"allreduce\",\"ts\":10,\"dur\":20,\"args\":{\"bytes\":4000,\"ranks\":2,\"group\":0,\"sent\":4000}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"wait\",\"ts\":40,\"dur\":10,\"args\":{\"bytes\":2000,\"ranks\":2}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"barrier\",\"ts\":41,\"dur\":1,\"args\":{\"ranks\":2}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"reduce_scatter\",\"ts\":45,\"dur\":30,\"args\":{\"bytes\":8000,\"ranks\":4,\"group\":3,\"sent\":6000}},\n"
    "{\"ph\":\"C\",\"cat\":\"counter\",\"name\":\"zero3 resident weights\",\"ts\":50,\"args\":{\"value\":250}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"free\",\"ts\":60,\"s\":\"t\",\"args\":{\"tier\":\"host\",\"kind\":\"weights\",\"bytes\":100}},\n"
    "{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"read\",\"ts\":60,\"dur\":10,\"args\":{\"bytes\":1000000,\"qd\":1,\"from\":\"nvme\",\"to\":\"host\"}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":70,\"s\":\"t\",\"args\":{\"tier\":\"device\",\"kind\":\"weights\",\"bytes\":200}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"wait\",\"ts\":70,\"dur\":5,\"args\":{\"bytes\":8000,\"ranks\":4}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"allgather\",\"ts\":85,\"dur\":10,\"args\":{\"bytes\":1000,\"ranks\":4,\"group\":3,\"sent\":750}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"wait\",\"ts\":90,\"dur\":2,\"args\":{\"bytes\":999,\"ranks\":4}},\n"
    "{\"ph\":\"X\",\"cat\":\"comm\",\"name\":\"allgather\",\"ts\":120,\"dur\":10,\"args\":{\"bytes\":1000,\"ranks\":4,\"group\":3,\"sent\":750}}\n"
    "],\n\"metadata\":{\"tool\":\"memwall\",\"rank\":\"1\",\"world_size\":\"4\",\"zero_stage\":\"3\"}}\n";

static int tier_idx(const struct mw_report *r, const char *n)
{
    for (int i = 0; i < r->ntiers; i++)
        if (!strcmp(r->tiers[i].name, n)) return i;
    return -1;
}

static void test_hand(const char *dir)
{
    char path[600], out[700];
    snprintf(path, sizeof path, "%s/comm.json", dir);
    write_file(path, hand_trace);
    struct mw_report *r;
    int rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    const double us = 1e-6, tol = 1e-9;
    CHECK_EQ_INT(r->rank, 1);
    CHECK_EQ_INT(r->world_size, 4);
    CHECK_EQ_INT(r->zero_stage, 3);
    CHECK(r->has_comm);
    const struct mw_report_comm *ar = &r->comm[MW_REPORT_COMM_ALLREDUCE], *rs = &r->comm[MW_REPORT_COMM_REDUCE_SCATTER],
                                *ag = &r->comm[MW_REPORT_COMM_ALLGATHER];
    CHECK_EQ_INT(ar->calls, 2);
    CHECK_EQ_INT(ar->payload_bytes, 6000);
    CHECK_EQ_INT(ar->sent_bytes, 6000);
    CHECK_EQ_INT(ar->max_ranks, 2);
    CHECK_MSG(NEAR(ar->busy_s, 40 * us, tol), "allreduce busy %g s: overlapping spans counted twice?", ar->busy_s);
    CHECK(NEAR(ar->achieved_bw, 6000 / (40 * us), 1e-6));
    CHECK(NEAR(ar->wait_s, 10 * us, tol));
    CHECK_EQ_INT(rs->calls, 1);
    CHECK_EQ_INT(rs->payload_bytes, 8000);
    CHECK_EQ_INT(rs->sent_bytes, 6000);
    CHECK_EQ_INT(rs->max_ranks, 4);
    CHECK(NEAR(rs->busy_s, 30 * us, tol));
    CHECK(NEAR(rs->wait_s, 5 * us, tol));
    CHECK_EQ_INT(ag->calls, 2);
    CHECK_EQ_INT(ag->payload_bytes, 2000);
    CHECK_EQ_INT(ag->sent_bytes, 1500);
    CHECK(NEAR(ag->busy_s, 20 * us, tol));
    CHECK(NEAR(ag->achieved_bw, 1e8, 1e-6));
    CHECK(ag->wait_s == 0);
    CHECK_EQ_INT(r->comm_sent_bytes, 13500);
    CHECK_EQ_INT(r->comm_payload_bytes, 16000);
    CHECK(NEAR(r->comm_busy_s, 85 * us, tol));
    CHECK(NEAR(r->comm_wait_s, 17 * us, tol));
    CHECK(NEAR(r->comm_wait_unattributed_s, 2 * us, tol));
    CHECK_MSG(NEAR(r->compute_s, 83 * us, tol), "compute %g s: comm waits are not compute", r->compute_s);
    CHECK(NEAR(r->comm_overlap_s, 58 * us, tol));
    CHECK(NEAR(r->comm_overlap, 58.0 / 85.0, 1e-9));
    CHECK(NEAR(r->steps_wall_s, 100 * us, tol));
    CHECK(r->n_ignored >= 1); /* the barrier */
    REQUIRE(r->nsteps == 1);
    CHECK_EQ_INT(r->steps[0].comm_sent_bytes, 12750);
    CHECK(NEAR(r->steps[0].comm_wait_s, 17 * us, tol));
    CHECK(NEAR(r->steps[0].compute_s, 83 * us, tol));
    CHECK(NEAR(r->t1_s - r->t0_s, 130 * us, tol)); /* G2 extends the trace */
    /* The timeline series: allreduce has 1.5 collectives in flight on average over [10,50). */
    double inflight = 0, wait = 0;
    for (int b = 0; b < r->nbins; b++) {
        inflight += ar->inflight[b] * r->bin_s;
        wait += r->comm_wait_bins[b] * r->bin_s;
    }
    CHECK(NEAR(inflight, 50 * us, 1e-6)); /* sum of durations: 20 + 30 us */
    CHECK(NEAR(wait, 17 * us, 1e-6));
    /* ZeRO-3 resident weights, and peaks per kind over tiers. */
    CHECK(r->has_resident);
    CHECK_EQ_INT(r->resident_peak_bytes, 400);
    CHECK_EQ_INT(r->resident_final_bytes, 250);
    CHECK(NEAR(r->resident_peak_t_s - r->t0_s, 10 * us, tol));
    CHECK_EQ_INT(r->tiers[tier_idx(r, "host")].peak_bytes, 100);
    CHECK_EQ_INT(r->tiers[tier_idx(r, "device")].peak_bytes, 500);
    CHECK_EQ_INT(r->peak_kind_bytes[0], 500);
    /* Detail of step 0: comm lanes after the one tier pair; the allgather after the step is not in it. */
    REQUIRE(r->npairs == 1);
    int ncomm = 0, nwait = 0;
    for (int i = 0; i < r->ndetail_rects; i++) {
        const struct mw_report_rect *q = &r->detail_rects[i];
        if (q->lane >= 7) {
            ncomm++;
            CHECK_EQ_INT(q->lane, 7 + q->kind);
        }
        nwait += q->lane == 7 + MW_REPORT_COMM_NOPS;
    }
    CHECK_EQ_INT(ncomm, 7);
    CHECK_EQ_INT(nwait, 3);

    /* Writers. */
    snprintf(out, sizeof out, "%s/comm.html", dir);
    CHECK(mw_report_write_html(r, out) == 0);
    char *html = read_file(out);
    REQUIRE(html);
    CHECK(strstr(html, "<h2>Communication</h2>"));
    CHECK(strstr(html, "comm reduce_scatter"));    /* timeline lane */
    CHECK(strstr(html, "comm wait (exposed)"));
    CHECK(strstr(html, "exposed comm wait (ms)")); /* steps table column */
    CHECK(strstr(html, "rank 1 of 4, ZeRO stage 3"));
    CHECK(!strstr(html, "nan") && !strstr(html, "<script"));
    free(html);
    snprintf(out, sizeof out, "%s/csv", dir);
    CHECK(mw_report_write_csv(r, out) == 0);
    snprintf(out, sizeof out, "%s/csv/comm.csv", dir);
    CHECK_EQ_INT(count_lines(out), 1 + 3 + 1);
    char *csv = read_file(out);
    REQUIRE(csv);
    CHECK_MSG(strstr(csv, "\nallreduce,2,2,6000,6000,4e-05,150000000,1e-05,0.1\n"), "%s", csv);
    CHECK(strstr(csv, "\nall,5,4,16000,13500,8.5e-05,"));
    free(csv);
    snprintf(out, sizeof out, "%s/csv/steps.csv", dir);
    csv = read_file(out);
    REQUIRE(csv);
    CHECK(strstr(csv, ",comm_sent_bytes,exposed_comm_wait_s,nvme_read_bytes,")); /* the roofline's columns follow */
    CHECK(strstr(csv, ",12750,1.7e-05,"));
    free(csv);
    snprintf(out, sizeof out, "%s/csv/ranks.csv", dir);
    CHECK(count_lines(out) < 0); /* one trace: no ranks table */
    snprintf(out, sizeof out, "%s/comm.txt", dir);
    FILE *f = fopen(out, "w");
    REQUIRE(f);
    CHECK(mw_report_write_text(r, f) == 0);
    fclose(f);
    char *txt = read_file(out);
    REQUIRE(txt);
    CHECK(strstr(txt, "reduce_scatter 1 calls over 4 ranks"));
    CHECK(strstr(txt, "exposed comm wait 0.000 s (17.0 % of step time)"));
    CHECK(strstr(txt, "zero3 resident weights: peak"));
    free(txt);
    mw_report_free(r);
}

static void synth(const char *path, int steps, int rank, int world)
{
    struct mw_report_synth s;
    mw_report_synth_default(&s);
    s.steps = steps;
    s.rank = rank;
    s.world_size = world;
    int rc = mw_report_synth_write(&s, path);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
}

/* The generator's rank traces against the closed forms in src/report/synth.c. */
static void test_synth(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/synth.json", dir);
    const int N = 4, W = 2;
    synth(path, N, 1, W);
    struct mw_report *r;
    REQUIRE(mw_report_load(&r, path, NULL) == 0);
    struct mw_report_synth s;
    mw_report_synth_default(&s);
    const double L = s.step_us * 1e-6, tol = 1e-6;
    const uint64_t P = (uint64_t)s.subgroups * s.sg_bytes / 4;
    CHECK_EQ_INT(r->rank, 1);
    CHECK_EQ_INT(r->comm[MW_REPORT_COMM_REDUCE_SCATTER].calls, 2 * N);
    CHECK_EQ_INT(r->comm[MW_REPORT_COMM_REDUCE_SCATTER].payload_bytes, 2 * N * P);
    CHECK_EQ_INT(r->comm[MW_REPORT_COMM_ALLGATHER].payload_bytes, 2 * N * P);
    CHECK_EQ_INT(r->comm[MW_REPORT_COMM_ALLREDUCE].calls, 0);
    CHECK_EQ_INT(r->comm_sent_bytes, N * 4 * P / W * (W - 1));
    CHECK(NEAR(r->comm[MW_REPORT_COMM_REDUCE_SCATTER].busy_s, N * 0.25 * L, tol));
    CHECK(NEAR(r->comm[MW_REPORT_COMM_ALLGATHER].busy_s, N * 0.20 * L, tol));
    CHECK(NEAR(r->comm_wait_s, N * 0.05 * L, tol));
    CHECK(NEAR(r->comm[MW_REPORT_COMM_REDUCE_SCATTER].wait_s, N * 0.05 * L, tol));
    CHECK(r->comm_wait_unattributed_s == 0);
    CHECK_EQ_INT(r->resident_peak_bytes, 2 * P);
    CHECK_EQ_INT(r->resident_final_bytes, 2 * P / W);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(r->steps[i].comm_sent_bytes, 4 * P / W * (W - 1));
        CHECK(NEAR(r->steps[i].comm_wait_s, 0.05 * L, tol));
        /* compute = .95 L minus the offload wait (.1 U, U = .35 L) minus the comm wait. */
        CHECK(NEAR(r->steps[i].compute_s, 0.95 * L - 0.035 * L - 0.05 * L, tol));
    }
    mw_report_free(r);
}

/* A single-rank trace has no comm events: the report loads and says so in one line. */
static void test_no_comm(const char *dir)
{
    char path[600], out[700];
    snprintf(path, sizeof path, "%s/single.json", dir);
    synth(path, 2, 0, 0);
    struct mw_report *r;
    REQUIRE(mw_report_load(&r, path, NULL) == 0);
    CHECK(!r->has_comm);
    CHECK(r->comm_sent_bytes == 0 && r->comm_wait_s == 0 && isnan(r->comm_overlap));
    CHECK_EQ_INT(r->rank, -1);
    CHECK(!r->has_resident);
    snprintf(out, sizeof out, "%s/single.txt", dir);
    FILE *f = fopen(out, "w");
    REQUIRE(f);
    CHECK(mw_report_write_text(r, f) == 0);
    fclose(f);
    char *txt = read_file(out);
    REQUIRE(txt);
    CHECK(strstr(txt, "communication: none in this trace"));
    CHECK(!strstr(txt, "ranks:"));
    free(txt);
    snprintf(out, sizeof out, "%s/single.html", dir);
    CHECK(mw_report_write_html(r, out) == 0);
    char *html = read_file(out);
    REQUIRE(html);
    CHECK(strstr(html, "No communication in this trace"));
    CHECK(!strstr(html, "comm wait (exposed)") && !strstr(html, "<h2>Ranks</h2>"));
    free(html);
    snprintf(out, sizeof out, "%s/single-csv", dir);
    CHECK(mw_report_write_csv(r, out) == 0);
    snprintf(out, sizeof out, "%s/single-csv/comm.csv", dir);
    CHECK_EQ_INT(count_lines(out), 1);
    mw_report_free(r);
}

static void test_ranks(const char *dir)
{
    char p0[600], p1[600], p3[600], pat[600], hand[600];
    snprintf(p0, sizeof p0, "%s/rk.0.json", dir);
    snprintf(p1, sizeof p1, "%s/rk.1.json", dir);
    snprintf(p3, sizeof p3, "%s/other.json", dir);
    snprintf(pat, sizeof pat, "%s/rk.%%r.json", dir);
    const int N = 3, W = 2;
    synth(p0, N, 0, W);
    synth(p1, N, 1, W);
    synth(p3, N, 1, 3); /* a rank of another run: world_size 3 */
    struct mw_report_synth s;
    mw_report_synth_default(&s);
    const uint64_t SB = (uint64_t)s.subgroups * s.sg_bytes, P = SB / 4;

    /* Given in the wrong order: rank 0's report is kept, rows come sorted by rank. */
    const char *order[] = {p1, p0};
    struct mw_report *r;
    int rc = mw_report_load_ranks(&r, order, 2, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    CHECK(!strcmp(r->path, p0));
    REQUIRE(r->nranks == 2);
    for (int k = 0; k < 2; k++) {
        const struct mw_report_rank *q = &r->ranks[k];
        CHECK_EQ_INT(q->rank, k);
        CHECK(!strcmp(q->path, k ? p1 : p0));
        CHECK_EQ_INT(q->world_size, W);
        CHECK_EQ_INT(q->zero_stage, 3);
        CHECK_EQ_INT(q->peak_device_bytes, 2 * SB);
        CHECK_EQ_INT(q->peak_host_bytes, 3 * s.sg_bytes + (uint64_t)k * s.req_bytes); /* ranks differ here */
        CHECK_EQ_INT(q->peak_nvme_bytes, 3 * SB);
        CHECK_EQ_INT(q->peak_kind_bytes[0], SB / 2); /* weights */
        CHECK_EQ_INT(q->peak_kind_bytes[5], 3 * s.sg_bytes + (uint64_t)k * s.req_bytes); /* staging */
        CHECK(q->has_resident);
        CHECK_EQ_INT(q->resident_peak_bytes, 2 * P);
        CHECK_EQ_INT(q->comm_sent_bytes, N * 4 * P / W * (W - 1));
        CHECK(NEAR(q->comm_wait_s, N * 0.05 * s.step_us * 1e-6, 1e-6));
        CHECK_EQ_INT(q->nvme_read_bytes, (uint64_t)N * SB);
        CHECK_EQ_INT(q->nvme_written_bytes, (uint64_t)N * SB);
        CHECK_EQ_INT(q->nsteps, N);
        CHECK(NEAR(q->step_median_s, s.step_us * 1e-6, 1e-6));
    }
    char out[700];
    snprintf(out, sizeof out, "%s/ranks-csv", dir);
    CHECK(mw_report_write_csv(r, out) == 0);
    snprintf(out, sizeof out, "%s/ranks-csv/ranks.csv", dir);
    CHECK_EQ_INT(count_lines(out), 1 + 2);
    snprintf(out, sizeof out, "%s/ranks.html", dir);
    CHECK(mw_report_write_html(r, out) == 0);
    char *html = read_file(out);
    REQUIRE(html);
    CHECK(strstr(html, "<h2>Ranks</h2>"));
    CHECK(strstr(html, "2 traces of world size 2, ZeRO stage 3"));
    free(html);
    mw_report_free(r);

    /* world_size differs: refused, naming the file that differs. */
    const char *mixed[] = {p0, p1, p3};
    r = (struct mw_report *)1;
    rc = mw_report_load_ranks(&r, mixed, 3, NULL);
    CHECK_EQ_INT(rc, MW_REPORT_EMISMATCH);
    CHECK(r == NULL);
    CHECK_MSG(strstr(mw_error_msg(), p3) && strstr(mw_error_msg(), "world_size 3"), "%s", mw_error_msg());
    /* The same rank twice. */
    const char *twice[] = {p0, p0};
    rc = mw_report_load_ranks(&r, twice, 2, NULL);
    CHECK_EQ_INT(rc, MW_REPORT_EMISMATCH);
    CHECK_MSG(strstr(mw_error_msg(), "rank 0 again"), "%s", mw_error_msg());
    /* A trace that cannot be read: its load error, naming it. */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none.json", dir);
    const char *gone[] = {p0, missing};
    rc = mw_report_load_ranks(&r, gone, 2, NULL);
    CHECK_EQ_INT(rc, -ENOENT);
    CHECK(strstr(mw_error_msg(), missing));
    /* Traces without rank metadata: ranked by their order. */
    snprintf(hand, sizeof hand, "%s/plain.json", dir);
    synth(hand, 1, 0, 0);
    const char *plain[] = {hand, hand};
    REQUIRE(mw_report_load_ranks(&r, plain, 2, NULL) == 0);
    CHECK_EQ_INT(r->ranks[0].rank, 0);
    CHECK_EQ_INT(r->ranks[1].rank, 1);
    CHECK_EQ_INT(r->ranks[1].world_size, -1);
    CHECK(!r->ranks[1].has_resident);
    mw_report_free(r);

    /* %r: every rank while the file exists. */
    char **paths;
    int n = mw_report_expand_ranks(pat, 1000, &paths);
    CHECK_EQ_INT(n, 2);
    if (n == 2) CHECK(!strcmp(paths[0], p0) && !strcmp(paths[1], p1));
    mw_report_paths_free(paths, n);
    snprintf(pat, sizeof pat, "%s/%%r/x.%%r.json", dir); /* every %r is replaced */
    char d0[700];
    snprintf(d0, sizeof d0, "%s/0", dir);
    REQUIRE(mkdir(d0, 0777) == 0 || errno == EEXIST);
    snprintf(d0, sizeof d0, "%s/0/x.0.json", dir);
    synth(d0, 1, 0, 0);
    n = mw_report_expand_ranks(pat, 1000, &paths);
    CHECK_EQ_INT(n, 1);
    if (n == 1) CHECK(!strcmp(paths[0], d0));
    mw_report_paths_free(paths, n);
    snprintf(pat, sizeof pat, "%s/nothing.%%r.json", dir);
    n = mw_report_expand_ranks(pat, 1000, &paths);
    CHECK_EQ_INT(n, -ENOENT);
    CHECK(paths == NULL);
    CHECK(strstr(mw_error_msg(), pat) && strstr(mw_error_msg(), "rank 0"));
}

int main(void)
{
    const char *dir = tu_scratch_dir("report_comm");
    test_hand(dir);
    test_synth(dir);
    test_no_comm(dir);
    test_ranks(dir);
    if (!tu_failures) tu_rm_rf(dir);
    TEST_END();
}
