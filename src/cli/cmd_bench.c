/* cmd_bench.c - `dflash bench`: speed against this machine's own limits,
 * measured in one run so ratios hold even on a busy machine.
 *
 *   machine  read bandwidth and f32 FMA peak on the engine's threads
 *   decode   one-row forward per weight type: tok/s, GB/s, % of bandwidth,
 *            best timed forward, the median step of a sustained generate,
 *            and forwards paired with a bandwidth sample each
 *   verify   B-row forward cost over one row, next to the roofline's guess
 *   spec     classic vs pinned blocks vs adaptive, with a replay drafter
 *            at given acceptance profiles (tau)
 *   rules    the three acceptance rules at temperatures > 0: the real
 *            drafter's own tau, and the exact rule replayed at the profiles
 *   ctx      decode and prefill at depth, time to first token; peak RSS */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"

static void help(void) {
    printf(
        "usage: dflash bench [options]\n"
        "\n"
        "Measures decode, verify and speculative speed against this machine's read\n"
        "bandwidth and FMA peak, all in one run. Tables go to stdout (progress to\n"
        "stderr); --json also writes every number as JSON.\n"
        "\n"
        "  -m, --model PATH       Hugging Face folder or .gguf file (default: built-in model)\n"
        "  --draft PATH           DFlash drafter (needed for the spec section)\n"
        "  --draft-dtype T        the drafter's weights (default: as --types, else q8_0 for a\n"
        "                         16-bit drafter beside a quantized target; auto: the file's);\n"
        "                         a quantized drafter drafts from a copy of a 16-bit lm_head\n"
        "                         in its type\n"
        "  --draft-mtp            the model's own MTP head as the drafter (with --draft\n"
        "                         too: a lane of its own; replays run the drafter's)\n"
        "  --ngram                the n-gram lane too in the rules section's real requests\n"
        "  --no-mmap              copy the weights into memory (huge pages), as generate\n"
        "                         (the spec section's replays measure the drafter alone)\n"
        "  --types LIST           weight types to convert to at load and measure, e.g.\n"
        "                         bf16,q8_0 (default: auto, the file's own); the spec and\n"
        "                         ctx sections use the first\n"
        "  -t, --threads N        threads (default: all cores)\n"
        "  --kv-type f16|f32      K/V cache elements (default f16)\n"
        "  --sections LIST        any of machine,decode,verify,spec,rules,ctx (default: all)\n"
        "  --max-block N          largest verify block measured (default 16)\n"
        "  --isa-ab A,B           the verify section also times B = 1/4/8/16 on two kernel\n"
        "                         paths in this process, alternated (e.g. avx2,avx512)\n"
        "  --tau LIST             acceptance profiles for the spec section: committed tokens\n"
        "                         per round at the drafter's block, flat per position\n"
        "                         (default 1,3,5,6.5; 1 = nothing accepted)\n"
        "  --blocks LIST          pinned block sizes in the spec section (default 4,8,16)\n"
        "  -n N                   tokens generated per spec run (default 128)\n"
        "  --prompt-len N         prompt tokens for the spec runs (default 32)\n"
        "  -p, --prompt TEXT      a real prompt for the spec and rules runs instead of\n"
        "                         --prompt-len synthetic ids (a trained pair's real tau)\n"
        "  --temps LIST           temperatures of the rules section (default 0.6,1.0;\n"
        "                         0 = greedy, exact rule only)\n"
        "  --rule-block N         pinned block of the rules section (default 8)\n"
        "  --tree-budget LIST     draft trees (DDTree) of these budgets in the rules section:\n"
        "                         a row per budget with the exact rule, beside the chain's\n"
        "                         (pinned block: the chain; adaptive: the policy's pick)\n"
        "  --typical D            the typical rule's threshold factor (default 0.2)\n"
        "  --ctx LIST             context ladder (default 1024,2048,4096,8192,16384,32768)\n"
        "  --ttft-max N           real prefills up to N tokens for time to first token;\n"
        "                         longer ones are summed from measured chunk times (default 1024)\n"
        "  --reps N               timed repetitions per forward, best kept (default 3)\n"
        "  --spec-reps N          cycles through the spec modes per profile, the fastest run\n"
        "                         of each mode kept (default 1)\n"
        "  --seed N               seed of the replayed accept lengths and of sampling\n"
        "                         (default 1)\n"
        "  --json FILE            write the results as JSON to FILE\n"
        "\n"
        "The replay drafter runs the real drafter every round (its cost is real) but\n"
        "proposes the classic decode's own tokens, right for an accept length drawn per\n"
        "position from the profile, so speed at a known acceptance is measured on any\n"
        "pair, random weights included; every spec run's output is checked against\n"
        "classic decode. A replayed path is one fixed sequence, so the rules section\n"
        "replays the exact rule only; rejection and typical draw their own tokens and\n"
        "run with the real drafter (on random weights they accept almost nothing).\n"
        "Cache depths in the ctx section hold placeholder K/V.\n");
}

enum { MAXL = 32 };

typedef struct opts {
    dfl_engine_opts eo;
    const char *types[MAXL];
    int n_types;
    int sections;            /* bit set of SEC_* */
    const char *isa_ab[2];   /* --isa-ab: two kernel paths timed in the verify section */
    int max_block, n_gen, prompt_len, ttft_max, reps, spec_reps, no_draft, rule_block;
    double tau[MAXL], temps[MAXL], typical_d;
    int n_tau, n_temps;
    const char *prompt;
    int blocks[MAXL], n_blocks;
    int trees[MAXL], n_trees;  /* --tree-budget: budgets of the rules section's tree rows */
    int ctx[MAXL], n_ctx;
    uint64_t seed;
    const char *json;
} opts;

enum { SEC_MACHINE = 1, SEC_DECODE = 2, SEC_VERIFY = 4, SEC_SPEC = 8, SEC_CTX = 16, SEC_RULES = 32,
       N_SEC = 6 };

/* Splits a comma list into at most MAXL pieces (the string is copied). */
static int split(const char *flag, const char *v, char **out) {
    char *s = strdup(v);
    int n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (n == MAXL) {
            fprintf(stderr, "dflash bench: %s: at most %d values\n", flag, MAXL);
            exit(2);
        }
        out[n++] = tok;
    }
    if (!n) {
        fprintf(stderr, "dflash bench: %s: empty list\n", flag);
        exit(2);
    }
    return n;
}

