#!/usr/bin/env python3
"""test_train.py - drafter training (tools/train_dflash.py) and dflash capture.

1. The trainer's batched forward on a toy batch (GQA, overlapping blocks)
   against a direct computation: tools/reference.py's float64 draft call run
   once per anchor with ONLY the context rows < anchor and the anchor's own
   block (spec section 3). Equal within 1e-4 x max(1, max |ref|) means each
   block row saw exactly context < anchor plus its own block. The mask
   itself against loops; perturbing context rows >= an anchor, or other
   blocks' anchor tokens, leaves that block's logits unchanged.
2. The loss against a direct numpy computation (weighted cross-entropy on
   rows 1..B-1 with exp(-(k-1)/gamma), per-position accuracy, accepted
   prefix); batches (anchor range, labels, prompt rows); a short training
   run lowers the loss; a run stopped and resumed from its checkpoint ends
   with the same weights as an uninterrupted one.
3. With the engine: `dflash capture` on a random Llama folder (text and
   generate modes): the layout, the embedding table byte-exact, the
   features against the numpy reference. Then the round trip: a drafter
   written by the trainer loads in the engine (`dflash dump --draft`), and
   its block logits equal the trainer's own forward on the captured
   features within 1e-4 x max(1, max |ref|), with the same argmax.

Without $DFLASH_BIN (and no build*/dflash) part 3 is skipped unless CI=true.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from testlib import CI, check, finish, missing  # noqa: E402

SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "tools"))

try:
    import torch
except ImportError:
    torch = None


def close(ref, got, rel, what):
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    tol = rel * max(1.0, float(np.abs(ref).max()))
    d = float(np.abs(ref - got).max())
    return check(d <= tol, f"{what}: max |diff| {d:.3g} > {tol:.3g}")


TOY = {"dim": 32, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 8, "ffn": 48,
       "target_layer_ids": [0, 2], "eps": 1e-6, "rope_theta": 10000.0, "block_size": 4,
       "mask_id": 49}


def randomize(model, seed):
    """Weights far from init so a wrong term shows (norm weights included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


class FakeCapture:
    """What Capture provides, in memory."""

    def __init__(self, tokens, seqs, features, embed, lm_head, n_layers=3, max_ctx=64):
        self.tokens, self.seqs, self.features = tokens, np.asarray(seqs, np.int32), features
        self.embed, self.lm_head = embed, lm_head
        self.tied = lm_head is embed
        self.vocab, self.dim = embed.shape
        self.layers = list(range(features.shape[1]))
        self.meta = {"dim": self.dim, "n_layers": n_layers, "max_ctx": max_ctx,
                     "vocab": self.vocab, "bos_id": 1, "mode": "text", "model": "toy"}


def toy_capture(rng, V=50, D=32, K=3, lens=((12, 1), (14, 3))):
    seqs, start = [], 0
    for n, p in lens:
        seqs.append((start, n, p))
        start += n
    tokens = rng.integers(0, V - 1, size=start).astype(np.int32)
    feat = rng.standard_normal((start, K, D)).astype(np.float32)
    E = rng.standard_normal((V, D)).astype(np.float32)
    H = rng.standard_normal((V, D)).astype(np.float32)
    return FakeCapture(tokens, seqs, feat, E, H)


# ---- 1. forward and mask ----------------------------------------------------------

def test_forward_vs_direct():
    import reference as R
    import train_dflash as T
    rng = np.random.default_rng(5)
    cap = toy_capture(rng)
    model = T.Drafter(TOY)
    randomize(model, 1)
    B, cols = TOY["block_size"], [0, 2]
    anchors = [np.array([1, 5, 9]), np.array([3, 4, 8])]   # overlapping blocks in seq 1
    b = T.make_batch(cap, [0, 1], 3, B, None, 64, cols, anchors)
    E, H = torch.from_numpy(cap.embed), torch.from_numpy(cap.lm_head)
    with torch.no_grad():
        got = model(b["feat"], b["ids"], b["anchors"], E, H, TOY["mask_id"], B).numpy()
    check(got.shape == (2, 3, B - 1, cap.vocab), f"logits shape {got.shape}")
    with tempfile.TemporaryDirectory() as d:
        zcfg = T.export(model, cap, d)
        dcfg, DW = R.load_drafter(d)
    check(zcfg["dflash_config"] == {"mask_token_id": 49, "target_layer_ids": [0, 2]},
          "exported dflash_config")
    tcfg = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 3,
            "intermediate_size": 48, "vocab_size": cap.vocab, "tie_word_embeddings": False}
    TW = {"model.embed_tokens.weight": cap.embed.astype(np.float64),
          "lm_head.weight": cap.lm_head.astype(np.float64)}
    for s in range(2):
        a0 = cap.seqs[s, 0]
        feat = cap.features[a0:a0 + cap.seqs[s, 1]][:, cols].reshape(cap.seqs[s, 1], -1)
        ids = cap.tokens[a0:a0 + cap.seqs[s, 1]]
        for j, a in enumerate(anchors[s]):
            ref = R.draft_forward(dcfg, DW, tcfg, TW, feat[:a], np.arange(a), int(ids[a]), a, B)
            close(ref, got[s, j], 1e-4, f"seq {s} anchor {a}: trainer block vs a direct draft "
                  "call on context < anchor")
    # shortened blocks (--block-mix): a block of l rows drafts as inference drafts l rows
    blen = torch.tensor([[4, 2, 3], [3, 4, 2]])
    with torch.no_grad():
        got_l = model(b["feat"], b["ids"], b["anchors"], E, H, TOY["mask_id"], B, blen).numpy()
    for s in range(2):
        a0 = cap.seqs[s, 0]
        feat = cap.features[a0:a0 + cap.seqs[s, 1]][:, cols].reshape(cap.seqs[s, 1], -1)
        ids = cap.tokens[a0:a0 + cap.seqs[s, 1]]
        for j, a in enumerate(anchors[s]):
            L = int(blen[s, j])
            ref = R.draft_forward(dcfg, DW, tcfg, TW, feat[:a], np.arange(a), int(ids[a]), a, L)
            close(ref, got_l[s, j, :L - 1], 1e-4, f"seq {s} anchor {a}: block of {L} rows vs a "
                  f"direct draft call with B={L}")
    # the mask, against loops
    an = b["anchors"]
    m = T.block_mask(an, 14, B).numpy()
    want = np.zeros_like(m)
    for s in range(2):
        for j in range(3):
            for r in range(B):
                for t in range(14):
                    want[s, j, r, t] = t < int(an[s, j])
    check(np.array_equal(m, want), "block_mask(s, a, row, t) == (t < anchor)")
    # what a block must not see: context rows >= its anchor, other blocks' tokens
    feat2, ids2 = b["feat"].clone(), b["ids"].clone()
    feat2[1, 4:] += 3.0
    ids2[1, 8] = (ids2[1, 8] + 7) % 49
    with torch.no_grad():
        got2 = model(feat2, ids2, b["anchors"], E, H, TOY["mask_id"], B).numpy()
    check(np.abs(got2[1, :2] - got[1, :2]).max() <= 1e-6,
          "blocks at anchors 3 and 4 ignore context rows >= 4 and the block at 8")
    check(np.abs(got2[1, 2] - got[1, 2]).max() > 1e-3, "the block at 8 sees rows 4..7")
    check(np.array_equal(got2[0], got[0]), "sequences are independent")


