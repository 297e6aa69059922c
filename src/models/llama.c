/* llama.c - the dense decoder family: Llama / Mistral, Qwen2 (q/k/v bias),
 * Qwen3 (per-head q/k RMSNorm). Loaded from a Hugging Face folder or a GGUF
 * file; forward runs n rows of one sequence through the KV cache. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "models/model.h"
#include "models/weights.h"

/* ---- tensor names ------------------------------------------------------- */

typedef struct names {
    const char *embed, *lm_head, *out_norm;
    const char *wq, *wk, *wv, *wo, *gate, *up, *down;   /* printf formats with %d */
    const char *bq, *bk, *bv, *attn_norm, *ffn_norm, *q_norm, *k_norm;
} names;

static const names hf_names = {
    "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight", "model.layers.%d.self_attn.q_proj.bias",
    "model.layers.%d.self_attn.k_proj.bias", "model.layers.%d.self_attn.v_proj.bias",
    "model.layers.%d.input_layernorm.weight", "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
};

static const names gguf_names = {
    "token_embd.weight", "output.weight", "output_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight", "blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias",
    "blk.%d.attn_norm.weight", "blk.%d.ffn_norm.weight", "blk.%d.attn_q_norm.weight",
    "blk.%d.attn_k_norm.weight",
};

static const char *lname(char *buf, const char *fmt, int l) {
    snprintf(buf, 256, fmt, l);
    return buf;
}

/* ---- loading ------------------------------------------------------------ */

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int open_source(dfl_target *t, const char *path, dfl_error *err) {
    if (is_file(path)) {
        t->gguf = xcalloc(1, sizeof *t->gguf);
        int rc = dfl_gguf_open(path, t->gguf, err);
        if (rc) return rc;
        return dfl_config_from_gguf(t->gguf, &t->c, err);
    }
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    if (!is_file(cfg))
        return dfl_fail(err, DFL_EIO,
                        "%s: neither a .gguf file nor a folder with config.json "
                        "(pass a Hugging Face model folder or a GGUF file)", path);
    int rc = dfl_config_from_hf(cfg, &t->c, err);
    if (rc) return rc;
    return dfl_safetensors_open_dir(path, &t->ts, err);
}

static int load_layer(dfl_target *t, dfl_weights *w, const names *nm, int l, dfl_error *err) {
    const dfl_config *c = &t->c;
    dfl_layer *L = &t->layers[l];
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    char b[256];
    int rc = 0;
    rc = rc ? rc : dfl_w_mat(w, lname(b, nm->wq, l), qd, c->dim, &L->wq, err);
    rc = rc ? rc : dfl_w_mat(w, lname(b, nm->wk, l), kvd, c->dim, &L->wk, err);
    rc = rc ? rc : dfl_w_mat(w, lname(b, nm->wv, l), kvd, c->dim, &L->wv, err);
    rc = rc ? rc : dfl_w_mat(w, lname(b, nm->wo, l), c->dim, qd, &L->wo, err);
    rc = rc ? rc : dfl_w_mat(w, lname(b, nm->gate, l), c->ffn_dim, c->dim, &L->w_gate, err);
    rc = rc ? rc : dfl_w_mat(w, lname(b, nm->up, l), c->ffn_dim, c->dim, &L->w_up, err);
    rc = rc ? rc : dfl_w_mat(w, lname(b, nm->down, l), c->dim, c->ffn_dim, &L->w_down, err);
    rc = rc ? rc : dfl_w_vec(w, lname(b, nm->attn_norm, l), c->dim, &L->attn_norm, err);
    rc = rc ? rc : dfl_w_vec(w, lname(b, nm->ffn_norm, l), c->dim, &L->ffn_norm, err);
    if (t->unpermute) {
        rc = rc ? rc : dfl_w_unpermute(w, &L->wq, c->n_heads, c->head_dim, err);
        rc = rc ? rc : dfl_w_unpermute(w, &L->wk, c->n_kv_heads, c->head_dim, err);
    }
    if (c->qkv_bias) {
        rc = rc ? rc : dfl_w_vec(w, lname(b, nm->bq, l), qd, &L->bq, err);
        rc = rc ? rc : dfl_w_vec(w, lname(b, nm->bk, l), kvd, &L->bk, err);
        rc = rc ? rc : dfl_w_vec(w, lname(b, nm->bv, l), kvd, &L->bv, err);
    }
    if (c->qk_norm) {
        rc = rc ? rc : dfl_w_vec(w, lname(b, nm->q_norm, l), c->head_dim, &L->q_norm, err);
        rc = rc ? rc : dfl_w_vec(w, lname(b, nm->k_norm, l), c->head_dim, &L->k_norm, err);
    }
    return rc;
}

