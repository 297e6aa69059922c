"""st.py - a small safetensors reader/writer in numpy (F32, F16, BF16, ints).

The format (huggingface/safetensors): an 8-byte little-endian header length N,
then N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {...}}, then the raw little-endian tensor bytes; offsets are
relative to the end of the header. numpy has no bfloat16, so BF16 travels as
uint16 bit patterns: f32_to_bf16 rounds to nearest even, bf16_to_f32 widens.

Writing is streaming: StreamWriter takes the full list of (name, dtype,
shape) first, writes the header, then accepts each tensor's bytes in order,
in as many chunks as the caller likes, so multi-GB checkpoints never sit in
memory.
"""
import json
import os
import struct

import numpy as np

# safetensors dtype name -> (numpy storage dtype, bytes per element)
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # bit patterns
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# our short names -> safetensors names
SHORT = {"f32": "F32", "f16": "F16", "bf16": "BF16"}


def f32_to_bf16(a):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even.

    NaNs stay NaN (quiet bit forced so rounding cannot turn them into inf)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint32)  # a copy we may modify
    nan = np.isnan(a)
    lsb = (u >> 16) & 1
    u += 0x7FFF + lsb  # carries into the exponent when rounding up, as it must
    out = (u >> 16).astype(np.uint16)
    if nan.any():
        out[nan] = ((a.view(np.uint32)[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def bf16_to_f32(h):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    h = np.ascontiguousarray(h, dtype=np.uint16)
    return (h.astype(np.uint32) << 16).view(np.float32)


def encode(a, dtype):
    """float array -> storage array of safetensors dtype ('F32', 'F16', 'BF16')."""
    if dtype == "BF16":
        return f32_to_bf16(a)
    if dtype == "F16":
        return np.asarray(a, dtype=np.float32).astype("<f2")  # IEEE round to nearest even
    return np.asarray(a).astype(DTYPES[dtype])


def decode(raw, dtype):
    """storage array -> float32 (floats) or the integer array itself."""
    if dtype == "BF16":
        return bf16_to_f32(raw)
    if dtype in ("F32", "F16", "F64"):
        return raw.astype(np.float32) if dtype != "F64" else raw
    return raw


# ---- reading ----------------------------------------------------------------

def read_header(path):
    """-> (header dict without __metadata__, metadata dict, data start offset)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        size = os.fstat(f.fileno()).st_size
        if n > size - 8 or n > 100 << 20:
            raise ValueError(f"{path}: header length {n} does not fit the file ({size} bytes)")
        h = json.loads(f.read(n))
    meta = h.pop("__metadata__", {}) or {}
    return h, meta, 8 + n


def read(path, names=None, raw=False):
    """Reads tensors of one .safetensors file -> {name: array}.

    Floats come back as float32 (BF16/F16 widened) unless raw=True, which
    gives the stored arrays (BF16 as uint16). Uses a memory map, so asking for
    a few names of a big file is cheap."""
    h, _, start = read_header(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in h.items():
        if names is not None and name not in names:
            continue
        dt = DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        n = int(np.prod(shape, dtype=np.int64))
        if e - b != n * dt.itemsize or start + e > mm.shape[0]:
            raise ValueError(f"{path}: tensor {name}: offsets {b}..{e} do not match shape {shape}")
        arr = mm[start + b:start + e].view(dt).reshape(shape)
        out[name] = arr if raw else decode(np.array(arr), info["dtype"])
    return out


def read_dir(d, raw=False):
    """Reads every tensor of a Hugging Face folder (single file or sharded)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
    out = {}
    for fn in files:
        out.update(read(os.path.join(d, fn), raw=raw))
    return out


def dtypes_dir(d):
    """{name: safetensors dtype} of every tensor in a folder."""
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            h, _, _ = read_header(os.path.join(d, fn))
            out.update({k: v["dtype"] for k, v in h.items()})
    return out


# ---- writing ----------------------------------------------------------------

class StreamWriter:
    """Writes one .safetensors file whose tensors arrive in order, in chunks.

        w = StreamWriter(path, [(name, "BF16", (rows, cols)), ...], {"format": "pt"})
        w.write(name, storage_array_chunk) ...   # exactly the declared bytes, in order
        w.close()
    """

    def __init__(self, path, specs, metadata=None):
        self.path = path
        self.specs = list(specs)
        header = {}
        if metadata is not None:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        off = 0
        self.sizes = []
        for name, dtype, shape in self.specs:
            nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
            header[name] = {"dtype": dtype, "shape": [int(s) for s in shape],
                            "data_offsets": [off, off + nbytes]}
            self.sizes.append(nbytes)
            off += nbytes
        self.total = off
        js = json.dumps(header, separators=(",", ":")).encode()
        js += b" " * (-len(js) % 8)  # pad so tensor data starts 8-aligned
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(js)))
        self.f.write(js)
        self.i = -1         # tensor being written
        self.left = 0       # its bytes still to come
        self._next()

    def _next(self):
        # moves to the next tensor that still wants bytes (skips empty ones)
        while self.left == 0 and self.i < len(self.specs):
            self.i += 1
            self.left = self.sizes[self.i] if self.i < len(self.specs) else -1

    def write(self, name, chunk):
        if self.i >= len(self.specs) or self.specs[self.i][0] != name:
            raise ValueError(f"{self.path}: expected tensor "
                             f"{self.specs[self.i][0] if self.i < len(self.specs) else '(none)'}, got {name}")
        want = DTYPES[self.specs[self.i][1]]
        chunk = np.ascontiguousarray(chunk)
        if chunk.dtype != want:
            raise ValueError(f"{name}: chunk dtype {chunk.dtype}, expected {want}")
        if chunk.nbytes > self.left:
            raise ValueError(f"{name}: {chunk.nbytes} bytes written past its size")
        self.f.write(chunk.tobytes())
        self.left -= chunk.nbytes
        self._next()

    def close(self):
        if self.i != len(self.specs):
            raise ValueError(f"{self.path}: closed before tensor {self.specs[self.i][0]} was complete")
        self.f.close()


def save(path, tensors, dtype="F32", metadata=None):
    """Writes {name: float array} in one go (small files; tests)."""
    if metadata is None:
        metadata = {"format": "pt"}
    dtype = SHORT.get(dtype, dtype)
    arrs = {k: encode(v, dtype) for k, v in tensors.items()}
    w = StreamWriter(path, [(k, dtype, a.shape) for k, a in arrs.items()], metadata)
    for k, a in arrs.items():
        w.write(k, a)
    w.close()
