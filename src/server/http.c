/* http.c - the HTTP side of dflash serve, on libmicrohttpd.
 *
 * A few event-loop threads (MHD's thread pool on epoll) serve every
 * connection, so a handler must never wait: a request that waits for its job
 * (the whole answer, or a stream's next bytes) suspends its connection, and
 * the job's wake hook resumes it when there is news. A watcher thread
 * enforces what MHD does not: a deadline for each request to arrive whole
 * (slow senders are cut, however steadily they trickle), and the hang-up of a
 * client whose connection is suspended (its job is cancelled, freeing the
 * slot). Bodies over SRV_LIGHT_BODY need one of --heavy-requests permits,
 * taken before they are buffered, so concurrent large requests are bounded. */
#ifdef DFLASH_HAVE_MHD
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server.h"

void srv_opts_default(srv_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->parallel = 1;
    o->no_mmap = -1;   /* a server runs long: decode from a copy in huge pages, where it fits */
    o->queue_max = 64;
    o->max_body = 8u << 20;
    o->max_json_depth = 64;
    o->conn_timeout_s = 120;
    o->read_timeout_s = 30;
    o->max_conns = 1024;
    o->max_conns_per_ip = 64;
    o->http_threads = 4;
    o->heavy_max = 2;
    o->shutdown_grace_s = 10;
    o->default_temp = 1.0;
    o->tree_budget = -1;
    o->reasoning = 1;
}

enum {
    SRV_LIGHT_BODY = 256 << 10,   /* bodies up to this are read without a heavy permit */
    SRV_WATCH_MS = 100,           /* the watcher's period */
    SRV_LOG_PERIOD = 10,          /* seconds: HTTP-level log lines at most */
    SRV_LOG_BURST = 10,           /*   this many per period */
};

/* Per connection (MHD's socket context), for the read deadline. */
typedef struct conn_ent {
    struct conn_ent *prev, *next;
    int fd;
    double t0;        /* its current request began: connect, or the previous one's end */
    int reading;      /* that request has not arrived whole */
} conn_ent;

/* A job a suspended (or streaming) connection waits for: the watcher cancels
 * it when the peer hangs up, since MHD watches no suspended socket. */
typedef struct wait_ent {
    struct wait_ent *prev, *next;
    struct MHD_Connection *c;
    int fd;
    srv_job *j;
    int suspended;    /* under j->mu: the connection waits for wake_conn */
} wait_ent;

/* The HTTP side's state, one per process as srv_main's server. */
static struct {
    pthread_mutex_t mu;      /* guards both lists and their entries' fields but `suspended` */
    conn_ent *conns;
    wait_ent *waits;
    int heavy;               /* heavy permits taken (atomic) */
    int stop;                /* the watcher exits (atomic) */
    pthread_t watcher;
} H = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Per request: the body so far, and the job once one is made. */
typedef struct conn_ctx {
    srv_buf body;
    int too_large;
    int busy;         /* no heavy permit (or memory) for the body: read and dropped, then 503 */
    int heavy;        /* holds a heavy permit */
    wait_ent w;       /* non-stream: the job it waits for (w.j) */
} conn_ctx;

/* ---- replies ------------------------------------------------------------------- */

/* With --cors, every response names the allowed origin (browsers read nothing otherwise). */
static void cors(const srv_server *srv, struct MHD_Response *r) {
    if (!srv->o.cors) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", srv->o.cors);
    if (strcmp(srv->o.cors, "*")) MHD_add_response_header(r, "Vary", "Origin");
}

static enum MHD_Result reply(srv_server *srv, struct MHD_Connection *c, int status,
                             const char *ctype, char *body) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    cors(srv, r);
    if (status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (srv_draining(srv)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_http(&srv->m, status);
    return ret;
}

static enum MHD_Result reply_json(srv_server *srv, struct MHD_Connection *c, int status,
                                  cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return reply(srv, c, status, "application/json; charset=utf-8", s);
}

static enum MHD_Result reply_err(srv_server *srv, struct MHD_Connection *c, const srv_err *e) {
    return reply(srv, c, e->status, "application/json; charset=utf-8", srv_err_json(e));
}

static enum MHD_Result fail(srv_server *srv, struct MHD_Connection *c, int status,
                            const char *code, const char *fmt, const char *arg) {
    srv_err e;
    srv_errf(&e, status, NULL, fmt, arg);
    e.code = code;
    return reply_err(srv, c, &e);
}

/* ---- waiting for a job, watching the client ----------------------------------- */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static conn_ent *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* The peer closed its end (or the socket failed). */
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* The job's wake hook (under j->mu): a suspended connection goes back to MHD. */
static void wake_conn(void *ud) {
    wait_ent *w = ud;
    if (!w->suspended) return;
    w->suspended = 0;
    MHD_resume_connection(w->c);
}

/* Under j->mu: the connection sleeps until the job has news (or the watcher
 * sees the peer leave and cancels the job, which is news too). */
static void park(wait_ent *w) {
    w->suspended = 1;
    MHD_suspend_connection(w->c);
}

/* w starts waiting for j: hook and watch. */
static void wait_attach(wait_ent *w, struct MHD_Connection *c, srv_job *j) {
    w->c = c;
    w->fd = conn_fd(c);
    w->j = j;
    pthread_mutex_lock(&j->mu);
    j->wake = wake_conn;
    j->wake_ud = w;
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&H.mu);
    w->prev = NULL;
    w->next = H.waits;
    if (H.waits) H.waits->prev = w;
    H.waits = w;
    pthread_mutex_unlock(&H.mu);
}

