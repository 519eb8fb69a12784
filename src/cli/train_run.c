/*
 * train_run.c — one `memwall train` run: the data, the trainer and its outputs checked, the header,
 * the steps (progress lines, the JSON log, checkpoints, SIGINT/SIGTERM), the figures and the
 * final outputs, after which the NVMe state goes.
 */
#include "cli/train_cli.h"
#include "memwall/tok.h"

static void fmt_mib(char *b, size_t n, uint64_t bytes, int gib)
{
    if (gib) snprintf(b, n, "%.2f", (double)bytes / 1073741824.0);
    else snprintf(b, n, "%.1f", (double)bytes / 1048576.0);
}

/* "DRAM MiB params/grads/optim/acts 12.6/12.6/25.2/210.0 | NVMe -" */
static void fmt_tiers(char *out, size_t n, const struct mw_train_bytes *b)
{
    uint64_t dram = b->params + b->grads + b->opt_dram + b->acts;
    int gib = dram >= 10ull << 30;
    char p[32], g[32], o[32], a[32], nv[48];
    fmt_mib(p, sizeof p, b->params, gib); fmt_mib(g, sizeof g, b->grads, gib);
    fmt_mib(o, sizeof o, b->opt_dram, gib); fmt_mib(a, sizeof a, b->acts, gib);
    if (b->opt_nvme) mw_fmt_bytes(nv, sizeof nv, b->opt_nvme);
    else snprintf(nv, sizeof nv, "-");
    snprintf(out, n, "DRAM %s params/grads/optim/acts %s/%s/%s/%s | NVMe optim %s",
             gib ? "GiB" : "MiB", p, g, o, a, nv);
}

static void print_sample(const int32_t *tok, int n, enum mw_tokenizer kind)
{
    char buf[32];
    for (int i = 0; i < n; i++) {
        if (kind != MW_TOKENIZER_BYTES) printf("%s%d", i ? " " : "", tok[i]);
        else if (tok[i] < 256 && (tok[i] == '\n' || (tok[i] >= 32 && tok[i] < 127))) putchar(tok[i]);
        else if (tok[i] < 256) printf("\\x%02x", tok[i]); /* not printable ASCII: escaped */
        else { mw_tok_decode(tok[i], buf, sizeof buf); fputs(buf, stdout); }
    }
    putchar('\n');
}

struct run_state {
    const char *data_path;        /* absolute */
    char abs_data[PATH_MAX];
    struct mw_train_bytes tb;     /* the model's bytes per tier, as the header printed them */
    int streamed;                 /* weights streamed from NVMe */
    uint64_t tokens_run;          /* tokens trained by this invocation */
    struct mw_train_log log;
    struct mw_train_outlock *outlock;
    struct mw_trace *trace;
    struct mw_trainer tr;
    struct mw_data data;
    char tiers[256];
};

/* The model's own arrays are plain host allocations (the engine's go through its tiers, which
 * record themselves): account them in the trace as host memory. */
static void trace_model_memory(struct train_cli *c, struct run_state *s, const struct mw_train_bytes *tb)
{
    uint64_t total = 0;
    total += tb->params;
    mw_trace_alloc(s->trace, MW_TIER_DRAM, MW_KIND_WEIGHTS, tb->params,
                   c->world > 1 && c->A.zero == 3 ? "model params (ZeRO-3 shard)" : "model params", total);
    total += tb->grads;
    mw_trace_alloc(s->trace, MW_TIER_DRAM, MW_KIND_GRADS, tb->grads, "model grads", total);
    total += tb->acts;
    mw_trace_alloc(s->trace, MW_TIER_DRAM, MW_KIND_ACTIVATIONS, tb->acts, "model activations", total);
}

static int do_eval(struct run_state *s, int64_t step, float *val)
{
    int err = mw_trainer_eval(&s->tr, val);
    if (err) { mw_cli_fail("validation", err); return 1; }
    printf("val   step %6" PRId64 " | val_loss %.6f\n", step, *val);
    fflush(stdout);
    return 0;
}

/* The last checkpoint this run wrote, named after a failure (what a re-run resumes from). */

static void ckpt_hint(struct train_cli *c)
{
    if (c->last_ckpt[0])
        fprintf(stderr, "memwall: the last checkpoint, %s (step %" PRId64 "), is intact: continue with --resume %s\n",
                c->last_ckpt, c->last_ckpt_step, c->last_ckpt);
}

