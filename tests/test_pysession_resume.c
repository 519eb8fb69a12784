/*
 * test_pysession_resume.c — the session's commit records and resume (memwall/pyapi.h,
 * mw_pysession_open2 / state_read / state_write / end; what memwall.torch.offload(resume=) and
 * OffloadAdamW.state_dict() call), in C so that ASan+UBSan see it.
 *
 * A foreign model of 3 units (40 Ki parameters, subgroups of 4096 that units straddle) is trained
 * with a quadratic loss computed from the weights seen between each unit's acquire and release,
 * weights streamed and the optimizer on NVMe (the update behind the next forward), 2 micro-batches
 * a step. Checked:
 *  - 2 steps, the session closed without end (its files and record stay), reopened with resume:
 *    step count 2, and 2 more steps give the losses and final weights of 4 uninterrupted steps, bit
 *    for bit; a step abandoned halfway (a micro-batch's backward, no step) is not committed;
 *  - the moments and step count read from one session (state_read) and written into a fresh one
 *    with its weights (state_write, unit_write) continue bitwise the same way (a framework's
 *    checkpoint);
 *  - refusals: resume with nothing committed (-ENOENT), a fresh session over a committed state
 *    (-EEXIST, naming its step), another model description (a unit renamed), another placement
 *    (resident weights), resume with the optimizer in DRAM, a record whose session part is not a
 *    session's or disagrees with the engine's step (crc32c fixed so that only that is wrong);
 *  - end() removes the record and the store files. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memwall/common.h"
#include "memwall/pyapi.h"
#include "testutil.h"

#define NU 3
#define NP 40960
#define ACCUM 2
#define SG 4096
#define STEPS 4

static const uint64_t unit_n[NU] = {10000, 20960, 10000};
static const char *const names_a[NU] = {"embed", "block", "head"};
static const char *const names_b[NU] = {"embed", "block.renamed", "head"};
static const int order_f[NU] = {0, 1, 2}, order_b[NU] = {2, 1, 0};
static char g_dir[600];

static float hashf(uint64_t a, uint64_t b)
{
    uint64_t z = (a + 1) * 0x9e3779b97f4a7c15ull ^ (b + 7) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    z ^= z >> 29;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int init_unit(void *user, int unit, float *dst, uint64_t n)
{
    (void)user;
    for (uint64_t i = 0; i < n; i++) dst[i] = 0.05f * hashf((uint64_t)unit, i);
    return 0;
}

static int open_s(struct mw_pysession **s, const char *sub, const char *weights, const char *optimizer, int resume,
                  const char *const *names)
{
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    return mw_pysession_open2(s, NU, unit_n, names, NU, order_f, NU, order_b, 0, NULL, NULL, NULL, init_unit, NULL,
                              weights, optimizer, dir, 0, ACCUM, 1, SG, 2, 1, resume, NULL);
}

static uint64_t first_of(int u) { uint64_t a = 0; for (int k = 0; k < u; k++) a += unit_n[k]; return a; }

/* Micro-batch (t, a): loss 0.5 (x.w - y)^2 over the model, read and differentiated unit by unit. */
static int micro(struct mw_pysession *s, int t, int a, double *loss)
{
    float *w = mw_pysession_params(s), *g = mw_pysession_grads(s);
    double dot = 0, y = hashf(99, (uint64_t)(t * 2 + a));
    int err = mw_pysession_pass_begin(s, 1);
    for (int u = 0; u < NU && !err; u++) {
        if ((err = mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, u, 0))) break;
        for (uint64_t i = first_of(u); i < first_of(u) + unit_n[u]; i++) dot += (double)w[i] * hashf(1000 + (uint64_t)(t * 2 + a), i);
        err = mw_pysession_unit(s, MW_NET_UNIT_RELEASE, u, 0);
    }
    if (err || (err = mw_pysession_backward_begin(s, a, a == ACCUM - 1))) return err;
    double r = dot - y;
    *loss = 0.5 * r * r;
    for (int u = NU - 1; u >= 0 && !err; u--) {
        if ((err = mw_pysession_unit(s, MW_NET_UNIT_ACQUIRE, u, 1))) break;
        for (uint64_t i = first_of(u); i < first_of(u) + unit_n[u]; i++)
            g[i] += (float)(r * hashf(1000 + (uint64_t)(t * 2 + a), i) / ACCUM);
        if (!(err = mw_pysession_unit(s, MW_NET_UNIT_RELEASE, u, 1))) err = mw_pysession_grad_ready(s, u);
    }
    int e2 = mw_pysession_backward_end(s);
    return err ? err : e2;
}

