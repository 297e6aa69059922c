/* test_kernels.c - every kernel against its plain-C twin (bitwise: they are
 * written to the same evaluation order), against an independent double
 * precision formula (tolerance), and for batch / thread invariance (bitwise). */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "kernels/vec.h"
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float rndf(void) { return (float)(rnd32() & 0xffffff) / 8388608.0f - 1.0f; } /* [-1, 1) */
static float f32_of(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static uint32_t bits_of(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

static dfl_pool *pools[4];   /* [t]: t threads (1..3) */

/* ---- conversions ------------------------------------------------------------ */

/* The value of half h, from its definition. */
static double half_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Nearest half to x (finite), ties to even mantissa, 65520 and up to inf:
 * a search over the ordered halves, independent of the bit tricks. */
static uint16_t ref_f32_to_f16(float x) {
    double a = fabs((double)x);
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    int lo = 0, hi = 0x7c00;   /* value(0x7c00) taken as 65536 for rounding */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (half_value((uint16_t)mid) <= a) lo = mid; else hi = mid;
    }
    double vlo = half_value((uint16_t)lo), vhi = hi == 0x7c00 ? 65536.0 : half_value((uint16_t)hi);
    if (a == vlo) return sign | (uint16_t)lo;
    double dl = a - vlo, dh = vhi - a;
    int pick = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    return sign | (uint16_t)pick;
}

/* Nearest bf16 to x (finite), ties to even, from the two candidates by value. */
static uint16_t ref_f32_to_bf16(float x) {
    uint32_t b = bits_of(x);
    uint16_t lo = (uint16_t)(b >> 16), hi = (uint16_t)(lo + 1);
    double vlo = fabs((double)f32_of((uint32_t)lo << 16));
    double vhi = (hi & 0x7fff) == 0x7f80 ? ldexp(1.0, 128) : fabs((double)f32_of((uint32_t)hi << 16));
    double a = fabs((double)x), dl = a - vlo, dh = vhi - a;
    return dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
}

/* The CPU's own f16 conversions, where it has them: F16C on x86, FCVT on aarch64. */
#if DFL_X86
static int has_hw_f16(void) { return dfl_cpu_has_avx2(); }
DFL_AVX2 static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
DFL_AVX2 static uint16_t hw_f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#elif defined(__aarch64__)
static int has_hw_f16(void) { return 1; }
static float hw_f16_to_f32(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, 2);
    return f;
}
static uint16_t hw_f32_to_f16(float x) {
    __fp16 f = (__fp16)x;
    uint16_t h;
    memcpy(&h, &f, 2);
    return h;
}
#else
static int has_hw_f16(void) { return 0; }
static float hw_f16_to_f32(uint16_t h) { return 0; }
static uint16_t hw_f32_to_f16(float f) { return 0; }
#endif

static void test_f16(void) {
    int bad = 0, bad_hw = 0, bad_rt = 0;
    for (int h = 0; h < 65536; h++) {
        float f = dfl_f16_to_f32((uint16_t)h);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        int inf = (h & 0x7fff) == 0x7c00;
        if (nan) bad += !isnan(f);
        else if (inf) bad += !isinf(f) || !!signbit(f) != !!(h & 0x8000);
        else bad += (double)f != half_value((uint16_t)h) || !!signbit(f) != !!(h & 0x8000);
        if (has_hw_f16()) bad_hw += bits_of(f) != bits_of(hw_f16_to_f32((uint16_t)h));
        uint16_t back = dfl_f32_to_f16(f);
        bad_rt += nan ? !((back & 0x7c00) == 0x7c00 && (back & 0x3ff)) : back != h;
    }
    CHECK(bad == 0, "%d halves decode wrong", bad);
    CHECK(bad_hw == 0, "%d halves differ from the CPU's conversion", bad_hw);
    CHECK(bad_rt == 0, "%d halves do not round-trip", bad_rt);

    /* Random floats over the whole exponent range, and every tie between
     * neighbouring halves (the midpoints are exact floats). */
    bad = bad_hw = 0;
    for (int i = 0; i < 400000; i++) {
        float x = f32_of((rnd32() & 0x7fffffff) | (uint32_t)(i & 1) << 31);
        if (i % 3 == 0) x = f32_of((rnd32() % (0x47900000 - 0x33000000)) + 0x33000000);
        if (isnan(x)) continue;
        uint16_t h = dfl_f32_to_f16(x);
        bad += isinf(x) ? h != (signbit(x) ? 0xfc00 : 0x7c00) : h != ref_f32_to_f16(x);
        if (has_hw_f16()) bad_hw += h != hw_f32_to_f16(x);
    }
    for (int h = 0; h < 0x7bff; h++) {
        float mid = (float)((half_value((uint16_t)h) + half_value((uint16_t)(h + 1))) / 2);
        uint16_t want = (h & 1) ? h + 1 : h;
        bad += dfl_f32_to_f16(mid) != want || dfl_f32_to_f16(-mid) != (want | 0x8000);
    }
    CHECK(bad == 0, "%d floats round to the wrong half", bad);
    CHECK(bad_hw == 0, "%d floats differ from the CPU's conversion", bad_hw);
    CHECK(dfl_f32_to_f16(65519.99f) == 0x7bff && dfl_f32_to_f16(65520.0f) == 0x7c00,
          "overflow threshold");
    CHECK(dfl_f32_to_f16(0x1p-25f) == 0 && dfl_f32_to_f16(0x1.000002p-25f) == 1,
          "smallest subnormal: ties to even, just above rounds up");
    CHECK(dfl_f32_to_f16(-0.0f) == 0x8000, "negative zero");
    uint16_t qn = dfl_f32_to_f16(f32_of(0x7f800001));
    CHECK((qn & 0x7c00) == 0x7c00 && (qn & 0x3ff), "signalling NaN stays NaN: %04x", qn);
}

