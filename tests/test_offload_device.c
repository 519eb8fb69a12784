/*
 * test_offload_device.c — the device table (src/offload/device.h) driven directly, once per
 * device: the emulated accelerator, the CUDA device, and the CUDA device's kernel code run on
 * the host (its arithmetic checked where there is no GPU).
 * CTest variants: emu cuda cuda_host
 *
 *  - registry: the default device, lookup by name, an unknown name refused naming the others;
 *  - memory: a device buffer counted on the device tier, copies outside it refused at once;
 *  - AdamW on a region: every state format (fp32, bf16, bf16 with stochastic rounding, 8-bit
 *    moments) with and without a bf16/fp16 weight copy, sizes that no SIMD width, warp or CUDA
 *    block divides, three steps each, state copied in on IN, updated on COMPUTE after an event,
 *    copied out on OUT after another: element by element (bitwise) the CPU kernel's results;
 *  - decay runs (a tensor without decay inside the region; with 8-bit moments a block that
 *    straddles the boundary): bitwise ofl_update on the CPU; and a region of ninety runs of
 *    mixed decay and per-tensor steps (some not stepped), more pieces and straddling blocks than
 *    one CUDA launch takes;
 *  - events: never recorded = complete, query/wait after work, completion times in queue order;
 *  - errors arrive late: a kernel that fails (an 8-bit region off its block) fails the event
 *    recorded after it on its queue, with the kernel's message, not the queue that waited for
 *    it; the next work runs; with no record after it, synchronize returns it, once;
 *  - a host callback runs after the work before it, and may query events and queue work;
 *  - the engine's side (device.c): twenty jobs submitted at once (more than the device takes, so
 *    jobs wait, slots and event sets are reused), two steps, fp32 and 8-bit moments with a bf16 weight
 *    copy, some jobs with a tensor not stepped (its weight copy stays the host's): the CPU's
 *    results, the bytes moved, the times in order; a job the device cannot
 *    queue breaks it for good: that job and the later ones fail, each handed back once.
 * Variant cuda skips (77) when the CUDA device does not open (a build without CUDA, no GPU, no
 * driver), printing why; cuda_host runs the AdamW checks (formats, runs, the refused region)
 * through ofl_cuda_adamw_host, and skips only in a build without CUDA.
 */
#include "memwall/common.h"
#include "memwall/optim.h"
#include "memwall/tier.h"
#include "offload/device_cuda.h"
#include "offload/internal.h"
#include "testutil.h"

#include <errno.h>

/* The variant: the device's registry name (NULL: its kernels on the host) and the words its
 * messages start with. */
static const char *g_dev = "emu";
static const char *g_label = "emulated accelerator";

/* Host arrays of one region, and where each sits in the device buffer. */
struct region {
    struct mw_optim_format fmt;
    size_t n, bytes[7], off[7]; /* master, grad, m, v, m_scale, v_scale, weights */
    void *a[7];
};
enum { R_MASTER, R_GRAD, R_M, R_V, R_MS, R_VS, R_W, R_N };

static void region_init(struct region *g, struct mw_optim_format fmt, size_t n, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->fmt = fmt;
    g->n = n;
    g->bytes[R_MASTER] = g->bytes[R_GRAD] = 4 * n;
    g->bytes[R_M] = g->bytes[R_V] = mw_optim_array_bytes(fmt.moments, n);
    g->bytes[R_MS] = g->bytes[R_VS] = mw_optim_scale_bytes(fmt.moments, n);
    g->bytes[R_W] = mw_optim_array_bytes(fmt.weights_out, n);
    size_t o = 0;
    for (int r = 0; r < R_N; r++) {
        g->off[r] = o;
        o += MW_ALIGN_UP(g->bytes[r], (size_t)64);
        g->a[r] = g->bytes[r] ? calloc(1, g->bytes[r]) : NULL;
        REQUIRE(!g->bytes[r] || g->a[r]);
    }
    float *p = g->a[R_MASTER], *gr = g->a[R_GRAD];
    for (size_t i = 0; i < n; i++) { p[i] = tu_randf(&seed); gr[i] = 0.1f * tu_randf(&seed); }
}

static size_t region_total(const struct region *g) { return g->off[R_W] + g->bytes[R_W] + 64; }

