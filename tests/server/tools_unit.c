/* tools_unit.c - the tool-call parser and the required-call schema
 * (src/server/tools.c): per family, model outputs (good, malformed, unknown
 * tools, plain text that looks like a call) against the expected text and
 * calls; the same outputs split at every byte boundary, byte by byte and at
 * random must give the same text and calls (what streams equals what does
 * not); the schema, prefix and suffix of a required call; family detection
 * on the real templates. Built and run by tests/test_server_tools_unit.sh. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"
#include "testutil.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]";

static srv_tools *make_tools(int family, int parallel) {
    srv_tools *t = calloc(1, sizeof *t);
    t->family = family;
    t->parallel = parallel;
    t->list = cJSON_Parse(TOOLS);
    return t;
}

/* Runs text through a parser in pieces cut at cuts[0..n_cuts) (ascending). */
static void run(const srv_tools *t, const char *text, const size_t *cuts, int n_cuts,
                srv_buf *content, char **calls_json) {
    srv_toolp p;
    cJSON *calls = cJSON_CreateArray();
    srv_toolp_init(&p, t);
    size_t at = 0, n = strlen(text);
    for (int k = 0; k <= n_cuts; k++) {
        size_t end = k < n_cuts ? cuts[k] : n;
        srv_toolp_push(&p, text + at, end - at, k == n_cuts, content, calls);
        at = end;
    }
    srv_buf_put(content, "", 0);
    *calls_json = cJSON_PrintUnformatted(calls);
    cJSON_Delete(calls);
    srv_toolp_free(&p);
}

typedef struct {
    int family, parallel;
    const char *text, *content, *calls;
} tcase;

#define GW(city) "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"" city "\\\"}\"}"
#define GT "{\"name\":\"get_time\",\"arguments\":\"{}\"}"
#define H SRV_TOOLS_HERMES
#define L SRV_TOOLS_LLAMA3
#define M SRV_TOOLS_MISTRAL
#define X SRV_TOOLS_QWEN_XML