static int int_list(const char *flag, const char *v, int *out, long lo, long hi) {
    char *p[MAXL];
    int n = split(flag, v, p);
    for (int i = 0; i < n; i++) out[i] = cli_int(flag, p[i], lo, hi);
    return n;
}

static int sections(const char *v) {
    char *p[MAXL];
    int n = split("--sections", v, p), bits = 0;
    static const char *names[N_SEC] = {"machine", "decode", "verify", "spec", "ctx", "rules"};
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < N_SEC && strcmp(p[i], names[k])) k++;
        if (k == N_SEC) {
            fprintf(stderr, "dflash bench: --sections: unknown '%s' (machine, decode, verify, "
                            "spec, rules, ctx)\n", p[i]);
            exit(2);
        }
        bits |= 1 << k;
    }
    return bits;
}

static void parse(opts *o, int argc, char **argv) {
    dfl_engine_opts_default(&o->eo);
    cli_engine_env(&o->eo);
    o->types[0] = "auto", o->n_types = 1;
    o->sections = (1 << N_SEC) - 1;
    o->max_block = 16, o->n_gen = 128, o->prompt_len = 32, o->ttft_max = 1024, o->reps = 3;
    o->spec_reps = 1;
    o->seed = 1;
    o->rule_block = 8, o->typical_d = 0.2;
    o->temps[0] = 0.6, o->temps[1] = 1.0, o->n_temps = 2;
    static const double tau[] = {1, 3, 5, 6.5};
    memcpy(o->tau, tau, sizeof tau), o->n_tau = 4;
    static const int blocks[] = {4, 8, 16};
    memcpy(o->blocks, blocks, sizeof blocks), o->n_blocks = 3;
    static const int ctx[] = {1024, 2048, 4096, 8192, 16384, 32768};
    memcpy(o->ctx, ctx, sizeof ctx), o->n_ctx = 6;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) help(), exit(0);
        else if (!strcmp(a, "--dtype") || !strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            fprintf(stderr, "dflash bench: %s: bench loads each weight type and context it "
                            "measures; use --types and --ctx\n", a);
            exit(2);
        } else if (cli_engine_flag(&o->eo, argc, argv, &i)) continue;
        else if (!strcmp(a, "--types"))
            o->n_types = split(a, cli_need(argc, argv, &i), (char **)o->types);
        else if (!strcmp(a, "--sections")) o->sections = sections(cli_need(argc, argv, &i));
        else if (!strcmp(a, "--max-block"))
            o->max_block = cli_int(a, cli_need(argc, argv, &i), 1, 64);
        else if (!strcmp(a, "--tau")) {
            char *p[MAXL];
            o->n_tau = split(a, cli_need(argc, argv, &i), p);
            for (int k = 0; k < o->n_tau; k++) o->tau[k] = cli_num(a, p[k], 1, 64);
        } else if (!strcmp(a, "--blocks"))
            o->n_blocks = int_list(a, cli_need(argc, argv, &i), o->blocks, 2, 64);
        else if (!strcmp(a, "-n")) o->n_gen = cli_int(a, cli_need(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--prompt-len"))
            o->prompt_len = cli_int(a, cli_need(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--temps")) {
            char *p[MAXL];
            o->n_temps = split(a, cli_need(argc, argv, &i), p);
            for (int k = 0; k < o->n_temps; k++) o->temps[k] = cli_num(a, p[k], 0, 100);
        } else if (!strcmp(a, "--tree-budget"))
            o->n_trees = int_list(a, cli_need(argc, argv, &i), o->trees, 1, DFL_MAX_TREE);
        else if (!strcmp(a, "--rule-block"))
            o->rule_block = cli_int(a, cli_need(argc, argv, &i), 2, 64);
        else if (!strcmp(a, "--typical"))
            o->typical_d = cli_num(a, cli_need(argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--ctx"))
            o->n_ctx = int_list(a, cli_need(argc, argv, &i), o->ctx, 1, 1 << 22);
        else if (!strcmp(a, "--ttft-max"))
            o->ttft_max = cli_int(a, cli_need(argc, argv, &i), 0, 1 << 22);
        else if (!strcmp(a, "--reps")) o->reps = cli_int(a, cli_need(argc, argv, &i), 1, 1000);
        else if (!strcmp(a, "--spec-reps"))
            o->spec_reps = cli_int(a, cli_need(argc, argv, &i), 1, 100);
        else if (!strcmp(a, "--seed"))
            o->seed = (uint64_t)cli_num(a, cli_need(argc, argv, &i), 0, 1e18);
        else if (!strcmp(a, "--json")) o->json = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--isa-ab")) {
            if (split(a, cli_need(argc, argv, &i), (char **)o->isa_ab) != 2) {
                fprintf(stderr, "dflash bench: --isa-ab takes two kernel paths, e.g. avx2,avx512\n");
                exit(2);
            }
        }
        else {
            fprintf(stderr, "dflash bench: unknown option '%s' (see --help)\n", a);
            exit(2);
        }
    }
    cli_engine_model("bench", &o->eo, &o->no_draft);
}

/* ---- helpers ------------------------------------------------------------------ */

typedef struct bench {
    opts *o;
    dfl_engine *e;
    dfl_session *s;
    dfl_model_info mi;
    double bw, peak, flops;    /* GB/s, GFLOP/s, FLOPs per row */
    int32_t *prompt;           /* the spec and rules sections' prompt */
    int n_prompt;
    cJSON *root;
} bench;

static void die(const char *what, const dfl_error *err) {
    fprintf(stderr, "dflash bench: %s: %s\n", what, err->msg);
    exit(1);
}

static double fwd(bench *b, int ctx, int B, int flags) {
    dfl_error err = {0};
    double sec = 0;
    if (dfl_bench_forward(b->s, ctx, B, flags, b->o->reps, &sec, &err)) die("forward", &err);
    return sec;
}

/* Peak resident memory (VmHWM) in MB since the last reset_peak_rss(); the
 * reset (Linux clear_refs) keeps the bandwidth test's buffer out of it. */
static double peak_rss_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    if (kb < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = (double)ru.ru_maxrss;
    }
    return kb / 1024.0;
}

static void reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) fputs("5", f), fclose(f);
}

