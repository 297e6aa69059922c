/* dflash.c - the z-lab DFlash drafter (DFlashDraftModel), from a Hugging
 * Face folder or a llama.cpp "dflash" GGUF, and its forward:
 *   context rows: features -> fc -> hidden_norm = c; per layer
 *                 K = RoPE(k_norm(Wk c)), V = Wv c, kept in the side store;
 *   a block [anchor, mask x (B-1)] embedded with the target's table; per
 *   layer attention over [store ; block] with no mask; final norm; the
 *   target's lm_head; rows 1..B-1 propose the tokens at pos+1 .. pos+B-1.
 * The context does not go through input_layernorm (Qwen3 DFlash). The same
 * forward runs the Laguna drafter (laguna_dflash_config.c and
 * laguna_dflash.c read it) with its differences: aux norms on the
 * features, context through each layer's input_layernorm, a softplus
 * output gate, causal or sliding-window rows. DFlash2 (dflash2.c,
 * dflash2_config.c) runs it too, with a conv around each sublayer of the
 * block rows and its candidate selector in place of the argmax. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "draft/draft_private.h"

enum { LOGIT_ROWS = 16 };

/* ---- tensor names ------------------------------------------------------- */

typedef struct dnames {
    const char *fc, *hidden_norm, *norm;
    const char *wq, *wk, *wv, *wo, *gate, *up, *down;   /* printf formats with %d */
    const char *attn_norm, *ffn_norm, *q_norm, *k_norm;
} dnames;

static const dnames hf_names = {
    "fc.weight", "hidden_norm.weight", "norm.weight",
    "layers.%d.self_attn.q_proj.weight", "layers.%d.self_attn.k_proj.weight",
    "layers.%d.self_attn.v_proj.weight", "layers.%d.self_attn.o_proj.weight",
    "layers.%d.mlp.gate_proj.weight", "layers.%d.mlp.up_proj.weight",
    "layers.%d.mlp.down_proj.weight", "layers.%d.input_layernorm.weight",
    "layers.%d.post_attention_layernorm.weight", "layers.%d.self_attn.q_norm.weight",
    "layers.%d.self_attn.k_norm.weight",
};

static const dnames gguf_names = {
    "fc.weight", "enc.output_norm.weight", "output_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight",
    "blk.%d.attn_output.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight",
    "blk.%d.ffn_down.weight", "blk.%d.attn_norm.weight", "blk.%d.ffn_norm.weight",
    "blk.%d.attn_q_norm.weight", "blk.%d.attn_k_norm.weight",
};

static const char *lname(char *buf, const char *fmt, int l) {
    snprintf(buf, 256, fmt, l);
    return buf;
}

/* ---- config.json (z-lab) ------------------------------------------------ */

static int need_int(const cJSON *j, const char *key, int64_t lo, int64_t hi, int *out,
                    int required, const char *file, dfl_error *err) {
    int64_t v;
    int rc = dfl_json_int(j, key, lo, hi, &v, file, err);
    if (rc == 1 && required)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s is missing", file, key);
    if (rc == 0) *out = (int)v;
    return rc == 1 ? 0 : rc;
}

static int opt_num(const cJSON *j, const char *key, double lo, double hi, double *out,
                   const char *file, dfl_error *err) {
    int rc = dfl_json_num(j, key, lo, hi, out, file, err);
    return rc == 1 ? 0 : rc;
}

/* -> DFL_DRAFT_* of architectures[0], or an error. */
static int hf_arch(const cJSON *j, const char *file, dfl_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 1 || !cJSON_IsString(a->child))
        return dfl_fail(err, DFL_EFORMAT,
                        "%s: architectures must be [\"DFlashDraftModel\"] (a z-lab DFlash drafter), "
                        "[\"DFlash2DraftModel\"] or [\"DFlashLagunaForCausalLM\"]", file);
    const char *s = a->child->valuestring;
    if (strcmp(s, "DFlashDraftModel") == 0) return DFL_DRAFT_ZLAB;
    if (strcmp(s, "DFlash2DraftModel") == 0) return DFL_DRAFT_DFLASH2;
    if (strcmp(s, "DFlashLagunaForCausalLM") == 0) return DFL_DRAFT_LAGUNA;
    return dfl_fail(err, DFL_EUNSUP,
                    "%s: architectures is [\"%.64s\"]; only DFlashDraftModel, DFlash2DraftModel "
                    "and DFlashLagunaForCausalLM drafters are supported", file, s);
}

/* Features we do not implement are refused rather than silently ignored. */
static int hf_refuse_variants(const cJSON *j, const char *file, dfl_error *err) {
    int b = 0;
    if (cJSON_GetObjectItemCaseSensitive(j, "rope_scaling") &&
        !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "rope_scaling")))
        return dfl_fail(err, DFL_EUNSUP, "%s: rope_scaling is set; the drafter supports plain "
                        "RoPE only", file);
    if (dfl_json_bool(j, "attention_bias", &b, file, err) == 0 && b)
        return dfl_fail(err, DFL_EUNSUP, "%s: attention_bias is true; DFlash drafters have no "
                        "biases", file);
    const char *act = dfl_json_str(j, "hidden_act");
    if (act && strcmp(act, "silu") != 0)
        return dfl_fail(err, DFL_EUNSUP, "%s: hidden_act is \"%.32s\", expected \"silu\"", file,
                        act);
    return 0;
}

/* z-lab's block_size is top-level; DFlash2 exports (SpecForge) keep it in
 * dflash_config: either will do, both must agree. */
static int block_size(dfl_drafter *d, const cJSON *j, const cJSON *dc, const char *file,
                      dfl_error *err) {
    int top = 0, in = 0, dflash2 = d->kind == DFL_DRAFT_DFLASH2;
    int rc = need_int(j, "block_size", 2, DFL_MAX_BLOCK, &top, !dflash2, file, err);
    if (!rc && dflash2 && cJSON_IsObject(dc))
        rc = need_int(dc, "block_size", 2, DFL_MAX_BLOCK, &in, 0, file, err);
    if (!rc && top && in && top != in)
        rc = dfl_fail(err, DFL_EFORMAT, "%s: block_size %d and dflash_config.block_size %d "
                      "disagree", file, top, in);
    if (!rc && !top && !in)
        rc = dfl_fail(err, DFL_EFORMAT, "%s: block_size is missing (top-level or in "
                      "dflash_config)", file);
    d->block_size = top ? top : in;
    return rc;
}