static void region_free(struct region *g)
{
    for (int r = 0; r < R_N; r++) free(g->a[r]);
}

static void region_copy(struct region *dst, const struct region *src)
{
    *dst = *src;
    for (int r = 0; r < R_N; r++) {
        dst->a[r] = src->bytes[r] ? malloc(src->bytes[r]) : NULL;
        if (src->bytes[r]) { REQUIRE(dst->a[r]); memcpy(dst->a[r], src->a[r], src->bytes[r]); }
    }
}

/* The slice of a region whose arrays start at base[off[r]] (host: base NULL = its own arrays). */
static struct mw_optim_slice region_slice(const struct region *g, char *base, size_t offset)
{
    void *p[R_N];
    for (int r = 0; r < R_N; r++) p[r] = !g->bytes[r] ? NULL : base ? base + g->off[r] : g->a[r];
    struct mw_optim_slice s = {g->n, offset, p[R_MASTER], p[R_GRAD], p[R_M], p[R_V], p[R_MS], p[R_VS], p[R_W]};
    return s;
}

static int regions_equal(const struct region *a, const struct region *b, const char *what, int step)
{
    for (int r = 0; r < R_N; r++) {
        if (r == R_GRAD || !a->bytes[r] || !memcmp(a->a[r], b->a[r], a->bytes[r])) continue;
        const unsigned char *x = a->a[r], *y = b->a[r];
        size_t i = 0;
        while (x[i] == y[i]) i++;
        fprintf(stderr, "%s, step %d: array %d differs first at byte %zu of %zu\n", what, step, r, i, a->bytes[r]);
        return 0;
    }
    return 1;
}

struct dev {
    const struct ofl_device_iface *dv;
    void *ctx;
    struct mw_tier *tier;
    struct ofl_dev_event *ev_in, *ev_k, *ev_out;
};

/* A device buffer for a region (variant cuda_host: none needed). */
static void buf_alloc(struct dev *d, size_t bytes, const char *label, struct mw_buf *b)
{
    memset(b, 0, sizeof *b);
    if (d->dv) REQUIRE(d->dv->alloc(d->ctx, bytes, MW_KIND_STAGING, label, b) == 0);
}

static void buf_free(struct dev *d, struct mw_buf *b)
{
    if (d->dv) d->dv->free(d->ctx, b);
}

/* One step on the device: copies in, AdamW after them, copies out after it. 0 or the error.
 * Variant cuda_host (no device): the CUDA device's AdamW run on the host, in place. */
static int dev_step(struct dev *d, struct mw_buf *buf, struct region *g, const struct mw_adamw_hp *hp,
                    size_t offset, const struct ofl_run *runs, uint32_t nruns)
{
    if (!d->dv) {
        struct ofl_dev_adamw op = {g->fmt, *hp, region_slice(g, NULL, offset), runs, nruns, 7};
        return ofl_cuda_adamw_host(&op);
    }
    const struct ofl_device_iface *dv = d->dv;
    for (int r = 0; r < R_N; r++) /* the weight copy too: a run not stepped keeps it as it was */
        if (g->bytes[r]) CHECK(dv->copy_in(d->ctx, OFL_DEVQ_IN, buf, g->off[r], g->a[r], g->bytes[r]) == 0);
    CHECK(dv->record(d->ctx, OFL_DEVQ_IN, d->ev_in) == 0);
    struct ofl_dev_adamw op = {g->fmt, *hp, region_slice(g, buf->ptr, offset), runs, nruns, 7};
    CHECK(dv->wait_event(d->ctx, OFL_DEVQ_COMPUTE, d->ev_in) == 0);
    CHECK(dv->adamw(d->ctx, OFL_DEVQ_COMPUTE, &op) == 0);
    CHECK(dv->record(d->ctx, OFL_DEVQ_COMPUTE, d->ev_k) == 0);
    CHECK(dv->wait_event(d->ctx, OFL_DEVQ_OUT, d->ev_k) == 0);
    for (int r = 0; r < R_N; r++)
        if (g->bytes[r] && r != R_GRAD) CHECK(dv->copy_out(d->ctx, OFL_DEVQ_OUT, g->a[r], buf, g->off[r], g->bytes[r]) == 0);
    CHECK(dv->record(d->ctx, OFL_DEVQ_OUT, d->ev_out) == 0);
    int rc = dv->event_wait(d->ctx, d->ev_out);
    for (int i = 0; i < 2 && !rc; i++) { /* each queue's errors are on its own records */
        int q = dv->event_query(d->ctx, i ? d->ev_k : d->ev_in);
        if (q < 0) rc = q;
        else CHECK(q == 1);
    }
    if (rc) return rc;
    CHECK(dv->event_query(d->ctx, d->ev_out) == 1);
    uint64_t ti = dv->event_time_ns(d->ctx, d->ev_in), tk = dv->event_time_ns(d->ctx, d->ev_k),
             to = dv->event_time_ns(d->ctx, d->ev_out);
    CHECK(ti > 0 && ti <= tk && tk <= to);
    return 0;
}

