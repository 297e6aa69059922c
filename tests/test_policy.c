/* test_policy.c - the adaptive block policy on synthetic cost and acceptance
 * tables: it must pick the argmax of expected tokens per second (computed
 * here independently, in closed form) and fall back to classic decode. */
#include <math.h>

#include <string.h>

#include "decode/decode.h"
#include "decode/policy.h"
#include "dflash.h"
#include "testutil.h"

/* Feeds n rounds of block B whose accept lengths follow a geometric law with
 * per-position acceptance a (deterministic: fractions, not random draws). */
static void feed(dfl_policy *p, int B, double a, int n) {
    for (int r = 0; r < n; r++) {
        /* accepted = k with probability a^k (1-a) (truncated at B-1): spread
         * the n rounds over k by those weights, in an order that mixes the
         * lengths evenly through time (the policy weights recent rounds more,
         * as a text would present them: not sorted). */
        double u = fmod((r + 0.5) * 0.6180339887498949, 1.0), cum = 0;
        int k = 0;
        for (; k < B - 1; k++) {
            cum += pow(a, k) * (1 - a);
            if (u < cum) break;
        }
        dfl_policy_observe(p, B, k);
    }
}

static int brute_best(const dfl_costs *c, double a, int maxB) {
    int best = 1;
    double rate1 = 1.0 / c->t_round[0][1], best_rate = rate1;
    for (int B = 2; B <= maxB; B++) {
        double e = (1 - pow(a, B)) / (1 - a); /* 1 + a + ... + a^(B-1) */
        double r = e / c->t_round[0][B];
        if (r > best_rate) best_rate = r, best = B;
    }
    return best;
}

static void table(dfl_costs *c, int maxB, double base, double slope) {
    dfl_costs_init(c, maxB);
    for (int B = 1; B <= maxB; B++) c->t_round[0][B] = base + slope * (B - 1);
}

/* ---- closed loop: the policy drives simulated rounds ------------------------ */

static unsigned long long rng_state;

static double uniform(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) * 0x1p-53;
}

/* Tokens per unit time over n tokens at per-position acceptance a, with
 * block B pinned (B > 0) or chosen by the policy (B == 0). Each draft is
 * accepted with probability a if all before it were. */
static double sim_rate(const dfl_costs *c, int block, double a, int n, unsigned seed) {
    dfl_policy p;
    dfl_policy_init(&p, c, c->max_block);
    rng_state = 7919ULL * seed + 1;
    int tok = 0;
    double t = 0;
    while (tok < n) {
        int B = block ? block : dfl_policy_choose(&p, 0), k = 0;
        while (B > 1 && k < B - 1 && uniform() < a) k++;
        tok += k + 1, t += c->t_round[0][B];
        if (B > 1) dfl_policy_observe(&p, B, k);
        else dfl_policy_classic_step(&p);
    }
    return tok / t;
}

/* Mean over seeds. */
static double sim_mean(const dfl_costs *c, int block, double a, int n) {
    double s = 0;
    for (unsigned seed = 0; seed < 64; seed++) s += sim_rate(c, block, a, n, seed);
    return s / 64;
}

/* Runs p's rounds, every probe accepting nothing, until n probes or `steps`
 * rounds; gaps[i]: the classic steps before probe i. Returns the probes. */
static int probe_gaps(dfl_policy *p, int *gaps, int n, int steps) {
    int ng = 0, since = 0;
    for (int step = 0; step < steps && ng < n; step++) {
        if (dfl_policy_choose(p, 0) > 1) {
            gaps[ng++] = since, since = 0;
            dfl_policy_observe(p, p->probe_block, 0);
        } else {
            dfl_policy_classic_step(p), since++;
        }
    }
    return ng;
}

/* Round costs shaped like the measured Qwen3-1.7B Q8_0 pair: a verify row
 * costs a fifth of a step, the drafter a little over half a step. Over 512
 * tokens the adaptive policy must come within 8% of the best pinned block
 * (chosen with hindsight) at every acceptance, and never fall below 0.97x
 * classic where speculation cannot win. */
static void closed_loop(void) {
    dfl_costs c;
    dfl_costs_init(&c, 16);
    c.t_round[0][1] = 1.0;
    for (int B = 2; B <= 16; B++) c.t_round[0][B] = 1.0 + 0.2 * (B - 1) + 0.55;
    double accs[] = {0.0, 0.5, 0.667, 0.806, 0.86, 0.95};
    for (int ai = 0; ai < 6; ai++) {
        double a = accs[ai], best = 0;
        int best_b = 1;
        for (int B = 1; B <= 16; B++) {
            double r = sim_mean(&c, B, a, 512);
            if (r > best) best = r, best_b = B;
        }
        double got = sim_mean(&c, 0, a, 512), classic = sim_mean(&c, 1, a, 512);
        CHECK(got >= 0.92 * best, "a = %.3f: adaptive %.3f tokens/step, block %d %.3f", a, got,
              best_b, best);
        CHECK(got >= 0.97 * classic, "a = %.3f: adaptive %.3f below classic", a, got);
    }
}

/* Costs by context depth: each depth keeps its own table; a depth with too
 * little measured borrows the nearest one's, scaled by the classic steps'
 * ratio; and the choice follows the depth (a verify that pays at a short
 * context, where its rows cost little, does not at a long one). */
static void depths(void) {
    CHECK(dfl_costs_depth(0) == 0 && dfl_costs_depth(1023) == 0 && dfl_costs_depth(1024) == 1 &&
          dfl_costs_depth(4095) == 2 && dfl_costs_depth(4096) == 3 &&
          dfl_costs_depth(1 << 30) == DFL_COST_DEPTHS - 1, "depth buckets double from 1K");
    dfl_costs c;
    table(&c, 8, 1.0, 0.1);                        /* short: block 8 costs 1.7 steps */
    dfl_costs_update(&c, 1, 20000, 4.0);             /* 16K: a step costs 4 */
    CHECK(fabs(dfl_costs_get(&c, 8, 20000) - 1.7 * 4.0) < 1e-9,
          "borrowed from depth 0, scaled by the steps' ratio: %g", dfl_costs_get(&c, 8, 20000));
    CHECK(fabs(dfl_costs_get(&c, 8, 3000) - 1.7) < 1e-9, "unscaled without a step of its own");
    dfl_costs_update(&c, 8, 20000, 16.0);            /* measured: 4 steps there */
    dfl_costs_update(&c, 4, 20000, 12.0);
    CHECK(dfl_costs_get(&c, 8, 20000) == 16.0 && fabs(dfl_costs_get(&c, 6, 20000) - 14) < 1e-9,
          "measured and interpolated at its own depth: %g", dfl_costs_get(&c, 6, 20000));
    CHECK(fabs(dfl_costs_get(&c, 8, 100) - 1.7) < 1e-9, "depth 0 untouched");
    dfl_policy p;
    dfl_policy_init(&p, &c, 8);
    feed(&p, 8, 0.6, 4000);           /* E[B] = 1.6, 1.96, 2.18 .. 2.4 for B = 2, 3, 4 .. 8 */
    CHECK(dfl_policy_choose(&p, 100) > 1, "short context: speculate");
    CHECK(dfl_policy_choose(&p, 20000) == 1, "16K: classic (t(B) / t(1) = 1.67, 2.33, 3 .. 4)");
}

/* A new request resumes an earlier one's evidence: after acceptance near 0
 * it starts classic (no probe first), after acceptance near 1 it speculates;
 * a fresh policy would start with a probe either way. */
