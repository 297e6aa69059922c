/* safetensors.c - Hugging Face safetensors reader (single file or sharded
 * folder) and writer.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
 * then the data section; offsets are relative to its start. The file is
 * untrusted: N, every shape and every offset range is checked before use. */
#include "io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "io_private.h"

#define MAX_HEADER ((uint64_t)100 << 20) /* the format's own limit */
#define MAX_INDEX ((size_t)64 << 20)

static const struct { const char *name; dfl_type t; } dtypes[] = {
    {"F32", DFL_F32}, {"F16", DFL_F16}, {"BF16", DFL_BF16},
};

/* ---- reading ------------------------------------------------------------ */

/* A JSON number that is a whole number in [0, 2^53]; -1 otherwise. */
static int64_t json_u53(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0 && d == floor(d))) return -1;
    return (int64_t)d;
}

static int read_dtype(const cJSON *e, const char *src, const char *name, dfl_type *t,
                      dfl_error *err) {
    const char *s = dfl_json_str(e, "dtype");
    if (!s)
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: dtype is missing or not a string", src,
                        name);
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(s, dtypes[i].name) == 0) {
            *t = dtypes[i].t;
            return 0;
        }
    return dfl_fail(err, DFL_EUNSUP,
                    "%s: tensor %s: dtype %.40s not supported (F32, F16, BF16 are)", src, name, s);
}

/* shape: 0..DFL_MAX_DIMS non-negative dims; sets t->n_dims, t->shape; the element count. */
static int read_shape(const cJSON *e, const char *src, dfl_tensor *t, uint64_t *nel,
                      dfl_error *err) {
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(sh))
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: shape is missing or not a list", src,
                        t->name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > DFL_MAX_DIMS)
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: %d dimensions (at most %d supported)",
                        src, t->name, nd, DFL_MAX_DIMS);
    *nel = 1;
    int d = 0;
    for (const cJSON *v = sh->child; v; v = v->next, d++) {
        int64_t x = json_u53(v);
        if (x < 0 || dfl_mul_ok(*nel, (uint64_t)x, nel) || *nel > INT64_MAX)
            return dfl_fail(err, DFL_EFORMAT,
                            "%s: tensor %s: shape[%d] is not a non-negative integer, or the "
                            "element count overflows",
                            src, t->name, d);
        t->shape[d] = x;
    }
    t->n_dims = nd;
    return 0;
}

static int read_offsets(const cJSON *e, const char *src, dfl_tensor *t, uint64_t nel,
                        uint64_t data_len, uint64_t *begin, dfl_error *err) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(o) || cJSON_GetArraySize(o) != 2)
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: data_offsets is not a [begin, end] pair",
                        src, t->name);
    int64_t b = json_u53(cJSON_GetArrayItem(o, 0)), en = json_u53(cJSON_GetArrayItem(o, 1));
    if (b < 0 || en < b || (uint64_t)en > data_len)
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: tensor %s: data_offsets [%lld, %lld] outside the %llu-byte data "
                        "section",
                        src, t->name, (long long)b, (long long)en, (unsigned long long)data_len);
    uint64_t need;
    if (dfl_mul_ok(nel, dfl_type_block_bytes(t->type), &need) || need != (uint64_t)(en - b))
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: tensor %s: data_offsets span %lld bytes but shape and dtype need %llu",
                        src, t->name, (long long)(en - b), (unsigned long long)need);
    *begin = (uint64_t)b;
    t->nbytes = need;
    return 0;
}

typedef struct { uint64_t begin, end; const char *name; } span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* Tensors ts->t[from..n) must not share bytes. */
static int check_overlap(const dfl_tensors *ts, int from, const uint8_t *data, const char *src,
                         dfl_error *err) {
    int n = ts->n - from, rc = 0;
    if (n < 2) return 0;
    span *s = xmalloc((size_t)n * sizeof *s);
    for (int i = 0; i < n; i++) {
        const dfl_tensor *t = &ts->t[from + i];
        s[i].begin = (uint64_t)((const uint8_t *)t->data - data);
        s[i].end = s[i].begin + t->nbytes;
        s[i].name = t->name;
    }
    qsort(s, n, sizeof *s, cmp_span);
    for (int i = 1; i < n && !rc; i++)
        if (s[i].begin < s[i - 1].end)
            rc = dfl_fail(err, DFL_EFORMAT, "%s: tensors %s and %s overlap in the data section",
                          src, s[i - 1].name, s[i].name);
    free(s);
    return rc;
}