/* Ends the wait (a job not done is cancelled: nobody waits for it) and drops w's reference. */
static void wait_detach(wait_ent *w) {
    srv_job *j = w->j;
    pthread_mutex_lock(&H.mu);
    if (w->prev) w->prev->next = w->next;
    else H.waits = w->next;
    if (w->next) w->next->prev = w->prev;
    w->j = NULL;
    pthread_mutex_unlock(&H.mu);
    pthread_mutex_lock(&j->mu);
    j->wake = NULL;
    int done = j->state == SRV_DONE;
    pthread_mutex_unlock(&j->mu);
    if (!done) srv_cancel(j->srv, j, SRV_CANCEL_CLIENT);
    srv_job_unref(j);
}

/* The job was cancelled because its client left (cancel is stored atomically). */
static int client_left(srv_job *j) {
    return __atomic_load_n(&j->cancel, __ATOMIC_RELAXED) == SRV_CANCEL_CLIENT;
}

typedef struct stream_ctx {
    wait_ent w;
} stream_ctx;

/* Never blocks: with no bytes yet, the connection is suspended until the job
 * has more (wake_conn), and MHD calls again. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *s = cls;
    srv_job *j = s->w.j;
    (void)pos;
    pthread_mutex_lock(&j->mu);
    ssize_t ret = 0;
    if (j->out_sent < j->out.len) {
        size_t n = j->out.len - j->out_sent;
        if (n > max) n = max;
        memcpy(buf, j->out.p + j->out_sent, n);
        j->out_sent += n;
        if (j->out_sent == j->out.len) j->out.len = j->out_sent = 0;   /* reuse the buffer */
        ret = (ssize_t)n;
    } else if (j->state == SRV_DONE) {
        ret = client_left(j) ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        park(&s->w);
    }
    pthread_mutex_unlock(&j->mu);
    return ret;
}

/* The response is gone: finished, or the connection died mid-stream. */
static void stream_free(void *cls) {
    stream_ctx *s = cls;
    wait_detach(&s->w);
    free(s);
}

/* A non-stream request's answer, once its job is done; until then the
 * connection is suspended and MHD calls the handler again when it resumes. */
static enum MHD_Result finish_generation(srv_server *srv, struct MHD_Connection *c, conn_ctx *cc) {
    srv_job *j = cc->w.j;
    pthread_mutex_lock(&j->mu);
    if (j->state != SRV_DONE) {
        park(&cc->w);
        pthread_mutex_unlock(&j->mu);
        return MHD_YES;
    }
    int gone = client_left(j);
    int status = j->http_status ? j->http_status : 500;
    char *body = gone ? NULL : strdup(j->out.p ? j->out.p : "{}");
    pthread_mutex_unlock(&j->mu);
    wait_detach(&cc->w);
    if (gone) return MHD_NO;   /* nobody to answer */
    return reply(srv, c, status, "application/json; charset=utf-8", body);
}

static enum MHD_Result run_generation(srv_server *srv, struct MHD_Connection *c, srv_kind kind,
                                      conn_ctx *cc) {
    srv_err e;
    srv_job *j = srv_parse_job(srv, kind, cc->body.p ? cc->body.p : "", cc->body.len, &e);
    if (!j) return reply_err(srv, c, &e);
    if (srv_submit(srv, j) < 0) {
        srv_job_unref(j);
        return fail(srv, c, 503, "server_busy",
                    srv_draining(srv) ? "the server is shutting down%s"
                                  : "all slots are busy and the queue is full; retry later%s", "");
    }
    if (j->stream) {
        stream_ctx *s = calloc(1, sizeof *s);
        if (!s) {
            srv_cancel(srv, j, SRV_CANCEL_CLIENT);
            srv_job_unref(j);
            return MHD_NO;
        }
        wait_attach(&s->w, c, j);
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
        if (!r) {
            stream_free(s);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
        cors(srv, r);
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        srv_metrics_http(&srv->m, 200);
        return ret;
    }
    wait_attach(&cc->w, c, j);
    return finish_generation(srv, c, cc);
}

/* ---- small endpoints ------------------------------------------------------------ */

/* The served model in OpenAI's model object shape. */
static cJSON *model_object(srv_server *srv) {
    const dfl_model_info *in = &srv->info;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "dflash");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddStringToObject(meta, "arch", in->arch);
    cJSON_AddStringToObject(meta, "dtype", in->dtype);
    cJSON_AddNumberToObject(meta, "n_vocab", in->vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", in->max_ctx);
    cJSON_AddNumberToObject(meta, "n_ctx", in->ctx_size);
    cJSON_AddNumberToObject(meta, "n_layers", in->n_layers);
    cJSON_AddNumberToObject(meta, "n_embd", in->dim);
    cJSON_AddBoolToObject(meta, "draft", in->has_draft);
    cJSON_AddStringToObject(meta, "draft_kind", in->draft_kind);
    cJSON_AddNumberToObject(meta, "draft_block", in->draft_block);
    cJSON_AddNumberToObject(meta, "slots", srv->n_slots);
    return m;
}

static enum MHD_Result get_models(srv_server *srv, struct MHD_Connection *c) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), model_object(srv));
    return reply_json(srv, c, 200, root);
}

