#!/usr/bin/env bash
# Runs the real program under valgrind (memcheck) on a real model: generate
# classic and speculative-less paths, the n-gram lane with the drafter, draft trees (also on
# sliding-window layers), a two-turn chat, tokenize, and a malformed file. Any
# invalid access or leak fails the test.
set -u
bin=${DFLASH_BIN:?}
model=${DFLASH_SHARED:-../shared}/assets/stories260K/stories260K.gguf
if [ ! -r "$model" ]; then
  if [ "${CI:-}" = true ]; then echo "FAIL: $model missing"; echo "0 passed, 1 failed"; exit 1; fi
  echo "skip: $model missing"; exit 77
fi
if ! command -v valgrind >/dev/null; then
  if [ "${CI:-}" = true ]; then echo "FAIL: valgrind missing"; echo "0 passed, 1 failed"; exit 1; fi
  echo "skip: valgrind missing"; exit 77
fi
pass=0 fail=0
vg() {
  local name=$1; shift
  if valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
       "$@" >/tmp/vg.$$.out 2>&1; then
    pass=$((pass + 1))
  else
    rc=$?
    # A refused input exits 1 by design; only valgrind's 99 is a failure there.
    if [ "$name" = bad-file ] && [ $rc = 1 ]; then pass=$((pass + 1)); return; fi
    fail=$((fail + 1)); echo "FAIL $name (exit $rc)"; tail -30 /tmp/vg.$$.out
  fi
}
vg generate "$bin" generate -m "$model" -p "Once upon a time" -n 24 -t 2 -q
# the n-gram lane beside the trained drafter, on a prompt that repeats
draft=${DFLASH_SRC:-.}/models/stories260K-dflash
[ -d "$draft" ] && vg ngram "$bin" generate -m "$model" --draft "$draft" --ngram -n 40 -t 2 -q \
  -p "Once upon a time, Lily had a ball. Once upon a time, Lily"
# draft trees (DDTree): parent-tagged rows, the walk, path compaction
[ -d "$draft" ] && vg tree "$bin" generate -m "$model" --draft "$draft" --tree-budget 16 -n 40 \
  -t 2 -q --ignore-eos -p "Once upon a time"
# draft trees on sliding-window layers: a random Qwen3 whose window of 6 is shorter than the
# paths (tree rows gathered from the ring, kept rows moved inside it)
py=${DFLASH_PYTHON:-python3}
tools=${DFLASH_SRC:-.}/tools
swa=$(mktemp -d)
if "$py" "$tools/make_checkpoint.py" --arch qwen3 --dim 64 --layers 4 --heads 4 --kv-heads 2 \
     --head-dim 16 --ffn 192 --vocab 512 --untied --sliding-window 6 --quiet --out "$swa/t" &&
   "$py" "$tools/make_checkpoint.py" --drafter --target "$swa/t" --layers 1 --block-size 16 \
     --quiet --out "$swa/d"; then
  vg tree-sliding "$bin" generate -m "$swa/t" --draft "$swa/d" --tree-budget 8 -n 40 -t 2 -q \
    --ignore-eos -p "Once upon a time"
else
  fail=$((fail + 1)); echo "FAIL tree-sliding: could not make the random checkpoints"
fi
rm -rf "$swa"
vg tokenize "$bin" tokenize -m "$model" --text "Lily saw a big red ball."
vg chat "$bin" chat -m "$model" -n 8 -t 2 -q < <(printf 'Once upon a time\nThe end\n')
bad=$(mktemp); head -c 5000 "$model" > "$bad"
vg bad-file "$bin" generate -m "$bad" -p hi -n 4 -q
rm -f "$bad" /tmp/vg.$$.out
echo "$pass passed, $fail failed"
[ $fail = 0 ]
