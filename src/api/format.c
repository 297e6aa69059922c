/* format.c - dfl_format_*: structured output for an engine's vocabulary
 * (the automaton and the masks are in src/sample/format.c). */
#include <stdlib.h>

#include "engine.h"
#include "sample/format.h"

/* Every id of the model's rows, with its text bytes and what it is; ids the
 * tokenizer does not know (padded embedding rows) are never sampled. */
static dfl_fmt_vocab *vocab_of(const dfl_engine *e) {
    int n = e->t->c.vocab, nt = dfl_tok_vocab_size(e->tok);
    const char **bytes = xcalloc((size_t)n, sizeof(char *));
    int *len = xcalloc((size_t)n, sizeof(int));
    uint8_t *kind = xmalloc((size_t)n);
    for (int i = 0; i < n; i++) {
        int special = 0, l = i < nt ? dfl_tok_piece(e->tok, i, &bytes[i], &special) : -1;
        len[i] = l > 0 ? l : 0;
        kind[i] = l < 0 ? DFL_FMT_TOK_NONE : dfl_tok_is_eog(e->tok, i) ? DFL_FMT_TOK_EOG
                : special ? DFL_FMT_TOK_SPECIAL : DFL_FMT_TOK_TEXT;
    }
    return dfl_fmt_vocab_new(n, bytes, len, kind);
}

int dfl_format_new(dfl_engine *e, const char *schema, const char *prefix, const char *suffix,
                   dfl_format **out, dfl_error *err) {
    *out = NULL;
    pthread_mutex_lock(&e->mu);
    if (!e->fmt_vocab) e->fmt_vocab = vocab_of(e);
    pthread_mutex_unlock(&e->mu);
    return dfl_fmt_compile(schema, prefix, suffix, e->fmt_vocab, out, err);
}

void dfl_format_free(dfl_format *f) { dfl_fmt_free(f); }

int dfl_format_accepts(const dfl_format *f, const char *text, size_t n) {
    return dfl_fmt_accepts(f, text, n);
}
