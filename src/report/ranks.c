/*
 * ranks.c — several ranks of one data-parallel run (`mpirun -np N memwall train --trace
 * run/trace.%r.json` writes one trace per rank): the full report of rank 0 and a per-rank row
 * each (memory peaks, ZeRO-3 resident weights, comm, NVMe bytes, step time).
 *
 * Why one row per rank and not N full reports: ranks of a ZeRO run differ mostly in what they
 * hold (their shard) and how long they waited on each other; a table puts those side by side,
 * and loading the traces one at a time keeps memory at one trace whatever N is.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t tier_peak(const struct mw_report *r, const char *name)
{
    for (int i = 0; i < r->ntiers; i++)
        if (!strcmp(r->tiers[i].name, name)) return r->tiers[i].peak_bytes;
    return 0;
}

void rp_ranks_summary(const struct mw_report *r, int *ws, int *zs, int kinds[MW_REPORT_NKINDS], int *res)
{
    *ws = -1;
    *zs = -1;
    *res = 0;
    for (int j = 0; j < MW_REPORT_NKINDS; j++) kinds[j] = 0;
    for (int i = 0; i < r->nranks; i++) {
        const struct mw_report_rank *k = &r->ranks[i];
        if (k->world_size > 0) *ws = k->world_size;
        if (k->zero_stage >= 0) *zs = k->zero_stage;
        for (int j = 0; j < MW_REPORT_NKINDS; j++) kinds[j] |= k->peak_kind_bytes[j] > 0;
        *res |= k->has_resident;
    }
}

void mw_report_rank_row(const struct mw_report *r, int index, struct mw_report_rank *row)
{
    memset(row, 0, sizeof *row);
    snprintf(row->path, sizeof row->path, "%s", r->path);
    row->rank = r->rank >= 0 ? r->rank : index;
    row->world_size = r->world_size;
    row->zero_stage = r->zero_stage;
    row->peak_device_bytes = tier_peak(r, "device");
    row->peak_host_bytes = tier_peak(r, "host");
    row->peak_nvme_bytes = tier_peak(r, "nvme");
    memcpy(row->peak_kind_bytes, r->peak_kind_bytes, sizeof row->peak_kind_bytes);
    row->has_resident = r->has_resident;
    row->resident_peak_bytes = r->resident_peak_bytes;
    row->comm_sent_bytes = r->comm_sent_bytes;
    row->comm_wait_s = r->comm_wait_s;
    for (int p = 0; p < r->npairs; p++) {
        if (!strcmp(r->pairs[p].from, "nvme")) row->nvme_read_bytes += r->pairs[p].bytes;
        if (!strcmp(r->pairs[p].to, "nvme")) row->nvme_written_bytes += r->pairs[p].bytes;
    }
    row->nsteps = r->nsteps;
    row->step_median_s = r->nsteps ? r->step_wall_median_s : NAN;
}

static int cmp_rank(const void *x, const void *y)
{
    const struct mw_report_rank *a = x, *b = y;
    return a->rank < b->rank ? -1 : a->rank > b->rank ? 1 : 0;
}

/* The rows belong to one run: same world_size where given, no rank twice. */
static int check_rows(struct mw_report_rank *rows, int n)
{
    int ref = -1;
    for (int i = 0; i < n; i++) {
        if (rows[i].world_size < 0) continue;
        if (ref < 0) { ref = i; continue; }
        if (rows[i].world_size != rows[ref].world_size)
            return mw_error_set(MW_REPORT_EMISMATCH, "%s: world_size %d, but %s has world_size %d: the traces are "
                                "not of one run", rows[i].path, rows[i].world_size, rows[ref].path,
                                rows[ref].world_size);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (rows[i].rank == rows[j].rank)
                return mw_error_set(MW_REPORT_EMISMATCH, "%s: rank %d again (also %s): give each rank's trace once",
                                    rows[i].path, rows[i].rank, rows[j].path);
    for (int i = 0; i < n; i++)
        if (ref >= 0 && rows[i].rank >= rows[ref].world_size)
            return mw_error_set(MW_REPORT_EMISMATCH, "%s: rank %d is outside world_size %d", rows[i].path,
                                rows[i].rank, rows[ref].world_size);
    qsort(rows, (size_t)n, sizeof *rows, cmp_rank);
    return 0;
}

int mw_report_load_ranks(struct mw_report **out, const char *const *paths, int n, const struct mw_report_opts *opts)
{
    *out = NULL;
    if (n < 1) return mw_error_set(-EINVAL, "report: no trace given");
    struct mw_report_rank *rows = calloc((size_t)n, sizeof *rows);
    if (!rows) return mw_error_set(-ENOMEM, "report: out of memory for %d ranks", n);
    struct mw_report *keep = NULL; /* rank 0's report (metadata), else the first one's */
    int rc = 0;
    for (int i = 0; i < n; i++) {
        struct mw_report *r;
        if ((rc = mw_report_load(&r, paths[i], opts))) goto err;
        mw_report_rank_row(r, i, &rows[i]);
        if (!keep || (r->rank == 0 && keep->rank != 0)) {
            mw_report_free(keep);
            keep = r;
        } else mw_report_free(r);
    }
    if ((rc = check_rows(rows, n))) goto err;
    keep->ranks = rows;
    keep->nranks = n;
    *out = keep;
    return 0;
err:
    free(rows);
    mw_report_free(keep);
    return rc;
}

/* pattern with every "%r" replaced by r; NULL when out of memory. */
static char *expand(const char *pattern, int r)
{
    char num[16];
    int nl = snprintf(num, sizeof num, "%d", r);
    size_t len = strlen(pattern), cnt = 0;
    for (const char *p = pattern; (p = strstr(p, "%r")); p += 2) cnt++;
    char *s = malloc(len + cnt * (size_t)nl + 1), *w = s;
    if (!s) return NULL;
    for (const char *p = pattern; *p;) {
        if (p[0] == '%' && p[1] == 'r') { memcpy(w, num, (size_t)nl); w += nl; p += 2; }
        else *w++ = *p++;
    }
    *w = 0;
    return s;
}

void mw_report_paths_free(char **paths, int n)
{
    if (!paths) return;
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

int mw_report_expand_ranks(const char *pattern, int max_ranks, char ***paths)
{
    *paths = NULL;
    int n = 0, cap = 0;
    char **v = NULL;
    for (int r = 0; r < max_ranks; r++) {
        char *p = expand(pattern, r);
        if (!p) goto oom;
        struct stat st;
        if (stat(p, &st)) {
            if (r == 0) {
                int e = errno;
                mw_error_set(-e, "%s: no trace for rank 0 (%s: %s)", pattern, p, strerror(e));
                free(p);
                mw_report_paths_free(v, n);
                return -e;
            }
            free(p);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) { free(p); goto oom; }
            v = nv;
        }
        v[n++] = p;
    }
    *paths = v;
    return n;
oom:
    mw_report_paths_free(v, n);
    return mw_error_set(-ENOMEM, "%s: out of memory expanding %%r", pattern);
}
