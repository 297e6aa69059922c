/* bpe.c - the two models: BPE by merge rank (one pre-tokenized word at a
 * time, with a per-call cache of words already seen) and sentencepiece BPE
 * by score (llama.cpp's "llama" vocabularies). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

void tok_ids_push(tok_ids *a, int32_t id) {
    a->v = xgrow(a->v, &a->cap, (size_t)a->n + 1, sizeof *a->v);
    a->v[a->n++] = id;
}

/* ---- word cache ----------------------------------------------------------- */

/* Words repeat (English text is ~90% repeats), so each call keeps the ids of
 * the words it has seen. The cache lives for one call: tokenizers are shared
 * between threads and never written after load. A slot holds the word and up
 * to two ids inline (one cache line holds two slots); longer results sit in
 * an arena. The table is small so that it stays in cache. */
enum { WORD_STACK = 64, CACHE_KEY = 18, CACHE_INLINE = 2 }; /* WORD_STACK: symbols on the stack */
/* Up to this many symbols the quadratic merge beats the heap. */
#ifndef MERGE_SMALL
#define MERGE_SMALL 16
#endif

typedef struct cache_slot {
    uint32_t hash;
    uint8_t key_len;        /* 0: empty */
    uint8_t n_ids;
    char key[CACHE_KEY];
    union {
        int32_t ids[CACHE_INLINE];
        uint32_t off;       /* into ids, when n_ids > CACHE_INLINE */
    } u;
} cache_slot;

struct tok_cache {
    cache_slot *slot; /* (mask+1) */
    uint32_t mask, used;
    tok_ids ids;
};

tok_cache *tok_cache_new(size_t text_len) {
    uint32_t cap = 1024;
    while (cap < text_len / 16 && cap < (1u << 16)) cap *= 2;
    tok_cache *c = xcalloc(1, sizeof *c);
    c->slot = xcalloc(cap, sizeof *c->slot);
    c->mask = cap - 1;
    return c;
}

void tok_cache_free(tok_cache *c) {
    if (!c) return;
    free(c->slot);
    free(c->ids.v);
    free(c);
}

/* The slot holding w, or the empty slot where it would go. */
static cache_slot *cache_find(tok_cache *c, const char *w, size_t n, uint32_t h) {
    uint32_t i = h & c->mask;
    for (;;) {
        cache_slot *s = &c->slot[i];
        if (!s->key_len || (s->hash == h && s->key_len == n && !memcmp(s->key, w, n))) return s;
        i = (i + 1) & c->mask;
    }
}

static void cache_get(const tok_cache *c, const cache_slot *s, tok_ids *out) {
    const int32_t *v = s->n_ids <= CACHE_INLINE ? s->u.ids : c->ids.v + s->u.off;
    for (int i = 0; i < s->n_ids; i++) tok_ids_push(out, v[i]);
}

static void cache_put(tok_cache *c, cache_slot *s, const char *w, size_t n, uint32_t h,
                      const int32_t *ids, int n_ids) {
    if (c->used * 4 >= c->mask * 3 || n > CACHE_KEY || n_ids > 255) return; /* full: stop */
    s->hash = h;
    s->key_len = (uint8_t)n;
    s->n_ids = (uint8_t)n_ids;
    memcpy(s->key, w, n);
    if (n_ids <= CACHE_INLINE) {
        memcpy(s->u.ids, ids, (size_t)n_ids * sizeof *ids);
    } else {
        s->u.off = (uint32_t)c->ids.n;
        for (int i = 0; i < n_ids; i++) tok_ids_push(&c->ids, ids[i]);
    }
    c->used++;
}

/* ---- merges --------------------------------------------------------------- */

/* Short words: ranks of adjacent pairs in an array; merge the lowest (leftmost
 * on ties), refresh its two neighbours. Quadratic, but words are short. */
static int merge_small(const dfl_tokenizer *t, int32_t *sym, int m) {
    int32_t rank[WORD_STACK], res[WORD_STACK];
    for (int i = 0; i + 1 < m; i++) {
        const tok_merge *e = tok_pairmap_get(&t->merges, sym[i], sym[i + 1]);
        rank[i] = e ? e->rank : INT32_MAX;
        res[i] = e ? e->id : -1;
    }
    while (m > 1) {
        int best = 0;
        for (int i = 1; i + 1 < m; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT32_MAX) break;
        sym[best] = res[best];
        m--;
        for (int i = best + 1; i < m; i++) {
            sym[i] = sym[i + 1];
            rank[i] = rank[i + 1];
            res[i] = res[i + 1];
        }
        for (int i = best - 1; i <= best; i++) {
            if (i < 0 || i + 1 >= m) continue;
            const tok_merge *e = tok_pairmap_get(&t->merges, sym[i], sym[i + 1]);
            rank[i] = e ? e->rank : INT32_MAX;
            res[i] = e ? e->id : -1;
        }
    }
    return m;
}

/* Long words (a whole line under Metaspace without splitting): symbols in a
 * linked list, candidate merges in a min-heap on (rank, position); entries
 * whose symbols have changed are skipped when popped. */