static void resume(void) {
    dfl_costs c;
    table(&c, 16, 1.0, 0.3);
    dfl_policy bad, good, next;
    dfl_policy_init(&bad, &c, 16);
    feed(&bad, 8, 0.02, 400);
    CHECK(dfl_policy_choose(&bad, 0) == 1, "no acceptance: classic");
    dfl_policy_init(&next, &c, 16);
    int fresh = dfl_policy_choose(&next, 0);
    dfl_policy_init(&next, &c, 16);
    dfl_policy_resume(&next, &bad);
    CHECK(fresh > 1 && dfl_policy_choose(&next, 0) == 1,
          "resumed after no acceptance: classic at once (a fresh policy probes: %d)", fresh);
    dfl_policy_init(&good, &c, 16);
    feed(&good, 16, 0.97, 400);
    dfl_policy_init(&next, &c, 16);
    dfl_policy_resume(&next, &good);
    CHECK(dfl_policy_choose(&next, 0) == brute_best(&c, 0.97, 16),
          "resumed after high acceptance: the best block at once");

    /* probes that all fail space out to DFL_REPROBE_MAX within a request; the
     * next request probes again within DFL_REPROBE_CARRY classic steps */
    dfl_policy_init(&bad, &c, 16);
    feed(&bad, 8, 0.02, 400);
    int steps = 0;
    while (bad.reprobe_every < DFL_REPROBE_MAX && steps < 100000) {
        int B = dfl_policy_choose(&bad, 0);
        if (B > 1) dfl_policy_observe(&bad, B, 0);
        else dfl_policy_classic_step(&bad);
        steps++;
    }
    CHECK(bad.reprobe_every == DFL_REPROBE_MAX, "failed probes space out to %d (%d after %d steps)",
          DFL_REPROBE_MAX, bad.reprobe_every, steps);
    dfl_policy_init(&next, &c, 16);
    dfl_policy_resume(&next, &bad);
    int first = 0;
    while (first < 4 * DFL_REPROBE_MAX && dfl_policy_choose(&next, 0) == 1) {
        dfl_policy_classic_step(&next);
        first++;
    }
    CHECK(first <= DFL_REPROBE_CARRY, "a resumed policy probes within %d steps, not %d (%d)",
          DFL_REPROBE_CARRY, DFL_REPROBE_MAX, first);
}

/* A stalled round moves a cost by at most DFL_COST_CLAMP, and a classic step
 * whose cost went unmeasured for DFL_RECLASSIC rounds is taken once, so a
 * stale step cost cannot keep the policy speculating. */
static void stale_step(void) {
    dfl_costs c;
    table(&c, 8, 1.0, 0.05);
    dfl_costs_update(&c, 1, 0, 100.0);
    CHECK(fabs(c.t_round[0][1] - (1 + DFL_COST_RISE * (DFL_COST_CLAMP - 1))) < 1e-12,
          "a 100x stall moves the step's cost to %g", c.t_round[0][1]);
    dfl_policy p;
    dfl_policy_init(&p, &c, 8);
    feed(&p, 8, 0.9, 400);
    CHECK(dfl_policy_choose(&p, 0) > 1, "cheap rows, good drafts: speculate");
    for (int i = 0; i < DFL_RECLASSIC - 1; i++) dfl_costs_update(&c, 8, 0, c.t_round[0][8]);
    CHECK(dfl_policy_choose(&p, 0) > 1, "the step's cost is still fresh");
    dfl_costs_update(&c, 8, 0, c.t_round[0][8]);
    CHECK(dfl_policy_choose(&p, 0) == 1, "after %d rounds without one, a classic step",
          DFL_RECLASSIC);
    CHECK(dfl_policy_choose(&p, 2000) > 1, "another depth's step is not stale");
    dfl_costs_update(&c, 1, 0, c.t_round[0][1]);
    CHECK(dfl_policy_choose(&p, 0) > 1, "measured again: speculate");
    /* Measured on a Zen 4 (0.6B Q8_0, replayed drafts accepted at 0.67 per
     * position, ms): a step 21, rounds 48-153 with the drafter's pass. Classic
     * is ahead (1/21 against 2.4/68 at B = 4); two stalled steps in a row
     * (57 ms) must not turn it round. */
    dfl_costs_init(&c, 16);
    const int Bs[] = {1, 2, 3, 4, 6, 8, 16};
    const double ms[] = {21, 48, 57, 68, 76, 87, 153};
    for (int i = 0; i < 7; i++) c.t_round[0][Bs[i]] = ms[i] / 1e3;
    dfl_policy_init(&p, &c, 16);
    feed(&p, 16, 0.67, 400);
    CHECK(dfl_policy_choose(&p, 0) == 1, "tau 3, dear rounds: classic");
    dfl_costs_update(&c, 1, 0, 0.057);
    dfl_costs_update(&c, 1, 0, 0.057);
    CHECK(dfl_policy_choose(&p, 0) == 1, "... still after two stalled steps (step now %.1f ms)",
          1e3 * c.t_round[0][1]);
}

/* ---- chain or tree ---------------------------------------------------------- */

/* A drafter's mass for budgets 0..max: node i's path probability 0.9 * 0.85^(i-1). */
static void tree_mass(double *m, int max) {
    m[0] = 0;
    for (int i = 1; i <= max; i++) m[i] = m[i - 1] + 0.9 * pow(0.85, i - 1);
}

/* The best budget by (1 + cal * mass[N]) / cost(N + 1), chain_rate to beat. */
static int tree_brute(const dfl_costs *c, const double *m, double cal, int max, double chain) {
    int best = 0;
    double best_rate = chain;
    for (int N = 2; N <= max; N++) {
        double r = (1 + cal * m[N]) / c->t_round[0][N + 1];
        if (r > best_rate) best_rate = r, best = N;
    }
    return best;
}

