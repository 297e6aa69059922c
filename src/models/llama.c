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
    int R = t->max_rows, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
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
    alloc_scratch(t);
    *out = t;
    return 0;
}

void dfl_target_free(dfl_target *t) {
    if (!t) return;
    if (t->x) dfl_ticket_destroy(&t->lock);
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
    free(t);
}

/* ---- KV cache ----------------------------------------------------------- */

dfl_kv *dfl_kv_new(const dfl_target *t, int cap) {
    dfl_kv *kv = xcalloc(1, sizeof *kv);
    kv->cap = cap;
    kv->n_layers = t->c.n_layers;
    kv->n_kv_heads = t->c.n_kv_heads;
    kv->head_dim = t->c.head_dim;
    kv->kv_dim = t->c.n_kv_heads * t->c.head_dim;
    kv->type = t->kv_type;
    size_t n = (size_t)kv->n_layers * cap * kv->kv_dim;
    kv->k = xcalloc(n, dfl_type_block_bytes(kv->type));
    kv->v = xcalloc(n, dfl_type_block_bytes(kv->type));
    return kv;
}

void dfl_kv_free(dfl_kv *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

void dfl_kv_truncate(dfl_kv *kv, int n_keep) {
    if (n_keep < kv->len) kv->len = n_keep < 0 ? 0 : n_keep;
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

/* q/k projections, per-head norm (Qwen3), RoPE; K and V land in the cache. */
static void attn_inputs(dfl_target *t, const dfl_layer *L, dfl_kv *kv, int l, int n, int pos0) {
    const dfl_config *c = &t->c;
    int hd = c->head_dim, qd = c->n_heads * hd, kvd = kv->kv_dim;
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
    for (int h = 0; h < c->n_kv_heads; h++)
        for (int r = 0; r < n; r++) {
            size_t i = (size_t)r * kvd + h * hd;
            dfl_quant_row(kv->type, t->k + i, dfl_kv_row(kv, kv->k, l, h, pos0 + r), hd);
            dfl_quant_row(kv->type, t->v + i, dfl_kv_row(kv, kv->v, l, h, pos0 + r), hd);
        }
}

static void residual_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static void layer_forward(dfl_target *t, int l, dfl_kv *kv, int n, int pos0) {
    const dfl_config *c = &t->c;
    const dfl_layer *L = &t->layers[l];
    int hd = c->head_dim, qd = c->n_heads * hd;
    norm_rows(t->xn, t->x, L->attn_norm, n, c->dim, c->norm_eps);
    attn_inputs(t, L, kv, l, n, pos0);
    for (int r = 0; r < n; r++) t->n_keys[r] = pos0 + r + 1;
    dfl_kv_view v = {dfl_kv_row(kv, kv->k, l, 0, 0), dfl_kv_row(kv, kv->v, l, 0, 0), kv->type, hd,
                     (size_t)kv->cap * hd};
    dfl_attention(t->pool, n, t->q, &v, t->n_keys, c->n_heads, c->n_kv_heads, hd,
                  1.0f / sqrtf((float)hd), t->att);
    matmul(t, &L->wo, n, t->att, t->xn);
    residual_add(t->x, t->xn, (size_t)n * c->dim);
    (void)qd;

    norm_rows(t->xn, t->x, L->ffn_norm, n, c->dim, c->norm_eps);
    matmul(t, &L->w_gate, n, t->xn, t->h1);
    matmul(t, &L->w_up, n, t->xn, t->h2);
    dfl_swiglu(t->h1, t->h1, t->h2, n * c->ffn_dim);
    matmul(t, &L->w_down, n, t->h1, t->xn);
    residual_add(t->x, t->xn, (size_t)n * c->dim);
}

static void capture(const dfl_target *t, int l, const int *cap, int n_cap, int n, float *feat) {
    int d = t->c.dim;
    for (int j = 0; j < n_cap; j++) {
        if (cap[j] != l) continue;
        for (int r = 0; r < n; r++)
            memcpy(feat + ((size_t)r * n_cap + j) * d, t->x + (size_t)r * d, d * sizeof(float));
    }
}

/* One chunk of at most max_rows rows. */
static void forward_chunk(dfl_target *t, dfl_kv *kv, const int32_t *tok, int n, int logits_from,
                          float *logits, const int *cap, int n_cap, float *feat) {
    const dfl_config *c = &t->c;
    int pos0 = kv->len;
    dfl_target_embed(t, tok, n, t->x);
    for (int r = 0; r < n; r++) dfl_rope_cs(&t->rope, pos0 + r, t->rope_cs + (size_t)r * c->head_dim);
    for (int l = 0; l < c->n_layers; l++) {
        layer_forward(t, l, kv, n, pos0);
        if (n_cap) capture(t, l, cap, n_cap, n, feat);
    }
    kv->len += n;
    if (!logits || logits_from >= n) return;
    int m = n - logits_from;
    norm_rows(t->xn, t->x + (size_t)logits_from * c->dim, t->out_norm, m, c->dim, c->norm_eps);
    dfl_target_lm_head(t, t->xn, m, logits, t->qscratch);
}

int dfl_target_forward(dfl_target *t, dfl_kv *kv, const int32_t *tok, int n, int logits_from,
                       float *logits, const int *cap, int n_cap, float *feat, dfl_error *err) {
    if (n < 0 || kv->len + n > kv->cap)
        return dfl_fail(err, DFL_ECTX, "context full: %d + %d rows exceed --ctx-size %d",
                        kv->len, n, kv->cap);
    for (int i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] >= t->c.vocab)
            return dfl_fail(err, DFL_EARG, "token id %d outside the vocabulary (0..%d)", tok[i],
                            t->c.vocab - 1);
    /* Chunk by chunk, so a long prefill lets other sessions in between. */
    for (int a = 0; a < n; a += t->max_rows) {
        int m = n - a < t->max_rows ? n - a : t->max_rows;
        int lf = logits_from - a < 0 ? 0 : logits_from - a;
        float *lg = logits ? logits + (size_t)(a + lf - logits_from) * t->c.vocab : NULL;
        float *ft = n_cap ? feat + (size_t)a * n_cap * t->c.dim : NULL;
        dfl_ticket_lock(&t->lock);
        forward_chunk(t, kv, tok + a, m, lf, lg, cap, n_cap, ft);
        dfl_ticket_unlock(&t->lock);
    }
    return 0;
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
