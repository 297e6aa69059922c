/* test_tokenizer_chat.c - the chat path in C: the Qwen3 renders of another
 * Jinja engine (@huggingface/jinja 0.5.11, in ../shared/assets/chat_templates)
 * byte for byte through the struct API, and the sandbox: step budget, output
 * and memory caps, nesting and macro-recursion limits, errors that name a
 * line and column, raise_exception's message, snprintf-style truncation.
 * tests/test_chat_templates.py compares every real template with
 * transformers. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

static char *read_asset(const char *rel) {
    const char *p = test_asset(rel);
    if (!p) return NULL;
    size_t n;
    dfl_error e = {0};
    char *s = dfl_read_file(p, 1 << 20, &n, &e);
    CHECK(s != NULL, "%s: %s", p, e.msg);
    return s;
}

/* Renders and compares; on a difference prints where. */
static void expect_render(const char *what, const char *tmpl, const char *name, const char *bos,
                          const dfl_chat_msg *m, int n, int gen, int think, const char *want) {
    dfl_error e = {0};
    int need = dfl_chat_render_text(tmpl, name, bos, NULL, m, n, gen, think, NULL, 0, &e);
    CHECK(need >= 0, "%s: %s", what, e.msg);
    if (need < 0) return;
    char *out = malloc((size_t)need + 1);
    int got = dfl_chat_render_text(tmpl, name, bos, NULL, m, n, gen, think, out, (size_t)need + 1, &e);
    size_t i = 0, wl = strlen(want);
    while (i < wl && i < (size_t)got && out[i] == want[i]) i++;
    CHECK(got == need && (size_t)got == wl && i == wl, "%s: differs at byte %zu:\n--- got\n%s\n--- want\n%s",
          what, i, out, want);
    free(out);
}

static void test_hf_jinja(void) {
    char *tmpl = read_asset("chat_templates/Qwen-Qwen3-0.6B.jinja");
    char *ref = read_asset("chat_templates/qwen3_rendered_hf-jinja-0.5.11.json");
    if (!tmpl || !ref) goto done;
    cJSON *j = cJSON_Parse(ref);
    dfl_chat_msg conv[] = {
        {"system", "You are a helpful assistant."},
        {"user", "What is 2+2?"},
        {"assistant", "<think>\nTwo and two.\n</think>\n\n4"},
        {"user", "And 3+3?"},
    };
    expect_render("qwen3 gen", tmpl, NULL, NULL, conv, 2, 1, 1,
                  cJSON_GetObjectItem(j, "gen")->valuestring);
    expect_render("qwen3 gen_nothink", tmpl, NULL, NULL, conv, 2, 1, 0,
                  cJSON_GetObjectItem(j, "gen_nothink")->valuestring);
    expect_render("qwen3 multi", tmpl, NULL, NULL, conv, 4, 1, 1,
                  cJSON_GetObjectItem(j, "multi")->valuestring);
    /* the same through a forced template text */
    expect_render("qwen3 forced", NULL, tmpl, NULL, conv, 2, 1, 0,
                  cJSON_GetObjectItem(j, "gen_nothink")->valuestring);
    cJSON_Delete(j);
done:
    free(tmpl);
    free(ref);
}

/* Renders tmpl with no variables under small limits; returns the error code
 * (0 on success) and leaves the message in e. */
static int render_limited(const char *tmpl, size_t max_out, size_t max_mem, uint64_t steps,
                          dfl_error *e) {
    dfl_jinja_limits lim = {max_out, max_mem, steps, 0, 0};
    dfl_jinja_var v = {NULL, "{\"xs\": [1, 2, 3]}"};
    char *out = NULL;
    size_t n;
    memset(e, 0, sizeof *e);
    int rc = dfl_jinja_render(tmpl, strlen(tmpl), &v, 1, &lim, &out, &n, e);
    CHECK((rc == 0) == (out != NULL), "output iff success");
    free(out);
    return rc;
}

