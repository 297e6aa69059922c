/* test_tokenizer.c - the tokenizer against ids nobody on this project made.
 *
 * References: Hugging Face's Rust tokenizers (qwen3/llama3 basic_20 vectors:
 * ids with and without special tokens, decoded text), llama.cpp's vocab tests
 * (qwen2 and llama-bpe through the tokenizer.json files and through GGUF
 * vocabularies converted from them, llama-spm through llama.cpp's own GGUF
 * file, and through a tokenizer.json built from it the way transformers'
 * LlamaConverter does), llama2.c's stories260K ids. Then streaming decode of
 * split characters, malformed files, and the static tables against utf8proc. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "api/engine.h"
#include "testutil.h"
#include "tokenizer/tok_impl.h"

/* ---- helpers ------------------------------------------------------------- */

static dfl_tokenizer *load_dir(const char *rel) {
    const char *dir = test_asset(rel);
    if (!dir) return NULL;
    dfl_tokenizer *t = NULL;
    dfl_error e = {0};
    double t0 = dfl_now();
    int rc = dfl_tok_load_hf(dir, &t, &e);
    CHECK(rc == 0, "load %s: %s", dir, e.msg);
    if (!rc) printf("loaded %s in %.0f ms (%d ids)\n", rel, (dfl_now() - t0) * 1e3, t->n_vocab);
    return rc ? NULL : t;
}

/* Encodes into a malloc'd array; returns the count (< 0 on error). */
static int encode(const dfl_tokenizer *t, const char *s, size_t n, int add, int parse,
                  int32_t **ids) {
    dfl_error e = {0};
    int need = dfl_tok_encode(t, s, n, add, parse, NULL, 0, &e);
    *ids = NULL;
    if (need < 0) return need;
    *ids = malloc(((size_t)need + 1) * sizeof **ids);
    int got = dfl_tok_encode(t, s, n, add, parse, *ids, need, &e);
    CHECK(got == need, "encode twice: %d vs %d", got, need);
    return got;
}

static int same_ids(const char *what, const int32_t *got, int n, const int32_t *exp, int m) {
    int i = 0;
    while (i < n && i < m && got[i] == exp[i]) i++;
    if (n == m && i == n) return 1;
    fprintf(stderr, "  %s: %d ids, expected %d; first difference at %d: got %d, expected %d\n",
            what, n, m, i, i < n ? got[i] : -1, i < m ? exp[i] : -1);
    return 0;
}

static int valid_utf8(const char *s, size_t n) { return tok_utf8_check(s, n) == n; }

/* Decodes ids token by token through the streaming detokenizer; every chunk
 * it hands out must be complete UTF-8. Returns a malloc'd string. */
static char *decode(const dfl_tokenizer *t, const int32_t *ids, int n, int show_special,
                    int *broken) {
    struct dfl_engine eng;
    memset(&eng, 0, sizeof eng);
    eng.tok = (dfl_tokenizer *)t;
    dfl_detok d;
    dfl_detok_init(&d, &eng, show_special);
    size_t cap = 64 + (size_t)n * 3 * (DFL_TOK_MAX_PIECE + 8), len = 0;
    char *out = malloc(cap > (1 << 24) ? (1 << 24) : cap), chunk[3 * DFL_TOK_MAX_PIECE + 32];
    *broken = 0;
    for (int i = 0; i <= n; i++) {
        int r = i < n ? dfl_detok_push(&d, ids[i], chunk, sizeof chunk)
                      : dfl_detok_flush(&d, chunk, sizeof chunk);
        if (r < 0) {
            *broken = 1;
            break;
        }
        if (!valid_utf8(chunk, (size_t)r)) *broken = 1;
        memcpy(out + len, chunk, (size_t)r);
        len += (size_t)r;
    }
    out[len] = 0;
    return out;
}

static int read_ids(const cJSON *a, int32_t **out) {
    int n = cJSON_GetArraySize(a), i = 0;
    *out = malloc(((size_t)n + 1) * sizeof **out);
    const cJSON *e;
    cJSON_ArrayForEach(e, a)(*out)[i++] = (int32_t)e->valuedouble;
    return n;
}

/* ---- Hugging Face vectors ---------------------------------------------------- */

