/*
 * test_store_index.c — the store's name index at scale: 200,000 objects (a 36 K-parameter model
 * cut into 1-element subgroups had ~72,000, two slots each) are created, found, a random eighth
 * of them deleted and created again, well inside a time budget that a name scan
 * (quadratic: ~2*10^10 comparisons) cannot meet; along the way every lookup must be exact
 * (duplicates refused, deleted names gone, each name finds its own object, deleting an object
 * of another store refused).
 */
#include "memwall/store.h"
#include "memwall/common.h"
#include "testutil.h"

#include <errno.h>
#include <time.h>

enum { NOBJ = 200000, NDEL = NOBJ / 8 };
#define BUDGET_S 20.0 /* the index: 0.6 s here (ASan: 2 s); a name scan: minutes */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double t0;

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* Stops the test (failed) once the budget is spent: a quadratic lookup would run for minutes. */
static void budget(const char *where, int i)
{
    if (now_s() - t0 <= BUDGET_S) return;
    fprintf(stderr, "FAIL: %s: %.0f s spent at object %d of %d: object lookup does not scale\n", where, BUDGET_S, i, NOBJ);
    exit(1);
}

static struct mw_store *open_store(const char *dir)
{
    struct mw_store_config c;
    mw_store_config_default(&c);
    const char *dirs[1] = {dir};
    c.dirs = dirs;
    c.ndirs = 1;
    c.capacity = (uint64_t)NOBJ * 2 * 4096;
    c.preallocate = 0; /* only the extents are counted; nothing is written */
    c.aio_config.backend = MW_AIO_THREADS;
    struct mw_store *st = NULL;
    int rc = mw_store_open(&st, &c);
    if (rc) fprintf(stderr, "open: %s\n", mw_error_msg());
    REQUIRE(rc == 0);
    return st;
}

int main(void)
{
    const char *dir = tu_scratch_dir("store_index");
    char dir2[600];
    snprintf(dir2, sizeof dir2, "%s/other", dir);
    struct mw_store *st = open_store(dir);
    struct mw_store_obj **obj = calloc(NOBJ, sizeof *obj);
    REQUIRE(obj);
    char name[64];
    t0 = now_s();
    int bad = 0;
    for (int i = 0; i < NOBJ; i++) {
        snprintf(name, sizeof name, "sg%d.slot%d", i / 2, i % 2);
        if (mw_store_obj_create(st, name, 12, &obj[i]) != 0) bad++;
        if ((i & 1023) == 0) budget("create", i);
    }
    CHECK_EQ_INT(bad, 0);
    struct mw_store_stats s;
    mw_store_stats(st, &s);
    CHECK_EQ_INT(s.n_objects, NOBJ);

    struct mw_store_obj *dup = NULL;
    CHECK(mw_store_obj_create(st, "sg777.slot1", 12, &dup) == -EEXIST && !dup);
    CHECK_MSG(strstr(mw_error_msg(), "'sg777.slot1' already exists"), "message: %s", mw_error_msg());

    bad = 0;
    for (int i = 0; i < NOBJ; i++) {
        snprintf(name, sizeof name, "sg%d.slot%d", i / 2, i % 2);
        if (mw_store_obj_find(st, name) != obj[i] || strcmp(mw_store_obj_name(obj[i]), name)) bad++;
        if ((i & 1023) == 0) budget("find", i);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(mw_store_obj_find(st, "sg100000.slot0") == NULL);
    CHECK(mw_store_obj_find(st, "sg1.slot") == NULL);

    /* A random eighth of them deleted (names scattered over the index's buckets), in the order
     * they were created: the holes then join the free list at its end, so the time measured is
     * the index's (a free list of many holes costs a memmove per hole filled or made). */
    uint64_t seed = 42;
    int *order = malloc(sizeof *order * NOBJ);
    REQUIRE(order);
    for (int i = 0; i < NOBJ; i++) order[i] = i;
    for (int i = NOBJ - 1; i > 0; i--) {
        int j = (int)(tu_rand(&seed) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    qsort(order, NDEL, sizeof *order, cmp_int);
    bad = 0;
    for (int k = 0; k < NDEL; k++) {
        int i = order[k];
        if (mw_store_obj_delete(st, obj[i]) != 0) bad++;
        obj[i] = NULL;
        if ((k & 1023) == 0) budget("delete", k);
    }
    CHECK_EQ_INT(bad, 0);
    mw_store_stats(st, &s);
    CHECK_EQ_INT(s.n_objects, NOBJ - NDEL);
    bad = 0;
    for (int i = 0; i < NOBJ; i++) {
        snprintf(name, sizeof name, "sg%d.slot%d", i / 2, i % 2);
        struct mw_store_obj *o = mw_store_obj_find(st, name);
        if (obj[i] ? o != obj[i] : o != NULL) bad++;
    }
    CHECK_EQ_INT(bad, 0);

    /* Created again (the deleted names are free), and every name still finds its own object. */
    bad = 0;
    for (int k = 0; k < NDEL; k++) {
        int i = order[k];
        snprintf(name, sizeof name, "sg%d.slot%d", i / 2, i % 2);
        if (mw_store_obj_create(st, name, 4096, &obj[i]) != 0) bad++;
        if ((k & 1023) == 0) budget("create again", k);
    }
    CHECK_EQ_INT(bad, 0);
    bad = 0;
    for (int i = 0; i < NOBJ; i++) {
        snprintf(name, sizeof name, "sg%d.slot%d", i / 2, i % 2);
        if (mw_store_obj_find(st, name) != obj[i]) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    mw_store_stats(st, &s);
    CHECK_EQ_INT(s.n_objects, NOBJ);
    double took = now_s() - t0;
    printf("%d objects: created, found, %d deleted and created again in %.2f s\n", NOBJ, NDEL, took);

    /* Deleting an object that another store holds is refused. */
    struct mw_store *st2 = open_store(dir2);
    struct mw_store_obj *x = NULL;
    REQUIRE(mw_store_obj_create(st2, "sg0.slot0", 12, &x) == 0);
    CHECK(mw_store_obj_delete(st, x) == -ENOENT);
    CHECK(mw_store_obj_find(st2, "sg0.slot0") == x);
    CHECK(mw_store_obj_delete(st2, x) == 0);
    CHECK(mw_store_obj_find(st2, "sg0.slot0") == NULL);
    CHECK(mw_store_obj_find(st, "sg0.slot0") == obj[0]);
    mw_store_close(st2);

    mw_store_close(st);
    free(order);
    free(obj);
    tu_rm_rf(dir);
    TEST_END();
}
