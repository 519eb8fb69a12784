/*
 * test_tier.c — tier accounting: alignment of host and I/O buffers, current/peak/per-kind
 * counters, a budget exceeded (message names tier, budget and request), accounting-only
 * reservations, a custom buffer type, and two threads racing against one budget.
 */
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "testutil.h"

#include <errno.h>
#include <pthread.h>

static void test_counters(void)
{
    struct mw_tier *host;
    REQUIRE(mw_tier_init(&host, MW_TIER_DRAM, 0, NULL) == 0);
    CHECK_EQ_INT(mw_tier_id(host), MW_TIER_DRAM);
    CHECK(mw_tier_is_host(host));
    struct mw_buf a, b;
    REQUIRE(mw_tier_alloc(host, 10000, MW_ALLOC_ZERO, MW_KIND_MASTER, "sg0.master", &a) == 0);
    CHECK((uintptr_t)a.ptr % 4096 == 0);
    CHECK_EQ_INT(a.bytes, 10000);
    CHECK_EQ_INT(a.reserved, 12288);
    CHECK(((unsigned char *)a.ptr)[9999] == 0);
    CHECK(!strcmp(a.label, "sg0.master"));
    REQUIRE(mw_tier_alloc(host, 3 << 20, MW_ALLOC_IO, MW_KIND_STAGING, "staging", &b) == 0);
    CHECK((uintptr_t)b.ptr % MW_IO_ALIGN == 0);
    CHECK_EQ_INT(b.reserved, 4 << 20);
    memset(b.ptr, 1, b.reserved); /* the whole rounded size is usable */
    struct mw_tier_stats s;
    mw_tier_stats(host, &s);
    CHECK_EQ_INT(s.current, 12288 + (4 << 20));
    CHECK_EQ_INT(s.peak, s.current);
    CHECK_EQ_INT(s.by_kind[MW_KIND_MASTER], 12288);
    CHECK_EQ_INT(s.by_kind[MW_KIND_STAGING], 4 << 20);
    CHECK_EQ_INT(s.n_allocs, 2);
    mw_tier_free(&b);
    CHECK(b.ptr == NULL);
    mw_tier_free(&b); /* freeing an empty buf is a no-op */
    mw_tier_stats(host, &s);
    CHECK_EQ_INT(s.current, 12288);
    CHECK_EQ_INT(s.peak, 12288 + (4 << 20));
    CHECK_EQ_INT(s.n_frees, 1);
    mw_tier_reset_peak(host);
    mw_tier_stats(host, &s);
    CHECK_EQ_INT(s.peak, 12288);
    mw_tier_free(&a);
    mw_tier_stats(host, &s);
    CHECK_EQ_INT(s.current, 0);
    CHECK_EQ_INT(s.by_kind[MW_KIND_MASTER], 0);
    CHECK_EQ_INT(mw_tier_alloc(host, 0, 0, MW_KIND_OTHER, "zero", &a), -EINVAL);
    mw_tier_free_tier(host);
}

static void test_budget(void)
{
    struct mw_tier *dev;
    REQUIRE(mw_tier_init(&dev, MW_TIER_DEVICE, 1 << 20, NULL) == 0);
    struct mw_buf a, b;
    REQUIRE(mw_tier_alloc(dev, 600 << 10, 0, MW_KIND_WEIGHTS, "wte", &a) == 0);
    int rc = mw_tier_alloc(dev, 500 << 10, 0, MW_KIND_ACTIVATIONS, "layer3.acts", &b);
    CHECK_EQ_INT(rc, MW_EBUDGET);
    const char *m = mw_error_msg();
    CHECK_MSG(strstr(m, "device tier") && strstr(m, "1.00 MiB") && strstr(m, "500.00 KiB") &&
              strstr(m, "600.00 KiB") && strstr(m, "layer3.acts"), "%s", m);
    CHECK(b.ptr == NULL);
    struct mw_tier_stats s;
    mw_tier_stats(dev, &s);
    CHECK_EQ_INT(s.current, 600 << 10); /* the failed request left no trace in the counters */
    REQUIRE(mw_tier_alloc(dev, 400 << 10, 0, MW_KIND_ACTIVATIONS, "fits", &b) == 0); /* exactly full */
    mw_tier_free(&b);
    mw_tier_set_budget(dev, 0);
    REQUIRE(mw_tier_alloc(dev, 8 << 20, 0, MW_KIND_ACTIVATIONS, "unlimited", &b) == 0);
    mw_tier_free(&b);
    mw_tier_free(&a);
    mw_tier_free_tier(dev);

    /* nvme: accounting only. */
    struct mw_tier *nvme;
    REQUIRE(mw_tier_init(&nvme, MW_TIER_NVME, 100 << 20, NULL) == 0);
    CHECK(!mw_tier_is_host(nvme));
    CHECK_EQ_INT(mw_tier_alloc(nvme, 4096, 0, MW_KIND_MOMENTS, "x", &a), -EINVAL);
    REQUIRE(mw_tier_reserve(nvme, 60 << 20, MW_KIND_MOMENTS, "sg1.exp_avg", &a) == 0);
    CHECK(a.ptr == NULL);
    CHECK_EQ_INT(mw_tier_reserve(nvme, 60 << 20, MW_KIND_MOMENTS, "sg1.exp_avg_sq", &b), MW_EBUDGET);
    CHECK(strstr(mw_error_msg(), "nvme tier") != NULL);
    mw_tier_free(&a);
    mw_tier_free_tier(nvme);
}

