/*
 * test_gpt2_fixture.c — the C model against PyTorch (tests/fixtures/gpt2_tiny.bin, written by
 * scripts/gen_fixtures.py --only gpt2 with float64 arithmetic on fp32 weights).
 *
 * Compares logits, loss, every gradient tensor after one backward, and the losses of 10 AdamW
 * steps (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0, plain scalar AdamW here in the
 * test). The model is fp32 with a polynomial exp, so the tolerances are:
 *   logits        max |c - ref|                              <= 1e-4
 *   loss          |c - ref|                                  <= 1e-5
 *   gradients     per tensor: max |c - ref| / max |ref|       <= 1e-4  (and no NaN)
 *   10 losses     |c - ref|                                  <= 1e-4 each
 * (llm.c's test_gpt2.c uses 1e-2 on gradients; these are tighter because the reference is
 * float64 and the model tiny.) The run is repeated with recomputation on: same numbers.
 */
#include "memwall/gpt2.h"
#include "memwall/common.h"
#include "testutil.h"

#include <math.h>

struct fx {
    int L, NH, C, maxT, V, Vp, B, T, nsteps, n_params;
    float lr, b1, b2, eps, wd;
    float *params, *logits, loss, *grads, *losses;
    int32_t *inputs, *targets;
};

static int rd(FILE *f, void *p, size_t n)
{
    return fread(p, 1, n, f) == n;
}

static void load_fixture(struct fx *x)
{
    const char *src = getenv("MW_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/gpt2_tiny.bin", src ? src : ".");
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "fixture %s not found: it is committed; regenerate with scripts/gen_fixtures.py --only gpt2\n", path); exit(1); }
    char magic[8];
    int32_t hdr[10];
    float hp[5];
    REQUIRE(rd(f, magic, 8) && !memcmp(magic, "MWGPT2FX", 8));
    REQUIRE(rd(f, hdr, sizeof hdr) && hdr[0] == 1);
    REQUIRE(rd(f, hp, sizeof hp) && rd(f, &x->n_params, 4));
    x->L = hdr[1]; x->NH = hdr[2]; x->C = hdr[3]; x->maxT = hdr[4]; x->V = hdr[5]; x->Vp = hdr[6];
    x->B = hdr[7]; x->T = hdr[8]; x->nsteps = hdr[9];
    x->lr = hp[0]; x->b1 = hp[1]; x->b2 = hp[2]; x->eps = hp[3]; x->wd = hp[4];
    REQUIRE(x->L > 0 && x->L < 16 && x->C > 0 && x->C <= 1024 && x->V > 0 && x->V <= x->Vp &&
            x->Vp < 4096 && x->B > 0 && x->B < 64 && x->T > 0 && x->T <= x->maxT && x->maxT < 4096 &&
            x->nsteps > 0 && x->nsteps < 100 && x->n_params > 0 && x->n_params < (1 << 24));
    size_t BT = (size_t)x->B * (size_t)x->T, np = (size_t)x->n_params;
    x->params = malloc(np * 4); x->grads = malloc(np * 4);
    x->logits = malloc(BT * (size_t)x->V * 4); x->losses = malloc((size_t)x->nsteps * 4);
    x->inputs = malloc(BT * 4); x->targets = malloc(BT * 4);
    REQUIRE(x->params && x->grads && x->logits && x->losses && x->inputs && x->targets);
    char end[4];
    REQUIRE(rd(f, x->params, np * 4) && rd(f, x->inputs, BT * 4) && rd(f, x->targets, BT * 4) &&
            rd(f, x->logits, BT * (size_t)x->V * 4) && rd(f, &x->loss, 4) && rd(f, x->grads, np * 4) &&
            rd(f, x->losses, (size_t)x->nsteps * 4) && rd(f, end, 4) && !memcmp(end, "END!", 4));
    fclose(f);
}

