/*
 * fuzz_fault.c — the MEMWALL_FAULT parser (mw_aio_fault_parse, read from the environment by
 * every I/O engine): never undefined behaviour, and what it accepts is within the documented
 * bounds (at most 4 rules; each an error or a delay of 1 us to 10 s; count >= 1).
 */
#include "fuzz.h"
#include "aio/aio_impl.h"

#include <errno.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fz_cstr(data, size);
    struct mw_aio_faults f;
    if (mw_aio_fault_parse(s, &f) == 0) {
        if (f.n < 0 || f.n > MW_AIO_FAULT_MAX || (f.n == 0 && s[0])) abort();
        for (int i = 0; i < f.n; i++) {
            const struct mw_aio_fault_rule *r = &f.rule[i];
            if (r->op < -1 || r->op > MW_AIO_WRITE || !r->count) abort();
            if (r->err && r->err != -EIO && r->err != -ENOSPC) abort();
            if (r->err ? r->delay_us != 0 : (r->delay_us < 1 || r->delay_us > 10000000)) abort();
            if (r->after > 1000000000000000ull || r->seen) abort();
        }
        if (strlen(s) > 255 || strchr(s, ' ')) abort();
    } else if (!strstr(mw_error_msg(), "MEMWALL_FAULT")) abort();
    free(s);
    return 0;
}
