/* quant.c - GGUF block formats Q8_0, Q4_0, Q4_1, Q4_K, Q6_K: dequantization (bit
 * for bit as ggml's dequantize_row_*), quantizers, and the plain-C twins of
 * the AVX2 matmul in quant_avx2.c.
 *
 * The matmul quantizes each activation row to int8 blocks (one f32 scale per
 * 32, or per 256 for K-quant weights), then does integer dot products per
 * block. Integer sums are exact in any order; only the float side has to be
 * fixed, and the twins below spell it out so that tests can memcmp them
 * against the SIMD code:
 * - Q8_0 and Q4_0 (as int8 weights q - 8): the block's 32 products summed
 *   exactly, then one fused multiply-add per block, in block order, into
 *   one accumulator. So a SIMD kernel puts outputs side by side in its lanes
 *   (8 on AVX2, 16 on AVX-512) and spends one FMA per row, block and
 *   lane-full of outputs.
 * - Q4_1 and the K-quants: eight lanes, lane k holding the integer sum
 *   of elements 4k..4k+3 of each 32-element group, accumulated over blocks
 *   in order with one fused multiply-add per block; the eight lanes are then
 *   added in one fixed tree (hsum8). Q4_1's mins make one more float sum,
 *   over blocks in order, added after hsum8. */
#include "kernels/quant.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* ---- f16 (exact; the same bits as F16C's vcvtph2ps / vcvtps2ph RNE) ---- */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

static float h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000 | m << 13 | (m ? 0x400000 : 0); /* NaNs come out quiet */
    } else if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal: exact */
        return sign ? -f : f;
    } else {
        bits = sign | (e + 112) << 23 | m << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)(x >> 16 & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return sign | 0x7e00 | (ax >> 13 & 0x3ff);
    if (ax >= 0x477ff000) return sign | 0x7c00; /* 65520 and up round to inf */
    if (ax >= 0x38800000) {                     /* normal half: round the mantissa to even */
        uint32_t m = ax - 0x38000000;
        return sign | (uint16_t)((m + 0xfff + (m >> 13 & 1)) >> 13);
    }
    float a;
    memcpy(&a, &ax, 4);
    return sign | (uint16_t)rintf(a * 0x1p24f); /* subnormal half: units of 2^-24 */
}

static float f16_round(float f) { return h2f(f2h(f)); }

/* ---- dequantization: ggml's dequantize_row_*, same float operations ------ */

static void dequant_q8_0(const uint8_t *p, float *y, int nb) {
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q8_0), y += QK8_0) {
        float d = h2f(rd16(p));
        for (int i = 0; i < QK8_0; i++) y[i] = (int8_t)p[2 + i] * d;
    }
}

/* The 32 nibbles of a Q4_0 / Q4_1 block in element order. */
static void q4_nibbles(const uint8_t *qs, uint8_t q[32]) {
    for (int i = 0; i < 16; i++) {
        q[i] = qs[i] & 0xf;
        q[i + 16] = qs[i] >> 4;
    }
}

static void dequant_q4_0(const uint8_t *p, float *y, int nb) {
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q4_0), y += QK4_0) {
        float d = h2f(rd16(p));
        uint8_t q[32];
        q4_nibbles(p + 2, q);
        for (int i = 0; i < QK4_0; i++) y[i] = (q[i] - 8) * d;
    }
}

static void dequant_q4_1(const uint8_t *p, float *y, int nb) {
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q4_1), y += QK4_1) {
        float d = h2f(rd16(p)), m = h2f(rd16(p + 2));
        uint8_t q[32];
        q4_nibbles(p + 4, q);
        for (int i = 0; i < QK4_1; i++) y[i] = q[i] * d + m;
    }
}

/* The 12 scale bytes of a Q4_K block hold 8 scales and 8 mins of 6 bits:
 * bytes 0-3 the low 6 bits of scales 0-3, bytes 4-7 of mins 0-3, bytes 8-11
 * the low nibbles of scales 4-7 (low half) and mins 4-7 (high half); the top
 * two bits of bytes 0-3 / 4-7 are the high bits of scales 4-7 / mins 4-7. */
void dfl_q4k_scales(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0xf) | (s[j] >> 6) << 4);
        mn[j + 4] = (uint8_t)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
}

/* Quants of a Q4_K block in element order (0..15). */
static void q4k_quants(const uint8_t *qs, uint8_t q[QK_K]) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            q[64 * g + l] = qs[32 * g + l] & 0xf;
            q[64 * g + 32 + l] = qs[32 * g + l] >> 4;
        }
}