static void run(const struct fx *x, int recompute)
{
    struct mw_gpt2_config cfg = {x->L, x->NH, x->C, x->maxT, x->V, x->Vp};
    struct mw_gpt2_options o = {.max_batch = x->B, .max_seq = x->maxT, .recompute = recompute, .n_threads = 2};
    struct mw_gpt2 m;
    REQUIRE(mw_gpt2_init(&m, &cfg, &o) == 0);
    REQUIRE(m.sizes.n_params == (size_t)x->n_params);
    memcpy(m.params, x->params, m.sizes.params_bytes);

    REQUIRE(mw_gpt2_forward(&m, x->inputs, x->targets, x->B, x->T) == 0);
    const float *lg = mw_gpt2_logits(&m);
    double maxd = 0;
    for (int r = 0; r < x->B * x->T; r++)
        for (int j = 0; j < x->V; j++) {
            double d = fabs((double)lg[(size_t)r * (size_t)x->Vp + (size_t)j] - x->logits[(size_t)r * (size_t)x->V + (size_t)j]);
            if (!(d <= maxd)) maxd = isnan(d) ? INFINITY : d;
        }
    printf("recompute=%d logits max abs diff %.3g\n", recompute, maxd);
    CHECK_MSG(maxd <= 1e-4, "logits differ by %g", maxd);
    printf("loss %.7f ref %.7f\n", m.loss, x->loss);
    CHECK_MSG(fabs(m.loss - x->loss) <= 1e-5, "loss %.7f vs %.7f", m.loss, x->loss);

    REQUIRE(mw_gpt2_backward(&m, 1.0f, NULL, NULL) == 0);
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < m.n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m.tensors[i];
        double md = 0, mr = 0;
        for (size_t j = 0; j < t->numel; j++) {
            double c = m.grads[t->offset + j], r = x->grads[t->offset + j];
            double d = fabs(c - r);
            if (!(d <= md)) md = isnan(d) ? INFINITY : d;
            if (fabs(r) > mr) mr = fabs(r);
        }
        double rel = md / (mr > 0 ? mr : 1.0);
        if (rel > worst) { worst = rel; worst_name = t->name; }
        CHECK_MSG(rel <= 1e-4, "grad %s: max diff %.3g, max |ref| %.3g", t->name, md, mr);
    }
    printf("worst gradient relative diff %.3g (%s)\n", worst, worst_name);

    /* 10 AdamW steps on the same batch. */
    size_t np = m.sizes.n_params;
    float *mm = calloc(np, 4), *vv = calloc(np, 4);
    REQUIRE(mm && vv);
    memcpy(m.params, x->params, m.sizes.params_bytes);
    for (int s = 0; s < x->nsteps; s++) {
        mw_gpt2_zero_grad(&m);
        REQUIRE(mw_gpt2_forward(&m, x->inputs, x->targets, x->B, x->T) == 0);
        REQUIRE(mw_gpt2_backward(&m, 1.0f, NULL, NULL) == 0);
        printf("step %d loss %.6f ref %.6f\n", s, m.loss, x->losses[s]);
        CHECK_MSG(fabs(m.loss - x->losses[s]) <= 1e-4, "step %d loss %.6f vs %.6f", s, m.loss, x->losses[s]);
        float bc1 = 1.0f - powf(x->b1, (float)(s + 1)), bc2 = 1.0f - powf(x->b2, (float)(s + 1));
        for (size_t j = 0; j < np; j++) {
            float g = m.grads[j];
            mm[j] = x->b1 * mm[j] + (1.0f - x->b1) * g;
            vv[j] = x->b2 * vv[j] + (1.0f - x->b2) * g * g;
            float mh = mm[j] / bc1, vh = vv[j] / bc2;
            m.params[j] -= x->lr * (mh / (sqrtf(vh) + x->eps) + x->wd * m.params[j]);
        }
    }
    free(mm);
    free(vv);
    mw_gpt2_free(&m);
}

int main(void)
{
    struct fx x;
    load_fixture(&x);
    run(&x, 0);
    run(&x, 1);
    free(x.params); free(x.grads); free(x.logits); free(x.losses); free(x.inputs); free(x.targets);
    TEST_END();
}
