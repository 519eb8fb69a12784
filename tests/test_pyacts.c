/*
 * test_pyacts.c — the spill store of memwall.torch.offload(activations="nvme") (memwall/pyapi.h,
 * mw_pyacts_*; src/pyapi/pyacts.c), in C so that it runs under ASan+UBSan too. It checks:
 *  - tensors of awkward sizes (1 byte, 4095, one crc block, one more, several chunks with a ragged
 *    tail) written through a staging pool of two 64 KiB chunks (every put of more than two chunks
 *    waits for its own first writes: back-pressure) come back byte for byte, in reverse order, out of
 *    order, twice (retain_graph), with reads started ahead and waited for later;
 *  - the figures: live tensors and bytes, peak, bytes written and read;
 *  - a thousand tensors live at once and a thousand more after they are dropped (slots reused, a
 *    stale handle refused, the file reused: its size stays that of the peak);
 *  - hostile arguments refused with a message and nothing changed: sizes 0 and past 2^48, a NULL
 *    source, unaligned or short read buffers, made-up and stale handles, a wait without a read, a
 *    read started twice, bad staging/chunk sizes and directories;
 *  - a byte flipped on disk is a crc32c error naming the tensor; an injected EIO on a read
 *    (MEMWALL_FAULT) fails that read with the tensor named and the next read of it succeeds; an
 *    injected write error fails the next put, and the tensor it hit cannot be read back;
 *  - one store per directory (a second is -EBUSY naming the pid); a file left by a killed run is
 *    removed and the store opens;
 *  - close removes the file and the directory it made.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "memwall/common.h"
#include "memwall/pyapi.h"
#include "testutil.h"

#define CHUNK ((uint64_t)64 << 10)

static void fill(unsigned char *p, uint64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (uint64_t i = 0; i < n; i++) p[i] = (unsigned char)(tu_rand(&s) >> 56);
}

static unsigned char *aligned(uint64_t n)
{
    void *p = NULL;
    REQUIRE(posix_memalign(&p, 4096, (size_t)n) == 0);
    memset(p, 0xa5, (size_t)n);
    return p;
}

/* Reads h back (start, then wait) and compares it with src[n]. */
static int read_equal(struct mw_pyacts *a, uint64_t h, const unsigned char *src, uint64_t n)
{
    uint64_t room = mw_pyacts_room(n);
    unsigned char *b = aligned(room);
    int ok = mw_pyacts_read_start(a, h, b, room) == 0 && mw_pyacts_read_wait(a, h) == 0 && !memcmp(b, src, (size_t)n);
    free(b);
    return ok;
}

static double stat_of(struct mw_pyacts *a, int i)
{
    double v[MW_PYACTS_NSTATS];
    REQUIRE(mw_pyacts_stats(a, v, MW_PYACTS_NSTATS) == MW_PYACTS_NSTATS);
    return v[i];
}

