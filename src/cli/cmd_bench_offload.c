/*
 * cmd_bench_offload.c — `memwall bench offload`: the update phase of the offload engine with
 * the optimizer state in DRAM or on NVMe, against the bare optimizer kernel on the same bytes
 * in the same run; `--calibrate FILE` also measures what the cost model needs (CPU and
 * single-worker "device" update rates, host copy bandwidth) and writes the profile.
 *
 * Why the bare kernel in the same run: the machine is shared, so figures from different runs
 * are not comparable; the ratio update_s / kernel_s is what says what the pipeline costs.
 *
 * `--policies auto,all-cpu,...` is the same reasoning for placements: one engine per policy (its
 * own state, NVMe subdirectory and emulated device; the same parameters and gradients), their
 * steps interleaved, a round running each once in a shuffled order (side_order), so every policy
 * sees the same load of the other tenants. Separate processes did not: on the 2-core shared VM the
 * same fixed policy took 8.8 ms in one process and 17.8 ms in the next, which hides any 3 % question.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/offload.h"
#include "memwall/optim.h"
#include "memwall/trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, MW_ALIGN_UP(bytes, (size_t)(2u << 20)))) return NULL;
    return p;
}

static void fill(float *a, uint64_t n, float scale, uint64_t seed)
{
    #pragma omp parallel for schedule(static)
    for (uint64_t i = 0; i < n; i++) {
        uint64_t s = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        s ^= s >> 29;
        a[i] = ((float)(s % 2001) - 1000.0f) * scale;
    }
}

/* The bare AdamW kernel on its own arrays (page-aligned, like the engine's DRAM state): the
 * reference the update phase is compared with. Gradients are shared with the engine (read only). */
struct bare {
    uint64_t n;
    struct mw_optim_format f;
    struct mw_optim_slice s;
    struct mw_optim_exec ex;
    struct mw_adamw_hp hp;
    void *mem[5];
};

static void *palloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, MW_ALIGN_UP(bytes ? bytes : 1, (size_t)4096))) return NULL;
    memset(p, 0, bytes);
    return p;
}

static void bare_free(struct bare *b)
{
    for (int i = 0; i < 5; i++) free(b->mem[i]);
    memset(b, 0, sizeof *b);
}

static int bare_init(struct bare *b, uint64_t n, enum mw_optim_dtype md, int threads, const float *w, const float *g)
{
    memset(b, 0, sizeof *b);
    b->n = n;
    size_t ab = mw_optim_array_bytes(md, n), sb = mw_optim_scale_bytes(md, n);
    b->mem[0] = palloc(4 * n);
    b->mem[1] = palloc(ab);
    b->mem[2] = palloc(ab);
    b->mem[3] = sb ? palloc(sb) : NULL;
    b->mem[4] = sb ? palloc(sb) : NULL;
    if (!b->mem[0] || !b->mem[1] || !b->mem[2] || (sb && (!b->mem[3] || !b->mem[4]))) {
        bare_free(b);
        return mw_error_set(-ENOMEM, "bench: out of memory for the bare kernel's %llu parameters", (unsigned long long)n);
    }
    memcpy(b->mem[0], w, 4 * n);
    b->f = (struct mw_optim_format){MW_OPTIM_F32, md, MW_OPTIM_NONE};
    b->s = (struct mw_optim_slice){.n = n, .master = b->mem[0], .grad = g, .m = b->mem[1], .v = b->mem[2],
                                   .m_scale = b->mem[3], .v_scale = b->mem[4]};
    b->ex = (struct mw_optim_exec){threads, MW_SIMD_AUTO, 0};
    b->hp = mw_adamw_hp_default();
    return 0;
}

/* One step; 0 and its seconds in *secs, or the kernel's error (message set). */
static int bare_step(struct bare *b, double *secs)
{
    b->hp.step++;
    uint64_t t0 = mw_now_ns();
    int rc = mw_adamw_step(&b->f, &b->hp, &b->s, &b->ex);
    *secs = (double)(mw_now_ns() - t0) * 1e-9;
    return rc;
}

/* Host copy bandwidth (the emulated link): bytes/s of memcpy over 64 MiB. */
static double copy_bw(void)
{
    size_t n = 64u << 20;
    char *a = xalloc(n), *b = xalloc(n);
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < 3; r++) {
        uint64_t t0 = mw_now_ns();
        memcpy(b, a, n);
        double s = (double)(mw_now_ns() - t0) * 1e-9;
        if (s > 0 && n / s > best) best = (double)n / s;
    }
    free(a); free(b);
    return best;
}

/* The private default --nvme-dir (empty when not made); bench_offload removes it at the end
 * whichever way the run ends (the store has removed its files by then). */
static char g_tmpdir[4096];

/* --calibrate: the profile the cost model reads (memwall/offload.h), from this run's figures. 0 or 1. */
static int write_profile(const char *path, uint64_t n, enum mw_optim_dtype md, double kernel_s, int nvme, double rd_bw,
                         double wr_bw)
{
    int rc;
    struct mw_offload_profile p;
    mw_offload_profile_default(&p);
    uint64_t cn = MW_MIN(n, (uint64_t)(16u << 20));
    if (kernel_s > 0) p.cpu_params_per_s = (double)n / kernel_s;
    float *cw = palloc(4 * cn), *cg = palloc(4 * cn);
    struct bare one;
    if (cw && cg && !bare_init(&one, cn, md, 1, cw, cg)) { /* the emulated device: one worker thread */
        double t1[3];
        rc = bare_step(&one, &t1[0]);
        for (int i = 0; i < 3 && !rc; i++) rc = bare_step(&one, &t1[i]);
        bare_free(&one);
        if (rc) { mw_cli_fail("calibrating the emulated device", rc); free(cw); free(cg); return 1; }
        double m1 = median(t1, 3);
        if (m1 > 0) p.dev_params_per_s = (double)cn / m1;
    }
    free(cw);
    free(cg);
    p.link_bytes_per_s = copy_bw();
    p.dev_latency_s = 20e-6;
    if (nvme) {
        p.nvme_read_bytes_per_s = rd_bw;
        p.nvme_write_bytes_per_s = wr_bw;
    }
    if ((rc = mw_offload_profile_save(path, &p))) { mw_cli_fail("calibrate", rc); return 1; }
    return 0;
}

