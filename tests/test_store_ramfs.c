/*
 * test_store_ramfs.c — the store on a file system that refuses O_DIRECT: a real ramfs mount
 * (which refuses it on every kernel; tmpfs did before Linux 6.6). Such an open used to create
 * the file and then fail, and the buffered retry with O_EXCL met that empty file ("a run that
 * did not finish"). Here: the store opens there (buffered, stats.direct = 0), objects round-trip
 * on both engine backends, close leaves the directory empty, a second store on the same
 * directory opens, and a run's files kept for resume reopen. On the ordinary scratch directory
 * the store gets O_DIRECT exactly when the file system grants it (set after the open, by fcntl).
 * Needs root (mount); skipped (77) with the reason where mounting is refused.
 */
#include "memwall/store.h"
#include "memwall/fsutil.h"
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <sys/mount.h>
#include <sys/vfs.h>

#define RAMFS_MAGIC_ 0x858458f6

static char g_mnt[600];
static int g_mounted;

static void unmount_it(void)
{
    if (g_mounted && umount2(g_mnt, MNT_DETACH) != 0) fprintf(stderr, "warning: cannot unmount %s\n", g_mnt);
    g_mounted = 0;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static int open_store(struct mw_store **st, const char *dir, enum mw_aio_backend b, int keep, int reopen)
{
    struct mw_store_config c;
    mw_store_config_default(&c);
    const char *dirs[1] = {dir};
    c.dirs = dirs;
    c.ndirs = 1;
    c.capacity = 1 << 20;
    c.crc_block = 16 << 10;
    c.keep_files = keep;
    c.reopen = reopen;
    c.aio_config.backend = b;
    c.aio_config.queue_depth = 8;
    return mw_store_open(st, &c);
}

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(tu_rand(&seed) >> 56);
}

/* Two objects (one ending off a 4096 boundary) written and read back through the store. */
static void roundtrip(struct mw_store *st, const char *what, uint64_t seed)
{
    static const uint64_t sizes[2] = {40000, 100 << 10};
    unsigned char *w = NULL, *r = NULL;
    REQUIRE(posix_memalign((void **)&w, 4096, 104 << 10) == 0 && posix_memalign((void **)&r, 4096, 104 << 10) == 0);
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "obj%d", i);
        struct mw_store_obj *o = NULL;
        int rc = mw_store_obj_create(st, name, sizes[i], &o);
        CHECK_MSG(rc == 0, "%s: create %s: %s", what, name, mw_error_msg());
        if (rc) continue;
        fill(w, sizes[i], seed + (uint64_t)i);
        memset(r, 0, sizes[i]);
        rc = mw_store_write(st, o, 0, sizes[i], w);
        CHECK_MSG(rc == 0, "%s: write %s: %s", what, name, mw_error_msg());
        rc = mw_store_read(st, o, 0, sizes[i], r);
        CHECK_MSG(rc == 0, "%s: read %s: %s", what, name, mw_error_msg());
        CHECK_MSG(!memcmp(w, r, sizes[i]), "%s: %s read back differs", what, name);
    }
    free(w);
    free(r);
}

