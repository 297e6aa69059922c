#include "decode/policy.h"
#include "dflash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void dfl_costs_init(dfl_costs *c, int max_block) {
    memset(c, 0, sizeof *c);
    c->max_block = max_block < DFL_POLICY_MAX ? max_block : DFL_POLICY_MAX;
}

/* Sessions of one engine share the table from several threads: entries are
 * read and written whole (relaxed atomics); a lost update only delays the
 * moving average. */
static double load(const double *p) {
    double v;
    __atomic_load(p, &v, __ATOMIC_RELAXED);
    return v;
}

int dfl_costs_depth(int ctx) {
    int d = 0;
    for (int c = 1024; ctx >= c && d < DFL_COST_DEPTHS - 1; c *= 2) d++;
    return d;
}

void dfl_costs_update(dfl_costs *c, int B, int ctx, double seconds) {
    if (B < 1 || B > c->max_block || !(seconds > 0)) return;
    int d = dfl_costs_depth(ctx);
    double *p = &c->t_round[d][B], t = load(p);
    if (t > 0 && seconds > DFL_COST_CLAMP * t) seconds = DFL_COST_CLAMP * t;
    t = !(t > 0) ? seconds : t + (seconds > t ? DFL_COST_RISE : DFL_COST_FALL) * (seconds - t);
    __atomic_store(p, &t, __ATOMIC_RELAXED);
    if (B == 1) __atomic_store_n(&c->since_step[d], 0, __ATOMIC_RELAXED);
    else __atomic_add_fetch(&c->since_step[d], 1, __ATOMIC_RELAXED);
}

/* B's cost from one depth's row:
 * - measured;
 * - else interpolated between the nearest measured sizes, but never below
 *   the larger one less a step for each row it lacks: a row costs no more
 *   than a step, and every block pays the drafter's whole pass. (Among
 *   others, a 2 ms step beside a probe of 8 at 30 ms, 14 ms of it the
 *   drafter's, put a block of 2 at 6 ms, not 18, and the slots held to
 *   classic steps wanted blocks of 2: Zen 4, four clients, tau 3.)
 * - else extended along the slope of the last two, or flat where that slope
 *   falls. (A block of 5 timed at 36 ms beside a 4-row tick, then a probe of
 *   8 at 28, made a block of 16 look cheaper than 8 in a crowd, and the slots
 *   verified blocks of 16 at tau 3: Zen 4, four clients.)
 * 0 when the row has too little; unless strict, one measured size alone is
 * extended flat. */
static double row_get(const double *t, int max_block, int B, int strict) {
    if (t[B] > 0) return t[B];
    int lo = B - 1, hi = B + 1;
    while (lo >= 1 && !(t[lo] > 0)) lo--;
    while (hi <= max_block && !(t[hi] > 0)) hi++;
    if (lo >= 1 && hi <= max_block) {
        double v = t[lo] + (t[hi] - t[lo]) * (B - lo) / (hi - lo);
        double least = t[1] > 0 ? t[hi] - (hi - B) * t[1] : 0;
        return v > least ? v : least;
    }
    if (lo < 1) return 0;
    int lo2 = lo - 1;
    while (lo2 >= 1 && !(t[lo2] > 0)) lo2--;
    if (lo2 < 1 && strict) return 0;
    double slope = lo2 >= 1 ? (t[lo] - t[lo2]) / (lo - lo2) : 0;
    return t[lo] + (slope > 0 ? slope : 0) * (B - lo);
}

/* strict: 0 rather than one measured size extended flat. */
static double costs_get(const dfl_costs *cs, int B, int ctx, int strict) {
    double t[DFL_COST_DEPTHS][DFL_POLICY_MAX + 1];
    int mb = cs->max_block, d = dfl_costs_depth(ctx);
    if (B < 1 || B > mb) return 0;
    for (int j = 0; j < DFL_COST_DEPTHS; j++)
        for (int i = 0; i <= mb; i++) t[j][i] = load(&cs->t_round[j][i]);
    double v = row_get(t[d], mb, B, 1);
    if (v > 0) return v;
    /* Too little measured at this depth yet: the nearest depth that has it
     * (shallower first), scaled as if every size grew with depth as a step
     * does; the first round measured here replaces the guess. */
    for (int k = 1; k < DFL_COST_DEPTHS; k++)
        for (int j = d - k; j <= d + k; j += 2 * k) {
            if (j < 0 || j >= DFL_COST_DEPTHS || !((v = row_get(t[j], mb, B, 1)) > 0)) continue;
            return t[d][1] > 0 && t[j][1] > 0 ? v * t[d][1] / t[j][1] : v;
        }
    return strict ? 0 : row_get(t[d], mb, B, 0);
}

