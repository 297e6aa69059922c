/* policy.h - the adaptive block policy: each round picks the verify block
 * size that maximises expected committed tokens per second, from costs
 * measured on the running model and acceptance tracked per block position.
 * Block 1 means classic decode; while speculation cannot win the policy
 * stays there and re-probes now and then so acceptance estimates stay fresh. */
#ifndef DFL_POLICY_H
#define DFL_POLICY_H

#include <pthread.h>
#include <stdint.h>

enum { DFL_POLICY_MAX = 64 };
/* Context depths costs are kept for: [0, 1K), [1K, 2K), [2K, 4K) ... [64K, ...). Every
 * round gets dearer with depth (0.6B Q8_0: a step 44 ms at 1K, 441 ms at 32K) and not
 * all sizes alike (a B-row verify's attention is arithmetic over every key per row, a
 * step's one read of the cache: 16 rows cost 3.5-5.1 steps over 1K..32K); one table
 * would mix the rounds of short and long sessions of one engine. */
enum { DFL_COST_DEPTHS = 8 };

typedef struct dfl_costs {
    int max_block;
    double t_round[DFL_COST_DEPTHS][DFL_POLICY_MAX + 1];
                         /* seconds per round of block B at depth d (verify + draft + rest);
                            [d][1] is one classic step; 0 = not measured */
    int since_step[DFL_COST_DEPTHS];
                         /* rounds measured at depth d since its classic step last was */
} dfl_costs;

typedef struct dfl_policy {
    const dfl_costs *costs;             /* shared by an engine's sessions */
    const dfl_costs *alone;             /* in a crowd, where costs is the crowd's table:
                                           the lane's table of rounds alone, which prices
                                           the sizes the crowd has not measured; else NULL */
    int max_block;
    double tries[DFL_POLICY_MAX];       /* drafts seen at position i (0-based) ... */
    double hits[DFL_POLICY_MAX];        /* ... and accepted, given all before accepted */
    int classic_run;                    /* classic steps since the last speculative round */
    int reprobe_every;                  /* classic steps between probes: grows after each
                                           probe that does not win speculation back */
    int probing;                        /* the round just chosen is such a probe */
    int probe_block;                    /* a probe's block: wide enough to test several
                                           positions, not the whole drafter block */
    int ctx;                            /* cache rows when the last round was chosen */
    double crowd_rate;                  /* tokens per second of the forwards this sequence
                                           shares with others, all together (0: alone);
                                           carried to the slot's next request */
} dfl_policy;

enum { DFL_REPROBE_MIN = 16, DFL_REPROBE_MAX = 1024 };
/* The probe spacing a new request resumes is at most this: a request is a
 * new text, and spacing grown to DFL_REPROBE_MAX on unpredictable ones kept
 * a predictable one after them on classic steps for its first 1024 tokens.
 * The price, on a run of unpredictable requests: about one probe each. */
enum { DFL_REPROBE_CARRY = 128 };
/* Rounds after which one classic step is taken whatever the estimates say: a
 * step's cost is measured only when one is taken, and under a changing load
 * (a server's other slots come and go) a stale step cost would keep the
 * policy speculating where plain steps now win. */
enum { DFL_RECLASSIC = 16 };
/* A measured round time counts at most this factor of the current estimate:
 * one forward stalled by the machine (another process, another slot's
 * prefill, a classic step that flushes parked rows into the drafter) must
 * not flip the policy for the rounds after it. A step's cost that two such
 * stalls had raised by 2x each (an AVX-512 Zen 4, 0.6B Q8_0, tau 3: 21 ->
 * 34 ms) made speculation at 2.3 tokens per 70 ms round look ahead of
 * classic, and kept it so: rounds do not re-measure the step. Slower
 * measurements move an estimate by DFL_COST_RISE of their difference, faster
 * ones by DFL_COST_FALL: costs fall soon when a server's other slots go idle. */
