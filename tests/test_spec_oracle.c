/* test_spec_oracle.c - greedy invariance of the round loop with an oracle
 * drafter that knows the classic-decode output and forces every accept
 * length 0..B-1 (and mixtures), on the stories260K target (a real, trained
 * tiny Llama), over generations that cross many blocks and run into the end
 * of the context window. $DFLASH_ORACLE_TARGET names another target to run
 * it on (test_hf_oracle.py: a Qwen3.5 hybrid, whose DeltaNet states roll
 * back through snapshots).
 *
 * The reference is computed here with direct target calls, one row at a
 * time, independent of the loop. The oracle checks, on every call, that the
 * loop rolled the target cache and the proposer back to exactly the
 * committed length, that the anchor is the committed token, and that the
 * features it is fed are those of committed rows, bit for bit. */
#include <string.h>

#include "decode/decode.h"
#include "testutil.h"

enum { CTX = 112, MAXB = 16 };

static dfl_target *T;
static int32_t ref[CTX + 1 + MAXB];   /* prompt + classic output (+ slack) */
static int n_ref;                      /* valid entries */
static float *ref_feat;                /* (CTX, 2*dim) features of ref rows */
static const int cap_layers[2] = {1, 3};

/* ---- the reference: classic greedy, one row at a time -------------------- */

static void make_reference(const int32_t *prompt, int n) {
    dfl_kv *kv = dfl_kv_new(T, CTX);
    float *lg = dfl_aligned_alloc((size_t)T->c.vocab * sizeof(float));
    dfl_error err = {0};
    memcpy(ref, prompt, n * sizeof(int32_t));
    n_ref = n;
    for (int p = 0; p < n - 1; p++)
        dfl_target_forward(T, kv, ref + p, 1, 1, NULL, NULL, 0, NULL, &err);
    /* each row at position p gives the token at p+1, until the cache is full */
    for (int p = n - 1; p < CTX; p++) {
        int rc = dfl_target_forward(T, kv, ref + p, 1, 0, lg, NULL, 0, NULL, &err);
        CHECK(rc == 0, "reference forward at %d: %s", p, err.msg);
        ref[p + 1] = dfl_argmax(lg, T->c.vocab);
        n_ref = p + 2;
    }
    for (int i = n_ref; i < CTX + 1 + MAXB; i++) ref[i] = (i * 31) % T->c.vocab;
    /* features of every reference row, in one batched pass (batch invariant) */
    int fd = 2 * T->c.dim;
    ref_feat = dfl_aligned_alloc((size_t)CTX * fd * sizeof(float));
    dfl_kv_truncate(kv, 0);
    for (int a = 0; a < CTX; a += T->max_rows) {
        int m = CTX - a < T->max_rows ? CTX - a : T->max_rows;
        dfl_target_forward(T, kv, ref + a, m, m, NULL, cap_layers, 2, ref_feat + (size_t)a * fd,
                           &err);
    }
    dfl_kv_free(kv);
    free(lg);
}

/* ---- the oracle -------------------------------------------------------------- */

typedef struct oracle {
    dfl_proposer base;
    dfl_kv *kv;            /* the loop's target cache, to check its length */
    int len;               /* context rows received */
    const int *pattern;    /* forced accept lengths, cycled */
    int n_pattern, round;
    int forced;            /* accept length forced in the round in flight, or -1 */
    int strict;            /* the committed path must follow ref */
    int feedback;          /* check each round feeds back forced + 1 rows */
    int bad;               /* bookkeeping failures */
    int calls;
    int fed, skipped;      /* positions fed with features, and skipped (holes) */
} oracle;

static int o_add(dfl_proposer *p, const float *feat, const int32_t *tok, int n,
                 dfl_error *err) {
    (void)tok;
    oracle *o = (oracle *)p;
    int fd = 2 * T->c.dim;
    /* after a round: exactly the anchor and the accepted drafts come back */
    if (o->feedback && o->forced >= 0 && n != o->forced + 1 && o->bad++ < 3)
        fprintf(stderr, "oracle: round forced to accept %d fed back %d rows\n", o->forced, n);
    o->forced = -1;
    o->fed += n;
    if (!o->strict) {
        o->len += n;
        return 0;
    }
    if (o->len + n > CTX || !feat ||
        memcmp(feat, ref_feat + (size_t)o->len * fd, (size_t)n * fd * sizeof(float)) != 0) {
        if (o->bad++ < 3)
            fprintf(stderr, "oracle: features of rows %d..%d are not the committed rows'\n",
                    o->len, o->len + n - 1);
    }
    o->len += n;
    return 0;
}