int main(void)
{
    const char *scratch = tu_scratch_dir("store_ramfs");
    snprintf(g_mnt, sizeof g_mnt, "%s/ramfs", scratch);
    REQUIRE(mkdir(g_mnt, 0700) == 0);
    if (mount("none", g_mnt, "ramfs", 0, "mode=0700") != 0) {
        int e = errno;
        tu_rm_rf(scratch);
        SKIP("cannot mount a ramfs (needs root / CAP_SYS_ADMIN): %s", strerror(e));
    }
    g_mounted = 1;
    atexit(unmount_it); /* REQUIRE exits: never leave the mount behind */
    struct statfs sf;
    REQUIRE(statfs(g_mnt, &sf) == 0 && sf.f_type == RAMFS_MAGIC_);
    /* The premise: this file system refuses O_DIRECT. */
    char probe[800];
    snprintf(probe, sizeof probe, "%s/probe", g_mnt);
    int fd = open(probe, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
    if (fd >= 0) { close(fd); unlink(probe); SKIP("this kernel's ramfs accepts O_DIRECT: nothing to test"); }
    CHECK_EQ_INT(errno, EINVAL);
    unlink(probe); /* the refused open created it: exactly the trap the store must not fall into */

    char dir[700];
    snprintf(dir, sizeof dir, "%s/nvme", g_mnt);
    for (int b = 0; b < 2; b++) {
        enum mw_aio_backend be = b ? MW_AIO_URING : MW_AIO_THREADS;
        const char *what = b ? "uring" : "threads";
        for (int pass = 0; pass < 2; pass++) { /* the second open on the same directory, too */
            struct mw_store *st = NULL;
            int rc = open_store(&st, dir, be, 0, 0);
            if (rc && b && (rc == -ENOSYS || rc == -EPERM || rc == -ENOTSUP)) {
                fprintf(stderr, "note: io_uring refused (%s): uring pass skipped\n", mw_error_msg());
                break;
            }
            CHECK_MSG(rc == 0, "%s pass %d: open on ramfs: %s", what, pass, mw_error_msg());
            if (rc) continue;
            struct mw_store_stats s;
            mw_store_stats(st, &s);
            CHECK_EQ_INT(s.direct, 0);
            roundtrip(st, what, 7 + (uint64_t)pass);
            mw_store_close(st);
            CHECK_MSG(count_entries(dir) == 0, "%s: %d file(s) left in %s after close", what, count_entries(dir), dir);
        }
    }

    /* Kept for a resume, then reopened: same bytes (the digest is how a resume trusts them). */
    struct mw_store *st = NULL;
    REQUIRE(open_store(&st, dir, MW_AIO_THREADS, 1, 0) == 0);
    struct mw_store_obj *o = NULL;
    unsigned char *w = NULL, *r = NULL;
    REQUIRE(posix_memalign((void **)&w, 4096, 64 << 10) == 0 && posix_memalign((void **)&r, 4096, 64 << 10) == 0);
    fill(w, 64 << 10, 99);
    REQUIRE(mw_store_obj_create(st, "kept", 64 << 10, &o) == 0);
    REQUIRE(mw_store_write(st, o, 0, 64 << 10, w) == 0);
    uint32_t digest = 0;
    REQUIRE(mw_store_obj_digest(st, o, &digest) == 0);
    uint64_t at = mw_store_obj_file_offset(o, 0);
    REQUIRE(mw_store_sync(st) == 0);
    mw_store_close(st);
    CHECK_EQ_INT(count_entries(dir), 1); /* memwall.0.dat, the lock file gone */
    int rc = open_store(&st, dir, MW_AIO_THREADS, 0, 0);
    CHECK_EQ_INT(rc, -EEXIST); /* a fresh run is still told about the kept files */
    CHECK_MSG(strstr(mw_error_msg(), "did not finish"), "message: %s", mw_error_msg());
    CHECK_EQ_INT(count_entries(dir), 1);
    rc = open_store(&st, dir, MW_AIO_THREADS, 0, 1);
    CHECK_MSG(rc == 0, "reopen on ramfs: %s", mw_error_msg());
    if (!rc) {
        REQUIRE(mw_store_obj_place(st, "kept", 64 << 10, MW_KIND_OTHER, &at, &o) == 0);
        REQUIRE(mw_store_read(st, o, 0, 64 << 10, r) == 0);
        CHECK(mw_store_obj_adopt(st, o, r, digest) == 0);
        CHECK(!memcmp(w, r, 64 << 10));
        mw_store_close(st);
    }
    CHECK_EQ_INT(count_entries(dir), 0);
    free(w);
    free(r);
    unmount_it();

    /* Elsewhere O_DIRECT is set after the open (fcntl) exactly when the file system grants it. */
    char plain[700];
    snprintf(plain, sizeof plain, "%s/plain", scratch);
    REQUIRE(mkdir(plain, 0700) == 0);
    snprintf(probe, sizeof probe, "%s/probe", plain);
    fd = open(probe, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
    int granted = fd >= 0;
    if (fd >= 0) close(fd);
    unlink(probe);
    REQUIRE(open_store(&st, plain, MW_AIO_THREADS, 0, 0) == 0);
    struct mw_store_stats s;
    mw_store_stats(st, &s);
    CHECK_EQ_INT(s.direct, granted);
    printf("O_DIRECT on %s: %s\n", plain, granted ? "granted, and the store uses it" : "refused there too");
    roundtrip(st, "plain", 3);
    mw_store_close(st);
    tu_rm_rf(scratch);
    TEST_END();
}
