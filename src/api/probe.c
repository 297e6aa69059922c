/* probe.c - the exactness probe (block vs single-row logits, bit for bit),
 * the engine's memo that gates speculation on it, the drafter diagnostic
 * (a shadow that drafts along the classic-decode path), and dfl_debug_draft. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "engine.h"
#include "decode/decode.h"

/* ---- a JSON text buffer that never overflows ------------------------------ */

typedef struct jbuf {
    char *p;
    size_t cap, len;
} jbuf;

static void jp(jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jp(jbuf *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = j->p && j->len < j->cap ? j->cap - j->len : 0;
    int n = vsnprintf(room ? j->p + j->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) j->len += (size_t)n;
}

/* A float as JSON (non-finite values have no JSON spelling). */
static void jnum(jbuf *j, double v) {
    if (isfinite(v)) jp(j, "%.9g", v);
    else jp(j, "null");
}

/* ---- comparing two arms --------------------------------------------------- */

typedef struct cmp {
    uint64_t bytes, differ;
    double max_abs;
} cmp;

static void compare(cmp *c, const float *a, const float *b, size_t n) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < n * sizeof(float); i++) c->differ += x[i] != y[i];
    c->bytes += n * sizeof(float);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > c->max_abs || (isnan(d) && memcmp(&a[i], &b[i], sizeof(float))))
            c->max_abs = isnan(d) ? INFINITY : d;
    }
}

/* Best token and its lead over the runner-up. */
static int top2(const float *row, int n, double *margin) {
    int best = dfl_argmax(row, n), second = -1;
    for (int i = 0; i < n; i++)
        if (i != best && (second < 0 || row[i] > row[second])) second = i;
    *margin = second < 0 ? 0 : (double)row[best] - row[second];
    return best;
}

static void report_disagreements(jbuf *j, const float *K, const float *S, int B, int vocab,
                                 int pos0, int *n_dis) {
    jp(j, "\"argmax_disagree\": [");
    *n_dis = 0;
    for (int i = 0; i < B; i++) {
        double mk, ms;
        int tk = top2(K + (size_t)i * vocab, vocab, &mk);
        int ts = top2(S + (size_t)i * vocab, vocab, &ms);
        if (tk == ts) continue;
        jp(j, "%s{\"row\": %d, \"position\": %d, \"block\": {\"token\": %d, \"margin\": ",
           (*n_dis)++ ? ", " : "", i, pos0 + i, tk);
        jnum(j, mk);
        jp(j, "}, \"single\": {\"token\": %d, \"margin\": ", ts);
        jnum(j, ms);
        jp(j, "}}");
    }
    jp(j, "]");
}

/* ---- the probe ------------------------------------------------------------- */

/* Floats of every recurrent layer's state of kv (0: none). */
static size_t rec_total(const dfl_kv *kv) {
    size_t n = 0;
    for (int l = 0; l < kv->n_layers; l++)
        n += kv->layer[l].kind == DFL_LAYER_RECURRENT ? (size_t)kv->rec_floats : 0;
    return n;
}

/* Every recurrent layer's state after row i of the last forward (-1: the
 * live state) into out, layer after layer. */
static void rec_save(const dfl_kv *kv, int i, float *out) {
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->layer[l].kind != DFL_LAYER_RECURRENT) continue;
        memcpy(out, i < 0 ? dfl_kv_rec(kv, l) : dfl_kv_snap(kv, l, i + 1),
               sizeof(float) * kv->rec_floats);
        out += kv->rec_floats;
    }
}

/* A block of b rows left the state after each of its rows in a snapshot
 * (as many as kept) and the last in the live state: each against the
 * single-row arm's state after that row (SR, rt floats a row). */
static void compare_states(cmp *c, const dfl_kv *kv, int b, const float *SR, size_t rt,
                           float *tmp) {
    if (!rt) return;
    for (int i = 0; i + 1 < kv->snap_n && i < b; i++) {
        rec_save(kv, i, tmp);
        compare(c, tmp, SR + (size_t)i * rt, rt);
    }
    rec_save(kv, -1, tmp);
    compare(c, tmp, SR + (size_t)(b - 1) * rt, rt);
}

