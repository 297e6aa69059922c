/* cmd_bench.c - `dflash bench`: speed against this machine's own limits,
 * measured in one run so ratios hold even on a busy machine.
 *
 *   machine  read bandwidth and f32 FMA peak on the engine's threads
 *   decode   one-row forward per weight type: tok/s, GB/s, % of bandwidth
 *   verify   B-row forward cost over one row, next to the roofline's guess
 *   spec     classic vs pinned blocks vs adaptive, with a replay drafter
 *            at given acceptance profiles (tau)
 *   ctx      decode and prefill at depth, time to first token; peak RSS */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

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
        "  --types LIST           weight types to convert to at load and measure, e.g.\n"
        "                         bf16,q8_0 (default: auto, the file's own); the spec and\n"
        "                         ctx sections use the first\n"
        "  -t, --threads N        threads (default: all cores)\n"
        "  --sections LIST        any of machine,decode,verify,spec,ctx (default: all)\n"
        "  --max-block N          largest verify block measured (default 16)\n"
        "  --tau LIST             acceptance profiles for the spec section: committed tokens\n"
        "                         per round at the drafter's block, flat per position\n"
        "                         (default 1,3,5,6.5; 1 = nothing accepted)\n"
        "  --blocks LIST          pinned block sizes in the spec section (default 4,8,16)\n"
        "  -n N                   tokens generated per spec run (default 128)\n"
        "  --prompt-len N         prompt tokens for the spec runs (default 32)\n"
        "  --ctx LIST             context ladder (default 1024,2048,4096,8192,16384,32768)\n"
        "  --ttft-max N           real prefills up to N tokens for time to first token;\n"
        "                         longer ones are summed from measured chunk times (default 1024)\n"
        "  --reps N               timed repetitions per forward, best kept (default 3)\n"
        "  --spec-reps N          runs per spec mode and profile, fastest kept (default 1)\n"
        "  --seed N               seed of the replayed accept lengths (default 1)\n"
        "  --json FILE            write the results as JSON to FILE\n"
        "\n"
        "The replay drafter runs the real drafter every round (its cost is real) but\n"
        "proposes the classic decode's own tokens, right for an accept length drawn per\n"
        "position from the profile, so speed at a known acceptance is measured on any\n"
        "pair, random weights included; every spec run's output is checked against\n"
        "classic decode. Cache depths in the ctx section hold placeholder K/V.\n");
}

enum { MAXL = 32 };

typedef struct opts {
    dfl_engine_opts eo;
    const char *types[MAXL];
    int n_types;
    int sections;            /* bit set of SEC_* */
    int max_block, n_gen, prompt_len, ttft_max, reps, spec_reps, no_draft;
    double tau[MAXL];
    int n_tau;
    int blocks[MAXL], n_blocks;
    int ctx[MAXL], n_ctx;
    uint64_t seed;
    const char *json;
} opts;

enum { SEC_MACHINE = 1, SEC_DECODE = 2, SEC_VERIFY = 4, SEC_SPEC = 8, SEC_CTX = 16 };

static const char *need(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "dflash bench: %s needs a value (see --help)\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

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
    static const char *names[] = {"machine", "decode", "verify", "spec", "ctx"};
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < 5 && strcmp(p[i], names[k])) k++;
        if (k == 5) {
            fprintf(stderr, "dflash bench: --sections: unknown '%s' (machine, decode, verify, "
                            "spec, ctx)\n", p[i]);
            exit(2);
        }
        bits |= 1 << k;
    }
    return bits;
}

