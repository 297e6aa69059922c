/* mtp.c - the native MTP head of Qwen3.5 / Qwen3-Next checkpoints as a
 * drafter (vLLM's qwen3_next_mtp.py is the published definition):
 *
 *   u_i = fc([norm_e(embed(x_{i+1})) ; norm_h(h_i)])      (embedding first)
 *   g_i = norm(block(u_i))            one gated full-attention block with
 *                                     the target's MLP kind, its own K/V
 *   p(x_{i+2}) = lm_head(g_i)         the target's embedding and lm_head
 *
 * h_i is the target's hidden state at row i AFTER its final norm (what
 * vLLM's Qwen3NextModel returns, and what the lm_head reads); the head's row
 * i sits at position i. A draft fuses the anchor x_pos with h_{pos-1}, then
 * recurses on its own output: row pos-1+j fuses draft j with g of the row
 * before (vLLM's proposer feeds the head's normed output back). Committed
 * rows are fused again from the target's hidden states, so the chain's rows
 * are dropped after each draft: the head's cache rolls back to the committed
 * length. The block runs through the target's forward (models/forward.c) as
 * a one-layer view of the target: the same kernels, batch-invariant. */
#include <string.h>

#include "draft/draft_private.h"
#include "models/family.h"

enum { MTP_DEFAULT_BLOCK = 16 };   /* no trained width: the engine's default max block */

/* ---- loading -------------------------------------------------------------- */

/* The prefix the checkpoint stores the head under, or NULL. */
static const char *find_prefix(dfl_target *t) {
    char b[256];
    for (int i = 0; dfl_mtp_prefixes[i]; i++) {
        snprintf(b, sizeof b, "%sfc.weight", dfl_mtp_prefixes[i]);
        if (dfl_tensors_find(&t->ts, b)) return dfl_mtp_prefixes[i];
    }
    return NULL;
}

/* The target load marked mtp.* as known and unused; they are bound here. */
static void unmark(dfl_tensors *ts, const char *prefix) {
    size_t pl = strlen(prefix);
    for (int i = 0; i < ts->n; i++)
        if (!strncmp(ts->t[i].name, prefix, pl)) ts->t[i].used = 0;
}

/* Tensors under the prefix left unbound: more MTP layers than the one this
 * lane runs (mtp.layers.1.. would be further steps) are fine; anything else
 * is a layout we do not know. */
static int check_unbound(dfl_tensors *ts, const char *prefix, dfl_error *err) {
    size_t pl = strlen(prefix);
    char layers[128];
    snprintf(layers, sizeof layers, "%slayers.", prefix);
    for (int i = 0; i < ts->n; i++) {
        const char *nm = ts->t[i].name;
        if (ts->t[i].used || strncmp(nm, prefix, pl)) continue;
        if (!strncmp(nm, layers, strlen(layers)) && strncmp(nm + strlen(layers), "0.", 2)) {
            ts->t[i].used = 1;
            continue;
        }
        return dfl_fail(err, DFL_EFORMAT, "%s: MTP tensor %s is not part of the Qwen3.5 / "
                        "Qwen3-Next MTP head this engine runs", ts->source, nm);
    }
    return 0;
}

/* The one-layer view: the target's config and scratch, the head's layer. */
static void make_view(dfl_mtp *m, const dfl_target *t, const char *prefix) {
    dfl_target *v = &m->view;
    *v = *t;
    v->c.n_layers = 1;
    v->c.layer_kind[0] = DFL_LAYER_FULL;
    v->c.mlp_kind[0] = t->c.mlp_kind[0];   /* vLLM builds the head's block as layer 0 */
    v->c.layer_heads[0] = 0;
    v->layers = &m->layer;
    v->out_norm = m->norm;   /* loaded before the view is made */
    v->prefix = prefix;
    v->owned = NULL;
    v->comb = NULL;
    m->layer.n_heads = t->c.n_heads;
    m->layer.rope = &t->rope;
}

static int load_head(dfl_mtp *m, dfl_target *t, const dfl_load_opts *o, const char *p,
                     dfl_error *err) {
    const dfl_config *c = &t->c;
    float off = c->norm_offset ? 1.0f : 0.0f;
    dfl_weights w;
    char b[256];
    int rc = dfl_w_begin(&w, &t->ts, o, err);
    if (rc) return rc;
    unmark(&t->ts, p);
    snprintf(b, sizeof b, "%sfc.weight", p);
    rc = dfl_w_mat(&w, b, c->dim, 2 * c->dim, &m->fc, err);
    snprintf(b, sizeof b, "%spre_fc_norm_embedding.weight", p);
    rc = rc ? rc : dfl_w_vec_offset(&w, b, c->dim, off, &m->norm_e, err);
    snprintf(b, sizeof b, "%spre_fc_norm_hidden.weight", p);
    rc = rc ? rc : dfl_w_vec_offset(&w, b, c->dim, off, &m->norm_h, err);
    snprintf(b, sizeof b, "%snorm.weight", p);
    rc = rc ? rc : dfl_w_vec_offset(&w, b, c->dim, off, &m->norm, err);
    make_view(m, t, p);
    rc = rc ? rc : dfl_qwen35_load_block(&m->view, &w, 0, err);
    rc = rc ? rc : check_unbound(&t->ts, p, err);
    m->owned = w.owned;
    return rc;
}