int dfl_probe_target(dfl_target *t, const int32_t *ids, int n, int B, const int *fcap,
                     int n_fcap, dfl_probe_result *r, int *state, char *json, size_t cap,
                     dfl_error *err) {
    int vocab = t->c.vocab, fd = n_fcap * t->c.dim;
    if (n < 1) return dfl_fail(err, DFL_EARG, "probe: empty prompt");
    if (B < 1 || B > t->max_rows || B > DFL_MAX_BLOCK)
        return dfl_fail(err, DFL_EARG, "probe: block %d outside 1..%d", B,
                        t->max_rows < DFL_MAX_BLOCK ? t->max_rows : DFL_MAX_BLOCK);
    dfl_kv *kv = dfl_kv_new(t, n - 1 + B);
    float *S = dfl_aligned_alloc((size_t)B * vocab * sizeof(float));
    float *K = dfl_aligned_alloc((size_t)B * vocab * sizeof(float));
    float *SF = fd ? dfl_aligned_alloc((size_t)B * fd * sizeof(float)) : NULL;
    float *KF = fd ? dfl_aligned_alloc((size_t)B * fd * sizeof(float)) : NULL;
    size_t rt = rec_total(kv);   /* recurrent state: SR the single arm's after each row */
    float *SR = rt ? xmalloc((size_t)B * rt * sizeof(float)) : NULL;
    float *KR = rt ? xmalloc(rt * sizeof(float)) : NULL;
    int32_t x[DFL_MAX_BLOCK];
    int rc = dfl_target_forward(t, kv, ids, n - 1, n - 1, NULL, NULL, 0, NULL, err);
    /* The single-row arm: the anchor, then its greedy continuation. */
    x[0] = ids[n - 1];
    for (int i = 0; i < B && !rc; i++) {
        rc = dfl_target_forward(t, kv, x + i, 1, 0, S + (size_t)i * vocab, fcap, n_fcap,
                                fd ? SF + (size_t)i * fd : NULL, err);
        if (rt) rec_save(kv, -1, SR + (size_t)i * rt);
        if (i + 1 < B) x[i + 1] = dfl_argmax(S + (size_t)i * vocab, vocab);
    }
    jbuf j = {json, cap, 0};
    if (json && cap) json[0] = 0;
    memset(r, 0, sizeof *r);
    r->block = B;
    cmp c = {0}, fc = {0}, sc = {0};
    jp(&j, "{\"block\": %d, \"prompt_tokens\": %d, \"sizes\": [", B, n);
    /* The block arm for every size, the largest last so K keeps its rows. */
    for (int b = B > 1 ? 2 : 1; b <= B && !rc; b++) {
        /* (a recurrent state reaches back only into its last forward: prefill again) */
        int kept = dfl_kv_truncate(kv, n - 1);
        if (kept < n - 1)
            rc = dfl_target_forward(t, kv, ids + kept, n - 1 - kept, n - 1 - kept, NULL, NULL,
                                    0, NULL, err);
        rc = rc ? rc : dfl_target_forward(t, kv, x, b, 0, K, fcap, n_fcap, KF, err);
        if (rc) break;
        c = (cmp){0}, fc = (cmp){0}, sc = (cmp){0};
        compare(&c, K, S, (size_t)b * vocab);
        if (fd) compare(&fc, KF, SF, (size_t)b * fd);
        compare_states(&sc, kv, b, SR, rt, KR);
        if (state && b >= 2) state[b] = c.differ == 0 && sc.differ == 0 ? 1 : -1;
        jp(&j, "%s{\"block\": %d, \"bytes_differ\": %llu, \"max_abs_diff\": ",
           b > 2 ? ", " : "", b, (unsigned long long)c.differ);
        jnum(&j, c.max_abs);
        jp(&j, ", \"feat_bytes_differ\": %llu, \"state_bytes_differ\": %llu}",
           (unsigned long long)fc.differ, (unsigned long long)sc.differ);
    }
    if (!rc) {
        r->bytes_compared = c.bytes;
        r->bytes_differ = c.differ;
        r->state_bytes_compared = sc.bytes;
        r->state_bytes_differ = sc.differ;
        r->max_abs_diff = c.max_abs;
        jp(&j, "], \"rows\": %d, \"bytes_compared\": %llu, \"bytes_differ\": %llu, "
           "\"max_abs_diff\": ", B, (unsigned long long)c.bytes, (unsigned long long)c.differ);
        jnum(&j, c.max_abs);
        jp(&j, ", \"feat_layers\": %d, \"feat_bytes_compared\": %llu, "
           "\"feat_bytes_differ\": %llu, \"state_bytes_compared\": %llu, "
           "\"state_bytes_differ\": %llu, \"exact\": %s, ", n_fcap,
           (unsigned long long)fc.bytes, (unsigned long long)fc.differ,
           (unsigned long long)sc.bytes, (unsigned long long)sc.differ,
           c.differ || sc.differ ? "false" : "true");
        report_disagreements(&j, K, S, B, vocab, n - 1, &r->n_argmax_disagree);
        jp(&j, "}");
    }
    dfl_kv_free(kv);
    free(S), free(K), free(SF), free(KF), free(SR), free(KR);
    return rc;
}

