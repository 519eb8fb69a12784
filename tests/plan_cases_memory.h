/*
 * plan_cases_memory.h — handlers of test_plan_cases.c for model states, activations, time,
 * DeepSeek sharding and KV caches: all through mw_plan_compute and the functions it uses.
 * Included once, by test_plan_cases.c only.
 */

/* ---- ZeRO ----------------------------------------------------------------------------------- */

/* Per-GPU model states (GB = 1e9) of `params` at ZeRO `stage` over `dp` ranks, K = 12. */
static double zero_states_gb(double params, int stage, uint64_t dp)
{
    struct mw_model m;
    mw_model_bare(&m, (uint64_t)params, 0);
    struct mw_layout l = mixed16();
    l.dp = dp;
    l.zero = stage;
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    return (double)states(&r->stage[0]) / 1e9;
}

static void zero_fig1(const cJSON *c)
{
    const double P = num(c, "inputs.params");
    const uint64_t dp = (uint64_t)num(c, "inputs.dp");
    exact("K (bytes of optimizer state)", num(c, "inputs.K"),
          mw_dtype_bytes(MW_DT_FP32) + 2 * mw_dtype_bytes(MW_DT_FP32));
    printed("baseline_GB", num(c, "expected.baseline_GB"), zero_states_gb(P, 0, dp), 0.5);
    printed("Pos_GB", num(c, "expected.Pos_GB"), zero_states_gb(P, 1, dp), 0.5);
    printed("Pos_g_GB", num(c, "expected.Pos_g_GB"), zero_states_gb(P, 2, dp), 0.5);
    printed("Pos_g_p_GB", num(c, "expected.Pos_g_p_GB"), zero_states_gb(P, 3, dp), 0.5);
}

static void zero_table1(const cJSON *c)
{
    const double P = num(c, "inputs.params");
    const cJSON *rows = at(c, "expected");
    static const char *k[] = {"Pos", "Pos_g", "Pos_g_p"};
    for (int i = 0; i < cJSON_GetArraySize(rows); i++) {
        const cJSON *row = cJSON_GetArrayItem(rows, i);
        uint64_t dp = (uint64_t)num(row, "dp");
        for (int s = 0; s < 3; s++) {
            char key[64], label[64];
            double got = zero_states_gb(P, s + 1, dp);
            snprintf(key, sizeof key, "formula_GB.%s", k[s]);
            snprintf(label, sizeof label, "dp=%llu %s formula GB", (unsigned long long)dp, k[s]);
            rel(label, num(row, key), got, 1e-7); /* shards are whole elements: ceil(P / dp) */
            snprintf(key, sizeof key, "published.%s", k[s]);
            snprintf(label, sizeof label, "dp=%llu %s published GB", (unsigned long long)dp, k[s]);
            printed(label, num(row, key), got, 1);
        }
    }
}

static void zero_gpt2(const cJSON *c)
{
    struct mw_model m;
    mw_model_bare(&m, (uint64_t)num(c, "inputs.params"), 0);
    struct mw_layout l = mixed16();
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    rel("model_states_GB", num(c, "expected.model_states_GB"), (double)states(&r->stage[0]) / 1e9, 1e-12);
    m = zoo("gpt2-xl");
    exact("zoo layers", num(c, "inputs.L"), (double)m.n_layer);
    exact("zoo hidden", num(c, "inputs.h"), (double)m.hidden);
    l = mixed16();
    l.act_model = MW_ACT_ZERO;
    l.recompute = MW_RECOMPUTE_NONE;
    l.seq = (uint64_t)num(c, "inputs.seq");
    l.micro_batch = (uint64_t)num(c, "inputs.batch");
    r = plan(&m, &l, NULL);
    exact("activation_formula_bytes", num(c, "expected.activation_formula_bytes"), (double)r->stage[0].act_layers);
    rel("activation_GB_approx (+-2%)", num(c, "expected.activation_GB_approx"), (double)r->stage[0].act_layers / 1e9, 0.02);
}

static void zero_comm(const cJSON *c)
{
    static const struct { const char *key; int zero, zeropp; } k[] = {
        {"ddp", 0, 0}, {"zero1", 1, 0}, {"zero2", 2, 0}, {"zero3", 3, 0}, {"zeropp_cross_node", 3, 1}};
    for (int i = 0; i < 5; i++) {
        char key[64];
        snprintf(key, sizeof key, "expected.elements_per_gpu.%s", k[i].key);
        rel(key + 9, num(c, key), mw_time_dp_volume_factor(k[i].zero, k[i].zeropp, 64, 0), 1e-12);
    }
    const double P = num(c, "inputs.example_params"), b = num(c, "inputs.dtype_bytes");
    rel("example ddp bytes", num(c, "expected.example_7_5B_bytes.ddp"), P * b * mw_time_dp_volume_factor(0, 0, 64, 0), 1e-12);
    rel("example zero3 bytes", num(c, "expected.example_7_5B_bytes.zero3"), P * b * mw_time_dp_volume_factor(3, 0, 64, 0), 1e-12);
    /* The exact ring moves (N-1)/N of that. */
    rel("ring exactness at N=4", 1.5, mw_time_dp_volume_factor(0, 0, 4, 1), 1e-12);
}

