/* loop.c - the round loop: prefill, then rounds of draft, verify, accept,
 * commit, roll back. Classic decode is the same loop with one-row blocks.
 *
 * The prompt's last token is the first round's anchor: the prefill runs
 * rows 0..n-2 and the first verify block starts with prompt[n-1], so a
 * drafter can already propose the first generated tokens (its context is the
 * prompt rows before the anchor, as in training). */
#include <string.h>

#include "sample/sample.h"
#include "decode/decode.h"

/* ---- acceptance ----------------------------------------------------------- */

int dfl_accept_greedy(void *ud, const float *logits, int vocab, const int32_t *block, int B,
                      int pos, const int32_t *hist, const float *dlogits, int32_t *tgt) {
    (void)ud, (void)pos, (void)hist, (void)dlogits;
    int a = 0;
    for (int i = 0; i < B; i++) {
        tgt[i] = dfl_argmax(logits + (size_t)i * vocab, vocab);
        if (i + 1 >= B || block[i + 1] != tgt[i]) break;
        a++;
    }
    return a;
}

/* ---- helpers -------------------------------------------------------------- */

static int imin(int a, int b) { return a < b ? a : b; }

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = imin(na, nb), i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* ---- lanes ---------------------------------------------------------------- */

static dfl_proposer *lane_proposer(const dfl_seq *q, int lane) {
    return lane == DFL_LANE_NGRAM ? q->ng : lane == DFL_LANE_MTP ? q->mt : q->pr;
}

/* Features the verify forward captures: the model lanes' (the drafter's,
 * with the MTP lane the union q->cap), on every round whichever lane
 * drafted it, since they read every committed row. */
static int seq_ncap(const dfl_seq *q) {
    if (!q->feat) return 0;
    return q->cap ? q->n_cap : q->pr ? q->pr->n_cap : 0;
}

static const int *seq_cap(const dfl_seq *q) { return q->cap ? q->cap : q->pr ? q->pr->cap : NULL; }

/* The lanes that read the target's features (a drafter, an MTP head):
 * their rows park behind classic steps and reach them batched. */
static int feed_models(dfl_seq *q, const float *feat, const int32_t *tok, int n, dfl_error *err) {
    dfl_proposer *m[2] = {q->pr, q->mt};
    int nc = seq_ncap(q), rc = 0;
    for (int i = 0; i < 2 && !rc; i++)
        if (m[i])
            rc = m[i]->add_context(m[i], nc ? dfl_lane_feat(seq_cap(q), nc, m[i], feat, n,
                                                             q->t->c.dim, q->fsub) : NULL,
                                   tok, n, err);
    return rc;
}

/* Every lane is fed every committed row: a lane that sat rounds out drafts
 * from the whole sequence when its turn comes. feat: (n, n_cap*dim) rows. */
static int feed_lanes(dfl_seq *q, const float *feat, const int32_t *tok, int n, dfl_error *err) {
    int rc = feed_models(q, feat, tok, n, err);
    if (!rc && q->ng) rc = q->ng->add_context(q->ng, NULL, tok, n, err);
    return rc;
}

/* Seconds of the model lanes' drafter passes charged to the sequence so far;
 * *kept 0 when no lane counts them (the loop then charges wall time). */
static double lanes_spent(const dfl_seq *q, int *kept) {
    const dfl_proposer *m[2] = {q->pr, q->mt};
    double s = 0;
    *kept = 0;
    for (int i = 0; i < 2; i++)
        if (m[i] && m[i]->spent) s += m[i]->spent(m[i]), *kept = 1;
    return s;
}

/* Whether every model lane can leave a hole in its store (proposer.skip). */
static int can_skip(const dfl_seq *q) {
    const dfl_proposer *m[2] = {q->pr, q->mt};
    for (int i = 0; i < 2; i++)
        if (m[i] && !m[i]->skip) return 0;
    return 1;
}

/* n positions become a hole in every model lane's store (can_skip). */
static int skip_models(dfl_seq *q, int n, dfl_error *err) {
    dfl_proposer *m[2] = {q->pr, q->mt};
    int rc = 0;
    for (int i = 0; i < 2 && !rc && n > 0; i++)
        if (m[i]) rc = m[i]->skip(m[i], n, err);
    return rc;
}

/* Rows a held sequence keeps of those the drafter would be fed (parked rows,
 * a prompt's): the newest, so a drafter has the latest context when the
 * crowd lets it draft again. */
enum { PARK_KEEP = 7 };

/* dfl_spec_prefill; with a gate (may_hole), when the first chunk's forward
 * is done in a crowd not expected to draft soon (dfl_gate_idle: the crowd
 * has formed by then), the rows but the newest PARK_KEEP skip the model
 * lanes, a hole in their stores (the n-gram lane takes every row: it costs
 * nothing). */
