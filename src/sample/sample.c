/* sample.c - logit processing, filtered distributions, keyed draws and the
 * three acceptance rules (exact, rejection, typical). Definitions that the
 * tests and docs/sampling.md rely on are marked "definition". */
#include "sample/sample.h"
#include "sample/format.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* ---- counter-based random numbers --------------------------------------- */

/* SplitMix64's finaliser: a bijection on 64 bits with full avalanche. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* definition: one mixing round per key part, so nearby positions, streams and
 * seeds give unrelated numbers. */
uint64_t dfl_rng_u64(uint64_t seed, uint32_t stream, uint64_t pos, uint64_t draw) {
    const uint64_t g = 0x9e3779b97f4a7c15ULL;
    uint64_t h = mix64(seed + g);
    h = mix64(h + (pos + 1) * g);
    h = mix64(h + ((uint64_t)stream + 1) * 0xd1b54a32d192ed03ULL);
    return mix64(h + (draw + 1) * g);
}

double dfl_rng_uniform(uint64_t seed, uint32_t stream, uint64_t pos, uint64_t draw) {
    return (double)(dfl_rng_u64(seed, stream, pos, draw) >> 11) * 0x1p-53;
}

/* ---- distributions ------------------------------------------------------ */

static inline uint64_t dist_w(const dfl_dist *d, int i) {
    return d->point ? (uint64_t)(i == d->top) : d->w[i];
}

/* definition: target = floor(r53 * total / 2^53) < total, exact in 128 bits;
 * the token is the first, in id order, where the running weight passes it. */
int32_t dfl_dist_pick(const dfl_dist *d, int vocab, uint64_t r) {
    if (d->point) return d->top;
    uint64_t target = (uint64_t)(((unsigned __int128)(r >> 11) * d->total) >> 53);
    uint64_t cum = 0;
    if (d->n >= 0) {
        for (int j = 0; j < d->n; j++) {
            cum += d->w[d->ids[j]];
            if (cum > target) return d->ids[j];
        }
        return d->top; /* unreachable: total is the sum of w */
    }
    int i = 0;
    for (int b = 0; b < vocab / DFL_SAMPLE_BLOCK; b++, i += DFL_SAMPLE_BLOCK) {
        if (cum + d->bsum[b] > target) break; /* skip whole blocks first */
        cum += d->bsum[b];
    }
    for (; i < vocab; i++) {
        cum += d->w[i];
        if (cum > target) return i;
    }
    return d->top;
}

double dfl_dist_prob(const dfl_dist *d, int32_t id) {
    if (id < 0) return 0.0;
    if (d->point) return id == d->top ? 1.0 : 0.0;
    return (double)d->w[id] / (double)d->total;
}

double dfl_dist_entropy(const dfl_dist *d, int vocab) {
    if (d->point) return 0.0;
    double h = 0, inv = 1.0 / (double)d->total;
    int n = d->n >= 0 ? d->n : vocab;
    for (int j = 0; j < n; j++) {
        uint64_t w = d->w[d->n >= 0 ? d->ids[j] : j];
        if (w) {
            double p = (double)w * inv;
            h -= p * log(p);
        }
    }
    return h;
}

int dfl_dist_count(const dfl_dist *d, int vocab) {
    if (d->point) return 1;
    if (d->n >= 0) return d->n;
    int n = 0;
    for (int i = 0; i < vocab; i++) n += d->w[i] != 0;
    return n;
}

static void dist_point(dfl_dist *d, int32_t top) {
    d->point = 1;
    d->top = top;
    d->total = 1;
    d->n = -1;
}

/* ---- sampler ------------------------------------------------------------ */

