/* cmd_plan.c — placeholder until the planner issue (#4) lands: says so and exits 1. */
#include "cli/commands.h"
#include <stdio.h>

int mw_cmd_plan(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "memwall: 'plan' is not implemented yet (issue #4)\n");
    return 1;
}