static void test_bf16(void) {
    int bad = 0;
    for (int i = 0; i < 1000000; i++) {
        float x = f32_of(rnd32() ^ (rnd32() << 16));
        if (i & 1) x = f32_of((bits_of(x) & 0xffff0000) | 0x8000);   /* exact ties */
        if (isnan(x) || isinf(x)) continue;
        bad += dfl_f32_to_bf16(x) != ref_f32_to_bf16(x);
        bad += bits_of(dfl_bf16_to_f32(dfl_f32_to_bf16(x))) >> 16 != dfl_f32_to_bf16(x);
    }
    CHECK(bad == 0, "%d floats round to the wrong bf16", bad);
    CHECK(dfl_f32_to_bf16(f32_of(0x3f808000)) == 0x3f80, "tie to even (down)");
    CHECK(dfl_f32_to_bf16(f32_of(0x3f818000)) == 0x3f82, "tie to even (up)");
    CHECK(dfl_f32_to_bf16(INFINITY) == 0x7f80 && dfl_f32_to_bf16(-INFINITY) == 0xff80, "inf");
    CHECK(dfl_f32_to_bf16(f32_of(0x7f7fffff)) == 0x7f80, "FLT_MAX rounds to inf");
    uint16_t n1 = dfl_f32_to_bf16(f32_of(0x7f800001)), n2 = dfl_f32_to_bf16(f32_of(0xffffffff));
    CHECK((n1 & 0x7f80) == 0x7f80 && (n1 & 0x7f), "sNaN with a low payload stays NaN: %04x", n1);
    CHECK((n2 & 0x7f80) == 0x7f80 && (n2 & 0x7f), "NaN stays NaN: %04x", n2);
    CHECK(isnan(dfl_bf16_to_f32(0x7fc0)) && isinf(dfl_bf16_to_f32(0xff80)), "decode specials");
    CHECK(dfl_bf16_to_f32(0x0001) == 0x1p-133f, "bf16 subnormal decodes exactly");
}

/* The row converters' AVX2 paths against the scalar forms, specials included. */
static void test_rows(void) {
    enum { N = 77 };
    float src[N], a[N], b[N];
    uint16_t ha[2 * N], hb[2 * N];   /* room for f32 too */
    for (int i = 0; i < N; i++) src[i] = rndf() * 1000.0f;
    src[3] = NAN; src[4] = INFINITY; src[5] = -0.0f; src[6] = 1e-6f; src[7] = f32_of(0x7f800001);
    src[8] = 70000.0f; src[9] = f32_of(0x3f808000);
    for (int t = DFL_F32; t <= DFL_BF16; t++) {
        dfl_kernels_force_ref(1);
        CHECK(dfl_quant_row((dfl_type)t, src, ha, N) == 0, "quant_row");
        dfl_dequant_row((dfl_type)t, ha, a, N);
        dfl_kernels_force_ref(0);
        CHECK(dfl_quant_row((dfl_type)t, src, hb, N) == 0, "quant_row");
        dfl_dequant_row((dfl_type)t, hb, b, N);
        size_t bytes = t == DFL_F32 ? 4 * N : 2 * N;
        CHECK(t == DFL_F32 || memcmp(ha, hb, bytes) == 0, "type %d: AVX2 encode != scalar", t);
        CHECK(memcmp(a, b, sizeof a) == 0, "type %d: AVX2 decode != scalar", t);
    }
}

/* ---- exp -------------------------------------------------------------------- */

static double ulp_err(float got, double want) {
    if (want == 0) return got == 0 ? 0 : 1e9;
    int e;
    frexp(want, &e);
    return fabs(got - want) / ldexp(1.0, e - 24);
}

/* y = the AVX2 exp of 8 lanes; 0 (y untouched) where there is none. */
#if DFL_X86
DFL_AVX2 static void exp8_avx2(const float *x, float *y) { _mm256_storeu_ps(y, dfl_expf8(_mm256_loadu_ps(x))); }
static int exp8(const float *x, float *y) { return dfl_cpu_has_avx2() ? exp8_avx2(x, y), 1 : 0; }
#else
static int exp8(const float *x, float *y) { return 0; }
#endif