static void test_round_trip(const char *dir)
{
    struct mw_pyacts *a;
    REQUIRE(mw_pyacts_open(&a, dir, 2 * CHUNK, CHUNK, 0) == 0);
    static const uint64_t sizes[] = {1, 4095, 65536, 65537, 3 * CHUNK + 17, 12345, 5 * CHUNK};
    enum { N = sizeof sizes / sizeof *sizes };
    unsigned char *src[N];
    uint64_t h[N], total = 0;
    for (int i = 0; i < N; i++) {
        src[i] = malloc((size_t)sizes[i] + 1); /* not aligned on purpose: put copies */
        REQUIRE(src[i]);
        fill(src[i] + 1, sizes[i], (uint64_t)i);
        CHECK_EQ_INT(mw_pyacts_put(a, src[i] + 1, sizes[i], &h[i]), 0);
        total += sizes[i];
    }
    CHECK_EQ_INT(stat_of(a, 0), N);
    CHECK_EQ_INT(stat_of(a, 1), total);
    CHECK_EQ_INT(stat_of(a, 9), 2 * CHUNK);
    /* reverse order, each read started one ahead (as the Python side's window does) */
    uint64_t room[N];
    unsigned char *buf[N];
    for (int i = 0; i < N; i++) { room[i] = mw_pyacts_room(sizes[i]); buf[i] = aligned(room[i]); }
    CHECK_EQ_INT(mw_pyacts_read_start(a, h[N - 1], buf[N - 1], room[N - 1]), 0);
    for (int i = N - 1; i >= 0; i--) {
        if (i > 0) CHECK_EQ_INT(mw_pyacts_read_start(a, h[i - 1], buf[i - 1], room[i - 1]), 0);
        CHECK_EQ_INT(mw_pyacts_read_wait(a, h[i]), 0);
        CHECK_MSG(!memcmp(buf[i], src[i] + 1, (size_t)sizes[i]), "tensor %d (%llu bytes) differs", i,
                  (unsigned long long)sizes[i]);
    }
    /* again (retain_graph), out of order */
    CHECK(read_equal(a, h[2], src[2] + 1, sizes[2]));
    CHECK(read_equal(a, h[5], src[5] + 1, sizes[5]));
    CHECK(read_equal(a, h[0], src[0] + 1, sizes[0]));
    CHECK_EQ_INT(stat_of(a, 3), total);
    CHECK_EQ_INT(stat_of(a, 4), total + sizes[2] + sizes[5] + sizes[0]);
    uint64_t b = 0;
    CHECK_EQ_INT(mw_pyacts_bytes(a, h[4], &b), 0);
    CHECK_EQ_INT(b, 3 * CHUNK + 17);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(mw_pyacts_drop(a, h[i]), 0);
        free(src[i]);
        free(buf[i]);
    }
    CHECK_EQ_INT(stat_of(a, 0), 0);
    CHECK_EQ_INT(stat_of(a, 1), 0);
    CHECK_EQ_INT(stat_of(a, 2), total);
    CHECK_EQ_INT(mw_pyacts_flush(a), 0);
    /* a drop right after a put (its writes in flight) and of a tensor being read */
    unsigned char *big = malloc(4 * CHUNK);
    REQUIRE(big);
    fill(big, 4 * CHUNK, 99);
    uint64_t x, y;
    CHECK_EQ_INT(mw_pyacts_put(a, big, 4 * CHUNK, &x), 0);
    CHECK_EQ_INT(mw_pyacts_drop(a, x), 0);
    CHECK_EQ_INT(mw_pyacts_put(a, big, 4 * CHUNK, &y), 0);
    unsigned char *rb = aligned(4 * CHUNK);
    CHECK_EQ_INT(mw_pyacts_read_start(a, y, rb, 4 * CHUNK), 0);
    CHECK_EQ_INT(mw_pyacts_drop(a, y), 0);
    free(rb);
    free(big);
    mw_pyacts_close(a);
    struct stat sb;
    CHECK_MSG(stat(dir, &sb) != 0, "%s is still there after close", dir);
}

static void test_many(const char *dir)
{
    struct mw_pyacts *a;
    REQUIRE(mw_pyacts_open(&a, dir, 0, 0, 0) == 0);
    enum { M = 1000 };
    static uint64_t h[M];
    unsigned char v[300];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < M; i++) {
            memset(v, i & 0xff, sizeof v);
            CHECK_EQ_INT(mw_pyacts_put(a, v, 1 + (uint64_t)(i % 300), &h[i]), 0);
        }
        CHECK_EQ_INT(stat_of(a, 0), M);
        memset(v, 777 & 0xff, sizeof v);
        CHECK(read_equal(a, h[777], v, 1 + 777 % 300));
        uint64_t old = h[10];
        for (int i = M - 1; i >= 0; i--) CHECK_EQ_INT(mw_pyacts_drop(a, h[i]), 0);
        CHECK_EQ_INT(mw_pyacts_drop(a, old), -EINVAL); /* stale */
        CHECK(strstr(mw_error_msg(), "no saved tensor") != NULL);
    }
    /* first fit: the second round reused the first one's extents; each object is 4 KiB there */
    char path[700];
    snprintf(path, sizeof path, "%s/memwall-acts.0.dat", dir);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && (uint64_t)sb.st_size <= (uint64_t)M * 4096);
    mw_pyacts_close(a);
}

