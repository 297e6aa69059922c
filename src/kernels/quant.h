/* quant.h - quantized weight formats (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K): row
 * conversion and matmul. kernels.c dispatches quantized types here; the same
 * batch-invariance rules as kernels.h apply (split by output row, one fixed
 * accumulation order per output element).
 *
 * The block layouts are GGUF's (ggml's block_q8_0, block_q4_0, block_q4_1,
 * block_q4_K, block_q6_K), so GGUF tensors are used in place from the mapping. */
#ifndef DFL_QUANT_H
#define DFL_QUANT_H

#include "kernels/kernels.h"

/* Y[r, o] = sum_i W[o, i] * X[r, i] for a quantized W; scratch holds at least
 * dfl_qmatmul_scratch(W->type, n, W->cols) bytes, 64-byte aligned. */
void dfl_qmatmul(dfl_pool *pool, const dfl_mat *W, int n, const float *X, int ldx, float *Y,
                 int ldy, void *scratch);
/* dfl_matmul_group's quantized path (W all of one type). */
void dfl_qmatmul_group(dfl_pool *pool, const dfl_mat *const *W, int n, const float *const *X,
                       float *const *Y, int k, void *scratch);
/* Plain-C twin, single-threaded. */
void dfl_qmatmul_ref(const dfl_mat *W, int n, const float *X, int ldx, float *Y, int ldy);
size_t dfl_qmatmul_scratch(dfl_type t, int n, int cols);
void dfl_qdequant_row(dfl_type t, const void *src, float *dst, int cols);
/* Returns 0, or -1 if cols is not a block multiple or a value is not finite
 * (or, for the K-quants, too large for their f16 super-block scales). */
int dfl_qquant_row(dfl_type t, const float *src, void *dst, int cols);

/* ---- the GGUF blocks (ggml-common.h layouts; f16 fields as raw bits) ---- */

enum { QK8_0 = 32, QK4_0 = 32, QK4_1 = 32, QK_K = 256 };

typedef struct {
    uint16_t d;             /* f16 scale */
    int8_t qs[QK8_0];       /* value = qs[i] * d */
} dfl_block_q8_0;           /* 34 bytes */

typedef struct {
    uint16_t d;             /* f16 scale */
    uint8_t qs[QK4_0 / 2];  /* element i < 16: low nibble of qs[i]; i >= 16: high nibble of
                               qs[i - 16]; value = (q - 8) * d */
} dfl_block_q4_0;           /* 18 bytes */

typedef struct {
    uint16_t d;             /* f16 scale */
    uint16_t m;             /* f16 min */
    uint8_t qs[QK4_1 / 2];  /* nibbles as in Q4_0; value = q * d + m */
} dfl_block_q4_1;           /* 20 bytes */

typedef struct {
    uint16_t d;             /* f16 super-block scale of the 6-bit scales */
    uint16_t dmin;          /* f16 super-block scale of the 6-bit mins */
    uint8_t scales[12];     /* 8 scales + 8 mins of 6 bits (sub-blocks of 32), packed */
    uint8_t qs[QK_K / 2];   /* 4-bit quants: 64-element groups, low nibbles then high */
} dfl_block_q4_K;           /* 144 bytes; value = d*sc[j]*q - dmin*m[j] */

typedef struct {
    uint8_t ql[QK_K / 2];   /* low 4 bits of the quants */
    uint8_t qh[QK_K / 4];   /* high 2 bits */
    int8_t scales[QK_K / 16]; /* one per 16 elements */
    uint16_t d;             /* f16 super-block scale */
} dfl_block_q6_K;           /* 210 bytes; value = d*scales[j]*(q - 32) */

/* ---- quantized activations (the layout of the matmul scratch) ------------
 * Each row of X becomes int8 blocks with one f32 scale per block: blocks of
 * 32 for Q8_0/Q4_0/Q4_1 weights, of 256 for K-quant weights, which also keep
 * the sum of every 16 quants (for the mins / the -32 offset of the formats). */
