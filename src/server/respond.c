/* respond.c - what a job sends: OpenAI chat.completion(.chunk) and
 * text_completion JSON, SSE framing, usage, and the engine's timings and
 * speculative statistics in the extra fields "timings" (llama.cpp's names)
 * and "dflash". */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "server.h"

static const char *finish_name(const srv_job *j) {
    return j->finish == SRV_FIN_LENGTH ? "length" : j->calls ? "tool_calls" : "stop";
}

/* The fields every response and chunk starts with. */
static cJSON *base(const srv_job *j, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", j->kind == SRV_COMPLETION ? "text_completion"
                                         : chunk                  ? "chat.completion.chunk"
                                                                  : "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->model);
    cJSON_AddStringToObject(o, "system_fingerprint", "dflash");
    return o;
}

/* Appends to out under the lock and wakes the HTTP side. A choice of a request
 * with n > 1 writes into its request's out. */
static void put(srv_job *j, const char *s, size_t n, int sse) {
    if (j->parent) j = j->parent;
    pthread_mutex_lock(&j->mu);
    if (sse) srv_buf_puts(&j->out, "data: ");
    srv_buf_put(&j->out, s, n);
    if (sse) srv_buf_puts(&j->out, "\n\n");
    srv_job_signal(j);
    pthread_mutex_unlock(&j->mu);
}

static void put_json(srv_job *j, cJSON *o, int sse) {
    char *s = cJSON_PrintUnformatted(o);
    put(j, s, strlen(s), sse);
    cJSON_free(s);
    cJSON_Delete(o);
}

/* ---- logprobs ------------------------------------------------------------------ */

/* A token's own text (special tokens shown), as its own detokenizer sees it. */
static void token_text(srv_job *j, int32_t id, srv_buf *out) {
    char buf[256];
    dfl_detok d;
    out->len = 0;
    dfl_detok_init(&d, j->srv->e, 1);
    d.first = 0;   /* a token's text keeps its leading space */
    int n = dfl_detok_push(&d, id, buf, sizeof buf);
    if (n > 0) srv_utf8_sanitize(out, buf, (size_t)n);
    n = dfl_detok_flush(&d, buf, sizeof buf);
    if (n > 0) srv_utf8_sanitize(out, buf, (size_t)n);
    srv_buf_put(out, "", 0);
}

static cJSON *bytes_array(const srv_buf *t) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < t->len; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)t->p[i]));
    return a;
}

/* Chat shape: {"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}. */
static cJSON *lp_entry(srv_job *j, const dfl_token_info *t) {
    srv_buf txt = {0};
    cJSON *o = cJSON_CreateObject();
    token_text(j, t->id, &txt);
    cJSON_AddStringToObject(o, "token", txt.p);
    cJSON_AddNumberToObject(o, "logprob", t->logprob);
    cJSON_AddItemToObject(o, "bytes", bytes_array(&txt));
    cJSON_AddNumberToObject(o, "id", t->id);
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    int n = t->n_top < j->top_logprobs ? t->n_top : j->top_logprobs;
    for (int k = 0; k < n; k++) {
        cJSON *a = cJSON_CreateObject();
        token_text(j, t->top_ids[k], &txt);
        cJSON_AddStringToObject(a, "token", txt.p);
        cJSON_AddNumberToObject(a, "logprob", t->top_logprobs[k]);
        cJSON_AddItemToObject(a, "bytes", bytes_array(&txt));
        cJSON_AddNumberToObject(a, "id", t->top_ids[k]);
        cJSON_AddItemToArray(top, a);
    }
    srv_buf_free(&txt);
    return o;
}

/* Completions shape from chat-shaped entries: parallel arrays. */
static cJSON *lp_completion(cJSON *entries, size_t offset0, const cJSON *offsets) {
    cJSON *o = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    const cJSON *off = offsets ? offsets->child : NULL;
    for (cJSON *en = entries ? entries->child : NULL; en; en = en->next) {
        cJSON_AddItemToArray(tokens, cJSON_CreateString(cJSON_GetObjectItem(en, "token")->valuestring));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(cJSON_GetObjectItem(en, "logprob")->valuedouble));
        cJSON *m = cJSON_CreateObject();
        cJSON *top = cJSON_GetObjectItem(en, "top_logprobs");
        for (cJSON *a = top->child; a; a = a->next) {
            const char *tok = cJSON_GetObjectItem(a, "token")->valuestring;
            if (!cJSON_GetObjectItemCaseSensitive(m, tok))
                cJSON_AddNumberToObject(m, tok, cJSON_GetObjectItem(a, "logprob")->valuedouble);
        }
        cJSON_AddItemToArray(tops, m);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(off ? off->valuedouble : (double)offset0));
        if (off) off = off->next;
    }
    return o;
}

