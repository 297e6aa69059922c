/* quant.h - quantized weight formats (Q8_0, Q4_0, Q4_K, Q6_K): row
 * conversion and matmul. kernels.c dispatches quantized types here; the same
 * batch-invariance rules as kernels.h apply (split by output row, one fixed
 * accumulation order per output element). */
#ifndef DFL_QUANT_H
#define DFL_QUANT_H

#include "kernels/kernels.h"

/* Y[r, o] = sum_i W[o, i] * X[r, i] for a quantized W; scratch holds at least
 * dfl_qmatmul_scratch(W->type, n, W->cols) bytes, 64-byte aligned. */
void dfl_qmatmul(dfl_pool *pool, const dfl_mat *W, int n, const float *X, int ldx, float *Y,
                 int ldy, void *scratch);
/* Plain-C twin, single-threaded. */
void dfl_qmatmul_ref(const dfl_mat *W, int n, const float *X, int ldx, float *Y, int ldy);
size_t dfl_qmatmul_scratch(dfl_type t, int n, int cols);
void dfl_qdequant_row(dfl_type t, const void *src, float *dst, int cols);
/* Returns 0, or -1 if cols is not a block multiple. */
int dfl_qquant_row(dfl_type t, const float *src, void *dst, int cols);

#endif
