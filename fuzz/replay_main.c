/*
 * replay_main.c — runs files through a harness's LLVMFuzzerTestOneInput without libFuzzer:
 * `fuzz_X_replay DIR|FILE ...` feeds every regular file (directories one level deep, sorted
 * order does not matter) and exits 0 when none crashed (a crash is the sanitizer's or the
 * kernel's abort) and none took more than 10 s (libFuzzer's timeouts are regressions too). A
 * missing directory is skipped, an empty set is an error (exit 1), so a test cannot pass by
 * replaying nothing.
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno)); return -1; }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) { cap *= 2; uint8_t *nb = realloc(buf, cap); if (!nb) { free(buf); buf = NULL; } else buf = nb; }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "replay: no memory for %s\n", path); return -1; }
    /* A copy of exactly n bytes, so ASan sees reads past the input as libFuzzer would. */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) { free(buf); return -1; }
    memcpy(exact, buf, n);
    free(buf);
    uint64_t t0 = mw_now_ns();
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    double s = (double)(mw_now_ns() - t0) * 1e-9;
    if (s > 10.0) { fprintf(stderr, "replay: %s took %.1f s (over 10 s: a hang)\n", path, s); return -1; }
    return 0;
}

int main(int argc, char **argv)
{
    int count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) continue;
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i])) return 1;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) { fprintf(stderr, "replay: cannot open %s\n", argv[i]); return 1; }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
            if (replay_file(p)) { closedir(d); return 1; }
            count++;
        }
        closedir(d);
    }
    printf("%d inputs replayed without a crash\n", count);
    return count ? 0 : 1;
}
