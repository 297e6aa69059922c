/* test_quant.c - the GGUF quantized formats (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K):
 * hand-built blocks against values worked out from the published layouts,
 * quantize/dequantize round trips within per-type bounds, every SIMD matmul
 * path the CPU has (AVX2; AVX-512 for Q8_0 / Q4_1 / Q4_K / Q6_K from 2 rows)
 * against its plain-C twin (memcmp) at every batch size 1..32 (tiles of 8,
 * odd and even tails) and one row alone, against a double-precision dot product
 * of the dequantized weights (within the activation-quantization bound), and
 * bitwise batch / thread invariance. tests/test_quant_formats.py checks the
 * dequantization and the Q8_0 / Q4_0 / Q4_1 quantizers bit for bit against
 * numpy and gguf-py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "testutil.h"

static const dfl_type types[] = {DFL_Q8_0, DFL_Q4_0, DFL_Q4_1, DFL_Q4_K, DFL_Q6_K};
enum { NTYPES = 5, MAXN = 32 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double unif(void) { return (rnd() >> 11) * 0x1p-53; }

static float gauss(void) {
    double u = unif() + 1e-300, v = unif();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* Gaussian values with an outlier every so often, as in LLM weights and
 * activations. */
static void fill(float *x, int n, float scale) {
    for (int i = 0; i < n; i++) x[i] = scale * gauss() * (rnd() % 61 == 0 ? 12.0f : 1.0f);
}

static size_t row_bytes(dfl_type t, int cols) { return dfl_type_row_bytes(t, cols); }

static uint16_t f16_bits(float f) { return dfl_f32_to_f16(f); }

/* ---- hand-built blocks ---------------------------------------------------- */

static void check_row(dfl_type t, const uint8_t *blk, const float *want, int n, const char *what) {
    float got[256];
    dfl_qdequant_row(t, blk, got, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            if (!bad) fprintf(stderr, "%s: element %d: got %g want %g\n", what, i, got[i], want[i]);
            bad++;
        }
    CHECK(bad == 0, "%s: %d elements differ", what, bad);
}

static void test_known_blocks(void) {
    uint8_t b[256];
    float want[256];

    /* Q8_0: d = 0.5, q_i = i - 16 */
    memset(b, 0, sizeof b);
    b[0] = 0x00, b[1] = 0x38;
    for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)(i - 16), want[i] = (i - 16) * 0.5f;
    check_row(DFL_Q8_0, b, want, 32, "q8_0 known block");

    /* Q4_0: d = -2, byte i holds element i (low) and i + 16 (high) */
    b[0] = 0x00, b[1] = 0xc0;
    for (int i = 0; i < 16; i++) {
        b[2 + i] = (uint8_t)(i | (15 - i) << 4);
        want[i] = (i - 8) * -2.0f;
        want[i + 16] = (15 - i - 8) * -2.0f;
    }
    check_row(DFL_Q4_0, b, want, 32, "q4_0 known block");

    /* Q4_1: d = 0.5, m = -3.25; the nibbles as in Q4_0, value q * d + m */
    b[0] = 0x00, b[1] = 0x38, b[2] = 0x80, b[3] = 0xc2;
    for (int i = 0; i < 16; i++) {
        int lo = (i * 5 + 3) & 15, hi = 15 - i;
        b[4 + i] = (uint8_t)(lo | hi << 4);
        want[i] = lo * 0.5f - 3.25f;
        want[i + 16] = hi * 0.5f - 3.25f;
    }
    check_row(DFL_Q4_1, b, want, 32, "q4_1 known block");

    /* Q4_K: d = 1, dmin = 0.5; 6-bit scale j = 10 + 7j, min j = 63 - 5j;
     * scales/mins 0-3 in the low 6 bits of bytes 0-3 / 4-7, their top bits
     * for 4-7 in bits 6-7 of those bytes, low nibbles of 4-7 in bytes 8-11. */
    memset(b, 0, sizeof b);
    b[0] = 0x00, b[1] = 0x3c, b[2] = 0x00, b[3] = 0x38;
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++) sc[j] = 10 + 7 * j, mn[j] = 63 - 5 * j;
    uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
    }
    for (int e = 0; e < 256; e++) {
        int q = (e * 7 + 3) & 15, g = e / 64, w = e % 64;
        if (w < 32) qs[32 * g + w] |= (uint8_t)q;
        else qs[32 * g + w - 32] |= (uint8_t)(q << 4);
        want[e] = (float)sc[e / 32] * q - 0.5f * mn[e / 32];
    }
    check_row(DFL_Q4_K, b, want, 256, "q4_k known block");

    /* Q6_K: d = 0.25, scale j = 9j - 70; per 128: element 32g + l takes its
     * low nibble from ql[l + 32(g&1)] (low half for g < 2, high for g >= 2)
     * and its top two bits from bits 2g of qh[l]. */
    memset(b, 0, sizeof b);
    b[208] = 0x00, b[209] = 0x34;
    for (int j = 0; j < 16; j++) b[192 + j] = (uint8_t)(int8_t)(9 * j - 70);
    for (int e = 0; e < 256; e++) {
        int q = (e * 13 + 5) & 63, h = e / 128, g = e % 128 / 32, l = e % 32;
        uint8_t *ql = b + 64 * h + 32 * (g & 1) + l, *qh = b + 128 + 32 * h + l;
        *ql |= (uint8_t)(g < 2 ? (q & 15) : (q & 15) << 4);
        *qh |= (uint8_t)((q >> 4) << (2 * g));
        want[e] = 0.25f * (float)(9 * (e / 16) - 70) * (float)(q - 32);
    }
    check_row(DFL_Q6_K, b, want, 256, "q6_k known block");
}

