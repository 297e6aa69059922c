/* bench_tokenizer.c - tokenizer speed on one thread: load time of a
 * tokenizer.json (or GGUF vocabulary), encode MB/s of whole files, decode
 * MB/s through the streaming detokenizer.
 *
 * usage: bench_tokenizer [--tokenizer DIR|FILE.gguf] [--reps N] [--ids OUT.json] FILE...
 * Defaults: the Qwen3 tokenizer from $DFLASH_SHARED/assets and the first MiB
 * of tinyshakespeare. bench/make_mixed_text.py writes a mixed-script file;
 * bench/bench_tokenizer_hf.py runs Hugging Face's tokenizers on the same
 * files for a side-by-side (and checks that the ids agree). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/engine.h"
#include "tokenizer/tok_impl.h"

/* CPU seconds of this thread: on a shared machine wall time measures the
 * neighbours; every figure below is best-of-N thread CPU time. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static dfl_tokenizer *load(const char *path, dfl_error *e) {
    dfl_tokenizer *t = NULL;
    size_t n = strlen(path);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) {
        gguf_file g;
        if (dfl_gguf_open(path, &g, e)) return NULL;
        dfl_tok_load_gguf(&g, &t, e);
        dfl_gguf_free(&g);
    } else {
        dfl_tok_load_hf(path, &t, e);
    }
    return t;
}

/* Text of a file cut to at most 1 MiB on a UTF-8 boundary. */
static char *read_text(const char *path, size_t *len, dfl_error *e) {
    char *s = dfl_read_file(path, (size_t)1 << 30, len, e);
    if (!s) return NULL;
    if (*len > (1 << 20)) *len = 1 << 20;
    while (*len && ((unsigned char)s[*len] & 0xc0) == 0x80) (*len)--;
    s[*len] = 0;
    return s;
}

int main(int argc, char **argv) {
    const char *tok_path = NULL, *ids_out = NULL;
    const char *files[16];
    int n_files = 0, reps = 5;
    char def_tok[4096], def_txt[4096];
    const char *root = getenv("DFLASH_SHARED") ? getenv("DFLASH_SHARED") : "../shared";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc) ids_out = argv[++i];
        else if (argv[i][0] != '-' && n_files < 16) files[n_files++] = argv[i];
        else {
            fprintf(stderr, "usage: %s [--tokenizer DIR|FILE.gguf] [--reps N] [--ids OUT.json] "
                    "FILE...\n", argv[0]);
            return 2;
        }
    }
    if (!tok_path) {
        snprintf(def_tok, sizeof def_tok, "%s/assets/tokenizers/qwen3", root);
        tok_path = def_tok;
    }
    if (!n_files) {
        snprintf(def_txt, sizeof def_txt, "%s/assets/corpus/tinyshakespeare.txt", root);
        files[n_files++] = def_txt;
    }
    if (reps < 1) reps = 1;
    dfl_error e = {0};
    double best_load = 1e9;
    dfl_tokenizer *t = NULL;
    for (int r = 0; r < 3; r++) {
        dfl_tok_free(t);
        double t0 = cpu_now();
        t = load(tok_path, &e);
        double dt = cpu_now() - t0;
        if (!t) {
            fprintf(stderr, "%s: %s\n", tok_path, e.msg);
            return 1;
        }
        if (dt < best_load) best_load = dt;
    }
    printf("tokenizer %s: %d ids, load %.1f ms (best of 3, thread CPU time)\n", tok_path, dfl_tok_vocab_size(t),
           best_load * 1e3);
    FILE *ids_f = ids_out ? fopen(ids_out, "w") : NULL;
    if (ids_f) fprintf(ids_f, "{");
    struct dfl_engine eng;
    memset(&eng, 0, sizeof eng);
    eng.tok = t;
    for (int f = 0; f < n_files; f++) {
        size_t len;
        char *text = read_text(files[f], &len, &e);
        if (!text) {
            fprintf(stderr, "%s\n", e.msg);
            return 1;
        }
        size_t ascii = 0;
        for (size_t i = 0; i < len; i++) ascii += (unsigned char)text[i] < 0x80;
        int cap = (int)len + 16;
        int32_t *ids = malloc((size_t)cap * sizeof *ids);
        double best = 1e9;
        int n = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = cpu_now();
            n = dfl_tok_encode(t, text, len, 0, 0, ids, cap, &e);
            double dt = cpu_now() - t0;
            if (n < 0) {
                fprintf(stderr, "%s: %s\n", files[f], e.msg);
                return 1;
            }
            if (dt < best) best = dt;
        }
        char *out = malloc(4 * len + 64), chunk[65536];
        double best_dec = 1e9;
        size_t dlen = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = cpu_now();
            dfl_detok d;
            dfl_detok_init(&d, &eng, 1);
            dlen = 0;
            for (int i = 0; i < n; i++) {
                int k = dfl_detok_push(&d, ids[i], chunk, sizeof chunk);
                if (k > 0) memcpy(out + dlen, chunk, (size_t)k), dlen += (size_t)k;
            }
            int k = dfl_detok_flush(&d, chunk, sizeof chunk);
            if (k > 0) memcpy(out + dlen, chunk, (size_t)k), dlen += (size_t)k;
            double dt = cpu_now() - t0;
            if (dt < best_dec) best_dec = dt;
        }
        size_t nfc_len;
        char *nfc = tok_nfc(text, len, &nfc_len); /* tokenizers with NFC give this back */
        int same = dlen == len && !memcmp(out, text, len);
        int same_nfc = nfc && dlen == nfc_len && !memcmp(out, nfc, nfc_len);
        free(nfc);
        printf("%s: %zu bytes (%.0f%% ASCII) -> %d ids; encode %.2f MB/s (%.1f ms), decode %.1f "
               "MB/s, decode(encode(x)) %s\n", files[f], len, 100.0 * ascii / (len ? len : 1), n,
               len / best / 1e6, best * 1e3, len / best_dec / 1e6,
               same ? "= x" : same_nfc ? "= NFC(x)" : "DIFFERS");
        if (ids_f) {
            fprintf(ids_f, "%s\"%s\":[", f ? "," : "", files[f]);
            for (int i = 0; i < n; i++) fprintf(ids_f, "%s%d", i ? "," : "", ids[i]);
            fprintf(ids_f, "]");
        }
        free(out);
        free(ids);
        free(text);
    }
    if (ids_f) {
        fprintf(ids_f, "}\n");
        fclose(ids_f);
    }
    dfl_tok_free(t);
    return 0;
}