static void test_exp(void) {
    double worst = 0;
    int mism = 0;
    for (int i = 0; i < 200000; i++) {
        float x[8], y[8];
        for (int l = 0; l < 8; l++) x[l] = -87.3f + (rnd32() % 1756700) * 1e-4f;
        if (i == 0) {
            float sp[8] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 88.4f, -87.4f, 88.37f};
            memcpy(x, sp, sizeof sp);
        }
        int simd = exp8(x, y);
        for (int l = 0; l < 8; l++) {
            float r = dfl_expf_ref(x[l]);
            if (simd) mism += bits_of(r) != bits_of(y[l]);
            if (i == 0) continue;
            double e = ulp_err(r, exp((double)x[l]));
            if (e > worst) worst = e;
        }
    }
    CHECK(mism == 0, "%d AVX2 exp lanes differ from the twin", mism);
    CHECK(worst <= 2.0, "exp error %.2f ulp", worst);
    printf("exp: worst error %.2f ulp over [-87.3, 88.37]\n", worst);
    CHECK(isnan(dfl_expf_ref(NAN)) && dfl_expf_ref(-INFINITY) == 0 && dfl_expf_ref(-100) == 0 &&
              isinf(dfl_expf_ref(89)) && dfl_expf_ref(0) == 1.0f, "exp specials");
}

/* ---- matmul ----------------------------------------------------------------- */

typedef struct {
    dfl_mat W;
    float *wf;      /* [rows, cols] the weights' exact values */
    float *X;       /* [nmax, ldx] */
    int ldx, nmax;
} mm_case;

static mm_case mm_make(dfl_type t, int rows, int cols, int nmax) {
    mm_case c = {0};
    c.W.type = t;
    c.W.rows = rows;
    c.W.cols = cols;
    c.W.row_bytes = (size_t)cols * (t == DFL_F32 ? 4 : 2);
    uint8_t *data = dfl_aligned_alloc(c.W.row_bytes * rows + 64);
    c.wf = xmalloc(sizeof(float) * rows * cols);
    float *tmp = xmalloc(sizeof(float) * cols);
    for (int o = 0; o < rows; o++) {
        for (int k = 0; k < cols; k++) tmp[k] = rndf() * (1 + (k % 5));
        dfl_quant_row(t, tmp, data + c.W.row_bytes * o, cols);
        dfl_dequant_row(t, data + c.W.row_bytes * o, c.wf + (size_t)o * cols, cols);
    }
    free(tmp);
    c.W.data = data;
    c.ldx = cols + 3;
    c.nmax = nmax;
    c.X = xmalloc(sizeof(float) * nmax * c.ldx);
    for (int i = 0; i < nmax * c.ldx; i++) c.X[i] = rndf();
    return c;
}

static void mm_free(mm_case *c) {
    free((void *)c->W.data);
    free(c->wf);
    free(c->X);
}

/* Y with ldy = rows + 2; the two padding columns must stay untouched. */
static float *mm_run(mm_case *c, dfl_pool *p, int n, int row0, int ref) {
    int ldy = c->W.rows + 2;
    float *Y = xmalloc(sizeof(float) * n * ldy);
    for (int i = 0; i < n * ldy; i++) Y[i] = 12345.0f;
    const float *X = c->X + (size_t)row0 * c->ldx;
    if (ref)
        dfl_matmul_ref(&c->W, n, X, c->ldx, Y, ldy);
    else
        dfl_matmul(p, &c->W, n, X, c->ldx, Y, ldy, NULL);
    for (int r = 0; r < n; r++)
        if (Y[(size_t)r * ldy + c->W.rows] != 12345.0f || Y[(size_t)r * ldy + c->W.rows + 1] != 12345.0f) {
            CHECK(0, "matmul wrote past its rows (row %d)", r);
            break;
        }
    return Y;
}

static int rows_equal(const float *A, const float *B, int n, int rows, int lda, int ldb) {
    for (int r = 0; r < n; r++)
        if (memcmp(A + (size_t)r * lda, B + (size_t)r * ldb, sizeof(float) * rows)) return 0;
    return 1;
}

/* The AVX2 path against the twin's rows ref (N of them) for 1..3 threads,
 * and batch invariance: rows [r0, r0+n) computed together give the rows of
 * the full batch, for every n and (when full) every start. */
static void vs_twin(mm_case *c, const float *ref, int N, int full, const char *what) {
    int rows = c->W.rows, ldy = rows + 2, t = c->W.type, cols = c->W.cols;
    for (int th = 1; th <= 3; th++) {
        float *Y = mm_run(c, pools[th], N, 0, 0);
        CHECK(rows_equal(Y, ref, N, rows, ldy, ldy), "type %d %dx%d%s threads %d: != twin", t,
              rows, cols, what, th);
        free(Y);
    }
    int fails = 0;
    for (int n = 1; n <= 32; n++)
        for (int r0 = 0; r0 + n <= N; r0 += full ? 1 : n) {
            float *Y = mm_run(c, pools[2], n, r0, 0);
            fails += !rows_equal(Y, ref + (size_t)r0 * ldy, n, rows, ldy, ldy);
            free(Y);
        }
    CHECK(fails == 0, "type %d %dx%d%s: %d batches differ from the full batch", t, rows, cols,
          what, fails);
}