static int save_ckpt(struct train_cli *c, struct run_state *s, const char *data_path)
{
    char path[PATH_MAX];
    int pl = c->world > 1 ? snprintf(path, sizeof path, "%s/ckpt_%08" PRId64 ".r%d.mwck", c->A.out_dir, s->tr.step, c->rank)
                       : snprintf(path, sizeof path, "%s/ckpt_%08" PRId64 ".mwck", c->A.out_dir, s->tr.step);
    if (pl < 0 || (size_t)pl >= sizeof path) {
        mw_cli_fail("writing the checkpoint", mw_error_set(-ENAMETOOLONG, "--out-dir %s is too long for a checkpoint path", c->A.out_dir));
        return 1;
    }
    uint64_t t0 = mw_now_ns();
    /* ZeRO-3: every rank writes the whole weights beside its optimizer shard. */
    int err = mw_trainer_save(&s->tr, data_path, path);
    if (err) { mw_cli_fail("writing the checkpoint", err); ckpt_hint(c); return 1; }
    if (c->world == 1) {
        snprintf(c->last_ckpt, sizeof c->last_ckpt, "%s", path);
        c->last_ckpt_step = s->tr.step;
    }
    if (c->world > 1)
        printf("ckpt  step %6" PRId64 " | %s/ckpt_%08" PRId64 ".r%%r.mwck, one per rank (%.1f s)\n", s->tr.step, c->A.out_dir,
               s->tr.step, (double)(mw_now_ns() - t0) / 1e9);
    else
        printf("ckpt  step %6" PRId64 " | %s (%.1f s)\n", s->tr.step, path, (double)(mw_now_ns() - t0) / 1e9);
    return 0;
}

/* Tests of a disk that fills up during a run: MEMWALL_TEST_STOP_AT=S stops the process (SIGSTOP)
 * after step S and its checkpoint, for the test to fill the disk and continue it (SIGCONT). */
static void test_stop_hook(int64_t step)
{
    const char *e = getenv("MEMWALL_TEST_STOP_AT");
    if (e && atoll(e) == step) {
        fflush(NULL);
        raise(SIGSTOP);
        usleep(300 * 1000); /* a signal sent while stopped is taken (signals.c) before the next step */
    }
}

/* Tests of rank failure: MEMWALL_TEST_EXIT_AT=R:S makes rank R exit(3) after step S. */
static void test_exit_hook(struct train_cli *c, int64_t step)
{
    const char *e = getenv("MEMWALL_TEST_EXIT_AT");
    int r;
    long long st;
    if (e && sscanf(e, "%d:%lld", &r, &st) == 2 && r == c->rank && st == step) {
        fprintf(stderr, "memwall (rank %d): MEMWALL_TEST_EXIT_AT: exiting with status 3 after step %lld\n", c->rank, st);
        fflush(NULL);
        exit(3);
    }
}

/* ZeRO-2/3: the gradient and (ZeRO-3) weight memory each rank held, measured; the weights
 * against what the planner predicts for the layout. */
static int report_zero_memory(struct train_cli *c, struct run_state *s, const struct mw_net_config *nc)
{
    struct mw_train_residency_info ri;
    int err = mw_trainer_info(&s->tr, &ri, 1); /* collective: the largest peaks over the ranks */
    if (err) { mw_cli_fail("collecting the ZeRO memory figures", err); return 1; }
    const struct mw_train_zero_info zi = ri.zero;
    if (zi.stage < 2) return 0;
    uint64_t peak = zi.weights_resident_peak, gpeak = zi.grads_resident_peak;
    {
        char a[32], b[32], d[32];
        printf("ZeRO-%d gradients per rank: peak resident %s (%" PRIu64 " bytes; the largest over the %d ranks, measured "
               "with mincore) of %s for the whole model; owned shard %s, the rest only until each bucket is reduced\n",
               zi.stage, mw_fmt_bytes(a, sizeof a, gpeak), gpeak, c->world,
               mw_fmt_bytes(b, sizeof b, s->tr.model.sizes.grads_bytes), mw_fmt_bytes(d, sizeof d, zi.own_n * sizeof(float)));
    }
    if (zi.stage != 3) return 0;
    struct mw_plan_zero3_weights pz;
    struct mw_model md; /* the family's description, as the planner reads it */
    nc->family->config_describe(nc->raw, &md);
    if ((err = mw_plan_zero3_weights(&md, zi.shard_ranks, 4.0, &pz))) {
        mw_cli_fail("the planner's ZeRO-3 prediction", err);
        return 1;
    }
    char a[32], b[32], d[32];
    printf("ZeRO-3 weights per rank: peak resident %s (%" PRIu64 " bytes; the largest over the %d ranks, measured with "
           "mincore) | rank 0's shard %s | whole model %zu bytes (%s)\n", mw_fmt_bytes(a, sizeof a, peak), peak, c->world,
           mw_fmt_bytes(b, sizeof b, zi.own_n * sizeof(float)), s->tr.model.sizes.params_bytes,
           mw_fmt_bytes(d, sizeof d, s->tr.model.sizes.params_bytes));
    printf("  planner predicts %s (%" PRIu64 " bytes: shard %s + gathered %s, the %s and a %s); measured/predicted %.3f\n",
           mw_fmt_bytes(a, sizeof a, pz.total_bytes), pz.total_bytes, mw_fmt_bytes(b, sizeof b, pz.shard_bytes),
           mw_fmt_bytes(d, sizeof d, pz.gathered_bytes), pz.largest_unit, pz.second_unit,
           (double)peak / (double)pz.total_bytes);
    return 0;
}

