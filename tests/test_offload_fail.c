/*
 * test_offload_fail.c — an NVMe write that fails (torn: half written, then -EIO) in the middle
 * of a step: the error surfaces with the subgroup named, the committed step stays the previous
 * one, its master weights, moments and (after mw_offload_recover) working copy are bitwise the
 * state that step left, and a retry of the step then matches an uninterrupted run.
 * Also the failure of the backing store's engine (aio fault injection) reported the same way,
 * and faults injected through the I/O engine's MEMWALL_FAULT hook (errors on a read or a write,
 * disk full, a slow disk); the working copy usable before its write lands.
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
    c.preread = 1; /* the failure paths with pre-reads between steps (a read fault lands on one) */
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

/*
 * The same through the I/O engine's hook (MEMWALL_FAULT, read by the store's engine at init):
 * step 2 meets the fault the spec names; the error is the injected one, the message names the
 * subgroup, the object, the file and the offset and says step 2 is not committed; after
 * recovery step 1's state is intact, the retried step 2 (the rule is spent: count=1) and a
 * step 3 equal a run that never saw a fault. A spec without an error (a delay) must change
 * nothing at all.
 */
static void env_scenario(const struct mw_offload_registry *r, const char *dir, const char *spec, int want_rc,
                         const char *want_obj, int use_device)
{
    uint64_t n = r->total;
    float *w = malloc(4 * n), *g = malloc(4 * n), *w_ref = malloc(4 * n), *g_ref = malloc(4 * n), *w1 = malloc(4 * n);
    REQUIRE(w && g && w_ref && g_ref && w1);
    ou_init_weights(w, n);
    memcpy(w_ref, w, 4 * n);
    struct mw_offload_hparams hp;
    /* The run without faults first: its state after step 1 and after step 3. (Snapshots read
     * the store, and reads count for MEMWALL_FAULT's after=: none in the faulty run until it fails.) */
    struct ou_snap ref1, ref3, now;
    struct mw_offload *ref = make(r, dir, w_ref, g_ref, 0, 2048);
    for (int t = 1; t <= 3; t++) {
        ou_hparams(&hp, t);
        ou_grads(g_ref, n, t, 0);
        CHECK(mw_offload_step(ref, &hp) == 0);
        if (t == 1) {
            ou_snap_take(ref, MW_OFFLOAD_M_FP32, n, &ref1);
            memcpy(w1, w_ref, 4 * n);
        }
    }
    ou_snap_take(ref, MW_OFFLOAD_M_FP32, n, &ref3);
    mw_offload_free(ref);

    setenv("MEMWALL_FAULT", spec, 1);
    struct mw_offload *e = make(r, dir, w, g, use_device, 2048);
    unsetenv("MEMWALL_FAULT");
    for (int t = 1; t <= 3; t++) {
        ou_hparams(&hp, t);
        ou_grads(g, n, t, 0);
        int rc = mw_offload_step(e, &hp);
        if (t == 1 && rc == 0) /* let the 3 pre-reads of step 2 land first: read faults then hit one */
            CHECK_EQ_INT(ou_wait_prereads(e, 3), 3);
        if (t == 2 && want_rc) {
            CHECK_MSG(rc == want_rc, "%s: step 2 gave %d: %s", spec, rc, mw_error_msg());
            const char *m = mw_error_msg();
            CHECK_MSG(strstr(m, "of subgroup") && strstr(m, want_obj) && strstr(m, "/memwall-offload.0.dat") &&
                      strstr(m, " at offset ") && strstr(m, "[injected by MEMWALL_FAULT]") &&
                      strstr(m, "(step 2 not committed; the state of step 1 is intact)"), "%s: %s", spec, m);
            if (want_rc == -ENOSPC) CHECK_MSG(strstr(m, "the disk holding ") && strstr(m, " available there)"), "%s", m);
            CHECK_EQ_INT(mw_offload_committed_steps(e), 1);
            CHECK(mw_offload_recover(e) == 0);
            ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
            CHECK_MSG(ou_snap_equal(&ref1, &now, "after the failed step"), "%s: step 1's state not intact", spec);
            CHECK_MSG(memcmp(w, w1, 4 * n) == 0, "%s: the working copy is not step 1's after recovery", spec);
            ou_snap_free(&now);
            rc = mw_offload_step(e, &hp); /* the retry (the rule is spent) */
        }
        CHECK_MSG(rc == 0, "%s: step %d: %s", spec, t, mw_error_msg());
        CHECK_EQ_INT(mw_offload_committed_steps(e), t);
    }
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
    mw_offload_free(e);
    CHECK_MSG(ou_snap_equal(&ref3, &now, spec), "%s: differs from a run without faults", spec);
    CHECK_MSG(memcmp(w, w_ref, 4 * n) == 0, "%s: weights differ from a run without faults", spec);
    ou_snap_free(&ref1);
    ou_snap_free(&ref3);
    ou_snap_free(&now);
    free(w); free(g); free(w_ref); free(g_ref); free(w1);
}