static void test_matmul_case(dfl_type t, int rows, int cols, int full) {
    int N = 33;
    mm_case c = mm_make(t, rows, cols, N);
    int ldy = rows + 2;
    float *ref = mm_run(&c, NULL, N, 0, 1);

    /* Against double precision: within the worst-case bound of the order. */
    double worst = 0;
    for (int r = 0; r < N; r++)
        for (int o = 0; o < rows; o++) {
            double s = 0, sa = 0;
            for (int k = 0; k < cols; k++) {
                double p = (double)c.wf[(size_t)o * cols + k] * c.X[(size_t)r * c.ldx + k];
                s += p;
                sa += fabs(p);
            }
            double bound = (cols / 8 + cols % 8 + 4) * 0x1p-24 * sa + 1e-30;
            double e = fabs(ref[(size_t)r * ldy + o] - s) / bound;
            if (e > worst) worst = e;
        }
    CHECK(worst <= 1.0, "type %d %dx%d: error %.3g of the bound", t, rows, cols, worst);

    vs_twin(&c, ref, N, full, "");
    /* A small matrix's transposed copy (8 outputs per vector): the same bits,
     * alone or in any batch. */
    if (dfl_mat_prepare(&c.W)) {
        vs_twin(&c, ref, N, full, " transposed");
        dfl_mat_release(&c.W);
    } else {
        CHECK(cols > 192 || (size_t)(rows + 23) / 24 * 24 * cols * 4 > (256 << 10) || rows * cols == 0,
              "type %d %dx%d: small float matrix not transposed", t, rows, cols);
    }
    /* The twin forced through dfl_matmul (the pool runs twin chunks). */
    dfl_kernels_force_ref(1);
    float *Y = mm_run(&c, pools[3], N, 0, 0);
    dfl_kernels_force_ref(0);
    CHECK(rows_equal(Y, ref, N, rows, ldy, ldy), "forced twin != twin");
    free(Y);
    free(ref);
    mm_free(&c);
}

static void test_matmul(void) {
    static const int shapes[][2] = {{4, 0}, {1, 1}, {3, 7}, {5, 8}, {13, 37}, {50, 64}, {97, 130},
                                    {101, 1029}, {145, 2056}, {48, 2048 + 24},
                                    /* stories260K's shapes (cache-resident f32) */
                                    {32, 64}, {172, 64}, {64, 172}, {512, 64}};
    for (int t = DFL_F32; t <= DFL_BF16; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_matmul_case((dfl_type)t, shapes[s][0], shapes[s][1], shapes[s][1] < 200);
    CHECK(dfl_matmul_scratch(DFL_BF16, 32, 4096) == 0, "float types need no scratch");
}

/* ---- small ops ---------------------------------------------------------------- */

static void test_rmsnorm(void) {
    for (int n = 1; n < 300; n += 37) {
        float x[300], w[300], a[300], b[300];
        for (int i = 0; i < n; i++) x[i] = rndf() * 3, w[i] = 1 + rndf();
        dfl_kernels_force_ref(1);
        dfl_rmsnorm(a, x, w, n, 1e-6f);
        dfl_kernels_force_ref(0);
        dfl_rmsnorm(b, x, w, n, 1e-6f);
        CHECK(memcmp(a, b, sizeof(float) * n) == 0, "rmsnorm n=%d: AVX2 != twin", n);
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double s = 1 / sqrt(ss / n + 1e-6), worst = 0;
        for (int i = 0; i < n; i++) {
            double e = fabs(a[i] - x[i] * s * w[i]) / (fabs(x[i] * s * w[i]) + 1e-30);
            if (e > worst) worst = e;
        }
        CHECK(worst < 1e-6, "rmsnorm n=%d: relative error %g", n, worst);
        memcpy(a, x, sizeof x);
        dfl_rmsnorm(a, a, w, n, 1e-6f);   /* in place */
        CHECK(memcmp(a, b, sizeof(float) * n) == 0, "rmsnorm in place");
    }
}

static void test_rope(void) {
    enum { HD = 64, NH = 3 };
    float inv[HD / 2];
    for (int i = 0; i < HD / 2; i++) inv[i] = (float)pow(1e6, -2.0 * i / HD);
    for (int neox = 0; neox <= 1; neox++) {
        dfl_rope r = {.head_dim = HD, .neox = neox, .inv_freq = inv, .mscale = neox ? 1.0f : 1.25f};
        int poss[] = {0, 1, 7, 1000, 32767};
        for (int pi = 0; pi < 5; pi++) {
            int pos = poss[pi];
            float x[NH * HD], y[NH * HD];
            for (int i = 0; i < NH * HD; i++) x[i] = rndf();
            memcpy(y, x, sizeof x);
            dfl_rope_apply(&r, y, NH, pos);
            double worst = 0;
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < HD / 2; i++) {
                    int a = neox ? i : 2 * i, b = neox ? i + HD / 2 : 2 * i + 1;
                    double th = (double)((float)pos * inv[i]);   /* the f32 angle */
                    double c = cos(th) * r.mscale, s = sin(th) * r.mscale;
                    const float *p = x + h * HD;
                    double ya = p[a] * c - p[b] * s, yb = p[b] * c + p[a] * s;
                    worst = fmax(worst, fmax(fabs(y[h * HD + a] - ya), fabs(y[h * HD + b] - yb)));
                }
            CHECK(worst < 1e-6, "rope neox=%d pos=%d: error %g", neox, pos, worst);
            /* A head gives the same bits rotated alone. */
            float one[HD];
            memcpy(one, x + HD, sizeof one);
            dfl_rope_apply(&r, one, 1, pos);
            CHECK(memcmp(one, y + HD, sizeof one) == 0, "rope: head 1 alone differs");
            /* cos/sin computed once, then applied: the same bits. */
            float cs[HD], z[NH * HD];
            memcpy(z, x, sizeof z);
            dfl_rope_cs(&r, pos, cs);
            dfl_rope_apply_cs(&r, z, NH, cs);
            CHECK(memcmp(z, y, sizeof z) == 0, "rope neox=%d pos=%d: apply_cs differs", neox, pos);
        }
        /* Layout: a vector with only pair 1 set moves only within that pair. */
        float v[HD] = {0};
        int a = neox ? 1 : 2, b = neox ? 1 + HD / 2 : 3;
        v[a] = 1.0f;
        dfl_rope_apply(&r, v, 1, 5);
        int others = 0;
        for (int i = 0; i < HD; i++) others += i != a && i != b && v[i] != 0;
        CHECK(others == 0 && v[b] != 0, "rope neox=%d rotates the wrong pairs", neox);
    }
}

