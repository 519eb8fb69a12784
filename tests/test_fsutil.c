/*
 * test_fsutil.c — the shared file helpers (memwall/fsutil.h): mkdir_p on deep, odd and
 * conflicting paths; the atomic write (old content until commit, nothing left after abort or
 * a failed write, a symlink or an existing temporary never followed or reused); the directory
 * lock (a second holder refused with the first's pid, in this process and from a child; the
 * lock released when its holder is killed, and the lock file gone after unlock).
 */
#include "testutil.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

static char *readall(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(1 << 16);
    *n = b ? fread(b, 1, (1 << 16) - 1, f) : 0;
    if (b) b[*n] = 0;
    fclose(f);
    return b;
}

/* Number of directory entries whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int k = 0;
    for (struct dirent *e; (e = readdir(d));) k += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return k;
}

static void test_mkdir(const char *base)
{
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/a/b//c/", base);
    CHECK_EQ_INT(mw_mkdir_p(p, 0700), 0);
    snprintf(q, sizeof q, "%s/a/b/c", base);
    struct stat st;
    CHECK(stat(q, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT(st.st_mode & 0777, 0700); /* a umask only removes bits, and none of 0700 in practice */
    CHECK_EQ_INT(mw_mkdir_p(q, 0700), 0);      /* exists: fine */
    /* A component that is a file. */
    snprintf(q, sizeof q, "%s/file", base);
    FILE *f = fopen(q, "w");
    REQUIRE(f);
    fclose(f);
    snprintf(p, sizeof p, "%s/file/sub", base);
    int rc = mw_mkdir_p(p, 0700);
    CHECK_MSG(rc == -ENOTDIR, "rc %d: %s", rc, mw_error_msg());
    CHECK_EQ_INT(mw_mkdir_p(q, 0700), -ENOTDIR);
    CHECK_MSG(strstr(mw_error_msg(), q) != NULL, "%s", mw_error_msg());
    CHECK_EQ_INT(mw_mkdir_p("", 0700), -EINVAL);
    /* Longer than the 1 KiB buffer an old helper had: created whole. Longer than PATH_MAX:
     * refused by the kernel and said so, never created truncated. */
    char *deep = malloc(6000);
    REQUIRE(deep);
    int n = snprintf(deep, 6000, "%s/deep", base);
    while (n < 2000) n += snprintf(deep + n, 6000 - (size_t)n, "/%s", "component_of_forty_characters_xxxxxxxxxx");
    rc = mw_mkdir_p(deep, 0755);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, mw_error_msg());
    CHECK(stat(deep, &st) == 0 && S_ISDIR(st.st_mode));
    while (n < 5000) n += snprintf(deep + n, 6000 - (size_t)n, "/%s", "component_of_forty_characters_xxxxxxxxxx");
    rc = mw_mkdir_p(deep, 0755);
    CHECK_MSG(rc == -ENAMETOOLONG, "rc %d: %s", rc, mw_error_msg());
    free(deep);
}

static void test_atomic(const char *base)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/out.bin", base);
    size_t n;
    CHECK_EQ_INT(mw_atomic_write_file(path, "first", 5), 0);
    char *b = readall(path, &n);
    CHECK(b && n == 5 && !memcmp(b, "first", 5));
    free(b);

    /* Until commit the old content stays; abort leaves it and removes the temporary. */
    struct mw_atomic_file af;
    REQUIRE(mw_atomic_open(&af, path) == 0);
    CHECK(strncmp(af.tmp, path, strlen(path)) == 0 && strstr(af.tmp, ".tmp."));
    fputs("second", af.f);
    fflush(af.f);
    b = readall(path, &n);
    CHECK(b && n == 5 && !memcmp(b, "first", 5));
    free(b);
    mw_atomic_abort(&af);
    CHECK_EQ_INT(count_prefixed(base, "out.bin.tmp"), 0);
    b = readall(path, &n);
    CHECK(b && n == 5 && !memcmp(b, "first", 5));
    free(b);

    REQUIRE(mw_atomic_open(&af, path) == 0);
    fputs("second", af.f);
    CHECK_EQ_INT(mw_atomic_commit(&af), 0);
    b = readall(path, &n);
    CHECK(b && n == 6 && !memcmp(b, "second", 6));
    free(b);
    CHECK_EQ_INT(count_prefixed(base, "out.bin.tmp"), 0);
    CHECK(af.f == NULL && af.tmp == NULL); /* released */

    /* A symlink planted at every temporary name this process would try next is never followed. */
    char target[1024], link[1100];
    snprintf(target, sizeof target, "%s/victim", base);
    FILE *v = fopen(target, "w");
    REQUIRE(v);
    fputs("victim", v);
    fclose(v);
    REQUIRE(mw_atomic_open(&af, path) == 0);
    /* Learn the name pattern from this temporary (PATH.tmp.PID.N), plant links for N+1..N+8. */
    unsigned seq = (unsigned)strtoul(strrchr(af.tmp, '.') + 1, NULL, 10);
    mw_atomic_abort(&af);
    for (unsigned k = 1; k <= 8; k++) {
        snprintf(link, sizeof link, "%s.tmp.%ld.%u", path, (long)getpid(), seq + k);
        REQUIRE(symlink(target, link) == 0);
    }
    CHECK_EQ_INT(mw_atomic_write_file(path, "third", 5), 0);
    b = readall(target, &n);
    CHECK_MSG(b && n == 6 && !memcmp(b, "victim", 6), "the symlink's target was written: %s", b ? b : "?");
    free(b);
    b = readall(path, &n);
    CHECK(b && n == 5 && !memcmp(b, "third", 5));
    free(b);
    for (unsigned k = 1; k <= 8; k++) {
        snprintf(link, sizeof link, "%s.tmp.%ld.%u", path, (long)getpid(), seq + k);
        struct stat st;
        CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode)); /* left alone, not replaced */
        unlink(link);
    }

    /* A directory that cannot be written: the error names the temporary, path untouched. */
    char ro[1024], rop[1100];
    snprintf(ro, sizeof ro, "%s/ro", base);
    REQUIRE(mkdir(ro, 0500) == 0);
    snprintf(rop, sizeof rop, "%s/x", ro);
    if (geteuid() != 0) { /* root writes anyway */
        int rc = mw_atomic_write_file(rop, "x", 1);
        CHECK_MSG(rc == -EACCES && strstr(mw_error_msg(), rop), "rc %d: %s", rc, mw_error_msg());
    }
    /* Into a missing directory: -ENOENT. */
    snprintf(rop, sizeof rop, "%s/missing/x", base);
    CHECK_EQ_INT(mw_atomic_write_file(rop, "x", 1), -ENOENT);
    CHECK_EQ_INT(mw_fsync_parent(path), 0);
}

