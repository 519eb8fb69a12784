/*
 * fuzz_trace.c — a Chrome/Perfetto JSON trace through the report: the streaming scanner, the
 * event loader (range checks of every number), the analysis, and the text, HTML and CSV output;
 * and the same file as the earlier segment a resumed run's trace continues (mw_trace_continue),
 * written out again with it.
 */
#include "fuzz.h"
#include "memwall/report.h"
#include "memwall/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fz_write(data, size, "trace.json");
    struct mw_report *r = NULL;
    if (mw_report_load(&r, path, NULL) == 0) {
        FILE *null = fopen("/dev/null", "w");
        if (null) {
            (void)mw_report_write_text(r, null);
            fclose(null);
        }
        char out[400];
        snprintf(out, sizeof out, "%s/report.html", fz_scratch());
        (void)mw_report_write_html(r, out);
        snprintf(out, sizeof out, "%s/csv", fz_scratch());
        (void)mw_report_write_csv(r, out);
        struct mw_report_rank row;
        mw_report_rank_row(r, 0, &row);
        mw_report_free(r);
    }
    struct mw_trace *tr = NULL;
    if (mw_trace_init(&tr, 0) == 0) {
        if (mw_trace_continue(tr, path) == 0) {
            char out[400];
            snprintf(out, sizeof out, "%s/continued.json", fz_scratch());
            (void)mw_trace_write(tr, out);
        }
        mw_trace_free(tr);
    }
    return 0;
}
