/* bench.c - the core side of `dflash bench`: machine limits, timed forwards
 * at a given context and block, and the replay A/B (speculation at a known
 * acceptance, see replay.c). The CLI never sees tensors; these do. */
#include <string.h>

#include "engine.h"
#include "kernels/machine.h"
#include "sample/sample.h"
#include "decode/decode.h"

double dfl_bench_read_bw(const dfl_engine *e, size_t bytes, int reps) {
    return dfl_machine_read_bw(e->pool, bytes, reps);
}

double dfl_bench_fma_peak(const dfl_engine *e) { return dfl_machine_fma_peak(e->pool, 0); }

static double mat_flops(const dfl_mat *m) { return 2.0 * m->rows * m->cols; }

double dfl_bench_row_flops(const dfl_engine *e) {
    const dfl_target *t = e->t;
    if (!t) return 0;
    double f = mat_flops(&t->lm_head);
    for (int l = 0; l < t->c.n_layers; l++) {
        const dfl_layer *L = &t->layers[l];
        f += mat_flops(&L->wq) + mat_flops(&L->wk) + mat_flops(&L->wv) + mat_flops(&L->wo) +
             mat_flops(&L->w_gate) + mat_flops(&L->w_up) + mat_flops(&L->w_down);
    }
    return f;
}

/* ---- timed forwards ------------------------------------------------------- */

/* Placeholder K/V for rows [kv->len, n): small values, so softmax stays
 * finite and every page is touched as real rows would be. hist gets -1 so
 * no prompt ever reuses them. Recurrent layers keep their state (its size
 * does not depend on the rows). */
static void fill_cache(dfl_session *s, int n) {
    dfl_kv *kv = s->kv;
    float *k = xmalloc(sizeof(float) * 2 * (size_t)kv->kv_dim), *v = k + kv->kv_dim;
    for (int l = 0; l < kv->n_layers; l++)
        for (int r = kv->len; r < n && kv->layer[l].kind != DFL_LAYER_RECURRENT; r++) {
            for (int i = 0; i < kv->kv_dim; i++) {
                k[i] = 0.01f * (float)((r * 7 + i * 3) % 17) - 0.08f;
                v[i] = 0.01f * (float)((r * 5 + i) % 13) - 0.06f;
            }
            dfl_kv_store(kv, l, r, k, v);
        }
    free(k);
    for (int r = kv->len; r < n; r++) s->hist[r] = -1;
    kv->len = n;
}

void dfl_bench_moe(const dfl_session *s, uint64_t *experts, uint64_t *bytes) {
    *experts = s->e->t->moe_touched;
    *bytes = s->e->t->moe_bytes;
}

int dfl_bench_forward(dfl_session *s, int ctx, int B, int flags, int reps, double *seconds,
                      dfl_error *err) {
    dfl_engine *e = s->e;
    dfl_target *t = e->t;
    int cap_rows = (flags & DFL_BENCH_LOGITS) ? e->max_block : t->max_rows;
    if (cap_rows > t->max_rows) cap_rows = t->max_rows;
    if (B < 1 || B > cap_rows)
        return dfl_fail(err, DFL_EARG, "bench forward: %d rows outside 1..%d", B, cap_rows);
    if (ctx < 0 || ctx + B > s->kv->cap)
        return dfl_fail(err, DFL_EARG, "bench forward: context %d + %d rows does not fit the "
                        "cache of %d (raise --ctx-size)", ctx, B, s->kv->cap);
    if ((flags & DFL_BENCH_CAPTURE) && !e->d)
        return dfl_fail(err, DFL_EARG, "bench forward: capture needs a drafter");
    if (reps < 1) reps = 1;
    if (s->ds) dfl_dstore_truncate(s->ds, 0);   /* the placeholder rows have no features */
    if (s->mts) dfl_dstore_truncate(s->mts, 0);
    if (s->kv->len > ctx) dfl_kv_truncate(s->kv, ctx);
    fill_cache(s, ctx);
    int32_t tok[DFL_MAX_BLOCK];
    for (int i = 0; i < B; i++) tok[i] = (int32_t)((7919u * (ctx + i + 1)) % (unsigned)t->c.vocab);
    float *logits = (flags & DFL_BENCH_LOGITS) ? s->logits : NULL;
    int n_cap = (flags & DFL_BENCH_CAPTURE) ? e->d->n_cap : 0;
    double best = 0;
    for (int r = 0; r <= reps; r++) {
        double t0 = dfl_now();
        int rc = dfl_target_forward(t, s->kv, tok, B, logits ? 0 : B, logits,
                                    n_cap ? e->d->cap : NULL, n_cap, s->feat, err);
        double dt = dfl_now() - t0;
        dfl_kv_truncate(s->kv, ctx);
        if (rc) return rc;
        if (r > 0 && (best == 0 || dt < best)) best = dt;   /* r = 0 warms up */
    }
    *seconds = best;
    return 0;
}