static int read_entry(const cJSON *e, const char *src, const uint8_t *data, uint64_t data_len,
                      dfl_tensors *out, dfl_error *err) {
    const char *name = e->string;
    if (!name || !*name)
        return dfl_fail(err, DFL_EFORMAT, "%s: a tensor has an empty name", src);
    if (!cJSON_IsObject(e))
        return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: entry is not an object", src, name);
    dfl_tensor *t = dfl_tensors_push(out, err);
    if (!t) return DFL_ENOMEM;
    t->name = strdup(name);
    uint64_t nel = 0, begin = 0;
    int rc = read_dtype(e, src, name, &t->type, err);
    if (!rc) rc = read_shape(e, src, t, &nel, err);
    if (!rc) rc = read_offsets(e, src, t, nel, data_len, &begin, err);
    if (!rc) t->data = data + begin;
    return rc;
}

static int parse_into(const uint8_t *buf, size_t len, const char *src, dfl_tensors *out,
                      dfl_error *err) {
    uint64_t n;
    if (len < 8)
        return dfl_fail(err, DFL_EFORMAT, "%s: truncated: %zu bytes, fewer than the 8-byte "
                        "header length", src, len);
    memcpy(&n, buf, 8);
    if (n > MAX_HEADER || n > len - 8)
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: header length %llu is past the end of the %zu-byte file (or over "
                        "the 100 MB limit)",
                        src, (unsigned long long)n, len);
    cJSON *j = dfl_json_parse((const char *)buf + 8, (size_t)n, src, err);
    if (!j) return err ? err->code : DFL_EFORMAT;
    int rc = 0, from = out->n;
    if (!cJSON_IsObject(j)) rc = dfl_fail(err, DFL_EFORMAT, "%s: header is not a JSON object", src);
    const uint8_t *data = buf + 8 + n;
    for (const cJSON *e = rc ? NULL : j->child; e && !rc; e = e->next)
        if (!e->string || strcmp(e->string, "__metadata__") != 0)
            rc = read_entry(e, src, data, len - 8 - n, out, err);
    cJSON_Delete(j);
    if (!rc) rc = check_overlap(out, from, data, src, err);
    return rc;
}

/* Drops rows [from, n) after a failed parse so out stays consistent. */
static void truncate_table(dfl_tensors *ts, int from) {
    for (int i = from; i < ts->n; i++) free(ts->t[i].name);
    ts->n = from;
}

int dfl_safetensors_parse(const uint8_t *buf, size_t len, const char *name, dfl_tensors *out,
                          dfl_error *err) {
    if (!name) name = "safetensors";
    if (!out->source) out->source = strdup(name);
    int from = out->n;
    int rc = parse_into(buf, len, name, out, err);
    if (!rc) rc = dfl_tensors_check_unique(out, name, err);
    if (rc) truncate_table(out, from);
    return rc;
}

int dfl_safetensors_open(const char *path, dfl_tensors *out, dfl_error *err) {
    dfl_mapping m;
    int rc = dfl_map_file(path, &m, err);
    if (rc) return rc;
    rc = dfl_safetensors_parse(m.addr, m.len, path, out, err);
    if (rc) {
        munmap(m.addr, m.len);
        return rc;
    }
    return dfl_tensors_add_map(out, m, err);
}

/* ---- sharded folders ---------------------------------------------------- */

typedef struct { const char *tensor, *shard; } mapent;