static void test_swiglu(void) {
    enum { N = 203 };
    float g[N], u[N], a[N], b[N];
    for (int i = 0; i < N; i++) g[i] = rndf() * 20, u[i] = rndf() * 2;
    g[0] = -100; g[1] = 100; g[2] = 0; g[3] = -88.5f; g[4] = 1e-20f;
    g[N - 1] = -100; g[N - 2] = 100; g[N - 3] = -88.5f;   /* in the masked tail too */
    dfl_kernels_force_ref(1);
    dfl_swiglu(a, g, u, N);
    dfl_kernels_force_ref(0);
    dfl_swiglu(b, g, u, N);
    CHECK(memcmp(a, b, sizeof a) == 0, "swiglu: AVX2 != twin");
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double want = g[i] / (1 + exp(-(double)g[i])) * u[i];
        worst = fmax(worst, fabs(a[i] - want) / (fabs(want) + 1e-30));
    }
    CHECK(worst < 1e-6, "swiglu relative error %g", worst);
}

static void test_argmax(void) {
    float x[1000];
    for (int n = 1; n <= 1000; n = n * 3 + 1) {
        for (int i = 0; i < n; i++) x[i] = (float)(rnd32() % 50);
        int want = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[want]) want = i;
        dfl_kernels_force_ref(1);
        int a = dfl_argmax(x, n);
        dfl_kernels_force_ref(0);
        int b = dfl_argmax(x, n);
        CHECK(a == want && b == want, "argmax n=%d: %d %d want %d (first of ties)", n, a, b, want);
    }
    float y[20];
    for (int i = 0; i < 20; i++) y[i] = -INFINITY;
    y[0] = NAN; y[13] = 2; y[17] = 2; y[5] = NAN;
    for (int f = 0; f <= 1; f++) {
        dfl_kernels_force_ref(f);
        CHECK(dfl_argmax(y, 20) == 13, "argmax skips NaN (force_ref %d)", f);
        CHECK(dfl_argmax(y, 1) == 0, "all NaN gives 0");
        CHECK(dfl_argmax(y + 1, 4) == 0, "all -inf gives the first");
    }
    dfl_kernels_force_ref(0);
}

/* ---- attention ----------------------------------------------------------------- */

typedef struct {
    int n, nh, nkv, hd, ldk, ctx;
    float *q, *K, *V, scale;
    int *nk;
} att_case;

static att_case att_make(int n, int nh, int nkv, int hd, int ctx) {
    att_case a = {n, nh, nkv, hd, nkv * hd + 5, ctx};
    a.q = xmalloc(sizeof(float) * n * nh * hd);
    a.K = xmalloc(sizeof(float) * ctx * a.ldk);
    a.V = xmalloc(sizeof(float) * ctx * a.ldk);
    a.nk = xmalloc(sizeof(int) * n);
    a.scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < n * nh * hd; i++) a.q[i] = rndf() * 2;
    for (int i = 0; i < ctx * a.ldk; i++) a.K[i] = rndf() * 2, a.V[i] = rndf();
    for (int r = 0; r < n; r++) a.nk[r] = ctx - n + 1 + r;   /* causal block at the end */
    return a;
}

