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
 *   l     = l * alpha + p_0 + p_1 + ...    (in key order)
 *   acc_d = fma(p_j, V_j,d, ... fma(p_0, V_0,d, acc_d * alpha))
 * and at the end out = acc / l. The block boundaries depend only on the key
 * index and each unit only on its own row's keys, so a row's result is the
 * same in any batch, on any thread, in the AVX2 form or the twin.
 *
 * Tasks: a kv head with a run of its units (rows x the query heads that
 * share it, GQA head h reads kv head h / (n_heads / n_kv)), so a block of K/V
 * is read once from memory for all of them. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/vec.h"

enum {
    BK = 64,       /* keys per block */
    UNITS = 16     /* (row, head) units per task */
};

typedef struct {
    const float *q, *K, *V;
    const int *n_keys;
    float *out;
    int n, ldk, n_heads, n_kv, hd, g, tpk, simd;
    float scale;
} att_job;

typedef void (*block_fn)(const float *q, const float *K, const float *V, int ldk, int nk, int hd,
                         float scale, float *m, float *l, float *acc);

/* Running max and the rescale of the sum, shared by both forms. */
static float block_max(const float *s, int nk, float *m, float *l, float *alpha) {
    float bm = -INFINITY;
    for (int j = 0; j < nk; j++) bm = s[j] > bm ? s[j] : bm;
    float mn = *m > bm ? *m : bm;
    *alpha = dfl_expf_ref(*m - mn);
    *l *= *alpha;
    *m = mn;
    return mn;
}

static void block_ref(const float *q, const float *K, const float *V, int ldk, int nk, int hd,
                      float scale, float *m, float *l, float *acc) {
    float s[BK], alpha;
    for (int j = 0; j < nk; j++) s[j] = dfl_dot_ref(q, K + (size_t)j * ldk, hd) * scale;
    float mn = block_max(s, nk, m, l, &alpha);
    for (int j = 0; j < nk; j++) {
        s[j] = dfl_expf_ref(s[j] - mn);
        *l += s[j];
    }
    for (int d = 0; d < hd; d++) {
        float a = acc[d] * alpha;
        for (int j = 0; j < nk; j++) a = fmaf(s[j], V[(size_t)j * ldk + d], a);
        acc[d] = a;
    }
}

/* Scores of 4 keys at once: four independent dot-order chains. */
DFL_AVX2 static void scores4(const float *q, const float *K, int ldk, int hd, float scale,
                             float *s) {
    const float *k0 = K, *k1 = K + ldk, *k2 = K + 2 * (size_t)ldk, *k3 = K + 3 * (size_t)ldk;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int h8 = hd & ~7;
    for (int d = 0; d < h8; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    float t[4] = {dfl_hsum8(a0), dfl_hsum8(a1), dfl_hsum8(a2), dfl_hsum8(a3)};
    const float *kk[4] = {k0, k1, k2, k3};
    for (int i = 0; i < 4; i++) {
        for (int d = h8; d < hd; d++) t[i] = fmaf(q[d], kk[i][d], t[i]);
        s[i] = t[i] * scale;
    }
}

DFL_AVX2 static void block_avx2(const float *q, const float *K, const float *V, int ldk, int nk,
                                int hd, float scale, float *m, float *l, float *acc) {
    _Alignas(32) float s[BK];
    float alpha;
    int j = 0;
    for (; j + 4 <= nk; j += 4) scores4(q, K + (size_t)j * ldk, ldk, hd, scale, s + j);
    for (; j < nk; j++) s[j] = dfl_dot(q, K + (size_t)j * ldk, hd) * scale;
    float mn = block_max(s, nk, m, l, &alpha);
    __m256 mv = _mm256_set1_ps(mn);
    for (j = 0; j + 8 <= nk; j += 8)
        _mm256_store_ps(s + j, dfl_expf8(_mm256_sub_ps(_mm256_load_ps(s + j), mv)));
    for (; j < nk; j++) s[j] = dfl_expf_ref(s[j] - mn);
    for (j = 0; j < nk; j++) *l += s[j];

    __m256 av = _mm256_set1_ps(alpha);
    int d = 0;
    for (; d + 32 <= hd; d += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), av);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), av);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 16), av);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 24), av);
        for (j = 0; j < nk; j++) {
            const float *v = V + (size_t)j * ldk + d;
            __m256 p = _mm256_set1_ps(s[j]);
            a0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), a0);
            a1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + d), av);
        for (j = 0; j < nk; j++)
            a = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), _mm256_loadu_ps(V + (size_t)j * ldk + d), a);
        _mm256_storeu_ps(acc + d, a);
    }
    for (; d < hd; d++) {
        float a = acc[d] * alpha;
        for (j = 0; j < nk; j++) a = fmaf(s[j], V[(size_t)j * ldk + d], a);
        acc[d] = a;
    }
}

