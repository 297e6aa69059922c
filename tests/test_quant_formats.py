"""test_quant_formats.py - dflash's GGUF block formats against an independent
numpy reference written from ggml's published definitions (ggml-common.h
block_q8_0 / block_q4_0 / block_q4_1 / block_q4_K / block_q6_K, ggml-quants.c
dequantize_row_* and quantize_row_q8_0_ref / quantize_row_q4_0_ref /
quantize_row_q4_1_ref).

Random raw blocks (every bit pattern of the quants and scale bytes, f16 scales
finite, subnormal and negative included) are dequantized by dflash (through
the quant_dump helper program) and by numpy in float32 with the same
operations in the same order; the bits must match. dflash's Q8_0, Q4_0 and
Q4_1 quantizers must produce ggml's reference bytes, ties included. Q4_1 is
also checked against llama.cpp's own gguf-py (gguf.quants), a second,
upstream oracle, both ways.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from testlib import CI, check, failed, finish  # noqa: E402


def find_helper():
    build = os.environ.get("DFLASH_BUILD")
    cands = [os.path.join(build, "quant_dump")] if build else []
    here = os.path.dirname(os.path.abspath(__file__))
    cands += [os.path.join(here, "..", d, "quant_dump") for d in ("build", "build-quant")]
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    return None


# ---- f16 from its bits (IEEE binary16), exactly, without numpy's float16 ----

def f16_to_f32(bits):
    bits = np.asarray(bits, dtype=np.uint32)
    sign = np.where(bits & 0x8000, -1.0, 1.0)
    e = (bits >> 10) & 0x1F
    m = (bits & 0x3FF).astype(np.float64)
    val = np.where(e == 0, m * 2.0**-24, (1.0 + m / 1024.0) * 2.0 ** (e.astype(np.float64) - 15))
    val = np.where(e == 31, np.where(m == 0, np.inf, np.nan), val)
    return (sign * val).astype(np.float32)   # every finite half is exact in f32


def u16(raw, off):
    return raw[:, off].astype(np.uint32) | (raw[:, off + 1].astype(np.uint32) << 8)


F = np.float32


# ---- dequantization, as ggml's dequantize_row_* ------------------------------

def deq_q8_0(raw):                      # raw: [nb, 34]
    d = f16_to_f32(u16(raw, 0))
    q = raw[:, 2:34].view(np.int8).astype(F)
    return (q * d[:, None]).astype(F)


def deq_q4_0(raw):                      # raw: [nb, 18]
    d = f16_to_f32(u16(raw, 0))
    qs = raw[:, 2:18]
    lo = ((qs & 0x0F).astype(np.int32) - 8).astype(F)
    hi = ((qs >> 4).astype(np.int32) - 8).astype(F)
    return np.concatenate([lo * d[:, None], hi * d[:, None]], axis=1).astype(F)


def deq_q4_1(raw):                      # raw: [nb, 20]
    d, m = f16_to_f32(u16(raw, 0)), f16_to_f32(u16(raw, 2))
    qs = raw[:, 4:20]
    lo, hi = (qs & 0x0F).astype(F), (qs >> 4).astype(F)
    q = np.concatenate([lo, hi], axis=1)
    return ((q * d[:, None]).astype(F) + m[:, None]).astype(F)   # q*d + m: two roundings


def scale_min_k4(j, s):
    """ggml's get_scale_min_k4 on the 12 scale bytes s: [nb, 12]."""
    s = s.astype(np.int32)
    if j < 4:
        return s[:, j] & 63, s[:, j + 4] & 63
    return ((s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4),
            (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4))