/* GET /v1/models/{id}: the model when id names it, else OpenAI's 404. */
static enum MHD_Result get_model(srv_server *srv, struct MHD_Connection *c, const char *id) {
    if (strcmp(id, srv->model_id)) {
        srv_err e;
        srv_errf(&e, 404, "model", "The model '%.200s' does not exist", id);
        e.code = "model_not_found";
        return reply_err(srv, c, &e);
    }
    return reply_json(srv, c, 200, model_object(srv));
}

/* GET /props: what the server runs with, in llama-server's field names. */
static enum MHD_Result get_props(srv_server *srv, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    int fallback = 0;
    const char *tpl = srv->o.chat_template ? srv->o.chat_template
                                           : dfl_chat_template(srv->e, &fallback);
    cJSON_AddStringToObject(o, "model_alias", srv->model_id);
    cJSON_AddStringToObject(o, "model_path", srv->o.model_path);
    cJSON_AddNumberToObject(o, "total_slots", srv->n_slots);
    cJSON_AddStringToObject(o, "chat_template", tpl ? tpl : "");
    cJSON_AddBoolToObject(o, "chat_template_fallback", fallback);
    cJSON_AddStringToObject(o, "build_info", "dflash " DFL_VERSION);
    cJSON *m = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddBoolToObject(m, "vision", 0);
    cJSON_AddBoolToObject(m, "audio", 0);
    cJSON *g = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(g, "n_ctx", srv->info.ctx_size);
    cJSON *p = cJSON_AddObjectToObject(g, "params");
    cJSON_AddNumberToObject(p, "temperature", srv->o.default_temp);
    cJSON_AddStringToObject(p, "reasoning_format", srv->o.reasoning ? "deepseek" : "none");
    cJSON *d = cJSON_AddObjectToObject(o, "dflash");
    cJSON_AddBoolToObject(d, "drafter", srv->info.has_draft);
    cJSON_AddStringToObject(d, "drafter_kind", srv->info.draft_kind);
    cJSON_AddNumberToObject(d, "draft_block", srv->info.draft_block);
    cJSON_AddStringToObject(d, "weights", srv->info.dtype);
    cJSON_AddStringToObject(d, "kv_type", srv->info.kv_type);
    cJSON_AddNumberToObject(d, "threads", srv->info.n_threads);
    cJSON_AddStringToObject(d, "kernels", srv->info.simd);
    return reply_json(srv, c, 200, o);
}

/* GET /slots: each slot's state, as llama-server lists them. */
static enum MHD_Result get_slots(srv_server *srv, struct MHD_Connection *c) {
    cJSON *a = cJSON_CreateArray();
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->n_slots; i++) {
        const srv_slot *s = &srv->slots[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", s->idx);
        cJSON_AddNumberToObject(o, "n_ctx", srv->info.ctx_size);
        cJSON_AddBoolToObject(o, "is_processing", s->job != NULL);
        if (s->job) cJSON_AddStringToObject(o, "id_task", s->job->id);
        cJSON_AddNumberToObject(o, "n_cached", s->job ? 0 : s->n_hist);
        cJSON_AddItemToArray(a, o);
    }
    pthread_mutex_unlock(&srv->mu);
    return reply_json(srv, c, 200, a);
}

static int opt_bool(const cJSON *o, const char *k, int def, srv_err *e) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return def;
    if (!cJSON_IsBool(v)) return srv_errf(e, 400, k, "'%s' must be a boolean", k), def;
    return cJSON_IsTrue(v);
}

/* /tokenize's answer, written out directly: a cJSON tree would cost ~64
 * bytes a token (~250 with pieces), several times the text. */
static char *tokens_json(srv_server *srv, const int32_t *ids, int n, int pieces) {
    srv_buf out = {0}, txt = {0};
    char buf[512];
    srv_buf_puts(&out, "{\"tokens\":[");
    for (int i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, pieces ? "%s{\"id\":%d,\"piece\":" : "%s%d", i ? "," : "", ids[i]);
        srv_buf_puts(&out, buf);
        if (!pieces) continue;
        dfl_detok d;
        dfl_detok_init(&d, srv->e, 1);
        d.first = 0;
        txt.len = 0;
        int k = dfl_detok_push(&d, ids[i], buf, sizeof buf);
        if (k > 0) srv_utf8_sanitize(&txt, buf, (size_t)k);
        k = dfl_detok_flush(&d, buf, sizeof buf);
        if (k > 0) srv_utf8_sanitize(&txt, buf, (size_t)k);
        srv_buf_put(&txt, "", 0);
        cJSON *str = cJSON_CreateString(txt.p);   /* cJSON's escaping, one piece at a time */
        char *q = cJSON_PrintUnformatted(str);
        srv_buf_puts(&out, q);
        srv_buf_puts(&out, "}");
        cJSON_free(q);
        cJSON_Delete(str);
    }
    srv_buf_puts(&out, "]}");
    srv_buf_free(&txt);
    return out.p;
}

