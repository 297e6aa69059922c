/* test_ngram.c - the n-gram lane (prompt lookup): the matcher on hand-made
 * sequences, then the engine with --ngram, alone and beside the drafter, on
 * the built-in default pair and on stories260K (a real trained Llama) with
 * its drafter: output id for id equal to classic decode, greedy (adaptive
 * and pinned blocks, a follow-up turn on one session) and sampled with the
 * exact rule and the same seed, on prompts that repeat text so the lane
 * drafts and has drafts accepted. */
#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "draft/ngram.h"
#include "testutil.h"

/* ---- the matcher ---------------------------------------------------------- */

static void test_lookup(void) {
    int32_t out[8];
    /* a b c d X a b c: "a b c" found at 0..2, continued d X a b c, then its own d X a */
    int32_t s1[] = {10, 11, 12, 13, 99, 10, 11, 12};
    int m = dfl_ngram_lookup(s1, 8, 8, out);
    int32_t want1[] = {13, 99, 10, 11, 12, 13, 99, 10};
    CHECK(m == 3 && !memcmp(out, want1, sizeof want1), "continuation: match %d, out %d %d %d", m,
          out[0], out[1], out[5]);
    /* only the anchor recurs: one token is no match */
    int32_t s2[] = {5, 7, 6, 7};
    out[0] = -1;
    CHECK(dfl_ngram_lookup(s2, 4, 4, out) == 0 && out[0] == -1, "a 1-gram is not a match");
    /* nothing recurs */
    int32_t s3[] = {1, 2, 3, 4, 5};
    CHECK(dfl_ngram_lookup(s3, 5, 4, out) == 0, "no match");
    CHECK(dfl_ngram_lookup(s3, 1, 4, out) == 0 && dfl_ngram_lookup(s3, 5, 0, out) == 0,
          "degenerate sizes");
    /* the longest suffix wins over a more recent shorter one */
    int32_t s4[] = {1, 2, 3, 40, 9, 2, 3, 50, 1, 2, 3};
    m = dfl_ngram_lookup(s4, 11, 1, out);
    CHECK(m == 3 && out[0] == 40, "longest: match %d, next %d", m, out[0]);
    /* among equally long ones, the most recent */
    int32_t s5[] = {2, 3, 40, 2, 3, 50, 2, 3};
    m = dfl_ngram_lookup(s5, 8, 1, out);
    CHECK(m == 2 && out[0] == 50, "most recent: match %d, next %d", m, out[0]);
    /* a match capped at DFL_NGRAM_MAX_N still takes the most recent of that length */
    int32_t s6[] = {7, 7, 7, 7, 7, 7, 7, 7};
    m = dfl_ngram_lookup(s6, 8, 3, out);
    CHECK(m == DFL_NGRAM_MAX_N && out[0] == 7 && out[2] == 7, "a run: match %d", m);
    /* a match further back than the window is not looked for */
    int n = DFL_NGRAM_WINDOW + 16;
    int32_t *big = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) big[i] = 1000 + i;
    big[0] = 1, big[1] = 2, big[2] = 77, big[n - 2] = 1, big[n - 1] = 2;
    CHECK(dfl_ngram_lookup(big, n, 1, out) == 0, "beyond the window");
    big[n - 2 - DFL_NGRAM_WINDOW + 10] = 1, big[n - 1 - DFL_NGRAM_WINDOW + 10] = 2;
    CHECK(dfl_ngram_lookup(big, n, 1, out) == 2 && out[0] == big[n - DFL_NGRAM_WINDOW + 10],
          "inside the window");
    free(big);
}

/* ---- the engine ------------------------------------------------------------ */

enum { MAXG = 160 };

typedef struct sink {
    int32_t ids[MAXG];
    int n;
} sink;

static int on_tok(void *ud, const dfl_token_info *t) {
    sink *s = ud;
    if (s->n < MAXG) s->ids[s->n] = t->id;
    s->n++;
    return 0;
}

static int same(const sink *a, const sink *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (a->n < MAXG ? a->n : MAXG));
}

static dfl_engine *load(const char *model, const char *draft, int ngram) {
    dfl_engine_opts eo;
    dfl_engine_opts_default(&eo);
    eo.model_path = model;
    eo.draft_path = draft;
    eo.ngram = ngram;
    eo.n_threads = 2;
    dfl_error err = {0};
    dfl_engine *e = NULL;
    int rc = dfl_engine_load(&eo, &e, &err);
    CHECK(rc == 0, "load %s (draft %s): %s", model, draft ? draft : "none", err.msg);
    return rc ? NULL : e;
}

static int gen(dfl_engine *e, dfl_session *s, const int32_t *ids, int n, const dfl_gen_params *p,
               sink *out, dfl_stats *st) {
    dfl_error err = {0};
    int own = !s;
    if (own && dfl_session_new(e, &s, &err)) return -1;
    out->n = 0;
    int rc = dfl_generate(s, ids, n, p, on_tok, out, st, &err);
    CHECK(rc == 0, "generate: %s", err.msg);
    if (own) dfl_session_free(s);
    return rc;
}

typedef struct pair {
    const char *name, *model, *draft;
} pair;

/* The text's tokens: the prompt repeats a passage and starts it once more. */
static int prompt_ids(dfl_engine *e, const char *text, int32_t *ids, int cap) {
    dfl_error err = {0};
    int n = dfl_tokenize(e, text, strlen(text), 1, 0, ids, cap, &err);
    CHECK(n > 8 && n <= cap, "tokenize: %d (%s)", n, err.msg);
    return n > cap ? cap : n;
}

