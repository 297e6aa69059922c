/* config.c - model hyperparameters from a Hugging Face config.json or GGUF
 * metadata, range-checked, and the RoPE frequency table they imply.
 *
 * Defaults follow the transformers config classes (LlamaConfig, Qwen2Config,
 * Qwen3Config); RoPE scaling follows transformers' modeling_rope_utils. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "models/model.h"
#include "models/config_json.h"

const char *dfl_arch_name(int a) {
    return a == ARCH_LLAMA ? "llama" : a == ARCH_QWEN2 ? "qwen2" : a == ARCH_QWEN3 ? "qwen3"
         : a == ARCH_LAGUNA ? "laguna" : a == ARCH_QWEN35 ? "qwen35"
         : a == ARCH_QWEN3_NEXT ? "qwen3next" : a == ARCH_QWEN3_MOE ? "qwen3moe" : "?";
}

/* ---- validation --------------------------------------------------------- */

#define RANGE(v, lo, hi, field)                                                              \
    if ((v) < (lo) || (v) > (hi))                                                            \
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %lld (expected %lld..%lld)", src, field,  \
                        (long long)(v), (long long)(lo), (long long)(hi));
#define POSITIVE(v, field)                                                                   \
    if (!isfinite(v) || !((v) > 0))                                                          \
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %g (expected a finite number > 0)", src,   \
                        field, (double)(v));

static int validate_rope(const dfl_config *c, const char *src, dfl_error *err) {
    switch (c->rope_scale_type) {
    case ROPE_SCALE_NONE: return 0;
    case ROPE_SCALE_LINEAR: POSITIVE(c->rope_factor, "rope_scaling.factor"); return 0;
    case ROPE_SCALE_LLAMA3:
        POSITIVE(c->rope_factor, "rope_scaling.factor");
        POSITIVE(c->rope_low_freq, "rope_scaling.low_freq_factor");
        POSITIVE(c->rope_high_freq, "rope_scaling.high_freq_factor");
        if (!(c->rope_high_freq > c->rope_low_freq))
            return dfl_fail(err, DFL_EFORMAT,
                            "%s: rope_scaling.high_freq_factor = %g must exceed low_freq_factor "
                            "= %g", src, c->rope_high_freq, c->rope_low_freq);
        RANGE(c->rope_orig_ctx, 1, MAX_CTX, "rope_scaling.original_max_position_embeddings");
        return 0;
    case ROPE_SCALE_YARN:
        POSITIVE(c->rope_factor, "rope_scaling.factor");
        POSITIVE(c->rope_beta_fast, "rope_scaling.beta_fast");
        POSITIVE(c->rope_beta_slow, "rope_scaling.beta_slow");
        POSITIVE(c->rope_attn_factor, "rope_scaling.attention_factor");
        if (!(c->rope_theta > 1)) /* the correction range divides by log(theta) */
            return dfl_fail(err, DFL_EFORMAT, "%s: rope_theta = %g (yarn needs > 1)", src,
                            c->rope_theta);
        RANGE(c->rope_orig_ctx, 1, MAX_CTX, "rope_scaling.original_max_position_embeddings");
        return 0;
    default:
        return dfl_fail(err, DFL_EFORMAT, "%s: rope scaling type %d unknown", src,
                        c->rope_scale_type);
    }
}

/* Gated DeltaNet layers: only Qwen3.5 has them, and their shapes must fit. */
static int validate_recurrent(const dfl_config *c, const char *src, dfl_error *err) {
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) {
        RANGE(c->layer_kind[l], DFL_LAYER_FULL, DFL_LAYER_RECURRENT, "layer_types");
        any |= c->layer_kind[l] == DFL_LAYER_RECURRENT;
    }
    if (!any) return 0;
    if (!DFL_ARCH_HYBRID(c->arch))
        return dfl_fail(err, DFL_EFORMAT, "%s: linear_attention layers need a Qwen3.5 or "
                        "Qwen3-Next model", src);
    RANGE(c->lin_conv, 1, DFL_MAX_CONV, "linear_conv_kernel_dim");
    RANGE(c->lin_k_heads, 1, MAX_HEADS, "linear_num_key_heads");
    RANGE(c->lin_v_heads, 1, MAX_HEADS, "linear_num_value_heads");
    RANGE(c->lin_k_dim, 1, MAX_HEAD_DIM, "linear_key_head_dim");
    RANGE(c->lin_v_dim, 1, MAX_HEAD_DIM, "linear_value_head_dim");
    if (c->lin_v_heads % c->lin_k_heads)
        return dfl_fail(err, DFL_EFORMAT, "%s: linear_num_value_heads = %d is not a multiple of "
                        "linear_num_key_heads = %d", src, c->lin_v_heads, c->lin_k_heads);
    return 0;
}

/* Rotated dims of a head: partial rotary turns the first head_dim * partial
 * (transformers: int(head_dim * partial_rotary_factor)). */
static int rot_dims(int hd, float partial) {
    return (partial > 0 && partial < 1 ? (int)(hd * (double)partial) : hd) & ~1;
}

