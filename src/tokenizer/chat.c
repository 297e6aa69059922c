/* chat.c - chat templates: the model's Jinja template (tokenizer_config.json
 * chat_template, GGUF tokenizer.chat_template, or a file the user names)
 * rendered by jinja.c with the variables transformers' apply_chat_template
 * passes: messages, tools, documents, add_generation_prompt, the special
 * tokens and the caller's chat_template_kwargs. A model without a template
 * gets ChatML, as llama-server does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja.h"
#include "tokenizer/tok_impl.h"

/* transformers' former default template (ChatML) */
const char dfl_chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

/* A JSON string literal of s (NULL: null) into b, which has room for 6 * strlen + 3. */
static char *put_json_str(char *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    if (!s) return memcpy(b, "null", 4), b + 4;
    *b++ = '"';
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') *b++ = '\\', *b++ = (char)c;
        else if (c < 0x20) *b++ = '\\', *b++ = 'u', *b++ = '0', *b++ = '0', *b++ = hex[c >> 4], *b++ = hex[c & 15];
        else *b++ = (char)c;
    }
    *b++ = '"';
    return b;
}

int dfl_chat_render_vars(const char *template_text, const char *bos, const char *eos,
                         const char *messages_json, const char *tools_json,
                         const char *kwargs_json, int add_generation_prompt, int64_t now,
                         char *dst, size_t cap, dfl_error *err) {
    if (!messages_json) return dfl_fail(err, DFL_EARG, "chat: no messages");
    const char *tmpl = template_text ? template_text : dfl_chatml_template;
    char tok_json[2][6 * DFL_TOK_MAX_PIECE + 8];
    *put_json_str(tok_json[0], bos) = 0;
    *put_json_str(tok_json[1], eos) = 0;
    dfl_jinja_var vars[] = {
        {"bos_token", tok_json[0]},
        {"eos_token", tok_json[1]},
        {"messages", messages_json},
        {"tools", tools_json ? tools_json : "null"},
        {"documents", "null"},
        {"add_generation_prompt", add_generation_prompt ? "true" : "false"},
        {NULL, kwargs_json ? kwargs_json : "{}"},
    };
    dfl_jinja_limits lim = {.now = now, .chat = 1};
    char *out;
    size_t n;
    int rc = dfl_jinja_render(tmpl, strlen(tmpl), vars, (int)(sizeof vars / sizeof *vars), &lim,
                              &out, &n, err);
    if (rc) return rc;
    if (n > (size_t)INT32_MAX) {
        free(out);
        return dfl_fail(err, DFL_EARG, "chat: rendered text too long");
    }
    if (dst && cap) {
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(dst, out, k);
        dst[k] = 0;
    }
    free(out);
    return (int)n;
}

/* Messages as JSON; the old struct API carries role and content only. */
static char *msgs_json(const dfl_chat_msg *m, int n) {
    size_t need = 3;
    for (int i = 0; i < n; i++)
        need += 32 + 6 * (strlen(m[i].role ? m[i].role : "") + strlen(m[i].content ? m[i].content : ""));
    char *s = malloc(need), *b = s;
    if (!s) return NULL;
    *b++ = '[';
    for (int i = 0; i < n; i++) {
        b += sprintf(b, "%s{\"role\":", i ? "," : "");
        b = put_json_str(b, m[i].role ? m[i].role : "");
        b += sprintf(b, ",\"content\":");
        b = put_json_str(b, m[i].content ? m[i].content : "");
        *b++ = '}';
    }
    *b++ = ']';
    *b = 0;
    return s;
}

int dfl_chat_forced(const char *force, const char **tmpl, dfl_error *err) {
    if (!strcmp(force, "chatml")) *tmpl = dfl_chatml_template;
    else if (strstr(force, "{%") || strstr(force, "{{")) *tmpl = force;
    else
        return dfl_fail(err, DFL_EARG, "chat template \"%.64s\" is unknown: give \"chatml\" or a "
                        "Jinja template (--chat-template-file FILE)", force);
    return 0;
}

int dfl_chat_render_text(const char *template_text, const char *force, const char *bos_text,
                         const char *eos_text, const dfl_chat_msg *msgs, int n,
                         int add_generation_prompt, int enable_thinking, char *dst, size_t cap,
                         dfl_error *err) {
    if (n < 1 || !msgs) return dfl_fail(err, DFL_EARG, "chat: no messages");
    int rc = force ? dfl_chat_forced(force, &template_text, err) : 0;
    if (rc < 0) return rc;
    char *mj = msgs_json(msgs, n);
    if (!mj) return dfl_fail(err, DFL_ENOMEM, "chat: out of memory");
    rc = dfl_chat_render_vars(template_text, bos_text, eos_text, mj, NULL,
                              enable_thinking ? "{\"enable_thinking\":true}"
                                              : "{\"enable_thinking\":false}",
                              add_generation_prompt, 0, dst, cap, err);
    free(mj);
    return rc;
}