static const tcase cases[] = {
    /* hermes / Qwen */
    {H, 1, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     "", "[" GW("Paris") "]"},
    {H, 1, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
           "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n",
     "", "[" GW("Paris") "," GT "]"},
    {H, 1, "Let me check.\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
     "Let me check.", "[" GT "]"},
    {H, 1, "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>", "[]"},
    {H, 1, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call> ok",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call> ok", "[]"},
    {H, 1, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [1]}\n</tool_call>", "[]"},
    {H, 1, "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}", "", "[" GT "]"},
    {H, 1, "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}", "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}", "[]"},
    {H, 1, "a < b <tool", "a < b <tool", "[]"},
    {H, 1, "Hello \n", "Hello \n", "[]"},
    {H, 1, "<tool_call>{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Rome\\\"}\"}</tool_call>",
     "", "[" GW("Rome") "]"},
    {H, 1, "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{}}\n</tool_call>\nDone.", "\nDone.", "[" GT "]"},
    {H, 0, "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>\n"
           "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
     "\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>", "[" GT "]"},
    {H, 1, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"K\xC3\xB8" "benhavn \\\"}\"}}\n</tool_call>",
     "", "[{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"K\xC3\xB8" "benhavn \\\\\\\"}\\\"}\"}]"},
    {H, 1, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}} trailing\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}} trailing\n</tool_call>", "[]"},
    /* qwen-xml (Qwen3.5, Qwen3-Coder) */
    {X, 1, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "", "[{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}]"},
    {X, 1, "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=n>\n42\n</parameter>\n<parameter=flag>\nTrue\n</parameter>\n<parameter=none>\nNone\n</parameter>\n<parameter=obj>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=text>\nline 1\nline 2\n</parameter>\n</function>\n</tool_call>",
     "I will check.", "[{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"42\\\"}\"},{\"name\":\"get_time\",\"arguments\":\"{\\\"n\\\":42,\\\"flag\\\":true,\\\"none\\\":null,\\\"obj\\\":{\\\"a\\\":[1,2]},\\\"text\\\":\\\"line 1\\\\nline 2\\\"}\"}]"},
    {X, 1, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
     "", "[{\"name\":\"get_time\",\"arguments\":\"{}\"}]"},
    {X, 1, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
     "", "[{\"name\":\"get_time\",\"arguments\":\"{}\"}]"},
    {X, 1, "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
     "<tool_call>\n<function=launch>\n</function>\n</tool_call>", "[]"},
    {X, 1, "<tool_call>\n<function=get_time>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
     "<tool_call>\n<function=get_time>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "[]"},
    {X, 1, "<tool_call>\n<function=get_time>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=get_time>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>", "[]"},
    {X, 1, "<tool_call>\n<function=get_time>\n<parameter=a>\n1\n</function>\n</tool_call>",
     "<tool_call>\n<function=get_time>\n<parameter=a>\n1\n</function>\n</tool_call>", "[]"},
    {X, 1, "<tool_call>\n<function=get_time>\n</function> junk\n</tool_call>",
     "<tool_call>\n<function=get_time>\n</function> junk\n</tool_call>", "[]"},
    {X, 1, "<tool_call>\n<function=get_time>\n</function>\n",
     "", "[{\"name\":\"get_time\",\"arguments\":\"{}\"}]"},
    /* llama 3.x */
    {L, 1, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "[" GW("Paris") "]"},
    {L, 1, "\n {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n", "", "[" GW("Paris") "]"},
    {L, 1, "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", "", "[" GT "]"},
    {L, 1, "The answer is {\"name\": \"get_time\", \"parameters\": {}}",
     "The answer is {\"name\": \"get_time\", \"parameters\": {}}", "[]"},
    {L, 1, "{\"a\": 1}", "{\"a\": 1}", "[]"},
    {L, 1, "{\"name\": \"nope\", \"parameters\": {}}", "{\"name\": \"nope\", \"parameters\": {}}", "[]"},
    {L, 1, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"",
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"", "[]"},
    {L, 1, "{\"x\": ]}", "{\"x\": ]}", "[]"},
    {L, 1, "<|python_tag|>print(1)", "<|python_tag|>print(1)", "[]"},
    /* mistral */
    {M, 1, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
           "{\"name\": \"get_time\", \"arguments\": {}}]",
     "", "[" GW("Paris") "," GT "]"},
    {M, 1, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "", "[" GW("Paris") "]"},
    {M, 1, "[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{\"city\": \"Paris\"}"
           "[TOOL_CALLS]get_time[ARGS]{}",
     "", "[" GW("Paris") "," GT "]"},
    {M, 1, "[TOOL_CALLS] bad", "[TOOL_CALLS] bad", "[]"},
    {M, 1, "Sure.[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}]", "Sure.", "[" GT "]"},
    {M, 1, "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}, {\"name\":\"x\",\"arguments\":{}}]",
     "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}, {\"name\":\"x\",\"arguments\":{}}]", "[]"},
    {M, 0, "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}, {\"name\":\"get_time\",\"arguments\":{}}]",
     "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}, {\"name\":\"get_time\",\"arguments\":{}}]", "[]"},
    {M, 1, "[TOOL_CALLS]get_time[ARGS]{\"a\":[}", "[TOOL_CALLS]get_time[ARGS]{\"a\":[}", "[]"},
    {M, 1, "[TOOL_CALLS][]", "[TOOL_CALLS][]", "[]"},
#define NAME65 "get_time_get_time_get_time_get_time_get_time_get_time_get_time_ab"
    {M, 1, "[TOOL_CALLS]" NAME65 "[ARGS]{}", "[TOOL_CALLS]" NAME65 "[ARGS]{}", "[]"},
    {M, 1, "[TOOL_CALLS]get_time[CALL_ID]" NAME65 "[ARGS]{}", "[TOOL_CALLS]get_time[CALL_ID]" NAME65 "[ARGS]{}", "[]"},
    {M, 1, "[TOOL_CALLS]get_time[CALL_ID]x\\[ARGS]{\"s\": \"a\\\"}\\\\\"}", "",
     "[{\"name\":\"get_time\",\"arguments\":\"{\\\"s\\\":\\\"a\\\\\\\"}\\\\\\\\\\\"}\"}]"},
    {M, 1, "no calls [TOOL", "no calls [TOOL", "[]"},
};

static void check_case(const tcase *c) {
    srv_tools *t = make_tools(c->family, c->parallel);
    size_t n = strlen(c->text);
    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    srv_buf content = {0};
    char *calls;
    /* whole, then two pieces at every boundary, then byte by byte */
    for (size_t split = 0; split <= n + 1; split++) {
        int n_cuts = 0;
        if (split == n + 1) for (size_t i = 1; i < n; i++) cuts[n_cuts++] = i;
        else if (split) cuts[n_cuts++] = split;
        content.len = 0;
        run(t, c->text, cuts, n_cuts, &content, &calls);
        CHECK(!strcmp(content.p, c->content), "[%s] %s\n  split %zu: content %s\n  want %s",
              srv_tools_family_name(c->family), c->text, split, content.p, c->content);
        CHECK(!strcmp(calls, c->calls), "[%s] %s\n  split %zu: calls %s\n  want %s",
              srv_tools_family_name(c->family), c->text, split, calls, c->calls);
        free(calls);
    }
    srv_buf_free(&content);
    free(cuts);
    srv_tools_free(t);
}

