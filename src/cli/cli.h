/* cli.h - subcommands of the dflash program. Each knows only dflash.h. */
#ifndef DFL_CLI_H
#define DFL_CLI_H

#include "dflash.h"

int cmd_generate(int argc, char **argv);
int cmd_probe(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_capture(int argc, char **argv);
int cmd_dump(int argc, char **argv);

/* Shared helpers (src/cli/common.c). */
/* A progress callback that draws a bar on a terminal, plain lines otherwise. */
void cli_progress(void *ud, const char *what, uint64_t done, uint64_t total);
/* The built-in default model's paths (models/ in the source tree, or next to
 * the binary); NULL when absent. */
const char *cli_default_model(void);
const char *cli_default_draft(void);
/* Parses an int / float flag value or exits with a message naming the flag. */
int cli_int(const char *flag, const char *v, long lo, long hi);
double cli_num(const char *flag, const char *v, double lo, double hi);
/* Reads --ids "1,2,3" into ids; returns the count or exits with a message. */
int cli_ids(const char *flag, const char *v, int32_t *ids, int cap);

#endif