static const char *REPEAT =
    "Once upon a time, there was a little girl named Lily. She liked to play in the park "
    "with her big red ball. One day, she saw a dog in the park.\n"
    "Once upon a time, there was a little girl named Lily. She liked to play in the park "
    "with her big red ball. One day, she saw a dog in the park.\n"
    "Once upon a time, there was a little girl named Lily. She liked";

/* Classic vs speculative with the lane on one engine (e: --ngram, with or
 * without the drafter), greedy and sampled. */
static void check_engine(const pair *pp, int with_draft) {
    dfl_engine *c = load(pp->model, NULL, 0), *e = load(pp->model, with_draft ? pp->draft : NULL, 1);
    if (!c || !e) {
        dfl_engine_free(c), dfl_engine_free(e);
        return;
    }
    const char *tag = with_draft ? "ngram+drafter" : "ngram";
    int32_t ids[512];
    int n = prompt_ids(e, REPEAT, ids, 512);
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    p.max_tokens = 120;
    p.ignore_eos = 1;
    sink ref, got;
    dfl_stats st;
    /* greedy: adaptive, then pinned blocks */
    p.block_size = 1;
    gen(c, NULL, ids, n, &p, &ref, &st);
    int blocks[] = {0, 4, 8};
    for (int i = 0; i < 3; i++) {
        p.block_size = blocks[i];
        gen(e, NULL, ids, n, &p, &got, &st);
        CHECK(same(&ref, &got), "%s %s greedy block %d: output differs from classic", pp->name,
              tag, blocks[i]);
        /* the adaptive policy's choice follows measured times, so only a
         * pinned block is sure to give a matched round to the lane */
        CHECK(!blocks[i] || (st.lane_rounds[DFL_LANE_NGRAM] > 0 &&
                             st.lane_accepted[DFL_LANE_NGRAM] > 0),
              "%s %s block %d: the lane drafted %llu rounds, %llu accepted", pp->name, tag,
              blocks[i], (unsigned long long)st.lane_rounds[DFL_LANE_NGRAM],
              (unsigned long long)st.lane_accepted[DFL_LANE_NGRAM]);
        CHECK(st.exact_checked == 1, "%s %s: the probe ran and found the path exact", pp->name,
              tag);
        CHECK(st.lane_rounds[0] + st.lane_rounds[1] == st.rounds &&
                  st.lane_accepted[0] + st.lane_accepted[1] == st.accepted,
              "%s %s: lanes add up to the totals", pp->name, tag);
        if (!with_draft)
            CHECK(st.lane_rounds[DFL_LANE_DRAFTER] == 0, "%s: no drafter, no drafter rounds",
                  pp->name);
    }
    /* a follow-up turn on one session: the output as the prompt's tail */
    dfl_session *s;
    dfl_error err = {0};
    CHECK(dfl_session_new(e, &s, &err) == 0, "%s", err.msg);
    p.block_size = 0;
    p.max_tokens = 40;
    gen(e, s, ids, n, &p, &got, &st);
    int32_t turn[512 + 64];
    memcpy(turn, ids, sizeof(int32_t) * n);
    memcpy(turn + n, got.ids, sizeof(int32_t) * got.n);
    memcpy(turn + n + got.n, ids + 1, sizeof(int32_t) * 12);   /* the passage again */
    int n2 = n + got.n + 12;
    gen(e, s, turn, n2, &p, &got, &st);
    p.block_size = 1;
    gen(c, NULL, turn, n2, &p, &ref, &st);
    CHECK(same(&ref, &got), "%s %s: the follow-up turn differs from classic", pp->name, tag);
    dfl_session_free(s);
    /* sampled, exact rule (and rejection, whose rule the lane's rounds keep
     * exact: with the lane alone the output is classic's too) */
    p.max_tokens = 120;
    p.temperature = 0.7f;
    p.seed = 1234;
    int rules[] = {DFL_ACCEPT_EXACT, DFL_ACCEPT_REJECTION};
    for (int k = 0; k < (with_draft ? 1 : 2); k++) {
        p.spec_accept = rules[k];
        p.block_size = 1;
        gen(c, NULL, ids, n, &p, &ref, &st);
        for (int b = 0; b <= 4; b += 4) {   /* adaptive, then pinned (the lane surely drafts) */
            p.block_size = b;
            gen(e, NULL, ids, n, &p, &got, &st);
            CHECK(same(&ref, &got), "%s %s sampled (rule %d, block %d): output differs from "
                  "classic sampled", pp->name, tag, rules[k], b);
            CHECK(!b || st.lane_rounds[DFL_LANE_NGRAM] > 0, "%s %s sampled: the lane drafted",
                  pp->name, tag);
        }
    }
    dfl_engine_free(c);
    dfl_engine_free(e);
}

int main(void) {
    test_lookup();
    static char model[1024], draft[1024], smodel[1024], sdraft[1024];
    const char *src = getenv("DFLASH_SRC");
    snprintf(model, sizeof model, "%s/models/default/target", src ? src : ".");
    snprintf(draft, sizeof draft, "%s/models/default/draft", src ? src : ".");
    pair pairs[2] = {{"default", model, draft}, {"stories260K", NULL, NULL}};
    const char *s = test_asset("stories260K/stories260K.gguf");
    if (s) {
        snprintf(smodel, sizeof smodel, "%s", s);
        snprintf(sdraft, sizeof sdraft, "%s/models/stories260K-dflash", src ? src : ".");
        pairs[1].model = smodel, pairs[1].draft = sdraft;
    }
    for (int i = 0; i < 2; i++) {
        if (!pairs[i].model) continue;
        check_engine(&pairs[i], 0);
        check_engine(&pairs[i], 1);
    }
    return test_summary();
}
