/*
 * fuzz.h — shared by the harnesses in fuzz/: each defines LLVMFuzzerTestOneInput over one
 * loader of untrusted input, and is built twice: with libFuzzer (MEMWALL_FUZZ=ON, clang,
 * -fsanitize=fuzzer,address,undefined) to search, and with replay_main.c (any compiler) to run
 * the committed corpus and regression inputs as a CTest test, so gcc and ASan runs of the suite
 * replay every crash ever found.
 *
 * The loaders read files, so an input is written to one scratch file per process (in a mkdtemp
 * directory removed at exit) and the loader is given its path.
 */
#ifndef MEMWALL_FUZZ_H
#define MEMWALL_FUZZ_H

#include "memwall/common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fz_dir[256];

static inline void fz_cleanup(void)
{
    char cmd[300];
    if (!fz_dir[0]) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fz_dir);
    if (system(cmd) != 0) fprintf(stderr, "fuzz: could not remove %s\n", fz_dir);
}

static inline void fz_quiet(enum mw_log_level level, const char *msg, void *user)
{
    (void)level; (void)msg; (void)user;
}

/* The per-process scratch directory (created on first use; logging silenced). */
static inline const char *fz_scratch(void)
{
    if (fz_dir[0]) return fz_dir;
    const char *t = getenv("TMPDIR");
    snprintf(fz_dir, sizeof fz_dir, "%s/memwall-fuzz-XXXXXX", t && *t && strlen(t) < 200 ? t : "/tmp");
    if (!mkdtemp(fz_dir)) { perror("fuzz: mkdtemp"); abort(); }
    atexit(fz_cleanup);
    mw_log_set(fz_quiet, NULL);
    return fz_dir;
}

/* Writes data to <scratch>/name and returns its path (static storage). */
static inline const char *fz_write(const uint8_t *data, size_t size, const char *name)
{
    static char path[400];
    snprintf(path, sizeof path, "%s/%s", fz_scratch(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) { perror("fuzz: write"); abort(); }
    return path;
}

/* data as a NUL-terminated string (malloc'd; the caller frees). */
static inline char *fz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

#endif
