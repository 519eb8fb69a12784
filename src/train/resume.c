/*
 * resume.c — the trainer's side of crash-anywhere resume (docs/resume.md): the blob it hands
 * the offload engine for every commit record, and the reading of that blob back.
 *
 * Why the trainer snapshots its state per step: with the update overlapped (the step runs behind
 * the next forward pass), step s commits while step s+1 has already drawn its first batch, so the
 * data-RNG state at commit time is not step s's. The blob is built before step s starts (every
 * batch of step s drawn, none of step s+1) and the engine keeps it for the commit of step s.
 *
 * Blob (little-endian): "MWRESUM2" (version 1: "MWRESUM1", read still), the 1024-byte checkpoint
 * header (settings, step, data-RNG state, data path; checkpoint.c), then u32 offload_params,
 * layer_major, sync_update, prefetch_depth, buffer_count, io_queue_depth and u64 subgroup_size,
 * io_block_size: the offload settings a checkpoint does not keep but a reopen of the NVMe state
 * must match; version 2 adds u32 n and n bytes of the run's settings as the caller wrote them
 * (mw_trainer_set_run_spec: `memwall train` keeps every option there, outputs included, so
 * `--resume DIR` alone finishes what the first invocation promised).
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "train/optimizer_step.h"
#include "train/resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOB_MAGIC_V1 "MWRESUM1"
#define BLOB_MAGIC "MWRESUM2"
#define BLOB_BYTES (8 + MW_CKPT_HEADER_BYTES + 6 * 4 + 2 * 8) /* version 1; version 2 adds the spec */

