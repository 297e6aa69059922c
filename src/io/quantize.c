/* quantize.c - GGUF to GGUF with the weight matrices in another type
 * (q8_0, q4_0, q4_1, q4_k, q6_k, f16, bf16): dflash quantize's core.
 *
 * Every metadata pair is copied as it is, except general.file_type (set to
 * llama.cpp's number for the new type) and general.quantization_version (2
 * for the block types). Tensors keep their order, names and shapes. Each 2-D
 * "*.weight", or 3-D stack of matrices (MoE experts, [n, rows, cols]), whose
 * row length is a whole number of blocks is converted row by
 * row (dequantized to f32 first when it is not f32 already); 1-D tensors
 * (norms) become f32; token_embd.weight stays as it is unless asked, and
 * a DeltaNet's conv taps (ssm_conv1d, [channels, kernel]) always;
 * anything else is copied unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "io/io.h"
#include "kernels/kernels.h"

static uint32_t llama_ftype(dfl_type t) {
    switch (t) {
    case DFL_F32: return 0;
    case DFL_F16: return 1;
    case DFL_Q4_0: return 2;
    case DFL_Q4_1: return 3;
    case DFL_Q8_0: return 7;
    case DFL_Q4_K: return 14; /* MOSTLY_Q4_K_S: Q4_K throughout */
    case DFL_Q6_K: return 18;
    case DFL_BF16: return 32;
    default: return 0;
    }
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Rows of a matrix or of a stack of them (3-D experts [n, rows, cols]). */
static int64_t mat_rows(const dfl_tensor *t) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < t->n_dims; d++) rows *= t->shape[d];
    return rows;
}

/* The type tensor t is written in. */
static dfl_type out_type(const dfl_tensor *t, dfl_type to, int embeddings) {
    if (t->n_dims == 1) return DFL_F32;
    if ((t->n_dims != 2 && t->n_dims != 3) || !ends_with(t->name, ".weight")) return t->type;
    if (!embeddings && !strcmp(t->name, "token_embd.weight")) return t->type;
    if (ends_with(t->name, ".ssm_conv1d.weight")) return t->type;   /* conv taps, read as floats */
    if (t->shape[t->n_dims - 1] % dfl_type_block(to)) return t->type;
    return to;
}

/* ---- row conversion on the thread pool ------------------------------------ */

typedef struct {
    const dfl_tensor *in;
    dfl_type to;
    int64_t rows;
    int cols, chunk;
    size_t in_rb, out_rb;
    uint8_t *out;
    int64_t *bad; /* [tasks]: the first row each task could not write, or -1 */
} conv_job;

static void conv_task(void *ctx, int i, int n) {
    conv_job *j = ctx;
    int64_t r0 = (int64_t)i * j->chunk, r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
    float *row = xmalloc(sizeof(float) * j->cols);
    j->bad[i] = -1;
    for (int64_t r = r0; r < r1; r++) {
        dfl_dequant_row(j->in->type, (const uint8_t *)j->in->data + r * j->in_rb, row, j->cols);
        if (dfl_quant_row(j->to, row, j->out + r * j->out_rb, j->cols)) {
            j->bad[i] = r;
            break;
        }
    }
    free(row);
}

/* Converts t to type `to` into a new buffer; NULL (and a message) on a row
 * the quantizer refuses (a NaN or inf, or values beyond the f16 scales). */
static uint8_t *convert(dfl_pool *pool, const dfl_tensor *t, dfl_type to, uint64_t *nbytes,
                        dfl_error *err) {
    int cols = (int)t->shape[t->n_dims - 1];
    conv_job j = {t, to, 0, cols, 0, dfl_type_row_bytes(t->type, cols),
                  dfl_type_row_bytes(to, cols), NULL, NULL};
    j.rows = mat_rows(t);
    *nbytes = (uint64_t)j.rows * j.out_rb;
    j.out = xmalloc(*nbytes);
    int tasks = dfl_pool_size(pool) * 8;
    if (tasks > j.rows) tasks = (int)j.rows;
    j.chunk = (int)((j.rows + tasks - 1) / tasks);
    j.bad = xcalloc(tasks, sizeof *j.bad);
    dfl_pool_run(pool, conv_task, &j, tasks);
    int64_t bad = -1;
    for (int i = 0; i < tasks && bad < 0; i++) bad = j.bad[i];
    free(j.bad);
    if (bad >= 0) {
        free(j.out);
        dfl_fail(err, DFL_EFORMAT,
                 "tensor %s: row %lld cannot be written as %s (a NaN or inf, or values too "
                 "large for its f16 scales)",
                 t->name, (long long)bad, dfl_type_name(to));
        return NULL;
    }
    return j.out;
}

/* ---- metadata -------------------------------------------------------------- */

typedef struct {
    gguf_wkv *kv;
    int n;
    char **owned; /* strings and arrays allocated here */
    int n_owned;
    size_t cap_owned;
} kvs;

/* Records p (freed with k); NULL, p freed, with DFL_ENOMEM in err when out of memory. */
static void *own(kvs *k, void *p, dfl_error *err) {
    char **o = dfl_grow(k->owned, &k->cap_owned, (size_t)k->n_owned + 1, sizeof *o,
                        "the metadata table", err);
    if (!o) {
        free(p);
        return NULL;
    }
    k->owned = o;
    k->owned[k->n_owned++] = p;
    return p;
}

/* A NUL-terminated copy in *out: 0; 1 if s holds a NUL byte (the writer takes
 * C strings); DFL_ENOMEM. */