/* ---- usage, timings, speculative stats ------------------------------------------- */

static void add_usage(cJSON *o, const srv_job *j) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->n_cached);
}

/* Milliseconds and rates to 3 decimals: enough, and short on the wire. */
static void num3(cJSON *o, const char *k, double v) {
    cJSON_AddNumberToObject(o, k, round(v * 1e3) / 1e3);
}

static void add_stats(cJSON *o, const srv_job *j) {
    const dfl_stats *s = &j->st;
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    int np = s->n_prompt ? s->n_prompt : j->n_prompt;
    cJSON_AddNumberToObject(t, "cache_n", j->n_cached);
    cJSON_AddNumberToObject(t, "prompt_n", np);
    num3(t, "prompt_ms", s->t_prefill * 1e3);
    num3(t, "prompt_per_token_ms", np ? s->t_prefill * 1e3 / np : 0);
    num3(t, "prompt_per_second", s->t_prefill > 0 ? np / s->t_prefill : 0);
    cJSON_AddNumberToObject(t, "predicted_n", j->n_gen);
    num3(t, "predicted_ms", s->t_decode * 1e3);
    num3(t, "predicted_per_token_ms", j->n_gen ? s->t_decode * 1e3 / j->n_gen : 0);
    num3(t, "predicted_per_second", s->t_decode > 0 ? j->n_gen / s->t_decode : 0);
    num3(t, "draft_ms", s->t_draft * 1e3);
    num3(t, "verify_ms", s->t_verify * 1e3);
    num3(t, "queue_ms", (j->t_start - j->t_submit) * 1e3);
    cJSON_AddNumberToObject(t, "draft_n", (double)s->proposed);
    cJSON_AddNumberToObject(t, "draft_n_accepted", (double)s->accepted);

    cJSON *d = cJSON_AddObjectToObject(o, "dflash");
    cJSON_AddNumberToObject(d, "rounds", (double)s->rounds);
    cJSON_AddNumberToObject(d, "proposed", (double)s->proposed);
    cJSON_AddNumberToObject(d, "accepted", (double)s->accepted);
    cJSON_AddNumberToObject(d, "committed", (double)s->committed);
    num3(d, "tau", s->rounds ? (double)s->committed / (double)s->rounds : 0);
    num3(d, "acceptance_rate", s->proposed ? (double)s->accepted / (double)s->proposed : 0);
    cJSON_AddNumberToObject(d, "classic_steps", (double)s->classic_steps);
    cJSON_AddNumberToObject(d, "block_size", j->gp.block_size);
    cJSON_AddNumberToObject(d, "tree_budget", j->gp.tree_budget);
    cJSON_AddNumberToObject(d, "tree_rounds", (double)s->tree_rounds);
    num3(d, "tree_mean_accepted",
         s->tree_rounds ? (double)s->tree_accepted / (double)s->tree_rounds : 0);
    cJSON *lanes = cJSON_AddObjectToObject(d, "lanes");   /* who drafted the rounds */
    for (int l = 0; l < DFL_LANES; l++) {
        cJSON *x = cJSON_AddObjectToObject(lanes, dfl_lane_name(l));
        cJSON_AddNumberToObject(x, "rounds", (double)s->lane_rounds[l]);
        cJSON_AddNumberToObject(x, "proposed", (double)s->lane_proposed[l]);
        cJSON_AddNumberToObject(x, "accepted", (double)s->lane_accepted[l]);
        cJSON_AddNumberToObject(x, "committed", (double)s->lane_committed[l]);
    }
    cJSON_AddStringToObject(d, "note", s->note);
}

/* ---- provenance ------------------------------------------------------------------- */

