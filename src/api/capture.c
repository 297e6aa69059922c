/* capture.c - what drafter training reads from the target (dflash capture):
 * hidden features of chosen layers over whole sequences, and the target's
 * token embedding and lm_head as float32. The features come from the same
 * forward that verification runs, so a drafter trains on exactly what it
 * will see at inference. */
#include <string.h>

#include "engine.h"

int dfl_capture_rows(dfl_session *s, const int32_t *ids, int n, const int *layers, int n_layers,
                     float *feat, dfl_error *err) {
    if (n < 1 || n > s->e->ctx_size)
        return dfl_fail(err, DFL_EARG, "%d rows to capture: expected 1..%d (the context size)",
                        n, s->e->ctx_size);
    if (n_layers < 1 || n_layers > DFL_MAX_CAPTURE_LAYERS || !feat)
        return dfl_fail(err, DFL_EARG, "capture needs 1..%d layers and a feature buffer",
                        DFL_MAX_CAPTURE_LAYERS);
    return dfl_debug_forward(s, ids, n, layers, n_layers, NULL, feat, err);
}

static void dequant_all(const dfl_mat *m, float *out) {
    for (int r = 0; r < m->rows; r++) dfl_mat_row(m, r, out + (size_t)r * m->cols);
}

int dfl_export_embeddings(const dfl_engine *e, float *embed, float *lm_head, dfl_error *err) {
    if (!e->t) return dfl_fail(err, DFL_EARG, "engine was loaded for its vocabulary only");
    const dfl_target *t = e->t;
    if (embed) dequant_all(&t->embed, embed);
    if (lm_head) dequant_all(&t->lm_head, lm_head);
    return 0;
}

int dfl_capture_default_layers(const dfl_engine *e, int n_draft, int *ids) {
    if (!e->t || n_draft < 1 || n_draft > DFL_MAX_CAPTURE_LAYERS) return 0;
    return dfl_dflash_default_layers(e->t->c.n_layers, n_draft, ids);
}
