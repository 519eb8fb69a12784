/*
 * test_report.c — `memwall report`'s analysis against traces with known figures:
 *   1. a hand-written trace whose peaks, overlap fraction, bandwidth and step figures are
 *      worked out in the comments below;
 *   2. the synthetic generator's trace (layout in src/report/synth.c), against closed forms;
 *   3. truncated / malformed / missing traces: MW_EFORMAT or -errno, message naming the file;
 *   4. the writers: HTML (self-contained, no script), CSV (row counts), text.
 * With arguments `gen STEPS PATH [RANK WORLD_SIZE]` it only writes a synthetic trace (for
 * measuring the report; with RANK and WORLD_SIZE a rank's trace with comm spans).
 */
#include "testutil.h"
#include "memwall/report.h"

#include <errno.h>
#include <math.h>

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol) * fmax(1e-12, fabs((double)(b))))

static void write_file(const char *path, const char *s, size_t n)
{
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    REQUIRE(fwrite(s, 1, n, f) == n);
    REQUIRE(fclose(f) == 0);
}

static char *read_file(const char *path, size_t *n)
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
    if (n) *n = (size_t)len;
    return b;
}

/* Times in us. Host: moments 100 B at 0, staging 50 B [10,30), activations 200 B [40,90): peak 300 B
 * at 40 us. Device (numeric tier id 0, kind 0): 4096 B weights at 5. One step [0,100): forward [0,40),
 * backward [40,70), update [70,100), offload wait [70,80).
 * I/O: read 1e6 B [20,30) (all under forward), read 1e6 B [75,85) (5 us under the wait, 5 us under
 * update), write 5e5 B [95,110) (5 us under update, 10 us after the step).
 *   whole run: I/O busy 35 us, overlap 20 us -> 4/7; compute = 100 - 10 = 90 us; wait 10 us.
 *   step 0: I/O busy 25 us, overlap 20 us -> 0.8; bytes moved (submitted in step) 2.5e6.
 *   nvme->host: 2 requests, 2e6 B, busy 20 us -> 1e11 B/s; limit 2e9 (number).
 *   host->nvme: 1 request, 5e5 B, busy 15 us; limit "1.5e9" (string).
 * Subgroup 3: read 1e6 B (so: nvme), decision cpu, predicted 12 us, measured 15 us. */
