/*
 * engine.c — the offload engine's life cycle: init (allocate exactly what the plan said, open
 * the NVMe store, write the initial state), the step (enqueue, wait, commit), recovery after a
 * failed step, and statistics. Gradients are in grads.c, state readers/writers in state.c,
 * the pipeline itself in pipeline.c.
 *
 * Why the step commits in one place: the committed step counter decides which of the two
 * slots holds the state (transactional mode), so it must move only after every subgroup of
 * the step was written back, and never when any of them failed.
 */
#include "offload/internal.h"
#include "memwall/fsutil.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void mw_offload_hparams_default(struct mw_offload_hparams *h)
{
    h->lr = 1e-3;
    h->beta1 = 0.9;
    h->beta2 = 0.999;
    h->eps = 1e-8;
    h->weight_decay = 1e-2;
    h->grad_scale = 1.0f;
}

uint64_t ofl_stripe_for(uint64_t obj_bytes); /* placement.c */

static enum mw_alloc_kind alloc_kind(int r)
{
    return ofl_regions[r].kind == MW_OFFLOAD_MASTER ? MW_KIND_MASTER : MW_KIND_MOMENTS;
}

/* ------------------------------------------------------------------ init / free */


/* A finished run's marker without a record (mw_offload_run_retire cut short): the files left
 * beside it belong to that finished run and go, with the marker, before a new run starts. */
static void sweep_finished(const char *const *dirs, int nd)
{
    char p[4400];
    struct stat st;
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dirs[0], MW_OFFLOAD_DONE_NAME) >= sizeof p || stat(p, &st) != 0) return;
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dirs[0], MW_OFFLOAD_RECORD_NAME) < sizeof p && stat(p, &st) == 0) return;
    for (int i = 0; i < nd; i++)
        if ((size_t)snprintf(p, sizeof p, "%s/%s.%d.dat", dirs[i], OFL_FILE_PREFIX, i) < sizeof p) unlink(p);
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dirs[0], MW_OFFLOAD_DONE_NAME) < sizeof p) unlink(p);
}

/* The directory list a commit record names (journal.c): the first directory as "." (the record
 * lives there, so a run directory copied or moved elsewhere resumes where it now is), the others
 * absolute, so a resume from another working directory finds them. */
static int rec_dir_list(const char *dirs, char **out)
{
    size_t cap = 2, n;
    for (const char *d = dirs; *d; d++) cap += *d == ':' ? PATH_MAX + 1 : 0;
    char *p = malloc(cap);
    if (!p) return mw_error_set(-ENOMEM, "offload: out of memory");
    snprintf(p, cap, ".");
    n = 1;
    for (const char *d = strchr(dirs, ':'); d; d = strchr(d + 1, ':')) {
        size_t dl = strcspn(d + 1, ":");
        char one[PATH_MAX], abs_[PATH_MAX];
        if (dl >= sizeof one) { free(p); return mw_error_set(-ENAMETOOLONG, "offload: an NVMe directory name is too long"); }
        memcpy(one, d + 1, dl);
        one[dl] = 0;
        if (!realpath(one, abs_)) {
            int e = errno;
            free(p);
            return mw_error_set(-e, "offload: cannot resolve the NVMe directory %s: %s", one, strerror(e));
        }
        if (strchr(abs_, ':')) { free(p); return mw_error_set(-EINVAL, "offload: the NVMe directory %s has a ':' in its path", abs_); }
        n += (size_t)snprintf(p + n, cap - n, ":%s", abs_);
    }
    *out = p;
    return 0;
}