static void tree_policy(void) {
    enum { MAXN = 32 };
    double m[MAXN + 1];
    tree_mass(m, MAXN);
    double slopes[] = {0.005, 0.05, 0.2, 1.0}, cals[] = {1.0, 0.5};
    for (int si = 0; si < 4; si++)
        for (int ci = 0; ci < 2; ci++) {
            dfl_costs c;
            table(&c, MAXN + 1, 1.0, slopes[si]);
            dfl_tree_policy p;
            dfl_tree_policy_init(&p, MAXN);
            double chain = 1.8 / c.t_round[0][4];   /* a chain of 4 committing 1.8 */
            CHECK(dfl_tree_policy_choose(&p, NULL, &c, 0, chain) == DFL_TREE_FIRST,
                  "a fresh tree policy probes a small tree first");
            for (int r = 0; r < 400; r++)   /* trees of the largest budget, accepting cal x */
                dfl_tree_policy_observe(&p, m, MAXN + 1, m[MAXN],
                                        (int)floor(cals[ci] * m[MAXN] + (r % 2 ? 0.6 : 0.4)));
            double e = dfl_tree_policy_expected(&p, 8), want_e = 1 + cals[ci] * m[8];
            CHECK(fabs(e - want_e) < 0.05 * want_e, "calibration %.1f: expected %.3f, want %.3f",
                  cals[ci], e, want_e);
            int want = tree_brute(&c, m, cals[ci], MAXN, chain);
            int got = dfl_tree_policy_choose(&p, NULL, &c, 0, chain);
            double rg = got ? (1 + cals[ci] * m[got]) / c.t_round[0][got + 1] : chain;
            double rw = want ? (1 + cals[ci] * m[want]) / c.t_round[0][want + 1] : chain;
            CHECK(rg >= 0.98 * rw && (got == 0) == (want == 0),
                  "slope %.3f cal %.1f: budget %d, best %d", slopes[si], cals[ci], got, want);
        }
    /* Dear rows and a good chain (4 rows committing 3.5): the chain, with a
     * probe tree once in DFL_TREE_REPROBE rounds. */
    dfl_costs c;
    table(&c, MAXN + 1, 1.0, 1.0);
    dfl_tree_policy p;
    dfl_tree_policy_init(&p, MAXN);
    dfl_tree_policy_observe(&p, m, MAXN + 1, m[MAXN], 1);
    int trees = 0;
    for (int r = 0; r < 4 * DFL_TREE_REPROBE; r++) {
        int N = dfl_tree_policy_choose(&p, NULL, &c, 0, 3.5 / c.t_round[0][4]);
        if (N) trees++, dfl_tree_policy_observe(&p, m, MAXN + 1, m[N], 1);
    }
    CHECK(trees >= 3 && trees <= 5, "dear rows: %d probe trees in %d rounds", trees,
          4 * DFL_TREE_REPROBE);
    /* Measured tree rounds override the chain table's guess: trees cheaper than
     * the chain's rows of the same count win. */
    dfl_costs tc;
    dfl_costs_init(&tc, MAXN + 1);
    for (int B = 2; B <= MAXN + 1; B++) tc.t_round[0][B] = 1.0 + 0.001 * (B - 1);
    int N = dfl_tree_policy_choose(&p, &tc, &c, 0, 3.5 / c.t_round[0][4]);
    CHECK(N >= 16, "cheap measured trees: budget %d", N);
    /* One measured tree size (9 rows, at the chain's price) does not make every
     * larger tree as cheap: past the chain's table (8 rows) costs follow its slope. */
    dfl_costs c8, t9;
    table(&c8, 8, 10.0, 1.0);   /* a round 10 + rows - 1: a flat 9-row price favours 32 */
    dfl_costs_init(&t9, MAXN + 1);
    t9.t_round[0][9] = 18.0;
    dfl_tree_policy_init(&p, MAXN);
    for (int r = 0; r < 50; r++) dfl_tree_policy_observe(&p, m, MAXN + 1, m[8], (int)m[8]);
    N = dfl_tree_policy_choose(&p, &t9, &c8, 0, 0);
    CHECK(N <= 8, "one measured 9-row tree, rows dear: budget %d (the chain or a small tree)", N);
    dfl_tree_policy_init(&p, 0);
    CHECK(dfl_tree_policy_choose(&p, &tc, &c, 0, 0) == 0, "budget 0: never a tree");
}


/* The crowd gate on a simulated engine: a tick of `active` sequences commits
 * tok[mode] tokens in sec[mode] seconds (mode 1: speculation allowed), and
 * its sequences held to classic steps want to speculate while `wanting`.
 * Runs `secs` seconds from *now; returns tokens committed, *open_share the
 * share of ticks with speculation allowed. */
static int wanting = 1;
static double gate_run(dfl_gate *g, double *now, double secs, int active, const double *tok,
                       const double *sec, double *open_share) {
    double end = *now + secs, got = 0;
    int ticks = 0, open = 0;
    while (*now < end) {
        int m = dfl_gate_open(g, *now, active);
        *now += sec[m];
        dfl_gate_note(g, active, (int)tok[m], wanting && !m);
        got += tok[m], ticks++, open += m;
    }
    if (open_share) *open_share = (double)open / ticks;
    return got;
}

/* Speculation a few percent ahead in the windows is not ahead (DFL_GATE_MARGIN):
 * classic holds; well ahead, speculation does. */
static void gate_margin(void) {
    double tok[2] = {4, 10}, near[2] = {0.1, 10 / 42.0}, clear[2] = {0.1, 10 / 48.0}, share;
    for (int k = 0; k < 2; k++) {
        dfl_gate g;
        dfl_gate_init(&g);
        double now = 0;
        gate_run(&g, &now, 120, 4, tok, k ? clear : near, &share);
        if (k) CHECK(share > 0.75, "speculation 20%% ahead: open %.2f of the ticks", share);
        else CHECK(share < 0.1, "speculation 5%% ahead, inside the margin: open %.2f", share);
        dfl_gate_free(&g);
    }
}

/* Speculation far behind (4 tok/s against 40): its try ends after
 * DFL_GATE_ABORT_S and the next waits DFL_GATE_EXPLORE_FAR windows, so over
 * two minutes the crowd loses 0.3% (1.0% in three tries when their distance
 * grew fourfold from 20 windows; whole windows, twice rarer: 4.5%), and
 * after that under 0.5%, but speculation is still tried now and then. */
static void gate_far(void) {
    double tok[2] = {4, 1}, sec[2] = {0.1, 0.25}, now = 0, share;
    dfl_gate g;
    dfl_gate_init(&g);
    double got = gate_run(&g, &now, 120, 4, tok, sec, &share);
    CHECK(got >= 0.995 * 40 * 120 && g.windows[1] == 1,
          "speculation far behind: %.0f tokens in 120 s, classic %.0f, %llu tries", got,
          40.0 * 120, (unsigned long long)g.windows[1]);
    uint64_t w = g.windows[1];
    got = gate_run(&g, &now, 240, 4, tok, sec, NULL);
    CHECK(got >= 0.995 * 40 * 240 && g.windows[1] - w >= 1 && g.windows[1] - w <= 2,
          "far behind, the next 240 s: %.0f tokens, classic %.0f, %llu tries", got, 40.0 * 240,
          (unsigned long long)(g.windows[1] - w));
    dfl_gate_free(&g);
}

/* No sequence held to classic steps wanting to speculate: a fresh crowd
 * keeps to classic steps, and tries speculation (which would measure only
 * the policies' probes) once in DFL_GATE_EXPLORE_MAX windows, not after 5,
 * 10, 20 ...; with wants, speculation gets the second window, a try which,
 * behind, puts the next one 2 * DFL_GATE_EXPLORE windows off. */
static void gate_unwanted(void) {
    double tok[2] = {4, 10}, sec[2] = {0.1, 1.0 / 3};
    double span = (2 * DFL_GATE_EXPLORE + 5) * DFL_GATE_WINDOW_S;
    for (int w = 0; w < 2; w++) {
        dfl_gate g;
        dfl_gate_init(&g);
        double now = 0;
        wanting = w;
        gate_run(&g, &now, span, 4, tok, sec, NULL);
        CHECK(g.windows[1] == 2u * w, "%s: %llu windows of speculation in %.0f s",
              w ? "wanted: second window, tried again after 2 * DFL_GATE_EXPLORE"
                : "unwanted, not tried",
              (unsigned long long)g.windows[1], span);
        if (!w) {
            double got = gate_run(&g, &now, 120, 4, tok, sec, NULL);
            uint64_t tries = g.windows[1];
            CHECK(tries >= 1 && tries <= 120 / (DFL_GATE_EXPLORE_MAX * DFL_GATE_WINDOW_S),
                  "unwanted: %llu tries in the next 120 s", (unsigned long long)tries);
            CHECK(got >= 0.985 * 40 * 120, "... and the crowd loses under 1.5%%: %.0f tokens, "
                  "classic %.0f", got, 40.0 * 120);
        }
        dfl_gate_free(&g);
    }
    wanting = 1;
}

/* A fresh crowd whose speculation runs a third of classic steps' rate (eight
 * clients on 2 cores): its first window of speculation, wanted at once, ends
 * after DFL_GATE_ABORT_S, and the next try waits 4 * DFL_GATE_EXPLORE
 * windows. So a 25 s stage (bench_serve.py's at eight clients) loses under 4%
 * to the gate's tries; as a whole window, and tried again 5 windows later,
 * they cost it about 5%. */
static void gate_fresh_far(void) {
    double tok[2] = {4, 4}, sec[2] = {0.1, 0.3}, now = 0;
    dfl_gate g;
    dfl_gate_init(&g);
    double got = gate_run(&g, &now, 20, 8, tok, sec, NULL);
    CHECK(g.windows[1] == 1, "a fresh crowd far behind: %llu windows of speculation in 20 s",
          (unsigned long long)g.windows[1]);
    got += gate_run(&g, &now, 5, 8, tok, sec, NULL);
    CHECK(got >= 0.96 * 40 * 25, "... a 25 s stage loses under 4%%: %.0f tokens, classic %.0f",
          got, 40.0 * 25);
    dfl_gate_free(&g);
}

