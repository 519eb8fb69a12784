/*
 * placement.c — where each kind of state lives, the per-subgroup byte layout, and the plan.
 *
 * Why size first: a run that finds at step 1000 that host memory or the SSD is full has wasted
 * the 999 steps before it. The plan computes every byte the engine will hold on every tier from
 * the registry and the config alone, and mw_offload_init allocates exactly that; a tier whose
 * budget or real capacity (MemAvailable, free space of the NVMe directory) is too small is
 * refused before the first allocation, with the numbers.
 */
#include "offload/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

static const char *tier_names[MW_TIER_COUNT] = {[MW_TIER_DRAM] = "dram", [MW_TIER_NVME] = "nvme", [MW_TIER_DEVICE] = "device"};
static const char *kind_names[MW_OFFLOAD_NKINDS] = {"master", "moments", "grads", "weights"};

const char *mw_offload_tier_name(enum mw_tier_id t)
{
    return (unsigned)t < MW_TIER_COUNT ? tier_names[t] : "?";
}
const char *mw_offload_kind_name(enum mw_offload_kind k)
{
    return (unsigned)k < MW_OFFLOAD_NKINDS ? kind_names[k] : "?";
}

void mw_offload_placement_default(struct mw_offload_placement *p)
{
    for (int k = 0; k < MW_OFFLOAD_NKINDS; k++) p->tier[k] = MW_TIER_DRAM;
}

static int parse_tier(const char *s, size_t n, enum mw_tier_id *t)
{
    for (int i = 0; i < MW_TIER_COUNT; i++)
        if (strlen(tier_names[i]) == n && !strncmp(s, tier_names[i], n)) { *t = (enum mw_tier_id)i; return 0; }
    return -EINVAL;
}

int mw_offload_placement_parse(const char *s, struct mw_offload_placement *p)
{
    struct mw_offload_placement q = *p;
    const char *c = s;
    while (c && *c) {
        const char *end = strchr(c, ',');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        const char *eq = memchr(c, '=', len);
        if (!eq) return mw_error_set(-EINVAL, "placement '%s': expected KIND=TIER items separated by commas "
                                     "(kinds: master, moments, grads, weights, optim, all; tiers: dram, nvme)", s);
        size_t kl = (size_t)(eq - c);
        enum mw_tier_id t;
        if (parse_tier(eq + 1, len - kl - 1, &t))
            return mw_error_set(-EINVAL, "placement '%s': unknown tier '%.*s' (dram, nvme, device)", s,
                                (int)(len - kl - 1), eq + 1);
        int hit = 0;
        for (int k = 0; k < MW_OFFLOAD_NKINDS; k++)
            if (strlen(kind_names[k]) == kl && !strncmp(c, kind_names[k], kl)) { q.tier[k] = t; hit = 1; }
        if (kl == 5 && !strncmp(c, "optim", 5)) { q.tier[MW_OFFLOAD_MASTER] = q.tier[MW_OFFLOAD_MOMENTS] = t; hit = 1; }
        if (kl == 3 && !strncmp(c, "all", 3)) { for (int k = 0; k < MW_OFFLOAD_NKINDS; k++) q.tier[k] = t; hit = 1; }
        if (!hit) return mw_error_set(-EINVAL, "placement '%s': unknown kind '%.*s' (master, moments, grads, "
                                      "weights, optim, all)", s, (int)kl, c);
        c = end ? end + 1 : NULL;
    }
    *p = q;
    return 0;
}

const char *mw_offload_placement_str(const struct mw_offload_placement *p, char *buf, size_t n)
{
    snprintf(buf, n, "master=%s,moments=%s,grads=%s,weights=%s", mw_offload_tier_name(p->tier[0]),
             mw_offload_tier_name(p->tier[1]), mw_offload_tier_name(p->tier[2]), mw_offload_tier_name(p->tier[3]));
    return buf;
}

#define OFL_DEFAULT_SUBGROUP ((uint64_t)1 << 22) /* 4M elements: 16 MiB of fp32 master, 48 MiB of fp32 state */