static int o_draft(dfl_proposer *p, int32_t anchor, int pos, int B, int32_t *out, float *logits,
                   dfl_error *err) {
    oracle *o = (oracle *)p;
    o->calls++;
    if (pos != o->len || pos != o->kv->len || (o->strict && anchor != ref[pos])) {
        if (o->bad++ < 3)
            fprintf(stderr, "oracle: draft at %d: proposer holds %d rows, kv %d; anchor %d vs %d\n",
                    pos, o->len, o->kv->len, anchor, ref[pos]);
    }
    int a = o->pattern[o->round++ % o->n_pattern];
    if (a > B - 1) a = B - 1;
    for (int i = 0; i < B - 1; i++) {
        int32_t good = ref[pos + 1 + i];
        out[i] = i < a ? good : i == a ? (good + 1) % T->c.vocab : (good * 7 + i) % T->c.vocab;
    }
    o->forced = a;
    return 0;
}

static void o_truncate(dfl_proposer *p, int n) {
    oracle *o = (oracle *)p;
    if (n < o->len) o->len = n;
}

static int o_len(const dfl_proposer *p) { return ((const oracle *)p)->len; }

static int o_skip(dfl_proposer *p, int n, dfl_error *err) {
    (void)err;
    oracle *o = (oracle *)p;
    o->len += n;
    o->skipped += n;
    return 0;
}

static void oracle_init(oracle *o, dfl_kv *kv, const int *pattern, int n_pattern) {
    memset(o, 0, sizeof *o);
    o->base = (dfl_proposer){o_add, o_draft, o_truncate, o_len, cap_layers, 2, MAXB};
    o->kv = kv;
    o->pattern = pattern;
    o->n_pattern = n_pattern;
    o->forced = -1;
    o->strict = o->feedback = 1;
}

/* ---- running the loop ---------------------------------------------------------- */

typedef struct sink {
    int32_t ids[CTX + 8];
    int n, cancel_at;
    const oracle *o;   /* when set: its drafter calls before the first token */
    int calls_first;
} sink;

static int on_tok(void *ud, const dfl_token_info *t) {
    sink *s = ud;
    if (!s->n && s->o) s->calls_first = s->o->calls;
    if (s->n < CTX + 8) s->ids[s->n] = t->id;
    s->n++;
    return s->cancel_at && s->n == s->cancel_at;
}

static void seq_init(dfl_seq *q, dfl_kv *kv) {
    memset(q, 0, sizeof *q);
    q->t = T;
    q->kv = kv;
    q->hist = calloc(CTX, sizeof(int32_t));
    q->logits = dfl_aligned_alloc((size_t)MAXB * T->c.vocab * sizeof(float));
    q->feat = dfl_aligned_alloc((size_t)T->max_rows * 2 * T->c.dim * sizeof(float));
    q->max_block = MAXB;
}

static void seq_free(dfl_seq *q) {
    free(q->hist);
    free(q->logits);
    free(q->feat);
}

/* A fresh cache and sequence with the oracle as its proposer. */
static dfl_kv *oracle_seq(dfl_seq *q, oracle *o, const int *mix, int n_mix) {
    dfl_kv *kv = dfl_kv_new(T, CTX);
    seq_init(q, kv);
    oracle_init(o, kv, mix, n_mix);
    q->pr = &o->base;
    return kv;
}

static int stop_tok = -1;
static int is_stop(void *ud, int32_t id) { (void)ud; return id == stop_tok; }