/* ---- Megatron / Korthikanti ------------------------------------------------------------------ */

static struct mw_layout megatron_layout(const cJSON *in)
{
    struct mw_layout l;
    mw_layout_default(&l);
    l.tp = (uint64_t)num(in, "tp");
    l.pp = (uint64_t)num(in, "pp");
    l.dp = (uint64_t)num(in, "dp");
    l.seq = (uint64_t)num(in, "seq");
    l.micro_batch = (uint64_t)num(in, "micro_batch");
    l.global_batch = (uint64_t)num(in, "global_batch");
    const cJSON *v = at(in, "interleaved_vpp");
    l.interleave = cJSON_IsNumber(v) ? (uint64_t)v->valuedouble : 1;
    l.weight = MW_DT_BF16;
    l.grad = MW_DT_FP32; /* fp16 mixed precision with fp32 main grads: 18 bytes/param */
    l.recompute = MW_RECOMPUTE_NONE;
    return l;
}

static void megatron_fig1(const cJSON *c)
{
    const cJSON *in = at(c, "inputs");
    struct mw_model m = gpt_core((uint64_t)num(in, "layers"), (uint64_t)num(in, "hidden"),
                                 (uint64_t)num(in, "heads"), (uint64_t)num(in, "ffn"));
    struct mw_layout l = megatron_layout(in);
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    const struct mw_stage *s = &r->stage[0];
    absol("params_plus_optimizer_GiB", num(c, "expected.params_plus_optimizer_GiB"), (double)states(s) / GIB, 1e-9);
    absol("activations_tp_only_GiB", num(c, "expected.activations_tp_only_GiB"), (double)s->act_layers / GIB, 1e-9);
    l.sequence_parallel = 1;
    l.recompute = MW_RECOMPUTE_SELECTIVE;
    r = plan(&m, &l, NULL);
    absol("activations_tp_sp_selective_GiB", num(c, "expected.activations_tp_sp_selective_GiB"),
          (double)r->stage[0].act_layers / GIB, 1e-9);
}

/* One GPT-3 block's activation bytes for a TP/SP/recompute variant. */
static double gpt_layer(const cJSON *in, uint64_t t, int sp, enum mw_recompute rc)
{
    struct mw_model m = gpt_core(1, (uint64_t)num(in, "h"), (uint64_t)num(in, "a"), 0);
    struct mw_layout l;
    mw_layout_default(&l);
    l.seq = (uint64_t)num(in, "s");
    l.micro_batch = (uint64_t)num(in, "b");
    l.tp = t;
    l.sequence_parallel = sp;
    l.recompute = rc;
    return (double)mw_act_layer_bytes(&m, &l, 0);
}

static void megatron_table2(const cJSON *c)
{
    const cJSON *in = at(c, "inputs");
    const uint64_t t = (uint64_t)num(in, "t");
    exact("no_parallel", num(c, "expected.no_parallel"), gpt_layer(in, 1, 0, MW_RECOMPUTE_NONE));
    exact("tp", num(c, "expected.tp"), gpt_layer(in, t, 0, MW_RECOMPUTE_NONE));
    exact("tp_sp", num(c, "expected.tp_sp"), gpt_layer(in, t, 1, MW_RECOMPUTE_NONE));
    exact("tp_selective", num(c, "expected.tp_selective"), gpt_layer(in, t, 0, MW_RECOMPUTE_SELECTIVE));
    exact("tp_sp_selective", num(c, "expected.tp_sp_selective"), gpt_layer(in, t, 1, MW_RECOMPUTE_SELECTIVE));
    exact("full_recompute", num(c, "expected.full_recompute"), gpt_layer(in, t, 0, MW_RECOMPUTE_FULL));
    /* The closed form gives the same. */
    exact("closed form tp", num(c, "expected.tp"),
          mw_act_korthikanti(num(in, "s"), num(in, "b"), num(in, "h"), num(in, "a"), (double)t, 0, MW_RECOMPUTE_NONE));
}

