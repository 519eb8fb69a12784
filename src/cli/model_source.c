/*
 * model_source.c — the model a command reads: a Hugging Face directory (`--init-hf DIR`: its
 * config.json picks the family, DIR/model.safetensors or a sharded checkpoint's
 * model.safetensors.index.json and its shards hold the weights: mw_net_hf_weights) or a memwall
 * checkpoint (`--resume CKPT`). One place for `memwall eval` and `memwall generate`.
 */
#include "cli/commands.h"
#include "memwall/model.h"
#include "memwall/train.h"

#include <errno.h>
#include <stdio.h>

int mw_cli_model_config(const char *cmd, const char *hf, const char *ckpt, struct mw_net_config *nc, char *weights,
                        size_t n)
{
    int err;
    if (hf) {
        const struct mw_net_family *f;
        if ((err = mw_net_family_for_hf(hf, &f))) { mw_cli_fail("reading --init-hf", err); return 1; }
        if ((err = mw_net_hf_weights(hf, weights, n)) == -ENAMETOOLONG) {
            fprintf(stderr, "memwall %s: --init-hf %s: path too long\n", cmd, hf);
            return 2;
        }
        if (err) { mw_cli_fail("reading --init-hf", err); return 1; }
        struct mw_net_shape none = {0, 0, 0, 0, 0};
        char note[2048];
        nc->family = f;
        if ((err = f->config_from_file(weights, &none, nc->raw, note, sizeof note))) {
            mw_cli_fail("reading --init-hf", err);
            return 1;
        }
        return 0;
    }
    struct mw_ckpt_info ci;
    if ((err = mw_ckpt_read_info(ckpt, &ci))) { mw_cli_fail("reading the checkpoint", err); return 1; }
    *nc = ci.net;
    return 0;
}
