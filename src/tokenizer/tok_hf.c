/* tok_hf.c - Hugging Face tokenizer.json (+ tokenizer_config.json,
 * generation_config.json): BPE models with ByteLevel or Metaspace
 * pre-tokenizers, the normalizers and decoders such files use.
 *
 * The files are untrusted: every id is range-checked, every string is checked
 * to be UTF-8, and anything we would tokenize differently from Hugging Face is
 * refused by name rather than guessed. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/tok_impl.h"

#define MAX_JSON_BYTES ((size_t)256 << 20)

/* ---- regexes ------------------------------------------------------------- */

const char *const tok_re_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const tok_re_llama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char *const tok_re_qwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5's: letters run on with their combining marks (\p{M}) */
const char *const tok_re_qwen35 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}"
    "\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

pcre2_code *tok_regex(const char *pattern, size_t len, int literal, const char *what,
                      dfl_error *err) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opt = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opt, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        dfl_fail(err, DFL_EFORMAT, "%s: regex does not compile at offset %zu: %s", what,
                 (size_t)eo, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: the interpreter is the fallback */
    return re;
}

/* ---- small JSON helpers ----------------------------------------------------- */

typedef struct ld {
    dfl_tokenizer *t;
    const char *src;   /* file name for messages */
    dfl_error *err;
    int bl_decode;     /* decoder maps GPT-2 byte-level chars back to bytes */
    char rep[8];       /* metaspace replacement the decoder turns into ' ' */
    char space_rep[8]; /* what the normalizer or pre-tokenizer turns ' ' into */
} ld;