/* Random outputs made of call-like fragments: any split gives what the whole gives. */
static uint64_t rng = 88172645463325252ULL;
static unsigned rnd(unsigned n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng % n);
}

static void random_splits(void) {
    static const char *frag[] = {
        "<tool_call>", "</tool_call>", "\n", " ", "{", "}", "[", "]", "\"", "\\", "text",
        "{\"name\":\"get_time\",\"arguments\":{}}", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\"}}",
        "[TOOL_CALLS]", "get_time", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "<tool", "[TOOL", "\xC3\xA9",
        "<function=get_time>", "</function>", "<parameter=a>", "</parameter>", "<function=",
    };
    int n_frag = (int)(sizeof frag / sizeof *frag);
    for (int family = 0; family < 4; family++) {
        srv_tools *t = make_tools(family, (int)rnd(2));
        for (int it = 0; it < 2000; it++) {
            char text[512] = "";
            int k = 1 + (int)rnd(12);
            for (int i = 0; i < k; i++) strcat(text, frag[rnd((unsigned)n_frag)]);
            size_t n = strlen(text), cuts[64];
            int n_cuts = 0;
            for (size_t i = 1; i < n && n_cuts < 64; i++)
                if (!rnd(4)) cuts[n_cuts++] = i;
            srv_buf whole = {0}, parts = {0};
            char *cw, *cp;
            run(t, text, NULL, 0, &whole, &cw);
            run(t, text, cuts, n_cuts, &parts, &cp);
            CHECK(!strcmp(whole.p, parts.p) && !strcmp(cw, cp), "[%s] %s: %s | %s vs %s | %s",
                  srv_tools_family_name(family), text, whole.p, cw, parts.p, cp);
            free(cw), free(cp);
            srv_buf_free(&whole), srv_buf_free(&parts);
        }
        srv_tools_free(t);
    }
}

/* As the server's worker chains them: reasoning split off first, then the
 * answer read for calls; at every split the same reasoning, text and calls. */
static void check_with_think(void) {
    static const char text[] = "<think>\nI should call get_time.\n</think>\n\n"
                               "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    srv_tools *t = make_tools(SRV_TOOLS_HERMES, 1);
    size_t n = sizeof text - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        srv_think th;
        srv_toolp p;
        srv_buf reason = {0}, answer = {0}, content = {0};
        cJSON *calls = cJSON_CreateArray();
        srv_think_init(&th, 1, "", 0);
        srv_toolp_init(&p, t);
        const char *piece[2] = {text, text + cut};
        size_t len[2] = {cut, n - cut};
        for (int k = 0; k < 2; k++) {
            answer.len = 0;
            srv_think_push(&th, piece[k], len[k], k == 1, &reason, &answer);
            srv_toolp_push(&p, answer.p ? answer.p : "", answer.len, k == 1, &content, calls);
        }
        srv_buf_put(&reason, "", 0), srv_buf_put(&content, "", 0);
        char *cj = cJSON_PrintUnformatted(calls);
        CHECK(!strcmp(reason.p, "\nI should call get_time.\n") && !strcmp(content.p, "") &&
                  !strcmp(cj, "[" GT "]"),
              "think then call, cut %zu: reasoning %s content %s calls %s", cut, reason.p, content.p, cj);
        free(cj);
        cJSON_Delete(calls);
        srv_think_free(&th), srv_toolp_free(&p);
        srv_buf_free(&reason), srv_buf_free(&answer), srv_buf_free(&content);
    }
    srv_tools_free(t);
}

