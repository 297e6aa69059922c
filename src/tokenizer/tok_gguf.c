/* tok_gguf.c - vocabularies stored in GGUF metadata (tokenizer.ggml.*), as
 * llama.cpp writes them: "llama" (sentencepiece pieces, scores, token types,
 * <0xNN> byte pieces) and "gpt2" (byte-level BPE tokens and merges, with the
 * pre-tokenizer named in tokenizer.ggml.pre). A GGUF file needs nothing else. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

/* llama.cpp's token types */
enum { TT_NORMAL = 1, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE };

typedef struct gl {
    dfl_tokenizer *t;
    const gguf_file *g;
    dfl_error *err;
    const char *src;
} gl;

/* An optional token id: -1 when absent or 0xffffffff, an error when out of range. */
static int opt_id(gl *l, const char *key, int32_t *out) {
    uint32_t v;
    int rc = dfl_gguf_u32(l->g, key, &v, l->err);
    if (rc < 0) return rc;
    if (rc == 1 || v == UINT32_MAX) return 0;
    if (v >= (uint32_t)l->t->n_vocab)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: %s = %u, but the vocabulary has %d tokens",
                        l->src, key, v, l->t->n_vocab);
    *out = (int32_t)v;
    return 0;
}

static int opt_bool(gl *l, const char *key, int def) {
    int v = def;
    return dfl_gguf_bool(l->g, key, &v, l->err) < 0 ? -1 : v;
}

/* An optional array of n elements. */
static const gguf_kv *opt_arr(gl *l, const char *key, gguf_vtype type, int64_t n, int *rc) {
    *rc = 0;
    if (!dfl_gguf_find(l->g, key)) return NULL;
    const gguf_kv *kv = dfl_gguf_arr(l->g, key, type, l->err);
    if (!kv) *rc = DFL_EFORMAT;
    else if ((int64_t)kv->arr_n != n)
        *rc = dfl_fail(l->err, DFL_EFORMAT, "%s: %s has %llu entries, expected %lld (one per "
                       "token)", l->src, key, (unsigned long long)kv->arr_n, (long long)n);
    return *rc ? NULL : kv;
}

/* One isolated regex split, appended to the pre-tokenizer chain. */
static int add_pre_split(gl *l, const char *re) {
    tok_pre *p = &l->t->pre[l->t->n_pre++];
    memset(p, 0, sizeof *p);
    p->kind = PRE_SPLIT;
    p->behavior = SPLIT_ISOLATED;
    p->re = tok_regex(re, strlen(re), 0, "tokenizer.ggml.pre", l->err);
    return p->re ? 0 : DFL_EFORMAT;
}

/* The pre-tokenizer regex llama.cpp names in tokenizer.ggml.pre. */
static int set_pre(gl *l, const char *pre, size_t n) {
    dfl_tokenizer *t = l->t;
    const char *re = NULL;
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(n < 63 ? n : 63), pre);
    if (!n || !strcmp(name, "default") || !strcmp(name, "gpt2") || !strcmp(name, "gpt-2")) {
        re = tok_re_gpt2;
    } else if (!strcmp(name, "smollm")) {
        /* SmolLM's tokenizer.json: Digits(individual_digits) then ByteLevel's GPT-2 split */
        int rc = add_pre_split(l, "\\p{N}");
        if (rc) return rc;
        re = tok_re_gpt2;
    } else if (!strcmp(name, "llama-bpe") || !strcmp(name, "llama3") ||
               !strcmp(name, "llama-v3") || !strcmp(name, "smaug-bpe")) {
        re = tok_re_llama3;
        t->ignore_merges = 1;
    } else if (!strcmp(name, "qwen2") || !strcmp(name, "qwen35")) {
        re = name[4] == '3' ? tok_re_qwen35 : tok_re_qwen2;
        t->norm[t->n_norm++].kind = NORM_NFC; /* as Qwen's tokenizer.json */
    } else {
        return dfl_fail(l->err, DFL_EUNSUP, "%s: tokenizer.ggml.pre = \"%s\" is not supported "
                        "(known: default, gpt2, llama-bpe, llama3, smaug-bpe, qwen2, qwen35, "
                        "smollm)",
                        l->src, name);
    }
    return add_pre_split(l, re);
}

