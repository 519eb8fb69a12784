/*
 * checkpoint.c — training checkpoints: header, fp32 weights, optimizer state, trailer.
 * Why a trailer with a crc32c and the file length: a checkpoint is written over minutes for
 * a large model; a crash, a full disk or a copy cut short must never resume silently from a
 * half file. Writing goes through mw_atomic_open/commit (memwall/fsutil.h: a temporary in the same
 * directory, fsync, rename, fsync of the directory). Loading is verify, then apply: every header
 * field is range-checked (sizes overflow-checked: the header is hostile input), the whole file is
 * read once against the trailer's length, marker and crc32c, and only then read again into the
 * model and the optimizer, so a truncated or corrupt file leaves the trainer exactly as it was.
 * Fields are serialized one by one in little-endian at fixed offsets (no struct dumps), so the
 * layout is the format.
 */
#include "memwall/train.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"
#include "memwall/model.h"
#include "train/optimizer_step.h"
#include "train/residency.h"
#include "train/zero.h"
#include "train/resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_MAGIC "MWCKPT01"
#define CKPT_END "MWCKEND1"
#define CKPT_VERSION 2u /* 2: the run's settings follow the header (1: none; read still) */
#define CKPT_HEADER_BYTES MW_CKPT_HEADER_BYTES
#define CKPT_TRAILER_BYTES 24u

/* ---- little-endian fields ---- */

static void put32(uint8_t *b, size_t off, uint32_t v) { for (int i = 0; i < 4; i++) b[off + i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *b, size_t off, uint64_t v) { for (int i = 0; i < 8; i++) b[off + i] = (uint8_t)(v >> (8 * i)); }
static void putf64(uint8_t *b, size_t off, double d) { uint64_t v; memcpy(&v, &d, 8); put64(b, off, v); }
static uint32_t get32(const uint8_t *b, size_t off) { uint32_t v = 0; for (int i = 0; i < 4; i++) v |= (uint32_t)b[off + i] << (8 * i); return v; }
static uint64_t get64(const uint8_t *b, size_t off) { uint64_t v = 0; for (int i = 0; i < 8; i++) v |= (uint64_t)b[off + i] << (8 * i); return v; }
static double getf64(const uint8_t *b, size_t off) { uint64_t v = get64(b, off); double d; memcpy(&d, &v, 8); return d; }

/* Header offsets (bytes). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HDRBYTES = 12,
    H_L = 16, H_NH = 20, H_C = 24, H_MAXT = 28, H_V = 32, H_VP = 36,
    H_NPARAMS = 40, H_PBYTES = 48, H_OBYTES = 56, H_STEP = 64, H_RNG = 72, H_TIER = 80,
    H_BATCH = 88, H_SEQ = 92, H_ACCUM = 96, H_THREADS = 100, H_RECOMP = 104,
    H_STEPS = 112, H_LR = 120, H_WARMUP = 128, H_MINLR = 136, H_WD = 144, H_B1 = 152, H_B2 = 160,
    H_EPS = 168, H_CLIP = 176, H_VALEVERY = 184, H_VALB = 192, H_CKEVERY = 200, H_SEED = 208,
    H_DATAPATH = 216, H_DATAPATH_LEN = 512,
    /* Data parallelism (0 in files of single-rank runs, read as world 1). */
    H_WORLD = 728, H_RANK = 732, H_ZERO = 736, H_SGSIZE = 744, H_OWNFIRST = 752, H_OWNN = 760,
    /* Version 2: the bytes of the run's settings (mw_trainer_set_run_spec) right after the header;
     * the model family (memwall/model.h: its stable id) and its config as the family encodes it
     * (GPT-2's is also in the fields above, where version 1 has it). */
    H_SPECLEN = 768, H_FAMILY = 772, H_NETCFG = 776, /* .. 776 + MW_NET_CONFIG_WIRE */
};

