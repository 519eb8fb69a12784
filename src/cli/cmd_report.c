/* cmd_report.c — placeholder until the report issue (#3) lands: says so and exits 1. */
#include "cli/commands.h"
#include <stdio.h>

int mw_cmd_report(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "memwall: 'report' is not implemented yet (issue #3)\n");
    return 1;
}
