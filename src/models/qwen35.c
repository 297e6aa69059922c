/* qwen35.c - Qwen3.5 (dense and MoE, text) and Qwen3-Next: hybrids of gated DeltaNet layers
 * (linear_attention: a recurrent state per sequence) and gated full
 * attention (q_proj emits [q | gate] per head, output * sigmoid(gate), q/k
 * norm, partial rotary), each followed by a dense SwiGLU MLP. Every RMSNorm
 * but the DeltaNet's gated one applies 1 + w: those weights are loaded with
 * 1 added. Hugging Face names under "model." (Qwen3_5ForCausalLM) or
 * "model.language_model." (the multimodal class, whose vision tower is not
 * run), or llama.cpp's GGUF names (qwen35, qwen35moe, qwen3next). The MTP
 * head (mtp.*) is draft/mtp.c's, through dfl_qwen35_load_block. Its config
 * reader is qwen35_config.c; the DeltaNet's forward is gdn.c. */
#include <math.h>
#include <string.h>

#include "models/family.h"
#include "models/gdn.h"

/* The names both layouts share, after the layer prefix. */
typedef struct names {
    const char *wq, *wk, *wv, *wo, *q_norm, *k_norm, *attn_norm, *ffn_norm, *gate, *up, *down;
    const char *qkv, *z, *b, *a, *ba, *out, *conv, *dt_bias, *decay, *gdn_norm;
} names;

static const names hf_names = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight", "linear_attn.in_proj_qkv.weight",
    "linear_attn.in_proj_z.weight", "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight",
    "linear_attn.in_proj_ba.weight", "linear_attn.out_proj.weight", "linear_attn.conv1d.weight",
    "linear_attn.dt_bias", "linear_attn.A_log", "linear_attn.norm.weight",
};

/* llama.cpp's (src/llama-arch.cpp; qwen35, qwen35moe, qwen3next): its
 * converter folds the 1 + w norms' 1 in (ssm_norm excepted), stores
 * -exp(A_log) as ssm_a, squeezes the conv to [C, K] and, for Qwen3-Next,
 * splits in_proj_qkvz into attn_qkv [q | k | v] and attn_gate (z). */
static const names gguf_names = {
    "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_q_norm.weight", "attn_k_norm.weight", "attn_norm.weight", "post_attention_norm.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "attn_qkv.weight", "attn_gate.weight",
    "ssm_beta.weight", "ssm_alpha.weight", "ssm_ba.weight", "ssm_out.weight", "ssm_conv1d.weight",
    "ssm_dt.bias", "ssm_a", "ssm_norm.weight",
};

static const char *name(char *b, const dfl_target *t, int l, const char *sfx) {
    if (t->gguf) snprintf(b, 256, "blk.%d.%s", l, sfx);
    else snprintf(b, 256, "%slayers.%d.%s", t->prefix, l, sfx);
    return b;
}

static int mat(dfl_target *t, dfl_weights *w, int l, const char *sfx, int rows, int cols,
               dfl_mat *m, dfl_error *err) {
    char b[256];
    return dfl_w_mat(w, name(b, t, l, sfx), rows, cols, m, err);
}

/* A norm vector: off 1 for the 1 + w norms of a Hugging Face file (a GGUF
 * has the 1 added), 0 for plain weights. */
static int vec(dfl_target *t, dfl_weights *w, int l, const char *sfx, int n, float off,
               const float **v, dfl_error *err) {
    char b[256];
    return dfl_w_vec_offset(w, name(b, t, l, sfx), n, t->gguf ? 0 : off, v, err);
}

static int array(dfl_target *t, dfl_weights *w, int l, const char *sfx, int n_dims,
                 const int *dims, const float **v, dfl_error *err) {
    char b[256];
    return dfl_w_array(w, name(b, t, l, sfx), n_dims, dims, 0, v, err);
}

/* The decay rate A: Hugging Face's A_log made -exp(A_log) once here (the
 * bits the forward computed from it), or the GGUF's ssm_a as stored. */