static const cJSON *item(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A string that must be valid UTF-8 (NULL and an error otherwise). */
static const char *utf8_str(ld *l, const cJSON *v, const char *what) {
    if (!cJSON_IsString(v) || !v->valuestring) {
        dfl_fail(l->err, DFL_EFORMAT, "%s: %s is not a string", l->src, what);
        return NULL;
    }
    size_t n = strlen(v->valuestring), bad = tok_utf8_check(v->valuestring, n);
    if (bad < n) {
        dfl_fail(l->err, DFL_EFORMAT, "%s: %s is not valid UTF-8 (byte %zu)", l->src, what, bad);
        return NULL;
    }
    return v->valuestring;
}

/* A bool field (def when absent); -1 with an error when not a bool. */
static int get_bool(ld *l, const cJSON *o, const char *key, int def) {
    int v = def;
    return dfl_json_bool(o, key, &v, l->src, l->err) < 0 ? -1 : v;
}

/* A special-token entry of tokenizer_config.json: "text" or {"content": "text"}. */
static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = item(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

/* ---- normalizer --------------------------------------------------------------- */

static int add_norm(ld *l, int kind, const char *a, const char *b) {
    dfl_tokenizer *t = l->t;
    if (t->n_norm == TOK_MAX_NORM)
        return dfl_fail(l->err, DFL_EUNSUP, "%s: more than %d normalizers", l->src, TOK_MAX_NORM);
    tok_norm *n = &t->norm[t->n_norm++];
    n->kind = kind;
    n->a = a ? strdup(a) : NULL;
    n->b = b ? strdup(b) : NULL;
    return 0;
}

static int parse_normalizer(ld *l, const cJSON *n) {
    if (!n) return 0;
    const char *type = dfl_json_str(n, "type");
    if (!type) return dfl_fail(l->err, DFL_EFORMAT, "%s: normalizer has no \"type\"", l->src);
    if (!strcmp(type, "Sequence")) {
        const cJSON *v = item(n, "normalizers"), *e;
        if (!cJSON_IsArray(v))
            return dfl_fail(l->err, DFL_EFORMAT, "%s: normalizer Sequence has no \"normalizers\" "
                            "array", l->src);
        cJSON_ArrayForEach(e, v) {
            int rc = parse_normalizer(l, e);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "NFC")) return add_norm(l, NORM_NFC, NULL, NULL);
    if (!strcmp(type, "NFKC")) return add_norm(l, NORM_NFKC, NULL, NULL);
    if (!strcmp(type, "Prepend")) {
        const char *p = utf8_str(l, item(n, "prepend"), "normalizer Prepend.prepend");
        return p ? add_norm(l, NORM_PREPEND, p, NULL) : DFL_EFORMAT;
    }
    if (!strcmp(type, "Replace")) {
        const cJSON *pat = item(n, "pattern");
        if (item(pat, "Regex"))
            return dfl_fail(l->err, DFL_EUNSUP, "%s: normalizer Replace with a Regex pattern is "
                            "not supported (only String)", l->src);
        const char *a = utf8_str(l, item(pat, "String"), "normalizer Replace.pattern.String");
        const char *b = a ? utf8_str(l, item(n, "content"), "normalizer Replace.content") : NULL;
        if (b && !strcmp(a, " ") && strlen(b) < sizeof l->space_rep) strcpy(l->space_rep, b);
        return b ? add_norm(l, NORM_REPLACE, a, b) : DFL_EFORMAT;
    }
    return dfl_fail(l->err, DFL_EUNSUP, "%s: normalizer type \"%s\" is not supported (NFC, NFKC, "
                    "Prepend, Replace, Sequence are)", l->src, type);
}

/* ---- pre-tokenizer ------------------------------------------------------------- */

static tok_pre *add_pre(ld *l, int kind) {
    dfl_tokenizer *t = l->t;
    if (t->n_pre == TOK_MAX_PRE) {
        dfl_fail(l->err, DFL_EUNSUP, "%s: more than %d pre-tokenizer steps", l->src, TOK_MAX_PRE);
        return NULL;
    }
    tok_pre *p = &t->pre[t->n_pre++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    return p;
}

static int add_split(ld *l, const char *pat, size_t len, int literal, int behavior, int invert) {
    if (l->t->byte_level)
        return dfl_fail(l->err, DFL_EUNSUP, "%s: a Split after ByteLevel is not supported",
                        l->src);
    tok_pre *p = add_pre(l, PRE_SPLIT);
    if (!p) return DFL_EUNSUP;
    char what[512];
    snprintf(what, sizeof what, "%s: pre_tokenizer Split pattern", l->src);
    p->re = tok_regex(pat, len, literal, what, l->err);
    p->behavior = behavior;
    p->invert = invert;
    return p->re ? 0 : DFL_EFORMAT;
}

static int parse_behavior(ld *l, const char *b) {
    static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    for (int i = 0; b && i < 5; i++)
        if (!strcmp(b, names[i])) return i;
    return dfl_fail(l->err, DFL_EUNSUP, "%s: Split behavior \"%s\" is not supported", l->src,
                    b ? b : "(missing)");
}

static int parse_metaspace(ld *l, const cJSON *p) {
    const cJSON *r = item(p, "replacement");
    const char *rep = r ? utf8_str(l, r, "pre_tokenizer Metaspace.replacement") : "\xe2\x96\x81";
    if (!rep) return DFL_EFORMAT;
    if (!*rep || strlen(rep) >= sizeof l->t->pre[0].rep)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: Metaspace replacement must be one character",
                        l->src);
    int prepend = 2;
    const char *scheme = dfl_json_str(p, "prepend_scheme");
    if (scheme) {
        if (!strcmp(scheme, "always")) prepend = 2;
        else if (!strcmp(scheme, "first")) prepend = 1;
        else if (!strcmp(scheme, "never")) prepend = 0;
        else return dfl_fail(l->err, DFL_EFORMAT, "%s: Metaspace prepend_scheme \"%s\" (expected "
                             "always, first or never)", l->src, scheme);
    } else {
        int aps = get_bool(l, p, "add_prefix_space", 1);
        if (aps < 0) return DFL_EFORMAT;
        prepend = aps ? 2 : 0;
    }
    int split = get_bool(l, p, "split", 1);
    if (split < 0) return DFL_EFORMAT;
    tok_pre *m = add_pre(l, PRE_METASPACE);
    if (!m) return DFL_EUNSUP;
    strcpy(m->rep, rep);
    strcpy(l->space_rep, rep);
    m->prepend = prepend;
    return split ? add_split(l, rep, strlen(rep), 1, SPLIT_MERGED_NEXT, 0) : 0;
}

static int parse_pre(ld *l, const cJSON *p) {
    if (!p) return 0;
    const char *type = dfl_json_str(p, "type");
    if (!type) return dfl_fail(l->err, DFL_EFORMAT, "%s: pre_tokenizer has no \"type\"", l->src);
    if (!strcmp(type, "Sequence")) {
        const cJSON *v = item(p, "pretokenizers"), *e;
        if (!cJSON_IsArray(v))
            return dfl_fail(l->err, DFL_EFORMAT, "%s: pre_tokenizer Sequence has no "
                            "\"pretokenizers\" array", l->src);
        cJSON_ArrayForEach(e, v) {
            int rc = parse_pre(l, e);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = item(p, "pattern"), *re = item(pat, "Regex"), *lit = item(pat, "String");
        const char *s = utf8_str(l, re ? re : lit, "pre_tokenizer Split.pattern");
        if (!s) return DFL_EFORMAT;
        int b = parse_behavior(l, dfl_json_str(p, "behavior"));
        int inv = b < 0 ? -1 : get_bool(l, p, "invert", 0);
        if (b < 0 || inv < 0) return b < 0 ? b : DFL_EFORMAT;
        return add_split(l, s, strlen(s), !re, b, inv);
    }
    if (!strcmp(type, "ByteLevel")) {
        int aps = get_bool(l, p, "add_prefix_space", 1);
        int use_re = get_bool(l, p, "use_regex", 1);
        if (aps < 0 || use_re < 0) return DFL_EFORMAT;
        if (l->t->byte_level)
            return dfl_fail(l->err, DFL_EUNSUP, "%s: two ByteLevel pre-tokenizers", l->src);
        if (aps && !add_pre(l, PRE_BYTELEVEL_PREFIX)) return DFL_EUNSUP;
        if (use_re) {
            int rc = add_split(l, tok_re_gpt2, strlen(tok_re_gpt2), 0, SPLIT_ISOLATED, 0);
            if (rc) return rc;
        }
        l->t->byte_level = 1;
        return 0;
    }
    if (!strcmp(type, "Metaspace")) return parse_metaspace(l, p);
    if (!strcmp(type, "Digits")) {
        int each = get_bool(l, p, "individual_digits", 0);
        if (each < 0) return DFL_EFORMAT;
        const char *re = each ? "\\p{N}" : "\\p{N}+";
        return add_split(l, re, strlen(re), 0, SPLIT_ISOLATED, 0);
    }
    return dfl_fail(l->err, DFL_EUNSUP, "%s: pre_tokenizer type \"%s\" is not supported (Split, "
                    "ByteLevel, Metaspace, Digits, Sequence are)", l->src, type);
}

/* ---- decoder ---------------------------------------------------------------------- */

static int parse_decoder(ld *l, const cJSON *d) {
    if (!d) return 0;
    const char *type = dfl_json_str(d, "type");
    if (!type) return dfl_fail(l->err, DFL_EFORMAT, "%s: decoder has no \"type\"", l->src);
    if (!strcmp(type, "Sequence")) {
        const cJSON *v = item(d, "decoders"), *e;
        if (!cJSON_IsArray(v))
            return dfl_fail(l->err, DFL_EFORMAT, "%s: decoder Sequence has no \"decoders\" array",
                            l->src);
        cJSON_ArrayForEach(e, v) {
            int rc = parse_decoder(l, e);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        l->bl_decode = 1;
        return 0;
    }
    if (!strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")) return 0; /* built in */
    if (!strcmp(type, "Metaspace")) {
        const cJSON *r = item(d, "replacement");
        const char *rep = r ? utf8_str(l, r, "decoder Metaspace.replacement") : "\xe2\x96\x81";
        if (!rep || strlen(rep) >= sizeof l->rep)
            return dfl_fail(l->err, DFL_EFORMAT, "%s: decoder Metaspace.replacement", l->src);
        strcpy(l->rep, rep);
        const char *scheme = dfl_json_str(d, "prepend_scheme");
        int aps = get_bool(l, d, "add_prefix_space", 1);
        if (aps < 0) return DFL_EFORMAT;
        l->t->strip_leading_space = scheme ? strcmp(scheme, "never") != 0 : aps;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const char *a = utf8_str(l, item(item(d, "pattern"), "String"),
                                 "decoder Replace.pattern.String");
        const char *b = a ? utf8_str(l, item(d, "content"), "decoder Replace.content") : NULL;
        if (!b) return DFL_EFORMAT;
        if (strcmp(b, " ") || strlen(a) >= sizeof l->rep)
            return dfl_fail(l->err, DFL_EUNSUP, "%s: decoder Replace other than a character -> "
                            "\" \" is not supported", l->src);
        strcpy(l->rep, a);
        return 0;
    }
    if (!strcmp(type, "Strip")) {
        int64_t start = 0, stop = 0;
        const char *c = dfl_json_str(d, "content");
        if (dfl_json_int(d, "start", 0, 1 << 20, &start, l->src, l->err) < 0 ||
            dfl_json_int(d, "stop", 0, 1 << 20, &stop, l->src, l->err) < 0)
            return DFL_EFORMAT;
        if (!c || strcmp(c, " ") || start > 1 || stop)
            return dfl_fail(l->err, DFL_EUNSUP, "%s: decoder Strip other than one leading space "
                            "is not supported", l->src);
        l->t->strip_leading_space = start == 1;
        return 0;
    }
    return dfl_fail(l->err, DFL_EUNSUP, "%s: decoder type \"%s\" is not supported (ByteLevel, "
                    "Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence are)", l->src, type);
}

/* ---- model: vocab and merges -------------------------------------------------------- */

/* The lookup key of a vocabulary string: raw bytes for byte-level BPE. */
static int set_key(ld *l, int32_t id, const char *s) {
    dfl_tokenizer *t = l->t;
    size_t n = strlen(s);
    if (n > DFL_TOK_MAX_PIECE)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: token %d is %zu bytes (at most %d)", l->src,
                        id, n, DFL_TOK_MAX_PIECE);
    char buf[DFL_TOK_MAX_PIECE];
    int m = t->byte_level ? tok_bl_decode(s, n, buf) : -1;
    int64_t off = m >= 0 ? tok_pool_add(t, buf, (size_t)m) : tok_pool_add(t, s, n);
    if (off < 0) return dfl_fail(l->err, DFL_EFORMAT, "%s: vocabulary text too large", l->src);
    t->key_off[id] = (uint32_t)off;
    t->key_len[id] = m >= 0 ? (uint32_t)m : (uint32_t)n;
    return 0;
}

/* Looks a merge half up by its vocabulary spelling. */
static int32_t find_piece(ld *l, const char *s, size_t n) {
    char buf[DFL_TOK_MAX_PIECE];
    if (n > DFL_TOK_MAX_PIECE) return -1;
    if (l->t->byte_level) {
        int m = tok_bl_decode(s, n, buf);
        if (m >= 0) return tok_strmap_get(l->t, buf, (size_t)m);
    }
    return tok_strmap_get(l->t, s, n);
}

/* The highest id among vocab and added tokens, range-checked. */
static int count_ids(ld *l, const cJSON *vocab, const cJSON *added, int *n_ids) {
    int64_t max = -1, n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(d >= 0 && d < TOK_MAX_ID && d == (double)(int64_t)d))
            return dfl_fail(l->err, DFL_EFORMAT, "%s: model.vocab[\"%.64s\"]: id is not an "
                            "integer in 0..%d", l->src, e->string ? e->string : "", TOK_MAX_ID - 1);
        if ((int64_t)d > max) max = (int64_t)d;
        n++;
    }
    cJSON_ArrayForEach(e, added) {
        int64_t id = -1;
        int rc = dfl_json_int(e, "id", 0, TOK_MAX_ID - 1, &id, l->src, l->err);
        if (rc < 0) return rc;
        if (rc) return dfl_fail(l->err, DFL_EFORMAT, "%s: added_tokens entry without \"id\"",
                                l->src);
        if (id > max) max = id;
        n++;
    }
    /* ids index arrays: a few unused ids are fine, a huge gap is a broken file */
    if (max >= 4 * n + 1024)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: id %lld is far above the %lld tokens defined",
                        l->src, (long long)max, (long long)n);
    *n_ids = (int)(max + 1);
    return 0;
}

static int load_vocab(ld *l, const cJSON *vocab) {
    dfl_tokenizer *t = l->t;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = (int32_t)e->valuedouble;
        if (!(t->attr[id] & TA_UNUSED))
            return dfl_fail(l->err, DFL_EFORMAT, "%s: model.vocab: id %d appears twice", l->src,
                            id);
        size_t n = e->string ? strlen(e->string) : 0, bad = tok_utf8_check(e->string, n);
        if (bad < n)
            return dfl_fail(l->err, DFL_EFORMAT, "%s: model.vocab: token %d is not valid UTF-8 "
                            "(byte %zu)", l->src, id, bad);
        int rc = set_key(l, id, e->string ? e->string : "");
        if (rc) return rc;
        t->attr[id] = 0;
    }
    tok_strmap_init(&t->vocab, t->n_vocab);
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (!(t->attr[id] & TA_UNUSED) && t->key_len[id]) tok_strmap_put(t, id);
    return 0;
}

