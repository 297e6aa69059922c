/* matmul.c - Y = X W^T for f32 / f16 / bf16 weights (quantized types go to
 * quant.c).
 *
 * Every output element Y[r, o] is the dot product of W row o and X row r in
 * the fixed order of vec.h: eight lane sums over k, the lane tree, then the
 * k tail. Tiles, chunks and threads only decide which elements are computed
 * together, never the order inside one, so a row gives the same bits alone or
 * in a batch of 32, with one thread or three, in the AVX2 path or the twin.
 *
 * Fast paths. One row (decode) streams the weights once and is bound by memory
 * bandwidth: 4 outputs at a time, converted in registers, the next 4 rows
 * prefetched meanwhile (one core's bandwidth is bound by misses in flight).
 * Several rows (verify, prefill): per group of 3 outputs, every 4-row tile
 * of X runs a 4x3 register tile (12 accumulators + 3 weights + 1 activation
 * = the 16 ymm registers) over whole rows, converting f16 / bf16 weights in
 * registers, while the next group's rows are prefetched. Whole rows stream
 * best: blocks of columns (acc carried in memory between them, a bf16 block
 * converted to f32 once on the stack) measured 5-25% slower on Zen 3. Rows go
 * 32 at a time so the accumulators stay small. Small matrices (a model that
 * sits in cache, where bandwidth is not the limit) skip the prefetch lists
 * (gemm_small), and those given a transposed copy at load run 8 outputs per
 * vector with no horizontal sums, one row or many (gemm_trans). On the
 * avx512 path, f16 / bf16 with 3+ rows run matmul_avx512.c's 8x6 tile
 * (two outputs per zmm), the rest these AVX2 kernels. On aarch64
 * the NEON path (quant_neon.c) keeps the same order with two 4-lane
 * accumulators per element. */
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/vec.h"

enum {
    RB = 32,          /* rows per row block */
    CHUNK = 48,       /* outputs per task: a multiple of the tile widths (3, 4, 24) */
    SMALL_BYTES = 256 << 10   /* f32 bytes up to which several rows take gemm_small, and a
                               * matrix may be transposed */
};

float dfl_w_at(dfl_type t, const uint8_t *row, int k) {
    switch (t) {
    case DFL_F16: return dfl_f16_to_f32(((const uint16_t *)row)[k]);
    case DFL_BF16: return dfl_bf16_to_f32(((const uint16_t *)row)[k]);
    default: return ((const float *)row)[k];
    }
}

/* ---- plain-C twin: the specification ---------------------------------- */

static void matmul_ref_rows(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                            float *Y, int ldy) {
    int cols = W->cols, k8 = cols & ~7;
    for (int o = o0; o < o1; o++) {
        const uint8_t *w = W->data + (size_t)o * W->row_bytes;
        for (int r = 0; r < n; r++) {
            const float *x = X + (size_t)r * ldx;
            float acc[8] = {0};
            for (int k = 0; k < k8; k += 8)
                for (int l = 0; l < 8; l++)
                    acc[l] = fmaf(dfl_w_at(W->type, w, k + l), x[k + l], acc[l]);
            float s = dfl_hsum8_ref(acc);
            for (int k = k8; k < cols; k++) s = fmaf(dfl_w_at(W->type, w, k), x[k], s);
            Y[(size_t)r * ldy + o] = s;
        }
    }
}

void dfl_matmul_ref(const dfl_mat *W, int n, const float *X, int ldx, float *Y, int ldy) {
    if (W->type > DFL_BF16) {
        dfl_qmatmul_ref(W, n, X, ldx, Y, ldy);
        return;
    }
    matmul_ref_rows(W, 0, W->rows, n, X, ldx, Y, ldy);
}

#if DFL_X86
/* ---- AVX2 ------------------------------------------------------------- */

static DFL_AVX2_INLINE __m256 load8(dfl_type t, const uint8_t *p, int k) {
    if (t == DFL_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * (size_t)k)));
    if (t == DFL_BF16) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * (size_t)k)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    return _mm256_loadu_ps((const float *)p + k);
}

/* acc[r*C + c] = lane sums of W_c[k] * X_r[k] for k in [0, k8), R rows by C
 * outputs; w[c] points at W_c's first column, x at X_0's. Meanwhile rows
 * pf[0..np) are prefetched over the same columns: weights a later call reads
 * from memory, so their latency overlaps this call's arithmetic (callers
 * spread them, a few rows per call, to keep few misses in flight). */

