#!/usr/bin/env python3
"""test_hybrid_gguf.py - Qwen3.5 (dense, multimodal, MoE), Qwen3-Next and Qwen3-MoE in
llama.cpp's GGUF layout (tools/hybrid_to_gguf.py), and refusals of malformed metadata.

1. transformers makes test_hf_oracle.py's random checkpoints of these families (value
   heads twice or three times the key heads, key and value head dims apart, the
   multimodal class, a dense layer among sparse ones, Qwen3-Next's fused projections);
   tools/hybrid_to_gguf.py converts each, f32 and bf16; `dflash dump` logits and hidden
   states from the .gguf must be bit-identical to those from the folder (prefill and
   decode, f32 cache), 64 greedy ids of `dflash generate` from the .gguf must be the
   folder's, and `dflash probe` on the .gguf must find 0 bytes differing at B=2..16
   (recurrent states included);
2. the 256-wide Qwen3.5: `dflash quantize` of its .gguf to q8_0 computes the bytes of
   the folder at --dtype q8_0 (the tiled value heads' columns move as whole blocks);
   to q4_k, whose blocks span several heads, ssm_out stays tiled and the forward
   writes its input so: the probe still finds 0 bytes differing;
3. a Qwen3.5 GGUF with an MTP head appended as llama.cpp's converter does
   (nextn_predict_layers more blocks) computes the folder's bits, the head not run;
4. Qwen3.5's pre-tokenizer (letters with their combining marks): the converter names it
   "qwen35" as llama.cpp does, and `dflash tokenize` on such a vocabulary gives the
   tokenizers library's ids on texts with marks (where qwen2's split differs);
5. malformed GGUF metadata, each refused with a message naming the key.
llama.cpp's own reading of these files was checked by hand (docs/models.md).
Without $DFLASH_BIN or torch/transformers: skipped, unless CI=true.
"""
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))
import test_hf_oracle as O  # noqa: E402
import test_laguna_gguf as LG  # noqa: E402  (bit comparison, quantize, refusal helpers)
from testlib import check, finish, missing  # noqa: E402

CASES = ["qwen35-hybrid-untied", "qwen35-multimodal-tied", "qwen35moe-hybrid",
         "qwen3next-grouped-moe", "qwen35-256-probe", "qwen3moe-sparse"]


def convert(d, outtype="auto"):
    import hybrid_to_gguf
    path = d + ("" if outtype == "auto" else "-" + outtype) + ".gguf"
    hybrid_to_gguf.convert(d, path, outtype, quiet=True)
    return path


def same_greedy(binary, name, d, path):
    try:
        a, b = O.generate(binary, d, "f32"), O.generate(binary, path, "f32")
    except RuntimeError as e:
        return check(False, f"{name} generate: {e}")
    ok = a == b and len(a[1]) == O.N_GEN
    check(ok, f"{name}: greedy ids from the GGUF differ from the folder's")
    print(f"  {name:30s} generate {O.N_GEN} greedy ids GGUF vs folder: "
          f"{'same' if ok else 'DIFFERENT'}", flush=True)


def test_cases(binary, tmp):
    out = {}
    for name, cls, kw, seed in [a for a in O.ARCHS if a[0] in CASES]:
        dirs = O.make_target(tmp, name, cls, kw, seed)
        text = kw.get("text_config", kw)
        ggufs = {dt: convert(d) for dt, d in dirs.items()}
        for dt in dirs:
            LG.same_bits(f"{name} {dt}", binary, dirs[dt], ggufs[dt], text["hidden_size"],
                         text["num_hidden_layers"])
        same_greedy(binary, name, dirs["f32"], ggufs["f32"])
        O.test_probe(binary, name + ".gguf", ggufs)
        out[name] = (dirs, ggufs)
    return out


def test_quantized(binary, dirs, ggufs):
    name = "qwen35-256-probe"
    LG.quantized_same(binary, name, dirs["f32"], ggufs["f32"], "q8_0")
    q = ggufs["f32"][:-5] + "-q4_k.gguf"
    O.run([binary, "quantize", "-m", ggufs["f32"], "--out", q, "--type", "q4_k", "-t", "2"])
    O.test_probe(binary, name + " q4_k.gguf", {"f32": q, "bf16": q})


