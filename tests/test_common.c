/* test_common.c — unit parsing/formatting and the per-thread error message. */
#include "memwall/common.h"
#include "testutil.h"
#include <errno.h>

int main(void)
{
    uint64_t v;
    CHECK(mw_parse_size("4096", &v) == 0 && v == 4096);
    CHECK(mw_parse_size("64K", &v) == 0 && v == 65536);
    CHECK(mw_parse_size("1M", &v) == 0 && v == 1048576);
    CHECK(mw_parse_size("2GiB", &v) == 0 && v == 2147483648ull);
    CHECK(mw_parse_size("1GB", &v) == 0 && v == 1000000000ull);
    CHECK(mw_parse_size("1.5G", &v) == 0 && v == 1610612736ull);
    CHECK(mw_parse_size("12x", &v) == -EINVAL);
    CHECK(mw_parse_size("", &v) == -EINVAL);
    CHECK(mw_parse_size("-1", &v) == -EINVAL);

    char b[32];
    CHECK(!strcmp(mw_fmt_bytes(b, sizeof b, 1536), "1.50 KiB"));
    CHECK(!strcmp(mw_fmt_bytes(b, sizeof b, 3ull << 30), "3.00 GiB"));
    CHECK(!strcmp(mw_fmt_rate(b, sizeof b, 2.5e9), "2.50 GB/s"));

    CHECK(mw_error_set(-EIO, "object %s at offset %d", "x", 42) == -EIO);
    CHECK(!strcmp(mw_error_msg(), "object x at offset 42"));
    CHECK(!strcmp(mw_strerror(MW_EBUDGET), "tier budget exceeded"));
    uint64_t t0 = mw_now_ns(), t1 = mw_now_ns();
    CHECK(t1 >= t0);
    TEST_END();
}
