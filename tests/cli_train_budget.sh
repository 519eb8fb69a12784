#!/usr/bin/env bash
# A budget picks the knobs (issue "A house for every model"): with --dram-budget and the streamed
# run's pipeline knobs left to memwall, the subgroup size, staging buffers, prefetch depth and
# activation placement are chosen by the plan so the run fits, or it is refused naming the
# smallest budget that would fit — which then fits.
#  1. GPT-2 124M's shape (batch 4 x 256, accumulation 8), budgets 256 MiB .. 4 GiB, set up and
#     checked without steps (--steps 0: the trainer's own plan check runs before its first step).
#  2. A small model trained for real under a budget its default knobs exceed: it runs, and the
#     measured peak resident set stays within the budget.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_budget-$$
rm -rf "$dir" && mkdir -p "$dir"
cd "$dir" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
to_bytes() { awk -v v="$1" -v u="$2" 'BEGIN { m = u == "GiB" ? 2^30 : u == "MiB" ? 2^20 : u == "KiB" ? 2^10 : 1; printf "%.0f", v * m }'; }
big=(--preset gpt2-124m --vocab 257 --batch 4 --seq 256 --grad-accum 8 --steps 0 --sample-len 0 --val-every 0
     --offload-params nvme --threads 2 --data "$src/data/kjv_excerpt.txt")
refusals=0 fits=0
for b in 256MiB 384MiB 512MiB 1GiB 4GiB; do
  rm -rf nv
  "$cli" train "${big[@]}" --nvme-dir nv --dram-budget $b >b.out 2>&1
  rc=$?
  if [ $rc = 0 ]; then
    fits=$((fits + 1))
    line=$(grep -m1 'planned DRAM peak' b.out)
    read -r pv pu <<<"$(echo "$line" | sed -n 's/.*planned DRAM peak \([0-9.]*\) \([KMG]iB\).*/\1 \2/p')"
    [ -n "$pv" ] && [ "$(to_bytes "$pv" "$pu")" -le "$(to_bytes "${b%%[KMG]iB}" "${b##*[0-9]}")" ] && ok \
      || bad "budget $b: planned peak '$pv $pu' above it"
    echo "budget $b: $(grep -m1 'chose' b.out || echo 'the default knobs fit')"
  else
    refusals=$((refusals + 1))
    need=$(sed -n 's/.*the smallest plan needs \([0-9.]*\) \([KMG]iB\).*/\1 \2/p' b.out)
    [ $rc = 1 ] && [ -n "$need" ] && ok || { bad "budget $b: rc $rc without the smallest budget"; cat b.out; continue; }
    echo "budget $b: refused, the smallest plan needs $need"
    mib=$(( ($(to_bytes $need) + (1 << 20) - 1) >> 20 ))
    rm -rf nv
    "$cli" train "${big[@]}" --nvme-dir nv --dram-budget ${mib}MiB >b2.out 2>&1 && ok \
      || { bad "the smallest budget named, ${mib} MiB, does not fit"; tail -3 b2.out; }
  fi
done
[ $refusals -ge 1 ] && [ $fits -ge 3 ] && ok || bad "$refusals refusals and $fits fits: the range does not cross the edge"
grep -q 'chose: subgroups of 1048576 parameters\|chose: subgroups of 2097152 parameters\|chose: subgroups of 524288 parameters' b.out 2>/dev/null || true

# 2. a real run under a budget the default knobs exceed
small=(--preset tiny --layers 2 --width 512 --heads 8 --context 128 --vocab 257 --batch 2 --seq 128 --grad-accum 2
       --steps 2 --sample-len 0 --val-every 0 --offload-params nvme --threads 2 --data "$src/data/kjv_excerpt.txt")
rm -rf nv
"$cli" train "${small[@]}" --nvme-dir nv --steps 0 >d.out 2>&1 || bad "the small model's default plan failed"
read -r dv du <<<"$(sed -n 's/.*planned DRAM peak \([0-9.]*\) \([KMG]iB\).*/\1 \2/p' d.out | head -1)"
def=$(to_bytes "$dv" "$du")
budget_mib=$(( def * 3 / 4 >> 20 ))
rm -rf nv
"$cli" train "${small[@]}" --nvme-dir nv --dram-budget ${budget_mib}MiB >s.out 2>&1
rc=$?
if [ $rc = 0 ]; then
  grep -q 'chose:' s.out && ok || bad "no knobs were chosen for ${budget_mib} MiB (default plan $dv $du)"
  read -r hv hu <<<"$(sed -n 's/.*measured peak resident set (VmHWM) \([0-9.]*\) \([KMG]iB\).*/\1 \2/p' s.out)"
  [ -n "$hv" ] && [ "$(to_bytes "$hv" "$hu")" -le $(( budget_mib << 20 )) ] && ok \
    || bad "measured peak '$hv $hu' above the ${budget_mib} MiB budget"
  echo "small model: default plan $dv $du, budget ${budget_mib} MiB: $(grep -m1 chose: s.out | sed 's/^ *//'); measured $hv $hu"
else
  grep -q 'the smallest plan needs' s.out && echo "small model: ${budget_mib} MiB refused: $(grep -o 'the smallest plan needs [^(]*' s.out)" \
    && ok || { bad "the small run under ${budget_mib} MiB: rc $rc"; tail -3 s.out; }
fi
cd / && rm -rf "$dir"
echo "cli_train_budget: $pass passed, $fail failed"
[ $fail = 0 ]