# ---- 2. loss, batches, training -------------------------------------------------

def test_loss():
    import train_dflash as T
    rng = np.random.default_rng(2)
    S, A, Bm1, V = 2, 3, 5, 11
    logits = rng.standard_normal((S, A, Bm1, V)).astype(np.float32)
    labels = rng.integers(0, V, size=(S, A, Bm1))
    labels[0, 1, 3:] = -1          # a block running past the sequence end
    labels[1, 2, :] = -1           # a padding anchor
    labels[1, 0, :2] = logits[1, 0, :2].argmax(-1)    # accepted prefix of 2
    labels[0, 0, :] = logits[0, 0].argmax(-1)         # all accepted
    for gamma in (0.0, 7.0):
        loss, acc, accepted = T.loss_and_stats(torch.from_numpy(logits), torch.from_numpy(labels),
                                               gamma)
        num = den = 0.0
        for s in range(S):
            for a in range(A):
                for k in range(1, Bm1 + 1):
                    y = labels[s, a, k - 1]
                    if y < 0:
                        continue
                    lg = logits[s, a, k - 1].astype(np.float64)
                    ce = math.log(np.exp(lg - lg.max()).sum()) + lg.max() - lg[y]
                    w = math.exp(-(k - 1) / gamma) if gamma > 0 else 1.0
                    num, den = num + w * ce, den + w
        check(abs(loss.item() - num / den) < 1e-5, f"loss gamma={gamma}: {loss.item()} vs "
              f"{num / den}")
    hit = (logits.argmax(-1) == labels) & (labels >= 0)
    want_acc = hit.sum((0, 1)) / np.maximum((labels >= 0).sum((0, 1)), 1)
    close(want_acc, acc.numpy(), 1e-6, "per-position accuracy")
    full = (labels >= 0).all(-1)
    pre = np.cumprod(hit, -1).sum(-1)
    check(abs(accepted - pre[full].mean()) < 1e-6, f"accepted prefix {accepted} vs "
          f"{pre[full].mean()}")
    check(pre[0, 0] == Bm1 and pre[1, 0] >= 2, "prefix counts")


