/* stop.c - stop strings matched across token boundaries.
 *
 * The text not yet sent ("held") always starts where a stop string could still
 * begin. Each piece is appended; then either a stop string occurs in held (send
 * what precedes it, end) or the longest suffix of held that is a proper prefix
 * of some stop string stays held and the rest is sent. So nothing after a stop
 * string ever leaves, and no occurrence can start in text already sent. */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* Earliest start of any stop string in s[0..n), or -1. */
static long first_hit(const srv_stop *s, const char *t, size_t n) {
    long best = -1;
    for (int k = 0; k < s->n_stop; k++) {
        size_t m = strlen(s->stop[k]);
        if (m > n) continue;
        for (size_t i = 0; i + m <= n && (best < 0 || (long)i < best); i++)
            if (!memcmp(t + i, s->stop[k], m)) {
                best = (long)i;
                break;
            }
    }
    return best;
}

/* Length of the longest suffix of t[0..n) that is a proper prefix of a stop string. */
static size_t partial_tail(const srv_stop *s, const char *t, size_t n) {
    size_t best = 0;
    for (int k = 0; k < s->n_stop; k++) {
        size_t m = strlen(s->stop[k]);
        for (size_t len = (m - 1 < n ? m - 1 : n); len > best; len--)
            if (!memcmp(t + n - len, s->stop[k], len)) {
                best = len;
                break;
            }
    }
    return best;
}

int srv_stop_push(srv_stop *s, const char *piece, size_t n, int final, const char **out,
                  size_t *n_out) {
    static const char empty[1] = {0};
    *out = empty;
    *n_out = 0;
    if (s->hit) return 1;
    srv_buf_put(&s->held, piece, n);
    char *t = s->held.p;
    size_t len = s->held.len;
    long hit = first_hit(s, t, len);
    size_t release = hit >= 0 ? (size_t)hit : final ? len : len - partial_tail(s, t, len);
    if (hit >= 0) s->hit = 1;
    /* held = [released | kept tail]: copy out the front, keep the tail. */
    s->rel.len = 0;
    srv_buf_put(&s->rel, t, release);
    size_t keep = hit >= 0 ? 0 : len - release;
    memmove(t, t + release, keep);
    s->held.len = keep;
    if (s->held.p) s->held.p[keep] = 0;
    *out = s->rel.p ? s->rel.p : empty;
    *n_out = release;
    return s->hit;
}

void srv_stop_free(srv_stop *s) {
    for (int k = 0; k < s->n_stop; k++) free(s->stop[k]);
    s->n_stop = 0;
    srv_buf_free(&s->held);
    srv_buf_free(&s->rel);
}

/* ---- reasoning: <think> ... </think> apart from the answer ------------------ */

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";

size_t srv_tag_tail(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = n < t - 1 ? n : t - 1; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

void srv_think_init(srv_think *t, int on, const char *prompt, size_t n) {
    memset(t, 0, sizeof *t);
    if (!on) return (void)(t->state = SRV_THINK_OFF);
    /* a template that opens the block itself (Qwen3.5, DeepSeek-R1): we start inside */
    while (n && (prompt[n - 1] == '\n' || prompt[n - 1] == ' ')) n--;
    size_t o = sizeof THINK_OPEN - 1;
    t->state = n >= o && !memcmp(prompt + n - o, THINK_OPEN, o) ? SRV_THINK_IN : SRV_THINK_START;
}

/* Text after </think> starts the answer: the blank lines between are dropped. */
static void to_content(srv_think *t, const char *s, size_t n, srv_buf *content) {
    if (t->state == SRV_THINK_AFTER) {
        while (n && (*s == '\n' || *s == ' ')) s++, n--;
        if (n) t->state = SRV_THINK_OUT;
    }
    srv_buf_put(content, s, n);
}

void srv_think_push(srv_think *t, const char *s, size_t n, int final, srv_buf *reason,
                    srv_buf *content) {
    if (t->state == SRV_THINK_OFF || t->state == SRV_THINK_OUT) {
        srv_buf_put(content, s, n);
        return;
    }
    srv_buf_put(&t->held, s, n);
    const char *h = t->held.p;
    size_t hn = t->held.len, used = 0;
    if (t->state == SRV_THINK_START) {
        size_t ws = 0, o = sizeof THINK_OPEN - 1;
        while (ws < hn && (h[ws] == '\n' || h[ws] == ' ')) ws++;
        size_t k = hn - ws < o ? hn - ws : o;
        if (memcmp(h + ws, THINK_OPEN, k)) {   /* no block: all of it is the answer */
            t->state = SRV_THINK_OUT;
            srv_buf_put(content, h, hn);
            t->held.len = 0;
            return;
        }
        if (k < o && !final) return;            /* maybe "<think>" still coming */
        if (k < o) {
            t->state = SRV_THINK_OUT;
            srv_buf_put(content, h, hn);
            t->held.len = 0;
            return;
        }
        t->state = SRV_THINK_IN;
        used = ws + o;
    }
    if (t->state == SRV_THINK_IN) {
        const char *end = memmem(h + used, hn - used, THINK_CLOSE, sizeof THINK_CLOSE - 1);
        if (end) {
            srv_buf_put(reason, h + used, (size_t)(end - h) - used);
            used = (size_t)(end - h) + sizeof THINK_CLOSE - 1;
            t->state = SRV_THINK_AFTER;
        } else {
            size_t keep = final ? 0 : srv_tag_tail(h + used, hn - used, THINK_CLOSE);
            srv_buf_put(reason, h + used, hn - used - keep);
            used = hn - keep;
        }
    }
    if (t->state == SRV_THINK_AFTER) {
        to_content(t, h + used, hn - used, content);
        used = hn;
    }
    memmove(t->held.p, h + used, hn - used);
    t->held.len = hn - used;
}

void srv_think_free(srv_think *t) { srv_buf_free(&t->held); }