/* Loads the engine for one weight type; ctx sized for every section. */
static void load(bench *b, const char *type, int ctx_size, int with_draft) {
    dfl_engine_opts eo = b->o->eo;
    eo.dtype = type;
    eo.ctx_size = ctx_size;
    eo.max_block = b->o->max_block;
    if (!with_draft) eo.draft_path = NULL, eo.draft_mtp = 0;
    eo.progress = cli_progress;
    dfl_error err = {0};
    if (dfl_engine_load(&eo, &b->e, &err)) die("load", &err);
    if (dfl_session_new(b->e, &b->s, &err)) die("session", &err);
    dfl_engine_info(b->e, &b->mi);
    b->flops = dfl_bench_row_flops(b->e);
}

static void unload(bench *b) {
    dfl_session_free(b->s);
    dfl_engine_free(b->e);
    b->s = NULL, b->e = NULL;
}

/* ---- sections ------------------------------------------------------------------- */

static void sec_machine(bench *b) {
    fprintf(stderr, "bench: measuring read bandwidth and FMA peak on %d threads\n",
            b->mi.n_threads);
    b->bw = dfl_bench_read_bw(b->e, 0, 0);
    b->peak = dfl_bench_fma_peak(b->e);
    reset_peak_rss();   /* the bandwidth buffer is not the engine's */
    printf("machine: %d threads, read bandwidth %.2f GB/s, f32 FMA peak %.1f GFLOP/s\n\n",
           b->mi.n_threads, b->bw, b->peak);
    cJSON *m = cJSON_AddObjectToObject(b->root, "machine");
    cJSON_AddNumberToObject(m, "threads", b->mi.n_threads);
    cJSON_AddNumberToObject(m, "read_gbs", b->bw);
    cJSON_AddNumberToObject(m, "fma_gflops", b->peak);
}

enum { SUSTAINED_TOKENS = 256 };   /* the decode section's generate run (< any ctx loaded) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct stamps {
    double t[SUSTAINED_TOKENS];
    int n;
} stamps;

static int on_stamp(void *ud, const dfl_token_info *ti) {
    stamps *s = ud;
    (void)ti;
    if (s->n < SUSTAINED_TOKENS) s->t[s->n++] = now_s();
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* q[0..2] = the 10th, 50th and 90th percentiles of v[0..n), sorted in place. */
static void percentiles(double *v, int n, double q[3]) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    for (int k = 0; k < 3; k++) q[k] = n > 0 ? v[(n - 1) * (1 + 4 * k) / 10] : 0;
}

/* What a user gets: a classic generate of SUSTAINED_TOKENS tokens, each
 * step's time from one token's arrival to the next (the first, which waits
 * for the prefill, left out); q[0..2] = the 10th, 50th and 90th percentiles. */
static void sustained(bench *b, double q[3]) {
    static stamps s;
    int32_t prompt[8];
    for (int i = 0; i < 8; i++) prompt[i] = (int32_t)((104729u * (i + 3)) % (unsigned)b->mi.vocab);
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.block_size = 1, gp.ignore_eos = 1, gp.no_logprob = 1, gp.max_tokens = SUSTAINED_TOKENS;
    dfl_error err = {0};
    s.n = 0;
    if (dfl_generate(b->s, prompt, 8, &gp, on_stamp, &s, NULL, &err)) die("generate", &err);
    int n = s.n - 1;
    double dt[SUSTAINED_TOKENS];
    for (int i = 0; i < n; i++) dt[i] = s.t[i + 1] - s.t[i];
    percentiles(dt, n, q);
}

enum {
    PAIRS = 32,                      /* forwards of the paired measure */
    PAIR_BYTES = 256 << 20           /* each one's bandwidth sample */
};

/* Read bandwidth moves with the host's neighbours (two levels a run apart on
 * the shared machines here), so one figure taken before a sustained run can
 * make a median step look slow or fast. Here each one-row forward follows a
 * bandwidth sample of its own; q = percentiles of forward GB/s over that
 * sample's, a share that holds whatever level the host is at. */
static void paired(bench *b, double q[3]) {
    double r[PAIRS], sec;
    for (int i = 0; i < PAIRS; i++) {
        double bw = dfl_bench_read_bw(b->e, PAIR_BYTES, 1);
        dfl_error err = {0};
        if (dfl_bench_forward(b->s, 128, 1, DFL_BENCH_LOGITS, 1, &sec, &err)) die("forward", &err);
        r[i] = bw > 0 && sec > 0 ? b->mi.weight_bytes / sec / 1e9 / bw : 0;
    }
    percentiles(r, PAIRS, q);
}

static void sec_decode(bench *b, cJSON *arr) {
    double sec = fwd(b, 128, 1, DFL_BENCH_LOGITS), q[3], pq[3];
    sustained(b, q);
    paired(b, pq);
    double gbs = b->mi.weight_bytes / sec / 1e9, gbs_run = q[1] > 0 ? b->mi.weight_bytes / q[1] / 1e9 : 0;
    printf("%-6s %9.1f %9.2f %8.2f %8.2f %7.1f%% | %9.2f %9.2f %8.2f %7.1f%%\n", b->mi.dtype,
           b->mi.weight_bytes / 1e6, sec * 1e3, 1 / sec, gbs, b->bw > 0 ? 100 * gbs / b->bw : 0,
           q[1] * 1e3, q[1] > 0 ? 1 / q[1] : 0, (q[2] - q[0]) * 1e3,
           b->bw > 0 ? 100 * gbs_run / b->bw : 0);
    printf("%-6s paired: %d forwards, each after a %d MB bandwidth sample, read %.0f%% of it "
           "(p10 %.0f%%, p90 %.0f%%)\n", "", PAIRS, PAIR_BYTES >> 20, 100 * pq[1], 100 * pq[0],
           100 * pq[2]);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", b->mi.dtype);
    cJSON_AddNumberToObject(d, "weight_bytes", (double)b->mi.weight_bytes);
    cJSON_AddNumberToObject(d, "ms_per_token", sec * 1e3);
    cJSON_AddNumberToObject(d, "tok_s", 1 / sec);
    cJSON_AddNumberToObject(d, "gbs", gbs);
    cJSON_AddNumberToObject(d, "frac_of_bw", b->bw > 0 ? gbs / b->bw : 0);
    cJSON *r = cJSON_AddObjectToObject(d, "sustained");
    cJSON_AddNumberToObject(r, "tokens", SUSTAINED_TOKENS);
    cJSON_AddNumberToObject(r, "ms_p10", q[0] * 1e3);
    cJSON_AddNumberToObject(r, "ms_median", q[1] * 1e3);
    cJSON_AddNumberToObject(r, "ms_p90", q[2] * 1e3);
    cJSON_AddNumberToObject(r, "tok_s", q[1] > 0 ? 1 / q[1] : 0);
    cJSON_AddNumberToObject(r, "frac_of_bw", b->bw > 0 ? gbs_run / b->bw : 0);
    cJSON *p = cJSON_AddObjectToObject(d, "paired");
    cJSON_AddNumberToObject(p, "pairs", PAIRS);
    cJSON_AddNumberToObject(p, "sample_bytes", PAIR_BYTES);
    cJSON_AddNumberToObject(p, "frac_p10", pq[0]);
    cJSON_AddNumberToObject(p, "frac_median", pq[1]);
    cJSON_AddNumberToObject(p, "frac_p90", pq[2]);
    cJSON_AddItemToArray(arr, d);
}

