/*
 * test_offload_fail.c — an NVMe write that fails (torn: half written, then -EIO) in the middle
 * of a step: the error surfaces with the subgroup named, the committed step stays the previous
 * one, its master weights, moments and (after mw_offload_recover) working copy are bitwise the
 * state that step left, and a retry of the step then matches an uninterrupted run.
 * Also the failure of the backing store's engine (aio fault injection) reported the same way.
 */
#include "offload_util.h"
#include "memwall/store.h"
#include <errno.h>

static struct mw_offload *make(const struct mw_offload_registry *r, const char *dir, float *w, float *g,
                               int use_device, uint64_t sgsize)
{
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = sgsize;
    c.buffer_count = 3;
    c.nvme_dir = dir;
    c.ext_weights = w;
    c.ext_grads = g;
    c.use_device = use_device;
    if (use_device) { c.policy = MW_OFFLOAD_POLICY_EVERY_K; c.every_k = 2; }
    REQUIRE(mw_offload_placement_parse("optim=nvme", &c.place) == 0);
    struct mw_offload *e;
    int rc = mw_offload_init(&e, r, &c);
    CHECK_MSG(rc == 0, "init: %s", mw_error_msg());
    REQUIRE(rc == 0);
    return e;
}

static void scenario(const struct mw_offload_registry *r, const char *dir, int inject_at, int use_device,
                     uint64_t sgsize)
{
    uint64_t n = r->total;
    float *w = malloc(4 * n), *g = malloc(4 * n), *w_ref = malloc(4 * n), *g_ref = malloc(4 * n);
    REQUIRE(w && g && w_ref && g_ref);
    ou_init_weights(w, n);
    memcpy(w_ref, w, 4 * n);
    struct mw_offload *e = make(r, dir, w, g, use_device, sgsize);

    struct mw_offload_hparams hp;
    ou_hparams(&hp, 1);
    ou_grads(g, n, 1, 0);
    CHECK(mw_offload_step(e, &hp) == 0);
    struct ou_snap after1;
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &after1);

    /* step 2 with the inject_at-th write failing */
    ou_hparams(&hp, 2);
    ou_grads(g, n, 2, 0);
    mw_offload_inject_write_failure(e, (uint64_t)inject_at);
    int rc = mw_offload_step(e, &hp);
    CHECK_EQ_INT(rc, -EIO);
    CHECK_MSG(strstr(mw_error_msg(), "subgroup") && strstr(mw_error_msg(), "intact"), "message: %s", mw_error_msg());
    CHECK_EQ_INT(mw_offload_committed_steps(e), 1);
    CHECK_EQ_INT(mw_offload_step(e, &hp), -EBUSY);      /* must recover first */
    CHECK(mw_offload_recover(e) == 0);
    struct ou_snap now;
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
    CHECK_MSG(ou_snap_equal(&after1, &now, "after the failed step"), "the state of step 1 was not intact");
    ou_snap_free(&now);

    /* the retry succeeds and equals a run that never failed */
    CHECK(mw_offload_step(e, &hp) == 0);
    CHECK_EQ_INT(mw_offload_committed_steps(e), 2);
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
    mw_offload_free(e);

    struct mw_offload *ref = make(r, dir, w_ref, g_ref, 0, sgsize);
    for (int t = 1; t <= 2; t++) {
        ou_hparams(&hp, t);
        ou_grads(g_ref, n, t, 0);
        CHECK(mw_offload_step(ref, &hp) == 0);
    }
    struct ou_snap want;
    ou_snap_take(ref, MW_OFFLOAD_M_FP32, n, &want);
    CHECK_MSG(ou_snap_equal(&want, &now, "retried step"), "retry differs from an uninterrupted run");
    CHECK(memcmp(w, w_ref, 4 * n) == 0);
    mw_offload_free(ref);
    ou_snap_free(&want);
    ou_snap_free(&now);
    ou_snap_free(&after1);
    free(w); free(g); free(w_ref); free(g_ref);
}

int main(void)
{
    const char *dir = ou_scratch_dir("offload_fail");
    /* 11000 parameters in 6 subgroups of 2048 (objects of 3 x 8 KiB: the failing write writes
     * nothing, since torn halves are whole 64 KiB checksum blocks) */
    static const int64_t sizes[] = {5000, 17, 5983};
    struct mw_offload_registry r;
    ou_model(&r, sizes, 3);
    scenario(&r, dir, 1, 0, 2048);   /* the first write of the step */
    scenario(&r, dir, 4, 0, 2048);   /* in the middle */
    scenario(&r, dir, 6, 1, 2048);   /* the last one, with half the updates on the emulated accelerator */

    /* subgroups of 16384: objects of 3 x 64 KiB, the failing write lands its first 64 KiB (torn) */
    static const int64_t big[] = {40000, 9000};
    struct mw_offload_registry r2;
    ou_model(&r2, big, 2);
    scenario(&r2, dir, 2, 0, 16384);
    mw_offload_registry_free(&r);
    mw_offload_registry_free(&r2);
    tu_rm_rf(dir);
    TEST_END();
}
