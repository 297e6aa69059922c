/* seqstate.c - one sequence's state by layer kind (see seqstate.h). */
#include <string.h>

#include "models/seqstate.h"

static size_t elem(const dfl_kv *kv) { return dfl_type_block_bytes(kv->type); }

/* Rows stored per kv head: a ring keeps each row twice. */
static size_t stored_rows(const dfl_kv_layer *L) {
    return L->ring ? 2 * (size_t)L->rows : (size_t)L->rows;
}

/* A layer's positions: a ring only where it is smaller than the context it serves. */
static void layer_rows(const dfl_kv_shape *s, int cap, int kind, dfl_kv_layer *L) {
    L->kind = kind;
    L->ring = kind == DFL_LAYER_SLIDING && s->window + s->max_rows < cap;
    L->rows = L->ring ? s->window + s->max_rows : cap;
}

uint64_t dfl_kv_bytes(const dfl_kv_shape *s, int cap) {
    uint64_t n = 0;
    for (int l = 0; l < s->n_layers; l++) {
        dfl_kv_layer L;
        layer_rows(s, cap, s->kind ? s->kind[l] : DFL_LAYER_FULL, &L);
        if (L.kind == DFL_LAYER_RECURRENT)
            n += (uint64_t)(1 + s->n_snap) * s->rec_floats * sizeof(float);
        else
            n += 2 * stored_rows(&L) * s->n_kv_heads * s->head_dim * dfl_type_block_bytes(s->type);
    }
    return n;
}

dfl_kv *dfl_kv_make(const dfl_kv_shape *s, int cap) {
    dfl_kv *kv = xcalloc(1, sizeof *kv);
    kv->cap = cap;
    kv->n_layers = s->n_layers;
    kv->n_kv_heads = s->n_kv_heads;
    kv->head_dim = s->head_dim;
    kv->kv_dim = s->n_kv_heads * s->head_dim;
    kv->type = s->type;
    kv->window = s->window;
    kv->rec_floats = s->rec_floats;
    kv->n_snap = s->n_snap;
    kv->layer = xcalloc(s->n_layers, sizeof *kv->layer);
    for (int l = 0; l < s->n_layers; l++) {
        dfl_kv_layer *L = &kv->layer[l];
        layer_rows(s, cap, s->kind ? s->kind[l] : DFL_LAYER_FULL, L);
        if (L->kind == DFL_LAYER_RECURRENT) {
            L->rec = xcalloc((size_t)(1 + s->n_snap) * s->rec_floats, sizeof(float));
            continue;
        }
        size_t n = stored_rows(L) * kv->kv_dim;
        L->k = xcalloc(n, elem(kv));
        L->v = xcalloc(n, elem(kv));
    }
    return kv;
}

void dfl_kv_free(dfl_kv *kv) {
    if (!kv) return;
    for (int l = 0; l < kv->n_layers; l++)
        free(kv->layer[l].k), free(kv->layer[l].v), free(kv->layer[l].rec);
    free(kv->layer);
    free(kv);
}

float *dfl_kv_rec(const dfl_kv *kv, int l) { return kv->layer[l].rec; }

float *dfl_kv_snap(const dfl_kv *kv, int l, int i) {
    return kv->layer[l].rec + (size_t)(1 + i) * kv->rec_floats;
}

static int has_rec(const dfl_kv *kv) {
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->layer[l].kind == DFL_LAYER_RECURRENT) return 1;
    return 0;
}

void dfl_kv_begin(dfl_kv *kv, int n) {
    if (!kv->n_snap || !has_rec(kv)) return;
    /* the layers fill snapshots 1.. as their rows go, as many as there are */
    kv->snap_base = kv->len;
    kv->snap_n = n + 1 < kv->n_snap ? n + 1 : kv->n_snap;
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->layer[l].kind == DFL_LAYER_RECURRENT)
            memcpy(dfl_kv_snap(kv, l, 0), dfl_kv_rec(kv, l), sizeof(float) * kv->rec_floats);
}

int dfl_kv_truncate(dfl_kv *kv, int n_keep) {
    if (n_keep < 0) n_keep = 0;
    if (n_keep >= kv->len) return kv->len;
    if (has_rec(kv)) {
        int i = n_keep - kv->snap_base;
        if (i < 0 || i >= kv->snap_n) {   /* not recoverable: start the sequence again */
            for (int l = 0; l < kv->n_layers; l++)
                if (kv->layer[l].rec)
                    memset(kv->layer[l].rec, 0, sizeof(float) * kv->rec_floats);
            kv->snap_n = 0;
            return kv->len = 0;
        }
        for (int l = 0; l < kv->n_layers; l++)
            if (kv->layer[l].kind == DFL_LAYER_RECURRENT)
                memcpy(dfl_kv_rec(kv, l), dfl_kv_snap(kv, l, i), sizeof(float) * kv->rec_floats);
        kv->snap_n = i + 1;
    }
    return kv->len = n_keep;
}

