/*
 * train_cli.h — `memwall train`'s command-line side, in four files read in one sitting each:
 * cmd_train.c (parse, resolve, start), train_opts.c (presets and the option table),
 * train_setup.c (MPI, per-rank paths, --resume, --ds-config) and train_run.c (the run: setup,
 * steps, outputs); train_ds_config.c reads a --ds-config file into option strings. One
 * invocation is one struct train_cli, passed down: no file-scope state.
 */
#ifndef MEMWALL_CLI_TRAIN_CLI_H
#define MEMWALL_CLI_TRAIN_CLI_H

#include "cli/commands.h"
#include "cli/opts.h"
#include "cli/train_ds_config.h"
#include "cli/train_spec.h"
#include "memwall/comm.h"
#include "memwall/common.h"
#include "memwall/data.h"
#include "memwall/fsutil.h"
#include "memwall/model.h"
#include "memwall/offload.h"
#include "memwall/plan.h"
#include "memwall/report.h"
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "memwall/train.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BUNDLED_CORPUS "data/kjv_excerpt.txt"

struct preset {
    const char *name;
    int64_t layers, heads, width, context, vocab;
    int64_t batch, seq, steps, warmup, val_every, val_batches, sample_len;
    double lr;
};


struct args {
    const char *preset, *data, *out_dir, *resume, *init_st, *log_json, *trace, *tier, *nvme_dir, *policy, *hier, *comm_sum;
    const char *init_hf, *save_hf; /* Hugging Face model directories in and out */
    const char *tokenizer;         /* tokenizer.json (or a directory holding one): the sample's text */
    const char *ds_config;
    uint64_t subgroup_size, dram_budget, nvme_budget, aio_block_size;
    int64_t buffer_count, aio_queue_depth;
    const char *offload_params, *schedule, *activations; /* --offload-params dram|nvme (streaming), --schedule,
                                                             --activations */
    const char *preread;                                 /* --preread auto|on|off */
    int64_t prefetch_depth;
    int64_t layers, heads, width, context, vocab;
    int64_t batch, seq, accum, steps, warmup, val_every, val_batches, ckpt_every, threads, sample_len, top_k;
    int64_t print_every, seed;
    double lr, min_lr_frac, wd, clip, beta1, beta2, eps, temperature, comm_timeout;
    int64_t zero;
    int recompute, sync_update;
};

/* One invocation of `memwall train`: its arguments, its MPI job, what --resume read, and what
 * the run wrote; made by mw_cmd_train and passed down (no file-scope state: the Python package
 * and tests may run the command more than once in a process). */
struct train_cli {
    struct args A;
    struct mw_opt opts[64];             /* the option table, pointing into A (opts_init) */
    struct mw_cmd_spec spec;
    struct mw_comm *comm;               /* the data-parallel job (mpirun); NULL: one rank */
    int world, rank;
    struct mw_train_resume rsm;         /* --resume DIR: the commit record of the run there */
    int resume_dir;
    struct train_spec_applied spec_applied; /* --resume: the run's kept settings (train_spec.c) */
    char *ckpt_spec;
    struct mw_ds_config ds;             /* --ds-config: string options point into it */
    char last_ckpt[PATH_MAX];           /* the last checkpoint written (named after a failure) */
    char hf_weights[PATH_MAX];          /* --init-hf DIR: DIR/model.safetensors, or DIR when sharded */
    char hf_tok[PATH_MAX];              /* the tokenizer.json of --tokenizer or --init-hf (empty: none) */
    int64_t last_ckpt_step;
    char path_nvme[PATH_MAX], path_trace[PATH_MAX], path_resume[PATH_MAX]; /* with %r expanded */
};

#define GIVEN(name) mw_opts_given(&c->spec, name)
/* The first directory of a "d1:d2" list, as "%.*s" arguments. */
#define DIR0(list) (int)strcspn(list, ":"), list

/* train_opts.c */
void train_opts_init(struct train_cli *c);
void train_set_defaults(struct train_cli *c, const struct preset *p);
const struct preset *train_find_preset(const char *name);
const struct preset *train_prescan_preset(int argc, char **argv);
int train_usage_error(const char *fmt, const char *a); /* prints, returns 2 */
/* train_setup.c: each returns 0, 1 (runtime failure, printed) or 2 (usage, printed) */
int train_apply_checkpoint(struct train_cli *c, const struct mw_ckpt_info *ci);
const char *train_find_corpus(char *buf, size_t n);
int train_comm_start(struct train_cli *c);
int train_rank_paths(struct train_cli *c);
void train_leftover_hint(int err, const char *dirs);
int train_read_resume_dir(struct train_cli *c, struct mw_ckpt_info *ci);
int train_apply_ds_config(struct train_cli *c);
/* train_run.c: the run; 0, 1 (printed) or 128 + the signal that stopped it */
int train_run(struct train_cli *c, const char *data_path, const struct mw_net_config *nc, const struct mw_train_config *tc,
              const struct mw_ckpt_info *resume_info);

#endif
