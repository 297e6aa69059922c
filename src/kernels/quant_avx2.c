/* quant_avx2.c - AVX2 matmul kernels for the quantized weight types; each
 * does exactly the arithmetic of its twin in quant.c (see the comment there).
 *
 * A task owns a run of output rows. For each weight row, activation rows are
 * taken in register tiles of up to four: every weight block is decoded once
 * per tile and feeds all four accumulators, and the weight row stays in L1
 * for the later tiles, so the weights are read from memory once per call. */
#include <immintrin.h>
#include <string.h>

#include "kernels/quant.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

enum { TILE = 4 };

INLINE float f16_load(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)): hsum8 in quant.c. */
INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

INLINE __m256i loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- activations ------------------------------------------------------- */

/* 32 floats times id, rounded to even and clamped to [-127, 127] (maxps
 * first: a NaN becomes -127), as int8 in element order. */
INLINE __m256i round32(const float *x, __m256 id) {
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i v[4];
    for (int i = 0; i < 4; i++) {
        __m256 f = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(f, lo), hi));
    }
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 static void act_block(const float *x, int blk, int8_t *q, float *d) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < blk; i += 8) /* |x| first: a NaN |x| leaves m as it was */
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h), db = amax >= 0x1p-100f ? amax / 127 : 0.0f;
    float id = db != 0 ? 1.0f / db : 0.0f;
    *d = db;
    for (int i = 0; i < blk; i += 32)
        _mm256_storeu_si256((__m256i *)(q + i), round32(x + i, _mm256_set1_ps(id)));
}

AVX2 void dfl_qact_quant_avx2(dfl_qact *a, int n, const float *X, int ldx) {
    int blk = a->blk, nb = a->cols / blk;
    for (int r = 0; r < n; r++) {
        const float *x = X + (size_t)r * ldx;
        int8_t *q = a->q + (size_t)r * a->cols;
        for (int b = 0; b < nb; b++) act_block(x + b * blk, blk, q + b * blk, &a->d[(size_t)r * nb + b]);
        if (!a->bsum) continue;
        /* sums of 16: psadbw on the biased bytes gives sums of 8 */
        int16_t *bs = a->bsum + (size_t)r * (a->cols / 16);
        const __m256i bias = _mm256_set1_epi8((char)0x80);
        for (int i = 0; i < a->cols; i += 32) {
            __m256i s = _mm256_sad_epu8(_mm256_xor_si256(loadu(q + i), bias), _mm256_setzero_si256());
            int64_t e[4];
            memcpy(e, &s, sizeof e);
            bs[i / 16] = (int16_t)(e[0] + e[1] - 16 * 128);
            bs[i / 16 + 1] = (int16_t)(e[2] + e[3] - 16 * 128);
        }
    }
}

/* ---- Q8_0 and Q4_0: blocks of 32 against Q8 activation blocks of 32 ------ */

/* acc += (w . x per lane of 4) * s, with w . x = |w| . (x * sign(w)). */
INLINE __m256 acc32(__m256 acc, __m256i w, __m256i wabs, const int8_t *x, __m256 s) {
    __m256i xs = _mm256_sign_epi8(_mm256_load_si256((const __m256i *)x), w);
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xs), _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
}

INLINE __m256i q4_0_weights(const uint8_t *p) {
    __m128i q = _mm_loadu_si128((const __m128i *)(p + 2));
    __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0xf));
    return _mm256_sub_epi8(w, _mm256_set1_epi8(8));
}

