/*
 * test_offload_plan.c — the registry and its cut into subgroups, placement parsing, the
 * size-first plan (bytes per tier; a too-small budget refused up front with the numbers and
 * nothing created), the calibration profile round trip, policies and the cost model.
 */
#include "offload_util.h"
#include <dirent.h>
#include <errno.h>

static void registry_and_cut(void)
{
    struct mw_offload_registry r;
    mw_offload_registry_init(&r);
    int64_t a[2] = {10, 3}, b[1] = {5}, c[3] = {2, 2, 2}, bad[1] = {0};
    CHECK(mw_offload_registry_add(&r, "wte", 2, a) == 0);
    CHECK(mw_offload_registry_add(&r, "bias", 1, b) == 0);
    CHECK(mw_offload_registry_add(&r, "cube", 3, c) == 0);
    CHECK(mw_offload_registry_add(&r, "bias", 1, b) == -EINVAL);     /* duplicate */
    CHECK(mw_offload_registry_add(&r, "zero", 1, bad) == -EINVAL);   /* empty dimension */
    CHECK_EQ_INT(r.n, 3);
    CHECK_EQ_INT(r.total, 43);
    CHECK_EQ_INT(r.tensors[1].first, 30);
    CHECK_EQ_INT(r.tensors[2].first, 35);
    CHECK_EQ_INT(mw_offload_registry_find(&r, 0), 0);
    CHECK_EQ_INT(mw_offload_registry_find(&r, 29), 0);
    CHECK_EQ_INT(mw_offload_registry_find(&r, 30), 1);
    CHECK_EQ_INT(mw_offload_registry_find(&r, 42), 2);
    CHECK_EQ_INT(mw_offload_registry_find(&r, 43), -1);

    struct mw_offload_subgroup *sg;
    uint32_t n;
    CHECK(mw_offload_cut(&r, 16, &sg, &n) == 0);
    CHECK_EQ_INT(n, 3);                 /* 16 + 16 + 11 */
    CHECK_EQ_INT(sg[1].first, 16);
    CHECK_EQ_INT(sg[2].n, 11);
    CHECK_EQ_INT(sg[1].tensor_lo, 0);   /* 16..31 splits wte and bias */
    CHECK_EQ_INT(sg[1].tensor_hi, 1);
    CHECK_EQ_INT(sg[2].tensor_lo, 1);
    CHECK_EQ_INT(sg[2].tensor_hi, 2);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += sg[i].n;
    CHECK_EQ_INT(sum, 43);
    free(sg);
    CHECK(mw_offload_cut(&r, 1000, &sg, &n) == 0);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(sg[0].n, 43);
    free(sg);
    CHECK(mw_offload_cut(&r, 0, &sg, &n) == -EINVAL);
    mw_offload_registry_free(&r);
}

static void placement(void)
{
    struct mw_offload_placement p;
    mw_offload_placement_default(&p);
    CHECK(mw_offload_placement_parse("master=nvme,moments=nvme,grads=dram", &p) == 0);
    CHECK(p.tier[MW_OFFLOAD_MASTER] == MW_TIER_NVME && p.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME);
    CHECK(p.tier[MW_OFFLOAD_GRADS] == MW_TIER_DRAM && p.tier[MW_OFFLOAD_WEIGHTS] == MW_TIER_DRAM);
    CHECK(mw_offload_placement_parse("all=dram,moments=nvme", &p) == 0);
    CHECK(p.tier[MW_OFFLOAD_MASTER] == MW_TIER_DRAM && p.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME);
    char buf[128];
    CHECK(!strcmp(mw_offload_placement_str(&p, buf, sizeof buf), "master=dram,moments=nvme,grads=dram,weights=dram"));
    CHECK(mw_offload_placement_parse("master=floppy", &p) == -EINVAL);
    CHECK(strstr(mw_error_msg(), "floppy") != NULL);
    CHECK(mw_offload_placement_parse("gradients", &p) == -EINVAL);
    CHECK(p.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME); /* unchanged by a failed parse */

    enum mw_offload_policy pol;
    int k = 0;
    CHECK(mw_offload_policy_parse("every-4", &pol, &k) == 0 && pol == MW_OFFLOAD_POLICY_EVERY_K && k == 4);
    CHECK(mw_offload_policy_parse("auto", &pol, &k) == 0 && pol == MW_OFFLOAD_POLICY_AUTO);
    CHECK(mw_offload_policy_parse("every-0", &pol, &k) == -EINVAL);
    CHECK(mw_offload_policy_parse("sometimes", &pol, &k) == -EINVAL);
}