#define DFL_COST_CLAMP 1.5
#define DFL_COST_RISE 0.2
#define DFL_COST_FALL 0.5
/* Per observed round, old evidence is weighted down by this factor, so the
 * estimates follow a text whose predictability changes (about the last 200
 * rounds count). */
#define DFL_POLICY_DECAY 0.995
/* Weight, in rounds, of the pooled acceptance rate in each position's estimate. */
#define DFL_POLICY_PRIOR 4.0

void dfl_costs_init(dfl_costs *c, int max_block);
/* The depth index of a round that starts with ctx rows in the cache. */
int dfl_costs_depth(int ctx);
/* Folds a measured round time at context ctx into the table (moving average). */
void dfl_costs_update(dfl_costs *c, int B, int ctx, double seconds);
/* Cost of block B at context ctx: measured at that depth, else interpolated
 * or extended from two sizes measured there; else the nearest depth's, scaled
 * by the ratio of the two depths' classic steps when both are known. */
double dfl_costs_get(const dfl_costs *c, int B, int ctx);

void dfl_policy_init(dfl_policy *p, const dfl_costs *c, int max_block);
/* Continues from the evidence in prev (an earlier call's policy of the same
 * max_block): acceptance counts, probe spacing (up to DFL_REPROBE_CARRY) and
 * the run of classic steps. */
void dfl_policy_resume(dfl_policy *p, const dfl_policy *prev);
/* Records a round: B-1 drafts proposed, the first `accepted` of them accepted. */
void dfl_policy_observe(dfl_policy *p, int B, int accepted);
/* Probability that draft position i (0-based) is accepted given all before
 * were: its own evidence, shrunk towards the rate pooled over positions. */
double dfl_policy_accept_p(const dfl_policy *p, int i);
/* Expected tokens committed by a round of block B (the bonus counts). */
double dfl_policy_expected(const dfl_policy *p, int B);
/* Expected tokens per second of a round of block B at context ctx (0 when
 * its cost is unknown): what lanes are compared by. */
double dfl_policy_rate(const dfl_policy *p, int B, int ctx);
/* What block B is worth to the policy below: its rate alone, E(B) - L t(B)
 * in a crowd; -HUGE_VAL when its cost is unknown. Lanes bid by it. */
double dfl_policy_worth(const dfl_policy *p, int B, int ctx);
/* The block size for the next round (1 = classic decode step), which starts
 * with ctx rows in the cache. Alone, the block of the best rate E(B) / t(B).
 * In a crowd (crowd_rate L > 0, costs the marginal time of the round's rows
 * in the shared forward plus its drafter share) the block whose extra
 * tokens pay for the time it adds to everyone's tick at the crowd's rate:
 * the largest E(B) - L t(B). Alone the two agree (L is then the best rate);
 * by its own rate a round in a crowd could never win, since its B rows
 * cost at least B times a step's one. */
int dfl_policy_choose(dfl_policy *p, int ctx);
/* Tells the policy a classic step was taken (or another lane's round: for
 * the spacing of probes, a round this lane sat out is one it did not draft). */
void dfl_policy_classic_step(dfl_policy *p);
/* The round just chosen was given to another lane: a probe it asked for is
 * not under way (it is asked for again on a later round). */
void dfl_policy_skip(dfl_policy *p);
/* A probe of a sequence held to classic steps (its drafts are checked against
 * the steps that follow, not verified): its block when one is due on the
 * probe schedule stretched `stretch` times, marked under way as a chosen
 * probe is (dfl_policy_observe ends it); 0 when none is due. */
int dfl_policy_held_probe(dfl_policy *p, int stretch);