static void test_basic20(const char *tok_dir, const char *vec) {
    dfl_tokenizer *t = load_dir(tok_dir);
    const char *path = test_asset(vec);
    if (!t || !path) goto done;
    dfl_error e = {0};
    cJSON *j = dfl_json_parse_file(path, 1 << 24, &e);
    CHECK(j != NULL, "%s: %s", path, e.msg);
    int64_t vs = 0;
    dfl_json_int(j, "vocab_size_with_added", 0, 1 << 24, &vs, path, &e);
    CHECK(vs == t->n_vocab, "%s: %d ids, vectors say %lld", tok_dir, t->n_vocab, (long long)vs);
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        const char *dec = cJSON_GetObjectItem(c, "decoded")->valuestring;
        int32_t *exp, *exp_sp, *got;
        int m = read_ids(cJSON_GetObjectItem(c, "ids"), &exp);
        int m2 = read_ids(cJSON_GetObjectItem(c, "ids_add_special"), &exp_sp);
        int n = encode(t, text, strlen(text), 0, 1, &got);
        CHECK(same_ids("ids", got, n, exp, m), "%s case %d: %.40s", vec, k, text);
        int broken;
        char *s = decode(t, got, n, 1, &broken);
        CHECK(!strcmp(s, dec) && !broken, "%s case %d decode: \"%s\" vs \"%s\"", vec, k, s, dec);
        free(s);
        free(got);
        n = encode(t, text, strlen(text), 1, 1, &got);
        CHECK(same_ids("ids_add_special", got, n, exp_sp, m2), "%s case %d", vec, k);
        free(got);
        free(exp);
        free(exp_sp);
        k++;
    }
    CHECK(k == 20, "%s: %d cases", vec, k);
    cJSON_Delete(j);
done:
    dfl_tok_free(t);
}

/* ---- llama.cpp vectors -------------------------------------------------------- */

/* Cases of a .inp file (separated by the marker line) and the .out id lines. */
typedef struct vcases {
    char *inp, *out;
    char *text[64];
    size_t len[64];
    char *line[64];
    int n;
} vcases;

static int load_cases(const char *base, vcases *v) {
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "vectors/llama.cpp/%s.inp", base);
    snprintf(p2, sizeof p2, "vectors/llama.cpp/%s.out", base);
    const char *a = test_asset(p1), *b = a ? test_asset(p2) : NULL;
    memset(v, 0, sizeof *v);
    if (!a || !b) return 0;
    size_t la, lb;
    dfl_error e = {0};
    v->inp = dfl_read_file(a, 1 << 20, &la, &e);
    v->out = dfl_read_file(b, 1 << 20, &lb, &e);
    if (!v->inp || !v->out) return 0;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *s = v->inp, *hit;
    while ((hit = strstr(s, sep)) && v->n < 64) {
        *hit = 0;
        v->text[v->n] = s;
        v->len[v->n] = (size_t)(hit - s);
        v->n++;
        s = hit + strlen(sep);
    }
    char *l = v->out;
    for (int i = 0; i < v->n; i++) {
        v->line[i] = l;
        char *nl = strchr(l, '\n');
        if (!nl) break;
        *nl = 0;
        l = nl + 1;
    }
    CHECK(v->n == 46, "%s: %d cases", base, v->n);
    return v->n;
}

static int parse_line(const char *l, int32_t *ids) {
    int n = 0;
    char *end;
    for (;;) {
        long x = strtol(l, &end, 10);
        if (end == l) break;
        ids[n++] = (int32_t)x;
        l = end;
    }
    return n;
}

/* Every case must match; the decoded ids must give the text back (for BPE
 * unless NFC changed it). */
static void run_cases(const dfl_tokenizer *t, const char *base, const char *how) {
    vcases v;
    if (!load_cases(base, &v)) goto done;
    int ok = 0;
    for (int i = 0; i < v.n; i++) {
        int32_t exp[512], *got;
        int m = parse_line(v.line[i], exp);
        int n = encode(t, v.text[i], v.len[i], 0, 0, &got);
        int same = same_ids(base, got, n, exp, m);
        CHECK(same, "%s via %s, case %d: \"%.40s\"", base, how, i, v.text[i]);
        ok += same;
        int broken;
        char *s = decode(t, got, n, 1, &broken);
        size_t nn;
        char *nfc = tok_nfc(v.text[i], v.len[i], &nn);
        CHECK(!broken && (nfc || !strcmp(s, v.text[i])), "%s via %s, case %d: decoded \"%s\"",
              base, how, i, s);
        free(nfc);
        free(s);
        free(got);
    }
    printf("%s via %s: %d/%d cases identical\n", base, how, ok, v.n);
done:
    free(v.inp);
    free(v.out);
}

/* ---- GGUF vocabularies ----------------------------------------------------------- */

