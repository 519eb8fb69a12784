/*
 * offload_util.h — shared by the offload tests: a small model, a runner that drives the engine
 * for several steps with deterministic gradients, and a bitwise snapshot of its state.
 */
#ifndef MEMWALL_TEST_OFFLOAD_UTIL_H
#define MEMWALL_TEST_OFFLOAD_UTIL_H

#include "memwall/common.h"
#include "memwall/offload.h"
#include "memwall/optim.h"
#include "testutil.h"

#include <unistd.h>

/* A fresh scratch directory under the build tree (tu_scratch_dir's snprintf trips gcc's
 * -Wformat-truncation at -O2 in some translation units, so the offload tests use this one). */
static inline const char *ou_scratch_dir(const char *name)
{
    static char path[256];
    const char *b = getenv("MW_BUILD_DIR");
    if (!b || strlen(b) > 160) b = "/tmp";
    snprintf(path, sizeof path, "%s/test-scratch/%.32s-%d", b, name, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", path, path);
    if (system(cmd) != 0) { fprintf(stderr, "cannot create %s\n", path); exit(1); }
    return path;
}

/* A model of tensors with the given sizes (named t0, t1, ...; sizes divisible by 3 are 2-D). */
static inline void ou_model(struct mw_offload_registry *r, const int64_t *sizes, int n)
{
    mw_offload_registry_init(r);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        int64_t shape[2] = {sizes[i], 1};
        int nd = sizes[i] % 3 == 0 ? 2 : 1; /* 1-D tensors do not decay, as GPT-2's biases */
        REQUIRE(mw_offload_registry_add_ex(r, name, nd, shape, nd == 1 ? MW_OFFLOAD_NO_DECAY : 0) == 0);
    }
}

/* Everything bitwise comparable: raw master, moments, scales, and the working copy. */
struct ou_snap {
    uint64_t n;
    unsigned char *raw[5];
    size_t rawb[5];
    float *weights;
};

static inline size_t ou_region_bytes(enum mw_offload_mfmt mf, int region, uint64_t n)
{
    enum mw_optim_dtype md = mf == MW_OFFLOAD_M_BF16 ? MW_OPTIM_BF16 : mf == MW_OFFLOAD_M_BF16_SR ? MW_OPTIM_BF16_SR
                           : mf == MW_OFFLOAD_M_8BIT ? MW_OPTIM_Q8 : MW_OPTIM_F32;
    if (region == 0) return 4 * n;
    if (region == 1 || region == 3) return mw_optim_array_bytes(md, n);
    return mw_optim_scale_bytes(md, n);
}

static inline void ou_snap_take(struct mw_offload *e, enum mw_offload_mfmt mf, uint64_t n, struct ou_snap *s)
{
    s->n = n;
    for (int r = 0; r < 5; r++) {
        s->rawb[r] = ou_region_bytes(mf, r, n);
        s->raw[r] = calloc(1, s->rawb[r] + 1);
        REQUIRE(s->raw[r]);
        int rc = mw_offload_read_raw(e, r, 0, n, s->raw[r]);
        CHECK_MSG(rc == 0, "read_raw region %d: %s", r, mw_error_msg());
    }
    s->weights = calloc(n, sizeof(float));
    REQUIRE(s->weights);
    CHECK(mw_offload_read_state(e, MW_OFFLOAD_WEIGHTS, 0, 0, n, s->weights) == 0);
}

static inline void ou_snap_free(struct ou_snap *s)
{
    for (int r = 0; r < 5; r++) free(s->raw[r]);
    free(s->weights);
    memset(s, 0, sizeof *s);
}

/* 1 when bitwise equal; prints the first difference otherwise. */
static inline int ou_snap_equal(const struct ou_snap *a, const struct ou_snap *b, const char *what)
{
    static const char *names[5] = {"master", "exp_avg", "exp_avg scales", "exp_avg_sq", "exp_avg_sq scales"};
    if (a->n != b->n) { fprintf(stderr, "%s: sizes differ\n", what); return 0; }
    for (int r = 0; r < 5; r++)
        for (size_t i = 0; i < a->rawb[r]; i++)
            if (a->raw[r][i] != b->raw[r][i]) {
                fprintf(stderr, "%s: %s differs at byte %zu\n", what, names[r], i);
                return 0;
            }
    if (memcmp(a->weights, b->weights, a->n * sizeof(float))) {
        for (uint64_t i = 0; i < a->n; i++)
            if (memcmp(&a->weights[i], &b->weights[i], 4)) {
                fprintf(stderr, "%s: working copy differs at element %llu (%g vs %g)\n", what,
                        (unsigned long long)i, a->weights[i], b->weights[i]);
                break;
            }
        return 0;
    }
    return 1;
}

/* Deterministic gradients of micro-step `micro` of step `step`. */
/* Waits (at most 10 s) until the engine has read `want` subgroups ahead between steps in all
 * (cfg.preread); returns how many it has. */
static inline uint64_t ou_wait_prereads(struct mw_offload *e, uint64_t want)
{
    struct mw_offload_stats st;
    for (int i = 0; i < 1000; i++) {
        mw_offload_stats_get(e, &st);
        if (st.prereads >= want) break;
        usleep(10000);
    }
    mw_offload_stats_get(e, &st);
    return st.prereads;
}

static inline void ou_grads(float *g, uint64_t n, int step, int micro)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step * 16 + micro + 1);
    for (uint64_t i = 0; i < n; i++) g[i] = tu_randf(&s) * (i % 5 == 0 ? 10.0f : 0.1f);
}

static inline void ou_init_weights(float *w, uint64_t n)
{
    uint64_t s = 12345;
    for (uint64_t i = 0; i < n; i++) w[i] = tu_randf(&s);
}

static inline void ou_hparams(struct mw_offload_hparams *h, int step)
{
    mw_offload_hparams_default(h);
    h->lr = 1e-2 / step;
    h->weight_decay = 0.1;
    h->grad_scale = step == 2 ? 0.5f : 1.0f;
}

#endif
