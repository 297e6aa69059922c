#!/usr/bin/env bash
# test_server_unit.sh - the server's text pieces (stop strings with hold-back,
# UTF-8, JSON nesting scan, constant-time compare, the web page's paths) against
# plain references: builds tests/server/unit.c with src/server/{stop,text,static}.c (with ASan+UBSan
# when the compiler has them) and runs it.
set -euo pipefail
SRC=${DFLASH_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
CC=${CC:-cc}
out=$(mktemp -d /tmp/dflash-server-unit.XXXXXX)
trap 'rm -rf "$out"' EXIT
files=("$SRC/tests/server/unit.c" "$SRC/src/server/stop.c" "$SRC/src/server/text.c" "$SRC/src/server/static.c")
flags=(-std=gnu11 -O1 -g -Wall -Wextra -Werror -I "$SRC/include" -I "$SRC/src" -pthread)
san=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
if ! "$CC" "${flags[@]}" "${san[@]}" "${files[@]}" -o "$out/unit" 2>/dev/null; then
  echo "(building without sanitizers)"
  "$CC" "${flags[@]}" "${files[@]}" -o "$out/unit"
fi
"$out/unit"