void srv_emit_kind(srv_job *j, const dfl_token_info *tok) {
    int k = tok->kind;
    if (j->provenance) srv_buf_put(&j->prov, &SRV_PROV_LETTERS[k >= 0 && k <= 2 ? k : 0], 1);
}

/* Choice c takes the letters not sent yet (the buffer is NUL-terminated). */
static void add_prov(srv_job *j, cJSON *c) {
    if (!j->provenance || j->prov.len == j->prov_sent) return;
    cJSON_AddStringToObject(c, "provenance", j->prov.p + j->prov_sent);
    j->prov_sent = j->prov.len;
}

/* ---- events -------------------------------------------------------------------- */

void srv_emit_begin(srv_job *j) {
    if (!j->stream) {
        j->lp = cJSON_CreateArray();
        return;
    }
    if (j->kind != SRV_CHAT) return;
    /* The first chat chunk names the role, as OpenAI's does. */
    cJSON *o = base(j, 1);
    cJSON *c = cJSON_CreateObject();
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    cJSON_AddNumberToObject(c, "index", j->index);
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    if (j->include_usage) cJSON_AddNullToObject(o, "usage");
    put_json(j, o, 1);
}

void srv_emit_token(srv_job *j, const dfl_token_info *tok, const char *text, size_t n,
                    const char *reason, size_t rn) {
    cJSON *lp = tok && j->logprobs ? lp_entry(j, tok) : NULL;
    if (!j->stream) {
        if (lp) {
            cJSON_AddNumberToObject(lp, "text_offset", (double)j->text.len);
            cJSON_AddItemToArray((cJSON *)j->lp, lp);
        }
        srv_buf_put(&j->text, text, n);
        if (rn) srv_buf_put(&j->reasoning, reason, rn);
        return;
    }
    size_t off = j->text_off;
    j->text_off += n;
    if (!n && !rn && !lp) return;
    cJSON *o = base(j, 1), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", j->index);
    if (j->kind == SRV_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (rn) cJSON_AddStringToObject(d, "reasoning_content", reason);
        if (n || !rn) cJSON_AddStringToObject(d, "content", text);
        if (lp) {
            cJSON *l = cJSON_AddObjectToObject(c, "logprobs");
            cJSON_AddItemToArray(cJSON_AddArrayToObject(l, "content"), lp);
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
    } else {
        cJSON_AddStringToObject(c, "text", text);
        if (lp) {
            cJSON *one = cJSON_CreateArray();
            cJSON_AddItemToArray(one, lp);
            cJSON_AddItemToObject(c, "logprobs", lp_completion(one, off, NULL));
            cJSON_Delete(one);
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
    }
    cJSON_AddNullToObject(c, "finish_reason");
    add_prov(j, c);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    if (j->include_usage) cJSON_AddNullToObject(o, "usage");
    put_json(j, o, 1);
}

/* ---- tool calls ------------------------------------------------------------------ */

/* A chunk whose one choice carries delta. */
static void put_delta(srv_job *j, cJSON *delta) {
    cJSON *o = base(j, 1), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", j->index);
    cJSON_AddItemToObject(c, "delta", delta);
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    if (j->include_usage) cJSON_AddNullToObject(o, "usage");
    put_json(j, o, 1);
}

/* One parsed call {name, arguments}: kept for the final message, and streamed
 * as OpenAI does: its index, id, type and name with empty arguments, then the
 * arguments. */
static void emit_call(srv_job *j, const cJSON *call) {
    const char *name = cJSON_GetObjectItem(call, "name")->valuestring;
    const char *args = cJSON_GetObjectItem(call, "arguments")->valuestring;
    char id[SRV_CALL_ID_MAX];
    srv_tools_call_id(j->tools->family, id);
    if (!j->calls) j->calls = cJSON_CreateArray();
    int index = cJSON_GetArraySize(j->calls);
    cJSON *tc = cJSON_CreateObject(), *f;
    cJSON_AddStringToObject(tc, "id", id);
    cJSON_AddStringToObject(tc, "type", "function");
    f = cJSON_AddObjectToObject(tc, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddItemToArray((cJSON *)j->calls, tc);
    if (!j->stream) return;
    for (int part = 0; part < 2; part++) {
        cJSON *d = cJSON_CreateObject(), *one = cJSON_CreateObject();
        cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), one);
        cJSON_AddNumberToObject(one, "index", index);
        if (!part) {
            cJSON_AddStringToObject(one, "id", id);
            cJSON_AddStringToObject(one, "type", "function");
        }
        f = cJSON_AddObjectToObject(one, "function");
        if (!part) cJSON_AddStringToObject(f, "name", name);
        cJSON_AddStringToObject(f, "arguments", part ? args : "");
        put_delta(j, d);
    }
}

void srv_emit_answer(srv_job *j, const dfl_token_info *tok, const char *text, size_t n,
                     const char *reason, size_t rn, int final) {
    if (!j->toolp.t) {
        srv_emit_token(j, tok, text, n, reason, rn);
        return;
    }
    srv_buf c = {0};
    cJSON *calls = cJSON_CreateArray();
    srv_toolp_push(&j->toolp, text, n, final, &c, calls);
    srv_emit_token(j, tok, c.p ? c.p : "", c.len, reason, rn);
    for (const cJSON *it = calls->child; it; it = it->next) emit_call(j, it);
    cJSON_Delete(calls);
    srv_buf_free(&c);
}

/* The stream's last chunk with include_usage: no choices, the usage. */
static void usage_chunk(srv_job *j) {
    cJSON *o = base(j, 1);
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, j);
    add_stats(o, j);
    put_json(j, o, 1);
}

