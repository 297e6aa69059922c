/* gguf.c - GGUF v2/v3 reader and v3 writer.
 *
 * The file is untrusted: every count is bounded by the bytes left before
 * anything is allocated, every string length is checked against the end of
 * the buffer, and every tensor's bytes must lie inside the data section.
 * Layout (little-endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 * kv pairs, tensor infos, padding to general.alignment, tensor data. */
#include "io.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>

#include "io_private.h"

enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8, GGML_Q4_K = 12,
    GGML_Q6_K = 14, GGML_BF16 = 30
};

/* GGUF's type id for each dfl_type. */
static const uint32_t ggml_id[DFL_NTYPES] = {
    [DFL_F32] = GGML_F32, [DFL_F16] = GGML_F16, [DFL_BF16] = GGML_BF16, [DFL_Q8_0] = GGML_Q8_0,
    [DFL_Q4_0] = GGML_Q4_0, [DFL_Q4_1] = GGML_Q4_1, [DFL_Q4_K] = GGML_Q4_K, [DFL_Q6_K] = GGML_Q6_K,
};

static int type_from_ggml(uint32_t id) {
    for (int t = 0; t < DFL_NTYPES; t++)
        if (ggml_id[t] == id) return t;
    return -1;
}

/* Bytes of one scalar of type t; 0 for strings, arrays and unknown types. */
static size_t vsize(uint32_t t) {
    switch (t) {
    case GGUF_T_U8: case GGUF_T_I8: case GGUF_T_BOOL: return 1;
    case GGUF_T_U16: case GGUF_T_I16: return 2;
    case GGUF_T_U32: case GGUF_T_I32: case GGUF_T_F32: return 4;
    case GGUF_T_U64: case GGUF_T_I64: case GGUF_T_F64: return 8;
    default: return 0;
    }
}

static int is_int_type(uint32_t t) {
    return t <= GGUF_T_I32 || t == GGUF_T_U64 || t == GGUF_T_I64;
}

/* ---- reading ------------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    const char *name;
    dfl_error *err;
} rd;

static int need(rd *r, uint64_t n, const char *what) {
    if (n > r->len - r->pos)
        return dfl_fail(r->err, DFL_EFORMAT,
                        "%s: truncated: %s needs %llu bytes at offset %zu but the file has "
                        "%zu left",
                        r->name, what, (unsigned long long)n, r->pos, r->len - r->pos);
    return 0;
}

static int rd_u32(rd *r, uint32_t *v, const char *what) {
    if (need(r, 4, what)) return DFL_EFORMAT;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return 0;
}

static int rd_u64(rd *r, uint64_t *v, const char *what) {
    if (need(r, 8, what)) return DFL_EFORMAT;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return 0;
}

static int rd_str(rd *r, gguf_str *s, const char *what) {
    uint64_t n;
    if (rd_u64(r, &n, what) || need(r, n, what)) return DFL_EFORMAT;
    s->s = (const char *)r->p + r->pos;
    s->len = n;
    r->pos += n;
    return 0;
}

/* Keys in messages: at most 120 bytes of them. */
#define KEYF "%.*s"
#define KEYA(k) (int)((k).len < 120 ? (k).len : 120), (k).s