/* Writes a llama.cpp-style "gpt2" GGUF vocabulary from a tokenizer.json. */
static int gguf_from_json(const char *json_path, const char *pre, const char *out) {
    dfl_error e = {0};
    cJSON *j = dfl_json_parse_file(json_path, (size_t)256 << 20, &e);
    if (!j) return -1;
    const cJSON *model = cJSON_GetObjectItem(j, "model"), *x;
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItem(model, "merges");
    int n = cJSON_GetArraySize(vocab) + cJSON_GetArraySize(cJSON_GetObjectItem(j, "added_tokens"));
    const char **toks = calloc((size_t)n, sizeof *toks);
    int32_t *types = calloc((size_t)n, sizeof *types);
    cJSON_ArrayForEach(x, vocab) {
        toks[(int)x->valuedouble] = x->string;
        types[(int)x->valuedouble] = 1;
    }
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(j, "added_tokens")) {
        int id = (int)cJSON_GetObjectItem(x, "id")->valuedouble;
        toks[id] = cJSON_GetObjectItem(x, "content")->valuestring;
        types[id] = cJSON_IsTrue(cJSON_GetObjectItem(x, "special")) ? 3 : 4;
    }
    int nm = cJSON_GetArraySize(merges), k = 0;
    char **ms = calloc((size_t)nm, sizeof *ms);
    cJSON_ArrayForEach(x, merges) {
        if (cJSON_IsString(x)) {
            ms[k++] = strdup(x->valuestring);
        } else if (asprintf(&ms[k++], "%s %s", x->child->valuestring,
                            x->child->next->valuestring) < 0) {
            return -1;
        }
    }
    gguf_wkv kv[] = {
        {"tokenizer.ggml.model", GGUF_T_STRING, 0, 0, "gpt2"},
        {"tokenizer.ggml.pre", GGUF_T_STRING, 0, 0, pre},
        {"tokenizer.ggml.tokens", GGUF_T_ARRAY, GGUF_T_STRING, (uint64_t)n, toks},
        {"tokenizer.ggml.token_type", GGUF_T_ARRAY, GGUF_T_I32, (uint64_t)n, types},
        {"tokenizer.ggml.merges", GGUF_T_ARRAY, GGUF_T_STRING, (uint64_t)nm, ms},
    };
    int rc = dfl_gguf_write(out, kv, 5, NULL, 0, &e);
    CHECK(rc == 0, "write %s: %s", out, e.msg);
    for (int i = 0; i < nm; i++) free(ms[i]);
    free(ms);
    free(toks);
    free(types);
    cJSON_Delete(j);
    return rc;
}

static dfl_tokenizer *load_gguf(const char *path) {
    gguf_file g;
    dfl_error e = {0};
    dfl_tokenizer *t = NULL;
    int rc = dfl_gguf_open(path, &g, &e);
    CHECK(rc == 0, "open %s: %s", path, e.msg);
    if (rc) return NULL;
    rc = dfl_tok_load_gguf(&g, &t, &e);
    CHECK(rc == 0, "vocab of %s: %s", path, e.msg);
    dfl_gguf_free(&g);
    return t;
}

static void test_gpt2_gguf(const char *tok_json, const char *pre, const char *base) {
    const char *src = test_asset(tok_json);
    if (!src) return;
    const char *dir = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/vocab.gguf", dir);
    if (gguf_from_json(src, pre, path) == 0) {
        dfl_tokenizer *t = load_gguf(path);
        if (t) run_cases(t, base, "GGUF gpt2 vocabulary");
        dfl_tok_free(t);
    }
    test_rmdir(dir);
}

/* stories260K: llama2.c's ids for its golden text and prompt. */
static void test_stories(void) {
    const char *p = test_asset("stories260K/stories260K.gguf");
    const char *gp = test_asset("stories260K/golden_greedy.json");
    if (!p || !gp) return;
    dfl_tokenizer *t = load_gguf(p);
    dfl_error e = {0};
    cJSON *j = dfl_json_parse_file(gp, 1 << 20, &e);
    if (!t || !j) goto done;
    int32_t *ids, *got;
    int n = read_ids(cJSON_GetObjectItem(j, "token_ids_helper_computed"), &ids), broken;
    char *s = decode(t, ids + 1, n - 1, 0, &broken);
    const char *want = cJSON_GetObjectItem(j, "expected_text_third_party")->valuestring;
    CHECK(!broken && !strcmp(s, want), "stories260K decode:\n%s\nvs\n%s", s, want);
    free(s);
    int32_t prompt[] = {1, 403, 407, 261, 378};
    int m = encode(t, "Once upon a time", 16, 1, 0, &got);
    CHECK(same_ids("prompt", got, m, prompt, 5), "stories260K prompt with BOS");
    CHECK(dfl_tok_bos(t) == 1 && dfl_tok_add_bos(t) && dfl_tok_is_eog(t, 2), "stories260K ids");
    free(got);
    free(ids);
done:
    cJSON_Delete(j);
    dfl_tok_free(t);
}