static void test_sandbox(void) {
    dfl_error e;
    int rc = render_limited("{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
                            0, 0, 1000000, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "budget"), "step budget: %s", e.msg);
    rc = render_limited("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "nest"), "macro recursion: %s", e.msg);
    rc = render_limited("{% set s = 'x' * 100 %}{% for i in range(1000) %}{{ s }}{% endfor %}", 4096, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "longer than 4096"), "output cap: %s", e.msg);
    rc = render_limited("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}", 1 << 30, 8 << 20, 0, &e);
    CHECK(rc == DFL_EARG && (strstr(e.msg, "memory") || strstr(e.msg, "longer")), "memory cap: %s", e.msg);
    char deep[5000] = "{{ ";
    for (int i = 0; i < 1000; i++) strcat(deep, "not ");
    strcat(deep, "x }}");
    rc = render_limited(deep, 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "nests deeper"), "parse nesting: %s", e.msg);
    rc = render_limited("{{ range(1000000) | length }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "Range too big"), "range cap: %s", e.msg);
    rc = render_limited("{{ xs.append(4) }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "unsafe"), "list.append refused: %s", e.msg);
    rc = render_limited("{{ xs.__class__ }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "unsafe"), "dunder refused: %s", e.msg);
    rc = render_limited("{% include 'x' %}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "unknown tag 'include'"), "no file access: %s", e.msg);
    /* malformed templates: an error naming where, never a crash */
    rc = render_limited("line one\n  {% if xs %}\n{{ xs }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "line 2 col 3") && strstr(e.msg, "endif"), "unclosed if: %s", e.msg);
    rc = render_limited("a\nb {{ 1 + }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "line 2 col") && strstr(e.msg, "end of print statement"),
          "bad expression: %s", e.msg);
    rc = render_limited("{{ 'abc }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "line 1 col 4") && strstr(e.msg, "unterminated"), "string: %s", e.msg);
    rc = render_limited("{% endfor %}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "unexpected 'endfor'"), "stray end: %s", e.msg);
    rc = render_limited("{{ raise_exception('Only user and assistant roles are supported!') }}", 0, 0, 0, &e);
    CHECK(rc == DFL_EARG && !strcmp(e.msg, "Only user and assistant roles are supported!"),
          "raise_exception's message alone: %s", e.msg);
}

static void test_api(void) {
    dfl_chat_msg m[] = {{"user", "  hi  "}};
    dfl_error e = {0};
    char buf[8];
    /* no template: ChatML (transformers' former default) */
    int rc = dfl_chat_render_text(NULL, NULL, NULL, NULL, m, 1, 1, 1, buf, sizeof buf, &e);
    CHECK(rc == 56 && strlen(buf) == 7 && !memcmp(buf, "<|im_st", 7), "ChatML, truncated like snprintf: %d %s",
          rc, buf);
    rc = dfl_chat_render_text(NULL, "vicuna", NULL, NULL, m, 1, 1, 1, buf, sizeof buf, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "vicuna") && strstr(e.msg, "chatml"), "unknown name: %s", e.msg);
    rc = dfl_chat_render_text(NULL, NULL, NULL, NULL, m, 0, 1, 1, buf, sizeof buf, &e);
    CHECK(rc == DFL_EARG, "no messages: %s", e.msg);
    char out[256];
    rc = dfl_chat_render_vars("{{ bos_token }}{{ messages[0].content | tojson }}|{{ tools }}|{{ x }}", "<s>", "</s>",
                              "[{\"role\":\"user\",\"content\":\"a\\u0000b\u00e9\"}]", NULL,
                              "{\"x\": 1.0}", 0, 0, out, sizeof out, &e);
    CHECK(rc > 0 && !strcmp(out, "<s>\"a\\u0000b\u00e9\"|None|1.0"), "variables: %d %s", rc, rc > 0 ? out : e.msg);
    rc = dfl_chat_render_vars("{{ 1 }}", NULL, NULL, "[{", NULL, NULL, 0, 0, out, sizeof out, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "JSON"), "bad messages JSON: %s", e.msg);
}

int main(void) {
    test_hf_jinja();
    test_sandbox();
    test_api();
    return test_summary();
}