def test_mtp_blocks(binary, tmp, dirs, ggufs):
    """llama.cpp's converter appends a Qwen3.5 MTP head as nextn_predict_layers more blocks:
    a file with one (the last layer's tensors again as blk.4) computes the folder's bits."""
    import gguf
    src, dst = ggufs["f32"], os.path.join(tmp, "mtp.gguf")
    more = [(t.name.replace("blk.3.", "blk.4."), np.array(t.data), t.tensor_type)
            for t in gguf.GGUFReader(src).tensors if t.name.startswith("blk.3.")]
    LG.rewrite_gguf(src, dst, {"block_count": 5, "nextn_predict_layers": 1}, "qwen35", more)
    LG.same_bits("qwen35 + MTP blocks", binary, dirs["f32"], dst, 64, 4)


# ---- Qwen3.5's pre-tokenizer (tokenizer.ggml.pre "qwen35") ----------------------------------

QWEN35_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?"
                "[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
MARK_TEXTS = [  # Devanagari, decomposed accents, Vietnamese, pointed Hebrew, Zalgo, ASCII, Arabic
    '\u0915\u094d\u0937\u0924\u094d\u0930\u093f\u092f \u0928\u092e\u0938\u094d\u0924\u0947 '
    '\u0926\u0941\u0928\u093f\u092f\u093e',
    'e\u0301t\xe9 cafe\u0301 na\u0308ive',
    'Ti\u1ebfng Vi\u1ec7t c\xf3 d\u1ea5u',
    '\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd \u05e2\u05d5\u05b9\u05dc\u05b8\u05dd',
    '\u0105\u0337\u0327 Z\u0324\u0354\u0367\u0311\u0313\xe4\u0356\u032d\u0308\u0307l\u036e'
    '\u0312\u036b\u01e7\u0317\u035a\u031ao\u0319\u0314\u036e\u0307\u0350\u0307',
    "hello world, it's 2026!",
    '\u0645\u0631\u062d\u0628\u064b\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645',
]


def tokenize(binary, vocab, texts):
    import json
    import subprocess
    r = subprocess.run([binary, "tokenize", "-m", vocab, "--jsonl", "-"], capture_output=True,
                       input="".join(json.dumps(x) + "\n" for x in texts).encode(), timeout=120)
    if r.returncode:
        raise RuntimeError(r.stderr.decode(errors="replace")[-300:])
    return [json.loads(line) for line in r.stdout.decode().splitlines()]   # ids per line


def test_qwen35_pretokenizer(binary, tmp):
    """Qwen3.5's tokenizer.json splits letters with their combining marks (\\p{M}); the
    converter names that "qwen35", as llama.cpp does, and the engine's split matches the
    tokenizers library's (Qwen3's vocabulary with Qwen3.5's split regex)."""
    import json
    import gguf
    import hf_to_gguf as H
    from tokenizers import Tokenizer
    shared = os.environ.get("DFLASH_SHARED", os.path.join(HERE, "..", "..", "shared"))
    src = os.path.join(shared, "assets", "tokenizers", "qwen3", "tokenizer.json")
    if not os.path.exists(src):
        return missing(f"{src} (the Qwen3 vocabulary)")
    tok = json.load(open(src))
    tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN35_SPLIT
    d = os.path.join(tmp, "qwen35-vocab")
    os.makedirs(d)
    json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
    hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    vocabs = {}
    for pre in ("qwen35", "qwen2"):
        path = os.path.join(d, pre + ".gguf")
        w = gguf.GGUFWriter(path, "qwen35")
        name = H.pre_tokenizer_name
        if pre == "qwen2":   # the split without marks: the texts must tell the two apart
            H.pre_tokenizer_name = lambda t: "qwen2"
        try:
            H.add_tokenizer(w, d, {}, hf.get_vocab_size())
        finally:
            H.pre_tokenizer_name = name
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        vocabs[pre] = path
    meta = gguf.GGUFReader(vocabs["qwen35"]).fields["tokenizer.ggml.pre"].contents()
    check(meta == "qwen35", f"converter's tokenizer.ggml.pre for Qwen3.5's split: {meta!r}")
    want = [hf.encode(x, add_special_tokens=False).ids for x in MARK_TEXTS]
    try:
        got, other = tokenize(binary, vocabs["qwen35"], MARK_TEXTS), \
            tokenize(binary, vocabs["qwen2"], MARK_TEXTS)
    except RuntimeError as e:
        return check(False, f"dflash tokenize: {e}")
    same = sum(g == w for g, w in zip(got, want))
    check(same == len(MARK_TEXTS), f"qwen35 pre-tokenizer: {same} of {len(MARK_TEXTS)} texts "
                                   "as tokenizers splits them")
    check(other != want, "the texts do not tell qwen35's split from qwen2's")
    print(f"  qwen35 pre-tokenizer: {same} of {len(MARK_TEXTS)} texts as tokenizers; qwen2's "
          f"split differs on {sum(o != w for o, w in zip(other, want))}", flush=True)


