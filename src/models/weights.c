#include "models/weights.h"

#include <string.h>

typedef struct owned_block {
    struct owned_block *next;
    size_t n;
    _Alignas(64) unsigned char data[];
} owned_block;

/* n bytes owned by w; NULL with DFL_ENOMEM in err when out of memory. */
static void *own(dfl_weights *w, size_t n, dfl_error *err) {
    owned_block *b = aligned_alloc(64, (sizeof(owned_block) + n + 63) & ~(size_t)63);
    if (!b) {
        dfl_fail(err, DFL_ENOMEM, "out of memory converting weights (%zu bytes)", n);
        return NULL;
    }
    b->next = w->owned;
    b->n = n;
    w->owned = b;
    return b->data;
}

/* Whether [p, p + n) lies in one allocation of the list owned. */
static int in_owned(const void *owned, const void *p, size_t n) {
    for (const owned_block *b = owned; b; b = b->next)
        if ((const unsigned char *)p >= b->data && (const unsigned char *)p + n <= b->data + b->n)
            return 1;
    return 0;
}

void dfl_w_prepare(dfl_tensors *ts, const void *owned, dfl_mat *m) {
    size_t n = (size_t)m->rows * m->row_bytes;
    if (dfl_qmat_il8_wants(m)) {
        if (in_owned(owned, m->data, n)) {
            dfl_qmat_il8(m);
        } else if (ts && !dfl_tensors_protect(ts, m->data, n, 1)) {
            dfl_qmat_il8(m);
            dfl_tensors_protect(ts, m->data, n, 0);
        }
    }
    dfl_mat_prepare(m);
}

void dfl_weights_free_owned(void *owned) {
    for (owned_block *b = owned; b;) {
        owned_block *n = b->next;
        free(b);
        b = n;
    }
}

int dfl_w_begin(dfl_weights *w, dfl_tensors *ts, const dfl_load_opts *o, dfl_error *err) {
    memset(w, 0, sizeof *w);
    w->ts = ts;
    w->progress = o->progress;
    w->progress_ud = o->progress_ud;
    if (o->dtype && *o->dtype && strcmp(o->dtype, "auto") != 0) {
        int t = dfl_type_from_name(o->dtype);
        if (t < 0)
            return dfl_fail(err, DFL_EARG,
                            "--dtype %s: unknown type (use f32, f16, bf16, q8_0, q4_0, q4_1, "
                            "q4_k, q6_k)",
                            o->dtype);
        w->convert = 1;
        w->floats_only = o->floats_only;
        w->type = (dfl_type)t;
    }
    return 0;
}

static dfl_tensor *find(dfl_weights *w, const char *name, dfl_error *err) {
    dfl_tensor *t = dfl_tensors_find(w->ts, name);
    if (!t) {
        dfl_fail(err, DFL_EFORMAT, "%s: tensor %s is missing", w->ts->source, name);
        return NULL;
    }
    if (t->used) {
        dfl_fail(err, DFL_EFORMAT, "%s: tensor %s bound twice", w->ts->source, name);
        return NULL;
    }
    t->used = 1;
    return t;
}

/* A default conversion (floats_only) leaves a matrix whose rows do not fit the
 * type's blocks as it is; one asked for refuses it (convert_mat). */
static int converts(const dfl_weights *w, const dfl_mat *m) {
    if (!w->convert || m->type == w->type) return 0;
    return !w->floats_only || (m->type <= DFL_BF16 && dfl_type_row_bytes(w->type, m->cols));
}

static int convert_mat(dfl_weights *w, const char *name, dfl_mat *m, dfl_error *err) {
    size_t rb = dfl_type_row_bytes(w->type, m->cols);
    if (!rb)
        return dfl_fail(err, DFL_EARG, "%s: tensor %s has %d columns, not a multiple of %s's block of %d",
                        w->ts->source, name, m->cols, dfl_type_name(w->type),
                        dfl_type_block(w->type));
    uint8_t *dst = own(w, rb * m->rows, err);
    if (!dst) return DFL_ENOMEM;
    float *row = xmalloc(sizeof(float) * m->cols);
    for (int r = 0; r < m->rows; r++) {
        dfl_dequant_row(m->type, m->data + (size_t)r * m->row_bytes, row, m->cols);
        dfl_quant_row(w->type, row, dst + (size_t)r * rb, m->cols);
    }
    free(row);
    m->type = w->type;
    m->data = dst;
    m->row_bytes = rb;
    /* side copies of the old data (their owner frees them): dfl_matmul would
     * read them instead of the new */
    m->wt = NULL;
    m->sc = NULL;
    return 0;
}

