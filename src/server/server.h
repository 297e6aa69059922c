/* server.h - dflash serve: an OpenAI-compatible HTTP server on libmicrohttpd.
 *
 * Parts, each in its own file, all knowing only include/dflash.h:
 *   text.c     byte buffers, UTF-8 checks, JSON depth scan, constant-time compare
 *   stop.c     stop strings matched across token boundaries with a hold-back
 *   request.c  OpenAI request JSON -> srv_job (every field type-checked)
 *   respond.c  srv_job events -> OpenAI response / SSE chunk JSON
 *   sched.c    slots (one dfl_session each), the bounded queue, worker threads
 *   metrics.c  counters and their Prometheus text
 *   static.c   the web page's files: --path URL -> file, content types
 *   http.c     libmicrohttpd glue: routing, auth, limits, streaming, shutdown
 *
 * A request's life: the HTTP thread parses and tokenizes it into a srv_job and
 * submits it; a slot's worker runs dfl_generate on it, turning each committed
 * token into bytes (SSE chunks or pieces of the final JSON) under the job's
 * lock; the HTTP thread ships those bytes. Either side can end first: the job
 * is reference counted, and `cancel` tells the worker the client is gone. */
#ifndef DFL_SERVER_H
#define DFL_SERVER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dflash.h"

typedef struct srv_opts {
    const char *model_path, *draft_path, *dtype, *draft_dtype, *kv_type;
    const char *host;          /* listen address; default 127.0.0.1 */
    int port;
    int parallel;              /* slots: sessions generating at once */
    int ctx_size, threads;     /* passed to the engine (0: its default) */
    int allow_inexact, draft_window; /* passed to the engine (dfl_engine_opts) */
    int draft_mtp;             /* the model's MTP head drafts (dfl_engine_opts.draft_mtp) */
    int ngram;                 /* the n-gram lane too (dfl_engine_opts.ngram) */
    int no_mmap;               /* weights copied into memory (dfl_engine_opts.no_mmap);
                                  default -1: when the copy fits */
    const char *api_key;       /* NULL: no auth */
    const char *alias;         /* model id clients use; default: the model's name */
    const char *chat_template; /* "chatml" or Jinja text; NULL: the model's */
    const char *cors;          /* Access-Control-Allow-Origin value ("*" or an origin); NULL: off */
    int lenient;               /* ignore request fields the server does not implement */
    int queue_max;             /* requests waiting for a slot before 503 */
    size_t max_body;           /* request body limit in bytes */
    int max_json_depth;
    int conn_timeout_s;        /* idle connection timeout */
    int read_timeout_s;        /* deadline for a whole request (headers and body) to arrive */
    int max_conns;             /* open connections at most (MHD_OPTION_CONNECTION_LIMIT) */
    int max_conns_per_ip;      /* of those, from one address */
    int http_threads;          /* MHD's event-loop threads */
    int heavy_max;             /* requests with bodies over SRV_LIGHT_BODY at once */
    double shutdown_grace_s;   /* let in-flight requests finish this long on SIGTERM */
    double default_temp;       /* temperature when a request gives none */
    int tree_budget;           /* draft trees when a request gives no tree_budget: -1 the
                                  policy's pick, 0 the chain, N nodes (--tree-budget) */
    int reasoning;             /* split <think> blocks into reasoning_content (default 1) */
    double replay_tau;         /* > 0: benchmarks' replayed drafter (dfl_gen_params.replay_*) */
    const char *web_path;      /* --path: the page's files come from this folder; NULL:
                                  the compiled-in web/index.html */
    int no_webui;              /* --no-webui: no page at all (/ is a 404) */
} srv_opts;

void srv_opts_default(srv_opts *o);
/* Loads the model, serves until SIGINT/SIGTERM; returns the process exit code. */
int srv_main(const srv_opts *o);

/* ---- text.c ---------------------------------------------------------------- */

typedef struct srv_buf {
    char *p;
    size_t len, cap;
} srv_buf;

void srv_buf_put(srv_buf *b, const void *p, size_t n);
/* Makes room for n more bytes; -1 (b unchanged) when memory is short, where
 * srv_buf_put would abort: for buffers whose size a client chooses. */
