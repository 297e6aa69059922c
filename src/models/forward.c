/* forward.c - one forward over rows of several sequences, for any table of
 * layer kinds (config: layer_kind, mlp_kind):
 *   mixer  full or sliding-window attention: q/k/v (+bias), per-head q/k
 *          norm, RoPE of the layer's set (partial rotary allowed), an
 *          optional softplus output gate per head or per element or a
 *          sigmoid gate q_proj emits, o; or a gated DeltaNet (gdn.c);
 *   MLP    dense SwiGLU, or a mixture of experts (sigmoid or softmax
 *          router, a shared expert, optionally gated) whose rows are
 *          grouped by expert, so each expert runs one multi-row product
 *          over just the rows routed to it.
 * Every op is per row or a batch-invariant matmul, attention and the
 * DeltaNet's recurrence read each row's own sequence in order, and a row's
 * expert outputs are summed in ascending expert order: a row's bits never
 * depend on what else is in the call. */
#include <math.h>
#include <string.h>

#include "models/gdn.h"

static void matmul(dfl_target *t, const dfl_mat *W, int n, const float *X, float *Y) {
    dfl_matmul(t->pool, W, n, X, W->cols, Y, W->rows, t->qscratch);
}

/* Two or three products of the same rows x in one dispatch (c may be NULL). */
static void products3(dfl_target *t, int n, const float *x, const dfl_mat *a, float *ya,
                      const dfl_mat *b, float *yb, const dfl_mat *c, float *yc) {
    const dfl_mat *W[3] = {a, b, c};
    const float *X[3] = {x, x, x};
    float *Y[3] = {ya, yb, yc};
    dfl_matmul_group(t->pool, W, n, X, Y, c ? 3 : 2, t->qscratch);
}

static void add_bias(float *y, const float *b, int n, int d) {
    if (!b) return;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < d; i++) y[(size_t)r * d + i] += b[i];
}