def test_batches():
    import train_dflash as T
    rng = np.random.default_rng(3)
    cap = toy_capture(rng, lens=((12, 1), (14, 6), (9, 4)))
    b = T.make_batch(cap, [0, 1, 2], 5, 4, np.random.default_rng(0), 64, [0, 1])
    for s in range(3):
        a0, n, npr = cap.seqs[s]
        ids = cap.tokens[a0:a0 + n]
        for j in range(5):
            a = int(b["anchors"][s, j])
            lab = b["labels"][s, j].numpy()
            if (lab < 0).all():
                continue
            check(max(1, npr) <= a <= n - 2, f"seq {s}: anchor {a} in {max(1, npr)}..{n - 2}")
            for k in range(1, 4):
                want = ids[a + k] if a + k < n else -1
                check(lab[k - 1] == want, f"seq {s} anchor {a} label {k}")
    check(b["feat"].shape == (3, 14, 2 * cap.dim), "feat packs the chosen layers")
    bm = T.make_batch(cap, [0, 1, 2], 5, 6, np.random.default_rng(1), 64, [0, 1], mix=0.5)
    bl, lab = bm["blen"].numpy(), bm["labels"].numpy()
    check(((bl == 6) | ((bl >= 2) & (bl <= 5))).all() and (bl < 6).any() and (bl == 6).any(),
          f"block lengths with mix 0.5: {bl.tolist()}")
    check(all((lab[s, j, bl[s, j] - 1:] == -1).all() for s in range(3) for j in range(5)),
          "no labels past a shortened block")
    check(torch.equal(b["feat"][1, :14].reshape(14, 2, -1),
                      torch.from_numpy(cap.features[12:26][:, [0, 1]])), "feat rows")
    # two captures read as one: sequence 4 is the second capture's sequence 1;
    # the second captured layers 3, 2, 0 (in that order)
    cap2 = toy_capture(np.random.default_rng(9), lens=((7, 1), (10, 2)))
    cap2.embed, cap2.layers = cap.embed, [3, 2, 0]
    both = T.Captures([cap, cap2])
    b2 = T.make_batch(both, [4, 0], 2, 4, np.random.default_rng(0), 64, [0, 2])
    check(both.layers == [0, 2] and len(both.seqs) == 5, "layers both captured")
    check(torch.equal(b2["ids"][0, :10], torch.from_numpy(cap2.tokens[7:17]).long()) and
          torch.equal(b2["feat"][0, :10].reshape(10, 2, -1),
                      torch.from_numpy(cap2.features[7:17][:, [2, 1]])) and
          torch.equal(b2["feat"][1, :12].reshape(12, 2, -1),
                      torch.from_numpy(cap.features[0:12][:, [0, 2]])), "two captures as one")