static int hf_config(dfl_drafter *d, const char *dir, const dfl_target *t, dfl_error *err) {
    char file[4096];
    snprintf(file, sizeof file, "%s/config.json", dir);
    cJSON *j = dfl_json_parse_file(file, 1 << 20, err);
    if (!j) return err ? err->code : DFL_EFORMAT;
    dfl_config *c = &d->c;
    int rc = hf_arch(j, file, err);
    if (rc >= 0) {
        d->kind = rc;
        rc = dfl_draft_pairing(d->kind, t, file, err);
    }
    if (!rc && d->kind == DFL_DRAFT_LAGUNA) {
        rc = dfl_laguna_draft_config(d, j, t, file, err);
        cJSON_Delete(j);
        return rc;
    }
    rc = rc ? rc : hf_refuse_variants(j, file, err);
    rc = rc ? rc : need_int(j, "hidden_size", 1, 1 << 16, &c->dim, 1, file, err);
    rc = rc ? rc : need_int(j, "num_hidden_layers", 1, DRAFT_MAX_LAYERS, &c->n_layers, 1, file,
                            err);
    rc = rc ? rc : need_int(j, "num_attention_heads", 1, 1024, &c->n_heads, 1, file, err);
    c->n_kv_heads = c->n_heads;
    rc = rc ? rc : need_int(j, "num_key_value_heads", 1, 1024, &c->n_kv_heads, 0, file, err);
    c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
    rc = rc ? rc : need_int(j, "head_dim", 1, 1024, &c->head_dim, 0, file, err);
    rc = rc ? rc : need_int(j, "intermediate_size", 1, 1 << 20, &c->ffn_dim, 1, file, err);
    c->vocab = t->c.vocab;
    rc = rc ? rc : need_int(j, "vocab_size", 1, 1 << 24, &c->vocab, 0, file, err);
    c->max_ctx = t->c.max_ctx;
    rc = rc ? rc : need_int(j, "max_position_embeddings", 1, 1 << 24, &c->max_ctx, 0, file, err);
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(j, "dflash_config");
    rc = rc ? rc : block_size(d, j, dc, file, err);
    int n_target = t->c.n_layers;
    rc = rc ? rc : need_int(j, "num_target_layers", 1, 1 << 16, &n_target, 0, file, err);
    if (!rc && n_target != t->c.n_layers)
        rc = dfl_fail(err, DFL_EFORMAT, "%s: num_target_layers is %d but the target has %d "
                      "layers: this drafter belongs to another target", file, n_target,
                      t->c.n_layers);
    double eps = 1e-6, theta = 10000.0;
    rc = rc ? rc : opt_num(j, "rms_norm_eps", 1e-12, 0.5, &eps, file, err);
    rc = rc ? rc : opt_num(j, "rope_theta", 1.0, 1e12, &theta, file, err);
    c->norm_eps = (float)eps;
    c->rope_theta = (float)theta;
    if (!rc && !cJSON_IsObject(dc))
        rc = dfl_fail(err, DFL_EFORMAT, "%s: dflash_config is missing (expected an object with "
                      "mask_token_id and target_layer_ids)", file);
    rc = rc ? rc : dfl_draft_sliding(d, j, dc, file, err);
    rc = rc ? rc : need_int(dc, "mask_token_id", 0, INT32_MAX, &d->mask_id, 1, file, err);
    rc = rc ? rc : dfl_draft_layer_ids(d, dc, t, 0, file, err);
    if (!rc && d->kind == DFL_DRAFT_DFLASH2) rc = dfl_dflash2_config(d, dc, file, err);
    cJSON_Delete(j);
    return rc;
}

/* ---- GGUF (llama.cpp "dflash") ------------------------------------------- */

static int gguf_int(const gguf_file *g, const char *key, int lo, int hi, int *out,
                    int required, dfl_error *err) {
    uint32_t v;
    int rc = dfl_gguf_u32(g, key, &v, err);
    if (rc == 1) {
        if (required)
            return dfl_fail(err, DFL_EFORMAT, "%s: %s is missing", g->tensors.source, key);
        return 0;
    }
    if (rc) return rc;
    if ((int64_t)v < lo || (int64_t)v > hi)
        return dfl_fail(err, DFL_EFORMAT, "%s: %s = %u, expected %d..%d", g->tensors.source, key,
                        v, lo, hi);
    *out = (int)v;
    return 0;
}

static int gguf_refuse_variants(const gguf_file *g, dfl_error *err) {
    const char *src = g->tensors.source;
    int causal = 0;
    int rc = dfl_gguf_bool(g, "dflash.attention.causal", &causal, err);
    if (rc > 1 || rc < 0) return rc;
    if (causal)
        return dfl_fail(err, DFL_EUNSUP, "%s: dflash.attention.causal is true; DFlash blocks "
                        "attend without a mask", src);
    const gguf_kv *p = dfl_gguf_find(g, "dflash.attention.sliding_window_pattern");
    if (p) {
        if (p->type != GGUF_T_ARRAY || p->arr_type != GGUF_T_BOOL)
            return dfl_fail(err, DFL_EFORMAT, "%s: dflash.attention.sliding_window_pattern must "
                            "be a bool array", src);
        for (uint64_t i = 0; i < p->arr_n; i++)
            if (p->val[i])
                return dfl_fail(err, DFL_EUNSUP, "%s: dflash.attention.sliding_window_pattern[%llu] "
                                "is true; sliding-window drafters are not supported", src,
                                (unsigned long long)i);
    }
    gguf_str s;
    if (dfl_gguf_str(g, "dflash.rope.scaling.type", &s, NULL) == 0 &&
        !(s.len == 4 && !memcmp(s.s, "none", 4)))
        return dfl_fail(err, DFL_EUNSUP, "%s: dflash.rope.scaling.type is set; the drafter "
                        "supports plain RoPE only", src);
    return 0;
}

/* Mask id: the converter writes dflash.mask_token_id, the runtime reads
 * tokenizer.ggml.mask_token_id; either will do, both must agree. */
static int gguf_mask(dfl_drafter *d, const gguf_file *g, dfl_error *err) {
    int a = -1, b = -1;
    int rc = gguf_int(g, "dflash.mask_token_id", 0, INT32_MAX, &a, 0, err);
    rc = rc ? rc : gguf_int(g, "tokenizer.ggml.mask_token_id", 0, INT32_MAX, &b, 0, err);
    if (rc) return rc;
    if (a < 0 && b < 0)
        return dfl_fail(err, DFL_EFORMAT, "%s: no mask token (dflash.mask_token_id or "
                        "tokenizer.ggml.mask_token_id)", g->tensors.source);
    if (a >= 0 && b >= 0 && a != b)
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash.mask_token_id %d and "
                        "tokenizer.ggml.mask_token_id %d disagree", g->tensors.source, a, b);
    d->mask_id = a >= 0 ? a : b;
    return 0;
}

static int gguf_layer_ids(dfl_drafter *d, const gguf_file *g, dfl_error *err) {
    const gguf_kv *kv = dfl_gguf_arr(g, "dflash.target_layers", GGUF_T_I32, err);
    if (!kv) return DFL_EFORMAT;
    if (kv->arr_n < 1 || kv->arr_n > DFL_MAX_CAPTURE_LAYERS)
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash.target_layers has %llu entries, expected "
                        "1..%d", g->tensors.source, (unsigned long long)kv->arr_n,
                        DFL_MAX_CAPTURE_LAYERS);
    d->n_cap = (int)kv->arr_n;
    for (int i = 0; i < d->n_cap; i++) {
        int64_t v = dfl_gguf_arr_i64(kv, i);
        /* llama.cpp captures the input of block v: the output of block v-1. */
        if (v < 1 || v > 1 << 16)
            return dfl_fail(err, DFL_EFORMAT, "%s: dflash.target_layers[%d] = %lld: GGUF ids "
                            "name a target layer's input (HF id + 1), so they start at 1",
                            g->tensors.source, i, (long long)v);
        d->cap[i] = (int)v - 1;
    }
    return 0;
}

/* llama.cpp's DFlash2 form (PR #27342: the same `dflash` architecture plus
 * these keys): any of them makes the file a DFlash2 drafter, which needs all. */
static int gguf_dflash2(dfl_drafter *d, const gguf_file *g, dfl_error *err) {
    static const char *keys[] = {"dflash.conv_kernel_size", "dflash.conv_group_size",
                                 "dflash.selector_rank", "dflash.selector_top_k"};
    int any = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) any |= !!dfl_gguf_find(g, keys[i]);
    if (!any) return 0;
    d->kind = DFL_DRAFT_DFLASH2;
    d->sel_mult = 1.0f;
    int top_hi = d->c.vocab < DRAFT_MAX_SEL_TOP_K ? d->c.vocab : DRAFT_MAX_SEL_TOP_K;
    int rc = gguf_int(g, keys[0], 1, d->block_size, &d->conv_k, 1, err);
    rc = rc ? rc : gguf_int(g, keys[1], 1, d->c.dim, &d->conv_group, 1, err);
    if (!rc && d->c.dim % d->conv_group)
        rc = dfl_fail(err, DFL_EFORMAT, "%s: %s %d does not divide the hidden size %d",
                      g->tensors.source, keys[1], d->conv_group, d->c.dim);
    rc = rc ? rc : gguf_int(g, keys[2], 1, DRAFT_MAX_SEL_RANK, &d->sel_rank, 1, err);
    return rc ? rc : gguf_int(g, keys[3], 1, top_hi, &d->sel_top_k, 1, err);
}

