/*
 * test_aio.c — the async I/O engine, every test on both backends (io_uring and threads):
 * round trips at odd sizes and offsets, hundreds of requests in flight with callbacks, reads
 * past end of file, alignment errors, injected failures, a real file-size-limit failure in a
 * forked child, and a two-thread submit/wait stress (run under the sanitizers in CI).
 * One CTest entry per backend: where io_uring is refused (seccomp, old kernel, container) the
 * uring entry is skipped (77) and the thread-pool entry still runs everything.
 * CTest variants: uring threads
 */
#include "memwall/aio.h"
#include "memwall/tier.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>

static const char *g_dir;
static char g_path[600];

/* 1 when an io_uring engine can be made here (else the reason is in mw_error_msg()). */
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

static struct mw_aio *make(enum mw_aio_backend b, size_t bs, unsigned qd)
{
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    c.backend = b;
    c.block_size = bs;
    c.queue_depth = qd;
    struct mw_aio *aio = NULL;
    int rc = mw_aio_init(&aio, &c);
    if (rc) fprintf(stderr, "%s engine: %s\n", mw_aio_backend_name(b), mw_error_msg());
    REQUIRE(rc == 0 && aio);
    CHECK_EQ_INT(mw_aio_backend(aio), b);
    return aio;
}

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(tu_rand(&seed) >> 56);
}

/* Buffered fd: any size and offset; O_DIRECT fd: 4096-aligned pieces. */
static void test_roundtrip(enum mw_aio_backend b)
{
    struct mw_aio *aio = make(b, 8192, 4);
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    static const uint64_t sizes[] = {1, 7, 4095, 4097, 8192, 12345, 100003};
    static const uint64_t offs[] = {0, 3, 4096, 77777};
    unsigned char *w = malloc(100003), *r = malloc(100003);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (size_t j = 0; j < sizeof offs / sizeof *offs; j++) {
            fill(w, sizes[i], i * 31 + j);
            memset(r, 0, sizes[i]);
            CHECK_EQ_INT(mw_aio_pwrite(aio, fd, w, sizes[i], offs[j], "odd", g_path), 0);
            CHECK_EQ_INT(mw_aio_pread(aio, fd, r, sizes[i], offs[j], "odd", g_path), 0);
            CHECK_MSG(!memcmp(w, r, sizes[i]), "size %llu off %llu", (unsigned long long)sizes[i],
                      (unsigned long long)offs[j]);
        }
    close(fd);

    /* O_DIRECT with a 2 MiB-aligned huge-page buffer, 1 MiB pieces. */
    fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd >= 0) {
        struct mw_buf wb, rb;
        REQUIRE(mw_tier_alloc(NULL, 3 << 20, MW_ALLOC_IO, MW_KIND_STAGING, "w", &wb) == 0);
        REQUIRE(mw_tier_alloc(NULL, 3 << 20, MW_ALLOC_IO, MW_KIND_STAGING, "r", &rb) == 0);
        CHECK((uintptr_t)wb.ptr % MW_IO_ALIGN == 0);
        fill(wb.ptr, 3 << 20, 99);
        struct mw_aio *a2 = make(b, 1 << 20, 8);
        CHECK_EQ_INT(mw_aio_pwrite(a2, fd, wb.ptr, (3 << 20) - 8192, 4096, "direct", g_path), 0);
        CHECK_EQ_INT(mw_aio_pread(a2, fd, rb.ptr, (3 << 20) - 8192, 4096, "direct", g_path), 0);
        CHECK(!memcmp(wb.ptr, rb.ptr, (3 << 20) - 8192));
        /* A misaligned O_DIRECT request is reported with the alignment hint. */
        int rc = mw_aio_pread(a2, fd, rb.ptr, 4096, 100, "misaligned", g_path);
        CHECK_EQ_INT(rc, -EINVAL);
        CHECK_MSG(strstr(mw_error_msg(), "4096-aligned") && strstr(mw_error_msg(), "misaligned"), "%s",
                  mw_error_msg());
        mw_aio_free(a2);
        mw_tier_free(&wb);
        mw_tier_free(&rb);
        close(fd);
    }
    free(w);
    free(r);
    mw_aio_free(aio);
}

