/* quant_neon.c - aarch64 NEON kernels (Advanced SIMD with the dot-product
 * extension) for the weight products: the quantized types Q8_0, Q4_0, Q4_1,
 * Q4_K, Q6_K, and f32 / f16 / bf16 weights. Each computes its twin's bits
 * (quant.c's qrows_ref, matmul.c's matmul_ref_rows).
 *
 * The twins' 8 float lanes are two 4-lane registers here: lo holds lanes
 * 0-3, hi lanes 4-7. Quantized: lane k of a block is the integer sum of
 * elements 4k..4k+3, which is exactly what vdotq_s32 forms in its lane k
 * (the nibbles and Q6_K's 0..63 quants fit int8, so one signed dot serves
 * every type; integer sums are exact in any order). The float side is the
 * twin's: one fused multiply-add (vfmaq) per lane and block, in block order,
 * then hsum8's tree; Q8_0's twin first adds the 8 lanes as integers (vaddvq)
 * and keeps one float accumulator. Float weights: acc[l] = fma(w, x, acc[l]) over k in
 * steps of 8, the tree, the tail with scalar fmaf; f16 and bf16 widen
 * exactly. Activation quantization stays on the twin (one pass over X, not
 * over the weights).
 *
 * A weight block is decoded once per tile of up to TILE activation rows.
 * Speed is not measured here (no ARM machine); the shapes follow the AVX2
 * kernels' reasoning, unmeasured. */
#include "kernels/kernels.h"

#if defined(__aarch64__) /* the whole file */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/quant.h"

#define NEON __attribute__((target("arch=armv8.2-a+dotprod")))
#define INLINE static inline __attribute__((target("arch=armv8.2-a+dotprod"), always_inline))

enum { TILE = 8 };

/* An f16 field (exact: the same value as quant.c's h2f). */
INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* hsum8 of quant.c / vec.h: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)). */
INLINE float hsum8(float32x4_t lo, float32x4_t hi) {
    float32x4_t s = vaddq_f32(lo, hi);
    return (vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 2)) +
           (vgetq_lane_f32(s, 1) + vgetq_lane_f32(s, 3));
}

/* Lanes 0-3 of a 32-quant block against row quants x: sums of 4 of elements
 * 0..15 (w0), and lanes 4-7 of 16..31 (w1). */
INLINE void dot32(int8x16_t w0, int8x16_t w1, const int8_t *x, int32x4_t *lo, int32x4_t *hi) {
    *lo = vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(x));
    *hi = vdotq_s32(vdupq_n_s32(0), w1, vld1q_s8(x + 16));
}

/* ---- Q8_0, Q4_0, Q4_1: blocks of 32 ------------------------------------ */

enum { Q80, Q40, Q41 };

INLINE size_t block_bytes(int kind) {
    return kind == Q80 ? sizeof(dfl_block_q8_0)
         : kind == Q40 ? sizeof(dfl_block_q4_0) : sizeof(dfl_block_q4_1);
}

/* A block's 32 weights as the twin's int8 w: Q8_0's quants, Q4_0's q - 8,
 * Q4_1's q (low nibbles are elements 0..15, high nibbles 16..31). */
INLINE void weights32(int kind, const uint8_t *wb, int8x16_t *w0, int8x16_t *w1) {
    if (kind == Q80) {
        *w0 = vld1q_s8((const int8_t *)wb + 2);
        *w1 = vld1q_s8((const int8_t *)wb + 18);
        return;
    }
    uint8x16_t q = vld1q_u8(wb + (kind == Q41 ? 4 : 2));
    int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0xf)));
    int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
    if (kind == Q40) {
        lo = vsubq_s8(lo, vdupq_n_s8(8));
        hi = vsubq_s8(hi, vdupq_n_s8(8));
    }
    *w0 = lo, *w1 = hi;
}

/* Rows r0 .. r0+R-1 against weight row w (nb blocks): the twins
 * dot_whole_ref and dot_q4_1_ref. Per block and row acc = fma(isum, dw * dx,
 * acc), isum the whole block's for Q8_0 and Q4_0, Q4_1's per lane of 4;
 * Q4_1's mins am = fma(m, s, am) and the result hsum8 + am. */
