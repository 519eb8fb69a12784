/*
 * test_offload_subgroup.c — the subgroup-size floor of the NVMe plan: a size whose 4096-byte
 * padding would dwarf the optimizer state (`--subgroup-size 1` on the tiny preset's 35,968
 * parameters: 843 MiB on NVMe for 843 KiB of state) is refused up front, by the plan and by
 * mw_offload_init before anything is created, with a message naming the setting, the value,
 * the minimum and why; sizes at the minimum, DRAM state, small models and models smaller than
 * the minimum (one subgroup) all still work.
 */
#include "offload_util.h"

#include <dirent.h>
#include <errno.h>

enum { TINY = 35968 };

static struct mw_offload_config cfg(uint64_t sg, const char *place, enum mw_offload_mfmt mf, const char *dir)
{
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = sg;
    c.moments = mf;
    c.nvme_dir = dir;
    REQUIRE(mw_offload_placement_parse(place, &c.place) == 0);
    return c;
}

static int plan(const struct mw_offload_registry *r, struct mw_offload_config c, struct mw_offload_plan *p)
{
    return mw_offload_plan_make(r, &c, p);
}

static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

int main(void)
{
    const char *root = ou_scratch_dir("offload_subgroup");
    char nv[300];
    snprintf(nv, sizeof nv, "%s/nvme", root);
    struct mw_offload_registry r;
    int64_t sizes[3] = {TINY - 1000, 997, 3}; /* 35,968 elements */
    ou_model(&r, sizes, 3);
    REQUIRE(r.total == TINY);
    struct mw_offload_plan p;

    /* Refused: the plan, with the figures. */
    int rc = plan(&r, cfg(1, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p);
    CHECK_EQ_INT(rc, -EINVAL);
    const char *m = mw_error_msg();
    printf("sg 1: %s\n", m);
    CHECK_MSG(strstr(m, "subgroup size 1 is too small"), "message: %s", m);
    CHECK_MSG(strstr(m, "35968 parameters in 35968 subgroups"), "message: %s", m);
    CHECK_MSG(strstr(m, "843.00 MiB on NVMe for 843.00 KiB of state"), "message: %s", m);
    CHECK_MSG(strstr(m, "padded to 4096-byte blocks"), "message: %s", m);
    /* fp32 at 512: 2 KiB per region, half a block, but the last subgroup (128 elements) tips it */
    CHECK_MSG(strstr(m, "at least 1024 elements"), "message: %s", m);

    /* ... and the engine: nothing is created in the NVMe directory. */
    struct mw_offload *e = NULL;
    struct mw_offload_config c = cfg(1, "optim=nvme", MW_OFFLOAD_M_FP32, nv);
    CHECK_EQ_INT(mw_offload_init(&e, &r, &c), -EINVAL);
    CHECK(e == NULL);
    CHECK_MSG(strstr(mw_error_msg(), "subgroup size 1 is too small"), "message: %s", mw_error_msg());
    CHECK_MSG(entries(nv) <= 0, "%d entries in %s", entries(nv), nv);

    /* Other small sizes: refused while the padding is both above the state and above 64 MiB. */
    CHECK_EQ_INT(plan(&r, cfg(8, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), -EINVAL);
    CHECK_EQ_INT(plan(&r, cfg(1, "moments=nvme", MW_OFFLOAD_M_FP32, nv), &p), -EINVAL);
    CHECK_EQ_INT(plan(&r, cfg(1, "master=nvme", MW_OFFLOAD_M_FP32, nv), &p), -EINVAL);
    CHECK_EQ_INT(plan(&r, cfg(32, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0); /* 25.5 MiB of padding */
    /* 8-bit moments: subgroups are whole 256-element blocks; the minimum names a multiple of them. */
    rc = plan(&r, cfg(64, "optim=nvme", MW_OFFLOAD_M_8BIT, nv), &p);
    CHECK_EQ_INT(rc, 0); /* 141 subgroups of 256, 5 blocks each: 5.5 MiB of padding */
    struct mw_offload_registry big;
    int64_t bsizes[1] = {1 << 20};
    ou_model(&big, bsizes, 1);
    rc = plan(&big, cfg(64, "optim=nvme", MW_OFFLOAD_M_8BIT, nv), &p);
    CHECK_EQ_INT(rc, -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "subgroup size 64 (256: whole 256-element blocks of the 8-bit moments) is too "
                     "small") && strstr(mw_error_msg(), "at least 2048 elements"), "message: %s", mw_error_msg());
    CHECK_EQ_INT(plan(&big, cfg(512, "optim=nvme", MW_OFFLOAD_M_8BIT, nv), &p), -EINVAL); /* 68 MiB */
    CHECK_EQ_INT(plan(&big, cfg(2048, "optim=nvme", MW_OFFLOAD_M_8BIT, nv), &p), 0);
    CHECK_EQ_INT(plan(&big, cfg(100, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), -EINVAL);
    CHECK_EQ_INT(plan(&big, cfg(512, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0);
    CHECK_EQ_INT(plan(&big, cfg(1000, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0);

    /* Accepted: the minimum it names (and below it, while the padding is under 64 MiB), state in
     * DRAM (no padding), the default. */
    CHECK_EQ_INT(plan(&r, cfg(1024, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0);
    CHECK_EQ_INT(p.n_subgroups, 36);
    CHECK_EQ_INT(plan(&r, cfg(512, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0);
    CHECK_EQ_INT(p.n_subgroups, 71);
    CHECK_EQ_INT(plan(&r, cfg(1, "all=dram", MW_OFFLOAD_M_FP32, nv), &p), 0);
    CHECK_EQ_INT(p.n_subgroups, TINY);
    CHECK_EQ_INT(plan(&r, cfg((uint64_t)1 << 22, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0);
    CHECK_EQ_INT(p.n_subgroups, 1); /* a model smaller than the subgroup: one subgroup */

    /* A small model may be cut as finely as it likes: the padding is small in bytes. */
    struct mw_offload_registry small;
    int64_t ssizes[2] = {30, 2};
    ou_model(&small, ssizes, 2);
    CHECK_EQ_INT(plan(&small, cfg(13, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0);
    CHECK_EQ_INT(p.n_subgroups, 3);
    CHECK_EQ_INT(plan(&small, cfg(1, "optim=nvme", MW_OFFLOAD_M_FP32, nv), &p), 0);
    CHECK_EQ_INT(p.n_subgroups, 32);

    /* And the engine runs at the minimum. */
    c = cfg(512, "optim=nvme", MW_OFFLOAD_M_FP32, nv);
    c.buffer_count = 2;
    c.cpu_threads = 1;
    rc = mw_offload_init(&e, &r, &c);
    CHECK_MSG(rc == 0, "init at 512: %s", mw_error_msg());
    if (!rc) {
        CHECK_EQ_INT(mw_offload_get_plan(e)->n_subgroups, 71);
        mw_offload_free(e);
    }

    mw_offload_registry_free(&small);
    mw_offload_registry_free(&big);
    mw_offload_registry_free(&r);
    tu_rm_rf(root);
    TEST_END();
}
