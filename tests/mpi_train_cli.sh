#!/usr/bin/env bash
# `mpirun -np 2 memwall train` against one rank, end to end (issue #5):
#  1. 2 ranks with global batch B give the losses, validation losses and gradient norms of 1 rank
#     with global batch B (relative 2e-5: fp32 sums in another order), for ZeRO 0, 1, 2, 3, with
#     the optimizer state in DRAM and on NVMe; two micro-steps per step, so stages 2-3 reduce
#     every micro-step; bytes sent per step per rank = the ZeRO paper's volume within 1%;
#  2. two 2-rank runs with the same seed are bitwise identical (ZeRO-3, NVMe);
#  3. hierarchy "node" (two simulated nodes of one rank; and 4 ranks as 2 nodes of 2) gives the
#     same losses for ZeRO 1-3, with the expected volume;
#     ZeRO-3 with --recompute gives the losses and the generated sample of one rank; MPI's own
#     reductions (--comm-sum mpi) agree too;
#  4. per-rank checkpoints: resuming at step 3 gives bitwise the uninterrupted run; resuming
#     on 1 rank is refused with a message;
#  5. ZeRO-3 weight memory per rank (mincore) well under the whole model and within 5% of the
#     planner's prediction for the same layout; gradient memory = owned + a few buckets;
#  6. a rank that dies ends the job within bounded time with a clear message (mpirun's own
#     kill, and memwall's --comm-timeout when the launcher does not kill).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib_mpi_train.sh" mpi_train_cli
COMMON=(--preset tiny --steps 6 --batch 4 --grad-accum 2 --val-every 3 --sample-len 0 --threads 1
        --data "$MW_SOURCE_DIR/data/kjv_excerpt.txt")

# 1. ranks x stages x tiers
for tier in dram nvme; do
  run one_$tier "$M" train "${COMMON[@]}" --optimizer-tier $tier --nvme-dir "$dir/nvme1" --log-json one_$tier.json || continue
  params=$(sed -n 's/.*(\([0-9]*\) params.*/\1/p' one_$tier.out | head -1)
  for z in 0 1 2 3; do
    n=two_${tier}_z$z
    run $n "${MPI[@]}" "$M" train "${COMMON[@]}" --optimizer-tier $tier --nvme-dir "$dir/nvme.%r" --zero $z \
        --log-json $n.json || continue
    compare one_$tier.json $n.json || bad "$n differs from one rank"
    grep -q "data parallel: 2 ranks" $n.out || bad "$n: no data-parallel line"
    if [ $tier = nvme ]; then
      [ -d "$dir/nvme.0" ] && [ -d "$dir/nvme.1" ] || bad "$n: no per-rank NVMe directories (%r)"
    fi
    # Bytes sent per step per rank against the ZeRO paper (N = 2, m = 2 micro-steps, Psi = 4 x params).
    python3 - $n.json "$params" $z <<'EOF' || bad "$n: communication volume"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
psi, z = 4 * int(sys.argv[2]), int(sys.argv[3])
N, m = 2, 2
want = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[z] * psi * (N - 1) / N   # 2 Psi, 2 Psi, (m+1) Psi, 3m Psi x (N-1)/N
for r in rows:
    sent = r["comm_sent_mean_bytes"]   # rank 0's share depends on its shard; the mean is the paper's
    if r["ranks"] != 2 or r["zero"] != z:
        sys.exit(f"log says ranks {r['ranks']} zero {r['zero']}")
    if abs(sent - want) > 0.01 * want:
        sys.exit(f"step {r['step']}: sent {sent} bytes, expected {want:.0f} (+-1%)")
print(f"  ZeRO-{z}: {rows[-1]['comm_sent_mean_bytes']} bytes sent per step per rank (mean) = "
      f"{rows[-1]['comm_sent_mean_bytes'] / psi:.3f} Psi, rank 0 {rows[-1]['comm_sent_bytes'] / psi:.3f} Psi "
      f"(paper: {want / psi:.3f} Psi for N=2, m=2)")
EOF
  done
done

# 2. two runs, same seed: bitwise
run again "${MPI[@]}" "$M" train "${COMMON[@]}" --optimizer-tier nvme --nvme-dir "$dir/nvme.again.%r" --zero 3 \
    --log-json again.json && { compare two_nvme_z3.json again.json exact || bad "two 2-rank runs differ"; }