/* ---- lanes -----------------------------------------------------------------
 * pol and offer are indexed by lane (DFL_LANE_*, DFL_LANES each, dflash.h):
 * offer[l] the drafts lane l can give this round (0: none, or no such lane).
 * Adaptive (pinned 0): each offering lane bids the block its own policy
 * picks (no longer than its offer + 1) at the tokens per second that block
 * promises (its own measured acceptance over its own measured round cost);
 * the best bid of a block above 1 drafts (ties to the lower lane: drafter,
 * n-gram, MTP), a classic step when no lane's policy beats one; lanes whose
 * block lost are told (dfl_policy_skip). Pinned B: the n-gram lane when it
 * offers (a match), else the model lane (drafter, MTP) with the better rate
 * of B (its expected tokens while a cost of B is unknown), ties to the
 * drafter. Returns the block (1: a classic step) and sets *lane. */
int dfl_lanes_choose(dfl_policy *pol, const int *offer, int ctx, int pinned, int *lane);
/* Whether some offering lane's policy would speculate now, probes aside (no
 * state changes): what a sequence the crowd gate holds to classic steps
 * tells the gate (dfl_gate_note). */
int dfl_lanes_want(const dfl_policy *pol, const int *offer, int ctx);

/* ---- chain or tree (DDTree) ----------------------------------------------
 * A tree of N nodes is verified as N + 1 rows: on a CPU each row costs
 * about what a chain's does, so a tree pays only while the acceptance it
 * adds beats the rows it adds. Its expected accepted drafts come from the
 * drafter's own probabilities (the mass of the first N best-first nodes,
 * averaged over recent trees), scaled by how far the accepted drafts of
 * tree rounds have fallen short of (or beaten) that prediction. */
enum { DFL_TREE_POLICY_MAX = 64,   /* budgets tracked (>= DFL_MAX_TREE) */
       DFL_TREE_REPROBE = 32,      /* drafter rounds between trees while the chain wins */
       DFL_TREE_FIRST = 8 };       /* the first tree's budget: its mass (of the largest tree)
                                      and cost start the evidence, cheaply */

typedef struct dfl_tree_policy {
    int max_budget;                        /* largest budget considered; 0: never a tree */
    double mass[DFL_TREE_POLICY_MAX + 1];  /* decayed mean drafter mass of a budget-N tree */
    double predicted, actual;              /* decayed sums over tree rounds: the mass of the
                                              tree verified, and the drafts it accepted */
    double seen;                           /* decayed count of trees drafted */
    int since;                             /* chain rounds since the last tree */
} dfl_tree_policy;

void dfl_tree_policy_init(dfl_tree_policy *p, int max_budget);
/* A tree round: mass[0..n) of the largest tree drafted (n - 1 nodes), the
 * mass of the budget it verified, and the drafts it accepted. */
void dfl_tree_policy_observe(dfl_tree_policy *p, const double *mass, int n, double predicted,
                             int accepted);
/* Expected tokens a budget-N tree commits (the bonus counts). */
double dfl_tree_policy_expected(const dfl_tree_policy *p, int N);
/* The budget for the drafter's next round (0: the chain), given the chain's
 * rate (tokens per second of the block the chain policy picked), tree round
 * costs (measured tree rounds, NULL or empty: the chain table's verify of
 * N + 1 rows) and the chain's table. The first round is a tree of
 * DFL_TREE_FIRST nodes, and one in every DFL_TREE_REPROBE while the chain
 * wins a tree of the best predicted budget, so the evidence stays fresh. */
int dfl_tree_policy_choose(dfl_tree_policy *p, const dfl_costs *tree_costs,
                           const dfl_costs *chain_costs, int ctx, double chain_rate);