/* Generates after prompt with a fresh cache; checks ids against ref. */
static void run_case(const char *what, int block, const int *pattern, int np, const int32_t *prompt,
                     int n, int max_tokens) {
    dfl_seq q;
    oracle o;
    dfl_kv *kv = oracle_seq(&q, &o, pattern, np);
    dfl_loop_opts opt = {.block = block, .max_tokens = max_tokens};
    sink s = {0};
    dfl_stats st = {0};
    dfl_error err = {0};
    int rc = dfl_spec_generate(&q, &opt, prompt, n, on_tok, &s, &st, &err);
    CHECK(rc == 0, "%s: %s", what, err.msg);
    int want = max_tokens < CTX - n + 1 ? max_tokens : CTX - n + 1;
    CHECK(s.n == want, "%s: %d tokens, expected %d", what, s.n, want);
    int same = s.n == want;
    for (int i = 0; i < s.n && i < want; i++) same &= s.ids[i] == ref[n + i];
    CHECK(same, "%s: ids differ from classic decode", what);
    CHECK(o.bad == 0, "%s: %d bookkeeping failures", what, o.bad);
    CHECK(st.stop == (want == max_tokens ? DFL_STOP_LENGTH : DFL_STOP_CTX), "%s: stop %d", what,
          st.stop);
    CHECK((int)st.n_gen == s.n, "%s: n_gen %d", what, st.n_gen);
    CHECK(st.rounds + st.classic_steps > 0 && st.proposed >= st.accepted, "%s: stats", what);
    seq_free(&q);
    dfl_kv_free(kv);
}

static void test_forced_lengths(const int32_t *prompt, int n) {
    int blocks[] = {2, 4, 8, 16};
    char what[128];
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
        int B = blocks[bi];
        for (int a = 0; a < B; a++) {
            snprintf(what, sizeof what, "B=%d accept=%d", B, a);
            run_case(what, B, &a, 1, prompt, n, 1000);
        }
        int mix[] = {0, 3, 1, B - 1, 2, 0, 0, B - 2, 5, 1};
        snprintf(what, sizeof what, "B=%d mixture", B);
        run_case(what, B, mix, 10, prompt, n, 1000);
        snprintf(what, sizeof what, "B=%d mixture, max_tokens 37", B);
        run_case(what, B, mix, 10, prompt, n, 37);
    }
    int mix[] = {4, 0, 15, 2, 7, 1};
    run_case("adaptive policy", 0, mix, 6, prompt, n, 1000);
    run_case("classic (block 1)", 1, mix, 6, prompt, n, 1000);
}

/* A follow-up turn reuses the cached prefix and still matches. */
static void test_prefix_reuse(const int32_t *prompt, int n) {
    dfl_seq q;
    oracle o;
    int mix[] = {2, 0, 5, 1};
    dfl_kv *kv = oracle_seq(&q, &o, mix, 4);
    dfl_loop_opts opt = {.block = 8, .max_tokens = 40};
    dfl_error err = {0};
    sink s = {0};
    dfl_stats st = {0};
    int rc = dfl_spec_generate(&q, &opt, prompt, n, on_tok, &s, &st, &err);
    CHECK(rc == 0 && s.n == 40, "first turn: %s", err.msg);
    /* second turn: the first turn's prompt and 30 of its tokens, then more */
    int n2 = n + 30;
    s = (sink){0};
    st = (dfl_stats){0};
    opt.max_tokens = 60;
    rc = dfl_spec_generate(&q, &opt, ref, n2, on_tok, &s, &st, &err);
    CHECK(rc == 0 && s.n == 60, "second turn: %s (%d tokens)", err.msg, s.n);
    int same = 1;
    for (int i = 0; i < s.n && i < 60; i++) same &= s.ids[i] == ref[n2 + i];
    CHECK(same, "second turn differs from classic decode");
    CHECK(o.bad == 0, "second turn: %d bookkeeping failures", o.bad);
    /* a prompt that diverges early truncates both caches */
    int32_t other[8];
    memcpy(other, ref, sizeof other);
    other[5] = (other[5] + 1) % T->c.vocab;
    s = (sink){0};
    o.strict = 0;
    rc = dfl_spec_generate(&q, &opt, other, 8, on_tok, &s, &st, &err);
    CHECK(rc == 0 && kv->len >= 8 && o.len == kv->len, "diverged prompt: kv %d, proposer %d",
          kv->len, o.len);
    seq_free(&q);
    dfl_kv_free(kv);
}

/* Stop tokens and cancellation end generation inside a round, and the
 * caches end at the committed length. */
