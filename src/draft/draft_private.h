/* draft_private.h - what the drafter's files share: dflash.c (the z-lab
 * drafter, the forward, the side store), draft_config.c (pairing, layer
 * ids), laguna_dflash_config.c and laguna_dflash.c (the Laguna drafter's
 * config and tensors), mtp.c (the native MTP head). */
#ifndef DFL_DRAFT_PRIVATE_H
#define DFL_DRAFT_PRIVATE_H

#include <cjson/cJSON.h>

#include "draft/draft.h"
#include "models/weights.h"

/* Limits of a drafter's config, every form. */
enum {
    DRAFT_MAX_LAYERS = 64,        /* num_hidden_layers / dflash.block_count: 1..this */
    DRAFT_MAX_WINDOW = 1 << 20,   /* sliding_window of a Laguna drafter: 2..this */
};

/* draft_config.c: dflash_config.target_layer_ids into d->cap / d->n_cap; when absent,
 * required refuses, else z-lab's default rule spreads them. */
int dfl_draft_layer_ids(dfl_drafter *d, const cJSON *dc, const dfl_target *t, int required,
                        const char *file, dfl_error *err);

/* Refuses a drafter of one kind on a target of the other, naming both. */
int dfl_draft_pairing(int kind, const dfl_target *t, const char *file, dfl_error *err);

/* DFlashLagunaForCausalLM's config.json (already parsed, j) into d
 * (laguna_dflash_config.c). */
int dfl_laguna_draft_config(dfl_drafter *d, cJSON *j, const dfl_target *t, const char *file,
                            dfl_error *err);
/* Its tensors, names without the "model." prefix (laguna_dflash.c). */
int dfl_laguna_draft_weights(dfl_drafter *d, dfl_weights *w, dfl_error *err);

/* The MTP head's parts of the drafter and store calls (mtp.c). */
void dfl_mtp_free(dfl_mtp *m, int n_experts);
void dfl_mtp_store_init(const dfl_drafter *d, dfl_dstore *s, int ctx);
void dfl_mtp_store_truncate(dfl_dstore *s, int n_keep);
/* dst takes src's first n rows; returns the rows it holds (0: it was emptied). */
int dfl_mtp_store_copy(dfl_dstore *dst, const dfl_dstore *src, int n);
int dfl_mtp_draft(dfl_drafter *d, dfl_dstore *s, int32_t anchor, int n_out, float *logits,
                  int32_t *draft, dfl_error *err);

#endif