static int load_weights(dfl_target *t, const dfl_load_opts *o, dfl_error *err) {
    const dfl_config *c = &t->c;
    const names *nm = t->gguf ? &gguf_names : &hf_names;
    dfl_tensors *ts = t->gguf ? &t->gguf->tensors : &t->ts;
    dfl_weights w;
    int rc = dfl_w_begin(&w, ts, o, err);
    if (rc) return rc;
    rc = dfl_w_mat(&w, nm->embed, c->vocab, c->dim, &t->embed, err);
    rc = rc ? rc : dfl_w_vec(&w, nm->out_norm, c->dim, &t->out_norm, err);
    if (!rc) {
        if (dfl_tensors_find(ts, nm->lm_head) || !c->tied_embed)
            rc = dfl_w_mat(&w, nm->lm_head, c->vocab, c->dim, &t->lm_head, err);
        else
            t->lm_head = t->embed;
    }
    t->layers = xcalloc(c->n_layers, sizeof *t->layers);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        rc = load_layer(t, &w, nm, l, err);
        if (o->progress) o->progress(o->progress_ud, "load", l + 1, c->n_layers);
    }
    if (!rc && t->gguf) rc = dfl_w_rope_freqs(&w, "rope_freqs.weight", &t->rope, err);
    /* Old Llama checkpoints carry rotary buffers the forward recomputes. */
    if (!rc) dfl_w_ignore(&w, ".rotary_emb.inv_freq");
    if (!rc) rc = dfl_w_end(&w, err);
    t->owned = w.owned;
    return rc;
}

static uint64_t mat_bytes(const dfl_mat *m) { return (uint64_t)m->rows * m->row_bytes; }

static void alloc_scratch(dfl_target *t) {
    const dfl_config *c = &t->c;
    int R = t->batch_rows, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    if (R > t->max_rows)
        t->logits = dfl_aligned_alloc((size_t)(R - t->max_rows) * c->vocab * sizeof(float));
    t->x = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    t->xn = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    t->q = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    t->k = dfl_aligned_alloc((size_t)R * kvd * sizeof(float));
    t->v = dfl_aligned_alloc((size_t)R * kvd * sizeof(float));
    t->att = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    t->h1 = dfl_aligned_alloc((size_t)R * c->ffn_dim * sizeof(float));
    t->h2 = dfl_aligned_alloc((size_t)R * c->ffn_dim * sizeof(float));
    t->n_keys = xcalloc(R, sizeof(int));
    t->rope_cs = dfl_aligned_alloc((size_t)R * c->head_dim * sizeof(float));
    size_t qs = 0;
    const dfl_layer *L = &t->layers[0];
    const dfl_mat *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                           &t->lm_head};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        size_t s = dfl_matmul_scratch(ms[i]->type, R, ms[i]->cols);
        if (s > qs) qs = s;
    }
    t->qscratch = dfl_aligned_alloc(qs);
    /* Cache-resident models: transposed copies for dfl_matmul (8 outputs
     * per vector; the weights are not streamed from memory). */
    dfl_mat_transpose(&t->lm_head);
    for (int l = 0; l < c->n_layers; l++) {
        dfl_layer *y = &t->layers[l];
        dfl_mat *ms[] = {&y->wq, &y->wk, &y->wv, &y->wo, &y->w_gate, &y->w_up, &y->w_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) dfl_mat_transpose(ms[i]);
    }
    t->weight_bytes = mat_bytes(&t->lm_head);
    for (int l = 0; l < c->n_layers; l++) {
        const dfl_layer *y = &t->layers[l];
        t->weight_bytes += mat_bytes(&y->wq) + mat_bytes(&y->wk) + mat_bytes(&y->wv) +
                           mat_bytes(&y->wo) + mat_bytes(&y->w_gate) + mat_bytes(&y->w_up) +
                           mat_bytes(&y->w_down);
    }
}

