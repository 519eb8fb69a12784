/*
 * opts.h — the CLI's option tables. Every subcommand declares its options once, in one
 * table (name, type, destination, units/help, bounds); the same table parses argv and
 * prints --help, with defaults read from the destinations, so help and parser cannot drift
 * (llm.c's -pm/-pi lesson; redis config.c's table style).
 *
 * Exit-code contract for callers: mw_opts_parse returns MW_OPTS_OK, MW_OPTS_HELP (help was
 * printed to stdout: exit 0) or MW_OPTS_USAGE (a message was printed to stderr: exit 2).
 */
#ifndef MEMWALL_CLI_OPTS_H
#define MEMWALL_CLI_OPTS_H

#include <stdint.h>
#include <stdio.h>

/* Numbers are refused (exit 2, naming the option) unless whole and in range: see opts.c. */
enum mw_opt_type {
    MW_OPT_FLAG,   /* dst: int*, set to 1 when present */
    MW_OPT_INT,    /* dst: int64_t*; decimal, optional sign, no junk, no overflow */
    MW_OPT_SIZE,   /* dst: uint64_t*, bytes; accepts 4K, 1M, 2GiB, 1GB (see mw_parse_size); < 2^64 */
    MW_OPT_DOUBLE, /* dst: double*; decimal, finite (no NaN, inf, hex, overflow or underflow) */
    MW_OPT_STRING, /* dst: const char** */
    MW_OPT_CHOICE, /* dst: const char**, must be one of choices[] */
};

struct mw_opt {
    const char *name;             /* long name without the leading "--" */
    enum mw_opt_type type;
    void *dst;
    const char *metavar;          /* e.g. "BYTES", "N", "DIR" (ignored for flags) */
    const char *help;             /* one line, naming the unit */
    double min, max;              /* inclusive bounds for INT/SIZE/DOUBLE; min == max means none (any
                                     value the type holds: int64, 0..2^64-1 bytes, a finite double) */
    const char *const *choices;   /* NULL-terminated, for MW_OPT_CHOICE */
};

struct mw_cmd_spec {
    const char *name;             /* "bench io" */
    const char *args;             /* positional part of the usage line, e.g. "TRACE" or "" */
    const char *summary;          /* one paragraph */
    const struct mw_opt *opts;
    int nopts;
    int min_pos, max_pos;         /* number of positional arguments allowed */
};

enum { MW_OPTS_OK = 0, MW_OPTS_HELP = 1, MW_OPTS_USAGE = 2 };

/* Parses argv[0..argc) (argv[0] is the first argument after the subcommand name).
 * Positional arguments are returned in pos (pointing into argv), count in *npos. */
int mw_opts_parse(const struct mw_cmd_spec *spec, int argc, char **argv, char **pos, int *npos);
void mw_opts_help(const struct mw_cmd_spec *spec, FILE *f);
/* Was this option given on the command line in the last parse of its spec? */
int mw_opts_given(const struct mw_cmd_spec *spec, const char *name);
/* Sets one option as if "--name value" had been typed (same checks, same messages, prefixed
 * with origin, e.g. "ds_config.json: zero_optimization.stage"), and marks it given. For values
 * from a file (memwall train --ds-config) after mw_opts_parse of the same spec. The value
 * string must outlive the destination (string options keep the pointer). */
int mw_opts_set(const struct mw_cmd_spec *spec, const char *name, const char *value, const char *origin);

/* The same, without marking it given: a default from a file (memwall train --resume: the run's
 * record), which the command line still overrides. */
int mw_opts_set_default(const struct mw_cmd_spec *spec, const char *name, const char *value, const char *origin);

/* Library messages name settings by their config field, not by flag ("raise the DRAM budget
 * (dram_budget)"). After such a message, prints "WHO: the settings above on the command line:
 * --dram-budget (dram_budget), ..." for each field in parentheses that an option of the last
 * parsed table sets; nothing when there is none. */
void mw_opts_hint(FILE *f, const char *who, const char *msg);

#define MW_NOPTS(t) ((int)(sizeof(t) / sizeof((t)[0])))

#endif