/* Every matrix of the head, for transposes and frees; returns how many. */
static int head_mats(dfl_mtp *m, int n_experts, dfl_mat **out) {
    dfl_layer *L = &m->layer;
    int n = 0;
    dfl_mat *fixed[] = {&m->fc, &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                        &L->w_down};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i]->rows) out[n++] = fixed[i];
    dfl_moe *M = L->moe;
    if (!M) return n;
    out[n++] = &M->router;
    for (int e = 0; e < n_experts; e++)
        out[n++] = &M->gate[e], out[n++] = &M->up[e], out[n++] = &M->down[e];
    dfl_mat *sh[] = {&M->sh_gate, &M->sh_up, &M->sh_down, &M->sh_scale};
    for (int i = 0; i < 4; i++)
        if (sh[i]->rows) out[n++] = sh[i];
    return n;
}

void dfl_mtp_free(dfl_mtp *m, int n_experts) {
    if (!m) return;
    dfl_mat **ms = xcalloc(12 + 3 * (size_t)n_experts, sizeof *ms);
    int n = head_mats(m, n_experts, ms);
    for (int i = 0; i < n; i++) dfl_mat_release(ms[i]);
    free(ms);
    if (m->layer.moe) free(m->layer.moe->gate), free(m->layer.moe->up), free(m->layer.moe->down);
    free(m->layer.moe);
    dfl_weights_free_owned(m->owned);
    free(m);
}

/* Scratch for max_rows rows and the transposed copies the target's own
 * small matrices get (the same bits, faster). */
static void alloc_scratch(dfl_drafter *d) {
    const dfl_config *c = &d->c;
    int R = d->max_rows;
    d->x = dfl_aligned_alloc((size_t)R * 2 * c->dim * sizeof(float));
    d->xn = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    d->ctx = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    d->h1 = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    d->h2 = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    d->logits = dfl_aligned_alloc((size_t)c->vocab * sizeof(float));
    d->tok = xcalloc(R, sizeof(int32_t));
    d->qscratch = dfl_aligned_alloc(dfl_matmul_scratch(d->mtp->fc.type, R, 2 * c->dim));
    dfl_mat **ms = xcalloc(12 + 3 * (size_t)c->n_experts, sizeof *ms);
    int n = head_mats(d->mtp, c->n_experts, ms);
    for (int i = 0; i < n; i++) dfl_w_prepare(&d->t->ts, d->mtp->owned, ms[i]);
    free(ms);
}

int dfl_mtp_load(dfl_target *t, const dfl_load_opts *o, dfl_drafter **out, dfl_error *err) {
    *out = NULL;
    if (!DFL_ARCH_HYBRID(t->c.arch) || t->gguf)
        return dfl_fail(err, DFL_EUNSUP, "--draft-mtp: a %s target has no native MTP head "
                        "(Qwen3.5 / Qwen3-Next Hugging Face folders carry one)",
                        dfl_arch_name(t->c.arch));
    const char *p = find_prefix(t);
    if (!p)
        return dfl_fail(err, DFL_EFORMAT, "--draft-mtp: %s has no MTP head (no mtp.fc.weight, "
                        "model.mtp.fc.weight or model.language_model.mtp.fc.weight); "
                        "transformers drops mtp.* when it saves, tools/add_mtp.py puts a head "
                        "back", t->ts.source);
    dfl_drafter *d = xcalloc(1, sizeof *d);
    d->kind = DFL_DRAFT_MTP;
    d->mtp = xcalloc(1, sizeof *d->mtp);
    d->t = t;
    d->c = t->c;
    d->n_cap = 1;
    d->cap[0] = t->c.n_layers - 1;   /* its output, put through the final norm here */
    int rc = load_head(d->mtp, t, o, p, err);
    if (rc) {
        dfl_drafter_free(d);
        return rc;
    }
    d->max_rows = t->max_rows < DFL_MAX_BLOCK ? t->max_rows : DFL_MAX_BLOCK;
    d->block_size = MTP_DEFAULT_BLOCK < d->max_rows ? MTP_DEFAULT_BLOCK : d->max_rows;
    alloc_scratch(d);
    *out = d;
    return 0;
}

