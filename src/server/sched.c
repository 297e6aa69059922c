/* sched.c - slots, the bounded queue and one worker thread per slot.
 *
 * Each slot owns a dfl_session (its KV cache and drafter side store) and
 * remembers the tokens of its last sequence. A job goes to the idle slot whose
 * last sequence shares the longest prefix with the job's prompt (dfl_generate
 * keeps that prefix, so a follow-up turn is not prefilled again), else to the
 * least recently used one; jobs wait in arrival order when every slot is busy.
 *
 * Sharing the engine: the workers call dfl_generate at once; the engine
 * runs their forwards together (continuous batching: each forward carries
 * every busy slot's decode row, verify block or prefill chunk), and a
 * greedy request's output is the same alone or among others. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"

/* ---- queue and dispatch (all under srv->mu) ------------------------------------ */

static srv_job *queue_pop(srv_server *srv) {
    if (!srv->q_len) return NULL;
    srv_job *j = srv->queue[srv->q_head];
    srv->q_head = (srv->q_head + 1) % srv->q_cap;
    srv->q_len--;
    return j;
}

static int queue_remove(srv_server *srv, srv_job *j) {
    int found = 0, n = srv->q_len, cap = srv->q_cap;
    for (int i = 0, w = 0; i < n; i++) {
        srv_job *x = srv->queue[(srv->q_head + i) % cap];
        if (x == j) found = 1;
        else srv->queue[(srv->q_head + w++) % cap] = x;
    }
    srv->q_len -= found;
    return found;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* The idle slot a job reuses most of (longest shared prefix, then least
 * recently used); pinned slots are being copied from and take no job. */
static srv_slot *best_slot(srv_server *srv, const srv_job *j, int *lcp) {
    srv_slot *best = NULL;
    *lcp = -1;
    for (int i = 0; i < srv->n_slots; i++) {
        srv_slot *s = &srv->slots[i];
        if (s->job || s->pins) continue;
        int n = common_prefix(s->hist, s->n_hist, j->prompt, j->n_prompt);
        if (n > *lcp || (n == *lcp && s->last_used < best->last_used)) best = s, *lcp = n;
    }
    return best;
}

/* A finished conversation stays whole: when the best slot's sequence goes on
 * past the shared prefix (its own next turn would want that), the job takes
 * the least recently used other idle slot and copies the prefix from it. */
static srv_slot *spare_slot(srv_server *srv, const srv_slot *best, int lcp) {
    srv_slot *lru = NULL;
    if (lcp < 1 || best->n_hist <= lcp + 1) return NULL;
    for (int i = 0; i < srv->n_slots; i++) {
        srv_slot *s = &srv->slots[i];
        if (s == best || s->job || s->pins) continue;
        if (!lru || s->last_used < lru->last_used) lru = s;
    }
    return lru;
}

/* Gives queued jobs to idle slots. */
static void dispatch(srv_server *srv) {
    while (srv->q_len && srv->n_busy < srv->n_slots) {
        int lcp;
        srv_slot *best = best_slot(srv, srv->queue[srv->q_head], &lcp);
        if (!best) return;   /* every idle slot is pinned: a copy ends soon and dispatches */
        srv_job *j = queue_pop(srv);
        srv_slot *spare = spare_slot(srv, best, lcp);
        if (spare) {
            j->copy_from = best;
            best->pins++;
            best = spare;
        }
        j->n_cached = lcp < j->n_prompt ? lcp : j->n_prompt - 1;
        pthread_mutex_lock(&j->mu);
        j->state = SRV_RUNNING;
        pthread_mutex_unlock(&j->mu);
        best->job = j;
        srv->n_busy++;
        pthread_cond_signal(&best->cv);
    }
}

/* The worker's copy of the prefix a dispatch chose (before generating). */
static void copy_prefix(srv_server *srv, srv_slot *s, srv_job *j) {
    srv_slot *src = j->copy_from;
    int n = dfl_session_copy_prefix(s->sess, src->sess, j->n_cached);
    memcpy(s->hist, src->hist, sizeof(int32_t) * (size_t)n);
    s->n_hist = n;
    j->n_cached = n;
    pthread_mutex_lock(&srv->mu);
    src->pins--;
    j->copy_from = NULL;
    dispatch(srv);
    pthread_mutex_unlock(&srv->mu);
}

/* Under srv->mu: whether a request may queue (a request of n choices is admitted
 * when one of one choice would be; the ring has room for SRV_MAX_CHOICES more).
 * Names the request when it may. */
static int admit(srv_server *srv, srv_job *j) {
    static const char *prefix[2] = {"chatcmpl-", "cmpl-"};
    int idle = srv->n_slots - srv->n_busy;
    if (srv_draining(srv) || !srv_ready(srv) || srv->q_len >= srv->o.queue_max + idle) {
        pthread_mutex_lock(&srv->m.mu);
        srv->m.req_rejected++;
        pthread_mutex_unlock(&srv->m.mu);
        return 0;
    }
    snprintf(j->id, sizeof j->id, "%s%llx%08llx", prefix[j->kind], (unsigned long long)j->created,
             (unsigned long long)++srv->id_counter);
    j->t_submit = srv_now();
    return 1;
}

/* Under srv->mu: j waits for a slot; the queue's reference is one the caller gave up. */
static void enqueue(srv_server *srv, srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->state = SRV_QUEUED;
    pthread_mutex_unlock(&j->mu);
    srv->queue[(srv->q_head + srv->q_len++) % srv->q_cap] = j;
}

/* n > 1: the choices queue in order, each holding the request; the request itself
 * never runs, and is done when its last choice is (respond.c). */
static void submit_choices(srv_server *srv, srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs += j->n_choices;
    j->state = SRV_RUNNING;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < j->n_choices; i++) {
        srv_job *c = j->choices[i];
        memcpy(c->id, j->id, sizeof c->id);
        c->t_submit = j->t_submit;
        c->parent = j;
        enqueue(srv, c);   /* takes the reference choices[] held */
    }
    free(j->choices);
    j->choices = NULL;
}

