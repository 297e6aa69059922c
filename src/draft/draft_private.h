/* draft_private.h - what the drafter's files share: dflash.c (the z-lab
 * drafter, the forward, the side store), draft_config.c (pairing, layer
 * ids), laguna_dflash_config.c and laguna_dflash.c (the Laguna drafter's
 * config and tensors). */
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

#endif
