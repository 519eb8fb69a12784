/*
 * load.c — one trace event (a cJSON object, from scan.c) into one compact record, and the
 * metadata into tier budgets and calibrated limits.
 *
 * Tolerant by design: tier and kind args may be names ("host", "moments") or the recorder's
 * numeric ids, and the names producers used before docs/trace-conventions.md are read as their
 * aliases, so a trace from any version of the producers gives a report. Events of unknown
 * categories are counted and skipped; only a structurally broken event is an error.
 *
 * Numbers are hostile: every double from the file is range-checked before it becomes an
 * integer (a cast of NaN or 1e300 is undefined behaviour), times must be finite and within
 * RP_MAX_US of zero (so seconds * 1e9 fits an int64 downstream) and byte counts at most
 * RP_MAX_BYTES (so the sums of a few million events cannot wrap).
 */
#include "report/report_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RP_MAX_US 1e15                  /* ~31 years of microseconds */
#define RP_MAX_BYTES ((uint64_t)1 << 50) /* 1 PiB in one event */

/* A double as an integer in [lo, hi], or dflt when it is absent, NaN or out of range. */
static int64_t clamp_i64(double d, int64_t lo, int64_t hi, int64_t dflt)
{
    int64_t v;
    return mw_f64_to_i64(d, lo, hi, 0, &v) ? dflt : v;
}

/* Numeric tier ids in traces without a tier table: the order memwall wrote before the one tier
 * enum (memwall/common.h), kept so that those traces still read. */
static const char *const default_tier_names[] = {"device", "host", "nvme"};
static const char *const kind_names[] = {"weights", "grads", "master", "moments", "activations",
                                         "staging", "other", "untracked"};

int rp_grow(void **v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 1024;
    void *p = realloc(*v, nc * elem);
    if (!p) return -ENOMEM;
    *v = p;
    *cap = nc;
    return 0;
}

/* A name from the trace as the report keeps it: at most n-1 bytes, every control byte (and DEL)
 * as '?', so no name the trace carries can put control sequences on a terminal (--text). */
static void clean_name(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src);
    for (char *c = dst; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
}

int rp_tier_index(struct rp_trace *t, const char *raw)
{
    char name[sizeof t->tier_name[0]];
    clean_name(name, sizeof name, raw);
    for (int i = 0; i < t->ntiers; i++)
        if (!strcmp(t->tier_name[i], name)) return i;
    if (t->ntiers >= RP_MAX_TIERS) return -1;
    int i = t->ntiers++;
    memcpy(t->tier_name[i], name, sizeof name);
    t->tier_budget[i] = 0;
    t->tier_id[i] = -1;
    return i;
}

/* A tier arg: a name, or a numeric id (metadata "id" when given, else device/host/nvme). */
static int tier_from_json(struct rp_trace *t, const cJSON *v)
{
    if (cJSON_IsString(v)) return rp_tier_index(t, v->valuestring);
    if (!cJSON_IsNumber(v)) return -1;
    int64_t id64;
    if (mw_f64_to_i64(v->valuedouble, -1000000, 1000000, 0, &id64)) return -1;
    int id = (int)id64;
    for (int i = 0; i < t->ntiers; i++)
        if (t->tier_id[i] == id) return i;
    if (id >= 0 && id < 3) return rp_tier_index(t, default_tier_names[id]);
    char b[32];
    snprintf(b, sizeof b, "tier%d", id);
    return rp_tier_index(t, b);
}

static int kind_from_json(const cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        int k = (int)clamp_i64(v->valuedouble, 0, MW_REPORT_KIND_UNTRACKED - 1, MW_REPORT_KIND_UNTRACKED - 1);
        return k;
    }
    if (cJSON_IsString(v)) {
        for (int k = 0; k < MW_REPORT_KIND_UNTRACKED; k++)
            if (!strcmp(v->valuestring, kind_names[k])) return k;
        if (!strcmp(v->valuestring, "gradients")) return 1;
    }
    return MW_REPORT_KIND_UNTRACKED - 1; /* "other" */
}

static int pair_index(struct rp_trace *t, int from, int to)
{
    for (int i = 0; i < t->npairs; i++)
        if (t->pair_from[i] == from && t->pair_to[i] == to) return i;
    if (t->npairs >= RP_MAX_PAIRS) return -1;
    int i = t->npairs++;
    t->pair_from[i] = from;
    t->pair_to[i] = to;
    t->pair_limit[i] = 0;
    return i;
}