static void put32(uint8_t *b, size_t off, uint32_t v) { for (int i = 0; i < 4; i++) b[off + i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *b, size_t off, uint64_t v) { for (int i = 0; i < 8; i++) b[off + i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *b, size_t off) { uint32_t v = 0; for (int i = 0; i < 4; i++) v |= (uint32_t)b[off + i] << (8 * i); return v; }
static uint64_t get64(const uint8_t *b, size_t off) { uint64_t v = 0; for (int i = 0; i < 8; i++) v |= (uint64_t)b[off + i] << (8 * i); return v; }

enum { X_OFFLOAD = 8 + MW_CKPT_HEADER_BYTES, X_LM = X_OFFLOAD + 4, X_SYNC = X_LM + 4, X_PREFETCH = X_SYNC + 4,
       X_BUFS = X_PREFETCH + 4, X_QD = X_BUFS + 4, X_SG = X_QD + 4, X_BS = X_SG + 8, X_SPEC = X_BS + 8 };

static size_t blob_bytes(const struct mw_trainer *tr)
{
    return BLOB_BYTES + 4 + (tr->run_spec ? strlen(tr->run_spec) : 0);
}

/* b holds blob_bytes(tr). */
static void blob_encode(const struct mw_trainer *tr, int64_t step, uint8_t *b)
{
    struct mw_ckpt_info in;
    memset(&in, 0, sizeof in);
    in.net = tr->model.cfg;
    in.train = tr->cfg;
    in.step = step;
    in.data_rng = tr->data_rng;
    snprintf(in.data_path, sizeof in.data_path, "%s", tr->journal_data ? tr->journal_data : "");
    in.n_params = tr->model.sizes.n_params;
    in.opt_bytes = mw_train_opt_state_bytes(tr->opt);
    in.world = 1;
    memset(b, 0, BLOB_BYTES);
    memcpy(b, BLOB_MAGIC, 8);
    mw_ckpt_header_encode(b + 8, &in);
    const struct mw_train_config *c = &tr->cfg;
    put32(b, X_OFFLOAD, (uint32_t)c->offload_params);
    put32(b, X_LM, (uint32_t)!!c->layer_major);
    put32(b, X_SYNC, (uint32_t)!!c->sync_update);
    put32(b, X_PREFETCH, (uint32_t)c->prefetch_depth);
    put32(b, X_BUFS, (uint32_t)tr->opt->cfg.buffer_count);
    put32(b, X_QD, c->io_queue_depth);
    put64(b, X_SG, tr->opt->plan.subgroup_size);
    put64(b, X_BS, c->io_block_size);
    size_t sl = tr->run_spec ? strlen(tr->run_spec) : 0;
    put32(b, X_SPEC, (uint32_t)sl);
    if (sl) memcpy(b + X_SPEC + 4, tr->run_spec, sl);
}

/* The blob of a record, every field range-checked (hostile input). */
static int blob_decode(const uint8_t *b, size_t n, struct mw_train_resume *out)
{
    int v2 = n >= BLOB_BYTES + 4 && !memcmp(b, BLOB_MAGIC, 8);
    if (!v2 && (n != BLOB_BYTES || memcmp(b, BLOB_MAGIC_V1, 8)))
        return mw_error_set(MW_EFORMAT, "commit record: the trainer's part is not a memwall resume blob (%zu bytes)", n);
    if (v2 && (get32(b, X_SPEC) != n - BLOB_BYTES - 4 || get32(b, X_SPEC) > MW_TRAIN_SPEC_MAX ||
               memchr(b + X_SPEC + 4, 0, get32(b, X_SPEC))))
        return mw_error_set(MW_EFORMAT, "commit record: the run's settings (%u bytes) do not fit the trainer's part "
                            "(%zu bytes) or hold a NUL", get32(b, X_SPEC), n);
    int err = mw_ckpt_header_decode(b + 8, &out->info, "commit record");
    if (err) return err;
    out->offload_params = get32(b, X_OFFLOAD) == MW_TIER_NVME ? MW_TIER_NVME : MW_TIER_DRAM;
    out->layer_major = (int)get32(b, X_LM);
    out->sync_update = (int)get32(b, X_SYNC);
    out->prefetch_depth = (int)get32(b, X_PREFETCH);
    out->buffer_count = (int)get32(b, X_BUFS);
    out->io_queue_depth = get32(b, X_QD);
    out->subgroup_size = get64(b, X_SG);
    out->io_block_size = get64(b, X_BS);
    if (get32(b, X_OFFLOAD) > MW_TIER_NVME || get32(b, X_LM) > 1 || get32(b, X_SYNC) > 1 || get32(b, X_PREFETCH) > 8 ||
        get32(b, X_BUFS) < 1 || get32(b, X_BUFS) > 1024 || out->io_queue_depth > 4096 || !out->subgroup_size ||
        out->subgroup_size > (uint64_t)1e15 || out->io_block_size % 4096 || out->io_block_size > (1u << 30) ||
        out->info.world != 1 || out->info.train.tier != MW_TIER_NVME)
        return mw_error_set(MW_EFORMAT, "commit record: the trainer's offload settings are out of range (corrupt record?)");
    if (v2) {
        uint32_t sl = get32(b, X_SPEC);
        if (!(out->run_spec = malloc((size_t)sl + 1))) return mw_error_set(-ENOMEM, "no memory");
        memcpy(out->run_spec, b + X_SPEC + 4, sl);
        out->run_spec[sl] = 0;
    }
    return 0;
}

int mw_train_resume_parse(const void *data, size_t n, struct mw_train_resume *out)
{
    memset(out, 0, sizeof *out);
    int err = mw_offload_record_parse(data, n, &out->rec);
    if (!err) err = blob_decode(out->rec.blob, out->rec.blob_len, out);
    if (!err && (uint64_t)out->info.step != out->rec.step)
        err = mw_error_set(MW_EFORMAT, "commit record: the trainer's step %lld is not the engine's %llu",
                           (long long)out->info.step, (unsigned long long)out->rec.step);
    if (err) mw_train_resume_free(out);
    return err;
}

int mw_train_resume_read(const char *dir, struct mw_train_resume *out)
{
    memset(out, 0, sizeof *out);
    int err = mw_offload_record_read(dir, &out->rec);
    if (!err) err = blob_decode(out->rec.blob, out->rec.blob_len, out);
    if (!err && (uint64_t)out->info.step != out->rec.step)
        err = mw_error_set(MW_EFORMAT, "the commit record in %s: the trainer's step %lld is not the engine's %llu", dir,
                           (long long)out->info.step, (unsigned long long)out->rec.step);
    if (err) mw_train_resume_free(out);
    return err;
}

void mw_train_resume_free(struct mw_train_resume *r)
{
    mw_offload_record_free(&r->rec);
    free(r->run_spec);
    memset(r, 0, sizeof *r);
}

int mw_train_journal_note(struct mw_trainer *tr, int64_t step)
{
    if (!tr->journal_data) return 0;
    size_t n = blob_bytes(tr);
    uint8_t *b = malloc(n);
    if (!b) return mw_error_set(-ENOMEM, "no memory for the commit record");
    blob_encode(tr, step, b);
    int err = mw_offload_journal_note(tr->opt->eng, b, n);
    free(b);
    return err;
}

int mw_trainer_set_run_spec(struct mw_trainer *tr, const char *spec)
{
    size_t n = spec ? strlen(spec) : 0;
    if (n > MW_TRAIN_SPEC_MAX)
        return mw_error_set(-E2BIG, "the run's settings are %zu bytes; a commit record or checkpoint keeps at most %u "
                            "(shorter paths?)", n, MW_TRAIN_SPEC_MAX);
    char *c = n ? strdup(spec) : NULL;
    if (n && !c) return mw_error_set(-ENOMEM, "no memory");
    free(tr->run_spec);
    tr->run_spec = c;
    return 0;
}

int mw_train_resume_apply(struct mw_trainer *tr, const struct mw_offload_record *rec)
{
    struct mw_train_resume r;
    memset(&r, 0, sizeof r);
    int err = blob_decode(rec->blob, rec->blob_len, &r);
    free(r.run_spec); /* the caller's part: read by mw_train_resume_read */
    if (err) return err;
    if (tr->world > 1)
        return mw_error_set(-ENOTSUP, "resuming from the NVMe state (its commit record) runs on one rank for now; resume "
                            "a multi-rank run from its checkpoints");
    if (!mw_net_config_same(&r.info.net, &tr->model.cfg) || r.info.n_params != tr->model.sizes.n_params) {
        char a[160];
        r.info.net.family->config_summary(r.info.net.raw, a, sizeof a);
        return mw_error_set(-EINVAL, "the commit record holds a different model (%s) than this run", a);
    }
    /* The engine reads the committed state back (checked against the record's digests) and, with
     * resident weights, refreshes the model's weights from its master. */
    if ((err = mw_train_opt_ensure(tr->opt))) return err;
    tr->step = r.info.step;
    tr->data_rng = r.info.data_rng;
    return 0;
}

int mw_trainer_journal_begin(struct mw_trainer *tr, const char *data_path)
{
    if (!tr->cfg.journal || tr->world > 1 || tr->cfg.tier != MW_TIER_NVME)
        return mw_error_set(-EINVAL, "commit records need the optimizer state on NVMe, one rank, and cfg.journal");
    int err = mw_train_opt_ensure(tr->opt);
    if (err) return err;
    free(tr->journal_data);
    if (!(tr->journal_data = strdup(data_path ? data_path : ""))) return mw_error_set(-ENOMEM, "no memory");
    size_t n = blob_bytes(tr);
    uint8_t *b = malloc(n);
    if (!b) return mw_error_set(-ENOMEM, "no memory for the commit record");
    blob_encode(tr, tr->step, b);
    err = mw_offload_journal_commit(tr->opt->eng, b, n);
    free(b);
    return err;
}

int mw_trainer_journal_allow(struct mw_trainer *tr)
{
    if (!tr->journal_data || !tr->opt || !tr->opt->eng)
        return mw_error_set(-EINVAL, "no commit records to hold (mw_trainer_journal_begin first)");
    mw_offload_journal_allow(tr->opt->eng, (uint64_t)tr->step);
    return 0;
}

int mw_trainer_journal_end(struct mw_trainer *tr)
{
    if (!tr->journal_data) return 0;
    int err = mw_trainer_finish(tr);
    if (!err) err = mw_offload_journal_end(tr->opt->eng);
    free(tr->journal_data);
    tr->journal_data = NULL;
    return err;
}