typedef struct dfl_qact {
    int blk;                /* 32 or 256 elements per scale */
    int cols;
    int n;                  /* rows */
    int8_t *q;              /* n * cols quants round(x / d), in [-127, 127], rows in groups of 8
                               (the last one smaller), each group [cols / 32, rows, 32]: a tile
                               reads its rows' 32 quants of a block as one run; see dfl_qact_q */
    float *d;               /* [ceil(n/8), cols / blk, 8]: max|x| / 127 (0 when max|x| <
                               2^-100), 8 rows side by side so that a tile of 8 rows
                               scales its 8 scales in one vector op; see dfl_qact_di */
    int16_t *bsum;          /* [n, cols / 16]: sums of 16 quants (K-quants only, else NULL) */
    float *s;               /* laid out as d: d x the sum of the block's 32 quants (Q4_1 only,
                               else NULL), ggml's q8_1 s: a block's min m enters as m * s */
    int32_t *xoff;          /* laid out as d: -z x the sum of the block's 32 quants, z the
                               weights' offset (else NULL): Q8_0 128 (filled on the AVX-512
                               path only: vpdpbusd takes the weights as
                               w + 128, unsigned), Q4_0 8 (filled on x86: its nibbles q enter
                               unsigned, (q - 8) . x = q . x - 8 sum x); a block's integer
                               sum starts from it */
} dfl_qact;

/* Index in dfl_qact.d of row r's scale of block b (nb blocks per row). */
static inline size_t dfl_qact_di(int nb, int r, int b) {
    return ((size_t)(r / 8) * nb + b) * 8 + r % 8;
}

/* Rows in row r's group of 8 in dfl_qact.q (fewer in the last group). */
static inline int dfl_qact_group(const dfl_qact *a, int r) {
    return a->n - r / 8 * 8 < 8 ? a->n - r / 8 * 8 : 8;
}

/* Row r's quants c*32 .. c*32+31 in dfl_qact.q. */
static inline int8_t *dfl_qact_q(const dfl_qact *a, int r, int c) {
    return a->q + (size_t)(r / 8 * 8) * a->cols + ((size_t)c * dfl_qact_group(a, r) + r % 8) * 32;
}

/* Internal to quant.c and quant_avx2.c / quant_avx512.c / quant_neon.c: the SIMD kernels, each the twin of a
 * plain-C function in quant.c with the same arithmetic. */
void dfl_qact_quant_avx2(dfl_qact *a, int n, const float *X, int ldx);
/* m->sc (kernels.h) for a Q8_0 / Q4_0 matrix on the AVX2 path; else nothing. */
void dfl_qmat_scales(dfl_mat *m);
/* Output rows [o0, o1) of W for all n activation rows. */
void dfl_qrows_avx2(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y, int ldy);
/* The AVX-512 kernels (quant_avx512.c): returns 1 if it computed the rows,
 * 0 if W's type or n has no AVX-512 kernel (then the AVX2 one runs). */
int dfl_qrows_avx512(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                     int ldy);
/* Element k of an f32 / f16 / bf16 weight row as f32 (matmul.c): the twins'
 * and every path's k tail read weights through it. */
float dfl_w_at(dfl_type t, const uint8_t *row, int k);
/* The AVX-512 f16 / bf16 kernels (matmul_avx512.c): outputs [o0, o1) of n
 * rows, matmul.c's twin; returns 0 where it has no kernel (the AVX2 one
 * runs: other types, fewer than 3 rows, a transposed copy). */
int dfl_matmul_rows_avx512(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                           float *Y, int ldy);
/* The NEON kernels (quant_neon.c, aarch64 with dotprod): the quantized rows, and
 * outputs [o0, o1) of n rows for f32 / f16 / bf16 weights (matmul.c's twin). */
void dfl_qrows_neon(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y, int ldy);
void dfl_matmul_rows_neon(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                          float *Y, int ldy);
/* The 8 6-bit scales and 8 mins of a Q4_K block from its 12 scale bytes. */
void dfl_q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]);

#endif