static struct mw_adamw_hp hp_of(int step)
{
    struct mw_adamw_hp hp = mw_adamw_hp_default();
    hp.lr = 1e-2;
    hp.weight_decay = 0.1;
    hp.step = step;
    hp.grad_scale = 0.5f;
    return hp;
}

/* Every format, weight copy and size: three steps on the device against the CPU kernel. */
static void test_formats(struct dev *d)
{
    static const enum mw_optim_dtype moments[] = {MW_OPTIM_F32, MW_OPTIM_BF16, MW_OPTIM_BF16_SR, MW_OPTIM_Q8};
    static const enum mw_optim_dtype wout[] = {MW_OPTIM_NONE, MW_OPTIM_BF16, MW_OPTIM_F16};
    /* none a multiple of 8 or 16 (SIMD), 32 (a warp) or 256 (a CUDA block, an 8-bit block) */
    static const size_t sizes[] = {1, 7, 17, 31, 33, 1003, 3 * 256 + 5, 16384 + 37};
    int cases = 0;
    for (size_t mi = 0; mi < sizeof moments / sizeof *moments; mi++)
        for (size_t wi = 0; wi < sizeof wout / sizeof *wout; wi++)
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
                struct mw_optim_format fmt = {MW_OPTIM_F32, moments[mi], wout[wi]};
                size_t n = sizes[si], offset = moments[mi] == MW_OPTIM_Q8 ? 512 : 12345;
                struct region dev, cpu;
                region_init(&dev, fmt, n, 1000 + mi * 100 + wi * 10 + si);
                region_copy(&cpu, &dev);
                struct mw_buf buf;
                buf_alloc(d, region_total(&dev), "test region", &buf);
                char what[96];
                snprintf(what, sizeof what, "moments %s, weights %s, n %zu", mw_optim_dtype_name(fmt.moments),
                         mw_optim_dtype_name(fmt.weights_out), n);
                for (int step = 1; step <= 3; step++) {
                    struct mw_adamw_hp hp = hp_of(step);
                    struct ofl_run all = {0, n, 1, 0};
                    int rc = dev_step(d, &buf, &dev, &hp, offset, &all, 1);
                    CHECK_MSG(rc == 0, "%s: %s", what, mw_error_msg());
                    struct mw_optim_slice s = region_slice(&cpu, NULL, offset);
                    CHECK_MSG(mw_adamw_step(&fmt, &hp, &s, NULL) == 0, "%s: %s", what, mw_error_msg());
                    CHECK(regions_equal(&dev, &cpu, what, step));
                    for (size_t i = 0; i < n; i++) ((float *)dev.a[R_GRAD])[i] *= -0.75f; /* new gradients */
                    memcpy(cpu.a[R_GRAD], dev.a[R_GRAD], 4 * n);
                }
                buf_free(d, &buf);
                region_free(&dev);
                region_free(&cpu);
                cases++;
            }
    CHECK_EQ_INT(cases, 4 * 3 * 8);
}

