/* dflash2.c - what DFlash2DraftModel adds to z-lab's drafter (dflash.c runs
 * the layers; dflash2_config.c reads the keys). Definition as SpecForge's
 * dflash2.py and SGLang's loader name it:
 *   grouped dynamic causal conv, per layer attention_conv and mlp_conv:
 *     sublayer: h += finish(sub(prepare(norm(h)))), with x = norm(h),
 *     dk = kernel_projection(x) viewed [side 2][tap K][group G],
 *     prepare: x'_i = sum_t (base[0][t] + dk_i[0][t][g]) * x_{i-t},
 *     finish:  y'_i = sum_t (base[1][t] + dk_i[1][t][g]) * y_{i-t},
 *     taps before the block's row 0 are zero; channel c is in group
 *     c / conv_group. Only block rows are convolved: the context K/V are
 *     z-lab's.
 *   candidate selector: per output row h (after the final norm), the top-K
 *     of the target head's logits (times output_multiplier, then
 *     softcapped) are the unary scores; a candidate scores
 *     unary + <A[prev] * (P h), B[cand]>; prev starts as the anchor and
 *     becomes each row's pick (a greedy chain walk). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "draft/draft_private.h"

/* Tensor names: Hugging Face (SpecForge / SGLang) and llama.cpp's GGUF
 * (PR #27342); printf formats take the layer. */
typedef struct names2 {
    const char *base[2], *proj[2];
    const char *hidden, *pred, *succ;
} names2;

static const names2 hf2 = {
    {"layers.%d.attention_conv.base_kernel", "layers.%d.mlp_conv.base_kernel"},
    {"layers.%d.attention_conv.kernel_projection.weight",
     "layers.%d.mlp_conv.kernel_projection.weight"},
    "candidate_selector.hidden_projection.weight", "candidate_selector.predecessor_codebook",
    "candidate_selector.successor_codebook"};

static const names2 gguf2 = {
    {"blk.%d.attn_conv_base", "blk.%d.ffn_conv_base"},
    {"blk.%d.attn_conv_proj.weight", "blk.%d.ffn_conv_proj.weight"},
    "selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight"};

int dfl_dflash2_weights(dfl_drafter *d, dfl_weights *w, int gguf, dfl_error *err) {
    const names2 *nm = gguf ? &gguf2 : &hf2;
    int rc = 0, V = d->c.vocab, r = d->sel_rank, dim = d->c.dim;
    int kg = d->conv_k * (dim / d->conv_group), dims[3] = {2, d->conv_k, dim};
    char b[256];
    for (int l = 0; l < d->c.n_layers && !rc; l++)
        for (int sub = 0; sub < 2 && !rc; sub++) {
            dfl_dlayer *L = &d->layers[l];
            snprintf(b, sizeof b, nm->base[sub], l);
            rc = dfl_w_array(w, b, 3, dims, 0.0f, &L->conv_base[sub], err);
            snprintf(b, sizeof b, nm->proj[sub], l);
            rc = rc ? rc : dfl_w_mat(w, b, 2 * kg, dim, &L->conv_proj[sub], err);
        }
    rc = rc ? rc : dfl_w_mat(w, nm->hidden, r, dim, &d->sel_proj, err);
    /* The codebooks stay in their file type whatever --dtype says: a walk
     * converts its rows to the f32 values a load-time conversion gave. */
    int convert = w->convert;
    w->convert = 0;
    rc = rc ? rc : dfl_w_mat(w, nm->pred, V, r, &d->sel_pred, err);
    rc = rc ? rc : dfl_w_mat(w, nm->succ, V, r, &d->sel_succ, err);
    w->convert = convert;
    return rc;
}

/* Row v of a codebook as f32. */
static void codebook_row(const dfl_mat *m, int32_t v, float *out) {
    dfl_mat_row(m, v, out);
}

/* Rows descending, so every y_{i-t} read is still the input. One sum order
 * per element (taps ascending), whatever rows a pass holds. */
void dfl_dflash2_conv(const dfl_drafter *d, const float *base, const float *dk, int ldk,
                      float *y, int n) {
    int dim = d->c.dim, K = d->conv_k, gs = d->conv_group, G = dim / gs;
    for (int i = n - 1; i >= 0; i--) {
        float *yi = y + (size_t)i * dim;
        const float *ki = dk + (size_t)i * ldk;
        for (int c = 0; c < dim; c++) {
            float acc = 0.0f;
            for (int t = 0; t < K && t <= i; t++)
                acc += (base[(size_t)t * dim + c] + ki[t * G + c / gs]) * y[(size_t)(i - t) * dim + c];
            yi[c] = acc;
        }
    }
}

static float unary(const dfl_drafter *d, float l) {
    float x = l * d->sel_mult;
    return d->sel_cap > 0 ? d->sel_cap * tanhf(x / d->sel_cap) : x;
}

/* Insertion into a list kept sorted best first; a tie keeps the lower id
 * first (the ids arrive ascending). NaN never enters. */
void dfl_dflash2_topk(const dfl_drafter *d, const float *logits, int32_t *cand, float *u) {
    int K = d->sel_top_k, n = 0;
    for (int v = 0; v < d->c.vocab; v++) {
        float x = unary(d, logits[v]);
        if (x != x || (n == K && !(x > u[K - 1]))) continue;
        int j = n < K ? n++ : K - 1;
        while (j > 0 && x > u[j - 1]) {
            u[j] = u[j - 1];
            cand[j] = cand[j - 1];
            j--;
        }
        u[j] = x;
        cand[j] = v;
    }
    for (; n < K; n++) cand[n] = cand[0], u[n] = -INFINITY;   /* only a vocab of NaNs */
}

void dfl_dflash2_walk(const dfl_drafter *d, int32_t anchor, int n, const int32_t *cand,
                      const float *u, const float *ph, float *logits, int32_t *draft) {
    int K = d->sel_top_k, r = d->sel_rank, V = d->c.vocab;
    int32_t prev = anchor;
    float ctx[DRAFT_MAX_SEL_RANK], a[DRAFT_MAX_SEL_RANK], b[DRAFT_MAX_SEL_RANK];
    for (int i = 0; i < n; i++) {
        const float *p = ph + (size_t)i * r;
        codebook_row(&d->sel_pred, prev, a);
        for (int k = 0; k < r; k++) ctx[k] = a[k] * p[k];
        float *row = logits ? logits + (size_t)i * V : NULL;
        if (row)
            for (int v = 0; v < V; v++) row[v] = -INFINITY;
        int best = 0;
        float bs = -INFINITY;
        for (int j = 0; j < K; j++) {
            codebook_row(&d->sel_succ, cand[i * K + j], b);
            float s = 0.0f;
            for (int k = 0; k < r; k++) s += ctx[k] * b[k];
            s += u[i * K + j];
            if (s > bs || j == 0) bs = s, best = j;   /* first best wins, as argmax */
            if (row) row[cand[i * K + j]] = s;
        }
        prev = draft[i] = cand[i * K + best];
    }
}

void dfl_hc_mean(const float *x, int n, int hc, int dim, float *y) {
    for (int r = 0; r < n; r++)
        for (int c = 0; c < dim; c++) {
            float acc = 0.0f;
            for (int s = 0; s < hc; s++) acc += x[((size_t)r * hc + s) * dim + c];
            y[(size_t)r * dim + c] = acc / (float)hc;
        }
}