/* One merge: "a b" or ["a", "b"]. */
static int merge_halves(ld *l, const cJSON *m, int rank, const char **a, size_t *an,
                        const char **b, size_t *bn) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return dfl_fail(l->err, DFL_EFORMAT, "%s: model.merges[%d] = \"%.64s\" (expected "
                            "two tokens separated by one space)", l->src, rank, s);
        *a = s;
        *an = (size_t)(sp - s);
        *b = sp + 1;
        *bn = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *an = strlen(*a);
        *b = m->child->next->valuestring;
        *bn = strlen(*b);
        return 0;
    }
    return dfl_fail(l->err, DFL_EFORMAT, "%s: model.merges[%d] is neither \"a b\" nor [\"a\", "
                    "\"b\"]", l->src, rank);
}

static int load_merges(ld *l, const cJSON *merges) {
    dfl_tokenizer *t = l->t;
    int n = merges ? cJSON_GetArraySize(merges) : 0, rank = 0;
    tok_pairmap_init(&t->merges, n);
    char *both = xmalloc(2 * DFL_TOK_MAX_PIECE + 1);
    const cJSON *m;
    int rc = 0;
    cJSON_ArrayForEach(m, merges) {
        const char *a = "", *b = "";
        size_t an = 0, bn = 0;
        if ((rc = merge_halves(l, m, rank, &a, &an, &b, &bn))) break;
        int32_t ia = find_piece(l, a, an), ib = find_piece(l, b, bn), ic = -1;
        if (ia >= 0 && ib >= 0 && an + bn <= 2 * DFL_TOK_MAX_PIECE) {
            memcpy(both, a, an);
            memcpy(both + an, b, bn);
            ic = find_piece(l, both, an + bn);
        }
        if (ia < 0 || ib < 0 || ic < 0) {
            rc = dfl_fail(l->err, DFL_EFORMAT, "%s: model.merges[%d]: \"%.*s\" is not in the "
                          "vocabulary", l->src, rank, ia < 0 ? (int)an : ib < 0 ? (int)bn :
                          (int)(an + bn), ia < 0 ? a : ib < 0 ? b : both);
            break;
        }
        tok_pairmap_put(&t->merges, ia, ib, rank, ic);
        rank++;
    }
    free(both);
    return rc;
}

