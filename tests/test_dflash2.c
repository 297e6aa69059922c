/* test_dflash2.c - the DFlash2 drafter's pieces on synthetic tensors, against
 * double-precision references written here (test_dflash2_drafter.py checks
 * the whole drafter against torch):
 *   the grouped dynamic causal conv: random taps; a pure one-row shift (taps
 *   zero before the block's row 0); in place;
 *   the candidates: top-K after the unary transform, ties to the lower id,
 *   NaN never a candidate;
 *   the chain walk: SpecForge's hand-computed score, and prev advancing to
 *   each pick;
 *   the hyper-connection capture: the mean of the streams. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft/draft_private.h"
#include "testutil.h"

/* Debian's aarch64 gcc 12 crashes (internal compiler error in vect_transform_reduction)
 * vectorising this file's reductions for make check-arm; a test gains nothing from it. */
#pragma GCC optimize("no-tree-vectorize")

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* y_i = sum_t (base[t][c] + dk[i][t][c/gs]) * x_{i-t}, in double. */
static void conv_ref(const float *x, const float *base, const float *dk, int n, int dim, int K,
                     int gs, double *y) {
    int G = dim / gs;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < dim; c++) {
            double acc = 0;
            for (int t = 0; t < K && t <= i; t++)
                acc += ((double)base[t * dim + c] + dk[(size_t)i * K * G + t * G + c / gs]) *
                       x[(size_t)(i - t) * dim + c];
            y[(size_t)i * dim + c] = acc;
        }
}

static void test_conv(void) {
    enum { N = 7, DIM = 24, K = 3, GS = 8, G = DIM / GS };
    dfl_drafter d;
    memset(&d, 0, sizeof d);
    d.c.dim = DIM, d.conv_k = K, d.conv_group = GS;
    float x[N * DIM], y[N * DIM], base[K * DIM], dk[N * K * G];
    double ref[N * DIM];
    unsigned s = 7;
    for (int i = 0; i < N * DIM; i++) x[i] = rnd(&s);
    for (int i = 0; i < K * DIM; i++) base[i] = rnd(&s);
    for (int i = 0; i < N * K * G; i++) dk[i] = 0.3f * rnd(&s);
    conv_ref(x, base, dk, N, DIM, K, GS, ref);
    memcpy(y, x, sizeof y);
    dfl_dflash2_conv(&d, base, dk, K * G, y, N);   /* in place */
    double err = 0;
    for (int i = 0; i < N * DIM; i++) err = fmax(err, fabs(y[i] - ref[i]));
    CHECK(err < 1e-5, "conv: max |diff| %g against the double reference", err);
    /* tap 1 only, no dynamic part: a shift by one row, row 0 zero (SpecForge's test) */
    memset(base, 0, sizeof base);
    memset(dk, 0, sizeof dk);
    for (int c = 0; c < DIM; c++) base[DIM + c] = 1.0f;
    memcpy(y, x, sizeof y);
    dfl_dflash2_conv(&d, base, dk, K * G, y, N);
    int ok = 1;
    for (int c = 0; c < DIM; c++) ok &= y[c] == 0.0f;
    for (int i = 1; i < N; i++)
        for (int c = 0; c < DIM; c++) ok &= y[i * DIM + c] == x[(i - 1) * DIM + c];
    CHECK(ok, "conv: a tap-1 kernel shifts rows down by one, zero before row 0");
    /* the dynamic part's group: only channels of group 1 see dk's group 1 */
    memset(base, 0, sizeof base);
    memset(dk, 0, sizeof dk);
    for (int i = 0; i < N; i++) dk[i * K * G + 1] = 2.0f;   /* tap 0, group 1 */
    memcpy(y, x, sizeof y);
    dfl_dflash2_conv(&d, base, dk, K * G, y, N);
    ok = 1;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < DIM; c++)
            ok &= y[i * DIM + c] == (c / GS == 1 ? 2.0f * x[i * DIM + c] : 0.0f);
    CHECK(ok, "conv: a group's dynamic tap scales exactly its %d channels", GS);
}

static void test_topk(void) {
    enum { V = 10, K = 4 };
    dfl_drafter d;
    memset(&d, 0, sizeof d);
    d.c.vocab = V, d.sel_top_k = K, d.sel_mult = 1.0f;
    float l[V] = {1, 5, 3, 5, NAN, -2, 4, 3, 0, 5};
    int32_t cand[K];
    float u[K];
    dfl_dflash2_topk(&d, l, cand, u);
    CHECK(cand[0] == 1 && cand[1] == 3 && cand[2] == 9 && cand[3] == 6,
          "topk: ties keep the lower id first, NaN left out (got %d %d %d %d)", cand[0], cand[1],
          cand[2], cand[3]);
    d.sel_mult = 0.5f, d.sel_cap = 2.0f;
    dfl_dflash2_topk(&d, l, cand, u);
    CHECK(fabs(u[0] - 2.0 * tanh(2.5 / 2.0)) < 1e-6 && cand[0] == 1,
          "topk: unary = cap * tanh(mult * logit / cap) (%g)", u[0]);
}

