/* request.c - OpenAI chat / completions request bodies -> srv_job.
 *
 * Bodies come from strangers: the whole body must be UTF-8 JSON no deeper than
 * max_json_depth; every known field is type- and range-checked (null means
 * "not given"); unknown fields are ignored. Errors name the field (`param`). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "server.h"

int srv_errf(srv_err *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    e->status = status;
    e->type = status == 401   ? "authentication_error"
              : status == 404 ? "not_found_error"
              : status == 503 ? "unavailable_error"
              : status >= 500 ? "server_error"
                              : "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

void srv_json_err(srv_err *e, int why, int max) {
    if (why == SRV_JSON_NUL)
        srv_errf(e, 400, NULL, "a string in the request contains U+0000 (\\u0000), which this "
                 "server does not accept");
    else if (why == SRV_JSON_ITEMS)
        srv_errf(e, 413, NULL, "the request holds more JSON values than a request to this server "
                 "can use (a prompt fills at most its context); send less");
    else
        srv_errf(e, 400, NULL, "the JSON nests deeper than %d levels", max);
}

size_t srv_text_budget(const srv_server *srv) {
    return (size_t)srv->info.ctx_size * SRV_TOKEN_BYTES;
}

int srv_text_fits(const srv_server *srv, size_t len, const char *param, srv_err *e) {
    if (len <= srv_text_budget(srv)) return 0;
    srv_errf(e, 400, param, "'%s' is %zu bytes of text; this server takes at most %zu (its "
             "context of %d tokens at %d bytes each): shorten it", param, len,
             srv_text_budget(srv), srv->info.ctx_size, SRV_TOKEN_BYTES);
    e->code = "context_length_exceeded";
    return -1;
}

cJSON *srv_json_parse(srv_server *srv, const char *body, size_t len, srv_err *e) {
    memset(e, 0, sizeof *e);
    if (!srv_utf8_valid(body, len)) {
        srv_errf(e, 400, NULL, "the body is not valid UTF-8 JSON");
        return NULL;
    }
    /* cJSON spends ~64 bytes a value: bounded before it allocates them. */
    size_t items = 2 * (size_t)srv->info.ctx_size + SRV_JSON_SPARE_ITEMS;
    int bad = srv_json_check_items(body, len, srv->o.max_json_depth, items);
    if (bad) {
        srv_json_err(e, bad, srv->o.max_json_depth);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len + 1, &end, 1);   /* body is NUL-terminated */
    if (!root) {
        srv_errf(e, 400, NULL, "invalid JSON near byte %ld", end ? (long)(end - body) : 0L);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_errf(e, 400, NULL, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

char *srv_err_json(const srv_err *e) {
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(o, "message", e->msg);
    cJSON_AddStringToObject(o, "type", e->type);
    if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
    else cJSON_AddNullToObject(o, "param");
    if (e->code) cJSON_AddStringToObject(o, "code", e->code);
    else cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- jobs ------------------------------------------------------------------- */

srv_job *srv_job_new(srv_server *srv, srv_kind kind) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->srv = srv;
    j->kind = kind;
    j->refs = 1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    dfl_gen_params_default(&j->gp);
    j->created = (long)time(NULL);
    __atomic_add_fetch(&srv->live_jobs, 1, __ATOMIC_ACQ_REL);
    return j;
}

void srv_job_unref(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    __atomic_sub_fetch(&j->srv->live_jobs, 1, __ATOMIC_ACQ_REL);
    srv_job *parent = j->parent;
    for (int i = 0; j->choices && i < j->n_choices; i++) srv_job_unref(j->choices[i]);
    free(j->choices);
    cJSON_Delete((cJSON *)j->ended);
    free(j->fail_json);
    free(j->prompt);
    free(j->bias_ids);
    free(j->bias_vals);
    free(j->fmt_schema);
    free(j->fmt_prefix);
    free(j->fmt_suffix);
    dfl_format_free(j->format);
    srv_tools_free(j->tools);
    srv_toolp_free(&j->toolp);
    cJSON_Delete((cJSON *)j->calls);
    srv_stop_free(&j->stop);
    srv_think_free(&j->think);
    srv_buf_free(&j->reasoning);
    srv_buf_free(&j->text);
    srv_buf_free(&j->prov);
    srv_buf_free(&j->out);
    cJSON_Delete((cJSON *)j->lp);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    srv_job_unref(parent);   /* a choice held its request */
}

/* ---- typed field access: 0 absent or null, 1 set, -1 error (e filled) -------- */

static cJSON *field(const cJSON *o, const char *k) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const cJSON *o, const char *k, int *out, srv_err *e) {
    cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return srv_errf(e, 400, k, "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(v);
    return 1;
}

static int get_num(const cJSON *o, const char *k, double lo, double hi, double *out,
                   srv_err *e) {
    cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return srv_errf(e, 400, k, "'%s' must be a number", k);
    double x = v->valuedouble;
    if (!(x >= lo && x <= hi))
        return srv_errf(e, 400, k, "'%s' is %g; expected %g to %g", k, x, lo, hi);
    *out = x;
    return 1;
}

static int get_int(const cJSON *o, const char *k, double lo, double hi, long long *out,
                   srv_err *e) {
    cJSON *v = field(o, k);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return srv_errf(e, 400, k, "'%s' must be an integer", k);
    double x = v->valuedouble;
    if (!(x >= lo && x <= hi))
        return srv_errf(e, 400, k, "'%s' is %.0f; expected %.0f to %.0f", k, x, lo, hi);
    *out = (long long)x;
    return 1;
}

/* ---- sampling and output fields shared by both endpoints ------------------------- */

static int parse_stop(srv_job *j, const cJSON *root, srv_err *e) {
    cJSON *v = field(root, "stop");
    if (!v) return 0;
    const cJSON *one[1] = {v};
    int n = 1;
    if (cJSON_IsArray(v)) {
        n = cJSON_GetArraySize(v);
        if (n > SRV_MAX_STOP)
            return srv_errf(e, 400, "stop", "'stop' has %d strings; at most %d", n, SRV_MAX_STOP);
    } else if (!cJSON_IsString(v)) {
        return srv_errf(e, 400, "stop", "'stop' must be a string or an array of strings");
    }
    const cJSON *it = cJSON_IsArray(v) ? v->child : one[0];
    for (int i = 0; i < n; i++, it = it->next) {
        if (!cJSON_IsString(it))
            return srv_errf(e, 400, "stop", "'stop' must be a string or an array of strings");
        size_t len = strlen(it->valuestring);
        if (len == 0 || len > SRV_MAX_STOP_LEN)
            return srv_errf(e, 400, "stop", "each stop string must be 1 to %d bytes",
                            SRV_MAX_STOP_LEN);
        j->stop.stop[j->stop.n_stop++] = strdup(it->valuestring);
    }
    return 0;
}

static int parse_logit_bias(srv_job *j, const cJSON *root, int vocab, srv_err *e) {
    cJSON *v = field(root, "logit_bias");
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return srv_errf(e, 400, "logit_bias", "'logit_bias' must be an object");
    int n = cJSON_GetArraySize(v);
    if (n > 1024) return srv_errf(e, 400, "logit_bias", "'logit_bias' has more than 1024 entries");
    j->bias_ids = calloc(n ? n : 1, sizeof *j->bias_ids);
    j->bias_vals = calloc(n ? n : 1, sizeof *j->bias_vals);
    int k = 0;
    for (cJSON *it = v->child; it; it = it->next, k++) {
        char *end;
        errno = 0;
        long id = strtol(it->string, &end, 10);
        if (errno || end == it->string || *end || id < 0 || id >= vocab)
            return srv_errf(e, 400, "logit_bias", "logit_bias key '%.32s' is not a token id below %d",
                            it->string, vocab);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return srv_errf(e, 400, "logit_bias", "logit_bias values must be numbers from -100 to 100");
        j->bias_ids[k] = (int32_t)id;
        j->bias_vals[k] = (float)it->valuedouble;
    }
    j->gp.bias_ids = j->bias_ids;
    j->gp.bias_vals = j->bias_vals;
    j->gp.n_bias = n;
    return 0;
}

static uint64_t random_seed(void) {
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) s = (uint64_t)time(NULL) ^ (uint64_t)clock();
    return s;
}

static int parse_seed(dfl_gen_params *p, const cJSON *root, srv_err *e) {
    cJSON *v = field(root, "seed");
    p->seed = random_seed();
    if (!v) return 0;
    double x = cJSON_IsNumber(v) ? v->valuedouble : 0.5;
    if (x != floor(x) || !(x >= -9.2e18 && x < 1.8e19))
        return srv_errf(e, 400, "seed", "'seed' must be an integer");
    p->seed = x >= 0 ? (uint64_t)x : (uint64_t)(int64_t)x;
    return 0;
}

/* Each line: a range-checked field copied into the params when given. */
#define NUM(key, lo, hi, dst)                                       \
    if ((r = get_num(root, key, lo, hi, &x, e)) < 0) return -1;    \
    if (r) dst = (float)x
#define INT(key, lo, hi, dst)                                       \
    if ((r = get_int(root, key, lo, hi, &i, e)) < 0) return -1;    \
    if (r) dst = (int)i

/* spec_accept: exact (default; same tokens as classic decode with the same
 * seed), rejection (the target's distribution, not token-identical) or
 * typical (lossy). */
static int parse_accept(dfl_gen_params *p, const cJSON *root, srv_err *e) {
    cJSON *v = field(root, "spec_accept");
    if (!v) return 0;
    static const char *names[] = {"exact", "rejection", "typical"};
    static const int rules[] = {DFL_ACCEPT_EXACT, DFL_ACCEPT_REJECTION, DFL_ACCEPT_TYPICAL};
    for (int k = 0; k < 3 && cJSON_IsString(v); k++)
        if (!strcmp(v->valuestring, names[k])) {
            p->spec_accept = rules[k];
            return 0;
        }
    return srv_errf(e, 400, "spec_accept",
                    "'spec_accept' must be \"exact\", \"rejection\" or \"typical\"");
}

static int parse_sampling(srv_job *j, const cJSON *root, srv_err *e) {
    dfl_gen_params *p = &j->gp;
    double x;
    long long i;
    int r, b;
    p->temperature = (float)j->srv->o.default_temp;
    NUM("temperature", 0, 2, p->temperature);
    NUM("top_p", 0, 1, p->top_p);
    INT("top_k", 0, 1e9, p->top_k);
    NUM("min_p", 0, 1, p->min_p);
    NUM("presence_penalty", -2, 2, p->presence_penalty);
    NUM("frequency_penalty", -2, 2, p->frequency_penalty);
    NUM("repeat_penalty", 0.01, 100, p->repeat_penalty);
    INT("repeat_last_n", 0, 1e9, p->repeat_last_n);
    INT("block_size", 0, DFL_MAX_BLOCK, p->block_size);
    j->user_block = r;
    p->tree_budget = j->srv->o.tree_budget;
    INT("tree_budget", -1, DFL_MAX_TREE, p->tree_budget);
    if (parse_seed(p, root, e) < 0) return -1;
    if ((r = get_bool(root, "ignore_eos", &b, e)) < 0) return -1;
    if (r) p->ignore_eos = b;
    NUM("typical", 0, 1e6, p->typical_d);
    return parse_accept(p, root, e);
}
#undef NUM
#undef INT

static int parse_common(srv_job *j, const cJSON *root, srv_err *e) {
    srv_server *srv = j->srv;
    cJSON *v = field(root, "model");
    if (v) {
        if (!cJSON_IsString(v)) return srv_errf(e, 400, "model", "'model' must be a string");
        if (strcmp(v->valuestring, srv->model_id) && strcmp(v->valuestring, srv->o.model_path)) {
            srv_errf(e, 404, "model", "The model '%.200s' does not exist; this server serves '%s'",
                     v->valuestring, srv->model_id);
            e->code = "model_not_found";
            return -1;
        }
    }
    snprintf(j->model, sizeof j->model, "%s", srv->model_id);
    long long i = 1;
    if (get_int(root, "n", 1, SRV_MAX_CHOICES, &i, e) < 0)
        return srv_errf(e, 400, "n", "'n' must be an integer from 1 to %d", SRV_MAX_CHOICES);
    j->n_choices = (int)i;
    if (get_int(root, "best_of", 1, 1, &i, e) < 0)
        return srv_errf(e, 400, "best_of", "'best_of' must be 1");
    if (get_bool(root, "stream", &j->stream, e) < 0) return -1;
    if (get_bool(root, "return_provenance", &j->provenance, e) < 0) return -1;
    cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return srv_errf(e, 400, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &j->include_usage, e) < 0) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return -1;
        }
    }
    if (parse_stop(j, root, e) < 0) return -1;
    if (parse_sampling(j, root, e) < 0) return -1;
    if (parse_logit_bias(j, root, srv->info.vocab, e) < 0) return -1;
    return 0;
}

