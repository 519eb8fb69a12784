#!/usr/bin/env bash
# Installs the Debian packages memwall needs, and only those that are missing.
set -euo pipefail
# libclang-rt-dev: the default clang's runtime libraries, libFuzzer among them (make fuzz); only a
# Recommends of clang, which --no-install-recommends skips. libonig-dev: Oniguruma, the regex engine
# of the tokenizer's pre-tokenizer patterns (src/tok/). libisal-dev: ISA-L, the crc32c of every store block.
pkgs=(build-essential cmake pkg-config clang libclang-rt-dev libomp-dev liburing-dev libopenblas-dev libcjson-dev libonig-dev libisal-dev fio python3 python3-pip chromium libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "memwall: installing missing packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Python package's tests (python/tests, run by `make test`) need torch, pytest and numpy in
# the python3 that CMake finds first on PATH, and transformers with accelerate (its Trainer) for
# the test that trains through transformers' Trainer. PyPI's torch wheel is the CUDA build (about
# 3 GB with its nvidia-* dependencies; it runs on the CPU without a GPU). pip installs only what
# is missing (a requirement already satisfied is left as it is). Without network the install
# fails with a message (exit 1).
if ! python3 -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('torch', 'pytest', 'numpy', 'transformers', 'accelerate')))" >/dev/null 2>&1; then
  echo "memwall: installing torch, pytest, numpy, transformers and accelerate from PyPI for the Python package's tests"
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q torch pytest numpy transformers accelerate || {
    echo "memwall: pip could not install torch, pytest, numpy, transformers and accelerate (needed by the Python tests, python_torch)" >&2
    exit 1
  }
fi