/* Steps from..to-1 (loss[t] their first micro-batch's); 0 or the first error. */
static int train(struct mw_pysession *s, int from, int to, double *loss)
{
    int err = 0;
    for (int t = from; t < to && !err; t++) {
        double l = 0;
        for (int a = 0; a < ACCUM && !err; a++) {
            err = micro(s, t, a, &l);
            if (a == 0) loss[t] = l;
        }
        if (!err) err = mw_pysession_step(s, 2e-3, 0.9, 0.95, 1e-8, 0.1, 0);
    }
    return err;
}

static void weights_of(struct mw_pysession *s, float *w)
{
    for (int u = 0; u < NU; u++) CHECK_MSG(mw_pysession_unit_read(s, u, w + first_of(u)) == 0, "%s", mw_error_msg());
}

static double steps_of(struct mw_pysession *s)
{
    double st[1];
    return mw_pysession_stats(s, st, 1) == 1 ? st[0] : -1;
}

static int exists_in(const char *sub, const char *name)
{
    char p[800];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s/%s", g_dir, sub, name);
    return stat(p, &st) == 0;
}

/* Rewrites the record of `sub` with the session part changed at blob offset `at` (xor `x`), its
 * crc32c fixed: only the session's part is wrong. The blob is the record's last 8 + 8 + 128 + 16
 * bytes before the crc. */
static void tamper_blob(const char *sub, size_t at, uint8_t x)
{
    char p[800];
    snprintf(p, sizeof p, "%s/%s/memwall-offload.commit", g_dir, sub);
    FILE *f = fopen(p, "r+b");
    REQUIRE(f);
    uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    REQUIRE(n > 200 && n < sizeof buf);
    size_t blob = n - 4 - (8 + 8 + MW_NET_CONFIG_WIRE + 16);
    buf[blob + at] ^= x;
    uint32_t crc = mw_crc32c(0, buf, n - 4);
    for (int i = 0; i < 4; i++) buf[n - 4 + (size_t)i] = (uint8_t)(crc >> (8 * i));
    REQUIRE(fseek(f, 0, SEEK_SET) == 0 && fwrite(buf, 1, n, f) == n);
    fclose(f);
}