static void end_stream(srv_job *j, const srv_err *fail) {
    if (fail) {
        char *s = srv_err_json(fail);
        put(j, s, strlen(s), 1);
        cJSON_free(s);
    } else {
        cJSON *o = base(j, 1), *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", j->index);
        if (j->kind == SRV_CHAT) cJSON_AddObjectToObject(c, "delta");
        else cJSON_AddStringToObject(c, "text", "");
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", finish_name(j));
        add_prov(j, c);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
        if (j->include_usage) cJSON_AddNullToObject(o, "usage");
        add_stats(o, j);
        put_json(j, o, 1);
        if (j->include_usage && !j->parent) usage_chunk(j);
    }
    if (!j->parent) put(j, "[DONE]", 6, 1);   /* a choice's request ends its stream */
}

static cJSON *whole_choice(srv_job *j);
static void keep_choice(srv_job *j, cJSON *c);

static void end_whole(srv_job *j, const srv_err *fail) {
    if (fail) {
        char *s = srv_err_json(fail);
        j->http_status = fail->status;
        put(j, s, strlen(s), 0);
        cJSON_free(s);
        return;
    }
    cJSON *c = whole_choice(j);
    if (j->parent) {
        keep_choice(j, c);
        return;
    }
    cJSON *o = base(j, 0);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    add_usage(o, j);
    add_stats(o, j);
    j->http_status = 200;
    put_json(j, o, 0);
}