static void parse(opts *o, int argc, char **argv) {
    dfl_engine_opts_default(&o->eo);
    o->types[0] = "auto", o->n_types = 1;
    o->sections = 31;
    o->max_block = 16, o->n_gen = 128, o->prompt_len = 32, o->ttft_max = 1024, o->reps = 3;
    o->spec_reps = 1;
    o->seed = 1;
    static const double tau[] = {1, 3, 5, 6.5};
    memcpy(o->tau, tau, sizeof tau), o->n_tau = 4;
    static const int blocks[] = {4, 8, 16};
    memcpy(o->blocks, blocks, sizeof blocks), o->n_blocks = 3;
    static const int ctx[] = {1024, 2048, 4096, 8192, 16384, 32768};
    memcpy(o->ctx, ctx, sizeof ctx), o->n_ctx = 6;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) help(), exit(0);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->eo.model_path = need(argc, argv, &i);
        else if (!strcmp(a, "--draft")) o->eo.draft_path = need(argc, argv, &i);
        else if (!strcmp(a, "--types")) o->n_types = split(a, need(argc, argv, &i), (char **)o->types);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            o->eo.n_threads = cli_int(a, need(argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--sections")) o->sections = sections(need(argc, argv, &i));
        else if (!strcmp(a, "--max-block")) o->max_block = cli_int(a, need(argc, argv, &i), 1, 64);
        else if (!strcmp(a, "--tau")) {
            char *p[MAXL];
            o->n_tau = split(a, need(argc, argv, &i), p);
            for (int k = 0; k < o->n_tau; k++) o->tau[k] = cli_num(a, p[k], 1, 64);
        } else if (!strcmp(a, "--blocks"))
            o->n_blocks = int_list(a, need(argc, argv, &i), o->blocks, 2, 64);
        else if (!strcmp(a, "-n")) o->n_gen = cli_int(a, need(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--prompt-len")) o->prompt_len = cli_int(a, need(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--ctx")) o->n_ctx = int_list(a, need(argc, argv, &i), o->ctx, 1, 1 << 22);
        else if (!strcmp(a, "--ttft-max")) o->ttft_max = cli_int(a, need(argc, argv, &i), 0, 1 << 22);
        else if (!strcmp(a, "--reps")) o->reps = cli_int(a, need(argc, argv, &i), 1, 1000);
        else if (!strcmp(a, "--spec-reps")) o->spec_reps = cli_int(a, need(argc, argv, &i), 1, 100);
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)cli_num(a, need(argc, argv, &i), 0, 1e18);
        else if (!strcmp(a, "--json")) o->json = need(argc, argv, &i);
        else {
            fprintf(stderr, "dflash bench: unknown option '%s' (see --help)\n", a);
            exit(2);
        }
    }
    if (o->eo.draft_path && !strcmp(o->eo.draft_path, "none")) o->eo.draft_path = NULL, o->no_draft = 1;
    if (!o->eo.model_path) {
        o->eo.model_path = cli_default_model();
        if (!o->eo.model_path) {
            fprintf(stderr, "dflash bench: no --model given and no built-in model found\n");
            exit(2);
        }
        if (!o->eo.draft_path && !o->no_draft) o->eo.draft_path = cli_default_draft();
    }
}

/* ---- helpers ------------------------------------------------------------------ */

typedef struct bench {
    opts *o;
    dfl_engine *e;
    dfl_session *s;
    dfl_model_info mi;
    double bw, peak, flops;    /* GB/s, GFLOP/s, FLOPs per row */
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
    if (!with_draft) eo.draft_path = NULL;
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
    b->bw = dfl_bench_read_bw(b->e);
    b->peak = dfl_bench_fma_peak(b->e);
    reset_peak_rss();   /* the bandwidth buffer is not the engine's */
    printf("machine: %d threads, read bandwidth %.2f GB/s, f32 FMA peak %.1f GFLOP/s\n\n",
           b->mi.n_threads, b->bw, b->peak);
    cJSON *m = cJSON_AddObjectToObject(b->root, "machine");
    cJSON_AddNumberToObject(m, "threads", b->mi.n_threads);
    cJSON_AddNumberToObject(m, "read_gbs", b->bw);
    cJSON_AddNumberToObject(m, "fma_gflops", b->peak);
}