int srv_buf_reserve(srv_buf *b, size_t n);
void srv_buf_puts(srv_buf *b, const char *s);
void srv_buf_free(srv_buf *b);

/* 1 when s[0..n) is valid UTF-8 without NUL bytes. */
int srv_utf8_valid(const char *s, size_t n);
/* Appends s[0..n) to b with every invalid byte replaced by U+FFFD. */
void srv_utf8_sanitize(srv_buf *b, const char *s, size_t n);
/* 0 when the JSON text nests at most max levels of {} / [] and no string holds
 * \u0000; else SRV_JSON_DEEP or SRV_JSON_NUL. */
enum { SRV_JSON_DEEP = 1, SRV_JSON_NUL = 2, SRV_JSON_ITEMS = 3 };
int srv_json_check(const char *s, size_t n, int max);
/* The same, and SRV_JSON_ITEMS when the text holds more than max_items values
 * (counted from its commas and brackets: what cJSON would allocate a node for). */
int srv_json_check_items(const char *s, size_t n, int max, size_t max_items);
/* The 400 (413 for SRV_JSON_ITEMS) for a srv_json_check_items failure. */
struct srv_err;
void srv_json_err(struct srv_err *e, int why, int max);
/* Monotonic seconds. */
double srv_now(void);
/* Compares a secret with a candidate in time that depends only on the secret's length. */
int srv_secret_equal(const char *secret, const char *given);

/* ---- static.c: the web page ------------------------------------------------ */

/* web/index.html, compiled in (the build writes it as a C array: cmake/embed.cmake). */
extern const unsigned char srv_webui_index[];
extern const size_t srv_webui_index_len;

enum { SRV_STATIC_URL_MAX = 1024 };   /* longer URLs name no file */
/* The file under root that url names, into out (cap bytes); a URL ending in '/'
 * names that folder's index.html. -1 for anything but a plain path below root:
 * no leading '/', a segment that is empty or starts with '.' ("..", ".", hidden
 * files), a backslash or control character, over SRV_STATIC_URL_MAX, or a
 * result longer than cap. */
int srv_static_path(const char *root, const char *url, char *out, size_t cap);
/* The Content-Type for a file's name (by extension; application/octet-stream
 * when unknown). */
const char *srv_static_type(const char *path);

/* ---- stop.c ---------------------------------------------------------------- */

enum { SRV_MAX_STOP = 16, SRV_MAX_STOP_LEN = 256 };

/* Text on its way to the client: what might be the start of a stop string is
 * held back until the next piece decides. Pieces must be valid UTF-8, as must
 * the stop strings; then every release point is a character boundary. */
typedef struct srv_stop {
    char *stop[SRV_MAX_STOP];
    int n_stop;
    srv_buf held;   /* text not yet released */
    srv_buf rel;    /* the last released text (what *out points into) */
    int hit;        /* a stop string was found: nothing more is released */
} srv_stop;

/* Adds piece; *out / *n_out: text now safe to release (points into an internal
 * buffer valid until the next call). Returns 1 when a stop string completed:
 * the released text then ends just before it. final=1 releases everything held. */
int srv_stop_push(srv_stop *s, const char *piece, size_t n, int final, const char **out,
                  size_t *n_out);
void srv_stop_free(srv_stop *s);

/* Reasoning models write <think> ... </think> before the answer: the block's
 * text goes out as reasoning_content, the rest as content (llama-server's
 * "deepseek" format). A tag split across pieces is held back until the next
 * piece decides; the blank lines after </think> are dropped. */
enum { SRV_THINK_OFF = 0, SRV_THINK_START, SRV_THINK_IN, SRV_THINK_AFTER, SRV_THINK_OUT };
typedef struct srv_think {
    int state;
    srv_buf held;
} srv_think;
/* on: split at all; prompt: the rendered prompt (a template that ends it with
 * <think> starts the output inside the block). */
