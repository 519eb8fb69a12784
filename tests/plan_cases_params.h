/*
 * plan_cases_params.h — handlers of test_plan_cases.c for parameter counts and other tools'
 * estimators (DeepSpeed, accelerate). Included once, by test_plan_cases.c only.
 */

static void check_total(const char *key, const char *model, double want)
{
    struct mw_model m = zoo(model);
    struct mw_param_count pc;
    mw_model_count(&m, &pc);
    exact(key, want, (double)pc.total);
}

static void param_gpt2_small(const cJSON *c)
{
    struct mw_model m = zoo("gpt2");
    struct mw_param_count pc;
    mw_model_count(&m, &pc);
    exact("total_params", num(c, "expected.total_params"), (double)pc.total);
    exact("total_minus_position_embedding", num(c, "expected.total_minus_position_embedding_nanoGPT"),
          (double)(pc.total - pc.position));
    exact("nanoGPT_decayed", num(c, "expected.nanoGPT_decayed"), (double)(pc.total - pc.vectors));
    exact("nanoGPT_non_decayed", num(c, "expected.nanoGPT_non_decayed"), (double)pc.vectors);
    m.vocab = 50304;
    mw_model_count(&m, &pc);
    exact("llmc_padded_vocab_50304", num(c, "expected.llmc_padded_vocab_50304"), (double)pc.total);
}

static void param_gpt2_family(const cJSON *c)
{
    static const char *k[][2] = {{"gpt2_medium", "gpt2-medium"}, {"gpt2_large", "gpt2-large"}, {"gpt2_xl", "gpt2-xl"}};
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "expected.%s", k[i][0]);
        check_total(k[i][0], k[i][1], num(c, key));
        struct mw_model m = zoo(k[i][1]);
        snprintf(key, sizeof key, "inputs.%s.L", k[i][0]);
        exact("zoo layers", num(c, key), (double)m.n_layer);
        snprintf(key, sizeof key, "inputs.%s.h", k[i][0]);
        exact("zoo hidden", num(c, key), (double)m.hidden);
    }
}

static void param_llama2(const cJSON *c)
{
    static const char *k[][2] = {{"llama2_7b", "llama-2-7b"}, {"llama2_13b", "llama-2-13b"}, {"llama2_70b", "llama-2-70b"}};
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "expected.%s", k[i][0]);
        check_total(k[i][0], k[i][1], num(c, key));
        struct mw_model m = zoo(k[i][1]);
        snprintf(key, sizeof key, "inputs.%s.kv_heads", k[i][0]);
        exact("zoo kv_heads", num(c, key), (double)m.n_kv_head);
        snprintf(key, sizeof key, "inputs.%s.ffn", k[i][0]);
        exact("zoo ffn", num(c, key), (double)m.ffn);
    }
}

static void param_deepseek_v3(const cJSON *c)
{
    struct mw_model m = zoo("deepseek-v3");
    struct mw_param_count pc;
    struct mw_layer_params lp;
    struct mw_ckpt_count ck;
    mw_model_count(&m, &pc);
    mw_model_layer_params(&m, 3, &lp);
    mw_model_checkpoint_count(&m, &ck);
    exact("mla_params_per_layer", num(c, "expected.mla_params_per_layer_incl_q_a_and_kv_a_norms"), (double)pc.attn_layer);
    exact("expert_params", num(c, "expected.expert_params"), (double)pc.expert);
    exact("moe_block_per_layer", num(c, "expected.moe_block_per_layer_incl_router_and_bias"),
          (double)(lp.n_routed * lp.expert + lp.shared + lp.router));
    exact("dense_layer", num(c, "expected.dense_layer"), (double)pc.dense_layer);
    exact("moe_layer", num(c, "expected.moe_layer"), (double)pc.moe_layer);
    exact("main_model_total", num(c, "expected.main_model_total"), (double)pc.total);
    exact("activated_incl_embedding_and_head", num(c, "expected.activated_incl_embedding_and_head"), (double)pc.active);
    rel("activated vs published 36.7B", 36.7e9, (double)pc.active, 0.025);
    rel("activated vs paper 37B", 37e9, (double)pc.active, 0.025);
    exact("checkpoint_elements", num(c, "expected.checkpoint_elements_incl_MTP_and_fp8_scale_inv"), (double)ck.total);
    exact("checkpoint_fp8_elements", num(c, "expected.checkpoint_fp8_elements"), (double)ck.fp8);
    exact("checkpoint_bf16_elements", num(c, "expected.checkpoint_bf16_elements"), (double)ck.bf16);
    exact("checkpoint_f32_elements", num(c, "expected.checkpoint_f32_elements"), (double)ck.f32);
}

