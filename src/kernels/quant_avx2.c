/* quant_avx2.c - AVX2 matmul kernels for the quantized weight types; each
 * does exactly the arithmetic of its twin in quant.c (see the comment there).
 *
 * A task owns a run of output rows. For each weight row (Q8_0: each run of
 * 8), activation rows go in register tiles of up to 8: each weight block is
 * decoded once per tile and feeds the tile's rows, and the weight row stays
 * in L1 for the later tiles, so the weights are read from memory once per
 * call.
 *
 * What bounds the speed here (Zen 3, no VNNI): integer multiplies (maddubs,
 * madd) and FMAs share two pipes. So per row and 32 weights the Q4_1
 * kernel spends maddubs + madd + one FMA, with the scale product dw*dx (and
 * its min term) formed once per block for all 8 rows of a tile (the
 * activation scales are stored 8 rows side by side for this); the K-quant
 * kernels spend maddubs + madd (which applies the sub-block scale) and keep
 * integer sums in registers across the whole super-block. The twins of
 * Q8_0 and Q4_0 add one whole integer sum per block, so their kernel holds
 * 8 outputs side by side and spends one FMA per row and block for all 8. */
#include "kernels/kernels.h"
#if DFL_X86 /* the whole file: x86-64 only */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/quant_rows.h"

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* TILE: activation rows per register tile. AHEAD: prefetch distance of the
 * one-row (decode) loops, in bytes of weights; without it they read about
 * 60% of the bandwidth on Zen 3. */
enum { TILE = DFL_QTILE, AHEAD = 2048 };

INLINE __m256i loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE __m256i load(const void *p) { return _mm256_load_si256((const __m256i *)p); }

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

/* One block of blk values: its scale (returned) and quants, each 32 of them
 * qs bytes after the last (the layout of dfl_qact.q). */
AVX2 static float act_block(const float *x, int blk, int8_t *q, size_t qs) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < blk; i += 8) /* |x| first: a NaN |x| leaves m as it was */
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h), d = amax >= 0x1p-100f ? amax / 127 : 0.0f;
    __m256 id = _mm256_set1_ps(d != 0 ? 1.0f / d : 0.0f);
    for (int i = 0; i < blk; i += 32, q += qs)
        _mm256_storeu_si256((__m256i *)q, round32(x + i, id));
    return d;
}

/* The sums of quants 0-15 and 16-31 of q: psadbw on the biased bytes gives
 * sums of 8. */
INLINE void sums16(const int8_t *q, int s[2]) {
    __m256i v = _mm256_xor_si256(loadu(q), _mm256_set1_epi8((char)0x80));
    __m256i t = _mm256_sad_epu8(v, _mm256_setzero_si256());
    int64_t e[4];
    memcpy(e, &t, sizeof e);
    s[0] = (int)(e[0] + e[1] - 16 * 128);
    s[1] = (int)(e[2] + e[3] - 16 * 128);
}

AVX2 void dfl_qact_quant_avx2(dfl_qact *a, int n, const float *X, int ldx) {
    int blk = a->blk, nb = a->cols / blk;
    for (int r = 0; r < n; r++) {
        const float *x = X + (size_t)r * ldx;
        const size_t qs = (size_t)32 * dfl_qact_group(a, r); /* from one 32 quants to the next */
        int8_t *q = dfl_qact_q(a, r, 0);
        for (int b = 0; b < nb; b++) {
            size_t di = dfl_qact_di(nb, r, b);
            a->d[di] = act_block(x + b * blk, blk, q + b * (blk / 32) * qs, qs);
            if (a->s) { /* Q4_1: blocks of 32 */
                int s[2];
                sums16(q + b * qs, s);
                a->s[di] = a->d[di] * (float)(s[0] + s[1]);
            }
        }
        if (!a->bsum) continue;
        int16_t *bs = a->bsum + (size_t)r * (a->cols / 16);
        for (int i = 0; i < a->cols; i += 32) {
            int s[2];
            sums16(q + i / 32 * qs, s);
            bs[i / 16] = (int16_t)s[0];
            bs[i / 16 + 1] = (int16_t)s[1];
        }
    }
    for (int r = n; r % 8; r++) /* the unused lanes of the last group of 8 */
        for (int b = 0; b < nb; b++) {
            a->d[dfl_qact_di(nb, r, b)] = 0;
            if (a->s) a->s[dfl_qact_di(nb, r, b)] = 0;
        }
}

