/* laguna_dflash_config.c - Poolside's Laguna DFlash drafter
 * (DFlashLagunaForCausalLM, as vLLM's laguna_dflash.py defines it): its
 * config.json. laguna_dflash.c reads its tensors, dflash.c runs it. It
 * differs from z-lab's drafter in:
 *   - each captured target layer's features pass their own RMSNorm
 *     (aux_hidden_norms.j) before fc and hidden_norm;
 *   - context rows pass each drafter layer's input_layernorm before K/V;
 *   - Laguna attention: fused qkv_proj (rows q|k|v), q/k norm, partial
 *     rotary allowed, a softplus output gate (g_proj) per head or element;
 *   - layers are all full or all sliding; sliding layers are causal with a
 *     window over [context ; block], full layers non-causal, unless
 *     is_causal or dflash_config.causal says otherwise.
 * Its embedding and lm_head are the target's: draft_vocab_size must equal
 * the target's vocabulary. */
#include <string.h>

#include "draft/draft_private.h"
#include "models/config_json.h"

static const cJSON *get(const cJSON *o, const char *key) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* vLLM reads a sliding drafter's RoPE from rope_parameters.sliding_attention
 * (nested) or swa_rope_parameters (flat), else from the full-attention set;
 * a theta or partial factor missing there comes from the top level. c's
 * main RoPE fields become the one set the drafter uses. */
static int pick_rope(dfl_config *c, const cJSON *j, const char *file, dfl_error *err) {
    const cJSON *r = get(j, "rope_parameters");
    const cJSON *sd = r && get(r, "full_attention") ? get(r, "sliding_attention")
                                                     : get(j, "swa_rope_parameters");
    if (!sd) return 0;
    c->rope_theta = c->swa_rope_theta;
    c->rope_partial = c->swa_rope_partial;
    c->rope_scale_type = ROPE_SCALE_NONE;
    c->rope_attn_factor = 1.0f;
    if (!get(sd, "rope_theta"))
        TRY(opt_float(j, "rope_theta", 0, F_MAX, &c->rope_theta, file, err));
    if (!get(sd, "partial_rotary_factor"))
        TRY(opt_float(j, "partial_rotary_factor", 0, 1, &c->rope_partial, file, err));
    return 0;
}

/* layer_types required and uniform; one head count for every layer; no
 * attention sinks. */
static int layer_shape(const dfl_config *c, const cJSON *j, const char *file, dfl_error *err) {
    if (!get(j, "layer_types"))
        return dfl_fail(err, DFL_EFORMAT, "%s: layer_types is missing (a Laguna DFlash drafter "
                        "lists its layers' attention kind)", file);
    for (int l = 1; l < c->n_layers; l++)
        if (c->layer_kind[l] != c->layer_kind[0])
            return dfl_fail(err, DFL_EUNSUP, "%s: layer_types mixes full_attention and "
                            "sliding_attention (layer %d differs from layer 0); Laguna DFlash "
                            "drafter layers are uniform", file, l);
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_heads[l] && c->layer_heads[l] != c->n_heads)
            return dfl_fail(err, DFL_EUNSUP, "%s: num_attention_heads_per_layer[%d] = %d differs "
                            "from num_attention_heads = %d (drafter layers share one head count)",
                            file, l, c->layer_heads[l], c->n_heads);
    if (c->swa_sinks)
        return dfl_fail(err, DFL_EUNSUP, "%s: swa_attention_sink_enabled = true: the drafter's "
                        "attention has no sinks (vLLM's DFlashLagunaAttention takes none)", file);
    if (c->n_layers > DRAFT_MAX_LAYERS)
        return dfl_fail(err, DFL_EFORMAT, "%s: num_hidden_layers = %d (a drafter has at most %d)",
                        file, c->n_layers, DRAFT_MAX_LAYERS);
    return 0;
}

/* block_size in dflash_config or at the top level (both: equal). */
static int block_size(dfl_drafter *d, const cJSON *j, const cJSON *dc, const char *file,
                      dfl_error *err) {
    int top = 0, in = 0;
    TRY(opt_int(j, "block_size", 2, DFL_MAX_BLOCK, &top, file, err));
    TRY(opt_int(dc, "block_size", 2, DFL_MAX_BLOCK, &in, file, err));
    if (top && in && top != in)
        return dfl_fail(err, DFL_EFORMAT, "%s: block_size = %d but dflash_config.block_size = %d",
                        file, top, in);
    if (!top && !in)
        return dfl_fail(err, DFL_EFORMAT, "%s: block_size is missing (dflash_config.block_size, "
                        "2..%d)", file, DFL_MAX_BLOCK);
    d->block_size = in ? in : top;
    return 0;
}

