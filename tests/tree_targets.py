#!/usr/bin/env python3
"""tree_targets.py - the transformers-made targets test_tree grows draft trees on:
sliding-window and recurrent layers.

    tree_targets.py OUT

For each of test_hf_oracle's laguna-yarn-perhead-moe (a full layer, then three
sliding layers of window 8 with their own head counts and RoPE, MoE),
qwen35-hybrid-untied (gated DeltaNet and gated full attention) and
qwen35moe-hybrid (the same mixers, MoE MLPs), as transformers writes them:
  OUT/NAME-f32      the target (float32);
  OUT/NAME-few      the same with every lm_head row but the first two zeroed:
                    greedy ids fall in 0..2, so a random drafter's drafts are
                    often right and trees accept paths (test_laguna_drafter's
                    few-token target);
  OUT/NAME-draft    a random DFlash drafter of block 16 for it (Laguna's own
                    kind for Laguna).
Exits 77 (a skip; testlib's rule makes it a failure under CI=true) without
torch / transformers.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_hf_oracle as o  # noqa: E402
from testlib import finish  # noqa: E402

TOOLS = os.path.join(HERE, "..", "tools")
NAMES = ("laguna-yarn-perhead-moe", "qwen35-hybrid-untied", "qwen35moe-hybrid")
LAGUNA_DRAFTER = ["--layers", "2", "--heads", "8", "--kv-heads", "2", "--head-dim", "16",
                  "--ffn", "96", "--block-size", "16", "--layer-ids", "0,2",
                  "--sliding-window", "16", "--seed", "3"]


def few_token(src, out, keep=2):
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, out)
    f = os.path.join(out, "model.safetensors")
    sd = load_file(f)
    sd["lm_head.weight"][keep:] = 0
    save_file(sd, f, metadata={"format": "pt"})


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    if not o.torch_ready():
        return finish()
    for name, cls, kw, seed in o.ARCHS:
        if name not in NAMES:
            continue
        d = o.make_target(out, name, cls, kw, seed)["f32"]
        few_token(d, os.path.join(out, name + "-few"))
        dd = os.path.join(out, name + "-draft")
        if cls == "LagunaConfig":
            cmd = [os.path.join(TOOLS, "make_laguna_drafter.py"), "--target", d, "--out", dd]
            cmd += LAGUNA_DRAFTER
        else:
            cmd = [os.path.join(TOOLS, "make_checkpoint.py"), "--drafter", "--target", d,
                   "--layers", "1", "--ffn", "96", "--block-size", "16", "--quiet", "--out", dd]
        subprocess.run([sys.executable] + cmd, check=True, stdout=subprocess.DEVNULL)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