void mw_offload_config_default(struct mw_offload_config *c)
{
    memset(c, 0, sizeof *c);
    c->subgroup_size = OFL_DEFAULT_SUBGROUP;
    c->buffer_count = 8;         /* 8 x 48 MiB staging: reads, updates and writes all overlap */
    mw_offload_placement_default(&c->place);
    c->moments = MW_OFFLOAD_M_FP32;
    c->weights = MW_OFFLOAD_W_FP32;
    c->policy = MW_OFFLOAD_POLICY_ALL_CPU;
    c->every_k = 2;
    mw_offload_profile_default(&c->profile);
}

/* ------------------------------------------------------------------ formats and layout */

enum mw_optim_dtype ofl_mdtype(enum mw_offload_mfmt f)
{
    switch (f) {
    case MW_OFFLOAD_M_BF16: return MW_OPTIM_BF16;
    case MW_OFFLOAD_M_BF16_SR: return MW_OPTIM_BF16_SR;
    case MW_OFFLOAD_M_8BIT: return MW_OPTIM_Q8;
    default: return MW_OPTIM_F32;
    }
}
enum mw_optim_dtype ofl_wdtype(enum mw_offload_wfmt f)
{
    return f == MW_OFFLOAD_W_BF16 ? MW_OPTIM_BF16 : f == MW_OFFLOAD_W_FP16 ? MW_OPTIM_F16 : MW_OPTIM_F32;
}
uint64_t ofl_wbytes(enum mw_offload_wfmt f) { return f == MW_OFFLOAD_W_FP32 ? 4 : 2; }
uint64_t ofl_granule(const struct mw_offload_config *c) { return c->moments == MW_OFFLOAD_M_8BIT ? MW_Q8_BLOCK : 1; }

int ofl_transactional(const struct mw_offload_config *c)
{
    return c->place.tier[MW_OFFLOAD_MASTER] == MW_TIER_NVME || c->place.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME;
}

const struct ofl_region_desc ofl_regions[OFL_NREGIONS] = {
    [OFL_R_MASTER] = {"master", MW_OFFLOAD_MASTER, OFL_ELEM_FP32},
    [OFL_R_M] = {"exp_avg", MW_OFFLOAD_MOMENTS, OFL_ELEM_MOMENT},
    [OFL_R_MSCALE] = {"moment scales", MW_OFFLOAD_MOMENTS, OFL_ELEM_SCALE},
    [OFL_R_V] = {"exp_avg_sq", MW_OFFLOAD_MOMENTS, OFL_ELEM_MOMENT},
    [OFL_R_VSCALE] = {"moment scales", MW_OFFLOAD_MOMENTS, OFL_ELEM_SCALE},
};

void *ofl_slice_region(const struct mw_optim_slice *s, enum ofl_region r)
{
    switch (r) {
    case OFL_R_MASTER: return s->master;
    case OFL_R_M: return s->m;
    case OFL_R_MSCALE: return s->m_scale;
    case OFL_R_V: return s->v;
    default: return s->v_scale;
    }
}

void ofl_slice_set(struct mw_optim_slice *s, enum ofl_region r, void *p)
{
    switch (r) {
    case OFL_R_MASTER: s->master = p; break;
    case OFL_R_M: s->m = p; break;
    case OFL_R_MSCALE: s->m_scale = p; break;
    case OFL_R_V: s->v = p; break;
    default: s->v_scale = p; break;
    }
}

enum mw_offload_kind ofl_region_kind(enum ofl_region r)
{
    return ofl_regions[r].kind;
}

uint64_t ofl_region_bytes(const struct mw_offload_config *c, enum ofl_region r, uint64_t n)
{
    enum mw_optim_dtype md = ofl_mdtype(c->moments);
    switch (ofl_regions[r].elem) {
    case OFL_ELEM_FP32: return 4 * n;
    case OFL_ELEM_MOMENT: return mw_optim_array_bytes(md, n);
    default: return mw_optim_scale_bytes(md, n);
    }
}

