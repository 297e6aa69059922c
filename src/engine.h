/* engine.h - what sits behind the opaque dfl_engine and dfl_session. */
#ifndef DFL_ENGINE_H
#define DFL_ENGINE_H

#include "dflash.h"
#include "draft/draft.h"
#include "models/model.h"
#include "spec/policy.h"
#include "tokenizer/tokenizer.h"

struct dfl_engine {
    dfl_engine_opts opts;
    dfl_target *t;
    dfl_drafter *d;          /* NULL without --draft */
    dfl_tokenizer *tok;
    dfl_pool *pool;
    int ctx_size;            /* per session */
    int max_block;           /* largest verify block */
    int probe_state[513];    /* exactness per block size: 0 unknown, 1 exact, -1 not */
    pthread_mutex_t mu;      /* guards the memo below (probe_state, costs) across sessions */
    dfl_costs costs;         /* measured round time per block size (adaptive policy) */
};

struct dfl_session {
    dfl_engine *e;
    dfl_kv *kv;              /* target cache */
    dfl_dstore *ds;          /* drafter side store (NULL without drafter) */
    int32_t *hist;           /* (ctx_size) tokens whose K/V are in kv, in order */
    float *logits;           /* (max_block, vocab) */
    float *dlogits;          /* (max_block, vocab) drafter rows */
    float *feat;             /* (max_rows, n_cap*dim) captured features */
};

#endif