/* ---- register tiles -------------------------------------------------------
 * A tile is R activation rows r0.. (r0 a multiple of 8, R a constant after
 * inlining) against one weight row (Q8_0: eight); n rows are cut into tiles of 8 and one
 * remainder. Which rows share a tile never changes a row's arithmetic. */

/* ---- Q8_0 and Q4_0: 8 outputs side by side ------------------------------
 * The twin (dot_whole_ref) adds each block's exact integer sum with one FMA,
 * so a ymm holds 8 outputs. The 8 weight rows' block is transposed once per
 * tile (register k, lane j: row j's quants 4k..4k+3) and serves every
 * activation row of the tile, whose quants 4k..4k+3 are broadcast: per k,
 * maddubs, madd, add; then one convert and one FMA by dw * dx for all 8
 * outputs. Q8_0's signed weights enter maddubs as |w| . (x * sign(w)), one
 * vpsignb more; Q4_0's nibbles q enter unsigned, and the sum starts from
 * -8 x the block's quant sum (dfl_qact.xoff). So Q8_0 spends 35 operations
 * per row and block for 8 outputs (sign, maddubs, madd, convert, FMA per
 * output in lanes: 40), plus 32 per block and tile to transpose; a lone
 * row skips the transpose. */

enum { W8, W4 }; /* the weights of a whole-sum kernel: Q8_0, Q4_0 */

INLINE size_t whole_bytes(const int kind) {
    return kind == W8 ? sizeof(dfl_block_q8_0) : sizeof(dfl_block_q4_0);
}

/* The 32 nibbles of a Q4_0 / Q4_1 block (qs: its 16 bytes) as unsigned
 * bytes, in element order. */
INLINE __m256i q4_nibbles(const uint8_t *qs) {
    __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs)); /* one load */
    q = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(q, _mm256_set1_epi8(0xf));
}

/* A block's 32 weights (wb: past its f16 scale) in element order: Q8_0's
 * signed quants or Q4_0's unsigned nibbles. */
INLINE __m256i whole32(const int kind, const uint8_t *wb) {
    return kind == W8 ? loadu(wb) : q4_nibbles(wb);
}

/* The weights of rows[j] + off (j < 8) transposed: ws[k] lane j = row j's
 * quants 4k..4k+3; wu[k] what maddubs takes unsigned: |ws[k]| (Q8_0) or
 * ws[k] itself (Q4_0). */
INLINE void transpose8(const int kind, const uint8_t *const *rows, size_t off, __m256i *ws,
                       __m256i *wu) {
    __m256i r[8], u[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) r[j] = whole32(kind, rows[j] + off);
    for (int j = 0; j < 8; j += 4) { /* per 128-bit half: rows j..j+3, dwords k and k + 4 */
        __m256i a = _mm256_unpacklo_epi32(r[j], r[j + 1]), b = _mm256_unpackhi_epi32(r[j], r[j + 1]);
        __m256i c = _mm256_unpacklo_epi32(r[j + 2], r[j + 3]);
        __m256i d = _mm256_unpackhi_epi32(r[j + 2], r[j + 3]);
        u[j] = _mm256_unpacklo_epi64(a, c), u[j + 1] = _mm256_unpackhi_epi64(a, c);
        u[j + 2] = _mm256_unpacklo_epi64(b, d), u[j + 3] = _mm256_unpackhi_epi64(b, d);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        ws[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        ws[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) wu[k] = kind == W8 ? _mm256_sign_epi8(ws[k], ws[k]) : ws[k];
}

/* The f16 scales at rows[j] + off (vo: the rows' offsets from rows[0]), by
 * a gather. Tiles of several rows load them from W->sc instead: on Zen 3
 * the gather made products of 2 rows 15-20% slower and of 4 rows 6-10%
 * (bench_quant). A lone row, bound by memory, gathers: the 6% more bytes of
 * W->sc cost it more than the gather. */
INLINE __m256 scales8(const uint8_t *p, __m256i vo) {
    __m256i h = _mm256_and_si256(_mm256_i32gather_epi32((const int *)p, vo, 1),
                                 _mm256_set1_epi32(0xffff));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(h),
                                            _mm256_extracti128_si256(h, 1)));
}