static int parse_model(ld *l, const cJSON *model, const cJSON *added) {
    dfl_tokenizer *t = l->t;
    if (!cJSON_IsObject(model))
        return dfl_fail(l->err, DFL_EFORMAT, "%s: \"model\" is missing", l->src);
    const char *type = dfl_json_str(model, "type");
    const cJSON *vocab = item(model, "vocab"), *merges = item(model, "merges");
    if (!type && !merges)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: model has no \"type\"", l->src);
    if (type && strcmp(type, "BPE"))
        return dfl_fail(l->err, DFL_EUNSUP, "%s: model type \"%s\" is not supported (only BPE)",
                        l->src, type);
    if (!cJSON_IsObject(vocab))
        return dfl_fail(l->err, DFL_EFORMAT, "%s: model.vocab is missing or not an object",
                        l->src);
    if (merges && !cJSON_IsArray(merges))
        return dfl_fail(l->err, DFL_EFORMAT, "%s: model.merges is not an array", l->src);
    if (added && !cJSON_IsArray(added))
        return dfl_fail(l->err, DFL_EFORMAT, "%s: added_tokens is not an array", l->src);
    const char *csp = dfl_json_str(model, "continuing_subword_prefix");
    const char *eow = dfl_json_str(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow))
        return dfl_fail(l->err, DFL_EUNSUP, "%s: BPE with continuing_subword_prefix or "
                        "end_of_word_suffix is not supported", l->src);
    t->model = TOK_BPE;
    if ((t->byte_fallback = get_bool(l, model, "byte_fallback", 0)) < 0 ||
        (t->ignore_merges = get_bool(l, model, "ignore_merges", 0)) < 0 ||
        (t->fuse_unk = get_bool(l, model, "fuse_unk", 0)) < 0)
        return DFL_EFORMAT;
    int n_ids = 0, rc;
    if ((rc = count_ids(l, vocab, added, &n_ids))) return rc;
    tok_alloc_ids(t, n_ids);
    if ((rc = load_vocab(l, vocab)) || (rc = load_merges(l, merges))) return rc;
    const char *unk = dfl_json_str(model, "unk_token");
    if (unk && (t->unk_id = tok_strmap_get(t, unk, strlen(unk))) < 0)
        return dfl_fail(l->err, DFL_EFORMAT, "%s: model.unk_token \"%.64s\" is not in the "
                        "vocabulary", l->src, unk);
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) {
            char c = (char)b;
            t->byte_id[b] = tok_strmap_get(t, &c, 1);
        } else if (t->byte_fallback) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            int32_t id = tok_strmap_get(t, name, 6);
            t->byte_id[b] = id;
            if (id >= 0) t->attr[id] |= TA_BYTE;
        }
    }
    return 0;
}

