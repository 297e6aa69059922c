/* decode.h - the round loop (speculative and classic decode), its proposer
 * seam and the acceptance rule seam.
 *
 * The loop is written once against the target (models/model.h) and a
 * proposer. Its invariants, between rounds:
 *   kv->len == proposer len == pos, the absolute position of the anchor (the
 *   newest committed token, not yet run through the target);
 *   hist[0..pos) are the tokens whose K/V sit in kv.
 * A round drafts B-1 tokens after the anchor, verifies [anchor, drafts] in one
 * target forward with feature capture, accepts a prefix, commits it plus the
 * target's own next token (the bonus), and rolls the target cache and the
 * proposer back to the committed length, feeding the proposer the features
 * of the committed rows only. B = 1 is one classic decode step. */
#ifndef DFL_DECODE_H
#define DFL_DECODE_H

#include "draft/draft.h"
#include "draft/ngram.h"
#include "models/model.h"
#include "decode/policy.h"
#include "decode/tree.h"

/* ---- the proposer seam ---------------------------------------------------- */

/* Embed it as the first member of an implementation's struct. */
typedef struct dfl_proposer dfl_proposer;
struct dfl_proposer {
    /* Appends n context rows at positions len() .. len()+n-1. feat: (n,
     * n_cap*target dim), the outputs of target layers cap[] for committed rows;
     * tok: (n) their tokens (an MTP head reads the token after each row). */
    int (*add_context)(dfl_proposer *p, const float *feat, const int32_t *tok, int n,
                       dfl_error *err);
    /* Proposes out[0..B-2] for positions pos+1 .. pos+B-1 after anchor at pos
     * (pos == len()); logits (B-1, vocab) of those rows when not NULL. */
    int (*draft)(dfl_proposer *p, int32_t anchor, int pos, int B, int32_t *out, float *logits,
                 dfl_error *err);
    void (*truncate)(dfl_proposer *p, int n_keep);
    int (*len)(const dfl_proposer *p);
    const int *cap;   /* target layers whose outputs it reads (HF ids) */
    int n_cap;
    int max_block;    /* largest B draft accepts */
    /* Seconds of drafter work charged to this sequence so far (its rows' share
     * of passes it shared with others), or NULL: the loop then charges the wall
     * time of its calls. Last, so initializers that predate it leave it NULL. */
    double (*spent)(const dfl_proposer *p);
    /* Drafts it can offer after anchor at pos (== len()) this round; 0 when
     * it has nothing worth a verify (the lane then sits the round out), or
     * NULL: max_block - 1 always. Cheap: called before the policy decides. */
    int (*offer)(dfl_proposer *p, int32_t anchor, int pos);
    /* Advances len() by n positions it never sees (a hole its later drafts
     * attend around), or NULL: it must be fed every row. */
    int (*skip)(dfl_proposer *p, int n, dfl_error *err);
};

/* The DFlash drafter behind the seam (src/decode/propose.c). */
typedef struct dfl_dflash_proposer {
    dfl_proposer base;
    dfl_drafter *d;
    dfl_dstore *s;
} dfl_dflash_proposer;

void dfl_dflash_proposer_init(dfl_dflash_proposer *p, dfl_drafter *d, dfl_dstore *s);
/* Rows of the block the proposer drafts for a verify of B rows (>= B). */
int dfl_dflash_draft_rows(const dfl_drafter *d, const dfl_dstore *s, int B);

/* The n-gram lane (prompt lookup) behind the seam (src/decode/propose.c):
 * no model and no features; the sequence's committed tokens in g. A
 * round's lookup is made once, by offer, and draft hands it out. */
typedef struct dfl_ngram_proposer {
    dfl_proposer base;
    dfl_ngram *g;
    int32_t found[DFL_NGRAM_MAX_DRAFT];   /* the last lookup's drafts ... */
    int found_pos, found_n;               /* ... anchored at found_pos (-1: none) */
    int32_t found_anchor;
} dfl_ngram_proposer;

void dfl_ngram_proposer_init(dfl_ngram_proposer *p, dfl_ngram *g);

/* ---- the acceptance seam ------------------------------------------------- */

/* Given the verify logits (B, vocab) of block = [anchor, d1 .. d_{B-1}] at
 * positions pos .. pos+B-1, returns a, the number of drafts accepted, and
 * writes tgt[0..a]: block[1..a] are committed, then tgt[a] (the bonus).
 * hist[0..pos] are the committed tokens, the anchor last (penalties);
 * dlogits the drafter's rows (B-1, vocab) or NULL. With B = 1 it is the
 * classic decode step's choice of tgt[0]. */
