/*
 * train_setup.c — what `memwall train` decides before its run: MPI and the per-rank paths (%r), the
 * settings --resume brings back (a commit record's or a checkpoint's, train_spec.c) and --ds-config's.
 */
#include "cli/train_cli.h"

/* The checkpoint's settings for every option the command line did not give. */
int train_apply_checkpoint(struct train_cli *c, const struct mw_ckpt_info *ci)
{
    static const char *const shape[] = {"layers", "heads", "width", "context", "vocab", "preset", "init-safetensors", "init-hf"};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (GIVEN(shape[i])) return train_usage_error("--%s cannot be combined with --resume (the checkpoint fixes the model)", shape[i]);
    struct mw_net_shape sh;
    ci->net.family->config_shape(ci->net.raw, &sh);
    c->A.layers = sh.layers; c->A.heads = sh.heads; c->A.width = sh.width;
    c->A.context = sh.context; c->A.vocab = sh.vocab;
    const struct mw_train_config *t = &ci->train;
    if (!GIVEN("batch")) c->A.batch = t->batch;
    if (!GIVEN("seq")) c->A.seq = t->seq;
    if (!GIVEN("grad-accum")) c->A.accum = t->grad_accum;
    if (!GIVEN("steps")) c->A.steps = t->steps;
    if (!GIVEN("lr")) c->A.lr = t->lr;
    if (!GIVEN("warmup")) c->A.warmup = t->warmup;
    if (!GIVEN("min-lr-frac")) c->A.min_lr_frac = t->min_lr_frac;
    if (!GIVEN("weight-decay")) c->A.wd = t->weight_decay;
    if (!GIVEN("beta1")) c->A.beta1 = t->beta1;
    if (!GIVEN("beta2")) c->A.beta2 = t->beta2;
    if (!GIVEN("eps")) c->A.eps = t->eps;
    if (!GIVEN("clip")) c->A.clip = t->clip;
    if (!GIVEN("val-every")) c->A.val_every = t->val_every;
    if (!GIVEN("val-batches")) c->A.val_batches = t->val_batches;
    if (!GIVEN("ckpt-every")) c->A.ckpt_every = c->A.out_dir ? t->ckpt_every : 0;
    if (!GIVEN("seed")) c->A.seed = (int64_t)t->seed;
    if (!GIVEN("threads")) c->A.threads = t->threads;
    if (!GIVEN("recompute")) c->A.recompute = t->recompute;
    if (!GIVEN("zero")) c->A.zero = ci->zero_stage;
    if (!GIVEN("subgroup-size") && ci->world > 1 && ci->zero_stage >= 1) c->A.subgroup_size = ci->subgroup_size;
    if (!GIVEN("data") && ci->data_path[0]) c->A.data = ci->data_path;
    /* The checkpoint holds the state in one format for every tier: resuming may change it. */
    if (!GIVEN("optimizer-tier")) c->A.tier = t->tier == MW_TIER_NVME ? "nvme" : "dram";
    return 0;
}

/* The bundled corpus: ./data/..., else next to the binary (build/memwall -> ../data/...). */
const char *train_find_corpus(char *buf, size_t n)
{
    if (access(BUNDLED_CORPUS, R_OK) == 0) return BUNDLED_CORPUS;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(exe, '/');
            if (!slash) break;
            *slash = 0;
            if ((size_t)snprintf(buf, n, "%s/%s", exe, BUNDLED_CORPUS) < n && access(buf, R_OK) == 0) return buf;
        }
    }
    return NULL;
}

/* Copies in with every "%r" replaced by the rank; 0 when something was replaced, 1 when not,
 * -1 when the result (with room for a "/rank<r>" suffix) does not fit in n bytes. */
static int expand_rank(struct train_cli *c, const char *in, char *out, size_t n)
{
    size_t o = 0;
    int found = 0;
    for (const char *p = in; *p; p++) {
        if (o + 24 >= n) return -1;
        if (p[0] == '%' && p[1] == 'r') {
            o += (size_t)snprintf(out + o, n - o, "%d", c->rank);
            p++;
            found = 1;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = 0;
    return found ? 0 : 1;
}

/* MPI (when started by mpirun); the output of rank 0 only. */
int train_comm_start(struct train_cli *c)
{
    struct mw_comm_config cc;
    mw_comm_config_default(&cc);
    cc.timeout_s = c->A.comm_timeout;
    cc.deterministic = !strcmp(c->A.comm_sum, "ordered");
    if (mw_comm_hierarchy_parse(c->A.hier, &cc.hierarchy)) return train_usage_error("--zero-hierarchy: %s", mw_error_msg());
    const char *rpn = getenv("MEMWALL_RANKS_PER_NODE"); /* tests: simulated nodes on one host */
    if (rpn) cc.ranks_per_node = atoi(rpn);
    int err = mw_comm_init(&c->comm, NULL, NULL, &cc);
    if (err) { mw_cli_fail("starting MPI", err); return 1; }
    c->world = mw_comm_size(c->comm, MW_COMM_WORLD);
    c->rank = mw_comm_rank(c->comm, MW_COMM_WORLD);
    mw_cli_set_rank(c->rank, c->world);
    if (c->world > 1 && c->rank != 0) {
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout)) { /* rank 0 alone prints progress */
            int e = errno;
            mw_cli_fail("starting MPI", mw_error_set(-e, "cannot send this rank's output to /dev/null: %s", strerror(e)));
            return 1;
        }
    }
    return 0;
}

