/* dflash2_config.c - DFlash2DraftModel's dflash_config keys past z-lab's:
 * the grouped dynamic conv (conv_kernel_size taps, conv_group_size channels
 * per group) and the candidate selector (selector_rank, selector_top_k, and
 * the unary transform's output_multiplier and final_logit_softcapping).
 * Apart from the forward so the config fuzzer links only the readers. */
#include <math.h>

#include "draft/draft_private.h"

/* A required integer key of dflash_config in lo..hi. */
static int need(const cJSON *dc, const char *key, int lo, int hi, int *out, const char *file,
                dfl_error *err) {
    int64_t v;
    int rc = dfl_json_int(dc, key, lo, hi, &v, file, err);
    if (rc == 1)
        return dfl_fail(err, DFL_EFORMAT, "%s: dflash_config.%s is missing (a DFlash2 drafter "
                        "needs conv_kernel_size, conv_group_size, selector_rank and "
                        "selector_top_k)", file, key);
    if (rc) return rc;
    *out = (int)v;
    return 0;
}

int dfl_dflash2_config(dfl_drafter *d, const cJSON *dc, const char *file, dfl_error *err) {
    int dim = d->c.dim, top_hi = d->c.vocab < DRAFT_MAX_SEL_TOP_K ? d->c.vocab
                                                                   : DRAFT_MAX_SEL_TOP_K;
    int rc = need(dc, "conv_kernel_size", 1, d->block_size, &d->conv_k, file, err);
    rc = rc ? rc : need(dc, "conv_group_size", 1, dim, &d->conv_group, file, err);
    if (!rc && dim % d->conv_group)
        rc = dfl_fail(err, DFL_EFORMAT, "%s: dflash_config.conv_group_size %d does not divide "
                      "hidden_size %d", file, d->conv_group, dim);
    rc = rc ? rc : need(dc, "selector_rank", 1, DRAFT_MAX_SEL_RANK, &d->sel_rank, file, err);
    rc = rc ? rc : need(dc, "selector_top_k", 1, top_hi < 1 ? 1 : top_hi, &d->sel_top_k, file,
                        err);
    double mult = 1.0, cap = 0.0;
    int r = rc ? rc : dfl_json_num(dc, "output_multiplier", 1e-6, 1e6, &mult, file, err);
    rc = r == 1 ? 0 : r;
    /* null: no softcap (SpecForge reads it so) */
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(dc, "final_logit_softcapping");
    if (!rc && sc && !cJSON_IsNull(sc)) {
        r = dfl_json_num(dc, "final_logit_softcapping", 1e-3, 1e6, &cap, file, err);
        rc = r == 1 ? 0 : r;
    }
    d->sel_mult = (float)mult;
    d->sel_cap = (float)cap;
    return rc;
}
