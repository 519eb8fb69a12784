/*
 * test_crc32c.c — mw_crc32c (ISA-L's crc32_iscsi) against the scalar reference: known check
 * values, random data at every small length and alignment, long buffers around the folding
 * paths' block sizes, and continuation across split buffers.
 */
#include "memwall/store.h"
#include "testutil.h"

int main(void)
{
    /* The standard check value of CRC-32C ("123456789") and RFC 3720 (iSCSI) vectors. */
    CHECK_EQ_INT(mw_crc32c_sw(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ_INT(mw_crc32c(0, "123456789", 9), 0xE3069283u);
    unsigned char z[32] = {0}, ff[32];
    memset(ff, 0xff, sizeof ff);
    CHECK_EQ_INT(mw_crc32c_sw(0, z, 32), 0x8A9136AAu);
    CHECK_EQ_INT(mw_crc32c_sw(0, ff, 32), 0x62A8AB43u);
    CHECK_EQ_INT(mw_crc32c(0, z, 32), 0x8A9136AAu);
    CHECK_EQ_INT(mw_crc32c_sw(0, "", 0), 0);
    printf("sse4.2 crc32 instruction: %s\n", mw_crc32c_hw_available() ? "yes" : "no (ISA-L's base path)");

    enum { N = 200000 };
    unsigned char *buf = malloc(N + 64);
    uint64_t s = 7;
    for (int i = 0; i < N + 64; i++) buf[i] = (unsigned char)(tu_rand(&s) >> 56);
    int bad = 0;
    for (size_t len = 0; len < 300; len++)
        for (size_t al = 0; al < 8; al++)
            if (mw_crc32c(0, buf + al, len) != mw_crc32c_sw(0, buf + al, len)) bad++;
    CHECK_EQ_INT(bad, 0);
    static const size_t longs[] = {255, 256, 257, 511, 512, 1023, 1024, 1025, 2047, 4096 + 7, 16369, 65536, 65536 + 3,
                                   131072 + 5, N}; /* around the folding loops' 64..256-byte blocks */
    for (size_t i = 0; i < sizeof longs / sizeof *longs; i++)
        for (size_t al = 0; al < 3; al++)
            CHECK_MSG(mw_crc32c(0, buf + al, longs[i]) == mw_crc32c_sw(0, buf + al, longs[i]), "len %zu align %zu",
                      longs[i], al);
    /* Continuation: crc(A|B) == crc(crc(A), B) on both paths. */
    uint32_t whole = mw_crc32c_sw(0, buf, N);
    for (size_t cut = 1; cut < N; cut = cut * 3 + 1) {
        CHECK(mw_crc32c(mw_crc32c(0, buf, cut), buf + cut, N - cut) == whole);
        CHECK(mw_crc32c_sw(mw_crc32c_sw(0, buf, cut), buf + cut, N - cut) == whole);
    }
    /* A single flipped bit changes the crc. */
    buf[12345] ^= 4;
    CHECK(mw_crc32c(0, buf, N) != whole);
    free(buf);
    TEST_END();
}
