/* family.h - a model family: the tensors of its layers. Which kind each
 * layer's mixer and MLP are is in its config (layer_kind, mlp_kind); the
 * forward (forward.c) runs any table of kinds, and the globals (embedding,
 * final norm, lm_head) are the same everywhere (target.c). Adding a family
 * is one file with its config reader and its load_layer, plus an entry in
 * target.c's table and config.c's architecture list. */
#ifndef DFL_FAMILY_H
#define DFL_FAMILY_H

#include "models/model.h"
#include "models/weights.h"

typedef struct dfl_family {
    const char *name;
    /* Binds layer l's tensors into t->layers[l] (HF or GGUF names: t->gguf). */
    int (*load_layer)(dfl_target *t, dfl_weights *w, int l, dfl_error *err);
} dfl_family;

extern const dfl_family dfl_family_dense;    /* llama.c: Llama, Mistral, Qwen2, Qwen3 */
extern const dfl_family dfl_family_laguna;   /* laguna.c */
extern const dfl_family dfl_family_qwen35;   /* qwen35.c: Qwen3.5 hybrid */

/* Qwen3.5 / Qwen3-Next: layer l of t (its kinds in t->c, names under t->prefix)
 * into t->layers[l]; the MTP head's block loads through it too (qwen35.c). */
int dfl_qwen35_load_block(dfl_target *t, dfl_weights *w, int l, dfl_error *err);
/* Where checkpoints keep the MTP head's tensors: "mtp." (as released), or
 * under the decoder's prefix; NULL-terminated. */
extern const char *const dfl_mtp_prefixes[];

/* Layer l's mixture of experts (moe.c) into L->moe; lfmt names the layer
 * ("model.layers.%d."). */
int dfl_load_moe(dfl_weights *w, const dfl_config *c, const char *lfmt, int l, dfl_layer *L,
                 dfl_error *err);

/* The same from a GGUF in llama.cpp's names (blk.N.ffn_*_exps, *_shexp). */
int dfl_load_moe_gguf(dfl_weights *w, const dfl_config *c, int l, dfl_layer *L, dfl_error *err);

/* "model.layers.%d.xxx" with l filled in, into buf (256 bytes). */
const char *dfl_lname(char *buf, const char *fmt, int l);

#endif