int dfl_sampler_new(const dfl_gen_params *p, int vocab, dfl_sampler **out, dfl_error *err) {
    *out = NULL;
    if (vocab < 1 || vocab > (1 << 23))
        return dfl_fail(err, DFL_EARG, "sampler: vocab %d out of range 1..%d", vocab, 1 << 23);
    if (!isfinite(p->temperature) || p->temperature < 0)
        return dfl_fail(err, DFL_EARG, "temperature: %g, expected a finite value >= 0",
                        p->temperature);
    if (p->top_k < 0) return dfl_fail(err, DFL_EARG, "top_k: %d, expected >= 0", p->top_k);
    if (!(p->top_p >= 0 && p->top_p <= 1))
        return dfl_fail(err, DFL_EARG, "top_p: %g, expected 0..1", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return dfl_fail(err, DFL_EARG, "min_p: %g, expected 0..1", p->min_p);
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty <= 0)
        return dfl_fail(err, DFL_EARG, "repeat_penalty: %g, expected a finite value > 0",
                        p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return dfl_fail(err, DFL_EARG, "presence/frequency penalty: expected finite values");
    if (p->repeat_last_n < 0)
        return dfl_fail(err, DFL_EARG, "repeat_last_n: %d, expected >= 0 (0: whole history)",
                        p->repeat_last_n);
    if (p->spec_accept < DFL_ACCEPT_EXACT || p->spec_accept > DFL_ACCEPT_TYPICAL)
        return dfl_fail(err, DFL_EARG, "spec_accept: %d, expected exact, rejection or typical",
                        p->spec_accept);
    if (!isfinite(p->typical_d))
        return dfl_fail(err, DFL_EARG, "typical_d: expected a finite value");
    if (p->n_bias < 0 || p->n_bias > vocab || (p->n_bias > 0 && (!p->bias_ids || !p->bias_vals)))
        return dfl_fail(err, DFL_EARG, "logit_bias: %d entries, expected 0..%d", p->n_bias, vocab);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= vocab)
            return dfl_fail(err, DFL_EARG, "logit_bias: token id %d outside the vocabulary (0..%d)",
                            p->bias_ids[i], vocab - 1);
        if (isnan(p->bias_vals[i]) || p->bias_vals[i] == INFINITY)
            return dfl_fail(err, DFL_EARG, "logit_bias[%d]: %g, expected a number or -inf",
                            p->bias_ids[i], p->bias_vals[i]);
    }

    dfl_sampler *s = xcalloc(1, sizeof *s);
    s->vocab = vocab;
    /* Below 1e-5 every token but the top is under 2^-40 of it anyway;
     * greedy avoids 1/T overflowing. */
    s->temperature = p->temperature < 1e-5f ? 0.0f : p->temperature;
    s->top_k = p->top_k < vocab ? p->top_k : 0;
    s->top_p = p->top_p;
    s->min_p = p->min_p;
    s->repeat_penalty = p->repeat_penalty;
    s->presence_penalty = p->presence_penalty;
    s->frequency_penalty = p->frequency_penalty;
    s->repeat_last_n = p->repeat_last_n;
    s->seed = p->seed;
    s->accept = p->spec_accept;
    s->typical_d = p->typical_d;
    s->n_bias = p->n_bias;
    s->bias_ids = xmalloc(sizeof(int32_t) * (size_t)(p->n_bias + 1));
    s->bias_vals = xmalloc(sizeof(float) * (size_t)(p->n_bias + 1));
    if (p->n_bias) {
        memcpy(s->bias_ids, p->bias_ids, sizeof(int32_t) * (size_t)p->n_bias);
        memcpy(s->bias_vals, p->bias_vals, sizeof(float) * (size_t)p->n_bias);
    }
    size_t v = (size_t)vocab;
    s->row = xmalloc(sizeof(float) * v);
    s->count = xcalloc(v, sizeof(int32_t));
    s->cb = xmalloc(sizeof(uint16_t) * v);
    s->keys = xmalloc(sizeof(uint64_t) * v);
    s->bcount = xmalloc(sizeof(uint32_t) * DFL_SAMPLE_BUCKETS);
    s->bmass = xmalloc(sizeof(uint64_t) * DFL_SAMPLE_BUCKETS);
    s->res = xmalloc(sizeof(double) * v);
    s->cand = xmalloc(sizeof(int32_t) * v);
    s->p.w = xmalloc(sizeof(uint64_t) * v);
    s->q.w = xmalloc(sizeof(uint64_t) * v);
    s->p.ids = xmalloc(sizeof(int32_t) * v);
    s->q.ids = xmalloc(sizeof(int32_t) * v);
    s->p.bsum = xmalloc(sizeof(uint64_t) * (v / DFL_SAMPLE_BLOCK + 1));
    s->q.bsum = xmalloc(sizeof(uint64_t) * (v / DFL_SAMPLE_BLOCK + 1));
    *out = s;
    return 0;
}