static void param_megatron_table1(const cJSON *c)
{
    const cJSON *in = at(c, "inputs");
    for (int i = 0; i < cJSON_GetArraySize(in); i++) {
        char key[64];
        const cJSON *x = cJSON_GetArrayItem(in, i);
        struct mw_model m = zoo("gpt2"); /* GPT block with biases, learned positions, tied head */
        m.n_layer = (uint64_t)num(x, "layers");
        m.hidden = (uint64_t)num(x, "hidden");
        m.n_head = m.n_kv_head = (uint64_t)num(x, "heads");
        m.head_dim = m.hidden / m.n_head;
        m.ffn = 4 * m.hidden;
        m.vocab = (uint64_t)num(x, "vocab");
        m.max_pos = (uint64_t)num(x, "seq");
        struct mw_param_count pc;
        mw_model_count(&m, &pc);
        snprintf(key, sizeof key, "expected.%d.formula_B", i);
        double want = num(c, key);
        snprintf(key, sizeof key, "row %d formula (B)", i);
        absol(key, want, (double)pc.total / 1e9, 0.06);
        snprintf(key, sizeof key, "expected.%d.published_B", i);
        want = num(c, key);
        snprintf(key, sizeof key, "row %d published (B)", i);
        absol(key, want, (double)pc.total / 1e9, 0.06);
    }
}

static void param_encoders(const cJSON *c)
{
    static const char *k[][2] = {{"t5_3b", "t5-3b"}, {"T0_3B", "t0-3b"}, {"t5_large", "t5-large"}};
    for (int i = 0; i < 3; i++) {
        char key[64];
        struct mw_model m = zoo(k[i][1]);
        struct mw_param_count pc;
        mw_model_count(&m, &pc);
        snprintf(key, sizeof key, "expected.%s_total", k[i][0]);
        exact(key + 9, num(c, key), (double)pc.total);
        snprintf(key, sizeof key, "expected.%s_largest_layer", k[i][0]);
        exact(key + 9, num(c, key), (double)pc.largest_layer);
    }
    struct mw_model m = zoo("bert-base-cased");
    struct mw_param_count pc;
    mw_model_count(&m, &pc);
    exact("bert_base_cased_total", num(c, "expected.bert_base_cased_total"), (double)pc.total);
    exact("bert_base_cased_buffers_bytes", num(c, "expected.bert_base_cased_buffers_bytes"), (double)m.buffer_bytes);
    exact("bert_word_embeddings (largest)", num(c, "expected.bert_word_embeddings"), (double)pc.largest_layer);
}

static enum mw_tier_id tier_str(const cJSON *row, const char *key)
{
    const cJSON *it = at(row, key);
    if (!cJSON_IsString(it)) return MW_TIER_DEVICE;
    return !strcmp(it->valuestring, "cpu") ? MW_TIER_DRAM : !strcmp(it->valuestring, "nvme") ? MW_TIER_NVME : MW_TIER_DEVICE;
}

static struct mw_ds_input ds_input(const cJSON *c)
{
    struct mw_ds_input in = {0};
    in.offload_params = in.offload_optimizer = MW_TIER_DEVICE; /* not offloaded unless a row says */
    in.total_params = num(c, "inputs.total_params");
    in.largest_layer_params = at(c, "inputs.largest_layer_params") ? num(c, "inputs.largest_layer_params") : 0;
    in.gpus_per_node = num(c, "inputs.num_gpus_per_node");
    in.nodes = num(c, "inputs.num_nodes");
    in.buffer_factor = num(c, "inputs.additional_buffer_factor");
    return in;
}

/* DeepSpeed's whole table (mw_est_ds_table): the published rows, in the published order. */
static void ds_table(const cJSON *c, int stage, enum mw_ds_version v)
{
    struct mw_ds_input in = ds_input(c);
    in.version = v;
    struct mw_ds_row t[MW_DS_MAX_ROWS];
    const cJSON *rows = at(c, "expected");
    int n = mw_est_ds_table(stage, &in, t);
    exact("table rows", cJSON_GetArraySize(rows), n);
    for (int i = 0; i < n && i < cJSON_GetArraySize(rows); i++) {
        const cJSON *row = cJSON_GetArrayItem(rows, i);
        char key[96];
        snprintf(key, sizeof key, "table row %d offload_param", i);
        exact(key, stage == 3 ? tier_str(row, "offload_param") : MW_TIER_DEVICE, t[i].offload_params);
        snprintf(key, sizeof key, "table row %d offload_optimizer", i);
        exact(key, tier_str(row, "offload_optimizer"), t[i].offload_optimizer);
        snprintf(key, sizeof key, "table row %d zero_init", i);
        exact(key, stage == 3 ? num(row, "zero_init") : -1, t[i].zero_init);
        snprintf(key, sizeof key, "table row %d gpu GB printed", i);
        printed(key, num(row, "published_gpu_GB"), round(t[i].gpu_bytes / GIB * 100) / 100, 0);
        snprintf(key, sizeof key, "table row %d cpu GB printed", i);
        printed(key, num(row, "published_cpu_GB"), round(t[i].cpu_bytes / GIB * 100) / 100, 0);
        if (stage == 3) {
            snprintf(key, sizeof key, "table row %d gpu_bytes", i);
            exact(key, num(row, "gpu_bytes"), t[i].gpu_bytes);
            snprintf(key, sizeof key, "table row %d cpu_bytes", i);
            exact(key, num(row, "cpu_bytes"), t[i].cpu_bytes);
        }
    }
}

