/*
 * resolve.c — the run's placement and schedule decided once, in the library (issue "A house for
 * every model", "Configuration resolved once"): where the optimizer state lives, whether the
 * weights stream, the step's schedule, where a block's activations come from in backward, the
 * pre-reads and the commit records, from what the user chose ("auto" where memwall decides).
 * Every conflict is reported, not only the first, in one message that names settings (the Python
 * package and `memwall train` show it as it is).
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "memwall/offload.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int is(const char *v, const char *s) { return v && !strcmp(v, s); }

static void add(char *msg, size_t n, const char *what)
{
    size_t l = strlen(msg);
    snprintf(msg + l, n - l, "%s%s", l ? "; " : "", what);
}

int mw_train_config_resolve(const struct mw_train_choices *ch, struct mw_train_config *tc)
{
    char msg[1024] = "";
    int streamed = is(ch->offload_params, "nvme");
    if (ch->offload_params && !streamed && !is(ch->offload_params, "dram"))
        add(msg, sizeof msg, "the weights' place (offload_params) is dram or nvme");
    /* The streamed weights are the fp32 master on NVMe: the optimizer state is there too. */
    int tier_nvme = streamed && !ch->tier ? 1 : is(ch->tier, "nvme");
    if (ch->tier && !tier_nvme && !is(ch->tier, "dram"))
        add(msg, sizeof msg, "the optimizer tier (tier) is dram or nvme");
    if (streamed && !tier_nvme)
        add(msg, sizeof msg, "streamed weights (offload_params nvme) need the optimizer state on NVMe (tier nvme): the "
            "fp32 master weights on NVMe are the streamed weights");
    const char *sch = ch->schedule ? ch->schedule : "auto";
    if (!is(sch, "auto") && !is(sch, "layer-major") && !is(sch, "batch-major"))
        add(msg, sizeof msg, "the schedule (schedule) is auto, layer-major or batch-major");
    int layer_major = is(sch, "layer-major") || (is(sch, "auto") && streamed);
    const char *acts = ch->activations ? ch->activations : "auto";
    if (!is(acts, "auto") && !is(acts, "recompute") && !is(acts, "nvme"))
        add(msg, sizeof msg, "the activations (activations) are auto, recompute or nvme");
    if (is(acts, "nvme") && (!streamed || !layer_major))
        add(msg, sizeof msg, "activations on NVMe (activations nvme) need streamed weights (offload_params nvme) and "
            "the layer-major schedule (schedule)");
    if (is(acts, "nvme") && ch->recompute)
        add(msg, sizeof msg, "activations on NVMe (activations nvme) keep what recomputation (recompute) would "
            "recompute: choose one");
    if (tc->offload_policy) {
        enum mw_offload_policy pol;
        int k;
        if (mw_offload_policy_parse(tc->offload_policy, &pol, &k)) add(msg, sizeof msg, mw_error_msg());
    }
    if (tc->io_block_size % 4096) add(msg, sizeof msg, "the NVMe request piece (io_block_size) is a multiple of 4096 bytes (O_DIRECT)");
    if (ch->world > 1 && tc->batch % ch->world) {
        char b[160];
        snprintf(b, sizeof b, "the global micro-batch (batch %d) must divide by the %d ranks", tc->batch, ch->world);
        add(msg, sizeof msg, b);
    }
    if (msg[0]) return mw_error_set(-EINVAL, "%s", msg);
    tc->tier = tier_nvme ? MW_TIER_NVME : MW_TIER_DRAM;
    tc->offload_params = streamed ? MW_TIER_NVME : MW_TIER_DRAM;
    tc->layer_major = layer_major;
    tc->acts_nvme = is(acts, "nvme") || (is(acts, "auto") && streamed && layer_major && !ch->recompute);
    tc->preread = !is(ch->preread, "off");
    tc->journal = ch->world <= 1 && tier_nvme; /* commit records: one rank, the state on NVMe */
    /* Streamed: the initial weights go a unit at a time into the master; else the caller loads them. */
    tc->init_safetensors = streamed ? ch->init_safetensors : NULL;
    if (ch->prefetch_given && !streamed)
        mw_log(MW_LOG_WARN, "the prefetch depth (prefetch_depth) serves streamed weights (offload_params nvme) only");
    return 0;
}

void mw_train_config_names(const struct mw_train_config *tc, struct mw_train_names *out)
{
    int streamed = tc->offload_params == MW_TIER_NVME, nvme = tc->tier == MW_TIER_NVME;
    out->tier = nvme ? "nvme" : "dram";
    out->schedule = tc->layer_major ? "layer-major" : "batch-major";
    out->activations = streamed && tc->layer_major ? (tc->acts_nvme ? "nvme" : "recompute") : NULL;
    out->nvme_dir = nvme ? tc->nvme_dir : NULL;
}
