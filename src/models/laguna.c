/* laguna.c - Poolside's Laguna: sliding-window attention on most layers
 * (layer_types), its own query-head count per layer, q/k RMSNorm, partial
 * rotary with RoPE parameters per layer type (YaRN allowed on full
 * attention), a softplus output gate per head or per element computed from
 * the layer input, a dense first layer, then sigmoid-routed mixtures of
 * experts with a selection-only correction bias and a shared expert.
 * Optional learned sinks on the sliding layers. Its config reader is
 * laguna_config.c; here, Hugging Face tensor names, in transformers' layout
 * (fused experts.gate_up_proj, shared_experts) and the published one (one
 * tensor per expert, shared_expert), and llama.cpp's GGUF names. */
#include <string.h>

#include "models/family.h"

/* ---- tensors -------------------------------------------------------------- */

#define P "model.layers.%d."   /* Hugging Face layer prefix */

/* The names both layouts share, after a layer prefix with %d. */
typedef struct names {
    const char *pre, *wq, *wk, *wv, *wo, *wg, *q_norm, *k_norm, *attn_norm, *ffn_norm;
    const char *gate, *up, *down, *sinks;
} names;

static const names hf_names = {
    P, "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.g_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "input_layernorm.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "self_attn.sink",
};

/* llama.cpp's (gguf-py constants.py, MODEL_ARCH.LAGUNA) */
static const names gguf_names = {
    "blk.%d.", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_gate.weight", "attn_q_norm.weight", "attn_k_norm.weight", "attn_norm.weight",
    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
    "attn_sinks.weight",
};

/* pre + sfx with layer l, into b (256 bytes). */
static const char *lname(char *b, const char *pre, const char *sfx, int l) {
    char f[256];
    snprintf(f, sizeof f, "%s%s", pre, sfx);
    return dfl_lname(b, f, l);
}

static int pmat(dfl_weights *w, const char *pre, int l, const char *sfx, int rows, int cols,
                dfl_mat *m, dfl_error *err) {
    char b[256];
    return dfl_w_mat(w, lname(b, pre, sfx, l), rows, cols, m, err);
}

static int pvec(dfl_weights *w, const char *pre, int l, const char *sfx, int n, const float **v,
                dfl_error *err) {
    char b[256];
    return dfl_w_vec(w, lname(b, pre, sfx, l), n, v, err);
}

static int pstack(dfl_weights *w, const char *pre, int l, const char *sfx, int n, int rows,
                  int cols, dfl_mat *m, dfl_error *err) {
    char b[256];
    return dfl_w_stack(w, lname(b, pre, sfx, l), n, rows, cols, m, err);
}

static int mat(dfl_weights *w, int l, const char *sfx, int rows, int cols, dfl_mat *m,
               dfl_error *err) {
    return pmat(w, P, l, sfx, rows, cols, m, err);
}

static int vec(dfl_weights *w, int l, const char *sfx, int n, const float **v, dfl_error *err) {
    return pvec(w, P, l, sfx, n, v, err);
}

static int has(dfl_weights *w, int l, const char *sfx) {
    char b[256];
    return dfl_w_has(w, lname(b, P, sfx, l));
}

/* Experts fused (transformers: gate_up_proj [E, 2I, D], down_proj [E, D, I])
 * or one tensor each (experts.{e}.{gate,up,down}_proj). */