static void megatron_fig7(const cJSON *c)
{
    static const char *models[] = {"22B", "175B", "530B", "1T"};
    static const char *cols[] = {"seq", "sel", "seqsel", "full"};
    for (int i = 0; i < 4; i++) {
        char id[64];
        snprintf(id, sizeof id, "MEGATRON-ACT-FIG1-%s", models[i]);
        const cJSON *fig1 = case_by_id(id);
        REQUIRE(fig1 != NULL);
        const cJSON *in = at(fig1, "inputs");
        cJSON *g = cJSON_CreateObject();
        cJSON_AddNumberToObject(g, "s", num(in, "seq"));
        cJSON_AddNumberToObject(g, "b", 1);
        cJSON_AddNumberToObject(g, "h", num(in, "hidden"));
        cJSON_AddNumberToObject(g, "a", num(in, "heads"));
        const uint64_t t = (uint64_t)num(in, "tp");
        double base = gpt_layer(g, t, 0, MW_RECOMPUTE_NONE);
        double got[4] = {
            100 * gpt_layer(g, t, 1, MW_RECOMPUTE_NONE) / base, 100 * gpt_layer(g, t, 0, MW_RECOMPUTE_SELECTIVE) / base,
            100 * gpt_layer(g, t, 1, MW_RECOMPUTE_SELECTIVE) / base, 100 * gpt_layer(g, t, 0, MW_RECOMPUTE_FULL) / base};
        cJSON_Delete(g);
        for (int k = 0; k < 4; k++) {
            char key[64], label[64];
            snprintf(key, sizeof key, "expected.%s.%s", models[i], cols[k]);
            snprintf(label, sizeof label, "%s %s %% (published)", models[i], cols[k]);
            double pub = num(c, key);
            if (k == 3) rel(label, pub, got[k], 0.015);
            else absol(label, pub, got[k], 0.2);
            snprintf(key, sizeof key, "expected.per_layer_formula_ratio.%s.%d", models[i], k);
            if (at(c, key)) {
                snprintf(label, sizeof label, "%s %s %% (per-layer formula)", models[i], cols[k]);
                printed(label, num(c, key), r2(got[k]), 0);
            }
        }
    }
}

static void megatron_table5(const cJSON *c)
{
    static const char *models[] = {"22B", "175B", "530B", "1T"};
    const struct mw_hw *a100 = mw_hw_lookup("a100-80gb");
    REQUIRE(a100 != NULL);
    for (int i = 0; i < 4; i++) {
        char key[96], label[96], id[64];
        snprintf(id, sizeof id, "MEGATRON-ACT-FIG1-%s", models[i]);
        const cJSON *fig1 = case_by_id(id);
        REQUIRE(fig1 != NULL);
        snprintf(key, sizeof key, "inputs.%s", models[i]);
        const cJSON *in = at(c, key);
        struct mw_model m = zoo("gpt3-175b"); /* GPT block with biases, vocab 51200 */
        m.n_layer = (uint64_t)num(in, "layers");
        m.hidden = (uint64_t)num(in, "hidden");
        m.vocab = (uint64_t)num(in, "vocab");
        m.n_head = m.n_kv_head = (uint64_t)num(at(fig1, "inputs"), "heads");
        m.head_dim = m.hidden / m.n_head;
        m.ffn = 4 * m.hidden;
        const double seq = num(in, "seq"), B = num(in, "global_batch"), n = num(in, "gpus");
        double F = mw_time_model_flops(&m, seq, B * seq);
        snprintf(key, sizeof key, "expected.%s.model_flops_per_iter", models[i]);
        snprintf(label, sizeof label, "%s model FLOPs per iteration", models[i]);
        rel(label, num(c, key), F, 1e-9);
        const double peak = num(in, "peak_flops");
        snprintf(key, sizeof key, "expected.%s.iter_time_seqsel_s", models[i]);
        double mfu = 100 * F / (n * peak * num(c, key));
        snprintf(key, sizeof key, "expected.%s.published_MFU_pct", models[i]);
        snprintf(label, sizeof label, "%s MFU %% at published time", models[i]);
        absol(label, num(c, key), mfu, 0.3);
        snprintf(key, sizeof key, "expected.%s.MFU_from_formula_pct", models[i]);
        snprintf(label, sizeof label, "%s MFU %% (formula)", models[i]);
        printed(label, num(c, key), round(mfu * 10) / 10, 0);
        /* The time model, as a sanity band: +-15% of the measured iteration. */
        struct mw_layout l = megatron_layout(at(fig1, "inputs"));
        REQUIRE(fabs(peak - a100->peak_flops) < 1);
        for (int v = 0; v < 2; v++) {
            l.recompute = v ? MW_RECOMPUTE_SELECTIVE : MW_RECOMPUTE_FULL;
            l.sequence_parallel = v;
            const struct mw_plan_result *r = plan(&m, &l, a100);
            snprintf(key, sizeof key, "expected.%s.%s", models[i], v ? "iter_time_seqsel_s" : "iter_time_full_s");
            snprintf(label, sizeof label, "%s iteration s, %s (+-15%%)", models[i], v ? "SP+selective" : "full recompute");
            rel(label, num(c, key), r->time.iter_s, 0.15);
        }
    }
}

