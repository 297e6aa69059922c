/* test_sample_loop.c - the sampler's acceptance rules inside the real round
 * loop (src/decode/loop.c) on the stories260K target (a trained tiny Llama).
 *
 * The reference is classic sampled decode computed here with direct target
 * calls, one row at a time, independent of the loop. An oracle proposer that
 * knows it forces accept lengths (all, none, mixtures), so the exact rule is
 * exercised through every path of the loop: its output must equal the
 * reference token for token, for several seeds, temperatures, filters,
 * penalties and block sizes. The rejection and typical rules run through the
 * same loop (drafter rows supplied by the oracle): deterministic per seed,
 * greedy at temperature 0, and typical with d = 0 equals exact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample.h"
#include "decode/decode.h"
#include "testutil.h"

enum { CTX = 120, MAXB = 16 };

static dfl_target *T;
static int32_t ref[CTX + 1 + MAXB]; /* prompt + classic sampled output (+ slack) */

/* ---- the reference: classic sampled decode, one row at a time ------------ */

static void make_reference(const dfl_gen_params *p, const int32_t *prompt, int n) {
    dfl_kv *kv = dfl_kv_new(T, CTX);
    float *lg = dfl_aligned_alloc((size_t)T->c.vocab * sizeof(float));
    dfl_sampler *s = NULL;
    dfl_error err = {0};
    CHECK(dfl_sampler_new(p, T->c.vocab, &s, &err) == 0, "sampler: %s", err.msg);
    memcpy(ref, prompt, n * sizeof(int32_t));
    for (int i = 0; i < n - 1; i++) dfl_target_forward(T, kv, ref + i, 1, 1, NULL, NULL, 0, NULL, &err);
    for (int i = n - 1; i < CTX; i++) {
        dfl_target_forward(T, kv, ref + i, 1, 0, lg, NULL, 0, NULL, &err);
        ref[i + 1] = dfl_sample(s, lg, ref, i + 1);
    }
    for (int i = CTX + 1; i < CTX + 1 + MAXB; i++) ref[i] = (i * 31) % T->c.vocab;
    dfl_sampler_free(s);
    dfl_kv_free(kv);
    free(lg);
}

/* ---- the oracle proposer ---------------------------------------------------- */

typedef struct oracle {
    dfl_proposer base;
    int len, round;
    const int *pattern;
    int n_pattern;
} oracle;

static int o_add(dfl_proposer *p, const float *feat, const int32_t *tok, int n,
                 dfl_error *err) {
    (void)tok;
    (void)feat, (void)err;
    ((oracle *)p)->len += n;
    return 0;
}

/* Drafts the reference for the first a positions, then wrong tokens; drafter
 * rows (when asked) are a fixed function of the position, unlike the target. */
static int o_draft(dfl_proposer *p, int32_t anchor, int pos, int B, int32_t *out, float *logits,
                   dfl_error *err) {
    (void)anchor, (void)err;
    oracle *o = (oracle *)p;
    int a = o->pattern[o->round++ % o->n_pattern], V = T->c.vocab;
    for (int i = 0; i < B - 1; i++) {
        int32_t good = ref[pos + 1 + i];
        out[i] = i < a ? good : (good + 1 + i) % V;
        if (logits)
            for (int j = 0; j < V; j++)
                logits[(size_t)i * V + j] =
                    (float)((dfl_rng_u64(9, 9, (uint64_t)(pos + i) * V + j, 0) >> 40) % 1000) *
                        0.004f + (j == good ? 3.0f : 0.0f);
    }
    return 0;
}

static void o_truncate(dfl_proposer *p, int n) {
    oracle *o = (oracle *)p;
    if (n < o->len) o->len = n;
}

static int o_len(const dfl_proposer *p) { return ((const oracle *)p)->len; }

/* ---- the sampler behind the loop's seams (as src/api/generate.c has it) --- */

