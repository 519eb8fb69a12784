/*
 * test_offload_equiv.c — the offload engine gives BITWISE the state of the all-in-DRAM run
 * (master, moments, scales, working copy) for every placement, subgroup size (one that splits
 * tensors, one larger than the model), buffer count and update policy on the emulated
 * accelerator; gradient accumulation over micro-steps equals one step on the summed gradients;
 * the armed (overlapped-with-backward) step equals the plain one; a one-parameter model and
 * tensors smaller than an 8-bit block work.
 */
#include "offload_util.h"
#include <errno.h>
#include <math.h>

static const char *g_dir;
static struct mw_offload_stats g_last_stats; /* of the last run() */

enum drive { PLAIN = 0, ARMED = 1, MICRO3 = 2, GRAD_ADD = 3, CALLER_ACCUM = 4 };

/* Runs `steps` steps of cfg over registry r and snapshots the committed state. */
static int run(const struct mw_offload_registry *r, struct mw_offload_config cfg, int steps, enum drive d,
               struct ou_snap *out, const char *what)
{
    uint64_t n = r->total;
    float *w = malloc(n * 4), *g = malloc(n * 4), *tmp = malloc(n * 4);
    REQUIRE(w && g && tmp);
    ou_init_weights(w, n);
    cfg.ext_weights = cfg.weights == MW_OFFLOAD_W_FP32 ? w : NULL;
    cfg.ext_grads = d == GRAD_ADD ? NULL : g;
    cfg.ext_grads_accumulate = d == CALLER_ACCUM;
    if (cfg.place.tier[MW_OFFLOAD_MASTER] == MW_TIER_NVME || cfg.place.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME)
        cfg.nvme_dir = g_dir;
    struct mw_offload *e;
    int rc = mw_offload_init(&e, r, &cfg);
    CHECK_MSG(rc == 0, "%s: init: %s", what, mw_error_msg());
    if (rc) { free(w); free(g); free(tmp); return rc; }
    if (cfg.weights != MW_OFFLOAD_W_FP32) CHECK(mw_offload_set_master(e, 0, n, w) == 0);
    for (int t = 1; t <= steps && !rc; t++) {
        struct mw_offload_hparams hp;
        ou_hparams(&hp, t);
        switch (d) {
        case PLAIN:
            ou_grads(g, n, t, 0);
            rc = mw_offload_step(e, &hp);
            break;
        case ARMED: /* tensors reported in reverse order, as a backward pass does */
            ou_grads(g, n, t, 0);
            rc = mw_offload_backward_begin(e, 1, &hp);
            for (int i = (int)r->n - 1; i >= 0 && !rc; i--)
                rc = mw_offload_grad_ready(e, r->tensors[i].first, r->tensors[i].numel);
            if (!rc) rc = mw_offload_backward_end(e);
            if (!rc) rc = mw_offload_step(e, NULL);
            break;
        case MICRO3: case GRAD_ADD: case CALLER_ACCUM:
            for (int m = 0; m < 3 && !rc; m++) {
                if (d == CALLER_ACCUM) {
                    ou_grads(tmp, n, t, m);
                    for (uint64_t i = 0; i < n; i++) g[i] = m ? g[i] + tmp[i] : tmp[i];
                } else ou_grads(d == GRAD_ADD ? tmp : g, n, t, m);
                rc = mw_offload_backward_begin(e, m == 2, NULL);
                if (!rc && d == GRAD_ADD) rc = mw_offload_grad_add(e, 0, n, tmp);
                if (!rc && d == MICRO3 && n > 1) rc = mw_offload_grad_ready(e, 0, n / 2); /* rest: backward_end */
                if (!rc) rc = mw_offload_backward_end(e);
            }
            if (!rc) rc = mw_offload_step(e, &hp);
            break;
        }
        CHECK_MSG(rc == 0, "%s: step %d: %s", what, t, mw_error_msg());
    }
    if (!rc) CHECK_EQ_INT(mw_offload_committed_steps(e), steps);
    ou_snap_take(e, cfg.moments, n, out);
    mw_offload_stats_get(e, &g_last_stats);
    mw_offload_free(e);
    free(w); free(g); free(tmp);
    return rc;
}

