#!/usr/bin/env bash
# CTest entry `python_torch`: the Python package's pytest suite against this build's
# libmemwall.so (MEMWALL_LIB) and sources (PYTHONPATH=python). Fails when the interpreter has
# no torch or pytest: `make test` runs scripts/install-deps.sh first, which installs them.
set -u
py=${MW_PYTHON:-python3}
if ! "$py" -c "import torch, pytest" >/dev/null 2>&1; then
  echo "python_torch: FAIL: $py cannot import torch and pytest: run bash scripts/install-deps.sh (it installs them)"
  exit 1
fi
cd "$(dirname "$0")/../.." || exit 1
exec "$py" -m pytest -q -p no:cacheprovider python/tests