static void dequant_q4_K(const uint8_t *p, float *y, int nb) {
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q4_K), y += QK_K) {
        float d = h2f(rd16(p)), dmin = h2f(rd16(p + 2));
        uint8_t sc[8], mn[8], q[QK_K];
        dfl_q4k_scales(p + 4, sc, mn);
        q4k_quants(p + 16, q);
        for (int j = 0; j < 8; j++) {
            float dj = d * sc[j], mj = dmin * mn[j];
            for (int l = 0; l < 32; l++) y[32 * j + l] = dj * q[32 * j + l] - mj;
        }
    }
}

/* Quants of a Q6_K block in element order, unsigned (0..63; the value is
 * q - 32): per half of 128, ql holds the low nibbles of elements 0-31 | 64-95
 * (bytes 0-31) and 32-63 | 96-127 (bytes 32-63); qh byte l holds the top two
 * bits of elements l, l+32, l+64, l+96. */
static void q6k_quants(const uint8_t *ql, const uint8_t *qh, uint8_t q[QK_K]) {
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, q += 128)
        for (int l = 0; l < 32; l++) {
            q[l] = (uint8_t)((ql[l] & 0xf) | (qh[l] & 3) << 4);
            q[l + 32] = (uint8_t)((ql[l + 32] & 0xf) | (qh[l] >> 2 & 3) << 4);
            q[l + 64] = (uint8_t)((ql[l] >> 4) | (qh[l] >> 4 & 3) << 4);
            q[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4);
        }
}

static void dequant_q6_K(const uint8_t *p, float *y, int nb) {
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q6_K), y += QK_K) {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = h2f(rd16(p + 208));
        uint8_t q[QK_K];
        q6k_quants(p, p + 128, q);
        for (int i = 0; i < QK_K; i++) y[i] = d * sc[i / 16] * (q[i] - 32);
    }
}

void dfl_qdequant_row(dfl_type t, const void *src, float *dst, int cols) {
    const uint8_t *p = src;
    switch (t) {
    case DFL_Q8_0: dequant_q8_0(p, dst, cols / QK8_0); break;
    case DFL_Q4_0: dequant_q4_0(p, dst, cols / QK4_0); break;
    case DFL_Q4_1: dequant_q4_1(p, dst, cols / QK4_1); break;
    case DFL_Q4_K: dequant_q4_K(p, dst, cols / QK_K); break;
    case DFL_Q6_K: dequant_q6_K(p, dst, cols / QK_K); break;
    default: break;
    }
}

/* ---- quantizers ---------------------------------------------------------- */

