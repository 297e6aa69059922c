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

enum { TILE = 8 };

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
#pragma GCC unroll 4
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

/* ---- register tiles -------------------------------------------------------
 * A tile is R activation rows (R a constant after inlining, up to TILE)
 * against one weight row; for_tiles cuts n rows into tiles of TILE and one
 * remainder. Which rows share a tile never changes a row's arithmetic. */

#define CASE_R(R, CALL) \
    case R: CALL(R); break;
#define FOR_TILES(n, CALL)                                                                    \
    for (int r = 0; r < (n);) {                                                                \
        int rt = (n) - r < TILE ? (n) - r : TILE;                                              \
        switch (rt) {                                                                          \
            CASE_R(8, CALL) CASE_R(7, CALL) CASE_R(6, CALL) CASE_R(5, CALL) CASE_R(4, CALL)    \
            CASE_R(3, CALL) CASE_R(2, CALL) CASE_R(1, CALL)                                    \
        }                                                                                      \
        r += rt;                                                                               \
    }

/* ---- Q8_0 and Q4_0: blocks of 32 against activation blocks of 32 -------- */

INLINE __m256i q4_0_weights(const uint8_t *p) {
    __m128i q = _mm_loadu_si128((const __m128i *)(p + 2));
    __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0xf));
    return _mm256_sub_epi8(w, _mm256_set1_epi8(8));
}

/* Per block and row: acc += (w . x per lane of 4) * (dw * dx), with
 * w . x = |w| . (x * sign(w)) so maddubs gets an unsigned operand. */
INLINE void tile32(const int q4, const int R, const uint8_t *w, int nb, const dfl_qact *a, int r0,
                   float *y, int ldy) {
    __m256 acc[TILE];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const size_t xs = (size_t)a->cols, bb = q4 ? sizeof(dfl_block_q4_0) : sizeof(dfl_block_q8_0);
    const int8_t *x = a->q + (size_t)r0 * xs;
    const float *xd = a->d + (size_t)r0 * nb;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; b++, w += bb, x += 32, xd++) {
        __m256i wq = q4 ? q4_0_weights(w) : loadu(w + 2);
        __m256i wabs = _mm256_sign_epi8(wq, wq);
        __m256 dw = _mm256_set1_ps(f16_load(w));
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256i xsg = _mm256_sign_epi8(_mm256_load_si256((const __m256i *)(x + i * xs)), wq);
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xsg), ones);
            __m256 s = _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + (size_t)i * nb));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[i]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) y[(size_t)i * ldy] = hsum8(acc[i]);
}

#define ROWS32(name, q4)                                                                       \
    AVX2 static void name(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y, \
                          int ldy) {                                                           \
        int nb = W->cols / 32;                                                                 \
        for (int o = o0; o < o1; o++) {                                                        \
            const uint8_t *w = W->data + (size_t)o * W->row_bytes;                            \
            float *y = Y + o;                                                                  \
            FOR_TILES(n, CALL32)                                                               \
        }                                                                                      \
    }
#define CALL32(R) tile32(Q4, R, w, nb, a, r, y + (size_t)r * ldy, ldy)
#define Q4 0
ROWS32(rows_q8_0, 0)
#undef Q4
#define Q4 1
ROWS32(rows_q4_0, 1)
#undef Q4

/* ---- K-quants: super-blocks of 256 against activation blocks of 256 ----- */

/* A decoded super-block: quants as unsigned bytes in element order, 32 per
 * vector, and per vector the int16 scales that madd multiplies its lanes by. */
typedef struct {
    __m256i q[8];
    __m256i sc[8];
    __m256i corr;   /* Q4_K: the 8 mins, each twice; Q6_K: the 16 scales */
    __m256 d, dmin;
} kblock;

INLINE void decode_q4_K(const uint8_t *p, kblock *k) {
    k->d = _mm256_set1_ps(f16_load(p));
    k->dmin = _mm256_set1_ps(f16_load(p + 2));
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
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) /* int16 lane j everywhere */
        k->sc[j] = _mm256_shuffle_epi8(sc2, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
    const __m256i m4 = _mm256_set1_epi8(0xf);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        __m256i v = loadu(p + 16 + 32 * g);
        k->q[2 * g] = _mm256_and_si256(v, m4);
        k->q[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
}

INLINE void decode_q6_K(const uint8_t *p, kblock *k) {
    k->d = _mm256_set1_ps(f16_load(p + 208));
    __m128i sc8 = _mm_loadu_si128((const __m128i *)(p + 192));
    k->corr = _mm256_cvtepi8_epi16(sc8);
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++) /* bytes sc[2v] x8 then sc[2v+1] x8, widened */
        k->sc[v] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
            sc8, _mm_set_epi64x(0x0101010101010101ll * (2 * v + 1), 0x0101010101010101ll * (2 * v))));
    const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
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

/* The integer sums of one row against one super-block (see the twins):
 * lane k of sum_v madd(maddubs(q_v, x_v), sc_v). */
INLINE __m256i isum_k(const kblock *k, const int8_t *x) {
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++)
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(
                                    k->q[v], _mm256_load_si256((const __m256i *)(x + 32 * v))),
                                k->sc[v]));
    return s;
}

INLINE void tile_k(const int q6, const int R, const uint8_t *w, int nb, const dfl_qact *a, int r0,
                   float *y, int ldy) {
    __m256 acc[TILE];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const size_t xs = (size_t)a->cols, ss = xs / 16;
    const size_t bb = q6 ? sizeof(dfl_block_q6_K) : sizeof(dfl_block_q4_K);
    const int8_t *x = a->q + (size_t)r0 * xs;
    const int16_t *bsum = a->bsum + (size_t)r0 * ss;
    const float *xd = a->d + (size_t)r0 * nb;
    for (int b = 0; b < nb; b++, w += bb, x += QK_K, bsum += 16, xd++) {
        kblock k;
        if (q6)
            decode_q6_K(w, &k);
        else
            decode_q4_K(w, &k);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256i is = isum_k(&k, x + i * xs);
            __m256i c = _mm256_madd_epi16(k.corr, loadu(bsum + i * ss));
            __m256 dx = _mm256_broadcast_ss(xd + (size_t)i * nb);
            if (q6) {
                is = _mm256_sub_epi32(is, _mm256_slli_epi32(c, 5));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(k.d, dx), acc[i]);
            } else {
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(k.d, dx), acc[i]);
                acc[i] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(c), _mm256_mul_ps(k.dmin, dx), acc[i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) y[(size_t)i * ldy] = hsum8(acc[i]);
}

#define ROWSK(name, q6)                                                                        \
    AVX2 static void name(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y, \
                          int ldy) {                                                           \
        int nb = W->cols / QK_K;                                                               \
        for (int o = o0; o < o1; o++) {                                                        \
            const uint8_t *w = W->data + (size_t)o * W->row_bytes;                            \
            float *y = Y + o;                                                                  \
            FOR_TILES(n, CALLK)                                                                \
        }                                                                                      \
    }
#define CALLK(R) tile_k(Q6, R, w, nb, a, r, y + (size_t)r * ldy, ldy)
#define Q6 0
ROWSK(rows_q4_K, 0)
#undef Q6
#define Q6 1
ROWSK(rows_q6_K, 1)
#undef Q6

AVX2 void dfl_qrows_avx2(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                         int ldy) {
    switch (W->type) {
    case DFL_Q8_0: rows_q8_0(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q4_0: rows_q4_0(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q4_K: rows_q4_K(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q6_K: rows_q6_K(W, a, n, o0, o1, Y, ldy); break;
    default: break;
    }
}