/* Roofline: a B-row forward costs at least max(bytes / bandwidth, flops / peak). */
static double roofline(const bench *b, int B) {
    double tm = b->mi.weight_bytes / (b->bw * 1e9), tc = b->flops * B / (b->peak * 1e9);
    return tm > tc ? tm : tc;
}

/* The verify forward on two kernel paths in one process, alternated so both
 * see the same machine load: the best of three rounds each. */
static void sec_isa_ab(bench *b, cJSON *v) {
    static const int Bs[] = {1, 4, 8, 16};
    const char *const *isa = b->o->isa_ab;
    dfl_error err = {0};
    printf("kernel paths, %s (B rows, logits for all; context 128; alternated 3 times):\n"
           "%4s %9s %9s %8s\n", b->mi.dtype, "B", isa[0], isa[1], "speedup");
    cJSON *arr = cJSON_AddArrayToObject(v, "isa_ab");
    for (int k = 0; k < 4 && Bs[k] <= b->o->max_block; k++) {
        double best[2] = {1e30, 1e30};
        for (int round = 0; round < 3; round++)
            for (int i = 0; i < 2; i++) {
                if (dfl_set_isa(isa[i], &err)) die("--isa-ab", &err);
                double sec = fwd(b, 128, Bs[k], DFL_BENCH_LOGITS);
                if (sec < best[i]) best[i] = sec;
            }
        printf("%4d %9.2f %9.2f %7.2fx\n", Bs[k], best[0] * 1e3, best[1] * 1e3, best[0] / best[1]);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "B", Bs[k]);
        cJSON_AddNumberToObject(r, "ms_a", best[0] * 1e3);
        cJSON_AddNumberToObject(r, "ms_b", best[1] * 1e3);
        cJSON_AddItemToArray(arr, r);
    }
    printf("\n");
    if (dfl_set_isa(b->o->eo.isa, &err)) die("--isa-ab", &err);
}

static void sec_verify(bench *b, cJSON *arr) {
    int bmax = b->o->max_block;
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "type", b->mi.dtype);
    cJSON *rows = cJSON_AddArrayToObject(v, "rows");
    printf("verify cost, %s (B rows, logits for all; context 128):\n", b->mi.dtype);
    printf("%4s %9s %9s %10s %10s %9s\n", "B", "ms", "x B=1", "roofline", "GFLOP/s", "% peak");
    double t1 = 0, moe1 = 0;
    char moe_rows[DFL_MAX_BLOCK][96];
    for (int B = 1; B <= bmax; B++) {
        cli_progress(NULL, "verify", B, bmax);
        double sec = fwd(b, 128, B, DFL_BENCH_LOGITS);
        uint64_t ex, bytes;
        dfl_bench_moe(b->s, &ex, &bytes);
        if (B == 1) moe1 = (double)bytes;
        snprintf(moe_rows[B - 1], sizeof moe_rows[0], "%4d %9llu %10.1f %9.2f", B,
                 (unsigned long long)ex, bytes / 1e6, moe1 > 0 ? bytes / moe1 : 0);
        if (B == 1) t1 = sec;
        double pred = b->bw > 0 ? roofline(b, B) / roofline(b, 1) : 0;
        double gf = b->flops * B / sec / 1e9;
        printf("%4d %9.2f %9.2f %10.2f %10.1f %8.1f%%\n", B, sec * 1e3, sec / t1, pred, gf,
               b->peak > 0 ? 100 * gf / b->peak : 0);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "B", B);
        cJSON_AddNumberToObject(r, "ms", sec * 1e3);
        cJSON_AddNumberToObject(r, "ratio", sec / t1);
        cJSON_AddNumberToObject(r, "roofline_ratio", pred);
        cJSON_AddNumberToObject(r, "gflops", gf);
        cJSON_AddNumberToObject(r, "moe_experts", (double)ex);
        cJSON_AddNumberToObject(r, "moe_mb", bytes / 1e6);
        cJSON_AddItemToArray(rows, r);
    }
    if (moe1 > 0) {   /* an extra row routes to more experts: a block reads more */
        printf("experts run by the B-row forward (each distinct one per layer), their MB:\n");
        printf("%4s %9s %10s %9s\n", "B", "experts", "expert MB", "x B=1");
        for (int B = 1; B <= bmax; B++) printf("%s\n", moe_rows[B - 1]);
    }
    /* a prefill-style chunk (logits of no row), as llama-bench's pp16 runs */
    double chunk = fwd(b, 128, 16, 0);
    printf("16 rows without logits (a prefill chunk): %.2f ms, %.1f rows/s\n\n", chunk * 1e3,
           16 / chunk);
    fflush(stdout);
    cJSON_AddNumberToObject(v, "rows16_nologits_ms", chunk * 1e3);
    if (b->o->isa_ab[0]) sec_isa_ab(b, v);
    cJSON_AddItemToArray(arr, v);
}

/* Synthetic prompts: fixed ids spread over the vocabulary (content does not
 * matter to the replay; the reference is whatever classic decode makes). */
static int32_t *make_prompt(const bench *b, int n) {
    int32_t *p = cli_alloc(sizeof(int32_t) * n, 1);
    for (int i = 0; i < n; i++) p[i] = (int32_t)((104729u * (i + 3)) % (unsigned)b->mi.vocab);
    return p;
}

