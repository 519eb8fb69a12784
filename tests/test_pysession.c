/*
 * test_pysession.c — the whole-state session of memwall/pyapi.h (what memwall.torch.offload will
 * call), in C so that it runs under ASan+UBSan too. A foreign model (memwall/foreign.h: an
 * embedding-like unit, two blocks, a head; 1.3 M parameters in 7 tensors, some without weight
 * decay: more than one 2^20-element norm chunk, so streamed gradients are written while backward
 * still runs) is trained here the way a framework's hooks would drive it: the test computes its
 * loss and gradients itself from the weights it sees through the session's params array between
 * each unit's acquire and release (forward, and again in backward), 6 steps of 2 micro-batches
 * with clipping. It checks:
 *  - weights streamed from NVMe (a DRAM budget, subgroups of 64 Ki elements that units straddle)
 *    and resident weights with the optimizer on NVMe (the update behind the next forward) give
 *    bitwise the losses, gradient norms and final weights (read back unit by unit) of the
 *    all-DRAM session, and again after a unit is written between steps and one more step;
 *  - the same with a tied head (the embedding unit acquired again at the end of the forward,
 *    first in backward, its gradients reported last), its weights trimmed after the head's backward
 *    (streamed: the subgroups wholly inside the trimmed range read zeros at once, the shared one not);
 *  - the streamed session never holds all weights at once, and each unit's initial weights are
 *    asked for once;
 *  - a unit acquired out of order is refused naming both units (resident and streamed), as are
 *    gradients reported out of order, micro-batches out of sequence, a step without the last
 *    micro-batch, and a DRAM budget below the streamed plan (up front, with the numbers);
 *  - the foreign family is not in the registry and refuses what its caller does itself. */
#include <errno.h>
#include <math.h>

#include "memwall/common.h"
#include "memwall/foreign.h"
#include "memwall/pyapi.h"
#include "testutil.h"

#define NU 4
#define NT 7
#define NP 1300000
#define STEPS 5
#define ACCUM 2
#define CLIP 0.5 /* the first step is clipped, the third not */
#define SG 65536 /* elements per subgroup: 20 of them, which units straddle */

static const uint64_t unit_n[NU] = {200000, 450000, 450000, 200000};
static const char *const unit_names[NU] = {"embed", "blocks.0", "blocks.1", "head"};
static const int fwd[NU] = {0, 1, 2, 3}, bwd[NU] = {3, 2, 1, 0};
static const uint64_t tensor_n[NT] = {200000, 449000, 1000, 449000, 1000, 199000, 1000};
static const char *const tensor_names[NT] = {"embed.weight", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
                                             "blocks.1.bias", "head.weight", "head.bias"};
static const unsigned tensor_flags[NT] = {0, 0, MW_OFFLOAD_NO_DECAY, 0, MW_OFFLOAD_NO_DECAY, 0, MW_OFFLOAD_NO_DECAY};

static char g_dir[600];

/* The orders the sessions are opened with: untied (the default) or tied, where the head is the
 * embedding again (forward 0, 1, 2, 3, 0; backward 0 (the head's share), 3, 2, 1, then the
 * embedding's lookups, which need no weights: GPT-2's batch-major order). */
static const int fwd_tied[NU + 1] = {0, 1, 2, 3, 0}, bwd_tied[NU] = {0, 3, 2, 1};
static const int *g_fwd = fwd, *g_bwd = bwd;
static int g_nf = NU, g_nb = NU, g_tied;

