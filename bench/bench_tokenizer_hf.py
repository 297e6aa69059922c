#!/usr/bin/env python3
"""bench_tokenizer_hf.py - Hugging Face's Rust tokenizers (the `tokenizers`
package of the project venv) on the same files as bench_tokenizer, one
thread, for a side-by-side; with --ids OURS.json (written by bench_tokenizer
--ids) it also checks that both produce the same ids.

    RAYON_NUM_THREADS=1 build/venv/bin/python bench/bench_tokenizer_hf.py \
        TOKENIZER_DIR [--ids F] [--lines] FILE...

--lines also times encode_batch over the file's lines (one rayon thread), in
case one long string is a slow path for Hugging Face. Times are best of 5, in
process CPU time and wall time. Text is cut to 1 MiB on a
character boundary, as bench_tokenizer does.
"""
import argparse
import json
import os
import re
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
from tokenizers import Tokenizer  # noqa: E402


def read_text(path):
    b = open(path, "rb").read()
    n = min(len(b), 1 << 20)
    while 0 < n < len(b) and (b[n] & 0xC0) == 0x80:
        n -= 1
    return b[:n].decode("utf-8")


def best_of(runs, fn):
    cpu = wall = float("inf")
    out = None
    for _ in range(runs):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        cpu = min(cpu, time.process_time() - c0)
        wall = min(wall, time.perf_counter() - t0)
    return out, cpu, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--ids")
    ap.add_argument("--lines", action="store_true")
    a = ap.parse_args()
    path = os.path.join(a.dir, "tokenizer.json")
    tok, load, _ = best_of(3, lambda: Tokenizer.from_file(path))
    print(f"tokenizer {a.dir}: load {load * 1e3:.1f} ms (best of 3, process CPU time)")
    ours = json.load(open(a.ids)) if a.ids else None
    for f in a.files:
        text = read_text(f)
        nbytes = len(text.encode())
        enc, cpu, wall = best_of(5, lambda: tok.encode(text, add_special_tokens=False))
        ids = enc.ids
        same = ""
        if ours and f in ours:
            o = ours[f]
            i = next((k for k, (x, y) in enumerate(zip(o, ids)) if x != y), min(len(o), len(ids)))
            same = (", ids identical to ours" if i == len(o) == len(ids) else
                    f", ids DIFFER from ours at {i}")
        print(f"{f}: {nbytes} bytes -> {len(ids)} ids; encode {nbytes / cpu / 1e6:.2f} MB/s CPU, "
              f"{nbytes / wall / 1e6:.2f} MB/s wall{same}")
        if a.lines:
            parts = re.split(r"(?<=\n)", text)
            encs, lc, lw = best_of(3, lambda: tok.encode_batch(parts, add_special_tokens=False))
            n = sum(len(e.ids) for e in encs)
            print(f"  as {len(parts)} lines (encode_batch): {n} ids; {nbytes / lc / 1e6:.2f} MB/s CPU, "
                  f"{nbytes / lw / 1e6:.2f} MB/s wall")


if __name__ == "__main__":
    main()
