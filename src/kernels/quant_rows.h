/* quant_rows.h - internal to quant_avx2.c / quant_avx512.c: what both
 * instruction sets share, a few block decoders and the loop over output
 * rows and activation tiles.
 *
 * Weight rows go in groups of about DFL_QGROUP_BYTES, and each tile of
 * activation rows runs over the whole group: the group comes from memory
 * once (first tile) and stays in L2 for the other tiles, while a tile's
 * activations (8 rows, one group of dfl_qact.q) stay in L1. The kernels of
 * Q8_0 and Q4_0 take 8 or 16 weight rows at once instead, and every activation tile runs
 * over them before the next 8 or 16 (DFL_Q8ROWS). Which rows share a tile
 * never changes a row's arithmetic. */
#ifndef DFL_QUANT_ROWS_H
#define DFL_QUANT_ROWS_H

#include <immintrin.h>
#include <string.h>

#include "kernels/quant.h"

/* AVX2 helpers; an AVX-512 function inlines them too (its target is a superset). */
#define DFL_QINLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

DFL_QINLINE float f16_load(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)): hsum8 in quant.c. */
DFL_QINLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The 8 scales of a Q4_K block as int16 (low 128 bits) and its 8 mins, each
 * twice, as int16 (the layout of q4k_scales in quant.c). */
DFL_QINLINE __m128i q4_K_scales(const uint8_t *p, __m256i *mins) {
    /* words s0 s1 s2 of the 12 bytes (the 4 after them are quants, unused) */
    __m128i v = _mm_loadu_si128((const __m128i *)(p + 4));
    __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x3f));                   /* sc_lo, mn_lo */
    __m128i s2 = _mm_shuffle_epi32(v, 0xaa);
    s2 = _mm_blend_epi32(s2, _mm_srli_epi32(s2, 4), 2); /* s2, s2 >> 4 */
    __m128i top = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(v, 6), _mm_set1_epi8(3)), 4);
    __m128i hi = _mm_or_si128(_mm_and_si128(s2, _mm_set1_epi8(0xf)), top); /* sc_hi, mn_hi */
    __m128i all = _mm_unpacklo_epi32(lo, hi); /* 8 scales, then 8 mins, as bytes */
    *mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(all, all));
    return _mm_cvtepu8_epi16(all);
}

/* Quant vector v (elements 32v..32v+31, unsigned 0..63) of a Q6_K super-block. */
DFL_QINLINE __m256i q6_K_quants(const uint8_t *p, int v) {
    int h = v / 4, g = v % 4;
    __m256i l = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32 * (g & 1)));
    __m256i hb = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
    __m256i lo = _mm256_and_si256(g < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(0xf));
    /* bits 2g, 2g+1 of qh to bits 4, 5 */
    __m256i hi = g == 0 ? _mm256_slli_epi16(hb, 4) : g == 1 ? _mm256_slli_epi16(hb, 2)
               : g == 2 ? hb : _mm256_srli_epi16(hb, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}

/* The multipliers of Q6_K quant vector v's madd lanes: scale 2v in the low
 * 128 bits, 2v+1 in the high. */
DFL_QINLINE __m256i q6_K_scale(__m128i sc8, int v) {
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
        sc8, _mm_set_epi64x(0x0101010101010101ll * (2 * v + 1), 0x0101010101010101ll * (2 * v))));
}

enum { DFL_QTILE = 8, DFL_QGROUP_BYTES = 96 << 10 };

/* name(W, a, n, o0, o1, Y, ldy) with attribute ATTR runs
 * TILE_FN(Q, R, w, wn, nb, a, r, y, ldy) for each weight row w (wn: the next
 * one to prefetch) and each tile of R rows from r, R a constant. */
#define DFL_QROWS(ATTR, name, blk, TILE_FN, Q)                                                     \
    ATTR static void name(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,    \
                          int ldy) {                                                               \
        int nb = W->cols / (blk), g = (int)(DFL_QGROUP_BYTES / W->row_bytes);                      \
        if (g < 1) g = 1;                                                                          \
        for (int g0 = o0; g0 < o1; g0 += g) {                                                      \
            int g1 = g0 + g < o1 ? g0 + g : o1;                                                    \
            for (int r = 0; r < n;) {                                                              \
                int rt = n - r < DFL_QTILE ? n - r : DFL_QTILE;                                    \
                for (int o = g0; o < g1; o++) {                                                    \
                    const uint8_t *w = W->data + (size_t)o * W->row_bytes;                         \
                    const uint8_t *wn = o + 1 < o1 ? w + W->row_bytes : w;                         \
                    float *y = Y + (size_t)r * ldy + o;                                            \
                    switch (rt) {                                                                  \
                    case 8: TILE_FN(Q, 8, w, wn, nb, a, r, y, ldy); break;                         \
                    case 7: TILE_FN(Q, 7, w, wn, nb, a, r, y, ldy); break;                         \
                    case 6: TILE_FN(Q, 6, w, wn, nb, a, r, y, ldy); break;                         \
                    case 5: TILE_FN(Q, 5, w, wn, nb, a, r, y, ldy); break;                         \
                    case 4: TILE_FN(Q, 4, w, wn, nb, a, r, y, ldy); break;                         \
                    case 3: TILE_FN(Q, 3, w, wn, nb, a, r, y, ldy); break;                         \
                    case 2: TILE_FN(Q, 2, w, wn, nb, a, r, y, ldy); break;                         \
                    case 1: TILE_FN(Q, 1, w, wn, nb, a, r, y, ldy); break;                         \
                    }                                                                              \
                }                                                                                  \
                r += rt;                                                                           \
            }                                                                                      \
        }                                                                                          \
    }

