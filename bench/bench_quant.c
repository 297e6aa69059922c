/* bench_quant.c - quantized (and float) matmul speed against this
 * machine's read bandwidth measured in the same run. For Q8_0 / Q4_0 / Q4_1 /
 * Q4_K / Q6_K weights (and F32 / F16 / BF16, when named) on
 * Qwen3-0.6B shapes (or 1.7B's: dim 2048, ffn 6144, where w_down's 8-row
 * activation tiles overflow L1; or Laguna-XS's: an expert's gate/up 512 x 2048
 * and down 2048 x 512, attention's q 6144 x 2048): ms per call for 1..32 rows,
 * GB/s of weights
 * at one row, GOP/s (2 * rows * cols * n / time), and the cost of n rows
 * relative to one. Weight copies are cycled (256 MiB in all) so they come
 * from memory, as in decode and verify, not from L3; at one row the same
 * product of one copy, hot in the caches, shows whether the kernel's
 * arithmetic or memory bounds decode.
 *
 *   bench_quant [threads] [seconds per measurement] [type|all] [0.6b|1.7b|lag] [ISA,ISA]
 *
 * With two kernel paths (e.g. avx2,avx512) it times both in this process, call
 * by call alternating, for 1/4/8/16 rows and prints the first's time over the
 * second's (the speedup of the second).
 */
#include <string.h>

#include "kernels/quant.h"
#if DFL_X86
#include <immintrin.h>
#endif

static dfl_pool *pool;
static int nthreads;
static double min_time = 0.3;

typedef struct {
    const uint8_t *buf;
    size_t n;
    long long sink[256];
} bw_job;

#if DFL_X86
__attribute__((target("avx2"))) static void bw_task(void *ctx, int i, int n) {
    bw_job *j = ctx;
    size_t per = j->n / n / 128 * 128;
    const uint8_t *p = j->buf + per * i;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t k = 0; k < per; k += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + k)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + k + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + k + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + k + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    long long e[4];
    memcpy(e, &s, sizeof e);
    j->sink[i] = e[0] + e[1] + e[2] + e[3];
}
#else
static void bw_task(void *ctx, int i, int n) { /* the compiler vectorizes it */
    bw_job *j = ctx;
    size_t per = j->n / n / 128 * 128;
    const long long *p = (const long long *)(j->buf + per * i);
    long long s = 0;
    for (size_t k = 0; k < per / 8; k++) s += p[k];
    j->sink[i] = s;
}
#endif

/* Read bandwidth timed the way the matmuls are: the best of many short reads
 * (1 MiB windows cycled through 512 MiB, so they come from memory), since on
 * a shared machine only short runs catch a quiet moment. */
static double read_bandwidth(void) {
    size_t total = (size_t)512 << 20, win = (size_t)1 << 20;
    uint8_t *buf = dfl_aligned_alloc(total);
    memset(buf, 1, total);
    for (size_t i = 0; i < total; i += 4096) buf[i] = (uint8_t)(i >> 12); /* distinct pages */
    double best = 1e9, start = dfl_now();
    for (int call = 0; dfl_now() - start < 3 * min_time || call < 64; call++) {
        bw_job j = {buf + (size_t)(call % (int)(total / win)) * win, win, {0}};
        double t = dfl_now();
        dfl_pool_run(pool, bw_task, &j, nthreads);
        t = dfl_now() - t;
        if (t < best) best = t;
    }
    free(buf);
    return win / best / 1e9;
}

typedef struct {
    dfl_mat *W;
    int ncopy;
    size_t bytes;
} mats;