static enum MHD_Result post_tokenize(srv_server *srv, struct MHD_Connection *c, conn_ctx *cc) {
    srv_err e;
    cJSON *o = srv_json_parse(srv, cc->body.p ? cc->body.p : "", cc->body.len, &e);
    if (!o) return reply_err(srv, c, &e);
    cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    int add = opt_bool(o, "add_special", 0, &e), parse = opt_bool(o, "parse_special", 1, &e);
    int pieces = opt_bool(o, "with_pieces", 0, &e);
    if (!e.status && !cJSON_IsString(content)) srv_errf(&e, 400, "content", "'content' must be a string");
    if (e.status) {
        cJSON_Delete(o);
        return reply_err(srv, c, &e);
    }
    size_t len = strlen(content->valuestring);
    if (srv_text_fits(srv, len, "content", &e)) {
        cJSON_Delete(o);
        return reply_err(srv, c, &e);
    }
    int cap = (int)len + 16, n;   /* a token is at least a byte (BOS/EOS aside) */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids) {
        cJSON_Delete(o);
        return fail(srv, c, 503, "server_busy", "out of memory%s; retry later", "");
    }
    dfl_error err = {0};
    n = dfl_tokenize(srv->e, content->valuestring, len, add, parse, ids, cap, &err);
    if (n < 0 || n > cap) {
        free(ids);
        cJSON_Delete(o);
        return fail(srv, c, 400, NULL, "could not tokenize: %s", n < 0 ? err.msg : "too many tokens");
    }
    cJSON_Delete(o);   /* the text is done with: not kept while the answer is built */
    char *r = tokens_json(srv, ids, n, pieces);
    free(ids);
    return reply(srv, c, 200, "application/json; charset=utf-8", r);
}

static enum MHD_Result post_detokenize(srv_server *srv, struct MHD_Connection *c, conn_ctx *cc) {
    srv_err e;
    cJSON *o = srv_json_parse(srv, cc->body.p ? cc->body.p : "", cc->body.len, &e);
    if (!o) return reply_err(srv, c, &e);
    cJSON *toks = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    if (!cJSON_IsArray(toks)) {
        cJSON_Delete(o);
        srv_errf(&e, 400, "tokens", "'tokens' must be an array of token ids");
        return reply_err(srv, c, &e);
    }
    for (cJSON *t = toks->child; t; t = t->next)
        if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int32_t)t->valuedouble ||
            t->valuedouble < 0 || t->valuedouble >= srv->info.vocab) {
            cJSON_Delete(o);
            srv_errf(&e, 400, "tokens", "'tokens' must hold token ids from 0 to %d", srv->info.vocab - 1);
            return reply_err(srv, c, &e);
        }
    srv_buf raw = {0}, txt = {0};
    char buf[4096];
    dfl_detok d;
    dfl_detok_init(&d, srv->e, 1);
    for (cJSON *t = toks->child; t; t = t->next) {
        int k = dfl_detok_push(&d, (int32_t)t->valuedouble, buf, sizeof buf);
        if (k > 0) srv_buf_put(&raw, buf, (size_t)k);
    }
    int k = dfl_detok_flush(&d, buf, sizeof buf);
    if (k > 0) srv_buf_put(&raw, buf, (size_t)k);
    srv_utf8_sanitize(&txt, raw.p ? raw.p : "", raw.len);
    srv_buf_put(&txt, "", 0);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "content", txt.p);
    srv_buf_free(&raw);
    srv_buf_free(&txt);
    cJSON_Delete(o);
    return reply_json(srv, c, 200, r);
}

/* ---- the web page ------------------------------------------------------------------ */

/* The page's response: the compiled-in web/index.html at / (and /index.html), or
 * with --path a regular file of that folder (NULL: no such file, 404). The
 * file is opened non-blocking so a FIFO planted there cannot stall an
 * event-loop thread; anything but a regular file is refused. */
static struct MHD_Response *static_response(srv_server *srv, const char *url, const char **ctype) {
    if (!srv->o.web_path) {
        if (strcmp(url, "/") && strcmp(url, "/index.html")) return NULL;
        *ctype = "text/html; charset=utf-8";
        return MHD_create_response_from_buffer(srv_webui_index_len, (void *)srv_webui_index,
                                               MHD_RESPMEM_PERSISTENT);
    }
    char path[PATH_MAX + SRV_STATIC_URL_MAX];   /* --path's folder, then the URL */
    if (srv_static_path(srv->o.web_path, url, path, sizeof path)) return NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    struct stat st;
    if (fd < 0) return NULL;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return NULL;
    }
    *ctype = srv_static_type(path);
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);   /* owns fd */
    if (!r) close(fd);
    return r;
}

