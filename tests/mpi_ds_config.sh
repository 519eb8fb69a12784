#!/usr/bin/env bash
# `mpirun -np 2 memwall train --ds-config`: DeepSpeed's batch keys are per GPU, memwall's --batch
# is the global micro-batch, so train_micro_batch_size_per_gpu 2 on 2 ranks is --batch 4
# (2 per rank), and the run is bitwise the run with those flags typed; a train_batch_size that
# does not equal micro x accumulation x 2 ranks is refused (exit 2 on every rank) with the sum.
set -uo pipefail
: "${MW_MPIRUN:?}" "${MW_BUILD_DIR:?}" "${MW_SOURCE_DIR:?}"
M="$MW_BUILD_DIR/memwall"
dir="$MW_BUILD_DIR/test-scratch/mpi_ds_config-$$"
rm -rf "$dir"; mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
MPI=("$MW_MPIRUN" --allow-run-as-root --oversubscribe -np 2)
COMMON=(--preset tiny --steps 3 --val-every 0 --sample-len 0 --threads 1 --data "$MW_SOURCE_DIR/data/kjv_excerpt.txt")
fail=0
bad() { echo "FAIL: $*"; fail=1; }
losses() { grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$1"; }

cat >ds.json <<'JSON'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
JSON
"${MPI[@]}" "$M" train "${COMMON[@]}" --ds-config ds.json --log-json f.jsonl >f.out 2>&1 || { cat f.out; bad "2-rank --ds-config run failed"; }
grep -q "global batch 4 = 2 per rank, ZeRO-2" f.out || { grep "data parallel" f.out; bad "micro 2 per GPU on 2 ranks is not --batch 4"; }
grep -q '"step":1,.*"tokens":256,' f.jsonl || bad "tokens per step is not 2 ranks x 2 x 32 x accumulation 2"
"${MPI[@]}" "$M" train "${COMMON[@]}" --batch 4 --grad-accum 2 --zero 2 --log-json t.jsonl >t.out 2>&1 || { cat t.out; bad "typed run failed"; }
[ -n "$(losses f.jsonl)" ] && [ "$(losses f.jsonl)" = "$(losses t.jsonl)" ] \
  || { diff <(losses f.jsonl) <(losses t.jsonl); bad "--ds-config run differs from the typed flags"; }

echo '{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}' >bad.json
"${MPI[@]}" "$M" train "${COMMON[@]}" --ds-config bad.json >b.out 2>&1 && bad "inconsistent train_batch_size on 2 ranks ran"
grep -q "train_batch_size 4 is not train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 x 2 ranks = 8" b.out \
  || { cat b.out; bad "no message for the inconsistent batch keys"; }
grep -q '^step' b.out && bad "trained despite the refused config"

[ $fail = 0 ] && echo "mpi_ds_config: passed" || echo "mpi_ds_config: FAILED"
exit $fail
