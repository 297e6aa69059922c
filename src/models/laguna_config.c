/* laguna_config.c - Laguna's config.json fields, after the common ones
 * (config.c): per-layer heads, MLP types, gating, RoPE per layer type, the
 * experts, sinks; and the same from GGUF metadata in llama.cpp's layout.
 * Apart from laguna.c's tensors so the config fuzzer links only the
 * readers. */
#include <string.h>

#include "models/config_json.h"

static int refuse_true(const cJSON *j, const char *key, const char *why, const char *file,
                       dfl_error *err) {
    int b = 0;
    TRY(dfl_json_bool(j, key, &b, file, err));
    if (b) return dfl_fail(err, DFL_EUNSUP, "%s: %s = true not supported (%s)", file, key, why);
    return 0;
}

static int int_list(const cJSON *j, const char *key, int n, int lo, int hi, short *out,
                    const char *file, dfl_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!a || cJSON_IsNull(a)) return 1;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is not a list of %d integers", file, key, n);
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!(d >= lo && d <= hi && d == (int)d))
            return dfl_fail(err, DFL_EFORMAT, "%s: %s[%d] is not an integer in %d..%d", file, key,
                            i, lo, hi);
        out[i] = (short)d;
    }
    return 0;
}

/* mlp_layer_types, else the legacy mlp_only_layers + decoder_sparse_step,
 * else dense first and sparse after (transformers' default). */
static int mlp_types(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    /* DFL_MLP_DENSE / DFL_MLP_MOE are 0 / 1 */
    int rc = cfg_name_list(j, "mlp_layer_types", c->n_layers, "dense", "sparse", c->mlp_kind,
                           file, err);
    if (rc <= 0) return rc;
    short dense[DFL_MAX_LAYERS] = {0};
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    int step = 1;
    TRY(opt_int(j, "decoder_sparse_step", 1, MAX_LAYERS, &step, file, err));
    if (only && cJSON_IsArray(only)) {
        for (int i = 0; i < cJSON_GetArraySize(only); i++) {
            const cJSON *v = cJSON_GetArrayItem(only, i);
            int l = cJSON_IsNumber(v) ? v->valueint : -1;
            if (l < 0 || l >= c->n_layers)
                return dfl_fail(err, DFL_EFORMAT, "%s: mlp_only_layers[%d] is not a layer",
                                file, i);
            dense[l] = 1;
        }
    } else {
        dense[0] = 1;
    }
    for (int l = 0; l < c->n_layers; l++)
        c->mlp_kind[l] = !dense[l] && (l + 1) % step == 0 ? DFL_MLP_MOE : DFL_MLP_DENSE;
    return 0;
}

static int gating(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "gating");
    c->gating = DFL_GATE_HEAD;   /* transformers' default: true */
    if (!g || cJSON_IsNull(g) || cJSON_IsTrue(g)) return 0;
    if (cJSON_IsFalse(g)) return c->gating = DFL_GATE_NONE;
    const char *s = cJSON_IsString(g) ? g->valuestring : "";
    if (!strcmp(s, "per-head")) return 0;
    if (!strcmp(s, "per-element")) return (c->gating = DFL_GATE_ELEMENT), 0;
    return dfl_fail(err, DFL_EUNSUP, "%s: gating = '%.40s' (true, false, \"per-head\" or "
                    "\"per-element\" expected)", file, s);
}

/* gating_types (per layer; llama.cpp's converter reads it, "-" or "_"):
 * one gate kind for all layers here, so each entry must be gating's. */
static int gating_types(const cJSON *j, const dfl_config *c, const char *file, dfl_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "gating_types");
    if (!a || cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != c->n_layers)
        return dfl_fail(err, DFL_EFORMAT, "%s: gating_types is not a list of %d names", file,
                        c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        const cJSON *v = cJSON_GetArrayItem(a, l);
        const char *s = cJSON_IsString(v) ? v->valuestring : "";
        int head = !strcmp(s, "per-head") || !strcmp(s, "per_head");
        int elem = !strcmp(s, "per-element") || !strcmp(s, "per_element");
        if ((!head && !elem) || c->gating != (elem ? DFL_GATE_ELEMENT : DFL_GATE_HEAD))
            return dfl_fail(err, DFL_EUNSUP, "%s: gating_types[%d] = '%.40s' (every layer must "
                            "have gating's kind)", file, l, s);
    }
    return 0;
}