/* GET of a path no endpoint has: the page's files (no API key: they hold no
 * data, and the page asks for the key the API needs), else 404. */
static enum MHD_Result get_static(srv_server *srv, struct MHD_Connection *c, const char *url) {
    const char *ctype = NULL;
    struct MHD_Response *r = srv->o.no_webui ? NULL : static_response(srv, url, &ctype);
    if (!r) return fail(srv, c, 404, "not_found", "no endpoint %.200s", url);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (!srv->o.web_path)   /* the page's own script and style only; it calls this server */
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; script-src 'unsafe-inline'; "
                                "style-src 'unsafe-inline'; img-src 'self' data:");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    srv_metrics_http(&srv->m, 200);
    return ret;
}

/* ---- routing --------------------------------------------------------------------- */

/* "Authorization: Bearer KEY", compared in constant time. */
static int authorized(srv_server *srv, struct MHD_Connection *c) {
    if (!srv->o.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) h = "";
    else h += 7;
    while (*h == ' ') h++;
    return srv_secret_equal(srv->o.api_key, h);
}

/* POST /apply-template: a chat request's prompt as the template renders it
 * (llama-server's endpoint), for checking templates and tool messages. */
static enum MHD_Result post_apply_template(srv_server *srv, struct MHD_Connection *c,
                                           conn_ctx *cc) {
    srv_err e;
    char *s = srv_apply_template(srv, cc->body.p ? cc->body.p : "", cc->body.len, &e);
    if (!s) return reply_err(srv, c, &e);
    return reply(srv, c, 200, "application/json; charset=utf-8", s);
}

typedef enum { R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_CHAT, R_COMPL, R_TOK,
               R_DETOK, R_PROPS, R_SLOTS, R_APPLY } route;

static route find_route(const char *url, int *want_post) {
    static const struct {
        const char *path;
        route r;
        int post;
    } table[] = {
        {"/health", R_HEALTH, 0},          {"/v1/health", R_HEALTH, 0},
        {"/v1/models", R_MODELS, 0},       {"/models", R_MODELS, 0},
        {"/metrics", R_METRICS, 0},        {"/v1/chat/completions", R_CHAT, 1},
        {"/chat/completions", R_CHAT, 1},  {"/v1/completions", R_COMPL, 1},
        {"/completions", R_COMPL, 1},      {"/tokenize", R_TOK, 1},
        {"/detokenize", R_DETOK, 1},       {"/props", R_PROPS, 0},
        {"/slots", R_SLOTS, 0},            {"/apply-template", R_APPLY, 1},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(url, table[i].path)) {
            *want_post = table[i].post;
            return table[i].r;
        }
    *want_post = 0;
    return !strncmp(url, "/v1/models/", 11) && url[11] ? R_MODEL : R_NONE;
}

/* A CORS preflight: which method and headers the browser may send. */
static enum MHD_Result preflight(srv_server *srv, struct MHD_Connection *c, int post) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    cors(srv, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods",
                            post ? "POST, OPTIONS" : "GET, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    srv_metrics_http(&srv->m, 204);
    return ret;
}

static enum MHD_Result handle(srv_server *srv, struct MHD_Connection *c, const char *url,
                              const char *method, conn_ctx *cc) {
    int want_post = 0;
    route r = find_route(url, &want_post);
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (r == R_NONE && is_get) return get_static(srv, c, url);
    if (r == R_NONE) return fail(srv, c, 404, "not_found", "no endpoint %.200s", url);
    if (srv->o.cors && !strcmp(method, "OPTIONS")) return preflight(srv, c, want_post);
    if (want_post ? strcmp(method, "POST") : !is_get) {
        srv_err e;
        srv_errf(&e, 405, NULL, "%s %s is not supported; use %s", method, url,
                 want_post ? "POST" : "GET");
        return reply_err(srv, c, &e);
    }
    if (r == R_HEALTH) {
        /* A balancer's health check: a draining replica gets no new traffic. */
        if (srv_draining(srv))
            return reply(srv, c, 503, "application/json", strdup("{\"status\":\"draining\"}"));
        if (!srv_ready(srv)) return fail(srv, c, 503, "loading", "Loading model%s", "");
        return reply(srv, c, 200, "application/json", strdup("{\"status\":\"ok\"}"));
    }
    if (!authorized(srv, c)) {
        srv_err e;
        srv_errf(&e, 401, NULL, "Incorrect API key provided");
        e.type = "invalid_request_error";
        e.code = "invalid_api_key";
        return reply_err(srv, c, &e);
    }
    if (r == R_METRICS) {
        int queued, busy;
        srv_sched_counts(srv, &queued, &busy);
        return reply(srv, c, 200, "text/plain; version=0.0.4; charset=utf-8",
                     srv_metrics_text(srv, queued, busy));
    }
    if (!srv_ready(srv)) return fail(srv, c, 503, "loading", "Loading model%s", "");
    if (cc->too_large) {
        srv_err e;
        srv_errf(&e, 413, NULL, "the request body exceeds %zu bytes", srv->o.max_body);
        return reply_err(srv, c, &e);
    }
    if (cc->busy) {
        srv_err e;
        srv_errf(&e, 503, NULL, "%d requests with bodies over %d KiB are being read or parsed "
                 "(--heavy-requests); retry later", srv->o.heavy_max, SRV_LIGHT_BODY >> 10);
        e.code = "server_busy";
        return reply_err(srv, c, &e);
    }
    switch (r) {
    case R_MODELS: return get_models(srv, c);
    case R_MODEL: return get_model(srv, c, url + 11);
    case R_PROPS: return get_props(srv, c);
    case R_SLOTS: return get_slots(srv, c);
    case R_CHAT: return run_generation(srv, c, SRV_CHAT, cc);
    case R_COMPL: return run_generation(srv, c, SRV_COMPLETION, cc);
    case R_TOK: return post_tokenize(srv, c, cc);
    case R_DETOK: return post_detokenize(srv, c, cc);
    case R_APPLY: return post_apply_template(srv, c, cc);
    default: return MHD_NO;
    }
}

