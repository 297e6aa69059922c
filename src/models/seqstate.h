/* seqstate.h - one sequence's state, every layer by its kind.
 *
 *   full attention   K/V for every position up to the context size;
 *   sliding window   a ring of window + max_rows positions (position p at
 *                    row p % R), so the rows a verify block or a prefill
 *                    chunk writes never overwrite a key that one of its own
 *                    rows, or a row kept after a rollback, still reads. Each
 *                    row is written twice, at p % R and p % R + R, so any R
 *                    consecutive positions are contiguous: the attention
 *                    kernel reads a window as one run of keys;
 *   recurrent        a fixed-size state per layer, with one snapshot per row
 *                    of the last forward (up to n_snap), so a rollback into
 *                    that forward is a copy.
 *
 * One rollback, dfl_kv_truncate, serves every kind. */
#ifndef DFL_SEQSTATE_H
#define DFL_SEQSTATE_H

#include "base/base.h"
#include "kernels/kernels.h"

enum { DFL_LAYER_FULL = 0, DFL_LAYER_SLIDING = 1, DFL_LAYER_RECURRENT = 2 };

/* What a model's sequences hold (dfl_target_kv_shape). */
typedef struct dfl_kv_shape {
    int n_layers, n_kv_heads, head_dim;
    dfl_type type;              /* K/V elements: DFL_F16 or DFL_F32 */
    const unsigned char *kind;  /* (n_layers) DFL_LAYER_* */
    int window;                 /* sliding layers: keys a row attends, itself included */
    int max_rows;               /* rows one forward adds to a sequence */
    int rec_floats;             /* recurrent layers: floats of state */
    int n_snap;                 /* recurrent layers: rows of a forward that can be rolled back to */
} dfl_kv_shape;

typedef struct dfl_kv_layer {
    int kind;
    int ring;                   /* sliding and a ring (else every position is kept) */
    int rows;                   /* positions: R = window + max_rows in a ring (stored
                                   twice), else cap */
    void *k, *v;                /* (n_kv_heads, rows or 2R, head_dim) of type */
    float *rec;                 /* recurrent: (1 + n_snap, rec_floats); row 0 the live state */
} dfl_kv_layer;

typedef struct dfl_kv {
    int len;                    /* committed rows */
    int cap;                    /* positions it may reach (ctx size) */
    int hi;                     /* one past the highest position stored: a ring holds what
                                   was last written at positions [hi - rows, hi), a rolled-back
                                   forward's rows past len included */
    int n_layers, n_kv_heads, head_dim, kv_dim;
    dfl_type type;
    int window;
    dfl_kv_layer *layer;        /* (n_layers) */
    int rec_floats, n_snap;
    int snap_base, snap_n;      /* recurrent: snapshot i is the state after snap_base + i rows,
                                   i < snap_n (set by dfl_kv_begin) */
} dfl_kv;

dfl_kv *dfl_kv_make(const dfl_kv_shape *s, int cap);
/* Bytes dfl_kv_make(s, cap) allocates for K/V and recurrent state. */
uint64_t dfl_kv_bytes(const dfl_kv_shape *s, int cap);
void dfl_kv_free(dfl_kv *kv);
/* Keeps the first n_keep rows; returns the rows kept, which is fewer (0)
 * when a recurrent state cannot be taken back that far. */
int dfl_kv_truncate(dfl_kv *kv, int n_keep);
/* dst (same shape) takes src's first n rows and holds exactly them. Returns
 * n, or 0 (dst emptied, the caller prefills) when src no longer has them: a
 * sliding ring that moved past them, a recurrent state that is neither at n
 * nor has a snapshot there (a recurrent state exists only at its end and at
 * the rows of its last forward). */
int dfl_kv_copy_prefix(dfl_kv *dst, const dfl_kv *src, int n);
/* A forward of n rows starts at kv->len: snapshot 0 of every recurrent
 * layer takes the live state, and the layer writes the state after its row
 * i into snapshot i + 1 (for i + 1 < n_snap): a rollback to any of those
 * rows is then a copy. */
void dfl_kv_begin(dfl_kv *kv, int n);
/* Stores one row's K and V (kv_dim floats each, heads in order) at pos. */
void dfl_kv_store(dfl_kv *kv, int l, int pos, const float *k, const float *v);
/* The keys a row at pos reads in layer l: the view starts at the first of
 * them; *n_keys gets how many (pos + 1, or at most window when sliding). */
dfl_kv_view dfl_kv_keys(const dfl_kv *kv, int l, int pos, int *n_keys);
/* The keys of a tree row in attention layer l, in the order single-row
 * decode of its path reads them: the committed prefix [0, kv->len) (in a
 * sliding layer only from the row's first key, pos + 1 - window), then the
 * rows of the current forward at slots kv->len + path[0..n) (its ancestors
 * from the shallowest, then itself; in a sliding layer those inside the
 * window). The prefix's whole key blocks, counted from the first key, are
 * read in place; its last partial block and the path are copied into k2 /
 * v2 ((n_kv_heads, rows2, head_dim) of kv->type, rows2 >= DFL_ATT_BLOCK - 1
 * + n), the view's tail. *n_keys gets the keys read. */
dfl_kv_view dfl_kv_path_keys(const dfl_kv *kv, int l, const int *path, int n, void *k2, void *v2,
                             int rows2, int *n_keys);
/* A tree row of the current forward whose parent is not the row before it:
 * recurrent layer l's live state becomes the state after row parent (-1:
 * the forward's start), its snapshot, before the row's step. */
void dfl_kv_branch(dfl_kv *kv, int l, int parent);
/* After a tree forward from base: keeps rows base + rows[0..n) (increasing,
 * rows[i] >= i, a path from the forward's first row) as rows base .. base +
 * n - 1 and drops the rest, so the accepted path lies where decode would
 * have put it: attention rows move (in a ring, both copies), a recurrent
 * state becomes its snapshot after the last kept row. Returns the new
 * length, or -1 (nothing changed) when a recurrent layer lacks that
 * snapshot (a forward of more than dfl_kv_tree_rows rows). */
int dfl_kv_keep_path(dfl_kv *kv, int base, const int *rows, int n);
/* The most rows a tree forward may have on this cache (0: none): a ring's
 * room past the window, a recurrent layer's snapshots less one. */
int dfl_kv_tree_rows(const dfl_kv *kv);
/* Recurrent state of layer l: the live one, or snapshot i (state after
 * snap_base + i rows). */
float *dfl_kv_rec(const dfl_kv *kv, int l);
float *dfl_kv_snap(const dfl_kv *kv, int l, int i);

#endif
