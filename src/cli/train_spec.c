/*
 * train_spec.c — the settings of a `memwall train` run as its commit record and checkpoints keep
 * them, and their return on --resume (docs/resume.md, "What a resume keeps").
 *
 * Why every option and not a chosen few: a resume that forgot one (the out-dir, the log) finished
 * the run and wrote nothing. The option table is the one list of what a run is, so the text is
 * the table's resolved values, one "name=value" line each (escaped: %XX for '%' and control
 * bytes; a line with no '=' is an option that was not set), and a resume applies it through the
 * same table with the same checks as typed values, so a hostile record cannot smuggle in what
 * the command line would refuse.
 *
 * Why paths are relative to the out-dir where they can be: a run directory (`--out-dir D
 * --nvme-dir D/nvme --log-json D/log.jsonl`) copied or moved elsewhere must resume where it now
 * is and never touch the original. Paths inside the out-dir are kept as "@out/REL"; the out-dir
 * itself is where the checkpoint being resumed lies, or, from a commit record in a directory under
 * it, "@out-from-record" up from the record's directory; everything else is absolute.
 *
 * What a flag given with --resume may do (the three lists below): change how the run is executed
 * but not its results (allowed, listed), change its results from here on (announced), or
 * contradict what the state on disk is (refused with both values).
 */
#include "cli/train_spec.h"
#include "cli/opts.h"
#include "memwall/common.h"
#include "memwall/train.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Not kept: they say how to start, not what the run is. */
static const char *const not_kept[] = {"resume", "ds-config", "preset", "init-safetensors", "init-hf", NULL};
/* Paths (nvme-dir: a ':' list). */
static const char *const path_opts[] = {"data", "out-dir", "log-json", "trace", "nvme-dir", "save-hf", "tokenizer", NULL};
/* Given on resume with another value: applied, listed. They do not change a result. (nvme-dir: a
 * checkpoint's run gets a fresh NVMe state where it is told; a commit record's run is where the
 * record is, and cmd_train.c refuses another.) */
static const char *const allowed[] = {"steps", "threads", "print-every", "comm-timeout", "buffer-count",
                                      "prefetch-depth", "aio-block-size", "aio-queue-depth", "preread",
                                      "sync-update", "dram-budget", "nvme-budget", "nvme-dir", NULL};
/* Refused: the state on disk, the data stream or the model depend on them. */
static const char *const refused[] = {"layers", "heads", "width", "context", "vocab", "batch", "seq", "grad-accum",
                                      "seed", "data", "zero", "zero-hierarchy", "comm-sum", NULL};
/* Where the state lives and how the step is scheduled: refused against a commit record (the state
 * on NVMe is laid out by them), allowed against a checkpoint (it holds the state in one format
 * that every placement loads, bitwise). */
static const char *const placement[] = {"optimizer-tier", "offload-params", "subgroup-size", "schedule",
                                        "activations", "recompute", "offload-policy", NULL};
/* Everything else (the optimizer's hyper-parameters, validation, checkpoints, outputs, sampling):
 * applied and announced, the results differ from the uninterrupted run's from here on. */

static int in_list(const char *const *l, const char *name)
{
    for (; *l; l++)
        if (!strcmp(*l, name)) return 1;
    return 0;
}

/* ------------------------------------------------------------------ text */

struct sbuf { char *p; size_t n, cap; int oom; };

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_esc(struct sbuf *b, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '%' || c < 0x20 || c == 0x7f) {
            char x[4];
            snprintf(x, sizeof x, "%%%02X", c);
            sb_put(b, x, 3);
        } else {
            sb_put(b, s, 1);
        }
    }
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* In place; -1 on a malformed escape or an escaped NUL. */
static int unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p != '%') { *o++ = *p; continue; }
        int h = hexval(p[1]), l = h < 0 ? -1 : hexval(p[2]);
        if (h < 0 || l < 0 || (h == 0 && l == 0)) return -1;
        *o++ = (char)(h * 16 + l);
        p += 2;
    }
    *o = 0;
    return 0;
}