typedef struct {
    const uint8_t *pf[4];   /* rows (or lines of one block) to prefetch */
    int np;
    size_t pes;             /* bytes each advances per column */
    float *y;               /* not NULL: rows with no k tail, so write the finished
                             * sums to y[r * ldy + c], not acc */
    size_t ldy;
} tile_aux;

/* One step of 8 columns at k. */
static DFL_AVX2_INLINE void tile_step(int R, int C, dfl_type t, const uint8_t *const *w,
                                      const float *x, size_t ldx, int k, __m256 a[4][4]) {
    __m256 wv[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) wv[c] = load8(t, w[c], k);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) a[r][c] = _mm256_fmadd_ps(wv[c], xv, a[r][c]);
    }
}

/* s[r * C + c] = the lane tree (vec.h's hsum8 order) of a[r][c], four at a time. */
static DFL_AVX2_INLINE void lane_trees(int R, int C, __m256 a[4][4], float *s) {
    const __m256 z = _mm256_setzero_ps();
#define ACC(i) ((i) < R * C ? a[(i) / C][(i) % C] : z)
#pragma GCC unroll 4
    for (int i = 0; i < R * C; i += 4)
        _mm_storeu_ps(s + i, dfl_hsum8x4(ACC(i), ACC(i + 1), ACC(i + 2), ACC(i + 3)));
#undef ACC
}

static DFL_AVX2_INLINE void tile(int R, int C, dfl_type t, const uint8_t *const *w,
                                 const float *x, size_t ldx, int k8, __m256 *acc,
                                 const tile_aux *aux) {
    __m256 a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) a[r][c] = _mm256_setzero_ps();
    int k = 0;
    /* 32 columns per iteration: one prefetch per 64-byte line of 16-bit rows,
     * into L2, not L1. The one-row tile (1 x 4, gemv's alone): on Zen 4 a bf16
     * decode step then read 95-99% of the bandwidth sampled next to it,
     * against 70-84%; a product of 2 rows took 0.63-0.68x the time
     * (docs/benchmarks.md). The prefetched lines in L1 evicted the ones still
     * to be read. */
    for (; k + 32 <= k8; k += 32) {
        for (int i = 0; i < aux->np; i++) {
            const char *p = (const char *)aux->pf[i] + k * aux->pes;
            _mm_prefetch(p, _MM_HINT_T1);
            if (aux->pes == 4) _mm_prefetch(p + 64, _MM_HINT_T1);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 32; j += 8) tile_step(R, C, t, w, x, ldx, k + j, a);
    }
    for (; k < k8; k += 8) tile_step(R, C, t, w, x, ldx, k, a);
    if (!aux->y) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) acc[r * C + c] = a[r][c];
        return;
    }
    /* The lane trees straight to Y. */
    float s[16];
    lane_trees(R, C, a, s);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) aux->y[r * aux->ldy + c] = s[r * C + c];
}

typedef void (*tile_fn)(const uint8_t *const *, const float *, size_t, int, __m256 *,
                        const tile_aux *);

/* One function per shape and type, each with its own register allocation:
 * tiles[type][R][C == 3]. */
