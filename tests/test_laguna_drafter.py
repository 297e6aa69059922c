#!/usr/bin/env python3
"""test_laguna_drafter.py - the Laguna DFlash drafter (DFlashLagunaForCausalLM)
on a transformers-made random Laguna target.

1. Logits: a torch reference written here from the published definition
   (vLLM's laguna_dflash.py: aux_hidden_norms per captured slice, fc,
   hidden_norm; context K/V through each layer's input_layernorm; fused
   qkv_proj, q/k norm, Laguna RoPE by layer type (transformers'
   LagunaRotaryEmbedding: partial rotary, YaRN), softplus gate; causal rows
   and a sliding window over [context ; block]) computes the drafter's
   logits from transformers' hidden states of the target; `dflash dump
   --draft` must match within TOL (test_hf_oracle's tolerances), f32 and
   bf16 checkpoints, f32 and f16 side stores, contexts shorter and several
   times longer than the window.
2. Speculative generation with each drafter equals classic decode id for id
   at blocks 2..16 and adaptive, prompt + output many times the target's and
   the drafter's windows (16), on the random target (drafts almost never
   accepted) and on a copy whose lm_head keeps 2 rows (greedy ids in 0..2, so
   random drafts are often right: at least MIN_ACCEPTED accepted at B=16).
3. `dflash probe --draft`: 0 differing bytes at blocks 2..16.
4. Refusals by name: pairings in both directions, mixed layer types, target
   layer ids, mask id, block size, window, vocabulary, causality.
Without $DFLASH_BIN or torch/transformers: skipped (exit 77), unless CI=true.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_hf_oracle as o  # noqa: E402
from testlib import check, finish, missing  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "tools", "make_laguna_drafter.py")
WINDOW = 16
TARGET = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_attention_heads_per_layer=[4, 8, 4, 8],
              layer_types=["full_attention", "sliding_attention", "sliding_attention",
                           "sliding_attention"], sliding_window=WINDOW, gating=True,
              num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
              shared_expert_intermediate_size=64, moe_routed_scaling_factor=2.5,
              rope_parameters={"full_attention": dict(rope_type="default", rope_theta=500000.0,
                                                      partial_rotary_factor=0.5),
                               "sliding_attention": dict(rope_type="default",
                                                         rope_theta=10000.0)},
              tie_word_embeddings=False)
# (name, dtype, make_laguna_drafter.py arguments). The target's last layer is not captured:
# transformers' last hidden state is after the final norm.
DRAFTERS = [
    ("swa16-perhead-f32", "f32", "--layers 2 --heads 8 --kv-heads 2 --head-dim 16 --ffn 96 "
     "--block-size 8 --layer-ids 0,2 --sliding-window 16 --swa-partial 0.5 --seed 3"),
    ("full-yarn-elem-bf16", "bf16", "--layers 1 --heads 4 --kv-heads 1 --head-dim 16 --ffn 80 "
     "--block-size 6 --layer-ids 1,2,0 --gating per-element --yarn --zero-based --seed 4"),
    ("full-causal-nogate-f32", "f32", "--layers 1 --heads 4 --kv-heads 4 --head-dim 8 --ffn 64 "
     "--block-size 5 --layer-ids 2 --gating none --causal true --seed 5"),
    # the published config's shape: top-level rope_theta only, num_experts 0, no
    # mlp_layer_types nor draft_vocab_size, num_target_layers in dflash_config
    ("published-form-swa16-f32", "f32", "--layers 2 --heads 4 --kv-heads 2 --head-dim 16 "
     "--ffn 64 --block-size 16 --layer-ids 1,2 --sliding-window 16 --published-form 500000 "
     "--seed 6"),
]
PROMPT = "the quick brown fox jumps over the lazy dog by the river and"
N_GEN = 90           # with the 19-id prompt, 109 positions: 6.8 windows of 16
MIN_ACCEPTED = 10    # drafts a few-token target's rounds must accept at B=16 (seen: 13-64)


def ref_logits(target, dd, ids, B, feats=None):
    """The drafter's logits of rows 1..B-1 of the block [ids[-1], mask x (B-1)]
    at positions n-1.., with context rows 0..n-2, from the definition. The
    target features are transformers' hidden states (hidden_states[l + 1]:
    decoder layer l's output), or feats (n, n_cap, dim) when given."""
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file
    from transformers.models.laguna import modeling_laguna as lg
    cfg = json.load(open(os.path.join(dd, "config.json")))
    sd = {k: v.float() for k, v in load_file(os.path.join(dd, "model.safetensors")).items()}
    dc, eps = cfg["dflash_config"], cfg["rms_norm_eps"]
    H, KV, hd, D = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                    cfg["hidden_size"])
    lt = cfg["layer_types"][0]
    # A config with only a top-level rope_theta: that theta, every dim rotating, on both layer
    # kinds (vLLM's own LagunaConfig keeps it flat; transformers' LagunaConfig would give
    # sliding layers its per-type default instead -- the published code reads it flat).
    rope = cfg.get("rope_parameters") or {
        kind: dict(rope_type="default", rope_theta=cfg["rope_theta"],
                   partial_rotary_factor=cfg.get("partial_rotary_factor", 1.0))
        for kind in ("full_attention", "sliding_attention")}
    window = cfg["sliding_window"] if lt == "sliding_attention" else None
    causal = dc.get("causal", lt == "sliding_attention")
    first = 0 if "layers.0.input_layernorm.weight" in sd else target.config.num_hidden_layers

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    n = len(ids)
    S = n - 1
    with torch.no_grad():
        hs = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
        td = target.config.hidden_size
        f = [torch.from_numpy(feats[:S, j].copy()) if feats is not None else hs[l + 1][0, :S]
             for j, l in enumerate(dc["target_layer_ids"])]
        feat = torch.cat([rms(x, sd[f"aux_hidden_norms.{j}.weight"]) for j, x in enumerate(f)],
                         dim=-1)
        ctx = rms(feat @ sd["fc.weight"].T, sd["hidden_norm.weight"])
        assert feat.shape[-1] == len(dc["target_layer_ids"]) * td
        block = torch.tensor([ids[-1]] + [dc["mask_token_id"]] * (B - 1))
        x = target.model.embed_tokens(block)
        rcfg = transformers.LagunaConfig(
            hidden_size=D, num_attention_heads=H, num_key_value_heads=KV, head_dim=hd,
            num_hidden_layers=len(cfg["layer_types"]), layer_types=cfg["layer_types"],
            rope_parameters=rope,
            max_position_embeddings=cfg["max_position_embeddings"])
        pos = torch.arange(S + B)
        cos, sin = lg.LagunaRotaryEmbedding(rcfg)(x, pos[None], lt)
        qp, kp = pos[S:, None], pos[None, :]
        allowed = (kp <= qp) if causal else torch.ones(B, S + B, dtype=torch.bool)
        if window:
            allowed &= kp > qp - window
        mask = torch.zeros(B, S + B).masked_fill(~allowed, float("-inf"))
        for i in range(cfg["num_hidden_layers"]):
            p = f"layers.{first + i}."
            w = lambda s: sd[p + s]  # noqa: E731
            Wq, Wk, Wv = w("self_attn.qkv_proj.weight").split([H * hd, KV * hd, KV * hd])
            xn = rms(x, w("input_layernorm.weight"))
            kin = torch.cat([rms(ctx, w("input_layernorm.weight")), xn])
            q = rms((xn @ Wq.T).view(B, H, hd), w("self_attn.q_norm.weight")).transpose(0, 1)
            k = rms((kin @ Wk.T).view(S + B, KV, hd), w("self_attn.k_norm.weight")).transpose(0, 1)
            v = (kin @ Wv.T).view(S + B, KV, hd).transpose(0, 1)
            q, _ = lg.apply_rotary_pos_emb(q[None], q[None], cos[:, S:], sin[:, S:])
            k, _ = lg.apply_rotary_pos_emb(k[None], k[None], cos, sin)
            k, v = k[0].repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)
            att = torch.softmax(q[0] @ k.transpose(1, 2) * hd ** -0.5 + mask, dim=-1) @ v
            att = att.transpose(0, 1)  # (B, H, hd)
            if p + "self_attn.g_proj.weight" in sd:
                g = F.softplus(xn @ w("self_attn.g_proj.weight").T)
                att = att * (g[..., None] if g.shape[-1] == H else g.view(B, H, hd))
            x = x + att.reshape(B, H * hd) @ w("self_attn.o_proj.weight").T
            h = rms(x, w("post_attention_layernorm.weight"))
            h = F.silu(h @ w("mlp.gate_proj.weight").T) * (h @ w("mlp.up_proj.weight").T)
            x = x + h @ w("mlp.down_proj.weight").T
        return target.lm_head(rms(x, sd["norm.weight"]))[1:].numpy()