static float hashf(uint64_t a, uint64_t b, uint64_t c) /* in [-1, 1) */
{
    uint64_t z = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^ (c + 1) * 0x94d049bb133111ebull;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    z ^= z >> 29;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static uint64_t unit_first(int u)
{
    uint64_t a = 0;
    for (int k = 0; k < u; k++) a += unit_n[k];
    return a;
}

static int init_calls[NU];
static int init_unit(void *user, int unit, float *dst, uint64_t n)
{
    (void)user;
    init_calls[unit]++;
    for (uint64_t i = 0; i < n; i++) dst[i] = 0.1f * hashf(7, (uint64_t)unit, i);
    return 0;
}

static struct mw_pysession *open_session(const char *weights, const char *optimizer, const char *sub, uint64_t budget)
{
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    struct mw_pysession *s = NULL;
    memset(init_calls, 0, sizeof init_calls);
    int err = mw_pysession_open(&s, NU, unit_n, unit_names, g_nf, g_fwd, g_nb, g_bwd, NT, tensor_n, tensor_names,
                                tensor_flags, init_unit, NULL, weights, optimizer, dir, budget, ACCUM, 1, SG, 2, 2);
    CHECK_MSG(err == 0, "open %s/%s: %s", weights, optimizer ? optimizer : "auto", mw_error_msg());
    return err ? NULL : s;
}

/* The inputs of micro-batch (step, micro): a fixed table read from an offset of its own. */
static float *g_x;
static double xval(int step, int micro, uint64_t i) { return g_x[(i + (uint64_t)(step * 2 + micro) * 7919) % NP]; }
static double zval(int step, int micro, uint64_t i) { return g_x[(i + (uint64_t)(step * 2 + micro) * 7919 + 104729) % NP]; }

/* At the end of the tied head's forward its weights go at once (MW_PYSESSION_TRIM_NOW), though its
 * backward needs them next: it fetches them again. After its backward (read for the last time in this
 * use): the first half
 * of the embedding unit, then all of it, trimmed (mw_pysession_unit_trim). Streamed, each subgroup
 * wholly inside the range goes at once (reads zeros), the one the unit shares with blocks.0 stays;
 * resident, nothing changes. The results stay bitwise the resident run's (main). */
static int g_streamed;
static int nonzero(const float *w, uint64_t a, uint64_t b)
{
    int n = 0;
    for (uint64_t i = a; i < b; i++) n += w[i] != 0;
    return n;
}
static void trim_head(struct mw_pysession *s)
{
    const float *w = mw_pysession_params(s);
    CHECK(nonzero(w, 0, SG) > 0); /* fetched again after the forward's trim (MW_PYSESSION_TRIM_NOW) */
    CHECK_MSG(mw_pysession_unit_trim(s, 0, 0, unit_n[0] / 2, 0) == 0, "%s", mw_error_msg());
    CHECK_MSG(g_streamed ? nonzero(w, 0, SG) == 0 && nonzero(w, SG, 2 * SG) > 0 : nonzero(w, 0, SG) > 0,
              "streamed %d: subgroup 0: %d non-zero, subgroup 1: %d", g_streamed, nonzero(w, 0, SG), nonzero(w, SG, 2 * SG));
    CHECK_MSG(mw_pysession_unit_trim(s, 0, 0, unit_n[0], 0) == 0, "%s", mw_error_msg());
    CHECK_MSG(g_streamed ? nonzero(w, 0, 3 * SG) == 0 && nonzero(w, 3 * SG, unit_n[0]) > 0 : nonzero(w, SG, 3 * SG) > 0,
              "streamed %d: %d non-zero in the unit's whole subgroups, %d in the one it shares", g_streamed,
              nonzero(w, 0, 3 * SG), nonzero(w, 3 * SG, unit_n[0]));
    CHECK(mw_pysession_unit_trim(s, 0, 0, unit_n[0] + 1, 0) == -EINVAL && strstr(mw_error_msg(), "outside unit 0"));
    CHECK(mw_pysession_unit_trim(s, 1, 0, 10, 0) == -EINVAL);
    CHECK(mw_pysession_unit_trim(s, 0, 0, 10, 2) == -EINVAL && strstr(mw_error_msg(), "flags"));
}

/* One micro-batch: loss = 0.5 (s - y)^2 + 0.5 lambda |w|^2 with s = x . w over the whole model
 * (tied: + z . w over the embedding again, as the head), read unit by unit between acquire and
 * release; the gradients added in backward, unit by unit, from the weights acquired again
 * (scaled by 1/ACCUM), each unit's reported once complete. */
static int micro_batch(struct mw_pysession *s, int step, int micro, double *loss)
{
    const double lambda = 1e-3;
    float *w = mw_pysession_params(s), *g = mw_pysession_grads(s);
    double dot = 0, sq = 0, y = hashf(3, (uint64_t)step, (uint64_t)micro);
    int err = mw_pysession_pass_begin(s, 1);
    for (int k = 0; k < g_nf && !err; k++) {
        int u = g_fwd[k], head = g_tied && k == g_nf - 1;
        uint64_t a = unit_first(u);
        if ((err = mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, u, 0))) break;
        for (uint64_t i = a; i < a + unit_n[u]; i++) {
            dot += (double)w[i] * (head ? zval(step, micro, i) : xval(step, micro, i));
            sq += head ? 0 : (double)w[i] * w[i];
        }
        if (head) { /* its weights over the "loss": gone now though the backward needs them (fetched again) */
            CHECK_MSG(mw_pysession_unit_trim(s, 0, 0, unit_n[0], MW_PYSESSION_TRIM_NOW) == 0, "%s", mw_error_msg());
            CHECK(g_streamed ? nonzero(w, 0, 3 * SG) == 0 : nonzero(w, 0, 3 * SG) > 0);
        }
        err = mw_pysession_unit(s, MW_NET_UNIT_RELEASE, u, 0);
    }
    if (err || (err = mw_pysession_backward_begin(s, micro, micro == ACCUM - 1))) return err;
    double r = dot - y;
    *loss = 0.5 * r * r + 0.5 * lambda * sq;
    for (int k = 0; k < g_nb && !err; k++) {
        int u = g_bwd[k], head = g_tied && k == 0;
        uint64_t a = unit_first(u);
        if ((err = mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, u, 1))) break;
        for (uint64_t i = a; i < a + unit_n[u]; i++)
            g[i] += (float)((r * (head ? zval(step, micro, i) : xval(step, micro, i)) + lambda * w[i]) / ACCUM);
        if (head) trim_head(s);
        if (!(err = mw_pysession_unit(s, MW_NET_UNIT_RELEASE, u, 1)) && !head) err = mw_pysession_grad_ready(s, u);
    }
    for (uint64_t i = 0; g_tied && !err && i < unit_n[0]; i++) g[i] += (float)(r * xval(step, micro, i) / ACCUM);
    if (g_tied && !err) err = mw_pysession_grad_ready(s, 0);
    int e2 = mw_pysession_backward_end(s);
    return err ? err : e2;
}

