/* test_train.c — the training loop's library part: learning-rate schedule, a tiny model that
 * learns, gradient accumulation equal to the larger batch, clipping, checkpoint round trip
 * and corrupt-checkpoint errors. Tolerances are stated where float rounding differs. */
#include "memwall/train.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>

/* The trainer takes a model through the seam (memwall/model.h): a GPT-2 config as a seam config. */
static int trainer_init_gpt2(struct mw_trainer *tr, const struct mw_gpt2_config *g, const struct mw_train_config *c,
                             const struct mw_data *d)
{
    struct mw_net_config n;
    mw_net_config_gpt2(&n, g);
    return mw_trainer_init(tr, &n, c, d);
}

static char g_dir[400];

static struct mw_train_config base_config(void)
{
    struct mw_train_config c = {
        .batch = 4, .seq = 16, .grad_accum = 1, .steps = 40, .lr = 3e-3, .warmup = 4, .min_lr_frac = 0.1,
        .weight_decay = 0.0, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .clip = 0, .val_every = 0,
        .val_batches = 2, .ckpt_every = 0, .seed = 11, .threads = 2, .recompute = 0, .tier = MW_TIER_DRAM,
    };
    return c;
}

static const struct mw_gpt2_config tiny = {2, 2, 32, 32, MW_TOK_BYTE_VOCAB, 264};

static void test_lr_schedule(void)
{
    struct mw_train_config c = base_config();
    c.lr = 1.0; c.warmup = 10; c.steps = 110; c.min_lr_frac = 0.1;
    CHECK(fabs(mw_train_lr(&c, 1) - 0.1) < 1e-12);
    CHECK(fabs(mw_train_lr(&c, 5) - 0.5) < 1e-12);
    CHECK(fabs(mw_train_lr(&c, 10) - 1.0) < 1e-12);
    CHECK(fabs(mw_train_lr(&c, 60) - 0.55) < 1e-12);   /* half-way down the cosine */
    CHECK(fabs(mw_train_lr(&c, 110) - 0.1) < 1e-12);   /* the floor at the last step */
    CHECK(mw_train_lr(&c, 30) > mw_train_lr(&c, 31));
    c.warmup = 0;
    CHECK(fabs(mw_train_lr(&c, 0) - 1.0) < 1e-12);
}

static void make_data(struct mw_data *d, const char *text_kind)
{
    /* A periodic text that a tiny model can learn quickly, or random letters. */
    char path[600];
    snprintf(path, sizeof path, "%s/%s.txt", g_dir, text_kind);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    uint64_t s = 3;
    for (int i = 0; i < 6000; i++) {
        int ch = !strcmp(text_kind, "periodic") ? "the cat sat on the mat. "[i % 24] : 'a' + (int)(tu_rand(&s) % 26);
        fputc(ch, f);
    }
    fclose(f);
    REQUIRE(mw_data_open(d, path, NULL) == 0);
}

static void test_learns(const struct mw_data *d)
{
    struct mw_trainer tr;
    struct mw_train_config c = base_config();
    REQUIRE(trainer_init_gpt2(&tr, &tiny, &c, d) == 0);
    float v0, v1;
    REQUIRE(mw_trainer_eval(&tr, &v0) == 0);
    CHECK_MSG(fabsf(v0 - logf(257.0f)) < 0.3f, "initial val loss %f, expected near ln 257", v0);
    struct mw_train_step_stats st;
    for (int i = 0; i < 40; i++) REQUIRE(mw_trainer_step(&tr, &st) == 0);
    CHECK_EQ_INT(tr.step, 40);
    CHECK_EQ_INT(st.tokens, 64);
    REQUIRE(mw_trainer_eval(&tr, &v1) == 0);
    CHECK_MSG(v1 < 2.5f, "val loss after 40 steps on periodic text: %f (from %f)", v1, v0);
    int32_t prompt = MW_TOK_EOT, out[24];
    REQUIRE(mw_trainer_sample(&tr, &prompt, 1, 24, 1.0f, 5, 1, out) == 0);
    for (int i = 0; i < 24; i++) CHECK(out[i] >= 0 && out[i] < 257);
    int32_t out2[24];
    REQUIRE(mw_trainer_sample(&tr, &prompt, 1, 24, 1.0f, 5, 1, out2) == 0);
    CHECK(!memcmp(out, out2, sizeof out)); /* seeded */
    mw_trainer_free(&tr);
}

/* B=4 in one micro-batch and B=2 in two draw the same four windows in the same order; the
 * mean loss and the update agree up to float rounding of the different summation order. */