def write_capture(d, cap):
    """A capture folder as dflash capture writes it."""
    os.makedirs(d, exist_ok=True)
    cap.tokens.astype("<i4").tofile(os.path.join(d, "tokens.i32"))
    cap.seqs.astype("<i4").tofile(os.path.join(d, "seqs.i32"))
    cap.features.astype("<f4").tofile(os.path.join(d, "features.f32"))
    cap.embed.astype("<f4").tofile(os.path.join(d, "embed.f32"))
    cap.lm_head.astype("<f4").tofile(os.path.join(d, "lm_head.f32"))
    meta = dict(cap.meta, format="dflash-capture", version=1, arch="llama",
                layers=cap.layers, n_seqs=len(cap.seqs), n_rows=len(cap.tokens),
                files={"tokens": "tokens.i32", "seqs": "seqs.i32", "features": "features.f32",
                       "embed": "embed.f32", "lm_head": "lm_head.f32"})
    with open(os.path.join(d, "capture.json"), "w") as f:
        json.dump(meta, f)


def learnable_capture(rng, n_seqs=24, n=40, V=50, D=32):
    """Tokens the features predict: token t+1 is a fixed function of token t,
    whose embedding the features carry, so a drafter can learn it."""
    perm = rng.permutation(V - 1)
    E = rng.standard_normal((V, D)).astype(np.float32)
    toks, seqs = [], []
    for s in range(n_seqs):
        t = [int(rng.integers(0, V - 1))]
        for _ in range(n - 1):
            t.append(int(perm[t[-1]]))
        seqs.append((s * n, n, 1))
        toks += t
    tokens = np.array(toks, np.int32)
    feat = np.stack([E[tokens], E[tokens] * 0.5, -E[tokens]], 1).astype(np.float32)
    return FakeCapture(tokens, seqs, feat, E, E.copy())


def test_training_and_resume():
    import train_dflash as T
    rng = np.random.default_rng(4)
    cap = learnable_capture(rng)
    with tempfile.TemporaryDirectory() as d:
        cd = os.path.join(d, "cap")
        write_capture(cd, cap)
        args = ["--capture", cd, "--block-size", "4", "--mask-id", "49", "--layers", "1",
                "--heads", "2", "--batch", "4", "--anchors", "8", "--lr", "1e-2", "--warmup", "5",
                "--log-every", "5", "--eval-every", "1000", "--val-frac", "0.1"]
        full, part = os.path.join(d, "full"), os.path.join(d, "part")
        T.main(args + ["--out", full, "--steps", "40", "--ckpt-every", "20"])
        log = open(os.path.join(full, "train_log.txt")).read().splitlines()
        losses = [float(x.split()[3]) for x in log if x.startswith("step")]
        check(losses[-1] < 0.5 * losses[0], f"training lowers the loss: {losses[0]} -> "
              f"{losses[-1]}")
        check(any(x.startswith("eval") for x in log), "an eval line at the end")
        T.main(args + ["--out", part, "--steps", "40", "--ckpt-every", "20"] + ["--stop-at", "20"])
        T.main(args + ["--out", part, "--steps", "40", "--ckpt-every", "20", "--resume"])
        import make_checkpoint as mc
        a, b = mc.load_dir(full), mc.load_dir(part)
        check(sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a),
              "stopped at 20 and resumed == 40 steps straight (bit-identical weights)")
        cfg = json.load(open(os.path.join(full, "config.json")))
        check(cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4 and
              cfg["dflash_config"]["target_layer_ids"] == [0, 1, 2] and
              cfg["num_target_layers"] == 3, "z-lab config.json")


