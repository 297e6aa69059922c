/* cli.h - subcommands of the dflash program. Each knows only dflash.h. */
#ifndef DFL_CLI_H
#define DFL_CLI_H

#include "dflash.h"

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);   /* generate --conversation */
int cmd_probe(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_capture(int argc, char **argv);
int cmd_dump(int argc, char **argv);
int cmd_template(int argc, char **argv);
/* --chat-template-file: the file's text (exits with a message when unreadable); never freed. */
const char *cli_chat_template_file(const char *path);
/* A file's whole text (exits with a message when unreadable); never freed. */
const char *cli_file_text(const char *path);

/* Shared helpers (src/cli/common.c). */
/* A progress callback that draws a bar on a terminal, plain lines otherwise. */
void cli_progress(void *ud, const char *what, uint64_t done, uint64_t total);
/* The built-in default model's paths (models/ in the source tree, or next to
 * the binary); NULL when absent. */
const char *cli_default_model(void);
const char *cli_default_draft(void);
/* The value after flag argv[*i] (advancing *i), or exits with "dflash CMD:
 * FLAG needs a value" (argv[0] is the subcommand's name). */
const char *cli_need(int argc, char **argv, int *i);
/* Parses an int / float flag value or exits with a message naming the flag. */
int cli_int(const char *flag, const char *v, long lo, long hi);
double cli_num(const char *flag, const char *v, double lo, double hi);
/* A decimal unsigned 64-bit value (seeds): anything else is an error, never 0. */
uint64_t cli_u64(const char *flag, const char *v);
/* The load summary paragraph on stderr (template_src: where a given template came from). */
void cli_load_summary(const char *cmd, const dfl_engine *e, const char *template_src);
/* The engine options users set through the environment: DFLASH_ALLOW_INEXACT=1
 * (allow_inexact), DFLASH_DRAFT_WINDOW=W (draft_window) and
 * DFLASH_ISA=generic|avx2|avx512|neon (isa, the kernel path). */
void cli_engine_env(dfl_engine_opts *o);
/* The engine flags generate, probe and bench share (-m/--model, --draft,
 * --draft-mtp, --dtype, --kv-type, -c/--ctx-size, -t/--threads): 1 when argv[*i]
 * is one (its value taken), else 0. */
int cli_engine_flag(dfl_engine_opts *o, int argc, char **argv, int *i);
/* After parsing: --draft none (sets *no_draft), and the built-in pair when no
 * --model was given (exits with a message when it is absent). */
void cli_engine_model(const char *cmd, dfl_engine_opts *o, int *no_draft);
/* The largest file the CLI reads whole (prompts, corpora, templates, JSON). */
enum { CLI_MAX_FILE = 1 << 30 };
/* The CLI's one way to allocate: n elements of sz bytes, zeroed; exits with a
 * message when memory runs out (never returns NULL). */
void *cli_alloc(size_t n, size_t sz);
/* The CLI's one way to grow an array: p (*cap elements of sz bytes) grown to
 * hold need elements, *cap doubling; exits with a message when memory runs out. */
void *cli_grow(void *p, size_t *cap, size_t need, size_t sz);
/* A whole file ("-": stdin), NUL-terminated; *len its bytes (len may be NULL).
 * Exits with "dflash CMD: cannot open WHAT PATH: ..." (cmd NULL: "dflash: ...") when
 * it cannot be read,
 * or is larger than CLI_MAX_FILE. */
char *cli_read_file(const char *cmd, const char *what, const char *path, size_t *len);
/* Committed ids of a dfl_generate run (cli_on_id is its callback): the first
 * cap are kept in ids; with stop set, generation stops once cap are in. */
typedef struct cli_idbuf {
    int32_t *ids;
    int n, cap;
    int stop;
} cli_idbuf;
int cli_on_id(void *ud, const dfl_token_info *t);
/* Reads --ids "1,2,3" into ids; returns the count or exits with a message. */
int cli_ids(const char *flag, const char *v, int32_t *ids, int cap);

#endif