/* Reference: one micro-step per step on the sum ((g0 + g1) + g2), everything in DRAM. */
static void run_summed_reference(const struct mw_offload_registry *r, struct mw_offload_config cfg, int steps,
                                 struct ou_snap *out)
{
    uint64_t n = r->total;
    float *w = malloc(n * 4), *g = malloc(n * 4), *tmp = malloc(n * 4);
    REQUIRE(w && g && tmp);
    ou_init_weights(w, n);
    cfg.ext_weights = w;
    cfg.ext_grads = g;
    struct mw_offload *e;
    REQUIRE(mw_offload_init(&e, r, &cfg) == 0);
    for (int t = 1; t <= steps; t++) {
        for (int m = 0; m < 3; m++) {
            ou_grads(tmp, n, t, m);
            for (uint64_t i = 0; i < n; i++) g[i] = m ? g[i] + tmp[i] : tmp[i];
        }
        struct mw_offload_hparams hp;
        ou_hparams(&hp, t);
        CHECK(mw_offload_step(e, &hp) == 0);
    }
    ou_snap_take(e, cfg.moments, n, out);
    mw_offload_free(e);
    free(w); free(g); free(tmp);
}

static struct mw_offload_config base(uint64_t sg, int bufs, const char *place, enum mw_offload_mfmt mf)
{
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = sg;
    c.buffer_count = bufs;
    c.moments = mf;
    c.cpu_threads = 2;
    c.preread = 1; /* off by default; every NVMe configuration here runs with pre-reads between steps */
    REQUIRE(mw_offload_placement_parse(place, &c.place) == 0);
    return c;
}

static void matrix(const struct mw_offload_registry *r, enum mw_offload_mfmt mf, enum mw_offload_wfmt wf, const char *label)
{
    const int steps = 3;
    struct mw_offload_config c = base(1u << 30, 1, "all=dram", mf);
    c.weights = wf;
    struct ou_snap ref;
    REQUIRE(run(r, c, steps, PLAIN, &ref, "reference") == 0);

    static const uint64_t sizes[] = {7, 256, 300, 1u << 30};   /* 7 and 300 split tensors; 2^30 > model */
    static const int bufs[] = {1, 2, 4};
    static const char *places[] = {"optim=nvme", "master=dram,moments=nvme", "master=nvme,moments=dram", "all=dram"};
    int k = 0;
    for (size_t p = 0; p < 4; p++)
        for (size_t s = 0; s < 4; s++)
            for (size_t b = 0; b < 3; b++, k++) {
                if (p > 0 && (b != 1 || s == 0)) continue; /* full grid on the main placement only */
                if (p == 3 && s == 3) continue;
                struct mw_offload_config x = base(sizes[s], bufs[b], places[p], mf);
                x.weights = wf;
                struct ou_snap got;
                char what[160];
                snprintf(what, sizeof what, "%s: %s sg=%llu bufs=%d %s", label, places[p],
                         (unsigned long long)sizes[s], bufs[b], k % 2 ? "armed" : "plain");
                if (run(r, x, steps, k % 2 ? ARMED : PLAIN, &got, what) == 0)
                    CHECK_MSG(ou_snap_equal(&ref, &got, what), "%s: not bitwise equal to all-DRAM", what);
                ou_snap_free(&got);
            }
    /* the hybrid schedule on the emulated accelerator, every policy, DRAM and NVMe */
    static const char *pols[] = {"all-cpu", "all-device", "every-2", "every-3", "auto"};
    for (size_t p = 0; p < 5; p++)
        for (int nv = 0; nv < 2; nv++) {
            struct mw_offload_config x = base(nv ? 300 : 256, 3, nv ? "optim=nvme" : "all=dram", mf);
            x.weights = wf;
            x.use_device = 1;
            REQUIRE(mw_offload_policy_parse(pols[p], &x.policy, &x.every_k) == 0);
            if (x.policy == MW_OFFLOAD_POLICY_AUTO) { /* a profile where both engines get work */
                x.profile.cpu_params_per_s = 1e6;
                x.profile.dev_params_per_s = 1e6;
                x.profile.link_bytes_per_s = 1e9;
                x.profile.dev_latency_s = 0;
            }
            struct ou_snap got;
            char what[160];
            snprintf(what, sizeof what, "%s: hybrid %s %s", label, pols[p], nv ? "nvme" : "dram");
            if (run(r, x, steps, p % 2 ? ARMED : PLAIN, &got, what) == 0)
                CHECK_MSG(ou_snap_equal(&ref, &got, what), "%s: not bitwise equal to all-DRAM", what);
            ou_snap_free(&got);
        }
    ou_snap_free(&ref);
}