static void att_free(att_case *a) { free(a->q); free(a->K); free(a->V); free(a->nk); }

/* Rows [r0, r0 + n) over kv (the case's own f32 keys when NULL), with the
 * twin (ref) or the AVX2 kernels on pool p. */
static float *att_run_kv(const att_case *a, const dfl_kv_view *kv, dfl_pool *p, int n, int r0,
                         int ref) {
    int qd = a->nh * a->hd;
    float *out = xmalloc(sizeof(float) * n * qd);
    for (int i = 0; i < n * qd; i++) out[i] = NAN;   /* must be fully overwritten */
    const float *q = a->q + (size_t)r0 * qd;
    dfl_kv_view own = {a->K, a->V, DFL_F32, a->ldk, (size_t)a->hd};
    if (!kv) kv = &own;
    if (ref)
        dfl_attention_ref(n, q, kv, a->nk + r0, a->nh, a->nkv, a->hd, a->scale, out);
    else
        dfl_attention(p, n, q, kv, a->nk + r0, a->nh, a->nkv, a->hd, a->scale, out);
    return out;
}

static float *att_run(const att_case *a, dfl_pool *p, int n, int r0, int ref) {
    return att_run_kv(a, NULL, p, n, r0, ref);
}

/* f16 keys and values (the target cache's type): the twin and the AVX2
 * kernels, on 1..3 threads, in every sub-batch, interleaved or one run per
 * head, must give the bits of the f32 twin over the same rounded values. */
static void att_check_f16(const att_case *a) {
    size_t m = (size_t)a->ctx * a->ldk, hs = (size_t)a->ctx * a->hd, qd = (size_t)a->nh * a->hd;
    uint16_t *Kh = xmalloc(2 * m), *Vh = xmalloc(2 * m);
    uint16_t *Kc = xmalloc(2 * hs * a->nkv), *Vc = xmalloc(2 * hs * a->nkv);
    float *Kr = xmalloc(4 * m), *Vr = xmalloc(4 * m);
    for (size_t i = 0; i < m; i++) {
        Kh[i] = dfl_f32_to_f16(a->K[i]), Vh[i] = dfl_f32_to_f16(a->V[i]);
        Kr[i] = dfl_f16_to_f32(Kh[i]), Vr[i] = dfl_f16_to_f32(Vh[i]);
    }
    for (int h = 0; h < a->nkv; h++)
        for (int j = 0; j < a->ctx; j++)
            for (int d = 0; d < a->hd; d++) {
                Kc[h * hs + (size_t)j * a->hd + d] = Kh[(size_t)j * a->ldk + h * a->hd + d];
                Vc[h * hs + (size_t)j * a->hd + d] = Vh[(size_t)j * a->ldk + h * a->hd + d];
            }
    dfl_kv_view rounded = {Kr, Vr, DFL_F32, a->ldk, (size_t)a->hd};
    dfl_kv_view half = {Kh, Vh, DFL_F16, a->ldk, (size_t)a->hd};
    dfl_kv_view runs = {Kc, Vc, DFL_F16, a->hd, hs};
    size_t bytes = sizeof(float) * a->n * qd;
    float *want = att_run_kv(a, &rounded, NULL, a->n, 0, 1);
    float *o = att_run_kv(a, &half, NULL, a->n, 0, 1);
    CHECK(!memcmp(o, want, bytes), "attention f16 n=%d hd=%d: twin != f32 twin", a->n, a->hd);
    free(o);
    int fails = 0;
    for (int th = 1; th <= 3; th++) {
        o = att_run_kv(a, th == 3 ? &runs : &half, pools[th], a->n, 0, 0);
        fails += memcmp(o, want, bytes) != 0;
        free(o);
    }
    for (int n = 1; n < a->n; n++)
        for (int r0 = 0; r0 + n <= a->n; r0 += n) {
            o = att_run_kv(a, (r0 / n) % 2 ? &runs : &half, pools[2], n, r0, 0);
            fails += memcmp(o, want + (size_t)r0 * qd, sizeof(float) * n * qd) != 0;
            free(o);
        }
    CHECK(fails == 0, "attention f16 n=%d hd=%d ctx=%d: %d runs differ from the twin", a->n,
          a->hd, a->ctx, fails);
    free(want), free(Kh), free(Vh), free(Kc), free(Vc), free(Kr), free(Vr);
}

/* The same keys with each kv head's rows in one contiguous run (the target's
 * cache layout): twin and AVX2 must give the interleaved twin's bits. */