int dfl_w_mat(dfl_weights *w, const char *name, int rows, int cols, dfl_mat *m, dfl_error *err) {
    dfl_tensor *t = find(w, name, err);
    if (!t) return DFL_EFORMAT;
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: tensor %s has shape [%lld, %lld]%s, expected [%d, %d] from the config",
                        w->ts->source, name, (long long)t->shape[0],
                        (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                        t->n_dims != 2 ? " (not 2-D)" : "", rows, cols);
    m->type = t->type;
    m->rows = rows;
    m->cols = cols;
    m->data = t->data;
    m->row_bytes = dfl_type_row_bytes(t->type, cols);
    if (!m->row_bytes || m->row_bytes * (uint64_t)rows != t->nbytes)
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: %llu bytes do not fit [%d, %d] %s",
                        w->ts->source, name, (unsigned long long)t->nbytes, rows, cols,
                        dfl_type_name(t->type));
    if (converts(w, m)) return convert_mat(w, name, m, err);
    return 0;
}

int dfl_w_convert(dfl_weights *w, const char *name, dfl_mat *m, dfl_error *err) {
    return converts(w, m) ? convert_mat(w, name, m, err) : 0;
}

int dfl_w_stack(dfl_weights *w, const char *name, int n, int rows, int cols, dfl_mat *m,
                dfl_error *err) {
    dfl_tensor *t = find(w, name, err);
    if (!t) return DFL_EFORMAT;
    if (t->n_dims != 3 || t->shape[0] != n || t->shape[1] != rows || t->shape[2] != cols)
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s has %d dims [%lld, %lld, ...], expected "
                        "[%d, %d, %d] from the config", w->ts->source, name, t->n_dims,
                        (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0), n,
                        rows, cols);
    size_t rb = dfl_type_row_bytes(t->type, cols);
    if (!rb || rb * (uint64_t)rows * n != t->nbytes)
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: %llu bytes do not fit [%d, %d, %d] %s",
                        w->ts->source, name, (unsigned long long)t->nbytes, n, rows, cols,
                        dfl_type_name(t->type));
    for (int i = 0; i < n; i++) {
        m[i] = (dfl_mat){.type = t->type, .rows = rows, .cols = cols,
                         .data = (const uint8_t *)t->data + (size_t)i * rows * rb, .row_bytes = rb};
        int rc = converts(w, &m[i]) ? convert_mat(w, name, &m[i], err) : 0;
        if (rc) return rc;
    }
    return 0;
}

int dfl_w_has(dfl_weights *w, const char *name) { return dfl_tensors_find(w->ts, name) != NULL; }

/* t's n elements as f32: in place when stored so and off is 0, else an
 * owned copy with off added to each. */
static int as_f32(dfl_weights *w, const dfl_tensor *t, int n, float off, const float **v,
                  dfl_error *err) {
    if (t->type == DFL_F32 && off == 0) {
        *v = t->data;
        return 0;
    }
    if (dfl_type_block(t->type) != 1 || dfl_type_row_bytes(t->type, n) != t->nbytes)
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: a vector must be f32, f16 or bf16",
                        w->ts->source, t->name);
    float *f = own(w, sizeof(float) * n, err);
    if (!f) return DFL_ENOMEM;
    dfl_dequant_row(t->type, t->data, f, n);
    for (int i = 0; i < n && off != 0; i++) f[i] += off;
    *v = f;
    return 0;
}

int dfl_w_vec_offset(dfl_weights *w, const char *name, int n, float off, const float **v,
                     dfl_error *err) {
    int dims[1] = {n};
    return dfl_w_array(w, name, 1, dims, off, v, err);
}

int dfl_w_vec(dfl_weights *w, const char *name, int n, const float **v, dfl_error *err) {
    return dfl_w_vec_offset(w, name, n, 0, v, err);
}

int dfl_w_array(dfl_weights *w, const char *name, int n_dims, const int *dims, float off,
                const float **v, dfl_error *err) {
    dfl_tensor *t = find(w, name, err);
    if (!t) return DFL_EFORMAT;
    int ok = t->n_dims == n_dims, n = 1;
    for (int i = 0; i < n_dims; i++) {
        ok = ok && t->shape[i] == dims[i];
        n *= dims[i];
    }
    if (!ok) {
        char want[64] = "";
        for (int i = 0; i < n_dims; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? ", " : "",
                     dims[i]);
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s has %d dims [%lld%s], expected [%s]",
                        w->ts->source, name, t->n_dims, (long long)t->shape[0],
                        t->n_dims != 1 ? ", ..." : "", want);
    }
    return as_f32(w, t, n, off, v, err);
}

int dfl_w_rope_freqs(dfl_weights *w, const char *name, dfl_rope *r, dfl_error *err) {
    if (!dfl_tensors_find(w->ts, name)) return 0;
    const float *f;
    int rc = dfl_w_vec(w, name, r->head_dim / 2, &f, err);
    if (rc) return rc;
    for (int i = 0; i < r->head_dim / 2; i++) {
        if (!(f[i] > 0))
            return dfl_fail(err, DFL_EFORMAT, "%s: %s[%d] = %g, expected > 0", w->ts->source,
                            name, i, f[i]);
        r->inv_freq[i] /= f[i];
    }
    return 0;
}