void dfl_sampler_set_format(dfl_sampler *s, const dfl_format *f, int origin) {
    dfl_fmt_run_free(s->fmt);
    s->fmt = f ? dfl_fmt_run_new(f, origin) : NULL;
}

void dfl_sampler_free(dfl_sampler *s) {
    if (!s) return;
    dfl_fmt_run_free(s->fmt);
    free(s->bias_ids);
    free(s->bias_vals);
    free(s->row);
    free(s->count);
    free(s->cb);
    free(s->keys);
    free(s->bcount);
    free(s->bmass);
    free(s->res);
    free(s->cand);
    free(s->p.w);
    free(s->q.w);
    free(s->p.ids);
    free(s->q.ids);
    free(s->p.bsum);
    free(s->q.bsum);
    free(s);
}

/* ---- step 1: bias and penalties ----------------------------------------- */

static inline int32_t hist_at(const int32_t *a, int n_a, const int32_t *b, int j) {
    return j < n_a ? a[j] : b[j - n_a];
}

/* definition: for each distinct token t among the last repeat_last_n tokens
 * (c occurrences): l = l > 0 ? l / rp : l * rp (CTRL), then
 * l -= c * frequency + presence (OpenAI). Ids outside the vocabulary are
 * skipped. */
static void penalize(dfl_sampler *s, const int32_t *a, int n_a, const int32_t *b, int n_b) {
    int n = n_a + n_b;
    int from = s->repeat_last_n > 0 && n > s->repeat_last_n ? n - s->repeat_last_n : 0;
    for (int j = from; j < n; j++) {
        int32_t t = hist_at(a, n_a, b, j);
        if (t >= 0 && t < s->vocab) s->count[t]++;
    }
    for (int j = from; j < n; j++) {
        int32_t t = hist_at(a, n_a, b, j);
        if (t < 0 || t >= s->vocab || s->count[t] == 0) continue;
        float l = s->row[t];
        if (s->repeat_penalty != 1.0f) l = l > 0 ? l / s->repeat_penalty : l * s->repeat_penalty;
        l -= (float)s->count[t] * s->frequency_penalty + s->presence_penalty;
        s->row[t] = l;
        s->count[t] = 0; /* once per distinct token; leaves count zeroed */
    }
}

/* The row after bias and penalties: logits itself when neither is on. */
static const float *prepare(dfl_sampler *s, const float *logits, const int32_t *a, int n_a,
                            const int32_t *b, int n_b) {
    int pen = s->repeat_penalty != 1.0f || s->presence_penalty != 0.0f ||
              s->frequency_penalty != 0.0f;
    if (!s->n_bias && !pen && !s->fmt) return logits;
    memcpy(s->row, logits, sizeof(float) * (size_t)s->vocab);
    for (int i = 0; i < s->n_bias; i++) s->row[s->bias_ids[i]] += s->bias_vals[i];
    if (pen) penalize(s, a, n_a, b, n_b);
    if (s->fmt) dfl_fmt_mask(s->fmt, a, n_a, b, n_b, s->row);
    return s->row;
}