static void accumulation(const struct mw_offload_registry *r)
{
    struct mw_offload_config c = base(1u << 30, 1, "all=dram", MW_OFFLOAD_M_FP32);
    struct ou_snap ref;
    run_summed_reference(r, c, 2, &ref);
    static const enum drive ds[] = {MICRO3, GRAD_ADD, CALLER_ACCUM};
    static const char *names[] = {"engine accumulates ext_grads", "grad_add", "caller accumulates"};
    for (int i = 0; i < 3; i++)
        for (int nv = 0; nv < 2; nv++) {
            struct mw_offload_config x = base(nv ? 100 : 1u << 30, 2, nv ? "optim=nvme" : "all=dram", MW_OFFLOAD_M_FP32);
            struct ou_snap got;
            char what[128];
            snprintf(what, sizeof what, "accumulation (%s, %s)", names[i], nv ? "nvme" : "dram");
            if (run(r, x, 2, ds[i], &got, what) == 0)
                CHECK_MSG(ou_snap_equal(&ref, &got, what), "%s: differs from one step on the summed gradients", what);
            ou_snap_free(&got);
        }
    ou_snap_free(&ref);
}

/* One parameter: the engine against one direct mw_adamw_step call per step. */
static void single_parameter(void)
{
    struct mw_offload_registry r;
    int64_t one = 1;
    ou_model(&r, &one, 1);
    float w0;
    ou_init_weights(&w0, 1);
    float p = w0, m = 0, v = 0;
    struct mw_optim_format f = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE};
    for (int t = 1; t <= 3; t++) {
        float g;
        ou_grads(&g, 1, t, 0);
        struct mw_offload_hparams h;
        ou_hparams(&h, t);
        struct mw_adamw_hp hp = mw_adamw_hp_default();
        hp.lr = h.lr; hp.beta1 = h.beta1; hp.beta2 = h.beta2; hp.eps = h.eps;
        hp.weight_decay = 0; /* ou_model: a 1-D tensor does not decay */
        hp.grad_scale = h.grad_scale; hp.step = t;
        struct mw_optim_slice s = {.n = 1, .master = &p, .grad = &g, .m = &m, .v = &v};
        REQUIRE(mw_adamw_step(&f, &hp, &s, NULL) == 0);
    }
    for (int nv = 0; nv < 2; nv++) {
        struct mw_offload_config c = base(1000, 2, nv ? "optim=nvme" : "all=dram", MW_OFFLOAD_M_FP32);
        struct ou_snap got;
        if (run(&r, c, 3, nv ? ARMED : PLAIN, &got, "single parameter") == 0) {
            CHECK_MSG(!memcmp(got.raw[0], &p, 4), "single parameter (%s): master %g, direct kernel %g",
                      nv ? "nvme" : "dram", *(float *)got.raw[0], p);
            CHECK(!memcmp(got.raw[1], &m, 4) && !memcmp(got.raw[3], &v, 4));
            CHECK(!memcmp(got.weights, &p, 4));
            CHECK(p != w0);
        }
        ou_snap_free(&got);
    }
    mw_offload_registry_free(&r);
}

/* Two-phase global-norm clipping: the norm (independent of the subgroup size) first, then the
 * step with the clip factor as grad_scale; equal across placements and to a double reference. */
