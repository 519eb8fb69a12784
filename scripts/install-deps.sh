#!/usr/bin/env bash
# Installs the Debian packages memwall needs, and only those that are missing.
set -euo pipefail
# libclang-rt-dev: the default clang's runtime libraries, libFuzzer among them (make fuzz); only a
# Recommends of clang, which --no-install-recommends skips.
pkgs=(build-essential cmake pkg-config clang libclang-rt-dev libomp-dev liburing-dev libopenblas-dev libcjson-dev fio python3 chromium libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "memwall: installing missing packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
