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
 * and keeps the faster; the loop's own measurements then take over.
 * The n-gram lane's rounds are the same less the draft (its lookup costs
 * microseconds), with the drafter, when there is one, still fed: they get
 * a table of their own. So do the MTP lane's beside a drafter (drafted by
 * the head; the verify captures both lanes' layers and feeds both). */
#include <string.h>

#include "engine.h"
#include "decode/decode.h"

enum { CAL_CTX = 16, CAL_REPS = 2 };

static const int cal_sizes[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};

typedef struct cal {
    dfl_target *t;
    dfl_kv *kv;
    dfl_dstore *ds[2];   /* the drafter's and the MTP lane's stores, NULL without */
    dfl_dflash_proposer dp[2];
    dfl_proposer *pr[2]; /* &dp[i].base, or NULL */
    const int *cap;      /* (n_cap) the layers the verify captures: e->cap */
    int n_cap;
    float *logits;       /* (bmax, vocab) */
    float *feat;         /* (bmax, n_cap*dim) */
    float *fsub;         /* (bmax, the larger lane n_cap*dim) one lane's layers of feat */
    int32_t *tok;        /* (CAL_CTX + bmax) */
} cal;

/* Rows feat[0..n) into every model lane's store, each its own layers. */
static int cal_feed(cal *c, const int32_t *tok, int n, dfl_error *err) {
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++)
        if (c->pr[i])
            rc = c->pr[i]->add_context(c->pr[i], dfl_lane_feat(c->cap, c->n_cap, c->pr[i], c->feat,
                                                               n, c->t->c.dim, c->fsub),
                                       tok, n, err);
    return rc;
}

/* One zero-acceptance round of block B at the end of the context, drafted
 * by model lane pr[draft - 1] when draft is set (else an n-gram round: no
 * draft pass); leaves the cache and the side stores as it found them. */
static int cal_round(cal *c, int B, int draft, double *sec, dfl_error *err) {
    dfl_proposer *pr = draft ? c->pr[draft - 1] : NULL;
    int pos = c->kv->len, vocab = c->t->c.vocab, rc = 0;
    int32_t block[64], tgt[64];
    block[0] = c->tok[pos];
    for (int i = 1; i < B; i++) block[i] = c->tok[pos];
    double t0 = dfl_now();
    if (B > 1 && pr) rc = pr->draft(pr, block[0], pos, B, block + 1, NULL, err);
    if (!rc)
        rc = dfl_target_forward(c->t, c->kv, block, B, 0, c->logits, c->n_cap ? c->cap : NULL,
                                c->n_cap, c->feat, err);
    if (rc) return rc;
    int a = dfl_accept_greedy(NULL, c->logits, vocab, block, B, pos, c->tok, NULL, tgt);
    (void)a;   /* timed as if nothing were accepted: one row is kept */
    dfl_kv_truncate(c->kv, pos + 1);
    if (B > 1) rc = cal_feed(c, block, 1, err);
    *sec = dfl_now() - t0;
    dfl_kv_truncate(c->kv, pos);
    for (int i = 0; i < 2; i++)
        if (c->pr[i]) c->pr[i]->truncate(c->pr[i], pos);
    return rc;
}

static void cal_free(cal *c) {
    dfl_kv_free(c->kv);
    dfl_dstore_free(c->ds[0]);
    dfl_dstore_free(c->ds[1]);
    free(c->logits);
    free(c->feat);
    free(c->fsub);
    free(c->tok);
}

/* The largest block a lane's table is measured to: drafted by d, or the
 * n-gram lane's (d NULL). */
static int cal_cap(const dfl_engine *e, const dfl_costs *costs, const dfl_drafter *d, int bmax) {
    int m = d ? dfl_engine_lane_block(e, d) : e->max_block;
    if (e->t->max_rows < m) m = e->t->max_rows;
    if (d && d->max_rows < m) m = d->max_rows;
    if (!d && DFL_NGRAM_MAX_DRAFT + 1 < m) m = DFL_NGRAM_MAX_DRAFT + 1;
    if (costs->max_block < m) m = costs->max_block;
    if (bmax > 0 && bmax < m) m = bmax;
    return m > 64 ? 64 : m;
}

/* The sizes up to bmax a table lacks at the rounds' depth. */
static int cal_todo(const dfl_costs *costs, int bmax, int *todo) {
    const double *t_round = costs->t_round[dfl_costs_depth(CAL_CTX)];
    int n = 0;
    for (size_t i = 0; i < sizeof cal_sizes / sizeof cal_sizes[0]; i++)
        if (cal_sizes[i] <= bmax && !(t_round[cal_sizes[i]] > 0)) todo[n++] = cal_sizes[i];
    return n;
}

static int cal_table(cal *c, dfl_costs *costs, int draft, const int *todo, int n,
                     dfl_error *err) {
    double *t_round = costs->t_round[dfl_costs_depth(CAL_CTX)];
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        double best = 0, sec;
        for (int r = 0; r < CAL_REPS && !rc; r++) {
            rc = cal_round(c, todo[i], draft, &sec, err);
            if (!rc && (best == 0 || sec < best)) best = sec;
        }
        if (!rc && best > 0) t_round[todo[i]] = best;
    }
    return rc;
}