typedef int (*dfl_accept_fn)(void *ud, const float *logits, int vocab, const int32_t *block,
                             int B, int pos, const int32_t *hist, const float *dlogits,
                             int32_t *tgt);

/* Greedy: tgt[i] = argmax of row i; a = leading drafts with block[i] == tgt[i-1]. */
int dfl_accept_greedy(void *ud, const float *logits, int vocab, const int32_t *block, int B,
                      int pos, const int32_t *hist, const float *dlogits, int32_t *tgt);

/* ---- the loop ------------------------------------------------------------ */

/* One sequence's state, owned by the caller (a session, a test, the probe). */
typedef struct dfl_seq {
    dfl_target *t;
    dfl_kv *kv;
    int32_t *hist;        /* (kv->cap) tokens whose K/V are in kv */
    float *logits;        /* (max_block, vocab) verify logits */
    float *dlogits;       /* (max_block, vocab) drafter logits, or NULL */
    float *feat;          /* (t->max_rows, n_cap*dim) captured features, or NULL */
    int max_block;        /* rows of a chain's verify block (logits holds at least these) */
    int max_tree;         /* nodes of a draft tree: logits holds max_tree + 1 rows too (0: no
                             trees; at most dfl_target_tree_rows - 1) */
    int tree_depth;       /* a tree's deepest level: the drafter's trained block - 1 (a
                           wider block, bidirectional inside, drafts every depth worse) */
    dfl_proposer *pr;     /* NULL without a drafter; kept in step with kv even
                             when a call decodes classically */
    dfl_proposer *ng;     /* the n-gram lane, or NULL; kept in step as pr is */
    dfl_proposer *mt;     /* the MTP lane (the target's MTP head beside the drafter pr),
                             or NULL; kept in step as pr is */
    const int *cap;       /* (n_cap) target layers a verify captures for pr and mt
                             together (their union, each lane's layers among them), or
                             NULL: pr's own list */
    int n_cap;
    float *fsub;          /* (t->max_rows, the larger lane n_cap*dim) one lane's layers
                             gathered from feat rows when its list is not cap itself */
} dfl_seq;

/* A model lane's features of rows feat[0..n) captured for layers cap[0..n_cap):
 * feat itself when p reads exactly those layers in that order, else p's layers
 * gathered into buf (n, p->n_cap*dim); NULL when feat is. Every layer of p
 * must be in cap (dfl_spec_generate checks). */
const float *dfl_lane_feat(const int *cap, int n_cap, const dfl_proposer *p, const float *feat,
                           int n, int dim, float *buf);

typedef struct dfl_loop_opts {
    int block;            /* 1: classic; N >= 2: speculate with blocks of N;
                             0: adaptive (policy, up to max_block) */
    dfl_costs *costs;     /* measured round costs for the adaptive policy (shared):
                             the drafter's rounds and classic steps */
    dfl_costs *costs_ngram; /* the same for the n-gram lane's rounds (no drafter pass) */
    dfl_costs *costs_mtp; /* the same for the MTP lane's rounds */
    dfl_accept_fn accept; /* NULL: greedy */
    void *accept_ud;
    int need_dlogits;     /* the rule reads drafter logits */
    int (*is_stop)(void *ud, int32_t id);   /* NULL: none */
    void *stop_ud;
    int max_tokens;
    int n_top_logprobs;   /* 0..DFL_MAX_TOP_LOGPROBS */
    int no_logprob;       /* 1: no logprob either (unless top-k are asked for) */
    /* Drafts for rules that need them sampled (rejection), or NULL: rewrites
     * draft[0..n) from the drafter rows, hist[0..pos] committed (anchor last). */
    void (*redraft)(void *ud, const float *dlogits, int n, const int32_t *hist, int pos,
                    int32_t *draft);
    const int *exact;     /* [b]: 1 when the probe found block size b exact;
                             other sizes run as classic steps. NULL: all allowed */
    dfl_policy *carry;    /* NULL, or acceptance evidence from earlier calls: the policy
                             starts from it and leaves this call's in it (a server's
                             requests are alike; each would otherwise learn from the prior) */
    dfl_policy *carry_ngram; /* the same for the n-gram lane */
    dfl_policy *carry_mtp;   /* the same for the MTP lane */
    /* Draft trees (DDTree) on the drafter's rounds: -1 the policy picks chain or a
     * budget each round, 0 the chain always, N > 0 trees of N nodes (at most
     * q->max_tree). Trees run greedy, or sampled when choose is set. */
    int tree_budget;
    /* The target's token at position n_hist from its row, history hist[0..n_hist)
     * (a rule that is exact along a tree: the keyed sample); NULL: argmax. With a
     * sampled accept rule and no choose, every round is a chain. */
    int32_t (*choose)(void *ud, const float *row, const int32_t *hist, int n_hist);
    dfl_costs *costs_tree; /* measured tree round costs by rows (N + 1), or NULL */
    dfl_tree_policy *carry_tree; /* NULL, or the tree policy's evidence from earlier calls,
                                    as carry (else each call starts with a probe tree) */
    dfl_gate *gate;       /* NULL, or the engine's crowd gate: adaptive rounds (block 0,
                             trees not pinned) speculate only while it is open */
    /* [DFL_LANES]: the lanes' round costs while other sequences share the forward
     * (their rows' marginal share of it), kept apart from costs, costs_ngram and
     * costs_mtp (a round's whole time alone); NULL: this call's own tables. One
     * table of both had a crowd's classic step at its marginal 1.7 ms beside
     * blocks last timed alone (35 ms for 4), so no block ever looked worth its
     * rows among others; and a request left alone priced its steps at 1.7 ms
     * for the 27 steps the clamp took to climb back (a 0.6B Q8_0, Zen 4). */
    dfl_costs *crowd_costs;
} dfl_loop_opts;