/* The option's value as text (NULL: a string option that is not set). */
static const char *fmt_value(const struct mw_opt *o, char *buf, size_t n)
{
    switch (o->type) {
    case MW_OPT_FLAG: snprintf(buf, n, "%d", *(int *)o->dst ? 1 : 0); return buf;
    case MW_OPT_INT: snprintf(buf, n, "%" PRId64, *(int64_t *)o->dst); return buf;
    case MW_OPT_SIZE: snprintf(buf, n, "%" PRIu64, *(uint64_t *)o->dst); return buf;
    case MW_OPT_DOUBLE: { /* the shortest text that reads back as the same double */
        double d = *(double *)o->dst;
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, d);
            if (strtod(buf, NULL) == d) break;
        }
        return buf;
    }
    case MW_OPT_STRING:
    case MW_OPT_CHOICE: return *(const char **)o->dst;
    }
    return NULL;
}

/* ------------------------------------------------------------------ paths */

/* p (absolute) inside dir (absolute): the relative rest ("." for dir itself), else NULL. */
static const char *under(const char *p, const char *dir)
{
    size_t dl = strlen(dir);
    if (strncmp(p, dir, dl)) return NULL;
    if (!p[dl]) return ".";
    if (p[dl] == '/') return p + dl + 1;
    if (dl == 1 && dir[0] == '/') return p + 1;
    return NULL;
}

/* One path as kept: "@out/REL" inside the out-dir, else absolute. */
static int keep_path(struct sbuf *b, const char *path, const char *out_abs, int is_out_dir)
{
    char abs_[PATH_MAX];
    if (mw_train_abs_path(path, abs_, sizeof abs_)) { /* its directory is made later (the NVMe one): as given */
        mw_error_clear();
        sb_esc(b, path);
        return 0;
    }
    const char *rel = out_abs && !is_out_dir ? under(abs_, out_abs) : NULL;
    if (rel) {
        sb_str(b, "@out/");
        sb_esc(b, rel);
    } else {
        sb_esc(b, abs_);
    }
    return 0;
}

int train_spec_build(const struct mw_cmd_spec *cs, const char *out_dir, const char *record_dir, char **out)
{
    *out = NULL;
    struct sbuf b = {0};
    char out_abs[PATH_MAX], rec_abs[PATH_MAX];
    int err = 0;
    if (out_dir && (err = mw_train_abs_path(out_dir, out_abs, sizeof out_abs))) return err;
    for (int i = 0; i < cs->nopts && !err; i++) {
        const struct mw_opt *o = &cs->opts[i];
        if (in_list(not_kept, o->name)) continue;
        char buf[64];
        const char *v = fmt_value(o, buf, sizeof buf);
        sb_str(&b, o->name);
        if (!v) { sb_str(&b, "\n"); continue; }
        sb_str(&b, "=");
        if (!in_list(path_opts, o->name)) {
            sb_esc(&b, v);
        } else if (!strcmp(o->name, "nvme-dir")) { /* a list: each one */
            char *copy = strdup(v);
            if (!copy) { err = mw_error_set(-ENOMEM, "no memory"); break; }
            int k = 0;
            for (char *save = NULL, *t = strtok_r(copy, ":", &save); t && !err; t = strtok_r(NULL, ":", &save), k++) {
                if (k) sb_str(&b, ":");
                err = keep_path(&b, t, out_dir ? out_abs : NULL, 0);
            }
            free(copy);
        } else {
            err = keep_path(&b, v, out_dir ? out_abs : NULL, !strcmp(o->name, "out-dir"));
        }
        sb_str(&b, "\n");
    }
    /* The out-dir seen from the record's directory, when the record lies under it. */
    if (!err && out_dir && record_dir && !(err = mw_train_abs_path(record_dir, rec_abs, sizeof rec_abs))) {
        const char *rel = under(rec_abs, out_abs);
        if (rel) {
            sb_str(&b, "@out-from-record=");
            if (!strcmp(rel, ".")) sb_str(&b, ".");
            for (const char *p = rel; strcmp(rel, ".") && p; p = strchr(p + 1, '/')) sb_str(&b, p == rel ? ".." : "/..");
            sb_str(&b, "\n");
        }
    }
    if (err || b.oom) {
        free(b.p);
        return err ? err : mw_error_set(-ENOMEM, "no memory");
    }
    if (b.n > MW_TRAIN_SPEC_MAX) {
        free(b.p);
        return mw_error_set(-E2BIG, "the run's settings take %zu bytes, more than the %u a commit record keeps: use "
                            "shorter paths", b.n, MW_TRAIN_SPEC_MAX);
    }
    *out = b.p;
    return 0;
}

/* ------------------------------------------------------------------ resume */

/* The kept text, split and unescaped in place; the values live as long as the text (the option
 * table points string options into it). */
