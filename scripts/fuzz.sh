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
((${#targets[@]})) || targets=(gguf safetensors config)

command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (apt-get install clang)"; exit 2; }
mkdir -p "$out"
cd "$root"

srcs=(src/base/base.c src/io/types.c src/io/gguf.c src/io/safetensors.c src/io/json.c
      src/models/config.c)
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
}
for name, v in variants.items():
    open(f"{seeds}/config/{name}.json", "w").write(json.dumps({**base, **v}))
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
exit $fail
