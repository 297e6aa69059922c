/* qwen35_config.c - Qwen3.5's config.json fields, after the common ones
 * (config.c): which layers are gated DeltaNet (linear_attention) and which
 * gated full attention, the DeltaNet shapes, partial rotary. The multimodal
 * class (Qwen3_5ForConditionalGeneration) nests them in text_config. Apart
 * from qwen35.c's tensors so the config fuzzer links only the readers. */
#include <string.h>

#include "models/config_json.h"

const cJSON *dfl_qwen35_text(const cJSON *j) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text_config");
    return cJSON_IsObject(t) ? t : j;
}

/* layer_types ("linear_attention" / "full_attention"), else transformers'
 * default: full attention every full_attention_interval-th layer. */
static int layer_types(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    int rc = cfg_name_list(j, "layer_types", c->n_layers, "full_attention", "linear_attention",
                           c->layer_kind, file, err);
    if (rc < 0) return rc;
    if (rc == 1) {
        int every = 4;
        TRY(opt_int(j, "full_attention_interval", 1, MAX_LAYERS, &every, file, err));
        for (int l = 0; l < c->n_layers; l++) c->layer_kind[l] = (l + 1) % every != 0;
    }
    for (int l = 0; l < c->n_layers; l++)
        c->layer_kind[l] = c->layer_kind[l] ? DFL_LAYER_RECURRENT : DFL_LAYER_FULL;
    return 0;
}

/* Qwen3-Next and Qwen3-MoE: a layer's MLP is sparse unless it is in mlp_only_layers or
 * (l + 1) is not a multiple of decoder_sparse_step. */
static int next_sparse_layers(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    int step = 1;
    TRY(opt_int(j, "decoder_sparse_step", 1, MAX_LAYERS, &step, file, err));
    for (int l = 0; l < c->n_layers; l++) c->mlp_kind[l] = (l + 1) % step == 0;
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    if (!only || cJSON_IsNull(only)) return 0;
    if (!cJSON_IsArray(only))
        return dfl_fail(err, DFL_EFORMAT, "%s: mlp_only_layers is not a list", file);
    for (int i = 0; i < cJSON_GetArraySize(only); i++) {
        const cJSON *v = cJSON_GetArrayItem(only, i);
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!(d >= 0 && d < c->n_layers && d == (int)d))
            return dfl_fail(err, DFL_EFORMAT, "%s: mlp_only_layers[%d] is not a layer (0..%d)",
                            file, i, c->n_layers - 1);
        c->mlp_kind[(int)d] = DFL_MLP_DENSE;
    }
    return 0;
}

/* Qwen3.5-MoE: every layer's MLP is a softmax-routed mixture of experts
 * whose top_k scores are renormalised, plus a shared expert behind a
 * sigmoid gate; the dense form needs intermediate_size. Qwen3-Next: the
 * same on its sparse layers, norm_topk_prob read, intermediate_size for
 * the dense ones. Qwen3-MoE: as Qwen3-Next without a shared expert. */
int dfl_qwen_moe_config(const cJSON *j, dfl_config *c, const char *file, dfl_error *err) {
    /* (transformers 5 writes Qwen3-MoE's as num_local_experts; released files num_experts) */
    const char *key = "num_experts";
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!ne || cJSON_IsNull(ne))
        ne = cJSON_GetObjectItemCaseSensitive(j, key = "num_local_experts");
    if (!ne || cJSON_IsNull(ne)) {
        if (c->ffn_dim) return 0;   /* dense */
        return dfl_fail(err, DFL_EFORMAT, "%s: intermediate_size is missing (a dense Qwen3.5 "
                        "needs it; an MoE one num_experts)", file);
    }
    TRY(need_int(j, key, 1, MAX_EXPERTS, &c->n_experts, file, err));
    TRY(need_int(j, "num_experts_per_tok", 1, c->n_experts, &c->top_k, file, err));
    TRY(need_int(j, "moe_intermediate_size", 1, MAX_FFN, &c->moe_ffn, file, err));
    if (c->arch != ARCH_QWEN3_MOE)
        TRY(need_int(j, "shared_expert_intermediate_size", 1, MAX_FFN, &c->shared_ffn, file,
                     err));
    c->router_softmax = 1, c->norm_topk = 1, c->routed_scale = 1;
    if (c->arch == ARCH_QWEN3_NEXT || c->arch == ARCH_QWEN3_MOE) {
        TRY(dfl_json_bool(j, "norm_topk_prob", &c->norm_topk, file, err));
        TRY(next_sparse_layers(j, c, file, err));
        for (int l = 0; l < c->n_layers; l++)
            if (c->mlp_kind[l] == DFL_MLP_DENSE && !c->ffn_dim)
                return dfl_fail(err, DFL_EFORMAT, "%s: layer %d is dense but intermediate_size "
                                "is missing", file, l);
        if (!c->ffn_dim) c->ffn_dim = c->moe_ffn;
        return 0;
    }
    if (!c->ffn_dim) c->ffn_dim = c->moe_ffn;   /* no dense layer uses it */
    for (int l = 0; l < c->n_layers; l++) c->mlp_kind[l] = DFL_MLP_MOE;
    return 0;
}

int dfl_qwen35_config(const cJSON *j, const cJSON *top, dfl_config *c, const char *file,
                      dfl_error *err) {
    c->qk_norm = 1;
    c->norm_offset = 1;
    c->gating = DFL_GATE_Q_SIGMOID;
    if (top != j) TRY(dfl_json_bool(top, "tie_word_embeddings", &c->tied_embed, file, err));
    TRY(layer_types(j, c, file, err));
    /* partial rotary: in rope_parameters (transformers 5), or top-level (older files) */
    c->rope_partial = 0.25f;
    TRY(opt_float(j, "partial_rotary_factor", 0, 1, &c->rope_partial, file, err));
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (cJSON_IsObject(r))
        TRY(opt_float(r, "partial_rotary_factor", 0, 1, &c->rope_partial, file, err));
    c->lin_conv = 4, c->lin_k_heads = 16, c->lin_v_heads = 32;
    c->lin_k_dim = 128, c->lin_v_dim = 128;
    TRY(opt_int(j, "linear_conv_kernel_dim", 1, MAX_CONV, &c->lin_conv, file, err));
    TRY(opt_int(j, "linear_num_key_heads", 1, MAX_HEADS, &c->lin_k_heads, file, err));
    TRY(opt_int(j, "linear_num_value_heads", 1, MAX_HEADS, &c->lin_v_heads, file, err));
    TRY(opt_int(j, "linear_key_head_dim", 1, MAX_HEAD_DIM, &c->lin_k_dim, file, err));
    TRY(opt_int(j, "linear_value_head_dim", 1, MAX_HEAD_DIM, &c->lin_v_dim, file, err));
    return dfl_qwen_moe_config(j, c, file, err);
}
