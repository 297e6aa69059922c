/* ngram.h - prompt lookup: drafts with no model, from text already in the
 * sequence. The longest recent n-gram that ends at the anchor is found
 * earlier in the committed tokens, and the tokens that followed it there
 * are proposed. It wins where output repeats input (editing, code, answers
 * quoting their sources). */
#ifndef DFL_NGRAM_H
#define DFL_NGRAM_H

#include "base/base.h"

/* Limits of the lookup, written once. */
enum {
    DFL_NGRAM_MAX_N = 4,        /* longest suffix looked up (tokens, anchor included) */
    DFL_NGRAM_MIN_N = 2,        /* shortest that counts as a match: one token alone (the
                                   anchor) matches too often to predict what follows */
    DFL_NGRAM_WINDOW = 1 << 16, /* earlier positions scanned per lookup: bounds a round's
                                   work on a long context (a scan of 64K ids is ~30 us) */
    DFL_NGRAM_MAX_DRAFT = 31,   /* drafts per round: the lane's largest block is 32 */
};

/* The committed tokens of one sequence. */
typedef struct dfl_ngram {
    int32_t *tok;   /* (cap) token ids by position */
    int len, cap;
} dfl_ngram;

void dfl_ngram_init(dfl_ngram *g, int cap);
void dfl_ngram_free(dfl_ngram *g);

/* Looks up the suffix of tok[0..n) (tok[n-1], the anchor, last): finds the
 * most recent earlier position j < n-1 whose tokens up to j equal the
 * longest such suffix of DFL_NGRAM_MIN_N..DFL_NGRAM_MAX_N tokens, and writes
 * out[i] = the token at j+1+i for i < n_out. A continuation that reaches
 * the anchor goes on with its own drafts (a repeated phrase repeats again).
 * Returns the matched length (0: none, out untouched). */
int dfl_ngram_lookup(const int32_t *tok, int n, int n_out, int32_t *out);

#endif