/* ---- round trips ---------------------------------------------------------- */

static double rel_rmse(const float *x, const float *y, int n) {
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e += (double)(x[i] - y[i]) * (x[i] - y[i]);
        s += (double)x[i] * x[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

static void test_roundtrip(void) {
    enum { COLS = 4096 };
    /* relative RMS error bounds on gaussian rows with outliers (measured about
     * 0.011, 0.16, 0.11, 0.10, 0.031 in the order of types; pure gaussian rows
     * give 0.0054, 0.086, 0.071, 0.017 for Q8_0, Q4_0, Q4_K, Q6_K) */
    const double bound[NTYPES] = {0.0125, 0.185, 0.13, 0.12, 0.037};
    static float x[COLS], y[COLS];
    static uint8_t q[COLS * 2];
    for (int ti = 0; ti < NTYPES; ti++) {
        dfl_type t = types[ti];
        const char *nm = dfl_type_name(t);
        double worst = 0;
        for (int rep = 0; rep < 8; rep++) {
            fill(x, COLS, rep < 4 ? 0.02f : 3.0f);
            CHECK(dfl_qquant_row(t, x, q, COLS) == 0, "%s: quantize failed", nm);
            dfl_qdequant_row(t, q, y, COLS);
            double e = rel_rmse(x, y, COLS);
            worst = e > worst ? e : worst;
            if (dfl_type_block(t) == 32) {
                /* per element: half a step (Q4_0: one at +8), plus the f16
                 * rounding of d (and of Q4_1's m) */
                int bs = (int)dfl_type_block_bytes(t), bad = 0;
                for (int i = 0; i < COLS; i++) {
                    const uint8_t *blk = q + i / 32 * bs;
                    float d = fabsf(dfl_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)));
                    float lim = (t == DFL_Q4_0 ? 1.0f : 0.5f) * d + 128 * d * 0x1p-11f;
                    if (t == DFL_Q4_1)
                        lim += fabsf(dfl_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8))) * 0x1p-11f;
                    bad += fabsf(x[i] - y[i]) > lim;
                }
                CHECK(bad == 0, "%s: %d elements beyond the per-block bound", nm, bad);
            }
        }
        printf("%s round trip: worst relative rms error %.4f (bound %.3f)\n", nm, worst, bound[ti]);
        CHECK(worst < bound[ti], "%s: relative rms error %g >= %g", nm, worst, bound[ti]);

        /* zeros, constants, tiny values */
        memset(x, 0, sizeof x);
        CHECK(dfl_qquant_row(t, x, q, COLS) == 0, "%s: zeros", nm);
        dfl_qdequant_row(t, q, y, COLS);
        int nz = 0;
        for (int i = 0; i < COLS; i++) nz += y[i] != 0;
        CHECK(nz == 0, "%s: zeros come back as %d non-zeros", nm, nz);
        for (int i = 0; i < COLS; i++) x[i] = -0.75f;
        dfl_qquant_row(t, x, q, COLS);
        dfl_qdequant_row(t, q, y, COLS);
        CHECK(rel_rmse(x, y, COLS) < 2e-3, "%s: constant row error %g", nm, rel_rmse(x, y, COLS));
        fill(x, COLS, 1e-30f);
        CHECK(dfl_qquant_row(t, x, q, COLS) == 0, "%s: tiny values", nm);
        dfl_qdequant_row(t, q, y, COLS);
        double emax = 0;
        /* a compare, not fmax: gcc 12's aarch64 vectorizer crashes on an fmax reduction */
        for (int i = 0; i < COLS; i++) {
            double e = fabs((double)x[i] - y[i]);
            emax = e > emax ? e : emax;
        }
        CHECK(emax < 1e-28, "%s: tiny values error %g", nm, emax);

        /* refusals: a non-finite value, a partial block */
        fill(x, COLS, 1.0f);
        x[77] = NAN;
        CHECK(dfl_qquant_row(t, x, q, COLS) == -1, "%s: NaN accepted", nm);
        x[77] = INFINITY;
        CHECK(dfl_qquant_row(t, x, q, COLS) == -1, "%s: inf accepted", nm);
        x[77] = 0;
        CHECK(dfl_qquant_row(t, x, q, dfl_type_block(t) + 16) == -1, "%s: partial block", nm);
        /* huge: K-quants refuse scales beyond f16; Q8_0/Q4_0 store ggml's inf */
        for (int i = 0; i < COLS; i++) x[i] *= 1e30f;
        int rc = dfl_qquant_row(t, x, q, COLS);
        CHECK(rc == (t == DFL_Q4_K || t == DFL_Q6_K ? -1 : 0), "%s: huge values gave %d", nm, rc);
    }
}

