/* generate.c - dfl_generate: picks classic or speculative decoding for a
 * request, gates speculation on the exactness probe, and runs the loop. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "sample/sample.h"
#include "decode/decode.h"

typedef struct stopper {
    const dfl_engine *e;
    const dfl_gen_params *p;
} stopper;

static int is_stop(void *ud, int32_t id) {
    const stopper *s = ud;
    for (int i = 0; i < s->p->n_stop_ids; i++)
        if (s->p->stop_ids[i] == id) return 1;
    if (s->p->ignore_eos) return 0;
    if (s->e->tok) return dfl_tok_is_eog(s->e->tok, id);
    return id == s->e->t->c.eos_id;
}

/* The sampler's rules behind the acceptance seam, counting what a rule
 * reports beyond the accept length. */
static int accept_sampled(void *ud, const float *logits, int vocab, const int32_t *block, int B,
                          int pos, const int32_t *hist, const float *dlogits, int32_t *tgt) {
    (void)vocab;
    dfl_spec_sampling *sm = ud;
    if (B == 1) {
        tgt[0] = dfl_sample(sm->s, logits, hist, pos + 1);
        return 0;
    }
    dfl_accept_result r;
    dfl_accept(sm->s, logits, B, block + 1, dlogits, hist, pos + 1, &r);
    for (int i = 0; i < r.n_accepted; i++) tgt[i] = block[i + 1];
    tgt[r.n_accepted] = r.next;
    sm->lossy += (uint64_t)r.n_lossy;
    sm->resampled += (uint64_t)r.resampled;
    return r.n_accepted;
}

/* The keyed sample of a tree node's row (the exact rule along a tree). */
static int32_t choose_sampled(void *ud, const float *row, const int32_t *hist, int n_hist) {
    return dfl_sample(((dfl_spec_sampling *)ud)->s, row, hist, n_hist);
}

static void redraft_sampled(void *ud, const float *dlogits, int n, const int32_t *hist, int pos,
                            int32_t *draft) {
    dfl_sample_drafts(((dfl_spec_sampling *)ud)->s, dlogits, n, hist, pos + 1, draft);
}

static void redraft_format(void *ud, const float *dlogits, int n, const int32_t *hist, int pos,
                           int32_t *draft) {
    dfl_sample_drafts_format(((dfl_spec_sampling *)ud)->s, dlogits, n, hist, pos + 1, draft);
}

void dfl_spec_use_sampler(dfl_loop_opts *o, dfl_spec_sampling *sm, dfl_sampler *s, int rule) {
    *sm = (dfl_spec_sampling){s, 0, 0};
    if (!s) return;
    o->accept = accept_sampled;
    o->accept_ud = sm;
    /* along a tree only the exact rule stays lossless (and a format's mask is
     * the chain's alone): other rules keep the chain */
    if ((rule == DFL_ACCEPT_EXACT || !(s->temperature > 0)) && !s->fmt)
        o->choose = choose_sampled;
    if (s->temperature > 0 && rule == DFL_ACCEPT_REJECTION)   /* drafts drawn, masked too */
        o->need_dlogits = 1, o->redraft = redraft_sampled;
    else if (s->fmt)
        o->need_dlogits = 1, o->redraft = redraft_format;
}

const char *dfl_lane_name(int lane) {
    return lane == DFL_LANE_NGRAM ? "ngram" : lane == DFL_LANE_DRAFTER ? "drafter"
           : lane == DFL_LANE_MTP ? "mtp" : "?";
}

int dfl_gen_is_greedy(const dfl_gen_params *p) {
    return p->temperature <= 0 && p->repeat_penalty == 1.0f && p->presence_penalty == 0 &&
           p->frequency_penalty == 0 && p->n_bias == 0 && !p->format;
}

static int check_params(const dfl_gen_params *p, dfl_error *err) {
    if (p->max_tokens < 0) return dfl_fail(err, DFL_EARG, "max_tokens %d < 0", p->max_tokens);
    if (p->block_size < 0 || p->block_size > DFL_MAX_BLOCK)
        return dfl_fail(err, DFL_EARG, "block size %d outside 0 (auto) .. %d", p->block_size,
                        DFL_MAX_BLOCK);
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids))
        return dfl_fail(err, DFL_EARG, "stop ids: %d given without an array", p->n_stop_ids);
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > DFL_MAX_TOP_LOGPROBS)
        return dfl_fail(err, DFL_EARG, "top logprobs %d outside 0..%d", p->n_top_logprobs,
                        DFL_MAX_TOP_LOGPROBS);
    if (p->tree_budget < -1 || p->tree_budget > DFL_MAX_TREE)
        return dfl_fail(err, DFL_EARG, "tree budget %d outside -1 (auto), 0 (chain) .. %d",
                        p->tree_budget, DFL_MAX_TREE);
    if (p->replay_ref && (p->n_replay_ref < 1 || !(p->replay_tau >= 1)))
        return dfl_fail(err, DFL_EARG, "replay: %d reference tokens at tau %g (need >= 1, >= 1)",
                        p->n_replay_ref, p->replay_tau);
    return 0;
}