static int read_value(rd *r, gguf_kv *kv) {
    uint32_t t;
    if (rd_u32(r, &t, "kv value type")) return DFL_EFORMAT;
    kv->type = t;
    if (t == GGUF_T_STRING) {
        gguf_str s;
        kv->val = r->p + r->pos; /* the length prefix, then the bytes */
        return rd_str(r, &s, "string value");
    }
    if (t != GGUF_T_ARRAY) {
        size_t n = vsize(t);
        if (!n)
            return dfl_fail(r->err, DFL_EFORMAT, "%s: key " KEYF ": unknown value type %u",
                            r->name, KEYA(kv->key), t);
        if (need(r, n, "scalar value")) return DFL_EFORMAT;
        kv->val = r->p + r->pos;
        r->pos += n;
        return 0;
    }
    uint32_t et;
    uint64_t n;
    if (rd_u32(r, &et, "array element type") || rd_u64(r, &n, "array length")) return DFL_EFORMAT;
    kv->arr_type = et;
    kv->arr_n = n;
    kv->val = r->p + r->pos;
    if (et == GGUF_T_ARRAY)
        return dfl_fail(r->err, DFL_EFORMAT, "%s: key " KEYF ": nested arrays are not supported",
                        r->name, KEYA(kv->key));
    if (et == GGUF_T_STRING) {
        if (n > (r->len - r->pos) / 8) /* every string has an 8-byte length */
            return dfl_fail(r->err, DFL_EFORMAT,
                            "%s: key " KEYF ": %llu strings cannot fit in the %zu bytes left",
                            r->name, KEYA(kv->key), (unsigned long long)n, r->len - r->pos);
        kv->strs = xmalloc((n ? n : 1) * sizeof *kv->strs);
        for (uint64_t i = 0; i < n; i++)
            if (rd_str(r, &kv->strs[i], "array string")) return DFL_EFORMAT;
        return 0;
    }
    size_t es = vsize(et);
    if (!es)
        return dfl_fail(r->err, DFL_EFORMAT, "%s: key " KEYF ": unknown array element type %u",
                        r->name, KEYA(kv->key), et);
    if (n > (r->len - r->pos) / es)
        return dfl_fail(r->err, DFL_EFORMAT,
                        "%s: key " KEYF ": %llu elements of %zu bytes run past the end of the "
                        "file",
                        r->name, KEYA(kv->key), (unsigned long long)n, es);
    r->pos += n * es;
    return 0;
}

static int cmp_key(const void *a, const void *b) {
    const gguf_str *x = &(*(const gguf_kv *const *)a)->key, *y = &(*(const gguf_kv *const *)b)->key;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int check_unique_keys(const gguf_file *g, const char *name, dfl_error *err) {
    if (g->n_kv < 2) return 0;
    const gguf_kv **p = xmalloc((size_t)g->n_kv * sizeof *p);
    for (int64_t i = 0; i < g->n_kv; i++) p[i] = &g->kv[i];
    qsort(p, (size_t)g->n_kv, sizeof *p, cmp_key);
    int rc = 0;
    for (int64_t i = 1; i < g->n_kv && !rc; i++)
        if (cmp_key(&p[i - 1], &p[i]) == 0)
            rc = dfl_fail(err, DFL_EFORMAT, "%s: key " KEYF " appears twice", name,
                          KEYA(p[i]->key));
    free(p);
    return rc;
}

static int read_kvs(rd *r, gguf_file *g, uint64_t n_kv) {
    /* smallest kv: 8-byte key length, 4-byte type, 1-byte value */
    if (n_kv > (r->len - r->pos) / 13)
        return dfl_fail(r->err, DFL_EFORMAT, "%s: n_kv = %llu cannot fit in a %zu-byte file",
                        r->name, (unsigned long long)n_kv, r->len);
    g->kv = xcalloc(n_kv ? n_kv : 1, sizeof *g->kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        g->n_kv = (int64_t)i + 1; /* so free() sees every strs built so far */
        if (rd_str(r, &kv->key, "kv key")) return DFL_EFORMAT;
        if (kv->key.len == 0)
            return dfl_fail(r->err, DFL_EFORMAT, "%s: kv pair %llu has an empty key", r->name,
                            (unsigned long long)i);
        int rc = read_value(r, kv);
        if (rc) return rc;
    }
    return check_unique_keys(g, r->name, r->err);
}

/* One tensor info: name, n_dims, ne[n_dims] (innermost first), type, offset. */
static int read_tensor_info(rd *r, gguf_file *g, uint64_t *offset) {
    gguf_str nm;
    uint32_t nd, ty;
    uint64_t ne[DFL_GGUF_MAX_DIMS];
    if (rd_str(r, &nm, "tensor name")) return DFL_EFORMAT;
    dfl_tensor *t = dfl_tensors_push(&g->tensors, r->err);
    if (!t) return DFL_ENOMEM;
    t->name = dfl_name_dup(nm.s, nm.len);
    if (!t->name || nm.len == 0) {
        g->tensors.n--;
        free(t->name);
        return dfl_fail(r->err, DFL_EFORMAT, "%s: tensor %d: name is empty or holds a NUL byte",
                        r->name, g->tensors.n);
    }
    if (rd_u32(r, &nd, "tensor n_dims")) return DFL_EFORMAT;
    if (nd < 1 || nd > DFL_GGUF_MAX_DIMS)
        return dfl_fail(r->err, DFL_EFORMAT, "%s: tensor %s: n_dims = %u (expected 1..%d)",
                        r->name, t->name, nd, DFL_GGUF_MAX_DIMS);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < nd; d++) {
        if (rd_u64(r, &ne[d], "tensor dimension")) return DFL_EFORMAT;
        if (ne[d] == 0 || ne[d] > INT64_MAX || dfl_mul_ok(nel, ne[d], &nel) || nel > INT64_MAX)
            return dfl_fail(r->err, DFL_EFORMAT,
                            "%s: tensor %s: dimension %u = %llu (expected > 0, and the element "
                            "count must fit in 63 bits)",
                            r->name, t->name, d, (unsigned long long)ne[d]);
    }
    if (rd_u32(r, &ty, "tensor type") || rd_u64(r, offset, "tensor offset")) return DFL_EFORMAT;
    int dt = type_from_ggml(ty);
    if (dt < 0)
        return dfl_fail(r->err, DFL_EUNSUP,
                        "%s: tensor %s: GGUF type id %u not supported (f32, f16, bf16, q8_0, "
                        "q4_0, q4_1, q4_k, q6_k are)",
                        r->name, t->name, ty);
    t->type = dt;
    t->n_dims = (int)nd;
    for (uint32_t d = 0; d < nd; d++) t->shape[d] = (int64_t)ne[nd - 1 - d];
    size_t row = dfl_type_row_bytes(t->type, (int64_t)ne[0]);
    if (!row)
        return dfl_fail(r->err, DFL_EFORMAT,
                        "%s: tensor %s: %llu columns is not a multiple of the %s block (%d)",
                        r->name, t->name, (unsigned long long)ne[0], dfl_type_name(t->type),
                        dfl_type_block(t->type));
    if (dfl_mul_ok(row, nel / ne[0], &t->nbytes))
        return dfl_fail(r->err, DFL_EFORMAT, "%s: tensor %s: byte size overflows", r->name,
                        t->name);
    return 0;
}