struct cb_count { pthread_mutex_t mu; int n; int bad; };

static void count_cb(struct mw_aio_req *req, void *user)
{
    struct cb_count *c = user;
    pthread_mutex_lock(&c->mu);
    c->n++;
    if (req->result || req->done_bytes != req->len) c->bad++;
    pthread_mutex_unlock(&c->mu);
}

/* 400 requests of 3 pieces each queued at once behind a queue depth of 256. */
static void test_many_in_flight(enum mw_aio_backend b)
{
    enum { N = 400, SZ = 12288, QD = 256 };
    struct mw_aio *aio = make(b, 4096, QD);
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    unsigned char *w = malloc((size_t)N * SZ), *r = calloc((size_t)N, SZ);
    fill(w, (size_t)N * SZ, 5);
    struct mw_aio_req *reqs = calloc(N, sizeof *reqs);
    struct cb_count cc = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
    for (int i = 0; i < N; i++) {
        reqs[i] = (struct mw_aio_req){.op = MW_AIO_WRITE, .fd = fd, .buf = w + (size_t)i * SZ, .len = SZ,
                                      .offset = (uint64_t)i * SZ, .cb = count_cb, .user = &cc, .object = "many"};
        CHECK_EQ_INT(mw_aio_submit(aio, &reqs[i]), 0);
    }
    CHECK_EQ_INT(mw_aio_wait_all(aio), 0);
    CHECK_EQ_INT(cc.n, N);
    CHECK_EQ_INT(cc.bad, 0);
    /* Read back in reverse order, polled, no callbacks. */
    for (int i = N - 1; i >= 0; i--) {
        reqs[i] = (struct mw_aio_req){.op = MW_AIO_READ, .fd = fd, .buf = r + (size_t)i * SZ, .len = SZ,
                                      .offset = (uint64_t)i * SZ, .object = "many"};
        CHECK_EQ_INT(mw_aio_submit(aio, &reqs[i]), 0);
    }
    for (int i = 0; i < N; i++) CHECK_EQ_INT(mw_aio_wait(aio, &reqs[i]), 0);
    for (int i = 0; i < N; i++) CHECK(mw_aio_test(&reqs[i]));
    CHECK(!memcmp(w, r, (size_t)N * SZ));
    struct mw_aio_stats st;
    mw_aio_stats(aio, &st);
    CHECK_EQ_INT(st.requests, 2 * N);
    CHECK_EQ_INT(st.pieces, 2 * N * 3);
    CHECK(st.max_in_flight <= QD && st.max_in_flight >= 1);
    printf("  most pieces in flight: %u\n", st.max_in_flight);
    CHECK_EQ_INT(st.bytes_read, (uint64_t)N * SZ);
    CHECK_EQ_INT(st.bytes_written, (uint64_t)N * SZ);
    free(reqs);
    free(w);
    free(r);
    close(fd);
    mw_aio_free(aio);
}

