/*
 * test_offload_tensor_steps.c — per-tensor AdamW steps (mw_offload_set_tensor_steps: what the
 * Python optimizer uses to skip a parameter without a gradient and keep torch's step count per
 * parameter) and the state read and written for several regions at once
 * (mw_offload_read_regions / write_regions: each subgroup moved once):
 *   - tensors skipped, or stepped as their own step number, are bitwise what the AdamW kernel
 *     gives when each tensor is stepped alone with its own count (a skipped one is unchanged),
 *     for fp32, bf16 and 8-bit moments, in DRAM and on NVMe, with subgroups cutting through
 *     tensors;
 *   - during an armed step the entries of subgroups that have not begun may change; changing a
 *     begun one is refused and changes nothing;
 *   - 8-bit moments: tensors sharing a block with different entries are refused;
 *   - read_regions / write_regions equal read_raw / write_raw, read each subgroup once (the NVMe
 *     byte counters), and a write of every region of whole subgroups reads nothing;
 *   - pyapi: no more staging buffers than subgroups, and the default subgroup size balanced.
 */
#include <errno.h>

#include "memwall/pyapi.h"
#include "offload_util.h"

#define MAXN 1100
#define NSTEPS 6
#define NT_BIG ((1u << 22) + 1000) /* just over the engine's default subgroup size */

struct ref { /* the kernel's state, each tensor stepped alone */
    float master[MAXN], grad[MAXN];
    unsigned char m[4 * MAXN], v[4 * MAXN];
    float ms[MAXN / MW_Q8_BLOCK + 2], vs[MAXN / MW_Q8_BLOCK + 2];
};

static enum mw_optim_dtype mdt(enum mw_offload_mfmt f)
{
    return f == MW_OFFLOAD_M_BF16 ? MW_OPTIM_BF16 : f == MW_OFFLOAD_M_8BIT ? MW_OPTIM_Q8 : MW_OPTIM_F32;
}

static struct mw_adamw_hp hp_of(int t, int decay)
{
    struct mw_adamw_hp h = mw_adamw_hp_default();
    h.lr = 1e-2 / t;
    h.beta1 = 0.9;
    h.beta2 = 0.99;
    h.eps = 1e-8;
    h.weight_decay = decay ? 0.1 : 0.0;
    return h;
}

static void ref_step(struct ref *R, enum mw_offload_mfmt mf, const struct mw_offload_registry *r, int t,
                     const uint64_t *steps)
{
    struct mw_optim_format fmt = {MW_OPTIM_F32, mdt(mf), MW_OPTIM_NONE};
    struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
    for (uint32_t k = 0; k < r->n; k++) {
        const struct mw_offload_tensor *x = &r->tensors[k];
        uint64_t st = steps ? steps[k] : (uint64_t)t;
        if (!st) continue;
        struct mw_adamw_hp h = hp_of(t, !(x->flags & MW_OFFLOAD_NO_DECAY));
        h.step = (int64_t)st;
        size_t mb = mw_optim_array_bytes(fmt.moments, x->first);
        struct mw_optim_slice s = {.n = x->numel, .offset = x->first, .master = R->master + x->first,
                                   .grad = R->grad + x->first, .m = R->m + mb, .v = R->v + mb};
        if (mf == MW_OFFLOAD_M_8BIT) {
            s.m_scale = R->ms + x->first / MW_Q8_BLOCK;
            s.v_scale = R->vs + x->first / MW_Q8_BLOCK;
        }
        REQUIRE(mw_adamw_step(&fmt, &h, &s, &ex) == 0);
    }
}

static struct mw_offload *make(const struct mw_offload_registry *r, enum mw_offload_mfmt mf, const char *dir,
                               uint64_t sg, float *w, float *g)
{
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    REQUIRE(mw_offload_placement_parse(dir ? "optim=nvme" : "all=dram", &c.place) == 0);
    c.subgroup_size = sg;
    c.buffer_count = 2;
    c.moments = mf;
    c.ext_weights = w;
    c.ext_grads = g;
    c.ext_grads_accumulate = 1;
    c.nvme_dir = dir;
    c.cpu_threads = 1;
    struct mw_offload *e = NULL;
    int rc = mw_offload_init(&e, r, &c);
    CHECK_MSG(rc == 0, "init: %s", mw_error_msg());
    return rc ? NULL : e;
}