/* max_tokens / max_completion_tokens, clamped to the context left after the prompt. */
static int parse_max_tokens(srv_job *j, const cJSON *root, srv_err *e) {
    long long a = -1, b = -1;
    if (get_int(root, "max_tokens", 1, 1e9, &a, e) < 0) return -1;
    if (get_int(root, "max_completion_tokens", 1, 1e9, &b, e) < 0) return -1;
    int room = j->srv->info.ctx_size - j->n_prompt;
    long long want = b > 0 ? b : a > 0 ? a : j->kind == SRV_COMPLETION ? 16 : room;
    j->gp.max_tokens = (int)(want < room ? want : room);
    return 0;
}

/* ---- prompts ------------------------------------------------------------------ */

/* param: the request field the text came from ("prompt" or "messages"), for errors. */
static int tokenize(srv_job *j, const char *text, size_t len, int add_special, const char *param,
                    srv_err *e) {
    srv_server *srv = j->srv;
    int cap = srv->info.ctx_size;
    dfl_error err = {0};
    if (srv_text_fits(srv, len, param, e)) return -1;
    j->prompt = malloc(sizeof(int32_t) * (size_t)cap);
    if (!j->prompt) return srv_errf(e, 500, NULL, "out of memory");
    int n = dfl_tokenize(srv->e, text, len, add_special, 1, j->prompt, cap, &err);
    if (n < 0) return srv_errf(e, 400, NULL, "could not tokenize the prompt: %s", err.msg);
    if (n == 0) return srv_errf(e, 400, NULL, "the prompt is empty");
    if (n >= cap) {
        srv_errf(e, 400, param,
                 "the prompt is %d tokens; this server's context holds %d (prompt + output)", n,
                 cap);
        e->code = "context_length_exceeded";
        return -1;
    }
    j->n_prompt = n;
    return 0;
}