/* The trace, once the trainer is gone (its tiers record their frees). 0 or 1 (printed). */
static int write_trace(struct train_cli *c, struct run_state *s)
{
    mw_trainer_free(&s->tr);
    int err = mw_trace_write(s->trace, c->A.trace);
    if (err) { mw_cli_fail("writing the trace", err); return 1; }
    printf("trace: %s\n", c->A.trace);
    fflush(stdout);
    if ((err = mw_report_text_summary(c->A.trace, stdout))) { mw_cli_fail("summarising the trace", err); return 1; }
    return 0;
}

/* Every output is durable: the NVMe state goes, a marker of the finished run stays. */
static int retire_state(struct train_cli *c, const struct mw_train_config *tc)
{
    char done[PATH_MAX + 256];
    snprintf(done, sizeof done, "finished all %" PRId64 " steps%s%s\n", tc->steps, c->A.out_dir ? "; the model: " : "",
             c->A.out_dir ? c->A.out_dir : "");
    if (c->A.out_dir) snprintf(done + strlen(done) - 1, sizeof done - strlen(done) + 1, "/model.safetensors\n");
    return mw_offload_run_retire(tc->nvme_dir, done);
}

/* SIGINT/SIGTERM (signals.c), the same answer on every rank (they stop after the same step). */
static int stop_requested(struct train_cli *c, struct run_state *s)
{
    uint64_t sig = (uint64_t)mw_cli_stop_signal(), any = sig;
    if (c->world > 1 && mw_trainer_max_u64(&s->tr, sig, &any)) return 0;
    return (int)any;
}

/* The run stops between steps: the step in flight committed, a checkpoint where there is no
 * commit record, the log and the trace written, and how to continue. Returns 128 + the signal. */
static int stop_run(struct train_cli *c, struct run_state *s, int sig, const char *data_path)
{
    const struct mw_train_config *tc = &s->tr.cfg;
    int journal = tc->journal, err = mw_trainer_finish(&s->tr);
    if (err) mw_cli_fail("finishing the step in flight", err);
    char how[PATH_MAX + 64] = "";
    int64_t step = s->tr.step, steps = tc->steps;
    if (!err && journal)
        snprintf(how, sizeof how, "memwall train --resume %.*s", DIR0(tc->nvme_dir));
    else if (!err && c->A.out_dir && !save_ckpt(c, s, data_path) && c->world == 1)
        snprintf(how, sizeof how, "memwall train --resume %s", c->last_ckpt);
    else if (!err && c->A.out_dir && c->world > 1)
        snprintf(how, sizeof how, "mpirun -np %d memwall train --resume %s/ckpt_%08" PRId64 ".r%%r.mwck", c->world, c->A.out_dir, step);
    if ((err = mw_train_log_close(&s->log))) mw_cli_fail("writing --log-json", err);
    if (s->trace) write_trace(c, s);
    fprintf(stderr, "memwall train: stopped by %s after step %" PRId64 " of %" PRId64 "; %s%s\n",
            sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal", step, steps,
            how[0] ? "continue with: " : "nothing was saved to continue from (give --out-dir, or --optimizer-tier nvme)",
            how);
    return 128 + sig;
}

/* --dram-budget with the streamed run's knobs left to memwall: the budget picks them
 * (mw_train_fit_budget); a resumed run keeps its own. 0 or 1 (printed). */
static int fit_budget(struct train_cli *c, const struct mw_net_config *nc, struct mw_train_config *tc)
{
    if (c->A.resume || c->world > 1) return 0;
    unsigned free_knobs = (GIVEN("subgroup-size") ? 0u : MW_FIT_SUBGROUP) | (GIVEN("buffer-count") ? 0u : MW_FIT_BUFFERS) |
                          (GIVEN("prefetch-depth") ? 0u : MW_FIT_PREFETCH) |
                          (!strcmp(c->A.activations, "auto") || !GIVEN("activations") ? MW_FIT_ACTS : 0u) | MW_FIT_GRADS;
    struct mw_train_fit fit;
    int err = mw_train_fit_budget(nc, tc, free_knobs, &fit);
    if (err) { mw_cli_fail("fitting the run into --dram-budget", err); return 1; }
    if (!fit.changed) return 0;
    char b1[32], b2[32];
    printf("  --dram-budget %s chose: subgroups of %llu parameters, %d staging buffers, prefetch depth %d, block "
           "activations %s%s%s (planned peak %s; %d plan%s tried)\n", mw_fmt_bytes(b1, sizeof b1, tc->dram_budget),
           (unsigned long long)tc->subgroup_size, tc->buffer_count, tc->prefetch_depth,
           tc->acts_nvme ? "on NVMe" : "recomputed", tc->keep_grads ? ", gradients kept in DRAM between steps" : "",
           tc->keep_tied ? ", the tied embedding kept for the head" : "",
           mw_fmt_bytes(b2, sizeof b2, fit.chosen_total), fit.tried,
           fit.tried == 1 ? "" : "s");
    /* What the run resolved is what its record keeps. */
    c->A.subgroup_size = tc->subgroup_size;
    c->A.buffer_count = tc->buffer_count;
    c->A.prefetch_depth = tc->prefetch_depth;
    if (tc->layer_major) c->A.activations = tc->acts_nvme ? "nvme" : "recompute";
    return 0;
}