/* ---- replay A/B -------------------------------------------------------------- */

typedef struct collect {
    int32_t *ids;
    int n, cap;
} collect;

static int on_token(void *ud, const dfl_token_info *ti) {
    collect *c = ud;
    if (c->n < c->cap) c->ids[c->n] = ti->id;
    c->n++;
    return 0;
}

static int replay_check(const dfl_engine *e, const dfl_session *s, int n_prompt, int n_ref,
                        const dfl_bench_replay_opts *o, dfl_error *err) {
    if (o->block < 0 || o->block > DFL_MAX_BLOCK)
        return dfl_fail(err, DFL_EARG, "replay: block %d outside 0 (adaptive) .. %d", o->block,
                        DFL_MAX_BLOCK);
    if (o->block != 1 && (!e->d || !s->ds))
        return dfl_fail(err, DFL_EARG, "replay: speculation needs a drafter (--draft)");
    if (o->max_tokens < 1)
        return dfl_fail(err, DFL_EARG, "replay: max_tokens %d < 1", o->max_tokens);
    if (n_ref < o->max_tokens)
        return dfl_fail(err, DFL_EARG, "replay: %d reference tokens for %d to generate", n_ref,
                        o->max_tokens);
    if (n_prompt < 1 || n_prompt + o->max_tokens > s->kv->cap)
        return dfl_fail(err, DFL_EARG, "replay: %d prompt + %d tokens do not fit the context "
                        "of %d", n_prompt, o->max_tokens, s->kv->cap);
    if (o->n_p < 0 || o->n_p > DFL_POLICY_MAX || (o->n_p && !o->p))
        return dfl_fail(err, DFL_EARG, "replay: profile of %d positions (0..%d)", o->n_p,
                        DFL_POLICY_MAX);
    if (o->sample && o->sample->spec_accept != DFL_ACCEPT_EXACT)
        return dfl_fail(err, DFL_EARG, "replay: only the exact rule replays a fixed path "
                        "(rejection and typical: run the real drafter)");
    return 0;
}

/* The exactness gate generate.c applies, so replayed rounds run only at
 * block sizes the probe found exact. */
static int replay_gate(dfl_engine *e, const dfl_bench_replay_opts *o, dfl_stats *st,
                       dfl_error *err) {
    int bmax = o->block ? o->block : e->max_block;
    if (bmax > e->max_block) bmax = e->max_block;
    if (bmax > e->d->max_rows) bmax = e->d->max_rows;
    if (bmax > e->t->max_rows) bmax = e->t->max_rows;
    if (bmax < 2) return 0;
    int exact = 0, rc = dfl_probe_ensure(e, bmax, &exact, err);
    st->exact_checked = exact;
    return rc;
}

