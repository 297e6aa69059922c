/* target.c - loading a target of any family: the source (HF folder or
 * GGUF), the config, the globals (embedding, final norm, lm_head), each
 * layer through its family, the scratch a forward needs; and the sequence
 * state a target's sequences hold. */
#include <string.h>
#include <sys/stat.h>

#include "models/family.h"
#include "models/gdn.h"

const char *dfl_lname(char *buf, const char *fmt, int l) {
    snprintf(buf, 256, fmt, l);
    return buf;
}

static const dfl_family *family_of(int arch) {
    return arch == ARCH_LAGUNA ? &dfl_family_laguna
         : DFL_ARCH_HYBRID(arch) ? &dfl_family_qwen35 : &dfl_family_dense;
}

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
    rc = rc ? rc : dfl_safetensors_open_dir(path, &t->ts, err);
    if (rc) return rc;
    t->prefix = dfl_tensors_find(&t->ts, "model.language_model.embed_tokens.weight")
                    ? "model.language_model." : "model.";
    return 0;
}

static int load_globals(dfl_target *t, dfl_weights *w, dfl_error *err) {
    const dfl_config *c = &t->c;
    int g = t->gguf != NULL;
    char embed[128], norm[128];
    snprintf(embed, sizeof embed, "%s", g ? "token_embd.weight" : "");
    snprintf(norm, sizeof norm, "%s", g ? "output_norm.weight" : "");
    if (!g) {
        snprintf(embed, sizeof embed, "%sembed_tokens.weight", t->prefix);
        snprintf(norm, sizeof norm, "%snorm.weight", t->prefix);
    }
    const char *head = g ? "output.weight" : "lm_head.weight";
    int rc = dfl_w_mat(w, embed, c->vocab, c->dim, &t->embed, err);
    rc = rc ? rc : dfl_w_vec_offset(w, norm, c->dim, c->norm_offset ? 1.0f : 0.0f,
                                    &t->out_norm, err);
    if (rc) return rc;
    if (dfl_w_has(w, head) || !c->tied_embed) return dfl_w_mat(w, head, c->vocab, c->dim,
                                                                &t->lm_head, err);
    t->lm_head = t->embed;
    return 0;
}

static int load_weights(dfl_target *t, const dfl_load_opts *o, dfl_error *err) {
    const dfl_config *c = &t->c;
    const dfl_family *fam = family_of(c->arch);
    dfl_tensors *ts = t->gguf ? &t->gguf->tensors : &t->ts;
    dfl_weights w;
    int rc = dfl_w_begin(&w, ts, o, err);
    if (rc) return rc;
    rc = load_globals(t, &w, err);
    t->layers = xcalloc(c->n_layers, sizeof *t->layers);
    for (int l = 0; l < c->n_layers && !rc; l++) {
        dfl_layer *L = &t->layers[l];
        L->n_heads = c->layer_heads[l] ? c->layer_heads[l] : c->n_heads;
        L->rope = c->layer_kind[l] == DFL_LAYER_SLIDING ? &t->rope_swa : &t->rope;
        rc = fam->load_layer(t, &w, l, err);
        if (o->progress) o->progress(o->progress_ud, "load", l + 1, c->n_layers);
    }
    if (!rc && t->gguf) rc = dfl_w_rope_freqs(&w, "rope_freqs.weight", &t->rope, err);
    /* Old Llama checkpoints carry rotary buffers the forward recomputes. */
    if (!rc) dfl_w_ignore(&w, ".rotary_emb.inv_freq");
    if (!rc) rc = dfl_w_end(&w, err);
    t->owned = w.owned;
    return rc;
}