static const char *hand_trace =
    "{\"traceEvents\": [\n"
    "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"main\"}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":0,\"pid\":1,\"tid\":1,\"s\":\"t\",\"args\":{\"tier\":\"host\",\"kind\":\"moments\",\"bytes\":100,\"label\":\"m\"}},\n"
    "{\"ph\":\"C\",\"name\":\"host bytes\",\"ts\":0,\"pid\":1,\"args\":{\"value\":100}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":5,\"pid\":1,\"tid\":1,\"s\":\"t\",\"args\":{\"tier\":0,\"kind\":0,\"bytes\":4096,\"label\":\"w\"}},\n"
    "{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"step\",\"ts\":0,\"dur\":100,\"pid\":1,\"tid\":1,\"args\":{\"step\":0,\"tokens\":64}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"forward\",\"ts\":0,\"dur\":40,\"pid\":1,\"tid\":1,\"args\":{\"step\":0}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":10,\"pid\":1,\"tid\":1,\"s\":\"t\",\"args\":{\"tier\":\"host\",\"kind\":\"staging\",\"bytes\":50,\"label\":\"s\"}},\n"
    "{\"ph\":\"C\",\"name\":\"host bytes\",\"ts\":10,\"pid\":1,\"args\":{\"value\":150}},\n"
    "{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"read\",\"ts\":20,\"dur\":10,\"pid\":1,\"tid\":3,\"args\":{\"object\":\"sg3.master\",\"bytes\":1000000,\"offset\":0,\"qd\":2,\"from\":\"nvme\",\"to\":\"host\"}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"free\",\"ts\":30,\"pid\":1,\"tid\":1,\"s\":\"t\",\"args\":{\"tier\":\"host\",\"kind\":\"staging\",\"bytes\":50,\"label\":\"s\"}},\n"
    "{\"ph\":\"C\",\"name\":\"host bytes\",\"ts\":30,\"pid\":1,\"args\":{\"value\":100}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"backward\",\"ts\":40,\"dur\":30,\"pid\":1,\"tid\":1,\"args\":{\"step\":0}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":40,\"pid\":1,\"tid\":1,\"s\":\"t\",\"args\":{\"tier\":\"host\",\"kind\":\"activations\",\"bytes\":200,\"label\":\"a\"}},\n"
    "{\"ph\":\"C\",\"name\":\"host bytes\",\"ts\":40,\"pid\":1,\"args\":{\"value\":300}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"update\",\"ts\":70,\"dur\":30,\"pid\":1,\"tid\":1,\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"wait\",\"ts\":70,\"dur\":10,\"pid\":1,\"tid\":1,\"args\":{\"subgroup\":3}},\n"
    "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"read\",\"ts\":75,\"dur\":10,\"pid\":1,\"tid\":2,\"args\":{\"subgroup\":3,\"bytes\":1000000}},\n"
    "{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"read\",\"ts\":75,\"dur\":10,\"pid\":1,\"tid\":3,\"args\":{\"object\":\"sg3.master\",\"bytes\":1000000,\"offset\":0,\"qd\":4,\"from\":\"nvme\",\"to\":\"host\"}},\n"
    "{\"ph\":\"X\",\"cat\":\"decision\",\"name\":\"cpu\",\"ts\":80,\"dur\":15,\"pid\":1,\"tid\":2,\"args\":{\"subgroup\":3,\"predicted_ns\":12000,\"measured_ns\":15000}},\n"
    "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"free\",\"ts\":90,\"pid\":1,\"tid\":1,\"s\":\"t\",\"args\":{\"tier\":\"host\",\"kind\":\"activations\",\"bytes\":200,\"label\":\"a\"}},\n"
    "{\"ph\":\"C\",\"name\":\"host bytes\",\"ts\":90,\"pid\":1,\"args\":{\"value\":100}},\n"
    "{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"write\",\"ts\":95,\"dur\":15,\"pid\":1,\"tid\":3,\"args\":{\"object\":\"sg3.master\",\"bytes\":500000,\"offset\":0,\"qd\":1,\"from\":\"host\",\"to\":\"nvme\"}},\n"
    "{\"ph\":\"C\",\"name\":\"loss\",\"ts\":100,\"pid\":1,\"args\":{\"value\":3.5}}\n"
    "],\n"
    "\"metadata\": {\"tool\":\"memwall\",\"tiers\":[{\"name\":\"host\",\"budget_bytes\":1000},{\"name\":\"nvme\",\"budget_bytes\":0}],"
    "\"dropped_events\":0,\"limit.nvme->host.bytes_per_s\":2e9,\"limit.host->nvme.bytes_per_s\":\"1.5e9\"}}\n";

static int tier_idx(const struct mw_report *r, const char *n)
{
    for (int i = 0; i < r->ntiers; i++)
        if (!strcmp(r->tiers[i].name, n)) return i;
    return -1;
}

static int pair_idx(const struct mw_report *r, const char *from, const char *to)
{
    for (int i = 0; i < r->npairs; i++)
        if (!strcmp(r->pairs[i].from, from) && !strcmp(r->pairs[i].to, to)) return i;
    return -1;
}

