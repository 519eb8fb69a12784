/*
 * test_ds_config.c — the DeepSpeed config reader (src/cli/train_ds_config.c): a real ZeRO-3 + NVMe
 * offload file as DeepSpeed's docs write it, the Hugging Face Trainer's "auto" file, the batch
 * keys against the world size, and broken files (bad JSON, wrong types, settings memwall cannot
 * honour, negative and huge numbers, duplicate keys), each refused with a message naming the key.
 */
#include "memwall/common.h"
#include "cli/train_ds_config.h"
#include "testutil.h"

#include <errno.h>

static const char *fixture(const char *name)
{
    static char path[1024];
    const char *src = getenv("MW_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/ds/%s", src ? src : ".", name);
    return path;
}

static const char *val(const struct mw_ds_config *c, const char *opt)
{
    const struct mw_ds_setting *s = mw_ds_config_find(c, opt);
    return s ? s->value : NULL;
}

static int has_warning(const struct mw_ds_config *c, const char *needle)
{
    for (int i = 0; i < c->n_warnings; i++)
        if (strstr(c->warnings[i], needle)) return 1;
    return 0;
}

#define CHECK_VAL(c, opt, want) do { const char *v_ = val(c, opt); \
    CHECK_MSG(v_ && !strcmp(v_, want), "--%s is %s, want %s", opt, v_ ? v_ : "(unset)", want); } while (0)

/* Parses text; expects failure with code err and a message holding each needle. */
static void expect_fail(const char *text, int world, int err, const char *n1, const char *n2)
{
    struct mw_ds_config c;
    int got = mw_ds_config_parse(text, strlen(text), "t.json", world, &c);
    CHECK_MSG(got == err, "%s: got %d, want %d (%s)", text, got, err, mw_error_msg());
    CHECK_MSG(strstr(mw_error_msg(), n1), "message '%s' lacks '%s'", mw_error_msg(), n1);
    if (n2) CHECK_MSG(strstr(mw_error_msg(), n2), "message '%s' lacks '%s'", mw_error_msg(), n2);
    CHECK(c.n_settings == 0 && c.n_warnings == 0 && !c.settings && !c.warnings);
}

static int parse_ok(const char *text, int world, struct mw_ds_config *c)
{
    int err = mw_ds_config_parse(text, strlen(text), "t.json", world, c);
    CHECK_MSG(err == 0, "%s: %s", text, mw_error_msg());
    return err;
}

static void test_real_zero3_nvme(void)
{
    struct mw_ds_config c;
    int err = mw_ds_config_load(fixture("zero3_nvme.json"), 1, &c);
    REQUIRE(err == 0);
    CHECK_VAL(&c, "batch", "2");
    CHECK_VAL(&c, "grad-accum", "2");
    CHECK_VAL(&c, "clip", "1");
    CHECK_VAL(&c, "lr", "0.002");
    CHECK_VAL(&c, "beta1", "0.9");
    CHECK_VAL(&c, "beta2", "0.98");
    CHECK_VAL(&c, "eps", "1e-06");
    CHECK_VAL(&c, "weight-decay", "0.01");
    CHECK_VAL(&c, "zero", "3");
    CHECK_VAL(&c, "optimizer-tier", "nvme");
    CHECK_VAL(&c, "offload-params", "nvme");
    CHECK_VAL(&c, "nvme-dir", "/local_nvme");
    CHECK_VAL(&c, "buffer-count", "4");
    CHECK_VAL(&c, "prefetch-depth", "4"); /* offload_param.buffer_count 5: one in use, four ahead */
    CHECK_VAL(&c, "subgroup-size", "1000000000");
    CHECK_VAL(&c, "aio-block-size", "1048576");
    CHECK_VAL(&c, "aio-queue-depth", "8");
    CHECK_EQ_INT(c.n_settings, 17);
    /* Every setting names the key it came from. */
    const struct mw_ds_setting *s = mw_ds_config_find(&c, "prefetch-depth");
    CHECK(s && !strcmp(s->key, "zero_optimization.offload_param.buffer_count"));
    s = mw_ds_config_find(&c, "nvme-dir");
    CHECK(s && !strcmp(s->key, "zero_optimization.offload_optimizer.nvme_path"));
    /* Tuning knobs without a counterpart: one note each; harmless keys: silent. */
    CHECK(has_warning(&c, "zero_optimization.reduce_bucket_size: accepted, no effect"));
    CHECK(has_warning(&c, "zero_optimization.offload_param.max_in_cpu"));
    CHECK(has_warning(&c, "aio.thread_count"));
    CHECK(!has_warning(&c, "steps_per_print"));
    CHECK(!has_warning(&c, "overlap_comm"));
    CHECK(!has_warning(&c, "fp16"));
    CHECK_EQ_INT(c.n_warnings, 8);
    mw_ds_config_free(&c);
    CHECK(c.n_settings == 0 && !c.settings);

    /* The same file on 2 ranks: train_batch_size 4 != 2 x 2 x 2. */
    err = mw_ds_config_load(fixture("zero3_nvme.json"), 2, &c);
    CHECK(err == -EINVAL);
    CHECK(strstr(mw_error_msg(), "train_batch_size 4 is not train_micro_batch_size_per_gpu 2 x "
                                 "gradient_accumulation_steps 2 x 2 ranks = 8"));
}