static int experts(dfl_weights *w, const dfl_config *c, int l, dfl_moe *M, dfl_error *err) {
    int E = c->n_experts, I = c->moe_ffn, D = c->dim, rc = 0;
    M->gate = xcalloc(E, sizeof(dfl_mat));
    M->up = xcalloc(E, sizeof(dfl_mat));
    M->down = xcalloc(E, sizeof(dfl_mat));
    if (has(w, l, "mlp.experts.gate_up_proj")) {
        rc = pstack(w, P, l, "mlp.experts.gate_up_proj", E, 2 * I, D, M->gate, err);
        for (int e = 0; e < E && !rc; e++) {
            M->up[e] = M->gate[e];
            M->gate[e].rows = M->up[e].rows = I;
            M->up[e].data += (size_t)I * M->up[e].row_bytes;
        }
        return rc ? rc : pstack(w, P, l, "mlp.experts.down_proj", E, D, I, M->down, err);
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

/* GGUF: router ffn_gate_inp, selection bias exp_probs_b, experts stacked
 * [n_experts, rows, cols] in ffn_{gate,up,down}_exps, shared ffn_*_shexp. */
static int load_moe_gguf(dfl_weights *w, const dfl_config *c, int l, dfl_layer *L,
                         dfl_error *err) {
    const char *G = gguf_names.pre;
    int E = c->n_experts, I = c->moe_ffn, D = c->dim, S = c->shared_ffn;
    dfl_moe *M = L->moe = xcalloc(1, sizeof *M);
    M->gate = xcalloc(E, sizeof(dfl_mat));
    M->up = xcalloc(E, sizeof(dfl_mat));
    M->down = xcalloc(E, sizeof(dfl_mat));
    char b[256];
    int rc = pmat(w, G, l, "ffn_gate_inp.weight", E, D, &M->router, err);
    if (!rc && dfl_w_has(w, lname(b, G, "exp_probs_b.bias", l)))
        rc = pvec(w, G, l, "exp_probs_b.bias", E, &M->sel_bias, err);
    rc = rc ? rc : pstack(w, G, l, "ffn_gate_exps.weight", E, I, D, M->gate, err);
    rc = rc ? rc : pstack(w, G, l, "ffn_up_exps.weight", E, I, D, M->up, err);
    rc = rc ? rc : pstack(w, G, l, "ffn_down_exps.weight", E, D, I, M->down, err);
    if (rc || !S) return rc;
    rc = pmat(w, G, l, "ffn_gate_shexp.weight", S, D, &M->sh_gate, err);
    rc = rc ? rc : pmat(w, G, l, "ffn_up_shexp.weight", S, D, &M->sh_up, err);
    return rc ? rc : pmat(w, G, l, "ffn_down_shexp.weight", D, S, &M->sh_down, err);
}

static int load_layer(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    const names *n = t->gguf ? &gguf_names : &hf_names;
    const char *pre = n->pre;
    dfl_layer *L = &t->layers[l];
    int hd = c->head_dim, qd = L->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc = pmat(w, pre, l, n->wq, qd, c->dim, &L->wq, err);
    rc = rc ? rc : pmat(w, pre, l, n->wk, kvd, c->dim, &L->wk, err);
    rc = rc ? rc : pmat(w, pre, l, n->wv, kvd, c->dim, &L->wv, err);
    rc = rc ? rc : pmat(w, pre, l, n->wo, c->dim, qd, &L->wo, err);
    if (c->gating != DFL_GATE_NONE)
        rc = rc ? rc : pmat(w, pre, l, n->wg, c->gating == DFL_GATE_HEAD ? L->n_heads : qd,
                            c->dim, &L->wg, err);
    if (c->swa_sinks && c->layer_kind[l] == DFL_LAYER_SLIDING)
        rc = rc ? rc : pvec(w, pre, l, n->sinks, L->n_heads, &L->sinks, err);
    rc = rc ? rc : pvec(w, pre, l, n->q_norm, hd, &L->q_norm, err);
    rc = rc ? rc : pvec(w, pre, l, n->k_norm, hd, &L->k_norm, err);
    rc = rc ? rc : pvec(w, pre, l, n->attn_norm, c->dim, &L->attn_norm, err);
    rc = rc ? rc : pvec(w, pre, l, n->ffn_norm, c->dim, &L->ffn_norm, err);
    if (rc) return rc;
    if (c->mlp_kind[l] == DFL_MLP_MOE)
        return t->gguf ? load_moe_gguf(w, c, l, L, err) : load_moe(w, c, l, L, err);
    rc = pmat(w, pre, l, n->gate, c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : pmat(w, pre, l, n->up, c->ffn_dim, c->dim, &L->w_up, err);
    return rc ? rc : pmat(w, pre, l, n->down, c->dim, c->ffn_dim, &L->w_down, err);
}

const dfl_family dfl_family_laguna = {"laguna", load_layer};