static void test_short_read(enum mw_aio_backend b)
{
    struct mw_aio *aio = make(b, 4096, 4);
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    unsigned char w[10000], r[20000];
    fill(w, sizeof w, 8);
    REQUIRE(mw_aio_pwrite(aio, fd, w, sizeof w, 0, "short", g_path) == 0);
    /* Reported: the file ends inside the range. */
    int rc = mw_aio_pread(aio, fd, r, sizeof r, 0, "short", g_path);
    CHECK_EQ_INT(rc, MW_EFORMAT);
    CHECK_MSG(strstr(mw_error_msg(), "10000") && strstr(mw_error_msg(), "short"), "%s", mw_error_msg());
    /* Handled: with ALLOW_SHORT the request succeeds and says how much it read. */
    struct mw_aio_req q = {.op = MW_AIO_READ, .fd = fd, .buf = r, .len = sizeof r, .offset = 0,
                           .flags = MW_AIO_ALLOW_SHORT, .object = "short", .path = g_path};
    memset(r, 0, sizeof r);
    REQUIRE(mw_aio_submit(aio, &q) == 0);
    CHECK_EQ_INT(mw_aio_wait(aio, &q), 0);
    CHECK_EQ_INT(q.done_bytes, 10000);
    CHECK(!memcmp(w, r, sizeof w));
    close(fd);

    /* O_DIRECT: the file ends mid-page; the engine must not resubmit at the unaligned tail. */
    fd = open(g_path, O_RDWR | O_DIRECT);
    if (fd >= 0) {
        struct mw_buf rb;
        REQUIRE(mw_tier_alloc(NULL, 16384, 0, MW_KIND_STAGING, "r", &rb) == 0);
        q = (struct mw_aio_req){.op = MW_AIO_READ, .fd = fd, .buf = rb.ptr, .len = 16384, .offset = 0,
                                .flags = MW_AIO_ALLOW_SHORT, .object = "short", .path = g_path};
        REQUIRE(mw_aio_submit(aio, &q) == 0);
        CHECK_EQ_INT(mw_aio_wait(aio, &q), 0);
        CHECK_EQ_INT(q.done_bytes, 10000);
        CHECK(!memcmp(w, rb.ptr, sizeof w));
        mw_tier_free(&rb);
        close(fd);
    }
    mw_aio_free(aio);
}

static void test_injected_failure(enum mw_aio_backend b)
{
    struct mw_aio *aio = make(b, 4096, 4);
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    unsigned char w[16384];
    fill(w, sizeof w, 3);
    mw_aio_inject_fault(aio, MW_AIO_WRITE, 1 << 20, -ENOSPC);
    CHECK_EQ_INT(mw_aio_pwrite(aio, fd, w, sizeof w, 0, "early", g_path), 0);
    int rc = mw_aio_pwrite(aio, fd, w, sizeof w, (1 << 20) - 4096, "late", g_path);
    CHECK_EQ_INT(rc, -ENOSPC);
    const char *m = mw_error_msg();
    CHECK_MSG(strstr(m, "late") && strstr(m, g_path) && strstr(m, "1048576"), "%s", m);
    /* wait_all reports the failure once, then is clean. */
    CHECK_EQ_INT(mw_aio_wait_all(aio), -ENOSPC);
    CHECK_EQ_INT(mw_aio_wait_all(aio), 0);
    mw_aio_inject_fault(aio, MW_AIO_WRITE, 0, 0);
    unsigned char r[16384];
    CHECK_EQ_INT(mw_aio_pread(aio, fd, r, sizeof r, 0, "early", g_path), 0);
    CHECK(!memcmp(w, r, sizeof r));
    /* Malformed requests are refused at submit. */
    struct mw_aio_req bad = {.op = MW_AIO_READ, .fd = fd, .buf = NULL, .len = 10};
    CHECK_EQ_INT(mw_aio_submit(aio, &bad), -EINVAL);
    close(fd);
    mw_aio_free(aio);
}

/* A real full-file-system failure: RLIMIT_FSIZE in a forked child. */
static void test_fsize_limit(enum mw_aio_backend b)
{
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1 << 20, 1 << 20};
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(3);
        struct mw_aio *aio = make(b, 65536, 4);
        int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) _exit(3);
        static unsigned char w[2 << 20];
        fill(w, sizeof w, 1);
        if (mw_aio_pwrite(aio, fd, w, 512 << 10, 0, "fits", g_path)) _exit(4);
        int rc = mw_aio_pwrite(aio, fd, w, 2 << 20, 512 << 10, "too-big", g_path);
        if (rc != -EFBIG) { fprintf(stderr, "child: rc %d: %s\n", rc, mw_error_msg()); _exit(5); }
        if (!strstr(mw_error_msg(), "too-big") || !strstr(mw_error_msg(), "File too large")) {
            fprintf(stderr, "child: message: %s\n", mw_error_msg());
            _exit(6);
        }
        static unsigned char r[512 << 10];
        if (mw_aio_pread(aio, fd, r, sizeof r, 0, "fits", g_path) || memcmp(w, r, sizeof r)) _exit(7);
        mw_aio_free(aio);
        close(fd);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "backend %s: child status 0x%x",
              mw_aio_backend_name(b), status);
}