void srv_think_init(srv_think *t, int on, const char *prompt, size_t n);
/* Adds released text s[0..n) to reason / content; final releases what is held. */
void srv_think_push(srv_think *t, const char *s, size_t n, int final, srv_buf *reason,
                    srv_buf *content);
void srv_think_free(srv_think *t);
/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
size_t srv_tag_tail(const char *s, size_t n, const char *tag);

/* ---- tools.c: tool calls in the model's own syntax ------------------------------ */

struct cJSON;
/* call syntaxes (tools.c) */
enum { SRV_TOOLS_HERMES = 0, SRV_TOOLS_LLAMA3, SRV_TOOLS_MISTRAL, SRV_TOOLS_QWEN_XML };
enum { SRV_CHOICE_AUTO = 0, SRV_CHOICE_NONE, SRV_CHOICE_REQUIRED, SRV_CHOICE_NAMED };
enum { SRV_MAX_TOOLS = 128, SRV_TOOL_NAME_MAX = 64, SRV_CALL_ID_MAX = 32, SRV_TOOL_SHOW = 4 };

/* A request's tools (request.c fills it, the worker's parser reads it). */
typedef struct srv_tools {
    int family;               /* SRV_TOOLS_*: the syntax the chat template teaches */
    int choice;               /* SRV_CHOICE_*; NONE: tools shown to the model, calls not parsed */
    int parallel;             /* parallel_tool_calls: more than one call per answer */
    char *forced;             /* SRV_CHOICE_NAMED: the tool's name */
    struct cJSON *list;       /* the request's tools array, as given */
    int32_t show[SRV_TOOL_SHOW];  /* special tokens of the call syntax, shown by the detokenizer */
    int n_show;
} srv_tools;

/* The family whose syntax the template text teaches (hermes when none). */
int srv_tools_family(const char *template_text);
const char *srv_tools_family_name(int family);
void srv_tools_free(srv_tools *t);
/* 1 when token id is one of the call syntax's special tokens (t->show). */
int srv_tools_shown(const srv_tools *t, int32_t id);
/* A fresh call id: "call_" + 24 alphanumerics; mistral: 9 alphanumerics (its
 * templates refuse any other). */
void srv_tools_call_id(int family, char out[SRV_CALL_ID_MAX]);
/* For a required or named tool_choice: a JSON schema accepting exactly the
 * family's call object for the allowed tools, and the literal text around it.
 * Returns 1 with the three malloc'd, 0 when no call is required, -1 when out of memory. */
int srv_tools_format(const srv_tools *t, char **schema, char **prefix, char **suffix);

enum { SRV_TOOL_MAX_DEPTH = 64 };   /* nesting of a call's JSON; deeper is not a call */
/* Where the search for a call's end stopped (resumed when more text comes). */
typedef struct srv_json_scan {
    size_t at;                /* bytes of the JSON (hermes: of the block) searched */
    int depth, in_str, esc;
    char stack[SRV_TOOL_MAX_DEPTH];   /* the closing brackets expected */
} srv_json_scan;

/* The answer text, piece by piece, split into plain text and calls. */
typedef struct srv_toolp {
    const srv_tools *t;
    int in_call;              /* held starts with what may be a call */
    int seen_text;            /* non-blank text went out (llama3: a later { is text) */
    int n_calls;
    srv_buf held;             /* text not yet decided */
    srv_buf blank;            /* blanks after the last text: dropped before a call */
    srv_json_scan scan;       /* the current block's end search */
} srv_toolp;
void srv_toolp_init(srv_toolp *p, const srv_tools *t);
/* Adds s[0..n): text now decided goes to content, each complete call to calls
 * (a cJSON array) as {"name", "arguments": JSON text}. final: the answer ended. */
void srv_toolp_push(srv_toolp *p, const char *s, size_t n, int final, srv_buf *content,
                    struct cJSON *calls);
void srv_toolp_free(srv_toolp *p);

/* ---- jobs (request.c, respond.c) -------------------------------------------- */

