/*
 * fuzz_profile.c — an offload profile JSON (mw_offload_profile_load) and the cost model's
 * predictions from what it accepts: every accepted rate is finite, so predictions are too.
 */
#include "fuzz.h"
#include "memwall/offload.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fz_write(data, size, "profile.json");
    struct mw_offload_profile p;
    if (mw_offload_profile_load(path, &p) != 0) return 0;
    double a = mw_offload_predict_cpu_s(&p, 1000000), b = mw_offload_predict_dev_s(&p, 1000000, 4000000);
    if (!isfinite(a) || !isfinite(b)) abort();
    return 0;
}
