/* cmd_bench_adam.c — placeholder until the optimizer issue (#7) lands: says so and exits 1. */
#include "cli/commands.h"
#include <stdio.h>

int mw_cmd_bench_adam(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "memwall: 'bench adam' is not implemented yet (issue #7)\n");
    return 1;
}