static int open_store(struct mw_offload *e)
{
    char *dirs_copy = strdup(e->cfg.nvme_dir);
    const char *dirs[64];
    int nd = 0;
    if (!dirs_copy) return mw_error_set(-ENOMEM, "offload: out of memory");
    for (char *save = NULL, *t = strtok_r(dirs_copy, ":", &save); t && nd < 64; t = strtok_r(NULL, ":", &save))
        dirs[nd++] = t;
    struct mw_store_config sc;
    mw_store_config_default(&sc);
    sc.dirs = dirs;
    sc.ndirs = nd;
    int rc = 0;
    uint64_t obj_max = 0, ignored;
    ofl_nvme_span(e, 0, &ignored, &obj_max);
    sc.stripe_size = ofl_stripe_for(obj_max);
    sc.capacity = e->plan.tier_bytes[MW_TIER_NVME] + (uint64_t)nd * sc.stripe_size;
    sc.tier = e->tier[MW_TIER_NVME];
    sc.trace = e->tr;
    sc.file_prefix = OFL_FILE_PREFIX;
    const struct mw_offload_record *rec = e->cfg.resume;
    sc.reopen = rec != NULL;
    sc.keep_files = rec != NULL; /* a resume that fails must not take the run's files with it */
    e->sto_ndirs = nd;
    e->sto_stripe = sc.stripe_size;
    e->sto_crc_block = sc.crc_block;
    e->sto_capacity = sc.capacity;
    /* reads of the next subgroups and writes of the last share one queue: keep it deep */
    sc.aio_config.queue_depth = e->cfg.io_queue_depth ? e->cfg.io_queue_depth : 128;
    if (e->cfg.io_block_size) sc.aio_config.block_size = e->cfg.io_block_size;
    if (rec && (rc = ofl_journal_check(e, rec))) { free(dirs_copy); return rc; }
    if (!rec && e->cfg.journal) sweep_finished(dirs, nd);
    rc = mw_store_open(&e->store, &sc);
    free(dirs_copy);
    if (rc) return rc;
    if (e->cfg.journal) {
        size_t n = strlen(e->cfg.nvme_dir) + sizeof MW_OFFLOAD_RECORD_NAME + 2;
        if (!(e->jpath = malloc(n))) return mw_error_set(-ENOMEM, "offload: out of memory");
        if ((rc = mw_offload_record_path(e->cfg.nvme_dir, e->jpath, n))) return rc;
        if ((rc = rec_dir_list(e->cfg.nvme_dir, &e->rec_dirs))) return rc;
        /* The directory is ours now (locked): a fresh run drops a record left without its files. */
        if (!rec) unlink(e->jpath);
        ofl_journal_sweep(e->jpath);
    }
    uint32_t per = e->cfg.stream ? 3 : 2; /* objects per subgroup in a record */
    e->obj = calloc(2 * (size_t)e->nsg, sizeof *e->obj);
    if (!e->obj) return mw_error_set(-ENOMEM, "offload: out of memory");
    for (uint32_t i = 0; i < e->nsg; i++) {
        uint64_t off, len;
        ofl_nvme_span(e, i, &off, &len);
        for (int slot = 0; slot < 2; slot++) {
            char name[64];
            snprintf(name, sizeof name, "sg%u.slot%d", i, slot);
            enum mw_alloc_kind k = e->cfg.place.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME ? MW_KIND_MOMENTS : MW_KIND_MASTER;
            rc = rec ? mw_store_obj_place(e->store, name, len, k, rec->ext_off + (size_t)(i * per + (uint32_t)slot) * rec->ndirs,
                                          &e->obj[2 * i + slot])
                     : mw_store_obj_create_ex(e->store, name, len, k, &e->obj[2 * i + slot]);
            if (rc) return rc;
        }
    }
    if (e->cfg.stream) {
        e->gobj = calloc((size_t)e->nsg, sizeof *e->gobj);
        if (!e->gobj) return mw_error_set(-ENOMEM, "offload: out of memory");
        for (uint32_t i = 0; i < e->nsg; i++) {
            char name[64];
            snprintf(name, sizeof name, "sg%u.grad", i);
            uint64_t len = MW_ALIGN_UP(4 * e->sgs[i].n, OFL_PAD);
            if ((rc = rec ? mw_store_obj_place(e->store, name, len, MW_KIND_GRADS, rec->ext_off + (size_t)(i * per + 2) * rec->ndirs,
                                               &e->gobj[i])
                          : mw_store_obj_create_ex(e->store, name, len, MW_KIND_GRADS, &e->gobj[i])))
                return rc;
        }
    }
    /* The caller's scratch comes last: not in a record (not state), a resume makes it afresh in
     * the space the placed objects leave. */
    if (e->plan.scratch_bytes &&
        (rc = mw_store_obj_create_ex(e->store, "scratch", e->plan.scratch_bytes, MW_KIND_ACTIVATIONS, &e->scratch)))
        return rc;
    return 0;
}

/* Subgroup i's initial state (master from src, or zeros; zero moments) into committed slot 0. */
static int write_initial_sg(struct mw_offload *e, uint32_t i, const float *src)
{
    struct mw_optim_slice s;
    ofl_view_staging(e, i, 0, &s);
    struct ofl_layout L;
    ofl_layout_make(&e->cfg, e->sgs[i].n, &L);
    memset(e->staging[0].ptr, 0, L.total);
    if (src) memcpy(s.master, src, 4 * e->sgs[i].n);
    return ofl_slot_store(e, i, 0);
}

/* Writes the initial state into committed slot 0. Streamed weights: the caller writes each
 * subgroup's (mw_offload_master_init) as it makes the weights, a subgroup at a time. */
static int write_initial(struct mw_offload *e, const float *src)
{
    if (!e->txn) {
        float *m = e->home[OFL_R_MASTER][0].ptr;
        if (src && !e->master_alias) memcpy(m, src, 4 * e->plan.total_elems);
        return 0;
    }
    if (e->cfg.stream) {
        if (!(e->uninit = calloc(e->nsg, 1))) return mw_error_set(-ENOMEM, "offload: out of memory");
        memset(e->uninit, 1, e->nsg);
        e->n_uninit = e->nsg;
        return 0;
    }
    for (uint32_t i = 0; i < e->nsg; i++) {
        int rc = write_initial_sg(e, i, src ? src + e->sgs[i].first : NULL);
        if (rc) return rc;
    }
    return 0;
}

uint32_t mw_offload_master_uninit(const struct mw_offload *e) { return e->n_uninit; }

int mw_offload_master_init(struct mw_offload *e, uint32_t sg, const float *src)
{
    if (!e->uninit) return mw_error_set(-EINVAL, "offload: the initial master is the caller's only with streamed weights");
    if (sg >= e->nsg) return mw_error_set(-EINVAL, "offload master init: no subgroup %u (%u)", sg, e->nsg);
    if (!e->uninit[sg]) return mw_error_set(-EINVAL, "offload master init: subgroup %u was written already", sg);
    int rc = ofl_check_quiet(e, "master_init");
    if (rc || (rc = write_initial_sg(e, sg, src))) return rc;
    e->uninit[sg] = 0;
    e->n_uninit--;
    return 0;
}

