/*
 * synth.c — a synthetic trace with figures known in closed form, in the format of
 * docs/trace-conventions.md: what the report's tests check against and what its speed on a
 * 10,000-step run is measured with (the real producers are other subsystems).
 *
 * Layout (L = step length, S = subgroups, n = sg_bytes / req_bytes requests per object move,
 * U = 0.35 L the update phase, q = 0.9 U / S one update slot). Step i starts at s = T0 + i L:
 *   data [s, s+.05L)  forward [.05L, .35L)  backward [.35L, .65L)  update [.65L, L)
 *   update phase: wait [u0, u0+.1U) while subgroup 0 is read (exposed); then slot j at
 *   a_j = u0 + .1U + j q: update of subgroup j [a_j, a_j+q) (decision "cpu", even j, or
 *   "device", odd j, predicted 0.9 q, measured q), read of subgroup j+1 in [a_j, a_j+.4q),
 *   write of subgroup j-1 in [a_j+.4q, a_j+.8q); the last subgroup's write goes into the next
 *   step's forward phase [s'+.05L, s'+.05L+.4q) (after the last step: past its end).
 *   Each move is n back-to-back requests of req_bytes.
 * Memory: device weights S*sg/2 and host staging 3*sg at T0/2, nvme master S*sg and moments
 *   2*S*sg; per step, device activations S*sg allocated at forward start and freed in 4 equal
 *   pieces across backward, grads S*sg/2 allocated at backward start, freed at the step's end.
 *   So device peaks at 2*S*sg (backward start), host at 3*sg, nvme at 3*S*sg.
 * Ranks (world_size W > 0; P = S*sg/4 bytes, sent(x) = x/W*(W-1)): per step, reduce_scatter
 *   of P in [.35L, .45L) and of P in [.50L, .65L), with a comm "wait" [.60L, .65L) on the
 *   second (exposed); allgather of 2P in [.05L, .25L); group 3 (shard), ranks W. Counter
 *   "zero3 resident weights" 2P/W at T0/2, 2P at each forward start, 2P/W at .65L. Host staging
 *   is 3*sg + rank*req_bytes (so ranks differ); metadata rank, world_size, zero_stage 3.
 *   Per step: sent 4P/W*(W-1), comm busy .45L, exposed comm wait .05L (out of compute too).
 * Whole-run and per-step figures follow (test_report.c and test_report_comm.c spell them out).
 */
#include "report/report_internal.h"

#include <errno.h>
#include <string.h>

void mw_report_synth_default(struct mw_report_synth *s)
{
    s->steps = 10;
    s->subgroups = 4;
    s->sg_bytes = 64ull << 20;
    s->req_bytes = 8ull << 20;
    s->step_us = 100000;
    s->world_size = 0;
    s->rank = 0;
}

struct gen {
    FILE *f;
    int first;
    uint64_t tier_bytes[3];
};

static const char *const tiers[3] = {"device", "host", "nvme"};

static void sep(struct gen *g)
{
    fputs(g->first ? "\n" : ",\n", g->f);
    g->first = 0;
}

static void mem(struct gen *g, double ts, int tier, const char *kind, uint64_t bytes, int alloc, const char *label)
{
    g->tier_bytes[tier] = alloc ? g->tier_bytes[tier] + bytes : g->tier_bytes[tier] - bytes;
    sep(g);
    fprintf(g->f, "{\"ph\":\"i\",\"cat\":\"mem\",\"name\":\"%s\",\"s\":\"t\",\"ts\":%.3f,\"pid\":1,\"tid\":1,"
                  "\"args\":{\"tier\":\"%s\",\"kind\":\"%s\",\"bytes\":%llu,\"label\":\"%s\"}}",
            alloc ? "alloc" : "free", ts, tiers[tier], kind, (unsigned long long)bytes, label);
    sep(g);
    fprintf(g->f, "{\"ph\":\"C\",\"name\":\"%s bytes\",\"ts\":%.3f,\"pid\":1,\"args\":{\"value\":%llu}}",
            tiers[tier], ts, (unsigned long long)g->tier_bytes[tier]);
}