/* Lane j: the sum of p[j]'s 8 lanes (integers: exact in any order), by 14
 * shuffles and 7 adds. */
INLINE __m256i sum8(const __m256i *p) {
    __m256i t[4], u[2];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        t[j] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * j], p[2 * j + 1]),
                                _mm256_unpackhi_epi32(p[2 * j], p[2 * j + 1]));
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) /* per 128 bits: rows 4j..4j+3, half their lanes */
        u[j] = _mm256_add_epi32(_mm256_unpacklo_epi64(t[2 * j], t[2 * j + 1]),
                                _mm256_unpackhi_epi64(t[2 * j], t[2 * j + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(u[0], u[1], 0x20),
                            _mm256_permute2x128_si256(u[0], u[1], 0x31));
}

/* The 8 rows' sums of one block against one activation row's x (without
 * Q4_0's offset): per lane of 4 for each row, then sum8. With a single
 * activation row this beats transposing (14 shuffles, not 24). */
INLINE __m256i block_sums1(const int kind, const uint8_t *const *rows, size_t off, __m256i xv) {
    __m256i p[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        __m256i w = whole32(kind, rows[j] + off);
        __m256i m = kind == W8
            ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w))
            : _mm256_maddubs_epi16(w, xv);
        p[j] = _mm256_madd_epi16(m, _mm256_set1_epi16(1));
    }
    return sum8(p);
}

/* One block of 8 transposed weight rows (ws, and wu what maddubs takes
 * unsigned; dw their scales) into acc[i] for R activation rows x ([R][32],
 * dx their scales, xo Q4_0's offsets): the tiles of both layouts. */
INLINE void block_rows(const int kind, const int R, const __m256i *ws, const __m256i *wu,
                       __m256 dw, const int8_t *x, const float *dx, const int32_t *xo,
                       __m256 *acc) {
    const __m256i one = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        __m256i s = kind == W4 ? _mm256_set1_epi32(xo[i]) : _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i p = _mm256_set1_epi32(quad(x + 32 * i, k));
            if (kind == W8) p = _mm256_sign_epi8(p, ws[k]);
            s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(wu[k], p), one));
        }
        __m256 dwx = _mm256_mul_ps(dw, _mm256_broadcast_ss(dx + i));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dwx, acc[i]);
    }
}

/* R activation rows from r0 (one group of dfl_qact.q) against the 8 weight
 * rows (sc: their scales, [nb][8], or NULL): y[i * ldy + j] for the no real
 * ones. */