/* Two facts no single timing can break, applied to the calibration depth:
 * a classic step is the same step in every lane's table, so each gets the
 * fastest of the lanes' measurements of it; and a round never costs less
 * than a round of fewer rows, so no size keeps a time above a larger one's.
 * A few milliseconds' stall on a loaded machine can cover both reps of a
 * cheap size; the lane whose classic step it inflated then saw speculation
 * as cheap, won every bid at zero acceptance, and never ran the classic
 * step that would have corrected it. */
static void cal_settle(dfl_costs **tab, int n) {
    int d = dfl_costs_depth(CAL_CTX);
    double t1 = 0;
    for (int i = 0; i < n; i++) {
        double v = tab[i]->t_round[d][1];
        if (v > 0 && (t1 == 0 || v < t1)) t1 = v;
    }
    for (int i = 0; i < n; i++) {
        double *t = tab[i]->t_round[d], low = 0;
        if (t[1] > 0) t[1] = t1;
        for (int b = tab[i]->max_block; b >= 1; b--)
            if (t[b] > 0) low = t[b] = low > 0 && low < t[b] ? low : t[b];
    }
}

int dfl_spec_calibrate(dfl_engine *e, int bmax, dfl_error *err) {
    if (!e->t || (!e->d && !e->opts.ngram)) return 0;
    if (!e->costs.max_block) dfl_costs_init(&e->costs, e->max_block);
    if (!e->costs_ngram.max_block) dfl_costs_init(&e->costs_ngram, e->max_block);
    if (!e->costs_mtp.max_block) dfl_costs_init(&e->costs_mtp, e->max_block);
    enum { NS = sizeof cal_sizes / sizeof cal_sizes[0] };
    int bd = e->d ? cal_cap(e, &e->costs, e->d, bmax) : 0;
    int bn = e->opts.ngram ? cal_cap(e, &e->costs_ngram, NULL, bmax) : 0;
    int bm = e->mtp ? cal_cap(e, &e->costs_mtp, e->mtp, bmax) : 0;
    int todo_d[NS], todo_n[NS], todo_m[NS];
    int nd = e->d ? cal_todo(&e->costs, bd, todo_d) : 0;
    int nn = e->opts.ngram ? cal_todo(&e->costs_ngram, bn, todo_n) : 0;
    int nm = e->mtp ? cal_todo(&e->costs_mtp, bm, todo_m) : 0;
    if (!nd && !nn && !nm) return 0;

    dfl_target *t = e->t;
    int top = bd > bn ? bd : bn, dim = t->c.dim;
    top = bm > top ? bm : top;
    int rows = CAL_CTX + top + 1, n_cap = e->n_cap, fr = top > CAL_CTX ? top : CAL_CTX;
    cal c = {.t = t, .cap = e->cap, .n_cap = n_cap};
    c.kv = dfl_kv_new(t, rows);
    dfl_drafter *m[2] = {e->d, e->mtp};
    for (int i = 0; i < 2; i++) {
        if (!m[i]) continue;
        c.ds[i] = dfl_dstore_new(m[i], rows);
        dfl_dflash_proposer_init(&c.dp[i], m[i], c.ds[i]);
        c.pr[i] = &c.dp[i].base;
    }
    c.logits = dfl_aligned_alloc((size_t)top * t->c.vocab * sizeof(float));
    c.feat = dfl_aligned_alloc((size_t)fr * (n_cap ? n_cap : 1) * dim * sizeof(float));
    if (e->mtp) c.fsub = dfl_aligned_alloc((size_t)fr * n_cap * dim * sizeof(float));
    c.tok = xcalloc(rows, sizeof(int32_t));
    for (int i = 0; i < rows; i++) c.tok[i] = (int32_t)((1009u * (i + 1)) % (unsigned)t->c.vocab);

    /* the context the rounds continue, fed to the model lanes as the loop would */
    int rc = dfl_target_forward(t, c.kv, c.tok, CAL_CTX, CAL_CTX, NULL, n_cap ? c.cap : NULL,
                                n_cap, c.feat, err);
    if (!rc) rc = cal_feed(&c, c.tok, CAL_CTX, err);
    double warm;
    if (!rc) rc = cal_round(&c, 1, 0, &warm, err);   /* first touch of the new cache */
    if (!rc) rc = cal_table(&c, &e->costs, 1, todo_d, nd, err);
    if (!rc) rc = cal_table(&c, &e->costs_ngram, 0, todo_n, nn, err);
    if (!rc) rc = cal_table(&c, &e->costs_mtp, 2, todo_m, nm, err);
    if (!rc) cal_settle((dfl_costs *[]){&e->costs, &e->costs_ngram, &e->costs_mtp}, 3);
    cal_free(&c);
    return rc ? rc : nd + nn + nm;
}