/* ---- the crowd gate ------------------------------------------------------------
 * With several sequences in each forward, a slot's own table cannot say what
 * its round does to the others: on a CPU whose forward of a few rows is
 * already arithmetic-bound, every verify row slows every slot's tick. The
 * gate measures what the engine commits per second, all sequences together,
 * with speculation allowed and with classic steps only, kept per number of
 * active sequences, and lets speculation run only while it has measured
 * ahead. Time goes in windows of one mode; the other mode gets a window
 * after DFL_GATE_EXPLORE, and after twice as many each time it loses again
 * (up to DFL_GATE_EXPLORE_MAX), so the evidence follows a changing load at a
 * small cost. A window is measured in spans of one crowd size: a sequence
 * that joins or leaves ends the span (and the window, whose mode the new
 * crowd picks), but what the span measured counts, since in a busy server
 * the crowd changes every second or so. Only spans in which a prompt is
 * being prefilled are dropped: their ticks carry rows that commit nothing,
 * in either mode. A fresh crowd with no evidence anywhere starts on classic
 * steps. One sequence alone is never gated: its own policy already
 * measures every cost it causes. While classic steps are ahead, speculation
 * is tried on that schedule only if a sequence held to them wanted to
 * speculate (its policy, priced at the crowd's costs, chose a block above
 * 1), else once in DFL_GATE_EXPLORE_MAX windows: a try whose policies all
 * choose classic steps measures only their probes, which cost the crowd
 * what they cost (four clients on Zen 4, tau 3 and 6.5: tries of 108-122
 * tok/s against classic's 125-139, every slot's rounds but its probes
 * classic steps). */
enum { DFL_GATE_CROWDS = 8,     /* active counts tracked: 2 .. DFL_GATE_CROWDS + 1 (more
                                   share the last) */
       DFL_GATE_EXPLORE = 5,    /* windows between tries of the mode that measured behind */
       DFL_GATE_EXPLORE_MAX = 40,    /* ... doubled after each try it loses again, up to this */
       /* ... and this after a try of speculation that lost far behind (DFL_GATE_FAR): at
          eight clients on Zen 4 a try ran 0.6-1 s at 0.55x classic steps; tries every 40
          windows cost the crowd 1.5%, and growing fourfold towards this, 1.4% (16 pairs
          inside one server, tau 6.5) */
       DFL_GATE_EXPLORE_FAR = 120 };
/* Speculation wins a crowd only when its windows measured this much ahead of
 * classic steps'. The windows leave out the prefills and the crowd's end,
 * where speculation costs more: requests of one crowd finish at uneven times
 * (a 4-client Zen 5 run: 18-70 tok/s a request, classic steps 31-40), so the
 * last ones run with the machine half idle. With a tie in the windows
 * (146-155 tok/s against classic's 144-157), that run's aggregate was 0.93x
 * classic's. */
#define DFL_GATE_MARGIN 1.1
/* Speculation below this share of classic steps' rate is far behind: a try
 * measuring that ends after DFL_GATE_ABORT_S, and the next waits
 * DFL_GATE_EXPLORE_FAR windows (at 8 clients on Zen 5 a try committed about a
 * third of a classic window's tokens, and the tries cost the crowd 3-9%). */
#define DFL_GATE_FAR 0.7
#define DFL_GATE_ABORT_S 0.5
#define DFL_GATE_WINDOW_S 1.0   /* a window's length: about 10-30 ticks of a crowd here; the
                                   evidence halves in weight every such time of its mode */
/* Held probes (a sequence held to classic steps drafts now and then to keep
 * its acceptance known) may take at most this share of the crowd's time. A
 * drafter pass holds the machine, so every sequence of the crowd waits for
 * it: at eight clients on Zen 4 each request's probes took 25 ms of its 5.9 s,
 * and the crowd, waiting for eight such, ran 0.972x classic steps (16 pairs,
 * 95% interval of the median 0.960-0.992). The budget accrues with time, up
 * to DFL_GATE_PROBE_CAP_S, and each probe spends its time times the crowd. */