void mw_ckpt_header_encode(uint8_t *h, const struct mw_ckpt_info *in)
{
    memset(h, 0, CKPT_HEADER_BYTES);
    memcpy(h + H_MAGIC, CKPT_MAGIC, 8);
    put32(h, H_VERSION, CKPT_VERSION);
    put32(h, H_HDRBYTES, CKPT_HEADER_BYTES);
    /* The model: its family's id and encoded config; GPT-2's (family 0, six u32) also where
     * version 1 keeps it (L, heads, width, context, vocabulary, padded vocabulary at H_L..H_VP). */
    const struct mw_net_family *fam = in->net.family;
    uint8_t wire[MW_NET_CONFIG_WIRE];
    fam->config_encode(in->net.raw, wire);
    if (fam->id == 0) memcpy(h + H_L, wire, H_NPARAMS - H_L);
    put32(h, H_FAMILY, fam->id);
    memcpy(h + H_NETCFG, wire, MW_NET_CONFIG_WIRE);
    put64(h, H_NPARAMS, in->n_params);
    put64(h, H_PBYTES, in->n_params * 4);
    put64(h, H_OBYTES, in->opt_bytes);
    put64(h, H_STEP, (uint64_t)in->step);
    put64(h, H_RNG, in->data_rng);
    const struct mw_train_config *t = &in->train;
    put32(h, H_TIER, (uint32_t)t->tier);
    put32(h, H_BATCH, (uint32_t)t->batch); put32(h, H_SEQ, (uint32_t)t->seq); put32(h, H_ACCUM, (uint32_t)t->grad_accum);
    put32(h, H_THREADS, (uint32_t)t->threads); put32(h, H_RECOMP, (uint32_t)t->recompute);
    put64(h, H_STEPS, (uint64_t)t->steps); putf64(h, H_LR, t->lr); put64(h, H_WARMUP, (uint64_t)t->warmup);
    putf64(h, H_MINLR, t->min_lr_frac); putf64(h, H_WD, t->weight_decay); putf64(h, H_B1, t->beta1);
    putf64(h, H_B2, t->beta2); putf64(h, H_EPS, t->eps); putf64(h, H_CLIP, t->clip);
    put64(h, H_VALEVERY, (uint64_t)t->val_every); put64(h, H_VALB, (uint64_t)t->val_batches);
    put64(h, H_CKEVERY, (uint64_t)t->ckpt_every); put64(h, H_SEED, t->seed);
    snprintf((char *)h + H_DATAPATH, H_DATAPATH_LEN, "%s", in->data_path); /* fits: mw_trainer_save checks */
    put32(h, H_WORLD, (uint32_t)in->world); put32(h, H_RANK, (uint32_t)in->rank);
    put32(h, H_ZERO, (uint32_t)in->zero_stage); put64(h, H_SGSIZE, in->subgroup_size);
    put64(h, H_OWNFIRST, in->own_first); put64(h, H_OWNN, in->own_n);
    put32(h, H_SPECLEN, in->spec_bytes);
}

