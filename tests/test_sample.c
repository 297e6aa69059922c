/* test_sample.c - the sampler against a plain reference, and the three
 * acceptance rules against classic decode / the target distribution.
 *
 * Everything runs on synthetic logits: a "model" here is a pure function from
 * a token history to a logits row, so classic decode and speculative rounds
 * can be replayed exactly. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "sample/sample.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
    return dfl_rng_u64(a, 77, b, c); /* any good mixer; tests only */
}

/* CPU time of this thread: the machine is shared, wall time is noise. */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double hunit(uint64_t h) { return (double)(h >> 11) * 0x1p-53; }

/* A roughly normal number from a hash (sum of 4 uniforms). */
static double hnorm(uint64_t h) {
    double s = 0;
    for (int i = 0; i < 4; i++) s += hunit(hash3(h, 1000 + i, 0));
    return (s - 2.0) * sqrt(3.0);
}

/* The library's defaults that matter here (dfl_gen_params_default lives in
 * engine.c, which would pull the whole engine into this test). */
static dfl_gen_params base_params(void) {
    dfl_gen_params p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f;
    p.repeat_penalty = 1.0f;
    p.seed = 0x5eed;
    p.typical_d = 0.2f;
    return p;
}

static dfl_sampler *new_sampler(const dfl_gen_params *p, int vocab) {
    dfl_sampler *s = NULL;
    dfl_error err = {0};
    if (dfl_sampler_new(p, vocab, &s, &err) != 0) {
        fprintf(stderr, "sampler_new: %s\n", err.msg);
        exit(2);
    }
    return s;
}

/* ---- the plain reference ------------------------------------------------ */
/* Written from docs/sampling.md: full sort, naive counting. w[i] is the kept
 * weight of token i (0 when not kept); returns the total. */

static const float *g_sort_row;
static int ref_cmp(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    float la = g_sort_row[a], lb = g_sort_row[b];
    if (la != lb) return la > lb ? -1 : 1;
    return a - b;
}

static uint64_t ref_dist(const dfl_gen_params *p, const float *logits, const int32_t *hist,
                         int n_hist, int V, uint64_t *w) {
    float *row = malloc(sizeof(float) * V);
    int *ord = malloc(sizeof(int) * V);
    memcpy(row, logits, sizeof(float) * V);
    for (int i = 0; i < p->n_bias; i++) row[p->bias_ids[i]] += p->bias_vals[i];
    int from = p->repeat_last_n > 0 && n_hist > p->repeat_last_n ? n_hist - p->repeat_last_n : 0;
    for (int t = 0; t < V; t++) {
        int c = 0;
        for (int j = from; j < n_hist; j++) c += hist[j] == t;
        if (!c) continue;
        float l = row[t];
        if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        row[t] = l;
    }
    float m = -INFINITY;
    int top = 0;
    for (int i = 0; i < V; i++)
        if (row[i] > m) m = row[i], top = i;
    memset(w, 0, sizeof(uint64_t) * V);
    float T = p->temperature < 1e-5f ? 0 : p->temperature;
    if (T == 0) {
        w[top] = 1;
        free(row), free(ord);
        return 1;
    }
    float inv_t = 1.0f / T;
    int n = 0;
    for (int i = 0; i < V; i++) {
        uint64_t wi = dfl_sample_weight((row[i] - m) * inv_t);
        if (wi) ord[n++] = i, w[i] = wi;
    }
    g_sort_row = row;
    qsort(ord, n, sizeof(int), ref_cmp);
    int keep = n;
    if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
    uint64_t mass = 0;
    for (int i = 0; i < keep; i++) mass += w[ord[i]];
    if (p->top_p < 1.0f) {
        double t = ceil((double)p->top_p * (double)mass);
        uint64_t target = t < 1 ? 1 : t >= (double)mass ? mass : (uint64_t)t;
        uint64_t cum = 0;
        for (int i = 0; i < keep; i++) {
            cum += w[ord[i]];
            if (cum >= target) {
                keep = i + 1;
                break;
            }
        }
    }
    uint64_t wmax = w[top];
    for (int i = keep; i < n; i++) w[ord[i]] = 0;
    uint64_t tot = 0;
    for (int i = 0; i < V; i++) {
        if (w[i] && p->min_p > 0 && (double)w[i] < (double)p->min_p * (double)wmax) w[i] = 0;
        tot += w[i];
    }
    if (tot == 0) w[top] = 1, tot = 1;
    free(row), free(ord);
    return tot;
}

static int ref_pick(const uint64_t *w, uint64_t tot, int V, uint64_t r) {
    uint64_t target = (uint64_t)(((unsigned __int128)(r >> 11) * tot) >> 53);
    uint64_t cum = 0;
    for (int i = 0; i < V; i++) {
        cum += w[i];
        if (w[i] && cum > target) return i;
    }
    return -1;
}

static int ref_sample(const dfl_gen_params *p, const float *logits, const int32_t *hist,
                      int n_hist, int V) {
    uint64_t *w = malloc(sizeof(uint64_t) * V);
    uint64_t tot = ref_dist(p, logits, hist, n_hist, V, w);
    int t = ref_pick(w, tot, V, dfl_rng_u64(p->seed, DFL_RNG_TARGET, n_hist, 0));
    free(w);
    return t;
}

/* ---- synthetic models --------------------------------------------------- */

/* Logits of the row that predicts position n from hist[0..n): depend on the
 * last two tokens and n, with one favoured token so drafts often match. */
enum { NBASE = 97, MAXV = 1024 };
static float g_base[NBASE][MAXV]; /* random bodies, picked per context */

