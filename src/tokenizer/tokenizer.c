/* tokenizer.c - the tokenizer's tables: pool, hash maps, added tokens,
 * decoded pieces, and the small getters of tokenizer.h. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

dfl_tokenizer *tok_new(const char *source) {
    dfl_tokenizer *t = xcalloc(1, sizeof *t);
    t->unk_id = t->bos_id = t->eos_id = t->pad_id = t->eos_add_id = -1;
    for (int i = 0; i < 256; i++) t->byte_id[i] = -1;
    t->source = strdup(source ? source : "tokenizer");
    if (!t->source) t->source = xcalloc(1, 1);
    return t;
}

void dfl_tok_free(dfl_tokenizer *t) {
    if (!t) return;
    free(t->key_off); free(t->key_len); free(t->dec_off); free(t->dec_len);
    free(t->attr); free(t->score); free(t->pool);
    tok_strmap_free(&t->vocab);
    free(t->merges.m);
    for (int i = 0; i < t->n_norm; i++) { free(t->norm[i].a); free(t->norm[i].b); }
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    free(t->added);
    free(t->chat_template);
    free(t->chat_template_tool);
    free(t->source);
    free(t);
}

int64_t tok_pool_add(dfl_tokenizer *t, const void *s, size_t n) {
    if (t->pool_len + n + 1 > (size_t)1 << 30) return -1;
    char *p = dfl_grow(t->pool, &t->pool_cap, t->pool_len + n + 1, 1, "the string pool", NULL);
    if (!p) return -1;
    t->pool = p;
    int64_t off = (int64_t)t->pool_len;
    if (n) memcpy(t->pool + off, s, n);
    t->pool[off + n] = 0; /* keys read as C strings in messages */
    t->pool_len += n + 1;
    return off;
}

void tok_alloc_ids(dfl_tokenizer *t, int n) {
    t->n_vocab = n;
    t->key_off = xcalloc(n, sizeof *t->key_off);
    t->key_len = xcalloc(n, sizeof *t->key_len);
    t->dec_off = xcalloc(n, sizeof *t->dec_off);
    t->dec_len = xcalloc(n, sizeof *t->dec_len);
    t->attr = xcalloc(n, 1);
    for (int i = 0; i < n; i++) t->attr[i] = TA_UNUSED;
}

/* ---- hashing ------------------------------------------------------------ */

/* A multiply-xorshift hash over 8-byte words: keys are short token texts. */
uint32_t tok_hash(const void *s, size_t n) {
    const unsigned char *p = s;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    h = (h ^ w) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return (uint32_t)(h >> 32);
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n && c < (1u << 30)) c *= 2;
    return c;
}

void tok_strmap_init(tok_strmap *m, int n) {
    uint32_t cap = pow2_at_least((uint64_t)n * 2);
    m->s = xmalloc(cap * sizeof *m->s);
    for (uint32_t i = 0; i < cap; i++) m->s[i] = (tok_slot){0, -1};
    m->mask = cap - 1;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->s);
    m->s = NULL;
}

void tok_strmap_put(dfl_tokenizer *t, int32_t id) {
    tok_strmap *m = &t->vocab;
    const char *k = tok_key(t, id);
    uint32_t n = t->key_len[id], h = tok_hash(k, n), i = h & m->mask;
    while (m->s[i].id >= 0) {
        int32_t o = m->s[i].id;
        if (m->s[i].hash == h && t->key_len[o] == n && !memcmp(tok_key(t, o), k, n)) return;
        i = (i + 1) & m->mask;
    }
    m->s[i] = (tok_slot){h, id};
}

int32_t tok_strmap_get(const dfl_tokenizer *t, const char *s, size_t n) {
    const tok_strmap *m = &t->vocab;
    if (!m->s) return -1;
    uint32_t h = tok_hash(s, n), i = h & m->mask;
    for (;;) {
        tok_slot e = m->s[i];
        if (e.id < 0) return -1;
        if (e.hash == h && t->key_len[e.id] == n && !memcmp(tok_key(t, e.id), s, n)) return e.id;
        i = (i + 1) & m->mask;
    }
}

void tok_pairmap_init(tok_pairmap *m, int n) {
    uint32_t cap = pow2_at_least((uint64_t)n * 2);
    m->m = xmalloc(cap * sizeof *m->m);
    for (uint32_t i = 0; i < cap; i++) m->m[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->n = 0;
}

int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & m->mask;
    while (m->m[i].key != UINT64_MAX) {
        if (m->m[i].key == key) { /* as Hugging Face: a repeated merge takes the later rank */
            m->m[i].rank = rank;
            m->m[i].id = id;
            return 1;
        }
        i = (i + 1) & m->mask;
    }
    m->m[i] = (tok_merge){key, rank, id};
    m->n++;
    return 0;
}