/* Runs of equal decay inside the region: the device against ofl_update on the CPU. */
static void test_runs(struct dev *d)
{
    static const enum mw_optim_dtype moments[] = {MW_OPTIM_F32, MW_OPTIM_BF16, MW_OPTIM_Q8};
    for (size_t mi = 0; mi < sizeof moments / sizeof *moments; mi++) {
        struct mw_optim_format fmt = {MW_OPTIM_F32, moments[mi], MW_OPTIM_BF16};
        /* decay [0, 300), none [300, 700), decay [700, 1000): at offset 256, the 8-bit blocks
         * [256, 512) and [512, 768) of the region straddle a boundary */
        size_t n = 1000;
        const struct ofl_run runs[3] = {{0, 300, 1, 0}, {300, 400, 0, 0}, {700, 300, 1, 0}};
        struct region dev, cpu;
        region_init(&dev, fmt, n, 77 + mi);
        region_copy(&cpu, &dev);
        struct mw_buf buf;
        buf_alloc(d, region_total(&dev), "test runs", &buf);
        for (int step = 1; step <= 2; step++) {
            struct mw_adamw_hp hp = hp_of(step);
            CHECK_MSG(dev_step(d, &buf, &dev, &hp, 256, runs, 3) == 0, "%s", mw_error_msg());
            struct mw_optim_slice s = region_slice(&cpu, NULL, 256);
            struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
            CHECK(ofl_update(&fmt, &hp, &s, runs, 3, &ex) == 0);
            CHECK(regions_equal(&dev, &cpu, mw_optim_dtype_name(fmt.moments), step));
        }
        buf_free(d, &buf);
        region_free(&dev);
        region_free(&cpu);
    }
}

/* Ninety runs of mixed decay and steps (lag 0, 1, 2 or not stepped) in a region of 40 8-bit
 * blocks and a ragged end: more pieces and straddling blocks than one CUDA launch takes
 * (device_cuda.h). With 8-bit moments the step changes only where a run starts a block (the
 * runs of one block share it, as mw_offload_set_tensor_steps requires). */
static void test_many_runs(struct dev *d)
{
    static const enum mw_optim_dtype moments[] = {MW_OPTIM_F32, MW_OPTIM_BF16_SR, MW_OPTIM_Q8};
    enum { NR = 90 };
    const size_t n = 40 * 256 + 77;
    for (size_t mi = 0; mi < sizeof moments / sizeof *moments; mi++) {
        struct mw_optim_format fmt = {MW_OPTIM_F32, moments[mi], MW_OPTIM_F16};
        int q8 = fmt.moments == MW_OPTIM_Q8;
        uint64_t seed = 4242 + mi;
        size_t cut[NR + 1];
        cut[0] = 0;
        cut[NR] = n;
        for (int i = 1; i < NR; i++) { /* increasing, every eighth on a block boundary */
            size_t lo = cut[i - 1] + 1, span = (n - lo) / (size_t)(NR - i + 1);
            cut[i] = lo + (size_t)((tu_randf(&seed) + 1.0f) * 0.5f * (float)span);
            if (i % 8 == 0) cut[i] = (cut[i] + 255) / 256 * 256;
            if (cut[i] <= cut[i - 1] || cut[i] + (size_t)(NR - i) > n) cut[i] = cut[i - 1] + 1; /* room for the rest */
        }
        struct ofl_run runs[NR];
        int64_t lag = 0;
        for (int i = 0; i < NR; i++) {
            if (!q8 || cut[i] % 256 == 0) {
                int r = (int)((tu_randf(&seed) + 1.0f) * 2.0f); /* 0..3 */
                lag = r == 3 ? OFL_LAG_SKIP : r;
            }
            runs[i] = (struct ofl_run){cut[i], cut[i + 1] - cut[i], tu_randf(&seed) > -0.2f, lag};
        }
        struct region dev, cpu;
        region_init(&dev, fmt, n, 91 + mi);
        region_copy(&cpu, &dev);
        struct mw_buf buf;
        buf_alloc(d, region_total(&dev), "test many runs", &buf);
        for (int step = 3; step <= 4; step++) {
            struct mw_adamw_hp hp = hp_of(step);
            CHECK_MSG(dev_step(d, &buf, &dev, &hp, 1024, runs, NR) == 0, "%s", mw_error_msg());
            struct mw_optim_slice s = region_slice(&cpu, NULL, 1024);
            struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
            CHECK(ofl_update(&fmt, &hp, &s, runs, NR, &ex) == 0);
            CHECK(regions_equal(&dev, &cpu, "many runs", step));
        }
        buf_free(d, &buf);
        region_free(&dev);
        region_free(&cpu);
    }
}