int mw_ckpt_header_decode(const uint8_t *h, struct mw_ckpt_info *out, const char *path)
{
    memset(out, 0, sizeof *out);
    if (memcmp(h + H_MAGIC, CKPT_MAGIC, 8))
        return mw_error_set(MW_EFORMAT, "%s is not a memwall checkpoint (bad magic)", path);
    out->version = get32(h, H_VERSION);
    if ((out->version != CKPT_VERSION && out->version != 1) || get32(h, H_HDRBYTES) != CKPT_HEADER_BYTES)
        return mw_error_set(MW_EFORMAT, "checkpoint %s has version %u (header %u bytes); this memwall reads version %u",
                            path, out->version, get32(h, H_HDRBYTES), CKPT_VERSION);
    out->n_params = get64(h, H_NPARAMS);
    out->opt_bytes = get64(h, H_OBYTES);
    out->step = (int64_t)get64(h, H_STEP);
    out->data_rng = get64(h, H_RNG);
    struct mw_train_config *t = &out->train;
    t->tier = get32(h, H_TIER) == MW_TIER_NVME ? MW_TIER_NVME : MW_TIER_DRAM; /* checked below */
    t->batch = (int)get32(h, H_BATCH); t->seq = (int)get32(h, H_SEQ); t->grad_accum = (int)get32(h, H_ACCUM);
    t->threads = (int)get32(h, H_THREADS); t->recompute = (int)get32(h, H_RECOMP);
    t->steps = (int64_t)get64(h, H_STEPS); t->lr = getf64(h, H_LR); t->warmup = (int64_t)get64(h, H_WARMUP);
    t->min_lr_frac = getf64(h, H_MINLR); t->weight_decay = getf64(h, H_WD); t->beta1 = getf64(h, H_B1);
    t->beta2 = getf64(h, H_B2); t->eps = getf64(h, H_EPS); t->clip = getf64(h, H_CLIP);
    t->val_every = (int64_t)get64(h, H_VALEVERY); t->val_batches = (int64_t)get64(h, H_VALB);
    t->ckpt_every = (int64_t)get64(h, H_CKEVERY); t->seed = get64(h, H_SEED);
    memcpy(out->data_path, h + H_DATAPATH, H_DATAPATH_LEN);
    out->data_path[sizeof out->data_path - 1] = 0;
    out->world = (int)get32(h, H_WORLD); out->rank = (int)get32(h, H_RANK);
    out->zero_stage = (int)get32(h, H_ZERO); out->subgroup_size = get64(h, H_SGSIZE);
    out->own_first = get64(h, H_OWNFIRST); out->own_n = get64(h, H_OWNN);
    out->spec_bytes = out->version >= 2 ? get32(h, H_SPECLEN) : 0;
    uint32_t fid = out->version >= 2 ? get32(h, H_FAMILY) : 0;
    if (!(out->net.family = mw_net_family_by_id(fid)))
        return mw_error_set(MW_EFORMAT, "checkpoint %s holds a model of family %u, which this memwall does not know", path, fid);
    uint8_t wire[MW_NET_CONFIG_WIRE] = {0};
    if (out->version >= 2) memcpy(wire, h + H_NETCFG, sizeof wire);
    else memcpy(wire, h + H_L, H_NPARAMS - H_L); /* version 1: GPT-2, in its fields */
    if (out->version >= 2 && fid == 0 && memcmp(wire, h + H_L, H_NPARAMS - H_L))
        return mw_error_set(MW_EFORMAT, "checkpoint %s: the GPT-2 config is kept twice and the two differ (corrupt file?)", path);
    if (out->net.family->config_decode(wire, out->net.raw) != 0) {
        char m[400];
        snprintf(m, sizeof m, "%s", mw_error_msg());
        return mw_error_set(MW_EFORMAT, "checkpoint %s: invalid model config in the header (%s)", path, m);
    }
    if (out->spec_bytes > MW_TRAIN_SPEC_MAX)
        return mw_error_set(MW_EFORMAT, "checkpoint %s: the run's settings are %u bytes, more than the %u a checkpoint "
                            "keeps (corrupt file?)", path, out->spec_bytes, MW_TRAIN_SPEC_MAX);
    if (out->world == 0) out->world = 1;
    t->zero_stage = out->zero_stage;
    if (out->world < 1 || out->rank < 0 || out->rank >= out->world || out->zero_stage < 0 || out->zero_stage > 3)
        return mw_error_set(MW_EFORMAT, "checkpoint %s: invalid rank fields (rank %d of %d, ZeRO %d)", path,
                            out->rank, out->world, out->zero_stage);
    struct mw_net_options one = {1, 1, 0, 1};
    struct mw_net_sizes ns;
    uint64_t pbytes;
    if (mw_net_sizes(&out->net, &one, &ns) || out->n_params != ns.n_params || mw_mul_u64(out->n_params, 4, &pbytes) ||
        get64(h, H_PBYTES) != pbytes || out->step < 0)
        return mw_error_set(MW_EFORMAT, "checkpoint %s: header sizes disagree with its model config", path);
    /* The run's settings become the defaults of a resumed run: each in the range the command line
     * accepts, so a hostile header cannot smuggle a negative batch or a NaN learning rate in. */
    const char *bad = NULL;
    if (get32(h, H_TIER) > MW_TIER_NVME) bad = "optimizer tier";
    else if (t->batch < 1 || t->batch > (1 << 20) || t->seq < 1 || t->seq > (1 << 20)) bad = "batch or sequence length";
    else if (t->grad_accum < 1 || t->grad_accum > (1 << 20)) bad = "gradient accumulation";
    else if (t->threads < 0 || t->threads > 4096 || (get32(h, H_RECOMP) > 1)) bad = "threads or recompute";
    else if (t->steps < 0 || t->warmup < 0 || t->val_every < 0 || t->val_batches < 0 || t->ckpt_every < 0)
        bad = "step counts";
    else if (!(t->lr >= 0 && t->lr <= 10) || !(t->min_lr_frac >= 0 && t->min_lr_frac <= 1) ||
             !(t->weight_decay >= 0 && t->weight_decay <= 10) || !(t->beta1 >= 0 && t->beta1 < 1) ||
             !(t->beta2 >= 0 && t->beta2 < 1) || !(t->eps > 0 && t->eps < 1) || !(t->clip >= 0 && t->clip <= 1e9))
        bad = "optimizer hyper-parameters (NaN or out of range)";
    else if (out->zero_stage && (out->subgroup_size == 0 || out->own_first > out->n_params ||
                                 out->own_n > out->n_params - out->own_first))
        bad = "ZeRO subgroup size or owned range";
    if (bad) return mw_error_set(MW_EFORMAT, "checkpoint %s: the header's %s is invalid (corrupt file?)", path, bad);
    return 0;
}

