"""gguf_writer.py - a minimal GGUF v3 writer (and reader, for tests) in numpy.

Layout (ggml's docs/gguf.md): magic "GGUF", u32 version 3, u64 tensor count,
u64 metadata count; metadata as (string key, u32 type, value); tensor infos
as (string name, u32 n_dims, u64 dims[n_dims] with the fastest dimension
FIRST, u32 ggml type, u64 offset into the data section); padding to
general.alignment (32 by default); then the tensor data, each tensor's start
aligned. Strings are u64 length + UTF-8 bytes; arrays are u32 element type,
u64 count, elements. Everything little-endian.

Only float tensor types are written here (F32, F16, BF16); quantization is
the engine's `dflash quantize`.
"""
import struct

import numpy as np

from st import f32_to_bf16, bf16_to_f32

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGN = 32

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

# ggml tensor types
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
GGML_NAMES = {"f32": GGML_F32, "f16": GGML_F16, "bf16": GGML_BF16}
_ITEM = {GGML_F32: 4, GGML_F16: 2, GGML_BF16: 2}


def encode(a, ggml_type):
    """float array -> bytes of ggml_type (F16 and BF16 round to nearest even)."""
    a = np.asarray(a, dtype=np.float32)
    if ggml_type == GGML_F32:
        return a.astype("<f4").tobytes()
    if ggml_type == GGML_F16:
        return a.astype("<f2").tobytes()
    if ggml_type == GGML_BF16:
        return f32_to_bf16(a).astype("<u2").tobytes()
    raise ValueError(f"ggml type {ggml_type} not written by gguf_writer")


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v, arr_type=None):
    if vtype == STRING:
        return _str(v)
    if vtype == ARRAY:
        out = [struct.pack("<IQ", arr_type, len(v))]
        if arr_type == STRING:
            out += [_str(x) for x in v]
        else:
            out.append(np.asarray(v, dtype=np.dtype(_SCALAR[arr_type])).tobytes())
        return b"".join(out)
    return struct.pack(_SCALAR[vtype], v)


class GGUFWriter:
    """kv pairs and tensors, written in the order added.

        w = GGUFWriter()
        w.add("general.architecture", STRING, "llama")
        w.add("tokenizer.ggml.tokens", ARRAY, ["a", "b"], STRING)
        w.add_tensor("token_embd.weight", (vocab, dim), GGML_F16, lambda: array)
        w.write(path)
    """

    def __init__(self, alignment=ALIGN):
        self.kv = []        # (key, type, value, arr_type)
        self.tensors = []   # (name, numpy shape, ggml type, producer)
        self.alignment = alignment
        if alignment != ALIGN:
            self.add("general.alignment", U32, alignment)

    def add(self, key, vtype, value, arr_type=None):
        if any(k == key for k, _, _, _ in self.kv):
            raise ValueError(f"duplicate GGUF key {key}")
        self.kv.append((key, vtype, value, arr_type))

    def add_tensor(self, name, shape, ggml_type, producer):
        """shape in numpy order (rows, cols); producer() -> float array of that
        shape, called at write time so big files stream one tensor at a time."""
        if any(t[0] == name for t in self.tensors):
            raise ValueError(f"duplicate GGUF tensor {name}")
        self.tensors.append((name, tuple(int(s) for s in shape), ggml_type, producer))

    def write(self, path, progress=None):
        head = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))]
        for key, vtype, value, arr_type in self.kv:
            head += [_str(key), struct.pack("<I", vtype), _value(vtype, value, arr_type)]
        off = 0
        sizes = []
        for name, shape, gt, _ in self.tensors:
            head += [_str(name), struct.pack("<I", len(shape)),
                     struct.pack(f"<{len(shape)}Q", *reversed(shape)),  # fastest dimension first
                     struct.pack("<IQ", gt, off)]
            nb = int(np.prod(shape, dtype=np.int64)) * _ITEM[gt]
            sizes.append(nb)
            off += nb + (-nb % self.alignment)
        blob = b"".join(head)
        with open(path, "wb") as f:
            f.write(blob)
            f.write(b"\0" * (-len(blob) % self.alignment))
            for (name, shape, gt, producer), nb in zip(self.tensors, sizes):
                a = np.asarray(producer(), dtype=np.float32)
                if a.shape != shape:
                    raise ValueError(f"tensor {name}: producer gave {a.shape}, declared {shape}")
                data = encode(a, gt)
                assert len(data) == nb
                f.write(data)
                f.write(b"\0" * (-nb % self.alignment))
                if progress:
                    progress(name, nb)


# ---- reader (tests) -------------------------------------------------------------

def read(path):
    """-> (metadata {key: value}, tensors {name: float32 array in numpy order}).

    Supports the types this writer writes; a small honest parser, not a
    validator for untrusted files (the engine has that)."""
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    mv = memoryview(buf)
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from(fmt, mv, pos)
        pos += struct.calcsize(fmt)
        return vals if len(vals) > 1 else vals[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = bytes(mv[pos:pos + n]).decode("utf-8")
        pos += n
        return s

    def value(vt):
        if vt == STRING:
            return string()
        if vt == ARRAY:
            at, n = take("<I"), take("<Q")
            return [value(at) for _ in range(n)]
        return take(_SCALAR[vt])

    if bytes(mv[:4]) != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    version, n_t, n_kv = take("<I"), take("<Q"), take("<Q")
    if version != 3:
        raise ValueError(f"{path}: GGUF version {version}")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        gt, off = take("<I"), take("<Q")
        infos.append((name, tuple(reversed(ne)), gt, off))
    align = meta.get("general.alignment", ALIGN)
    start = pos + (-pos % align)
    tensors = {}
    for name, shape, gt, off in infos:
        n = int(np.prod(shape, dtype=np.int64))
        raw = buf[start + off:start + off + n * _ITEM[gt]]
        if gt == GGML_F32:
            a = raw.view("<f4").astype(np.float32)
        elif gt == GGML_F16:
            a = raw.view("<f2").astype(np.float32)
        elif gt == GGML_BF16:
            a = bf16_to_f32(raw.view("<u2"))
        else:
            raise ValueError(f"{name}: ggml type {gt} not read here")
        tensors[name] = a.reshape(shape)
    return meta, tensors
