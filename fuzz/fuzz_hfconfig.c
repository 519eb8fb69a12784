/*
 * fuzz_hfconfig.c — a Hugging Face config.json: the planner's reader (mw_model_from_config_json)
 * followed by a plan of the model it accepts (default layout, the H100 profile), and the GPT-2
 * reader that loads weights (mw_gpt2_hf_config_parse), and the Llama family's (model_type llama or
 * qwen2, both rope spellings: mw_llama_config_parse): a config it accepts is a valid one, and goes
 * through the checkpoint's encoding and back unchanged.
 */
#include "fuzz.h"
#include "memwall/plan.h"
#include "model/gpt2_internal.h"
#include "memwall/llama.h"
#include "memwall/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_scratch(); /* silences logging */
    char *text = fz_cstr(data, size);
    struct mw_model m;
    if (mw_model_from_config_json(text, "config.json", &m) == 0) {
        struct mw_layout l;
        mw_layout_default(&l);
        const struct mw_hw *hw = mw_hw_lookup("h100");
        struct mw_plan_result *res = calloc(1, sizeof *res);
        if (!res || !hw) abort();
        (void)mw_plan_compute(&m, &l, hw, res);
        free(res);
    }
    int L, NH, C, T, V;
    (void)mw_gpt2_hf_config_parse(text, size, "config.json", &L, &NH, &C, &T, &V);
    struct mw_llama_config lc;
    if (mw_llama_config_parse(text, size, "config.json", &lc) == 0) {
        if (mw_llama_config_check(&lc)) abort(); /* accepted: usable */
        struct mw_net_config a, b;
        mw_net_config_llama(&a, &lc);
        uint8_t wire[MW_NET_CONFIG_WIRE];
        a.family->config_encode(a.raw, wire);
        b = a;
        memset(b.raw, 0, sizeof b.raw);
        if (a.family->config_decode(wire, b.raw) || !mw_net_config_same(&a, &b)) abort();
    }
    free(text);
    return 0;
}