static void test_hostile(const char *dir)
{
    struct mw_pyacts *a;
    char longdir[700];
    memset(longdir, 'x', sizeof longdir - 1);
    longdir[sizeof longdir - 1] = 0;
    CHECK_EQ_INT(mw_pyacts_open(&a, "", 0, 0, 0), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_open(&a, NULL, 0, 0, 0), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_open(&a, longdir, 0, 0, 0), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_open(&a, dir, 0, 4096, 0), -EINVAL);              /* not whole crc blocks */
    CHECK_EQ_INT(mw_pyacts_open(&a, dir, CHUNK, 2 * CHUNK, 0), -EINVAL);     /* staging below a chunk */
    CHECK_EQ_INT(mw_pyacts_open(&a, dir, 65 * CHUNK, CHUNK, 0), -EINVAL);    /* 65 chunks */
    CHECK_EQ_INT(mw_pyacts_open(&a, dir, 0, (uint64_t)2 << 30, 0), -EINVAL); /* a 2 GiB chunk */
    CHECK(strstr(mw_error_msg(), "chunk") != NULL);
    CHECK(a == NULL);
    CHECK_EQ_INT(mw_pyacts_room(0), 0);
    CHECK_EQ_INT(mw_pyacts_room(((uint64_t)1 << 48) + 1), 0);
    CHECK_EQ_INT(mw_pyacts_room(UINT64_MAX), 0);
    CHECK_EQ_INT(mw_pyacts_room(1), 4096);
    CHECK_EQ_INT(mw_pyacts_room(4097), 8192);
    REQUIRE(mw_pyacts_open(&a, dir, 0, 0, 0) == 0);
    unsigned char v[5000];
    fill(v, sizeof v, 7);
    uint64_t h = 123, g;
    CHECK_EQ_INT(mw_pyacts_put(a, v, 0, &h), -EINVAL);
    CHECK_EQ_INT(h, 0);
    CHECK_EQ_INT(mw_pyacts_put(a, v, ((uint64_t)1 << 48) + 1, &h), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_put(a, v, UINT64_MAX, &h), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_put(a, NULL, 10, &h), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_put(a, v, 10, NULL), -EINVAL);
    CHECK_EQ_INT(stat_of(a, 0), 0);
    CHECK_EQ_INT(mw_pyacts_put(a, v, sizeof v, &h), 0);
    unsigned char *b = aligned(3 * 4096);
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, b + 8, 8192), -EINVAL); /* unaligned */
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, b, 5000), -EINVAL);     /* no room for the padded tail */
    CHECK(strstr(mw_error_msg(), "8192") != NULL);
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, NULL, 8192), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_read_wait(a, h), -EINVAL);               /* nothing in flight */
    CHECK_EQ_INT(mw_pyacts_read_start(a, h ^ ((uint64_t)1 << 32), b, 8192), -EINVAL); /* another generation */
    CHECK_EQ_INT(mw_pyacts_read_start(a, h + 5, b, 8192), -EINVAL);   /* another slot */
    CHECK_EQ_INT(mw_pyacts_read_start(a, UINT64_MAX, b, 8192), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_bytes(a, UINT64_MAX, &g), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_drop(a, h + 1), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, b, 8192), 0);
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, b, 8192), -EBUSY);       /* twice */
    CHECK_EQ_INT(mw_pyacts_read_wait(a, h), 0);
    CHECK(!memcmp(b, v, sizeof v));
    CHECK_EQ_INT(mw_pyacts_stats(a, NULL, 3), -EINVAL);
    double few[2];
    CHECK_EQ_INT(mw_pyacts_stats(a, few, 2), 2);
    CHECK_EQ_INT(few[0], 1);
    CHECK_EQ_INT(mw_pyacts_put(NULL, v, 10, &g), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_read_start(NULL, h, b, 8192), -EINVAL);
    CHECK_EQ_INT(mw_pyacts_drop(NULL, h), -EINVAL);
    free(b);
    struct mw_pyacts *second = NULL;
    CHECK_EQ_INT(mw_pyacts_open(&second, dir, 0, 0, 0), -EBUSY); /* one store per directory */
    CHECK(second == NULL && strstr(mw_error_msg(), "pid") != NULL);
    mw_pyacts_close(a); /* with a tensor still live: dropped */
    mw_pyacts_close(NULL);
    /* a file left by a run killed mid-step: removed, the store opens */
    REQUIRE(mkdir(dir, 0700) == 0);
    char path[700];
    snprintf(path, sizeof path, "%s/memwall-acts.0.dat", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs("left over", f);
    fclose(f);
    REQUIRE(mw_pyacts_open(&a, dir, 0, 0, 0) == 0);
    CHECK_EQ_INT(mw_pyacts_put(a, v, 10, &h), 0);
    CHECK(read_equal(a, h, v, 10));
    mw_pyacts_close(a);
}

