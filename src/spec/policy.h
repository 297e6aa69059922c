/* policy.h - the adaptive block policy: each round picks the verify block
 * size that maximises expected committed tokens per second, from costs
 * measured on the running model and acceptance tracked per block position.
 * Block 1 means classic decode; while speculation cannot win the policy
 * stays there and re-probes now and then so acceptance estimates stay fresh. */
#ifndef DFL_POLICY_H
#define DFL_POLICY_H

enum { DFL_POLICY_MAX = 64 };

typedef struct dfl_costs {
    int max_block;
    double t_round[DFL_POLICY_MAX + 1]; /* seconds per round of block B (verify + draft + rest);
                                           [1] is one classic step; 0 = not measured */
} dfl_costs;

typedef struct dfl_policy {
    const dfl_costs *costs;             /* shared by an engine's sessions */
    int max_block;
    double tries[DFL_POLICY_MAX];       /* drafts seen at position i (0-based) ... */
    double hits[DFL_POLICY_MAX];        /* ... and accepted, given all before accepted */
    int classic_run;                    /* classic steps since the last speculative round */
    int reprobe_every;                  /* classic steps between probes: grows after each
                                           probe that does not win speculation back */
    int probing;                        /* the round just chosen is such a probe */
    int probe_block;                    /* a probe's block: wide enough to test several
                                           positions, not the whole drafter block */
} dfl_policy;

enum { DFL_REPROBE_MIN = 16, DFL_REPROBE_MAX = 1024 };
/* Per observed round, old evidence is weighted down by this factor, so the
 * estimates follow a text whose predictability changes (about the last 200
 * rounds count). */
#define DFL_POLICY_DECAY 0.995
/* Weight, in rounds, of the pooled acceptance rate in each position's estimate. */
#define DFL_POLICY_PRIOR 4.0

void dfl_costs_init(dfl_costs *c, int max_block);
/* Folds a measured round time into the table (moving average). */
void dfl_costs_update(dfl_costs *c, int B, double seconds);
/* Cost of block B: measured, else interpolated linearly between measured sizes. */
double dfl_costs_get(const dfl_costs *c, int B);

void dfl_policy_init(dfl_policy *p, const dfl_costs *c, int max_block);
/* Records a round: B-1 drafts proposed, the first `accepted` of them accepted. */
void dfl_policy_observe(dfl_policy *p, int B, int accepted);
/* Probability that draft position i (0-based) is accepted given all before
 * were: its own evidence, shrunk towards the rate pooled over positions. */
double dfl_policy_accept_p(const dfl_policy *p, int i);
/* Expected tokens committed by a round of block B (the bonus counts). */
double dfl_policy_expected(const dfl_policy *p, int B);
/* The block size for the next round (1 = classic decode step). */
int dfl_policy_choose(dfl_policy *p);
/* Tells the policy a classic step was taken. */
void dfl_policy_classic_step(dfl_policy *p);

#endif
