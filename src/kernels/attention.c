/* attention.c - softmax(q K^T * scale) V over a causal prefix, per row and head.
 *
 * Online softmax over fixed key blocks [j0, j0 + BK), j0 a multiple of BK, in
 * key order. One (row, head) "unit" keeps a running max m, sum l and the
 * unnormalized output (kept in out itself, so no buffer grows with context).
 * Per block:
 *   s_j   = dot(q, K_j) * scale            (vec.h dot order)
 *   m'    = max(m, max_j s_j)
 *   alpha = exp(m - m')                    (0 on the first block: m = -inf)
 *   p_j   = exp(s_j - m')
 *   l     = l * alpha + sum_j p_j          (vec.h dot order, with adds)
 *   acc_d = fma(p_j, V_j,d, ... fma(p_0, V_0,d, acc_d * alpha))
 * and at the end out = acc / l (l + exp(sink - m) with a sink logit). The block boundaries depend only on the key
 * index and each unit only on its own row's keys, so a row's result is the
 * same in any batch, on any thread, in the AVX2 form or the twin.
 *
 * Tasks: a kv head with a run of up to UNITS of its units (rows x the query
 * heads that share it; GQA head h reads kv head h / (n_heads / n_kv)). The
 * twin runs them one by one. The AVX2 form runs a few units (decode) one by
 * one too, four keys and 32 dims at a time, which keeps many rows of K/V in
 * flight; more units (verify, prefill) run together, each block of K/V packed
 * contiguous once and read from cache by all: the scores as a small units x
 * keys matmul, the values as units x dims register tiles. Small heads (8..32
 * dims) with rows close together (a model in cache) take the second way even
 * for decode, their scores 8 keys per vector from a transposed K block. On
 * the avx512 path the many-unit form computes scores and values in zmm
 * registers instead (heads of 16k dims up to PACK_HD). The arithmetic per
 * element is the twin's in every case.
 *
 * K and V are f32 or f16 (the target's cache). An f16 element is widened
 * exactly where it is read, so both types share every sum; the decode path
 * widens in registers, the others while packing a block. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/vec.h"

enum {
    BK = DFL_ATT_BLOCK, /* keys per block */
    UNITS = 32,     /* (row, head) units per task */
    PACK_HD = 256,  /* head dims up to which a K or V block is packed */
    SMALL_HD = 32,  /* head dims (multiples of 8) up to which scores go 8 keys a vector */
    PACK_LDK = 256  /* row strides (floats) from which a V block is packed */
};

typedef struct {
    const float *q;
    const char *K, *V;
    dfl_type kt;  /* DFL_F32 or DFL_F16 */
    const int *n_keys;
    float *out;
    int n, ldk, n_heads, n_kv, hd, g, tpk, simd;
    float scale;
    size_t hs;   /* elements from one kv head's keys to the next's */
    const float *sinks;  /* (n_heads) sink logits, or NULL */
    const char *K2, *V2; /* keys from split on (dfl_kv_view), or NULL */
    int split;
    size_t hs2;
    int wide;    /* the AVX-512 forms of the many-unit path (see block_units) */
} att_job;

/* Element bytes; a literal the inlined kernels fold (dfl_type_block_bytes is a table). */
static size_t kv_size(dfl_type t) { return t == DFL_F16 ? 2 : 4; }

/* Kv head kh's key block from key j0 (a multiple of BK): in the view, or
 * past its split in the gathered tail. Byte offsets into K and V alike. */
static const char *block_at(const att_job *a, const char *base, const char *tail, int kh,
                            int j0) {
    size_t es = kv_size(a->kt);
    if (tail && j0 >= a->split)
        return tail + ((size_t)(j0 - a->split) * a->ldk + (size_t)kh * a->hs2) * es;
    return base + ((size_t)j0 * a->ldk + (size_t)kh * a->hs) * es;
}

/* Element i of a K or V array of type t. */
static float kv_at(dfl_type t, const char *p, size_t i) {
    return t == DFL_F16 ? dfl_f16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The new running max from the block's largest score bm (NaN scores are
 * skipped), the rescale factor alpha, and l rescaled. */
static float block_max(float bm, float *m, float *l, float *alpha) {
    float mn = *m > bm ? *m : bm;
    *alpha = dfl_expf_ref(*m - mn);
    *l *= *alpha;
    *m = mn;
    return mn;
}

static void block_ref(const float *q, const char *K, const char *V, dfl_type t, int ldk, int nk,
                      int hd, float scale, float *m, float *l, float *acc) {
    float s[BK], key[DFL_MAX_HEAD_DIM], alpha, bm = -INFINITY;
    for (int j = 0; j < nk; j++) {
        for (int d = 0; d < hd; d++) key[d] = kv_at(t, K, (size_t)j * ldk + d);
        s[j] = dfl_dot_ref(q, key, hd) * scale;
        bm = s[j] > bm ? s[j] : bm;
    }
    float mn = block_max(bm, m, l, &alpha);
    for (int j = 0; j < nk; j++) s[j] = dfl_expf_ref(s[j] - mn);
    *l += dfl_sum_ref(s, nk);
    for (int d = 0; d < hd; d++) {
        float a = acc[d] * alpha;
        for (int j = 0; j < nk; j++) a = fmaf(s[j], kv_at(t, V, (size_t)j * ldk + d), a);
        acc[d] = a;
    }
}