static void refusals(void)
{
    struct mw_pysession *s = NULL;
    CHECK_EQ_INT(open_s(&s, "none", "nvme", NULL, 1, names_a), -ENOENT);
    CHECK_MSG(strstr(mw_error_msg(), "nothing to resume"), "%s", mw_error_msg());
    CHECK_EQ_INT(open_s(&s, "b", "nvme", NULL, 0, names_a), -EEXIST);
    CHECK_MSG(strstr(mw_error_msg(), "(step 2)"), "%s", mw_error_msg());
    CHECK_EQ_INT(open_s(&s, "b", "nvme", NULL, 1, names_b), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "another model description"), "%s", mw_error_msg());
    CHECK_EQ_INT(open_s(&s, "b", "dram", "nvme", 1, names_a), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "weights streamed"), "%s", mw_error_msg());
    CHECK_EQ_INT(open_s(&s, "b", "dram", "dram", 1, names_a), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "optimizer state on NVMe"), "%s", mw_error_msg());
    tamper_blob("b", 0, 0x20); /* the magic */
    CHECK_EQ_INT(open_s(&s, "b", "nvme", NULL, 1, names_a), MW_EFORMAT);
    CHECK_MSG(strstr(mw_error_msg(), "not written by a PyTorch session"), "%s", mw_error_msg());
    tamper_blob("b", 0, 0x20);
    tamper_blob("b", 8, 0x01); /* the session's step */
    CHECK_EQ_INT(open_s(&s, "b", "nvme", NULL, 1, names_a), MW_EFORMAT);
    CHECK_MSG(strstr(mw_error_msg(), "is not the engine's"), "%s", mw_error_msg());
    tamper_blob("b", 8, 0x01);
    CHECK(s == NULL);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", tu_scratch_dir("pysession_resume"));
    static float ref_w[NP], w[NP], m[NP], v[NP];
    double ref_loss[STEPS], loss[STEPS];
    struct mw_pysession *s = NULL;

    /* The uninterrupted run; end() removes its state. */
    REQUIRE(open_s(&s, "a", "nvme", NULL, 0, names_a) == 0);
    CHECK_EQ_INT(mw_pysession_resumable(s), 1);
    CHECK_MSG(train(s, 0, STEPS, ref_loss) == 0, "%s", mw_error_msg());
    weights_of(s, ref_w);
    CHECK(exists_in("a", "memwall-offload.commit"));
    CHECK_EQ_INT(mw_pysession_end(s), 0);
    CHECK(!exists_in("a", "memwall-offload.commit"));
    mw_pysession_close(s);
    CHECK(!exists_in("a", "memwall-offload.0.dat"));

    /* 2 steps, closed without end: the state stays; a resume continues bitwise. */
    REQUIRE(open_s(&s, "b", "nvme", NULL, 0, names_a) == 0);
    CHECK(train(s, 0, 2, loss) == 0);
    mw_pysession_close(s);
    CHECK(exists_in("b", "memwall-offload.commit") && exists_in("b", "memwall-offload.0.dat"));
    refusals();
    /* A step abandoned after its first micro-batch's backward: not committed. */
    REQUIRE(open_s(&s, "b", "nvme", NULL, 1, names_a) == 0);
    CHECK(steps_of(s) == 2);
    double l;
    CHECK(micro(s, 2, 0, &l) == 0);
    CHECK(l == ref_loss[2]);
    mw_pysession_close(s);
    REQUIRE(open_s(&s, "b", "nvme", NULL, 2, names_a) == 0); /* auto */
    CHECK(steps_of(s) == 2);
    CHECK_MSG(train(s, 2, STEPS, loss) == 0, "%s", mw_error_msg());
    for (int t = 2; t < STEPS; t++) CHECK_MSG(loss[t] == ref_loss[t], "step %d: %.17g vs %.17g", t, loss[t], ref_loss[t]);
    weights_of(s, w);
    CHECK(memcmp(w, ref_w, sizeof w) == 0);
    CHECK_EQ_INT(mw_pysession_end(s), 0);
    mw_pysession_close(s);

    /* By content: step 2's weights, moments and step count into a fresh session. */
    REQUIRE(open_s(&s, "c", "nvme", NULL, 0, names_a) == 0);
    CHECK(train(s, 0, 2, loss) == 0);
    CHECK_MSG(mw_pysession_state_read(s, 0, NP, m, v) == 0, "%s", mw_error_msg());
    CHECK_EQ_INT(mw_pysession_state_read(s, 1, NP, m, v), -EINVAL); /* past the end */
    weights_of(s, w);
    CHECK_EQ_INT(mw_pysession_end(s), 0);
    mw_pysession_close(s);
    REQUIRE(open_s(&s, "d", "nvme", NULL, 0, names_a) == 0);
    for (int u = 0; u < NU; u++) CHECK(mw_pysession_unit_write(s, u, w + first_of(u)) == 0);
    CHECK_EQ_INT(mw_pysession_state_write(s, 0, NP, m, v, -1), -EINVAL);
    CHECK_MSG(mw_pysession_state_write(s, 0, NP, m, v, 2) == 0, "%s", mw_error_msg());
    CHECK(steps_of(s) == 2);
    mw_pysession_close(s); /* and through the record: a resume sees what was written */
    REQUIRE(open_s(&s, "d", "nvme", NULL, 1, names_a) == 0);
    CHECK(steps_of(s) == 2);
    CHECK(train(s, 2, STEPS, loss) == 0);
    for (int t = 2; t < STEPS; t++) CHECK_MSG(loss[t] == ref_loss[t], "step %d", t);
    weights_of(s, w);
    CHECK(memcmp(w, ref_w, sizeof w) == 0);
    /* Inside a step: refused. */
    CHECK(micro(s, STEPS, 0, &l) == 0);
    CHECK_EQ_INT(mw_pysession_state_read(s, 0, NP, m, v), -EINVAL);
    CHECK_EQ_INT(mw_pysession_end(s), 0);
    mw_pysession_close(s);

    tu_rm_rf(g_dir);
    TEST_END();
}
