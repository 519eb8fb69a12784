/*
 * test_plan.c — the planner's own behaviour beyond the published cases: config.json parsing
 * (and its failures), layout checks, tier placement of offloaded state, block placement over
 * pipeline ranks, KV-cache splitting, search order, and the k8s block.
 */
#include "testutil.h"
#include "memwall/common.h"
#include "memwall/plan.h"

#include <errno.h>

static struct mw_plan_result *R;

static const char *fixture(const char *name)
{
    static char path[1024];
    const char *src = getenv("MW_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/configs/%s", src ? src : ".", name);
    return path;
}

static uint64_t total_of(const struct mw_model *m)
{
    struct mw_param_count pc;
    mw_model_count(m, &pc);
    return pc.total;
}

static void test_configs(void)
{
    static const struct { const char *file, *zoo; uint64_t total, active; } k[] = {
        {"gpt2.json", "gpt2", 124439808ull, 124439808ull},
        {"llama-3-8b.json", "llama-3-8b", 8030261248ull, 8030261248ull},
        {"mixtral-8x7b.json", "mixtral-8x7b", 46702792704ull, 12879925248ull}, /* HF: 46.7B / 12.9B */
        {"qwen2.5-72b.json", "qwen2.5-72b", 72706203648ull, 72706203648ull},  /* HF: 72.7B */
        {"deepseek-v3.json", "deepseek-v3", 671026419200ull, 37552297472ull},
        {"t5-3b.json", "t5-3b", 2851598336ull, 2851598336ull},
        {"deepseek-v2-lite.json", NULL, 15706484224ull, 0},                     /* HF: 15.7B */
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        struct mw_model m, z;
        int err = mw_model_from_config_file(fixture(k[i].file), &m);
        CHECK_MSG(err == 0, "%s: %s", k[i].file, mw_error_msg());
        if (err) continue;
        struct mw_param_count pc;
        mw_model_count(&m, &pc);
        CHECK_MSG(pc.total == k[i].total, "%s: %llu", k[i].file, (unsigned long long)pc.total);
        if (k[i].active) CHECK_MSG(pc.active == k[i].active, "%s: active %llu", k[i].file, (unsigned long long)pc.active);
        if (k[i].zoo) {
            REQUIRE(mw_model_lookup(k[i].zoo, &z) == 0);
            CHECK_EQ_INT(total_of(&z), pc.total);
        }
    }
    struct mw_model m;
    CHECK_EQ_INT(mw_model_from_config_file(fixture("bad-missing-key.json"), &m), MW_EFORMAT);
    CHECK(strstr(mw_error_msg(), "num_hidden_layers") != NULL);
    CHECK_EQ_INT(mw_model_from_config_file(fixture("bad-truncated.json"), &m), MW_EFORMAT);
    CHECK(strstr(mw_error_msg(), "not valid JSON") != NULL);
    CHECK_EQ_INT(mw_model_from_config_json("[1, 2]", "x", &m), MW_EFORMAT);
    CHECK_EQ_INT(mw_model_from_config_json("{\"model_type\": \"rwkv\"}", "x", &m), MW_EFORMAT);
    CHECK(strstr(mw_error_msg(), "rwkv") != NULL);
    CHECK_EQ_INT(mw_model_from_config_json("{\"model_type\": \"gpt2\", \"n_layer\": 1.5, \"n_embd\": 64, "
                                           "\"n_head\": 4}", "x", &m), MW_EFORMAT);
    CHECK_EQ_INT(mw_model_from_config_json("{\"model_type\": \"llama\", \"num_hidden_layers\": 2, "
                                           "\"hidden_size\": 64, \"num_attention_heads\": 6, \"num_key_value_heads\": 4,"
                                           " \"intermediate_size\": 128, \"vocab_size\": 10}", "x", &m), MW_EFORMAT);
    CHECK_EQ_INT(mw_model_from_config_file(fixture("no-such.json"), &m), -ENOENT);
    CHECK_EQ_INT(mw_model_lookup("no-such-model", &m), -ENOENT);
    CHECK(mw_model_lookup("meta-llama/Llama-2-7b-hf", &m) == 0 && !strcmp(m.name, "llama-2-7b"));
}

