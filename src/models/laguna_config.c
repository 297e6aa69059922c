/* laguna_config.c - Laguna's config.json fields, after the common ones
 * (config.c): per-layer heads, MLP types, gating, RoPE per layer type, the
 * experts. Apart from laguna.c's tensors so the config fuzzer links only
 * the readers. */
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
    const char *f = dfl_json_str(j, "moe_router_score_func");
    if (f && strcmp(f, "sigmoid"))
        return dfl_fail(err, DFL_EUNSUP, "%s: moe_router_score_func = '%.40s' not supported "
                        "(sigmoid is)", file, f);
    return 0;
}

int dfl_laguna_config(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    c->qk_norm = 1;
    TRY(refuse_true(j, "swa_attention_sink_enabled", "attention sinks", file, err));
    TRY(int_list(j, "num_attention_heads_per_layer", c->n_layers, 1, MAX_HEADS, c->layer_heads,
                 file, err));
    TRY(mlp_types(j, c, file, err));
    TRY(gating(j, c, file, err));
    TRY(ropes(j, c, file, err));
    int any_moe = 0;
    for (int l = 0; l < c->n_layers; l++) any_moe |= c->mlp_kind[l] == DFL_MLP_MOE;
    if (any_moe) TRY(moe(j, c, file, err));
    return 0;
}