/* The engine's committed state equals the reference, bitwise. */
static void compare(struct mw_offload *e, const struct ref *R, enum mw_offload_mfmt mf, uint64_t N, const float *w,
                    const char *what, int t)
{
    static unsigned char got[4 * MAXN];
    CHECK(mw_offload_read_raw(e, MW_OFFLOAD_R_MASTER, 0, N, got) == 0);
    CHECK_MSG(!memcmp(got, R->master, 4 * N), "%s, step %d: master", what, t);
    CHECK_MSG(!memcmp(w, R->master, 4 * N), "%s, step %d: working copy", what, t);
    size_t mb = mw_optim_array_bytes(mdt(mf), N), sb = mw_optim_scale_bytes(mdt(mf), N);
    CHECK(mw_offload_read_raw(e, MW_OFFLOAD_R_EXP_AVG, 0, N, got) == 0);
    CHECK_MSG(!memcmp(got, R->m, mb), "%s, step %d: exp_avg", what, t);
    CHECK(mw_offload_read_raw(e, MW_OFFLOAD_R_EXP_AVG_SQ, 0, N, got) == 0);
    CHECK_MSG(!memcmp(got, R->v, mb), "%s, step %d: exp_avg_sq", what, t);
    if (sb) {
        CHECK(mw_offload_read_raw(e, MW_OFFLOAD_R_EXP_AVG_SCALE, 0, N, got) == 0);
        CHECK_MSG(!memcmp(got, R->ms, sb), "%s, step %d: exp_avg scales", what, t);
        CHECK(mw_offload_read_raw(e, MW_OFFLOAD_R_EXP_AVG_SQ_SCALE, 0, N, got) == 0);
        CHECK_MSG(!memcmp(got, R->vs, sb), "%s, step %d: exp_avg_sq scales", what, t);
    }
}

/* Six steps: all, tensor 1 skipped, tensor 1 at its own (smaller) count and tensor 2 skipped,
 * tensor 0 skipped, the same table kept (the counts of the others advance), then the default
 * table again (every tensor as step 6). */
static void run_steps(enum mw_offload_mfmt mf, const char *dir, const int64_t *sizes, uint64_t sg, const char *what)
{
    static const uint64_t table[NSTEPS][3] = {{1, 1, 1}, {2, 0, 2}, {3, 2, 0}, {0, 3, 3}, {0, 4, 4}, {6, 6, 6}};
    static const int given[NSTEPS] = {0, 1, 1, 1, 2, 0}; /* 0: NULL (the default), 2: not set again */
    struct mw_offload_registry r;
    ou_model(&r, sizes, 3);
    uint64_t N = r.total;
    REQUIRE(N <= MAXN);
    static struct ref R;
    static float w[MAXN], g[MAXN];
    memset(&R, 0, sizeof R);
    uint64_t seed = 11;
    for (uint64_t i = 0; i < N; i++) R.master[i] = w[i] = 0.1f * tu_randf(&seed);
    struct mw_offload *e = make(&r, mf, dir, sg, w, g);
    if (!e) { mw_offload_registry_free(&r); return; }
    for (int t = 1; t <= NSTEPS; t++) {
        for (uint64_t i = 0; i < N; i++) R.grad[i] = g[i] = tu_randf(&seed);
        const uint64_t *steps = given[t - 1] ? table[t - 1] : NULL;
        int rc = given[t - 1] == 2 ? 0 : mw_offload_set_tensor_steps(e, 3, steps);
        CHECK_MSG(rc == 0, "%s: %s", what, mw_error_msg());
        CHECK(mw_offload_backward_begin(e, 1, NULL) == 0);
        CHECK(mw_offload_backward_end(e) == 0);
        struct mw_offload_hparams h;
        mw_offload_hparams_default(&h);
        h.lr = 1e-2 / t;
        h.beta1 = 0.9;
        h.beta2 = 0.99;
        h.eps = 1e-8;
        h.weight_decay = 0.1;
        rc = mw_offload_step(e, &h);
        CHECK_MSG(rc == 0, "%s: step %d: %s", what, t, mw_error_msg());
        ref_step(&R, mf, &r, t, steps);
        compare(e, &R, mf, N, w, what, t);
    }
    CHECK_EQ_INT(mw_offload_committed_steps(e), NSTEPS);
    mw_offload_free(e);
    mw_offload_registry_free(&r);
}

