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
    MAX_EXPERTS = DFL_MAX_EXPERTS, MAX_CONV = DFL_MAX_CONV,
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
/* Rotated dims (suffix, default hd: even, 2..hd) as a partial factor in the
 * middle of the dims' interval, so config.c's int(head_dim * factor) gives
 * them back whatever the rounding. */
/* suffix as one bool per layer (n entries) into out (no / yes); 1 when
 * absent or not an array (the caller may read another form). */
#define g_bools dfl_cfg_g_bools
int g_bools(gkeys *k, const char *suffix, int n, int no, int yes, unsigned char *out,
            dfl_error *err);
#define g_rot dfl_cfg_g_rot
int g_rot(gkeys *k, const char *suffix, int hd, float *partial, dfl_error *err);

/* Laguna's own fields (laguna_config.c), after the common ones: from
 * config.json, and from GGUF metadata as llama.cpp's converter writes it. */
/* Qwen3.5's text fields: the object itself, or its text_config when the
 * checkpoint is the multimodal class (qwen35_config.c). */
const cJSON *dfl_qwen35_text(const cJSON *j);
/* Qwen3.5's own fields after the common ones (layer_types in place of
 * hf_layer_types); top is the file's object (tie_word_embeddings). */
int dfl_qwen35_config(const cJSON *j, const cJSON *top, dfl_config *c, const char *file,
                      dfl_error *err);
/* The Qwen MoE fields (qwen35_config.c): Qwen3-MoE and Qwen3-Next (sparse layers by
 * mlp_only_layers and decoder_sparse_step, norm_topk_prob), Qwen3.5-MoE (every layer,
 * renormalised); a softmax router, the hybrids' shared expert. Absent num_experts: dense. */
int dfl_qwen_moe_config(const cJSON *j, dfl_config *c, const char *file, dfl_error *err);
/* The same from GGUF metadata in llama.cpp's layout (qwen35, qwen35moe,
 * qwen3next; qwen3moe), after the common keys. */
int dfl_qwen35_config_gguf(gkeys *k, dfl_config *c, dfl_error *err);
int dfl_qwen_moe_config_gguf(gkeys *k, dfl_config *c, dfl_error *err);
/* Laguna's own fields (laguna.c), after the common ones. */
int dfl_laguna_config(const cJSON *j, dfl_config *c, const char *file, dfl_error *err);
int dfl_laguna_config_gguf(gkeys *k, dfl_config *c, dfl_error *err);

#endif