double dfl_costs_get(const dfl_costs *cs, int B, int ctx) { return costs_get(cs, B, ctx, 0); }

/* What a round of B costs p: its table's figure. In a crowd, a size that the
 * crowd's table neither measured nor can interpolate costs the crowd's step
 * plus what the round adds to a step alone (the drafter's pass, the added
 * rows). The crowd's step extended flat, as alone, priced a block of 16 at
 * one row's share of a forward (1.7 ms), and a fresh crowd's first rounds
 * verified blocks of 10-16 (two clients, Zen 4). */
static double round_cost(const dfl_policy *p, int B, int ctx) {
    if (!p->alone) return dfl_costs_get(p->costs, B, ctx);
    double t = costs_get(p->costs, B, ctx, 1);
    if (t > 0 || B == 1) return t;
    double step = costs_get(p->costs, 1, ctx, 1);
    double a = dfl_costs_get(p->alone, B, ctx), a1 = dfl_costs_get(p->alone, 1, ctx);
    return step > 0 && a1 > 0 && a > a1 ? step + (a - a1) : 0;
}

void dfl_policy_init(dfl_policy *p, const dfl_costs *c, int max_block) {
    memset(p, 0, sizeof *p);
    p->costs = c;
    p->max_block = max_block < c->max_block ? max_block : c->max_block;
    p->reprobe_every = DFL_REPROBE_MIN;
    p->probe_block = p->max_block < 8 ? p->max_block : 8;
    /* When the prior alone favours classic, the first round is a probe:
     * evidence from the start, not after reprobe_every classic steps. */
    p->classic_run = p->reprobe_every;
}

static int best_block(const dfl_policy *p, int ctx);

void dfl_policy_observe(dfl_policy *p, int B, int accepted) {
    for (int i = 0; i < DFL_POLICY_MAX; i++) {
        p->tries[i] *= DFL_POLICY_DECAY;
        p->hits[i] *= DFL_POLICY_DECAY;
    }
    for (int i = 0; i < B - 1 && i < DFL_POLICY_MAX; i++) {
        if (i > accepted) break;   /* positions after the first miss were not tested */
        p->tries[i] += 1;
        if (i < accepted) p->hits[i] += 1;
    }
    p->classic_run = 0;
    /* A probe that leaves classic ahead puts the next one further off (four
     * times when it accepted nothing at all, twice otherwise): on a pair
     * that cannot win, probes then cost a vanishing share. Not while the
     * drafts seen weigh less than the prior they are shrunk towards: at tau
     * 6.5 (86% a draft) about one probe in seven accepts nothing, and two such
     * first probes had put the next 256 steps off, a whole request's (two
     * clients, Zen 4: that slot ran 27 tok/s beside its neighbour's 55-95). */
    if (p->probing) {
        int grow = p->tries[0] < DFL_POLICY_PRIOR ? 1 : accepted > 0 ? 2 : 4;
        p->reprobe_every = best_block(p, p->ctx) > 1 ? DFL_REPROBE_MIN
                           : p->reprobe_every * grow < DFL_REPROBE_MAX ? p->reprobe_every * grow
                                                                       : DFL_REPROBE_MAX;
        p->probing = 0;
    }
}

/* Position i's rate is shrunk towards the rate pooled over all positions
 * (itself with a Beta(1, 1) prior), worth DFL_POLICY_PRIOR rounds. Per
 * position alone, late positions (tested only when all before were
 * accepted) kept the coin-flip prior for long and the policy stayed at
 * small blocks; the pooled rate learns from every draft. */