static int decay(dfl_target *t, dfl_weights *w, int l, const names *n, dfl_gdn *G,
                 dfl_error *err) {
    int H = t->c.lin_v_heads;
    const float *v;
    int rc = array(t, w, l, n->decay, 1, &H, &v, err);
    if (rc) return rc;
    G->decay = v;
    if (t->gguf) return 0;
    float *a = dfl_w_own_floats(w, H, err);
    if (!a) return DFL_ENOMEM;
    for (int h = 0; h < H; h++) a[h] = -expf(v[h]);
    G->decay = a;
    return 0;
}

/* The projections: Qwen3-Next's Hugging Face files fuse q | k | v | z and
 * b | a per key head; its GGUF keeps only b | a fused (ssm_ba). */
static int load_proj(dfl_target *t, dfl_weights *w, int l, const names *n, dfl_gdn *G,
                     dfl_error *err) {
    const dfl_config *c = &t->c;
    int kd = c->lin_k_heads * c->lin_k_dim, vd = c->lin_v_heads * c->lin_v_dim, ch = 2 * kd + vd;
    int D = c->dim, H = c->lin_v_heads, next = c->arch == ARCH_QWEN3_NEXT;
    G->grouped = next && !t->gguf;
    G->ba_grouped = next;
    int rc = G->grouped ? mat(t, w, l, "linear_attn.in_proj_qkvz.weight", ch + vd, D, &G->qkv, err)
                        : mat(t, w, l, n->qkv, ch, D, &G->qkv, err);
    if (!rc && !G->grouped) rc = mat(t, w, l, n->z, vd, D, &G->z, err);
    if (next) return rc ? rc : mat(t, w, l, n->ba, 2 * H, D, &G->b, err);
    rc = rc ? rc : mat(t, w, l, n->b, H, D, &G->b, err);
    return rc ? rc : mat(t, w, l, n->a, H, D, &G->a, err);
}

/* A Qwen3.5 GGUF's value heads back from llama.cpp's tiled order to the
 * grouped one the forward (and the Hugging Face file) has: v's rows of
 * attn_qkv and its conv channels, attn_gate, ssm_beta, ssm_alpha, ssm_dt,
 * ssm_a, and ssm_out's columns (loaded by the caller). */
static int untile(dfl_target *t, dfl_weights *w, dfl_gdn *G, dfl_error *err) {
    const dfl_config *c = &t->c;
    int kd = c->lin_k_heads * c->lin_k_dim, dv = c->lin_v_dim, H = c->lin_v_heads;
    int ch = dfl_gdn_channels(c), K = c->lin_conv;
    dfl_tiling v = {c->lin_k_heads, H / c->lin_k_heads, dv}, one = v;
    one.seg = 1;
    int rc = dfl_w_untile_rows(w, &G->qkv, 2 * kd, &v, err);
    rc = rc ? rc : dfl_w_untile_rows(w, &G->z, 0, &v, err);
    rc = rc ? rc : dfl_w_untile_rows(w, &G->b, 0, &one, err);
    rc = rc ? rc : dfl_w_untile_rows(w, &G->a, 0, &one, err);
    rc = rc ? rc : dfl_w_untile_floats(w, &G->conv, ch * K, 2 * kd, &v, K, err);
    rc = rc ? rc : dfl_w_untile_floats(w, &G->dt_bias, H, 0, &one, 1, err);
    return rc ? rc : dfl_w_untile_floats(w, &G->decay, H, 0, &one, 1, err);
}

static int load_gdn(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    const names *n = t->gguf ? &gguf_names : &hf_names;
    dfl_gdn *G = t->layers[l].gdn = xcalloc(1, sizeof *G);
    int vd = c->lin_v_heads * c->lin_v_dim, ch = dfl_gdn_channels(c);
    int D = c->dim, H = c->lin_v_heads;
    /* llama.cpp's Qwen3.5 converter tiles the value heads when they outnumber the key heads */
    int tiled = t->gguf && c->arch == ARCH_QWEN35 && H != c->lin_k_heads;
    dfl_tiling tv = {c->lin_k_heads, H / c->lin_k_heads, c->lin_v_dim};
    char b[256];
    int conv[3] = {ch, 1, c->lin_conv}, heads[1] = {H};
    if (t->gguf) conv[1] = c->lin_conv;   /* squeezed to [C, K] */
    int rc = load_proj(t, w, l, n, G, err);
    /* ssm_out's columns go back to grouped when its blocks hold whole heads (exactly the
     * folder's sums); else (e.g. Q4_K with heads of 128) the forward writes o tiled */
    const dfl_tensor *ot = dfl_tensors_find(w->ts, name(b, t, l, n->out));
    G->out_tiled = tiled && ot && c->lin_v_dim % dfl_type_block(ot->type) != 0;
    rc = rc ? rc : tiled && !G->out_tiled
                       ? dfl_w_mat_untile_cols(w, name(b, t, l, n->out), D, vd, &tv, &G->out, err)
                       : mat(t, w, l, n->out, D, vd, &G->out, err);
    rc = rc ? rc : array(t, w, l, n->conv, t->gguf ? 2 : 3, conv, &G->conv, err);
    rc = rc ? rc : array(t, w, l, n->dt_bias, 1, heads, &G->dt_bias, err);
    rc = rc ? rc : decay(t, w, l, n, G, err);
    rc = rc ? rc : vec(t, w, l, n->gdn_norm, c->lin_v_dim, 0, &G->norm, err);
    return rc || !tiled ? rc : untile(t, w, G, err);
}

