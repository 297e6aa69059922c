/* propose.c - the proposers behind the seam: a drafter (DFlash, or the
 * target's MTP head) with its side store, and the n-gram lane. */
#include <string.h>

#include "decode/decode.h"

static dfl_dflash_proposer *self(dfl_proposer *p) { return (dfl_dflash_proposer *)p; }

static int add_context(dfl_proposer *p, const float *feat, const int32_t *tok, int n,
                       dfl_error *err) {
    dfl_dflash_proposer *x = self(p);
    if (x->d->mtp) return dfl_mtp_add_context(x->d, x->s, feat, tok, n, err);
    return dfl_drafter_add_context(x->d, x->s, feat, n, err);
}

static int draft(dfl_proposer *p, int32_t anchor, int pos, int B, int32_t *out, float *logits,
                 dfl_error *err) {
    dfl_dflash_proposer *x = self(p);
    if (pos != x->s->len)
        return dfl_fail(err, DFL_EARG, "draft at position %d, but the side store holds %d rows",
                        pos, x->s->len);
    return dfl_drafter_draft_n(x->d, x->s, anchor, dfl_dflash_draft_rows(x->d, x->s, B), B - 1,
                               logits, out, err);
}

/* A shorter verify still drafts the trained block's full width: the drafter
 * was trained on whole blocks, and its first drafts are worse when the block
 * is cut (stories260K's drafter: position-1 acceptance .37 at B = 2, .79 at
 * B = 8); the extra rows skip the lm_head. */
int dfl_dflash_draft_rows(const dfl_drafter *d, const dfl_dstore *s, int B) {
    int rows = d->block_size > B ? d->block_size : B;
    if (rows > d->max_rows) rows = d->max_rows;
    return s->len + rows > s->cap ? B : rows;
}

static void truncate_to(dfl_proposer *p, int n_keep) { dfl_dstore_truncate(self(p)->s, n_keep); }

static int len(const dfl_proposer *p) { return ((const dfl_dflash_proposer *)p)->s->len; }

static double spent(const dfl_proposer *p) { return ((const dfl_dflash_proposer *)p)->s->spent; }

static int skip(dfl_proposer *p, int n, dfl_error *err) { return dfl_dstore_skip(self(p)->s, n, err); }

void dfl_dflash_proposer_init(dfl_dflash_proposer *p, dfl_drafter *d, dfl_dstore *s) {
    p->base = (dfl_proposer){add_context, draft, truncate_to, len, d->cap, d->n_cap,
                             d->max_rows, spent};
    p->base.skip = d->mtp ? NULL : skip;   /* an MTP row fuses the next token: no holes */
    p->d = d;
    p->s = s;
}

const float *dfl_lane_feat(const int *cap, int n_cap, const dfl_proposer *p, const float *feat,
                           int n, int dim, float *buf) {
    if (!feat) return NULL;
    if (p->n_cap == n_cap && !memcmp(p->cap, cap, (size_t)n_cap * sizeof(int))) return feat;
    size_t d = (size_t)dim;
    for (int j = 0; j < p->n_cap; j++) {
        int k = 0;
        while (k < n_cap - 1 && cap[k] != p->cap[j]) k++;
        for (int i = 0; i < n; i++)
            memcpy(buf + ((size_t)i * p->n_cap + j) * d, feat + ((size_t)i * n_cap + k) * d,
                   d * sizeof(float));
    }
    return buf;
}

/* ---- the n-gram lane -------------------------------------------------------- */

static dfl_ngram_proposer *ng(dfl_proposer *p) { return (dfl_ngram_proposer *)p; }

static int ng_add_context(dfl_proposer *p, const float *feat, const int32_t *tok, int n,
                          dfl_error *err) {
    (void)feat;
    dfl_ngram *g = ng(p)->g;
    if (n < 0 || g->len + n > g->cap)
        return dfl_fail(err, DFL_ECTX, "n-gram history full: %d + %d tokens exceed %d", g->len,
                        n, g->cap);
    memcpy(g->tok + g->len, tok, (size_t)n * sizeof(int32_t));
    g->len += n;
    ng(p)->found_pos = -1;
    return 0;
}

/* The lookup over the history and the anchor (at g->tok[pos], one past the
 * committed rows: the cap leaves room, as the target cache's does). */
static int ng_offer(dfl_proposer *p, int32_t anchor, int pos) {
    dfl_ngram_proposer *x = ng(p);
    dfl_ngram *g = x->g;
    if (x->found_pos == pos && x->found_anchor == anchor) return x->found_n;
    x->found_pos = pos, x->found_anchor = anchor, x->found_n = 0;
    if (pos != g->len || pos >= g->cap) return 0;
    g->tok[pos] = anchor;
    if (dfl_ngram_lookup(g->tok, pos + 1, DFL_NGRAM_MAX_DRAFT, x->found))
        x->found_n = DFL_NGRAM_MAX_DRAFT;
    return x->found_n;
}

/* Without a match (a pinned block asks anyway) the drafts repeat the anchor:
 * verification rejects what is wrong, whatever it is. */
static int ng_draft(dfl_proposer *p, int32_t anchor, int pos, int B, int32_t *out, float *logits,
                    dfl_error *err) {
    dfl_ngram_proposer *x = ng(p);
    if (pos != x->g->len)
        return dfl_fail(err, DFL_EARG, "n-gram draft at position %d, but the history holds %d",
                        pos, x->g->len);
    if (B - 1 > DFL_NGRAM_MAX_DRAFT)
        return dfl_fail(err, DFL_EARG, "n-gram block %d over %d", B, DFL_NGRAM_MAX_DRAFT + 1);
    int n = ng_offer(p, anchor, pos);
    for (int i = 0; i < B - 1; i++) out[i] = i < n ? x->found[i] : anchor;
    (void)logits;   /* none: the lane has no distribution (rules that read one fall back) */
    return 0;
}

static void ng_truncate(dfl_proposer *p, int n_keep) {
    dfl_ngram_proposer *x = ng(p);
    if (n_keep >= 0 && n_keep < x->g->len) x->g->len = n_keep;
    x->found_pos = -1;
}

static int ng_len(const dfl_proposer *p) { return ((const dfl_ngram_proposer *)p)->g->len; }

void dfl_ngram_proposer_init(dfl_ngram_proposer *p, dfl_ngram *g) {
    memset(p, 0, sizeof *p);
    p->base = (dfl_proposer){ng_add_context, ng_draft, ng_truncate, ng_len, NULL, 0,
                             DFL_NGRAM_MAX_DRAFT + 1, NULL, ng_offer};
    p->g = g;
    p->found_pos = -1;
}
