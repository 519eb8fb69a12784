/*
 * test_plan_cases.c — every case of tests/fixtures/planner-cases.json (a copy of the shared
 * ../shared/planner-cases.json: published numbers with sources, formulas and tolerances)
 * checked through the planner library the CLI uses. One line per checked figure:
 * "id key: expected X, got Y ok|FAIL". A case id without a handler here fails: the planner
 * cannot express it yet, and that is a failure, never a skip.
 *
 * Tolerances follow each case's tolerance_note. "printed" comparisons round our value the
 * way the source printed its figure (the number of decimals in the published value).
 */
#include "testutil.h"
#include "memwall/common.h"
#include "memwall/plan.h"

#include <cjson/cJSON.h>
#include <math.h>

#define GIB 1073741824.0
#define TIB 1099511627776.0
#define MIB 1048576.0

static const cJSON *g_cases;
static const char *g_id;
static int g_case_failed;

/* ---- reading the fixture ---------------------------------------------------------------- */

static const cJSON *at(const cJSON *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = cJSON_IsArray(cur) ? cJSON_GetArrayItem(cur, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cur;
}

static double num(const cJSON *o, const char *path)
{
    const cJSON *it = at(o, path);
    if (!cJSON_IsNumber(it)) {
        fprintf(stderr, "%s: fixture has no number at '%s'\n", g_id, path);
        g_case_failed = 1;
        return NAN;
    }
    return it->valuedouble;
}

static const cJSON *case_by_id(const char *id)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, g_cases) {
        const cJSON *i = cJSON_GetObjectItemCaseSensitive(c, "id");
        if (cJSON_IsString(i) && !strcmp(i->valuestring, id)) return c;
    }
    return NULL;
}

/* ---- comparisons ------------------------------------------------------------------------ */

static void report(const char *key, double want, double got, int ok, const char *how)
{
    tu_checks++;
    if (!ok) { tu_failures++; g_case_failed = 1; }
    printf("%-34s %-44s expected %-18.10g got %-18.10g %s%s\n", g_id, key, want, got, ok ? "ok" : "FAIL ", ok ? "" : how);
}

static void exact(const char *key, double want, double got)
{
    report(key, want, got, fabs(want - got) < 0.5, "(exact)");
}

static void absol(const char *key, double want, double got, double tol)
{
    report(key, want, got, fabs(want - got) <= tol, "(absolute tolerance)");
}

static void rel(const char *key, double want, double got, double tol)
{
    report(key, want, got, fabs(want - got) <= tol * fabs(want), "(relative tolerance)");
}

/* Decimals the source printed: the fewest that represent `v` (up to 6). */
static int decimals(double v)
{
    for (int d = 0; d < 6; d++) {
        double x = v * pow(10, d);
        if (fabs(x - round(x)) < 1e-6 * fmax(1, fabs(x))) return d;
    }
    return 6;
}

/* Our value rounded as printed must be within `units` of the last printed digit. */
static void printed(const char *key, double pub, double got, double units)
{
    double u = pow(10, -decimals(pub));
    report(key, pub, got, fabs(got - pub) <= units * u + 1e-9, "(printed digits)");
}

/* ---- model and plan helpers ------------------------------------------------------------- */

static struct mw_model zoo(const char *name)
{
    struct mw_model m;
    REQUIRE(mw_model_lookup(name, &m) == 0);
    return m;
}

/* A GPT block with exactly 12h^2 parameters (no biases, norms, embeddings): the shape the
 * papers' formulas count when they exclude the embedding and output layers. */
static struct mw_model gpt_core(uint64_t L, uint64_t h, uint64_t heads, uint64_t ffn)
{
    struct mw_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "gpt-core");
    m.arch = MW_ARCH_GPT;
    m.n_layer = L; m.hidden = h; m.n_head = m.n_kv_head = heads; m.head_dim = h / heads;
    m.ffn = ffn ? ffn : 4 * h;
    return m;
}

static struct mw_plan_result *g_res;

static const struct mw_plan_result *plan(const struct mw_model *m, const struct mw_layout *l,
                                         const struct mw_hw *hw)
{
    int err = mw_plan_compute(m, l, hw, g_res);
    if (err) {
        printf("%-34s plan failed: %s\n", g_id, mw_error_msg());
        tu_checks++; tu_failures++; g_case_failed = 1;
    }
    return g_res;
}

static uint64_t states(const struct mw_stage *s)
{
    return s->gpu.params + s->gpu.grads + s->gpu.optimizer;
}

static struct mw_layout mixed16(void) /* fp16 weights/grads, fp32 master + Adam: K = 12 */
{
    struct mw_layout l;
    mw_layout_default(&l);
    l.weight = l.grad = MW_DT_FP16;
    return l;
}

#include "plan_cases_params.h"
#include "plan_cases_memory.h"

/* ---- the runner ------------------------------------------------------------------------- */

struct handler { const char *id; void (*fn)(const cJSON *c); };