/* ---- matmul ---------------------------------------------------------------- */

typedef struct {
    dfl_mat W;
    uint8_t *data;
    float *Wd; /* dequantized [rows, cols] */
} qmat;

/* kind 0: quantized gaussian weights; 1: random bytes with sane f16 scales
 * (every bit pattern of the quants, e.g. -128 in Q8_0). */
static void make_mat(qmat *m, dfl_type t, int rows, int cols, int kind) {
    size_t rb = row_bytes(t, cols);
    m->data = malloc(rb * rows);
    m->Wd = malloc(sizeof(float) * rows * cols);
    float *tmp = malloc(sizeof(float) * cols);
    for (int o = 0; o < rows; o++) {
        uint8_t *p = m->data + rb * o;
        if (kind == 0) {
            fill(tmp, cols, 0.05f);
            dfl_qquant_row(t, tmp, p, cols);
        } else {
            for (size_t i = 0; i < rb; i++) p[i] = (uint8_t)rnd();
            int bs = (int)dfl_type_block_bytes(t);
            for (int b = 0; b < (int)(rb / bs); b++) {
                uint8_t *blk = p + b * bs;
                uint16_t h1 = f16_bits((float)((unif() * 2 - 1) * 0.01));
                uint16_t h2 = f16_bits((float)(unif() * 0.01));
                if (t == DFL_Q6_K) memcpy(blk + 208, &h1, 2);
                else memcpy(blk, &h1, 2);
                if (t == DFL_Q4_K) memcpy(blk + 2, &h2, 2);
                if (t == DFL_Q4_1) { /* a min of either sign */
                    uint16_t hm = f16_bits((float)((unif() * 2 - 1) * 0.1));
                    memcpy(blk + 2, &hm, 2);
                }
            }
        }
        dfl_qdequant_row(t, p, m->Wd + (size_t)o * cols, cols);
    }
    free(tmp);
    m->W = (dfl_mat){t, rows, cols, m->data, rb};
}

