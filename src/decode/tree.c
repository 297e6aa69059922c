/* tree.c - DDTree draft trees: per-depth top-k and best-first growth (tree.h). */
#include <math.h>
#include <stddef.h>

#include "decode/tree.h"

/* Inserts (id, v) into the descending list of n (< k kept) when it beats the
 * last; ties keep the lower id first (ids arrive ascending). */
static int keep_top(int32_t *ids, float *vals, int n, int k, int32_t id, float v) {
    if (n == k && !(v > vals[n - 1])) return n;
    int i = n < k ? n++ : n - 1;
    for (; i > 0 && v > vals[i - 1]; i--) ids[i] = ids[i - 1], vals[i] = vals[i - 1];
    ids[i] = id, vals[i] = v;
    return n;
}

void dfl_tree_topk(const float *dlogits, int depths, int vocab, int k, dfl_tree_cands *c) {
    if (depths > DFL_MAX_TREE) depths = DFL_MAX_TREE;
    if (k > DFL_MAX_TREE) k = DFL_MAX_TREE;
    if (k > vocab) k = vocab;
    c->depths = depths, c->k = k;
    for (int d = 0; d < depths; d++) {
        const float *row = dlogits + (size_t)d * vocab;
        int n = 0;
        for (int i = 0; i < vocab; i++) n = keep_top(c->id[d], c->lp[d], n, k, i, row[i]);
        /* log-softmax: lp = x - max - log(sum exp(x - max)) */
        float mx = c->lp[d][0];
        double sum = 0;
        for (int i = 0; i < vocab; i++) sum += exp((double)row[i] - mx);
        float lse = mx + (float)log(sum);
        for (int r = 0; r < k; r++) c->lp[d][r] -= lse;
    }
}

/* A heap entry: the candidate at (depth, rank) under row parent, scored by
 * its path's cumulative log-prob. */
typedef struct cand {
    double score;
    int depth, rank, parent;
} cand;

static void heap_push(cand *h, int *n, cand x) {
    int i = (*n)++;
    for (; i > 0 && h[(i - 1) / 2].score < x.score; i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = x;
}

static cand heap_pop(cand *h, int *n) {
    cand top = h[0], x = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1].score > h[c].score) c++;
        if (!(h[c].score > x.score)) break;
        h[i] = h[c], i = c;
    }
    h[i] = x;
    return top;
}

void dfl_tree_build(const dfl_tree_cands *c, int budget, int32_t anchor, dfl_tree *t) {
    cand heap[2 * DFL_MAX_TREE + 2];
    double logp[DFL_MAX_TREE + 1] = {0};
    int nh = 0;
    if (budget > DFL_MAX_TREE) budget = DFL_MAX_TREE;
    t->n = 1, t->tok[0] = anchor, t->parent[0] = -1, t->depth[0] = 0, t->mass[0] = 0;
    if (c->depths > 0 && c->k > 0) heap_push(heap, &nh, (cand){c->lp[0][0], 1, 0, 0});
    while (nh && t->n <= budget) {
        cand x = heap_pop(heap, &nh);
        int i = t->n++;
        t->tok[i] = c->id[x.depth - 1][x.rank];
        t->parent[i] = x.parent;
        t->depth[i] = x.depth;
        logp[i] = x.score;
        t->mass[i] = t->mass[i - 1] + exp(x.score);
        if (x.rank + 1 < c->k)
            heap_push(heap, &nh, (cand){logp[x.parent] + c->lp[x.depth - 1][x.rank + 1], x.depth,
                                        x.rank + 1, x.parent});
        if (x.depth < c->depths)
            heap_push(heap, &nh, (cand){x.score + c->lp[x.depth][0], x.depth + 1, 0, i});
    }
    t->full = t->n;
}

int dfl_tree_child(const dfl_tree *t, int node, int32_t tok) {
    for (int i = node + 1; i < t->n; i++)
        if (t->parent[i] == node && t->tok[i] == tok) return i;
    return -1;
}