static int prefill(dfl_seq *q, const int32_t *tok, int n, int feed, dfl_gate *may_hole,
                   dfl_error *err) {
    feed = feed && (q->pr || q->ng || q->mt);
    int n_cap = feed ? seq_ncap(q) : 0, hole = 0;
    size_t fd = (size_t)n_cap * q->t->c.dim;
    for (int a = 0; a < n;) {
        int m = imin(n - a, q->t->max_rows), pos = q->kv->len;
        int rc = dfl_target_forward(q->t, q->kv, tok + a, m, m, NULL, n_cap ? seq_cap(q) : NULL,
                                    n_cap, q->feat, err);
        if (rc) return rc;
        memcpy(q->hist + pos, tok + a, (size_t)m * sizeof(int32_t));
        if (!a && may_hole && n > PARK_KEEP && dfl_gate_idle(may_hole, dfl_target_active(q->t)))
            hole = n - PARK_KEEP;
        int s = hole > a ? imin(m, hole - a) : 0;
        if (feed && s) rc = skip_models(q, s, err);
        if (feed && s && !rc && q->ng) rc = q->ng->add_context(q->ng, NULL, tok + a, s, err);
        if (feed && s < m && !rc) rc = feed_lanes(q, fd ? q->feat + fd * s : q->feat, tok + a + s,
                                                  m - s, err);
        if (rc) return rc;
        a += m;
    }
    return 0;
}

int dfl_spec_prefill(dfl_seq *q, const int32_t *tok, int n, int feed, dfl_error *err) {
    return prefill(q, tok, n, feed, NULL, err);
}

/* ---- one round ------------------------------------------------------------ */

typedef struct run {
    dfl_seq *q;
    const dfl_loop_opts *o;
    dfl_token_fn cb;
    void *ud;
    dfl_stats *st;
    int spec;             /* a proposer drafts, and is fed every committed row */
    int gen;              /* tokens committed by this call */
    int32_t anchor;
    int stop;
    int pending;          /* classic rows whose features wait in feat rows 1.. */
    int tree_max;         /* nodes a draft tree may have in this call (0: chain only) */
    int gated;            /* the crowd gate holds this round to a classic step */
    int crowded;          /* other sequences' rows share this round's forward */
    int first;            /* an adaptive call's first token: a classic step */
    double crowd;         /* tokens per second of the shared forwards of its classic steps
                             (moving average; 0: none seen yet) */
    int32_t shadow[DFL_MAX_BLOCK];   /* a held probe's drafts (shadow_start) */
    int shadow_b, shadow_at;         /* its block (0: none under way), drafts matched so far */
} run;

/* Commits token id chosen from logits row, produced as kind (DFL_TOKEN_*);
 * returns nonzero when it ends generation. */
static int commit(run *r, int32_t id, int kind, const float *row) {
    const dfl_loop_opts *o = r->o;
    dfl_token_info ti;
    memset(&ti, 0, sizeof ti);
    ti.id = id;
    ti.kind = kind;
    if (!o->no_logprob || o->n_top_logprobs > 0)
        dfl_logprobs(row, r->q->t->c.vocab, id, o->n_top_logprobs, &ti);
    r->gen++;
    r->st->n_gen++;
    int cancel = r->cb ? r->cb(r->ud, &ti) : 0;
    if (o->is_stop && o->is_stop(o->stop_ud, id)) r->stop = DFL_STOP_EOS;
    else if (cancel) r->stop = DFL_STOP_CANCEL;
    return r->stop != DFL_STOP_NONE;
}

static void count_round(run *r, int B, int lane, int a, int emitted) {
    dfl_stats *st = r->st;
    if (B == 1) {
        st->classic_steps++;
        return;
    }
    /* A stop inside the accepted drafts ends the round early: the drafts after
     * it were never committed, and are not counted, so `accepted` is the number
     * of tokens the caller saw as DFL_TOKEN_DRAFT. */
    a = imin(a, emitted);
    st->lane_rounds[lane]++;
    st->lane_proposed[lane] += B - 1;
    st->lane_accepted[lane] += a;
    st->lane_committed[lane] += emitted;
    st->rounds++;
    st->proposed += B - 1;
    st->accepted += a;
    st->committed += emitted;
    for (int i = 0; i < B - 1 && i < DFL_MAX_POS_STATS; i++) {
        st->pos_proposed[i]++;
        if (i < a) st->pos_accepted[i]++;
    }
}

/* Classic steps of a speculative run park their row's features behind row 0
 * of feat, and the proposer gets them in one call before the next draft (or
 * when the buffer is full, or at the end): one batched drafter pass instead of
 * one per token, so adaptive decoding that sits in classic mode costs what
 * classic decode costs. Only classic steps park: a block overwrites rows
 * 0..B-1, and every block is preceded by a flush. */
static int flush_pending(run *r, dfl_error *err) {
    dfl_seq *q = r->q;
    if (!r->pending) return 0;
    size_t fd = (size_t)seq_ncap(q) * q->t->c.dim;
    int n = r->pending;
    r->pending = 0;
    /* the parked rows end at kv->len */
    return feed_models(q, fd ? q->feat + fd : NULL, q->hist + q->kv->len - n, n, err);
}

/* While the crowd gate holds a sequence to classic steps, feeding its
 * drafter every row cost a crowd of 4 about 5% of its rate (a 0.6B target
 * with a 5-layer drafter, measured): the oldest parked rows become a hole in
 * the drafter's store instead, when every model lane can have one. The same
 * holds when a crowded sequence's own policy keeps to classic steps: four
 * clients at tau 3 whose requests took 0-1 rounds each, their rows fed 63 at a
 * time, ran 0.88x a classic server (Zen 5; 0.94x after this change). Alone
 * the rows are fed: a probe drafts with the whole context. */