def make_drafter(tdir, out, args):
    o.run([sys.executable, TOOL, "--target", tdir, "--out", out, "--mask-id", str(o.TOK_SIZE)]
        + args.split())
    return out


def test_logits(binary, dirs, tmp):
    for name, dt, args in DRAFTERS:
        dd = make_drafter(dirs[dt], os.path.join(tmp, name), args + f" --dtype {dt}")
        target = o.load_hf(dirs[dt])
        dc = json.load(open(os.path.join(dd, "config.json")))["dflash_config"]
        B, cap = dc["block_size"], dc["target_layer_ids"]
        for n in (2, 13, 57):   # context 1 row, under the window, 3.5 windows
            ids = np.random.default_rng(300 + n).integers(0, o.TOK_SIZE, n).tolist()
            hf_ref = ref_logits(target, dd, ids, B)
            check(hf_ref.std() > 0.5, f"{name}: reference logits spread (std {hf_ref.std():.2f})")
            for kv in ("f32", "f16"):
                try:
                    _, feat, got = o.dump(binary, dirs[dt], ids, kv, draft=dd, block=B,
                                          capture=cap, dim=TARGET["hidden_size"])
                except RuntimeError as e:
                    check(False, f"{name}: dump n={n}: {e}")
                    continue
                # With an f16 cache the target's own rounding can flip an expert choice
                # (a near tie of the router) and move its features far from transformers':
                # that case checks the drafter on the features the engine captured.
                ref = hf_ref if kv == "f32" else ref_logits(target, dd, ids, B, feat)
                ok, diff, tol = o.compare(ref, got, kv)
                check(ok, f"{name} n={n} kv {kv}: max |diff| {diff:.3g} > tol {tol:.3g} or an "
                      "argmax differs")
                o.row(f"{name} n={n} B={B}", dt, "draft", kv, diff, tol, ok)