static void check_format(void) {
    char *schema, *pre, *suf;
    srv_tools *t = make_tools(SRV_TOOLS_HERMES, 1);
    t->choice = SRV_CHOICE_AUTO;
    CHECK(srv_tools_format(t, &schema, &pre, &suf) == 0 && !schema, "auto needs no format");
    t->choice = SRV_CHOICE_REQUIRED;
    CHECK(srv_tools_format(t, &schema, &pre, &suf) == 1, "required");
    const char *want =
        "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},"
        "\"arguments\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false},"
        "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_time\"},\"arguments\":"
        "{\"type\":\"object\"}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}]}";
    CHECK(!strcmp(schema, want), "hermes schema %s", schema);
    CHECK(!strcmp(pre, "<tool_call>\n") && !strcmp(suf, "\n</tool_call>"), "hermes %s %s", pre, suf);
    free(schema), free(pre), free(suf);

    t->family = SRV_TOOLS_LLAMA3;
    t->choice = SRV_CHOICE_NAMED;
    t->forced = strdup("get_time");
    CHECK(srv_tools_format(t, &schema, &pre, &suf) == 1, "named");
    CHECK(!strcmp(schema, "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_time\"},"
                          "\"parameters\":{\"type\":\"object\"}},\"required\":[\"name\",\"parameters\"],"
                          "\"additionalProperties\":false}"),
          "llama3 schema %s", schema);
    CHECK(!strcmp(pre, "") && !strcmp(suf, ""), "llama3 %s %s", pre, suf);
    free(schema), free(pre), free(suf);

    t->family = SRV_TOOLS_MISTRAL;
    CHECK(srv_tools_format(t, &schema, &pre, &suf) == 1, "mistral");
    CHECK(strstr(schema, "\"arguments\"") && !strcmp(pre, "[TOOL_CALLS][") && !strcmp(suf, "]"),
          "mistral %s %s %s", schema, pre, suf);
    free(schema), free(pre), free(suf);
    /* what each family's format admits, its parser takes as a call */
    for (int family = 0; family < 4; family++) {
        srv_buf text = {0}, content = {0};
        char *calls;
        t->family = family;
        CHECK(srv_tools_format(t, &schema, &pre, &suf) == 1, "format %d", family);
        srv_buf_puts(&text, pre);
        srv_buf_puts(&text, family == SRV_TOOLS_LLAMA3 ? "{\"name\":\"get_time\",\"parameters\":{}}"
                                                       : "{\"name\":\"get_time\",\"arguments\":{}}");
        srv_buf_puts(&text, suf);
        run(t, text.p, NULL, 0, &content, &calls);
        CHECK(!strcmp(calls, "[" GT "]") && !content.p[0], "%s: the format's output parses: %s",
              srv_tools_family_name(family), calls);
        free(calls), free(schema), free(pre), free(suf);
        srv_buf_free(&text), srv_buf_free(&content);
    }
    srv_tools_free(t);
}

static void check_ids(void) {
    char a[SRV_CALL_ID_MAX], b[SRV_CALL_ID_MAX];
    srv_tools_call_id(SRV_TOOLS_HERMES, a);
    srv_tools_call_id(SRV_TOOLS_HERMES, b);
    CHECK(strlen(a) == 29 && !strncmp(a, "call_", 5) && strcmp(a, b), "ids %s %s", a, b);
    srv_tools_call_id(SRV_TOOLS_MISTRAL, a);
    int alnum = 1;
    for (const char *s = a; *s; s++) alnum &= (*s >= '0' && *s <= '9') || ((*s | 32) >= 'a' && (*s | 32) <= 'z');
    CHECK(strlen(a) == 9 && alnum, "mistral id %s", a);
}

/* Family detection on the real templates (assets). */
static void check_families(void) {
    static const struct { const char *file; int family; } want[] = {
        {"Qwen-Qwen3-0.6B.jinja", SRV_TOOLS_HERMES},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", SRV_TOOLS_HERMES},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", SRV_TOOLS_LLAMA3},
        {"meta-llama-Llama-3.3-70B-Instruct.jinja", SRV_TOOLS_LLAMA3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", SRV_TOOLS_MISTRAL},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", SRV_TOOLS_MISTRAL},
        {"mistralai-Ministral-3-14B-Reasoning-2512.jinja", SRV_TOOLS_MISTRAL},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", SRV_TOOLS_HERMES},
        {"Qwen3.5-4B.jinja", SRV_TOOLS_QWEN_XML},
        {"Qwen3-Coder.jinja", SRV_TOOLS_QWEN_XML},
        {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", SRV_TOOLS_QWEN_XML},
        {"StepFun3.5-Flash.jinja", SRV_TOOLS_QWEN_XML},
        {"google-gemma-2-2b-it.jinja", SRV_TOOLS_HERMES},   /* no syntax: the default */
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "chat_templates/real/%s", want[i].file);
        const char *path = test_asset(rel);
        FILE *f = path ? fopen(path, "rb") : NULL;
        if (!f) continue;
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        int got = srv_tools_family(buf);
        CHECK(got == want[i].family, "%s: %s, want %s", want[i].file, srv_tools_family_name(got),
              srv_tools_family_name(want[i].family));
    }
}

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_case(&cases[i]);
    random_splits();
    check_with_think();
    check_format();
    check_ids();
    check_families();
    return test_summary();
}