/* The Llama-2 vocabulary as transformers' LlamaConverter writes tokenizer.json:
 * BPE with byte fallback, merges from every split of every piece into two
 * pieces, ordered by the joined piece's score. Exercises the Metaspace path. */
typedef struct mrg {
    float score;
    int32_t l, r, order;
} mrg;

static int mrg_cmp(const void *a, const void *b) {
    const mrg *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->order - y->order; /* stable, as Python's sorted */
}

static char *llama_json_from_gguf(const dfl_tokenizer *g) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    mrg *m = NULL;
    int nm = 0, cap = 0;
    for (int32_t id = 0; id < g->n_vocab; id++) {
        const char *k = tok_key(g, id);
        int kl = (int)g->key_len[id];
        cJSON_AddItemToObject(vocab, k, cJSON_CreateNumber(id));
        int first = nm;
        for (int i = dfl_tok_utf8_len((unsigned char)k[0]); i < kl; i += dfl_tok_utf8_len((unsigned char)k[i])) {
            int32_t a = tok_strmap_get(g, k, (size_t)i), b = tok_strmap_get(g, k + i, (size_t)(kl - i));
            if (a < 0 || b < 0) continue;
            if (nm == cap) m = realloc(m, (size_t)(cap = cap * 2 + 1024) * sizeof *m);
            m[nm++] = (mrg){g->score[id], a, b, 0};
        }
        for (int i = first + 1; i < nm; i++) /* local order: by (id of left, id of right) */
            for (int j = i; j > first && (m[j - 1].l > m[j].l || (m[j - 1].l == m[j].l && m[j - 1].r > m[j].r)); j--) {
                mrg tmp = m[j];
                m[j] = m[j - 1];
                m[j - 1] = tmp;
            }
    }
    for (int i = 0; i < nm; i++) m[i].order = i;
    qsort(m, (size_t)nm, sizeof *m, mrg_cmp);
    for (int i = 0; i < nm; i++) {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, cJSON_CreateString(tok_key(g, m[i].l)));
        cJSON_AddItemToArray(p, cJSON_CreateString(tok_key(g, m[i].r)));
        cJSON_AddItemToArray(merges, p);
    }
    free(m);
    for (int id = 0; id < 3; id++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", id);
        cJSON_AddStringToObject(a, "content", tok_key(g, id));
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddStringToObject(model, "unk_token", "<unk>");
    cJSON_AddBoolToObject(model, "byte_fallback", 1);
    cJSON_AddBoolToObject(model, "fuse_unk", 1);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON *norm = cJSON_Parse("{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
                              "\"prepend\":\"\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":"
                              "\" \"},\"content\":\"\u2581\"}]}");
    cJSON *dec = cJSON_Parse("{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
                             "{\"String\":\"\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
                             "{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,"
                             "\"stop\":0}]}");
    cJSON *post = cJSON_Parse("{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
                              "\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                              "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":"
                              "[\"<s>\"]}}}");
    cJSON_AddItemToObject(root, "normalizer", norm);
    cJSON_AddItemToObject(root, "decoder", dec);
    cJSON_AddItemToObject(root, "post_processor", post);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* Cutting long words before each "▁" (tok_set_rep_split) must not change a
 * single id: encode a long text both ways. */
static void check_rep_split(dfl_tokenizer *t, const char *what) {
    CHECK(t->rep_split, "%s: the vocabulary should allow cutting at word starts", what);
    const char *p = test_asset("corpus/tinyshakespeare.txt");
    if (!p || !t->rep_split) return;
    size_t n;
    dfl_error e = {0};
    char *text = dfl_read_file(p, 1 << 24, &n, &e);
    n = 60000;
    memcpy(text + 1000, "  \t\n 🦙 naïve 你好  x", strlen("  \t\n 🦙 naïve 你好  x"));
    int32_t *a, *b;
    int na = encode(t, text, n, 0, 0, &a);
    t->rep_split = 0;
    int nb = encode(t, text, n, 0, 0, &b);
    t->rep_split = 1;
    CHECK(same_ids(what, a, na, b, nb), "%s: cut and uncut encodings differ", what);
    free(a);
    free(b);
    free(text);
}

static void test_spm(void) {
    const char *p = test_asset("vectors/llama.cpp/ggml-vocab-llama-spm.gguf");
    if (!p) return;
    dfl_tokenizer *g = load_gguf(p);
    if (!g) return;
    run_cases(g, "ggml-vocab-llama-spm.gguf", "llama.cpp's GGUF");
    check_rep_split(g, "llama-spm GGUF");
    char *json = llama_json_from_gguf(g);
    dfl_tokenizer *t = NULL;
    dfl_error e = {0};
    int rc = dfl_tok_load_json(json, strlen(json), NULL, 0, &t, &e);
    CHECK(rc == 0, "Llama-2 style tokenizer.json: %s", e.msg);
    if (!rc) {
        run_cases(t, "ggml-vocab-llama-spm.gguf", "a Metaspace tokenizer.json");
        check_rep_split(t, "Metaspace tokenizer.json");
        int32_t *ids;
        int n = encode(t, "Hello", 5, 1, 0, &ids);
        int32_t want[] = {1, 15043};
        CHECK(same_ids("bos", ids, n, want, 2), "TemplateProcessing adds <s>");
        free(ids);
    }
    free(json);
    dfl_tok_free(t);
    dfl_tok_free(g);
}

/* ---- streaming decode ---------------------------------------------------------------- */

static void test_streaming(void) {
    static const char *texts[] = {
        "😀🎉👍🏽 emoji 🚀 🦙.cpp", "你好，世界！今天天气很好。", "日本語のテキスト",
        "नमस्ते दुनिया", "Ｆｕｌｌｗｉｄｔｈ ｅ́ 😶‍🌫️", "Cửa Việt 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    };
    const char *dirs[] = {"tokenizers/qwen3", "tokenizers/llama3"};
    dfl_tokenizer *ts[3] = {load_dir(dirs[0]), load_dir(dirs[1]), NULL};
    const char *spm = test_asset("vectors/llama.cpp/ggml-vocab-llama-spm.gguf");
    if (spm) ts[2] = load_gguf(spm);
    for (int k = 0; k < 3; k++) {
        if (!ts[k]) continue;
        int splits = 0;
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            int32_t *ids;
            int n = encode(ts[k], texts[i], strlen(texts[i]), 0, 0, &ids), broken;
            for (int j = 0; j < n; j++) { /* pieces that are not whole characters */
                const char *p;
                int sp, l = dfl_tok_piece(ts[k], ids[j], &p, &sp);
                splits += !valid_utf8(p, (size_t)l);
            }
            char *s = decode(ts[k], ids, n, 0, &broken);
            size_t nn;
            char *nfc = tok_nfc(texts[i], strlen(texts[i]), &nn);
            CHECK(!broken, "tokenizer %d: a chunk of \"%s\" was not whole UTF-8", k, texts[i]);
            CHECK(!strcmp(s, nfc ? nfc : texts[i]), "tokenizer %d: \"%s\" came back as \"%s\"",
                  k, texts[i], s);
            free(nfc);
            free(s);
            free(ids);
        }
        CHECK(splits > 0, "tokenizer %d: no token split a character: the test tests nothing", k);
    }
    /* bytes that never complete become U+FFFD at flush, one per bad subpart */
    if (ts[0]) {
        struct dfl_engine eng;
        memset(&eng, 0, sizeof eng);
        eng.tok = ts[0];
        int32_t e0 = ts[0]->byte_id[0xe4], e1 = ts[0]->byte_id[0xbd], a = ts[0]->byte_id['a'];
        int32_t seq[] = {e0, e1, a, e0};
        dfl_detok d;
        dfl_detok_init(&d, &eng, 0);
        char out[64], all[64] = "";
        for (int i = 0; i < 4; i++) {
            int r = dfl_detok_push(&d, seq[i], out, sizeof out);
            CHECK(r >= 0, "push");
            strncat(all, out, (size_t)r);
            CHECK(i != 1 || r == 0, "an unfinished character is held back");
        }
        int r = dfl_detok_flush(&d, out, sizeof out);
        strncat(all, out, (size_t)r);
        CHECK(!strcmp(all, "\xef\xbf\xbd" "a" "\xef\xbf\xbd"), "U+FFFD for broken bytes: %s", all);
        dfl_detok_init(&d, &eng, 0);
        CHECK(dfl_detok_push(&d, 151644, out, sizeof out) == 0, "<|im_start|> hidden");
        dfl_detok_init(&d, &eng, 1);
        r = dfl_detok_push(&d, 151644, out, sizeof out);
        CHECK(r == 12 && !memcmp(out, "<|im_start|>", 12), "<|im_start|> shown");
        CHECK(dfl_detok_push(&d, 151644, out, 4) == DFL_EARG, "small buffer refused");
        CHECK(dfl_detok_push(&d, 1 << 30, out, sizeof out) < 0, "bad id refused");
        CHECK(dfl_tok_is_eog(ts[0], 151645) && dfl_tok_is_eog(ts[0], 151643) &&
              !dfl_tok_is_eog(ts[0], 151644), "qwen3 end-of-generation ids");
    }
    if (ts[1]) CHECK(dfl_tok_is_eog(ts[1], 128001) && dfl_tok_is_eog(ts[1], 128009), "llama3 eog");
    for (int k = 0; k < 3; k++) dfl_tok_free(ts[k]);
}

/* ---- encode details ------------------------------------------------------------------ */

static void test_encode_api(void) {
    dfl_tokenizer *t = load_dir("tokenizers/qwen3");
    if (!t) return;
    dfl_error e = {0};
    int32_t ids[2];
    const char *s = "<|im_start|>user\nhi<|im_end|>";
    int n = dfl_tok_encode(t, s, strlen(s), 0, 1, ids, 2, &e);
    CHECK(n == 5 && ids[0] == 151644 && ids[1] == 872, "cap smaller than the count: %d", n);
    int32_t *got;
    n = encode(t, s, strlen(s), 0, 0, &got); /* special text stays text */
    CHECK(n > 5 && got[0] != 151644, "parse_special=0 keeps <|im_start|> as text");
    free(got);
    n = encode(t, "<think>x</think>", 16, 0, 0, &got); /* not special: always matched */
    CHECK(n == 3 && got[0] == 151667 && got[2] == 151668, "<think> is an added, non-special token");
    free(got);
    CHECK(dfl_tok_encode(t, "a\xff", 2, 0, 0, ids, 2, &e) == DFL_EARG && strstr(e.msg, "UTF-8"),
          "invalid UTF-8 text: %s", e.msg);
    /* no ids at all with room for some: nothing is copied (the fuzzer found
     * a copy from the empty list's NULL buffer, undefined under UBSan) */
    CHECK(dfl_tok_encode(t, "", 0, 0, 0, ids, 2, &e) == 0, "empty text gives no ids");
    /* a long line with no spaces: one huge word through the heap path */
    size_t big = 200000;
    char *txt = malloc(big + 1);
    for (size_t i = 0; i < big; i++) txt[i] = "ab"[i % 7 == 0];
    txt[big] = 0;
    n = encode(t, txt, big, 0, 0, &got);
    int broken;
    char *back = decode(t, got, n, 0, &broken);
    CHECK(n > 0 && !strcmp(back, txt), "200 kB word round trip (%d ids)", n);
    free(back);
    free(got);
    free(txt);
    dfl_tok_free(t);
}

/* ---- malformed files --------------------------------------------------------------------- */

static void expect_bad(const char *json, int code, const char *sub) {
    dfl_tokenizer *t = NULL;
    dfl_error e = {0};
    int rc = dfl_tok_load_json(json, strlen(json), NULL, 0, &t, &e);
    CHECK(rc == code && t == NULL && strstr(e.msg, sub), "%.60s: rc %d, \"%s\" (want %d, \"%s\")",
          json, rc, e.msg, code, sub);
    dfl_tok_free(t);
}

#define BL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"
#define VOC "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"

static void test_malformed(void) {
    expect_bad("", DFL_EFORMAT, "invalid JSON");
    expect_bad("[1,2]", DFL_EFORMAT, "not a JSON object");
    expect_bad("{}", DFL_EFORMAT, "\"model\" is missing");
    expect_bad("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", DFL_EUNSUP, "Unigram");
    expect_bad("{\"model\":{\"type\":\"BPE\"}}", DFL_EFORMAT, "model.vocab");
    expect_bad("{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[\"a c\"]}}", DFL_EFORMAT,
               "merges[0]");
    expect_bad("{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[\"ab\"]}}", DFL_EFORMAT,
               "merges[0]");
    expect_bad("{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[\"a b\", [\"a\"]]}}", DFL_EFORMAT,
               "merges[1]");
    expect_bad("{\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[\"b a\"]}}", DFL_EFORMAT,
               "\"ba\" is not in the vocabulary");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1}}}", DFL_EFORMAT, "model.vocab");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5}}}", DFL_EFORMAT, "integer");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999}}}", DFL_EFORMAT, "0..");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":5000000}}}", DFL_EFORMAT, "far above");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0}}}", DFL_EFORMAT, "twice");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\xff\":0}}}", DFL_EFORMAT, "UTF-8");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"added_tokens\":[{\"id\":7000000,"
               "\"content\":\"x\"}]}", DFL_EFORMAT, "id");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}},\"added_tokens\":[{\"id\":1,"
               "\"content\":\"\"}]}", DFL_EFORMAT, "added token 1");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"unk_token\":\"<unk>\"}}",
               DFL_EFORMAT, "unk_token");
    expect_bad("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
               "\"behavior\":\"Isolated\"},\"model\":{\"type\":\"BPE\",\"vocab\":{}}}",
               DFL_EFORMAT, "regex");
    expect_bad("{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"BPE\","
               "\"vocab\":{}}}", DFL_EUNSUP, "Whitespace");
    expect_bad("{\"normalizer\":{\"type\":\"Lowercase\"},\"model\":{\"type\":\"BPE\",\"vocab\":{}}}",
               DFL_EUNSUP, "Lowercase");
    expect_bad("{\"decoder\":{\"type\":\"WordPiece\"},\"model\":{\"type\":\"BPE\",\"vocab\":{}}}",
               DFL_EUNSUP, "WordPiece");
    expect_bad("{\"pre_tokenizer\":" BL ",\"model\":{\"type\":\"BPE\",\"vocab\":{},"
               "\"byte_fallback\":3}}", DFL_EFORMAT, "byte_fallback");
    char deep[400];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    deep[399] = 0;
    deep[199] = '1';
    expect_bad(deep, DFL_EFORMAT, "deeper");
    /* a valid minimal file loads and tokenizes; unknown bytes are dropped, not a crash */
    const char *ok = "{\"pre_tokenizer\":" BL ",\"decoder\":{\"type\":\"ByteLevel\"},"
                     "\"model\":{\"type\":\"BPE\"," VOC ",\"merges\":[\"a b\"]}}";
    dfl_tokenizer *t = NULL;
    dfl_error e = {0};
    CHECK(dfl_tok_load_json(ok, strlen(ok), NULL, 0, &t, &e) == 0, "minimal file: %s", e.msg);
    if (t) {
        int32_t *ids;
        int n = encode(t, "abba zz", 7, 1, 1, &ids);
        int32_t want[] = {2, 1, 0};
        CHECK(same_ids("minimal", ids, n, want, 3), "minimal file encodes");
        free(ids);
    }
    dfl_tok_free(t);
}