static int cmp_mapent(const void *a, const void *b) {
    return strcmp(((const mapent *)a)->tensor, ((const mapent *)b)->tensor);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard must be a file in the folder itself: no paths, no "..". */
static int plain_name(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 256 && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") != 0 &&
           strcmp(s, "..") != 0;
}

static int join(char *buf, size_t cap, const char *dir, const char *file, dfl_error *err) {
    if ((size_t)snprintf(buf, cap, "%s/%s", dir, file) >= cap)
        return dfl_fail(err, DFL_EARG, "%s: path too long", dir);
    return 0;
}

/* weight_map -> sorted (tensor, shard) pairs and the sorted distinct shard names. */
static int read_weight_map(const cJSON *j, const char *src, mapent **map, int *n_map,
                           const char ***shards, int *n_shards, dfl_error *err) {
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm))
        return dfl_fail(err, DFL_EFORMAT, "%s: weight_map is missing or not an object", src);
    int n = cJSON_GetArraySize(wm), k = 0;
    *map = xmalloc((size_t)(n ? n : 1) * sizeof **map);
    *shards = xmalloc((size_t)(n ? n : 1) * sizeof **shards);
    for (const cJSON *e = wm->child; e; e = e->next, k++) {
        if (!cJSON_IsString(e) || !plain_name(e->valuestring))
            return dfl_fail(err, DFL_EFORMAT,
                            "%s: weight_map[%.200s]: shard must be a plain file name in the "
                            "folder (no '/' or '..')",
                            src, e->string ? e->string : "");
        (*map)[k] = (mapent){e->string, e->valuestring};
        (*shards)[k] = e->valuestring;
    }
    *n_map = k;
    qsort(*map, k, sizeof **map, cmp_mapent);
    for (int i = 1; i < k; i++)
        if (strcmp((*map)[i - 1].tensor, (*map)[i].tensor) == 0)
            return dfl_fail(err, DFL_EFORMAT, "%s: weight_map lists tensor %s twice", src,
                            (*map)[i].tensor);
    qsort(*shards, k, sizeof **shards, cmp_str);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (u == 0 || strcmp((*shards)[u - 1], (*shards)[i]) != 0) (*shards)[u++] = (*shards)[i];
    *n_shards = u;
    return 0;
}

/* Every tensor of shard s must be mapped to s; every mapped tensor must exist. */
static int check_map(const dfl_tensors *ts, const int *shard_of, const char **shards,
                     const mapent *map, int n_map, const char *src, dfl_error *err) {
    for (int i = 0; i < ts->n; i++) {
        mapent key = {ts->t[i].name, NULL};
        const mapent *m = bsearch(&key, map, n_map, sizeof *map, cmp_mapent);
        const char *sh = shards[shard_of[i]];
        if (!m)
            return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s is in shard %s but not in "
                            "weight_map", src, ts->t[i].name, sh);
        if (strcmp(m->shard, sh) != 0)
            return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s is in shard %s but weight_map says "
                            "%s", src, ts->t[i].name, sh, m->shard);
    }
    int found = 0;
    for (int i = 0; i < n_map; i++)
        found += dfl_tensors_find((dfl_tensors *)ts, map[i].tensor) != NULL;
    if (found == n_map) return 0;
    for (int i = 0; i < n_map; i++)
        if (!dfl_tensors_find((dfl_tensors *)ts, map[i].tensor))
            return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s listed in weight_map is missing "
                            "from shard %s", src, map[i].tensor, map[i].shard);
    return 0;
}