/* ---- bytes and UTF-8 ---------------------------------------------------- */

/* GPT-2 shows printable Latin-1 bytes as themselves and maps the other 68
 * (controls, space, 0x7f-0xa0, 0xad) in byte order to U+0100.. */
#define R4(a) a, a + 1, a + 2, a + 3
#define R8(a) R4(a), R4(a + 4)
#define R16(a) R8(a), R8(a + 8)
const uint16_t tok_bl_cp[256] = {
    R16(0x100), R16(0x110),         /* 0x00-0x1f */
    0x120,                          /* space */
    0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, R8(0x28), R16(0x30), R16(0x40), R16(0x50),
    R8(0x60), R4(0x68), R4(0x6c), 0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79,
    0x7a, 0x7b, 0x7c, 0x7d, 0x7e,   /* 0x21-0x7e */
    0x121,                          /* 0x7f */
    R16(0x122), R16(0x132), 0x142,  /* 0x80-0xa0 */
    R8(0xa1), R4(0xa9),             /* 0xa1-0xac */
    0x143,                          /* 0xad */
    0xae, 0xaf, R16(0xb0), R16(0xc0), R16(0xd0), R16(0xe0), R16(0xf0),
};

int dfl_tok_utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) return 3;
    if (c >= 0xf0 && c <= 0xf4) return 4;
    return 1;
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 if invalid. */
static int utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int len = dfl_tok_utf8_len(c);
    if (len == 1 || (size_t)len > n) return 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c == 0xe0) lo = 0xa0;
    else if (c == 0xed) hi = 0x9f; /* no surrogates */
    else if (c == 0xf0) lo = 0x90;
    else if (c == 0xf4) hi = 0x8f;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

size_t tok_utf8_check(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) { i++; continue; }
        int l = utf8_valid_len(p + i, n - i);
        if (!l) return i;
        i += l;
    }
    return n;
}

int tok_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = cp; return 1; }
    if (cp < 0x800) { o[0] = 0xc0 | cp >> 6; o[1] = 0x80 | (cp & 0x3f); return 2; }
    if (cp < 0x10000) {
        o[0] = 0xe0 | cp >> 12; o[1] = 0x80 | ((cp >> 6) & 0x3f); o[2] = 0x80 | (cp & 0x3f);
        return 3;
    }
    o[0] = 0xf0 | cp >> 18; o[1] = 0x80 | ((cp >> 12) & 0x3f);
    o[2] = 0x80 | ((cp >> 6) & 0x3f); o[3] = 0x80 | (cp & 0x3f);
    return 4;
}

/* Byte shown as code point cp in the byte-level alphabet, or -1. */
static int bl_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    if (cp < 0x100 || cp >= 0x144) return -1;
    uint32_t k = cp - 0x100; /* k-th byte that is not shown as itself */
    if (k <= 0x20) return (int)k;
    if (k == 0x21) return 0x7f;
    if (k <= 0x42) return (int)(0x80 + k - 0x22);
    return 0xad;
}

int tok_bl_decode(const char *s, size_t n, char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    int k = 0;
    while (i < n) {
        int l = utf8_valid_len(p + i, n - i);
        if (!l || l > 2) return -1;
        uint32_t cp = l == 1 ? p[i] : (uint32_t)(p[i] & 0x1f) << 6 | (p[i + 1] & 0x3f);
        int b = bl_byte(cp);
        if (b < 0) return -1;
        out[k++] = (char)b;
        i += l;
    }
    return k;
}

/* ---- added tokens and special ids ---------------------------------------- */

static int added_cmp(const void *a, const void *b, void *ctx) {
    const tok_added *x = a, *y = b;
    const char *pool = ctx;
    unsigned char fx = (unsigned char)pool[x->off], fy = (unsigned char)pool[y->off];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void tok_finish_added(dfl_tokenizer *t) {
    qsort_r(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp, t->pool);
    memset(t->added_first, 0, sizeof t->added_first);
    int k = 0;
    for (int b = 0; b < 256; b++) {
        t->added_at[b] = k;
        for (; k < t->n_added && (unsigned char)t->pool[t->added[k].off] == b; k++)
            t->added_first[b] |= t->added[k].normalized ? 2 : 1;
    }
    t->added_at[256] = k;
}

void tok_add_eog(dfl_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab || t->n_eog >= TOK_MAX_EOG) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog[t->n_eog++] = id;
}

