#!/usr/bin/env bash
# Faults under load (docs/train.md, "Faults"), through the I/O engine's MEMWALL_FAULT hook:
#  1. an I/O error on a read and on a write in step 3 of `memwall train --optimizer-tier nvme`
#     and of `--offload-params nvme` (the fault's after= counted from a clean run's trace): exit
#     1, the message names subgroup, object, file and offset, says it was injected and that
#     step 3 is not committed, and names the step-2 checkpoint as intact; --resume from it,
#     without the fault, gives bitwise the losses and final checkpoint of the run that never
#     failed (the threads backend once too);
#  2. disk full (injected ENOSPC): the message says which directory is full and what is free;
#  3. a slow disk (every piece 20 ms late): bitwise the same losses, and `memwall report` shows
#     a larger exposed I/O wait;
#  4. a malformed MEMWALL_FAULT is refused (exit 1) naming the rule.
# A real full disk is tests/cli_disk_full.sh; two runs on one directory, tests/cli_nvme_dir.sh.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
unset MEMWALL_FAULT MEMWALL_AIO
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
. "$src/tests/lib_ckpt.sh"
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_faults-$$
rm -rf "$dir" && mkdir -p "$dir"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
losses() { grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$1"; }
base=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --buffer-count 3 --steps 4)
declare -A mode
mode[opt]="--optimizer-tier nvme --subgroup-size 10000 --preread off" # pieces counted per step: no reads between steps
mode[stream]="--offload-params nvme --subgroup-size 8K"
# (the streamed runs read every weight from NVMe: with handoffs from the update, how many subgroups
# are read rather than handed over depends on timing, and the piece counted below must be the same
# piece in both runs)
export MEMWALL_STREAM_HANDOFF=0

# Pieces of op (read/write) the engine issued before step 3 began: MEMWALL_FAULT's after= for
# the first piece of step 3 (io events carry their submit time; steps 1-2 and the checkpoint
# of step 2 come before step 3 starts).
pieces_before_step3() {
  python3 - "$1" "$2" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
t3 = [e["ts"] for e in ev if e.get("cat") == "step" and e.get("args", {}).get("step") == 3][0]
print(sum(1 for e in ev if e.get("cat") == "io" and e.get("name") == sys.argv[2] and e["ts"] < t3))
PY
}