INLINE void tile_whole(const int kind, const int R, const uint8_t *const *rows, int no,
                       const uint16_t *sc, int nb, const dfl_qact *a, int r0, float *y, int ldy) {
    __m256 acc[TILE];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const int8_t *x = dfl_qact_q(a, r0, 0);          /* [nb][R][32] */
    const float *dx = a->d + dfl_qact_di(nb, r0, 0); /* [nb][8] */
    const int32_t *xo = kind == W4 ? a->xoff + dfl_qact_di(nb, r0, 0) : NULL; /* [nb][8] */
    const __m256i vo = _mm256_setr_epi32(0, row_off(rows, 1), row_off(rows, 2), row_off(rows, 3),
                                         row_off(rows, 4), row_off(rows, 5), row_off(rows, 6),
                                         row_off(rows, 7));
    const size_t next = 8 * (size_t)row_off(rows, 1), bb = whole_bytes(kind);
    for (int b = 0; b < nb; b++, x += 32 * R, dx += 8, xo = xo ? xo + 8 : xo) {
        size_t off = (size_t)b * bb;
        /* a line of each of the next 8 rows (8 row lengths on) per two blocks: Q4_0's
         * 36 bytes too, as at 72 some lines went unfetched (decode read 45% of the
         * bandwidth, not 80%). Into L2, not L1: the next rows' lines in L1 evicted
         * the lines being read (the AVX-512 tile's 16 rows, 17 KB each way at
         * 0.6B's 1024 columns): a one-row Q8_0 product read 23 GB/s, now 40 (Zen 4).
         * The last block fetches each row's last line: at Q8_0's 68 bytes a turn the
         * turns stop a line short of a 1024-column row's 17 (Zen 3: the line left to
         * the hardware made those products 12-18% slower, bench_quant). */
        if (b % 2 == 0 || b == nb - 1) {
            size_t at = off + next + (b == nb - 1 ? bb - 1 : 0);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) _mm_prefetch((const char *)rows[j] + at, _MM_HINT_T1);
        }
        __m256 dw = R > 1 && sc ? _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sc + 8 * b)))
                                : scales8(rows[0] + off, vo);
        if (R == 1) {
            __m256 dwx = _mm256_mul_ps(dw, _mm256_broadcast_ss(dx));
            __m256i s = block_sums1(kind, rows, off + 2, load(x));
            if (kind == W4) s = _mm256_add_epi32(s, _mm256_set1_epi32(xo[0]));
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dwx, acc[0]);
            continue;
        }
        __m256i ws[8], wu[8];
        transpose8(kind, rows, off + 2, ws, wu);
        block_rows(kind, R, ws, wu, dw, x, dx, xo, acc);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        if (no == 8) {
            _mm256_storeu_ps(y + (size_t)i * ldy, acc[i]);
        } else {
            float t[8];
            _mm256_storeu_ps(t, acc[i]);
            memcpy(y + (size_t)i * ldy, t, sizeof(float) * (size_t)no);
        }
    }
}

/* ---- Q8_0 in the il8 layout (kernels.h): each block of 8 rows as it lies --- */

enum { IL8_BLOCK = 8 * 34,       /* bytes of a group's block: 8 scales, 8 x 8 quads */
       IL8_AHEAD = 8 * IL8_BLOCK };

/* tile_whole's arithmetic (W8) over a group g of 8 rows in the il8 layout:
 * the transposed quads come in 8 loads, not 8 loads and 24 shuffles, so a
 * lone row takes this path too (the same bytes, in order). */
INLINE void tile_il8(const int R, const uint8_t *g, int nb, const dfl_qact *a, int r0, float *y,
                     int ldy) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const int8_t *x = dfl_qact_q(a, r0, 0);          /* [nb][R][32] */
    const float *dx = a->d + dfl_qact_di(nb, r0, 0); /* [nb][8] */
    for (int b = 0; b < nb; b++, g += IL8_BLOCK, x += 32 * R, dx += 8) {
        /* the group's bytes are one stream: fetched 8 blocks ahead, a lone row
         * read 36-38 GB/s, not 32 (Zen 3, bench_quant; 4 rows 12% faster) */
        for (int l = 0; l < IL8_BLOCK; l += 64)
            _mm_prefetch((const char *)g + IL8_AHEAD + l, _MM_HINT_T0);
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));
        __m256i ws[8], wu[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            ws[k] = loadu(g + 16 + 32 * k);
            wu[k] = _mm256_sign_epi8(ws[k], ws[k]);
        }
        block_rows(W8, R, ws, wu, dw, x, dx, NULL, acc);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) _mm256_storeu_ps(y + (size_t)i * ldy, acc[i]);
}

#define IL8_CASE(R) case R: tile_il8(R, g, nb, a, r, Y + (size_t)r * ldy + o, ldy); break;