static double pooled(const dfl_policy *p) {
    double h = 1, t = 2;
    for (int j = 0; j < DFL_POLICY_MAX; j++) h += p->hits[j], t += p->tries[j];
    return h / t;
}

static double shrunk(const dfl_policy *p, int i, double pool) {
    return (p->hits[i] + DFL_POLICY_PRIOR * pool) / (p->tries[i] + DFL_POLICY_PRIOR);
}

double dfl_policy_accept_p(const dfl_policy *p, int i) {
    if (i < 0 || i >= DFL_POLICY_MAX) return 0;
    return shrunk(p, i, pooled(p));
}

double dfl_policy_expected(const dfl_policy *p, int B) {
    double e = 1.0, run = 1.0, pool = pooled(p);
    for (int i = 0; i < B - 1 && i < DFL_POLICY_MAX; i++) {
        run *= shrunk(p, i, pool);
        e += run;
    }
    return e;
}

double dfl_policy_rate(const dfl_policy *p, int B, int ctx) {
    double t = round_cost(p, B, ctx);
    return t > 0 ? dfl_policy_expected(p, B) / t : 0;
}

double dfl_policy_worth(const dfl_policy *p, int B, int ctx) {
    double t = round_cost(p, B, ctx);
    if (!(t > 0)) return -HUGE_VAL;
    double e = dfl_policy_expected(p, B);
    return p->crowd_rate > 0 ? e - p->crowd_rate * t : e / t;
}

static int best_block(const dfl_policy *p, int ctx) {
    int best = 1;
    double best_w = dfl_policy_worth(p, 1, ctx);
    if (best_w == -HUGE_VAL) return 1;
    for (int B = 2; B <= p->max_block; B++) {
        double w = dfl_policy_worth(p, B, ctx);
        if (w > best_w) best_w = w, best = B;
    }
    return best;
}

/* Whether a probe is due, on the schedule stretched `stretch` times. A
 * block of 2 would only ever test the first position, which alone rarely
 * pays for a round. */
static int probe_due(const dfl_policy *p, int stretch) {
    return p->probe_block >= 2 && p->classic_run >= p->reprobe_every * stretch;
}

int dfl_policy_choose(dfl_policy *p, int ctx) {
    int B = best_block(p, p->ctx = ctx);
    if (B > 1) {
        p->reprobe_every = DFL_REPROBE_MIN;
        int stale = __atomic_load_n(&p->costs->since_step[dfl_costs_depth(ctx)], __ATOMIC_RELAXED);
        return stale >= DFL_RECLASSIC ? 1 : B;
    }
    /* Classic wins on current estimates; probe once in a while so a changed
     * text can win speculation back. */
    p->probing = probe_due(p, 1);
    return p->probing ? p->probe_block : 1;
}

int dfl_policy_held_probe(dfl_policy *p, int stretch) {
    p->probing = probe_due(p, stretch);
    return p->probing ? p->probe_block : 0;
}

void dfl_policy_classic_step(dfl_policy *p) { p->classic_run++; }

void dfl_policy_skip(dfl_policy *p) { p->probing = 0; }

void dfl_policy_resume(dfl_policy *p, const dfl_policy *prev) {
    memcpy(p->tries, prev->tries, sizeof p->tries);
    memcpy(p->hits, prev->hits, sizeof p->hits);
    p->reprobe_every = prev->reprobe_every < DFL_REPROBE_CARRY ? prev->reprobe_every
                                                                : DFL_REPROBE_CARRY;
    p->classic_run = prev->classic_run;
    p->crowd_rate = prev->crowd_rate;
}

/* ---- lanes ------------------------------------------------------------------- */

/* Whether rounds of B were timed at some depth: a guess from a classic
 * step's time is no cost to rank lanes by. A lane never chosen keeps its
 * guess, and one taken under a load spike (a CI run's parallel tests) left
 * the MTP lane out of every pinned round after the drafter's first. */
