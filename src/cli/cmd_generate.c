/* cmd_generate.c - `dflash generate`: text in, text out, with stats; and
 * `dflash chat` (generate --conversation), turn after turn on one session. */
#define _POSIX_C_SOURCE 200809L /* getline */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void help(void) {
    printf(
        "usage: dflash generate [options]\n"
        "\n"
        "Generates text from a prompt: classic decode, or DFlash speculative decoding\n"
        "with --draft. Text goes to stdout as it is produced; stats go to stderr.\n"
        "\n"
        "model:\n"
        "  -m, --model PATH       Hugging Face folder or .gguf file (default: built-in model)\n"
        "  --draft PATH           DFlash drafter folder or .gguf (default: built-in drafter\n"
        "                         when the built-in model is used; 'none' turns it off)\n"
        "  --draft-mtp            draft with the model's own MTP head (mtp.* of a Qwen3.5 /\n"
        "                         Qwen3-Next folder): --block-size N drafts N-1 tokens;\n"
        "                         with --draft too, the head is a lane of its own (mtp)\n"
        "                         and the policy picks a lane per round\n"
        "  --ngram                also draft by prompt lookup (the n-gram lane: the tokens\n"
        "                         that followed the last few tokens earlier in the text),\n"
        "                         with or without a drafter; each round goes to the lane\n"
        "                         that promises more tokens per second\n"
        "  --no-mmap              copy the weights into memory (huge pages) instead of\n"
        "                         reading the file in place: faster decode, slower load\n"
        "  --dtype T              convert weights at load: f32 f16 bf16 q8_0 q4_0 q4_1 q4_k q6_k\n"
        "  --draft-dtype T        the drafter's weights (default: as --dtype, else q8_0 for a\n"
        "                         16-bit drafter beside a quantized target; auto: the file's);\n"
        "                         a quantized drafter drafts from a copy of a 16-bit lm_head\n"
        "                         in its type\n"
        "  -c, --ctx-size N       KV cache rows (default: min(model context, 4096))\n"
        "  --kv-type f16|f32      K/V cache elements (default f16: half the memory)\n"
        "  -t, --threads N        threads (default: all cores)\n"
        "prompt:\n"
        "  -p, --prompt TEXT      prompt text\n"
        "  -f, --prompt-file F    read the prompt from a file ('-': standard input)\n"
        "  --chat                 format the prompt with the model's chat template\n"
        "  -cnv, --conversation   chat: each line on stdin is a user turn, answered with\n"
        "                         the template and the cache of the turns before (a\n"
        "                         prompt from -p / -f is the first turn). Ctrl-C stops an\n"
        "                         answer, a second Ctrl-C (or /exit, or end of input) quits.\n"
        "                         `dflash chat` is the same\n"
        "  --system TEXT          system message (with --chat)\n"
        "  --no-think             enable_thinking=false in the chat template (Qwen3)\n"
        "  --chat-template NAME   force a template: chatml, or Jinja text\n"
        "  --chat-template-file F the Jinja chat template in file F\n"
        "sampling:\n"
        "  -n, --max-tokens N     tokens to generate (default 128)\n"
        "  --temp T               temperature (default 0: greedy)\n"
        "  --top-k K  --top-p P  --min-p P  --seed S\n"
        "  --repeat-penalty R  --presence-penalty P  --frequency-penalty F\n"
        "  --ignore-eos           do not stop at end-of-generation tokens\n"
        "structured output (docs/server.md lists the schema subset):\n"
        "  -j, --json-schema S    the answer is one JSON value valid under schema S\n"
        "  --json-schema-file F   the same, with the schema in file F\n"
        "  --json                 the answer is one JSON object (any)\n"
        "speculation:\n"
        "  --block-size auto|N    verify block: auto (adaptive, default), 1 (classic), N\n"
        "  --tree-budget auto|N   draft trees (DDTree) of N nodes (1..32) verified in one\n"
        "                         forward; 0: the chain; auto (default): the policy picks\n"
        "                         per round (full-attention targets, greedy or exact rule)\n"
        "  --spec-accept RULE     exact (default; output identical to classic decode),\n"
        "                         rejection (target distribution, not token-identical),\n"
        "                         typical (LOSSY: accepts plausible drafts, see --typical)\n"
        "  --typical D            typical-acceptance threshold factor (default 0.2)\n"
        "output:\n"
        "  --print-token-ids      print prompt and generated ids on stderr\n"
        "  --stats-json FILE      write the run's stats as JSON\n"
        "  --show-special         print special tokens' text\n"
        "  -q, --quiet            no stats on stderr\n");
}

