/* test_bench.c - the benchmark's moving parts on a random Qwen3 target and a
 * random DFlash drafter (tools/make_checkpoint.py), without timing
 * assertions:
 *   - start-up calibration fills the round-cost table at the sizes it
 *     promises (and only those), a second call measures nothing, and the
 *     first adaptive dfl_generate of a fresh engine runs it, as does
 *     dfl_engine_prepare (a server's load), with a drafter or the n-gram
 *     lane alone;
 *   - the replay drafter's output equals classic decode, and every run
 *     accepts exactly what its forced accept lengths say (simulated here
 *     from dfl_replay_accept_len, independently of the loop);
 *   - the flat profile's tau <-> p relation;
 *   - timed forwards at a depth leave the session usable and refuse what
 *     does not fit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/engine.h"
#include "decode/decode.h"
#include "testutil.h"

enum { CTX = 400, NGEN = 96, NREF = NGEN + 40 };

typedef struct sink {
    int32_t ids[NREF + 64];
    int n;
} sink;

static int on_tok(void *ud, const dfl_token_info *t) {
    sink *s = ud;
    if (s->n < NREF + 64) s->ids[s->n] = t->id;
    s->n++;
    return 0;
}

static const int promised[] = {1, 2, 3, 4, 6, 8, 12, 16};

static void test_calibrate(dfl_engine *e) {
    dfl_error err = {0};
    double *T0 = e->costs.t_round[0];   /* calibration runs at a short context */
    dfl_costs_init(&e->costs, e->max_block);
    int n = dfl_spec_calibrate(e, 0, &err);
    CHECK(n == 8, "calibrate measured %d sizes: %s", n, err.msg);
    int filled = 0;
    for (int B = 1; B <= 16; B++) {
        int want = 0;
        for (int i = 0; i < 8; i++) want |= promised[i] == B;
        CHECK(want ? T0[B] > 0 : T0[B] == 0,
              "t_round[%d] = %g (promised %d)", B, T0[B], want);
        filled += T0[B] > 0;
    }
    CHECK(filled == 8, "%d sizes filled", filled);
    CHECK(dfl_costs_get(&e->costs, 5, 0) > 0 && dfl_costs_get(&e->costs, 10, 0) > 0,
          "interpolated sizes have a cost");
    double before[17];
    memcpy(before, T0, sizeof before);
    CHECK(dfl_spec_calibrate(e, 0, &err) == 0, "second calibration measures nothing");
    CHECK(!memcmp(before, T0, sizeof before), "and changes nothing");
    /* a stall while a size was timed: capped by the larger sizes' times */
    dfl_costs_init(&e->costs, e->max_block);
    T0[1] = 1.0;
    CHECK(dfl_spec_calibrate(e, 0, &err) == 7, "a table with block 1 measures the other 7");
    for (int i = 0; i + 1 < 8; i++)
        CHECK(T0[promised[i]] <= T0[promised[i + 1]], "t_round[%d] = %g above t_round[%d] = %g",
              promised[i], T0[promised[i]], promised[i + 1], T0[promised[i + 1]]);
    /* a cap: only sizes up to it */
    dfl_costs_init(&e->costs, e->max_block);
    CHECK(dfl_spec_calibrate(e, 5, &err) == 4 && T0[4] > 0 &&
          T0[6] == 0, "bmax 5 measures 1..4");

    /* the first adaptive request of an engine calibrates */
    dfl_costs_init(&e->costs, e->max_block);
    dfl_session *s;
    dfl_session_new(e, &s, &err);
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    p.max_tokens = 4, p.ignore_eos = 1, p.block_size = 0;
    int32_t prompt[3] = {355, 12, 200};
    sink out = {{0}, 0};
    int rc = dfl_generate(s, prompt, 3, &p, on_tok, &out, NULL, &err);
    CHECK(rc == 0, "adaptive generate: %s", err.msg);
    for (int i = 0; i < 8; i++)
        CHECK(T0[promised[i]] > 0, "after adaptive generate: t_round[%d] = %g",
              promised[i], T0[promised[i]]);
    dfl_session_free(s);

    /* ... and so does a server's preparation at load, with the probe */
    dfl_costs_init(&e->costs, e->max_block);
    int exact = 0;
    CHECK(dfl_engine_prepare(e, &exact, &err) == 0 && exact == 1, "prepare: exact %d: %s", exact,
          err.msg);
    for (int i = 0; i < 8; i++)
        CHECK(T0[promised[i]] > 0, "after prepare: t_round[%d] = %g", promised[i], T0[promised[i]]);
    CHECK(dfl_spec_calibrate(e, 0, &err) == 0, "after prepare nothing is left to measure");
}

