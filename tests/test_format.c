/* test_format.c - structured output (src/sample/format.c):
 *   1. the automaton accepts exactly the JSON texts a schema allows (a table
 *      of valid and invalid texts per schema), and refuses unsupported
 *      schemas by name;
 *   2. the token mask's walk over the sorted vocabulary (shared prefixes,
 *      skipped subtrees) equals spelling every token byte by byte;
 *   3. on the built-in model and drafter: speculative output equals classic
 *      output under a format, greedy and sampled, at many block sizes, and
 *      every answer that ends is one the format accepts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "sample/format.h"
#include "testutil.h"

static dfl_format *compile(const char *schema, const char *pre, const char *suf) {
    dfl_format *f = NULL;
    dfl_error err = {0};
    if (dfl_fmt_compile(schema, pre, suf, NULL, &f, &err))
        fprintf(stderr, "compile %s: %s\n", schema ? schema : "(object)", err.msg);
    return f;
}

typedef struct tcase {
    const char *text;
    int ok;
} tcase;

static void table(const char *schema, const char *pre, const char *suf, const tcase *t) {
    dfl_format *f = compile(schema, pre, suf);
    CHECK(f != NULL, "%s compiles", schema);
    if (!f) return;
    for (; t->text; t++)
        CHECK(dfl_format_accepts(f, t->text, strlen(t->text)) == t->ok, "%s on %s: expected %s",
              schema, t->text, t->ok ? "accepted" : "refused");
    dfl_format_free(f);
}

static void test_automaton(void) {
    table(NULL, NULL, NULL, (const tcase[]){
        {"{}", 1}, {"{\"a\": [1, -2.5e+3, true, null, \"x\\u00e9\\n\"]}", 1},
        {"{\"a\":{\"b\":{}}}", 1}, {" { } ", 0}, {"[]", 0}, {"{\"a\":01}", 0},
        {"{\"a\":1,}", 0}, {"{\"a\" 1}", 0}, {"{\"a\":\"\x01\"}", 0}, {"{\"\xc3\xa9\":1}", 1},
        {"{\"a\":\"\xc3\"}", 0}, {"{\"a\":tru}", 0}, {"{\"a\":1.}", 0}, {"{\"a\":-}", 0}, {NULL, 0}});
    const char *person =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":5},"
        "\"age\":{\"type\":\"integer\"},\"nick\":{\"type\":[\"string\",\"null\"]},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"ab\",1]},\"minItems\":1,"
        "\"maxItems\":2}},\"required\":[\"name\",\"tags\"],\"additionalProperties\":false}";
    table(person, NULL, NULL, (const tcase[]){
        {"{\"name\":\"Bo\",\"tags\":[\"a\"]}", 1},
        {"{\"name\":\"Bo\",\"age\":3,\"nick\":null,\"tags\":[\"ab\",1]}", 1},
        {"{\"name\":\"Bo\",\"nick\":\"x\",\"tags\":[1]}", 1},
        {"{\n  \"name\": \"Bo\",\n  \"tags\": [ \"a\" ]\n}", 1},
        {"{\"name\":\"Bobby\",\"tags\":[\"a\"]}", 1}, {"{\"name\":\"Bobbyy\",\"tags\":[\"a\"]}", 0},
        {"{\"tags\":[\"a\"],\"name\":\"Bo\"}", 0},      /* order */
        {"{\"name\":\"Bo\"}", 0},                      /* required */
        {"{\"name\":\"Bo\",\"tags\":[]}", 0},          /* minItems */
        {"{\"name\":\"Bo\",\"tags\":[1,1,1]}", 0},     /* maxItems */
        {"{\"name\":\"Bo\",\"age\":3.5,\"tags\":[1]}", 0},
        {"{\"name\":\"Bo\",\"tags\":[\"b\"]}", 0}, {"{\"name\":\"Bo\",\"x\":1,\"tags\":[1]}", 0},
        {"{\"name\":\"Bo\",\"tags\":[1]}x", 0}, {NULL, 0}});
    const char *tree =
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
        "\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/node\"}";
    table(tree, NULL, NULL, (const tcase[]){
        {"{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":-0.5,\"kids\":[{\"v\":3,\"kids\":[]}]}]}", 1},
        {"{\"v\":1,\"kids\":[{\"v\":2}]}", 0}, {NULL, 0}});
    const char *tool =
        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get\"},"
        "\"arguments\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]}},\"required\":[\"name\",\"arguments\"]},{\"type\":\"object\","
        "\"properties\":{\"name\":{\"const\":\"getall\"},\"arguments\":{\"type\":\"object\","
        "\"properties\":{}}},\"required\":[\"name\",\"arguments\"]}]}";
    table(tool, "<tool_call>\n", "\n</tool_call>", (const tcase[]){
        {"<tool_call>\n{\"name\":\"get\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>", 1},
        {"<tool_call>\n{\"name\": \"getall\", \"arguments\": {}}\n</tool_call>", 1},
        {"<tool_call>\n{\"name\":\"get\",\"arguments\":{}}\n</tool_call>", 0},
        {"<tool_call>\n{\"name\":\"getall\",\"arguments\":{\"city\":\"x\"}}\n</tool_call>", 1},
        {"{\"name\":\"get\",\"arguments\":{\"city\":\"Oslo\"}}", 0},
        {"<tool_call>\n{\"name\":\"get\",\"arguments\":{\"city\":\"Oslo\"}}", 0}, {NULL, 0}});
    table("{\"type\":\"integer\"}", NULL, NULL, (const tcase[]){
        {"0", 1}, {"-12", 1}, {"012", 0}, {"1e3", 0}, {"", 0}, {NULL, 0}});
    table("{\"enum\":[1,10,\"x\"]}", NULL, NULL, (const tcase[]){
        {"1", 1}, {"10", 1}, {"\"x\"", 1}, {"100", 0}, {"2", 0}, {NULL, 0}});

    /* refused by name, never ignored */
    const char *bad[][2] = {
        {"{\"type\":\"string\",\"pattern\":\"a+\"}", "pattern"},
        {"{\"type\":\"number\",\"minimum\":0}", "minimum"},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", "oneOf"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"additionalProperties\":true}",
         "additionalProperties"},
        {"{\"$ref\":\"#/$defs/none\"}", "not found"},
        {"{\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}},"
         "\"$ref\":\"#/$defs/a\"}", "refer to themselves"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "\"b\""},
        {"{\"type\":\"strin\"}", "strin"},
        {"[1]", "schema object"},
        {"{\"type\":\"string\"", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dfl_format *f = NULL;
        dfl_error err = {0};
        int rc = dfl_fmt_compile(bad[i][0], NULL, NULL, NULL, &f, &err);
        CHECK(rc != 0 && !f && strstr(err.msg, bad[i][1]), "%s: rc %d, message '%s'", bad[i][0],
              rc, err.msg);
    }
    /* more anyOf branches alive at once than the limit */
    char wide[4096] = "{\"type\":\"array\",\"items\":{\"anyOf\":[";
    for (int i = 0; i < DFL_FMT_MAX_ALT + 1; i++)
        snprintf(wide + strlen(wide), sizeof wide - strlen(wide), "%s{\"const\":%d}", i ? "," : "", i);
    strcat(wide, "]}}");
    dfl_format *f = NULL;
    dfl_error err = {0};
    CHECK(dfl_fmt_compile(wide, NULL, NULL, NULL, &f, &err) != 0, "%d-wide anyOf refused",
          DFL_FMT_MAX_ALT + 1);
}

