/*
 * fuzz_shard.c — an llm.c .bin token shard: the header checks of mw_data_open, then windows
 * and batches drawn from it as the trainer does (a short sequence, so small shards qualify).
 */
#include "fuzz.h"
#include "memwall/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    const char *path = fz_write(d, size, "shard_train.bin");
    struct mw_data data;
    if (mw_data_open(&data, path, NULL) != 0) return 0;
    enum { T = 4, B = 2 };
    if (mw_data_check(&data, T) == 0) {
        int32_t in[B * T], tg[B * T];
        uint64_t rng = 7, starts[B];
        mw_data_train_batch(&data, &rng, B, T, in, tg, starts);
        mw_data_val_batch(&data, 3, B, T, in, tg, starts);
        for (int i = 0; i < B * T; i++)
            if (in[i] < 0 || in[i] > 65535 || tg[i] < 0 || tg[i] > 65535) abort();
    }
    mw_data_free(&data);
    return 0;
}
