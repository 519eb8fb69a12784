#!/usr/bin/env bash
# memwall's training step against transformers' LlamaForCausalLM on the CPU, side by side: the
# SmolLM2-135M shape (30 blocks, width 576, 9 query / 3 key-value heads of 64, MLP 1536,
# vocabulary 49152, tied head, rope_theta 100000) with random weights, batch 4 x seq 256, the same
# thread count for both. Issue 24's target: memwall at least 1.3x faster.
#
#   bash bench/llama_vs_torch.sh path/to/memwall [--rounds R] [--steps N] [--drop D] [--threads T] [--dir DIR]
#
# Once: bench/llama_vs_torch.py --setup writes DIR/hf (transformers builds the model from a
# config and save_pretrained()s it: nothing is downloaded) and DIR/tokens.bin (an llm.c shard of
# uniformly random ids). Then R rounds, each running both sides once, the first side alternating
# (on a shared machine the speed drifts by tens of percent within minutes: a side that always
# ran first or second would carry that drift):
#   memwall train --init-hf DIR/hf --data DIR/tokens.bin --batch 4 --seq 256 --threads T --steps N
#                 --val-every 0 --sample-len 0 --log-json ...       (AdamW in DRAM, clip 1)
#   python3 bench/llama_vs_torch.py --torch DIR ...   (sdpa attention, AdamW fused if this torch has
#                 the CPU kernel, else foreach: the summary says which; clip 1)
# Both get OMP_NUM_THREADS=T (torch also torch.set_num_threads(T)). Figures: the median of each
# run's steps after the first D (warm-up: first touches, allocator growth), then the median over
# the rounds, and memwall's speed-up (torch ms / memwall ms) per round and overall.
set -euo pipefail
cli=${1:?usage: bench/llama_vs_torch.sh path/to/memwall [--rounds R] [--steps N] [--drop D] [--threads T] [--dir DIR]}
shift
rounds=3 steps=8 drop=2 threads=2 dir=run/bench-llama
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --drop) drop=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "bench/llama_vs_torch.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$rounds" -ge 1 ] 2>/dev/null || { echo "bench/llama_vs_torch.sh: --rounds must be at least 1" >&2; exit 2; }
[ "$steps" -gt "$drop" ] 2>/dev/null || { echo "bench/llama_vs_torch.sh: --steps must exceed --drop" >&2; exit 2; }
src=$(cd "$(dirname "$0")/.." && pwd)
py="$src/bench/llama_vs_torch.py"
python3 -c 'import torch, transformers' 2>/dev/null || { echo "SKIP: needs torch and transformers (pip install torch transformers)"; exit 0; }
mkdir -p "$dir"
if [ ! -f "$dir/hf/model.safetensors" ] || [ ! -f "$dir/tokens.bin" ]; then
  python3 "$py" --setup "$dir" 2>&1 | grep -v '^Writing\|it/s]' || true
fi
[ -f "$dir/hf/model.safetensors" ] && [ -f "$dir/tokens.bin" ] || { echo "bench/llama_vs_torch.sh: setup failed" >&2; exit 1; }
export OMP_NUM_THREADS=$threads
run_memwall() { # round
  "$cli" train --init-hf "$dir/hf" --data "$dir/tokens.bin" --batch 4 --seq 256 --threads "$threads" --steps "$steps" \
    --val-every 0 --sample-len 0 --log-json "$dir/memwall.$1.jsonl" >"$dir/memwall.$1.out" 2>&1 \
    || { echo "bench/llama_vs_torch.sh: the memwall run (round $1) failed:" >&2; tail -3 "$dir/memwall.$1.out" >&2; exit 1; }
}
run_torch() { # round
  python3 "$py" --torch "$dir" --batch 4 --seq 256 --threads "$threads" --steps "$steps" \
    --log-json "$dir/torch.$1.jsonl" >"$dir/torch.$1.out" 2>&1 \
    || { echo "bench/llama_vs_torch.sh: the torch run (round $1) failed:" >&2; tail -3 "$dir/torch.$1.out" >&2; exit 1; }
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then run_memwall "$r"; run_torch "$r"; else run_torch "$r"; run_memwall "$r"; fi
  echo "round $r/$rounds done ($(uptime | sed 's/.*load average/load average/'))" >&2
done
python3 "$py" --summary "$dir" --rounds "$rounds" --drop "$drop" --batch 4 --seq 256 --threads "$threads"
echo "reproduce: bash bench/llama_vs_torch.sh $cli --rounds $rounds --steps $steps --drop $drop --threads $threads --dir $dir"