/* out = acc / l, l counting query head h's sink logit (its exp at the
 * unit's running max m) when there are sinks: the sink takes a share of the
 * softmax and gives no value. */
static void finish_unit(const att_job *a, int h, float m, float l, float *o) {
    if (a->sinks) l += dfl_expf_ref(a->sinks[h] - m);
    if (l > 0)
        for (int d = 0; d < a->hd; d++) o[d] = o[d] / l;
}

/* Units [u0, u1) of kv head kh, one at a time with the twin. Unit u is row
 * u / g, query head kh*g + u % g. */
static void att_units_ref(const att_job *a, int kh, int u0, int u1) {
    int qd = a->n_heads * a->hd;
    for (int u = u0; u < u1; u++) {
        int r = u / a->g, h = kh * a->g + u % a->g;
        size_t off = (size_t)r * qd + (size_t)h * a->hd;
        float m = -INFINITY, l = 0.0f, *o = a->out + off;
        memset(o, 0, (size_t)a->hd * sizeof(float));
        for (int j0 = 0; j0 < a->n_keys[r]; j0 += BK) {
            int nk = a->n_keys[r] - j0 < BK ? a->n_keys[r] - j0 : BK;
            block_ref(a->q + off, block_at(a, a->K, a->K2, kh, j0),
                      block_at(a, a->V, a->V2, kh, j0), a->kt, a->ldk, nk, a->hd, a->scale, &m,
                      &l, o);
        }
        finish_unit(a, h, m, l, o);
    }
}

#if DFL_X86
/* ---- AVX2: the same per-unit arithmetic, computed for the task's units
 * together so each K/V block is read once for all of them: scores as a small
 * matmul (units x keys, each in the dot order), values as units x dims tiles
 * (each element acc * alpha then fma over keys in order). */

/* s[u * BK + j] = dot(q[u], K_j) * scale for U <= 3 units by J <= 4 keys:
 * q read from memory into each fma, so 12 sums and 4 keys fit the 16
 * registers; each unit's four sums reduced by one hsum8x4 (the dot order's
 * tree), the dims past hd & ~7 added per lane with fma, and stored as one
 * vector. Lanes past J compute on key 0 and are dropped. */
static DFL_AVX2_INLINE void score_tile(int U, int J, const float *const *q, const float *K,
                                       int ldk, int hd, float scale, float *s) {
    __m256 a[3][4];
    const float *k[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) k[j] = K + (j < J ? (size_t)j * ldk : 0);
#pragma GCC unroll 3
    for (int u = 0; u < U; u++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) a[u][j] = _mm256_setzero_ps();
    int h8 = hd & ~7;
    for (int d = 0; d < h8; d += 8) {
        __m256 kv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) kv[j] = _mm256_loadu_ps(k[j] + d);
#pragma GCC unroll 3
        for (int u = 0; u < U; u++) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                a[u][j] = _mm256_fmadd_ps(kv[j], _mm256_loadu_ps(q[u] + d), a[u][j]);
        }
    }
    const __m128 sv = _mm_set1_ps(scale);
#pragma GCC unroll 3
    for (int u = 0; u < U; u++) {
        __m128 t = dfl_hsum8x4(a[u][0], a[u][1], a[u][2], a[u][3]);
        for (int d = h8; d < hd; d++)
            t = _mm_fmadd_ps(_mm_set1_ps(q[u][d]), _mm_setr_ps(k[0][d], k[1][d], k[2][d], k[3][d]),
                             t);
        t = _mm_mul_ps(t, sv);
        if (J == 4) {
            _mm_storeu_ps(s + u * BK, t);
        } else {
            float o[4];
            _mm_storeu_ps(o, t);
            for (int j = 0; j < J; j++) s[u * BK + j] = o[j];
        }
    }
}

/* acc[u][d] = fma(p[u][j], V_j[d], acc[u][d]) for j in [j0, j1), U units by
 * D 8-dim vectors at d. */
static DFL_AVX2_INLINE void value_tile(int U, int D, float *const *acc, const float *p,
                                       const float *V, int ldk, int d, int j0, int j1) {
    __m256 a[4][3];
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
#pragma GCC unroll 3
        for (int i = 0; i < D; i++) a[u][i] = _mm256_loadu_ps(acc[u] + d + 8 * i);
    for (int j = j0; j < j1; j++) {
        __m256 vv[3];
#pragma GCC unroll 3
        for (int i = 0; i < D; i++) vv[i] = _mm256_loadu_ps(V + (size_t)j * ldk + d + 8 * i);
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m256 pv = _mm256_broadcast_ss(p + u * BK + j);
#pragma GCC unroll 3
            for (int i = 0; i < D; i++) a[u][i] = _mm256_fmadd_ps(pv, vv[i], a[u][i]);
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
#pragma GCC unroll 3
        for (int i = 0; i < D; i++) _mm256_storeu_ps(acc[u] + d + 8 * i, a[u][i]);
}

#define SCORE_FN(U, J)                                                                     \
    DFL_AVX2 static void score_##U##x##J(const float *const *q, const float *K, int ldk,    \
                                         int hd, float scale, float *s) {                  \
        score_tile(U, J, q, K, ldk, hd, scale, s);                                          \
    }
