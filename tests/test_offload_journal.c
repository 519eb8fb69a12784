/*
 * test_offload_journal.c — the engine's durable commit record (docs/resume.md): an engine with
 * its state on NVMe and journal = 1 runs three steps and is dropped without finishing (its files
 * and record stay, as after a kill); an engine reopened from the record has bitwise the state of
 * step 3 (master, moments, working copy) and its next steps match an engine that never stopped.
 * A record cut short or with a flipped byte is refused (MW_EFORMAT / MW_ECHECKSUM); a committed
 * object changed on disk is refused naming it (MW_ECHECKSUM), the record against other settings
 * too; a finished run (mw_offload_journal_end) leaves no file behind. Held records
 * (mw_offload_journal_allow): a step the caller has not allowed is not recorded, one it allowed
 * is, the next step writes a held one first, and an engine freed with one held leaves the record
 * of the step before, which resumes bitwise.
 */
#include "offload_util.h"
#include "memwall/store.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>

static const int64_t sizes[] = {3000, 700, 9000, 5000, 1};

static struct mw_offload *make(const struct mw_offload_registry *r, const char *dir, float *w, float *g,
                               const struct mw_offload_record *rec, uint64_t sgsize, int *rc_out)
{
    struct mw_offload_config c;
    mw_offload_config_default(&c);
    c.subgroup_size = sgsize;
    c.buffer_count = 2;
    c.nvme_dir = dir;
    c.ext_weights = w;
    c.ext_grads = g;
    c.journal = 1;
    c.resume = rec;
    REQUIRE(mw_offload_placement_parse("optim=nvme", &c.place) == 0);
    struct mw_offload *e = NULL;
    *rc_out = mw_offload_init(&e, r, &c);
    return e;
}

static void steps(struct mw_offload *e, float *g, uint64_t n, int from, int to)
{
    for (int s = from; s <= to; s++) {
        struct mw_offload_hparams hp;
        ou_hparams(&hp, s);
        ou_grads(g, n, s, 0);
        char blob[16];
        snprintf(blob, sizeof blob, "step %d", s);
        CHECK(mw_offload_journal_note(e, blob, strlen(blob)) == 0);
        CHECK_MSG(mw_offload_step(e, &hp) == 0, "step %d: %s", s, mw_error_msg());
    }
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *x; d && (x = readdir(d));) n += x->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static size_t slurp(const char *path, unsigned char **out)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    unsigned char *b = malloc(1 << 20);
    REQUIRE(b);
    size_t n = fread(b, 1, 1 << 20, f);
    fclose(f);
    *out = b;
    return n;
}

/* A committed slot corrupted on disk between two steps of a live run: the next step fails with
 * the checksum mismatch named, whichever block it hits (the update checks the read itself,
 * chunk by chunk, MW_STORE_VERIFY_LATER: a byte in the second chunk of the master, one in the
 * block where the master's padding meets m, one in the tail of v); repaired and recovered, the
 * step gives the reference's state bitwise. */