/* A heavy permit, or 0 when all --heavy-requests are taken. */
static int heavy_take(const srv_server *srv) {
    if (__atomic_add_fetch(&H.heavy, 1, __ATOMIC_ACQ_REL) <= srv->o.heavy_max) return 1;
    __atomic_sub_fetch(&H.heavy, 1, __ATOMIC_ACQ_REL);
    return 0;
}

/* The body and its permit, once parsed (or refused). */
static void body_release(conn_ctx *cc) {
    srv_buf_free(&cc->body);
    if (cc->heavy) __atomic_sub_fetch(&H.heavy, 1, __ATOMIC_ACQ_REL);
    cc->heavy = 0;
}

/* Keeps n more body bytes, or drops the body: over --max-body (413), or no
 * permit / memory for a heavy one (503). */
static void body_put(srv_server *srv, conn_ctx *cc, const char *p, size_t n) {
    if (cc->too_large || cc->busy) return;
    size_t len = cc->body.len + n;
    if (len > srv->o.max_body) cc->too_large = 1;
    else if (len > SRV_LIGHT_BODY && !cc->heavy && !(cc->heavy = heavy_take(srv))) cc->busy = 1;
    else if (srv_buf_reserve(&cc->body, n)) cc->busy = 1;
    if (cc->too_large || cc->busy) {
        body_release(cc);
        return;
    }
    srv_buf_put(&cc->body, p, n);
}

/* The first call, headers in: refuses an over-limit declared body early, and
 * reserves a declared body whole (one allocation, no doubling). */
static enum MHD_Result begin_request(srv_server *srv, struct MHD_Connection *c, conn_ctx *cc) {
    /* A declared body over the limit is refused before it is read when the
     * client waits for "100 Continue" (or the body is absurd). Otherwise
     * it is read and dropped first: answering while the client still
     * sends makes it see a broken pipe instead of the 413. */
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    if (declared > srv->o.max_body &&
        ((ex && !strcasecmp(ex, "100-continue")) || declared / 16 > srv->o.max_body)) {
        srv_err e;
        srv_errf(&e, 413, NULL, "the request body exceeds %zu bytes", srv->o.max_body);
        return reply_err(srv, c, &e);
    }
    cc->too_large = declared > srv->o.max_body;
    if (!cc->too_large && declared > SRV_LIGHT_BODY && !(cc->heavy = heavy_take(srv))) cc->busy = 1;
    if (cc->heavy && srv_buf_reserve(&cc->body, (size_t)declared)) {
        body_release(cc);
        cc->busy = 1;
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls) {
    srv_server *srv = cls;
    (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        return begin_request(srv, c, cc);
    }
    if (*upload_size) {
        body_put(srv, cc, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cc->w.j) return finish_generation(srv, c, cc);   /* resumed: the job has news */
    conn_ent *ce = conn_of(c);
    if (ce) {
        pthread_mutex_lock(&H.mu);
        ce->reading = 0;   /* arrived whole: off the read deadline */
        pthread_mutex_unlock(&H.mu);
    }
    enum MHD_Result ret = handle(srv, c, url, method, cc);
    body_release(cc);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)toe;
    conn_ctx *cc = *con_cls;
    conn_ent *ce = conn_of(c);
    if (ce) {   /* a kept-alive connection's next request starts now */
        pthread_mutex_lock(&H.mu);
        ce->reading = 1;
        ce->t0 = srv_now();
        pthread_mutex_unlock(&H.mu);
    }
    if (!cc) return;
    if (cc->w.j) wait_detach(&cc->w);   /* the connection died while the job ran */
    body_release(cc);
    free(cc);
    *con_cls = NULL;
}

/* Every connection is listed from accept to close, for the read deadline. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)cls;
    conn_ent *ce = *socket_context;
    pthread_mutex_lock(&H.mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED && !ce && (ce = calloc(1, sizeof *ce))) {
        ce->fd = conn_fd(c);
        ce->t0 = srv_now();
        ce->reading = 1;
        ce->next = H.conns;
        if (H.conns) H.conns->prev = ce;
        H.conns = ce;
        *socket_context = ce;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && ce) {
        /* MHD closes the socket after this: until then ce->fd is this connection's. */
        if (ce->prev) ce->prev->next = ce->next;
        else H.conns = ce->next;
        if (ce->next) ce->next->prev = ce->prev;
        free(ce);
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&H.mu);
}