/* Output rows [o0, o1) (multiples of 8: whole groups) of an il8 matrix. */
AVX2 static void rows_q8_0_il8(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1,
                               float *Y, int ldy) {
    int nb = W->cols / 32;
    if (o0 < o1) prime_rows(W, o0, o1, 8);
    for (int o = o0; o < o1; o += 8) {
        const uint8_t *g = W->data + (size_t)(o / 8) * nb * IL8_BLOCK;
        for (int r = 0; r < n; r += 8) {
            switch (n - r < 8 ? n - r : 8) {
                IL8_CASE(1) IL8_CASE(2) IL8_CASE(3) IL8_CASE(4)
                IL8_CASE(5) IL8_CASE(6) IL8_CASE(7) IL8_CASE(8)
            }
        }
    }
}

/* ---- Q4_1: blocks of 32 against activation blocks of 32 ----------------- */

/* The integer lanes of one row against one block: q . x with the unsigned
 * nibbles q straight into maddubs (the mins go separately, see scales32). */
INLINE __m256i lanes32(__m256i wu, const int8_t *x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wu, load(x)), _mm256_set1_epi16(1));
}

/* The scale products dw * dx of weight block wb for the 8 rows of a tile;
 * also adds the block's min times the rows' sums (sxb) to am, the rows'
 * sums of the mins (8 rows side by side), in block order. */
INLINE void scales32(float *S, const uint8_t *wb, const float *dxb, const float *sxb, __m256 *am) {
    uint16_t h;
    memcpy(&h, wb, 2);
    __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16((short)h));
    _mm256_store_ps(S, _mm256_mul_ps(dw, _mm256_load_ps(dxb)));
    memcpy(&h, wb + 2, 2);
    __m256 m = _mm256_cvtph_ps(_mm_set1_epi16((short)h));
    *am = _mm256_fmadd_ps(m, _mm256_load_ps(sxb), *am);
}

/* Row i's scale product as a vector, from s03 / s47 (rows 0-3 / 4-7, each
 * 4 products twice) by an in-lane shuffle, or with 1-2 rows from s. */
INLINE __m256 row_scale(const int R, __m256 s03, __m256 s47, const float *s, int i) {
    if (R <= 2) return _mm256_broadcast_ss(s + i);
    __m256 v = i < 4 ? s03 : s47;
    switch (i % 4) { /* immediates written out: an unoptimized build does not fold i */
    case 0: return _mm256_shuffle_ps(v, v, 0x00);
    case 1: return _mm256_shuffle_ps(v, v, 0x55);
    case 2: return _mm256_shuffle_ps(v, v, 0xaa);
    default: return _mm256_shuffle_ps(v, v, 0xff);
    }
}

/* One block of a tile: wb the weight block, pf an address to prefetch (or
 * NULL), xb the R rows' quants of the block ([R][32]), s the scale products.
 *
 * Here every instruction costs about alike, loads included: dropping any
 * one of the 7 per row and block gains ~20%. So the scale products are
 * broadcast by shuffles of s03 / s47 (two loads a block instead of one a
 * row; with 1-2 rows the two cost more than they save), and the asm keeps
 * gcc from folding the shuffles back into broadcast loads. */
INLINE void block32(const int R, const uint8_t *wb, const uint8_t *pf, const int8_t *xb,
                    const float *s, __m256 *acc) {
    if (pf) _mm_prefetch((const char *)pf, _MM_HINT_T0);
    __m256i wu = q4_nibbles(wb + 4);
    __m256 s03 = _mm256_broadcast_ps((const __m128 *)s);
    __m256 s47 = _mm256_broadcast_ps((const __m128 *)(s + 4));
    if (R > 2) __asm__("" : "+x"(s03), "+x"(s47));
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        __m256i p = lanes32(wu, xb + i * 32);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), row_scale(R, s03, s47, s, i), acc[i]);
    }
}

/* Per block and row: acc += (w . x per lane of 4) * (dw * dx). The products
 * dw * dx of the next block are formed while this one runs, 8 rows per
 * vmulps, and stored in a ring of two: a block of lead time keeps the
 * store-to-load forwarding off the critical path. wn is the next weight row,
 * prefetched a line per two blocks: with several rows the
 * loop is compute bound, so the hardware prefetcher alone leaves the first
 * tile of a group waiting on memory. The loop walks pointers and has no
 * spare-slot branch: with indices gcc spent ~17 instructions a block on
 * bookkeeping. The mins cost one FMA a block for all rows (scales32). */