static mats make_mats(dfl_type t, int rows, int cols, size_t total) {
    mats m = {0};
    size_t rb = dfl_type_row_bytes(t, cols);
    m.bytes = rb * rows;
    m.ncopy = (int)(total / m.bytes);
    if (m.ncopy < 1) m.ncopy = 1;
    m.W = xcalloc(m.ncopy, sizeof(dfl_mat));
    float *row = xmalloc(sizeof(float) * cols);
    uint8_t *first = NULL;
    for (int c = 0; c < m.ncopy; c++) {
        uint8_t *d = dfl_aligned_alloc(m.bytes);
        if (c == 0) {
            for (int o = 0; o < rows; o++) {
                for (int k = 0; k < cols; k++)
                    row[k] = (float)((o * 31 + k * 17) % 97) / 97.0f - 0.5f;
                dfl_quant_row(t, row, d + rb * o, cols);
            }
            first = d;
        } else { /* a copy, made distinct page by page (no page merging) */
            memcpy(d, first, m.bytes);
            for (size_t i = 100; i < m.bytes; i += 4096) d[i] ^= (uint8_t)c;
        }
        m.W[c] = (dfl_mat){t, rows, cols, d, rb};
        dfl_qmat_il8(&m.W[c]); /* the layout and side copies a loaded model's matrices get */
        dfl_mat_prepare(&m.W[c]);
    }
    free(row);
    return m;
}

static void free_mats(mats *m) {
    for (int c = 0; c < m->ncopy; c++) dfl_mat_release(&m->W[c]), free((void *)m->W[c].data);
    free(m->W);
}

static void nop_task(void *ctx, int i, int n) { (void)ctx, (void)i, (void)n; }

/* Seconds per dfl_pool_run of nthreads empty tasks: the fixed cost of a call. */
static double pool_overhead(void) {
    double best = 1e9;
    for (int rep = 0; rep < 2000; rep++) {
        double t = dfl_now();
        dfl_pool_run(pool, nop_task, NULL, nthreads);
        t = dfl_now() - t;
        if (t < best) best = t;
    }
    return best;
}

static double time_matmul(mats *m, int n, const float *X, float *Y, void *scratch) {
    int calls = 0;
    double best = 1e9, start = dfl_now();
    while (dfl_now() - start < min_time || calls < 5) {
        double t = dfl_now();
        dfl_matmul(pool, &m->W[calls % m->ncopy], n, X, m->W[0].cols, Y, m->W[0].rows, scratch);
        t = dfl_now() - t;
        if (t < best) best = t;
        calls++;
    }
    return best;
}

/* The A/B of two paths: per shape and n, the best time of each, measured in
 * alternating rounds so both see the same machine load. */
static void ab(dfl_type t, const int (*shapes)[2], const dfl_isa isa[2], const float *X, float *Y,
               void *scratch) {
    static const int ns[] = {1, 4, 8, 16};
    printf("\n%s  rows x cols : n: %s ms / %s ms = speedup\n", dfl_type_name(t),
           dfl_isa_name(isa[0]), dfl_isa_name(isa[1]));
    for (int s = 0; s < 3; s++) {
        mats m = make_mats(t, shapes[s][0], shapes[s][1], (size_t)256 << 20);
        printf("  %4dx%-4d", shapes[s][0], shapes[s][1]);
        for (int k = 0; k < 4; k++) {
            double best[2] = {1e9, 1e9};
            for (int round = 0; round < 3; round++)
                for (int i = 0; i < 2; i++) {
                    dfl_kernels_set_isa(isa[i]);
                    double tt = time_matmul(&m, ns[k], X, Y, scratch);
                    if (tt < best[i]) best[i] = tt;
                }
            printf(" | %d: %.3f/%.3f = %.2fx", ns[k], best[0] * 1e3, best[1] * 1e3,
                   best[0] / best[1]);
        }
        printf("\n");
        free_mats(&m);
    }
    dfl_kernels_set_isa(dfl_cpu_isa());
}