struct kept { char *name, *value; int has; };

static const struct mw_opt *find_opt(const struct mw_cmd_spec *cs, const char *name)
{
    for (int i = 0; i < cs->nopts; i++)
        if (!strcmp(cs->opts[i].name, name)) return &cs->opts[i];
    return NULL;
}

/* "@out/REL" against the out-dir, each element of a list; into fresh memory. */
static char *resolve(const char *v, const char *out_dir)
{
    struct sbuf b = {0};
    const char *p = v;
    while (1) {
        size_t l = strcspn(p, ":");
        if (p != v) sb_str(&b, ":");
        if (!strncmp(p, "@out/", 5) && out_dir) {
            sb_str(&b, out_dir);
            if (!(l == 6 && p[5] == '.')) {
                sb_str(&b, "/");
                sb_put(&b, p + 5, l - 5);
            }
        } else {
            sb_put(&b, p, l);
        }
        if (!p[l]) break;
        p += l + 1;
    }
    if (!b.p && !b.oom) sb_str(&b, "");
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}

/* The same path? Both through mw_train_abs_path (a path list element by element). */
static int same_paths(const char *a, const char *b)
{
    if (!strcmp(a, b)) return 1;
    size_t la = strcspn(a, ":"), lb = strcspn(b, ":");
    char x[PATH_MAX], y[PATH_MAX], ax[PATH_MAX], by[PATH_MAX];
    if (la >= sizeof x || lb >= sizeof y) return 0;
    snprintf(x, sizeof x, "%.*s", (int)la, a);
    snprintf(y, sizeof y, "%.*s", (int)lb, b);
    if (mw_train_abs_path(x, ax, sizeof ax) || mw_train_abs_path(y, by, sizeof by) || strcmp(ax, by)) return 0;
    if (!a[la] || !b[lb]) return !a[la] && !b[lb];
    return same_paths(a + la + 1, b + lb + 1);
}

/* dir (the first of a ':' list) followed by ups ("." or "../.."), written without the ".."s where
 * the directory's own components can be dropped: "R/nvme" + ".." is "R". */
static void up_from(char *out, size_t n, const char *dir, const char *ups)
{
    snprintf(out, n, "%.*s", (int)strcspn(dir, ":"), dir);
    for (const char *u = ups; !strncmp(u, "..", 2); u += u[2] == '/' ? 3 : 2) {
        size_t l = strlen(out);
        while (l > 1 && out[l - 1] == '/') out[--l] = 0;
        char *slash = strrchr(out, '/');
        const char *last = slash ? slash + 1 : out;
        if (!strcmp(last, "..") || !strcmp(last, ".") || !*last) {
            snprintf(out + l, n - l, "/..");
        } else if (!slash) {
            snprintf(out, n, ".");
        } else {
            slash[slash == out ? 1 : 0] = 0;
        }
        if (!u[2]) break;
    }
}