INLINE void tile32(const int Q, const int R, const uint8_t *w, const uint8_t *wn, int nb,
                   const dfl_qact *a, int r0, float *y, int ldy) {
    (void)Q;
    __m256 acc[TILE], am = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const size_t bb = sizeof(dfl_block_q4_1);
    const int8_t *x = dfl_qact_q(a, r0, 0); /* [nb][R][32] (the tile is a group of dfl_qact.q) */
    const float *dx = a->d + dfl_qact_di(nb, r0, 0); /* [nb][8] */
    const float *sx = a->s + dfl_qact_di(nb, r0, 0); /* [nb][8] */
    if (R == 1) { /* one row: its scale product is one scalar multiply */
        float am1 = 0;
        for (int b = 0; b < nb; b++, w += bb, x += 32, dx += 8, sx += 8) {
            /* memory bound: the weights AHEAD bytes on (rows are contiguous;
             * past the matrix the hint is dropped) */
            _mm_prefetch((const char *)((uintptr_t)w + AHEAD), _MM_HINT_T0);
            __m256i p = lanes32(q4_nibbles(w + 4), x);
            __m256 sc = _mm256_set1_ps(f16_load(w) * dx[0]);
            acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[0]);
            am1 = fmaf(f16_load(w + 2), sx[0], am1);
        }
        y[0] = hsum8(acc[0]) + am1;
        return;
    }
    const ptrdiff_t ahead = wn - w;
    float S[2][8] __attribute__((aligned(32)));
    scales32(S[0], w, dx, sx, &am);
    for (int k = 0; k < (nb - 1) / 2; k++) { /* two blocks a turn, one or two left after */
        float *s = S[0];
        __asm__("" : "+r"(s)); /* else gcc keeps all 16 slot addresses, spilled */
        scales32(s + 8, w + bb, dx + 8, sx + 8, &am);
        block32(R, w, w + ahead, x, s, acc);
        scales32(s, w + 2 * bb, dx + 16, sx + 16, &am);
        block32(R, w + bb, NULL, x + 32 * R, s + 8, acc);
        w += 2 * bb, x += 64 * R, dx += 16, sx += 16;
    }
    if (nb % 2 == 0) {
        scales32(S[1], w + bb, dx + 8, sx + 8, &am);
        block32(R, w, w + ahead, x, S[0], acc);
        block32(R, w + bb, w + bb + ahead, x + 32 * R, S[1], acc);
    } else {
        block32(R, w, w + ahead, x, S[0], acc);
    }
    float M[8] __attribute__((aligned(32)));
    _mm256_store_ps(M, am);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) y[(size_t)i * ldy] = hsum8(acc[i]) + M[i];
}

/* ---- K-quants: super-blocks of 256 against activation blocks of 256 ----- */

/* Quant vector v (elements 32v..32v+31, unsigned) of a super-block. */
INLINE __m256i q4_K_quants(const uint8_t *p, int v) {
    __m256i b = loadu(p + 16 + 32 * (v / 2));
    return _mm256_and_si256(v & 1 ? _mm256_srli_epi16(b, 4) : b, _mm256_set1_epi8(0xf));
}

/* The multipliers of Q4_K quant vector v's madd lanes: scale v everywhere
 * (Q6_K's: quant_rows.h). */
INLINE __m256i q4_K_scale(__m256i sc2, int v) {
    return _mm256_shuffle_epi8(sc2, _mm256_set1_epi16((short)(0x0100 + 0x0202 * v)));
}