static void clipping(const struct mw_offload_registry *r)
{
    uint64_t n = r->total;
    struct ou_snap snaps[2];
    double norms[2];
    for (int nv = 0; nv < 2; nv++) {
        float *w = malloc(4 * n), *g = malloc(4 * n);
        REQUIRE(w && g);
        ou_init_weights(w, n);
        struct mw_offload_config c = base(nv ? 100 : 1u << 30, 2, nv ? "optim=nvme" : "all=dram", MW_OFFLOAD_M_FP32);
        c.ext_weights = w;
        c.ext_grads = g;
        if (nv) c.nvme_dir = g_dir;
        struct mw_offload *e;
        REQUIRE(mw_offload_init(&e, r, &c) == 0);
        for (int t = 1; t <= 2; t++) {
            ou_grads(g, n, t, 0);
            double ref = 0;
            for (uint64_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
            ref = sqrt(ref);
            CHECK(mw_offload_backward_begin(e, 1, NULL) == 0);
            CHECK(mw_offload_backward_end(e) == 0);
            double norm = -1;
            CHECK(mw_offload_grad_norm(e, &norm) == 0);
            CHECK_MSG(fabs(norm - ref) <= 1e-6 * ref, "norm %.9g, reference %.9g", norm, ref);
            if (t == 2) norms[nv] = norm;
            struct mw_offload_hparams hp;
            ou_hparams(&hp, t);
            hp.grad_scale = (float)fmin(1.0, 1.0 / norm); /* clip to norm 1 */
            CHECK(mw_offload_step(e, &hp) == 0);
        }
        double dummy;
        CHECK(mw_offload_grad_norm(e, &dummy) == -EINVAL); /* not between backward_end and step */
        ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &snaps[nv]);
        mw_offload_free(e);
        free(w);
        free(g);
    }
    CHECK(memcmp(&norms[0], &norms[1], sizeof(double)) == 0);
    CHECK(ou_snap_equal(&snaps[0], &snaps[1], "clipped steps, dram vs nvme"));
    ou_snap_free(&snaps[0]);
    ou_snap_free(&snaps[1]);
}

/* Checkpoint round trip: the raw state of a DRAM engine after 2 steps, written into an NVMe
 * engine with another subgroup size (and its step count set), gives the same step 3. */
static void checkpoint(const struct mw_offload_registry *r)
{
    uint64_t n = r->total;
    float *w = malloc(4 * n), *g = malloc(4 * n), *w2 = malloc(4 * n);
    REQUIRE(w && g && w2);
    ou_init_weights(w, n);
    struct mw_offload_config c = base(1u << 30, 2, "all=dram", MW_OFFLOAD_M_8BIT);
    c.ext_weights = w;
    c.ext_grads = g;
    struct mw_offload *a, *b;
    REQUIRE(mw_offload_init(&a, r, &c) == 0);
    struct mw_offload_hparams hp;
    for (int t = 1; t <= 2; t++) {
        ou_hparams(&hp, t);
        ou_grads(g, n, t, 0);
        CHECK(mw_offload_step(a, &hp) == 0);
    }
    struct ou_snap saved;
    ou_snap_take(a, MW_OFFLOAD_M_8BIT, n, &saved);
    memset(w2, 0, 4 * n);
    struct mw_offload_config c2 = base(300, 3, "optim=nvme", MW_OFFLOAD_M_8BIT);
    c2.ext_weights = w2;
    c2.ext_grads = g;
    c2.nvme_dir = g_dir;
    REQUIRE(mw_offload_init(&b, r, &c2) == 0);
    for (int reg = 0; reg < 5; reg++) CHECK(mw_offload_write_raw(b, reg, 0, n, saved.raw[reg]) == 0);
    CHECK(mw_offload_set_committed_steps(b, 2) == 0);
    CHECK(memcmp(w, w2, 4 * n) == 0); /* the master write refreshed the working copy */
    ou_hparams(&hp, 3);
    ou_grads(g, n, 3, 0);
    CHECK(mw_offload_step(a, &hp) == 0);
    CHECK(mw_offload_step(b, &hp) == 0);
    struct ou_snap sa, sb;
    ou_snap_take(a, MW_OFFLOAD_M_8BIT, n, &sa);
    ou_snap_take(b, MW_OFFLOAD_M_8BIT, n, &sb);
    CHECK(ou_snap_equal(&sa, &sb, "step 3 after a checkpoint restore"));
    CHECK_EQ_INT(mw_offload_committed_steps(b), 3);
    ou_snap_free(&saved); ou_snap_free(&sa); ou_snap_free(&sb);
    mw_offload_free(a);
    mw_offload_free(b);
    free(w); free(g); free(w2);
}

