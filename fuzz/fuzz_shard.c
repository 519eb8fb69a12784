/*
 * fuzz_shard.c — an llm.c .bin token shard (uint16 version 1 or uint32 version 7): the header
 * checks of mw_data_open, then windows and batches drawn from it as the trainer does (a short
 * sequence, so small shards qualify). Ids come out in [0, 65535] from a uint16 shard and in
 * [0, INT32_MAX] from a uint32 one (larger ids are read as INT32_MAX, never wrapped).
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
        int32_t hi = data.wide ? INT32_MAX : 65535;
        for (int i = 0; i < B * T; i++)
            if (in[i] < 0 || in[i] > hi || tg[i] < 0 || tg[i] > hi) abort();
    }
    mw_data_free(&data);
    return 0;
}