static void test_hf_auto(void)
{
    struct mw_ds_config c;
    REQUIRE(mw_ds_config_load(fixture("hf_auto.json"), 1, &c) == 0);
    /* "auto" leaves memwall's own value: only the stage and the optimizer's home are set. */
    CHECK_VAL(&c, "zero", "2");
    CHECK_VAL(&c, "optimizer-tier", "dram"); /* "cpu": memwall's optimizer always runs on the host */
    CHECK_EQ_INT(c.n_settings, 2);
    CHECK(has_warning(&c, "allgather_bucket_size"));
    mw_ds_config_free(&c);
}

static void test_batch_keys(void)
{
    struct mw_ds_config c;
    /* --batch is the global micro-batch: micro x world. */
    if (!parse_ok("{\"train_micro_batch_size_per_gpu\": 3, \"gradient_accumulation_steps\": 5}", 4, &c)) {
        CHECK_VAL(&c, "batch", "12");
        CHECK_VAL(&c, "grad-accum", "5");
        mw_ds_config_free(&c);
    }
    /* Any two give the third, as DeepSpeed resolves them. */
    if (!parse_ok("{\"train_batch_size\": 48, \"train_micro_batch_size_per_gpu\": 3}", 4, &c)) {
        CHECK_VAL(&c, "batch", "12");
        CHECK_VAL(&c, "grad-accum", "4");
        mw_ds_config_free(&c);
    }
    if (!parse_ok("{\"train_batch_size\": 48, \"gradient_accumulation_steps\": 2}", 4, &c)) {
        CHECK_VAL(&c, "batch", "24");
        CHECK_VAL(&c, "grad-accum", "2");
        mw_ds_config_free(&c);
    }
    if (!parse_ok("{\"train_batch_size\": 8}", 2, &c)) {
        CHECK_VAL(&c, "batch", "8");
        CHECK_VAL(&c, "grad-accum", "1");
        mw_ds_config_free(&c);
    }
    expect_fail("{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 3}", 1, -EINVAL,
                "train_batch_size 10 does not divide by train_micro_batch_size_per_gpu 3", NULL);
    expect_fail("{\"train_batch_size\": 9}", 2, -EINVAL, "does not divide by the 2 ranks", NULL);
    expect_fail("{\"train_micro_batch_size_per_gpu\": 1048576}", 2, -EINVAL, "largest --batch", NULL);
    expect_fail("{\"train_batch_size\": 1e15, \"train_micro_batch_size_per_gpu\": 1}", 1, -EINVAL,
                "accumulation steps", NULL);
}

