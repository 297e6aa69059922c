/* cmd_tokenize.c - `dflash tokenize` (text -> JSON array of ids) and
 * `dflash detokenize` (ids -> text). Both load the tokenizer alone
 * (vocab_only): a Hugging Face folder (tokenizer.json + tokenizer_config.json)
 * or the vocabulary inside a GGUF file. --jsonl handles many texts (or id
 * lists) in one process, one JSON value a line, for tests against other
 * tokenizers. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"


static void help_tokenize(void) {
    printf("usage: dflash tokenize --model PATH (--text S | --file F | --jsonl F) [options]\n"
           "\n"
           "Prints the token ids of the text as a JSON array.\n"
           "\n"
           "  -m, --model PATH     Hugging Face folder or .gguf file (default: built-in model)\n"
           "  --text S             the text\n"
           "  --file F             read the text from F ('-' for stdin)\n"
           "  --jsonl F            each line of F ('-' for stdin) is a JSON string; prints one\n"
           "                       JSON array of ids a line (NUL characters are not supported)\n"
           "  --special            add BOS/EOS as the tokenizer's config says\n"
           "  --no-parse-special   keep special-token text such as <|im_start|> as plain text\n"
           "                       (by default it becomes the special token, as Hugging Face)\n");
}

static void help_detokenize(void) {
    printf("usage: dflash detokenize --model PATH (--ids 1,2,3 | --jsonl F) [options]\n"
           "\n"
           "Prints the text of the ids (exactly; no newline is added).\n"
           "\n"
           "  -m, --model PATH     Hugging Face folder or .gguf file (default: built-in model)\n"
           "  --ids LIST           comma-separated token ids\n"
           "  --jsonl F            each line of F ('-' for stdin) is a JSON array of ids; prints\n"
           "                       the text of each as one JSON string a line\n"
           "  --skip-special       leave out special tokens (<|im_end|>, <s>, ...)\n");
}

static char *read_all(const char *path, size_t *len) {
    return cli_read_file("tokenize", "file", path, len);
}

static dfl_engine *load_vocab(const char *model) {
    if (!model) model = cli_default_model();
    if (!model) {
        fprintf(stderr, "dflash: no model given (--model PATH)\n");
        exit(2);
    }
    dfl_engine_opts o;
    dfl_engine_opts_default(&o);
    o.model_path = model;
    o.vocab_only = 1;
    dfl_engine *e = NULL;
    dfl_error err = {0};
    if (dfl_engine_load(&o, &e, &err)) {
        fprintf(stderr, "dflash: %s\n", err.msg);
        exit(1);
    }
    return e;
}

/* Prints the ids of s[0..len) as one JSON array line; 1 on error. */
static int print_ids(dfl_engine *e, const char *s, size_t len, int add_special, int parse_special) {
    dfl_error err = {0};
    int n = dfl_tokenize(e, s, len, add_special, parse_special, NULL, 0, &err);
    int32_t *ids = n > 0 ? cli_alloc((size_t)n * sizeof *ids, 1) : NULL;
    if (n > 0 && ids) n = dfl_tokenize(e, s, len, add_special, parse_special, ids, n, &err);
    if (n < 0 || (n > 0 && !ids)) {
        fprintf(stderr, "dflash tokenize: %s\n", n < 0 ? err.msg : "out of memory");
        free(ids);
        return 1;
    }
    putchar('[');
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
    free(ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL, *jsonl = NULL;
    int add_special = 0, parse_special = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help_tokenize();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--text") || !strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            text = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--file") || !strcmp(a, "-f")) {
            file = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--jsonl")) {
            jsonl = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--special")) {
            add_special = 1;
        } else if (!strcmp(a, "--no-parse-special")) {
            parse_special = 0;
        } else {
            fprintf(stderr, "dflash tokenize: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!!text + !!file + !!jsonl != 1) {
        fprintf(stderr, "dflash tokenize: give exactly one of --text S, --file F or --jsonl F\n");
        return 2;
    }
    size_t len = 0;
    char *buf = file || jsonl ? read_all(file ? file : jsonl, &len) : NULL;
    if (text) len = strlen(text);
    dfl_engine *e = load_vocab(model);
    int rc = 0;
    if (jsonl) {
        /* JSON strings hold no raw newline, so lines are the records. */
        int line = 0;
        for (char *p = buf, *end = buf + len; p < end && !rc;) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl) nl = end;
            line++;
            cJSON *j = cJSON_ParseWithLength(p, (size_t)(nl - p));
            if (cJSON_IsString(j)) {
                const char *t = j->valuestring;
                rc = print_ids(e, t, strlen(t), add_special, parse_special);
            } else {
                fprintf(stderr, "dflash tokenize: %s line %d is not a JSON string\n", jsonl, line);
                rc = 1;
            }
            cJSON_Delete(j);
            p = nl + 1;
        }
    } else {
        rc = print_ids(e, buf ? buf : text, len, add_special, parse_special);
    }
    free(buf);
    dfl_engine_free(e);
    return rc;
}