/* ---- the engine's memo ------------------------------------------------------ */

/* A fixed short prompt: BOS when the model has one, then spread-out ids. */
static int default_prompt(const dfl_target *t, int32_t *ids) {
    int n = 0, vocab = t->c.vocab;
    if (t->c.bos_id >= 0 && t->c.bos_id < vocab) ids[n++] = t->c.bos_id;
    for (int i = 0; i < 6; i++) ids[n++] = (int32_t)((i * 7919 + 13) % vocab);
    return n;
}

int dfl_probe_ensure(dfl_engine *e, int bmax, int *exact, dfl_error *err) {
    if (bmax > DFL_MAX_BLOCK) bmax = DFL_MAX_BLOCK;
    int need = 0;
    for (int b = 2; b <= bmax; b++) need |= e->probe_state[b] == 0;
    if (need) {
        int32_t ids[8];
        int n = default_prompt(e->t, ids), state[DFL_MAX_BLOCK + 1] = {0};
        dfl_probe_result r;
        int rc = dfl_probe_target(e->t, ids, n, bmax, NULL, 0, &r, state, NULL, 0, err);
        if (rc) return rc;
        for (int b = 2; b <= bmax; b++) e->probe_state[b] = state[b];
    }
    *exact = 1;
    for (int b = 2; b <= bmax; b++)
        if (e->probe_state[b] != 1) *exact = -1;
    return 0;
}

int dfl_probe(dfl_engine *e, const int32_t *prompt, int n_prompt, int block,
              dfl_probe_result *r, char *json, size_t cap, dfl_error *err) {
    if (!e->t) return dfl_fail(err, DFL_EARG, "probe: the engine has no model loaded");
    if (block == 0) block = e->max_block;
    int32_t ids[8];
    if (!prompt || n_prompt <= 0) prompt = ids, n_prompt = default_prompt(e->t, ids);
    if (n_prompt > e->ctx_size)
        return dfl_fail(err, DFL_ECTX, "probe: prompt of %d tokens exceeds the context of %d",
                        n_prompt, e->ctx_size);
    int state[DFL_MAX_BLOCK + 1] = {0};
    dfl_probe_result local;
    int rc = dfl_probe_target(e->t, prompt, n_prompt, block, e->n_cap ? e->cap : NULL,
                              e->n_cap, r ? r : &local, state, json, cap, err);
    if (rc) return rc;
    for (int b = 2; b <= block; b++) e->probe_state[b] = state[b];
    return 0;
}

/* ---- the drafter diagnostic ------------------------------------------------- */

typedef struct shadow {
    dfl_seq q;
    dfl_dflash_proposer dp;
    dfl_dstore *ds;
    int32_t *ref;      /* (n_prompt + n_gen) the reference path */
    int32_t *props;    /* (n_gen, B-1) drafts made at each anchor */
    float *steps;      /* (n_gen, n_cap*dim) features of the anchors' rows */
} shadow;

static void shadow_free(shadow *w) {
    dfl_kv_free(w->q.kv);
    dfl_dstore_free(w->ds);
    free(w->q.hist), free(w->q.logits), free(w->q.feat), free(w->ref), free(w->props);
    free(w->steps);
}

/* Classic greedy decode of n_gen tokens; before each step, the drafter
 * drafts a block from the same anchor and context, and is then fed the
 * step's row like the real loop would. */