struct result { float loss[STEPS + 1]; double norm[STEPS + 1]; float w[NP], w2[NP]; double stats[MW_PYSESSION_NSTATS]; };

/* Step t: ACCUM micro-batches, the norm, AdamW with clipping. */
static int step(struct mw_pysession *s, int t, struct result *res)
{
    double sum = 0, l = 0;
    int err = 0;
    for (int a = 0; a < ACCUM && !err; a++) {
        err = micro_batch(s, t, a, &l);
        sum += l;
    }
    if (!err) err = mw_pysession_grad_norm(s, &res->norm[t]);
    if (!err) err = mw_pysession_step(s, 1e-5, 0.9, 0.95, 1e-8, 0.1, CLIP);
    res->loss[t] = (float)(sum / ACCUM);
    return err;
}

static int read_all(struct mw_pysession *s, float *w)
{
    int err = 0;
    for (int u = 0; u < NU && !err; u++) err = mw_pysession_unit_read(s, u, w + unit_first(u));
    return err;
}

static void train(const char *weights, const char *optimizer, uint64_t budget, struct result *res)
{
    char sub[64];
    snprintf(sub, sizeof sub, "%s%s-%s", g_tied ? "tied-" : "", weights, optimizer ? optimizer : "auto");
    struct mw_pysession *s = open_session(weights, optimizer, sub, budget);
    if (!s) return;
    g_streamed = !strcmp(weights, "nvme");
    CHECK_EQ_INT(mw_pysession_n_params(s), NP);
    for (int u = 0; u < NU; u++) CHECK_MSG(init_calls[u] == 1, "%s: unit %d initialised %d times", sub, u, init_calls[u]);
    int err = 0;
    for (int t = 0; t < STEPS && !err; t++) {
        err = step(s, t, res);
        CHECK_MSG(err == 0, "%s step %d: %s", sub, t, mw_error_msg());
    }
    CHECK_MSG(mw_pysession_finish(s) == 0, "%s: %s", sub, mw_error_msg());
    CHECK_MSG(!err && read_all(s, res->w) == 0, "%s: reading the units: %s", sub, mw_error_msg());
    /* A unit written between steps (load_state_dict) is what the next step starts from. */
    static float blk[450000], back[450000];
    for (int i = 0; i < 450000; i++) blk[i] = 0.05f * hashf(11, 2, (uint64_t)i);
    CHECK_MSG(mw_pysession_unit_write(s, 2, blk) == 0, "%s: %s", sub, mw_error_msg());
    CHECK(mw_pysession_unit_read(s, 2, back) == 0 && !memcmp(back, blk, sizeof blk));
    CHECK_MSG(step(s, STEPS, res) == 0, "%s: the step after the write: %s", sub, mw_error_msg());
    CHECK_MSG(read_all(s, res->w2) == 0, "%s: reading the units: %s", sub, mw_error_msg());
    CHECK_EQ_INT(mw_pysession_stats(s, res->stats, MW_PYSESSION_NSTATS), MW_PYSESSION_NSTATS);
    CHECK_EQ_INT((int)res->stats[0], STEPS + 1);
    mw_pysession_close(s);
}