#define TILE_FN(R, C, T)                                                                     \
    DFL_AVX2 static void tile_##R##x##C##_##T(const uint8_t *const *w, const float *x,       \
                                              size_t ldx, int k8, __m256 *acc,              \
                                              const tile_aux *aux) {                        \
        tile(R, C, DFL_##T, w, x, ldx, k8, acc, aux);                                        \
    }
#define TILE_FNS(T)                                                                          \
    TILE_FN(1, 1, T) TILE_FN(2, 1, T) TILE_FN(3, 1, T) TILE_FN(4, 1, T)                      \
    TILE_FN(1, 3, T) TILE_FN(2, 3, T) TILE_FN(3, 3, T) TILE_FN(4, 3, T) TILE_FN(1, 4, T)
#define TILE_ROW(T)                                                                          \
    {{0, 0}, {tile_1x1_##T, tile_1x3_##T}, {tile_2x1_##T, tile_2x3_##T},                     \
     {tile_3x1_##T, tile_3x3_##T}, {tile_4x1_##T, tile_4x3_##T}}
TILE_FNS(F32)
TILE_FNS(F16)
TILE_FNS(BF16)
static const tile_fn tiles[3][5][2] = {TILE_ROW(F32), TILE_ROW(F16), TILE_ROW(BF16)};
static const tile_fn gemv4[3] = {tile_1x4_F32, tile_1x4_F16, tile_1x4_BF16};

/* Y values from lane sums acc[0..m) and the k tail, in vec.h's order; w[i %
 * c] is the weight row and x + (i / c) * ldx the input row of acc[i]. */
DFL_AVX2 static void finish(const __m256 *acc, int m, int c, dfl_type t, const uint8_t *const *w,
                            const float *x, size_t ldx, int k8, int cols, float *y, size_t ldy) {
    size_t r = 0;
    int o = 0;
    for (int i = 0; i < m; i += 4) {
        __m256 z = _mm256_setzero_ps();
        float s[4];
        _mm_storeu_ps(s, dfl_hsum8x4(acc[i], i + 1 < m ? acc[i + 1] : z, i + 2 < m ? acc[i + 2] : z,
                                     i + 3 < m ? acc[i + 3] : z));
        for (int j = i; j < i + 4 && j < m; j++) {
            float v = s[j - i];
            for (int k = k8; k < cols; k++) v = fmaf(dfl_w_at(t, w[o], k), x[r * ldx + k], v);
            y[r * ldy + o] = v;
            if (++o == c) o = 0, r++;
        }
    }
}

/* n == 1: weights streamed once, converted in registers, 4 outputs at a
 * time while the next 4 rows (within the task's chunk) are prefetched.
 * Short 16-bit rows (up to 2 KB: 1024 columns, the lm_head and most matrices
 * of a 1024-wide model) prefetch those 4 rows as one block in address order,
 * 4 lines per step: A/B on Zen 3 +10-20% over one line of each row per step
 * (four 2 KB streams), while 4-6 KB rows lose 5-10% with it, so they keep
 * the per-row pattern. */
DFL_AVX2 static void gemv_rows(const dfl_mat *W, int o0, int o1, const float *x, float *y) {
    int cols = W->cols, k8 = cols & ~7;
    int block = W->type != DFL_F32 && W->row_bytes <= 2048;
    /* pf[i] + k * pes: per 32 columns one line of each row, or 4 lines (256 bytes) of the block */
    tile_aux aux = {{0}, 0, W->type == DFL_F32 ? 4 : block ? 8 : 2, NULL, 0};
    for (int o = o0; o < o1;) {
        int c = o1 - o >= 4 ? 4 : 1;
        const uint8_t *w[4];
        __m256 acc[4];
        for (int i = 0; i < c; i++) w[i] = W->data + (size_t)(o + i) * W->row_bytes;
        if (block)
            for (aux.np = 0; aux.np < 4 && c == 4 && o + 8 <= o1; aux.np++)
                aux.pf[aux.np] = w[0] + 4 * W->row_bytes + 64 * (size_t)aux.np;
        else
            for (aux.np = 0; aux.np < 4 && o + c + aux.np < o1; aux.np++)
                aux.pf[aux.np] = w[0] + (size_t)(c + aux.np) * W->row_bytes;
        aux.y = k8 == cols ? y + o : NULL;
        (c == 4 ? gemv4[W->type] : tiles[W->type][1][0])(w, x, 0, k8, acc, &aux);
        if (k8 < cols) finish(acc, c, c, W->type, w, x, 0, k8, cols, y + o, 0);
        o += c;
    }
}

/* Rows [r0, r0+nr), nr <= RB, against outputs [o, o+c), c <= 3, of a task
 * whose chunk ends at o1: one register tile per 4 rows over the whole row,
 * the tiles sharing out the prefetch of the next group's rows. */
DFL_AVX2 static void gemm_group(const dfl_mat *W, int o, int c, int o1, int r0, int nr,
                                const float *X, int ldx, float *Y, int ldy) {
    __m256 acc[RB * 3];
    int cols = W->cols, k8 = cols & ~7, ntile = (nr + 3) / 4, nnext = 0;
    const uint8_t *w[3], *next[3];
    for (int i = 0; i < c; i++) w[i] = W->data + (size_t)(o + i) * W->row_bytes;
    for (; nnext < 3 && o + c + nnext < o1; nnext++)
        next[nnext] = w[0] + (size_t)(c + nnext) * W->row_bytes;
    for (int r = 0, ti = 0; r < nr; ti++) {
        int tr = nr - r >= 4 ? 4 : nr - r;
        tile_aux aux = {{0}, 0, W->type == DFL_F32 ? 4 : 2, NULL, (size_t)ldy};
        if (k8 == cols) aux.y = Y + (size_t)(r0 + r) * ldy + o;
        for (int i = ti; i < nnext; i += ntile) aux.pf[aux.np++] = next[i];
        const float *x = X + (size_t)(r0 + r) * ldx;
        tiles[W->type][tr][c == 3](w, x, (size_t)ldx, k8, acc + r * c, &aux);
        r += tr;
    }
    if (k8 < cols)
        finish(acc, nr * c, c, W->type, w, X + (size_t)r0 * ldx, (size_t)ldx, k8, cols,
               Y + (size_t)r0 * ldy + o, (size_t)ldy);
}

DFL_AVX2 static void gemm_rows(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                               float *Y, int ldy) {
    for (int r0 = 0; r0 < n; r0 += RB) {
        int nr = n - r0 < RB ? n - r0 : RB;
        for (int o = o0; o < o1;) {
            int c = o1 - o >= 3 ? 3 : 1;
            gemm_group(W, o, c, o1, r0, nr, X, ldx, Y, ldy);
            o += c;
        }
    }
}

/* Small f32 matrices (a model whose weights all sit in cache) with several
 * rows: the blocked path's bookkeeping (column blocks, prefetch lists, sums
 * carried in memory) costs more than the arithmetic there. Each tile of R
 * rows by C outputs runs the whole k range in registers, then the lane
 * trees and the k tail straight to Y; the order per element is the twin's. */
static DFL_AVX2_INLINE void small_tile(int R, int C, const float *w, size_t ldw, const float *x,
                                       size_t ldx, int cols, float *y, size_t ldy) {
    __m256 a[4][4];
    int k8 = cols & ~7;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) a[r][c] = _mm256_setzero_ps();
    for (int k = 0; k < k8; k += 8) {
        __m256 wv[3];
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) wv[c] = _mm256_loadu_ps(w + c * ldw + k);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 3
            for (int c = 0; c < C; c++) a[r][c] = _mm256_fmadd_ps(wv[c], xv, a[r][c]);
        }
    }
    float s[16];
    lane_trees(R, C, a, s);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            float v = s[r * C + c];
            for (int k = k8; k < cols; k++) v = fmaf(w[c * ldw + k], x[r * ldx + k], v);
            y[r * ldy + c] = v;
        }
}

