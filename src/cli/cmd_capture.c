/* cmd_capture.c - `dflash capture`: what drafter training reads (tools/
 * train_dflash.py, docs/training.md). Runs the target over a text corpus, or
 * over its own continuations of prompts cut from the corpus
 * (self-distillation), and writes token ids, the hidden features of chosen
 * target layers (the same forward verification runs, so the drafter trains
 * on what it will see) and the target's embedding and lm_head. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static void help(void) {
    printf(
        "usage: dflash capture --model PATH --corpus FILE --out DIR [options]\n"
        "\n"
        "Splits the corpus into documents and writes, for drafter training\n"
        "(tools/train_dflash.py; the format is in docs/training.md):\n"
        "  capture.json   what was run and the layout of the files below\n"
        "  tokens.i32     every row's token id (int32)\n"
        "  seqs.i32       per sequence: first row, rows, prompt rows (int32 triples)\n"
        "  features.f32   (rows, layers x dim): output of each captured layer\n"
        "  embed.f32      the target's token embedding (vocab, dim)\n"
        "  lm_head.f32    its lm_head (vocab, dim); absent when tied to the embedding\n"
        "\n"
        "  -m, --model PATH        target: Hugging Face folder or .gguf\n"
        "  --dtype T               convert the weights at load (as generate's --dtype)\n"
        "  --corpus FILE           UTF-8 text (repeat for several files)\n"
        "  --out DIR               output folder (created)\n"
        "  --layers auto|all|i,j   target layers to capture, 0-based (default auto: z-lab's\n"
        "                          rule for --draft-layers drafter layers)\n"
        "  --draft-layers L        drafter depth the auto rule assumes (default 2)\n"
        "  --sep STR               document separator (default <|endoftext|>; \\n and \\t\n"
        "                          are understood, e.g. '\\n%%\\n' for fortune files)\n"
        "  --first-doc N           skip the first N documents (hold them out)\n"
        "  --max-docs N            use at most N documents (default all)\n"
        "  --seq-len N             text mode: rows per sequence; a longer document is cut\n"
        "                          into pieces, each run from position 0 (default: the\n"
        "                          context size)\n"
        "  --generate N            self-distillation: prompt the target with each\n"
        "                          document's first --prompt-tokens ids and capture the\n"
        "                          prompt plus up to N tokens the target generates\n"
        "  --prompt-tokens A[:B]   prompt rows (BOS included), uniform in A..B (default 4:24)\n"
        "  --chat                  with --generate: each document is a user message, rendered\n"
        "                          with the model's chat template; the whole rendered prompt\n"
        "                          is the prompt and the target's answer is captured\n"
        "  --temp T  --seed S      sampling for --generate (default 0: greedy)\n"
        "  --max-rows N            stop after N rows in all\n"
        "  -c, --ctx-size N        KV cache rows (default: min(model context, 4096))\n"
        "  --kv-type f16|f32       K/V cache elements (default f16)\n"
        "  -t, --threads N         threads (default: all cores)\n"
        "  -np, --parallel N       documents generated at once (default 1): their decode rows\n"
        "                          share one forward, so a few make --generate several times\n"
        "                          faster; the output is the same for any N\n"
        "  -q, --quiet             no progress lines\n");
}

typedef struct opts {
    dfl_engine_opts eo;
    const char *corpus[64];
    int n_corpus;
    const char *out, *layers, *sep;
    int draft_layers, first_doc, max_docs, seq_len, generate, p_lo, p_hi, quiet, chat, parallel;
    long max_rows;
    float temp;
    uint64_t seed;
} opts;

static void parse_prompt_tokens(opts *o, const char *v) {
    const char *colon = strchr(v, ':');
    if (!colon) {
        o->p_lo = o->p_hi = cli_int("--prompt-tokens", v, 1, 1 << 20);
        return;
    }
    char lo[32];
    snprintf(lo, sizeof lo, "%.*s", (int)(colon - v) < 31 ? (int)(colon - v) : 31, v);
    o->p_lo = cli_int("--prompt-tokens", lo, 1, 1 << 20);
    o->p_hi = cli_int("--prompt-tokens", colon + 1, o->p_lo, 1 << 20);
}

static void parse(opts *o, int argc, char **argv) {
    dfl_engine_opts_default(&o->eo);
    cli_engine_env(&o->eo);
    o->layers = "auto";
    o->sep = "<|endoftext|>";
    o->draft_layers = 2;
    o->max_docs = -1;
    o->p_lo = 4, o->p_hi = 24;
    o->parallel = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) help(), exit(0);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o->eo.model_path = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--corpus")) {
            if (o->n_corpus == 64) {
                fprintf(stderr, "dflash capture: at most 64 --corpus files\n");
                exit(2);
            }
            o->corpus[o->n_corpus++] = cli_need(argc, argv, &i);
        } else if (!strcmp(a, "--out")) o->out = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--layers")) o->layers = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--draft-layers"))
            o->draft_layers = cli_int(a, cli_need(argc, argv, &i), 1, DFL_MAX_CAPTURE_LAYERS);
        else if (!strcmp(a, "--sep")) o->sep = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--first-doc"))
            o->first_doc = cli_int(a, cli_need(argc, argv, &i), 0, 1 << 30);
        else if (!strcmp(a, "--max-docs"))
            o->max_docs = cli_int(a, cli_need(argc, argv, &i), 0, 1 << 30);
        else if (!strcmp(a, "--seq-len"))
            o->seq_len = cli_int(a, cli_need(argc, argv, &i), 2, 1 << 24);
        else if (!strcmp(a, "--generate"))
            o->generate = cli_int(a, cli_need(argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "--prompt-tokens")) parse_prompt_tokens(o, cli_need(argc, argv, &i));
        else if (!strcmp(a, "--temp"))
            o->temp = (float)cli_num(a, cli_need(argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--seed")) o->seed = cli_u64(a, cli_need(argc, argv, &i));
        else if (!strcmp(a, "--max-rows"))
            o->max_rows = cli_int(a, cli_need(argc, argv, &i), 1, 2000000000);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            o->eo.ctx_size = cli_int(a, cli_need(argc, argv, &i), 2, 1 << 24);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            o->eo.n_threads = cli_int(a, cli_need(argc, argv, &i), 1, 256);
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel"))
            o->parallel = cli_int(a, cli_need(argc, argv, &i), 1, 64);
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--dtype")) o->eo.dtype = cli_need(argc, argv, &i);
        else if (!strcmp(a, "--kv-type")) o->eo.kv_type = cli_need(argc, argv, &i);
        else {
            fprintf(stderr, "dflash capture: unknown option '%s' (see --help)\n", a);
            exit(2);
        }
    }
    if (!o->eo.model_path || !o->n_corpus || !o->out) {
        fprintf(stderr, "dflash capture: --model, --corpus and --out are required (see --help)\n");
        exit(2);
    }
}

/* ---- the corpus ---------------------------------------------------------- */