static int gguf_config(dfl_drafter *d, const char *path, const dfl_target *t, dfl_error *err) {
    d->gguf = xcalloc(1, sizeof *d->gguf);
    int rc = dfl_gguf_open(path, d->gguf, err);
    if (rc) return rc;
    const gguf_file *g = d->gguf;
    const char *src = g->tensors.source;
    gguf_str arch;
    rc = dfl_gguf_str(g, "general.architecture", &arch, err);
    if (rc == 1) return dfl_fail(err, DFL_EFORMAT, "%s: general.architecture is missing", src);
    if (rc) return rc;
    if (arch.len != 6 || memcmp(arch.s, "dflash", 6) != 0)
        return dfl_fail(err, DFL_EUNSUP, "%s: general.architecture is '%.*s', expected 'dflash' "
                        "(a llama.cpp DFlash drafter)", src, (int)(arch.len > 32 ? 32 : arch.len),
                        arch.s);
    rc = dfl_draft_pairing(DFL_DRAFT_ZLAB, t, src, err);
    rc = rc ? rc : gguf_refuse_variants(g, err);
    dfl_config *c = &d->c;
    rc = rc ? rc : gguf_int(g, "dflash.embedding_length", 1, 1 << 16, &c->dim, 1, err);
    rc = rc ? rc : gguf_int(g, "dflash.block_count", 1, DRAFT_MAX_LAYERS, &c->n_layers, 1, err);
    rc = rc ? rc : gguf_int(g, "dflash.attention.head_count", 1, 1024, &c->n_heads, 1, err);
    if (rc) return rc;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->dim / c->n_heads;
    rc = gguf_int(g, "dflash.attention.head_count_kv", 1, 1024, &c->n_kv_heads, 0, err);
    rc = rc ? rc : gguf_int(g, "dflash.attention.key_length", 1, 1024, &c->head_dim, 0, err);
    int vlen = c->head_dim;
    rc = rc ? rc : gguf_int(g, "dflash.attention.value_length", 1, 1024, &vlen, 0, err);
    if (!rc && vlen != c->head_dim)
        rc = dfl_fail(err, DFL_EUNSUP, "%s: dflash.attention.value_length %d differs from "
                      "key_length %d", src, vlen, c->head_dim);
    int rope_dims = c->head_dim;
    rc = rc ? rc : gguf_int(g, "dflash.rope.dimension_count", 1, 1024, &rope_dims, 0, err);
    if (!rc && rope_dims != c->head_dim)
        rc = dfl_fail(err, DFL_EUNSUP, "%s: dflash.rope.dimension_count %d differs from "
                      "key_length %d; partial RoPE is not supported", src, rope_dims, c->head_dim);
    rc = rc ? rc : gguf_int(g, "dflash.feed_forward_length", 1, 1 << 20, &c->ffn_dim, 1, err);
    rc = rc ? rc : gguf_int(g, "dflash.block_size", 2, DFL_MAX_BLOCK, &d->block_size, 1, err);
    c->max_ctx = t->c.max_ctx;
    rc = rc ? rc : gguf_int(g, "dflash.context_length", 1, 1 << 24, &c->max_ctx, 0, err);
    int thd = t->c.dim;
    rc = rc ? rc : gguf_int(g, "dflash.target_hidden_size", 1, 1 << 16, &thd, 0, err);
    if (!rc && thd != t->c.dim)
        rc = dfl_fail(err, DFL_EFORMAT, "%s: dflash.target_hidden_size is %d but the target's "
                      "hidden size is %d: this drafter belongs to another target", src, thd,
                      t->c.dim);
    c->vocab = t->c.vocab;
    rc = rc ? rc : gguf_int(g, "dflash.vocab_size", 1, 1 << 24, &c->vocab, 0, err);
    if (rc) return rc;
    c->norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    rc = dfl_gguf_f32(g, "dflash.attention.layer_norm_rms_epsilon", &c->norm_eps, err);
    if (rc == 1) rc = 0;
    int r2 = rc ? rc : dfl_gguf_f32(g, "dflash.rope.freq_base", &c->rope_theta, err);
    rc = r2 == 1 ? 0 : r2;
    if (!rc && !(c->norm_eps > 0 && c->norm_eps < 1))
        rc = dfl_fail(err, DFL_EFORMAT, "%s: dflash.attention.layer_norm_rms_epsilon = %g, "
                      "expected in (0, 1)", src, c->norm_eps);
    if (!rc && !(c->rope_theta >= 1 && c->rope_theta < 1e12f))
        rc = dfl_fail(err, DFL_EFORMAT, "%s: dflash.rope.freq_base = %g, expected >= 1", src,
                      c->rope_theta);
    rc = rc ? rc : gguf_mask(d, g, err);
    rc = rc ? rc : gguf_layer_ids(d, g, err);
    return rc ? rc : gguf_dflash2(d, g, err);
}

/* ---- checks against the paired target ------------------------------------ */

static int check_config(const dfl_drafter *d, const dfl_target *t, const char *src,
                        dfl_error *err) {
    const dfl_config *c = &d->c;
    if (c->dim != t->c.dim)
        return dfl_fail(err, DFL_EFORMAT, "%s: drafter hidden_size %d, but the target's is %d: "
                        "this drafter belongs to another target", src, c->dim, t->c.dim);
    if (c->vocab != t->c.vocab)
        return dfl_fail(err, DFL_EFORMAT, "%s: drafter vocab_size %d, but the target's is %d: "
                        "this drafter belongs to another target", src, c->vocab, t->c.vocab);
    if (c->n_heads % c->n_kv_heads)
        return dfl_fail(err, DFL_EFORMAT, "%s: %d attention heads are not a multiple of %d KV "
                        "heads", src, c->n_heads, c->n_kv_heads);
    if (c->head_dim < 2 || c->head_dim % 2)
        return dfl_fail(err, DFL_EFORMAT, "%s: head_dim %d is not a positive even number (RoPE "
                        "rotates pairs)", src, c->head_dim);
    if (d->block_size < 2 || d->block_size > DFL_MAX_BLOCK)
        return dfl_fail(err, DFL_EFORMAT, "%s: block_size %d outside 2..%d", src, d->block_size,
                        DFL_MAX_BLOCK);
    if (d->mask_id < 0 || d->mask_id >= t->c.vocab)
        return dfl_fail(err, DFL_EFORMAT, "%s: mask_token_id %d outside the target's vocabulary "
                        "0..%d", src, d->mask_id, t->c.vocab - 1);
    for (int i = 0; i < d->n_cap; i++)
        if (d->cap[i] < 0 || d->cap[i] >= t->c.n_layers)
            return dfl_fail(err, DFL_EFORMAT, "%s: target layer id %d (entry %d of "
                            "target_layer_ids) outside the target's layers 0..%d", src,
                            d->cap[i], i, t->c.n_layers - 1);
    return 0;
}

/* ---- key sanitizer (safetensors) -------------------------------------------- */

typedef struct keyref {
    const char *key;   /* name without a leading "model." */
    const char *name;  /* as in the file */
} keyref;