/* The sliding layers' RoPE: plain, with its own theta and partial factor. */
static int swa_rope(const cJSON *r, const char *key, dfl_config *c, const char *file,
                    dfl_error *err) {
    c->swa_rope_theta = 10000, c->swa_rope_partial = 1;
    if (!r || cJSON_IsNull(r)) return 0;
    if (!cJSON_IsObject(r)) return dfl_fail(err, DFL_EFORMAT, "%s: %s is not an object", file, key);
    const char *type = dfl_json_str(r, "rope_type");
    if (type && strcmp(type, "default"))
        return dfl_fail(err, DFL_EUNSUP, "%s: %s.rope_type = '%.40s' (sliding layers take plain "
                        "RoPE)", file, key, type);
    TRY(opt_float(r, "rope_theta", 0, F_MAX, &c->swa_rope_theta, file, err));
    TRY(opt_float(r, "partial_rotary_factor", 0, 1, &c->swa_rope_partial, file, err));
    return 0;
}

/* rope_parameters nested by layer type (transformers), or the legacy flat
 * dict with swa_rope_parameters and a top-level partial_rotary_factor. */
static int ropes(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const cJSON *full = r ? cJSON_GetObjectItemCaseSensitive(r, "full_attention") : NULL;
    c->rope_partial = 1;
    TRY(opt_float(j, "partial_rotary_factor", 0, 1, &c->rope_partial, file, err));
    if (full) {
        c->rope_theta = 500000;
        TRY(cfg_rope(full, "rope_parameters.full_attention", c, file, err));
        TRY(opt_float(full, "partial_rotary_factor", 0, 1, &c->rope_partial, file, err));
        return swa_rope(cJSON_GetObjectItemCaseSensitive(r, "sliding_attention"),
                        "rope_parameters.sliding_attention", c, file, err);
    }
    if (r && !cJSON_IsNull(r))
        TRY(opt_float(r, "partial_rotary_factor", 0, 1, &c->rope_partial, file, err));
    return swa_rope(cJSON_GetObjectItemCaseSensitive(j, "swa_rope_parameters"),
                    "swa_rope_parameters", c, file, err);
}

static int moe(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    c->n_experts = 256, c->top_k = 8, c->moe_ffn = 512, c->shared_ffn = 512;
    c->routed_scale = 1, c->norm_topk = 1;
    TRY(opt_int(j, "num_experts", 1, MAX_EXPERTS, &c->n_experts, file, err));
    TRY(opt_int(j, "num_experts_per_tok", 1, MAX_EXPERTS, &c->top_k, file, err));
    if (c->top_k > c->n_experts)
        return dfl_fail(err, DFL_EFORMAT, "%s: num_experts_per_tok = %d exceeds num_experts = %d",
                        file, c->top_k, c->n_experts);
    TRY(opt_int(j, "moe_intermediate_size", 1, MAX_FFN, &c->moe_ffn, file, err));
    TRY(opt_int(j, "shared_expert_intermediate_size", 0, MAX_FFN, &c->shared_ffn, file, err));
    TRY(opt_float(j, "moe_routed_scaling_factor", 0, F_MAX, &c->routed_scale, file, err));
    TRY(opt_float(j, "moe_router_logit_softcapping", 0, F_MAX, &c->router_softcap, file, err));
    TRY(refuse_true(j, "moe_apply_router_weight_on_input", "weights apply to the output", file,
                    err));
    int norm = 1;
    TRY(dfl_json_bool(j, "norm_topk_prob", &norm, file, err));
    if (!norm)
        return dfl_fail(err, DFL_EUNSUP, "%s: norm_topk_prob = false not supported (the chosen "
                        "experts' weights are normalised)", file);
    const char *f = dfl_json_str(j, "moe_router_score_func");
    c->router_func = f && !strcmp(f, "sqrtsoftplus") ? DFL_ROUTER_SQRTSOFTPLUS : DFL_ROUTER_SIGMOID;
    if (f && strcmp(f, "sigmoid") && strcmp(f, "sqrtsoftplus"))
        return dfl_fail(err, DFL_EUNSUP, "%s: moe_router_score_func = '%.40s' not supported "
                        "(sigmoid and sqrtsoftplus are)", file, f);
    return 0;
}