static void norm_rows(float *y, const float *x, const float *w, int n, int d, float eps) {
    for (int r = 0; r < n; r++) dfl_rmsnorm(y + (size_t)r * d, x + (size_t)r * d, w, d, eps);
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static void residual_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* Where a forward's rows are: sequence i's rows start at row off[i]. */
typedef struct rows {
    dfl_fwd *f;
    int n_seq, n;          /* sequences, rows in all */
    int off[DFL_MAX_PARALLEL + 1];
} rows;

/* torch's softplus (linear above its threshold 20) */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- attention ------------------------------------------------------------ */

/* The sliding set has its own cos/sin only when its RoPE differs (Laguna). */
static int own_swa(const dfl_target *t) { return t->c.swa_rope_theta > 0; }

static const float *row_cs(const dfl_target *t, const dfl_layer *L, int r) {
    int hd = t->c.head_dim;
    return t->rope_cs + (size_t)r * 2 * hd + (L->rope == &t->rope_swa && own_swa(t) ? hd : 0);
}

/* q_proj's output rows in qg, [q | gate] per head (DFL_GATE_Q_SIGMOID), split
 * into q and gate. */
static void split_q_gate(dfl_target *t, const dfl_layer *L, int n) {
    int hd = t->c.head_dim, qd = L->n_heads * hd;
    for (int r = 0; r < n; r++)
        for (int h = 0; h < L->n_heads; h++) {
            const float *src = t->qg + (size_t)r * 2 * qd + (size_t)h * 2 * hd;
            memcpy(t->q + (size_t)r * qd + (size_t)h * hd, src, sizeof(float) * hd);
            memcpy(t->gate + (size_t)r * qd + (size_t)h * hd, src + hd, sizeof(float) * hd);
        }
}

/* q/k projections, per-head norm, RoPE; K and V land in each row's cache. */
static void attn_inputs(dfl_target *t, const dfl_layer *L, const rows *b, int l) {
    const dfl_config *c = &t->c;
    int n = b->n, hd = c->head_dim, qd = L->n_heads * hd, kvd = c->n_kv_heads * hd;
    int gated = c->gating == DFL_GATE_Q_SIGMOID;
    products3(t, n, t->xn, &L->wq, gated ? t->qg : t->q, &L->wk, t->k, &L->wv, t->v);
    if (gated) split_q_gate(t, L, n);
    add_bias(t->q, L->bq, n, qd);
    add_bias(t->k, L->bk, n, kvd);
    add_bias(t->v, L->bv, n, kvd);
    if (L->q_norm) {
        norm_rows(t->q, t->q, L->q_norm, n * L->n_heads, hd, c->norm_eps);
        norm_rows(t->k, t->k, L->k_norm, n * c->n_kv_heads, hd, c->norm_eps);
    }
    for (int r = 0; r < n; r++) {
        const float *cs = row_cs(t, L, r);
        dfl_rope_apply_cs(L->rope, t->q + (size_t)r * qd, L->n_heads, cs);
        dfl_rope_apply_cs(L->rope, t->k + (size_t)r * kvd, c->n_kv_heads, cs);
    }
    for (int i = 0; i < b->n_seq; i++) {
        dfl_kv *kv = b->f[i].kv;
        for (int r = b->off[i]; r < b->off[i + 1]; r++)
            dfl_kv_store(kv, l, kv->len + r - b->off[i], t->k + (size_t)r * kvd,
                         t->v + (size_t)r * kvd);
    }
}

/* Rows [0, c) of a tree whose ancestors are all the rows before them (the
 * first branch, a chain): their keys lie in order in the cache. */
static int chain_rows(const dfl_fwd *f) {
    int c = 0;
    while (c < f->n && f->parent[c] == c - 1) c++;
    return c;
}

/* The tree rows past the leading chain, one call each: the prefix's whole
 * key blocks in place, the rest gathered in key order (dfl_kv_path_keys). */
static void attend_tree(dfl_target *t, const dfl_layer *L, const dfl_fwd *f, int r0, int from,
                        int l, float scale) {
    int hd = t->c.head_dim, qd = L->n_heads * hd, rows2 = DFL_ATT_BLOCK + t->max_rows;
    for (int i = from; i < f->n; i++) {
        int d = 0;
        for (int a = i; a >= 0; a = f->parent[a]) d++;
        for (int a = i, k = d; a >= 0; a = f->parent[a]) t->tree_path[--k] = a;
        int nk;
        dfl_kv_view v = dfl_kv_path_keys(f->kv, l, t->tree_path, d, t->tree_k, t->tree_v, rows2,
                                         &nk);
        dfl_attention_sinks(t->pool, 1, t->q + (size_t)(r0 + i) * qd, &v, &nk, L->n_heads,
                            t->c.n_kv_heads, hd, scale, L->sinks, t->att + (size_t)(r0 + i) * qd);
    }
}

/* Each sequence's rows attend to its own cache: a row's result never
 * depends on the other sequences in the call. A sliding layer's rows each
 * start at their own first key, so they go one call each (the kernel's key
 * blocks count from a row's first key: the same split alone or batched). */
static void attend(dfl_target *t, const dfl_layer *L, const rows *b, int l) {
    const dfl_config *c = &t->c;
    int hd = c->head_dim, qd = L->n_heads * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < b->n_seq; i++) {
        dfl_kv *kv = b->f[i].kv;
        int r0 = b->off[i], m = b->off[i + 1] - r0, one = kv->layer[l].kind != DFL_LAYER_FULL;
        if (b->f[i].parent) {
            int ch = chain_rows(&b->f[i]);
            attend_tree(t, L, &b->f[i], r0, ch, l, scale);
            m = ch;
        }
        for (int r = r0; r < r0 + m; r += one ? 1 : m) {
            int nk;
            dfl_kv_view v = dfl_kv_keys(kv, l, kv->len + r - r0, &nk);
            dfl_attention_sinks(t->pool, one ? 1 : m, t->q + (size_t)r * qd, &v,
                                one ? &nk : t->n_keys + r, L->n_heads, c->n_kv_heads, hd,
                                scale, L->sinks, t->att + (size_t)r * qd);
        }
    }
}


/* att *= softplus(g_proj(xn)), one gate per head or per element; or
 * att *= sigmoid(gate), the gate q_proj emitted. */
static void output_gate(dfl_target *t, const dfl_layer *L, int n) {
    if (t->c.gating == DFL_GATE_Q_SIGMOID) {
        size_t m = (size_t)n * L->n_heads * t->c.head_dim;
        for (size_t i = 0; i < m; i++) t->att[i] *= sigmoid(t->gate[i]);
        return;
    }
    if (!L->wg.rows) return;
    int hd = t->c.head_dim, qd = L->n_heads * hd, per_head = L->wg.rows == L->n_heads;
    matmul(t, &L->wg, n, t->xn, t->gate);
    for (int r = 0; r < n; r++) {
        float *a = t->att + (size_t)r * qd;
        const float *g = t->gate + (size_t)r * L->wg.rows;
        for (int i = 0; i < qd; i++) a[i] *= softplus(g[per_head ? i / hd : i]);
    }
}

