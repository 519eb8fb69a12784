/*
 * crc32c.c — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the project's one checksum:
 * every written store block, checkpoints (memwall/common.h).
 *
 * Why crc32c: x86 has had a crc32 instruction for it since SSE4.2, and carry-less multiplication
 * (PCLMULQDQ, VPCLMULQDQ with AVX-512) folds 64 bytes or more a step, so checking every byte read
 * back from SSD costs a fraction of a core at disk speed. The fast path is ISA-L's crc32_iscsi
 * (Intel's storage library, Debian libisal-dev), which picks the widest implementation the CPU has
 * at run time. It replaced a hand-written three-stream crc32-instruction loop: over a buffer larger
 * than the caches ISA-L runs at 1.15-1.31x a plain read of the bytes, that loop ran at 0.5x
 * (bench/crc32c.c, docs/io.md), and streaming Qwen2.5-0.5B's weights from PyTorch reads about 30 GiB
 * a step. The
 * table-driven scalar version below is the reference the test compares it with.
 */
#include "memwall/common.h"

#include <isa-l/crc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static atomic_int g_init;          /* 0 not yet, 1 in progress, 2 ready */

static void init_tables(void)
{
    int expect = 0;
    if (!atomic_compare_exchange_strong(&g_init, &expect, 1)) {
        while (atomic_load(&g_init) != 2) {}
        return;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1)));
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
    atomic_store(&g_init, 2);
}

uint32_t mw_crc32c_sw(uint32_t crc, const void *data, size_t len)
{
    if (atomic_load_explicit(&g_init, memory_order_acquire) != 2) init_tables();
    const unsigned char *p = data;
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) { crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8); len--; }
    while (len >= 8) { /* slicing-by-8 */
        uint64_t w;
        memcpy(&w, p, 8);
        uint32_t lo = (uint32_t)w ^ crc, hi = (uint32_t)(w >> 32);
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
              table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

int mw_crc32c_hw_available(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
#else
    return 0;
#endif
}

/* ISA-L keeps the crc register as is (no inversion before or after) and takes an int length. */
uint32_t mw_crc32c(uint32_t crc, const void *data, size_t len)
{
    unsigned char *p = (unsigned char *)(uintptr_t)data; /* crc32_iscsi only reads it */
    uint32_t c = ~crc;
    while (len) {
        size_t n = MW_MIN(len, (size_t)1 << 30);
        c = crc32_iscsi(p, (int)n, c);
        p += n;
        len -= n;
    }
    return ~c;
}