static void run(dfl_pool *pool, const qmat *m, int n, const float *X, int ldx, float *Y, int ldy) {
    void *scratch = dfl_aligned_alloc(dfl_qmatmul_scratch(m->W.type, n, m->W.cols));
    dfl_qmatmul(pool, &m->W, n, X, ldx, Y, ldy, scratch);
    free(scratch);
}

static int rows_equal(const float *a, const float *b, int rows) {
    return memcmp(a, b, sizeof(float) * rows) == 0;
}

/* Y against a double dot product of the dequantized weights: the activations
 * are rounded to steps of d = max|x| / 127 per block, so the error is at most
 * sum |w| d / 2, plus float accumulation. */
static int check_naive(const qmat *m, int n, const float *X, int ldx, const float *Y, int ldy,
                       const char *what) {
    int rows = m->W.rows, cols = m->W.cols;
    int blk = (m->W.type == DFL_Q4_K || m->W.type == DFL_Q6_K) ? 256 : 32;
    int bad = 0;
    for (int r = 0; r < n; r++) {
        const float *x = X + (size_t)r * ldx;
        for (int o = 0; o < rows; o++) {
            const float *w = m->Wd + (size_t)o * cols;
            double exact = 0, mag = 0, lim = 0;
            for (int b = 0; b < cols / blk; b++) {
                double amax = 0, sw = 0;
                for (int i = b * blk; i < (b + 1) * blk; i++) {
                    amax = fmax(amax, fabs(x[i]));
                    sw += fabs(w[i]);
                    exact += (double)w[i] * x[i];
                    mag += fabs((double)w[i] * x[i]);
                }
                lim += sw * amax / 127 / 2;
            }
            lim = lim * 1.001 + 1e-5 * mag + 1e-30;
            double got = Y[(size_t)r * ldy + o];
            if (!(fabs(got - exact) <= lim)) {
                if (!bad)
                    fprintf(stderr, "%s: row %d out %d: got %.9g want %.9g (limit %.3g)\n", what, r,
                            o, got, exact, lim);
                bad++;
            }
        }
    }
    CHECK(bad == 0, "%s: %d outputs beyond the activation-quantization bound", what, bad);
    return bad;
}

/* dfl_qmatmul on the current path against the twin's Yref, every batch
 * size on one thread and some on two and three, and rows alone. */
static void check_paths(dfl_pool **pools, const qmat *m, const float *X, int ldx, float *Y,
                        float *Y1, const float *Yref, int ldy, size_t ysz, const char *what) {
    int rows = m->W.rows;
    int bad = 0, bad_pad = 0;
    for (int p = 0; p < 3; p++) {
        for (int n = 1; n <= MAXN; n++) {
            if (p > 0 && n % 7 != 1 && n != MAXN) continue; /* fewer sizes on the other pools */
            for (size_t i = 0; i < ysz; i++) Y[i] = -1234.5f;
            run(pools[p], m, n, X, ldx, Y, ldy);
            for (int r = 0; r < n; r++) {
                if (!rows_equal(Y + (size_t)r * ldy, Yref + (size_t)r * ldy, rows) && !bad++)
                    fprintf(stderr, "%s: row %d differs (n=%d, %d threads)\n", what, r, n, p + 1);
                for (int o = rows; o < ldy; o++) bad_pad += Y[(size_t)r * ldy + o] != -1234.5f;
            }
            for (int r = n; r < MAXN; r++) bad_pad += Y[(size_t)r * ldy] != -1234.5f;
        }
    }
    CHECK(bad == 0, "%s: %d rows differ from the twin (batch size / threads)", what, bad);
    CHECK(bad_pad == 0, "%s: %d writes outside Y's rows", what, bad_pad);

    /* each row alone, at its own address */
    int bad_alone = 0;
    for (int r = 0; r < MAXN; r += 3) {
        run(pools[1], m, 1, X + (size_t)r * ldx, ldx, Y1, ldy);
        bad_alone += !rows_equal(Y1, Yref + (size_t)r * ldy, rows);
    }
    CHECK(bad_alone == 0, "%s: %d rows differ when computed alone", what, bad_alone);

}