static void attention_layer(dfl_target *t, const dfl_layer *L, const rows *b, int l) {
    attn_inputs(t, L, b, l);
    attend(t, L, b, l);
    output_gate(t, L, b->n);
    matmul(t, &L->wo, b->n, t->att, t->h1);
}

/* ---- MLPs ---------------------------------------------------------------- */

/* out (n, dim) = down(silu(gate(x)) * up(x)) for n rows of x. */
static void swiglu_mlp(dfl_target *t, const dfl_mat *g, const dfl_mat *u, const dfl_mat *d, int n,
                       const float *x, float *out) {
    float *h2 = t->h2 + (size_t)n * g->rows;   /* past the rows' own h2 */
    products3(t, n, x, g, t->h2, u, h2, NULL, NULL);
    dfl_swiglu(t->h2, t->h2, h2, n * g->rows);
    matmul(t, d, n, t->h2, out);
}

/* Router logits (E) to scores in place: softmax, or sigmoid of the
 * (optionally soft-capped) logits. */
static void router_scores(const dfl_config *c, float *lg, int E) {
    if (c->router_softmax) {
        float m = lg[0], sum = 0;
        for (int e = 1; e < E; e++) m = lg[e] > m ? lg[e] : m;
        for (int e = 0; e < E; e++) sum += lg[e] = expf(lg[e] - m);
        for (int e = 0; e < E; e++) lg[e] /= sum;
        return;
    }
    for (int e = 0; e < E; e++) {
        float x = lg[e];
        if (c->router_softcap > 0) x = c->router_softcap * tanhf(x / c->router_softcap);
        lg[e] = c->router_func == DFL_ROUTER_SQRTSOFTPLUS ? sqrtf(softplus(x)) : sigmoid(x);
    }
}

/* Each row's top_k experts (ascending expert order) and their weights. */
static void route(dfl_target *t, const dfl_moe *M, int n) {
    const dfl_config *c = &t->c;
    int E = c->n_experts, K = c->top_k;
    matmul(t, &M->router, n, t->xn, t->router);
    for (int r = 0; r < n; r++) {
        float *lg = t->router + (size_t)r * E, sel[DFL_MAX_EXPERTS];
        router_scores(c, lg, E);
        for (int e = 0; e < E; e++) sel[e] = lg[e] + (M->sel_bias ? M->sel_bias[e] : 0.0f);
        int *ex = t->moe_e + (size_t)r * K;
        for (int k = 0; k < K; k++) {   /* highest selection score, lowest index on ties */
            int best = -1;
            for (int e = 0; e < E; e++)
                if (sel[e] > -INFINITY && (best < 0 || sel[e] > sel[best])) best = e;
            ex[k] = best;
            sel[best] = -INFINITY;
        }
        for (int a = 1; a < K; a++)   /* ascending expert order: the order of the sum */
            for (int j = a; j > 0 && ex[j - 1] > ex[j]; j--) {
                int x = ex[j];
                ex[j] = ex[j - 1], ex[j - 1] = x;
            }
        float sum = 0, *w = t->moe_w + (size_t)r * K;
        for (int k = 0; k < K; k++) sum += lg[ex[k]];
        for (int k = 0; k < K; k++)
            w[k] = (c->norm_topk ? lg[ex[k]] / sum : lg[ex[k]]) * c->routed_scale;
    }
}

static uint64_t mat_bytes(const dfl_mat *m) { return (uint64_t)m->rows * m->row_bytes; }

/* One row (a decode step): its top_k experts' products as two dispatches,
 * gate and up of all, then down of all, where one each would wake the threads
 * 3 x top_k times for products of a few hundred KB. Same bits as the loop in
 * moe_mlp: each product is dfl_matmul's, the terms added in expert order. */
