/* test_spec_generate.c - the public API end to end on a random Qwen3 target
 * (untied: a tied random model just repeats its input token) and a random
 * z-lab DFlash drafter made by tools/make_checkpoint.py:
 * speculative output identical to classic decode for blocks 2, 4, 8, 16 and
 * the adaptive policy (to the end of the context, and to EOS), stop reasons,
 * cancellation, follow-up turns on one session, sampled speculation, the
 * probe (0 differing bytes), the drafter diagnostic, logprobs left out,
 * replayed requests' acceptance evidence kept apart, and each token's kind
 * (classic, draft, bonus) adding up to the stats in every one of those runs. */
#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "api/engine.h"
#include "testutil.h"

enum { CTX = 128, MAXG = 256 };

typedef struct sink {
    int32_t ids[MAXG];
    float lp[MAXG];
    int n, cancel_at;
    /* the tokens' kinds: counts, round groups (DRAFT* BONUS), and tokens out of
     * that grammar (a round without its bonus that is not the last) */
    uint64_t kinds[3], groups, misplaced;
    int open;   /* a round's drafts came without its bonus yet */
    int first;  /* the first token's kind */
} sink;

static int on_tok(void *ud, const dfl_token_info *t) {
    sink *s = ud;
    if (s->n < MAXG) s->ids[s->n] = t->id, s->lp[s->n] = t->logprob;
    if (!s->n++) s->first = t->kind;
    if (t->kind < 0 || t->kind > DFL_TOKEN_BONUS) {
        s->misplaced++;
    } else {
        s->kinds[t->kind]++;
        if (t->kind != DFL_TOKEN_CLASSIC && !s->open) s->groups++;
        if (t->kind == DFL_TOKEN_CLASSIC && s->open) s->misplaced++;
        s->open = t->kind == DFL_TOKEN_DRAFT;
    }
    return s->cancel_at && s->n == s->cancel_at;
}

/* The kinds the callback saw add up to the stats (include/dflash.h). */
static void check_kinds(const sink *s, const dfl_stats *st, const char *what) {
    CHECK(s->kinds[DFL_TOKEN_DRAFT] == st->accepted &&
          s->kinds[DFL_TOKEN_DRAFT] + s->kinds[DFL_TOKEN_BONUS] == st->committed &&
          s->kinds[DFL_TOKEN_CLASSIC] == st->classic_steps && s->groups == st->rounds &&
          !s->misplaced,
          "%s: kinds classic %llu draft %llu bonus %llu in %llu rounds (%llu misplaced); stats "
          "classic %llu accepted %llu committed %llu rounds %llu", what,
          (unsigned long long)s->kinds[0], (unsigned long long)s->kinds[1],
          (unsigned long long)s->kinds[2], (unsigned long long)s->groups,
          (unsigned long long)s->misplaced, (unsigned long long)st->classic_steps,
          (unsigned long long)st->accepted, (unsigned long long)st->committed,
          (unsigned long long)st->rounds);
}

static int run(dfl_session *s, const int32_t *prompt, int n, const dfl_gen_params *p, sink *out,
               dfl_stats *st) {
    dfl_error err = {0};
    int cancel = out->cancel_at;
    memset(out, 0, sizeof *out);
    out->cancel_at = cancel;
    memset(st, 0, sizeof *st);
    int rc = dfl_generate(s, prompt, n, p, on_tok, out, st, &err);
    if (rc) fprintf(stderr, "generate: %s\n", err.msg);
    else check_kinds(out, st, "kinds");
    return rc;
}

static int same(const sink *a, const sink *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (a->n < MAXG ? a->n : MAXG));
}