struct result {
    uint64_t n;
    const char *tier, *moments;
    const struct mw_offload_plan *plan;
    int buffers, threads, K;
    double update_s, kernel_s, pipe_kernel_s, io_wait_s;
    const struct mw_offload_stats *st;
    double rd_bw, wr_bw, rw_bw, init_s;
    int device;
    const char *calibrate, *plantxt;
    struct mw_offload_cost cost;      /* the cost model after the run */
    double upd_pred_s, upd_meas_s;    /* the last step's updates (cpu, h2d, device, d2h): predicted, measured */
};

/* The figures: one JSON object, or text. */
static void print_result(const struct result *x, int json)
{
    if (json) {
        printf("{\"params\": %llu, \"tier\": \"%s\", \"moments\": \"%s\", \"subgroup_size\": %llu, \"subgroups\": %u, "
               "\"buffer_count\": %d, \"threads\": %d, \"steps\": %d, \"update_s\": %.6f, \"kernel_s\": %.6f, "
               "\"pipeline_kernel_s\": %.6f, \"io_wait_s\": %.6f, \"nvme_read_bytes\": %llu, \"nvme_write_bytes\": %llu, "
               "\"nvme_read_bytes_per_s\": %.0f, \"nvme_write_bytes_per_s\": %.0f, \"nvme_bytes_per_s\": %.0f, "
               "\"update_over_kernel\": %.4f, \"cpu_updates\": %llu, \"dev_updates\": %llu, \"init_s\": %.3f, "
               "\"plan_device_subgroups\": %u, \"plan_predicted_s\": %.6f, \"best_fixed_predicted_s\": %.6f, "
               "\"plan_switches\": %u, \"update_predicted_s\": %.6f, \"update_measured_s\": %.6f}\n",
               (unsigned long long)x->n, x->tier, x->moments, (unsigned long long)x->plan->subgroup_size, x->plan->n_subgroups,
               x->buffers, x->threads, x->K, x->update_s, x->kernel_s, x->pipe_kernel_s, x->io_wait_s,
               (unsigned long long)x->st->nvme_read_bytes, (unsigned long long)x->st->nvme_write_bytes, x->rd_bw, x->wr_bw, x->rw_bw,
               x->kernel_s > 0 ? x->update_s / x->kernel_s : 0, (unsigned long long)x->st->cpu_updates,
               (unsigned long long)x->st->dev_updates, x->init_s, x->cost.plan_device_subgroups, x->cost.plan_predicted_s,
               x->cost.best_fixed_predicted_s, x->cost.plan_switches, x->upd_pred_s, x->upd_meas_s);
    } else {
        char b1[32], b2[32], b3[32], b4[32], b5[32];
        printf("offload update phase: %llu parameters, state on %s (moments %s), %u subgroups of %llu, %d buffers\n",
               (unsigned long long)x->n, x->tier, x->moments, x->plan->n_subgroups, (unsigned long long)x->plan->subgroup_size,
               x->buffers);
        printf("plan:\n%s", x->plantxt);
        printf("update phase     %.3f s (median of %d steps)\n", x->update_s, x->K);
        printf("  kernel inside  %.3f s, CPU waiting for I/O %.3f s\n", x->pipe_kernel_s, x->io_wait_s);
        if (x->st->nvme_read_bytes || x->st->nvme_write_bytes)
            printf("  NVMe           read %s, written %s per step; %s read, %s write, %s together\n",
                   mw_fmt_bytes(b1, sizeof b1, x->st->nvme_read_bytes), mw_fmt_bytes(b2, sizeof b2, x->st->nvme_write_bytes),
                   mw_fmt_rate(b3, sizeof b3, x->rd_bw), mw_fmt_rate(b4, sizeof b4, x->wr_bw), mw_fmt_rate(b5, sizeof b5, x->rw_bw));
        if (x->device) printf("  updates        %llu on the CPU, %llu on the accelerator\n",
                           (unsigned long long)x->st->cpu_updates, (unsigned long long)x->st->dev_updates);
        if (x->upd_meas_s > 0)
            printf("  cost model     last step's updates predicted %.3f ms, measured %.3f ms (%+.1f %%)\n",
                   x->upd_pred_s * 1e3, x->upd_meas_s * 1e3, 100 * (x->upd_pred_s - x->upd_meas_s) / x->upd_meas_s);
        if (x->device && x->cost.plan_predicted_s > 0)
            printf("  auto's plan    %u of %u subgroups on the accelerator, predicted %.3f ms (best fixed policy %.3f ms)\n",
                   x->cost.plan_device_subgroups, x->plan->n_subgroups, x->cost.plan_predicted_s * 1e3,
                   x->cost.best_fixed_predicted_s * 1e3);
        if (x->kernel_s > 0)
            printf("bare AdamW kernel %.3f s on the same parameters: update phase / kernel = %.3f\n", x->kernel_s, x->update_s / x->kernel_s);
        if (x->calibrate) printf("profile written to %s\n", x->calibrate);
    }
}

/* No fixed default under a world-writable /tmp (another user could plant links or files there):
 * a fresh private directory (0700, mkdtemp), removed at the end. 0, 1 or 2 (printed). */