/* Writes the text of ids to stdout, raw or as a JSON string (escaping every
 * control byte: decoded text may hold NUL); 1 on an id out of range. */
static int write_text(dfl_engine *e, const int32_t *ids, int n, int show_special, int json) {
    dfl_detok d;
    dfl_detok_init(&d, e, show_special);
    static char out[1 << 16];
    if (json) putchar('"');
    for (int i = 0; i <= n; i++) {
        int r = i < n ? dfl_detok_push(&d, ids[i], out, sizeof out)
                      : dfl_detok_flush(&d, out, sizeof out);
        if (r < 0) {
            fprintf(stderr, "dflash detokenize: id %d is not in the vocabulary\n", i < n ? ids[i] : -1);
            return 1;
        }
        for (int k = 0; json && k < r; k++) {
            unsigned char c = (unsigned char)out[k];
            if (c == '"' || c == '\\') printf("\\%c", c);
            else if (c < 0x20) printf("\\u%04x", c);
            else putchar(c);
        }
        if (!json) fwrite(out, 1, (size_t)r, stdout);
    }
    if (json) putchar('"'), putchar('\n');
    return 0;
}

/* One JSON array of ids a line in, one JSON string a line out; 1 on error. */
static int detok_lines(dfl_engine *e, const char *path, int show_special) {
    size_t len = 0;
    char *buf = read_all(path, &len);
    int rc = 0, line = 0;
    size_t cap = 0;
    int32_t *ids = NULL;
    for (char *p = buf, *end = buf + len; p < end && !rc;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) nl = end;
        line++;
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(nl - p)), *x;
        cJSON *arr = cJSON_IsArray(j) ? j : NULL;
        int n = arr ? cJSON_GetArraySize(arr) : -1, k = 0;
        if (arr && (size_t)n > cap) {
            free(ids);
            ids = cli_alloc((size_t)n * sizeof *ids, 1);
            cap = ids ? (size_t)n : 0;
            if (!ids) arr = NULL;
        }
        cJSON_ArrayForEach(x, arr) {
            double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
            if (v < 0 || v > INT32_MAX || v != (int32_t)v) break;
            ids[k++] = (int32_t)v;
        }
        if (!arr || k < n) {
            fprintf(stderr, "dflash detokenize: %s line %d is not a JSON array of token ids\n",
                    path, line);
            rc = 1;
        } else {
            rc = write_text(e, ids, n, show_special, 1);
        }
        cJSON_Delete(j);
        p = nl + 1;
    }
    free(ids);
    free(buf);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *list = NULL, *jsonl = NULL;
    int show_special = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            help_detokenize();
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            model = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--ids")) {
            list = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--jsonl")) {
            jsonl = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--skip-special")) {
            show_special = 0;
        } else {
            fprintf(stderr, "dflash detokenize: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!list == !jsonl) {
        fprintf(stderr, "dflash detokenize: give exactly one of --ids 1,2,3 or --jsonl F\n");
        return 2;
    }
    if (jsonl) {
        dfl_engine *e = load_vocab(model);
        int rc = detok_lines(e, jsonl, show_special);
        dfl_engine_free(e);
        return rc;
    }
    int cap = 1;
    for (const char *p = list; *p; p++) cap += *p == ',';
    int32_t *ids = cli_alloc((size_t)cap * sizeof *ids, 1);
    if (!ids) return 1;
    int n = *list ? cli_ids("--ids", list, ids, cap) : 0;
    dfl_engine *e = load_vocab(model);
    int rc = write_text(e, ids, n, show_special, 0);
    free(ids);
    dfl_engine_free(e);
    return rc;
}
