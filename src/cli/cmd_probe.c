/* cmd_probe.c - `dflash probe`: is the verify path exact (block logits ==
 * single-row logits, bit for bit), and how well does the drafter guess? */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf(
        "usage: dflash probe [options]\n"
        "\n"
        "Runs the same rows as one verify block and as single-row decode steps and\n"
        "reports, as JSON on stdout, how many logit bytes differ, the largest absolute\n"
        "difference and every argmax disagreement with its top-2 margin on each arm,\n"
        "for the block size and every smaller one. Speculative decoding is exact only\n"
        "when nothing differs; dflash generate runs this check itself and falls back to\n"
        "classic decode when it fails.\n"
        "\n"
        "With a drafter it also decodes -n tokens classically and, at every position of\n"
        "that path, lets the drafter propose a block (a shadow that never steers the\n"
        "output): per block position, how often the draft equals the reference token\n"
        "(hit) and how often it and all drafts before it do (prefix: what verification\n"
        "would accept), and tau, the tokens per round greedy speculation would commit.\n"
        "\n"
        "  -m, --model PATH       Hugging Face folder or .gguf file (default: built-in model)\n"
        "  --draft PATH           DFlash drafter folder or .gguf ('none': no drafter)\n"
        "  --draft-mtp            the model's own MTP head as the drafter (with --draft\n"
        "                         too: its layer is captured and compared as well)\n"
        "  --ngram                also generate -n tokens with the n-gram lane (and the\n"
        "                         drafter, if any) and compare them id for id with classic\n"
        "                         decode, greedy and sampled (exact rule, seeded)\n"
        "  --no-mmap              copy the weights into memory (huge pages) first\n"
        "  --dtype T              convert weights at load (f32 f16 bf16 q8_0 q4_0 q4_1 q4_k q6_k)\n"
        "  --draft-dtype T        the drafter's weights (default: as --dtype, else q8_0 for a\n"
        "                         16-bit drafter beside a quantized target; auto: the file's);\n"
        "                         a quantized drafter drafts from a copy of a 16-bit lm_head\n"
        "                         in its type\n"
        "  --block-size B         rows of the verify block (default: the drafter's, else 16)\n"
        "  -p, --prompt TEXT      prompt text (default: a fixed short sequence of ids)\n"
        "  --ids 1,2,3            prompt as token ids\n"
        "  -n N                   tokens decoded for the drafter diagnostic (default 64)\n"
        "  -c, --ctx-size N       KV cache rows\n"
        "  --kv-type f16|f32      K/V cache elements (default f16)\n"
        "  -t, --threads N        threads (default: all cores)\n"
        "\n"
        "Exit status: 0 when the path is exact, 1 when it is not or on error.\n");
}

typedef struct opts {
    dfl_engine_opts eo;
    const char *prompt, *ids;
    int block, n_gen, no_draft;
} opts;

static void parse(opts *o, int argc, char **argv) {
    dfl_engine_opts_default(&o->eo);
    cli_engine_env(&o->eo);
    o->n_gen = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) help(), exit(0);
        else if (cli_engine_flag(&o->eo, argc, argv, &i)) continue;
        else if (!strcmp(a, "--block-size"))
            o->block = cli_int(a, cli_need(argc, argv, &i), 1, DFL_MAX_BLOCK);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--ids")) o->ids = cli_need(argc, argv, &i);
        else if (!strcmp(a, "-n")) o->n_gen = cli_int(a, cli_need(argc, argv, &i), 1, 1 << 20);
        else {
            fprintf(stderr, "dflash probe: unknown option '%s' (see --help)\n", a);
            exit(2);
        }
    }
    cli_engine_model("probe", &o->eo, &o->no_draft);
    if (o->prompt && o->ids) {
        fprintf(stderr, "dflash probe: give --prompt or --ids, not both\n");
        exit(2);
    }
    /* the verify block must fit the engine's rows per forward */
    o->eo.max_block = o->block;
}

