/* fuzz_tokenizer.c - libFuzzer target: the tokenizer loaders on untrusted
 * input, then encode, decode and chat rendering with what loaded.
 *
 * Input: a GGUF file (vocabulary from tokenizer.ggml.*), or
 * "tokenizer.json \0 tokenizer_config.json \0 text" (later parts optional;
 * without a text part a fixed mixed-script string is encoded). */
#include <string.h>

#include "api/engine.h"
#include "tokenizer/tokenizer.h"

static volatile uint8_t sink;

static void exercise(const dfl_tokenizer *t, const char *text, size_t len) {
    dfl_error e;
    int32_t ids[512];
    for (int flags = 0; flags < 4; flags++) {
        int n = dfl_tok_encode(t, text, len, flags & 1, flags >> 1, ids, 512, &e);
        if (n > 512) n = 512;
        struct dfl_engine eng;
        memset(&eng, 0, sizeof eng);
        eng.tok = (dfl_tokenizer *)t;
        dfl_detok d;
        dfl_detok_init(&d, &eng, flags & 1);
        char out[16384];
        for (int i = 0; i < n; i++) {
            const char *p;
            int sp, l = dfl_tok_piece(t, ids[i], &p, &sp);
            if (l > 0) sink ^= (uint8_t)p[l - 1];
            if (ids[i] < 0 || ids[i] >= dfl_tok_vocab_size(t)) __builtin_trap();
            int r = dfl_detok_push(&d, ids[i], out, sizeof out);
            if (r > 0) sink ^= (uint8_t)out[r - 1];
        }
        dfl_detok_flush(&d, out, sizeof out);
    }
    const char *p;
    int sp;
    dfl_tok_piece(t, dfl_tok_vocab_size(t) - 1, &p, &sp);
    dfl_tok_is_eog(t, 0);
    char user[256]; /* messages are C strings */
    size_t un = len < sizeof user - 1 ? len : sizeof user - 1;
    memcpy(user, text, un);
    user[un] = 0;
    dfl_chat_msg m[] = {{"system", "s"}, {"user", user}, {"assistant", "<think>r</think>a"}};
    char out[4096];
    dfl_chat_render_text(dfl_tok_chat_template(t), NULL, "<s>", "</s>", m, 3, 1, 0, out, sizeof out, &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dfl_error e;
    dfl_tokenizer *t = NULL;
    static const char def[] = "Hello wörld, it's 1234 😀 你好 <|im_start|>user\n  <s>x</s>\t";
    if (size >= 4 && !memcmp(data, "GGUF", 4)) {
        gguf_file g;
        if (dfl_gguf_parse(data, size, "fuzz.gguf", &g, &e) == 0) {
            if (dfl_tok_load_gguf(&g, &t, &e) == 0) exercise(t, def, sizeof def - 1);
            dfl_tok_free(t);
            dfl_gguf_free(&g);
        }
        return 0;
    }
    const char *s = (const char *)data, *cfg = NULL, *text = def;
    size_t n = size, cfg_n = 0, text_n = sizeof def - 1;
    const char *z = memchr(s, 0, n);
    if (z) {
        n = (size_t)(z - s);
        cfg = z + 1;
        cfg_n = size - n - 1;
        const char *z2 = memchr(cfg, 0, cfg_n);
        if (z2) {
            text = z2 + 1;
            text_n = cfg_n - (size_t)(z2 - cfg) - 1;
            cfg_n = (size_t)(z2 - cfg);
        }
    }
    if (dfl_tok_load_json(s, n, cfg_n ? cfg : NULL, cfg_n, &t, &e) == 0) exercise(t, text, text_n);
    dfl_tok_free(t);
    return 0;
}