static void experts_one_row(dfl_target *t, const dfl_moe *M) {
    const dfl_config *c = &t->c;
    int K = c->top_k, D = c->dim, F = c->moe_ffn;
    const dfl_mat *W[2 * DFL_MAX_TOPK];
    const float *X[2 * DFL_MAX_TOPK];
    float *Y[2 * DFL_MAX_TOPK];
    const int *ex = t->moe_e;
    for (int k = 0; k < K; k++) {   /* h2: gate k at 2kF, up k at (2k+1)F */
        W[2 * k] = &M->gate[ex[k]], W[2 * k + 1] = &M->up[ex[k]];
        X[2 * k] = X[2 * k + 1] = t->xn;
        Y[2 * k] = t->h2 + (size_t)2 * k * F, Y[2 * k + 1] = t->h2 + (size_t)(2 * k + 1) * F;
    }
    dfl_matmul_group(t->pool, W, 1, X, Y, 2 * K, t->qscratch);
    for (int k = 0; k < K; k++) {
        dfl_swiglu(Y[2 * k], Y[2 * k], Y[2 * k + 1], F);
        W[k] = &M->down[ex[k]], X[k] = Y[2 * k], Y[k] = t->moe_y + (size_t)k * D;
    }
    dfl_matmul_group(t->pool, W, 1, X, Y, K, t->qscratch);
    for (int k = 0; k < K; k++) {
        float w = t->moe_w[k];
        for (int d = 0; d < D; d++) t->h1[d] += w * Y[k][d];
        t->moe_touched++;
        t->moe_bytes += mat_bytes(W[k]) + mat_bytes(&M->gate[ex[k]]) + mat_bytes(&M->up[ex[k]]);
    }
}

/* Experts in ascending order, each over just its rows; a row's terms are
 * added in that order, after the shared expert's output. */
static void moe_mlp(dfl_target *t, const dfl_moe *M, int n) {
    const dfl_config *c = &t->c;
    int K = c->top_k, D = c->dim;
    route(t, M, n);
    if (M->sh_gate.rows) swiglu_mlp(t, &M->sh_gate, &M->sh_up, &M->sh_down, n, t->xn, t->h1);
    else memset(t->h1, 0, sizeof(float) * (size_t)n * D);
    if (M->sh_scale.rows) {   /* the shared expert's output times sigmoid(gate x) */
        matmul(t, &M->sh_scale, n, t->xn, t->sh_gate);
        for (int r = 0; r < n; r++) {
            float g = sigmoid(t->sh_gate[r]), *o = t->h1 + (size_t)r * D;
            for (int d = 0; d < D; d++) o[d] *= g;
        }
    }
    if (n == 1 && K <= t->batch_rows && K <= DFL_MAX_TOPK) {   /* (h2, moe_y: K rows fit) */
        experts_one_row(t, M);
        return;
    }
    for (int e = 0; e < c->n_experts; e++) {
        int m = 0;
        for (int r = 0; r < n; r++)
            for (int k = 0; k < K; k++)
                if (t->moe_e[(size_t)r * K + k] == e) t->moe_rows[m++] = r * K + k;
        if (!m) continue;
        for (int i = 0; i < m; i++)
            memcpy(t->moe_x + (size_t)i * D, t->xn + (size_t)(t->moe_rows[i] / K) * D,
                   sizeof(float) * D);
        swiglu_mlp(t, &M->gate[e], &M->up[e], &M->down[e], m, t->moe_x, t->moe_y);
        for (int i = 0; i < m; i++) {
            float w = t->moe_w[t->moe_rows[i]], *y = t->moe_y + (size_t)i * D;
            float *o = t->h1 + (size_t)(t->moe_rows[i] / K) * D;
            for (int d = 0; d < D; d++) o[d] += w * y[d];
        }
        t->moe_touched++;
        t->moe_bytes += mat_bytes(&M->gate[e]) + mat_bytes(&M->up[e]) + mat_bytes(&M->down[e]);
    }
}

static void layer_forward(dfl_target *t, int l, const rows *b) {
    const dfl_config *c = &t->c;
    const dfl_layer *L = &t->layers[l];
    int n = b->n;
    norm_rows(t->xn, t->x, L->attn_norm, n, c->dim, c->norm_eps);
    if (L->gdn) dfl_gdn_layer(t, L, l, b->f, b->off, b->n_seq);
    else attention_layer(t, L, b, l);
    residual_add(t->x, t->h1, (size_t)n * c->dim);
    norm_rows(t->xn, t->x, L->ffn_norm, n, c->dim, c->norm_eps);
    if (L->moe) moe_mlp(t, L->moe, n);
    else swiglu_mlp(t, &L->w_gate, &L->w_up, &L->w_down, n, t->xn, t->h1);
    residual_add(t->x, t->h1, (size_t)n * c->dim);
}

/* ---- rows in, logits and features out -------------------------------------- */