typedef struct opts {
    dfl_engine_opts eo;
    dfl_gen_params gp;
    const char *prompt, *prompt_file, *system, *chat_template, *stats_json;
    const char *json_schema;   /* with json: NULL for any object */
    int json;
    int chat, no_think, print_ids, quiet, show_special, no_draft, conversation;
} opts;

static int parse_accept(const char *v) {
    if (!strcmp(v, "exact")) return DFL_ACCEPT_EXACT;
    if (!strcmp(v, "rejection")) return DFL_ACCEPT_REJECTION;
    if (!strcmp(v, "typical")) return DFL_ACCEPT_TYPICAL;
    fprintf(stderr, "dflash generate: --spec-accept %s: expected exact, rejection or typical\n", v);
    exit(2);
}

static void parse(opts *o, int argc, char **argv) {
    dfl_engine_opts_default(&o->eo);
    cli_engine_env(&o->eo);
    dfl_gen_params_default(&o->gp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) help(), exit(0);
        else if (cli_engine_flag(&o->eo, argc, argv, &i)) continue;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = cli_need(argc, argv, &i);
        else if (!strcmp(a, "-f") || !strcmp(a, "--prompt-file"))
            o->prompt_file = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "-cnv") || !strcmp(a, "--conversation")) o->conversation = o->chat = 1;
        else if (!strcmp(a, "--system")) o->system = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--no-think")) o->no_think = 1;
        else if (!strcmp(a, "--chat-template")) o->chat_template = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--chat-template-file"))
            o->chat_template = cli_chat_template_file(cli_need(argc, argv, &i));
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens"))
            o->gp.max_tokens = cli_int(a, cli_need(argc, argv, &i), 0, 1 << 24);
        else if (!strcmp(a, "--temp"))
            o->gp.temperature = cli_num(a, cli_need(argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--top-k"))
            o->gp.top_k = cli_int(a, cli_need(argc, argv, &i), 0, 1 << 24);
        else if (!strcmp(a, "--top-p")) o->gp.top_p = cli_num(a, cli_need(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--min-p")) o->gp.min_p = cli_num(a, cli_need(argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--seed"))
            o->gp.seed = cli_u64(a, cli_need(argc, argv, &i));
        else if (!strcmp(a, "--repeat-penalty"))
            o->gp.repeat_penalty = cli_num(a, cli_need(argc, argv, &i), 0.01, 100);
        else if (!strcmp(a, "--presence-penalty"))
            o->gp.presence_penalty = cli_num(a, cli_need(argc, argv, &i), -2, 2);
        else if (!strcmp(a, "--frequency-penalty"))
            o->gp.frequency_penalty = cli_num(a, cli_need(argc, argv, &i), -2, 2);
        else if (!strcmp(a, "--ignore-eos")) o->gp.ignore_eos = 1;
        else if (!strcmp(a, "-j") || !strcmp(a, "--json-schema"))
            o->json_schema = cli_need(argc, argv, &i), o->json = 1;
        else if (!strcmp(a, "--json-schema-file"))
            o->json_schema = cli_file_text(cli_need(argc, argv, &i)), o->json = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--block-size")) {
            const char *v = cli_need(argc, argv, &i);
            o->gp.block_size = !strcmp(v, "auto") ? 0 : cli_int(a, v, 1, DFL_MAX_BLOCK);
        } else if (!strcmp(a, "--tree-budget")) {
            const char *v = cli_need(argc, argv, &i);
            o->gp.tree_budget = !strcmp(v, "auto") ? -1 : cli_int(a, v, 0, DFL_MAX_TREE);
        } else if (!strcmp(a, "--spec-accept"))
            o->gp.spec_accept = parse_accept(cli_need(argc, argv, &i));
        else if (!strcmp(a, "--typical"))
            o->gp.typical_d = cli_num(a, cli_need(argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--print-token-ids")) o->print_ids = 1;
        else if (!strcmp(a, "--stats-json")) o->stats_json = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--show-special")) o->show_special = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else {
            fprintf(stderr, "dflash generate: unknown option '%s' (see --help)\n", a);
            exit(2);
        }
    }
    cli_engine_model("generate", &o->eo, &o->no_draft);
    if (o->prompt && o->prompt_file) {
        fprintf(stderr, "dflash generate: give --prompt or --prompt-file, not both\n");
        exit(2);
    }
}

