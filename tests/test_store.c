/*
 * test_store.c — the NVMe store on both engine backends: striped round trips of odd-sized
 * objects, async callbacks, a flipped byte on disk caught by crc32c (message names object,
 * file and offset), a full store, a reservation larger than the file-size limit, a write that
 * fails on a full file system with earlier objects still readable, extent reuse, and two
 * threads working on different objects at once; one run per directory (a second store refused
 * naming the holder's pid, a killed run's files kept and listed, a planted symlink refused).
 * One CTest entry per engine backend; the uring one is skipped (77) where io_uring is refused.
 * CTest variants: uring threads
 */
#include "memwall/store.h"
#include "memwall/fsutil.h"
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

static char g_dirs[3][600];
static const char *g_dirp[3];

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(tu_rand(&seed) >> 56);
}

static struct mw_store *open_store(enum mw_aio_backend b, int ndirs, uint64_t cap, int prealloc)
{
    struct mw_store_config c;
    mw_store_config_default(&c);
    c.dirs = g_dirp;
    c.ndirs = ndirs;
    c.capacity = cap;
    c.stripe_size = 64 << 10;
    c.crc_block = 16 << 10;
    c.preallocate = prealloc;
    c.aio_config.backend = b;
    c.aio_config.block_size = 32 << 10;
    c.aio_config.queue_depth = 8;
    struct mw_store *st = NULL;
    int rc = mw_store_open(&st, &c);
    if (rc) fprintf(stderr, "open: %s\n", mw_error_msg());
    REQUIRE(rc == 0);
    return st;
}

static void *abuf(size_t n)
{
    void *p = NULL;
    REQUIRE(posix_memalign(&p, 4096, MW_ALIGN_UP(n, 4096)) == 0);
    return p;
}

static void test_roundtrip(enum mw_aio_backend b, int ndirs)
{
    struct mw_store *st = open_store(b, ndirs, 8 << 20, 1);
    static const uint64_t sizes[] = {1, 4096, 70001, 200000, 1 << 20};
    struct mw_store_obj *o[5];
    unsigned char *w[5], *r = abuf(1 << 20);
    char name[32];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "sg%d.exp_avg", i);
        REQUIRE(mw_store_obj_create(st, name, sizes[i], &o[i]) == 0);
        w[i] = abuf(sizes[i]);
        fill(w[i], sizes[i], (uint64_t)i + 1);
        CHECK_EQ_INT(mw_store_write(st, o[i], 0, sizes[i], w[i]), 0);
    }
    for (int i = 4; i >= 0; i--) {
        memset(r, 0, 1 << 20);
        CHECK_EQ_INT(mw_store_read(st, o[i], 0, sizes[i], r), 0);
        CHECK_MSG(!memcmp(w[i], r, sizes[i]), "object %d, %d dirs", i, ndirs);
    }
    /* A range in the middle spanning stripe units, and the tail range. */
    CHECK_EQ_INT(mw_store_read(st, o[4], 60 << 10, 200 << 10, r), 0);
    CHECK(!memcmp(w[4] + (60 << 10), r, 200 << 10));
    CHECK_EQ_INT(mw_store_read(st, o[3], 196608, 200000 - 196608, r), 0);
    CHECK(!memcmp(w[3] + 196608, r, 200000 - 196608));
    /* Objects really are striped: consecutive units in consecutive files. */
    int f0 = -1, f1 = -1;
    CHECK_EQ_INT(mw_store_locate(st, o[4], 0, &f0, NULL, NULL), 0);
    CHECK_EQ_INT(mw_store_locate(st, o[4], 64 << 10, &f1, NULL, NULL), 0);
    CHECK_EQ_INT(f1, (f0 + 1) % ndirs);
    /* Validation: misaligned offset, range past the end, partial crc block write. */
    CHECK_EQ_INT(mw_store_read(st, o[4], 100, 4096, r), -EINVAL);
    CHECK_EQ_INT(mw_store_read(st, o[2], 0, 80000, r), -EINVAL);
    CHECK_EQ_INT(mw_store_write(st, o[4], 4096, 4096, r), -EINVAL);
    CHECK(strstr(mw_error_msg(), "checksum block") != NULL);
    CHECK_EQ_INT(mw_store_obj_create(st, "sg0.exp_avg", 10, &o[0]), -EEXIST);
    CHECK(mw_store_obj_find(st, "sg3.exp_avg") == o[3]);
    CHECK(mw_store_obj_find(st, "nope") == NULL);
    struct mw_store_stats ss;
    mw_store_stats(st, &ss);
    CHECK_EQ_INT(ss.n_objects, 5);
    CHECK(ss.bytes_written >= 1 << 20);
    for (int i = 0; i < 5; i++) free(w[i]);
    free(r);
    mw_store_close(st);
}

