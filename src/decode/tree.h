/* tree.h - DDTree draft trees (Ringel & Romano, arXiv:2604.12989; vLLM PR
 * #42910): a best-first tree over the drafter's per-depth top-k, verified in
 * one target forward whose rows carry parent tags.
 *
 * A DFlash drafter drafts every depth of a block in one pass conditioned on
 * the anchor alone, so depth d's candidates are the same whatever branch
 * leads there. The tree takes the top-k log-probs of each depth (k = budget)
 * and grows best-first on the cumulative log-prob: a heap whose pop adds a
 * node, then pushes that node's next sibling (the next rank at its depth,
 * same parent) and its first child (rank 0 at the next depth). Pops come in
 * non-increasing cumulative log-prob, so a budget's tree is the first
 * `budget` pops: a smaller budget's tree is a prefix of a larger one's. */
#ifndef DFL_TREE_H
#define DFL_TREE_H

#include <stdint.h>

#include "dflash.h"   /* DFL_MAX_TREE: nodes of a draft tree */

/* Top-k candidates per depth: depth d (1-based) in row d - 1. */
typedef struct dfl_tree_cands {
    int depths, k;
    int32_t id[DFL_MAX_TREE][DFL_MAX_TREE];   /* [depth-1][rank], descending log-prob */
    float lp[DFL_MAX_TREE][DFL_MAX_TREE];     /* log-softmax of the drafter's row */
} dfl_tree_cands;

/* A tree as forward rows: row 0 the root (the anchor), rows 1..n-1 the
 * nodes in pop order; parent[i] < i (row 0: -1). */
typedef struct dfl_tree {
    int n;
    int full;                      /* rows built (n may be cut to a smaller budget's) */
    int32_t tok[DFL_MAX_TREE + 1];
    int parent[DFL_MAX_TREE + 1];
    int depth[DFL_MAX_TREE + 1];
    double mass[DFL_MAX_TREE + 1]; /* [m]: summed drafter probability of the first m nodes'
                                      paths (the drafter's expectation of accepted tokens
                                      for a budget of m), non-decreasing */
} dfl_tree;

/* The k (<= DFL_MAX_TREE) best tokens and log-probs of each of depths
 * (<= DFL_MAX_TREE) drafter rows dlogits (depths, vocab). Ties: lower id first. */
void dfl_tree_topk(const float *dlogits, int depths, int vocab, int k, dfl_tree_cands *c);
/* The best-first tree of `budget` nodes (<= c->k, <= DFL_MAX_TREE) after
 * anchor; fewer when the candidates run out. */
void dfl_tree_build(const dfl_tree_cands *c, int budget, int32_t anchor, dfl_tree *t);
/* The child of row `node` whose token is tok, or -1. */
int dfl_tree_child(const dfl_tree *t, int node, int32_t tok);

#endif