static void test_hand(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/hand.json", dir);
    write_file(path, hand_trace, strlen(hand_trace));
    struct mw_report_opts o;
    mw_report_opts_default(&o);
    o.bins = 10;
    struct mw_report *r;
    int rc = mw_report_load(&r, path, &o);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    int host = tier_idx(r, "host"), dev = tier_idx(r, "device"), nvme = tier_idx(r, "nvme");
    REQUIRE(host >= 0 && dev >= 0 && nvme >= 0);
    CHECK(dev == 0 && host == 1 && nvme == 2); /* canonical order */
    CHECK_EQ_INT(r->tiers[host].peak_bytes, 300);
    CHECK(NEAR(r->tiers[host].peak_t_s, 40e-6, 1e-9));
    CHECK_EQ_INT(r->tiers[host].budget_bytes, 1000);
    CHECK_EQ_INT(r->tiers[host].final_bytes, 100);
    CHECK_EQ_INT(r->tiers[host].peak_by_kind[4], 200); /* activations */
    CHECK_EQ_INT(r->tiers[host].peak_by_kind[5], 50);  /* staging */
    CHECK_EQ_INT(r->tiers[host].peak_by_kind[MW_REPORT_KIND_UNTRACKED], 0);
    CHECK_EQ_INT(r->tiers[dev].peak_bytes, 4096);
    CHECK_EQ_INT(r->tiers[dev].peak_by_kind[0], 4096);
    CHECK_EQ_INT(r->tiers[nvme].peak_bytes, 0);
    /* The downsampled series keeps the peak: some bin shows 300 B on host. */
    uint64_t mx = 0;
    for (int b = 0; b < r->nbins; b++) mx = MW_MAX(mx, r->tiers[host].total[b]);
    CHECK_EQ_INT(mx, 300);

    CHECK(NEAR(r->io_busy_s, 35e-6, 1e-9));
    CHECK(NEAR(r->overlap_s, 20e-6, 1e-9));
    CHECK(NEAR(r->overlap, 20.0 / 35.0, 1e-9));
    CHECK(NEAR(r->compute_s, 90e-6, 1e-9));
    CHECK(NEAR(r->wait_s, 10e-6, 1e-9));
    CHECK_EQ_INT(r->bytes_moved, 2500000);

    REQUIRE(r->nsteps == 1);
    const struct mw_report_step *s = &r->steps[0];
    CHECK_EQ_INT(s->step, 0);
    CHECK_EQ_INT(s->tokens, 64);
    CHECK(NEAR(s->wall_s, 100e-6, 1e-9));
    CHECK(NEAR(s->phase_s[MW_PHASE_FORWARD], 40e-6, 1e-9));
    CHECK(NEAR(s->phase_s[MW_PHASE_BACKWARD], 30e-6, 1e-9));
    CHECK(NEAR(s->compute_s, 90e-6, 1e-9));
    CHECK(NEAR(s->wait_s, 10e-6, 1e-9));
    CHECK(NEAR(s->io_busy_s, 25e-6, 1e-9));
    CHECK(NEAR(s->overlap, 0.8, 1e-9));
    CHECK_EQ_INT(s->bytes_moved, 2500000);

    int rd = pair_idx(r, "nvme", "host"), wr = pair_idx(r, "host", "nvme");
    REQUIRE(rd >= 0 && wr >= 0);
    CHECK_EQ_INT(r->pairs[rd].requests, 2);
    CHECK_EQ_INT(r->pairs[rd].bytes, 2000000);
    CHECK(NEAR(r->pairs[rd].busy_s, 20e-6, 1e-9));
    CHECK(NEAR(r->pairs[rd].mean_bw, 1e11, 1e-9));
    CHECK(NEAR(r->pairs[rd].limit_bw, 2e9, 1e-12));
    CHECK(NEAR(r->pairs[rd].mean_qd, 3, 1e-12));
    CHECK_EQ_INT(r->pairs[rd].hist_count[8], 2); /* 1e6 B: (512 KiB, 1 MiB] */
    CHECK_EQ_INT(r->pairs[wr].hist_count[7], 1); /* 5e5 B: (256 KiB, 512 KiB] */
    CHECK(NEAR(r->pairs[wr].mean_bw, 5e5 / 15e-6, 1e-9));
    CHECK(NEAR(r->pairs[wr].limit_bw, 1.5e9, 1e-12));
    /* Bandwidth series conserve bytes: sum(bw * bin) = bytes. */
    for (int p = 0; p < r->npairs; p++) {
        double sum = 0;
        for (int b = 0; b < r->nbins; b++) sum += r->pairs[p].bw[b] * r->bin_s;
        CHECK_MSG(NEAR(sum, r->pairs[p].bytes, 1e-9), "pair %d: %g vs %llu", p, sum,
                  (unsigned long long)r->pairs[p].bytes);
    }
    REQUIRE(r->nsubgroups == 1);
    const struct mw_report_subgroup *g = &r->subgroups[0];
    CHECK_EQ_INT(g->id, 3);
    CHECK_EQ_INT(g->tier, nvme);
    CHECK_EQ_INT(g->n_cpu, 1);
    CHECK_EQ_INT(g->n_device, 0);
    CHECK(NEAR(g->predicted_s, 12e-6, 1e-9));
    CHECK(NEAR(g->measured_s, 15e-6, 1e-9));
    CHECK_EQ_INT(g->bytes_read, 1000000);
    CHECK_EQ_INT(r->detail_step, 0);
    CHECK_EQ_INT(r->ndetail_rects, 3 + 2 + 3); /* phases, offload wait+read, io */
    mw_report_free(r);
}