static void test_invariance(dfl_engine *e, const int32_t *prompt, int n) {
    dfl_session *s;
    dfl_error err = {0};
    dfl_session_new(e, &s, &err);
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    p.max_tokens = 1000;
    p.ignore_eos = 1;
    p.block_size = 1;
    sink ref, got;
    dfl_stats st;
    CHECK(run(s, prompt, n, &p, &ref, &st) == 0, "classic");
    CHECK(ref.n == CTX - n + 1 && st.stop == DFL_STOP_CTX && st.rounds == 0,
          "classic: %d tokens, stop %d", ref.n, st.stop);
    int distinct = 0;
    for (int i = 1; i < ref.n && i < MAXG; i++) distinct += ref.ids[i] != ref.ids[i - 1];
    CHECK(distinct > ref.n / 4, "the reference output is degenerate (%d changes)", distinct);
    int blocks[] = {2, 4, 8, 16, 0};
    for (int i = 0; i < 5; i++) {
        p.block_size = blocks[i];
        dfl_session *f;
        dfl_session_new(e, &f, &err);
        int rc = run(f, prompt, n, &p, &got, &st);
        CHECK(rc == 0 && same(&ref, &got), "block %d: %d tokens differ from classic decode",
              blocks[i], got.n);
        CHECK(st.exact_checked == 1 && st.stop == DFL_STOP_CTX, "block %d: exact %d stop %d",
              blocks[i], st.exact_checked, st.stop);
        CHECK(blocks[i] == 0 || (st.rounds > 0 && st.proposed >= st.rounds),
              "block %d: %llu rounds", blocks[i], (unsigned long long)st.rounds);
        CHECK(st.t_draft >= 0 && st.t_verify > 0 && st.n_gen == got.n, "block %d: stats",
              blocks[i]);
        dfl_session_free(f);
    }
    /* to EOS: the same tokens and the same reason, EOS delivered last */
    p.ignore_eos = 0;
    p.block_size = 1;
    int32_t eos_ids[1] = {ref.ids[40]};
    int first = 0;
    while (first < 40 && ref.ids[first] != eos_ids[0]) first++;
    p.stop_ids = eos_ids, p.n_stop_ids = 1;   /* the random model rarely says EOS by itself */
    run(s, prompt, n, &p, &ref, &st);
    CHECK(st.stop == DFL_STOP_EOS && ref.n == first + 1 && ref.ids[ref.n - 1] == eos_ids[0],
          "classic stops at the stop token: %d tokens, stop %d", ref.n, st.stop);
    for (int b = 2; b <= 16; b *= 2) {
        p.block_size = b;
        run(s, prompt, n, &p, &got, &st);   /* same session: reuses the cached prefix */
        CHECK(same(&ref, &got) && st.stop == DFL_STOP_EOS, "block %d to the stop token", b);
    }
    p.n_stop_ids = 0;
    /* cancellation is not an error and ends right after the token */
    got.cancel_at = 7;
    p.block_size = 8;
    int rc = run(s, prompt, n, &p, &got, &st);
    CHECK(rc == 0 && got.n == 7 && st.stop == DFL_STOP_CANCEL, "cancel: rc %d, %d tokens", rc,
          got.n);
    got.cancel_at = 0;
    dfl_session_free(s);
}

/* A follow-up turn on a session matches the same prompt on a fresh one. */
static void test_turns(dfl_engine *e, const int32_t *prompt, int n) {
    dfl_session *s, *f;
    dfl_error err = {0};
    dfl_session_new(e, &s, &err);
    dfl_session_new(e, &f, &err);
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    p.ignore_eos = 1;
    p.block_size = 8;
    p.max_tokens = 30;
    sink a, b;
    dfl_stats st;
    run(s, prompt, n, &p, &a, &st);
    int32_t turn[128];
    memcpy(turn, prompt, n * sizeof(int32_t));
    memcpy(turn + n, a.ids, 20 * sizeof(int32_t));
    for (int i = 0; i < 5; i++) turn[n + 20 + i] = 100 + i;   /* a "user" reply */
    run(s, turn, n + 25, &p, &a, &st);
    run(f, turn, n + 25, &p, &b, &st);
    CHECK(same(&a, &b), "follow-up turn differs from a fresh session");
    dfl_session_free(s);
    dfl_session_free(f);
}

/* Sampling speculates too: the exact rule gives the same tokens as the same
 * request with block 1 (classic sampled decode); rejection and typical run
 * rounds and say which rule they used. */
static void test_sampling(dfl_engine *e, const int32_t *prompt, int n) {
    dfl_session *s;
    dfl_error err = {0};
    dfl_session_new(e, &s, &err);
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    p.ignore_eos = 1;
    p.max_tokens = 50;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.seed = 7;
    sink a, b;
    dfl_stats st;
    for (int block = 0; block <= 8; block += 4) {
        p.block_size = block;
        int rc = run(s, prompt, n, &p, &a, &st);
        CHECK(rc == 0 && st.rounds > 0 && st.accept_rule == DFL_ACCEPT_EXACT,
              "temperature 0.8, block %d: rounds %llu, note '%s'", block,
              (unsigned long long)st.rounds, st.note);
        /* adaptive: the first token does not wait for a round (time to first token) */
        CHECK((a.first == DFL_TOKEN_CLASSIC) == (block == 0), "block %d: the first token's "
              "kind is %d", block, a.first);
        p.block_size = 1;
        run(s, prompt, n, &p, &b, &st);
        CHECK(same(&a, &b) && b.n == 50, "sampled block %d differs from classic", block);
    }
    for (int rule = DFL_ACCEPT_REJECTION; rule <= DFL_ACCEPT_TYPICAL; rule++) {
        p.spec_accept = rule;
        p.block_size = 8;
        int rc = run(s, prompt, n, &p, &a, &st);
        CHECK(rc == 0 && a.n == 50 && st.rounds > 0 && st.accept_rule == rule,
              "rule %d: rc %d, %d tokens, rounds %llu", rule, rc, a.n,
              (unsigned long long)st.rounds);
    }
    dfl_session_free(s);
}