/* Variant cuda_host: the refused region (an 8-bit region off its block) is refused the same way. */
static void test_errors_host(struct dev *d)
{
    struct mw_optim_format fmt = {MW_OPTIM_F32, MW_OPTIM_Q8, MW_OPTIM_NONE};
    struct region g;
    region_init(&g, fmt, 600, 5);
    struct mw_adamw_hp hp = hp_of(1);
    struct ofl_run all = {0, g.n, 1, 0};
    CHECK_EQ_INT(dev_step(d, NULL, &g, &hp, 100, &all, 1), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), g_label) && strstr(mw_error_msg(), "multiple"), "%s", mw_error_msg());
    hp.step = 0;
    CHECK_EQ_INT(dev_step(d, NULL, &g, &hp, 512, &all, 1), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "step 0 < 1") != NULL, "%s", mw_error_msg());
    region_free(&g);
}

/* Late errors: they travel through events, stick until synchronize, and then go. */
static void test_errors(struct dev *d)
{
    const struct ofl_device_iface *dv = d->dv;
    struct mw_optim_format fmt = {MW_OPTIM_F32, MW_OPTIM_Q8, MW_OPTIM_NONE};
    struct region g;
    region_init(&g, fmt, 600, 5);
    struct mw_buf buf;
    REQUIRE(dv->alloc(d->ctx, region_total(&g), MW_KIND_STAGING, "test errors", &buf) == 0);
    /* refused at once: a copy past the buffer */
    CHECK_EQ_INT(dv->copy_in(d->ctx, OFL_DEVQ_IN, &buf, buf.bytes - 8, g.a[R_MASTER], 16), -EINVAL);
    CHECK(strstr(mw_error_msg(), "outside") != NULL);
    /* late: an 8-bit region that does not start on a block */
    struct mw_adamw_hp hp = hp_of(1);
    struct ofl_run all = {0, g.n, 1, 0};
    int rc = dev_step(d, &buf, &g, &hp, 100, &all, 1);
    CHECK_EQ_INT(rc, -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), g_label) != NULL, "%s", mw_error_msg());
    CHECK_EQ_INT(dv->event_query(d->ctx, d->ev_k), -EINVAL); /* recorded after the kernel, on its queue */
    CHECK_EQ_INT(dv->event_query(d->ctx, d->ev_out), 1);      /* a wait does not pass errors on */
    CHECK_EQ_INT(dv->synchronize(d->ctx), 0);                 /* the record took it */
    /* the device runs again */
    CHECK_MSG(dev_step(d, &buf, &g, &hp, 512, &all, 1) == 0, "%s", mw_error_msg());
    /* a failure that no record follows: synchronize returns it, once */
    struct ofl_dev_adamw op = {g.fmt, hp, region_slice(&g, buf.ptr, 100), &all, 1, 7};
    CHECK(dv->adamw(d->ctx, OFL_DEVQ_COMPUTE, &op) == 0);
    CHECK_EQ_INT(dv->synchronize(d->ctx), -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), g_label) != NULL, "%s", mw_error_msg());
    CHECK_EQ_INT(dv->synchronize(d->ctx), 0);
    dv->free(d->ctx, &buf);
    region_free(&g);
}

/* A host callback runs once the work before it is done, and may queue more work. */
struct cb_state { struct dev *d; int calls, saw_done, queued; };

static void host_cb(void *arg)
{
    struct cb_state *c = arg;
    c->calls++;
    c->saw_done = c->d->dv->event_query(c->d->ctx, c->d->ev_in) == 1;
    c->queued = c->d->dv->record(c->d->ctx, OFL_DEVQ_COMPUTE, c->d->ev_k) == 0;
}

