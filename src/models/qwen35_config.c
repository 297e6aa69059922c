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


/* ---- GGUF metadata (llama.cpp's qwen35, qwen35moe, qwen3next, qwen3moe) ---- */

static int tensor_exists(gkeys *k, const char *fmt, int l) {
    char name[64];
    snprintf(name, sizeof name, fmt, l);
    return dfl_tensors_find((dfl_tensors *)&k->g->tensors, name) != NULL;
}

/* Which layers are sparse: those with a router (blk.N.ffn_gate_inp), as
 * llama.cpp's layout says it; the dense ones need feed_forward_length. */
static int gguf_sparse_layers(gkeys *k, dfl_config *c, dfl_error *err) {
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) {
        c->mlp_kind[l] = tensor_exists(k, "blk.%d.ffn_gate_inp.weight", l);
        any |= c->mlp_kind[l];
        if (!c->mlp_kind[l] && !c->ffn_dim)
            return dfl_fail(err, DFL_EFORMAT, "%s: layer %d is dense (no blk.%d.ffn_gate_inp) "
                            "but %s.feed_forward_length is missing", k->g->tensors.source, l, l,
                            k->arch);
    }
    if (any && !c->n_experts)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is missing (the file has expert routers)",
                        k->g->tensors.source, akey(k, "expert_count"));
    return 0;
}

/* Experts, softmax-routed (llama.cpp's default gating for these archs):
 * counts, sizes, the shared expert (hybrids), the top-k renormalisation. */
int dfl_qwen_moe_config_gguf(gkeys *k, dfl_config *c, dfl_error *err) {
    const char *src = k->g->tensors.source;
    TRY(g_int(k, "expert_count", 0, 1, MAX_EXPERTS, &c->n_experts, err));
    if (c->n_experts) {
        TRY(g_int(k, "expert_used_count", 1, 1, c->n_experts, &c->top_k, err));
        TRY(g_int(k, "expert_feed_forward_length", 1, 1, MAX_FFN, &c->moe_ffn, err));
        if (c->arch != ARCH_QWEN3_MOE)
            TRY(g_int(k, "expert_shared_feed_forward_length", 1, 1, MAX_FFN, &c->shared_ffn,
                      err));
        int gating = 1;   /* llama.cpp's SOFTMAX */
        TRY(g_int(k, "expert_gating_func", 0, 0, 1000, &gating, err));
        if (gating != 1)
            return dfl_fail(err, DFL_EUNSUP, "%s: %s = %d not supported (1, softmax, is)", src,
                            k->key, gating);
        float scale = 1;
        TRY(g_float(k, "expert_weights_scale", &scale, err));
        if (scale != 1 && scale != 0)   /* 0: llama.cpp's "none" */
            return dfl_fail(err, DFL_EUNSUP, "%s: %s = %g not supported (the routed weights "
                            "are not scaled)", src, k->key, scale);
        /* transformers' norm_topk_prob; llama.cpp always renormalises these archs */
        c->norm_topk = 1;
        TRY(dfl_gguf_bool(k->g, akey(k, "expert_weights_norm"), &c->norm_topk, err));
        c->router_softmax = 1, c->routed_scale = 1;
    }
    TRY(gguf_sparse_layers(k, c, err));
    if (!c->ffn_dim) c->ffn_dim = c->moe_ffn;   /* no dense layer uses it */
    return 0;
}

/* attention.recurrent_layers (one bool per layer), else every
 * full_attention_interval-th layer full attention (4 when absent), as
 * llama.cpp reads them. */
static int gguf_layer_types(gkeys *k, dfl_config *c, dfl_error *err) {
    int rc = g_bools(k, "attention.recurrent_layers", c->n_layers, DFL_LAYER_FULL,
                     DFL_LAYER_RECURRENT, c->layer_kind, err);
    if (rc <= 0) return rc;
    int every = 4;
    TRY(g_int(k, "full_attention_interval", 0, 1, MAX_LAYERS, &every, err));
    for (int l = 0; l < c->n_layers; l++)
        c->layer_kind[l] = (l + 1) % every ? DFL_LAYER_RECURRENT : DFL_LAYER_FULL;
    return 0;
}