struct stress {
    struct mw_aio *aio;
    int fd;
    unsigned char *data;
    struct mw_aio_req *reqs;
    int n;
    _Atomic int submitted;
    _Atomic int waited;  /* the waiter is done: the submitter may exit */
    int failures;
};

static void *stress_submitter(void *arg)
{
    struct stress *s = arg;
    for (int i = 0; i < s->n; i++) {
        if (mw_aio_submit(s->aio, &s->reqs[i])) s->failures++;
        atomic_store(&s->submitted, i + 1);
    }
    /* io_uring cancels the requests a thread submitted when it exits (-ECANCELED for the writes
     * the kernel's workers still held): a submitting thread outlives its requests (aio.h). */
    while (!atomic_load(&s->waited)) sched_yield();
    return NULL;
}

/* One thread submits, another waits for each request as soon as it is submitted. */
static void test_two_threads(enum mw_aio_backend b)
{
    enum { N = 256, SZ = 8192 };
    struct mw_aio *aio = make(b, 4096, 8);
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    struct stress s = {.aio = aio, .fd = fd, .n = N};
    s.data = malloc((size_t)N * SZ);
    fill(s.data, (size_t)N * SZ, 11);
    s.reqs = calloc(N, sizeof *s.reqs);
    for (int round = 0; round < 2; round++) {
        unsigned char *r = round ? calloc(N, SZ) : NULL;
        for (int i = 0; i < N; i++)
            s.reqs[i] = (struct mw_aio_req){.op = round ? MW_AIO_READ : MW_AIO_WRITE, .fd = fd,
                                            .buf = round ? r + (size_t)i * SZ : s.data + (size_t)i * SZ,
                                            .len = SZ, .offset = (uint64_t)i * SZ, .object = "stress"};
        atomic_store(&s.submitted, 0);
        atomic_store(&s.waited, 0);
        pthread_t th;
        REQUIRE(pthread_create(&th, NULL, stress_submitter, &s) == 0);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            while (atomic_load(&s.submitted) <= i) sched_yield();
            if (mw_aio_wait(aio, &s.reqs[i]) && ++bad <= 3) /* what failed, for a rare failure under load */
                printf("  %s %d of %d failed: %s\n", round ? "read" : "write", i, N, mw_error_msg());
        }
        atomic_store(&s.waited, 1);
        pthread_join(th, NULL);
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(s.failures, 0);
        if (round) CHECK(!memcmp(s.data, r, (size_t)N * SZ));
        free(r);
    }
    free(s.reqs);
    free(s.data);
    close(fd);
    mw_aio_free(aio);
}

/* Completion order, recorded by the callbacks. */
struct order { pthread_mutex_t mu; int n; int ids[16]; };

static void order_cb(struct mw_aio_req *req, void *user)
{
    struct order *o = user;
    pthread_mutex_lock(&o->mu);
    CHECK_EQ_INT(req->result, 0);
    if (o->n < 16) o->ids[o->n++] = req->object[0] - 'a';
    pthread_mutex_unlock(&o->mu);
}

/* Queue depth 1, so pieces are issued strictly in queue order, and the first write's piece is
 * held 500 ms (MEMWALL_FAULT delay) so that everything else queues behind it: 5 one-piece
 * writes, then two urgent reads and a plain one. The urgent reads overtake the queued writes,
 * among themselves in submission order (the second joins behind the first); the plain read
 * stays last. The reads read a region written beforehand. */