static void test_synth(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/synth.json", dir);
    struct mw_report_synth sy;
    mw_report_synth_default(&sy);
    sy.steps = 6;
    REQUIRE(mw_report_synth_write(&sy, path) == 0);
    struct mw_report *r;
    int rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    const double L = sy.step_us * 1e-6, U = 0.35 * L;
    const int S = sy.subgroups, N = (int)sy.steps;
    const double q = 0.9 * U / S, w = 0.4 * q;
    const uint64_t sg = sy.sg_bytes, SB = (uint64_t)S * sg, n = sg / sy.req_bytes;
    const double tol = 1e-6; /* the trace has ns-resolution timestamps */
    CHECK_EQ_INT(r->nsteps, N);
    CHECK_EQ_INT(r->tiers[tier_idx(r, "device")].peak_bytes, 2 * SB);
    CHECK_EQ_INT(r->tiers[tier_idx(r, "host")].peak_bytes, 3 * sg);
    CHECK_EQ_INT(r->tiers[tier_idx(r, "nvme")].peak_bytes, 3 * SB);
    CHECK_EQ_INT(r->tiers[tier_idx(r, "device")].budget_bytes, 5 * SB / 2);
    for (int i = 0; i < N; i++) {
        const struct mw_report_step *s = &r->steps[i];
        double busy = 0.1 * U + 2 * (S - 1) * w + (i > 0 ? w : 0), ov = busy - 0.1 * U;
        CHECK(NEAR(s->wall_s, L, tol));
        CHECK(NEAR(s->wait_s, 0.1 * U, tol));
        CHECK(NEAR(s->compute_s, 0.95 * L - 0.1 * U, tol));
        CHECK_MSG(NEAR(s->io_busy_s, busy, tol), "step %d: busy %g want %g", i, s->io_busy_s, busy);
        CHECK_MSG(NEAR(s->overlap, ov / busy, tol), "step %d: overlap %g want %g", i, s->overlap, ov / busy);
        CHECK_EQ_INT(s->bytes_moved, (uint64_t)(i > 0 ? 2 * S : 2 * S - 1) * sg);
    }
    double busy = N * (0.1 * U + 2 * (S - 1) * w) + N * w, ov = N * 2 * (S - 1) * w + (N - 1) * w;
    CHECK(NEAR(r->io_busy_s, busy, tol));
    CHECK(NEAR(r->overlap, ov / busy, tol));
    int rd = pair_idx(r, "nvme", "host"), wr = pair_idx(r, "host", "nvme");
    REQUIRE(rd >= 0 && wr >= 0);
    CHECK_EQ_INT(r->pairs[rd].requests, (uint64_t)N * S * n);
    CHECK_EQ_INT(r->pairs[wr].bytes, (uint64_t)N * SB);
    CHECK(NEAR(r->pairs[wr].mean_bw, sg / w, tol));
    CHECK(NEAR(r->pairs[rd].mean_bw, (double)N * SB / (N * (0.1 * U + (S - 1) * w)), tol));
    CHECK(NEAR(r->pairs[rd].limit_bw, sg / w / 0.8, 1e-5));
    CHECK(NEAR(r->pairs[wr].limit_bw, sg / w / 0.8, 1e-5));
    CHECK_EQ_INT(r->pairs[rd].hist_count[11], (uint64_t)N * S * n); /* 8 MiB: (4 MiB, 8 MiB] */
    /* Every write runs at sg / w, so the while-busy rate of every bin with writes is exactly that. */
    int busy_bins = 0, busy_ok = 1;
    for (int b = 0; b < r->nbins; b++) {
        if (r->pairs[wr].bw_busy[b] == 0) continue;
        busy_bins++;
        if (!NEAR(r->pairs[wr].bw_busy[b], sg / w, 1e-4)) {
            busy_ok = 0;
            fprintf(stderr, "bin %d: %g B/s while busy, want %g\n", b, r->pairs[wr].bw_busy[b], sg / w);
        }
    }
    CHECK(busy_ok && busy_bins > 0);
    CHECK(r->phases_resolved); /* 800 bins over 6 steps: 133 bins per step */
    REQUIRE(r->nsubgroups == S);
    for (int j = 0; j < S; j++) {
        const struct mw_report_subgroup *g = &r->subgroups[j];
        CHECK_EQ_INT(g->id, j);
        CHECK_EQ_INT(g->tier, tier_idx(r, "nvme"));
        CHECK_EQ_INT(j % 2 ? g->n_device : g->n_cpu, N);
        CHECK(NEAR(g->predicted_s / g->measured_s, 0.9, 1e-4));
        CHECK_EQ_INT(g->bytes_written, (uint64_t)N * sg);
    }
    CHECK_EQ_INT(r->detail_step, N - 1);
    {   /* --step: that step in detail, at full resolution: phases, offload spans, every request. */
        struct mw_report_opts o;
        mw_report_opts_default(&o);
        o.detail_step = 2;
        struct mw_report *d;
        REQUIRE(mw_report_load(&d, path, &o) == 0);
        CHECK_EQ_INT(d->detail_step, 2);
        CHECK(NEAR(d->detail_t0_s, 1e-3 + 2 * L, tol));
        int nio = 0;
        for (int i = 0; i < d->ndetail_rects; i++) nio += d->detail_rects[i].lane >= 6;
        CHECK_EQ_INT(nio, (int)(2 * S * n)); /* S reads + (S-1) writes + the previous step's last write */
        CHECK(!d->detail_truncated);
        mw_report_free(d);
    }

    /* Writers. */
    char out[700];
    snprintf(out, sizeof out, "%s/report.html", dir);
    CHECK(mw_report_write_html(r, out) == 0);
    size_t len = 0;
    char *html = read_file(out, &len);
    REQUIRE(html);
    CHECK(strstr(html, "<!DOCTYPE html>") == html);
    CHECK(strstr(html, "</html>"));
    CHECK(!strstr(html, "<script"));
    /* self-contained: no loaded resources (src=, stylesheets, url(...)) and no links out */
    CHECK(!strstr(html, "src=") && !strstr(html, "<link") && !strstr(html, "url(") && !strstr(html, "href="));
    CHECK(!strstr(html, "nan") && !strstr(html, "inf\""));
    int nsvg = 0;
    for (const char *p = html; (p = strstr(p, "<svg")); p++) nsvg++;
    CHECK_MSG(nsvg >= 3 + 4 + 2, "%d charts", nsvg); /* 3 tiers, timeline/bw/hist/steps, detail */
    free(html);
    snprintf(out, sizeof out, "%s/csv/sub", dir);
    CHECK(mw_report_write_csv(r, out) == 0);
    static const char *const files[] = {"tiers.csv", "memory.csv", "io_pairs.csv", "io_bandwidth.csv",
                                        "io_sizes.csv", "steps.csv", "subgroups.csv", "detail_spans.csv"};
    const int want_lines[] = {1 + 3, 1 + 3 * r->nbins, 1 + 2, 1 + 2 * r->nbins, 1 + 2 * MW_REPORT_HIST_BUCKETS,
                              1 + N, 1 + S, 1 + r->ndetail_rects};
    for (int i = 0; i < 8; i++) {
        char p[800];
        snprintf(p, sizeof p, "%s/%s", out, files[i]);
        char *c = read_file(p, NULL);
        CHECK_MSG(c != NULL, "%s missing", p);
        if (!c) continue;
        int lines = 0;
        for (char *x = c; *x; x++) lines += *x == '\n';
        CHECK_MSG(lines == want_lines[i], "%s: %d lines, want %d", files[i], lines, want_lines[i]);
        free(c);
    }
    snprintf(out, sizeof out, "%s/summary.txt", dir);
    FILE *f = fopen(out, "w+");
    REQUIRE(f);
    CHECK(mw_report_write_text(r, f) == 0);
    fclose(f);
    char *txt = read_file(out, NULL);
    REQUIRE(txt);
    CHECK(strstr(txt, "device   peak   512.00 MiB"));
    CHECK(strstr(txt, "overlap fraction"));
    CHECK(strstr(txt, "nvme->host"));
    free(txt);
    mw_report_free(r);
}