/* Data, trace, the trainer and its outputs checked, the log opened: 0, or 1 (printed). */
static int run_setup(struct train_cli *c, struct run_state *s, const char *data_path, const struct mw_net_config *nc,
                     const struct mw_train_config *tc, const struct mw_ckpt_info *resume_info)
{
    int err;
    struct mw_data_opts dopt;
    mw_data_opts_default(&dopt);
    if ((err = mw_data_open(&s->data, data_path, &dopt))) { mw_cli_fail("opening the data", err); return 1; }
    /* Checkpoints record the absolute path, so --resume works from any directory. */
    if (!realpath(data_path, s->abs_data)) snprintf(s->abs_data, sizeof s->abs_data, "%s", data_path);
    data_path = s->data_path = s->abs_data;
    struct mw_ckpt_info ck_probe;
    if (tc->ckpt_every > 0 && strlen(data_path) >= sizeof ck_probe.data_path) { /* refused now, not at the first checkpoint */
        err = mw_error_set(-ENAMETOOLONG, "the data path is %zu bytes, and a checkpoint records at most %zu (move or "
                           "link the data to a shorter path): %s", strlen(data_path), sizeof ck_probe.data_path - 1, data_path);
        mw_cli_fail("checking --ckpt-every", err);
        return 1;
    }
    struct mw_train_config tcfg = *tc;
    if (c->A.trace) {
        if ((err = mw_trace_init(&s->trace, 0))) { mw_cli_fail("creating the trace recorder", err); return 1; }
        mw_trace_thread_name(s->trace, "train");
        mw_trace_meta(s->trace, "command", "memwall train");
        char v[32];
        snprintf(v, sizeof v, "%d", c->rank);
        mw_trace_meta(s->trace, "rank", v);
        snprintf(v, sizeof v, "%d", c->world);
        mw_trace_meta(s->trace, "world_size", v);
        snprintf(v, sizeof v, "%d", c->world > 1 ? (int)c->A.zero : 0);
        mw_trace_meta(s->trace, "zero_stage", v);
        tcfg.trace = s->trace;
        if (c->comm) mw_comm_set_trace(c->comm, s->trace);
        if ((resume_info || c->resume_dir) && (err = mw_trace_continue(s->trace, c->A.trace))) {
            mw_cli_fail("continuing the trace", err);
            return 1;
        }
    }
    if ((err = fit_budget(c, nc, &tcfg))) return 1;
    if ((err = mw_trainer_init(&s->tr, nc, &tcfg, &s->data))) {
        train_leftover_hint(err, tc->nvme_dir);
        mw_cli_fail(c->resume_dir ? "resuming from the NVMe state" : "building the model", err);
        return 1;
    }
    {
        c->A.data = data_path; /* absolute */
        char *spec = NULL;
        if ((err = train_spec_build(&c->spec, c->A.out_dir, tc->journal ? tc->nvme_dir : NULL, &spec)) ||
            (err = mw_trainer_set_run_spec(&s->tr, spec))) {
            free(spec);
            mw_cli_fail("recording the run's settings", err);
            return 1;
        }
        free(spec);
    }
    if (c->rank == 0 || c->world == 1) {
        /* Every output before the first step (src/train/outputs.c), the out-dir locked for this run. */
        uint64_t mb = s->tr.model.sizes.params_bytes + (1u << 20);
        struct mw_train_outputs oo = {c->A.out_dir, c->A.log_json, c->A.trace, data_path, mb,
                                      c->A.out_dir && tc->ckpt_every > 0 ? mw_trainer_ckpt_bytes(&s->tr) : 0};
        if ((err = mw_train_outputs_check(&oo, &s->outlock))) { mw_cli_fail("checking the outputs", err); return 1; }
    }
    if (c->A.init_st && !tcfg.init_safetensors && (err = mw_net_load_safetensors(&s->tr.model, c->A.init_st))) {
        mw_cli_fail("loading --init-safetensors", err);
        return 1;
    }
    if (resume_info && (err = mw_trainer_load(&s->tr, c->A.resume))) { mw_cli_fail("resuming from the checkpoint", err); return 1; }
    /* From here on every committed step is durable: a kill leaves a run that --resume DIR continues. */
    /* A step's record waits for its log line (train_steps): a resume keeps the log up to the
     * committed step, so that step's line must be there. */
    if (tc->journal && ((err = mw_trainer_journal_begin(&s->tr, data_path)) || (err = mw_trainer_journal_allow(&s->tr)))) {
        train_leftover_hint(err, tc->nvme_dir);
        mw_cli_fail("starting the commit records", err);
        return 1;
    }
    if (c->A.out_dir && (err = mw_mkdir_p(c->A.out_dir, 0777))) { mw_cli_fail("creating --out-dir", err); return 1; }
    if (c->A.save_hf && c->rank == 0) { /* written at the end: refused now rather than after the run */
        if ((err = mw_mkdir_p(c->A.save_hf, 0777))) { mw_cli_fail("creating --save-hf", err); return 1; }
        if (access(c->A.save_hf, W_OK) != 0) {
            err = mw_error_set(-errno, "--save-hf %s is not writable: %s", c->A.save_hf, strerror(errno));
            mw_cli_fail("checking --save-hf", err);
            return 1;
        }
    }
    if (c->A.log_json && c->rank == 0) {
        /* A resumed run keeps the lines up to its step; one resumed at step 0 logs step 0's validation
         * again (train_steps), so it keeps none. */
        int dropped = 0;
        int64_t keep = (resume_info || c->resume_dir) && s->tr.step > 0 ? s->tr.step : -1;
        if ((err = mw_train_log_open(&s->log, c->A.log_json, keep, &dropped))) {
            mw_cli_fail("opening --log-json", err);
            return 1;
        }
        if (dropped)
            printf("  log %s: %d line%s after step %" PRId64 " dropped (they run again)\n", c->A.log_json, dropped,
                   dropped == 1 ? "" : "s", s->tr.step);
    }
    return 0;
}

