/*
 * testutil.h — the few helpers every test executable uses. A test is a plain CTest
 * executable: exit 0 passes, 77 skips (with the reason printed), anything else fails.
 * CHECK prints file:line and the expression, counts the failure and carries on so one run
 * shows every broken assertion; TEST_END returns 1 if any CHECK failed.
 */
#ifndef MEMWALL_TESTUTIL_H
#define MEMWALL_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/stat.h>
#include <fcntl.h>

static int tu_failures;
static int tu_checks;

#define CHECK(x) do { tu_checks++; if (!(x)) { tu_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x); } } while (0)
#define CHECK_MSG(x, ...) do { tu_checks++; if (!(x)) { tu_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #x); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_EQ_INT(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); tu_checks++; \
    if (a_ != b_) { tu_failures++; fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", \
    __FILE__, __LINE__, #a, #b, a_, b_); } } while (0)
#define REQUIRE(x) do { tu_checks++; if (!(x)) { \
    fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #x); exit(1); } } while (0)
#define SKIP(...) do { fprintf(stderr, "SKIP: "); fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr); exit(77); } while (0)
#define TEST_END() do { printf("%d checks, %d failed\n", tu_checks, tu_failures); \
    return tu_failures ? 1 : 0; } while (0)

/* A fresh scratch directory under the build tree (or /tmp), unique per test and pid. */
static inline const char *tu_scratch_dir(const char *name)
{
    static char path[512];
    const char *b = getenv("MW_BUILD_DIR");
    snprintf(path, sizeof path, "%s/test-scratch/%s-%d", b ? b : "/tmp", name, (int)getpid());
    char cmd[1100]; /* two 512-byte paths: gcc -O2 checks the bound (-Wformat-truncation) */
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", path, path);
    if (system(cmd) != 0) { fprintf(stderr, "cannot create %s\n", path); exit(1); }
    return path;
}

static inline void tu_rm_rf(const char *path)
{
    char cmd[1100]; /* two 512-byte paths: gcc -O2 checks the bound (-Wformat-truncation) */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

/* Corrupts (or, called again, repairs) one byte of a file in place: bit 4 flipped, synced. */
static inline void tu_flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    REQUIRE(fd >= 0);
    unsigned char c;
    REQUIRE(pread(fd, &c, 1, (off_t)off) == 1);
    c ^= 0x10;
    REQUIRE(pwrite(fd, &c, 1, (off_t)off) == 1);
    fsync(fd);
    close(fd);
}

/* Deterministic xorshift64* generator for test data. */
static inline uint64_t tu_rand(uint64_t *s)
{
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static inline float tu_randf(uint64_t *s) /* uniform in [-1, 1) */
{
    return (float)((double)(tu_rand(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

#endif
