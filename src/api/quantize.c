/* quantize.c - dfl_quantize_gguf: dflash quantize's work (src/io/quantize.c)
 * behind the public header, as every dflash.h function is in this layer. */
#include "io/io.h"

int dfl_quantize_gguf(const dfl_quantize_opts *o, dfl_quantize_result *res, dfl_error *err) {
    return dfl_gguf_quantize(o, res, err);
}