int dfl_w_unpermute(dfl_weights *w, dfl_mat *m, int n_heads, int head_dim, dfl_error *err) {
    uint8_t *dst = own(w, m->row_bytes * m->rows, err);
    if (!dst) return DFL_ENOMEM;
    int half = head_dim / 2;
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++) {
                size_t from = (size_t)h * head_dim + 2 * i + j, to = (size_t)h * head_dim + j * half + i;
                memcpy(dst + to * m->row_bytes, m->data + from * m->row_bytes, m->row_bytes);
            }
    m->data = dst;
    return 0;
}

float *dfl_w_own_floats(dfl_weights *w, size_t n, dfl_error *err) {
    return own(w, n * sizeof(float), err);
}

/* ---- llama.cpp's tiled value heads ------------------------------------------ */

void dfl_untile(uint8_t *dst, const uint8_t *src, const dfl_tiling *g, size_t seg) {
    for (int k = 0; k < g->n_k; k++)
        for (int j = 0; j < g->per_k; j++)
            memcpy(dst + ((size_t)k * g->per_k + j) * seg,
                   src + ((size_t)j * g->n_k + k) * seg, seg);
}

int dfl_w_untile_rows(dfl_weights *w, dfl_mat *m, int first, const dfl_tiling *g,
                      dfl_error *err) {
    uint8_t *dst = own(w, m->row_bytes * m->rows, err);
    if (!dst) return DFL_ENOMEM;
    size_t head = first * m->row_bytes, seg = g->seg * m->row_bytes;
    memcpy(dst, m->data, head);
    dfl_untile(dst + head, m->data + head, g, seg);
    m->data = dst;
    return 0;
}

/* Columns move in whole blocks of the stored type: done before any
 * conversion, so --dtype sees the grouped rows Hugging Face's file has. */
int dfl_w_mat_untile_cols(dfl_weights *w, const char *name, int rows, int cols,
                          const dfl_tiling *g, dfl_mat *m, dfl_error *err) {
    int conv = w->convert;
    w->convert = 0;
    int rc = dfl_w_mat(w, name, rows, cols, m, err);
    w->convert = conv;
    if (rc) return rc;
    int blk = dfl_type_block(m->type);
    if (g->seg % blk)
        return dfl_fail(err, DFL_EUNSUP, "%s: tensor %s: value heads of %d columns do not move "
                        "as whole %s blocks of %d", w->ts->source, name, g->seg,
                        dfl_type_name(m->type), blk);
    uint8_t *dst = own(w, m->row_bytes * m->rows, err);
    if (!dst) return DFL_ENOMEM;
    size_t seg = dfl_type_row_bytes(m->type, g->seg);
    for (int r = 0; r < rows; r++)
        dfl_untile(dst + (size_t)r * m->row_bytes, m->data + (size_t)r * m->row_bytes, g, seg);
    m->data = dst;
    return converts(w, m) ? convert_mat(w, name, m, err) : 0;
}

int dfl_w_untile_floats(dfl_weights *w, const float **v, int n, int first, const dfl_tiling *g,
                        int per_seg, dfl_error *err) {
    float *dst = own(w, sizeof(float) * n, err);
    if (!dst) return DFL_ENOMEM;
    size_t head = (size_t)first * per_seg;
    memcpy(dst, *v, head * sizeof(float));
    dfl_untile((uint8_t *)(dst + head), (const uint8_t *)(*v + head), g,
               sizeof(float) * g->seg * per_seg);
    *v = dst;
    return 0;
}

void dfl_w_ignore(dfl_weights *w, const char *suffix) {
    size_t sl = strlen(suffix);
    for (int i = 0; i < w->ts->n; i++) {
        size_t nl = strlen(w->ts->t[i].name);
        if (nl >= sl && !strcmp(w->ts->t[i].name + nl - sl, suffix)) w->ts->t[i].used = 1;
    }
}

void dfl_w_ignore_prefix(dfl_weights *w, const char *prefix) {
    size_t pl = strlen(prefix);
    for (int i = 0; i < w->ts->n; i++)
        if (!strncmp(w->ts->t[i].name, prefix, pl)) w->ts->t[i].used = 1;
}

int dfl_w_end(dfl_weights *w, dfl_error *err) {
    char list[512] = "";
    int extra = 0;
    for (int i = 0; i < w->ts->n; i++) {
        if (w->ts->t[i].used) continue;
        if (extra++ < 4) {
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, "%s%s", l ? ", " : "", w->ts->t[i].name);
        }
    }
    if (extra)
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: %d unexpected tensor(s) for this architecture: %s%s (a different "
                        "model family, or a damaged checkpoint)",
                        w->ts->source, extra, list, extra > 4 ? ", ..." : "");
    return 0;
}
