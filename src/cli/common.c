/* common.c - what every subcommand shares: flag parsing, progress display,
 * the built-in default model's location. */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

void cli_progress(void *ud, const char *what, uint64_t done, uint64_t total) {
    (void)ud;
    if (!total) return;
    if (isatty(2)) {
        int w = 30, fill = (int)(w * done / total);
        fprintf(stderr, "\r%-8s [", what);
        for (int i = 0; i < w; i++) fputc(i < fill ? '#' : '.', stderr);
        fprintf(stderr, "] %3d%%", (int)(100 * done / total));
        if (done >= total) fputc('\n', stderr);
    } else if (done == total || done * 4 / total != (done - 1) * 4 / total) {
        fprintf(stderr, "%s: %llu/%llu\n", what, (unsigned long long)done,
                (unsigned long long)total);
    }
}

/* models/default next to the build folder of this binary, or installed share. */
static const char *default_path(const char *file) {
    static char buf[2][PATH_MAX];
    static int slot;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *dir = dirname(exe);
    const char *rel[] = {"../models/default", "../share/dflash/models/default", "models/default"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char *p = buf[slot % 2];
        snprintf(p, PATH_MAX, "%s/%s/%s", dir, rel[i], file);
        if (access(p, R_OK) == 0) {
            slot++;
            return p;
        }
    }
    return NULL;
}

const char *cli_default_model(void) { return default_path("target"); }
const char *cli_default_draft(void) { return default_path("draft"); }

static void out_of_memory(size_t n, size_t sz) {
    fprintf(stderr, "dflash: out of memory (%zu elements of %zu bytes)\n", n, sz);
    exit(1);
}

void *cli_alloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) out_of_memory(n, sz);
    return p;
}

void *cli_grow(void *p, size_t *cap, size_t need, size_t sz) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need && c <= SIZE_MAX / 2 / (sz ? sz : 1)) c *= 2;
    void *q = c >= need ? realloc(p, c * (sz ? sz : 1)) : NULL;
    if (!q) out_of_memory(need, sz);
    *cap = c;
    return q;
}

char *cli_read_file(const char *cmd, const char *what, const char *path, size_t *len) {
    const char *sp = cmd ? " " : "";
    if (!cmd) cmd = "";
    int in = !strcmp(path, "-");
    FILE *f = in ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dflash%s%s: cannot open %s %s: %s\n", sp, cmd, what, path, strerror(errno));
        exit(1);
    }
    size_t cap = 0, n = 0;
    char *buf = cli_grow(NULL, &cap, 1 << 16, 1);
    for (size_t r; (r = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n > CLI_MAX_FILE) {
            fprintf(stderr, "dflash%s%s: %s %s is larger than %d MiB\n", sp, cmd, what, path,
                    CLI_MAX_FILE >> 20);
            exit(1);
        }
        buf = cli_grow(buf, &cap, n + 2, 1);
    }
    int bad = ferror(f);
    if (!in) fclose(f);
    if (bad) {
        fprintf(stderr, "dflash%s%s: cannot read %s %s\n", sp, cmd, what, path);
        exit(1);
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

int cli_on_id(void *ud, const dfl_token_info *t) {
    cli_idbuf *b = ud;
    if (b->n < b->cap) b->ids[b->n++] = t->id;
    return b->stop && b->n >= b->cap;
}

const char *cli_need(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "dflash %s: %s needs a value (see --help)\n", argv[0], argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

int cli_int(const char *flag, const char *v, long lo, long hi) {
    if (!v) {
        fprintf(stderr, "dflash: %s needs a value\n", flag);
        exit(2);
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "dflash: %s %s: expected an integer in %ld..%ld\n", flag, v, lo, hi);
        exit(2);
    }
    return (int)x;
}

uint64_t cli_u64(const char *flag, const char *v) {
    if (!v) {
        fprintf(stderr, "dflash: %s needs a value\n", flag);
        exit(2);
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || *end || end == v || *v == '-') {
        fprintf(stderr, "dflash: %s %s: expected an integer in 0..%llu\n", flag, v,
                (unsigned long long)UINT64_MAX);
        exit(2);
    }
    return (uint64_t)x;
}

double cli_num(const char *flag, const char *v, double lo, double hi) {
    if (!v) {
        fprintf(stderr, "dflash: %s needs a value\n", flag);
        exit(2);
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || *end || end == v || !(x >= lo && x <= hi)) {
        fprintf(stderr, "dflash: %s %s: expected a number in %g..%g\n", flag, v, lo, hi);
        exit(2);
    }
    return x;
}

int cli_ids(const char *flag, const char *v, int32_t *ids, int cap) {
    int n = 0;
    if (!v) {
        fprintf(stderr, "dflash: %s needs a value\n", flag);
        exit(2);
    }
    const char *p = v;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "dflash: %s: expected comma-separated token ids, got '%s'\n", flag, v);
            exit(2);
        }
        if (n == cap) {
            fprintf(stderr, "dflash: %s: more than %d ids\n", flag, cap);
            exit(2);
        }
        ids[n++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    return n;
}