static void test_optimizer(void)
{
    struct mw_ds_config c;
    /* DeepSpeed's Adam is AdamW unless adam_w_mode is false; with weight_decay 0 both agree. */
    if (!parse_ok("{\"optimizer\": {\"type\": \"adam\", \"params\": {\"adam_w_mode\": false, \"weight_decay\": 0}}}", 1,
                  &c)) {
        CHECK_VAL(&c, "weight-decay", "0");
        mw_ds_config_free(&c);
    }
    if (!parse_ok("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-4, \"torch_adam\": true}}}", 1, &c)) {
        CHECK_VAL(&c, "lr", "0.0001");
        mw_ds_config_free(&c);
    }
    expect_fail("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false, \"weight_decay\": 0.1}}}", 1,
                -ENOTSUP, "optimizer.params.adam_w_mode", "weight_decay to 0");
    expect_fail("{\"optimizer\": {\"params\": {\"lr\": 0.1}}}", 1, -ENOTSUP, "no \"type\"", NULL);
    expect_fail("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9]}}}", 1, MW_EFORMAT,
                "optimizer.params.betas", "two numbers");
    expect_fail("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9, 1.5]}}}", 1, -EINVAL,
                "optimizer.params.betas[1]: 1.5 is out of range", NULL);
    expect_fail("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9, \"x\"]}}}", 1, MW_EFORMAT,
                "betas[1]: expected a number, got a string", NULL);
    expect_fail("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": -1}}}", 1, -EINVAL,
                "optimizer.params.lr: -1 is out of range", NULL);
    expect_fail("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"eps\": 0}}}", 1, -EINVAL,
                "optimizer.params.eps: 0 is out of range", NULL);
    expect_fail("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": true}}}", 1, -ENOTSUP,
                "optimizer.params.amsgrad: true is not supported", NULL);
    expect_fail("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"bias_correction\": false}}}", 1, -ENOTSUP,
                "optimizer.params.bias_correction", NULL);
    expect_fail("{\"optimizer\": {\"type\": \"SGD\"}}", 1, -ENOTSUP, "optimizer.type: \"SGD\"", "AdamW");
    expect_fail("{\"optimizer\": \"AdamW\"}", 1, MW_EFORMAT, "optimizer: expected an object, got a string", NULL);
}

static void test_offload(void)
{
    struct mw_ds_config c;
    /* Parameters to cpu: memwall's weights stay in host DRAM; the path of a non-nvme device is unused. */
    if (!parse_ok("{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", \"nvme_path\": \"/x\","
                  " \"buffer_count\": 1}, \"offload_optimizer\": {\"device\": \"none\"}}}", 1, &c)) {
        CHECK_VAL(&c, "offload-params", "dram");
        CHECK_VAL(&c, "optimizer-tier", "dram");
        CHECK_VAL(&c, "prefetch-depth", "0");
        CHECK(!val(&c, "nvme-dir"));
        CHECK(has_warning(&c, "offload_param.nvme_path: ignored"));
        mw_ds_config_free(&c);
    }
    /* One nvme block gives the directory, whatever the key order. */
    if (!parse_ok("{\"zero_optimization\": {\"offload_param\": {\"nvme_path\": \"/nv%r\", \"device\": \"nvme\"}}}", 1,
                  &c)) {
        CHECK_VAL(&c, "nvme-dir", "/nv%r");
        CHECK_VAL(&c, "offload-params", "nvme");
        mw_ds_config_free(&c);
    }
    if (!parse_ok("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\", \"pin_memory\": false}}}", 1,
                  &c)) {
        CHECK(has_warning(&c, "pin_memory: false has no effect"));
        mw_ds_config_free(&c);
    }
    expect_fail("{\"zero_optimization\": {\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/a\"},"
                " \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/b\"}}}", 1, -ENOTSUP,
                "differ", "one --nvme-dir");
    expect_fail("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"gpu\"}}}", 1, -ENOTSUP,
                "zero_optimization.offload_optimizer.device: \"gpu\"", NULL);
    expect_fail("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"\"}}}", 1,
                -EINVAL, "the path is empty", NULL);
    expect_fail("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.3}}}", 1, -ENOTSUP,
                "ratio: 0.3 is not supported", NULL);
    expect_fail("{\"zero_optimization\": {\"offload_param\": {\"buffer_count\": 0}}}", 1, -EINVAL,
                "offload_param.buffer_count: 0 is out of range", NULL);
    expect_fail("{\"zero_optimization\": {\"offload_optimizer\": {\"buffer_count\": 2.5}}}", 1, -EINVAL,
                "expected an integer, got 2.5", NULL);
    expect_fail("{\"zero_optimization\": {\"stage\": 4}}", 1, -EINVAL, "zero_optimization.stage: 4 is out of range [0, 3]",
                NULL);
    expect_fail("{\"zero_optimization\": {\"stage\": true}}", 1, MW_EFORMAT, "expected a number, got a boolean", NULL);
    expect_fail("{\"zero_optimization\": {\"zero_quantized_weights\": true}}", 1, -ENOTSUP, "zero_quantized_weights",
                NULL);
    expect_fail("{\"zero_optimization\": {\"zero_hpz_partition_size\": 8}}", 1, -ENOTSUP, "zero_hpz_partition_size",
                NULL);
}

