#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ straight from the loader sources (no
# CMake) into build-fuzz/ and runs each for FUZZ_SECONDS (default 20) from a
# small seed corpus made on the spot. Exits nonzero if any target crashes,
# leaks, hits undefined behaviour or times out; the input that did it is
# kept as build-fuzz/crash-<target>-*.
#   FUZZ_SECONDS=60 scripts/fuzz.sh            # all targets
#   FUZZ_SECONDS=60 scripts/fuzz.sh gguf       # one target
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${FUZZ_OUT:-$root/build-fuzz}"
secs="${FUZZ_SECONDS:-20}"
shared="${DFLASH_SHARED:-$root/../shared}"
cc="${FUZZ_CC:-clang}"
targets=("$@")
((${#targets[@]})) || targets=(gguf safetensors config draft_config)
# ---- tokenizer target (tokenizer helper): built and run by its own block at the end
tok_target=0
(($#)) || tok_target=1
keep=()
for t in "${targets[@]}"; do if [ "$t" = tokenizer ]; then tok_target=1; else keep+=("$t"); fi; done
targets=("${keep[@]}")
# ---- end tokenizer

command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (apt-get install clang)"; exit 2; }
mkdir -p "$out"
cd "$root"

srcs=(src/base/base.c src/io/types.c src/io/gguf.c src/io/safetensors.c src/io/json.c
      src/models/config.c src/models/laguna_config.c src/models/qwen35_config.c
      src/draft/draft_config.c src/draft/laguna_dflash_config.c src/draft/dflash2_config.c)
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -fno-omit-frame-pointer -Wall -Iinclude -Isrc)
for t in "${targets[@]}"; do
  echo "fuzz: building fuzz_$t"
  "$cc" "${flags[@]}" "fuzz/fuzz_$t.c" "${srcs[@]}" -o "$out/fuzz_$t" -lcjson -lm -lpthread
done

# Seeds: small valid files of each kind, so the fuzzer starts past the magic.
seeds="$out/seeds"
rm -rf "$seeds"
mkdir -p "$seeds/gguf" "$seeds/safetensors" "$seeds/config"
/usr/bin/python3 - "$seeds" "$shared" <<'EOF'
import json, os, struct, sys
seeds, shared = sys.argv[1], sys.argv[2]

def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b

def gguf(kvs, tensors, align=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, typ, val in kvs:
        out += s(key) + struct.pack("<I", typ) + val
    off, data = 0, b""
    for name, ne, typ, raw in tensors:
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", typ, off)
        data += raw + b"\0" * (-len(raw) % align)
        off = len(data)
    out += b"\0" * (-len(out) % align)
    return out + data

toks = [b"<unk>", b"<s>", b"</s>", b"a"]
arr_str = struct.pack("<IQ", 8, len(toks)) + b"".join(struct.pack("<Q", len(t)) + t for t in toks)
kvs = [("general.architecture", 8, s("llama")), ("llama.block_count", 4, struct.pack("<I", 1)),
       ("llama.embedding_length", 4, struct.pack("<I", 32)),
       ("llama.attention.head_count", 4, struct.pack("<I", 4)),
       ("llama.feed_forward_length", 4, struct.pack("<I", 64)),
       ("llama.context_length", 4, struct.pack("<I", 128)),
       ("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
       ("tokenizer.ggml.add_bos_token", 7, b"\1"), ("tokenizer.ggml.tokens", 9, arr_str),
       ("tokenizer.ggml.scores", 9, struct.pack("<IQ4f", 6, 4, 0, 0, 0, -1)),
       ("general.alignment", 4, struct.pack("<I", 32))]
tens = [("token_embd.weight", [32, 4], 0, b"\1" * 512), ("q", [32, 2], 8, b"\2" * 68),
        ("h", [8], 1, b"\3" * 16), ("b", [4], 30, b"\4" * 8)]
open(f"{seeds}/gguf/small.gguf", "wb").write(gguf(kvs, tens))

# Laguna as llama.cpp's converter writes it: per-layer head counts, window and
# pattern (a bool per layer, or a period), RoPE per layer type, YaRN, experts
def u32(k, v): return (k, 4, struct.pack("<I", v))
def f32(k, v): return (k, 6, struct.pack("<f", v))
def arr(typ, fmt, vals): return struct.pack("<IQ", typ, len(vals)) + b"".join(struct.pack(fmt, v) for v in vals)
lag = [("general.architecture", 8, s("laguna")), u32("laguna.block_count", 2),
       u32("laguna.embedding_length", 32), ("laguna.attention.head_count", 9, arr(4, "<I", [4, 8])),
       u32("laguna.attention.head_count_kv", 2), u32("laguna.attention.key_length", 8),
       u32("laguna.attention.value_length", 8), u32("laguna.feed_forward_length", 64),
       u32("laguna.context_length", 128), f32("laguna.attention.layer_norm_rms_epsilon", 1e-6),
       f32("laguna.rope.freq_base", 5e5), u32("laguna.rope.dimension_count", 4),
       ("laguna.rope.scaling.type", 8, s("yarn")), f32("laguna.rope.scaling.factor", 4.0),
       u32("laguna.rope.scaling.original_context_length", 64),
       f32("laguna.rope.scaling.yarn_attn_factor", 1.0), u32("laguna.attention.sliding_window", 4),
       ("laguna.attention.sliding_window_pattern", 9, arr(7, "<B", [0, 1])),
       f32("laguna.rope.freq_base_swa", 1e4), u32("laguna.rope.dimension_count_swa", 8),
       u32("laguna.leading_dense_block_count", 1), u32("laguna.expert_count", 4),
       u32("laguna.expert_used_count", 2), u32("laguna.expert_feed_forward_length", 16),
       u32("laguna.expert_shared_feed_forward_length", 16),
       ("laguna.expert_weights_norm", 7, b"\1"), f32("laguna.expert_weights_scale", 2.5),
       u32("laguna.expert_gating_func", 4), f32("laguna.router_logit_softcapping", 1.5),
       ("tokenizer.ggml.tokens", 9, arr_str)]
lag_t = [("token_embd.weight", [32, 4], 0, b"\1" * 512), ("blk.0.attn_gate.weight", [32, 4], 0, b"\2" * 512),
         ("blk.1.attn_sinks.weight", [8], 0, b"\3" * 32)]
open(f"{seeds}/gguf/laguna.gguf", "wb").write(gguf(lag, lag_t))
lag2 = [kv for kv in lag if "pattern" not in kv[0]] + [u32("laguna.attention.sliding_window_pattern", 2)]
open(f"{seeds}/gguf/laguna_period.gguf", "wb").write(gguf(lag2, lag_t[:1]))
# Qwen3.5-MoE / Qwen3-Next / Qwen3-MoE as llama.cpp lays them out: the DeltaNet's ssm.*
# keys, recurrent layers as a bool per layer or an interval, M-RoPE sections, experts
# with a shared one; sparse layers are those with a router tensor
def qwen(a, extra):
    return [("general.architecture", 8, s(a)), u32(f"{a}.block_count", 2),
            u32(f"{a}.embedding_length", 32), u32(f"{a}.attention.head_count", 4),
            u32(f"{a}.attention.head_count_kv", 2), u32(f"{a}.attention.key_length", 8),
            u32(f"{a}.attention.value_length", 8), u32(f"{a}.context_length", 128),
            f32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6), f32(f"{a}.rope.freq_base", 1e7),
            u32(f"{a}.expert_count", 4), u32(f"{a}.expert_used_count", 2),
            u32(f"{a}.expert_feed_forward_length", 16), ("tokenizer.ggml.tokens", 9, arr_str)] + extra
hyb = [u32("qwen35moe.rope.dimension_count", 4), ("qwen35moe.rope.dimension_sections", 9,
       arr(5, "<i", [1, 1, 0, 0])), u32("qwen35moe.ssm.conv_kernel", 4),
       u32("qwen35moe.ssm.state_size", 8), u32("qwen35moe.ssm.group_count", 2),
       u32("qwen35moe.ssm.time_step_rank", 4), u32("qwen35moe.ssm.inner_size", 32),
       ("qwen35moe.attention.recurrent_layers", 9, arr(7, "<B", [1, 0])),
       u32("qwen35moe.expert_shared_feed_forward_length", 16),
       ("qwen35moe.expert_weights_norm", 7, b"\1"), u32("qwen35moe.feed_forward_length", 64)]
q_t = [("token_embd.weight", [32, 4], 0, b"\1" * 512), ("blk.0.ffn_gate_inp.weight", [32, 4], 0,
        b"\2" * 512), ("blk.0.ssm_a", [4], 0, b"\3" * 16)]
open(f"{seeds}/gguf/qwen35moe.gguf", "wb").write(gguf(qwen("qwen35moe", hyb), q_t))
nxt = [(k.replace("qwen35moe", "qwen3next"), t, v) for k, t, v in hyb
       if "recurrent_layers" not in k and "sections" not in k]
open(f"{seeds}/gguf/qwen3next.gguf", "wb").write(
    gguf(qwen("qwen3next", nxt + [u32("qwen3next.full_attention_interval", 2)]), q_t))
open(f"{seeds}/gguf/qwen3moe.gguf", "wb").write(
    gguf(qwen("qwen3moe", [u32("qwen3moe.feed_forward_length", 64)]), q_t[:2]))
open(f"{seeds}/gguf/empty.gguf", "wb").write(gguf([], []))
p = f"{shared}/assets/stories260K/stories260K.gguf"
if os.path.exists(p):
    open(f"{seeds}/gguf/stories_head.gguf", "wb").write(open(p, "rb").read()[:16384])

def st(entries):
    h, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dt, shape, raw in entries:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    js = json.dumps(h).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + data
open(f"{seeds}/safetensors/small.safetensors", "wb").write(
    st([("model.embed_tokens.weight", "F32", [2, 3], b"\0" * 24), ("h", "F16", [4], b"\1" * 8),
        ("b", "BF16", [1, 1, 1, 2], b"\2" * 4), ("s", "F32", [], b"\3" * 4)]))

base = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": [2, 3], "rope_scaling": None}
variants = {
    "qwen3": {},
    "yarn": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 1024}},
    "llama3": {"architectures": ["LlamaForCausalLM"], "head_dim": None,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False,
              "rope_scaling": {"type": "linear", "factor": 2.0}},
    "layer_types": {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    "laguna": {"architectures": ["LagunaForCausalLM"], "rope_scaling": None,
               "layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8,
               "num_attention_heads_per_layer": [4, 8], "mlp_layer_types": ["dense", "sparse"],
               "gating": "per-element", "num_experts": 8, "num_experts_per_tok": 2,
               "moe_intermediate_size": 32, "shared_expert_intermediate_size": 16,
               "moe_routed_scaling_factor": 2.5, "moe_router_logit_softcapping": 1.5,
               "rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 5e5,
                                                      "factor": 4.0, "partial_rotary_factor": 0.5,
                                                      "original_max_position_embeddings": 1024},
                                   "sliding_attention": {"rope_type": "default",
                                                         "rope_theta": 1e4}}},
    "laguna_sinks": {"architectures": ["LagunaForCausalLM"], "rope_scaling": None,
                     "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 2,
                     "swa_attention_sink_enabled": True, "moe_router_score_func": "sqrtsoftplus",
                     "gating": "per-head", "mlp_layer_types": ["sparse", "sparse"],
                     "num_experts": 4, "num_experts_per_tok": 4},
    "laguna_legacy": {"architectures": ["LagunaForCausalLM"], "mlp_only_layers": [0],
                      "decoder_sparse_step": 1, "gating": True, "partial_rotary_factor": 0.5,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 5e5},
                      "swa_rope_parameters": {"rope_theta": 1e4}, "num_experts": 4,
                      "num_experts_per_tok": 2},
    "qwen35": {"architectures": ["Qwen3_5ForCausalLM"], "rope_scaling": None,
               "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 4,
               "linear_key_head_dim": 16, "linear_value_head_dim": 24,
               "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                   "partial_rotary_factor": 0.25}},
}
variants["qwen3_next"] = {**variants["qwen35"], "architectures": ["Qwen3NextForCausalLM"],
                         "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [1],
                         "moe_intermediate_size": 32, "shared_expert_intermediate_size": 16,
                         "norm_topk_prob": False, "decoder_sparse_step": 1}
variants["qwen3_moe"] = {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4,
                        "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                        "mlp_only_layers": [0], "decoder_sparse_step": 1, "norm_topk_prob": True}
variants["qwen35_multimodal"] = {"architectures": ["Qwen3_5ForConditionalGeneration"],
                                 "tie_word_embeddings": False, "vision_config": {"depth": 1},
                                 "text_config": {**base, **variants["qwen35"],
                                                 "full_attention_interval": 2,
                                                 "layer_types": None}}
for name, v in variants.items():
    open(f"{seeds}/config/{name}.json", "w").write(json.dumps({**base, **v}))

# Laguna DFlash drafters for a target of 4 layers, hidden 64, vocabulary 512
os.makedirs(f"{seeds}/draft_config", exist_ok=True)
draft = {"architectures": ["DFlashLagunaForCausalLM"], "model_type": "laguna", "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "intermediate_size": 96, "vocab_size": 512, "rms_norm_eps": 1e-6,
         "rope_theta": 5e5, "sliding_window": 8, "gating": "per-head", "num_experts": 0,
         "layer_types": ["sliding_attention"] * 2,
         "dflash_config": {"block_size": 16, "mask_token_id": 12, "num_target_layers": 4,
                           "target_layer_ids": [1, 2], "causal": True}}
full = {**draft, "layer_types": ["full_attention"] * 2, "gating": "per-element",
        "draft_vocab_size": 512, "mlp_layer_types": ["dense", "sparse"],
        "rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 5e5,
                                               "factor": 4.0, "partial_rotary_factor": 0.5,
                                               "original_max_position_embeddings": 64},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        "dflash_config": {"block_size": 8, "mask_token_id": 0, "target_layer_ids": [0, 1, 2],
                          "use_swa": False, "use_aux_hidden_state": True}}
open(f"{seeds}/draft_config/published.json", "w").write(json.dumps(draft))
open(f"{seeds}/draft_config/full.json", "w").write(json.dumps(full))
# DFlash2 (DFlash2DraftModel) keys: the published shape, and softcap / multiplier set
d2 = {**draft, "architectures": ["DFlash2DraftModel"], "model_type": "qwen3",
      "dflash_config": {"block_size": 8, "mask_token_id": 12, "target_layer_ids": [1, 2],
                        "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                        "selector_top_k": 16}}
open(f"{seeds}/draft_config/dflash2.json", "w").write(json.dumps(d2))
d2["dflash_config"].update(conv_kernel_size=8, conv_group_size=64, selector_rank=1,
                           selector_top_k=512, output_multiplier=0.25,
                           final_logit_softcapping=30.0)
open(f"{seeds}/draft_config/dflash2_edges.json", "w").write(json.dumps(d2))
# z-lab / DFlash2 sliding layers (3 drafter layers): layer_types mixed, and the legacy form
d2s = {**d2, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
       "sliding_window": 2048}
open(f"{seeds}/draft_config/dflash2_sliding.json", "w").write(json.dumps(d2s))
leg = {**d2, "use_sliding_window": True, "max_window_layers": 1, "sliding_window": 4,
       "is_causal": True}
leg.pop("layer_types")
leg["dflash_config"] = {**d2["dflash_config"], "use_swa": True, "swa_window_size": 4}
open(f"{seeds}/draft_config/dflash2_legacy_swa.json", "w").write(json.dumps(leg))
EOF

fail=0
for t in "${targets[@]}"; do
  corpus="$out/corpus_$t"
  mkdir -p "$corpus"
  echo "fuzz: running fuzz_$t for ${secs}s"
  if ! "$out/fuzz_$t" -max_total_time="$secs" -max_len=32768 -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$out/crash-$t-" "$corpus" "$seeds/$t" \
       >"$out/fuzz_$t.log" 2>&1; then
    echo "fuzz: fuzz_$t FAILED (log: $out/fuzz_$t.log)"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$out/fuzz_$t.log" | head -20 || true
    fail=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$out/fuzz_$t.log" | tail -2 || true
  fi
done
# ---- tokenizer target (tokenizer helper) ------------------------------------------
# fuzz_tokenizer: tokenizer.json / tokenizer_config.json parsing and GGUF
# vocabularies, then encode, streaming decode and chat rendering of what loads.
if ((tok_target)); then
  echo "fuzz: building fuzz_tokenizer"
  "$cc" "${flags[@]}" fuzz/fuzz_tokenizer.c src/base/base.c src/io/types.c src/io/gguf.c \
    src/io/json.c src/tokenizer/*.c src/api/tokenize.c -o "$out/fuzz_tokenizer" -lcjson -lpcre2-8 -lutf8proc -lm -lpthread
  mkdir -p "$seeds/tokenizer"
  /usr/bin/python3 - "$seeds/tokenizer" <<'EOF'
import json, struct, sys
d = sys.argv[1]
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
split = {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False}
vocab = {c: i for i, c in enumerate("abcdeĠHlowrd,!")}
vocab.update({"ab": 14, "Ġa": 15, "He": 16, "ll": 17, "Hell": 18, "Hello": 19})
merges = ["a b", "Ġ a", "H e", "l l", "He ll", ["Hell", "o"]]
added = [{"id": 20, "content": "<|im_start|>", "special": True, "normalized": False, "lstrip": False,
          "rstrip": False, "single_word": False},
         {"id": 21, "content": "<think>", "special": False, "normalized": True, "lstrip": True,
          "rstrip": True, "single_word": False}]
bpe = {"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, bl]},
       "decoder": bl, "post_processor": bl, "added_tokens": added,
       "model": {"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": True}}
cfg = {"bos_token": "<|im_start|>", "add_bos_token": True, "eos_token": {"content": "<think>"},
       "chat_template": "{{ '<|im_start|>' }}{% if enable_thinking %}<think>{% endif %}"}
open(f"{d}/bytelevel.json", "w").write(json.dumps(bpe) + "\0" + json.dumps(cfg) + "\0Hello, world! ab <think> x")
sp = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "a": 4, "b": 5, "▁a": 6, "ab": 7, "<0x41>": 8,
      "<0xC3>": 9, "<0xA9>": 10}
ms = {"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                     {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
      "pre_tokenizer": None,
      "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                  {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}}],
                         "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
      "added_tokens": [{"id": 1, "content": "<s>", "special": True, "normalized": False}],
      "model": {"type": "BPE", "vocab": sp, "merges": ["▁ a", "a b"], "byte_fallback": True,
                "fuse_unk": True, "unk_token": "<unk>"}}
open(f"{d}/metaspace.json", "w").write(json.dumps(ms) + "\0\0a ab é A")
meta = dict(ms, normalizer=None,
            pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True})
open(f"{d}/metaspace_pre.json", "w").write(json.dumps(meta))
def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b
def arr_str(items):
    return struct.pack("<IQ", 8, len(items)) + b"".join(s(i) for i in items)
def gguf(kvs):
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(
        s(k) + struct.pack("<I", t) + v for k, t, v in kvs)
toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["▁", "a", "▁a", "b", "ab"]
n = len(toks)
open(f"{d}/spm.gguf", "wb").write(gguf([
    ("tokenizer.ggml.model", 8, s("llama")), ("tokenizer.ggml.tokens", 9, arr_str(toks)),
    ("tokenizer.ggml.scores", 9, struct.pack(f"<IQ{n}f", 6, n, *[-float(i) for i in range(n)])),
    ("tokenizer.ggml.token_type", 9, struct.pack(f"<IQ{n}i", 5, n, 2, 3, 3, *([6] * 256), 1, 1, 1, 1, 1)),
    ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)), ("tokenizer.chat_template", 8, s("<|im_start|>"))]))
bt = ["a", "b", "ab", "Ġ", "Ġa", "<|endoftext|>"]
open(f"{d}/gpt2.gguf", "wb").write(gguf([
    ("tokenizer.ggml.model", 8, s("gpt2")), ("tokenizer.ggml.pre", 8, s("qwen2")),
    ("tokenizer.ggml.tokens", 9, arr_str(bt)),
    ("tokenizer.ggml.token_type", 9, struct.pack("<IQ6i", 5, 6, 1, 1, 1, 1, 1, 3)),
    ("tokenizer.ggml.merges", 9, arr_str(["a b", "Ġ a"]))]))
EOF
  corpus="$out/corpus_tokenizer"
  mkdir -p "$corpus"
  echo "fuzz: running fuzz_tokenizer for ${secs}s"
  if ! "$out/fuzz_tokenizer" -max_total_time="$secs" -max_len=32768 -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$out/crash-tokenizer-" "$corpus" "$seeds/tokenizer" \
       >"$out/fuzz_tokenizer.log" 2>&1; then
    echo "fuzz: fuzz_tokenizer FAILED (log: $out/fuzz_tokenizer.log)"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$out/fuzz_tokenizer.log" | head -20 || true
    fail=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$out/fuzz_tokenizer.log" | tail -2 || true
  fi
fi
# ---- end tokenizer
exit $fail