struct done { pthread_mutex_t mu; int n, errors; };
static void on_done(struct mw_store_io *io, void *user)
{
    struct done *d = user;
    pthread_mutex_lock(&d->mu);
    d->n++;
    if (io->result) d->errors++;
    pthread_mutex_unlock(&d->mu);
}

static void test_async(enum mw_aio_backend b)
{
    enum { N = 24, SZ = 96 << 10 };
    struct mw_store *st = open_store(b, 2, 8 << 20, 1);
    struct mw_store_obj *o[N];
    struct mw_store_io io[N];
    unsigned char *w = abuf((size_t)N * SZ), *r = abuf((size_t)N * SZ);
    fill(w, (size_t)N * SZ, 42);
    memset(r, 0, (size_t)N * SZ);
    struct done d = {PTHREAD_MUTEX_INITIALIZER, 0, 0};
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "sg%d.master", i);
        REQUIRE(mw_store_obj_create(st, name, SZ, &o[i]) == 0);
        io[i] = (struct mw_store_io){.obj = o[i], .op = MW_AIO_WRITE, .len = SZ, .buf = w + (size_t)i * SZ,
                                     .cb = on_done, .user = &d};
        CHECK_EQ_INT(mw_store_submit(st, &io[i]), 0);
    }
    CHECK_EQ_INT(mw_aio_wait_all(mw_store_aio(st)), 0);
    CHECK_EQ_INT(d.n, N);
    for (int i = 0; i < N; i++) {
        io[i] = (struct mw_store_io){.obj = o[i], .op = MW_AIO_READ, .len = SZ, .buf = r + (size_t)i * SZ};
        CHECK_EQ_INT(mw_store_submit(st, &io[i]), 0);
    }
    for (int i = 0; i < N; i++) CHECK_EQ_INT(mw_store_wait(st, &io[i]), 0);
    CHECK(!memcmp(w, r, (size_t)N * SZ));
    CHECK_EQ_INT(d.errors, 0);
    free(w);
    free(r);
    mw_store_close(st);
}

static void test_checksum(enum mw_aio_backend b)
{
    struct mw_store *st = open_store(b, 2, 4 << 20, 1);
    struct mw_store_obj *o, *o2;
    REQUIRE(mw_store_obj_create(st, "sg17.exp_avg", 300000, &o) == 0);
    REQUIRE(mw_store_obj_create(st, "sg18.exp_avg", 300000, &o2) == 0);
    unsigned char *w = abuf(300000), *r = abuf(300000);
    fill(w, 300000, 17);
    REQUIRE(mw_store_write(st, o, 0, 300000, w) == 0);
    REQUIRE(mw_store_write(st, o2, 0, 300000, w) == 0);
    const char *path;
    uint64_t foff;
    REQUIRE(mw_store_locate(st, o, 200000, NULL, &path, &foff) == 0);
    tu_flip_byte(path, foff);
    int rc = mw_store_read(st, o, 0, 300000, r);
    CHECK_EQ_INT(rc, MW_ECHECKSUM);
    const char *m = mw_error_msg();
    char want[64];
    /* 200000 lies in the 16 KiB crc block starting at 196608. */
    uint64_t bfoff;
    REQUIRE(mw_store_locate(st, o, 196608, NULL, NULL, &bfoff) == 0);
    snprintf(want, sizeof want, "offset %llu)", (unsigned long long)bfoff);
    CHECK_MSG(strstr(m, "sg17.exp_avg") && strstr(m, path) && strstr(m, want) && strstr(m, "196608"), "%s", m);
    /* A read that skips the bad block and the neighbouring object are fine. */
    CHECK_EQ_INT(mw_store_read(st, o, 0, 196608, r), 0);
    CHECK_EQ_INT(mw_store_read(st, o2, 0, 300000, r), 0);
    CHECK(!memcmp(w, r, 300000));
    struct mw_store_stats ss;
    mw_store_stats(st, &ss);
    CHECK_EQ_INT(ss.checksum_failures, 1);
    mw_store_close(st);

    /* With checksums off the same corruption goes through unnoticed (what the crc is for). */
    struct mw_store_config c;
    mw_store_config_default(&c);
    c.dirs = g_dirp;
    c.ndirs = 1;
    c.capacity = 1 << 20;
    c.checksum = 0;
    c.aio_config.backend = b;
    REQUIRE(mw_store_open(&st, &c) == 0);
    REQUIRE(mw_store_obj_create(st, "x", 65536, &o) == 0);
    REQUIRE(mw_store_write(st, o, 0, 65536, w) == 0);
    REQUIRE(mw_store_locate(st, o, 5, NULL, &path, &foff) == 0);
    tu_flip_byte(path, foff);
    CHECK_EQ_INT(mw_store_read(st, o, 0, 65536, r), 0);
    CHECK(r[5] != w[5]);
    mw_store_close(st);
    free(w);
    free(r);
}