/* What depends on the rank: the paths with %r. */
int train_rank_paths(struct train_cli *c)
{
    char *nvme = c->path_nvme, *trace = c->path_trace, *resume = c->path_resume;
    if (c->world == 1) {
        if (c->A.zero > 0) mw_log(MW_LOG_WARN, "--zero %d with one rank: nothing to shard (start with mpirun -np N)", (int)c->A.zero);
        return 0;
    }
    if ((c->A.nvme_dir && expand_rank(c, c->A.nvme_dir, nvme, PATH_MAX) < 0) || (c->A.trace && expand_rank(c, c->A.trace, trace, PATH_MAX) < 0) ||
        (c->A.resume && expand_rank(c, c->A.resume, resume, PATH_MAX) < 0))
        return train_usage_error("a path given (--nvme-dir, --trace or --resume) is too long: %s", "more than PATH_MAX bytes with the rank");
    if (c->A.nvme_dir) {
        if (expand_rank(c, c->A.nvme_dir, nvme, PATH_MAX)) snprintf(nvme + strlen(nvme), PATH_MAX - strlen(nvme), "/rank%d", c->rank);
        c->A.nvme_dir = nvme;
    } else if (!strcmp(c->A.tier, "nvme")) {
        snprintf(nvme, PATH_MAX, "run/nvme/rank%d", c->rank);
        c->A.nvme_dir = nvme;
    }
    if (c->A.trace) {
        if (expand_rank(c, c->A.trace, trace, PATH_MAX))
            return train_usage_error("--trace %s would be written by every rank: put %%r (the rank) in it, e.g. run/trace.%%r.json", c->A.trace);
        c->A.trace = trace;
    }
    if (c->A.resume) {
        if (expand_rank(c, c->A.resume, resume, PATH_MAX))
            return train_usage_error("--resume %s: each rank resumes from its own file; put %%r (the rank) in the path, e.g. "
                               "run/ckpt_00000100.r%%r.mwck", c->A.resume);
        c->A.resume = resume;
    }
    return 0;
}

/* --resume DIR: the commit record of the run in that NVMe directory (docs/resume.md). */
/* --resume: the run's kept settings (train_spec.c), which the option table points into. */


/* A fresh run refused on a directory holding a run that did not finish: how to continue it. */
void train_leftover_hint(int err, const char *dirs)
{
    if (err != -EEXIST || !strstr(mw_error_msg(), "did not finish")) return;
    char msg[1400];
    snprintf(msg, sizeof msg, "%s", mw_error_msg());
    struct mw_offload_record rec;
    int has = mw_offload_record_read(dirs, &rec) == 0;
    if (has) mw_offload_record_free(&rec);
    if (has)
        mw_error_set(err, "%s; 'memwall train --resume %.*s' continues it from its last committed step", msg, DIR0(dirs));
    else
        mw_error_set(err, "%s; it stopped before its first step was committed (no %s): there is nothing to resume", msg,
                     MW_OFFLOAD_RECORD_NAME);
}

/* Prints one file of the resumed run with its size. */
static void print_found(const char *path)
{
    struct stat st;
    char b[32];
    if (stat(path, &st) == 0) printf("  found and used: %s (%s)\n", path, mw_fmt_bytes(b, sizeof b, (uint64_t)st.st_size));
    else printf("  found and used: %s (cannot stat: %s)\n", path, strerror(errno));
}

/* The files of the resumed run, each with its size. */
static void list_resume_files(struct train_cli *c)
{
    char path[PATH_MAX];
    if (!mw_offload_record_path(c->rsm.rec.nvme_dir, path, sizeof path)) print_found(path);
    for (uint32_t i = 0; i < c->rsm.rec.ndirs; i++)
        if (!mw_offload_record_file_path(&c->rsm.rec, (int)i, path, sizeof path)) print_found(path);
    fflush(stdout);
}

/* --resume DIR: reads the record, makes its settings the defaults of everything the command line
 * did not give (as a checkpoint's), and lists the files of the run that are used. */