/* The accelerator (cfg.use_device): the default device of the registry in device.c, the only
 * place that names devices ("emu" until the configuration can name another), with the engine's
 * own host buffers that its copies read and write pinned for it (staging, DRAM homes, gradient
 * accumulation, working copy; not the caller's arrays, which may be madvised away). */
static int open_device(struct mw_offload *e)
{
    int rc = ofl_dev_init(&e->dev, NULL, e->tier[MW_TIER_DEVICE], e->plan.device_arena_bytes / 2, &e->cfg, e->tr);
    for (int b = 0; b < e->nbuf && !rc; b++) rc = ofl_dev_pin(e->dev, e->staging[b].ptr, e->staging[b].bytes);
    for (int r = 0; r < OFL_NREGIONS && !rc; r++)
        for (int s = 0; s < 2 && !rc; s++)
            if (!(r == OFL_R_MASTER && e->master_alias)) rc = ofl_dev_pin(e->dev, e->home[r][s].ptr, e->home[r][s].bytes);
    if (!rc) rc = ofl_dev_pin(e->dev, e->grads.ptr, e->grads.bytes);
    if (!rc) rc = ofl_dev_pin(e->dev, e->weights.ptr, e->weights.bytes);
    return rc;
}

/* The cost model (cost.h): the calibrated profile (cfg.profile, or the file MEMWALL_OFFLOAD_PROFILE
 * names when cfg.profile_fixed is 0), and auto's first plan, from the profile alone. */
static int open_cost(struct mw_offload *e)
{
    const char *path = e->cfg.profile_fixed ? NULL : getenv("MEMWALL_OFFLOAD_PROFILE");
    if (path && *path) {
        int rc = mw_offload_profile_load(path, &e->cfg.profile);
        if (rc) return mw_error_prepend(rc, "MEMWALL_OFFLOAD_PROFILE: ");
    }
    ofl_cost_init(&e->cost, &e->cfg.profile);
    if (e->cfg.policy != MW_OFFLOAD_POLICY_AUTO || !e->dev) return 0;
    e->plan_sg = calloc(e->nsg, sizeof *e->plan_sg);
    e->plan_mask = calloc(e->nsg, 1);
    e->plan_hist = calloc(e->nsg + 1, sizeof *e->plan_hist);
    e->plan_ratio = malloc((e->nsg + 1) * sizeof *e->plan_ratio);
    e->plan_mask_tried = calloc(e->nsg + 1, 1);
    if (!e->plan_sg || !e->plan_mask || !e->plan_hist || !e->plan_ratio || !e->plan_mask_tried) return mw_error_set(-ENOMEM, "offload: out of memory for auto's plan");
    ofl_policy_replan(e);
    return 0;
}