uint64_t ofl_region_offset(const struct mw_offload_config *c, enum ofl_region r, uint64_t first)
{
    if (ofl_regions[r].elem == OFL_ELEM_SCALE) return c->moments == MW_OFFLOAD_M_8BIT ? first / MW_Q8_BLOCK * 4 : 0;
    return ofl_region_bytes(c, r, first);
}

void ofl_layout_make(const struct mw_offload_config *c, uint64_t n, struct ofl_layout *L)
{
    uint64_t off = 0;
    for (int r = 0; r < OFL_NREGIONS; r++) {
        L->off[r] = off;
        L->len[r] = ofl_region_bytes(c, (enum ofl_region)r, n);
        off += MW_ALIGN_UP(L->len[r], OFL_PAD);
    }
    L->total = off;
}

/* ------------------------------------------------------------------ real capacity */

uint64_t ofl_dram_available(void) { return mw_mem_available(); }

/* Free bytes summed over the ':'-separated directories (each: its nearest existing ancestor). */
uint64_t ofl_dir_available(const char *dirs)
{
    if (!dirs) return 0;
    uint64_t sum = 0;
    const char *c = dirs;
    while (*c) {
        const char *end = strchr(c, ':');
        size_t len = end ? (size_t)(end - c) : strlen(c);
        char *path = strndup(c, len); /* whole: a cut path would ask another file system */
        struct statvfs sv;
        int ok = 0;
        while (path && !(ok = statvfs(path[0] ? path : ".", &sv) == 0)) {
            char *slash = strrchr(path, '/');
            if (!slash && (!path[0] || !strcmp(path, "."))) break; /* not even the working directory: count 0 */
            if (!slash) { path[0] = '.'; path[1] = 0; continue; }
            if (slash == path) { path[1] = 0; continue; }
            *slash = 0;
        }
        free(path);
        if (ok) sum += (uint64_t)sv.f_bavail * sv.f_frsize;
        if (!end) break;
        c = end + 1;
    }
    return sum;
}

/* ------------------------------------------------------------------ the plan */

static int check_config(const struct mw_offload_registry *r, const struct mw_offload_config *c)
{
    if (!r || r->total == 0) return mw_error_set(-EINVAL, "offload: the parameter registry is empty");
    if (c->subgroup_size == 0) return mw_error_set(-EINVAL, "offload: subgroup size must be >= 1 element");
    if (c->buffer_count < 1 || c->buffer_count > 64)
        return mw_error_set(-EINVAL, "offload: buffer count %d out of range [1, 64]", c->buffer_count);
    for (int k = 0; k < MW_OFFLOAD_NKINDS; k++) {
        enum mw_tier_id t = c->place.tier[k];
        if ((unsigned)t >= MW_TIER_COUNT) return mw_error_set(-EINVAL, "offload: bad tier for %s", kind_names[k]);
        if (t == MW_TIER_DEVICE)
            return mw_error_set(-ENOTSUP, "offload: %s=device is not supported yet: state homes are dram or nvme; "
                                "the (emulated) accelerator runs updates by the offload policy (policy; CUDA backend: "
                                "later issue)",
                                kind_names[k]);
        if (t == MW_TIER_NVME && (k == MW_OFFLOAD_GRADS || k == MW_OFFLOAD_WEIGHTS))
            return mw_error_set(-ENOTSUP, "offload: %s=nvme is not supported: gradients and the working copy are "
                                "touched by every micro-step and stay in dram", kind_names[k]);
    }
    if (c->stream && (c->place.tier[MW_OFFLOAD_MASTER] != MW_TIER_NVME || c->weights != MW_OFFLOAD_W_FP32))
        return mw_error_set(-EINVAL, "offload: streaming weights needs the fp32 master on nvme (it is the weights' home)");
    if (c->grads_dram && !c->stream)
        return mw_error_set(-EINVAL, "offload: grads_dram is for streamed weights (stream)");
    if (c->stream && c->use_device)
        return mw_error_set(-ENOTSUP, "offload: streaming weights runs every update on the CPU (use the all-cpu policy)");
    if (ofl_transactional(c) && (!c->nvme_dir || !*c->nvme_dir))
        return mw_error_set(-EINVAL, "offload: state is placed on nvme but no NVMe directory is given");
    if (c->io_block_size % 4096 || c->io_queue_depth > 4096)
        return mw_error_set(-EINVAL, "offload: I/O block size must be a multiple of 4096 and queue depth <= 4096");
    if (c->policy == MW_OFFLOAD_POLICY_EVERY_K && c->every_k < 1)
        return mw_error_set(-EINVAL, "offload: every-k policy needs k >= 1");
    if (c->policy != MW_OFFLOAD_POLICY_ALL_CPU && !c->use_device)
        return mw_error_set(-EINVAL, "offload: policy %s needs the accelerator (use_device)",
                            mw_offload_policy_name(c->policy));
    return 0;
}

