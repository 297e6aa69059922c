/* main.c - the dflash program: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} subcommand;

static const subcommand cmds[] = {
    {"generate", cmd_generate, "generate text (classic or DFlash speculative decoding)"},
    {"chat", cmd_chat, "interactive chat with the model's template (generate -cnv)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench", cmd_bench, "decode / verify / speculative benchmarks"},
    {"probe", cmd_probe, "exactness report: block vs single-row logits; drafter accuracy"},
    {"tokenize", cmd_tokenize, "text -> token ids (JSON array)"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"quantize", cmd_quantize, "write a quantized GGUF (q8_0, q4_0, ...)"},
    {"capture", cmd_capture, "capture target features for drafter training"},
    {"dump", cmd_dump, "write logits / features of given ids (for reference tests)"},
    {"template", cmd_template, "render a chat template for given messages (as transformers)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: dflash <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-11s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\n'dflash <command> --help' describes each command's options.\n"
               "\nenvironment: DFLASH_ISA=generic|avx2|avx512|neon picks the kernel path (default:\n"
               "the best this CPU has; every path gives the same tokens)\n");
}

/* made by the build in its own folder (cmake/git_version.cmake), so not a layer's */
#if __has_include(<git_version.h>)
#include <git_version.h>
#endif
#ifndef DFLASH_GIT
#define DFLASH_GIT ""
#endif

/* dflash --version, and `dflash CMD --version` for every subcommand. */
static int version(void) {
    printf("dflash %s%s\n", DFL_VERSION, *DFLASH_GIT ? " (git " DFLASH_GIT ")" : "");
    return 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc && i <= 2; i++)
        if (!strcmp(argv[i], "--version") || (i == 1 && !strcmp(argv[i], "-V"))) return version();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dflash: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