static void megatron_theoretical(const cJSON *c)
{
    const cJSON *in = at(c, "inputs");
    struct mw_model m = zoo("gpt2-xl");
    exact("zoo layers", num(in, "layers"), (double)m.n_layer);
    exact("zoo ffn", num(in, "ffn"), (double)m.ffn);
    struct mw_layout l;
    mw_layout_default(&l);
    l.seq = (uint64_t)num(in, "seq");
    l.micro_batch = (uint64_t)num(in, "micro_batch");
    struct mw_megatron_est e;
    mw_est_megatron(&m, &l, 0, &e);
    exact("most_loaded_shard_params", num(c, "expected.most_loaded_shard_params"), e.shard_params);
    absol("weight_and_optimizer_MB", num(c, "expected.weight_and_optimizer_MB"), e.weight_optimizer / MIB, 0.01);
    absol("activation_MB", num(c, "expected.activation_MB"), e.activation / MIB, 0.01);
    absol("total_MB", num(c, "expected.total_MB"), (e.weight_optimizer + e.activation) / MIB, 0.01);
    printed("per_layer_MB", num(c, "expected.per_layer_MB"), round(e.per_layer / MIB * 10) / 10, 0);
}

static void megatron_bridge(const cJSON *c)
{
    struct mw_model m = zoo("llama-3-8b");
    struct mw_param_count pc;
    mw_model_count(&m, &pc);
    exact("true_param_count", num(c, "expected.true_param_count"), (double)pc.total);
    struct mw_layout l;
    mw_layout_default(&l);
    l.dp = (uint64_t)num(c, "inputs.dp");
    struct mw_megatron_est e;
    mw_est_megatron(&m, &l, 1, &e);
    exact("most_loaded_shard_params_reproducing_log", num(c, "expected.most_loaded_shard_params_reproducing_log"), e.shard_params);
    absol("weight_and_optimizer_MB", num(c, "expected.weight_and_optimizer_MB"), e.weight_optimizer / MIB, 0.01);
    rel("bytes_per_param", num(c, "expected.bytes_per_param"), e.weight_optimizer / e.shard_params, 1e-12);
    /* The planner's own count (RMSNorm = h), same 7.5 bytes/param: within 0.01%. */
    l.weight = MW_DT_BF16; l.grad = MW_DT_FP32; l.zero = 1;
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    rel("planner weight+optimizer MB (+-0.01%)", num(c, "expected.weight_and_optimizer_MB"),
        (double)states(&r->stage[0]) / MIB, 1e-4);
}

static void megatron_distopt(const cJSON *c)
{
    static const struct { const char *key; enum mw_dtype w, g, ga, ms; } k[] = {
        {"fp16_fp16", MW_DT_FP16, MW_DT_FP16, MW_DT_FP32, MW_DT_FP32},
        {"bf16_fp32", MW_DT_BF16, MW_DT_FP32, MW_DT_NONE, MW_DT_FP32},
        {"fp32_fp32", MW_DT_FP32, MW_DT_FP32, MW_DT_NONE, MW_DT_NONE},
    };
    static const char *nd[] = {"fp16_param_fp16_grad", "bf16_param_fp32_grad", "fp32_param_fp32_grad"};
    const double P = 64e6 * 1024; /* divisible by every d */
    struct mw_model m;
    mw_model_bare(&m, (uint64_t)P, 0);
    for (int i = 0; i < 3; i++) {
        struct mw_layout l;
        mw_layout_default(&l);
        l.weight = k[i].w; l.grad = k[i].g; l.grad_accum = k[i].ga; l.master = k[i].ms;
        char key[96];
        const struct mw_plan_result *r = plan(&m, &l, NULL);
        snprintf(key, sizeof key, "expected.non_distributed.%s", nd[i]);
        rel(key + 9, num(c, key), (double)states(&r->stage[0]) / P, 1e-12);
        const cJSON *ds = at(c, "inputs.d");
        for (int j = 0; j < cJSON_GetArraySize(ds); j++) {
            uint64_t d = (uint64_t)cJSON_GetArrayItem(ds, j)->valuedouble;
            l.dp = d; l.zero = 1;
            r = plan(&m, &l, NULL);
            snprintf(key, sizeof key, "expected.distributed.%llu.%s", (unsigned long long)d, k[i].key);
            rel(key + 9, num(c, key), (double)states(&r->stage[0]) / P, 1e-12);
        }
    }
}

static void megatron_training_time(const cJSON *c)
{
    static const char *k[] = {"gpt3", "m1t"};
    for (int i = 0; i < 2; i++) {
        char key[64];
        snprintf(key, sizeof key, "inputs.%s", k[i]);
        const cJSON *in = at(c, key);
        double days = mw_time_training_days(num(in, "T"), num(in, "P"), num(in, "n"), num(in, "X"), 1);
        snprintf(key, sizeof key, "expected.%s_formula_days", k[i]);
        absol(key + 9, num(c, key), days, 0.01);
        snprintf(key, sizeof key, "expected.%s_days", k[i]);
        absol(key + 9, num(c, key), days, 1);
    }
}

