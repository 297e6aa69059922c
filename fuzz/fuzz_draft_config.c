/* fuzz_draft_config.c - libFuzzer target: a Laguna DFlash drafter's
 * config.json against a fixed Laguna target (pairing, range checks, the
 * layer and RoPE rules), then the RoPE table a config that passed implies. */
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
    cJSON_Delete(j);
    return 0;
}
