/*
 * test_llama_fixture.c — the Llama family against transformers (tests/fixtures/llama/, written by
 * scripts/gen_llama_fixtures.py: tiny models built by transformers from a config, the reference
 * computed in float64 on the fp32 weights).
 *
 * Three models: Llama with grouped heads (4 over 2) and a tied head (config.json in transformers
 * v5's spelling); Qwen2 with q/k/v biases (3 heads over 1); Llama with the llama3 rope scaling, an
 * untied head and 3 blocks (config.json rewritten in v4's spelling). Each is read the way a user's
 * model is (config_from_file, load_safetensors through the table) and checked:
 *   logits      max |c - ref|                                  <= 1e-4
 *   loss        |c - ref|                                      <= 1e-5
 *   gradients   per tensor: max |c - ref| / max |ref|           <= 1e-3
 *   10 losses   of torch.optim.AdamW on the batch vs memwall's mw_adamw_step   <= 1e-4 each
 * for the fast path, the scalar reference, and the fast path with recomputation.
 */
#include "memwall/llama.h"
#include "memwall/model.h"
#include "memwall/optim.h"
#include "memwall/common.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE_MSG(x, ...) do { int ok_ = !!(x); if (!ok_) { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } REQUIRE(ok_); } while (0)

struct fx {
    uint32_t B, T, V, nsteps;
    double lr, b1, b2, eps, wd;
    int32_t *inputs, *targets;
    float *logits, loss, *losses;
};

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static void load_expected(const char *dir, struct fx *x)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/expected.bin", dir);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "%s not found: it is committed; regenerate with scripts/gen_llama_fixtures.py\n", path); exit(1); }
    char magic[8], end[4];
    uint32_t h[4];
    double hp[5];
    REQUIRE(rd(f, magic, 8) && !memcmp(magic, "MWLLFX01", 8) && rd(f, h, sizeof h) && rd(f, hp, sizeof hp));
    x->B = h[0]; x->T = h[1]; x->V = h[2]; x->nsteps = h[3];
    REQUIRE(x->B > 0 && x->B < 64 && x->T > 0 && x->T < 1024 && x->V > 1 && x->V < 100000 && x->nsteps > 0 && x->nsteps < 100);
    x->lr = hp[0]; x->b1 = hp[1]; x->b2 = hp[2]; x->eps = hp[3]; x->wd = hp[4];
    size_t N = (size_t)x->B * x->T;
    x->inputs = malloc(N * 4); x->targets = malloc(N * 4); x->logits = malloc(N * x->V * 4); x->losses = malloc(x->nsteps * 4u);
    REQUIRE(x->inputs && x->targets && x->logits && x->losses);
    REQUIRE(rd(f, x->inputs, N * 4) && rd(f, x->targets, N * 4) && rd(f, x->logits, N * x->V * 4) && rd(f, &x->loss, 4) &&
            rd(f, x->losses, x->nsteps * 4u) && rd(f, end, 4) && !memcmp(end, "END!", 4));
    fclose(f);
}

static void free_expected(struct fx *x) { free(x->inputs); free(x->targets); free(x->logits); free(x->losses); }

