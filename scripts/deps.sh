#!/usr/bin/env bash
# Installs what dflash needs on a fresh Debian machine, and nothing that is
# already there:
#  - Debian packages (the C toolchain and libraries, and tools the tests use:
#    prometheus for promtool, valgrind, clang, tmux, haproxy for the replica test,
#    chromium and its driver for the web page's browser test);
#  - one Python virtual environment, $DFLASH_VENV (default build/venv), from the
#    pinned requirements.txt. The tests' oracles live there: transformers and
#    torch (CPU use; PyPI's wheel also brings CUDA libraries, installed once per
#    venv), tokenizers, safetensors, gguf, jinja2, the openai client, and
#    selenium (it drives chromium in tests/test_webui.py).
#    A stamp holding requirements.txt's hash makes a second run a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake pkg-config libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      python3 python3-venv python3-pip clang valgrind prometheus tmux haproxy curl unzip
      chromium chromium-driver)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

venv=${DFLASH_VENV:-build/venv}
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  echo "deps: Python packages into $venv (requirements.txt; torch is large, this takes minutes once)"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r requirements.txt
  echo "$want" >"$venv/.requirements.sha256"
fi