/* Every matrix of layer L into out (room for 13 + 3 * n_experts); returns how many. */
static int layer_mats(dfl_layer *L, const dfl_config *c, dfl_mat **out) {
    int n = 0;
    dfl_gdn *G = L->gdn, none = {0};
    if (!G) G = &none;
    dfl_mat *fixed[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->w_gate, &L->w_up, &L->w_down,
                        &G->qkv, &G->z, &G->b, &G->a, &G->out};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i]->rows) out[n++] = fixed[i];
    dfl_moe *M = L->moe;
    if (!M) return n;
    out[n++] = &M->router;
    for (int e = 0; e < c->n_experts; e++)
        out[n++] = &M->gate[e], out[n++] = &M->up[e], out[n++] = &M->down[e];
    dfl_mat *sh[] = {&M->sh_gate, &M->sh_up, &M->sh_down, &M->sh_scale};
    for (int i = 0; i < 4; i++)
        if (sh[i]->rows) out[n++] = sh[i];
    return n;
}

static uint64_t mat_bytes(const dfl_mat *m) { return (uint64_t)m->rows * m->row_bytes; }

/* Bytes one decode row reads: every matrix, but of a MoE layer's experts
 * only top_k (of the same size). */
static uint64_t decode_bytes(dfl_target *t, dfl_mat **ms) {
    const dfl_config *c = &t->c;
    uint64_t b = mat_bytes(&t->lm_head);
    for (int l = 0; l < c->n_layers; l++) {
        dfl_layer *L = &t->layers[l];
        int n = layer_mats(L, c, ms);
        for (int i = 0; i < n; i++) b += mat_bytes(ms[i]);
        if (L->moe)
            b -= (uint64_t)(c->n_experts - c->top_k) *
                 (mat_bytes(&L->moe->gate[0]) + mat_bytes(&L->moe->up[0]) +
                  mat_bytes(&L->moe->down[0]));
    }
    return b;
}

uint64_t dfl_target_params(const dfl_target *t) {
    const dfl_config *c = &t->c;
    dfl_mat **ms = xcalloc(13 + 3 * (size_t)c->n_experts + 4, sizeof *ms);
    uint64_t n = (uint64_t)c->vocab * c->dim * (t->lm_head.data == t->embed.data ? 1 : 2) + c->dim;
    for (int l = 0; l < c->n_layers; l++) {
        const dfl_layer *L = &t->layers[l];
        int k = layer_mats(&t->layers[l], c, ms);
        for (int i = 0; i < k; i++) n += (uint64_t)ms[i]->rows * ms[i]->cols;
        n += 2 * (uint64_t)c->dim + (L->q_norm ? 2 * (uint64_t)c->head_dim : 0);
        if (L->bq) n += (uint64_t)L->wq.rows + 2 * (uint64_t)L->wk.rows;
        if (L->moe && L->moe->sel_bias) n += (uint64_t)c->n_experts;
        if (L->gdn)   /* conv taps, A_log, dt_bias, the gated norm */
            n += (uint64_t)dfl_gdn_channels(c) * c->lin_conv + 2 * (uint64_t)c->lin_v_heads +
                 (uint64_t)c->lin_v_dim;
    }
    free(ms);
    return n;
}

static int max_heads(const dfl_target *t) {
    int h = 0;
    for (int l = 0; l < t->c.n_layers; l++)
        if (t->layers[l].n_heads > h) h = t->layers[l].n_heads;
    return h;
}

static void alloc_recurrent_scratch(dfl_target *t) {
    const dfl_config *c = &t->c;
    int R = t->batch_rows, qd = max_heads(t) * c->head_dim, vd = c->lin_v_heads * c->lin_v_dim;
    if (c->gating == DFL_GATE_Q_SIGMOID)
        t->qg = dfl_aligned_alloc((size_t)R * 2 * qd * sizeof(float));
    if (!dfl_gdn_state_floats(c)) return;
    t->lin_x = dfl_aligned_alloc((size_t)R * dfl_gdn_channels(c) * sizeof(float));
    t->lin_z = dfl_aligned_alloc((size_t)R * vd * sizeof(float));
    t->lin_ba = dfl_aligned_alloc((size_t)R * 2 * c->lin_v_heads * sizeof(float));
    t->lin_o = dfl_aligned_alloc((size_t)R * vd * sizeof(float));
    t->lin_g = dfl_aligned_alloc((size_t)R * (dfl_gdn_channels(c) + vd) * sizeof(float));
}