#define SMALL_FN(R, C)                                                                      \
    DFL_AVX2 static void small_##R##x##C(const float *w, size_t ldw, const float *x,         \
                                         size_t ldx, int cols, float *y, size_t ldy) {      \
        small_tile(R, C, w, ldw, x, ldx, cols, y, ldy);                                     \
    }
SMALL_FN(1, 1) SMALL_FN(2, 1) SMALL_FN(3, 1) SMALL_FN(4, 1)
SMALL_FN(1, 3) SMALL_FN(2, 3) SMALL_FN(3, 3) SMALL_FN(4, 3)
typedef void (*small_fn)(const float *, size_t, const float *, size_t, int, float *, size_t);
static const small_fn smalls[5][2] = {{0, 0}, {small_1x1, small_1x3}, {small_2x1, small_2x3},
                                      {small_3x1, small_3x3}, {small_4x1, small_4x3}};

static void gemm_small(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                       float *Y, int ldy) {
    size_t ldw = W->row_bytes / sizeof(float);
    for (int o = o0; o < o1;) {
        int c = o1 - o >= 3 ? 3 : 1;
        const float *w = (const float *)W->data + (size_t)o * ldw;
        for (int r = 0; r < n;) {
            int R = n - r >= 4 ? 4 : n - r;
            smalls[R][c == 3](w, ldw, X + (size_t)r * ldx, (size_t)ldx, W->cols,
                              Y + (size_t)r * ldy + o, (size_t)ldy);
            r += R;
        }
        o += c;
    }
}

#endif

/* ---- small matrices, transposed ---------------------------------------------
 * With the weights stored k-major in panels of 24 outputs (panel p holds
 * wt[p * cols * 24 + k * 24 + i] = W[24p + i][k], zeros past rows), lane l
 * of the dot order (k = l, l+8, ...) for 8 outputs is one vector chain of
 * multiply-adds with x[k] broadcast, and the lane tree adds whole vectors:
 * every element gets the twin's bits, with no horizontal sums, Y written 8
 * at a time, and a panel read contiguously. */