static int cmp_key(const void *a, const void *b) {
    return strcmp(((const keyref *)a)->key, ((const keyref *)b)->key);
}

/* Strips a "model." prefix from every name; refuses a checkpoint that holds
 * both a prefixed and an unprefixed copy of a tensor. */
static int sanitize_keys(dfl_tensors *ts, dfl_error *err) {
    keyref *k = xcalloc(ts->n ? ts->n : 1, sizeof *k);
    for (int i = 0; i < ts->n; i++) {
        const char *nm = ts->t[i].name;
        k[i].name = nm;
        k[i].key = strncmp(nm, "model.", 6) == 0 ? nm + 6 : nm;
    }
    qsort(k, ts->n, sizeof *k, cmp_key);
    int rc = 0;
    for (int i = 1; i < ts->n && !rc; i++)
        if (!strcmp(k[i - 1].key, k[i].key))
            rc = dfl_fail(err, DFL_EFORMAT, "%s: tensor %s is present twice (%s and %s); refusing "
                          "an ambiguous checkpoint", ts->source, k[i].key, k[i - 1].name,
                          k[i].name);
    free(k);
    if (rc) return rc;
    for (int i = 0; i < ts->n; i++) {
        char *nm = ts->t[i].name;
        if (!strncmp(nm, "model.", 6)) memmove(nm, nm + 6, strlen(nm + 6) + 1);
    }
    return 0;
}

/* ---- weights ---------------------------------------------------------------- */

static int load_weights(dfl_drafter *d, const dfl_load_opts *o, dfl_error *err) {
    const dfl_config *c = &d->c;
    const dnames *nm = d->gguf ? &gguf_names : &hf_names;
    dfl_tensors *ts = d->gguf ? &d->gguf->tensors : &d->ts;
    int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int fin = d->n_cap * d->t->c.dim;
    dfl_weights w;
    int rc = dfl_w_begin(&w, ts, o, err);
    if (rc) return rc;
    rc = dfl_w_mat(&w, nm->fc, c->dim, fin, &d->fc, err);
    rc = rc ? rc : dfl_w_vec(&w, nm->hidden_norm, c->dim, &d->hidden_norm, err);
    rc = rc ? rc : dfl_w_vec(&w, nm->norm, c->dim, &d->out_norm, err);
    d->layers = xcalloc(c->n_layers, sizeof *d->layers);
    if (!rc && d->kind == DFL_DRAFT_LAGUNA) rc = dfl_laguna_draft_weights(d, &w, err);
    char b[256];
    int zlab = d->kind == DFL_DRAFT_ZLAB || d->kind == DFL_DRAFT_DFLASH2;
    for (int l = 0; l < c->n_layers && !rc && zlab; l++) {
        dfl_dlayer *L = &d->layers[l];
        rc = dfl_w_mat(&w, lname(b, nm->wq, l), qd, c->dim, &L->wq, err);
        rc = rc ? rc : dfl_w_mat(&w, lname(b, nm->wk, l), kvd, c->dim, &L->wk, err);
        rc = rc ? rc : dfl_w_mat(&w, lname(b, nm->wv, l), kvd, c->dim, &L->wv, err);
        rc = rc ? rc : dfl_w_mat(&w, lname(b, nm->wo, l), c->dim, qd, &L->wo, err);
        rc = rc ? rc : dfl_w_mat(&w, lname(b, nm->gate, l), c->ffn_dim, c->dim, &L->w_gate, err);
        rc = rc ? rc : dfl_w_mat(&w, lname(b, nm->up, l), c->ffn_dim, c->dim, &L->w_up, err);
        rc = rc ? rc : dfl_w_mat(&w, lname(b, nm->down, l), c->dim, c->ffn_dim, &L->w_down, err);
        rc = rc ? rc : dfl_w_vec(&w, lname(b, nm->attn_norm, l), c->dim, &L->attn_norm, err);
        rc = rc ? rc : dfl_w_vec(&w, lname(b, nm->ffn_norm, l), c->dim, &L->ffn_norm, err);
        rc = rc ? rc : dfl_w_vec(&w, lname(b, nm->q_norm, l), c->head_dim, &L->q_norm, err);
        rc = rc ? rc : dfl_w_vec(&w, lname(b, nm->k_norm, l), c->head_dim, &L->k_norm, err);
        if (o->progress) o->progress(o->progress_ud, "draft", l + 1, c->n_layers);
    }
    if (!rc && d->kind == DFL_DRAFT_DFLASH2) rc = dfl_dflash2_weights(d, &w, !!d->gguf, err);
    /* A quantized drafter reads a 16-bit head in its own type too: a block's
     * rows are arithmetic-bound there, and the integer kernels do them 2-3x
     * faster. Drafts are only proposals, so the target's output is unchanged. */
    d->head = d->t->lm_head;
    if (!rc && w.convert && w.type > DFL_BF16 && d->head.type <= DFL_BF16)
        rc = dfl_w_convert(&w, "the target's lm_head", &d->head, err);
    if (!rc) rc = dfl_w_end(&w, err);
    d->owned = w.owned;
    return rc;
}

static size_t fmax_sz(size_t a, size_t b) { return a > b ? a : b; }

/* Every matrix of a layer (some with no rows where the kind lacks them), for
 * scratch sizes, side copies and frees; returns how many. */
enum { DLAYER_MATS = 10 };
static int dlayer_mats(dfl_dlayer *L, dfl_mat **out) {
    dfl_mat *ms[DLAYER_MATS] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                &L->wg, &L->conv_proj[0], &L->conv_proj[1]};
    memcpy(out, ms, sizeof ms);
    return DLAYER_MATS;
}

static void alloc_scratch(dfl_drafter *d) {
    const dfl_config *c = &d->c;
    int R = d->max_rows, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    d->x = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    d->xn = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    d->ctx = dfl_aligned_alloc((size_t)R * c->dim * sizeof(float));
    d->q = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    d->k = dfl_aligned_alloc((size_t)R * kvd * sizeof(float));
    d->v = dfl_aligned_alloc((size_t)R * kvd * sizeof(float));
    d->att = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    d->h1 = dfl_aligned_alloc((size_t)R * c->ffn_dim * sizeof(float));
    d->h2 = dfl_aligned_alloc((size_t)R * c->ffn_dim * sizeof(float));
    d->logits = dfl_aligned_alloc((size_t)LOGIT_ROWS * c->vocab * sizeof(float));
    d->tok = xcalloc(R, sizeof(int32_t));
    d->n_keys = xcalloc(R, sizeof(int));
    d->rope_cs = dfl_aligned_alloc((size_t)R * c->head_dim * sizeof(float));
    d->feat_n = dfl_aligned_alloc((size_t)R * d->fc.cols * sizeof(float));
    if (d->kind == DFL_DRAFT_LAGUNA) d->gate = dfl_aligned_alloc((size_t)R * qd * sizeof(float));
    if (d->conv_k) {
        int K = d->sel_top_k;
        d->dconv = dfl_aligned_alloc((size_t)R * d->layers[0].conv_proj[0].rows * sizeof(float));
        d->sel_h = dfl_aligned_alloc((size_t)R * d->sel_rank * sizeof(float));
        d->sel_unary = dfl_aligned_alloc((size_t)R * K * sizeof(float));
        d->sel_cand = xcalloc((size_t)R * K, sizeof(int32_t));
    }
    size_t qs = dfl_matmul_scratch(d->fc.type, R, d->fc.cols);
    if (d->conv_k) qs = fmax_sz(qs, dfl_matmul_scratch(d->sel_proj.type, R, d->sel_proj.cols));
    qs = fmax_sz(qs, dfl_matmul_scratch(d->head.type, LOGIT_ROWS, d->head.cols));
    dfl_mat *ms[DLAYER_MATS];
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0, n = dlayer_mats(&d->layers[l], ms); i < n; i++)
            qs = fmax_sz(qs, dfl_matmul_scratch(ms[i]->type, R, ms[i]->cols));
    d->qscratch = dfl_aligned_alloc(qs);
    /* Cache-resident drafters: transposed copies for dfl_matmul. */
    dfl_tensors *ts = d->gguf ? &d->gguf->tensors : &d->ts;
    dfl_w_prepare(ts, d->owned, &d->fc);
    if (d->sel_proj.rows) dfl_w_prepare(ts, d->owned, &d->sel_proj);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0, n = dlayer_mats(&d->layers[l], ms); i < n; i++)
            if (ms[i]->rows) dfl_w_prepare(ts, d->owned, ms[i]);
    /* A head converted for the drafter (load_weights) is its own: Q8_0 takes the
     * il8 layout too, which makes no side copy (none is released for it). */
    if (d->head.data != d->t->lm_head.data && dfl_qmat_il8_wants(&d->head))
        dfl_w_prepare(ts, d->owned, &d->head);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int open_drafter(dfl_drafter *d, const char *path, const dfl_target *t, dfl_error *err) {
    if (is_file(path)) return gguf_config(d, path, t, err);
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    if (!is_file(cfg))
        return dfl_fail(err, DFL_EIO, "%s: neither a .gguf file nor a folder with config.json "
                        "(pass a DFlash drafter folder or a llama.cpp dflash GGUF)", path);
    int rc = hf_config(d, path, t, err);
    rc = rc ? rc : dfl_safetensors_open_dir(path, &d->ts, err);
    return rc ? rc : sanitize_keys(&d->ts, err);
}