int dfl_config_validate(const dfl_config *c, const char *src, dfl_error *err) {
    if (!src) src = "config";
    RANGE(c->arch, ARCH_LLAMA, ARCH_QWEN3_MOE, "arch");
    RANGE(c->n_layers, 1, MAX_LAYERS, "num_hidden_layers");
    RANGE(c->dim, 1, MAX_DIM, "hidden_size");
    RANGE(c->n_heads, 1, MAX_HEADS, "num_attention_heads");
    RANGE(c->n_kv_heads, 1, c->n_heads, "num_key_value_heads");
    if (c->n_heads % c->n_kv_heads)
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: num_attention_heads = %d is not a multiple of num_key_value_heads = "
                        "%d (grouped-query attention needs whole groups)",
                        src, c->n_heads, c->n_kv_heads);
    RANGE(c->head_dim, 2, MAX_HEAD_DIM, "head_dim");
    if (c->head_dim % 2)
        return dfl_fail(err, DFL_EFORMAT, "%s: head_dim = %d (expected an even number for RoPE)",
                        src, c->head_dim);
    RANGE(c->ffn_dim, 1, MAX_FFN, "intermediate_size");
    RANGE(c->vocab, 1, MAX_VOCAB, "vocab_size");
    RANGE(c->max_ctx, 1, MAX_CTX, "max_position_embeddings");
    if (!(c->norm_eps > 0 && c->norm_eps < 1))
        return dfl_fail(err, DFL_EFORMAT, "%s: rms_norm_eps = %g (expected 0 < eps < 1)", src,
                        c->norm_eps);
    POSITIVE(c->rope_theta, "rope_theta");
    RANGE(c->rope_neox, 0, 1, "rope_neox");
    RANGE(c->qkv_bias, 0, 1, "qkv_bias");
    RANGE(c->qk_norm, 0, 1, "qk_norm");
    RANGE(c->tied_embed, 0, 1, "tie_word_embeddings");
    RANGE(c->bos_id, -1, c->vocab - 1, "bos_token_id");
    RANGE(c->eos_id, -1, c->vocab - 1, "eos_token_id");
    for (int l = 0; l < c->n_layers; l++) {
        int h = c->layer_heads[l] ? c->layer_heads[l] : c->n_heads;
        if (h < 1 || h > MAX_HEADS || h % c->n_kv_heads)
            return dfl_fail(err, DFL_EFORMAT, "%s: layer %d has %d query heads "
                            "(num_attention_heads_per_layer[%d], GGUF attention.head_count; "
                            "expected a multiple of num_key_value_heads = %d up to %d)", src, l,
                            h, l, c->n_kv_heads, MAX_HEADS);
        if (c->mlp_kind[l] == DFL_MLP_MOE && !c->n_experts)
            return dfl_fail(err, DFL_EFORMAT, "%s: layer %d is sparse but num_experts is 0",
                            src, l);
    }
    if (c->n_experts) {
        RANGE(c->n_experts, 1, MAX_EXPERTS, "num_experts");
        RANGE(c->top_k, 1, c->n_experts, "num_experts_per_tok");
        RANGE(c->moe_ffn, 1, MAX_FFN, "moe_intermediate_size");
        RANGE(c->shared_ffn, 0, MAX_FFN, "shared_expert_intermediate_size");
    }
    int sliding = 0;
    for (int l = 0; l < c->n_layers; l++) sliding |= c->layer_kind[l] == DFL_LAYER_SLIDING;
    if (sliding) RANGE(c->sliding_window, 2, MAX_WINDOW, "sliding_window");
    RANGE(c->router_func, DFL_ROUTER_SIGMOID, DFL_ROUTER_SQRTSOFTPLUS, "router_func");
    RANGE(c->swa_sinks, 0, 1, "swa_attention_sink_enabled");
    TRY(validate_recurrent(c, src, err));
    if (rot_dims(c->head_dim, c->rope_partial) < 2 ||
        rot_dims(c->head_dim, c->swa_rope_partial) < 2)
        return dfl_fail(err, DFL_EFORMAT, "%s: partial_rotary_factor rotates fewer than 2 dims",
                        src);
    return validate_rope(c, src, err);
}

/* ---- Hugging Face config.json ------------------------------------------- */

