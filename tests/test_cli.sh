#!/usr/bin/env bash
# test_cli.sh - CLI behaviour users rely on: --version on the program and on a
# subcommand; a number that does not parse is an error (exit 2 naming the
# flag), never a silent 0; `dflash serve` with no -m loads the built-in model
# with its drafter, as `dflash generate` does; -f - reads the prompt from
# standard input, -f FILE from a file, both as -p would; generate prints a
# load summary.
set -u
BIN=${DFLASH_BIN:?}
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d /tmp/dflash-test-XXXXXX)
trap 'rm -rf "$tmp"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null' EXIT

for args in "--version" "-V" "generate --version" "serve --version"; do
  out=$("$BIN" $args 2>&1); rc=$?
  [ $rc = 0 ] && [[ "$out" =~ ^dflash\ [0-9]+\.[0-9]+\.[0-9]+ ]] && ok || bad "'$args': exit $rc, '$out'"
done

for args in "generate --seed abc -p hi" "generate --seed -1 -p hi" "generate --seed 12x -p hi" \
             "capture --seed 1.5 --corpus x --out y"; do
  "$BIN" $args >/dev/null 2>"$tmp/err"; rc=$?
  [ $rc = 2 ] && grep -q -- "--seed" "$tmp/err" && ok || bad "'$args': exit $rc, $(cat "$tmp/err")"
done

ids() { "$BIN" generate -n 8 -t 1 -q --print-token-ids "$@" 2>&1 >/dev/null | grep '^generated ids'; }
want=$(ids -p "Once upon a time")
printf 'Once upon a time' >"$tmp/p.txt"
[ -n "$want" ] && [ "$(printf 'Once upon a time' | ids -f -)" = "$want" ] && ok || bad "-f - differs from -p"
[ "$(ids -f "$tmp/p.txt")" = "$want" ] && ok || bad "-f FILE differs from -p"
"$BIN" generate -f "$tmp/none.txt" -n 1 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc != 0 ] && grep -q "none.txt" "$tmp/err" && ok || bad "-f of a missing file: exit $rc, $(cat "$tmp/err")"

# the load summary: architecture, parameters, weights, context, threads, kernels, template, drafter
"$BIN" generate -p hi -n 2 -t 1 >/dev/null 2>"$tmp/err"
grep -Eq "^dflash generate: target: llama, [0-9.]+ M parameters .*f32 weights .*context 512 of 512.* 1 threads, (avx2|generic) kernels; chat template: ChatML \(the model has none\); DFlash drafter of 2 layers, block 8$" "$tmp/err" &&
  ok || bad "load summary: $(grep '^dflash generate:' "$tmp/err")"

"$BIN" serve --host 127.0.0.1 --port 0 -t 1 >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -q "ready:" "$tmp/serve.log" && break; sleep 0.1; done
grep -q "ready: .*DFlash drafter" "$tmp/serve.log" && ok || bad "serve without -m has no drafter: $(cat "$tmp/serve.log")"
kill "$pid"; wait "$pid"; pid=

echo "$pass passed, $fail failed"
[ $fail = 0 ]