/* Every SRV_WATCH_MS: a request that has not arrived whole within
 * --read-timeout has its socket shut down (MHD then closes the connection:
 * idle timeouts restart with every byte, so a trickler would never reach
 * one); a waiting request whose client left is cancelled. */
static void *watch(void *arg) {
    srv_server *srv = arg;
    long cut = 0;
    double said = 0;
    while (!__atomic_load_n(&H.stop, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, SRV_WATCH_MS * 1000000L};
        nanosleep(&ts, NULL);
        double now = srv_now();
        pthread_mutex_lock(&H.mu);
        for (conn_ent *ce = H.conns; ce; ce = ce->next)
            if (ce->reading && now - ce->t0 > srv->o.read_timeout_s && ce->fd >= 0) {
                shutdown(ce->fd, SHUT_RDWR);
                ce->reading = 0;
                cut++;
            }
        for (wait_ent *w = H.waits; w; w = w->next)
            if (client_gone(w->fd)) srv_cancel(srv, w->j, SRV_CANCEL_CLIENT);
        pthread_mutex_unlock(&H.mu);
        if (cut && now - said >= SRV_LOG_PERIOD) {   /* one line, not one per attacker */
            fprintf(stderr, "dflash serve: cut %ld connection%s that sent no whole request within "
                    "--read-timeout %d s\n", cut, cut == 1 ? "" : "s", srv->o.read_timeout_s);
            cut = 0, said = now;
        }
    }
    return NULL;
}

/* ---- startup and shutdown ------------------------------------------------------- */

static void on_progress(void *ud, const char *what, uint64_t done, uint64_t total) {
    int *last = ud;
    int pct = total ? (int)(100 * done / total) : 100;
    if (pct / 10 == *last / 10 && pct != 100) return;
    if (pct == 100 && *last == 100) return;
    *last = pct;
    fprintf(stderr, "dflash serve: %s %d%%\n", what, pct);
}

typedef struct loader {
    srv_server *srv;
    pthread_t th;
    int done;   /* 1 ok, -1 failed (atomic) */
} loader;

static void *load_engine(void *arg) {
    loader *ld = arg;
    srv_server *srv = ld->srv;
    dfl_engine_opts eo;
    dfl_error err = {0};
    int last = -10;
    dfl_engine_opts_default(&eo);
    eo.model_path = srv->o.model_path;
    eo.draft_path = srv->o.draft_path;
    eo.draft_mtp = srv->o.draft_mtp;
    eo.ngram = srv->o.ngram;
    eo.no_mmap = srv->o.no_mmap;
    eo.dtype = srv->o.dtype;
    eo.draft_dtype = srv->o.draft_dtype;
    eo.kv_type = srv->o.kv_type;
    eo.n_threads = srv->o.threads;
    eo.ctx_size = srv->o.ctx_size;
    eo.allow_inexact = srv->o.allow_inexact;
    eo.draft_window = srv->o.draft_window;
    eo.n_parallel = srv->o.parallel;
    eo.progress = on_progress;
    eo.progress_ud = &last;
    if (dfl_engine_load(&eo, &srv->e, &err)) {
        fprintf(stderr, "dflash serve: %s\n", err.msg);
        __atomic_store_n(&ld->done, -1, __ATOMIC_RELEASE);
        return NULL;
    }
    dfl_engine_info(srv->e, &srv->info);
    int exact;
    if (dfl_engine_prepare(srv->e, &exact, &err)) {
        fprintf(stderr, "dflash serve: the exactness probe and round costs: %s\n", err.msg);
        __atomic_store_n(&ld->done, -1, __ATOMIC_RELEASE);
        return NULL;
    }
    if (exact < 0)
        fprintf(stderr, "dflash serve: the probe found the verify path inexact: requests decode "
                        "classically (dflash probe shows where; DFLASH_ALLOW_INEXACT=1 overrides)\n");
    snprintf(srv->model_id, sizeof srv->model_id, "%s", srv->o.alias ? srv->o.alias : srv->info.name);
    if (srv_sched_start(srv, &err)) {
        fprintf(stderr, "dflash serve: starting %d slots: %s\n", srv->o.parallel, err.msg);
        __atomic_store_n(&ld->done, -1, __ATOMIC_RELEASE);
        return NULL;
    }
    fprintf(stderr,
            "dflash serve: ready: model '%s' (%s, %s, %s), %s%s, %d slot%s of %d tokens, "
            "continuous batching\n",
            srv->model_id, srv->info.arch, srv->info.dtype,
            srv->info.weights_copied ? "weights in memory" : "weights read in place",
            srv->info.draft_mtp ? "MTP head drafts" : srv->info.draft_kind,
            srv->info.draft_mtp ? "" : !srv->info.has_draft ? "no drafter"
            : srv->info.mtp_lane ? " drafter and MTP head" : " drafter",
            srv->n_slots,
            srv->n_slots == 1 ? "" : "s", srv->info.ctx_size);
    __atomic_store_n(&srv->ready, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&ld->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* libmicrohttpd's messages, less the one every client hang-up mid-stream
 * causes, and at most SRV_LOG_BURST per SRV_LOG_PERIOD: hostile clients cause
 * one per connection, and must not fill the disk. */
static void http_log(void *cls, const char *fmt, va_list ap) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static double t0;
    static int n;
    (void)cls;
    if (strstr(fmt, "application error generating response")) return;
    pthread_mutex_lock(&mu);
    double now = srv_now();
    if (now - t0 >= SRV_LOG_PERIOD) t0 = now, n = 0;
    if (++n <= SRV_LOG_BURST) {
        fprintf(stderr, "dflash serve: http: ");
        vfprintf(stderr, fmt, ap);
        if (n == SRV_LOG_BURST) fprintf(stderr, "dflash serve: http: (more messages dropped for "
                                        "%d s)\n", SRV_LOG_PERIOD);
    }
    pthread_mutex_unlock(&mu);
}

static struct MHD_Daemon *start_http(srv_server *srv) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", srv->o.port);
    int rc = getaddrinfo(srv->o.host, port, &hints, &ai);
    if (rc) {
        fprintf(stderr, "dflash serve: --host %s: %s\n", srv->o.host, gai_strerror(rc));
        return NULL;
    }
    /* epoll on Linux (MHD_USE_AUTO): connections cost a socket, not a thread. */
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)srv->o.port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
        http_log, NULL, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)srv->o.http_threads, MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->o.max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)srv->o.max_conns_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->o.conn_timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION,
        on_connection, srv, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20), MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) fprintf(stderr, "dflash serve: cannot listen on %s:%d: %s\n", srv->o.host, srv->o.port,
                    strerror(errno));
    return d;
}