static void test_walk(void) {
    enum { V = 5, R = 2, K = 2 };
    float A[V * R] = {0}, B[V * R] = {0};
    A[1 * R + 0] = 2, A[1 * R + 1] = 3;
    B[2 * R + 0] = 5, B[2 * R + 1] = 7;
    B[4 * R + 0] = 11, B[4 * R + 1] = 13;
    A[4 * R + 0] = -1, A[4 * R + 1] = 0;   /* from 4, candidate 2 scores lower */
    dfl_drafter d;
    memset(&d, 0, sizeof d);
    d.c.vocab = V, d.sel_top_k = K, d.sel_rank = R;
    d.sel_pred = (dfl_mat){DFL_F32, V, R, (const uint8_t *)A, R * sizeof(float), NULL};
    d.sel_succ = (dfl_mat){DFL_F32, V, R, (const uint8_t *)B, R * sizeof(float), NULL};
    int32_t cand[2 * K] = {2, 4, 2, 4}, draft[2];
    float u[2 * K] = {0.5f, 1.5f, 100.0f, 0.0f}, ph[2 * R] = {17, 19, 1, 1}, lg[2 * V];
    dfl_dflash2_walk(&d, 1, 2, cand, u, ph, lg, draft);
    double s2 = 0.5 + 2 * 17 * 5 + 3 * 19 * 7, s4 = 1.5 + 2 * 17 * 11 + 3 * 19 * 13;
    CHECK(lg[2] == (float)s2 && lg[4] == (float)s4 && isinf(lg[0]) && lg[0] < 0,
          "walk: SpecForge's hand-computed scores (%g %g)", lg[2], lg[4]);
    CHECK(draft[0] == 4, "walk: row 0 picks the best score (%d)", draft[0]);
    /* row 1 from prev 4: 2 scores 100 + (-1*1)*5 = 95, 4 scores 0 - 11 */
    CHECK(draft[1] == 2 && lg[V + 2] == 95.0f && lg[V + 4] == -11.0f,
          "walk: prev advances to the pick (%d, %g, %g)", draft[1], lg[V + 2], lg[V + 4]);
    /* codebooks kept as bf16 (every value here exact in it): the rows converted
     * on the fly give the same bytes */
    uint16_t A16[V * R], B16[V * R];
    for (int i = 0; i < V * R; i++) A16[i] = dfl_f32_to_bf16(A[i]), B16[i] = dfl_f32_to_bf16(B[i]);
    d.sel_pred = (dfl_mat){DFL_BF16, V, R, (const uint8_t *)A16, R * 2, NULL};
    d.sel_succ = (dfl_mat){DFL_BF16, V, R, (const uint8_t *)B16, R * 2, NULL};
    float lg16[2 * V];
    int32_t draft16[2];
    dfl_dflash2_walk(&d, 1, 2, cand, u, ph, lg16, draft16);
    CHECK(!memcmp(lg, lg16, sizeof lg) && draft16[0] == draft[0] && draft16[1] == draft[1],
          "walk: bf16 codebooks give the f32 ones' scores and picks");
}

static void test_hc_mean(void) {
    enum { N = 3, HC = 4, DIM = 5 };
    float x[N * HC * DIM], y[N * DIM];
    unsigned s = 3;
    for (int i = 0; i < N * HC * DIM; i++) x[i] = rnd(&s);
    dfl_hc_mean(x, N, HC, DIM, y);
    double err = 0;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < DIM; c++) {
            double m = 0;
            for (int k = 0; k < HC; k++) m += x[(r * HC + k) * DIM + c];
            err = fmax(err, fabs(y[r * DIM + c] - m / HC));
        }
    CHECK(err < 1e-6, "hc mean: max |diff| %g against the streams' mean", err);
    float y1[N * HC * DIM];
    dfl_hc_mean(x, N * HC, 1, DIM, y1);   /* one stream: the row itself */
    CHECK(!memcmp(x, y1, sizeof y1), "hc mean of one stream is the row");
}

int main(void) {
    test_conv();
    test_topk();
    test_walk();
    test_hc_mean();
    return test_summary();
}