/* Held probes share a budget of the crowd's time: eight sequences whose
 * probes are always due, each probe 25 ms of a drafter pass that all eight
 * wait for, spend at most DFL_GATE_PROBE_SHARE of a minute (plus the first
 * full credit); probes that cost microseconds are never refused. */
static void gate_probe_budget(void) {
    dfl_gate g;
    dfl_gate_init(&g);
    int probes = 0, asked = 0;
    double spent = 0;
    for (double now = 0; now < 60; now += 0.045, asked++)
        if (dfl_gate_probe_ok(&g, now, 8))
            dfl_gate_probe_spent(&g, 8, 0.025), probes++, spent += 0.2;
    CHECK(probes >= 1 && spent <= DFL_GATE_PROBE_SHARE * 60 + DFL_GATE_PROBE_CAP_S + 0.2,
          "held probes of 25 ms among eight: %d of %d asked in 60 s, %.2f crowd-seconds", probes,
          asked, spent);
    CHECK(probes >= 2, "... and they go on after the first credit: %d", probes);
    dfl_gate_free(&g);
    dfl_gate_init(&g);
    probes = asked = 0;
    for (double now = 0; now < 60; now += 0.045, asked++)
        if (dfl_gate_probe_ok(&g, now, 8)) dfl_gate_probe_spent(&g, 8, 1e-6), probes++;
    CHECK(probes == asked, "probes of a microsecond are never refused: %d of %d", probes, asked);
    dfl_gate_free(&g);
}

/* A crowd held by the gate's evidence probes not at all (its tries come on
 * the gate's own schedule): far behind, behind, or a smaller crowd whose
 * nearest evidence is that; ahead, it probes on the credit the refusals left
 * alone, and so does a fresh crowd (its probes are how its held sequences
 * come to want speculation). */
static void gate_probe_held(void) {
    dfl_gate g;
    dfl_gate_init(&g);
    g.tok[2][0] = 40, g.sec[2][0] = 1, g.tok[2][1] = 4, g.sec[2][1] = 1;   /* four: 4 vs 40 */
    int refused = 0;
    for (double now = 1; now < 30; now += 0.05) refused += !dfl_gate_probe_ok(&g, now, 4);
    CHECK(refused == 580, "held far at four: %d of 580 probes refused", refused);
    CHECK(!dfl_gate_probe_ok(&g, 30, 3), "... at three, held by four's evidence: refused");
    g.tok[2][1] = 32;   /* 32 vs 40: behind, not far */
    CHECK(!dfl_gate_probe_ok(&g, 30, 4), "at four behind but not far: refused");
    g.tok[2][1] = 48;   /* 48 vs 40: ahead */
    CHECK(dfl_gate_probe_ok(&g, 31, 4), "ahead at four: a probe may run");
    dfl_gate_probe_spent(&g, 4, 0.01);
    dfl_gate_free(&g);
    dfl_gate_init(&g);
    g.tok[6][0] = 200, g.sec[6][0] = 1;   /* eight: classic steps measured, nothing else */
    CHECK(dfl_gate_probe_ok(&g, 1, 8), "a fresh crowd of eight: a probe may run");
    dfl_gate_free(&g);
}

/* dfl_gate_far: speculation far behind in a crowd is far behind in larger
 * ones, not in smaller ones nor alone. */
static void gate_far_crowds(void) {
    dfl_gate g;
    dfl_gate_init(&g);
    g.tok[2][0] = 40, g.sec[2][0] = 1, g.tok[2][1] = 4, g.sec[2][1] = 1;   /* four: 4 vs 40 */
    CHECK(dfl_gate_far(&g, 4) && dfl_gate_far(&g, 8) && dfl_gate_far(&g, 20),
          "far behind at four: at four, eight and twenty too");
    CHECK(!dfl_gate_far(&g, 3) && !dfl_gate_far(&g, 1), "... not at three, nor alone");
    g.tok[2][1] = 32;   /* 32 vs 40: behind, not far */
    CHECK(!dfl_gate_far(&g, 4) && !dfl_gate_far(&g, 8), "behind but not far: not held far");
    dfl_gate_free(&g);
}

/* dfl_gate_idle: a crowd whose sequences are not expected to draft soon,
 * held by the gate's evidence (speculation behind or far behind, its own or
 * its nearest crowd's), or never having measured speculation while none
 * wants it. */
static void gate_idle(void) {
    dfl_gate g;
    dfl_gate_init(&g);
    g.tok[6][0] = 200, g.sec[6][0] = 1;   /* eight: classic steps measured, nothing else */
    CHECK(dfl_gate_idle(&g, 8) && !dfl_gate_idle(&g, 1),
          "a crowd of eight, speculation never measured nor wanted: idle (alone never)");
    g.wanted[6] = 1;
    CHECK(!dfl_gate_idle(&g, 8), "... a held sequence wants to speculate: not idle");
    g.wanted[6] = 0, g.tok[6][1] = 230, g.sec[6][1] = 1;   /* measured ahead */
    CHECK(!dfl_gate_idle(&g, 8), "... speculation measured ahead: not idle");
    g.tok[6][1] = 190;   /* behind, not far */
    CHECK(dfl_gate_idle(&g, 8) && dfl_gate_idle(&g, 7),
          "... behind, not far: idle, and so is seven, held by that evidence");
    g.tok[6][1] = 100;
    CHECK(dfl_gate_idle(&g, 8), "... far behind: idle");
    dfl_gate_free(&g);
}

/* A window in which a prompt was prefilled measures its ticks after the
 * prefill: a fresh crowd's first window (classic steps), which opens with
 * the prefills, counts, and its mode does not run a second one unmeasured. */
static void gate_prefill_end(void) {
    double tok[2] = {4, 10}, sec[2] = {0.1, 0.125}, now = 0;
    dfl_gate g;
    dfl_gate_init(&g);
    dfl_gate_open(&g, now, 4);
    dfl_gate_prefill(&g, now, 1);
    gate_run(&g, &now, 0.2, 4, tok, sec, NULL);
    dfl_gate_prefill(&g, now, -1);
    double after = DFL_GATE_WINDOW_S - now + sec[0] + 0.01;   /* one tick past the window */
    gate_run(&g, &now, after, 4, tok, sec, NULL);
    CHECK(g.windows[0] == 1 && dfl_gate_rate(&g, 2, 0) > 0,
          "the first window counts the %.2f s after its prefill: %llu windows, %.2f s measured",
          after, (unsigned long long)g.windows[0], g.sec[2][0]);
    dfl_gate_free(&g);
}

/* A try of speculation does not begin while a prompt prefills (a span with
 * a prefill in it is not measured, so the try could not end early): it
 * waits for the first window after the prefill. */
static void gate_try_after_prefill(void) {
    double tok[2] = {4, 4}, sec[2] = {0.1, 0.3}, now = 0;
    dfl_gate g;
    dfl_gate_init(&g);
    gate_run(&g, &now, 0.5, 8, tok, sec, NULL);
    dfl_gate_prefill(&g, now, 1);
    gate_run(&g, &now, 3, 8, tok, sec, NULL);
    CHECK(g.windows[0] == 1 && g.windows[1] == 0 && !g.spec,
          "wanted, but a prompt prefills: %llu windows of speculation",
          (unsigned long long)g.windows[1]);
    dfl_gate_prefill(&g, now, -1);
    gate_run(&g, &now, 2 * DFL_GATE_WINDOW_S, 8, tok, sec, NULL);
    CHECK(g.windows[1] == 1, "... and tried in a window after it: %llu windows",
          (unsigned long long)g.windows[1]);
    dfl_gate_free(&g);
}

