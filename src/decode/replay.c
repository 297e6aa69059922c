/* replay.c - the replay proposer: speed at a known acceptance, measured
 * honestly. It runs the real drafter on every call (so the round pays the
 * real drafter forward, lm_head rows and side-store updates) but throws its
 * tokens away and proposes the reference path instead -- the classic decode
 * of the same request -- right for the first k(pos) drafts and wrong at
 * draft k(pos). k(pos) is drawn once per anchor position from a profile of
 * per-position acceptance probabilities, keyed by (seed, pos), so every
 * block size and mode replays the same "text": a round of block B anchored
 * at pos accepts exactly min(k(pos), B-1) drafts. Exact verification keeps
 * the committed path equal to the reference, which the caller checks. */
#include <math.h>
#include <string.h>

#include "decode/decode.h"

static dfl_replay_proposer *self(dfl_proposer *p) { return (dfl_replay_proposer *)p; }

static int add_context(dfl_proposer *p, const float *feat, const int32_t *tok, int n,
                       dfl_error *err) {
    dfl_proposer *in = self(p)->inner;
    return in->add_context(in, feat, tok, n, err);
}

static void truncate_to(dfl_proposer *p, int n_keep) {
    dfl_proposer *in = self(p)->inner;
    in->truncate(in, n_keep);
}

static int len(const dfl_proposer *p) {
    const dfl_proposer *in = ((const dfl_replay_proposer *)p)->inner;
    return in->len(in);
}

static double spent(const dfl_proposer *p) {
    const dfl_proposer *in = ((const dfl_replay_proposer *)p)->inner;
    return in->spent(in);
}

static int skip(dfl_proposer *p, int n, dfl_error *err) {
    dfl_proposer *in = self(p)->inner;
    return in->skip(in, n, err);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int dfl_replay_accept_len(const dfl_replay_proposer *r, int pos) {
    uint64_t s = r->seed ^ ((uint64_t)(uint32_t)pos * 0xd1b54a32d192ed03ull);
    int k = 0;
    while (k < r->n_p) {
        double u = (double)(splitmix64(&s) >> 11) * 0x1p-53;
        if (u >= r->p[k]) break;
        k++;
    }
    return k;
}

static int draft(dfl_proposer *p, int32_t anchor, int pos, int B, int32_t *out, float *logits,
                 dfl_error *err) {
    dfl_replay_proposer *r = self(p);
    int rc = r->inner->draft(r->inner, anchor, pos, B, out, logits, err);
    if (rc) return rc;
    int k = dfl_replay_accept_len(r, pos);
    for (int i = 0; i < B - 1; i++) {
        int at = pos + 1 + i;   /* absolute position of draft i */
        if (at >= r->n_ref) break;   /* past the reference: keep the drafter's own */
        int32_t want = r->ref[at];
        out[i] = i == k ? (want + 1) % r->vocab : want;
    }
    r->calls++;
    r->forced += (uint64_t)(k < B - 1 ? k : B - 1);
    return 0;
}

void dfl_replay_proposer_init(dfl_replay_proposer *r, dfl_proposer *inner, const int32_t *ref,
                              int n_ref, int vocab, const double *p, int n_p, uint64_t seed) {
    memset(r, 0, sizeof *r);
    r->base = (dfl_proposer){add_context, draft, truncate_to, len, inner->cap, inner->n_cap,
                             inner->max_block, inner->spent ? spent : NULL};
    r->base.skip = inner->skip ? skip : NULL;
    r->inner = inner;
    r->ref = ref;
    r->n_ref = n_ref;
    r->vocab = vocab;
    r->n_p = n_p < 0 ? 0 : n_p > DFL_POLICY_MAX ? DFL_POLICY_MAX : n_p;
    for (int i = 0; i < r->n_p; i++) r->p[i] = p[i] < 0 ? 0 : p[i] > 1 ? 1 : p[i];
    r->seed = seed;
}

double dfl_replay_tau(double p, int n_drafts) {
    double tau = 1, run = 1;
    for (int i = 0; i < n_drafts; i++) tau += run *= p;
    return tau;
}

double dfl_replay_p_for_tau(double tau, int n_drafts) {
    if (tau <= 1 || n_drafts < 1) return 0;
    if (tau >= 1 + n_drafts) return 1;
    double lo = 0, hi = 1;   /* tau(p) increases with p */
    for (int it = 0; it < 60; it++) {
        double mid = 0.5 * (lo + hi);
        if (dfl_replay_tau(mid, n_drafts) < tau) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}