/* ggml's quantize_row_q8_0_ref: d = max|x| / 127, q = roundf(x / d). */
static void quant_q8_0(const float *x, uint8_t *p, int nb) {
    for (int b = 0; b < nb; b++, x += QK8_0, p += sizeof(dfl_block_q8_0)) {
        float amax = 0;
        for (int i = 0; i < QK8_0; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
        wr16(p, f2h(d));
        for (int i = 0; i < QK8_0; i++) p[2 + i] = (uint8_t)(int8_t)roundf(x[i] * id);
    }
}

/* The nibbles of Q4_0 / Q4_1 as ggml rounds them:
 * q = min(15, trunc((x - lo) * id + bias)); Q4_0's x - 0 is x, bit for bit. */
static void q4_pack(const float *x, float lo, float id, float bias, uint8_t *qs) {
    for (int i = 0; i < 16; i++) {
        int q0 = (int8_t)((x[i] - lo) * id + bias), q1 = (int8_t)((x[i + 16] - lo) * id + bias);
        qs[i] = (uint8_t)((q0 < 15 ? q0 : 15) | (q1 < 15 ? q1 : 15) << 4);
    }
}

/* ggml's quantize_row_q4_0_ref: the value of largest magnitude maps to -8,
 * d = max / -8, q = min(15, trunc(x / d + 8.5)). */
static void quant_q4_0(const float *x, uint8_t *p, int nb) {
    for (int b = 0; b < nb; b++, x += QK4_0, p += sizeof(dfl_block_q4_0)) {
        float amax = 0, max = 0;
        for (int i = 0; i < QK4_0; i++)
            if (amax < fabsf(x[i])) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
        wr16(p, f2h(d));
        q4_pack(x, 0.0f, id, 8.5f, p + 2);
    }
}

/* ggml's quantize_row_q4_1_ref: d = (max - min) / 15, m = min,
 * q = min(15, trunc((x - min) / d + 0.5)). */
static void quant_q4_1(const float *x, uint8_t *p, int nb) {
    for (int b = 0; b < nb; b++, x += QK4_1, p += sizeof(dfl_block_q4_1)) {
        float min = x[0], max = x[0];
        for (int i = 1; i < QK4_1; i++) {
            min = x[i] < min ? x[i] : min;
            max = x[i] > max ? x[i] : max;
        }
        float d = (max - min) / 15, id = d != 0 ? 1.0f / d : 0.0f;
        wr16(p, f2h(d));
        wr16(p + 2, f2h(min));
        q4_pack(x, min, id, 0.5f, p + 4);
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_K sub-block fit: x ~ s*L - m with L in 0..15, s >= 0, m >= 0. Tries a
 * few steps around (max - min) / 15; for each rounding L refits s and m by
 * least squares (m clamped at 0) and keeps the fit of least squared error. */
static void fit_q4k_sub(const float *x, int n, float *s_out, float *m_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (lo > 0) lo = 0; /* the format can only subtract */
    *s_out = 0;
    *m_out = -lo;
    if (hi == lo) return;
    double best = INFINITY;
    for (int k = -3; k <= 6; k++) {
        float iscale = (15 + 0.25f * k) / (hi - lo);
        double sl = 0, sll = 0, sx = 0, slx = 0;
        int L[QK_K];
        for (int i = 0; i < n; i++) {
            L[i] = clampi((int)lrintf((x[i] - lo) * iscale), 0, 15);
            sl += L[i];
            sll += (double)L[i] * L[i];
            sx += x[i];
            slx += (double)L[i] * x[i];
        }
        double det = n * sll - sl * sl, s, c; /* x ~ s*L + c */
        if (det <= 0) continue;
        s = (n * slx - sl * sx) / det;
        c = (sll * sx - sl * slx) / det;
        if (c > 0) { /* a positive offset is not expressible: fit s alone */
            c = 0;
            s = slx / sll;
        }
        if (s < 0) continue;
        double err = 0;
        for (int i = 0; i < n; i++) err += (s * L[i] + c - x[i]) * (s * L[i] + c - x[i]);
        if (err < best) {
            best = err;
            *s_out = (float)s;
            *m_out = (float)-c;
        }
    }
}

static int quant_q4_K(const float *x, uint8_t *p, int nb) {
    for (int b = 0; b < nb; b++, x += QK_K, p += sizeof(dfl_block_q4_K)) {
        float s[8], m[8], smax = 0, mmax = 0;
        for (int j = 0; j < 8; j++) {
            fit_q4k_sub(x + 32 * j, 32, &s[j], &m[j]);
            smax = fmaxf(smax, s[j]);
            mmax = fmaxf(mmax, m[j]);
        }
        float d = f16_round(smax / 63), dmin = f16_round(mmax / 63);
        if (!isfinite(d) || !isfinite(dmin)) return -1;
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = (uint8_t)(d > 0 ? clampi((int)lrintf(s[j] / d), 0, 63) : 0);
            mn[j] = (uint8_t)(dmin > 0 ? clampi((int)lrintf(m[j] / dmin), 0, 63) : 0);
        }
        wr16(p, f2h(d));
        wr16(p + 2, f2h(dmin));
        uint8_t *ps = p + 4, *qs = p + 16;
        for (int j = 0; j < 4; j++) {
            ps[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
            ps[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
            ps[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | (mn[j + 4] & 0xf) << 4);
        }
        uint8_t L[QK_K]; /* requantize with the stored (rounded) scales */
        for (int j = 0; j < 8; j++) {
            float dj = d * sc[j], mj = dmin * mn[j];
            for (int l = 0; l < 32; l++)
                L[32 * j + l] =
                    (uint8_t)(dj > 0 ? clampi((int)lrintf((x[32 * j + l] + mj) / dj), 0, 15) : 0);
        }
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                qs[32 * g + l] = (uint8_t)(L[64 * g + l] | L[64 * g + 32 + l] << 4);
    }
    return 0;
}

/* Q6_K sub-block fit: x ~ s*L with L in -32..31 and s of either sign, so the
 * value of largest magnitude can take the -32 end. Tries steps around
 * max / -32, refits s by least squares, keeps the least squared error. */
static float fit_q6k_sub(const float *x, int n) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (amax < fabsf(x[i])) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax == 0) return 0;
    float best_s = max / -32;
    double best = -1;
    for (int k = -4; k <= 4; k++) {
        float iscale = -(32 + 0.25f * k) / max;
        double slx = 0, sll = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi((int)lrintf(x[i] * iscale), -32, 31);
            slx += (double)l * x[i];
            sll += (double)l * l;
        }
        /* error = sum x^2 - slx^2 / sll: maximize slx^2 / sll */
        if (sll > 0 && slx * slx / sll > best) {
            best = slx * slx / sll;
            best_s = (float)(slx / sll);
        }
    }
    return best_s;
}

static int quant_q6_K(const float *x, uint8_t *p, int nb) {
    for (int b = 0; b < nb; b++, x += QK_K, p += sizeof(dfl_block_q6_K)) {
        float s[16], amax = 0;
        for (int j = 0; j < 16; j++) {
            s[j] = fit_q6k_sub(x + 16 * j, 16);
            amax = fmaxf(amax, fabsf(s[j]));
        }
        float d = f16_round(amax / 127);
        if (!isfinite(d)) return -1;
        int8_t *sc = (int8_t *)(p + 192);
        uint8_t L[QK_K];
        for (int j = 0; j < 16; j++) {
            sc[j] = (int8_t)(d > 0 ? clampi((int)lrintf(s[j] / d), -127, 127) : 0);
            float dj = d * sc[j];
            for (int l = 0; l < 16; l++) {
                int q = dj != 0 ? clampi((int)lrintf(x[16 * j + l] / dj), -32, 31) : 0;
                L[16 * j + l] = (uint8_t)(32 + q);
            }
        }
        wr16(p + 208, f2h(d));
        uint8_t *ql = p, *qh = p + 128;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                const uint8_t *q = L + 128 * h + l;
                ql[l] = (uint8_t)((q[0] & 0xf) | (q[64] & 0xf) << 4);
                ql[l + 32] = (uint8_t)((q[32] & 0xf) | (q[96] & 0xf) << 4);
                qh[l] = (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 |
                                  (q[96] >> 4) << 6);
            }
    }
    return 0;
}