/* The cache type named by o (NULL: f16). */
static int kv_type(const dfl_load_opts *o, dfl_type *t, dfl_error *err) {
    const char *s = o->kv_type ? o->kv_type : "f16";
    *t = (dfl_type)dfl_type_from_name(s);
    if (*t != DFL_F16 && *t != DFL_F32)
        return dfl_fail(err, DFL_EARG, "unknown KV cache type '%s' (expected f16 or f32)", s);
    return 0;
}

int dfl_target_load(const char *path, const dfl_load_opts *o, dfl_target **out, dfl_error *err) {
    dfl_type kt;
    *out = NULL;
    if (kv_type(o, &kt, err)) return DFL_EARG;
    dfl_target *t = xcalloc(1, sizeof *t);
    t->kv_type = kt;
    int rc = open_source(t, path, err);
    if (!rc) rc = dfl_config_validate(&t->c, path, err);
    if (!rc && !t->c.rope_neox) {
        t->unpermute = 1;
        t->c.rope_neox = 1;
    }
    if (!rc) {
        dfl_rope_init(&t->rope, &t->c);
        rc = load_weights(t, o, err);
    }
    if (rc) {
        dfl_target_free(t);
        return rc;
    }
    t->pool = o->pool;
    dfl_ticket_init(&t->lock);
    t->max_rows = o->max_rows > 0 ? o->max_rows : 64;
    t->batch_rows = o->batch_rows > t->max_rows ? o->batch_rows : t->max_rows;
    t->comb = dfl_combiner_new(t->batch_rows);
    alloc_scratch(t);
    *out = t;
    return 0;
}

void dfl_target_free(dfl_target *t) {
    if (!t) return;
    if (t->x) dfl_ticket_destroy(&t->lock);
    dfl_combiner_free(t->comb);
    free(t->lm_head.wt);
    for (int l = 0; t->layers && l < t->c.n_layers; l++) {
        dfl_layer *y = &t->layers[l];
        free(y->wq.wt), free(y->wk.wt), free(y->wv.wt), free(y->wo.wt);
        free(y->w_gate.wt), free(y->w_up.wt), free(y->w_down.wt);
    }
    free(t->layers);
    free(t->rope.inv_freq);
    dfl_weights_free_owned(t->owned);
    dfl_tensors_free(&t->ts);
    if (t->gguf) {
        dfl_gguf_free(t->gguf);
        free(t->gguf);
    }
    free(t->x), free(t->xn), free(t->q), free(t->k), free(t->v), free(t->att);
    free(t->h1), free(t->h2), free(t->n_keys), free(t->qscratch), free(t->rope_cs);
    free(t->logits);
    free(t);
}

/* ---- sequence state ----------------------------------------------------- */

dfl_kv *dfl_kv_new(const dfl_target *t, int cap) {
    const dfl_config *c = &t->c;
    dfl_kv_shape s = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                      .head_dim = c->head_dim, .type = t->kv_type, .kind = c->layer_kind,
                      .window = c->sliding_window, .max_rows = t->max_rows};
    return dfl_kv_make(&s, cap);
}

/* ---- forward ------------------------------------------------------------ */

static void matmul(dfl_target *t, const dfl_mat *W, int n, const float *X, float *Y) {
    dfl_matmul(t->pool, W, n, X, W->cols, Y, W->rows, t->qscratch);
}

static void add_bias(float *y, const float *b, int n, int d) {
    if (!b) return;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < d; i++) y[(size_t)r * d + i] += b[i];
}

static void norm_rows(float *y, const float *x, const float *w, int n, int d, float eps) {
    for (int r = 0; r < n; r++) dfl_rmsnorm(y + (size_t)r * d, x + (size_t)r * d, w, d, eps);
}

/* Where a forward's rows are: sequence i's rows start at row off[i]. */
typedef struct rows {
    dfl_fwd *f;
    int n_seq, n;          /* sequences, rows in all */
    int off[DFL_MAX_PARALLEL + 1];
} rows;