void tok_find_eog(dfl_tokenizer *t) {
    static const char *const names[] = {
        "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
        "<|end|>", "<end_of_turn>", "<|return|>", "</s>", "<|EOT|>",
    };
    tok_add_eog(t, t->eos_id);
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        int32_t id = tok_find_text(t, names[k]);
        if (id >= 0 && (t->attr[id] & TA_SPECIAL)) tok_add_eog(t, id);
    }
}

int32_t tok_find_text(const dfl_tokenizer *t, const char *s) {
    size_t n = strlen(s);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->pool + t->added[i].off, s, n))
            return t->added[i].id;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->dec_len[id] == n && !memcmp(t->pool + t->dec_off[id], s, n)) return id;
    return -1;
}

/* ---- decoded pieces -------------------------------------------------------- */

/* Decoded bytes of a metaspace / sentencepiece key: rep -> ' ', <0xNN> -> byte. */
static size_t metaspace_decode(const char *k, size_t n, const char *rep, int is_byte, char *out) {
    if (is_byte) {
        unsigned v = 0;
        for (int i = 3; i < 5; i++) {
            char c = k[i];
            v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
        }
        out[0] = (char)v;
        return 1;
    }
    size_t rl = rep ? strlen(rep) : 0, o = 0;
    for (size_t i = 0; i < n;) {
        if (rl && i + rl <= n && !memcmp(k + i, rep, rl)) {
            out[o++] = ' ';
            i += rl;
        } else {
            out[o++] = k[i++];
        }
    }
    return o;
}

int tok_build_pieces(dfl_tokenizer *t, int byte_level_decode, const char *rep, dfl_error *err) {
    char buf[DFL_TOK_MAX_PIECE];
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *k = tok_key(t, id);
        uint32_t n = t->key_len[id];
        if ((t->attr[id] & (TA_ADDED | TA_UNUSED)) || t->byte_level) {
            /* byte-level keys are already raw bytes; added tokens are their content */
            t->dec_off[id] = t->key_off[id];
            t->dec_len[id] = n;
            continue;
        }
        size_t m;
        if (byte_level_decode) {
            int r = tok_bl_decode(k, n, buf);
            if (r < 0) { /* as Hugging Face: a piece outside the alphabet is its own text */
                t->dec_off[id] = t->key_off[id];
                t->dec_len[id] = n;
                continue;
            }
            m = (size_t)r;
        } else {
            m = metaspace_decode(k, n, rep, t->attr[id] & TA_BYTE, buf);
        }
        if (m == n && !memcmp(buf, k, n)) {
            t->dec_off[id] = t->key_off[id];
            t->dec_len[id] = n;
            continue;
        }
        int64_t off = tok_pool_add(t, buf, m);
        if (off < 0) return dfl_fail(err, DFL_EFORMAT, "%s: vocabulary text too large", t->source);
        t->dec_off[id] = (uint32_t)off;
        t->dec_len[id] = (uint32_t)m;
    }
    return 0;
}

/* ---- getters ------------------------------------------------------------- */

int dfl_tok_vocab_size(const dfl_tokenizer *t) { return t->n_vocab; }
int32_t dfl_tok_bos(const dfl_tokenizer *t) { return t->bos_id; }
int32_t dfl_tok_eos(const dfl_tokenizer *t) { return t->eos_id; }
int dfl_tok_add_bos(const dfl_tokenizer *t) { return t->add_bos && t->bos_id >= 0; }
int dfl_tok_strip_leading_space(const dfl_tokenizer *t) { return t->strip_leading_space; }
const char *dfl_tok_chat_template(const dfl_tokenizer *t) { return t->chat_template; }
const char *dfl_tok_chat_template_tool(const dfl_tokenizer *t) { return t->chat_template_tool; }

int dfl_tok_is_eog(const dfl_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

int dfl_tok_piece(const dfl_tokenizer *t, int32_t id, const char **bytes, int *special) {
    if (id < 0 || id >= t->n_vocab) return DFL_EARG;
    *bytes = t->pool + t->dec_off[id];
    if (special) *special = (t->attr[id] & TA_SPECIAL) != 0;
    return (int)t->dec_len[id];
}