static const struct {
    const char *hf, *model_type;
    int arch;
} hf_archs[] = {
    {"LlamaForCausalLM", "llama", ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", ARCH_LLAMA},
    {"Qwen2ForCausalLM", "qwen2", ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", ARCH_QWEN3},
    {"LagunaForCausalLM", "laguna", ARCH_LAGUNA},
    {"Qwen3_5ForCausalLM", "qwen3_5_text", ARCH_QWEN35},
    {"Qwen3_5ForConditionalGeneration", "qwen3_5", ARCH_QWEN35},
    {"Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", ARCH_QWEN35},
    {"Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", ARCH_QWEN35},
    {"Qwen3NextForCausalLM", "qwen3_next", ARCH_QWEN3_NEXT},
    {"Qwen3MoeForCausalLM", "qwen3_moe", ARCH_QWEN3_MOE},
};

static int hf_arch(const cJSON *j, const char *file, dfl_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *name = NULL, *mt = dfl_json_str(j, "model_type");
    if (cJSON_IsArray(a) && cJSON_IsString(cJSON_GetArrayItem(a, 0)))
        name = cJSON_GetArrayItem(a, 0)->valuestring;
    for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (name ? strcmp(name, hf_archs[i].hf) == 0 : mt && strcmp(mt, hf_archs[i].model_type) == 0)
            return hf_archs[i].arch;
    if (!name && !mt)
        return dfl_fail(err, DFL_EFORMAT, "%s: architectures[0] is missing (expected e.g. "
                        "LlamaForCausalLM)", file);
    return dfl_fail(err, DFL_EUNSUP,
                    "%s: architecture %.100s not supported (LlamaForCausalLM, MistralForCausalLM, "
                    "Qwen2ForCausalLM, Qwen3ForCausalLM, LagunaForCausalLM, Qwen3_5ForCausalLM, "
                    "Qwen3_5ForConditionalGeneration and their Moe forms, Qwen3NextForCausalLM, "
                    "Qwen3MoeForCausalLM are)",
                    file, name ? name : mt);
}

/* rc of a getter: 0 ok, 1 absent (fine for optional keys), < 0 error. */
int need_int(const cJSON *j, const char *key, int64_t lo, int64_t hi, int *out,
                    const char *file, dfl_error *err) {
    int64_t v;
    int rc = dfl_json_int(j, key, lo, hi, &v, file, err);
    if (rc == 1)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is missing (expected an integer in %lld..%lld)",
                        file, key, (long long)lo, (long long)hi);
    if (rc == 0) *out = (int)v;
    return rc;
}

int opt_int(const cJSON *j, const char *key, int64_t lo, int64_t hi, int *out,
                   const char *file, dfl_error *err) {
    int64_t v;
    int rc = dfl_json_int(j, key, lo, hi, &v, file, err);
    if (rc == 0) *out = (int)v;
    return rc;
}

int opt_float(const cJSON *j, const char *key, double lo, double hi, float *out,
                     const char *file, dfl_error *err) {
    double v;
    int rc = dfl_json_num(j, key, lo, hi, &v, file, err);
    if (rc == 0) *out = (float)v;
    return rc;
}

/* bos/eos: an integer, or a list whose first entry is used. */
static int token_id(const cJSON *j, const char *key, int *out, const char *file,
                    dfl_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0); /* NULL when empty */
    if (!v || cJSON_IsNull(v)) return 1;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d >= 0 && d <= MAX_VOCAB && d == floor(d)))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is not a token id (expected an integer in "
                        "0..%d, or a list of them)", file, key, MAX_VOCAB);
    *out = (int)d;
    return 0;
}

/* Flags that would change the computation in ways this engine does not do. */
static int hf_refuse_features(const cJSON *j, int arch, const char *file, dfl_error *err) {
    int b = 0;
    const char *act = dfl_json_str(j, "hidden_act");
    if (act && strcmp(act, "silu") != 0)
        return dfl_fail(err, DFL_EUNSUP, "%s: hidden_act %.60s not supported (silu is)", file, act);
    TRY(dfl_json_bool(j, "attention_bias", &b, file, err));
    if (arch != ARCH_QWEN2 && b)
        return dfl_fail(err, DFL_EUNSUP, "%s: attention_bias = true (biases on q/k/v/o "
                        "projections) not supported", file);
    b = 0;
    TRY(dfl_json_bool(j, "mlp_bias", &b, file, err));
    if (b) return dfl_fail(err, DFL_EUNSUP, "%s: mlp_bias = true not supported", file);
    double prf = 1;
    TRY(dfl_json_num(j, "partial_rotary_factor", 0, 1, &prf, file, err));
    if (prf != 1 && arch != ARCH_LAGUNA && !DFL_ARCH_HYBRID(arch))
        return dfl_fail(err, DFL_EUNSUP, "%s: partial_rotary_factor = %g not supported (1 is)",
                        file, prf);
    return 0;
}

/* rope_scaling (transformers 4.x) or rope_parameters (5.x): type and factors. */
static int hf_rope(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    const char *key = "rope_parameters";
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!r || cJSON_IsNull(r)) r = cJSON_GetObjectItemCaseSensitive(j, key = "rope_scaling");
    c->rope_theta = 10000;
    TRY(opt_float(j, "rope_theta", 0, F_MAX, &c->rope_theta, file, err));
    if (!r || cJSON_IsNull(r)) return 0;
    return cfg_rope(r, key, c, file, err);
}