static void test_layout_errors(void)
{
    struct mw_model m;
    struct mw_layout l;
    REQUIRE(mw_model_lookup("llama-2-7b", &m) == 0);
    mw_layout_default(&l);
    l.tp = 3; /* 32 heads */
    CHECK_EQ_INT(mw_plan_compute(&m, &l, NULL, R), -EINVAL);
    mw_layout_default(&l);
    l.offload_params = MW_TIER_DRAM; l.zero = 2;
    CHECK_EQ_INT(mw_plan_compute(&m, &l, NULL, R), -EINVAL);
    mw_layout_default(&l);
    l.gpus = 12; l.tp = 8;
    CHECK_EQ_INT(mw_plan_compute(&m, &l, NULL, R), -EINVAL);
    mw_layout_default(&l);
    l.ep = 2; /* dense model */
    CHECK_EQ_INT(mw_plan_compute(&m, &l, NULL, R), -EINVAL);
    mw_layout_default(&l);
    l.pp = 33; /* 32 blocks */
    CHECK_EQ_INT(mw_plan_compute(&m, &l, NULL, R), -EINVAL);
    mw_layout_default(&l);
    l.dp = 4; l.micro_batch = 2; l.global_batch = 12;
    CHECK_EQ_INT(mw_plan_compute(&m, &l, NULL, R), -EINVAL);
}

/* Offloading moves bytes between tiers without changing how many there are. */
static void test_offload_tiers(void)
{
    struct mw_model m;
    struct mw_layout l;
    REQUIRE(mw_model_lookup("llama-3-70b", &m) == 0);
    const struct mw_hw *hw = mw_hw_lookup("h100");
    REQUIRE(hw != NULL);
    mw_layout_default(&l);
    l.gpus = 8; l.zero = 3;
    REQUIRE(mw_plan_compute(&m, &l, hw, R) == 0);
    const struct mw_stage s0 = R->stage[0];
    CHECK(s0.host.total == 0 && s0.nvme.total == 0);
    l.offload_optimizer = MW_TIER_NVME; l.offload_params = MW_TIER_DRAM;
    REQUIRE(mw_plan_compute(&m, &l, hw, R) == 0);
    const struct mw_stage *s = &R->stage[0];
    CHECK_EQ_INT(s->gpu.optimizer, 0);
    CHECK_EQ_INT(s->nvme.optimizer, s0.gpu.optimizer);
    CHECK_EQ_INT(s->host.params, s0.gpu.params);
    CHECK_EQ_INT(s->gpu.params, 0);
    CHECK_EQ_INT(s->host.grads, s0.gpu.grads);
    CHECK(s->host.buffers > 0);               /* NVMe staging */
    CHECK(s->gpu.total < s0.gpu.total);
    CHECK(R->time.nvme_read_bytes > 0 && R->time.nvme_write_bytes > 0 && R->time.pcie_bytes > 0);
    CHECK_EQ_INT(R->host_node, 8 * s->host.total);
    /* ZeRO stages shrink the GPU state monotonically. */
    uint64_t prev = UINT64_MAX;
    for (int z = 0; z <= 3; z++) {
        mw_layout_default(&l);
        l.gpus = 8; l.zero = z;
        REQUIRE(mw_plan_compute(&m, &l, hw, R) == 0);
        uint64_t st = R->stage[0].gpu.params + R->stage[0].gpu.grads + R->stage[0].gpu.optimizer;
        CHECK(st < prev);
        prev = st;
    }
    CHECK(!R->fits_gpu || R->stage[0].gpu.total <= hw->gpu_mem);
}

static void test_pipeline_placement(void)
{
    struct mw_model m;
    struct mw_layout l;
    REQUIRE(mw_model_lookup("deepseek-v3", &m) == 0);
    mw_layout_default(&l);
    l.pp = 16;
    REQUIRE(mw_plan_compute(&m, &l, NULL, R) == 0);
    uint64_t sum = 0;
    for (uint64_t s = 0; s < 16; s++) {
        CHECK_EQ_INT(R->stage[s].n_layers, s < 15 ? 4 : 1);
        sum += R->stage[s].params;
    }
    CHECK_EQ_INT(sum, R->count.total);        /* TP 1, EP 1: every parameter exactly once */
    CHECK(R->stage[0].has_embedding && R->stage[15].has_head);
    CHECK_EQ_INT(R->stage[0].n_moe_layers, 1);
    CHECK(R->worst >= 1 && R->worst <= 14); /* four MoE blocks outweigh three dense + embedding */
    /* Uneven counts that ceil placement would leave empty fall back to balanced. */
    REQUIRE(mw_model_lookup("gpt2", &m) == 0);
    mw_layout_default(&l);
    l.pp = 5;                                 /* 12 blocks: 3,3,2,2,2 */
    REQUIRE(mw_plan_compute(&m, &l, NULL, R) == 0);
    uint64_t n = 0;
    for (uint64_t s = 0; s < 5; s++) { CHECK(R->stage[s].n_layers >= 2); n += R->stage[s].n_layers; }
    CHECK_EQ_INT(n, 12);
}