static void test_stops(const int32_t *prompt, int n) {
    int mix[] = {7, 7, 7};
    for (int k = 3; k < 60; k += 7) {
        dfl_kv *kv = dfl_kv_new(T, CTX);
        dfl_seq q;
        seq_init(&q, kv);
        oracle o;
        oracle_init(&o, kv, mix, 3);
        o.feedback = 0;   /* the last round's feed-back is cut at the stop */
        q.pr = &o.base;
        /* the stop token: the k-th generated token; generation ends at its first occurrence */
        stop_tok = ref[n + k];
        int first = 0;
        while (ref[n + first] != stop_tok) first++;
        dfl_loop_opts opt = {.block = 8, .max_tokens = 1000, .is_stop = is_stop};
        sink s = {0};
        dfl_stats st = {0};
        dfl_error err = {0};
        int rc = dfl_spec_generate(&q, &opt, prompt, n, on_tok, &s, &st, &err);
        CHECK(rc == 0 && s.n == first + 1 && st.stop == DFL_STOP_EOS,
              "stop token %d: %d tokens, expected %d", stop_tok, s.n, first + 1);
        CHECK(kv->len <= n + s.n && kv->len >= n + s.n - 1 && o.len == kv->len,
              "after stop: kv %d, proposer %d, committed %d", kv->len, o.len, n + s.n);
        for (int i = 0; i < kv->len; i++)
            if (q.hist[i] != ref[i]) {
                CHECK(0, "hist[%d] wrong after stop", i);
                break;
            }
        /* cancel at the k-th token */
        seq_free(&q);
        dfl_kv_free(kv);
        kv = dfl_kv_new(T, CTX);
        seq_init(&q, kv);
        oracle_init(&o, kv, mix, 3);
        o.feedback = 0;
        q.pr = &o.base;
        opt.is_stop = NULL;
        s = (sink){.cancel_at = k};
        st = (dfl_stats){0};
        rc = dfl_spec_generate(&q, &opt, prompt, n, on_tok, &s, &st, &err);
        CHECK(rc == 0 && s.n == k && st.stop == DFL_STOP_CANCEL, "cancel at %d: %d tokens", k,
              s.n);
        CHECK(o.len == kv->len && kv->len <= n + k, "after cancel: kv %d, proposer %d", kv->len,
              o.len);
        seq_free(&q);
        dfl_kv_free(kv);
    }
    stop_tok = -1;
}

/* While the crowd gate holds a sequence to classic steps (a second, idle
 * sequence joined; a fresh gate that measured classic steps only, whose
 * held sequences do not yet want speculation), its parked rows become holes
 * in a proposer that can skip, and are fed to one that cannot; either way
 * the proposer stays in step with the cache, the ids are classic decode's,
 * and once alone again it drafts from the rows it has. Held, it verifies no
 * block, but probes on its policy's schedule (never before its first token,
 * which would wait for the drafter): drafts checked against the classic
 * steps that follow, whose evidence reaches the policy it hands on
 * (opt.carry): three in 80 tokens, an overdue one at the second step, then
 * two more (a crowd of two probes half as often as a slot alone). With
 * every draft right (all7) every position probed hits; with the mix, the
 * first probe's first draft misses, the second's fourth, the third's
 * second. Held by evidence, speculation measured behind in the nearest
 * crowd (held 1) or far behind in its own (held 2), it does not probe at
 * all: the gate's next try comes on its own schedule. */