/* ---- step 2: temperature and filters ------------------------------------ */

/* Keys that sort ascending in the order (logit descending, id ascending). */
static inline uint64_t order_key(float l, int id) {
    uint32_t u;
    l += 0.0f; /* -0 == +0, as the comparisons elsewhere have it */
    memcpy(&u, &l, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* ascending float order */
    return ((uint64_t)~u << 32) | (uint32_t)id;
}

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* A prefix of the order (logit descending, id ascending): token id with
 * logit l is in it iff l > l_cut or (l == l_cut and id <= id_cut). */
typedef struct cut {
    float l;
    int32_t id;
} cut;

/* The walks first gather the buckets of x >= -4, then -8, -14, then all:
 * for language-model rows top-k and top-p end early and few tokens get the
 * scalar histogram; the result does not depend on where the walk succeeds. */
static const int levels[4] = {
    (int)(4.0f * DFL_SAMPLE_BUCKETS / -DFL_SAMPLE_XMIN),
    (int)(8.0f * DFL_SAMPLE_BUCKETS / -DFL_SAMPLE_XMIN),
    (int)(14.0f * DFL_SAMPLE_BUCKETS / -DFL_SAMPLE_XMIN),
    DFL_SAMPLE_BUCKETS,
};

/* Histogram and list (ascending) of the weighted tokens in buckets < b_end. */
static int gather(dfl_sampler *s, const dfl_dist *d, int b_end) {
    memset(s->bcount, 0, sizeof(uint32_t) * (size_t)b_end);
    memset(s->bmass, 0, sizeof(uint64_t) * (size_t)b_end);
    int n = dfl_sample_gather(s->cb, d->w, s->vocab, b_end, s->cand);
    for (int j = 0; j < n; j++) {
        int i = s->cand[j], b = s->cb[i];
        s->bcount[b]++;
        s->bmass[b] += d->w[i];
    }
    return n;
}

/* Shortest prefix of the gathered tokens holding max_n tokens or mass >=
 * target: sums whole buckets (bucket order is logit order), then sorts the
 * one bucket where the prefix ends. Returns 0 when the buckets run out. */
static int walk(dfl_sampler *s, const float *row, const dfl_dist *d, int n, int b_end,
                uint64_t max_n, uint64_t target, cut *c, uint64_t *mass) {
    uint64_t cn = 0, cm = 0;
    for (int b = 0; b < b_end; b++) {
        if (cn + s->bcount[b] < max_n && cm + s->bmass[b] < target) {
            cn += s->bcount[b];
            cm += s->bmass[b];
            continue;
        }
        int k = 0;
        for (int j = 0; j < n; j++)
            if (s->cb[s->cand[j]] == b) s->keys[k++] = order_key(row[s->cand[j]], s->cand[j]);
        qsort(s->keys, (size_t)k, sizeof(uint64_t), cmp_u64);
        for (int j = 0; j < k; j++) {
            int id = (int)(uint32_t)s->keys[j];
            cn++;
            cm += d->w[id];
            if (cn >= max_n || cm >= target) {
                c->l = row[id];
                c->id = id;
                *mass = cm;
                return 1;
            }
        }
    }
    return 0;
}

/* Top-k, then top-p over the top-k survivors: the cut, or 0 when the
 * gathered buckets do not reach it. */
static int find_cut(dfl_sampler *s, const float *row, const dfl_dist *d, int n, int b_end,
                    cut *c) {
    int all = b_end == DFL_SAMPLE_BUCKETS;
    uint64_t max_n = UINT64_MAX, mass = d->total;
    if (s->top_k > 0) {
        max_n = (uint64_t)s->top_k;
        if (!walk(s, row, d, n, b_end, max_n, UINT64_MAX, c, &mass)) {
            if (!all) return 0;
            max_n = UINT64_MAX; /* fewer weighted tokens than k: top-k keeps all */
        }
    }
    if (s->top_p < 1.0f) {
        double t = ceil((double)s->top_p * (double)mass);
        uint64_t target = t < 1 ? 1 : t >= (double)mass ? mass : (uint64_t)t;
        if (!walk(s, row, d, n, b_end, max_n, target, c, &mass)) return 0; /* !all only */
    }
    return 1;
}

/* Temperature, then top-k, then top-p over the top-k survivors, then min-p
 * relative to the top token (the order of Hugging Face's warpers). Every
 * filter keeps a prefix of (logit descending, id ascending). */
static void filtered(dfl_sampler *s, const float *row, float m, int top, dfl_dist *d) {
    int use_cut = s->top_k > 0 || s->top_p < 1.0f;
    d->point = 0;
    d->top = top;
    d->n = -1;
    d->total = dfl_sample_weights(row, s->vocab, m, 1.0f / s->temperature, d->w,
                                  use_cut ? s->cb : NULL, d->bsum);
    /* the top token weighs 2^40; (double)w >= min_p * 2^40 <=> w >= thr */
    uint64_t thr = (uint64_t)ceil((double)s->min_p * (double)d->w[top]);
    if (!use_cut) {
        if (s->min_p > 0.0f) {
            uint64_t tot = 0;
            for (int i = 0; i < s->vocab; i++) {
                if (i % DFL_SAMPLE_BLOCK == 0) d->bsum[i / DFL_SAMPLE_BLOCK] = 0;
                d->w[i] = d->w[i] >= thr ? d->w[i] : 0;
                d->bsum[i / DFL_SAMPLE_BLOCK] += d->w[i];
                tot += d->w[i];
            }
            d->total = tot;
        }
        return;
    }
    cut c = {-INFINITY, INT32_MAX};
    int n = 0;
    for (int lv = 0; lv < 4; lv++) {
        n = gather(s, d, levels[lv]);
        if (find_cut(s, row, d, n, levels[lv], &c)) break;
    }
    /* the kept tokens are among the gathered ones: list them, zero the rest */
    int k = 0;
    for (int j = 0; j < n; j++) {
        int id = s->cand[j];
        float l = row[id];
        if ((l > c.l || (l == c.l && id <= c.id)) && d->w[id] >= thr) {
            d->ids[k] = id;
            s->keys[k++] = d->w[id];
        }
    }
    memset(d->w, 0, sizeof(uint64_t) * (size_t)s->vocab);
    uint64_t tot = 0;
    for (int j = 0; j < k; j++) {
        d->w[d->ids[j]] = s->keys[j];
        tot += s->keys[j];
    }
    d->n = k;
    d->total = tot;
}

void dfl_sampler_dist(dfl_sampler *s, const float *logits, const int32_t *a, int n_a,
                      const int32_t *b, int n_b, dfl_dist *d) {
    const float *row = prepare(s, logits, a, n_a, b, n_b);
    float m;
    int top = dfl_sample_argmax(row, s->vocab, &m);
    if (s->temperature == 0.0f || !(m > -INFINITY) || m == INFINITY) {
        dist_point(d, top);
        return;
    }
    filtered(s, row, m, top, d);
    if (d->total == 0) dist_point(d, top);
}

int32_t dfl_sample(dfl_sampler *s, const float *logits, const int32_t *hist, int n_hist) {
    dfl_sampler_dist(s, logits, hist, n_hist, NULL, 0, &s->p);
    return dfl_dist_pick(&s->p, s->vocab,
                         dfl_rng_u64(s->seed, DFL_RNG_TARGET, (uint64_t)n_hist, 0));
}

/* The draw index is the round's first position: a position drafted again in a
 * later round gets a fresh number. */
void dfl_sample_drafts(dfl_sampler *s, const float *dlogits, int n, const int32_t *prefix,
                       int n_prefix, int32_t *draft) {
    size_t v = (size_t)s->vocab;
    for (int k = 0; k < n; k++) {
        dfl_sampler_dist(s, dlogits + (size_t)k * v, prefix, n_prefix, draft, k, &s->q);
        uint64_t r = dfl_rng_u64(s->seed, DFL_RNG_DRAFT, (uint64_t)(n_prefix + k),
                                 (uint64_t)n_prefix);
        draft[k] = dfl_dist_pick(&s->q, s->vocab, r);
    }
}

void dfl_sample_drafts_format(dfl_sampler *s, const float *dlogits, int n, const int32_t *prefix,
                              int n_prefix, int32_t *draft) {
    size_t v = (size_t)s->vocab;
    for (int k = 0; k < n; k++) {
        float m;
        memcpy(s->row, dlogits + (size_t)k * v, sizeof(float) * v);
        dfl_fmt_mask(s->fmt, prefix, n_prefix, draft, k, s->row);
        draft[k] = dfl_sample_argmax(s->row, s->vocab, &m);
    }
}

/* ---- step 3: acceptance ------------------------------------------------- */

/* Probability of a proposed token; a proposer's id outside the vocabulary has none. */
static double draft_prob(const dfl_sampler *s, const dfl_dist *d, int32_t id) {
    return id >= 0 && id < s->vocab ? dfl_dist_prob(d, id) : 0.0;
}

/* The target's own sample at position pos: what classic decode draws there. */
static int32_t target_sample(dfl_sampler *s, uint64_t pos) {
    return dfl_dist_pick(&s->p, s->vocab, dfl_rng_u64(s->seed, DFL_RNG_TARGET, pos, 0));
}

static void accept_exact(dfl_sampler *s, const float *tl, int B, const int32_t *draft,
                         const int32_t *prefix, int n_prefix, dfl_accept_result *r) {
    size_t v = (size_t)s->vocab;
    for (int k = 0;; k++) {
        dfl_sampler_dist(s, tl + (size_t)k * v, prefix, n_prefix, draft, k, &s->p);
        int32_t t = target_sample(s, (uint64_t)(n_prefix + k));
        if (k == B - 1 || draft[k] != t) {
            r->n_accepted = k;
            r->next = t;
            return;
        }
    }
}

/* definition: a draft x at row k is kept when p(x) > 0 and
 * p(x) >= min(1, d * exp(-H(p))), or when it equals the target's own sample;
 * the first draft that is neither is replaced by that sample. */
static void accept_typical(dfl_sampler *s, const float *tl, int B, const int32_t *draft,
                           const int32_t *prefix, int n_prefix, dfl_accept_result *r) {
    size_t v = (size_t)s->vocab;
    for (int k = 0;; k++) {
        dfl_sampler_dist(s, tl + (size_t)k * v, prefix, n_prefix, draft, k, &s->p);
        int32_t t = target_sample(s, (uint64_t)(n_prefix + k));
        if (k == B - 1) {
            r->n_accepted = k;
            r->next = t;
            return;
        }
        if (draft[k] == t) continue;
        double px = draft_prob(s, &s->p, draft[k]);
        double tau = fmin(1.0, (double)s->typical_d * exp(-dfl_dist_entropy(&s->p, s->vocab)));
        if (s->typical_d > 0 && px > 0 && px >= tau) {
            r->n_lossy++;
            continue;
        }
        r->n_accepted = k;
        r->next = t;
        return;
    }
}

/* Draws from max(0, p - q) normalised; -1 when that is all zero. */
static int32_t residual(dfl_sampler *s, double u) {
    const dfl_dist *p = &s->p, *q = &s->q;
    double ip = 1.0 / (double)p->total, iq = 1.0 / (double)q->total, sum = 0;
    for (int i = 0; i < s->vocab; i++) {
        double r = (double)dist_w(p, i) * ip - (double)dist_w(q, i) * iq;
        s->res[i] = r > 0 ? r : 0;
        sum += s->res[i];
    }
    if (!(sum > 0)) return -1;
    double target = u * sum, cum = 0;
    int last = -1;
    for (int i = 0; i < s->vocab; i++) {
        if (s->res[i] <= 0) continue;
        cum += s->res[i];
        last = i;
        if (cum > target) return i;
    }
    return last;
}

/* Standard speculative sampling: keep x with probability min(1, p(x)/q(x)),
 * else draw from the residual. Every emitted token is distributed as p. */
static void accept_rejection(dfl_sampler *s, const float *tl, int B, const int32_t *draft,
                             const float *dl, const int32_t *prefix, int n_prefix,
                             dfl_accept_result *r) {
    size_t v = (size_t)s->vocab;
    for (int k = 0;; k++) {
        uint64_t pos = (uint64_t)(n_prefix + k);
        dfl_sampler_dist(s, tl + (size_t)k * v, prefix, n_prefix, draft, k, &s->p);
        if (k == B - 1) {
            r->n_accepted = k;
            r->next = target_sample(s, pos);
            return;
        }
        dfl_sampler_dist(s, dl + (size_t)k * v, prefix, n_prefix, draft, k, &s->q);
        double px = draft_prob(s, &s->p, draft[k]), qx = draft_prob(s, &s->q, draft[k]);
        double u = dfl_rng_uniform(s->seed, DFL_RNG_COIN, pos, 0);
        if (qx > 0 && u * qx < px) continue;
        int32_t t = residual(s, dfl_rng_uniform(s->seed, DFL_RNG_RESIDUAL, pos, 0));
        r->n_accepted = k;
        r->next = t >= 0 ? t : target_sample(s, pos); /* p == q up to rounding */
        r->resampled = 1;
        return;
    }
}

void dfl_accept(dfl_sampler *s, const float *tlogits, int B, const int32_t *draft,
                const float *dlogits, const int32_t *prefix, int n_prefix, dfl_accept_result *r) {
    memset(r, 0, sizeof *r);
    if (B < 1) B = 1; /* no drafts: one classic step */
    int rule = s->accept;
    if (s->temperature == 0.0f) rule = DFL_ACCEPT_EXACT; /* all three agree: greedy */
    if (rule == DFL_ACCEPT_REJECTION && dlogits)
        accept_rejection(s, tlogits, B, draft, dlogits, prefix, n_prefix, r);
    else if (rule == DFL_ACCEPT_TYPICAL)
        accept_typical(s, tlogits, B, draft, prefix, n_prefix, r);
    else
        accept_exact(s, tlogits, B, draft, prefix, n_prefix, r);
}

/* ---- log-probabilities -------------------------------------------------- */

void dfl_logprobs(const float *logits, int vocab, int32_t id, int n_top, dfl_token_info *ti) {
    float m;
    dfl_sample_argmax(logits, vocab, &m);
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        if (logits[i] > -INFINITY) sum += (double)expf(logits[i] - m);
    double lse = (double)m + log(sum);
    ti->id = id;
    ti->logprob = id >= 0 && id < vocab ? (float)((double)logits[id] - lse) : -INFINITY;
    if (n_top < 0) n_top = 0;
    if (n_top > DFL_MAX_TOP_LOGPROBS) n_top = DFL_MAX_TOP_LOGPROBS;
    if (n_top > vocab) n_top = vocab;
    int n = 0;
    /* insertion into a short list sorted by (logit descending, id ascending) */
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float l = logits[i];
        if (l != l) continue;
        if (n == n_top && !(l > logits[ti->top_ids[n - 1]])) continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && l > logits[ti->top_ids[j - 1]]) {
            ti->top_ids[j] = ti->top_ids[j - 1];
            j--;
        }
        ti->top_ids[j] = i;
    }
    ti->n_top = n;
    for (int j = 0; j < n; j++)
        ti->top_logprobs[j] = (float)((double)logits[ti->top_ids[j]] - lse);
}