/* A custom buffer type, as a CUDA backend would supply. */
struct fake_ctx { int allocs, frees, copies; };
static const char *fk_name(void *ctx) { (void)ctx; return "fake"; }
static int fk_alloc(void *ctx, size_t bytes, size_t align, unsigned flags, void **out, unsigned *of)
{
    (void)flags;
    ((struct fake_ctx *)ctx)->allocs++;
    *of = 0;
    return posix_memalign(out, align, bytes) ? -ENOMEM : 0;
}
static void fk_free(void *ctx, void *p, size_t bytes, unsigned bf)
{
    (void)bytes; (void)bf;
    ((struct fake_ctx *)ctx)->frees++;
    free(p);
}
static size_t fk_align(void *ctx) { (void)ctx; return 256; }
static void fk_copy_in(void *ctx, void *dst, const void *src, size_t n)
{
    ((struct fake_ctx *)ctx)->copies++;
    memcpy(dst, src, n);
}
static const struct mw_buft_iface fake_iface = {.name = fk_name, .alloc = fk_alloc, .free = fk_free,
                                                .alignment = fk_align, .copy_in = fk_copy_in};

static void test_custom(void)
{
    struct fake_ctx ctx = {0, 0, 0};
    struct mw_tier *t;
    REQUIRE(mw_tier_init_custom(&t, MW_TIER_DEVICE, 0, &fake_iface, &ctx, NULL) == 0);
    CHECK(!strcmp(mw_tier_buft_name(t), "fake"));
    struct mw_buf b;
    REQUIRE(mw_tier_alloc(t, 1000, 0, MW_KIND_WEIGHTS, "w", &b) == 0);
    CHECK_EQ_INT(b.reserved, 1024);
    float src[4] = {1, 2, 3, 4}, dst[4] = {0};
    mw_tier_copy_in(&b, 16, src, sizeof src);
    mw_tier_copy_out(dst, &b, 16, sizeof dst); /* no copy_out: memcpy default */
    CHECK(!memcmp(src, dst, sizeof src));
    CHECK_EQ_INT(ctx.copies, 1);
    mw_tier_free(&b);
    CHECK_EQ_INT(ctx.allocs, 1);
    CHECK_EQ_INT(ctx.frees, 1);
    mw_tier_free_tier(t);
}

struct race { struct mw_tier *t; int ok, refused; uint64_t max_seen; };

static void *racer(void *arg)
{
    struct race *r = arg;
    struct mw_buf held[8];
    memset(held, 0, sizeof held);
    for (int i = 0; i < 2000; i++) {
        struct mw_buf *b = &held[i % 8];
        mw_tier_free(b);
        if (mw_tier_alloc(r->t, 4096 * (1 + i % 5), MW_ALLOC_NO_LOCK, MW_KIND_OTHER, "race", b) == 0) r->ok++;
        else r->refused++;
        struct mw_tier_stats s;
        mw_tier_stats(r->t, &s);
        if (s.current > r->max_seen) r->max_seen = s.current;
    }
    for (int i = 0; i < 8; i++) mw_tier_free(&held[i]);
    return NULL;
}

static void test_two_threads(void)
{
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 1 << 14) == 0);
    struct mw_tier *t;
    REQUIRE(mw_tier_init(&t, MW_TIER_DRAM, 100 << 10, tr) == 0); /* tight: forces refusals */
    struct race r[2] = {{t, 0, 0, 0}, {t, 0, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, racer, &r[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    struct mw_tier_stats s;
    mw_tier_stats(t, &s);
    CHECK_EQ_INT(s.current, 0);
    CHECK(s.peak <= 100 << 10);
    CHECK(r[0].max_seen <= 100 << 10 && r[1].max_seen <= 100 << 10);
    CHECK(r[0].refused + r[1].refused > 0);
    CHECK_EQ_INT(s.n_allocs, (uint64_t)(r[0].ok + r[1].ok));
    CHECK_EQ_INT(s.n_frees, s.n_allocs);
    struct mw_trace_stats ts;
    mw_trace_stats(tr, &ts);
    CHECK_EQ_INT(ts.recorded, s.n_allocs + s.n_frees);
    mw_tier_free_tier(t);
    mw_trace_free(tr);
}

int main(void)
{
    CHECK(!strcmp(mw_tier_name(MW_TIER_NVME), "nvme"));
    CHECK(!strcmp(mw_kind_name(MW_KIND_MOMENTS), "moments"));
    test_counters();
    test_budget();
    test_custom();
    test_two_threads();
    TEST_END();
}