def test_loss_vocab_and_keep_best():
    """--loss-vocab seen: the training softmax over the ids the capture holds,
    while the eval lines (and inference) rank the whole vocabulary; --keep-best
    writes the drafter of the best held-out tau~."""
    import torch
    import train_dflash as T
    rng = np.random.default_rng(5)
    cap = learnable_capture(rng)
    extra = rng.standard_normal((70, cap.embed.shape[1])).astype(np.float32)  # never occur
    cap.embed = np.concatenate([cap.embed, extra])
    cap.lm_head = cap.embed.copy()
    cap.vocab = len(cap.embed)
    cap.meta = dict(cap.meta, vocab=cap.vocab)
    seen = np.unique(cap.tokens)
    lv = T.loss_vocab(cap, "seen")
    check(np.array_equal(lv[0], seen) and len(lv[1]) == cap.vocab - len(seen) and
          not np.isin(lv[1], seen).any(), "loss_vocab: the seen ids and the rest")
    Ht, lut = T.step_vocab(torch.from_numpy(cap.lm_head), lv, 20, np.random.default_rng(0))
    ids = np.flatnonzero(lut.numpy() >= 0)
    check(len(Ht) == len(seen) + 20 and np.isin(seen, ids).all() and
          np.array_equal(Ht.numpy()[lut.numpy()[ids]], cap.lm_head[ids]),
          "a step's softmax: every seen id and 20 others, each id mapped to its row")
    check(T.loss_vocab(cap, "all") is None, "all: the whole vocabulary")
    with tempfile.TemporaryDirectory() as d:
        cd, out = os.path.join(d, "cap"), os.path.join(d, "out")
        write_capture(cd, cap)
        T.main(["--capture", cd, "--block-size", "4", "--mask-id", "49", "--layers", "1",
                "--heads", "2", "--batch", "4", "--anchors", "8", "--lr", "1e-2", "--warmup", "5",
                "--log-every", "10", "--eval-every", "20", "--val-frac", "0.1", "--steps", "160",
                "--loss-vocab", "seen", "--loss-negatives", "20", "--keep-best", "--out", out])
        log = open(os.path.join(out, "train_log.txt")).read().splitlines()
        check(any(f"over the {len(seen)} ids" in x for x in log), "the log names the subset")
        evals = [x for x in log if x.startswith("eval")]
        acc0 = float(evals[-1].split("|")[1].split()[1])
        check(acc0 > 0.8, f"the whole vocabulary's argmax after training on the subset: "
              f"position 1 accuracy {acc0}")
        taus = [float(x.split("tau~")[1]) for x in evals]
        wrote = [int(x.split()[6]) for x in log if x.startswith("# wrote the drafter of step")]
        best_step = 20 * (1 + max(range(len(taus)), key=lambda i: (taus[i], -i)))
        check(wrote and wrote[-1] == best_step and os.path.exists(
              os.path.join(out, "model.safetensors")), f"--keep-best: written at {wrote}, "
              f"best held-out tau~ at step {best_step} ({taus})")


