/* matmul_avx512.c - AVX-512 (F) products of f16 / bf16 weights with 3 or
 * more activation rows (verify blocks, prefill): the twin's arithmetic of
 * matmul.c, as its AVX2 path does, in a bigger register tile.
 *
 * A zmm holds the 8 lanes of two outputs of one row: output 2p's weights in
 * the low 256 bits, output 2p+1's in the high, the row's 8 activations in
 * both. Lanes k and k+8 of one element never share a register, so each
 * element is still one chain of 8 lane FMAs in k order, then vec.h's lane
 * tree on its half, then the k tail with fmaf: the twin's bits.
 *
 * Zen 4 runs a 512-bit FMA as two 256-bit halves, so the gain is not FMA
 * width but fewer instructions per FMA: the tile of 8 rows by 6 outputs (24
 * accumulators, 3 weight pairs, one activation register of the 32)
 * converts each weight once per 8 rows (AVX2: per 4) and loads each
 * activation once per 6 outputs (AVX2: per 3). A/B against the AVX2 path
 * (bench_quant, Zen 4, one thread, Qwen3-0.6B shapes): 1.05-1.4x at 3-8
 * rows; at 16-32 rows bf16 1.06-1.15x and f16 0.97-1.15x, where both
 * paths near the FMA peak and f16's one-instruction conversion leaves
 * little to save. Tiles of 8 rows by 2 pairs and 6 by 4 did no better, 4
 * by 3 lost at 16 rows. Left to AVX2: one row (decode; a zmm gemv of 4 or
 * 8 outputs ran 0.5-0.8x, bound by memory, which the AVX2 gemv streams
 * better), two rows (no consistent gain either way), f32 (0.90-0.98x at
 * 16-32 rows with 1024 columns, though 1.15-1.5x elsewhere: a rule by
 * shape was not worth it for a type models rarely ship). */
#include "kernels/kernels.h"
#if DFL_X86 /* the whole file: x86-64 only */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/quant.h"
#include "kernels/vec.h"

#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define INLINE                                                                                     \
    static inline                                                                                  \
        __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"), always_inline))

enum {
    RB = 32, /* rows per row block, as matmul.c */
    TR = 8,  /* rows per register tile */
    TP = 3   /* output pairs per register tile: 24 accumulators */
};

/* Outputs w0's and w1's 16-bit weights k..k+7 as f32, w0's in the low half. */
INLINE __m512 wpair(const int t, const uint8_t *w0, const uint8_t *w1, int k) {
    __m128i lo = _mm_loadu_si128((const __m128i *)(w0 + 2 * (size_t)k));
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo),
                                        _mm_loadu_si128((const __m128i *)(w1 + 2 * (size_t)k)), 1);
    if (t == DFL_F16) return _mm512_cvtph_ps(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); /* bf16 */
}

/* x[k..k+7] in both halves. */
INLINE __m512 xdup(const float *x, int k) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(x + k))));
}

/* The next group's weight rows, prefetched while a tile runs: per 32
 * columns at k, the 64-byte line of each, into L2 (as matmul.c's tiles: 4
 * rows of a 0.6B-shaped bf16 product took 0.83-0.96x the time of L1's). */
typedef struct {
    const uint8_t *pf[2 * TP];
    int np;
} pf_list;

INLINE void prefetch(const pf_list *pf, int k) {
    for (int i = 0; i < pf->np; i++)
        _mm_prefetch((const char *)pf->pf[i] + 2 * (size_t)k, _MM_HINT_T1);
}

/* One step of 8 columns at k: each weight pair converted once for the R
 * rows, each row's x loaded once for the P pairs. */
INLINE void step(const int t, const int R, const int P, const uint8_t *const *w, const float *x,
                 size_t ldx, int k, __m512 a[TR][TP]) {
    __m512 wv[TP];
#pragma GCC unroll 4
    for (int p = 0; p < P; p++) wv[p] = wpair(t, w[2 * p], w[2 * p + 1], k);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        __m512 xv = xdup(x + r * ldx, k);
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) a[r][p] = _mm512_fmadd_ps(wv[p], xv, a[r][p]);
    }
}

/* s[r * 2P + 2p + h] = the lane tree of half h of a[r][p] (vec.h's order),
 * four halves at a time. */
INLINE void lane_trees(const int R, const int P, __m512 a[TR][TP], float *s) {
    __m256 h[TR * 2 * TP + 3];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            h[r * 2 * P + 2 * p] = _mm512_castps512_ps256(a[r][p]);
            h[r * 2 * P + 2 * p + 1] =
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[r][p]), 1));
        }
#pragma GCC unroll 4
    for (int i = R * 2 * P; i < R * 2 * P + 3; i++) h[i] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < R * 2 * P; i += 4)
        _mm_storeu_ps(s + i, dfl_hsum8x4(h[i], h[i + 1], h[i + 2], h[i + 3]));
}

