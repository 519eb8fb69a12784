#!/usr/bin/env bash
# Step-time ratios of training variants against the all-DRAM run, in interleaved rounds: every
# round runs the DRAM run and each variant once, in an order rotated by one each round, and each
# ratio is taken within its round (the median of steps 2..N-1 of each run: step 1 pays first touches, and on NVMe the
# last step also waits for its own update). Prints the ratio of every round and their median.
# Rounds, because on a shared machine the speed drifts by 20-40 % within minutes: a single pass
# can put two runs minutes apart (the figures of issue 12's optimizer-only target come from this).
#
#   bash bench/train_rounds.sh path/to/memwall [--rounds R] [--steps N] [--dir DIR] [--] [VARIANT...]
#
# A VARIANT is NAME=ARGS (ARGS split on spaces; %D is replaced by a fresh NVMe directory under
# DIR; ARGS starting with @PATH run the memwall binary at PATH instead, to compare two builds).
# Default: the optimizer state on NVMe with and without pre-reads between steps:
#   nvme='--optimizer-tier nvme --nvme-dir %D' (pre-reads on: the default)
#   nvme-nopre='--optimizer-tier nvme --nvme-dir %D --preread off'
# Model: GPT-2 124M shape, batch 4 x 256, 2 threads (MODEL overrides these arguments). Figures:
# milliseconds per step (JSON log "ms"), ratios against DRAM.
set -euo pipefail
cli=${1:?usage: bench/train_rounds.sh path/to/memwall [--rounds R] [--steps N] [--dir DIR] [--] [VARIANT...]}
shift
rounds=4 steps=6 dir=run/bench-rounds
variants=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --) shift; variants+=("$@"); break ;;
    *=*) variants+=("$1"); shift ;;
    *) echo "bench/train_rounds.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$steps" -ge 3 ] 2>/dev/null || { echo "bench/train_rounds.sh: --steps must be at least 3" >&2; exit 2; }
[ "$rounds" -ge 1 ] 2>/dev/null || { echo "bench/train_rounds.sh: --rounds must be at least 1" >&2; exit 2; }
[ ${#variants[@]} -gt 0 ] || variants=("nvme=--optimizer-tier nvme --nvme-dir %D"
                                       "nvme-nopre=--optimizer-tier nvme --nvme-dir %D --preread off")
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
read -r -a model <<< "${MODEL:---preset gpt2-124m --batch 4 --seq 256 --threads 2}"
base=("${model[@]}" --data "$src/data/kjv_excerpt.txt" --val-every 0 --sample-len 0 --steps "$steps")
run() { # name round args...
  local name=$1 r=$2 bin=$cli; shift 2
  case ${1:-} in @*) bin=${1#@}; shift ;; esac
  "$bin" train "${base[@]}" "$@" --log-json "$dir/$name.$r.jsonl" >"$dir/$name.$r.out" 2>&1 \
    || { echo "bench/train_rounds.sh: the $name run (round $r) failed:" >&2; tail -3 "$dir/$name.$r.out" >&2; exit 1; }
}
names=(dram)
for v in "${variants[@]}"; do names+=("${v%%=*}"); done
# The order rotates by one each round (the run after a streamed one pays its page-cache write-back:
# a fixed order biased one run by 2-4 %), so every run takes every place once in ${#names[@]} rounds.
for r in $(seq 1 "$rounds"); do
  n=${#names[@]}
  for k in $(seq 0 $((n - 1))); do
    i=$(( (k + r - 1) % n ))
    if [ "$i" = 0 ]; then run dram "$r"; continue; fi
    v=${variants[$((i - 1))]}
    read -r -a args <<< "${v#*=}"
    args=("${args[@]//%D/$dir/nvme}")
    run "${names[$i]}" "$r" "${args[@]}"
    rm -rf "$dir/nvme"
  done
  echo "round $r/$rounds done" >&2
done
python3 - "$dir" "$rounds" "${names[@]}" <<'PY'
import json, statistics, sys
d, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def med(name, r):
    ms = [json.loads(l)["ms"] for l in open(f"{d}/{name}.{r}.jsonl") if '"ms"' in l]
    return statistics.median(ms[1:-1])
m = {n: [med(n, r) for r in range(1, rounds + 1)] for n in names}
for n in names:
    line = f"{n:14s} ms/step per round: " + " ".join(f"{x:8.1f}" for x in m[n])
    if n != "dram":
        q = [a / b for a, b in zip(m[n], m["dram"])]
        line += f" | / dram: " + " ".join(f"{x:.3f}" for x in q) + f" | median {statistics.median(q):.3f}"
    print(line)
PY