/* ---- Ultra-Scale Playbook --------------------------------------------------------------------- */

static void playbook_mixed(const cJSON *c)
{
    static const char *names[] = {"1B", "7B", "70B", "405B"};
    const cJSON *ps = at(c, "inputs.params");
    for (int i = 0; i < 4; i++) {
        struct mw_model m;
        mw_model_bare(&m, (uint64_t)cJSON_GetArrayItem(ps, i)->valuedouble, 0);
        struct mw_layout l;
        mw_layout_default(&l);
        char key[64];
        const struct mw_plan_result *r = plan(&m, &l, NULL);
        snprintf(key, sizeof key, "expected.%s.no_fp32_grad_GB", names[i]);
        rel(key + 9, num(c, key), (double)states(&r->stage[0]) / 1e9, 1e-12);
        l.grad_accum = MW_DT_FP32;
        r = plan(&m, &l, NULL);
        snprintf(key, sizeof key, "expected.%s.fp32_grad_acc_GB", names[i]);
        rel(key + 9, num(c, key), (double)states(&r->stage[0]) / 1e9, 1e-12);
    }
}

static void playbook_llama_act(const cJSON *c)
{
    struct mw_model m = zoo("llama-3.1-8b");
    struct mw_layout l;
    mw_layout_default(&l);
    l.act_model = MW_ACT_CLASSIC;
    l.recompute = MW_RECOMPUTE_SELECTIVE;
    const cJSON *seqs = at(c, "inputs.seqs");
    for (int i = 0; i < cJSON_GetArraySize(seqs); i++) {
        l.seq = (uint64_t)cJSON_GetArrayItem(seqs, i)->valuedouble;
        const struct mw_plan_result *r = plan(&m, &l, NULL);
        char key[64];
        snprintf(key, sizeof key, "expected.activations_GiB.%llu", (unsigned long long)l.seq);
        absol(key + 9, num(c, key), (double)r->stage[0].act_layers / GIB, 1e-9);
    }
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    rel("params_bf16_GiB (+-0.01%)", num(c, "expected.params_bf16_GiB"), (double)r->stage[0].gpu.params / GIB, 1e-4);
    rel("optimizer_GiB = Adam moments (+-0.01%)", num(c, "expected.optimizer_GiB"), (double)r->stage[0].opt_moments / GIB, 1e-4);
}

/* ---- DeepSeek-V3 sharding (Zhang & Su; Megatron-Core) ----------------------------------------- */

static void dsv3_per_device(const cJSON *c)
{
    struct mw_model m = zoo("deepseek-v3");
    m.router_bias = 0; /* the analysis leaves out the score-correction bias */
    struct mw_layout l;
    mw_layout_default(&l);
    l.pp = (uint64_t)num(c, "inputs.pp"); l.tp = (uint64_t)num(c, "inputs.tp");
    l.ep = (uint64_t)num(c, "inputs.ep"); l.etp = (uint64_t)num(c, "inputs.etp");
    l.dp = (uint64_t)num(c, "inputs.dp");
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    exact("edp (derived)", num(c, "inputs.edp"), (double)mw_layout_edp(&l));
    const struct mw_stage *s = &r->stage[1];
    exact("layers_on_stage", num(c, "inputs.layers_on_stage"), (double)s->n_moe_layers);
    double norms = 0, mla = 0, moe = 0;
    uint64_t first, count;
    mw_plan_stage_layers(&m, &l, 1, 0, &first, &count);
    for (uint64_t i = first; i < first + count; i++) {
        struct mw_layer_params lp;
        mw_model_layer_params(&m, i, &lp);
        norms += (double)lp.norms;
        mla += (double)(lp.attn_tp / l.tp + lp.attn_rep);
        moe += (double)(lp.n_routed / l.ep * lp.expert / l.etp + lp.shared / l.etp + lp.router);
    }
    exact("rmsnorm_params", num(c, "expected.rmsnorm_params"), norms);
    exact("mla_params", num(c, "expected.mla_params"), mla);
    exact("non_moe_params", num(c, "expected.non_moe_params"), norms + mla);
    exact("moe_params", num(c, "expected.moe_params"), moe);
    exact("total_params (stage 1 rank)", num(c, "expected.total_params"), (double)s->params);
    exact("total_bytes (bf16 weights)", num(c, "expected.total_bytes"), (double)s->gpu.params);
    printed("total_GiB", num(c, "expected.total_GiB"), r2((double)s->gpu.params / GIB), 0);
}

/* Within 0.1%, or equal to the printed figure when rounded like it. */
static void pub(const char *key, double want, double got)
{
    double u = pow(10, -decimals(want));
    report(key, want, got, fabs(got - want) <= 0.001 * want || fabs(round(got / u) * u - want) < 1e-9, "(0.1% or printed)");
}

