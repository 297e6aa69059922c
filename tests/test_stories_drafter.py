#!/usr/bin/env python3
"""test_stories_drafter.py - the committed drafters accept real tokens.

1. models/stories260K-dflash on stories260K (a real trained Llama) over a
   fixed held-out prompt set: the first 6 words of TinyStories documents
   2117..2126 of ../shared/assets/corpus/tinystories_first2MiB.txt (the
   drafter's capture used documents 0..2116 only). Greedy, 96 tokens, block
   8: every speculative output equals the classic output, and the pooled tau
   (tokens per verify round, bonus included) is at least MIN_TAU_STORIES.
   The same with the adaptive block (auto): identical output.
2. models/default (the built-in pair, trained here on Debian's fortunes):
   the target writes text, the drafter's tau at block 8 on fixed prompts is
   at least MIN_TAU_DEFAULT, and blocks 8 and auto give the classic output.

Measured values are in models/README.md; the minimums sit below them with
room for nothing but a broken drafter or loop to fail. Needs the dflash
binary ($DFLASH_BIN or build*/dflash) and, for part 1, the shared assets;
under CI=true their absence is a failure.
"""
import json
import os
import sys

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("DFLASH_SHARED") or os.path.join(os.path.dirname(SRC), "shared")
sys.path.insert(0, os.path.join(SRC, "tools"))
import eval_drafter  # noqa: E402
from testlib import CI, check, finish, missing  # noqa: E402

MIN_TAU_STORIES = 3.0
MIN_TAU_DEFAULT = 3.0


def run_set(binary, model, draft, prompts, n, modes):
    """-> {mode: (texts, pooled stats)}"""
    out = {}
    for mode in modes:
        texts, stats = [], []
        for i, p in enumerate(prompts):
            t, s = eval_drafter.generate(binary, model, draft, p, n, mode, 0.0, 1 + i, 1)
            texts.append(t)
            stats.append(s)
        out[mode] = (texts, eval_drafter.pool(stats))
    return out


def test_stories(binary):
    model = os.path.join(SHARED, "assets", "stories260K", "stories260K.gguf")
    corpus = os.path.join(SHARED, "assets", "corpus", "tinystories_first2MiB.txt")
    draft = os.path.join(SRC, "models", "stories260K-dflash")
    for p in (model, corpus):
        if not os.path.exists(p):
            return missing(p)
    if not check(os.path.exists(os.path.join(draft, "model.safetensors")),
                 f"{draft} is committed"):
        return
    prompts = eval_drafter.prompts_from(corpus, "<|endoftext|>", 2117, 10, 6)
    r = run_set(binary, model, draft, prompts, 96, ["classic", "8", "auto"])
    for mode in ("8", "auto"):
        for i, p in enumerate(prompts):
            check(r[mode][0][i] == r["classic"][0][i],
                  f"stories260K block {mode}, prompt {p!r}: output equals classic decode")
    tau = r["8"][1].get("tau", 0)
    print(f"stories260K block 8: {json.dumps(r['8'][1])}", flush=True)
    check(tau >= MIN_TAU_STORIES, f"stories260K tau {tau} >= {MIN_TAU_STORIES} at block 8")
    acc = r["8"][1].get("acceptance_by_position", [])
    check(len(acc) == 7 and all(a >= b - 0.05 for a, b in zip(acc, acc[1:])),
          f"acceptance falls with the block position: {acc}")


def test_default(binary):
    model = os.path.join(SRC, "models", "default", "target")
    draft = os.path.join(SRC, "models", "default", "draft")
    if not check(os.path.exists(os.path.join(model, "model.safetensors")) and
                 os.path.exists(os.path.join(draft, "model.safetensors")),
                 "models/default/{target,draft} are committed"):
        return
    prompts = ["The best way to", "A man walks into", "Never trust a", "If you can't",
               "Life is", "There are two kinds of"]
    r = run_set(binary, model, draft, prompts, 64, ["classic", "8", "auto"])
    for mode in ("8", "auto"):
        for i, p in enumerate(prompts):
            check(r[mode][0][i] == r["classic"][0][i],
                  f"default pair, block {mode}, prompt {p!r}: output equals classic decode")
    check(all(len(t.strip()) > 0 for t in r["classic"][0]), "the default target writes text")
    tau = r["8"][1].get("tau", 0)
    print(f"default pair (block 8): {json.dumps(r['8'][1])}", flush=True)
    check(tau >= MIN_TAU_DEFAULT, f"default pair tau {tau} >= {MIN_TAU_DEFAULT}")


def main():
    import dumpcmp
    binary = dumpcmp.find_bin()
    if not binary:
        missing("the dflash binary ($DFLASH_BIN)")
    else:
        test_stories(binary)
        test_default(binary)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