static int shadow_run(dfl_engine *e, shadow *w, int n, int n_gen, int B, dfl_error *err) {
    dfl_target *t = e->t;
    dfl_proposer *pr = &w->dp.base;
    int rc = dfl_spec_prefill(&w->q, w->ref, n - 1, 1, err);
    for (int k = 0; k < n_gen && !rc; k++) {
        int pos = n - 1 + k;
        rc = pr->draft(pr, w->ref[pos], pos, B, w->props + (size_t)k * (B - 1), NULL, err);
        if (rc) break;
        rc = dfl_target_forward(t, w->q.kv, w->ref + pos, 1, 0, w->q.logits, pr->cap, pr->n_cap,
                                w->q.feat, err);
        if (rc) break;
        w->ref[pos + 1] = dfl_argmax(w->q.logits, t->c.vocab);
        size_t fd = (size_t)pr->n_cap * t->c.dim;
        memcpy(w->steps + (size_t)k * fd, w->q.feat, fd * sizeof(float));
        rc = pr->add_context(pr, w->q.feat, w->ref + pos, 1, err);
    }
    return rc;
}

/* The rounds a pinned-block run of n_gen tokens makes along the path: from
 * the prompt's end, each round jumps past what it commits; the last ones
 * shrink to the tokens left (then a draft depends on the smaller block, so
 * it is redone from the store cut back to the anchor). One-row blocks are
 * classic steps, not rounds. */
static int shadow_chain(shadow *w, int n, int n_gen, int B, dfl_draft_report *r,
                        dfl_error *err) {
    dfl_proposer *pr = &w->dp.base;
    size_t fd = (size_t)pr->n_cap * w->q.t->c.dim;
    int32_t small[DFL_MAX_BLOCK];
    int cut = 0;   /* the store has been cut back for a shrunk block */
    for (int gen = 0; gen < n_gen;) {
        int pos = n - 1 + gen, b = B < n_gen - gen ? B : n_gen - gen, a = 0;
        const int32_t *d = w->props + (size_t)gen * (B - 1);
        if (b > 1 && b < B) {
            if (!cut) pr->truncate(pr, pos), cut = 1;
            if (pr->len(pr) != pos) return 0;   /* a windowed store emptied itself */
            int rc = pr->draft(pr, w->ref[pos], pos, b, small, NULL, err);
            if (rc) return rc;
            d = small;
        }
        while (a < b - 1 && d[a] == w->ref[pos + 1 + a]) a++;
        if (b > 1) r->chain_rounds++, r->chain_committed += a + 1;
        if (cut) {
            int rc = pr->add_context(pr, w->steps + (size_t)gen * fd, w->ref + pos, a + 1, err);
            if (rc) return rc;
        }
        gen += a + 1;
    }
    return 0;
}

static void shadow_score(const shadow *w, int n, int n_gen, int B, dfl_draft_report *r) {
    int last = n - 1 + n_gen;   /* the last reference position */
    double acc = 0;
    int full = 0;
    for (int k = 0; k < n_gen; k++) {
        int pos = n - 1 + k, run = 1;
        const int32_t *d = w->props + (size_t)k * (B - 1);
        for (int i = 1; i < B && pos + i <= last; i++) {
            int hit = d[i - 1] == w->ref[pos + i];
            run &= hit;
            if (i - 1 < DFL_MAX_POS_STATS) {
                r->pos_tried[i - 1]++;
                r->pos_hit[i - 1] += hit;
                r->pos_prefix[i - 1] += run;
            }
        }
        if (pos + B - 1 <= last) {
            int a = 0;
            while (a < B - 1 && d[a] == w->ref[pos + 1 + a]) a++;
            acc += 1 + a;
            full++;
        }
    }
    r->n_anchors = n_gen;
    r->tau = full ? acc / full : 0;
}

static void shadow_json(const dfl_draft_report *r, char *json, size_t cap) {
    jbuf j = {json, cap, 0};
    if (json && cap) json[0] = 0;
    jp(&j, "{\"block\": %d, \"anchors\": %d, \"tau\": ", r->block, r->n_anchors);
    jnum(&j, r->tau);
    jp(&j, ", \"rounds\": %llu, \"committed\": %llu, \"tau_rounds\": ",
       (unsigned long long)r->chain_rounds, (unsigned long long)r->chain_committed);
    jnum(&j, r->chain_rounds ? (double)r->chain_committed / r->chain_rounds : 0);
    jp(&j, ", \"positions\": [");
    for (int i = 0; i < r->block - 1 && i < DFL_MAX_POS_STATS; i++) {
        double n = r->pos_tried[i] ? (double)r->pos_tried[i] : 1;
        jp(&j, "%s{\"pos\": %d, \"tried\": %llu, \"hit\": %.4f, \"prefix\": %.4f}", i ? ", " : "",
           i + 1, (unsigned long long)r->pos_tried[i], r->pos_hit[i] / n, r->pos_prefix[i] / n);
    }
    jp(&j, "]}");
}