typedef struct heap_ent {
    int32_t rank, pos, left, right;
} heap_ent;

static int ent_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_ent *h, int *n, heap_ent e) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!ent_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, int *n) {
    heap_ent top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && ent_less(&h[c + 1], &h[c])) c++;
        if (!ent_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(const dfl_tokenizer *t, heap_ent *h, int *nh, const int32_t *sym, int a,
                      int b) {
    if (a < 0 || b < 0) return;
    const tok_merge *e = tok_pairmap_get(&t->merges, sym[a], sym[b]);
    if (e) heap_push(h, nh, (heap_ent){e->rank, a, sym[a], sym[b]});
}

static int merge_large(const dfl_tokenizer *t, int32_t *sym, int m) {
    if (m < 2) return m;
    enum { STACK = 256 };
    int32_t next_s[STACK], prev_s[STACK];
    heap_ent h_s[3 * STACK];
    int big = m > STACK;
    int32_t *next = big ? xmalloc((size_t)m * sizeof *next) : next_s;
    int32_t *prev = big ? xmalloc((size_t)m * sizeof *prev) : prev_s;
    /* every merge pushes at most two entries and there are fewer than m merges */
    heap_ent *h = big ? xmalloc((size_t)3 * m * sizeof *h) : h_s;
    int nh = 0;
    for (int i = 0; i < m; i++) {
        next[i] = i + 1 < m ? i + 1 : -1;
        prev[i] = i - 1;
    }
    for (int i = 0; i + 1 < m; i++) push_pair(t, h, &nh, sym, i, i + 1);
    while (nh) {
        heap_ent e = heap_pop(h, &nh);
        int r = next[e.pos];
        if (sym[e.pos] != e.left || r < 0 || sym[r] != e.right) continue;
        sym[e.pos] = tok_pairmap_get(&t->merges, e.left, e.right)->id;
        sym[r] = -1;
        next[e.pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = e.pos;
        push_pair(t, h, &nh, sym, prev[e.pos], e.pos);
        push_pair(t, h, &nh, sym, e.pos, next[e.pos]);
    }
    int k = 0;
    for (int i = 0; i >= 0; i = next[i]) sym[k++] = sym[i];
    if (big) {
        free(next);
        free(prev);
        free(h);
    }
    return k;
}

/* ---- one word ------------------------------------------------------------- */

/* Initial symbols: one per byte (byte-level) or per char, with byte fallback
 * and <unk> for chars the vocabulary lacks. Returns the count. */
static int initial_symbols(const dfl_tokenizer *t, const char *w, size_t n, int32_t *sym) {
    int m = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[(unsigned char)w[i]];
            if (id >= 0) sym[m++] = id;
            else if (t->unk_id >= 0 && !(t->fuse_unk && m && sym[m - 1] == t->unk_id))
                sym[m++] = t->unk_id;
        }
        return m;
    }
    for (size_t i = 0; i < n;) {
        int l = dfl_tok_utf8_len((unsigned char)w[i]);
        if ((size_t)l > n - i) l = (int)(n - i);
        int32_t id = tok_strmap_get(t, w + i, (size_t)l);
        if (id >= 0) {
            sym[m++] = id;
        } else {
            int ok = t->byte_fallback;
            for (int j = 0; ok && j < l; j++) ok = t->byte_id[(unsigned char)w[i + j]] >= 0;
            if (ok) {
                for (int j = 0; j < l; j++) sym[m++] = t->byte_id[(unsigned char)w[i + j]];
            } else if (t->unk_id >= 0 && !(t->fuse_unk && m && sym[m - 1] == t->unk_id)) {
                sym[m++] = t->unk_id;
            }
        }
        i += (size_t)l;
    }
    return m;
}

static void spm_word(const dfl_tokenizer *t, const char *s, size_t n, tok_ids *out);

/* One word through the cache and the model. */
static void word(const dfl_tokenizer *t, const char *w, size_t n, tok_cache *c, tok_ids *out) {
    cache_slot *slot = NULL;
    uint32_t h = 0;
    if (c && n <= CACHE_KEY) {
        h = tok_hash(w, n);
        slot = cache_find(c, w, n, h);
        if (slot->key_len) {
            cache_get(c, slot, out);
            return;
        }
    }
    if (t->model == TOK_SPM) {
        int start = out->n;
        spm_word(t, w, n, out);
        if (slot) cache_put(c, slot, w, n, h, out->v + start, out->n - start);
        return;
    }
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(t, w, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            if (slot) cache_put(c, slot, w, n, h, &id, 1);
            return;
        }
    }
    int32_t small[WORD_STACK];
    /* never more symbols than bytes */
    int32_t *sym = n <= WORD_STACK ? small : xmalloc(n * sizeof *sym);
    int m = initial_symbols(t, w, n, sym);
    m = m <= MERGE_SMALL ? merge_small(t, sym, m) : merge_large(t, sym, m);
    for (int i = 0; i < m; i++) tok_ids_push(out, sym[i]);
    if (slot) cache_put(c, slot, w, n, h, sym, m);
    if (sym != small) free(sym);
}

