/* fuzz_gguf.c - libFuzzer target: GGUF parse, typed getters, config reader.
 * A parse that succeeds must leave every tensor inside the input: each
 * tensor's first and last byte is read so ASan would see an escape. */
#include <string.h>

#include "io/io.h"
#include "models/model.h"

static volatile uint8_t sink;

static void touch_kvs(const gguf_file *g) {
    dfl_error e;
    for (int64_t i = 0; i < g->n_kv && i < 64; i++) {
        const gguf_kv *kv = &g->kv[i];
        char key[128];
        size_t n = kv->key.len < sizeof key - 1 ? kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.s, n);
        key[n] = 0;
        uint32_t u;
        float f;
        int b;
        gguf_str s;
        dfl_gguf_u32(g, key, &u, &e);
        dfl_gguf_f32(g, key, &f, &e);
        dfl_gguf_bool(g, key, &b, &e);
        if (dfl_gguf_str(g, key, &s, &e) == 0 && s.len) sink ^= (uint8_t)s.s[s.len - 1];
        if (kv->type != GGUF_T_ARRAY || kv->arr_n == 0) continue;
        if (kv->arr_type == GGUF_T_STRING) {
            const gguf_str *l = &kv->strs[kv->arr_n - 1];
            if (l->len) sink ^= (uint8_t)l->s[l->len - 1];
        } else {
            sink ^= (uint8_t)dfl_gguf_arr_i64(kv, kv->arr_n - 1);
            sink ^= dfl_gguf_arr_f32(kv, kv->arr_n - 1) > 0;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file g;
    dfl_error e;
    if (dfl_gguf_parse(data, size, "fuzz.gguf", &g, &e) != 0) return 0;
    for (int i = 0; i < g.tensors.n; i++) {
        const dfl_tensor *t = &g.tensors.t[i];
        const uint8_t *p = t->data;
        sink ^= p[0] ^ p[t->nbytes - 1];
    }
    touch_kvs(&g);
    dfl_config c;
    if (dfl_config_from_gguf(&g, &c, &e) == 0) {
        dfl_rope r;
        dfl_rope_init(&r, &c);
        free(r.inv_freq);
    }
    dfl_gguf_free(&g);
    return 0;
}
