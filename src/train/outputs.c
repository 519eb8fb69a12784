/*
 * outputs.c — a run's outputs checked before its first step (issue "No run lost"): the out-dir
 * locked for this run alone, temporaries of dead runs swept, every output a distinct writable
 * path that is not an input, and the space the final model and the checkpoints need free.
 *
 * Why before the first step: every one of these used to fail at the end (the final model write
 * on a full disk, a trace path in a directory that does not exist) or not at all (two runs
 * writing one out-dir, --trace and --log-json naming one file), after hours of training. The
 * lock is the NVMe directory's kind (flock, released however the process dies: fsutil.c) under
 * its own name, so an out-dir that is also the NVMe directory holds both.
 *
 * Temporaries: every atomic write (mw_atomic_open) is PATH.tmp.<pid>.<n>; a process that died
 * mid-write leaves one. Under the out-dir's lock no live run of ours writes there, so a temporary
 * whose pid is not alive is debris and goes.
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define OUT_LOCK_NAME "memwall-out.lock"

/* NAME.tmp.<pid>.<n> with a pid that is not alive (and not ours). */
static int dead_tmp(const char *name, const char *prefix)
{
    size_t pl = prefix ? strlen(prefix) : 0;
    if (prefix && strncmp(name, prefix, pl)) return 0;
    const char *t = strstr(name + pl, ".tmp.");
    if (!t) return 0;
    char *end;
    long pid = strtol(t + 5, &end, 10);
    if (end == t + 5 || *end != '.' || pid <= 0) return 0;
    const char *n = end + 1;
    if (!*n) return 0;
    for (; *n; n++)
        if (*n < '0' || *n > '9') return 0;
    if (pid == (long)getpid()) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int mw_train_sweep_tmp(const char *dir, const char *prefix, int *removed)
{
    DIR *d = opendir(dir);
    if (!d) return mw_error_set(-errno, "cannot read directory %s: %s", dir, strerror(errno));
    int n = 0;
    for (struct dirent *x; (x = readdir(d));) {
        if (!dead_tmp(x->d_name, prefix)) continue;
        char p[PATH_MAX];
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, x->d_name) < sizeof p && unlink(p) == 0) n++;
    }
    closedir(d);
    if (removed) *removed = n;
    return 0;
}

/* An absolute form of path that need not exist yet: its directory resolved, its name appended. */
int mw_train_abs_path(const char *path, char *out, size_t n)
{
    char buf[PATH_MAX];
    if (realpath(path, buf)) {
        if ((size_t)snprintf(out, n, "%s", buf) >= n) return mw_error_set(-ENAMETOOLONG, "path too long: %s", path);
        return 0;
    }
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    const char *base = slash ? slash + 1 : path;
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path == 0 ? 1 : slash - path), path);
    else snprintf(dir, sizeof dir, ".");
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return mw_error_set(-ENOENT, "%s: no such directory", path);
    if (!realpath(dir, buf)) {
        int e = errno;
        return mw_error_set(-e, "%s: the directory %s: %s", path, dir, strerror(e));
    }
    if ((size_t)snprintf(out, n, "%s%s%s", buf, strcmp(buf, "/") ? "/" : "", base) >= n)
        return mw_error_set(-ENAMETOOLONG, "path too long: %s", path);
    return 0;
}

/* A file output: its directory exists and is writable, and what is there now is a regular file. */
static int check_file_output(const char *opt, const char *path, char *abs_out)
{
    int err = mw_train_abs_path(path, abs_out, PATH_MAX);
    if (err) {
        char m[600];
        snprintf(m, sizeof m, "%s", mw_error_msg());
        return mw_error_set(err, "%s %s cannot be written: %s", opt, path, m);
    }
    struct stat st;
    if (stat(abs_out, &st) == 0 && !S_ISREG(st.st_mode))
        return mw_error_set(-EINVAL, "%s %s is not a regular file (a directory, a FIFO or a device)", opt, path);
    char dir[PATH_MAX];
    const char *slash = strrchr(abs_out, '/');
    snprintf(dir, sizeof dir, "%.*s", (int)(slash == abs_out ? 1 : slash - abs_out), abs_out);
    if (access(dir, W_OK | X_OK) != 0)
        return mw_error_set(-errno, "%s %s cannot be written: the directory %s: %s", opt, path, dir, strerror(errno));
    if (stat(abs_out, &st) == 0 && access(abs_out, W_OK) != 0)
        return mw_error_set(-errno, "%s %s cannot be written: %s", opt, path, strerror(errno));
    const char *base = slash + 1;
    return mw_train_sweep_tmp(dir, base, NULL);
}

