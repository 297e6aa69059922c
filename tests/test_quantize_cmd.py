"""test_quantize_cmd.py - `dflash quantize` end to end.

A small random Qwen3 checkpoint (tools/make_checkpoint.py) is converted to an
f32 GGUF (tools/hf_to_gguf.py) and quantized to every type. The output is read
back with a GGUF parser written here and checked against the input:
metadata copied (general.file_type / general.quantization_version set),
tensor names, order and shapes kept; matrices in the new type with the bytes
of the numpy reference quantizers (ggml's Q8_0 / Q4_0, numpy's f16, bf16
rounded to nearest even), K-quant blocks that dequantize (numpy reference)
close to the input; norms f32; token_embd kept unless --quantize-embeddings.
Then `dflash dump` runs the quantized files: logits close to the f32 file's.
Refusals: bad type, a folder, the output on the input, a missing file.
"""
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("DFLASH_SRC", os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import test_quant_formats as ref  # noqa: E402  (the numpy block reference)
from testlib import CI, check, failed, finish, missing  # noqa: E402


# ---- a GGUF v3 reader: metadata as (type, value), tensors as raw bytes ------

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
          10: "<Q", 11: "<q", 12: "<d"}
# ggml type id -> (block elements, block bytes, name)
GGML = {0: (1, 4, "f32"), 1: (1, 2, "f16"), 30: (1, 2, "bf16"), 8: (32, 34, "q8_0"),
        2: (32, 18, "q4_0"), 12: (256, 144, "q4_k"), 14: (256, 210, "q6_k")}


def read_gguf(path):
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n]
        pos += n
        return s.decode("utf-8")

    def value(vt):
        if vt == 8:
            return string()
        if vt == 9:
            at, n = take("<I"), take("<Q")
            return (at, [value(at) for _ in range(n)])
        return take(SCALAR[vt])

    assert data[:4] == b"GGUF", path
    pos = 4
    version, n_t, n_kv = take("<I"), take("<Q"), take("<Q")
    assert version == 3
    meta = {}
    for _ in range(n_kv):
        k = string()
        vt = take("<I")
        meta[k] = (vt, value(vt))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        gt, off = take("<I"), take("<Q")
        infos.append((name, tuple(reversed(ne)), gt, off))
    align = meta.get("general.alignment", (4, 32))[1]
    start = pos + (-pos % align)
    tensors = []
    for name, shape, gt, off in infos:
        blk, bb, tname = GGML[gt]
        nbytes = int(np.prod(shape[:-1])) * (shape[-1] // blk) * bb
        raw = np.frombuffer(data, dtype=np.uint8, count=nbytes, offset=start + off)
        tensors.append((name, shape, tname, raw, start + off))
    return meta, tensors


# ---- references ---------------------------------------------------------------

def as_f32(tname, raw, shape):
    if tname == "f32":
        return raw.view(np.float32).reshape(shape)
    raise ValueError(tname)


def bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)   # finite inputs


def expected_bytes(typ, x):
    """The reference bytes of f32 matrix x in typ (None: check by error instead)."""
    if typ == "q8_0":
        return ref.quant_q8_0(x.reshape(-1, 32)).reshape(-1)
    if typ == "q4_0":
        return ref.quant_q4_0(x.reshape(-1, 32)).reshape(-1)
    if typ == "f16":
        return x.astype(np.float16).view(np.uint8).reshape(-1)
    if typ == "bf16":
        return bf16_bits(x).view(np.uint8).reshape(-1)
    return None


LLAMA_FTYPE = {"q8_0": 7, "q4_0": 2, "q4_k": 14, "q6_k": 18, "f16": 1, "bf16": 32}


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def check_file(typ, src_meta, src_t, out_path, embeddings):
    meta, tens = read_gguf(out_path)
    for k, v in src_meta.items():
        if k in ("general.file_type", "general.quantization_version"):
            continue
        check(meta.get(k) == v, f"{typ}: metadata {k} not copied")
    check(meta.get("general.file_type") == (4, LLAMA_FTYPE[typ]), f"{typ}: general.file_type")
    if typ.startswith("q"):
        check(meta.get("general.quantization_version") == (4, 2), f"{typ}: quantization_version")
    check([t[0] for t in tens] == [t[0] for t in src_t], f"{typ}: tensor names or order differ")
    for (name, shape, tname, raw, _), (sname, sshape, stname, sraw, _) in zip(tens, src_t):
        check(shape == sshape, f"{typ}: {name}: shape {shape} != {sshape}")
        x = as_f32(stname, sraw, sshape)
        if len(shape) == 1:
            check(tname == "f32" and np.array_equal(raw, sraw), f"{typ}: {name}: 1-D not kept f32")
            continue
        keep = name == "token_embd.weight" and not embeddings
        if keep:
            check(tname == stname and np.array_equal(raw, sraw), f"{typ}: {name}: not kept")
            continue
        check(tname == typ, f"{typ}: {name}: written as {tname}")
        want = expected_bytes(typ, x)
        if want is not None:
            check(np.array_equal(raw, want), f"{typ}: {name}: bytes differ from the reference")
        else:
            blk, bb, deq = ref.TYPES[typ]
            y = deq(raw.reshape(-1, bb)).reshape(shape)
            err = np.sqrt(np.mean((y - x) ** 2) / np.mean(x ** 2))
            check(err < (0.09 if typ == "q4_k" else 0.025), f"{typ}: {name}: rel rms error {err}")