/* Returns the worst figures through *lg, *gr, *ls. */
static void run(const char *name, const char *dir, const struct fx *x, int ref, int recompute, double *lg, double *gr, double *ls)
{
    const struct mw_net_family *fam = mw_net_family_find("llama");
    REQUIRE(fam);
    struct mw_net_config cfg = {fam, {0}};
    struct mw_net_shape none = {0};
    char wpath[1200], gpath[1200], note[512];
    snprintf(wpath, sizeof wpath, "%s/model.safetensors", dir);
    snprintf(gpath, sizeof gpath, "%s/grads.safetensors", dir);
    int err = fam->config_from_file(wpath, &none, cfg.raw, note, sizeof note);
    REQUIRE_MSG(err == 0, "%s: %s", name, mw_error_msg());
    struct mw_net_options o = {.max_batch = (int)x->B, .max_seq = 0, .recompute = recompute, .n_threads = 2};
    struct mw_net m, g;
    REQUIRE_MSG(mw_net_init(&m, &cfg, &o) == 0, "%s", mw_error_msg());
    REQUIRE(mw_net_init(&g, &cfg, &o) == 0);
    mw_llama_set_reference(&m, ref);
    REQUIRE_MSG(mw_net_load_safetensors(&m, wpath) == 0, "%s: %s", name, mw_error_msg());
    REQUIRE_MSG(mw_net_load_safetensors(&g, gpath) == 0, "%s: %s", name, mw_error_msg()); /* expected gradients */
    size_t np = m.sizes.n_params, N = (size_t)x->B * x->T;
    float *p0 = malloc(np * 4);
    REQUIRE(p0);
    memcpy(p0, m.params, np * 4);

    mw_net_zero_grad(&m);
    REQUIRE(mw_net_forward(&m, x->inputs, x->targets, (int)x->B, (int)x->T) == 0);
    const float *l = mw_net_logits(&m);
    double md = 0;
    for (size_t i = 0; i < N * x->V; i++) {
        double d = fabs((double)l[i] - x->logits[i]);
        if (!(d <= md)) md = isnan(d) ? INFINITY : d;
    }
    *lg = fmax(*lg, md);
    CHECK_MSG(md <= 1e-4, "%s ref=%d recompute=%d: logits differ by %g", name, ref, recompute, md);
    CHECK_MSG(fabs(m.loss - x->loss) <= 1e-5, "%s: loss %.7f vs %.7f", name, m.loss, x->loss);
    REQUIRE(mw_net_backward(&m, 1.0f, NULL, NULL) == 0);
    for (int i = 0; i < fam->n_tensors(&m); i++) {
        struct mw_net_tensor t;
        fam->tensor(&m, i, &t);
        double mx = 0, mr = 0;
        for (size_t j = 0; j < t.numel; j++) {
            double d = fabs((double)m.grads[t.offset + j] - g.params[t.offset + j]);
            if (!(d <= mx)) mx = isnan(d) ? INFINITY : d;
            mr = fmax(mr, fabs((double)g.params[t.offset + j]));
        }
        double rel = mx / (mr > 0 ? mr : 1.0);
        *gr = fmax(*gr, rel);
        CHECK_MSG(rel <= 1e-3, "%s ref=%d: grad %s max diff %.3g (max |ref| %.3g)", name, ref, t.name, mx, mr);
    }

    /* 10 AdamW steps on the same batch, memwall's optimizer over the flat array. */
    float *mm = calloc(np, 4), *vv = calloc(np, 4);
    REQUIRE(mm && vv);
    struct mw_optim_format fmt = {MW_OPTIM_F32, MW_OPTIM_F32, MW_OPTIM_NONE};
    struct mw_optim_exec ex = {1, MW_SIMD_AUTO, 0};
    for (uint32_t s = 0; s < x->nsteps; s++) {
        mw_net_zero_grad(&m);
        REQUIRE(mw_net_forward(&m, x->inputs, x->targets, (int)x->B, (int)x->T) == 0);
        REQUIRE(mw_net_backward(&m, 1.0f, NULL, NULL) == 0);
        double d = fabs((double)m.loss - x->losses[s]);
        *ls = fmax(*ls, d);
        CHECK_MSG(d <= 1e-4, "%s ref=%d step %u: loss %.6f vs %.6f", name, ref, s, m.loss, x->losses[s]);
        struct mw_adamw_hp hp = {x->lr, x->b1, x->b2, x->eps, x->wd, (int64_t)s + 1, 1.0f};
        struct mw_optim_slice sl = {.n = np, .offset = 0, .master = m.params, .grad = m.grads, .m = mm, .v = vv};
        REQUIRE(mw_adamw_step(&fmt, &hp, &sl, &ex) == 0);
    }
    free(mm);
    free(vv);
    free(p0);
    mw_net_free(&m);
    mw_net_free(&g);
}

int main(void)
{
    const char *src = getenv("MW_SOURCE_DIR");
    const char *names[] = {"llama_gqa_tied", "qwen2_bias", "llama3_untied"};
    for (int k = 0; k < 3; k++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/tests/fixtures/llama/%s", src ? src : ".", names[k]);
        struct fx x;
        load_expected(dir, &x);
        for (int v = 0; v < 3; v++) {
            double lg = 0, gr = 0, ls = 0;
            int ref = v == 1, rec = v == 2;
            run(names[k], dir, &x, ref, rec, &lg, &gr, &ls);
            printf("%-15s %-10s logits max abs diff %.3g, worst gradient rel diff %.3g, 10 AdamW losses max diff %.3g\n",
                   names[k], ref ? "reference" : rec ? "recompute" : "fast", lg, gr, ls);
        }
        free_expected(&x);
    }
    TEST_END();
}