/* Completions: prompt is a string, [string], [token ids] or [[token ids]]. */
static int parse_prompt(srv_job *j, const cJSON *root, srv_err *e) {
    cJSON *p = field(root, "prompt");
    if (!p) return srv_errf(e, 400, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 1 && !cJSON_IsNumber(p->child))
        return srv_errf(e, 400, "prompt", "one prompt per request (batches are not supported)");
    if (cJSON_IsString(p))
        return tokenize(j, p->valuestring, strlen(p->valuestring), 1, "prompt", e);
    if (!cJSON_IsArray(p))
        return srv_errf(e, 400, "prompt", "'prompt' must be a string or an array of token ids");
    int n = cJSON_GetArraySize(p), cap = j->srv->info.ctx_size;
    if (n == 0) return srv_errf(e, 400, "prompt", "the prompt is empty");
    if (n >= cap) {
        srv_errf(e, 400, "prompt", "the prompt is %d tokens; this server's context holds %d", n, cap);
        e->code = "context_length_exceeded";
        return -1;
    }
    j->prompt = malloc(sizeof(int32_t) * (size_t)n);
    int k = 0;
    for (cJSON *it = p->child; it; it = it->next) {
        double x = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (x != floor(x) || x < 0 || x >= j->srv->info.vocab)
            return srv_errf(e, 400, "prompt", "prompt token %d is not a token id below %d", k,
                            j->srv->info.vocab);
        j->prompt[k++] = (int32_t)x;
    }
    j->n_prompt = n;
    return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":...} parts. */
static int message_text(const cJSON *c, int i, srv_buf *out, srv_err *e) {
    char param[48];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c) return 0;
    if (cJSON_IsString(c)) {
        srv_buf_puts(out, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c)) return srv_errf(e, 400, param, "'%s' must be a string or an array", param);
    int k = 0;
    for (cJSON *part = c->child; part; part = part->next, k++) {
        cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text"))
            return srv_errf(e, 400, param, "content part %d: only {\"type\": \"text\"} parts are supported", k);
        if (!cJSON_IsString(text))
            return srv_errf(e, 400, param, "content part %d: 'text' must be a string", k);
        if (k) srv_buf_puts(out, "\n");
        srv_buf_puts(out, text->valuestring);
    }
    return 0;
}