static char *read_prompt(const opts *o) {
    if (!o->prompt_file) return strdup(o->prompt ? o->prompt : "");
    return cli_read_file("generate", "--prompt-file", o->prompt_file, NULL);
}

static char *format_prompt(const opts *o, dfl_engine *e, char *text) {
    if (!o->chat) return text;
    dfl_chat_msg m[2];
    int n = 0;
    if (o->system) m[n++] = (dfl_chat_msg){"system", o->system};
    m[n++] = (dfl_chat_msg){"user", text};
    dfl_error err = {0};
    int fallback = 0;
    dfl_chat_template(e, &fallback);
    if (fallback && !o->chat_template)
        fprintf(stderr, "dflash generate: the model has no chat template; using ChatML\n");
    int need = dfl_chat_render(e, o->chat_template, m, n, 1, !o->no_think, NULL, 0, &err);
    if (need < 0) {
        fprintf(stderr, "dflash generate: %s\n", err.msg);
        exit(1);
    }
    char *out = cli_alloc((size_t)need + 1, 1);
    dfl_chat_render(e, o->chat_template, m, n, 1, !o->no_think, out, (size_t)need + 1, &err);
    free(text);
    return out;
}

typedef struct run {
    dfl_detok dt;
    int print_ids;
    int32_t *ids;
    int n_ids;
    size_t cap_ids;
    char *text;           /* conversation: the answer's text, for the next turn's template */
    size_t n_text, cap_text;
} run;

/* Ctrl-C: the first stops the answer being written, a second (or one between
 * answers) quits. */
static volatile sig_atomic_t g_busy, g_stop;
static void on_sigint(int sig) {
    (void)sig;
    if (g_busy && !g_stop) g_stop = 1;
    else _exit(130);
}

static void out_text(run *r, const char *s, int n) {
    if (n <= 0) return;
    fwrite(s, 1, (size_t)n, stdout);
    fflush(stdout);
    r->text = cli_grow(r->text, &r->cap_text, r->n_text + (size_t)n + 1, 1);
    memcpy(r->text + r->n_text, s, (size_t)n);
    r->text[r->n_text += (size_t)n] = 0;
}

static int on_token(void *ud, const dfl_token_info *t) {
    run *r = ud;
    char buf[256];
    /* The stop token is committed too; its text is not part of the answer. */
    if (r->dt.show_special || !dfl_token_is_eog(r->dt.e, t->id))
        out_text(r, buf, dfl_detok_push(&r->dt, t->id, buf, sizeof buf));
    r->ids = cli_grow(r->ids, &r->cap_ids, (size_t)r->n_ids + 1, sizeof(int32_t));
    r->ids[r->n_ids++] = t->id;
    return g_stop;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "%s ids (%d): [", what, n);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
    fprintf(stderr, "]\n");
}

static double decode_gbps(const dfl_stats *s) {
    double fwd = (double)(s->classic_steps + s->rounds);
    return s->t_decode > 0 ? s->weight_bytes * fwd / s->t_decode / 1e9 : 0;
}

