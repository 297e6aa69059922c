/* convert.c - f16 / bf16 <-> f32, one value and one row at a time.
 * f32 -> f16 and f32 -> bf16 round to nearest even; NaN stays NaN (quieted),
 * f16 subnormals are exact both ways. The AVX2 row paths give the same bits
 * (F16C's converters implement the same rounding; the tests check all 65536
 * halves and random floats against the scalar forms). */
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/vec.h"

static float f32_of_bits(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t bits_of_f32(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

float dfl_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return f32_of_bits(sign | 0x7f800000 | (m << 13) | (m ? 0x400000 : 0));
    if (e) return f32_of_bits(sign | ((e + 112) << 23) | (m << 13));
    return f32_of_bits(sign | bits_of_f32((float)m * 0x1p-24f));   /* zero or subnormal: exact */
}

uint16_t dfl_f32_to_f16(float f) {
    uint32_t x = bits_of_f32(f), ax = x & 0x7fffffff;
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    if (ax > 0x7f800000) return sign | 0x7e00 | ((ax >> 13) & 0x3ff);   /* NaN */
    if (ax >= 0x477ff000) return sign | 0x7c00;      /* >= 65520 rounds to inf */
    if (ax >= 0x38800000) {                          /* normal half: rebias, round */
        uint32_t r = ax - 0x38000000;
        return sign | (uint16_t)((r + 0xfff + ((r >> 13) & 1)) >> 13);
    }
    /* Subnormal half: units of 2^-24; the scaling is exact, rintf rounds to even
     * (1024 lands on the smallest normal, which is the right bits). */
    return sign | (uint16_t)rintf(f32_of_bits(ax) * 0x1p24f);
}

float dfl_bf16_to_f32(uint16_t h) { return f32_of_bits((uint32_t)h << 16); }

uint16_t dfl_f32_to_bf16(float f) {
    uint32_t x = bits_of_f32(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* ---- rows ----------------------------------------------------------------- */

#if DFL_X86
DFL_AVX2 static void f16_to_f32_avx2(const uint16_t *s, float *d, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = dfl_f16_to_f32(s[i]);
}

DFL_AVX2 static void f32_to_f16_avx2(const float *s, uint16_t *d, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
                                                             _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = dfl_f32_to_f16(s[i]);
}

DFL_AVX2 static void bf16_to_f32_avx2(const uint16_t *s, float *d, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(v, 16));
    }
    for (; i < n; i++) d[i] = dfl_bf16_to_f32(s[i]);
}

DFL_AVX2 static void f32_to_bf16_avx2(const float *s, uint16_t *d, int n) {
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    const __m256i absm = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(x, 16), one)));
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, absm), inf);
        __m256i q = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));
        r = _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
        __m256i packed = _mm256_packus_epi32(r, r);   /* lanes 0-3 | 4-7 per 128-bit half */
        packed = _mm256_permute4x64_epi64(packed, 0x08);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(packed));
    }
    for (; i < n; i++) d[i] = dfl_f32_to_bf16(s[i]);
}

#endif

void dfl_dequant_row(dfl_type t, const void *src, float *dst, int cols) {
    const uint16_t *h = src;
    int f16 = t == DFL_F16;
    switch (t) {
    case DFL_F32: memcpy(dst, src, (size_t)cols * 4); return;
    case DFL_F16:
    case DFL_BF16:
#if DFL_X86
        if (dfl_kernels_simd()) {
            (f16 ? f16_to_f32_avx2 : bf16_to_f32_avx2)(h, dst, cols);
            return;
        }
#endif
        for (int i = 0; i < cols; i++) dst[i] = f16 ? dfl_f16_to_f32(h[i]) : dfl_bf16_to_f32(h[i]);
        return;
    default: dfl_qdequant_row(t, src, dst, cols); return;
    }
}

int dfl_quant_row(dfl_type t, const float *src, void *dst, int cols) {
    uint16_t *h = dst;
    int f16 = t == DFL_F16;
    switch (t) {
    case DFL_F32: memcpy(dst, src, (size_t)cols * 4); return 0;
    case DFL_F16:
    case DFL_BF16:
#if DFL_X86
        if (dfl_kernels_simd()) {
            (f16 ? f32_to_f16_avx2 : f32_to_bf16_avx2)(src, h, cols);
            return 0;
        }
#endif
        for (int i = 0; i < cols; i++) h[i] = f16 ? dfl_f32_to_f16(src[i]) : dfl_f32_to_bf16(src[i]);
        return 0;
    default: return dfl_qquant_row(t, src, dst, cols);
    }
}