/* messages as the template sees them: role, content as text, and the fields of
 * tool calls and their results. NULL and e filled on any problem. */
static cJSON *chat_messages(const cJSON *m, srv_err *e) {
    cJSON *arr = cJSON_CreateArray();
    srv_buf text = {0};
    int i = 0;
    for (cJSON *it = m->child; it; it = it->next, i++) {
        char param[40];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(it)) {
            srv_errf(e, 400, param, "'%s' must be an object", param);
            goto fail;
        }
        cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsString(role)) {
            srv_errf(e, 400, param, "'%s.role' must be a string", param);
            goto fail;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            srv_errf(e, 400, param, "'%s.role' is '%.32s'; expected system, developer, user, "
                     "assistant or tool", param, r);
            goto fail;
        }
        cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (cJSON_IsNull(c)) c = NULL;
        if (!c && strcmp(r, "assistant")) {
            srv_errf(e, 400, param, "'%s.content' is required", param);
            goto fail;
        }
        text.len = 0;
        if (message_text(c, i, &text, e) < 0) goto fail;
        srv_buf_put(&text, "", 0);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "role", r);
        cJSON_AddStringToObject(o, "content", text.p);   /* null content: "" as before */
        if (srv_tool_message(it, i, r, o, e) < 0) goto fail;
    }
    srv_buf_free(&text);
    return arr;
