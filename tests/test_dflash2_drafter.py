#!/usr/bin/env python3
"""test_dflash2_drafter.py - the DFlash2 drafter (DFlash2DraftModel) on a
transformers-made random Qwen3 target, its checkpoints written by
tools/make_checkpoint.py --drafter --dflash2 in z-lab's / SpecForge's layout.

1. Drafts: a torch reference written here from the published definition
   (SpecForge's specforge/modeling/draft/dflash2.py, the names SGLang loads:
   z-lab's layers with a grouped dynamic causal conv around each sublayer,
   h += finish(sub(prepare(norm(h)))), taps from kernel_projection(norm(h))
   viewed [side][tap][group], zero before the block's row 0, the context
   K/V not convolved; the candidate selector: top-K of the target head's
   logits after output_multiplier and softcap, score unary +
   <A[prev] * P h, B[cand]>, a greedy chain from the anchor) computes each
   row's K candidate scores and the drafts from transformers' hidden states
   of the target; `dflash dump --draft` must give the same candidates, their
   scores within TOL (test_hf_oracle's) and the same drafts, f32 and bf16
   checkpoints, f32 and f16 side stores, with and without softcap.
2. Speculative generation equals classic decode id for id at blocks 2..16 and
   adaptive, greedy and sampled (exact rule), on the random target and on a
   copy whose lm_head keeps 2 rows (so drafts are accepted); the rejection
   rule runs and accepts drafts there.
3. `dflash probe --draft`: 0 differing bytes at blocks 2..16.
   llama.cpp's GGUF form (tools/drafter_to_gguf.py, the names of llama.cpp's
   DFlash2 loader, PR #27342) drafts the same bytes as the folder.
4. Refusals by name of the DFlash2 keys' bad values.
Without $DFLASH_BIN or torch/transformers: skipped (exit 77), unless CI=true.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_hf_oracle as o  # noqa: E402
from test_laguna_drafter import dset, few_token_target, refused, variant  # noqa: E402
from testlib import check, finish  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "make_checkpoint.py")
TARGET = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
# (name, dtype, make_checkpoint.py arguments, dflash_config extras)
DRAFTERS = [
    ("k2-g16-r8-top4-f32", "f32", "--layers 2 --heads 4 --kv-heads 2 --head-dim 16 --ffn 96 "
     "--block-size 8 --target-layer-ids 0,2 --conv-kernel-size 2 --conv-group-size 16 "
     "--selector-rank 8 --selector-top-k 4 --seed 3", {}),
    ("k3-g8-r16-top8-cap-bf16", "bf16", "--layers 1 --heads 8 --kv-heads 2 --head-dim 8 "
     "--ffn 64 --block-size 6 --target-layer-ids 1 --conv-kernel-size 3 --conv-group-size 8 "
     "--selector-rank 16 --selector-top-k 8 --seed 4",
     {"output_multiplier": 0.7, "final_logit_softcapping": 3.0}),
    # sliding layers (the published 27B drafter has some): a window of 5 rows over
    # [context ; block], shorter than the contexts and blocks here, so it matters
    ("k2-g16-r8-top4-swa5-f32", "f32", "--layers 3 --heads 4 --kv-heads 2 --head-dim 16 "
     "--ffn 96 --block-size 8 --target-layer-ids 0,2 --conv-kernel-size 2 --conv-group-size 16 "
     "--selector-rank 8 --selector-top-k 4 --seed 5", {"use_swa": True}),
]
# top-level config.json extras per drafter name
TOP = {"k2-g16-r8-top4-swa5-f32": {"layer_types": ["sliding_attention", "full_attention",
                                                    "sliding_attention"], "sliding_window": 5}}
PROMPT = "the quick brown fox jumps over the lazy dog by the river and"
N_GEN = 60
MIN_ACCEPTED = 10    # drafts the few-token target's rounds must accept at B=8


def ref_drafts(target, dd, ids, B, feats=None):
    """-> (scores (B-1, VOCAB): each row's K candidate scores, -inf elsewhere;
    drafts (B-1); each row's best unary candidate (B-1)) of the block [ids[-1], mask x (B-1)] at positions n-1..,
    context rows 0..n-2, from the definition."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from transformers.models.qwen3 import modeling_qwen3 as q3
    cfg = json.load(open(os.path.join(dd, "config.json")))
    sd = {k: v.float() for k, v in load_file(os.path.join(dd, "model.safetensors")).items()}
    dc, eps = cfg["dflash_config"], cfg["rms_norm_eps"]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    K, gs = dc["conv_kernel_size"], dc["conv_group_size"]
    topk, mult, cap = dc["selector_top_k"], dc.get("output_multiplier", 1.0), \
        dc.get("final_logit_softcapping")

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def conv(x, base, dk):
        """x (B, D), base (K, D), dk (B, K, G): x'_i = sum_t (base[t] + dk[i, t, g]) x_{i-t}."""
        coef = base[None] + dk.repeat_interleave(gs, dim=-1)          # (B, K, D)
        out = coef[:, 0] * x
        for t in range(1, K):
            shifted = torch.cat([torch.zeros(t, x.shape[1]), x[:-t]])
            out = out + coef[:, t] * shifted
        return out

    def prepare(x, p):
        dk = (x @ sd[p + "kernel_projection.weight"].T).view(B, 2, K, -1)
        return conv(x, sd[p + "base_kernel"][0], dk[:, 0]), dk[:, 1]

    def finish_(y, p, dk):
        return conv(y, sd[p + "base_kernel"][1], dk)

    n = len(ids)
    S = n - 1
    with torch.no_grad():
        hs = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
        f = [torch.from_numpy(feats[:S, j].copy()) if feats is not None else hs[l + 1][0, :S]
             for j, l in enumerate(dc["target_layer_ids"])]
        ctx = rms(torch.cat(f, dim=-1) @ sd["fc.weight"].T, sd["hidden_norm.weight"])
        block = torch.tensor([ids[-1]] + [dc["mask_token_id"]] * (B - 1))
        x = target.model.embed_tokens(block)
        rcfg = q3.Qwen3Config(head_dim=hd, rope_theta=cfg["rope_theta"],
                              max_position_embeddings=cfg["max_position_embeddings"])
        cos, sin = q3.Qwen3RotaryEmbedding(rcfg)(x, torch.arange(S + B)[None])
        cos, sin = cos[0][:, None], sin[0][:, None]                       # (S+B, 1, hd)
        # a sliding layer's row at position S+r sees keys S+r-W+1..S+r (causal)
        pos_k, pos_q = torch.arange(S + B)[None], torch.arange(S, S + B)[:, None]
        win = cfg.get("sliding_window") or 0
        swa_mask = (pos_k <= pos_q) & (pos_k > pos_q - win)
        kinds = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
        for i in range(cfg["num_hidden_layers"]):
            p = f"layers.{i}."
            w = lambda s: sd[p + s]  # noqa: E731
            xn, dk = prepare(rms(x, w("input_layernorm.weight")), p + "attention_conv.")
            kin = torch.cat([ctx, xn])                                   # context: no conv
            q = rms((xn @ w("self_attn.q_proj.weight").T).view(B, H, hd), w("self_attn.q_norm.weight"))
            k = rms((kin @ w("self_attn.k_proj.weight").T).view(S + B, KV, hd),
                    w("self_attn.k_norm.weight"))
            v = (kin @ w("self_attn.v_proj.weight").T).view(S + B, KV, hd)
            q = q * cos[S:] + q3.rotate_half(q) * sin[S:]
            k = k * cos + q3.rotate_half(k) * sin
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
            sc = torch.einsum("qhd,khd->hqk", q, k) * hd ** -0.5
            if kinds[i] == "sliding_attention":
                sc = sc.masked_fill(~swa_mask[None], float("-inf"))
            a = torch.softmax(sc, dim=-1)
            att = torch.einsum("hqk,khd->qhd", a, v).reshape(B, H * hd)
            x = x + finish_(att @ w("self_attn.o_proj.weight").T, p + "attention_conv.", dk)
            xn, dk = prepare(rms(x, w("post_attention_layernorm.weight")), p + "mlp_conv.")
            h = F.silu(xn @ w("mlp.gate_proj.weight").T) * (xn @ w("mlp.up_proj.weight").T)
            x = x + finish_(h @ w("mlp.down_proj.weight").T, p + "mlp_conv.", dk)
        hidden = rms(x, sd["norm.weight"])[1:]
        unary = target.lm_head(hidden).float() * mult
        if cap:
            unary = torch.tanh(unary / cap) * cap
        u, cand = unary.topk(topk, dim=-1)
        ph = hidden @ sd["candidate_selector.hidden_projection.weight"].T
        A, Bc = sd["candidate_selector.predecessor_codebook"], sd["candidate_selector.successor_codebook"]
        prev, drafts = ids[-1], []
        scores = np.full((B - 1, unary.shape[1]), -np.inf)
        for r in range(B - 1):
            s = u[r] + (Bc[cand[r]] @ (A[prev] * ph[r]))
            scores[r, cand[r].numpy()] = s.numpy()
            prev = int(cand[r][int(s.argmax())])
            drafts.append(prev)
    return scores, drafts, cand[:, 0].tolist()


def compare(ref, got, kv):
    """-> (ok, max |diff| over the candidates, tolerance): the same candidate
    set per row (where the reference's K-th and K+1-th unary are apart), the
    scores within TOL, the same pick per row."""
    fin = np.isfinite(ref)
    same_set = np.array_equal(fin, np.isfinite(got))
    tol = o.TOL[kv] * max(1.0, float(np.abs(ref[fin]).max()))
    diff = float(np.abs(ref[fin] - got[fin]).max()) if same_set else float("inf")
    picks = np.array_equal(np.where(fin, ref, -1e30).argmax(1), np.where(fin, got, -1e30).argmax(1))
    return same_set and diff <= tol and picks, diff, tol


def make_drafter(tdir, out, dt, args, extra):
    o.run([sys.executable, TOOL, "--drafter", "--dflash2", "--target", tdir, "--out", out,
           "--mask-id", str(o.TOK_SIZE), "--dtype", dt, "--quiet"] + args.split())
    top = TOP.get(os.path.basename(out), {})
    if extra or top:
        p = os.path.join(out, "config.json")
        cfg = json.load(open(p))
        cfg["dflash_config"].update(extra)
        cfg.update(top)
        json.dump(cfg, open(p, "w"), indent=2)
    return out


def test_drafts(binary, dirs, tmp):
    for name, dt, args, extra in DRAFTERS:
        dd = make_drafter(dirs[dt], os.path.join(tmp, name), dt, args, extra)
        target = o.load_hf(dirs[dt])
        dc = json.load(open(os.path.join(dd, "config.json")))["dflash_config"]
        B, cap = json.load(open(os.path.join(dd, "config.json")))["block_size"], dc["target_layer_ids"]
        moved = 0
        for n in (2, 13, 40):
            ids = np.random.default_rng(400 + n).integers(0, o.TOK_SIZE, n).tolist()
            for kv in ("f32", "f16"):
                try:
                    logits, feat, got = o.dump(binary, dirs[dt], ids, kv, draft=dd, block=B,
                                               capture=cap, dim=TARGET["hidden_size"])
                except RuntimeError as e:
                    check(False, f"{name}: dump n={n}: {e}")
                    continue
                # the f16 side store: the reference on the features the engine captured
                ref, rd, top = ref_drafts(target, dd, ids, B, feat if kv == "f16" else None)
                ok, diff, tol = compare(ref, got, kv)
                check(ok, f"{name} n={n} kv {kv}: max |diff| {diff:.3g} > tol {tol:.3g}, or a "
                      "candidate set or a pick differs")
                o.row(f"{name} n={n} B={B}", dt, "draft", kv, diff, tol, ok)
                # the selector must matter: some pick is not the candidate of best unary
                moved += sum(a != b for a, b in zip(rd, top))
        # the transition term must change some choice, or the test would not see it
        check(moved > 0, f"{name}: every pick is the head's argmax: the selector is not tested")
        print(f"  {name}: {moved} rows whose selector pick is not the best unary", flush=True)
        if name not in TOP:   # llama.cpp's form has no sliding drafter layers here
            test_gguf(binary, dirs[dt], name, dd, B, extra)


def test_gguf(binary, tdir, name, dd, B, extra):
    """llama.cpp's form drafts the folder's bytes. It has no key for the unary
    transform: a folder setting one is refused by the converter, and its
    drafter without those keys is converted instead."""
    tool = os.path.join(HERE, "..", "tools", "drafter_to_gguf.py")
    if extra:
        r = subprocess.run([sys.executable, tool, "--quiet", dd, tdir, dd + "-x.gguf"],
                           capture_output=True, text=True, timeout=300)
        check(r.returncode != 0 and "final_logit_softcapping" in r.stderr,
              f"{name}: drafter_to_gguf refuses the unary transform ({r.stderr[-200:]})")
        dd = variant(dd, dd + "-plain", lambda c: [c["dflash_config"].pop(k) for k in extra])
    gg = dd + ".gguf"
    o.run([sys.executable, tool, "--quiet", dd, tdir, gg])
    ids = np.random.default_rng(77).integers(0, o.TOK_SIZE, 21).tolist()
    a = o.dump(binary, tdir, ids, "f32", draft=dd, block=B)[2]
    b = o.dump(binary, tdir, ids, "f32", draft=gg, block=B)[2]
    same = a.tobytes() == b.tobytes()
    check(same, f"{name}: the GGUF form drafts other bytes")
    print(f"  {name}: GGUF form (llama.cpp's names) == folder, bit for bit: {same}", flush=True)


def gen_ids(binary, t, d, block, tmp, extra=()):
    """-> (generated ids as printed, exit status, speculative rounds)."""
    st = os.path.join(tmp, "stats.json")
    r = subprocess.run([binary, "generate", "-m", t, "--draft", d, "-p", PROMPT, "-n",
                        str(N_GEN), "--ignore-eos", "--block-size", block, "--print-token-ids",
                        "-q", "-t", "2", "--stats-json", st, *extra],
                       capture_output=True, text=True, timeout=300)
    m = re.search(r"generated ids \(\d+\): \[([0-9, ]*)\]", r.stderr)
    rounds = re.search(r'"rounds": (\d+)', open(st).read()) if os.path.exists(st) else None
    return (m.group(1) if m else None), r.returncode, (int(rounds.group(1)) if rounds else 0)


SAMPLED = ("--temp", "0.9", "--top-k", "40", "--seed", "7")


def test_generate(binary, dirs, few, tmp):
    for label, targets in (("random", dirs), ("few-token", few)):
        for name, dt, _, _ in DRAFTERS:
            d = os.path.join(tmp, name)
            for mode, extra in (("greedy", ()), ("sampled", SAMPLED)):
                ref, rc, _ = gen_ids(binary, targets[dt], "none", "1", tmp, extra)
                check(rc == 0 and ref and len(ref.split(",")) == N_GEN,
                      f"{name} {mode}: classic ids ({rc})")
                bad, rounds = [], {}
                blocks = range(2, 17) if mode == "greedy" else (2, 3, 5, 8, 11, 16)
                for b in [str(x) for x in blocks] + ["auto"]:
                    got, rc, rounds[b] = gen_ids(binary, targets[dt], d, b, tmp, extra)
                    if rc != 0 or got != ref:
                        bad.append(b)
                check(not bad, f"{name} {label} {mode}: speculative ids differ from classic at "
                      f"blocks {bad}")
                if label == "few-token" and mode == "greedy":
                    check(N_GEN - rounds["8"] >= MIN_ACCEPTED, f"{name} few-token: "
                          f"{N_GEN - rounds['8']} drafts accepted at B=8, fewer than "
                          f"{MIN_ACCEPTED}: the fixture no longer tests acceptance")
                print(f"  {name:26s} {dt:5s} {label:9s} {mode:7s} {N_GEN} ids, blocks 2..16 + "
                      f"auto == classic: {'ok' if not bad else bad}  (rounds at B=8: "
                      f"{rounds['8']})", flush=True)
            if label == "few-token":   # the rejection rule reads the selector's q
                got, rc, r8 = gen_ids(binary, targets[dt], d, "8", tmp,
                                      SAMPLED + ("--spec-accept", "rejection"))
                ok = rc == 0 and got and len(got.split(",")) == N_GEN and r8 < N_GEN
                check(ok, f"{name}: rejection rule ({rc}, {r8} rounds for {N_GEN} ids)")
                print(f"  {name:26s} {dt:5s} rejection: {N_GEN} ids in {r8} rounds at B=8",
                      flush=True)


def test_probe(binary, dirs, tmp):
    for name, dt, args, _ in DRAFTERS:
        # the load summary names the drafter's kind
        r = subprocess.run([binary, "generate", "-m", dirs[dt], "--draft", os.path.join(tmp, name),
                            "-p", PROMPT, "-n", "2", "-t", "1"], capture_output=True, text=True,
                           timeout=300)
        blk = re.search(r"--block-size (\d+)", args).group(1)
        want = f"DFlash2 drafter of {args.split()[1]} layers ({dt} weights), block {blk}"
        check(r.returncode == 0 and want in r.stderr, f"{name}: load summary lacks '{want}': "
              f"{r.stderr[-300:]}")
        r = subprocess.run([binary, "probe", "-m", dirs[dt], "--draft", os.path.join(tmp, name),
                            "--ids", o.PROBE_IDS, "--block-size", "16", "-n", "24", "-t", "2"],
                           capture_output=True, text=True, timeout=300)
        try:
            sizes = json.loads(r.stdout)["probe"]["sizes"]
        except (ValueError, KeyError) as e:
            check(False, f"{name}: probe output ({e}): {r.stderr[-300:]}")
            continue
        bad = [x["block"] for x in sizes if x["bytes_differ"] or x.get("feat_bytes_differ")]
        ok = r.returncode == 0 and not bad and len(sizes) == 15
        check(ok, f"{name}: probe blocks {bad} differ (exit {r.returncode})")
        print(f"  {name:26s} {dt:5s} probe     B=2..16: {'0 bytes differ' if ok else bad}",
              flush=True)


def test_refusals(binary, dirs, tmp):
    src, t = os.path.join(tmp, DRAFTERS[0][0]), dirs["f32"]
    k = ["dflash_config"]
    cases = [  # (what, edit, words the message must hold)
        ("conv_kernel_size missing", dset(k + ["conv_kernel_size"], None),
         ["dflash_config.conv_kernel_size is missing"]),
        ("conv_kernel_size 0", dset(k + ["conv_kernel_size"], 0), ["conv_kernel_size"]),
        ("conv_kernel_size past the block", dset(k + ["conv_kernel_size"], 9),
         ["conv_kernel_size"]),
        ("conv_group_size not dividing", dset(k + ["conv_group_size"], 24),
         ["conv_group_size 24 does not divide hidden_size 64"]),
        ("conv_group_size missing", dset(k + ["conv_group_size"], None),
         ["dflash_config.conv_group_size is missing"]),
        ("selector_rank 0", dset(k + ["selector_rank"], 0), ["selector_rank"]),
        ("selector_rank missing", dset(k + ["selector_rank"], None),
         ["dflash_config.selector_rank is missing"]),
        ("selector_rank unlike the file", dset(k + ["selector_rank"], 4),
         ["candidate_selector"]),
        ("selector_top_k past the vocabulary", dset(k + ["selector_top_k"], o.VOCAB + 1),
         ["selector_top_k"]),
        ("selector_top_k a string", dset(k + ["selector_top_k"], "4"), ["selector_top_k"]),
        ("softcap 0", dset(k + ["final_logit_softcapping"], 0), ["final_logit_softcapping"]),
        ("output_multiplier negative", dset(k + ["output_multiplier"], -1.0),
         ["output_multiplier"]),
        ("block sizes that disagree", dset(k + ["block_size"], 4),
         ["dflash_config.block_size 4"]),
        ("conv kernel unlike the file", dset(k + ["conv_kernel_size"], 3),
         ["attention_conv.base_kernel"]),
    ]
    for i, (what, edit, words) in enumerate(cases):
        refused(binary, t, variant(src, os.path.join(tmp, f"bad{i}"), edit), words, what)
    swa = os.path.join(tmp, DRAFTERS[2][0])
    lt = ["layer_types"]
    cases = [
        ("window 1", dset(["sliding_window"], 1), ["sliding_window = 1 (expected an integer in 2..1048576)"]),
        ("window 2^20 + 1", dset(["sliding_window"], (1 << 20) + 1), ["sliding_window = 1048577"]),
        ("window missing", dset(["sliding_window"], None), ["sliding_window is missing"]),
        ("window a string", dset(["sliding_window"], "5"), ["sliding_window"]),
        ("layer kind unknown", dset(lt, ["sliding_attention", "chunked_attention",
                                        "full_attention"]), ["layer_types[1]"]),
        ("layer_types too short", dset(lt, ["full_attention"]), ["layer_types must be an array"]),
        ("non-causal sliding", dset(["is_causal"], False), ["non-causal sliding-window"]),
        ("use_swa disagreeing", dset(k + ["use_swa"], False), ["use_swa = false but layer_types has sliding_attention"]),
        ("swa_window_size disagreeing", dset(k + ["swa_window_size"], 6),
         ["swa_window_size = 6 differs"]),
    ]
    for i, (what, edit, words) in enumerate(cases):
        refused(binary, t, variant(swa, os.path.join(tmp, f"bad-swa{i}"), edit), words, what)
    # Qwen2's legacy form: layers from max_window_layers on slide
    a = variant(swa, os.path.join(tmp, "swa-legacy"), lambda c: (
        c.pop("layer_types"), c.update(use_sliding_window=True, max_window_layers=1)))
    b = variant(swa, os.path.join(tmp, "swa-types"),
                dset(lt, ["full_attention", "sliding_attention", "sliding_attention"]))
    ids = np.random.default_rng(78).integers(0, o.TOK_SIZE, 23).tolist()
    da, db = (o.dump(binary, t, ids, "f32", draft=x, block=8)[2] for x in (a, b))
    same = da.tobytes() == db.tobytes()
    check(same, "use_sliding_window + max_window_layers drafts unlike its layer_types form")
    print(f"  legacy use_sliding_window form == layer_types form: {'ok' if same else 'FAIL'}")
    # block_size only in dflash_config (SpecForge's export) is read
    d = variant(src, os.path.join(tmp, "good-inner-block"),
                lambda c: (c.pop("block_size"), c["dflash_config"].update(block_size=8)))
    r = subprocess.run([binary, "dump", "--model", t, "--ids", "1,2,3", "--out", os.devnull,
                        "--draft", d, "--out-draft", os.devnull, "-t", "1"],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"dflash_config.block_size alone accepted: {r.stderr[-200:]}")


def main():
    t0 = time.time()
    binary = o.ready()
    if not binary:
        return finish()
    with tempfile.TemporaryDirectory(prefix="test_dflash2_drafter-") as tmp:
        dirs = o.make_target(tmp, "qwen3", "Qwen3Config", TARGET, 29)
        print(f"  tolerance: max|diff| <= TOL * max(1, max|reference|), TOL {o.TOL}", flush=True)
        test_drafts(binary, dirs, tmp)
        few = {dt: few_token_target(d, d + "-few") for dt, d in dirs.items()}
        test_generate(binary, dirs, few, tmp)
        test_probe(binary, dirs, tmp)
        test_refusals(binary, dirs, tmp)
    print(f"test_dflash2_drafter: {time.time() - t0:.1f} s")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