static int read_alignment(gguf_file *g, const char *name, dfl_error *err) {
    g->alignment = 32;
    const gguf_kv *kv = dfl_gguf_find(g, "general.alignment");
    if (!kv) return 0;
    uint32_t a;
    if (kv->type != GGUF_T_U32)
        return dfl_fail(err, DFL_EFORMAT, "%s: general.alignment has type %u (expected u32)",
                        name, kv->type);
    memcpy(&a, kv->val, 4);
    if (a == 0 || (a & (a - 1)))
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: general.alignment = %u (expected a nonzero power of two)", name, a);
    g->alignment = a;
    return 0;
}

/* Points each tensor into the data section after checking it lies inside. */
static int place_tensors(rd *r, gguf_file *g, const uint64_t *offs) {
    uint64_t a = g->alignment, start = ((uint64_t)r->pos + a - 1) / a * a;
    if (g->tensors.n == 0) return 0;
    if (start > r->len)
        return dfl_fail(r->err, DFL_EFORMAT, "%s: truncated: the data section would start at %llu, "
                        "past the end of the %zu-byte file", r->name,
                        (unsigned long long)start, r->len);
    uint64_t room = r->len - start;
    for (int i = 0; i < g->tensors.n; i++) {
        dfl_tensor *t = &g->tensors.t[i];
        if (offs[i] % a)
            return dfl_fail(r->err, DFL_EFORMAT,
                            "%s: tensor %s: offset %llu is not a multiple of the alignment %llu",
                            r->name, t->name, (unsigned long long)offs[i],
                            (unsigned long long)a);
        if (offs[i] > room || t->nbytes > room - offs[i])
            return dfl_fail(r->err, DFL_EFORMAT,
                            "%s: tensor %s: bytes [%llu, +%llu) run past the end of the data "
                            "section (%llu bytes)",
                            r->name, t->name, (unsigned long long)offs[i],
                            (unsigned long long)t->nbytes, (unsigned long long)room);
        t->data = r->p + start + offs[i];
    }
    return 0;
}

