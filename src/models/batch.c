/* batch.c - the combiner: forwards that threads call at once on distinct
 * sequences run as one.
 *
 * Why: decode rows of several sequences cost little more than one (the
 * weights are read once per forward), so a server whose slots took turns
 * would give four users a quarter of the machine each. Each waiting call is
 * queued; the call at the head becomes the leader once the machine is free,
 * waits until every joined sequence has its rows queued (they are drafting
 * or committing meanwhile, and a forward without them would leave them for
 * the next one), then runs every queued call that fits batch_rows as one
 * forward. Rows are batch invariant, so which calls meet never changes a
 * result: only how fast it comes.
 *
 * The drafter's passes (context rows into a side store, a block drafted)
 * meet the same way in a queue of their own: one pass carries every
 * sequence that drafts in a tick, and reads the drafter's weights and the
 * lm_head once for all, where sequences taking turns read them once each. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "models/model.h"

/* How long a leader waits for joined sequences still on their way: long
 * enough for a drafter pass or a commit, short enough that a sequence stuck
 * elsewhere costs the others little. */
enum { DFL_GATHER_US = 20000 };
/* How long a side leader (a drafter pass) waits for joined sequences that are
 * neither queued for a forward nor for the drafter: they are committing
 * tokens (the server streams them out) and draft next; shorter than a pass. */
enum { DFL_SIDE_GATHER_US = 3000 };
/* The line of a forward's time against its rows weights each forward by this
 * factor less than the next one (about the last 200 count), and has a slope
 * once this many forwards of spread row counts are in it. */
#define DFL_FIT_DECAY 0.995
enum { DFL_FIT_MIN = 8 };

typedef struct waiter {
    dfl_fwd *f;
    int done;
} waiter;

struct dfl_combiner {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* queue, busy, n_active or a done flag changed */
    waiter *queue[DFL_MAX_PARALLEL];
    int n_queued;
    int busy;                  /* a leader is running a forward */
    int n_active;              /* joined sequences */
    int n_side;                /* sequences in their drafter's work (holding t->lock) */
    double side_end;           /* when the last such work ended: its sequence queues next */
    double fit[5];             /* forwards' (rows, seconds), recent ones weighted most:
                                  sums of 1, rows, seconds, rows^2, rows * seconds */
    int max_rows;
    dfl_side_call *side_q[DFL_MAX_PARALLEL];   /* sequences waiting for a drafter pass */
    int n_side_q;
    int side_busy;             /* a side leader is running a pass */
    double fwd_end;            /* when the last forward ended: its sequences draft next */
};

dfl_combiner *dfl_combiner_new(int batch_rows) {
    dfl_combiner *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->max_rows = batch_rows;
    return c;
}

void dfl_combiner_free(dfl_combiner *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

void dfl_target_join(dfl_target *t) {
    pthread_mutex_lock(&t->comb->mu);
    t->comb->n_active++;
    pthread_mutex_unlock(&t->comb->mu);
}

int dfl_target_active(dfl_target *t) {
    pthread_mutex_lock(&t->comb->mu);
    int n = t->comb->n_active;
    pthread_mutex_unlock(&t->comb->mu);
    return n;
}

void dfl_target_leave(dfl_target *t) {
    pthread_mutex_lock(&t->comb->mu);
    t->comb->n_active--;
    pthread_cond_broadcast(&t->comb->cv);
    pthread_mutex_unlock(&t->comb->mu);
}

/* The slope of a least-squares line through the forwards' times against
 * their rows. A table of the time per row count, differenced, was too sparse:
 * under a server's mix of decode rows, blocks and prefill chunks most counts
 * are seen rarely, and one stalled forward set a round's cost for long. */
double dfl_target_row_cost(const dfl_target *t) {
    dfl_combiner *c = t->comb;
    pthread_mutex_lock(&c->mu);
    double n = c->fit[0], x = c->fit[1], y = c->fit[2], xx = c->fit[3], xy = c->fit[4];
    pthread_mutex_unlock(&c->mu);
    double var = n * xx - x * x;   /* n^2 times the variance of the rows */
    if (n < DFL_FIT_MIN || !(var > 0.25 * n * n)) return 0;
    double b = (n * xy - x * y) / var;
    return b > 0 ? b : 0;
}

static struct timespec deadline(double from_now_s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double ns = ts.tv_nsec + from_now_s * 1e9;
    ts.tv_sec += (time_t)(ns / 1e9);
    ts.tv_nsec = (long)(ns - (double)(time_t)(ns / 1e9) * 1e9);
    return ts;
}

/* ---- side passes: the drafter's work of several sequences as one ---------------- */

/* Takes the head's queued side calls (same pass function) that fit max_rows rows. */
static int side_take(dfl_combiner *c, dfl_side_call **out, int max_rows) {
    int k = 0, rows = 0, w = 0;
    for (int i = 0; i < c->n_side_q; i++) {
        dfl_side_call *x = c->side_q[i];
        if (k == 0 || (x->fn == out[0]->fn && x->ctx == out[0]->ctx && rows + x->rows <= max_rows)) {
            out[k++] = x;
            rows += x->rows;
        } else {
            c->side_q[w++] = x;
        }
    }
    c->n_side_q = w;
    return k;
}

/* Runs the taken calls as one pass holding the machine; called with c->mu held. */
static void side_lead(dfl_target *t, int max_rows) {
    dfl_combiner *c = t->comb;
    dfl_side_call *cs[DFL_MAX_PARALLEL];
    int k = side_take(c, cs, max_rows);
    c->side_busy = 1;
    c->n_side += k;
    pthread_mutex_unlock(&c->mu);
    int rows = 0;
    for (int i = 0; i < k; i++) rows += cs[i]->rows;
    dfl_ticket_lock(&t->lock);
    double t0 = dfl_now();
    cs[0]->fn(cs[0]->ctx, cs, k);
    double dt = dfl_now() - t0;
    dfl_ticket_unlock(&t->lock);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < k; i++) {
        cs[i]->done = 1;
        cs[i]->pass_rows = rows;
        cs[i]->crowd = c->n_active;
        cs[i]->seconds = dt;
    }
    c->n_side -= k;
    c->side_busy = 0;
    c->side_end = dfl_now();
    pthread_cond_broadcast(&c->cv);
}