int srv_submit(srv_server *srv, srv_job *j) {
    pthread_mutex_lock(&srv->mu);
    if (!admit(srv, j)) {
        pthread_mutex_unlock(&srv->mu);
        return -1;
    }
    if (j->choices) {
        submit_choices(srv, j);
    } else {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        enqueue(srv, j);
    }
    dispatch(srv);
    pthread_mutex_unlock(&srv->mu);
    return 0;
}

/* A job that never ran: it still answers (stream: an error event). */
static void finish_unrun(srv_server *srv, srv_job *j, srv_finish f) {
    j->finish = f;
    j->t_start = j->t_end = srv_now();
    srv_emit_end(j, DFL_ECANCEL, NULL);
    srv_metrics_job(&srv->m, j);
    srv_job_unref(j);
}

/* Under srv->mu: the queued choices of request j end unrun; the running ones see
 * the request's cancel at their next token. */
static void drop_choices(srv_server *srv, srv_job *j) {
    for (int i = 0; i < srv->q_len;) {
        srv_job *x = srv->queue[(srv->q_head + i) % srv->q_cap];
        if (x->parent != j) {
            i++;
            continue;
        }
        queue_remove(srv, x);
        finish_unrun(srv, x, SRV_FIN_CANCEL);
    }
}

void srv_cancel(srv_server *srv, srv_job *j, int why) {
    pthread_mutex_lock(&srv->mu);
    pthread_mutex_lock(&j->mu);
    if (!j->cancel) __atomic_store_n(&j->cancel, why, __ATOMIC_RELAXED);
    int queued = j->state == SRV_QUEUED;
    pthread_mutex_unlock(&j->mu);
    if (queued && queue_remove(srv, j)) finish_unrun(srv, j, SRV_FIN_CANCEL);
    if (j->n_choices > 1) drop_choices(srv, j);
    pthread_mutex_unlock(&srv->mu);
}

void srv_sched_counts(srv_server *srv, int *queued, int *busy) {
    pthread_mutex_lock(&srv->mu);
    *queued = srv->q_len;
    *busy = srv->n_busy;
    pthread_mutex_unlock(&srv->mu);
}

/* ---- replay references (--replay-tau: benchmarks only) --------------------------- */

/* The first greedy answer to each prompt, kept so that a later request with
 * the same prompt can replay it as the drafter's proposals (a drafter of a
 * chosen acceptance on a model whose own drafter is random). Bounded: the
 * first SRV_REPLAY_MAX prompts only. */
enum { SRV_REPLAY_MAX = 256 };
typedef struct srv_replay {
    int32_t *ids;          /* (n_prompt + n_ref): the prompt, then its answer */
    int n_prompt, n_ref;
} srv_replay;