/* Pre-reads between steps: after a commit the engine reads the next step's first subgroups
 * (one per free staging buffer) while the caller computes. The step that follows uses them
 * (bitwise what the DRAM engine gives); a state written in between (a checkpoint restore) makes
 * the engine throw them away, or the step would start from the state before the restore. */
static void preread(const struct mw_offload_registry *r)
{
    uint64_t n = r->total;
    float *w = malloc(4 * n), *wb = malloc(4 * n), *g = malloc(4 * n);
    REQUIRE(w && wb && g);
    ou_init_weights(w, n);
    memcpy(wb, w, 4 * n);
    struct mw_offload_config ca = base(128, 3, "all=dram", MW_OFFLOAD_M_FP32), cb = base(128, 3, "optim=nvme", MW_OFFLOAD_M_FP32);
    ca.ext_weights = w;
    ca.ext_grads = g;
    cb.ext_weights = wb;
    cb.ext_grads = g;
    cb.nvme_dir = g_dir;
    struct mw_offload *a, *b;
    REQUIRE(mw_offload_init(&a, r, &ca) == 0);
    REQUIRE(mw_offload_init(&b, r, &cb) == 0);
    struct mw_offload_hparams hp;
    struct ou_snap s1, s2, sb;
    for (int t = 1; t <= 2; t++) {
        ou_hparams(&hp, t);
        ou_grads(g, n, t, 0);
        CHECK(mw_offload_step(a, &hp) == 0);
        CHECK(mw_offload_step(b, &hp) == 0);
        /* 895 parameters in 7 subgroups of 128, 3 buffers: 3 read ahead after each commit */
        CHECK_EQ_INT(ou_wait_prereads(b, 3 * (uint64_t)t), 3 * t);
        ou_snap_take(a, MW_OFFLOAD_M_FP32, n, t == 1 ? &s1 : &s2);
    }
    CHECK(memcmp(w, wb, 4 * n) == 0);
    /* b holds step 2's first subgroups read ahead; restore step 1 and run step 2 again */
    for (int reg = 0; reg < 5; reg++) CHECK(mw_offload_write_raw(b, reg, 0, n, s1.raw[reg]) == 0);
    CHECK(mw_offload_set_committed_steps(b, 1) == 0);
    ou_hparams(&hp, 2);
    ou_grads(g, n, 2, 0);
    CHECK(mw_offload_step(b, &hp) == 0);
    ou_snap_take(b, MW_OFFLOAD_M_FP32, n, &sb);
    CHECK(ou_snap_equal(&s2, &sb, "step 2 again after a restore with subgroups read ahead"));
    /* with pre-reads off, none */
    mw_offload_free(b);
    cb.preread = 0;
    REQUIRE(mw_offload_init(&b, r, &cb) == 0);
    CHECK(mw_offload_step(b, &hp) == 0);
    usleep(50000);
    CHECK_EQ_INT(ou_wait_prereads(b, 0), 0);
    ou_snap_free(&s1); ou_snap_free(&s2); ou_snap_free(&sb);
    mw_offload_free(a);
    mw_offload_free(b);
    free(w); free(wb); free(g);
}

/* Per-tensor weight decay: subgroups that cut across decaying and non-decaying tensors give
 * bitwise what one kernel call per tensor gives (fp32 moments). */
