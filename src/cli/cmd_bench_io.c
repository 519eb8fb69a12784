/* cmd_bench_io.c — placeholder until the foundation issue (#2) lands: says so and exits 1. */
#include "cli/commands.h"
#include <stdio.h>

int mw_cmd_bench_io(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "memwall: 'bench io' is not implemented yet (issue #2)\n");
    return 1;
}