/* Time no gated crowd ran is not measured: neither a lone sequence's ticks
 * between two crowds, nor an idle gap after the last gated sequence left.
 * Either, counted as the crowd's time without tokens, made classic steps
 * look slow (40 tok/s read as 0.9 in a server) and let speculation run. */
static void gate_gaps(void) {
    double tok[2] = {4, 4}, sec[2] = {0.1, 0.1}, now = 0;
    dfl_gate g;
    dfl_gate_init(&g);
    wanting = 0;
    for (int k = 0; k < 2; k++) {
        gate_run(&g, &now, 3, 2, tok, sec, NULL);
        if (k) {   /* the server idles 10 s */
            dfl_gate_leave(&g, now);
            now += 10;
        } else {   /* one sequence alone for 5 s */
            gate_run(&g, &now, 5, 1, tok, sec, NULL);
        }
        gate_run(&g, &now, 3, 2, tok, sec, NULL);
        double r = dfl_gate_rate(&g, 0, 0);
        CHECK(r > 38 && r < 42, "after %s, two sequences' classic steps measure %.1f tok/s "
              "(they ran at 40)", k ? "an idle gap" : "a lone sequence's ticks", r);
    }
    wanting = 1;
    dfl_gate_free(&g);
}

static void gate(void) {
    dfl_gate g;
    dfl_gate_init(&g);
    double now = 0, share;
    CHECK(dfl_gate_open(&g, 0, 1), "one sequence alone is never gated");
    CHECK(!dfl_gate_open(&g, 0, 4), "no evidence anywhere: classic steps are measured first");
    /* Four sequences; speculation measured behind (30 tok/s against 40): after
     * the first two windows classic holds, with a window given back to
     * speculation now and then, less often each time it loses again. */
    double tok[2] = {4, 10}, slow[2] = {0.1, 1.0 / 3}, fast[2] = {0.1, 0.125};
    double got = gate_run(&g, &now, 120, 4, tok, slow, &share);
    CHECK(got >= 0.96 * 40 * 120, "classic ahead: %.0f tokens in 120 s, classic alone %.0f",
          got, 40.0 * 120);
    CHECK(share > 0.01 && share < 0.1, "classic ahead: speculation %.2f of the ticks", share);
    /* Five sequences were never measured either, but speculation that lost
     * its tries with four loses with more: five wait as long to try. */
    double share5;
    gate_run(&g, &now, 15, 5, tok, slow, &share5);
    CHECK(share5 == 0, "speculation behind at four: five try it after as long (open %.2f)",
          share5);
    /* Three sequences were never measured: their crowd starts with what four
     * measured (classic ahead), and tries speculation after a few windows. */
    double share3;
    gate_run(&g, &now, 4, 3, tok, slow, &share3);
    CHECK(share3 == 0, "an unmeasured crowd starts from its neighbour's evidence: open %.2f",
          share3);
    gate_run(&g, &now, 60, 3, tok, slow, &share3);
    CHECK(share3 > 0 && dfl_gate_rate(&g, 1, 1) > 0, "... and measures speculation later");
    /* The load changes: speculation now measures ahead (80 tok/s against
     * 40); the gate opens within a few windows and stays mostly open. */
    gate_run(&g, &now, 10, 4, tok, fast, NULL);
    got = gate_run(&g, &now, 120, 4, tok, fast, &share);
    CHECK(got >= 0.9 * 80 * 120, "speculation ahead: %.0f tokens, speculation alone %.0f", got,
          80.0 * 120);
    CHECK(share > 0.75, "speculation ahead: open %.2f of the ticks", share);
    CHECK(g.windows[0] > 0 && g.windows[1] > 0, "both modes measured (%llu, %llu windows)",
          (unsigned long long)g.windows[0], (unsigned long long)g.windows[1]);
    /* A crowd that changes size every half second (a busy server: four and
     * five sequences, five unmeasured so far) is still measured, and the gate
     * stays with the mode ahead. */
    uint64_t w = g.windows[0] + g.windows[1];
    got = 0;
    for (int i = 0; i < 50; i++) got += gate_run(&g, &now, 0.5, 4 + i % 2, tok, fast, NULL);
    CHECK(g.windows[0] + g.windows[1] >= w + 45, "a changing crowd is measured: %llu windows of 50",
          (unsigned long long)(g.windows[0] + g.windows[1] - w));
    CHECK(got >= 0.85 * 80 * 25, "a changing crowd, speculation ahead: %.0f tokens, alone %.0f",
          got, 80.0 * 25);
    /* While a prompt is prefilled the ticks are not measured: classic steps
     * that would measure ahead change nothing (only the window open when the
     * prefill starts counts what it measured before) ... */
    dfl_gate_prefill(&g, now, 1);
    double before[2] = {g.sec[2][0], g.sec[2][1]};
    w = g.windows[0] + g.windows[1];
    gate_run(&g, &now, 10, 4, tok, slow, NULL);
    CHECK(g.sec[2][0] == before[0] && g.sec[2][1] == before[1] &&
          g.windows[0] + g.windows[1] <= w + 1, "ticks during a prefill are not measured: "
          "%g/%g s before, %g/%g after, %llu windows closed", before[0], before[1], g.sec[2][0],
          g.sec[2][1], (unsigned long long)(g.windows[0] + g.windows[1] - w));
    /* ... until it ends: then the gate turns to classic steps. */
    dfl_gate_prefill(&g, now, -1);
    gate_run(&g, &now, 20, 4, tok, slow, NULL);
    gate_run(&g, &now, 30, 4, tok, slow, &share);
    CHECK(share < 0.15, "after the prefill, classic ahead: speculation %.2f of the ticks", share);
    dfl_gate_free(&g);
    gate_margin();
    gate_far();
    gate_try_after_prefill();
    gate_unwanted();
    gate_fresh_far();
    gate_probe_budget();
    gate_far_crowds();
    gate_probe_held();
    gate_idle();
    gate_prefill_end();
    gate_gaps();
}

/* In a crowd the table holds marginal costs (a step's row 10 ms, a round of
 * B rows 50 ms of drafter plus 10 ms a row): by its own rate no round could
 * win, E(B) <= B; at the crowd's rate a round wins while its extra tokens pay
 * for the time it adds to everyone's tick. */
/* A slot's policy in a crowd: marginal costs of `row` seconds a row, plus
 * `drafter` for a round's drafter pass; acceptance a per position. */
static void crowd_policy(dfl_costs *c, dfl_policy *p, double drafter, double row, double a) {
    dfl_costs_init(c, 8);
    c->t_round[0][1] = row;
    for (int B = 2; B <= 8; B++) c->t_round[0][B] = drafter + row * B;
    dfl_policy_init(p, c, 8);
    feed(p, 8, a, 2000);
    p->classic_run = 0;
}

static void crowd(void) {
    dfl_costs c;
    dfl_policy p;
    crowd_policy(&c, &p, 0.050, 0.010, 0.9);
    CHECK(dfl_policy_choose(&p, 0) == 1, "alone by these costs: classic");
    p.crowd_rate = 36;   /* two sequences, 55 ms ticks */
    int B = dfl_policy_choose(&p, 0);
    double e = dfl_policy_expected(&p, B), e1 = 1;
    CHECK(B > 1 && e - 36 * c.t_round[0][B] > e1 - 36 * c.t_round[0][1],
          "two in the crowd, acceptance 0.9: speculate (block %d)", B);
    p.crowd_rate = 62;   /* four sequences, 64 ms ticks */
    CHECK(dfl_policy_choose(&p, 0) == 1, "four in the crowd: the rows cost the others more");
    /* the slot's next request starts knowing the crowd it was in, not as if alone */
    dfl_policy next;
    dfl_policy_init(&next, &c, 8);
    dfl_policy_resume(&next, &p);
    CHECK(next.crowd_rate == 62 && dfl_policy_choose(&next, 0) == 1,
          "a resumed policy keeps the crowd's rate (%g) and its verdict", next.crowd_rate);
    feed(&p, 8, 0.5, 2000);
    p.crowd_rate = 36;
    CHECK(dfl_policy_choose(&p, 0) == 1, "two in the crowd, acceptance 0.5: classic");
}

