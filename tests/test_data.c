/* test_data.c — the data loader: shard round trip (uint16 and uint32 shards), corrupt shards of
 * both kinds, text tokenization,
 * seeded batches, a validation split disjoint from every training window, and paths that are
 * not regular files (a FIFO with a writer, /dev/zero, a FIFO inside a data directory): refused
 * by name, never waited on — an alarm turns a hang into a failure. */
#include "memwall/data.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

static char g_dir[400];

static const char *path_in(const char *name)
{
    static char p[4][640];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

static void write_file(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(buf, 1, n, f) == n);
    fclose(f);
}

static void *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc(*n + 1);
    REQUIRE(b && fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}

static void test_shard_round_trip(void)
{
    enum { N = 5000 };
    static uint16_t tok[N];
    uint64_t s = 7;
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(tu_rand(&s) % 50257);
    tok[123] = 50256;
    const char *p = path_in("rt.bin");
    CHECK_EQ_INT(mw_shard_write(p, tok, N), 0);
    size_t len;
    uint8_t *raw = read_file(p, &len);
    CHECK_EQ_INT(len, MW_SHARD_HEADER_BYTES + 2 * N);
    int32_t h[3];
    memcpy(h, raw, sizeof h);
    CHECK_EQ_INT(h[0], 20240520);
    CHECK_EQ_INT(h[1], 1);
    CHECK_EQ_INT(h[2], N);
    free(raw);

    struct mw_data d;
    REQUIRE(mw_data_open(&d, p, NULL) == 0);
    CHECK_EQ_INT(d.tokenizer, MW_TOKENIZER_IDS);
    CHECK_EQ_INT(d.nseg, 1);
    CHECK_EQ_INT(d.n_tokens, N);
    CHECK_EQ_INT(d.max_token, 50256);
    CHECK_EQ_INT(d.n_val_tokens, 500);
    CHECK_EQ_INT(d.n_train_tokens + d.n_val_tokens, N);
    CHECK(memcmp(d.seg[0].tok, tok, sizeof tok) == 0);
    mw_data_free(&d);
}

static void expect_format_error(const char *path, const char *what)
{
    struct mw_data d;
    mw_error_clear();
    int r = mw_data_open(&d, path, NULL);
    CHECK_MSG(r == MW_EFORMAT, "%s: got %d (%s)", what, r, mw_error_msg());
    CHECK_MSG(strstr(mw_error_msg(), path) != NULL, "%s: message names no file: %s", what, mw_error_msg());
}

static void test_corrupt_shards(void)
{
    enum { N = 1000 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)i;
    const char *p = path_in("good.bin");
    REQUIRE(mw_shard_write(p, tok, N) == 0);
    size_t len;
    uint8_t *raw = read_file(p, &len);

    const char *t1 = path_in("trunc1.bin");
    write_file(t1, raw, len - 1);
    expect_format_error(t1, "data truncated by one byte");
    CHECK(strstr(mw_error_msg(), "truncated") != NULL);

    const char *t2 = path_in("trunc_hdr.bin");
    write_file(t2, raw, 100);
    expect_format_error(t2, "header truncated");

    const char *t3 = path_in("empty.bin");
    write_file(t3, raw, 0);
    expect_format_error(t3, "empty file");

    const char *t4 = path_in("long.bin");
    uint8_t *longer = calloc(len + 2, 1);
    memcpy(longer, raw, len);
    write_file(t4, longer, len + 2);
    expect_format_error(t4, "trailing bytes");
    free(longer);

    int32_t bad = 12345;
    memcpy(raw, &bad, 4);
    const char *t5 = path_in("magic.bin");
    write_file(t5, raw, len);
    expect_format_error(t5, "bad magic");

    int32_t magic = MW_SHARD_MAGIC, v2 = 2;
    memcpy(raw, &magic, 4);
    memcpy(raw + 4, &v2, 4);
    const char *t6 = path_in("v2.bin");
    write_file(t6, raw, len);
    expect_format_error(t6, "version 2");

    int32_t neg = -5;
    memcpy(raw + 4, &(int32_t){1}, 4);
    memcpy(raw + 8, &neg, 4);
    const char *t7 = path_in("negcount.bin");
    write_file(t7, raw, len);
    expect_format_error(t7, "negative count");
    free(raw);

    struct mw_data d;
    CHECK(mw_data_open(&d, path_in("does-not-exist.txt"), NULL) == -ENOENT);
}