static uint64_t io_round(uint64_t b) { return MW_ALIGN_UP(b, (uint64_t)MW_IO_ALIGN); }
static uint64_t page_round(uint64_t b) { return MW_ALIGN_UP(b, (uint64_t)MW_PAGE_ALIGN); }

/* Stripe unit used for the store: whole objects up to 1 MiB, else 1 MiB units. */
uint64_t ofl_stripe_for(uint64_t obj_bytes);
uint64_t ofl_stripe_for(uint64_t obj_bytes)
{
    return obj_bytes >= (1u << 20) ? (1u << 20) : MW_ALIGN_UP(MW_MAX(obj_bytes, OFL_PAD), OFL_PAD);
}

/* Bytes the NVMe state takes with subgroups of sg elements, as the store reserves them (each
 * region of a subgroup's object padded to OFL_PAD, the object to whole stripe units, two slots;
 * streamed gradients: one object per subgroup, one slot), and the bytes that state holds. */
static void nvme_footprint(const struct mw_offload_config *c, uint64_t N, uint64_t sg, int ndirs,
                           uint64_t *padded, uint64_t *state)
{
    uint64_t nsg = (N + sg - 1) / sg, last_n = N - (nsg - 1) * sg, full = 0, last = 0, bytes = 0;
    for (int reg = 0; reg < OFL_NREGIONS; reg++) {
        uint64_t whole = ofl_region_bytes(c, (enum ofl_region)reg, N);
        if (!whole || c->place.tier[ofl_region_kind((enum ofl_region)reg)] != MW_TIER_NVME) continue;
        full += MW_ALIGN_UP(ofl_region_bytes(c, (enum ofl_region)reg, sg), OFL_PAD);
        last += MW_ALIGN_UP(ofl_region_bytes(c, (enum ofl_region)reg, last_n), OFL_PAD);
        bytes += whole;
    }
    uint64_t st = ndirs == 1 ? OFL_PAD : ofl_stripe_for(full);
    *padded = 2 * ((nsg - 1) * MW_ALIGN_UP(full, st) + MW_ALIGN_UP(last, st));
    *state = 2 * bytes;
    if (c->stream) {
        *padded += (nsg - 1) * MW_ALIGN_UP(MW_ALIGN_UP(4 * sg, OFL_PAD), st) + MW_ALIGN_UP(MW_ALIGN_UP(4 * last_n, OFL_PAD), st);
        *state += 4 * N;
    }
}

/* The subgroup-size floor. Why: every subgroup is its own store object whose regions start on
 * 4096-byte blocks (O_DIRECT), so a subgroup of a few elements costs 4 KiB per region and slot:
 * `--subgroup-size 1` turned a 36 K-parameter model's 843 KiB of state into 843 MiB on NVMe,
 * and 72,000 objects. A plan whose padding is more than the state itself AND more than
 * OFL_WASTE_MAX is refused, naming the smallest power-of-two size whose padding is at most the
 * state (512 elements for fp32 state). The absolute part leaves small models free to use any
 * size (tests cut 32 elements into subgroups of 13: 72 KiB); a model smaller than the size
 * named runs as one subgroup. */