#define DFL_GATE_PROBE_SHARE 0.005
#define DFL_GATE_PROBE_CAP_S 0.25
typedef struct dfl_gate {
    pthread_mutex_t mu;
    int spec;                   /* the open window's mode: 1 speculation allowed */
    int n;                      /* active sequences of the open window and span (0: none) */
    int prefill;                /* sequences prefilling a prompt now */
    int span_dropped;           /* the open span had a prefill in it */
    double t0;                  /* when the window opened */
    double s0;                  /* when the span opened */
    double tokens;              /* tokens committed in the span, every sequence's */
    double measured;            /* seconds of the window its spans measured */
    double tok[DFL_GATE_CROWDS][2], sec[DFL_GATE_CROWDS][2];  /* by crowd and mode: tokens
                                   and seconds measured, older ones weighing less */
    int age[DFL_GATE_CROWDS][2];       /* windows closed since that mode was measured */
    int every[DFL_GATE_CROWDS];        /* windows between tries of the mode behind */
    int trying;                 /* the open window tries the mode behind */
    int wanted[DFL_GATE_CROWDS];       /* a sequence held to classic steps in crowd c wanted to
                                   speculate since that crowd's last speculation window */
    uint64_t windows[2];        /* windows measured in each mode (for stats) */
    double probe_credit;        /* crowd-seconds held probes may still spend */
    double probe_t;             /* when the credit was last topped up (0: never) */
    double probe_last;          /* the last held probe's crowd-seconds: what one is expected
                                   to spend */
} dfl_gate;
void dfl_gate_init(dfl_gate *g);
void dfl_gate_free(dfl_gate *g);
/* May a sequence speculate now, with `active` sequences joined? Opens the
 * next window (and picks its mode) when the last one is over. */
int dfl_gate_open(dfl_gate *g, double now, int active);
/* A sequence committed `tokens` with `active` sequences joined; `wants`: it
 * was held to a classic step and wanted to speculate (dfl_lanes_want). */
void dfl_gate_note(dfl_gate *g, int active, int tokens, int wants);
/* A sequence that called dfl_gate_open leaves the engine: the span ends. */
void dfl_gate_leave(dfl_gate *g, double now);
/* Whether crowd `active`, or a smaller one, measured speculation far behind
 * classic steps (DFL_GATE_FAR): its sequences are not expected to speculate. */
int dfl_gate_far(dfl_gate *g, int active);
/* Whether the sequences of crowd `active` are not expected to draft soon:
 * the gate's evidence holds it (speculation measured behind there or in the
 * nearest crowd that measured both, or far behind in a smaller one: it
 * drafts only in the gate's tries), or it never measured speculation and
 * no sequence held to classic steps wants it (so no try is due). */
int dfl_gate_idle(dfl_gate *g, int active);
/* May a held sequence of `active` probe now (DFL_GATE_PROBE_SHARE; never
 * while the gate's evidence holds the crowd, as in dfl_gate_idle)? If so
 * the probe's expected cost is reserved, and dfl_gate_probe_spent settles it
 * with the seconds the probe took. */
int dfl_gate_probe_ok(dfl_gate *g, double now, int active);
void dfl_gate_probe_spent(dfl_gate *g, int active, double seconds);
/* A sequence starts (+1) or ends (-1) prefilling its prompt. */
void dfl_gate_prefill(dfl_gate *g, double now, int delta);
/* Crowd c's (active - 2) measured tokens per second in mode m; 0: not yet. */
double dfl_gate_rate(const dfl_gate *g, int c, int m);
/* What a second of the shared forward is worth with `active` sequences
 * speculating: the tokens per second the gate measured of them all, with
 * speculation allowed (0: not yet). A verify row's time is priced at this,
 * not at the rows per second of a forward: other sequences' verify rows
 * commit less than a token each, and at rows per second a slot among
 * speculating ones saw its own drafts as not worth their rows, stayed on
 * classic steps, and ran at a third of the others' speed (4 clients, tau
 * 6.5: 20.9 tok/s against 53-68), so the crowd ended with it alone. Where
 * classic steps measured more, their rate: the crowd can always have it.
 * (Priced at a losing speculation's own rate, 70 tok/s against classic's
 * 150 at four clients, a try's rounds looked cheap, and the slots verified
 * blocks of 5 that lost again: a Zen 4 trace.) */
double dfl_gate_price(dfl_gate *g, int active);

#endif
