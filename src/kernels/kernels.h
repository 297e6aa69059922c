/* kernels.h - CPU kernels. Every SIMD kernel has a plain-C twin (suffix _ref)
 * that is its specification; tests compare the two.
 *
 * Batch invariance (DESIGN.md): a row's result never depends on how many rows
 * are computed with it, nor on the thread count. Work is split by output
 * column; each output element is accumulated in one fixed order. */
#ifndef DFL_KERNELS_H
#define DFL_KERNELS_H

#include <stdint.h>

#include "base/base.h"

/* 1 when built for x86-64, where the AVX2 / AVX-512 kernels exist; other
 * targets compile only the twins (and, on aarch64, the NEON kernels). */
#if defined(__x86_64__)
#define DFL_X86 1
#else
#define DFL_X86 0
#endif

/* A weight matrix: rows outputs of cols inputs, row-major blocks of type
 * (or, il8 set, Q8_0 rows interleaved 8 at a time: dfl_qmat_il8). */
typedef struct dfl_mat {
    dfl_type type;
    int rows, cols;
    const uint8_t *data;   /* rows * row_bytes */
    size_t row_bytes;
    float *wt;             /* NULL, or the f32 transpose of a small matrix in panels of 24
                              outputs (dfl_mat_prepare), which dfl_matmul reads instead
                              of data */
    uint16_t *sc;          /* NULL, or Q4_0's (or a plain Q8_0's) f16 block scales, 8 rows
                              side by side: [(rows + 7) / 8][cols / 32][8]
                              (dfl_mat_prepare), which the AVX2 tiles of several rows
                              load instead of gathering */
    int il8;               /* data holds Q8_0 rows in groups of 8, block by block, each
                              block as the 8 rows' f16 scales, then for k = 0..7 each
                              row's quants 4k..4k+3: [rows / 8][cols / 32][16 + 8 * 32]
                              bytes, as many as the plain rows (dfl_qmat_il8) */
} dfl_mat;

/* Y[r, o] = sum_i W[o, i] * X[r, i] for r < n, o < W->rows.
 * X is [n, ldx] f32, Y is [n, ldy] f32. scratch holds quantized activations:
 * at least dfl_matmul_scratch(W->type, n, W->cols) bytes, 64-byte aligned. */
void dfl_matmul(dfl_pool *pool, const dfl_mat *W, int n, const float *X, int ldx, float *Y,
                int ldy, void *scratch);
size_t dfl_matmul_scratch(dfl_type t, int n, int cols);
/* k products Y[j] = W[j] X[j] over the same n rows (X[j]: n x W[j]->cols,
 * Y[j]: n x W[j]->rows) in one dispatch when the W are quantized of one type:
 * a decode step's q/k/v and gate/up, and a mixture of experts' 3 x top_k
 * small products, each woke the threads for a product of a few hundred KB to
 * a few MB, and waited at its end for the slower one. Each output is what
 * dfl_matmul gives. X[j] == X[j - 1] shares one quantized copy. scratch: at
 * least dfl_matmul_scratch(type, n, cols) bytes per distinct X. */
void dfl_matmul_group(dfl_pool *pool, const dfl_mat *const *W, int n, const float *const *X,
                      float *const *Y, int k, void *scratch);
/* Side copies that make products faster, with the same bits. A small float
 * matrix (f32 / f16 / bf16, at most 256 KiB as f32 and 192 columns: a model
 * whose weights sit in cache) gets its transpose in m->wt, so products
 * compute 8 outputs per vector with no horizontal sums. A Q4_0 matrix (or a
 * Q8_0 one not in il8), while the AVX2 path is in use, gets its block scales
 * side by side in m->sc (6% of its bytes). Returns 1 if it made a transpose. Call once
 * the data is final; dfl_mat_release frees what it made. */
int dfl_mat_prepare(dfl_mat *m);
void dfl_mat_release(dfl_mat *m);
/* Whether dfl_qmat_il8 would rewrite m: a Q8_0 matrix of whole groups of 8
 * plain rows while the AVX2 path is in use. */
int dfl_qmat_il8_wants(const dfl_mat *m);
/* Rewrites m's bytes in place into the il8 layout (the caller makes them
 * writable; every dfl_mat sharing them must set il8 too). Why: the AVX2 tiles
 * of several activation rows transposed each block of 8 weight rows with 24
 * shuffles; laid out so at load (the same bytes), products of 2-4 rows ran
 * 1.34-1.46x faster and of 8-32 rows 1.23-1.29x (Zen 3, bench_quant). */
void dfl_qmat_il8(dfl_mat *m);
/* Row r of m in f32, whatever its layout. */
void dfl_mat_row(const dfl_mat *m, int r, float *out);
/* Plain-C twin, single-threaded. */
void dfl_matmul_ref(const dfl_mat *W, int n, const float *X, int ldx, float *Y, int ldy);

/* Row conversion between f32 and a weight type. */
void dfl_dequant_row(dfl_type t, const void *src, float *dst, int cols);
/* Returns 0, or -1 if the type cannot be written (cols not a block multiple). */
int dfl_quant_row(dfl_type t, const float *src, void *dst, int cols);

float dfl_f16_to_f32(uint16_t h);
uint16_t dfl_f32_to_f16(float f);
float dfl_bf16_to_f32(uint16_t h);
uint16_t dfl_f32_to_bf16(float f);   /* round to nearest even */

/* ---- small ops (all per row, so batch invariant by construction) --------- */

