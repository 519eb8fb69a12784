/*
 * fuzz_hfconfig.c — a Hugging Face config.json: the planner's reader (mw_model_from_config_json)
 * followed by a plan of the model it accepts (default layout, the H100 profile), and the GPT-2
 * reader that loads weights (mw_gpt2_hf_config_parse).
 */
#include "fuzz.h"
#include "memwall/plan.h"
#include "model/gpt2_internal.h"

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
    free(text);
    return 0;
}
