/* qwen35.c - Qwen3.5 (dense and MoE, text) and Qwen3-Next: hybrids of gated DeltaNet layers
 * (linear_attention: a recurrent state per sequence) and gated full
 * attention (q_proj emits [q | gate] per head, output * sigmoid(gate), q/k
 * norm, partial rotary), each followed by a dense SwiGLU MLP. Every RMSNorm
 * but the DeltaNet's gated one applies 1 + w: those weights are loaded with
 * 1 added. Hugging Face names under "model." (Qwen3_5ForCausalLM) or
 * "model.language_model." (the multimodal class, whose vision tower is not
 * run). The MTP head (mtp.*) is draft/mtp.c's, through dfl_qwen35_load_block. Its config reader is qwen35_config.c; the DeltaNet's
 * forward is gdn.c. */
#include <string.h>

#include "models/family.h"

static const char *name(char *b, const dfl_target *t, int l, const char *sfx) {
    snprintf(b, 256, "%slayers.%d.%s", t->prefix, l, sfx);
    return b;
}

static int mat(dfl_target *t, dfl_weights *w, int l, const char *sfx, int rows, int cols,
               dfl_mat *m, dfl_error *err) {
    char b[256];
    return dfl_w_mat(w, name(b, t, l, sfx), rows, cols, m, err);
}

/* A norm vector: off 1 for the 1 + w norms, 0 for plain weights. */
static int vec(dfl_target *t, dfl_weights *w, int l, const char *sfx, int n, float off,
               const float **v, dfl_error *err) {
    char b[256];
    return dfl_w_vec_offset(w, name(b, t, l, sfx), n, off, v, err);
}

static int load_gdn(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    dfl_gdn *G = t->layers[l].gdn = xcalloc(1, sizeof *G);
    int kd = c->lin_k_heads * c->lin_k_dim, vd = c->lin_v_heads * c->lin_v_dim, ch = 2 * kd + vd;
    int D = c->dim, H = c->lin_v_heads;
    char b[256];
    int conv[3] = {ch, 1, c->lin_conv}, heads[1] = {H};
    G->grouped = t->c.arch == ARCH_QWEN3_NEXT;
    int rc = 0;
    if (G->grouped) {
        rc = mat(t, w, l, "linear_attn.in_proj_qkvz.weight", ch + vd, D, &G->qkv, err);
        rc = rc ? rc : mat(t, w, l, "linear_attn.in_proj_ba.weight", 2 * H, D, &G->b, err);
    } else {
        rc = mat(t, w, l, "linear_attn.in_proj_qkv.weight", ch, D, &G->qkv, err);
        rc = rc ? rc : mat(t, w, l, "linear_attn.in_proj_z.weight", vd, D, &G->z, err);
        rc = rc ? rc : mat(t, w, l, "linear_attn.in_proj_b.weight", H, D, &G->b, err);
        rc = rc ? rc : mat(t, w, l, "linear_attn.in_proj_a.weight", H, D, &G->a, err);
    }
    rc = rc ? rc : mat(t, w, l, "linear_attn.out_proj.weight", D, vd, &G->out, err);
    rc = rc ? rc : dfl_w_array(w, name(b, t, l, "linear_attn.conv1d.weight"), 3, conv, 0,
                               &G->conv, err);
    rc = rc ? rc : dfl_w_array(w, name(b, t, l, "linear_attn.dt_bias"), 1, heads, 0,
                               &G->dt_bias, err);
    rc = rc ? rc : dfl_w_array(w, name(b, t, l, "linear_attn.A_log"), 1, heads, 0, &G->a_log,
                               err);
    return rc ? rc : vec(t, w, l, "linear_attn.norm.weight", c->lin_v_dim, 0, &G->norm, err);
}

/* q_proj keeps its rows [q | gate] per head; the forward splits them. */
static int load_attention(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    dfl_layer *L = &t->layers[l];
    int hd = c->head_dim, qd = L->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc = mat(t, w, l, "self_attn.q_proj.weight", 2 * qd, c->dim, &L->wq, err);
    rc = rc ? rc : mat(t, w, l, "self_attn.k_proj.weight", kvd, c->dim, &L->wk, err);
    rc = rc ? rc : mat(t, w, l, "self_attn.v_proj.weight", kvd, c->dim, &L->wv, err);
    rc = rc ? rc : mat(t, w, l, "self_attn.o_proj.weight", c->dim, qd, &L->wo, err);
    rc = rc ? rc : vec(t, w, l, "self_attn.q_norm.weight", hd, 1, &L->q_norm, err);
    return rc ? rc : vec(t, w, l, "self_attn.k_norm.weight", hd, 1, &L->k_norm, err);
}

int dfl_qwen35_load_block(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    dfl_layer *L = &t->layers[l];
    int rc = c->layer_kind[l] == DFL_LAYER_RECURRENT ? load_gdn(t, w, l, err)
                                                     : load_attention(t, w, l, err);
    rc = rc ? rc : vec(t, w, l, "input_layernorm.weight", c->dim, 1, &L->attn_norm, err);
    rc = rc ? rc : vec(t, w, l, "post_attention_layernorm.weight", c->dim, 1, &L->ffn_norm, err);
    if (!rc && c->mlp_kind[l] == DFL_MLP_MOE) {
        char lfmt[160];
        snprintf(lfmt, sizeof lfmt, "%slayers.%%d.", t->prefix);
        return dfl_load_moe(w, c, lfmt, l, L, err);
    }
    rc = rc ? rc : mat(t, w, l, "mlp.gate_proj.weight", c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : mat(t, w, l, "mlp.up_proj.weight", c->ffn_dim, c->dim, &L->w_up, err);
    return rc ? rc : mat(t, w, l, "mlp.down_proj.weight", c->dim, c->ffn_dim, &L->w_down, err);
}

static int load_layer(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    if (t->gguf)
        return dfl_fail(err, DFL_EUNSUP, "Qwen3.5 from GGUF is not supported yet: use the "
                        "Hugging Face folder");
    if (l == 0) {   /* parts of the checkpoint the target does not run: a vision tower, and
                       the MTP head, which draft/mtp.c loads on its own when asked */
        dfl_w_ignore_prefix(w, "model.visual.");
        for (int i = 0; dfl_mtp_prefixes[i]; i++) dfl_w_ignore_prefix(w, dfl_mtp_prefixes[i]);
    }
    return dfl_qwen35_load_block(t, w, l, err);
}

const char *const dfl_mtp_prefixes[] = {"mtp.", "model.mtp.", "model.language_model.mtp.", NULL};

const dfl_family dfl_family_qwen35 = {"qwen3_5", load_layer};
