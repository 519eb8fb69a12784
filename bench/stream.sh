#!/usr/bin/env bash
# Streamed training (weights, gradients and optimizer state on NVMe) against the all-DRAM run,
# side by side in one run: GPT-2 124M shape, batch 4, sequence 256, 2 threads; accumulation 1
# and 8; the median step time of steps 2..N of each (step 1 pays the first touch of everything).
# Also the optimizer-only NVMe run at accumulation 1 (its update overlapped with the next
# forward, and finished inside its step as before) and, with --xl, the GPT-2 XL capability run
# (48 blocks, width 1600: 1.56 B parameters) under --dram-budget 4GiB with its report.
#
#   bash bench/stream.sh build/memwall [--steps N] [--xl] [--dir DIR]
#
# Figures: milliseconds per step (JSON log field "ms"), ratios against the DRAM run of the same
# accumulation, the peak resident set (VmHWM) against the plan. NVMe files go under DIR (default
# ./run/bench-stream, removed at the end).
set -euo pipefail
cli=${1:?usage: bench/stream.sh path/to/memwall [--steps N] [--xl] [--dir DIR]}
shift
steps=4 xl=0 dir=run/bench-stream
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --xl) xl=1; shift ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "bench/stream.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
data="$src/data/kjv_excerpt.txt"
base=(--preset gpt2-124m --data "$data" --batch 4 --seq 256 --threads 2 --val-every 0 --sample-len 0 --steps "$steps")
median() { # log: median "ms" of steps 2..N
  grep -o '"step":[0-9]*,[^}]*"ms":[0-9.]*' "$1" | awk -F'"ms":' '{ split($1, a, /[:,]/); if (a[2] > 1) print $2 }' \
    | sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit } print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
run() { # name, args...
  local name=$1; shift
  echo "== $name: memwall train ${base[*]} $*" >&2
  "$cli" train "${base[@]}" "$@" --log-json "$dir/$name.jsonl" >"$dir/$name.out" 2>&1 \
    || { echo "bench/stream.sh: $name failed:" >&2; tail -5 "$dir/$name.out" >&2; exit 1; }
  rm -rf "$dir/nvme"
}
nv=(--nvme-dir "$dir/nvme")
run dram-a1
run opt-a1 --optimizer-tier nvme "${nv[@]}"
run opt-sync-a1 --optimizer-tier nvme --sync-update "${nv[@]}"
run stream-a1 --offload-params nvme "${nv[@]}" --subgroup-size 1M --buffer-count 4 --prefetch-depth 1 \
  --dram-budget 1GiB
run dram-a8 --grad-accum 8
run dram-rc-a8 --grad-accum 8 --recompute
run stream-a8 --grad-accum 8 --offload-params nvme "${nv[@]}" --subgroup-size 1M --buffer-count 3 --prefetch-depth 1 \
  --dram-budget 1GiB

printf '\n%-12s %10s %8s  %s\n' run "ms/step" ratio "peak resident set vs plan"
for r in dram-a1 opt-a1 opt-sync-a1 stream-a1 dram-a8 dram-rc-a8 stream-a8; do
  ref=dram-a1; case $r in *a8) ref=dram-a8 ;; esac
  m=$(median "$dir/$r.jsonl"); d=$(median "$dir/$ref.jsonl")
  printf '%-12s %10.1f %8.3f  %s\n' "$r" "$m" "$(awk -v a="$m" -v b="$d" 'BEGIN { print a / b }')" \
    "$(grep -o 'VmHWM) [0-9.]* [MG]iB vs planned [0-9.]* [MG]iB (measured/planned [0-9.]*)' "$dir/$r.out" || echo -)"
done
printf 'stream-a8 (blocks kept on NVMe) vs dram-rc-a8 (blocks recomputed): %.3f\n' \
  "$(awk -v a="$(median "$dir/stream-a8.jsonl")" -v b="$(median "$dir/dram-rc-a8.jsonl")" 'BEGIN { print a / b }')"

if [ $xl = 1 ]; then
  echo "== GPT-2 XL shape under --dram-budget 4GiB" >&2
  "$cli" train --preset gpt2-124m --layers 48 --width 1600 --heads 25 --vocab 50257 --context 1024 --data "$data" \
    --batch 4 --seq 256 --grad-accum 2 --steps 3 --lr 2e-5 --warmup 0 --val-every 0 --sample-len 0 --threads 2 \
    --offload-params nvme "${nv[@]}" --dram-budget 4GiB --trace "$dir/xl-trace.json" --log-json "$dir/xl.jsonl" \
    >"$dir/xl.out" 2>&1 || { echo "bench/stream.sh: the XL run failed" >&2; tail -5 "$dir/xl.out" >&2; exit 1; }
  grep -E '^step|VmHWM|planned DRAM' "$dir/xl.out"
  # The roofline needs the disk's bandwidth: NVME_READ_BW / NVME_WRITE_BW in GB/s (memwall bench io).
  "$cli" report "$dir/xl-trace.json" --text ${NVME_READ_BW:+--nvme-read-bw $NVME_READ_BW} \
    ${NVME_WRITE_BW:+--nvme-write-bw $NVME_WRITE_BW} | grep -A1 '^roofline'
  rm -rf "$dir/nvme"
fi
