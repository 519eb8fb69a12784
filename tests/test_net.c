/*
 * test_net.c — the model seam (memwall/model.h) with GPT-2 as its first family:
 *  - the registry finds the family by name and by the id checkpoints keep; unknown ones are NULL;
 *  - the config's checkpoint encoding round-trips, and a hostile one is refused;
 *  - the family's description for the planner counts the same parameters as the model has;
 *  - through the table == direct calls, bitwise: the loss, the logits, the gradients of a
 *    batch-major forward + backward, and the losses and gradients of a layer-major step;
 *  - unit order, one source: what mw_net_unit_order says for each pass (forward, backward;
 *    batch-major, layer-major) is exactly the sequence of units the passes acquire;
 *  - the units tile the flat array in order, and so do the tensors.
 */
#include "memwall/gpt2.h"
#include "memwall/model.h"
#include "memwall/plan.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <string.h>

static const struct mw_gpt2_config gcfg = {.n_layer = 3, .n_head = 4, .n_embd = 64, .max_seq_len = 32,
                                           .vocab_size = 101, .padded_vocab_size = 128};
enum { B = 2, T = 16, NMB = 3 };

struct seen { int n, units[64]; int backward[64]; };

static int on_unit(void *user, int event, int unit, int backward)
{
    struct seen *s = user;
    if (event == MW_NET_UNIT_ACQUIRE) {
        if (s->n < 64) { s->units[s->n] = unit; s->backward[s->n] = backward; }
        s->n++;
    }
    return 0;
}

/* The acquisitions of one pass (backward flag) out of what was seen. */
static int pass_units(const struct seen *s, int backward, int *out)
{
    int k = 0;
    for (int i = 0; i < s->n && i < 64; i++)
        if (s->backward[i] == backward) out[k++] = s->units[i];
    return k;
}

static void check_order(const struct mw_net *n, const struct seen *s, int layer_major)
{
    for (int pass = 0; pass < 2; pass++) {
        int got[64], want[64];
        int ng = pass_units(s, pass, got);
        int nw = mw_net_unit_order(n, pass ? MW_NET_BACKWARD : MW_NET_FORWARD, layer_major, want, 64);
        CHECK_MSG(ng == nw && !memcmp(got, want, (size_t)ng * sizeof *got),
                  "%s %s: the pass acquired %d units, the order says %d", layer_major ? "layer-major" : "batch-major",
                  pass ? "backward" : "forward", ng, nw);
    }
}

static void tokens(int32_t *in, int32_t *tg, int n, uint64_t seed)
{
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(tu_rand(&seed) % (uint64_t)gcfg.vocab_size);
        tg[i] = (int32_t)(tu_rand(&seed) % (uint64_t)gcfg.vocab_size);
    }
}