/* ---- added tokens ------------------------------------------------------------------ */

static int parse_added(ld *l, const cJSON *added) {
    dfl_tokenizer *t = l->t;
    int n = added ? cJSON_GetArraySize(added) : 0, k = 0;
    t->added = xcalloc(n ? n : 1, sizeof *t->added);
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        int64_t id;
        dfl_json_int(e, "id", 0, t->n_vocab - 1, &id, l->src, l->err); /* checked in count_ids */
        const char *s = utf8_str(l, item(e, "content"), "added_tokens[].content");
        if (!s) return DFL_EFORMAT;
        size_t len = strlen(s);
        if (!len || len > DFL_TOK_MAX_PIECE)
            return dfl_fail(l->err, DFL_EFORMAT, "%s: added token %lld has %zu bytes (expected "
                            "1..%d)", l->src, (long long)id, len, DFL_TOK_MAX_PIECE);
        tok_added *a = &t->added[k];
        a->id = (int32_t)id;
        /* as Hugging Face: a token is normalized unless special, when the file does not say */
        int f[5];
        static const char *const keys[5] = {"special", "lstrip", "rstrip", "single_word",
                                            "normalized"};
        for (int i = 0; i < 5; i++)
            if ((f[i] = get_bool(l, e, keys[i], i == 4 ? !f[0] : 0)) < 0) return DFL_EFORMAT;
        a->special = f[0];
        a->lstrip = f[1];
        a->rstrip = f[2];
        a->single_word = f[3];
        a->normalized = f[4];
        for (int i = 0; i < k; i++)
            if (t->added[i].id == a->id)
                return dfl_fail(l->err, DFL_EFORMAT, "%s: added token id %d appears twice",
                                l->src, a->id);
        /* the id's text is the content, whatever the vocab held under that id */
        int64_t off = tok_pool_add(t, s, len);
        if (off < 0) return dfl_fail(l->err, DFL_EFORMAT, "%s: added tokens too large", l->src);
        t->key_off[a->id] = (uint32_t)off;
        t->key_len[a->id] = (uint32_t)len;
        t->attr[a->id] = TA_ADDED | (a->special ? TA_SPECIAL : 0);
        /* normalized tokens are matched against normalized text, in their normalized form */
        size_t m;
        char *norm = a->normalized ? tok_normalize(t, s, len, &m) : NULL;
        if (norm) {
            off = m ? tok_pool_add(t, norm, m) : -1;
            free(norm);
            if (off < 0) { /* normalizes to nothing: can never match */
                a->normalized = 0;
                continue;
            }
            a->len = (uint32_t)m;
        } else {
            a->len = (uint32_t)len;
        }
        a->off = (uint32_t)off;
        k++;
    }
    t->n_added = k;
    tok_finish_added(t);
    return 0;
}