static void span(struct gen *g, const char *cat, const char *name, double t0, double t1, const char *args)
{
    sep(g);
    fprintf(g->f, "{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":2,"
                  "\"args\":{%s}}", cat, name, t0, t1 - t0, args);
}

/* One object move as n back-to-back requests in [t0, t1). */
static void move(struct gen *g, const struct mw_report_synth *s, int read, int sg, double t0, double t1)
{
    uint64_t n = s->sg_bytes / s->req_bytes;
    double d = (t1 - t0) / (double)n;
    char a[160];
    snprintf(a, sizeof a, "\"subgroup\":%d,\"bytes\":%llu", sg, (unsigned long long)s->sg_bytes);
    span(g, "offload", read ? "read" : "write", t0, t1, a);
    for (uint64_t k = 0; k < n; k++) {
        sep(g);
        fprintf(g->f, "{\"ph\":\"X\",\"cat\":\"io\",\"name\":\"%s\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":1,\"tid\":3,"
                      "\"args\":{\"object\":\"sg%d.state\",\"bytes\":%llu,\"offset\":%llu,\"qd\":1,"
                      "\"from\":\"%s\",\"to\":\"%s\"}}",
                read ? "read" : "write", t0 + (double)k * d, d, sg, (unsigned long long)s->req_bytes,
                (unsigned long long)(k * s->req_bytes), read ? "nvme" : "host", read ? "host" : "nvme");
    }
}

static void counter(struct gen *g, double ts, const char *name, uint64_t v)
{
    sep(g);
    fprintf(g->f, "{\"ph\":\"C\",\"cat\":\"counter\",\"name\":\"%s\",\"ts\":%.3f,\"pid\":1,\"tid\":1,"
                  "\"args\":{\"value\":%llu}}", name, ts, (unsigned long long)v);
}

/* One collective (or a wait on one) of a rank of W: the comm layer's span. */
static void collective(struct gen *g, const char *name, double t0, double t1, uint64_t bytes, int W)
{
    char a[160];
    if (!strcmp(name, "wait")) snprintf(a, sizeof a, "\"bytes\":%llu,\"ranks\":%d", (unsigned long long)bytes, W);
    else snprintf(a, sizeof a, "\"bytes\":%llu,\"ranks\":%d,\"group\":3,\"sent\":%llu", (unsigned long long)bytes, W,
                  (unsigned long long)(bytes / (uint64_t)W * (uint64_t)(W - 1)));
    span(g, "comm", name, t0, t1, a);
}