/* The prompt ids (NULL, 0 for the built-in default). */
static int32_t *prompt_ids(const opts *o, dfl_engine *e, int *n) {
    *n = 0;
    if (o->ids) {
        int32_t *ids = cli_alloc(sizeof(int32_t) * 65536, 1);
        *n = cli_ids("--ids", o->ids, ids, 65536);
        return ids;
    }
    if (!o->prompt) return NULL;
    dfl_error err = {0};
    size_t len = strlen(o->prompt);
    int k = dfl_tokenize(e, o->prompt, len, 1, 0, NULL, 0, &err);
    int32_t *ids = k > 0 ? cli_alloc(sizeof(int32_t) * k, 1) : NULL;
    if (k <= 0 || dfl_tokenize(e, o->prompt, len, 1, 0, ids, k, &err) != k) {
        fprintf(stderr, "dflash probe: %s\n", k < 0 ? err.msg : "the prompt has no tokens");
        exit(1);
    }
    *n = k;
    return ids;
}

/* A string as JSON (file names may hold quotes or control bytes). */
static void print_json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* ---- --ngram: the lane end to end ------------------------------------------------ */

typedef cli_idbuf idbuf;

/* cap tokens after ids on a fresh session: classic (block 1) or adaptive (0). */
static int run_ids(dfl_engine *e, const int32_t *ids, int n, int block, float temperature,
                   idbuf *out, dfl_stats *st, dfl_error *err) {
    dfl_session *s;
    int rc = dfl_session_new(e, &s, err);
    if (rc) return rc;
    dfl_gen_params p;
    dfl_gen_params_default(&p);
    p.max_tokens = out->cap;
    p.ignore_eos = 1;
    p.no_logprob = 1;
    p.block_size = block;
    p.temperature = temperature;
    out->n = 0;
    rc = dfl_generate(s, ids, n, &p, cli_on_id, out, st, err);
    dfl_session_free(s);
    return rc;
}

/* Classic and speculative (the n-gram lane, and the drafter when loaded)
 * outputs of n_gen tokens, greedy and sampled with the exact rule: equal
 * id for id, or the lane is not exact. Prints the verdict as JSON; returns
 * 1 when they differ. */
enum { PROBE_TEMPERATURE_X10 = 8 };   /* the sampled arm's temperature, 0.8 */

static int ngram_check(dfl_engine *e, const int32_t *ids, int n, int n_gen, dfl_error *err) {
    int32_t fixed[] = {1, 2, 3, 4, 1, 2, 3, 4};   /* repeats: the lane has a match */
    if (!ids) ids = fixed, n = 8;
    idbuf a = {cli_alloc(sizeof(int32_t) * n_gen, 1), 0, n_gen}, b = {cli_alloc(sizeof(int32_t) * n_gen, 1), 0, n_gen};
    dfl_stats sa, sb;
    int equal[2] = {0, 0}, rc = 0;
    uint64_t rounds = 0, accepted = 0, proposed = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        float temp = k ? PROBE_TEMPERATURE_X10 / 10.0f : 0.0f;
        rc = run_ids(e, ids, n, 1, temp, &a, &sa, err);
        if (!rc) rc = run_ids(e, ids, n, 0, temp, &b, &sb, err);
        if (rc) break;
        equal[k] = a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (a.n < n_gen ? a.n : n_gen));
        rounds += sb.lane_rounds[DFL_LANE_NGRAM];
        accepted += sb.lane_accepted[DFL_LANE_NGRAM];
        proposed += sb.lane_proposed[DFL_LANE_NGRAM];
    }
    free(a.ids), free(b.ids);
    if (rc) return rc;
    printf(",\n \"ngram\": {\"tokens\": %d, \"greedy_equal\": %s, \"sampled_equal\": %s, "
           "\"rounds\": %llu, \"proposed\": %llu, \"accepted\": %llu}", n_gen,
           equal[0] ? "true" : "false", equal[1] ? "true" : "false", (unsigned long long)rounds,
           (unsigned long long)proposed, (unsigned long long)accepted);
    fprintf(stderr, "ngram: %d tokens greedy and sampled (exact rule, temperature 0.%d): %s; "
                    "the lane drafted %llu rounds, %llu of %llu drafts accepted\n", n_gen,
            PROBE_TEMPERATURE_X10, equal[0] && equal[1] ? "equal to classic" : "DIFFERENT",
            (unsigned long long)rounds, (unsigned long long)accepted, (unsigned long long)proposed);
    return equal[0] && equal[1] ? 0 : 1;
}