static int private_dir(const char **dir)
{
    char *tmpdir = g_tmpdir;
    const char *t = getenv("TMPDIR");
    if (!t || !*t) t = "/tmp";
    if ((size_t)snprintf(tmpdir, sizeof g_tmpdir, "%s/memwall-bench-offload.XXXXXX", t) >= sizeof g_tmpdir) {
        fprintf(stderr, "memwall bench offload: TMPDIR is too long (%zu bytes); set --nvme-dir\n", strlen(t));
        g_tmpdir[0] = 0;
        return 2;
    }
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "memwall bench offload: cannot create a private directory under %s: %s; set "
                "--nvme-dir or TMPDIR\n", t, strerror(errno));
        g_tmpdir[0] = 0;
        return 1;
    }
    *dir = tmpdir;
    return 0;
}

/* ------------------------------------------------------------------ --policies: side by side */

#define SIDE_MAX 8
#define SIDE_MAXSTEPS 1000  /* --steps' bound */
#define SIDE_PRUNE_AFTER 3  /* timed rounds before a fixed policy may be left out (--prune) */

/* One policy of --policies: its engine and what its steps measured. */
struct side {
    char name[32];                /* as given ("every-2"): the key of its figures */
    enum mw_offload_policy policy;
    int k;                        /* every-K: K */
    struct mw_offload *e;
    float *w;                     /* its own weights (with the state in DRAM: its master) */
    char dir[4096];               /* its NVMe directories (DIR/<name> for each DIR of --nvme-dir), or "" */
    double *t;                    /* its update phase in each round, warm-up ones first (s; -1: not run) */
    double *ctl;                  /* and in each control round (--control: auto's and the best's; -1: not run) */
    int *ctl_ndev;                /* and the subgroups it sent to the device then */
    int *ndev;                    /* and the subgroups it sent to the device */
    int ran, pruned;              /* timed steps run; left out of the later rounds (--prune) */
    uint64_t huge;                /* the huge pages its init added to the process (bytes): engines that got
                                     fewer (staging, state arrays: tier_buft.c) would run slower */
    double med, lo, hi;           /* their median, fastest, slowest */
    struct mw_offload_stats st;   /* the last step's */
    struct mw_offload_cost cost;  /* after the run (auto: its plan) */
};

/* The process's anonymous memory in transparent huge pages (bytes; 0 where the kernel does not say). */
static uint64_t anon_huge_bytes(void) { return mw_proc_field("/proc/self/smaps_rollup", "AnonHugePages"); }

/* The --policies list into x[] (each name checked, no repeats); the count, or -1 (printed: exit 2). */
static int side_parse(const char *list, struct side *x)
{
    int np = 0;
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (np == SIDE_MAX || len == 0 || len >= sizeof x->name) {
            fprintf(stderr, "memwall bench offload: --policies '%s': expected 1 to %d comma-separated policies "
                    "(auto, all-cpu, all-device, every-K), e.g. auto,all-cpu,all-device,every-2\n", list, SIDE_MAX);
            return -1;
        }
        struct side *s = &x[np];
        memset(s, 0, sizeof *s);
        memcpy(s->name, p, len);
        s->name[len] = 0;
        s->k = 2;
        if (mw_offload_policy_parse(s->name, &s->policy, &s->k)) {
            fprintf(stderr, "memwall bench offload: --policies: %s\n", mw_error_msg());
            return -1;
        }
        for (int i = 0; i < np; i++)
            if (!strcmp(x[i].name, s->name)) {
                fprintf(stderr, "memwall bench offload: --policies names '%s' twice; give each policy once\n", s->name);
                return -1;
            }
        np++;
        if (!end) return np;
        p = end + 1;
    }
}

/* Its NVMe directories: DIR/<name> under each DIR of the list, made (0700, with missing parents, as
 * the engine makes DIR; an existing one is used).
 * 0, or 1 (printed). */
static int side_dirs(struct side *s, const char *list)
{
    size_t at = 0;
    for (const char *p = list;;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int w = snprintf(s->dir + at, sizeof s->dir - at, "%s%.*s/%s", at ? ":" : "", (int)len, p, s->name);
        if (w < 0 || (size_t)w >= sizeof s->dir - at) {
            fprintf(stderr, "memwall bench offload: --nvme-dir is too long for one subdirectory per policy; "
                    "use a shorter path\n");
            s->dir[at] = 0;
            return 1;
        }
        const char *mine = s->dir + at + (at ? 1 : 0);
        int rc = mw_mkdir_p(mine, 0700);
        if (rc) {
            fprintf(stderr, "memwall bench offload: policy %s: %s; check --nvme-dir\n", s->name, mw_error_msg());
            s->dir[at] = 0;
            return 1;
        }
        at += (size_t)w;
        if (!end) return 0;
        p = end + 1;
    }
}

/* Removes what side_dirs made (the engine has removed its files by then). */
static void side_dirs_remove(struct side *s)
{
    char *p = s->dir;
    while (*p) {
        char *end = strchr(p, ':');
        if (end) *end = 0;
        if (rmdir(p) && errno != ENOENT)
            fprintf(stderr, "memwall bench offload: warning: cannot remove %s: %s\n", p, strerror(errno));
        if (!end) break;
        p = end + 1;
    }
    s->dir[0] = 0;
}

/* The engines, their NVMe directories and weights; with all, their figures too. */
static void side_free(struct side *x, int np, int all)
{
    for (int i = 0; i < np; i++) {
        if (x[i].e) mw_offload_free(x[i].e);
        if (x[i].dir[0]) side_dirs_remove(&x[i]);
        free(x[i].w);
        x[i].e = NULL;
        x[i].w = NULL;
        if (!all) continue;
        free(x[i].t);
        free(x[i].ndev);
        free(x[i].ctl);
        free(x[i].ctl_ndev);
        x[i].t = NULL;
        x[i].ndev = NULL;
        x[i].ctl = NULL;
        x[i].ctl_ndev = NULL;
    }
}