/* An armed step: subgroup 0 (tensor 0) is reported and starts; then tensor 0 may not change any
 * more (DRAM: its update was handed over at once), tensor 2 (not reported) still may. */
static void run_armed(const char *dir)
{
    static const int64_t sizes[3] = {300, 200, 513};
    struct mw_offload_registry r;
    ou_model(&r, sizes, 3);
    uint64_t N = r.total;
    static struct ref R;
    static float w[MAXN], g[MAXN];
    memset(&R, 0, sizeof R);
    uint64_t seed = 5;
    for (uint64_t i = 0; i < N; i++) R.master[i] = w[i] = 0.1f * tu_randf(&seed);
    for (uint64_t i = 0; i < N; i++) R.grad[i] = g[i] = tu_randf(&seed);
    struct mw_offload *e = make(&r, MW_OFFLOAD_M_FP32, dir, 256, w, g);
    if (!e) { mw_offload_registry_free(&r); return; }
    struct mw_offload_hparams h;
    mw_offload_hparams_default(&h);
    h.lr = 1e-2;
    h.beta1 = 0.9;
    h.beta2 = 0.99;
    h.eps = 1e-8;
    h.weight_decay = 0.1;
    CHECK(mw_offload_backward_begin(e, 1, &h) == 0);
    CHECK(mw_offload_grad_ready(e, 0, 256) == 0);
    static const uint64_t skip0[3] = {0, 1, 1}, skip2[3] = {1, 1, 0};
    if (!dir) { /* DRAM: subgroup 0 went to the update engine inside grad_ready */
        CHECK_EQ_INT(mw_offload_set_tensor_steps(e, 3, skip0), -EBUSY);
        CHECK(strstr(mw_error_msg(), "subgroup 0 has begun") != NULL);
    }
    CHECK_MSG(mw_offload_set_tensor_steps(e, 3, skip2) == 0, "%s", mw_error_msg());
    CHECK(mw_offload_backward_end(e) == 0);
    CHECK_MSG(mw_offload_step(e, NULL) == 0, "%s", mw_error_msg());
    ref_step(&R, MW_OFFLOAD_M_FP32, &r, 1, skip2);
    compare(e, &R, MW_OFFLOAD_M_FP32, N, w, dir ? "armed, nvme" : "armed, dram", 1);
    /* argument checks */
    CHECK_EQ_INT(mw_offload_set_tensor_steps(e, 2, skip2), -EINVAL);
    CHECK(strstr(mw_error_msg(), "2 steps for 3 tensors") != NULL);
    uint64_t huge[3] = {1, UINT64_MAX, 1};
    CHECK_EQ_INT(mw_offload_set_tensor_steps(e, 3, huge), -EINVAL);
    CHECK(mw_offload_set_tensor_steps(e, 0, NULL) == 0);
    mw_offload_free(e);
    mw_offload_registry_free(&r);
}

/* 8-bit: tensors 0 (300 elements) and 1 share the block [256, 512). */
static void run_q8_refusal(void)
{
    static const int64_t sizes[3] = {300, 200, 513};
    struct mw_offload_registry r;
    ou_model(&r, sizes, 3);
    static float w[MAXN], g[MAXN];
    struct mw_offload *e = make(&r, MW_OFFLOAD_M_8BIT, NULL, 512, w, g);
    if (!e) { mw_offload_registry_free(&r); return; }
    static const uint64_t bad[3] = {1, 0, 1}, good[3] = {4, 4, 4};
    CHECK_EQ_INT(mw_offload_set_tensor_steps(e, 3, bad), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "tensors 0 and 1 share a block of 256 elements") != NULL, "%s", mw_error_msg());
    CHECK_MSG(mw_offload_set_tensor_steps(e, 3, good) == 0, "%s", mw_error_msg());
    mw_offload_free(e);
    mw_offload_registry_free(&r);
}

static uint64_t reads(struct mw_offload *e)
{
    struct mw_offload_stats s;
    mw_offload_stats_get(e, &s);
    return s.nvme_read_bytes;
}
static uint64_t writes(struct mw_offload *e)
{
    struct mw_offload_stats s;
    mw_offload_stats_get(e, &s);
    return s.nvme_write_bytes;
}

