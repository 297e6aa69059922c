/* unit.c - the server's text pieces against plain references: the stop-string
 * matcher (random texts, stops and token splits vs a naive search of the text
 * so far), UTF-8 checks, the JSON nesting scan, the secret compare, the web
 * page's URL -> file rules (--path) and content types.
 * Built and run by tests/test_server_unit.sh with src/server/{stop,text,static}.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static int passed, failed;
#define CHECK(c, ...)                                                   \
    do {                                                                \
        if (c) passed++;                                                \
        else {                                                          \
            failed++;                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, "\n");                                      \
        }                                                               \
    } while (0)

static uint64_t rng = 88172645463325252ULL;
static unsigned rnd(unsigned n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng % n);
}

/* Characters of 1..4 bytes, so splits and stops meet multi-byte text. */
static const char *alphabet[] = {"a", "b", "c", " ", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x99\x82"};
enum { N_ALPHA = 7 };

static void random_chars(char *out, int n_chars) {
    out[0] = 0;
    for (int i = 0; i < n_chars; i++) strcat(out, alphabet[rnd(N_ALPHA)]);
}

/* Reference: after each piece, the earliest occurrence of any stop in the
 * whole text so far ends the output there. */
static int naive(char **stops, int n_stop, char **pieces, int n_pieces, char *out) {
    char text[4096] = "";
    for (int p = 0; p < n_pieces; p++) {
        strcat(text, pieces[p]);
        long best = -1;
        for (int k = 0; k < n_stop; k++) {
            char *at = strstr(text, stops[k]);
            if (at && (best < 0 || at - text < best)) best = at - text;
        }
        if (best >= 0) {
            memcpy(out, text, (size_t)best);
            out[best] = 0;
            return 1;
        }
    }
    strcpy(out, text);
    return 0;
}

static void test_stop_random(void) {
    int mismatches = 0;
    for (int iter = 0; iter < 20000; iter++) {
        srv_stop s = {0};
        s.n_stop = 1 + (int)rnd(3);
        for (int k = 0; k < s.n_stop; k++) {
            s.stop[k] = malloc(32);
            random_chars(s.stop[k], 1 + (int)rnd(4));
        }
        char *pieces[64];
        int n_pieces = 1 + (int)rnd(40);
        for (int p = 0; p < n_pieces; p++) {
            pieces[p] = malloc(32);
            random_chars(pieces[p], (int)rnd(4));   /* empty pieces too (special tokens) */
        }
        char want[4096], got[4096] = "";
        int want_hit = naive(s.stop, s.n_stop, pieces, n_pieces, want), hit = 0;
        for (int p = 0; p < n_pieces && !hit; p++) {
            const char *out;
            size_t n;
            hit = srv_stop_push(&s, pieces[p], strlen(pieces[p]), 0, &out, &n);
            CHECK(srv_utf8_valid(out, n), "a release splits a character");
            strncat(got, out, n);
        }
        if (!hit) {
            const char *out;
            size_t n;
            hit = srv_stop_push(&s, "", 0, 1, &out, &n);
            strncat(got, out, n);
        }
        if (hit != want_hit || strcmp(got, want)) {
            if (mismatches++ < 5)
                fprintf(stderr, "stop mismatch: got '%s' (hit %d), want '%s' (hit %d)\n", got, hit,
                        want, want_hit);
        }
        for (int p = 0; p < n_pieces; p++) free(pieces[p]);
        srv_stop_free(&s);
    }
    CHECK(mismatches == 0, "%d of 20000 random cases differ from the naive search", mismatches);
}

static void test_stop_cases(void) {
    /* "STOP" arrives as "ST" + "OP": the "ST" is held back, never sent. */
    srv_stop s = {0};
    s.stop[s.n_stop++] = strdup("STOP");
    const char *out;
    size_t n;
    CHECK(!srv_stop_push(&s, "hello ST", 8, 0, &out, &n) && n == 6 && !memcmp(out, "hello ", 6),
          "held back: '%.*s'", (int)n, out);
    CHECK(srv_stop_push(&s, "OP and more", 11, 0, &out, &n) && n == 0, "stop found across pieces");
    CHECK(srv_stop_push(&s, "x", 1, 1, &out, &n) && n == 0, "nothing after a stop");
    srv_stop_free(&s);
    /* A false start is released once it cannot be a stop any more. */
    srv_stop t = {0};
    t.stop[t.n_stop++] = strdup("abc");
    CHECK(!srv_stop_push(&t, "xab", 3, 0, &out, &n) && n == 1, "'ab' held");
    CHECK(!srv_stop_push(&t, "d", 1, 0, &out, &n) && n == 3 && !memcmp(out, "abd", 3),
          "released: '%.*s'", (int)n, out);
    CHECK(!srv_stop_push(&t, "ab", 2, 1, &out, &n) && n == 2, "final releases what is held");
    srv_stop_free(&t);
}

static void test_utf8(void) {
    static const struct {
        const char *s;
        int ok;
    } cases[] = {
        {"plain", 1},          {"\xC3\xA9", 1},         {"\xF0\x9F\x99\x82", 1},
        {"\xC3", 0},           {"\xC0\xAF", 0},         {"\xE0\x80\xAF", 0}, /* overlong */
        {"\xED\xA0\x80", 0},   /* surrogate */          {"\xF4\x90\x80\x80", 0}, /* > U+10FFFF */
        {"\x80", 0},           {"\xFF", 0},             {"a\xE6\x97", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(srv_utf8_valid(cases[i].s, strlen(cases[i].s)) == cases[i].ok, "case %zu", i);
    CHECK(!srv_utf8_valid("a\0b", 3), "NUL refused");
    srv_buf b = {0};
    srv_utf8_sanitize(&b, "a\xFF" "b\xC3", 4);
    CHECK(b.len == 8 && !memcmp(b.p, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8), "sanitize: %s", b.p);
    srv_buf_free(&b);
}

static void test_json_depth(void) {
    CHECK(!srv_json_check("{\"a\":[1,{\"b\":2}]}", 17, 3), "depth 3 ok");
    CHECK(srv_json_check("{\"a\":[1,{\"b\":2}]}", 17, 2) == SRV_JSON_DEEP, "depth 3 > 2");
    CHECK(!srv_json_check("{\"a\":\"[[[[{{{{\\\"[[[\"}", 21, 1), "brackets in strings do not count");
    char deep[2001];
    memset(deep, '[', 1000);
    memset(deep + 1000, ']', 1000);
    deep[2000] = 0;
    CHECK(srv_json_check(deep, 2000, 64) == SRV_JSON_DEEP, "1000 levels refused");
    const char *nul = "{\"stop\":\"a\\u0000zzz\"}", *esc = "{\"s\":\"a\\\\u0000\"}";
    CHECK(srv_json_check(nul, strlen(nul), 8) == SRV_JSON_NUL, "\\u0000 in a string refused");
    CHECK(!srv_json_check(esc, strlen(esc), 8), "an escaped backslash before u0000 is text");
    const char *nul1 = "{\"s\":\"\\u00001\"}", *one = "{\"s\":\"\\u0001\"}";
    CHECK(srv_json_check(nul1, strlen(nul1), 8) == SRV_JSON_NUL, "\\u0000 then a digit is U+0000");
    CHECK(!srv_json_check(one, strlen(one), 8), "\\u0001 is fine");
    /* values counted before cJSON allocates: commas and brackets outside strings */
    const char *arr = "{\"p\":[1,2,3,4],\"s\":\"a,b,c,[d]\"}";   /* 7 by the count */
    CHECK(!srv_json_check_items(arr, strlen(arr), 8, 7), "7 values allowed");
    CHECK(srv_json_check_items(arr, strlen(arr), 8, 6) == SRV_JSON_ITEMS, "7 values > 6");
    CHECK(!srv_json_check_items("\"a,,,,,,\"", 9, 8, 1), "commas in strings do not count");
}

static void test_buf_reserve(void) {
    srv_buf b = {0};
    CHECK(!srv_buf_reserve(&b, 1000) && b.cap >= 1001 && b.len == 0, "reserve 1000");
    char *p = b.p;
    srv_buf_put(&b, "x", 1);
    CHECK(b.p == p, "a put within the reserve does not move the buffer");
    CHECK(srv_buf_reserve(&b, SIZE_MAX / 2) == -1 && b.p == p && b.len == 1,
          "an absurd reserve fails and leaves the buffer");
    srv_buf_free(&b);
}

static void test_secret(void) {
    CHECK(srv_secret_equal("sekrit", "sekrit"), "equal");
    CHECK(!srv_secret_equal("sekrit", "sekrix"), "last byte differs");
    CHECK(!srv_secret_equal("sekrit", "sekri"), "shorter");
    CHECK(!srv_secret_equal("sekrit", "sekrit2"), "longer");
    CHECK(!srv_secret_equal("sekrit", ""), "empty");
}

/* Pushes text in random pieces through a splitter; reason / content get the halves. */
static void think_run(srv_think *t, const char *text, srv_buf *reason, srv_buf *content) {
    size_t n = strlen(text), a = 0;
    while (a < n) {
        size_t m = 1 + rnd(6);
        if (a + m > n) m = n - a;
        srv_think_push(t, text + a, m, 0, reason, content);
        a += m;
    }
    srv_think_push(t, "", 0, 1, reason, content);
}

static int think_case(int on, const char *prompt, const char *out, const char *want_r,
                      const char *want_c) {
    srv_think t;
    srv_buf r = {0}, c = {0};
    srv_think_init(&t, on, prompt, strlen(prompt));
    think_run(&t, out, &r, &c);
    int ok = !strcmp(r.p ? r.p : "", want_r) && !strcmp(c.p ? c.p : "", want_c);
    if (!ok) fprintf(stderr, "think: '%s' -> reasoning '%s', content '%s'\n", out, r.p ? r.p : "",
                     c.p ? c.p : "");
    srv_think_free(&t), srv_buf_free(&r), srv_buf_free(&c);
    return ok;
}

/* <think> blocks split off, with every tag cut across pieces at random. */
static void test_think(void) {
    const char *q3 = "<|im_start|>assistant\n", *r1 = "<|im_start|>assistant\n<think>\n";
    for (int k = 0; k < 200; k++) {
        CHECK(think_case(1, q3, "<think>\nLet me see: 2 < 3.\n</think>\n\nIt is 5.",
                         "\nLet me see: 2 < 3.\n", "It is 5."), "a block, then the answer");
        CHECK(think_case(1, q3, "\n<think></think>\n\n</think> <thin", "", "</think> <thin"),
              "an empty block; later tags are answer text");
        CHECK(think_case(1, q3, "No thinking here <think>x</think>", "",
                         "No thinking here <think>x</think>"), "no leading block: all answer");
        CHECK(think_case(1, r1, "plan \xC3\xA9</think>\n\nanswer", "plan \xC3\xA9", "answer"),
              "a template that opened the block: the output starts inside it");
        CHECK(think_case(1, q3, "<think>never closed", "never closed", ""),
              "an unclosed block is all reasoning");
        CHECK(think_case(1, q3, "<thi", "", "<thi"), "half a tag at the end is answer text");
        CHECK(think_case(0, r1, "<think>a</think>b", "", "<think>a</think>b"),
              "--reasoning-format none: all of it is content");
    }
}

/* --path: a URL names a file below the folder, or nothing. */
static void test_static(void) {
    static const struct {
        const char *url, *want;   /* want NULL: refused */
    } cases[] = {
        {"/", "/w/index.html"},           {"/index.html", "/w/index.html"},
        {"/a/b.css", "/w/a/b.css"},       {"/a/", "/w/a/index.html"},
        {"/..", NULL},                    {"/../etc/passwd", NULL},
        {"/a/../../x", NULL},             {"/a/./b", NULL},
        {"/.env", NULL},                  {"/a/.git/config", NULL},
        {"//etc/passwd", NULL},           {"/a//b", NULL},
        {"", NULL},                       {"a.html", NULL},
        {"/a\\..\\b", NULL},              {"/a\nb", NULL},
        {"/a\x7f", NULL},                 {"/ok..name", "/w/ok..name"},
    };
    char out[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = srv_static_path("/w", cases[i].url, out, sizeof out);
        if (cases[i].want) CHECK(rc == 0 && !strcmp(out, cases[i].want), "%s -> %s", cases[i].url, out);
        else CHECK(rc == -1, "%s is refused", cases[i].url);
    }
    char big[SRV_STATIC_URL_MAX + 8];
    memset(big, 'a', sizeof big - 1);
    big[0] = '/', big[sizeof big - 1] = 0;
    CHECK(srv_static_path("/w", big, out, sizeof out) == -1, "an over-long URL is refused");
    CHECK(srv_static_path("/w", "/abcdefghijklmnopqrstuvwxyz/abcdefghijklmnopqrstuvwxyz/abcdefghij", out,
                          sizeof out) == -1, "a path longer than the buffer is refused");
    CHECK(!strcmp(srv_static_type("/w/index.HTML"), "text/html; charset=utf-8") &&
          !strcmp(srv_static_type("/w/app.js"), "text/javascript; charset=utf-8") &&
          !strcmp(srv_static_type("/w/x.png"), "image/png") &&
          !strcmp(srv_static_type("/w.d/noext"), "application/octet-stream") &&
          !strcmp(srv_static_type("/w/a.exe"), "application/octet-stream"), "content types");
}

int main(void) {
    test_static();
    test_think();
    test_stop_cases();
    test_stop_random();
    test_utf8();
    test_json_depth();
    test_buf_reserve();
    test_secret();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