static void sec_decode(bench *b, cJSON *arr) {
    double sec = fwd(b, 128, 1, DFL_BENCH_LOGITS);
    double gbs = b->mi.weight_bytes / sec / 1e9;
    printf("%-6s %9.1f %9.2f %8.2f %8.2f %7.1f%%\n", b->mi.dtype, b->mi.weight_bytes / 1e6,
           sec * 1e3, 1 / sec, gbs, b->bw > 0 ? 100 * gbs / b->bw : 0);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "type", b->mi.dtype);
    cJSON_AddNumberToObject(d, "weight_bytes", (double)b->mi.weight_bytes);
    cJSON_AddNumberToObject(d, "ms_per_token", sec * 1e3);
    cJSON_AddNumberToObject(d, "tok_s", 1 / sec);
    cJSON_AddNumberToObject(d, "gbs", gbs);
    cJSON_AddNumberToObject(d, "frac_of_bw", b->bw > 0 ? gbs / b->bw : 0);
    cJSON_AddItemToArray(arr, d);
}

/* Roofline: a B-row forward costs at least max(bytes / bandwidth, flops / peak). */
static double roofline(const bench *b, int B) {
    double tm = b->mi.weight_bytes / (b->bw * 1e9), tc = b->flops * B / (b->peak * 1e9);
    return tm > tc ? tm : tc;
}

static void sec_verify(bench *b, cJSON *arr) {
    int bmax = b->o->max_block;
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "type", b->mi.dtype);
    cJSON *rows = cJSON_AddArrayToObject(v, "rows");
    printf("verify cost, %s (B rows, logits for all; context 128):\n", b->mi.dtype);
    printf("%4s %9s %9s %10s %10s %9s\n", "B", "ms", "x B=1", "roofline", "GFLOP/s", "% peak");
    double t1 = 0;
    for (int B = 1; B <= bmax; B++) {
        cli_progress(NULL, "verify", B, bmax);
        double sec = fwd(b, 128, B, DFL_BENCH_LOGITS);
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
        cJSON_AddItemToArray(rows, r);
    }
    /* a prefill-style chunk (logits of no row), as llama-bench's pp16 runs */
    double chunk = fwd(b, 128, 16, 0);
    printf("16 rows without logits (a prefill chunk): %.2f ms, %.1f rows/s\n\n", chunk * 1e3,
           16 / chunk);
    fflush(stdout);
    cJSON_AddNumberToObject(v, "rows16_nologits_ms", chunk * 1e3);
    cJSON_AddItemToArray(arr, v);
}

/* The prompt: fixed ids spread over the vocabulary (content does not
 * matter to the replay; the reference is whatever classic decode makes). */
static int32_t *make_prompt(const bench *b, int n) {
    int32_t *p = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) p[i] = (int32_t)((104729u * (i + 3)) % (unsigned)b->mi.vocab);
    return p;
}

typedef struct refbuf {
    int32_t *ids;
    int n, cap;
} refbuf;

static int on_ref(void *ud, const dfl_token_info *t) {
    refbuf *r = ud;
    if (r->n < r->cap) r->ids[r->n++] = t->id;
    return 0;
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
    cJSON_AddNumberToObject(o, "rounds", (double)st->rounds);
    cJSON_AddNumberToObject(o, "classic_steps", (double)st->classic_steps);
    cJSON_AddNumberToObject(o, "accepted", (double)st->accepted);
    cJSON_AddNumberToObject(o, "forced", (double)r->forced);
    cJSON_AddNumberToObject(o, "t_decode", st->t_decode);
    cJSON_AddNumberToObject(o, "t_draft", st->t_draft);
    cJSON_AddNumberToObject(o, "t_verify", st->t_verify);
    cJSON_AddNumberToObject(o, "t_calibrate", r->t_calibrate);
    cJSON_AddNumberToObject(o, "p", r->p_flat);
    cJSON_AddBoolToObject(o, "matches_classic", r->matches_ref);
    cJSON_AddNumberToObject(o, "exact_checked", st->exact_checked);
    cJSON_AddItemToArray(rows, o);
}