int dfl_qquant_row(dfl_type t, const float *src, void *dst, int cols) {
    int blk = dfl_type_block(t);
    if (blk <= 1 || cols <= 0 || cols % blk) return -1;
    for (int i = 0; i < cols; i++)
        if (!isfinite(src[i])) return -1;
    switch (t) {
    case DFL_Q8_0: quant_q8_0(src, dst, cols / QK8_0); return 0;
    case DFL_Q4_0: quant_q4_0(src, dst, cols / QK4_0); return 0;
    case DFL_Q4_1: quant_q4_1(src, dst, cols / QK4_1); return 0;
    case DFL_Q4_K: return quant_q4_K(src, dst, cols / QK_K);
    case DFL_Q6_K: return quant_q6_K(src, dst, cols / QK_K);
    default: return -1;
    }
}

/* ---- quantized activations ------------------------------------------------ */

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static int is_kquant(dfl_type t) { return t == DFL_Q4_K || t == DFL_Q6_K; }

/* Lays the scratch out as a dfl_qact for n rows; returns the bytes needed. */
static size_t qact_layout(dfl_type t, int n, int cols, void *scratch, dfl_qact *a) {
    int blk = is_kquant(t) ? QK_K : 32;
    size_t nq = align64((size_t)n * cols);
    size_t nd = align64((size_t)(n + 7) / 8 * 8 * (cols / blk) * sizeof(float));
    size_t ns = is_kquant(t) ? align64((size_t)n * (cols / 16) * sizeof(int16_t)) : 0;
    size_t n1 = t == DFL_Q4_1 ? nd : 0;
    size_t n8 = t == DFL_Q8_0 || t == DFL_Q4_0 ? nd : 0;
    if (a) {
        uint8_t *p = scratch;
        a->blk = blk;
        a->cols = cols;
        a->n = n;
        a->q = (int8_t *)p;
        a->d = (float *)(p + nq);
        a->bsum = ns ? (int16_t *)(p + nq + nd) : NULL;
        a->s = n1 ? (float *)(p + nq + nd + ns) : NULL;
        a->xoff = n8 ? (int32_t *)(p + nq + nd + ns + n1) : NULL; /* filled by qact_xoff */
    }
    return nq + nd + ns + n1 + n8;
}

size_t dfl_qmatmul_scratch(dfl_type t, int n, int cols) {
    return qact_layout(t, n, cols, NULL, NULL);
}

/* round(v) clamped to [-127, 127]; written as maxps/minps compute it, so a
 * NaN becomes -127 here and in the SIMD code alike. */
static int8_t act_round(float v) {
    v = rintf(v);
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    return (int8_t)v;
}

/* Row r's quant e in dfl_qact.q. */
static int8_t *qel(const dfl_qact *a, int r, int e) { return dfl_qact_q(a, r, e / 32) + e % 32; }

