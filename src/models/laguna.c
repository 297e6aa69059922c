/* laguna.c - Poolside's Laguna: sliding-window attention on most layers
 * (layer_types), its own query-head count per layer, q/k RMSNorm, partial
 * rotary with RoPE parameters per layer type (YaRN allowed on full
 * attention), a softplus output gate per head or per element computed from
 * the layer input, a dense first layer, then sigmoid-routed mixtures of
 * experts with a selection-only correction bias and a shared expert.
 * Its config reader is laguna_config.c; here, Hugging Face tensor names (the
 * experts' layouts: moe.c). */
#include <string.h>

#include "models/family.h"

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
    if (c->mlp_kind[l] == DFL_MLP_MOE) return dfl_load_moe(w, c, P, l, L, err);
    rc = mat(w, l, "mlp.gate_proj.weight", c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : mat(w, l, "mlp.up_proj.weight", c->ffn_dim, c->dim, &L->w_up, err);
    return rc ? rc : mat(w, l, "mlp.down_proj.weight", c->dim, c->ffn_dim, &L->w_down, err);
}

const dfl_family dfl_family_laguna = {"laguna", load_layer};
