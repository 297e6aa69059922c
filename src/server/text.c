/* text.c - byte buffers, UTF-8, JSON nesting scan, constant-time secret compare. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"

int srv_buf_reserve(srv_buf *b, size_t n) {
    if (b->len + n + 1 <= b->cap) return 0;
    if (n > SIZE_MAX / 4 - b->len) return -1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) return -1;
    b->p = q;
    b->cap = cap;
    return 0;
}

/* The server's own text (responses, stop hold-back) is bounded by the context
 * and the limits in request.c, so running out here is fatal. */
void srv_buf_put(srv_buf *b, const void *p, size_t n) {
    if (srv_buf_reserve(b, n)) {
        fprintf(stderr, "dflash serve: out of memory (%zu more bytes)\n", n);
        abort();
    }
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
}

void srv_buf_puts(srv_buf *b, const char *s) { srv_buf_put(b, s, strlen(s)); }

void srv_buf_free(srv_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid.
 * Rejects overlong forms, surrogates and code points above U+10FFFF. */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

int srv_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (!u[i]) return 0;
        int k = utf8_seq(u + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

void srv_utf8_sanitize(srv_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t run = 0;   /* start of the current valid run */
    for (size_t i = 0; i < n;) {
        int k = utf8_seq(u + i, n - i);
        if (k) {
            i += k;
            continue;
        }
        srv_buf_put(b, s + run, i - run);
        srv_buf_put(b, "\xEF\xBF\xBD", 3);
        run = ++i;
    }
    srv_buf_put(b, s + run, n - run);
}

/* \u0000 inside a JSON string: cJSON would end the string there and silently
 * drop the rest, so requests that carry one are refused instead. */
static int nul_escape(const char *s, size_t n, size_t i) {
    return i + 4 < n && s[i] == 'u' && !memcmp(s + i + 1, "0000", 4);
}

int srv_json_check_items(const char *s, size_t n, int max, size_t max_items) {
    int depth = 0, in_str = 0;
    size_t items = 1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\' && nul_escape(s, n, ++i)) return SRV_JSON_NUL;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[' || c == ',') {
            if (++items > max_items) return SRV_JSON_ITEMS;
            if (c != ',' && ++depth > max) return SRV_JSON_DEEP;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return 0;
}

int srv_json_check(const char *s, size_t n, int max) {
    return srv_json_check_items(s, n, max, SIZE_MAX);
}

int srv_secret_equal(const char *secret, const char *given) {
    size_t ns = strlen(secret), ng = strlen(given);
    volatile unsigned char diff = (unsigned char)(ns != ng);
    /* Walks the secret's length whatever was given, reading given only within
     * its bounds, so the time reveals neither content nor a matching prefix. */
    for (size_t i = 0; i < ns; i++) {
        unsigned char g = i < ng ? (unsigned char)given[i] : 0;
        diff |= (unsigned char)secret[i] ^ g;
    }
    return diff == 0;
}

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
