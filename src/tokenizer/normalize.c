/* normalize.c - tokenizer.json normalizers: NFC / NFKC (utf8proc), Prepend,
 * Replace, applied in file order to each stretch of text between added
 * tokens. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_impl.h"

/* A code point that NFC leaves alone whatever surrounds it: it is NFC by
 * itself, a starter (combining class 0) and never the second half of a
 * canonical composition. Text splits safely before it, so only the stretches
 * around other code points go through utf8proc. The ranges are a
 * conservative list of common scripts; tests/test_tokenizer.c checks each
 * against utf8proc's data. Anything else just takes the slow path. */
int tok_nfc_inert(uint32_t cp) {
    static const uint32_t r[][2] = {
        {0x00A0, 0x017F}, {0x0400, 0x0482}, {0x048A, 0x04FF}, {0x0620, 0x064A},
        {0x0660, 0x0669}, {0x0900, 0x093B}, {0x093D, 0x094C}, {0x0950, 0x0950},
        {0x0960, 0x097F}, {0x2010, 0x2027}, {0x2030, 0x205E}, {0x3000, 0x3029},
        {0x3030, 0x303F}, {0x3041, 0x3096}, {0x309B, 0x30FF}, {0x3400, 0x4DBF},
        {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0xFF01, 0xFFEF}, {0x1F000, 0x1FAFF},
    };
    if (cp < 0x80) return 1;
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (cp >= r[i][0] && cp <= r[i][1]) return 1;
    return 0;
}

/* Code point at s (valid UTF-8 is checked before normalizing). */
static uint32_t decode_cp(const unsigned char *s, int *len) {
    int l = dfl_tok_utf8_len(s[0]);
    *len = l;
    if (l == 1) return s[0];
    if (l == 2) return (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
    if (l == 3) return (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3f) << 12 |
           (uint32_t)(s[2] & 0x3f) << 6 | (s[3] & 0x3f);
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    b->p = xgrow(b->p, &b->cap, b->n + n + 1, 1);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* Appends the NFC (or NFKC) form of s[0..n) to b. */
static void normalize_run(sbuf *b, const char *s, size_t n, int compat) {
    utf8proc_uint8_t *o = NULL;
    int opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (compat ? UTF8PROC_COMPAT : 0);
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &o, opt);
    if (m < 0) { /* not reached: input was checked; keep the text unchanged */
        sb_add(b, s, n);
    } else {
        sb_add(b, (const char *)o, (size_t)m);
    }
    free(o);
}

char *tok_nfc(const char *s, size_t n, size_t *out_n) {
    const unsigned char *p = (const unsigned char *)s;
    sbuf b = {0};
    size_t copied = 0;   /* s[0..copied) is already in b */
    size_t starter = 0;  /* start of the last inert code point seen */
    size_t i = 0;
    int changed = 0;
    while (i < n) {
        if (p[i] < 0x80) { starter = i++; continue; }
        int l;
        uint32_t cp = decode_cp(p + i, &l);
        if (tok_nfc_inert(cp)) { starter = i; i += l; continue; }
        /* a stretch from the last inert starter to the next inert code point */
        size_t a = starter < copied ? copied : starter, e = i + l;
        while (e < n) {
            int l2;
            uint32_t c2 = decode_cp(p + e, &l2);
            if (tok_nfc_inert(c2)) break;
            e += l2;
        }
        sb_add(&b, s + copied, a - copied);
        size_t before = b.n;
        normalize_run(&b, s + a, e - a, 0);
        if (b.n - before != e - a || memcmp(b.p + before, s + a, e - a)) changed = 1;
        copied = e;
        starter = i = e;
    }
    if (!changed) {
        free(b.p);
        return NULL;
    }
    sb_add(&b, s + copied, n - copied);
    *out_n = b.n;
    return b.p;
}

static char *nfkc(const char *s, size_t n, size_t *out_n) {
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) return NULL;
    sbuf b = {0};
    normalize_run(&b, s, n, 1);
    *out_n = b.n;
    return b.p;
}

/* Prepend: the text gets a prefix unless it is empty (as Hugging Face). */
static char *prepend(const char *a, const char *s, size_t n, size_t *out_n) {
    if (!n) return NULL;
    sbuf b = {0};
    sb_add(&b, a, strlen(a));
    sb_add(&b, s, n);
    *out_n = b.n;
    return b.p;
}

static char *replace(const char *a, const char *r, const char *s, size_t n, size_t *out_n) {
    size_t al = strlen(a), rl = strlen(r);
    if (!al || n < al || !memmem(s, n, a, al)) return NULL;
    sbuf b = {0};
    size_t i = 0;
    while (i < n) {
        const char *hit = memmem(s + i, n - i, a, al);
        size_t j = hit ? (size_t)(hit - s) : n;
        sb_add(&b, s + i, j - i);
        if (!hit) break;
        sb_add(&b, r, rl);
        i = j + al;
    }
    *out_n = b.n;
    return b.p ? b.p : calloc(1, 1);
}

char *tok_normalize(const dfl_tokenizer *t, const char *s, size_t n, size_t *out_n) {
    char *cur = NULL; /* owned result so far; NULL means s itself */
    for (int k = 0; k < t->n_norm; k++) {
        const tok_norm *st = &t->norm[k];
        const char *in = cur ? cur : s;
        size_t m = 0;
        char *next = NULL;
        switch (st->kind) {
        case NORM_NFC: next = tok_nfc(in, n, &m); break;
        case NORM_NFKC: next = nfkc(in, n, &m); break;
        case NORM_PREPEND: next = prepend(st->a, in, n, &m); break;
        case NORM_REPLACE: next = replace(st->a, st->b, in, n, &m); break;
        }
        if (next) {
            free(cur);
            cur = next;
            n = m;
        }
    }
    *out_n = n;
    return cur;
}
