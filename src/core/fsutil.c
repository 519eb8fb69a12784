/*
 * fsutil.c — mkdir -p, atomic file replacement and the directory lock (memwall/fsutil.h says
 * why there is exactly one of each).
 *
 * Durability of the atomic write: fsync(file) makes the bytes durable, rename makes the new
 * name point at them atomically, and fsync(directory) makes the rename durable — without the
 * last one a power cut after commit returned could bring back the old file (ext4 data=ordered
 * usually saves you, XFS does not promise it).
 *
 * The lock: flock() belongs to the open file description, so it is released when the process
 * dies, however it dies (kill -9 included): a crashed run never leaves a stale lock behind,
 * only a stale lock file, whose pid the next run ignores once it holds the lock itself.
 */
#include "memwall/fsutil.h"
#include "memwall/common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* "a" + "/" + "b" in fresh memory (NULL when out of memory). */
static char *path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb + 1);
    return p;
}

int mw_mkdir_p(const char *dir, unsigned mode)
{
    if (!dir || !*dir) return mw_error_set(-EINVAL, "cannot create a directory with an empty name");
    char *p = strdup(dir);
    if (!p) return mw_error_set(-ENOMEM, "out of memory creating %s", dir);
    int rc = 0;
    size_t n = strlen(p);
    /* Each prefix ending before a '/' (and the whole path); "a//b" and a trailing '/' are fine. */
    for (size_t i = 1; i <= n && !rc; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        if (p[i - 1] == '/') continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, (mode_t)mode) != 0) {
            int e = errno;
            struct stat st;
            if (e != EEXIST)
                rc = mw_error_set(-e, "cannot create directory %s: %s", p, strerror(e));
            else if (stat(p, &st) != 0)
                rc = mw_error_set(-errno, "cannot create directory %s: %s", p, strerror(errno));
            else if (!S_ISDIR(st.st_mode))
                rc = mw_error_set(-ENOTDIR, "cannot create directory %s: a file that is not a directory is there", p);
        }
        p[i] = c;
    }
    free(p);
    return rc;
}

/* ------------------------------------------------------------------ atomic write */

int mw_fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    if (!dir) return mw_error_set(-ENOMEM, "out of memory");
    if (!*dir) { free(dir); dir = strdup("/"); if (!dir) return mw_error_set(-ENOMEM, "out of memory"); }
    int rc = 0, fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) rc = mw_error_set(-errno, "cannot open directory %s to sync it: %s", dir, strerror(errno));
    else {
        /* Some file systems cannot sync a directory (EINVAL): nothing more can be done there. */
        if (fsync(fd) != 0 && errno != EINVAL)
            rc = mw_error_set(-errno, "cannot sync directory %s: %s", dir, strerror(errno));
        close(fd);
    }
    free(dir);
    return rc;
}

static void af_release(struct mw_atomic_file *af)
{
    free(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
    af->fd = -1;
}

int mw_atomic_open(struct mw_atomic_file *af, const char *path)
{
    static atomic_uint seq;
    memset(af, 0, sizeof *af);
    af->fd = -1;
    if (!path || !*path) return mw_error_set(-EINVAL, "cannot write a file with an empty name");
    size_t n = strlen(path) + 48;
    af->path = strdup(path);
    af->tmp = malloc(n);
    if (!af->path || !af->tmp) { af_release(af); return mw_error_set(-ENOMEM, "out of memory writing %s", path); }
    /* A fresh name each time: O_EXCL never opens a file someone else made (or a symlink). */
    for (int tries = 0; tries < 64; tries++) {
        snprintf(af->tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&seq, 1));
        af->fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (af->fd >= 0 || errno != EEXIST) break;
    }
    if (af->fd < 0) {
        int e = errno;
        int rc = mw_error_set(-e, "cannot create %s: %s", af->tmp, strerror(e));
        af_release(af);
        return rc;
    }
    af->f = fdopen(af->fd, "wb");
    if (!af->f) {
        int e = errno;
        close(af->fd);
        unlink(af->tmp);
        int rc = mw_error_set(-e, "cannot open a stream on %s: %s", af->tmp, strerror(e));
        af_release(af);
        return rc;
    }
    return 0;
}

void mw_atomic_abort(struct mw_atomic_file *af)
{
    if (af->f) fclose(af->f); /* closes fd too */
    else if (af->fd >= 0) close(af->fd);
    if (af->tmp) unlink(af->tmp);
    af_release(af);
}