/* The DeltaNet shapes: ssm.group_count key heads of ssm.state_size,
 * ssm.time_step_rank value heads sharing ssm.inner_size. */
static int gguf_ssm(gkeys *k, dfl_config *c, dfl_error *err) {
    int inner = 0;
    TRY(g_int(k, "ssm.conv_kernel", 1, 1, MAX_CONV, &c->lin_conv, err));
    TRY(g_int(k, "ssm.state_size", 1, 1, MAX_HEAD_DIM, &c->lin_k_dim, err));
    TRY(g_int(k, "ssm.group_count", 1, 1, MAX_HEADS, &c->lin_k_heads, err));
    TRY(g_int(k, "ssm.time_step_rank", 1, 1, MAX_HEADS, &c->lin_v_heads, err));
    TRY(g_int(k, "ssm.inner_size", 1, 1, (int64_t)MAX_HEADS * MAX_HEAD_DIM, &inner, err));
    if (c->lin_v_heads % c->lin_k_heads)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s.ssm.time_step_rank = %d value heads is not a "
                        "multiple of ssm.group_count = %d key heads", k->g->tensors.source,
                        k->arch, c->lin_v_heads, c->lin_k_heads);
    c->lin_v_dim = inner / c->lin_v_heads;
    if (inner % c->lin_v_heads || c->lin_v_dim > MAX_HEAD_DIM)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %d is not time_step_rank = %d value heads "
                        "of at most %d", k->g->tensors.source, akey(k, "ssm.inner_size"), inner,
                        c->lin_v_heads, MAX_HEAD_DIM);
    return 0;
}

/* rope.dimension_sections: Qwen3.5's multimodal RoPE, which on text (every
 * section at the same position) is the plain partial rotary; checked only. */
static int gguf_sections(gkeys *k, const dfl_config *c, dfl_error *err) {
    const char *key = akey(k, "rope.dimension_sections");
    const gguf_kv *kv = dfl_gguf_find(k->g, key);
    if (!kv) return 0;
    if (!dfl_gguf_arr(k->g, key, GGUF_T_I32, err)) return DFL_EFORMAT;
    if (kv->arr_n > 4)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s has %llu entries (expected up to 4)",
                        k->g->tensors.source, key, (unsigned long long)kv->arr_n);
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        int64_t v = dfl_gguf_arr_i64(kv, i);
        if (v < 0 || v > c->head_dim)
            return dfl_fail(err, DFL_EFORMAT, "%s: %s[%llu] = %lld (expected 0..%d)",
                            k->g->tensors.source, key, (unsigned long long)i, (long long)v,
                            c->head_dim);
    }
    return 0;
}

int dfl_qwen35_config_gguf(gkeys *k, dfl_config *c, dfl_error *err) {
    c->qk_norm = 1;
    c->gating = DFL_GATE_Q_SIGMOID;
    c->norm_offset = 0;   /* llama.cpp's converter folded the 1 into the norms */
    TRY(g_rot(k, "rope.dimension_count", c->head_dim, &c->rope_partial, err));
    TRY(gguf_sections(k, c, err));
    TRY(gguf_layer_types(k, c, err));
    /* llama.cpp's converter appends the MTP head as nextn_predict_layers more blocks
     * (block_count counts them, the layer keys cover them); it is not run here */
    TRY(g_int(k, "nextn_predict_layers", 0, 0, c->n_layers - 1, &c->mtp_blocks, err));
    c->n_layers -= c->mtp_blocks;
    int any = 0;
    for (int l = 0; l < c->n_layers; l++) any |= c->layer_kind[l] == DFL_LAYER_RECURRENT;
    if (any) TRY(gguf_ssm(k, c, err));
    return dfl_qwen_moe_config_gguf(k, c, err);
}