void cli_engine_env(dfl_engine_opts *o) {
    const char *a = getenv("DFLASH_ALLOW_INEXACT"), *w = getenv("DFLASH_DRAFT_WINDOW");
    o->allow_inexact = a && !strcmp(a, "1");
    o->draft_window = w && atoi(w) > 0 ? atoi(w) : 0;
    o->isa = getenv("DFLASH_ISA");
}

int cli_engine_flag(dfl_engine_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_path = cli_need(argc, argv, i);
    else if (!strcmp(a, "--draft")) o->draft_path = cli_need(argc, argv, i);
    else if (!strcmp(a, "--draft-mtp")) o->draft_mtp = 1;
    else if (!strcmp(a, "--ngram")) o->ngram = 1;
    else if (!strcmp(a, "--no-mmap")) o->no_mmap = 1;
    else if (!strcmp(a, "--dtype")) o->dtype = cli_need(argc, argv, i);
    else if (!strcmp(a, "--draft-dtype")) o->draft_dtype = cli_need(argc, argv, i);
    else if (!strcmp(a, "--kv-type")) o->kv_type = cli_need(argc, argv, i);
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
        o->ctx_size = cli_int(a, cli_need(argc, argv, i), 1, 1 << 24);
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
        o->n_threads = cli_int(a, cli_need(argc, argv, i), 1, 256);
    else return 0;
    return 1;
}

void cli_engine_model(const char *cmd, dfl_engine_opts *o, int *no_draft) {
    if (o->draft_path && !strcmp(o->draft_path, "none")) o->draft_path = NULL, *no_draft = 1;
    if (o->model_path) return;
    o->model_path = cli_default_model();
    if (!o->model_path) {
        fprintf(stderr, "dflash %s: no --model given and the built-in model (models/default) "
                        "was not found next to the binary\n", cmd);
        exit(2);
    }
    if (!o->draft_path && !*no_draft && !o->draft_mtp) o->draft_path = cli_default_draft();
}

/* One paragraph on stderr after a load: what runs, and how. */
void cli_load_summary(const char *cmd, const dfl_engine *e, const char *template_src) {
    dfl_model_info mi;
    dfl_engine_info(e, &mi);
    int fallback = 0;
    dfl_chat_template(e, &fallback);
    fprintf(stderr,
            "%s: %s: %s, %.1f M parameters (%d layers, dim %d, %d/%d heads), %s weights "
            "(%.1f MB read per token), context %d of %d, K/V %s (%.1f MB per session), "
            "%d threads, %s kernels; chat template: %s; ",
            cmd, mi.name, mi.arch, (double)mi.n_params / 1e6, mi.n_layers, mi.dim, mi.n_heads,
            mi.n_kv_heads, mi.dtype, (double)mi.weight_bytes / 1e6, mi.ctx_size, mi.max_ctx,
            mi.kv_type, (double)mi.state_bytes / 1e6, mi.n_threads, mi.simd,
            template_src ? template_src : fallback ? "ChatML (the model has none)" : "the model's");
    if (mi.rec_state_bytes)
        fprintf(stderr, "recurrent state %.2f MB per session (%d rollback snapshots); ",
                (double)mi.rec_state_bytes / 1e6, mi.rec_snapshots);
    char head[96] = "";
    if (mi.draft_head_bytes)
        snprintf(head, sizeof head, ", drafts read a %s copy of the lm_head (%.1f MB)",
                 mi.draft_dtype, (double)mi.draft_head_bytes / 1e6);
    if (mi.draft_mtp)
        fprintf(stderr, "MTP head of the target (mtp.*) drafts, one token a step\n");
    else if (mi.has_draft)
        fprintf(stderr, "%s drafter of %d layers%s%s%s, block %d%s%s\n", mi.draft_kind,
                mi.draft_layers, mi.draft_dtype[0] ? " (" : "", mi.draft_dtype,
                mi.draft_dtype[0] ? " weights)" : "", mi.draft_block, head,
                mi.mtp_lane ? ", and the MTP head of the target as a lane" : "");
    else
        fprintf(stderr, "no drafter\n");
}