static int accept_sampled(void *ud, const float *logits, int vocab, const int32_t *block, int B,
                          int pos, const int32_t *hist, const float *dlogits, int32_t *tgt) {
    (void)vocab;
    dfl_sampler *s = ud;
    if (B == 1) {
        tgt[0] = dfl_sample(s, logits, hist, pos + 1);
        return 0;
    }
    dfl_accept_result r;
    dfl_accept(s, logits, B, block + 1, dlogits, hist, pos + 1, &r);
    for (int i = 0; i < r.n_accepted; i++) tgt[i] = block[i + 1];
    tgt[r.n_accepted] = r.next;
    return r.n_accepted;
}

static void redraft_sampled(void *ud, const float *dlogits, int n, const int32_t *hist, int pos,
                            int32_t *draft) {
    dfl_sample_drafts(ud, dlogits, n, hist, pos + 1, draft);
}

/* ---- running the loop --------------------------------------------------------- */

typedef struct sink {
    int32_t ids[CTX + 8];
    int n;
} sink;

static int on_tok(void *ud, const dfl_token_info *t) {
    sink *s = ud;
    if (s->n < CTX + 8) s->ids[s->n] = t->id;
    s->n++;
    return 0;
}

/* Generates after prompt with a fresh cache; returns tokens in out. */
static int run_loop(const dfl_gen_params *p, int block, const int *pattern, int np,
                    const int32_t *prompt, int n, sink *out, dfl_stats *st) {
    dfl_kv *kv = dfl_kv_new(T, CTX);
    size_t V = (size_t)T->c.vocab;
    dfl_seq q = {.t = T, .kv = kv, .max_block = MAXB};
    q.hist = calloc(CTX, sizeof(int32_t));
    q.logits = dfl_aligned_alloc(MAXB * V * sizeof(float));
    q.dlogits = dfl_aligned_alloc(MAXB * V * sizeof(float));
    oracle o = {{o_add, o_draft, o_truncate, o_len, NULL, 0, MAXB}, 0, 0, pattern, np};
    q.pr = &o.base;
    dfl_sampler *s = NULL;
    dfl_error err = {0};
    dfl_sampler_new(p, T->c.vocab, &s, &err);
    int rej = p->spec_accept == DFL_ACCEPT_REJECTION;
    dfl_loop_opts opt = {.block = block, .max_tokens = 1000, .accept = accept_sampled,
                         .accept_ud = s, .need_dlogits = rej,
                         .redraft = rej ? redraft_sampled : NULL};
    memset(out, 0, sizeof *out);
    memset(st, 0, sizeof *st);
    int rc = dfl_spec_generate(&q, &opt, prompt, n, on_tok, out, st, &err);
    if (rc) fprintf(stderr, "loop: %s\n", err.msg);
    dfl_sampler_free(s);
    free(q.hist);
    free(q.logits);
    free(q.dlogits);
    dfl_kv_free(kv);
    return rc;
}

static int matches_ref(const sink *s, int n) {
    int want = CTX - n + 1, same = s->n == want;
    for (int i = 0; same && i < want; i++) same &= s->ids[i] == ref[n + i];
    return same;
}

static dfl_gen_params params(int setting, uint64_t seed) {
    static int32_t bid[2] = {261, 403};
    static float bval[2] = {1.5f, -INFINITY};
    dfl_gen_params p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f, p.repeat_penalty = 1.0f, p.typical_d = 0.2f, p.seed = seed;
    switch (setting) {
    case 0: p.temperature = 1.0f; break;
    case 1: p.temperature = 0.7f, p.top_k = 40, p.top_p = 0.9f; break;
    case 2: p.temperature = 0.8f, p.min_p = 0.05f, p.repeat_penalty = 1.3f,
            p.frequency_penalty = 0.3f, p.presence_penalty = 0.2f, p.repeat_last_n = 16;
            p.bias_ids = bid, p.bias_vals = bval, p.n_bias = 2; break;
    case 3: p.temperature = 1.3f, p.top_p = 0.95f, p.repeat_penalty = 1.1f; break;
    }
    return p;
}

