/*
 * cmd_bench_io.c — `memwall bench io`: sequential write then read of one file through the
 * async engine, O_DIRECT, the way the offload engine will drive it (queue_depth requests of
 * block_size bytes kept in flight, each completion resubmitting its slot at the next offset).
 *
 * Buffers are 2 MiB-aligned huge-page I/O buffers from the host tier (--no-huge shows what
 * 4 KiB pages cost on this disk). The file is preallocated first like fio's default, and
 * removed afterwards. --trace-cost measures the recorder's cost per event instead.
 */
#include "cli/commands.h"
#include "cli/opts.h"
#include "memwall/aio.h"
#include "memwall/tier.h"
#include "memwall/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct bench {
    struct mw_aio *aio;
    int fd;
    const char *path;
    uint64_t size, block;
    _Atomic uint64_t next;     /* next block index to hand out */
    struct mw_aio_req *slots;  /* [qd] */
    _Atomic int resubmit_err;  /* first failed resubmission from a callback (0: none) */
};

static void slot_done(struct mw_aio_req *r, void *user)
{
    struct bench *b = user;
    if (r->result) return; /* the failure is reported by wait_all */
    uint64_t i = atomic_fetch_add(&b->next, 1);
    if (i * b->block >= b->size) return;
    r->offset = i * b->block;
    r->len = MW_MIN(b->block, b->size - r->offset);
    int rc = mw_aio_submit(b->aio, r); /* resubmitting from the callback is allowed (aio.h) */
    int none = 0;
    if (rc) atomic_compare_exchange_strong(&b->resubmit_err, &none, rc); /* the pass reports it */
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s >= 0x20) putchar(*s);
    }
    putchar('"');
}

/* One sequential pass; returns seconds or a negative code. */
static int run_pass(struct bench *b, enum mw_aio_op op, unsigned qd, char *buf, double *secs)
{
    atomic_store(&b->next, 0);
    atomic_store(&b->resubmit_err, 0);
    uint64_t t0 = mw_now_ns();
    for (unsigned s = 0; s < qd; s++) {
        uint64_t i = atomic_fetch_add(&b->next, 1);
        if (i * b->block >= b->size) break;
        struct mw_aio_req *r = &b->slots[s];
        memset(r, 0, sizeof *r);
        r->op = op;
        r->fd = b->fd;
        r->buf = buf + (size_t)s * b->block;
        r->offset = i * b->block;
        r->len = MW_MIN(b->block, b->size - r->offset);
        r->cb = slot_done;
        r->user = b;
        r->object = "bench";
        r->path = b->path;
        int rc = mw_aio_submit(b->aio, r);
        if (rc) return rc;
    }
    int rc = mw_aio_wait_all(b->aio);
    *secs = (double)(mw_now_ns() - t0) / 1e9;
    int re = atomic_load(&b->resubmit_err);
    if (!rc && re) rc = mw_error_set(re, "resubmitting a request of %s from its callback failed: %s", b->path, mw_strerror(re));
    return rc;
}

/* ns per event: n events into a ring that wraps, from nthreads threads at once. */
struct tc_arg { struct mw_trace *tr; int n; };
static void *tc_thread(void *p)
{
    struct tc_arg *a = p;
    for (int i = 0; i < a->n; i++) {
        struct mw_trace_arg args[2] = {{"subgroup", i}, {"bytes", 4096}};
        mw_trace_span(a->tr, "bench", "span", (uint64_t)i, (uint64_t)i + 100, args, 2);
    }
    return NULL;
}

static double trace_cost(struct mw_trace *tr, int nthreads, int n)
{
    pthread_t th[2];
    struct tc_arg a = {tr, n};
    uint64_t t0 = mw_now_ns();
    for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, tc_thread, &a);
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    return (double)(mw_now_ns() - t0) / n; /* wall ns per event per thread */
}