def test_watch():
    """--watch: a capture that finishes while training runs joins the
    training sequences; one still being written (no capture.json) waits."""
    import train_dflash as T
    rng = np.random.default_rng(8)
    with tempfile.TemporaryDirectory() as d:
        caps = [learnable_capture(rng, n_seqs=6) for _ in range(3)]
        for k, c in enumerate(caps):   # one target: the same tables
            c.embed, c.lm_head = caps[0].embed, caps[0].lm_head
            write_capture(os.path.join(d, f"cap{k}"), c)
        os.remove(os.path.join(d, "cap2", "capture.json"))
        out = os.path.join(d, "out")
        T.main(["--capture", os.path.join(d, "cap0"), "--watch", os.path.join(d, "cap*"),
                "--block-size", "4", "--mask-id", "49", "--layers", "1", "--heads", "2",
                "--batch", "4", "--anchors", "4", "--steps", "6", "--eval-every", "3",
                "--log-every", "3", "--val-frac", "0.2", "--out", out])
        log = open(os.path.join(out, "train_log.txt")).read()
        check(log.count("# added") == 1 and "cap1: 6 sequences, 240 rows" in log,
              "the finished capture joined once, the unfinished one did not")


# ---- 3. with the engine ---------------------------------------------------------

CORPUS_WORDS = ("the a little dog cat ran saw big red ball tree house and to with she he "
                "happy sad day one play went home mom said").split()


def make_corpus(path, rng, docs=12):
    with open(path, "w") as f:
        for i in range(docs):
            words = rng.choice(CORPUS_WORDS, size=int(rng.integers(8, 40)))
            f.write(" ".join(words).capitalize() + ".\n<|endoftext|>\n")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, f"{' '.join(cmd)} exits 0: {r.stderr.strip()[-1500:]}"):
        return None
    return r


