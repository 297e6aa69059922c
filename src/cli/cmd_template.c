/* cmd_template.c - `dflash template`: renders a chat template for given
 * messages, as transformers' apply_chat_template would, and prints the text.
 * A template can so be checked from the shell (and against transformers). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static void help(void) {
    printf("usage: dflash template [--template FILE | -m MODEL] --messages FILE.json [options]\n"
           "\n"
           "Prints the chat template's rendering of the messages (no newline added).\n"
           "\n"
           "  --template FILE         the Jinja template (default: the model's)\n"
           "  -m, --model PATH        a model whose template, bos_token and eos_token to use\n"
           "  --messages FILE         a JSON array of messages ('-' for stdin)\n"
           "  --tools FILE            a JSON array of tools\n"
           "  --add-generation-prompt end with the assistant's turn header\n"
           "  --kwargs JSON           extra variables, e.g. '{\"enable_thinking\": false}'\n"
           "  --bos S, --eos S        bos_token / eos_token (override the model's)\n"
           "\n"
           "A template's raise_exception(msg) prints 'error: msg' and exits 1.\n"
           "SOURCE_DATE_EPOCH (unix seconds) sets the clock strftime_now reads.\n");
}

/* strftime_now's clock: SOURCE_DATE_EPOCH (the reproducible-builds
 * convention; the tests against transformers set it), else now. */
static int64_t clock_of_env(void) {
    const char *s = getenv("SOURCE_DATE_EPOCH");
    if (!s || !*s) return (int64_t)time(NULL);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v <= 0) {
        fprintf(stderr, "dflash template: SOURCE_DATE_EPOCH='%s' is not a positive number of "
                        "seconds; unset it for the real clock\n", s);
        exit(2);
    }
    return (int64_t)v;
}

static char *slurp(const char *path) { return cli_read_file(NULL, "file", path, NULL); }

const char *cli_chat_template_file(const char *path) { return slurp(path); }
const char *cli_file_text(const char *path) { return slurp(path); }

int cmd_template(int argc, char **argv) {
    const char *tmpl_file = NULL, *model = NULL, *msgs_file = NULL, *tools_file = NULL;
    const char *kwargs = NULL, *bos = NULL, *eos = NULL;
    int gen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return help(), 0;
        else if (!strcmp(a, "--template")) tmpl_file = cli_need(argc, argv, &i);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--messages")) msgs_file = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--tools")) tools_file = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--kwargs")) kwargs = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--bos")) bos = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--eos")) eos = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--add-generation-prompt")) gen = 1;
        else {
            fprintf(stderr, "dflash template: unknown option %s (see --help)\n", a);
            return 2;
        }
    }
    if (!msgs_file || (!tmpl_file && !model)) {
        fprintf(stderr, "dflash template: needs --messages and --template or --model (see --help)\n");
        return 2;
    }
    dfl_engine *e = NULL;
    dfl_error err = {0};
    if (model) {
        dfl_engine_opts o;
        dfl_engine_opts_default(&o);
        o.model_path = model;
        o.vocab_only = 1;
        if (dfl_engine_load(&o, &e, &err)) {
            fprintf(stderr, "dflash: %s\n", err.msg);
            return 1;
        }
    }
    char *tmpl = tmpl_file ? slurp(tmpl_file) : NULL, *msgs = slurp(msgs_file);
    char *tools = tools_file ? slurp(tools_file) : NULL;
    /* --bos/--eos are variables too: kwargs override what the model gives */
    char *kw = NULL;
    if (bos || eos) {
        size_t n = (kwargs ? strlen(kwargs) : 2) + 6 * (strlen(bos ? bos : "") + strlen(eos ? eos : "")) + 64;
        kw = cli_alloc(n, 1);
        char *p = kw;
        p += sprintf(p, "{");
        const char *names[2] = {"bos_token", "eos_token"}, *vals[2] = {bos, eos};
        for (int k = 0; k < 2; k++) {
            if (!vals[k]) continue;
            p += sprintf(p, "%s\"%s\":\"", p[-1] == '{' ? "" : ",", names[k]);
            for (const char *c = vals[k]; *c; c++)
                p += (unsigned char)*c < 0x20 || *c == '"' || *c == '\\' ? sprintf(p, "\\u%04x", (unsigned char)*c)
                                                                           : sprintf(p, "%c", *c);
            p += sprintf(p, "\"");
        }
        /* then the members of --kwargs */
        const char *k = kwargs ? strchr(kwargs, '{') : NULL;
        if (k && strchr(k + 1, '}') && strspn(k + 1, " \t\n") != strlen(k + 1) - strlen(strchr(k + 1, '}')))
            p += sprintf(p, ",%s", k + 1);
        else
            p += sprintf(p, "}");
        kwargs = kw;
    }
    int64_t now = clock_of_env();
    int need_n = dfl_chat_render_json(e, tmpl, msgs, tools, kwargs, gen, now, NULL, 0, &err);
    char *out = need_n >= 0 ? cli_alloc((size_t)need_n + 1, 1) : NULL;
    if (out) dfl_chat_render_json(e, tmpl, msgs, tools, kwargs, gen, now, out, (size_t)need_n + 1, &err);
    int rc = 0;
    if (need_n < 0 || !out) {
        fprintf(stderr, "error: %s\n", need_n < 0 ? err.msg : "out of memory");
        rc = 1;
    } else {
        fwrite(out, 1, (size_t)need_n, stdout);
    }
    free(out);
    free(kw);
    free(tmpl);
    free(msgs);
    free(tools);
    dfl_engine_free(e);
    return rc;
}