static int run_trace_cost(int json)
{
    enum { N = 4 << 20 };
    struct mw_trace *tr;
    int rc = mw_trace_init(&tr, (size_t)1 << 20);
    if (rc) { mw_cli_fail("trace init", rc); return 1; }
    trace_cost(tr, 1, N / 4); /* touch the ring's pages once */
    double one = trace_cost(tr, 1, N), two = trace_cost(tr, 2, N / 2), off = trace_cost(NULL, 1, N);
    /* Also the I/O event as the engine emits it. */
    struct mw_trace_io io = {.op = MW_TRACE_READ, .from_tier = MW_TIER_NVME, .to_tier = MW_TIER_DRAM,
                             .bytes = 1 << 20, .queue_depth = 8, .object = "x"};
    uint64_t t0 = mw_now_ns();
    for (int i = 0; i < N; i++) { io.offset = (uint64_t)i << 20; io.submit_ns = io.complete_ns = (uint64_t)i; mw_trace_io(tr, &io); }
    double ioev = (double)(mw_now_ns() - t0) / N;
    mw_trace_free(tr);
    if (json)
        printf("{\"trace_ns_per_event\":%.2f,\"trace_ns_per_io_event\":%.2f,\"trace_ns_per_event_2threads\":%.2f,"
               "\"trace_ns_per_event_disabled\":%.2f,\"events\":%d}\n", one, ioev, two, off, N);
    else {
        printf("trace recorder cost per event (%d events, ring of 2^20 that wraps):\n", N);
        printf("  span with 2 args, 1 thread:     %6.2f ns\n", one);
        printf("  I/O event, 1 thread:            %6.2f ns\n", ioev);
        printf("  span, 2 threads at once:        %6.2f ns (wall time per event per thread)\n", two);
        printf("  disabled (NULL recorder):       %6.2f ns\n", off);
    }
    return 0;
}

/* The passes' figures: JSON or text (tow: the overwrite pass's seconds, 0 when none ran). */
static void print_result(const char *dir, int json, uint64_t size, uint64_t block, int64_t qd, const char *be, int direct,
                         int huge, double tw, double trd, double tow, struct mw_aio *aio)
{
    struct mw_aio_stats st;
    mw_aio_stats(aio, &st);
    double wbps = (double)size / tw, rbps = (double)size / trd;
    int overwrite = tow > 0;
    if (json) {
        printf("{\"dir\":");
        json_str(dir);
        printf(",\"size_bytes\":%llu,\"block_size_bytes\":%llu,\"queue_depth\":%lld,"
               "\"backend\":\"%s\",\"direct\":%s,\"huge_pages\":%s,\"write_seconds\":%.4f,\"read_seconds\":%.4f,"
               "\"write_bytes_per_s\":%.0f,\"read_bytes_per_s\":%.0f,\"max_in_flight\":%u,\"short_resubmits\":%llu,"
               "\"eagain_retries\":%llu",
               (unsigned long long)size, (unsigned long long)block, (long long)qd, be, direct ? "true" : "false",
               huge ? "true" : "false", tw, trd, wbps, rbps, st.max_in_flight,
               (unsigned long long)st.short_resubmits, (unsigned long long)st.eagain_retries);
        if (overwrite) printf(",\"overwrite_seconds\":%.4f,\"overwrite_bytes_per_s\":%.0f", tow, (double)size / tow);
        printf("}\n");
    } else {
        char s1[32], s2[32], s3[32], r1[32], r2[32];
        printf("memwall bench io: %s file in %s, %s requests, queue depth %lld, %s backend, %s, %s buffers\n",
               mw_fmt_bytes(s1, sizeof s1, size), dir, mw_fmt_bytes(s2, sizeof s2, block), (long long)qd, be,
               direct ? "O_DIRECT" : "buffered", huge ? "2 MiB huge-page" : "4 KiB-page");
        printf("  write: %s in %.3f s = %s%s\n", mw_fmt_bytes(s3, sizeof s3, size), tw, mw_fmt_rate(r1, sizeof r1, wbps),
               overwrite ? " (new extents)" : "");
        if (overwrite)
            printf("  overwrite: %s in %.3f s = %s\n", s3, tow, mw_fmt_rate(r1, sizeof r1, (double)size / tow));
        printf("  read:  %s in %.3f s = %s\n", s3, trd, mw_fmt_rate(r2, sizeof r2, rbps));
        printf("  (most requests in flight: %u; short transfers resubmitted: %llu; EAGAIN retries: %llu)\n",
               st.max_in_flight, (unsigned long long)st.short_resubmits, (unsigned long long)st.eagain_retries);
    }
}