/* A crowd's table holds marginal shares, a table alone whole round times;
 * where the crowd has measured only its step, a size costs that step plus
 * what the round adds to a step alone, not the step extended flat. */
static void crowd_table(void) {
    dfl_costs alone, crowd;
    dfl_policy p;
    table(&alone, 8, 0.020, 0.002);   /* a step 20 ms alone; B = 4: 26 ms */
    dfl_costs_init(&crowd, 8);
    crowd.t_round[0][1] = 0.002;       /* a step's share among others: 2 ms */
    dfl_policy_init(&p, &crowd, 8);
    feed(&p, 8, 0.9, 2000);
    p.crowd_rate = 100;
    double e4 = dfl_policy_expected(&p, 4);
    CHECK(fabs(dfl_policy_rate(&p, 4, 0) - e4 / 0.002) < 1e-6,
          "with no table alone, one measured size extends flat (as it always did alone)");
    p.alone = &alone;
    CHECK(fabs(dfl_policy_rate(&p, 4, 0) - e4 / 0.008) < 1e-6,
          "crowd, B = 4 unmeasured: the step's 2 ms + 6 ms added alone, rate %g want %g",
          dfl_policy_rate(&p, 4, 0), e4 / 0.008);
    CHECK(fabs(dfl_policy_rate(&p, 1, 0) - 1 / 0.002) < 1e-6, "the step is the crowd's own");
    crowd.t_round[0][8] = 0.030;       /* a probe of 8 measured in the crowd */
    CHECK(fabs(dfl_policy_rate(&p, 4, 0) - e4 / 0.022) < 1e-6,
          "once the crowd measured 8, B = 4 comes from the crowd's own table: 8's 30 ms less "
          "a step for each row it lacks (the drafter's pass is every block's), %g ms",
          1e3 * dfl_costs_get(&crowd, 4, 0));
    dfl_costs gap;                     /* alone: a step 20 ms, a block of 8 34 ms */
    dfl_costs_init(&gap, 8);
    gap.t_round[0][1] = 0.020, gap.t_round[0][8] = 0.034;
    CHECK(fabs(dfl_costs_get(&gap, 3, 0) - 0.024) < 1e-9,
          "alone, where a row costs far less than a step, a gap interpolates: %g ms",
          1e3 * dfl_costs_get(&gap, 3, 0));
    dfl_costs wide;                    /* a block of 5 timed in a worse tick than 8 */
    dfl_costs_init(&wide, 16);
    wide.t_round[0][1] = 0.002, wide.t_round[0][5] = 0.036, wide.t_round[0][8] = 0.030;
    CHECK(dfl_costs_get(&wide, 16, 0) == 0.030 && dfl_costs_get(&wide, 12, 0) == 0.030,
          "past the largest measured size a falling slope extends flat: 16 costs %g, not less "
          "than 8's 0.030", dfl_costs_get(&wide, 16, 0));
    crowd.t_round[0][1] = 0;
    CHECK(dfl_policy_rate(&p, 1, 0) == 0 && dfl_policy_choose(&p, 0) == 1,
          "no step measured in the crowd: classic, to measure one");
}

/* Among sequences that speculate, a row's time is priced at the tokens per
 * second the gate measured of the crowd, not at the rows per second of the
 * forward: four slots verifying 8 rows in 70 ms ticks run 457 rows/s but
 * commit 297 tokens/s (5.2 a round). Priced at rows, a slot's own drafts
 * look not worth their rows (marginal cost 1.6 ms a row, 3 ms of drafter). */
static void crowd_price(void) {
    dfl_costs c;
    dfl_policy p;
    crowd_policy(&c, &p, 0.003, 0.0016, 0.87);
    p.crowd_rate = 457;
    CHECK(dfl_policy_choose(&p, 0) == 1, "priced at rows per second: classic steps");
    dfl_gate g;
    dfl_gate_init(&g);
    CHECK(dfl_gate_price(&g, 4) == 0, "no speculation measured yet: no price");
    double now = 0, tok[2] = {4, 21}, sec[2] = {0.026, 0.070};
    gate_run(&g, &now, 3, 4, tok, sec, NULL);   /* the first windows speculate */
    double price = dfl_gate_price(&g, 4);
    CHECK(fabs(price - 300) < 1, "the gate's price: %.1f tokens per second, measured 300", price);
    CHECK(dfl_gate_price(&g, 1) == 0, "one sequence alone: no price");
    p.crowd_rate = price;
    CHECK(dfl_policy_choose(&p, 0) > 1, "priced at the crowd's tokens per second: speculate");
    dfl_gate_free(&g);
    /* Speculation measured behind classic steps: a second is worth what
     * classic steps made, and its rounds are not cheap because it lost. */
    dfl_gate_init(&g);
    double lose[2] = {0.026, 0.2};   /* classic 154 tok/s, speculation 105 */
    now = 0;
    gate_run(&g, &now, 30, 4, tok, lose, NULL);
    price = dfl_gate_price(&g, 4);
    CHECK(dfl_gate_rate(&g, 2, 1) > 0 && fabs(price - 4 / 0.026) < 1,
          "speculation behind: the price is classic steps' %.1f tok/s, not %.1f", 4 / 0.026,
          dfl_gate_rate(&g, 2, 1));
    dfl_gate_free(&g);
}

/* ---- lanes: the per-round choice among drafter, n-gram and MTP ------------- */

/* True tokens per unit time of block B at per-position acceptance a. */
static double true_rate(const dfl_costs *c, double a, int B) {
    return (1 - pow(a, B)) / (1 - a) / c->t_round[0][B];
}

typedef struct lanes_case {
    double a[DFL_LANES];       /* per-position acceptance fed to each lane's policy */
    double slope[DFL_LANES];   /* each lane's cost table: 1 + slope * (B - 1) */
    int offer[DFL_LANES];
} lanes_case;

/* Builds the three lanes' policies from a case: each its own table (a
 * round's draft costs differ by lane) and its own evidence. */
static void lanes_make(const lanes_case *k, dfl_costs *c, dfl_policy *pol) {
    for (int l = 0; l < DFL_LANES; l++) {
        table(&c[l], 16, 1.0, k->slope[l]);
        dfl_policy_init(&pol[l], &c[l], 16);
        feed(&pol[l], 16, k->a[l], 4000);
    }
}

/* The lane the closed form says wins (offering lanes only; the best true rate
 * of its own best block, a classic step when none beats one), and its block. */
static int lanes_brute(const lanes_case *k, const dfl_costs *c, int *B) {
    int best = -1;
    double best_rate = 1.0 / c[0].t_round[0][1];
    *B = 1;
    for (int l = 0; l < DFL_LANES; l++) {
        if (k->offer[l] < 1) continue;
        int maxB = k->offer[l] + 1 < 16 ? k->offer[l] + 1 : 16;
        int b = brute_best(&c[l], k->a[l], maxB);
        if (b > 1 && true_rate(&c[l], k->a[l], b) > best_rate)
            best_rate = true_rate(&c[l], k->a[l], b), best = l, *B = b;
    }
    return best;
}