/* What the run is, before its first step. */
static void print_header(struct train_cli *c, struct run_state *s, const struct mw_net_config *nc, const struct mw_train_config *tc,
                         const struct mw_ckpt_info *resume_info)
{
    const char *data_path = s->data_path;
    struct mw_train_bytes tb;
    mw_trainer_bytes(&s->tr, &tb);
    s->tb = tb;
    if (s->trace) trace_model_memory(c, s, &tb);
    fmt_tiers(s->tiers, sizeof s->tiers, &tb);
    char b1[32], b2[32];
    char summary[200];
    nc->family->config_summary(nc->raw, summary, sizeof summary);
    printf("memwall train: %s (%zu params, %s fp32)\n", summary, s->tr.model.sizes.n_params,
           mw_fmt_bytes(b1, sizeof b1, s->tr.model.sizes.params_bytes));
    printf("  data %s: %" PRIu64 " tokens (%s), %" PRIu64 " train / %" PRIu64 " validation\n", data_path,
           s->data.n_tokens, s->data.tokenizer == MW_TOKENIZER_BYTES ? "byte tokenizer" : "pre-tokenised shards",
           s->data.n_train_tokens, s->data.n_val_tokens);
    printf("  batch %d x seq %d x grad-accum %d = %d tokens/step, %" PRId64 " steps, lr %g (warm-up %" PRId64
           ", cosine to %g), threads %d, optimizer AdamW in %s%s\n",
           tc->batch, tc->seq, tc->grad_accum, tc->batch * tc->seq * tc->grad_accum, tc->steps, tc->lr,
           tc->warmup, tc->lr * tc->min_lr_frac, tc->threads, c->A.tier, tc->recompute ? ", recompute" : "");
    printf("  AdamW betas %g/%g, eps %g, weight decay %g, clip %g\n", tc->beta1, tc->beta2, tc->eps, tc->weight_decay,
           tc->clip);
    printf("  memory: %s (activations %s)\n", s->tiers, mw_fmt_bytes(b2, sizeof b2, tb.acts));
    if (!strcmp(c->A.tier, "nvme"))
        printf("  optimizer state (fp32 master + moments, two slots) on NVMe in %s: %s; I/O in pieces of %s, "
               "%u in flight, %d staging buffers\n", tc->nvme_dir, mw_fmt_bytes(b1, sizeof b1, tb.opt_nvme),
               mw_fmt_bytes(b2, sizeof b2, tc->io_block_size ? tc->io_block_size : 1u << 20),
               tc->io_queue_depth ? tc->io_queue_depth : 128u, tc->buffer_count);
    if (c->world > 1) {
        struct mw_train_residency_info ri;
        (void)mw_trainer_info(&s->tr, &ri, 0); /* this rank's: no error without a collective */
        const struct mw_train_zero_info zi = ri.zero;
        printf("  data parallel: %d ranks on %d node%s (MPI), global batch %d = %d per rank, ZeRO-%d", c->world,
               mw_comm_nodes(c->comm), mw_comm_nodes(c->comm) == 1 ? "" : "s", tc->batch, tc->batch / c->world, zi.stage);
        if (zi.stage >= 1)
            printf(", hierarchy %s (shard over %d rank%s, %d replica%s), subgroups of %" PRIu64 " params, rank 0 owns %" PRIu64
                   " of them", c->A.hier, zi.shard_ranks, zi.shard_ranks == 1 ? "" : "s", zi.replicas, zi.replicas == 1 ? "" : "s",
                   zi.subgroup_size, zi.own_n);
        printf("\n");
    }
    struct mw_train_residency_info rs;
    (void)mw_trainer_info(&s->tr, &rs, 0);
    const struct mw_train_stream_info si = rs.stream;
    s->streamed = si.active;
    if (si.active && s->trace) { /* the residency lanes of the report name the units */
        char k[32], v[32];
        int nu = s->tr.model.n_units;
        snprintf(v, sizeof v, "%d", nu);
        mw_trace_meta(s->trace, "units", v);
        for (int u = 0; u < nu; u++) {
            snprintf(k, sizeof k, "unit.%d.name", u);
            mw_net_unit_name(&s->tr.model, u, v, sizeof v);
            mw_trace_meta(s->trace, k, v);
        }
    }
    if (si.active) {
        char b[9][32];
        printf("  streaming: weights and gradients on NVMe with the optimizer state, a weight unit at a time in DRAM "
               "(prefetch depth %d, schedule %s, block activations %s)%s\n", si.prefetch_depth,
               tc->layer_major ? "layer-major" : "batch-major",
               tc->acts_nvme ? "on NVMe" : tc->layer_major || tc->recompute ? "recomputed" : "in DRAM",
               c->world > 1 && c->A.zero >= 1 ? "; each rank reads its own shard and all-gathers the rest of a unit"
               : c->world > 1 ? "; each rank streams the whole model from its own NVMe directory" : "");
        printf("  planned DRAM peak %s = runtime %s + activations %s + optimizer staging %s + streamed weights and "
               "gradients %s (weights at most %s, gradients at most %s)%s%s%s%s\n", mw_fmt_bytes(b[0], 32, si.planned_total),
               mw_fmt_bytes(b[1], 32, si.planned_runtime), mw_fmt_bytes(b[2], 32, si.planned_acts),
               mw_fmt_bytes(b[3], 32, si.planned_staging), mw_fmt_bytes(b[4], 32, si.planned_streamed),
               mw_fmt_bytes(b[5], 32, si.planned_weights), mw_fmt_bytes(b[6], 32, si.planned_grads),
               si.planned_dp ? " + collective buffers " : "", si.planned_dp ? mw_fmt_bytes(b[8], 32, si.planned_dp) : "",
               tc->dram_budget ? ", budget " : "", tc->dram_budget ? mw_fmt_bytes(b[7], 32, tc->dram_budget) : "");
    }
    if (c->A.trace) printf("  trace: %s%s\n", c->A.trace, c->world > 1 ? " (this rank's; one file per rank)" : "");
    if (resume_info || c->resume_dir) printf("  resumed from %s at step %" PRId64 "\n", c->A.resume, s->tr.step);
    if (tc->journal)
        printf("  commit record: %.*s/%s after every step (kill -9 loses at most the step in flight; "
               "'memwall train --resume %.*s' continues)\n", DIR0(tc->nvme_dir), MW_OFFLOAD_RECORD_NAME, DIR0(tc->nvme_dir));
    fflush(stdout);
}