/* ---- writing ---- */

struct wctx { FILE *f; uint32_t crc; uint64_t bytes; const char *path; int failed; };

static int w_fn(void *user, void *buf, size_t n)
{
    struct wctx *w = user;
    if (n && fwrite(buf, 1, n, w->f) != n) {
        int e = errno ? errno : EIO;
        char note[600];
        w->failed = 1;
        return mw_error_set(-e, "writing checkpoint %s failed: %s%s", w->path, strerror(e),
                            mw_fs_full_note(-e, w->path, note, sizeof note));
    }
    w->crc = mw_crc32c(w->crc, buf, n);
    w->bytes += n;
    return 0;
}

/* The weights a unit at a time through the residency interface (units are contiguous and in
 * order, so this is the params array from its first to its last element). */
static int write_weights(struct mw_trainer *tr, struct wctx *w)
{
    struct mw_residency *r = tr->res;
    int err = r->ops->save_begin(r->self);
    for (int u = 0; u < tr->model.n_units && !err; u++) {
        size_t a, n;
        mw_net_unit_range(&tr->model, u, &a, &n);
        if ((err = r->ops->unit_get(r->self, u))) break;
        err = w_fn(w, tr->model.params + a, n * 4);
        int err2 = r->ops->unit_put(r->self, u);
        if (!err) err = err2;
    }
    int err2 = r->ops->save_end(r->self);
    return err ? err : err2;
}

int mw_trainer_save(struct mw_trainer *tr, const char *data_path, const char *path)
{
    int ferr = mw_trainer_finish(tr); /* the state of the last step, committed */
    if (ferr) return ferr;
    struct mw_ckpt_info in;
    memset(&in, 0, sizeof in);
    in.version = CKPT_VERSION;
    in.net = tr->model.cfg;
    in.train = tr->cfg;
    in.step = tr->step;
    in.data_rng = tr->data_rng;
    if (data_path && strlen(data_path) >= sizeof in.data_path)
        return mw_error_set(-ENAMETOOLONG, "checkpoint %s: the data path is %zu bytes, and a checkpoint records at most "
                            "%zu (move or link the data to a shorter path): %s", path, strlen(data_path),
                            sizeof in.data_path - 1, data_path);
    snprintf(in.data_path, sizeof in.data_path, "%s", data_path ? data_path : "");
    in.n_params = tr->model.sizes.n_params;
    in.opt_bytes = mw_train_opt_state_bytes(tr->opt);
    in.world = tr->world;
    in.rank = tr->rank;
    in.spec_bytes = tr->run_spec ? (uint32_t)strlen(tr->run_spec) : 0; /* bounded: mw_trainer_set_run_spec */
    if (tr->res->zero) {
        const struct mw_train_zero *z = tr->res->zero;
        in.zero_stage = z->stage;
        in.subgroup_size = z->sg_size;
        in.own_first = z->own.first;
        in.own_n = z->own.n;
    }
    struct mw_atomic_file af;
    int err = mw_atomic_open(&af, path);
    if (err) return err;
    struct wctx w = {af.f, 0, 0, af.tmp, 0};
    uint8_t hdr[CKPT_HEADER_BYTES], trl[CKPT_TRAILER_BYTES];
    mw_ckpt_header_encode(hdr, &in);
    err = w_fn(&w, hdr, sizeof hdr);
    if (!err && in.spec_bytes) err = w_fn(&w, tr->run_spec, in.spec_bytes);
    if (!err) err = write_weights(tr, &w);
    if (!err && (err = mw_train_opt_save(tr->opt, w_fn, &w)) && !w.failed) /* a read of the state failed */
        err = mw_error_set(err, "reading the optimizer state for checkpoint %s failed (%s is not written; an earlier "
                           "checkpoint is untouched): %s", path, path, mw_error_msg());
    if (!err) {
        memcpy(trl, CKPT_END, 8);
        put64(trl, 8, w.crc);
        put64(trl, 16, w.bytes + CKPT_TRAILER_BYTES);
        err = w_fn(&w, trl, sizeof trl);
    }
    if (err) { mw_atomic_abort(&af); return err; }
    return mw_atomic_commit(&af); /* fsync, rename over path, fsync of the directory */
}