/* A copy of m with its own bytes, rewritten in the il8 layout (free its data). */
static qmat il8_copy(const qmat *m) {
    size_t bytes = (size_t)m->W.rows * m->W.row_bytes;
    qmat c = *m;
    c.W.data = c.data = malloc(bytes);
    memcpy(c.data, m->data, bytes);
    dfl_qmat_il8(&c.W);
    return c;
}

/* The il8 layout (a copy of m's bytes rewritten, on the AVX2 path): made
 * exactly for Q8_0 of whole groups of 8 rows; the twin's bits on the AVX2
 * tiles, on an AVX-512 CPU's path (which hands il8 to them) and on the twin
 * reading the layout; every row read back as it was. */
static void check_il8(dfl_pool **pools, const qmat *m, const float *X, int ldx, float *Y,
                      float *Y1, const float *Yref, int ldy, size_t ysz, const char *what) {
    int want = m->W.type == DFL_Q8_0 && m->W.rows % 8 == 0;
    CHECK(dfl_qmat_il8_wants(&m->W) == want, "%s: il8 %s", what, want ? "not wanted" : "wanted");
    if (!want) return;
    qmat c = il8_copy(m);
    CHECK(c.W.il8 && memcmp(c.data, m->data, (size_t)m->W.rows * m->W.row_bytes) != 0, "%s: il8 left the bytes as they were",
          what);
    CHECK(!dfl_qmat_il8_wants(&c.W), "%s: il8 wanted twice", what);
    char wi[200];
    for (int isa = DFL_ISA_GENERIC; isa < DFL_ISA_COUNT; isa++) {
        if (isa == DFL_ISA_NEON || dfl_kernels_set_isa((dfl_isa)isa)) continue;
        snprintf(wi, sizeof wi, "%s, il8 on the %s path", what, dfl_isa_name((dfl_isa)isa));
        check_paths(pools, &c, X, ldx, Y, Y1, Yref, ldy, ysz, wi);
    }
    dfl_kernels_set_isa(DFL_ISA_AVX2);
    float *a = malloc(sizeof(float) * m->W.cols), *b = malloc(sizeof(float) * m->W.cols);
    int bad = 0;
    for (int r = 0; r < m->W.rows; r++) {
        dfl_mat_row(&c.W, r, a);
        dfl_mat_row(&m->W, r, b);
        bad += memcmp(a, b, sizeof(float) * m->W.cols) != 0;
    }
    CHECK(bad == 0, "%s: %d il8 rows read back differently", what, bad);
    free(a), free(b), free(c.data);
}