static int skip_parked(run *r, dfl_error *err) {
    dfl_seq *q = r->q;
    if (!can_skip(q)) return flush_pending(r, err);
    int n = r->pending - PARK_KEEP, rc = skip_models(q, n, err);
    size_t fd = (size_t)seq_ncap(q) * q->t->c.dim;
    if (fd) memmove(q->feat + fd, q->feat + fd * (1 + n), fd * PARK_KEEP * sizeof(float));
    r->pending = PARK_KEEP;
    return rc;
}

/* Parked rows reach the drafter: all of them alone; in a crowd or under the
 * gate only the newest PARK_KEEP, the rest becoming a hole. */
static int settle_parked(run *r, dfl_error *err) {
    return (r->gated || r->crowded) && r->pending > PARK_KEEP ? skip_parked(r, err)
                                                              : flush_pending(r, err);
}

/* The gate, when this call's rows may become a hole in a crowd not
 * expected to draft soon (dfl_gate_idle). */
static dfl_gate *hole_gate(const run *r) {
    const dfl_loop_opts *o = r->o;
    return r->spec && o->block == 0 && o->tree_budget <= 0 && can_skip(r->q) ? o->gate : NULL;
}

static int held_idle(const run *r) {
    dfl_gate *g = hole_gate(r);
    return g && dfl_gate_idle(g, dfl_target_active(r->q->t));
}

/* At the end of a call the parked rows reach the proposer, in step with the
 * cache for the next call; held idle (held_idle) they all become a hole (the
 * newest PARK_KEEP were kept to draft again in this call, which is over):
 * their feed was a drafter pass a request that the whole crowd waited for. */
static int end_parked(run *r, dfl_error *err) {
    if (r->pending && held_idle(r)) {
        int n = r->pending;
        r->pending = 0;
        return skip_models(r->q, n, err);
    }
    int rc = settle_parked(r, err);
    return rc ? rc : flush_pending(r, err);
}

/* A classic step's row: the n-gram lane takes it at once (its next lookup
 * reads it, and costs nothing), the model lanes' features wait parked. */
static int park_row(run *r, dfl_error *err) {
    dfl_seq *q = r->q;
    int rc = q->ng ? q->ng->add_context(q->ng, NULL, q->hist + q->kv->len - 1, 1, err) : 0;
    if (rc || (!q->pr && !q->mt)) return rc;
    size_t fd = (size_t)seq_ncap(q) * q->t->c.dim;
    if (fd) memcpy(q->feat + fd * (1 + r->pending), q->feat, fd * sizeof(float));
    r->pending++;
    if (1 + r->pending < q->t->max_rows) return 0;
    return settle_parked(r, err);
}

/* While the crowd gate holds a sequence to classic steps, its policy never
 * probes, and the gate lets a crowd speculate only once a held slot wants
 * to: after a replay server's warm-up, whose drafts matched nothing, held
 * slots expected 2 tokens of a block of 8 (not about 5), and five of six
 * waves of two clients at tau 6.5 took no speculative round. So a held
 * slot probes all the same, on its drafter policy's schedule, but checks
 * the drafts against the classic steps that follow: greedy, a verify
 * accepts exactly the drafts that match them, and the crowd's forward
 * carries no extra row. Each probe still costs the crowd a drafter pass
 * (its lm_head alone reads 160 MB beside a 0.6B target); eight held slots
 * probing on a lone slot's schedule ran 0.90x classic steps at tau 6.5, so
 * the schedule is stretched by the crowd's size, and the crowd's probes
 * share a budget of its time (DFL_GATE_PROBE_SHARE). Starts one when due. */
static int shadow_start(run *r, dfl_policy *p, int active, dfl_error *err) {
    dfl_seq *q = r->q;
    if (r->shadow_b || !q->pr || r->o->accept || r->o->max_tokens - r->gen < 2) return 0;
    int B = imin(dfl_policy_held_probe(p, active), r->o->max_tokens - r->gen);
    if (B < 2) return 0;
    dfl_gate *g = r->o->gate;
    double t0 = dfl_now();
    /* over the crowd's budget, or held by the gate's evidence: due again next step */
    if (g && !dfl_gate_probe_ok(g, t0, active)) {
        dfl_policy_skip(p);
        return 0;
    }
    int rc = settle_parked(r, err);
    if (!rc) rc = flush_pending(r, err);
    if (!rc) {
        q->hist[q->kv->len] = r->anchor;
        rc = q->pr->draft(q->pr, r->anchor, q->kv->len, B, r->shadow, NULL, err);
    }
    if (g) dfl_gate_probe_spent(g, active, dfl_now() - t0);
    if (!rc) r->shadow_b = B, r->shadow_at = 0;
    return rc;
}

/* A classic step committed id: the held probe under way checks its next draft. */
static void shadow_check(run *r, dfl_policy *p, int32_t id) {
    if (!r->shadow_b) return;
    if (id == r->shadow[r->shadow_at] && ++r->shadow_at < r->shadow_b - 1) return;
    dfl_policy_observe(p, r->shadow_b, r->shadow_at);
    r->shadow_b = 0;
}

/* What the forward of a round cost its sequence: its time alone, or, when it
 * carried other sequences' rows, the marginal cost of its own rows in that
 * batch: its rows times what a row adds to a forward. The weights are read
 * for the others anyway, so a plain step's row costs its arithmetic and a
 * verify block B times that; under load the policy then sees that a block
 * pays only while its drafts beat its rows, and backs off to steps. The wait
 * for the others is not counted. */