static srv_replay *replay_find(srv_server *srv, const srv_job *j) {
    for (int i = 0; i < SRV_REPLAY_MAX && srv->replay[i].ids; i++) {
        srv_replay *r = &srv->replay[i];
        if (r->n_prompt == j->n_prompt &&
            !memcmp(r->ids, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt))
            return r;
    }
    return NULL;
}

/* Points j's parameters at the stored answer to its prompt; 1 when there is one. */
static int replay_use(srv_server *srv, srv_job *j, dfl_gen_params *gp) {
    if (!srv->replay) return 0;   /* dfl_generate replays greedy requests only */
    pthread_mutex_lock(&srv->mu);
    srv_replay *r = replay_find(srv, j);
    pthread_mutex_unlock(&srv->mu);
    if (!r) return 0;
    gp->replay_ref = r->ids + r->n_prompt;   /* entries are never changed nor freed early */
    gp->n_replay_ref = r->n_ref;
    gp->replay_tau = srv->o.replay_tau;
    return 1;
}

static void replay_keep(srv_server *srv, const srv_job *j, const int32_t *out, int n) {
    if (!srv->replay || n < 1) return;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(j->n_prompt + n));
    if (!ids) return;
    memcpy(ids, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
    memcpy(ids + j->n_prompt, out, sizeof(int32_t) * (size_t)n);
    pthread_mutex_lock(&srv->mu);
    int i = 0;
    while (i < SRV_REPLAY_MAX && srv->replay[i].ids) i++;
    if (i < SRV_REPLAY_MAX && !replay_find(srv, j)) {
        srv->replay[i] = (srv_replay){ids, j->n_prompt, n};
        ids = NULL;
    }
    pthread_mutex_unlock(&srv->mu);
    free(ids);
}

/* ---- running a job --------------------------------------------------------------- */

/* A choice also stops when its request is cancelled (the client left). */
static int cancelled(srv_job *j) {
    int why = __atomic_load_n(&j->cancel, __ATOMIC_RELAXED);
    if (!why && j->parent) why = __atomic_load_n(&j->parent->cancel, __ATOMIC_RELAXED);
    return why;
}

/* Text of a piece, made valid UTF-8, through the stop matcher, out to the job. */
static int release(srv_job *j, const dfl_token_info *tok, const char *piece, int n, int final) {
    srv_buf clean = {0};
    const char *out;
    size_t n_out;
    if (n > 0) srv_utf8_sanitize(&clean, piece, (size_t)n);
    int hit = srv_stop_push(&j->stop, clean.p ? clean.p : "", clean.len, final, &out, &n_out);
    if (j->think.state == SRV_THINK_OFF) {
        srv_emit_answer(j, tok, out, n_out, NULL, 0, final || hit);
    } else {
        srv_buf r = {0}, c = {0};
        srv_think_push(&j->think, out, n_out, final || hit, &r, &c);
        srv_emit_answer(j, tok, c.p ? c.p : "", c.len, r.p, r.len, final || hit);
        srv_buf_free(&r), srv_buf_free(&c);
    }
    srv_buf_free(&clean);
    return hit;
}

typedef struct run_ctx {
    srv_job *j;
    srv_slot *s;
} run_ctx;

static int on_token(void *ud, const dfl_token_info *tok) {
    run_ctx *c = ud;
    srv_job *j = c->j;
    srv_server *srv = j->srv;
    if (cancelled(j)) return 1;
    j->n_gen++;
    srv_emit_kind(j, tok);
    if (c->s->n_hist < srv->info.ctx_size) c->s->hist[c->s->n_hist++] = tok->id;
    srv_metrics_tokens(&srv->m, 1);
    char piece[4096];
    int eog = !j->gp.ignore_eos && dfl_token_is_eog(srv->e, tok->id);
    if (j->toolp.t) j->detok.show_special = srv_tools_shown(j->tools, tok->id);
    int n = eog ? 0 : dfl_detok_push(&j->detok, tok->id, piece, sizeof piece);
    /* the end of generation releases what the stop, think and tool parsers hold */
    if (release(j, tok, piece, n, eog) || eog) {
        j->finish = SRV_FIN_STOP;
        return 1;
    }
    return 0;
}

