/* engine.c - loading what a run needs (target, drafter, tokenizer, threads)
 * and the per-sequence sessions. dfl_generate (generate.c) runs src/decode/'s round loop. */
#include "engine.h"
#include "kernels/kernels.h"
#include "sample/format.h"

#include <string.h>
#include <sys/stat.h>

void dfl_engine_opts_default(dfl_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->dtype = "auto";
}

void dfl_gen_params_default(dfl_gen_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = 128;
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
    p->seed = 0x5eed;
    p->typical_d = 0.2f;
    p->tree_budget = -1;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A folder's tokenizer is optional for id-level use; a GGUF carries its own. */
static int load_tokenizer(dfl_engine *e, const char *path, const gguf_file *g, dfl_error *err) {
    if (g) return dfl_tok_load_gguf(g, &e->tok, err);
    char tj[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", path);
    struct stat st;
    if (stat(tj, &st) != 0) return 0;
    return dfl_tok_load_hf(path, &e->tok, err);
}

static int load_vocab_only(dfl_engine *e, const char *path, dfl_error *err) {
    if (is_dir(path)) {
        int rc = dfl_tok_load_hf(path, &e->tok, err);
        return rc;
    }
    gguf_file g;
    int rc = dfl_gguf_open(path, &g, err);
    if (rc) return rc;
    rc = dfl_tok_load_gguf(&g, &e->tok, err);
    dfl_gguf_free(&g);
    return rc;
}

/* The layers a verify captures for every model lane: the drafter's, then
 * the MTP lane's (the target's last layer) unless the drafter reads it. */
static int capture_union(dfl_engine *e, dfl_error *err) {
    const dfl_drafter *m[2] = {e->d, e->mtp};
    for (int i = 0; i < 2; i++)
        for (int j = 0; m[i] && j < m[i]->n_cap; j++) {
            int k = 0;
            while (k < e->n_cap && e->cap[k] != m[i]->cap[j]) k++;
            if (k < e->n_cap) continue;
            if (e->n_cap == DFL_MAX_CAPTURE_LAYERS)
                return dfl_fail(err, DFL_EUNSUP, "--draft-mtp with --draft: the drafter and the "
                                "MTP head read more than %d target layers", DFL_MAX_CAPTURE_LAYERS);
            e->cap[e->n_cap++] = m[i]->cap[j];
        }
    return 0;
}

/* The type of the target's matrices, for the summary and the drafter's default
 * (an MoE layer has no dense w_up: its attention's wq then). */
static dfl_type target_type(const dfl_target *t) {
    const dfl_layer *L0 = &t->layers[0];
    return L0->w_up.rows ? L0->w_up.type : L0->wq.type;
}

static int set(const char *type) { return type && *type && strcmp(type, "auto"); }

/* The drafter's weights: --draft-dtype, else --dtype; with neither, a 16-bit or f32
 * drafter beside a quantized target converts to q8_0, so its block of rows runs on
 * the integer kernels as the target's do (0.6B Q8_0 target, Zen 5: 1.2x the tok/s
 * at tau 3; SmolLM2's trained drafter keeps its acceptance, tau 1.620 against
 * 1.608). --draft-dtype auto keeps the file's type. */
static void drafter_dtype(const dfl_engine *e, dfl_load_opts *dlo) {
    const dfl_engine_opts *o = &e->opts;
    if (o->draft_dtype) dlo->dtype = o->draft_dtype;
    else if (!set(o->dtype) && target_type(e->t) > DFL_BF16)
        dlo->dtype = "q8_0", dlo->floats_only = 1;
}

static int load_models(dfl_engine *e, dfl_error *err) {
    const dfl_engine_opts *o = &e->opts;
    dfl_load_opts lo = {.dtype = o->dtype, .kv_type = o->kv_type, .pool = e->pool,
                        .draft_window = o->draft_window, .progress = o->progress,
                        .progress_ud = o->progress_ud};
    lo.max_rows = e->max_block > 64 ? e->max_block : 64;
    lo.no_mmap = o->no_mmap;
    lo.snap_rows = e->max_block;   /* a recurrent state rolls back within a verify block */
    /* Room for one prefill chunk and every other session's largest block. */
    if (o->n_parallel > 1) lo.batch_rows = lo.max_rows + (o->n_parallel - 1) * e->max_block;
    int rc = dfl_target_load(o->model_path, &lo, &e->t, err);
    if (rc) return rc;
    rc = load_tokenizer(e, o->model_path, e->t->gguf, err);
    if (rc) return rc;
    /* both: the head is a lane of its own beside the drafter */
    if (o->draft_mtp && (rc = dfl_mtp_load(e->t, &lo, o->draft_path ? &e->mtp : &e->d, err)))
        return rc;
    if (o->draft_path) {
        dfl_load_opts dlo = lo;
        drafter_dtype(e, &dlo);
        rc = dfl_drafter_load(o->draft_path, e->t, &dlo, &e->d, err);
        if (rc) return rc;
        /* the n-gram lane keeps the default: its matches run longer than a drafter's block */
        if (!o->max_block && !o->ngram && e->d->block_size < e->max_block)
            e->max_block = e->d->block_size;
    }
    /* Draft trees: verify rows for up to DFL_MAX_TREE nodes and the root when
     * the drafter drafts blocks (not an MTP head's one token), as many as the
     * target's sequences hold (a recurrent state's snapshots: snap_rows) */
    int tree_rows = dfl_target_tree_rows(e->t);
    if (e->d && !e->d->mtp && tree_rows > 1)
        e->max_tree = DFL_MAX_TREE < tree_rows - 1 ? DFL_MAX_TREE : tree_rows - 1;
    if ((rc = capture_union(e, err))) return rc;
    int max_ctx = e->t->c.max_ctx;
    e->ctx_size = o->ctx_size > 0 ? o->ctx_size : (max_ctx < 4096 ? max_ctx : 4096);
    if (e->ctx_size > max_ctx)
        return dfl_fail(err, DFL_EARG, "--ctx-size %d exceeds the model's context of %d",
                        e->ctx_size, max_ctx);
    return 0;
}

int dfl_engine_lane_block(const dfl_engine *e, const dfl_drafter *d) {
    int b = e->max_block;
    if (d && !e->opts.max_block && d->block_size < b) b = d->block_size;
    return b;
}

int dfl_engine_draft_block(const dfl_engine *e) { return dfl_engine_lane_block(e, e->d); }

/* The kernel path (dfl_engine_opts.isa): process-wide, see kernels.h. */
int dfl_set_isa(const char *name, dfl_error *err) {
    if (!name || !strcmp(name, "auto")) return dfl_kernels_set_isa(dfl_cpu_isa()), 0;
    int isa = dfl_isa_from_name(name);
    if (isa < 0)
        return dfl_fail(err, DFL_EARG, "kernel path (isa) '%s': not one of auto, generic, "
                        "avx2, avx512, neon", name);
    if (dfl_kernels_set_isa((dfl_isa)isa)) {
        char feat[256];
        dfl_cpu_features(feat, sizeof feat);
        return dfl_fail(err, DFL_EUNSUP, "kernel path (isa) '%s': this CPU cannot run it "
                        "(best: %s; features: %s)", name, dfl_isa_name(dfl_cpu_isa()),
                        feat[0] ? feat : "none");
    }
    return 0;
}

int dfl_engine_load(const dfl_engine_opts *o, dfl_engine **out, dfl_error *err) {
    *out = NULL;
    if (!o->model_path) return dfl_fail(err, DFL_EARG, "no model given (--model PATH)");
    if (o->n_parallel < 0 || o->n_parallel > DFL_MAX_PARALLEL)
        return dfl_fail(err, DFL_EARG, "%d parallel sessions outside 1..%d", o->n_parallel,
                        DFL_MAX_PARALLEL);
    if (o->max_block < 0 || o->max_block > DFL_MAX_BLOCK)
        return dfl_fail(err, DFL_EARG, "max block %d outside 1..%d", o->max_block, DFL_MAX_BLOCK);
    /* before the target's load, which may take minutes */
    if (set(o->draft_dtype) && dfl_type_from_name(o->draft_dtype) < 0)
        return dfl_fail(err, DFL_EARG, "--draft-dtype %s: unknown type (auto, or a type --dtype "
                        "takes)", o->draft_dtype);
    int rc = dfl_set_isa(o->isa, err);
    if (rc) return rc;
    dfl_engine *e = xcalloc(1, sizeof *e);
    e->opts = *o;
    pthread_mutex_init(&e->mu, NULL);
    dfl_gate_init(&e->gate);
    e->max_block = o->max_block ? o->max_block : 16;
    if (o->vocab_only) {
        rc = load_vocab_only(e, o->model_path, err);
    } else {
        e->pool = dfl_pool_new(o->n_threads);
        rc = load_models(e, err);
    }
    if (rc) {
        dfl_engine_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void dfl_engine_free(dfl_engine *e) {
    if (!e) return;
    dfl_drafter_free(e->d);
    dfl_drafter_free(e->mtp);
    dfl_target_free(e->t);
    dfl_tok_free(e->tok);
    dfl_fmt_vocab_free(e->fmt_vocab);
    dfl_pool_free(e->pool);
    pthread_mutex_destroy(&e->mu);
    dfl_gate_free(&e->gate);
    free(e);
}

static const char *base_name(const char *p) {
    const char *s = p;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '/') s = p + i + 1;
    return s;
}

void dfl_engine_info(const dfl_engine *e, dfl_model_info *info) {
    memset(info, 0, sizeof *info);
    if (!e->t) return;
    const dfl_config *c = &e->t->c;
    snprintf(info->arch, sizeof info->arch, "%s", dfl_arch_name(c->arch));
    snprintf(info->name, sizeof info->name, "%s", base_name(e->opts.model_path));
    snprintf(info->dtype, sizeof info->dtype, "%s", dfl_type_name(target_type(e->t)));
    snprintf(info->kv_type, sizeof info->kv_type, "%s", dfl_type_name(e->t->kv_type));
    info->n_layers = c->n_layers;
    info->dim = c->dim;
    info->n_heads = c->n_heads;
    info->n_kv_heads = c->n_kv_heads;
    info->head_dim = c->head_dim;
    info->ffn_dim = c->ffn_dim;
    info->vocab = c->vocab;
    info->ctx_size = e->ctx_size;
    info->weights_copied = e->t->copied;
    info->max_ctx = c->max_ctx;
    info->weight_bytes = e->t->weight_bytes;
    info->rec_state_bytes = e->t->rec_bytes;
    info->state_bytes = dfl_target_kv_bytes(e->t, e->ctx_size);
    info->rec_snapshots = e->t->n_snap;
    info->n_threads = dfl_pool_size(e->pool);
    info->n_params = dfl_target_params(e->t);
    snprintf(info->simd, sizeof info->simd, "%s", dfl_isa_name(dfl_kernels_isa()));
    if (e->d) {
        info->has_draft = 1;
        info->draft_mtp = e->d->kind == DFL_DRAFT_MTP;
        snprintf(info->draft_kind, sizeof info->draft_kind, "%s",
                 info->draft_mtp ? "MTP" : e->d->kind == DFL_DRAFT_DFLASH2 ? "DFlash2" : "DFlash");
        info->draft_block = e->d->block_size;
        info->draft_layers = e->d->mtp ? 1 : e->d->c.n_layers;   /* the head is one block */
        if (!e->d->mtp)
            snprintf(info->draft_dtype, sizeof info->draft_dtype, "%s", dfl_type_name(e->d->fc.type));
        if (!e->d->mtp && e->d->head.data != e->t->lm_head.data)
            info->draft_head_bytes = (uint64_t)e->d->head.rows * e->d->head.row_bytes;
    }
    info->mtp_lane = e->mtp != NULL;
    info->ngram = e->opts.ngram;
}

/* ---- sessions ----------------------------------------------------------- */

int dfl_session_new(dfl_engine *e, dfl_session **out, dfl_error *err) {
    *out = NULL;
    if (!e->t) return dfl_fail(err, DFL_EARG, "engine was loaded for its vocabulary only");
    dfl_session *s = xcalloc(1, sizeof *s);
    const dfl_config *c = &e->t->c;
    s->e = e;
    s->kv = dfl_kv_new(e->t, e->ctx_size);
    s->hist = xcalloc(e->ctx_size, sizeof(int32_t));
    int rows = e->max_block > e->max_tree + 1 ? e->max_block : e->max_tree + 1;
    s->logits = dfl_aligned_alloc((size_t)rows * c->vocab * sizeof(float));
    if (e->d) {
        s->ds = dfl_dstore_new(e->d, e->ctx_size);
        s->dlogits = dfl_aligned_alloc((size_t)e->max_block * c->vocab * sizeof(float));
        s->feat = dfl_aligned_alloc((size_t)e->t->max_rows * e->n_cap * c->dim * sizeof(float));
    }
    if (e->mtp) {
        int nc = e->d->n_cap > e->mtp->n_cap ? e->d->n_cap : e->mtp->n_cap;
        s->mts = dfl_dstore_new(e->mtp, e->ctx_size);
        s->fsub = dfl_aligned_alloc((size_t)e->t->max_rows * nc * c->dim * sizeof(float));
    }
    if (e->opts.ngram) {
        s->ng = xcalloc(1, sizeof *s->ng);
        dfl_ngram_init(s->ng, e->ctx_size);
    }
    *out = s;
    return 0;
}

void dfl_session_free(dfl_session *s) {
    if (!s) return;
    dfl_kv_free(s->kv);
    dfl_dstore_free(s->ds);
    dfl_dstore_free(s->mts);
    free(s->fsub);
    free(s->hist);
    free(s->logits);
    free(s->dlogits);
    free(s->feat);
    if (s->ng) dfl_ngram_free(s->ng);
    free(s->ng);
    free(s);
}

int dfl_session_copy_prefix(dfl_session *dst, const dfl_session *src, int n) {
    if (dst == src || dst->e != src->e) return 0;
    n = dfl_kv_copy_prefix(dst->kv, src->kv, n);
    if (dst->ds) {
        int m = dfl_dstore_copy_prefix(dst->ds, src->ds, n);
        if (m < n) dfl_dstore_truncate(dst->ds, 0);   /* the next prompt feeds it again */
    }
    if (dst->mts && dfl_dstore_copy_prefix(dst->mts, src->mts, n) < n)
        dfl_dstore_truncate(dst->mts, 0);
    memcpy(dst->hist, src->hist, (size_t)n * sizeof(int32_t));
    if (dst->ng) {   /* the n-gram lane's history is the sequence's tokens */
        memcpy(dst->ng->tok, src->hist, (size_t)n * sizeof(int32_t));
        dst->ng->len = n;
    }
    return n;
}

int dfl_debug_forward(dfl_session *s, const int32_t *ids, int n, const int *cap, int n_cap,
                      float *logits, float *feat, dfl_error *err) {
    dfl_target *t = s->e->t;
    for (int j = 0; j < n_cap; j++)
        if (cap[j] < 0 || cap[j] >= t->c.n_layers)
            return dfl_fail(err, DFL_EARG, "capture layer %d outside 0..%d", cap[j],
                            t->c.n_layers - 1);
    dfl_kv_truncate(s->kv, 0);
    if (s->ds) dfl_dstore_truncate(s->ds, 0);
    if (s->mts) dfl_dstore_truncate(s->mts, 0);
    if (s->ng) s->ng->len = 0;
    int rc = dfl_target_forward(t, s->kv, ids, n, 0, logits, cap, n_cap, feat, err);
    if (!rc) memcpy(s->hist, ids, (size_t)n * sizeof(int32_t));
    return rc;
}

int dfl_debug_step(dfl_session *s, const int32_t *ids, int n, const int *cap, int n_cap,
                   float *logits, float *feat, dfl_error *err) {
    const dfl_config *c = &s->e->t->c;
    for (int i = 0; i < n; i++) {
        int pos = s->kv->len;
        int rc = dfl_target_forward(s->e->t, s->kv, ids + i, 1, 0,
                                    logits ? logits + (size_t)i * c->vocab : NULL, cap, n_cap,
                                    n_cap ? feat + (size_t)i * n_cap * c->dim : NULL, err);
        if (rc) return rc;
        s->hist[pos] = ids[i];
    }
    return 0;
}
