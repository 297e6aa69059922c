/* quant_avx512.c - AVX-512 (F/BW/VL + VNNI) matmul kernels for Q8_0, Q4_0,
 * Q4_1, Q4_K and Q6_K weights with several activation rows (verify blocks,
 * MoE expert groups); each does exactly the arithmetic of its twin in
 * quant.c, as the AVX2 ones in quant_avx2.c do. One row (decode, bound by
 * memory) of Q4_1 and the K-quants runs the AVX2 kernels: measured against
 * them (bench_quant, docs/benchmarks.md), a one-row Q4_K kernel (two
 * sub-blocks per zmm, vpdpwssd) ran 0.94-1.0x. Q8_0 and Q4_0 run one row
 * here too: the 16-output tile reads a 0.6B-shaped Q8_0 product 1.1-1.2x as
 * fast as AVX2's 8 (Zen 4).
 *
 * Q8_0 and Q4_0 (their twin adds one whole integer sum per block) put 16
 * outputs side by side in a zmm, below. For the others a zmm register holds the 8 lanes
 * of two activation rows: row i in the low 256 bits, row i+1 in the high.
 * The activation layout already serves this: within a group of dfl_qact.q
 * the rows' 32 quants of a block follow each other, so two rows are one
 * 64-byte load. The weight block is decoded once and broadcast to both
 * halves. Per pair of rows and 32 weights:
 *   Q4_1: vpdpbusd q . x, convert, one FMA; its mins one FMA a block for
 *         the 8 rows of a tile (as the AVX2 kernel);
 *   Q4_K, Q6_K: vpmaddubsw q . x, vpdpwssd by the sub-block scale into the
 *         super-block's integer sums (AVX2: maddubs, madd, add).
 * The integer lane sums are those of maddubs + madd (no saturation can
 * occur: |w|, |x| <= 128, q <= 63), and the float side is the twin's: one
 * FMA per lane and block in block order, the same horizontal tree. */
#include "kernels/kernels.h"
#if DFL_X86 /* the whole file: x86-64 only */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/quant_rows.h"

#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define INLINE                                                                                     \
    static inline                                                                                  \
        __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"), always_inline))

enum { PAIRS = DFL_QTILE / 2 };
enum { Q41, Q4K, Q6K }; /* the weight type of a tile */

/* Rows 2p, 2p+1 of a tile's block as one zmm (xb: the tile's [R][32] quants
 * of the block); an odd last row alone in the low half, zeros above. */
INLINE __m512i load_pair(const int R, const int8_t *xb, int p) {
    if (2 * p + 1 < R) return _mm512_loadu_si512(xb + 64 * p);
    return _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(xb + 64 * p)));
}

/* Row 2p's per-row value of v8 (8 rows) in the low 8 lanes, row 2p+1's in
 * the high 8: the scale of each lane. */
INLINE __m512 pair_scale(__m512 v8, int p) {
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(2 * p)), v8);
}

/* y of rows 2p (and 2p+1 if the tile has it): each half's hsum8, plus the
 * rows' sums of the mins m (Q4_1; else NULL). */
INLINE void store_pair(const int R, __m512 acc, int p, const float *m, float *y, int ldy) {
    /* no + 0 without mins: it would turn a -0 into +0 */
    float y0 = hsum8(_mm512_castps512_ps256(acc));
    y[(size_t)(2 * p) * ldy] = m ? y0 + m[0] : y0;
    if (2 * p + 1 < R) {
        float y1 = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
        y[(size_t)(2 * p + 1) * ldy] = m ? y1 + m[1] : y1;
    }
}

/* ---- one block of a tile ---------------------------------------------------
 * acc[p]: the 8 lanes of rows 2p, 2p+1; xb: the tile's quants of the block
 * ([R][32] per 32 weights); dxb: the rows' activation scales ([8]). */

/* Q4_1's 32 nibbles q of a block in both halves, unsigned, as vpdpbusd
 * takes them against the signed x: bytes 0-15 low, 16-31 high. */
INLINE __m512i nibbles32(const uint8_t *wb) {
    __m128i q = _mm_loadu_si128((const __m128i *)(wb + 4));
    __m256i q2 = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm512_and_si512(_mm512_broadcast_i64x4(q2), _mm512_set1_epi8(0xf));
}

/* Q4_1: per pair, vpdpbusd q by x, convert, FMA by dw * dx (8 rows'
 * products by one vmulps, spread to the pairs by vpermps); its mins: am +=
 * m * sx for the 8 rows (sxb). */
