/* pending.c - subcommands not built yet. Each owner deletes its line here when
 * its own src/cli/cmd_*.c lands. */
#include <stdio.h>

#include "cli.h"

static int pending(const char *name) {
    fprintf(stderr, "dflash %s: not available in this build yet\n", name);
    return 2;
}

int cmd_bench(int argc, char **argv) { (void)argc; (void)argv; return pending("bench"); }