static void test_host_fn(struct dev *d)
{
    const struct ofl_device_iface *dv = d->dv;
    struct cb_state c = {d, 0, 0, 0};
    float src[100], back[100];
    for (int i = 0; i < 100; i++) src[i] = (float)i;
    struct mw_buf buf;
    REQUIRE(dv->alloc(d->ctx, sizeof src, MW_KIND_STAGING, "test host_fn", &buf) == 0);
    CHECK(dv->copy_in(d->ctx, OFL_DEVQ_IN, &buf, 0, src, sizeof src) == 0);
    CHECK(dv->record(d->ctx, OFL_DEVQ_IN, d->ev_in) == 0);
    CHECK(dv->host_fn(d->ctx, OFL_DEVQ_IN, host_cb, &c) == 0);
    CHECK(dv->wait_event(d->ctx, OFL_DEVQ_OUT, d->ev_in) == 0);
    CHECK(dv->copy_out(d->ctx, OFL_DEVQ_OUT, back, &buf, 0, sizeof back) == 0);
    CHECK_EQ_INT(dv->synchronize(d->ctx), 0); /* callbacks and what they queued included */
    CHECK(c.calls == 1 && c.saw_done && c.queued);
    CHECK_EQ_INT(dv->event_query(d->ctx, d->ev_k), 1);
    CHECK(dv->event_time_ns(d->ctx, d->ev_k) >= dv->event_time_ns(d->ctx, d->ev_in));
    CHECK(!memcmp(src, back, sizeof src));
    dv->free(d->ctx, &buf);
}

/* The engine's side (device.c): more jobs than the device takes at once, submitted together;
 * each comes back (done, from the device's callback) with the CPU's results and its times in order. */
struct runner_wait { pthread_mutex_t mu; pthread_cond_t cv; int done; };

