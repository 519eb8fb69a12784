#!/usr/bin/env bash
# make demo: train a small GPT with the optimizer state on the NVMe tier in ./run/, print a
# sample and the report path. Until `memwall train` lands it says so and succeeds.
set -euo pipefail
cli=${1:-build/memwall}
if "$cli" train --help >/dev/null 2>&1; then
  mkdir -p run
  "$cli" train --preset demo --optimizer-tier nvme --nvme-dir run/nvme --trace run/trace.json \
       --log-json run/log.jsonl --out-dir run
else
  echo "memwall demo: training is not yet available (issue #8); the build and tests are ready: run 'make test'."
fi
