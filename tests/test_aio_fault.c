/*
 * test_aio_fault.c — MEMWALL_FAULT, the I/O engine's fault hook: the parser takes the
 * documented rules and refuses everything else with a message (hostile input: junk, overflow,
 * repeats, too long); on each backend an injected error hits exactly the pieces the rule names
 * (after=, count=), touches no file, and its message names object, file, offset and — for
 * ENOSPC — the directory and its free space, marked as injected; an injected delay makes the
 * pieces it applies to at least that slow and changes no byte.
 * CTest variants: uring threads
 */
#include "aio/aio_impl.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>

static const char *g_dir;
static char g_path[600];

static int uring_available(void)
{
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    c.backend = MW_AIO_URING;
    struct mw_aio *aio = NULL;
    int rc = mw_aio_init(&aio, &c);
    if (rc == -ENOSYS || rc == -EPERM) return 0;
    REQUIRE(rc == 0 && aio);
    mw_aio_free(aio);
    return 1;
}

/* An engine of 4096-byte pieces made with MEMWALL_FAULT=spec. */
static struct mw_aio *make(enum mw_aio_backend b, unsigned qd, const char *spec)
{
    setenv("MEMWALL_FAULT", spec, 1);
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    c.backend = b;
    c.block_size = 4096;
    c.queue_depth = qd;
    struct mw_aio *aio = NULL;
    int rc = mw_aio_init(&aio, &c);
    unsetenv("MEMWALL_FAULT");
    CHECK_MSG(rc == 0, "%s: %s", spec, mw_error_msg());
    REQUIRE(rc == 0 && aio);
    return aio;
}

static void test_parse(void)
{
    struct mw_aio_faults f;
    CHECK_EQ_INT(mw_aio_fault_parse(NULL, &f), 0);
    CHECK_EQ_INT(f.n, 0);
    CHECK_EQ_INT(mw_aio_fault_parse("", &f), 0);
    CHECK_EQ_INT(f.n, 0);
    CHECK_EQ_INT(mw_aio_fault_parse("eio", &f), 0);
    CHECK(f.n == 1 && f.rule[0].op == -1 && f.rule[0].err == -EIO && f.rule[0].after == 0 &&
          f.rule[0].count == UINT64_MAX && f.rule[0].delay_us == 0);
    CHECK_EQ_INT(mw_aio_fault_parse("read:eio:after=5:count=2", &f), 0);
    CHECK(f.n == 1 && f.rule[0].op == MW_AIO_READ && f.rule[0].after == 5 && f.rule[0].count == 2);
    CHECK_EQ_INT(mw_aio_fault_parse("write:enospc:count=1:after=1000000000000000", &f), 0);
    CHECK(f.rule[0].op == MW_AIO_WRITE && f.rule[0].err == -ENOSPC && f.rule[0].after == 1000000000000000ull);
    CHECK_EQ_INT(mw_aio_fault_parse("delay:us=1", &f), 0);
    CHECK(f.n == 1 && f.rule[0].err == 0 && f.rule[0].delay_us == 1 && f.rule[0].op == -1);
    CHECK_EQ_INT(mw_aio_fault_parse("read:delay:us=10000000,write:eio:after=3,enospc,delay:us=7", &f), 0);
    CHECK(f.n == 4 && f.rule[0].delay_us == 10000000 && f.rule[1].after == 3 && f.rule[2].err == -ENOSPC &&
          f.rule[3].delay_us == 7);

    static const char *bad[] = {
        "x", "EIO", "read", "read:", ":eio", "eio:", "eio,", ",eio", "eio,,delay:us=1", "read:write:eio",
        "eio:read", "eio:after", "eio:after=", "eio:after=-1", "eio:after=+1", "eio:after=0x10", "eio:after=1e3",
        "eio:after= 1", "eio :after=1", "eio\n", "eio:after=1000000000000001", "eio:after=99999999999999999999",
        "eio:after=1:after=2", "eio:count=0", "eio:us=5", "delay", "delay:us=0", "delay:us=10000001",
        "delay:after=1", "eio:bogus=1", "eio:=1", "eio:after==1", "eio,eio,eio,eio,eio", "eio\x01", "eio\xff",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mw_error_clear();
        int rc = mw_aio_fault_parse(bad[i], &f);
        CHECK_MSG(rc == -EINVAL, "'%s' accepted", bad[i]);
        CHECK_MSG(strstr(mw_error_msg(), "MEMWALL_FAULT") && strstr(mw_error_msg(), "expected"), "'%s': %s", bad[i],
                  mw_error_msg());
    }
    char longspec[300];
    memset(longspec, 0, sizeof longspec);
    strcpy(longspec, "eio:after=1");
    memset(longspec + strlen(longspec), '0', sizeof longspec - 1 - strlen(longspec));
    CHECK_EQ_INT(mw_aio_fault_parse(longspec, &f), -EINVAL);
    CHECK(strstr(mw_error_msg(), "longer than"));
    /* the message names the rule that failed */
    CHECK_EQ_INT(mw_aio_fault_parse("eio,delay:us=0", &f), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "rule 2 ('delay:us=0')"), "%s", mw_error_msg());
}