static void test_grad_accum(const struct mw_data *d)
{
    struct mw_train_config c1 = base_config(), c2 = base_config();
    c2.batch = 2; c2.grad_accum = 2;
    struct mw_trainer a, b;
    REQUIRE(trainer_init_gpt2(&a, &tiny, &c1, d) == 0);
    REQUIRE(trainer_init_gpt2(&b, &tiny, &c2, d) == 0);
    struct mw_train_step_stats sa, sb;
    for (int i = 0; i < 3; i++) {
        REQUIRE(mw_trainer_step(&a, &sa) == 0);
        REQUIRE(mw_trainer_step(&b, &sb) == 0);
        CHECK_MSG(fabsf(sa.loss - sb.loss) < 1e-5f, "step %d loss %.9g vs %.9g", i + 1, sa.loss, sb.loss);
        CHECK_MSG(fabs(sa.grad_norm - sb.grad_norm) < 1e-4 * sa.grad_norm, "norm %.9g vs %.9g", sa.grad_norm, sb.grad_norm);
    }
    CHECK(a.data_rng == b.data_rng);
    double maxd = 0;
    for (size_t i = 0; i < a.model.sizes.n_params; i++)
        maxd = fmax(maxd, fabs((double)a.model.params[i] - b.model.params[i]));
    CHECK_MSG(maxd < 1e-4, "params differ by %g after 3 steps", maxd);
    mw_trainer_free(&a);
    mw_trainer_free(&b);
}

static void test_clip(const struct mw_data *d)
{
    struct mw_train_config c = base_config();
    c.clip = 1e-3;
    struct mw_trainer tr;
    REQUIRE(trainer_init_gpt2(&tr, &tiny, &c, d) == 0);
    struct mw_train_step_stats st;
    REQUIRE(mw_trainer_step(&tr, &st) == 0);
    CHECK(st.clipped == 1);
    CHECK(st.grad_norm > 1e-3);
    mw_trainer_free(&tr);
}

static int64_t file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (int64_t)st.st_size : -1;
}

static int files_equal(const char *a, const char *b)
{
    FILE *f = fopen(a, "rb"), *g = fopen(b, "rb");
    REQUIRE(f && g);
    int x, y, eq = 1;
    do {
        x = fgetc(f);
        y = fgetc(g);
        if (x != y) eq = 0;
    } while (eq && x != EOF);
    fclose(f);
    fclose(g);
    return eq;
}

static void copy_modified(const char *from, const char *to, int64_t keep, int64_t flip_at)
{
    FILE *f = fopen(from, "rb"), *g = fopen(to, "wb");
    REQUIRE(f && g);
    int ch;
    for (int64_t i = 0; (ch = fgetc(f)) != EOF && i < keep; i++) fputc(i == flip_at ? ch ^ 0x40 : ch, g);
    fclose(f);
    fclose(g);
}