/* The median of x's steps that ran (t >= 0) in rounds [from, upto), with the fastest and slowest
 * when lo and hi are not NULL; 0 when none ran. */
static double side_median(const struct side *x, int from, int upto, double *lo, double *hi)
{
    double v[2 * SIDE_MAXSTEPS];
    int m = 0;
    for (int t = from; t < upto; t++)
        if (x->t[t] >= 0) v[m++] = x->t[t];
    if (!m) return 0;
    double med = median(v, m);
    if (lo) *lo = v[0];
    if (hi) *hi = v[m - 1];
    return med;
}

/* The best fixed policy (the lowest median; -1 when none), and auto's index in *au (-1: none). */
static int side_best(const struct side *x, int np, int *au)
{
    int best = -1;
    *au = -1;
    for (int i = 0; i < np; i++) {
        if (x[i].policy == MW_OFFLOAD_POLICY_AUTO) { if (*au < 0) *au = i; continue; }
        if (x[i].med > 0 && (best < 0 || x[i].med < x[best].med)) best = i;
    }
    return best;
}

/* Auto's step over policy b's step of the same round, the median over the rounds both ran (ta, tb:
 * their steps, rounds [from, upto)): the comparison with the other tenants' load cancelled as far as
 * one round apart allows; 0 when none. */
static double side_paired(const double *ta, const double *tb, int from, int upto)
{
    double v[SIDE_MAXSTEPS];
    int m = 0;
    for (int t = from; t < upto; t++)
        if (ta[t] > 0 && tb[t] > 0) v[m++] = ta[t] / tb[t];
    return m ? median(v, m) : 0;
}

static void side_print(const struct side *x, int np, uint64_t n, const char *tier, const char *moments,
                       const struct mw_offload_plan *plan, int W, int K, int C, double prune, int json)
{
    int au, best = side_best(x, np, &au);
    double ratio = au >= 0 && best >= 0 && x[best].med > 0 ? x[au].med / x[best].med : 0;
    double paired = au >= 0 && best >= 0 ? side_paired(x[au].t, x[best].t, W, W + K) : 0;
    /* the control: auto's engine over the best's, both with the best's placement (side_control) */
    double offset = C && au >= 0 && best >= 0 && x[au].ctl && x[best].ctl ? side_paired(x[au].ctl, x[best].ctl, 0, C) : 0;
    double corrected = paired > 0 && offset > 0 ? paired / offset : 0;
    if (json) {
        printf("{\"params\": %llu, \"tier\": \"%s\", \"moments\": \"%s\", \"subgroup_size\": %llu, \"subgroups\": %u, "
               "\"steps\": %d, \"warmup\": %d, \"control\": %d, \"prune\": %.3f, \"policies\": {", (unsigned long long)n,
               tier, moments, (unsigned long long)plan->subgroup_size, plan->n_subgroups, K, W, C, prune);
        for (int i = 0; i < np; i++) {
            const struct side *s = &x[i];
            printf("%s\"%s\": {\"update_s\": %.6f, \"update_min_s\": %.6f, \"update_max_s\": %.6f, \"steps_run\": %d, "
                   "\"pruned\": %s, \"cpu_updates\": %llu, \"dev_updates\": %llu, \"huge_page_bytes\": %llu", i ? ", " : "",
                   s->name, s->med, s->lo, s->hi, s->ran, s->pruned ? "true" : "false",
                   (unsigned long long)s->st.cpu_updates, (unsigned long long)s->st.dev_updates,
                   (unsigned long long)s->huge);
            if (s->policy == MW_OFFLOAD_POLICY_AUTO)
                printf(", \"plan_device_subgroups\": %u, \"plan_predicted_s\": %.6f, \"best_fixed_predicted_s\": %.6f, "
                       "\"plan_switches\": %u", s->cost.plan_device_subgroups, s->cost.plan_predicted_s,
                       s->cost.best_fixed_predicted_s, s->cost.plan_switches);
            printf(", \"update_steps_s\": [");
            for (int t = W; t < W + K; t++) {
                if (s->t[t] >= 0) printf("%s%.6f", t > W ? ", " : "", s->t[t]);
                else printf("%snull", t > W ? ", " : "");
            }
            printf("], \"dev_updates_steps\": [");
            for (int t = W; t < W + K; t++) {
                if (s->t[t] >= 0) printf("%s%d", t > W ? ", " : "", s->ndev[t]);
                else printf("%snull", t > W ? ", " : "");
            }
            printf("]");
            if (C && s->ctl) {
                printf(", \"control_steps_s\": [");
                for (int t = 0; t < C; t++) {
                    if (s->ctl[t] >= 0) printf("%s%.6f", t ? ", " : "", s->ctl[t]);
                    else printf("%snull", t ? ", " : "");
                }
                printf("], \"control_dev_updates_steps\": [");
                for (int t = 0; t < C; t++) printf("%s%d", t ? ", " : "", s->ctl[t] >= 0 ? s->ctl_ndev[t] : -1);
                printf("]");
            }
            printf("}");
        }
        printf("}, ");
        if (best >= 0) printf("\"best_fixed\": \"%s\", \"best_fixed_s\": %.6f, ", x[best].name, x[best].med);
        else printf("\"best_fixed\": null, \"best_fixed_s\": null, ");
        if (ratio > 0) printf("\"auto_over_best_fixed\": %.4f, ", ratio);
        else printf("\"auto_over_best_fixed\": null, ");
        if (paired > 0) printf("\"auto_over_best_fixed_paired\": %.4f, ", paired);
        else printf("\"auto_over_best_fixed_paired\": null, ");
        if (offset > 0) printf("\"engine_offset\": %.4f, \"auto_over_best_fixed_corrected\": %.4f}\n", offset, corrected);
        else printf("\"engine_offset\": null, \"auto_over_best_fixed_corrected\": null}\n");
        return;
    }
    printf("offload update phase, policies side by side: %llu parameters, state on %s (moments %s), %u subgroups of "
           "%llu\n", (unsigned long long)n, tier, moments, plan->n_subgroups, (unsigned long long)plan->subgroup_size);
    printf("one engine per policy, %d timed rounds after %d warm-up ones, each policy's steps interleaved "
           "(a shuffled order each round); medians", K, W);
    if (prune > 0) printf("; a fixed policy %.2fx the best fixed one's median stops after %d steps", prune, SIDE_PRUNE_AFTER);
    printf("\n%-12s %12s %12s %12s %6s %s\n", "policy", "update (ms)", "fastest", "slowest", "steps",
           "updates cpu/device (last step)");
    for (int i = 0; i < np; i++) {
        const struct side *s = &x[i];
        printf("%-12s %12.3f %12.3f %12.3f %6d %llu/%llu", s->name, s->med * 1e3, s->lo * 1e3, s->hi * 1e3, s->ran,
               (unsigned long long)s->st.cpu_updates, (unsigned long long)s->st.dev_updates);
        if (s->policy == MW_OFFLOAD_POLICY_AUTO)
            printf("; plan %u of %u on the accelerator, predicted %.3f ms (best fixed %.3f ms), the split changed %u times",
                   s->cost.plan_device_subgroups, plan->n_subgroups, s->cost.plan_predicted_s * 1e3,
                   s->cost.best_fixed_predicted_s * 1e3, s->cost.plan_switches);
        printf("\n");
    }
    if (best >= 0) printf("best fixed policy: %s, %.3f ms", x[best].name, x[best].med * 1e3);
    if (ratio > 0) printf("; auto / best fixed = %.3f (medians), %.3f (paired: the median of the rounds' ratios)", ratio,
                          paired);
    if (best >= 0) printf("\n");
    if (offset > 0)
        printf("control (%d rounds, auto's engine with %s's placement): the engines alone differ by %.3f; auto / best "
               "fixed, paired, over it: %.3f\n", C, x[best].name, offset, corrected);
}

