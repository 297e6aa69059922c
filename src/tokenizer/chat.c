/* chat.c - chat templates without a Jinja engine.
 *
 * A model's template is recognised by the marks its text contains and
 * rendered here in C, byte for byte as the Jinja template renders it for
 * plain system/user/assistant/tool messages. Families:
 *   chatml    <|im_start|>role\n...<|im_end|>\n
 *   qwen2.5   ChatML with Qwen's default system prompt
 *   qwen3     ChatML; <think> blocks of earlier assistant turns dropped,
 *             enable_thinking=false adds an empty think block to the prompt
 *   llama3    <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
 *   llama3.1  llama3 with the dated system header of Llama 3.1 */
#define _GNU_SOURCE
#include <string.h>

#include "tokenizer/tok_impl.h"

enum { FAM_CHATML, FAM_QWEN25, FAM_QWEN3, FAM_LLAMA3, FAM_LLAMA31, FAM_COUNT };
static const char *const fam_names[FAM_COUNT] = {"chatml", "qwen2.5", "qwen3", "llama3",
                                                  "llama3.1"};

/* Output that counts what it would need past cap, like snprintf. */
typedef struct out {
    char *p;
    size_t cap, n;
} out;

static void put_n(out *o, const char *s, size_t n) {
    if (o->n + 1 < o->cap) {
        size_t room = o->cap - 1 - o->n;
        memcpy(o->p + o->n, s, n < room ? n : room);
    }
    o->n += n;
}
static void put(out *o, const char *s) { put_n(o, s, strlen(s)); }

/* A slice of a message's text. */
typedef struct str {
    const char *s;
    size_t n;
} str;

static str mk(const char *s) { return (str){s ? s : "", s ? strlen(s) : 0}; }
static void put_s(out *o, str s) { put_n(o, s.s, s.n); }

/* Length of the whitespace character at the start of s (Python's
 * str.isspace: ASCII spaces, \x1c-\x1f, U+0085, U+00A0, U+1680, U+2000-200A,
 * U+2028, U+2029, U+202F, U+205F, U+3000), 0 if none. */
