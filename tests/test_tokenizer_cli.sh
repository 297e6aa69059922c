#!/usr/bin/env bash
# dflash tokenize / detokenize on a Hugging Face folder and on GGUF files,
# against third-party ids: Hugging Face's (qwen3_basic_20.json), llama2.c's
# (stories260K) and llama.cpp's (ggml-vocab-llama-spm). Round trips through
# detokenize; bad input exits non-zero with a message.
set -u
bin=${DFLASH_BIN:?}
assets=${DFLASH_SHARED:-../shared}/assets
qwen=$assets/tokenizers/qwen3
stories=$assets/stories260K/stories260K.gguf
spm=$assets/vectors/llama.cpp/ggml-vocab-llama-spm.gguf
for f in "$qwen/tokenizer.json" "$stories" "$spm"; do
  if [ ! -r "$f" ]; then
    if [ "${CI:-}" = true ]; then echo "FAIL: $f missing"; echo "0 passed, 1 failed"; exit 1; fi
    echo "skip: $f missing"; echo "0 passed, 0 failed"; exit 77
  fi
done
pass=0 fail=0
tmp=$(mktemp -d /tmp/dflash-test-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

expect() { # name, expected, actual
  if [ "$2" = "$3" ]; then pass=$((pass + 1)); else
    fail=$((fail + 1)); printf 'FAIL %s\n  expected: %s\n  got:      %s\n' "$1" "$2" "$3"; fi
}
fails() { # name, expected substring of stderr, command...
  local name=$1 sub=$2; shift 2
  if "$@" >"$tmp/out" 2>"$tmp/err"; then
    fail=$((fail + 1)); echo "FAIL $name: exit 0"
  elif grep -q -- "$sub" "$tmp/err"; then pass=$((pass + 1))
  else fail=$((fail + 1)); echo "FAIL $name: stderr: $(cat "$tmp/err")"; fi
}

# Hugging Face folder: ids from HF's Rust tokenizers (qwen3_basic_20.json)
expect qwen3-hello "[9707, 11, 1879, 0]" "$("$bin" tokenize -m "$qwen" --text "Hello, world!")"
expect qwen3-chat "[151644, 872, 198, 6023, 151645, 198]" \
  "$("$bin" tokenize -m "$qwen" --text $'<|im_start|>user\nhi<|im_end|>\n')"
expect qwen3-emoji "[141334, 144841, 144349, 145375, 42365, 11162, 248, 222]" \
  "$("$bin" tokenize -m "$qwen" --text "😀🎉👍🏽 emoji 🚀")"
expect qwen3-special-as-text "[27, 91, 318, 4906, 91, 29]" \
  "$("$bin" tokenize -m "$qwen" --text "<|im_start|>" --no-parse-special)"
printf '日本語のテキストです' >"$tmp/ja.txt"
expect qwen3-file "[101059, 102819, 15767, 56833, 61803, 70534, 37541]" \
  "$("$bin" tokenize -m "$qwen" --file "$tmp/ja.txt")"
expect qwen3-stdin "[9707]" "$(printf Hello | "$bin" tokenize -m "$qwen" --file -)"
expect qwen3-detok $'<|im_start|>user\nhi<|im_end|>' \
  "$("$bin" detokenize -m "$qwen" --ids 151644,872,198,6023,151645)"
expect qwen3-detok-skip $'user\nhi' \
  "$("$bin" detokenize -m "$qwen" --ids 151644,872,198,6023,151645 --skip-special)"
expect qwen3-split-emoji "😀🎉" "$("$bin" detokenize -m "$qwen" --ids 141334,144841)"

# GGUF, llama/SPM vocabulary: llama2.c's prompt ids, BOS added by --special
expect stories-bos "[1, 403, 407, 261, 378]" \
  "$("$bin" tokenize -m "$stories" --text "Once upon a time" --special)"
expect stories-nobos "[403, 407, 261, 378]" "$("$bin" tokenize -m "$stories" --text "Once upon a time")"
expect stories-detok "Once upon a time" "$("$bin" detokenize -m "$stories" --ids 403,407,261,378 --skip-special)"
# llama.cpp's Llama-2 vocabulary: byte fallback for the llama emoji
expect spm-llama " this is 🦙.cpp" "$("$bin" detokenize -m "$spm" --ids 29871,445,338,29871,243,162,169,156,29889,8223)"
expect spm-ids "[29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223]" \
  "$("$bin" tokenize -m "$spm" --text " this is 🦙.cpp")"

# round trip of a whole file through both commands
head -c 20000 "$assets/corpus/tinyshakespeare.txt" >"$tmp/en.txt"
ids=$("$bin" tokenize -m "$qwen" --file "$tmp/en.txt" | tr -d '[] ')
"$bin" detokenize -m "$qwen" --ids "$ids" >"$tmp/back.txt"
if cmp -s "$tmp/en.txt" "$tmp/back.txt"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL round trip"; fi

# errors
fails bad-id "not in the vocabulary" "$bin" detokenize -m "$qwen" --ids 1,999999999
fails bad-ids "comma-separated" "$bin" detokenize -m "$qwen" --ids 1,x
fails no-text "exactly one" "$bin" tokenize -m "$qwen"
fails no-model "cannot open" "$bin" tokenize -m "$tmp/none.gguf" --text hi
printf '\xff\xfe' >"$tmp/bad.txt"
fails bad-utf8 "UTF-8" "$bin" tokenize -m "$qwen" --file "$tmp/bad.txt"
mkdir -p "$tmp/broken"
printf '{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}}' >"$tmp/broken/tokenizer.json"
fails bad-merges "merges\[0\]" "$bin" tokenize -m "$tmp/broken" --text hi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