#define OFL_WASTE_MAX ((uint64_t)64 << 20)

static uint64_t padding_of(const struct mw_offload_config *c, uint64_t N, uint64_t sg, int ndirs, uint64_t *padded,
                           uint64_t *state)
{
    nvme_footprint(c, N, sg, ndirs, padded, state);
    return *padded > *state ? *padded - *state : 0;
}

/* sg: the subgroup size after rounding to g, the moment format's block. */
static int check_subgroup_floor(const struct mw_offload_config *c, uint64_t N, uint64_t g, uint64_t sg, int ndirs)
{
    uint64_t padded, state, waste = padding_of(c, N, sg, ndirs, &padded, &state);
    if (waste <= state || waste <= OFL_WASTE_MAX) return 0;
    uint64_t whole = MW_ALIGN_UP(N, g), min = whole;
    for (uint64_t n = g; n < whole; n *= 2) {
        uint64_t pn, sn;
        if (padding_of(c, N, n, ndirs, &pn, &sn) <= sn) { min = n; break; }
    }
    char a[32], b[32], rounded[96] = "";
    if (sg != c->subgroup_size)
        snprintf(rounded, sizeof rounded, " (%llu: whole %llu-element blocks of the 8-bit moments)",
                 (unsigned long long)sg, (unsigned long long)g);
    return mw_error_set(-EINVAL, "offload: subgroup size %llu%s is too small for optimizer state on NVMe: each "
                        "subgroup's objects are padded to %llu-byte blocks (O_DIRECT alignment), so %llu parameters "
                        "in %llu subgroups would take %s on NVMe for %s of state (padding %.0fx the state; refused "
                        "above 1x and %llu MiB). Give a subgroup size (subgroup_size) of at least %llu elements%s "
                        "(the padding is then at most the state; the default, %llu, suits most models)",
                        (unsigned long long)c->subgroup_size, rounded, (unsigned long long)OFL_PAD, (unsigned long long)N,
                        (unsigned long long)((N + sg - 1) / sg), mw_fmt_bytes(a, sizeof a, padded),
                        mw_fmt_bytes(b, sizeof b, state), (double)waste / (double)state,
                        (unsigned long long)(OFL_WASTE_MAX >> 20), (unsigned long long)min,
                        min == whole ? ", the whole model in one subgroup" : "",
                        (unsigned long long)OFL_DEFAULT_SUBGROUP);
}

int mw_offload_plan_make(const struct mw_offload_registry *r, const struct mw_offload_config *c,
                         struct mw_offload_plan *p)
{
    memset(p, 0, sizeof *p);
    int rc = check_config(r, c);
    if (rc) return rc;
    uint64_t N = r->total, g = ofl_granule(c);
    p->total_elems = N;
    p->subgroup_size = MW_ALIGN_UP(MW_MIN(c->subgroup_size, MW_ALIGN_UP(N, g)), g);
    p->n_subgroups = (uint32_t)((N + p->subgroup_size - 1) / p->subgroup_size);
    p->transactional = ofl_transactional(c);
    int ndirs = 1;
    for (const char *d = p->transactional ? c->nvme_dir : ""; *d; d++) ndirs += *d == ':';
    if (p->transactional && (rc = check_subgroup_floor(c, N, g, p->subgroup_size, ndirs))) return rc;
    int slots = p->transactional ? 2 : 1;
    uint64_t last_n = N - (uint64_t)(p->n_subgroups - 1) * p->subgroup_size;

