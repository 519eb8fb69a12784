/*
 * fuzz_runspec.c — the run's settings a commit record or checkpoint keeps (src/cli/train_spec.c:
 * `memwall train --resume` applies them through the option table): hostile text must end in an
 * applied table, a refusal (exit 1 or 2 and a message) or a listed override, never a crash. The
 * table here has each kind of option memwall train has (paths, a path list, numbers, a size, a
 * choice, a flag), one of them given on the "command line" so that the comparison runs too.
 */
#include "fuzz.h"
#include "cli/opts.h"
#include "cli/train_spec.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const tiers[] = {"dram", "nvme", NULL};
    const char *out_dir = NULL, *log = NULL, *nvme = NULL, *tier = "dram", *data_path = NULL;
    int64_t steps = 10, seed = 1, threads = 2;
    double lr = 1e-3;
    uint64_t sg = 0;
    int recompute = 0;
    const struct mw_opt opts[] = {
        {"out-dir", MW_OPT_STRING, &out_dir, "DIR", "", 0, 0, NULL},
        {"log-json", MW_OPT_STRING, &log, "FILE", "", 0, 0, NULL},
        {"nvme-dir", MW_OPT_STRING, &nvme, "DIR", "", 0, 0, NULL},
        {"data", MW_OPT_STRING, &data_path, "FILE", "", 0, 0, NULL},
        {"optimizer-tier", MW_OPT_CHOICE, &tier, NULL, "", 0, 0, tiers},
        {"steps", MW_OPT_INT, &steps, "N", "", 0, 1e12, NULL},
        {"seed", MW_OPT_INT, &seed, "N", "", 0, 9.2e18, NULL},
        {"threads", MW_OPT_INT, &threads, "N", "", 0, 4096, NULL},
        {"lr", MW_OPT_DOUBLE, &lr, "X", "", 0, 10, NULL},
        {"subgroup-size", MW_OPT_SIZE, &sg, "N", "", 1, 1e15, NULL},
        {"recompute", MW_OPT_FLAG, &recompute, NULL, "", 0, 0, NULL},
    };
    const struct mw_cmd_spec spec = {"train", "", "", opts, MW_NOPTS(opts), 0, 0};
    char *argv[] = {"--threads", "1"};
    if (mw_opts_parse(&spec, 2, argv, NULL, NULL) != MW_OPTS_OK) abort();
    char *text = malloc(size + 1); /* a record's settings hold no NUL (resume.c refuses them) */
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    struct train_spec_applied ap;
    static int quiet;
    if (!quiet++ && !freopen("/dev/null", "w", stdout)) abort(); /* the listed overrides */
    int from_record = size && (data[0] & 1);
    (void)train_spec_apply(&spec, text, from_record ? "/tmp/run/nvme" : NULL,
                           from_record ? NULL : "/tmp/run/ckpt_00000005.mwck", 5, &ap);
    train_spec_applied_free(&ap);
    free(text);
    return 0;
}