#define VALUE_FN(U, D)                                                                     \
    DFL_AVX2 static void value_##U##x##D(float *const *acc, const float *p, const float *V, \
                                         int ldk, int d, int j0, int j1) {                 \
        value_tile(U, D, acc, p, V, ldk, d, j0, j1);                                        \
    }
SCORE_FN(1, 1) SCORE_FN(2, 1) SCORE_FN(3, 1)
SCORE_FN(1, 4) SCORE_FN(2, 4) SCORE_FN(3, 4)
VALUE_FN(1, 1) VALUE_FN(2, 1) VALUE_FN(3, 1) VALUE_FN(4, 1)
VALUE_FN(1, 3) VALUE_FN(2, 3) VALUE_FN(3, 3) VALUE_FN(4, 3)
typedef void (*score_fn)(const float *const *, const float *, int, int, float, float *);
typedef void (*value_fn)(float *const *, const float *, const float *, int, int, int, int);
static const score_fn scores[4][2] = {{0, 0}, {score_1x1, score_1x4}, {score_2x1, score_2x4},
                                      {score_3x1, score_3x4}};
static const value_fn values[5][2] = {{0, 0}, {value_1x1, value_1x3}, {value_2x1, value_2x3},
                                      {value_3x1, value_3x3}, {value_4x1, value_4x3}};

/* acc[u][...] (+)= p[u][j] V_j over keys [j0, j1), all dims, U <= 4 units. */
DFL_AVX2 static void values_all(int U, float *const *acc, const float *p, const float *V, int ldk,
                                int hd, int j0, int j1) {
    int d = 0;
    for (; d + 24 <= hd; d += 24) values[U][1](acc, p, V, ldk, d, j0, j1);
    for (; d + 8 <= hd; d += 8) values[U][0](acc, p, V, ldk, d, j0, j1);
    for (; d < hd; d++)
        for (int u = 0; u < U; u++) {
            float a = acc[u][d];
            for (int j = j0; j < j1; j++) a = fmaf(p[u * BK + j], V[(size_t)j * ldk + d], a);
            acc[u][d] = a;
        }
}

/* The largest of s[0..n), NaNs skipped (maxps returns its second operand
 * when one is NaN), -inf if none. It can differ from the twin's scan only in
 * the sign of a zero maximum, which changes no later bit: it is only ever
 * subtracted before exp, where exp(x - 0) == exp(x + 0). */
static DFL_AVX2_INLINE float block_max_avx2(const float *s, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + j), m);
    if (j < n) {   /* the last few as one vector, the lanes past n at -inf */
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(s + j, mask),
                                    _mm256_castsi256_ps(mask));
        m = _mm256_max_ps(x, m);
    }
    /* No lane holds a NaN (maxps kept m where s was one): a max tree. */
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* One kv head's key block and where the next one is. */
typedef struct {
    const char *K, *V;          /* the block's first key and value */
    const char *nextk, *nextv;  /* the next block's; NULL when none */
    dfl_type t;
    int ldk, next_nk;           /* elements between keys; keys in the next block */
} kv_block;

/* Eight elements of K or V from element i, widened to f32. */
static DFL_AVX2_INLINE __m256 kv8(dfl_type t, const char *p, size_t i) {
    if (t == DFL_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* dot(q, K_j) for the K keys at rows K_0 + j * ldk: independent dot-order
 * chains (dfl_dot's order). */
static DFL_AVX2_INLINE void scores_k(int NK, dfl_type t, const float *q, const char *K, int ldk,
                                     int hd, float scale, float *s) {
    __m256 a[4];
    size_t ld = (size_t)ldk;
#pragma GCC unroll 4
    for (int j = 0; j < NK; j++) a[j] = _mm256_setzero_ps();
    int h8 = hd & ~7;
    for (int d = 0; d < h8; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
#pragma GCC unroll 4
        for (int j = 0; j < NK; j++) a[j] = _mm256_fmadd_ps(qv, kv8(t, K, j * ld + d), a[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NK; j++) {
        float v = dfl_hsum8(a[j]);
        for (int d = h8; d < hd; d++) v = fmaf(q[d], kv_at(t, K, j * ld + d), v);
        s[j] = v * scale;
    }
}

/* One unit, one block (decode): scores four keys at a time, values 32 dims
 * at a time over all the block's keys, which keeps many rows in flight. */
static DFL_AVX2_INLINE void block_one(dfl_type t, const float *q, const char *K, const char *V,
                                      int ldk, int nk, int hd, float scale, float *m, float *l,
                                      float *acc, const kv_block *pf) {
    _Alignas(32) float s[BK];
    float alpha;
    size_t ld = (size_t)ldk, es = kv_size(t);
    int j = 0, rb = hd * (int)es;
    for (; j + 4 <= nk; j += 4) {
        /* The next block's rows, a few per step: memory works while this
         * block computes (the hardware prefetcher alone leaves them apart). */
        for (int i = j; pf && i < j + 4 && i < pf->next_nk; i++)
            for (int d = 0; d < rb; d += 64) {
                _mm_prefetch(pf->nextk + i * ld * es + d, _MM_HINT_T0);
                _mm_prefetch(pf->nextv + i * ld * es + d, _MM_HINT_T0);
            }
        scores_k(4, t, q, K + j * ld * es, ldk, hd, scale, s + j);
    }
    for (; j < nk; j++) scores_k(1, t, q, K + j * ld * es, ldk, hd, scale, s + j);
    float mn = block_max(block_max_avx2(s, nk), m, l, &alpha);
    __m256 mv = _mm256_set1_ps(mn);
    for (j = 0; j + 8 <= nk; j += 8)
        _mm256_store_ps(s + j, dfl_expf8(_mm256_sub_ps(_mm256_load_ps(s + j), mv)));
    for (; j < nk; j++) s[j] = dfl_expf_ref(s[j] - mn);
    *l += dfl_sum(s, nk);

    __m256 av = _mm256_set1_ps(alpha);
    int d = 0;
    for (; d + 32 <= hd; d += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), av);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), av);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 16), av);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 24), av);
        for (j = 0; j < nk; j++) {
            size_t v = j * ld + d;
            __m256 p = _mm256_set1_ps(s[j]);
            a0 = _mm256_fmadd_ps(p, kv8(t, V, v), a0);
            a1 = _mm256_fmadd_ps(p, kv8(t, V, v + 8), a1);
            a2 = _mm256_fmadd_ps(p, kv8(t, V, v + 16), a2);
            a3 = _mm256_fmadd_ps(p, kv8(t, V, v + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + d), av);
        for (j = 0; j < nk; j++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), kv8(t, V, j * ld + d), a);
        _mm256_storeu_ps(acc + d, a);
    }
    for (; d < hd; d++) {
        float a = acc[d] * alpha;
        for (j = 0; j < nk; j++) a = fmaf(s[j], kv_at(t, V, j * ld + d), a);
        acc[d] = a;
    }
}

