/* io.h - untrusted model files: safetensors, GGUF, Hugging Face config.json.
 *
 * Every loader produces the same thing: a table of named tensors whose data
 * points into read-only mmaps, plus (GGUF) a metadata store. Nothing here
 * knows about model families; src/models maps names to fields. */
#ifndef DFL_IO_H
#define DFL_IO_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Dims of a tensor: GGUF has at most 4; a safetensors file may hold 5-D ones
 * (a multimodal checkpoint's video patch embedding, skipped but parsed). */
enum { DFL_MAX_DIMS = 5, DFL_GGUF_MAX_DIMS = 4 };

typedef struct dfl_tensor {
    char *name;
    dfl_type type;
    int n_dims;
    int64_t shape[DFL_MAX_DIMS]; /* outermost first, PyTorch order: a Linear is [out, in] */
    const void *data;            /* inside a mapping, checked to lie within its file */
    uint64_t nbytes;
    int used;                    /* set by the model loader; leftovers are refused */
} dfl_tensor;

typedef struct dfl_mapping {
    void *addr;
    size_t len;
} dfl_mapping;

typedef struct dfl_tensors {
    dfl_tensor *t;
    int n;
    dfl_mapping *maps;
    int n_maps;
    size_t cap_t, cap_maps;      /* allocated entries of t, maps */
    char *source;                /* path for messages */
} dfl_tensors;

void dfl_tensors_free(dfl_tensors *ts);
/* Replaces each file mapping of ts with an anonymous copy at the same address,
 * in transparent huge pages where the kernel has them: a decode step then
 * walks far fewer page-table entries than over the file's 4 KB pages, at the
 * cost of reading the file once at load and holding the copy in memory. */
int dfl_tensors_copy_maps(dfl_tensors *ts, dfl_error *err);
/* Whether that copy takes at most half of the memory this process may still
 * take: MemAvailable, and no more than its cgroup's limit less its usage (v2,
 * else v1; see types.c). Where a default makes the copy, a model that would
 * crowd the machine's memory stays read in place. */
int dfl_tensors_copy_fits(const dfl_tensors *ts);
/* Makes the bytes [p, p + n) of one of ts's mappings writable (1) or
 * read-only again (0), whole pages; 0 when done, -1 when they lie in none of
 * them or the kernel refused. A file's pages are copied as they are written
 * (private mappings): the file never changes. */
int dfl_tensors_protect(dfl_tensors *ts, const void *p, size_t n, int writable);
/* Finds a tensor by exact name; NULL if absent. */
dfl_tensor *dfl_tensors_find(dfl_tensors *ts, const char *name);

/* ---- safetensors -------------------------------------------------------- */
/* Opens a folder: model.safetensors, or the shards named by
 * model.safetensors.index.json. Duplicate names across shards are refused. */
int dfl_safetensors_open_dir(const char *dir, dfl_tensors *out, dfl_error *err);
/* One file (all tensors appended to out, which may already hold some). */
int dfl_safetensors_open(const char *path, dfl_tensors *out, dfl_error *err);
/* Parses a header already in memory (the fuzz target's entry): buf holds the
 * whole file; tensors point into buf. */
int dfl_safetensors_parse(const uint8_t *buf, size_t len, const char *name, dfl_tensors *out,
                          dfl_error *err);
/* Writes a safetensors file (tools and tests): tensors given as table rows. */
int dfl_safetensors_write(const char *path, const dfl_tensor *t, int n, dfl_error *err);

/* ---- GGUF --------------------------------------------------------------- */

typedef enum {
    GGUF_T_U8 = 0, GGUF_T_I8 = 1, GGUF_T_U16 = 2, GGUF_T_I16 = 3, GGUF_T_U32 = 4,
    GGUF_T_I32 = 5, GGUF_T_F32 = 6, GGUF_T_BOOL = 7, GGUF_T_STRING = 8, GGUF_T_ARRAY = 9,
    GGUF_T_U64 = 10, GGUF_T_I64 = 11, GGUF_T_F64 = 12
} gguf_vtype;

typedef struct gguf_str { const char *s; uint64_t len; } gguf_str; /* not NUL-terminated */

typedef struct gguf_kv {
    gguf_str key;
    gguf_vtype type;
    gguf_vtype arr_type;     /* for arrays */
    uint64_t arr_n;          /* for arrays */
    const uint8_t *val;      /* scalar value, or the first array element */
    gguf_str *strs;          /* string arrays: arr_n entries, built at parse */
} gguf_kv;

typedef struct gguf_file {
    uint32_t version;
    gguf_kv *kv;
    int64_t n_kv;
    dfl_tensors tensors;     /* data pointers into the mapping */
    uint64_t alignment;
} gguf_file;

int dfl_gguf_open(const char *path, gguf_file *out, dfl_error *err);
int dfl_gguf_parse(const uint8_t *buf, size_t len, const char *name, gguf_file *out,
                   dfl_error *err);
void dfl_gguf_free(gguf_file *g);
const gguf_kv *dfl_gguf_find(const gguf_file *g, const char *key);
/* Typed getters: 0 ok, DFL_EFORMAT when present with a wrong type or out of
 * range (message names the key), 1 when absent (out untouched). */
int dfl_gguf_u32(const gguf_file *g, const char *key, uint32_t *out, dfl_error *err);
int dfl_gguf_f32(const gguf_file *g, const char *key, float *out, dfl_error *err);
int dfl_gguf_bool(const gguf_file *g, const char *key, int *out, dfl_error *err);
int dfl_gguf_str(const gguf_file *g, const char *key, gguf_str *out, dfl_error *err);
/* Array of the given element type (any integer width accepted for int arrays
 * via dfl_gguf_arr_i64); returns the kv or NULL and sets err when wrong. */
const gguf_kv *dfl_gguf_arr(const gguf_file *g, const char *key, gguf_vtype elem, dfl_error *err);
int64_t dfl_gguf_arr_i64(const gguf_kv *kv, uint64_t i); /* integer element i as int64 */
float dfl_gguf_arr_f32(const gguf_kv *kv, uint64_t i);

/* dfl_quantize_gguf (dflash.h): a GGUF rewritten with its matrices in another type. */
int dfl_gguf_quantize(const dfl_quantize_opts *o, dfl_quantize_result *res, dfl_error *err);

/* Writes GGUF v3 (dflash quantize, tests): kv pairs and tensors. */
typedef struct gguf_wkv {
    const char *key;
    gguf_vtype type;
    gguf_vtype arr_type;
    uint64_t arr_n;
    const void *val;         /* scalar, or array of arr_n elements; strings as const char* */
} gguf_wkv;
int dfl_gguf_write(const char *path, const gguf_wkv *kv, int n_kv, const dfl_tensor *t, int n_t,
                   dfl_error *err);

/* ---- JSON (config.json etc.) -------------------------------------------- */
/* Thin checked access over cJSON: getters name the file and key on error. */
struct cJSON;
struct cJSON *dfl_json_parse_file(const char *path, size_t max_bytes, dfl_error *err);
/* Depth-limited parse of a buffer (untrusted: refuses nesting deeper than 64). */
struct cJSON *dfl_json_parse(const char *buf, size_t len, const char *name, dfl_error *err);
/* 0 ok; 1 absent (out untouched); DFL_EFORMAT wrong type or outside [lo, hi]. */
int dfl_json_int(const struct cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                 const char *file, dfl_error *err);
int dfl_json_num(const struct cJSON *o, const char *key, double lo, double hi, double *out,
                 const char *file, dfl_error *err);
int dfl_json_bool(const struct cJSON *o, const char *key, int *out, const char *file,
                  dfl_error *err);
const char *dfl_json_str(const struct cJSON *o, const char *key); /* NULL if absent/not string */

#endif
