/* vec.h - the fixed evaluation orders the kernels share, each written twice:
 * in plain C (the specification) and in AVX2 (the fast path). The two give
 * the same bits: conversions to f32 are exact, every multiply-add is a fused
 * fmaf / _mm256_fmadd_ps, and sums follow the same tree.
 *
 * The dot-product order (matmul, attention scores, rmsnorm):
 *   lane l in 0..7 accumulates a[i]*b[i] for i = l, l+8, l+16, ... below
 *   n8 = n & ~7, in increasing i, starting from 0 (acc = fma(a, b, acc));
 *   the lanes are summed by the tree ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7));
 *   the tail i = n8..n-1 is added one by one with fma.
 * Nothing in it depends on how many rows or outputs are computed together. */
#ifndef DFL_VEC_H
#define DFL_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#if DFL_X86
#include <immintrin.h>
#define DFL_AVX2 __attribute__((target("avx2,fma,f16c")))
#define DFL_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#endif

/* 1 when the AVX2 paths may run (the CPU has them and no test forced the twins). */
int dfl_kernels_simd(void);

static inline float dfl_hsum8_ref(const float a[8]) {
    float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

#if DFL_X86
static DFL_AVX2_INLINE float dfl_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));          /* s0+s2, s1+s3 */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* dfl_hsum8 of four vectors at once, the same tree (additions commute
 * exactly): halves added pairwise, then lanes (0,2) and (1,3), then the two. */
static DFL_AVX2_INLINE __m128 dfl_hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    ab = _mm256_add_ps(ab, _mm256_permute_ps(ab, 0x4e));   /* a0+a2, a1+a3 | b.. */
    cd = _mm256_add_ps(cd, _mm256_permute_ps(cd, 0x4e));
    __m256 h = _mm256_hadd_ps(ab, cd);                     /* a, a, c, c | b, b, d, d */
    __m128 lo = _mm256_castps256_ps128(h), hi = _mm256_extractf128_ps(h, 1);
    return _mm_shuffle_ps(_mm_unpacklo_ps(lo, hi), _mm_unpackhi_ps(lo, hi), 0x44);  /* a b c d */
}

#endif

static inline float dfl_dot_ref(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        for (int l = 0; l < 8; l++) acc[l] = fmaf(a[i + l], b[i + l], acc[l]);
    float s = dfl_hsum8_ref(acc);
    for (int i = n8; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

#if DFL_X86
static DFL_AVX2_INLINE float dfl_dot(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = dfl_hsum8(acc);
    for (int i = n8; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

#endif

/* Sum of a[0..n) in the dot order with additions: 8 lane sums, the tree,
 * the tail one by one. */
static inline float dfl_sum_ref(const float *a, int n) {
    float acc[8] = {0};
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l];
    float s = dfl_hsum8_ref(acc);
    for (int i = n8; i < n; i++) s += a[i];
    return s;
}

#if DFL_X86
static DFL_AVX2_INLINE float dfl_sum(const float *a, int n) {
    __m256 acc = _mm256_setzero_ps();
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(a + i));
    float s = dfl_hsum8(acc);
    for (int i = n8; i < n; i++) s += a[i];
    return s;
}

#endif

/* exp(x) for f32 in about 1 ulp, identical in both forms: x = n*ln2 + r with
 * |r| <= ln2/2 (ln2 split in two for an exact reduction), e^r by its degree-7
 * Taylor polynomial (error below 1e-8 on that interval), times 2^n built in
 * the exponent bits. Below -87.33 it returns 0 (no subnormal results); from
 * 88.376 up, where 2^n would need exponent 128, +inf; NaN gives NaN. */
#define DFL_EXP_LO -87.33654f
#define DFL_EXP_HI 88.37626f
#define DFL_LOG2E 1.44269504088896341f
#define DFL_LN2_HI 0.693145751953125f       /* 12 significant bits: n*hi is exact */
#define DFL_LN2_LO 1.42860682030941723e-6f
static const float dfl_exp_c[8] = {1.0f, 1.0f, 1.0f / 2, 1.0f / 6, 1.0f / 24, 1.0f / 120,
                                   1.0f / 720, 1.0f / 5040};

static inline float dfl_expf_ref(float x) {
    if (x != x) return x;
    if (x < DFL_EXP_LO) return 0.0f;
    if (x >= DFL_EXP_HI) return INFINITY;
    float n = rintf(x * DFL_LOG2E);
    float r = fmaf(n, -DFL_LN2_HI, x);
    r = fmaf(n, -DFL_LN2_LO, r);
    float p = dfl_exp_c[7];
    for (int i = 6; i >= 0; i--) p = fmaf(p, r, dfl_exp_c[i]);
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#if DFL_X86
static DFL_AVX2_INLINE __m256 dfl_expf8(__m256 x) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(DFL_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DFL_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-DFL_LN2_LO), r);
    __m256 p = _mm256_set1_ps(dfl_exp_c[7]);
    for (int i = 6; i >= 0; i--) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(dfl_exp_c[i]));
    /* Lanes outside [LO, HI) are replaced below, so their bits do not matter. */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(DFL_EXP_LO), _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY),
                         _mm256_cmp_ps(x, _mm256_set1_ps(DFL_EXP_HI), _CMP_GE_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

#endif

#endif