static void expect_error(const char *path, int want_rc, const char *want_msg)
{
    struct mw_report *r = (struct mw_report *)1;
    int rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == want_rc, "%s: rc %d, want %d (%s)", path, rc, want_rc, mw_error_msg());
    CHECK(r == NULL);
    CHECK_MSG(strstr(mw_error_msg(), path) != NULL, "message does not name the file: %s", mw_error_msg());
    CHECK_MSG(strstr(mw_error_msg(), want_msg) != NULL, "message lacks '%s': %s", want_msg, mw_error_msg());
    if (!rc) mw_report_free(r);
}

static void test_errors(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/missing.json", dir);
    expect_error(path, -ENOENT, "cannot open");
    size_t n = strlen(hand_trace);
    /* Truncated at several points, from inside an event to just before the final brace. */
    const size_t cuts[] = {0, 1, 20, n / 3, n / 2, n - 3};
    const char *why[] = {"empty", "truncated", "truncated", "truncated", "truncated", "truncated"};
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, "%s/cut%d.json", dir, i);
        write_file(path, hand_trace, cuts[i]);
        expect_error(path, MW_EFORMAT, why[i]);
    }
    /* Every prefix fails cleanly (the scanner never reads past the end: ASan checks in CI), and
     * every single-byte corruption either loads or fails with MW_EFORMAT, never crashes. */
    snprintf(path, sizeof path, "%s/prefix.json", dir);
    int prefix_ok = 1;
    for (size_t cut = 0; cut + 1 < n; cut += cut + 64 < n ? 5 : 1) {
        write_file(path, hand_trace, cut);
        struct mw_report *r = NULL;
        int rc = mw_report_load(&r, path, NULL);
        if (rc != MW_EFORMAT) { prefix_ok = 0; fprintf(stderr, "prefix %zu: rc %d\n", cut, rc); }
        mw_report_free(r);
    }
    CHECK(prefix_ok);
    char *mut = malloc(n + 1);
    REQUIRE(mut);
    int mut_ok = 1;
    for (size_t i = 0; i < n; i += 7) {
        memcpy(mut, hand_trace, n);
        mut[i] = "\"{}[],:x0"[i % 9];
        write_file(path, mut, n);
        struct mw_report *r = NULL;
        int rc = mw_report_load(&r, path, NULL);
        if (rc != 0 && rc != MW_EFORMAT) { mut_ok = 0; fprintf(stderr, "byte %zu: rc %d\n", i, rc); }
        mw_report_free(r);
    }
    free(mut);
    CHECK(mut_ok);
    snprintf(path, sizeof path, "%s/garbage.json", dir);
    write_file(path, "hello, world\n", 13);
    expect_error(path, MW_EFORMAT, "not a JSON trace");
    snprintf(path, sizeof path, "%s/badevent.json", dir);
    const char *bad = "{\"traceEvents\":[{\"ph\":\"X\",\"ts\":1,\"dur\":2},\n{\"ph\":\"X\",\"ts\":1,,\"dur\":2}]}";
    write_file(path, bad, strlen(bad));
    expect_error(path, MW_EFORMAT, "line 2");
    snprintf(path, sizeof path, "%s/nots.json", dir);
    const char *nots = "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"io\",\"dur\":2}]}";
    write_file(path, nots, strlen(nots));
    expect_error(path, MW_EFORMAT, "event #0");
    snprintf(path, sizeof path, "%s/noevents.json", dir);
    write_file(path, "{\"metadata\":{}}", 15);
    expect_error(path, MW_EFORMAT, "traceEvents");
    /* A bare array is a valid (Chrome) trace, and an empty one reports nothing. */
    snprintf(path, sizeof path, "%s/empty.json", dir);
    write_file(path, "[]", 2);
    struct mw_report *r;
    CHECK(mw_report_load(&r, path, NULL) == 0);
    if (r) { CHECK_EQ_INT(r->nsteps, 0); CHECK(isnan(r->overlap)); mw_report_free(r); }
}

