/*
 * test_report_recorder.c — the report reads what the real recorder (memwall/trace.h) writes:
 * tiers and kinds by name, "<tier> bytes" counters with args {bytes}, metadata limits as
 * strings, span args as integers, the ring's dropped events. Times of spans and I/O are given
 * explicitly, so the figures are exact; allocations are stamped by the recorder (now), so only
 * their bytes are checked.
 */
#include "testutil.h"
#include "memwall/report.h"
#include "memwall/tier.h"
#include "memwall/trace.h"

#include <math.h>

#define NEAR(a, b) (fabs((double)(a) - (double)(b)) <= 1e-6 * fmax(1e-12, fabs((double)(b))))

static int tier_idx(const struct mw_report *r, const char *n)
{
    for (int i = 0; i < r->ntiers; i++)
        if (!strcmp(r->tiers[i].name, n)) return i;
    return -1;
}

static void span(struct mw_trace *tr, const char *cat, const char *name, uint64_t base, int a_us, int b_us,
                 const char *k1, int64_t v1, const char *k2, int64_t v2)
{
    struct mw_trace_arg args[2] = {{k1, v1}, {k2, v2}};
    mw_trace_span(tr, cat, name, base + (uint64_t)a_us * 1000, base + (uint64_t)b_us * 1000, args, k2 ? 2 : 1);
}