/* q/k projections, per-head norm (Qwen3), RoPE; K and V land in each row's cache. */
static void attn_inputs(dfl_target *t, const dfl_layer *L, const rows *b, int l) {
    const dfl_config *c = &t->c;
    int n = b->n, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    matmul(t, &L->wq, n, t->xn, t->q);
    matmul(t, &L->wk, n, t->xn, t->k);
    matmul(t, &L->wv, n, t->xn, t->v);
    add_bias(t->q, L->bq, n, qd);
    add_bias(t->k, L->bk, n, kvd);
    add_bias(t->v, L->bv, n, kvd);
    if (L->q_norm) {
        norm_rows(t->q, t->q, L->q_norm, n * c->n_heads, hd, c->norm_eps);
        norm_rows(t->k, t->k, L->k_norm, n * c->n_kv_heads, hd, c->norm_eps);
    }
    for (int r = 0; r < n; r++) {
        const float *cs = t->rope_cs + (size_t)r * hd;
        dfl_rope_apply_cs(&t->rope, t->q + (size_t)r * qd, c->n_heads, cs);
        dfl_rope_apply_cs(&t->rope, t->k + (size_t)r * kvd, c->n_kv_heads, cs);
    }
    for (int i = 0; i < b->n_seq; i++) {
        dfl_kv *kv = b->f[i].kv;
        for (int r = b->off[i]; r < b->off[i + 1]; r++)
            dfl_kv_store(kv, l, kv->len + r - b->off[i], t->k + (size_t)r * kvd,
                         t->v + (size_t)r * kvd);
    }
}

static void residual_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* Each sequence's rows attend to its own cache: a row's result never
 * depends on the other sequences in the call. A sliding layer's rows each
 * start at their own first key, so they go one call each (the kernel's key
 * blocks count from a row's first key: the same split alone or batched). */
static void attend(dfl_target *t, const rows *b, int l) {
    const dfl_config *c = &t->c;
    int hd = c->head_dim, qd = c->n_heads * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < b->n_seq; i++) {
        dfl_kv *kv = b->f[i].kv;
        int r0 = b->off[i], m = b->off[i + 1] - r0, one = kv->layer[l].kind != DFL_LAYER_FULL;
        for (int r = r0; r < r0 + m; r += one ? 1 : m) {
            int nk;
            dfl_kv_view v = dfl_kv_keys(kv, l, kv->len + r - r0, &nk);
            dfl_attention(t->pool, one ? 1 : m, t->q + (size_t)r * qd, &v, one ? &nk : t->n_keys + r,
                          c->n_heads, c->n_kv_heads, hd, scale, t->att + (size_t)r * qd);
        }
    }
}

static void layer_forward(dfl_target *t, int l, const rows *b) {
    const dfl_config *c = &t->c;
    const dfl_layer *L = &t->layers[l];
    int n = b->n;
    norm_rows(t->xn, t->x, L->attn_norm, n, c->dim, c->norm_eps);
    attn_inputs(t, L, b, l);
    attend(t, b, l);
    matmul(t, &L->wo, n, t->att, t->xn);
    residual_add(t->x, t->xn, (size_t)n * c->dim);

    norm_rows(t->xn, t->x, L->ffn_norm, n, c->dim, c->norm_eps);
    matmul(t, &L->w_gate, n, t->xn, t->h1);
    matmul(t, &L->w_up, n, t->xn, t->h2);
    dfl_swiglu(t->h1, t->h1, t->h2, n * c->ffn_dim);
    matmul(t, &L->w_down, n, t->h1, t->xn);
    residual_add(t->x, t->xn, (size_t)n * c->dim);
}

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
    rows b = {.f = f, .n_seq = n_seq};
    for (int i = 0; i < n_seq; i++) {
        b.off[i + 1] = b.off[i] + f[i].n;
        for (int r = 0; r < f[i].n; r++) {
            int row = b.off[i] + r, pos = f[i].kv->len + r;
            dfl_target_embed(t, f[i].tok + r, 1, t->x + (size_t)row * c->dim);
            dfl_rope_cs(&t->rope, pos, t->rope_cs + (size_t)row * c->head_dim);
            t->n_keys[row] = pos + 1;
        }
    }
    b.n = b.off[n_seq];
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
    for (int r = 0; r < n; r++)
        dfl_dequant_row(E->type, E->data + (size_t)tok[r] * E->row_bytes, out + (size_t)r * E->cols,
                        E->cols);
}

void dfl_target_lm_head(dfl_target *t, const float *x, int n, float *logits, void *qscratch) {
    dfl_matmul(t->pool, &t->lm_head, n, x, t->c.dim, logits, t->c.vocab, qscratch);
}
