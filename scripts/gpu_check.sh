#!/usr/bin/env bash
# The Python package's checks on a machine with an NVIDIA GPU (when a task is lent one):
# the same pytest suite as `make test` (CPU tensors), memwall.torch.AdamW's refusal of CUDA
# parameters (not supported yet: docs/python.md), and bench/torch_optim.py, where torchao's
# CPUOffloadOptimizer (CUDA parameters only) gets its row. Untested so far: no GPU machine has
# run it yet. BENCH_ARGS adds options to the bench (e.g. "--quick" or "--gpt2-steps 5").
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv || echo "gpu_check: no nvidia-smi (continuing on the CPU)"
bash scripts/install-deps.sh
make build
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q ./python
python3 -c "import torch; print('torch', torch.__version__, 'CUDA available:', torch.cuda.is_available())"
echo "== pytest (python/tests) against build/libmemwall.so =="
MEMWALL_LIB=build/libmemwall.so PYTHONPATH=python MW_CLI=build/memwall python3 -m pytest -q -p no:cacheprovider python/tests
echo "== CUDA parameters are refused with a message (not supported yet) =="
(cd /tmp && python3 - <<'PY'
import torch
import memwall.torch
if not torch.cuda.is_available():
    print("gpu_check: torch sees no CUDA device; skipped")
else:
    try:
        memwall.torch.AdamW([torch.nn.Parameter(torch.zeros(4, device="cuda"))])
        raise SystemExit("gpu_check: a CUDA parameter was accepted")
    except ValueError as e:
        print("refused as documented:", e)
PY
)
echo "== bench/torch_optim.py =="
python3 bench/torch_optim.py ${BENCH_ARGS:-}