static void dsv3_stage_sizes(const cJSON *c)
{
    struct mw_model m = zoo("deepseek-v3");
    m.router_bias = 0;
    struct mw_layout l;
    mw_layout_default(&l);
    l.pp = (uint64_t)num(c, "inputs.pp");
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    struct mw_layer_params lp;
    mw_model_layer_params(&m, 3, &lp);
    exact("moe_layer_params", num(c, "expected.moe_layer_params"), (double)lp.total);
    exact("stage_1_14_params", num(c, "expected.stage_1_14_params"), (double)r->stage[1].params);
    for (int s = 2; s <= 14; s++) exact("stage 2..14 same as stage 1", (double)r->stage[1].params, (double)r->stage[s].params);
    exact("stage15_params", num(c, "expected.stage15_params"), (double)r->stage[15].params);
    pub("moe_layer_GB_pub", num(c, "expected.moe_layer_GB_pub"), 2.0 * (double)lp.total / GIB);
    printed("moe_layer_GiB_exact", num(c, "expected.moe_layer_GiB_exact"), round(2.0 * (double)lp.total / GIB * 1000) / 1000, 0);
    pub("stage_1_14_GB_pub", num(c, "expected.stage_1_14_GB_pub"), (double)r->stage[1].gpu.params / GIB);
    pub("stage15_GB_pub", num(c, "expected.stage15_GB_pub"), (double)r->stage[15].gpu.params / GIB);
    double total = 0;
    for (uint64_t s = 0; s < r->n_stages; s++) total += (double)r->stage[s].gpu.params;
    pub("total_GB_pub", num(c, "expected.total_GB_pub"), total / GIB);
    printed("total_GiB_exact", num(c, "expected.total_GiB_exact"), r2(total / GIB), 0);
}

static void dsv3_act_full(const cJSON *c)
{
    struct mw_model m = zoo("deepseek-v3");
    exact("N_r (experts per token)", num(c, "inputs.N_r"), (double)m.experts_per_tok);
    struct mw_layout l;
    mw_layout_default(&l);
    l.tp = (uint64_t)num(c, "inputs.tp");
    l.sequence_parallel = num(c, "inputs.sp") == (double)l.tp;
    l.pp = 16;
    l.micro_batch = (uint64_t)num(c, "inputs.b");
    l.seq = (uint64_t)num(c, "inputs.s");
    l.recompute = MW_RECOMPUTE_FULL;
    l.global_batch = l.micro_batch; /* the figure is for one micro-batch */
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    const struct mw_stage *s = &r->stage[1];
    exact("layers_on_stage", num(c, "inputs.layers_on_stage"), (double)s->n_layers);
    exact("bytes", num(c, "expected.bytes"), (double)s->act_layers);
    absol("MiB", num(c, "expected.MiB"), (double)s->act_layers / MIB, 1e-9);
}

static void mcore_dsv3(const cJSON *c)
{
    struct mw_model m = zoo("deepseek-v3");
    struct mw_layout l;
    mw_layout_default(&l);
    l.gpus = (uint64_t)num(c, "inputs.gpus");
    l.pp = (uint64_t)num(c, "inputs.pp"); l.interleave = (uint64_t)num(c, "inputs.vpp");
    l.ep = (uint64_t)num(c, "inputs.ep"); l.tp = (uint64_t)num(c, "inputs.tp");
    l.etp = (uint64_t)num(c, "inputs.etp");
    l.weight = MW_DT_BF16; l.grad = MW_DT_FP32; l.zero = 1;
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    exact("dp (derived)", num(c, "inputs.dp"), (double)(l.gpus / (l.tp * l.pp)));
    struct mw_layout lr = l;
    REQUIRE(mw_layout_resolve(&m, &lr, 8) == 0);
    exact("edp (derived)", num(c, "inputs.edp"), (double)mw_layout_edp(&lr));
    /* The paper's anatomy is of a rank holding 16 MoE blocks (rank 1 of PP4 x VPP4: blocks
     * 4-7, 20-23, 36-39, 52-55); rank 0 holds the 3 dense blocks and the embedding. */
    uint64_t best = 0;
    for (uint64_t s = 0; s < r->n_stages; s++) if (r->stage[s].n_moe_layers > r->stage[best].n_moe_layers) best = s;
    const struct mw_stage *s = &r->stage[best];
    exact("MoE layers on the most loaded rank", num(c, "inputs.assumed_moe_layers_on_rank"), (double)s->n_moe_layers);
    exact("params_on_rank", num(c, "expected.reproduction_assuming_16_MoE_layers.params_on_rank"), (double)s->params);
    double wg = (double)(s->gpu.params + s->gpu.grads) / GIB, opt = (double)s->gpu.optimizer / GIB;
    printed("weights_grads_GiB (reproduction)", num(c, "expected.reproduction_assuming_16_MoE_layers.weights_grads_GiB"), r2(wg), 0);
    printed("main_opt_GiB (reproduction)", num(c, "expected.reproduction_assuming_16_MoE_layers.main_opt_GiB"), r2(opt), 0);
    rel("weights_grads_GB_pub (+-1%)", num(c, "expected.weights_grads_GB_pub"), wg, 0.01);
    rel("main_weights_opt_GB_pub (+-1%)", num(c, "expected.main_weights_opt_GB_pub"), opt, 0.01);
    printf("%-34s %-44s published %-17.4g ours %.4g (informational: layout of activations unpublished)\n", g_id,
           "activations GiB", num(c, "expected.activations_GB_pub"), (double)s->act_layers / GIB);
}

