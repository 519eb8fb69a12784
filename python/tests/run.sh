#!/usr/bin/env bash
# CTest entry `python_torch`: the Python package's pytest suite against this build's
# libmemwall.so (MEMWALL_LIB) and sources (PYTHONPATH=python). Skips (77) when the interpreter
# has no torch or pytest: scripts/install-deps.sh installs them from PyPI.
set -u
py=${MW_PYTHON:-python3}
if ! "$py" -c "import torch, pytest" >/dev/null 2>&1; then
  echo "python_torch: SKIP: $py cannot import torch and pytest (bash scripts/install-deps.sh installs them)"
  exit 77
fi
cd "$(dirname "$0")/../.." || exit 1
exec "$py" -m pytest -q -p no:cacheprovider python/tests
