/* cmd_quantize.c - `dflash quantize`: a GGUF in, a GGUF out with its weight
 * matrices in another type (the work is dfl_quantize_gguf, src/io/quantize.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static void help(void) {
    printf("usage: dflash quantize --model IN.gguf --out OUT.gguf --type T [options]\n"
           "\n"
           "Writes a copy of a GGUF model with its weight matrices converted to T:\n"
           "q8_0, q4_0, q4_1 (ggml's reference quantizers, bit for bit), q4_k, q6_k (dflash's\n"
           "own search for scales; the formats are ggml's), f16 or bf16. Norms become\n"
           "f32; matrices whose rows are not a whole number of blocks, and the token\n"
           "embedding, keep their type.\n"
           "\n"
           "  -m, --model IN.gguf       input (a Hugging Face folder is not supported yet:\n"
           "                            convert it with tools/hf_to_gguf.py first)\n"
           "  -o, --out OUT.gguf        output (refused if it is the input)\n"
           "  --type T                  q8_0 | q4_0 | q4_1 | q4_k | q6_k | f16 | bf16\n"
           "  --quantize-embeddings     convert token_embd.weight too\n"
           "  -t, --threads N           threads (default: all cores)\n");
}

/* llama.cpp's general.file_type (enum llama_ftype) for a file of one type. */
int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = NULL;
    int embeddings = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return help(), 0;
        if (!strcmp(a, "--quantize-embeddings")) {
            embeddings = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "dflash quantize: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) in = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--type")) type = v;
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) threads = cli_int(a, v, 1, 256);
        else {
            fprintf(stderr, "dflash quantize: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!in || !out || !type) {
        fprintf(stderr, "dflash quantize: --model, --out and --type are required (see --help)\n");
        return 2;
    }
    struct stat si, so;
    if (stat(in, &si) == 0 && S_ISDIR(si.st_mode)) {
        fprintf(stderr, "dflash quantize: %s is a folder: only GGUF input is supported so far "
                        "(convert a Hugging Face folder with tools/hf_to_gguf.py first)\n", in);
        return 2;
    }
    if (!strcmp(in, out) ||
        (stat(out, &so) == 0 && so.st_dev == si.st_dev && so.st_ino == si.st_ino)) {
        fprintf(stderr, "dflash quantize: --out must differ from --model (the input is read "
                        "while the output is written)\n");
        return 2;
    }
    dfl_error err = {0};
    dfl_quantize_opts o = {.in = in, .out = out, .type = type, .quantize_embeddings = embeddings,
                           .n_threads = threads, .progress = cli_progress};
    dfl_quantize_result r;
    if (dfl_quantize_gguf(&o, &r, &err)) {
        fprintf(stderr, "dflash quantize: %s\n", err.msg);
        return err.code == DFL_EARG ? 2 : 1;
    }
    fprintf(stderr, "dflash quantize: %s: %d of %d tensors converted to %s, %.1f -> %.1f MB\n",
            out, r.n_converted, r.n_tensors, type, r.bytes_in / 1e6, r.bytes_out / 1e6);
    return 0;
}
