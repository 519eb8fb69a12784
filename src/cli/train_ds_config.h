/*
 * train_ds_config.h — reads a DeepSpeed config file (ds_config.json) into the `memwall train`
 * options it stands for. CLI code (src/cli/, next to the option table in train_opts.c): the
 * library does not know DeepSpeed's file or the CLI's flags. Tests and fuzz/fuzz_dsconfig.c
 * build train_ds_config.c in with the library (CMakeLists.txt).
 *
 * Why options and not a struct: users arrive with a DeepSpeed file and want the run it
 * describes, and memwall already has one place that validates, defaults and prints its
 * settings, the option table of `memwall train`. So the reader turns each key it understands
 * into the flag the user would have typed ("zero_optimization.stage": 3 -> "--zero 3"); the
 * CLI applies those flags to every option the command line did not give, and the command line
 * wins. The docs (docs/train.md, "DeepSpeed config") list the keys one by one.
 *
 * Three outcomes per key: mapped (a setting), accepted (harmless or without effect in memwall;
 * a warning says which when it changes nothing the user may expect), or refused (memwall cannot
 * honour it: fp16/bf16 training, optimizers other than Adam/AdamW, a scheduler, partial
 * offload, ...): the whole file is then refused with a message naming the key and what to do.
 * Keys this reader does not know get one warning each. The file is hostile input: every value
 * is type- and range-checked before any conversion, sizes are bounded, duplicate keys refused.
 *
 * Usage:
 *   struct mw_ds_config dc;
 *   if (mw_ds_config_load("ds_config.json", world, &dc)) { print mw_error_msg(); exit 2; }
 *   for (i < dc.n_warnings) print dc.warnings[i];
 *   for (i < dc.n_settings) if (!given(dc.settings[i].option)) apply(option, value);
 *   mw_ds_config_free(&dc);
 * Nothing here prints.
 */
#ifndef MEMWALL_CLI_TRAIN_DS_CONFIG_H
#define MEMWALL_CLI_TRAIN_DS_CONFIG_H

#include <stddef.h>

struct mw_ds_setting {
    const char *option; /* `memwall train` option without "--", e.g. "grad-accum" (static) */
    char *value;        /* its value as it would be typed, e.g. "4" (owned) */
    char *key;          /* the DeepSpeed key it comes from, e.g. "gradient_accumulation_steps" (owned) */
};

struct mw_ds_config {
    struct mw_ds_setting *settings; /* in a fixed order; each option at most once */
    int n_settings;
    char **warnings;                /* one line each, without a trailing newline (owned) */
    int n_warnings;
};

/* Largest file the reader accepts: DeepSpeed configs are a few KiB. */
#define MW_DS_CONFIG_MAX_BYTES (1u << 20)

/* Parses len bytes of JSON text. `source` names the file in messages. `world` (>= 1) is the
 * number of data-parallel ranks: DeepSpeed's batch keys are per GPU, memwall's --batch is the
 * global micro-batch (micro x world), and train_batch_size must equal micro x accumulation x
 * world. Returns 0, or MW_EFORMAT (not JSON, wrong type, duplicate key), -EINVAL (a value out
 * of range or inconsistent), -ENOTSUP (a setting memwall cannot honour), -ENOMEM, each with
 * the message set; on failure *out is empty. */
int mw_ds_config_parse(const char *text, size_t len, const char *source, int world, struct mw_ds_config *out);
/* Reads the file (at most MW_DS_CONFIG_MAX_BYTES) and parses it; -errno when it cannot be read. */
int mw_ds_config_load(const char *path, int world, struct mw_ds_config *out);
void mw_ds_config_free(struct mw_ds_config *c);
/* The setting for an option, or NULL. */
const struct mw_ds_setting *mw_ds_config_find(const struct mw_ds_config *c, const char *option);

#endif