INLINE void tile32(int kind, int R, const uint8_t *w, int nb, const dfl_qact *a, int r0,
                   float *y, int ldy) {
    float32x4_t lo[TILE], hi[TILE];
    float am[TILE]; /* Q4_1's mins; the whole sum of Q8_0 and Q4_0 */
    for (int i = 0; i < R; i++) lo[i] = hi[i] = vdupq_n_f32(0), am[i] = 0;
    const size_t bb = block_bytes(kind);
    for (int b = 0; b < nb; b++, w += bb) {
        int8x16_t w0, w1;
        weights32(kind, w, &w0, &w1);
        float dw = f16_at(w), mw = kind == Q41 ? f16_at(w + 2) : 0;
        for (int i = 0; i < R; i++) {
            int32x4_t s0, s1;
            dot32(w0, w1, dfl_qact_q(a, r0 + i, b), &s0, &s1);
            size_t di = dfl_qact_di(nb, r0 + i, b);
            float s = dw * a->d[di];
            if (kind != Q41) {
                am[i] = fmaf((float)vaddvq_s32(vaddq_s32(s0, s1)), s, am[i]);
                continue;
            }
            lo[i] = vfmaq_n_f32(lo[i], vcvtq_f32_s32(s0), s);
            hi[i] = vfmaq_n_f32(hi[i], vcvtq_f32_s32(s1), s);
            if (kind == Q41) am[i] = fmaf(mw, a->s[di], am[i]);
        }
    }
    for (int i = 0; i < R; i++)
        y[(size_t)i * ldy] = kind == Q41 ? hsum8(lo[i], hi[i]) + am[i] : am[i];
}

/* ---- K-quants: super-blocks of 256 --------------------------------------
 * q[2v], q[2v+1]: elements 32v..32v+15 and 32v+16..32v+31 of the block. */

/* Q4_K: 64-element group g holds bytes qs[32g..32g+31], low nibbles the
 * first 32 elements, high nibbles the next 32 (quant.c's q4k_quants). */
INLINE void q4_K_quants(const uint8_t *p, int8x16_t q[16]) {
    for (int g = 0; g < 4; g++)
        for (int h = 0; h < 2; h++) {
            uint8x16_t b = vld1q_u8(p + 16 + 32 * g + 16 * h);
            q[4 * g + h] = vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0xf)));
            q[4 * g + 2 + h] = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
        }
}

/* Q6_K, unsigned 0..63 (quant.c's q6k_quants): vector v = 4h + g of half h
 * takes low bits from ql[64h + 32(g & 1) ..] (low nibbles for g < 2, else
 * high) and bits 2g, 2g+1 of qh[32h ..] as bits 4, 5. */
INLINE void q6_K_quants(const uint8_t *p, int8x16_t q[16]) {
    for (int v = 0; v < 8; v++)
        for (int h = 0; h < 2; h++) {
            int half = v / 4, g = v % 4;
            uint8x16_t l = vld1q_u8(p + 64 * half + 32 * (g & 1) + 16 * h);
            uint8x16_t hb = vld1q_u8(p + 128 + 32 * half + 16 * h);
            l = g < 2 ? vandq_u8(l, vdupq_n_u8(0xf)) : vshrq_n_u8(l, 4);
            hb = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(4 - 2 * g))), vdupq_n_u8(0x30));
            q[2 * v + h] = vreinterpretq_s8_u8(vorrq_u8(l, hb));
        }
}

/* The twins dot_q4_K_ref and dot_q6_K_ref for rows r0 .. r0+R-1: per
 * super-block the integer sums (Q4_K: sc[v] per quant vector; Q6_K: the
 * scale of each 16, minus 32 x the sums of 16), then Q4_K's
 * acc = fma(isum, d*dx, acc), acc = fma(msum, -(dmin*dx), acc), Q6_K's
 * acc = fma(isum, d*dx, acc). */