/* A call's rows' share of its pass, counted as if every sequence joined then
 * had drafted beside it. A pass reads the drafter's weights and its lm_head
 * once for all its sequences, so in a crowd a round drafted alone was priced
 * at the whole pass: at two clients (tau 3, Zen 4) 25 of a round's 28-39 ms,
 * and every slot declined rounds that, drafted together at a block of 4, ran
 * 1.06x classic steps (20 pairs inside one server, 95% interval 1.035-1.095).
 * Once the crowd drafts together the share is what it measures; when it does
 * not, the gate's windows measure what the cheaper price cost. */
double dfl_side_charge(const dfl_side_call *call) {
    int rows = call->rows > 0 ? call->rows : 1;
    int of = rows * (call->crowd > 1 ? call->crowd : 1);
    if (call->pass_rows > of) of = call->pass_rows;
    return call->seconds * rows / of;
}

/* The head leads once every joined sequence waits here or for a forward (no
 * other drafter work can come), or after a short grace: one pass then carries
 * every sequence that drafts in this tick. */
void dfl_target_side_run(dfl_target *t, dfl_side_call *call, int max_rows) {
    dfl_combiner *c = t->comb;
    call->done = 0;
    pthread_mutex_lock(&c->mu);
    while (c->n_side_q == DFL_MAX_PARALLEL) pthread_cond_wait(&c->cv, &c->mu);
    c->side_q[c->n_side_q++] = call;
    pthread_cond_broadcast(&c->cv);
    double since = dfl_now();
    while (!call->done) {
        /* the sequences of a running forward draft next: wait for it, and give
         * them their grace from its end */
        int head = !c->side_busy && !c->busy && c->side_q[0] == call;
        double waited = dfl_now() - (since > c->fwd_end ? since : c->fwd_end);
        if (head && (c->n_side_q + c->n_queued >= c->n_active ||
                     waited * 1e6 >= DFL_SIDE_GATHER_US)) {
            side_lead(t, max_rows);
        } else if (head) {
            struct timespec ts = deadline(DFL_SIDE_GATHER_US * 1e-6 - waited);
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        } else {
            pthread_cond_wait(&c->cv, &c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* Takes the queued calls that fit (the head always does) out of the queue. */
static int take(dfl_target *t, waiter **out) {
    dfl_combiner *c = t->comb;
    int k = 0, rows = 0, w = 0;
    for (int i = 0; i < c->n_queued; i++) {
        waiter *x = c->queue[i];
        if (k == 0 || rows + x->f->n <= t->batch_rows) {
            out[k++] = x;
            rows += x->f->n;
        } else {
            c->queue[w++] = x;
        }
    }
    c->n_queued = w;
    return k;
}

/* Runs the taken calls; called without the mutex. */
static double run(dfl_target *t, waiter **ws, int k, int *rows) {
    dfl_fwd f[DFL_MAX_PARALLEL];
    *rows = 0;
    for (int i = 0; i < k; i++) {
        f[i] = *ws[i]->f;
        *rows += f[i].n;
    }
    dfl_ticket_lock(&t->lock);
    double t0 = dfl_now();
    dfl_target_forward_rows(t, f, k);
    double dt = dfl_now() - t0;
    dfl_ticket_unlock(&t->lock);
    for (int i = 0; i < k; i++) {
        ws[i]->f->others = *rows - f[i].n;
        ws[i]->f->other_seqs = k - 1;
        ws[i]->f->seconds = dt;
    }
    return dt;
}

static void lead(dfl_target *t) {
    dfl_combiner *c = t->comb;
    waiter *ws[DFL_MAX_PARALLEL];
    int k = take(t, ws), rows;
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);
    double dt = run(t, ws, k, &rows);
    pthread_mutex_lock(&c->mu);
    double obs[5] = {1, rows, dt, (double)rows * rows, rows * dt};
    for (int i = 0; i < 5; i++) c->fit[i] = DFL_FIT_DECAY * c->fit[i] + obs[i];
    for (int i = 0; i < k; i++) ws[i]->done = 1;
    c->busy = 0;
    c->fwd_end = dfl_now();
    pthread_cond_broadcast(&c->cv);
}

/* One call of at most max_rows rows, batched with whatever else is queued. */
static void submit(dfl_target *t, dfl_fwd *f) {
    dfl_combiner *c = t->comb;
    waiter me = {f, 0};
    pthread_mutex_lock(&c->mu);
    while (c->n_queued == DFL_MAX_PARALLEL) pthread_cond_wait(&c->cv, &c->mu);
    c->queue[c->n_queued++] = &me;
    pthread_cond_broadcast(&c->cv);
    double since = dfl_now();
    while (!me.done) {
        int head = !c->busy && c->n_queued && c->queue[0] == &me;
        /* the grace runs from the last forward's end too: a call queued during a
         * forward of 40 ms would lead the moment it ended, before its sequences
         * had sampled and queued again, and the crowd would split into two
         * forwards that alternate for good (4 slots: 55% of forwards full) */
        double from = since > c->side_end ? since : c->side_end;
        if (c->fwd_end > from) from = c->fwd_end;
        double waited = dfl_now() - from;
        /* a sequence in its drafter's work holds the machine and then queues: no
         * forward could run meanwhile, so the grace does not run out on it */
        if (head && (c->n_queued >= c->n_active ||
                     (waited * 1e6 >= DFL_GATHER_US && !c->n_side))) {
            lead(t);
        } else if (head && !c->n_side) {
            struct timespec ts = deadline(DFL_GATHER_US * 1e-6 - waited);
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        } else {
            pthread_cond_wait(&c->cv, &c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

int dfl_target_forward_ex(dfl_target *t, dfl_fwd *f, dfl_error *err) {
    dfl_kv *kv = f->kv;
    int n = f->n;
    if (n < 0 || kv->len + n > kv->cap)
        return dfl_fail(err, DFL_ECTX, "context full: %d + %d rows exceed --ctx-size %d",
                        kv->len, n, kv->cap);
    for (int i = 0; i < n; i++)
        if (f->tok[i] < 0 || f->tok[i] >= t->c.vocab)
            return dfl_fail(err, DFL_EARG, "token id %d outside the vocabulary (0..%d)",
                            f->tok[i], t->c.vocab - 1);
    int tree_rows = f->parent ? dfl_kv_tree_rows(kv) : 0;
    if (f->parent && (n > t->max_rows || n > tree_rows))
        return dfl_fail(err, DFL_EARG, "a tree of %d rows exceeds the %d one forward can verify "
                        "on this model (its rows per forward, or a recurrent state's snapshots)",
                        n, tree_rows < t->max_rows ? tree_rows : t->max_rows);
    for (int i = 0; f->parent && i < n; i++)
        if (f->parent[i] < -1 || f->parent[i] >= i)
            return dfl_fail(err, DFL_EARG, "tree row %d: parent %d is not an earlier row", i,
                            f->parent[i]);
    /* Chunk by chunk: a long prefill takes max_rows rows per forward, so the
     * other sequences' rounds go on between its chunks. */
    for (int a = 0; a < n; a += t->max_rows) {
        int m = n - a < t->max_rows ? n - a : t->max_rows;
        int lf = f->logits_from - a < 0 ? 0 : f->logits_from - a;
        dfl_fwd ch = *f;
        ch.tok = f->tok + a;
        ch.n = m;
        ch.logits_from = lf;
        ch.logits = f->logits ? f->logits + (size_t)(a + lf - f->logits_from) * t->c.vocab : NULL;
        ch.feat = f->n_cap ? f->feat + (size_t)a * f->n_cap * t->c.dim : NULL;
        submit(t, &ch);
        f->others = ch.others;
        f->other_seqs = ch.other_seqs;
        f->seconds = ch.seconds;
    }
    return 0;
}

int dfl_target_forward(dfl_target *t, dfl_kv *kv, const int32_t *tok, int n, int logits_from,
                       float *logits, const int *cap, int n_cap, float *feat, dfl_error *err) {
    dfl_fwd f = {.kv = kv, .tok = tok, .n = n, .logits_from = logits_from, .logits = logits,
                 .cap = cap, .n_cap = n_cap, .feat = feat};
    return dfl_target_forward_ex(t, &f, err);
}