INLINE void block32(const int R, const uint8_t *wb, const int8_t *xb, const float *dxb,
                    const float *sxb, __m256 *am, __m512 *acc) {
    __m512i wv = nibbles32(wb);
    __m512 s = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(f16_load(wb)),
                                                    _mm256_load_ps(dxb)));
    *am = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(wb + 2)), _mm256_load_ps(sxb), *am);
#pragma GCC unroll 4
    for (int p = 0; p < (R + 1) / 2; p++) {
        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, load_pair(R, xb, p));
        acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), pair_scale(s, p), acc[p]);
    }
}

/* Q4_K and Q6_K: per pair and 32 quants, vpmaddubsw q . x and vpdpwssd by
 * the sub-block scale into the integer sums; then, as the twin, the
 * corrections from the sums of 16 quants (bsb: row 0's 16 of the block, ss
 * from a row to the next): Q6_K's -32 offset in the integers, Q4_K's mins
 * as a second FMA after the scaled sum. */
INLINE void block_k(const int q6, const int R, const uint8_t *wb, const int8_t *xb,
                    const int16_t *bsb, size_t ss, const float *dxb, __m512 *acc) {
    __m256i mins;
    __m128i sc8 = _mm_setzero_si128();
    __m512i sc = _mm512_setzero_si512(), corr;
    __m256 dx8 = _mm256_load_ps(dxb), dw = _mm256_set1_ps(f16_load(wb + (q6 ? 208 : 0)));
    __m512 sd = _mm512_castps256_ps512(_mm256_mul_ps(dw, dx8)), sm = sd;
    if (q6) {
        sc8 = _mm_loadu_si128((const __m128i *)(wb + 192));
        corr = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(sc8));
    } else {
        sc = _mm512_broadcast_i32x4(q4_K_scales(wb, &mins));
        corr = _mm512_broadcast_i64x4(mins);
        sm = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(f16_load(wb + 2)), dx8));
    }
    __m512i is[PAIRS];
#pragma GCC unroll 4
    for (int p = 0; p < (R + 1) / 2; p++) is[p] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++) {
        __m512i q, scv;
        if (q6) {
            q = _mm512_broadcast_i64x4(q6_K_quants(wb, v));
            scv = _mm512_broadcast_i64x4(q6_K_scale(sc8, v));
        } else {
            q = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(wb + 16 + 32 * (v / 2))));
            q = _mm512_and_si512(v & 1 ? _mm512_srli_epi16(q, 4) : q, _mm512_set1_epi8(0xf));
            scv = _mm512_shuffle_epi8(sc, _mm512_set1_epi16((short)(0x0100 + 0x0202 * v)));
        }
#pragma GCC unroll 4
        for (int p = 0; p < (R + 1) / 2; p++) {
            __m512i m = _mm512_maddubs_epi16(q, load_pair(R, xb + v * R * 32, p));
            is[p] = _mm512_dpwssd_epi32(is[p], m, scv);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < (R + 1) / 2; p++) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(bsb + 2 * p * ss));
        __m512i bs = 2 * p + 1 < R
            ? _mm512_inserti64x4(_mm512_castsi256_si512(b0),
                                 _mm256_loadu_si256((const __m256i *)(bsb + (2 * p + 1) * ss)), 1)
            : _mm512_zextsi256_si512(b0);
        __m512i c = _mm512_madd_epi16(corr, bs);
        if (q6) is[p] = _mm512_sub_epi32(is[p], _mm512_slli_epi32(c, 5));
        acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[p]), pair_scale(sd, p), acc[p]);
        if (!q6) acc[p] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(c), pair_scale(sm, p), acc[p]);
    }
}

/* ---- Q8_0 and Q4_0: 16 outputs side by side ----------------------------
 * The twin (dot_whole_ref) adds each block's exact integer sum with one FMA,
 * so a zmm holds 16 outputs. The 16 weight rows' block is transposed once
 * per tile (register k, lane j: row j's quants 4k..4k+3, unsigned as
 * vpdpbusd takes them: Q8_0's plus 128, Q4_0's nibbles q as they are) and
 * serves up to 16 activation rows: per row, 8 vpdpbusd by its quants
 * 4k..4k+3 (a broadcast memory operand), starting from -128 (Q4_0: -8) x
 * the block's quant sum (dfl_qact.xoff), then one convert, one multiply by
 * dw * dx and one FMA for the 16 outputs: 11 operations, where lanes of 8
 * spend 4 per pair of rows and output. */