static int parse(rd *r, gguf_file *g) {
    uint32_t magic, ver;
    uint64_t n_t, n_kv;
    if (rd_u32(r, &magic, "magic")) return DFL_EFORMAT;
    if (memcmp(r->p, "GGUF", 4) != 0)
        return dfl_fail(r->err, DFL_EFORMAT, "%s: not a GGUF file (bad magic)", r->name);
    if (rd_u32(r, &ver, "version")) return DFL_EFORMAT;
    if (ver != 2 && ver != 3)
        return dfl_fail(r->err, DFL_EUNSUP, "%s: GGUF version %u (expected 2 or 3)", r->name, ver);
    g->version = ver;
    if (rd_u64(r, &n_t, "n_tensors") || rd_u64(r, &n_kv, "n_kv")) return DFL_EFORMAT;
    /* smallest tensor info: name length, n_dims, one dim, type, offset */
    if (n_t > (r->len - r->pos) / 32 || n_t > INT_MAX)
        return dfl_fail(r->err, DFL_EFORMAT, "%s: n_tensors = %llu cannot fit in a %zu-byte file",
                        r->name, (unsigned long long)n_t, r->len);
    int rc = read_kvs(r, g, n_kv);
    if (rc) return rc;
    if (n_t > (r->len - r->pos) / 32)
        return dfl_fail(r->err, DFL_EFORMAT,
                        "%s: n_tensors = %llu cannot fit in the %zu bytes after the metadata",
                        r->name, (unsigned long long)n_t, r->len - r->pos);
    if ((rc = read_alignment(g, r->name, r->err))) return rc;
    uint64_t *offs = xmalloc((n_t ? n_t : 1) * sizeof *offs);
    for (uint64_t i = 0; i < n_t && !rc; i++) rc = read_tensor_info(r, g, &offs[i]);
    if (!rc) rc = dfl_tensors_check_unique(&g->tensors, r->name, r->err);
    if (!rc) rc = place_tensors(r, g, offs);
    free(offs);
    return rc;
}

int dfl_gguf_parse(const uint8_t *buf, size_t len, const char *name, gguf_file *out,
                   dfl_error *err) {
    memset(out, 0, sizeof *out);
    if (!name) name = "gguf";
    out->tensors.source = strdup(name);
    rd r = {buf, len, 0, name, err};
    int rc = parse(&r, out);
    if (rc) dfl_gguf_free(out);
    return rc;
}

int dfl_gguf_open(const char *path, gguf_file *out, dfl_error *err) {
    memset(out, 0, sizeof *out);
    dfl_mapping m;
    int rc = dfl_map_file(path, &m, err);
    if (rc) return rc;
    rc = dfl_gguf_parse(m.addr, m.len, path, out, err);
    if (rc) {
        munmap(m.addr, m.len);
        return rc;
    }
    return dfl_tensors_add_map(&out->tensors, m, err);
}

void dfl_gguf_free(gguf_file *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv);
    dfl_tensors_free(&g->tensors);
    memset(g, 0, sizeof *g);
}

/* ---- lookups ------------------------------------------------------------ */

const gguf_kv *dfl_gguf_find(const gguf_file *g, const char *key) {
    size_t n = strlen(key);
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.len == n && memcmp(g->kv[i].key.s, key, n) == 0) return &g->kv[i];
    return NULL;
}

/* Integer scalar of any width at p as int64 (u64 above INT64_MAX saturates). */
static int64_t get_int(uint32_t t, const uint8_t *p) {
    switch (t) {
    case GGUF_T_U8: return *p;
    case GGUF_T_I8: return (int8_t)*p;
    case GGUF_T_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_T_I16: { int16_t v; memcpy(&v, p, 2); return v; }
    case GGUF_T_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_T_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case GGUF_T_U64: { uint64_t v; memcpy(&v, p, 8); return v > INT64_MAX ? INT64_MAX : (int64_t)v; }
    case GGUF_T_I64: { int64_t v; memcpy(&v, p, 8); return v; }
    default: return 0;
    }
}

static double get_float(uint32_t t, const uint8_t *p) {
    if (t == GGUF_T_F32) { float v; memcpy(&v, p, 4); return v; }
    if (t == GGUF_T_F64) { double v; memcpy(&v, p, 8); return v; }
    return 0;
}

static const char *src(const gguf_file *g) {
    return g->tensors.source ? g->tensors.source : "gguf";
}