static void run_regions(enum mw_offload_mfmt mf, const char *dir)
{
    static const int64_t sizes[3] = {512, 256, 300};
    struct mw_offload_registry r;
    ou_model(&r, sizes, 3);
    uint64_t N = r.total;
    static float w[MAXN], g[MAXN];
    uint64_t seed = 3;
    for (uint64_t i = 0; i < N; i++) w[i] = tu_randf(&seed);
    struct mw_offload *e = make(&r, mf, dir, 256, w, g);
    if (!e) { mw_offload_registry_free(&r); return; }
    for (int t = 1; t <= 2; t++) { /* moments that are not zero */
        for (uint64_t i = 0; i < N; i++) g[i] = tu_randf(&seed);
        struct mw_offload_hparams h;
        mw_offload_hparams_default(&h);
        CHECK(mw_offload_step(e, &h) == 0);
    }
    int q8 = mf == MW_OFFLOAD_M_8BIT;
    int all[5] = {MW_OFFLOAD_R_MASTER, MW_OFFLOAD_R_EXP_AVG, MW_OFFLOAD_R_EXP_AVG_SQ, MW_OFFLOAD_R_EXP_AVG_SCALE,
                  MW_OFFLOAD_R_EXP_AVG_SQ_SCALE};
    int nall = q8 ? 5 : 3;
    static unsigned char raw[5][4 * MAXN], got[5][4 * MAXN];
    void *dst[5] = {got[0], got[1], got[2], got[3], got[4]};
    /* one read_raw: each subgroup once */
    uint64_t r0 = reads(e);
    for (int j = 0; j < nall; j++) CHECK(mw_offload_read_raw(e, all[j], 0, N, raw[j]) == 0);
    uint64_t once = (reads(e) - r0) / (uint64_t)nall;
    CHECK(dir ? once > 0 : once == 0);
    r0 = reads(e);
    CHECK_MSG(mw_offload_read_regions(e, 0, N, nall, all, dst) == 0, "%s", mw_error_msg());
    CHECK_EQ_INT(reads(e) - r0, once); /* every region, each subgroup read once */
    for (int j = 0; j < nall; j++)
        CHECK_MSG(!memcmp(raw[j], got[j], ou_region_bytes(mf, all[j], N)), "region %d", all[j]);
    /* a write of every region of whole subgroups reads nothing and writes each subgroup once */
    for (int j = 0; j < 3; j++)
        for (size_t b = 0; b < ou_region_bytes(mf, all[j], N); b++) got[j][b] ^= 0x01;
    const void *src[5] = {got[0], got[1], got[2], got[3], got[4]};
    r0 = reads(e);
    uint64_t w0 = writes(e);
    CHECK_MSG(mw_offload_write_regions(e, 0, N, nall, all, src) == 0, "%s", mw_error_msg());
    CHECK_EQ_INT(reads(e) - r0, 0);
    CHECK_EQ_INT(writes(e) - w0, once);
    for (int j = 0; j < nall; j++) {
        CHECK(mw_offload_read_raw(e, all[j], 0, N, raw[j]) == 0);
        CHECK_MSG(!memcmp(raw[j], got[j], ou_region_bytes(mf, all[j], N)), "region %d written", all[j]);
    }
    CHECK_MSG(!memcmp(w, got[0], 4 * N), "working copy after a master write");
    /* one region alone: the rest of each subgroup is read first */
    r0 = reads(e);
    CHECK(mw_offload_write_regions(e, 0, N, 1, all + 1, src + 1) == 0);
    CHECK_EQ_INT(reads(e) - r0, once);
    int dup[2] = {MW_OFFLOAD_R_EXP_AVG, MW_OFFLOAD_R_EXP_AVG};
    CHECK_EQ_INT(mw_offload_read_regions(e, 0, N, 2, dup, dst), -EINVAL);
    CHECK(strstr(mw_error_msg(), "given twice") != NULL);
    CHECK_EQ_INT(mw_offload_write_regions(e, 0, N, 0, dup, src), -EINVAL);
    int bad[1] = {7};
    CHECK_EQ_INT(mw_offload_read_regions(e, 0, N, 1, bad, dst), -EINVAL);
    mw_offload_free(e);
    mw_offload_registry_free(&r);
}

