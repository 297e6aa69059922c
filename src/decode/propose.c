/* propose.c - a drafter (DFlash, or the target's MTP head) and its side store
 * behind the proposer seam. */
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

void dfl_dflash_proposer_init(dfl_dflash_proposer *p, dfl_drafter *d, dfl_dstore *s) {
    p->base = (dfl_proposer){add_context, draft, truncate_to, len, d->cap, d->n_cap,
                             d->max_rows, spent};
    p->d = d;
    p->s = s;
}