static void qact_quant_ref(dfl_qact *a, int n, const float *X, int ldx) {
    int blk = a->blk, nb = a->cols / blk;
    for (int r = 0; r < n; r++) {
        const float *x = X + (size_t)r * ldx;
        for (int b = 0; b < nb; b++) {
            float amax = 0;
            for (int i = 0; i < blk; i++) {
                float ax = fabsf(x[b * blk + i]);
                amax = ax > amax ? ax : amax; /* NaN is skipped, as maxps does */
            }
            /* below 2^-100 a block counts as zero: 1/d must not overflow */
            float d = amax >= 0x1p-100f ? amax / 127 : 0.0f, id = d != 0 ? 1.0f / d : 0.0f;
            a->d[dfl_qact_di(nb, r, b)] = d;
            int sum = 0;
            for (int i = b * blk; i < (b + 1) * blk; i++) {
                *qel(a, r, i) = act_round(x[i] * id);
                sum += *qel(a, r, i);
            }
            if (a->s) a->s[dfl_qact_di(nb, r, b)] = d * (float)sum;
        }
        if (a->bsum)
            for (int g = 0; g < a->cols / 16; g++) {
                int s = 0;
                for (int i = 16 * g; i < 16 * g + 16; i++) s += *qel(a, r, i);
                a->bsum[(size_t)r * (a->cols / 16) + g] = (int16_t)s;
            }
    }
    for (int r = n; r % 8; r++) /* the unused lanes of the last group of 8 */
        for (int b = 0; b < nb; b++) {
            a->d[dfl_qact_di(nb, r, b)] = 0;
            if (a->s) a->s[dfl_qact_di(nb, r, b)] = 0;
        }
}

#if DFL_X86
/* Fills dfl_qact.xoff, -z x each block's quant sum, for the n rows of a
 * (the kernels read it one row at a time, so the padding rows stay unset). */
static void qact_xoff(dfl_qact *a, int n, int z) {
    int nb = a->cols / 32;
    for (int r = 0; r < n; r++)
        for (int b = 0; b < nb; b++) {
            int sum = 0;
            for (int i = 0; i < 32; i++) sum += dfl_qact_q(a, r, b)[i];
            a->xoff[dfl_qact_di(nb, r, b)] = -z * sum;
        }
}
#endif

/* ---- the twins of the SIMD dot products --------------------------------- */

/* The fixed lane tree of the SIMD horizontal sum. */
static float hsum8(const float a[8]) {
    float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
    return (t0 + t2) + (t1 + t3);
}

/* Lane k of maddubs + madd: the products of elements 4k..4k+3. */
static int lane4(const int8_t *w, const int8_t *x, int k) {
    int s = 0;
    for (int e = 4 * k; e < 4 * k + 4; e++) s += w[e] * x[e];
    return s;
}

static int lane4u(const uint8_t *w, const int8_t *x, int k) {
    int s = 0;
    for (int e = 4 * k; e < 4 * k + 4; e++) s += w[e] * x[e];
    return s;
}

/* Q4_1 (as int8 weights q): per block of 32,
 * acc[k] = fma(isum[k], dw * dx, acc[k]). */
static void acc_block32(float acc[8], const int8_t *w, const int8_t *x, float s) {
    for (int k = 0; k < 8; k++) acc[k] = fmaf((float)lane4(w, x, k), s, acc[k]);
}

/* Block b of Q8_0 row o as a plain block: in place, or (il8) gathered into tmp. */
static const uint8_t *q8_block(const dfl_mat *W, int o, int b, uint8_t *tmp) {
    if (!W->il8) return W->data + (size_t)o * W->row_bytes + (size_t)b * sizeof(dfl_block_q8_0);
    const uint8_t *g = W->data + ((size_t)(o / 8) * (W->cols / 32) + b) * 8 * sizeof(dfl_block_q8_0);
    memcpy(tmp, g + 2 * (o % 8), 2);
    for (int k = 0; k < 8; k++) memcpy(tmp + 2 + 4 * k, g + 16 + 32 * k + 4 * (o % 8), 4);
    return tmp;
}

/* Each against activation row r of a. Q8_0 and Q4_0 (q40; weights q - 8):
 * acc = fma(isum, dw * dx, acc) per block, isum the block's whole integer
 * sum (at most 32 * 128 * 127 in magnitude, so exact as a float). */
static float dot_whole_ref(const dfl_mat *W, int o, int nb, const dfl_qact *a, int r, int q40) {
    float acc = 0;
    for (int b = 0; b < nb; b++) {
        uint8_t tmp[sizeof(dfl_block_q8_0)];
        const uint8_t *p = q40 ? W->data + (size_t)o * W->row_bytes + b * sizeof(dfl_block_q4_0)
                               : q8_block(W, o, b, tmp);
        const int8_t *x = dfl_qact_q(a, r, b);
        int8_t w[32];
        if (q40) {
            uint8_t q[32];
            q4_nibbles(p + 2, q);
            for (int i = 0; i < 32; i++) w[i] = (int8_t)(q[i] - 8);
        } else {
            memcpy(w, p + 2, 32);
        }
        int isum = 0;
        for (int e = 0; e < 32; e++) isum += w[e] * x[e];
        acc = fmaf((float)isum, h2f(rd16(p)) * a->d[dfl_qact_di(nb, r, b)], acc);
    }
    return acc;
}

/* Q4_1 also sums its mins over blocks, am = fma(m, s, am) (s: dfl_qact.s),
 * and returns hsum8(acc) + am. */