static void att_check_contiguous(const att_case *a, dfl_pool *p, const float *ref) {
    size_t hs = (size_t)a->ctx * a->hd, qd = (size_t)a->nh * a->hd;
    float *K = xmalloc(sizeof(float) * hs * a->nkv), *V = xmalloc(sizeof(float) * hs * a->nkv);
    for (int h = 0; h < a->nkv; h++)
        for (int j = 0; j < a->ctx; j++)
            for (int d = 0; d < a->hd; d++) {
                K[h * hs + (size_t)j * a->hd + d] = a->K[(size_t)j * a->ldk + h * a->hd + d];
                V[h * hs + (size_t)j * a->hd + d] = a->V[(size_t)j * a->ldk + h * a->hd + d];
            }
    float *o1 = xmalloc(sizeof(float) * a->n * qd), *o2 = xmalloc(sizeof(float) * a->n * qd);
    dfl_kv_view kv = {K, V, DFL_F32, a->hd, hs};
    dfl_attention_ref(a->n, a->q, &kv, a->nk, a->nh, a->nkv, a->hd, a->scale, o1);
    dfl_attention(p, a->n, a->q, &kv, a->nk, a->nh, a->nkv, a->hd, a->scale, o2);
    size_t bytes = sizeof(float) * a->n * qd;
    CHECK(!memcmp(o1, ref, bytes) && !memcmp(o2, ref, bytes),
          "attention n=%d hd=%d: per-head contiguous keys differ", a->n, a->hd);
    free(K), free(V), free(o1), free(o2);
}

static void test_attention_case(int n, int nh, int nkv, int hd, int ctx) {
    att_case a = att_make(n, nh, nkv, hd, ctx);
    int qd = nh * hd;
    float *ref = att_run(&a, NULL, n, 0, 1);
    att_check_contiguous(&a, pools[2], ref);
    att_check_f16(&a);
    /* Naive softmax in double. */
    double worst = 0;
    double *s = xmalloc(sizeof(double) * ctx);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            const float *q = a.q + (size_t)r * qd + h * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < a.nk[r]; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[i] * a.K[(size_t)j * a.ldk + kh * hd + i];
                s[j] = d * a.scale;
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < a.nk[r]; j++) sum += (s[j] = exp(s[j] - mx));
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < a.nk[r]; j++) o += s[j] * a.V[(size_t)j * a.ldk + kh * hd + i];
                worst = fmax(worst, fabs(ref[(size_t)r * qd + h * hd + i] - o / sum));
            }
        }
    free(s);
    CHECK(worst < 2e-6, "attention n=%d hd=%d ctx=%d: error %g vs double", n, hd, ctx, worst);
    for (int th = 1; th <= 3; th++) {
        float *o = att_run(&a, pools[th], n, 0, 0);
        CHECK(memcmp(o, ref, sizeof(float) * n * qd) == 0,
              "attention n=%d hd=%d ctx=%d threads %d: != twin", n, hd, ctx, th);
        free(o);
    }
    int fails = 0;
    for (int m = 1; m <= n; m++)
        for (int r0 = 0; r0 + m <= n; r0 += m) {
            float *o = att_run(&a, pools[2], m, r0, 0);
            fails += memcmp(o, ref + (size_t)r0 * qd, sizeof(float) * m * qd) != 0;
            free(o);
        }
    CHECK(fails == 0, "attention n=%d hd=%d: %d sub-batches differ", n, hd, fails);
    free(ref);
    att_free(&a);
}

static void test_attention(void) {
    test_attention_case(1, 1, 1, 8, 1);
    test_attention_case(5, 4, 2, 20, 70);
    test_attention_case(17, 4, 1, 64, 200);
    test_attention_case(9, 16, 8, 128, 300);
    test_attention_case(3, 6, 2, 7, 129);
    test_attention_case(2, 2, 2, 128, 5000);
    test_attention_case(9, 4, 2, 264, 70);   /* too large to pack: units one by one */
    test_attention_case(5, 16, 2, 128, 150); /* GQA 8: 3-unit groups and a 2-unit tail */
    /* Heads of 16k dims (the AVX-512 forms): 64-dim value tiles and a
     * 16-dim tail, tile tails of 1..3 units, the largest packed head. */
    test_attention_case(16, 8, 2, 80, 190);
    test_attention_case(7, 12, 4, 96, 65);
    test_attention_case(32, 4, 4, 256, 100);
    /* Small heads (8..32 dims): the transposed-key scores, GQA, 1..32 rows,
     * blocks that end inside a group of 8 keys, and a wide row stride (V
     * packed). */
    test_attention_case(8, 8, 4, 8, 77);
    test_attention_case(32, 8, 4, 8, 130);
    test_attention_case(13, 4, 2, 16, 64);
    test_attention_case(9, 6, 3, 24, 100);
    test_attention_case(20, 4, 1, 32, 141);
    test_attention_case(6, 32, 32, 8, 9);
    test_attention_case(3, 8, 2, 16, 3);
    /* No keys: zeros. */
    att_case a = att_make(2, 2, 1, 16, 4);
    a.nk[0] = 0;
    float *o = att_run(&a, pools[2], 2, 0, 0);
    int nz = 0;
    for (int i = 0; i < 2 * 16; i++) nz += o[i] != 0;
    CHECK(nz == 0, "a row with no keys gives zeros");
    free(o);
    att_free(&a);
}