/* q_proj keeps its rows [q | gate] per head; the forward splits them. */
static int load_attention(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    const names *n = t->gguf ? &gguf_names : &hf_names;
    dfl_layer *L = &t->layers[l];
    int hd = c->head_dim, qd = L->n_heads * hd, kvd = c->n_kv_heads * hd;
    int rc = mat(t, w, l, n->wq, 2 * qd, c->dim, &L->wq, err);
    rc = rc ? rc : mat(t, w, l, n->wk, kvd, c->dim, &L->wk, err);
    rc = rc ? rc : mat(t, w, l, n->wv, kvd, c->dim, &L->wv, err);
    rc = rc ? rc : mat(t, w, l, n->wo, c->dim, qd, &L->wo, err);
    rc = rc ? rc : vec(t, w, l, n->q_norm, hd, 1, &L->q_norm, err);
    return rc ? rc : vec(t, w, l, n->k_norm, hd, 1, &L->k_norm, err);
}

int dfl_qwen35_load_block(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    const names *n = t->gguf ? &gguf_names : &hf_names;
    dfl_layer *L = &t->layers[l];
    int rc = c->layer_kind[l] == DFL_LAYER_RECURRENT ? load_gdn(t, w, l, err)
                                                     : load_attention(t, w, l, err);
    rc = rc ? rc : vec(t, w, l, n->attn_norm, c->dim, 1, &L->attn_norm, err);
    rc = rc ? rc : vec(t, w, l, n->ffn_norm, c->dim, 1, &L->ffn_norm, err);
    if (!rc && c->mlp_kind[l] == DFL_MLP_MOE) {
        if (t->gguf) return dfl_load_moe_gguf(w, c, l, L, err);
        char lfmt[160];
        snprintf(lfmt, sizeof lfmt, "%slayers.%%d.", t->prefix);
        return dfl_load_moe(w, c, lfmt, l, L, err);
    }
    rc = rc ? rc : mat(t, w, l, n->gate, c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : mat(t, w, l, n->up, c->ffn_dim, c->dim, &L->w_up, err);
    return rc ? rc : mat(t, w, l, n->down, c->dim, c->ffn_dim, &L->w_down, err);
}

static int load_layer(dfl_target *t, dfl_weights *w, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    if (l == 0 && !t->gguf) {   /* parts of the checkpoint the target does not run: a vision
                                   tower, and the MTP head, which draft/mtp.c loads on its
                                   own when asked */
        dfl_w_ignore_prefix(w, "model.visual.");
        for (int i = 0; dfl_mtp_prefixes[i]; i++) dfl_w_ignore_prefix(w, dfl_mtp_prefixes[i]);
    }
    for (int m = 0; l == 0 && t->gguf && m < c->mtp_blocks; m++) {   /* the MTP head's blocks */
        char b[32];
        snprintf(b, sizeof b, "blk.%d.", c->n_layers + m);
        dfl_w_ignore_prefix(w, b);
    }
    return dfl_qwen35_load_block(t, w, l, err);
}

const char *const dfl_mtp_prefixes[] = {"mtp.", "model.mtp.", "model.language_model.mtp.", NULL};

const dfl_family dfl_family_qwen35 = {"qwen3_5", load_layer};