static void *slot(const dfl_kv *kv, void *base, const dfl_kv_layer *L, int h, int row) {
    size_t per_head = stored_rows(L) * kv->head_dim;
    return (char *)base + ((size_t)h * per_head + (size_t)row * kv->head_dim) * elem(kv);
}

/* Where position pos lies in layer L (a ring's first copy). */
static int row_of(const dfl_kv_layer *L, int pos) { return L->ring ? pos % L->rows : pos; }

/* The first key a row at pos reads in layer L: the window's start when sliding. */
static int first_key(const dfl_kv *kv, const dfl_kv_layer *L, int pos) {
    return L->kind == DFL_LAYER_SLIDING && pos + 1 > kv->window ? pos + 1 - kv->window : 0;
}

void dfl_kv_store(dfl_kv *kv, int l, int pos, const float *k, const float *v) {
    const dfl_kv_layer *L = &kv->layer[l];
    int hd = kv->head_dim, row = row_of(L, pos);
    if (pos >= kv->hi) kv->hi = pos + 1;
    for (int h = 0; h < kv->n_kv_heads; h++) {
        dfl_quant_row(kv->type, k + (size_t)h * hd, slot(kv, L->k, L, h, row), hd);
        dfl_quant_row(kv->type, v + (size_t)h * hd, slot(kv, L->v, L, h, row), hd);
        if (!L->ring) continue;
        dfl_quant_row(kv->type, k + (size_t)h * hd, slot(kv, L->k, L, h, row + L->rows), hd);
        dfl_quant_row(kv->type, v + (size_t)h * hd, slot(kv, L->v, L, h, row + L->rows), hd);
    }
}

dfl_kv_view dfl_kv_keys(const dfl_kv *kv, int l, int pos, int *n_keys) {
    const dfl_kv_layer *L = &kv->layer[l];
    int first = first_key(kv, L, pos), row = row_of(L, first);
    *n_keys = pos + 1 - first;
    dfl_kv_view v = {slot(kv, L->k, L, 0, row), slot(kv, L->v, L, 0, row), kv->type,
                     kv->head_dim, stored_rows(L) * kv->head_dim};
    return v;
}

/* Rows [0, n) of one layer, per kv head (each head's rows are one run). */
static void copy_rows(dfl_kv *dst, const dfl_kv *src, int l, int first, int n) {
    const dfl_kv_layer *S = &src->layer[l];
    dfl_kv_layer *D = &dst->layer[l];
    size_t row = (size_t)src->head_dim * elem(src);
    for (int pos = first; pos < n; pos++) {
        int r = row_of(S, pos);
        for (int h = 0; h < src->n_kv_heads; h++) {
            memcpy(slot(dst, D->k, D, h, r), slot(src, S->k, S, h, r), row);
            memcpy(slot(dst, D->v, D, h, r), slot(src, S->v, S, h, r), row);
            if (!S->ring) continue;
            memcpy(slot(dst, D->k, D, h, r + S->rows), slot(src, S->k, S, h, r + S->rows), row);
            memcpy(slot(dst, D->v, D, h, r + S->rows), slot(src, S->v, S, h, r + S->rows), row);
        }
    }
}

/* The recurrent state after n rows of src: the live one, a snapshot of its
 * last forward, or NULL when src holds neither. */
static const float *rec_at(const dfl_kv *src, int l, int n) {
    if (n == src->len) return dfl_kv_rec(src, l);
    int i = n - src->snap_base;
    return i >= 0 && i < src->snap_n ? dfl_kv_snap(src, l, i) : NULL;
}

int dfl_kv_copy_prefix(dfl_kv *dst, const dfl_kv *src, int n) {
    if (n > src->len) n = src->len;
    if (n > dst->cap) n = dst->cap;
    if (dst->rec_floats != src->rec_floats) n = 0;
    for (int l = 0; l < src->n_layers && n > 0; l++) {
        const dfl_kv_layer *S = &src->layer[l];
        /* a ring holds positions [hi - rows, hi), where a rolled-back forward's rows
         * overwrote older ones; the next row reads back to n - window + 1 */
        if (S->ring && n - src->window < src->hi - S->rows) n = 0;
        if (S->kind == DFL_LAYER_RECURRENT && !rec_at(src, l, n)) n = 0;
    }
    dfl_kv_truncate(dst, 0);
    for (int l = 0; l < src->n_layers && n > 0; l++) {
        const dfl_kv_layer *S = &src->layer[l];
        if (S->kind == DFL_LAYER_RECURRENT) {
            memcpy(dst->layer[l].rec, rec_at(src, l, n), sizeof(float) * src->rec_floats);
            continue;
        }
        int first = S->ring && n > S->rows ? n - S->rows : 0;
        copy_rows(dst, src, l, first, n);
    }
    dst->snap_n = 0;
    dst->hi = n;
    return dst->len = n;
}