/*
 * An overlapped step on a slow disk (every write held 200 ms): the working copy of a subgroup is
 * usable as soon as its update is refreshed into it (mw_offload_sg_wait_weights), while its NVMe
 * write is still in flight (mw_offload_sg_wait says not done); those weights are the ones the
 * committed step leaves; a write that then fails still fails the step and leaves the one before.
 */
static void weights_wait_scenario(const struct mw_offload_registry *r, const char *dir)
{
    uint64_t n = r->total;
    float *w = malloc(4 * n), *g = malloc(4 * n), *seen = malloc(4 * 2048);
    REQUIRE(w && g && seen);
    ou_init_weights(w, n);
    setenv("MEMWALL_FAULT", "write:delay:us=200000", 1);
    struct mw_offload *e = make(r, dir, w, g, 0, 2048);
    unsetenv("MEMWALL_FAULT");
    struct mw_offload_hparams hp;
    for (int t = 1; t <= 2; t++) {
        ou_hparams(&hp, t);
        ou_grads(g, n, t, 0);
        if (t == 2) mw_offload_inject_write_failure(e, 3); /* step 2's third write fails */
        CHECK(mw_offload_step_start(e, &hp) == 0);
        int rc = mw_offload_sg_wait_weights(e, 0, 1);
        if (t == 1) CHECK_EQ_INT(rc, 1);
        else CHECK_MSG(rc == 1 || rc == -EIO, "step 2: %d (%s)", rc, mw_error_msg()); /* the failure may come first */
        if (t == 1) CHECK_EQ_INT(mw_offload_sg_wait(e, 0, 0), 0); /* its write is held by the slow disk */
        memcpy(seen, w, 4 * 2048);
        rc = mw_offload_step_wait(e);
        if (t == 1) {
            CHECK_MSG(rc == 0, "step 1: %s", mw_error_msg());
            CHECK_MSG(memcmp(seen, w, 4 * 2048) == 0, "the weights seen before the write differ from the committed ones");
        } else {
            CHECK_EQ_INT(rc, -EIO);
            CHECK_EQ_INT(mw_offload_committed_steps(e), 1);
            CHECK(mw_offload_recover(e) == 0);
        }
    }
    mw_offload_free(e);
    free(w); free(g); free(seen);
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
    /* Through MEMWALL_FAULT. Each object is one piece: 6 written at init, 6 read and 6 written
     * per step, so after=14 is step 2's third write, after=8 its third read. */
    env_scenario(&r, dir, "write:eio:after=14:count=1", -EIO, "(object 'sg2.slot", 0);
    env_scenario(&r, dir, "read:eio:after=8:count=1", -EIO, "(object 'sg2.slot", 0); /* a pre-read of step 2 */
    env_scenario(&r, dir, "write:enospc:after=12:count=1", -ENOSPC, "(object 'sg0.slot", 0);
    env_scenario(&r, dir, "read:eio:after=11:count=1", -EIO, "(object 'sg5.slot", 1);
    env_scenario(&r, dir, "delay:us=3000", 0, NULL, 0); /* a slow disk: bitwise the same */
    weights_wait_scenario(&r, dir);

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
