/*
 * test_pyapi.c — the flat wrappers of memwall/pyapi.h (what the Python package calls), in C so
 * that they run under ASan+UBSan too: an engine made from scalars and strings steps bitwise as
 * the AdamW kernel does on the same flat arrays (fp32 and bf16 working copies, DRAM and NVMe),
 * the counters come back in their documented order, and bad arguments fail with a message; with
 * mw_offload_set_release the results are the same and the gradients read zero after each step.
 */
#include <errno.h>
#include <math.h>

#include "memwall/common.h"
#include "memwall/optim.h"
#include "memwall/pyapi.h"
#include "testutil.h"

#define N0 1000
#define N1 333
#define NT (N0 + N1)

static uint16_t bf16_of(float f) /* round to nearest even, as the kernels (finite inputs) */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void run(const char *placement, const char *wfmt, const char *dir, int release)
{
    static float w32[NT], grads[NT], gref[NT], master[NT], m[NT], v[NT];
    static uint16_t w16[NT], wref[NT];
    uint64_t seed = 7;
    int bf16 = !strcmp(wfmt, "bf16");
    for (int i = 0; i < NT; i++) {
        master[i] = 0.1f * tu_randf(&seed);
        w32[i] = master[i];
        m[i] = v[i] = 0;
    }
    for (int i = 0; i < NT && bf16; i++) { /* the master starts from the bf16 working copy's values */
        w16[i] = bf16_of(master[i]);
        uint32_t u = (uint32_t)w16[i] << 16;
        memcpy(&master[i], &u, 4);
    }
    uint64_t numel[2] = {N0, N1};
    struct mw_offload *e = NULL;
    int rc = mw_pyapi_create(&e, 2, numel, NULL, placement, "fp32", wfmt, dir, 512, 2, 1, 0, 0,
                             bf16 ? (void *)w16 : (void *)w32, grads, NULL);
    CHECK_MSG(rc == 0, "%s %s: %s", placement, wfmt, mw_error_msg());
    if (rc) return;
    if (bf16) CHECK(mw_offload_set_master(e, 0, NT, master) == 0);
    /* release: gradients (and staging) given back after each update; results unchanged */
    CHECK(mw_offload_set_release(e, release, release) == 0);
    struct mw_optim_format fmt = {MW_OPTIM_F32, MW_OPTIM_F32, bf16 ? MW_OPTIM_BF16 : MW_OPTIM_NONE};
    for (int t = 1; t <= 3; t++) {
        for (int i = 0; i < NT; i++) gref[i] = grads[i] = tu_randf(&seed);
        CHECK(mw_pyapi_backward_begin(e, 0, 0, 0, 0, 0, 0, 1.0f) == 0);
        CHECK(mw_offload_backward_end(e) == 0);
        CHECK_MSG(mw_pyapi_step(e, 0, 1e-2 / t, 0.9, 0.99, 1e-8, 0.1, 1.0f) == 0, "%s", mw_error_msg());
        int zero = 1;
        for (int i = 0; i < NT; i++) zero &= grads[i] == 0.0f;
        CHECK_MSG(zero == release, "%s: gradients %s after the step", placement, zero ? "zeroed" : "kept");
        struct mw_adamw_hp hp = {1e-2 / t, 0.9, 0.99, 1e-8, 0.1, t, 1.0f};
        struct mw_optim_slice sl = {.n = NT, .master = master, .grad = gref, .m = m, .v = v,
                                    .weights_out = bf16 ? (void *)wref : NULL};
        struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
        CHECK(mw_adamw_step(&fmt, &hp, &sl, &ex) == 0);
    }
    static float got[NT];
    CHECK(mw_offload_read_raw(e, MW_OFFLOAD_R_MASTER, 0, NT, got) == 0);
    CHECK_MSG(!memcmp(got, master, sizeof got), "%s %s: master differs from the kernel's", placement, wfmt);
    if (bf16) CHECK_MSG(!memcmp(w16, wref, sizeof w16), "%s: bf16 working copy differs", placement);
    else CHECK_MSG(!memcmp(w32, master, sizeof w32), "%s: fp32 working copy differs", placement);
    double s[MW_PYAPI_NSTATS + 2];
    CHECK_EQ_INT(mw_pyapi_stats(e, s, MW_PYAPI_NSTATS + 2), MW_PYAPI_NSTATS);
    CHECK(s[0] == 3);                         /* steps */
    CHECK(s[7] == 3 && s[8] == 512);          /* subgroups, subgroup size */
    CHECK((s[1] > 0) == (dir != NULL));       /* NVMe bytes read only with NVMe state */
    CHECK_EQ_INT(mw_pyapi_stats(e, s, 1), 1);
    mw_offload_free(e);
}

int main(void)
{
    CHECK_EQ_INT(mw_pyapi_version(), MW_PYAPI_VERSION);
    const char *dir = tu_scratch_dir("pyapi");
    for (int release = 0; release < 2; release++) {
        run("all=dram", "fp32", NULL, release);
        run("all=dram", "bf16", NULL, release);
        run("optim=nvme", "fp32", dir, release);
        run("optim=nvme", "bf16", dir, release);
    }

    /* bad arguments: an error code and a message, never a crash */
    float w[4] = {0}, g[4] = {0};
    uint64_t numel[1] = {4}, zero[1] = {0};
    struct mw_offload *e = (struct mw_offload *)&e;
    CHECK(mw_pyapi_create(&e, 1, numel, NULL, "all=dram", "fp8", "fp32", NULL, 0, 0, 0, 0, 0, w, g, NULL) == -EINVAL);
    CHECK(strstr(mw_error_msg(), "'fp8'") != NULL);
    CHECK(e == NULL);
    CHECK(mw_pyapi_create(&e, 1, numel, NULL, "all=dram", "fp32", "int8", NULL, 0, 0, 0, 0, 0, w, g, NULL) == -EINVAL);
    CHECK(strstr(mw_error_msg(), "'int8'") != NULL);
    CHECK(mw_pyapi_create(&e, 1, numel, NULL, "all=ssd", "fp32", "fp32", NULL, 0, 0, 0, 0, 0, w, g, NULL) < 0);
    CHECK(mw_error_msg()[0] != 0);
    CHECK(mw_pyapi_create(&e, 1, zero, NULL, "all=dram", "fp32", "fp32", NULL, 0, 0, 0, 0, 0, w, g, NULL) == -EINVAL);
    CHECK(strstr(mw_error_msg(), "tensor 0 has 0 elements") != NULL);
    CHECK(mw_pyapi_create(&e, 1, numel, NULL, "all=dram", "fp32", "fp32", NULL, 0, -1, 0, 0, 0, w, g, NULL) == -EINVAL);
    CHECK(mw_pyapi_create(&e, 1, numel, NULL, "all=dram", "fp32", "fp32", NULL, 0, 0, 0, 0, 0, NULL, g, NULL) == -EINVAL);
    CHECK(mw_pyapi_create(&e, 1, numel, NULL, "optim=nvme", "fp32", "fp32", NULL, 0, 0, 0, 0, 0, w, g, NULL) < 0);
    CHECK(strstr(mw_error_msg(), "nvme") != NULL);
    CHECK(mw_pyapi_create(&e, 1, numel, NULL, "all=dram", "fp32", "fp32", NULL, 0, 0, 0, 1024, 0, w, g, NULL) ==
          MW_EBUDGET);
    CHECK(mw_pyapi_stats(NULL, NULL, 0) == -EINVAL);
    tu_rm_rf(dir);
    TEST_END();
}
