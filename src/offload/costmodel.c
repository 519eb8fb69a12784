/*
 * costmodel.c — the calibration profile and the per-subgroup time predictions.
 *
 * Why a measured profile rather than constants: whether a subgroup's update is faster on the
 * CPU or on the accelerator depends on this machine's memory bandwidth (the CPU AdamW rate),
 * the accelerator's rate and, above all, the host<->device link, which must carry the state
 * both ways. `memwall bench offload --calibrate FILE` measures the three and writes them as
 * JSON; the engine predicts with them and traces each prediction beside the measured time,
 * so a wrong profile shows up in the trace.
 *
 *   cpu:    n / cpu_params_per_s
 *   device: xfer_bytes / link_bytes_per_s + n / dev_params_per_s + dev_latency_s
 * (the device copy in and out and its compute are serialised per subgroup; the overlap
 * between subgroups is handled by the policy's busy-until clocks, see policy.c).
 */
#include "offload/internal.h"
#include "memwall/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mw_offload_profile_default(struct mw_offload_profile *p)
{
    memset(p, 0, sizeof *p);
    p->cpu_params_per_s = 1.0e9;    /* ~28 GB/s of fp32 AdamW traffic */
    p->dev_params_per_s = 20.0e9;   /* a GPU's AdamW at HBM speed */
    p->link_bytes_per_s = 12.0e9;   /* PCIe 4.0 x16, each direction, achieved */
    p->dev_latency_s = 20e-6;
    p->nvme_read_bytes_per_s = 2.5e9;
    p->nvme_write_bytes_per_s = 2.5e9;
}

double mw_offload_predict_cpu_s(const struct mw_offload_profile *p, uint64_t n)
{
    return p->cpu_params_per_s > 0 ? (double)n / p->cpu_params_per_s : 0;
}

double mw_offload_predict_dev_s(const struct mw_offload_profile *p, uint64_t n, uint64_t xfer_bytes)
{
    double t = p->dev_latency_s;
    if (p->link_bytes_per_s > 0) t += (double)xfer_bytes / p->link_bytes_per_s;
    if (p->dev_params_per_s > 0) t += (double)n / p->dev_params_per_s;
    return t;
}

static const struct { const char *key; size_t off; } fields[] = {
    {"cpu_params_per_s", offsetof(struct mw_offload_profile, cpu_params_per_s)},
    {"dev_params_per_s", offsetof(struct mw_offload_profile, dev_params_per_s)},
    {"link_bytes_per_s", offsetof(struct mw_offload_profile, link_bytes_per_s)},
    {"dev_latency_s", offsetof(struct mw_offload_profile, dev_latency_s)},
    {"nvme_read_bytes_per_s", offsetof(struct mw_offload_profile, nvme_read_bytes_per_s)},
    {"nvme_write_bytes_per_s", offsetof(struct mw_offload_profile, nvme_write_bytes_per_s)},
};
#define NFIELDS (sizeof fields / sizeof fields[0])

int mw_offload_profile_load(const char *path, struct mw_offload_profile *p)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mw_error_set(-errno, "offload profile %s: cannot open", path);
    char *text = NULL;
    long len = 0;
    int rc = 0;
    if (fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || len > (1 << 20) || fseek(f, 0, SEEK_SET)) {
        rc = mw_error_set(MW_EFORMAT, "offload profile %s: unreadable or larger than 1 MiB", path);
        goto out;
    }
    text = malloc((size_t)len + 1);
    if (!text) { rc = mw_error_set(-ENOMEM, "offload profile %s: out of memory", path); goto out; }
    if (fread(text, 1, (size_t)len, f) != (size_t)len) {
        rc = mw_error_set(-EIO, "offload profile %s: short read", path);
        goto out;
    }
    text[len] = 0;
    cJSON *j = cJSON_Parse(text);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        rc = mw_error_set(MW_EFORMAT, "offload profile %s: not a JSON object", path);
        goto out;
    }
    struct mw_offload_profile q;
    mw_offload_profile_default(&q);
    for (size_t i = 0; i < NFIELDS; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(j, fields[i].key);
        if (!v) continue;
        /* Finite and bounded: a rate of 1e999 (inf) or NaN would reach the policy's arithmetic. */
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1e18)) {
            cJSON_Delete(j);
            rc = mw_error_set(MW_EFORMAT, "offload profile %s: '%s' must be a number in [0, 1e18]", path, fields[i].key);
            goto out;
        }
        *(double *)((char *)&q + fields[i].off) = v->valuedouble;
    }
    cJSON_Delete(j);
    *p = q;
out:
    free(text);
    fclose(f);
    return rc;
}

int mw_offload_profile_save(const char *path, const struct mw_offload_profile *p)
{
    struct mw_atomic_file af; /* a profile is read by later runs: never leave half of one */
    int rc = mw_atomic_open(&af, path);
    if (rc) return mw_error_prepend(rc, "offload profile: ");
    FILE *f = af.f;
    fprintf(f, "{\n");
    for (size_t i = 0; i < NFIELDS; i++)
        fprintf(f, "  \"%s\": %.6g%s\n", fields[i].key, *(const double *)((const char *)p + fields[i].off),
                i + 1 < NFIELDS ? "," : "");
    fprintf(f, "}\n");
    rc = mw_atomic_commit(&af);
    return rc ? mw_error_prepend(rc, "offload profile: ") : 0;
}