static void test_exact_in_loop(const int32_t *prompt, int n) {
    static const int blocks[] = {2, 4, 8, 16};
    int runs = 0, bad = 0, accepted = 0;
    for (int set = 0; set < 4; set++)
        for (uint64_t seed = 1; seed <= 3; seed++) {
            dfl_gen_params p = params(set, seed);
            make_reference(&p, prompt, n);
            for (int bi = 0; bi < 4; bi++) {
                int B = blocks[bi];
                int all = B - 1, none = 0, mix[] = {0, 3, 1, B - 1, 2, 0, B - 2, 5, 1};
                const int *pats[3] = {&all, &none, mix};
                int np[3] = {1, 1, 9};
                for (int pi = 0; pi < 3; pi++) {
                    sink s;
                    dfl_stats st;
                    int rc = run_loop(&p, B, pats[pi], np[pi], prompt, n, &s, &st);
                    int ok = rc == 0 && matches_ref(&s, n);
                    if (!ok && bad < 5)
                        fprintf(stderr, "exact: setting %d seed %d B %d pattern %d differs\n", set,
                                (int)seed, B, pi);
                    bad += !ok;
                    runs++;
                    accepted += (int)st.accepted;
                    if (pi == 0) /* every forced-correct draft is kept */
                        bad += st.accepted != st.proposed;
                }
            }
        }
    CHECK(bad == 0, "exact rule in the loop: %d of %d runs differ from classic sampled decode", bad,
          runs);
    CHECK(accepted > 1000, "drafts were accepted (%d)", accepted);
}

static void test_other_rules(const int32_t *prompt, int n) {
    int mix[] = {0, 3, 1, 7, 2};
    sink a, b;
    dfl_stats st;
    for (int set = 0; set < 4; set++) {
        dfl_gen_params p = params(set, 11);
        make_reference(&p, prompt, n);
        /* typical with d = 0 is the exact rule */
        p.spec_accept = DFL_ACCEPT_TYPICAL;
        p.typical_d = 0;
        CHECK(run_loop(&p, 8, mix, 5, prompt, n, &a, &st) == 0 && matches_ref(&a, n),
              "typical d=0, setting %d: differs from classic", set);
        /* rejection and typical: valid, and the same twice for one seed */
        for (int rule = DFL_ACCEPT_REJECTION; rule <= DFL_ACCEPT_TYPICAL; rule++) {
            p.spec_accept = rule;
            p.typical_d = 0.3f;
            int r1 = run_loop(&p, 8, mix, 5, prompt, n, &a, &st);
            int r2 = run_loop(&p, 8, mix, 5, prompt, n, &b, &st);
            int valid = a.n == CTX - n + 1;
            for (int i = 0; valid && i < a.n; i++) valid &= a.ids[i] >= 0 && a.ids[i] < T->c.vocab;
            CHECK(r1 == 0 && r2 == 0 && valid, "rule %d setting %d: %d tokens", rule, set, a.n);
            CHECK(a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * a.n),
                  "rule %d setting %d: not reproducible", rule, set);
            CHECK(st.rounds > 0 && st.accepted <= st.proposed, "rule %d: stats", rule);
        }
    }
    /* temperature 0: every rule is greedy, whatever the drafts */
    dfl_gen_params g = params(0, 5);
    g.temperature = 0;
    make_reference(&g, prompt, n);
    for (int rule = 0; rule <= 2; rule++) {
        g.spec_accept = rule;
        CHECK(run_loop(&g, 4, mix, 5, prompt, n, &a, &st) == 0 && matches_ref(&a, n),
              "temperature 0, rule %d: differs from greedy", rule);
    }
}

int main(void) {
    const char *path = test_asset("stories260K/stories260K.gguf");
    if (!path) return test_summary();
    dfl_pool *pool = dfl_pool_new(2);
    dfl_load_opts lo = {.max_rows = 64, .pool = pool};
    dfl_error err = {0};
    int rc = dfl_target_load(path, &lo, &T, &err);
    CHECK(rc == 0, "load: %s", err.msg);
    if (rc) return test_summary();
    int32_t prompt[6] = {1, 403, 407, 261, 378, 309}; /* BOS + a few story pieces */
    test_exact_in_loop(prompt, 6);
    test_other_rules(prompt, 6);
    dfl_target_free(T);
    dfl_pool_free(pool);
    return test_summary();
}