static int cstr(kvs *k, const char *s, uint64_t len, char **out, dfl_error *err) {
    if (memchr(s, 0, len)) return 1;
    char *c = own(k, xmalloc(len + 1), err);
    if (!c) return DFL_ENOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    *out = c;
    return 0;
}

static int copy_kv(kvs *k, const gguf_kv *in, const char *path, dfl_error *err) {
    gguf_wkv *w = &k->kv[k->n];
    char *key, *s;
    int r = cstr(k, in->key.s, in->key.len, &key, err);
    if (r)
        return r < 0 ? r : dfl_fail(err, DFL_EFORMAT, "%s: a metadata key holds a NUL byte", path);
    *w = (gguf_wkv){key, in->type, in->arr_type, in->arr_n, in->val};
    if (in->type == GGUF_T_STRING) {
        uint64_t len;
        memcpy(&len, in->val, 8); /* the reader checked it against the file */
        if ((r = cstr(k, (const char *)in->val + 8, len, &s, err)))
            return r < 0 ? r : dfl_fail(err, DFL_EFORMAT, "%s: %s: a string holds a NUL byte", path,
                                        key);
        w->val = s;
    } else if (in->type == GGUF_T_ARRAY && in->arr_type == GGUF_T_STRING) {
        const char **a = own(k, xcalloc(in->arr_n ? in->arr_n : 1, sizeof *a), err);
        if (!a) return DFL_ENOMEM;
        for (uint64_t i = 0; i < in->arr_n; i++) {
            if ((r = cstr(k, in->strs[i].s, in->strs[i].len, &s, err)))
                return r < 0 ? r : dfl_fail(err, DFL_EFORMAT, "%s: %s[%llu] holds a NUL byte", path,
                                            key, (unsigned long long)i);
            a[i] = s;
        }
        w->val = a;
    }
    k->n++;
    return 0;
}

static int set_u32(kvs *k, const char *key, uint32_t v, dfl_error *err) {
    uint32_t *p = own(k, xmalloc(sizeof *p), err);
    if (!p) return DFL_ENOMEM;
    *p = v;
    for (int i = 0; i < k->n; i++)
        if (!strcmp(k->kv[i].key, key)) {
            k->kv[i] = (gguf_wkv){k->kv[i].key, GGUF_T_U32, 0, 0, p};
            return 0;
        }
    k->kv[k->n++] = (gguf_wkv){key, GGUF_T_U32, 0, 0, p};
    return 0;
}

static void free_kvs(kvs *k) {
    for (int i = 0; i < k->n_owned; i++) free(k->owned[i]);
    free(k->owned);
    free(k->kv);
}

static int quantize(const char *in, const char *out, dfl_type to, int embeddings, int threads,
                    const dfl_quantize_opts *o, dfl_quantize_result *res, dfl_error *err) {
    gguf_file g;
    int rc = dfl_gguf_open(in, &g, err);
    if (rc) return rc;
    dfl_pool *pool = dfl_pool_new(threads);
    kvs k = {xcalloc((size_t)g.n_kv + 2, sizeof(gguf_wkv)), 0, NULL, 0, 0};
    for (int64_t i = 0; i < g.n_kv && !rc; i++) rc = copy_kv(&k, &g.kv[i], in, err);
    if (!rc) rc = set_u32(&k, "general.file_type", llama_ftype(to), err);
    if (!rc && dfl_type_block(to) > 1) rc = set_u32(&k, "general.quantization_version", 2, err);
    int n = g.tensors.n;
    dfl_tensor *t = xcalloc(n ? n : 1, sizeof *t);
    uint8_t **bufs = xcalloc(n ? n : 1, sizeof *bufs);
    uint64_t bytes_in = 0, bytes_out = 0;
    int n_conv = 0;
    for (int i = 0; i < n && !rc; i++) {
        const dfl_tensor *s = &g.tensors.t[i];
        t[i] = *s;
        dfl_type ot = out_type(s, to, embeddings);
        if (ot != s->type) {
            if (!(bufs[i] = convert(pool, s, ot, &t[i].nbytes, err))) rc = DFL_EFORMAT;
            t[i].type = ot;
            t[i].data = bufs[i];
            n_conv++;
        }
        bytes_in += s->nbytes;
        bytes_out += t[i].nbytes;
        if (o->progress) o->progress(o->progress_ud, "quantize", (uint64_t)i + 1, (uint64_t)n);
    }
    if (!rc) rc = dfl_gguf_write(out, k.kv, k.n, t, n, err);
    res->n_tensors = n;
    res->n_converted = n_conv;
    res->bytes_in = bytes_in;
    res->bytes_out = bytes_out;
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(t);
    free_kvs(&k);
    dfl_pool_free(pool);
    dfl_gguf_free(&g);
    return rc;
}

int dfl_gguf_quantize(const dfl_quantize_opts *o, dfl_quantize_result *res, dfl_error *err) {
    memset(res, 0, sizeof *res);
    int to = o->type ? dfl_type_from_name(o->type) : -1;
    if (to < 0 || to == DFL_F32)
        return dfl_fail(err, DFL_EARG,
                        "type %s: expected q8_0, q4_0, q4_1, q4_k, q6_k, f16 or bf16",
                        o->type ? o->type : "(none)");
    return quantize(o->in, o->out, (dfl_type)to, o->quantize_embeddings, o->n_threads, o, res,
                    err);
}