static void model_init(void) {
    for (int r = 0; r < NBASE; r++)
        for (int i = 0; i < MAXV; i++) g_base[r][i] = (float)hnorm(hash3(r, i, 1));
}

static void model_row(uint64_t salt, const int32_t *hist, int n, int V, float scale, float *out) {
    uint64_t ctx = hash3(salt, (uint64_t)hist[n - 1] * 1000003u + (n > 1 ? hist[n - 2] : 0), n);
    const float *base = g_base[ctx % NBASE];
    int shift = (int)(hash3(ctx, 1, 1) % V);
    for (int i = 0; i < V; i++) out[i] = scale * base[(i + shift) % V];
    out[hash3(ctx, 2, 2) % V] += 3.0f * scale;
    out[hash3(ctx, 3, 3) % V] += 2.0f * scale;
}

/* ---- tests: rng --------------------------------------------------------- */

static void test_rng(void) {
    CHECK(dfl_rng_u64(1, 1, 5, 0) == dfl_rng_u64(1, 1, 5, 0), "pure function");
    CHECK(dfl_rng_u64(1, 1, 5, 0) != dfl_rng_u64(2, 1, 5, 0), "seed matters");
    CHECK(dfl_rng_u64(1, 1, 5, 0) != dfl_rng_u64(1, 2, 5, 0), "stream matters");
    CHECK(dfl_rng_u64(1, 1, 5, 0) != dfl_rng_u64(1, 1, 6, 0), "position matters");
    CHECK(dfl_rng_u64(1, 1, 5, 0) != dfl_rng_u64(1, 1, 5, 1), "draw matters");
    /* uniformity over consecutive positions (64 bins), and no lag-1 correlation */
    enum { N = 200000, NB = 64 };
    int bins[NB] = {0};
    double sxy = 0, sx = 0, prev = dfl_rng_uniform(42, DFL_RNG_TARGET, 0, 0);
    int in_range = 1;
    for (int i = 1; i <= N; i++) {
        double u = dfl_rng_uniform(42, DFL_RNG_TARGET, i, 0);
        in_range &= u >= 0 && u < 1;
        bins[(int)(u * NB)]++;
        sxy += (u - 0.5) * (prev - 0.5);
        sx += u;
        prev = u;
    }
    double chi = 0, e = (double)N / NB;
    for (int b = 0; b < NB; b++) chi += (bins[b] - e) * (bins[b] - e) / e;
    CHECK(in_range, "uniform in [0,1)");
    CHECK(chi < 120, "uniform bins chi2 %.1f (df 63, p=1e-5 at ~120)", chi);
    CHECK(fabs(sxy / N) < 0.002, "lag-1 covariance %.5f", sxy / N);
    CHECK(fabs(sx / N - 0.5) < 0.003, "mean %.5f", sx / N);
}

/* ---- tests: the AVX2 kernels equal their twins --------------------------- */

static void test_kernels(void) {
    CHECK(dfl_sample_weight(0.0f) == (1ull << 40), "top weight 2^40");
    CHECK(dfl_sample_weight(-28.5f) == 0 && dfl_sample_weight(NAN) == 0, "below XMIN: 0");
    double worst = 0;
    for (int i = 0; i <= 2000; i++) {
        float x = -10.0f * i / 2000; /* w >= 5e7: quantisation below 1e-7 */
        double rel = fabs((double)dfl_sample_weight(x) / 0x1p40 / exp((double)x) - 1);
        worst = rel > worst ? rel : worst;
    }
    CHECK(worst < 2e-6, "weight vs exp: relative error %.2g", worst);
    int bad_w = 0, bad_b = 0, bad_a = 0, bad_t = 0;
    enum { N = 1000 };
    float row[N];
    uint64_t w1[N], w2[N];
    uint16_t b1[N], b2[N];
    for (int it = 0; it < 300; it++) {
        int n = 1 + (int)(hash3(it, 1, 1) % N);
        float sc = (float)(0.1 + 10 * hunit(hash3(it, 2, 2)));
        for (int i = 0; i < n; i++) {
            row[i] = (float)(sc * hnorm(hash3(it, 3, i)));
            uint64_t h = hash3(it, 4, i) % 50;
            if (h == 0) row[i] = -INFINITY;
            if (h == 1 && it % 2) row[i] = NAN;
            if (it % 5 == 0) row[i] = roundf(row[i]);
        }
        float m1, m2;
        int a1 = dfl_sample_argmax_ref(row, n, &m1), a2 = dfl_sample_argmax(row, n, &m2);
        bad_a += a1 != a2 || memcmp(&m1, &m2, 4) != 0;
        float T = (float)(0.05 + 3 * hunit(hash3(it, 5, 5)));
        uint64_t s1[N / DFL_SAMPLE_BLOCK + 1], s2[N / DFL_SAMPLE_BLOCK + 1];
        uint64_t t1 = dfl_sample_weights_ref(row, n, m1, 1.0f / T, w1, b1, s1);
        uint64_t t2 = dfl_sample_weights(row, n, m1, 1.0f / T, w2, b2, s2);
        bad_t += t1 != t2;
        int nb = (n + DFL_SAMPLE_BLOCK - 1) / DFL_SAMPLE_BLOCK;
        bad_t += memcmp(s1, s2, sizeof(uint64_t) * nb) != 0;
        uint64_t sum = 0;
        for (int b = 0; b < nb; b++) sum += s1[b];
        bad_t += sum != t1;
        bad_w += memcmp(w1, w2, sizeof(uint64_t) * n) != 0;
        bad_b += memcmp(b1, b2, sizeof(uint16_t) * n) != 0;
    }
    int bad_g = 0;
    for (int it = 0; it < 200; it++) {
        int n = 1 + (int)(hash3(it, 6, 6) % N), b_end = (int)(hash3(it, 7, 7) % 4097);
        for (int i = 0; i < n; i++) {
            b1[i] = (uint16_t)(hash3(it, 8, i) % DFL_SAMPLE_BUCKETS);
            w1[i] = hash3(it, 9, i) % 4 ? hash3(it, 10, i) >> 24 : 0;
        }
        int32_t o1[N], o2[N];
        int k1 = dfl_sample_gather_ref(b1, w1, n, b_end, o1);
        int k2 = dfl_sample_gather(b1, w1, n, b_end, o2);
        bad_g += k1 != k2 || memcmp(o1, o2, sizeof(int32_t) * k1) != 0;
    }
    CHECK(bad_g == 0, "gather kernel differs from twin %d times", bad_g);
    CHECK(bad_a == 0, "argmax kernel differs from twin %d times", bad_a);
    CHECK(bad_w == 0 && bad_t == 0, "weights kernel differs from twin %d/%d times", bad_w, bad_t);
    CHECK(bad_b == 0, "bucket kernel differs from twin %d times", bad_b);
}