/* ---- 2. the walk against spelling each token byte by byte ------------------ */

enum { TV = 256 + 600 };

static void test_walk(void) {
    /* ids 0..255: every single byte; then random multi-byte tokens over a
     * JSON-ish alphabet (sharing prefixes a lot); one EOG */
    static char store[TV][8];
    const char **bytes = calloc(TV + 1, sizeof(char *));
    int *len = calloc(TV + 1, sizeof(int));
    uint8_t *kind = calloc(TV + 1, 1);
    const char alpha[] = "{}[]\":, \n0123-.etrufalsnabc\\";
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < TV; i++) {
        int n = i < 256 ? 1 : 2 + (int)(i % 5);
        for (int k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            store[i][k] = i < 256 ? (char)i : alpha[x % (sizeof alpha - 1)];
        }
        bytes[i] = store[i];
        len[i] = n;
    }
    kind[TV] = DFL_FMT_TOK_EOG;
    dfl_fmt_vocab *v = dfl_fmt_vocab_new(TV + 1, bytes, len, kind);
    dfl_format *f = NULL;
    dfl_error err = {0};
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\","
                         "\"items\":{\"type\":[\"number\",\"string\",\"boolean\"],"
                         "\"maxLength\":3}},\"b\":{}},"
                         "\"required\":[\"a\"]}";
    CHECK(dfl_fmt_compile(schema, NULL, NULL, v, &f, &err) == 0, "%s", err.msg);
    if (!f) return;
    const char *path = "{\"a\": [12, \"x\\\"c\", true, -3.5], \"b\": {\"q\": [null]}}";
    int n = (int)strlen(path), bad = 0, checked = 0;
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(n + 1));
    float *row = malloc(sizeof(float) * (TV + 1)), *one = malloc(sizeof(float) * (TV + 1));
    dfl_fmt_run *r = dfl_fmt_run_new(f, 0);
    for (int p = 0; p <= n; p++) {   /* after each prefix of the path */
        for (int i = 0; i <= TV; i++) row[i] = 0;
        dfl_fmt_mask(r, hist, p, NULL, 0, row);
        for (int t = 256; t < TV; t++) {
            /* spelled: each byte allowed after the ones before, by the
             * single-byte tokens' masks */
            int ok = 1;
            for (int k = 0; k < len[t] && ok; k++) {
                int32_t b[8];
                for (int q = 0; q < k; q++) b[q] = (unsigned char)store[t][q];
                for (int i = 0; i <= TV; i++) one[i] = 0;
                dfl_fmt_mask(r, hist, p, b, k, one);
                ok = one[(unsigned char)store[t][k]] == 0;
            }
            bad += ok != (row[t] == 0);
            checked += ok;
        }
        if (p < n) hist[p] = (unsigned char)path[p];
    }
    CHECK(bad == 0 && checked > 50, "walk vs spelled: %d disagree, %d allowed", bad, checked);
    /* the end of generation only after the whole value */
    for (int i = 0; i <= TV; i++) row[i] = 0;
    dfl_fmt_mask(r, hist, n, NULL, 0, row);
    CHECK(row[TV] == 0 && isinf(row['{']), "complete: only the end");
    dfl_fmt_mask(r, hist, n - 1, NULL, 0, row);
    CHECK(isinf(row[TV]), "incomplete: no end");
    dfl_fmt_run_free(r);
    dfl_format_free(f);
    dfl_fmt_vocab_free(v);
    free(hist), free(row), free(one);
}