int dfl_gguf_u32(const gguf_file *g, const char *key, uint32_t *out, dfl_error *err) {
    const gguf_kv *kv = dfl_gguf_find(g, key);
    if (!kv) return 1;
    if (!is_int_type(kv->type))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s has type %u (expected an integer)", src(g), key,
                        kv->type);
    int64_t v = get_int(kv->type, kv->val);
    if (v < 0 || v > UINT32_MAX)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %lld (expected 0..%u)", src(g), key,
                        (long long)v, UINT32_MAX);
    *out = (uint32_t)v;
    return 0;
}

int dfl_gguf_f32(const gguf_file *g, const char *key, float *out, dfl_error *err) {
    const gguf_kv *kv = dfl_gguf_find(g, key);
    if (!kv) return 1;
    if (kv->type != GGUF_T_F32 && kv->type != GGUF_T_F64)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s has type %u (expected f32)", src(g), key,
                        kv->type);
    *out = (float)get_float(kv->type, kv->val);
    return 0;
}

int dfl_gguf_bool(const gguf_file *g, const char *key, int *out, dfl_error *err) {
    const gguf_kv *kv = dfl_gguf_find(g, key);
    if (!kv) return 1;
    if (kv->type != GGUF_T_BOOL)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s has type %u (expected bool)", src(g), key,
                        kv->type);
    if (*kv->val > 1)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %u (expected a bool, 0 or 1)", src(g), key,
                        *kv->val);
    *out = *kv->val;
    return 0;
}

int dfl_gguf_str(const gguf_file *g, const char *key, gguf_str *out, dfl_error *err) {
    const gguf_kv *kv = dfl_gguf_find(g, key);
    if (!kv) return 1;
    if (kv->type != GGUF_T_STRING)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s has type %u (expected a string)", src(g), key,
                        kv->type);
    memcpy(&out->len, kv->val, 8);
    out->s = (const char *)kv->val + 8;
    return 0;
}

const gguf_kv *dfl_gguf_arr(const gguf_file *g, const char *key, gguf_vtype elem,
                            dfl_error *err) {
    const gguf_kv *kv = dfl_gguf_find(g, key);
    if (!kv) {
        dfl_fail(err, DFL_EFORMAT, "%s: %s is missing (expected an array)", src(g), key);
        return NULL;
    }
    int ok = kv->type == GGUF_T_ARRAY;
    if (ok && is_int_type(elem)) ok = is_int_type(kv->arr_type);
    else if (ok && elem == GGUF_T_F32) ok = kv->arr_type == GGUF_T_F32 || kv->arr_type == GGUF_T_F64;
    else if (ok) ok = kv->arr_type == elem;
    if (!ok) {
        dfl_fail(err, DFL_EFORMAT, "%s: %s has type %u/%u (expected an array of type %u)",
                 src(g), key, kv->type, kv->type == GGUF_T_ARRAY ? kv->arr_type : 0, elem);
        return NULL;
    }
    return kv;
}

int64_t dfl_gguf_arr_i64(const gguf_kv *kv, uint64_t i) {
    if (i >= kv->arr_n || !is_int_type(kv->arr_type)) return 0;
    return get_int(kv->arr_type, kv->val + i * vsize(kv->arr_type));
}

float dfl_gguf_arr_f32(const gguf_kv *kv, uint64_t i) {
    if (i >= kv->arr_n) return 0;
    return (float)get_float(kv->arr_type, kv->val + i * vsize(kv->arr_type));
}

/* ---- writing ------------------------------------------------------------ */

typedef struct {
    FILE *f;
    int ok;
    uint64_t pos;
} wr;

static void w_bytes(wr *w, const void *p, size_t n) {
    if (w->ok && n && fwrite(p, 1, n, w->f) != n) w->ok = 0;
    w->pos += n;
}
static void w_u32(wr *w, uint32_t v) { w_bytes(w, &v, 4); }
static void w_u64(wr *w, uint64_t v) { w_bytes(w, &v, 8); }
static void w_str(wr *w, const char *s) {
    uint64_t n = strlen(s);
    w_u64(w, n);
    w_bytes(w, s, n);
}
static void w_pad(wr *w, uint64_t align) {
    static const uint8_t zero[64];
    while (w->pos % align) {
        uint64_t n = align - w->pos % align;
        w_bytes(w, zero, n < sizeof zero ? n : sizeof zero);
    }
}