enum {
    PW = 24,          /* outputs per panel */
    TRANS_COLS = 192  /* columns up to which a matrix is transposed */
};

#if DFL_X86
/* a[v] = lane l's chain, b[v] = lane l + 4's, for outputs 8v of the panel. */
static DFL_AVX2_INLINE void lane_pair(int V, int l, const float *wt, const float *x, int k8,
                                      __m256 *a, __m256 *b) {
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) a[v] = b[v] = _mm256_setzero_ps();
    for (int k = l; k < k8; k += 8) {
        __m256 xa = _mm256_broadcast_ss(x + k), xb = _mm256_broadcast_ss(x + k + 4);
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) {
            a[v] = _mm256_fmadd_ps(_mm256_loadu_ps(wt + (size_t)k * PW + 8 * v), xa, a[v]);
            b[v] = _mm256_fmadd_ps(_mm256_loadu_ps(wt + (size_t)(k + 4) * PW + 8 * v), xb, b[v]);
        }
    }
}

/* y[0 .. 8V) = the first 8V outputs of a panel for one row x: the chains
 * paired (l, l+4) as the tree ((0+4)+(2+6))+((1+5)+(3+7)) adds them, then
 * the k tail. */
static DFL_AVX2_INLINE void trans_tile(int V, const float *wt, const float *x, int cols, float *y) {
    __m256 s[3], t[3], c[3], d[3];
    int k8 = cols & ~7;
    lane_pair(V, 0, wt, x, k8, c, d);
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) s[v] = _mm256_add_ps(c[v], d[v]);
    lane_pair(V, 2, wt, x, k8, c, d);
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) s[v] = _mm256_add_ps(s[v], _mm256_add_ps(c[v], d[v]));
    lane_pair(V, 1, wt, x, k8, c, d);
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) t[v] = _mm256_add_ps(c[v], d[v]);
    lane_pair(V, 3, wt, x, k8, c, d);
#pragma GCC unroll 3
    for (int v = 0; v < V; v++)
        s[v] = _mm256_add_ps(s[v], _mm256_add_ps(t[v], _mm256_add_ps(c[v], d[v])));
    for (int k = k8; k < cols; k++) {
        __m256 xk = _mm256_broadcast_ss(x + k);
#pragma GCC unroll 3
        for (int v = 0; v < V; v++)
            s[v] = _mm256_fmadd_ps(_mm256_loadu_ps(wt + (size_t)k * PW + 8 * v), xk, s[v]);
    }
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) _mm256_storeu_ps(y + 8 * v, s[v]);
}

#define TRANS_FN(V)                                                                         \
    DFL_AVX2 static void trans_##V(const float *wt, const float *x, int cols, float *y) {     \
        trans_tile(V, wt, x, cols, y);                                                      \
    }
TRANS_FN(1) TRANS_FN(2) TRANS_FN(3)
typedef void (*trans_fn)(const float *, const float *, int, float *);
static const trans_fn transs[4] = {0, trans_1, trans_2, trans_3};

/* Outputs [o0, o1) (o0 a multiple of PW) of n rows, a panel at a time for
 * every row (it stays in L1); outputs past o1 in the last vector are
 * computed (zero weights) and dropped. */
static void gemm_trans(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                       float *Y, int ldy) {
    for (int o = o0; o < o1; o += PW) {
        int m = o1 - o < PW ? o1 - o : PW, V = (m + 7) / 8;
        const float *panel = W->wt + (size_t)o * W->cols;
        for (int r = 0; r < n; r++) {
            float *y = Y + (size_t)r * ldy + o, tmp[PW];
            transs[V](panel, X + (size_t)r * ldx, W->cols, m == 8 * V ? y : tmp);
            if (m < 8 * V) memcpy(y, tmp, (size_t)m * sizeof(float));
        }
    }
}

#endif

static int mat_transpose(dfl_mat *m) {
    size_t np = ((size_t)m->rows + PW - 1) / PW, n = np * PW * (size_t)m->cols;
    /* Longer rows make lane chains too long to hide their latency: measured slower. */
    if (m->type > DFL_BF16 || m->wt || n == 0 || n * sizeof(float) > SMALL_BYTES ||
        m->cols > TRANS_COLS)
        return 0;
    m->wt = dfl_aligned_alloc(n * sizeof(float));
    memset(m->wt, 0, n * sizeof(float));
    float *row = xmalloc((size_t)m->cols * sizeof(float));
    for (int o = 0; o < m->rows; o++) {
        dfl_dequant_row(m->type, m->data + (size_t)o * m->row_bytes, row, m->cols);
        float *dst = m->wt + (size_t)(o / PW) * PW * m->cols + o % PW;
        for (int k = 0; k < m->cols; k++) dst[(size_t)k * PW] = row[k];
    }
    free(row);
    return 1;
}