int cfg_rope(const cJSON *r, const char *key, dfl_config *c, const char *file, dfl_error *err) {
    if (!cJSON_IsObject(r))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is not an object or null", file, key);
    TRY(opt_float(r, "rope_theta", 0, F_MAX, &c->rope_theta, file, err));
    const char *type = dfl_json_str(r, "rope_type");
    if (!type) type = dfl_json_str(r, "type");
    if (!type || strcmp(type, "default") == 0) return 0;
    float factor = 0;
    TRY(opt_float(r, "factor", -F_MAX, F_MAX, &factor, file, err));
    c->rope_factor = factor;
    c->rope_orig_ctx = c->max_ctx;
    TRY(opt_int(r, "original_max_position_embeddings", 1, MAX_CTX, &c->rope_orig_ctx, file, err));
    if (strcmp(type, "linear") == 0) {
        c->rope_scale_type = ROPE_SCALE_LINEAR;
    } else if (strcmp(type, "llama3") == 0) {
        c->rope_scale_type = ROPE_SCALE_LLAMA3;
        TRY(opt_float(r, "low_freq_factor", -F_MAX, F_MAX, &c->rope_low_freq, file, err));
        TRY(opt_float(r, "high_freq_factor", -F_MAX, F_MAX, &c->rope_high_freq, file, err));
    } else if (strcmp(type, "yarn") == 0) {
        c->rope_scale_type = ROPE_SCALE_YARN;
        c->rope_beta_fast = 32, c->rope_beta_slow = 1;
        TRY(opt_float(r, "beta_fast", -F_MAX, F_MAX, &c->rope_beta_fast, file, err));
        TRY(opt_float(r, "beta_slow", -F_MAX, F_MAX, &c->rope_beta_slow, file, err));
        int trunc = 1;
        TRY(dfl_json_bool(r, "truncate", &trunc, file, err));
        if (!trunc)
            return dfl_fail(err, DFL_EUNSUP, "%s: %s.truncate = false not supported", file, key);
        /* the default attention factor, as transformers' get_mscale */
        float af = 0, ms = 0, msa = 0;
        TRY(opt_float(r, "mscale", -F_MAX, F_MAX, &ms, file, err));
        TRY(opt_float(r, "mscale_all_dim", -F_MAX, F_MAX, &msa, file, err));
        int rc = opt_float(r, "attention_factor", -F_MAX, F_MAX, &af, file, err);
        if (rc < 0) return rc;
        if (rc == 1) {
            double lf = factor > 1 ? log(factor) : 0;
            af = ms != 0 && msa != 0 ? (float)((0.1 * ms * lf + 1) / (0.1 * msa * lf + 1))
                                     : (float)(0.1 * lf + 1);
        }
        c->rope_attn_factor = af;
    } else {
        return dfl_fail(err, DFL_EUNSUP,
                        "%s: %s type \"%.60s\" not supported (default, linear, llama3, yarn are)",
                        file, key, type);
    }
    return 0;
}

static int is_mistral(const cJSON *j) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *name = cJSON_IsArray(a) && cJSON_IsString(cJSON_GetArrayItem(a, 0))
                           ? cJSON_GetArrayItem(a, 0)->valuestring : dfl_json_str(j, "model_type");
    return name && (!strncmp(name, "Mistral", 7) || !strcmp(name, "mistral"));
}

int cfg_name_list(const cJSON *j, const char *key, int n, const char *zero, const char *one,
                  unsigned char *out, const char *file, dfl_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!a || cJSON_IsNull(a)) return 1;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is not a list of %d names", file, key, n);
    for (int l = 0; l < n; l++) {
        const cJSON *v = cJSON_GetArrayItem(a, l);
        const char *s = cJSON_IsString(v) ? v->valuestring : "";
        if (strcmp(s, zero) && strcmp(s, one))
            return dfl_fail(err, DFL_EUNSUP, "%s: %s[%d] = '%.40s' not supported (%s or %s)",
                            file, key, l, s, zero, one);
        out[l] = !strcmp(s, one);
    }
    return 0;
}

/* Which layers attend a sliding window: layer_types when given (transformers
 * 5 writes it); else Mistral's sliding_window covers every layer, and
 * Qwen2/3's use_sliding_window the layers from max_window_layers on. */
static int hf_layer_types(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    int n_sliding = 0;
    /* DFL_LAYER_FULL / DFL_LAYER_SLIDING are 0 / 1 */
    int rc = cfg_name_list(j, "layer_types", c->n_layers, "full_attention", "sliding_attention",
                           c->layer_kind, file, err);
    if (rc < 0) return rc;
    if (rc == 0) {
        for (int l = 0; l < c->n_layers; l++) n_sliding += c->layer_kind[l] == DFL_LAYER_SLIDING;
    } else if (sw && !cJSON_IsNull(sw)) {
        int use = 0, from = 0;
        TRY(dfl_json_bool(j, "use_sliding_window", &use, file, err));
        TRY(opt_int(j, "max_window_layers", 0, MAX_LAYERS, &from, file, err));
        if (is_mistral(j)) use = 1, from = 0;
        for (int l = from; use && l < c->n_layers; l++, n_sliding++)
            c->layer_kind[l] = DFL_LAYER_SLIDING;
    }
    if (!n_sliding) return 0;
    if (!sw || cJSON_IsNull(sw))
        return dfl_fail(err, DFL_EFORMAT, "%s: sliding layers but no sliding_window", file);
    return need_int(j, "sliding_window", 2, MAX_WINDOW, &c->sliding_window, file, err);
}