static void ds_zero3(const cJSON *c)
{
    ds_table(c, 3, MW_DS_CURRENT);
    const cJSON *rows = at(c, "expected");
    for (int i = 0; i < cJSON_GetArraySize(rows); i++) {
        const cJSON *row = cJSON_GetArrayItem(rows, i);
        struct mw_ds_input in = ds_input(c);
        in.offload_params = tier_str(row, "offload_param");
        in.offload_optimizer = tier_str(row, "offload_optimizer");
        in.zero_init = (int)num(row, "zero_init");
        double gpu, cpu;
        mw_est_ds_zero3(&in, &gpu, &cpu);
        char pre[64], key[96];
        snprintf(pre, sizeof pre, "param=%s opt=%s init=%d", mw_plan_tier_name(in.offload_params),
                 mw_plan_tier_name(in.offload_optimizer), in.zero_init);
        snprintf(key, sizeof key, "%s gpu_bytes", pre);
        exact(key, num(row, "gpu_bytes"), gpu);
        snprintf(key, sizeof key, "%s cpu_bytes", pre);
        exact(key, num(row, "cpu_bytes"), cpu);
        snprintf(key, sizeof key, "%s gpu GB printed", pre);
        printed(key, num(row, "published_gpu_GB"), round(gpu / GIB * 100) / 100, 0);
        snprintf(key, sizeof key, "%s cpu GB printed", pre);
        printed(key, num(row, "published_cpu_GB"), round(cpu / GIB * 100) / 100, 0);
    }
}

static void ds_zero2(const cJSON *c)
{
    ds_table(c, 2, MW_DS_LEGACY); /* the published table predates DeepSpeed PR #5099 */
    struct mw_ds_input in = ds_input(c);
    double gpu, cpu;
    in.offload_optimizer = MW_TIER_DRAM;
    mw_est_ds_zero2(&in, &gpu, &cpu);
    exact("offload cpu gpu_bytes", num(c, "expected.0.gpu_bytes"), gpu);
    exact("offload cpu cpu_bytes", num(c, "expected.0.cpu_bytes"), cpu);
    printed("offload cpu gpu GB printed", num(c, "expected.0.published_gpu_GB"), round(gpu / GIB * 100) / 100, 0);
    printed("offload cpu cpu GB printed", num(c, "expected.0.published_cpu_GB"), round(cpu / GIB * 100) / 100, 0);
    in.offload_optimizer = MW_TIER_DEVICE;
    in.version = MW_DS_LEGACY;
    mw_est_ds_zero2(&in, &gpu, &cpu);
    exact("none legacy gpu_bytes (4P+16P/N)", num(c, "expected.1.gpu_bytes_doc_formula_4P_plus_16P_over_N"), gpu);
    exact("none cpu_bytes", num(c, "expected.1.cpu_bytes"), cpu);
    printed("none legacy gpu GB printed", num(c, "expected.1.published_gpu_GB"), round(gpu / GIB * 100) / 100, 0);
    printed("none cpu GB printed", num(c, "expected.1.published_cpu_GB"), round(cpu / GIB * 100) / 100, 0);
    in.version = MW_DS_CURRENT;
    mw_est_ds_zero2(&in, &gpu, &cpu);
    exact("none current gpu_bytes (2P+18P/N)", num(c, "expected.1.gpu_bytes_current_code_2P_plus_18P_over_N"), gpu);
    printed("none current gpu GB printed", num(c, "expected.1.current_code_gpu_GB"), round(gpu / GIB * 100) / 100, 0);
}

