/* base.h - errors, allocation checks, timers, threads, weight types: what every layer uses. */
#ifndef DFL_BASE_H
#define DFL_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dflash.h"

/* Sets err (when not NULL) and returns code, so callers write
 * `return dfl_fail(err, DFL_EFORMAT, "%s: tensor %s: ...", ...);` */
int dfl_fail(dfl_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Allocation that reports where it failed; programmer-side out of memory is fatal. */
void *dfl_xmalloc_(size_t n, const char *file, int line);
void *dfl_xcalloc_(size_t n, size_t sz, const char *file, int line);
#define xmalloc(n) dfl_xmalloc_((n), __FILE__, __LINE__)
#define xcalloc(n, sz) dfl_xcalloc_((n), (sz), __FILE__, __LINE__)

/* The one way to grow an array: returns p (an array of *cap elements of sz
 * bytes) grown to hold at least need elements, *cap doubling from 16; or
 * NULL with DFL_ENOMEM in err, naming what, and p then still valid and
 * unchanged. Callers return the error; the library never exits on it. */
void *dfl_grow(void *p, size_t *cap, size_t need, size_t sz, const char *what, dfl_error *err);
/* The same for buffers whose failure no caller can handle (as xmalloc): a
 * message naming file:line and exit(1) when memory runs out. */
void *dfl_xgrow_(void *p, size_t *cap, size_t need, size_t sz, const char *file, int line);
#define xgrow(p, cap, need, sz) dfl_xgrow_((p), (cap), (need), (sz), __FILE__, __LINE__)

/* 64-byte aligned, zeroed; free with free(). */
void *dfl_aligned_alloc(size_t n);

double dfl_now(void);           /* monotonic seconds */
int dfl_ncpu(void);

/* Overflow-checked size arithmetic: returns 0 and sets *out, or -1 on overflow. */
static inline int dfl_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* Reads a whole file (at most max_bytes); returns NUL-terminated buffer or NULL. */
char *dfl_read_file(const char *path, size_t max_bytes, size_t *len, dfl_error *err);

/* ---- weight types ------------------------------------------------------ */
/* Numbered as our own enum (not GGUF's); here because kernels and io both use them. */
typedef enum {
    DFL_F32 = 0,
    DFL_F16,
    DFL_BF16,
    DFL_Q8_0,   /* blocks of 32: f16 scale + 32 int8 */
    DFL_Q4_0,   /* blocks of 32: f16 scale + 16 bytes of nibbles */
    DFL_Q4_1,   /* blocks of 32: f16 scale, f16 min + 16 bytes of nibbles */
    DFL_Q4_K,   /* super-blocks of 256 */
    DFL_Q6_K,   /* super-blocks of 256 */
    DFL_NTYPES
} dfl_type;

const char *dfl_type_name(dfl_type t);
int dfl_type_from_name(const char *s);   /* -1 if unknown */
int dfl_type_block(dfl_type t);          /* elements per block (1 for float types) */
size_t dfl_type_block_bytes(dfl_type t); /* bytes per block */
/* Bytes of one row of cols elements; 0 if cols is not a multiple of the block. */
size_t dfl_type_row_bytes(dfl_type t, int64_t cols);

/* ---- a fair lock -------------------------------------------------------- */
/* First come, first served: concurrent sessions sharing one engine take
 * turns per forward pass, so none starves. */
#include <pthread.h>
typedef struct dfl_ticket {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next, serving;
} dfl_ticket;
void dfl_ticket_init(dfl_ticket *l);
void dfl_ticket_destroy(dfl_ticket *l);
void dfl_ticket_lock(dfl_ticket *l);
void dfl_ticket_unlock(dfl_ticket *l);

/* ---- persistent thread pool -------------------------------------------- */
/* pool_run calls fn(ctx, i, n) for i in [0, n) across the pool's threads;
 * thread t runs tasks t, t+nthreads, ... so a task's result never depends on
 * which thread ran it. */
typedef struct dfl_pool dfl_pool;
typedef void (*dfl_task_fn)(void *ctx, int i, int n);
dfl_pool *dfl_pool_new(int n_threads);
void dfl_pool_free(dfl_pool *p);
int dfl_pool_size(const dfl_pool *p);
void dfl_pool_run(dfl_pool *p, dfl_task_fn fn, void *ctx, int n);

#endif