int dfl_config_from_cjson(const cJSON *j, const char *file, int arch, dfl_config *c,
                          dfl_error *err) {
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(j))
        return dfl_fail(err, DFL_EFORMAT, "%s: expected a JSON object", file);
    if (arch < 0 && (arch = hf_arch(j, file, err)) < 0) return arch;
    c->arch = arch;
    const cJSON *top = j;
    if (DFL_ARCH_HYBRID(arch)) j = dfl_qwen35_text(j);
    TRY(hf_refuse_features(j, arch, file, err));
    TRY(need_int(j, "hidden_size", 1, MAX_DIM, &c->dim, file, err));
    TRY(need_int(j, "num_hidden_layers", 1, MAX_LAYERS, &c->n_layers, file, err));
    TRY(need_int(j, "num_attention_heads", 1, MAX_HEADS, &c->n_heads, file, err));
    /* (Qwen3.5-MoE has no dense MLP: its reader checks) */
    TRY((DFL_ARCH_HYBRID(arch) ? opt_int : need_int)(j, "intermediate_size", 1, MAX_FFN,
                                                    &c->ffn_dim, file, err));
    TRY(need_int(j, "vocab_size", 1, MAX_VOCAB, &c->vocab, file, err));
    c->n_kv_heads = c->n_heads;
    TRY(opt_int(j, "num_key_value_heads", 1, MAX_HEADS, &c->n_kv_heads, file, err));
    int rc = opt_int(j, "head_dim", 2, MAX_HEAD_DIM, &c->head_dim, file, err);
    if (rc < 0) return rc;
    if (rc == 1) {
        if (c->dim % c->n_heads)
            return dfl_fail(err, DFL_EFORMAT,
                            "%s: hidden_size = %d is not a multiple of num_attention_heads = %d "
                            "(and head_dim is not given)", file, c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    c->max_ctx = arch == ARCH_LLAMA ? 2048 : 32768;
    TRY(opt_int(j, "max_position_embeddings", 1, MAX_CTX, &c->max_ctx, file, err));
    c->norm_eps = 1e-6f;
    TRY(opt_float(j, "rms_norm_eps", 0, 1, &c->norm_eps, file, err));
    TRY(hf_rope(j, c, file, err));
    c->rope_neox = 1;
    c->qkv_bias = arch == ARCH_QWEN2;
    c->qk_norm = arch == ARCH_QWEN3 || arch == ARCH_QWEN3_MOE;
    TRY(dfl_json_bool(j, "tie_word_embeddings", &c->tied_embed, file, err));
    c->bos_id = arch == ARCH_LLAMA ? 1 : -1;
    c->eos_id = arch == ARCH_LLAMA ? 2 : -1;
    TRY(token_id(j, "bos_token_id", &c->bos_id, file, err));
    TRY(token_id(j, "eos_token_id", &c->eos_id, file, err));
    if (DFL_ARCH_HYBRID(arch)) TRY(dfl_qwen35_config(j, top, c, file, err));
    else TRY(hf_layer_types(j, c, file, err));
    if (arch == ARCH_QWEN3_MOE) TRY(dfl_qwen_moe_config(j, c, file, err));
    if (arch == ARCH_LAGUNA) TRY(dfl_laguna_config(j, c, file, err));
    return dfl_config_validate(c, file, err);
}

int dfl_config_from_json(const char *buf, size_t len, dfl_config *c, dfl_error *err) {
    cJSON *j = dfl_json_parse(buf, len, "config.json", err);
    if (!j) return err ? err->code : DFL_EFORMAT;
    int rc = dfl_config_from_cjson(j, "config.json", -1, c, err);
    cJSON_Delete(j);
    return rc;
}

int dfl_config_from_hf(const char *path, dfl_config *c, dfl_error *err) {
    cJSON *j = dfl_json_parse_file(path, 4 << 20, err);
    if (!j) return err ? err->code : DFL_EFORMAT;
    int rc = dfl_config_from_cjson(j, path, -1, c, err);
    cJSON_Delete(j);
    return rc;
}

/* ---- GGUF metadata ------------------------------------------------------ */

/* general.architecture as llama.cpp names it; the key prefix is that name. */
static const struct {
    const char *name;
    int arch;
} gguf_archs[] = {
    {"llama", ARCH_LLAMA}, {"qwen2", ARCH_QWEN2}, {"qwen3", ARCH_QWEN3},
    {"laguna", ARCH_LAGUNA}, {"qwen35", ARCH_QWEN35}, {"qwen35moe", ARCH_QWEN35},
    {"qwen3next", ARCH_QWEN3_NEXT}, {"qwen3moe", ARCH_QWEN3_MOE},
};

const char *akey(gkeys *k, const char *suffix) {
    snprintf(k->key, sizeof k->key, "%s.%s", k->arch, suffix);
    return k->key;
}

int g_int(gkeys *k, const char *suffix, int required, int64_t lo, int64_t hi, int *out,
          dfl_error *err) {
    uint32_t v;
    const char *key = akey(k, suffix);
    int rc = dfl_gguf_u32(k->g, key, &v, err);
    if (rc == 1 && required)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is missing", k->g->tensors.source, key);
    if (rc) return rc;
    if ((int64_t)v < lo || (int64_t)v > hi)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %u (expected %lld..%lld)",
                        k->g->tensors.source, key, v, (long long)lo, (long long)hi);
    *out = (int)v;
    return 0;
}