static float dot_q4_1_ref(const uint8_t *p, int nb, const dfl_qact *a, int r) {
    float acc[8] = {0}, am = 0;
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q4_1)) {
        uint8_t q[32];
        int8_t w[32];
        q4_nibbles(p + 4, q);
        for (int i = 0; i < 32; i++) w[i] = (int8_t)q[i];
        size_t di = dfl_qact_di(nb, r, b);
        acc_block32(acc, w, dfl_qact_q(a, r, b), h2f(rd16(p)) * a->d[di]);
        am = fmaf(h2f(rd16(p + 2)), a->s[di], am);
    }
    return hsum8(acc) + am;
}

/* Q4_K per super-block: isum[k] = sum_j sc[j] * lane k of group j;
 * msum[k] = mn[k] * (bsum[2k] + bsum[2k+1]);
 * acc[k] = fma(isum[k], d*dx, acc[k]), then acc[k] = fma(msum[k], -(dmin*dx), acc[k]). */
static float dot_q4_K_ref(const uint8_t *p, int nb, const dfl_qact *a, int r, const int16_t *bs) {
    float acc[8] = {0};
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q4_K), bs += 16) {
        uint8_t sc[8], mn[8], q[QK_K];
        dfl_q4k_scales(p + 4, sc, mn);
        q4k_quants(p + 16, q);
        int isum[8] = {0};
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 8; k++)
                isum[k] += sc[j] * lane4u(q + 32 * j, dfl_qact_q(a, r, 8 * b + j), k);
        float dx = a->d[dfl_qact_di(nb, r, b)], dd = h2f(rd16(p)) * dx, dm = h2f(rd16(p + 2)) * dx;
        for (int k = 0; k < 8; k++) {
            int msum = mn[k] * (bs[2 * k] + bs[2 * k + 1]);
            acc[k] = fmaf((float)isum[k], dd, acc[k]);
            acc[k] = fmaf((float)msum, -dm, acc[k]);
        }
    }
    return hsum8(acc);
}

/* Q6_K per super-block, quants unsigned: isum[k] = sum_v sc[group of 16] *
 * lane k of group v - 32 * (sc[2k]*bsum[2k] + sc[2k+1]*bsum[2k+1]);
 * acc[k] = fma(isum[k], d*dx, acc[k]). */
static float dot_q6_K_ref(const uint8_t *p, int nb, const dfl_qact *a, int r, const int16_t *bs) {
    float acc[8] = {0};
    for (int b = 0; b < nb; b++, p += sizeof(dfl_block_q6_K), bs += 16) {
        const int8_t *sc = (const int8_t *)(p + 192);
        uint8_t q[QK_K];
        q6k_quants(p, p + 128, q);
        float dd = h2f(rd16(p + 208)) * a->d[dfl_qact_di(nb, r, b)];
        for (int k = 0; k < 8; k++) {
            int isum = 0;
            for (int v = 0; v < 8; v++)
                isum += sc[(32 * v + 4 * k) / 16] *
                        lane4u(q + 32 * v, dfl_qact_q(a, r, 8 * b + v), k);
            isum -= 32 * (sc[2 * k] * bs[2 * k] + sc[2 * k + 1] * bs[2 * k + 1]);
            acc[k] = fmaf((float)isum, dd, acc[k]);
        }
    }
    return hsum8(acc);
}

/* Output rows [o0, o1) for all n activation rows. */
static void qrows_ref(const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1, float *Y,
                      int ldy) {
    int nb = W->cols / a->blk;
    for (int o = o0; o < o1; o++) {
        const uint8_t *w = W->data + (size_t)o * W->row_bytes;
        for (int r = 0; r < n; r++) {
            const int16_t *bs = a->bsum ? a->bsum + (size_t)r * (W->cols / 16) : NULL;
            float y = 0;
            switch (W->type) {
            case DFL_Q8_0: y = dot_whole_ref(W, o, nb, a, r, 0); break;
            case DFL_Q4_0: y = dot_whole_ref(W, o, nb, a, r, 1); break;
            case DFL_Q4_1: y = dot_q4_1_ref(w, nb, a, r); break;
            case DFL_Q4_K: y = dot_q4_K_ref(w, nb, a, r, bs); break;
            case DFL_Q6_K: y = dot_q6_K_ref(w, nb, a, r, bs); break;
            default: break;
            }
            Y[(size_t)r * ldy + o] = y;
        }
    }
}

/* The loaders guarantee whole blocks (dfl_type_row_bytes); anything else is
 * a caller's bug. */
static void check_mat(const dfl_mat *W) {
    int blk = dfl_type_block(W->type);
    assert(blk > 1 && W->cols % blk == 0 && W->row_bytes >= dfl_type_row_bytes(W->type, W->cols));
    (void)blk;
}