/* Sink logits (one per query head) join each softmax denominator: the AVX2
 * kernels against a double softmax with the sink column, and each row alone
 * bit for bit as in the whole block. */
static void test_attention_sinks_case(int n, int nh, int nkv, int hd, int ctx) {
    att_case a = att_make(n, nh, nkv, hd, ctx);
    int qd = nh * hd;
    float sinks[64], *o = xmalloc(sizeof(float) * n * qd), *one = xmalloc(sizeof(float) * qd);
    for (int h = 0; h < nh; h++) sinks[h] = rndf() * 3;
    dfl_kv_view kv = {a.K, a.V, DFL_F32, a.ldk, (size_t)hd};
    dfl_attention_sinks(pools[2], n, a.q, &kv, a.nk, nh, nkv, hd, a.scale, sinks, o);
    double worst = 0, *s = xmalloc(sizeof(double) * ctx);
    int fails = 0;
    for (int r = 0; r < n; r++) {
        dfl_attention_sinks(pools[1], 1, a.q + (size_t)r * qd, &kv, a.nk + r, nh, nkv, hd, a.scale,
                            sinks, one);
        fails += memcmp(one, o + (size_t)r * qd, sizeof(float) * qd) != 0;
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            const float *q = a.q + (size_t)r * qd + h * hd;
            double mx = sinks[h], sum = 0;
            for (int j = 0; j < a.nk[r]; j++) {
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)q[i] * a.K[(size_t)j * a.ldk + kh * hd + i];
                mx = fmax(mx, s[j] = d * a.scale);
            }
            for (int j = 0; j < a.nk[r]; j++) sum += (s[j] = exp(s[j] - mx));
            sum += exp(sinks[h] - mx);
            for (int i = 0; i < hd; i++) {
                double v = 0;
                for (int j = 0; j < a.nk[r]; j++) v += s[j] * a.V[(size_t)j * a.ldk + kh * hd + i];
                worst = fmax(worst, fabs(o[(size_t)r * qd + h * hd + i] - v / sum));
            }
        }
    }
    CHECK(worst < 2e-6, "attention sinks n=%d hd=%d ctx=%d: error %g vs double", n, hd, ctx, worst);
    CHECK(fails == 0, "attention sinks n=%d hd=%d: %d rows alone differ from the block", n, hd,
          fails);
    free(s), free(o), free(one);
    att_free(&a);
}

static void test_attention_sinks(void) {
    test_attention_sinks_case(3, 4, 2, 16, 9);      /* few units: one at a time */
    test_attention_sinks_case(16, 8, 2, 16, 40);    /* many: block_units, small heads */
    test_attention_sinks_case(9, 4, 1, 64, 150);    /* packed blocks over several key blocks */
}

/* ---- thread pool ---------------------------------------------------------------- */

static void count_task(void *ctx, int i, int n) { __atomic_fetch_add(&((int *)ctx)[i], 1, __ATOMIC_RELAXED); }

static void test_pool(void) {
    int counts[100], bad = 0;
    for (int it = 0; it < 300; it++) {
        int n = it % 100;
        memset(counts, 0, sizeof counts);
        dfl_pool_run(pools[1 + it % 3], count_task, counts, n);
        for (int i = 0; i < n; i++) bad += counts[i] != 1;
        if (it % 50 == 0) usleep(20000);   /* let the workers fall asleep */
    }
    CHECK(bad == 0, "pool: %d tasks not run exactly once", bad);
}

int main(void) {
    for (int t = 1; t <= 3; t++) pools[t] = dfl_pool_new(t);
    char feat[256];
    dfl_cpu_features(feat, sizeof feat);
    printf("cpu features: %s; best path %s\n", feat, dfl_isa_name(dfl_cpu_isa()));
    test_f16();
    test_bf16();
    test_exp();
    test_pool();
    /* the SIMD-against-twin checks on every path this CPU has (a kernel with
     * no AVX-512 form runs its AVX2 one there, one with no NEON form its
     * twin: checked all the same) */
    for (int isa = DFL_ISA_GENERIC + 1; isa < DFL_ISA_COUNT; isa++) {
        if (!dfl_cpu_has_isa((dfl_isa)isa)) {
            printf("skip: the %s path (this CPU lacks it)\n", dfl_isa_name((dfl_isa)isa));
            continue;
        }
        dfl_kernels_set_isa((dfl_isa)isa);
        printf("path %s\n", dfl_isa_name((dfl_isa)isa));
        test_rows();
        test_rmsnorm();
        test_rope();
        test_swiglu();
        test_argmax();
        test_attention();
        test_attention_sinks();
        test_matmul();
    }
    dfl_kernels_set_isa(dfl_cpu_isa());
    for (int t = 1; t <= 3; t++) dfl_pool_free(pools[t]);
    return test_summary();
}