/* A request's sampler behind the acceptance seam (generate.c): sets o's
 * accept (and, for the rejection rule at temperature > 0, redraft and
 * need_dlogits) to use s with rule DFL_ACCEPT_*; s NULL leaves o greedy.
 * sm, which o then points to, counts what the rule reports. */
typedef struct dfl_spec_sampling {
    struct dfl_sampler *s;
    uint64_t lossy, resampled;   /* typical: kept by the threshold; rejection: residual draws */
} dfl_spec_sampling;
void dfl_spec_use_sampler(dfl_loop_opts *o, dfl_spec_sampling *sm, struct dfl_sampler *s,
                          int rule);
/* Plain argmax decoding: no temperature, penalties or biases. */
int dfl_gen_is_greedy(const dfl_gen_params *p);

/* Generates after prompt, reusing the longest common prefix of prompt with
 * hist (what kv holds). cb gets every committed token in order; it returning
 * nonzero stops generation (st->stop = DFL_STOP_CANCEL, and 0 is returned).
 * st is added to (callers zero it); st->stop says why generation ended. */
int dfl_spec_generate(dfl_seq *q, const dfl_loop_opts *o, const int32_t *prompt, int n_prompt,
                      dfl_token_fn cb, void *ud, dfl_stats *st, dfl_error *err);

/* Runs rows tok[0..n) through the target in chunks that fit q->feat,
 * feeding the proposer their features when feed is set. */
int dfl_spec_prefill(dfl_seq *q, const int32_t *tok, int n, int feed, dfl_error *err);

/* ==== the benchmarks' replay proposer (src/decode/replay.c; owned
 * by the bench work, kept apart from the loop's contracts above) ========= */

/* The replay proposer (replay.c): runs the real proposer `inner` on every
 * call, so a round costs what a real one does, but proposes the reference
 * path ref[] (tokens by absolute position: the prompt, then the classic
 * decode of the same request) with forced accept lengths: a round anchored
 * at pos gets k(pos) drafts equal to the reference, then a wrong one, so it
 * accepts min(k(pos), B-1). k(pos) counts leading successes of independent
 * draws with P(draft i accepted | all before) = p[i], i < n_p, keyed by
 * (seed, pos): every mode and block size replays the same acceptance. Drafts
 * past n_ref keep the inner proposer's tokens. */
typedef struct dfl_replay_proposer {
    dfl_proposer base;
    dfl_proposer *inner;
    const int32_t *ref;          /* (n_ref) reference tokens by position */
    int n_ref, vocab;
    double p[DFL_POLICY_MAX];    /* per-position acceptance, (n_p) */
    int n_p;
    uint64_t seed;
    uint64_t calls, forced;      /* draft calls; sum of min(k, B-1) over them */
} dfl_replay_proposer;

void dfl_replay_proposer_init(dfl_replay_proposer *r, dfl_proposer *inner, const int32_t *ref,
                              int n_ref, int vocab, const double *p, int n_p, uint64_t seed);
/* k(pos): drafts the round anchored at pos gets right (0..n_p). */
int dfl_replay_accept_len(const dfl_replay_proposer *r, int pos);
/* A flat profile (p at every one of n_drafts positions): tau = 1 + p + p^2
 * + ... + p^n_drafts committed tokens per round, and its inverse. */
double dfl_replay_tau(double p, int n_drafts);
double dfl_replay_p_for_tau(double tau, int n_drafts);

#endif
