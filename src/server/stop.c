/* stop.c - stop strings matched across token boundaries.
 *
 * The text not yet sent ("held") always starts where a stop string could still
 * begin. Each piece is appended; then either a stop string occurs in held (send
 * what precedes it, end) or the longest suffix of held that is a proper prefix
 * of some stop string stays held and the rest is sent. So nothing after a stop
 * string ever leaves, and no occurrence can start in text already sent. */
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
