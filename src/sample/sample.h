/* sample.h - sampling for one request, and the acceptance rules of the round loop.
 *
 * A row of logits becomes a token in three steps (docs/sampling.md has the
 * exact definitions):
 *   1. logit_bias, then repetition / presence / frequency penalties over the
 *      last repeat_last_n tokens of the history (prompt included);
 *   2. temperature, then top-k, top-p, min-p: the result is a dfl_dist, an
 *      integer weight per token (temperature 0: the first argmax alone);
 *   3. one draw from that distribution with 64 random bits that are a pure
 *      function of (seed, stream, position, draw): a counter-based generator,
 *      not a stream, so the token sampled at position p is the same whether p
 *      is decoded classically or inside a speculative block of any size, in
 *      any process, next to any other request.
 *
 * The position of a sampled token is the length of its history: the logits
 * row computed at position p-1 samples the token at position p.
 *
 * Everything is sized at creation for the vocabulary; no call allocates. */
#ifndef DFL_SAMPLE_H
#define DFL_SAMPLE_H

#include <stdint.h>

#include "dflash.h"

/* ---- counter-based random numbers --------------------------------------- */

/* Independent streams, so that e.g. a rejection coin never reuses the number
 * that sampled the target row at the same position. */
enum {
    DFL_RNG_TARGET = 1,   /* the target's sample at a position (classic, exact, typical) */
    DFL_RNG_COIN = 2,     /* rejection rule: accept-or-not coin */
    DFL_RNG_RESIDUAL = 3, /* rejection rule: draw from the residual max(0, p - q) */
    DFL_RNG_DRAFT = 4,    /* drafter sampling (rejection rule) */
};

/* 64 random bits, a pure function of the four arguments. */
uint64_t dfl_rng_u64(uint64_t seed, uint32_t stream, uint64_t pos, uint64_t draw);
/* The same as a double in [0, 1) (53 bits). */
double dfl_rng_uniform(uint64_t seed, uint32_t stream, uint64_t pos, uint64_t draw);

/* ---- weights (weights.c: AVX2 kernels beside their plain-C twins) ------- */

/* definition: weight(x) = floor(2^(x*log2 e) * 2^40) for x >= DFL_SAMPLE_XMIN,
 * else 0, with 2^f by a fixed polynomial (relative error ~1e-7), where
 * x = (logit - max) * (1/T). The top token weighs 2^40 exactly; tokens under
 * about 2^-40 of it are never sampled. Integer weights make every sum exact
 * and independent of order. */
#define DFL_SAMPLE_XMIN (-28.0f)
/* Histogram buckets over x in [XMIN, 0] that top-k and top-p walk. */
#define DFL_SAMPLE_BUCKETS 4096

uint64_t dfl_sample_weight(float x);
/* First index of the largest value; NaN never wins; 0 when none beats -inf. */
int dfl_sample_argmax(const float *row, int n, float *max);
int dfl_sample_argmax_ref(const float *row, int n, float *max);
/* Tokens per partial sum, so that a draw skips whole blocks. */
#define DFL_SAMPLE_BLOCK 64
/* w[i] = weight((row[i] - m) * inv_t); bucket (when not NULL) =
 * min(BUCKETS-1, (int)(x * -BUCKETS/-XMIN)), BUCKETS-1 below XMIN;
 * bsum (when not NULL) = sums of w over blocks of DFL_SAMPLE_BLOCK.
 * Returns the sum of w. */
uint64_t dfl_sample_weights(const float *row, int n, float m, float inv_t, uint64_t *w,
                            uint16_t *bucket, uint64_t *bsum);
uint64_t dfl_sample_weights_ref(const float *row, int n, float m, float inv_t, uint64_t *w,
                                uint16_t *bucket, uint64_t *bsum);
/* Lists, ascending, the i with bucket[i] < b_end and w[i] > 0; returns how many. */
int dfl_sample_gather(const uint16_t *bucket, const uint64_t *w, int n, int b_end, int32_t *out);
int dfl_sample_gather_ref(const uint16_t *bucket, const uint64_t *w, int n, int b_end,
                          int32_t *out);

/* ---- filtered distributions --------------------------------------------- */

/* The probability of token i is w[i] / total. A point (greedy, or a row with
 * nothing finite) leaves w untouched: all mass is on top. */
typedef struct dfl_dist {
    int point;        /* 1: everything on top */
    int32_t top;      /* first argmax of the processed row */
    uint64_t total;   /* sum of w (1 for a point) */
    uint64_t *w;      /* (vocab) weight per token id, 0: never sampled */
    int n;            /* >= 0: the tokens with w > 0 are exactly ids[0..n) */
    int32_t *ids;     /* (vocab) ascending, when n >= 0 (after top-k / top-p) */
    uint64_t *bsum;   /* (vocab / DFL_SAMPLE_BLOCK + 1) block sums of w, when n < 0 */
} dfl_dist;

/* The token that 64 random bits r pick: walks ids in ascending order until
 * the running weight exceeds floor((r >> 11) * total / 2^53). */