/* The fastest of --spec-reps runs (a busy machine only ever slows a run). */
static void replay(bench *b, const int32_t *prompt, const refbuf *ref, int block, double tau,
                   int fresh, dfl_bench_replay_result *r) {
    dfl_bench_replay_opts ro = {.block = block, .tau = tau, .seed = b->o->seed,
                                .max_tokens = b->o->n_gen, .fresh_costs = fresh};
    dfl_error err = {0};
    dfl_bench_replay_result *t = malloc(sizeof *t);
    for (int i = 0; i < b->o->spec_reps; i++) {
        if (dfl_bench_replay(b->s, prompt, b->o->prompt_len, ref->ids, ref->n, &ro, t, &err))
            die("replay", &err);
        if (i == 0 || t->st.t_decode < r->st.t_decode) *r = *t;
    }
    free(t);
}

static void sec_spec(bench *b) {
    const opts *o = b->o;
    if (!b->mi.has_draft) {
        printf("spec: skipped (no --draft)\n\n");
        return;
    }
    int32_t *prompt = make_prompt(b, o->prompt_len);
    refbuf ref = {malloc(sizeof(int32_t) * (o->n_gen + 128)), 0, o->n_gen + 128};
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.block_size = 1, gp.ignore_eos = 1, gp.max_tokens = o->n_gen + 80;
    dfl_error err = {0};
    dfl_stats st;
    fprintf(stderr, "bench: classic reference decode of %d tokens\n", gp.max_tokens);
    if (dfl_generate(b->s, prompt, o->prompt_len, &gp, on_ref, &ref, &st, &err))
        die("reference decode", &err);

    cJSON *sp = cJSON_AddObjectToObject(b->root, "spec");
    cJSON_AddStringToObject(sp, "type", b->mi.dtype);
    cJSON_AddNumberToObject(sp, "n_gen", o->n_gen);
    cJSON_AddNumberToObject(sp, "prompt_len", o->prompt_len);
    cJSON_AddNumberToObject(sp, "spec_reps", o->spec_reps);
    cJSON_AddNumberToObject(sp, "draft_block", b->mi.draft_block);
    cJSON_AddNumberToObject(sp, "draft_layers", b->mi.draft_layers);
    cJSON *rows = cJSON_AddArrayToObject(sp, "runs");
    printf("speculative A/B, %s, replay drafter (%d-layer drafter runs every round), %d tokens:\n",
           b->mi.dtype, b->mi.draft_layers, o->n_gen);
    printf("%5s %-9s %8s %8s %8s %7s %9s %9s %6s\n", "tau", "mode", "tok/s", "x classic",
           "tok/fwd", "mean B", "ms/fwd", "ovh/ver", "exact");
    int n_runs = o->n_tau * (2 + o->n_blocks), done = 0;
    for (int i = 0; i < o->n_tau; i++) {
        dfl_bench_replay_result r;
        replay(b, prompt, &ref, 1, o->tau[i], 0, &r);
        cli_progress(NULL, "spec", ++done, n_runs);
        double classic = r.st.n_gen / r.st.t_decode;
        spec_row(b, rows, o->tau[i], "classic", 1, &r, classic);
        for (int k = 0; k < o->n_blocks; k++) {
            if (o->blocks[k] > o->max_block || o->blocks[k] > b->mi.draft_block) continue;
            char mode[16];
            snprintf(mode, sizeof mode, "B=%d", o->blocks[k]);
            replay(b, prompt, &ref, o->blocks[k], o->tau[i], 0, &r);
            cli_progress(NULL, "spec", ++done, n_runs);
            spec_row(b, rows, o->tau[i], mode, o->blocks[k], &r, classic);
        }
        replay(b, prompt, &ref, 0, o->tau[i], 1, &r);
        cli_progress(NULL, "spec", ++done, n_runs);
        spec_row(b, rows, o->tau[i], "adaptive", 0, &r, classic);
        if (i == 0) {
            cJSON *c = cJSON_AddArrayToObject(sp, "calibrated_ms");
            for (int B = 1; B <= o->max_block; B++)
                cJSON_AddItemToArray(c, cJSON_CreateNumber(r.t_round[B] * 1e3));
        }
    }
    printf("(tok/fwd: tokens committed per target forward; ms/fwd: decode time per round or\n"
           " classic step; ovh/ver: time beyond the verify forwards over their time)\n\n");
    free(prompt);
    free(ref.ids);
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
    printf("context ladder, %s (decode: one row; prefill: %d-row chunks at that depth):\n",
           b->mi.dtype, CHUNK);
    printf("%7s %10s %9s %12s %12s\n", "ctx", "decode ms", "tok/s", "prefill t/s", "TTFT s");
    double prev_ctx = 0, prev_chunk = fwd(b, 0, CHUNK, 0), est = 0;
    for (int i = 0; i < o->n_ctx; i++) {
        cli_progress(NULL, "ctx", i + 1, o->n_ctx);
        int c = o->ctx[i];
        double dec = fwd(b, c, 1, DFL_BENCH_LOGITS);
        double chunk = fwd(b, c, CHUNK, 0);
        /* TTFT summed from chunk times, linear in depth between measured points */
        est += (c - prev_ctx) / CHUNK * 0.5 * (prev_chunk + chunk);
        prev_ctx = c, prev_chunk = chunk;
        int real = c <= o->ttft_max;
        double t = real ? ttft(b, c) : est + dec;
        printf("%7d %10.2f %9.2f %12.1f %11.2f%s\n", c, dec * 1e3, 1 / dec, CHUNK / chunk, t,
               real ? " " : "*");
        fflush(stdout);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "ctx", c);
        cJSON_AddNumberToObject(r, "decode_ms", dec * 1e3);
        cJSON_AddNumberToObject(r, "decode_tok_s", 1 / dec);
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
    int need = o->prompt_len + o->n_gen + 256;
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
    if (b->mi.has_draft) cJSON_AddNumberToObject(m, "draft_layers", b->mi.draft_layers);
}