/* ---- special ids: post_processor, tokenizer_config.json ------------------------------ */

/* TemplateProcessing "single": special tokens before $A are BOS, after are EOS. */
static int parse_post(ld *l, const cJSON *p) {
    dfl_tokenizer *t = l->t;
    const char *type = dfl_json_str(p, "type");
    if (!type) return 0;
    if (!strcmp(type, "Sequence")) {
        const cJSON *e;
        int found = 0;
        cJSON_ArrayForEach(e, item(p, "processors")) {
            int rc = parse_post(l, e);
            if (rc < 0) return rc;
            found |= rc;
        }
        return found;
    }
    if (strcmp(type, "TemplateProcessing")) return 0; /* ByteLevel etc. add nothing */
    const cJSON *single = item(p, "single"), *sp = item(p, "special_tokens"), *e;
    int seen_seq = 0;
    cJSON_ArrayForEach(e, single) {
        if (item(e, "Sequence")) {
            seen_seq = 1;
            continue;
        }
        const char *name = dfl_json_str(item(e, "SpecialToken"), "id");
        const cJSON *ids = item(item(sp, name ? name : ""), "ids");
        int64_t id = cJSON_IsArray(ids) && cJSON_IsNumber(ids->child) ? (int64_t)ids->child->valuedouble : -1;
        if (!name || id < 0 || id >= t->n_vocab)
            return dfl_fail(l->err, DFL_EFORMAT, "%s: post_processor: special token \"%.64s\" "
                            "has no id in 0..%d", l->src, name ? name : "?", t->n_vocab - 1);
        if (!seen_seq) {
            t->add_bos = 1;
            t->bos_id = (int32_t)id;
        } else {
            t->add_eos = 1;
            t->eos_add_id = (int32_t)id;
        }
    }
    return 1; /* a template decides BOS/EOS */
}