/* y[r * ldy + c] for rows r < R of x and outputs c < m of w (m = 2P, or
 * 2P - 1 when the last pair is one output twice): the lane sums over the
 * whole row in registers, the lane trees, then the k tail. */
INLINE void tile(const int t, const int R, const int P, const uint8_t *const *w, const float *x,
                 size_t ldx, int cols, const pf_list *pf, float *y, size_t ldy, int m) {
    __m512 a[TR][TP];
    int k8 = cols & ~7, k = 0;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) a[r][p] = _mm512_setzero_ps();
    for (; k + 32 <= k8; k += 32) {
        prefetch(pf, k);
#pragma GCC unroll 4
        for (int j = 0; j < 32; j += 8) step(t, R, P, w, x, ldx, k + j, a);
    }
    for (; k < k8; k += 8) step(t, R, P, w, x, ldx, k, a);
    float s[TR * 2 * TP + 4];
    lane_trees(R, P, a, s);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < m; c++) {
            float v = s[r * 2 * P + c];
            for (int kk = k8; kk < cols; kk++) v = fmaf(dfl_w_at(t, w[c], kk), x[r * ldx + kk], v);
            y[r * ldy + c] = v;
        }
}

typedef void (*tile_fn)(const uint8_t *const *, const float *, size_t, int, const pf_list *,
                        float *, size_t, int);

#define TILE_FN(T, R, P)                                                                           \
    AVX512 static void tile_##T##_##R##_##P(const uint8_t *const *w, const float *x, size_t ldx,   \
                                            int cols, const pf_list *pf, float *y, size_t ldy,     \
                                            int m) {                                               \
        tile(DFL_##T, R, P, w, x, ldx, cols, pf, y, ldy, m);                                       \
    }
#define TILE_R(T, R) TILE_FN(T, R, 1) TILE_FN(T, R, 2) TILE_FN(T, R, 3)
#define TILE_FNS(T)                                                                                \
    TILE_R(T, 1) TILE_R(T, 2) TILE_R(T, 3) TILE_R(T, 4) TILE_R(T, 5) TILE_R(T, 6) TILE_R(T, 7)     \
        TILE_R(T, 8)
#define TROW(T, R) {tile_##T##_##R##_1, tile_##T##_##R##_2, tile_##T##_##R##_3}
#define TTAB(T)                                                                                    \
    {{0}, TROW(T, 1), TROW(T, 2), TROW(T, 3), TROW(T, 4), TROW(T, 5), TROW(T, 6), TROW(T, 7),     \
     TROW(T, 8)}
TILE_FNS(F16)
TILE_FNS(BF16)
/* tiles[type == BF16][R][P - 1] */
static const tile_fn tiles[2][TR + 1][TP] = {TTAB(F16), TTAB(BF16)};

/* Rows [r0, r0 + nr) against outputs [o, o + c), c <= 2P, of a task whose
 * chunk ends at o1: one register tile per R rows, the tiles sharing out the
 * prefetch of the next group's rows (they are read from memory once, by the
 * first tile; the others find them in L1 / L2). */
static void group(const dfl_mat *W, int o, int c, int o1, int r0, int nr, const float *X,
                  int ldx, float *Y, int ldy) {
    int P = (c + 1) / 2, G = 2 * TP, ntile = (nr + TR - 1) / TR, nnext = 0;
    const uint8_t *w[2 * TP], *next[2 * TP];
    for (int i = 0; i < 2 * P; i++) /* a lone last output pairs with itself */
        w[i] = W->data + (size_t)(o + (i < c ? i : c - 1)) * W->row_bytes;
    for (; nnext < G && o + c + nnext < o1; nnext++)
        next[nnext] = W->data + (size_t)(o + c + nnext) * W->row_bytes;
    for (int r = 0, ti = 0; r < nr; ti++) {
        int R = nr - r >= TR ? TR : nr - r;
        pf_list pf = {{0}, 0};
        for (int i = ti; i < nnext; i += ntile) pf.pf[pf.np++] = next[i];
        tile_fn fn = tiles[W->type == DFL_BF16][R][P - 1];
        fn(w, X + (size_t)(r0 + r) * ldx, (size_t)ldx, W->cols, &pf, Y + (size_t)(r0 + r) * ldy + o,
           (size_t)ldy, c);
        r += R;
    }
}

int dfl_matmul_rows_avx512(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                           float *Y, int ldy) {
    if (n < 3 || (W->type != DFL_F16 && W->type != DFL_BF16) || W->wt) return 0;
    for (int r0 = 0; r0 < n; r0 += RB) {
        int nr = n - r0 < RB ? n - r0 : RB;
        for (int o = o0; o < o1;) {
            int c = o1 - o >= 2 * TP ? 2 * TP : o1 - o;
            group(W, o, c, o1, r0, nr, X, ldx, Y, ldy);
            o += c;
        }
    }
    return 1;
}

#endif