static void test_init_refuses(enum mw_aio_backend b)
{
    setenv("MEMWALL_FAULT", "read:eio:after=x", 1);
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    c.backend = b;
    struct mw_aio *aio = NULL;
    CHECK_EQ_INT(mw_aio_init(&aio, &c), -EINVAL);
    CHECK(aio == NULL);
    CHECK_MSG(strstr(mw_error_msg(), "MEMWALL_FAULT='read:eio:after=x': rule 1"), "%s", mw_error_msg());
    unsetenv("MEMWALL_FAULT");
}

static void test_errors(enum mw_aio_backend b)
{
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    unsigned char w[5][4096], r[4096];
    for (int i = 0; i < 5; i++) memset(w[i], 0x10 + i, sizeof w[i]);
    /* queue depth 1: pieces are issued (and counted) in submission order */
    struct mw_aio *aio = make(b, 1, "read:eio:after=2:count=1,write:enospc:after=3");
    for (int i = 0; i < 5; i++) {
        int rc = mw_aio_pwrite(aio, fd, w[i], 4096, (uint64_t)i * 4096, "obj", g_path);
        CHECK_EQ_INT(rc, i < 3 ? 0 : -ENOSPC);
        if (i < 3) continue;
        const char *m = mw_error_msg();
        char want[1400];
        snprintf(want, sizeof want, "write of 4.00 KiB at offset %d in %s (object 'obj') failed: No space left on "
                 "device — the disk holding %s is full (", i * 4096, g_path, g_dir);
        CHECK_MSG(strstr(m, want) && strstr(m, " available there) [injected by MEMWALL_FAULT]"), "%s", m);
    }
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && st.st_size == 3 * 4096); /* the failed writes wrote nothing */
    for (int i = 0; i < 3; i++) {
        memset(r, 0, sizeof r);
        int rc = mw_aio_pread(aio, fd, r, 4096, (uint64_t)i * 4096, "obj", g_path);
        CHECK_EQ_INT(rc, i == 2 ? -EIO : 0);
        if (i == 2) {
            char want[900];
            snprintf(want, sizeof want, "read of 4.00 KiB at offset 8192 in %s (object 'obj') failed: Input/output "
                     "error [injected by MEMWALL_FAULT]", g_path);
            CHECK_MSG(!strcmp(mw_error_msg(), want), "%s", mw_error_msg());
        } else CHECK(!memcmp(r, w[i], 4096));
    }
    /* count=1 is spent: the same read now succeeds (a retry works) */
    CHECK_EQ_INT(mw_aio_pread(aio, fd, r, 4096, 8192, "obj", g_path), 0);
    CHECK(!memcmp(r, w[2], 4096));
    struct mw_aio_stats s;
    mw_aio_stats(aio, &s);
    CHECK_EQ_INT(s.errors, 3);
    mw_aio_free(aio);

    /* One request of four pieces, the second failing: the request fails at that piece's offset. */
    aio = make(b, 4, "read:eio:after=1:count=1");
    unsigned char big[4 * 4096];
    int rc = mw_aio_pread(aio, fd, big, 3 * 4096, 0, "big", g_path);
    CHECK_EQ_INT(rc, -EIO);
    CHECK_MSG(strstr(mw_error_msg(), "at offset 4096 in") && strstr(mw_error_msg(), "(object 'big')"), "%s",
              mw_error_msg());
    CHECK_EQ_INT(mw_aio_pread(aio, fd, big, 3 * 4096, 0, "big", g_path), 0);
    for (int i = 0; i < 3; i++) CHECK(!memcmp(big + i * 4096, w[i], 4096));
    mw_aio_free(aio);

    /* Without MEMWALL_FAULT nothing is injected. */
    aio = make(b, 4, "");
    CHECK_EQ_INT(mw_aio_pwrite(aio, fd, w[4], 4096, 4 * 4096, "obj", g_path), 0);
    mw_aio_free(aio);
    close(fd);
}