int main(void)
{
    const char *dir = tu_scratch_dir("report_recorder");
    char path[700];
    snprintf(path, sizeof path, "%s/trace.json", dir);

    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 4096) == 0);
    mw_trace_set_tier(tr, MW_TIER_DRAM, "host", 1ull << 30);
    mw_trace_set_tier(tr, MW_TIER_NVME, "nvme", 0);
    mw_trace_meta(tr, "limit.nvme->host.bytes_per_s", "2e9");
    mw_trace_alloc(tr, MW_TIER_DRAM, MW_KIND_MOMENTS, 1000, "m", 1000);
    mw_trace_alloc(tr, MW_TIER_DRAM, MW_KIND_STAGING, 500, "s", 1500);
    mw_trace_free_event(tr, MW_TIER_DRAM, MW_KIND_STAGING, 500, "s", 1000);
    mw_trace_alloc(tr, MW_TIER_DEVICE, MW_KIND_WEIGHTS, 4096, "w", 4096);
    uint64_t base = mw_trace_now(tr) + 1000000;
    span(tr, "step", "step", base, 0, 100, "step", 7, "tokens", 256);
    span(tr, "phase", "forward", base, 0, 40, "step", 7, NULL, 0);
    span(tr, "phase", "backward", base, 40, 70, "step", 7, NULL, 0);
    span(tr, "phase", "update", base, 70, 100, "step", 7, NULL, 0);
    span(tr, "offload", "wait", base, 70, 80, "subgroup", 2, NULL, 0);
    span(tr, "decision", "device", base, 80, 90, "subgroup", 2, "predicted_ns", 8000);
    /* Read [20, 30) under forward; write [75, 85): 5 us under the wait, 5 us under update. */
    struct mw_trace_io io = {.op = MW_TRACE_READ, .from_tier = MW_TIER_NVME, .to_tier = MW_TIER_DRAM,
                             .bytes = 1 << 20, .offset = 0, .queue_depth = 3, .submit_ns = base + 20000,
                             .complete_ns = base + 30000, .object = "sg2.master"};
    mw_trace_io(tr, &io);
    io.op = MW_TRACE_WRITE; io.from_tier = MW_TIER_DRAM; io.to_tier = MW_TIER_NVME;
    io.submit_ns = base + 75000; io.complete_ns = base + 85000;
    mw_trace_io(tr, &io);
    REQUIRE(mw_trace_write(tr, path) == 0);
    mw_trace_free(tr);

    struct mw_report *r;
    int rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    REQUIRE(rc == 0);
    int host = tier_idx(r, "host"), dev = tier_idx(r, "device");
    REQUIRE(host >= 0 && dev >= 0);
    CHECK_EQ_INT(r->tiers[host].peak_bytes, 1500);
    CHECK_EQ_INT(r->tiers[host].final_bytes, 1000);
    CHECK_EQ_INT(r->tiers[host].budget_bytes, 1ull << 30);
    CHECK_EQ_INT(r->tiers[host].peak_by_kind[MW_KIND_STAGING], 500);
    CHECK_EQ_INT(r->tiers[host].peak_by_kind[MW_REPORT_KIND_UNTRACKED], 0);
    CHECK_EQ_INT(r->tiers[dev].peak_by_kind[MW_KIND_WEIGHTS], 4096);
    CHECK(r->tiers[host].has_counter);
    REQUIRE(r->nsteps == 1);
    CHECK_EQ_INT(r->steps[0].step, 7);
    CHECK_EQ_INT(r->steps[0].tokens, 256);
    CHECK(NEAR(r->steps[0].io_busy_s, 20e-6));
    CHECK(NEAR(r->steps[0].overlap, 15.0 / 20.0));
    CHECK(NEAR(r->steps[0].wait_s, 10e-6));
    CHECK_EQ_INT(r->steps[0].bytes_moved, 2 << 20);
    CHECK_EQ_INT(r->npairs, 2);
    for (int p = 0; p < r->npairs; p++) {
        CHECK_EQ_INT(r->pairs[p].requests, 1);
        CHECK(NEAR(r->pairs[p].mean_bw, (double)(1 << 20) / 10e-6));
        if (!strcmp(r->pairs[p].from, "nvme")) CHECK(NEAR(r->pairs[p].limit_bw, 2e9));
        else CHECK(r->pairs[p].limit_bw == 0);
    }
    REQUIRE(r->nsubgroups == 1);
    CHECK_EQ_INT(r->subgroups[0].id, 2);
    CHECK_EQ_INT(r->subgroups[0].n_device, 1);
    CHECK(NEAR(r->subgroups[0].predicted_s, 8e-6));
    CHECK(NEAR(r->subgroups[0].measured_s, 10e-6)); /* no measured_ns: the span's duration */
    CHECK_EQ_INT(r->dropped_events, 0);
    mw_report_free(r);

    /* A ring that wrapped: the report still loads and says how many events were lost. */
    REQUIRE(mw_trace_init(&tr, 16) == 0);
    base = mw_trace_now(tr);
    for (int i = 0; i < 100; i++) span(tr, "phase", "forward", base, i, i + 1, "step", i, NULL, 0);
    REQUIRE(mw_trace_write(tr, path) == 0);
    mw_trace_free(tr);
    rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    if (!rc) {
        CHECK_MSG(r->dropped_events >= 100 - 16, "dropped %llu", (unsigned long long)r->dropped_events);
        mw_report_free(r);
    }
    /* The names producers used before docs/trace-conventions.md are read as their aliases. */
    REQUIRE(mw_trace_init(&tr, 256) == 0);
    base = mw_trace_now(tr);
    span(tr, "train", "step", base, 0, 100, "step", 3, "tokens", 512);
    span(tr, "offload", "step", base, 60, 100, "step", 3, NULL, 0);         /* = phase update */
    span(tr, "offload", "sg_read", base, 60, 70, "sg", 5, "bytes", 4096);   /* = offload read */
    struct mw_trace_arg ua[4] = {{"sg", 5}, {"device", 1}, {"predicted_us", 9}, {"measured_us", 10}};
    mw_trace_span(tr, "offload", "update", base + 70000, base + 80000, ua, 4);
    span(tr, "offload", "h2d", base, 70, 72, "sg", 5, "bytes", 8192);       /* = io host->device */
    span(tr, "offload", "d2h", base, 78, 80, "sg", 5, "bytes", 8192);       /* = io device->host */
    mw_trace_counter(tr, "offload nvme read bytes", base + 90000, 4096);    /* not a tier */
    REQUIRE(mw_trace_write(tr, path) == 0);
    mw_trace_free(tr);
    rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    if (!rc) {
        CHECK_EQ_INT(r->nsteps, 1);
        if (r->nsteps) {
            CHECK_EQ_INT(r->steps[0].tokens, 512);
            CHECK(NEAR(r->steps[0].phase_s[MW_PHASE_UPDATE], 40e-6));
            CHECK(NEAR(r->steps[0].io_busy_s, 4e-6));
            CHECK(NEAR(r->steps[0].overlap, 1.0));
        }
        CHECK_EQ_INT(r->npairs, 2);
        CHECK_EQ_INT(r->ntiers, 2); /* host, device: from the transfers only */
        REQUIRE(r->nsubgroups == 1);
        CHECK_EQ_INT(r->subgroups[0].id, 5);
        CHECK_EQ_INT(r->subgroups[0].n_device, 1);
        CHECK_EQ_INT(r->subgroups[0].bytes_read, 4096);
        CHECK(NEAR(r->subgroups[0].predicted_s, 9e-6));
        CHECK(NEAR(r->subgroups[0].measured_s, 10e-6));
        mw_report_free(r);
    }
    /* Without step spans, the offload engine's "step" spans are the steps. */
    REQUIRE(mw_trace_init(&tr, 256) == 0);
    base = mw_trace_now(tr);
    span(tr, "offload", "step", base, 0, 50, "step", 1, NULL, 0);
    span(tr, "offload", "step", base, 60, 100, "step", 2, NULL, 0);
    REQUIRE(mw_trace_write(tr, path) == 0);
    mw_trace_free(tr);
    rc = mw_report_load(&r, path, NULL);
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    if (!rc) {
        CHECK_EQ_INT(r->nsteps, 2);
        if (r->nsteps == 2) {
            CHECK_EQ_INT(r->steps[1].step, 2);
            CHECK(NEAR(r->steps[1].phase_s[MW_PHASE_UPDATE], 40e-6));
        }
        mw_report_free(r);
    }
    if (!tu_failures) tu_rm_rf(dir);
    TEST_END();
}
