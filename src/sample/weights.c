/* weights.c - the two passes over a whole vocabulary row that sampling needs
 * (first argmax, integer weights), each an AVX2 kernel beside its plain-C twin.
 * The twins are the definition; the kernels return the same bits. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "sample/sample.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

/* 2^f on [0, 1): least-squares polynomial with p(0) = 1 exactly, so the top
 * token's weight is exactly 2^40. Relative error about 1e-7 in float. */
#define C1 6.931470037e-01f
#define C2 2.402299941e-01f
#define C3 5.548260733e-02f
#define C4 9.680090472e-03f
#define C5 1.243118197e-03f
#define C6 2.172032109e-04f
#define LOG2E 1.442695041f

/* ---- first argmax ------------------------------------------------------- */

int dfl_sample_argmax_ref(const float *row, int n, float *max) {
    int best = 0;
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        if (row[i] > m) {
            m = row[i];
            best = i;
        }
    *max = m;
    return best;
}

#ifdef HAVE_X86
__attribute__((target("avx2"))) static int argmax_avx2(const float *row, int n, float *max) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int i = 0;
    /* max_ps returns its second operand when either is NaN: NaN never wins */
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(_mm256_loadu_ps(row + i), vm);
    float lanes[8];
    _mm256_storeu_ps(lanes, vm);
    float m = -INFINITY;
    for (int j = 0; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
    for (int j = i; j < n; j++) m = row[j] > m ? row[j] : m;
    *max = m;
    if (m == -INFINITY) return 0; /* as the twin: nothing beat -inf */
    __m256 vt = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), vt, _CMP_EQ_OQ));
        if (bits) return i + __builtin_ctz((unsigned)bits);
    }
    for (; i < n; i++)
        if (row[i] == m) return i;
    return 0;
}
#endif

int dfl_sample_argmax(const float *row, int n, float *max) {
#ifdef HAVE_X86
    if (dfl_cpu_has_avx2()) return argmax_avx2(row, n, max);
#endif
    return dfl_sample_argmax_ref(row, n, max);
}

/* ---- weights ------------------------------------------------------------ */

#define BSCALE (-(float)DFL_SAMPLE_BUCKETS / -DFL_SAMPLE_XMIN) /* x * BSCALE = -x * B/28 */

uint64_t dfl_sample_weight(float x) {
    if (!(x >= DFL_SAMPLE_XMIN)) return 0;
    float t = x * LOG2E;
    float k = floorf(t);
    float f = t - k;
    float p = C6;
    p = p * f + C5;
    p = p * f + C4;
    p = p * f + C3;
    p = p * f + C2;
    p = p * f + C1;
    p = p * f + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return (uint64_t)(p * scale * 0x1p40f);
}

static inline int bucket_of(float x) {
    if (!(x >= DFL_SAMPLE_XMIN)) return DFL_SAMPLE_BUCKETS - 1;
    int b = (int)(x * BSCALE);
    return b < DFL_SAMPLE_BUCKETS - 1 ? b : DFL_SAMPLE_BUCKETS - 1;
}

uint64_t dfl_sample_weights_ref(const float *row, int n, float m, float inv_t, uint64_t *w,
                                uint16_t *bucket, uint64_t *bsum) {
    uint64_t tot = 0;
    for (int i = 0; i < n; i++) {
        float x = (row[i] - m) * inv_t;
        w[i] = dfl_sample_weight(x);
        tot += w[i];
        if (bucket) bucket[i] = (uint16_t)bucket_of(x);
        if (bsum) {
            if (i % DFL_SAMPLE_BLOCK == 0) bsum[i / DFL_SAMPLE_BLOCK] = 0;
            bsum[i / DFL_SAMPLE_BLOCK] += w[i];
        }
    }
    return tot;
}

#ifdef HAVE_X86
/* Eight weights (and buckets) from row[0..8); returns their sum in 4 lanes.
 * No FMA on purpose: separate multiply and add round like the twin. */
