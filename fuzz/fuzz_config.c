/* fuzz_config.c - libFuzzer target: config.json parse and range checks, then
 * the RoPE table a config that passed implies. */
#include "models/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dfl_config c;
    dfl_error e;
    if (dfl_config_from_json((const char *)data, size, &c, &e) == 0) {
        dfl_rope r;
        dfl_rope_init(&r, &c);
        free(r.inv_freq);
    }
    return 0;
}
