/*
 * opts.c — table-driven option parsing and help (see opts.h for why).
 */
#include "cli/opts.h"
#include "memwall/common.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define MW_MAX_OPTS 128
static const struct mw_cmd_spec *g_last_spec;
static unsigned char g_given[MW_MAX_OPTS];
static const char *g_origin; /* where a value set by mw_opts_set came from, for messages */

static void print_default(const struct mw_opt *o, FILE *f)
{
    char b[64];
    switch (o->type) {
    case MW_OPT_FLAG: break;
    case MW_OPT_INT: fprintf(f, " (default %" PRId64 ")", *(int64_t *)o->dst); break;
    case MW_OPT_SIZE: {
        uint64_t v = *(uint64_t *)o->dst;
        if (v) fprintf(f, " (default %s)", mw_fmt_bytes(b, sizeof b, v));
        break;
    }
    case MW_OPT_DOUBLE: fprintf(f, " (default %g)", *(double *)o->dst); break;
    case MW_OPT_STRING:
    case MW_OPT_CHOICE: {
        const char *s = *(const char **)o->dst;
        if (s) fprintf(f, " (default %s)", s);
        break;
    }
    }
}

void mw_opts_help(const struct mw_cmd_spec *spec, FILE *f)
{
    fprintf(f, "usage: memwall %s [options]%s%s\n\n%s\n\noptions:\n", spec->name,
            spec->args && *spec->args ? " " : "", spec->args ? spec->args : "", spec->summary);
    for (int i = 0; i < spec->nopts; i++) {
        const struct mw_opt *o = &spec->opts[i];
        char left[96];
        if (o->type == MW_OPT_FLAG) snprintf(left, sizeof left, "--%s", o->name);
        else if (o->type == MW_OPT_CHOICE) {
            char ch[80] = "";
            for (int k = 0; o->choices[k]; k++) {
                if (k) strncat(ch, "|", sizeof ch - strlen(ch) - 1);
                strncat(ch, o->choices[k], sizeof ch - strlen(ch) - 1);
            }
            snprintf(left, sizeof left, "--%s %s", o->name, ch);
        } else snprintf(left, sizeof left, "--%s %s", o->name, o->metavar ? o->metavar : "X");
        fprintf(f, "  %-34s %s", left, o->help);
        print_default(o, f);
        fputc('\n', f);
    }
    fprintf(f, "  %-34s %s\n", "-h, --help", "print this help and exit");
}

static int bad(const struct mw_cmd_spec *spec, const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "memwall %s: ", spec->name);
    if (g_origin) fprintf(stderr, "%s: ", g_origin);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nrun 'memwall %s --help' for the options\n", spec->name);
    return MW_OPTS_USAGE;
}

static int check_bounds(const struct mw_cmd_spec *spec, const struct mw_opt *o, double v, const char *val)
{
    if (o->min != o->max && (v < o->min || v > o->max)) {
        char rng[96];
        snprintf(rng, sizeof rng, "%s is out of range [%g, %g]", val, o->min, o->max);
        return bad(spec, "--%s: %s", o->name, rng);
    }
    return MW_OPTS_OK;
}

static int set_value(const struct mw_cmd_spec *spec, const struct mw_opt *o, const char *val)
{
    char *end;
    switch (o->type) {
    case MW_OPT_FLAG: *(int *)o->dst = 1; return MW_OPTS_OK;
    case MW_OPT_INT: {
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (errno || end == val || *end) return bad(spec, "--%s: '%s' is not an integer", o->name, val);
        int r = check_bounds(spec, o, (double)v, val);
        if (r) return r;
        *(int64_t *)o->dst = v;
        return MW_OPTS_OK;
    }
    case MW_OPT_SIZE: {
        uint64_t v;
        if (mw_parse_size(val, &v))
            return bad(spec, "--%s: '%s' is not a size (bytes, or with K/M/G/T, KiB/MiB/GiB or KB/MB/GB)", o->name, val);
        int r = check_bounds(spec, o, (double)v, val);
        if (r) return r;
        *(uint64_t *)o->dst = v;
        return MW_OPTS_OK;
    }
    case MW_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end) return bad(spec, "--%s: '%s' is not a number", o->name, val);
        int r = check_bounds(spec, o, v, val);
        if (r) return r;
        *(double *)o->dst = v;
        return MW_OPTS_OK;
    }
    case MW_OPT_STRING: *(const char **)o->dst = val; return MW_OPTS_OK;
    case MW_OPT_CHOICE:
        for (int k = 0; o->choices[k]; k++)
            if (!strcmp(o->choices[k], val)) { *(const char **)o->dst = o->choices[k]; return MW_OPTS_OK; }
        return bad(spec, "--%s: '%s' is not one of the allowed values (see --help)", o->name, val);
    }
    return MW_OPTS_USAGE;
}

int mw_opts_given(const struct mw_cmd_spec *spec, const char *name)
{
    if (spec != g_last_spec) return 0;
    for (int i = 0; i < spec->nopts && i < MW_MAX_OPTS; i++)
        if (!strcmp(spec->opts[i].name, name)) return g_given[i];
    return 0;
}

int mw_opts_set(const struct mw_cmd_spec *spec, const char *name, const char *value, const char *origin)
{
    int idx = -1;
    for (int k = 0; k < spec->nopts; k++)
        if (!strcmp(spec->opts[k].name, name)) { idx = k; break; }
    g_origin = origin;
    int r = idx < 0 ? bad(spec, "no option --%s%s", name, "") : set_value(spec, &spec->opts[idx], value);
    g_origin = NULL;
    if (r) return r;
    if (spec == g_last_spec && idx < MW_MAX_OPTS) g_given[idx] = 1;
    return MW_OPTS_OK;
}

int mw_opts_parse(const struct mw_cmd_spec *spec, int argc, char **argv, char **pos, int *npos)
{
    int np = 0;
    int only_pos = 0;
    g_last_spec = spec;
    memset(g_given, 0, sizeof g_given);
    for (int i = 0; i < argc; i++) {
        char *a = argv[i];
        if (!only_pos && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            mw_opts_help(spec, stdout);
            return MW_OPTS_HELP;
        }
        if (!only_pos && !strcmp(a, "--")) { only_pos = 1; continue; }
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (np >= spec->max_pos)
                return bad(spec, "unexpected argument '%s'%s", a, "");
            pos[np++] = a;
            continue;
        }
        if (a[1] != '-') return bad(spec, "unknown option '%s'%s", a, "");
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        int idx = -1;
        for (int k = 0; k < spec->nopts; k++)
            if (strlen(spec->opts[k].name) == nlen && !strncmp(spec->opts[k].name, name, nlen)) { idx = k; break; }
        if (idx < 0) return bad(spec, "unknown option '%s'%s", a, "");
        const struct mw_opt *o = &spec->opts[idx];
        const char *val = NULL;
        if (o->type == MW_OPT_FLAG) {
            if (eq) return bad(spec, "option '--%s' takes no value%s", o->name, "");
        } else if (eq) val = eq + 1;
        else {
            if (i + 1 >= argc) return bad(spec, "option '--%s' needs a value (%s)", o->name, o->metavar ? o->metavar : "");
            val = argv[++i];
        }
        int r = set_value(spec, o, val);
        if (r) return r;
        if (idx < MW_MAX_OPTS) g_given[idx] = 1;
    }
    if (np < spec->min_pos)
        return bad(spec, "missing argument: %s%s", spec->args ? spec->args : "", "");
    if (npos) *npos = np;
    return MW_OPTS_OK;
}
