/*
 * test_plan_zero3.c — the planner's ZeRO-3 weight memory, the figure `memwall train --zero 3`
 * is checked against: shard + the two largest gathered units, with every unit computed here
 * from the GPT-2 dims on its own (E = (Vp + maxT) C, B = 12C^2 + 13C, F = 2C); the parameter
 * count against the model's own mw_gpt2_num_params; the same for a Llama model from its family's
 * description; pipeline stages and TP; and `memwall plan` printing the same numbers for the same
 * config.json.
 */
#include "testutil.h"
#include "memwall/common.h"
#include "memwall/gpt2.h"
#include "memwall/llama.h"
#include "memwall/model.h"
#include "memwall/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>

struct dims { int L, C, NH, V, Vp, T; };

static const struct dims D124 = {12, 768, 12, 50257, 50304, 1024}; /* train pads 50257 -> 50304 */
static const struct dims D124_HF = {12, 768, 12, 50257, 50257, 1024};
static const struct dims DSMALL = {4, 128, 4, 264, 264, 128};

static uint64_t E_of(const struct dims *d) { return (uint64_t)(d->Vp + d->T) * (uint64_t)d->C; }
static uint64_t B_of(const struct dims *d) { return 12ull * (uint64_t)d->C * (uint64_t)d->C + 13ull * (uint64_t)d->C; }
static uint64_t F_of(const struct dims *d) { return 2ull * (uint64_t)d->C; }

/* The two largest of E, B (L times), F. */
static void top2(const struct dims *d, uint64_t *a, uint64_t *b)
{
    uint64_t u[3] = {E_of(d), B_of(d), F_of(d)};
    *a = *b = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < (i == 1 ? d->L : 1); k++) {
            if (u[i] > *a) { *b = *a; *a = u[i]; }
            else if (u[i] > *b) *b = u[i];
        }
}

static void check_dims(const struct dims *d, int ranks, double wb)
{
    struct mw_plan_zero3_weights z;
    int err = mw_plan_gpt2_zero3_weights(d->L, d->C, d->NH, d->Vp, d->T, ranks, wb, &z);
    CHECK_MSG(err == 0, "%s", mw_error_msg());
    if (err) return;
    const uint64_t P = E_of(d) + (uint64_t)d->L * B_of(d) + F_of(d);
    struct mw_gpt2_config cfg = {.n_layer = d->L, .n_head = d->NH, .n_embd = d->C, .max_seq_len = d->T,
                                 .vocab_size = d->V, .padded_vocab_size = d->Vp};
    REQUIRE(mw_gpt2_config_check(&cfg) == 0);
    CHECK_EQ_INT(z.params, P);
    CHECK_EQ_INT(z.params, mw_gpt2_num_params(&cfg));
    uint64_t a, b;
    top2(d, &a, &b);
    CHECK_EQ_INT(z.largest_unit_params, a);
    CHECK_EQ_INT(z.second_unit_params, b);
    CHECK_EQ_INT(z.shard_bytes, (uint64_t)((double)((P + (uint64_t)ranks - 1) / (uint64_t)ranks) * wb));
    CHECK_EQ_INT(z.gathered_bytes, (uint64_t)((double)(a + b) * wb));
    CHECK_EQ_INT(z.total_bytes, z.shard_bytes + z.gathered_bytes);
}

static void test_gpt2_figures(void)
{
    for (int n = 1; n <= 8; n *= 2) {
        check_dims(&D124, n, 4);
        check_dims(&D124_HF, n, 4);
        check_dims(&DSMALL, n, 4);
    }
    check_dims(&D124, 2, 2);
    check_dims(&DSMALL, 3, 0.5);
    /* GPT-2 124M: the embedding, not a second block, is gathered beside a block. */
    struct mw_plan_zero3_weights z;
    REQUIRE(mw_plan_gpt2_zero3_weights(12, 768, 12, 50304, 1024, 2, 4, &z) == 0);
    CHECK_EQ_INT(z.largest_unit_params, 39419904);   /* 50304 x 768 + 1024 x 768 */
    CHECK_EQ_INT(z.second_unit_params, 7087872);     /* 12 x 768^2 + 13 x 768 */
    CHECK(!strcmp(z.largest_unit, "embedding") && !strcmp(z.second_unit, "block"));
    CHECK_EQ_INT(z.shard_bytes, 248951808);          /* 124475904 / 2 x 4 */
    CHECK_EQ_INT(z.gathered_bytes, 186031104);
    /* The small config: a block outweighs the embedding, so two blocks are live. */
    REQUIRE(mw_plan_gpt2_zero3_weights(4, 128, 4, 264, 128, 2, 4, &z) == 0);
    CHECK(!strcmp(z.largest_unit, "block") && !strcmp(z.second_unit, "block"));
    CHECK_EQ_INT(z.gathered_bytes, 2 * 198272 * 4);

    CHECK_EQ_INT(mw_plan_gpt2_zero3_weights(12, 768, 12, 50304, 1024, 2, 3, &z), -EINVAL);
    CHECK_EQ_INT(mw_plan_gpt2_zero3_weights(12, 768, 7, 50304, 1024, 2, 4, &z), -EINVAL);
    CHECK_EQ_INT(mw_plan_gpt2_zero3_weights(12, 768, 12, 50304, 1024, 0, 4, &z), -EINVAL);
    CHECK_EQ_INT(z.total_bytes, 0);
}