int mw_cmd_bench_io(int argc, char **argv)
{
    const char *dir = NULL, *backend = "uring", *trace_path = NULL;
    uint64_t size = 1ull << 30, block = 1 << 20;
    int64_t qd = 32;
    int json = 0, no_huge = 0, cost = 0, overwrite = 0;
    static const char *const backends[] = {"uring", "threads", NULL};
    const struct mw_opt opts[] = {
        {"dir", MW_OPT_STRING, &dir, "DIR", "directory for the test file (required; the file is removed after)", 0, 0, NULL},
        {"size", MW_OPT_SIZE, &size, "BYTES", "file size in bytes (K/M/G suffixes)", 1 << 20, 1e15, NULL},
        {"block-size", MW_OPT_SIZE, &block, "BYTES", "bytes per request, multiple of 4 KiB", 4096, 1 << 30, NULL},
        {"queue-depth", MW_OPT_INT, &qd, "N", "requests in flight", 1, 1024, NULL},
        {"backend", MW_OPT_CHOICE, &backend, NULL, "I/O engine backend", 0, 0, backends},
        {"overwrite", MW_OPT_FLAG, &overwrite, NULL, "also time a second write pass over the written file (no new extents)", 0, 0, NULL},
        {"no-huge", MW_OPT_FLAG, &no_huge, NULL, "4 KiB-page buffers instead of 2 MiB huge pages (to compare)", 0, 0, NULL},
        {"trace", MW_OPT_STRING, &trace_path, "PATH", "record every I/O request to a Chrome/Perfetto JSON trace", 0, 0, NULL},
        {"trace-cost", MW_OPT_FLAG, &cost, NULL, "measure the trace recorder's cost per event (ns) instead of I/O", 0, 0, NULL},
        {"json", MW_OPT_FLAG, &json, NULL, "print one JSON object instead of text", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {
        "bench io", "",
        "Sequential write, then read, of one file through the async I/O engine with O_DIRECT; prints the\n"
        "throughput of each in GB/s (10^9 bytes/s). Compare with fio: bench/io_vs_fio.sh.",
        opts, MW_NOPTS(opts), 0, 0};
    int r = mw_opts_parse(&spec, argc, argv, NULL, NULL);
    if (r == MW_OPTS_HELP) return 0;
    if (r) return 2;
    if (cost) return run_trace_cost(json);
    if (!dir) {
        fprintf(stderr, "memwall bench io: --dir DIR is required\nrun 'memwall bench io --help' for the options\n");
        return 2;
    }
    if (block % 4096) {
        fprintf(stderr, "memwall bench io: --block-size must be a multiple of 4096 bytes\n");
        return 2;
    }
    size = MW_ALIGN_UP(size, block);

    int ret = 1, rc;
    struct mw_trace *tr = NULL;
    struct mw_aio *aio = NULL;
    struct mw_buf buf = {0};
    struct bench b = {0};
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/memwall-bench-io.%d.dat", dir, (int)getpid()) >= sizeof path) {
        fprintf(stderr, "memwall bench io: --dir is too long (%zu bytes)\n", strlen(dir));
        return 2;
    }
    b.fd = -1;
    if (trace_path && (rc = mw_trace_init(&tr, 0))) { mw_cli_fail("trace init", rc); goto out; }
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    if (mw_aio_backend_parse(backend, &c.backend)) { /* the option table admits only valid names */
        fprintf(stderr, "memwall bench io: --backend: %s\n", mw_error_msg());
        ret = 2;
        goto out;
    }
    c.block_size = block;
    c.queue_depth = (unsigned)qd;
    c.trace = tr;
    if ((rc = mw_aio_init(&aio, &c))) { mw_cli_fail("I/O engine init", rc); goto out; }
    unsigned flags = MW_ALLOC_IO | (no_huge ? MW_ALLOC_NO_HUGE : 0);
    if ((rc = mw_tier_alloc(NULL, (size_t)qd * block, flags, MW_KIND_STAGING, "bench io buffers", &buf))) {
        mw_cli_fail("buffer allocation", rc);
        goto out;
    }
    memset(buf.ptr, 0x5a, buf.reserved);
    int direct = 1;
    /* A fresh file, never through a symlink nor over someone's file (--dir may be shared); opened
     * once, O_DIRECT set after (a file system that refuses it has created the file already). */
    const int oflags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    b.fd = open(path, oflags, 0600);
    if (b.fd >= 0 && fcntl(b.fd, F_SETFL, fcntl(b.fd, F_GETFL) | O_DIRECT) != 0) {
        direct = 0;
        fprintf(stderr, "memwall: warning: %s refuses O_DIRECT; measuring buffered I/O (page cache dropped before the read)\n", dir);
    }
    if (b.fd < 0) {
        int e = errno;
        mw_cli_fail("bench io", mw_error_set(-e, "cannot create %s: %s", path, strerror(e)));
        goto out;
    }
    /* like fio's default fallocate=native; a file system without it (ramfs): sized, as fio's fallback */
    if (fallocate(b.fd, 0, 0, (off_t)size) && (errno != EOPNOTSUPP || ftruncate(b.fd, (off_t)size))) {
        rc = -errno;
        char s1[32];
        mw_error_set(rc, "cannot reserve %s for %s: %s", mw_fmt_bytes(s1, sizeof s1, size), path, strerror(errno));
        mw_cli_fail("bench io", rc);
        goto out;
    }
    b.aio = aio;
    b.path = path;
    b.size = size;
    b.block = block;
    b.slots = calloc((size_t)qd, sizeof *b.slots);
    if (!b.slots) { mw_error_set(-ENOMEM, "out of memory"); mw_cli_fail("bench io", -ENOMEM); goto out; }
    double tw = 0, trd = 0, tow = 0;
    if ((rc = run_pass(&b, MW_AIO_WRITE, (unsigned)qd, buf.ptr, &tw))) { mw_cli_fail("write pass", rc); goto out; }
    /* The first pass writes into fallocated (unwritten) extents, which ext4 must convert on
     * completion; the store's steady state is overwriting, which --overwrite measures. */
    if (overwrite && (rc = run_pass(&b, MW_AIO_WRITE, (unsigned)qd, buf.ptr, &tow))) {
        mw_cli_fail("overwrite pass", rc);
        goto out;
    }
    if (!direct) { /* buffered: flush, then drop the pages so the read pass reads the disk */
        if (fsync(b.fd) != 0) {
            rc = mw_error_set(-errno, "fsync of %s failed: %s", path, strerror(errno));
            mw_cli_fail("flushing before the read pass", rc);
            goto out;
        }
        int e = posix_fadvise(b.fd, 0, 0, POSIX_FADV_DONTNEED);
        if (e) fprintf(stderr, "memwall bench io: warning: cannot drop %s from the page cache (%s): the read pass "
                               "may read memory, not the disk\n", path, strerror(e));
    }
    if ((rc = run_pass(&b, MW_AIO_READ, (unsigned)qd, buf.ptr, &trd))) { mw_cli_fail("read pass", rc); goto out; }
    print_result(dir, json, size, block, qd, mw_aio_backend_name(mw_aio_backend(aio)), direct,
                 (buf.flags & MW_BUF_HUGE) != 0, tw, trd, overwrite ? tow : 0, aio);
    ret = 0;
    if (tr) {
        mw_aio_free(aio); /* quiesce the engine before writing the trace */
        aio = NULL;
        if ((rc = mw_trace_write(tr, trace_path))) { mw_cli_fail("trace write", rc); ret = 1; }
        else if (!json) printf("  trace: %s\n", trace_path);
    }
out:
    if (aio) mw_aio_free(aio);
    if (b.fd >= 0) { close(b.fd); unlink(path); }
    free(b.slots);
    mw_tier_free(&buf);
    mw_trace_free(tr);
    return ret;
}