/* A non-streamed response's choice: text or message, logprobs, finish_reason. */
static cJSON *whole_choice(srv_job *j) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", j->index);
    cJSON *entries = (cJSON *)j->lp;
    if (j->kind == SRV_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (j->calls && !j->text.len) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", j->text.p ? j->text.p : "");
        if (j->calls) cJSON_AddItemToObject(m, "tool_calls", cJSON_Duplicate(j->calls, 1));
        if (j->reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", j->reasoning.p);
        if (j->logprobs) {
            cJSON *l = cJSON_AddObjectToObject(c, "logprobs");
            cJSON *arr = cJSON_Duplicate(entries, 1);
            for (cJSON *en = arr->child; en; en = en->next)
                cJSON_DeleteItemFromObject(en, "text_offset");
            cJSON_AddItemToObject(l, "content", arr);
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
    } else {
        cJSON_AddStringToObject(c, "text", j->text.p ? j->text.p : "");
        if (j->logprobs) {
            cJSON *offs = cJSON_CreateArray();
            for (cJSON *en = entries->child; en; en = en->next)
                cJSON_AddItemToArray(offs, cJSON_CreateNumber(
                                               cJSON_GetObjectItem(en, "text_offset")->valuedouble));
            cJSON_AddItemToObject(c, "logprobs", lp_completion(entries, 0, offs));
            cJSON_Delete(offs);
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
    }
    cJSON_AddStringToObject(c, "finish_reason", finish_name(j));
    add_prov(j, c);
    return c;
}

/* ---- n > 1: a request's choices end one by one ------------------------------------- */

static void keep_choice(srv_job *j, cJSON *c) {
    srv_job *g = j->parent;
    pthread_mutex_lock(&g->mu);
    cJSON_ReplaceItemInArray((cJSON *)g->ended, j->index, c);
    pthread_mutex_unlock(&g->mu);
}

/* The request's numbers: generated tokens and engine work summed over its
 * choices; the prompt counted once, as OpenAI does, with the most any choice
 * found cached; queue_ms until the first choice started. */
static void sum_choice(srv_job *g, const srv_job *j) {
    dfl_stats *a = &g->st;
    const dfl_stats *b = &j->st;
    g->n_gen += j->n_gen;
    if (j->n_cached > g->n_cached) g->n_cached = j->n_cached;
    if (!g->t_start || j->t_start < g->t_start) g->t_start = j->t_start;
    if (j->t_end > g->t_end) g->t_end = j->t_end;
    a->n_gen += b->n_gen;
    a->t_prefill += b->t_prefill, a->t_decode += b->t_decode;
    a->t_draft += b->t_draft, a->t_verify += b->t_verify, a->t_other += b->t_other;
    a->rounds += b->rounds, a->proposed += b->proposed, a->accepted += b->accepted;
    a->committed += b->committed, a->classic_steps += b->classic_steps;
    a->tree_rounds += b->tree_rounds, a->tree_nodes += b->tree_nodes;
    a->tree_accepted += b->tree_accepted;
    for (int l = 0; l < DFL_LANES; l++) {
        a->lane_rounds[l] += b->lane_rounds[l], a->lane_proposed[l] += b->lane_proposed[l];
        a->lane_accepted[l] += b->lane_accepted[l], a->lane_committed[l] += b->lane_committed[l];
    }
    if (!a->note[0]) memcpy(a->note, b->note, sizeof a->note);
}

/* After the last choice: the whole response, or the stream's usage chunk and
 * [DONE]; the first error instead when a choice failed. Nothing when the client left. */
static void end_choices(srv_job *g) {
    if (g->n_cancelled) return;
    if (g->fail_json) {
        g->http_status = g->fail_status;
        put(g, g->fail_json, strlen(g->fail_json), g->stream);
    } else if (!g->stream) {
        cJSON *o = base(g, 0);
        cJSON_AddItemToObject(o, "choices", (cJSON *)g->ended);
        g->ended = NULL;
        add_usage(o, g);
        add_stats(o, g);
        g->http_status = 200;
        put_json(g, o, 0);
    } else if (g->include_usage) {
        usage_chunk(g);
    }
    if (g->stream) put(g, "[DONE]", 6, 1);
}

static void choice_ended(srv_job *j, const srv_err *fail) {
    srv_job *g = j->parent;
    pthread_mutex_lock(&g->mu);
    sum_choice(g, j);
    if (j->finish == SRV_FIN_CANCEL) g->n_cancelled++;
    else if (fail && !g->fail_json) g->fail_json = srv_err_json(fail), g->fail_status = fail->status;
    int last = ++g->n_ended == g->n_choices;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    end_choices(g);
    pthread_mutex_lock(&g->mu);
    g->state = SRV_DONE;
    srv_job_signal(g);
    pthread_mutex_unlock(&g->mu);
}

void srv_emit_end(srv_job *j, int rc, const dfl_error *err) {
    srv_err fail = {0};
    int failed = j->finish == SRV_FIN_ERROR;
    if (failed && rc == DFL_ECANCEL)
        srv_errf(&fail, 503, NULL, "the server is shutting down; the request was cancelled");
    else if (failed)
        srv_errf(&fail, 500, NULL, "generation failed: %s", err && err->msg[0] ? err->msg : "engine error");
    /* A choice's error is its request's, said once when the last choice ends. */
    if (j->finish != SRV_FIN_CANCEL && !(failed && j->parent)) {
        if (j->stream) end_stream(j, failed ? &fail : NULL);
        else end_whole(j, failed ? &fail : NULL);
    }
    pthread_mutex_lock(&j->mu);
    j->state = SRV_DONE;
    srv_job_signal(j);
    pthread_mutex_unlock(&j->mu);
    if (j->parent) choice_ended(j, failed ? &fail : NULL);
}