int mw_atomic_commit(struct mw_atomic_file *af)
{
    int rc = 0;
    if (!af->f) return mw_error_set(-EBADF, "atomic write: the file is not open");
    char note[600];
    int e = 0;
    if (fflush(af->f) != 0 || ferror(af->f)) {
        e = errno ? errno : EIO;
        rc = mw_error_set(-e, "writing %s failed: %s%s", af->tmp, strerror(e), mw_fs_full_note(-e, af->tmp, note, sizeof note));
    } else if (fsync(af->fd) != 0) {
        e = errno;
        rc = mw_error_set(-e, "flushing %s to disk failed: %s%s", af->tmp, strerror(e),
                          mw_fs_full_note(-e, af->tmp, note, sizeof note));
    }
    e = fclose(af->f) != 0 ? errno : 0;
    af->f = NULL;
    af->fd = -1;
    if (!rc && e)
        rc = mw_error_set(-e, "closing %s failed: %s%s", af->tmp, strerror(e), mw_fs_full_note(-e, af->tmp, note, sizeof note));
    if (!rc && rename(af->tmp, af->path) != 0)
        rc = mw_error_set(-errno, "cannot rename %s to %s: %s", af->tmp, af->path, strerror(errno));
    if (rc) {
        unlink(af->tmp);
        af_release(af);
        return rc;
    }
    rc = mw_fsync_parent(af->path);
    af_release(af);
    return rc;
}

int mw_atomic_write_file(const char *path, const void *data, size_t n)
{
    struct mw_atomic_file af;
    int rc = mw_atomic_open(&af, path);
    if (rc) return rc;
    if (n && fwrite(data, 1, n, af.f) != n) {
        int e = errno ? errno : EIO;
        char note[600];
        rc = mw_error_set(-e, "writing %s failed: %s%s", af.tmp, strerror(e), mw_fs_full_note(-e, af.tmp, note, sizeof note));
        mw_atomic_abort(&af);
        return rc;
    }
    return mw_atomic_commit(&af);
}

const char *mw_fs_full_note(int err, const char *path, char *buf, size_t n)
{
    if (!n) return buf;
    buf[0] = 0;
    if ((err != -ENOSPC && err != -EDQUOT) || !path) return buf;
    const char *slash = strrchr(path, '/');
    char *dir = !slash ? strdup(".") : slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
    if (!dir) return buf;
    struct statvfs v;
    char b[32];
    if (err == -EDQUOT) snprintf(buf, n, " — the disk quota on %s is used up", dir);
    else if (statvfs(dir, &v) == 0)
        snprintf(buf, n, " — the disk holding %s is full (%s available there)", dir,
                 mw_fmt_bytes(b, sizeof b, (uint64_t)v.f_bavail * v.f_frsize));
    else snprintf(buf, n, " — the disk holding %s is full", dir);
    free(dir);
    return buf;
}

/* ------------------------------------------------------------------ directory lock */

struct mw_dir_lock {
    int fd;
    char *path;
};

static long read_pid(int fd)
{
    char buf[32];
    ssize_t k = pread(fd, buf, sizeof buf - 1, 0);
    if (k <= 0) return 0;
    buf[k] = 0;
    char *end;
    long pid = strtol(buf, &end, 10);
    return end != buf && pid > 0 ? pid : 0;
}

long mw_dir_lock_holder(const char *dir, const char *name)
{
    char *path = path_join(dir, name);
    if (!path) return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    free(path);
    if (fd < 0) return 0;
    long pid = read_pid(fd);
    close(fd);
    return pid;
}

int mw_dir_lock(struct mw_dir_lock **out, const char *dir, const char *name)
{
    *out = NULL;
    struct mw_dir_lock *l = calloc(1, sizeof *l);
    if (l) l->path = path_join(dir, name);
    if (!l || !l->path) { free(l); return mw_error_set(-ENOMEM, "out of memory"); }
    int rc = 0;
    /* The holder removes the file at unlock; a waiter that had opened the removed file gets the
     * lock on an unlinked inode and must try again on the new file (the inode check). */
    for (int tries = 0; tries < 100; tries++) {
        l->fd = open(l->path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (l->fd < 0) {
            int e = errno;
            rc = mw_error_set(-e, "cannot open the lock file %s: %s%s", l->path, strerror(e),
                              e == ELOOP ? " (it is a symbolic link: memwall refuses to follow it; remove it)" : "");
            goto err;
        }
        if (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            if (e == EWOULDBLOCK) {
                long pid = read_pid(l->fd);
                char who[64];
                if (pid == (long)getpid()) snprintf(who, sizeof who, "pid %ld, this process", pid);
                else if (pid) snprintf(who, sizeof who, "pid %ld", pid);
                else snprintf(who, sizeof who, "a process that has not written its pid yet");
                rc = mw_error_set(-EBUSY, "directory %s is in use by another run (%s holds %s): two runs on one "
                                  "directory would overwrite each other's files; wait for it to finish or give "
                                  "this run another directory", dir, who, l->path);
            } else {
                rc = mw_error_set(-e, "cannot lock %s: %s", l->path, strerror(e));
            }
            close(l->fd);
            goto err;
        }
        struct stat a, b;
        if (fstat(l->fd, &a) == 0 && lstat(l->path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            char pid[32];
            int k = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, pid, (size_t)k, 0) != k) {
                int e = errno ? errno : EIO;
                rc = mw_error_set(-e, "cannot write the pid into the lock file %s: %s", l->path, strerror(e));
                unlink(l->path);
                close(l->fd);
                goto err;
            }
            *out = l;
            return 0;
        }
        close(l->fd); /* we locked a file that its holder had just removed: retry */
    }
    rc = mw_error_set(-EBUSY, "cannot lock %s: it keeps being removed and created (another run starting and "
                      "stopping on the same directory?)", l->path);
err:
    free(l->path);
    free(l);
    return rc;
}

