/*
 * report.c — the public entry points: load (parse + analyse), free, defaults, the one-call text
 * summary `memwall train` prints at the end of a run, and the writers' output files (rp_out).
 */
#include "report/report_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void mw_report_opts_default(struct mw_report_opts *o)
{
    o->bins = 800;
    o->detail_step = -1;
    o->nvme_read_bw = o->nvme_write_bw = 0;
}

int mw_report_load(struct mw_report **out, const char *trace_path, const struct mw_report_opts *opts)
{
    *out = NULL;
    struct mw_report_opts o;
    mw_report_opts_default(&o);
    if (opts) o = *opts;
    if (o.bins < 1 || o.bins > 1000000)
        return mw_error_set(-EINVAL, "report: bins must be in [1, 1000000], got %d", o.bins);
    if (!(o.nvme_read_bw >= 0 && o.nvme_read_bw < INFINITY) || !(o.nvme_write_bw >= 0 && o.nvme_write_bw < INFINITY))
        return mw_error_set(-EINVAL, "report: NVMe bandwidths must be finite and >= 0 bytes/s (0 = from the trace), "
                            "got read %g, write %g", o.nvme_read_bw, o.nvme_write_bw);
    struct rp_trace t;
    int rc = rp_trace_load(&t, trace_path);
    if (rc) return rc;
    struct mw_report *r = calloc(1, sizeof *r);
    if (!r) { rp_trace_free(&t); return mw_error_set(-ENOMEM, "%s: out of memory", trace_path); }
    snprintf(r->path, sizeof r->path, "%s", trace_path);
    rc = rp_analyze(r, &t, &o);
    rp_trace_free(&t);
    if (rc) {
        mw_report_free(r);
        return mw_error_set(rc, "%s: out of memory analysing the trace", trace_path);
    }
    *out = r;
    return 0;
}

void mw_report_free(struct mw_report *r)
{
    if (!r) return;
    for (int i = 0; i < r->ntiers && r->tiers; i++) { free(r->tiers[i].by_kind); free(r->tiers[i].total); }
    for (int i = 0; i < r->npairs && r->pairs; i++) { free(r->pairs[i].bw); free(r->pairs[i].inflight); free(r->pairs[i].bw_busy); }
    free(r->tiers);
    free(r->pairs);
    free(r->steps);
    free(r->subgroups);
    free(r->bin_phase);
    free(r->detail_rects);
    free(r->detail_points);
    for (int op = 0; op < MW_REPORT_COMM_NOPS; op++) free(r->comm[op].inflight);
    free(r->comm_wait_bins);
    free(r->ranks);
    for (int i = 0; i < r->nunits && r->units; i++) free(r->units[i].cov);
    free(r->units);
    free(r);
}

int mw_report_text_summary(const char *trace_path, FILE *out)
{
    struct mw_report *r;
    int rc = mw_report_load(&r, trace_path, NULL);
    if (rc) return rc;
    rc = mw_report_write_text(r, out);
    mw_report_free(r);
    return rc;
}

/* ------------------------------------------------------------------ output files */

/* The stream's write function (fopencookie): all of buf, or 0 with the first errno kept. */
static ssize_t out_write(void *cookie, const char *buf, size_t n)
{
    struct rp_out *o = cookie;
    if (o->err) return 0;
    for (size_t done = 0; done < n;) {
        ssize_t k = write(o->fd, buf + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { o->err = k < 0 ? errno : EIO; return 0; } /* 0 for n > 0: no errno to give */
        done += (size_t)k;
    }
    return (ssize_t)n;
}

int rp_out_open(struct rp_out *o, const char *path, const char *what)
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
    cookie_io_functions_t io = {.write = out_write};
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

int rp_out_close(struct rp_out *o)
{
    if (!o->f) return mw_error_set(-EBADF, "%s: %s is not open", o->path, o->what);
    int flushed = fclose(o->f) == 0; /* flushes through out_write */
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