static void test_full(enum mw_aio_backend b)
{
    /* A full store: -ENOSPC naming the object; deleting frees extents for reuse. */
    struct mw_tier *nvme;
    REQUIRE(mw_tier_init(&nvme, MW_TIER_NVME, 0, NULL) == 0);
    struct mw_store_config c;
    mw_store_config_default(&c);
    c.dirs = g_dirp;
    c.ndirs = 1;
    c.capacity = 1 << 20;
    c.tier = nvme;
    c.aio_config.backend = b;
    struct mw_store *st;
    REQUIRE(mw_store_open(&st, &c) == 0);
    struct mw_store_obj *a, *bb, *cc;
    REQUIRE(mw_store_obj_create_ex(st, "a", 600 << 10, MW_KIND_MOMENTS, &a) == 0);
    struct mw_tier_stats ts;
    mw_tier_stats(nvme, &ts);
    CHECK_EQ_INT(ts.current, 600 << 10);
    CHECK_EQ_INT(ts.by_kind[MW_KIND_MOMENTS], 600 << 10);
    CHECK_EQ_INT(mw_store_obj_create(st, "big", 600 << 10, &bb), -ENOSPC);
    CHECK_MSG(strstr(mw_error_msg(), "'big'") && strstr(mw_error_msg(), "store full"), "%s", mw_error_msg());
    mw_tier_stats(nvme, &ts);
    CHECK_EQ_INT(ts.current, 600 << 10); /* the failed create gave its reservation back */
    REQUIRE(mw_store_obj_create(st, "b", 400 << 10, &bb) == 0);
    CHECK_EQ_INT(mw_store_obj_delete(st, a), 0);
    REQUIRE(mw_store_obj_create(st, "c", 600 << 10, &cc) == 0);
    uint64_t off;
    REQUIRE(mw_store_locate(st, cc, 0, NULL, NULL, &off) == 0);
    CHECK_EQ_INT(off, 0); /* reused the freed extent */
    mw_store_close(st);
    mw_tier_stats(nvme, &ts);
    CHECK_EQ_INT(ts.current, 0);
    mw_tier_free_tier(nvme);
}

/* Forked child under RLIMIT_FSIZE: reservation refused at open, and a write past the limit
 * (no preallocation) fails clearly while earlier objects stay readable. */
static void test_fs_full(enum mw_aio_backend b)
{
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {2 << 20, 2 << 20};
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(3);
        struct mw_store_config c;
        mw_store_config_default(&c);
        c.dirs = g_dirp;
        c.ndirs = 1;
        c.capacity = 64 << 20;
        c.aio_config.backend = b;
        struct mw_store *st;
        int rc = mw_store_open(&st, &c);
        if (rc != -EFBIG || !strstr(mw_error_msg(), "cannot reserve") || !strstr(mw_error_msg(), g_dirp[0])) {
            fprintf(stderr, "child: open rc %d: %s\n", rc, mw_error_msg());
            _exit(4);
        }
        c.preallocate = 0;
        if (mw_store_open(&st, &c)) _exit(5);
        struct mw_store_obj *a, *big;
        if (mw_store_obj_create(st, "early", 1 << 20, &a) || mw_store_obj_create(st, "sg3.master", 4 << 20, &big))
            _exit(6);
        unsigned char *w = abuf(4 << 20), *r = abuf(1 << 20);
        fill(w, 4 << 20, 9);
        if (mw_store_write(st, a, 0, 1 << 20, w)) _exit(7);
        rc = mw_store_write(st, big, 0, 4 << 20, w);
        const char *m = mw_error_msg();
        if (rc != -EFBIG || !strstr(m, "sg3.master") || !strstr(m, ".dat") || !strstr(m, "offset")) {
            fprintf(stderr, "child: write rc %d: %s\n", rc, m);
            _exit(8);
        }
        if (mw_store_read(st, a, 0, 1 << 20, r) || memcmp(w, r, 1 << 20)) _exit(9);
        mw_store_close(st);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "backend %s: child status 0x%x",
              mw_aio_backend_name(b), status);
}

