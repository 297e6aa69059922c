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

void dfl_kv_store(dfl_kv *kv, int l, int pos, const float *k, const float *v) {
    const dfl_kv_layer *L = &kv->layer[l];
    int hd = kv->head_dim, row = L->ring ? pos % L->rows : pos;
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
    int first = 0;
    if (L->kind == DFL_LAYER_SLIDING && pos + 1 > kv->window) first = pos + 1 - kv->window;
    int row = L->ring ? first % L->rows : first;
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
        int r = S->ring ? pos % S->rows : pos;
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
        /* a ring holds positions (len - rows, len]; the next row reads back to n - window */
        if (S->ring && n - src->window < src->len - S->rows) n = 0;
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
    return dst->len = n;
}

/* ---- tree rows ---------------------------------------------------------------- */

int dfl_kv_tree_ok(const dfl_kv *kv) {
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->layer[l].kind != DFL_LAYER_FULL || kv->layer[l].ring) return 0;
    return 1;
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

dfl_kv_view dfl_kv_path_keys(const dfl_kv *kv, int l, const int *path, int n, void *k2, void *v2,
                             int rows2, int *n_keys) {
    const dfl_kv_layer *L = &kv->layer[l];
    int split = kv->len / DFL_ATT_BLOCK * DFL_ATT_BLOCK, m = 0;
    for (int pos = split; pos < kv->len; pos++) copy_row(kv, L, pos, k2, v2, rows2, m++);
    for (int i = 0; i < n; i++) copy_row(kv, L, kv->len + path[i], k2, v2, rows2, m++);
    *n_keys = kv->len + n;
    dfl_kv_view v = {slot(kv, L->k, L, 0, 0), slot(kv, L->v, L, 0, 0), kv->type, kv->head_dim,
                     stored_rows(L) * kv->head_dim, k2, v2, split,
                     (size_t)rows2 * kv->head_dim};
    return v;
}

int dfl_kv_keep_path(dfl_kv *kv, int base, const int *rows, int n) {
    if (!dfl_kv_tree_ok(kv)) return -1;
    for (int l = 0; l < kv->n_layers; l++) {
        dfl_kv_layer *L = &kv->layer[l];
        for (int i = 0; i < n; i++)
            if (rows[i] != i)
                copy_row(kv, L, base + rows[i], L->k, L->v, stored_rows(L), base + i);
    }
    return kv->len = base + n;
}