/* One line per request: enough to follow a server's life from its log. */
static void log_job(const srv_slot *s, const srv_job *j) {
    static const char *fin[] = {"-", "stop", "length", "cancelled", "error"};
    const dfl_stats *st = &j->st;
    char who[80];   /* the choices of a request share its id */
    if (j->parent) snprintf(who, sizeof who, "%s choice %d", j->id, j->index);
    else snprintf(who, sizeof who, "%s", j->id);
    fprintf(stderr,
            "dflash serve: %s slot %d: %d prompt (%d cached) + %d tokens, %.1f tok/s, "
            "%llu rounds tau %.2f, %.1f rows of others per forward, queued %.0f ms, "
            "prefill %.0f ms, drafter %.0f ms, total %.0f ms: %s\n",
            who, s->idx, j->n_prompt, j->n_cached, j->n_gen,
            st->t_decode > 0 ? j->n_gen / st->t_decode : 0.0, (unsigned long long)st->rounds,
            st->rounds ? (double)st->committed / (double)st->rounds : 0.0,
            st->rounds + st->classic_steps
                ? (double)st->shared_rows / (double)(st->rounds + st->classic_steps) : 0.0,
            (j->t_start - j->t_submit) * 1e3, st->t_prefill * 1e3, st->t_draft * 1e3,
            (j->t_end - j->t_submit) * 1e3, fin[j->finish]);
}

/* Runs j on slot s and settles its finish reason; returns the code its end
 * event carries (the worker sends it once the slot is free again). */
static int run_job(srv_server *srv, srv_slot *s, srv_job *j, dfl_error *err) {
    run_ctx c = {j, s};
    int rc = DFL_ECANCEL;
    j->t_start = srv_now();
    dfl_detok_init(&j->detok, srv->e, 0);
    srv_emit_begin(j);
    if (j->copy_from) copy_prefix(srv, s, j);
    s->n_hist = 0;
    if (!cancelled(j)) {
        dfl_gen_params gp = j->gp;
        memcpy(s->hist, j->prompt, sizeof(int32_t) * (size_t)j->n_prompt);
        s->n_hist = j->n_prompt;
        int replayed = replay_use(srv, j, &gp);
        /* (a request that records its prompt's answer runs the drafter as any
         * request does: its evidence stays apart from the replays' (dfl_generate),
         * and its slot's side store keeps the prefix a replay of it reuses) */
        rc = dfl_generate(s->sess, j->prompt, j->n_prompt, &gp, on_token, &c, &j->st, err);
        /* what was reused, not what the dispatch hoped for: a drafter's side store
         * that lacks the prefix (its request decoded classically) has it prefilled */
        j->n_cached = j->st.n_cached;
        if (j->n_gen == 0 && rc != DFL_OK) s->n_hist = 0;
        if (!replayed && rc == DFL_OK && !cancelled(j))
            replay_keep(srv, j, s->hist + j->n_prompt, s->n_hist - j->n_prompt);
    }

    char piece[64];
    int n = dfl_detok_flush(&j->detok, piece, sizeof piece);
    if (j->finish == SRV_FIN_NONE && release(j, NULL, piece, n, 1)) j->finish = SRV_FIN_STOP;

    /* A callback's stop is not an error: dfl_generate returns 0 with
     * DFL_STOP_CANCEL, and the reason is already in j->finish. */
    int why = cancelled(j);
    if (why == SRV_CANCEL_CLIENT) j->finish = SRV_FIN_CANCEL;
    else if (j->finish != SRV_FIN_NONE) {}
    else if (why == SRV_CANCEL_SHUTDOWN) j->finish = SRV_FIN_ERROR;
    else if (rc == DFL_ECTX || (rc == DFL_OK && (j->st.stop == DFL_STOP_LENGTH ||
                                                 j->st.stop == DFL_STOP_CTX)))
        j->finish = SRV_FIN_LENGTH;
    else if (rc == DFL_OK)
        j->finish = j->st.stop == DFL_STOP_EOS || j->n_gen < j->gp.max_tokens ? SRV_FIN_STOP
                                                                               : SRV_FIN_LENGTH;
    else j->finish = SRV_FIN_ERROR;
    if (j->finish == SRV_FIN_ERROR && why != SRV_CANCEL_SHUTDOWN)
        fprintf(stderr, "dflash serve: %s: generation failed (%d): %s\n", j->id, rc, err->msg);
    j->t_end = srv_now();
    srv_metrics_job(&srv->m, j);
    log_job(s, j);
    return why == SRV_CANCEL_SHUTDOWN ? DFL_ECANCEL : rc;
}