static void runner_done(struct ofl_devjob *j, void *user)
{
    struct runner_wait *w = user;
    (void)j;
    pthread_mutex_lock(&w->mu);
    w->done++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void test_runner(struct mw_tier *tier, enum mw_offload_mfmt mf)
{
    enum { NJOBS = 20 }; /* more than the device takes at once (device.c: 4) */
    struct mw_offload_config cfg;
    mw_offload_config_default(&cfg);
    cfg.moments = mf;
    cfg.weights = MW_OFFLOAD_W_BF16;
    struct mw_optim_format fmt = {MW_OPTIM_F32, ofl_mdtype(mf), MW_OPTIM_BF16};
    struct ofl_dev *d = NULL;
    CHECK_EQ_INT(ofl_dev_init(&d, "no-such-device", tier, 1 << 20, &cfg, NULL), -EINVAL);
    CHECK(d == NULL && strstr(mw_error_msg(), "emu") != NULL);
    REQUIRE(ofl_dev_init(&d, g_dev, tier, ofl_dev_job_bytes(&cfg, 1400), &cfg, NULL) == 0);
    struct region dev[NJOBS], cpu[NJOBS];
    struct ofl_devjob jobs[NJOBS];
    struct ofl_run runs[NJOBS][2]; /* decay, then none from element 500 */
    struct runner_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    for (int i = 0; i < NJOBS; i++) {
        region_init(&dev[i], fmt, 600 + 37 * (size_t)i, 300 + (uint64_t)i);
        region_copy(&cpu[i], &dev[i]);
        runs[i][0] = (struct ofl_run){0, 500, 1, 0};
        runs[i][1] = (struct ofl_run){500, dev[i].n - 500, 0, 0};
        if (mf == MW_OFFLOAD_M_FP32 && i % 5 == 3) runs[i][1].lag = OFL_LAG_SKIP; /* a tensor not stepped */
        REQUIRE(ofl_dev_pin(d, dev[i].a[R_MASTER], dev[i].bytes[R_MASTER]) == 0);
    }
    for (int step = 1; step <= 2; step++) {
        struct mw_adamw_hp hp = hp_of(step);
        for (int i = 0; i < NJOBS; i++) {
            struct ofl_devjob *j = &jobs[i];
            memset(j, 0, sizeof *j);
            j->sg = (uint32_t)i;
            j->host = region_slice(&dev[i], NULL, 2048 * (size_t)i);
            j->fmt = &fmt;
            j->hp = hp;
            j->runs = runs[i];
            j->nruns = 2;
            j->done = runner_done;
            j->user = &w;
            struct mw_optim_slice s = region_slice(&cpu[i], NULL, 2048 * (size_t)i);
            struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
            CHECK(ofl_update(&fmt, &hp, &s, runs[i], 2, &ex) == 0);
        }
        for (int i = 0; i < NJOBS; i++) ofl_dev_submit(d, &jobs[i]);
        pthread_mutex_lock(&w.mu);
        while (w.done < step * NJOBS) pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        for (int i = 0; i < NJOBS; i++) {
            const struct ofl_devjob *j = &jobs[i];
            CHECK_MSG(j->result == 0, "job %d: %s", i, j->msg);
            CHECK(regions_equal(&dev[i], &cpu[i], "runner", step));
            CHECK(j->t_queued <= j->t_h2d0 && j->t_h2d0 <= j->t_h2d1 && j->t_h2d1 <= j->t_k0 && j->t_k0 <= j->t_k1 &&
                  j->t_k1 <= j->t_d2h0 && j->t_d2h0 <= j->t_d2h1);
            uint64_t n = dev[i].n, mb = dev[i].bytes[R_M], sb = dev[i].bytes[R_MS];
            CHECK_EQ_INT(j->h2d_bytes, 8 * n + 2 * mb + 2 * sb + (runs[i][1].lag == OFL_LAG_SKIP ? 2 * n : 0));
            CHECK_EQ_INT(j->d2h_bytes, 4 * n + 2 * mb + 2 * sb + 2 * n);
            if (i) CHECK(jobs[i - 1].t_k1 <= j->t_k0); /* one compute queue, in order */
        }
        for (int i = 0; i < NJOBS; i++)
            for (size_t e = 0; e < dev[i].n; e++) ((float *)dev[i].a[R_GRAD])[e] *= -0.5f;
        for (int i = 0; i < NJOBS; i++) memcpy(cpu[i].a[R_GRAD], dev[i].a[R_GRAD], 4 * dev[i].n);
    }
    ofl_dev_free(d);
    for (int i = 0; i < NJOBS; i++) { region_free(&dev[i]); region_free(&cpu[i]); }
}

/* A job the device cannot queue (here: larger than its arena slot) breaks the device for good:
 * it and every later job come back failed, each exactly once; the job before it is fine. */
static void test_runner_broken(struct mw_tier *tier)
{
    enum { NJOBS = 5 };
    struct mw_offload_config cfg;
    mw_offload_config_default(&cfg);
    struct mw_optim_format fmt = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE};
    struct ofl_dev *d = NULL;
    REQUIRE(ofl_dev_init(&d, g_dev, tier, ofl_dev_job_bytes(&cfg, 1000), &cfg, NULL) == 0);
    struct region g[NJOBS], ref;
    struct ofl_devjob jobs[NJOBS];
    struct ofl_run runs[NJOBS];
    struct runner_wait w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct mw_adamw_hp hp = hp_of(1);
    for (int i = 0; i < NJOBS; i++) {
        region_init(&g[i], fmt, i == 1 ? 5000 : 600, 900 + (uint64_t)i);
        runs[i] = (struct ofl_run){0, g[i].n, 1, 0};
        jobs[i] = (struct ofl_devjob){.sg = (uint32_t)i, .host = region_slice(&g[i], NULL, 0), .fmt = &fmt, .hp = hp,
                                      .runs = &runs[i], .nruns = 1, .done = runner_done, .user = &w};
    }
    region_copy(&ref, &g[0]);
    for (int i = 0; i < NJOBS; i++) ofl_dev_submit(d, &jobs[i]);
    pthread_mutex_lock(&w.mu);
    while (w.done < NJOBS) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    struct mw_optim_slice s = region_slice(&ref, NULL, 0);
    CHECK(mw_adamw_step(&fmt, &hp, &s, NULL) == 0);
    CHECK_MSG(jobs[0].result == 0, "%s", jobs[0].msg);
    CHECK(regions_equal(&g[0], &ref, "the job before the broken one", 1));
    CHECK_EQ_INT(jobs[1].result, -EINVAL);
    CHECK_MSG(strstr(jobs[1].msg, "queueing an update") && strstr(jobs[1].msg, "outside"), "%s", jobs[1].msg);
    for (int i = 2; i < NJOBS; i++) {
        CHECK_EQ_INT(jobs[i].result, -EINVAL);
        CHECK_MSG(strstr(jobs[i].msg, "failed before") != NULL, "%s", jobs[i].msg);
    }
    ofl_dev_free(d);
    CHECK_EQ_INT(w.done, NJOBS); /* no job came back twice */
    for (int i = 0; i < NJOBS; i++) region_free(&g[i]);
    region_free(&ref);
}