fail:
    srv_buf_free(&text);
    cJSON_Delete(arr);
    return NULL;
}

/* The chat body's prompt text through the template (tools included), malloc'd;
 * *len its bytes. NULL and e filled on any problem. */
static char *render_chat(srv_job *j, const cJSON *root, int *len, srv_err *e) {
    srv_server *srv = j->srv;
    cJSON *m = field(root, "messages");
    if (!m) return srv_errf(e, 400, "messages", "'messages' is required"), NULL;
    if (!cJSON_IsArray(m)) return srv_errf(e, 400, "messages", "'messages' must be an array"), NULL;
    if (cJSON_GetArraySize(m) == 0) return srv_errf(e, 400, "messages", "'messages' is empty"), NULL;
    int thinking = 1;
    cJSON *kw = field(root, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw))
            return srv_errf(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object"), NULL;
        if (get_bool(kw, "enable_thinking", &thinking, e) < 0) {
            snprintf(e->param, sizeof e->param, "chat_template_kwargs.enable_thinking");
            return NULL;
        }
    }
    const char *tmpl = srv->o.chat_template ? srv->o.chat_template : dfl_chat_template(srv->e, NULL);
    if (srv_parse_tools(j, root, tmpl, e) < 0) return NULL;
    cJSON *msgs = chat_messages(m, e);
    if (!msgs) return NULL;
    char *mj = cJSON_PrintUnformatted(msgs);
    char *tj = j->tools ? cJSON_PrintUnformatted(j->tools->list) : NULL;
    const char *kj = thinking ? "{\"enable_thinking\":true}" : "{\"enable_thinking\":false}";
    cJSON_Delete(msgs);
    char *rendered = NULL;
    dfl_error err = {0};
    /* The token budget, before rendering: the messages and tools are in the prompt. */
    size_t in = (mj ? strlen(mj) : 0) + (tj ? strlen(tj) : 0);
    if (srv_text_fits(srv, in, "messages", e)) {
        cJSON_free(mj), cJSON_free(tj);
        return NULL;
    }
    size_t cap = 4096 + 2 * in;
    int64_t now = (int64_t)time(NULL);   /* one clock for both tries */
    for (int tries = 0; tries < 2 && mj; tries++) {
        free(rendered);
        rendered = malloc(cap);
        int n = rendered ? dfl_chat_render_json(srv->e, srv->o.chat_template, mj, tj, kj, 1,
                                                now, rendered, cap, &err)
                         : DFL_ENOMEM;
        if (n < 0) {
            srv_errf(e, 400, "messages", "could not render the chat template: %s", err.msg);
            break;
        }
        if ((size_t)n < cap) {
            *len = n;
            cJSON_free(mj), cJSON_free(tj);
            return rendered;
        }
        cap = (size_t)n + 1;
    }
    if (!e->status)
        srv_errf(e, 500, NULL, mj ? "the chat template's output size changed between calls"
                                  : "out of memory");
    free(rendered);
    cJSON_free(mj), cJSON_free(tj);
    return NULL;
}