static void corrupt_mid_run(const char *dir)
{
    static const int64_t big[] = {300003, 5, 250002, 77, 131073}; /* one subgroup of 2.6 chunks */
    struct mw_offload_registry r;
    ou_model(&r, big, 5);
    uint64_t n = r.total;
    char ref_dir[300], run_dir[300];
    snprintf(ref_dir, sizeof ref_dir, "%s/cref", dir);
    snprintf(run_dir, sizeof run_dir, "%s/crun", dir);
    float *w = malloc(4 * n), *g = malloc(4 * n), *wr = malloc(4 * n), *gr = malloc(4 * n);
    REQUIRE(w && g && wr && gr);
    int rc;
    ou_init_weights(wr, n);
    struct mw_offload *ref = make(&r, ref_dir, wr, gr, NULL, 1u << 30, &rc);
    REQUIRE(rc == 0);
    steps(ref, gr, n, 1, 3);
    struct ou_snap want, got;
    ou_snap_take(ref, MW_OFFLOAD_M_FP32, n, &want);
    mw_offload_free(ref);

    ou_init_weights(w, n);
    struct mw_offload *e = make(&r, run_dir, w, g, NULL, 1u << 30, &rc);
    REQUIRE(rc == 0);
    CHECK(mw_offload_journal_commit(e, "step 0", 6) == 0);
    steps(e, g, n, 1, 2);
    struct mw_offload_record rec;
    REQUIRE(mw_offload_record_read(run_dir, &rec) == 0);
    REQUIRE(rec.ndirs == 1); /* the extents are fixed: any record of the run has them */
    REQUIRE(mw_offload_committed_steps(e) == 2);
    uint64_t obj = rec.ext_off[0]; /* subgroup 0, slot 0: the committed one after step 2 */
    uint64_t mbytes = MW_ALIGN_UP(4 * n, 4096);               /* master, padded; then m, then v */
    const uint64_t where[] = {4 * 300000 + 3, 4 * n + 1, 2 * mbytes + 4 * n - 2};
    char dat[400];
    snprintf(dat, sizeof dat, "%s/memwall-offload.0.dat", run_dir); /* one directory: each object one extent */
    for (int k = 0; k < 3; k++) {
        tu_flip_byte(dat, obj + where[k]);
        struct mw_offload_hparams hp;
        ou_hparams(&hp, 3);
        ou_grads(g, n, 3, 0);
        rc = mw_offload_step(e, &hp);
        CHECK_MSG(rc == MW_ECHECKSUM, "corrupt byte %llu: step 3 returned %d (%s)", (unsigned long long)where[k], rc,
                  mw_error_msg());
        CHECK_MSG(strstr(mw_error_msg(), "checksum mismatch in object 'sg0.slot0'"), "message: %s", mw_error_msg());
        tu_flip_byte(dat, obj + where[k]);
        CHECK_MSG(mw_offload_recover(e) == 0, "recover: %s", mw_error_msg());
    }
    struct mw_offload_stats st;
    mw_offload_stats_get(e, &st);
    steps(e, g, n, 3, 3);
    struct mw_offload_stats st2;
    mw_offload_stats_get(e, &st2);
    CHECK_MSG(st2.fused_verifies == st.fused_verifies + 1, "the update did not check its read (%llu -> %llu)",
              (unsigned long long)st.fused_verifies, (unsigned long long)st2.fused_verifies);
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &got);
    CHECK(ou_snap_equal(&want, &got, "repaired, recovered and stepped"));
    ou_snap_free(&want);
    ou_snap_free(&got);
    mw_offload_record_free(&rec);
    CHECK(mw_offload_journal_end(e) == 0);
    mw_offload_free(e);
    free(w); free(g); free(wr); free(gr);
    mw_offload_registry_free(&r);
}

static uint64_t record_step(const char *dir, char *blob, size_t n)
{
    struct mw_offload_record rec;
    int rc = mw_offload_record_read(dir, &rec);
    CHECK_MSG(rc == 0, "read %s: %s", dir, mw_error_msg());
    if (rc) return UINT64_MAX;
    uint64_t step = rec.step;
    snprintf(blob, n, "%.*s", (int)rec.blob_len, (const char *)rec.blob);
    mw_offload_record_free(&rec);
    return step;
}