/* ---- the store: the head's cache and the target's hidden rows -------------- */

void dfl_mtp_store_init(const dfl_drafter *d, dfl_dstore *s, int ctx) {
    const dfl_config *c = &d->c;
    unsigned char full = DFL_LAYER_FULL;
    s->cap = ctx + d->max_rows;
    dfl_kv_shape sh = {.n_layers = 1, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                       .type = d->t->kv_type, .kind = &full, .max_rows = d->max_rows};
    s->mkv = dfl_kv_make(&sh, s->cap);
    s->hid = dfl_aligned_alloc((size_t)s->cap * c->dim * sizeof(float));
    s->hid_dim = c->dim;
    s->type = d->t->kv_type;
}

/* Row n_keep - 1 fused the token at n_keep, which the next prompt may change. */
void dfl_mtp_store_truncate(dfl_dstore *s, int n_keep) {
    if (n_keep < 0) n_keep = 0;
    if (n_keep < s->len) s->len = n_keep;
    int m = n_keep > 0 ? n_keep - 1 : 0;
    if (s->mkv->len > m) dfl_kv_truncate(s->mkv, m);
}

int dfl_mtp_store_copy(dfl_dstore *dst, const dfl_dstore *src, int n) {
    if (n > src->len) n = src->len;
    if (n < 0) n = 0;
    int m = src->mkv->len < n - 1 ? src->mkv->len : n - 1;
    if (m < 0) m = 0;
    memcpy(dst->hid, src->hid, (size_t)n * src->hid_dim * sizeof(float));
    if (dfl_kv_copy_prefix(dst->mkv, src->mkv, m) != m) n = m = 0;
    dst->len = n;
    return n;
}

/* ---- forward ---------------------------------------------------------------- */

/* n rows at the head's positions mkv->len..: row r fuses tok[r] with the
 * hidden state hid[r] (already through the norm its source ends with).
 * Leaves each row's block output (before the head's norm) in d->h1, and
 * logits (n, vocab) when not NULL. The caller holds the target's lock. */
static void fuse_rows(dfl_drafter *d, dfl_dstore *s, const int32_t *tok, const float *hid, int n,
                      float *logits) {
    dfl_mtp *m = d->mtp;
    int D = d->c.dim;
    float eps = d->c.norm_eps;
    dfl_target_embed(d->t, tok, n, d->xn);
    for (int r = 0; r < n; r++) {
        float *cat = d->x + (size_t)r * 2 * D;
        dfl_rmsnorm(cat, d->xn + (size_t)r * D, m->norm_e, D, eps);
        dfl_rmsnorm(cat + D, hid + (size_t)r * D, m->norm_h, D, eps);
    }
    dfl_matmul(d->t->pool, &m->fc, n, d->x, 2 * D, d->ctx, D, d->qscratch);
    int cap0 = 0;
    dfl_fwd f = {.kv = s->mkv, .tok = tok, .embeds = d->ctx, .n = n, .logits = logits,
                 .cap = &cap0, .n_cap = 1, .feat = d->h1};
    dfl_target_forward_rows(&m->view, &f, 1);
}

/* h_i: the target's stored last-layer output through its final norm. */
static void target_hidden(const dfl_drafter *d, const dfl_dstore *s, int i, float *out) {
    int D = d->c.dim;
    dfl_rmsnorm(out, s->hid + (size_t)i * D, d->t->out_norm, D, d->c.norm_eps);
}

/* The head's work goes through the target's combiner as a side call, as the
 * DFlash drafter's passes do: it runs with the machine held, and a gathering
 * forward leader waits for it. Calls of several sequences run one after
 * another (the head's scratch is used by one at a time). */
typedef struct mcall mcall;
struct mcall {
    dfl_side_call side;       /* first: the combiner hands back &side */
    void (*body)(mcall *m);
    dfl_drafter *d;
    dfl_dstore *s;
    const int32_t *tok;       /* context: the new rows' tokens, from row old */
    int old;
    int32_t anchor;           /* draft */
    int n_out;
    float *logits;
    int32_t *draft;
};

static void mtp_pass(void *ctx, dfl_side_call **cs, int k) {
    (void)ctx;
    for (int i = 0; i < k; i++) ((mcall *)cs[i])->body((mcall *)cs[i]);
}

