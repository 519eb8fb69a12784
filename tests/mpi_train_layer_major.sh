#!/usr/bin/env bash
# Layer-major with the weights in DRAM on 2 ranks (issue 23): `mpirun -np 2 memwall train --zero S
# --schedule layer-major`, no streaming. ZeRO-3 gathers, prefetches and releases the units in the
# order the layer-major step acquires them (mw_plan_stream_unit, as the streamed path does).
#  1. ZeRO 0-3, accumulation 1 and 2: the layer-major run gives bitwise the losses, validation
#     losses, gradient norms, final model.safetensors and generated sample of the 2-rank
#     batch-major run whose sums have the same order: the same stage, except at accumulation > 1
#     with ZeRO-2/3, where batch-major reduce-scatters each micro-batch's gradient and sums the
#     shards while layer-major sums a unit's micro-batches first and reduces once (ZeRO-0/1's
#     order): there the ZeRO-0 batch-major run (tests/mpi_train_stream.sh does the same for
#     streamed weights).
#  2. A unit's collectives run once per step, not once per micro-batch: bytes sent per step per
#     rank (mean) at accumulation 2 = 2 Psi (N-1)/N at stages 0-2 and 3 Psi (N-1)/N at stage 3
#     (batch-major: 3 Psi at stage 2, 6 Psi at stage 3), within 1%.
#  3. ZeRO-3 weight memory per rank (mincore) stays well under the whole model and within 5% of the
#     planner's prediction, as batch-major's (tests/mpi_train_cli.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib_mpi_train.sh" mpi_train_layer_major
COMMON=(--preset tiny --steps 4 --batch 4 --val-every 2 --sample-len 24 --threads 1
        --data "$MW_SOURCE_DIR/data/kjv_excerpt.txt")
sample() { sed -n '/^sample (/,/^log:/p' "$1" | grep -v '^log:'; }

# 1. stages x accumulation, against the run with the same order of sums
run bm_z0_a2 "${MPI[@]}" "$M" train "${COMMON[@]}" --zero 0 --grad-accum 2 --schedule batch-major \
    --out-dir out_bm_z0_a2 --log-json bm_z0_a2.json
params=$(sed -n 's/.*(\([0-9]*\) params.*/\1/p' bm_z0_a2.out | head -1)
for c in "0 2" "1 1" "1 2" "2 1" "2 2" "3 1" "3 2"; do
  set -- $c
  z=$1 acc=$2 n=z$1_a$2
  if [ ! -f bm_$n.json ]; then
    run bm_$n "${MPI[@]}" "$M" train "${COMMON[@]}" --zero $z --grad-accum $acc --schedule batch-major \
        --out-dir out_bm_$n --log-json bm_$n.json || continue
  fi
  run lm_$n "${MPI[@]}" "$M" train "${COMMON[@]}" --zero $z --grad-accum $acc --schedule layer-major \
      --out-dir out_lm_$n --log-json lm_$n.json || continue
  grep -q "data parallel: 2 ranks.*ZeRO-$z" lm_$n.out || bad "$n: no ZeRO-$z data-parallel line"
  ! grep -q 'streaming:' lm_$n.out || bad "$n: the weights stream (they should stay in DRAM)"
  ref=$n
  [ $z -ge 2 ] && [ $acc -gt 1 ] && ref=z0_a$acc # ZeRO-0/1's order of sums (header)
  compare bm_$ref.json lm_$n.json exact || bad "$n: layer-major losses differ from the batch-major run $ref"
  cmp -s out_bm_$ref/model.safetensors out_lm_$n/model.safetensors \
    && echo "  $n layer-major: model.safetensors bitwise equal to $ref batch-major" || bad "$n: layer-major final weights differ"
  s1=$(sample bm_$ref.out) s2=$(sample lm_$n.out)
  [ -n "$s1" ] && [ "$s1" = "$s2" ] || bad "$n: generated samples differ"
  # 2. bytes sent per step per rank: each unit's collectives once per step (N = 2, Psi = 4 x params)
  [ $acc = 2 ] || continue
  python3 - lm_$n.json bm_$n.json "$params" $z <<'EOF' || bad "$n: communication volume"
import json, sys
rows = lambda f: [json.loads(l) for l in open(f) if '"loss"' in l]
lm, bm = rows(sys.argv[1]), rows(sys.argv[2])
psi, z, N, m = 4 * int(sys.argv[3]), int(sys.argv[4]), 2, 2
want = {0: 2, 1: 2, 2: 2, 3: 3}[z] * psi * (N - 1) / N          # layer-major: as one micro-batch
want_bm = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[z] * psi * (N - 1) / N
for r in lm:
    if r["ranks"] != 2 or r["zero"] != z:
        sys.exit(f"log says ranks {r['ranks']} zero {r['zero']}")
    if abs(r["comm_sent_mean_bytes"] - want) > 0.01 * want:
        sys.exit(f"step {r['step']}: sent {r['comm_sent_mean_bytes']} bytes, expected {want:.0f} (+-1%)")
if abs(bm[-1]["comm_sent_mean_bytes"] - want_bm) > 0.01 * want_bm:
    sys.exit(f"batch-major sent {bm[-1]['comm_sent_mean_bytes']} bytes, expected {want_bm:.0f} (+-1%)")
print(f"  ZeRO-{z}, accumulation {m}: layer-major sends {lm[-1]['comm_sent_mean_bytes'] / psi:.3f} Psi per step per rank, "
      f"batch-major {bm[-1]['comm_sent_mean_bytes'] / psi:.3f} Psi")
EOF
done

# 3. ZeRO-3 weight memory, layer-major: 8 blocks of width 128 (1.6 M params)
run mem "${MPI[@]}" "$M" train --preset tiny --layers 8 --width 128 --heads 4 --context 64 --steps 2 --batch 2 \
    --grad-accum 2 --schedule layer-major --val-every 0 --sample-len 0 --threads 1 --zero 3 \
    --data "$MW_SOURCE_DIR/data/kjv_excerpt.txt" && {
  grep "ZeRO-3 weights" mem.out
  zero3_weights_ok mem.out || bad "ZeRO-3 layer-major weight memory"
}

[ $fail = 0 ] && rm -rf "$dir" && echo "PASS"
exit $fail