/* y = x / sqrt(mean(x^2) + eps) * w, n elements. y may alias x. */
void dfl_rmsnorm(float *y, const float *x, const float *w, int n, float eps);

/* RoPE tables: cos/sin for each position and frequency pair. */
typedef struct dfl_rope {
    int head_dim;       /* rotated dims: the first head_dim of each head */
    int stride;         /* dims from one head to the next (partial rotary: > head_dim);
                           0: head_dim */
    int neox;           /* 1: rotate halves (HF); 0: interleaved pairs (Meta/GGUF llama) */
    float *inv_freq;    /* [head_dim/2], with llama3 / yarn scaling applied */
    float mscale;       /* yarn attention factor applied to cos/sin */
} dfl_rope;

/* Rotates n_heads heads of x (head_dim each, contiguous) at position pos. */
void dfl_rope_apply(const dfl_rope *r, float *x, int n_heads, int pos);
/* The same rotation in two steps, so a forward computes a row's cos/sin once
 * for all its layers and heads: cs (head_dim floats) gets cos of each pair,
 * then sin; dfl_rope_apply_cs rotates with them (same bits as dfl_rope_apply). */
void dfl_rope_cs(const dfl_rope *r, int pos, float *cs);
void dfl_rope_apply_cs(const dfl_rope *r, float *x, int n_heads, const float *cs);

/* out = silu(gate) * up, n elements. */
void dfl_swiglu(float *out, const float *gate, const float *up, int n);

enum { DFL_MAX_HEAD_DIM = 1024 };   /* the largest head attention takes (configs are checked) */

/* Keys and values for attention, f32 or f16: kv head h's key j starts at
 * element h * hs + j * ldk of K (its value likewise in V). Interleaved heads
 * have hs = hd, ldk = n_kv*hd; one contiguous run per head hs = rows*hd,
 * ldk = hd. */
typedef struct dfl_kv_view {
    const void *K, *V;
    dfl_type type;        /* DFL_F32 or DFL_F16 */
    int ldk;              /* elements from one key to the next */
    size_t hs;            /* elements from one kv head's keys to the next's */
    /* Keys from `split` on (a multiple of DFL_ATT_BLOCK) are read from K2 / V2
     * instead, key j at element h * hs2 + (j - split) * ldk: a tree row's last
     * prefix block and its ancestors, gathered (models/forward.c). Whole key
     * blocks come from one source, so the sums are those of the plain view.
     * K2 NULL: none. */
    const void *K2, *V2;
    int split;
    size_t hs2;
} dfl_kv_view;
/* Keys per online-softmax block of the attention kernels (a row's sums split there). */
enum { DFL_ATT_BLOCK = 64 };

/* Attention for n query rows. q: [n, n_heads*hd]; row r attends keys
 * [0, n_keys[r]) of kv. out: [n, n_heads*hd]. No scratch: bounded stack
 * buffers only. Online softmax in key order, one head per task: batch
 * invariant. f16 elements are widened exactly, so an f16 cache gives the
 * bits of an f32 one holding the same (rounded) values. */
void dfl_attention(dfl_pool *pool, int n, const float *q, const dfl_kv_view *kv,
                   const int *n_keys, int n_heads, int n_kv, int hd, float scale, float *out);
/* The same with a learned sink logit per query head (sinks[h], compared with
 * the scaled scores): it joins each softmax denominator and adds no value. */
void dfl_attention_sinks(dfl_pool *pool, int n, const float *q, const dfl_kv_view *kv,
                         const int *n_keys, int n_heads, int n_kv, int hd, float scale,
                         const float *sinks, float *out);
void dfl_attention_ref(int n, const float *q, const dfl_kv_view *kv, const int *n_keys,
                       int n_heads, int n_kv, int hd, float scale, float *out);

/* Index of the largest value (first on ties). */
int dfl_argmax(const float *x, int n);

/* ---- which path runs ---------------------------------------------------
 * generic: the plain-C twins; avx2: AVX2+FMA+F16C; avx512: AVX-512 F/BW/VL
 * with VNNI (the quantized products; kernels without an AVX-512 form run
 * their AVX2 one); neon: aarch64 Advanced SIMD with the dot-product
 * extension (the weight products; the other kernels run their twins). All
 * compute the same bits. */
typedef enum { DFL_ISA_GENERIC, DFL_ISA_AVX2, DFL_ISA_AVX512, DFL_ISA_NEON, DFL_ISA_COUNT } dfl_isa;

int dfl_cpu_has_avx2(void);
int dfl_cpu_has_avx512(void);
int dfl_cpu_has_neon(void);                /* aarch64 with asimd and asimddp (dotprod) */
int dfl_cpu_has_isa(dfl_isa isa);          /* 1 when this CPU (and build) can run the path */
dfl_isa dfl_cpu_isa(void);                 /* the best path this CPU can run */
void dfl_cpu_features(char *out, size_t cap);  /* "avx2 fma ... avx512vnni ..." as found */
const char *dfl_isa_name(dfl_isa isa);     /* "generic", "avx2", "avx512", "neon" */
int dfl_isa_from_name(const char *s);      /* -1 if not one of those */
/* Process-wide: the path every kernel takes from now on. Returns -1 (and
 * changes nothing) when the CPU lacks it. */
int dfl_kernels_set_isa(dfl_isa isa);
dfl_isa dfl_kernels_isa(void);             /* the path in use (default: dfl_cpu_isa) */
void dfl_kernels_force_ref(int on);        /* 1: generic; 0: back to the path set before */
int dfl_kernels_simd(void);                /* 1 when an AVX2 or AVX-512 path runs */

#endif
