/* laguna_dflash.c - the Laguna DFlash drafter's tensors (its config:
 * laguna_dflash_config.c): aux_hidden_norms.J, and per layer the fused
 * qkv_proj (rows q|k|v) split into row views, g_proj, q/k norms, a dense MLP.
 * vLLM numbers the checkpoint's layers after the target's
 * (layers.{n_target + i}); 0-based files are read too. */
#include <stdio.h>

#include "draft/draft_private.h"

static int lmat(dfl_weights *w, int l, const char *sfx, int rows, int cols, dfl_mat *m,
                dfl_error *err) {
    char b[256];
    snprintf(b, sizeof b, "layers.%d.%s", l, sfx);
    return dfl_w_mat(w, b, rows, cols, m, err);
}

static int lvec(dfl_weights *w, int l, const char *sfx, int n, const float **v, dfl_error *err) {
    char b[256];
    snprintf(b, sizeof b, "layers.%d.%s", l, sfx);
    return dfl_w_vec(w, b, n, v, err);
}

/* wq, wk, wv as row ranges of the fused qkv_proj. */
static void split_qkv(dfl_dlayer *L, int qd, int kvd) {
    L->wq = L->wk = L->wv = L->wqkv;
    L->wq.rows = qd;
    L->wk.rows = L->wv.rows = kvd;
    L->wk.data += (size_t)qd * L->wqkv.row_bytes;
    L->wv.data += (size_t)(qd + kvd) * L->wqkv.row_bytes;
}

/* Layer l's tensors, stored as layers.{f}. */
static int layer(dfl_drafter *d, dfl_weights *w, int l, int f, dfl_error *err) {
    const dfl_config *c = &d->c;
    dfl_dlayer *L = &d->layers[l];
    int hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc = lmat(w, f, "self_attn.qkv_proj.weight", qd + 2 * kvd, c->dim, &L->wqkv, err);
    if (!rc) split_qkv(L, qd, kvd);
    rc = rc ? rc : lmat(w, f, "self_attn.o_proj.weight", c->dim, qd, &L->wo, err);
    if (c->gating != DFL_GATE_NONE)
        rc = rc ? rc : lmat(w, f, "self_attn.g_proj.weight",
                            c->gating == DFL_GATE_HEAD ? c->n_heads : qd, c->dim, &L->wg, err);
    rc = rc ? rc : lvec(w, f, "self_attn.q_norm.weight", hd, &L->q_norm, err);
    rc = rc ? rc : lvec(w, f, "self_attn.k_norm.weight", hd, &L->k_norm, err);
    rc = rc ? rc : lvec(w, f, "input_layernorm.weight", c->dim, &L->attn_norm, err);
    rc = rc ? rc : lvec(w, f, "post_attention_layernorm.weight", c->dim, &L->ffn_norm, err);
    rc = rc ? rc : lmat(w, f, "mlp.gate_proj.weight", c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : lmat(w, f, "mlp.up_proj.weight", c->ffn_dim, c->dim, &L->w_up, err);
    return rc ? rc : lmat(w, f, "mlp.down_proj.weight", c->dim, c->ffn_dim, &L->w_down, err);
}

int dfl_laguna_draft_weights(dfl_drafter *d, dfl_weights *w, dfl_error *err) {
    char b[64];
    int rc = 0;
    for (int i = 0; i < d->n_cap && !rc; i++) {
        snprintf(b, sizeof b, "aux_hidden_norms.%d.weight", i);
        rc = dfl_w_vec(w, b, d->t->c.dim, &d->aux_norm[i], err);
    }
    /* vLLM's files number the drafter's layers after the target's; accept 0-based too. */
    int first = dfl_w_has(w, "layers.0.self_attn.qkv_proj.weight") ? 0 : d->t->c.n_layers;
    for (int l = 0; l < d->c.n_layers && !rc; l++) rc = layer(d, w, l, first + l, err);
    return rc;
}