/* ---- tests: filters and penalties by hand ------------------------------- */

static int kept(const dfl_dist *d, int id) { return dfl_dist_prob(d, id) > 0; }

static void test_by_hand(void) {
    float row[4] = {0.0f, logf(2), logf(4), -INFINITY}; /* probs 1/7, 2/7, 4/7, 0 */
    dfl_gen_params p = base_params();
    p.temperature = 1.0f;
    dfl_sampler *s = new_sampler(&p, 4);
    int32_t h[1] = {0};
    dfl_sampler_dist(s, row, h, 1, NULL, 0, &s->p);
    CHECK(dfl_dist_count(&s->p, 4) == 3 && fabs(dfl_dist_prob(&s->p, 2) - 4.0 / 7) < 1e-6,
          "plain softmax");
    dfl_sampler_free(s);

    p.top_p = 0.5f; /* 4/7 >= 0.5: the top token alone */
    s = new_sampler(&p, 4);
    dfl_sampler_dist(s, row, h, 1, NULL, 0, &s->p);
    CHECK(dfl_dist_count(&s->p, 4) == 1 && kept(&s->p, 2), "top_p 0.5");
    dfl_sampler_free(s);

    p.top_p = 0.8f; /* 4/7 < 0.8 <= 6/7 */
    s = new_sampler(&p, 4);
    dfl_sampler_dist(s, row, h, 1, NULL, 0, &s->p);
    CHECK(dfl_dist_count(&s->p, 4) == 2 && kept(&s->p, 1) && kept(&s->p, 2), "top_p 0.8");
    dfl_sampler_free(s);

    p.top_p = 1.0f;
    p.top_k = 2;
    s = new_sampler(&p, 4);
    dfl_sampler_dist(s, row, h, 1, NULL, 0, &s->p);
    CHECK(dfl_dist_count(&s->p, 4) == 2 && fabs(dfl_dist_prob(&s->p, 1) - 1.0 / 3) < 1e-6,
          "top_k 2 renormalises");
    dfl_sampler_free(s);

    p.top_k = 0;
    p.min_p = 0.3f; /* keeps p >= 0.3 * 4/7: tokens 1 and 2 */
    s = new_sampler(&p, 4);
    dfl_sampler_dist(s, row, h, 1, NULL, 0, &s->p);
    CHECK(dfl_dist_count(&s->p, 4) == 2 && kept(&s->p, 1) && !kept(&s->p, 0), "min_p 0.3");
    dfl_sampler_free(s);

    p.min_p = 0;
    p.temperature = 0.5f; /* probs ∝ 1, 4, 16 */
    s = new_sampler(&p, 4);
    dfl_sampler_dist(s, row, h, 1, NULL, 0, &s->p);
    CHECK(fabs(dfl_dist_prob(&s->p, 2) - 16.0 / 21) < 1e-6, "temperature 0.5");
    dfl_sampler_free(s);

    /* ties: top_k 1 keeps the lowest id among equal maxima */
    float tie[4] = {1, 3, 3, 2};
    p.temperature = 1.0f;
    p.top_k = 1;
    s = new_sampler(&p, 4);
    dfl_sampler_dist(s, tie, h, 1, NULL, 0, &s->p);
    CHECK(dfl_dist_count(&s->p, 4) == 1 && kept(&s->p, 1), "top_k tie -> lowest id");
    dfl_sampler_free(s);

    /* greedy = first max after bias */
    p = base_params();
    int32_t bid[1] = {2};
    float bval[1] = {-1.5f};
    p.bias_ids = bid, p.bias_vals = bval, p.n_bias = 1;
    s = new_sampler(&p, 4);
    float g[4] = {0, 1, 2, 0.5f}; /* after bias: 0, 1, 0.5, 0.5 */
    CHECK(dfl_sample(s, g, h, 1) == 1, "greedy after bias");
    dfl_sampler_free(s);

    /* penalties: values by hand */
    p = base_params();
    p.temperature = 1.0f;
    p.repeat_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repeat_last_n = 4;
    s = new_sampler(&p, 6);
    float pr[6] = {1, 2, -2, 4, 0, 3};
    int32_t hist[6] = {5, 5, 1, 2, 2, 2}; /* last 4: 1, 2, 2, 2 */
    dfl_sampler_dist(s, pr, hist, 6, NULL, 0, &s->p);
    CHECK(s->row[5] == 3.0f, "outside the window: untouched");
    CHECK(s->row[1] == 2.0f / 2 - 0.25f - 0.5f, "token 1: %g", s->row[1]);
    CHECK(s->row[2] == -2.0f * 2 - 3 * 0.25f - 0.5f, "token 2: %g", s->row[2]);
    CHECK(s->row[0] == 1.0f && s->row[3] == 4.0f, "others untouched");
    /* split history (committed + block) is the same as one piece */
    float r1[6];
    memcpy(r1, s->row, sizeof r1);
    dfl_sampler_dist(s, pr, hist, 3, hist + 3, 3, &s->p);
    CHECK(memcmp(r1, s->row, sizeof r1) == 0, "two-piece history");
    dfl_sampler_free(s);

    /* rejected parameters */
    dfl_error err = {0};
    dfl_sampler *bad = NULL;
    p = base_params();
    p.top_p = 1.5f;
    CHECK(dfl_sampler_new(&p, 10, &bad, &err) == DFL_EARG && strstr(err.msg, "top_p"), "top_p");
    p = base_params();
    p.temperature = NAN;
    CHECK(dfl_sampler_new(&p, 10, &bad, &err) == DFL_EARG, "NaN temperature");
    p = base_params();
    int32_t oob[1] = {10};
    p.bias_ids = oob, p.bias_vals = bval, p.n_bias = 1;
    CHECK(dfl_sampler_new(&p, 10, &bad, &err) == DFL_EARG && strstr(err.msg, "logit_bias"),
          "bias id outside vocab");
    CHECK(bad == NULL, "nothing allocated on error");
}