def deq_q4_K(raw):                      # raw: [nb, 144]
    d = f16_to_f32(u16(raw, 0))
    dmin = f16_to_f32(u16(raw, 2))
    scales, qs = raw[:, 4:16], raw[:, 16:144]
    out = []
    for j64 in range(4):                # 64 elements per step, as ggml's loop
        q = qs[:, 32 * j64: 32 * j64 + 32]
        sc1, m1 = scale_min_k4(2 * j64, scales)
        sc2, m2 = scale_min_k4(2 * j64 + 1, scales)
        d1, mm1 = d * sc1.astype(F), dmin * m1.astype(F)
        d2, mm2 = d * sc2.astype(F), dmin * m2.astype(F)
        out.append(d1[:, None] * (q & 0xF).astype(F) - mm1[:, None])
        out.append(d2[:, None] * (q >> 4).astype(F) - mm2[:, None])
    return np.concatenate(out, axis=1).astype(F)


def deq_q6_K(raw):                      # raw: [nb, 210]
    ql_all, qh_all = raw[:, 0:128].astype(np.int32), raw[:, 128:192].astype(np.int32)
    sc_all = raw[:, 192:208].view(np.int8).astype(F)
    d = f16_to_f32(u16(raw, 208))
    y = np.zeros((raw.shape[0], 256), dtype=F)
    for n in range(2):                  # two halves of 128, as ggml's loop
        ql, qh, sc = ql_all[:, 64 * n:], qh_all[:, 32 * n:], sc_all[:, 8 * n:]
        for l in range(32):
            is_ = l // 16
            q1 = ((ql[:, l] & 0xF) | (((qh[:, l] >> 0) & 3) << 4)) - 32
            q2 = ((ql[:, l + 32] & 0xF) | (((qh[:, l] >> 2) & 3) << 4)) - 32
            q3 = ((ql[:, l] >> 4) | (((qh[:, l] >> 4) & 3) << 4)) - 32
            q4 = ((ql[:, l + 32] >> 4) | (((qh[:, l] >> 6) & 3) << 4)) - 32
            base = 128 * n + l
            y[:, base + 0] = d * sc[:, is_ + 0] * q1.astype(F)
            y[:, base + 32] = d * sc[:, is_ + 2] * q2.astype(F)
            y[:, base + 64] = d * sc[:, is_ + 4] * q3.astype(F)
            y[:, base + 96] = d * sc[:, is_ + 6] * q4.astype(F)
    return y


# ---- ggml's reference quantizers ----------------------------------------------

def f32_to_f16_bits(x):
    return np.asarray(x, dtype=F).astype(np.float16).view(np.uint16)   # round to nearest even