static void test_probe(dfl_engine *e, const int32_t *prompt, int n) {
    static char json[1 << 16];
    dfl_probe_result r;
    dfl_error err = {0};
    for (int b = 2; b <= 16; b *= 2) {
        int rc = dfl_probe(e, prompt, n, b, &r, json, sizeof json, &err);
        CHECK(rc == 0 && r.block == b && r.bytes_compared > 0 && r.bytes_differ == 0 &&
              r.n_argmax_disagree == 0, "probe block %d: %s %s", b, err.msg, json);
        CHECK(strstr(json, "\"exact\": true") != NULL, "probe JSON: %s", json);
    }
    dfl_draft_report dr;
    int rc = dfl_probe_draft(e, prompt, n, 8, 40, &dr, json, sizeof json, &err);
    CHECK(rc == 0 && dr.n_anchors == 40 && dr.pos_tried[0] == 40 && dr.pos_tried[6] == 34 &&
          dr.tau >= 1, "drafter diagnostic: %s", err.msg);
    CHECK(strstr(json, "\"positions\"") != NULL, "diagnostic JSON: %s", json);
    /* dfl_debug_draft: a block of B-1 rows of logits */
    dfl_session *s;
    dfl_session_new(e, &s, &err);
    static float lg[15 * 512];
    rc = dfl_debug_draft(s, prompt, n, 16, lg, &err);
    int finite = 1;
    for (int i = 0; i < 15 * 512; i++) finite &= lg[i] == lg[i];
    CHECK(rc == 0 && finite, "debug draft: %s", err.msg);
    dfl_session_free(s);
}

/* The probe's verdict gates speculation: a block size marked inexact runs
 * classic decode with a note, unless DFLASH_ALLOW_INEXACT=1. */
static void test_fail_closed(dfl_engine *e, const int32_t *prompt, int n) {
    dfl_session *s;
    dfl_error err = {0};
    dfl_session_new(e, &s, &err);
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    p.ignore_eos = 1;
    p.max_tokens = 20;
    p.block_size = 4;
    sink a, b;
    dfl_stats st;
    run(s, prompt, n, &p, &a, &st);
    CHECK(st.exact_checked == 1 && st.rounds > 0, "exact path speculates");
    int saved = e->probe_state[3];
    e->probe_state[3] = -1;   /* as if block 3 had differed */
    run(s, prompt, n, &p, &b, &st);
    CHECK(st.exact_checked == -1 && st.rounds == 0 && strstr(st.note, "inexact") && same(&a, &b),
          "inexact path: rounds %llu, note '%s'", (unsigned long long)st.rounds, st.note);
    e->opts.allow_inexact = 1;   /* what the CLI sets from DFLASH_ALLOW_INEXACT=1 */
    run(s, prompt, n, &p, &b, &st);
    CHECK(st.rounds > 0 && strstr(st.note, "DFLASH_ALLOW_INEXACT"), "override: rounds %llu",
          (unsigned long long)st.rounds);
    e->opts.allow_inexact = 0;
    e->probe_state[3] = saved;
    dfl_session_free(s);
}

/* no_logprob skips the pass over the vocabulary: the same ids, logprob 0;
 * top-k asked for still computes them. */
/* A session and the parameters of a short greedy run. */
static dfl_session *short_run(dfl_engine *e, dfl_gen_params *p) {
    dfl_session *s = NULL;
    dfl_error err = {0};
    dfl_session_new(e, &s, &err);
    dfl_gen_params_default(p);
    p->max_tokens = 40;
    p->ignore_eos = 1;
    return s;
}