static int ws_len(const char *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    if (!n) return 0;
    if (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r') || (s[0] >= 0x1c && s[0] <= 0x1f)) return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n < 3) return 0;
    uint32_t cp = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    if ((s[0] & 0xf0) != 0xe0) return 0;
    return cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
                   cp == 0x202f || cp == 0x205f || cp == 0x3000
               ? 3
               : 0;
}

/* Python's strip() (Jinja's trim filter). */
static str trim(str s) {
    int l;
    while ((l = ws_len(s.s, s.n))) s.s += l, s.n -= (size_t)l;
    for (;;) { /* from the end: find the start of the last character */
        size_t k = s.n;
        while (k && ((unsigned char)s.s[k - 1] & 0xc0) == 0x80) k--;
        if (!k) break;
        k--;
        l = ws_len(s.s + k, s.n - k);
        if (!l || k + (size_t)l != s.n) break;
        s.n = k;
    }
    return s;
}

/* Python's json.dumps(s, ensure_ascii=False): Jinja's tojson in transformers. */
static void put_json(out *o, str s) {
    static const char hex[] = "0123456789abcdef";
    put(o, "\"");
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                      : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                      : c == '\f' ? "\\f" : NULL;
        if (e) {
            put(o, e);
        } else if (c < 0x20) {
            char u[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
            put(o, u);
        } else {
            put_n(o, s.s + i, 1);
        }
    }
    put(o, "\"");
}

static str lstrip_nl(str s) {
    while (s.n && s.s[0] == '\n') s.s++, s.n--;
    return s;
}
static str rstrip_nl(str s) {
    while (s.n && s.s[s.n - 1] == '\n') s.n--;
    return s;
}

static const char *find_last(str s, const char *pat) {
    size_t pn = strlen(pat);
    const char *last = NULL, *p = s.s, *end = s.s + s.n;
    while (p < end && (p = memmem(p, (size_t)(end - p), pat, pn))) {
        last = p;
        p += pn;
    }
    return last;
}

static int starts(str s, const char *p) { return s.n >= strlen(p) && !memcmp(s.s, p, strlen(p)); }
static int ends(str s, const char *p) {
    size_t n = strlen(p);
    return s.n >= n && !memcmp(s.s + s.n - n, p, n);
}

static int role_is(const dfl_chat_msg *m, const char *r) { return m->role && !strcmp(m->role, r); }

/* ---- ChatML family ---------------------------------------------------------------- */

static void im_turn(out *o, const char *role, str content) {
    put(o, "<|im_start|>");
    put(o, role);
    put(o, "\n");
    put_s(o, content);
    put(o, "<|im_end|>\n");
}

/* Consecutive tool results share one user turn. */
static void tool_turn(out *o, const dfl_chat_msg *m, int i, int n) {
    if (i == 0 || !role_is(&m[i - 1], "tool")) put(o, "<|im_start|>user");
    put(o, "\n<tool_response>\n");
    put_s(o, mk(m[i].content));
    put(o, "\n</tool_response>");
    if (i == n - 1 || !role_is(&m[i + 1], "tool")) put(o, "<|im_end|>\n");
}

static void render_chatml(out *o, int fam, const dfl_chat_msg *m, int n) {
    if (fam == FAM_QWEN25) {
        if (role_is(&m[0], "system")) im_turn(o, "system", mk(m[0].content));
        else im_turn(o, "system", mk("You are Qwen, created by Alibaba Cloud. You are a helpful "
                                     "assistant."));
    }
    for (int i = 0; i < n; i++) {
        if (fam == FAM_QWEN25 && i == 0 && role_is(&m[0], "system")) continue;
        if (fam == FAM_QWEN25 && role_is(&m[i], "tool")) tool_turn(o, m, i, n);
        else im_turn(o, m[i].role, mk(m[i].content));
    }
}

/* Qwen3: the reasoning of assistant turns before the last user query is
 * dropped; turns after it keep theirs inside <think>...</think>. */
static void qwen3_assistant(out *o, const dfl_chat_msg *m, int i, int n, int last_query) {
    str content = mk(m[i].content), reasoning = {"", 0};
    const char *close = memmem(content.s, content.n, "</think>", 8);
    if (close) {
        const char *last = find_last(content, "</think>");
        str before = rstrip_nl((str){content.s, (size_t)(close - content.s)});
        const char *open = find_last(before, "<think>");
        reasoning = open ? (str){open + 7, (size_t)(before.s + before.n - open - 7)} : before;
        reasoning = lstrip_nl(reasoning);
        content = lstrip_nl((str){last + 8, (size_t)(content.s + content.n - last - 8)});
    }
    put(o, "<|im_start|>assistant\n");
    if (i > last_query && (i == n - 1 || reasoning.n)) {
        put(o, "<think>\n");
        put_s(o, rstrip_nl(lstrip_nl(reasoning)));
        put(o, "\n</think>\n\n");
        put_s(o, lstrip_nl(content));
    } else {
        put_s(o, content);
    }
    put(o, "<|im_end|>\n");
}

static void render_qwen3(out *o, const dfl_chat_msg *m, int n) {
    if (role_is(&m[0], "system")) im_turn(o, "system", mk(m[0].content));
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        str c = mk(m[i].content);
        if (role_is(&m[i], "user") && !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i > 0))
            im_turn(o, m[i].role, mk(m[i].content));
        else if (role_is(&m[i], "assistant")) qwen3_assistant(o, m, i, n, last_query);
        else if (role_is(&m[i], "tool")) tool_turn(o, m, i, n);
    }
}

/* ---- Llama 3 -------------------------------------------------------------------------- */

static void header(out *o, const char *role) {
    put(o, "<|start_header_id|>");
    put(o, role);
    put(o, "<|end_header_id|>\n\n");
}

