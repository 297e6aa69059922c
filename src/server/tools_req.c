/* tools_req.c - the request side of tool calls: `tools`, `tool_choice` and
 * `parallel_tool_calls` checked into a srv_tools, and the messages that carry
 * calls (assistant `tool_calls`) or their results (role `tool`) made ready
 * for the chat template.
 *
 * Arguments: OpenAI sends a call's function.arguments as a JSON string, while
 * templates (Llama 3.1, Mistral, Qwen3 when not a string) write them with
 * `| tojson`, which needs the object. So a string that holds a JSON object is
 * parsed into that object before rendering, as vLLM and llama.cpp do; any
 * other string is a 400. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* v's keys are all in keys[] (unless --lenient); else a 400 naming the first other. */
static int only_keys(const srv_server *srv, const cJSON *v, const char *const *keys, int n,
                     const char *param, srv_err *e) {
    if (srv->o.lenient) return 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        int ok = 0;
        for (int k = 0; k < n && !ok; k++) ok = !strcmp(c->string, keys[k]);
        if (!ok)
            return srv_errf(e, 400, param, "'%s' has the unknown field '%.64s'", param, c->string);
    }
    return 0;
}

/* OpenAI's rule for function names: 1 to 64 of a-z, A-Z, 0-9, _ and -. */
static int valid_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > SRV_TOOL_NAME_MAX) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return 0;
    return 1;
}

/* tools[i]: {"type": "function", "function": {name, description?, parameters?, strict?}}. */
static int check_tool(const srv_server *srv, const cJSON *t, int i, srv_err *e) {
    static const char *const tool_keys[] = {"type", "function"};
    static const char *const fn_keys[] = {"name", "description", "parameters", "strict"};
    char p[64];
    snprintf(p, sizeof p, "tools[%d]", i);
    if (!cJSON_IsObject(t)) return srv_errf(e, 400, p, "'%s' must be an object", p);
    if (only_keys(srv, t, tool_keys, 2, p, e) < 0) return -1;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return srv_errf(e, 400, p, "'%s.type' must be \"function\"", p);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    snprintf(p, sizeof p, "tools[%d].function", i);
    if (!cJSON_IsObject(f)) return srv_errf(e, 400, p, "'%s' must be an object", p);
    if (only_keys(srv, f, fn_keys, 4, p, e) < 0) return -1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(f, "description");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(f, "strict");
    snprintf(p, sizeof p, "tools[%d].function.name", i);
    if (!cJSON_IsString(name) || !valid_name(name->valuestring))
        return srv_errf(e, 400, p, "'%s' must be 1 to %d letters, digits, _ or -", p,
                        SRV_TOOL_NAME_MAX);
    snprintf(p, sizeof p, "tools[%d].function", i);
    if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc))
        return srv_errf(e, 400, p, "'%s.description' must be a string", p);
    if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
        return srv_errf(e, 400, p, "'%s.parameters' must be a JSON schema object", p);
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return srv_errf(e, 400, p, "'%s.strict' must be a boolean", p);
    return 0;
}

static const char *tool_name(const cJSON *t) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name")
        ->valuestring;
}