/* GGUF vocabularies with broken fields. */
static void expect_bad_gguf(gguf_wkv *kv, int n, int code, const char *sub) {
    const char *dir = test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/v.gguf", dir);
    dfl_error e = {0};
    CHECK(dfl_gguf_write(path, kv, n, NULL, 0, &e) == 0, "write: %s", e.msg);
    gguf_file g;
    dfl_tokenizer *t = NULL;
    if (dfl_gguf_open(path, &g, &e) == 0) {
        int rc = dfl_tok_load_gguf(&g, &t, &e);
        CHECK(rc == code && !t && strstr(e.msg, sub), "gguf: rc %d \"%s\" (want %d \"%s\")", rc,
              e.msg, code, sub);
        dfl_tok_free(t);
        dfl_gguf_free(&g);
    }
    test_rmdir(dir);
}

static void test_malformed_gguf(void) {
    const char *toks[] = {"a", "b", "ab", "\xc3\x28"};
    int32_t types[] = {1, 1, 1, 9};
    uint32_t big = 77;
    const char *merges_bad[] = {"a c"};
    gguf_wkv kv[6] = {
        {"tokenizer.ggml.model", GGUF_T_STRING, 0, 0, "gpt2"},
        {"tokenizer.ggml.tokens", GGUF_T_ARRAY, GGUF_T_STRING, 3, toks},
        {"tokenizer.ggml.merges", GGUF_T_ARRAY, GGUF_T_STRING, 1, merges_bad},
    };
    expect_bad_gguf(kv, 1, DFL_EFORMAT, "tokenizer.ggml.tokens");
    expect_bad_gguf(kv, 3, DFL_EFORMAT, "merges[0]");
    kv[0].val = "bert";
    expect_bad_gguf(kv, 3, DFL_EUNSUP, "bert");
    kv[0].val = "llama";
    kv[1].arr_n = 4;
    expect_bad_gguf(kv, 2, DFL_EFORMAT, "UTF-8");
    kv[1].arr_n = 3;
    kv[2] = (gguf_wkv){"tokenizer.ggml.token_type", GGUF_T_ARRAY, GGUF_T_I32, 2, types};
    expect_bad_gguf(kv, 3, DFL_EFORMAT, "entries");
    kv[2].arr_n = 3;
    types[2] = 9;
    expect_bad_gguf(kv, 3, DFL_EFORMAT, "token_type[2]");
    kv[2] = (gguf_wkv){"tokenizer.ggml.bos_token_id", GGUF_T_U32, 0, 0, &big};
    expect_bad_gguf(kv, 3, DFL_EFORMAT, "bos_token_id");
    kv[0].val = "gpt2";
    kv[2] = (gguf_wkv){"tokenizer.ggml.pre", GGUF_T_STRING, 0, 0, "mystery"};
    expect_bad_gguf(kv, 3, DFL_EUNSUP, "mystery");
    kv[0].val = "";
    expect_bad_gguf(kv, 3, DFL_EUNSUP, "tokenizer.ggml.model");
    gguf_wkv none[] = {{"general.name", GGUF_T_STRING, 0, 0, "x"}};
    expect_bad_gguf(none, 1, DFL_EFORMAT, "tokenizer.ggml.model is missing");
}

