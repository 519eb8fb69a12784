/*
 * test_trace.c — the recorder: every event kind lands in the Chrome/Perfetto JSON with its
 * fields (parsed back with cJSON), tiers and budgets in the metadata, the ring drops the
 * oldest events and counts them, a NULL recorder is a no-op, and two threads emitting at
 * once lose nothing.
 */
#include "memwall/aio.h"
#include "memwall/tier.h"
#include "memwall/trace.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <pthread.h>

static cJSON *load(const char *path)
{
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    REQUIRE(fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = 0;
    fclose(f);
    cJSON *j = cJSON_Parse(s);
    CHECK_MSG(j != NULL, "JSON does not parse near: %.60s", cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "?");
    free(s);
    return j;
}

static const cJSON *find(const cJSON *evs, const char *ph, const char *name, int nth)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const cJSON *p = cJSON_GetObjectItem(e, "ph"), *n = cJSON_GetObjectItem(e, "name");
        if (cJSON_IsString(p) && cJSON_IsString(n) && !strcmp(p->valuestring, ph) && !strcmp(n->valuestring, name) &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void test_events(const char *dir)
{
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 1024) == 0);
    mw_trace_thread_name(tr, "main \"test\"");
    mw_trace_meta(tr, "model", "gpt2-tiny");
    struct mw_tier *host, *nvme;
    REQUIRE(mw_tier_init(&host, MW_TIER_DRAM, 1ull << 30, tr) == 0);
    REQUIRE(mw_tier_init(&nvme, MW_TIER_NVME, 0, tr) == 0);
    struct mw_buf b;
    REQUIRE(mw_tier_alloc(host, 8192, 0, MW_KIND_MOMENTS, "sg3.exp_avg", &b) == 0);

    /* Real I/O through the engine: 3 pieces of 4 KiB. */
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    c.block_size = 4096;
    c.queue_depth = 2;
    c.trace = tr;
    struct mw_aio *aio;
    REQUIRE(mw_aio_init(&aio, &c) == 0);
    char path[700];
    snprintf(path, sizeof path, "%s/io.bin", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    static char data[12288];
    const char *obj = mw_trace_intern(tr, "sg3.exp_avg");
    CHECK(obj == mw_trace_intern(tr, "sg3.exp_avg")); /* deduplicated */
    REQUIRE(mw_aio_pwrite(aio, fd, data, sizeof data, 8192, obj, path) == 0);
    mw_aio_free(aio);
    close(fd);

    uint64_t t0 = mw_trace_now(tr);
    struct mw_trace_arg args[5] = {{"subgroup", 17}, {"bytes", 1 << 20}, {"a", 1}, {"b", 2}, {"dropped", 5}};
    mw_trace_span(tr, "offload", "update", t0, t0 + 2500000, args, 5);
    mw_trace_counter(tr, "queue_depth", t0 + 1000, 7.5);
    mw_tier_free(&b);

    char out[700];
    snprintf(out, sizeof out, "%s/trace.json", dir);
    REQUIRE(mw_trace_write(tr, out) == 0);
    cJSON *j = load(out);
    REQUIRE(j);
    const cJSON *evs = cJSON_GetObjectItem(j, "traceEvents");
    REQUIRE(cJSON_IsArray(evs));

    const cJSON *w = find(evs, "X", "write", 0);
    REQUIRE(w);
    const cJSON *a = cJSON_GetObjectItem(w, "args");
    CHECK(!strcmp(str(a, "object"), "sg3.exp_avg"));
    CHECK_EQ_INT(num(a, "bytes"), 4096);
    CHECK_EQ_INT(num(a, "offset"), 8192);
    CHECK(num(a, "qd") >= 1 && num(a, "qd") <= 2);
    CHECK(!strcmp(str(a, "from"), "host") && !strcmp(str(a, "to"), "nvme"));
    CHECK(num(w, "dur") >= 0);
    CHECK(find(evs, "X", "write", 2) != NULL && find(evs, "X", "write", 3) == NULL);

    const cJSON *al = find(evs, "i", "alloc", 0), *fr = find(evs, "i", "free", 0);
    REQUIRE(al && fr);
    CHECK(!strcmp(str(cJSON_GetObjectItem(al, "args"), "label"), "sg3.exp_avg"));
    CHECK(!strcmp(str(cJSON_GetObjectItem(al, "args"), "kind"), "moments"));
    CHECK(!strcmp(str(cJSON_GetObjectItem(al, "args"), "tier"), "host"));
    CHECK_EQ_INT(num(cJSON_GetObjectItem(al, "args"), "bytes"), 8192);
    const cJSON *c0 = find(evs, "C", "host bytes", 0), *c1 = find(evs, "C", "host bytes", 1);
    REQUIRE(c0 && c1);
    CHECK_EQ_INT(num(cJSON_GetObjectItem(c0, "args"), "bytes"), 8192);
    CHECK_EQ_INT(num(cJSON_GetObjectItem(c1, "args"), "bytes"), 0);

    const cJSON *sp = find(evs, "X", "update", 0);
    REQUIRE(sp);
    CHECK(!strcmp(str(sp, "cat"), "offload"));
    CHECK(num(sp, "dur") > 2499.9 && num(sp, "dur") < 2500.1); /* microseconds */
    const cJSON *sa = cJSON_GetObjectItem(sp, "args");
    CHECK_EQ_INT(num(sa, "subgroup"), 17);
    CHECK_EQ_INT(num(sa, "bytes"), 1 << 20);
    CHECK(cJSON_GetObjectItem(sa, "dropped") == NULL); /* only MW_TRACE_MAX_ARGS kept */
    const cJSON *ct = find(evs, "C", "queue_depth", 0);
    REQUIRE(ct);
    CHECK(num(cJSON_GetObjectItem(ct, "args"), "value") == 7.5);
    const cJSON *tn = find(evs, "M", "thread_name", 0);
    REQUIRE(tn);
    CHECK(!strcmp(str(cJSON_GetObjectItem(tn, "args"), "name"), "main \"test\""));

    const cJSON *md = cJSON_GetObjectItem(j, "metadata");
    REQUIRE(md);
    CHECK(!strcmp(str(md, "model"), "gpt2-tiny"));
    CHECK_EQ_INT(num(md, "dropped_events"), 0);
    const cJSON *tiers = cJSON_GetObjectItem(md, "tiers");
    CHECK_EQ_INT(cJSON_GetArraySize(tiers), 2);
    const cJSON *t0j = cJSON_GetArrayItem(tiers, 0);
    CHECK(!strcmp(str(t0j, "name"), "host"));
    CHECK(num(t0j, "budget_bytes") == (double)(1ull << 30));
    cJSON_Delete(j);
    mw_tier_free_tier(host);
    mw_tier_free_tier(nvme);
    mw_trace_free(tr);
}

static void test_ring_drops_oldest(const char *dir)
{
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 100) == 0); /* rounded up to 128 */
    for (int i = 0; i < 300; i++) mw_trace_counter(tr, "i", (uint64_t)i, i);
    struct mw_trace_stats s;
    mw_trace_stats(tr, &s);
    CHECK_EQ_INT(s.capacity, 128);
    CHECK_EQ_INT(s.recorded, 300);
    CHECK_EQ_INT(s.kept, 128);
    CHECK_EQ_INT(s.dropped, 172);
    char out[700];
    snprintf(out, sizeof out, "%s/ring.json", dir);
    REQUIRE(mw_trace_write(tr, out) == 0);
    cJSON *j = load(out);
    REQUIRE(j);
    const cJSON *evs = cJSON_GetObjectItem(j, "traceEvents");
    const cJSON *first = find(evs, "C", "i", 0);
    REQUIRE(first);
    CHECK(num(cJSON_GetObjectItem(first, "args"), "value") == 172); /* the oldest kept */
    CHECK(find(evs, "C", "i", 127) && !find(evs, "C", "i", 128));
    CHECK_EQ_INT(num(cJSON_GetObjectItem(j, "metadata"), "dropped_events"), 172);
    cJSON_Delete(j);
    mw_trace_free(tr);
}

