/* tools.c - tool calls in the model's own syntax: which syntax a template
 * teaches (its family), the calls found in generated text, and the JSON schema
 * that a required call must match.
 *
 * Families, recognised from the template text:
 *   hermes   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, any
 *            number of them (Qwen2.5/3, Hermes, SmolLM3 and most ChatML
 *            models; also the fallback for a template that names none)
 *   qwen-xml <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>
 *            ...</function>\n</tool_call> (Qwen3.5, Qwen3-Coder, Nemotron 3,
 *            Step 3.5); a hermes JSON body is read too
 *   llama3   {"name": ..., "parameters": {...}} as the whole answer, or after
 *            <|python_tag|> (Llama 3.1-3.3)
 *   mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Nemo) or
 *            [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} (Small 3.2, Ministral 3)
 *
 * The parser sees the answer text piece by piece. Text that may start a call
 * is held until the call is complete; a complete call whose JSON parses and
 * whose name is one of the request's tools becomes a call, anything else goes
 * out as plain text. So the calls and the text are the same however the
 * output was split into pieces (streamed or not). Pure: no server state. */
#define _GNU_SOURCE /* memmem */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server.h"


static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_TAG[] = "[TOOL_CALLS]", PYTHON_TAG[] = "<|python_tag|>";
static const char FN_OPEN[] = "<function=", FN_CLOSE[] = "</function>";
static const char PARAM_OPEN[] = "<parameter=", PARAM_CLOSE[] = "</parameter>";

/* Families whose calls are <tool_call> ... </tool_call> blocks. */
static int tagged(int family) { return family == SRV_TOOLS_HERMES || family == SRV_TOOLS_QWEN_XML; }

int srv_tools_family(const char *tmpl) {
    if (!tmpl) return SRV_TOOLS_HERMES;
    if (strstr(tmpl, MISTRAL_TAG)) return SRV_TOOLS_MISTRAL;
    if (strstr(tmpl, HERMES_OPEN) && strstr(tmpl, FN_OPEN) && strstr(tmpl, PARAM_OPEN))
        return SRV_TOOLS_QWEN_XML;
    if (strstr(tmpl, HERMES_OPEN)) return SRV_TOOLS_HERMES;
    if (strstr(tmpl, PYTHON_TAG) || (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "\"parameters\"")))
        return SRV_TOOLS_LLAMA3;
    return SRV_TOOLS_HERMES;
}

const char *srv_tools_family_name(int family) {
    static const char *const names[] = {"hermes", "llama3", "mistral", "qwen-xml"};
    return names[family];
}

/* The key a family's call object holds the arguments under. */
static const char *args_key(int family) {
    return family == SRV_TOOLS_LLAMA3 ? "parameters" : "arguments";
}

void srv_tools_free(srv_tools *t) {
    if (!t) return;
    cJSON_Delete(t->list);
    free(t->forced);
    free(t);
}

/* The {type, function} entry named name, or NULL. */
static const cJSON *find_tool(const srv_tools *t, const char *name) {
    for (const cJSON *it = t->list ? t->list->child : NULL; it; it = it->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return it;
    }
    return NULL;
}

int srv_tools_shown(const srv_tools *t, int32_t id) {
    for (int k = 0; k < t->n_show; k++)
        if (t->show[k] == id) return 1;
    return 0;
}

void srv_tools_call_id(int family, char out[SRV_CALL_ID_MAX]) {
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char r[24];
    /* Mistral's templates refuse ids that are not 9 alphanumerics */
    int n = family == SRV_TOOLS_MISTRAL ? 9 : 24, o = 0;
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)(rand() ^ (int)time(NULL));
    if (family != SRV_TOOLS_MISTRAL) memcpy(out, "call_", 5), o = 5;
    for (int i = 0; i < n; i++) out[o++] = abc[r[i] % (sizeof abc - 1)];
    out[o] = 0;
}

/* ---- the schema of a required call ------------------------------------------- */

/* {"type":"object","properties":{"name":{"const":N},KEY:PARAMS},"required":[...],
 *  "additionalProperties":false} for one tool. */
