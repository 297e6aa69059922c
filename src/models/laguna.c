/* laguna.c - Poolside's Laguna: sliding-window attention on most layers
 * (layer_types), its own query-head count per layer, q/k RMSNorm, partial
 * rotary with RoPE parameters per layer type (YaRN allowed on full
 * attention), a softplus output gate per head or per element computed from
 * the layer input, a dense first layer, then sigmoid-routed mixtures of
 * experts with a selection-only correction bias and a shared expert.
 * Config readers and Hugging Face tensor names, in transformers' layout
 * (fused experts.gate_up_proj, shared_experts) and the published one (one
 * tensor per expert, shared_expert). */
#include <string.h>

#include "models/config_json.h"
#include "models/family.h"

/* ---- config --------------------------------------------------------------- */

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
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "mlp_layer_types");
    if (a && !cJSON_IsNull(a)) {
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != c->n_layers)
            return dfl_fail(err, DFL_EFORMAT, "%s: mlp_layer_types is not a list of %d names",
                            file, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const cJSON *v = cJSON_GetArrayItem(a, l);
            const char *s = cJSON_IsString(v) ? v->valuestring : "";
            if (!strcmp(s, "sparse")) c->mlp_kind[l] = DFL_MLP_MOE;
            else if (strcmp(s, "dense"))
                return dfl_fail(err, DFL_EUNSUP, "%s: mlp_layer_types[%d] = '%.40s' (dense or "
                                "sparse expected)", file, l, s);
        }
        return 0;
    }
    short dense[DFL_MAX_LAYERS] = {0};
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    int step = 1;
    TRY(opt_int(j, "decoder_sparse_step", 1, MAX_LAYERS, &step, file, err));
    if (only && cJSON_IsArray(only)) {
        for (int i = 0; i < cJSON_GetArraySize(only); i++) {
            const cJSON *v = cJSON_GetArrayItem(only, i);
            int l = cJSON_IsNumber(v) ? v->valueint : -1;
            if (l < 0 || l >= c->n_layers)
                return dfl_fail(err, DFL_EFORMAT, "%s: mlp_only_layers[%d] is not a layer", file, i);
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
    c->routed_scale = 1;
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

/* ---- tensors -------------------------------------------------------------- */

static const char *P = "model.layers.%d.";

static int mat(dfl_weights *w, int l, const char *sfx, int rows, int cols, dfl_mat *m,
               dfl_error *err) {
    char f[256], b[256];
    snprintf(f, sizeof f, "%s%s", P, sfx);
    return dfl_w_mat(w, dfl_lname(b, f, l), rows, cols, m, err);
}

static int vec(dfl_weights *w, int l, const char *sfx, int n, const float **v, dfl_error *err) {
    char f[256], b[256];
    snprintf(f, sizeof f, "%s%s", P, sfx);
    return dfl_w_vec(w, dfl_lname(b, f, l), n, v, err);
}

static int has(dfl_weights *w, int l, const char *sfx) {
    char f[256], b[256];
    snprintf(f, sizeof f, "%s%s", P, sfx);
    return dfl_w_has(w, dfl_lname(b, f, l));
}

/* Experts fused (transformers: gate_up_proj [E, 2I, D], down_proj [E, D, I])
 * or one tensor each (experts.{e}.{gate,up,down}_proj). */
static int experts(dfl_weights *w, const dfl_config *c, int l, dfl_moe *M, dfl_error *err) {
    int E = c->n_experts, I = c->moe_ffn, D = c->dim, rc = 0;
    M->gate = xcalloc(E, sizeof(dfl_mat));
    M->up = xcalloc(E, sizeof(dfl_mat));
    M->down = xcalloc(E, sizeof(dfl_mat));
    char f[256], b[256];
    if (has(w, l, "mlp.experts.gate_up_proj")) {
        snprintf(f, sizeof f, "%smlp.experts.gate_up_proj", P);
        rc = dfl_w_stack(w, dfl_lname(b, f, l), E, 2 * I, D, M->gate, err);
        for (int e = 0; e < E && !rc; e++) {
            M->up[e] = M->gate[e];
            M->gate[e].rows = M->up[e].rows = I;
            M->up[e].data += (size_t)I * M->up[e].row_bytes;
        }
        snprintf(f, sizeof f, "%smlp.experts.down_proj", P);
        return rc ? rc : dfl_w_stack(w, dfl_lname(b, f, l), E, D, I, M->down, err);
    }
    for (int e = 0; e < E && !rc; e++) {
        char s[128];
        snprintf(s, sizeof s, "mlp.experts.%d.gate_proj.weight", e);
        rc = mat(w, l, s, I, D, &M->gate[e], err);
        snprintf(s, sizeof s, "mlp.experts.%d.up_proj.weight", e);
        rc = rc ? rc : mat(w, l, s, I, D, &M->up[e], err);
        snprintf(s, sizeof s, "mlp.experts.%d.down_proj.weight", e);
        rc = rc ? rc : mat(w, l, s, D, I, &M->down[e], err);
    }
    return rc;
}

static int load_moe(dfl_weights *w, const dfl_config *c, int l, dfl_layer *L, dfl_error *err) {
    dfl_moe *M = L->moe = xcalloc(1, sizeof *M);
    int rc = mat(w, l, "mlp.gate.weight", c->n_experts, c->dim, &M->router, err);
    const char *bias = has(w, l, "mlp.gate.e_score_correction_bias")
                           ? "mlp.gate.e_score_correction_bias"
                           : has(w, l, "mlp.experts.e_score_correction_bias")
                                 ? "mlp.experts.e_score_correction_bias" : NULL;
    if (!rc && bias) rc = vec(w, l, bias, c->n_experts, &M->sel_bias, err);
    rc = rc ? rc : experts(w, c, l, M, err);
    if (rc || !c->shared_ffn) return rc;
    const char *sh = has(w, l, "mlp.shared_experts.gate_proj.weight") ? "mlp.shared_experts"
                                                                       : "mlp.shared_expert";
    char s[128];
    snprintf(s, sizeof s, "%s.gate_proj.weight", sh);
    rc = mat(w, l, s, c->shared_ffn, c->dim, &M->sh_gate, err);
    snprintf(s, sizeof s, "%s.up_proj.weight", sh);
    rc = rc ? rc : mat(w, l, s, c->shared_ffn, c->dim, &M->sh_up, err);
    snprintf(s, sizeof s, "%s.down_proj.weight", sh);
    return rc ? rc : mat(w, l, s, c->dim, c->shared_ffn, &M->sh_down, err);
}

static int load_layer(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    dfl_layer *L = &t->layers[l];
    if (t->gguf)
        return dfl_fail(err, DFL_EUNSUP, "Laguna from GGUF is not supported yet: use the "
                        "Hugging Face folder");
    int hd = c->head_dim, qd = L->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc = mat(w, l, "self_attn.q_proj.weight", qd, c->dim, &L->wq, err);
    rc = rc ? rc : mat(w, l, "self_attn.k_proj.weight", kvd, c->dim, &L->wk, err);
    rc = rc ? rc : mat(w, l, "self_attn.v_proj.weight", kvd, c->dim, &L->wv, err);
    rc = rc ? rc : mat(w, l, "self_attn.o_proj.weight", c->dim, qd, &L->wo, err);
    if (c->gating != DFL_GATE_NONE)
        rc = rc ? rc : mat(w, l, "self_attn.g_proj.weight",
                           c->gating == DFL_GATE_HEAD ? L->n_heads : qd, c->dim, &L->wg, err);
    rc = rc ? rc : vec(w, l, "self_attn.q_norm.weight", hd, &L->q_norm, err);
    rc = rc ? rc : vec(w, l, "self_attn.k_norm.weight", hd, &L->k_norm, err);
    rc = rc ? rc : vec(w, l, "input_layernorm.weight", c->dim, &L->attn_norm, err);
    rc = rc ? rc : vec(w, l, "post_attention_layernorm.weight", c->dim, &L->ffn_norm, err);
    if (rc) return rc;
    if (c->mlp_kind[l] == DFL_MLP_MOE) return load_moe(w, c, l, L, err);
    rc = mat(w, l, "mlp.gate_proj.weight", c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : mat(w, l, "mlp.up_proj.weight", c->ffn_dim, c->dim, &L->w_up, err);
    return rc ? rc : mat(w, l, "mlp.down_proj.weight", c->dim, c->ffn_dim, &L->w_down, err);
}

const dfl_family dfl_family_laguna = {"laguna", load_layer};
