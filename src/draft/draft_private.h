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
    DRAFT_MAX_WINDOW = 1 << 20,   /* a drafter's sliding_window: 2..this */
    DRAFT_MAX_SEL_RANK = 4096,    /* DFlash2 selector_rank: 1..this (published: 256) */
    DRAFT_MAX_SEL_TOP_K = 1024,   /* DFlash2 selector_top_k: 1..this and the vocabulary */
};

/* draft_config.c: dflash_config.target_layer_ids into d->cap / d->n_cap; when absent,
 * required refuses, else z-lab's default rule spreads them. */
int dfl_draft_layer_ids(dfl_drafter *d, const cJSON *dc, const dfl_target *t, int required,
                        const char *file, dfl_error *err);

/* Sliding-window rules every form shares, for the layers in bitmask
 * sliding (bit l: layer l) with window rows: dflash_config.use_swa and
 * swa_window_size agree when given, window in 2..DRAFT_MAX_WINDOW, sliding
 * layers causal (is_causal / dflash_config.causal set d->causal, the full
 * layers' rule). Sets d->swa, d->sliding, d->causal. */
int dfl_draft_swa_rules(dfl_drafter *d, const cJSON *j, const cJSON *dc, uint64_t sliding,
                        int window, const char *file, dfl_error *err);
/* z-lab / DFlash2 config.json: layer_types or use_sliding_window +
 * max_window_layers, and sliding_window, then the rules above. Needs
 * d->c.n_layers read first. */
int dfl_draft_sliding(dfl_drafter *d, const cJSON *j, const cJSON *dc, const char *file,
                      dfl_error *err);

/* Refuses a drafter of one kind on a target of the other, naming both. */
int dfl_draft_pairing(int kind, const dfl_target *t, const char *file, dfl_error *err);

/* DFlashLagunaForCausalLM's config.json (already parsed, j) into d
 * (laguna_dflash_config.c). */
int dfl_laguna_draft_config(dfl_drafter *d, cJSON *j, const dfl_target *t, const char *file,
                            dfl_error *err);
/* Its tensors, names without the "model." prefix (laguna_dflash.c). */
int dfl_laguna_draft_weights(dfl_drafter *d, dfl_weights *w, dfl_error *err);

/* DFlash2DraftModel's dflash_config keys (dflash2_config.c): conv_kernel_size,
 * conv_group_size, selector_rank, selector_top_k (all required), and the
 * optional output_multiplier and final_logit_softcapping of the unary
 * logits. Needs d->c.dim, d->c.vocab and d->block_size read first. */
int dfl_dflash2_config(dfl_drafter *d, const cJSON *dc, const char *file, dfl_error *err);
/* Its tensors past z-lab's (dflash2.c): each layer's attention_conv and
 * mlp_conv, the candidate_selector; gguf: llama.cpp's names for them. */
int dfl_dflash2_weights(dfl_drafter *d, dfl_weights *w, int gguf, dfl_error *err);
/* The grouped dynamic causal conv of one block's n rows y (n, dim), in place:
 * y_i = sum_t (base[t] + dk_i[t][g]) * y_{i-t}, taps before row 0 zero;
 * dk rows (n, ldk) hold the side's K*G taps, base (K, dim). */
void dfl_dflash2_conv(const dfl_drafter *d, const float *base, const float *dk, int ldk,
                      float *y, int n);
/* A row's candidates: the top-K of its head logits (vocab) after the unary
 * transform, best first (ties: lower id first), into cand and unary. */
void dfl_dflash2_topk(const dfl_drafter *d, const float *logits, int32_t *cand, float *unary);
/* The greedy chain over n rows (cand, unary (n, K), ph (n, r)): row i scores
 * unary + <A[prev] * ph_i, B[cand]>, prev the anchor then the last pick;
 * draft[i] = the best; logits (n, vocab) when not NULL get the scores at the
 * candidates and -inf elsewhere. */
void dfl_dflash2_walk(const dfl_drafter *d, int32_t anchor, int n, const int32_t *cand,
                      const float *unary, const float *ph, float *logits, int32_t *draft);

/* The MTP head's parts of the drafter and store calls (mtp.c). */
void dfl_mtp_free(dfl_mtp *m, int n_experts);
void dfl_mtp_store_init(const dfl_drafter *d, dfl_dstore *s, int ctx);
void dfl_mtp_store_truncate(dfl_dstore *s, int n_keep);
/* dst takes src's first n rows; returns the rows it holds (0: it was emptied). */
int dfl_mtp_store_copy(dfl_dstore *dst, const dfl_dstore *src, int n);
int dfl_mtp_draft(dfl_drafter *d, dfl_dstore *s, int32_t anchor, int n_out, float *logits,
                  int32_t *draft, dfl_error *err);

#endif