/* ---- tests: the fast filters against the reference ---------------------- */

static void random_params(dfl_gen_params *p, uint64_t h, int V, int32_t *bid, float *bval) {
    static const float temps[] = {0, 0.3f, 0.7f, 1.0f, 1.5f, 5.0f};
    static const float tops[] = {1, 0.95f, 0.5f, 0.1f, 0.0f};
    static const float minps[] = {0, 0.05f, 0.3f};
    *p = base_params();
    p->seed = h;
    p->temperature = temps[hash3(h, 1, 0) % 6];
    int ks[] = {0, 1, 5, 40, V - 1, V + 10};
    p->top_k = ks[hash3(h, 2, 0) % 6];
    p->top_p = tops[hash3(h, 3, 0) % 5];
    p->min_p = minps[hash3(h, 4, 0) % 3];
    if (hash3(h, 5, 0) % 2) {
        p->repeat_penalty = 1.3f;
        p->presence_penalty = 0.4f;
        p->frequency_penalty = 0.2f;
        p->repeat_last_n = (int)(hash3(h, 6, 0) % 3) * 8;
    }
    if (hash3(h, 7, 0) % 2) {
        for (int i = 0; i < 4; i++) {
            bid[i] = (int32_t)(hash3(h, 8, i) % V);
            bval[i] = i == 3 ? -INFINITY : (float)(4 * hnorm(hash3(h, 9, i)));
        }
        p->bias_ids = bid, p->bias_vals = bval, p->n_bias = 4;
    }
}

static void test_against_reference(void) {
    int Vs[] = {7, 50, 1000};
    int bad_set = 0, bad_tok = 0, runs = 0;
    for (int vi = 0; vi < 3; vi++) {
        int V = Vs[vi];
        float *row = malloc(sizeof(float) * V);
        uint64_t *w = malloc(sizeof(uint64_t) * V);
        int32_t hist[40];
        for (int it = 0; it < 400; it++) {
            uint64_t h = hash3(vi, it, 99);
            dfl_gen_params p;
            int32_t bid[4];
            float bval[4];
            random_params(&p, h, V, bid, bval);
            /* logits: spread varies; every third run quantised to force ties */
            float sc = (float)(0.2 + 6 * hunit(hash3(h, 10, 0)));
            for (int i = 0; i < V; i++) {
                row[i] = (float)(sc * hnorm(hash3(h, 11, i)));
                if (it % 3 == 0) row[i] = roundf(row[i]);
                /* a ladder: the cut lands at every depth (-4, -8, -14, -28) */
                if (it % 3 == 1) row[i] = -(float)(hash3(h, 14, i) % V) * sc * 0.04f;
            }
            for (int j = 0; j < 40; j++) hist[j] = (int32_t)(hash3(h, 12, j) % V);
            int n_hist = 1 + (int)(hash3(h, 13, 0) % 40);
            dfl_sampler *s = new_sampler(&p, V);
            dfl_sampler_dist(s, row, hist, n_hist, NULL, 0, &s->p);
            uint64_t tot = ref_dist(&p, row, hist, n_hist, V, w);
            int same = s->p.total == tot;
            for (int i = 0; i < V; i++)
                same &= (s->p.point ? (uint64_t)(i == s->p.top) : s->p.w[i]) == w[i];
            bad_set += !same;
            if (!same)
                fprintf(stderr, "V %d it %d T %g k %d p %g minp %g pen %g bias %d: tot %llu vs %llu\n",
                        V, it, p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty,
                        p.n_bias, (unsigned long long)s->p.total, (unsigned long long)tot);
            for (int d = 0; d < 8; d++) {
                uint64_t r = dfl_rng_u64(h, 5, d, 0);
                bad_tok += dfl_dist_pick(&s->p, V, r) != ref_pick(w, tot, V, r);
            }
            dfl_sampler_free(s);
            runs++;
        }
        free(row), free(w);
    }
    CHECK(bad_set == 0, "filtered sets differ from the reference in %d of %d rows", bad_set, runs);
    CHECK(bad_tok == 0, "sampled tokens differ from the reference %d times", bad_tok);
}

/* ---- tests: a 150K vocabulary: reference, threads, speed ----------------- */