struct worker { struct mw_store *st; int id; int failures; };

static void *worker_main(void *arg)
{
    struct worker *wk = arg;
    enum { SZ = 128 << 10 };
    unsigned char *w = NULL, *r = NULL; /* no REQUIRE here: testutil's counters are not thread-safe */
    if (posix_memalign((void **)&w, 4096, SZ) || posix_memalign((void **)&r, 4096, SZ)) {
        wk->failures++;
        free(w);
        return NULL;
    }
    for (int i = 0; i < 40; i++) {
        char name[48];
        snprintf(name, sizeof name, "t%d.obj%d", wk->id, i % 5);
        struct mw_store_obj *o = mw_store_obj_find(wk->st, name);
        if (!o && mw_store_obj_create(wk->st, name, SZ, &o)) { wk->failures++; continue; }
        fill(w, SZ, (uint64_t)(wk->id * 1000 + i));
        if (mw_store_write(wk->st, o, 0, SZ, w) || mw_store_read(wk->st, o, 0, SZ, r) || memcmp(w, r, SZ))
            wk->failures++;
        if (i % 7 == 6 && mw_store_obj_delete(wk->st, o)) wk->failures++;
    }
    free(w);
    free(r);
    return NULL;
}

static void test_two_threads(enum mw_aio_backend b)
{
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 4096) == 0);
    struct mw_store_config c;
    mw_store_config_default(&c);
    c.dirs = g_dirp;
    c.ndirs = 3;
    c.capacity = 8 << 20;
    c.stripe_size = 32 << 10;
    c.trace = tr;
    c.aio_config.backend = b;
    c.aio_config.block_size = 16 << 10;
    c.aio_config.queue_depth = 4;
    struct mw_store *st;
    REQUIRE(mw_store_open(&st, &c) == 0);
    struct worker wk[2] = {{st, 0, 0}, {st, 1, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, worker_main, &wk[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK_EQ_INT(wk[0].failures, 0);
    CHECK_EQ_INT(wk[1].failures, 0);
    mw_store_close(st);
    struct mw_trace_stats ts;
    mw_trace_stats(tr, &ts);
    CHECK(ts.recorded >= 2 * 40 * 2 * 8); /* >= 8 pieces per 128 KiB transfer */
    mw_trace_free(tr);
}

/* One run per directory: a second store on a directory in use is refused naming the holder's
 * pid; a crashed run's files are kept and listed, never reused or removed; a symlink planted
 * where a store file goes is refused, its target untouched. */
static struct mw_store *try_open(const char *dir, int *rc)
{
    struct mw_store_config c;
    mw_store_config_default(&c);
    const char *d[1] = {dir};
    c.dirs = d;
    c.ndirs = 1;
    c.capacity = 1 << 20;
    c.aio_config.backend = MW_AIO_THREADS;
    struct mw_store *st = NULL;
    *rc = mw_store_open(&st, &c);
    return st;
}

static int exists(const char *dir, const char *name)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return lstat(p, &st) == 0;
}

static void test_one_run_per_dir(void)
{
    int rc;
    struct mw_store *a = try_open(g_dirp[0], &rc), *b;
    REQUIRE(rc == 0);
    CHECK(exists(g_dirp[0], "memwall.lock"));
    b = try_open(g_dirp[0], &rc);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    CHECK_EQ_INT(rc, -EBUSY);
    CHECK(b == NULL);
    CHECK_MSG(strstr(mw_error_msg(), pid) && strstr(mw_error_msg(), g_dirp[0]) && strstr(mw_error_msg(), "in use"),
              "%s", mw_error_msg());
    /* The refused open touched nothing of the first store's. */
    struct mw_store_obj *o;
    unsigned char *w = abuf(65536), *r = abuf(65536);
    fill(w, 65536, 5);
    REQUIRE(mw_store_obj_create(a, "x", 65536, &o) == 0);
    CHECK_EQ_INT(mw_store_write(a, o, 0, 65536, w), 0);
    CHECK_EQ_INT(mw_store_read(a, o, 0, 65536, r), 0);
    CHECK(!memcmp(w, r, 65536));
    mw_store_close(a);
    CHECK(!exists(g_dirp[0], "memwall.lock") && !exists(g_dirp[0], "memwall.0.dat")); /* a finished run: gone */
    b = try_open(g_dirp[0], &rc);
    CHECK_EQ_INT(rc, 0);
    mw_store_close(b);

    /* A run killed with SIGKILL: its file stays (for its resume), the next open is refused
     * listing it, and the refused open neither removes nor truncates it. */
    fflush(NULL);
    pid_t c = fork();
    REQUIRE(c >= 0);
    if (c == 0) {
        struct mw_store *s = try_open(g_dirp[1], &rc);
        struct mw_store_obj *oo;
        if (rc || mw_store_obj_create(s, "x", 65536, &oo) || mw_store_write(s, oo, 0, 65536, w)) _exit(3);
        raise(SIGKILL);
        _exit(4);
    }
    int status;
    REQUIRE(waitpid(c, &status, 0) == c);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status 0x%x", status);
    CHECK(exists(g_dirp[1], "memwall.0.dat"));
    char dat[700];
    snprintf(dat, sizeof dat, "%s/memwall.0.dat", g_dirp[1]);
    struct stat st0, st1;
    REQUIRE(stat(dat, &st0) == 0);
    b = try_open(g_dirp[1], &rc);
    CHECK_EQ_INT(rc, -EEXIST);
    CHECK(b == NULL);
    CHECK_MSG(strstr(mw_error_msg(), "memwall.0.dat") && strstr(mw_error_msg(), "did not finish"), "%s", mw_error_msg());
    CHECK(stat(dat, &st1) == 0 && st1.st_size == st0.st_size && st1.st_ino == st0.st_ino);
    CHECK(!exists(g_dirp[1], "memwall.lock")); /* the refused open released its lock */
    unlink(dat);
    b = try_open(g_dirp[1], &rc); /* the dead run's stale lock file does not block */
    CHECK_MSG(rc == 0, "%s", mw_error_msg());
    mw_store_close(b);

    /* A symlink where the store file goes. */
    char target[700], link[700];
    snprintf(target, sizeof target, "%s/victim", g_dirp[1]);
    snprintf(link, sizeof link, "%s/memwall.0.dat", g_dirp[2]);
    FILE *f = fopen(target, "w");
    REQUIRE(f);
    fputs("victim", f);
    fclose(f);
    REQUIRE(mw_mkdir_p(g_dirp[2], 0700) == 0 && symlink(target, link) == 0);
    b = try_open(g_dirp[2], &rc);
    CHECK_EQ_INT(rc, -EEXIST);
    CHECK(b == NULL);
    CHECK_MSG(strstr(mw_error_msg(), "symbolic link"), "%s", mw_error_msg());
    CHECK(stat(target, &st1) == 0 && st1.st_size == 6);
    struct stat ls;
    CHECK(lstat(link, &ls) == 0 && S_ISLNK(ls.st_mode)); /* left as it was */
    unlink(link);
    unlink(target);
    free(w);
    free(r);
}

int main(int argc, char **argv)
{
    const char *base = tu_scratch_dir("store");
    for (int i = 0; i < 3; i++) {
        snprintf(g_dirs[i], sizeof g_dirs[i], "%s/ssd%d", base, i);
        g_dirp[i] = g_dirs[i];
    }
    const char *want = argc > 1 ? argv[1] : "all";
    const enum mw_aio_backend backends[] = {MW_AIO_URING, MW_AIO_THREADS};
    int ran = 0;
    for (int i = 0; i < 2; i++) {
        enum mw_aio_backend b = backends[i];
        if (strcmp(want, "all") && strcmp(want, mw_aio_backend_name(b))) continue;
        ran = 1;
        if (b == MW_AIO_URING) {
            struct mw_aio_config ac;
            mw_aio_config_default(&ac);
            ac.backend = b;
            struct mw_aio *probe = NULL;
            int rc = mw_aio_init(&probe, &ac);
            if (rc == -ENOSYS || rc == -EPERM) {
                if (strcmp(want, "all")) { tu_rm_rf(base); SKIP("io_uring unavailable: %s", mw_error_msg()); }
                printf("io_uring unavailable (%s): its half not run\n", mw_error_msg());
                continue;
            }
            REQUIRE(rc == 0);
            mw_aio_free(probe);
        }
        printf("backend %s\n", mw_aio_backend_name(b));
        test_roundtrip(b, 1);
        test_roundtrip(b, 3);
        test_async(b);
        test_checksum(b);
        test_full(b);
        test_fs_full(b);
        test_two_threads(b);
    }
    if (!ran) { fprintf(stderr, "unknown backend '%s': uring, threads\n", want); return 2; }
    if (strcmp(want, "uring")) test_one_run_per_dir();
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", base);
    TEST_END();
}