/* R rows (R <= TILE, a constant after inlining) of weight row w. */
INLINE void tile32(int q4, const uint8_t *w, int nb, const dfl_qact *a, int r0, int R, float *y,
                   int ldy) {
    __m256 acc[TILE];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const int8_t *x = a->q + (size_t)r0 * a->cols;
    const float *xd = a->d + (size_t)r0 * nb;
    size_t bb = q4 ? sizeof(dfl_block_q4_0) : sizeof(dfl_block_q8_0);
    for (int b = 0; b < nb; b++, w += bb) {
        __m256i wq = q4 ? q4_0_weights(w) : loadu(w + 2);
        __m256i wabs = _mm256_sign_epi8(wq, wq);
        __m256 dw = _mm256_set1_ps(f16_load(w));
        for (int i = 0; i < R; i++)
            acc[i] = acc32(acc[i], wq, wabs, x + (size_t)i * a->cols + 32 * b,
                           _mm256_mul_ps(dw, _mm256_set1_ps(xd[(size_t)i * nb + b])));
    }
    for (int i = 0; i < R; i++) y[(size_t)i * ldy] = hsum8(acc[i]);
}

AVX2 static void rows_q8_0(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                           int ldy) {
    int nb = W->cols / 32;
    for (int o = o0; o < o1; o++) {
        const uint8_t *w = W->data + (size_t)o * W->row_bytes;
        int r = 0;
        for (; r + TILE <= n; r += TILE) tile32(0, w, nb, a, r, TILE, Y + (size_t)r * ldy + o, ldy);
        switch (n - r) {
        case 3: tile32(0, w, nb, a, r, 3, Y + (size_t)r * ldy + o, ldy); break;
        case 2: tile32(0, w, nb, a, r, 2, Y + (size_t)r * ldy + o, ldy); break;
        case 1: tile32(0, w, nb, a, r, 1, Y + (size_t)r * ldy + o, ldy); break;
        }
    }
}

AVX2 static void rows_q4_0(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                           int ldy) {
    int nb = W->cols / 32;
    for (int o = o0; o < o1; o++) {
        const uint8_t *w = W->data + (size_t)o * W->row_bytes;
        int r = 0;
        for (; r + TILE <= n; r += TILE) tile32(1, w, nb, a, r, TILE, Y + (size_t)r * ldy + o, ldy);
        switch (n - r) {
        case 3: tile32(1, w, nb, a, r, 3, Y + (size_t)r * ldy + o, ldy); break;
        case 2: tile32(1, w, nb, a, r, 2, Y + (size_t)r * ldy + o, ldy); break;
        case 1: tile32(1, w, nb, a, r, 1, Y + (size_t)r * ldy + o, ldy); break;
        }
    }
}

/* ---- K-quants: super-blocks of 256 against Q8 activation blocks of 256 --- */

/* A decoded super-block: quants as unsigned bytes in element order, 32 per
 * vector, and per vector the int16 scales that madd multiplies lanes by. */
typedef struct {
    __m256i q[8];
    __m256i sc[8];
    __m256i corr;   /* Q4_K: mins, each twice; Q6_K: the 16 scales */
    float d, dmin;
} kblock;

INLINE void decode_q4_K(const uint8_t *p, kblock *k) {
    k->d = f16_load(p);
    k->dmin = f16_load(p + 2);
    uint32_t s[3];
    memcpy(s, p + 4, 12);
    /* 8 scales then 8 mins as bytes (the layout of q4k_scales in quant.c) */
    uint32_t sc_lo = s[0] & 0x3f3f3f3f, mn_lo = s[1] & 0x3f3f3f3f;
    uint32_t sc_hi = (s[2] & 0x0f0f0f0f) | (s[0] >> 6 & 0x03030303) << 4;
    uint32_t mn_hi = (s[2] >> 4 & 0x0f0f0f0f) | (s[1] >> 6 & 0x03030303) << 4;
    __m128i sc16 = _mm_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, 0, 0));
    __m128i mn8 = _mm_setr_epi32((int)mn_lo, (int)mn_hi, 0, 0);
    k->corr = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
    __m256i sc2 = _mm256_broadcastsi128_si256(sc16);
    for (int j = 0; j < 8; j++)
        k->sc[j] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
    const __m256i m4 = _mm256_set1_epi8(0xf);
    for (int g = 0; g < 4; g++) {
        __m256i v = loadu(p + 16 + 32 * g);
        k->q[2 * g] = _mm256_and_si256(v, m4);
        k->q[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
}

INLINE void decode_q6_K(const uint8_t *p, kblock *k) {
    k->d = f16_load(p + 208);
    __m128i sc8 = _mm_loadu_si128((const __m128i *)(p + 192));
    k->corr = _mm256_cvtepi8_epi16(sc8);
    for (int v = 0; v < 8; v++) /* bytes sc[2v] x8, sc[2v+1] x8, widened */
        k->sc[v] = _mm256_cvtepi8_epi16(
            _mm_shuffle_epi8(sc8, _mm_setr_epi8(2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v, 2 * v,
                                                2 * v, 2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1,
                                                2 * v + 1, 2 * v + 1, 2 * v + 1, 2 * v + 1)));
    const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        __m256i l0 = loadu(p + 64 * h), l1 = loadu(p + 64 * h + 32), hb = loadu(p + 128 + 32 * h);
        k->q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                      _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        k->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                          _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        k->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                          _mm256_and_si256(hb, m30));
        k->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
    }
}

