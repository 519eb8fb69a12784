/*
 * opts.c — table-driven option parsing and help (see opts.h for why).
 *
 * Numbers are hostile until checked: a value either is exactly what its type says, whole and
 * in range, or the option is refused with its name and exit 2 — never turned into something
 * else. Why each rule:
 * - DOUBLE must be finite. NaN compares false against any bound, so "--clip nan" passed the
 *   range check and silently turned clipping off; "inf" passed options with no upper bound.
 *   A value strtod only reaches by overflow or underflow (1e999, 1e-400: ERANGE) is refused
 *   too, as is a hex float ("0x1p-3"): the help documents decimal numbers, and "0x10" for a
 *   rate is a typo, not a request.
 * - INT is decimal digits with an optional sign, nothing before or after; a value past int64
 *   (strtoll's ERANGE) is refused as out of range, not clamped to INT64_MAX.
 * - SIZE goes through mw_parse_size (digits, one point, a unit; no sign, NaN, exponent or hex)
 *   whose product with the unit is checked against 2^64.
 * - Bounds: min == max means none (the type's own range), so a SIZE declared 0, 0 is "any
 *   size up to 2^64 - 1" — its meaning (0 = no limit) is the option's help text, not ours.
 * Every message names the option and quotes the value: "--clip: 'nan' is not a finite number".
 */
#include "cli/opts.h"
#include "memwall/common.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
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

/* s as printable ASCII: control and non-ASCII bytes as \xNN, cut at n - 1 bytes with "...". A
 * value typed (or read from a --ds-config file) is echoed in messages and must not put raw
 * control bytes on the user's terminal. */
static const char *printable(const char *s, char *buf, size_t n)
{
    size_t o = 0;
    for (; *s && o + 8 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7f) buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
    }
    if (*s) snprintf(buf + o, n - o, "...");
    else buf[o] = 0;
    return buf;
}

static int bad(const struct mw_cmd_spec *spec, const char *fmt, const char *a, const char *b)
{
    char pa[256], pb[256], po[700];
    fprintf(stderr, "memwall %s: ", spec->name);
    if (g_origin) fprintf(stderr, "%s: ", printable(g_origin, po, sizeof po));
    fprintf(stderr, fmt, printable(a, pa, sizeof pa), printable(b, pb, sizeof pb));
    fprintf(stderr, "\nrun 'memwall %s --help' for the options\n", spec->name);
    return MW_OPTS_USAGE;
}

static int check_bounds(const struct mw_cmd_spec *spec, const struct mw_opt *o, double v, const char *val)
{
    /* Written so that a NaN (which the parsers refuse before this) would fail it too. */
    if (o->min != o->max && !(v >= o->min && v <= o->max)) {
        char rng[96];
        snprintf(rng, sizeof rng, "%s is out of range [%g, %g]", val, o->min, o->max);
        return bad(spec, "--%s: %s", o->name, rng);
    }
    return MW_OPTS_OK;
}

/* A value past what the type holds (strtoll/strtod ERANGE): named with the option's range. */
static int out_of_range(const struct mw_cmd_spec *spec, const struct mw_opt *o, const char *val)
{
    char msg[160];
    if (o->min != o->max) snprintf(msg, sizeof msg, "%s is out of range [%g, %g]", val, o->min, o->max);
    else snprintf(msg, sizeof msg, "%s does not fit in a %s", val, o->type == MW_OPT_INT ? "64-bit integer" : "double");
    return bad(spec, "--%s: %s", o->name, msg);
}

static int parse_int(const struct mw_cmd_spec *spec, const struct mw_opt *o, const char *val)
{
    /* A digit first (after an optional sign): strtoll alone would skip leading blanks. */
    const char *d = val + (*val == '+' || *val == '-');
    if (!isdigit((unsigned char)*d)) return bad(spec, "--%s: '%s' is not an integer", o->name, val);
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (*end) return bad(spec, "--%s: '%s' is not an integer", o->name, val);
    if (errno == ERANGE) return out_of_range(spec, o, val);
    int r = check_bounds(spec, o, (double)v, val);
    if (r) return r;
    *(int64_t *)o->dst = v;
    return MW_OPTS_OK;
}

static int parse_size(const struct mw_cmd_spec *spec, const struct mw_opt *o, const char *val)
{
    uint64_t v;
    int err = mw_parse_size(val, &v);
    if (err == -ERANGE)
        return bad(spec, "--%s: '%s' is larger than 16 EiB (2^64 bytes)", o->name, val);
    if (err && val[strspn(val, " \t")] == '-')
        return bad(spec, "--%s: '%s' is negative; a size is 0 or more bytes", o->name, val);
    if (err)
        return bad(spec, "--%s: '%s' is not a size (bytes, or with K/M/G/T, KiB/MiB/GiB or KB/MB/GB)", o->name, val);
    int r = check_bounds(spec, o, (double)v, val);
    if (r) return r;
    *(uint64_t *)o->dst = v;
    return MW_OPTS_OK;
}

static int parse_double(const struct mw_cmd_spec *spec, const struct mw_opt *o, const char *val)
{
    const char *d = val + (*val == '+' || *val == '-');
    if (*d == '0' && (d[1] == 'x' || d[1] == 'X'))
        return bad(spec, "--%s: '%s' is a hexadecimal number; give it in decimal (e.g. 0.125, 1e-3)", o->name, val);
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (end == val || *end || isspace((unsigned char)*val))
        return bad(spec, "--%s: '%s' is not a number", o->name, val);
    if (!isfinite(v) && errno != ERANGE) return bad(spec, "--%s: '%s' is not a finite number", o->name, val);
    if (errno == ERANGE) {
        if (fabs(v) >= 1) return out_of_range(spec, o, val);
        return bad(spec, "--%s: '%s' is too close to 0 for a double (underflow); give 0 or a larger value",
                   o->name, val);
    }
    int r = check_bounds(spec, o, v, val);
    if (r) return r;
    *(double *)o->dst = v;
    return MW_OPTS_OK;
}