static void test_no_logprob(dfl_engine *e, const int32_t *prompt, int n) {
    dfl_gen_params p;
    dfl_session *s = short_run(e, &p);
    sink ref, got;
    dfl_stats st;
    CHECK(run(s, prompt, n, &p, &ref, &st) == 0, "with logprobs");
    p.no_logprob = 1;
    CHECK(run(s, prompt, n, &p, &got, &st) == 0 && same(&ref, &got), "no_logprob changes the ids");
    int zero = 1, neg = 1;
    for (int i = 0; i < ref.n && i < MAXG; i++) zero &= got.lp[i] == 0, neg &= ref.lp[i] < 0;
    CHECK(zero && neg, "logprobs: %s", zero ? "not below 0 when asked for" : "not 0 when skipped");
    p.n_top_logprobs = 2;
    CHECK(run(s, prompt, n, &p, &got, &st) == 0 && got.lp[0] == ref.lp[0],
          "top-k logprobs are computed whatever no_logprob says");
    dfl_session_free(s);
}

/* A replayed request's acceptance (benchmarks) is the replay's: the next
 * request with the drafter's own proposals does not start from it, nor the
 * other way round. */
static void test_replay_carry(dfl_engine *e, const int32_t *prompt, int n) {
    dfl_gen_params p;
    dfl_session *s = short_run(e, &p);
    sink ref, got;
    dfl_stats st;
    CHECK(run(s, prompt, n, &p, &ref, &st) == 0, "own proposals");
    dfl_policy own = e->carry;
    p.replay_ref = ref.ids;
    p.n_replay_ref = ref.n;
    p.replay_tau = 6.5;
    CHECK(run(s, prompt, n, &p, &got, &st) == 0 && same(&ref, &got), "replayed: other ids");
    CHECK(got.kinds[DFL_TOKEN_DRAFT] > 0 && got.kinds[DFL_TOKEN_BONUS] > 0,
          "replayed: drafts accepted (the kinds' check saw them)");
    /* a stop inside a round's accepted drafts: the round ends without its bonus */
    p.replay_tau = 8;
    p.block_size = 8;
    got.cancel_at = 3;
    CHECK(run(s, prompt, n, &p, &got, &st) == 0 && got.n == 3 && st.stop == DFL_STOP_CANCEL &&
          got.kinds[DFL_TOKEN_BONUS] == 0 && st.rounds == 1,
          "a round cut after 3 drafts: %d tokens, %llu bonus", got.n,
          (unsigned long long)got.kinds[DFL_TOKEN_BONUS]);
    got.cancel_at = 0;
    CHECK(e->carry_replay.max_block && !memcmp(&e->carry, &own, sizeof own),
          "a replayed request changed the evidence of the drafter's own");
    dfl_session_free(s);
}


/* A drafter whose drafts are never accepted (fresh evidence, adaptive block,
 * trees left to the policy). A tree once took every chain probe (its rate
 * beat the probe's, not a classic step's), the chain never saw its probe
 * answered and asked again the next round: every round was speculative, a
 * third of them trees (30 of 100 tokens here), at half classic speed on a
 * real model. Trees now come only as the tree policy's own probes, one per
 * DFL_TREE_REPROBE drafter rounds after the first. (How many chain rounds
 * run is left to the measured costs, which on this tiny model differ by
 * less than the machine's noise.) */
static void test_zero_accept(dfl_engine *e, const int32_t *prompt, int n) {
    dfl_gen_params p;
    dfl_session *s = short_run(e, &p);
    sink got;
    dfl_stats st;
    p.max_tokens = 100;
    e->carry = (dfl_policy){0};
    e->carry_tree = (dfl_tree_policy){0};
    CHECK(run(s, prompt, n, &p, &got, &st) == 0, "the random drafter's own proposals");
    CHECK(st.accepted * 10 <= st.proposed, "random drafts: %llu of %llu accepted",
          (unsigned long long)st.accepted, (unsigned long long)st.proposed);
    CHECK(st.tree_rounds <= 2 + (unsigned long long)got.n / DFL_TREE_REPROBE,
          "random drafts: %llu trees in %d tokens (%llu rounds)",
          (unsigned long long)st.tree_rounds, got.n, (unsigned long long)st.rounds);
    dfl_session_free(s);
}

int main(void) {
    const char *dir = test_tmpdir();
    char model[512], draft[512];
    if (test_make_pair(dir, "--arch qwen3 --dim 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 16 "
                       "--ffn 192 --vocab 512 --untied --dtype bf16", model, draft))
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
    int32_t prompt[9] = {355, 12, 200, 31, 7, 400, 90, 91, 92};
    test_invariance(e, prompt, 9);
    test_turns(e, prompt, 9);
    test_sampling(e, prompt, 9);
    test_probe(e, prompt, 9);
    test_fail_closed(e, prompt, 9);
    test_no_logprob(e, prompt, 9);
    test_replay_carry(e, prompt, 9);
    test_zero_accept(e, prompt, 9);
    dfl_engine_free(e);
    test_rmdir(dir);
    return test_summary();
}