static void lanes(void) {
    static const char *nm[DFL_LANES] = {"drafter", "ngram", "mtp"};
    lanes_case ks[] = {
        /* the MTP head: cheap rounds and good drafts beat a poor drafter */
        {{0.3, 0, 0.85}, {0.3, 0, 0.05}, {15, 0, 15}},
        /* a good drafter beats a poor head even at its dearer rounds */
        {{0.9, 0, 0.2}, {0.1, 0, 0.05}, {15, 0, 15}},
        /* the n-gram lane's match, short (3 drafts) but always right, beats both */
        {{0.5, 0.99, 0.5}, {0.2, 0.02, 0.1}, {15, 3, 15}},
        /* nothing pays: a classic step */
        {{0.02, 0.02, 0.02}, {1.0, 1.0, 1.0}, {15, 15, 15}},
        /* the best lane has nothing to offer this round: the next best drafts */
        {{0.5, 0.99, 0.6}, {0.2, 0.02, 0.1}, {15, 0, 15}},
        {{0.6, 0, 0.95}, {0.2, 0, 0.05}, {15, 0, 0}},
    };
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        dfl_costs c[DFL_LANES];
        dfl_policy pol[DFL_LANES];
        lanes_make(&ks[i], c, pol);
        int want_B, want = lanes_brute(&ks[i], c, &want_B), lane = -1;
        int B = dfl_lanes_choose(pol, ks[i].offer, 0, 0, &lane);
        if (want < 0) {
            CHECK(B == 1 && lane == DFL_LANE_DRAFTER, "case %zu: classic wanted, got %s B=%d", i,
                  nm[lane], B);
            continue;
        }
        /* the estimates of a are close, not exact: the block's true rate within 2% */
        double got_rate = B > 1 ? true_rate(&c[lane], ks[i].a[lane], B) : 0;
        CHECK(lane == want && got_rate >= 0.98 * true_rate(&c[want], ks[i].a[want], want_B),
              "case %zu: lane %s B=%d, wanted %s B=%d", i, nm[lane], B, nm[want], want_B);
        CHECK(B <= ks[i].offer[lane] + 1, "case %zu: B=%d beyond the lane's offer", i, B);
    }

    /* equal bids: the lower lane (the drafter before the MTP head) */
    lanes_case tie = {{0.8, 0, 0.8}, {0.1, 0, 0.1}, {15, 0, 15}};
    dfl_costs c[DFL_LANES];
    dfl_policy pol[DFL_LANES];
    lanes_make(&tie, c, pol);
    int lane = -1, B = dfl_lanes_choose(pol, tie.offer, 0, 0, &lane);
    CHECK(lane == DFL_LANE_DRAFTER && B > 1, "tie: %s B=%d", nm[lane], B);

    /* a lost probe is withdrawn: the MTP lane, classic on its evidence, asks
     * for a probe round; the drafter wins the round, and the head's probe is
     * not counted as under way */
    lanes_case probe = {{0.9, 0, 0.0}, {0.1, 0, 1.0}, {15, 0, 15}};
    lanes_make(&probe, c, pol);
    pol[DFL_LANE_MTP].classic_run = pol[DFL_LANE_MTP].reprobe_every;
    B = dfl_lanes_choose(pol, probe.offer, 0, 0, &lane);
    CHECK(lane == DFL_LANE_DRAFTER && B > 1 && !pol[DFL_LANE_MTP].probing,
          "probe: %s B=%d, the head still probing %d", nm[lane], B, pol[DFL_LANE_MTP].probing);

    /* pinned: the n-gram lane's match first; else the better model lane at
     * that block (rates when both costs are known, expected tokens when not;
     * ties to the drafter); no lane: a classic step */
    lanes_case pin = {{0.3, 0.5, 0.85}, {0.05, 0.02, 0.3}, {15, 3, 15}};
    lanes_make(&pin, c, pol);
    B = dfl_lanes_choose(pol, pin.offer, 0, 6, &lane);
    CHECK(lane == DFL_LANE_NGRAM && B == 6, "pinned, a match: %s B=%d", nm[lane], B);
    pin.offer[DFL_LANE_NGRAM] = 0;
    B = dfl_lanes_choose(pol, pin.offer, 0, 6, &lane);
    int want = true_rate(&c[0], 0.3, 6) > true_rate(&c[2], 0.85, 6) ? 0 : 2;
    CHECK(lane == want && B == 6, "pinned by rate: %s B=%d, wanted %s", nm[lane], B, nm[want]);
    c[DFL_LANE_MTP].t_round[0][6] = c[DFL_LANE_MTP].t_round[0][1] = 0;   /* unknown */
    for (int b = 2; b <= 16; b++) c[DFL_LANE_MTP].t_round[0][b] = 0;
    B = dfl_lanes_choose(pol, pin.offer, 0, 6, &lane);
    CHECK(lane == DFL_LANE_MTP && B == 6, "pinned by expected tokens: %s B=%d", nm[lane], B);
    /* only the head's classic step timed, and that one slow: its cost of 6 is
     * a guess, not a measure, and expected tokens still decide */
    c[DFL_LANE_MTP].t_round[0][1] = 100 * c[DFL_LANE_DRAFTER].t_round[0][6];
    B = dfl_lanes_choose(pol, pin.offer, 0, 6, &lane);
    CHECK(lane == DFL_LANE_MTP && B == 6, "pinned beside a guessed cost: %s B=%d", nm[lane], B);
    lanes_make(&tie, c, pol);
    B = dfl_lanes_choose(pol, tie.offer, 0, 4, &lane);
    CHECK(lane == DFL_LANE_DRAFTER && B == 4, "pinned tie: %s B=%d", nm[lane], B);
    int none[DFL_LANES] = {0};
    B = dfl_lanes_choose(pol, none, 0, 4, &lane);
    CHECK(B == 1 && lane == DFL_LANE_DRAFTER, "pinned, no lane: %s B=%d", nm[lane], B);
    B = dfl_lanes_choose(pol, none, 0, 0, &lane);
    CHECK(B == 1 && lane == DFL_LANE_DRAFTER, "adaptive, no lane: %s B=%d", nm[lane], B);
}

/* Each model lane's layers out of the union a verify captured: rows of
 * (n_cap, dim), a lane's layers in its own order, every row. */
static void lane_feat(void) {
    enum { N = 3, DIM = 4, NC = 3 };
    int cap[NC] = {11, 3, 7}, a_cap[2] = {7, 11}, b_cap[1] = {3};
    float feat[N * NC * DIM], buf[N * NC * DIM];
    for (int i = 0; i < N * NC * DIM; i++) feat[i] = (float)i;   /* row r, layer k, x: value */
    dfl_proposer a = {.cap = a_cap, .n_cap = 2}, b = {.cap = b_cap, .n_cap = 1};
    dfl_proposer all = {.cap = cap, .n_cap = NC};
    const float *got = dfl_lane_feat(cap, NC, &a, feat, N, DIM, buf);
    int ok = got == buf;
    for (int r = 0; r < N; r++)
        for (int x = 0; x < DIM; x++)
            ok &= got[(r * 2 + 0) * DIM + x] == feat[(r * NC + 2) * DIM + x] &&
                  got[(r * 2 + 1) * DIM + x] == feat[(r * NC + 0) * DIM + x];
    CHECK(ok, "lane feat: layers 7, 11 of the union 11, 3, 7, row by row");
    got = dfl_lane_feat(cap, NC, &b, feat, N, DIM, buf);
    ok = got == buf;
    for (int r = 0; r < N; r++)
        ok &= !memcmp(got + r * DIM, feat + (r * NC + 1) * DIM, sizeof(float) * DIM);
    CHECK(ok, "lane feat: layer 3 alone");
    CHECK(dfl_lane_feat(cap, NC, &all, feat, N, DIM, buf) == feat,
          "lane feat: a lane reading the whole list gets the rows themselves (no copy)");
    CHECK(dfl_lane_feat(cap, NC, &a, NULL, N, DIM, buf) == NULL, "lane feat: no rows, none");
}

