/*
 * fuzz_size.c — the command line's size parser (mw_parse_size, behind every MW_OPT_SIZE
 * option): never undefined behaviour, and what it accepts is plain digits with a known suffix.
 */
#include "fuzz.h"

#include <ctype.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fz_cstr(data, size);
    uint64_t v = 0;
    if (mw_parse_size(s, &v) == 0) {
        const char *q = s;
        while (isspace((unsigned char)*q)) q++;
        if (!isdigit((unsigned char)*q) && *q != '.') abort();
        /* Without a suffix the value is the number itself, rounded. */
        if (strspn(q, "0123456789") == strlen(q) && strlen(q) < 16 && v != strtoull(q, NULL, 10)) abort();
    }
    free(s);
    return 0;
}