static void note(dfl_stats *st, const char *msg) {
    size_t l = strlen(st->note);
    snprintf(st->note + l, sizeof st->note - l, "%s%s", l ? "; " : "", msg);
}

/* The largest verify block a request of block setting want (0: the engine's)
 * can have: what the target's buffers hold, and the drafter's when it drafts. */
static int spec_bmax(const dfl_engine *e, int want, int drafts, dfl_stats *st) {
    int bmax = want ? want : e->max_block;
    if (bmax > e->max_block) {
        if (st) note(st, "block size capped at the engine's max block");
        bmax = e->max_block;
    }
    if (drafts && bmax > e->d->max_rows) bmax = e->d->max_rows;
    if (bmax > e->t->max_rows) bmax = e->t->max_rows;
    return bmax;
}

int dfl_engine_prepare(dfl_engine *e, int *exact, dfl_error *err) {
    *exact = 0;
    if (!e->t || (!e->d && !e->opts.ngram)) return 0;
    int bmax = spec_bmax(e, 0, e->d != NULL, NULL);
    if (bmax < 2) return 0;
    pthread_mutex_lock(&e->mu);
    int rc = dfl_probe_ensure(e, bmax, exact, err);
    if (!rc && *exact == 1) rc = dfl_spec_calibrate(e, 0, err);
    pthread_mutex_unlock(&e->mu);
    return rc < 0 ? rc : 0;
}

/* The loop's block setting for this request: 1 (classic) whenever
 * speculation cannot be both exact and useful. */
static int pick_mode(dfl_session *s, const dfl_gen_params *p, dfl_stats *st, dfl_error *err) {
    dfl_engine *e = s->e;
    if ((!e->d || !s->ds) && !s->ng) {
        if (p->block_size > 1) note(st, "no drafter loaded: classic decode");
        return 1;
    }
    if (p->block_size == 1) return 1;
    if (p->spec_accept != DFL_ACCEPT_EXACT && !(p->temperature > 0))
        note(st, "greedy decoding: the exact acceptance rule is used");
    int bmax = spec_bmax(e, p->block_size, e->d && s->ds, st);
    if (bmax < 2) return 1;
    int exact = 0;
    pthread_mutex_lock(&e->mu);
    int rc = dfl_probe_ensure(e, bmax, &exact, err);
    pthread_mutex_unlock(&e->mu);
    if (rc) return rc;
    st->exact_checked = exact;
    if (exact < 0) {
        if (e->opts.allow_inexact) {
            note(st, "the probe found the verify path inexact; DFLASH_ALLOW_INEXACT=1 keeps "
                     "speculation on (output may differ from classic decode)");
            return p->block_size ? bmax : 0;
        }
        note(st, "the probe found the verify path inexact (dflash probe shows where): "
                 "classic decode; DFLASH_ALLOW_INEXACT=1 overrides");
        return 1;
    }
    return p->block_size ? bmax : 0;
}

/* The replay proposer over dp for p->replay_ref (*path: the prompt and the
 * reference by position, freed by the caller). */
static dfl_proposer *replay(dfl_replay_proposer *rp, dfl_dflash_proposer *dp, const dfl_engine *e,
                            const int32_t *prompt, int n_prompt, const dfl_gen_params *p,
                            int32_t **path) {
    int n = n_prompt + p->n_replay_ref;
    *path = xmalloc((size_t)n * sizeof(int32_t));
    memcpy(*path, prompt, (size_t)n_prompt * sizeof(int32_t));
    memcpy(*path + n_prompt, p->replay_ref, (size_t)p->n_replay_ref * sizeof(int32_t));
    double flat[DFL_POLICY_MAX];
    int n_p = e->d->block_size - 1 < DFL_POLICY_MAX ? e->d->block_size - 1 : DFL_POLICY_MAX;
    for (int i = 0; i < n_p; i++) flat[i] = dfl_replay_p_for_tau(p->replay_tau, n_p);
    dfl_replay_proposer_init(rp, &dp->base, *path, n, e->t->c.vocab, flat, n_p, p->seed);
    return &rp->base;
}