static void alloc_scratch(dfl_target *t) {
    const dfl_config *c = &t->c;
    int R = t->batch_rows, qd = max_heads(t) * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int ffn = c->ffn_dim > c->moe_ffn ? c->ffn_dim : c->moe_ffn;
    if (c->shared_ffn > ffn) ffn = c->shared_ffn;
    if (R > t->max_rows)
        t->logits = dfl_aligned_alloc((size_t)(R - t->max_rows) * c->vocab * sizeof(float));
    t->x = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    t->xn = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    t->q = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    t->k = dfl_aligned_alloc((size_t)R * kvd * sizeof(float));
    t->v = dfl_aligned_alloc((size_t)R * kvd * sizeof(float));
    t->att = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    t->gate = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    t->h1 = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    t->h2 = dfl_aligned_alloc((size_t)R * 2 * ffn * sizeof(float));
    t->n_keys = xcalloc(R, sizeof(int));
    size_t tree = (size_t)c->n_kv_heads * (DFL_ATT_BLOCK + t->max_rows) * c->head_dim;
    t->tree_k = dfl_aligned_alloc(tree * dfl_type_block_bytes(t->kv_type));
    t->tree_v = dfl_aligned_alloc(tree * dfl_type_block_bytes(t->kv_type));
    t->tree_path = xcalloc(t->max_rows, sizeof(int));
    t->rope_cs = dfl_aligned_alloc((size_t)R * 2 * c->head_dim * sizeof(float));
    if (c->n_experts) {
        t->router = dfl_aligned_alloc((size_t)R * c->n_experts * sizeof(float));
        t->moe_x = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
        t->moe_y = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
        t->moe_rows = xcalloc(R, sizeof(int));
        t->sh_gate = xcalloc(R, sizeof(float));
        t->moe_w = xcalloc((size_t)R * c->top_k, sizeof(float));
        t->moe_e = xcalloc((size_t)R * c->top_k, sizeof(int));
    }
    alloc_recurrent_scratch(t);
    dfl_mat **ms = xcalloc(13 + 3 * (size_t)c->n_experts + 4, sizeof *ms);
    size_t qs = dfl_matmul_scratch(t->lm_head.type, R, t->lm_head.cols);
    /* Cache-resident models: transposed copies for dfl_matmul (8 outputs
     * per vector; the weights are not streamed from memory). */
    dfl_tensors *ts = t->gguf ? &t->gguf->tensors : &t->ts;
    dfl_w_prepare(ts, t->owned, &t->lm_head);
    if (t->embed.data == t->lm_head.data) t->embed.il8 = t->lm_head.il8;   /* tied */
    for (int l = 0; l < c->n_layers; l++) {
        int n = layer_mats(&t->layers[l], c, ms);
        for (int i = 0; i < n; i++) {
            size_t s = dfl_matmul_scratch(ms[i]->type, R, ms[i]->cols);
            size_t g = (size_t)2 * c->top_k * dfl_matmul_scratch(ms[i]->type, 1, ms[i]->cols);
            if (s > qs) qs = s;
            if (g > qs) qs = g;   /* a decode step's experts as one group */
            dfl_w_prepare(ts, t->owned, ms[i]);
        }
    }
    t->qscratch = dfl_aligned_alloc(qs);
    t->weight_bytes = decode_bytes(t, ms);
    free(ms);
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
    dfl_tensors *ts = t->gguf ? &t->gguf->tensors : &t->ts;
    if (!rc && (o->no_mmap > 0 || (o->no_mmap < 0 && dfl_tensors_copy_fits(ts)))) {
        rc = dfl_tensors_copy_maps(ts, err);
        t->copied = !rc;
    }
    if (!rc) rc = dfl_config_validate(&t->c, path, err);
    if (!rc && !t->c.rope_neox) {
        t->unpermute = 1;
        t->c.rope_neox = 1;
    }
    if (!rc) {
        dfl_rope_init(&t->rope, &t->c);
        dfl_rope_init_swa(&t->rope_swa, &t->c);
        rc = load_weights(t, o, err);
    }
    /* sliding layers with the same RoPE get the final table (GGUF rope_freqs included) */
    if (!rc && !t->c.swa_rope_theta) {
        size_t n = sizeof(float) * (size_t)(t->rope.head_dim / 2);
        memcpy(t->rope_swa.inv_freq, t->rope.inv_freq, n);
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
    /* snapshots: the state after each row of a verify block, and before it */
    int snap = o->snap_rows > 0 && o->snap_rows < t->max_rows ? o->snap_rows : t->max_rows;
    int rf = dfl_gdn_state_floats(&t->c), n_rec = 0;
    t->n_snap = rf ? snap + 1 : 0;
    for (int l = 0; l < t->c.n_layers; l++) n_rec += t->c.layer_kind[l] == DFL_LAYER_RECURRENT;
    t->rec_bytes = (uint64_t)n_rec * (1 + t->n_snap) * rf * sizeof(float);
    alloc_scratch(t);
    *out = t;
    return 0;
}

void dfl_target_free(dfl_target *t) {
    if (!t) return;
    if (t->x) dfl_ticket_destroy(&t->lock);
    dfl_combiner_free(t->comb);
    dfl_mat_release(&t->lm_head);
    dfl_mat **ms = xcalloc(13 + 3 * (size_t)t->c.n_experts + 4, sizeof *ms);
    for (int l = 0; t->layers && l < t->c.n_layers; l++) {
        dfl_layer *L = &t->layers[l];
        int n = layer_mats(L, &t->c, ms);
        for (int i = 0; i < n; i++) dfl_mat_release(ms[i]);
        if (L->moe) free(L->moe->gate), free(L->moe->up), free(L->moe->down), free(L->moe);
        free(L->gdn);
    }
    free(ms);
    free(t->layers);
    free(t->rope.inv_freq);
    free(t->rope_swa.inv_freq);
    dfl_weights_free_owned(t->owned);
    dfl_tensors_free(&t->ts);
    if (t->gguf) {
        dfl_gguf_free(t->gguf);
        free(t->gguf);
    }
    free(t->x), free(t->xn), free(t->q), free(t->k), free(t->v), free(t->att), free(t->gate);
    free(t->h1), free(t->h2), free(t->n_keys), free(t->qscratch), free(t->rope_cs);
    free(t->router), free(t->moe_x), free(t->moe_y), free(t->moe_rows), free(t->moe_w);
    free(t->moe_e), free(t->sh_gate);
    free(t->qg), free(t->lin_x), free(t->lin_z), free(t->lin_ba), free(t->lin_o), free(t->lin_g);
    free(t->logits), free(t->tree_k), free(t->tree_v), free(t->tree_path);
    free(t);
}

static dfl_kv_shape kv_shape(const dfl_target *t) {
    const dfl_config *c = &t->c;
    return (dfl_kv_shape){.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads,
                          .head_dim = c->head_dim, .type = t->kv_type, .kind = c->layer_kind,
                          .window = c->sliding_window, .max_rows = t->max_rows,
                          .rec_floats = dfl_gdn_state_floats(c), .n_snap = t->n_snap};
}

dfl_kv *dfl_kv_new(const dfl_target *t, int cap) {
    dfl_kv_shape s = kv_shape(t);
    return dfl_kv_make(&s, cap);
}

int dfl_target_tree_rows(const dfl_target *t) {
    int rows = t->max_rows;
    for (int l = 0; l < t->c.n_layers; l++)
        if (t->c.layer_kind[l] == DFL_LAYER_RECURRENT && t->n_snap - 1 < rows)
            rows = t->n_snap - 1;
    return rows > 0 ? rows : 0;
}

uint64_t dfl_target_kv_bytes(const dfl_target *t, int cap) {
    dfl_kv_shape s = kv_shape(t);
    return dfl_kv_bytes(&s, cap);
}