/* "\n" and "\t" in a separator given on the command line. */
static char *unescape(const char *s) {
    char *out = cli_alloc(strlen(s) + 1, 1), *w = out;
    for (; *s; s++) {
        if (s[0] == '\\' && (s[1] == 'n' || s[1] == 't' || s[1] == '\\'))
            *w++ = s[1] == 'n' ? '\n' : s[1] == 't' ? '\t' : '\\', s++;
        else
            *w++ = *s;
    }
    *w = 0;
    return out;
}

typedef struct doc {
    const char *p;
    size_t n;
} doc;

/* Splits text at sep into documents with surrounding whitespace trimmed;
 * empty ones are dropped. Appends to *docs. */
static void split_docs(const char *text, size_t len, const char *sep, doc **docs, int *n, size_t *cap) {
    size_t ls = strlen(sep);
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *q = ls ? strstr(p, sep) : NULL;
        if (!q) q = end;
        const char *a = p, *b = q;
        while (a < b && (*a == ' ' || *a == '\n' || *a == '\r' || *a == '\t')) a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\n' || b[-1] == '\r' || b[-1] == '\t')) b--;
        if (b > a) {
            *docs = cli_grow(*docs, cap, (size_t)*n + 1, sizeof(doc));
            (*docs)[(*n)++] = (doc){a, (size_t)(b - a)};
        }
        p = q + (q < end ? ls : 0);
    }
}

/* ---- output files ---------------------------------------------------------- */

typedef struct writer {
    const char *dir;
    FILE *tokens, *seqs, *feat;
    long rows, seqs_n;
} writer;

