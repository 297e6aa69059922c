#!/usr/bin/env bash
# arm_sysroot.sh DIR - the arm64 libraries dflash links (cJSON, PCRE2,
# utf8proc) unpacked under DIR, for the aarch64 cross build (make check-arm).
# A private apt state under DIR fetches Debian's arm64 packages, so the
# machine's own apt setup (its architectures, its installed -dev packages)
# is left as it is, and no root is needed. A stamp makes a second run a no-op.
set -euo pipefail
dir=$1
pkgs=(libcjson1 libcjson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev)
[ -f "$dir/.done" ] && exit 0
mkdir -p "$dir/apt/lists/partial" "$dir/apt/archives/partial" "$dir/debs"
apt_opts=(-q -o APT::Architecture=arm64 -o "APT::Architectures::=arm64"
          -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt"
          -o "Dir::State::status=/dev/null" -o Debug::NoLocking=1)
echo "arm sysroot: Debian arm64 ${pkgs[*]} into $dir"
apt-get "${apt_opts[@]}" update >/dev/null
(cd "$dir/debs" && apt-get "${apt_opts[@]}" download "${pkgs[@]/%/:arm64}" >/dev/null)
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir"; done
touch "$dir/.done"