/* Names from the trace are escaped in the HTML. */
static void test_escaping(const char *dir)
{
    char path[600], out[600];
    snprintf(path, sizeof path, "%s/esc.json", dir);
    snprintf(out, sizeof out, "%s/esc.html", dir);
    const char *tr = "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"read\",\"ts\":1,\"dur\":2,"
                     "\"args\":{\"bytes\":4096,\"from\":\"<i>x\",\"to\":\"host\"}},"
                     "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"alloc\",\"ts\":1,"
                     "\"args\":{\"tier\":\"<i>x\",\"kind\":\"staging\",\"bytes\":4096}}]}";
    write_file(path, tr, strlen(tr));
    struct mw_report *r;
    REQUIRE(mw_report_load(&r, path, NULL) == 0);
    CHECK(mw_report_write_html(r, out) == 0);
    mw_report_free(r);
    char *html = read_file(out, NULL);
    REQUIRE(html);
    CHECK(!strstr(html, "<i>"));
    CHECK(strstr(html, "&lt;i&gt;x"));
    free(html);
}

/* An update overlapped with the next forward pass: the update thread's I/O waits during the
 * forward block no one; one inside the trainer's update phase does, and so does the training
 * thread's own wait for the update (arg caller = 1). The engine's offload "step" spans stand
 * for update phases only in traces without the trainer's phases. */