static double num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsString(v) && v->valuestring[0]) {
        char *end;
        double d = strtod(v->valuestring, &end);
        if (*end == 0) return d;
    }
    return dflt;
}

/* An integer arg, -1 when absent or out of range. */
static int64_t inum(const cJSON *o, const char *key)
{
    return clamp_i64(num(o, key, -1), -1, INT64_MAX / 2, -1);
}

/* A byte count arg: 0 and *b set, -1 when absent or negative, 1 when NaN or beyond RP_MAX_BYTES. */
static int bytes_arg(const cJSON *o, const char *key, uint64_t *b)
{
    double d = num(o, key, -1);
    if (d < 0) return -1;
    return mw_f64_to_u64(d, RP_MAX_BYTES, 0, b) ? 1 : 0;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int lookup(const char *s, const char *const *names, int n)
{
    if (!s) return -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static const char *const phase_names[] = {"-", "forward", "backward", "update", "data", "validation"};
static const char *const offload_names[] = {"read", "update", "write", "refresh", "wait"};
static const char *const decision_names[] = {"cpu", "device"};
static const char *const cat_names[] = {"phase", "step", "offload", "decision"};
static const char *const comm_names[] = {"allreduce", "reduce_scatter", "allgather", "wait"};

/* A time arg in ns: "<key>_ns", or "<key>_us" * 1000; -1 when absent. */
static int64_t ns_arg(const cJSON *args, const char *key)
{
    char k[48];
    snprintf(k, sizeof k, "%s_ns", key);
    double v = num(args, k, -1);
    if (v >= 0) return clamp_i64(v, 0, (int64_t)(RP_MAX_US * 1000), -1);
    snprintf(k, sizeof k, "%s_us", key);
    v = num(args, k, -1);
    return v >= 0 ? clamp_i64(v * 1000, 0, (int64_t)(RP_MAX_US * 1000), -1) : -1;
}

/* An offload h2d/d2h span: a transfer between host and device, counted as I/O of that pair. */
static int take_transfer(struct rp_trace *t, int h2d, double t0, double t1, const cJSON *args)
{
    uint64_t bytes;
    int host = rp_tier_index(t, "host"), dev = rp_tier_index(t, "device");
    int p = host >= 0 && dev >= 0 ? (h2d ? pair_index(t, host, dev) : pair_index(t, dev, host)) : -1;
    if (bytes_arg(args, "bytes", &bytes) || p < 0) { t->n_ignored++; return 0; }
    if (rp_grow((void **)&t->io, &t->capio, t->nio, sizeof *t->io)) return -ENOMEM;
    struct rp_io *r = &t->io[t->nio++];
    r->t0 = t0; r->t1 = t1; r->bytes = bytes; r->pair = p; r->qd = 0;
    return 0;
}

/* A span cat "comm": a collective (allreduce / reduce_scatter / allgather) or a "wait" on one. */
static int take_comm(struct rp_trace *t, const char *name, double t0, double t1, const cJSON *args)
{
    int op = lookup(name, comm_names, RP_COMM_WAIT + 1);
    if (op < 0) { t->n_ignored++; return 0; } /* e.g. a barrier: not a collective we count */
    if (rp_grow((void **)&t->comm, &t->capcomm, t->ncomm, sizeof *t->comm)) return -ENOMEM;
    struct rp_comm *c = &t->comm[t->ncomm++];
    c->t0 = t0; c->t1 = t1; c->op = (int8_t)op;
    int64_t g = inum(args, "group"), n = inum(args, "ranks");
    c->group = (int8_t)(g >= 0 && g < 100 ? g : -1);
    c->ranks = (int32_t)(n >= 0 && n < INT32_MAX ? n : -1);
    uint64_t b;
    c->bytes = bytes_arg(args, "bytes", &b) ? -1 : (int64_t)b;
    c->sent = bytes_arg(args, "sent", &b) ? -1 : (int64_t)b;
    return 0;
}

static const char *const res_names[] = {"fetch", "resident", "grad_write", "wait", "act_write", "act_read"};

/* A span cat "residency": a weight unit's fetch from NVMe, its time resident in DRAM, its
 * gradients' write-back, the training thread's wait for its fetch, or a block's activations
 * written to NVMe in forward and read back for backward. Without a valid "unit"
 * the span is counted as ignored (it cannot be put in any lane). */
/* An I/O request (cat "io"): between the tiers its args name (older traces: host and nvme). */
static int take_io(struct rp_trace *t, const char *name, double ts, double t1, const cJSON *args, const char **why)
{
    int wr = name && !strcmp(name, "write");
    const cJSON *fv = cJSON_GetObjectItemCaseSensitive(args, "from");
    const cJSON *tv = cJSON_GetObjectItemCaseSensitive(args, "to");
    int from = fv ? tier_from_json(t, fv) : rp_tier_index(t, wr ? "host" : "nvme");
    int to = tv ? tier_from_json(t, tv) : rp_tier_index(t, wr ? "nvme" : "host");
    int p = from >= 0 && to >= 0 ? pair_index(t, from, to) : -1;
    uint64_t bytes;
    int br = bytes_arg(args, "bytes", &bytes);
    if (br < 0) { *why = "\"io\" event without args.bytes"; return 1; }
    if (br > 0) { *why = "\"io\" event with args.bytes beyond 2^50 or not a number"; return 1; }
    if (p < 0) { t->n_ignored++; return 0; }
    if (rp_grow((void **)&t->io, &t->capio, t->nio, sizeof *t->io)) return -ENOMEM;
    struct rp_io *r = &t->io[t->nio++];
    r->t0 = ts; r->t1 = t1; r->bytes = bytes; r->pair = p;
    r->qd = (uint32_t)clamp_i64(num(args, "qd", 0), 0, UINT32_MAX, 0);
    return 0;
}

/* A cost span (docs/trace-conventions.md): a component's step, or auto's plan; others ignored. */
static int take_cost(struct rp_trace *t, const char *name, const cJSON *args)
{
    int comp = -1;
    for (int i = 0; i < MW_REPORT_COST_NCOMP && name; i++)
        if (!strcmp(name, mw_report_cost_name(i))) comp = i;
    if (name && !strcmp(name, "plan")) comp = RP_COST_PLAN;
    if (comp < 0) { t->n_ignored++; return 0; }
    if (rp_grow((void **)&t->cost, &t->capcost, t->ncost + 1, sizeof *t->cost)) return -ENOMEM;
    struct rp_cost *c = &t->cost[t->ncost++];
    c->comp = (int8_t)comp;
    c->step = inum(args, "step");
    int plan = comp == RP_COST_PLAN;
    c->n = inum(args, plan ? "device_subgroups" : "n");
    int64_t p = ns_arg(args, "predicted"), m = ns_arg(args, plan ? "best_fixed" : "measured");
    c->pred_s = p >= 0 ? (double)p * 1e-9 : NAN;
    c->meas_s = m >= 0 ? (double)m * 1e-9 : NAN;
    return 0;
}

static int take_residency(struct rp_trace *t, const char *name, double t0, double t1, const cJSON *args)
{
    int n = lookup(name, res_names, RP_RES_COUNT);
    double unit = num(args, "unit", -1);
    if (n < 0 || !(unit >= 0 && unit <= (double)INT32_MAX)) { t->n_ignored++; return 0; }
    if (rp_grow((void **)&t->res, &t->capres, t->nres, sizeof *t->res)) return -ENOMEM;
    struct rp_res *r = &t->res[t->nres++];
    r->t0 = t0; r->t1 = t1; r->name = (int8_t)n;
    r->unit = (int64_t)unit;
    double b = num(args, "bytes", 0);
    r->bytes = b > 0 && b < 9e18 ? (int64_t)b : 0;
    r->backward = num(args, "backward", 0) > 0;
    return 0;
}

/* One event object. Returns 0, -ENOMEM, or 1 for "structurally wrong" (message in *why). */
int rp_take_event(struct rp_trace *t, const cJSON *e, const char **why)
{
    const char *ph = str(e, "ph");
    if (!ph) { *why = "event has no \"ph\""; return 1; }
    t->n_events++;
    if (!strcmp(ph, "M")) return 0;
    const cJSON *tsv = cJSON_GetObjectItemCaseSensitive(e, "ts");
    if (!cJSON_IsNumber(tsv)) { *why = "event has no numeric \"ts\""; return 1; }
    if (!(fabs(tsv->valuedouble) <= RP_MAX_US)) { *why = "event \"ts\" is not finite or beyond 1e15 us"; return 1; }
    double ts = tsv->valuedouble * 1e-6; /* us -> s */
    const char *cat = str(e, "cat"), *name = str(e, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");

    if (!strcmp(ph, "X")) {
        const cJSON *dv = cJSON_GetObjectItemCaseSensitive(e, "dur");
        if (!cJSON_IsNumber(dv) || !(dv->valuedouble >= 0 && dv->valuedouble <= RP_MAX_US)) {
            *why = "\"X\" event without a valid \"dur\" (0 .. 1e15 us)";
            return 1;
        }
        double t1 = ts + dv->valuedouble * 1e-6;
        if (cat && !strcmp(cat, "comm")) return take_comm(t, name, ts, t1, args);
        if (cat && !strcmp(cat, "residency")) return take_residency(t, name, ts, t1, args);
        if (cat && !strcmp(cat, "cost")) return take_cost(t, name, args);
        if (cat && !strcmp(cat, "io")) return take_io(t, name, ts, t1, args, why);
        int c = lookup(cat, cat_names, 4);
        int n = -1, offload_step = 0;
        /* Aliases used by producers before docs/trace-conventions.md (see there). */
        if (cat && !strcmp(cat, "train")) c = name && !strcmp(name, "step") ? RP_CAT_STEP : RP_CAT_PHASE;
        if (c == RP_CAT_OFFLOAD && name) {
            if (!strcmp(name, "step")) { c = RP_CAT_PHASE; name = "update"; offload_step = 1; }
            else if (!strcmp(name, "sg_read")) name = "read";
            else if (!strcmp(name, "sg_write")) name = "write";
            else if (!strcmp(name, "h2d") || !strcmp(name, "d2h"))
                return take_transfer(t, name[0] == 'h', ts, t1, args);
        }
        if (c == RP_CAT_PHASE) n = lookup(name, phase_names + 1, MW_PHASE_COUNT - 1) + 1;
        else if (c == RP_CAT_STEP) n = name && !strcmp(name, "step") ? 0 : -1;
        else if (c == RP_CAT_OFFLOAD) n = lookup(name, offload_names, RP_OFF_COUNT);
        else if (c == RP_CAT_DECISION) n = lookup(name, decision_names, 2);
        if (c < 0 || n < 0 || (c == RP_CAT_PHASE && n == 0)) { t->n_ignored++; return 0; }
        if (rp_grow((void **)&t->span, &t->capspan, t->nspan + 1, sizeof *t->span)) return -ENOMEM;
        struct rp_span *s = &t->span[t->nspan++];
        s->t0 = ts; s->t1 = t1; s->cat = (int8_t)c; s->name = (int8_t)n; s->synth = 0;
        s->who = offload_step ? RP_WHO_ENGINE : inum(args, "caller") == 1 ? RP_WHO_CALLER : RP_WHO_ANY;
        const cJSON *tv = cJSON_GetObjectItemCaseSensitive(args, "tier");
        s->tier = (int16_t)(tv ? tier_from_json(t, tv) : -1);
        s->step = inum(args, "step");
        s->tokens = inum(args, "tokens");
        s->sub = cJSON_GetObjectItemCaseSensitive(args, "subgroup") ? inum(args, "subgroup") : inum(args, "sg");
        s->bytes = inum(args, "bytes");
        s->predicted_ns = ns_arg(args, "predicted");
        s->measured_ns = ns_arg(args, "measured");
        if (offload_step) {
            /* The optimizer step of the offload engine: a step too, used when the trace has no
             * step spans of its own (e.g. memwall bench offload --trace). */
            struct rp_span *d = &t->span[t->nspan++];
            *d = *s;
            d->cat = RP_CAT_STEP;
            d->name = 0;
            d->synth = 1;
            return 0;
        }
        int64_t dev = inum(args, "device");
        if (c == RP_CAT_OFFLOAD && n == RP_OFF_UPDATE && dev >= 0) {
            /* An update span saying where it ran (and predicted/measured): also a decision. */
            struct rp_span *d = &t->span[t->nspan++];
            *d = *s;
            d->cat = RP_CAT_DECISION;
            d->name = dev ? RP_DEC_DEVICE : RP_DEC_CPU;
            d->synth = 1;
        }
        return 0;
    }
    if (!strcmp(ph, "i") || !strcmp(ph, "I")) {
        int is_alloc = name && !strcmp(name, "alloc"), is_free = name && !strcmp(name, "free");
        if (!(cat && !strcmp(cat, "mem")) || !(is_alloc || is_free)) { t->n_ignored++; return 0; }
        const cJSON *tv = cJSON_GetObjectItemCaseSensitive(args, "tier");
        uint64_t bytes;
        int br = bytes_arg(args, "bytes", &bytes);
        if (!tv || br < 0) { *why = "alloc/free event without args.tier and args.bytes"; return 1; }
        if (br > 0) { *why = "alloc/free event with args.bytes beyond 2^50 or not a number"; return 1; }
        int tier = tier_from_json(t, tv);
        if (tier < 0) { t->n_ignored++; return 0; }
        if (rp_grow((void **)&t->mem, &t->capmem, t->nmem, sizeof *t->mem)) return -ENOMEM;
        struct rp_mem *m = &t->mem[t->nmem];
        m->seq = (uint32_t)t->nmem++;
        m->t = ts; m->tier = (int16_t)tier;
        m->kind = (int16_t)kind_from_json(cJSON_GetObjectItemCaseSensitive(args, "kind"));
        m->delta = is_alloc ? (int64_t)bytes : -(int64_t)bytes;
        uint64_t tb;
        m->has_value = bytes_arg(args, "tier_bytes", &tb) == 0;
        m->value = m->has_value ? tb : 0;
        return 0;
    }
    if (!strcmp(ph, "C") && name && !strcmp(name, "zero3 resident weights")) {
        /* ZeRO-3: bytes of the weights resident on this rank (not a tier total). */
        double v = num(args, "value", num(args, "bytes", -1));
        if (!(v >= 0 && v <= (double)RP_MAX_BYTES)) { t->n_ignored++; return 0; }
        if (!t->has_resident || v > t->resident_peak) { t->resident_peak = v; t->resident_peak_t = ts; }
        t->has_resident = 1;
        t->resident_final = v; /* file order is time order per producer thread */
        return 0;
    }
    if (!strcmp(ph, "C") && name && !strcmp(name, "resident weights")) {
        /* NVMe streaming: bytes of the weight units resident in DRAM (not a tier total). */
        double v = num(args, "value", num(args, "bytes", -1));
        if (!(v >= 0 && v < 1.8e19)) { t->n_ignored++; return 0; } /* must fit a uint64_t */
        if (!t->has_resw || v > t->resw_peak) { t->resw_peak = v; t->resw_peak_t = ts; }
        t->has_resw = 1;
        t->resw_final = v;
        return 0;
    }
    if (!strcmp(ph, "C")) {
        size_t nl = name ? strlen(name) : 0;
        char tn[32] = "";
        if (nl > 6 && !strcmp(name + nl - 6, " bytes") && nl - 6 < 32) {
            memcpy(tn, name, nl - 6);
            tn[nl - 6] = 0;
        }
        /* A tier's total: the recorder's cat "mem" counter, or "<device|host|nvme> bytes".
         * Other "... bytes" counters (e.g. "offload nvme read bytes") are not tiers. */
        int is_tier = tn[0] && ((cat && !strcmp(cat, "mem")) || lookup(tn, default_tier_names, 3) >= 0);
        if (is_tier) {
            double v = num(args, "value", num(args, "bytes", -1)); /* recorder: {bytes} */
            int tier = rp_tier_index(t, tn);
            if (!(v >= 0 && v <= (double)RP_MAX_BYTES) || tier < 0) { t->n_ignored++; return 0; }
            if (rp_grow((void **)&t->mem, &t->capmem, t->nmem, sizeof *t->mem)) return -ENOMEM;
            struct rp_mem *m = &t->mem[t->nmem];
            m->seq = (uint32_t)t->nmem++;
            m->t = ts; m->tier = (int16_t)tier; m->kind = -1; m->has_value = 1; m->delta = 0; m->value = (uint64_t)v;
            return 0;
        }
    }
    t->n_ignored++;
    return 0;
}

void rp_take_metadata(struct rp_trace *t, const cJSON *md)
{
    const cJSON *tiers = cJSON_GetObjectItemCaseSensitive(md, "tiers");
    const cJSON *it;
    cJSON_ArrayForEach(it, tiers) {
        const char *n = str(it, "name");
        if (!n) continue;
        int i = rp_tier_index(t, n);
        if (i < 0) continue;
        t->tier_budget[i] = (uint64_t)clamp_i64(num(it, "budget_bytes", 0), 0, (int64_t)RP_MAX_BYTES * 1024, 0);
        int64_t id = clamp_i64(num(it, "id", -1), -1, 1000000, -1);
        if (id >= 0) t->tier_id[i] = (int)id;
    }
    /* Events lost either way: overwritten in the ring, or still being written at the dump. */
    t->dropped = (uint64_t)clamp_i64(num(md, "dropped_events", 0), 0, INT64_MAX / 2, 0) +
                 (uint64_t)clamp_i64(num(md, "skipped_events", 0), 0, INT64_MAX / 2, 0);
    /* Run identity (strings from mw_trace_meta, or numbers). */
    double v = num(md, "rank", -1);
    if (v >= 0 && v < INT32_MAX) t->rank = (int)v;
    v = num(md, "world_size", -1);
    if (v >= 1 && v < INT32_MAX) t->world_size = (int)v;
    v = num(md, "zero_stage", -1);
    if (v >= 0 && v < 100) t->zero_stage = (int)v;
    /* Weight units: "units" (count) and "unit.<id>.name" (strings). */
    v = num(md, "units", -1);
    if (v >= 0 && v <= INT32_MAX) t->units_declared = (int64_t)v;
    cJSON_ArrayForEach(it, md) {
        const char *k = it->string;
        if (!k || strncmp(k, "unit.", 5) || !cJSON_IsString(it)) continue;
        char *end;
        errno = 0;
        long long id = strtoll(k + 5, &end, 10);
        if (errno || end == k + 5 || strcmp(end, ".name") || id < 0 || id > INT32_MAX) continue;
        if (rp_grow((void **)&t->unit_names, &t->capunit_names, t->nunit_names, sizeof *t->unit_names)) return;
        struct rp_unit_name *u = &t->unit_names[t->nunit_names++];
        u->id = id;
        clean_name(u->name, sizeof u->name, it->valuestring);
    }
    /* Limits: "limit.<from>-><to>.bytes_per_s". Pairs may not exist yet: create them. */
    cJSON_ArrayForEach(it, md) {
        const char *k = it->string;
        if (!k || strncmp(k, "limit.", 6)) continue;
        const char *arrow = strstr(k + 6, "->"), *suffix = strstr(k + 6, ".bytes_per_s");
        if (!arrow || !suffix || suffix < arrow || suffix[12]) continue;
        char from[32], to[32];
        size_t fl = (size_t)(arrow - (k + 6)), tl = (size_t)(suffix - (arrow + 2));
        if (!fl || !tl || fl >= sizeof from || tl >= sizeof to) continue;
        memcpy(from, k + 6, fl); from[fl] = 0;
        memcpy(to, arrow + 2, tl); to[tl] = 0;
        double bw = cJSON_IsNumber(it) ? it->valuedouble
                  : cJSON_IsString(it) ? strtod(it->valuestring, NULL) : 0;
        int f = rp_tier_index(t, from), o = rp_tier_index(t, to);
        int p = f >= 0 && o >= 0 ? pair_index(t, f, o) : -1;
        if (p >= 0 && bw > 0 && bw < 1e18) t->pair_limit[p] = bw;
    }
}

void rp_trace_free(struct rp_trace *t)
{
    free(t->io);
    free(t->mem);
    free(t->span);
    free(t->comm);
    free(t->res);
    free(t->unit_names);
    free(t->cost);
    t->cost = NULL; t->ncost = t->capcost = 0;
    t->io = NULL; t->mem = NULL; t->span = NULL; t->comm = NULL; t->res = NULL; t->unit_names = NULL;
    t->nio = t->nmem = t->nspan = t->ncomm = t->nres = t->nunit_names = 0;
    t->capio = t->capmem = t->capspan = t->capcomm = t->capres = t->capunit_names = 0;
}

const char *mw_report_kind_name(int kind)
{
    return kind >= 0 && kind < MW_REPORT_NKINDS ? kind_names[kind] : "?";
}

const char *mw_report_phase_name(int phase)
{
    return phase >= 0 && phase < MW_PHASE_COUNT ? phase_names[phase] : "?";
}

const char *mw_report_comm_op_name(int op)
{
    return op >= 0 && op <= RP_COMM_WAIT ? comm_names[op] : "?";
}