/* Every token of the batch is where `starts` says, targets shifted by one. */
static void check_batch_matches(const struct mw_data *d, int B, int T, const int *in, const int *tg,
                                const uint64_t *st)
{
    for (int b = 0; b < B; b++) {
        int i = 0;
        while (st[b] >= d->seg[i].base + d->seg[i].n) i++;
        const uint16_t *w = d->seg[i].tok + (st[b] - d->seg[i].base);
        for (int t = 0; t < T; t++) {
            if (in[b * T + t] != w[t] || tg[b * T + t] != w[t + 1]) {
                CHECK_MSG(0, "batch row %d differs from the data at %llu", b, (unsigned long long)st[b]);
                return;
            }
        }
    }
}

static void test_text_and_batches(void)
{
    /* A text file of 20000 bytes: EOT + bytes = 20001 tokens, last 2000 (rounded) are validation. */
    enum { NB = 20000, B = 8, T = 16 };
    static uint8_t text[NB];
    uint64_t s = 99;
    for (int i = 0; i < NB; i++) text[i] = (uint8_t)(32 + tu_rand(&s) % 95);
    const char *p = path_in("corpus.txt");
    write_file(p, text, NB);
    struct mw_data d;
    REQUIRE(mw_data_open(&d, p, NULL) == 0);
    CHECK_EQ_INT(d.tokenizer, MW_TOKENIZER_BYTES);
    CHECK_EQ_INT(d.n_tokens, NB + 1);
    CHECK_EQ_INT(d.seg[0].tok[0], MW_TOK_EOT);
    CHECK_EQ_INT(d.seg[0].tok[1], text[0]);
    CHECK_EQ_INT(d.seg[0].tok[NB], text[NB - 1]);
    CHECK_EQ_INT(d.n_val_tokens, 2000);
    REQUIRE(mw_data_check(&d, T) == 0);
    uint64_t boundary = d.seg[0].train_end;
    CHECK_EQ_INT(mw_data_train_windows(&d, T), boundary - T);
    CHECK_EQ_INT(mw_data_val_windows(&d, T), 2000 / (T + 1));

    int in1[B * T], tg1[B * T], in2[B * T], tg2[B * T];
    uint64_t st1[B], st2[B];
    /* Same seed: the same batches, batch after batch; a different seed: different ones. */
    uint64_t r1 = 42, r2 = 42, r3 = 43;
    int same = 1;
    for (int k = 0; k < 5; k++) {
        mw_data_train_batch(&d, &r1, B, T, in1, tg1, st1);
        mw_data_train_batch(&d, &r2, B, T, in2, tg2, st2);
        same &= !memcmp(in1, in2, sizeof in1) && !memcmp(tg1, tg2, sizeof tg1) && !memcmp(st1, st2, sizeof st1);
        check_batch_matches(&d, B, T, in1, tg1, st1);
    }
    CHECK(same);
    CHECK(r1 == r2);
    mw_data_train_batch(&d, &r3, B, T, in2, tg2, st2);
    CHECK(memcmp(st1, st2, sizeof st1) != 0);

    /* No training window reaches into the validation part; the windows spread over the
     * whole training part (both the first and the last tenth are hit). */
    uint64_t r = 1, lo = UINT64_MAX, hi = 0;
    int bad = 0;
    for (int k = 0; k < 20000 / B; k++) {
        mw_data_train_batch(&d, &r, B, T, in1, tg1, st1);
        for (int b = 0; b < B; b++) {
            bad += st1[b] + T >= boundary;
            lo = MW_MIN(lo, st1[b]);
            hi = MW_MAX(hi, st1[b]);
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(lo < boundary / 10);
    CHECK(hi > boundary - boundary / 10);

    /* Validation windows: inside the validation part, fixed, non-overlapping, wrapping. */
    uint64_t nv = mw_data_val_windows(&d, T);
    for (uint64_t k = 0; k < nv / B + 2; k++) {
        mw_data_val_batch(&d, k, B, T, in1, tg1, st1);
        mw_data_val_batch(&d, k, B, T, in2, tg2, st2);
        CHECK(!memcmp(in1, in2, sizeof in1) && !memcmp(st1, st2, sizeof st1));
        check_batch_matches(&d, B, T, in1, tg1, st1);
        for (int b = 0; b < B; b++) {
            CHECK(st1[b] >= boundary);
            CHECK(st1[b] + T < d.n_tokens);
            CHECK_EQ_INT(st1[b], boundary + ((k * B + (uint64_t)b) % nv) * (T + 1));
        }
    }
    CHECK(mw_data_check(&d, 2000) == -EINVAL); /* validation part too small for T = 2000 */
    mw_data_free(&d);
}

static void test_directory(void)
{
    /* llm.c layout: *_train_* and *_val_* shards in one directory. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/shards", g_dir);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    REQUIRE(system(cmd) == 0);
    uint16_t a[300], b[200], c[100];
    for (int i = 0; i < 300; i++) a[i] = 1;
    for (int i = 0; i < 200; i++) b[i] = 2;
    for (int i = 0; i < 100; i++) c[i] = 3;
    char p[700];
    snprintf(p, sizeof p, "%s/tiny_train_000001.bin", dir); REQUIRE(mw_shard_write(p, a, 300) == 0);
    snprintf(p, sizeof p, "%s/tiny_train_000002.bin", dir); REQUIRE(mw_shard_write(p, b, 200) == 0);
    snprintf(p, sizeof p, "%s/tiny_val_000000.bin", dir); REQUIRE(mw_shard_write(p, c, 100) == 0);
    struct mw_data d;
    REQUIRE(mw_data_open(&d, dir, NULL) == 0);
    CHECK_EQ_INT(d.nseg, 3);
    CHECK_EQ_INT(d.n_train_tokens, 500);
    CHECK_EQ_INT(d.n_val_tokens, 100);
    CHECK_EQ_INT(d.max_token, 3);
    enum { B = 4, T = 9 };
    int in[B * T], tg[B * T];
    uint64_t st[B], r = 5;
    int seen1 = 0, seen2 = 0;
    for (int k = 0; k < 50; k++) {
        mw_data_train_batch(&d, &r, B, T, in, tg, st);
        for (int i = 0; i < B * T; i++) { CHECK(in[i] != 3); seen1 |= in[i] == 1; seen2 |= in[i] == 2; }
    }
    CHECK(seen1 && seen2);
    mw_data_val_batch(&d, 0, B, T, in, tg, st);
    for (int i = 0; i < B * T; i++) CHECK_EQ_INT(in[i], 3);
    mw_data_free(&d);

    /* A directory mixing text and shards is refused. */
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    write_file(p, "hello", 5);
    CHECK(mw_data_open(&d, dir, NULL) == -EINVAL);
    CHECK(strstr(mw_error_msg(), "mixes") != NULL);
}

static void on_alarm(int sig)
{
    static const char m[] = "test_data: FAIL: mw_data_open hung on a FIFO or a device (alarm after 20 s)\n";
    _exit(write(2, m, sizeof m - 1) < 0 ? 2 : sig);
}

static void expect_refused(const char *path, const char *kind, const char *what)
{
    struct mw_data d;
    mw_error_clear();
    int r = mw_data_open(&d, path, NULL);
    CHECK_MSG(r == -EINVAL, "%s: got %d (%s)", what, r, mw_error_msg());
    CHECK_MSG(strstr(mw_error_msg(), path) && strstr(mw_error_msg(), kind), "%s: message lacks \"%s\" or \"%s\": %s",
              what, path, kind, mw_error_msg());
    if (r == 0) mw_data_free(&d);
}

/* A FIFO as the data (the issue: it hung, opened once to sniff the magic and again to read),
 * a character device, and a FIFO among the files of a directory: each refused with the path and
 * what it is. Regular files through a symbolic link and a directory with a sub-directory still
 * open. */
static void test_not_regular(void)
{
    signal(SIGALRM, on_alarm);
    alarm(20);
    const char *fifo = path_in("stream.txt");
    REQUIRE(mkfifo(fifo, 0600) == 0);
    pid_t w = fork();
    REQUIRE(w >= 0);
    if (w == 0) { /* a writer, as `--data <(zcat corpus.gz)` has one */
        signal(SIGPIPE, SIG_DFL);
        int fd = open(fifo, O_WRONLY);
        static const char text[] = "In the beginning God created the heaven and the earth.\n";
        for (int i = 0; fd >= 0 && i < 1000; i++)
            if (write(fd, text, sizeof text - 1) < 0) break;
        _exit(0);
    }
    expect_refused(fifo, "FIFO", "FIFO with a writer");
    kill(w, SIGKILL); /* blocked in open or write once the loader has gone: never reads it */
    REQUIRE(waitpid(w, NULL, 0) == w);
    expect_refused(fifo, "FIFO", "FIFO without a writer");

    struct stat st;
    if (stat("/dev/zero", &st) == 0 && S_ISCHR(st.st_mode)) expect_refused("/dev/zero", "character device", "/dev/zero");
    if (stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode)) expect_refused("/dev/null", "character device", "/dev/null");

    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/mixed-kinds", g_dir);
    REQUIRE(mkdir(dir, 0755) == 0);
    snprintf(p, sizeof p, "%s/a.txt", dir);
    write_file(p, "hello, world\n", 13);
    snprintf(p, sizeof p, "%s/sub", dir);
    REQUIRE(mkdir(p, 0755) == 0); /* sub-directories are skipped */
    struct mw_data d;
    CHECK(mw_data_open(&d, dir, NULL) == 0 && d.nseg == 1 && d.n_tokens == 14);
    if (d.seg) mw_data_free(&d);
    snprintf(p, sizeof p, "%s/b.txt", dir);
    REQUIRE(mkfifo(p, 0600) == 0);
    expect_refused(p, "FIFO", "FIFO in a data directory");

    /* A symbolic link to a regular file is that file. */
    snprintf(p, sizeof p, "%s/link.txt", g_dir);
    char target[700];
    snprintf(target, sizeof target, "%s/a.txt", dir);
    REQUIRE(symlink(target, p) == 0);
    CHECK(mw_data_open(&d, p, NULL) == 0 && d.nseg == 1 && d.n_tokens == 14 && d.seg[0].tok[1] == 'h');
    if (d.seg) mw_data_free(&d);
    alarm(0);
}

static void test_decode(void)
{
    char buf[32];
    CHECK_EQ_INT(mw_tok_decode('A', buf, sizeof buf), 1);
    CHECK(buf[0] == 'A');
    mw_tok_decode(MW_TOK_EOT, buf, sizeof buf);
    CHECK(strstr(buf, "endoftext") != NULL);
    mw_tok_decode(1000, buf, sizeof buf);
    CHECK(!strcmp(buf, "<1000>"));
    uint16_t t[3];
    mw_tok_encode_bytes((const uint8_t *)"\xff" "a\n", 3, t);
    CHECK(t[0] == 255 && t[1] == 'a' && t[2] == '\n');
}

/* uint32 shards (llm.c's Llama-3 format, magic 20240801 version 7): round trip, ids above 65535
 * in batches, every header field refused when hostile, and ids past INT32_MAX. */
static void test_shard32(void)
{
    enum { N = 3000 };
    static uint32_t tok[N];
    uint64_t s = 11;
    for (int i = 0; i < N; i++) tok[i] = (uint32_t)(tu_rand(&s) % 128256);
    tok[7] = 128255;
    const char *p = path_in("wide.bin");
    CHECK_EQ_INT(mw_shard_write_ids(p, tok, N, 1), 0);
    size_t len;
    uint8_t *raw = read_file(p, &len);
    CHECK_EQ_INT(len, MW_SHARD_HEADER_BYTES + 4 * N);
    int32_t h[4];
    memcpy(h, raw, sizeof h);
    CHECK_EQ_INT(h[0], 20240801);
    CHECK_EQ_INT(h[1], 7);
    CHECK_EQ_INT(h[2], N);
    CHECK_EQ_INT(h[3], 0);
    struct mw_data d;
    REQUIRE(mw_data_open(&d, p, NULL) == 0);
    CHECK_EQ_INT(d.wide, 1);
    CHECK_EQ_INT(d.max_token, 128255);
    CHECK(d.seg[0].tok == NULL && d.seg[0].tok32 != NULL);
    CHECK(memcmp(d.seg[0].tok32, tok, sizeof tok) == 0);
    CHECK_EQ_INT(mw_data_seg_token(&d.seg[0], 7), 128255);
    enum { B = 4, T = 16 };
    int32_t in[B * T], tg[B * T];
    uint64_t rng = 3, st[B];
    mw_data_train_batch(&d, &rng, B, T, in, tg, st);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            CHECK_EQ_INT(in[b * T + t], tok[st[b] + (uint64_t)t]);
            CHECK_EQ_INT(tg[b * T + t], tok[st[b] + (uint64_t)t + 1]);
        }
    mw_data_free(&d);
    /* The uint16 writer refuses an id it cannot hold; the same ids fit a uint32 shard. */
    mw_error_clear();
    CHECK_EQ_INT(mw_shard_write_ids(path_in("narrow.bin"), tok, N, 0), -ERANGE);
    uint32_t small[3] = {1, 65535, 2};
    CHECK_EQ_INT(mw_shard_write_ids(path_in("narrow.bin"), small, 3, 0), 0);
    REQUIRE(mw_data_open(&d, path_in("narrow.bin"), NULL) == 0);
    CHECK(d.wide == 0 && d.max_token == 65535 && d.seg[0].tok[1] == 65535);
    mw_data_free(&d);

    /* Hostile headers: each field in turn. */
    int32_t v;
    const char *q = path_in("bad32.bin");
    v = 1; memcpy(raw + 4, &v, 4); write_file(q, raw, len);
    expect_format_error(q, "magic 20240801 with version 1");
    v = 7; memcpy(raw + 4, &v, 4);
    v = MW_SHARD_MAGIC; memcpy(raw, &v, 4); write_file(q, raw, len);
    expect_format_error(q, "magic 20240520 with version 7");
    v = MW_SHARD32_MAGIC; memcpy(raw, &v, 4);
    v = INT32_MAX; memcpy(raw + 8, &v, 4); write_file(q, raw, len);
    expect_format_error(q, "count INT32_MAX (8 GiB) in a small file");
    CHECK(strstr(mw_error_msg(), "truncated") != NULL);
    v = N / 2; memcpy(raw + 8, &v, 4); write_file(q, raw, len); /* the uint16 size of N tokens */
    expect_format_error(q, "count of half the tokens");
    v = -1; memcpy(raw + 8, &v, 4); write_file(q, raw, len);
    expect_format_error(q, "negative count");
    v = N; memcpy(raw + 8, &v, 4); write_file(q, raw, len - 2);
    expect_format_error(q, "truncated inside the last token");
    /* An id past INT32_MAX: counted as INT32_MAX, so the vocabulary check refuses it by size. */
    uint32_t huge = 0xfffffff0u;
    memcpy(raw + MW_SHARD_HEADER_BYTES + 4 * 5, &huge, 4);
    write_file(q, raw, len);
    REQUIRE(mw_data_open(&d, q, NULL) == 0);
    CHECK_EQ_INT(d.max_token, INT32_MAX);
    mw_data_free(&d);
    free(raw);

    /* One directory, one kind: uint16 and uint32 shards together are refused. */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/mixed", g_dir);
    REQUIRE(mkdir(dir, 0777) == 0);
    char a[800], b2[800];
    snprintf(a, sizeof a, "%s/x_train_000000.bin", dir);
    snprintf(b2, sizeof b2, "%s/x_train_000001.bin", dir);
    REQUIRE(mw_shard_write_ids(a, small, 3, 0) == 0);
    REQUIRE(mw_shard_write_ids(b2, small, 3, 1) == 0);
    mw_error_clear();
    CHECK_EQ_INT(mw_data_open(&d, dir, NULL), -EINVAL);
    CHECK(strstr(mw_error_msg(), "mixes uint16") != NULL);
}

int main(void)
{
    /* Not tu_scratch_dir(): gcc's -Wformat-truncation rejects its 600-byte command buffer
     * for a 512-byte path once it is instantiated (reported to the lead). */
    const char *b = getenv("MW_BUILD_DIR");
    snprintf(g_dir, sizeof g_dir, "%s/test-scratch/data-%d", b ? b : "/tmp", (int)getpid());
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    REQUIRE(system(cmd) == 0);
    test_shard_round_trip();
    test_corrupt_shards();
    test_shard32();
    test_text_and_batches();
    test_directory();
    test_not_regular();
    test_decode();
    tu_rm_rf(g_dir);
    TEST_END();
}