uint64_t mw_trainer_ckpt_bytes(const struct mw_trainer *tr)
{
    uint64_t a = 0;
    if (mw_mul_u64(tr->model.sizes.n_params, 4, &a) || mw_add_u64(a, mw_train_opt_state_bytes(tr->opt), &a) ||
        mw_add_u64(a, (uint64_t)CKPT_HEADER_BYTES + CKPT_TRAILER_BYTES + (tr->run_spec ? strlen(tr->run_spec) : 0), &a))
        return UINT64_MAX;
    return a;
}

/* ---- reading: verify, then apply ---- */

/* Header + weights + optimizer state + trailer; an error when the header's sizes wrap. */
static int expected_size(const struct mw_ckpt_info *in, uint64_t *out, const char *path)
{
    uint64_t a;
    if (mw_mul_u64(in->n_params, 4, &a) || mw_add_u64(a, in->opt_bytes, &a) ||
        mw_add_u64(a, (uint64_t)CKPT_HEADER_BYTES + CKPT_TRAILER_BYTES + in->spec_bytes, &a))
        return mw_error_set(MW_EFORMAT, "checkpoint %s: header sizes overflow (%llu parameters, %llu optimizer "
                            "bytes): corrupt file", path, (unsigned long long)in->n_params,
                            (unsigned long long)in->opt_bytes);
    *out = a;
    return 0;
}

static int open_checked(const char *path, FILE **fp, struct mw_ckpt_info *info)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mw_error_set(-errno, "cannot open checkpoint %s: %s", path, strerror(errno));
    struct stat st;
    uint8_t hdr[CKPT_HEADER_BYTES];
    uint64_t want = 0;
    int err = 0;
    if (fstat(fileno(f), &st) != 0) { err = mw_error_set(-errno, "cannot stat %s", path); goto err; }
    if (!S_ISREG(st.st_mode)) { err = mw_error_set(-EINVAL, "checkpoint %s is not a regular file", path); goto err; }
    if ((uint64_t)st.st_size < CKPT_HEADER_BYTES + CKPT_TRAILER_BYTES) {
        err = mw_error_set(MW_EFORMAT, "checkpoint %s is truncated: %lld bytes, less than a header and trailer",
                           path, (long long)st.st_size);
        goto err;
    }
    if (fread(hdr, 1, sizeof hdr, f) != sizeof hdr) { err = mw_error_set(-EIO, "cannot read %s", path); goto err; }
    if ((err = mw_ckpt_header_decode(hdr, info, path)) || (err = expected_size(info, &want, path))) goto err;
    if ((uint64_t)st.st_size != want) {
        err = mw_error_set(MW_EFORMAT, "checkpoint %s is %s: %lld bytes, its header describes %llu "
                           "(was the write interrupted?)", path,
                           (uint64_t)st.st_size < want ? "truncated" : "too long",
                           (long long)st.st_size, (unsigned long long)want);
        goto err;
    }
    *fp = f;
    return 0;
err:
    fclose(f);
    return err;
}

int mw_ckpt_read_info(const char *path, struct mw_ckpt_info *info)
{
    FILE *f;
    int err = open_checked(path, &f, info);
    if (!err) fclose(f);
    return err;
}