/* ---- static tables --------------------------------------------------------------------- */

static void test_tables(void) {
    /* GPT-2's rule: printable Latin-1 bytes as themselves, the rest from U+0100 in byte order */
    int next = 0x100, ok = 1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        int cp = keep ? b : next++;
        ok &= tok_bl_cp[b] == cp;
        char u[4], back[4];
        int n = tok_utf8_encode((uint32_t)cp, u);
        ok &= tok_bl_decode(u, (size_t)n, back) == 1 && (unsigned char)back[0] == b;
    }
    CHECK(ok, "byte-level alphabet");
    /* every code point our NFC shortcut skips must be a stable starter that never
     * composes with what precedes it: check against utf8proc's own data */
    static uint8_t second[0x110000];
    for (int32_t cp = 0; cp < 0x110000; cp++) {
        utf8proc_int32_t d[8];
        int opt;
        utf8proc_ssize_t n = utf8proc_decompose_char(cp, d, 8, UTF8PROC_DECOMPOSE, &opt);
        for (int i = 1; i < n && i < 8; i++) second[d[i]] = 1;
    }
    int bad = 0;
    for (int32_t cp = 0x80; cp < 0x110000; cp++) {
        if (!tok_nfc_inert((uint32_t)cp)) continue;
        const utf8proc_property_t *p = utf8proc_get_property(cp);
        utf8proc_uint8_t buf[8] = {0};
        tok_utf8_encode((uint32_t)cp, (char *)buf);
        utf8proc_uint8_t *alone = utf8proc_NFC(buf);
        int stable = alone && !strcmp((char *)alone, (char *)buf);
        free(alone);
        if (p->combining_class || second[cp] || !stable)
            if (bad++ < 5) fprintf(stderr, "  not inert: U+%04X\n", (unsigned)cp);
    }
    CHECK(bad == 0, "%d code points wrongly treated as NFC-inert", bad);
    /* the shortcut gives what utf8proc gives on mixed text */
    const char *mix = "cafe\xcc\x81 e\xcc\x81\xcc\xa3 \xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 "
                      "\xea\xb0\x80\xe1\x86\xa8 \xe2\x84\xab A\xcc\x8a \xe4\xbd\xa0\xe5\xa5\xbd";
    size_t m;
    char *ours = tok_nfc(mix, strlen(mix), &m);
    utf8proc_uint8_t *ref = utf8proc_NFC((const utf8proc_uint8_t *)mix);
    CHECK(ours && m == strlen((char *)ref) && !memcmp(ours, ref, m), "NFC of mixed text");
    free(ours);
    free(ref);
}

int main(void) {
    test_tables();
    test_malformed();
    test_malformed_gguf();
    test_basic20("tokenizers/qwen3", "vectors/qwen3_basic_20.json");
    test_basic20("tokenizers/llama3", "vectors/llama3_basic_20.json");
    dfl_tokenizer *q = load_dir("tokenizers/qwen3"), *l = load_dir("tokenizers/llama3");
    if (q) run_cases(q, "ggml-vocab-qwen2.gguf", "qwen3 tokenizer.json");
    if (l) run_cases(l, "ggml-vocab-llama-bpe.gguf", "llama3 tokenizer.json");
    dfl_tok_free(q);
    dfl_tok_free(l);
    test_gpt2_gguf("tokenizers/qwen3/tokenizer.json", "qwen2", "ggml-vocab-qwen2.gguf");
    test_gpt2_gguf("tokenizers/llama3/tokenizer.json", "llama-bpe", "ggml-vocab-llama-bpe.gguf");
    test_spm();
    test_stories();
    test_streaming();
    test_encode_api();
    return test_summary();
}
