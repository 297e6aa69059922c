/* jinja.h - a sandboxed interpreter for the Jinja subset of chat templates. */
#ifndef DFLASH_TOKENIZER_JINJA_H
#define DFLASH_TOKENIZER_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "dflash.h"

/* One variable: name = JSON value, or (name NULL) every member of a JSON
 * object. Later entries override earlier ones. */
typedef struct dfl_jinja_var {
    const char *name;
    const char *json;
} dfl_jinja_var;

typedef struct dfl_jinja_limits {
    size_t max_output;   /* bytes of any one string, the output included; 0: 32 MiB */
    size_t max_memory;   /* bytes of the arena everything lives in; 0: 256 MiB */
    uint64_t max_steps;  /* evaluation steps; 0: 50 million */
    int64_t now;         /* strftime_now's clock (unix seconds); 0: the real one */
    int chat;            /* messages get transformers' reasoning aliases */
} dfl_jinja_limits;

/* Renders tmpl (n bytes) as jinja2's sandboxed environment does with
 * transformers' settings. On success *out is a malloc'd NUL-terminated text
 * of *out_len bytes and 0 is returned; on failure a DFL_E* code and err says
 * what, where ("line L col C"). A template's raise_exception(msg) fails with
 * err->msg exactly msg and code DFL_EARG. */
int dfl_jinja_render(const char *tmpl, size_t n, const dfl_jinja_var *vars, int n_vars,
                     const dfl_jinja_limits *lim, char **out, size_t *out_len, dfl_error *err);

#endif