static FILE *open_out(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "dflash capture: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    return f;
}

static void put(FILE *f, const void *p, size_t size, size_t n, const char *what) {
    if (fwrite(p, size, n, f) != n) {
        fprintf(stderr, "dflash capture: writing %s failed (disk full?)\n", what);
        exit(1);
    }
}

static void write_seq(writer *w, const int32_t *ids, int n, int n_prompt, const float *feat,
                      size_t row_floats) {
    int32_t triple[3] = {(int32_t)w->rows, n, n_prompt};
    put(w->tokens, ids, sizeof(int32_t), (size_t)n, "tokens.i32");
    put(w->seqs, triple, sizeof(int32_t), 3, "seqs.i32");
    put(w->feat, feat, sizeof(float), (size_t)n * row_floats, "features.f32");
    w->rows += n;
    w->seqs_n++;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void write_meta(const opts *o, const writer *w, const dfl_model_info *mi, const int *layers,
                       int n_layers, int bos, int tied, int n_docs, const char *sep) {
    FILE *f = open_out(o->out, "capture.json");
    fprintf(f, "{\n  \"format\": \"dflash-capture\",\n  \"version\": 1,\n  \"model\": ");
    json_str(f, o->eo.model_path);
    fprintf(f, ",\n  \"arch\": \"%s\", \"n_layers\": %d, \"dim\": %d, \"vocab\": %d, "
               "\"max_ctx\": %d, \"bos_id\": %d,\n", mi->arch, mi->n_layers, mi->dim, mi->vocab,
            mi->max_ctx, bos);
    fprintf(f, "  \"layers\": [");
    for (int j = 0; j < n_layers; j++) fprintf(f, "%s%d", j ? ", " : "", layers[j]);
    fprintf(f, "],\n  \"corpus\": [");
    for (int i = 0; i < o->n_corpus; i++) {
        fputs(i ? ", " : "", f);
        json_str(f, o->corpus[i]);
    }
    fprintf(f, "],\n  \"sep\": ");
    json_str(f, sep);
    fprintf(f, ",\n  \"first_doc\": %d, \"n_docs\": %d,\n", o->first_doc, n_docs);
    if (o->generate)
        fprintf(f, "  \"mode\": \"generate\", \"generate\": %d, \"prompt_tokens\": [%d, %d], "
                   "\"temperature\": %g, \"seed\": %llu,\n", o->generate, o->p_lo, o->p_hi,
                o->temp, (unsigned long long)o->seed);
    else
        fprintf(f, "  \"mode\": \"text\", \"seq_len\": %d,\n", o->seq_len);
    fprintf(f, "  \"n_seqs\": %ld, \"n_rows\": %ld,\n", w->seqs_n, w->rows);
    fprintf(f, "  \"files\": {\"tokens\": \"tokens.i32\", \"seqs\": \"seqs.i32\", "
               "\"features\": \"features.f32\", \"embed\": \"embed.f32\", \"lm_head\": %s},\n",
            tied ? "null" : "\"lm_head.f32\"");
    fprintf(f, "  \"layout\": {\"tokens\": \"int32 (n_rows)\", \"seqs\": \"int32 (n_seqs, 3): "
               "first row, rows, prompt rows\", \"features\": \"float32 (n_rows, layers, dim): "
               "output of decoder layer layers[j], before the final norm\", \"embed\": "
               "\"float32 (vocab, dim)\", \"lm_head\": \"float32 (vocab, dim)\", "
               "\"byte_order\": \"little\"}\n}\n");
    fclose(f);
}

/* Writes embed.f32 and, unless equal to it, lm_head.f32; returns 1 when tied. */
static int write_tables(dfl_engine *e, const dfl_model_info *mi, const char *dir) {
    size_t n = (size_t)mi->vocab * mi->dim;
    float *E = cli_alloc(n * sizeof(float), 1), *H = cli_alloc(n * sizeof(float), 1);
    dfl_error err = {0};
    if (!E || !H || dfl_export_embeddings(e, E, H, &err)) {
        fprintf(stderr, "dflash capture: %s\n", E && H ? err.msg : "out of memory");
        exit(1);
    }
    int tied = !memcmp(E, H, n * sizeof(float));
    FILE *f = open_out(dir, "embed.f32");
    put(f, E, sizeof(float), n, "embed.f32");
    fclose(f);
    if (!tied) {
        f = open_out(dir, "lm_head.f32");
        put(f, H, sizeof(float), n, "lm_head.f32");
        fclose(f);
    }
    free(E);
    free(H);
    return tied;
}

/* ---- running the target -------------------------------------------------- */


static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int parse_layers(const opts *o, dfl_engine *e, const dfl_model_info *mi, int *layers) {
    int n;
    if (!strcmp(o->layers, "auto")) {
        n = dfl_capture_default_layers(e, o->draft_layers, layers);
    } else if (!strcmp(o->layers, "all")) {
        n = mi->n_layers < DFL_MAX_CAPTURE_LAYERS ? mi->n_layers : DFL_MAX_CAPTURE_LAYERS;
        for (int j = 0; j < n; j++) layers[j] = j;
    } else {
        static int32_t ids[DFL_MAX_CAPTURE_LAYERS];
        n = cli_ids("--layers", o->layers, ids, DFL_MAX_CAPTURE_LAYERS);
        for (int j = 0; j < n; j++) layers[j] = ids[j];
    }
    for (int j = 0; j < n; j++)
        if (layers[j] < 0 || layers[j] >= mi->n_layers) {
            fprintf(stderr, "dflash capture: --layers: layer %d outside 0..%d\n", layers[j],
                    mi->n_layers - 1);
            exit(2);
        }
    if (n < 1) {
        fprintf(stderr, "dflash capture: --layers gave no layers\n");
        exit(2);
    }
    return n;
}

/* What the workers share. Sequences go out in document order whatever order
 * the workers finish in, so the files do not depend on --parallel. */
typedef struct shared {
    const opts *o;
    dfl_engine *e;
    writer *w;
    const doc *docs;
    const int *layers;
    int n_layers, ctx, d0, d1, bos;
    size_t row_floats;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int turn;             /* the document whose sequences may be written now */
    int done;             /* documents finished */
    int stop;             /* --max-rows reached: later documents are skipped */
} shared;

/* One worker: its own session and buffers, documents d0 + k, d0 + k + N, ... */
typedef struct job {
    shared *sh;
    dfl_session *s;
    float *feat;          /* (ctx, row_floats) */
    int32_t *seq;         /* (ctx) */
    int doc;              /* the document being processed */
    int holds_turn;
    pthread_t th;
} job;

static void take_turn(job *j) {
    shared *sh = j->sh;
    if (j->holds_turn) return;
    pthread_mutex_lock(&sh->mu);
    while (sh->turn != j->doc) pthread_cond_wait(&sh->cv, &sh->mu);
    pthread_mutex_unlock(&sh->mu);
    j->holds_turn = 1;
}

/* Ends the document's turn; a document skipped after --max-rows is not counted. */
static void pass_turn(job *j, int counted) {
    shared *sh = j->sh;
    take_turn(j);
    pthread_mutex_lock(&sh->mu);
    sh->turn++;
    sh->done += counted && !sh->stop;
    if (sh->o->max_rows && sh->w->rows >= sh->o->max_rows) sh->stop = 1;
    if (!sh->o->quiet && sh->done % 100 == 0)
        fprintf(stderr, "capture: %d/%d documents, %ld rows\n", sh->done, sh->d1 - sh->d0,
                sh->w->rows);
    pthread_cond_broadcast(&sh->cv);
    pthread_mutex_unlock(&sh->mu);
    j->holds_turn = 0;
}

static void capture(job *j, const int32_t *ids, int n, int n_prompt) {
    dfl_error err = {0};
    if (dfl_capture_rows(j->s, ids, n, j->sh->layers, j->sh->n_layers, j->feat, &err)) {
        fprintf(stderr, "dflash capture: %s\n", err.msg);
        exit(1);
    }
    take_turn(j);   /* only the turn's holder changes stop */
    if (!j->sh->stop) write_seq(j->sh->w, ids, n, n_prompt, j->feat, j->sh->row_floats);
}

/* Text mode: the document in pieces of at most seq_len rows, each from
 * position 0 and starting with BOS when the tokenizer adds one. */
static void run_text(job *j, const int32_t *ids, int n) {
    int bos = j->sh->bos;
    int lead = bos >= 0 && n > 0 && ids[0] == bos, body = j->sh->o->seq_len - lead;
    for (int a = lead; a < n; a += body) {
        int m = n - a < body ? n - a : body, k = 0;
        if (lead) j->seq[k++] = bos;
        memcpy(j->seq + k, ids + a, sizeof(int32_t) * (size_t)m);
        if (k + m >= 2) capture(j, j->seq, k + m, 1);
    }
}

/* Generate mode: a prompt of the document's first P ids (P drawn from the
 * document's own stream, so it does not depend on --parallel), then the
 * target's own continuation (greedy, or sampled with --temp). */
static void run_generate(job *j, const int32_t *ids, int n) {
    const opts *o = j->sh->o;
    int ctx = j->sh->ctx;
    uint64_t rng = o->seed ^ 0x6361707475726500ull ^ ((uint64_t)j->doc * 0x9E3779B97F4A7C15ull);
    int P = o->p_lo + (int)(splitmix(&rng) % (uint64_t)(o->p_hi - o->p_lo + 1));
    if (P > n || o->chat) P = n;
    if (P > ctx - 1) P = ctx - 1;
    dfl_gen_params gp;
    dfl_gen_params_default(&gp);
    gp.temperature = o->temp;
    gp.seed = o->seed + (uint64_t)j->doc;
    gp.block_size = 1;
    gp.max_tokens = o->generate < ctx - P ? o->generate : ctx - P;
    memcpy(j->seq, ids, sizeof(int32_t) * (size_t)P);
    cli_idbuf c = {j->seq + P, 0, gp.max_tokens, 1};
    dfl_error err = {0};
    if (dfl_generate(j->s, ids, P, &gp, cli_on_id, &c, NULL, &err)) {
        fprintf(stderr, "dflash capture: document %d: %s\n", j->doc, err.msg);
        exit(1);
    }
    if (P + c.n >= 2) capture(j, j->seq, P + c.n, P);
}

/* --chat: the document as one user message in the model's template, with the
 * generation prompt (the template adds BOS where the model wants one). */
static char *chat_prompt(const dfl_engine *e, const char *text, size_t len, size_t *out_len) {
    char *msg = strndup(text, len);
    dfl_chat_msg m = {"user", msg};
    dfl_error err = {0};
    int need = msg ? dfl_chat_render(e, NULL, &m, 1, 1, 0, NULL, 0, &err) : -1;
    char *out = need >= 0 ? cli_alloc((size_t)need + 1, 1) : NULL;
    if (out) dfl_chat_render(e, NULL, &m, 1, 1, 0, out, (size_t)need + 1, &err);
    free(msg);
    if (!out) fprintf(stderr, "dflash capture: chat template: %s\n", need < 0 ? err.msg : "out of memory");
    *out_len = out ? (size_t)need : 0;
    return out;
}

/* Tokenizes one document (rendered as a chat when --chat); NULL on error. */
static int32_t *doc_ids(const shared *sh, int d, int *n_out) {
    const char *text = sh->docs[d].p;
    size_t len = sh->docs[d].n;
    int chat = sh->o->chat;
    dfl_error err = {0};
    if (chat && !(text = chat_prompt(sh->e, text, len, &len))) return NULL;
    int n = dfl_tokenize(sh->e, text, len, !chat, chat, NULL, 0, &err);
    int32_t *ids = n >= 0 ? cli_alloc(sizeof(int32_t) * (size_t)(n + 1), 1) : NULL;
    if (ids) dfl_tokenize(sh->e, text, len, !chat, chat, ids, n, &err);
    else fprintf(stderr, "dflash capture: document %d: %s\n", d, n < 0 ? err.msg : "out of memory");
    if (chat) free((char *)text);
    *n_out = n;
    return ids;
}

static void *worker(void *arg) {
    job *j = arg;
    shared *sh = j->sh;
    for (; j->doc < sh->d1; j->doc += sh->o->parallel) {
        pthread_mutex_lock(&sh->mu);
        int stop = sh->stop;
        pthread_mutex_unlock(&sh->mu);
        if (!stop) {
            int n;
            int32_t *ids = doc_ids(sh, j->doc, &n);
            if (!ids) exit(1);
            if (sh->o->generate) run_generate(j, ids, n);
            else run_text(j, ids, n);
            free(ids);
        }
        pass_turn(j, !stop);
    }
    return NULL;
}

int cmd_capture(int argc, char **argv) {
    opts o = {0};
    parse(&o, argc, argv);
    char *sep = unescape(o.sep);
    doc *docs = NULL;
    int n_docs = 0;
    size_t cap_docs = 0;
    char *texts[64];
    for (int i = 0; i < o.n_corpus; i++) {
        size_t len;
        texts[i] = cli_read_file("capture", "--corpus", o.corpus[i], &len);
        split_docs(texts[i], len, sep, &docs, &n_docs, &cap_docs);
    }
    int d0 = o.first_doc < n_docs ? o.first_doc : n_docs;
    int d1 = o.max_docs >= 0 && d0 + o.max_docs < n_docs ? d0 + o.max_docs : n_docs;
    if (d1 <= d0) {
        fprintf(stderr, "dflash capture: no documents left (the corpus has %d; --first-doc %d)\n",
                n_docs, o.first_doc);
        return 1;
    }
    dfl_error err = {0};
    dfl_engine *e;
    o.eo.n_parallel = o.parallel;
    if (dfl_engine_load(&o.eo, &e, &err)) {
        fprintf(stderr, "dflash capture: %s\n", err.msg);
        return 1;
    }
    dfl_model_info mi;
    dfl_engine_info(e, &mi);
    int layers[DFL_MAX_CAPTURE_LAYERS];
    int n_layers = parse_layers(&o, e, &mi, layers);
    if (!o.seq_len || o.seq_len > mi.ctx_size) o.seq_len = mi.ctx_size;
    if (o.seq_len < 2) {
        fprintf(stderr, "dflash capture: a context of %d rows is too small to capture from\n",
                o.seq_len);
        return 1;
    }
    if (mkdir(o.out, 0755) && errno != EEXIST) {
        fprintf(stderr, "dflash capture: cannot create %s: %s\n", o.out, strerror(errno));
        return 1;
    }
    writer w = {o.out, open_out(o.out, "tokens.i32"), open_out(o.out, "seqs.i32"),
                open_out(o.out, "features.f32"), 0, 0};
    int tied = write_tables(e, &mi, o.out);
    shared sh = {&o, e, &w, docs, layers, n_layers, mi.ctx_size, d0, d1, dfl_token_bos(e),
                 (size_t)n_layers * mi.dim, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                 d0, 0, 0};
    int np = o.parallel < d1 - d0 ? o.parallel : d1 - d0;
    job *jobs = cli_alloc((size_t)np, sizeof(job));
    for (int k = 0; jobs && k < np; k++) {
        job *j = &jobs[k];
        *j = (job){&sh, NULL, cli_alloc(sizeof(float) * (size_t)sh.ctx * sh.row_floats, 1),
                   cli_alloc(sizeof(int32_t) * (size_t)sh.ctx, 1), d0 + k, 0, 0};
        if (!j->feat || !j->seq || dfl_session_new(e, &j->s, &err)) {
            fprintf(stderr, "dflash capture: %s\n", j->feat && j->seq ? err.msg : "out of memory");
            return 1;
        }
    }
    if (!jobs) {
        fprintf(stderr, "dflash capture: out of memory\n");
        return 1;
    }
    for (int k = 0; k < np; k++)
        if (pthread_create(&jobs[k].th, NULL, worker, &jobs[k])) {
            fprintf(stderr, "dflash capture: cannot start a worker thread\n");
            return 1;
        }
    for (int k = 0; k < np; k++) pthread_join(jobs[k].th, NULL);
    int done = sh.done;
    fclose(w.tokens);
    fclose(w.seqs);
    fclose(w.feat);
    write_meta(&o, &w, &mi, layers, n_layers, sh.bos, tied, done, sep);
    if (!o.quiet)
        fprintf(stderr, "capture: %d documents, %ld sequences, %ld rows, layers %s -> %s\n", done,
                w.seqs_n, w.rows, o.layers, o.out);
    for (int k = 0; k < np; k++) {
        free(jobs[k].feat);
        free(jobs[k].seq);
        dfl_session_free(jobs[k].s);
    }
    free(jobs);
    free(docs);
    for (int i = 0; i < o.n_corpus; i++) free(texts[i]);
    free(sep);
    dfl_engine_free(e);
    return 0;
}