int g_float(gkeys *k, const char *suffix, float *out, dfl_error *err) {
    return dfl_gguf_f32(k->g, akey(k, suffix), out, err);
}

/* Rotated dims as a partial factor in the middle of the dims' interval, so
 * config.c's int(head_dim * factor) gives them back whatever the rounding. */
int g_rot(gkeys *k, const char *suffix, int hd, float *partial, dfl_error *err) {
    int rd = hd;
    TRY(g_int(k, suffix, 0, 2, hd, &rd, err));
    if (rd % 2)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %d (expected an even number)",
                        k->g->tensors.source, k->key, rd);
    *partial = (rd + 0.5f) / hd;
    return 0;
}

int g_bools(gkeys *k, const char *suffix, int n, int no, int yes, unsigned char *out,
            dfl_error *err) {
    const char *src = k->g->tensors.source, *key = akey(k, suffix);
    const gguf_kv *kv = dfl_gguf_find(k->g, key);
    if (!kv || kv->type != GGUF_T_ARRAY) return 1;
    if (!dfl_gguf_arr(k->g, key, GGUF_T_BOOL, err)) return DFL_EFORMAT;
    if (kv->arr_n != (uint64_t)n)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s has %llu entries (expected block_count = %d)",
                        src, key, (unsigned long long)kv->arr_n, n);
    for (int l = 0; l < n; l++) {
        if (kv->val[l] > 1)
            return dfl_fail(err, DFL_EFORMAT, "%s: %s[%d] = %u (expected a bool)", src, key, l,
                            kv->val[l]);
        out[l] = (unsigned char)(kv->val[l] ? yes : no);
    }
    return 0;
}

static int g_token(const gguf_file *g, const char *key, int *out, dfl_error *err) {
    uint32_t v;
    int rc = dfl_gguf_u32(g, key, &v, err);
    if (rc) return rc;
    *out = v > (uint32_t)MAX_VOCAB ? -1 : (int)v; /* llama.cpp writes -1 as "none" */
    return 0;
}

/* attention.head_count: one count, or one per layer (llama.cpp writes an
 * array when layers differ; its Laguna converter always does). n_heads is
 * layer 0's; layer_heads holds each. */
static int g_heads(gkeys *k, dfl_config *c, dfl_error *err) {
    const char *key = akey(k, "attention.head_count");
    const gguf_kv *kv = dfl_gguf_find(k->g, key);
    if (!kv || kv->type != GGUF_T_ARRAY)
        return g_int(k, "attention.head_count", 1, 1, MAX_HEADS, &c->n_heads, err);
    if (!dfl_gguf_arr(k->g, key, GGUF_T_U32, err)) return DFL_EFORMAT;
    if (kv->arr_n != (uint64_t)c->n_layers)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s has %llu entries (expected block_count = %d)",
                        k->g->tensors.source, key, (unsigned long long)kv->arr_n, c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        int64_t h = dfl_gguf_arr_i64(kv, l);
        if (h < 1 || h > MAX_HEADS)
            return dfl_fail(err, DFL_EFORMAT, "%s: %s[%d] = %lld (expected 1..%d)",
                            k->g->tensors.source, key, l, (long long)h, MAX_HEADS);
        c->layer_heads[l] = (short)h;
    }
    c->n_heads = c->layer_heads[0];
    return 0;
}