/* ---- 3. speculative equals classic on the built-in pair ---------------------- */

enum { MAXG = 160 };

typedef struct sink {
    int32_t ids[MAXG];
    int n;
    char text[4096];
    size_t tn;
    dfl_detok dt;
} sink;

static int on_tok(void *ud, const dfl_token_info *t) {
    sink *s = ud;
    if (s->n < MAXG) s->ids[s->n++] = t->id;
    int m = dfl_detok_push(&s->dt, t->id, s->text + s->tn, sizeof s->text - s->tn - 1);
    if (m > 0) s->tn += (size_t)m;
    return 0;
}

static void gen(dfl_engine *e, dfl_session *s, const int32_t *prompt, int n, dfl_gen_params *p,
                sink *out, dfl_stats *st) {
    dfl_error err = {0};
    memset(out, 0, sizeof *out);
    dfl_detok_init(&out->dt, e, 0);
    int rc = dfl_generate(s, prompt, n, p, on_tok, out, st, &err);
    CHECK(rc == 0, "generate: %s", err.msg);
    int m = dfl_detok_flush(&out->dt, out->text + out->tn, sizeof out->text - out->tn - 1);
    if (m > 0) out->tn += (size_t)m;
    out->text[out->tn] = 0;
}

static void test_speculative(void) {
    const char *src = getenv("DFLASH_SRC");
    char model[1024], draft[1024];
    snprintf(model, sizeof model, "%s/models/default/target", src ? src : ".");
    snprintf(draft, sizeof draft, "%s/models/default/draft", src ? src : ".");
    dfl_engine_opts eo;
    dfl_engine_opts_default(&eo);
    eo.model_path = model;
    eo.draft_path = draft;
    eo.ctx_size = 512;
    eo.n_threads = 2;
    dfl_engine *e;
    dfl_session *s;
    dfl_error err = {0};
    if (dfl_engine_load(&eo, &e, &err)) {
        CHECK(0, "the built-in pair: %s", err.msg);
        return;
    }
    dfl_session_new(e, &s, &err);
    const char *schemas[] = {
        NULL,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"
        "\"age\":{\"type\":\"integer\"},\"happy\":{\"type\":\"boolean\"}},"
        "\"required\":[\"name\",\"age\",\"happy\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"enum\":[\"cat\",\"dog\",\"the big bird\"]},"
        "\"minItems\":2,\"maxItems\":5}",
    };
    const char *text = "Once upon a time, a little girl named Lily";
    int32_t prompt[64];
    int n = dfl_tokenize(e, text, strlen(text), 1, 0, prompt, 64, &err);
    int blocks[] = {2, 3, 4, 8, 0};
    int ended = 0, speculated = 0;
    static sink ref, got;
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        dfl_format *f = NULL;
        CHECK(dfl_format_new(e, schemas[k], NULL, NULL, &f, &err) == 0, "%s", err.msg);
        for (int mode = 0; mode < 3 && f; mode++) {
            dfl_gen_params p;
            dfl_gen_params_default(&p);
            p.format = f;
            p.max_tokens = MAXG;
            p.temperature = mode ? 0.9f : 0.0f;
            p.seed = 7 + (uint64_t)mode;
            p.block_size = 1;
            dfl_stats st;
            gen(e, s, prompt, n, &p, &ref, &st);
            if (getenv("VERBOSE")) fprintf(stderr, "schema %zu mode %d: stop %d: %s\n", k, mode, st.stop, ref.text);
            if (st.stop == DFL_STOP_EOS) {
                /* the text before the end token */
                ended++;
                CHECK(dfl_format_accepts(f, ref.text, ref.tn), "schema %zu mode %d: '%s' "
                      "refused", k, mode, ref.text);
            }
            for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
                p.block_size = blocks[b];
                gen(e, s, prompt, n, &p, &got, &st);
                speculated += st.rounds > 0 && st.accepted > 0;
                CHECK(got.n == ref.n && !memcmp(got.ids, ref.ids, sizeof(int32_t) * (size_t)ref.n),
                      "schema %zu mode %d block %d: speculative differs from classic "
                      "(%d vs %d tokens)", k, mode, blocks[b], got.n, ref.n);
            }
        }
        dfl_format_free(f);
    }
    CHECK(ended >= 5, "only %d of 9 answers ended within %d tokens", ended, MAXG);
    CHECK(speculated > 0, "no run accepted a draft: the comparison proved nothing");
    dfl_session_free(s);
    dfl_engine_free(e);
}

int main(void) {
    test_automaton();
    test_walk();
    test_speculative();
    return test_summary();
}