enum { BIGV = 151936, NROWS = 12 };
static float *g_big;            /* (NROWS, BIGV) */
static int32_t g_bighist[64];
static dfl_gen_params g_bigp[4];

static void big_params(void) {
    for (int i = 0; i < 4; i++) g_bigp[i] = base_params();
    g_bigp[0].temperature = 0.7f; /* plain */
    g_bigp[1].temperature = 1.0f, g_bigp[1].top_k = 40, g_bigp[1].top_p = 0.95f;
    g_bigp[2].temperature = 0.6f, g_bigp[2].top_p = 0.9f, g_bigp[2].min_p = 0.02f;
    g_bigp[3].temperature = 1.0f, g_bigp[3].top_p = 0.999f, g_bigp[3].repeat_penalty = 1.1f;
}

typedef struct {
    int order;  /* visit rows forwards or backwards */
    int32_t tok[4][NROWS];
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = arg;
    for (int c = 0; c < 4; c++) {
        dfl_sampler *s = new_sampler(&g_bigp[c], BIGV);
        for (int i0 = 0; i0 < NROWS; i0++) {
            int i = j->order ? NROWS - 1 - i0 : i0;
            j->tok[c][i] = dfl_sample(s, g_big + (size_t)i * BIGV, g_bighist, 20 + i);
        }
        dfl_sampler_free(s);
    }
    return NULL;
}