static void test_lock(const char *base)
{
    char dir[1024], lockp[1100];
    snprintf(dir, sizeof dir, "%s/locked", base);
    REQUIRE(mw_mkdir_p(dir, 0700) == 0);
    snprintf(lockp, sizeof lockp, "%s/test.lock", dir);
    struct mw_dir_lock *a = NULL, *b = NULL;
    REQUIRE(mw_dir_lock(&a, dir, "test.lock") == 0);
    CHECK_EQ_INT(mw_dir_lock_holder(dir, "test.lock"), getpid());
    /* A second lock in this process: refused, naming this pid. */
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
    int rc = mw_dir_lock(&b, dir, "test.lock");
    CHECK_EQ_INT(rc, -EBUSY);
    CHECK(b == NULL);
    CHECK_MSG(strstr(mw_error_msg(), pid) && strstr(mw_error_msg(), dir), "%s", mw_error_msg());

    /* From another process: refused too (flock is per open file, inherited by nobody here). */
    fflush(NULL);
    pid_t c = fork();
    REQUIRE(c >= 0);
    if (c == 0) {
        struct mw_dir_lock *l;
        int r = mw_dir_lock(&l, dir, "test.lock");
        _exit(r == -EBUSY && strstr(mw_error_msg(), pid) ? 0 : 1);
    }
    int status;
    REQUIRE(waitpid(c, &status, 0) == c);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);

    mw_dir_unlock(a);
    struct stat st;
    CHECK(lstat(lockp, &st) != 0); /* removed at unlock */
    REQUIRE(mw_dir_lock(&b, dir, "test.lock") == 0);
    mw_dir_unlock(b);

    /* A holder killed with SIGKILL: the lock goes with it (its stale pid file stays and is taken over). */
    int pfd[2];
    REQUIRE(pipe(pfd) == 0);
    fflush(NULL);
    c = fork();
    REQUIRE(c >= 0);
    if (c == 0) {
        struct mw_dir_lock *l;
        char ok = mw_dir_lock(&l, dir, "test.lock") == 0 ? 'y' : 'n';
        if (write(pfd[1], &ok, 1) != 1) _exit(2);
        pause();
        _exit(0);
    }
    char ok = 0;
    REQUIRE(read(pfd[0], &ok, 1) == 1);
    CHECK(ok == 'y');
    CHECK_EQ_INT(mw_dir_lock_holder(dir, "test.lock"), c);
    CHECK_EQ_INT(mw_dir_lock(&b, dir, "test.lock"), -EBUSY);
    kill(c, SIGKILL);
    REQUIRE(waitpid(c, &status, 0) == c);
    close(pfd[0]);
    close(pfd[1]);
    CHECK(lstat(lockp, &st) == 0); /* the stale file is still there ... */
    rc = mw_dir_lock(&b, dir, "test.lock");
    CHECK_MSG(rc == 0, "after the holder died: %s", mw_error_msg()); /* ... and does not block */
    CHECK_EQ_INT(mw_dir_lock_holder(dir, "test.lock"), getpid());
    if (!rc) mw_dir_unlock(b);

    /* A symlink where the lock file goes: refused, never followed. */
    char target[1100];
    snprintf(target, sizeof target, "%s/elsewhere", base);
    REQUIRE(symlink(target, lockp) == 0);
    rc = mw_dir_lock(&b, dir, "test.lock");
    CHECK_MSG(rc == -ELOOP && strstr(mw_error_msg(), "symbolic link"), "rc %d: %s", rc, mw_error_msg());
    CHECK(lstat(target, &st) != 0); /* nothing created through it */
    unlink(lockp);
}

int main(void)
{
    const char *base = tu_scratch_dir("fsutil");
    test_mkdir(base);
    test_atomic(base);
    test_lock(base);
    tu_rm_rf(base);
    TEST_END();
}