int main(void) {
    crowd();
    crowd_price();
    crowd_table();
    lanes();
    lane_feat();
    gate();
    stale_step();
    tree_policy();
    resume();
    closed_loop();
    /* Cheap verify rows and good drafts: speculation wins, at the argmax. */
    double slopes[] = {0.02, 0.1, 0.3, 0.6, 1.2};
    double accs[] = {0.3, 0.6, 0.8, 0.9, 0.97};
    for (int si = 0; si < 5; si++)
        for (int ai = 0; ai < 5; ai++) {
            dfl_costs c;
            table(&c, 16, 1.0, slopes[si]);
            dfl_policy p;
            dfl_policy_init(&p, &c, 16);
            feed(&p, 16, accs[ai], 4000);
            int want = brute_best(&c, accs[ai], 16), got = dfl_policy_choose(&p, 0);
            /* The estimate of a is close but not exact: accept a choice whose
             * true rate is within 2% of the best. */
            double a = accs[ai];
            double rate_got = (1 - pow(a, got)) / (1 - a) / c.t_round[0][got];
            double rate_want = (1 - pow(a, want)) / (1 - a) / c.t_round[0][want];
            CHECK(rate_got >= 0.98 * rate_want, "slope %.2f acc %.2f: chose %d, best %d",
                  slopes[si], a, got, want);
        }

    /* Verify rows as expensive as whole steps: classic wins, and stays. */
    dfl_costs c;
    table(&c, 8, 1.0, 1.0);
    dfl_policy p;
    dfl_policy_init(&p, &c, 8);
    feed(&p, 8, 0.5, 500);
    CHECK(dfl_policy_choose(&p, 0) == 1, "expensive verify must fall back to classic");
    /* ...but re-probes after reprobe_every classic steps. */
    for (int i = 0; i < p.reprobe_every; i++) dfl_policy_classic_step(&p);
    CHECK(dfl_policy_choose(&p, 0) == 8, "a probe round (block 8) is due");
    dfl_policy_observe(&p, 8, 0);
    CHECK(dfl_policy_choose(&p, 0) == 1, "after the probe, back to classic");
    /* Failed probes back off: each is twice as far off as the last, up to a bound. */
    int gaps[12], ng = probe_gaps(&p, gaps, 12, 6000);
    /* Probes that accept nothing put the next one four times as far off. */
    CHECK(ng >= 5 && gaps[0] == 4 * DFL_REPROBE_MIN, "first backed-off gap %d", gaps[0]);
    for (int i = 1; i < ng; i++) {
        int want = 4 * gaps[i - 1] < DFL_REPROBE_MAX ? 4 * gaps[i - 1] : DFL_REPROBE_MAX;
        CHECK(gaps[i] == want, "probe gap %d: %d, want %d", i, gaps[i], want);
    }
    /* A fresh policy whose prior favours classic probes at once; with
     * max block 4 the probe is 4 wide. */
    dfl_policy_init(&p, &c, 4);
    CHECK(dfl_policy_choose(&p, 0) == 4 && p.probing, "the first round is a probe of 4");
    /* A fresh policy's first probes that accept nothing keep the interval
     * while the drafts seen weigh less than the prior: one bad draw of a
     * good pair must not put its probes a request's length off. */
    dfl_policy_init(&p, &c, 8);
    int fresh[4], nf = probe_gaps(&p, fresh, 4, 2000);
    CHECK(nf == 4 && fresh[0] == 0 && fresh[1] == DFL_REPROBE_MIN &&
              fresh[2] == DFL_REPROBE_MIN && fresh[3] == DFL_REPROBE_MIN,
          "a fresh policy's failed probes: gaps %d %d %d %d, want 0 then %d while evidence is "
          "thin", fresh[0], fresh[1], fresh[2], fresh[3], DFL_REPROBE_MIN);
    /* A probe that accepts something and still loses doubles the interval. */
    dfl_policy_init(&p, &c, 8);
    feed(&p, 8, 0.1, 50);
    p.reprobe_every = 64, p.probing = 1;
    dfl_policy_observe(&p, 8, 1);
    CHECK(dfl_policy_choose(&p, 0) == 1 && p.reprobe_every == 128, "partial probe: interval %d",
          p.reprobe_every);
    /* A probe that wins resets the interval. */
    dfl_costs cheap;
    table(&cheap, 8, 1.0, 0.05);
    dfl_policy_init(&p, &cheap, 8);
    p.reprobe_every = DFL_REPROBE_MAX, p.probing = 1;
    dfl_policy_observe(&p, 2, 1);
    CHECK(p.reprobe_every == DFL_REPROBE_MIN, "a winning probe resets the interval: %d",
          p.reprobe_every);
    /* Old evidence fades: after 500 rounds of full acceptance, 1000 of none
     * bring position 0's estimate near zero. */
    dfl_policy_init(&p, &cheap, 8);
    for (int i = 0; i < 500; i++) dfl_policy_observe(&p, 4, 3);
    for (int i = 0; i < 1000; i++) dfl_policy_observe(&p, 4, 0);
    CHECK(dfl_policy_accept_p(&p, 0) < 0.05, "p0 after a change of text %.3f",
          dfl_policy_accept_p(&p, 0));

    /* Zero acceptance: never speculate beyond probes. */
    table(&c, 16, 1.0, 0.05);
    dfl_policy_init(&p, &c, 16);
    feed(&p, 16, 0.0, 200);
    CHECK(dfl_policy_choose(&p, 0) == 1, "zero acceptance must be classic");

    /* Acceptance estimates follow the evidence. */
    dfl_policy_init(&p, &c, 16);
    for (int i = 0; i < 1000; i++) dfl_policy_observe(&p, 4, i % 2 ? 3 : 1);
    CHECK(fabs(dfl_policy_accept_p(&p, 0) - 1.0) < 0.01, "p0 %.3f", dfl_policy_accept_p(&p, 0));
    CHECK(fabs(dfl_policy_accept_p(&p, 1) - 0.5) < 0.01, "p1 %.3f", dfl_policy_accept_p(&p, 1));
    CHECK(fabs(dfl_policy_expected(&p, 3) - (1 + 1 + 0.5)) < 0.02, "E[3] %.3f",
          dfl_policy_expected(&p, 3));

    /* Interpolation between measured sizes and past the last one. */
    dfl_costs_init(&c, 16);
    c.t_round[0][1] = 1.0, c.t_round[0][4] = 1.6, c.t_round[0][8] = 2.0;
    CHECK(fabs(dfl_costs_get(&c, 2, 0) - 1.2) < 1e-9, "interp 2: %g", dfl_costs_get(&c, 2, 0));
    CHECK(fabs(dfl_costs_get(&c, 6, 0) - 1.8) < 1e-9, "interp 6: %g", dfl_costs_get(&c, 6, 0));
    CHECK(fabs(dfl_costs_get(&c, 12, 0) - 2.4) < 1e-9, "extrap 12: %g",
          dfl_costs_get(&c, 12, 0));
    dfl_costs_update(&c, 4, 100, 2.2);
    CHECK(fabs(c.t_round[0][4] - 1.72) < 1e-9, "slower: moving average, %g", c.t_round[0][4]);
    dfl_costs_update(&c, 4, 100, 1.0);
    CHECK(fabs(c.t_round[0][4] - 1.36) < 1e-9, "faster: half way, %g", c.t_round[0][4]);
    depths();
    return test_summary();
}