int main(int argc, char **argv) {
    nthreads = argc > 1 ? atoi(argv[1]) : 2;
    if (argc > 2) min_time = atof(argv[2]);
    int only = argc > 3 ? dfl_type_from_name(argv[3]) : -1;
    int big = argc > 4 && strcmp(argv[4], "1.7b") == 0;
    int lag = argc > 4 && strcmp(argv[4], "lag") == 0;
    dfl_isa isa[2];
    int n_isa = 0;
    if (argc > 5) {
        char list[64];
        snprintf(list, sizeof list, "%s", argv[5]);
        for (char *tok = strtok(list, ","); tok && n_isa < 2; tok = strtok(NULL, ",")) {
            int i = dfl_isa_from_name(tok);
            if (i < 0 || !dfl_cpu_has_isa((dfl_isa)i)) {
                fprintf(stderr, "bench_quant: kernel path '%s' unknown or not on this CPU\n", tok);
                return 2;
            }
            isa[n_isa++] = (dfl_isa)i;
        }
    }
    char feat[256];
    dfl_cpu_features(feat, sizeof feat);
    printf("cpu features: %s; kernels %s\n", feat, dfl_isa_name(dfl_kernels_isa()));
    pool = dfl_pool_new(nthreads);
    double bw = read_bandwidth();
    printf("threads %d, read bandwidth %.1f GB/s, pool_run overhead %.1f us\n", nthreads, bw,
           pool_overhead() * 1e6);
    static const int shapes06[][2] = {{1024, 1024}, {3072, 1024}, {1024, 3072}};
    static const int shapes17[][2] = {{2048, 2048}, {6144, 2048}, {2048, 6144}};
    static const int shapes_lag[][2] = {{512, 2048}, {2048, 512}, {6144, 2048}};
    const int(*shapes)[2] = big ? shapes17 : lag ? shapes_lag : shapes06;
    const int maxcols = big || lag ? 6144 : 3072; /* the largest dimension (X and Y) */
    static const int ns[] = {1, 2, 4, 8, 16, 32};
    /* the float types run only when named (they are matmul.c's, not quant.c's) */
    static const dfl_type types[] = {DFL_Q8_0, DFL_Q4_0, DFL_Q4_1, DFL_Q4_K, DFL_Q6_K,
                                     DFL_F32,  DFL_F16,  DFL_BF16};
    float *X = dfl_aligned_alloc(sizeof(float) * 32 * maxcols);
    float *Y = dfl_aligned_alloc(sizeof(float) * 32 * maxcols);
    for (int i = 0; i < 32 * maxcols; i++) X[i] = (float)(i % 23) * 0.1f - 1.1f;
    void *scratch = dfl_aligned_alloc(dfl_qmatmul_scratch(DFL_Q8_0, 32, maxcols) +
                                      dfl_qmatmul_scratch(DFL_Q4_K, 32, maxcols) +
                                      dfl_qmatmul_scratch(DFL_Q4_0, 32, maxcols));
    for (int ti = 0; ti < 8; ti++) {
        if (only >= 0 ? types[ti] != (dfl_type)only : types[ti] <= DFL_BF16) continue;
        if (n_isa == 2) {
            ab(types[ti], shapes, isa, X, Y, scratch);
            continue;
        }
        printf("\n%s    rows x cols : n=1 ms (GB/s, %% of bw; from cache) | n: ms (GOP/s, x n=1)\n",
               dfl_type_name(types[ti]));
        for (int s = 0; s < 3; s++) {
            mats m = make_mats(types[ti], shapes[s][0], shapes[s][1], (size_t)256 << 20);
            /* hot: one copy read over and over, from the caches: what the
             * kernel's arithmetic allows a row, with memory out of the way */
            mats h = m;
            h.ncopy = 1;
            double t1 = time_matmul(&m, 1, X, Y, scratch), th = time_matmul(&h, 1, X, Y, scratch);
            printf("  %4dx%-4d: %.3f ms (%.1f GB/s, %.0f%%; hot %.1f GB/s)", shapes[s][0],
                   shapes[s][1], t1 * 1e3, m.bytes / t1 / 1e9, 100 * m.bytes / t1 / 1e9 / bw,
                   m.bytes / th / 1e9);
            for (int k = 1; k < 6; k++) {
                double t = time_matmul(&m, ns[k], X, Y, scratch);
                double ops = 2.0 * shapes[s][0] * shapes[s][1] * ns[k];
                printf(" | %d: %.3f (%.0f, %.2fx)", ns[k], t * 1e3, ops / t / 1e9, t / t1);
            }
            printf("\n");
            free_mats(&m);
        }
    }
    free(X), free(Y), free(scratch);
    dfl_pool_free(pool);
    return 0;
}
