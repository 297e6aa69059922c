/* bench_kernels.c - kernel speed against this machine's own limits, measured
 * in the same run: read bandwidth and FMA peak (src/kernels/machine.c), both
 * on the pool's threads. Prints GB/s for
 * one-row matmuls and GFLOP/s for 1..32 rows on Qwen3-0.6B (or 1.7B) shapes,
 * each with its ratio to the limit that bounds it.
 *
 *   bench_kernels [threads] [seconds per measurement] [f32|f16|bf16|attention|all] [0.6b|1.7b]
 *
 * DFLASH_ISA=generic|avx2|avx512|neon runs that kernel path (as dflash does), for A/Bs.
 *
 * A type (or a model) given: only those matmuls, no attention (quicker A/B
 * runs); "attention": attention alone, over f32 and f16 keys.
 */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/machine.h"
#include "kernels/vec.h"

static dfl_pool *pool;
static int nthreads;
static double min_time = 0.25;

/* ---- matmul ------------------------------------------------------------------ */

typedef struct {
    dfl_mat *W;     /* copies, cycled so small matrices are read from memory, not L3 */
    int ncopy;
    size_t bytes;   /* of one copy */
} mats;

static mats make_mats(dfl_type t, int rows, int cols) {
    mats m = {0};
    size_t rb = (size_t)cols * (t == DFL_F32 ? 4 : 2);
    m.bytes = rb * rows;
    m.ncopy = (int)((256u << 20) / m.bytes);
    if (m.ncopy < 1) m.ncopy = 1;
    m.W = xcalloc(m.ncopy, sizeof(dfl_mat));
    float *row = xmalloc(sizeof(float) * cols);
    for (int c = 0; c < m.ncopy; c++) {
        uint8_t *d = dfl_aligned_alloc(m.bytes);
        for (int o = 0; o < rows; o++) {
            for (int k = 0; k < cols; k++) row[k] = (float)((o * 31 + k * 17 + c) % 97) / 97.0f - 0.5f;
            dfl_quant_row(t, row, d + rb * o, cols);
        }
        m.W[c] = (dfl_mat){t, rows, cols, d, rb};
    }
    free(row);
    return m;
}

static void free_mats(mats *m) {
    for (int c = 0; c < m->ncopy; c++) free((void *)m->W[c].data);
    free(m->W);
}

/* Seconds per call, the best of batches of calls lasting min_time in all. */
static double time_matmul(mats *m, int n, const float *X, float *Y) {
    int calls = 0;
    double best = 1e9, start = dfl_now();
    while (dfl_now() - start < min_time || calls < 3) {
        double t = dfl_now();
        dfl_matmul(pool, &m->W[calls % m->ncopy], n, X, m->W[0].cols, Y, m->W[0].rows, NULL);
        t = dfl_now() - t;
        if (t < best) best = t;
        calls++;
    }
    return best;
}

/* ---- attention ------------------------------------------------------------------ */

static void bench_attention(void) {
    int nh = 16, nkv = 8, hd = 128, kvd = nkv * hd, ctxs[] = {1024, 8192, 32768}, ns[] = {1, 16, 32};
    size_t cap = 32768, m = cap * kvd, hs = cap * hd;
    float *K = dfl_aligned_alloc(sizeof(float) * m), *V = dfl_aligned_alloc(sizeof(float) * m);
    uint16_t *Kh = dfl_aligned_alloc(2 * m), *Vh = dfl_aligned_alloc(2 * m);
    float *q = dfl_aligned_alloc(sizeof(float) * 32 * nh * hd);
    float *out = dfl_aligned_alloc(sizeof(float) * 32 * nh * hd);
    for (size_t i = 0; i < m; i++) K[i] = V[i] = (float)(i % 13) * 0.01f;
    dfl_quant_row(DFL_F16, K, Kh, (int)m);
    dfl_quant_row(DFL_F16, V, Vh, (int)m);
    for (int i = 0; i < 32 * nh * hd; i++) q[i] = (float)(i % 7) * 0.1f;
    printf("\nattention (16 heads, 8 kv heads, hd 128; one run per kv head as the target's cache):"
           " ms per call, K/V read GB/s\n");
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 3; c++)
            for (int ni = 0; ni < 3; ni++) {
                int n = ns[ni], nk[32];
                dfl_kv_view kv = {t ? (void *)Kh : K, t ? (void *)Vh : V, t ? DFL_F16 : DFL_F32,
                                  hd, hs};
                double bw = dfl_machine_read_bw(pool, (size_t)128 << 20, 3);
                for (int r = 0; r < n; r++) nk[r] = ctxs[c] - n + 1 + r;
                double best = 1e9, start = dfl_now();
                int calls = 0;
                while (dfl_now() - start < min_time || calls < 3) {
                    double tm = dfl_now();
                    dfl_attention(pool, n, q, &kv, nk, nh, nkv, hd, 0.088f, out);
                    tm = dfl_now() - tm;
                    best = tm < best ? tm : best;
                    calls++;
                }
                double gb = 2.0 * ctxs[c] * kvd * (t ? 2 : 4) / best / 1e9;
                printf("  %s ctx %5d  n %2d  %8.3f ms  %6.1f GB/s (%.0f%% of read bw %.1f)\n",
                       t ? "f16" : "f32", ctxs[c], n, best * 1e3, gb, 100 * gb / bw, bw);
            }
    free(K), free(V), free(Kh), free(Vh), free(q), free(out);
}

