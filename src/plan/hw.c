/*
 * hw.c — built-in hardware profiles, and the host's own figures from a calibration file.
 *
 * GPU figures are the vendors' dense bf16 peaks and memory sizes; the bandwidths are what
 * collectives and copies reach in practice (NCCL bus bandwidth, not link peak), rounded.
 * The host side (DRAM, CPU AdamW rate, NVMe) describes a typical server of that GPU's
 * generation (DGX-class for the datacenter parts) and is the part most worth replacing with
 * measured figures: `--host-profile FILE` (keys in docs/plan.md) does that.
 */
#include "memwall/plan.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GiB (1ull << 30)
#define TB 1000000000000ull

static const struct mw_hw profiles[] = {
    /* name        peak     eff   gpu_mem      gpn intra   inter  pcie   host       adam  nvme r/w      nvme */
    {"a100-40gb", 312e12, 0.60, 40 * GiB, 8, 200e9, 25e9, 25e9, 1024 * GiB, 5e9, 25e9, 12e9, 15 * TB},
    {"a100-80gb", 312e12, 0.60, 80 * GiB, 8, 200e9, 25e9, 25e9, 2048 * GiB, 5e9, 25e9, 12e9, 30 * TB},
    {"h100", 989e12, 0.55, 80 * GiB, 8, 360e9, 50e9, 50e9, 2048 * GiB, 8e9, 50e9, 25e9, 30 * TB},
    {"h200", 989e12, 0.55, 143771ull << 20, 8, 360e9, 50e9, 50e9, 2048 * GiB, 8e9, 50e9, 25e9, 30 * TB},
    /* GH200: one superchip per node; the Grace CPU reaches the GPU over NVLink-C2C. */
    {"gh200", 989e12, 0.55, 96 * GiB, 1, 360e9, 25e9, 400e9, 480 * GiB, 3e9, 12e9, 6e9, 4 * TB},
    {"rtx4090", 165e12, 0.55, 24 * GiB, 1, 20e9, 10e9, 25e9, 128 * GiB, 1.5e9, 7e9, 5e9, 2 * TB},
};
#define N_HW (sizeof profiles / sizeof profiles[0])

static const char *names[N_HW + 1];

const char *const *mw_hw_names(void)
{
    if (!names[0])
        for (size_t i = 0; i < N_HW; i++) names[i] = profiles[i].name;
    return names;
}

const struct mw_hw *mw_hw_lookup(const char *name)
{
    for (size_t i = 0; i < N_HW; i++)
        if (!strcasecmp(profiles[i].name, name)) return &profiles[i];
    /* Short forms: a100 = a100-80gb, 4090 = rtx4090. */
    if (!strcasecmp(name, "a100")) return &profiles[1];
    if (!strcasecmp(name, "4090")) return &profiles[5];
    return NULL;
}

static int get_num(const cJSON *o, const char *key, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it) return 0;
    /* Bounded before any use: a byte count of 1e300 cast to uint64_t is undefined behaviour. */
    if (!cJSON_IsNumber(it) || !(it->valuedouble > 0 && it->valuedouble <= 1e18))
        return mw_error_set(MW_EFORMAT, "host profile: '%s' must be a positive number up to 1e18", key);
    *v = it->valuedouble;
    return 1;
}

int mw_hw_load_host_profile(const char *path, struct mw_hw *hw)
{
    char *buf = NULL;
    cJSON *root = NULL;
    int err = mw_read_small_file(path, "host profile", 1u << 20, &buf, NULL);
    if (err) return err;
    root = cJSON_Parse(buf);
    if (!cJSON_IsObject(root)) {
        err = mw_error_set(MW_EFORMAT, "host profile '%s' is not a JSON object", path);
        goto err;
    }
    double v;
    int r;
    if ((r = get_num(root, "cpu_adam_params_per_s", &v)) < 0) { err = r; goto err; } else if (r) hw->cpu_adam = v;
    if ((r = get_num(root, "nvme_read_bytes_per_s", &v)) < 0) { err = r; goto err; } else if (r) hw->nvme_read = v;
    if ((r = get_num(root, "nvme_write_bytes_per_s", &v)) < 0) { err = r; goto err; } else if (r) hw->nvme_write = v;
    if ((r = get_num(root, "pcie_bytes_per_s", &v)) < 0) { err = r; goto err; } else if (r) hw->pcie_bw = v;
    if ((r = get_num(root, "host_mem_bytes", &v)) < 0) { err = r; goto err; } else if (r) hw->host_mem = (uint64_t)v;
    if ((r = get_num(root, "nvme_bytes", &v)) < 0) { err = r; goto err; } else if (r) hw->nvme_bytes = (uint64_t)v;
err:
    cJSON_Delete(root);
    free(buf);
    return err;
}
