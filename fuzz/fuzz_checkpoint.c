/*
 * fuzz_checkpoint.c — a training checkpoint: the header (mw_ckpt_read_info) and the whole load
 * path (mw_trainer_load) into one small trainer built once. A failed load must leave the
 * trainer's weights bitwise as they were (verify, then apply): checked on every input.
 * MW_FUZZ_SEED_OUT=path writes that trainer's checkpoint as a valid seed.
 */
#include "fuzz.h"
#include "memwall/train.h"

/* The trainer takes a model through the seam (memwall/model.h): a GPT-2 config as a seam config. */
static int trainer_init_gpt2(struct mw_trainer *tr, const struct mw_gpt2_config *g, const struct mw_train_config *c,
                             const struct mw_data *d)
{
    struct mw_net_config n;
    mw_net_config_gpt2(&n, g);
    return mw_trainer_init(tr, &n, c, d);
}

static struct mw_trainer tr;
static struct mw_data data;
static float *snapshot;

static void init_once(void)
{
    const char *dir = fz_scratch();
    char p[400];
    snprintf(p, sizeof p, "%s/text.txt", dir);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    for (int i = 0; i < 2000; i++) fputc("the cat sat on the mat. "[i % 24], f);
    fclose(f);
    if (mw_data_open(&data, p, NULL)) abort();
    static const struct mw_gpt2_config mc = {1, 2, 8, 8, MW_TOK_BYTE_VOCAB, 264};
    struct mw_train_config c = {
        .batch = 1, .seq = 8, .grad_accum = 1, .steps = 4, .lr = 1e-3, .warmup = 0, .min_lr_frac = 0.1,
        .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .val_batches = 1, .seed = 3, .threads = 1,
        .tier = MW_TIER_DRAM,
    };
    if (trainer_init_gpt2(&tr, &mc, &c, &data)) { fprintf(stderr, "fuzz: %s\n", mw_error_msg()); abort(); }
    struct mw_train_step_stats st;
    if (mw_trainer_step(&tr, &st)) abort();
    const char *seed = getenv("MW_FUZZ_SEED_OUT");
    if (seed && mw_trainer_save(&tr, "text.txt", seed)) abort();
    snapshot = malloc(tr.model.sizes.params_bytes);
    if (!snapshot) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    static int ready;
    if (!ready++) init_once();
    const char *path = fz_write(d, size, "ckpt.mwck");
    struct mw_ckpt_info info;
    (void)mw_ckpt_read_info(path, &info);
    memcpy(snapshot, tr.model.params, tr.model.sizes.params_bytes);
    int64_t step = tr.step;
    int rc = mw_trainer_load(&tr, path);
    if (rc != 0 && (memcmp(snapshot, tr.model.params, tr.model.sizes.params_bytes) || tr.step != step)) {
        fprintf(stderr, "fuzz: a failed load (%s) changed the trainer\n", mw_error_msg());
        abort();
    }
    return 0;
}
