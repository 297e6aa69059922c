/* config_json.h - config.json readers shared by the families' config code
 * (config.c, laguna.c): range-checked getters that name the field in errors. */
#ifndef DFL_CONFIG_JSON_H
#define DFL_CONFIG_JSON_H

#include <cjson/cJSON.h>

#include "io/io.h"
#include "models/model.h"

/* Limits: generous for real models, small enough that products of two of
 * them never overflow an int and no allocation they size is absurd. */
enum {
    MAX_LAYERS = DFL_MAX_LAYERS, MAX_DIM = 65536, MAX_HEADS = 1024, MAX_HEAD_DIM = DFL_MAX_HEAD_DIM,
    MAX_FFN = 1048576, MAX_VOCAB = 4000000, MAX_CTX = 16 << 20,
    MAX_EXPERTS = DFL_MAX_EXPERTS,
    MAX_WINDOW = 1 << 20   /* sliding_window: keys a sliding layer attends */
};
static const float F_MAX = 3.0e38f;

/* rc of a getter: 0 ok, 1 absent (fine for optional keys), < 0 error. */
#define TRY(x)                    \
    do {                          \
        int rc_ = (x);            \
        if (rc_ < 0) return rc_;  \
    } while (0)

#define need_int dfl_cfg_need_int
#define opt_int dfl_cfg_opt_int
#define opt_float dfl_cfg_opt_float
#define cfg_rope dfl_cfg_rope
int need_int(const cJSON *j, const char *key, int64_t lo, int64_t hi, int *out, const char *file,
             dfl_error *err);
int opt_int(const cJSON *j, const char *key, int64_t lo, int64_t hi, int *out, const char *file,
            dfl_error *err);
int opt_float(const cJSON *j, const char *key, double lo, double hi, float *out, const char *file,
              dfl_error *err);
/* key: a list of n names, each zero or one; out[l] gets 0 or 1. Returns 1 when
 * absent (or null), an error naming the entry when one is neither. */
#define cfg_name_list dfl_cfg_name_list
int cfg_name_list(const cJSON *j, const char *key, int n, const char *zero, const char *one,
                  unsigned char *out, const char *file, dfl_error *err);
/* One RoPE object (rope_parameters / rope_scaling, or a per-layer-type entry
 * of one): theta, scaling type and factors into c's rope fields. */
int cfg_rope(const cJSON *r, const char *key, dfl_config *c, const char *file, dfl_error *err);

/* GGUF metadata keys under the architecture's name ("<arch>.<suffix>"). */
typedef struct {
    const gguf_file *g;
    const char *arch;
    char key[160];       /* the last key asked for */
} gkeys;
#define akey dfl_cfg_akey
#define g_int dfl_cfg_g_int
#define g_float dfl_cfg_g_float
const char *akey(gkeys *k, const char *suffix);
/* rc as the JSON getters; required: absence is an error naming the key. */
int g_int(gkeys *k, const char *suffix, int required, int64_t lo, int64_t hi, int *out,
          dfl_error *err);
int g_float(gkeys *k, const char *suffix, float *out, dfl_error *err);

/* Laguna's own fields (laguna_config.c), after the common ones: from
 * config.json, and from GGUF metadata as llama.cpp's converter writes it. */
int dfl_laguna_config(const cJSON *j, dfl_config *c, const char *file, dfl_error *err);
int dfl_laguna_config_gguf(gkeys *k, dfl_config *c, dfl_error *err);

#endif