int mw_offload_init(struct mw_offload **out, const struct mw_offload_registry *r, const struct mw_offload_config *cfg)
{
    *out = NULL;
    struct mw_offload *e = calloc(1, sizeof *e);
    if (!e) return mw_error_set(-ENOMEM, "offload: out of memory");
    e->cfg = *cfg;
    e->jallow = UINT64_MAX; /* no record waits for the caller until mw_offload_journal_allow */
    if ((cfg->journal || cfg->resume) &&
        (cfg->place.tier[MW_OFFLOAD_MASTER] != MW_TIER_NVME || cfg->place.tier[MW_OFFLOAD_MOMENTS] != MW_TIER_NVME ||
         !cfg->journal)) {
        free(e);
        return mw_error_set(-EINVAL, "offload: a commit record (and a resume from one) needs the master weights and the "
                            "moments on NVMe, and journal = 1");
    }
    if (cfg->ext_grads_release && (!cfg->ext_grads || !cfg->ext_grads_accumulate || cfg->stream)) {
        free(e);
        return mw_error_set(-EINVAL, "offload: ext_grads_release needs the caller's accumulated ext_grads "
                            "(ext_grads_accumulate = 1) and no stream function");
    }
    int rc = mw_offload_plan_make(r, cfg, &e->plan);
    if (rc) { free(e); return rc; }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv_pipe, NULL);
    pthread_cond_init(&e->cv_cpu, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    e->tr = cfg->trace;
    e->txn = e->plan.transactional;
    e->fmt.grad = MW_OPTIM_F32;
    e->fmt.moments = ofl_mdtype(cfg->moments);
    e->fmt.weights_out = cfg->weights == MW_OFFLOAD_W_FP32 ? MW_OPTIM_NONE : ofl_wdtype(cfg->weights);
    e->master_alias = !e->txn && cfg->ext_weights && cfg->weights == MW_OFFLOAD_W_FP32;
    if ((rc = mw_offload_cut(r, e->plan.subgroup_size, &e->sgs, &e->nsg))) goto err;
    if ((rc = ofl_runs_build(e, r))) goto err;
    uint32_t n = e->nsg;
    e->st = calloc(n, sizeof *e->st);
    e->readyq = calloc(n, sizeof(uint32_t));
    e->cpuq = calloc(n, sizeof(uint32_t));
    e->updq = calloc(n, sizeof(uint32_t));
    if (!e->st || !e->readyq || !e->cpuq || !e->updq) { rc = mw_error_set(-ENOMEM, "offload: out of memory"); goto err; }
    for (uint32_t i = 0; i < n; i++) { e->st[i].buf = -1; e->st[i].e = e; }

    /* tiers: the engine's own accounting objects, budgets from the config */
    for (int t = 0; t < MW_TIER_COUNT; t++)
        if ((rc = mw_tier_init(&e->tier[t], (enum mw_tier_id)t, t == MW_TIER_NVME ? 0 : cfg->budget[t], e->tr))) goto err;
    struct mw_tier *host = e->tier[MW_TIER_DRAM];

    int slots = e->txn ? 2 : 1;
    uint64_t N = e->plan.total_elems;
    for (int reg = 0; reg < OFL_NREGIONS; reg++) {
        uint64_t bytes = ofl_region_bytes(cfg, (enum ofl_region)reg, N);
        if (!bytes || cfg->place.tier[ofl_region_kind((enum ofl_region)reg)] != MW_TIER_DRAM) continue;
        for (int s = 0; s < slots; s++) {
            if (reg == OFL_R_MASTER && e->master_alias) {
                e->home[reg][s].ptr = cfg->ext_weights; /* not ours: never freed */
                continue;
            }
            char label[48];
            snprintf(label, sizeof label, "offload %s slot %d", ofl_regions[reg].label, s);
            if ((rc = mw_tier_alloc(host, bytes, MW_ALLOC_ZERO | MW_ALLOC_NO_LOCK | MW_ALLOC_HUGE, alloc_kind(reg), label, &e->home[reg][s]))) goto err;
        }
    }
    if (!(cfg->ext_grads && cfg->ext_grads_accumulate))
        if ((rc = mw_tier_alloc(host, 4 * N, MW_ALLOC_ZERO | MW_ALLOC_NO_LOCK | MW_ALLOC_HUGE, MW_KIND_GRADS, "offload grad accumulation", &e->grads))) goto err;
    if (!cfg->ext_weights)
        if ((rc = mw_tier_alloc(host, ofl_wbytes(cfg->weights) * N, MW_ALLOC_ZERO | MW_ALLOC_NO_LOCK | MW_ALLOC_HUGE, MW_KIND_WEIGHTS,
                                "offload working copy", &e->weights))) goto err;
    if (e->txn) {
        ofl_layout_make(cfg, e->plan.subgroup_size, &e->lay);
        e->nbuf = cfg->buffer_count;
        e->staging = calloc((size_t)e->nbuf, sizeof *e->staging);
        e->free_bufs = calloc((size_t)e->nbuf, sizeof(int));
        if (!e->staging || !e->free_bufs) { rc = mw_error_set(-ENOMEM, "offload: out of memory"); goto err; }
        for (int b = 0; b < e->nbuf; b++) {
            unsigned fl = MW_ALLOC_IO | (cfg->staging_release ? MW_ALLOC_NO_LOCK : 0);
            if ((rc = mw_tier_alloc(host, e->lay.total, fl, MW_KIND_STAGING, "offload staging", &e->staging[b]))) goto err;
            e->free_bufs[e->nfree++] = b;
        }
        if ((rc = open_store(e))) goto err;
        e->bufcrc_n = (e->lay.total + e->sto_crc_block - 1) / e->sto_crc_block;
        e->bufcrc = malloc((size_t)e->nbuf * e->bufcrc_n * sizeof *e->bufcrc);
        if (!e->bufcrc) { rc = mw_error_set(-ENOMEM, "offload: out of memory for checksums"); goto err; }
    }
    if (cfg->use_device && (rc = open_device(e))) goto err;
    if ((rc = open_cost(e))) goto err;
    const float *src = cfg->ext_weights && cfg->weights == MW_OFFLOAD_W_FP32 ? cfg->ext_weights : NULL;
    if (cfg->resume) { /* the committed state of the record, checked against its digests */
        if ((rc = ofl_journal_restore(e, cfg->resume))) goto err;
        e->jon = 1;
        e->jkeep = 1; /* its files stay until the run finishes, whatever happens to this process */
        mw_store_set_keep_files(e->store, 1);
    } else if ((rc = write_initial(e, src))) goto err;
    e->cfg.resume = NULL;
    if ((rc = ofl_pipe_start(e))) goto err;
    *out = e;
    return 0;
err:
    {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mw_error_msg());
        mw_offload_free(e);
        return mw_error_set(rc, "%s", msg);
    }
}