static void test_matmul_case(dfl_pool **pools, dfl_type t, int rows, int cols, int kind) {
    char what[128];
    snprintf(what, sizeof what, "%s %dx%d %s", dfl_type_name(t), rows, cols,
             kind ? "random bytes" : "quantized gaussian");
    qmat m;
    make_mat(&m, t, rows, cols, kind);
    int ldx = cols + 3, ldy = rows + 5;
    float *X = malloc(sizeof(float) * MAXN * ldx);
    for (int r = 0; r < MAXN; r++) fill(X + (size_t)r * ldx, ldx, r % 5 == 4 ? 30.0f : 1.0f);
    size_t ysz = (size_t)MAXN * ldy;
    float *Yref = malloc(sizeof(float) * ysz), *Y = malloc(sizeof(float) * ysz);
    float *Y1 = malloc(sizeof(float) * ldy);

    for (size_t i = 0; i < ysz; i++) Yref[i] = -1234.5f;
    dfl_qmatmul_ref(&m.W, MAXN, X, ldx, Yref, ldy);
    if (kind == 0) check_naive(&m, MAXN, X, ldx, Yref, ldy, what);

    /* every path this CPU has (generic: the twin's threaded dispatch), every
     * thread count, every batch size: the twin's bits (the twin computed all
     * 32 rows at once on one thread) */
    for (int isa = DFL_ISA_GENERIC; isa < DFL_ISA_COUNT; isa++) {
        if (dfl_kernels_set_isa((dfl_isa)isa)) continue; /* not on this CPU */
        char wi[160];
        snprintf(wi, sizeof wi, "%s [%s]", what, dfl_isa_name((dfl_isa)isa));
        check_paths(pools, &m, X, ldx, Y, Y1, Yref, ldy, ysz, wi);
        /* the AVX2 tiles' scales side by side (W->sc): the same bits */
        dfl_mat_prepare(&m.W);
        int want_sc = isa == DFL_ISA_AVX2 && (t == DFL_Q8_0 || t == DFL_Q4_0);
        CHECK(!m.W.sc == !want_sc, "%s: scales side by side %s", wi, want_sc ? "missing" : "made");
        if (m.W.sc) {
            strncat(wi, " scales side by side", sizeof wi - strlen(wi) - 1);
            check_paths(pools, &m, X, ldx, Y, Y1, Yref, ldy, ysz, wi);
        }
        dfl_mat_release(&m.W);
        if (isa == DFL_ISA_AVX2) check_il8(pools, &m, X, ldx, Y, Y1, Yref, ldy, ysz, wi);
    }
    dfl_kernels_set_isa(dfl_cpu_isa());

    if (kind == 0) {
        /* scaled activations: huge, tiny, and below the 2^-100 zero cut */
        const float scales[] = {1e30f, 1e-30f};
        float *Xs = malloc(sizeof(float) * 4 * ldx);
        for (int si = 0; si < 2; si++) {
            for (int i = 0; i < 4 * ldx; i++) Xs[i] = X[i] * scales[si];
            run(pools[1], &m, 4, Xs, ldx, Y, ldy);
            char w2[160];
            snprintf(w2, sizeof w2, "%s x%g", what, scales[si]);
            check_naive(&m, 4, Xs, ldx, Y, ldy, w2);
        }
        for (int i = 0; i < 4 * ldx; i++) Xs[i] = X[i] * 1e-33f;
        run(pools[1], &m, 4, Xs, ldx, Y, ldy);
        int nz = 0;
        for (int r = 0; r < 4; r++)
            for (int o = 0; o < rows; o++) nz += Y[(size_t)r * ldy + o] != 0;
        CHECK(nz == 0, "%s: activations below 2^-100 gave %d non-zero outputs", what, nz);
        memset(Xs, 0, sizeof(float) * 4 * ldx);
        run(pools[1], &m, 4, Xs, ldx, Y, ldy);
        nz = 0;
        for (int r = 0; r < 4; r++)
            for (int o = 0; o < rows; o++) {
                uint32_t bits;
                memcpy(&bits, &Y[(size_t)r * ldy + o], 4);
                nz += bits != 0;
            }
        CHECK(nz == 0, "%s: zero activations gave %d outputs other than +0", what, nz);
        free(Xs);
    }
    free(X), free(Y), free(Yref), free(Y1), free(m.data), free(m.Wd);
}

static void test_matmul(void) {
    dfl_pool *pools[3] = {dfl_pool_new(1), dfl_pool_new(2), dfl_pool_new(3)};
    /* the last two shapes have rows in several L2 groups (quant_avx2.c
     * GROUP_BYTES); 6144 columns is Qwen3-1.7B's w_down, 8 rows of which
     * overflow L1 */
    static const int shapes[][2] = {{1, 256},   {13, 512},   {40, 768},  {67, 1024},
                                    {29, 6144}, {45, 12288}, {64, 1024}, {16, 6144}};
    for (int ti = 0; ti < NTYPES; ti++) {
        for (int s = 0; s < 8; s++)
            for (int kind = 0; kind < 2; kind++)
                test_matmul_case(pools, types[ti], shapes[s][0], shapes[s][1], kind);
        printf("matmul: %s done\n", dfl_type_name(types[ti]));
    }
    /* Q8_0, Q4_0 and Q4_1 rows of an odd number of 32-blocks: the AVX2 tiles take
     * blocks two at a time, and a last single block has its own path. */
    static const int odd[][2] = {{9, 96}, {17, 160}, {11, 2080}, {24, 160}};
    for (int ti = 0; ti < NTYPES; ti++)
        if (dfl_type_block(types[ti]) == 32)
            for (int s = 0; s < 4; s++)
                test_matmul_case(pools, types[ti], odd[s][0], odd[s][1], 0);
    for (int p = 0; p < 3; p++) dfl_pool_free(pools[p]);
}