/* The spec and rules prompt: --prompt's tokens, or --prompt-len synthetic ids. */
static void set_prompt(bench *b) {
    const opts *o = b->o;
    if (!o->prompt) {
        b->prompt = make_prompt(b, o->prompt_len);
        b->n_prompt = o->prompt_len;
        return;
    }
    int cap = (int)strlen(o->prompt) + 8;
    b->prompt = cli_alloc(sizeof(int32_t) * cap, 1);
    dfl_error err = {0};
    b->n_prompt = dfl_tokenize(b->e, o->prompt, strlen(o->prompt), 1, 0, b->prompt, cap, &err);
    if (b->n_prompt < 0) die("--prompt", &err);
    if (b->n_prompt == 0) {
        fprintf(stderr, "dflash bench: --prompt gives no tokens\n");
        exit(2);
    }
}

/* Committed ids of a dfl_generate run (the classic reference, or a run to
 * check against it). */
typedef cli_idbuf refbuf;

/* Generates n tokens after the bench prompt with gp (EOS ignored) into ref. */
static void gen_ids(bench *b, dfl_gen_params *gp, int n, refbuf *ref, dfl_stats *st) {
    dfl_error err = {0};
    gp->ignore_eos = 1, gp->max_tokens = n;
    ref->n = 0;
    if (dfl_generate(b->s, b->prompt, b->n_prompt, gp, cli_on_id, ref, st, &err))
        die("generate", &err);
}

/* The loop's counters and times of one run, shared by spec and rules rows. */
static void add_stats(cJSON *o, const dfl_stats *st) {
    cJSON_AddNumberToObject(o, "rounds", (double)st->rounds);
    cJSON_AddNumberToObject(o, "classic_steps", (double)st->classic_steps);
    cJSON_AddNumberToObject(o, "accepted", (double)st->accepted);
    cJSON_AddNumberToObject(o, "t_decode", st->t_decode);
    cJSON_AddNumberToObject(o, "t_draft", st->t_draft);
    cJSON_AddNumberToObject(o, "t_verify", st->t_verify);
    cJSON *pos = cJSON_AddArrayToObject(o, "acceptance_by_position");
    for (int k = 0; k < DFL_MAX_POS_STATS && st->pos_proposed[k]; k++)
        cJSON_AddItemToArray(pos, cJSON_CreateNumber((double)st->pos_accepted[k] /
                                                     st->pos_proposed[k]));
}

static void spec_row(bench *b, cJSON *rows, double tau, const char *mode, int block,
                     const dfl_bench_replay_result *r, double classic_tps) {
    const dfl_stats *st = &r->st;
    double tps = st->t_decode > 0 ? st->n_gen / st->t_decode : 0;
    uint64_t fwds = st->rounds + st->classic_steps;
    double per_fwd = fwds ? (double)st->n_gen / fwds : 0;
    double meanB = st->rounds ? (double)(st->proposed + st->rounds) / st->rounds : 1;
    double ms_round = fwds ? 1e3 * st->t_decode / fwds : 0;
    double over = st->t_verify > 0 ? (st->t_decode - st->t_verify) / st->t_verify : 0;
    printf("%5.2f %-9s %8.2f %8.2f %8.2f %7.2f %9.2f %8.1f%% %6s\n", tau, mode, tps,
           classic_tps > 0 ? tps / classic_tps : 1, per_fwd, meanB, ms_round, 100 * over,
           r->matches_ref ? "yes" : "NO");
    fflush(stdout);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tau", tau);
    cJSON_AddStringToObject(o, "mode", mode);
    cJSON_AddNumberToObject(o, "block", block);
    cJSON_AddNumberToObject(o, "tok_s", tps);
    cJSON_AddNumberToObject(o, "x_classic", classic_tps > 0 ? tps / classic_tps : 1);
    cJSON_AddNumberToObject(o, "tokens_per_forward", per_fwd);
    cJSON_AddNumberToObject(o, "mean_block", meanB);
    cJSON_AddNumberToObject(o, "ms_per_forward", ms_round);
    cJSON_AddNumberToObject(o, "overhead_over_verify", over);
    add_stats(o, st);
    cJSON_AddNumberToObject(o, "forced", (double)r->forced);
    cJSON_AddNumberToObject(o, "t_calibrate", r->t_calibrate);
    cJSON_AddNumberToObject(o, "p", r->p_flat);
    cJSON_AddBoolToObject(o, "matches_classic", r->matches_ref);
    cJSON_AddNumberToObject(o, "exact_checked", st->exact_checked);
    cJSON_AddItemToArray(rows, o);
}

/* One replayed run; gp: sampling parameters, or NULL for greedy. */
static void replay(bench *b, const refbuf *ref, int block, double tau, int fresh,
                   const dfl_gen_params *gp, dfl_bench_replay_result *r) {
    dfl_bench_replay_opts ro = {.block = block, .tau = tau, .seed = b->o->seed,
                                .max_tokens = b->o->n_gen, .fresh_costs = fresh, .sample = gp};
    dfl_error err = {0};
    if (dfl_bench_replay(b->s, b->prompt, b->n_prompt, ref->ids, ref->n, &ro, r, &err))
        die("replay", &err);
}