static double marginal(const dfl_target *t, const dfl_fwd *f, double call) {
    if (!f->others) return call;
    double b = dfl_target_row_cost(t);
    if (b > 0) return b * f->n;
    return f->seconds * f->n / (f->others + f->n);
}

/* Drafts B-1 tokens after the anchor (B > 1) from the lane's proposer,
 * verifies the block with capture, commits, rolls back. A model lane (the
 * drafter, the MTP head) drafts with its own rows for a rule that reads
 * them; the n-gram lane has no distribution: its rounds run without drafter
 * rows, so a rule that reads them (rejection) keeps the exact rule's choice. */
static int round_step(run *r, int B, int lane, int *accepted, double *cost, dfl_error *err) {
    dfl_seq *q = r->q;
    dfl_proposer *pr = lane_proposer(q, lane);
    const dfl_loop_opts *o = r->o;
    dfl_target *t = q->t;
    int vocab = t->c.vocab, pos = q->kv->len, rc, by_model = lane != DFL_LANE_NGRAM, kept_s;
    int32_t block[DFL_MAX_BLOCK], tgt[DFL_MAX_BLOCK];
    block[0] = r->anchor;
    float *dlog = o->need_dlogits && by_model ? q->dlogits : NULL;
    double s0 = lanes_spent(q, &kept_s), t0 = dfl_now();
    q->hist[pos] = r->anchor;   /* pos < cap: checked by the caller */
    if (B > 1 && (rc = flush_pending(r, err))) return rc;
    if (B > 1 && (rc = pr->draft(pr, r->anchor, pos, B, block + 1, dlog, err))) return rc;
    if (B > 1 && o->redraft && by_model)
        o->redraft(o->accept_ud, dlog, B - 1, q->hist, pos, block + 1);
    double t1 = dfl_now();
    int n_cap = r->spec ? seq_ncap(q) : 0;
    dfl_fwd f = {.kv = q->kv, .tok = block, .n = B, .logits = q->logits,
                 .cap = n_cap ? seq_cap(q) : NULL, .n_cap = n_cap, .feat = q->feat};
    if ((rc = dfl_target_forward_ex(t, &f, err))) return rc;
    double t2 = dfl_now();
    /* The crowd's rate, from its plain ticks: the others' rows are tokens only
     * when each stepped one. A neighbour's prefill chunk counted its rows as
     * tokens: a fresh crowd of four, its prompts prefilling, priced its first
     * rounds at 450 tok/s against the 130 it made (a Zen 4 trace). */
    if (B == 1 && f.others && f.others == f.other_seqs && f.seconds > 0) {
        double l = (f.others + 1) / f.seconds;
        r->crowd = r->crowd > 0 ? 0.8 * r->crowd + 0.2 * l : l;
    }
    dfl_accept_fn accept = o->accept ? o->accept : dfl_accept_greedy;
    int a = accept(o->accept_ud, q->logits, vocab, block, B, pos, q->hist, dlog, tgt);
    int emitted = 0;
    for (int i = 1; i <= a + 1; i++) {
        int32_t id = i <= a ? block[i] : tgt[a];
        int kind = B == 1 ? DFL_TOKEN_CLASSIC : i <= a ? DFL_TOKEN_DRAFT : DFL_TOKEN_BONUS;
        emitted++;
        if (commit(r, id, kind, q->logits + (size_t)(i - 1) * vocab)) break;
    }
    /* Rows 0..kept-1 hold the anchor and the committed drafts; the rest
     * (rejected drafts) leave the target cache, and only the kept rows'
     * features reach the proposer. The bonus has no row yet. */
    int kept = 1 + imin(emitted, a);
    memcpy(q->hist + pos, block, (size_t)kept * sizeof(int32_t));
    dfl_kv_truncate(q->kv, pos + kept);
    double t3 = dfl_now();
    if (r->spec && B == 1) rc = park_row(r, err);
    else if (r->spec) rc = feed_lanes(q, q->feat, block, kept, err);
    if (rc) return rc;
    double t4 = dfl_now();
    r->anchor = tgt[a];
    r->st->t_draft += (t1 - t0) + (t4 - t3);
    r->st->t_verify += t2 - t1;
    count_round(r, B, lane, a, emitted);
    *accepted = a;
    /* the drafter's passes, like the forward, at their marginal cost: its
     * share of passes that carried other sequences' work (the n-gram
     * lookup's microseconds are left out) */
    double drafter = kept_s ? lanes_spent(q, &kept_s) - s0 : (t1 - t0) + (t4 - t3);
    *cost = drafter + (t3 - t2) + marginal(t, &f, t2 - t1);
    if (f.others) r->st->shared_forwards++, r->st->shared_rows += (uint64_t)f.others;
    return 0;
}

/* ---- draft trees (DDTree) ------------------------------------------------------ */

/* Depths a tree of N nodes drafts: no deeper than the drafter's block, the
 * drafter rows q->dlogits holds, nor the tokens left to generate (the walk
 * commits at most one per depth, and the bonus). */
static int tree_depths(const run *r, int N) {
    const dfl_seq *q = r->q;
    int d = imin(imin(N, q->tree_depth), imin(q->pr->max_block, q->max_block) - 1);
    return imin(d, r->o->max_tokens - r->gen - 1);
}