static void test_aio(void)
{
    struct mw_ds_config c;
    if (!parse_ok("{\"aio\": {\"block_size\": 262144, \"queue_depth\": 32, \"single_submit\": true}}", 1, &c)) {
        CHECK_VAL(&c, "aio-block-size", "262144");
        CHECK_VAL(&c, "aio-queue-depth", "32");
        CHECK_EQ_INT(c.n_warnings, 0);
        mw_ds_config_free(&c);
    }
    expect_fail("{\"aio\": {\"block_size\": 1000}}", 1, -EINVAL, "aio.block_size: 1000 is out of range", NULL);
    expect_fail("{\"aio\": {\"block_size\": 1048577}}", 1, -EINVAL, "not a multiple of 4096", NULL);
    expect_fail("{\"aio\": {\"block_size\": 1e400}}", 1, -EINVAL, "aio.block_size: the number is too large", NULL);
    expect_fail("{\"aio\": {\"block_size\": -4096}}", 1, -EINVAL, "out of range", NULL);
    expect_fail("{\"aio\": {\"queue_depth\": 100000}}", 1, -EINVAL, "aio.queue_depth: 100000 is out of range [1, 4096]",
                NULL);
    expect_fail("{\"aio\": {\"use_gds\": true}}", 1, -ENOTSUP, "aio.use_gds", NULL);
}