/* A rotary model (no position rows, max_pos 0) through the family's own description, as
 * `memwall train --zero 3` asks for it: the Llama fixture llama3_untied (L=3, C=32, 2 heads of 16,
 * ffn 48, vocab 71, untied) and a tied one whose embedding outweighs a block. This once failed
 * (the GPT-2 entry refused 0 positions) after the last step of every Llama ZeRO-3 run. */
static void test_llama_figures(void)
{
    const struct mw_net_family *f = mw_net_family_find("llama");
    REQUIRE(f != NULL);
    struct mw_llama_config c = {.n_layer = 3, .n_head = 2, .n_kv_head = 2, .head_dim = 16, .dim = 32, .ffn = 48,
                                .vocab = 71, .context = 64, .tied = 0, .rms_eps = 1e-5f, .rope_theta = 5e5f};
    REQUIRE(mw_llama_config_check(&c) == 0);
    struct mw_net_config nc;
    mw_net_config_llama(&nc, &c);
    struct mw_model md;
    f->config_describe(nc.raw, &md);
    CHECK_EQ_INT(md.max_pos, 0);
    struct mw_plan_zero3_weights z;
    int err = mw_plan_zero3_weights(&md, 2, 4, &z);
    CHECK_MSG(err == 0, "%s", mw_error_msg());
    const uint64_t E = 71 * 32, B = 4 * 32 * 32 + 3 * 32 * 48 + 2 * 32, P = 2 * E + 3 * B + 32;
    struct mw_net_options one = {1, 1, 0, 1};
    struct mw_net_sizes ns;
    REQUIRE(mw_net_sizes(&nc, &one, &ns) == 0);
    CHECK_EQ_INT(z.params, P);
    CHECK_EQ_INT(z.params, ns.n_params);
    CHECK(!strcmp(z.largest_unit, "block") && !strcmp(z.second_unit, "block"));
    CHECK_EQ_INT(z.gathered_bytes, 2 * B * 4);
    CHECK_EQ_INT(z.shard_bytes, (P + 1) / 2 * 4);
    /* tied, a vocabulary of 4096: the embedding (which is the head) and a block */
    c.tied = 1;
    c.vocab = 4096;
    mw_net_config_llama(&nc, &c);
    f->config_describe(nc.raw, &md);
    REQUIRE(mw_plan_zero3_weights(&md, 4, 2, &z) == 0);
    CHECK_EQ_INT(z.params, 4096 * 32 + 3 * B + 32);
    CHECK(!strcmp(z.largest_unit, "embedding") && !strcmp(z.second_unit, "block"));
    CHECK_EQ_INT(z.gathered_bytes, (4096 * 32 + B) * 2);
    CHECK_EQ_INT(mw_plan_zero3_weights(&md, 0, 4, &z), -EINVAL);
    CHECK_EQ_INT(z.total_bytes, 0);
}

static int gpt2_model(const struct dims *d, struct mw_model *m)
{
    char js[256];
    snprintf(js, sizeof js, "{\"model_type\": \"gpt2\", \"n_layer\": %d, \"n_embd\": %d, \"n_head\": %d, "
             "\"vocab_size\": %d, \"n_positions\": %d}", d->L, d->C, d->NH, d->Vp, d->T);
    return mw_model_from_config_json(js, "gpt2-test", m);
}

/* Stages: only the first holds the embedding, only the last the final norm and head; TP
 * splits the vocabulary rows and the column/row-parallel matrices. */