/* Token i's text, type and score into the tables. */
static int set_token(gl *l, int32_t i, gguf_str s, int type) {
    dfl_tokenizer *t = l->t;
    if (s.len > DFL_TOK_MAX_PIECE)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: tokenizer.ggml.tokens[%d] is %llu bytes (at "
                        "most %d)", l->src, i, (unsigned long long)s.len, DFL_TOK_MAX_PIECE);
    size_t bad = tok_utf8_check(s.s, s.len);
    if (bad < s.len)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: tokenizer.ggml.tokens[%d] is not valid UTF-8 "
                        "(byte %zu)", l->src, i, bad);
    if (type < 0 || type > TT_BYTE)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: tokenizer.ggml.token_type[%d] = %d (expected "
                        "0..6)", l->src, i, type);
    char buf[DFL_TOK_MAX_PIECE];
    int m = -1;
    int text_like = type == TT_CONTROL || type == TT_USER_DEFINED || type == TT_UNKNOWN;
    if (t->byte_level && !text_like) m = tok_bl_decode(s.s, s.len, buf);
    int64_t off = m >= 0 ? tok_pool_add(t, buf, (size_t)m) : tok_pool_add(t, s.s, s.len);
    if (off < 0) return dfl_fail(l->err, DFL_EFORMAT, "%s: vocabulary text too large", l->src);
    t->key_off[i] = (uint32_t)off;
    t->key_len[i] = m >= 0 ? (uint32_t)m : (uint32_t)s.len;
    t->attr[i] = type == TT_BYTE ? TA_BYTE : 0;
    if (text_like && s.len) {
        t->attr[i] |= TA_ADDED | (type != TT_USER_DEFINED ? TA_SPECIAL : 0);
        tok_added *a = &t->added[t->n_added++];
        *a = (tok_added){.id = i, .off = (uint32_t)off, .len = (uint32_t)s.len,
                         .special = type != TT_USER_DEFINED};
    }
    return 0;
}

static int load_merges(gl *l) {
    dfl_tokenizer *t = l->t;
    const gguf_kv *kv = dfl_gguf_arr(l->g, "tokenizer.ggml.merges", GGUF_T_STRING, l->err);
    if (!kv) return DFL_EFORMAT;
    if (kv->arr_n > (uint64_t)TOK_MAX_ID)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: %llu merges (at most %d)", l->src,
                        (unsigned long long)kv->arr_n, TOK_MAX_ID);
    tok_pairmap_init(&t->merges, (int)kv->arr_n);
    char a[DFL_TOK_MAX_PIECE], b[DFL_TOK_MAX_PIECE], ab[2 * DFL_TOK_MAX_PIECE];
    for (uint64_t r = 0; r < kv->arr_n; r++) {
        gguf_str s = kv->strs[r];
        const char *sp = s.len > 1 ? memchr(s.s + 1, ' ', s.len - 1) : NULL;
        size_t an = sp ? (size_t)(sp - s.s) : 0, bn = sp ? s.len - an - 1 : 0;
        int ra = -1, rb = -1;
        if (sp && an <= DFL_TOK_MAX_PIECE && bn <= DFL_TOK_MAX_PIECE) {
            ra = tok_bl_decode(s.s, an, a);
            rb = tok_bl_decode(sp + 1, bn, b);
        }
        int32_t ia = ra < 0 ? -1 : tok_strmap_get(t, a, (size_t)ra);
        int32_t ib = rb < 0 ? -1 : tok_strmap_get(t, b, (size_t)rb), ic = -1;
        if (ia >= 0 && ib >= 0) {
            memcpy(ab, a, (size_t)ra);
            memcpy(ab + ra, b, (size_t)rb);
            ic = tok_strmap_get(t, ab, (size_t)(ra + rb));
        }
        if (ic < 0)
            return dfl_fail(l->err, DFL_EFORMAT, "%s: tokenizer.ggml.merges[%llu] = \"%.*s\": "
                            "expected two byte-level tokens whose join is also a token", l->src,
                            (unsigned long long)r, (int)(s.len < 80 ? s.len : 80), s.s);
        tok_pairmap_put(&t->merges, ia, ib, (int32_t)r, ic);
    }
    return 0;
}