int mw_ckpt_read_spec(const char *path, char **spec)
{
    struct mw_ckpt_info info;
    FILE *f;
    *spec = NULL;
    int err = open_checked(path, &f, &info); /* the header read: the settings follow it */
    if (err || !info.spec_bytes) {
        if (!err) fclose(f);
        return err;
    }
    char *s = malloc((size_t)info.spec_bytes + 1);
    if (!s) err = mw_error_set(-ENOMEM, "no memory");
    else if (fread(s, 1, info.spec_bytes, f) != info.spec_bytes) err = mw_error_set(MW_EFORMAT, "checkpoint %s ended early", path);
    else if (memchr(s, 0, info.spec_bytes)) err = mw_error_set(MW_EFORMAT, "checkpoint %s: the run's settings hold a NUL", path);
    fclose(f);
    if (err) { free(s); return err; }
    s[info.spec_bytes] = 0;
    *spec = s;
    return 0;
}

/* The whole file once, without applying anything: the body's crc32c against the trailer, which
 * must also carry the completion marker and the file's length. */
static int verify_body(FILE *f, const struct mw_ckpt_info *in, const char *path, uint32_t *crc_out)
{
    uint64_t total = 0, left;
    int err = expected_size(in, &total, path);
    if (err) return err;
    left = total - CKPT_TRAILER_BYTES;
    enum { CH = 1 << 20 };
    uint8_t *buf = malloc(CH), trl[CKPT_TRAILER_BYTES];
    if (!buf) return mw_error_set(-ENOMEM, "no memory to verify checkpoint %s", path);
    uint32_t crc = 0;
    rewind(f);
    while (left) {
        size_t n = (size_t)MW_MIN((uint64_t)CH, left);
        if (fread(buf, 1, n, f) != n) {
            free(buf);
            return mw_error_set(ferror(f) ? -EIO : MW_EFORMAT, "checkpoint %s ended early (at byte %llu of %llu)",
                                path, (unsigned long long)(total - CKPT_TRAILER_BYTES - left),
                                (unsigned long long)total);
        }
        crc = mw_crc32c(crc, buf, n);
        left -= n;
    }
    free(buf);
    if (fread(trl, 1, sizeof trl, f) != sizeof trl || memcmp(trl, CKPT_END, 8))
        return mw_error_set(MW_EFORMAT, "checkpoint %s has no completion marker: it was not written to the end", path);
    if (get64(trl, 8) != crc || get64(trl, 16) != total)
        return mw_error_set(MW_ECHECKSUM, "checkpoint %s is corrupt: crc32c %08x, the trailer says %08llx "
                            "(length %llu, the trailer says %llu); nothing was loaded", path, crc,
                            (unsigned long long)get64(trl, 8), (unsigned long long)total,
                            (unsigned long long)get64(trl, 16));
    *crc_out = crc;
    return 0;
}

struct rctx { FILE *f; uint32_t crc; const char *path; };

static int r_fn(void *user, void *buf, size_t n)
{
    struct rctx *r = user;
    if (n && fread(buf, 1, n, r->f) != n)
        return mw_error_set(MW_EFORMAT, "checkpoint %s ended early", r->path);
    r->crc = mw_crc32c(r->crc, buf, n);
    return 0;
}

int mw_ckpt_load_weights(const char *path, struct mw_net *m)
{
    struct mw_ckpt_info in;
    FILE *f;
    int err = open_checked(path, &f, &in);
    if (err) return err;
    uint32_t crc = 0;
    if (!mw_net_config_same(&in.net, &m->cfg))
        err = mw_error_set(-EINVAL, "checkpoint %s holds another model than the one built for it", path);
    else if (in.n_params != m->sizes.n_params)
        err = mw_error_set(MW_EFORMAT, "checkpoint %s holds %llu parameters, the model %llu", path,
                           (unsigned long long)in.n_params, (unsigned long long)m->sizes.n_params);
    if (!err) err = verify_body(f, &in, path, &crc);
    if (!err && fseek(f, (long)(CKPT_HEADER_BYTES + in.spec_bytes), SEEK_SET) != 0)
        err = mw_error_set(-errno, "cannot seek in %s", path);
    if (!err && fread(m->params, 4, in.n_params, f) != in.n_params)
        err = mw_error_set(MW_EFORMAT, "checkpoint %s ended early", path);
    fclose(f);
    return err;
}