/* Runs m; charges its store its rows' share of the pass's time. */
static void run_call(mcall *m, int rows) {
    m->side = (dfl_side_call){.fn = mtp_pass, .ctx = m->d, .rows = rows};
    dfl_target_side_run(m->d->t, &m->side, m->d->max_rows);
    m->s->spent += dfl_side_charge(&m->side);
}

/* Rows mkv->len .. len-2 now know their next token: tok[i + 1 - old]. */
static void fuse_context(mcall *c) {
    dfl_drafter *d = c->d;
    dfl_dstore *s = c->s;
    int D = d->c.dim;
    for (int i = s->mkv->len; i < s->len - 1;) {
        int m = s->len - 1 - i < d->max_rows ? s->len - 1 - i : d->max_rows;
        for (int r = 0; r < m; r++) {
            d->tok[r] = c->tok[i + r + 1 - c->old];
            target_hidden(d, s, i + r, d->h2 + (size_t)r * D);
        }
        fuse_rows(d, s, d->tok, d->h2, m, NULL);
        i += m;
    }
}

/* The anchor fused with h_{pos-1}, then each draft with the head's own normed output. */
static void chain_drafts(mcall *c) {
    dfl_drafter *d = c->d;
    dfl_dstore *s = c->s;
    int V = d->c.vocab, D = d->c.dim;
    d->tok[0] = c->anchor;
    target_hidden(d, s, s->len - 1, d->h2);
    for (int j = 0; j < c->n_out; j++) {
        float *lg = c->logits ? c->logits + (size_t)j * V : d->logits;
        fuse_rows(d, s, d->tok, d->h2, 1, lg);
        c->draft[j] = dfl_argmax(lg, V);
        d->tok[0] = c->draft[j];
        dfl_rmsnorm(d->h2, d->h1, d->mtp->norm, D, d->c.norm_eps);
    }
}

int dfl_mtp_add_context(dfl_drafter *d, dfl_dstore *s, const float *feat, const int32_t *tok,
                        int n, dfl_error *err) {
    int D = d->c.dim, old = s->len;
    if (n < 0 || s->len + n > s->cap - d->max_rows)
        return dfl_fail(err, DFL_ECTX, "MTP context full: %d + %d rows exceed %d", s->len, n,
                        s->cap - d->max_rows);
    if (n && (!feat || !tok))
        return dfl_fail(err, DFL_EARG, "the MTP head needs the rows' hidden states and tokens");
    if (s->mkv->len < old - 1)   /* the store's truncate keeps this; a caller broke it */
        return dfl_fail(err, DFL_EARG, "MTP cache at %d rows behind a context of %d",
                        s->mkv->len, old);
    memcpy(s->hid + (size_t)old * D, feat, (size_t)n * D * sizeof(float));
    s->len += n;
    mcall m = {.body = fuse_context, .d = d, .s = s, .tok = tok, .old = old};
    run_call(&m, n < d->max_rows ? (n > 0 ? n : 1) : d->max_rows);
    return 0;
}

/* n_out drafts after anchor at pos = s->len: the anchor fused with h_{pos-1},
 * then each draft with the head's own normed output; logits (n_out, vocab)
 * when not NULL. The head's cache ends at pos (the anchor is committed). */
int dfl_mtp_draft(dfl_drafter *d, dfl_dstore *s, int32_t anchor, int n_out, float *logits,
                  int32_t *draft, dfl_error *err) {
    int pos = s->len, V = d->c.vocab;
    if (n_out < 1 || n_out > d->max_rows - 1)
        return dfl_fail(err, DFL_EARG, "MTP drafts %d outside 1..%d", n_out, d->max_rows - 1);
    if (anchor < 0 || anchor >= V)
        return dfl_fail(err, DFL_EARG, "anchor token %d outside the vocabulary", anchor);
    if (pos + n_out > s->mkv->cap)
        return dfl_fail(err, DFL_ECTX, "MTP cache full: %d + %d rows exceed %d", pos, n_out,
                        s->mkv->cap);
    if (pos > 0 && s->mkv->len < pos - 1)
        return dfl_fail(err, DFL_EARG, "MTP cache at %d rows behind a context of %d",
                        s->mkv->len, pos);
    if (pos == 0) {   /* no hidden state before the first token: nothing to fuse */
        for (int j = 0; j < n_out; j++) draft[j] = anchor;
        if (logits) memset(logits, 0, (size_t)n_out * V * sizeof(float));
        return 0;
    }
    dfl_kv_truncate(s->mkv, pos - 1);
    mcall m = {.body = chain_drafts, .d = d, .s = s, .anchor = anchor, .n_out = n_out,
               .logits = logits, .draft = draft};
    run_call(&m, 1);
    dfl_kv_truncate(s->mkv, pos);
    return 0;
}