static int parse_messages(srv_job *j, const cJSON *root, srv_err *e) {
    int len;
    char *rendered = render_chat(j, root, &len, e);
    if (!rendered) return -1;
    srv_think_init(&j->think, j->srv->o.reasoning, rendered, (size_t)len);
    /* The template writes the special tokens as text (BOS included). */
    int ret = tokenize(j, rendered, (size_t)len, 0, "messages", e);
    free(rendered);
    return ret;
}

/* response_format: text (nothing), json_object (any object), or json_schema
 * ({json_schema: {name, schema, strict, description}}). 1 when it set a format. */
static int parse_response_format(srv_job *j, const cJSON *root, srv_err *e) {
    const cJSON *rf = field(root, "response_format");
    if (!rf) return 0;
    const char *P = "response_format";
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rf, "type"));
    if (!cJSON_IsObject(rf) || !type)
        return srv_errf(e, 400, P, "expected {\"type\": \"text\" | \"json_object\" | "
                        "\"json_schema\", ...}");
    if (!strcmp(type, "text")) return 0;
    if (j->fmt_on)
        return srv_errf(e, 400, P, "response_format cannot be combined with a required tool call");
    if (!strcmp(type, "json_object")) return j->fmt_on = 1;
    if (strcmp(type, "json_schema"))
        return srv_errf(e, 400, P, "type \"%.40s\": expected text, json_object or json_schema",
                        type);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(js) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(js, "name")))
        return srv_errf(e, 400, P, "json_schema: expected {\"name\": ..., \"schema\": {...}}");
    if (schema && !cJSON_IsObject(schema))
        return srv_errf(e, 400, P, "json_schema.schema: expected an object");
    j->fmt_on = 1;
    if (schema && !(j->fmt_schema = cJSON_PrintUnformatted(schema)))
        return srv_errf(e, 500, P, "out of memory");
    return 1;
}

/* Compiles the job's format: response_format's, or the call a required /
 * named tool_choice must make (param: which the errors name). */
static int compile_format(srv_job *j, const char *param, srv_err *e) {
    if (!j->fmt_on) return 0;
    dfl_error err = {0};
    if (dfl_format_new(j->srv->e, j->fmt_schema, j->fmt_prefix, j->fmt_suffix, &j->format, &err))
        return srv_errf(e, err.code == DFL_ENOMEM ? 500 : 400, param, "%s", err.msg);
    j->gp.format = j->format;
    return 0;
}

static int parse_logprobs(srv_job *j, const cJSON *root, srv_err *e) {
    long long k = 0;
    if (j->kind == SRV_CHAT) {
        if (get_bool(root, "logprobs", &j->logprobs, e) < 0) return -1;
        if (get_int(root, "top_logprobs", 0, DFL_MAX_TOP_LOGPROBS, &k, e) < 0) return -1;
        j->top_logprobs = j->logprobs ? (int)k : 0;
    } else {
        /* Completions: logprobs is the number of alternatives (0..DFL_MAX_TOP_LOGPROBS). */
        int r = get_int(root, "logprobs", 0, DFL_MAX_TOP_LOGPROBS, &k, e);
        if (r < 0) return -1;
        j->logprobs = r > 0;
        j->top_logprobs = (int)k;
    }
    j->gp.n_top_logprobs = j->top_logprobs;
    j->gp.no_logprob = !j->logprobs;   /* a token's logprob is a pass over the vocabulary */
    return 0;
}

/* The request fields this server implements (OpenAI's, and llama.cpp's / dflash's
 * extensions). Any other is refused by name, as OpenAI does, unless --lenient. */
static const char *const known_common[] = {
    "model", "n", "best_of", "stream", "stream_options", "stop", "seed", "temperature", "top_p",
    "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n",
    "logit_bias", "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens",
    "ignore_eos", "block_size", "tree_budget", "spec_accept", "typical", "return_provenance",
    "user", /* an end-user id: OpenAI keeps it for abuse monitoring; it changes no output */
    "response_format",
};

static int known_field(srv_kind kind, const char *k) {
    for (size_t i = 0; i < sizeof known_common / sizeof known_common[0]; i++)
        if (!strcmp(k, known_common[i])) return 1;
    if (kind == SRV_CHAT)
        return !strcmp(k, "messages") || !strcmp(k, "chat_template_kwargs") || !strcmp(k, "tools") ||
               !strcmp(k, "tool_choice") || !strcmp(k, "parallel_tool_calls");
    return !strcmp(k, "prompt");
}