int mw_trainer_load(struct mw_trainer *tr, const char *path)
{
    struct mw_ckpt_info in;
    FILE *f;
    int err = open_checked(path, &f, &in);
    if (err) return err;
    int zstage = tr->res->zero ? tr->res->zero->stage : 0;
    if (in.world != tr->world) {
        err = mw_error_set(-EINVAL, "checkpoint %s was written by a run on %d rank%s (ZeRO-%d); this run has %d: resume "
                           "with the same number of ranks (mpirun -np %d); resharding to another count is not "
                           "supported yet", path, in.world, in.world == 1 ? "" : "s", in.zero_stage, tr->world, in.world);
        goto out;
    }
    if (in.world > 1 && (in.rank != tr->rank || in.zero_stage != zstage ||
                         (tr->res->zero && (in.own_first != tr->res->zero->own.first || in.own_n != tr->res->zero->own.n)))) {
        err = mw_error_set(-EINVAL, "checkpoint %s holds rank %d's shard of a ZeRO-%d run (elements %llu+%llu); this is "
                           "rank %d with ZeRO-%d: give each rank its own file and the same ZeRO stage (zero_stage) "
                           "and subgroup size (subgroup_size)", path, in.rank, in.zero_stage, (unsigned long long)in.own_first,
                           (unsigned long long)in.own_n, tr->rank, zstage);
        goto out;
    }
    if (!mw_net_config_same(&in.net, &tr->model.cfg) || in.n_params != tr->model.sizes.n_params ||
        in.opt_bytes != mw_train_opt_state_bytes(tr->opt)) {
        char a[160], b[160];
        in.net.family->config_summary(in.net.raw, a, sizeof a);
        tr->model.family->config_summary(tr->model.cfg.raw, b, sizeof b);
        err = mw_error_set(-EINVAL, "checkpoint %s holds a different model (%s) or optimizer state than this run (%s)", path,
                           a, b);
        goto out;
    }
    /* Verify: the whole file against its trailer before the first byte reaches the trainer. */
    uint32_t want_crc = 0;
    if ((err = verify_body(f, &in, path, &want_crc))) goto out;
    /* Apply: read again into the model and the optimizer. The crc is computed once more; a
     * mismatch now means the file changed during the load (or an I/O error): say so. */
    uint8_t hdr[CKPT_HEADER_BYTES + MW_TRAIN_SPEC_MAX];
    struct rctx r = {f, 0, path};
    rewind(f);
    if ((err = r_fn(&r, hdr, CKPT_HEADER_BYTES + in.spec_bytes))) goto applied; /* the settings were read before */
    if (tr->res->stream) { /* streamed weights: straight into the master on NVMe, a piece at a time */
        uint64_t piece = 1u << 20;
        float *buf = malloc(piece * sizeof *buf);
        if (!buf) { err = mw_error_set(-ENOMEM, "no memory for a checkpoint piece"); goto applied; }
        for (uint64_t a = 0; a < in.n_params && !err; a += piece) {
            uint64_t n = MW_MIN(piece, in.n_params - a);
            if (!(err = r_fn(&r, buf, n * 4))) err = mw_train_opt_load_master(tr->opt, a, n, buf, in.step);
        }
        free(buf);
    } else {
        err = r_fn(&r, tr->model.params, in.n_params * 4);
    }
    if (!err) err = mw_train_opt_load(tr->opt, r_fn, &r, in.step);
    if (!err && r.crc != want_crc)
        err = mw_error_set(MW_ECHECKSUM, "checkpoint %s changed while it was loaded (crc32c %08x, verified %08x)",
                           path, r.crc, want_crc);
applied:
    if (err) {
        err = mw_error_set(err, "%s; the checkpoint was verified but applying it failed: the trainer is partly "
                           "loaded and unusable", mw_error_msg());
        goto out;
    }
    tr->step = in.step;
    tr->data_rng = in.data_rng;
    if (tr->res->zero && tr->res->zero->stage == 3) {
        /* The whole weights were read: release what this rank does not own at the next pass. */
        for (int u = 0; u < tr->res->zero->n_units; u++) tr->res->zero->u_state[u] = 2;
        tr->res->zero->started = 0;
    }
out:
    fclose(f);
    return err;
}