DFL_AVX2 static void block_f32(const float *q, const char *K, const char *V, int ldk, int nk,
                               int hd, float scale, float *m, float *l, float *acc,
                               const kv_block *pf) {
    block_one(DFL_F32, q, K, V, ldk, nk, hd, scale, m, l, acc, pf);
}

DFL_AVX2 static void block_f16(const float *q, const char *K, const char *V, int ldk, int nk,
                               int hd, float scale, float *m, float *l, float *acc,
                               const kv_block *pf) {
    block_one(DFL_F16, q, K, V, ldk, nk, hd, scale, m, l, acc, pf);
}

/* dst[j * hd + d] = src[j * ldk + d] as f32 for j < nk: a block of one kv
 * head made contiguous (rows ldk apart all fall in the same few cache sets)
 * and, from f16, widened once for every unit that reads it. */
DFL_AVX2 static void pack_block(float *dst, const char *src, dfl_type t, int ldk, int nk, int hd) {
    int h8 = hd & ~7;
    for (int j = 0; j < nk; j++) {
        size_t r = (size_t)j * ldk;
        for (int d = 0; d < h8; d += 8) _mm256_storeu_ps(dst + j * hd + d, kv8(t, src, r + d));
        for (int d = h8; d < hd; d++) dst[j * hd + d] = kv_at(t, src, r + d);
    }
}

/* Prefetches the next block's rows a few lines at a time between kernel
 * calls, so their memory latency overlaps arithmetic without a burst of
 * misses stalling the core. */
typedef struct {
    const char *row;        /* the row being fetched; NULL: nothing left */
    size_t ld;              /* bytes from one row to the next */
    int bytes, left;        /* bytes per row, rows left */
    int d, per;             /* next byte in the row, lines per call */
} prefetcher;

static void pf_start(prefetcher *p, const char *base, size_t ld, int nk, int bytes, int calls) {
    *p = (prefetcher){base, ld, bytes, nk, 0, 0};
    p->per = (nk * ((bytes + 63) / 64) + calls - 1) / (calls > 0 ? calls : 1);
}

static void pf_some(prefetcher *p) {
    for (int i = 0; i < p->per && p->row && p->left > 0; i++) {
        _mm_prefetch(p->row + p->d, _MM_HINT_T0);
        if ((p->d += 64) >= p->bytes) p->d = 0, p->row += p->ld, p->left--;
    }
}

/* ---- small heads (hd = 8, 16, 24, 32): a score is only hd/8 multiply-adds,
 * so a horizontal lane sum per key would cost more than the dot. The block
 * is packed transposed instead (kt[d * BK + j] = K_j[d]): lane l of the dot
 * order (dims l, l+8, ...) becomes one vector over 8 keys, and the lane tree
 * adds whole vectors, so each key's score has the twin's bits. */

static DFL_AVX2_INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);      /* r_i[0] r_i+1[0] r_i[1] r_i+1[1] | 4, 5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);  /* 2, 3 | 6, 7 */
    }
#pragma GCC unroll 2
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);      /* dim 0 | 4 of 4 rows */
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);  /* 1 | 5 */
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* kt[d * BK + j] = K_j[d] for j < nk, zeros up to the next multiple of 8. */
DFL_AVX2 static void pack_kt(float *kt, const char *K, dfl_type t, int ldk, int nk, int hd) {
    for (int j0 = 0; j0 < nk; j0 += 8)
        for (int d0 = 0; d0 < hd; d0 += 8) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                r[i] = j0 + i < nk ? kv8(t, K, (size_t)(j0 + i) * ldk + d0) : _mm256_setzero_ps();
            transpose8(r);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm256_store_ps(kt + (d0 + i) * BK + j0, r[i]);
        }
}