int dfl_laguna_config(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    c->qk_norm = 1;
    TRY(dfl_json_bool(j, "swa_attention_sink_enabled", &c->swa_sinks, file, err));
    TRY(int_list(j, "num_attention_heads_per_layer", c->n_layers, 1, MAX_HEADS, c->layer_heads,
                 file, err));
    TRY(mlp_types(j, c, file, err));
    TRY(gating(j, c, file, err));
    TRY(gating_types(j, c, file, err));
    TRY(ropes(j, c, file, err));
    int any_moe = 0;
    for (int l = 0; l < c->n_layers; l++) any_moe |= c->mlp_kind[l] == DFL_MLP_MOE;
    if (any_moe) TRY(moe(j, c, file, err));
    return 0;
}


/* ---- GGUF metadata (llama.cpp's `laguna`) ---------------------------------- */

/* Which layers slide: attention.sliding_window_pattern is a period p (layer
 * l full when l % p == 0, llama.cpp's reading; 4 when absent, as it
 * assumes) or one bool per layer (true: sliding). */
static int gguf_swa_layers(gkeys *k, dfl_config *c, dfl_error *err) {
    int rc = g_bools(k, "attention.sliding_window_pattern", c->n_layers, DFL_LAYER_FULL,
                     DFL_LAYER_SLIDING, c->layer_kind, err);
    if (rc <= 0) return rc;
    int period = 4;
    TRY(g_int(k, "attention.sliding_window_pattern", 0, 0, MAX_LAYERS, &period, err));
    for (int l = 0; l < c->n_layers; l++)
        c->layer_kind[l] = period == 0 || l % period ? DFL_LAYER_SLIDING : DFL_LAYER_FULL;
    return 0;
}

/* The sliding window, its layers and their plain RoPE (base and dims of
 * their own), when the file has a window. */
static int gguf_swa(gkeys *k, dfl_config *c, dfl_error *err) {
    TRY(g_rot(k, "rope.dimension_count", c->head_dim, &c->rope_partial, err));
    TRY(g_int(k, "attention.sliding_window", 0, 0, MAX_WINDOW, &c->sliding_window, err));
    if (!c->sliding_window) return 0;
    TRY(gguf_swa_layers(k, c, err));
    c->swa_rope_theta = c->rope_theta;
    TRY(g_float(k, "rope.freq_base_swa", &c->swa_rope_theta, err));
    if (!(c->swa_rope_theta > 0))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %g (expected > 0)", k->g->tensors.source,
                        k->key, c->swa_rope_theta);
    c->swa_rope_partial = c->rope_partial;
    return g_rot(k, "rope.dimension_count_swa", c->head_dim, &c->swa_rope_partial, err);
}