int dfl_drafter_load(const char *path, dfl_target *t, const dfl_load_opts *o,
                     dfl_drafter **out, dfl_error *err) {
    *out = NULL;
    dfl_drafter *d = xcalloc(1, sizeof *d);
    d->t = t;
    dfl_config *c = &d->c;
    c->arch = ARCH_QWEN3;
    c->rope_neox = 1;
    c->qk_norm = 1;
    c->rope_scale_type = ROPE_SCALE_NONE;
    c->rope_factor = 1.0f;
    c->rope_attn_factor = 1.0f;
    c->bos_id = c->eos_id = -1;
    int rc = open_drafter(d, path, t, err);
    rc = rc ? rc : check_config(d, t, path, err);
    if (!rc) {
        dfl_rope_init(&d->rope, c);
        rc = load_weights(d, o, err);
    }
    if (rc) {
        dfl_drafter_free(d);
        return rc;
    }
    int R = o->max_rows > 0 ? o->max_rows : 64;
    d->max_rows = R > d->block_size ? R : d->block_size;
    if (d->max_rows > DFL_MAX_BLOCK) d->max_rows = DFL_MAX_BLOCK;
    d->window = o->draft_window > 0 ? o->draft_window : 0;
    alloc_scratch(d);
    *out = d;
    return 0;
}

void dfl_drafter_free(dfl_drafter *d) {
    if (!d) return;
    dfl_mtp_free(d->mtp, d->c.n_experts);
    dfl_mat_release(&d->fc);
    dfl_mat *ms[DLAYER_MATS];
    for (int l = 0; d->layers && l < d->c.n_layers; l++)
        for (int i = 0, n = dlayer_mats(&d->layers[l], ms); i < n; i++) dfl_mat_release(ms[i]);
    dfl_mat_release(&d->sel_proj);
    free(d->layers);
    free(d->rope.inv_freq);
    dfl_weights_free_owned(d->owned);
    dfl_tensors_free(&d->ts);
    if (d->gguf) {
        dfl_gguf_free(d->gguf);
        free(d->gguf);
    }
    free(d->x), free(d->xn), free(d->ctx), free(d->q), free(d->k), free(d->v), free(d->att);
    free(d->h1), free(d->h2), free(d->logits), free(d->tok), free(d->n_keys);
    free(d->qscratch), free(d->rope_cs), free(d->feat_n), free(d->gate);
    free(d->dconv), free(d->sel_h), free(d->sel_unary), free(d->sel_cand);
    free(d);
}

/* ---- the side store --------------------------------------------------------- */

dfl_dstore *dfl_dstore_new(const dfl_drafter *d, int ctx) {
    dfl_dstore *s = xcalloc(1, sizeof *s);
    if (d->mtp) {
        dfl_mtp_store_init(d, s, ctx);
        return s;
    }
    s->cap = ctx + d->max_rows;
    /* When every layer slides, rows older than the window are never read
     * again: they need not be projected (the tighter of the two windows
     * bounds). A full layer reads them all. */
    uint64_t all = ~(uint64_t)0 >> (64 - d->c.n_layers);
    int swa = d->swa && (d->sliding & all) == all ? d->swa : 0;
    s->window = d->window && (!swa || d->window < swa) ? d->window : swa;
    s->n_layers = d->c.n_layers;
    s->kv_dim = d->c.n_kv_heads * d->c.head_dim;
    s->type = d->t->kv_type;
    size_t n = (size_t)s->n_layers * s->cap * s->kv_dim * dfl_type_block_bytes(s->type);
    s->k = dfl_aligned_alloc(n);
    s->v = dfl_aligned_alloc(n);
    s->pos = xcalloc((size_t)s->cap, sizeof *s->pos);
    return s;
}

void dfl_dstore_free(dfl_dstore *s) {
    if (!s) return;
    free(s->k);
    free(s->v);
    free(s->pos);
    dfl_kv_free(s->mkv);
    free(s->hid);
    free(s);
}

/* The row of position p: the first stored row at or after it; past the
 * context, a block's row (block rows follow the last stored row). */
static int row_of(const dfl_dstore *s, int p) {
    if (p >= s->len) return s->rows + (p - s->len);
    int a = 0, b = s->rows;
    while (a < b) {
        int m = a + (b - a) / 2;
        if (s->pos[m] < p) a = m + 1;
        else b = m;
    }
    return a;
}

/* Positions the window skipped cannot come back: a cut after which the
 * next block's window would reach them empties the store. */
void dfl_dstore_truncate(dfl_dstore *s, int n_keep) {
    if (s->mkv) {
        dfl_mtp_store_truncate(s, n_keep);
        return;
    }
    if (n_keep < 0) n_keep = 0;
    if (n_keep < s->len) s->rows = row_of(s, n_keep), s->len = n_keep;
    if (s->lo > 0 && (s->len == 0 || s->len - s->window < s->lo)) s->len = s->rows = s->lo = 0;
}

int dfl_dstore_skip(dfl_dstore *s, int n, dfl_error *err) {
    if (s->mkv) return dfl_fail(err, DFL_EARG, "an MTP head's store cannot skip rows");
    if (n < 0 || s->len + n > s->cap)
        return dfl_fail(err, DFL_ECTX, "drafter store full: %d + %d positions exceed %d", s->len,
                        n, s->cap);
    s->len += n;
    return 0;
}

int dfl_dstore_copy_prefix(dfl_dstore *dst, const dfl_dstore *src, int n) {
    if (src->mkv) return dfl_mtp_store_copy(dst, src, n);
    dst->len = dst->rows = dst->lo = 0;
    if (n > src->len) n = src->len;
    if (src->lo > 0 || n <= 0 || n > dst->cap) return 0;
    int rows = row_of(src, n);
    size_t row = (size_t)src->kv_dim * dfl_type_block_bytes(src->type);
    for (int l = 0; l < src->n_layers; l++) {
        size_t off = (size_t)l * src->cap * row;   /* both stores share cap: one engine */
        memcpy((char *)dst->k + off, (const char *)src->k + off, (size_t)rows * row);
        memcpy((char *)dst->v + off, (const char *)src->v + off, (size_t)rows * row);
    }
    memcpy(dst->pos, src->pos, (size_t)rows * sizeof *dst->pos);
    dst->rows = rows;
    return dst->len = n;
}