int main(int argc, char **argv) {
    nthreads = argc > 1 ? atoi(argv[1]) : dfl_ncpu();
    if (argc > 2) min_time = atof(argv[2]);
    pool = dfl_pool_new(nthreads);
    const char *isa = getenv("DFLASH_ISA");
    if (isa && (dfl_isa_from_name(isa) < 0 || dfl_kernels_set_isa((dfl_isa)dfl_isa_from_name(isa)))) {
        fprintf(stderr, "bench_kernels: DFLASH_ISA=%s: not a path this CPU runs\n", isa);
        return 1;
    }
    const char *only = argc > 3 ? argv[3] : "all";
    int big = argc > 4 && !strcmp(argv[4], "1.7b");
    printf("threads %d, %s kernels\n", nthreads, dfl_isa_name(dfl_kernels_isa()));
    double bw = dfl_machine_read_bw(pool, 0, 5), peak = dfl_machine_fma_peak(pool, 0);
    printf("read bandwidth %.1f GB/s, FMA peak %.1f GFLOP/s\n\n", bw, peak);

    /* q/o projection, MLP up, MLP down, lm head: Qwen3-0.6B, then 1.7B */
    static const int shapes06[][2] = {{1024, 1024}, {3072, 1024}, {1024, 3072}, {151936, 1024}};
    static const int shapes17[][2] = {{2048, 2048}, {6144, 2048}, {2048, 6144}, {151936, 2048}};
    const int(*shapes)[2] = big ? shapes17 : shapes06;
    static const int ns[] = {1, 2, 4, 8, 16, 32};
    float *X = dfl_aligned_alloc(sizeof(float) * 32 * 6144);
    float *Y = dfl_aligned_alloc(sizeof(float) * 32 * 151936);
    for (int i = 0; i < 32 * 6144; i++) X[i] = (float)(i % 11) * 0.1f;
    /* Other work on the machine moves both limits; each row's ratios are taken
     * against the limits measured again just before it. */
    printf("matmul: n=1 GB/s (%% of read bw) | GFLOP/s for n rows (%% of FMA peak)\n");
    printf("%-5s %-12s %-12s %-16s", "type", "rows x cols", "bw / peak", "n=1 GB/s");
    for (int i = 0; i < 6; i++) printf(" %13s%-2d", "n=", ns[i]);
    printf("\n");
    for (int t = DFL_F32; t <= DFL_BF16; t++)
        for (int s = 0; s < 4; s++) {
            if (strcmp(only, "all") && strcmp(only, dfl_type_name((dfl_type)t))) continue;
            int rows = shapes[s][0], cols = shapes[s][1];
            mats m = make_mats((dfl_type)t, rows, cols);
            char shape[32];
            snprintf(shape, sizeof shape, "%dx%d", rows, cols);
            double rbw = dfl_machine_read_bw(pool, (size_t)128 << 20, 3);
            double rpeak = dfl_machine_fma_peak(pool, 0.05);
            printf("%-5s %-12s %4.1f / %-5.1f", dfl_type_name((dfl_type)t), shape, rbw, rpeak);
            for (int i = 0; i < 6; i++) {
                double sec = time_matmul(&m, ns[i], X, Y);
                double gf = 2.0 * rows * cols * ns[i] / sec / 1e9;
                if (i == 0) {
                    double gb = m.bytes / sec / 1e9;
                    printf(" %5.1f (%3.0f%%)    ", gb, 100 * gb / rbw);
                }
                printf(" %6.1f (%3.0f%%)", gf, 100 * gf / rpeak);
                fflush(stdout);
            }
            printf("\n");
            free_mats(&m);
        }
    free(X);
    free(Y);
    if (argc <= 3 || !strcmp(only, "attention")) bench_attention();
    dfl_pool_free(pool);
    return 0;
}