/* ---- sentencepiece by score --------------------------------------------------- */

/* llama.cpp's "llama" tokenizer: start from UTF-8 chars, repeatedly join the
 * adjacent pair whose joined text is the vocabulary piece with the highest
 * score (leftmost on ties); what never became a piece falls back to bytes. */
typedef struct spm_sym {
    int32_t off, n;     /* text; n = 0 once merged into its left neighbour */
    int32_t prev, next;
} spm_sym;

typedef struct spm_big {
    float score;
    int32_t left, right, size;
} spm_big;

static int big_before(const spm_big *a, const spm_big *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct spm_heap {
    spm_big *v;
    int n;
    size_t cap;
} spm_heap;

static void big_push(spm_heap *h, spm_big e) {
    h->v = xgrow(h->v, &h->cap, (size_t)h->n + 1, sizeof *h->v);
    int i = h->n++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!big_before(&e, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
}

static spm_big big_pop(spm_heap *h) {
    spm_big top = h->v[0], last = h->v[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && big_before(&h->v[c + 1], &h->v[c])) c++;
        if (!big_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static void try_bigram(const dfl_tokenizer *t, const char *s, const spm_sym *sym, int l, int r,
                       spm_heap *h) {
    if (l < 0 || r < 0) return;
    int32_t n = sym[l].n + sym[r].n;
    int32_t id = tok_strmap_get(t, s + sym[l].off, (size_t)n);
    if (id < 0) return;
    big_push(h, (spm_big){t->score[id], l, r, n});
}

static void spm_word(const dfl_tokenizer *t, const char *s, size_t n, tok_ids *out) {
    if (!n) return;
    spm_sym small[WORD_STACK];
    spm_sym *sym = n <= WORD_STACK ? small : xmalloc(n * sizeof *sym);
    int m = 0;
    for (size_t off = 0; off < n;) {
        int l = dfl_tok_utf8_len((unsigned char)s[off]);
        if ((size_t)l > n - off) l = (int)(n - off);
        sym[m] = (spm_sym){(int32_t)off, l, m - 1, off + l == n ? -1 : m + 1};
        off += (size_t)l;
        m++;
    }
    spm_heap h = {0};
    for (int i = 1; i < m; i++) try_bigram(t, s, sym, i - 1, i, &h);
    while (h.n) {
        spm_big b = big_pop(&h);
        spm_sym *L = &sym[b.left], *R = &sym[b.right];
        if (!L->n || !R->n || L->n + R->n != b.size) continue;
        L->n += R->n;
        R->n = 0;
        L->next = R->next;
        if (R->next >= 0) sym[R->next].prev = b.left;
        try_bigram(t, s, sym, L->prev, b.left, &h);
        try_bigram(t, s, sym, b.left, L->next, &h);
    }
    for (int i = 0; i >= 0; i = sym[i].next) {
        int32_t id = tok_strmap_get(t, s + sym[i].off, (size_t)sym[i].n);
        if (id >= 0) {
            tok_ids_push(out, id);
            continue;
        }
        for (int j = 0; j < sym[i].n; j++) {
            int32_t b = t->byte_id[(unsigned char)s[sym[i].off + j]];
            if (b < 0) b = t->unk_id;
            if (b >= 0) tok_ids_push(out, b);
        }
    }
    free(h.v);
    if (sym != small) free(sym);
}

/* ---- splitting at word starts ------------------------------------------------ */

/* With text whose spaces became rep ("▁") and no pre-tokenizer, the model
 * would see a whole line as one word (slow, and nothing to cache). When no
 * vocabulary piece has rep after another character, no merge can join a
 * piece ending in a non-rep character with one starting with rep, so cutting
 * the text before each rep that follows a non-rep character changes nothing.
 * tok_set_rep_split checks that once at load. */
void tok_set_rep_split(dfl_tokenizer *t, const char *rep) {
    size_t rl = strlen(rep);
    t->rep_split = 0;
    if (!rl || rl >= sizeof t->rep || t->ignore_merges || tok_strmap_get(t, rep, rl) < 0) return;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *k = tok_key(t, id);
        size_t n = t->key_len[id], i = 0;
        while (i + rl <= n && !memcmp(k + i, rep, rl)) i += rl; /* a leading run is fine */
        for (; i < n; i++)
            if (i + rl <= n && !memcmp(k + i, rep, rl)) return;
    }
    memcpy(t->rep, rep, rl + 1);
    t->rep_split = 1;
}

void tok_word(const dfl_tokenizer *t, const char *w, size_t n, tok_cache *c, tok_ids *out) {
    if (!t->rep_split) {
        word(t, w, n, c, out);
        return;
    }
    size_t rl = strlen(t->rep), start = 0, i = 0;
    int prev_rep = 0;
    while (i < n) {
        int at_rep = i + rl <= n && !memcmp(w + i, t->rep, rl);
        if (at_rep && !prev_rep && i > start) {
            word(t, w + start, i - start, c, out);
            start = i;
        }
        prev_rep = at_rep;
        i += at_rep ? rl : 1;
    }
    word(t, w + start, n - start, c, out);
}