int dfl_generate(dfl_session *s, const int32_t *prompt, int n_prompt, const dfl_gen_params *p,
                 dfl_token_fn cb, void *ud, dfl_stats *st, dfl_error *err) {
    dfl_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    dfl_gen_params defaults;
    if (!p) dfl_gen_params_default(&defaults), p = &defaults;
    int rc = check_params(p, err);
    if (rc) return rc;
    if (!prompt && n_prompt) return dfl_fail(err, DFL_EARG, "prompt ids missing");
    dfl_engine *e = s->e;
    dfl_target *t = e->t;

    dfl_sampler *smp = NULL;
    if (!dfl_gen_is_greedy(p) && (rc = dfl_sampler_new(p, t->c.vocab, &smp, err))) return rc;
    if (smp) dfl_sampler_set_format(smp, p->format, n_prompt);
    int block = pick_mode(s, p, st, err);
    if (block < 0) {
        dfl_sampler_free(smp);
        return block;
    }

    dfl_seq q = {.t = t, .kv = s->kv, .hist = s->hist, .logits = s->logits,
                 .dlogits = s->dlogits, .feat = s->feat, .max_block = e->max_block,
                 .max_tree = e->max_tree, .tree_depth = e->d ? e->d->block_size - 1 : 0};
    dfl_dflash_proposer dp, mp;
    dfl_replay_proposer rp;
    dfl_ngram_proposer np;
    int32_t *path = NULL;
    if (e->d && s->ds) {
        dfl_dflash_proposer_init(&dp, e->d, s->ds);
        if (dp.base.max_block > dfl_engine_draft_block(e))
            dp.base.max_block = dfl_engine_draft_block(e);
        q.pr = &dp.base;
        if (p->replay_ref && !smp) q.pr = replay(&rp, &dp, e, prompt, n_prompt, p, &path);
    }
    /* (a replay measures the drafter alone: the other lanes' stores start over) */
    if (s->ng && !path) {
        dfl_ngram_proposer_init(&np, s->ng);
        q.ng = &np.base;
    } else if (s->ng) {
        s->ng->len = 0;
    }
    if (e->mtp && s->mts && !path) {   /* the head beside the drafter: the union's features */
        dfl_dflash_proposer_init(&mp, e->mtp, s->mts);
        if (mp.base.max_block > dfl_engine_lane_block(e, e->mtp))
            mp.base.max_block = dfl_engine_lane_block(e, e->mtp);
        q.mt = &mp.base;
        q.cap = e->cap, q.n_cap = e->n_cap, q.fsub = s->fsub;
    } else if (s->mts) {
        dfl_dstore_truncate(s->mts, 0);
    }
    pthread_mutex_lock(&e->mu);
    if (!e->costs.max_block) dfl_costs_init(&e->costs, e->max_block);
    if (!e->costs_ngram.max_block) dfl_costs_init(&e->costs_ngram, e->max_block);
    if (!e->costs_mtp.max_block) dfl_costs_init(&e->costs_mtp, e->max_block);
    if (!e->costs_tree.max_block) dfl_costs_init(&e->costs_tree, DFL_MAX_TREE + 1);
    for (int l = 0; l < DFL_LANES; l++)
        if (!e->crowd_costs[l].max_block) dfl_costs_init(&e->crowd_costs[l], e->max_block);
    /* adaptive: round costs measured once per engine before the first round */
    if (block == 0 && (q.pr || q.ng || q.mt)) rc = dfl_spec_calibrate(e, 0, err);
    pthread_mutex_unlock(&e->mu);
    if (rc < 0) {
        dfl_sampler_free(smp);
        return rc;
    }
    stopper sp = {e, p};
    dfl_loop_opts o = {.block = block, .is_stop = is_stop, .stop_ud = &sp,
                       .max_tokens = p->max_tokens, .n_top_logprobs = p->n_top_logprobs,
                       .no_logprob = p->no_logprob, .costs = &e->costs,
                       .costs_ngram = &e->costs_ngram, .costs_mtp = &e->costs_mtp,
                       .exact = st->exact_checked == 1 ? e->probe_state : NULL,
                       .tree_budget = path ? 0 : p->tree_budget, .costs_tree = &e->costs_tree,
                       .gate = &e->gate, .crowd_costs = e->crowd_costs};
    dfl_spec_sampling sm;
    dfl_spec_use_sampler(&o, &sm, smp, p->spec_accept);
    /* greedy requests start from what earlier ones learned of the acceptance */
    dfl_policy carry, carry_ng, carry_mtp, *kept = path ? &e->carry_replay : &e->carry;
    dfl_tree_policy carry_tree;
    int carried = !smp;
    if (carried) {
        pthread_mutex_lock(&e->mu);
        carry = *kept;
        carry_ng = e->carry_ngram;
        carry_mtp = e->carry_mtp;
        carry_tree = e->carry_tree;
        pthread_mutex_unlock(&e->mu);
        o.carry = &carry;
        o.carry_ngram = &carry_ng;
        o.carry_mtp = &carry_mtp;
        o.carry_tree = &carry_tree;
    }
    rc = dfl_spec_generate(&q, &o, prompt, n_prompt, cb, ud, st, err);
    if (carried) {   /* (a pinned block's or tree budget's copies are unchanged: written
                        back, they undid what the adaptive requests beside it learned
                        meanwhile; the loop updates them under these same conditions) */
        pthread_mutex_lock(&e->mu);
        if (carry.max_block && block == 0) *kept = carry;
        if (carry_ng.max_block && block == 0) e->carry_ngram = carry_ng;
        if (carry_mtp.max_block && block == 0) e->carry_mtp = carry_mtp;
        if (carry_tree.max_budget && o.tree_budget < 0) e->carry_tree = carry_tree;
        pthread_mutex_unlock(&e->mu);
    }
    st->accept_rule = smp && smp->temperature > 0 ? p->spec_accept : DFL_ACCEPT_EXACT;
    st->accepted_lossy += sm.lossy;
    st->resampled += sm.resampled;
    dfl_sampler_free(smp);
    free(path);
    return rc;
}
