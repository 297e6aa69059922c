/* laguna.c - Poolside's Laguna: sliding-window attention on most layers
 * (layer_types), its own query-head count per layer, q/k RMSNorm, partial
 * rotary with RoPE parameters per layer type (YaRN allowed on full
 * attention), a softplus output gate per head or per element computed from
 * the layer input, a dense first layer, then sigmoid-routed mixtures of
 * experts with a selection-only correction bias and a shared expert.
 * Optional learned sinks on the sliding layers. Its config reader is
 * laguna_config.c; here, Hugging Face tensor names (the experts' layouts:
 * moe.c) and llama.cpp's GGUF names. */
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
        return t->gguf ? dfl_load_moe_gguf(w, c, l, L, err) : dfl_load_moe(w, c, P, l, L, err);
    rc = pmat(w, pre, l, n->gate, c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : pmat(w, pre, l, n->up, c->ffn_dim, c->dim, &L->w_up, err);
    return rc ? rc : pmat(w, pre, l, n->down, c->dim, c->ffn_dim, &L->w_down, err);
}

const dfl_family dfl_family_laguna = {"laguna", load_layer};
