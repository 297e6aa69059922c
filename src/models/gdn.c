/* gdn.c - the gated DeltaNet mixer (Qwen3.5 linear_attention layers).
 *
 * Per row, with C = q | k | v channels of the projection:
 *   conv   x_c = silu(sum_j w[c, j] * in_c(t - K + 1 + j)), a depthwise causal
 *          conv of kernel K over the raw projections (the state keeps the
 *          last K - 1 inputs of every channel);
 *   q, k   L2-normalised per key head (eps 1e-6), q times 1/sqrt(k_dim);
 *          value head h reads key head h / (v_heads / k_heads);
 *   gates  beta = sigmoid(b), g = A * softplus(a + dt_bias), A = -exp(A_log)
 *          (computed at load from Hugging Face's A_log; GGUF stores A);
 *   delta  S = e^g S;  u = S^T k;  S += k (beta (v - u))^T;  o = S^T q,
 *          S a (k_dim, v_dim) f32 matrix per value head;
 *   out    rmsnorm(o) * w * silu(z) per value head, then out_proj.
 * The projections are batch-invariant matmuls over all rows; the conv and
 * the recurrence go one row at a time in position order with the same
 * code and summation order whether a row is decoded alone or verified in
 * a block, so every row's output and state have decode's bits. A tree row
 * (parent tags) starts from its parent's state, the snapshot after it. */
#include <math.h>
#include <string.h>

#include "models/gdn.h"

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float silu(float x) { return x * sigmoid(x); }
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

int dfl_gdn_channels(const dfl_config *c) {
    return 2 * c->lin_k_heads * c->lin_k_dim + c->lin_v_heads * c->lin_v_dim;
}

int dfl_gdn_state_floats(const dfl_config *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += c->layer_kind[l] == DFL_LAYER_RECURRENT;
    if (!n) return 0;
    return (c->lin_conv - 1) * dfl_gdn_channels(c) + c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
}

/* x (C) = silu(conv(window, x)); the window (K - 1, C), oldest row first,
 * moves on by x's raw inputs. */
static void conv_step(const dfl_config *c, const float *w, float *win, float *x) {
    int C = dfl_gdn_channels(c), K = c->lin_conv;
    for (int ch = 0; ch < C; ch++) {
        const float *wc = w + (size_t)ch * K;
        float acc = 0;
        for (int j = 0; j < K - 1; j++) acc += wc[j] * win[(size_t)j * C + ch];
        acc += wc[K - 1] * x[ch];
        for (int j = 0; j + 1 < K - 1; j++) win[(size_t)j * C + ch] = win[(size_t)(j + 1) * C + ch];
        if (K > 1) win[(size_t)(K - 2) * C + ch] = x[ch];
        x[ch] = silu(acc);
    }
}

/* x *= scale / sqrt(sum x^2 + 1e-6) over n elements. */
static void l2norm(float *x, int n, float scale) {
    float s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    float inv = 1.0f / sqrtf(s + 1e-6f);
    for (int i = 0; i < n; i++) x[i] = x[i] * inv * scale;
}

/* One row's recurrence, a value head per task. */
typedef struct step {
    const dfl_config *c;
    const dfl_gdn *G;
    float *S;             /* (v_heads, k_dim, v_dim) the live state's matrices */
    const float *x;       /* (C) conv output: q | k | v, q and k normalised */
    const float *z, *ba;  /* (Vd), (2 * v_heads) beta inputs then decay inputs */
    float *o;             /* (Vd) */
} step;

static void head_task(void *ctx, int h, int n) {
    (void)n;
    const step *s = ctx;
    const dfl_config *c = s->c;
    int dk = c->lin_k_dim, dv = c->lin_v_dim, H = c->lin_v_heads;
    int kh = h / (H / c->lin_k_heads), Kd = c->lin_k_heads * dk;
    const float *q = s->x + (size_t)kh * dk, *k = s->x + Kd + (size_t)kh * dk;
    const float *v = s->x + 2 * Kd + (size_t)h * dv;
    float beta = sigmoid(s->ba[h]);
    float g = s->G->decay[h] * softplus(s->ba[H + h] + s->G->dt_bias[h]);
    int r = H / c->lin_k_heads, oh = s->G->out_tiled ? (h % r) * c->lin_k_heads + h / r : h;
    float decay = expf(g), *S = s->S + (size_t)h * dk * dv, *o = s->o + (size_t)oh * dv;
    float u[DFL_MAX_HEAD_DIM];
    for (int j = 0; j < dv; j++) u[j] = 0;
    for (int i = 0; i < dk; i++) {   /* u = (e^g S)^T k */
        float *Si = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) {
            Si[j] *= decay;
            u[j] += Si[j] * k[i];
        }
    }
    for (int j = 0; j < dv; j++) u[j] = (v[j] - u[j]) * beta;   /* the delta */
    for (int j = 0; j < dv; j++) o[j] = 0;
    for (int i = 0; i < dk; i++) {   /* S += k delta^T; o = S^T q */
        float *Si = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) {
            Si[j] += k[i] * u[j];
            o[j] += Si[j] * q[i];
        }
    }
    dfl_rmsnorm(o, o, s->G->norm, dv, c->norm_eps);
    const float *z = s->z + (size_t)h * dv;
    for (int j = 0; j < dv; j++) o[j] *= silu(z[j]);
}