static int measured(const dfl_costs *cs, int B) {
    if (B > cs->max_block) return 0;
    for (int j = 0; j < DFL_COST_DEPTHS; j++)
        if (load(&cs->t_round[j][B]) > 0) return 1;
    return 0;
}

/* A pinned block of B: the n-gram lane when its lookup found a match, else
 * the model lane (drafter or MTP head) whose own acceptance promises more
 * tokens in B, per second when every offering model lane's cost of B is
 * measured; ties go to the drafter. 1 when no lane offers. */
static int pin_lane(const dfl_policy *pol, const int *offer, int B, int ctx, int *lane) {
    int m[2] = {DFL_LANE_DRAFTER, DFL_LANE_MTP}, by_rate = 1, best = -1;
    double bid[2] = {0, 0};
    if (offer[DFL_LANE_NGRAM] > 0) return *lane = DFL_LANE_NGRAM, B;
    for (int i = 0; i < 2; i++)
        if (offer[m[i]] > 0 && !measured(pol[m[i]].costs, B)) by_rate = 0;
    for (int i = 0; i < 2; i++) {
        if (offer[m[i]] < 1) continue;
        bid[i] = by_rate ? dfl_policy_rate(&pol[m[i]], B, ctx) : dfl_policy_expected(&pol[m[i]], B);
        if (best < 0 || bid[i] > bid[best]) best = i;
    }
    *lane = best < 0 ? DFL_LANE_DRAFTER : m[best];
    return best < 0 ? 1 : B;
}

int dfl_lanes_choose(dfl_policy *pol, const int *offer, int ctx, int pinned, int *lane) {
    int B[DFL_LANES] = {0}, best = -1;
    double bid[DFL_LANES] = {0};
    *lane = DFL_LANE_DRAFTER;
    if (pinned) return pin_lane(pol, offer, pinned, ctx, lane);
    for (int l = 0; l < DFL_LANES; l++) {
        if (offer[l] < 1) continue;
        B[l] = dfl_policy_choose(&pol[l], ctx);
        if (B[l] > offer[l] + 1) B[l] = offer[l] + 1;
        if (B[l] < 2) continue;
        bid[l] = dfl_policy_worth(&pol[l], B[l], ctx);
        if (best < 0 || bid[l] > bid[best]) best = l;
    }
    for (int l = 0; l < DFL_LANES; l++)   /* (a lane that chose a classic step asked for none) */
        if (B[l] > 1 && l != best) dfl_policy_skip(&pol[l]);
    if (best < 0) return 1;
    *lane = best;
    return B[best];
}

int dfl_lanes_want(const dfl_policy *pol, const int *offer, int ctx) {
    for (int l = 0; l < DFL_LANES; l++)
        if (offer[l] > 0 && best_block(&pol[l], ctx) > 1) return 1;
    return 0;
}

/* ---- chain or tree ------------------------------------------------------------ */

void dfl_tree_policy_init(dfl_tree_policy *p, int max_budget) {
    memset(p, 0, sizeof *p);
    p->max_budget = max_budget < DFL_TREE_POLICY_MAX ? max_budget : DFL_TREE_POLICY_MAX;
}

void dfl_tree_policy_observe(dfl_tree_policy *p, const double *mass, int n, double predicted,
                             int accepted) {
    p->seen = p->seen * DFL_POLICY_DECAY + 1;
    for (int N = 1; N <= p->max_budget; N++) {   /* a smaller tree: its mass stops growing */
        double m = mass[N < n ? N : n - 1];
        p->mass[N] += (m - p->mass[N]) / p->seen;
    }
    p->predicted = p->predicted * DFL_POLICY_DECAY + predicted;
    p->actual = p->actual * DFL_POLICY_DECAY + accepted;
    p->since = 0;
}

double dfl_tree_policy_expected(const dfl_tree_policy *p, int N) {
    if (N < 1 || N > p->max_budget) return 1;
    /* the calibration starts at 1 (the drafter taken at its word), worth a few rounds */
    double cal = (p->actual + DFL_POLICY_PRIOR) / (p->predicted + DFL_POLICY_PRIOR);
    return 1 + cal * p->mass[N];
}