static cJSON *call_schema(int family, const cJSON *tool) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "object");
    cJSON *props = cJSON_AddObjectToObject(s, "properties");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "name"), "const", name->valuestring);
    if (cJSON_IsObject(params)) cJSON_AddItemToObject(props, args_key(family), cJSON_Duplicate(params, 1));
    else cJSON_AddStringToObject(cJSON_AddObjectToObject(props, args_key(family)), "type", "object");
    cJSON *req = cJSON_AddArrayToObject(s, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(args_key(family)));
    cJSON_AddFalseToObject(s, "additionalProperties");
    return s;
}

int srv_tools_format(const srv_tools *t, char **schema, char **prefix, char **suffix) {
    *schema = *prefix = *suffix = NULL;
    if (!t || (t->choice != SRV_CHOICE_REQUIRED && t->choice != SRV_CHOICE_NAMED)) return 0;
    cJSON *any = cJSON_CreateArray();
    for (const cJSON *it = t->list->child; it; it = it->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
        if (t->choice == SRV_CHOICE_REQUIRED || !strcmp(name, t->forced))
            cJSON_AddItemToArray(any, call_schema(t->family, it));
    }
    cJSON *root = any;
    if (cJSON_GetArraySize(any) == 1) {   /* one tool: its schema itself */
        root = cJSON_DetachItemFromArray(any, 0);
        cJSON_Delete(any);
    } else {
        root = cJSON_CreateObject();
        cJSON_AddItemToObject(root, "anyOf", any);
    }
    *schema = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    /* qwen-xml: the JSON body its parser also reads (the constraint is JSON) */
    static const char *const pre[] = {"<tool_call>\n", "", "[TOOL_CALLS][", "<tool_call>\n"};
    static const char *const suf[] = {"\n</tool_call>", "", "]", "\n</tool_call>"};
    *prefix = strdup(pre[t->family]);
    *suffix = strdup(suf[t->family]);
    if (!*schema || !*prefix || !*suffix) {
        free(*schema), free(*prefix), free(*suffix);
        *schema = *prefix = *suffix = NULL;
        return -1;
    }
    return 1;
}

/* ---- scanning ------------------------------------------------------------------- */

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Length of the JSON object or array at s[0] (its closing bracket included),
 * 0 when s[0..n) is an unfinished one, -1 when it cannot be one. Brackets
 * only: cJSON judges the rest. The scan resumes where the last call on the
 * same block stopped (st), so a long block costs linear time. */
static long json_span(srv_json_scan *st, const char *s, size_t n) {
    if (!n) return 0;
    if (s[0] != '{' && s[0] != '[') return -1;
    for (size_t i = st->at; i < n; i++) {
        char c = s[i];
        if (st->in_str) {
            if (st->esc) st->esc = 0;
            else if (c == '\\') st->esc = 1;
            else if (c == '"') st->in_str = 0;
            continue;
        }
        if (c == '"') st->in_str = 1;
        else if (c == '{' || c == '[') {
            if (st->depth == SRV_TOOL_MAX_DEPTH) return -1;
            st->stack[st->depth++] = c == '{' ? '}' : ']';
        } else if (c == '}' || c == ']') {
            if (!st->depth || st->stack[st->depth - 1] != c) return -1;
            if (--st->depth == 0) return (long)i + 1;
        }
    }
    st->at = n;
    return 0;
}

/* Literal lit at s[*i]: 1 (and *i moves past it), 0 when s ends inside it, -1 otherwise. */
static int literal(const char *s, size_t n, size_t *i, const char *lit) {
    size_t m = strlen(lit), k = n - *i < m ? n - *i : m;
    if (memcmp(s + *i, lit, k)) return -1;
    if (k < m) return 0;
    *i += m;
    return 1;
}

/* Where a call may start in s[0..n), or -1; *tail: bytes at the end that may
 * be the start of one (held until the next piece decides). */
static long find_start(const srv_toolp *p, const char *s, size_t n, size_t *tail) {
    const char *tag = tagged(p->t->family)                ? HERMES_OPEN
                      : p->t->family == SRV_TOOLS_MISTRAL ? MISTRAL_TAG
                                                          : PYTHON_TAG;
    const char *at = memmem(s, n, tag, strlen(tag));
    *tail = at ? 0 : srv_tag_tail(s, n, tag);
    if (p->t->family == SRV_TOOLS_LLAMA3 && !p->seen_text) {
        /* Llama 3 answers a call with the JSON object alone */
        size_t ws = 0;
        while (ws < n && is_space(s[ws])) ws++;
        if (ws < n && s[ws] == '{' && (!at || s + ws < at)) return (long)ws;
        if (ws == n) *tail = n;
    }
    return at ? at - s : -1;
}