static int load(gl *l) {
    dfl_tokenizer *t = l->t;
    gguf_str model;
    int rc = dfl_gguf_str(l->g, "tokenizer.ggml.model", &model, l->err);
    if (rc < 0) return rc;
    if (rc == 1)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: tokenizer.ggml.model is missing (no vocabulary "
                        "in this GGUF file)", l->src);
    int spm = model.len == 5 && !memcmp(model.s, "llama", 5);
    int bpe = model.len == 4 && !memcmp(model.s, "gpt2", 4);
    if (!spm && !bpe)
        return dfl_fail(l->err, DFL_EUNSUP, "%s: tokenizer.ggml.model = \"%.*s\" is not supported "
                        "(llama, gpt2 are)", l->src, (int)(model.len < 32 ? model.len : 32),
                        model.s);
    const gguf_kv *toks = dfl_gguf_arr(l->g, "tokenizer.ggml.tokens", GGUF_T_STRING, l->err);
    if (!toks) return DFL_EFORMAT;
    if (toks->arr_n < 1 || toks->arr_n > (uint64_t)TOK_MAX_ID)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: tokenizer.ggml.tokens has %llu entries "
                        "(expected 1..%d)", l->src, (unsigned long long)toks->arr_n, TOK_MAX_ID);
    int n = (int)toks->arr_n;
    const gguf_kv *types = opt_arr(l, "tokenizer.ggml.token_type", GGUF_T_I32, n, &rc);
    if (rc) return rc;
    const gguf_kv *scores = opt_arr(l, "tokenizer.ggml.scores", GGUF_T_F32, n, &rc);
    if (rc) return rc;
    t->model = spm ? TOK_SPM : TOK_BPE;
    t->byte_level = bpe;
    if (bpe) {
        gguf_str pre = {"", 0};
        if ((rc = dfl_gguf_str(l->g, "tokenizer.ggml.pre", &pre, l->err)) < 0) return rc;
        if ((rc = set_pre(l, pre.s, pre.len))) return rc;
    }
    tok_alloc_ids(t, n);
    t->added = xcalloc(n, sizeof *t->added);
    if (spm) t->score = xcalloc(n, sizeof *t->score);
    for (int32_t i = 0; i < n; i++) {
        int type = types ? (int)dfl_gguf_arr_i64(types, (uint64_t)i) : TT_NORMAL;
        if ((rc = set_token(l, i, toks->strs[i], type))) return rc;
        if (spm) t->score[i] = scores ? dfl_gguf_arr_f32(scores, (uint64_t)i) : 0.0f;
    }
    tok_strmap_init(&t->vocab, n);
    for (int32_t i = 0; i < n; i++)
        if (t->key_len[i]) tok_strmap_put(t, i);
    if (bpe && (rc = load_merges(l))) return rc;
    if (spm) {
        tok_pairmap_init(&t->merges, 0);
        tok_set_rep_split(t, "\xe2\x96\x81");
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b, name[8];
        if (bpe) {
            t->byte_id[b] = tok_strmap_get(t, &c, 1);
        } else {
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_id[b] = tok_strmap_get(t, name, 6);
        }
    }
    tok_finish_added(t);
    return tok_build_pieces(t, 0, spm ? "\xe2\x96\x81" : NULL, l->err);
}

static int load_specials(gl *l) {
    dfl_tokenizer *t = l->t;
    int32_t eot = -1, eom = -1;
    int rc;
    if ((rc = opt_id(l, "tokenizer.ggml.bos_token_id", &t->bos_id)) ||
        (rc = opt_id(l, "tokenizer.ggml.eos_token_id", &t->eos_id)) ||
        (rc = opt_id(l, "tokenizer.ggml.unknown_token_id", &t->unk_id)) ||
        (rc = opt_id(l, "tokenizer.ggml.padding_token_id", &t->pad_id)) ||
        (rc = opt_id(l, "tokenizer.ggml.eot_token_id", &eot)) ||
        (rc = opt_id(l, "tokenizer.ggml.eom_token_id", &eom)))
        return rc;
    int spm = t->model == TOK_SPM;
    /* A gpt2 vocabulary's unknown id is a label only: llama.cpp's BPE (and Hugging Face's,
     * which converts it with no unk_token) drops bytes the vocabulary lacks (SmolLM2 has no
     * 0x04, 0x06, 0xf1, ...) instead of writing <unk> (there <|endoftext|>) into the text. */
    if (!spm) t->unk_id = -1;
    if ((t->add_bos = opt_bool(l, "tokenizer.ggml.add_bos_token", spm)) < 0 ||
        (t->add_eos = opt_bool(l, "tokenizer.ggml.add_eos_token", 0)) < 0 ||
        (t->add_space_prefix = opt_bool(l, "tokenizer.ggml.add_space_prefix", spm)) < 0)
        return DFL_EFORMAT;
    t->eos_add_id = t->eos_id;
    t->strip_leading_space = spm && t->add_space_prefix;
    tok_add_eog(t, eot);
    tok_add_eog(t, eom);
    tok_find_eog(t);
    gguf_str tmpl;
    if ((rc = dfl_gguf_str(l->g, "tokenizer.chat_template", &tmpl, l->err)) < 0) return rc;
    if (rc == 0) {
        size_t bad = tok_utf8_check(tmpl.s, tmpl.len);
        if (bad < tmpl.len)
            return dfl_fail(l->err, DFL_EFORMAT, "%s: tokenizer.chat_template is not valid UTF-8 "
                            "(byte %zu)", l->src, bad);
        t->chat_template = strndup(tmpl.s, tmpl.len);
    }
    return 0;
}

int dfl_tok_load_gguf(const gguf_file *g, dfl_tokenizer **out, dfl_error *err) {
    if (!g || !out) return dfl_fail(err, DFL_EARG, "dfl_tok_load_gguf: no file");
    *out = NULL;
    const char *src = g->tensors.source ? g->tensors.source : "gguf";
    gl l = {.t = tok_new(src), .g = g, .err = err, .src = src};
    l.src = l.t->source;
    int rc = load(&l);
    if (!rc) rc = load_specials(&l);
    if (rc) {
        dfl_tok_free(l.t);
        return rc;
    }
    *out = l.t;
    return 0;
}
