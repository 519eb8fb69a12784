/*
 * test_llama_train.c — the Llama family trained by the trainer through the table (as
 * tests/test_net_toy.c trains its toy): resident, with the optimizer state on NVMe, and with its
 * weights and gradients streamed from NVMe batch-major and layer-major (2 micro-batches a step),
 * layer-major with the blocks' activations written to NVMe and read back instead of recomputed:
 * every run's losses and final state (weights and moments, read back through a checkpoint)
 * bitwise the resident run's, for a tied model with grouped heads and q/k/v biases and an untied
 * one with llama3 rope; and it learns (the loss falls).
 */
#include "memwall/llama.h"
#include "memwall/model.h"
#include "memwall/train.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the runs */

static char g_dir[600];

struct result { float loss[16]; uint8_t *state; size_t n; };

static void run(const struct mw_net_config *nc, const struct mw_data *d, const char *how, struct result *r)
{
    struct mw_train_config c = {
        .batch = 4, .seq = 8, .grad_accum = 2, .steps = 12, .lr = 0.05, .warmup = 2, .min_lr_frac = 0.1,
        .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .clip = 1.0, .val_every = 0,
        .val_batches = 1, .seed = 5, .threads = 2, .tier = MW_TIER_DRAM, .subgroup_size = 4096, .buffer_count = 3,
        .prefetch_depth = 1,
    };
    char nv[700];
    snprintf(nv, sizeof nv, "%s/%s", g_dir, how);
    c.nvme_dir = nv;
    if (strcmp(how, "dram")) c.tier = MW_TIER_NVME;
    if (!strncmp(how, "stream", 6)) c.offload_params = MW_TIER_NVME;
    if (!strcmp(how, "stream-lm") || !strcmp(how, "stream-acts")) c.layer_major = 1;
    if (!strcmp(how, "stream-acts")) c.acts_nvme = 1; /* blocks' activations on NVMe, not recomputed */
    if (!strcmp(how, "stream-bm")) c.sync_update = 1; /* either way: same results */
    struct mw_trainer tr;
    int err = mw_trainer_init(&tr, nc, &c, d);
    CHECK_MSG(err == 0, "%s: %s", how, mw_error_msg());
    if (err) return;
    for (int s = 0; s < 12; s++) {
        struct mw_train_step_stats st;
        err = mw_trainer_step(&tr, &st);
        CHECK_MSG(err == 0, "%s step %d: %s", how, s, mw_error_msg());
        if (err) break;
        r->loss[s] = st.loss;
    }
    CHECK(mw_trainer_finish(&tr) == 0);
    /* The state as the run ends, through a checkpoint (the residency interface brings each unit
     * in, streamed ones from NVMe): the weights and the optimizer's moments after the header. */
    char ck[800];
    snprintf(ck, sizeof ck, "%s/%s.mwck", g_dir, how);
    CHECK_MSG(mw_trainer_save(&tr, "", ck) == 0, "%s: %s", how, mw_error_msg());
    FILE *f = fopen(ck, "rb");
    if (f && !fseek(f, 0, SEEK_END)) {
        long len = ftell(f);
        r->n = len > 1024 + 24 ? (size_t)len - 1024 - 24 : 0;
        r->state = malloc(r->n ? r->n : 1);
        CHECK(!fseek(f, 1024, SEEK_SET) && fread(r->state, 1, r->n, f) == r->n);
    }
    if (f) fclose(f);
    mw_trainer_free(&tr);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "%s", tu_scratch_dir("llama_train"));
    char path[700];
    snprintf(path, sizeof path, "%s/text.txt", g_dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    for (int i = 0; i < 4000; i++) fputc("abcab cba "[i % 10], f);
    fclose(f);
    struct mw_data d;
    struct mw_data_opts o;
    mw_data_opts_default(&o);
    REQUIRE(mw_data_open(&d, path, &o) == 0);
    for (int v = 0; v < 2; v++) {
        struct mw_llama_config lc = {.n_layer = 2, .n_head = 4, .n_kv_head = 2, .head_dim = 6, .dim = 24, .ffn = 40,
                                     .vocab = MW_TOK_BYTE_VOCAB, .context = 16, .tied = !v, .qkv_bias = !v,
                                     .rms_eps = 1e-5f, .rope_theta = 10000.0f};
        if (v) {
            lc.rope_type = MW_LLAMA_ROPE_LLAMA3;
            lc.rope_factor = 8.0f; lc.rope_low = 1.0f; lc.rope_high = 4.0f; lc.rope_orig_ctx = 8;
        }
        struct mw_net_config nc;
        mw_net_config_llama(&nc, &lc);
        const char *how[] = {"dram", "nvme", "stream-bm", "stream-lm", "stream-acts"};
        struct result r[5];
        memset(r, 0, sizeof r);
        for (int i = 0; i < 5; i++) run(&nc, &d, how[i], &r[i]);
        printf("%s: loss %.4f -> %.4f\n", v ? "untied" : "tied", r[0].loss[0], r[0].loss[11]);
        CHECK_MSG(r[0].loss[11] < r[0].loss[0] - 0.5f, "llama does not learn: %g -> %g", r[0].loss[0], r[0].loss[11]);
        for (int i = 1; i < 5; i++) {
            if (memcmp(r[i].loss, r[0].loss, sizeof r[0].loss))
                for (int s = 0; s < 12; s++) printf("  %s step %d: %.9g vs resident %.9g\n", how[i], s, r[i].loss[s], r[0].loss[s]);
            CHECK_MSG(!memcmp(r[i].loss, r[0].loss, sizeof r[0].loss), "%s: losses differ from the resident run's", how[i]);
            CHECK_MSG(r[i].state && r[0].state && r[i].n == r[0].n && r[0].n > 0 && !memcmp(r[i].state, r[0].state, r[0].n),
                      "%s: final weights or moments differ from the resident run's", how[i]);
        }
        for (int i = 0; i < 5; i++) free(r[i].state);
    }
    mw_data_free(&d);
    tu_rm_rf(g_dir);
    TEST_END();
}