int dfl_probe_draft(dfl_engine *e, const int32_t *prompt, int n_prompt, int block, int n_gen,
                    dfl_draft_report *r, char *json, size_t cap, dfl_error *err) {
    if (!e->t || !e->d) return dfl_fail(err, DFL_EARG, "drafter diagnostic: no drafter loaded");
    dfl_target *t = e->t;
    dfl_drafter *d = e->d;
    if (block == 0) block = d->block_size;
    int bmax = d->max_rows < DFL_MAX_POS_STATS + 1 ? d->max_rows : DFL_MAX_POS_STATS + 1;
    if (block < 2 || block > bmax)
        return dfl_fail(err, DFL_EARG, "drafter diagnostic: block %d outside 2..%d", block, bmax);
    int32_t ids[8];
    if (!prompt || n_prompt <= 0) prompt = ids, n_prompt = default_prompt(t, ids);
    if (n_gen < 1 || n_prompt + n_gen > e->ctx_size)
        return dfl_fail(err, DFL_EARG, "drafter diagnostic: %d prompt + %d tokens must fit the "
                        "context of %d", n_prompt, n_gen, e->ctx_size);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= t->c.vocab)
            return dfl_fail(err, DFL_EARG, "prompt token %d outside the vocabulary", prompt[i]);
    int rows = n_prompt + n_gen;
    shadow w = {0};
    w.q.t = t;
    w.q.kv = dfl_kv_new(t, rows);
    w.q.hist = xcalloc(rows, sizeof(int32_t));
    w.q.logits = dfl_aligned_alloc((size_t)t->c.vocab * sizeof(float));
    w.q.feat = dfl_aligned_alloc((size_t)t->max_rows * d->n_cap * t->c.dim * sizeof(float));
    w.q.max_block = 1;
    w.ds = dfl_dstore_new(d, rows);
    dfl_dflash_proposer_init(&w.dp, d, w.ds);
    w.q.pr = &w.dp.base;
    w.ref = xcalloc(rows + 1, sizeof(int32_t));
    w.props = xcalloc((size_t)n_gen * (block - 1), sizeof(int32_t));
    w.steps = xmalloc((size_t)n_gen * d->n_cap * t->c.dim * sizeof(float));
    memcpy(w.ref, prompt, (size_t)n_prompt * sizeof(int32_t));
    int rc = shadow_run(e, &w, n_prompt, n_gen, block, err);
    dfl_draft_report local;
    if (!r) r = &local;
    if (!rc) {
        memset(r, 0, sizeof *r);
        r->block = block;
        shadow_score(&w, n_prompt, n_gen, block, r);
        rc = shadow_chain(&w, n_prompt, n_gen, block, r, err);
    }
    if (!rc) shadow_json(r, json, cap);
    shadow_free(&w);
    return rc;
}

/* ---- dfl_debug_draft -------------------------------------------------------- */

int dfl_debug_draft(dfl_session *s, const int32_t *ids, int n, int B, float *logits,
                    dfl_error *err) {
    dfl_engine *e = s->e;
    if (!e->d || !s->ds) return dfl_fail(err, DFL_EARG, "no drafter loaded (--draft)");
    if (n < 1 || n > e->ctx_size)
        return dfl_fail(err, DFL_EARG, "%d ids: expected 1..%d", n, e->ctx_size);
    if (B < 2 || B > e->d->max_rows)
        return dfl_fail(err, DFL_EARG, "block %d outside 2..%d", B, e->d->max_rows);
    dfl_seq q = {.t = e->t, .kv = s->kv, .hist = s->hist, .logits = s->logits,
                 .feat = s->feat, .max_block = e->max_block};
    dfl_dflash_proposer dp;
    dfl_dflash_proposer_init(&dp, e->d, s->ds);
    q.pr = &dp.base;
    dfl_kv_truncate(s->kv, 0);
    dfl_dstore_truncate(s->ds, 0);
    int rc = dfl_spec_prefill(&q, ids, n - 1, 1, err);
    int32_t draft[DFL_MAX_BLOCK];
    return rc ? rc : dfl_drafter_draft(e->d, s->ds, ids[n - 1], B, logits, draft, err);
}