/* s[j] = dot(q, K_j) * scale for j < nk8 (a multiple of 8), 16 keys per
 * step where it can (each q[d] broadcast once for both vectors). */
static DFL_AVX2_INLINE void scores_kt(int hd, const float *q, const float *kt, int nk8,
                                      float scale, float *s) {
    const __m256 sv = _mm256_set1_ps(scale);
    int j = 0;
    for (; j + 16 <= nk8; j += 16) {
        __m256 a[8], b[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            a[l] = b[l] = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int d = l; d < hd; d += 8) {
                __m256 qv = _mm256_broadcast_ss(q + d);
                a[l] = _mm256_fmadd_ps(qv, _mm256_load_ps(kt + d * BK + j), a[l]);
                b[l] = _mm256_fmadd_ps(qv, _mm256_load_ps(kt + d * BK + j + 8), b[l]);
            }
        }
        __m256 ta = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                  _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
        __m256 tb = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(b[0], b[4]), _mm256_add_ps(b[2], b[6])),
                                  _mm256_add_ps(_mm256_add_ps(b[1], b[5]), _mm256_add_ps(b[3], b[7])));
        _mm256_store_ps(s + j, _mm256_mul_ps(ta, sv));
        _mm256_store_ps(s + j + 8, _mm256_mul_ps(tb, sv));
    }
    for (; j < nk8; j += 8) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            a[l] = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int d = l; d < hd; d += 8)
                a[l] = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d), _mm256_load_ps(kt + d * BK + j), a[l]);
        }
        __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                 _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
        _mm256_store_ps(s + j, _mm256_mul_ps(t, sv));
    }
}

/* hd = 8 (tiny models): one product per lane, q's eight values broadcast
 * once for the whole block. */
DFL_AVX2 static void scores_kt8(const float *q, const float *kt, int nk8, float scale, float *s) {
    const __m256 sv = _mm256_set1_ps(scale), z = _mm256_setzero_ps();
    __m256 qv[8];
#pragma GCC unroll 8
    for (int d = 0; d < 8; d++) qv[d] = _mm256_broadcast_ss(q + d);
    for (int j = 0; j < nk8; j += 8) {
        __m256 p[8];
#pragma GCC unroll 8
        for (int d = 0; d < 8; d++) p[d] = _mm256_fmadd_ps(qv[d], _mm256_load_ps(kt + d * BK + j), z);
        __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(p[0], p[4]), _mm256_add_ps(p[2], p[6])),
                                 _mm256_add_ps(_mm256_add_ps(p[1], p[5]), _mm256_add_ps(p[3], p[7])));
        _mm256_store_ps(s + j, _mm256_mul_ps(t, sv));
    }
}

#define SCORES_KT_FN(HD)                                                                   \
    DFL_AVX2 static void scores_kt##HD(const float *q, const float *kt, int nk8, float scale, \
                                       float *s) {                                        \
        scores_kt(HD, q, kt, nk8, scale, s);                                               \
    }
SCORES_KT_FN(16) SCORES_KT_FN(24) SCORES_KT_FN(32)
typedef void (*scores_kt_fn)(const float *, const float *, int, float, float *);
static const scores_kt_fn scores_kts[5] = {0, scores_kt8, scores_kt16, scores_kt24, scores_kt32};

/* ---- AVX-512: the many-unit path (verify, prefill) in zmm registers, each
 * element still the twin's chain. A score's 8 dot-order lanes fill half a
 * zmm; two keys share one, so a block is packed in key pairs (pair p's dims
 * d..d+7 of key 2p, then of key 2p+1, 16 floats) and the unit's 8 query
 * values are broadcast to both halves. Eight keys' registers then reduce
 * with vec.h's lane tree, half by half, into one vector of 8 scores. The
 * values are independent per element: 16 dims a register instead of 8. The
 * softmax bookkeeping between the two stays the AVX2 code. */
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))
#define AVX512_INLINE __attribute__((target("avx2,fma,f16c,avx512f,avx512vl"), always_inline)) inline

enum { WIDE_U = 4 }; /* units per register tile: 16 accumulators, 4 keys or values */

/* dst: keys [0, nk) of a block in pairs, zeros up to the next multiple of 8. */
AVX512 static void pack_pairs(float *dst, const char *K, dfl_type t, int ldk, int nk, int hd) {
    for (int j = 0; j < ((nk + 7) & ~7); j++) {
        float *o = dst + (size_t)(j >> 1) * 2 * hd + (j & 1) * 8;
        for (int d = 0; d < hd; d += 8)
            _mm256_storeu_ps(o + 2 * d, j < nk ? kv8(t, K, (size_t)j * ldk + d) : _mm256_setzero_ps());
    }
}

/* The scores of keys 0..7 from their four pair registers: dfl_hsum8's tree
 * on each half (the halves added, then lanes (0,2) and (1,3), then the
 * two), the keys in order in the result. */
static AVX512_INLINE __m256 tree8x8(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 p = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x88),  /* keys 0-3: s of each */
                             _mm512_shuffle_f32x4(a0, a1, 0xdd));
    __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x88),  /* keys 4-7 */
                             _mm512_shuffle_f32x4(a2, a3, 0xdd));
    __m512 t = _mm512_add_ps(_mm512_shuffle_ps(p, q, 0x44),        /* s0+s2, s1+s3 of key c, c+4 */
                             _mm512_shuffle_ps(p, q, 0xee));
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xb1));             /* lane 0: key c; lane 2: c+4 */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, t));
}