def logits(dflash, model, ids, out):
    r = run([dflash, "dump", "--model", model, "--ids", ids, "--out", out, "--threads", "2"])
    if r.returncode != 0:
        return None, r.stderr
    return np.fromfile(out, dtype=np.float32), ""


def main():
    dflash = os.environ.get("DFLASH_BIN")
    if not dflash or not os.access(dflash, os.X_OK):
        msg = "DFLASH_BIN not set to the dflash binary"
        if CI:
            print("FAIL:", msg, file=sys.stderr)
            sys.exit(1)
        print("skip:", msg)
        sys.exit(0)
    py = "/usr/bin/python3"
    with tempfile.TemporaryDirectory(prefix="dflash-test-") as tmp:
        hf, f32 = os.path.join(tmp, "hf"), os.path.join(tmp, "m-f32.gguf")
        r = run([py, os.path.join(SRC, "tools", "make_checkpoint.py"), "--arch", "qwen3",
                 "--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                 "--head-dim", "64", "--ffn", "512", "--vocab", "1024", "--dtype", "f32",
                 "--out", hf, "--quiet"])
        check(r.returncode == 0, f"make_checkpoint failed: {r.stderr[-2000:]}")
        r = run([py, os.path.join(SRC, "tools", "hf_to_gguf.py"), hf, f32, "--outtype", "f32",
                 "--quiet"])
        check(r.returncode == 0, f"hf_to_gguf failed: {r.stderr[-2000:]}")
        if failed():
            sys.exit(1)
        src_meta, src_t = read_gguf(f32)
        ids = "1,5,9,77,300,2,8"
        base, msg = logits(dflash, f32, ids, os.path.join(tmp, "l32.bin"))
        check(base is not None, f"dump of the f32 model failed: {msg}")
        # relative rms logit error bounds: 1.5x what was measured (0.019, 0.21, 0.19, 0.048,
        # 0.0005, 0.0039; weights and activations quantized, a random model has no slack)
        bounds = {"q8_0": 0.03, "q4_0": 0.3, "q4_k": 0.28, "q6_k": 0.075, "f16": 0.002,
                  "bf16": 0.008}
        for typ in ("q8_0", "q4_0", "q4_k", "q6_k", "f16", "bf16"):
            out = os.path.join(tmp, f"m-{typ}.gguf")
            r = run([dflash, "quantize", "--model", f32, "--out", out, "--type", typ,
                     "--threads", "2"])
            check(r.returncode == 0, f"quantize {typ} failed: {r.stderr[-2000:]}")
            if r.returncode:
                continue
            check_file(typ, src_meta, src_t, out, embeddings=False)
            got, msg = logits(dflash, out, ids, os.path.join(tmp, f"l-{typ}.bin"))
            check(got is not None, f"dump of the {typ} model failed: {msg}")
            if got is not None and base is not None:
                err = float(np.sqrt(np.mean((got - base) ** 2) / np.mean(base ** 2)))
                print(f"{typ}: logits relative rms error {err:.4f}")
                check(err < bounds[typ], f"{typ}: logits relative rms error {err}")
        out = os.path.join(tmp, "m-q8e.gguf")
        r = run([dflash, "quantize", "-m", f32, "-o", out, "--type", "q8_0",
                 "--quantize-embeddings"])
        check(r.returncode == 0, f"quantize --quantize-embeddings failed: {r.stderr[-2000:]}")
        if r.returncode == 0:
            check_file("q8_0", src_meta, src_t, out, embeddings=True)

        # a NaN in a matrix: refused, naming the tensor and the row
        name, shape, _, _, off = next(t for t in src_t if t[0] == "blk.1.ffn_up.weight")
        bad = bytearray(open(f32, "rb").read())
        struct.pack_into("<f", bad, off + 4 * (3 * shape[1] + 17), float("nan"))
        nan_path = os.path.join(tmp, "nan.gguf")
        open(nan_path, "wb").write(bad)
        if os.path.exists(out):
            os.remove(out)
        r = run([dflash, "quantize", "-m", nan_path, "-o", out, "--type", "q4_k"])
        check(r.returncode == 1 and "blk.1.ffn_up.weight" in r.stderr and "row 3" in r.stderr,
              f"a NaN: exit {r.returncode}, message {r.stderr.strip()!r}")
        check(not os.path.exists(out), "a refused conversion left an output file")

        # refusals
        for args, rc, what in (
                (["--model", f32, "--out", out, "--type", "q5_1"], 2, "an unknown type"),
                (["--model", hf, "--out", out, "--type", "q8_0"], 2, "a folder"),
                (["--model", f32, "--out", f32, "--type", "q8_0"], 2, "the output on the input"),
                (["--model", os.path.join(tmp, "none.gguf"), "--out", out, "--type", "q8_0"], 1,
                 "a missing file"),
                (["--model", f32, "--type", "q8_0"], 2, "no --out")):
            r = run([dflash, "quantize"] + args)
            check(r.returncode == rc and r.stderr.strip(),
                  f"{what}: exit {r.returncode} (want {rc}), message {r.stderr.strip()!r}")
    sys.exit(finish())


if __name__ == "__main__":
    main()