static void test_broken(void)
{
    struct mw_ds_config c;
    static const struct { const char *file; int err; const char *needle; } files[] = {
        {"bad_json.json", MW_EFORMAT, "not valid JSON"},
        {"wrong_type.json", MW_EFORMAT, "train_micro_batch_size_per_gpu: expected a number, got a string"},
        {"fp16.json", -ENOTSUP, "fp16.enabled: true is not supported: memwall trains in fp32"},
        {"scheduler.json", -ENOTSUP, "scheduler: memwall has its own learning-rate schedule, not DeepSpeed's \"WarmupLR\""},
        {"negative_size.json", -EINVAL, "zero_optimization.sub_group_size: -1e+09 is out of range"},
        {"huge.json", -EINVAL, "train_micro_batch_size_per_gpu: 1e+300 is out of range"},
        {"lamb.json", -ENOTSUP, "optimizer.type: \"Lamb\""},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        int err = mw_ds_config_load(fixture(files[i].file), 1, &c);
        CHECK_MSG(err == files[i].err, "%s: got %d, want %d (%s)", files[i].file, err, files[i].err, mw_error_msg());
        CHECK_MSG(strstr(mw_error_msg(), files[i].needle), "%s: '%s' lacks '%s'", files[i].file, mw_error_msg(),
                  files[i].needle);
        CHECK_MSG(strstr(mw_error_msg(), files[i].file), "%s: the message does not name the file", files[i].file);
    }
    CHECK(mw_ds_config_load(fixture("no_such_file.json"), 1, &c) == -ENOENT);
    expect_fail("[1, 2]", 1, MW_EFORMAT, "expected a JSON object", NULL);
    expect_fail("", 1, MW_EFORMAT, "not valid JSON", NULL);
    expect_fail("{} {}", 1, MW_EFORMAT, "text after the object", NULL);
    expect_fail("{\"zero_optimization\": {\"stage\": 1, \"stage\": 2}}", 1, MW_EFORMAT,
                "zero_optimization.stage: the key appears twice", NULL);
    expect_fail("{\"bf16\": {\"enabled\": true}}", 1, -ENOTSUP, "bf16.enabled", NULL);
    expect_fail("{\"amp\": {\"enabled\": true}}", 1, -ENOTSUP, "amp.enabled", NULL);
    expect_fail("{\"gradient_clipping\": \"1.0\"}", 1, MW_EFORMAT, "gradient_clipping: expected a number", NULL);
    expect_fail("{\"gradient_accumulation_steps\": 0}", 1, -EINVAL, "gradient_accumulation_steps: 0 is out of range",
                NULL);
    expect_fail("{\"gradient_accumulation_steps\": 9007199254740993}", 1, -EINVAL, "out of range", NULL);
    /* Deep nesting is cJSON's to refuse (its nesting limit), not a stack overflow. */
    {
        size_t n = 5000;
        char *deep = malloc(2 * n + 16);
        REQUIRE(deep);
        size_t o = 0;
        deep[o++] = '{';
        memcpy(deep + o, "\"x\":", 4); o += 4;
        for (size_t i = 0; i < n; i++) deep[o++] = '[';
        for (size_t i = 0; i < n; i++) deep[o++] = ']';
        deep[o++] = '}';
        deep[o] = 0;
        int err = mw_ds_config_parse(deep, o, "deep.json", 1, &c);
        CHECK(err == MW_EFORMAT);
        free(deep);
    }
    /* Oversized input is refused before parsing. */
    {
        size_t n = MW_DS_CONFIG_MAX_BYTES + 1;
        char *big = malloc(n);
        REQUIRE(big);
        memset(big, ' ', n);
        CHECK(mw_ds_config_parse(big, n, "big.json", 1, &c) == MW_EFORMAT);
        free(big);
    }
    /* Unknown keys: one warning each, capped; a huge key name does not overflow anything. */
    {
        size_t cap = 400 * 16 + 4096;
        char *t = malloc(cap);
        REQUIRE(t);
        size_t o = (size_t)snprintf(t, cap, "{\"%0300d\": 1", 7);
        for (int i = 0; i < 400; i++) o += (size_t)snprintf(t + o, cap - o, ", \"k%d\": %d", i, i);
        o += (size_t)snprintf(t + o, cap - o, "}");
        if (!parse_ok(t, 1, &c)) {
            CHECK(c.n_warnings == 256);
            CHECK(strstr(c.warnings[0], "a key of 300 bytes"));
            CHECK(strstr(c.warnings[1], "k0: unknown key, ignored"));
            CHECK(strstr(c.warnings[255], "146 more warnings not shown"));
            CHECK_EQ_INT(c.n_settings, 0);
            mw_ds_config_free(&c);
        }
        free(t);
    }
    /* Unknown keys inside known blocks are warned about with their path; null is "not set". */
    if (!parse_ok("{\"zero_optimization\": {\"stage\": null, \"future_knob\": {\"a\": 1}}, \"gradient_clipping\": null}", 1,
                  &c)) {
        CHECK(has_warning(&c, "zero_optimization.future_knob: unknown key"));
        CHECK_EQ_INT(c.n_warnings, 1);
        CHECK_EQ_INT(c.n_settings, 0);
        mw_ds_config_free(&c);
    }
    expect_fail("{}", 0, -EINVAL, "world size", NULL);
}

int main(void)
{
    test_real_zero3_nvme();
    test_hf_auto();
    test_batch_keys();
    test_optimizer();
    test_offload();
    test_aio();
    test_broken();
    TEST_END();
}