# ---- 4: refusals -------------------------------------------------------------------------

# (name, source case, {key: value or None to drop}, what the message must name)
GGUF_BAD = [
    ("inner_size not whole heads", "qwen35-hybrid-untied", {"ssm.inner_size": 95},
     "ssm.inner_size"),
    ("time_step_rank missing", "qwen35-hybrid-untied", {"ssm.time_step_rank": None},
     "ssm.time_step_rank"),
    ("value heads vs key heads", "qwen35-hybrid-untied", {"ssm.time_step_rank": 3},
     "ssm.time_step_rank"),
    ("conv kernel 0", "qwen35-hybrid-untied", {"ssm.conv_kernel": 0}, "ssm.conv_kernel"),
    ("group_count vs attn_qkv", "qwen35-hybrid-untied", {"ssm.group_count": 4},
     "attn_qkv.weight"),
    ("interval 0", "qwen35-hybrid-untied", {"full_attention_interval": 0},
     "full_attention_interval"),
    ("recurrent_layers length", "qwen3next-grouped-moe",
     {"attention.recurrent_layers": [True, False]}, "attention.recurrent_layers"),
    ("odd rope dims", "qwen35-hybrid-untied", {"rope.dimension_count": 7},
     "rope.dimension_count"),
    ("rope dims > head_dim", "qwen35-hybrid-untied", {"rope.dimension_count": 34},
     "rope.dimension_count"),
    ("sections > 4", "qwen35-hybrid-untied", {"rope.dimension_sections": [1, 1, 1, 1, 1]},
     "rope.dimension_sections"),
    ("dense without ffn length", "qwen3next-grouped-moe", {"feed_forward_length": None},
     "feed_forward_length"),
    ("used > experts", "qwen35moe-hybrid", {"expert_used_count": 7}, "expert_used_count"),
    ("expert count missing", "qwen35moe-hybrid", {"expert_count": None}, "expert_count"),
    ("shared length missing", "qwen35moe-hybrid",
     {"expert_shared_feed_forward_length": None}, "expert_shared_feed_forward_length"),
    ("sigmoid gating", "qwen35moe-hybrid", {"expert_gating_func": 2}, "expert_gating_func"),
    ("weights scaled", "qwen3moe-sparse", {"expert_weights_scale": 2.5},
     "expert_weights_scale"),
    ("expert length vs stacks", "qwen3moe-sparse", {"expert_feed_forward_length": 40},
     "ffn_gate_exps.weight"),
]


def arch_of(path):
    import gguf
    return bytes(gguf.GGUFReader(path).fields["general.architecture"].parts[-1]).decode()


def test_refusals(binary, tmp, made):
    for i, (name, case, change, want) in enumerate(GGUF_BAD):
        src = made[case][1]["f32"]
        bad = os.path.join(tmp, f"bad-{i}.gguf")
        LG.rewrite_gguf(src, bad, change, arch_of(src))
        LG.refused(binary, "gguf " + name, bad, want)


def main():
    t0, binary = time.time(), O.ready()
    if not binary:
        return finish()
    with tempfile.TemporaryDirectory(prefix="test_hybrid_gguf-") as tmp:
        made = test_cases(binary, tmp)
        test_quantized(binary, *made["qwen35-256-probe"])
        test_mtp_blocks(binary, tmp, *made["qwen35-hybrid-untied"])
        test_qwen35_pretokenizer(binary, tmp)
        test_refusals(binary, tmp, made)
    print(f"test_hybrid_gguf: {time.time() - t0:.1f} s")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