/* Experts: counts, sizes, scoring; the weights always sum-normalised. */
static int gguf_moe(gkeys *k, dfl_config *c, dfl_error *err) {
    const char *src = k->g->tensors.source;
    TRY(g_int(k, "expert_count", 1, 1, MAX_EXPERTS, &c->n_experts, err));
    TRY(g_int(k, "expert_used_count", 1, 1, c->n_experts, &c->top_k, err));
    TRY(g_int(k, "expert_feed_forward_length", 1, 1, MAX_FFN, &c->moe_ffn, err));
    c->shared_ffn = c->moe_ffn;   /* llama.cpp's default: one shared expert of that size */
    TRY(g_int(k, "expert_shared_feed_forward_length", 0, 0, MAX_FFN, &c->shared_ffn, err));
    int n_shared = 1, gating = 2;   /* llama.cpp's SIGMOID */
    TRY(g_int(k, "expert_shared_count", 0, 1, 1, &n_shared, err));
    c->routed_scale = 1;
    TRY(g_float(k, "expert_weights_scale", &c->routed_scale, err));
    if (!(c->routed_scale > 0 && c->routed_scale < F_MAX))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %g (expected a finite number > 0)", src,
                        k->key, c->routed_scale);
    TRY(g_float(k, "router_logit_softcapping", &c->router_softcap, err));
    if (!(c->router_softcap >= 0 && c->router_softcap < F_MAX))
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %g (expected a finite number >= 0)", src,
                        k->key, c->router_softcap);
    int norm = 1;
    TRY(dfl_gguf_bool(k->g, akey(k, "expert_weights_norm"), &norm, err));
    if (!norm)
        return dfl_fail(err, DFL_EUNSUP, "%s: %s = false not supported (the chosen experts' "
                        "weights are always normalised)", src, k->key);
    c->norm_topk = 1;
    TRY(g_int(k, "expert_gating_func", 0, 0, 1000, &gating, err));
    if (gating != 2 && gating != 4)   /* llama.cpp's SIGMOID, SQRTSOFTPLUS */
        return dfl_fail(err, DFL_EUNSUP, "%s: %s = %d not supported (2 sigmoid and 4 "
                        "sqrtsoftplus are)", src, k->key, gating);
    c->router_func = gating == 4 ? DFL_ROUTER_SQRTSOFTPLUS : DFL_ROUTER_SIGMOID;
    return 0;
}

/* The output gate's kind is the width of blk.0.attn_gate (llama.cpp reads
 * it so too): n_heads per head, n_heads * head_dim per element; none
 * without the tensor. Every layer's width is checked when it is bound. */
static int gguf_gating(gkeys *k, dfl_config *c, dfl_error *err) {
    const dfl_tensor *t = dfl_tensors_find((dfl_tensors *)&k->g->tensors, "blk.0.attn_gate.weight");
    c->gating = DFL_GATE_NONE;
    if (!t) return 0;
    int64_t h = c->layer_heads[0] ? c->layer_heads[0] : c->n_heads, rows = t->shape[0];
    if (t->n_dims == 2 && rows == h) return (c->gating = DFL_GATE_HEAD), 0;
    if (t->n_dims == 2 && rows == h * c->head_dim) return (c->gating = DFL_GATE_ELEMENT), 0;
    return dfl_fail(err, DFL_EFORMAT, "%s: blk.0.attn_gate.weight has %lld rows (expected %lld "
                    "per head or %lld per element)", k->g->tensors.source, (long long)rows,
                    (long long)h, (long long)(h * c->head_dim));
}

int dfl_laguna_config_gguf(gkeys *k, dfl_config *c, dfl_error *err) {
    c->qk_norm = 1;
    c->qkv_bias = 0;
    TRY(gguf_swa(k, c, err));
    int dense = 0;
    TRY(g_int(k, "leading_dense_block_count", 1, 0, c->n_layers, &dense, err));
    for (int l = 0; l < c->n_layers; l++) c->mlp_kind[l] = l < dense ? DFL_MLP_DENSE : DFL_MLP_MOE;
    if (dense < c->n_layers) TRY(gguf_moe(k, c, err));
    TRY(gguf_gating(k, c, err));
    /* sinks: llama.cpp's attn_sinks tensor on the first sliding layer */
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != DFL_LAYER_SLIDING) continue;
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_sinks.weight", l);
        c->swa_sinks = dfl_tensors_find((dfl_tensors *)&k->g->tensors, name) != NULL;
        break;
    }
    return 0;
}