static const char overlap_trace[] =
    "{\"traceEvents\":[\n"
    "{\"ph\":\"X\",\"cat\":\"step\",\"name\":\"step\",\"ts\":0,\"dur\":100,\"pid\":1,\"tid\":1,\"args\":{\"step\":1}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"forward\",\"ts\":0,\"dur\":40,\"pid\":1,\"tid\":1,\"args\":{\"step\":1}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"backward\",\"ts\":40,\"dur\":50,\"pid\":1,\"tid\":1,\"args\":{\"step\":1}},\n"
    "{\"ph\":\"X\",\"cat\":\"phase\",\"name\":\"update\",\"ts\":90,\"dur\":10,\"pid\":1,\"tid\":1,\"args\":{\"step\":1}},\n"
    "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"step\",\"ts\":0,\"dur\":30,\"pid\":1,\"tid\":2,\"args\":{}},\n"
    "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"wait\",\"ts\":5,\"dur\":10,\"pid\":1,\"tid\":2,\"args\":{}},\n"
    "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"wait\",\"ts\":20,\"dur\":4,\"pid\":1,\"tid\":1,\"args\":{\"caller\":1}},\n"
    "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"wait\",\"ts\":92,\"dur\":3,\"pid\":1,\"tid\":2,\"args\":{}}\n"
    "]}\n";

static void test_overlap(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/overlap.json", dir);
    write_file(path, overlap_trace, strlen(overlap_trace));
    struct mw_report *r;
    int rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    CHECK_MSG(NEAR(r->wait_s, 7e-6, 1e-12), "exposed wait %g s, want 7e-6 (caller 4 + inside update 3)", r->wait_s);
    REQUIRE(r->nsteps == 1);
    CHECK(NEAR(r->steps[0].exposed_wait_s, 7e-6, 1e-12));
    mw_report_free(r);
    /* Without the trainer's phases (memwall bench offload) every wait of the update thread counts. */
    static const char bench[] =
        "{\"traceEvents\":[\n"
        "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"step\",\"ts\":0,\"dur\":30,\"pid\":1,\"tid\":2,\"args\":{}},\n"
        "{\"ph\":\"X\",\"cat\":\"offload\",\"name\":\"wait\",\"ts\":5,\"dur\":10,\"pid\":1,\"tid\":2,\"args\":{}}\n"
        "]}\n";
    write_file(path, bench, strlen(bench));
    REQUIRE(mw_report_load(&r, path, NULL) == 0);
    CHECK_MSG(NEAR(r->wait_s, 10e-6, 1e-12), "bench trace: exposed wait %g s, want 1e-5", r->wait_s);
    mw_report_free(r);
}

int main(int argc, char **argv)
{
    if ((argc == 4 || argc == 6) && !strcmp(argv[1], "gen")) { /* test_report gen STEPS PATH [RANK WORLD] */
        struct mw_report_synth s;
        mw_report_synth_default(&s);
        s.steps = atoll(argv[2]);
        if (argc == 6) { s.rank = atoi(argv[4]); s.world_size = atoi(argv[5]); }
        if (mw_report_synth_write(&s, argv[3])) { fprintf(stderr, "%s\n", mw_error_msg()); return 1; }
        return 0;
    }
    const char *dir = tu_scratch_dir("report");
    test_hand(dir);
    test_overlap(dir);
    test_synth(dir);
    test_errors(dir);
    test_escaping(dir);
    if (!tu_failures) tu_rm_rf(dir);
    TEST_END();
}
