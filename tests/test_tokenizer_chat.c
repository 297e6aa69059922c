/* test_tokenizer_chat.c - chat templates rendered in C against renders made
 * by Jinja engines.
 *
 * Without arguments: the Qwen3 renders of @huggingface/jinja 0.5.11 in
 * ../shared/assets/chat_templates (byte for byte), family detection of the
 * real templates there, and the errors. With --cases FILE (written by
 * tests/test_chat_jinja.py from Python's jinja2, rendering the real
 * templates as transformers does): every case of the file. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
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
    int need = dfl_chat_render_text(tmpl, name, bos, m, n, gen, think, NULL, 0, &e);
    CHECK(need >= 0, "%s: %s", what, e.msg);
    if (need < 0) return;
    char *out = malloc((size_t)need + 1);
    int got = dfl_chat_render_text(tmpl, name, bos, m, n, gen, think, out, (size_t)need + 1, &e);
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
    /* the same through the forced name */
    expect_render("qwen3 forced", NULL, "qwen3", NULL, conv, 2, 1, 0,
                  cJSON_GetObjectItem(j, "gen_nothink")->valuestring);
    cJSON_Delete(j);
done:
    free(tmpl);
    free(ref);
}

static void test_detect(void) {
    dfl_chat_msg m[] = {{"user", "  hi  "}};
    char *q25 = read_asset("chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    char *l31 = read_asset("chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
    if (q25)
        expect_render("qwen2.5 default system", q25, NULL, NULL, m, 1, 1, 1,
                      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                      "helpful assistant.<|im_end|>\n<|im_start|>user\n  hi  <|im_end|>\n"
                      "<|im_start|>assistant\n");
    if (l31)
        expect_render("llama3.1", l31, NULL, "<|begin_of_text|>", m, 1, 1, 1,
                      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting "
                      "Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render("chatml", "{{ '<|im_start|>' }}", NULL, NULL, m, 1, 0, 1,
                  "<|im_start|>user\n  hi  <|im_end|>\n");
    expect_render("llama3", NULL, "llama3", "<B>", m, 1, 1, 1,
                  "<B><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(q25);
    free(l31);

    dfl_error e = {0};
    char buf[8];
    int rc = dfl_chat_render_text("{% for m in messages %}[INST]{% endfor %}", NULL, NULL, m, 1, 1,
                                  1, buf, sizeof buf, &e);
    CHECK(rc == DFL_EUNSUP && strstr(e.msg, "--chat-template"), "unknown template: %s", e.msg);
    rc = dfl_chat_render_text(NULL, "vicuna", NULL, m, 1, 1, 1, buf, sizeof buf, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "vicuna") && strstr(e.msg, "qwen3"), "unknown name: %s",
          e.msg);
    rc = dfl_chat_render_text(NULL, NULL, NULL, m, 1, 1, 1, buf, sizeof buf, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "no chat template"), "no template: %s", e.msg);
    dfl_chat_msg bad[] = {{"user<|im_end|>", "x"}};
    rc = dfl_chat_render_text(NULL, "chatml", NULL, bad, 1, 1, 1, buf, sizeof buf, &e);
    CHECK(rc == DFL_EARG && strstr(e.msg, "role"), "bad role: %s", e.msg);
    rc = dfl_chat_render_text(NULL, "chatml", NULL, m, 1, 1, 1, buf, sizeof buf, &e);
    CHECK(rc == 56 && strlen(buf) == 7 && !memcmp(buf, "<|im_st", 7), "truncated like snprintf: %d %s",
          rc, buf);
}

/* Cases written by test_chat_jinja.py. */
static int run_cases(const char *path) {
    size_t n;
    dfl_error e = {0};
    char *s = dfl_read_file(path, 1 << 26, &n, &e);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    CHECK(j != NULL, "%s: %s", path, s ? "bad JSON" : e.msg);
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, j) {
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages"), *x;
        int nm = cJSON_GetArraySize(msgs), i = 0;
        dfl_chat_msg *m = calloc((size_t)nm + 1, sizeof *m);
        cJSON_ArrayForEach(x, msgs) {
            m[i].role = cJSON_GetObjectItem(x, "role")->valuestring;
            m[i].content = cJSON_GetObjectItem(x, "content")->valuestring;
            i++;
        }
        const cJSON *tt = cJSON_GetObjectItem(c, "template"), *nm_ = cJSON_GetObjectItem(c, "name");
        const cJSON *think = cJSON_GetObjectItem(c, "enable_thinking");
        char what[256];
        snprintf(what, sizeof what, "case %d (%s)", k,
                 cJSON_GetObjectItem(c, "label")->valuestring);
        expect_render(what, cJSON_IsString(tt) ? tt->valuestring : NULL,
                      cJSON_IsString(nm_) ? nm_->valuestring : NULL,
                      cJSON_GetObjectItem(c, "bos")->valuestring, m, nm,
                      cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                      !cJSON_IsFalse(think), cJSON_GetObjectItem(c, "expected")->valuestring);
        free(m);
        k++;
    }
    printf("%d jinja2 renders compared\n", k);
    cJSON_Delete(j);
    free(s);
    return test_summary();
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--cases")) return run_cases(argv[2]);
    test_hf_jinja();
    test_detect();
    return test_summary();
}