/* An engine whose only lane is the n-gram one prepares too: probe and costs. */
static void test_prepare_ngram(const dfl_engine_opts *base) {
    dfl_engine_opts o = *base;
    o.draft_path = NULL;
    o.ngram = 1;
    dfl_engine *e;
    dfl_error err = {0};
    int rc = dfl_engine_load(&o, &e, &err), exact = 0;
    CHECK(rc == 0, "load with the n-gram lane: %s", err.msg);
    if (rc) return;
    CHECK(dfl_engine_prepare(e, &exact, &err) == 0 && exact == 1, "prepare (n-gram): exact %d: %s",
          exact, err.msg);
    CHECK(e->costs_ngram.t_round[0][1] > 0 && e->costs_ngram.t_round[0][2] > 0,
          "prepare (n-gram) measured the lane's round costs");
    CHECK(dfl_spec_calibrate(e, 0, &err) == 0, "after prepare (n-gram) nothing is left to measure");
    dfl_engine_free(e);
}

static void test_tau(void) {
    CHECK(fabs(dfl_replay_tau(0, 15) - 1) < 1e-12, "tau(0) = 1");
    CHECK(fabs(dfl_replay_tau(1, 15) - 16) < 1e-12, "tau(1) = 16");
    CHECK(fabs(dfl_replay_tau(0.5, 3) - 1.875) < 1e-12, "tau(0.5, 3) = 1 + .5 + .25 + .125");
    double taus[] = {1.5, 3, 5, 6.5, 12};
    for (int i = 0; i < 5; i++) {
        double p = dfl_replay_p_for_tau(taus[i], 15);
        CHECK(p > 0 && p < 1 && fabs(dfl_replay_tau(p, 15) - taus[i]) < 1e-9, "tau %g: p %g",
              taus[i], p);
    }
    CHECK(dfl_replay_p_for_tau(1, 15) == 0 && dfl_replay_p_for_tau(40, 15) == 1, "ends");
}

/* What the loop must accept with a pinned block, replayed independently:
 * the block shrinks only at max_tokens (the cache is large enough). */
static void simulate(const dfl_replay_proposer *rp, int n_prompt, int max_tokens, int block,
                     uint64_t *rounds, uint64_t *accepted) {
    int pos = n_prompt - 1, gen = 0;
    *rounds = *accepted = 0;
    while (gen < max_tokens) {
        int B = block < max_tokens - gen ? block : max_tokens - gen;
        if (B == 1) {   /* a classic step */
            gen++, pos++;
            continue;
        }
        int k = dfl_replay_accept_len(rp, pos);
        int a = k < B - 1 ? k : B - 1;
        (*rounds)++;
        *accepted += a;
        gen += a + 1, pos += a + 1;
    }
}

/* A proposer that is never called: dfl_replay_accept_len needs only the profile. */
static int no_add(dfl_proposer *p, const float *f, const int32_t *t, int n, dfl_error *e) {
    return 0;
}
static int no_draft(dfl_proposer *p, int32_t a, int pos, int B, int32_t *o, float *l,
                    dfl_error *e) { return -1; }
static void no_trunc(dfl_proposer *p, int n) {}
static int no_len(const dfl_proposer *p) { return 0; }

static void test_replay(dfl_engine *e) {
    dfl_error err = {0};
    dfl_session *s;
    dfl_session_new(e, &s, &err);
    int32_t prompt[9] = {355, 12, 200, 31, 7, 400, 90, 91, 92};
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.block_size = 1, gp.ignore_eos = 1, gp.max_tokens = NREF;
    sink ref = {{0}, 0};
    CHECK(dfl_generate(s, prompt, 9, &gp, on_tok, &ref, NULL, &err) == 0 && ref.n == NREF,
          "reference: %d tokens %s", ref.n, err.msg);

    double flat_p[15], ones[15], first3[15];
    for (int i = 0; i < 15; i++) ones[i] = 1, first3[i] = i < 3;
    struct { double tau; const double *p; int block; } cases[] = {
        {1, NULL, 8},   {3, NULL, 4}, {3, NULL, 8},  {6.5, NULL, 16}, {6.5, NULL, 5},
        {0, ones, 16},  {0, ones, 3}, {0, first3, 8}, {5, NULL, 0},    {1, NULL, 0},
        {0, NULL, 1},
    };
    dfl_proposer dummy = {no_add, no_draft, no_trunc, no_len, NULL, 0, 16};
    int32_t seq[9 + NREF];
    memcpy(seq, prompt, sizeof prompt);
    memcpy(seq + 9, ref.ids, sizeof(int32_t) * NREF);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dfl_bench_replay_opts o = {.block = cases[c].block, .tau = cases[c].tau, .seed = 7 + c,
                                   .max_tokens = NGEN, .fresh_costs = 1};
        if (cases[c].p) o.p = cases[c].p, o.n_p = 15;
        dfl_bench_replay_result r;
        int rc = dfl_bench_replay(s, prompt, 9, ref.ids, NREF, &o, &r, &err);
        CHECK(rc == 0, "case %zu: %s", c, err.msg);
        if (rc) continue;
        CHECK(r.n_out == NGEN && r.matches_ref, "case %zu (block %d tau %g): %d tokens, %s", c,
              o.block, o.tau, r.n_out, r.matches_ref ? "same" : "DIFFERENT from classic");
        if (o.block == 1) {
            CHECK(r.st.rounds == 0 && r.st.classic_steps == NGEN && r.draft_calls == 0,
                  "classic replay: %llu rounds", (unsigned long long)r.st.rounds);
            continue;
        }
        /* the loop accepted exactly what was forced */
        CHECK(r.st.accepted == r.forced && r.draft_calls == r.st.rounds,
              "case %zu: accepted %llu, forced %llu, calls %llu, rounds %llu", c,
              (unsigned long long)r.st.accepted, (unsigned long long)r.forced,
              (unsigned long long)r.draft_calls, (unsigned long long)r.st.rounds);
        if (o.block == 0) {
            CHECK(r.t_calibrate > 0 && r.t_round[8] > 0, "adaptive case %zu calibrated", c);
            continue;
        }
        dfl_replay_proposer sim;
        const double *p = o.p;
        if (!o.n_p) {
            for (int i = 0; i < 15; i++) flat_p[i] = r.p_flat;
            p = flat_p;
        }
        dfl_replay_proposer_init(&sim, &dummy, seq, 9 + NREF, e->t->c.vocab, p, 15, o.seed);
        uint64_t rounds, accepted;
        simulate(&sim, 9, NGEN, o.block, &rounds, &accepted);
        CHECK(r.st.rounds == rounds && r.st.accepted == accepted,
              "case %zu (block %d): loop %llu rounds / %llu accepted, simulated %llu / %llu", c,
              o.block, (unsigned long long)r.st.rounds, (unsigned long long)r.st.accepted,
              (unsigned long long)rounds, (unsigned long long)accepted);
        if (cases[c].p == ones)
            CHECK(r.st.accepted == r.st.rounds * (uint64_t)(o.block - 1) ||
                      r.st.committed == (uint64_t)NGEN,
                  "all-accept profile: every full round accepts B-1");
        if (o.tau == 1) CHECK(r.st.accepted == 0, "tau 1: nothing accepted");
    }
    dfl_session_free(s);
}