static void *emitter(void *arg)
{
    struct mw_trace *tr = arg;
    mw_trace_thread_name(tr, "emitter");
    for (int i = 0; i < 5000; i++) {
        struct mw_trace_arg a = {"i", i};
        uint64_t t = mw_trace_now(tr);
        mw_trace_span(tr, "test", "work", t, t + 10, &a, 1);
    }
    return NULL;
}

static void test_two_threads(const char *dir)
{
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 16384) == 0);
    pthread_t th[2];
    for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, emitter, tr) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    char out[700];
    snprintf(out, sizeof out, "%s/mt.json", dir);
    REQUIRE(mw_trace_write(tr, out) == 0);
    cJSON *j = load(out);
    REQUIRE(j);
    const cJSON *evs = cJSON_GetObjectItem(j, "traceEvents");
    CHECK(find(evs, "X", "work", 9999) && !find(evs, "X", "work", 10000));
    CHECK(find(evs, "M", "thread_name", 1) != NULL);
    CHECK_EQ_INT(num(cJSON_GetObjectItem(j, "metadata"), "skipped_events"), 0);
    cJSON_Delete(j);
    mw_trace_free(tr);
}

int main(void)
{
    const char *dir = tu_scratch_dir("trace");
    /* A NULL recorder accepts everything and does nothing. */
    CHECK_EQ_INT(mw_trace_now(NULL), 0);
    CHECK(!mw_trace_enabled(NULL));
    mw_trace_span(NULL, "a", "b", 0, 1, NULL, 0);
    mw_trace_counter(NULL, "c", 0, 1);
    CHECK(!strcmp(mw_trace_intern(NULL, "x"), "x"));
    CHECK_EQ_INT(mw_trace_write(NULL, "/nonexistent/x.json"), 0);
    test_events(dir);
    test_ring_drops_oldest(dir);
    test_two_threads(dir);
    /* An unwritable path is an error with the path in the message. */
    struct mw_trace *tr;
    REQUIRE(mw_trace_init(&tr, 16) == 0);
    CHECK(mw_trace_write(tr, "/nonexistent-dir/t.json") < 0);
    CHECK(strstr(mw_error_msg(), "/nonexistent-dir/t.json") != NULL);
    mw_trace_free(tr);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_END();
}
