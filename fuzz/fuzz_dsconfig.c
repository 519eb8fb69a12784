/*
 * fuzz_dsconfig.c — a DeepSpeed config (mw_ds_config_load / _parse, behind `memwall train
 * --ds-config`): never undefined behaviour, a refusal empties the result, and what is accepted is
 * well formed: every setting names an option, a value and its key, no option twice, and the file
 * read from disk gives the same settings as the same bytes parsed in memory. The first byte picks
 * the data-parallel world size (1..8), which the batch keys depend on.
 */
#include "fuzz.h"
#include "cli/train_ds_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int world = size ? 1 + data[0] % 8 : 1;
    const char *path = fz_write(data, size, "ds_config.json");
    struct mw_ds_config a, b;
    int ra = mw_ds_config_load(path, world, &a);
    int rb = mw_ds_config_parse((const char *)data, size, path, world, &b);
    if ((ra == 0) != (rb == 0)) abort(); /* the file and the bytes say the same */
    if (ra != 0) {
        if (a.n_settings || a.settings || b.n_settings || b.settings) abort(); /* refused: nothing kept */
        if (!mw_error_msg()[0]) abort();                                       /* with a message */
    } else {
        if (a.n_settings != b.n_settings) abort();
        for (int i = 0; i < a.n_settings; i++) {
            const struct mw_ds_setting *s = &a.settings[i];
            if (!s->option || !s->value || !s->key || strcmp(s->value, b.settings[i].value)) abort();
            if (mw_ds_config_find(&a, s->option) != s) abort(); /* each option at most once */
        }
        for (int i = 0; i < a.n_warnings; i++)
            if (!a.warnings[i]) abort();
    }
    mw_ds_config_free(&a);
    mw_ds_config_free(&b);
    return 0;
}