static void capture(const dfl_target *t, int l, const rows *b) {
    int d = t->c.dim;
    for (int i = 0; i < b->n_seq; i++) {
        const dfl_fwd *f = &b->f[i];
        for (int j = 0; j < f->n_cap; j++) {
            if (f->cap[j] != l) continue;
            for (int r = 0; r < f->n; r++)
                memcpy(f->feat + ((size_t)r * f->n_cap + j) * d,
                       t->x + (size_t)(b->off[i] + r) * d, d * sizeof(float));
        }
    }
}

/* Normed final rows of every sequence that wants logits, packed from row 0 of
 * xn; returns how many. */
static int pack_logit_rows(dfl_target *t, const rows *b) {
    const dfl_config *c = &t->c;
    int m = 0;
    for (int i = 0; i < b->n_seq; i++) {
        const dfl_fwd *f = &b->f[i];
        if (!f->logits || f->logits_from >= f->n) continue;
        int k = f->n - f->logits_from;
        norm_rows(t->xn + (size_t)m * c->dim, t->x + (size_t)(b->off[i] + f->logits_from) * c->dim,
                  t->out_norm, k, c->dim, c->norm_eps);
        m += k;
    }
    return m;
}

/* One lm_head call for all sequences' rows (it is the largest matrix: read
 * once per forward, not once per sequence), then each its own rows. A single
 * sequence gets them in place; so does every sequence when the rows do not
 * fit t->logits. */
static void logits_out(dfl_target *t, const rows *b) {
    int V = t->c.vocab, m = pack_logit_rows(t, b), want = 0;
    for (int i = 0; i < b->n_seq; i++) want += b->f[i].logits && b->f[i].logits_from < b->f[i].n;
    if (!m) return;
    int shared = want > 1 && t->logits && m <= t->batch_rows - t->max_rows;
    if (shared) dfl_target_lm_head(t, t->xn, m, t->logits, t->qscratch);
    for (int i = 0, a = 0; i < b->n_seq; i++) {
        const dfl_fwd *f = &b->f[i];
        if (!f->logits || f->logits_from >= f->n) continue;
        int k = f->n - f->logits_from;
        if (shared)
            memcpy(f->logits, t->logits + (size_t)a * V, (size_t)k * V * sizeof(float));
        else
            dfl_target_lm_head(t, t->xn + (size_t)a * t->c.dim, k, f->logits, t->qscratch);
        a += k;
    }
}

void dfl_target_forward_rows(dfl_target *t, dfl_fwd *f, int n_seq) {
    const dfl_config *c = &t->c;
    int hd = c->head_dim;
    rows b = {.f = f, .n_seq = n_seq};
    for (int i = 0; i < n_seq; i++) {
        b.off[i + 1] = b.off[i] + f[i].n;
        for (int r = 0; r < f[i].n; r++) {
            int row = b.off[i] + r, pos = f[i].kv->len + r;
            if (f[i].parent)   /* a tree row: at its depth (rows before it are placed) */
                pos = f[i].parent[r] < 0 ? f[i].kv->len : t->n_keys[b.off[i] + f[i].parent[r]];
            float *x = t->x + (size_t)row * c->dim;
            if (f[i].embeds) memcpy(x, f[i].embeds + (size_t)r * c->dim, sizeof(float) * c->dim);
            else dfl_target_embed(t, f[i].tok + r, 1, x);
            dfl_rope_cs(&t->rope, pos, t->rope_cs + (size_t)row * 2 * hd);
            if (own_swa(t)) dfl_rope_cs(&t->rope_swa, pos, t->rope_cs + (size_t)row * 2 * hd + hd);
            t->n_keys[row] = pos + 1;
        }
    }
    b.n = b.off[n_seq];
    t->moe_touched = t->moe_bytes = 0;
    for (int i = 0; i < n_seq; i++) dfl_kv_begin(f[i].kv, f[i].n);
    for (int l = 0; l < c->n_layers; l++) {
        layer_forward(t, l, &b);
        capture(t, l, &b);
    }
    for (int i = 0; i < n_seq; i++) f[i].kv->len += f[i].n;
    logits_out(t, &b);
}

void dfl_target_embed(const dfl_target *t, const int32_t *tok, int n, float *out) {
    const dfl_mat *E = &t->embed;
    for (int r = 0; r < n; r++) dfl_mat_row(E, tok[r], out + (size_t)r * E->cols);
}

void dfl_target_lm_head(dfl_target *t, const float *x, int n, float *logits, void *qscratch) {
    dfl_matmul(t->pool, &t->lm_head, n, x, t->c.dim, logits, t->c.vocab, qscratch);
}