/* pyapi: staging within what the model needs. */
static void run_staging(const char *base)
{
    char dir[600], dir1[600];
    snprintf(dir, sizeof dir, "%s/a", base);
    snprintf(dir1, sizeof dir1, "%s/b", base);
    REQUIRE(mkdir(dir, 0700) == 0 && mkdir(dir1, 0700) == 0);
    static float w[NT_BIG], g[NT_BIG];
    double s[MW_PYAPI_NSTATS], s1[MW_PYAPI_NSTATS];
    uint64_t small[2] = {1000, 333};
    struct mw_offload *e = NULL, *e1 = NULL;
    /* 1333 elements: one subgroup, so one buffer (was 8) */
    CHECK_MSG(mw_pyapi_create(&e, 2, small, NULL, "optim=nvme", "fp32", "fp32", dir, 0, 0, 1, 0, 0, w, g, NULL) == 0,
              "%s", mw_error_msg());
    CHECK_MSG(mw_pyapi_create(&e1, 2, small, NULL, "optim=nvme", "fp32", "fp32", dir1, 0, 1, 1, 0, 0, w, g, NULL) == 0,
              "%s", mw_error_msg());
    if (e && e1) {
        mw_pyapi_stats(e, s, MW_PYAPI_NSTATS);
        mw_pyapi_stats(e1, s1, MW_PYAPI_NSTATS);
        CHECK(s[7] == 1 && s[11] == s1[11] && s[11] > 0);
    }
    mw_offload_free(e);
    mw_offload_free(e1);
    /* just over the default 4M elements: two subgroups of equal size, two buffers */
    uint64_t big[1] = {NT_BIG};
    e = NULL;
    CHECK_MSG(mw_pyapi_create(&e, 1, big, NULL, "optim=nvme", "fp32", "fp32", dir, 0, 0, 1, 0, 0, w, g, NULL) == 0,
              "%s", mw_error_msg());
    if (e) {
        mw_pyapi_stats(e, s, MW_PYAPI_NSTATS);
        CHECK(s[7] == 2 && s[8] == (double)((NT_BIG + 1) / 2));
        double sg = s[8]; /* two buffers of 12 bytes per element of a subgroup (rounded up a little) */
        CHECK_MSG(s[11] >= 2 * 12 * sg && s[11] < 3 * 12 * sg, "staging %.0f bytes", s[11]);
    }
    mw_offload_free(e);
    /* a subgroup size given is kept; the buffers still no more than the subgroups (3 here) */
    e = e1 = NULL;
    CHECK(mw_pyapi_create(&e, 2, small, NULL, "optim=nvme", "fp32", "fp32", dir, 512, 8, 1, 0, 0, w, g, NULL) == 0);
    CHECK(mw_pyapi_create(&e1, 2, small, NULL, "optim=nvme", "fp32", "fp32", dir1, 512, 3, 1, 0, 0, w, g, NULL) == 0);
    if (e && e1) {
        mw_pyapi_stats(e, s, MW_PYAPI_NSTATS);
        mw_pyapi_stats(e1, s1, MW_PYAPI_NSTATS);
        CHECK(s[7] == 3 && s[8] == 512 && s[11] == s1[11]);
    }
    mw_offload_free(e);
    mw_offload_free(e1);
}

int main(void)
{
    const char *dir = ou_scratch_dir("tensor-steps");
    static const int64_t cut[3] = {300, 200, 513};    /* 1013 elements, subgroups of 256 cut through them */
    static const int64_t blocks[3] = {512, 256, 300}; /* 8-bit: tensors start on blocks */
    run_steps(MW_OFFLOAD_M_FP32, NULL, cut, 256, "fp32, dram");
    run_steps(MW_OFFLOAD_M_FP32, dir, cut, 256, "fp32, nvme");
    run_steps(MW_OFFLOAD_M_BF16, NULL, cut, 256, "bf16, dram");
    run_steps(MW_OFFLOAD_M_BF16, dir, cut, 256, "bf16, nvme");
    run_steps(MW_OFFLOAD_M_FP32, dir, cut, 2048, "fp32, nvme, one subgroup");
    run_steps(MW_OFFLOAD_M_8BIT, NULL, blocks, 512, "8-bit, dram");
    run_steps(MW_OFFLOAD_M_8BIT, dir, blocks, 512, "8-bit, nvme");
    run_armed(NULL);
    run_armed(dir);
    run_q8_refusal();
    run_regions(MW_OFFLOAD_M_FP32, dir);
    run_regions(MW_OFFLOAD_M_8BIT, dir);
    run_regions(MW_OFFLOAD_M_FP32, NULL);
    run_staging(dir);
    tu_rm_rf(dir);
    TEST_END();
}
