/* fuzz_safetensors.c - libFuzzer target: safetensors header parse. A parse
 * that succeeds must leave every tensor inside the input. */
#include "io/io.h"

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dfl_tensors ts = {0};
    dfl_error e;
    if (dfl_safetensors_parse(data, size, "fuzz.safetensors", &ts, &e) == 0) {
        for (int i = 0; i < ts.n; i++) {
            const uint8_t *p = ts.t[i].data;
            if (ts.t[i].nbytes) sink ^= p[0] ^ p[ts.t[i].nbytes - 1];
            (void)dfl_tensors_find(&ts, ts.t[i].name);
        }
    }
    dfl_tensors_free(&ts);
    return 0;
}