static void test_gated(const int32_t *prompt, int n, int can_skip, int all7, int held) {
    static const char *how[] = {"fresh", "behind", "far"};
    char what[64];
    snprintf(what, sizeof what, "gated %s, %s, %s", how[held], can_skip ? "skipping" : "no skip",
             all7 ? "drafts right" : "mixed drafts");
    dfl_seq q;
    oracle o;
    int mix[] = {0, 3, 1, 7}, right[] = {7};
    dfl_kv *kv = all7 ? oracle_seq(&q, &o, right, 1) : oracle_seq(&q, &o, mix, 4);
    o.feedback = 0;   /* a held probe's drafts are followed by parked rows, not a round's */
    if (can_skip) o.base.skip = o_skip;
    dfl_gate g;
    dfl_gate_init(&g);
    /* in tok/s, for a crowd of two: classic steps 1e6 (this run's own classic
     * spans decay that towards its rate); speculation never measured, or far
     * behind at 1; or the evidence of a crowd of three, which this run never
     * measures: 0.9e6 against 1e6, behind by the margin but not far */
    int c = held == 1;
    g.tok[c][0] = 1e6, g.sec[c][0] = 1;
    if (held) g.tok[c][1] = held == 1 ? 0.9e6 : 1, g.sec[c][1] = 1;
    g.every[0] = DFL_GATE_EXPLORE_MAX;
    dfl_costs alone, crowd[DFL_LANES];
    dfl_costs_init(&alone, 16);
    for (int l = 0; l < DFL_LANES; l++) dfl_costs_init(&crowd[l], 16);
    dfl_policy carry;
    dfl_policy_init(&carry, &alone, MAXB);
    carry.classic_run = 1 << 20;   /* back for a next request, with a probe overdue */
    dfl_loop_opts opt = {.block = 0, .max_tokens = 80, .gate = &g, .costs = &alone,
                         .crowd_costs = crowd, .carry = &carry};
    sink s = {.o = &o};
    dfl_stats st = {0};
    dfl_error err = {0};
    /* the idle second sequence: every round is gated; 80 tokens fill the
     * parking rows (max_rows - 1) once */
    dfl_target_join(T);
    int rc = dfl_spec_generate(&q, &opt, prompt, n, on_tok, &s, &st, &err);
    dfl_target_leave(T);
    int same = rc == 0 && s.n == 80;
    for (int i = 0; same && i < s.n; i++) same &= s.ids[i] == ref[n + i];
    CHECK(same, "%s: ids differ from classic decode (%s)", what, err.msg);
    CHECK(st.rounds == 0 && o.calls == (held ? 0 : 3), "%s: %d rounds, %d held probes", what,
          (int)st.rounds, o.calls);
    CHECK(s.calls_first == 0, "%s: %d held probes before the first token", what, s.calls_first);
    int probed = carry.tries[0] > 0 && carry.hits[0] > 0;
    CHECK(held ? carry.tries[0] == 0
              : all7 ? probed && carry.hits[6] > 0 && carry.hits[0] == carry.tries[0]
                     : probed && carry.hits[0] < carry.tries[0] && carry.tries[1] > 0,
          "%s: evidence tries %g %g .. %g, hits %g %g .. %g", what, carry.tries[0],
          carry.tries[1], carry.tries[6], carry.hits[0], carry.hits[1], carry.hits[6]);
    CHECK(o.len == kv->len && o.bad == 0, "%s: proposer %d, kv %d, %d bookkeeping failures",
          what, o.len, kv->len, o.bad);
    /* the crowd's steps cost their share of a shared forward: its own table */
    CHECK(crowd[DFL_LANE_DRAFTER].t_round[0][1] > 0 && !(alone.t_round[0][1] > 0),
          "%s: crowd step %g s, alone %g s (want the crowd's table only)", what,
          crowd[DFL_LANE_DRAFTER].t_round[0][1], alone.t_round[0][1]);
    CHECK(can_skip ? o.skipped > 0 && o.fed + o.skipped == kv->len : o.skipped == 0,
          "%s: %d positions fed, %d skipped, of %d", what, o.fed, o.skipped, kv->len);
    /* alone: the next turn drafts over the holes */
    s = (sink){0};
    st = (dfl_stats){0};
    opt.max_tokens = 20;
    rc = dfl_spec_generate(&q, &opt, ref, n + 80, on_tok, &s, &st, &err);
    same = rc == 0 && s.n == 20;
    for (int i = 0; same && i < s.n; i++) same &= s.ids[i] == ref[n + 80 + i];
    CHECK(same && st.rounds > 0, "%s, then alone: ids differ or no rounds (%d; %s)", what,
          (int)st.rounds, err.msg);
    CHECK(alone.t_round[0][1] > 0, "%s, then alone: no step timed in the table alone", what);
    CHECK(o.len == kv->len && o.bad == 0, "%s, then alone: proposer %d, kv %d", what, o.len,
          kv->len);
    dfl_gate_free(&g);
    seq_free(&q);
    dfl_kv_free(kv);
}