/* Length of the call block at s[0] (a start find_start found), 0 when it needs
 * more text, -1 when it is not a call. */
static long block_end(srv_toolp *p, const char *s, size_t n, int final) {
    size_t i = 0, c = sizeof HERMES_CLOSE - 1;
    long r;
    if (tagged(p->t->family)) {
        /* from where the last search stopped, less a close tag's length */
        size_t from = p->scan.at > c ? p->scan.at - c : 0;
        const char *end = memmem(s + from, n - from, HERMES_CLOSE, c);
        if (end) return (long)(end - s) + (long)c;
        p->scan.at = n;
        return final ? (long)n : 0;   /* the close tag may be missing at the end */
    }
    if (p->t->family == SRV_TOOLS_LLAMA3) {
        if ((r = literal(s, n, &i, PYTHON_TAG)) < 0) i = 0;
        else if (!r) return final ? -1 : 0;
    } else {
        i = sizeof MISTRAL_TAG - 1;
    }
    while (i < n && is_space(s[i])) i++;
    if (p->t->family == SRV_TOOLS_MISTRAL && i < n && s[i] != '[') {
        /* name[CALL_ID]id[ARGS]{...}; a name or id longer than names are is not one */
        size_t at = i;
        while (i < n && !is_space(s[i]) && s[i] != '[') i++;
        if (i - at > SRV_TOOL_NAME_MAX) return -1;
        if (i < n && s[i] == '[' && (r = literal(s, n, &i, "[CALL_ID]")) != -1) {
            if (!r) return final ? -1 : 0;
            for (at = i; i < n && s[i] != '['; i++) {}
            if (i - at > SRV_TOOL_NAME_MAX) return -1;
        }
        if (i == n) return final ? -1 : 0;
        if (!(r = literal(s, n, &i, "[ARGS]"))) return final ? -1 : 0;
        if (r < 0) return -1;
    }
    if (i == n) return final ? -1 : 0;
    r = json_span(&p->scan, s + i, n - i);
    if (r < 0 || (!r && final)) return -1;
    return r ? (long)i + r : 0;
}

/* Length of the start of a call at s (what find_start found there). */
static size_t start_len(const srv_toolp *p, const char *s) {
    if (tagged(p->t->family)) return sizeof HERMES_OPEN - 1;
    if (p->t->family == SRV_TOOLS_MISTRAL) return sizeof MISTRAL_TAG - 1;
    return strncmp(s, PYTHON_TAG, sizeof PYTHON_TAG - 1) ? 1 : sizeof PYTHON_TAG - 1;
}

/* ---- calls -------------------------------------------------------------------------- */

/* {name, arguments} for a call object when it names one of the tools and its
 * arguments are an object (or a string holding one); else NULL. */
static cJSON *make_call(const srv_toolp *p, const char *name, const cJSON *args) {
    if (!name || !find_tool(p->t, name)) return NULL;
    cJSON *parsed = NULL;
    if (cJSON_IsString(args)) args = parsed = cJSON_Parse(args->valuestring);
    char *text = cJSON_IsObject(args) ? cJSON_PrintUnformatted(args) : NULL;
    cJSON_Delete(parsed);
    if (!text) return NULL;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "name", name);
    cJSON_AddStringToObject(c, "arguments", text);
    cJSON_free(text);
    return c;
}

static cJSON *call_from_object(const srv_toolp *p, const cJSON *o) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, args_key(p->t->family));
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    return cJSON_IsObject(o) && cJSON_IsString(name) ? make_call(p, name->valuestring, args) : NULL;
}

/* s[0..n) as one JSON value and nothing else (blanks around it allowed). */
static cJSON *parse_exact(const char *s, size_t n) {
    char *z = malloc(n + 1);
    if (!z) return NULL;
    memcpy(z, s, n);
    z[n] = 0;
    cJSON *v = cJSON_ParseWithOpts(z, NULL, 1);
    free(z);
    return v;
}

/* ---- qwen-xml ------------------------------------------------------------------ */