static void test_forward(dfl_engine *e) {
    dfl_error err = {0};
    dfl_session *s;
    dfl_session_new(e, &s, &err);
    double sec = 0;
    CHECK(dfl_bench_forward(s, 300, 1, DFL_BENCH_LOGITS, 1, &sec, &err) == 0 && sec > 0,
          "decode at depth 300: %s", err.msg);
    CHECK(dfl_bench_forward(s, 100, 16, DFL_BENCH_LOGITS | DFL_BENCH_CAPTURE, 1, &sec, &err) == 0,
          "verify 16 with capture at depth 100: %s", err.msg);
    CHECK(dfl_bench_forward(s, 0, 64, 0, 1, &sec, &err) == 0, "prefill chunk: %s", err.msg);
    CHECK(dfl_bench_forward(s, CTX - 4, 8, DFL_BENCH_LOGITS, 1, &sec, &err) == DFL_EARG,
          "a block past the cache is refused");
    CHECK(dfl_bench_forward(s, 10, 17, DFL_BENCH_LOGITS, 1, &sec, &err) == DFL_EARG,
          "more logit rows than the engine's block is refused");
    /* the session still generates what a fresh one does */
    dfl_bench_forward(s, 200, 1, DFL_BENCH_LOGITS, 1, &sec, &err);
    dfl_session *f;
    dfl_session_new(e, &f, &err);
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.block_size = 1, gp.ignore_eos = 1, gp.max_tokens = 20;
    int32_t prompt[4] = {1, 2, 3, 4};
    sink a = {{0}, 0}, b = {{0}, 0};
    dfl_generate(s, prompt, 4, &gp, on_tok, &a, NULL, &err);
    dfl_generate(f, prompt, 4, &gp, on_tok, &b, NULL, &err);
    CHECK(a.n == 20 && b.n == 20 && !memcmp(a.ids, b.ids, sizeof(int32_t) * 20),
          "generate after bench forwards");
    CHECK(dfl_bench_read_bw(e, 0, 0) > 0 && dfl_bench_read_bw(e, 64 << 20, 1) > 0 && dfl_bench_fma_peak(e) > 0 && dfl_bench_row_flops(e) > 0,
          "machine limits and row flops are positive");
    dfl_session_free(s);
    dfl_session_free(f);
}

int main(void) {
    const char *dir = test_tmpdir();
    char model[512], draft[512];
    if (test_make_pair(dir, "--preset tiny --dtype bf16", model, draft))
        return test_summary();
    dfl_engine_opts o;
    dfl_engine_opts_default(&o);
    o.model_path = model;
    o.draft_path = draft;
    o.n_threads = 2;
    o.ctx_size = CTX;
    dfl_engine *e;
    dfl_error err = {0};
    int rc = dfl_engine_load(&o, &e, &err);
    CHECK(rc == 0, "load: %s", err.msg);
    if (rc) return test_summary();
    test_tau();
    test_calibrate(e);
    test_replay(e);
    test_forward(e);
    dfl_engine_free(e);
    test_prepare_ngram(&o);
    test_rmdir(dir);
    return test_summary();
}