/* In a crowd not expected to draft soon (held_idle: its gate measured
 * speculation far behind, or behind, or a fresh gate that measured none and
 * that no held sequence asked for), a prompt's rows but the newest 7 (PARK_KEEP)
 * become a hole in a proposer that can skip, and the rows parked at the end
 * do too; where the gate measured speculation ahead every row is fed.
 * Either way the ids are classic decode's, the fed rows carry their own
 * features (the oracle checks them bit for bit), and the proposer keeps in
 * step with the cache. */
static void test_held_prompt(void) {
    int mix[] = {0}, n = 40;
    static const char *whats[] = {"speculation ahead", "fresh gate", "held far", "held behind"};
    for (int k = 0; k < 4; k++) {
        int hole = k > 0;
        dfl_seq q;
        oracle o;
        dfl_kv *kv = oracle_seq(&q, &o, mix, 1);
        o.base.skip = o_skip;
        dfl_gate g;
        dfl_gate_init(&g);
        /* classic / speculation, tok/s */
        double r0 = k ? 1e6 : 1, r1 = k == 3 ? 0.9e6 : k ? 1 : 1e6;
        if (k != 1) g.tok[0][0] = r0, g.sec[0][0] = 1, g.tok[0][1] = r1, g.sec[0][1] = 1;
        dfl_costs alone, crowd[DFL_LANES];
        dfl_costs_init(&alone, 16);
        for (int l = 0; l < DFL_LANES; l++) dfl_costs_init(&crowd[l], 16);
        dfl_loop_opts opt = {.block = 0, .max_tokens = 4, .gate = &g, .costs = &alone,
                             .crowd_costs = crowd};
        sink s = {0};
        dfl_stats st = {0};
        dfl_error err = {0};
        dfl_target_join(T);   /* an idle second sequence: a crowd of two */
        int rc = dfl_spec_generate(&q, &opt, ref, n, on_tok, &s, &st, &err);
        dfl_target_leave(T);
        int same = rc == 0 && s.n == 4;
        for (int i = 0; same && i < s.n; i++) same &= s.ids[i] == ref[n + i];
        const char *what = whats[k];
        CHECK(same, "%s: ids differ from classic decode (%s)", what, err.msg);
        CHECK(hole ? o.fed == 7 && o.skipped == kv->len - 7 : o.fed == kv->len && !o.skipped,
              "%s: %d rows fed, %d skipped, of %d", what, o.fed, o.skipped, kv->len);
        CHECK(o.len == kv->len && o.bad == 0, "%s: proposer %d, kv %d, %d bookkeeping failures",
              what, o.len, kv->len, o.bad);
        dfl_gate_free(&g);
        seq_free(&q);
        dfl_kv_free(kv);
    }
}

int main(void) {
    const char *path = getenv("DFLASH_ORACLE_TARGET");
    if (!path) path = test_asset("stories260K/stories260K.gguf");
    if (!path) return test_summary();
    dfl_pool *pool = dfl_pool_new(2);
    dfl_load_opts lo = {.max_rows = 64, .pool = pool};
    dfl_error err = {0};
    int rc = dfl_target_load(path, &lo, &T, &err);
    CHECK(rc == 0, "load: %s", err.msg);
    if (rc) return test_summary();
    int32_t prompt[6] = {1, 403, 407, 261, 378, 309};   /* BOS + a few story pieces */
    for (int i = 0; i < 6; i++) prompt[i] %= T->c.vocab;
    make_reference(prompt, 6);
    test_forced_lengths(prompt, 6);
    test_prefix_reuse(prompt, 6);
    test_stops(prompt, 6);
    for (int k = 0; k < 8; k++)   /* held: fresh with every mix, then behind, far */
        test_gated(prompt, 6, k & 1, (k >> 1) & 1, k < 4 ? 0 : k < 6 ? 1 : 2);
    test_held_prompt();
    free(ref_feat);
    /* a one-token prompt: the first round drafts with an empty context */
    make_reference(prompt, 1);
    int mix[] = {3, 0, 7, 1};
    run_case("one-token prompt B=8", 8, mix, 4, prompt, 1, 1000);
    run_case("one-token prompt B=2", 2, mix, 4, prompt, 1, 1000);
    free(ref_feat);
    dfl_target_free(T);
    dfl_pool_free(pool);
    return test_summary();
}