def test_engine(binary):
    import dumpcmp
    import make_checkpoint as mc
    import reference as R
    import train_dflash as T
    rng = np.random.default_rng(6)
    with tempfile.TemporaryDirectory() as d:
        tgt, corpus = os.path.join(d, "target"), os.path.join(d, "corpus.txt")
        mc.make_target(tgt, arch="llama", dim=64, layers=4, heads=4, kv_heads=2, ffn=128,
                       vocab=512, dtype="f32", seed=3, quiet=True)
        make_corpus(corpus, rng)
        cap_t = os.path.join(d, "cap_text")
        # f32 K/V here and in the dump below: the trainer's forward keeps f32
        if not run([binary, "capture", "-m", tgt, "--corpus", corpus, "--out", cap_t,
                    "--layers", "1,2", "--seq-len", "24", "-t", "1", "-q", "--kv-type", "f32"]):
            return
        r = subprocess.run([binary, "capture", "-m", tgt, "--corpus", corpus, "--out",
                            os.path.join(d, "bad"), "--layers", "1,4"], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode != 0 and "layer 4 outside 0..3" in r.stderr,
              f"capture refuses a layer the target lacks: {r.stderr.strip()[:200]}")
        r = subprocess.run([binary, "capture", "-m", tgt, "--corpus", os.path.join(d, "none.txt"),
                            "--out", os.path.join(d, "bad")], capture_output=True, text=True,
                           timeout=60)
        check(r.returncode != 0 and "none.txt" in r.stderr, "capture names a missing corpus")
        cap = T.load_capture(cap_t)
        m = cap.meta
        check(m["mode"] == "text" and m["layers"] == [1, 2] and m["dim"] == 64 and
              m["vocab"] == 512 and m["n_layers"] == 4, "capture.json fields")
        check(bool((cap.seqs[:, 1] <= 24).all()) and cap.seqs[0, 0] == 0 and
              bool((np.diff(cap.seqs[:, 0]) == cap.seqs[:-1, 1]).all()),
              "sequences tile the rows, at most --seq-len each")
        W = mc.load_dir(tgt)
        check(cap.tied and np.array_equal(cap.embed, W["model.embed_tokens.weight"]),
              "embed.f32 is the target's table, byte-exact; tied: no lm_head.f32")
        cfg, W64 = R.load(tgt)
        for s in range(min(3, len(cap.seqs))):
            a0, n = cap.seqs[s, :2]
            ids = cap.tokens[a0:a0 + n]
            _, hid = R.forward(cfg, W64, ids)
            close(hid[[1, 2]].transpose(1, 0, 2), cap.features[a0:a0 + n], 1e-3,
                  f"captured features of sequence {s} vs the numpy reference")
        cap_g = os.path.join(d, "cap_gen")
        if not run([binary, "capture", "-m", tgt, "--corpus", corpus, "--out", cap_g,
                    "--layers", "1,2", "--generate", "10", "--prompt-tokens", "3:5",
                    "--max-docs", "5", "-t", "1", "-q"]):
            return
        g = T.load_capture(cap_g)
        check(len(g.seqs) == 5 and bool(((g.seqs[:, 2] >= 3) & (g.seqs[:, 2] <= 5)).all()) and
              bool((g.seqs[:, 1] <= g.seqs[:, 2] + 10).all()), "generate mode: prompt rows and "
              "continuation lengths")
        # --parallel: documents generated at once share forwards, and the files are
        # byte-identical to one at a time (document order, per-document streams)
        for mode in (["--generate", "10", "--prompt-tokens", "3:5"], ["--seq-len", "9"]):
            outs = []
            for np_ in ("1", "3"):
                o = os.path.join(d, f"cap_np{np_}")
                shutil.rmtree(o, ignore_errors=True)
                if not run([binary, "capture", "-m", tgt, "--corpus", corpus, "--out", o,
                            "--layers", "1,2", "--max-docs", "7", "--max-rows", "40", "-t", "1",
                            "-np", np_, "-q"] + mode):
                    return
                outs.append([open(os.path.join(o, f), "rb").read()
                             for f in ("tokens.i32", "seqs.i32", "features.f32")])
            check(outs[0] == outs[1] and len(outs[0][1]) > 0,
                  f"capture {mode[0]} with --parallel 3 writes what --parallel 1 writes")
        a0, n, npr = (int(x) for x in g.seqs[0])
        ids = g.tokens[a0:a0 + n]
        logits, _ = R.forward(cfg, W64, ids)
        top2 = np.sort(logits, -1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0])[npr - 1:n - 1] > 1e-3
        check(np.array_equal(logits.argmax(-1)[npr - 1:n - 1][clear], ids[npr:][clear]),
              "the continuation is the target's greedy choice")

        # round trip: trainer forward == engine drafter on the same features
        B = 6
        cfg_d = dict(TOY, dim=64, head_dim=16, heads=4, kv_heads=2, ffn=96,
                     target_layer_ids=[1, 2], block_size=B, mask_id=511)
        model = T.Drafter(cfg_d)
        randomize(model, 7)
        dd = os.path.join(d, "drafter")
        T.export(model, cap, dd)
        for s in range(min(2, len(cap.seqs))):
            a0, n = (int(x) for x in cap.seqs[s, :2])
            ids = cap.tokens[a0:a0 + n]
            b = T.make_batch(cap, [s], 1, B, None, 64, [1, 2], [np.array([n - 1])])
            with torch.no_grad():
                want = model(b["feat"], b["ids"], b["anchors"], torch.from_numpy(cap.embed),
                             torch.from_numpy(cap.lm_head), 511, B).numpy()[0, 0]
            _, _, dl = dumpcmp.run_dump(binary, tgt, ids.tolist(), 512, 64, draft=dd, block=B,
                                        kv_type="f32")
            close(want, dl, 1e-4, f"sequence {s} ({n} rows): engine drafter logits vs the "
                  "trainer's forward")
            check(np.array_equal(want.argmax(-1), dl.argmax(-1)), "same draft tokens")


def main():
    if torch is None:
        missing("torch")
        return finish()
    torch.set_num_threads(1)
    test_forward_vs_direct()
    test_loss()
    test_batches()
    test_training_and_resume()
    test_loss_vocab_and_keep_best()
    test_watch()
    import dumpcmp
    binary = dumpcmp.find_bin()
    if binary:
        test_engine(binary)
    else:
        missing("the dflash binary ($DFLASH_BIN)")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