typedef enum { SRV_CHAT = 0, SRV_COMPLETION = 1 } srv_kind;
typedef enum {
    SRV_FIN_NONE = 0, SRV_FIN_STOP, SRV_FIN_LENGTH, SRV_FIN_CANCEL, SRV_FIN_ERROR
} srv_finish;
typedef enum { SRV_QUEUED = 0, SRV_RUNNING, SRV_DONE } srv_state;
enum { SRV_CANCEL_CLIENT = 1, SRV_CANCEL_SHUTDOWN = 2 };
/* The most choices (`n`) one request may ask for: each is a generation of its own. */
enum { SRV_MAX_CHOICES = 16 };

typedef struct srv_server srv_server;

typedef struct srv_job {
    srv_server *srv;
    /* ---- set by the HTTP thread before submit; read-only afterwards ---- */
    srv_kind kind;
    int stream, include_usage;
    int logprobs, top_logprobs;   /* report logprobs; alternatives per token (0..DFL_MAX_TOP_LOGPROBS) */
    int32_t *prompt;              /* (n_prompt) */
    int n_prompt;
    dfl_gen_params gp;            /* its bias arrays point at bias_ids / bias_vals */
    int32_t *bias_ids;
    float *bias_vals;
    int user_block;               /* block_size came from the request */
    int provenance;               /* return_provenance: each choice says how its tokens
                                     were made (respond.c, SRV_PROV_LETTERS) */
    srv_stop stop;                /* its strings; the worker owns the held text */
    /* Structured output (response_format, or a required / named tool call): the
     * answer must be fmt_prefix, then one JSON value that fmt_schema accepts (NULL:
     * any JSON object), then fmt_suffix, then the end of generation. */
    int fmt_on;
    char *fmt_schema, *fmt_prefix, *fmt_suffix;   /* malloc'd, freed with the job */
    dfl_format *format;           /* the above compiled; gp.format points to it */
    srv_tools *tools;             /* the request's tools; NULL when none */
    char id[48];
    char model[160];
    long created;
    double t_submit;
    /* n > 1: the HTTP side holds the request's job, which never runs; each choice
     * is a job of its own (its own seed, slot and stop state) that writes its
     * events into the request's out. */
    int n_choices;                /* the request's n */
    int index;                    /* a choice: its index in choices[] */
    struct srv_job *parent;       /* a choice, once submitted: its request (a reference) */
    struct srv_job **choices;     /* the request, until submitted: (n_choices) its choices */

    /* ---- worker-only while RUNNING ---- */
    dfl_detok detok;
    int n_gen;                    /* tokens committed so far */
    int n_cached;                 /* prompt tokens shared with the slot's last sequence */
    struct srv_slot *copy_from;   /* an idle slot whose prefix the worker copies first */
    int first_chunk_sent;
    srv_buf text;                 /* non-stream: the released text */
    srv_buf reasoning;            /* non-stream: the released reasoning text */
    srv_think think;              /* splits reasoning from the answer (chat) */
    size_t text_off;              /* bytes of text released so far */
    void *lp;                     /* non-stream: cJSON array of logprob entries */
    srv_toolp toolp;              /* finds tool calls in the answer (tools, choice not none) */
    srv_buf prov;                 /* provenance: a letter per committed token */
    size_t prov_sent;             /* stream: letters of prov already sent */
    void *calls;                  /* cJSON array of the tool_calls sent or to send */

    /* ---- shared, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* signalled when out grows or state becomes DONE */
    srv_buf out;                  /* stream: SSE bytes; non-stream: the response JSON */
    size_t out_sent;              /* bytes of out the HTTP side has consumed */
    srv_state state;
    srv_finish finish;
    int http_status;              /* non-stream: status of out */
    int refs;
    int cancel;                   /* SRV_CANCEL_*: the worker stops at the next token */
    void (*wake)(void *ud);       /* NULL or the HTTP side's hook, called with cv: it resumes */
    void *wake_ud;                /*   a connection suspended until the job has news */
    double t_start, t_end;
    dfl_stats st;
    /* the request of n > 1 choices, as they end (respond.c) */
    int n_ended, n_cancelled;
    void *ended;                  /* non-stream: cJSON array (n_choices) of the choices */
    char *fail_json;              /* the first choice's error, if one failed */
    int fail_status;
} srv_job;