static void ds_zero3_manual(const cJSON *c)
{
    struct mw_ds_input in = {0};
    in.offload_params = in.offload_optimizer = MW_TIER_DEVICE; /* not offloaded unless a row says */
    in.total_params = num(c, "inputs.total_params");
    in.largest_layer_params = num(c, "inputs.largest_layer_params");
    in.gpus_per_node = num(c, "inputs.total_gpus");
    in.nodes = 1;
    in.buffer_factor = 1.5;
    double gpu, cpu;
    exact("largest_layer_MB", num(c, "expected.largest_layer_MB"), floor(4 * in.largest_layer_params / MIB));
    mw_est_ds_zero3(&in, &gpu, &cpu);
    exact("case1_no_offload_MB", num(c, "expected.case1_no_offload_MB"), floor(gpu / MIB));
    in.offload_params = in.offload_optimizer = MW_TIER_DRAM;
    mw_est_ds_zero3(&in, &gpu, &cpu);
    exact("case2_offload_param_and_opt_MB", num(c, "expected.case2_offload_param_and_opt_MB"), floor(gpu / MIB));
    in.offload_params = MW_TIER_DEVICE;
    mw_est_ds_zero3(&in, &gpu, &cpu);
    exact("case3_offload_opt_only_MB", num(c, "expected.case3_offload_opt_only_MB"), floor(gpu / MIB));
}

static double r2(double x) { return round(x * 100) / 100; }

static void accel_bert(const cJSON *c)
{
    struct mw_model m = zoo("bert-base-cased");
    struct mw_param_count pc;
    mw_model_count(&m, &pc);
    exact("params (inputs)", num(c, "inputs.params"), (double)pc.total);
    exact("total_bytes_fp32", num(c, "expected.total_bytes_fp32"), (double)pc.total * 4 + (double)m.buffer_bytes);
    static const struct { const char *key; enum mw_dtype d; const char *train; } rows[] = {
        {"float32", MW_DT_FP32, NULL}, {"float16", MW_DT_FP16, "train_adam_MB"},
        {"int8", MW_DT_INT8, "train_adam_MB_docs_old_formula"}, {"int4", MW_DT_INT4, "train_adam_MB_docs_old_formula"},
    };
    for (int i = 0; i < 4; i++) {
        struct mw_accel_usage u;
        mw_est_accelerate((double)pc.total, (double)m.buffer_bytes, (double)pc.largest_layer, rows[i].d, &u);
        char key[96], k2[64];
        snprintf(key, sizeof key, "expected.%s.largest_MB", rows[i].key);
        snprintf(k2, sizeof k2, "%s largest MB", rows[i].key);
        printed(k2, num(c, key), r2(u.largest / MIB), 0);
        snprintf(key, sizeof key, "expected.%s.total_MB", rows[i].key);
        snprintf(k2, sizeof k2, "%s total MB", rows[i].key);
        printed(k2, num(c, key), r2(u.total / MIB), 0);
        if (rows[i].train) {
            snprintf(key, sizeof key, "expected.%s.%s", rows[i].key, rows[i].train);
            snprintf(k2, sizeof k2, "%s train MB", rows[i].key);
            printed(k2, num(c, key), r2(u.train / MIB), 0);
        } else { /* "1.61 GB" as a string */
            const cJSON *s = at(c, "expected.float32.train_adam");
            double want = cJSON_IsString(s) ? atof(s->valuestring) : NAN;
            printed("float32 train GB", want, r2(u.train / GIB), 0);
        }
    }
}

static void accel_vit(const cJSON *c)
{
    const double P = num(c, "inputs.params");
    struct mw_accel_usage u;
    mw_est_accelerate(P, 0, 0, MW_DT_FP32, &u);
    exact("fp32_bytes (inputs)", num(c, "inputs.fp32_bytes"), u.total);
    exact("fp32 model", num(c, "expected.fp32.model"), u.model);
    exact("fp32 optimizer", num(c, "expected.fp32.optimizer"), u.optimizer);
    exact("fp32 gradients", num(c, "expected.fp32.gradients"), u.gradients);
    exact("fp32 step", num(c, "expected.fp32.step"), u.step);
    exact("fp32 peak", num(c, "expected.fp32.peak"), fmax(fmax(u.model, u.gradients), fmax(u.optimizer, u.step)));
    printed("total fp32 GB", num(c, "expected.total_fp32_GB"), r2(u.total / GIB), 0);
    mw_est_accelerate(P, 0, 0, MW_DT_BF16, &u);
    exact("bf16 model", num(c, "expected.bf16_mixed.model"), u.model);
    exact("bf16 optimizer", num(c, "expected.bf16_mixed.optimizer"), u.optimizer);
    exact("bf16 gradients", num(c, "expected.bf16_mixed.gradients"), u.gradients);
    exact("bf16 step", num(c, "expected.bf16_mixed.step"), u.step);
    exact("bf16 peak", num(c, "expected.bf16_mixed.peak"), fmax(fmax(u.model, u.gradients), fmax(u.optimizer, u.step)));
    printed("total fp16 MB", num(c, "expected.total_fp16_MB"), r2(u.total / MIB), 0);
}
