#!/usr/bin/env bash
# A published Llama-family shape trained with everything on NVMe under a DRAM budget: the capability
# figure of issue 24 (Llama-3.2-1B shape: 16 blocks, width 2048, 32/8 heads, MLP 8192, vocabulary
# 128,256, 1.24 B parameters, under --dram-budget 3GiB at accumulation 4).
#
#   bash bench/capability_hf.sh build/memwall [--shape llama-3.2-1b] [--budget 3GiB] [--steps 3]
#        [--batch 1] [--seq 512] [--accum 4] [--dir DIR]
#
# Makes the model directory (scripts/make_hf_model.py: random weights in the shape, bf16, with a
# byte-level BPE tokenizer trained on the bundled corpus: nothing is downloaded), tokenizes the
# corpus into shards (memwall data), trains with --offload-params nvme under the budget with a trace,
# and prints the step lines, the planned vs measured peak resident set and the report's roofline (the
# disk's bandwidth from `memwall bench io` on DIR, or NVME_READ_BW / NVME_WRITE_BW in GB/s).
# Needs python3 with torch, transformers and tokenizers; about 45 GB free under DIR for 1.24 B params.
set -euo pipefail
cli=${1:?usage: bench/capability_hf.sh path/to/memwall [--shape S] [--budget B] [--steps N] [--dir DIR]}
shift
shape=llama-3.2-1b budget=3GiB steps=3 batch=1 seq=512 accum=4 dir=run/bench-capability
while [ $# -gt 0 ]; do
  case $1 in
    --shape) shape=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --accum) accum=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "bench/capability_hf.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
model="$dir/$shape"
if [ ! -f "$model/config.json" ]; then
  python3 "$src/scripts/make_hf_model.py" --shape "$shape" --out "$model" --dtype bf16 \
    --tokenizer-from "$src/data/kjv_excerpt.txt" >&2
fi
rm -rf "$dir/shards" "$dir/nvme"
"$cli" data --tokenizer "$model" --out "$dir/shards" --quiet "$src/data/kjv_excerpt.txt"
if [ -z "${NVME_READ_BW:-}" ] || [ -z "${NVME_WRITE_BW:-}" ]; then
  mkdir -p "$dir/bio"
  "$cli" bench io --dir "$dir/bio" --size 2G --json >"$dir/bio.json"
  NVME_READ_BW=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['read_bytes_per_s'] / 1e9, 2))" "$dir/bio.json" 2>/dev/null || true)
  NVME_WRITE_BW=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['write_bytes_per_s'] / 1e9, 2))" "$dir/bio.json" 2>/dev/null || true)
  rm -rf "$dir/bio"
fi
echo "== memwall train --init-hf $model --offload-params nvme --dram-budget $budget (batch $batch x seq $seq x accum $accum)" >&2
"$cli" train --init-hf "$model" --data "$dir/shards" --batch "$batch" --seq "$seq" --grad-accum "$accum" \
  --steps "$steps" --lr 2e-5 --warmup 0 --val-every 0 --sample-len 0 --threads 2 --offload-params nvme \
  --nvme-dir "$dir/nvme" --dram-budget "$budget" --trace "$dir/trace.json" --log-json "$dir/log.jsonl" \
  >"$dir/train.out" 2>&1 || { echo "bench/capability_hf.sh: the run failed" >&2; tail -5 "$dir/train.out" >&2; exit 1; }
grep -E '^memwall train|chose|planned DRAM|^step|VmHWM' "$dir/train.out"
"$cli" report "$dir/trace.json" --text ${NVME_READ_BW:+--nvme-read-bw $NVME_READ_BW} \
  ${NVME_WRITE_BW:+--nvme-write-bw $NVME_WRITE_BW} | grep -E -A2 '^roofline|^per step|^subgroups'
echo "disk: read ${NVME_READ_BW:-?} GB/s, write ${NVME_WRITE_BW:-?} GB/s"
rm -rf "$dir/nvme"
