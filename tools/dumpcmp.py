#!/usr/bin/env python3
"""dumpcmp.py - runs `dflash dump` and compares it with tools/reference.py.

    dumpcmp.py --model DIR --ids 1,2,3 [--capture 0,2] [--draft DDIR --draft-block B]

Prints the largest differences and exits non-zero when they exceed the
tolerance the reference tests use (see compare). The tests import
find_bin / run_dump / compare from here.

dump's files (raw little-endian float32): --out holds logits (n, vocab), then
features (n, n_cap, dim) in --capture order; --out-draft holds the drafter's
logits (B-1, vocab) of block rows 1..B-1, drafted from the features of rows
0..n-2 with anchor ids[n-1] at position n-1.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_bin():
    """$DFLASH_BIN, else the newest build*/dflash in the source tree, else None."""
    b = os.environ.get("DFLASH_BIN")
    if b:
        return b if os.access(b, os.X_OK) else None
    cands = [p for p in glob.glob(os.path.join(SRC, "build*", "dflash")) if os.access(p, os.X_OK)]
    return max(cands, key=os.path.getmtime) if cands else None


def run_dump(binary, model, ids, vocab, dim, capture=(), draft=None, block=None, timeout=120,
             kv_type="f16"):
    """-> (logits (n, vocab), feat (n, n_cap, dim) or None, draft logits (B-1, vocab) or None).

    Raises RuntimeError with dump's stderr when it fails or writes the wrong size."""
    n = len(ids)
    with tempfile.TemporaryDirectory(prefix="dumpcmp-") as tmp:
        out, outd = os.path.join(tmp, "logits.bin"), os.path.join(tmp, "draft.bin")
        cmd = [binary, "dump", "--model", model, "--ids", ",".join(map(str, ids)), "--out", out,
               "--kv-type", kv_type]
        if capture:
            cmd += ["--capture", ",".join(map(str, capture))]
        if draft:
            cmd += ["--draft", draft, "--draft-block", str(block), "--out-draft", outd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\nexit {r.returncode}: {r.stderr.strip()[-2000:]}")
        raw = np.fromfile(out, dtype="<f4")
        want = n * vocab + n * len(capture) * dim
        if raw.size != want:
            raise RuntimeError(f"{out}: {raw.size} floats, expected {want} "
                               f"(n={n}, vocab={vocab}, capture={list(capture)}, dim={dim})")
        logits = raw[:n * vocab].reshape(n, vocab)
        feat = raw[n * vocab:].reshape(n, len(capture), dim) if capture else None
        dl = None
        if draft:
            dl = np.fromfile(outd, dtype="<f4")
            if dl.size != (block - 1) * vocab:
                raise RuntimeError(f"{outd}: {dl.size} floats, expected {(block - 1) * vocab}")
            dl = dl.reshape(block - 1, vocab)
    return logits, feat, dl


def compare(ref, got, rel=1e-3):
    """-> (ok, message). Tolerance: max |got - ref| <= rel * max(1, max |ref|);
    and for 2-D logits, the argmax of every row whose reference top-2 margin
    exceeds twice that tolerance must match."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        return False, f"shape {got.shape}, expected {ref.shape}"
    if not np.all(np.isfinite(got)):
        return False, f"{int(np.sum(~np.isfinite(got)))} non-finite values"
    tol = rel * max(1.0, float(np.abs(ref).max()))
    diff = np.abs(got - ref)
    worst = np.unravel_index(int(diff.argmax()), diff.shape)
    msg = f"max abs diff {diff.max():.3g} at {tuple(int(i) for i in worst)} (tol {tol:.3g})"
    ok = diff.max() <= tol
    if ref.ndim == 2 and ref.shape[1] > 1:
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * tol
        bad = clear & (ref.argmax(1) != got.argmax(1))
        if bad.any():
            ok = False
            msg += f"; argmax differs in rows {np.nonzero(bad)[0].tolist()}"
        msg += f"; {int(clear.sum())}/{len(clear)} rows with a clear argmax"
    return ok, msg


def main(argv=None):
    ap = argparse.ArgumentParser(description="dflash dump vs the numpy reference")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--capture")
    ap.add_argument("--draft")
    ap.add_argument("--draft-block", type=int)
    ap.add_argument("--bin", help="dflash binary (default $DFLASH_BIN or build*/dflash)")
    ap.add_argument("--kv-type", choices=("f16", "f32"), default="f16")
    a = ap.parse_args(argv)
    binary = a.bin or find_bin()
    if not binary:
        sys.exit("dumpcmp: no dflash binary (set DFLASH_BIN or pass --bin)")
    ids = [int(x) for x in a.ids.split(",")]
    cap = [int(x) for x in a.capture.split(",")] if a.capture else []
    dm = reference.dims(reference.read_config(a.model))
    block = a.draft_block
    if a.draft and not block:
        block = reference.read_config(a.draft).get("block_size", 16)
    ref = reference.dump(a.model, ids, cap, a.draft, block, a.kv_type == "f16")
    got = run_dump(binary, a.model, ids, dm["vocab"], dm["dim"], cap, a.draft, block,
                   kv_type=a.kv_type)
    ok = True
    for what, r, g in zip(("logits", "features", "draft logits"), ref, got):
        if r is None:
            continue
        good, msg = compare(r, g)
        ok &= good
        print(f"{what}: {'ok' if good else 'FAIL'}: {msg}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
