#!/usr/bin/env bash
# make demo-mpi: the demo model trained data parallel on 2 MPI ranks with ZeRO-2 (optimizer state
# and gradients sharded, each rank's optimizer state on its own NVMe directory), then the
# per-rank report. Compare run-mpi/log.jsonl with run/log.jsonl of `make demo`: the same global
# batch, so the losses agree to about 1e-7 (docs/mpi.md).
set -euo pipefail
cli=$(realpath "${1:-build/memwall}")
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# Containers often forbid process_vm_readv (Open MPI's single-copy shared memory).
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
out=run-mpi
rm -rf "$out"; mkdir -p "$out"
steps=${MW_DEMO_STEPS:-100}
echo "memwall demo-mpi: 2 ranks, ZeRO-2, optimizer state on NVMe ($out/nvme.0, $out/nvme.1), $steps steps"
mpirun "${root[@]}" --oversubscribe -np 2 "$cli" train --preset demo --steps "$steps" --zero 2 \
    --optimizer-tier nvme --nvme-dir "$out/nvme.%r" --print-every 10 --sample-len 0 \
    --log-json "$out/log.jsonl" --trace "$out/trace.%r.json" | tee "$out/train.out"
"$cli" report "$out/trace.%r.json" -o "$out/report.html" --csv "$out/report-csv" --text | sed -n '/^ranks:/,$p'
echo "  log: $out/log.jsonl   traces: $out/trace.0.json $out/trace.1.json   report: $out/report.html"
