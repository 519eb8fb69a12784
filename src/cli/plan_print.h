/*
 * plan_print.h — the human table and the JSON object of `memwall plan`.
 */
#ifndef MEMWALL_CLI_PLAN_PRINT_H
#define MEMWALL_CLI_PLAN_PRINT_H

#include "memwall/plan.h"
#include <stdio.h>

/* Another tool's estimate, printed beside the plan ("none": not requested). */
struct mw_plan_estimate {
    const char *name;
    double gpu_bytes;  /* per GPU */
    double cpu_bytes;  /* per node (DeepSpeed's "per CPU") */
    int ds_stage;           /* 2 or 3: a DeepSpeed estimator, whose whole table is printed too; else 0 */
    struct mw_ds_input ds;  /* its inputs (with the layout's offload and zero_init) */
};

void mw_plan_print_table(FILE *f, const struct mw_model *m, const struct mw_layout *l,
                         const struct mw_hw *hw, const struct mw_plan_result *r,
                         const struct mw_plan_estimate *e);
void mw_plan_print_json(FILE *f, const struct mw_model *m, const struct mw_layout *l,
                        const struct mw_hw *hw, const struct mw_plan_result *r,
                        const struct mw_plan_estimate *e);
void mw_plan_print_search(FILE *f, const struct mw_model *m, const struct mw_hw *hw,
                          const struct mw_search_hit *hits, int n, int json);

#endif
