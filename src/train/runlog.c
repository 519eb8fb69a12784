/*
 * runlog.c — the JSON step log (memwall train --log-json; the Python package can write the same
 * lines): one JSON object per line, the step first, flushed after every line so that a killed
 * run's log holds every step it finished.
 *
 * Why a resumed run rewrites it: the step in flight when a run stopped may have been logged (with
 * the update overlapped, step s is printed before it commits) and runs again after the resume.
 * The lines of steps after the resumed one are dropped (atomically: a temporary, fsync, rename),
 * so the log of a run that stopped any number of times has every step once, in order. A line
 * that does not start with {"step":N and end with a newline (cut short by a kill) goes too.
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The lines of steps up to `step` into fresh memory; *dropped counts the others. */
static int keep_lines(const char *path, int64_t step, char **keep, size_t *kn, int *dropped)
{
    *keep = NULL;
    *kn = 0;
    *dropped = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? 0 : mw_error_set(-errno, "cannot read %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    FILE *k = open_memstream(keep, kn);
    ssize_t len;
    while (k && (len = getline(&line, &cap, f)) > 0) {
        long long st;
        int used = 0;
        if (line[len - 1] == '\n' && sscanf(line, "{\"step\":%lld%n", &st, &used) == 1 && used > 8 &&
            (line[used] == ',' || line[used] == '}') && st >= 0 && st <= step)
            fwrite(line, 1, (size_t)len, k);
        else
            (*dropped)++;
    }
    free(line);
    int rerr = ferror(f);
    fclose(f);
    if (!k) return mw_error_set(-ENOMEM, "no memory for %s", path);
    fclose(k);
    if (rerr) {
        free(*keep);
        *keep = NULL;
        return mw_error_set(-EIO, "cannot read %s", path);
    }
    return 0;
}

int mw_train_log_open(struct mw_train_log *l, const char *path, int64_t resume_step, int *dropped)
{
    memset(l, 0, sizeof *l);
    if (dropped) *dropped = 0;
    if (resume_step >= 0) {
        char *keep;
        size_t kn;
        int d, err = keep_lines(path, resume_step, &keep, &kn, &d);
        if (!err && keep) err = mw_atomic_write_file(path, keep, kn);
        free(keep);
        if (err) return err;
        if (dropped) *dropped = d;
    }
    if (!(l->f = fopen(path, resume_step >= 0 ? "a" : "w"))) {
        int e = errno;
        return mw_error_set(-e, "cannot open %s: %s", path, strerror(e));
    }
    if (!(l->path = strdup(path))) {
        fclose(l->f);
        l->f = NULL;
        return mw_error_set(-ENOMEM, "no memory");
    }
    return 0;
}

static int flushed(struct mw_train_log *l)
{
    errno = 0;
    if (fflush(l->f) != 0 || ferror(l->f)) {
        int e = errno ? errno : EIO;
        return mw_error_set(-e, "writing %s failed: %s", l->path, strerror(e));
    }
    return 0;
}

int mw_train_log_val(struct mw_train_log *l, int64_t step, float val_loss)
{
    if (!l->f) return 0;
    fprintf(l->f, "{\"step\":%" PRId64 ",\"val_loss\":%.9g}\n", step, val_loss);
    return flushed(l);
}

int mw_train_log_step(struct mw_train_log *l, const struct mw_train_step_stats *st, const float *val_loss,
                      const struct mw_train_bytes *tb, int ranks, int zero)
{
    if (!l->f) return 0;
    double ms = (double)st->ns / 1e6, tps = (double)st->tokens / ((double)st->ns / 1e9);
    fprintf(l->f, "{\"step\":%" PRId64 ",\"loss\":%.9g,", st->step, st->loss);
    if (val_loss) fprintf(l->f, "\"val_loss\":%.9g,", *val_loss);
    fprintf(l->f, "\"lr\":%.9g,\"grad_norm\":%.9g,\"clipped\":%s,\"skipped\":%s,\"tokens\":%" PRIu64
                  ",\"tokens_per_s\":%.1f,\"ms\":%.3f,\"dram_bytes\":%" PRIu64 ",\"nvme_bytes\":%" PRIu64
                  ",\"nvme_read_bytes\":%" PRIu64 ",\"nvme_write_bytes\":%" PRIu64 ",\"io_wait_s\":%.6f"
                  ",\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"update_ms\":%.3f,\"ranks\":%d,\"zero\":%d"
                  ",\"comm_sent_bytes\":%" PRIu64 ",\"comm_sent_mean_bytes\":%" PRIu64 ",\"comm_wait_s\":%.6f}\n",
            st->lr, st->grad_norm, st->clipped ? "true" : "false", st->skipped ? "true" : "false", st->tokens, tps, ms,
            tb->params + tb->grads + tb->opt_dram + tb->acts, tb->opt_nvme, st->nvme_read_bytes, st->nvme_write_bytes,
            st->io_wait_s, (double)st->forward_ns / 1e6, (double)st->backward_ns / 1e6, (double)st->update_ns / 1e6,
            ranks, zero, st->comm_sent_bytes, st->comm_sent_mean_bytes, st->comm_wait_s);
    return flushed(l);
}

int mw_train_log_close(struct mw_train_log *l)
{
    if (!l->f) return 0;
    FILE *f = l->f;
    l->f = NULL;
    errno = 0;
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno ? errno : EIO;
    if (!bad && fsync(fileno(f)) != 0 && errno != EINVAL) { bad = 1; e = errno; }
    if (fclose(f) != 0 && !bad) { bad = 1; e = errno ? errno : EIO; }
    int rc = bad ? mw_error_set(-e, "writing %s failed: %s", l->path, strerror(e)) : 0;
    free(l->path);
    l->path = NULL;
    return rc;
}