int dfl_mat_prepare(dfl_mat *m) {
    dfl_qmat_scales(m);
    return mat_transpose(m);
}

void dfl_mat_release(dfl_mat *m) {
    free(m->wt);
    free(m->sc);
    m->wt = NULL;
    m->sc = NULL;
}

/* ---- dispatch ------------------------------------------------------------ */

typedef struct {
    const dfl_mat *W;
    int n, ldx, ldy;
    dfl_isa isa;
    int chunk;
    const float *X;
    float *Y;
} mm_job;

#if DFL_X86
/* Outputs [o0, o1) of n rows on the AVX2 kernels, by shape. */
static void avx2_rows(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                      float *Y, int ldy) {
    if (W->wt)
        gemm_trans(W, o0, o1, n, X, ldx, Y, ldy);
    else if (n == 1)
        gemv_rows(W, o0, o1, X, Y);
    else if (W->type == DFL_F32 && (size_t)W->rows * W->row_bytes <= SMALL_BYTES)
        gemm_small(W, o0, o1, n, X, ldx, Y, ldy);
    else
        gemm_rows(W, o0, o1, n, X, ldx, Y, ldy);
}
#endif

static void mm_task(void *ctx, int i, int ntask) {
    const mm_job *j = ctx;
    int o0 = i * j->chunk, o1 = o0 + j->chunk < j->W->rows ? o0 + j->chunk : j->W->rows;
    if (o0 >= o1) return;
    switch (j->isa) {
#if DFL_X86
    case DFL_ISA_AVX512:
        if (dfl_matmul_rows_avx512(j->W, o0, o1, j->n, j->X, j->ldx, j->Y, j->ldy)) return;
        /* fall through - no AVX-512 kernel for this matrix or row count */
    case DFL_ISA_AVX2: avx2_rows(j->W, o0, o1, j->n, j->X, j->ldx, j->Y, j->ldy); return;
#endif
#if defined(__aarch64__)
    case DFL_ISA_NEON: dfl_matmul_rows_neon(j->W, o0, o1, j->n, j->X, j->ldx, j->Y, j->ldy); return;
#endif
    default: matmul_ref_rows(j->W, o0, o1, j->n, j->X, j->ldx, j->Y, j->ldy); return;
    }
}

void dfl_matmul(dfl_pool *pool, const dfl_mat *W, int n, const float *X, int ldx, float *Y,
                int ldy, void *scratch) {
    if (n <= 0) return;
    if (W->type > DFL_BF16) {   /* quant.c follows the same forced or detected path */
        dfl_qmatmul(pool, W, n, X, ldx, Y, ldy, scratch);
        return;
    }
    /* One row streams the weights: one contiguous run per thread, so the
     * prefetch of the next rows never stops at a task's end (interleaved
     * chunks of 48 rows read a bf16 lm_head at ~70% of the bandwidth). */
    int chunk = CHUNK;
    if (n == 1 && !W->wt) {
        int nt = dfl_pool_size(pool), per = (W->rows + nt - 1) / nt;
        chunk = (per + CHUNK - 1) / CHUNK * CHUNK;
    }
    mm_job j = {W, n, ldx, ldy, dfl_kernels_isa(), chunk, X, Y};
    dfl_pool_run(pool, mm_task, &j, (W->rows + chunk - 1) / chunk);
}

void dfl_matmul_group(dfl_pool *pool, const dfl_mat *const *W, int n, const float *const *X,
                      float *const *Y, int k, void *scratch) {
    int same = k > 0 && W[0]->type > DFL_BF16;
    for (int j = 1; j < k && same; j++) same = W[j]->type == W[0]->type;
    if (same) {
        dfl_qmatmul_group(pool, W, n, X, Y, k, scratch);
        return;
    }
    for (int j = 0; j < k; j++) dfl_matmul(pool, W[j], n, X[j], W[j]->cols, Y[j], W[j]->rows, scratch);
}

size_t dfl_matmul_scratch(dfl_type t, int n, int cols) {
    return t > DFL_BF16 ? dfl_qmatmul_scratch(t, n, cols) : 0;
}