int main(int argc, char **argv)
{
    const char *variant = argc > 1 ? argv[1] : "emu";
    CHECK(ofl_device_find(NULL) == &ofl_device_emu);
    CHECK(ofl_device_find("emu") == &ofl_device_emu);
    CHECK(ofl_device_find("cuda") == &ofl_device_cuda); /* in every build (a stand-in without nvcc) */
    CHECK(ofl_device_find("no-such-device") == NULL);
    CHECK_MSG(strstr(mw_error_msg(), "'no-such-device'") && strstr(mw_error_msg(), "emu") &&
              strstr(mw_error_msg(), "cuda"), "%s", mw_error_msg());

    struct dev d = {NULL, NULL, NULL, NULL, NULL, NULL};
    if (!strcmp(variant, "cuda_host")) { /* the CUDA kernels' code on the host: no device, no tier */
        g_dev = NULL;
        g_label = "CUDA accelerator";
        struct ofl_dev_adamw none = {{MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE}, hp_of(1), {0}, NULL, 0, 0};
        if (ofl_cuda_adamw_host(&none) == -ENOTSUP) {
            printf("SKIP: %s\n", mw_error_msg());
            SKIP("%s", mw_error_msg());
        }
        test_formats(&d);
        test_runs(&d);
        test_many_runs(&d);
        test_errors_host(&d);
        TEST_END();
    }
    if (!strcmp(variant, "cuda")) {
        g_dev = "cuda";
        g_label = "CUDA accelerator";
    } else if (strcmp(variant, "emu")) {
        fprintf(stderr, "usage: %s [emu|cuda|cuda_host]\n", argv[0]);
        return 2;
    }
    d.dv = ofl_device_find(g_dev);
    REQUIRE(d.dv != NULL);
    REQUIRE(mw_tier_init(&d.tier, MW_TIER_DEVICE, 0, NULL) == 0);
    int rc = d.dv->open(&d.ctx, d.tier, NULL);
    if (rc && strcmp(variant, "emu") && (rc == -ENODEV || rc == -ENOTSUP)) {
        printf("SKIP: the %s device does not open here: %s\n", g_dev, mw_error_msg());
        SKIP("%s", mw_error_msg());
    }
    REQUIRE(rc == 0);
    REQUIRE(d.dv->event_new(d.ctx, &d.ev_in) == 0 && d.dv->event_new(d.ctx, &d.ev_k) == 0 &&
            d.dv->event_new(d.ctx, &d.ev_out) == 0);
    CHECK_EQ_INT(d.dv->event_query(d.ctx, d.ev_in), 1); /* never recorded: complete */
    CHECK_EQ_INT(d.dv->event_wait(d.ctx, d.ev_in), 0);

    struct mw_buf b;
    REQUIRE(d.dv->alloc(d.ctx, 12345, MW_KIND_STAGING, "counted", &b) == 0);
    struct mw_tier_stats st;
    mw_tier_stats(d.tier, &st);
    CHECK(st.current >= 12345 && st.by_kind[MW_KIND_STAGING] == st.current);
    d.dv->free(d.ctx, &b);
    mw_tier_stats(d.tier, &st);
    CHECK_EQ_INT(st.current, 0);

    test_formats(&d);
    test_runs(&d);
    test_many_runs(&d);
    test_errors(&d);
    test_host_fn(&d);
    test_runner(d.tier, MW_OFFLOAD_M_FP32);
    test_runner(d.tier, MW_OFFLOAD_M_8BIT);
    test_runner_broken(d.tier);

    CHECK_EQ_INT(d.dv->synchronize(d.ctx), 0);
    d.dv->event_free(d.ctx, d.ev_in);
    d.dv->event_free(d.ctx, d.ev_k);
    d.dv->event_free(d.ctx, d.ev_out);
    d.dv->close(d.ctx);
    mw_tier_stats(d.tier, &st);
    CHECK_EQ_INT(st.current, 0);
    mw_tier_free_tier(d.tier);
    TEST_END();
}