static void decay_runs(void)
{
    static const int64_t sizes[] = {10, 5, 7, 1, 9};
    static const unsigned flags[] = {0, MW_OFFLOAD_NO_DECAY, 0, MW_OFFLOAD_NO_DECAY, 0};
    struct mw_offload_registry r;
    mw_offload_registry_init(&r);
    for (int i = 0; i < 5; i++) {
        char name[8];
        snprintf(name, sizeof name, "x%d", i);
        REQUIRE(mw_offload_registry_add_ex(&r, name, 1, &sizes[i], flags[i]) == 0);
    }
    uint64_t n = r.total;
    float p[32], m[32] = {0}, v[32] = {0}, g[32];
    ou_init_weights(p, n);
    struct mw_optim_format f = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE};
    for (int t = 1; t <= 3; t++) {
        ou_grads(g, n, t, 0);
        struct mw_offload_hparams h;
        ou_hparams(&h, t);
        for (uint32_t i = 0; i < r.n; i++) {
            struct mw_adamw_hp hp = mw_adamw_hp_default();
            hp.lr = h.lr; hp.beta1 = h.beta1; hp.beta2 = h.beta2; hp.eps = h.eps; hp.step = t;
            hp.weight_decay = (r.tensors[i].flags & MW_OFFLOAD_NO_DECAY) ? 0 : h.weight_decay;
            hp.grad_scale = h.grad_scale;
            uint64_t a = r.tensors[i].first;
            struct mw_optim_slice s = {.n = r.tensors[i].numel, .offset = a, .master = p + a, .grad = g + a,
                                       .m = m + a, .v = v + a};
            REQUIRE(mw_adamw_step(&f, &hp, &s, NULL) == 0);
        }
    }
    for (int k = 0; k < 3; k++) {
        static const uint64_t sg[] = {4, 13, 100};
        struct mw_offload_config c = base(sg[k], 2, k == 1 ? "optim=nvme" : "all=dram", MW_OFFLOAD_M_FP32);
        c.use_device = k == 2;
        if (c.use_device) { c.policy = MW_OFFLOAD_POLICY_ALL_DEVICE; }
        struct ou_snap got;
        char what[64];
        snprintf(what, sizeof what, "decay runs, subgroups of %llu", (unsigned long long)sg[k]);
        if (run(&r, c, 3, PLAIN, &got, what) == 0) {
            CHECK_MSG(!memcmp(got.raw[0], p, 4 * n), "%s: master differs from per-tensor kernel calls", what);
            CHECK(!memcmp(got.raw[1], m, 4 * n) && !memcmp(got.raw[3], v, 4 * n));
        }
        ou_snap_free(&got);
    }
    mw_offload_registry_free(&r);

    /* the identity update.c relies on for 8-bit blocks that straddle a decay boundary: a step
     * with weight decay equals scaling by (float)(1 - lr*wd) first and stepping without it */
    enum { N = 600 };
    static float p1[N], p2[N], gq[N], ms1[3], vs1[3], ms2[3], vs2[3];
    static unsigned char m1[N], v1[N], m2[N], v2[N];
    ou_init_weights(p1, N);
    memcpy(p2, p1, sizeof p1);
    struct mw_optim_format fq = {MW_OPTIM_F32, MW_OPTIM_Q8, MW_OPTIM_NONE};
    for (int t = 1; t <= 3; t++) {
        ou_grads(gq, N, t, 0);
        struct mw_adamw_hp hp = mw_adamw_hp_default();
        hp.lr = 3e-3; hp.weight_decay = 0.1; hp.step = t;
        struct mw_optim_slice a = {.n = N, .master = p1, .grad = gq, .m = m1, .v = v1, .m_scale = ms1, .v_scale = vs1};
        struct mw_optim_slice b = {.n = N, .master = p2, .grad = gq, .m = m2, .v = v2, .m_scale = ms2, .v_scale = vs2};
        REQUIRE(mw_adamw_step(&fq, &hp, &a, NULL) == 0);
        float factor = (float)(1.0 - hp.lr * hp.weight_decay);
        for (int i = 0; i < N; i++) p2[i] *= factor;
        hp.weight_decay = 0;
        REQUIRE(mw_adamw_step(&fq, &hp, &b, NULL) == 0);
    }
    CHECK_MSG(!memcmp(p1, p2, sizeof p1), "pre-scaled decay differs from the kernel's own decay");
}