static int open_sharded(const char *dir, const char *index, dfl_tensors *out, dfl_error *err) {
    cJSON *j = dfl_json_parse_file(index, MAX_INDEX, err);
    if (!j) return err ? err->code : DFL_EFORMAT;
    mapent *map = NULL;
    const char **shards = NULL;
    int n_map = 0, n_sh = 0, *shard_of = NULL;
    size_t cap_sh = 0;
    int rc = read_weight_map(j, index, &map, &n_map, &shards, &n_sh, err);
    if (!rc && !(shard_of = dfl_grow(NULL, &cap_sh, (size_t)(n_map ? n_map : 1), sizeof *shard_of,
                                     "the shard table", err)))
        rc = DFL_ENOMEM;
    for (int s = 0; s < n_sh && !rc; s++) {
        char path[4096];
        int from = out->n;
        rc = join(path, sizeof path, dir, shards[s], err);
        if (!rc) rc = dfl_safetensors_open(path, out, err);
        if (!rc) { /* room for every tensor: more than the map lists when some are unmapped */
            int *p = dfl_grow(shard_of, &cap_sh, (size_t)out->n, sizeof *p, "the shard table", err);
            if (p) shard_of = p;
            else rc = DFL_ENOMEM;
        }
        for (int i = from; !rc && i < out->n; i++) shard_of[i] = s;
    }
    if (!rc) rc = check_map(out, shard_of, shards, map, n_map, index, err);
    free(shard_of);
    free(map);
    free(shards);
    cJSON_Delete(j);
    return rc;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int dfl_safetensors_open_dir(const char *dir, dfl_tensors *out, dfl_error *err) {
    memset(out, 0, sizeof *out);
    char path[4096];
    out->source = strdup(dir);
    int rc = join(path, sizeof path, dir, "model.safetensors.index.json", err);
    if (!rc && exists(path)) {
        rc = open_sharded(dir, path, out, err);
    } else if (!rc) {
        rc = join(path, sizeof path, dir, "model.safetensors", err);
        if (!rc && !exists(path))
            rc = dfl_fail(err, DFL_EIO, "%s: no model.safetensors or "
                          "model.safetensors.index.json in this folder", dir);
        if (!rc) rc = dfl_safetensors_open(path, out, err);
    }
    if (rc) dfl_tensors_free(out);
    return rc;
}

/* ---- writing ------------------------------------------------------------ */

static cJSON *header_json(const dfl_tensor *t, int n, uint64_t *total, const char *path,
                          dfl_error *err) {
    cJSON *h = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const char *dt = NULL;
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
            if (dtypes[k].t == t[i].type) dt = dtypes[k].name;
        uint64_t nel = 1;
        for (int d = 0; d < t[i].n_dims; d++) nel *= (uint64_t)t[i].shape[d];
        if (!dt || t[i].n_dims < 0 || t[i].n_dims > DFL_MAX_DIMS || !t[i].name ||
            nel * dfl_type_block_bytes(t[i].type) != t[i].nbytes || (t[i].nbytes && !t[i].data)) {
            dfl_fail(err, DFL_EARG, "%s: tensor %s: cannot write (type %s, %llu bytes; only "
                     "f32/f16/bf16 with nbytes matching the shape)", path,
                     t[i].name ? t[i].name : "?", dfl_type_name(t[i].type),
                     (unsigned long long)t[i].nbytes);
            cJSON_Delete(h);
            return NULL;
        }
        cJSON *e = cJSON_AddObjectToObject(h, t[i].name);
        cJSON_AddStringToObject(e, "dtype", dt);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].n_dims; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t[i].nbytes)));
        off += t[i].nbytes;
    }
    *total = off;
    return h;
}

int dfl_safetensors_write(const char *path, const dfl_tensor *t, int n, dfl_error *err) {
    uint64_t total;
    cJSON *h = header_json(t, n, &total, path, err);
    if (!h) return DFL_EARG;
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    /* pad the header with spaces so the data section starts 8-byte aligned */
    uint64_t hn = strlen(js), padded = (hn + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(js);
        return dfl_fail(err, DFL_EIO, "%s: cannot create: %s", path, strerror(errno));
    }
    int ok = fwrite(&padded, 8, 1, f) == 1 && fwrite(js, 1, hn, f) == hn;
    for (uint64_t i = hn; i < padded && ok; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; i < n && ok; i++)
        ok = t[i].nbytes == 0 || fwrite(t[i].data, 1, t[i].nbytes, f) == t[i].nbytes;
    free(js);
    if (fclose(f) != 0) ok = 0;
    if (!ok) return dfl_fail(err, DFL_EIO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