/* Waits up to t seconds for SIGINT/SIGTERM; returns the signal or 0. */
static int wait_signal(const sigset_t *set, double t) {
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    int s = sigtimedwait(set, NULL, &ts);
    return s > 0 ? s : 0;
}

int srv_main(const srv_opts *o) {
    static srv_server S;   /* one per process; lives until exit */
    srv_server *srv = &S;
    srv->o = *o;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->idle_cv, NULL);
    srv_metrics_init(&srv->m);

    /* Every thread started from here on inherits the blocked signals; the main
     * thread takes them with sigtimedwait. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct MHD_Daemon *d = start_http(srv);
    if (!d) return 1;
    pthread_create(&H.watcher, NULL, watch, srv);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "dflash serve: listening on http://%s:%u\n", srv->o.host,
            di ? (unsigned)di->port : (unsigned)srv->o.port);

    loader ld = {.srv = srv};
    pthread_create(&ld.th, NULL, load_engine, &ld);
    int sig = 0, code = 0;
    while (!(sig = wait_signal(&set, 0.2)))
        if (__atomic_load_n(&ld.done, __ATOMIC_ACQUIRE) < 0) break;
    if (sig) fprintf(stderr, "dflash serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    else code = 1;

    /* Draining keeps listening: /health answers 503 "draining" and new
     * requests 503 with Retry-After, so a balancer moves the traffic to
     * other replicas while the running requests finish here. */
    __atomic_store_n(&srv->draining, 1, __ATOMIC_RELEASE);
    pthread_join(ld.th, NULL);
    if (__atomic_load_n(&ld.done, __ATOMIC_ACQUIRE) > 0) {
        /* Queued requests are refused; running ones get the grace period (a
         * second signal ends it), then are cancelled at their next token. */
        srv_sched_drain(srv);
        double deadline = srv_now() + srv->o.shutdown_grace_s;
        int q, busy;
        for (srv_sched_counts(srv, &q, &busy); busy && srv_now() < deadline;
             srv_sched_counts(srv, &q, &busy))
            if (wait_signal(&set, 0.1)) break;
        srv_sched_stop(srv);
        /* Cancelled streams still have their error event to deliver: let the
         * connections send it before the daemon closes them (bounded). */
        for (double end = srv_now() + 2; srv_now() < end;)
            if (!__atomic_load_n(&srv->live_jobs, __ATOMIC_ACQUIRE) || wait_signal(&set, 0.02)) break;
    }
    /* Every job has ended, so no connection stays suspended (MHD requires it). */
    MHD_stop_daemon(d);
    __atomic_store_n(&H.stop, 1, __ATOMIC_RELEASE);
    pthread_join(H.watcher, NULL);
    if (srv->e) dfl_engine_free(srv->e);
    fprintf(stderr, "dflash serve: stopped\n");
    return code;
}

#endif /* DFLASH_HAVE_MHD */