# 3. hierarchy node: 2 simulated nodes of 1 rank (shard within the node, replicate across)
for z in 1 2 3; do
  MEMWALL_RANKS_PER_NODE=1 run node$z "${MPI[@]}" -x MEMWALL_RANKS_PER_NODE "$M" train "${COMMON[@]}" --zero $z \
      --zero-hierarchy node --log-json node$z.json && {
    compare one_dram.json node$z.json || bad "hierarchy node, ZeRO-$z differs"
    grep -q "2 nodes" node$z.out || bad "hierarchy node: not 2 nodes"
  }
done

# 3'. 4 ranks as 2 simulated nodes of 2: shard within the node (2 ranks), average the shards across
#     the nodes (2 replicas). Volume per rank: the shard group's (N = 2) plus the replica allreduce of
#     the owned gradients, 2 (R-1)/R x Psi/2 (mw_zero_volume).
for z in 1 3; do
  MEMWALL_RANKS_PER_NODE=2 run four$z "$MW_MPIRUN" --allow-run-as-root --oversubscribe -np 4 -x MEMWALL_RANKS_PER_NODE \
      "$M" train "${COMMON[@]}" --zero $z --zero-hierarchy node --log-json four$z.json && {
    compare one_dram.json four$z.json || bad "4 ranks, hierarchy node, ZeRO-$z differs"
    grep -q "4 ranks on 2 nodes.*shard over 2 ranks, 2 replicas" four$z.out || bad "four$z: not 2 nodes of 2"
    python3 - four$z.json "$params" $z <<'EOF2' || bad "four$z: communication volume"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
psi, z, m = 4 * int(sys.argv[2]), int(sys.argv[3]), 2
want = ({1: 2, 3: 3 * m}[z] * psi / 2) + psi / 2   # shard group of 2, then 2 replicas
sent = rows[-1]["comm_sent_mean_bytes"]
if abs(sent - want) > 0.01 * want:
    sys.exit(f"sent {sent} bytes per rank, expected {want:.0f}")
print(f"  4 ranks, node hierarchy, ZeRO-{z}: {sent / psi:.3f} Psi per rank (expected {want / psi:.3f})")
EOF2
  }
done

# 3a. MPI's own reductions (MPI_Iallreduce / MPI_Ireduce_scatter) instead of the rank-order sums
for z in 0 2; do
  run mpisum$z "${MPI[@]}" "$M" train "${COMMON[@]}" --zero $z --comm-sum mpi --log-json mpisum$z.json &&
    { compare one_dram.json mpisum$z.json || bad "--comm-sum mpi, ZeRO-$z differs"; }
done

# 3b. ZeRO-3 with recomputation, and sampling at the end (every forward gathers its units):
#     the same losses and the same generated text as one rank.
run rc1 "$M" train "${COMMON[@]}" --recompute --sample-len 24 --log-json rc1.json &&
run rc2 "${MPI[@]}" "$M" train "${COMMON[@]}" --recompute --sample-len 24 --zero 3 --log-json rc2.json && {
  compare rc1.json rc2.json || bad "ZeRO-3 with --recompute differs"
  sample() { awk '/^sample \(/{on=1; next} on && /^-+$/{d++; if (d == 2) exit; next} on && d == 1' "$1"; }
  s1=$(sample rc1.out)
  s2=$(sample rc2.out)
  [ -n "$s1" ] && [ "$s1" = "$s2" ] || bad "ZeRO-3 sample '$s2' differs from one rank's '$s1'"
}

# 4. per-rank checkpoints and resume
run ck "${MPI[@]}" "$M" train "${COMMON[@]}" --zero 2 --out-dir ck --ckpt-every 3 --log-json ck.json &&
  [ -f ck/ckpt_00000003.r0.mwck ] && [ -f ck/ckpt_00000003.r1.mwck ] || bad "no per-rank checkpoints"
