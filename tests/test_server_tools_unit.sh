#!/usr/bin/env bash
# test_server_tools_unit.sh - the tool-call parser and the required-call schema:
# builds tests/server/tools_unit.c with src/server/{tools,stop,text}.c and
# tests/testutil.c (with ASan+UBSan when the compiler has them) and runs it;
# family detection reads the real templates (assets: a skip when missing,
# a failure under CI=true).
set -euo pipefail
SRC=${DFLASH_SRC:-$(cd "$(dirname "$0")/.." && pwd)}
export DFLASH_SHARED=${DFLASH_SHARED:-$SRC/../shared}
CC=${CC:-cc}
out=$(mktemp -d /tmp/dflash-server-tools.XXXXXX)
trap 'rm -rf "$out"' EXIT
files=("$SRC/tests/server/tools_unit.c" "$SRC/src/server/tools.c" "$SRC/src/server/stop.c"
       "$SRC/src/server/text.c" "$SRC/tests/testutil.c")
flags=(-std=gnu11 -O1 -g -Wall -Wextra -Werror -I "$SRC/include" -I "$SRC/src" -I "$SRC/tests" -pthread)
san=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
if ! "$CC" "${flags[@]}" "${san[@]}" "${files[@]}" -lcjson -o "$out/unit" 2>"$out/san.log"; then
  echo "(building without sanitizers)"
  "$CC" "${flags[@]}" "${files[@]}" -lcjson -o "$out/unit"
fi
"$out/unit"