/* mw_offload_journal_allow; at3: the reference's state after step 3 (steps() from the same start). */
static void held_records(const struct mw_offload_registry *r, const char *dir, uint64_t n, const struct ou_snap *at3)
{
    char run[300], blob[64];
    snprintf(run, sizeof run, "%s/held", dir);
    float *w = malloc(4 * n), *g = malloc(4 * n);
    REQUIRE(w && g);
    ou_init_weights(w, n);
    int rc;
    struct mw_offload *e = make(r, run, w, g, NULL, 4096, &rc);
    REQUIRE(rc == 0);
    CHECK(mw_offload_journal_commit(e, "step 0", 6) == 0);
    mw_offload_journal_allow(e, 0); /* from now on a step's record waits for the caller */
    steps(e, g, n, 1, 1);
    CHECK_EQ_INT(mw_offload_committed_steps(e), 1);
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 0); /* step 1's writes landed; not allowed yet */
    mw_offload_journal_allow(e, 1);
    CHECK(mw_offload_journal_note(e, "next", 4) == 0); /* waits for the record being written */
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 1);
    CHECK_MSG(!strcmp(blob, "step 1"), "blob '%s'", blob);
    steps(e, g, n, 2, 2);
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 1);
    steps(e, g, n, 3, 3); /* step 3 writes the slot step 1's record names: step 2's record comes first */
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 2);
    CHECK_MSG(!strcmp(blob, "step 2"), "blob '%s'", blob);
    mw_offload_free(e); /* step 3 held: not committed */
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 2);

    struct mw_offload_record rec;
    REQUIRE(mw_offload_record_read(run, &rec) == 0);
    float *w2 = malloc(4 * n);
    REQUIRE(w2);
    e = make(r, run, w2, g, &rec, 4096, &rc);
    CHECK_MSG(rc == 0, "resume from the held run: %s", mw_error_msg());
    REQUIRE(rc == 0);
    CHECK_EQ_INT(mw_offload_committed_steps(e), 2);
    mw_offload_journal_allow(e, 2);
    steps(e, g, n, 3, 3); /* runs again */
    struct ou_snap now;
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
    CHECK(ou_snap_equal(&now, at3, "step 3 held, dropped, and run again"));
    ou_snap_free(&now);
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 2); /* a read leaves a held record held */
    /* A skipped step moves the committed slot: step 3's record first, then its own, held too. */
    CHECK(mw_offload_set_committed_steps(e, 4) == 0);
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 3);
    mw_offload_journal_allow(e, 4);
    CHECK(mw_offload_journal_note(e, "next", 4) == 0);
    CHECK_EQ_INT(record_step(run, blob, sizeof blob), 4);
    CHECK(mw_offload_journal_end(e) == 0);
    mw_offload_free(e);
    CHECK_EQ_INT(count_files(run), 0);
    mw_offload_record_free(&rec);
    free(w); free(g); free(w2);
}