static void test_big_vocab(void) {
    g_big = malloc(sizeof(float) * (size_t)NROWS * BIGV);
    for (int r = 0; r < NROWS; r++) {
        float *row = g_big + (size_t)r * BIGV;
        /* LM-like: a broad body and a handful of strong candidates */
        for (int i = 0; i < BIGV; i++) row[i] = (float)(2.5 * hnorm(hash3(r, i, 5)));
        for (int k = 0; k < 8; k++) row[hash3(r, k, 6) % BIGV] += 10.0f + (float)k;
    }
    for (int j = 0; j < 64; j++) g_bighist[j] = (int32_t)(hash3(j, 1, 7) % BIGV);
    big_params();

    /* the same as the reference on a real-sized vocabulary */
    int bad = 0;
    for (int c = 0; c < 4; c++)
        for (int r = 0; r < 3; r++) {
            dfl_gen_params p = g_bigp[c];
            p.seed = 1234 + r;
            dfl_sampler *s = new_sampler(&p, BIGV);
            int t = dfl_sample(s, g_big + (size_t)r * BIGV, g_bighist, 20 + r);
            bad += t != ref_sample(&p, g_big + (size_t)r * BIGV, g_bighist, 20 + r, BIGV);
            dfl_sampler_free(s);
        }
    CHECK(bad == 0, "150K vocab: %d tokens differ from the reference", bad);

    /* the same tokens alone, or next to other requests on other threads, in any order */
    thread_job solo = {0}, jobs[3] = {{1}, {0}, {1}};
    thread_main(&solo);
    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, thread_main, &jobs[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    int diff = 0;
    for (int i = 0; i < 3; i++) diff += memcmp(&solo.tok, &jobs[i].tok, sizeof solo.tok) != 0;
    CHECK(diff == 0, "threads: %d of 3 differ", diff);

    /* speed (printed, not asserted) */
    const char *names[4] = {"T=0.7", "T=1 top_k=40 top_p=0.95", "T=0.6 top_p=0.9 min_p=0.02",
                            "T=1 top_p=0.999 rep=1.1"};
    for (int c = 0; c < 4; c++) {
        dfl_sampler *s = new_sampler(&g_bigp[c], BIGV);
        double t0 = cpu_now();
        int reps = 0;
        for (; reps < 5; reps++)
            for (int r = 0; r < NROWS; r++) dfl_sample(s, g_big + (size_t)r * BIGV, g_bighist, 60);
        double us = (cpu_now() - t0) / (reps * NROWS) * 1e6;
        dfl_sampler_dist(s, g_big, g_bighist, 60, NULL, 0, &s->p);
        printf("sample 151936 vocab, %-28s %7.1f us/row CPU (kept %d)\n", names[c], us,
               dfl_dist_count(&s->p, BIGV));
        dfl_sampler_free(s);
    }
    free(g_big);
}

/* ---- tests: speculative rounds == classic decode ------------------------ */

enum { MV = 300, NPROMPT = 5, NGEN = 40, MAXB = 16, MAXLEN = NPROMPT + NGEN + MAXB };

typedef struct sim {
    dfl_gen_params p;
    uint64_t salt;        /* target model */
    float scale;
} sim;

static void classic(const sim *m, int32_t *seq) {
    dfl_sampler *s = new_sampler(&m->p, MV);
    float row[MV];
    for (int n = NPROMPT; n < NPROMPT + NGEN; n++) {
        model_row(m->salt, seq, n, MV, m->scale, row);
        seq[n] = dfl_sample(s, row, seq, n);
    }
    dfl_sampler_free(s);
}

/* Drafts for a round: pattern 0 all correct, 1 all wrong, 2 random (70%
 * correct), 3 correct then wrong alternating; "correct" = the classic token. */
static int32_t forced_draft(int pattern, const int32_t *ref, int pos, int k, uint64_t h) {
    int good = pattern == 0 || (pattern == 2 && hunit(hash3(h, pos, k)) < 0.7) ||
               (pattern == 3 && k % 2 == 0);
    int32_t t = pos < NPROMPT + NGEN ? ref[pos] : 0;
    return good ? t : (int32_t)((t + 1 + hash3(h, pos, 9) % (MV - 1)) % MV);
}

/* Speculative decode with block B; returns rounds. acc_sum counts kept drafts. */
static int speculative(const sim *m, int rule, int B, int pattern, const int32_t *ref,
                       int32_t *seq, int *acc_sum, int *full_ok) {
    dfl_gen_params p = m->p;
    p.spec_accept = rule;
    dfl_sampler *s = new_sampler(&p, MV);
    static float tl[MAXB * MV];
    int32_t draft[MAXB];
    int n = NPROMPT, rounds = 0;
    while (n < NPROMPT + NGEN) {
        for (int k = 0; k < B - 1; k++) draft[k] = forced_draft(pattern, ref, n + k, k, p.seed);
        /* verify rows: row k sees the committed tokens and draft[0..k-1] */
        for (int k = 0; k < B; k++) {
            if (k) seq[n + k - 1] = draft[k - 1];
            model_row(m->salt, seq, n + k, MV, m->scale, tl + k * MV);
        }
        dfl_accept_result r;
        dfl_accept(s, tl, B, draft, NULL, seq, n, &r);
        if (pattern == 0 && n + B - 1 <= NPROMPT + NGEN && r.n_accepted != B - 1) *full_ok = 0;
        *acc_sum += r.n_accepted;
        for (int k = 0; k < r.n_accepted; k++) seq[n + k] = draft[k];
        seq[n + r.n_accepted] = r.next;
        n += r.n_accepted + 1;
        rounds++;
    }
    dfl_sampler_free(s);
    return rounds;
}

static void sim_params(sim *m, int seed, int temp_i, int set_i) {
    static const float temps[] = {0, 0.6f, 1.0f, 1.7f};
    static int32_t bid[3] = {7, 42, 299};
    static float bval[3] = {2.0f, -INFINITY, 1.0f};
    m->p = base_params();
    m->p.seed = 1000 + seed;
    m->p.temperature = temps[temp_i];
    m->salt = 7 + seed;
    m->scale = 1.0f;
    switch (set_i) {
    case 1: m->p.top_k = 20; break;
    case 2: m->p.top_p = 0.9f; break;
    case 3: m->p.top_k = 50, m->p.top_p = 0.8f, m->p.min_p = 0.05f; break;
    case 4:
        m->p.repeat_penalty = 1.3f, m->p.presence_penalty = 0.3f, m->p.frequency_penalty = 0.2f;
        m->p.repeat_last_n = set_i * 3;
        m->p.bias_ids = bid, m->p.bias_vals = bval, m->p.n_bias = 3;
        break;
    case 5: /* whole-history penalties with filters */
        m->p.repeat_penalty = 1.5f, m->p.frequency_penalty = 0.5f, m->p.top_k = 30;
        break;
    }
}

static void test_exact_equals_classic(void) {
    static const int Bs[] = {1, 2, 3, 5, 8, 16};
    int mismatch = 0, runs = 0, full_ok = 1, mism_typ0 = 0, mism_greedy = 0;
    for (int seed = 0; seed < 6; seed++)
        for (int ti = 0; ti < 4; ti++)
            for (int si = 0; si < 6; si++) {
                sim m;
                sim_params(&m, seed, ti, si);
                int32_t ref[MAXLEN], seq[MAXLEN];
                for (int j = 0; j < NPROMPT; j++) ref[j] = (int32_t)(hash3(seed, j, 3) % MV);
                classic(&m, ref);
                /* a plain-reference classic decode agrees too */
                int32_t rs[MAXLEN];
                memcpy(rs, ref, sizeof(int32_t) * NPROMPT);
                float row[MV];
                for (int n = NPROMPT; n < NPROMPT + NGEN; n++) {
                    model_row(m.salt, rs, n, MV, m.scale, row);
                    rs[n] = ref_sample(&m.p, row, rs, n, MV);
                }
                mismatch += memcmp(rs, ref, sizeof(int32_t) * (NPROMPT + NGEN)) != 0;
                for (int bi = 0; bi < 6; bi++)
                    for (int pat = 0; pat < 4; pat++) {
                        int acc = 0;
                        memcpy(seq, ref, sizeof(int32_t) * NPROMPT);
                        speculative(&m, DFL_ACCEPT_EXACT, Bs[bi], pat, ref, seq, &acc, &full_ok);
                        mismatch += memcmp(seq, ref, sizeof(int32_t) * (NPROMPT + NGEN)) != 0;
                        runs++;
                        /* typical with d = 0 is the exact rule */
                        sim m0 = m;
                        m0.p.typical_d = 0;
                        memcpy(seq, ref, sizeof(int32_t) * NPROMPT);
                        speculative(&m0, DFL_ACCEPT_TYPICAL, Bs[bi], pat, ref, seq, &acc, &full_ok);
                        mism_typ0 += memcmp(seq, ref, sizeof(int32_t) * (NPROMPT + NGEN)) != 0;
                        /* at temperature 0 every rule is greedy */
                        if (ti == 0) {
                            for (int rule = 1; rule <= 2; rule++) {
                                memcpy(seq, ref, sizeof(int32_t) * NPROMPT);
                                speculative(&m, rule, Bs[bi], pat, ref, seq, &acc, &full_ok);
                                mism_greedy +=
                                    memcmp(seq, ref, sizeof(int32_t) * (NPROMPT + NGEN)) != 0;
                            }
                        }
                    }
            }
    CHECK(mismatch == 0, "exact rule: %d of %d speculative runs differ from classic", mismatch,
          runs);
    CHECK(full_ok, "forced all-correct drafts are all accepted");
    CHECK(mism_typ0 == 0, "typical d=0: %d runs differ from classic", mism_typ0);
    CHECK(mism_greedy == 0, "T=0 rejection/typical: %d runs differ from greedy", mism_greedy);
}

/* ---- tests: typical ------------------------------------------------------ */

/* Per round: every kept draft is the target's keyed sample or clears the
 * threshold (checked with the reference distribution), the replacement is
 * the keyed sample, and typical keeps at least as many drafts as exact. */
static void test_typical(void) {
    int viol = 0, fewer = 0, rounds = 0, lossy = 0, acc_t = 0, acc_e = 0;
    float tl[MAXB * MV];
    uint64_t w[MV];
    for (int it = 0; it < 300; it++) {
        sim m;
        sim_params(&m, it % 6, 1 + it % 3, it % 6);
        m.p.typical_d = it % 2 ? 0.2f : 0.6f;
        int B = 2 + it % 7;
        int32_t seq[MAXLEN], draft[MAXB];
        for (int j = 0; j < NPROMPT; j++) seq[j] = (int32_t)(hash3(it, j, 4) % MV);
        int n = NPROMPT;
        /* drafts: a different model's greedy picks, so some are off the target */
        for (int k = 0; k < B - 1; k++) {
            float row[MV];
            model_row(m.salt + (it % 3 == 0 ? 0 : 1000), seq, n + k, MV, 1.0f, row);
            int best = 0;
            for (int i = 1; i < MV; i++) best = row[i] > row[best] ? i : best;
            draft[k] = best;
            seq[n + k] = best;
        }
        for (int k = 0; k < B; k++) model_row(m.salt, seq, n + k, MV, m.scale, tl + k * MV);
        dfl_gen_params pt = m.p, pe = m.p;
        pt.spec_accept = DFL_ACCEPT_TYPICAL;
        pe.spec_accept = DFL_ACCEPT_EXACT;
        dfl_sampler *st = new_sampler(&pt, MV), *se = new_sampler(&pe, MV);
        dfl_accept_result rt, re;
        dfl_accept(st, tl, B, draft, NULL, seq, n, &rt);
        dfl_accept(se, tl, B, draft, NULL, seq, n, &re);
        fewer += rt.n_accepted < re.n_accepted;
        acc_t += rt.n_accepted, acc_e += re.n_accepted, lossy += rt.n_lossy;
        for (int k = 0; k <= rt.n_accepted; k++) {
            uint64_t tot = ref_dist(&pt, tl + k * MV, seq, n + k, MV, w);
            int keyed = ref_pick(w, tot, MV, dfl_rng_u64(pt.seed, DFL_RNG_TARGET, n + k, 0));
            if (k == rt.n_accepted) {
                viol += rt.next != keyed;
                break;
            }
            double H = 0;
            for (int i = 0; i < MV; i++)
                if (w[i]) H -= (double)w[i] / tot * log((double)w[i] / tot);
            double px = (double)w[draft[k]] / tot;
            double tau = fmin(1.0, pt.typical_d * exp(-H));
            viol += !(draft[k] == keyed || (px > 0 && px >= tau));
        }
        dfl_sampler_free(st), dfl_sampler_free(se);
        rounds++;
    }
    CHECK(viol == 0, "typical: %d kept tokens break the documented rule", viol);
    CHECK(fewer == 0, "typical kept fewer drafts than exact in %d rounds", fewer);
    CHECK(lossy > 0, "the threshold kept some drafts (lossy %d)", lossy);
    printf("typical vs exact: kept drafts %d vs %d over %d rounds (%d by threshold)\n", acc_t,
           acc_e, rounds, lossy);
}

/* Proposers are code, but a draft id outside the vocabulary must be refused,
 * never read out of bounds, by every rule. */
static void test_bad_drafts(void) {
    enum { V = 16 };
    float tl[3 * V], dl[2 * V];
    for (int i = 0; i < 3 * V; i++) tl[i] = (float)(i % 5);
    for (int i = 0; i < 2 * V; i++) dl[i] = (float)(i % 3);
    int32_t prefix[2] = {1, 2}, draft[2] = {V + 5, -3};
    int bad = 0;
    for (int rule = 0; rule <= 2; rule++) {
        dfl_gen_params p = base_params();
        p.temperature = 1.0f;
        p.spec_accept = rule;
        p.typical_d = 0.5f;
        dfl_sampler *s = new_sampler(&p, V);
        dfl_accept_result r;
        dfl_accept(s, tl, 3, draft, dl, prefix, 2, &r);
        bad += r.n_accepted != 0 || r.next < 0 || r.next >= V;
        dfl_sampler_free(s);
    }
    CHECK(bad == 0, "out-of-vocabulary drafts: %d rules kept one or chose a bad token", bad);
}

/* ---- tests: rejection keeps the target distribution ---------------------- */

enum { TV = 8, TB = 4, NTRIAL = 100000 };

/* Target row for block position k after last token g; drafter row for block
 * position k after the anchor a (a block drafter does not see its own drafts). */
static void tiny_target(int g, int k, float *out) {
    for (int i = 0; i < TV; i++) out[i] = (float)(1.2 * hnorm(hash3(11, g * 16 + k, i)));
}
static void tiny_drafter(int a, int k, float *out) {
    for (int i = 0; i < TV; i++) out[i] = (float)(1.5 * hnorm(hash3(12, a * 16 + k, i)));
}

/* Wilson-Hilferty: chi-square quantile for df and a normal z. */
static double chi2_crit(int df, double z) {
    double a = 2.0 / (9.0 * df);
    return df * pow(1 - a + z * sqrt(a), 3);
}

/* One rejection run: counts (k, last token, emitted) and (k, last, draft). */
static void rejection_run(const dfl_gen_params *p, uint64_t (*emit)[TV][TV],
                          uint64_t (*drafted)[TV][TV], int *mean_acc, int *mean_exact) {
    dfl_sampler *s = new_sampler(p, TV);
    dfl_gen_params pe = *p;
    pe.spec_accept = DFL_ACCEPT_EXACT;
    dfl_sampler *se = new_sampler(&pe, TV);
    long acc_e = 0;
    float tl[TB * TV], dl[(TB - 1) * TV];
    int32_t seq[64], draft[TB];
    long acc = 0;
    for (int trial = 0; trial < NTRIAL; trial++) {
        s->seed = 0xC0FFEEull + (uint64_t)trial;
        int anchor = trial % TV;
        seq[0] = 3;
        seq[1] = anchor;
        int n = 2;
        for (int k = 0; k < TB - 1; k++) tiny_drafter(anchor, k, dl + k * TV);
        dfl_sample_drafts(s, dl, TB - 1, seq, n, draft);
        for (int k = 0; k < TB; k++) {
            int g = k ? draft[k - 1] : anchor;
            tiny_target(g, k, tl + k * TV);
        }
        dfl_accept_result r, re;
        dfl_accept(s, tl, TB, draft, dl, seq, n, &r);
        acc += r.n_accepted;
        se->seed = s->seed; /* exact, on the same sampled drafts */
        dfl_accept(se, tl, TB, draft, NULL, seq, n, &re);
        acc_e += re.n_accepted;
        for (int k = 0; k <= r.n_accepted; k++) {
            int g = k ? draft[k - 1] : anchor;
            int e = k < r.n_accepted ? draft[k] : r.next;
            emit[k][g][e]++;
            if (k < TB - 1) drafted[k][g][draft[k]]++;
        }
    }
    *mean_acc = (int)(1000 * acc / NTRIAL);
    *mean_exact = (int)(1000 * acc_e / NTRIAL);
    dfl_sampler_free(s);
    dfl_sampler_free(se);
}

/* Chi-square of counts[g][x] against the target's filtered p(x | g, k). */
static double chi2_vs_target(const dfl_gen_params *p, uint64_t (*c)[TV], int k, int *df,
                             int *impossible) {
    double chi = 0;
    *df = 0;
    *impossible = 0;
    uint64_t w[TV];
    int32_t h[2] = {3, 0};
    for (int g = 0; g < TV; g++) {
        uint64_t N = 0;
        for (int x = 0; x < TV; x++) N += c[g][x];
        if (N < 200) continue;
        float row[TV];
        tiny_target(g, k, row);
        h[1] = g;
        uint64_t tot = ref_dist(p, row, h, 2, TV, w); /* no penalties here: history moot */
        int cells = 0;
        for (int x = 0; x < TV; x++) {
            double e = (double)N * w[x] / tot;
            if (w[x] == 0) {
                *impossible += c[g][x] != 0;
                continue;
            }
            chi += (c[g][x] - e) * (c[g][x] - e) / e;
            cells++;
        }
        *df += cells - 1;
    }
    return chi;
}

static void test_rejection(void) {
    const double z = 3.09; /* one-sided p = 0.001 */
    for (int cfg = 0; cfg < 2; cfg++) {
        dfl_gen_params p = base_params();
        p.spec_accept = DFL_ACCEPT_REJECTION;
        p.temperature = cfg ? 0.6f : 1.0f;
        if (cfg) p.top_k = 6, p.top_p = 0.95f;
        static uint64_t emit[TB][TV][TV], drafted[TB][TV][TV];
        memset(emit, 0, sizeof emit);
        memset(drafted, 0, sizeof drafted);
        int mean_acc, mean_exact;
        rejection_run(&p, emit, drafted, &mean_acc, &mean_exact);
        for (int k = 0; k < TB; k++) {
            int df, imp;
            double chi = chi2_vs_target(&p, emit[k], k, &df, &imp);
            double crit = chi2_crit(df, z);
            CHECK(df > 0 && chi < crit, "cfg %d block position %d: chi2 %.1f >= %.1f (df %d)", cfg,
                  k, chi, crit, df);
            CHECK(imp == 0, "cfg %d position %d: %d tokens outside the filtered target", cfg, k,
                  imp);
            printf("rejection cfg %d (T=%.1f%s) position %d: chi2 %.1f, df %d, p=0.001 limit %.1f\n",
                   cfg, p.temperature, cfg ? " top_k 6 top_p 0.95" : "", k, chi, df, crit);
        }
        /* the test has power: the drafts themselves are not target-distributed */
        int df, imp;
        double chi = chi2_vs_target(&p, drafted[0], 0, &df, &imp);
        CHECK(chi > 10 * chi2_crit(df, z), "drafts vs target chi2 %.1f should be huge", chi);
        /* sum min(p, q) >= sum p q: rejection keeps more of the same sampled drafts */
        CHECK(mean_acc > mean_exact, "rejection kept %d, exact %d (per 1000 rounds)", mean_acc,
              mean_exact);
        printf("rejection cfg %d: kept drafts per round %.3f (exact rule on the same drafts "
               "%.3f) of %d\n", cfg, mean_acc / 1000.0, mean_exact / 1000.0, TB - 1);
    }
}

static void timed(const char *name, void (*fn)(void)) {
    double t0 = cpu_now();
    fn();
    printf("%-28s %.1f s CPU\n", name, cpu_now() - t0);
}

int main(void) {
    model_init();
    timed("rng", test_rng);
    timed("kernels", test_kernels);
    timed("by hand", test_by_hand);
    timed("against reference", test_against_reference);
    timed("exact == classic", test_exact_equals_classic);
    timed("typical", test_typical);
    timed("bad drafts", test_bad_drafts);
    timed("rejection", test_rejection);
    timed("150K vocabulary", test_big_vocab);
    return test_summary();
}
