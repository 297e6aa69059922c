/* ngram.c - the prompt-lookup matcher (ngram.h). One backward scan over at
 * most DFL_NGRAM_WINDOW positions per lookup: no index to keep in step with
 * rollbacks, and its cost is nothing next to a verify forward. */
#include <string.h>

#include "draft/ngram.h"

void dfl_ngram_init(dfl_ngram *g, int cap) {
    g->tok = xcalloc(cap > 0 ? cap : 1, sizeof(int32_t));
    g->len = 0;
    g->cap = cap;
}

void dfl_ngram_free(dfl_ngram *g) {
    free(g->tok);
    memset(g, 0, sizeof *g);
}

/* Tokens, up to DFL_NGRAM_MAX_N, that agree going back from j and from n-1. */
static int agree(const int32_t *tok, int n, int j) {
    int m = 0;
    while (m < DFL_NGRAM_MAX_N && m <= j && tok[j - m] == tok[n - 1 - m]) m++;
    return m;
}

int dfl_ngram_lookup(const int32_t *tok, int n, int n_out, int32_t *out) {
    int best = 0, at = -1, stop = n - 1 - DFL_NGRAM_WINDOW;
    if (n < 2 || n_out < 1) return 0;
    for (int j = n - 2; j >= 0 && j > stop; j--) {
        if (tok[j] != tok[n - 1]) continue;
        int m = agree(tok, n, j);
        if (m > best) best = m, at = j;   /* ties keep the more recent */
        if (best == DFL_NGRAM_MAX_N) break;
    }
    if (best < DFL_NGRAM_MIN_N) return 0;
    for (int i = 0; i < n_out; i++) {
        int src = at + 1 + i;   /* < n, or a draft of this lookup: src - n < i */
        out[i] = src < n ? tok[src] : out[src - n];
    }
    return best;
}