static int set_value(const struct mw_cmd_spec *spec, const struct mw_opt *o, const char *val)
{
    switch (o->type) {
    case MW_OPT_FLAG: *(int *)o->dst = 1; return MW_OPTS_OK;
    case MW_OPT_INT: return parse_int(spec, o, val);
    case MW_OPT_SIZE: return parse_size(spec, o, val);
    case MW_OPT_DOUBLE: return parse_double(spec, o, val);
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

/* An option set by name from a file's value (origin prefixes the messages); given: marked as if typed. */
static int set_named(const struct mw_cmd_spec *spec, const char *name, const char *value, const char *origin, int given)
{
    int idx = -1;
    for (int k = 0; k < spec->nopts; k++)
        if (!strcmp(spec->opts[k].name, name)) { idx = k; break; }
    g_origin = origin;
    int r = idx < 0 ? bad(spec, "no option --%s%s", name, "") : set_value(spec, &spec->opts[idx], value);
    g_origin = NULL;
    if (r) return r;
    if (given && spec == g_last_spec && idx < MW_MAX_OPTS) g_given[idx] = 1;
    return MW_OPTS_OK;
}

int mw_opts_set(const struct mw_cmd_spec *spec, const char *name, const char *value, const char *origin)
{
    return set_named(spec, name, value, origin, 1);
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

int mw_opts_set_default(const struct mw_cmd_spec *spec, const char *name, const char *value, const char *origin)
{
    return set_named(spec, name, value, origin, 0);
}

/* Library messages name a setting by its config field in parentheses ("raise the DRAM budget
 * (dram_budget)", "streamed weights (offload_params nvme)", "(ep, etp)"); the library knows no
 * flags. Here the field becomes the option of the last parsed table that sets it: the same name
 * with '-' for '_', or one of these where the CLI spells it otherwise (first one the table has). */
static const struct { const char *field, *opt; } field_opts[] = {
    {"tier", "optimizer-tier"}, {"io_block_size", "aio-block-size"}, {"io_block_size", "block-size"},
    {"vocab_size", "vocab"}, {"n_layer", "layers"}, {"n_embd", "width"}, {"max_seq_len", "context"},
    {"n_head", "heads"}, {"zero_stage", "zero"}, {"log_path", "log-json"}, {"trace_path", "trace"},
    {"data_path", "data"}, {"bare_params", "params"}, {"hierarchy", "zero-hierarchy"},
    {"policy", "offload-policy"},
};

static const char *opt_named(const struct mw_cmd_spec *spec, const char *name, size_t n)
{
    for (int k = 0; k < spec->nopts; k++)
        if (strlen(spec->opts[k].name) == n && !strncmp(spec->opts[k].name, name, n)) return spec->opts[k].name;
    return NULL;
}

static const char *opt_of_field(const struct mw_cmd_spec *spec, const char *field, size_t n)
{
    const char *o;
    for (size_t i = 0; i < sizeof field_opts / sizeof field_opts[0]; i++)
        if (strlen(field_opts[i].field) == n && !strncmp(field_opts[i].field, field, n) &&
            (o = opt_named(spec, field_opts[i].opt, strlen(field_opts[i].opt))))
            return o;
    char dashed[64];
    if (n >= sizeof dashed) return NULL;
    for (size_t i = 0; i < n; i++) dashed[i] = field[i] == '_' ? '-' : field[i];
    return opt_named(spec, dashed, n);
}

void mw_opts_hint(FILE *f, const char *who, const char *msg)
{
    const struct mw_cmd_spec *spec = g_last_spec;
    if (!spec || !msg) return;
    const char *found[8], *fields[8];
    size_t flen[8];
    int nf = 0;
    for (const char *p = strchr(msg, '('); p && nf < 8; p = strchr(p, '(')) {
        const char *end = ++p;
        while (*end && *end != ')' && *end != '(') end++;
        if (*end != ')') continue;
        /* Each item of the group, split at ',' or ';': a field is its first word, with at most
         * one more word (a value: "tier nvme", "batch 4"); longer items are prose. */
        for (const char *it = p; it < end && nf < 8;) {
            while (it < end && (*it == ' ' || *it == ',' || *it == ';')) it++;
            const char *ie = it;
            while (ie < end && *ie != ',' && *ie != ';') ie++;
            size_t wl = 0, words = 1;
            while (it + wl < ie && (islower((unsigned char)it[wl]) || isdigit((unsigned char)it[wl]) || it[wl] == '_'))
                wl++;
            for (const char *q = it; q < ie; q++) words += *q == ' ' && q + 1 < ie && q[1] != ' ';
            int word_ends = it + wl == ie || it[wl] == ' ';
            const char *o = wl && word_ends && words <= 2 ? opt_of_field(spec, it, wl) : NULL;
            for (int i = 0; o && i < nf; i++)
                if (found[i] == o) o = NULL;
            if (o) { found[nf] = o; fields[nf] = it; flen[nf] = wl; nf++; }
            it = ie;
        }
        p = end;
    }
    if (!nf) return;
    fprintf(f, "%s: the settings above on the command line:", who);
    for (int i = 0; i < nf; i++) fprintf(f, "%s --%s (%.*s)", i ? "," : "", found[i], (int)flen[i], fields[i]);
    fputc('\n', f);
}