/* The steps until the last, or a stop: 0, 1 (printed) or 128 + the signal. */
static int train_steps(struct train_cli *c, struct run_state *s, const struct mw_train_config *tc, const struct mw_ckpt_info *resume_info)
{
    int err;
    if ((resume_info || c->resume_dir) && s->tr.step >= tc->steps)
        printf("all %" PRId64 " steps of the run were committed before it stopped: finishing its outputs\n", tc->steps);
    float val = 0;
    if (tc->val_every > 0 && s->tr.step == 0) {
        if (do_eval(s, 0, &val)) return 1;
        if ((err = mw_train_log_val(&s->log, 0, val))) { mw_cli_fail("writing --log-json", err); return 1; }
    }
    while (s->tr.step < tc->steps) {
        int stop = stop_requested(c, s);
        if (stop) return stop_run(c, s, stop, s->data_path);
        struct mw_train_step_stats st;
        if ((err = mw_trainer_step(&s->tr, &st))) {
            mw_cli_fail("the training step", err);
            ckpt_hint(c);
            if (tc->journal)
                fprintf(stderr, "memwall train: the NVMe state of the last committed step is kept in %.*s: "
                        "'memwall train --resume %.*s' continues the run\n", DIR0(tc->nvme_dir), DIR0(tc->nvme_dir));
            return 1;
        }
        s->tokens_run += st.tokens;
        double ms = (double)st.ns / 1e6, tps = (double)st.tokens / ((double)st.ns / 1e9);
        test_exit_hook(c, st.step);
        char io[160] = "";
        if (st.nvme_read_bytes + st.nvme_write_bytes) {
            char r1[32], r2[32];
            snprintf(io, sizeof io, " | NVMe %s (%s)", mw_fmt_bytes(r1, sizeof r1, st.nvme_read_bytes + st.nvme_write_bytes),
                     mw_fmt_rate(r2, sizeof r2, (double)(st.nvme_read_bytes + st.nvme_write_bytes) / ((double)st.ns / 1e9)));
        }
        if (c->world > 1) {
            char c1[32];
            size_t l = strlen(io);
            snprintf(io + l, sizeof io - l, " | comm %s sent, %.1f ms waited", mw_fmt_bytes(c1, sizeof c1, st.comm_sent_bytes),
                     st.comm_wait_s * 1e3);
        }
        int last = st.step == tc->steps;
        int have_val = tc->val_every > 0 && (st.step % tc->val_every == 0 || last);
        if (st.step % c->A.print_every == 0 || last || st.step == 1 || st.skipped)
            printf("step %6" PRId64 "/%" PRId64 " | loss %.6f | lr %.2e | norm %6.3f%s | %7.0f tok/s | %8.1f ms | %s%s\n",
                   st.step, tc->steps, st.loss, st.lr, st.grad_norm,
                   st.skipped ? " (inf/NaN: skipped)" : st.clipped ? " (clipped)" : "", tps, ms, s->tiers, io);
        fflush(stdout);
        if (have_val && do_eval(s, st.step, &val)) return 1;
        if ((err = mw_train_log_step(&s->log, &st, have_val ? &val : NULL, &s->tb, c->world, c->world > 1 ? (int)c->A.zero : 0))) {
            mw_cli_fail("writing --log-json", err);
            return 1;
        }
        /* Its line is in the log: the step's record may be written (held until now: mw_trainer_journal_allow). */
        if (tc->journal && (err = mw_trainer_journal_allow(&s->tr))) { mw_cli_fail("the commit record", err); return 1; }
        if (tc->ckpt_every > 0 && (st.step % tc->ckpt_every == 0 || last) && save_ckpt(c, s, s->data_path)) return 1;
        test_stop_hook(st.step);
    }
    return 0;
}