static void count_tree(run *r, const dfl_tree *tr, int a, int emitted) {
    dfl_stats *st = r->st;
    int depths = 0;
    for (int i = 0; i < tr->n; i++) depths = tr->depth[i] > depths ? tr->depth[i] : depths;
    a = imin(a, emitted);
    st->lane_rounds[DFL_LANE_DRAFTER]++;
    st->lane_proposed[DFL_LANE_DRAFTER] += tr->n - 1;
    st->lane_accepted[DFL_LANE_DRAFTER] += a;
    st->lane_committed[DFL_LANE_DRAFTER] += emitted;
    st->rounds++, st->proposed += tr->n - 1, st->accepted += a, st->committed += emitted;
    st->tree_rounds++, st->tree_nodes += tr->n - 1, st->tree_accepted += a;
    for (int i = 0; i <= a && i < depths && i < DFL_MAX_POS_STATS; i++) {
        st->pos_proposed[i]++;   /* depth i + 1 was tried: every depth above it accepted */
        if (i < a) st->pos_accepted[i]++;
    }
}

/* Walks the target's choices down the verified tree from the root: at each
 * node the token the target picks there (argmax, or the rule's keyed sample
 * with the node's path as history), into the child that drafted it, until
 * no child did: that choice is the bonus. Commits as it goes; path gets the
 * rows kept (the root, then the accepted nodes); returns how many. */
static int tree_walk(run *r, const dfl_tree *tr, int pos, int *path, int *emitted) {
    dfl_seq *q = r->q;
    const dfl_loop_opts *o = r->o;
    int vocab = q->t->c.vocab, kept = 1, node = 0;
    path[0] = 0;
    for (;;) {
        const float *row = q->logits + (size_t)node * vocab;
        int n_hist = pos + tr->depth[node] + 1;   /* hist[pos + d]: the path's tokens */
        int32_t id = o->choose ? o->choose(o->accept_ud, row, q->hist, n_hist)
                               : dfl_argmax(row, vocab);
        int child = dfl_tree_child(tr, node, id);
        (*emitted)++;
        if (child >= 0) q->hist[n_hist] = id, path[kept++] = child;
        else r->anchor = id;
        if (commit(r, id, child >= 0 ? DFL_TOKEN_DRAFT : DFL_TOKEN_BONUS, row) || child < 0)
            return kept;
        node = child;
    }
}

/* One drafter round verified as a best-first tree of N nodes in one forward
 * (rows tagged with their parents), the accepted path's K/V and features
 * then moved where a chain would have left them. */
static int tree_round(run *r, int N, dfl_tree *tr, int *accepted, double *cost, dfl_error *err) {
    dfl_seq *q = r->q;
    dfl_proposer *pr = q->pr;
    dfl_target *t = q->t;
    int pos = q->kv->len, rc, depths = tree_depths(r, N), kept_s;
    int32_t drafts[DFL_MAX_TREE];
    double s0 = lanes_spent(q, &kept_s), t0 = dfl_now();
    q->hist[pos] = r->anchor;
    if ((rc = flush_pending(r, err))) return rc;
    if ((rc = pr->draft(pr, r->anchor, pos, depths + 1, drafts, q->dlogits, err))) return rc;
    /* the largest tree's mass tells the policy of every budget; a budget's tree
     * is its first N nodes (best-first pops are a prefix of a larger tree's) */
    dfl_tree_cands c;
    dfl_tree_topk(q->dlogits, depths, t->c.vocab, r->tree_max, &c);
    dfl_tree_build(&c, r->tree_max, r->anchor, tr);
    tr->n = imin(tr->n, N + 1);
    double t1 = dfl_now();
    int n_cap = seq_ncap(q);
    dfl_fwd f = {.kv = q->kv, .tok = tr->tok, .n = tr->n, .logits = q->logits,
                 .cap = n_cap ? seq_cap(q) : NULL, .n_cap = n_cap, .feat = q->feat,
                 .parent = tr->parent};
    if ((rc = dfl_target_forward_ex(t, &f, err))) return rc;
    double t2 = dfl_now();
    int path[DFL_MAX_TREE + 1], emitted = 0;
    int kept = tree_walk(r, tr, pos, path, &emitted);
    dfl_kv_keep_path(q->kv, pos, path, kept);   /* (the forward's rows fit dfl_kv_tree_rows) */
    size_t fd = (size_t)n_cap * t->c.dim;
    for (int i = 1; i < kept && fd; i++)
        memcpy(q->feat + i * fd, q->feat + path[i] * fd, fd * sizeof(float));
    double t3 = dfl_now();
    if ((rc = feed_lanes(q, q->feat, q->hist + pos, kept, err))) return rc;
    double t4 = dfl_now();
    r->st->t_draft += (t1 - t0) + (t4 - t3);
    r->st->t_verify += t2 - t1;
    count_tree(r, tr, kept - 1, emitted);
    *accepted = kept - 1;
    double drafter = kept_s ? lanes_spent(q, &kept_s) - s0 : (t1 - t0) + (t4 - t3);
    *cost = drafter + (t3 - t2) + marginal(t, &f, t2 - t1);
    if (f.others) r->st->shared_forwards++, r->st->shared_rows += (uint64_t)f.others;
    return 0;
}

/* Nodes of this call's trees at most (0: chain only): trees need the
 * drafter's rows, room in the cache (dfl_kv_tree_rows), and a rule exact
 * along a tree (greedy, or one that gives the keyed sample per node); a
 * pinned block with the budget left to the policy keeps the chain. */