/* ---- KV cache ----------------------------------------------------------------------------------- */

static void kv_case(const cJSON *c)
{
    struct mw_model m;
    const cJSON *in = at(c, "inputs");
    if (!strcmp(g_id, "KV-OPT13B-VLLM")) { /* OPT-13B: a GPT-shaped MHA decoder */
        m = gpt_core((uint64_t)num(in, "layers"), (uint64_t)num(in, "hidden"), (uint64_t)num(in, "heads"), 0);
        m.n_kv_head = (uint64_t)num(in, "kv_heads");
    } else if (!strcmp(g_id, "KV-LLAMA2-7B")) m = zoo("llama-2-7b");
    else if (!strcmp(g_id, "KV-LLAMA3-8B-GQA")) m = zoo("llama-3-8b");
    else m = zoo("gpt2-xl");
    exact("layers", num(in, "layers"), (double)m.n_layer);
    if (at(in, "kv_heads")) exact("kv heads", num(in, "kv_heads"), (double)m.n_kv_head);
    if (at(in, "head_dim")) exact("head_dim", num(in, "head_dim"), (double)m.head_dim);
    REQUIRE(num(in, "dtype_bytes") == 2);
    struct mw_layout l;
    mw_layout_default(&l);
    l.kv = MW_DT_FP16;
    l.context = at(in, "tokens") ? (uint64_t)num(in, "tokens") : at(in, "seq") ? (uint64_t)num(in, "seq") : 1;
    l.batch = at(in, "batch") ? (uint64_t)num(in, "batch") : 1;
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    exact("bytes_per_token", num(c, "expected.bytes_per_token"), (double)r->kv_bytes_per_token);
    if (at(c, "expected.bytes_per_request")) exact("bytes_per_request", num(c, "expected.bytes_per_request"), (double)r->kv_total);
    if (at(c, "expected.bytes_total")) exact("bytes_total", num(c, "expected.bytes_total"), (double)r->kv_total);
    if (at(c, "expected.bytes_8192_tokens")) exact("bytes_8192_tokens", num(c, "expected.bytes_8192_tokens"), (double)r->kv_total);
    if (at(c, "expected.GiB")) absol("GiB", num(c, "expected.GiB"), (double)r->kv_total / GIB, 1e-12);
    if (at(c, "expected.KiB_per_token")) exact("KiB_per_token", num(c, "expected.KiB_per_token"), (double)r->kv_bytes_per_token / 1024);
    if (at(c, "expected.KiB")) exact("KiB", num(c, "expected.KiB"), (double)r->kv_bytes_per_token / 1024);
    if (!strcmp(g_id, "KV-OPT13B-VLLM")) { /* paper: "800 KB" = KiB per token; "1.6 GB" = 1.5625 GiB */
        exact("800 KB per token", 800, (double)r->kv_bytes_per_token / 1024);
        printed("1.6 GB per request (as GiB)", 1.6, (double)r->kv_total / GIB, 0.5);
    }
}

/* ---- llm.c, ZeRO-Infinity ---------------------------------------------------------------------- */

static void llmc_buffers(const cJSON *c)
{
    struct mw_model m = zoo("gpt2");
    m.vocab = 50304;
    struct mw_param_count pc;
    mw_model_count(&m, &pc);
    exact("num_parameters", num(c, "inputs.params"), (double)pc.total);
    struct mw_layout l;
    mw_layout_default(&l);
    l.master = MW_DT_NONE; /* llm.c keeps bf16 weights and fp32 m, v only */
    const struct mw_plan_result *r = plan(&m, &l, NULL);
    const struct mw_stage *s = &r->stage[0];
    exact("param_bytes", num(c, "expected.param_bytes"), (double)s->gpu.params);
    exact("param_MiB", num(c, "expected.param_MiB"), (double)(s->gpu.params >> 20));
    exact("grad_MiB", num(c, "expected.grad_MiB"), (double)(s->gpu.grads >> 20));
    exact("adam_m_MiB", num(c, "expected.adam_m_MiB"), (double)((s->opt_moments / 2) >> 20));
    exact("adam_v_MiB", num(c, "expected.adam_v_MiB"), (double)((s->opt_moments / 2) >> 20));
    exact("optimizer = moments only", (double)s->opt_moments, (double)s->gpu.optimizer);
}