/* draft_vocab_size (else vocab_size) must be the target's vocabulary: the
 * drafter borrows its lm_head. vocab_size, when absent, is taken from it. */
static int vocab(cJSON *j, const dfl_target *t, const char *file, dfl_error *err) {
    int dv = 0;
    const char *key = get(j, "draft_vocab_size") || !get(j, "vocab_size") ? "draft_vocab_size"
                                                                          : "vocab_size";
    TRY(need_int(j, key, 1, MAX_VOCAB, &dv, file, err));
    if (dv != t->c.vocab)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %d but the target's vocabulary has %d ids "
                        "(the drafter shares the target's lm_head)", file, key, dv, t->c.vocab);
    if (!get(j, "vocab_size")) cJSON_AddNumberToObject(j, "vocab_size", dv);
    return 0;
}

/* A drafter layer's MLP is dense whatever the Laguna MoE fields say (vLLM
 * builds LagunaMLP): published configs carry num_experts = 0 and no
 * mlp_layer_types, which Laguna's reader would take as sparse layers. */
static void dense_mlps(cJSON *j) {
    const cJSON *n = get(j, "num_hidden_layers");
    double v = cJSON_IsNumber(n) ? n->valuedouble : 0;
    if (!(v >= 1 && v <= DRAFT_MAX_LAYERS && v == (int)v)) return;   /* refused later */
    cJSON *a = cJSON_CreateArray();
    for (int l = 0; l < (int)v; l++) cJSON_AddItemToArray(a, cJSON_CreateString("dense"));
    if (get(j, "mlp_layer_types")) cJSON_ReplaceItemInObjectCaseSensitive(j, "mlp_layer_types", a);
    else cJSON_AddItemToObject(j, "mlp_layer_types", a);
}

static int dflash_fields(dfl_drafter *d, const cJSON *j, const cJSON *dc, const dfl_target *t,
                         const char *file, dfl_error *err) {
    int aux = 1, n_target = t->c.n_layers;
    TRY(dfl_json_bool(dc, "use_aux_hidden_state", &aux, file, err));
    if (!aux)
        return dfl_fail(err, DFL_EUNSUP, "%s: dflash_config.use_aux_hidden_state = false (the "
                        "drafter is conditioned on target features)", file);
    for (int i = 0; i < 2; i++) {   /* at the top level or in dflash_config */
        TRY(opt_int(i ? dc : j, "num_target_layers", 1, MAX_LAYERS, &n_target, file, err));
        if (n_target != t->c.n_layers)
            return dfl_fail(err, DFL_EFORMAT, "%s: %snum_target_layers = %d but the target has %d "
                            "layers: this drafter belongs to another target", file,
                            i ? "dflash_config." : "", n_target, t->c.n_layers);
    }
    TRY(need_int(dc, "mask_token_id", 0, MAX_VOCAB, &d->mask_id, file, err));
    TRY(block_size(d, j, dc, file, err));
    return dfl_draft_layer_ids(d, dc, t, 1, file, err);
}

int dfl_laguna_draft_config(dfl_drafter *d, cJSON *j, const dfl_target *t, const char *file,
                            dfl_error *err) {
    const cJSON *dc = get(j, "dflash_config");
    if (!cJSON_IsObject(dc))
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash_config is missing (expected an object with "
                        "target_layer_ids and mask_token_id)", file);
    TRY(vocab(j, t, file, err));
    dense_mlps(j);
    dfl_config c;
    TRY(dfl_config_from_cjson(j, file, ARCH_LAGUNA, &c, err));
    TRY(layer_shape(&c, j, file, err));
    int sliding = c.layer_kind[0] == DFL_LAYER_SLIDING;
    if (sliding) TRY(pick_rope(&c, j, file, err));
    uint64_t bits = sliding ? ~(uint64_t)0 >> (64 - c.n_layers) : 0;   /* n_layers <= 64 */
    TRY(dfl_draft_swa_rules(d, j, dc, bits, c.sliding_window, file, err));
    TRY(dflash_fields(d, j, dc, t, file, err));
    d->c = c;
    d->ctx_norm = 1;
    return dfl_config_validate(&d->c, file, err);
}