/* A unit out of order, gradients out of order, micro-batches out of sequence, a step too soon. */
static void refusals(const char *weights)
{
    struct mw_pysession *s = open_session(weights, NULL, "refuse", 0);
    if (!s) return;
    CHECK(mw_pysession_backward_begin(s, 1, 1) == -EINVAL && strstr(mw_error_msg(), "expects micro-batch 0"));
    CHECK(mw_pysession_step(s, 0.01, 0.9, 0.95, 1e-8, 0, 0) == -EINVAL && strstr(mw_error_msg(), "last micro-batch"));
    for (int a = 0; a < ACCUM; a++) CHECK(!mw_pysession_backward_begin(s, a, 0) && !mw_pysession_backward_end(s));
    CHECK(mw_pysession_backward_begin(s, ACCUM, 1) == -EINVAL && strstr(mw_error_msg(), "opened for 2 (grad_accum)"));
    CHECK(mw_pysession_pass_begin(s, 1) == 0);
    CHECK(mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, 0, 0) == 0 && mw_pysession_unit(s, MW_NET_UNIT_RELEASE, 0, 0) == 0);
    int err = mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, 2, 0);
    CHECK_MSG(err == -EINVAL && strstr(mw_error_msg(), "unit 2 (blocks.1)") && strstr(mw_error_msg(), "expected 1 (blocks.0)"),
              "%s: out of order: %d %s", weights, err, mw_error_msg());
    CHECK(mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, NU, 0) == -EINVAL);
    mw_pysession_close(s);

    /* A fresh session: a whole forward, then the gradients of blocks.1 before those of the head. */
    if (!(s = open_session(weights, NULL, "refuse2", 0))) return;
    CHECK(mw_pysession_pass_begin(s, 1) == 0);
    for (int k = 0; k < NU; k++)
        CHECK(!mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, fwd[k], 0) && !mw_pysession_unit(s, MW_NET_UNIT_RELEASE, fwd[k], 0));
    CHECK(mw_pysession_backward_begin(s, 0, 1) == 0);
    CHECK(mw_pysession_grad_ready(s, 2) == 0);
    err = mw_pysession_grad_ready(s, 3);
    CHECK_MSG(err == -EINVAL && strstr(mw_error_msg(), "unit 3 (head)") && strstr(mw_error_msg(), "unit 2 (blocks.1)"),
              "%s: gradients out of order: %d %s", weights, err, mw_error_msg());
    CHECK(mw_pysession_backward_end(s) == 0);
    CHECK(mw_pysession_backward_begin(s, 1, 1) == -EINVAL && strstr(mw_error_msg(), "step() comes first"));
    mw_pysession_close(s);
}

