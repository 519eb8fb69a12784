/*
 * cmd_train.c — `memwall train`: parse the options (train_opts.c), start MPI and bring back what
 * --resume or --ds-config says (train_setup.c), resolve the configuration, and run (train_run.c).
 * On --resume the run's kept settings (train_spec.c) replace every default that the command line
 * did not give, so `memwall train --resume DIR|FILE` alone continues the run exactly.
 * --ds-config FILE: a DeepSpeed config read into the options it stands for (cli/train_ds_config.h),
 * applied as if typed, to every option the command line did not give (so flags override it),
 * after MPI is up (its batch keys are per GPU) and before the rank-dependent paths are made.
 */
#include "cli/train_cli.h"

static int train_main(struct train_cli *c, int argc, char **argv);

int mw_cmd_train(int argc, char **argv)
{
    struct train_cli *c = calloc(1, sizeof *c);
    if (!c) { fprintf(stderr, "memwall train: out of memory\n"); return 1; }
    c->world = 1;
    train_opts_init(c);
    int sig = mw_cli_signals_start("memwall train");
    int rc = train_main(c, argc, argv);
    if (rc == 3) rc = 0; /* a finished run, resumed: said so */
    if (!sig) mw_cli_signals_stop();
    mw_ds_config_free(&c->ds);
    mw_train_resume_free(&c->rsm);
    train_spec_applied_free(&c->spec_applied);
    free(c->ckpt_spec);
    c->ckpt_spec = NULL;
    if (c->comm) {
        fflush(stdout);
        /* A runtime failure on one rank would leave the others waiting in a collective. */
        if (rc == 1 && c->world > 1) mw_comm_abort(c->comm, 1);
        int err = mw_comm_free(c->comm);
        if (err && !rc) { mw_cli_fail("shutting MPI down", err); rc = 1; }
        c->comm = NULL;
    }
    mw_cli_set_rank(0, 1);
    free(c);
    return rc;
}