static int dir_entries(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void plan(const char *dir)
{
    struct mw_offload_registry r;
    int64_t sizes[] = {1000, 24, 1000};
    ou_model(&r, sizes, 3);
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = 1024;
    c.buffer_count = 2;
    struct mw_offload_plan p;
    /* all in DRAM: master + 2 fp32 moments + grads + working copy = 20 B/param, one slot */
    CHECK(mw_offload_plan_make(&r, &c, &p) == 0);
    CHECK_EQ_INT(p.n_subgroups, 2);
    CHECK_EQ_INT(p.transactional, 0);
    CHECK_EQ_INT(p.kind_bytes[MW_OFFLOAD_MASTER][MW_TIER_DRAM], 8192);   /* 2024*4 rounded to pages */
    CHECK_EQ_INT(p.kind_bytes[MW_OFFLOAD_MOMENTS][MW_TIER_DRAM], 16384);
    CHECK_EQ_INT(p.tier_bytes[MW_TIER_NVME], 0);
    CHECK_EQ_INT(p.staging_bytes, 0);

    /* optimizer state on NVMe: two slots of padded objects there, staging in DRAM */
    REQUIRE(mw_offload_placement_parse("optim=nvme", &c.place) == 0);
    c.nvme_dir = dir;
    CHECK(mw_offload_plan_make(&r, &c, &p) == 0);
    CHECK_EQ_INT(p.transactional, 1);
    CHECK_EQ_INT(p.kind_bytes[MW_OFFLOAD_MASTER][MW_TIER_DRAM], 0);
    /* per subgroup: 3 regions of 4 KiB (1024 fp32), 2 slots, 2 subgroups */
    CHECK_EQ_INT(p.tier_bytes[MW_TIER_NVME], 2 * 2 * 3 * 4096);
    CHECK_EQ_INT(p.staging_bytes, 2 * (2u << 20));    /* I/O buffers are 2 MiB-rounded */
    char txt[1024];
    mw_offload_plan_format(&p, txt, sizeof txt);
    CHECK(strstr(txt, "nvme") && strstr(txt, "staging"));

    /* init allocates exactly the plan: the tiers' counters equal it, for several placements */
    static const char *places[] = {"optim=nvme", "master=dram,moments=nvme", "all=dram"};
    for (int i = 0; i < 3; i++)
        for (int dev = 0; dev < 2; dev++) {
            struct mw_offload_config x = c;
            REQUIRE(mw_offload_placement_parse(places[i], &x.place) == 0);
            x.use_device = dev;
            x.moments = dev ? MW_OFFLOAD_M_8BIT : MW_OFFLOAD_M_FP32;
            struct mw_offload_plan q;
            struct mw_offload *e;
            REQUIRE(mw_offload_plan_make(&r, &x, &q) == 0);
            int rc = mw_offload_init(&e, &r, &x);
            CHECK_MSG(rc == 0, "init: %s", mw_error_msg());
            if (rc) continue;
            uint64_t used[MW_TIER_COUNT];
            mw_offload_tier_usage(e, used);
            for (int t = 0; t < MW_TIER_COUNT; t++)
                CHECK_MSG(used[t] == q.tier_bytes[t], "%s dev=%d: %s tier holds %llu bytes, plan said %llu", places[i], dev,
                          mw_offload_tier_name((enum mw_tier_id)t), (unsigned long long)used[t],
                          (unsigned long long)q.tier_bytes[t]);
            mw_offload_free(e);
        }

    /* a budget that is too small is refused before anything exists, with the numbers */
    c.budget[MW_TIER_DRAM] = 1u << 20;
    struct mw_offload *e = NULL;
    int rc = mw_offload_init(&e, &r, &c);
    CHECK_EQ_INT(rc, MW_EBUDGET);
    CHECK(e == NULL);
    const char *msg = mw_error_msg();
    CHECK_MSG(strstr(msg, "dram") && strstr(msg, "budget") && strstr(msg, "1.00 MiB") && strstr(msg, "4."),
              "message: %s", msg);
    CHECK_EQ_INT(dir_entries(dir), 0);  /* no backing file was created */
    c.budget[MW_TIER_DRAM] = 0;
    c.budget[MW_TIER_NVME] = 10000;
    CHECK_EQ_INT(mw_offload_plan_make(&r, &c, &p), MW_EBUDGET);
    CHECK(strstr(mw_error_msg(), "nvme"));
    c.budget[MW_TIER_NVME] = 0;

    /* bad configs */
    c.nvme_dir = NULL;
    CHECK_EQ_INT(mw_offload_plan_make(&r, &c, &p), -EINVAL);
    c.nvme_dir = dir;
    REQUIRE(mw_offload_placement_parse("grads=nvme", &c.place) == 0);
    CHECK_EQ_INT(mw_offload_plan_make(&r, &c, &p), -ENOTSUP);
    REQUIRE(mw_offload_placement_parse("grads=dram", &c.place) == 0);
    c.policy = MW_OFFLOAD_POLICY_ALL_DEVICE;
    CHECK_EQ_INT(mw_offload_plan_make(&r, &c, &p), -EINVAL); /* needs use_device */
    c.use_device = 1;
    c.budget[MW_TIER_DEVICE] = 4096;
    CHECK_EQ_INT(mw_offload_plan_make(&r, &c, &p), MW_EBUDGET);
    CHECK(strstr(mw_error_msg(), "device"));
    mw_offload_registry_free(&r);
}

static void profile(const char *dir)
{
    struct mw_offload_profile p, q;
    mw_offload_profile_default(&p);
    p.cpu_params_per_s = 1.5e9;
    p.link_bytes_per_s = 3.25e9;
    char path[600];
    snprintf(path, sizeof path, "%s/profile.json", dir);
    CHECK(mw_offload_profile_save(path, &p) == 0);
    CHECK(mw_offload_profile_load(path, &q) == 0);
    CHECK(q.cpu_params_per_s == 1.5e9 && q.link_bytes_per_s == 3.25e9 && q.dev_params_per_s == p.dev_params_per_s);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("{\"cpu_params_per_s\": \"fast\"}", f);
    fclose(f);
    CHECK_EQ_INT(mw_offload_profile_load(path, &q), MW_EFORMAT);
    CHECK(mw_offload_profile_load("/nonexistent/profile.json", &q) < 0);
    remove(path);

    /* cost model: 1e9 params/s CPU; device 1e6 params at 1e10 params/s + 8 MB over 1e10 B/s */
    p.cpu_params_per_s = 1e9;
    p.dev_params_per_s = 1e10;
    p.link_bytes_per_s = 1e10;
    p.dev_latency_s = 0;
    double cpu = mw_offload_predict_cpu_s(&p, 1000000), dev = mw_offload_predict_dev_s(&p, 1000000, 8000000);
    CHECK(cpu > 0.99e-3 && cpu < 1.01e-3);
    CHECK(dev > 0.89e-3 && dev < 0.91e-3);
}

/* The policies place the updates where they say: every-K exactly, auto by the profile. */
static int dev_updates(const struct mw_offload_registry *r, enum mw_offload_policy pol, int k,
                       const struct mw_offload_profile *prof, uint64_t *cpu)
{
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = 100;   /* 10 subgroups */
    c.use_device = 1;
    c.policy = pol;
    c.every_k = k;
    if (prof) c.profile = *prof;
    struct mw_offload *e;
    REQUIRE(mw_offload_init(&e, r, &c) == 0);
    struct mw_offload_hparams hp;
    mw_offload_hparams_default(&hp);
    for (int t = 0; t < 2; t++) {
        CHECK(mw_offload_backward_begin(e, 1, NULL) == 0);
        float g[1000];
        for (int i = 0; i < 1000; i++) g[i] = 0.01f * (float)(i % 7);
        CHECK(mw_offload_grad_add(e, 0, 1000, g) == 0);
        CHECK(mw_offload_backward_end(e) == 0);
        CHECK(mw_offload_step(e, &hp) == 0);
    }
    struct mw_offload_stats st;
    mw_offload_stats_get(e, &st);
    mw_offload_free(e);
    CHECK_EQ_INT(st.cpu_updates + st.dev_updates, 20);
    CHECK(st.predicted_s > 0 && st.measured_s > 0);
    *cpu = st.cpu_updates;
    return (int)st.dev_updates;
}

static void policies(void)
{
    struct mw_offload_registry r;
    int64_t sizes[] = {1000};
    ou_model(&r, sizes, 1);
    uint64_t cpu;
    CHECK_EQ_INT(dev_updates(&r, MW_OFFLOAD_POLICY_EVERY_K, 3, NULL, &cpu), 2 * 3);  /* ids 2, 5, 8 */
    CHECK_EQ_INT(dev_updates(&r, MW_OFFLOAD_POLICY_ALL_DEVICE, 1, NULL, &cpu), 20);
    CHECK_EQ_INT(dev_updates(&r, MW_OFFLOAD_POLICY_ALL_CPU, 1, NULL, &cpu), 0);
    struct mw_offload_profile p;
    mw_offload_profile_default(&p);
    p.dev_latency_s = 0;
    p.cpu_params_per_s = 1e3; p.dev_params_per_s = 1e12; p.link_bytes_per_s = 1e15; /* device far faster */
    CHECK_EQ_INT(dev_updates(&r, MW_OFFLOAD_POLICY_AUTO, 1, &p, &cpu), 20);
    p.cpu_params_per_s = 1e12; p.dev_params_per_s = 1e3;                            /* CPU far faster */
    CHECK_EQ_INT(dev_updates(&r, MW_OFFLOAD_POLICY_AUTO, 1, &p, &cpu), 0);
    p.cpu_params_per_s = 1e3; p.dev_params_per_s = 1e3; p.link_bytes_per_s = 1e15;  /* equal (0.1 s predicted per
                                                                                  * update, far above dispatch time): both work */
    int d = dev_updates(&r, MW_OFFLOAD_POLICY_AUTO, 1, &p, &cpu);
    CHECK_MSG(d >= 6 && d <= 14 && cpu >= 6, "auto with equal engines: %d on the device, %llu on the CPU", d,
              (unsigned long long)cpu);
    mw_offload_registry_free(&r);
}

int main(void)
{
    const char *dir = ou_scratch_dir("offload_plan");
    registry_and_cut();
    placement();
    plan(dir);
    profile(dir);
    policies();
    tu_rm_rf(dir);
    TEST_END();
}