    uint64_t obj_full = 0, obj_last = 0;
    for (int reg = 0; reg < OFL_NREGIONS; reg++) {
        enum mw_offload_kind k = ofl_region_kind((enum ofl_region)reg);
        uint64_t whole = ofl_region_bytes(c, (enum ofl_region)reg, N);
        if (!whole) continue;
        int alias = reg == OFL_R_MASTER && !p->transactional && c->ext_weights && c->weights == MW_OFFLOAD_W_FP32;
        if (alias) continue; /* the master weights are the caller's fp32 weight array */
        if (c->place.tier[k] == MW_TIER_DRAM) p->kind_bytes[k][MW_TIER_DRAM] += slots * page_round(whole);
        else {
            obj_full += MW_ALIGN_UP(ofl_region_bytes(c, (enum ofl_region)reg, p->subgroup_size), OFL_PAD);
            obj_last += MW_ALIGN_UP(ofl_region_bytes(c, (enum ofl_region)reg, last_n), OFL_PAD);
        }
    }
    if (p->transactional) {
        /* as the store reserves: one directory, the object as it is (4 KiB-padded); several,
         * whole stripe units */
        uint64_t st = ndirs == 1 ? OFL_PAD : ofl_stripe_for(obj_full);
        uint64_t full = MW_ALIGN_UP(obj_full, st), last = MW_ALIGN_UP(obj_last, st);
        uint64_t nv = 2 * ((uint64_t)(p->n_subgroups - 1) * full + last);
        /* split the NVMe bytes between the kinds in proportion (for the table only) */
        uint64_t mb = MW_ALIGN_UP(ofl_region_bytes(c, OFL_R_MASTER, p->subgroup_size), OFL_PAD);
        if (c->place.tier[MW_OFFLOAD_MASTER] == MW_TIER_NVME && c->place.tier[MW_OFFLOAD_MOMENTS] == MW_TIER_NVME) {
            uint64_t m_part = (uint64_t)((double)nv * (double)mb / (double)obj_full);
            p->kind_bytes[MW_OFFLOAD_MASTER][MW_TIER_NVME] = m_part;
            p->kind_bytes[MW_OFFLOAD_MOMENTS][MW_TIER_NVME] = nv - m_part;
        } else if (c->place.tier[MW_OFFLOAD_MASTER] == MW_TIER_NVME) {
            p->kind_bytes[MW_OFFLOAD_MASTER][MW_TIER_NVME] = nv;
        } else {
            p->kind_bytes[MW_OFFLOAD_MOMENTS][MW_TIER_NVME] = nv;
        }
        if (c->stream) { /* one gradient object per subgroup (one slot: not committed state) */
            uint64_t gf = MW_ALIGN_UP(MW_ALIGN_UP(4 * p->subgroup_size, OFL_PAD), st);
            uint64_t gl = MW_ALIGN_UP(MW_ALIGN_UP(4 * last_n, OFL_PAD), st);
            p->kind_bytes[MW_OFFLOAD_GRADS][MW_TIER_NVME] = (uint64_t)(p->n_subgroups - 1) * gf + gl;
        }
        struct ofl_layout L;
        ofl_layout_make(c, p->subgroup_size, &L);
        p->staging_bytes = (uint64_t)c->buffer_count * io_round(L.total);
    }
    int own_grads = !(c->ext_grads && c->ext_grads_accumulate);
    if (own_grads) p->kind_bytes[MW_OFFLOAD_GRADS][c->place.tier[MW_OFFLOAD_GRADS]] = page_round(4 * N);
    if (!c->ext_weights)
        p->kind_bytes[MW_OFFLOAD_WEIGHTS][c->place.tier[MW_OFFLOAD_WEIGHTS]] = page_round(ofl_wbytes(c->weights) * N);
    if (c->use_device) p->device_arena_bytes = 2 * page_round(ofl_dev_job_bytes(c, p->subgroup_size));