static void print_stats(const dfl_stats *s) {
    double pre = s->t_prefill > 0 ? s->n_prompt / s->t_prefill : 0;
    double dec = s->t_decode > 0 ? s->n_gen / s->t_decode : 0;
    fprintf(stderr, "\n\nprompt: %d tokens, prefill %.1f tok/s | decode: %d tokens, %.2f tok/s, "
                    "%.1f GB/s of weights\n", s->n_prompt, pre, s->n_gen, dec, decode_gbps(s));
    if (s->rounds) {
        double tau = (double)s->committed / s->rounds;
        fprintf(stderr, "dflash: %llu rounds, %llu proposed, %llu accepted (%.1f%%), "
                        "%.2f accepted/round, tau %.2f\n",
                (unsigned long long)s->rounds, (unsigned long long)s->proposed,
                (unsigned long long)s->accepted,
                s->proposed ? 100.0 * s->accepted / s->proposed : 0.0,
                (double)s->accepted / s->rounds, tau);
        double tt = s->t_draft + s->t_verify + s->t_other;
        if (tt > 0)
            fprintf(stderr, "round time: draft %.1f%%, verify %.1f%%, other %.1f%%\n",
                    100 * s->t_draft / tt, 100 * s->t_verify / tt, 100 * s->t_other / tt);
        for (int l = 0; l < DFL_LANES; l++)
            if (s->lane_rounds[l])
                fprintf(stderr, "lane %s: %llu rounds, %llu of %llu drafts accepted, tau %.2f\n",
                        dfl_lane_name(l), (unsigned long long)s->lane_rounds[l],
                        (unsigned long long)s->lane_accepted[l],
                        (unsigned long long)s->lane_proposed[l],
                        (double)s->lane_committed[l] / s->lane_rounds[l]);
        if (s->tree_rounds)
            fprintf(stderr, "trees: %llu rounds of %.1f nodes, %.2f accepted/round\n",
                    (unsigned long long)s->tree_rounds, (double)s->tree_nodes / s->tree_rounds,
                    (double)s->tree_accepted / s->tree_rounds);
        fprintf(stderr, "acceptance by position:");
        for (int i = 0; i < DFL_MAX_POS_STATS && s->pos_proposed[i]; i++)
            fprintf(stderr, " %d:%.2f", i + 1, (double)s->pos_accepted[i] / s->pos_proposed[i]);
        fprintf(stderr, "\n");
    }
    if (s->note[0]) fprintf(stderr, "note: %s\n", s->note);
}

static void write_stats_json(const char *path, const dfl_stats *s, const dfl_model_info *mi) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "dflash generate: cannot write --stats-json %s\n", path);
        return;
    }
    fprintf(f, "{\n  \"model\": \"%s\", \"arch\": \"%s\", \"dtype\": \"%s\", \"threads\": %d,\n",
            mi->name, mi->arch, mi->dtype, mi->n_threads);
    fprintf(f, "  \"n_prompt\": %d, \"n_gen\": %d,\n", s->n_prompt, s->n_gen);
    fprintf(f, "  \"t_prefill\": %.6f, \"t_decode\": %.6f,\n", s->t_prefill, s->t_decode);
    fprintf(f, "  \"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f, \"decode_gb_s\": %.3f,\n",
            s->t_prefill > 0 ? s->n_prompt / s->t_prefill : 0,
            s->t_decode > 0 ? s->n_gen / s->t_decode : 0, decode_gbps(s));
    fprintf(f, "  \"weight_bytes\": %.0f, \"classic_steps\": %llu,\n", s->weight_bytes,
            (unsigned long long)s->classic_steps);
    fprintf(f, "  \"rounds\": %llu, \"proposed\": %llu, \"accepted\": %llu, \"committed\": %llu,\n",
            (unsigned long long)s->rounds, (unsigned long long)s->proposed,
            (unsigned long long)s->accepted, (unsigned long long)s->committed);
    fprintf(f, "  \"mean_accepted\": %.4f, \"tau\": %.4f,\n",
            s->rounds ? (double)s->accepted / s->rounds : 0,
            s->rounds ? (double)s->committed / s->rounds : 0);
    fprintf(f, "  \"t_draft\": %.6f, \"t_verify\": %.6f, \"t_other\": %.6f,\n", s->t_draft,
            s->t_verify, s->t_other);
    fprintf(f, "  \"acceptance_by_position\": [");
    for (int i = 0; i < DFL_MAX_POS_STATS && s->pos_proposed[i]; i++)
        fprintf(f, "%s%.4f", i ? ", " : "", (double)s->pos_accepted[i] / s->pos_proposed[i]);
    fprintf(f, "],\n  \"lanes\": {");
    for (int l = 0; l < DFL_LANES; l++)
        fprintf(f, "%s\"%s\": {\"rounds\": %llu, \"proposed\": %llu, \"accepted\": %llu, "
                   "\"committed\": %llu}", l ? ", " : "", dfl_lane_name(l),
                (unsigned long long)s->lane_rounds[l], (unsigned long long)s->lane_proposed[l],
                (unsigned long long)s->lane_accepted[l], (unsigned long long)s->lane_committed[l]);
    fprintf(f, "},\n  \"tree_rounds\": %llu, \"tree_nodes\": %llu, \"tree_accepted\": %llu, "
               "\"tree_mean_accepted\": %.4f,\n", (unsigned long long)s->tree_rounds,
            (unsigned long long)s->tree_nodes, (unsigned long long)s->tree_accepted,
            s->tree_rounds ? (double)s->tree_accepted / s->tree_rounds : 0);
    fprintf(f, "  \"exact_checked\": %d, \"note\": \"", s->exact_checked);
    for (const char *p = s->note; *p; p++)
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if ((unsigned char)*p >= 0x20) fputc(*p, f);
    fprintf(f, "\"\n}\n");
    fclose(f);
}