int train_read_resume_dir(struct train_cli *c, struct mw_ckpt_info *ci)
{
    if (c->world > 1)
        return train_usage_error("--resume %s: resuming from the NVMe state runs on one rank for now; resume a multi-rank "
                           "run from its checkpoints (--resume ckpt_N.r%%r.mwck)", c->A.resume);
    int err = mw_train_resume_read(c->A.resume, &c->rsm);
    char done[1024];
    if (err == -ENOENT && mw_offload_run_done_read(c->A.resume, done, sizeof done) == 0) {
        (void)mw_offload_run_tidy(c->A.resume); /* a retire cut short: its leftovers */
        printf("the run in %s finished; nothing to resume:\n%s", c->A.resume, done);
        return 3; /* finished: rc 0 */
    }
    if (err) {
        mw_cli_fail("reading the commit record", err);
        if (err == -ENOENT)
            fprintf(stderr, "memwall train: %s: a run killed before its first step was committed, or one that "
                    "finished, leaves nothing to resume (remove %s/%s.* and start again)\n", c->A.resume, c->A.resume,
                    "memwall-offload");
        return 1;
    }
    c->resume_dir = 1;
    *ci = c->rsm.info;
    if (c->rsm.run_spec) { /* the whole run as it was started (train_spec.c) */
        if (GIVEN("nvme-dir") && strcmp(c->A.nvme_dir, c->rsm.rec.nvme_dir)) {
            char a[PATH_MAX], b[PATH_MAX];
            if (mw_train_abs_path(c->A.nvme_dir, a, sizeof a) || mw_train_abs_path(c->rsm.rec.nvme_dir, b, sizeof b) || strcmp(a, b))
                return train_usage_error("--nvme-dir differs from the directory given to --resume, %s: give --resume alone", c->A.resume);
        }
        printf("resuming the run in %s from its last committed step, %" PRId64 " of %" PRId64 " (a step in flight when it "
               "stopped runs again)\n", c->A.resume, ci->step, ci->train.steps);
        int r = train_spec_apply(&c->spec, c->rsm.run_spec, c->A.resume, NULL, ci->step, &c->spec_applied);
        if (r) return r;
        c->A.nvme_dir = c->rsm.rec.nvme_dir; /* where the record is now, whatever the run called it */
        c->A.tier = "nvme";
        list_resume_files(c);
        return 0;
    }
    int r = train_apply_checkpoint(c, ci);
    if (r) return r;
    if (!GIVEN("offload-params")) c->A.offload_params = c->rsm.offload_params == MW_TIER_NVME ? "nvme" : "dram";
    if (!GIVEN("schedule")) c->A.schedule = c->rsm.layer_major ? "layer-major" : "batch-major";
    if (!GIVEN("sync-update")) c->A.sync_update = c->rsm.sync_update;
    if (!GIVEN("prefetch-depth")) c->A.prefetch_depth = c->rsm.prefetch_depth;
    if (!GIVEN("buffer-count")) c->A.buffer_count = c->rsm.buffer_count;
    if (!GIVEN("subgroup-size")) c->A.subgroup_size = c->rsm.subgroup_size;
    if (!GIVEN("aio-block-size")) c->A.aio_block_size = c->rsm.io_block_size;
    if (!GIVEN("aio-queue-depth")) c->A.aio_queue_depth = c->rsm.io_queue_depth;
    if (!GIVEN("nvme-dir")) c->A.nvme_dir = c->rsm.rec.nvme_dir;
    c->A.tier = "nvme";
    printf("resuming the run in %s from its last committed step, %" PRId64 " of %" PRId64 " (a step in flight when it "
           "stopped runs again)\n", c->A.resume, ci->step, ci->train.steps);
    list_resume_files(c);
    return 0;
}

/* The settings read from --ds-config: string options point into it until the command ends. */

/* --ds-config: every setting of the file whose option the command line did not give, applied
 * through the option table (same checks as typed flags); warnings and what was applied are
 * printed by rank 0. */
int train_apply_ds_config(struct train_cli *c)
{
    int err = mw_ds_config_load(c->A.ds_config, c->world, &c->ds);
    if (err) {
        fprintf(stderr, "memwall train: --ds-config: %s\n", mw_error_msg());
        return err == -ENOMEM ? 1 : 2;
    }
    if (c->rank == 0)
        for (int i = 0; i < c->ds.n_warnings; i++) fprintf(stderr, "memwall train: warning: %s\n", c->ds.warnings[i]);
    char applied[2048] = "", kept[512] = "";
    for (int i = 0; i < c->ds.n_settings; i++) {
        const struct mw_ds_setting *st = &c->ds.settings[i];
        char *dst = GIVEN(st->option) ? kept : applied;
        size_t cap = dst == kept ? sizeof kept : sizeof applied, l = strlen(dst);
        snprintf(dst + l, cap - l, " --%s %s", st->option, st->value);
        if (dst == kept) continue;
        char origin[600];
        snprintf(origin, sizeof origin, "%s: %s", c->A.ds_config, st->key);
        if (mw_opts_set(&c->spec, st->option, st->value, origin) != MW_OPTS_OK) return 2;
    }
    printf("ds-config %s:%s%s%s\n", c->A.ds_config, applied[0] ? applied : " (no settings)",
           kept[0] ? " | overridden by the command line:" : "", kept);
    return 0;
}
