/* format.h - structured output: a JSON schema compiled to a byte-level
 * pushdown automaton, and the token mask it puts on every sampled row.
 *
 * The text a request may produce is prefix, then one JSON value the schema
 * accepts, then suffix, then the end of generation (an end-of-generation
 * token). The mask of a row is a pure function of the tokens generated
 * before it, so a row inside a verify block is masked exactly as the same
 * row in classic decode: speculation stays exact, and a draft that breaks
 * the format is simply not what the masked target picks.
 *
 * The schema subset (docs/server.md): type (or a list of types), properties
 * with required (keys come in the schema's order; optional ones may be
 * left out), additionalProperties (false; or a schema when there are no
 * properties), items, minItems, maxItems, minLength, maxLength, enum, const,
 * anyOf, $ref into $defs / definitions, and the annotations title,
 * description, default, examples, $schema, $id, $comment. Anything else
 * (pattern, format, minimum, oneOf, ...) is refused by name: ignoring it
 * would produce output the caller's validator rejects.
 *
 * Whitespace between JSON tokens is one space, or a newline and up to
 * DFL_FMT_MAX_INDENT spaces or tabs: room for pretty printing, none for
 * a model's runs of blank lines. */
#ifndef DFL_FORMAT_H
#define DFL_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "dflash.h"

enum {
    DFL_FMT_MAX_NODES = 4096,    /* schema nodes after $ref resolution */
    DFL_FMT_MAX_LITS = 64,       /* values of one enum, properties of one object */
    DFL_FMT_MAX_LIT = 4096,      /* bytes of one literal (a key or an enum value as JSON) */
    DFL_FMT_MAX_ALT = 16,        /* anyOf branches alive at once (the schema's width) */
    DFL_FMT_MAX_DEPTH = 32,      /* nesting of objects, arrays and values */
    DFL_FMT_MAX_INDENT = 20,     /* spaces / tabs after a newline between JSON tokens */
    DFL_FMT_MAX_NUM = 32,        /* bytes of one number */
    DFL_FMT_MAX_TOKEN = 64,      /* longer tokens are never sampled under a format */
    DFL_FMT_MAX_AFFIX = 256,     /* bytes of the prefix / suffix */
    DFL_FMT_END = 256,           /* the end of generation, as a byte past 255 */
};

/* The vocabulary as the mask walks it (built once per engine). */
typedef struct dfl_fmt_vocab {
    int n_vocab;
    const char **bytes;   /* (n_vocab) token text bytes (owned by the tokenizer) */
    int *len;             /* (n_vocab) */
    uint8_t *kind;        /* (n_vocab) DFL_FMT_TOK_* */
    int32_t *ord;         /* (n_ord) text tokens sorted by their bytes */
    uint8_t *lcp;         /* (n_ord) common prefix with the previous one in ord */
    int n_ord;
    /* Inside a JSON string most tokens are plain text: no quote, backslash or
     * control byte, UTF-8 from a character boundary. Whether one fits depends
     * only on how many characters it adds, so the mask walks only the rest. */
    uint8_t *nchars;      /* (n_vocab) characters a plain token adds; 0: not plain */
    int32_t *plain;       /* (n_plain) the plain text tokens */
    int n_plain;
    int32_t *ord2;        /* (n_ord2) the other text tokens, sorted */
    uint8_t *lcp2;        /* (n_ord2) */
    int n_ord2;
    int32_t *special;     /* (n_special) control tokens that are not end of generation */
    int n_special;
    int32_t *eog;         /* (n_eog) end-of-generation tokens */
    int n_eog;
} dfl_fmt_vocab;

enum { DFL_FMT_TOK_TEXT = 0, DFL_FMT_TOK_SPECIAL, DFL_FMT_TOK_EOG, DFL_FMT_TOK_NONE };

/* Takes ownership of bytes/len/kind (malloc'd, n entries) and sorts. */
dfl_fmt_vocab *dfl_fmt_vocab_new(int n, const char **bytes, int *len, uint8_t *kind);
void dfl_fmt_vocab_free(dfl_fmt_vocab *v);

/* dfl_format (dflash.h) is the compiled schema; schema NULL: any JSON object. */
int dfl_fmt_compile(const char *schema, const char *prefix, const char *suffix,
                    const dfl_fmt_vocab *v, dfl_format **out, dfl_error *err);
void dfl_fmt_free(dfl_format *f);
/* Whether text[0..n) is a whole document of the format. */
int dfl_fmt_accepts(const dfl_format *f, const char *text, size_t n);

/* One generation's view: the state after the tokens generated so far. */
typedef struct dfl_fmt_run dfl_fmt_run;
/* origin: the position of the first generated token (the prompt's length). */
dfl_fmt_run *dfl_fmt_run_new(const dfl_format *f, int origin);
void dfl_fmt_run_free(dfl_fmt_run *r);
/* Sets row[i] = -inf for every token that cannot come next after the
 * history a[0..n_a) + b[0..n_b). Rows before origin are left alone. When
 * nothing can follow (a vocabulary that cannot spell the next byte), only
 * the end-of-generation tokens stay. */
void dfl_fmt_mask(dfl_fmt_run *r, const int32_t *a, int n_a, const int32_t *b, int n_b,
                  float *row);

#endif