/* ---- conversation ----------------------------------------------------------- */

typedef struct chat {
    dfl_chat_msg m[2 * 4096];
    int n;
} chat;

static void chat_push(chat *c, const char *role, const char *text) {
    if (c->n == (int)(sizeof c->m / sizeof c->m[0])) {
        fprintf(stderr, "dflash chat: too many turns\n");
        exit(1);
    }
    c->m[c->n++] = (dfl_chat_msg){role, strdup(text)};
}

/* The conversation so far with the generation prompt, as token ids. */
static int32_t *chat_ids(const opts *o, dfl_engine *e, const chat *c, int *n) {
    dfl_error err = {0};
    int need = dfl_chat_render(e, o->chat_template, c->m, c->n, 1, !o->no_think, NULL, 0, &err);
    char *text = need >= 0 ? cli_alloc((size_t)need + 1, 1) : NULL;
    if (text) dfl_chat_render(e, o->chat_template, c->m, c->n, 1, !o->no_think, text,
                              (size_t)need + 1, &err);
    *n = text ? dfl_tokenize(e, text, (size_t)need, 0, 1, NULL, 0, &err) : -1;
    int32_t *ids = *n >= 0 ? cli_alloc(sizeof(int32_t) * (*n + 1), 1) : NULL;
    if (!ids || dfl_tokenize(e, text, (size_t)need, 0, 1, ids, *n, &err) != *n) {
        fprintf(stderr, "dflash chat: %s\n", err.msg);
        exit(1);
    }
    free(text);
    return ids;
}

/* One answer: streamed to stdout, its text kept for the next turn. */
static int chat_turn(const opts *o, dfl_engine *e, dfl_session *s, chat *c) {
    int n;
    int32_t *ids = chat_ids(o, e, c, &n);
    run r = {0};
    dfl_detok_init(&r.dt, e, o->show_special);
    dfl_stats st;
    dfl_error err = {0};
    g_stop = 0, g_busy = 1;
    int rc = dfl_generate(s, ids, n, &o->gp, on_token, &r, &st, &err);
    g_busy = 0;
    char tail[64];
    out_text(&r, tail, dfl_detok_flush(&r.dt, tail, sizeof tail));
    fputc('\n', stdout);
    fflush(stdout);
    chat_push(c, "assistant", r.text ? r.text : "");
    if (rc) fprintf(stderr, "dflash chat: %s\n", err.msg);
    else if (!o->quiet)
        fprintf(stderr, "[%d prompt tokens, %d of them reused; %d tokens at %.1f tok/s%s]\n",
                st.n_prompt, st.n_cached, st.n_gen, st.t_decode > 0 ? st.n_gen / st.t_decode : 0,
                g_stop ? "; stopped" : "");
    free(r.text), free(r.ids), free(ids);
    return rc;
}

