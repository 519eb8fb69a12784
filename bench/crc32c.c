/*
 * bench/crc32c.c — how fast the store's checksum runs on data as a read leaves it: mw_crc32c
 * (ISA-L's crc32_iscsi) over a buffer much larger than the caches, in the store's 64 KiB blocks,
 * side by side with a plain read of the same bytes (the memory's own limit for one core) and the
 * scalar reference. Rounds alternate the kernels; medians.
 *
 *     build/memwall_bench_crc32c [MiB (default 1024)] [rounds (default 5)]
 */
#include "memwall/common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? strtol(argv[1], NULL, 10) : 1024, rounds = argc > 2 ? strtol(argv[2], NULL, 10) : 5;
    if (mib < 64 || mib > 65536 || rounds < 1 || rounds > 100) {
        fprintf(stderr, "usage: %s [MiB: 64..65536] [rounds: 1..100]\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)mib << 20, blk = 64 << 10;
    unsigned char *p = aligned_alloc(4096, n);
    if (!p) {
        fprintf(stderr, "memwall_bench_crc32c: no memory for %ld MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + 7);
    double t_crc[100], t_read[100], t_sw[100];
    uint64_t sink = 0;
    for (long r = 0; r < rounds; r++) {
        double t = now();
        for (size_t o = 0; o < n; o += blk) sink += mw_crc32c(0, p + o, blk);
        t_crc[r] = now() - t;
        t = now();
        for (size_t o = 0; o < n; o += blk) { /* the memory's limit: every byte loaded once */
            uint64_t s = 0, w;
            for (size_t i = 0; i < blk; i += 8) {
                memcpy(&w, p + o + i, 8);
                s ^= w;
            }
            sink += s;
        }
        t_read[r] = now() - t;
        t = now();
        for (size_t o = 0; o < n / 16; o += blk) sink += mw_crc32c_sw(0, p + o, blk); /* a sixteenth: slow */
        t_sw[r] = (now() - t) * 16;
    }
    qsort(t_crc, (size_t)rounds, sizeof *t_crc, cmp);
    qsort(t_read, (size_t)rounds, sizeof *t_read, cmp);
    qsort(t_sw, (size_t)rounds, sizeof *t_sw, cmp);
    double gb = (double)n / 1e9, c = gb / t_crc[rounds / 2], rd = gb / t_read[rounds / 2], sw = gb / t_sw[rounds / 2];
    printf("crc32c over %ld MiB in 64 KiB blocks, median of %ld rounds (GB = 10^9 bytes):\n", mib, rounds);
    printf("  mw_crc32c (ISA-L)   %7.2f GB/s\n  plain read          %7.2f GB/s\n  scalar reference    %7.2f GB/s\n", c, rd, sw);
    printf("  crc32c / plain read %7.2f\n", c / rd);
    free(p);
    return sink == 42 ? 3 : 0; /* keeps the loops */
}