/* Row r of the call, row i of its sequence's forward. */
static void row_step(dfl_target *t, const dfl_gdn *G, int l, dfl_kv *kv, int r, int i) {
    const dfl_config *c = &t->c;
    int C = dfl_gdn_channels(c), dk = c->lin_k_dim, Vd = c->lin_v_heads * c->lin_v_dim;
    float *win = dfl_kv_rec(kv, l), *x = t->lin_x + (size_t)r * C;
    conv_step(c, G->conv, win, x);
    float qscale = 1.0f / sqrtf((float)dk);
    for (int h = 0; h < c->lin_k_heads; h++) {
        l2norm(x + (size_t)h * dk, dk, qscale);
        l2norm(x + (size_t)(c->lin_k_heads + h) * dk, dk, 1.0f);
    }
    step s = {c, G, win + (size_t)(c->lin_conv - 1) * C, x, t->lin_z + (size_t)r * Vd,
              t->lin_ba + (size_t)r * 2 * c->lin_v_heads, t->lin_o + (size_t)r * Vd};
    dfl_pool_run(t->pool, head_task, &s, c->lin_v_heads);
    if (i + 1 < kv->snap_n)
        memcpy(dfl_kv_snap(kv, l, i + 1), win, sizeof(float) * kv->rec_floats);
}

/* Qwen3-Next's grouped in_proj_qkvz, per key head [q | k | v | z], into
 * the separate layout: lin_x = q | k | v, lin_z. */
static void split_qkvz(dfl_target *t, const dfl_gdn *G, int n) {
    const dfl_config *c = &t->c;
    int dk = c->lin_k_dim, H = c->lin_v_heads, Hk = c->lin_k_heads, r = H / Hk;
    int Kd = Hk * dk, rv = r * c->lin_v_dim, C = dfl_gdn_channels(c), Vd = H * c->lin_v_dim;
    size_t fl = sizeof(float);
    dfl_matmul(t->pool, &G->qkv, n, t->xn, c->dim, t->lin_g, C + Vd, t->qscratch);
    for (int row = 0; row < n; row++) {
        const float *g = t->lin_g + (size_t)row * (C + Vd);
        float *x = t->lin_x + (size_t)row * C, *z = t->lin_z + (size_t)row * Vd;
        for (int h = 0; h < Hk; h++, g += 2 * dk + 2 * rv) {
            memcpy(x + (size_t)h * dk, g, dk * fl);
            memcpy(x + Kd + (size_t)h * dk, g + dk, dk * fl);
            memcpy(x + 2 * Kd + (size_t)h * rv, g + 2 * dk, rv * fl);
            memcpy(z + (size_t)h * rv, g + 2 * dk + rv, rv * fl);
        }
    }
}

/* Qwen3-Next's grouped in_proj_ba (GGUF ssm_ba too), per key head
 * [b | a], into lin_ba = b | a. */
static void split_ba(dfl_target *t, const dfl_gdn *G, int n) {
    const dfl_config *c = &t->c;
    int H = c->lin_v_heads, Hk = c->lin_k_heads, r = H / Hk;
    size_t fl = sizeof(float);
    dfl_matmul(t->pool, &G->b, n, t->xn, c->dim, t->lin_g, 2 * H, t->qscratch);
    for (int row = 0; row < n; row++) {
        const float *g = t->lin_g + (size_t)row * 2 * H;
        float *ba = t->lin_ba + (size_t)row * 2 * H;
        for (int h = 0; h < Hk; h++) {
            memcpy(ba + (size_t)h * r, g + (size_t)h * 2 * r, r * fl);
            memcpy(ba + H + (size_t)h * r, g + (size_t)h * 2 * r + r, r * fl);
        }
    }
}

void dfl_gdn_layer(dfl_target *t, const dfl_layer *L, int l, dfl_fwd *f, const int *off,
                   int n_seq) {
    const dfl_config *c = &t->c;
    const dfl_gdn *G = L->gdn;
    int n = off[n_seq], H = c->lin_v_heads, Vd = H * c->lin_v_dim;
    if (G->grouped) {
        split_qkvz(t, G, n);
    } else {
        dfl_matmul(t->pool, &G->qkv, n, t->xn, c->dim, t->lin_x, dfl_gdn_channels(c),
                   t->qscratch);
        dfl_matmul(t->pool, &G->z, n, t->xn, c->dim, t->lin_z, Vd, t->qscratch);
    }
    if (G->ba_grouped) {
        split_ba(t, G, n);
    } else {
        dfl_matmul(t->pool, &G->b, n, t->xn, c->dim, t->lin_ba, 2 * H, t->qscratch);
        dfl_matmul(t->pool, &G->a, n, t->xn, c->dim, t->lin_ba + H, 2 * H, t->qscratch);
    }
    for (int s = 0; s < n_seq; s++)
        for (int r = off[s]; r < off[s + 1]; r++) {
            int i = r - off[s], p = f[s].parent ? f[s].parent[i] : i - 1;
            if (p != i - 1) dfl_kv_branch(f[s].kv, l, p);   /* a tree row: from its parent */
            row_step(t, G, l, f[s].kv, r, i);
        }
    dfl_matmul(t->pool, &G->out, n, t->lin_o, Vd, t->h1, c->dim, t->qscratch);
}
