/* test_common.c — unit parsing/formatting and the per-thread error message. */
#include "memwall/common.h"
#include "testutil.h"
#include <errno.h>
#include <math.h>

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
    /* Hostile input: no NaN/inf/hex through strtod, no wrap past 2^64. */
    CHECK(mw_parse_size("nan", &v) == -EINVAL);
    CHECK(mw_parse_size("NaNK", &v) == -EINVAL);
    CHECK(mw_parse_size("inf", &v) == -EINVAL);
    CHECK(mw_parse_size("0x10", &v) == -EINVAL);
    CHECK(mw_parse_size("1e3", &v) == -EINVAL);
    CHECK(mw_parse_size("17000000T", &v) == -ERANGE);
    CHECK(mw_parse_size("99999999999999999999", &v) == -ERANGE);
    CHECK(mw_parse_size("16777215T", &v) == 0 && v == 16777215ull << 40);

    uint64_t u = 7;
    CHECK(mw_mul_u64(1ull << 32, 1ull << 32, &u) == -EOVERFLOW && u == 7);
    CHECK(mw_mul_u64(1ull << 31, 1ull << 32, &u) == 0 && u == 1ull << 63);
    CHECK(mw_add_u64(UINT64_MAX, 1, &u) == -EOVERFLOW);
    CHECK(mw_add_u64(UINT64_MAX - 1, 1, &u) == 0 && u == UINT64_MAX);
    size_t z = 3;
    CHECK(mw_mul_size(SIZE_MAX / 2 + 1, 2, &z) == -EOVERFLOW && z == 3);
    CHECK(mw_add_size(SIZE_MAX, 0, &z) == 0 && z == SIZE_MAX);
    int64_t i64;
    CHECK(mw_f64_to_i64(1e300, INT64_MIN, INT64_MAX, 0, &i64) == -ERANGE);
    CHECK(mw_f64_to_i64(9223372036854775808.0, INT64_MIN, INT64_MAX, 0, &i64) == -ERANGE);
    CHECK(mw_f64_to_i64(-9223372036854775808.0, INT64_MIN, INT64_MAX, 0, &i64) == 0 && i64 == INT64_MIN);
    CHECK(mw_f64_to_i64(NAN, INT64_MIN, INT64_MAX, 0, &i64) == -ERANGE);
    CHECK(mw_f64_to_i64(2.5, 0, 10, 1, &i64) == -ERANGE);
    CHECK(mw_f64_to_i64(2.5, 0, 10, 0, &i64) == 0 && i64 == 2);
    CHECK(mw_f64_to_i64(11, 0, 10, 1, &i64) == -ERANGE);
    CHECK(mw_f64_to_u64(-1, 100, 0, &u) == -ERANGE);
    CHECK(mw_f64_to_u64(18446744073709551616.0, UINT64_MAX, 1, &u) == -ERANGE);
    CHECK(mw_f64_to_u64(1e19, UINT64_MAX, 1, &u) == 0 && u == 10000000000000000000ull);

    char b[32];
    CHECK(!strcmp(mw_fmt_bytes(b, sizeof b, 1536), "1.50 KiB"));
    CHECK(!strcmp(mw_fmt_bytes(b, sizeof b, 3ull << 30), "3.00 GiB"));
    CHECK(!strcmp(mw_fmt_rate(b, sizeof b, 2.5e9), "2.50 GB/s"));

    CHECK(mw_error_set(-EIO, "object %s at offset %d", "x", 42) == -EIO);
    CHECK(!strcmp(mw_error_msg(), "object x at offset 42"));
    /* Wrapping the last message into a new one (the buffer is both source and destination). */
    CHECK(mw_error_set(-EIO, "load %s: %s", "f", mw_error_msg()) == -EIO);
    CHECK_MSG(!strcmp(mw_error_msg(), "load f: object x at offset 42"), "got \"%s\"", mw_error_msg());
    CHECK(!strcmp(mw_strerror(MW_EBUDGET), "tier budget exceeded"));
    uint64_t t0 = mw_now_ns(), t1 = mw_now_ns();
    CHECK(t1 >= t0);
    TEST_END();
}