def gen_ids(binary, t, d, block, tmp):
    """-> (generated ids as printed, exit status, speculative rounds)."""
    st = os.path.join(tmp, "stats.json")
    r = subprocess.run([binary, "generate", "-m", t, "--draft", d, "-p", PROMPT, "-n",
                        str(N_GEN), "--ignore-eos", "--block-size", block, "--print-token-ids",
                        "-q", "-t", "2", "--stats-json", st],
                       capture_output=True, text=True, timeout=300)
    m = re.search(r"generated ids \(\d+\): \[([0-9, ]*)\]", r.stderr)
    rounds = re.search(r'"rounds": (\d+)', open(st).read()) if os.path.exists(st) else None
    return (m.group(1) if m else None), r.returncode, (int(rounds.group(1)) if rounds else 0)


def few_token_target(src, out, keep=2):
    """src with every lm_head row but the first keep zeroed: greedy ids fall in
    0..keep (keep when all kept logits are negative: the first zero row wins),
    so even a random drafter's drafts are often right and rounds accept runs
    of them -- the paths a random vocabulary-wide pair almost never takes."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, out)
    f = os.path.join(out, "model.safetensors")
    sd = load_file(f)
    sd["lm_head.weight"][keep:] = 0
    save_file(sd, f, metadata={"format": "pt"})
    return out


def test_generate(binary, dirs, few, tmp):
    for label, targets in (("random", dirs), ("few-token", few)):
        for name, dt, _ in DRAFTERS:
            d = os.path.join(tmp, name)
            ref, rc, _ = gen_ids(binary, targets[dt], "none", "1", tmp)
            check(rc == 0 and ref and len(ref.split(",")) == N_GEN, f"{name}: classic ids ({rc})")
            bad = []
            rounds = {}
            for b in [str(x) for x in range(2, 17)] + ["auto"]:
                got, rc, rounds[b] = gen_ids(binary, targets[dt], d, b, tmp)
                if rc != 0 or got != ref:
                    bad.append(b)
            check(not bad, f"{name} {label}: speculative ids differ from classic at blocks {bad}")
            if label == "few-token":   # the fixture must make rounds accept drafts
                check(N_GEN - rounds["16"] >= MIN_ACCEPTED, f"{name} few-token: "
                      f"{N_GEN - rounds['16']} drafts accepted at B=16, fewer than "
                      f"{MIN_ACCEPTED}: the fixture no longer tests acceptance")
            print(f"  {name:26s} {dt:5s} {label:9s} {N_GEN} ids, blocks 2..16 + auto == classic: "
                  f"{'ok' if not bad else bad}  (rounds at B=16: {rounds['16']})", flush=True)


def test_probe(binary, dirs, tmp):
    """Every drafter as saved, and the first with every matrix converted to q8_0
    (the fused qkv_proj's row views of a quantized matrix)."""
    runs = [(name, dt, []) for name, dt, _ in DRAFTERS]
    runs.append((DRAFTERS[0][0], "q8_0", ["--dtype", "q8_0"]))
    for name, dt, extra in runs:
        r = subprocess.run([binary, "probe", "-m", dirs[dt if dt != "q8_0" else "f32"], "--draft",
                            os.path.join(tmp, name), "--ids", o.PROBE_IDS, "--block-size", "16",
                            "-n", "24", "-t", "2"] + extra,
                           capture_output=True, text=True, timeout=300)
        try:
            rep = json.loads(r.stdout)
            sizes = rep["probe"]["sizes"]
        except (ValueError, KeyError) as e:
            check(False, f"{name}: probe output ({e}): {r.stderr[-300:]}")
            continue
        bad = [x["block"] for x in sizes if x["bytes_differ"] or x.get("feat_bytes_differ")]
        ok = r.returncode == 0 and not bad and len(sizes) == 15 and "drafter" in r.stdout
        check(ok, f"{name}: probe blocks {bad} differ (exit {r.returncode})")
        print(f"  {name:26s} {dt:5s} probe     B=2..16: {'0 bytes differ' if ok else bad}",
              flush=True)


def test_chain(binary, few, tmp):
    """The probe's drafter diagnostic chains the rounds a pinned run makes: its
    rounds and committed ids equal generate's (same drafts from the same
    store, windowed stores cut back included), on the few-token target where
    rounds accept drafts. Pinned at each drafter's trained block: past it the
    two disagree for z-lab drafters too (an engine matter, not the drafter's)."""
    for name, dt, _ in DRAFTERS:
        d, st = os.path.join(tmp, name), os.path.join(tmp, "chain.json")
        B = str(json.load(open(os.path.join(d, "config.json")))["dflash_config"]["block_size"])
        r = subprocess.run([binary, "probe", "-m", few[dt], "--draft", d, "--block-size", B,
                            "-n", "60", "-p", PROMPT, "-t", "2"],
                           capture_output=True, text=True, timeout=300)
        p = re.findall(r'"(rounds|committed)": (\d+)', r.stdout)[:2]
        subprocess.run([binary, "generate", "-m", few[dt], "--draft", d, "-p", PROMPT, "-n", "60",
                        "--ignore-eos", "-t", "2", "--block-size", B, "-q", "--stats-json", st],
                       capture_output=True, text=True, timeout=300)
        g = re.findall(r'"(rounds|committed)": (\d+)', open(st).read())[:2]
        ok = len(p) == 2 and p == g
        check(ok, f"{name}: probe chain {p} != generate {g}")
        print(f"  {name:26s} {dt:5s} chain     B={B}: probe {dict(p)} generate {dict(g)}  "
              f"{'ok' if ok else 'FAIL'}", flush=True)


# ---- refusals -------------------------------------------------------------------------------

def variant(src, out, edit):
    """A copy of drafter folder src whose config.json edit(cfg) changed."""
    os.makedirs(out)
    os.symlink(os.path.join(src, "model.safetensors"), os.path.join(out, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    edit(cfg)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    return out


def refused(binary, t, d, words, what):
    r = subprocess.run([binary, "dump", "--model", t, "--ids", "1,2,3", "--out", os.devnull,
                        "--draft", d, "--out-draft", os.devnull, "-t", "1"],
                       capture_output=True, text=True, timeout=120)
    ok = r.returncode != 0 and all(w in r.stderr for w in words)
    check(ok, f"refusal {what}: exit {r.returncode}, stderr: {r.stderr.strip()[-300:]} "
          f"(expected {words})")
    print(f"  refused {what:40s} {'ok' if ok else 'FAIL'}: {r.stderr.strip()[-150:]}",
          flush=True)


def dset(path, value):
    def edit(c):
        obj = c
        for k in path[:-1]:
            obj = obj[k]
        if value is None:
            obj.pop(path[-1], None)
        else:
            obj[path[-1]] = value
    return edit


def test_refusals(binary, dirs, tmp):
    src, t = os.path.join(tmp, DRAFTERS[0][0]), dirs["f32"]
    L = TARGET["num_hidden_layers"]
    cases = [  # (what, edit, words the message must hold)
        ("mixed layer_types", dset(["layer_types"], ["sliding_attention", "full_attention"]),
         ["layer_types mixes"]),
        ("layer_types missing", dset(["layer_types"], None), ["layer_types is missing"]),
        ("target layer id past the target", dset(["dflash_config", "target_layer_ids"], [0, L]),
         ["target layer id", str(L)]),
        ("negative target layer id", dset(["dflash_config", "target_layer_ids"], [-1, 1]),
         ["target layer id -1"]),
        ("target_layer_ids missing", dset(["dflash_config", "target_layer_ids"], None),
         ["target_layer_ids is missing"]),
        ("mask id past the vocabulary", dset(["dflash_config", "mask_token_id"], o.VOCAB),
         ["mask_token_id", str(o.VOCAB)]),
        ("block size 1", dset(["dflash_config", "block_size"], 1), ["block_size = 1"]),
        ("block size 513", dset(["dflash_config", "block_size"], 513), ["block_size = 513"]),
        ("block sizes that disagree", dset(["block_size"], 4), ["block_size = 4"]),
        ("window 1", dset(["sliding_window"], 1), ["sliding_window = 1"]),
        ("window 2^20 + 1", dset(["sliding_window"], (1 << 20) + 1),
         ["sliding_window = 1048577"]),
        ("swa_window_size differing", dset(["dflash_config", "swa_window_size"], 8),
         ["swa_window_size = 8"]),
        ("use_swa against layer_types", dset(["dflash_config", "use_swa"], False),
         ["use_swa"]),
        ("draft_vocab_size differing", dset(["draft_vocab_size"], o.VOCAB + 1),
         ["draft_vocab_size", str(o.VOCAB + 1)]),
        ("vocab_size differing, no draft_vocab_size",
         lambda c: (c.pop("draft_vocab_size"), c.update(vocab_size=o.VOCAB - 1)),
         ["vocab_size = 319"]),
        ("draft_vocab_size and vocab_size missing",
         lambda c: (c.pop("draft_vocab_size"), c.pop("vocab_size")),
         ["draft_vocab_size is missing"]),
        ("dflash_config.num_target_layers differing",
         dset(["dflash_config", "num_target_layers"], L - 1),
         ["dflash_config.num_target_layers = 3"]),
        ("non-causal sliding layers", dset(["is_causal"], False), ["non-causal"]),
        ("per-layer heads differing", dset(["num_attention_heads_per_layer"], [8, 4]),
         ["num_attention_heads_per_layer[1]"]),
        ("num_target_layers differing", dset(["num_target_layers"], L + 1),
         ["num_target_layers"]),
        ("attention sinks", dset(["swa_attention_sink_enabled"], True),
         ["swa_attention_sink_enabled"]),
    ]
    for i, (what, edit, words) in enumerate(cases):
        refused(binary, t, variant(src, os.path.join(tmp, f"bad{i}"), edit), words, what)
    # the window's and block's ends are accepted
    for i, edit in enumerate([dset(["sliding_window"], 2), dset(["sliding_window"], 1 << 20)]):
        d = variant(src, os.path.join(tmp, f"good{i}"), edit)
        r = subprocess.run([binary, "dump", "--model", t, "--ids", "1,2,3", "--out", os.devnull,
                            "--draft", d, "--out-draft", os.devnull, "-t", "1"],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"window {2 if i == 0 else 1 << 20} accepted: {r.stderr[-200:]}")
    # pairing, both directions: a Laguna drafter on a Qwen3 target ...
    qw = o.make_target(tmp, "qwen3", "Qwen3Config",
                       dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            tie_word_embeddings=False), 11)
    refused(binary, qw["f32"], src, ["DFlashLagunaForCausalLM", qw["f32"], "not a Laguna"],
            "Laguna drafter on a Qwen3 target")
    # ... and a z-lab drafter (same shapes, z-lab's config) on the Laguna target
    zl = variant(src, os.path.join(tmp, "zlab"), lambda c: c.update(
        architectures=["DFlashDraftModel"], block_size=8, layer_types=None, sliding_window=None))
    refused(binary, t, zl, ["DFlashDraftModel", t, "a Laguna model"],
            "z-lab drafter on a Laguna target")
    # ... and llama.cpp's dflash GGUF of a z-lab drafter (for a make_checkpoint.py Qwen3)
    mk = os.path.join(HERE, "..", "tools", "make_checkpoint.py")
    qt, zd, gg = (os.path.join(tmp, x) for x in ("mk-qwen3", "mk-zlab", "mk-zlab.gguf"))
    o.run([sys.executable, mk, "--arch", "qwen3", "--dim", "64", "--layers", "4", "--heads", "4",
           "--kv-heads", "2", "--head-dim", "16", "--ffn", "96", "--vocab", str(o.VOCAB),
           "--untied", "--dtype", "f32", "--quiet", "--out", qt])
    o.run([sys.executable, mk, "--drafter", "--target", qt, "--layers", "1", "--block-size", "8",
           "--quiet", "--out", zd])
    o.run([sys.executable, os.path.join(HERE, "..", "tools", "drafter_to_gguf.py"), "--quiet",
           zd, qt, gg])
    refused(binary, t, gg, ["DFlashDraftModel", t, "a Laguna model"],
            "z-lab GGUF drafter on a Laguna target")


def main():
    t0 = time.time()
    binary = o.ready()
    if not binary:
        return finish()
    try:
        from transformers.models.laguna import modeling_laguna  # noqa: F401
    except ImportError as e:
        missing(f"transformers with Laguna ({e})")
        return finish()
    with tempfile.TemporaryDirectory(prefix="test_laguna_drafter-") as tmp:
        dirs = o.make_target(tmp, "laguna", "LagunaConfig", TARGET, 23)
        print(f"  tolerance: max|diff| <= TOL * max(1, max|reference|), TOL {o.TOL}", flush=True)
        test_logits(binary, dirs, tmp)
        few = {dt: few_token_target(d, d + "-few") for dt, d in dirs.items()}
        test_generate(binary, dirs, few, tmp)
        test_probe(binary, dirs, tmp)
        test_chain(binary, few, tmp)
        test_refusals(binary, dirs, tmp)
    print(f"test_laguna_drafter: {time.time() - t0:.1f} s")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