/* ---- forward ---------------------------------------------------------------- */

static void matmul(dfl_drafter *d, const dfl_mat *W, int n, const float *X, int ldx, float *Y,
                   int ldy) {
    dfl_matmul(d->t->pool, W, n, X, ldx, Y, ldy, d->qscratch);
}

static void norm_rows(float *y, const float *x, const float *w, int n, int dim, float eps) {
    for (int r = 0; r < n; r++) dfl_rmsnorm(y + (size_t)r * dim, x + (size_t)r * dim, w, dim, eps);
}

static void *store_row(const dfl_dstore *s, void *base, int l, int pos) {
    return (char *)base + ((size_t)l * s->cap + pos) * s->kv_dim * dfl_type_block_bytes(s->type);
}

/* The RoPE cos/sin of n rows at positions pos0.., into rope_cs from row r0,
 * for every layer. */
static void rope_rows(dfl_drafter *d, int r0, int n, int pos0) {
    for (int r = 0; r < n; r++)
        dfl_rope_cs(&d->rope, pos0 + r, d->rope_cs + (size_t)(r0 + r) * d->c.head_dim);
}

/* K and V of n rows xs (already normed as the caller wants; their
 * positions' cos/sin in rope_cs from row r0), k-normed and rotated in
 * scratch, then stored in the store's type at store rows row0.. */