static void test_checkpoint(const struct mw_data *d)
{
    struct mw_train_config c = base_config();
    struct mw_trainer a, b;
    REQUIRE(trainer_init_gpt2(&a, &tiny, &c, d) == 0);
    struct mw_train_step_stats st, sa, sb;
    for (int i = 0; i < 3; i++) REQUIRE(mw_trainer_step(&a, &st) == 0);
    char path[600];
    snprintf(path, sizeof path, "%s/a.mwck", g_dir);
    REQUIRE(mw_trainer_save(&a, "some/data.txt", path) == 0);
    struct mw_ckpt_info info;
    REQUIRE(mw_ckpt_read_info(path, &info) == 0);
    CHECK_EQ_INT(info.step, 3);
    CHECK(info.data_rng == a.data_rng);
    CHECK(!strcmp(info.data_path, "some/data.txt"));
    /* A data path the header cannot hold whole is refused, not cut (nothing written); 511 bytes fit. */
    char longp[700], path2[640];
    memset(longp, 'd', sizeof longp);
    longp[512] = 0;
    snprintf(path2, sizeof path2, "%s/long.mwck", g_dir);
    CHECK_EQ_INT(mw_trainer_save(&a, longp, path2), -ENAMETOOLONG);
    CHECK(strstr(mw_error_msg(), "at most 511"));
    CHECK(access(path2, F_OK) != 0);
    longp[511] = 0;
    CHECK_EQ_INT(mw_trainer_save(&a, longp, path2), 0);
    struct mw_ckpt_info info2;
    CHECK(mw_ckpt_read_info(path2, &info2) == 0 && !strcmp(info2.data_path, longp));
    unlink(path2);
    struct mw_gpt2_config ig;
    REQUIRE(mw_net_gpt2_config(&info.net, &ig) == 0);
    CHECK_EQ_INT(ig.n_layer, 2);
    CHECK_EQ_INT(ig.padded_vocab_size, 264);
    CHECK_EQ_INT(info.train.batch, 4);
    CHECK(info.train.lr == c.lr && info.train.seed == c.seed);
    CHECK_EQ_INT(info.n_params, a.model.sizes.n_params);

    /* A different seed initialises different weights; the load replaces them all. */
    c.seed = 999;
    REQUIRE(trainer_init_gpt2(&b, &tiny, &c, d) == 0);
    REQUIRE(mw_trainer_load(&b, path) == 0);
    CHECK_EQ_INT(b.step, 3);
    CHECK(!memcmp(a.model.params, b.model.params, a.model.sizes.params_bytes));
    REQUIRE(mw_trainer_step(&a, &sa) == 0);
    REQUIRE(mw_trainer_step(&b, &sb) == 0);
    CHECK_MSG(sa.loss == sb.loss, "loss after resume %.9g vs %.9g", sa.loss, sb.loss);
    CHECK(!memcmp(a.model.params, b.model.params, a.model.sizes.params_bytes));

    /* Damage: a flipped byte in the weights, in the optimizer state, a cut file, a bad magic.
     * Verify, then apply: every failed load leaves b exactly as it was: its own checkpoint
     * (weights, optimizer state, step, data RNG) is byte-for-byte the one written before. */
    int64_t size = file_size(path);
    char bad[640], before[640], after[640];
    snprintf(bad, sizeof bad, "%s/bad.mwck", g_dir);
    snprintf(before, sizeof before, "%s/b_before.mwck", g_dir);
    snprintf(after, sizeof after, "%s/b_after.mwck", g_dir);
    REQUIRE(mw_trainer_save(&b, "some/data.txt", before) == 0);
    int64_t flips[] = {1024 + 10, size - 24 - 5};
    for (int i = 0; i < 2; i++) {
        copy_modified(path, bad, size, flips[i]);
        CHECK(mw_ckpt_read_info(bad, &info) == 0); /* the header is intact */
        int r = mw_trainer_load(&b, bad);
        CHECK_MSG(r == MW_ECHECKSUM, "flip at %lld: got %d (%s)", (long long)flips[i], r, mw_error_msg());
        CHECK(strstr(mw_error_msg(), "nothing was loaded") != NULL);
        REQUIRE(mw_trainer_save(&b, "some/data.txt", after) == 0);
        CHECK_MSG(file_size(after) == file_size(before) && files_equal(before, after),
                  "flip at %lld: the failed load changed the trainer", (long long)flips[i]);
    }
    copy_modified(path, bad, size - 1, -1);
    CHECK(mw_trainer_load(&b, bad) == MW_EFORMAT);
    CHECK(strstr(mw_error_msg(), "truncated") != NULL);
    copy_modified(path, bad, 100, -1);
    CHECK(mw_ckpt_read_info(bad, &info) == MW_EFORMAT);
    copy_modified(path, bad, size, 0);
    CHECK(mw_ckpt_read_info(bad, &info) == MW_EFORMAT);
    CHECK(strstr(mw_error_msg(), "not a memwall checkpoint") != NULL);
    copy_modified(path, bad, size, size - 20); /* the trailer's magic */
    CHECK(mw_trainer_load(&b, bad) == MW_EFORMAT);
    REQUIRE(mw_trainer_save(&b, "some/data.txt", after) == 0);
    CHECK_MSG(files_equal(before, after), "a checkpoint without its marker changed the trainer");
    CHECK(mw_ckpt_read_info("/nonexistent/x.mwck", &info) == -ENOENT);

    /* A checkpoint of another model shape is refused. */
    struct mw_gpt2_config other = tiny;
    other.n_layer = 1;
    struct mw_trainer o;
    REQUIRE(trainer_init_gpt2(&o, &other, &c, d) == 0);
    CHECK(mw_trainer_load(&o, path) == -EINVAL);
    mw_trainer_free(&o);
    mw_trainer_free(&a);
    mw_trainer_free(&b);
}

static void test_bad_config(const struct mw_data *d)
{
    struct mw_trainer tr;
    struct mw_train_config c = base_config();
    c.seq = 33; /* longer than the model's context 32 */
    CHECK(trainer_init_gpt2(&tr, &tiny, &c, d) == -EINVAL);
    c = base_config();
    struct mw_gpt2_config small_vocab = tiny;
    small_vocab.vocab_size = 100;
    small_vocab.padded_vocab_size = 0;
    CHECK(trainer_init_gpt2(&tr, &small_vocab, &c, d) == -EINVAL); /* bytes up to 'z' and EOT 256 */
    CHECK(strstr(mw_error_msg(), "use a vocabulary (vocab_size) of") != NULL);
    /* The NVMe tier is sized before anything is allocated: a too-small budget is refused. */
    c.tier = MW_TIER_NVME;
    c.nvme_dir = tu_scratch_dir("train_nvme_budget");
    c.nvme_budget = 4096;
    CHECK(trainer_init_gpt2(&tr, &tiny, &c, d) == MW_EBUDGET);
    CHECK(strstr(mw_error_msg(), "nvme") != NULL);
}

int main(void)
{
    const char *b = getenv("MW_BUILD_DIR");
    snprintf(g_dir, sizeof g_dir, "%s/test-scratch/train-%d", b ? b : "/tmp", (int)getpid());
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    REQUIRE(system(cmd) == 0);
    test_lr_schedule();
    struct mw_data periodic, random_text;
    make_data(&periodic, "periodic");
    make_data(&random_text, "random");
    test_learns(&periodic);
    test_grad_accum(&random_text);
    test_clip(&random_text);
    test_checkpoint(&random_text);
    test_bad_config(&random_text);
    mw_data_free(&periodic);
    mw_data_free(&random_text);
    tu_rm_rf(g_dir);
    TEST_END();
}