enum { W8, W4 }; /* the weights of a whole-sum kernel: Q8_0, Q4_0 */

/* The 32 weights of blocks a and b (past their f16 scales) in the low and
 * high 256 bits: Q8_0's quants, or Q4_0's nibbles (each block's 16 bytes
 * into two 128-bit lanes, the second shifted down by 4). */
INLINE __m512i weights2(const int kind, const uint8_t *a, const uint8_t *b) {
    if (kind == W8)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                                  _mm256_loadu_si256((const __m256i *)b), 1);
    __m512i t = _mm512_castsi256_si512(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
        _mm_loadu_si128((const __m128i *)b), 1));
    t = _mm512_shuffle_i64x2(t, t, 0x50); /* a, a, b, b */
    t = _mm512_mask_srli_epi16(t, (__mmask32)0xff00ff00u, t, 4);
    return _mm512_and_si512(t, _mm512_set1_epi8(0xf));
}

/* The weights 2 bytes on from rows[j] + off (j < 16), transposed and
 * unsigned. */
INLINE void transpose16(const int kind, const uint8_t *const *rows, size_t off, __m512i *wt) {
    __m512i r[8], u[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) /* row j in the low 256 bits, row j + 8 in the high */
        r[j] = weights2(kind, rows[j] + off + 2, rows[j + 8] + off + 2);
    for (int j = 0; j < 8; j += 4) { /* per 128 bits: rows j..j+3 (+8), dwords k and k + 4 */
        __m512i a = _mm512_unpacklo_epi32(r[j], r[j + 1]), b = _mm512_unpackhi_epi32(r[j], r[j + 1]);
        __m512i c = _mm512_unpacklo_epi32(r[j + 2], r[j + 3]);
        __m512i d = _mm512_unpackhi_epi32(r[j + 2], r[j + 3]);
        u[j] = _mm512_unpacklo_epi64(a, c), u[j + 1] = _mm512_unpackhi_epi64(a, c);
        u[j + 2] = _mm512_unpacklo_epi64(b, d), u[j + 3] = _mm512_unpackhi_epi64(b, d);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i bias = _mm512_set1_epi8(kind == W8 ? (char)0x80 : 0);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        wt[k] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[k], lo, u[k + 4]), bias);
        wt[k + 4] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[k], hi, u[k + 4]), bias);
    }
}

/* The f16 scales at rows[j] + off (vo: the rows' offsets from rows[0]). */
INLINE __m512 scales16(const uint8_t *p, __m512i vo) {
    __m512i h = _mm512_i32gather_epi32(vo, (const int *)p, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(h, _mm512_set1_epi32(0xffff))));
}

/* R activation rows from r0 (r0 a multiple of 8: rows r0.. and r0+8.. are
 * two groups of dfl_qact.q) against the 16 weight rows: y[i * ldy + j] for
 * the no real ones. */
INLINE void tile_whole(const int kind, const int R, const uint8_t *const *rows, int no,
                       const uint16_t *sc, int nb, const dfl_qact *a, int r0, float *y, int ldy) {
    (void)sc; /* (W->sc is made for the AVX2 path only) */
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < R; i++) acc[i] = _mm512_setzero_ps();
    const int R0 = R < 8 ? R : 8;                    /* rows in the first group */
    const int8_t *x0 = dfl_qact_q(a, r0, 0);         /* [nb][R0][32] */
    const int8_t *x1 = R > 8 ? dfl_qact_q(a, r0 + 8, 0) : x0; /* [nb][R - 8][32] */
    const size_t d0 = dfl_qact_di(nb, r0, 0);        /* d and xoff: [nb][8] per group */
    const size_t d1 = R > 8 ? dfl_qact_di(nb, r0 + 8, 0) : d0;
    __m512i vo = _mm512_setzero_si512();
    for (int j = 1; j < 16; j++)
        vo = _mm512_mask_set1_epi32(vo, (__mmask16)(1u << j), row_off(rows, j));
    const size_t next = 16 * (size_t)row_off(rows, 1); /* the next 16 rows (as quant_avx2.c) */
    const size_t bb = kind == W8 ? sizeof(dfl_block_q8_0) : sizeof(dfl_block_q4_0);
    for (int b = 0; b < nb; b++) {
        size_t off = (size_t)b * bb;
        if (b % 2 == 0) /* a line of each next row per two blocks, into L2 (quant_avx2.c) */
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) _mm_prefetch((const char *)rows[j] + off + next, _MM_HINT_T1);
        __m512i wt[8];
        transpose16(kind, rows, off, wt);
        __m512 dw = scales16(rows[0] + off, vo);
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            const int8_t *xi = i < 8 ? x0 + ((size_t)b * R0 + i) * 32
                                     : x1 + ((size_t)b * (R - 8) + i - 8) * 32;
            size_t di = (i < 8 ? d0 + i : d1 + i - 8) + (size_t)b * 8;
            __m512i s = _mm512_set1_epi32(a->xoff[di]);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) s = _mm512_dpbusd_epi32(s, wt[k], _mm512_set1_epi32(quad(xi, k)));
            __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[di]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), sc, acc[i]);
        }
    }
    const __mmask16 m = (__mmask16)((1u << no) - 1);