/* s[u * BK + j] = dot(q[u], K_j) * scale for U units by keys j < nk8 (a
 * multiple of 8) of the pair-packed block kp. */
static AVX512_INLINE void scores_wide(int U, const float *const *q, const float *kp, int nk8,
                                      int hd, float scale, float *s) {
    const __m256 sv = _mm256_set1_ps(scale);
    for (int j = 0; j < nk8; j += 8) {
        const float *k = kp + (size_t)j * hd;   /* pair j/2 */
        __m512 a[WIDE_U][4];
#pragma GCC unroll 4
        for (int u = 0; u < U; u++)
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) a[u][p] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 8) {
            __m512 kv[4];
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) kv[p] = _mm512_loadu_ps(k + (size_t)p * 2 * hd + 2 * d);
#pragma GCC unroll 4
            for (int u = 0; u < U; u++) {
                __m512 qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(q[u] + d))));
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) a[u][p] = _mm512_fmadd_ps(qv, kv[p], a[u][p]);
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < U; u++)
            _mm256_store_ps(s + u * BK + j, _mm256_mul_ps(tree8x8(a[u][0], a[u][1], a[u][2], a[u][3]), sv));
    }
}

/* acc[u][d..] = fma(p[u][j], V_j[d..], acc[u][d..]) for j in [j0, j1), U
 * units by D 16-dim vectors at d. */
static AVX512_INLINE void values_wide(int U, int D, float *const *acc, const float *p,
                                      const float *V, int ldv, int d, int j0, int j1) {
    __m512 a[WIDE_U][4];
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
#pragma GCC unroll 4
        for (int i = 0; i < D; i++) a[u][i] = _mm512_loadu_ps(acc[u] + d + 16 * i);
    for (int j = j0; j < j1; j++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int i = 0; i < D; i++) vv[i] = _mm512_loadu_ps(V + (size_t)j * ldv + d + 16 * i);
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            __m512 pv = _mm512_set1_ps(p[u * BK + j]);
#pragma GCC unroll 4
            for (int i = 0; i < D; i++) a[u][i] = _mm512_fmadd_ps(pv, vv[i], a[u][i]);
        }
    }
#pragma GCC unroll 4
    for (int u = 0; u < U; u++)
#pragma GCC unroll 4
        for (int i = 0; i < D; i++) _mm512_storeu_ps(acc[u] + d + 16 * i, a[u][i]);
}

#define WIDE_FNS(U)                                                                            \
    AVX512 static void scores_wide##U(const float *const *q, const float *kp, int nk8, int hd,  \
                                      float scale, float *s) {                                 \
        scores_wide(U, q, kp, nk8, hd, scale, s);                                              \
    }                                                                                          \
    AVX512 static void values_wide##U(float *const *acc, const float *p, const float *V,        \
                                      int ldv, int hd, int j0, int j1) {                       \
        int d = 0;                                                                             \
        for (; d + 64 <= hd; d += 64) values_wide(U, 4, acc, p, V, ldv, d, j0, j1);            \
        for (; d < hd; d += 16) values_wide(U, 1, acc, p, V, ldv, d, j0, j1);                  \
    }
WIDE_FNS(1) WIDE_FNS(2) WIDE_FNS(3) WIDE_FNS(4)
typedef void (*wide_values_fn)(float *const *, const float *, const float *, int, int, int, int);
typedef void (*wide_scores_fn)(const float *const *, const float *, int, int, float, float *);
static const wide_scores_fn wide_scores[WIDE_U + 1] = {0, scores_wide1, scores_wide2, scores_wide3,
                                                       scores_wide4};
static const wide_values_fn wide_values[WIDE_U + 1] = {0, values_wide1, values_wide2, values_wide3,
                                                       values_wide4};

/* The values of U <= 4 units, keys [j0, j1), on the AVX-512 or AVX2 path. */
static void values_any(int wide, int U, float *const *acc, const float *p, const float *V,
                       int ldv, int hd, int j0, int j1) {
    if (wide)
        wide_values[U](acc, p, V, ldv, hd, j0, j1);
    else
        values_all(U, acc, p, V, ldv, hd, j0, j1);
}

/* One key block for units 0..nu (q[u], acc[u] = its slice of out, nk[u] keys
 * of the block, m / l its running max and sum). f16 blocks are always packed
 * (widened once); hd <= PACK_HD then. wide: the AVX-512 scores and values
 * (hd a multiple of 16). */