    for (int k = 0; k < MW_OFFLOAD_NKINDS; k++)
        for (int t = 0; t < MW_TIER_COUNT; t++) p->tier_bytes[t] += p->kind_bytes[k][t];
    p->tier_bytes[MW_TIER_DRAM] += p->staging_bytes;
    if (c->scratch_bytes && p->transactional) { /* one store object of whole stripes */
        p->scratch_bytes = MW_ALIGN_UP(c->scratch_bytes, ofl_stripe_for(c->scratch_bytes));
        p->tier_bytes[MW_TIER_NVME] += p->scratch_bytes;
    }
    p->tier_bytes[MW_TIER_DEVICE] += p->device_arena_bytes;

    uint64_t real[MW_TIER_COUNT] = {ofl_dram_available(), p->transactional ? ofl_dir_available(c->nvme_dir) : 0, 0};
    for (int t = 0; t < MW_TIER_COUNT; t++) {
        uint64_t cap = c->budget[t];
        if (real[t] && (!cap || real[t] < cap)) cap = real[t];
        p->tier_capacity[t] = cap;
    }
    for (int t = 0; t < MW_TIER_COUNT; t++) {
        if (!p->tier_capacity[t] || p->tier_bytes[t] <= p->tier_capacity[t]) continue;
        char need[32], have[32], buf[512];
        mw_offload_plan_format(p, buf, sizeof buf);
        int is_budget = c->budget[t] && c->budget[t] == p->tier_capacity[t];
        return mw_error_set(MW_EBUDGET, "offload plan refused: the %s tier needs %s but %s %s is available%s; "
                            "the plan was:\n%s", tier_names[t], mw_fmt_bytes(need, sizeof need, p->tier_bytes[t]),
                            is_budget ? "its budget allows only" : "only",
                            mw_fmt_bytes(have, sizeof have, p->tier_capacity[t]),
                            is_budget ? "" : (t == MW_TIER_NVME ? " (free space in the NVMe directory)"
                                                                  : " (MemAvailable)"), buf);
    }
    return 0;
}

int mw_offload_plan_format(const struct mw_offload_plan *p, char *buf, size_t n)
{
    size_t used = 0;
    char b[32];
    used += (size_t)snprintf(buf + used, n - MW_MIN(used, n), "  %llu parameters in %u subgroups of %llu elements%s\n",
                             (unsigned long long)p->total_elems, p->n_subgroups,
                             (unsigned long long)p->subgroup_size,
                             p->transactional ? "; optimizer state in two slots (atomic steps)" : "");
    for (int t = 0; t < MW_TIER_COUNT && used < n; t++) {
        if (!p->tier_bytes[t] && !p->tier_capacity[t]) continue;
        used += (size_t)snprintf(buf + used, n - used, "  %-6s %10s", tier_names[t], mw_fmt_bytes(b, sizeof b, p->tier_bytes[t]));
        if (used >= n) break;
        const char *sep = " (";
        for (int k = 0; k < MW_OFFLOAD_NKINDS && used < n; k++) {
            if (!p->kind_bytes[k][t]) continue;
            used += (size_t)snprintf(buf + used, n - used, "%s%s %s", sep, kind_names[k], mw_fmt_bytes(b, sizeof b, p->kind_bytes[k][t]));
            sep = ", ";
        }
        if (used < n && t == MW_TIER_DRAM && p->staging_bytes) {
            used += (size_t)snprintf(buf + used, n - used, "%sstaging %s", sep, mw_fmt_bytes(b, sizeof b, p->staging_bytes));
            sep = ", ";
        }
        if (used < n && t == MW_TIER_DEVICE && p->device_arena_bytes) {
            used += (size_t)snprintf(buf + used, n - used, "%sarena %s", sep, mw_fmt_bytes(b, sizeof b, p->device_arena_bytes));
            sep = ", ";
        }
        if (used < n && sep[0] == ',') used += (size_t)snprintf(buf + used, n - used, ")");
        if (used < n) {
            if (p->tier_capacity[t])
                used += (size_t)snprintf(buf + used, n - used, " of %s available\n", mw_fmt_bytes(b, sizeof b, p->tier_capacity[t]));
            else used += (size_t)snprintf(buf + used, n - used, "\n");
        }
    }
    return 0;
}
