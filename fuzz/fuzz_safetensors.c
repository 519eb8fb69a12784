/*
 * fuzz_safetensors.c — a safetensors file: the header parser (mw_st_open), reading every
 * tensor as fp32, the GPT-2 config resolution and, when the file describes a small enough
 * model, the verify-then-apply load into it. MW_FUZZ_SEED_OUT=path writes a valid seed.
 */
#include "fuzz.h"
#include "memwall/gpt2.h"
#include "model/safetensors.h"

#include <math.h>

static void write_seed(const char *path)
{
    struct mw_gpt2_config c = {.n_layer = 1, .n_head = 2, .n_embd = 8, .max_seq_len = 4, .vocab_size = 5,
                               .padded_vocab_size = 8};
    struct mw_gpt2_options o = {.max_batch = 1, .max_seq = 4, .n_threads = 1};
    struct mw_gpt2 m;
    if (mw_gpt2_init(&m, &c, &o) || (mw_gpt2_init_weights(&m, 1), mw_gpt2_save_safetensors(&m, path))) abort();
    mw_gpt2_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int seeded;
    if (!seeded++ && getenv("MW_FUZZ_SEED_OUT")) write_seed(getenv("MW_FUZZ_SEED_OUT"));
    const char *path = fz_write(data, size, "model.safetensors");
    struct mw_st_file f;
    if (mw_st_open(&f, path) == 0) {
        float buf[64];
        for (int i = 0; i < f.n; i++) {
            const struct mw_st_entry *e = &f.e[i];
            uint64_t n = e->numel < 64 ? e->numel : 64;
            if (mw_st_read_f32(&f, e, 0, n, buf) == 0 && n && e->numel > 64)
                (void)mw_st_read_f32(&f, e, e->numel - 1, 1, buf);
            if (mw_st_find(&f, e->name) == NULL) abort(); /* every listed entry is found by name */
        }
        (void)mw_st_meta(&f, "n_head");
        mw_st_close(&f);
    }
    struct mw_gpt2_config c;
    struct mw_gpt2_provenance pv;
    if (mw_gpt2_config_resolve(path, NULL, &c, &pv) != 0) return 0;
    if (mw_gpt2_num_params(&c) > (1u << 20) || c.max_seq_len > 256) return 0;
    struct mw_gpt2_options o = {.max_batch = 1, .max_seq = c.max_seq_len < 4 ? c.max_seq_len : 4, .n_threads = 1};
    struct mw_gpt2 m;
    if (mw_gpt2_init(&m, &c, &o) != 0) return 0;
    if (mw_gpt2_load_safetensors(&m, path) == 0)
        for (size_t i = 0; i < m.sizes.n_params; i++)
            if (!isfinite(m.params[i])) abort(); /* the verify pass refuses non-finite weights */
    mw_gpt2_free(&m);
    return 0;
}
