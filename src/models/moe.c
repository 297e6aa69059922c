/* moe.c - a mixture-of-experts MLP's tensors, shared by the families that
 * have one (Laguna, Qwen3.5-MoE, Qwen3-Next, Qwen3-MoE): from Hugging Face
 * names, the router, its optional selection bias,
 * the experts fused (transformers' in-memory layout: gate_up_proj [E, 2I, D],
 * down_proj [E, D, I]) or one tensor each (experts.{e}.{gate,up,down}_proj,
 * as published and as save_pretrained writes), the shared expert
 * (shared_expert or shared_experts) and its optional sigmoid gate
 * (shared_expert_gate); and from llama.cpp's GGUF names. */
#include <string.h>

#include "models/family.h"

/* lfmt ("...layers.%d.") with l and sfx, into b (256 bytes). */
static const char *name(char *b, const char *lfmt, int l, const char *sfx) {
    char f[256];
    snprintf(f, sizeof f, "%s%s", lfmt, sfx);
    return dfl_lname(b, f, l);
}

static int mat(dfl_weights *w, const char *lfmt, int l, const char *sfx, int rows, int cols,
               dfl_mat *m, dfl_error *err) {
    char b[256];
    return dfl_w_mat(w, name(b, lfmt, l, sfx), rows, cols, m, err);
}

static int has(dfl_weights *w, const char *lfmt, int l, const char *sfx) {
    char b[256];
    return dfl_w_has(w, name(b, lfmt, l, sfx));
}

static int experts(dfl_weights *w, const dfl_config *c, const char *lfmt, int l, dfl_moe *M,
                   dfl_error *err) {
    int E = c->n_experts, I = c->moe_ffn, D = c->dim, rc = 0;
    M->gate = xcalloc(E, sizeof(dfl_mat));
    M->up = xcalloc(E, sizeof(dfl_mat));
    M->down = xcalloc(E, sizeof(dfl_mat));
    char b[256];
    if (has(w, lfmt, l, "mlp.experts.gate_up_proj")) {
        rc = dfl_w_stack(w, name(b, lfmt, l, "mlp.experts.gate_up_proj"), E, 2 * I, D, M->gate,
                         err);
        for (int e = 0; e < E && !rc; e++) {
            M->up[e] = M->gate[e];
            M->gate[e].rows = M->up[e].rows = I;
            M->up[e].data += (size_t)I * M->up[e].row_bytes;
        }
        return rc ? rc : dfl_w_stack(w, name(b, lfmt, l, "mlp.experts.down_proj"), E, D, I,
                                     M->down, err);
    }
    for (int e = 0; e < E && !rc; e++) {
        char s[128];
        snprintf(s, sizeof s, "mlp.experts.%d.gate_proj.weight", e);
        rc = mat(w, lfmt, l, s, I, D, &M->gate[e], err);
        snprintf(s, sizeof s, "mlp.experts.%d.up_proj.weight", e);
        rc = rc ? rc : mat(w, lfmt, l, s, I, D, &M->up[e], err);
        snprintf(s, sizeof s, "mlp.experts.%d.down_proj.weight", e);
        rc = rc ? rc : mat(w, lfmt, l, s, D, I, &M->down[e], err);
    }
    return rc;
}

int dfl_load_moe(dfl_weights *w, const dfl_config *c, const char *lfmt, int l, dfl_layer *L,
                 dfl_error *err) {
    dfl_moe *M = L->moe = xcalloc(1, sizeof *M);
    char b[256];
    int rc = mat(w, lfmt, l, "mlp.gate.weight", c->n_experts, c->dim, &M->router, err);
    const char *bias = has(w, lfmt, l, "mlp.gate.e_score_correction_bias")
                           ? "mlp.gate.e_score_correction_bias"
                           : has(w, lfmt, l, "mlp.experts.e_score_correction_bias")
                                 ? "mlp.experts.e_score_correction_bias" : NULL;
    if (!rc && bias) rc = dfl_w_vec(w, name(b, lfmt, l, bias), c->n_experts, &M->sel_bias, err);
    rc = rc ? rc : experts(w, c, lfmt, l, M, err);
    if (rc || !c->shared_ffn) return rc;
    const char *sh = has(w, lfmt, l, "mlp.shared_experts.gate_proj.weight") ? "mlp.shared_experts"
                                                                             : "mlp.shared_expert";
    char s[128];
    snprintf(s, sizeof s, "%s.gate_proj.weight", sh);
    rc = mat(w, lfmt, l, s, c->shared_ffn, c->dim, &M->sh_gate, err);
    snprintf(s, sizeof s, "%s.up_proj.weight", sh);
    rc = rc ? rc : mat(w, lfmt, l, s, c->shared_ffn, c->dim, &M->sh_up, err);
    snprintf(s, sizeof s, "%s.down_proj.weight", sh);
    rc = rc ? rc : mat(w, lfmt, l, s, c->dim, c->shared_ffn, &M->sh_down, err);
    if (!rc && has(w, lfmt, l, "mlp.shared_expert_gate.weight"))
        rc = mat(w, lfmt, l, "mlp.shared_expert_gate.weight", 1, c->dim, &M->sh_scale, err);
    return rc;
}

/* GGUF (llama.cpp's names): router ffn_gate_inp, selection bias exp_probs_b,
 * experts stacked [n_experts, rows, cols] in ffn_{gate,up,down}_exps, the
 * shared expert ffn_*_shexp and its sigmoid gate ffn_gate_inp_shexp [1, dim]. */
int dfl_load_moe_gguf(dfl_weights *w, const dfl_config *c, int l, dfl_layer *L, dfl_error *err) {
    const char *G = "blk.%d.";
    int E = c->n_experts, I = c->moe_ffn, D = c->dim, S = c->shared_ffn;
    dfl_moe *M = L->moe = xcalloc(1, sizeof *M);
    M->gate = xcalloc(E, sizeof(dfl_mat));
    M->up = xcalloc(E, sizeof(dfl_mat));
    M->down = xcalloc(E, sizeof(dfl_mat));
    char b[256];
    int rc = mat(w, G, l, "ffn_gate_inp.weight", E, D, &M->router, err);
    if (!rc && has(w, G, l, "exp_probs_b.bias"))
        rc = dfl_w_vec(w, name(b, G, l, "exp_probs_b.bias"), E, &M->sel_bias, err);
    rc = rc ? rc : dfl_w_stack(w, name(b, G, l, "ffn_gate_exps.weight"), E, I, D, M->gate, err);
    rc = rc ? rc : dfl_w_stack(w, name(b, G, l, "ffn_up_exps.weight"), E, I, D, M->up, err);
    rc = rc ? rc : dfl_w_stack(w, name(b, G, l, "ffn_down_exps.weight"), E, D, I, M->down, err);
    if (rc || !S) return rc;
    rc = mat(w, G, l, "ffn_gate_shexp.weight", S, D, &M->sh_gate, err);
    rc = rc ? rc : mat(w, G, l, "ffn_up_shexp.weight", S, D, &M->sh_up, err);
    rc = rc ? rc : mat(w, G, l, "ffn_down_shexp.weight", D, S, &M->sh_down, err);
    if (!rc && has(w, G, l, "ffn_gate_inp_shexp.weight"))
        rc = mat(w, G, l, "ffn_gate_inp_shexp.weight", 1, D, &M->sh_scale, err);
    return rc;
}