static void test_kv(void)
{
    struct mw_model m;
    REQUIRE(mw_model_lookup("deepseek-v3", &m) == 0);
    CHECK_EQ_INT(mw_kv_bytes_per_token(&m, MW_DT_BF16), 70272);   /* "69 KiB per token" */
    CHECK_EQ_INT(mw_kv_bytes_per_token_rank(&m, MW_DT_BF16, 8), 70272); /* latent replicated */
    REQUIRE(mw_model_lookup("llama-3-70b", &m) == 0);
    uint64_t one = mw_kv_bytes_per_token(&m, MW_DT_BF16);
    CHECK_EQ_INT(one, 2 * 80 * 8 * 128 * 2);
    CHECK_EQ_INT(mw_kv_bytes_per_token_rank(&m, MW_DT_BF16, 4), one / 4);
    CHECK_EQ_INT(mw_kv_bytes_per_token_rank(&m, MW_DT_BF16, 16), one / 8); /* 1 head per rank */
    CHECK_EQ_INT(mw_kv_bytes_per_token(&m, MW_DT_FP8), one / 2);
}

static void test_search_and_k8s(void)
{
    struct mw_model m;
    struct mw_layout l;
    REQUIRE(mw_model_lookup("llama-2-13b", &m) == 0);
    const struct mw_hw *hw = mw_hw_lookup("a100-80gb");
    mw_layout_default(&l);
    l.gpus = 8;
    l.seq = 4096;
    struct mw_search_hit hits[20];
    int n = mw_plan_search(&m, &l, 0, hw, hits, 20);
    CHECK(n == 20);
    for (int i = 1; i < n; i++) CHECK(hits[i - 1].iter_s <= hits[i].iter_s);
    for (int i = 0; i < n; i++) CHECK((double)hits[i].gpu_total <= 0.95 * (double)hw->gpu_mem);
    l.tp = 2;
    n = mw_plan_search(&m, &l, MW_FIX_TP, hw, hits, 20);
    CHECK(n > 0);
    for (int i = 0; i < n; i++) CHECK_EQ_INT(hits[i].layout.tp, 2);
    /* A model that fits nowhere: 405B on one RTX 4090 without offload. */
    REQUIRE(mw_model_lookup("llama-3.1-405b", &m) == 0);
    mw_layout_default(&l);
    l.gpus = 1;
    l.offload_optimizer = MW_TIER_DEVICE;
    n = mw_plan_search(&m, &l, MW_FIX_OFFLOAD, mw_hw_lookup("rtx4090"), hits, 20);
    CHECK_EQ_INT(n, 0);

    REQUIRE(mw_model_lookup("llama-3-70b", &m) == 0);
    mw_layout_default(&l);
    l.gpus = 8; l.tp = 8; l.zero = 1; l.offload_optimizer = MW_TIER_NVME;
    REQUIRE(mw_plan_compute(&m, &l, mw_hw_lookup("h100"), R) == 0);
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    REQUIRE(f != NULL);
    l.gpus_per_node = 8;
    mw_plan_emit_k8s(R, &l, mw_hw_lookup("h100"), f);
    fclose(f);
    CHECK(strstr(buf, "resources:") && strstr(buf, "memory: \"") && strstr(buf, "nvidia.com/gpu: \"8\""));
    CHECK(strstr(buf, "ephemeral-storage") != NULL);
    CHECK(strstr(buf, "mountPath: /dev/shm") != NULL);
}

static void test_host_profile(void)
{
    /* (tu_scratch_dir trips gcc's -Wformat-truncation at -O2, so a plain file instead.) */
    const char *b = getenv("MW_BUILD_DIR");
    char path[1100];
    snprintf(path, sizeof path, "%.1000s/plan-host-%d.json", b ? b : "/tmp", (int)getpid());
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fputs("{\"cpu_adam_params_per_s\": 1.5e9, \"nvme_read_bytes_per_s\": 2.3e9, \"host_mem_bytes\": 25769803776}", f);
    fclose(f);
    struct mw_hw hw = *mw_hw_lookup("rtx4090");
    CHECK_EQ_INT(mw_hw_load_host_profile(path, &hw), 0);
    CHECK(hw.cpu_adam == 1.5e9 && hw.nvme_read == 2.3e9 && hw.host_mem == 25769803776ull);
    CHECK(hw.nvme_write == mw_hw_lookup("rtx4090")->nvme_write); /* absent keys keep the profile's */
    f = fopen(path, "w");
    REQUIRE(f != NULL);
    fputs("{\"cpu_adam_params_per_s\": \"fast\"}", f);
    fclose(f);
    CHECK_EQ_INT(mw_hw_load_host_profile(path, &hw), MW_EFORMAT);
    remove(path);
}

int main(void)
{
    R = malloc(sizeof *R);
    REQUIRE(R != NULL);
    test_configs();
    test_layout_errors();
    test_offload_tiers();
    test_pipeline_placement();
    test_kv();
    test_search_and_k8s();
    test_host_profile();
    free(R);
    TEST_END();
}
