/* draft_config.c - drafter config rules every form shares: which targets a
 * drafter pairs with, and dflash_config.target_layer_ids (z-lab's default
 * rule when absent). Apart from the forward so the config fuzzer links only
 * the readers. */
#include <math.h>
#include <string.h>

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

/* is_causal, else dflash_config.causal, else sliding layers causal and full
 * layers not (vLLM's and z-lab's rule). The window's reach past a
 * non-causal row is not defined by the published code, so non-causal
 * sliding layers are refused. d->causal is the full layers' rule. */
static int causality(dfl_drafter *d, const cJSON *j, const cJSON *dc, int sliding,
                     const char *file, dfl_error *err) {
    int v = -1, b = 0, rc = dfl_json_bool(j, "is_causal", &b, file, err);
    if (rc < 0) return rc;
    if (rc == 0) v = b;
    if (v < 0 && (rc = dfl_json_bool(dc, "causal", &b, file, err)) < 0) return rc;
    if (v < 0 && rc == 0) v = b;
    if (sliding && v == 0)
        return dfl_fail(err, DFL_EUNSUP, "%s: is_causal / dflash_config.causal = false with "
                        "sliding_attention layers: non-causal sliding-window drafters are not "
                        "supported", file);
    d->causal = v > 0;
    return 0;
}

int dfl_draft_swa_rules(dfl_drafter *d, const cJSON *j, const cJSON *dc, uint64_t sliding,
                        int window, const char *file, dfl_error *err) {
    int use = sliding != 0, rc = dfl_json_bool(dc, "use_swa", &use, file, err);
    if (rc < 0) return rc;
    if (use != (sliding != 0))
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash_config.use_swa = %s but %s", file,
                        use ? "true" : "false", use ? "no layer is sliding_attention"
                                                    : "layer_types has sliding_attention layers");
    rc = causality(d, j, dc, sliding != 0, file, err);
    if (rc || !sliding) return rc;
    if (window < 2 || window > DRAFT_MAX_WINDOW)
        return dfl_fail(err, DFL_EFORMAT, "%s: sliding_window = %d outside 2..%d", file, window,
                        DRAFT_MAX_WINDOW);
    int64_t w = window;
    if (dfl_json_int(dc, "swa_window_size", 1, DRAFT_MAX_WINDOW, &w, file, err) > 1)
        return err ? err->code : DFL_EFORMAT;
    if (w != window)
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash_config.swa_window_size = %lld differs from "
                        "sliding_window = %d", file, (long long)w, window);
    d->swa = window;
    d->sliding = sliding;
    return 0;
}

/* layer_types, else Qwen2's legacy use_sliding_window (layers from
 * max_window_layers on slide; transformers' default 28). */
static int sliding_bits(const cJSON *j, int n_layers, uint64_t *out, const char *file,
                        dfl_error *err) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    *out = 0;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != n_layers)
            return dfl_fail(err, DFL_EFORMAT, "%s: layer_types must be an array of "
                            "num_hidden_layers (%d) strings", file, n_layers);
        int l = 0;
        for (const cJSON *e = lt->child; e; e = e->next, l++) {
            const char *s = cJSON_IsString(e) ? e->valuestring : "?";
            if (!strcmp(s, "sliding_attention")) *out |= (uint64_t)1 << l;
            else if (strcmp(s, "full_attention"))
                return dfl_fail(err, DFL_EUNSUP, "%s: layer_types[%d] is \"%.32s\"; expected "
                                "\"full_attention\" or \"sliding_attention\"", file, l, s);
        }
        return 0;
    }
    int use = 0, rc = dfl_json_bool(j, "use_sliding_window", &use, file, err);
    if (rc < 0 || !use) return rc < 0 ? rc : 0;
    int64_t from = 28;
    rc = dfl_json_int(j, "max_window_layers", 0, 1 << 16, &from, file, err);
    if (rc > 1 || rc < 0) return rc;
    for (int l = (int)from; l < n_layers; l++) *out |= (uint64_t)1 << l;
    return 0;
}

int dfl_draft_sliding(dfl_drafter *d, const cJSON *j, const cJSON *dc, const char *file,
                      dfl_error *err) {
    uint64_t bits = 0;
    int rc = sliding_bits(j, d->c.n_layers, &bits, file, err);
    if (rc) return rc;
    int64_t w = 0;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (bits && (!sw || cJSON_IsNull(sw)))
        return dfl_fail(err, DFL_EFORMAT, "%s: sliding_window is missing (sliding_attention "
                        "layers need it, 2..%d)", file, DRAFT_MAX_WINDOW);
    if (bits && (rc = dfl_json_int(j, "sliding_window", 2, DRAFT_MAX_WINDOW, &w, file, err)))
        return rc;
    return dfl_draft_swa_rules(d, j, dc, bits, (int)w, file, err);
}