static int same_file(const char *a, const char *b)
{
    if (!strcmp(a, b)) return 1;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

struct mw_train_outlock { struct mw_dir_lock *lock; };

int mw_train_outputs_check(const struct mw_train_outputs *o, struct mw_train_outlock **lock_out)
{
    *lock_out = NULL;
    char paths[4][PATH_MAX];  /* log, trace, model, data */
    const char *names[4] = {"the step log (log_path)", "the trace (trace_path)", "the final model",
                             "the data (data_path)"};
    int have[4] = {0, 0, 0, 0};
    int err;
    struct mw_train_outlock *lk = NULL;
    if (o->out_dir) {
        if ((err = mw_mkdir_p(o->out_dir, 0777))) return mw_error_prepend(err, "the out-dir (out_dir): ");
        if (!(lk = calloc(1, sizeof *lk))) return mw_error_set(-ENOMEM, "no memory");
        if ((err = mw_dir_lock(&lk->lock, o->out_dir, OUT_LOCK_NAME))) {
            free(lk);
            char m[600];
            snprintf(m, sizeof m, "%s", mw_error_msg());
            if (err == -EBUSY)
                return mw_error_set(err, "the out-dir (out_dir) %s is the out-dir of another run that is still "
                                    "going (%s); give each run its own out-dir", o->out_dir, m);
            return mw_error_set(err, "the out-dir (out_dir) %s: %s", o->out_dir, m);
        }
        int swept = 0;
        char model[PATH_MAX + 32];
        if ((err = mw_train_sweep_tmp(o->out_dir, NULL, &swept))) goto err;
        if (swept) mw_log(MW_LOG_INFO, "removed %d temporary file%s of runs that died in %s", swept, swept == 1 ? "" : "s", o->out_dir);
        if ((size_t)snprintf(model, sizeof model, "%s/model.safetensors", o->out_dir) >= PATH_MAX) {
            err = mw_error_set(-ENAMETOOLONG, "the out-dir (out_dir) %s is too long", o->out_dir);
            goto err;
        }
        if ((err = check_file_output("the final model in the out-dir (out_dir)", model, paths[2]))) goto err;
        have[2] = 1;
        /* Space: the final model, and two checkpoints at once (the new one is written beside the
         * last before it replaces it). Files already there are replaced: not counted as free. */
        struct statvfs vs;
        if (statvfs(o->out_dir, &vs) == 0) {
            uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize, need = o->model_bytes, c2 = 0;
            if (!mw_mul_u64(o->ckpt_bytes, 2, &c2) && !mw_add_u64(need, c2, &need) && need > avail) {
                char a[32], b[32], c[32], d[32];
                err = mw_error_set(-ENOSPC, "the out-dir (out_dir) %s has %s free; the run needs %s there (the final "
                                   "model %s%s%s): free space or choose another out-dir", o->out_dir,
                                   mw_fmt_bytes(a, sizeof a, avail),
                                   mw_fmt_bytes(b, sizeof b, need), mw_fmt_bytes(c, sizeof c, o->model_bytes),
                                   o->ckpt_bytes ? ", two checkpoints of " : "",
                                   o->ckpt_bytes ? mw_fmt_bytes(d, sizeof d, o->ckpt_bytes) : "");
                goto err;
            }
        }
    }
    if (o->log_path && (err = check_file_output("the step log (log_path)", o->log_path, paths[0]))) goto err;
    have[0] = o->log_path != NULL;
    if (o->trace_path && (err = check_file_output("the trace (trace_path)", o->trace_path, paths[1]))) goto err;
    have[1] = o->trace_path != NULL;
    if (o->data_path) {
        if ((err = mw_train_abs_path(o->data_path, paths[3], PATH_MAX))) goto err;
        have[3] = 1;
    }
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            if (have[i] && have[j] && same_file(paths[i], paths[j])) {
                err = mw_error_set(-EINVAL, "%s and %s are the same file, %s: give each output its own path", names[i],
                                   names[j], paths[i]);
                goto err;
            }
    *lock_out = lk;
    return 0;
err:
    mw_train_outputs_release(lk);
    return err;
}

void mw_train_outputs_release(struct mw_train_outlock *lk)
{
    if (!lk) return;
    if (lk->lock) mw_dir_unlock(lk->lock);
    free(lk);
}