void mw_dir_unlock(struct mw_dir_lock *l)
{
    if (!l) return;
    unlink(l->path); /* while still holding the lock: see mw_dir_lock */
    close(l->fd);
    free(l->path);
    free(l);
}

/* ------------------------------------------------------------------ small input files */

int mw_read_small_file(const char *path, const char *what, size_t max, char **out, size_t *n_out)
{
    *out = NULL;
    if (n_out) *n_out = 0;
    /* O_NONBLOCK: a FIFO opens at once (no writer needed) and is refused below, never waited on. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return mw_error_set(-e, "cannot open the %s %s: %s", what, path, strerror(e));
    }
    struct stat st;
    int rc = 0;
    char *buf = NULL;
    if (fstat(fd, &st) != 0) { rc = mw_error_set(-errno, "cannot stat %s %s: %s", what, path, strerror(errno)); goto out; }
    if (!S_ISREG(st.st_mode)) {
        rc = mw_error_set(-EINVAL, "%s %s is not a regular file (%s)", what, path,
                          S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
        goto out;
    }
    if ((uint64_t)st.st_size > max) {
        rc = mw_error_set(MW_EFORMAT, "%s %s is %lld bytes, more than the %zu bytes such a file can be", what, path,
                          (long long)st.st_size, max);
        goto out;
    }
    size_t n = (size_t)st.st_size, got = 0;
    if (!(buf = malloc(n + 1))) { rc = mw_error_set(-ENOMEM, "out of memory reading %s", path); goto out; }
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) { rc = mw_error_set(-errno, "cannot read %s %s: %s", what, path, strerror(errno)); goto out; }
        if (k == 0) break; /* shrank meanwhile: what is there */
        got += (size_t)k;
    }
    buf[got] = 0;
    *out = buf;
    buf = NULL;
    if (n_out) *n_out = got;
out:
    free(buf);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------------ output files */

/* The stream's write function (fopencookie): all of buf, or 0 with the first errno kept. */
static ssize_t mw_out_write(void *cookie, const char *buf, size_t n)
{
    struct mw_out *o = cookie;
    if (o->err) return 0;
    for (size_t done = 0; done < n;) {
        ssize_t k = write(o->fd, buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { o->err = k < 0 ? errno : EIO; return 0; } /* 0 for n > 0: no errno to give */
        done += (size_t)k;
    }
    return (ssize_t)n;
}

int mw_out_open(struct mw_out *o, const char *path, const char *what)
{
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->path = path;
    o->what = what;
    struct stat st;
    int rc;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* Not a file to replace (a device, a FIFO, a directory): written in place, or refused. */
        o->fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (o->fd < 0) return mw_error_set(-errno, "%s: cannot write %s there: %s", path, what, strerror(errno));
    } else {
        if ((rc = mw_atomic_open(&o->af, path))) return rc; /* the message names the file */
        o->atomic = 1;
        o->fd = o->af.fd;
    }
    cookie_io_functions_t io = {.write = mw_out_write};
    o->f = fopencookie(o, "w", io);
    if (!o->f) {
        int e = errno ? errno : ENOMEM;
        if (o->atomic) mw_atomic_abort(&o->af);
        else close(o->fd);
        return mw_error_set(-e, "%s: cannot write %s: %s", path, what, strerror(e));
    }
    setvbuf(o->f, NULL, _IOFBF, 1 << 16);
    return 0;
}

int mw_out_close(struct mw_out *o)
{
    if (!o->f) return mw_error_set(-EBADF, "%s: %s is not open", o->path, o->what);
    int flushed = fclose(o->f) == 0; /* flushes through mw_out_write */
    o->f = NULL;
    int e = o->err ? o->err : flushed ? 0 : EIO;
    if (o->atomic) {
        if (e) mw_atomic_abort(&o->af); /* the temporary goes; path keeps what it held */
        else return mw_atomic_commit(&o->af); /* sync and rename: 0, or the error named */
    } else if (close(o->fd) != 0 && !e) {
        e = errno;
    }
    if (!e) return 0;
    char note[600];
    return mw_error_set(-e, "%s: writing %s failed: %s%s", o->path, o->what, strerror(e),
                        o->atomic ? mw_fs_full_note(-e, o->path, note, sizeof note) : "");
}
