/* calibrate.c - start-up round costs for the adaptive block policy.
 *
 * Without them the policy knows nothing until rounds have run, and its first
 * choices are guesses. Here one round per block size is timed as the loop
 * would run it at zero acceptance -- draft, verify forward with feature
 * capture, greedy acceptance, cache rollback, one committed row into the
 * drafter's side store -- on a private cache holding a short context, so
 * no session is touched. Block 1 is a classic step of the speculative loop
 * (forward with capture; its row reaches the side store later, batched with
 * other classic rows, which costs little per row). Each size runs twice
 * and keeps the faster; the loop's own measurements then take over. */
#include <string.h>

#include "engine.h"
#include "decode/decode.h"

enum { CAL_CTX = 16, CAL_REPS = 2 };

static const int cal_sizes[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};

typedef struct cal {
    dfl_target *t;
    dfl_kv *kv;
    dfl_dstore *ds;
    dfl_dflash_proposer dp;
    float *logits;    /* (bmax, vocab) */
    float *feat;      /* (bmax, n_cap*dim) */
    int32_t *tok;     /* (CAL_CTX + bmax) */
} cal;

/* One zero-acceptance round of block B at the end of the context; leaves
 * the cache and the side store as it found them. */
static int cal_round(cal *c, int B, double *sec, dfl_error *err) {
    dfl_proposer *pr = &c->dp.base;
    int pos = c->kv->len, vocab = c->t->c.vocab, rc = 0;
    int32_t block[64], tgt[64];
    block[0] = c->tok[pos];
    double t0 = dfl_now();
    if (B > 1) rc = pr->draft(pr, block[0], pos, B, block + 1, NULL, err);
    if (!rc)
        rc = dfl_target_forward(c->t, c->kv, block, B, 0, c->logits, pr->cap, pr->n_cap,
                                c->feat, err);
    if (rc) return rc;
    int a = dfl_accept_greedy(NULL, c->logits, vocab, block, B, pos, c->tok, NULL, tgt);
    (void)a;   /* timed as if nothing were accepted: one row is kept */
    dfl_kv_truncate(c->kv, pos + 1);
    if (B > 1) rc = pr->add_context(pr, c->feat, block, 1, err);
    *sec = dfl_now() - t0;
    dfl_kv_truncate(c->kv, pos);
    pr->truncate(pr, pos);
    return rc;
}

static void cal_free(cal *c) {
    dfl_kv_free(c->kv);
    dfl_dstore_free(c->ds);
    free(c->logits);
    free(c->feat);
    free(c->tok);
}

static int cal_cap(const dfl_engine *e, int bmax) {
    int m = e->max_block;
    if (e->t->max_rows < m) m = e->t->max_rows;
    if (e->d->max_rows < m) m = e->d->max_rows;
    if (e->costs.max_block < m) m = e->costs.max_block;
    if (bmax > 0 && bmax < m) m = bmax;
    return m > 64 ? 64 : m;
}

int dfl_spec_calibrate(dfl_engine *e, int bmax, dfl_error *err) {
    if (!e->t || !e->d) return 0;
    if (!e->costs.max_block) dfl_costs_init(&e->costs, e->max_block);
    bmax = cal_cap(e, bmax);
    double *t_round = e->costs.t_round[dfl_costs_depth(CAL_CTX)];   /* the rounds' depth */
    int todo[sizeof cal_sizes / sizeof cal_sizes[0]], n = 0;
    for (size_t i = 0; i < sizeof cal_sizes / sizeof cal_sizes[0]; i++)
        if (cal_sizes[i] <= bmax && !(t_round[cal_sizes[i]] > 0)) todo[n++] = cal_sizes[i];
    if (!n) return 0;

    dfl_target *t = e->t;
    int rows = CAL_CTX + bmax + 1, dim = t->c.dim;
    cal c = {.t = t};
    c.kv = dfl_kv_new(t, rows);
    c.ds = dfl_dstore_new(e->d, rows);
    dfl_dflash_proposer_init(&c.dp, e->d, c.ds);
    c.logits = dfl_aligned_alloc((size_t)bmax * t->c.vocab * sizeof(float));
    c.feat = dfl_aligned_alloc((size_t)(bmax > CAL_CTX ? bmax : CAL_CTX) * e->d->n_cap * dim *
                               sizeof(float));
    c.tok = xcalloc(rows, sizeof(int32_t));
    for (int i = 0; i < rows; i++) c.tok[i] = (int32_t)((1009u * (i + 1)) % (unsigned)t->c.vocab);

    /* the context the rounds continue, fed to the drafter as the loop would */
    dfl_proposer *pr = &c.dp.base;
    int rc = dfl_target_forward(t, c.kv, c.tok, CAL_CTX, CAL_CTX, NULL, pr->cap, pr->n_cap,
                                c.feat, err);
    if (!rc) rc = pr->add_context(pr, c.feat, c.tok, CAL_CTX, err);
    double warm;
    if (!rc) rc = cal_round(&c, 1, &warm, err);   /* first touch of the new cache */
    for (int i = 0; i < n && !rc; i++) {
        double best = 0, sec;
        for (int r = 0; r < CAL_REPS && !rc; r++) {
            rc = cal_round(&c, todo[i], &sec, err);
            if (!rc && (best == 0 || sec < best)) best = sec;
        }
        if (!rc && best > 0) t_round[todo[i]] = best;
    }
    cal_free(&c);
    return rc ? rc : n;
}
