/* machine.c - measured read bandwidth and FMA peak (see machine.h). Both
 * run on the caller's pool, so the numbers bound what kernels on the same
 * threads can reach. Each SIMD loop has a plain-C twin for CPUs without
 * AVX2 (it then measures what the scalar kernels can reach). */
#include "kernels/machine.h"

#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/vec.h"

/* ---- read bandwidth ---------------------------------------------------------- */

typedef struct bw_job {
    const float *buf;
    size_t n;              /* floats */
    float sink[256];       /* keeps the sums alive */
} bw_job;

static void bw_task_ref(void *ctx, int i, int n) {
    bw_job *j = ctx;
    size_t per = j->n / n;
    const float *p = j->buf + per * i;
    float a[8] = {0};
    for (size_t k = 0; k + 8 <= per; k += 8)
        for (int l = 0; l < 8; l++) a[l] += p[k + l];
    j->sink[i & 255] = dfl_hsum8_ref(a);
}

#if DFL_X86
DFL_AVX2 static void bw_task(void *ctx, int i, int n) {
    bw_job *j = ctx;
    size_t per = j->n / n;
    const float *p = j->buf + per * i;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    /* four independent sums: enough loads in flight to saturate memory */
    for (size_t k = 0; k + 32 <= per; k += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + k));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + k + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + k + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + k + 24));
    }
    j->sink[i & 255] = dfl_hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

#else
#define bw_task bw_task_ref /* no vector form here: the scalar one measures */
#endif

double dfl_machine_read_bw(dfl_pool *pool, size_t bytes, int reps) {
    if (!bytes) bytes = (size_t)512 << 20;
    if (reps <= 0) reps = 5;
    int nt = dfl_pool_size(pool);
    /* slices of whole 32-float groups per thread */
    size_t n = bytes / 4 / (32 * (size_t)nt) * (32 * (size_t)nt);
    bw_job j = {dfl_aligned_alloc(n * 4), n, {0}};
    memset((void *)j.buf, 1, n * 4);   /* touch every page before timing */
    dfl_task_fn fn = dfl_cpu_has_avx2() ? bw_task : bw_task_ref;
    dfl_pool_run(pool, fn, &j, nt);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t = dfl_now();
        dfl_pool_run(pool, fn, &j, nt);
        t = dfl_now() - t;
        if (t > 0 && n * 4 / t > best) best = n * 4 / t;
    }
    free((void *)j.buf);
    return best / 1e9;
}

/* ---- FMA peak ------------------------------------------------------------------ */

enum { FMA_CHAINS = 10 };   /* > latency x ports (4 x 2 on Zen 3, Skylake) */

typedef struct fma_job {
    long iters;
    float sink[256];
} fma_job;

static void fma_task_ref(void *ctx, int i, int n) {
    (void)n;
    fma_job *j = ctx;
    float a[FMA_CHAINS];
    for (int k = 0; k < FMA_CHAINS; k++) a[k] = (float)k;
    for (long it = 0; it < j->iters; it++)
        for (int k = 0; k < FMA_CHAINS; k++) a[k] = fmaf(a[k], 0.999999f, 1e-7f);
    float s = 0;
    for (int k = 0; k < FMA_CHAINS; k++) s += a[k];
    j->sink[i & 255] = s;
}

#if DFL_X86
DFL_AVX2 static void fma_task(void *ctx, int i, int n) {
    (void)n;
    fma_job *j = ctx;
    __m256 a[FMA_CHAINS], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm256_set1_ps((float)k);
    for (long it = 0; it < j->iters; it++)
#pragma GCC unroll 10
        for (int k = 0; k < FMA_CHAINS; k++) a[k] = _mm256_fmadd_ps(a[k], m, c);
    __m256 s = a[0];
    for (int k = 1; k < FMA_CHAINS; k++) s = _mm256_add_ps(s, a[k]);
    j->sink[i & 255] = dfl_hsum8(s);
}

#else
#define fma_task fma_task_ref
#endif

double dfl_machine_fma_peak(dfl_pool *pool, double seconds) {
    if (!(seconds > 0)) seconds = 0.3;
    int nt = dfl_pool_size(pool), simd = dfl_cpu_has_avx2();
    dfl_task_fn fn = simd ? fma_task : fma_task_ref;
    double lanes = simd ? 8 : 1;
    /* size the loop from a short run, so each try lasts about `seconds` */
    fma_job j = {100000, {0}};
    double t = dfl_now();
    dfl_pool_run(pool, fn, &j, nt);
    t = dfl_now() - t;
    double per_iter = t > 0 ? t / j.iters : 1e-9;
    j.iters = (long)fmin(fmax(seconds / per_iter, 1e5), 1e10);
    double best = 0;
    for (int r = 0; r < 3; r++) {
        t = dfl_now();
        dfl_pool_run(pool, fn, &j, nt);
        t = dfl_now() - t;
        double f = (double)j.iters * FMA_CHAINS * lanes * 2 * nt / t;
        if (t > 0 && f > best) best = f;
    }
    return best / 1e9;
}