/* A verify of `rows` rows by the chain's table: measured or interpolated up
 * to its largest block, extended past it along the slope of its upper half
 * (on a CPU a row costs about the same as the next). */
static double chain_rows_cost(const dfl_costs *cc, int rows, int ctx) {
    int mb = cc->max_block, half = mb / 2 > 1 ? mb / 2 : 1;
    if (rows <= mb) return dfl_costs_get(cc, rows, ctx);
    double hi = dfl_costs_get(cc, mb, ctx), lo = dfl_costs_get(cc, half, ctx);
    if (!(hi > 0) || !(lo > 0) || mb <= half) return 0;
    double slope = (hi - lo) / (mb - half);
    return hi + (slope > 0 ? slope : 0) * (rows - mb);
}

/* A tree of N nodes: measured at N + 1 rows at this depth, else the chain's
 * N + 1 rows scaled by what the nearest measured tree cost against the
 * chain's rows of its size (a tree drafts every depth and gathers keys), else
 * the chain's rows alone. Never a flat extension of one measured size: a
 * 33-row tree is not the price of a 9-row one. */
static double tree_cost(const dfl_costs *tc, const dfl_costs *cc, int N, int ctx) {
    double chain = chain_rows_cost(cc, N + 1, ctx);
    if (!tc) return chain;
    const double *t = tc->t_round[dfl_costs_depth(ctx)];
    int near = 0;
    for (int m = 2; m <= tc->max_block; m++)
        if (load(&t[m]) > 0 && (!near || abs(m - (N + 1)) < abs(near - (N + 1)))) near = m;
    if (near == N + 1) return load(&t[near]);
    double at = near ? chain_rows_cost(cc, near, ctx) : 0;
    return at > 0 ? chain * load(&t[near]) / at : chain;
}

int dfl_tree_policy_choose(dfl_tree_policy *p, const dfl_costs *tree_costs,
                           const dfl_costs *chain_costs, int ctx, double chain_rate) {
    if (p->max_budget < 2) return 0;
    if (!(p->seen > 0)) return p->max_budget < DFL_TREE_FIRST ? p->max_budget : DFL_TREE_FIRST;
    int best = 0;
    double best_rate = chain_rate;
    /* A tree wins on its rate only once trees have had drafts accepted: the
     * prior keeps the calibration above 0 against decayed sums, so at zero
     * acceptance a tree predicted about 1.3 tokens, and where its rows cost
     * about one (a tiny model, a noisy clock) it took every round. */
    for (int N = 2; p->actual >= 1 && N <= p->max_budget; N++) {
        double t = tree_cost(tree_costs, chain_costs, N, ctx);
        double rate = t > 0 ? dfl_tree_policy_expected(p, N) / t : 0;
        if (rate > best_rate) best_rate = rate, best = N;
    }
    if (best) return best;
    if (++p->since < DFL_TREE_REPROBE) return 0;
    /* a probe: the budget with the best rate per predicted token, unknown costs aside */
    int probe = p->max_budget;
    double probe_rate = 0;
    for (int N = 2; N <= p->max_budget; N++) {
        double t = tree_cost(tree_costs, chain_costs, N, ctx);
        double rate = t > 0 ? dfl_tree_policy_expected(p, N) / t : 0;
        if (rate > probe_rate) probe_rate = rate, probe = N;
    }
    return probe;
}

/* ---- the crowd gate ------------------------------------------------------------ */

void dfl_gate_init(dfl_gate *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
}

void dfl_gate_free(dfl_gate *g) { pthread_mutex_destroy(&g->mu); }

static int crowd(int active) {
    return (active > DFL_GATE_CROWDS + 1 ? DFL_GATE_CROWDS + 1 : active) - 2;
}

/* Below this much measured time a mode's rate is not yet evidence: a few
 * ticks, whose tokens come in rounds of up to a block. */
#define GATE_MIN_S 0.2

double dfl_gate_rate(const dfl_gate *g, int c, int m) {
    return g->sec[c][m] >= GATE_MIN_S ? g->tok[c][m] / g->sec[c][m] : 0;
}