static int check_fields(const srv_server *srv, srv_kind kind, const cJSON *root, srv_err *e) {
    if (srv->o.lenient) return 0;
    for (const cJSON *c = root->child; c; c = c->next)
        if (!known_field(kind, c->string))
            return srv_errf(e, 400, c->string, "'%.100s' is not supported by this server (start "
                            "it with --lenient to ignore fields it does not implement)",
                            c->string);
    return 0;
}

/* The body as a JSON object with only known fields, and a new job for it. */
static cJSON *parse_body(srv_server *srv, srv_kind kind, const char *body, size_t len,
                         srv_job **j, srv_err *e) {
    *j = NULL;
    cJSON *root = srv_json_parse(srv, body, len, e);
    if (!root) return NULL;
    *j = srv_job_new(srv, kind);
    if (!*j) {
        srv_errf(e, 500, NULL, "out of memory");
        goto fail;
    }
    if (check_fields(srv, kind, root, e) < 0) goto fail;
    return root;
fail:
    cJSON_Delete(root);
    srv_job_unref(*j);
    *j = NULL;
    return NULL;
}

char *srv_apply_template(srv_server *srv, const char *body, size_t len, srv_err *e) {
    srv_job *j;
    cJSON *root = parse_body(srv, SRV_CHAT, body, len, &j, e);
    if (!root) return NULL;
    int n;
    char *text = render_chat(j, root, &n, e), *out = NULL;
    if (text) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prompt", text);
        out = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!out) srv_errf(e, 500, NULL, "out of memory");
    }
    free(text);
    cJSON_Delete(root);
    srv_job_unref(j);
    return out;
}

/* One choice's job: the body parsed and tokenized. */
static srv_job *parse_one(srv_server *srv, srv_kind kind, const char *body, size_t len,
                          srv_err *e) {
    srv_job *j;
    cJSON *root = parse_body(srv, kind, body, len, &j, e);
    if (!root) return NULL;
    if (parse_common(j, root, e) < 0 || parse_logprobs(j, root, e) < 0) goto fail;
    if ((kind == SRV_CHAT ? parse_messages(j, root, e) : parse_prompt(j, root, e)) < 0) goto fail;
    if (parse_max_tokens(j, root, e) < 0) goto fail;
    int rf = parse_response_format(j, root, e);
    if (rf < 0 || compile_format(j, rf ? "response_format" : "tools", e) < 0) goto fail;
    cJSON_Delete(root);
    return j;
fail:
    cJSON_Delete(root);
    srv_job_unref(j);
    return NULL;
}

/* ---- n > 1 ------------------------------------------------------------------------ */

/* definition: choice i samples with seed + i * 0x9E3779B97F4A7C15 (mod 2^64), so
 * choice 0 is exactly the n = 1 answer, and requests whose seeds differ by a
 * little (1, 2, 3...) share no choice. */
static uint64_t choice_seed(uint64_t seed, int i) {
    return seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL;
}

/* Each choice is the body parsed again, so that every field (and any field added
 * later) reaches it exactly as it reaches an n = 1 request; only the seed differs. */
static int parse_choices(srv_job *j, const char *body, size_t len, srv_err *e) {
    j->choices = calloc((size_t)j->n_choices, sizeof *j->choices);
    if (!j->choices) return srv_errf(e, 500, NULL, "out of memory");
    if (!j->stream) {
        j->ended = cJSON_CreateArray();
        for (int i = 0; i < j->n_choices; i++) cJSON_AddItemToArray(j->ended, cJSON_CreateNull());
    }
    for (int i = 0; i < j->n_choices; i++) {
        srv_job *c = parse_one(j->srv, j->kind, body, len, e);
        if (!c) return -1;
        j->choices[i] = c;
        c->index = i;
        c->gp.seed = choice_seed(j->gp.seed, i);
        c->created = j->created;
    }
    return 0;
}

srv_job *srv_parse_job(srv_server *srv, srv_kind kind, const char *body, size_t len, srv_err *e) {
    srv_job *j = parse_one(srv, kind, body, len, e);
    if (j && j->n_choices > 1 && parse_choices(j, body, len, e) < 0) {
        srv_job_unref(j);
        return NULL;
    }
    return j;
}