static void test_delay(enum mw_aio_backend b)
{
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    unsigned char w[4 * 4096], r[4 * 4096];
    for (size_t i = 0; i < sizeof w; i++) w[i] = (unsigned char)(i * 7 + 3);
    /* every piece 30 ms late: a 4-piece write and read, each at least 30 ms, bytes unchanged */
    struct mw_aio *aio = make(b, 4, "delay:us=30000");
    uint64_t t0 = mw_now_ns();
    CHECK_EQ_INT(mw_aio_pwrite(aio, fd, w, sizeof w, 0, "slow", g_path), 0);
    uint64_t t1 = mw_now_ns();
    CHECK_EQ_INT(mw_aio_pread(aio, fd, r, sizeof r, 0, "slow", g_path), 0);
    uint64_t t2 = mw_now_ns();
    CHECK_MSG(t1 - t0 >= 30000000 && t2 - t1 >= 30000000, "write %.1f ms, read %.1f ms", (double)(t1 - t0) / 1e6,
              (double)(t2 - t1) / 1e6);
    CHECK(!memcmp(w, r, sizeof w));
    mw_aio_free(aio);
    /* only the second read piece is delayed (after=1, count=1), by 80 ms */
    aio = make(b, 1, "read:delay:us=80000:after=1:count=1");
    uint64_t ns[3];
    for (int i = 0; i < 3; i++) {
        t0 = mw_now_ns();
        CHECK_EQ_INT(mw_aio_pread(aio, fd, r, 4096, (uint64_t)i * 4096, "slow", g_path), 0);
        ns[i] = mw_now_ns() - t0;
        CHECK(!memcmp(r, w + i * 4096, 4096));
    }
    CHECK_MSG(ns[1] >= 80000000, "the delayed read took %.1f ms", (double)ns[1] / 1e6);
    mw_aio_free(aio);
    /* an error and a delay on the same piece: late, then failed */
    aio = make(b, 1, "write:eio:count=1,write:delay:us=20000:count=1");
    t0 = mw_now_ns();
    CHECK_EQ_INT(mw_aio_pwrite(aio, fd, w, 4096, 0, "slow", g_path), -EIO);
    CHECK(mw_now_ns() - t0 >= 20000000);
    CHECK_EQ_INT(mw_aio_pwrite(aio, fd, w, 4096, 0, "slow", g_path), 0);
    mw_aio_free(aio);
    close(fd);
}

int main(int argc, char **argv)
{
    const char *want = argc > 1 ? argv[1] : "threads";
    enum mw_aio_backend b;
    if (mw_aio_backend_parse(want, &b) || b == MW_AIO_AUTO) {
        fprintf(stderr, "unknown backend '%s': uring, threads\n", want);
        return 2;
    }
    if (b == MW_AIO_URING && !uring_available()) SKIP("io_uring unavailable: %s", mw_error_msg());
    g_dir = tu_scratch_dir(b == MW_AIO_URING ? "aio_fault_uring" : "aio_fault_threads");
    snprintf(g_path, sizeof g_path, "%s/data.bin", g_dir);
    test_parse();
    test_init_refuses(b);
    test_errors(b);
    test_delay(b);
    tu_rm_rf(g_dir);
    TEST_END();
}