int main(void)
{
    /* registry */
    const struct mw_net_family *f = mw_net_family_find("gpt2");
    REQUIRE(f != NULL);
    CHECK(mw_net_family_by_id(0) == f);
    CHECK(mw_net_family_find("no-such-family") == NULL && mw_net_family_by_id(12345) == NULL);
    CHECK(mw_net_family_at(0) == f);

    /* config in a checkpoint */
    struct mw_net_config c = {f, {0}}, d = {f, {0}};
    memcpy(c.raw, &gcfg, sizeof gcfg);
    uint8_t wire[MW_NET_CONFIG_WIRE];
    f->config_encode(c.raw, wire);
    CHECK(f->config_decode(wire, d.raw) == 0 && !memcmp(c.raw, d.raw, sizeof gcfg));
    wire[8] = 0; wire[9] = 0; wire[10] = 0; wire[11] = 0x80; /* width 2^31: out of range */
    CHECK(f->config_decode(wire, d.raw) != 0);
    f->config_encode(c.raw, wire);
    wire[4] = 5; /* 5 heads do not divide width 64 */
    CHECK(f->config_decode(wire, d.raw) == -EINVAL);

    /* the planner's description */
    struct mw_gpt2_config g124;
    mw_gpt2_config_124m(&g124);
    struct mw_net_config c124 = {f, {0}};
    memcpy(c124.raw, &g124, sizeof g124);
    struct mw_model desc;
    struct mw_param_count pc;
    f->config_describe(c124.raw, &desc);
    mw_model_count(&desc, &pc);
    CHECK_MSG(pc.total == mw_gpt2_num_params(&g124), "description %llu params, model %zu",
              (unsigned long long)pc.total, mw_gpt2_num_params(&g124));

    /* through the table == direct */
    struct mw_net_options o = {B, T, 0, 2};
    struct mw_gpt2_options go = {B, T, 0, 2};
    struct mw_net n;
    struct mw_gpt2 m;
    REQUIRE(mw_net_init(&n, &c, &o) == 0);
    REQUIRE(mw_gpt2_init(&m, &gcfg, &go) == 0);
    CHECK(n.sizes.n_params == m.sizes.n_params && n.sizes.acts_bytes == m.sizes.acts_bytes);
    CHECK(n.n_units == gcfg.n_layer + 2 && n.vocab == gcfg.vocab_size && n.padded_vocab == 128 && n.context == 32);
    n.family->init_weights(&n, 7);
    mw_gpt2_init_weights(&m, 7);
    CHECK(!memcmp(n.params, m.params, m.sizes.params_bytes));
    int32_t in[NMB * B * T], tg[NMB * B * T];
    tokens(in, tg, NMB * B * T, 11);
    struct seen s = {0};
    n.family->set_weights_hook(&n, on_unit, &s);
    REQUIRE(mw_net_forward(&n, in, tg, B, T) == 0);
    REQUIRE(mw_gpt2_forward(&m, in, tg, B, T) == 0);
    CHECK(n.loss == m.loss && n.loss > 0);
    CHECK(!memcmp(n.family->logits(&n), mw_gpt2_logits(&m), (size_t)B * T * 128 * sizeof(float)));
    REQUIRE(mw_net_backward(&n, 1.0f, NULL, NULL) == 0);
    REQUIRE(mw_gpt2_backward(&m, 1.0f, NULL, NULL) == 0);
    CHECK(!memcmp(n.grads, m.grads, m.sizes.grads_bytes));
    check_order(&n, &s, 0);

    /* layer-major */
    n.family->zero_grad(&n);
    mw_gpt2_zero_grad(&m);
    float ln[NMB], lm[NMB];
    memset(&s, 0, sizeof s);
    REQUIRE(n.family->step_layer_major(&n, NMB, in, tg, B, T, 1.0f / NMB, NULL, ln) == 0);
    REQUIRE(mw_gpt2_step_layer_major(&m, NMB, in, tg, B, T, 1.0f / NMB, NULL, lm) == 0);
    CHECK(!memcmp(ln, lm, sizeof ln));
    CHECK(!memcmp(n.grads, m.grads, m.sizes.grads_bytes));
    check_order(&n, &s, 1);

    /* units and tensors tile the flat array */
    size_t next = 0;
    for (int u = 0; u < n.n_units; u++) {
        size_t first, cnt;
        REQUIRE(mw_net_unit_range(&n, u, &first, &cnt) == 0);
        CHECK_MSG(first == next && cnt > 0, "unit %d starts at %zu, want %zu", u, first, next);
        next = first + cnt;
    }
    CHECK(next == n.sizes.n_params);
    CHECK(mw_net_unit_range(&n, n.n_units, &next, &next) == -EINVAL);
    next = 0;
    for (int i = 0; i < n.family->n_tensors(&n); i++) {
        struct mw_net_tensor t;
        n.family->tensor(&n, i, &t);
        CHECK(t.offset == next && t.numel == t.shape[0] * t.shape[1] && t.name && t.name[0]);
        next = t.offset + t.numel;
    }
    CHECK(next == n.sizes.n_params);
    char name[32];
    mw_net_unit_name(&n, 0, name, sizeof name);
    CHECK(!strcmp(name, "embeddings"));
    mw_net_unit_name(&n, 2, name, sizeof name);
    CHECK(!strcmp(name, "h.1"));
    /* The schedule the residency machines read, and the planner's GPT-2 simulation, walk the
     * model's order (one source: the planner's copy for GPT-2 is held to it here). */
    struct mw_net_sched sc;
    REQUIRE(mw_net_sched_init(&sc, &n) == 0);
    for (int lm = 0; lm < 2; lm++)
        for (int p = 0; p < 64; p++) {
            int u = mw_net_sched_unit(&sc, lm, 1, p);
            CHECK_MSG(u == mw_plan_stream_unit(gcfg.n_layer, lm, p), "%s position %d: the model says %d, the planner %d",
                      lm ? "layer-major" : "batch-major", p, u, mw_plan_stream_unit(gcfg.n_layer, lm, p));
            if (u < 0) break;
        }
    CHECK(mw_net_sched_unit(&sc, 0, 0, sc.nf[0]) == -1 && mw_net_sched_unit(&sc, 0, 0, sc.nf[0] - 1) == 0);
    mw_net_sched_free(&sc);
    mw_net_free(&n);
    mw_gpt2_free(&m);
    TEST_END();
}