static const struct handler handlers[] = {
    {"PARAM-GPT2-SMALL", param_gpt2_small},
    {"PARAM-GPT2-FAMILY", param_gpt2_family},
    {"PARAM-LLAMA2", param_llama2},
    {"PARAM-DEEPSEEK-V3", param_deepseek_v3},
    {"PARAM-MEGATRON-2021-TABLE1", param_megatron_table1},
    {"PARAM-ENCODERS-FOR-ESTIMATORS", param_encoders},
    {"DS-Z3-T5_3B-LIVE-8GPU", ds_zero3},
    {"DS-Z3-COLD-2851M-8GPU", ds_zero3},
    {"DS-Z3-T0_3B-1GPU", ds_zero3},
    {"DS-Z2-T5_3B-LIVE-8GPU", ds_zero2},
    {"DS-Z3-T5LARGE-MANUAL", ds_zero3_manual},
    {"ACCEL-BERT-BASE-CASED", accel_bert},
    {"ACCEL-VIT-L-BREAKDOWN", accel_vit},
    {"ZERO-FIG1-7.5B-64GPU", zero_fig1},
    {"ZERO-TABLE1-7.5B", zero_table1},
    {"ZERO-TABLE1-1T", zero_table1},
    {"ZERO-GPT2-1.5B-STATES-ACT", zero_gpt2},
    {"ZERO-COMM-VOLUME", zero_comm},
    {"MEGATRON-ACT-FIG1-22B", megatron_fig1},
    {"MEGATRON-ACT-FIG1-175B", megatron_fig1},
    {"MEGATRON-ACT-FIG1-530B", megatron_fig1},
    {"MEGATRON-ACT-FIG1-1T", megatron_fig1},
    {"MEGATRON-ACT-TABLE2-GPT3-LAYER", megatron_table2},
    {"MEGATRON-ACT-FIG7-RELATIVE", megatron_fig7},
    {"MEGATRON-TIME-TABLE5-MFU", megatron_table5},
    {"MEGATRON-THEORETICAL-GPT2XL-1GPU", megatron_theoretical},
    {"MEGATRON-BRIDGE-LLAMA3-8B-DISTOPT", megatron_bridge},
    {"MEGATRON-DISTOPT-BYTES-PER-PARAM", megatron_distopt},
    {"MEGATRON-2021-TRAINING-TIME", megatron_training_time},
    {"PLAYBOOK-MIXED-PRECISION-TABLE", playbook_mixed},
    {"PLAYBOOK-LLAMA3.1-8B-ACT", playbook_llama_act},
    {"DSV3-ZHANGSU-PARAMS-PER-DEVICE", dsv3_per_device},
    {"DSV3-ZHANGSU-STAGE-SIZES", dsv3_stage_sizes},
    {"DSV3-ZHANGSU-ACT-FULL-RECOMPUTE", dsv3_act_full},
    {"MCORE-MOE-DSV3-256GPU", mcore_dsv3},
    {"KV-OPT13B-VLLM", kv_case},
    {"KV-LLAMA2-7B", kv_case},
    {"KV-LLAMA3-8B-GQA", kv_case},
    {"KV-GPT2XL-MHA", kv_case},
    {"LLMC-GPT2-124M-BUFFERS", llmc_buffers},
    {"ZERO-INFINITY-FIG2A", zero_inf_fig2a},
    {"ZERO-INFINITY-BW-EFFICIENCY", zero_inf_bw},
};

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        rewind(f);
        buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) buf[n] = 0;
        else { free(buf); buf = NULL; }
    }
    fclose(f);
    return buf;
}

int main(void)
{
    const char *src = getenv("MW_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/planner-cases.json", src ? src : ".");
    char *text = slurp(path);
    if (!text) fprintf(stderr, "cannot read %s (set MW_SOURCE_DIR to the source tree)\n", path);
    REQUIRE(text != NULL);
    /* The fixture is a copy of the team's shared file; say so when they drift apart. */
    snprintf(path, sizeof path, "%s/../shared/planner-cases.json", src ? src : ".");
    char *shared = slurp(path);
    if (shared && strcmp(shared, text))
        printf("WARNING: tests/fixtures/planner-cases.json differs from %s: copy it over\n", path);
    free(shared);
    cJSON *root = cJSON_Parse(text);
    REQUIRE(cJSON_IsArray(root));
    g_cases = root;
    g_res = malloc(sizeof *g_res);
    REQUIRE(g_res != NULL);
    int passed = 0, total = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        REQUIRE(cJSON_IsString(id));
        g_id = id->valuestring;
        g_case_failed = 0;
        total++;
        const struct handler *h = NULL;
        for (size_t i = 0; i < sizeof handlers / sizeof handlers[0]; i++)
            if (!strcmp(handlers[i].id, g_id)) h = &handlers[i];
        if (!h) {
            printf("%-34s FAIL: the planner cannot express this case (no handler)\n", g_id);
            tu_checks++; tu_failures++;
            continue;
        }
        h->fn(c);
        if (!g_case_failed) passed++;
    }
    printf("\nplanner cases: %d of %d passed\n", passed, total);
    cJSON_Delete(root);
    free(text);
    free(g_res);
    TEST_END();
}