INLINE void tile_k(int q6, int R, const uint8_t *w, int nb, const dfl_qact *a, int r0, float *y,
                   int ldy) {
    float32x4_t lo[TILE], hi[TILE];
    for (int i = 0; i < R; i++) lo[i] = hi[i] = vdupq_n_f32(0);
    const size_t bb = q6 ? sizeof(dfl_block_q6_K) : sizeof(dfl_block_q4_K), ss = a->cols / 16;
    for (int b = 0; b < nb; b++, w += bb) {
        int8x16_t q[16];
        uint8_t sc[8] = {0}, mn[8] = {0};
        const int8_t *sc6 = (const int8_t *)(w + 192);
        if (q6) {
            q6_K_quants(w, q);
        } else {
            q4_K_quants(w, q);
            dfl_q4k_scales(w + 4, sc, mn);
        }
        float dw = f16_at(w + (q6 ? 208 : 0)), mw = q6 ? 0 : f16_at(w + 2);
        for (int i = 0; i < R; i++) {
            int32x4_t is0 = vdupq_n_s32(0), is1 = is0;
            for (int v = 0; v < 8; v++) {
                int32x4_t s0, s1;
                dot32(q[2 * v], q[2 * v + 1], dfl_qact_q(a, r0 + i, 8 * b + v), &s0, &s1);
                is0 = vmlaq_n_s32(is0, s0, q6 ? sc6[2 * v] : sc[v]);
                is1 = vmlaq_n_s32(is1, s1, q6 ? sc6[2 * v + 1] : sc[v]);
            }
            const int16_t *bs = a->bsum + (size_t)(r0 + i) * ss + 16 * b;
            int32_t c[8]; /* Q4_K: msum; Q6_K: the -32 offset */
            for (int k = 0; k < 8; k++)
                c[k] = q6 ? 32 * (sc6[2 * k] * bs[2 * k] + sc6[2 * k + 1] * bs[2 * k + 1])
                          : mn[k] * (bs[2 * k] + bs[2 * k + 1]);
            int32x4_t c0 = vld1q_s32(c), c1 = vld1q_s32(c + 4);
            float dx = a->d[dfl_qact_di(nb, r0 + i, b)], dd = dw * dx;
            if (q6) is0 = vsubq_s32(is0, c0), is1 = vsubq_s32(is1, c1);
            lo[i] = vfmaq_n_f32(lo[i], vcvtq_f32_s32(is0), dd);
            hi[i] = vfmaq_n_f32(hi[i], vcvtq_f32_s32(is1), dd);
            if (!q6) {
                float dm = mw * dx;
                lo[i] = vfmaq_n_f32(lo[i], vcvtq_f32_s32(c0), -dm);
                hi[i] = vfmaq_n_f32(hi[i], vcvtq_f32_s32(c1), -dm);
            }
        }
    }
    for (int i = 0; i < R; i++) y[(size_t)i * ldy] = hsum8(lo[i], hi[i]);
}

/* ---- rows of W ------------------------------------------------------------ */

/* Output rows [o0, o1), activation rows in tiles of TILE (each tile one group
 * of dfl_qact.q: r0 a multiple of 8). */
NEON void dfl_qrows_neon(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                         int ldy) {
    int nb = W->cols / a->blk;
    for (int r = 0; r < n; r += TILE) {
        int R = n - r < TILE ? n - r : TILE;
        for (int o = o0; o < o1; o++) {
            const uint8_t *w = W->data + (size_t)o * W->row_bytes;
            float *y = Y + (size_t)r * ldy + o;
            switch (W->type) {
            case DFL_Q8_0: tile32(Q80, R, w, nb, a, r, y, ldy); break;
            case DFL_Q4_0: tile32(Q40, R, w, nb, a, r, y, ldy); break;
            case DFL_Q4_1: tile32(Q41, R, w, nb, a, r, y, ldy); break;
            case DFL_Q4_K: tile_k(0, R, w, nb, a, r, y, ldy); break;
            case DFL_Q6_K: tile_k(1, R, w, nb, a, r, y, ldy); break;
            default: break;
            }
        }
    }
}

/* ---- f32 / f16 / bf16 weights ------------------------------------------- */

/* Weights k..k+3 of a row as f32 (exact widening). */
INLINE float32x4_t load4(dfl_type t, const uint8_t *row, int k) {
    const uint16_t *h = (const uint16_t *)row + k;
    if (t == DFL_F16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
    if (t == DFL_BF16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(h), 16));
    return vld1q_f32((const float *)row + k);
}

/* y = W row w . x in the dot order of vec.h (matmul_ref_rows). */
INLINE float dot_row(dfl_type t, const uint8_t *w, const float *x, int cols) {
    float32x4_t lo = vdupq_n_f32(0), hi = lo;
    int k8 = cols & ~7;
    for (int k = 0; k < k8; k += 8) {
        lo = vfmaq_f32(lo, load4(t, w, k), vld1q_f32(x + k));
        hi = vfmaq_f32(hi, load4(t, w, k + 4), vld1q_f32(x + k + 4));
    }
    float s = hsum8(lo, hi);
    for (int k = k8; k < cols; k++) {
        float wk = t == DFL_F32 ? ((const float *)w)[k]
                 : t == DFL_F16 ? dfl_f16_to_f32(((const uint16_t *)w)[k])
                                : dfl_bf16_to_f32(((const uint16_t *)w)[k]);
        s = fmaf(wk, x[k], s);
    }
    return s;
}

NEON void dfl_matmul_rows_neon(const dfl_mat *W, int o0, int o1, int n, const float *X, int ldx,
                               float *Y, int ldy) {
    for (int o = o0; o < o1; o++) {
        const uint8_t *w = W->data + (size_t)o * W->row_bytes;
        for (int r = 0; r < n; r++)
            Y[(size_t)r * ldy + o] = dot_row(W->type, w, X + (size_t)r * ldx, W->cols);
    }
}

#endif