/* After round `rounds - 1`: a fixed policy whose median over the timed rounds (from W) is more than
 * `prune` times the best fixed one's stops (it cannot be the best fixed policy; its steps would only
 * make the rounds long and far apart, which is what pairing them is meant to avoid). Auto and the
 * best one always run. */
static void side_prune(struct side *x, int np, int W, int rounds, double prune)
{
    int best = -1;
    for (int i = 0; i < np; i++) {
        if (x[i].policy == MW_OFFLOAD_POLICY_AUTO || x[i].pruned) continue;
        x[i].med = side_median(&x[i], W, rounds, NULL, NULL);
        if (best < 0 || x[i].med < x[best].med) best = i;
    }
    for (int i = 0; best >= 0 && i < np; i++)
        if (x[i].policy != MW_OFFLOAD_POLICY_AUTO && !x[i].pruned && x[i].med > prune * x[best].med) x[i].pruned = 1;
}

/* A round's order of the engines: a shuffle (Fisher-Yates on xorshift64), a new one each round. Why
 * not a rotation (this benchmark's first version): engine i then always followed engine i - 1, and
 * what a step leaves behind (the disk's write-back of its state, the caches it filled) fell on the
 * same engine every round: the control engine, all-cpu's placement on an engine of its own, came out
 * 0.6-3.5 % faster than all-cpu in 8 of 12 NVMe cells. Shuffled, each engine follows every other
 * about equally often over the rounds. (It does not take out each engine's own offset: its files'
 * place on the virtual disk. Controls still measured 0.96..1.03 after it: docs/offload.md.) */
