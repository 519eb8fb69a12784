/*
 * test_gpt2_hf_fixture.c — a GPT-2 written by Hugging Face transformers (save_pretrained:
 * config.json + model.safetensors; scripts/gen_fixtures.py --only gpt2_hf) with a head size of
 * 32, read for what it is: the head count comes from config.json (2 heads of 32, not the
 * n_embd / 64 = 1 head of 64 a guess gives), and memwall's loss on the fixed window of
 * expected.txt matches the loss transformers computed within 1e-6 relative. Without the
 * config.json the guess is reported as a guess, and its loss differs: the test shows why the
 * file is read.
 */
#include "memwall/gpt2.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>

struct expected { int B, T; int32_t window[4096]; int n; double loss32, loss64; };

static void read_expected(const char *path, struct expected *e)
{
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    char key[64];
    memset(e, 0, sizeof *e);
    while (fscanf(f, "%63s", key) == 1) {
        if (key[0] == '#') { int c; while ((c = fgetc(f)) != '\n' && c != EOF) {} continue; }
        if (!strcmp(key, "B")) REQUIRE(fscanf(f, "%d", &e->B) == 1);
        else if (!strcmp(key, "T")) REQUIRE(fscanf(f, "%d", &e->T) == 1);
        else if (!strcmp(key, "loss_fp32")) REQUIRE(fscanf(f, "%lf", &e->loss32) == 1);
        else if (!strcmp(key, "loss_fp64")) REQUIRE(fscanf(f, "%lf", &e->loss64) == 1);
        else if (!strcmp(key, "loss_hf_labels")) { double x; REQUIRE(fscanf(f, "%lf", &x) == 1); }
        else if (!strcmp(key, "window")) {
            REQUIRE(e->B > 0 && e->T > 0 && e->B * (e->T + 1) <= 4096);
            for (e->n = 0; e->n < e->B * (e->T + 1); e->n++) REQUIRE(fscanf(f, "%d", &e->window[e->n]) == 1);
        } else REQUIRE(!"unknown key in expected.txt");
    }
    fclose(f);
    REQUIRE(e->n == e->B * (e->T + 1) && e->loss32 > 0);
}

/* memwall's mean loss of the window under cfg, loading the weights from st. */
static double loss_of(const struct mw_gpt2_config *cfg, const char *st, const struct expected *e)
{
    struct mw_gpt2_options o = {.max_batch = e->B, .max_seq = e->T, .n_threads = 2};
    struct mw_gpt2 m;
    REQUIRE(mw_gpt2_init(&m, cfg, &o) == 0);
    int rc = mw_gpt2_load_safetensors(&m, st);
    CHECK_MSG(rc == 0, "load: %s", mw_error_msg());
    int32_t in[4096], tg[4096];
    for (int b = 0; b < e->B; b++)
        for (int t = 0; t < e->T; t++) {
            in[b * e->T + t] = e->window[b * (e->T + 1) + t];
            tg[b * e->T + t] = e->window[b * (e->T + 1) + t + 1];
        }
    REQUIRE(mw_gpt2_forward(&m, in, tg, e->B, e->T) == 0);
    double loss = m.loss;
    mw_gpt2_free(&m);
    return loss;
}

int main(void)
{
    const char *src = getenv("MW_SOURCE_DIR");
    REQUIRE(src);
    char dir[600], st[700], exp[700];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/gpt2_hf_heads32", src);
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    snprintf(exp, sizeof exp, "%s/expected.txt", dir);
    struct expected e;
    read_expected(exp, &e);

    /* The config as resolved: sizes from the tensors and config.json, the head count from it. */
    struct mw_gpt2_config cfg;
    struct mw_gpt2_provenance pv;
    int rc = mw_gpt2_config_resolve(st, NULL, &cfg, &pv);
    if (rc) fprintf(stderr, "resolve: %s\n", mw_error_msg());
    REQUIRE(rc == 0);
    CHECK_EQ_INT(cfg.n_layer, 2);
    CHECK_EQ_INT(cfg.n_embd, 64);
    CHECK_EQ_INT(cfg.n_head, 2);
    CHECK_EQ_INT(cfg.max_seq_len, 32);
    CHECK_EQ_INT(cfg.vocab_size, 128);
    CHECK(pv.n_head == MW_GPT2_FROM_CONFIG_JSON && pv.vocab_size == MW_GPT2_FROM_CONFIG_JSON);
    CHECK(pv.n_embd == MW_GPT2_FROM_TENSORS && pv.n_layer == MW_GPT2_FROM_TENSORS);
    CHECK(strstr(pv.config_json, "gpt2_hf_heads32/config.json") != NULL);

    double loss = loss_of(&cfg, st, &e);
    double rel = fabs(loss - e.loss32) / e.loss32;
    printf("memwall loss %.9f, transformers fp32 %.9f (fp64 %.11f): relative difference %.2e\n", loss, e.loss32,
           e.loss64, rel);
    CHECK_MSG(rel <= 1e-6, "loss %.9f vs transformers' %.9f: relative %.3g > 1e-6", loss, e.loss32, rel);

    /* Without config.json: the same weights, the head count guessed (and said to be a guess):
     * 1 head of 64 instead of 2 of 32 -- a different model, a different loss. */
    const char *scratch = tu_scratch_dir("gpt2_hf_fixture");
    char copy[700], cmd[1600];
    snprintf(copy, sizeof copy, "%s/model.safetensors", scratch);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", st, copy);
    REQUIRE(system(cmd) == 0);
    REQUIRE(mw_gpt2_config_resolve(copy, NULL, &cfg, &pv) == 0);
    CHECK(cfg.n_head == 1 && pv.n_head == MW_GPT2_FROM_GUESS && pv.config_json[0] == 0);
    double guessed = loss_of(&cfg, copy, &e);
    printf("with n_head guessed as %d: loss %.6f\n", cfg.n_head, guessed);
    CHECK_MSG(fabs(guessed - e.loss32) / e.loss32 > 1e-3, "a wrong head count gave the same loss %.9f", guessed);
    /* The flag fills what no file says: --heads 2 restores the model. */
    struct mw_gpt2_config flags = {.n_head = 2};
    REQUIRE(mw_gpt2_config_resolve(copy, &flags, &cfg, &pv) == 0);
    CHECK(cfg.n_head == 2 && pv.n_head == MW_GPT2_FROM_FLAG);
    CHECK(fabs(loss_of(&cfg, copy, &e) - loss) == 0);
    tu_rm_rf(scratch);
    TEST_END();
}