DFL_AVX2 static void block_units(int nu, const float *const *q, float *const *acc, const int *nk,
                                 const kv_block *b, int hd, float scale, float *m, float *l,
                                 int wide) {
    _Alignas(32) float s[UNITS * BK], buf[BK * PACK_HD];
    int f16 = b->t == DFL_F16, ldk = b->ldk;
    size_t es = kv_size(b->t), ldb = (size_t)ldk * es;
    /* Packing pays when several unit groups reread a block whose rows are
     * apart (f32 rows already contiguous are read in place). */
    int kmax = 0, ugroups = (nu + 3) / 4;
    int pack = f16 || (ugroups > 1 && hd <= PACK_HD && hd % 8 == 0 && ldk != hd);
    int small = hd % 8 == 0 && hd <= SMALL_HD;
    /* Small rows close together: the hardware prefetcher keeps up alone. */
    int close = small && ldk < PACK_LDK && !f16;
    for (int u = 0; u < nu; u++) kmax = nk[u] > kmax ? nk[u] : kmax;
    prefetcher pf;
    /* Scores for every unit and key below kmax (keys past a unit's own count
     * exist in K, or are zeros in kt, and are computed, then ignored). */
    if (small) {
        int nk8 = (kmax + 7) & ~7;
        pack_kt(buf, b->K, b->t, ldk, kmax, hd);
        pf_start(&pf, close ? NULL : b->nextk, ldb, b->next_nk, hd * (int)es, nu);
        for (int u = 0; u < nu; u++) {
            if (!close) pf_some(&pf);
            scores_kts[hd / 8](q[u], buf, nk8, scale, s + u * BK);
        }
    } else if (wide) {
        int nk8 = (kmax + 7) & ~7;
        pack_pairs(buf, b->K, b->t, ldk, kmax, hd);
        pf_start(&pf, b->nextk, ldb, b->next_nk, hd * (int)es,
                 (nu + WIDE_U - 1) / WIDE_U * (nk8 / 8));
        for (int u = 0; u < nu; u += WIDE_U)
            for (int j = 0; j < nk8; j += 8) {
                pf_some(&pf);
                wide_scores[nu - u < WIDE_U ? nu - u : WIDE_U](q + u, buf + (size_t)j * hd, 8, hd,
                                                              scale, s + u * BK + j);
            }
    } else {
        const float *kb = (const float *)b->K;
        int ld = ldk;
        if (pack) {
            pack_block(buf, b->K, b->t, ldk, kmax, hd);
            kb = buf, ld = hd;
        }
        pf_start(&pf, b->nextk, ldb, b->next_nk, hd * (int)es, (nu + 2) / 3 * ((kmax + 3) / 4));
        for (int u = 0; u < nu; u += 3) {
            int U = nu - u < 3 ? nu - u : 3, j = 0;
            for (; j + 4 <= kmax; j += 4) {
                pf_some(&pf);
                scores[U][1](q + u, kb + (size_t)j * ld, ld, hd, scale, s + u * BK + j);
            }
            for (; j < kmax; j++)
                scores[U][0](q + u, kb + (size_t)j * ld, ld, hd, scale, s + u * BK + j);
        }
    }
    /* Softmax bookkeeping, exactly as block_ref: each unit's new maximum,
     * the rescale factors exp(m - m') eight units per vector (dfl_expf8 gives
     * dfl_expf_ref's bits), then the unit's exps, the last few keys masked. */
    _Alignas(32) float alpha[UNITS];
    for (int u = 0; u < ((nu + 7) & ~7); u++) {
        alpha[u] = 0.0f;
        if (u >= nu || nk[u] <= 0) continue;
        float bm = block_max_avx2(s + u * BK, nk[u]), mn = m[u] > bm ? m[u] : bm;
        alpha[u] = m[u] - mn;
        m[u] = mn;
    }
    for (int u = 0; u < nu; u += 8) _mm256_store_ps(alpha + u, dfl_expf8(_mm256_load_ps(alpha + u)));
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int u = 0; u < nu; u++) {
        float *su = s + u * BK;
        if (nk[u] <= 0) continue;
        l[u] *= alpha[u];
        __m256 mv = _mm256_set1_ps(m[u]);
        int j = 0;
        for (; j + 8 <= nk[u]; j += 8)
            _mm256_store_ps(su + j, dfl_expf8(_mm256_sub_ps(_mm256_load_ps(su + j), mv)));
        if (j < nk[u]) {
            __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(nk[u] - j), lane);
            __m256 e = dfl_expf8(_mm256_sub_ps(_mm256_maskload_ps(su + j, mask), mv));
            _mm256_maskstore_ps(su + j, mask, e);
        }
        l[u] += dfl_sum(su, nk[u]);
        __m256 av = _mm256_set1_ps(alpha[u]);
        int d = 0;
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(acc[u] + d, _mm256_mul_ps(_mm256_loadu_ps(acc[u] + d), av));
        for (; d < hd; d++) acc[u][d] *= alpha[u];
    }
    const float *vb = (const float *)b->V;
    int ldv = ldk;
    /* Small rows close together share few cache sets: read them in place. */
    if (pack && !close) {
        pack_block(buf, b->V, b->t, ldk, kmax, hd);
        vb = buf, ldv = hd;
    }
    pf_start(&pf, close ? NULL : b->nextv, ldb, b->next_nk, hd * (int)es, ugroups);
    for (int u = 0; u < nu; u += 4) {   /* 4 units a tile on either path */
        int U = nu - u < 4 ? nu - u : 4, common = BK;
        if (!close) pf_some(&pf);
        for (int i = u; i < u + U; i++) common = nk[i] < common ? nk[i] : common;
        if (common > 0) values_any(wide, U, acc + u, s + u * BK, vb, ldv, hd, 0, common);
        for (int i = u; i < u + U; i++)
            if (nk[i] > common && nk[i] > 0)
                values_any(wide, 1, acc + i, s + i * BK, vb, ldv, hd, common > 0 ? common : 0,
                           nk[i]);
    }
}

