/* weights.h - binds named file tensors to model fields, shared by the target
 * and drafter loaders: exact shape checks, conversion to the --dtype asked
 * for, norms as f32, and a final check that no tensor was left unused. */
#ifndef DFL_WEIGHTS_H
#define DFL_WEIGHTS_H

#include "models/model.h"

typedef struct dfl_weights {
    dfl_tensors *ts;
    int convert;          /* convert matrices to type ... */
    int floats_only;      /* ... only those stored as f32/f16/bf16 */
    dfl_type type;
    void *owned;          /* list of allocations made here (converted data) */
    dfl_progress_fn progress;
    void *progress_ud;
} dfl_weights;

int dfl_w_begin(dfl_weights *w, dfl_tensors *ts, const dfl_load_opts *o, dfl_error *err);
/* A 2-D tensor of exactly [rows, cols]. */
int dfl_w_mat(dfl_weights *w, const char *name, int rows, int cols, dfl_mat *m, dfl_error *err);
/* A 3-D tensor of exactly [n, rows, cols] as n matrices m[0..n) (fused
 * experts, as recent transformers saves them). */
int dfl_w_stack(dfl_weights *w, const char *name, int n, int rows, int cols, dfl_mat *m,
                dfl_error *err);
/* 1 when the file has tensor name (to choose between two layouts). */
int dfl_w_has(dfl_weights *w, const char *name);
/* A 1-D tensor of n elements, as f32 (converted when stored otherwise). */
int dfl_w_vec(dfl_weights *w, const char *name, int n, const float **v, dfl_error *err);
/* The same plus off on every element, in an owned copy (norms stored as w
 * and applied as 1 + w). */
int dfl_w_vec_offset(dfl_weights *w, const char *name, int n, float off, const float **v,
                     dfl_error *err);
/* A tensor of exactly n_dims dims as f32 (elements + off), e.g. a conv
 * kernel [C, 1, K]. */
int dfl_w_array(dfl_weights *w, const char *name, int n_dims, const int *dims, float off,
                const float **v, dfl_error *err);
/* Optional GGUF rope_freqs.weight (Llama-3 frequency factors): divides inv_freq. */
int dfl_w_rope_freqs(dfl_weights *w, const char *name, dfl_rope *r, dfl_error *err);
/* Undoes llama.cpp's q/k row permutation (Meta's interleaved RoPE pairs back
 * to Hugging Face's rotate-half halves) in an owned copy, so every model runs
 * one RoPE layout and a GGUF computes the same bits as its HF original. */
int dfl_w_unpermute(dfl_weights *w, dfl_mat *m, int n_heads, int head_dim, dfl_error *err);
/* n floats owned by w (freed with the weights), for values derived at load. */
float *dfl_w_own_floats(dfl_weights *w, size_t n, dfl_error *err);

/* llama.cpp's Qwen3.5 converter stores value heads tiled (head j of key head k
 * at j * n_k + k) where Hugging Face groups them (k * per_k + j); the engine
 * runs the grouped order, so every dot product sums in the original order. A
 * head is seg units (rows, columns or floats). */
typedef struct dfl_tiling {
    int n_k, per_k, seg;
} dfl_tiling;
/* n_k * per_k segments of seg bytes from tiled src into grouped dst. */
void dfl_untile(uint8_t *dst, const uint8_t *src, const dfl_tiling *g, size_t seg);
/* m's rows from first on (g->seg rows a head), in an owned copy. */
int dfl_w_untile_rows(dfl_weights *w, dfl_mat *m, int first, const dfl_tiling *g,
                      dfl_error *err);
/* A [rows, cols] matrix whose columns are tiled heads of g->seg columns,
 * loaded, untiled, then converted to --dtype. */
int dfl_w_mat_untile_cols(dfl_weights *w, const char *name, int rows, int cols,
                          const dfl_tiling *g, dfl_mat *m, dfl_error *err);
/* *v (n floats) from entry first on, per_seg floats an entry, g->seg entries
 * a head: into an owned copy. */
int dfl_w_untile_floats(dfl_weights *w, const float **v, int n, int first, const dfl_tiling *g,
                        int per_seg, dfl_error *err);
/* m, a matrix another model bound (a drafter reading its target's lm_head),
 * converted as w's own matrices are, into a copy owned by w; unchanged when
 * they are not converted. */
int dfl_w_convert(dfl_weights *w, const char *name, dfl_mat *m, dfl_error *err);
/* Marks tensors whose name ends with suffix as used (known, ignored). */
void dfl_w_ignore(dfl_weights *w, const char *suffix);
/* Marks tensors whose name starts with prefix as used (another model's
 * parts in the file: a vision tower, an MTP head not run). */
void dfl_w_ignore_prefix(dfl_weights *w, const char *prefix);
/* Refuses any tensor not bound: names the first few. */
int dfl_w_end(dfl_weights *w, dfl_error *err);
void dfl_weights_free_owned(void *owned);
/* dfl_mat_prepare, after giving a Q8_0 matrix the il8 layout in its own
 * bytes where the AVX2 path runs (dfl_qmat_il8): bytes of the list owned
 * (converted at load) as they are, bytes of one of ts's mappings made
 * writable for it; others (whose writability is unknown) keep the plain
 * layout. Every dfl_mat that shares m's bytes must copy its il8 after. */
void dfl_w_prepare(dfl_tensors *ts, const void *owned, dfl_mat *m);

#endif