static int replay_run(dfl_session *s, const int32_t *prompt, int n_prompt, const int32_t *ref,
                      int n_ref, const dfl_bench_replay_opts *o, dfl_sampler *smp,
                      dfl_bench_replay_result *r, dfl_error *err) {
    dfl_engine *e = s->e;
    int rc = 0;
    int spec = o->block != 1;
    if (spec && (rc = replay_gate(e, o, &r->st, err))) return rc;
    if (!e->costs.max_block) dfl_costs_init(&e->costs, e->max_block);
    if (spec && o->block == 0) {
        double t0 = dfl_now();
        if (o->fresh_costs) dfl_costs_init(&e->costs, e->max_block);
        if ((rc = dfl_spec_calibrate(e, 0, err)) < 0) return rc;
        r->t_calibrate = dfl_now() - t0;
    }

    /* the reference by absolute position: prompt, then what classic decode made */
    int n_seq = n_prompt + n_ref;
    int32_t *seq = xmalloc((size_t)n_seq * sizeof(int32_t));
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    memcpy(seq + n_prompt, ref, (size_t)n_ref * sizeof(int32_t));
    collect out = {xmalloc((size_t)o->max_tokens * sizeof(int32_t)), 0, o->max_tokens};

    dfl_kv_truncate(s->kv, 0);
    if (s->ds) dfl_dstore_truncate(s->ds, 0);
    if (s->mts) dfl_dstore_truncate(s->mts, 0);   /* (the replay runs the drafter's lane) */
    dfl_seq q = {.t = e->t, .kv = s->kv, .hist = s->hist, .logits = s->logits,
                 .dlogits = s->dlogits, .feat = s->feat, .max_block = e->max_block};
    dfl_dflash_proposer dp;
    dfl_replay_proposer rp;
    if (spec) {
        dfl_dflash_proposer_init(&dp, e->d, s->ds);
        int n_p = o->n_p;
        double flat[DFL_POLICY_MAX];
        const double *p = o->p;
        if (!n_p) {
            n_p = e->d->block_size - 1;
            if (n_p > DFL_POLICY_MAX) n_p = DFL_POLICY_MAX;
            r->p_flat = dfl_replay_p_for_tau(o->tau, n_p);
            for (int i = 0; i < n_p; i++) flat[i] = r->p_flat;
            p = flat;
        }
        dfl_replay_proposer_init(&rp, &dp.base, seq, n_seq, e->t->c.vocab, p, n_p, o->seed);
        q.pr = &rp.base;
    }
    dfl_loop_opts lo = {.block = o->block, .costs = &e->costs, .max_tokens = o->max_tokens,
                        .exact = r->st.exact_checked == 1 ? e->probe_state : NULL};
    dfl_spec_sampling sm;
    dfl_spec_use_sampler(&lo, &sm, smp, DFL_ACCEPT_EXACT);
    int exact = r->st.exact_checked;
    rc = dfl_spec_generate(&q, &lo, prompt, n_prompt, on_token, &out, &r->st, err);
    r->st.exact_checked = exact;
    if (!rc) {
        r->n_out = out.n;
        r->matches_ref = out.n <= n_ref && !memcmp(out.ids, ref, (size_t)out.n * sizeof(int32_t));
        if (spec) r->draft_calls = rp.calls, r->forced = rp.forced;
        for (int b = 1; b <= e->costs.max_block && b <= 64; b++)   /* short runs: depth 0 */
            r->t_round[b] = e->costs.t_round[0][b];
    }
    free(seq);
    free(out.ids);
    return rc;
}

int dfl_bench_replay(dfl_session *s, const int32_t *prompt, int n_prompt, const int32_t *ref,
                     int n_ref, const dfl_bench_replay_opts *o, dfl_bench_replay_result *r,
                     dfl_error *err) {
    memset(r, 0, sizeof *r);
    int rc = replay_check(s->e, s, n_prompt, n_ref, o, err);
    if (rc) return rc;
    dfl_sampler *smp = NULL;
    if (o->sample && !dfl_gen_is_greedy(o->sample) &&
        (rc = dfl_sampler_new(o->sample, s->e->t->c.vocab, &smp, err)))
        return rc;
    rc = replay_run(s, prompt, n_prompt, ref, n_ref, o, smp, r, err);
    dfl_sampler_free(smp);
    return rc;
}