static void side_order(int *order, int np, uint64_t *seed)
{
    for (int i = 0; i < np; i++) order[i] = i;
    for (int i = np - 1; i > 0; i--) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        int j = (int)(*seed % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* One step of s's engine: its stats into *st, its update phase into *t, its device updates into
 * *ndev. 0, or 1 (printed, naming the policy and `phase`). */
static int side_step(struct side *s, const struct mw_offload_hparams *hp, const char *phase,
                     struct mw_offload_stats *st, double *t, int *ndev)
{
    mw_offload_stats_reset(s->e);
    int e = mw_offload_step(s->e, hp);
    if (e) {
        char what[96];
        snprintf(what, sizeof what, "offload step (%spolicy %s)", phase, s->name);
        mw_cli_fail(what, e);
        return 1;
    }
    mw_offload_stats_get(s->e, st);
    *t = st->step_s;
    *ndev = (int)st->dev_updates;
    return 0;
}

/* The control rounds (--control C), after the timed ones: auto's engine and the best fixed policy's
 * both run the best's placement, C rounds in a shuffled order; their paired ratio is what the two
 * engines differ by when their plans do not (side_print divides auto's ratio by it).
 *
 * Why: with the state on NVMe, six engines running the very same placement (every-1000..1005, 82
 * rounds, Dec 2026) measured 1.00 to 1.05 apart, each engine's offset the same in the first half of
 * the run and the second (within 1.3 %), while in DRAM they were within 1 %: each engine's files sit
 * on their own blocks of the virtual disk, and some blocks are slower. A 3 % target cannot be read
 * through a 5 % offset that belongs to the engine, not to its policy. The control measures the
 * offset of the pair compared, on the plan both could have run, after auto's learning (so nothing
 * auto does is taken out: its probes and its choice are all in the timed rounds). 0 or 1 (printed). */
static int side_control(struct side *x, int np, int C, uint64_t *seed, const struct mw_offload_hparams *hp)
{
    int au, best = side_best(x, np, &au);
    if (au < 0 || best < 0) return 0;
    int pair[2] = {au, best};
    for (int i = 0; i < 2; i++) {
        struct side *s = &x[pair[i]];
        s->ctl = malloc((size_t)C * sizeof *s->ctl);
        s->ctl_ndev = calloc((size_t)C, sizeof *s->ctl_ndev);
        if (!s->ctl || !s->ctl_ndev) {
            fprintf(stderr, "memwall bench offload: out of memory for the control rounds\n");
            return 1;
        }
        for (int t = 0; t < C; t++) s->ctl[t] = -1;
    }
    int r = mw_offload_set_policy(x[au].e, x[best].policy, x[best].k);
    if (r) {
        mw_cli_fail("control (auto's engine with the best fixed policy's placement)", r);
        return 1;
    }
    int order[2];
    for (int t = 0; t < C; t++) {
        side_order(order, 2, seed);
        for (int j = 0; j < 2; j++) {
            struct side *s = &x[pair[order[j]]];
            struct mw_offload_stats st; /* s->st stays the timed rounds' last step (printed) */
            if (side_step(s, hp, "control, ", &st, &s->ctl[t], &s->ctl_ndev[t])) return 1;
        }
    }
    return 0;
}

/* Every policy of x[0..np) on its own engine (config c0 but the policy, the weights and the NVMe
 * directories), their steps interleaved: W warm-up rounds, then K timed ones, each round in its own
 * shuffled order; with prune > 0, fixed policies far behind stop (side_prune). 0 or 1 (printed). */
static int side_by_side(struct side *x, int np, const struct mw_offload_config *c0, const struct mw_offload_registry *reg,
                        uint64_t n, const float *w, int W, int K, int C, double prune, int json, const char *tier,
                        const char *moments)
{
    int rc = 0;
    for (int i = 0; i < np && !rc; i++) {
        struct side *s = &x[i];
        struct mw_offload_config c = *c0;
        c.policy = s->policy;
        c.every_k = s->k;
        s->w = xalloc(4 * n);
        s->t = malloc((size_t)(W + K) * sizeof *s->t);
        s->ndev = calloc((size_t)(W + K), sizeof *s->ndev);
        if (!s->w || !s->t || !s->ndev) {
            fprintf(stderr, "memwall bench offload: out of memory for policy %s's weights (%llu bytes); use fewer "
                    "--params or fewer --policies\n", s->name, (unsigned long long)(4 * n));
            rc = 1;
            break;
        }
        for (int t = 0; t < W + K; t++) s->t[t] = -1;
        /* huge pages asked for every engine's weights alike, before the first touch, as the tiers ask
         * for their state arrays (tier_buft.c: 5-10 % faster updates): with the state in DRAM these
         * weights are the engine's master, streamed by every update */
        (void)madvise(s->w, MW_ALIGN_UP(4 * n, (size_t)(2u << 20)), MADV_HUGEPAGE);
        memcpy(s->w, w, 4 * n);
        c.ext_weights = s->w;
        if (c0->nvme_dir && (rc = side_dirs(s, c0->nvme_dir))) break;
        if (c0->nvme_dir) c.nvme_dir = s->dir;
        uint64_t h0 = anon_huge_bytes();
        int r = mw_offload_init(&s->e, reg, &c);
        uint64_t h1 = anon_huge_bytes();
        s->huge = h1 > h0 ? h1 - h0 : 0;
        if (r) {
            char what[64];
            snprintf(what, sizeof what, "offload init (policy %s)", s->name);
            mw_cli_fail(what, r);
            s->e = NULL;
            rc = 1;
        }
    }
    struct mw_offload_hparams hp;
    mw_offload_hparams_default(&hp);
    uint64_t seed = 0x9e3779b97f4a7c15ull; /* fixed: the same orders in every run */
    int order[SIDE_MAX];
    for (int r = 0; r < W + K && !rc; r++) { /* r < W: warm-up rounds */
        side_order(order, np, &seed);
        for (int j = 0; j < np && !rc; j++) {
            struct side *s = &x[order[j]];
            if (s->pruned) continue;
            if ((rc = side_step(s, &hp, "", &s->st, &s->t[r], &s->ndev[r]))) break;
            s->ran += r >= W;
        }
        if (prune > 0 && r + 1 - W >= SIDE_PRUNE_AFTER) side_prune(x, np, W, r + 1, prune);
    }
    if (!rc) {
        for (int i = 0; i < np; i++) {
            mw_offload_cost_get(x[i].e, &x[i].cost); /* auto's plan: before the control sets its policy */
            x[i].med = side_median(&x[i], W, W + K, &x[i].lo, &x[i].hi);
        }
        if (C) rc = side_control(x, np, C, &seed, &hp);
    }
    if (!rc) {
        struct mw_offload_plan plan = *mw_offload_get_plan(x[0].e);
        side_free(x, np, 0); /* before printing: the NVMe files and directories are gone when it reports */
        side_print(x, np, n, tier, moments, &plan, W, K, C, prune, json);
    }
    side_free(x, np, 1);
    return rc;
}

static int bench_offload(int argc, char **argv)
{
    int64_t params = 64ll << 20, steps = 3, warmup = 1, threads = 0, buffers = 8, qd = 128, control = 0;
    int64_t sgsize = 4ll << 20;
    uint64_t bsize = 1u << 20, dram_budget = 0, nvme_budget = 0;
    const char *tier = "nvme", *dir = NULL, *moments = "fp32", *policy = "all-cpu";
    const char *calibrate = NULL, *trace_path = NULL, *profile = NULL, *policies = NULL;
    int json = 0, device = 0, no_kernel = 0;
    double prune = 0;
    static const char *const tiers[] = {"dram", "nvme", NULL};
    static const char *const mfs[] = {"fp32", "bf16", "bf16-sr", "8bit", NULL};
    const struct mw_opt opts[] = {
        {"params", MW_OPT_INT, &params, "N", "number of parameters (elements)", 1, 1e12, NULL},
        {"subgroup-size", MW_OPT_INT, &sgsize, "N", "elements per subgroup", 1, 1e12, NULL},
        {"buffer-count", MW_OPT_INT, &buffers, "B", "host staging buffers for the NVMe pipeline", 1, 64, NULL},
        {"tier", MW_OPT_CHOICE, &tier, NULL, "where master weights and moments live", 0, 0, tiers},
        {"nvme-dir", MW_OPT_STRING, &dir, "DIR", "directory for the NVMe state (several: DIR1:DIR2); default a private new one under $TMPDIR, removed at the end", 0, 0, NULL},
        {"queue-depth", MW_OPT_INT, &qd, "Q", "NVMe pieces in flight (reads and writes together)", 1, 4096, NULL},
        {"block-size", MW_OPT_SIZE, &bsize, "BYTES", "bytes per NVMe piece (multiple of 4 KiB)", 4096, 1073741824, NULL},
        {"dram-budget", MW_OPT_SIZE, &dram_budget, "BYTES", "host memory the engine may use (0: MemAvailable)", 0, 0, NULL},
        {"nvme-budget", MW_OPT_SIZE, &nvme_budget, "BYTES", "NVMe space the engine may use (0: free space)", 0, 0, NULL},
        {"moments", MW_OPT_CHOICE, &moments, NULL, "moment storage format", 0, 0, mfs},
        {"steps", MW_OPT_INT, &steps, "K", "timed steps (medians are reported), after the warm-up steps", 1, 1000, NULL},
        {"warmup", MW_OPT_INT, &warmup, "W", "untimed warm-up steps first (with --policies: rounds)", 1, 1000, NULL},
        {"threads", MW_OPT_INT, &threads, "T", "optimizer kernel threads, 0 = OpenMP default", 0, 1024, NULL},
        {"device", MW_OPT_FLAG, &device, NULL, "also run the accelerator (hybrid schedule): the emulated one, or the GPU with MEMWALL_DEVICE=cuda", 0, 0, NULL},
        {"policy", MW_OPT_STRING, &policy, "P", "update placement with --device: auto, all-cpu, all-device, every-K", 0, 0, NULL},
        {"policies", MW_OPT_STRING, &policies, "LIST", "policies side by side, one engine each, steps interleaved (implies --device): e.g. auto,all-cpu,all-device,every-2,every-4", 0, 0, NULL},
        {"control", MW_OPT_INT, &control, "C", "with --policies: C more rounds in which auto's engine and the best fixed policy's both run the best's placement; auto's paired ratio is also given over what they measure apart (0: none)", 0, 1000, NULL},
        {"prune", MW_OPT_DOUBLE, &prune, "X", "with --policies: a fixed policy whose median is over X times the best fixed one's stops after 3 steps (0: never)", 0, 1e6, NULL},
        {"profile", MW_OPT_STRING, &profile, "FILE", "cost-model profile for --policy auto (from --calibrate)", 0, 0, NULL},
        {"no-kernel", MW_OPT_FLAG, &no_kernel, NULL, "skip the bare-kernel comparison (saves memory)", 0, 0, NULL},
        {"calibrate", MW_OPT_STRING, &calibrate, "FILE", "measure the cost-model profile and write it as JSON", 0, 0, NULL},
        {"trace", MW_OPT_STRING, &trace_path, "FILE", "write a Perfetto trace of the timed steps", 0, 0, NULL},
        {"json", MW_OPT_FLAG, &json, NULL, "print one JSON object instead of text", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {"bench offload", "",
        "Times the optimizer update phase of the offload engine (read, update, write-back, working-copy "
        "refresh; state in DRAM or on NVMe), reports bytes moved, achieved NVMe bandwidth and the time the "
        "CPU waited for I/O, and the bare AdamW kernel on the same parameters in the same run.",
        opts, MW_NOPTS(opts), 0, 0};
    int r = mw_opts_parse(&spec, argc, argv, NULL, NULL);
    if (r == MW_OPTS_HELP) return 0;
    if (r) return 2;
    struct side side[SIDE_MAX];
    int nside = 0;
    if (policies) {
        if ((nside = side_parse(policies, side)) < 0) return 2;
        if (calibrate || trace_path || mw_opts_given(&spec, "policy")) {
            fprintf(stderr, "memwall bench offload: --policies runs its own policies without the bare kernel: give "
                    "--policy, --calibrate and --trace in a run without it\n");
            return 2;
        }
        device = no_kernel = 1;
    }
    if (control && !policies) {
        fprintf(stderr, "memwall bench offload: --control C needs --policies\n");
        return 2;
    }
    if (prune != 0 && (!policies || prune < 1)) {
        fprintf(stderr, "memwall bench offload: --prune X needs --policies and X >= 1 (0: never)\n");
        return 2;
    }

    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = (uint64_t)sgsize;
    c.buffer_count = (int)buffers;
    c.io_queue_depth = (unsigned)qd;
    c.io_block_size = bsize;
    c.budget[MW_TIER_DRAM] = dram_budget;
    c.budget[MW_TIER_NVME] = nvme_budget;
    if (bsize % 4096) { fprintf(stderr, "memwall bench offload: --block-size must be a multiple of 4096\n"); return 2; }
    c.cpu_threads = (int)threads;
    c.moments = !strcmp(moments, "bf16") ? MW_OFFLOAD_M_BF16 : !strcmp(moments, "bf16-sr") ? MW_OFFLOAD_M_BF16_SR
              : !strcmp(moments, "8bit") ? MW_OFFLOAD_M_8BIT : MW_OFFLOAD_M_FP32;
    if (!strcmp(tier, "nvme")) {
        if (mw_offload_placement_parse("optim=nvme", &c.place)) return 2;
        if (!dir && (r = private_dir(&dir))) return r;
        c.nvme_dir = dir;
    }

    c.use_device = device;
    if (profile && (r = mw_offload_profile_load(profile, &c.profile))) { mw_cli_fail("profile", r); return 1; }
    c.profile_fixed = profile != NULL;
    if (device && mw_offload_policy_parse(policy, &c.policy, &c.every_k)) {
        fprintf(stderr, "memwall bench offload: %s\n", mw_error_msg());
        return 2;
    }
    struct mw_trace *tr = NULL;
    if (trace_path && (r = mw_trace_init(&tr, 0))) { mw_cli_fail("trace", r); return 1; }
    c.trace = tr;

    uint64_t n = (uint64_t)params;
    struct mw_offload_registry reg;
    mw_offload_registry_init(&reg);
    int64_t shape[1] = {(int64_t)n};
    int rc = mw_offload_registry_add(&reg, "params", 1, shape);
    float *w = xalloc(4 * n), *g = xalloc(4 * n);
    if (!rc && (!w || !g)) rc = mw_error_set(-ENOMEM, "cannot allocate 2 x %llu bytes for the weights and gradients",
                                             (unsigned long long)(4 * n));
    if (rc) { mw_cli_fail("bench offload setup", rc); free(w); free(g); mw_trace_free(tr); return 1; }
    fill(w, n, 1e-3f, 1);
    fill(g, n, 1e-4f, 2);
    c.ext_weights = w;
    c.ext_grads = g;
    c.ext_grads_accumulate = 1; /* the update phase alone: no gradient copy */
    if (nside) {
        rc = side_by_side(side, nside, &c, &reg, n, w, (int)warmup, (int)steps, (int)control, prune, json, tier, moments);
        free(w);
        free(g);
        mw_offload_registry_free(&reg);
        return rc;
    }

    struct mw_offload *e;
    uint64_t t_init = mw_now_ns();
    rc = mw_offload_init(&e, &reg, &c);
    if (rc) { mw_cli_fail("offload init", rc); free(w); free(g); return 1; }
    double init_s = (double)(mw_now_ns() - t_init) * 1e-9;
    const struct mw_offload_plan plan_copy = *mw_offload_get_plan(e), *plan = &plan_copy;
    char plantxt[1024];
    mw_offload_plan_format(plan, plantxt, sizeof plantxt);

    enum mw_optim_dtype md = c.moments == MW_OFFLOAD_M_BF16 ? MW_OPTIM_BF16 : c.moments == MW_OFFLOAD_M_BF16_SR ? MW_OPTIM_BF16_SR
                           : c.moments == MW_OFFLOAD_M_8BIT ? MW_OPTIM_Q8 : MW_OPTIM_F32;
    struct bare bk = {0};
    if (!no_kernel && (rc = bare_init(&bk, n, md, (int)threads, w, g))) {
        mw_cli_fail("bare kernel", rc); mw_offload_free(e); free(w); free(g); return 1;
    }
    /* engine steps and bare-kernel steps alternate, so both see the same machine load */
    struct mw_offload_hparams hp;
    mw_offload_hparams_default(&hp);
    int K = (int)steps;
    double upd[1000], wait[1000], kern[1000], ktimes[1000];
    struct mw_offload_stats st = {0};
    for (int s = 1 - (int)warmup; s <= K && !rc; s++) { /* s <= 0: the warm-up steps of both */
        mw_offload_stats_reset(e);
        rc = mw_offload_step(e, &hp);
        mw_offload_stats_get(e, &st);
        double kt = 0;
        if (!rc && !no_kernel && (rc = bare_step(&bk, &kt))) break;
        if (s > 0) { upd[s - 1] = st.step_s; wait[s - 1] = st.io_wait_s; kern[s - 1] = st.kernel_s; ktimes[s - 1] = kt; }
    }
    if (rc) { mw_cli_fail("offload step", rc); bare_free(&bk); mw_offload_free(e); free(w); free(g); return 1; }
    struct mw_offload_cost cost;
    mw_offload_cost_get(e, &cost);
    bare_free(&bk);
    mw_offload_free(e);
    free(w);
    free(g);
    if (tr) {
        rc = mw_trace_write(tr, trace_path);
        mw_trace_free(tr);
        if (rc) { mw_cli_fail("writing the trace", rc); mw_offload_registry_free(&reg); return 1; }
    }
    double update_s = median(upd, K), io_wait_s = median(wait, K), pipe_kernel_s = median(kern, K);

    double kernel_s = no_kernel ? 0 : median(ktimes, K);
    double rd_bw = update_s > 0 ? (double)st.nvme_read_bytes / update_s : 0;
    double wr_bw = update_s > 0 ? (double)st.nvme_write_bytes / update_s : 0;
    double rw_bw = update_s > 0 ? (double)(st.nvme_read_bytes + st.nvme_write_bytes) / update_s : 0;

    if (calibrate && write_profile(calibrate, n, md, kernel_s, !strcmp(tier, "nvme"), rd_bw, wr_bw)) return 1;

    struct result res = {n, tier, moments, plan, (int)buffers, (int)threads, K, update_s, kernel_s, pipe_kernel_s,
                         io_wait_s, &st, rd_bw, wr_bw, rw_bw, init_s, device, calibrate, plantxt, cost,
                         st.predicted_s, st.measured_s};
    print_result(&res, json);
    mw_offload_registry_free(&reg);
    return 0;
}

int mw_cmd_bench_offload(int argc, char **argv)
{
    g_tmpdir[0] = 0;
    int r = bench_offload(argc, argv);
    if (g_tmpdir[0] && rmdir(g_tmpdir) != 0)
        fprintf(stderr, "memwall bench offload: warning: cannot remove %s: %s\n", g_tmpdir, strerror(errno));
    return r;
}