static int conversation(const opts *o, dfl_engine *e) {
    dfl_session *s;
    dfl_error err = {0};
    if (dfl_session_new(e, &s, &err)) {
        fprintf(stderr, "dflash chat: %s\n", err.msg);
        return 1;
    }
    static chat c;
    if (o->system) chat_push(&c, "system", o->system);
    /* sigaction, not signal(): with _POSIX_C_SOURCE, glibc's signal() resets the
     * handler after its first call, so the second answer's Ctrl-C killed the chat. */
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    int tty = isatty(0), rc = 0;
    char *first = o->prompt || o->prompt_file ? read_prompt(o) : NULL, *line = NULL;
    size_t cap = 0;
    for (;;) {
        const char *text = first;
        if (!text) {
            if (tty) fputs("> ", stdout), fflush(stdout);
            ssize_t len = getline(&line, &cap, stdin);
            if (len < 0) break;
            while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
            if (!len) continue;
            text = line;
        }
        chat_push(&c, "user", text);
        free(first), first = NULL;
        if ((rc = chat_turn(o, e, s, &c))) break;
    }
    free(line);
    for (int i = 0; i < c.n; i++) free((char *)c.m[i].content);
    dfl_session_free(s);
    return rc ? 1 : 0;
}

int cmd_chat(int argc, char **argv) {
    char **av = cli_alloc(sizeof(char *) * (size_t)(argc + 2), 1);
    memcpy(av, argv, sizeof(char *) * (size_t)argc);
    av[argc] = "--conversation";
    av[argc + 1] = NULL;
    int rc = cmd_generate(argc + 1, av);
    free(av);
    return rc;
}

int cmd_generate(int argc, char **argv) {
    opts o = {0};
    parse(&o, argc, argv);
    if (!o.quiet) o.eo.progress = cli_progress;
    dfl_error err = {0};
    dfl_engine *e;
    if (dfl_engine_load(&o.eo, &e, &err)) {
        fprintf(stderr, "dflash generate: %s\n", err.msg);
        return 1;
    }
    if (!o.quiet)
        cli_load_summary("dflash generate", e, o.chat_template ? "given on the command line" : NULL);
    dfl_format *fmt = NULL;
    if (o.json && dfl_format_new(e, o.json_schema, NULL, NULL, &fmt, &err)) {
        fprintf(stderr, "dflash generate: --json-schema: %s\n", err.msg);
        dfl_engine_free(e);
        return 1;
    }
    o.gp.format = fmt;
    if (o.conversation) {
        int rc = conversation(&o, e);
        dfl_format_free(fmt);
        dfl_engine_free(e);
        return rc;
    }
    char *text = format_prompt(&o, e, read_prompt(&o));
    /* A chat template writes its own BOS and special tokens (as
     * apply_chat_template does); a plain prompt gets the tokenizer's BOS. */
    int special = o.chat;
    int n = dfl_tokenize(e, text, strlen(text), !special, special, NULL, 0, &err);
    int32_t *prompt = n >= 0 ? cli_alloc(sizeof(int32_t) * (n + 1), 1) : NULL;
    if (n < 0 || dfl_tokenize(e, text, strlen(text), !special, special, prompt, n, &err) != n) {
        fprintf(stderr, "dflash generate: %s\n", err.msg);
        return 1;
    }
    free(text);
    if (o.print_ids) print_ids("prompt", prompt, n);
    dfl_session *s;
    if (dfl_session_new(e, &s, &err)) {
        fprintf(stderr, "dflash generate: %s\n", err.msg);
        return 1;
    }
    run r = {0};
    r.print_ids = o.print_ids;
    dfl_detok_init(&r.dt, e, o.show_special);
    dfl_stats st;
    int rc = dfl_generate(s, prompt, n, &o.gp, on_token, &r, &st, &err);
    char tail[64];
    int m = dfl_detok_flush(&r.dt, tail, sizeof tail);
    if (m > 0) fwrite(tail, 1, (size_t)m, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (rc) fprintf(stderr, "dflash generate: %s\n", err.msg);
    if (o.print_ids) print_ids("generated", r.ids, r.n_ids);
    dfl_model_info mi;
    dfl_engine_info(e, &mi);
    if (!o.quiet) print_stats(&st);
    if (o.stats_json) write_stats_json(o.stats_json, &st, &mi);
    free(r.ids), free(r.text);
    free(prompt);
    dfl_session_free(s);
    dfl_format_free(fmt);
    dfl_engine_free(e);
    return rc ? 1 : 0;
}