int main(void)
{
    mw_log_set(NULL, NULL);
    struct mw_offload_registry r;
    ou_model(&r, sizes, 5);
    uint64_t n = r.total, sg = 4096;
    const char *dir = ou_scratch_dir("offload_journal");
    char ref_dir[300], rec_path[400];
    snprintf(ref_dir, sizeof ref_dir, "%s/ref", dir);
    char run_dir[300];
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    snprintf(rec_path, sizeof rec_path, "%s/%s", run_dir, MW_OFFLOAD_RECORD_NAME);
    float *w = malloc(4 * n), *g = malloc(4 * n), *w2 = malloc(4 * n), *wr = malloc(4 * n), *gr = malloc(4 * n);
    REQUIRE(w && g && w2 && wr && gr);
    int rc;

    /* The reference: 5 steps without a stop. */
    ou_init_weights(wr, n);
    struct mw_offload *ref = make(&r, ref_dir, wr, gr, NULL, sg, &rc);
    REQUIRE(rc == 0);
    CHECK(mw_offload_journal_commit(ref, "step 0", 6) == 0);
    steps(ref, gr, n, 1, 3);
    struct ou_snap at3, at5, now;
    ou_snap_take(ref, MW_OFFLOAD_M_FP32, n, &at3);
    steps(ref, gr, n, 4, 5);
    ou_snap_take(ref, MW_OFFLOAD_M_FP32, n, &at5);
    CHECK(mw_offload_journal_end(ref) == 0);
    mw_offload_free(ref);
    CHECK_EQ_INT(count_files(ref_dir), 0); /* finished: record, store file and lock gone */

    /* Three steps, then dropped without journal_end: what a kill leaves. */
    ou_init_weights(w, n);
    struct mw_offload *e = make(&r, run_dir, w, g, NULL, sg, &rc);
    REQUIRE(rc == 0);
    CHECK(mw_offload_journal_commit(e, "step 0", 6) == 0);
    steps(e, g, n, 1, 3);
    mw_offload_free(e);
    CHECK(access(rec_path, F_OK) == 0);

    struct mw_offload_record rec;
    rc = mw_offload_record_read(run_dir, &rec);
    CHECK_MSG(rc == 0, "read: %s", mw_error_msg());
    REQUIRE(rc == 0);
    CHECK_EQ_INT(rec.step, 3);
    CHECK(rec.blob_len == 6 && !memcmp(rec.blob, "step 3", 6));
    CHECK_EQ_INT(rec.ndirs, 1);

    /* A fresh run on the directory is refused (the crashed run's files are kept). */
    struct mw_offload *x = make(&r, run_dir, w2, g, NULL, sg, &rc);
    CHECK_EQ_INT(rc, -EEXIST);
    CHECK(x == NULL);

    /* Another subgroup size: the record does not describe this run. */
    x = make(&r, run_dir, w2, g, &rec, 2 * sg, &rc);
    CHECK_EQ_INT(rc, -EINVAL);
    CHECK_MSG(strstr(mw_error_msg(), "subgroup size"), "message: %s", mw_error_msg());

    /* Reopened: bitwise step 3 (the working copy refreshed from the master), then steps 4-5 as the reference. */
    memset(w2, 0, 4 * n);
    e = make(&r, run_dir, w2, g, &rec, sg, &rc);
    CHECK_MSG(rc == 0, "resume: %s", mw_error_msg());
    REQUIRE(rc == 0);
    CHECK_EQ_INT(mw_offload_committed_steps(e), 3);
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
    CHECK(ou_snap_equal(&now, &at3, "resumed at step 3"));
    ou_snap_free(&now);
    steps(e, g, n, 4, 5);
    ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
    CHECK(ou_snap_equal(&now, &at5, "resumed run at step 5"));
    ou_snap_free(&now);
    mw_offload_free(e); /* not finished: kept again, now at step 5 */
    mw_offload_record_free(&rec);

    /* Torn or corrupt records are refused. */
    unsigned char *buf;
    size_t len = slurp(rec_path, &buf);
    REQUIRE(len > 100);
    CHECK_EQ_INT(mw_offload_record_parse(buf, len - 1, &rec), MW_EFORMAT);
    CHECK_EQ_INT(mw_offload_record_parse(buf, len / 2, &rec), MW_EFORMAT);
    buf[len / 2] ^= 0x40;
    CHECK_EQ_INT(mw_offload_record_parse(buf, len, &rec), MW_ECHECKSUM);
    buf[len / 2] ^= 0x40;
    CHECK(mw_offload_record_parse(buf, len, &rec) == 0);
    CHECK_EQ_INT(rec.step, 5);

    /* A committed object changed behind the run's back: refused, the object named. */
    uint64_t foff = rec.ext_off[(size_t)(rec.step % 2) * rec.ndirs] + 8; /* subgroup 0, committed slot */
    char dat[400];
    snprintf(dat, sizeof dat, "%s/memwall-offload.0.dat", run_dir);
    tu_flip_byte(dat, foff);
    e = make(&r, run_dir, w2, g, &rec, sg, &rc);
    CHECK_EQ_INT(rc, MW_ECHECKSUM);
    CHECK_MSG(strstr(mw_error_msg(), "sg0.slot1") && strstr(mw_error_msg(), "record"), "message: %s", mw_error_msg());
    tu_flip_byte(dat, foff);

    /* Restored, it resumes; finished, nothing stays. */
    e = make(&r, run_dir, w2, g, &rec, sg, &rc);
    CHECK_MSG(rc == 0, "resume after repair: %s", mw_error_msg());
    if (e) {
        ou_snap_take(e, MW_OFFLOAD_M_FP32, n, &now);
        CHECK(ou_snap_equal(&now, &at5, "resumed at step 5"));
        ou_snap_free(&now);
        CHECK(mw_offload_journal_end(e) == 0);
        mw_offload_free(e);
    }
    CHECK_EQ_INT(count_files(run_dir), 0);
    mw_offload_record_free(&rec);
    free(buf);
    held_records(&r, dir, n, &at3);
    ou_snap_free(&at3);
    ou_snap_free(&at5);
    free(w); free(g); free(w2); free(wr); free(gr);
    mw_offload_registry_free(&r);
    corrupt_mid_run(dir);
    tu_rm_rf(dir);
    TEST_END();
}
