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
 * bandwidth: 4 outputs at a time, converted in registers. Several rows (verify,
 * prefill): per group of 3 outputs, a block of up to KB columns of weights is
 * converted to f32 once (on the stack, L1-resident), then every 4-row tile of
 * X runs against it with a 4x3 register tile (12 accumulators + 3 weights + 1
 * activation = the 16 ymm registers). Rows go 32 at a time so the
 * accumulators stay small. */
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/vec.h"

enum {
    KB = 1024,        /* columns converted per block (3 x 4 KiB of f32) */
    RB = 32,          /* rows per row block */
    CHUNK = 48        /* outputs per task: a multiple of both tile widths (3, 4) */
};

static float w_at(dfl_type t, const uint8_t *row, int k) {
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
                for (int l = 0; l < 8; l++) acc[l] = fmaf(w_at(W->type, w, k + l), x[k + l], acc[l]);
            float s = dfl_hsum8_ref(acc);
            for (int k = k8; k < cols; k++) s = fmaf(w_at(W->type, w, k), x[k], s);
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

/* acc[r*C + c] += lane sums of W_c[k] * X_r[k] for k in [0, k8), R rows by C
 * outputs; w[c] points at W_c's first column, x at X_0's. acc is in memory
 * between calls (it carries across column blocks); the loop keeps it in
 * registers. */
static DFL_AVX2_INLINE void tile(int R, int C, dfl_type t, const uint8_t *const *w,
                                 const float *x, size_t ldx, int k8, __m256 *acc) {
    __m256 a[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) a[r][c] = acc[r * C + c];
    for (int k = 0; k < k8; k += 8) {
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
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r * C + c] = a[r][c];
}

/* One function per tile shape, so each gets its own register allocation. */
#define TILE_FN(name, R, C, T)                                                              \
    DFL_AVX2 static void name(const uint8_t *const *w, const float *x, size_t ldx, int k8, \
                              __m256 *acc) {                                              \
        tile(R, C, T, w, x, ldx, k8, acc);                                                 \
    }
TILE_FN(gemv_f32_4, 1, 4, DFL_F32)
TILE_FN(gemv_f16_4, 1, 4, DFL_F16)
TILE_FN(gemv_bf16_4, 1, 4, DFL_BF16)
TILE_FN(gemv_f32_1, 1, 1, DFL_F32)
TILE_FN(gemv_f16_1, 1, 1, DFL_F16)
TILE_FN(gemv_bf16_1, 1, 1, DFL_BF16)
TILE_FN(tile_4x3, 4, 3, DFL_F32)
TILE_FN(tile_3x3, 3, 3, DFL_F32)
TILE_FN(tile_2x3, 2, 3, DFL_F32)
TILE_FN(tile_1x3, 1, 3, DFL_F32)
TILE_FN(tile_4x1, 4, 1, DFL_F32)
TILE_FN(tile_3x1, 3, 1, DFL_F32)
TILE_FN(tile_2x1, 2, 1, DFL_F32)
TILE_FN(tile_1x1, 1, 1, DFL_F32)

typedef void (*tile_fn)(const uint8_t *const *, const float *, size_t, int, __m256 *);

/* Y[r, o] from lane sums acc and the k tail, in vec.h's order. */
DFL_AVX2 static float finish(__m256 acc, dfl_type t, const uint8_t *w, const float *x, int k8,
                             int cols) {
    float s = dfl_hsum8(acc);
    for (int k = k8; k < cols; k++) s = fmaf(w_at(t, w, k), x[k], s);
    return s;
}

/* n == 1: weights streamed once, converted in registers. */
DFL_AVX2 static void gemv_rows(const dfl_mat *W, int o0, int o1, const float *x, float *y) {
    static const tile_fn f4[3] = {gemv_f32_4, gemv_f16_4, gemv_bf16_4};
    static const tile_fn f1[3] = {gemv_f32_1, gemv_f16_1, gemv_bf16_1};
    int cols = W->cols, k8 = cols & ~7;
    for (int o = o0; o < o1;) {
        int c = o1 - o >= 4 ? 4 : 1;
        const uint8_t *w[4];
        __m256 acc[4];
        for (int i = 0; i < c; i++) {
            w[i] = W->data + (size_t)(o + i) * W->row_bytes;
            acc[i] = _mm256_setzero_ps();
        }
        (c == 4 ? f4 : f1)[W->type](w, x, 0, k8, acc);
        for (int i = 0; i < c; i++) y[o + i] = finish(acc[i], W->type, w[i], x, k8, cols);
        o += c;
    }
}

/* Rows [r0, r0+nr), nr <= RB, against outputs [o, o+c), c <= 3. */
DFL_AVX2 static void gemm_group(const dfl_mat *W, int o, int c, int r0, int nr, const float *X,
                                int ldx, float *Y, int ldy) {
    static const tile_fn f3[5] = {0, tile_1x3, tile_2x3, tile_3x3, tile_4x3};
    static const tile_fn f1[5] = {0, tile_1x1, tile_2x1, tile_3x1, tile_4x1};
    _Alignas(32) float wf[3][KB];
    __m256 acc[RB * 3];
    int cols = W->cols, k8 = cols & ~7;
    const uint8_t *wrow[3];
    for (int i = 0; i < c; i++) wrow[i] = W->data + (size_t)(o + i) * W->row_bytes;
    for (int i = 0; i < nr * c; i++) acc[i] = _mm256_setzero_ps();
    for (int kb = 0; kb < k8; kb += KB) {
        int nk = k8 - kb < KB ? k8 - kb : KB;
        const uint8_t *w[3];
        for (int i = 0; i < c; i++) {
            if (W->type == DFL_F32) {
                w[i] = wrow[i] + (size_t)kb * 4;
                continue;
            }
            /* Exact conversion: the f32 copy holds the same values. */
            for (int k = 0; k < nk; k += 8)
                _mm256_store_ps(wf[i] + k, load8(W->type, wrow[i], kb + k));
            w[i] = (const uint8_t *)wf[i];
        }
        for (int r = 0; r < nr;) {
            int tr = nr - r >= 4 ? 4 : nr - r;
            const float *x = X + (size_t)(r0 + r) * ldx + kb;
            (c == 3 ? f3 : f1)[tr](w, x, (size_t)ldx, nk, acc + r * c);
            r += tr;
        }
    }
    for (int r = 0; r < nr; r++) {
        const float *x = X + (size_t)(r0 + r) * ldx;
        for (int i = 0; i < c; i++)
            Y[(size_t)(r0 + r) * ldy + o + i] = finish(acc[r * c + i], W->type, wrow[i], x, k8, cols);
    }
}

DFL_AVX2 static void gemm_rows(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                               float *Y, int ldy) {
    for (int r0 = 0; r0 < n; r0 += RB) {
        int nr = n - r0 < RB ? n - r0 : RB;
        for (int o = o0; o < o1;) {
            int c = o1 - o >= 3 ? 3 : 1;
            gemm_group(W, o, c, r0, nr, X, ldx, Y, ldy);
            o += c;
        }
    }
}

/* ---- dispatch ------------------------------------------------------------ */

typedef struct {
    const dfl_mat *W;
    int n, ldx, ldy, simd;
    const float *X;
    float *Y;
} mm_job;

static void mm_task(void *ctx, int i, int ntask) {
    const mm_job *j = ctx;
    int o0 = i * CHUNK, o1 = o0 + CHUNK < j->W->rows ? o0 + CHUNK : j->W->rows;
    if (!j->simd)
        matmul_ref_rows(j->W, o0, o1, j->n, j->X, j->ldx, j->Y, j->ldy);
    else if (j->n == 1)
        gemv_rows(j->W, o0, o1, j->X, j->Y);
    else
        gemm_rows(j->W, o0, o1, j->n, j->X, j->ldx, j->Y, j->ldy);
}

void dfl_matmul(dfl_pool *pool, const dfl_mat *W, int n, const float *X, int ldx, float *Y,
                int ldy, void *scratch) {
    if (n <= 0) return;
    if (W->type > DFL_BF16) {
        if (dfl_kernels_simd())
            dfl_qmatmul(pool, W, n, X, ldx, Y, ldy, scratch);
        else
            dfl_qmatmul_ref(W, n, X, ldx, Y, ldy);
        return;
    }
    mm_job j = {W, n, ldx, ldy, dfl_kernels_simd(), X, Y};
    dfl_pool_run(pool, mm_task, &j, (W->rows + CHUNK - 1) / CHUNK);
}

size_t dfl_matmul_scratch(dfl_type t, int n, int cols) {
    return t > DFL_BF16 ? dfl_qmatmul_scratch(t, n, cols) : 0;
}