/* dfl_matmul_group: products of several matrices over the same rows in one
 * dispatch give each matrix's dfl_qmatmul bits, on every path, with inputs
 * shared or not, for one row (a decode step) and several (a verify block,
 * the AVX-512 kernels' 16-row tile). */
enum { GK = 5, GCOLS = 512, GMAXN = 16, GMAXR = 67 };
static float gx[3][GMAXN * GCOLS], gy[GK][GMAXN * GMAXR], gwant[GK][GMAXN * GMAXR];

static void group_case(dfl_pool *pool, const qmat *m, int n, void *scratch, const char *what) {
    const dfl_mat *W[GK];
    const float *X[GK] = {gx[0], gx[0], gx[1], gx[2], gx[2]};
    float *Y[GK];
    for (int j = 0; j < GK; j++) {
        W[j] = &m[j].W, Y[j] = gy[j];
        run(pool, &m[j], n, X[j], GCOLS, gwant[j], m[j].W.rows);
    }
    memset(gy, 0xff, sizeof gy);
    dfl_matmul_group(pool, W, n, X, Y, GK, scratch);
    int same = 1;
    for (int j = 0; j < GK; j++) same &= rows_equal(gy[j], gwant[j], n * m[j].W.rows);
    CHECK(same, "%s, %d rows: a grouped product differs from its own", what, n);
}

static void test_group(void) {
    static const int rows[GK] = {13, 40, 8, GMAXR, 29}, ns[] = {1, 3, GMAXN};
    dfl_pool *pools[3] = {dfl_pool_new(1), dfl_pool_new(2), dfl_pool_new(3)};
    for (int i = 0; i < 3; i++) fill(gx[i], GMAXN * GCOLS, 1.0f);
    for (int ti = 0; ti < NTYPES; ti++) {
        qmat m[GK];
        for (int j = 0; j < GK; j++) make_mat(&m[j], types[ti], rows[j], GCOLS, j % 2);
        void *scratch = dfl_aligned_alloc(GK * dfl_matmul_scratch(types[ti], GMAXN, GCOLS));
        for (int isa = DFL_ISA_GENERIC; isa <= (int)dfl_cpu_isa(); isa++) {
            dfl_kernels_set_isa((dfl_isa)isa);
            for (int sc = 0; sc < 3; sc++) { /* then with the AVX2 path's W->sc, and il8 */
                qmat g[GK];
                for (int j = 0; j < GK; j++) {
                    g[j] = sc == 2 && dfl_qmat_il8_wants(&m[j].W) ? il8_copy(&m[j]) : m[j];
                    if (sc) dfl_mat_prepare(&g[j].W);
                }
                for (int p = 0; p < 3; p++)
                    for (int k = 0; k < 3; k++) {
                        char what[96];
                        snprintf(what, sizeof what, "%s, %s path%s%s, %d threads",
                                 dfl_type_name(types[ti]), dfl_isa_name((dfl_isa)isa),
                                 g[0].W.sc ? " (scales side by side)" : "",
                                 g[1].W.il8 ? " (il8)" : "", p + 1);
                        group_case(pools[p], g, ns[k], scratch, what);
                    }
                for (int j = 0; j < GK; j++) {
                    dfl_mat_release(&g[j].W);
                    if (g[j].data != m[j].data) free(g[j].data);
                }
            }
        }
        dfl_kernels_set_isa(dfl_cpu_isa());
        printf("grouped products: %s done\n", dfl_type_name(types[ti]));
        free(scratch);
        for (int j = 0; j < GK; j++) free(m[j].data), free(m[j].Wd);
    }
    for (int p = 0; p < 3; p++) dfl_pool_free(pools[p]);
}

int main(void) {
    for (int isa = DFL_ISA_GENERIC; isa < DFL_ISA_COUNT; isa++)
        if (!dfl_cpu_has_isa((dfl_isa)isa))
            printf("skip: the %s path (this CPU lacks it)\n", dfl_isa_name((dfl_isa)isa));
    test_known_blocks();
    test_roundtrip();
    test_matmul();
    test_group();
    return test_summary();
}