static int32_t config_token(ld *l, const cJSON *cfg, const char *key) {
    const char *s = token_text(item(cfg, key));
    return s ? tok_find_text(l->t, s) : -1;
}

static int parse_config(ld *l, const cJSON *cfg, int have_template) {
    dfl_tokenizer *t = l->t;
    int32_t bos = config_token(l, cfg, "bos_token"), eos = config_token(l, cfg, "eos_token");
    int32_t pad = config_token(l, cfg, "pad_token");
    if (bos >= 0 && t->bos_id < 0) t->bos_id = bos;
    if (eos >= 0) t->eos_id = eos;
    if (pad >= 0) t->pad_id = pad;
    if (!have_template) { /* no TemplateProcessing: the config's flags decide */
        int bos_flag = 0, eos_flag = 0;
        if (dfl_json_bool(cfg, "add_bos_token", &bos_flag, "tokenizer_config.json", l->err) < 0 ||
            dfl_json_bool(cfg, "add_eos_token", &eos_flag, "tokenizer_config.json", l->err) < 0)
            return DFL_EFORMAT;
        t->add_bos = bos_flag;
        t->add_eos = eos_flag;
        t->eos_add_id = t->eos_id;
    }
    const cJSON *ct = item(cfg, "chat_template"), *e;
    const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
    const cJSON *list = cJSON_IsArray(ct) ? ct : NULL;
    const char *tool = NULL;
    cJSON_ArrayForEach(e, list) { /* [{name, template}]: "default", and "tool_use" for tools */
        const char *name = dfl_json_str(e, "name"), *text = dfl_json_str(e, "template");
        if (text && (!tmpl || (name && !strcmp(name, "default")))) tmpl = text;
        if (text && name && !strcmp(name, "tool_use")) tool = text;
    }
    if (tool && tok_utf8_check(tool, strlen(tool)) == strlen(tool) && !(t->chat_template_tool = strdup(tool)))
        return dfl_fail(l->err, DFL_ENOMEM, "tokenizer_config.json: out of memory");
    if (tmpl) {
        size_t n = strlen(tmpl), bad = tok_utf8_check(tmpl, n);
        if (bad < n)
            return dfl_fail(l->err, DFL_EFORMAT, "tokenizer_config.json: chat_template is not "
                            "valid UTF-8 (byte %zu)", bad);
        t->chat_template = strdup(tmpl);
    }
    return 0;
}