srv_job *srv_job_new(srv_server *srv, srv_kind kind);
void srv_job_unref(srv_job *j);
/* Under j->mu: out grew or the job ended; wakes whoever waits for it. */
static inline void srv_job_signal(srv_job *j) {
    pthread_cond_broadcast(&j->cv);
    if (j->wake) j->wake(j->wake_ud);
}

/* An HTTP error waiting to be sent: status, OpenAI error type/code, message. */
typedef struct srv_err {
    int status;
    const char *type;   /* "invalid_request_error", ... */
    const char *code;   /* NULL or e.g. "model_not_found" */
    char param[64];
    char msg[512];
} srv_err;

int srv_errf(srv_err *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* {"error":{...}} as a malloc'd string. */
char *srv_err_json(const srv_err *e);

/* The token budget: text a request may have tokenized (a prompt, rendered
 * messages, /tokenize content) is at most SRV_TOKEN_BYTES bytes per context
 * token, checked before the tokenizer allocates: its work is bounded by the
 * context, not by the body. */
enum { SRV_TOKEN_BYTES = 32, SRV_JSON_SPARE_ITEMS = 1 << 16 };
size_t srv_text_budget(const srv_server *srv);
/* 0, or -1 and a 400 naming param when len bytes exceed the budget. */
int srv_text_fits(const srv_server *srv, size_t len, const char *param, srv_err *e);
/* A body -> its JSON object: UTF-8, depth, U+0000 and value count checked
 * before cJSON allocates (at most 2 x context + SRV_JSON_SPARE_ITEMS values). */
struct cJSON;
struct cJSON *srv_json_parse(srv_server *srv, const char *body, size_t len, srv_err *e);
/* Parses and checks a chat or completions body into a new job (tokenized).
 * Returns NULL and fills e on any problem. */
srv_job *srv_parse_job(srv_server *srv, srv_kind kind, const char *body, size_t len, srv_err *e);

/* tools_req.c: tools, tool_choice and parallel_tool_calls into j->tools (and, for
 * a required or named choice, j->fmt_*); tmpl: the chat template's text. */
int srv_parse_tools(srv_job *j, const struct cJSON *root, const char *tmpl, srv_err *e);
/* The fields of messages[i] (role given) beyond role and content, checked and
 * copied into out as the template sees them: tool_call_id, name, tool_calls
 * (arguments as objects), reasoning_content. */
int srv_tool_message(const struct cJSON *in, int i, const char *role, struct cJSON *out,
                     srv_err *e);
/* POST /apply-template: a chat body's rendered prompt, malloc'd ({"prompt": ...}). */
char *srv_apply_template(srv_server *srv, const char *body, size_t len, srv_err *e);

/* respond.c: what the worker emits. All append to j->out under j->mu. */
void srv_emit_begin(srv_job *j);
/* A committed token's kind (dfl_token_info.kind), kept for its choice's
 * "provenance" (with return_provenance): one letter per token, 'c' a classic
 * step, 'd' an accepted draft, 'b' a round's bonus. A stream sends each letter
 * with the first chunk after its token (tokens without text of their own wait
 * for the next chunk: the final one at the latest). */
#define SRV_PROV_LETTERS "cdb"
void srv_emit_kind(srv_job *j, const dfl_token_info *tok);
/* text: answer text; reason (may be NULL): reasoning text (chat only). */
void srv_emit_token(srv_job *j, const dfl_token_info *tok, const char *text, size_t n,
                    const char *reason, size_t rn);
void srv_emit_end(srv_job *j, int rc, const dfl_error *err);
/* srv_emit_token for answer text that may hold tool calls (j->toolp): the
 * calls go out as tool_calls; final: the answer ended. */
void srv_emit_answer(srv_job *j, const dfl_token_info *tok, const char *text, size_t n,
                     const char *reason, size_t rn, int final);

/* ---- sched.c ----------------------------------------------------------------- */

typedef struct srv_slot {
    srv_server *srv;
    int idx;
    dfl_session *sess;
    pthread_t th;
    pthread_cond_t cv;
    srv_job *job;         /* assigned job, NULL when idle */
    int32_t *hist;        /* (ctx) tokens of the slot's last sequence: prompt + output */
    int n_hist;
    uint64_t last_used;
    int pins;             /* other slots copying this one's prefix: not given a job meanwhile */
} srv_slot;


/* ---- metrics.c ------------------------------------------------------------------ */

typedef struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t http[6];           /* responses by class: 2xx 4xx 5xx (index 2, 4, 5) */
    uint64_t req_ok, req_cancelled, req_error, req_rejected;
    uint64_t prompt_tokens, cached_tokens, gen_tokens;
    double t_prefill, t_decode;
    uint64_t rounds, proposed, accepted, committed, classic_steps;
    uint64_t shared_forwards, shared_rows;   /* dfl_stats: continuous batching at work */
    /* the same per acceptance rule (DFL_ACCEPT_*), for requests that speculated */
    uint64_t rule_rounds[3], rule_proposed[3], rule_accepted[3], rule_committed[3];
    uint64_t rule_tokens[3];
    double rule_t_decode[3];
    /* the same per lane that drafted (DFL_LANE_*: the drafter, the n-gram lane) */
    uint64_t lane_rounds[DFL_LANES], lane_proposed[DFL_LANES], lane_accepted[DFL_LANES];
    uint64_t lane_committed[DFL_LANES];
    double win_t0;              /* start of the current 1-second bucket */
    uint64_t win[10];           /* tokens generated per second, last 10 seconds */
    int win_pos;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_tokens(srv_metrics *m, int n);     /* n tokens just generated */
void srv_metrics_job(srv_metrics *m, const srv_job *j);
void srv_metrics_http(srv_metrics *m, int status);
/* Prometheus text exposition, malloc'd; queued and busy: srv_sched_counts (the
 * caller asks the scheduler, so metrics.c stays below sched.c). */
char *srv_metrics_text(srv_server *srv, int queued, int busy);

/* ---- the server ------------------------------------------------------------------ */

struct srv_server {
    srv_opts o;
    dfl_engine *e;
    dfl_model_info info;
    char model_id[160];
    int ready;                   /* engine loaded, workers up (srv_ready) */
    int draining;                /* SIGINT/SIGTERM: no new work (srv_draining) */
    int live_jobs;               /* jobs not yet freed: their responses may still be in flight */

    pthread_mutex_t mu;          /* guards slots' job/hist, the queue, counters below,
                                    the replay references */
    struct srv_replay *replay;   /* (SRV_REPLAY_MAX) with --replay-tau: earlier greedy
                                    answers by prompt */
    pthread_cond_t idle_cv;      /* a slot became idle */
    int stopping;                /* workers exit */
    srv_slot *slots;
    int n_slots;
    srv_job **queue;             /* (queue_max) ring */
    int q_head, q_len, q_cap;
    int n_busy;
    uint64_t use_clock;
    uint64_t id_counter;
    srv_metrics m;
};

/* The loader thread publishes everything about the engine with ready. */
static inline int srv_ready(srv_server *s) { return __atomic_load_n(&s->ready, __ATOMIC_ACQUIRE); }
static inline int srv_draining(srv_server *s) {
    return __atomic_load_n(&s->draining, __ATOMIC_ACQUIRE);
}

/* Takes a reference for the scheduler. Returns 0, or -1 when the queue is
 * full / the server is draining (the caller answers 503). */
int srv_submit(srv_server *srv, srv_job *j);
/* why: SRV_CANCEL_*. A queued job is dropped, a running one told to stop. */
void srv_cancel(srv_server *srv, srv_job *j, int why);
int srv_sched_start(srv_server *srv, dfl_error *err);
/* Refuses new jobs and ends the queued ones (503 / an error event). */
void srv_sched_drain(srv_server *srv);
/* Drains, cancels running jobs at their next token, joins the workers. */
void srv_sched_stop(srv_server *srv);
void srv_sched_counts(srv_server *srv, int *queued, int *busy);

/* Tokenizer access that is safe from any thread (request.c: below respond.c
 * and sched.c, which use it too). */

#endif