static void test_urgent(enum mw_aio_backend b)
{
    enum { N = 8, SZ = 4096 };
    static const char *names[N] = {"a", "b", "c", "d", "e", "f", "g", "h"};
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    unsigned char *buf = calloc(N, SZ);
    struct mw_aio *aio = make(b, SZ, 1);
    CHECK_EQ_INT(mw_aio_pwrite(aio, fd, buf, 3 * SZ, 8 * SZ, "pre", g_path), 0);
    mw_aio_free(aio);
    setenv("MEMWALL_FAULT", "write:delay:count=1:us=500000", 1);
    aio = make(b, SZ, 1);
    unsetenv("MEMWALL_FAULT");
    struct mw_aio_req reqs[N];
    struct order o = {PTHREAD_MUTEX_INITIALIZER, 0, {0}};
    for (int i = 0; i < N; i++) {
        int rd = i >= 5;
        reqs[i] = (struct mw_aio_req){.op = rd ? MW_AIO_READ : MW_AIO_WRITE, .fd = fd,
                                      .buf = buf + (size_t)i * SZ, .len = SZ,
                                      .offset = (uint64_t)(rd ? i + 3 : i) * SZ,
                                      .flags = i == 5 || i == 6 ? MW_AIO_URGENT : 0,
                                      .cb = order_cb, .user = &o, .object = names[i]};
    }
    /* The first write is taken by the engine (the thread pool's worker may start late) before
     * the others are queued. */
    CHECK_EQ_INT(mw_aio_submit(aio, &reqs[0]), 0);
    struct mw_aio_stats st = {0};
    for (int t = 0; t < 5000 && !st.max_in_flight; t++) {
        mw_aio_stats(aio, &st);
        if (!st.max_in_flight) usleep(1000);
    }
    CHECK_EQ_INT(st.max_in_flight, 1);
    for (int i = 1; i < N; i++) CHECK_EQ_INT(mw_aio_submit(aio, &reqs[i]), 0);
    CHECK_EQ_INT(mw_aio_wait_all(aio), 0);
    CHECK_EQ_INT(o.n, N);
    static const int want[N] = {0, 5, 6, 1, 2, 3, 4, 7};
    for (int i = 0; i < N && i < o.n; i++)
        CHECK_MSG(o.ids[i] == want[i], "completion %d: request %c, want %c", i, 'a' + o.ids[i], 'a' + want[i]);
    free(buf);
    close(fd);
    mw_aio_free(aio);
}

int main(int argc, char **argv)
{
    const char *want = argc > 1 ? argv[1] : "all";
    if (strcmp(want, "all") && strcmp(want, "uring") && strcmp(want, "threads")) {
        fprintf(stderr, "unknown backend '%s': uring, threads\n", want);
        return 2;
    }
    g_dir = tu_scratch_dir("aio");
    snprintf(g_path, sizeof g_path, "%s/data.bin", g_dir);
    const enum mw_aio_backend backends[] = {MW_AIO_URING, MW_AIO_THREADS};
    for (int i = 0; i < 2; i++) {
        if (strcmp(want, "all") && strcmp(want, mw_aio_backend_name(backends[i]))) continue;
        if (backends[i] == MW_AIO_URING && !uring_available()) {
            if (strcmp(want, "all")) SKIP("io_uring unavailable: %s", mw_error_msg());
            printf("io_uring unavailable (%s): its half not run\n", mw_error_msg());
            continue;
        }
        printf("backend %s\n", mw_aio_backend_name(backends[i]));
        test_roundtrip(backends[i]);
        test_many_in_flight(backends[i]);
        test_short_read(backends[i]);
        test_injected_failure(backends[i]);
        test_fsize_limit(backends[i]);
        test_two_threads(backends[i]);
        test_urgent(backends[i]);
    }
    if (!strcmp(want, "uring")) { tu_rm_rf(g_dir); TEST_END(); }
    /* MEMWALL_AIO forces the backend for AUTO. */
    setenv("MEMWALL_AIO", "threads", 1);
    struct mw_aio *aio = make(MW_AIO_THREADS, 4096, 2);
    mw_aio_free(aio);
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    REQUIRE(mw_aio_init(&aio, &c) == 0);
    CHECK_EQ_INT(mw_aio_backend(aio), MW_AIO_THREADS);
    mw_aio_free(aio);
    setenv("MEMWALL_AIO", "bogus", 1);
    CHECK_EQ_INT(mw_aio_init(&aio, &c), -EINVAL);
    unsetenv("MEMWALL_AIO");
    unlink(g_path);
    rmdir(g_dir);
    TEST_END();
}