static void decode_table(cJSON *dec) {
    printf("decode summary (one row, context 128):\n%-6s %9s %9s %8s %8s %8s\n", "type",
           "MB/token", "ms", "tok/s", "GB/s", "of bw");
    cJSON *d;
    cJSON_ArrayForEach(d, dec) {
        printf("%-6s %9.1f %9.2f %8.2f %8.2f %7.1f%%\n",
               cJSON_GetObjectItem(d, "type")->valuestring,
               cJSON_GetObjectItem(d, "weight_bytes")->valuedouble / 1e6,
               cJSON_GetObjectItem(d, "ms_per_token")->valuedouble,
               cJSON_GetObjectItem(d, "tok_s")->valuedouble,
               cJSON_GetObjectItem(d, "gbs")->valuedouble,
               100 * cJSON_GetObjectItem(d, "frac_of_bw")->valuedouble);
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
             first && o.eo.draft_path && (o.sections & SEC_SPEC));
        if (first) {
            model_json(&b);
            printf("model %s: %s, %d layers, dim %d, ffn %d, vocab %d; %.2f GFLOP per row\n\n",
                   b.mi.name, b.mi.arch, b.mi.n_layers, b.mi.dim, b.mi.ffn_dim, b.mi.vocab,
                   b.flops / 1e9);
            if (o.sections & (SEC_MACHINE | SEC_DECODE | SEC_VERIFY)) sec_machine(&b);
        }
        if (o.sections & SEC_DECODE) {
            printf("decode (one row, context 128):\n%-6s %9s %9s %8s %8s %8s\n", "type",
                   "MB/token", "ms", "tok/s", "GB/s", "of bw");
            sec_decode(&b, dec);
            printf("\n");
        }
        if (o.sections & SEC_VERIFY) sec_verify(&b, ver);
        if (first && (o.sections & SEC_SPEC)) sec_spec(&b);
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