/* The integer part of one row against one super-block (see the twins). */
INLINE __m256i isum_k(const kblock *k, const int8_t *x) {
    __m256i s = _mm256_setzero_si256();
    for (int v = 0; v < 8; v++)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(
                                    k->q[v], _mm256_load_si256((const __m256i *)(x + 32 * v))),
                                k->sc[v]));
    return s;
}

INLINE void tile_k(int q6, const uint8_t *w, int nb, const dfl_qact *a, int r0, int R, float *y,
                   int ldy) {
    __m256 acc[TILE];
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    int cols = a->cols;
    for (int b = 0; b < nb; b++) {
        kblock k;
        if (q6)
            decode_q6_K(w + (size_t)b * sizeof(dfl_block_q6_K), &k);
        else
            decode_q4_K(w + (size_t)b * sizeof(dfl_block_q4_K), &k);
        for (int i = 0; i < R; i++) {
            size_t r = (size_t)r0 + i;
            __m256i is = isum_k(&k, a->q + r * cols + QK_K * b);
            __m256i c = _mm256_madd_epi16(k.corr, loadu(a->bsum + r * (cols / 16) + 16 * b));
            float dx = a->d[r * nb + b];
            if (q6) {
                is = _mm256_sub_epi32(is, _mm256_slli_epi32(c, 5));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(k.d * dx), acc[i]);
            } else {
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(k.d * dx), acc[i]);
                acc[i] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(k.dmin * dx), acc[i]);
            }
        }
    }
    for (int i = 0; i < R; i++) y[(size_t)i * ldy] = hsum8(acc[i]);
}

AVX2 static void rows_k(int q6, const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1,
                        float *Y, int ldy) {
    int nb = W->cols / QK_K;
    for (int o = o0; o < o1; o++) {
        const uint8_t *w = W->data + (size_t)o * W->row_bytes;
        int r = 0;
        for (; r + TILE <= n; r += TILE) tile_k(q6, w, nb, a, r, TILE, Y + (size_t)r * ldy + o, ldy);
        switch (n - r) {
        case 3: tile_k(q6, w, nb, a, r, 3, Y + (size_t)r * ldy + o, ldy); break;
        case 2: tile_k(q6, w, nb, a, r, 2, Y + (size_t)r * ldy + o, ldy); break;
        case 1: tile_k(q6, w, nb, a, r, 1, Y + (size_t)r * ldy + o, ldy); break;
        }
    }
}

AVX2 void dfl_qrows_avx2(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                         int ldy) {
    switch (W->type) {
    case DFL_Q8_0: rows_q8_0(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q4_0: rows_q4_0(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q4_K: rows_k(0, W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q6_K: rows_k(1, W, a, n, o0, o1, Y, ldy); break;
    default: break;
    }
}