static void test_stages_and_tp(struct mw_plan_result *r)
{
    const struct dims *d = &D124_HF;
    const uint64_t C = (uint64_t)d->C, E = E_of(d), B = B_of(d);
    struct mw_model m;
    struct mw_layout l;
    REQUIRE(gpt2_model(d, &m) == 0);
    mw_layout_default(&l);
    l.pp = 3; l.zero = 3; l.weight = MW_DT_FP32;
    REQUIRE(mw_plan_compute(&m, &l, NULL, r) == 0);
    CHECK_EQ_INT(r->stage[0].unit_params[0], E);
    CHECK_EQ_INT(r->stage[0].unit_params[1], B);
    CHECK_EQ_INT(r->stage[0].gathered, (E + B) * 4);
    CHECK_EQ_INT(r->stage[1].unit_params[0], B);     /* middle: blocks only */
    CHECK_EQ_INT(r->stage[1].unit_params[1], B);
    CHECK(!strcmp(r->stage[1].unit_name[0], "block"));
    CHECK_EQ_INT(r->stage[1].gathered, 2 * B * 4);
    /* The last stage keeps its copy of the tied embedding as the head (no positions). */
    CHECK_EQ_INT(r->stage[2].unit_params[0], (uint64_t)d->Vp * C);
    CHECK(!strcmp(r->stage[2].unit_name[0], "head"));
    for (int s = 0; s < 3; s++)
        CHECK_EQ_INT(r->stage[s].gpu.buffers, r->stage[s].gathered); /* nothing else buffered */
    /* Below ZeRO-3 nothing is gathered. */
    l.zero = 2;
    REQUIRE(mw_plan_compute(&m, &l, NULL, r) == 0);
    CHECK_EQ_INT(r->stage[0].gathered, 0);

    mw_layout_default(&l);
    l.tp = 2; l.zero = 3; l.weight = MW_DT_FP32;
    REQUIRE(mw_plan_compute(&m, &l, NULL, r) == 0);
    const uint64_t Etp = ((uint64_t)d->Vp * C + 1) / 2 + (uint64_t)d->T * C;
    const uint64_t Btp = (4 * C * C + 3 * C) / 2 + (8 * C * C + 4 * C) / 2 + 6 * C;
    CHECK_EQ_INT(r->stage[0].unit_params[0], Etp);
    CHECK_EQ_INT(r->stage[0].unit_params[1], Btp);
    CHECK_EQ_INT(r->stage[0].params, Etp + 12 * Btp + 2 * C); /* units cover the rank exactly */
}

/* `memwall plan --model CONFIG.json --gpus N --zero 3 --weight-dtype fp32 --json` prints the
 * function's figures. */
static void test_cli(void)
{
    const char *cli = getenv("MW_CLI");
    if (!cli) { fprintf(stderr, "MW_CLI unset: CLI comparison not run\n"); return; }
    const char *dir = tu_scratch_dir("plan_zero3");
    static const struct { const struct dims *d; int n; } k[] = {{&D124, 2}, {&D124, 8}, {&DSMALL, 2}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const struct dims *d = k[i].d;
        char path[600], cmd[1800], out[8192];
        snprintf(path, sizeof path, "%s/config-%zu.json", dir, i);
        FILE *f = fopen(path, "w");
        REQUIRE(f != NULL);
        fprintf(f, "{\"model_type\": \"gpt2\", \"n_layer\": %d, \"n_embd\": %d, \"n_head\": %d, "
                "\"vocab_size\": %d, \"n_positions\": %d}\n", d->L, d->C, d->NH, d->Vp, d->T);
        fclose(f);
        snprintf(cmd, sizeof cmd, "'%s' plan --model '%s' --gpus %d --zero 3 --weight-dtype fp32 --json",
                 cli, path, k[i].n);
        FILE *p = popen(cmd, "r");
        REQUIRE(p != NULL);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        CHECK_EQ_INT(pclose(p), 0);
        struct mw_plan_zero3_weights z;
        REQUIRE(mw_plan_gpt2_zero3_weights(d->L, d->C, d->NH, d->Vp, d->T, k[i].n, 4, &z) == 0);
        cJSON *root = cJSON_Parse(out);
        const cJSON *z3 = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "per_device"), "zero3");
        CHECK_MSG(z3 != NULL, "no per_device.zero3 in: %.300s", out);
        if (z3) {
            CHECK_EQ_INT(cJSON_GetObjectItem(z3, "shard_bytes")->valuedouble, z.shard_bytes);
            CHECK_EQ_INT(cJSON_GetObjectItem(z3, "gathered_bytes")->valuedouble, z.gathered_bytes);
            CHECK_EQ_INT(cJSON_GetObjectItem(z3, "total_bytes")->valuedouble, z.total_bytes);
            CHECK_EQ_INT(cJSON_GetObjectItem(z3, "largest_unit_params")->valuedouble, z.largest_unit_params);
            CHECK_EQ_INT(cJSON_GetObjectItem(z3, "second_unit_params")->valuedouble, z.second_unit_params);
            CHECK(!strcmp(cJSON_GetObjectItem(z3, "largest_unit")->valuestring, z.largest_unit));
        }
        CHECK_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "params_total")->valuedouble,
                     z.params);
        cJSON_Delete(root);
    }
    tu_rm_rf(dir);
}

int main(void)
{
    struct mw_plan_result *r = malloc(sizeof *r);
    REQUIRE(r != NULL);
    test_gpt2_figures();
    test_llama_figures();
    test_stages_and_tp(r);
    test_cli();
    free(r);
    TEST_END();
}