static void sec_spec(bench *b) {
    const opts *o = b->o;
    if (!b->mi.has_draft) {
        printf("spec: skipped (no --draft)\n\n");
        return;
    }
    refbuf ref = {cli_alloc(sizeof(int32_t) * (o->n_gen + 128), 1), 0, o->n_gen + 128};
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.block_size = 1;
    dfl_stats st;
    fprintf(stderr, "bench: classic reference decode of %d tokens\n", o->n_gen + 80);
    gen_ids(b, &gp, o->n_gen + 80, &ref, &st);

    cJSON *sp = cJSON_AddObjectToObject(b->root, "spec");
    cJSON_AddStringToObject(sp, "type", b->mi.dtype);
    cJSON_AddNumberToObject(sp, "n_gen", o->n_gen);
    cJSON_AddNumberToObject(sp, "prompt_len", b->n_prompt);
    cJSON_AddNumberToObject(sp, "spec_reps", o->spec_reps);
    cJSON_AddNumberToObject(sp, "draft_block", b->mi.draft_block);
    cJSON_AddNumberToObject(sp, "draft_layers", b->mi.draft_layers);
    cJSON *rows = cJSON_AddArrayToObject(sp, "runs");
    printf("speculative A/B, %s, replay drafter (%d-layer drafter runs every round), %d tokens:\n",
           b->mi.dtype, b->mi.draft_layers, o->n_gen);
    printf("%5s %-9s %8s %8s %8s %7s %9s %9s %6s\n", "tau", "mode", "tok/s", "x classic",
           "tok/fwd", "mean B", "ms/fwd", "ovh/ver", "exact");
    /* modes of one profile: classic, the pinned blocks that fit, adaptive */
    int modes[MAXL + 2], n_modes = 0;
    modes[n_modes++] = 1;
    for (int k = 0; k < o->n_blocks; k++)
        if (o->blocks[k] <= o->max_block && o->blocks[k] <= b->mi.draft_block)
            modes[n_modes++] = o->blocks[k];
    modes[n_modes++] = 0;
    dfl_bench_replay_result *best = cli_alloc(n_modes, sizeof *best), *r = cli_alloc(sizeof *r, 1);
    int n_runs = o->n_tau * n_modes * o->spec_reps, done = 0;
    for (int i = 0; i < o->n_tau; i++) {
        /* --spec-reps cycles through all modes, so each mode's fastest run
         * comes from the same stretch of time as the others' */
        for (int rep = 0; rep < o->spec_reps; rep++)
            for (int m = 0; m < n_modes; m++) {
                replay(b, &ref, modes[m], o->tau[i], modes[m] == 0, NULL, r);
                cli_progress(NULL, "spec", ++done, n_runs);
                if (rep == 0 || r->st.t_decode < best[m].st.t_decode) best[m] = *r;
            }
        double classic = best[0].st.n_gen / best[0].st.t_decode;
        for (int m = 0; m < n_modes; m++) {
            char mode[16];
            if (modes[m] == 1) snprintf(mode, sizeof mode, "classic");
            else if (modes[m] == 0) snprintf(mode, sizeof mode, "adaptive");
            else snprintf(mode, sizeof mode, "B=%d", modes[m]);
            spec_row(b, rows, o->tau[i], mode, modes[m], &best[m], classic);
        }
        if (i == 0) {
            cJSON *c = cJSON_AddArrayToObject(sp, "cost_table_ms");
            for (int B = 1; B <= o->max_block; B++)
                cJSON_AddItemToArray(c, cJSON_CreateNumber(best[n_modes - 1].t_round[B] * 1e3));
        }
    }
    free(best);
    free(r);
    printf("(tok/fwd: tokens committed per target forward; ms/fwd: decode time per round or\n"
           " classic step; ovh/ver: time beyond the verify forwards over their time)\n\n");
    free(ref.ids);
}

/* ---- rules: the acceptance rules at temperature ---------------------------------- */

static const char *rule_name[] = {"exact", "rejection", "typical"};

typedef struct rule_run {
    double temp, tau_profile;   /* tau_profile: replayed profile, 0 for a real run */
    int rule, block;            /* block 1: classic, 0: adaptive */
    int tree;                   /* a pinned tree budget (mode T=N), or 0 */
    const char *drafter;        /* "none", "replay" or "real" */
    const dfl_stats *st;
    int exact;                  /* output equals classic: 1, differs: 0, not checked: -1 */
} rule_run;

static void rule_row(cJSON *rows, const rule_run *u, double classic_tps) {
    const dfl_stats *st = u->st;
    double tps = st->t_decode > 0 ? st->n_gen / st->t_decode : 0;
    double tau = st->rounds ? (double)(st->accepted + st->rounds) / st->rounds : 1;
    double acc = st->proposed ? (double)st->accepted / st->proposed : 0;
    char mode[16], drafter[24];
    if (u->tree > 0) snprintf(mode, sizeof mode, "T=%d", u->tree);
    else if (u->block == 1) snprintf(mode, sizeof mode, "classic");
    else if (u->block == 0) snprintf(mode, sizeof mode, "adaptive");
    else snprintf(mode, sizeof mode, "B=%d", u->block);
    if (u->tau_profile > 0) snprintf(drafter, sizeof drafter, "replay %.2f", u->tau_profile);
    else snprintf(drafter, sizeof drafter, "%s", u->drafter);
    printf("%4.2f %-9s %-11s %-8s %8.2f %8.2f %6.2f %6.1f%% %6s\n", u->temp,
           u->block == 1 ? "-" : rule_name[u->rule], drafter, mode, tps,
           classic_tps > 0 ? tps / classic_tps : 1, tau, 100 * acc,
           u->exact < 0 ? "-" : u->exact ? "yes" : "NO");
    fflush(stdout);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "temp", u->temp);
    cJSON_AddStringToObject(o, "rule", u->block == 1 ? "none" : rule_name[u->rule]);
    cJSON_AddStringToObject(o, "drafter", u->drafter);
    cJSON_AddNumberToObject(o, "tau_profile", u->tau_profile);
    cJSON_AddStringToObject(o, "mode", mode);
    cJSON_AddNumberToObject(o, "block", u->block);
    cJSON_AddNumberToObject(o, "tree_budget", u->tree);
    cJSON_AddNumberToObject(o, "tree_rounds", (double)st->tree_rounds);
    cJSON_AddNumberToObject(o, "tok_s", tps);
    cJSON_AddNumberToObject(o, "x_classic", classic_tps > 0 ? tps / classic_tps : 1);
    cJSON_AddNumberToObject(o, "tau", tau);
    cJSON_AddNumberToObject(o, "accept_rate", acc);
    add_stats(o, st);
    cJSON_AddNumberToObject(o, "accepted_lossy", (double)st->accepted_lossy);
    cJSON_AddNumberToObject(o, "resampled", (double)st->resampled);
    if (u->exact >= 0) cJSON_AddBoolToObject(o, "matches_classic", u->exact);
    cJSON_AddItemToArray(rows, o);
}

/* One temperature: the classic reference (also the exact rule's target
 * output), the exact rule replayed at each profile, then each rule with the
 * real drafter at the pinned block and adaptive. */
