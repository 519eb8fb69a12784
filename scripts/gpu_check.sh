#!/usr/bin/env bash
# The Python package's checks on a machine with an NVIDIA GPU (when a task is lent one): the
# same pytest suite as `make test`, where test_cuda_matches_cpu now runs (CUDA parameters through
# pinned host copies and side-stream copies, bitwise against the CPU path), and
# bench/torch_optim.py, where torchao's CPUOffloadOptimizer (CUDA parameters only) gets its row.
# Untested so far: no GPU machine has run it yet. BENCH_ARGS adds options to the bench (e.g.
# "--quick" or "--gpt2-steps 5 --nvme-dir /mnt/nvme").
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv || echo "gpu_check: no nvidia-smi (continuing on the CPU)"
bash scripts/install-deps.sh
make build
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q ./python
python3 -c "import torch; print('torch', torch.__version__, 'CUDA available:', torch.cuda.is_available())"
echo "== pytest (python/tests) against build/libmemwall.so =="
MEMWALL_LIB=build/libmemwall.so PYTHONPATH=python MW_CLI=build/memwall python3 -m pytest -q -p no:cacheprovider python/tests
echo "== examples/torch_gpt.py on the GPU, memwall (state on NVMe in a temporary directory) and torch =="
python3 examples/torch_gpt.py --device cuda --steps 30
python3 examples/torch_gpt.py --device cuda --steps 30 --optimizer torch
echo "== bench/torch_optim.py =="
python3 bench/torch_optim.py ${BENCH_ARGS:-}