/* s[0..n) without blanks around it. */
static void trim(const char **s, size_t *n) {
    while (*n && is_space(**s)) (*s)++, (*n)--;
    while (*n && is_space((*s)[*n - 1])) (*n)--;
}

/* A parameter's value as the template wrote it: text for a string parameter,
 * else the JSON it holds (mappings and lists are tojson'd), Python's True /
 * False / None, or the text when it is none of these. */
static cJSON *xml_value(const cJSON *tool, const char *key, const char *v, size_t n) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"),
                                                          "properties");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
    char *z = strndup(v, n);
    cJSON *out = NULL;
    if (!z) return NULL;
    if (!(cJSON_IsString(type) && !strcmp(type->valuestring, "string"))) {
        out = cJSON_ParseWithOpts(z, NULL, 1);
        if (!out && !strcmp(z, "True")) out = cJSON_CreateTrue();
        if (!out && !strcmp(z, "False")) out = cJSON_CreateFalse();
        if (!out && !strcmp(z, "None")) out = cJSON_CreateNull();
    }
    if (!out) out = cJSON_CreateString(z);
    free(z);
    return out;
}

/* <function=NAME> (<parameter=KEY>\nVALUE\n</parameter>)* </function>, blanks
 * between: the call {name, arguments}, or NULL. */
static cJSON *xml_call(const srv_toolp *p, const char *s, size_t n) {
    const char *end = s + n, *gt = memchr(s, '>', n);
    size_t fo = sizeof FN_OPEN - 1, po = sizeof PARAM_OPEN - 1, pc = sizeof PARAM_CLOSE - 1;
    if (!gt || (size_t)(gt - s) - fo > SRV_TOOL_NAME_MAX) return NULL;
    char name[SRV_TOOL_NAME_MAX + 1];
    memcpy(name, s + fo, (size_t)(gt - s) - fo);
    name[gt - s - fo] = 0;
    const cJSON *tool = find_tool(p->t, name);
    if (!tool) return NULL;
    cJSON *args = cJSON_CreateObject(), *call = NULL;
    for (s = gt + 1;;) {
        while (s < end && is_space(*s)) s++;
        if ((size_t)(end - s) < po || memcmp(s, PARAM_OPEN, po)) break;
        const char *kgt = memchr(s, '>', (size_t)(end - s));
        const char *vend = kgt ? memmem(kgt, (size_t)(end - kgt), PARAM_CLOSE, pc) : NULL;
        if (!vend || (size_t)(kgt - s) - po > SRV_TOOL_NAME_MAX) goto out;
        char key[SRV_TOOL_NAME_MAX + 1];
        memcpy(key, s + po, (size_t)(kgt - s) - po);
        key[kgt - s - po] = 0;
        const char *v = kgt + 1;
        size_t vn = (size_t)(vend - v);
        /* the template puts the value between two newlines */
        if (vn && *v == '\n') v++, vn--;
        if (vn && v[vn - 1] == '\n') vn--;
        if (cJSON_GetObjectItemCaseSensitive(args, key)) goto out;
        cJSON_AddItemToObject(args, key, xml_value(tool, key, v, vn));
        s = vend + pc;
    }
    size_t rest = (size_t)(end - s);
    trim(&s, &rest);
    if (rest == sizeof FN_CLOSE - 1 && !memcmp(s, FN_CLOSE, rest)) call = make_call(p, name, args);
out:
    cJSON_Delete(args);
    return call;
}

