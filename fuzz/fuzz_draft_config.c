/* fuzz_draft_config.c - libFuzzer target: a Laguna DFlash drafter's
 * config.json against a fixed Laguna target (pairing, range checks, the
 * layer and RoPE rules), then the RoPE table a config that passed implies;
 * its dflash_config as a DFlash2 drafter's (conv and selector keys); and
 * its sliding-window keys as a z-lab / DFlash2 drafter's (layer_types or
 * use_sliding_window + max_window_layers, sliding_window, causality). */
#include <cjson/cJSON.h>
#include <string.h>

#include "draft/draft_private.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dfl_error e;
    cJSON *j = dfl_json_parse((const char *)data, size, "config.json", &e);
    if (!j) return 0;
    static dfl_target t;
    t.c.arch = ARCH_LAGUNA, t.c.vocab = 512, t.c.n_layers = 4, t.c.dim = 64;
    static dfl_drafter d;
    memset(&d, 0, sizeof d);
    d.t = &t;
    if (dfl_laguna_draft_config(&d, j, &t, "config.json", &e) == 0) {
        dfl_rope r;
        dfl_rope_init(&r, &d.c);
        free(r.inv_freq);
    }
    memset(&d, 0, sizeof d);
    d.t = &t, d.c.dim = t.c.dim, d.c.vocab = t.c.vocab, d.block_size = 8;
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(j, "dflash_config");
    if (cJSON_IsObject(dc)) dfl_dflash2_config(&d, dc, "config.json", &e);
    memset(&d, 0, sizeof d);
    d.c.n_layers = 3;
    dfl_draft_sliding(&d, j, dc, "config.json", &e);
    cJSON_Delete(j);
    return 0;
}
