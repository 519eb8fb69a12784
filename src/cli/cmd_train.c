/* cmd_train.c — placeholder until the GPT training issue (#8) lands: says so and exits 1. */
#include "cli/commands.h"
#include <stdio.h>

int mw_cmd_train(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "memwall: 'train' is not implemented yet (issue #8)\n");
    return 1;
}
