#define _GNU_SOURCE
#include "base.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int dfl_fail(dfl_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

void *dfl_xmalloc_(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "dflash: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
        exit(1);
    }
    return p;
}

void *dfl_xcalloc_(size_t n, size_t sz, const char *file, int line) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "dflash: out of memory allocating %zu x %zu bytes at %s:%d\n", n, sz,
                file, line);
        exit(1);
    }
    return p;
}

void *dfl_grow(void *p, size_t *cap, size_t need, size_t sz, const char *what, dfl_error *err) {
    if (need <= *cap) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need) c = c > SIZE_MAX / 2 ? need : c * 2;
    uint64_t bytes;
    void *q = dfl_mul_ok(c, sz ? sz : 1, &bytes) || bytes > SIZE_MAX ? NULL : realloc(p, bytes);
    if (!q) {
        dfl_fail(err, DFL_ENOMEM, "out of memory growing %s to %zu entries of %zu bytes", what, c,
                 sz);
        return NULL;
    }
    *cap = c;
    return q;
}

void *dfl_xgrow_(void *p, size_t *cap, size_t need, size_t sz, const char *file, int line) {
    dfl_error err = {0};
    void *q = dfl_grow(p, cap, need, sz, "a buffer", &err);
    if (!q) {
        fprintf(stderr, "dflash: %s at %s:%d\n", err.msg, file, line);
        exit(1);
    }
    return q;
}

void *dfl_aligned_alloc(size_t n) {
    size_t sz = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (!p) {
        fprintf(stderr, "dflash: out of memory allocating %zu bytes\n", n);
        exit(1);
    }
    memset(p, 0, sz ? sz : 64);
    return p;
}

