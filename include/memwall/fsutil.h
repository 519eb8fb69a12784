/*
 * memwall/fsutil.h — the file-system helpers every subsystem shares: one `mkdir -p`, one
 * atomic replacement of a file, one directory lock, one "disk full" note. (The one crc32c is
 * in memwall/common.h.)
 *
 * Why one of each: the project had four mkdir_p and three "write PATH.tmp, rename" helpers,
 * each with its own bugs (a fixed 1 KiB path buffer that truncated silently, no fsync of the
 * directory so a power cut could lose the rename, a temporary name that a second writer or a
 * planted symlink could take). These do it once, completely:
 *
 * mw_mkdir_p(dir, mode): creates every missing component with `mode` (existing ones are left
 *   as they are); fails with -ENOTDIR when a component exists and is not a directory. Any
 *   length (no fixed buffer). Message names the component that failed.
 *
 * Atomic write: the new content goes to a fresh temporary file in the same directory
 *   (PATH.tmp.<pid>.<n>, created with O_EXCL | O_NOFOLLOW, mode 0666 & ~umask), which commit
 *   flushes, fsyncs, renames over PATH and then fsyncs the directory so the rename itself is
 *   durable. Until commit returns 0, PATH is the old file (or absent); after a crash a
 *   PATH.tmp.* file may be left beside it, never a partial PATH. Abort removes the temporary.
 *     struct mw_atomic_file af;
 *     if ((rc = mw_atomic_open(&af, path))) return rc;
 *     fwrite(..., af.f) ...  (or write(af.fd, ...) — use one of the two, not both)
 *     return bad ? (mw_atomic_abort(&af), rc) : mw_atomic_commit(&af);
 *
 * Directory lock (mw_dir_lock): flock(LOCK_EX | LOCK_NB) on DIR/<name>, held for the life of
 *   the lock object, with the holder's pid written into the file so a refused second user can
 *   be told who holds it. The file is removed at unlock (taking care that a waiter which opened
 *   the old file retries on the new one).
 *
 * All return 0 or a negative errno with mw_error_set(...) describing the failure.
 */
#ifndef MEMWALL_FSUTIL_H
#define MEMWALL_FSUTIL_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

int mw_mkdir_p(const char *dir, unsigned mode);

struct mw_atomic_file {
    FILE *f;       /* write through this ... */
    int fd;        /* ... or this (the same file) */
    char *path;    /* final name (owned copy) */
    char *tmp;     /* temporary name in the same directory (owned) */
};
int mw_atomic_open(struct mw_atomic_file *af, const char *path);
/* Flush, fsync, rename over path, fsync the directory. Always releases af (on failure the
 * temporary is removed and path is untouched). */
int mw_atomic_commit(struct mw_atomic_file *af);
/* Close and remove the temporary; path is untouched. Safe on a zeroed or released af. */
void mw_atomic_abort(struct mw_atomic_file *af);
/* One buffer to a file, atomically. */
int mw_atomic_write_file(const char *path, const void *data, size_t n);
/* fsync the directory that holds path (so a rename or create in it is durable). */
int mw_fsync_parent(const char *path);

/* For a write to path that failed with err: when err is -ENOSPC (or -EDQUOT), the note
 * " — the disk holding DIR is full (N available there)" (" — the disk quota ... is used up")
 * with DIR the directory of path and N its free space now; else "". Returns buf. */
const char *mw_fs_full_note(int err, const char *path, char *buf, size_t n);

struct mw_dir_lock;
/* Locks DIR/name (name: a file name, e.g. "memwall.lock"). -EBUSY when another process (or
 * another lock object in this one) holds it; the message names the holder's pid. */
int mw_dir_lock(struct mw_dir_lock **out, const char *dir, const char *name);
/* The pid written in DIR/name, or 0 when the file is absent, empty or unreadable. */
long mw_dir_lock_holder(const char *dir, const char *name);
void mw_dir_unlock(struct mw_dir_lock *l);

/* A small input file (a config, a profile) read whole into *out (malloc'd, NUL-terminated; *n its
 * bytes): refused with a message naming `what` when it is not a regular file (a FIFO is never
 * waited on) or is over max bytes. */
int mw_read_small_file(const char *path, const char *what, size_t max, char **out, size_t *n);

/* An output file (the report's HTML and CSV, the trace). A regular file (or a new name) is written atomically:
 * into a temporary beside it that is renamed over it only once every byte is written and synced
 * (mw_atomic_open), so a failure leaves the old file (or none) and no temporary. Anything else
 * that already exists (/dev/stdout, a FIFO, /dev/null) is written in place. Writes go through
 * `f`, a stream that keeps the errno of the first failed write(2) (stdio's error flag loses it):
 * mw_out_close reports that (ENOSPC, EDQUOT, EIO ...), never a made-up one. */
struct mw_out {
    FILE *f;                  /* write here */
    const char *path;
    const char *what;         /* for messages: "the report", "a CSV file" */
    int fd, atomic, err;      /* err: errno of the first failed write, 0 */
    struct mw_atomic_file af; /* when atomic */
};
int mw_out_open(struct mw_out *o, const char *path, const char *what);
/* Flushes and commits (or, after a failed write, removes the temporary): 0 or -errno, message set. */
int mw_out_close(struct mw_out *o);

#ifdef __cplusplus
}
#endif
#endif
