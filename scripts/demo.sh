#!/usr/bin/env bash
# make demo: train a small GPT-2 (the `demo` preset, ~3.3M parameters) on the bundled King James
# corpus for about two minutes on 2 cores, then show the validation loss at the start and the
# end, a generated sample, and where the log, checkpoint, weights, trace and report are.
# The optimizer state (fp32 master weights and AdamW moments) lives on the NVMe tier, in files
# under run/nvme, streamed by the offload engine in subgroups of 1M parameters; the run is traced
# and `memwall report` turns the trace into run/report.html and CSV tables.
set -euo pipefail
cli=$(realpath "${1:-build/memwall}")
cd "$(dirname "$0")/.."
# OpenMP threads that sleep at barriers instead of spinning: on a 2-core machine where anything
# else runs, spinning threads (OpenMP's and OpenBLAS's) steal the cores and a step takes 3x longer.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
out=run
mkdir -p "$out"
rm -rf "$out"/ckpt_*.mwck "$out"/log.jsonl "$out"/trace.json "$out"/report.html "$out"/report-csv
echo "memwall demo: training the demo preset on data/kjv_excerpt.txt (about two minutes on 2 cores)"
"$cli" train --preset demo --optimizer-tier nvme --nvme-dir "$out/nvme" --subgroup-size 1M \
     --out-dir "$out" --ckpt-every 100 --print-every 10 --log-json "$out/log.jsonl" --trace "$out/trace.json" \
     | tee "$out/train.out"
echo
"$cli" report "$out/trace.json" -o "$out/report.html" --csv "$out/report-csv" >/dev/null
# The first and last validation losses from the JSON log (nats per byte).
first=$(grep -o '"val_loss":[^,}]*' "$out/log.jsonl" | head -1 | cut -d: -f2)
last=$(grep -o '"val_loss":[^,}]*' "$out/log.jsonl" | tail -1 | cut -d: -f2)
ckpt=$(ls "$out"/ckpt_*.mwck 2>/dev/null | tail -1 || true)
echo
echo "memwall demo: validation loss ${first} at the start -> ${last} at the end (nats per byte; ln 257 = 5.55 is chance)"
# The generated sample (printed by train before the trace summary), shown again here.
awk '/^sample \(/{on=1} on{print} on&&/^-+$/{d++; if(d==2) exit}' "$out/train.out"
echo "  log (one JSON object per step): $out/log.jsonl"
echo "  weights (HF safetensors):       $out/model.safetensors"
[ -n "$ckpt" ] && echo "  checkpoint:                     $ckpt  (continue: $cli train --resume $ckpt --steps N)"
echo "  trace (Perfetto / chrome://tracing): $out/trace.json"
echo "  report:                         $out/report.html (tables: $out/report-csv/)"
echo "  optimizer state on NVMe:        $out/nvme/ (its files go at the end; memwall-run.done says the run finished)"