static int tree_cap(const dfl_seq *q, const dfl_loop_opts *o) {
    if (!o->tree_budget || !q->pr || !q->dlogits || q->max_tree < 1) return 0;
    if ((o->accept && !o->choose) || (o->tree_budget < 0 && o->block > 0)) return 0;
    int rows = imin(q->t->max_rows, dfl_kv_tree_rows(q->kv));
    int m = imin(imin(q->max_tree, DFL_MAX_TREE), rows - 1);
    if (m < 1) return 0;
    return o->tree_budget > 0 ? imin(o->tree_budget, m) : m;
}

/* The budget of this round's tree, or 0 (the chain): pinned, or the tree
 * policy's pick against the chain block B the chain policy chose; no more
 * rows than the cache has left. */
static int pick_tree(run *r, dfl_tree_policy *tp, const dfl_policy *chain, dfl_costs *tree_costs,
                     const dfl_costs *chain_costs, int B, int lane) {
    dfl_seq *q = r->q;
    if (!r->tree_max || r->gated || lane != DFL_LANE_DRAFTER || tree_depths(r, 1) < 1) return 0;
    int ctx = q->kv->len, N = r->tree_max;
    if (r->o->tree_budget < 0) {
        if (B < 2) return 0;
        /* a tree must beat a classic step too: against a chain probe's rate
         * alone, a tiny tree won every probe at zero acceptance, and the
         * chain, never seeing its probe answered, asked again each round */
        double cr = dfl_policy_rate(chain, B, ctx), c1 = dfl_policy_rate(chain, 1, ctx);
        N = dfl_tree_policy_choose(tp, tree_costs, chain_costs, ctx, cr > c1 ? cr : c1);
    }
    N = imin(N, q->kv->cap - ctx - 1);
    return N >= 1 ? N : 0;
}

/* The drafts each lane's proposer can offer after the anchor (0: no lane). */
static void lane_offers(const run *r, int *offer) {
    for (int l = 0; l < DFL_LANES; l++) {
        dfl_proposer *p = lane_proposer(r->q, l);
        offer[l] = !p ? 0 : p->offer ? p->offer(p, r->anchor, r->q->kv->len) : p->max_block - 1;
    }
}

/* The lane and block of the next round: the lanes' policies bid
 * (dfl_lanes_choose). */
static int choose_lane(run *r, dfl_policy *pol, int *lane) {
    int offer[DFL_LANES];
    lane_offers(r, offer);
    return dfl_lanes_choose(pol, offer, r->q->kv->len, r->o->block, lane);
}

/* Whether a round the crowd gate held to a classic step would have
 * speculated, priced as it is (the gate tries speculation for such rounds). */
static int held_wants(const run *r, const dfl_policy *pol) {
    int offer[DFL_LANES];
    lane_offers(r, offer);
    return dfl_lanes_want(pol, offer, r->q->kv->len);
}

/* The block for the next round (and its lane): the policy's (or the pinned)
 * size, shrunk so it never passes the cache's end nor max_tokens. */
static int pick_block(run *r, dfl_policy *pol, int *lane) {
    dfl_seq *q = r->q;
    int B = 1;
    *lane = DFL_LANE_DRAFTER;
    if (r->spec && !r->gated && !r->first) B = choose_lane(r, pol, lane);
    B = imin(B, r->o->max_tokens - r->gen);
    B = imin(B, q->kv->cap - q->kv->len);
    B = imin(B, imin(q->max_block, q->t->max_rows));
    if (B > 1) B = imin(B, lane_proposer(q, *lane)->max_block);
    B = B < 1 ? 1 : imin(B, DFL_MAX_BLOCK);
    if (B > 1 && r->o->exact && r->o->exact[B] != 1) B = 1;   /* fail closed */
    return B;
}

/* ---- generation ----------------------------------------------------------- */

/* The crowd's tokens per second that a round's time is priced at: the
 * gate's measure of the speculating crowd (dfl_gate_price); before it has
 * one, or without a gate, the rows per second of this sequence's classic
 * ticks, which are tokens while the others take classic steps too. */
static double crowd_price(const run *r, int active) {
    double p = r->o->gate ? dfl_gate_price(r->o->gate, active) : 0;
    return p > 0 ? p : r->crowd;
}

static int check_prompt(const dfl_seq *q, const int32_t *prompt, int n, dfl_error *err) {
    if (n < 1)
        return dfl_fail(err, DFL_EARG, "empty prompt: at least one token (e.g. BOS) is needed");
    if (n > q->kv->cap)
        return dfl_fail(err, DFL_ECTX, "prompt of %d tokens does not fit the context of %d",
                        n, q->kv->cap);
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= q->t->c.vocab)
            return dfl_fail(err, DFL_EARG, "prompt token %d is %d, outside the vocabulary 0..%d",
                            i, prompt[i], q->t->c.vocab - 1);
    return 0;
}