static int w_kv(wr *w, const gguf_wkv *kv, const char *path, dfl_error *err) {
    uint32_t et = kv->type == GGUF_T_ARRAY ? kv->arr_type : kv->type;
    if (!kv->key || (et != GGUF_T_STRING && !vsize(et)) ||
        (kv->type == GGUF_T_ARRAY && et == GGUF_T_ARRAY))
        return dfl_fail(err, DFL_EARG, "%s: kv %s: cannot write value type %u/%u", path,
                        kv->key ? kv->key : "?", kv->type, kv->arr_type);
    w_str(w, kv->key);
    w_u32(w, kv->type);
    if (kv->type == GGUF_T_STRING) {
        w_str(w, kv->val);
    } else if (kv->type != GGUF_T_ARRAY) {
        w_bytes(w, kv->val, vsize(kv->type));
    } else {
        w_u32(w, et);
        w_u64(w, kv->arr_n);
        if (et == GGUF_T_STRING)
            for (uint64_t i = 0; i < kv->arr_n; i++) w_str(w, ((const char *const *)kv->val)[i]);
        else
            w_bytes(w, kv->val, kv->arr_n * vsize(et));
    }
    return 0;
}

/* nbytes the tensor must have for its shape and type; 0 when it cannot be written. */
static uint64_t tensor_bytes(const dfl_tensor *t) {
    if ((unsigned)t->type >= DFL_NTYPES || t->n_dims < 1 || t->n_dims > DFL_GGUF_MAX_DIMS ||
        !t->name)
        return 0;
    uint64_t n = dfl_type_row_bytes(t->type, t->shape[t->n_dims - 1]);
    for (int d = 0; d < t->n_dims - 1; d++)
        if (t->shape[d] <= 0 || dfl_mul_ok(n, (uint64_t)t->shape[d], &n)) return 0;
    return n;
}

int dfl_gguf_write(const char *path, const gguf_wkv *kv, int n_kv, const dfl_tensor *t, int n_t,
                   dfl_error *err) {
    uint64_t align = 32;
    for (int i = 0; i < n_kv; i++)
        if (kv[i].key && strcmp(kv[i].key, "general.alignment") == 0 && kv[i].type == GGUF_T_U32) {
            uint32_t a;
            memcpy(&a, kv[i].val, 4);
            align = a;
        }
    if (align == 0 || (align & (align - 1)))
        return dfl_fail(err, DFL_EARG, "%s: general.alignment must be a power of two", path);
    for (int i = 0; i < n_t; i++)
        if (!tensor_bytes(&t[i]) || tensor_bytes(&t[i]) != t[i].nbytes || !t[i].data)
            return dfl_fail(err, DFL_EARG, "%s: tensor %s: nbytes %llu does not match its %s shape",
                            path, t[i].name ? t[i].name : "?", (unsigned long long)t[i].nbytes,
                            dfl_type_name(t[i].type));
    wr w = {fopen(path, "wb"), 1, 0};
    if (!w.f) return dfl_fail(err, DFL_EIO, "%s: cannot create: %s", path, strerror(errno));
    w_bytes(&w, "GGUF", 4);
    w_u32(&w, 3);
    w_u64(&w, (uint64_t)n_t);
    w_u64(&w, (uint64_t)n_kv);
    int rc = 0;
    for (int i = 0; i < n_kv && !rc; i++) rc = w_kv(&w, &kv[i], path, err);
    uint64_t off = 0;
    for (int i = 0; i < n_t && !rc; i++) {
        w_str(&w, t[i].name);
        w_u32(&w, (uint32_t)t[i].n_dims);
        for (int d = t[i].n_dims - 1; d >= 0; d--) w_u64(&w, (uint64_t)t[i].shape[d]);
        w_u32(&w, ggml_id[t[i].type]);
        w_u64(&w, off);
        off = (off + t[i].nbytes + align - 1) / align * align;
    }
    for (int i = 0; i < n_t && !rc; i++) {
        w_pad(&w, align);
        w_bytes(&w, t[i].data, t[i].nbytes);
    }
    if (fclose(w.f) != 0) w.ok = 0;
    if (!rc && !w.ok) rc = dfl_fail(err, DFL_EIO, "%s: write failed: %s", path, strerror(errno));
    if (rc) remove(path); /* no half-written file left behind */
    return rc;
}