/* Subgroups larger than the update's chunk (pipeline.c FUSE_CHUNK, 2^18 elements): the update
 * runs chunk by chunk and takes the write-back's checksums as it goes, blocks straddling two
 * regions and the tails at the end. Bitwise the DRAM state, and every later read verifies
 * those checksums (a wrong one fails the step with a checksum mismatch; so does the snapshot's
 * read of the last step's state). */
static void fused_chunks(void)
{
    static const int64_t sizes[] = {300003, 5, 250002, 77, 131073}; /* decaying and not, odd ends */
    struct mw_offload_registry r;
    ou_model(&r, sizes, 5);
    static const enum mw_offload_mfmt mf[] = {MW_OFFLOAD_M_FP32, MW_OFFLOAD_M_BF16};
    static const enum mw_offload_wfmt wf[] = {MW_OFFLOAD_W_FP32, MW_OFFLOAD_W_BF16};
    for (int f = 0; f < 2; f++) {
        struct mw_offload_config c = base(1u << 30, 1, "all=dram", mf[f]);
        c.weights = wf[f];
        struct ou_snap ref;
        REQUIRE(run(&r, c, 3, PLAIN, &ref, "chunks reference") == 0);
        static const uint64_t sg[] = {1u << 30, 400000};
        static const char *places[] = {"optim=nvme", "master=dram,moments=nvme"};
        for (int k = 0; k < 2; k++)
            for (int p = 0; p < 2; p++) {
                struct mw_offload_config x = base(sg[k], 2, places[p], mf[f]);
                x.weights = wf[f];
                struct ou_snap got;
                char what[160];
                snprintf(what, sizeof what, "chunked update: %s moments, %s, subgroups of %llu", f ? "bf16" : "fp32",
                         places[p], (unsigned long long)sg[k]);
                if (run(&r, x, 3, k ? ARMED : PLAIN, &got, what) == 0) {
                    CHECK_MSG(ou_snap_equal(&ref, &got, what), "%s: not bitwise equal to all-DRAM", what);
                    /* every write-back of the 3 steps (the snapshot's reads verified the last) */
                    CHECK_MSG(g_last_stats.fused_checksums >= 3 && g_last_stats.fused_checksums % 3 == 0,
                              "%s: %llu write-backs with fused checksums", what,
                              (unsigned long long)g_last_stats.fused_checksums);
                    /* and every read of them checked by the update (MW_STORE_VERIFY_LATER) */
                    CHECK_MSG(g_last_stats.fused_verifies == g_last_stats.fused_checksums,
                              "%s: %llu reads checked by the update, %llu write-backs", what,
                              (unsigned long long)g_last_stats.fused_verifies,
                              (unsigned long long)g_last_stats.fused_checksums);
                }
                ou_snap_free(&got);
            }
        ou_snap_free(&ref);
    }
    mw_offload_registry_free(&r);
}

int main(void)
{
    g_dir = ou_scratch_dir("offload_equiv");
    /* tensors of odd sizes, several smaller than one 8-bit block (256) */
    static const int64_t sizes[] = {1, 300, 3, 7, 517, 2, 64, 1};
    struct mw_offload_registry r;
    ou_model(&r, sizes, (int)(sizeof sizes / sizeof sizes[0]));
    CHECK_EQ_INT(r.total, 895);

    matrix(&r, MW_OFFLOAD_M_FP32, MW_OFFLOAD_W_FP32, "fp32");
    matrix(&r, MW_OFFLOAD_M_BF16, MW_OFFLOAD_W_BF16, "bf16 moments, bf16 weights");
    matrix(&r, MW_OFFLOAD_M_8BIT, MW_OFFLOAD_W_FP16, "8-bit moments, fp16 weights");
    matrix(&r, MW_OFFLOAD_M_BF16_SR, MW_OFFLOAD_W_FP32, "bf16 stochastic-rounding moments");
    accumulation(&r);
    clipping(&r);
    checkpoint(&r);
    preread(&r);
    decay_runs();
    single_parameter();
    fused_chunks();

    mw_offload_registry_free(&r);
    tu_rm_rf(g_dir);
    TEST_END();
}