static void family_checks(void)
{
    CHECK(mw_net_family_find("foreign") == NULL);
    for (int i = 0; mw_net_family_at(i); i++) CHECK(mw_net_family_at(i) != &mw_net_foreign);
    struct mw_foreign_desc d = {.n_units = NU, .unit_numel = unit_n, .fwd_order = fwd, .n_fwd = NU, .bwd_order = bwd,
                                .n_bwd = NU};
    struct mw_net n;
    REQUIRE(mw_net_foreign_init(&n, &d, 1) == 0);
    char name[64];
    mw_net_unit_name(&n, 2, name, sizeof name);
    CHECK(!strcmp(name, "unit.2"));
    CHECK(n.family->n_tensors(&n) == NU);
    CHECK(mw_net_forward(&n, NULL, NULL, 1, 1) == -ENOTSUP && strstr(mw_error_msg(), "runs in its caller"));
    uint8_t wire[MW_NET_CONFIG_WIRE];
    struct mw_net_config back;
    n.family->config_encode(n.cfg.raw, wire);
    CHECK(n.family->config_decode(wire, back.raw) == -ENOTSUP);
    mw_net_free(&n);
    int bad[NU] = {0, 1, 4, 3};
    d.fwd_order = bad;
    CHECK(mw_net_foreign_init(&n, &d, 1) == -EINVAL && strstr(mw_error_msg(), "names unit 4 at position 2"));
    const struct mw_foreign_tensor across[2] = {{"a", 1000, 0}, {"b", NP - 1000, 0}};
    d.fwd_order = fwd;
    d.tensors = across;
    d.n_tensors = 2;
    CHECK(mw_net_foreign_init(&n, &d, 1) == -EINVAL && strstr(mw_error_msg(), "crosses the end of unit 0"));
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", tu_scratch_dir("pysession"));
    REQUIRE((g_x = malloc(NP * sizeof *g_x)));
    for (uint64_t i = 0; i < NP; i++) g_x[i] = 0.002f * hashf(5, 0, i);
    family_checks();
    uint64_t t0 = mw_now_ns();
    static struct result dram, opt_nvme, streamed;
    train("dram", "dram", 0, &dram);
    train("dram", "nvme", 0, &opt_nvme);
    train("nvme", NULL, 256ull << 20, &streamed);
    int moved = 0;
    for (int u = 0; u < NU; u++)
        for (uint64_t i = 0; i < unit_n[u]; i++) moved += dram.w[unit_first(u) + i] != 0.1f * hashf(7, (uint64_t)u, i);
    CHECK_MSG(moved > NP / 2, "the weights hardly moved (%d of %d)", moved, NP);
    CHECK_MSG(dram.norm[0] > CLIP && dram.norm[2] < CLIP, "norms %g, %g: clipping (%g) goes untested", dram.norm[0],
              dram.norm[2], CLIP);
    const struct result *other[2] = {&opt_nvme, &streamed};
    const char *what[2] = {"optimizer on NVMe", "streamed weights"};
    for (int k = 0; k < 2; k++) {
        CHECK_MSG(!memcmp(other[k]->loss, dram.loss, sizeof dram.loss), "%s: losses differ from the all-DRAM run's", what[k]);
        CHECK_MSG(!memcmp(other[k]->norm, dram.norm, sizeof dram.norm), "%s: gradient norms differ", what[k]);
        CHECK_MSG(!memcmp(other[k]->w, dram.w, sizeof dram.w), "%s: final weights differ from the all-DRAM run's", what[k]);
        CHECK_MSG(!memcmp(other[k]->w2, dram.w2, sizeof dram.w2), "%s: the weights after a unit's write and a step differ",
                  what[k]);
    }
    for (int t = 0; t <= STEPS; t++) printf("step %d  loss %.6f  norm %.4f\n", t + 1, dram.loss[t], dram.norm[t]);
    const double *st = streamed.stats;
    printf("streamed: planned DRAM peak %.0f B, weights resident at most %.0f B of %d, fetched %.0f B, gradients "
           "written %.0f B\n", st[3], st[4], NP * 4, st[5], st[6]);
    CHECK(st[3] > 0 && st[5] > 0);
    /* With accumulation every gradient is in DRAM through the step: the update reads them there,
     * none is written to NVMe (stream.c, grads_kept) and the results above are the same bits. */
    CHECK_MSG(st[6] == 0, "accumulation %d: %.0f B of gradients written to NVMe", ACCUM, st[6]);
    CHECK_MSG(st[4] > 0 && st[4] < NP * 4.0, "streamed weights resident at once: %.0f bytes", st[4]);
    CHECK(dram.stats[3] == 0 && dram.stats[5] == 0);
    /* Tied: the embedding is the head too (fetched for both uses, its gradients reported last). */
    static struct result tied_dram, tied_streamed;
    g_fwd = fwd_tied, g_bwd = bwd_tied, g_nf = NU + 1, g_tied = 1;
    train("dram", "dram", 0, &tied_dram);
    train("nvme", NULL, 256ull << 20, &tied_streamed);
    g_fwd = fwd, g_bwd = bwd, g_nf = NU, g_tied = 0;
    CHECK_MSG(!memcmp(tied_streamed.loss, tied_dram.loss, sizeof tied_dram.loss) &&
              !memcmp(tied_streamed.w, tied_dram.w, sizeof tied_dram.w) &&
              !memcmp(tied_streamed.w2, tied_dram.w2, sizeof tied_dram.w2), "tied: the streamed run differs from the resident");
    CHECK_MSG(memcmp(tied_dram.loss, dram.loss, sizeof dram.loss), "tied: the same losses as untied: the head is not used");
    refusals("dram");
    refusals("nvme");
    /* A budget below the streamed plan: refused before anything is written, with the numbers. */
    struct mw_pysession *s = NULL;
    char dir[700];
    snprintf(dir, sizeof dir, "%s/small", g_dir);
    int err = mw_pysession_open(&s, NU, unit_n, unit_names, NU, fwd, NU, bwd, 0, NULL, NULL, NULL, init_unit, NULL,
                                "nvme", NULL, dir, 1u << 20, ACCUM, 1, SG, 2, 2);
    CHECK_MSG(err == MW_EBUDGET && s == NULL && strstr(mw_error_msg(), "DRAM budget 1.00 MiB is too small") &&
              strstr(mw_error_msg(), "at its peak"), "%d %s", err, mw_error_msg());
    printf("refused: %s\n", mw_error_msg());
    /* Bad placements and shapes fail at open with a message, leaving nothing behind. */
    err = mw_pysession_open(&s, NU, unit_n, unit_names, NU, fwd, NU, bwd, 0, NULL, NULL, NULL, NULL, NULL, "disk", NULL,
                            dir, 0, ACCUM, 1, SG, 2, 2);
    CHECK(err == -EINVAL && s == NULL && strstr(mw_error_msg(), "offload_params"));
    err = mw_pysession_open(&s, 1, unit_n, unit_names, 1, fwd, 1, fwd, 0, NULL, NULL, NULL, NULL, NULL, "nvme", NULL,
                            dir, 0, ACCUM, 1, SG, 2, 2);
    CHECK(err == -EINVAL && s == NULL && strstr(mw_error_msg(), "2 units or more"));
    err = mw_pysession_open(&s, NU, unit_n, unit_names, NU, fwd, NU, bwd, NT, tensor_n, tensor_names, tensor_flags, NULL,
                            NULL, "nvme", "dram", dir, 0, ACCUM, 1, SG, 2, 2);
    CHECK(err == -EINVAL && s == NULL && strstr(mw_error_msg(), "need the optimizer state on NVMe"));
    printf("runtime %.2f s\n", (double)(mw_now_ns() - t0) / 1e9);
    free(g_x);
    tu_rm_rf(g_dir);
    TEST_END();
}