int mw_report_synth_write(const struct mw_report_synth *s, const char *path)
{
    if (s->steps < 1 || s->subgroups < 1 || !s->req_bytes || s->sg_bytes % s->req_bytes || s->step_us <= 0)
        return mw_error_set(-EINVAL, "synthetic trace: need steps >= 1, subgroups >= 1, sg_bytes a multiple of req_bytes");
    if (s->world_size < 0 || (s->world_size > 0 && (s->rank < 0 || s->rank >= s->world_size)))
        return mw_error_set(-EINVAL, "synthetic trace: need 0 <= rank < world_size");
    struct mw_out out;
    int rc = mw_out_open(&out, path, "the synthetic trace");
    if (rc) return rc;
    FILE *f = out.f;
    struct gen g = {.f = f, .first = 1};
    const double L = s->step_us, U = 0.35 * L, T0 = 1000;
    const int S = s->subgroups;
    const double q = 0.9 * U / S;
    const uint64_t sg = s->sg_bytes, SB = (uint64_t)S * sg, P = SB / 4;
    const int W = s->world_size;
    fputs("{\"traceEvents\":[", f);
    sep(&g);
    fputs("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"main\"}}", f);
    mem(&g, T0 / 2, 0, "weights", SB / 2, 1, "weights");
    mem(&g, T0 / 2, 1, "staging", 3 * sg + (W ? (uint64_t)s->rank * s->req_bytes : 0), 1, "staging");
    if (W) counter(&g, T0 / 2, "zero3 resident weights", 2 * P / (uint64_t)W);
    mem(&g, T0 / 2, 2, "master", SB, 1, "master");
    mem(&g, T0 / 2, 2, "moments", 2 * SB, 1, "moments");
    char a[200];
    for (int64_t i = 0; i < s->steps; i++) {
        double st = T0 + (double)i * L, u0 = st + 0.65 * L;
        snprintf(a, sizeof a, "\"step\":%lld,\"tokens\":1024", (long long)i);
        span(&g, "step", "step", st, st + L, a);
        snprintf(a, sizeof a, "\"step\":%lld", (long long)i);
        span(&g, "phase", "data", st, st + 0.05 * L, a);
        span(&g, "phase", "forward", st + 0.05 * L, st + 0.35 * L, a);
        span(&g, "phase", "backward", st + 0.35 * L, st + 0.65 * L, a);
        span(&g, "phase", "update", u0, st + L, a);
        mem(&g, st + 0.05 * L, 0, "activations", SB, 1, "activations");
        if (i > 0) move(&g, s, 0, S - 1, st + 0.05 * L, st + 0.05 * L + 0.4 * q);
        mem(&g, st + 0.35 * L, 0, "grads", SB / 2, 1, "grads");
        for (int k = 0; k < 4; k++)
            mem(&g, st + 0.35 * L + (k + 1) * 0.3 * L / 4, 0, "activations", SB / 4, 0, "activations");
        span(&g, "offload", "wait", u0, u0 + 0.1 * U, "\"subgroup\":0");
        move(&g, s, 1, 0, u0, u0 + 0.1 * U);
        for (int j = 0; j < S; j++) {
            double aj = u0 + 0.1 * U + j * q;
            snprintf(a, sizeof a, "\"subgroup\":%d,\"bytes\":%llu", j, (unsigned long long)sg);
            span(&g, "offload", "update", aj, aj + q, a);
            snprintf(a, sizeof a, "\"subgroup\":%d,\"predicted_ns\":%lld,\"measured_ns\":%lld", j,
                     (long long)(0.9 * q * 1e3 + 0.5), (long long)(q * 1e3 + 0.5));
            span(&g, "decision", j % 2 ? "device" : "cpu", aj, aj + q, a);
            if (j + 1 < S) move(&g, s, 1, j + 1, aj, aj + 0.4 * q);
            if (j >= 1) move(&g, s, 0, j - 1, aj + 0.4 * q, aj + 0.8 * q);
        }
        mem(&g, st + L, 0, "grads", SB / 2, 0, "grads");
        if (W) {
            counter(&g, st + 0.05 * L, "zero3 resident weights", 2 * P);
            collective(&g, "allgather", st + 0.05 * L, st + 0.25 * L, 2 * P, W);
            collective(&g, "reduce_scatter", st + 0.35 * L, st + 0.45 * L, P, W);
            collective(&g, "reduce_scatter", st + 0.50 * L, st + 0.65 * L, P, W);
            collective(&g, "wait", st + 0.60 * L, st + 0.65 * L, P, W);
            counter(&g, st + 0.65 * L, "zero3 resident weights", 2 * P / (uint64_t)W);
        }
    }
    move(&g, s, 0, S - 1, T0 + (double)s->steps * L + 0.05 * L, T0 + (double)s->steps * L + 0.05 * L + 0.4 * q);
    double bw = (double)sg / (0.4 * q * 1e-6);
    fprintf(f, "\n],\n\"metadata\":{\"tool\":\"memwall\",\"tiers\":[{\"name\":\"device\",\"budget_bytes\":%llu},"
               "{\"name\":\"host\",\"budget_bytes\":%llu},{\"name\":\"nvme\",\"budget_bytes\":%llu}],"
               "\"dropped_events\":0,\"limit.nvme->host.bytes_per_s\":%.6g,\"limit.host->nvme.bytes_per_s\":\"%.6g\"",
            (unsigned long long)(5 * SB / 2), (unsigned long long)(4 * sg), (unsigned long long)(4 * SB),
            bw / 0.8, bw / 0.8);
    if (W) fprintf(f, ",\"rank\":\"%d\",\"world_size\":\"%d\",\"zero_stage\":\"3\"", s->rank, W);
    fputs("}}\n", f);
    return mw_out_close(&out);
}
