"""test_quantize_cmd.py - `dflash quantize` end to end.

A small random Qwen3 checkpoint (tools/make_checkpoint.py) is converted to an
f32 GGUF (tools/hf_to_gguf.py) and quantized to every type. The output is read
back with llama.cpp's gguf package (GGUFReader) and checked against the input:
metadata copied (general.file_type / general.quantization_version set),
tensor names, order and shapes kept; matrices in the new type with the bytes
of gguf.quants' quantizers (Q8_0 / Q4_0 / Q4_1, F16, BF16), K-quant blocks
that gguf.quants dequantizes close to the input; norms f32; token_embd kept
unless --quantize-embeddings. Then `dflash dump` runs the quantized files:
logits close to the f32 file's. Refusals: bad type, a folder, the output on
the input, a missing file.
"""
import os
import struct
import subprocess
import sys
import tempfile

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QType

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("DFLASH_SRC", os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from testlib import check, failed, finish, missing  # noqa: E402


# ---- the file through gguf's GGUFReader: metadata as (types, value), raw tensor bytes ----

QT = {"f32": QType.F32, "f16": QType.F16, "bf16": QType.BF16, "q8_0": QType.Q8_0,
      "q4_0": QType.Q4_0, "q4_1": QType.Q4_1, "q4_k": QType.Q4_K, "q6_k": QType.Q6_K}
TNAME = {v: k for k, v in QT.items()}


def read_gguf(path):
    r = gguf.GGUFReader(path)
    meta = {k: (tuple(f.types), f.contents()) for k, f in r.fields.items()
            if not k.startswith("GGUF.")}
    tensors = [(t.name, tuple(reversed(t.shape.tolist())), TNAME[t.tensor_type],
                np.array(t.data).view(np.uint8).reshape(-1), int(t.data_offset)) for t in r.tensors]
    return meta, tensors


# ---- references: llama.cpp's gguf.quants --------------------------------------

def as_f32(tname, raw, shape):
    if tname == "f32":
        return raw.view(np.float32).reshape(shape)
    raise ValueError(tname)


def expected_bytes(typ, x):
    """gguf.quants' bytes of f32 matrix x in typ (None: no quantizer there; checked by
    the error of its dequantization instead)."""
    if typ in ("q4_k", "q6_k"):
        return None
    return gguf.quants.quantize(x, QT[typ]).view(np.uint8).reshape(-1)


LLAMA_FTYPE = {"q8_0": 7, "q4_0": 2, "q4_1": 3, "q4_k": 14, "q6_k": 18, "f16": 1, "bf16": 32}


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def check_file(typ, src_meta, src_t, out_path, embeddings):
    meta, tens = read_gguf(out_path)
    for k, v in src_meta.items():
        if k in ("general.file_type", "general.quantization_version"):
            continue
        check(meta.get(k) == v, f"{typ}: metadata {k} not copied")
    u32 = (gguf.GGUFValueType.UINT32,)
    check(meta.get("general.file_type") == (u32, LLAMA_FTYPE[typ]), f"{typ}: general.file_type")
    if typ.startswith("q"):
        check(meta.get("general.quantization_version") == (u32, 2), f"{typ}: quantization_version")
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
            y = gguf.quants.dequantize(raw.reshape(shape[0], -1), QT[typ])
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
        missing("the dflash binary ($DFLASH_BIN)")  # a failure under CI=true, else a skip
        sys.exit(finish())
    py = sys.executable  # the venv's: the tools need gguf and safetensors
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
        # relative rms logit error bounds: 1.5x what was measured (0.019, 0.21, 0.19, 0.19,
        # 0.048, 0.0005, 0.0039; weights and activations quantized, a random model has no slack)
        bounds = {"q8_0": 0.03, "q4_0": 0.3, "q4_1": 0.28, "q4_k": 0.28, "q6_k": 0.075,
                  "f16": 0.002, "bf16": 0.008}
        for typ in ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "f16", "bf16"):
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