INLINE void tile_k(const int q6, const int R, const uint8_t *w, const uint8_t *wn, int nb,
                   const dfl_qact *a, int r0, float *y, int ldy) {
    __m256 acc[TILE];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) acc[i] = _mm256_setzero_ps();
    const size_t xs = (size_t)a->cols, ss = xs / 16;
    const size_t bb = q6 ? sizeof(dfl_block_q6_K) : sizeof(dfl_block_q4_K);
    const int8_t *x = dfl_qact_q(a, r0, 0); /* [nb * 8][R][32] */
    const int16_t *bsum = a->bsum + (size_t)r0 * ss;
    const float *dx = a->d + dfl_qact_di(nb, r0, 0); /* [nb][8] */
    float sd[8] __attribute__((aligned(32))), sm[8] __attribute__((aligned(32)));
    for (int b = 0; b < nb; b++, w += bb, wn += bb, x += QK_K * R, bsum += 16, dx += 8) {
        /* as in tile32: the next row with several rows, else AHEAD bytes on */
        const char *pf = R > 1 ? (const char *)wn : (const char *)((uintptr_t)w + AHEAD);
        for (size_t l = 0; l < bb; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
        __m256i corr, sc2 = _mm256_setzero_si256();
        __m128i sc8 = _mm_setzero_si128();
        if (q6) {
            sc8 = _mm_loadu_si128((const __m128i *)(w + 192));
            corr = _mm256_cvtepi8_epi16(sc8);
            __m256 d = _mm256_set1_ps(f16_load(w + 208));
            _mm256_store_ps(sd, _mm256_mul_ps(d, _mm256_load_ps(dx)));
        } else {
            sc2 = _mm256_broadcastsi128_si256(q4_K_scales(w, &corr));
            _mm256_store_ps(sd, _mm256_mul_ps(_mm256_set1_ps(f16_load(w)), _mm256_load_ps(dx)));
            _mm256_store_ps(sm, _mm256_mul_ps(_mm256_set1_ps(f16_load(w + 2)), _mm256_load_ps(dx)));
        }
        __m256i is[TILE];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) is[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            __m256i q = q6 ? q6_K_quants(w, v) : q4_K_quants(w, v);
            __m256i sc = q6 ? q6_K_scale(sc8, v) : q4_K_scale(sc2, v);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                __m256i p = _mm256_maddubs_epi16(q, load(x + (v * R + i) * 32));
                is[i] = _mm256_add_epi32(is[i], _mm256_madd_epi16(p, sc));
                /* keep the sum running: reassociated, all 8R products would be live at once */
                __asm__("" : "+x"(is[i]));
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256i c = _mm256_madd_epi16(corr, loadu(bsum + i * ss));
            if (q6) is[i] = _mm256_sub_epi32(is[i], _mm256_slli_epi32(c, 5));
            __m256 f = _mm256_cvtepi32_ps(is[i]);
            acc[i] = _mm256_fmadd_ps(f, _mm256_broadcast_ss(sd + i), acc[i]);
            if (!q6) { /* minus the mins, after the scaled sum */
                __m256 m = _mm256_cvtepi32_ps(c);
                acc[i] = _mm256_fnmadd_ps(m, _mm256_broadcast_ss(sm + i), acc[i]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) y[(size_t)i * ldy] = hsum8(acc[i]);
}

/* ---- rows of W (quant_rows.h) ------------------------------------------ */

DFL_Q8ROWS(AVX2, rows_q8_0, 8, 8, tile_whole, W8, 1)
DFL_Q8ROWS(AVX2, rows_q4_0, 8, 8, tile_whole, W4, 1)
DFL_QROWS(AVX2, rows_q4_1, 32, tile32, 0)
DFL_QROWS(AVX2, rows_q4_K, QK_K, tile_k, 0)
DFL_QROWS(AVX2, rows_q6_K, QK_K, tile_k, 1)

AVX2 void dfl_qrows_avx2(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                         int ldy) {
    switch (W->type) {
    case DFL_Q8_0: (W->il8 ? rows_q8_0_il8 : rows_q8_0)(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q4_0: rows_q4_0(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q4_1: rows_q4_1(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q4_K: rows_q4_K(W, a, n, o0, o1, Y, ldy); break;
    case DFL_Q6_K: rows_q6_K(W, a, n, o0, o1, Y, ldy); break;
    default: break;
    }
}

#endif
