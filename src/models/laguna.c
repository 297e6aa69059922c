/* laguna.c - Poolside's Laguna: sliding-window attention on most layers
 * (layer_types), its own query-head count per layer, q/k RMSNorm, partial
 * rotary with RoPE parameters per layer type (YaRN allowed on full
 * attention), a softplus output gate per head or per element computed from
 * the layer input, a dense first layer, then sigmoid-routed mixtures of
 * experts with a selection-only correction bias and a shared expert.
 * Its config reader is laguna_config.c; here, Hugging Face tensor names, in transformers' layout
 * (fused experts.gate_up_proj, shared_experts) and the published one (one
 * tensor per expert, shared_expert). */
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