void dfl_qmatmul_ref(const dfl_mat *W, int n, const float *X, int ldx, float *Y, int ldy) {
    if (n <= 0) return;
    check_mat(W);
    dfl_qact a;
    void *scratch = dfl_aligned_alloc(qact_layout(W->type, n, W->cols, NULL, NULL));
    qact_layout(W->type, n, W->cols, scratch, &a);
    qact_quant_ref(&a, n, X, ldx);
    qrows_ref(W, &a, n, 0, W->rows, Y, ldy);
    free(scratch);
}

/* ---- threaded dispatch ---------------------------------------------------- */

typedef struct {
    const dfl_mat *W;
    const dfl_qact *a;
    int n, chunk, ldy;
    dfl_isa isa;
    float *Y;
} qjob;

/* Output rows o0..o1 on the path isa picks. */
static void qrows(dfl_isa isa, const dfl_mat *W, const dfl_qact *a, int n, int o0, int o1,
                  float *Y, int ldy) {
    switch (isa) {
#if DFL_X86
    case DFL_ISA_AVX512: /* an il8 matrix (made on the AVX2 path) has AVX2 tiles only */
        if (!W->il8 && dfl_qrows_avx512(W, a, n, o0, o1, Y, ldy)) return;
        /* fall through - no AVX-512 kernel for this type or row count */
    case DFL_ISA_AVX2: dfl_qrows_avx2(W, a, n, o0, o1, Y, ldy); return;
#endif
#if defined(__aarch64__)
    case DFL_ISA_NEON: dfl_qrows_neon(W, a, n, o0, o1, Y, ldy); return;
#endif
    default: qrows_ref(W, a, n, o0, o1, Y, ldy); return;
    }
}

int dfl_qmat_il8_wants(const dfl_mat *m) {
    return m->type == DFL_Q8_0 && !m->il8 && m->rows >= 8 && m->rows % 8 == 0 &&
           m->cols % 32 == 0 && m->row_bytes == dfl_type_row_bytes(DFL_Q8_0, m->cols) &&
           dfl_kernels_isa() == DFL_ISA_AVX2;
}

/* Group by group through a copy of its 8 rows: the layout is a permutation
 * of each group's bytes. */
void dfl_qmat_il8(dfl_mat *m) {
    if (!dfl_qmat_il8_wants(m)) return;
    size_t nb = (size_t)m->cols / 32, bb = sizeof(dfl_block_q8_0), gb = 8 * m->row_bytes;
    uint8_t *tmp = xmalloc(gb), *dst = (uint8_t *)m->data;
    for (int g = 0; g < m->rows / 8; g++, dst += gb) {
        memcpy(tmp, dst, gb);
        for (size_t b = 0; b < nb; b++) {
            uint8_t *o = dst + b * 8 * bb;
            for (int j = 0; j < 8; j++) {
                const uint8_t *w = tmp + j * m->row_bytes + b * bb;
                memcpy(o + 2 * j, w, 2);
                for (int k = 0; k < 8; k++) memcpy(o + 16 + 32 * k + 4 * j, w + 2 + 4 * k, 4);
            }
        }
    }
    free(tmp);
    m->il8 = 1;
}

void dfl_mat_row(const dfl_mat *m, int r, float *out) {
    if (!m->il8) {
        dfl_dequant_row(m->type, m->data + (size_t)r * m->row_bytes, out, m->cols);
        return;
    }
    uint8_t tmp[sizeof(dfl_block_q8_0)];
    for (int b = 0; b < m->cols / 32; b++)
        dfl_dequant_row(DFL_Q8_0, q8_block(m, r, b, tmp), out + 32 * b, 32);
}

void dfl_qmat_scales(dfl_mat *m) {
    if ((m->type != DFL_Q8_0 && m->type != DFL_Q4_0) || m->sc || m->il8 || m->rows < 1 ||
        dfl_kernels_isa() != DFL_ISA_AVX2)
        return;
    size_t nb = (size_t)m->cols / 32, n = (size_t)(m->rows + 7) / 8 * nb * 8;
    size_t bb = m->type == DFL_Q8_0 ? sizeof(dfl_block_q8_0) : sizeof(dfl_block_q4_0);
    m->sc = dfl_aligned_alloc(n * sizeof(uint16_t));
    memset(m->sc, 0, n * sizeof(uint16_t)); /* the last group's rows past m->rows */
    for (int o = 0; o < m->rows; o++)
        for (size_t b = 0; b < nb; b++) /* (each block's f16 scale comes first) */
            memcpy(&m->sc[((size_t)o / 8 * nb + b) * 8 + o % 8],
                   m->data + (size_t)o * m->row_bytes + b * bb, sizeof(uint16_t));
}

