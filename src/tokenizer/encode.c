/* encode.c - text to ids: added tokens are cut out first, the stretches
 * between them are normalized, split by the pre-tokenizers and handed word
 * by word to the model. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

typedef struct enc {
    const dfl_tokenizer *t;
    tok_ids out;
    tok_cache *cache;
    pcre2_match_data *md;
    int parse_special;
    int rc;          /* first error */
    dfl_error *err;
} enc;

/* ---- added tokens ------------------------------------------------------- */

static int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_word(unsigned char c) {
    return c == '_' || c >= 0x80 || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* Finds the first added token (of this pass: raw or normalized text) at or
 * after from: leftmost, then longest, as Hugging Face's matcher. On a match
 * [*a, *b) covers the token plus the spaces its lstrip/rstrip flags absorb. */
static int next_added(const enc *c, const char *s, size_t n, size_t from, int normalized,
                      size_t *a, size_t *b, int32_t *id) {
    const dfl_tokenizer *t = c->t;
    uint8_t want = normalized ? 2 : 1;
    for (size_t i = from; i < n; i++) {
        unsigned char c0 = (unsigned char)s[i];
        if (!(t->added_first[c0] & want)) continue;
        for (int k = t->added_at[c0]; k < t->added_at[c0 + 1]; k++) {
            const tok_added *x = &t->added[k];
            if (x->normalized != normalized || x->len > n - i || (x->special && !c->parse_special))
                continue;
            if (memcmp(s + i, t->pool + x->off, x->len)) continue;
            size_t e = i + x->len;
            if (x->single_word && ((i > 0 && is_word((unsigned char)s[i - 1])) ||
                                   (e < n && is_word((unsigned char)s[e]))))
                continue;
            size_t st = i;
            if (x->lstrip)
                while (st > from && is_space((unsigned char)s[st - 1])) st--;
            if (x->rstrip)
                while (e < n && is_space((unsigned char)s[e])) e++;
            *a = st;
            *b = e;
            *id = x->id;
            return 1;
        }
    }
    return 0;
}

/* ---- pre-tokenizers --------------------------------------------------------- */

static void pretok(enc *c, int k, const char *s, size_t n, int first);

typedef struct span {
    size_t a, b;
    int match;
} span;

typedef struct spans {
    span *v;
    int n;
    size_t cap;
} spans;

static void spans_push(spans *v, size_t a, size_t b, int match) {
    v->v = xgrow(v->v, &v->cap, (size_t)v->n + 1, sizeof *v->v);
    v->v[v->n++] = (span){a, b, match};
}

/* Next non-empty match at or after *at; 0 when none, < 0 on a regex error. */
static int find_match(enc *c, const pcre2_code *re, const char *s, size_t n, size_t *at,
                      size_t *ms, size_t *me) {
    while (*at <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, *at, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter has more room */
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, *at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md,
                             NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            c->rc = dfl_fail(c->err, DFL_EARG, "%s: pre-tokenizer regex failed: %s", c->t->source,
                             (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            *at = ov[1];
            return 1;
        }
        if (ov[0] >= n) return 0; /* empty match at the end */
        *at = ov[0] + (size_t)dfl_tok_utf8_len((unsigned char)s[ov[0]]);
    }
    return 0;
}

/* Split with the behaviours of Hugging Face's SplitDelimiterBehavior. */
static void split(enc *c, int k, const char *s, size_t n, int first) {
    const tok_pre *p = &c->t->pre[k];
    size_t at = 0, prev = 0, ms, me;
    int r;
    if (p->behavior == SPLIT_ISOLATED && !p->invert) { /* the common case, streamed */
        while ((r = find_match(c, p->re, s, n, &at, &ms, &me)) > 0) {
            if (ms > prev) pretok(c, k + 1, s + prev, ms - prev, first && prev == 0);
            pretok(c, k + 1, s + ms, me - ms, first && ms == 0);
            prev = me;
        }
        if (r == 0 && prev < n) pretok(c, k + 1, s + prev, n - prev, first && prev == 0);
        return;
    }
    spans v = {0}, w = {0};
    while ((r = find_match(c, p->re, s, n, &at, &ms, &me)) > 0) {
        if (ms > prev) spans_push(&v, prev, ms, p->invert);
        spans_push(&v, ms, me, !p->invert);
        prev = me;
    }
    if (prev < n) spans_push(&v, prev, n, p->invert);
    int prev_match = 0;
    if (p->behavior == SPLIT_MERGED_NEXT) {
        for (int i = v.n - 1; i >= 0; i--) { /* a match joins the piece after it */
            span x = v.v[i];
            if (x.match && !prev_match && w.n) w.v[w.n - 1].a = x.a;
            else spans_push(&w, x.a, x.b, 0);
            prev_match = x.match;
        }
        for (int i = 0, j = w.n - 1; i < j; i++, j--) {
            span tmp = w.v[i];
            w.v[i] = w.v[j];
            w.v[j] = tmp;
        }
    } else {
        for (int i = 0; i < v.n; i++) {
            span x = v.v[i];
            if (p->behavior == SPLIT_REMOVED) {
                if (!x.match) spans_push(&w, x.a, x.b, 0);
                continue;
            }
            int join = p->behavior == SPLIT_MERGED_PREV ? x.match && !prev_match
                     : p->behavior == SPLIT_CONTIGUOUS  ? x.match == prev_match
                                                        : 0;
            if (join && w.n) w.v[w.n - 1].b = x.b;
            else spans_push(&w, x.a, x.b, 0);
            prev_match = x.match;
        }
    }
    for (int i = 0; r >= 0 && i < w.n; i++)
        pretok(c, k + 1, s + w.v[i].a, w.v[i].b - w.v[i].a, first && w.v[i].a == 0);
    free(v.v);
    free(w.v);
}

/* Metaspace: spaces become the replacement, which may also be prepended. */
static void metaspace(enc *c, int k, const char *s, size_t n, int first) {
    const tok_pre *p = &c->t->pre[k];
    size_t rl = strlen(p->rep), spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    char *b = xmalloc(n + (spaces + 1) * rl + 1);
    size_t o = 0;
    int starts = n && (s[0] == ' ' || (n >= rl && !memcmp(s, p->rep, rl)));
    if ((p->prepend == 2 || (p->prepend == 1 && first)) && !starts) {
        memcpy(b, p->rep, rl);
        o = rl;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(b + o, p->rep, rl);
            o += rl;
        } else {
            b[o++] = s[i];
        }
    }
    pretok(c, k + 1, b, o, first);
    free(b);
}

static void pretok(enc *c, int k, const char *s, size_t n, int first) {
    const dfl_tokenizer *t = c->t;
    if (c->rc || !n) return;
    if (k == t->n_pre) {
        tok_word(t, s, n, c->cache, &c->out);
        return;
    }
    switch (t->pre[k].kind) {
    case PRE_SPLIT: split(c, k, s, n, first); break;
    case PRE_METASPACE: metaspace(c, k, s, n, first); break;
    case PRE_BYTELEVEL_PREFIX:
        if (s[0] == ' ') {
            pretok(c, k + 1, s, n, first);
        } else {
            char *b = xmalloc(n + 1);
            b[0] = ' ';
            memcpy(b + 1, s, n);
            pretok(c, k + 1, b, n + 1, first);
            free(b);
        }
        break;
    }
}

/* ---- the pipeline ------------------------------------------------------------ */

/* A stretch of raw text between added tokens (BPE vocabularies). */
static void encode_bpe_text(enc *c, const char *s, size_t n, int first) {
    size_t m;
    char *norm = tok_normalize(c->t, s, n, &m);
    const char *u = norm ? norm : s;
    size_t i = 0, a, b;
    int32_t id;
    for (;;) { /* tokens that match the normalized text */
        int found = next_added(c, u, m, i, 1, &a, &b, &id);
        size_t end = found ? a : m;
        if (end > i) pretok(c, 0, u + i, end - i, first && i == 0);
        if (!found) break;
        tok_ids_push(&c->out, id);
        i = b;
    }
    free(norm);
}

/* Sentencepiece: a space before the first stretch and after each added token,
 * spaces shown as U+2581 "▁". */
static void encode_spm_text(enc *c, const char *s, size_t n, int prefix) {
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    prefix = prefix && c->t->add_space_prefix;
    char *b = xmalloc(n + 2 * spaces + 4);
    size_t o = 0;
    if (prefix) {
        memcpy(b, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(b + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            b[o++] = s[i];
        }
    }
    tok_word(c->t, b, o, c->cache, &c->out);
    free(b);
}

int dfl_tok_encode(const dfl_tokenizer *t, const char *text, size_t len, int add_special,
                   int parse_special, int32_t *ids, int cap, dfl_error *err) {
    if (!t || (!text && len) || cap < 0 || (cap && !ids))
        return dfl_fail(err, DFL_EARG, "tokenize: bad arguments");
    if (len > (size_t)INT_MAX / 2)
        return dfl_fail(err, DFL_EARG, "tokenize: %zu bytes of text is more than the %d allowed",
                        len, INT_MAX / 2);
    size_t bad = tok_utf8_check(text, len);
    if (bad < len)
        return dfl_fail(err, DFL_EARG, "tokenize: text is not valid UTF-8 (byte %zu: 0x%02x)", bad,
                        (unsigned char)text[bad]);
    enc c = {.t = t, .parse_special = parse_special, .err = err};
    if (len > 4096) c.cache = tok_cache_new(len);
    if (t->n_pre) c.md = pcre2_match_data_create(1, NULL);
    if (add_special && t->add_bos && t->bos_id >= 0) tok_ids_push(&c.out, t->bos_id);
    size_t i = 0, a, b;
    int32_t id;
    int after_token = 1;
    for (;;) { /* tokens that match the raw text */
        int found = next_added(&c, text, len, i, 0, &a, &b, &id);
        size_t end = found ? a : len;
        if (end > i) {
            if (t->model == TOK_SPM) encode_spm_text(&c, text + i, end - i, after_token);
            else encode_bpe_text(&c, text + i, end - i, i == 0);
            after_token = 0;
        }
        if (!found || c.rc) break;
        tok_ids_push(&c.out, id);
        after_token = 1;
        i = b;
    }
    if (add_special && t->add_eos && t->eos_add_id >= 0) tok_ids_push(&c.out, t->eos_add_id);
    tok_cache_free(c.cache);
    pcre2_match_data_free(c.md);
    int n = c.out.n;
    if (!c.rc && cap && n > 0) memcpy(ids, c.out.v, (size_t)(n < cap ? n : cap) * sizeof *ids);
    free(c.out.v);
    return c.rc ? c.rc : n;
}