static int gguf_rope(gkeys *k, dfl_config *c, dfl_error *err) {
    const char *src = k->g->tensors.source;
    int rd = c->head_dim;
    TRY(g_int(k, "rope.dimension_count", 0, 0, MAX_HEAD_DIM, &rd, err));
    /* Laguna and the hybrids rotate part of a head: their readers read it */
    if (rd != c->head_dim && c->arch != ARCH_LAGUNA && !DFL_ARCH_HYBRID(c->arch))
        return dfl_fail(err, DFL_EUNSUP, "%s: %s = %d but head_dim = %d (partial RoPE not "
                        "supported)", src, k->key, rd, c->head_dim);
    c->rope_theta = 10000;
    TRY(g_float(k, "rope.freq_base", &c->rope_theta, err));
    gguf_str t = {"none", 4};
    TRY(dfl_gguf_str(k->g, akey(k, "rope.scaling.type"), &t, err));
    float lin = 0;
    if (g_float(k, "rope.scale_linear", &lin, err) == 0 && t.len == 4 && !memcmp(t.s, "none", 4))
        t = (gguf_str){"linear", 6}; /* the older key */
    c->rope_factor = lin;
    TRY(g_float(k, "rope.scaling.factor", &c->rope_factor, err));
    c->rope_orig_ctx = c->max_ctx;
    TRY(g_int(k, "rope.scaling.original_context_length", 0, 1, MAX_CTX, &c->rope_orig_ctx, err));
    if (t.len == 4 && !memcmp(t.s, "none", 4)) return 0;
    if (t.len == 6 && !memcmp(t.s, "linear", 6)) {
        c->rope_scale_type = ROPE_SCALE_LINEAR;
        return 0;
    }
    if (t.len == 4 && !memcmp(t.s, "yarn", 4)) {
        c->rope_scale_type = ROPE_SCALE_YARN;
        c->rope_beta_fast = 32, c->rope_beta_slow = 1;
        TRY(g_float(k, "rope.scaling.yarn_beta_fast", &c->rope_beta_fast, err));
        TRY(g_float(k, "rope.scaling.yarn_beta_slow", &c->rope_beta_slow, err));
        /* llama.cpp multiplies its attn_factor onto the yarn magnitude scale */
        float af = 1;
        TRY(g_float(k, "rope.scaling.attn_factor", &af, err));
        double f = c->rope_factor;
        c->rope_attn_factor = (float)(af * (f > 1 ? 0.1 * log(f) + 1 : 1));
        /* transformers' attention_factor, written only when the config gives
         * one: the whole magnitude scale, as the HF original computes it */
        TRY(g_float(k, "rope.scaling.yarn_attn_factor", &c->rope_attn_factor, err));
        return 0;
    }
    return dfl_fail(err, DFL_EUNSUP, "%s: %s = \"%.*s\" not supported (none, linear, yarn are)",
                    src, akey(k, "rope.scaling.type"), (int)(t.len < 60 ? t.len : 60), t.s);
}

static int gguf_vocab(const gguf_file *g, gkeys *k, dfl_config *c, dfl_error *err) {
    dfl_tensor *e = dfl_tensors_find((dfl_tensors *)&g->tensors, "token_embd.weight");
    const gguf_kv *tok = dfl_gguf_find(g, "tokenizer.ggml.tokens");
    if (e && e->n_dims == 2) {
        if (e->shape[0] > MAX_VOCAB)
            return dfl_fail(err, DFL_EFORMAT, "%s: token_embd.weight has %lld rows (expected "
                            "1..%d)", g->tensors.source, (long long)e->shape[0], MAX_VOCAB);
        c->vocab = (int)e->shape[0];
    } else if (tok && tok->type == GGUF_T_ARRAY) {
        if (tok->arr_n > MAX_VOCAB)
            return dfl_fail(err, DFL_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries "
                            "(expected 1..%d)", g->tensors.source,
                            (unsigned long long)tok->arr_n, MAX_VOCAB);
        c->vocab = (int)tok->arr_n;
    } else {
        return g_int(k, "vocab_size", 1, 1, MAX_VOCAB, &c->vocab, err);
    }
    return 0;
}