/* ---- tree rows ---------------------------------------------------------------- */

/* Every row of a tree forward needs: its keys in the cache until the
 * accepted path is compacted (a ring holds max_rows rows past the window,
 * and a forward has no more), and, in a recurrent layer, the state after
 * each row (a later row may branch from it, the accepted path may end at
 * it): rows up to n_snap - 1, the snapshots after row i being i + 1. */
int dfl_kv_tree_rows(const dfl_kv *kv) {
    int rows = kv->cap;
    for (int l = 0; l < kv->n_layers; l++) {
        const dfl_kv_layer *L = &kv->layer[l];
        if (L->ring && L->rows - kv->window < rows) rows = L->rows - kv->window;
        if (L->kind == DFL_LAYER_RECURRENT && kv->n_snap - 1 < rows) rows = kv->n_snap - 1;
    }
    return rows > 0 ? rows : 0;
}

/* Copies one row (slot from of every kv head) of K and V to row to of dk / dv,
 * whose heads are drows rows apart. */
static void copy_row(const dfl_kv *kv, const dfl_kv_layer *L, int from, void *dk, void *dv,
                     size_t drows, int to) {
    size_t row = (size_t)kv->head_dim * elem(kv);
    for (int h = 0; h < kv->n_kv_heads; h++) {
        size_t off = ((size_t)h * drows + to) * row;
        memmove((char *)dk + off, slot(kv, L->k, L, h, from), row);
        memmove((char *)dv + off, slot(kv, L->v, L, h, from), row);
    }
}

/* The committed keys [from, len) a tree row reads (from: its first key, or
 * len when its window starts inside its path), whole key blocks counted from
 * its first key in place (one run, a ring's any window included), the rest
 * and its path's rows from path[first - from] on copied after them. */
dfl_kv_view dfl_kv_path_keys(const dfl_kv *kv, int l, const int *path, int n, void *k2, void *v2,
                             int rows2, int *n_keys) {
    const dfl_kv_layer *L = &kv->layer[l];
    int pos = kv->len + n - 1, first = first_key(kv, L, pos);
    int from = first < kv->len ? first : kv->len, m = 0;
    int split = (kv->len - from) / DFL_ATT_BLOCK * DFL_ATT_BLOCK;
    for (int p = from + split; p < kv->len; p++)
        copy_row(kv, L, row_of(L, p), k2, v2, rows2, m++);
    for (int i = first - from; i < n; i++)
        copy_row(kv, L, row_of(L, kv->len + path[i]), k2, v2, rows2, m++);
    *n_keys = pos + 1 - first;
    int row = row_of(L, from);
    dfl_kv_view v = {slot(kv, L->k, L, 0, row), slot(kv, L->v, L, 0, row), kv->type, kv->head_dim,
                     stored_rows(L) * kv->head_dim, k2, v2, split,
                     (size_t)rows2 * kv->head_dim};
    return v;
}

void dfl_kv_branch(dfl_kv *kv, int l, int parent) {
    memcpy(dfl_kv_rec(kv, l), dfl_kv_snap(kv, l, parent + 1), sizeof(float) * kv->rec_floats);
}

/* Attention layers: each kept row's K/V moves down to its place (both of a
 * ring's copies); rows[i] >= i and increasing, so a move never overwrites a
 * row still to move. Recurrent layers: the live state becomes the state
 * after the last kept row, which is its snapshot; snapshot i stays the state
 * after base + i rows only while the kept rows are the forward's first ones
 * in order, so later ones are dropped (a rollback past them restarts). */
int dfl_kv_keep_path(dfl_kv *kv, int base, const int *rows, int n) {
    int last = n ? rows[n - 1] + 1 : 0, chain = 0;
    if (has_rec(kv) && (base != kv->snap_base || last >= kv->snap_n)) return -1;
    while (chain < n && rows[chain] == chain) chain++;
    for (int l = 0; l < kv->n_layers; l++) {
        dfl_kv_layer *L = &kv->layer[l];
        if (L->kind == DFL_LAYER_RECURRENT) {
            memcpy(dfl_kv_rec(kv, l), dfl_kv_snap(kv, l, last), sizeof(float) * kv->rec_floats);
            continue;
        }
        for (int i = chain; i < n; i++) {
            int from = row_of(L, base + rows[i]), to = row_of(L, base + i);
            copy_row(kv, L, from, L->k, L->v, stored_rows(L), to);
            if (L->ring) copy_row(kv, L, from, L->k, L->v, stored_rows(L), to + L->rows);
        }
    }
    if (has_rec(kv) && kv->snap_n > chain + 1) kv->snap_n = chain + 1;
    return kv->len = base + n;
}