/* Streamed runs: the measured peak beside the plan. 0 or 1 (printed). */
static int report_streaming(struct train_cli *c, struct run_state *s, const struct mw_train_config *tc)
{
    int err;
    if (s->streamed) {
        struct mw_train_residency_info ri;
        (void)mw_trainer_info(&s->tr, &ri, 0);
        const struct mw_train_stream_info se = ri.stream;
        /* Several ranks: the largest figures over them, and the worst rank's ratio. */
        uint64_t hwm = mw_proc_mem("VmHWM"), planned = se.planned_total, ratio = planned ? hwm * 1000000 / planned : 0;
        if ((err = mw_trainer_max_u64(&s->tr, hwm, &hwm)) || (err = mw_trainer_max_u64(&s->tr, planned, &planned)) ||
            (err = mw_trainer_max_u64(&s->tr, ratio, &ratio))) {
            mw_cli_fail("collecting the memory figures", err);
            return 1;
        }
        char b[7][32];
        printf("streaming: measured peak resident set (VmHWM) %s vs planned %s (measured/planned %.3f%s)%s%s; weights "
               "resident at most %s; NVMe: weights fetched %s (handed over by the update instead: %s), gradients "
               "written %s; blocked on fetches %.2f s\n",
               mw_fmt_bytes(b[0], 32, hwm), mw_fmt_bytes(b[1], 32, planned), (double)ratio / 1e6,
               c->world > 1 ? ", the largest over the ranks" : "", tc->dram_budget ? ", budget " : "",
               tc->dram_budget ? mw_fmt_bytes(b[2], 32, tc->dram_budget) : "", mw_fmt_bytes(b[3], 32, se.resident_peak),
               mw_fmt_bytes(b[4], 32, se.fetch_bytes), mw_fmt_bytes(b[6], 32, se.handoff_bytes),
               mw_fmt_bytes(b[5], 32, se.grad_write_bytes), se.wait_s);
    }
    return 0;
}

/* The model as a Hugging Face directory: DIR/model.safetensors and, when the family writes one,
 * DIR/config.json (collective under ZeRO-3: every rank gathers, rank 0 writes). 0 or 1 (printed). */
static int save_model_dir(struct train_cli *c, struct run_state *s, const char *dir, const char *opt)
{
    char path[PATH_MAX], cj[PATH_MAX];
    int err = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", dir) >= sizeof path ||
        (size_t)snprintf(cj, sizeof cj, "%s/config.json", dir) >= sizeof cj)
        err = mw_error_set(-ENAMETOOLONG, "%s %s is too long for %s/model.safetensors", opt, dir, dir);
    if (!err && c->rank == 0) err = mw_mkdir_p(dir, 0777);
    if (!err) err = mw_trainer_save_safetensors(&s->tr, path, c->rank == 0);
    const struct mw_net_family *f = s->tr.model.family;
    if (!err && c->rank == 0 && f->hf_config_write) err = f->hf_config_write(s->tr.model.cfg.raw, cj);
    if (!err && c->rank == 0 && c->hf_tok[0]) { /* the tokenizer goes with the model */
        char tp[PATH_MAX], *text = NULL;
        size_t len = 0;
        if ((size_t)snprintf(tp, sizeof tp, "%s/tokenizer.json", dir) >= sizeof tp)
            err = mw_error_set(-ENAMETOOLONG, "%s %s is too long for tokenizer.json", opt, dir);
        else if (strcmp(tp, c->hf_tok) && !(err = mw_read_small_file(c->hf_tok, "the tokenizer", (size_t)1 << 30, &text, &len)))
            err = mw_atomic_write_file(tp, text, len);
        free(text);
    }
    if (err) { mw_cli_fail("writing the model", err); return 1; }
    if (c->rank == 0) printf("model: %s%s\n", path, f->hf_config_write ? " (with config.json: a Hugging Face directory)" : "");
    return 0;
}