/* The model lanes read their layers out of what the verify captures. */
static int check_caps(const dfl_seq *q, dfl_error *err) {
    const dfl_proposer *m[2] = {q->pr, q->mt};
    const int *cap = seq_cap(q);
    int nc = q->cap ? q->n_cap : q->pr ? q->pr->n_cap : 0;
    for (int i = 0; i < 2; i++) {
        if (!m[i] || !m[i]->n_cap) continue;
        if (!q->feat || !cap)
            return dfl_fail(err, DFL_EARG, "a proposer reads features but the sequence has no "
                            "feature buffer");
        int same = m[i]->n_cap == nc && !memcmp(m[i]->cap, cap, (size_t)nc * sizeof(int));
        if (!same && !q->fsub)
            return dfl_fail(err, DFL_EARG, "two model lanes read different target layers but "
                            "the sequence has no buffer (fsub) to gather them");
        for (int j = 0; j < m[i]->n_cap; j++) {
            int k = 0;
            while (k < nc && cap[k] != m[i]->cap[j]) k++;
            if (k == nc)
                return dfl_fail(err, DFL_EARG, "a proposer reads target layer %d, which the "
                                "sequence's capture list (cap) leaves out", m[i]->cap[j]);
        }
    }
    return 0;
}

/* Keeps the cached rows shared with the new prompt (never its last token:
 * that is the first anchor). The proposer never runs ahead of the cache. */
static int reuse_prefix(dfl_seq *q, const int32_t *prompt, int n, int spec) {
    int keep = common_prefix(q->hist, q->kv->len, prompt, n - 1);
    for (int l = 0; l < DFL_LANES; l++) {
        dfl_proposer *pr = lane_proposer(q, l);
        if (!pr) continue;
        if (pr->len(pr) > keep) pr->truncate(pr, keep);
        /* (a windowed store may empty itself when cut) */
        int pl = pr->len(pr);
        if (spec && pl < keep) keep = pl;
    }
    /* (a recurrent state may not go back that far: the sequence restarts) */
    keep = dfl_kv_truncate(q->kv, keep);
    for (int l = 0; l < DFL_LANES; l++) {
        dfl_proposer *pr = lane_proposer(q, l);
        if (pr && pr->len(pr) > keep) pr->truncate(pr, keep);
    }
    return keep;
}