/* The first run of out rows of a task's rows o0..o1, fetched all at once: the
 * tiles prefetch the next run as they go, so only the first run came from
 * memory a line per miss, in the order the tile reads it. A task of a
 * one-row product is short (0.04 ms for 1024 x 1024 Q8_0 on 2 threads), and
 * that first run cost it about a tenth (Zen 3, AVX2, bench_quant). */
DFL_QINLINE void prime_rows(const dfl_mat *W, int o0, int o1, int out) {
    const char *p = (const char *)W->data + (size_t)o0 * W->row_bytes;
    size_t n = (size_t)(o1 - o0 < out ? o1 - o0 : out) * W->row_bytes;
    for (size_t l = 0; l < n; l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
}

/* name(W, a, n, o0, o1, Y, ldy) for Q8_0 and Q4_0, whose kernels put OUT outputs side
 * by side: TILE_FN(K, R, rows, no, sc, nb, a, r, y, ldy) for each run of OUT output
 * rows (rows: their pointers, the last real one repeated past o1; no: how
 * many are real; sc: their 8 first rows' scales in W->sc, or NULL) and each
 * tile of R <= RT activation rows from r, RT 8 or 16. o0 is a multiple of 8
 * (quant.c's tasks). PRIME: prime_rows first (measured on AVX2 only). */
#define DFL_Q8_CASE(R, F, K) case R: F(K, R, rows, no, sc, nb, a, r, y, ldy); break;
#define DFL_Q8_CASES8(F, K)                                                                        \
    DFL_Q8_CASE(1, F, K) DFL_Q8_CASE(2, F, K) DFL_Q8_CASE(3, F, K) DFL_Q8_CASE(4, F, K)            \
    DFL_Q8_CASE(5, F, K) DFL_Q8_CASE(6, F, K) DFL_Q8_CASE(7, F, K) DFL_Q8_CASE(8, F, K)
#define DFL_Q8_CASES16(F, K)                                                                       \
    DFL_Q8_CASES8(F, K) DFL_Q8_CASE(9, F, K) DFL_Q8_CASE(10, F, K) DFL_Q8_CASE(11, F, K)           \
    DFL_Q8_CASE(12, F, K) DFL_Q8_CASE(13, F, K) DFL_Q8_CASE(14, F, K) DFL_Q8_CASE(15, F, K)        \
    DFL_Q8_CASE(16, F, K)
#define DFL_Q8ROWS(ATTR, name, OUT, RT, TILE_FN, K, PRIME)                                         \
    ATTR static void name(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,    \
                          int ldy) {                                                               \
        int nb = W->cols / 32;                                                                     \
        if (PRIME && o0 < o1) prime_rows(W, o0, o1, OUT);                                          \
        for (int o = o0; o < o1; o += (OUT)) {                                                     \
            int no = o1 - o < (OUT) ? o1 - o : (OUT);                                              \
            const uint8_t *rows[OUT];                                                              \
            for (int j = 0; j < (OUT); j++)                                                        \
                rows[j] = W->data + (size_t)(o + (j < no ? j : no - 1)) * W->row_bytes;            \
            const uint16_t *sc = W->sc ? W->sc + (size_t)(o / 8) * nb * 8 : NULL;                  \
            for (int r = 0; r < n; r += (RT)) {                                                    \
                float *y = Y + (size_t)r * ldy + o;                                                \
                switch (n - r < (RT) ? n - r : (RT)) { DFL_Q8_CASES##RT(TILE_FN, K) }              \
            }                                                                                      \
        }                                                                                          \
    }

/* Byte offsets of rows[j] from rows[0] (within one matrix: they fit). */
DFL_QINLINE int row_off(const uint8_t *const *rows, int j) { return (int)(rows[j] - rows[0]); }

/* Quants 4k..4k+3 of an activation block as one 32-bit word (the callers broadcast it). */
DFL_QINLINE int32_t quad(const int8_t *x, int k) {
    int32_t v;
    memcpy(&v, x + 4 * k, 4);
    return v;
}

#endif