/* tool_choice: "auto" | "none" | "required" | {"type": "function", "function": {"name": N}}. */
static int parse_choice(srv_tools *t, const cJSON *c, srv_err *e) {
    static const char *const names[] = {"auto", "none", "required"};
    if (cJSON_IsString(c)) {
        for (int k = 0; k < 3; k++)
            if (!strcmp(c->valuestring, names[k])) return t->choice = k, 0;
        return srv_errf(e, 400, "tool_choice", "'tool_choice' is '%.32s'; expected \"auto\", "
                        "\"none\", \"required\" or {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}", c->valuestring);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    if (!cJSON_IsObject(c) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") ||
        !cJSON_IsString(name))
        return srv_errf(e, 400, "tool_choice", "'tool_choice' must be \"auto\", \"none\", "
                        "\"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    for (const cJSON *it = t->list->child; it; it = it->next)
        if (!strcmp(tool_name(it), name->valuestring)) {
            t->choice = SRV_CHOICE_NAMED;
            t->forced = strdup(name->valuestring);
            return t->forced ? 0 : srv_errf(e, 500, NULL, "out of memory");
        }
    return srv_errf(e, 400, "tool_choice", "'tool_choice' names the function '%.64s', which is "
                    "not in 'tools'", name->valuestring);
}

/* Special tokens of the family's syntax: the detokenizer hides special tokens,
 * but these are the calls' markers (Mistral's [TOOL_CALLS], Llama's <|python_tag|>). */
static void find_markers(srv_server *srv, srv_tools *t) {
    static const char *const marks[][3] = {
        {"<tool_call>", "</tool_call>", NULL}, {"<|python_tag|>", NULL, NULL},
        {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}, {"<tool_call>", "</tool_call>", NULL}};
    for (int k = 0; k < 3 && marks[t->family][k] && t->n_show < SRV_TOOL_SHOW; k++) {
        int32_t ids[4];
        dfl_error err = {0};
        const char *m = marks[t->family][k];
        if (dfl_tokenize(srv->e, m, strlen(m), 0, 1, ids, 4, &err) == 1) t->show[t->n_show++] = ids[0];
    }
}

int srv_parse_tools(srv_job *j, const cJSON *root, const char *tmpl, srv_err *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (cJSON_IsNull(tools)) tools = NULL;
    if (cJSON_IsNull(choice)) choice = NULL;
    if (cJSON_IsNull(par)) par = NULL;
    if (!tools) {
        if (choice) return srv_errf(e, 400, "tool_choice", "'tool_choice' is only allowed when 'tools' are given");
        if (par)
            return srv_errf(e, 400, "parallel_tool_calls",
                            "'parallel_tool_calls' is only allowed when 'tools' are given");
        return 0;
    }
    int n = cJSON_GetArraySize(tools);
    if (!cJSON_IsArray(tools)) return srv_errf(e, 400, "tools", "'tools' must be an array");
    if (n < 1 || n > SRV_MAX_TOOLS)
        return srv_errf(e, 400, "tools", "'tools' has %d entries; expected 1 to %d", n, SRV_MAX_TOOLS);
    int i = 0;
    for (const cJSON *it = tools->child; it; it = it->next, i++) {
        if (check_tool(j->srv, it, i, e) < 0) return -1;
        for (const cJSON *o = tools->child; o != it; o = o->next)
            if (!strcmp(tool_name(o), tool_name(it))) {
                char p[64];
                snprintf(p, sizeof p, "tools[%d].function.name", i);
                return srv_errf(e, 400, p, "two tools are named '%s'", tool_name(it));
            }
    }
    if (par && !cJSON_IsBool(par))
        return srv_errf(e, 400, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    srv_tools *t = calloc(1, sizeof *t);
    if (!t) return srv_errf(e, 500, NULL, "out of memory");
    j->tools = t;
    t->list = cJSON_Duplicate(tools, 1);
    t->parallel = !par || cJSON_IsTrue(par);
    t->family = srv_tools_family(tmpl);
    if (!t->list) return srv_errf(e, 500, NULL, "out of memory");
    if (choice && parse_choice(t, choice, e) < 0) return -1;
    find_markers(j->srv, t);
    if (t->choice == SRV_CHOICE_REQUIRED || t->choice == SRV_CHOICE_NAMED) {
        if (j->fmt_on)
            return srv_errf(e, 400, "tool_choice", "a required tool call cannot be combined with "
                            "'response_format'");
        if (srv_tools_format(t, &j->fmt_schema, &j->fmt_prefix, &j->fmt_suffix) < 0)
            return srv_errf(e, 500, NULL, "out of memory");
        j->fmt_on = 1;
    }
    if (t->choice != SRV_CHOICE_NONE) srv_toolp_init(&j->toolp, t);
    return 0;
}

/* ---- messages -------------------------------------------------------------------- */

/* messages[i].tool_calls[k] -> {id, type, function: {name, arguments: object}}. */
static cJSON *message_call(const cJSON *c, const char *param, srv_err *e) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
    if (!cJSON_IsObject(c) || !cJSON_IsString(id) || !cJSON_IsObject(f) || !cJSON_IsString(name) ||
        (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function")))) {
        srv_errf(e, 400, param, "'%s' must be {\"id\": string, \"type\": \"function\", "
                 "\"function\": {\"name\": string, \"arguments\": string}}", param);
        return NULL;
    }
    cJSON *obj = cJSON_IsString(args) ? cJSON_Parse(args->valuestring)
                 : cJSON_IsObject(args) ? cJSON_Duplicate(args, 1) : NULL;
    if (!cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        srv_errf(e, 400, param, "'%s.function.arguments' must be a string holding a JSON object", param);
        return NULL;
    }
    cJSON *out = cJSON_CreateObject(), *fo;
    cJSON_AddStringToObject(out, "id", id->valuestring);
    cJSON_AddStringToObject(out, "type", "function");
    fo = cJSON_AddObjectToObject(out, "function");
    cJSON_AddStringToObject(fo, "name", name->valuestring);
    cJSON_AddItemToObject(fo, "arguments", obj);
    return out;
}

int srv_tool_message(const cJSON *in, int i, const char *role, cJSON *out, srv_err *e) {
    char p[64];
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(in, "tool_calls");
    const cJSON *call_id = cJSON_GetObjectItemCaseSensitive(in, "tool_call_id");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(in, "name");
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(in, "reasoning_content");
    if (!strcmp(role, "tool")) {
        snprintf(p, sizeof p, "messages[%d].tool_call_id", i);
        if (!cJSON_IsString(call_id))
            return srv_errf(e, 400, p, "'%s' is required for a tool message (a string)", p);
        cJSON_AddStringToObject(out, "tool_call_id", call_id->valuestring);
    }
    if (cJSON_IsString(name)) cJSON_AddStringToObject(out, "name", name->valuestring);
    if (cJSON_IsString(reason) && !strcmp(role, "assistant"))
        cJSON_AddStringToObject(out, "reasoning_content", reason->valuestring);
    if (!calls || cJSON_IsNull(calls)) return 0;
    snprintf(p, sizeof p, "messages[%d].tool_calls", i);
    if (strcmp(role, "assistant")) return srv_errf(e, 400, p, "only assistant messages have '%s'", p);
    if (!cJSON_IsArray(calls)) return srv_errf(e, 400, p, "'%s' must be an array", p);
    cJSON *arr = cJSON_AddArrayToObject(out, "tool_calls");
    int k = 0;
    for (const cJSON *c = calls->child; c; c = c->next, k++) {
        snprintf(p, sizeof p, "messages[%d].tool_calls[%d]", i, k);
        cJSON *one = message_call(c, p, e);
        if (!one) return -1;
        cJSON_AddItemToArray(arr, one);
    }
    return 0;
}