int dfl_spec_generate(dfl_seq *q, const dfl_loop_opts *o, const int32_t *prompt, int n_prompt,
                      dfl_token_fn cb, void *ud, dfl_stats *st, dfl_error *err) {
    int rc = check_prompt(q, prompt, n_prompt, err);
    if (rc) return rc;
    run r = {.q = q, .o = o, .cb = cb, .ud = ud, .st = st};
    r.spec = (q->pr || q->ng || q->mt) && o->block != 1;
    if (r.spec && (rc = check_caps(q, err))) return rc;
    st->weight_bytes = (double)q->t->weight_bytes;
    st->n_prompt += n_prompt;

    double t0 = dfl_now();
    int keep = reuse_prefix(q, prompt, n_prompt, r.spec);
    st->n_cached += keep;
    dfl_target_join(q->t);
    /* the crowd's ticks carry this prefill: the gate does not measure them */
    if (o->gate && r.spec) dfl_gate_prefill(o->gate, dfl_now(), 1);
    /* Held by the gate's evidence (dfl_gate_idle: speculation measured behind,
     * so the crowd drafts only in the gate's tries), the prompt's rows but
     * the newest PARK_KEEP become a hole in the drafter's store, as a held
     * sequence's parked rows do (skip_parked): feeding them was a drafter
     * pass the whole crowd waited for: held DFlash requests at eight clients
     * ran 1.2% slower than classic ones in the same server, their drafter's
     * probes already budgeted, and at four, held behind but not far, their
     * prefill took 7.5% longer (Zen 4). So too before a crowd has tried
     * speculation, while none of its held sequences wants it: in a fresh
     * server's first three pairs of waves of eight clients, before the
     * gate's first try, DFlash waves ran 0.93-0.98x classic ones, and in the
     * first two their prompts' prefill took 12-17% longer (Zen 4). */
    rc = prefill(q, prompt + keep, n_prompt - 1 - keep, r.spec, hole_gate(&r), err);
    if (o->gate && r.spec) dfl_gate_prefill(o->gate, dfl_now(), -1);
    if (rc) {
        dfl_target_leave(q->t);
        return rc;
    }
    double t1 = dfl_now();
    st->t_prefill += t1 - t0;

    dfl_costs local_costs[DFL_LANES], *costs[DFL_LANES] = {o->costs, o->costs_ngram, o->costs_mtp};
    dfl_costs local_crowd[DFL_LANES], *crowd = o->crowd_costs, *use[DFL_LANES];
    if (!crowd) {
        for (int l = 0; l < DFL_LANES; l++) dfl_costs_init(&local_crowd[l], DFL_POLICY_MAX);
        crowd = local_crowd;
    }
    dfl_costs local_tree, *tree_costs = o->costs_tree;
    dfl_tree_policy tp;
    r.tree_max = r.spec ? tree_cap(q, o) : 0;
    if (!tree_costs) dfl_costs_init(tree_costs = &local_tree, DFL_MAX_TREE + 1);
    dfl_tree_policy_init(&tp, r.tree_max);
    if (o->carry_tree && o->carry_tree->max_budget == tp.max_budget) tp = *o->carry_tree;
    dfl_policy pol[DFL_LANES], *carry[DFL_LANES] = {o->carry, o->carry_ngram, o->carry_mtp};
    for (int l = 0; l < DFL_LANES; l++) {
        dfl_proposer *pr = lane_proposer(q, l);
        if (!costs[l]) dfl_costs_init(costs[l] = &local_costs[l], DFL_POLICY_MAX);
        dfl_policy_init(&pol[l], costs[l], imin(q->max_block, r.spec && pr ? pr->max_block : 1));
        if (carry[l] && carry[l]->max_block == pol[l].max_block)
            dfl_policy_resume(&pol[l], carry[l]);
    }
    /* The crowd's rate this slot last measured: from 0, each request's first
     * round in a crowd was judged as if alone, and took a block that the
     * crowd paid for (a round a request, 3-5% of 8 clients' rate). */
    r.crowd = pol[DFL_LANE_DRAFTER].crowd_rate;
    double d0 = st->t_draft, v0 = st->t_verify;
    r.anchor = prompt[n_prompt - 1];
    int adaptive = r.spec && o->block == 0 && o->tree_budget <= 0;
    while (r.stop == DFL_STOP_NONE) {
        if (r.gen >= o->max_tokens) r.stop = DFL_STOP_LENGTH;
        else if (q->kv->len >= q->kv->cap) r.stop = DFL_STOP_CTX;
        if (r.stop) break;
        int active = r.spec ? dfl_target_active(q->t) : 1, gen0 = r.gen;
        r.crowded = active > 1;
        /* The first token as soon as one row allows: a first round of 16
         * rows held it back by the drafter's pass and the rows' arithmetic
         * (time to first token 941 ms against classic's 405, one client at
         * tau 6.5 on a busy Zen 3), and the step costs the request about a
         * round's share of one token. */
        r.first = adaptive && r.gen == 0;
        int held = adaptive && o->gate && !dfl_gate_open(o->gate, dfl_now(), active);
        r.gated = held;
        double price = active > 1 ? crowd_price(&r, active) : 0;
        /* Beside others with no price yet (a slot's first ticks in a fresh
         * crowd), a classic step first: it measures the crowd's rate, so the
         * rounds after it are priced at that instead of judged as if alone
         * by start-up costs, which chose blocks the crowd paid for. */
        if (adaptive && active > 1 && !(price > 0)) r.gated = 1;
        for (int l = 0; l < DFL_LANES; l++) {
            pol[l].crowd_rate = price;
            pol[l].costs = use[l] = active > 1 ? &crowd[l] : costs[l];
            pol[l].alone = active > 1 ? costs[l] : NULL;
        }
        int wants = held && price > 0 && held_wants(&r, pol);
        if (!r.gated && r.shadow_b)   /* free again: its own policy probes for real */
            r.shadow_b = 0, dfl_policy_skip(&pol[DFL_LANE_DRAFTER]);
        int lane, B = pick_block(&r, pol, &lane), a = 0, ctx = q->kv->len;
        double cost = 0;
        int N = pick_tree(&r, &tp, &pol[DFL_LANE_DRAFTER], tree_costs, use[DFL_LANE_DRAFTER],
                          B, r.o->tree_budget > 0 && q->pr ? DFL_LANE_DRAFTER : lane);
        if (N) {   /* a tree round: its own costs and evidence; the chain's sat it out */
            dfl_tree tr;
            if ((rc = tree_round(&r, N, &tr, &a, &cost, err))) break;
            dfl_costs_update(tree_costs, tr.n, ctx, cost);
            dfl_tree_policy_observe(&tp, tr.mass, tr.full, tr.mass[tr.n - 1], a);
            for (int l = 0; l < DFL_LANES; l++) dfl_policy_classic_step(&pol[l]);
            if (o->gate) dfl_gate_note(o->gate, active, r.gen - gen0, 0);
            continue;
        }
        dfl_policy *dp = &pol[DFL_LANE_DRAFTER];
        /* a held probe waits for the first token: the drafter's pass would delay it */
        if (r.gated && !wants && B == 1 && !r.first) {
            double f0 = dfl_now();
            rc = shadow_start(&r, dp, active, err);
            st->t_draft += dfl_now() - f0;
            if (rc) break;
        }
        if ((rc = round_step(&r, B, lane, &a, &cost, err))) break;
        if (B == 1 && r.shadow_b) shadow_check(&r, dp, r.anchor);
        if (o->gate) dfl_gate_note(o->gate, active, r.gen - gen0, wants);
        /* a classic step is every lane's baseline */
        for (int l = 0; l < DFL_LANES; l++)
            if (B == 1 || l == lane) dfl_costs_update(use[l], B, ctx, cost);
        for (int l = 0; l < DFL_LANES; l++)
            if (B > 1 && l == lane) dfl_policy_observe(&pol[l], B, a);
            else dfl_policy_classic_step(&pol[l]);
    }
    if (!rc) {   /* the proposer catches up, so it is in step with kv for the next call */
        double f0 = dfl_now();
        rc = end_parked(&r, err);
        st->t_draft += dfl_now() - f0;
    }
    dfl_target_leave(q->t);
    if (adaptive && o->gate) dfl_gate_leave(o->gate, dfl_now());
    for (int l = 0; l < DFL_LANES; l++)
        if (carry[l] && r.spec && o->block == 0 && lane_proposer(q, l))
            *carry[l] = pol[l], carry[l]->crowd_rate = r.crowd;
    if (o->carry_tree && o->tree_budget < 0 && tp.max_budget) *o->carry_tree = tp;
    double t2 = dfl_now();
    st->t_decode += t2 - t1;
    st->t_other += (t2 - t1) - (st->t_draft - d0) - (st->t_verify - v0);
    st->stop = r.stop;
    return rc;
}