double dfl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int dfl_ncpu(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

char *dfl_read_file(const char *path, size_t max_bytes, size_t *len, dfl_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        dfl_fail(err, DFL_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        dfl_fail(err, DFL_EIO, "%s: not a regular file", path);
        return NULL;
    }
    if ((uint64_t)st.st_size > max_bytes) {
        fclose(f);
        dfl_fail(err, DFL_EFORMAT, "%s: %lld bytes, more than the %zu allowed", path,
                 (long long)st.st_size, max_bytes);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    char *buf = xmalloc(n + 1);
    if (fread(buf, 1, n, f) != n) {
        fclose(f);
        free(buf);
        dfl_fail(err, DFL_EIO, "%s: read failed", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* ---- fair lock --------------------------------------------------------- */

void dfl_ticket_init(dfl_ticket *l) {
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->next = l->serving = 0;
}

void dfl_ticket_destroy(dfl_ticket *l) {
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
}

void dfl_ticket_lock(dfl_ticket *l) {
    pthread_mutex_lock(&l->mu);
    uint64_t me = l->next++;
    while (l->serving != me) pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
}

void dfl_ticket_unlock(dfl_ticket *l) {
    pthread_mutex_lock(&l->mu);
    l->serving++;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* ---- thread pool ------------------------------------------------------- */

/* A job is handed over by bumping gen; the last worker to finish drops
 * pending to 0. Both sides spin for a while before sleeping on a condition
 * variable: a decode step runs a few hundred short jobs back to back, and a
 * futex wake-up costs tens of microseconds each time. Sleeping is announced
 * in sleepers / main_waiting with read-modify-writes, as gen and pending
 * change (full fences, so a waker either sees the sleeper or the sleeper sees
 * the new state), and waking happens under mu, so no wake-up is lost. */
enum { SPIN_US = 100 };   /* how long an idle thread spins before sleeping */

struct dfl_pool {
    int n;                  /* threads including the caller */
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    _Atomic uint64_t gen;   /* bumped per job */
    _Atomic int pending;    /* workers still running the job */
    _Atomic int sleepers;   /* workers asleep on go */
    _Atomic int main_waiting; /* caller asleep on done */
    _Atomic int quit;
    dfl_task_fn fn;
    void *ctx;
    int ntask;
};

typedef struct { dfl_pool *p; int id; } worker_arg;

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins until done(p, arg) or SPIN_US passed; returns done's last value. */
static int spin_until(int (*done)(dfl_pool *, uint64_t), dfl_pool *p, uint64_t arg) {
    double t0 = 0;
    for (int i = 0;; i++) {
        if (done(p, arg)) return 1;
        if ((i & 255) == 255) {
            double t = dfl_now();
            if (t0 == 0) t0 = t;
            else if (t - t0 > SPIN_US * 1e-6) return 0;
        }
        cpu_relax();
    }
}

static int new_job(dfl_pool *p, uint64_t seen) { return p->gen != seen || p->quit; }
static int job_done(dfl_pool *p, uint64_t unused) { return p->pending == 0; }

static void run_share(dfl_pool *p, int id) {
    for (int i = id; i < p->ntask; i += p->n) p->fn(p->ctx, i, p->ntask);
}

static void *worker(void *arg) {
    worker_arg *w = arg;
    dfl_pool *p = w->p;
    int id = w->id;
    free(w);
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until(new_job, p, seen)) {
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (!new_job(p, seen)) pthread_cond_wait(&p->go, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
        }
        if (p->quit) return NULL;
        seen = p->gen;
        run_share(p, id);
        if (--p->pending == 0 && p->main_waiting) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

dfl_pool *dfl_pool_new(int n_threads) {
    if (n_threads <= 0) n_threads = dfl_ncpu();
    if (n_threads > 256) n_threads = 256;
    dfl_pool *p = xcalloc(1, sizeof *p);
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = xcalloc(n_threads, sizeof(pthread_t));
    for (int i = 1; i < n_threads; i++) {
        worker_arg *w = xmalloc(sizeof *w);
        w->p = p;
        w->id = i;
        if (pthread_create(&p->th[i], NULL, worker, w) != 0) {
            fprintf(stderr, "dflash: cannot start thread %d\n", i);
            exit(1);
        }
    }
    return p;
}

void dfl_pool_free(dfl_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

int dfl_pool_size(const dfl_pool *p) { return p ? p->n : 1; }

void dfl_pool_run(dfl_pool *p, dfl_task_fn fn, void *ctx, int n) {
    if (!p || p->n == 1 || n <= 1) {
        for (int i = 0; i < n; i++) fn(ctx, i, n);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->ntask = n;
    p->pending = p->n - 1;
    p->gen++;   /* publishes the fields above (seq_cst) */
    if (p->sleepers) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->go);
        pthread_mutex_unlock(&p->mu);
    }
    run_share(p, 0);
    if (!spin_until(job_done, p, 0)) {
        pthread_mutex_lock(&p->mu);
        /* an exchange, not a store: the worker that ends the job reads
         * main_waiting after its own RMW of pending, and this thread reads
         * pending after announcing itself. qemu-user (7.2, x86 host) runs an
         * aarch64 seq_cst store and the load after it without a StoreLoad
         * fence; both sides then read the old value, the worker signals no
         * one, and the pool sleeps for good (a CI run, and a clean-clone run
         * here: pending 0, main_waiting 1, both threads on futexes). An RMW
         * is a locked instruction there, a full fence. */
        atomic_exchange(&p->main_waiting, 1);
        while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
        p->main_waiting = 0;
        pthread_mutex_unlock(&p->mu);
    }
}

/* ---- weight types ------------------------------------------------------ */

static const struct {
    const char *name;
    int block;          /* elements per block */
    size_t block_bytes; /* bytes per block */
} types[DFL_NTYPES] = {
    [DFL_F32] = {"f32", 1, 4},
    [DFL_F16] = {"f16", 1, 2},
    [DFL_BF16] = {"bf16", 1, 2},
    [DFL_Q8_0] = {"q8_0", 32, 34},   /* f16 d + 32 x int8 */
    [DFL_Q4_0] = {"q4_0", 32, 18},   /* f16 d + 16 bytes of nibbles */
    [DFL_Q4_1] = {"q4_1", 32, 20},   /* f16 d, m + 16 bytes of nibbles */
    [DFL_Q4_K] = {"q4_k", 256, 144}, /* f16 d, dmin + 12 scale bytes + 128 nibble bytes */
    [DFL_Q6_K] = {"q6_k", 256, 210}, /* 128 ql + 64 qh + 16 scales + f16 d */
};

const char *dfl_type_name(dfl_type t) {
    return (unsigned)t < DFL_NTYPES ? types[t].name : "?";
}

int dfl_type_from_name(const char *s) {
    if (!s) return -1;
    for (int i = 0; i < DFL_NTYPES; i++)
        if (strcmp(s, types[i].name) == 0) return i;
    return -1;
}

int dfl_type_block(dfl_type t) {
    return (unsigned)t < DFL_NTYPES ? types[t].block : 0;
}

size_t dfl_type_block_bytes(dfl_type t) {
    return (unsigned)t < DFL_NTYPES ? types[t].block_bytes : 0;
}

size_t dfl_type_row_bytes(dfl_type t, int64_t cols) {
    if ((unsigned)t >= DFL_NTYPES || cols < 0 || cols % types[t].block) return 0;
    uint64_t n;
    if (dfl_mul_ok((uint64_t)(cols / types[t].block), types[t].block_bytes, &n) || n > SIZE_MAX)
        return 0;
    return (size_t)n;
}