int dfl_config_from_gguf(const gguf_file *g, dfl_config *c, dfl_error *err) {
    const char *src = g->tensors.source ? g->tensors.source : "gguf";
    memset(c, 0, sizeof *c);
    gguf_str a;
    int rc = dfl_gguf_str(g, "general.architecture", &a, err);
    if (rc == 1) return dfl_fail(err, DFL_EFORMAT, "%s: general.architecture is missing", src);
    if (rc) return rc;
    c->arch = -1;
    const char *name = NULL;
    for (size_t i = 0; i < sizeof gguf_archs / sizeof gguf_archs[0]; i++)
        if (a.len == strlen(gguf_archs[i].name) && !memcmp(a.s, gguf_archs[i].name, a.len))
            c->arch = gguf_archs[i].arch, name = gguf_archs[i].name;
    if (c->arch < 0)
        return dfl_fail(err, DFL_EUNSUP,
                        "%s: general.architecture = \"%.*s\" not supported (llama, qwen2, qwen3, "
                        "laguna, qwen35, qwen35moe, qwen3next, qwen3moe are)", src,
                        (int)(a.len < 60 ? a.len : 60), a.s);
    gkeys k = {.g = g, .arch = name};
    TRY(g_int(&k, "block_count", 1, 1, MAX_LAYERS, &c->n_layers, err));
    TRY(g_int(&k, "embedding_length", 1, 1, MAX_DIM, &c->dim, err));
    TRY(g_heads(&k, c, err));
    c->n_kv_heads = c->n_heads;
    TRY(g_int(&k, "attention.head_count_kv", 0, 1, MAX_HEADS, &c->n_kv_heads, err));
    /* (the MoE families' readers check that dense layers have it) */
    int moe = DFL_ARCH_HYBRID(c->arch) || c->arch == ARCH_QWEN3_MOE;
    TRY(g_int(&k, "feed_forward_length", !moe, 1, MAX_FFN, &c->ffn_dim, err));
    TRY(g_int(&k, "context_length", 1, 1, MAX_CTX, &c->max_ctx, err));
    rc = g_int(&k, "attention.key_length", 0, 2, MAX_HEAD_DIM, &c->head_dim, err);
    if (rc < 0) return rc;
    if (rc == 1) {
        if (c->dim % c->n_heads)
            return dfl_fail(err, DFL_EFORMAT, "%s: embedding_length = %d is not a multiple of "
                            "head_count = %d (and attention.key_length is not given)", src,
                            c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    int vl = c->head_dim;
    TRY(g_int(&k, "attention.value_length", 0, 1, MAX_HEAD_DIM, &vl, err));
    if (vl != c->head_dim)
        return dfl_fail(err, DFL_EUNSUP, "%s: %s = %d differs from key_length = %d", src, k.key,
                        vl, c->head_dim);
    c->norm_eps = 1e-5f;
    TRY(g_float(&k, "attention.layer_norm_rms_epsilon", &c->norm_eps, err));
    TRY(gguf_rope(&k, c, err));
    TRY(gguf_vocab(g, &k, c, err));
    /* llama.cpp's converter permutes Llama q/k rows into Meta's interleaved pairs */
    c->rope_neox = c->arch != ARCH_LLAMA;
    dfl_tensors *ts = (dfl_tensors *)&g->tensors;
    c->qkv_bias = c->arch == ARCH_QWEN2 || dfl_tensors_find(ts, "blk.0.attn_q.bias") != NULL;
    c->qk_norm = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE;
    c->tied_embed = ts->n > 0 && !dfl_tensors_find(ts, "output.weight");
    c->bos_id = c->eos_id = -1;
    TRY(g_token(g, "tokenizer.ggml.bos_token_id", &c->bos_id, err));
    TRY(g_token(g, "tokenizer.ggml.eos_token_id", &c->eos_id, err));
    if (c->arch == ARCH_LAGUNA) TRY(dfl_laguna_config_gguf(&k, c, err));
    if (DFL_ARCH_HYBRID(c->arch)) TRY(dfl_qwen35_config_gguf(&k, c, err));
    if (c->arch == ARCH_QWEN3_MOE) TRY(dfl_qwen_moe_config_gguf(&k, c, err));
    return dfl_config_validate(c, src, err);
}

/* ---- RoPE table --------------------------------------------------------- */

/* transformers' _compute_llama3_parameters for one frequency. */
static double llama3_freq(double f, const dfl_config *c) {
    double wavelen = 2 * M_PI / f, old = c->rope_orig_ctx;
    double lo = c->rope_low_freq, hi = c->rope_high_freq;
    if (wavelen < old / hi) return f;               /* high frequency: kept */
    if (wavelen > old / lo) return f / c->rope_factor; /* low frequency: scaled */
    double s = (old / wavelen - lo) / (hi - lo);
    return (1 - s) * f / c->rope_factor + s * f;
}

/* transformers' _compute_yarn_parameters: interpolated (f / factor) below the
 * correction range, extrapolated (f) above, a linear ramp between. */
static void yarn_freqs(double *f, int half, const dfl_config *c) {
    int dim = 2 * half;
    double base = c->rope_theta, ctx = c->rope_orig_ctx;
    double lo = floor(dim * log(ctx / (c->rope_beta_fast * 2 * M_PI)) / (2 * log(base)));
    double hi = ceil(dim * log(ctx / (c->rope_beta_slow * 2 * M_PI)) / (2 * log(base)));
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < half; i++) {
        double ramp = (i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double extra = 1 - ramp; /* weight of the unscaled frequency */
        f[i] = f[i] / c->rope_factor * (1 - extra) + f[i] * extra;
    }
}

void dfl_rope_init(dfl_rope *r, const dfl_config *c) {
    int rot = rot_dims(c->head_dim, c->rope_partial), half = rot / 2;
    double *f = xmalloc((size_t)half * sizeof *f);
    for (int i = 0; i < half; i++) f[i] = 1.0 / pow(c->rope_theta, (2.0 * i) / rot);
    if (c->rope_scale_type == ROPE_SCALE_LINEAR)
        for (int i = 0; i < half; i++) f[i] /= c->rope_factor;
    else if (c->rope_scale_type == ROPE_SCALE_LLAMA3)
        for (int i = 0; i < half; i++) f[i] = llama3_freq(f[i], c);
    else if (c->rope_scale_type == ROPE_SCALE_YARN)
        yarn_freqs(f, half, c);
    r->head_dim = rot;
    r->stride = c->head_dim;
    r->neox = c->rope_neox;
    r->mscale = c->rope_scale_type == ROPE_SCALE_YARN ? c->rope_attn_factor : 1.0f;
    r->inv_freq = xmalloc((size_t)half * sizeof(float));
    for (int i = 0; i < half; i++) r->inv_freq[i] = (float)f[i];
    free(f);
}

void dfl_rope_init_swa(dfl_rope *r, const dfl_config *c) {
    dfl_config *s = xmalloc(sizeof *s);
    *s = *c;
    if (c->swa_rope_theta > 0) {
        s->rope_theta = c->swa_rope_theta;
        s->rope_partial = c->swa_rope_partial;
        s->rope_scale_type = ROPE_SCALE_NONE;
    }
    dfl_rope_init(r, s);
    free(s);
}
