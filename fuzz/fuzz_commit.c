/*
 * fuzz_commit.c — the offload engine's commit record (docs/resume.md), the file `memwall train
 * --resume DIR` trusts to reopen a crashed run: mw_offload_record_parse (the engine's part) and
 * mw_train_resume_parse (with the trainer's blob: a checkpoint header and the offload settings).
 * Every accepted record is checked for what the engine relies on: each object inside the
 * declared subgroups, kinds and slots, one offset per directory, the directory list naming as
 * many directories as it counts, the blob inside its bound. The file path (mw_offload_record_read)
 * is run too, through a scratch directory.
 */
#include "fuzz.h"
#include "memwall/offload.h"
#include "memwall/train.h"

static void check(const struct mw_offload_record *r)
{
    uint32_t colons = 0;
    for (const char *p = r->nvme_dir; *p; p++) colons += *p == ':';
    if (colons + 1 != r->ndirs || r->ndirs < 1 || r->ndirs > 64 || r->blob_len > MW_OFFLOAD_BLOB_MAX) abort();
    for (uint32_t i = 0; i < r->nobj; i++) {
        const struct mw_offload_record_obj *o = &r->obj[i];
        if (o->sg >= r->n_subgroups || o->kind > 1 || o->slot > 1 || o->has_digest > 1 || !o->bytes) abort();
        volatile uint64_t last = r->ext_off[(size_t)i * r->ndirs + r->ndirs - 1]; /* in bounds (ASan) */
        (void)last;
    }
    if (r->blob_len) { volatile uint8_t b = r->blob[r->blob_len - 1]; (void)b; }
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    struct mw_offload_record r;
    if (mw_offload_record_parse(d, size, &r) == 0) {
        check(&r);
        mw_offload_record_free(&r);
    }
    struct mw_train_resume t;
    if (mw_train_resume_parse(d, size, &t) == 0) {
        check(&t.rec);
        if (t.info.world != 1 || t.info.step < 0 || (uint64_t)t.info.step != t.rec.step || t.buffer_count < 1 ||
            t.io_block_size % 4096)
            abort();
        mw_train_resume_free(&t);
    }
    /* The same bytes as DIR/memwall-offload.commit. */
    (void)fz_write(d, size, MW_OFFLOAD_RECORD_NAME);
    if (mw_offload_record_read(fz_scratch(), &r) == 0) {
        check(&r);
        mw_offload_record_free(&r);
    }
    return 0;
}
