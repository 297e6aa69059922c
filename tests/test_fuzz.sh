#!/usr/bin/env bash
# Runs the loader fuzz targets briefly (scripts/fuzz.sh, 15 s each). Skips
# when clang is missing, except under CI=true where that is a failure.
set -euo pipefail
src="${DFLASH_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
if ! command -v clang >/dev/null; then
  if [ "${CI:-}" = true ]; then echo "FAIL: clang missing (required under CI)"; exit 1; fi
  echo "skip: clang not installed"
  exit 77
fi
out="${DFLASH_BUILD:-$src/build}/fuzz"
FUZZ_SECONDS="${FUZZ_SECONDS:-15}" FUZZ_OUT="$out" "$src/scripts/fuzz.sh"