static void project_kv(dfl_drafter *d, dfl_dstore *s, int l, const float *xs, int r0, int n,
                       int row0) {
    const dfl_config *c = &d->c;
    const dfl_dlayer *L = &d->layers[l];
    matmul(d, &L->wk, n, xs, c->dim, d->k, s->kv_dim);
    matmul(d, &L->wv, n, xs, c->dim, d->v, s->kv_dim);
    norm_rows(d->k, d->k, L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    for (int r = 0; r < n; r++) {
        float *k = d->k + (size_t)r * s->kv_dim, *v = d->v + (size_t)r * s->kv_dim;
        dfl_rope_apply_cs(&d->rope, k, c->n_kv_heads, d->rope_cs + (size_t)(r0 + r) * c->head_dim);
        dfl_quant_row(s->type, k, store_row(s, s->k, l, row0 + r), s->kv_dim);
        dfl_quant_row(s->type, v, store_row(s, s->v, l, row0 + r), s->kv_dim);
    }
}

/* ---- a pass: the work of several sequences, weights read once ------------------ */

/* The feature rows of every context work in one (M, fc.cols) matrix: Laguna's
 * through each captured layer's RMSNorm, z-lab's copied (a lone work's rows
 * are read in place). */
static const float *pass_features(dfl_drafter *d, dfl_dwork **w, int k) {
    int td = d->t->c.dim;
    if (k == 1 && !d->aux_norm[0]) return w[0]->feat + (size_t)w[0]->skip * d->fc.cols;
    for (int i = 0; i < k; i++)
        for (int r = 0; r < w[i]->n - w[i]->skip; r++) {
            const float *f = w[i]->feat + (size_t)(w[i]->skip + r) * d->fc.cols;
            float *o = d->feat_n + (size_t)(w[i]->row + r) * d->fc.cols;
            if (!d->aux_norm[0]) memcpy(o, f, sizeof(float) * d->fc.cols);
            for (int j = 0; d->aux_norm[0] && j < d->n_cap; j++)
                dfl_rmsnorm(o + (size_t)j * td, f + (size_t)j * td, d->aux_norm[j], td,
                            d->c.norm_eps);
        }
    return d->feat_n;
}

/* Context works: features -> fc -> hidden_norm, per layer K/V into each store. */
static void context_pass(dfl_drafter *d, dfl_dwork **w, int k) {
    const dfl_config *c = &d->c;
    int M = 0;
    for (int i = 0; i < k; i++) w[i]->row = M, M += w[i]->n - w[i]->skip;
    if (M > 0) {
        matmul(d, &d->fc, M, pass_features(d, w, k), d->fc.cols, d->ctx, c->dim);
        norm_rows(d->ctx, d->ctx, d->hidden_norm, M, c->dim, c->norm_eps);
        for (int i = 0; i < k; i++)
            rope_rows(d, w[i]->row, w[i]->n - w[i]->skip, w[i]->s->len + w[i]->skip);
        for (int l = 0; l < c->n_layers; l++) {
            const float *xs = d->ctx;
            if (d->ctx_norm) {   /* Laguna: the layer's input_layernorm first */
                norm_rows(d->xn, d->ctx, d->layers[l].attn_norm, M, c->dim, c->norm_eps);
                xs = d->xn;
            }
            for (int i = 0; i < k; i++)
                project_kv(d, w[i]->s, l, xs + (size_t)w[i]->row * c->dim, w[i]->row,
                           w[i]->n - w[i]->skip, w[i]->s->rows);
        }
    }
    for (int i = 0; i < k; i++) {
        dfl_dstore *s = w[i]->s;
        if (w[i]->skip > 0) s->lo = s->len + w[i]->skip;
        for (int p = s->len + w[i]->skip; p < s->len + w[i]->n; p++) s->pos[s->rows++] = p;
        s->len += w[i]->n;
    }
}

/* Attention of n block rows, from block row r0 on (queries q, out att, key
 * counts nk), over [store ; block]: z-lab's rows see every key; causal rows
 * (Laguna) only keys up to their own position; a sliding layer's rows the
 * last swa of those, one call per row since each starts at its own key. */
static void block_attention(dfl_drafter *d, dfl_dstore *s, int l, int B, int pos0, int r0,
                            int n, const float *q, float *att, int *nk) {
    const dfl_config *c = &d->c;
    int hd = c->head_dim, qd = c->n_heads * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int lo = s->window && pos0 - s->window > 0 ? pos0 - s->window : 0;
    if (lo < s->lo) lo = s->lo;
    int swa = d->sliding >> l & 1 ? d->swa : 0, base = s->rows, lo_row = row_of(s, lo);
    if (!swa) {   /* (block row j is store row base + j) */
        for (int r = 0; r < n; r++) nk[r] = (d->causal ? base + r0 + r + 1 : base + B) - lo_row;
        dfl_kv_view v = {store_row(s, s->k, l, lo_row), store_row(s, s->v, l, lo_row), s->type,
                         s->kv_dim, (size_t)hd};
        dfl_attention(d->t->pool, n, q, &v, nk, c->n_heads, c->n_kv_heads, hd, scale, att);
        return;
    }
    for (int r = 0; r < n; r++) {   /* sliding rows are causal (checked at load) */
        int p = pos0 + r0 + r, first = row_of(s, p + 1 - swa > lo ? p + 1 - swa : lo);
        nk[r] = base + r0 + r + 1 - first;
        dfl_kv_view v = {store_row(s, s->k, l, first), store_row(s, s->v, l, first), s->type,
                         s->kv_dim, (size_t)hd};
        dfl_attention(d->t->pool, 1, q + (size_t)r * qd, &v, nk + r, c->n_heads, c->n_kv_heads,
                      hd, scale, att + (size_t)r * qd);
    }
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Laguna: att *= softplus(g_proj(xn)) per head or per element, xn the
 * layer's normed input of the n query rows. */
static void output_gate(dfl_drafter *d, const dfl_dlayer *L, const float *xn, int n) {
    if (!L->wg.rows) return;
    int hd = d->c.head_dim, qd = d->c.n_heads * hd, per_head = L->wg.rows == d->c.n_heads;
    matmul(d, &L->wg, n, xn, d->c.dim, d->gate, L->wg.rows);
    for (int r = 0; r < n; r++) {
        float *a = d->att + (size_t)r * qd;
        const float *g = d->gate + (size_t)r * L->wg.rows;
        for (int i = 0; i < qd; i++) a[i] *= softplus(g[per_head ? i / hd : i]);
    }
}

/* The last layer passes only the rows whose drafts are read (not the anchor,
 * not the rows past the verify block, which only had to lend their keys):
 * each work's rows lead..n_out move down to be contiguous, x, xn, their
 * cos/sin and DFlash2's taps alike (a row's result is the same wherever it
 * sits). lead 1 drops the anchor; 0 keeps it, for DFlash2's conv, whose rows
 * read the rows before them. Sets each work's row to its first kept row;
 * returns the rows kept. */
static int keep_out_rows(dfl_drafter *d, dfl_dwork **w, int k, int lead) {
    int dim = d->c.dim, hd = d->c.head_dim, n = 0;
    int dk = d->conv_k ? d->layers[0].conv_proj[0].rows : 0;
    for (int i = 0; i < k; i++) {
        int from = w[i]->row + lead, m = w[i]->n_out + 1 - lead;
        memmove(d->x + (size_t)n * dim, d->x + (size_t)from * dim, sizeof(float) * m * dim);
        memmove(d->xn + (size_t)n * dim, d->xn + (size_t)from * dim, sizeof(float) * m * dim);
        memmove(d->rope_cs + (size_t)n * hd, d->rope_cs + (size_t)from * hd,
                sizeof(float) * m * hd);
        if (dk)
            memmove(d->dconv + (size_t)n * dk, d->dconv + (size_t)from * dk,
                    sizeof(float) * m * dk);
        w[i]->row = n;
        n += m;
    }
    return n;
}

/* DFlash2: a sublayer's conv (side 0: prepare, 1: finish) over each work's
 * block rows of y (from each work's row, rows[i] of them). Prepare first
 * projects the taps of both sides from y (the normed sublayer input). */
static void conv_works(dfl_drafter *d, const dfl_dlayer *L, int sub, int side, dfl_dwork **w,
                       int k, const int *rows, int n, float *y) {
    const dfl_mat *P = &L->conv_proj[sub];
    if (side == 0) dfl_matmul(d->t->pool, P, n, y, d->c.dim, d->dconv, P->rows, d->qscratch);
    int kg = P->rows / 2;
    for (int i = 0; i < k; i++)
        dfl_dflash2_conv(d, L->conv_base[sub] + (size_t)side * d->conv_k * d->c.dim,
                         d->dconv + (size_t)w[i]->row * P->rows + (size_t)side * kg, P->rows,
                         y + (size_t)w[i]->row * d->c.dim, rows[i]);
}

/* One drafter layer over every work's block rows in d->x (R rows). Every
 * row's K/V enter its store's slack rows past its last (len stays); queries and
 * everything after attention run for all rows, or in the last layer for the
 * rows kept. Returns the rows now in d->x. */
static int block_layer(dfl_drafter *d, dfl_dwork **w, int k, int l, int R) {
    const dfl_config *c = &d->c;
    const dfl_dlayer *L = &d->layers[l];
    int hd = c->head_dim, qd = c->n_heads * hd, last = l == c->n_layers - 1;
    int conv = d->conv_k > 0, lead = last && !conv, rows[DFL_MAX_PARALLEL];
    norm_rows(d->xn, d->x, L->attn_norm, R, c->dim, c->norm_eps);
    for (int i = 0; i < k; i++) rows[i] = w[i]->B;
    if (conv) conv_works(d, L, 0, 0, w, k, rows, R, d->xn);
    for (int i = 0; i < k; i++)
        project_kv(d, w[i]->s, l, d->xn + (size_t)w[i]->row * c->dim, w[i]->row, w[i]->B,
                   w[i]->s->rows);
    int n = last ? keep_out_rows(d, w, k, !conv) : R;
    for (int i = 0; last && i < k; i++) rows[i] = w[i]->n_out + 1;
    matmul(d, &L->wq, n, d->xn, c->dim, d->q, qd);
    norm_rows(d->q, d->q, L->q_norm, n * c->n_heads, hd, c->norm_eps);
    for (int r = 0; r < n; r++)
        dfl_rope_apply_cs(&d->rope, d->q + (size_t)r * qd, c->n_heads,
                          d->rope_cs + (size_t)r * hd);
    for (int i = 0; i < k; i++) {
        size_t o = (size_t)w[i]->row;
        block_attention(d, w[i]->s, l, w[i]->B, w[i]->s->len, lead,
                        last ? w[i]->n_out + 1 - lead : w[i]->B, d->q + o * qd, d->att + o * qd,
                        d->n_keys + o);
    }
    output_gate(d, L, d->xn, n);
    matmul(d, &L->wo, n, d->att, qd, d->ctx, c->dim);
    if (conv) conv_works(d, L, 0, 1, w, k, rows, n, d->ctx);
    for (size_t i = 0; i < (size_t)n * c->dim; i++) d->x[i] += d->ctx[i];
    norm_rows(d->xn, d->x, L->ffn_norm, n, c->dim, c->norm_eps);
    if (conv) conv_works(d, L, 1, 0, w, k, rows, n, d->xn);
    matmul(d, &L->w_gate, n, d->xn, c->dim, d->h1, c->ffn_dim);
    matmul(d, &L->w_up, n, d->xn, c->dim, d->h2, c->ffn_dim);
    dfl_swiglu(d->h1, d->h1, d->h2, n * c->ffn_dim);
    matmul(d, &L->w_down, n, d->h1, c->ffn_dim, d->ctx, c->dim);
    if (conv) conv_works(d, L, 1, 1, w, k, rows, n, d->ctx);
    for (size_t i = 0; i < (size_t)n * c->dim; i++) d->x[i] += d->ctx[i];
    return n;
}

/* logits = m rows of x through the drafts' head (d->head). */
static void head_rows(dfl_drafter *d, const float *x, int m) {
    dfl_matmul(d->t->pool, &d->head, m, x, d->c.dim, d->logits, d->c.vocab, d->qscratch);
}

/* DFlash2: each kept row's candidates from the target's head (chunked as
 * below), P.h of every row, then each work's chain walk. */
static void select_rows(dfl_drafter *d, dfl_dwork **w, int k, int R) {
    int K = d->sel_top_k, V = d->c.vocab;
    for (int a = 0; a < R; a += LOGIT_ROWS) {
        int m = R - a < LOGIT_ROWS ? R - a : LOGIT_ROWS;
        head_rows(d, d->xn + (size_t)a * d->c.dim, m);
        for (int r = a; r < a + m; r++)
            dfl_dflash2_topk(d, d->logits + (size_t)(r - a) * V, d->sel_cand + (size_t)r * K,
                             d->sel_unary + (size_t)r * K);
    }
    matmul(d, &d->sel_proj, R, d->xn, d->c.dim, d->sel_h, d->sel_rank);
    for (int i = 0; i < k; i++) {
        size_t o = (size_t)w[i]->row;
        dfl_dflash2_walk(d, w[i]->anchor, w[i]->n_out, d->sel_cand + o * K,
                         d->sel_unary + o * K, d->sel_h + o * d->sel_rank, w[i]->logits,
                         w[i]->draft);
    }
}

/* Draft works: blocks [anchor, mask x (B-1)] of every work stacked, the
 * layers, then the kept rows through the final norm and the target's lm_head
 * in chunks (one read of its weights per LOGIT_ROWS rows of all works). */
static void draft_pass(dfl_drafter *d, dfl_dwork **w, int k) {
    const dfl_config *c = &d->c;
    int R = 0, vocab = c->vocab;
    for (int i = 0; i < k; i++) {
        w[i]->row = R;
        d->tok[R] = w[i]->anchor;
        for (int r = 1; r < w[i]->B; r++) d->tok[R + r] = d->mask_id;
        rope_rows(d, R, w[i]->B, w[i]->s->len);
        R += w[i]->B;
    }
    dfl_target_embed(d->t, d->tok, R, d->x);
    for (int l = 0; l < c->n_layers; l++) R = block_layer(d, w, k, l, R);
    if (d->conv_k) R = keep_out_rows(d, w, k, 1);   /* the conv's anchor rows are done */
    norm_rows(d->xn, d->x, d->out_norm, R, c->dim, c->norm_eps);
    if (d->conv_k) {
        select_rows(d, w, k, R);
        return;
    }
    for (int a = 0, i = 0; a < R; a += LOGIT_ROWS) {
        int m = R - a < LOGIT_ROWS ? R - a : LOGIT_ROWS;
        head_rows(d, d->xn + (size_t)a * c->dim, m);
        for (int r = a; r < a + m; r++) {
            while (r >= w[i]->row + w[i]->n_out) i++;   /* the work row r belongs to */
            const float *lg = d->logits + (size_t)(r - a) * vocab;
            int j = r - w[i]->row;
            w[i]->draft[j] = dfl_argmax(lg, vocab);
            if (w[i]->logits)
                memcpy(w[i]->logits + (size_t)j * vocab, lg, sizeof(float) * vocab);
        }
    }
}

/* Context works first (a sequence has at most one work in a pass, so no
 * draft here reads rows another work of the pass adds). */
static void run_pass(dfl_drafter *d, dfl_dwork **w, int k) {
    dfl_dwork *ctx[DFL_MAX_PARALLEL], *blk[DFL_MAX_PARALLEL];
    int nc = 0, nb = 0;
    for (int i = 0; i < k; i++) {
        if (w[i]->B > 0) blk[nb++] = w[i];
        else ctx[nc++] = w[i];
    }
    if (nc) context_pass(d, ctx, nc);
    if (nb) draft_pass(d, blk, nb);
}

/* ---- calls: each sequence's work, batched with whatever others do at once ------ */

typedef struct dcall {
    dfl_side_call side;   /* first: the combiner hands these back */
    dfl_dwork *w;
} dcall;

static void side_pass(void *ctx, dfl_side_call **cs, int k) {
    dfl_dwork *w[DFL_MAX_PARALLEL];
    for (int i = 0; i < k; i++) w[i] = ((dcall *)cs[i])->w;
    run_pass(ctx, w, k);
}

/* Runs w through the target's combiner; charges its store its rows' share of the pass. */
static void submit(dfl_drafter *d, dfl_dwork *w) {
    dcall c = {.side = {.fn = side_pass, .ctx = d, .rows = w->B > 0 ? w->B : w->n}, .w = w};
    dfl_target_side_run(d->t, &c.side, d->max_rows);
    w->s->spent += dfl_side_charge(&c.side);
}

/* Rows that no later block's window reaches are never projected. */
static void set_skip(dfl_dwork *w) {
    int skip = w->s->window ? w->n - w->s->window : 0;
    w->skip = skip < 0 ? 0 : skip > w->n ? w->n : skip;
}

int dfl_drafter_add_context(dfl_drafter *d, dfl_dstore *s, const float *feat, int n,
                            dfl_error *err) {
    if (d->mtp)
        return dfl_fail(err, DFL_EARG, "the MTP head's context needs tokens: "
                        "dfl_mtp_add_context");
    if (n < 0 || s->len + n > s->cap - d->max_rows)
        return dfl_fail(err, DFL_ECTX, "drafter context full: %d + %d rows exceed %d", s->len,
                        n, s->cap - d->max_rows);
    /* Rows that no later block's window reaches are never projected. */
    int skip_to = s->window ? s->len + n - s->window : 0;
    for (int a = 0; a < n; a += d->max_rows) {
        int m = n - a < d->max_rows ? n - a : d->max_rows;
        int skip = skip_to - s->len;
        dfl_dwork w = {.s = s, .feat = feat + (size_t)a * d->fc.cols, .n = m,
                       .skip = skip < 0 ? 0 : skip > m ? m : skip};
        submit(d, &w);
    }
    return 0;
}

static int check_block(const dfl_drafter *d, const dfl_dstore *s, int32_t anchor, int B,
                       int n_out, dfl_error *err) {
    if (B < 2 || B > d->max_rows)
        return dfl_fail(err, DFL_EARG, "draft block %d outside 2..%d", B, d->max_rows);
    if (n_out < 1 || n_out > B - 1)
        return dfl_fail(err, DFL_EARG, "draft outputs %d outside 1..%d", n_out, B - 1);
    if (s->len + B > s->cap)
        return dfl_fail(err, DFL_ECTX, "drafter store full: block at %d + %d rows exceeds %d",
                        s->len, B, s->cap);
    if (anchor < 0 || anchor >= d->c.vocab)
        return dfl_fail(err, DFL_EARG, "anchor token %d outside the vocabulary", anchor);
    return 0;
}

int dfl_drafter_draft(dfl_drafter *d, dfl_dstore *s, int32_t anchor, int B, float *logits,
                      int32_t *draft, dfl_error *err) {
    return dfl_drafter_draft_n(d, s, anchor, B, B - 1, logits, draft, err);
}

int dfl_drafter_draft_n(dfl_drafter *d, dfl_dstore *s, int32_t anchor, int B, int n_out,
                        float *logits, int32_t *draft, dfl_error *err) {
    if (d->mtp) return dfl_mtp_draft(d, s, anchor, n_out, logits, draft, err);
    int rc = check_block(d, s, anchor, B, n_out, err);
    if (rc) return rc;
    dfl_dwork w = {.s = s, .anchor = anchor, .B = B, .n_out = n_out, .logits = logits,
                   .draft = draft};
    submit(d, &w);
    return 0;
}

int dfl_drafter_pass(dfl_drafter *d, dfl_dwork *w, int k, dfl_error *err) {
    dfl_dwork *ws[DFL_MAX_PARALLEL];
    int ctx_rows = 0, blk_rows = 0, rc = 0;
    if (k < 1 || k > DFL_MAX_PARALLEL)
        return dfl_fail(err, DFL_EARG, "drafter pass of %d works outside 1..%d", k,
                        DFL_MAX_PARALLEL);
    for (int i = 0; i < k && !rc; i++) {
        for (int j = 0; j < i; j++)
            if (w[j].s == w[i].s)
                return dfl_fail(err, DFL_EARG, "drafter pass: works %d and %d share a store", j, i);
        if (w[i].B > 0) {
            rc = check_block(d, w[i].s, w[i].anchor, w[i].B, w[i].n_out, err);
            blk_rows += w[i].B;
        } else if (w[i].n < 0 || w[i].s->len + w[i].n > w[i].s->cap - d->max_rows) {
            rc = dfl_fail(err, DFL_ECTX, "drafter pass: work %d's %d context rows do not fit", i,
                          w[i].n);
        } else {
            set_skip(&w[i]);
            ctx_rows += w[i].n;
        }
        ws[i] = &w[i];
    }
    if (rc) return rc;
    if (ctx_rows > d->max_rows || blk_rows > d->max_rows)
        return dfl_fail(err, DFL_EARG, "drafter pass of %d context and %d block rows: more than "
                        "%d", ctx_rows, blk_rows, d->max_rows);
    dfl_ticket_lock(&d->t->lock);
    run_pass(d, ws, k);
    dfl_ticket_unlock(&d->t->lock);
    return 0;
}
