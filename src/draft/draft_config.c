/* draft_config.c - drafter config rules every form shares: which targets a
 * drafter pairs with, and dflash_config.target_layer_ids (z-lab's default
 * rule when absent). Apart from the forward so the config fuzzer links only
 * the readers. */
#include <math.h>

#include "draft/draft_private.h"

int dfl_dflash_default_layers(int n_target, int n_draft, int *ids) {
    if (n_draft == 1) {
        ids[0] = n_target / 2;
        return 1;
    }
    /* Python's int(round(1 + i*span/(L-1))): true division, ties to even. */
    int span = n_target - 4;
    for (int i = 0; i < n_draft; i++)
        ids[i] = (int)rint(1.0 + (double)(i * span) / (double)(n_draft - 1));
    return n_draft;
}

static const char *kind_name[] = {
    [DFL_DRAFT_ZLAB] = "a z-lab DFlash drafter (DFlashDraftModel)",
    [DFL_DRAFT_LAGUNA] = "a Laguna DFlash drafter (DFlashLagunaForCausalLM)",
    [DFL_DRAFT_MTP] = "an MTP head",
    [DFL_DRAFT_DFLASH2] = "a z-lab DFlash2 drafter (DFlash2DraftModel)"};

/* A drafter is trained on one target family's features, embedding and
 * lm_head: z-lab's on dense Llama/Qwen targets, Laguna's on Laguna. */
int dfl_draft_pairing(int kind, const dfl_target *t, const char *file, dfl_error *err) {
    int laguna = t->c.arch == ARCH_LAGUNA;
    if (laguna == (kind == DFL_DRAFT_LAGUNA)) return 0;
    const char *tsrc = t->gguf ? t->gguf->tensors.source : t->ts.source;
    return dfl_fail(err, DFL_EUNSUP, "%s is %s, but the target %s is %s: it pairs only with %s",
                    file, kind_name[kind], tsrc ? tsrc : "",
                    laguna ? "a Laguna model (LagunaForCausalLM)"
                           : "not a Laguna model (a dense Llama/Qwen family)",
                    laguna ? "a Laguna DFlash drafter (DFlashLagunaForCausalLM)"
                           : "a z-lab DFlash drafter (DFlashDraftModel)");
}

int dfl_draft_layer_ids(dfl_drafter *d, const cJSON *dc, const dfl_target *t, int required,
                        const char *file, dfl_error *err) {
    const cJSON *ids = dc ? cJSON_GetObjectItemCaseSensitive(dc, "target_layer_ids") : NULL;
    if ((!ids || cJSON_IsNull(ids)) && required)
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash_config.target_layer_ids is missing", file);
    if (!ids || cJSON_IsNull(ids)) {
        if (d->c.n_layers > DFL_MAX_CAPTURE_LAYERS)
            return dfl_fail(err, DFL_EFORMAT, "%s: %d drafter layers imply %d target layers, "
                            "more than %d", file, d->c.n_layers, d->c.n_layers,
                            DFL_MAX_CAPTURE_LAYERS);
        d->n_cap = dfl_dflash_default_layers(t->c.n_layers, d->c.n_layers, d->cap);
        return 0;
    }
    int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : -1;
    if (n < 1 || n > DFL_MAX_CAPTURE_LAYERS)
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash_config.target_layer_ids must be an array "
                        "of 1..%d layer ids", file, DFL_MAX_CAPTURE_LAYERS);
    int i = 0;
    for (const cJSON *e = ids->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
            fabs(e->valuedouble) > 1e6)
            return dfl_fail(err, DFL_EFORMAT, "%s: dflash_config.target_layer_ids[%d] is not an "
                            "integer", file, i);
        d->cap[i] = (int)e->valuedouble;
    }
    d->n_cap = n;
    return 0;
}