def quant_q8_0(x):                      # x: [nb, 32] f32 -> [nb, 34] u8
    amax = np.abs(x).max(axis=1)
    d = (amax / F(127)).astype(F)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    v = (x * idv[:, None]).astype(F)
    q = np.sign(v) * np.floor(np.abs(v).astype(np.float64) + 0.5)   # roundf: ties away from 0
    out = np.zeros((x.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = f32_to_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out


def quant_q4_0(x):                      # x: [nb, 32] f32 -> [nb, 18] u8
    idx = np.argmax(np.abs(x), axis=1)  # first of the largest magnitudes, as amax < |v|
    mx = x[np.arange(x.shape[0]), idx]
    d = (mx / F(-8)).astype(F)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    v = ((x * idv[:, None]).astype(F) + F(8.5)).astype(F)
    q = np.minimum(15, np.trunc(v).astype(np.int32))
    out = np.zeros((x.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = f32_to_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    return out


def quant_q4_1(x):                      # x: [nb, 32] f32 -> [nb, 20] u8
    mn, mx = x.min(axis=1), x.max(axis=1)
    d = ((mx - mn) / F(15)).astype(F)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, F(1) / d, F(0)).astype(F)
    v = (((x - mn[:, None]).astype(F) * idv[:, None]).astype(F) + F(0.5)).astype(F)
    q = np.minimum(15, np.trunc(v).astype(np.int32))
    out = np.zeros((x.shape[0], 20), dtype=np.uint8)
    out[:, 0:2] = f32_to_f16_bits(d).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = f32_to_f16_bits(mn).view(np.uint8).reshape(-1, 2)
    out[:, 4:] = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    return out


# ---- the comparisons ------------------------------------------------------------

TYPES = {"q8_0": (32, 34, deq_q8_0), "q4_0": (32, 18, deq_q4_0), "q4_1": (32, 20, deq_q4_1),
         "q4_k": (256, 144, deq_q4_K), "q6_k": (256, 210, deq_q6_K)}
SCALE_OFFS = {"q8_0": [0], "q4_0": [0], "q4_1": [0, 2], "q4_k": [0, 2], "q6_k": [208]}


def run_helper(helper, tmp, mode, typ, data):
    inp, out = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    data.tofile(inp)
    r = subprocess.run([helper, mode, typ, inp, out], capture_output=True, text=True)
    if r.returncode != 0:
        return r.returncode, r.stderr
    return 0, np.fromfile(out, dtype=np.uint8)


def random_blocks(rng, typ, nb, finite=True):
    blk, bb, _ = TYPES[typ]
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for off in SCALE_OFFS[typ]:
        h = rng.integers(0, 1 << 16, size=nb, dtype=np.uint32)
        if finite:                       # exponent 31 (inf/NaN) tested separately
            h = np.where(((h >> 10) & 0x1F) == 31, h & ~np.uint32(0x4000), h)
        h[: nb // 8] &= 0x83FF           # some subnormal halves
        raw[:, off] = (h & 0xFF).astype(np.uint8)
        raw[:, off + 1] = (h >> 8).astype(np.uint8)
    return raw


def bits_equal(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_dequant(helper, tmp, rng):
    for typ, (blk, bb, deq) in TYPES.items():
        raw = random_blocks(rng, typ, 4096)
        rc, got = run_helper(helper, tmp, "dequant", typ, raw)
        check(rc == 0, f"{typ}: quant_dump dequant failed: {got if rc else ''}")
        if rc:
            continue
        got = got.view(np.float32).reshape(-1, blk)
        want = deq(raw)
        ok = bits_equal(got, want)
        if not ok:
            bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))
            b, i = bad[0][0], bad[1][0]
            print(f"{typ}: block {b} element {i}: dflash {got[b, i]!r} numpy {want[b, i]!r}; "
                  f"{len(bad[0])} differ", file=sys.stderr)
        check(ok, f"{typ}: dequantization differs from the numpy reference")

        # inf / NaN scales: the same non-finite pattern (NaN payloads aside)
        raw = random_blocks(rng, typ, 256, finite=False)
        for off in SCALE_OFFS[typ]:
            raw[:64, off + 1] |= 0x7C
        rc, got = run_helper(helper, tmp, "dequant", typ, raw)
        if rc == 0:
            got = got.view(np.float32).reshape(-1, blk)
            want = deq(raw)
            same = (np.isnan(got) == np.isnan(want)) & \
                   (np.isnan(want) | (got.view(np.uint32) == want.view(np.uint32)))
            check(bool(same.all()), f"{typ}: non-finite scales handled differently")
        else:
            check(False, f"{typ}: quant_dump dequant failed on non-finite scales")


def quant_inputs(rng):
    blocks = [rng.standard_normal((512, 32)).astype(F) * F(0.02),
              rng.standard_normal((512, 32)).astype(F) * F(300.0),
              (rng.standard_normal((64, 32)) * 1e-6).astype(F),     # f16-subnormal scales
              np.zeros((4, 32), dtype=F)]
    # exact ties: d = 1 (Q8_0: max 127) so x * id lands on k + 0.5
    t = (rng.integers(-126, 126, size=(64, 32)) + 0.5).astype(F)
    t[:, 5] = 127
    blocks.append(t)
    # Q4_0 ties: max -8 gives d = 1, so x + 8.5 lands on integers
    t = (rng.integers(-7, 7, size=(64, 32)) + 0.5).astype(F)
    t[:, 9] = -8
    blocks.append(t)
    # Q4_1: min -7, max 8 give d = 1, so (x - min) + 0.5 lands on integers
    t = (rng.integers(0, 15, size=(64, 32)) - 6.5).astype(F)
    t[:, 2], t[:, 30] = -7, 8
    blocks.append(t)
    # two values of the same largest magnitude and opposite signs
    t = rng.standard_normal((64, 32)).astype(F)
    t[:, 3], t[:, 20] = 2.5, -2.5
    blocks.append(t)
    return np.concatenate(blocks, axis=0)


def check_bytes(typ, got, want, oracle):
    """dflash's quantized blocks got against the oracle's want, bytes equal."""
    got = got.reshape(want.shape)
    same = np.array_equal(got, want)
    if not same:
        b = np.nonzero((got != want).any(axis=1))[0]
        print(f"{typ}: {len(b)} blocks differ, first {b[0]}: dflash {got[b[0]].tolist()} "
              f"{oracle} {want[b[0]].tolist()}", file=sys.stderr)
    check(same, f"{typ}: quantizer bytes differ from {oracle}")


def test_quant(helper, tmp, rng):
    x = quant_inputs(rng)
    for typ, ref in (("q8_0", quant_q8_0), ("q4_0", quant_q4_0), ("q4_1", quant_q4_1)):
        rc, got = run_helper(helper, tmp, "quant", typ, x)
        check(rc == 0, f"{typ}: quant_dump quant failed: {got if rc else ''}")
        if rc:
            continue
        check_bytes(typ, got, ref(x), "ggml's reference quantizer (numpy)")

    # K-quants: dflash's own quantizers; their blocks must be well formed
    # (the numpy dequantization of them must be close to the input)
    for typ in ("q4_k", "q6_k"):
        xk = rng.standard_normal((64, 256)).astype(F)
        rc, got = run_helper(helper, tmp, "quant", typ, xk)
        check(rc == 0, f"{typ}: quant_dump quant failed")
        if rc:
            continue
        y = TYPES[typ][2](got.reshape(64, -1))
        err = np.sqrt(np.mean((y - xk) ** 2) / np.mean(xk ** 2))
        check(err < (0.09 if typ == "q4_k" else 0.025), f"{typ}: relative rms error {err}")

    # a NaN is refused
    xn = np.ones((1, 32), dtype=F)
    xn[0, 7] = np.nan
    rc, _ = run_helper(helper, tmp, "quant", "q8_0", xn)
    check(rc == 1, "q8_0: a NaN input was not refused")


def test_gguf_py(helper, tmp, rng):
    """Q4_1 against gguf-py's quantize / dequantize (llama.cpp's numpy port)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    raw = random_blocks(rng, "q4_1", 4096)
    rc, got = run_helper(helper, tmp, "dequant", "q4_1", raw)
    check(rc == 0, "q4_1: quant_dump dequant failed")
    if rc == 0:
        want = dequantize(raw, GGMLQuantizationType.Q4_1).astype(F)
        check(bits_equal(got.view(np.float32).reshape(-1, 32), want),
              "q4_1: dequantization differs from gguf-py's")
    x = quant_inputs(rng)
    rc, got = run_helper(helper, tmp, "quant", "q4_1", x)
    check(rc == 0, "q4_1: quant_dump quant failed")
    if rc == 0:
        check_bytes("q4_1", got, quantize(x, GGMLQuantizationType.Q4_1), "gguf-py's quantize")


def main():
    helper = find_helper()
    if helper is None:
        msg = "quant_dump helper not built (set DFLASH_BUILD)"
        if CI:
            print("FAIL:", msg, file=sys.stderr)
            sys.exit(1)
        print("skip:", msg)
        sys.exit(0)
    rng = np.random.default_rng(20240531)
    with tempfile.TemporaryDirectory(prefix="dflash-test-") as tmp:
        test_dequant(helper, tmp, rng)
        test_quant(helper, tmp, rng)
        test_gguf_py(helper, tmp, rng)
    sys.exit(finish())


if __name__ == "__main__":
    main()
