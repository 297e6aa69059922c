/* engine.h - the api layer (src/api/, the implementation of include/dflash.h):
 * what sits behind the opaque dfl_engine and dfl_session, and the
 * engine-level helpers its files share. */
#ifndef DFL_ENGINE_H
#define DFL_ENGINE_H

#include "dflash.h"
#include "decode/decode.h"
#include "decode/policy.h"
#include "draft/draft.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

struct dfl_engine {
    dfl_engine_opts opts;
    dfl_target *t;
    dfl_drafter *d;          /* NULL without --draft (or --draft-mtp alone: the head) */
    dfl_drafter *mtp;        /* the MTP head as a lane beside d (--draft and --draft-mtp),
                                or NULL */
    int cap[DFL_MAX_CAPTURE_LAYERS]; /* (n_cap) target layers a verify captures: d's,
                                then the MTP lane's last layer when d does not read it */
    int n_cap;
    dfl_tokenizer *tok;
    dfl_pool *pool;
    int ctx_size;            /* per session */
    int max_block;           /* largest verify block */
    int probe_state[DFL_MAX_BLOCK + 1]; /* exactness per block size: 0 unknown, 1 exact, -1 not */
    pthread_mutex_t mu;      /* guards the memo below (probe_state, costs) across sessions */
    dfl_costs costs;         /* measured round time per block size (adaptive policy) */
    dfl_costs costs_ngram;   /* the same for the n-gram lane's rounds (no drafter pass) */
    dfl_costs costs_mtp;     /* the same for the MTP lane's rounds */
    dfl_costs costs_tree;    /* measured draft tree rounds by rows (nodes + 1) */
    dfl_costs crowd_costs[DFL_LANES]; /* the lanes' rounds among other sequences' rows
                                (dfl_loop_opts.crowd_costs) */
    dfl_gate gate;           /* speculation allowed in a crowd only while it measures ahead */
    int max_tree;            /* nodes a session's draft tree may have (0: no trees) */
    dfl_policy carry;        /* greedy requests' acceptance evidence, handed from one
                                request to the next (dfl_loop_opts.carry) */
    dfl_policy carry_replay; /* the same for replayed requests (benchmarks): their
                                acceptance is the replay's, not the drafter's */
    dfl_policy carry_ngram;  /* the n-gram lane's evidence, as carry */
    dfl_policy carry_mtp;    /* the MTP lane's evidence, as carry */
    dfl_tree_policy carry_tree; /* the tree policy's evidence, as carry */
    struct dfl_fmt_vocab *fmt_vocab; /* the vocabulary sorted for structured output,
                                        made by the first dfl_format_new (under mu) */
};

struct dfl_session {
    dfl_engine *e;
    dfl_kv *kv;              /* target cache */
    dfl_dstore *ds;          /* drafter side store (NULL without drafter) */
    dfl_dstore *mts;         /* the MTP lane's store (NULL without e->mtp) */
    int32_t *hist;           /* (ctx_size) tokens whose K/V are in kv, in order */
    float *logits;           /* (max_block, vocab) */
    float *dlogits;          /* (max_block, vocab) drafter rows */
    float *feat;             /* (max_rows, e->n_cap*dim) captured features */
    float *fsub;             /* (max_rows, the larger lane n_cap*dim) one lane's layers out
                                of feat (NULL without e->mtp) */
    dfl_ngram *ng;           /* the n-gram lane's history (NULL without opts.ngram) */
};

/* The drafter lane's largest block: the drafter's trained block unless
 * max_block was given (the engine's max_block may be larger, for the
 * n-gram lane). */
int dfl_engine_draft_block(const dfl_engine *e);
/* The same for the lane of drafter d (e->d or e->mtp). */
int dfl_engine_lane_block(const dfl_engine *e, const dfl_drafter *d);

/* ---- the exactness probe (probe.c) ---------------------------------------- */

/* Runs ids[0..n-1) then, one row at a time, the anchor ids[n-1] and its
 * greedy continuation (B rows); then the same B rows as one block, and every
 * smaller block 2..B-1, comparing logits (and the features of target layers
 * fcap[], when given) bit for bit. state[b] (b = 2..B) gets 1 exact or -1
 * not; r describes block B. json: the report (may be NULL). Uses a private
 * cache of n + B rows. */
int dfl_probe_target(dfl_target *t, const int32_t *ids, int n, int B, const int *fcap,
                     int n_fcap, dfl_probe_result *r, int *state, char *json, size_t cap,
                     dfl_error *err);

/* The engine's memo: probes block sizes 2..bmax once per engine (on a fixed
 * short prompt) unless already known; *exact = 1 when all are exact, else -1. */
int dfl_probe_ensure(dfl_engine *e, int bmax, int *exact, dfl_error *err);

/* Start-up costs (calibrate.c): on an engine with a drafter, times one
 * zero-acceptance round -- draft, verify forward with capture, greedy
 * acceptance, rollback, one row into the side store -- for block sizes 1,
 * 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 up to bmax (capped by the engine's
 * max block and forward sizes) whose cost is not known yet, on a private
 * short cache, and seeds e->costs with the best of two. Cheap when nothing
 * is missing; the loop keeps the table current afterwards. Returns the
 * number of sizes measured, or < 0 on error. */
int dfl_spec_calibrate(dfl_engine *e, int bmax, dfl_error *err);

#endif