static void *worker(void *arg) {
    srv_slot *s = arg;
    srv_server *srv = s->srv;
    pthread_mutex_lock(&srv->mu);
    for (;;) {
        while (!s->job && !srv->stopping) pthread_cond_wait(&s->cv, &srv->mu);
        srv_job *j = s->job;
        if (!j) break;
        pthread_mutex_unlock(&srv->mu);
        dfl_error err = {0};
        int rc = run_job(srv, s, j, &err);
        pthread_mutex_lock(&srv->mu);
        s->job = NULL;
        s->last_used = ++srv->use_clock;
        srv->n_busy--;
        dispatch(srv);
        pthread_cond_broadcast(&srv->idle_cv);
        pthread_mutex_unlock(&srv->mu);
        /* The answer's end goes out only now, with the slot idle and holding
         * the conversation: a follow-up turn sent the moment it arrives finds
         * the slot (and its cache) instead of a busy one. */
        srv_emit_end(j, rc, &err);
        srv_job_unref(j);   /* only now: until s->job is cleared, srv_sched_stop may write j->cancel */
        pthread_mutex_lock(&srv->mu);
    }
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------- */

int srv_sched_start(srv_server *srv, dfl_error *err) {
    srv->n_slots = srv->o.parallel;
    srv->slots = calloc((size_t)srv->n_slots, sizeof *srv->slots);
    /* Room for queue_max waiting jobs plus one per slot on its way to it, plus
     * the other choices of a request admitted last. */
    srv->q_cap = srv->o.queue_max + srv->n_slots + SRV_MAX_CHOICES;
    if (srv->o.replay_tau > 0) srv->replay = calloc(SRV_REPLAY_MAX, sizeof *srv->replay);
    srv->queue = calloc((size_t)srv->q_cap, sizeof *srv->queue);
    for (int i = 0; i < srv->n_slots; i++) {
        srv_slot *s = &srv->slots[i];
        s->srv = srv;
        s->idx = i;
        pthread_cond_init(&s->cv, NULL);
        s->hist = calloc((size_t)srv->info.ctx_size, sizeof *s->hist);
        int rc = dfl_session_new(srv->e, &s->sess, err);
        if (rc) return rc;
    }
    for (int i = 0; i < srv->n_slots; i++)
        if (pthread_create(&srv->slots[i].th, NULL, worker, &srv->slots[i]))
            return -1;
    return 0;
}

void srv_sched_drain(srv_server *srv) {
    pthread_mutex_lock(&srv->mu);
    __atomic_store_n(&srv->draining, 1, __ATOMIC_RELEASE);
    srv_job *j;
    while ((j = queue_pop(srv))) {
        pthread_mutex_lock(&j->mu);
        j->cancel = SRV_CANCEL_SHUTDOWN;
        pthread_mutex_unlock(&j->mu);
        finish_unrun(srv, j, SRV_FIN_ERROR);
    }
    pthread_mutex_unlock(&srv->mu);
}

void srv_sched_stop(srv_server *srv) {
    if (!srv->slots) return;
    srv_sched_drain(srv);
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->n_slots; i++) {
        srv_job *r = srv->slots[i].job;
        if (r) __atomic_store_n(&r->cancel, SRV_CANCEL_SHUTDOWN, __ATOMIC_RELAXED);
    }
    while (srv->n_busy > 0) pthread_cond_wait(&srv->idle_cv, &srv->mu);
    srv->stopping = 1;
    for (int i = 0; i < srv->n_slots; i++) pthread_cond_signal(&srv->slots[i].cv);
    pthread_mutex_unlock(&srv->mu);
    for (int i = 0; i < srv->n_slots; i++) {
        srv_slot *s = &srv->slots[i];
        if (s->th) pthread_join(s->th, NULL);
        dfl_session_free(s->sess);
        free(s->hist);
        pthread_cond_destroy(&s->cv);
    }
    free(srv->slots);
    free(srv->queue);
    for (int i = 0; srv->replay && i < SRV_REPLAY_MAX; i++) free(srv->replay[i].ids);
    free(srv->replay);
    srv->replay = NULL;
    srv->slots = NULL;
    srv->queue = NULL;
}