/* The final outputs, durable, then the NVMe state goes. 0 or 1 (printed). */
static int finish_outputs(struct train_cli *c, struct run_state *s, const struct mw_train_config *tc)
{
    int err;
    if (c->A.out_dir && save_model_dir(c, s, c->A.out_dir, "--out-dir")) return 1;
    if (c->A.save_hf && save_model_dir(c, s, c->A.save_hf, "--save-hf")) return 1;
    if ((err = mw_train_log_close(&s->log))) { mw_cli_fail("writing --log-json", err); return 1; }
    if (c->A.sample_len > 0) {
        /* A byte tokenizer's end-of-text; a tokenizer.json's document token; else pre-tokenised GPT-2
         * shards' <|endoftext|> (50256). */
        int32_t prompt = s->data.tokenizer == MW_TOKENIZER_BYTES ? MW_TOK_EOT : (s->tr.model.vocab > 50256 ? 50256 : 0);
        mw_tok_t *tok = NULL;
        if (s->data.tokenizer != MW_TOKENIZER_BYTES && c->hf_tok[0]) {
            if ((err = mw_tok_load(&tok, c->hf_tok, "--tokenizer"))) { mw_cli_fail("reading the tokenizer", err); return 1; }
            int32_t d = mw_tok_doc_token(tok);
            if (d >= 0 && d < s->tr.model.vocab) prompt = d;
        }
        int32_t *out = malloc((size_t)c->A.sample_len * sizeof *out);
        if (!out) { mw_error_set(-ENOMEM, "no memory"); mw_cli_fail("sampling", -ENOMEM); return 1; }
        err = mw_trainer_sample(&s->tr, &prompt, 1, (int)c->A.sample_len, (float)c->A.temperature, (int)c->A.top_k,
                                (uint64_t)c->A.seed, out);
        if (err) { free(out); mw_tok_free(tok); mw_cli_fail("sampling", err); return 1; }
        printf("sample (%" PRId64 " tokens, temperature %g, top-k %" PRId64 ", seed %" PRId64 "):\n"
               "----------------------------------------\n", c->A.sample_len, c->A.temperature, c->A.top_k, c->A.seed);
        char *text = NULL;
        size_t tl = 0, tcap = 0;
        if (tok && !mw_tok_decode_ids(tok, out, (size_t)c->A.sample_len, 0, &text, &tl, &tcap)) {
            fwrite(text, 1, tl, stdout);
            putchar('\n');
        } else {
            print_sample(out, (int)c->A.sample_len, s->data.tokenizer);
        }
        free(text);
        mw_tok_free(tok);
        printf("----------------------------------------\n");
        free(out);
    }
    if (c->A.log_json) printf("log: %s\n", c->A.log_json);
    /* The commit record and the store files are kept at free; they go once every output is written. */
    if (tc->journal && (err = mw_trainer_finish(&s->tr))) { mw_cli_fail("finishing the last step", err); return 1; }
    if (s->trace && write_trace(c, s)) return 1;
    mw_trainer_free(&s->tr);
    if (tc->journal && (err = retire_state(c, tc))) { mw_cli_fail("removing the run's NVMe files", err); return 1; }
    return 0;
}

int train_run(struct train_cli *c, const char *data_path, const struct mw_net_config *nc, const struct mw_train_config *tc,
               const struct mw_ckpt_info *resume_info)
{
    struct run_state s;
    memset(&s, 0, sizeof s);
    int rc = run_setup(c, &s, data_path, nc, tc, resume_info);
    if (rc) goto out;
    print_header(c, &s, nc, &s.tr.cfg, resume_info); /* what the run uses: --dram-budget may have chosen knobs */
    uint64_t t_run = mw_now_ns();
    if ((rc = train_steps(c, &s, tc, resume_info))) goto out;
    double secs = (double)(mw_now_ns() - t_run) / 1e9;
    if (s.tokens_run)
        printf("done: %" PRIu64 " tokens in %.1f s, %.0f tokens/s\n", s.tokens_run, secs, (double)s.tokens_run / secs);
    if (c->world > 1 && !s.streamed && report_zero_memory(c, &s, nc)) { rc = 1; goto out; }
    if ((rc = report_streaming(c, &s, tc)) || (rc = finish_outputs(c, &s, tc))) goto out;
out:
    mw_train_log_close(&s.log);
    mw_trainer_free(&s.tr);
    mw_train_outputs_release(s.outlock);
    if (c->comm) mw_comm_set_trace(c->comm, NULL); /* the recorder goes; MPI stays until mw_cmd_train ends */
    mw_trace_free(s.trace);
    mw_data_free(&s.data);
    return rc;
}