for m in opt stream; do
  # shellcheck disable=SC2206
  args=("${base[@]}" ${mode[$m]})
  ref="$dir/$m-ref"
  "$cli" train "${args[@]}" --nvme-dir "$ref/nvme" --ckpt-every 2 --out-dir "$ref" --log-json "$ref.jsonl" \
    --trace "$ref.json" >"$ref.out" 2>&1 || { bad "$m: the clean run failed"; cat "$ref.out"; continue; }
  for op in write read; do
    n=$(pieces_before_step3 "$ref.json" $op)
    [ "$n" -gt 0 ] 2>/dev/null && ok || { bad "$m: no ${op}s before step 3 in the trace ($n)"; continue; }
    for be in default threads; do
      [ $be = threads ] && { [ $m = opt ] && [ $op = write ] || continue; }
      run="$dir/$m-$op-$be"
      env_be=(); [ $be = threads ] && env_be=(MEMWALL_AIO=threads)
      env "${env_be[@]}" MEMWALL_FAULT="$op:eio:after=$n" "$cli" train "${args[@]}" --nvme-dir "$run/nvme" \
        --ckpt-every 2 --out-dir "$run" --log-json "$run.jsonl" >"$run.out" 2>&1
      rc=$?
      [ $rc = 1 ] && ok || { bad "$m $op ($be): exit $rc, want 1"; tail -3 "$run.out"; }
      msg=$(grep -m1 '^memwall: the training step failed: ' "$run.out")
      echo "$m $op ($be): $msg"
      # (streamed: the first write of step 3 may be a block's kept activations, in the scratch object)
      echo "$msg" | grep -qE "$op of [0-9.]+ [KM]iB at offset [0-9]+ in $run/nvme/memwall-offload\.0\.dat \(object '(sg[0-9]+\.(slot[01]|grad)|scratch)'\) failed: Input/output error \[injected by MEMWALL_FAULT\]" \
        && echo "$msg" | grep -qE "subgroup [0-9]+|block [0-9]+, micro-batch [0-9]+" && echo "$msg" | grep -qF "(step 3 not committed; the" \
        && ok || bad "$m $op ($be): the message lacks subgroup, object, file, offset or 'step 3 not committed': $msg"
      grep -qxF "memwall: the last checkpoint, $run/ckpt_00000002.mwck (step 2), is intact: continue with --resume $run/ckpt_00000002.mwck" \
        "$run.out" && ok || { bad "$m $op ($be): no line naming the intact checkpoint"; tail -3 "$run.out"; }
      [ ! -e "$run/ckpt_00000004.mwck" ] && ok || bad "$m $op ($be): the failed run wrote a final checkpoint"
      # The retry: resume from the intact checkpoint without the fault.
      env "${env_be[@]}" "$cli" train --resume "$run/ckpt_00000002.mwck" --sample-len 0 --nvme-dir "$run/nvme2" \
        --out-dir "$run/res" --log-json "$run-res.jsonl" >"$run-res.out" 2>&1 \
        || { bad "$m $op ($be): resume failed"; tail -3 "$run-res.out"; continue; }
      want=$(losses "$ref.jsonl" | grep -E '"step":(3|4),')
      [ -n "$want" ] && [ "$want" = "$(losses "$run-res.jsonl")" ] && ok \
        || { bad "$m $op ($be): resumed losses differ from the run without a fault"; diff <(echo "$want") <(losses "$run-res.jsonl"); }
      ckpt_state_eq "$ref/ckpt_00000004.mwck" "$run/res/ckpt_00000004.mwck" && ok \
        || bad "$m $op ($be): the final checkpoint differs from the run without a fault"
    done
  done

  # 2. Disk full, injected: the first write of step 3 and every one after it.
  n=$(pieces_before_step3 "$ref.json" write)
  run="$dir/$m-full"
  # (the step-2 checkpoint as in the clean run: it ends step 2's overlapped update before step 3,
  # so the writes before step 3 are the ones counted there; without it a kept-activation write of
  # step 3 could come first under load, and the fault hit step 2's update)
  MEMWALL_FAULT="write:enospc:after=$n" "$cli" train "${args[@]}" --nvme-dir "$run/nvme" --ckpt-every 2 --out-dir "$run" \
    >"$run.out" 2>&1
  rc=$?
  msg=$(grep -m1 '^memwall: the training step failed: ' "$run.out")
  echo "$m disk full: $msg"
  [ $rc = 1 ] && echo "$msg" | grep -qE "failed: No space left on device — the disk holding $run/nvme is full \([0-9.]+ [KMGT]?i?B available there\) \[injected by MEMWALL_FAULT\]" \
    && echo "$msg" | grep -qF "(step 3 not committed; the" && ok \
    || { bad "$m disk full: exit $rc, want 1 with the directory, its free space and 'step 3 not committed'"; tail -3 "$run.out"; }

  # 3. A slow disk: every piece 20 ms late. Same losses; the exposed I/O wait grows.
  run="$dir/$m-slow"
  MEMWALL_FAULT="delay:us=20000" "$cli" train "${args[@]}" --nvme-dir "$run/nvme" --log-json "$run.jsonl" \
    --trace "$run.json" >"$run.out" 2>&1 || { bad "$m slow disk: the run failed"; tail -3 "$run.out"; continue; }
  [ "$(losses "$ref.jsonl")" = "$(losses "$run.jsonl")" ] && ok || bad "$m slow disk: losses differ"
  w0=$("$cli" report "$ref.json" --text | sed -n 's/^time (whole run):.*exposed I\/O wait \([0-9.]*\) s.*/\1/p')
  w1=$("$cli" report "$run.json" --text | sed -n 's/^time (whole run):.*exposed I\/O wait \([0-9.]*\) s.*/\1/p')
  echo "$m exposed I/O wait: $w0 s without delay, $w1 s with 20 ms per piece"
  # Each of the 4 steps waits for at least one delayed piece: >= 80 ms more.
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if b >= 0.08 and b > a + 0.05 else 1)" \
    "${w0:-x}" "${w1:-x}" 2>/dev/null && ok || bad "$m slow disk: exposed I/O wait $w1 s is not above $w0 s + 0.05 s"
done

# 4. A malformed MEMWALL_FAULT: refused before training, naming the rule.
MEMWALL_FAULT="write:eio:after=ten" "$cli" train "${base[@]}" --optimizer-tier nvme --nvme-dir "$dir/badspec" \
  >"$dir/badspec.out" 2>&1
rc=$?
[ $rc = 1 ] && grep -qF "MEMWALL_FAULT='write:eio:after=ten': rule 1 ('write:eio:after=ten'): after= needs a decimal number" \
  "$dir/badspec.out" && ! grep -q '^step' "$dir/badspec.out" && ok \
  || { bad "a malformed MEMWALL_FAULT: exit $rc, want 1 naming the rule"; cat "$dir/badspec.out"; }

rm -rf "$dir"
echo "cli_train_faults: $pass passed, $fail failed"
[ $fail = 0 ]