int cmd_probe(int argc, char **argv) {
    opts o = {0};
    parse(&o, argc, argv);
    dfl_error err = {0};
    dfl_engine *e;
    if (dfl_engine_load(&o.eo, &e, &err)) {
        fprintf(stderr, "dflash probe: %s\n", err.msg);
        return 1;
    }
    dfl_model_info mi;
    dfl_engine_info(e, &mi);
    int block = o.block ? o.block : mi.has_draft ? mi.draft_block : 16;
    int n;
    int32_t *ids = prompt_ids(&o, e, &n);
    size_t cap = 1 << 20;
    char *json = cli_alloc(cap, 1), *djson = cli_alloc(cap, 1);
    dfl_probe_result r;
    int rc = dfl_probe(e, ids, n, block, &r, json, cap, &err);
    dfl_draft_report dr;
    int ngram_bad = 0;
    if (!rc && mi.has_draft) rc = dfl_probe_draft(e, ids, n, block, o.n_gen, &dr, djson, cap, &err);
    if (rc) {
        fprintf(stderr, "dflash probe: %s\n", err.msg);
    } else {
        printf("{\"model\": ");
        print_json_str(mi.name);
        printf(", \"dtype\": \"%s\", \"threads\": %d,\n \"probe\": %s", mi.dtype, mi.n_threads,
               json);
        if (mi.has_draft) printf(",\n \"drafter\": %s", djson);
        if (mi.ngram) {
            int got = ngram_check(e, ids, n, o.n_gen, &err);
            if (got < 0) fprintf(stderr, "dflash probe: --ngram: %s\n", err.msg);
            ngram_bad = got != 0;
        }
        printf("}\n");
        fprintf(stderr, "probe: block %d, %llu of %llu logit bytes differ, max |diff| %g, %d "
                        "argmax disagreements: %s\n", r.block,
                (unsigned long long)r.bytes_differ, (unsigned long long)r.bytes_compared,
                r.max_abs_diff, r.n_argmax_disagree,
                r.bytes_differ || r.state_bytes_differ ? "NOT EXACT" : "exact");
        if (r.state_bytes_compared)
            fprintf(stderr, "probe: %llu of %llu recurrent-state bytes differ\n",
                    (unsigned long long)r.state_bytes_differ,
                    (unsigned long long)r.state_bytes_compared);
        if (mi.has_draft) {
            fprintf(stderr, "drafter: tau %.2f over %d anchors (%.2f in the rounds a pinned "
                            "block %d run makes); hit rate by position:", dr.tau, dr.n_anchors,
                    dr.chain_rounds ? (double)dr.chain_committed / dr.chain_rounds : 0.0,
                    dr.block);
            for (int i = 0; i < dr.block - 1 && i < DFL_MAX_POS_STATS; i++)
                fprintf(stderr, " %d:%.2f", i + 1,
                        dr.pos_tried[i] ? (double)dr.pos_hit[i] / dr.pos_tried[i] : 0.0);
            fprintf(stderr, "\n");
        }
    }
    free(json), free(djson), free(ids);
    dfl_engine_free(e);
    return rc || ngram_bad || r.bytes_differ || r.state_bytes_differ ? 1 : 0;
}
