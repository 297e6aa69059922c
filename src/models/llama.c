/* llama.c - the attention decoder family: Llama / Mistral, Qwen2 (q/k/v
 * bias), Qwen3 (per-head q/k RMSNorm); every layer attention (full or
 * sliding, as the config says) and a dense SwiGLU MLP, or Qwen3-MoE's
 * mixture of experts on its sparse layers (moe.c). Hugging Face or GGUF
 * names (llama.cpp's qwen3moe for the experts). */
#include <string.h>

#include "models/family.h"

/* ---- tensor names ------------------------------------------------------- */

typedef struct names {
    const char *wq, *wk, *wv, *wo, *gate, *up, *down;   /* printf formats with %d */
    const char *bq, *bk, *bv, *attn_norm, *ffn_norm, *q_norm, *k_norm;
} names;

static const names hf_names = {
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight", "model.layers.%d.self_attn.q_proj.bias",
    "model.layers.%d.self_attn.k_proj.bias", "model.layers.%d.self_attn.v_proj.bias",
    "model.layers.%d.input_layernorm.weight", "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
};

static const names gguf_names = {
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight", "blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias",
    "blk.%d.attn_norm.weight", "blk.%d.ffn_norm.weight", "blk.%d.attn_q_norm.weight",
    "blk.%d.attn_k_norm.weight",
};

static int load_layer(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const names *nm = t->gguf ? &gguf_names : &hf_names;
    const dfl_config *c = &t->c;
    dfl_layer *L = &t->layers[l];
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    char b[256];
    int rc = 0;
    rc = rc ? rc : dfl_w_mat(w, dfl_lname(b, nm->wq, l), qd, c->dim, &L->wq, err);
    rc = rc ? rc : dfl_w_mat(w, dfl_lname(b, nm->wk, l), kvd, c->dim, &L->wk, err);
    rc = rc ? rc : dfl_w_mat(w, dfl_lname(b, nm->wv, l), kvd, c->dim, &L->wv, err);
    rc = rc ? rc : dfl_w_mat(w, dfl_lname(b, nm->wo, l), c->dim, qd, &L->wo, err);
    if (c->mlp_kind[l] == DFL_MLP_MOE) {
        rc = rc ? rc : t->gguf ? dfl_load_moe_gguf(w, c, l, L, err)
                               : dfl_load_moe(w, c, "model.layers.%d.", l, L, err);
    } else {
        rc = rc ? rc : dfl_w_mat(w, dfl_lname(b, nm->gate, l), c->ffn_dim, c->dim, &L->w_gate,
                                 err);
        rc = rc ? rc : dfl_w_mat(w, dfl_lname(b, nm->up, l), c->ffn_dim, c->dim, &L->w_up, err);
        rc = rc ? rc : dfl_w_mat(w, dfl_lname(b, nm->down, l), c->dim, c->ffn_dim, &L->w_down,
                                 err);
    }
    rc = rc ? rc : dfl_w_vec(w, dfl_lname(b, nm->attn_norm, l), c->dim, &L->attn_norm, err);
    rc = rc ? rc : dfl_w_vec(w, dfl_lname(b, nm->ffn_norm, l), c->dim, &L->ffn_norm, err);
    if (t->unpermute) {
        rc = rc ? rc : dfl_w_unpermute(w, &L->wq, c->n_heads, c->head_dim, err);
        rc = rc ? rc : dfl_w_unpermute(w, &L->wk, c->n_kv_heads, c->head_dim, err);
    }
    if (c->qkv_bias) {
        rc = rc ? rc : dfl_w_vec(w, dfl_lname(b, nm->bq, l), qd, &L->bq, err);
        rc = rc ? rc : dfl_w_vec(w, dfl_lname(b, nm->bk, l), kvd, &L->bk, err);
        rc = rc ? rc : dfl_w_vec(w, dfl_lname(b, nm->bv, l), kvd, &L->bv, err);
    }
    if (c->qk_norm) {
        rc = rc ? rc : dfl_w_vec(w, dfl_lname(b, nm->q_norm, l), c->head_dim, &L->q_norm, err);
        rc = rc ? rc : dfl_w_vec(w, dfl_lname(b, nm->k_norm, l), c->head_dim, &L->k_norm, err);
    }
    return rc;
}

const dfl_family dfl_family_dense = {"dense", load_layer};