#pragma GCC unroll 16
    for (int i = 0; i < R; i++) _mm512_mask_storeu_ps(y + (size_t)i * ldy, m, acc[i]);
}

/* ---- a tile: R rows from r0 (one group of dfl_qact.q) against weight row w */

INLINE void tile(const int kind, const int R, const uint8_t *w, const uint8_t *wn, int nb,
                 const dfl_qact *a, int r0, float *y, int ldy) {
    __m512 acc[PAIRS];
    __m256 am = _mm256_setzero_ps(); /* Q4_1: the rows' sums of the mins, 8 side by side */
#pragma GCC unroll 4
    for (int p = 0; p < (R + 1) / 2; p++) acc[p] = _mm512_setzero_ps();
    const int kq = kind == Q4K || kind == Q6K;
    const size_t ss = (size_t)a->cols / 16;
    const size_t bb = kind == Q41 ? sizeof(dfl_block_q4_1)
                    : kind == Q4K ? sizeof(dfl_block_q4_K) : sizeof(dfl_block_q6_K);
    const int8_t *x = dfl_qact_q(a, r0, 0);          /* [nb][R][blk] */
    const float *dx = a->d + dfl_qact_di(nb, r0, 0); /* [nb][8] */
    const float *sx = kind == Q41 ? a->s + dfl_qact_di(nb, r0, 0) : dx; /* [nb][8], Q4_1 */
    const int16_t *bsum = kq ? a->bsum + (size_t)r0 * ss : NULL;
    const ptrdiff_t ahead = wn - w; /* the next weight row, prefetched as this one runs */
    for (int b = 0; b < nb; b++, w += bb, x += (kq ? QK_K : 32) * R, dx += 8, sx += 8) {
        if (kq) {
            for (size_t l = 0; l < bb; l += 64) _mm_prefetch((const char *)w + ahead + l, _MM_HINT_T0);
            block_k(kind == Q6K, R, w, x, bsum + 16 * b, ss, dx, acc);
        } else {
            if (b % 2 == 0) _mm_prefetch((const char *)w + ahead, _MM_HINT_T0);
            block32(R, w, x, dx, sx, &am, acc);
        }
    }
    float M[8] __attribute__((aligned(32)));
    _mm256_store_ps(M, am);
#pragma GCC unroll 4
    for (int p = 0; p < (R + 1) / 2; p++)
        store_pair(R, acc[p], p, kind == Q41 ? M + 2 * p : NULL, y, ldy);
}

DFL_Q8ROWS(AVX512, rows_q8_0, 16, 16, tile_whole, W8, 0)
DFL_Q8ROWS(AVX512, rows_q4_0, 16, 16, tile_whole, W4, 0)
DFL_QROWS(AVX512, rows_q4_1, 32, tile, Q41)
DFL_QROWS(AVX512, rows_q4_K, QK_K, tile, Q4K)
DFL_QROWS(AVX512, rows_q6_K, QK_K, tile, Q6K)

int dfl_qrows_avx512(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                     int ldy) {
    switch (W->type) {
    case DFL_Q8_0: rows_q8_0(W, a, n, o0, o1, Y, ldy); return 1; /* (xoff: quant.c qact_quant) */
    case DFL_Q4_0: rows_q4_0(W, a, n, o0, o1, Y, ldy); return 1; /* (xoff: always on x86) */
    default: break;
    }
    if (n < 2) return 0;
    switch (W->type) {
    case DFL_Q4_1: rows_q4_1(W, a, n, o0, o1, Y, ldy); return 1;
    case DFL_Q4_K: rows_q4_K(W, a, n, o0, o1, Y, ldy); return 1;
    case DFL_Q6_K: rows_q6_K(W, a, n, o0, o1, Y, ldy); return 1;
    default: return 0;
    }
}

#endif