void mw_offload_free(struct mw_offload *e)
{
    if (!e) return;
    if (e->in_flight) (void)mw_offload_step_wait(e); /* its result is lost with the engine */
    pthread_mutex_lock(&e->mu);
    if (e->jstate == 3) e->jstate = 0; /* a held record is not written: the record of the step before stays */
    pthread_mutex_unlock(&e->mu);
    if (e->threads_up) (void)ofl_journal_settle(e);     /* likewise a record being written */
    if (e->threads_up) ofl_preread_drop(e);
    ofl_pipe_stop(e);
    ofl_dev_free(e->dev);
    if (e->store) mw_store_close(e->store);
    free(e->obj);
    free(e->gobj);
    free(e->uninit);
    free(e->jpath);
    free(e->rec_dirs);
    free(e->jblob);
    for (int b = 0; b < e->nbuf && e->staging; b++) mw_tier_free(&e->staging[b]);
    free(e->staging);
    free(e->bufcrc);
    free(e->free_bufs);
    for (int r = 0; r < OFL_NREGIONS; r++)
        for (int s = 0; s < 2; s++) {
            if (r == OFL_R_MASTER && e->master_alias) continue;
            mw_tier_free(&e->home[r][s]);
        }
    mw_tier_free(&e->grads);
    mw_tier_free(&e->weights);
    for (int t = 0; t < MW_TIER_COUNT; t++)
        if (e->tier[t]) mw_tier_free_tier(e->tier[t]);
    free(e->st);
    free(e->readyq);
    free(e->cpuq);
    free(e->updq);
    free(e->ranges);
    free(e->sgs);
    free(e->runs);
    free(e->sg_run);
    free(e->pieces);
    free(e->plan_sg);
    free(e->plan_mask);
    free(e->plan_hist);
    free(e->plan_ratio);
    free(e->plan_mask_tried);
    pthread_cond_destroy(&e->cv_pipe);
    pthread_cond_destroy(&e->cv_cpu);
    pthread_cond_destroy(&e->cv_done);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

const struct mw_offload_plan *mw_offload_get_plan(const struct mw_offload *e) { return &e->plan; }
const struct mw_offload_subgroup *mw_offload_subgroups(const struct mw_offload *e, uint32_t *n)
{
    if (n) *n = e->nsg;
    return e->sgs;
}
uint64_t mw_offload_committed_steps(const struct mw_offload *e) { return e->committed; }

/* ------------------------------------------------------------------ helpers shared with state.c and grads.c */

void ofl_refresh_weights(struct mw_offload *e, uint64_t first, uint64_t n, const float *master)
{
    if (e->master_alias || e->cfg.stream) return; /* streaming: the caller fetches the master */
    char *w = e->cfg.ext_weights ? (char *)e->cfg.ext_weights : (char *)e->weights.ptr;
    if (!w) return;
    switch (e->cfg.weights) {
    case MW_OFFLOAD_W_FP32: memcpy(w + 4 * first, master, 4 * n); break;
    case MW_OFFLOAD_W_BF16: mw_f32_to_bf16_n(master, (uint16_t *)w + first, n); break;
    case MW_OFFLOAD_W_FP16: mw_f32_to_f16_n(master, (uint16_t *)w + first, n); break;
    }
}

/* Subgroups overlapping [first, first+n). */
void ofl_sg_span(const struct mw_offload *e, uint64_t first, uint64_t n, uint32_t *lo, uint32_t *hi)
{
    *lo = (uint32_t)(first / e->plan.subgroup_size);
    *hi = (uint32_t)((first + n - 1) / e->plan.subgroup_size);
}

int ofl_check_range(const struct mw_offload *e, uint64_t first, uint64_t n, const char *what)
{
    if (n == 0 || first >= e->plan.total_elems || n > e->plan.total_elems - first)
        return mw_error_set(-EINVAL, "offload %s: range [%llu, +%llu) outside the %llu parameters", what,
                            (unsigned long long)first, (unsigned long long)n, (unsigned long long)e->plan.total_elems);
    return 0;
}

int ofl_check_quiet(struct mw_offload *e, const char *what)
{
    if (e->n_started || e->in_backward || e->in_flight)
        return mw_error_set(-EBUSY, "offload %s: not allowed while a step is in progress", what);
    ofl_preread_drop(e); /* what follows uses staging buffer 0, or moves the slots */
    return 0;
}


/* ------------------------------------------------------------------ the step */

static void reset_step_locked(struct mw_offload *e)
{
    e->ready_head = e->ready_tail = 0;
    e->cpu_head = e->cpu_tail = e->upd_head = e->upd_tail = 0;
    e->n_done = e->n_started = 0;
    e->pre_on = 0; /* until the next commit allows them (ofl_preread_allow) */
    for (uint32_t i = 0; i < e->nsg; i++) {
        e->st[i].state = OFL_SG_IDLE;
        e->st[i].fresh = 0;
        e->st[i].wb = 0; /* (a handoff stays: one made between steps is for this step's update) */
    }
}

/* The caller's thread blocked on the step from tw to now (trace: exposed wait, docs/report.md). */
static void caller_wait(struct mw_offload *e, uint64_t tw)
{
    struct mw_trace_arg a[1] = {{"caller", 1}};
    mw_trace_span(e->tr, "offload", "wait", tw, mw_now_ns(), a, 1);
}

/* The record of step jstep is to be written now (e->mu held): by the pipeline thread, or, without
 * it, here (the lock dropped meanwhile); a failure is kept for ofl_journal_settle. */
static void journal_ask_locked(struct mw_offload *e)
{
    if (e->threads_up) {
        e->jstate = 1;
        pthread_cond_signal(&e->cv_pipe);
        return;
    }
    ofl_journal_record_locked(e);
}

void mw_offload_journal_allow(struct mw_offload *e, uint64_t step)
{
    pthread_mutex_lock(&e->mu);
    e->jallow = step;
    if (e->jstate == 3 && e->jstep <= step) journal_ask_locked(e);
    else if (e->threads_up) pthread_cond_signal(&e->cv_pipe); /* a step in flight whose writes all landed */
    pthread_mutex_unlock(&e->mu);
}

int ofl_journal_settle(struct mw_offload *e)
{
    pthread_mutex_lock(&e->mu);
    /* A held record: what follows (the next step writes the slot the last record names, the slots
     * move, the run ends) needs it written first, whether or not the caller allowed it. */
    if (e->jstate == 3) journal_ask_locked(e);
    while (e->jstate != 0) pthread_cond_wait(&e->cv_done, &e->mu);
    int rc = e->jerr;
    char msg[sizeof e->jmsg];
    snprintf(msg, sizeof msg, "%s", e->jmsg);
    pthread_mutex_unlock(&e->mu);
    return rc ? mw_error_set(rc, "offload: %s", msg) : 0;
}

int mw_offload_step_start(struct mw_offload *e, const struct mw_offload_hparams *hp)
{
    if (e->failed) return mw_error_set(-EBUSY, "offload: the last step failed; call mw_offload_recover first");
    if (e->n_uninit)
        return mw_error_set(-EINVAL, "offload step: the initial master of %u subgroups was not written "
                            "(mw_offload_master_init)", e->n_uninit);
    int jrc = ofl_journal_settle(e); /* this step writes the slot the last record's step left */
    if (jrc) return jrc;
    if (e->in_backward) return mw_error_set(-EINVAL, "offload step: call mw_offload_backward_end first");
    if (e->in_flight) return mw_error_set(-EBUSY, "offload step: the previous step is still running (mw_offload_step_wait)");
    int rc;
    if (e->micro_index == 0) { /* no backward reported: every gradient is final as it is */
        if ((rc = mw_offload_backward_begin(e, 1, NULL)) || (rc = mw_offload_backward_end(e))) return rc;
    }
    if (!e->armed && !hp) return mw_error_set(-EINVAL, "offload step: no hyper-parameters (not armed)");
    pthread_mutex_lock(&e->mu);
    e->step_call_t0 = mw_now_ns();
    if (!e->armed) { e->hp = *hp; e->armed = 1; } /* armed: the hp given at backward_begin rules (hp ignored) */
    e->in_flight = 1;
    for (uint32_t i = 0; i < e->nsg; i++) ofl_pipe_enqueue_locked(e, i);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

int mw_offload_step_in_flight(const struct mw_offload *e) { return e->in_flight; }

/* Subgroup sg is done (written), or with fresh_ok only refreshed into the working copy. */
static int sg_wait(struct mw_offload *e, uint32_t sg, int block, int fresh_ok, const char *what)
{
    if (sg >= e->nsg) return mw_error_set(-EINVAL, "offload %s: no subgroup %u (%u)", what, sg, e->nsg);
    pthread_mutex_lock(&e->mu);
    uint64_t tw = mw_now_ns();
    int waited = 0;
#define SG_READY (!e->in_flight || e->st[sg].state == OFL_SG_DONE || (fresh_ok && e->st[sg].fresh))
    while (block && !e->failed && !SG_READY) {
        e->caller_waiting++;
        pthread_cond_wait(&e->cv_done, &e->mu);
        e->caller_waiting--;
        waited = 1;
    }
    if (waited) caller_wait(e, tw);
    int rc = SG_READY ? 1 : 0;
#undef SG_READY
    if (e->in_flight && e->failed) rc = mw_error_set(e->err ? e->err : -EIO, "%s", e->errmsg);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int mw_offload_sg_wait(struct mw_offload *e, uint32_t sg, int block) { return sg_wait(e, sg, block, 0, "sg_wait"); }

int mw_offload_master_handoff(struct mw_offload *e, uint32_t sg, int on)
{
    if (sg >= e->nsg) return mw_error_set(-EINVAL, "offload master handoff: no subgroup %u (%u)", sg, e->nsg);
    if (!e->cfg.stream || !e->txn || e->cfg.weights != MW_OFFLOAD_W_FP32)
        return mw_error_set(-EINVAL, "offload master handoff: only for streamed fp32 weights (cfg.stream) with the "
                            "state on NVMe");
    struct ofl_sg *s = &e->st[sg];
    int ok = 0;
    pthread_mutex_lock(&e->mu);
    if (!on) {
        while (s->hand_busy) pthread_cond_wait(&e->cv_done, &e->mu);
        s->handoff = 0;
        s->handed = 0;
    } else if (!e->failed && !s->handoff &&
               (!e->in_flight || (!s->wb && s->state != OFL_SG_UPDATING && s->state != OFL_SG_DONE))) {
        /* Between steps (for the next step's update), or before its update starts, or updated and
         * not yet taken by the write-back: one of the two copies it there (both read s->handoff
         * under this mutex as they take the subgroup). */
        s->handoff = 1;
        s->handed = 0;
        ok = 1;
    }
    pthread_mutex_unlock(&e->mu);
    return ok;
}

int mw_offload_master_handoff_wait(struct mw_offload *e, uint32_t sg)
{
    if (sg >= e->nsg) return mw_error_set(-EINVAL, "offload master handoff: no subgroup %u (%u)", sg, e->nsg);
    struct ofl_sg *s = &e->st[sg];
    pthread_mutex_lock(&e->mu);
    uint64_t tw = mw_now_ns();
    int waited = 0;
    while (s->handoff && !s->handed && e->in_flight && !e->failed && s->state != OFL_SG_DONE) {
        e->caller_waiting++;
        pthread_cond_wait(&e->cv_done, &e->mu);
        e->caller_waiting--;
        waited = 1;
    }
    if (waited) caller_wait(e, tw);
    int rc = s->handoff && s->handed;
    if (!rc && e->in_flight && e->failed) rc = mw_error_set(e->err ? e->err : -EIO, "%s", e->errmsg);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* With cfg.stream the caller reads the weights from the master: its write must have landed. */
int mw_offload_sg_wait_weights(struct mw_offload *e, uint32_t sg, int block)
{
    return sg_wait(e, sg, block, !e->cfg.stream, "sg_wait_weights");
}

int mw_offload_step(struct mw_offload *e, const struct mw_offload_hparams *hp)
{
    pthread_mutex_lock(&e->mu);
    e->caller_sync = 1; /* the caller computes nothing during this step: the updates run quiet */
    pthread_mutex_unlock(&e->mu);
    int rc = mw_offload_step_start(e, hp);
    if (!rc) rc = mw_offload_step_wait(e);
    pthread_mutex_lock(&e->mu);
    e->caller_sync = 0;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int mw_offload_step_wait(struct mw_offload *e)
{
    int rc;
    pthread_mutex_lock(&e->mu);
    if (!e->in_flight) { pthread_mutex_unlock(&e->mu); return 0; }
    uint64_t t0 = e->step_call_t0, tw = mw_now_ns();
    int waited = 0;
    while (e->n_done < e->n_started || (e->threads_up && (e->n_reading || e->n_writing || e->upd_head != e->upd_tail))) {
        e->caller_waiting++;
        pthread_cond_wait(&e->cv_done, &e->mu);
        e->caller_waiting--;
        waited = 1;
    }
    if (waited) caller_wait(e, tw);
    /* Every write of the step landed: durable, then recorded, by the pipeline thread (asked here
     * if it has not started on its own; the next step waits for it: ofl_journal_settle), or held
     * until the caller allows it (mw_offload_journal_allow). */
    if (!e->failed && e->jon && e->jstep < e->committed + 1 && e->committed + 1 > e->jallow) {
        e->jstep = e->committed + 1;
        e->jstate = 3;
    } else if (!e->failed && e->jon && e->jstep < e->committed + 1 && e->threads_up) {
        e->jstep = e->committed + 1;
        e->jstate = 1;
        pthread_cond_signal(&e->cv_pipe);
    } else if (!e->failed && e->jon && e->jstep < e->committed + 1) {
        e->jstep = e->committed + 1;
        pthread_mutex_unlock(&e->mu);
        int jrc = ofl_journal_write(e, e->committed + 1);
        pthread_mutex_lock(&e->mu);
        if (jrc) {
            e->failed = 1;
            e->err = jrc;
            snprintf(e->errmsg, sizeof e->errmsg, "%s", mw_error_msg());
        }
    }
    e->in_flight = 0;
    int failed = e->failed;
    uint64_t started = e->step_t0 ? e->step_t0 : t0;
    e->stats.step_s += (double)(mw_now_ns() - MW_MIN(started, t0)) * 1e-9;
    if (!failed) {
        e->committed++;
        e->stats.steps++;
        e->micro_index = 0;
    }
    /* The cost model learns from the step's measurements (failed or not: they were measured), and
     * auto plans the next step with what it learned (costlearn.c, costplan.c). */
    ofl_cost_step_end(&e->cost, e->tr, e->committed + (uint64_t)failed, MW_MIN(started, t0), mw_now_ns());
    ofl_policy_replan(e);
    e->dev_t0 = e->dev_t1 = 0;
    e->armed = 0;
    reset_step_locked(e);
    rc = failed ? e->err : 0;
    /* staging_release: the buffers are idle until the next step (a record being written from
     * them, if any, keeps them) */
    int release = !failed && e->cfg.staging_release && e->jstate == 0;
    pthread_mutex_unlock(&e->mu);
    for (int b = 0; release && b < e->nbuf; b++) (void)madvise(e->staging[b].ptr, e->staging[b].reserved, MADV_DONTNEED);
    if (failed) return mw_error_set(rc, "%s (step %llu not committed; the state of step %llu is intact)", e->errmsg,
                                    (unsigned long long)e->committed + 1, (unsigned long long)e->committed);
    ofl_preread_allow(e); /* the next step's first subgroups, while the caller computes */
    uint64_t now = mw_now_ns();
    struct mw_trace_arg a[1] = {{"step", (int64_t)e->committed}};
    mw_trace_span(e->tr, "offload", "step", MW_MIN(started, t0), now, a, 1);
    if (e->tr) { /* the bytes each tier holds, once per step (allocations are traced by the tiers) */
        static const char *names[MW_TIER_COUNT] = {"offload dram bytes", "offload nvme bytes", "offload device bytes"};
        for (int t = 0; t < MW_TIER_COUNT; t++) {
            struct mw_tier_stats ts;
            mw_tier_stats(e->tier[t], &ts);
            mw_trace_counter(e->tr, names[t], now, (double)ts.current);
        }
        mw_trace_counter(e->tr, "offload nvme read bytes", now, (double)e->stats.nvme_read_bytes);
        mw_trace_counter(e->tr, "offload nvme written bytes", now, (double)e->stats.nvme_write_bytes);
    }
    return 0;
}

int mw_offload_skip_step(struct mw_offload *e)
{
    if (e->in_backward || e->n_started || e->in_flight) return mw_error_set(-EBUSY, "offload skip_step: a step is in progress");
    e->micro_index = 0;
    e->armed = 0;
    return 0;
}

int mw_offload_recover(struct mw_offload *e)
{
    if (e->in_backward) return mw_error_set(-EINVAL, "offload recover: inside a backward pass");
    if (e->threads_up) ofl_preread_drop(e);
    e->failed = 0;
    e->err = 0;
    if (e->master_alias || e->cfg.stream) return 0;
    /* the working copy of subgroups refreshed by the failed step: back to the committed master */
    int rc = 0;
    int cur = (int)(e->committed % 2);
    for (uint32_t i = 0; i < e->nsg && !rc; i++) {
        struct mw_optim_slice s;
        if (e->txn) {
            if ((rc = ofl_slot_load(e, i, cur))) break;
            ofl_view_staging(e, i, 0, &s);
        } else ofl_view_home(e, i, 0, &s);
        ofl_refresh_weights(e, e->sgs[i].first, e->sgs[i].n, s.master);
    }
    if (rc) e->failed = 1;
    return rc;
}

void mw_offload_tier_usage(const struct mw_offload *e, uint64_t bytes[MW_TIER_COUNT])
{
    for (int t = 0; t < MW_TIER_COUNT; t++) {
        struct mw_tier_stats ts;
        mw_tier_stats(e->tier[t], &ts);
        bytes[t] = ts.current;
    }
}

void mw_offload_stats_get(const struct mw_offload *e, struct mw_offload_stats *s)
{
    pthread_mutex_lock((pthread_mutex_t *)&e->mu);
    *s = e->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
}

void mw_offload_cost_get(const struct mw_offload *e, struct mw_offload_cost *c)
{
    _Static_assert(MW_OFFLOAD_COST_NCOMP == OFL_COST_N, "one figure per component");
    memset(c, 0, sizeof *c);
    pthread_mutex_lock((pthread_mutex_t *)&e->mu);
    const struct ofl_cost *m = &e->cost;
    for (int i = 0; i < OFL_COST_N; i++) {
        c->name[i] = ofl_cost_names[i];
        c->factor[i] = ofl_cost_factor(m, (enum ofl_cost_comp)i, m->hint);
        c->n[i] = m->run[i].n;
        c->predicted_s[i] = m->run[i].pred_s;
        c->measured_s[i] = m->run[i].meas_s;
        c->late_predicted_s[i] = m->late[i].pred_s;
        c->late_measured_s[i] = m->late[i].meas_s;
    }
    c->steps = m->steps;
    c->plan_policy = e->plan_auto.set ? e->plan_auto.cur.kind : (int)e->cfg.policy;
    c->plan_k = e->plan_auto.cur.k;
    c->plan_device_subgroups = e->plan_auto.cur.ndev;
    c->plan_switches = e->plan_auto.switches;
    c->plan_predicted_s = e->plan_auto.cur.predicted_s;
    c->best_fixed_predicted_s = e->plan_fixed.predicted_s;
    pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
}

void mw_offload_stats_reset(struct mw_offload *e)
{
    pthread_mutex_lock(&e->mu);
    memset(&e->stats, 0, sizeof e->stats);
    pthread_mutex_unlock(&e->mu);
}

void ofl_obj_io(struct mw_store_io *io, struct mw_store_obj *obj, enum mw_aio_op op, uint64_t len, void *buf)
{
    memset(io, 0, sizeof *io);
    io->obj = obj;
    io->op = op;
    io->len = len;
    io->buf = buf;
}

void mw_offload_inject_write_failure(struct mw_offload *e, uint64_t k)
{
    pthread_mutex_lock(&e->mu);
    e->writes_until_fail = k;
    pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------------------ the commit record's calls */

int mw_offload_journal_note(struct mw_offload *e, const void *blob, size_t n)
{
    if (!e->cfg.journal) return mw_error_set(-EINVAL, "offload: no commit record (journal = 0)");
    if (n > MW_OFFLOAD_BLOB_MAX) return mw_error_set(-EINVAL, "offload: a record blob of %zu bytes (at most %u)", n, MW_OFFLOAD_BLOB_MAX);
    int jrc = ofl_journal_settle(e); /* the record being written reads the blob it was given */
    if (jrc) return jrc;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) return mw_error_set(-ENOMEM, "offload: out of memory");
    if (n) memcpy(b, blob, n);
    free(e->jblob);
    e->jblob = b;
    e->jblob_len = n;
    return 0;
}

int mw_offload_journal_commit(struct mw_offload *e, const void *blob, size_t n)
{
    int rc = ofl_check_quiet(e, "journal_commit");
    if (!rc) rc = ofl_journal_settle(e);
    if (!rc) rc = mw_offload_journal_note(e, blob, n);
    if (rc) return rc;
    if ((rc = ofl_journal_write(e, e->committed))) return rc;
    e->jon = 1;
    return 0;
}

int mw_offload_journal_end(struct mw_offload *e)
{
    if (!e->jpath) return 0;
    int jrc = ofl_journal_settle(e);
    if (jrc) return jrc; /* a run whose last record failed keeps its files for a resume */
    e->jon = 0;
    /* The record first: files without a record are a run that cannot be resumed, never a record
     * pointing at files that are gone. */
    int rc = 0;
    if (unlink(e->jpath) != 0 && errno != ENOENT)
        rc = mw_error_set(-errno, "offload: cannot remove the commit record %s: %s", e->jpath, strerror(errno));
    ofl_journal_sweep(e->jpath);
    if (!rc) rc = mw_fsync_parent(e->jpath);
    if (!rc) {
        mw_store_set_keep_files(e->store, 0);
        e->jkeep = 0;
    }
    return rc;
}
