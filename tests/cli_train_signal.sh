#!/usr/bin/env bash
# SIGINT and SIGTERM (docs/resume.md, "Signals"): `memwall train` is sent SIGINT or SIGTERM at
# instants drawn from a fixed seed over the whole run; each stop must exit 130 or 143 (or 0 when
# the run had finished), print how to continue, leave no temporary file, and the printed command
# (`memwall train --resume X`, nothing else) must continue the run; the finished run's model and
# log are bitwise the uninterrupted run's. Part A: the optimizer state on NVMe (the commit record
# is what resumes); part B: everything in DRAM with an out-dir (the stop writes a checkpoint).
# Last, a second SIGINT exits at once and the run is still resumable.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_signal-$$
rm -rf "$dir" && mkdir -p "$dir"
cd "$dir" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
RANDOM=20261204
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
steps_losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1"; }
tmp_files() { find "$@" -name '*.tmp.*' 2>/dev/null; }
total=0

# part NAME STOPS ARGS...
part() {
  local name=$1 stops=$2
  shift 2
  local args=("$@") t0 t1
  t0=$(now_ms)
  local nv=()
  [ "$name" = nvme ] && nv=(--nvme-dir "$name-ref/nvme")
  "$cli" train "${args[@]}" "${nv[@]}" --out-dir "$name-ref" --log-json "$name-ref/log.jsonl" >"$name-ref.out" 2>&1 \
    || { bad "$name: the uninterrupted run failed"; cat "$name-ref.out"; return; }
  t1=$(now_ms)
  local span=$(( (t1 - t0) * 11 / 10 + 20 )) made=0 trial=0
  echo "$name: the uninterrupted run took $((t1 - t0)) ms; signals drawn over $span ms"
  while [ $made -lt "$stops" ]; do
    trial=$((trial + 1))
    local out="$name-t$trial" seg=0 done=0 cmd=()
    [ "$name" = nvme ] && nv=(--nvme-dir "$out/nvme")
    cmd=("${args[@]}" "${nv[@]}" --out-dir "$out" --log-json "$out/log.jsonl")
    while [ $done = 0 ]; do
      seg=$((seg + 1))
      local sig=INT pid rc next
      [ $((RANDOM % 2)) = 1 ] && sig=TERM
      env --default-signal=INT "$cli" train "${cmd[@]}" >"$out.seg$seg.out" 2>"$out.seg$seg.err" &
      pid=$!
      if [ $made -lt "$stops" ]; then
        sleep "$(awk -v r=$RANDOM -v s=$span 'BEGIN { printf "%.3f", r / 32767 * s / 1000 }')"
        kill -$sig $pid 2>/dev/null
      fi
      wait $pid
      rc=$?
      if [ $rc = 0 ]; then
        done=1
      elif { [ $rc = 130 ] || [ $rc = 143 ]; } && ! grep -q 'memwall train' "$out.seg$seg.out" "$out.seg$seg.err"; then
        # The signal came before memwall had started (exec, loading: its default action): nothing
        # ran; the same command again (a first segment afresh, a resumed one resumes again).
        [ $seg = 1 ] && rm -rf "$out"
        seg=$((seg - 1))
      elif { [ $rc = 130 ] && [ $sig = INT ]; } || { [ $rc = 143 ] && [ $sig = TERM ]; }; then
        made=$((made + 1))
        total=$((total + 1))
        next=$(sed -n "s/^memwall train: stopped by SIG$sig after step [0-9]* of [0-9]*; continue with: memwall train --resume \(.*\)$/\1/p" "$out.seg$seg.err")
        [ -n "$next" ] && ok || { bad "$name trial $trial segment $seg: no way to continue printed"; cat "$out.seg$seg.err"; return; }
        [ -z "$(tmp_files "$out")" ] && ok || bad "$name trial $trial segment $seg left temporaries: $(tmp_files "$out")"
        cmd=(--resume "$next")
      else
        bad "$name trial $trial segment $seg exited $rc after SIG$sig"; tail -3 "$out.seg$seg.err"; return
      fi
    done
    cmp -s "$name-ref/model.safetensors" "$out/model.safetensors" && ok || bad "$name trial $trial: the final model differs"
    [ "$(steps_losses "$out/log.jsonl")" = "$(steps_losses "$name-ref/log.jsonl")" ] && ok || bad "$name trial $trial: the log differs"
    [ -z "$(tmp_files "$out")" ] && ok || bad "$name trial $trial left temporaries: $(tmp_files "$out")"
  done
  echo "$name: $made stops over $trial run(s), each finished bitwise equal to the uninterrupted run"
}

common=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --val-every 50 --steps 300)
part nvme 6 "${common[@]}" --optimizer-tier nvme --subgroup-size 10000
part dram 6 "${common[@]}"

# A second SIGINT: at once, still resumable.
MEMWALL_TEST_STOP_AT=3 env --default-signal=INT "$cli" train "${common[@]}" --optimizer-tier nvme --out-dir two \
  --nvme-dir two/nvme >two.out 2>two.err &
pid=$!
for _ in $(seq 600); do case "$(ps -o stat= -p $pid)" in T*) break ;; esac; sleep 0.05; done
kill -INT $pid; kill -CONT $pid; sleep 0.1; kill -INT $pid # the second while the first is being taken
wait $pid
rc=$?
[ $rc = 130 ] && grep -q "SIGINT again: exiting now" two.err && ok || { bad "a second SIGINT: rc $rc"; cat two.err; }
"$cli" train --resume two/nvme >two-res.out 2>&1 && cmp -s nvme-ref/model.safetensors two/model.safetensors \
  && ok || { bad "the run stopped by two SIGINTs did not resume bitwise"; tail -3 two-res.out; }

[ $total -ge 10 ] && ok || bad "only $total stops were made"
cd / && rm -rf "$dir"
echo "cli_train_signal: $total stops (SIGINT/SIGTERM); $pass passed, $fail failed"
[ $fail = 0 ]