double dfl_gate_price(dfl_gate *g, int active) {
    if (active < 2) return 0;
    pthread_mutex_lock(&g->mu);
    double r1 = dfl_gate_rate(g, crowd(active), 1), r0 = dfl_gate_rate(g, crowd(active), 0);
    pthread_mutex_unlock(&g->mu);
    return r1 > 0 && r0 > r1 ? r0 : r1;
}

/* Whether crowd c measured speculation ahead: by DFL_GATE_MARGIN, since the
 * windows leave out what speculation costs a crowd outside them. */
static int spec_ahead(const dfl_gate *g, int c) {
    return dfl_gate_rate(g, c, 1) > DFL_GATE_MARGIN * dfl_gate_rate(g, c, 0);
}

/* The open span's tokens and time join its crowd and mode's sums, which
 * first lose weight by half per window of that time (the machine's speed
 * and the texts drift); a span with a prefill in it is dropped. A new span
 * opens at `now`. */
static void span_close(dfl_gate *g, double now) {
    double d = now - g->s0;
    if (g->n >= 2 && !g->span_dropped && d > 0) {
        int c = crowd(g->n), m = g->spec;
        double f = exp2(-d / DFL_GATE_WINDOW_S);
        g->tok[c][m] = f * g->tok[c][m] + g->tokens;
        g->sec[c][m] = f * g->sec[c][m] + d;
        g->measured += d;
    }
    g->s0 = now, g->tokens = 0, g->span_dropped = g->prefill > 0;
}

/* Whether speculation measured far behind classic steps in crowd c. */
static int far_behind(const dfl_gate *g, int c) {
    double r0 = dfl_gate_rate(g, c, 0), r1 = dfl_gate_rate(g, c, 1);
    return r0 > 0 && r1 > 0 && r1 < DFL_GATE_FAR * r0;
}

/* Far behind in a crowd is far behind in every larger one: their verify
 * rows cost more (window_close's schedule assumes the same). */
static int far_upto(const dfl_gate *g, int c) {
    for (int j = 0; j <= c; j++)
        if (far_behind(g, j)) return 1;
    return 0;
}

int dfl_gate_far(dfl_gate *g, int active) {
    if (active < 2) return 0;
    pthread_mutex_lock(&g->mu);
    int far = far_upto(g, crowd(active));
    pthread_mutex_unlock(&g->mu);
    return far;
}

/* The open window counts once its spans measured a quarter of it: its mode's
 * evidence of that crowd is fresh, the other mode's ages by a window, and a
 * try of the mode behind sets when it is next tried. */
static void window_close(dfl_gate *g) {
    if (g->n < 2 || g->measured < 0.25 * DFL_GATE_WINDOW_S) return;
    int c = crowd(g->n), m = g->spec;
    g->age[c][m] = 0;
    g->age[c][!m]++;
    g->windows[m]++;
    if (!g->every[c]) g->every[c] = DFL_GATE_EXPLORE;
    if (!g->trying) return;
    /* The mode behind: still behind waits twice as long (far behind, the
     * longest: DFL_GATE_EXPLORE_FAR), ahead resets. A busy
     * server's crowd changes size every second or so, and each size tried on
     * its own schedule: speculation behind is behind in the larger crowds too
     * (their verify rows cost more), classic steps in the smaller ones, so
     * their tries wait as long, counted from their own last. */
    int far = m && far_behind(g, c), ahead = m ? spec_ahead(g, c) : !spec_ahead(g, c);
    int every = far ? DFL_GATE_EXPLORE_FAR
                    : 2 * g->every[c] < DFL_GATE_EXPLORE_MAX ? 2 * g->every[c] : DFL_GATE_EXPLORE_MAX;
    g->every[c] = ahead ? DFL_GATE_EXPLORE : every;
    for (int j = 0; j < DFL_GATE_CROWDS && !ahead; j++)
        if ((m ? j > c : j < c) && g->every[j] < every) g->every[j] = every;
}

/* The mode measured ahead for crowd c: its own, else the nearest crowd's
 * (smaller first) that has both measured (a server's crowd changes size
 * with every request that starts or ends, and neighbouring sizes behave
 * alike); -1 when none has. */
