#!/usr/bin/env bash
# arm_golden.sh BUILD_DIR - the aarch64 build under qemu-user gives stories260K's
# golden greedy ids (llama2.c's, ../shared/assets) on the NEON path and on the
# plain-C twins, and the probe finds NEON's verify rows equal to its decode rows.
# One thread: an emulated thread pool's spinning makes 2-thread runs crawl.
set -euo pipefail
cd "$(dirname "$0")/.."
B=$1
A=../shared/assets/stories260K
run() { qemu-aarch64 -L /usr/aarch64-linux-gnu "$B/dflash" "$@"; }
want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token_ids_helper_computed"][1:])' \
  "$A/golden_greedy.json")
for isa in neon generic; do
  got=$(DFLASH_ISA=$isa run generate -m "$A/stories260K.gguf" -p "" -n 200 -t 1 --print-token-ids \
        -q 2>&1 >/dev/null | sed -n 's/^generated ids ([0-9]*): //p')
  if [ "$got" != "$want" ]; then echo "FAIL: $isa: ids differ from the golden"; exit 1; fi
  echo "ok: $isa: the 200 golden ids"
done
out=$(DFLASH_ISA=neon run probe -m "$A/stories260K.gguf" --draft models/stories260K-dflash -t 1 -n 16)
case "$out" in *'"exact": true'*) echo "ok: neon: probe exact";; *) echo "FAIL: probe: $out"; exit 1;; esac