int32_t dfl_dist_pick(const dfl_dist *d, int vocab, uint64_t r);
/* Probability of id. */
double dfl_dist_prob(const dfl_dist *d, int32_t id);
/* Shannon entropy in nats. */
double dfl_dist_entropy(const dfl_dist *d, int vocab);
/* Tokens with weight > 0. */
int dfl_dist_count(const dfl_dist *d, int vocab);

/* ---- the sampler -------------------------------------------------------- */

typedef struct dfl_sampler {
    int vocab;
    float temperature;        /* 0: greedy (also below 1e-5) */
    int top_k;                /* 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repeat_penalty;     /* 1: off */
    float presence_penalty, frequency_penalty;
    int repeat_last_n;        /* 0: whole history */
    int n_bias;
    int32_t *bias_ids;        /* (n_bias) owned copy */
    float *bias_vals;         /* (n_bias) */
    uint64_t seed;
    int accept;               /* DFL_ACCEPT_* */
    float typical_d;          /* typical rule: d (<= 0 turns the lossy test off) */

    /* scratch, sized at creation */
    float *row;               /* (vocab) logits after bias and penalties */
    int32_t *count;           /* (vocab) penalty counts; all zero between calls */
    uint16_t *cb;             /* (vocab) histogram bucket of each token */
    uint64_t *keys;           /* (vocab) sort keys of one bucket's members */
    int32_t *cand;            /* (vocab) weighted tokens of the walked buckets */
    uint32_t *bcount;         /* (DFL_SAMPLE_BUCKETS) weighted tokens per bucket */
    uint64_t *bmass;          /* (DFL_SAMPLE_BUCKETS) weight per bucket */
    double *res;              /* (vocab) residual weights (rejection rule) */
    dfl_dist p, q;            /* target row, drafter row */
    struct dfl_fmt_run *fmt;  /* structured output (format.h), or NULL */
} dfl_sampler;

/* Validates p (these values arrive in HTTP requests) and allocates every
 * buffer for a vocabulary of vocab tokens. */
int dfl_sampler_new(const dfl_gen_params *p, int vocab, dfl_sampler **out, dfl_error *err);
void dfl_sampler_free(dfl_sampler *s);
/* Masks every row by structured output f (NULL: none) from position origin
 * on (the first generated token's). */
void dfl_sampler_set_format(dfl_sampler *s, const dfl_format *f, int origin);

/* The filtered distribution of one row into d (s->p, s->q, or a caller's
 * dist with its arrays sized as in dfl_sampler_new). History: the tokens at positions
 * 0 .. n_a+n_b-1, given as two pieces (committed tokens, then block tokens)
 * so that a block needs no copy. */
void dfl_sampler_dist(dfl_sampler *s, const float *logits, const int32_t *a, int n_a,
                      const int32_t *b, int n_b, dfl_dist *d);

/* Classic decode: samples the token at position n_hist (stream TARGET). */
int32_t dfl_sample(dfl_sampler *s, const float *logits, const int32_t *hist, int n_hist);

/* Samples n draft tokens from drafter rows dlogits (n, vocab): draft[k] is for
 * position n_prefix + k, with history prefix + draft[0..k-1] (stream DRAFT).
 * The rejection rule needs drafts drawn this way; the others may use the
 * drafter's argmax. */
void dfl_sample_drafts(dfl_sampler *s, const float *dlogits, int n, const int32_t *prefix,
                       int n_prefix, int32_t *draft);

/* Under a format (dfl_sampler_set_format): draft[k] becomes the drafter's
 * argmax among the tokens the format allows after prefix + draft[0..k-1], so
 * the block proposes no token the target's masked row could never pick. */
void dfl_sample_drafts_format(dfl_sampler *s, const float *dlogits, int n, const int32_t *prefix,
                              int n_prefix, int32_t *draft);

/* ---- acceptance of a verified block ------------------------------------- */

typedef struct dfl_accept_result {
    int n_accepted;     /* drafts kept: draft[0 .. n_accepted-1] are committed */
    int32_t next;       /* then this token (the bonus, or the row's replacement) */
    int n_lossy;        /* typical rule: drafts kept by the threshold alone */
    int resampled;      /* rejection rule: next came from the residual */
} dfl_accept_result;

/* One round's acceptance, by s->accept (temperature 0: always exact):
 *   prefix (n_prefix): committed tokens; the last is the block's anchor.
 *   tlogits (B, vocab): target verify rows; row k is the distribution of the
 *           token at position n_prefix + k, history prefix + draft[0..k-1].
 *   draft (B-1): proposed tokens for positions n_prefix .. n_prefix+B-2.
 *   dlogits (B-1, vocab): drafter rows for the same positions; the rejection
 *           rule needs them (without them it falls back to exact).
 * Rows after the first draft not kept are not looked at. */
void dfl_accept(dfl_sampler *s, const float *tlogits, int B, const int32_t *draft,
                const float *dlogits, const int32_t *prefix, int n_prefix, dfl_accept_result *r);

/* ---- log-probabilities -------------------------------------------------- */

/* Log-softmax of the raw row (temperature 1, no bias, penalties or filters):
 * fills ti->id, ti->logprob of id and the n_top (0..DFL_MAX_TOP_LOGPROBS) most likely tokens. */
void dfl_logprobs(const float *logits, int vocab, int32_t id, int n_top, dfl_token_info *ti);

#endif