static void zero_inf_fig2a(const cJSON *c)
{
    const cJSON *ins = at(c, "inputs"), *exps = at(c, "expected");
    for (int i = 0; i < cJSON_GetArraySize(ins); i++) {
        const cJSON *in = cJSON_GetArrayItem(ins, i), *ex = cJSON_GetArrayItem(exps, i);
        const uint64_t L = (uint64_t)num(in, "layers"), h = (uint64_t)num(in, "hidden");
        char label[96];
        /* Model states: 20 bytes/param (bf16 weights and grads, fp32 grads, master, moments). */
        struct mw_model m;
        mw_model_bare(&m, 12 * L * h * h, 0);
        struct mw_layout l;
        mw_layout_default(&l);
        l.grad_accum = MW_DT_FP32;
        const struct mw_plan_result *r = plan(&m, &l, NULL);
        double ms = (double)states(&r->stage[0]) / TIB;
        snprintf(label, sizeof label, "%gT model_states TiB (formula)", num(in, "params_T"));
        rel(label, num(ex, "formula.model_states"), ms, 1e-12);
        snprintf(label, sizeof label, "%gT model_states TiB", num(in, "params_T"));
        absol(label, num(ex, "model_states_TiB"), ms, 0.01);
        /* Activation checkpoints per node: full recomputation, batch 32. */
        m = gpt_core(L, h, (uint64_t)num(in, "heads"), 0);
        mw_layout_default(&l);
        l.act_model = MW_ACT_ZERO_INFINITY;
        l.seq = 1024;
        l.micro_batch = 32;
        l.recompute = MW_RECOMPUTE_FULL;
        r = plan(&m, &l, NULL);
        double ck = (double)r->stage[0].act_layers / TIB;
        snprintf(label, sizeof label, "%gT act_ckpt TiB/node (formula)", num(in, "params_T"));
        rel(label, num(ex, "formula.act_ckpt"), ck, 1e-12);
        snprintf(label, sizeof label, "%gT act_ckpt TiB/node", num(in, "params_T"));
        absol(label, num(ex, "act_ckpt_TiB_per_node"), ck, 0.01);
        /* All activations per node, no recomputation. */
        l.recompute = MW_RECOMPUTE_NONE;
        r = plan(&m, &l, NULL);
        double act = (double)r->stage[0].act_layers / TIB;
        snprintf(label, sizeof label, "%gT activations TiB/node (formula)", num(in, "params_T"));
        rel(label, num(ex, "formula.act"), act, 1e-12);
        snprintf(label, sizeof label, "%gT activations TiB/node", num(in, "params_T"));
        absol(label, num(ex, "activations_TiB_per_node"), act, 0.01);
        /* Working memory per GPU: one block at batch 2 (AWM); the largest linear in fp32 (MSWM). */
        l.micro_batch = 2;
        double awm = (double)mw_act_layer_bytes(&m, &l, 0) / GIB;
        snprintf(label, sizeof label, "%gT AWM GiB/GPU (formula)", num(in, "params_T"));
        rel(label, num(ex, "formula.awm"), awm, 1e-12);
        snprintf(label, sizeof label, "%gT AWM GiB/GPU", num(in, "params_T"));
        absol(label, num(ex, "awm_GiB_per_gpu"), awm, 0.01);
        struct mw_param_count pc;
        mw_model_count(&m, &pc);
        double mswm = 4.0 * (double)pc.largest_layer / GIB;
        snprintf(label, sizeof label, "%gT MSWM GiB/GPU (formula)", num(in, "params_T"));
        rel(label, num(ex, "formula.mswm"), mswm, 1e-12);
        if (cJSON_IsNumber(at(ex, "mswm_GiB_per_gpu"))) {
            snprintf(label, sizeof label, "%gT MSWM GiB/GPU", num(in, "params_T"));
            absol(label, num(ex, "mswm_GiB_per_gpu"), mswm, 0.01);
        }
    }
}

static void zero_inf_bw(const cJSON *c)
{
    const double ait = num(c, "inputs.seq") * num(c, "inputs.bsz");
    const double bw = num(c, "inputs.bw_Bps"), peak = num(c, "inputs.peak_flops");
    absol("efficiency_params_grads", num(c, "expected.efficiency_params_grads"), mw_time_bw_efficiency(ait, bw, peak), 0.005);
    absol("efficiency_optimizer_same_bw", num(c, "expected.efficiency_optimizer_same_bw"),
          mw_time_bw_efficiency(ait / 4, bw, peak), 0.005);
    rel("efficiency_params_grads (formula)", num(c, "expected.efficiency_params_grads"), mw_time_bw_efficiency(ait, bw, peak), 1e-12);
}