static void rules_at(bench *b, cJSON *rows, double temp, int *done, int n_runs) {
    const opts *o = b->o;
    int block = o->rule_block < b->mi.draft_block ? o->rule_block : b->mi.draft_block;
    if (block > o->max_block) block = o->max_block;
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.temperature = (float)temp, gp.seed = o->seed, gp.typical_d = (float)o->typical_d;
    gp.block_size = 1;
    refbuf ref = {cli_alloc(sizeof(int32_t) * (o->n_gen + 128), 1), 0, o->n_gen + 128};
    refbuf out = {cli_alloc(sizeof(int32_t) * o->n_gen, 1), 0, o->n_gen};
    dfl_stats st;
    gen_ids(b, &gp, o->n_gen + 80, &ref, &st);
    dfl_bench_replay_result *r = cli_alloc(sizeof *r, 1);
    replay(b, &ref, 1, 1, 0, &gp, r);
    cli_progress(NULL, "rules", ++*done, n_runs);
    double classic = r->st.n_gen / r->st.t_decode;
    rule_row(rows, &(rule_run){temp, 0, 0, 1, 0, "none", &r->st, -1}, classic);
    for (int i = 0; i < o->n_tau; i++) {
        replay(b, &ref, block, o->tau[i], 0, &gp, r);
        cli_progress(NULL, "rules", ++*done, n_runs);
        rule_row(rows, &(rule_run){temp, o->tau[i], 0, block, 0, "replay", &r->st,
                                   r->matches_ref}, classic);
    }
    for (int rule = 0; rule < 3; rule++) {
        if (rule && temp <= 0) break;   /* greedy: every rule is the exact one */
        int modes[2] = {block, 0};
        for (int m = 0; m < 2; m++) {
            gp.spec_accept = rule, gp.block_size = modes[m];
            gen_ids(b, &gp, o->n_gen, &out, &st);
            cli_progress(NULL, "rules", ++*done, n_runs);
            int exact = rule ? -1 : out.n == o->n_gen &&
                        !memcmp(out.ids, ref.ids, sizeof(int32_t) * o->n_gen);
            rule_row(rows, &(rule_run){temp, 0, rule, modes[m], 0, "real", &st, exact},
                     classic);
        }
    }
    for (int k = 0; k < o->n_trees; k++) {   /* trees: the exact rule, the same check */
        gp.spec_accept = DFL_ACCEPT_EXACT, gp.block_size = 0, gp.tree_budget = o->trees[k];
        gen_ids(b, &gp, o->n_gen, &out, &st);
        cli_progress(NULL, "rules", ++*done, n_runs);
        int exact = out.n == o->n_gen && !memcmp(out.ids, ref.ids, sizeof(int32_t) * o->n_gen);
        rule_row(rows, &(rule_run){temp, 0, 0, 0, o->trees[k], "real", &st, exact}, classic);
    }
    gp.tree_budget = -1;
    free(r);
    free(ref.ids);
    free(out.ids);
}

static void sec_rules(bench *b) {
    const opts *o = b->o;
    if (!b->mi.has_draft) {
        printf("rules: skipped (no --draft)\n\n");
        return;
    }
    cJSON *ru = cJSON_AddObjectToObject(b->root, "rules");
    cJSON_AddStringToObject(ru, "type", b->mi.dtype);
    cJSON_AddNumberToObject(ru, "n_gen", o->n_gen);
    cJSON_AddNumberToObject(ru, "prompt_len", b->n_prompt);
    cJSON_AddNumberToObject(ru, "typical_d", o->typical_d);
    cJSON_AddNumberToObject(ru, "seed", (double)o->seed);
    cJSON *rows = cJSON_AddArrayToObject(ru, "runs");
    printf("acceptance rules, %s, %d tokens, seed %llu (real: the drafter's own proposals; "
           "replay: the exact rule at a forced profile; typical d = %g):\n", b->mi.dtype,
           o->n_gen, (unsigned long long)o->seed, o->typical_d);
    printf("%4s %-9s %-11s %-8s %8s %8s %6s %7s %6s\n", "T", "rule", "drafter", "mode",
           "tok/s", "x classic", "tau", "acc", "exact");
    int n_runs = 0, done = 0;
    for (int i = 0; i < o->n_temps; i++)
        n_runs += 1 + o->n_tau + (o->temps[i] > 0 ? 6 : 2) + o->n_trees;
    for (int i = 0; i < o->n_temps; i++) rules_at(b, rows, o->temps[i], &done, n_runs);
    printf("(tau: tokens committed per verify round; acc: drafts accepted over proposed;\n"
           " exact: output equals classic decode at the same seed -- the exact rule's promise)\n\n");
}

/* Time to first token for a real prompt of n tokens (prefill + one step). */
static double ttft(bench *b, int n) {
    int32_t *p = make_prompt(b, n);
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.block_size = 1, gp.ignore_eos = 1, gp.max_tokens = 1;
    dfl_error err = {0};
    dfl_stats st;
    if (dfl_generate(b->s, p, n, &gp, NULL, NULL, &st, &err)) die("ttft", &err);
    free(p);
    return st.t_prefill + st.t_decode;
}

static void sec_ctx(bench *b) {
    const opts *o = b->o;
    enum { CHUNK = 64 };
    cJSON *arr = cJSON_AddArrayToObject(b->root, "ctx");
    int vb = o->max_block;
    printf("context ladder, %s, %s K/V (decode: one row; verify: a %d-row block with logits; "
           "prefill: %d-row chunks at that depth):\n", b->mi.dtype, b->mi.kv_type, vb, CHUNK);
    cJSON_AddStringToObject(b->root, "kv_type", b->mi.kv_type);
    printf("%7s %10s %9s %11s %9s %12s %12s\n", "ctx", "decode ms", "tok/s", "verify ms",
           "/ decode", "prefill t/s", "TTFT s");
    double prev_ctx = 0, prev_chunk = fwd(b, 0, CHUNK, 0), est = 0;
    for (int i = 0; i < o->n_ctx; i++) {
        cli_progress(NULL, "ctx", i + 1, o->n_ctx);
        int c = o->ctx[i];
        double dec = fwd(b, c, 1, DFL_BENCH_LOGITS);
        double ver = fwd(b, c, vb, DFL_BENCH_LOGITS);
        double chunk = fwd(b, c, CHUNK, 0);
        /* TTFT summed from chunk times, linear in depth between measured points */
        est += (c - prev_ctx) / CHUNK * 0.5 * (prev_chunk + chunk);
        prev_ctx = c, prev_chunk = chunk;
        int real = c <= o->ttft_max;
        double t = real ? ttft(b, c) : est + dec;
        printf("%7d %10.2f %9.2f %11.2f %8.2fx %12.1f %11.2f%s\n", c, dec * 1e3, 1 / dec,
               ver * 1e3, ver / dec, CHUNK / chunk, t, real ? " " : "*");
        fflush(stdout);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "ctx", c);
        cJSON_AddNumberToObject(r, "decode_ms", dec * 1e3);
        cJSON_AddNumberToObject(r, "decode_tok_s", 1 / dec);
        cJSON_AddNumberToObject(r, "verify_rows", vb);
        cJSON_AddNumberToObject(r, "verify_ms", ver * 1e3);
        cJSON_AddNumberToObject(r, "prefill_tok_s", CHUNK / chunk);
        cJSON_AddNumberToObject(r, "ttft_s", t);
        cJSON_AddBoolToObject(r, "ttft_measured", real);
        cJSON_AddNumberToObject(r, "ttft_from_chunks_s", est + dec);
        cJSON_AddItemToArray(arr, r);
    }
    printf("(* summed from the measured chunk times; unmarked: a real prefill)\n\n");
}