int train_spec_apply(const struct mw_cmd_spec *cs, char *text, const char *record_dir, const char *ckpt_path,
                     int64_t committed, struct train_spec_applied *ap)
{
    memset(ap, 0, sizeof *ap);
    /* Split the lines. */
    int n = 0;
    for (char *p = text; *p; p++) n += *p == '\n';
    struct kept *k = calloc((size_t)n + 1, sizeof *k);
    if (!k) { fprintf(stderr, "memwall train: no memory\n"); return 1; }
    int nk = 0;
    const char *out_from_record = NULL;
    for (char *line = text, *nl; line && *line; line = nl) {
        nl = strchr(line, '\n');
        if (nl) *nl++ = 0;
        char *eq = strchr(line, '=');
        if (eq) *eq = 0;
        if (eq && unescape(eq + 1)) {
            fprintf(stderr, "memwall train: the run's record is corrupt: a malformed value of '%s'\n", line);
            free(k);
            return 1;
        }
        if (!strcmp(line, "@out-from-record")) { out_from_record = eq ? eq + 1 : NULL; continue; }
        if (!find_opt(cs, line) || in_list(not_kept, line)) {
            fprintf(stderr, "memwall train: warning: the run's record keeps an option this memwall does not know, "
                    "'%.64s': ignored\n", line);
            continue;
        }
        for (int j = 0; j < nk; j++)
            if (!strcmp(k[j].name, line)) {
                fprintf(stderr, "memwall train: the run's record is corrupt: it sets '%s' twice\n", line);
                free(k);
                return 1;
            }
        k[nk].name = line;
        k[nk].value = eq ? eq + 1 : NULL;
        k[nk].has = eq != NULL;
        nk++;
    }
    /* Where the out-dir is now. */
    static char out_now[PATH_MAX];
    const char *out_dir = NULL;
    for (int i = 0; i < nk; i++) {
        if (strcmp(k[i].name, "out-dir") || !k[i].has) continue;
        const char *slash = ckpt_path ? strrchr(ckpt_path, '/') : NULL;
        if (ckpt_path) /* a checkpoint lies in its run's out-dir */
            snprintf(out_now, sizeof out_now, "%.*s", slash ? (int)(slash - ckpt_path) : 1, slash ? ckpt_path : ".");
        else if (record_dir && out_from_record)
            up_from(out_now, sizeof out_now, record_dir, out_from_record);
        else
            snprintf(out_now, sizeof out_now, "%s", k[i].value);
        if (slash == ckpt_path && ckpt_path && slash) snprintf(out_now, sizeof out_now, "/");
        k[i].value = out_now;
        out_dir = out_now;
    }
    int rc = 0, nref = 0;
    for (int i = 0; i < nk && !rc; i++) {
        const struct mw_opt *o = find_opt(cs, k[i].name);
        char *v = NULL;
        if (k[i].has) {
            if (in_list(path_opts, o->name) && strcmp(o->name, "out-dir")) {
                if (!strncmp(k[i].value, "@out/", 5) && !out_dir) {
                    fprintf(stderr, "memwall train: the run's record is corrupt: %s is relative to an out-dir it does "
                            "not have\n", o->name);
                    rc = 1;
                    break;
                }
                if (ap->nowned == TRAIN_SPEC_MAX_OWNED || !(v = resolve(k[i].value, out_dir))) {
                    fprintf(stderr, "memwall train: no memory\n");
                    rc = 1;
                    break;
                }
                ap->owned[ap->nowned++] = v; /* each path option once (checked above): never full */
            } else {
                v = k[i].value;
            }
        }
        char now_buf[64];
        const char *now = fmt_value(o, now_buf, sizeof now_buf);
        if (!mw_opts_given(cs, o->name)) { /* the record's value */
            if (v && now && !strcmp(v, now) && !in_list(path_opts, o->name)) continue; /* the default (0 = auto, too) */
            if (o->type == MW_OPT_FLAG) *(int *)o->dst = v && !strcmp(v, "1");
            else if (!v && (o->type == MW_OPT_STRING || o->type == MW_OPT_CHOICE)) *(const char **)o->dst = NULL;
            else if (!v || mw_opts_set_default(cs, o->name, v, "the run's record") != MW_OPTS_OK) {
                fprintf(stderr, "memwall train: the run's record holds an invalid '%s': corrupt or written by another "
                        "memwall\n", o->name);
                rc = 1;
            }
            continue;
        }
        /* Given: the same, or allowed, announced, refused. */
        int same = (!v && !now) || (v && now && (in_list(path_opts, o->name) ? same_paths(v, now) : !strcmp(v, now)));
        if (same) continue;
        const char *was = v ? v : "(not set)", *is = now ? now : "(not set)";
        if (!strcmp(o->name, "steps") && v && now && atoll(now) < committed) {
            fprintf(stderr, "memwall train: --steps %s: the run has already committed %" PRId64 " steps\n", is, committed);
            nref++;
        } else if (in_list(refused, o->name) || (!ckpt_path && in_list(placement, o->name))) {
            fprintf(stderr, "memwall train: --%s %s differs from the run's %s: a resumed run keeps it (start a new run "
                    "to change it)\n", o->name, is, was);
            nref++;
        } else if (in_list(allowed, o->name) || in_list(placement, o->name)) {
            printf("  --%s %s (the run had %s)\n", o->name, is, was);
        } else {
            printf("  --%s %s overrides the run's %s: from here on the run is not the one it started as\n", o->name, is,
                   was);
            ap->announced++;
        }
    }
    free(k);
    if (!rc && nref) {
        fprintf(stderr, "run 'memwall train --resume %s' alone to continue it as it was started\n",
                ckpt_path ? ckpt_path : record_dir);
        rc = 2;
    }
    return rc;
}

void train_spec_applied_free(struct train_spec_applied *ap)
{
    for (int i = 0; i < ap->nowned; i++) free(ap->owned[i]);
    ap->nowned = 0;
}