/* Units [u0, u1) of kv head kh; unit u is row u / g, query head kh*g + u % g. */
static void att_units(const att_job *a, int kh, int u0, int u1, block_fn block) {
    float m[UNITS], l[UNITS];
    int qd = a->n_heads * a->hd, max_keys = 0;
    for (int u = u0; u < u1; u++) {
        int r = u / a->g, h = kh * a->g + u % a->g;
        m[u - u0] = -INFINITY;
        l[u - u0] = 0.0f;
        memset(a->out + (size_t)r * qd + (size_t)h * a->hd, 0, (size_t)a->hd * sizeof(float));
        if (a->n_keys[r] > max_keys) max_keys = a->n_keys[r];
    }
    for (int j0 = 0; j0 < max_keys; j0 += BK) {
        const float *K = a->K + (size_t)j0 * a->ldk + (size_t)kh * a->hd;
        const float *V = a->V + (size_t)j0 * a->ldk + (size_t)kh * a->hd;
        for (int u = u0; u < u1; u++) {
            int r = u / a->g, h = kh * a->g + u % a->g, nk = a->n_keys[r] - j0;
            if (nk <= 0) continue;
            size_t off = (size_t)r * qd + (size_t)h * a->hd;
            block(a->q + off, K, V, a->ldk, nk < BK ? nk : BK, a->hd, a->scale, &m[u - u0],
                  &l[u - u0], a->out + off);
        }
    }
    for (int u = u0; u < u1; u++) {
        int r = u / a->g, h = kh * a->g + u % a->g;
        float *o = a->out + (size_t)r * qd + (size_t)h * a->hd, lu = l[u - u0];
        if (lu > 0)
            for (int d = 0; d < a->hd; d++) o[d] = o[d] / lu;
    }
}

static void att_task(void *ctx, int i, int ntask) {
    const att_job *a = ctx;
    int kh = i / a->tpk, u0 = (i % a->tpk) * UNITS, u1 = u0 + UNITS;
    if (u1 > a->n * a->g) u1 = a->n * a->g;
    att_units(a, kh, u0, u1, a->simd ? block_avx2 : block_ref);
}

static att_job make_job(int n, const float *q, const float *K, const float *V, int ldk,
                        const int *n_keys, int n_heads, int n_kv, int hd, float scale,
                        float *out) {
    att_job a = {q, K, V, n_keys, out, n, ldk, n_heads, n_kv, hd, n_heads / n_kv, 0, 0, scale};
    a.tpk = (n * a.g + UNITS - 1) / UNITS;
    return a;
}

void dfl_attention(dfl_pool *pool, int n, const float *q, const float *K, const float *V,
                   int ldk, const int *n_keys, int n_heads, int n_kv, int hd, float scale,
                   float *out) {
    if (n <= 0) return;
    att_job a = make_job(n, q, K, V, ldk, n_keys, n_heads, n_kv, hd, scale, out);
    a.simd = dfl_kernels_simd();
    dfl_pool_run(pool, att_task, &a, n_kv * a.tpk);
}

void dfl_attention_ref(int n, const float *q, const float *K, const float *V, int ldk,
                       const int *n_keys, int n_heads, int n_kv, int hd, float scale, float *out) {
    if (n <= 0) return;
    att_job a = make_job(n, q, K, V, ldk, n_keys, n_heads, n_kv, hd, scale, out);
    for (int i = 0; i < n_kv * a.tpk; i++) att_task(&a, i, n_kv * a.tpk);
}