/* ---- main ------------------------------------------------------------------------ */

static int ctx_needed(const opts *o) {
    int need = (o->prompt ? (int)strlen(o->prompt) + 8 : o->prompt_len) + o->n_gen + 256;
    if (o->sections & SEC_CTX)
        for (int i = 0; i < o->n_ctx; i++)
            if (o->ctx[i] + 80 > need) need = o->ctx[i] + 80;
    return need < 512 ? 512 : need;
}

static void model_json(bench *b) {
    cJSON *m = cJSON_AddObjectToObject(b->root, "model");
    cJSON_AddStringToObject(m, "name", b->mi.name);
    cJSON_AddStringToObject(m, "arch", b->mi.arch);
    cJSON_AddNumberToObject(m, "layers", b->mi.n_layers);
    cJSON_AddNumberToObject(m, "dim", b->mi.dim);
    cJSON_AddNumberToObject(m, "ffn", b->mi.ffn_dim);
    cJSON_AddNumberToObject(m, "vocab", b->mi.vocab);
    cJSON_AddNumberToObject(m, "row_gflop", b->flops / 1e9);
    cJSON_AddNumberToObject(m, "threads", b->mi.n_threads);
    cJSON_AddStringToObject(m, "kernels", b->mi.simd);
    if (b->mi.has_draft) cJSON_AddNumberToObject(m, "draft_layers", b->mi.draft_layers);
}

static void decode_table(cJSON *dec) {
    printf("decode summary (one row, context 128: best forward | generate median):\n"
           "%-6s %9s %9s %8s %8s %8s | %9s %8s %8s\n", "type", "MB/token", "ms", "tok/s", "GB/s",
           "of bw", "med ms", "tok/s", "of bw");
    cJSON *d;
    cJSON_ArrayForEach(d, dec) {
        const cJSON *r = cJSON_GetObjectItem(d, "sustained");
        printf("%-6s %9.1f %9.2f %8.2f %8.2f %7.1f%% | %9.2f %8.2f %7.1f%%\n",
               cJSON_GetObjectItem(d, "type")->valuestring,
               cJSON_GetObjectItem(d, "weight_bytes")->valuedouble / 1e6,
               cJSON_GetObjectItem(d, "ms_per_token")->valuedouble,
               cJSON_GetObjectItem(d, "tok_s")->valuedouble,
               cJSON_GetObjectItem(d, "gbs")->valuedouble,
               100 * cJSON_GetObjectItem(d, "frac_of_bw")->valuedouble,
               cJSON_GetObjectItem(r, "ms_median")->valuedouble,
               cJSON_GetObjectItem(r, "tok_s")->valuedouble,
               100 * cJSON_GetObjectItem(r, "frac_of_bw")->valuedouble);
    }
    printf("\n");
}

int cmd_bench(int argc, char **argv) {
    opts o;
    memset(&o, 0, sizeof o);
    parse(&o, argc, argv);
    bench b = {.o = &o, .root = cJSON_CreateObject()};
    cJSON *dec = cJSON_CreateArray(), *ver = cJSON_CreateArray(), *rss_arr = cJSON_CreateArray();
    for (int ti = 0; ti < o.n_types; ti++) {
        int first = ti == 0;
        load(&b, o.types[ti], first ? ctx_needed(&o) : 512,
             first && (o.eo.draft_path || o.eo.draft_mtp) && (o.sections & (SEC_SPEC | SEC_RULES)));
        if (first) {
            model_json(&b);
            printf("model %s: %s, %d layers, dim %d, ffn %d, vocab %d; %.2f GFLOP per row; "
                   "%s kernels, %d threads\n\n",
                   b.mi.name, b.mi.arch, b.mi.n_layers, b.mi.dim, b.mi.ffn_dim, b.mi.vocab,
                   b.flops / 1e9, b.mi.simd, b.mi.n_threads);
            if (o.sections & (SEC_MACHINE | SEC_DECODE | SEC_VERIFY)) sec_machine(&b);
        }
        if (o.sections & SEC_DECODE) {
            printf("decode (one row, context 128: best timed forward | a %d-token generate, per "
                   "step: median, p90 - p10):\n%-6s %9s %9s %8s %8s %8s | %9s %9s %8s %8s\n",
                   SUSTAINED_TOKENS, "type", "MB/token", "ms", "tok/s", "GB/s", "of bw", "med ms",
                   "tok/s", "spread", "of bw");
            sec_decode(&b, dec);
            printf("\n");
        }
        if (o.sections & SEC_VERIFY) sec_verify(&b, ver);
        if (first) set_prompt(&b);
        if (first && (o.sections & SEC_SPEC)) sec_spec(&b);
        if (first && (o.sections & SEC_RULES)) sec_rules(&b);
        if (first && (o.sections & SEC_CTX)) sec_ctx(&b);
        double rss = peak_rss_mb();
        printf("peak RSS with %s weights%s: %.0f MB\n\n", b.mi.dtype,
               b.mi.has_draft ? " and the drafter" : "", rss);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "type", b.mi.dtype);
        cJSON_AddBoolToObject(r, "with_drafter", b.mi.has_draft);
        cJSON_AddNumberToObject(r, "peak_rss_mb", rss);
        cJSON_AddItemToArray(rss_arr, r);
        unload(&b);
        reset_peak_rss();
        free(b.prompt);
        b.prompt = NULL;
    }
    if ((o.sections & SEC_DECODE) && o.n_types > 1) decode_table(dec);
    cJSON_AddItemToObject(b.root, "decode", dec);
    cJSON_AddItemToObject(b.root, "verify", ver);
    cJSON_AddItemToObject(b.root, "peak_rss", rss_arr);
    int rc = 0;
    if (o.json) {
        char *s = cJSON_Print(b.root);
        FILE *f = fopen(o.json, "w");
        if (!f || fputs(s, f) < 0 || fputc('\n', f) == EOF) {
            fprintf(stderr, "dflash bench: cannot write %s\n", o.json);
            rc = 1;
        }
        if (f) fclose(f);
        free(s);
    }
    cJSON_Delete(b.root);
    return rc;
}