static int gate_best(const dfl_gate *g, int c) {
    for (int k = 0; k < DFL_GATE_CROWDS; k++)
        for (int j = c - k; j <= c + k; j += k ? 2 * k : 1) {
            if (j < 0 || j >= DFL_GATE_CROWDS) continue;
            if (dfl_gate_rate(g, j, 0) > 0 && dfl_gate_rate(g, j, 1) > 0) return spec_ahead(g, j);
        }
    return -1;
}

/* Whether speculation may be measured in crowd c now, though classic steps
 * are ahead or alone measured: only if a sequence held to classic steps
 * wanted it since speculation's last window there, else once in
 * DFL_GATE_EXPLORE_MAX windows. A window whose policies all choose classic
 * steps measures only their probes. */
static int spec_wanted(const dfl_gate *g, int c) {
    return g->wanted[c] || g->age[c][1] >= DFL_GATE_EXPLORE_MAX;
}

/* Whether crowd c is held by evidence: speculation measured behind classic
 * steps there or in the nearest crowd that measured both (gate_best), or
 * far behind in a smaller one. Its sequences draft only in the gate's tries,
 * which come on its schedule (window_close); each drafter pass between them,
 * a prompt's feed or a held probe, is one the whole crowd waits for. */
static int held_behind(const dfl_gate *g, int c) { return far_upto(g, c) || !gate_best(g, c); }

int dfl_gate_idle(dfl_gate *g, int active) {
    if (active < 2) return 0;
    int c = crowd(active);
    pthread_mutex_lock(&g->mu);
    int idle = held_behind(g, c) || (!(dfl_gate_rate(g, c, 1) > 0) && !spec_wanted(g, c));
    pthread_mutex_unlock(&g->mu);
    return idle;
}

/* A window's mode: the one measured ahead. With no evidence anywhere,
 * classic steps first, then speculation once wanted (spec_wanted): a fresh
 * crowd's first window of speculation, its policies still learning the
 * crowd's costs, ran at about 0.8x classic steps (Zen 4, four clients), and
 * in crowds of four and eight, at tau 3 and 6.5 alike, cost that much for
 * nothing: there classic steps win. That first window is a try: far
 * behind it ends after DFL_GATE_ABORT_S, and its verdict sets when the next
 * comes. (Run as a whole window that left `every` alone, it and the try 5
 * windows later cost a fresh crowd of eight about 1 s of its rate at a third
 * of classic steps': 4% of a 25 s stage, where DFlash ran 0.94-0.95x.) The
 * other mode gets a window once it has not been measured for the crowd's
 * `every` windows; speculation only if spec_wanted, and not while a prompt
 * is prefilling: a span with a prefill in it is not measured, so a try
 * there cannot end early, and one ran its whole window at 0.55x classic
 * steps (eight clients, Zen 4). It waits for the next window. */
static int gate_pick(dfl_gate *g, int active) {
    int c = crowd(active), best = gate_best(g, c), spec;
    g->trying = 0;
    if (best < 0) {
        spec = !(dfl_gate_rate(g, c, 1) > 0) && dfl_gate_rate(g, c, 0) > 0 &&
               spec_wanted(g, c) && !g->prefill;
        g->trying = spec;   /* the first window of speculation is a try (above) */
    } else {
        g->trying = g->age[c][!best] >= (g->every[c] ? g->every[c] : DFL_GATE_EXPLORE);
        if (g->trying && !best && (!spec_wanted(g, c) || g->prefill)) g->trying = 0;
        spec = g->trying ? !best : best;
    }
    if (spec) g->wanted[c] = 0;
    return spec;
}

/* A try of speculation whose open span has run DFL_GATE_ABORT_S at far less
 * than classic steps' rate ends its window now: at eight clients a try cost
 * the crowd about half a window of tokens. */
static int try_lost(const dfl_gate *g, double now) {
    double d = now - g->s0, r0 = dfl_gate_rate(g, crowd(g->n), 0);
    return g->trying && g->spec && !g->span_dropped && d >= DFL_GATE_ABORT_S && r0 > 0 &&
           g->tokens / d < DFL_GATE_FAR * r0;
}