static void test_faults(const char *dir)
{
    unsigned char v[3 * 65536];
    fill(v, sizeof v, 3);
    struct mw_pyacts *a;
    uint64_t h, g;
    /* a corrupted byte on disk: the crc32c of its block */
    REQUIRE(mw_pyacts_open(&a, dir, 0, 0, 0) == 0);
    CHECK_EQ_INT(mw_pyacts_put(a, v, sizeof v, &h), 0);
    CHECK_EQ_INT(mw_pyacts_flush(a), 0);
    char path[700];
    snprintf(path, sizeof path, "%s/memwall-acts.0.dat", dir);
    tu_flip_byte(path, 70000); /* the first object sits at offset 0: its second block */
    unsigned char *b = aligned(sizeof v);
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, b, sizeof v), 0);
    CHECK_EQ_INT(mw_pyacts_read_wait(a, h), MW_ECHECKSUM);
    CHECK_MSG(strstr(mw_error_msg(), "reading saved tensor") && strstr(mw_error_msg(), "196608 bytes"), "%s",
              mw_error_msg());
    tu_flip_byte(path, 70000);
    CHECK(read_equal(a, h, v, sizeof v));
    mw_pyacts_close(a);

    /* an EIO injected on the first read piece, once */
    setenv("MEMWALL_FAULT", "read:eio:after=0:count=1", 1);
    REQUIRE(mw_pyacts_open(&a, dir, 0, 0, 0) == 0);
    CHECK_EQ_INT(mw_pyacts_put(a, v, sizeof v, &h), 0);
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, b, sizeof v), 0);
    CHECK_EQ_INT(mw_pyacts_read_wait(a, h), -EIO);
    CHECK_MSG(strstr(mw_error_msg(), "reading saved tensor") && strstr(mw_error_msg(), "MEMWALL_FAULT"), "%s",
              mw_error_msg());
    CHECK(read_equal(a, h, v, sizeof v)); /* the disk is fine again */
    mw_pyacts_close(a);

    /* an injected write error, found by a read of the tensor it hit: that tensor cannot be read back,
     * and every later put fails (the forward pass stops at once) */
    setenv("MEMWALL_FAULT", "write:eio:after=1:count=1", 1);
    REQUIRE(mw_pyacts_open(&a, dir, 4 * CHUNK, CHUNK, 0) == 0);
    CHECK_EQ_INT(mw_pyacts_put(a, v, 100, &g), 0);      /* piece 0 */
    CHECK_EQ_INT(mw_pyacts_put(a, v, sizeof v, &h), 0); /* pieces 1 (fails), 2, 3: nothing waited for yet */
    CHECK_EQ_INT(mw_pyacts_read_start(a, h, b, sizeof v), -EIO);
    CHECK_MSG(strstr(mw_error_msg(), "cannot be read back") && strstr(mw_error_msg(), "MEMWALL_FAULT"), "%s",
              mw_error_msg());
    uint64_t k = 7;
    CHECK_EQ_INT(mw_pyacts_put(a, v, 1000, &k), -EIO);
    CHECK_EQ_INT(k, 0);
    CHECK_MSG(strstr(mw_error_msg(), "writing a saved tensor (196608 bytes"), "%s", mw_error_msg());
    CHECK_EQ_INT(mw_pyacts_flush(a), -EIO);
    CHECK(read_equal(a, g, v, 100)); /* written before: fine */
    CHECK_EQ_INT(mw_pyacts_drop(a, h), 0);
    mw_pyacts_close(a);
    /* the same found by a put (back-pressure on the failed chunk's buffer): that put fails, its tensor
     * is dropped, nothing stays live */
    setenv("MEMWALL_FAULT", "write:eio:after=1:count=1", 1);
    REQUIRE(mw_pyacts_open(&a, dir, 2 * CHUNK, CHUNK, 0) == 0);
    CHECK_EQ_INT(mw_pyacts_put(a, v, 100, &g), 0);
    k = 7;
    CHECK_EQ_INT(mw_pyacts_put(a, v, sizeof v, &k), -EIO);
    CHECK_EQ_INT(k, 0);
    CHECK_EQ_INT(stat_of(a, 0), 1);
    mw_pyacts_close(a);
    unsetenv("MEMWALL_FAULT");
    free(b);
}

int main(void)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/acts", tu_scratch_dir("pyacts"));
    test_round_trip(dir);
    test_many(dir);
    test_hostile(dir);
    test_faults(dir);
    TEST_END();
}