/* Units [u0, u1) of kv head kh with the AVX2 kernels. */
static void att_units_avx2(const att_job *a, int kh, int u0, int u1) {
    const float *q[UNITS];
    float *acc[UNITS], m[UNITS], l[UNITS];
    int nu = u1 - u0, qd = a->n_heads * a->hd, max_keys = 0, nk[UNITS];
    for (int u = 0; u < nu; u++) {
        int r = (u0 + u) / a->g, h = kh * a->g + (u0 + u) % a->g;
        size_t off = (size_t)r * qd + (size_t)h * a->hd;
        q[u] = a->q + off;
        acc[u] = a->out + off;
        m[u] = -INFINITY;
        l[u] = 0.0f;
        memset(acc[u], 0, (size_t)a->hd * sizeof(float));
        if (a->n_keys[r] > max_keys) max_keys = a->n_keys[r];
    }
    for (int j0 = 0; j0 < max_keys; j0 += BK) {
        for (int u = 0; u < nu; u++) {
            int left = a->n_keys[(u0 + u) / a->g] - j0;
            nk[u] = left < 0 ? 0 : left < BK ? left : BK;
        }
        int next_nk = max_keys - j0 - BK < BK ? max_keys - j0 - BK : BK;
        kv_block b = {block_at(a, a->K, a->K2, kh, j0), block_at(a, a->V, a->V2, kh, j0),
                      next_nk > 0 ? block_at(a, a->K, a->K2, kh, j0 + BK) : NULL,
                      next_nk > 0 ? block_at(a, a->V, a->V2, kh, j0 + BK) : NULL, a->kt, a->ldk,
                      next_nk};
        /* Few units (decode): one at a time, reading the block with many
         * misses in flight; the others then find it in cache. Small heads
         * with rows close together (a model in cache) take block_units,
         * whose transposed scores beat a lane sum per key. Heads too large
         * to pack stay here too. */
        int small_close = a->hd % 8 == 0 && a->hd <= SMALL_HD && a->ldk < PACK_LDK;
        if ((nu <= 4 && !small_close) || a->hd > PACK_HD)
            for (int u = 0; u < nu; u++) {
                if (nk[u] <= 0) continue;
                (a->kt == DFL_F16 ? block_f16 : block_f32)(q[u], b.K, b.V, a->ldk, nk[u], a->hd,
                                                           a->scale, m + u, l + u, acc[u],
                                                           u == 0 && b.nextk ? &b : NULL);
            }
        else
            block_units(nu, q, acc, nk, &b, a->hd, a->scale, m, l, a->wide);
    }
    for (int u = 0; u < nu; u++)
        finish_unit(a, kh * a->g + (u0 + u) % a->g, m[u], l[u], acc[u]);
}

#else
#define att_units_avx2 att_units_ref /* never taken: dfl_kernels_simd() is 0 */
#endif

static void att_task(void *ctx, int i, int ntask) {
    const att_job *a = ctx;
    int kh = i / a->tpk, u0 = (i % a->tpk) * UNITS, u1 = u0 + UNITS;
    if (u1 > a->n * a->g) u1 = a->n * a->g;
    if (a->simd)
        att_units_avx2(a, kh, u0, u1);
    else
        att_units_ref(a, kh, u0, u1);
}

static att_job make_job(int n, const float *q, const dfl_kv_view *kv, const int *n_keys,
                        int n_heads, int n_kv, int hd, float scale, float *out) {
    att_job a = {q, kv->K, kv->V, kv->type, n_keys, out, n, kv->ldk, n_heads, n_kv, hd,
                 n_heads / n_kv, 0, 0, scale, kv->hs, NULL, kv->K2, kv->V2, kv->split, kv->hs2};
    a.tpk = (n * a.g + UNITS - 1) / UNITS;
    return a;
}

void dfl_attention_sinks(dfl_pool *pool, int n, const float *q, const dfl_kv_view *kv,
                         const int *n_keys, int n_heads, int n_kv, int hd, float scale,
                         const float *sinks, float *out) {
    if (n <= 0) return;
    att_job a = make_job(n, q, kv, n_keys, n_heads, n_kv, hd, scale, out);
    a.simd = dfl_kernels_simd();
#if DFL_X86
    a.wide = dfl_kernels_isa() == DFL_ISA_AVX512 && hd % 16 == 0 && hd <= PACK_HD;
#endif
    a.sinks = sinks;
    dfl_pool_run(pool, att_task, &a, n_kv * a.tpk);
}

void dfl_attention(dfl_pool *pool, int n, const float *q, const dfl_kv_view *kv,
                   const int *n_keys, int n_heads, int n_kv, int hd, float scale, float *out) {
    dfl_attention_sinks(pool, n, q, kv, n_keys, n_heads, n_kv, hd, scale, NULL, out);
}

void dfl_attention_ref(int n, const float *q, const dfl_kv_view *kv, const int *n_keys,
                       int n_heads, int n_kv, int hd, float scale, float *out) {
    if (n <= 0) return;
    att_job a = make_job(n, q, kv, n_keys, n_heads, n_kv, hd, scale, out);
    for (int i = 0; i < n_kv * a.tpk; i++) att_task(&a, i, n_kv * a.tpk);
}