/* The open span and window end at `now`; the next opens for `active`
 * sequences (none below 2: a lone sequence is not measured). */
static void gate_turn(dfl_gate *g, double now, int active) {
    span_close(g, now);
    window_close(g);
    g->n = active, g->t0 = now, g->measured = 0;
    g->spec = active < 2 || gate_pick(g, active);
}

/* A crowd that shrinks to one sequence ends its span then, not when it next
 * grows: the lone ticks between counted as the crowd's time without tokens. */
int dfl_gate_open(dfl_gate *g, double now, int active) {
    pthread_mutex_lock(&g->mu);
    if (g->n != active || (active >= 2 && (now - g->t0 >= DFL_GATE_WINDOW_S || try_lost(g, now))))
        gate_turn(g, now, active);
    int open = g->spec;   /* gate_turn opens it for fewer than two */
    pthread_mutex_unlock(&g->mu);
    return open;
}

/* Until a gated sequence opens the next window, nothing is measured: not
 * the idle server, nor others' requests that speculate or not by their own
 * choice. (The span stayed open, and the next crowd's first call closed it:
 * a crowd of two back after 8 s of such requests measured classic steps at
 * 0.9 tok/s against 40, and speculation ran on that for 9 windows.) */
void dfl_gate_leave(dfl_gate *g, double now) {
    pthread_mutex_lock(&g->mu);
    gate_turn(g, now, 0);
    pthread_mutex_unlock(&g->mu);
}

void dfl_gate_note(dfl_gate *g, int active, int tokens, int wants) {
    if (active < 2) return;
    pthread_mutex_lock(&g->mu);
    if (g->n == active) g->tokens += tokens;
    if (wants && !g->spec) g->wanted[crowd(active)] = 1;
    pthread_mutex_unlock(&g->mu);
}

/* The span up to `now` closes (dropped if a prefill ran in it); the next is
 * dropped only while one still runs. (It stayed dropped after the last
 * prefill ended, until the window closed: a fresh crowd's first window, which
 * opens with the prefills, then measured nothing, and its mode ran a second
 * window unmeasured.) */
void dfl_gate_prefill(dfl_gate *g, double now, int delta) {
    pthread_mutex_lock(&g->mu);
    span_close(g, now);
    g->prefill += delta;
    g->span_dropped = g->prefill > 0;
    pthread_mutex_unlock(&g->mu);
}

/* The credit grows by the share of the time since it was last topped up,
 * from a full one at the first probe (a server's first crowd has spent
 * nothing yet). A crowd held by evidence (held_behind) probes not at all:
 * the probes are there to let a fresh crowd's held sequences learn that
 * they want speculation; once a try has measured it behind, its drafter
 * passes hold up the whole crowd for evidence the next try measures anyway.
 * (At four clients, tau 6.5, on Zen 4 the probes of a held wave took 35-62
 * ms of its 8.5 s: the budget refills between waves, up to
 * DFL_GATE_PROBE_CAP_S.) */
int dfl_gate_probe_ok(dfl_gate *g, double now, int active) {
    pthread_mutex_lock(&g->mu);
    if (active >= 2 && held_behind(g, crowd(active))) {
        pthread_mutex_unlock(&g->mu);
        return 0;
    }
    double c = g->probe_t > 0 ? g->probe_credit + DFL_GATE_PROBE_SHARE * (now - g->probe_t)
                              : DFL_GATE_PROBE_CAP_S;
    g->probe_credit = c < DFL_GATE_PROBE_CAP_S ? c : DFL_GATE_PROBE_CAP_S;
    g->probe_t = now;
    int ok = g->probe_credit >= g->probe_last;
    if (ok) g->probe_credit -= g->probe_last;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

void dfl_gate_probe_spent(dfl_gate *g, int active, double seconds) {
    pthread_mutex_lock(&g->mu);
    double spent = seconds * (active > 1 ? active : 1);
    g->probe_credit += g->probe_last - spent;   /* the reservation, settled */
    g->probe_last = spent;
    pthread_mutex_unlock(&g->mu);
}