static void qjob_run(void *ctx, int i, int ntask) {
    const qjob *j = ctx;
    (void)ntask;
    int o0 = i * j->chunk, o1 = o0 + j->chunk < j->W->rows ? o0 + j->chunk : j->W->rows;
    if (o0 < o1) qrows(j->isa, j->W, j->a, j->n, o0, o1, j->Y, j->ldy);
}

static void qact_quant(dfl_isa isa, dfl_type t, dfl_qact *a, int n, const float *X, int ldx) {
#if DFL_X86
    if (isa == DFL_ISA_AVX2 || isa == DFL_ISA_AVX512) {
        dfl_qact_quant_avx2(a, n, X, ldx);
        if (t == DFL_Q4_0) qact_xoff(a, n, 8);
        if (isa == DFL_ISA_AVX512 && t == DFL_Q8_0) qact_xoff(a, n, 128); /* one row too */
        return;
    }
#endif
    (void)t;
    (void)isa;
    qact_quant_ref(a, n, X, ldx); /* also NEON's: a pass over X, not over W */
}

void dfl_qmatmul(dfl_pool *pool, const dfl_mat *W, int n, const float *X, int ldx, float *Y,
                 int ldy, void *scratch) {
    if (n <= 0 || W->rows <= 0) return;
    check_mat(W);
    dfl_qact a;
    qact_layout(W->type, n, W->cols, scratch, &a);
    dfl_isa isa = dfl_kernels_isa();
    qact_quant(isa, W->type, &a, n, X, ldx);
    /* One contiguous run of output rows per thread (the weights stream in
     * order); rows are in multiples of 8 so register tiles stay whole. */
    int nt = dfl_pool_size(pool), groups = (W->rows + 7) / 8;
    if (nt > groups) nt = groups;
    qjob j = {W, &a, n, ((groups + nt - 1) / nt) * 8, ldy, isa, Y};
    dfl_pool_run(pool, qjob_run, &j, nt);
}

/* ---- products of several matrices over the same rows, in one dispatch ----- */

enum { QGROUP_MAX = 64 };

typedef struct {
    const dfl_mat *const *W;
    const dfl_qact *a[QGROUP_MAX];
    float *const *Y;
    int n, k, per;                 /* rows; matrices; groups of 8 output rows per task */
    int first[QGROUP_MAX + 1];     /* matrix j's groups start at first[j] */
    dfl_isa isa;
} qgroup;

/* Task i: a contiguous run of the matrices' row groups laid end to end. */
static void qgroup_run(void *ctx, int i, int ntask) {
    const qgroup *g = ctx;
    (void)ntask;
    int g0 = i * g->per, g1 = g0 + g->per;
    for (int j = 0; j < g->k; j++) {
        int a = g0 > g->first[j] ? g0 : g->first[j];
        int b = g1 < g->first[j + 1] ? g1 : g->first[j + 1];
        if (a >= b) continue;
        int o0 = (a - g->first[j]) * 8, o1 = (b - g->first[j]) * 8;
        if (o1 > g->W[j]->rows) o1 = g->W[j]->rows;
        qrows(g->isa, g->W[j], g->a[j], g->n, o0, o1, g->Y[j], g->W[j]->rows);
    }
}

void dfl_qmatmul_group(dfl_pool *pool, const dfl_mat *const *W, int n, const float *const *X,
                       float *const *Y, int k, void *scratch) {
    if (k <= 0 || n <= 0) return;
    if (k > QGROUP_MAX) {   /* (no caller asks for more; stay correct if one does) */
        dfl_qmatmul_group(pool, W, n, X, Y, QGROUP_MAX, scratch);
        dfl_qmatmul_group(pool, W + QGROUP_MAX, n, X + QGROUP_MAX, Y + QGROUP_MAX,
                          k - QGROUP_MAX, scratch);
        return;
    }
    qgroup g = {.W = W, .Y = Y, .n = n, .k = k, .isa = dfl_kernels_isa()};
    dfl_qact acts[QGROUP_MAX];
    uint8_t *p = scratch;
    for (int j = 0; j < k; j++) {
        check_mat(W[j]);
        g.first[j + 1] = g.first[j] + (W[j]->rows + 7) / 8;
        if (j && X[j] == X[j - 1] && W[j]->cols == W[j - 1]->cols) {
            g.a[j] = g.a[j - 1];
            continue;
        }
        p += qact_layout(W[j]->type, n, W[j]->cols, p, &acts[j]);
        qact_quant(g.isa, W[j]->type, &acts[j], n, X[j], W[j]->cols);
        g.a[j] = &acts[j];
    }
    int nt = dfl_pool_size(pool);
    if (nt > g.first[k]) nt = g.first[k];
    g.per = (g.first[k] + nt - 1) / nt;
    dfl_pool_run(pool, qgroup_run, &g, nt);
}