static int train_main(struct train_cli *c, int argc, char **argv)
{
    memset(&c->A, 0, sizeof c->A);
    c->A.preset = train_prescan_preset(argc, argv)->name;
    train_set_defaults(c, train_find_preset(c->A.preset));
    char *pos[1];
    int npos = 0;
    int r = mw_opts_parse(&c->spec, argc, argv, pos, &npos);
    if (r == MW_OPTS_HELP) return 0;
    if (r != MW_OPTS_OK) return 2;
    if ((r = train_comm_start(c))) return r;
    if (c->A.ds_config && (r = train_apply_ds_config(c))) return r;
    if ((r = train_rank_paths(c))) return r;

    struct mw_ckpt_info ci;
    struct stat rst;
    c->resume_dir = 0;
    if (c->A.resume && stat(c->A.resume, &rst) != 0) {
        int e = errno;
        mw_cli_fail("resuming", mw_error_set(-e, "--resume %s: %s (neither a checkpoint nor the NVMe directory of a run)",
                                             c->A.resume, strerror(e)));
        return 1;
    }
    if (c->A.resume && S_ISDIR(rst.st_mode)) {
        if ((r = train_read_resume_dir(c, &ci))) return r;
    } else if (c->A.resume) {
        int err = mw_ckpt_read_info(c->A.resume, &ci);
        if (!err) err = mw_ckpt_read_spec(c->A.resume, &c->ckpt_spec);
        if (err) { mw_cli_fail("reading the checkpoint", err); return 1; }
        if (c->ckpt_spec) {
            printf("resuming the run of %s at step %" PRId64 " of %" PRId64 "\n", c->A.resume, ci.step, ci.train.steps);
            if ((r = train_spec_apply(&c->spec, c->ckpt_spec, NULL, c->A.resume, ci.step, &c->spec_applied))) return r;
        } else if ((r = train_apply_checkpoint(c, &ci))) {
            return r;
        }
    }
    if (c->A.ckpt_every > 0 && !c->A.out_dir) return train_usage_error("--ckpt-every needs --out-dir%s", "");
    if (c->A.resume && c->A.init_st) return train_usage_error("--init-safetensors cannot be combined with --resume%s", "");
    if (c->A.init_hf && c->A.init_st) return train_usage_error("give --init-hf DIR or --init-safetensors FILE, not both%s", "");
    /* A Hugging Face directory: its config.json names the family, its model.safetensors (or a
     * sharded checkpoint's index and shards: mw_net_hf_weights) the weights. */
    const struct mw_net_family *fam = mw_net_family_default();
    if (c->A.init_hf) {
        if (c->A.resume) return train_usage_error("--init-hf cannot be combined with --resume%s", "");
        int err = mw_net_family_for_hf(c->A.init_hf, &fam);
        if (err) { mw_cli_fail("reading --init-hf", err); return 1; }
        if ((err = mw_net_hf_weights(c->A.init_hf, c->hf_weights, sizeof c->hf_weights)) == -ENAMETOOLONG)
            return train_usage_error("--init-hf %s: path too long", c->A.init_hf);
        if (err) { mw_cli_fail("reading --init-hf", err); return 1; }
        c->A.init_st = c->hf_weights;
    }
    /* The tokenizer: given, or the one beside --init-hf's weights (an HF directory usually has it). */
    const char *tk = c->A.tokenizer ? c->A.tokenizer : c->A.init_hf;
    struct stat tst;
    if (tk && (size_t)snprintf(c->hf_tok, sizeof c->hf_tok, "%s%s", tk,
                               stat(tk, &tst) == 0 && S_ISDIR(tst.st_mode) ? "/tokenizer.json" : "") >= sizeof c->hf_tok)
        return train_usage_error("--tokenizer %s: path too long", tk);
    if (c->hf_tok[0] && access(c->hf_tok, R_OK) != 0) {
        if (c->A.tokenizer) return train_usage_error("--tokenizer: cannot read %s", c->hf_tok);
        c->hf_tok[0] = 0; /* --init-hf without a tokenizer.json: ids are printed */
    }
    if (!c->A.init_st) {
        if (c->A.seq > c->A.context) return train_usage_error("--seq is longer than the model's --context%s", "");
        if (c->A.width % c->A.heads) return train_usage_error("--width must be a multiple of --heads%s", "");
    }

    /* The model, through its family (memwall/model.h): from the shape options, from a weights file
     * (the files say the shape; a shape flag fills what they do not and must agree), or as the
     * resumed run's record or checkpoint keeps it. */
    struct mw_net_config nc = {fam, {0}};
    struct mw_net_shape sh = {(int)c->A.layers, (int)c->A.heads, (int)c->A.width, (int)c->A.context, (int)c->A.vocab};
    if (c->A.init_st) {
        struct mw_net_shape given = {GIVEN("layers") ? sh.layers : 0, GIVEN("heads") ? sh.heads : 0,
                                     GIVEN("width") ? sh.width : 0, GIVEN("context") ? sh.context : 0,
                                     GIVEN("vocab") ? sh.vocab : 0};
        char note[2048] = "";
        int err = nc.family->config_from_file(c->A.init_st, &given, nc.raw, note, sizeof note);
        if (err) { mw_cli_fail("reading --init-safetensors", err); return 1; }
        if (c->rank == 0) fputs(note, strstr(note, "warning") ? stderr : stdout);
        nc.family->config_shape(nc.raw, &sh);
        if (c->A.seq > sh.context) return train_usage_error("--seq is longer than the context of %s", c->A.init_st);
    } else if (c->A.resume) {
        nc = ci.net;
        nc.family->config_shape(nc.raw, &sh);
    } else if (nc.family->config_from_shape(&sh, nc.raw)) {
        return train_usage_error("the model's shape: %s", mw_error_msg());
    }
    struct mw_train_config tc = {
        .batch = (int)c->A.batch, .seq = (int)c->A.seq, .grad_accum = (int)c->A.accum, .steps = c->A.steps, .lr = c->A.lr,
        .warmup = c->A.warmup, .min_lr_frac = c->A.min_lr_frac, .weight_decay = c->A.wd, .beta1 = c->A.beta1,
        .beta2 = c->A.beta2, .eps = c->A.eps, .clip = c->A.clip, .val_every = c->A.val_every, .val_batches = c->A.val_batches,
        .ckpt_every = c->A.ckpt_every, .seed = (uint64_t)c->A.seed, .threads = (int)c->A.threads,
        .recompute = c->A.recompute,
        .nvme_dir = c->A.nvme_dir ? c->A.nvme_dir : "run/nvme", .subgroup_size = c->A.subgroup_size,
        .buffer_count = (int)c->A.buffer_count, .offload_policy = c->A.policy, .dram_budget = c->A.dram_budget,
        .nvme_budget = c->A.nvme_budget, .comm = c->world > 1 ? c->comm : NULL, .zero_stage = (int)c->A.zero,
        .prefetch_depth = (int)c->A.prefetch_depth, .sync_update = c->A.sync_update,
        .io_block_size = c->A.aio_block_size, .io_queue_depth = (unsigned)c->A.aio_queue_depth,
        .resume = c->resume_dir ? &c->rsm.rec : NULL,
    };
    /* Placement and schedule: decided in the library (src/train/resolve.c), every conflict named. */
    /* The tier left at its default by a streamed run is memwall's to decide (nvme). */
    int tier_auto = !GIVEN("optimizer-tier") && !c->resume_dir && !strcmp(c->A.tier, "dram");
    struct mw_train_choices ch = {tier_auto ? NULL : c->A.tier, c->A.offload_params, c->A.schedule, c->A.activations,
                                  c->A.preread, c->A.recompute, c->world, c->A.init_st, GIVEN("prefetch-depth")};
    if (mw_train_config_resolve(&ch, &tc)) return train_usage_error("%s", mw_error_msg());
    if (tc.threads == 0) tc.threads = omp_get_max_threads();
    /* What the run resolved is what its record keeps (train_spec.c): a resume decides nothing anew. */
    struct mw_train_names rn;
    mw_train_config_names(&tc, &rn);
    c->A.tier = rn.tier;
    c->A.schedule = rn.schedule;
    if (rn.activations) c->A.activations = rn.activations;
    if (rn.nvme_dir) c->A.nvme_dir = rn.nvme_dir;
    c->A.threads = tc.threads;
    c->A.layers = sh.layers; c->A.heads = sh.heads; c->A.width = sh.width; c->A.context = sh.context; c->A.vocab = sh.vocab;
    char corpus[PATH_MAX];
    const char *data_path = c->A.data;
    if (!data_path) {
        data_path = train_find_corpus(corpus, sizeof corpus);
        if (!data_path) {
            mw_error_set(-ENOENT, "the bundled corpus %s was found neither in the current directory nor next to "
                         "the memwall binary; run from the source tree or give --data FILE", BUNDLED_CORPUS);
            mw_cli_fail("finding the training data", -ENOENT);
            return 1;
        }
    }
    if ((c->A.nvme_dir || c->A.nvme_budget) && !strcmp(c->A.tier, "dram"))
        mw_log(MW_LOG_WARN, "--nvme-dir and --nvme-budget are unused with --optimizer-tier dram");
    return train_run(c, data_path, &nc, &tc, c->A.resume && !c->resume_dir ? &ci : NULL);
}