static void render_llama3(out *o, int fam, const char *bos, const dfl_chat_msg *m, int n) {
    int i = 0;
    if (fam == FAM_LLAMA31) {
        put(o, bos);
        str sys = {"", 0};
        if (role_is(&m[0], "system")) sys = trim(mk(m[i++].content));
        header(o, "system");
        put(o, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
        put_s(o, sys);
        put(o, "<|eot_id|>");
    }
    for (; i < n; i++) {
        if (fam == FAM_LLAMA3 && i == 0) put(o, bos);
        if (fam == FAM_LLAMA31 && (role_is(&m[i], "tool") || role_is(&m[i], "ipython"))) {
            header(o, "ipython"); /* a string "is iterable" in Jinja: the template JSON-encodes it */
            put_json(o, mk(m[i].content));
        } else {
            header(o, m[i].role);
            put_s(o, trim(mk(m[i].content)));
        }
        put(o, "<|eot_id|>");
    }
}

/* ---- entry ------------------------------------------------------------------------------ */

static int detect(const char *text) {
    if (strstr(text, "<|im_start|>")) {
        if (strstr(text, "<think>") || strstr(text, "</think>")) return FAM_QWEN3;
        if (strstr(text, "You are Qwen, created by Alibaba Cloud")) return FAM_QWEN25;
        return FAM_CHATML;
    }
    if (strstr(text, "<|start_header_id|>"))
        return strstr(text, "Cutting Knowledge Date") ? FAM_LLAMA31 : FAM_LLAMA3;
    return -1;
}

static int check_msgs(const dfl_chat_msg *m, int n, dfl_error *err) {
    static const char *const roles[] = {"system", "user", "assistant", "tool", "ipython"};
    if (n < 1 || !m) return dfl_fail(err, DFL_EARG, "chat: no messages");
    for (int i = 0; i < n; i++) {
        int ok = 0;
        for (size_t r = 0; m[i].role && r < sizeof roles / sizeof roles[0]; r++)
            ok |= !strcmp(m[i].role, roles[r]);
        if (!ok)
            return dfl_fail(err, DFL_EARG, "chat: message %d has role \"%.32s\" (expected system, "
                            "user, assistant or tool)", i, m[i].role ? m[i].role : "(null)");
    }
    return 0;
}

int dfl_chat_render_text(const char *template_text, const char *force_name, const char *bos_text,
                         const dfl_chat_msg *msgs, int n, int add_generation_prompt,
                         int enable_thinking, char *dst, size_t cap, dfl_error *err) {
    int fam = -1;
    if (force_name) {
        for (int f = 0; f < FAM_COUNT; f++)
            if (!strcmp(force_name, fam_names[f])) fam = f;
        if (fam < 0)
            return dfl_fail(err, DFL_EARG, "chat template \"%.64s\" is unknown (known: chatml, "
                            "qwen2.5, qwen3, llama3, llama3.1)", force_name);
    } else if (!template_text) {
        return dfl_fail(err, DFL_EARG, "the model has no chat template; name one with "
                        "--chat-template (chatml, qwen2.5, qwen3, llama3, llama3.1)");
    } else if ((fam = detect(template_text)) < 0) {
        return dfl_fail(err, DFL_EUNSUP, "the model's chat template is not one we can render "
                        "(chatml, qwen2.5, qwen3, llama3, llama3.1 are); name one with "
                        "--chat-template");
    }
    int rc = check_msgs(msgs, n, err);
    if (rc) return rc;
    out o = {dst, dst ? cap : 0, 0};
    if (fam == FAM_QWEN3) render_qwen3(&o, msgs, n);
    else if (fam == FAM_LLAMA3 || fam == FAM_LLAMA31) render_llama3(&o, fam, bos_text ? bos_text : "", msgs, n);
    else render_chatml(&o, fam, msgs, n);
    if (add_generation_prompt) {
        if (fam == FAM_LLAMA3 || fam == FAM_LLAMA31) {
            header(&o, "assistant");
        } else {
            put(&o, "<|im_start|>assistant\n");
            /* only templates that know the switch (or a forced qwen3) honour it */
            int knows = !template_text || force_name || strstr(template_text, "enable_thinking");
            if (fam == FAM_QWEN3 && !enable_thinking && knows) put(&o, "<think>\n\n</think>\n\n");
        }
    }
    if (o.cap) o.p[o.n < o.cap ? o.n : o.cap - 1] = 0;
    if (o.n > (size_t)INT32_MAX) return dfl_fail(err, DFL_EARG, "chat: rendered text too long");
    return (int)o.n;
}