/* The calls in a complete block, appended to out; 0, or -1 when any is not a call. */
static int parse_block(const srv_toolp *p, const char *s, size_t n, cJSON *out) {
    size_t i = 0;
    cJSON *v = NULL, *name_form = NULL;
    if (tagged(p->t->family)) {
        i = sizeof HERMES_OPEN - 1;
        size_t c = sizeof HERMES_CLOSE - 1;
        if (n >= i + c && !memcmp(s + n - c, HERMES_CLOSE, c)) n -= c;
        while (i < n && is_space(s[i])) i++;
        if (p->t->family == SRV_TOOLS_QWEN_XML && n - i >= sizeof FN_OPEN - 1 &&
            !memcmp(s + i, FN_OPEN, sizeof FN_OPEN - 1)) {
            cJSON *c1 = xml_call(p, s + i, n - i);
            if (!c1 || (!p->t->parallel && p->n_calls)) return cJSON_Delete(c1), -1;
            cJSON_AddItemToArray(out, c1);
            return 1;
        }
    } else if (p->t->family == SRV_TOOLS_LLAMA3) {
        if (!strncmp(s, PYTHON_TAG, sizeof PYTHON_TAG - 1)) i = sizeof PYTHON_TAG - 1;
    } else {
        i = sizeof MISTRAL_TAG - 1;
        while (i < n && is_space(s[i])) i++;
        if (i < n && s[i] != '[') {   /* name[CALL_ID]id[ARGS]{...}: block_end checked the shape */
            const char *args = memmem(s + i, n - i, "[ARGS]", 6);
            size_t e = i;
            while (e < n && s[e] != '[') e++;
            char *nm = strndup(s + i, e - i);
            name_form = cJSON_CreateObject();
            cJSON_AddStringToObject(name_form, "name", nm ? nm : "");
            free(nm);
            i = (size_t)(args - s) + 6;
        }
    }
    v = parse_exact(s + i, n - i);
    if (name_form) {
        cJSON_AddItemToObject(name_form, "arguments", v);
        v = name_form;
    }
    int ok = v != NULL, count = 0;
    cJSON *calls = cJSON_CreateArray();
    const cJSON *one = v;
    if (p->t->family == SRV_TOOLS_MISTRAL && cJSON_IsArray(v)) one = v->child, ok = one != NULL;
    for (; ok && one; one = cJSON_IsArray(v) ? one->next : NULL, count++) {
        cJSON *c = call_from_object(p, one);
        if (!c) ok = 0;
        else cJSON_AddItemToArray(calls, c);
    }
    if (ok && !p->t->parallel && p->n_calls + count > 1) ok = 0;
    while (ok && calls->child) cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(calls, calls->child));
    cJSON_Delete(calls);
    cJSON_Delete(v);
    return ok ? count : -1;
}

/* ---- the parser -------------------------------------------------------------------- */

void srv_toolp_init(srv_toolp *p, const srv_tools *t) {
    memset(p, 0, sizeof *p);
    p->t = t;
}

void srv_toolp_free(srv_toolp *p) {
    srv_buf_free(&p->held);
    srv_buf_free(&p->blank);
}

/* Plain text out. Blanks are kept aside: those just before a call, or after
 * the last call at the end, are not part of the answer. */
static void put_text(srv_toolp *p, const char *s, size_t n, srv_buf *content) {
    size_t k = n;
    while (k && is_space(s[k - 1])) k--;
    if (k) {
        srv_buf_put(content, p->blank.p, p->blank.len);
        p->blank.len = 0;
        srv_buf_put(content, s, k);
        p->seen_text = 1;
    }
    srv_buf_put(&p->blank, s + k, n - k);
}

/* Drops h[0..n) from held. */
static void consume(srv_toolp *p, size_t n) {
    memmove(p->held.p, p->held.p + n, p->held.len - n);
    p->held.len -= n;
}

void srv_toolp_push(srv_toolp *p, const char *s, size_t n, int final, srv_buf *content,
                    cJSON *calls) {
    srv_buf_put(&p->held, s, n);
    for (;;) {
        const char *h = p->held.p;
        size_t hn = p->held.len, tail;
        if (!p->in_call) {
            long at = find_start(p, h, hn, &tail);
            size_t upto = at >= 0 ? (size_t)at : final ? hn : hn - tail;
            put_text(p, h, upto, content);
            consume(p, upto);
            if (at < 0) break;
            p->in_call = 1;
            memset(&p->scan, 0, sizeof p->scan);
            continue;
        }
        long end = block_end(p, h, hn, final);
        if (!end) break;
        int got = end > 0 ? parse_block(p, h, (size_t)end, calls) : -1;
        if (got > 0) {
            p->n_calls += got;
            p->blank.len = 0;
        } else {
            /* Not a call: a whole block is text; a start that cannot begin one
             * is, and the scan goes on after it (so the outcome does not
             * depend on how much text had arrived when that was seen). */
            if (end < 0) end = (long)start_len(p, h);
            put_text(p, h, (size_t)end, content);
        }
        consume(p, (size_t)end);
        p->in_call = 0;
    }
    if (final && !p->n_calls) srv_buf_put(content, p->blank.p, p->blank.len);
    if (final) p->blank.len = 0;
}
