/* ops.c - per-row small ops: rmsnorm, rope, swiglu, argmax. Each row is
 * computed on its own, so these are batch invariant by construction; the
 * AVX2 forms give the twins' bits (vec.h). */
#include <math.h>

#include "kernels/kernels.h"
#include "kernels/vec.h"

/* ---- rmsnorm --------------------------------------------------------------- */

/* y = (x * (1 / sqrt(sum(x^2) / n + eps))) * w, the sum in vec.h's dot order. */
static void rmsnorm_ref(float *y, const float *x, const float *w, int n, float eps) {
    float s = 1.0f / sqrtf(dfl_dot_ref(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * s) * w[i];
}

#if DFL_X86
DFL_AVX2 static void rmsnorm_avx2(float *y, const float *x, const float *w, int n, float eps) {
    float s = 1.0f / sqrtf(dfl_dot(x, x, n) / (float)n + eps);
    __m256 sv = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; i++) y[i] = (x[i] * s) * w[i];
}

#else
#define rmsnorm_avx2 rmsnorm_ref /* never taken: dfl_kernels_simd() is 0 */
#endif

void dfl_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    if (dfl_kernels_simd())
        rmsnorm_avx2(y, x, w, n, eps);
    else
        rmsnorm_ref(y, x, w, n, eps);
}

/* ---- rope ------------------------------------------------------------------ */

/* Pair (a, b) at angle pos * inv_freq[i] (an f32 product, as HF computes it),
 * cos and sin rounded to f32 from double, times mscale:
 *   a' = a*cos - b*sin,  b' = b*cos + a*sin.
 * neox pairs (i, i + hd/2); interleaved pairs (2i, 2i + 1). */
static void rope_pair(const dfl_rope *r, float *x, int n_heads, int i, float c, float s) {
    int hd = r->head_dim, half = hd / 2, stride = r->stride ? r->stride : hd;
    int ia = r->neox ? i : 2 * i, ib = r->neox ? i + half : 2 * i + 1;
    for (int h = 0; h < n_heads; h++) {
        float *p = x + (size_t)h * stride;
        float a = p[ia], b = p[ib];
        p[ia] = a * c - b * s;
        p[ib] = b * c + a * s;
    }
}

void dfl_rope_cs(const dfl_rope *r, int pos, float *cs) {
    int half = r->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * r->inv_freq[i];
        cs[i] = (float)cos((double)ang) * r->mscale;
        cs[half + i] = (float)sin((double)ang) * r->mscale;
    }
}

void dfl_rope_apply_cs(const dfl_rope *r, float *x, int n_heads, const float *cs) {
    int half = r->head_dim / 2;
    for (int i = 0; i < half; i++) rope_pair(r, x, n_heads, i, cs[i], cs[half + i]);
}

void dfl_rope_apply(const dfl_rope *r, float *x, int n_heads, int pos) {
    int half = r->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * r->inv_freq[i];
        float c = (float)cos((double)ang) * r->mscale, s = (float)sin((double)ang) * r->mscale;
        rope_pair(r, x, n_heads, i, c, s);
    }
}

/* ---- swiglu ---------------------------------------------------------------- */

/* out = (g / (1 + exp(-g))) * up, with vec.h's exp. */
static void swiglu_ref(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = (g / (1.0f + dfl_expf_ref(-g))) * up[i];
    }
}

#if DFL_X86
DFL_AVX2 static void swiglu_avx2(float *out, const float *gate, const float *up, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = dfl_expf8(_mm256_xor_ps(g, neg));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    if (i < n) {   /* the last few as one masked vector (the same operations) */
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 g = _mm256_maskload_ps(gate + i, mask);
        __m256 e = dfl_expf8(_mm256_xor_ps(g, neg));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_maskstore_ps(out + i, mask, _mm256_mul_ps(s, _mm256_maskload_ps(up + i, mask)));
    }
}

#else
#define swiglu_avx2 swiglu_ref /* never taken: dfl_kernels_simd() is 0 */
#endif

void dfl_swiglu(float *out, const float *gate, const float *up, int n) {
    if (dfl_kernels_simd())
        swiglu_avx2(out, gate, up, n);
    else
        swiglu_ref(out, gate, up, n);
}

/* ---- argmax ---------------------------------------------------------------- */

/* First index of the largest value; NaNs are skipped (all NaN: 0). Compares
 * only, so the AVX2 form (max, then the first index holding it) agrees. */
static int argmax_ref(const float *x, int n) {
    float m = -INFINITY;
    int best = -1;
    for (int i = 0; i < n; i++)
        if (x[i] > m || (best < 0 && x[i] == m)) m = x[i], best = i;
    return best < 0 ? 0 : best;
}

#if DFL_X86
DFL_AVX2 static int argmax_avx2(const float *x, int n) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        mv = _mm256_max_ps(mv, _mm256_blendv_ps(v, mv, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    }
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, mv);
    for (int l = 0; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    __m256 target = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
        if (mask) return i + __builtin_ctz((unsigned)mask);
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

#else
#define argmax_avx2 argmax_ref /* never taken: dfl_kernels_simd() is 0 */
#endif

int dfl_argmax(const float *x, int n) {
    return dfl_kernels_simd() ? argmax_avx2(x, n) : argmax_ref(x, n);
}
