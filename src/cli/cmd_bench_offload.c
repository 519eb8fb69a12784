/* cmd_bench_offload.c — placeholder until the offload issue (#6) lands: says so and exits 1. */
#include "cli/commands.h"
#include <stdio.h>

int mw_cmd_bench_offload(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "memwall: 'bench offload' is not implemented yet (issue #6)\n");
    return 1;
}