__attribute__((target("avx2"), always_inline)) static inline __m256i
weights8(const float *row, __m256 vm, __m256 vit, uint64_t *w, uint16_t *bucket) {
    const __m256 xmin = _mm256_set1_ps(DFL_SAMPLE_XMIN);
    __m256 x = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(row), vm), vit);
    __m256 ok = _mm256_cmp_ps(x, xmin, _CMP_GE_OQ);
    __m256i oki = _mm256_castps_si256(ok);
    if (bucket) {
        const __m256i b_last = _mm256_set1_epi32(DFL_SAMPLE_BUCKETS - 1);
        __m256i b = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_and_ps(x, ok), _mm256_set1_ps(BSCALE)));
        b = _mm256_min_epi32(_mm256_blendv_epi8(b_last, b, oki), b_last);
        __m128i b16 = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
        _mm_storeu_si128((__m128i *)bucket, b16);
    }
    if (_mm256_movemask_ps(ok) == 0) { /* the common case far below the top */
        _mm256_storeu_si256((__m256i *)w, _mm256_setzero_si256());
        _mm256_storeu_si256((__m256i *)(w + 4), _mm256_setzero_si256());
        return _mm256_setzero_si256();
    }
    __m256 t = _mm256_mul_ps(_mm256_and_ps(x, ok), _mm256_set1_ps(LOG2E)); /* 0 where not ok */
    __m256 k = _mm256_floor_ps(t);
    __m256 f = _mm256_sub_ps(t, k);
    __m256 p = _mm256_set1_ps(C6);
    p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(C5));
    p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(C4));
    p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(C3));
    p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(C2));
    p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(C1));
    p = _mm256_add_ps(_mm256_mul_ps(p, f), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    __m256 v = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(0x1p40f));
    /* floor to int64 through double: exact below 2^52 */
    const __m256d magic = _mm256_set1_pd(0x1p52);
    __m256d lo = _mm256_floor_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    __m256d hi = _mm256_floor_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    __m256i wlo = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(lo, magic)), _mm256_castpd_si256(magic));
    __m256i whi = _mm256_sub_epi64(_mm256_castpd_si256(_mm256_add_pd(hi, magic)), _mm256_castpd_si256(magic));
    wlo = _mm256_and_si256(wlo, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(oki)));
    whi = _mm256_and_si256(whi, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(oki, 1)));
    _mm256_storeu_si256((__m256i *)w, wlo);
    _mm256_storeu_si256((__m256i *)(w + 4), whi);
    return _mm256_add_epi64(wlo, whi);
}

__attribute__((target("avx2"))) static uint64_t weights_avx2(const float *row, int n, float m,
                                                             float inv_t, uint64_t *w,
                                                             uint16_t *bucket, uint64_t *bsum) {
    const __m256 vm = _mm256_set1_ps(m), vit = _mm256_set1_ps(inv_t);
    const int nb = n / DFL_SAMPLE_BLOCK;
    uint64_t tot = 0;
    for (int blk = 0; blk < nb; blk++) {
        __m256i acc = _mm256_setzero_si256();
        for (int i = blk * DFL_SAMPLE_BLOCK; i < (blk + 1) * DFL_SAMPLE_BLOCK; i += 8)
            acc = _mm256_add_epi64(acc, weights8(row + i, vm, vit, w + i, bucket ? bucket + i : NULL));
        uint64_t lanes[4];
        _mm256_storeu_si256((__m256i *)lanes, acc);
        uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
        if (bsum) bsum[blk] = sum;
        tot += sum;
    }
    int i = nb * DFL_SAMPLE_BLOCK;
    if (i < n)
        tot += dfl_sample_weights_ref(row + i, n - i, m, inv_t, w + i, bucket ? bucket + i : NULL,
                                      bsum ? bsum + nb : NULL);
    return tot;
}
#endif

uint64_t dfl_sample_weights(const float *row, int n, float m, float inv_t, uint64_t *w,
                            uint16_t *bucket, uint64_t *bsum) {
#ifdef HAVE_X86
    if (dfl_cpu_has_avx2()) return weights_avx2(row, n, m, inv_t, w, bucket, bsum);
#endif
    return dfl_sample_weights_ref(row, n, m, inv_t, w, bucket, bsum);
}

/* ---- gather ------------------------------------------------------------- */

int dfl_sample_gather_ref(const uint16_t *bucket, const uint64_t *w, int n, int b_end,
                          int32_t *out) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (bucket[i] < b_end && w[i]) out[k++] = i;
    return k;
}

#ifdef HAVE_X86
/* Buckets are < 4096, so signed 16-bit compares are exact. */
__attribute__((target("avx2"))) static int gather_avx2(const uint16_t *bucket, const uint64_t *w,
                                                       int n, int b_end, int32_t *out) {
    const __m256i lim = _mm256_set1_epi16((int16_t)(b_end > 32767 ? 32767 : b_end));
    int k = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(bucket + i));
        unsigned bits = (unsigned)_mm256_movemask_epi8(_mm256_cmpgt_epi16(lim, b));
        while (bits) { /* two mask bits per 16-bit lane */
            int j = __builtin_ctz(bits) >> 1;
            bits &= bits - 1;
            bits &= bits - 1;
            if (w[i + j]) out[k++] = i + j;
        }
    }
    for (; i < n; i++)
        if (bucket[i] < b_end && w[i]) out[k++] = i;
    return k;
}
#endif

int dfl_sample_gather(const uint16_t *bucket, const uint64_t *w, int n, int b_end, int32_t *out) {
#ifdef HAVE_X86
    if (dfl_cpu_has_avx2()) return gather_avx2(bucket, w, n, b_end, out);
#endif
    return dfl_sample_gather_ref(bucket, w, n, b_end, out);
}