/* generation_config.json's eos_token_id (a number or a list) are stop tokens too. */
static void parse_generation(ld *l, const cJSON *g) {
    const cJSON *v = item(g, "eos_token_id"), *e;
    if (cJSON_IsNumber(v)) tok_add_eog(l->t, (int32_t)v->valuedouble);
    const cJSON *list = cJSON_IsArray(v) ? v : NULL;
    cJSON_ArrayForEach(e, list)
        if (cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble < TOK_MAX_ID)
            tok_add_eog(l->t, (int32_t)e->valuedouble);
}

/* ---- entry points --------------------------------------------------------------------- */

static int load(const char *json, size_t len, const char *cfg_json, size_t cfg_len,
                const char *gen_json, size_t gen_len, const char *src, dfl_tokenizer **out,
                dfl_error *err) {
    *out = NULL;
    cJSON *j = dfl_json_parse(json, len, src, err), *cfg = NULL, *gen = NULL;
    if (!j) return err ? err->code : DFL_EFORMAT;
    if (cfg_json && !(cfg = dfl_json_parse(cfg_json, cfg_len, "tokenizer_config.json", err))) {
        cJSON_Delete(j);
        return err ? err->code : DFL_EFORMAT;
    }
    if (gen_json) gen = dfl_json_parse(gen_json, gen_len, "generation_config.json", NULL);
    ld l = {.t = tok_new(src), .src = src, .err = err};
    const cJSON *added = item(j, "added_tokens");
    int rc = 0, tmpl = 0;
    if (!cJSON_IsObject(j)) rc = dfl_fail(err, DFL_EFORMAT, "%s: not a JSON object", src);
    if (!rc) rc = parse_normalizer(&l, item(j, "normalizer"));
    if (!rc) rc = parse_pre(&l, item(j, "pre_tokenizer"));
    if (!rc) rc = parse_decoder(&l, item(j, "decoder"));
    if (!rc) rc = parse_model(&l, item(j, "model"), added);
    if (!rc && l.space_rep[0]) tok_set_rep_split(l.t, l.space_rep);
    if (!rc) rc = parse_added(&l, added);
    if (!rc) rc = tok_build_pieces(l.t, l.bl_decode, l.rep[0] ? l.rep : NULL, err);
    if (!rc && (tmpl = parse_post(&l, item(j, "post_processor"))) < 0) rc = tmpl;
    if (!rc && cfg) rc = parse_config(&l, cfg, tmpl);
    if (!rc) {
        parse_generation(&l, gen);
        tok_find_eog(l.t);
    }
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    if (rc) {
        dfl_tok_free(l.t);
        return rc;
    }
    *out = l.t;
    return 0;
}

int dfl_tok_load_json(const char *json, size_t len, const char *config_json, size_t config_len,
                      dfl_tokenizer **out, dfl_error *err) {
    if (!json || !out) return dfl_fail(err, DFL_EARG, "dfl_tok_load_json: no input");
    return load(json, len, config_json, config_len, NULL, 0, "tokenizer.json", out, err);
}

/* Reads dir/name when it exists; *buf NULL when absent. */
static int read_opt(const char *dir, const char *name, char **buf, size_t *len, dfl_error *err) {
    char path[4096];
    struct stat st;
    *buf = NULL;
    *len = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return dfl_fail(err, DFL_EARG, "%s: path too long", dir);
    if (stat(path, &st) != 0) return 0;
    *buf = dfl_read_file(path, MAX_JSON_BYTES, len, err);
    return *buf ? 0 : (err ? err->code : DFL_EIO);
}

int dfl_tok_load_hf(const char *dir, dfl_tokenizer **out, dfl_error *err) {
    char path[4096], *json = NULL, *cfg = NULL, *gen = NULL;
    size_t len = 0, cfg_len = 0, gen_len = 0;
    if (!dir || !out) return dfl_fail(err, DFL_EARG, "dfl_tok_load_hf: no folder");
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= sizeof path)
        return dfl_fail(err, DFL_EARG, "%s: path too long", dir);
    json = dfl_read_file(path, MAX_JSON_BYTES, &len, err);
    if (!json) return err ? err->code : DFL_EIO;
    int rc = read_opt(dir, "tokenizer_config.json", &cfg, &cfg_len, err);
    if (!rc) rc = read_opt(dir, "generation_config.json", &gen, &gen_len, err);
    if (!rc) rc = load(json, len, cfg, cfg_len, gen, gen_len, path, out, err);
    free(json);
    free(cfg);
    free(gen);
    return rc;
}