run resume "${MPI[@]}" "$M" train --resume 'ck/ckpt_00000003.r%r.mwck' --sample-len 0 --log-json resume.json && {
  tail -n +"$(grep -n '"step":4' ck.json | cut -d: -f1)" ck.json > ck_tail.json
  compare ck_tail.json resume.json exact || bad "resumed run differs from the uninterrupted one"
}
"$M" train --resume ck/ckpt_00000003.r0.mwck --sample-len 0 > refuse.out 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "written by a run on 2 ranks" refuse.out && grep -q "mpirun -np 2" refuse.out ||
  { cat refuse.out; bad "resuming a 2-rank checkpoint on 1 rank: exit $rc, expected 1 and a message"; }

# 5. ZeRO-3 weight memory: 8 blocks of width 128 (1.6 M params)
run mem "${MPI[@]}" "$M" train --preset tiny --layers 8 --width 128 --heads 4 --context 64 --steps 2 --batch 2 \
    --val-every 0 --sample-len 0 --threads 1 --zero 3 --data "$MW_SOURCE_DIR/data/kjv_excerpt.txt" && {
  grep "ZeRO-3 weights\|ZeRO-3 gradients" mem.out
  python3 - mem.out <<'EOF' || bad "ZeRO-3 weight memory"
import re, sys
t = open(sys.argv[1]).read()
peak = int(re.search(r"ZeRO-3 weights per rank: peak resident \S+ \S+ \((\d+) bytes", t).group(1))
whole = int(re.search(r"whole model (\d+) bytes", t).group(1))
pred = int(re.search(r"planner predicts \S+ \S+ \((\d+) bytes", t).group(1))
print(f"  measured {peak} bytes, whole model {whole}, planner {pred}: measured/planner {peak / pred:.4f}")
if not peak < 0.85 * whole:
    sys.exit("the peak is not below the whole model: weights are not released")
if abs(peak / pred - 1) > 0.05:
    sys.exit("measured and predicted differ by more than 5%")
# Gradients (ZeRO-2/3): the owned half and at most 3 blocks (2 in flight + the one being computed),
# or the embeddings with 2 blocks at the end of backward; +4% for uneven shards and edge pages.
g = int(re.search(r"gradients per rank: peak resident \S+ \S+ \((\d+) bytes", t).group(1))
C, L, Vp, T = 128, 8, 264, 64
E, B = (Vp + T) * C, 12 * C * C + 13 * C
bound = 1.04 * 4 * (whole // 8 + max(3 * B, E + 2 * B))
print(f"  gradients: measured peak {g} bytes, bound {bound:.0f}, whole {whole}")
if g > bound:
    sys.exit("gradient buckets are not released after their reduce-scatter")
EOF
}

# 6. a rank dies after step 2
# Times bounded relative to the deadline T: the deadline case takes at least T and at most the
# mpirun-kill case's time (start-up, two steps, teardown) + T + 10 s.
T=5
elapsed=0
die_case() { # name, log file, min seconds, max seconds, expected text, mpirun options...
  local name=$1 log=$2 min=$3 max=$4 want=$5; shift 5
  local t0 t1 rc
  t0=$(date +%s)
  MEMWALL_TEST_EXIT_AT=1:2 timeout 120 "$MW_MPIRUN" --allow-run-as-root --oversubscribe -x MEMWALL_TEST_EXIT_AT "$@" \
      -np 2 "$M" train "${COMMON[@]}" --steps 50 --zero 2 --comm-timeout $T > $log 2>&1
  rc=$?
  t1=$(date +%s)
  echo "  $name: exit $rc after $((t1 - t0)) s"
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then cat $log; bad "$name: exit status $rc (0 = not noticed, 124 = hang)"; fi
  elapsed=$((t1 - t0))
  [ $elapsed -le "$max" ] || bad "$name: took $elapsed s > $max s"
  [ $elapsed -ge "$min" ] || bad "$name: took $elapsed s < $min s (the deadline is $T s)"
  grep -q -- "$want" $log || { cat $log; bad "$name: no message matching '$want'"; }
  ! grep -q "step     50/50" $log || bad "$name: rank 0 finished although rank 1 died"
}
die_case "mpirun kills the job" die1.out 0 60 "Exit code: *3"
base=$elapsed
die_case "memwall's deadline" die2.out $T $((base + T + 10)) "not finished after $T s: another rank probably died" \
  --mca orte_abort_on_non_zero_status 0

cd / && [ $fail -eq 0 ] && rm -rf "$dir"
[ $fail -eq 0 ] && echo "all multi-rank train checks passed"
exit $fail
