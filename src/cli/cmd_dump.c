/* cmd_dump.c - `dflash dump`: raw logits / features / drafter logits of given
 * ids, for reference tests against independent implementations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void help(void) {
    printf("usage: dflash dump --model PATH --ids 1,2,3 --out FILE [options]\n"
           "\n"
           "Runs the ids from position 0 and writes little-endian float32: logits of\n"
           "every row (n x vocab), then, with --capture, the hidden states (output of\n"
           "each listed decoder layer, before the final norm) as n x layers x dim.\n"
           "\n"
           "  --capture L1,L2,...   decoder layers to capture (0-based)\n"
           "  --decode K            rows 0..K-1 as one block, then rows K.. one at a time\n"
           "                        (the decode path); default: all rows as one block\n"
           "  --draft PATH          a DFlash drafter; with --out-draft, writes its logits\n"
           "  --draft-mtp           the model's own MTP head as the drafter: --out-draft gets\n"
           "                        the logits of its chain of B-1 drafts\n"
           "  --draft-block B       drafter block size (default: the drafter's)\n"
           "  --out-draft FILE      (B-1) x vocab float32: rows 1..B-1 of a block anchored\n"
           "                        on the last id, with rows 0..n-2 as context\n"
           "  --dtype T  --threads N  --kv-type f16|f32 (default f16)\n");
}

static int write_floats(const char *path, const float *a, size_t n, FILE *f) {
    if (fwrite(a, sizeof(float), n, f) != n) {
        fprintf(stderr, "dflash dump: write to %s failed\n", path);
        return 1;
    }
    return 0;
}

int cmd_dump(int argc, char **argv) {
    dfl_engine_opts eo;
    dfl_engine_opts_default(&eo);
    cli_engine_env(&eo);
    const char *out = NULL, *out_draft = NULL, *ids_s = NULL, *cap_s = NULL;
    int block = 0, decode = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return help(), 0;
        if (!strcmp(a, "--draft-mtp")) {   /* the one flag without a value */
            eo.draft_mtp = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "dflash dump: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) eo.model_path = v;
        else if (!strcmp(a, "--draft")) eo.draft_path = v;
        else if (!strcmp(a, "--dtype")) eo.dtype = v;
        else if (!strcmp(a, "--kv-type")) eo.kv_type = v;
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) eo.n_threads = cli_int(a, v, 1, 256);
        else if (!strcmp(a, "--ids")) ids_s = v;
        else if (!strcmp(a, "--capture")) cap_s = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--out-draft")) out_draft = v;
        else if (!strcmp(a, "--draft-block")) block = cli_int(a, v, 2, DFL_MAX_BLOCK);
        else if (!strcmp(a, "--decode")) decode = cli_int(a, v, 0, 4096);
        else {
            fprintf(stderr, "dflash dump: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!eo.model_path || !ids_s || !out) {
        fprintf(stderr, "dflash dump: --model, --ids and --out are required (see --help)\n");
        return 2;
    }
    if (eo.draft_path && eo.draft_mtp) {   /* --out-draft writes one drafter's logits */
        fprintf(stderr, "dflash dump: --draft and --draft-mtp: give one (whose logits "
                        "--out-draft writes)\n");
        return 2;
    }
    enum { MAXN = 4096 };
    static int32_t ids[MAXN], cap[DFL_MAX_CAPTURE_LAYERS];
    int n = cli_ids("--ids", ids_s, ids, MAXN);
    int n_cap = cap_s ? cli_ids("--capture", cap_s, cap, DFL_MAX_CAPTURE_LAYERS) : 0;
    eo.ctx_size = n + (block ? block : 16) + 1;
    if (block) eo.max_block = block;
    dfl_error err = {0};
    dfl_engine *e;
    if (dfl_engine_load(&eo, &e, &err)) {
        fprintf(stderr, "dflash dump: %s\n", err.msg);
        return 1;
    }
    dfl_model_info mi;
    dfl_engine_info(e, &mi);
    if (!block) block = mi.draft_block;
    dfl_session *s;
    int rc = dfl_session_new(e, &s, &err);
    float *logits = cli_alloc((size_t)n * mi.vocab, sizeof(float));
    float *feat = cli_alloc((size_t)n * (n_cap ? n_cap : 1) * mi.dim, sizeof(float));
    int k = decode >= 0 && decode < n ? decode : n;
    if (!rc) rc = dfl_debug_forward(s, ids, k, (const int *)cap, n_cap, logits, feat, &err);
    if (!rc && k < n)
        rc = dfl_debug_step(s, ids + k, n - k, (const int *)cap, n_cap,
                            logits + (size_t)k * mi.vocab, feat + (size_t)k * n_cap * mi.dim, &err);
    FILE *f = rc ? NULL : fopen(out, "wb");
    if (!rc && !f) {
        snprintf(err.msg, sizeof err.msg, "cannot write %s", out);
        rc = 1;
    }
    if (f) {
        rc = write_floats(out, logits, (size_t)n * mi.vocab, f);
        if (!rc && n_cap) rc = write_floats(out, feat, (size_t)n * n_cap * mi.dim, f);
        fclose(f);
    }
    if (!rc && out_draft) {
        float *dl = cli_alloc((size_t)block * mi.vocab, sizeof(float));
        rc = dfl_debug_draft(s, ids, n, block, dl, &err);
        FILE *g = rc ? NULL : fopen(out_draft, "wb");
        if (g) {
            rc = write_floats(out_draft, dl, (size_t)(block - 1) * mi.vocab, g);
            fclose(g);
        }
        free(dl);
    }
    if (rc && err.msg[0]) fprintf(stderr, "dflash dump: %s\n", err.msg);
    free(logits);
    free(feat);
    dfl_session_free(s);
    dfl_engine_free(e);
    return rc ? 1 : 0;
}
