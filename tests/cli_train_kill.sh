#!/usr/bin/env bash
# Crash-anywhere resume (docs/resume.md): `memwall train` with the optimizer state on NVMe (part A)
# and with the weights streamed from it too (part B) is killed with SIGKILL at 15 + 15 instants
# drawn from a fixed seed, spread uniformly over the whole run (start-up, steps, their I/O and
# commits, the final save); after every kill `memwall train --resume DIR` alone (the run's record
# keeps its out-dir, log and every setting) continues it until it finishes. Every finished run's
# model.safetensors in the first invocation's out-dir must be bitwise the uninterrupted run's, its
# log must hold every step once with the uninterrupted run's losses, every printed loss the
# uninterrupted run's at that step, a resume may lose at most the step in flight, a finished run
# leaves only its done marker in its NVMe directory, and resuming it says it finished. A kill
# before the first commit leaves no record (or no directory yet): the resume says so and the run
# starts again.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_kill-$$
rm -rf "$dir" && mkdir -p "$dir"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
RANDOM=20250613 # the kill instants: the same every run
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# "step k/N | loss X" lines as "k X"
losses() { sed -n 's/^step *\([0-9]*\)\/[0-9]* | loss \([^ ]*\) .*/\1 \2/p' "$@"; }

total_kills=0 total_lost=0 total_restarts=0

# part NAME KILLS ARGS...: the reference run, then killed runs until KILLS kills were made.
part() {
  local name=$1 kills=$2
  shift 2
  local args=("$@") ref="$dir/$name-ref" t0 t1
  t0=$(now_ms)
  "$cli" train "${args[@]}" --nvme-dir "$ref/nvme" --out-dir "$ref" --log-json "$ref/log.jsonl" >"$ref.out" 2>&1 \
    || { bad "$name: the uninterrupted run failed"; cat "$ref.out"; return; }
  t1=$(now_ms)
  local span=$(( (t1 - t0) * 11 / 10 + 20 )) # ms: kill instants are drawn over the whole run
  echo "$name: the uninterrupted run took $((t1 - t0)) ms; kills drawn over $span ms"
  [ "$(ls -A "$ref/nvme")" = memwall-run.done ] && ok || bad "$name: the finished run left files in its NVMe directory: $(ls -A "$ref/nvme")"
  losses "$ref.out" >"$ref.losses"
  local made=0 trial=0
  while [ $made -lt "$kills" ] || [ $trial = 0 ]; do
    trial=$((trial + 1))
    local t="$dir/$name-t$trial" resume=0 done=0 seg=0 prev=0
    rm -rf "$t" && mkdir -p "$t"
    while [ $done = 0 ]; do
      seg=$((seg + 1))
      local out="$t/seg$seg.out" pid rc st k
      if [ $resume = 1 ]; then
        "$cli" train --resume "$t/nvme" >"$out" 2>&1 &
      else
        "$cli" train "${args[@]}" --nvme-dir "$t/nvme" --out-dir "$t/out" --log-json "$t/out/log.jsonl" >"$out" 2>&1 &
      fi
      pid=$!
      if [ $made -lt "$kills" ]; then
        sleep "$(awk -v r=$RANDOM -v s=$span 'BEGIN { printf "%.3f", r / 32767 * s / 1000 }')"
        kill -KILL $pid 2>/dev/null
      fi
      wait $pid
      rc=$?
      # A resume starts from its record's step: at most the step in flight (printed, not yet
      # committed: a step commits once its log line is written) behind what the killed run printed.
      st=$(sed -n 's/^resuming the run in .* from its last committed step, \([0-9]*\) of .*/\1/p' "$out")
      if [ -n "$st" ]; then
        grep -q 'found and used: .*memwall-offload.commit' "$out" && grep -q 'found and used: .*memwall-offload.0.dat' "$out" \
          && ok || bad "$name trial $trial segment $seg does not list the files it resumed from"
        if [ "$st" -ge $((prev - 1)) ] && [ "$st" -le $((prev + 1)) ]; then
          ok
          [ "$st" -lt $prev ] && total_lost=$((total_lost + prev - st))
        else
          bad "$name trial $trial segment $seg resumed at step $st after step $prev was printed"
        fi
        prev=$st
      fi
      k=$(losses "$out" | tail -1 | cut -d' ' -f1)
      [ -n "$k" ] && prev=$k
      if [ $rc = 0 ] && grep -q "^the run in $t/nvme finished; nothing to resume" "$out"; then
        done=1 # killed after the state was retired: the resume says the run finished
      elif [ $rc = 0 ]; then
        done=1
      elif [ $rc = 137 ]; then
        made=$((made + 1))
        total_kills=$((total_kills + 1))
        resume=1
      elif [ $rc = 1 ] && [ $resume = 1 ] && grep -q 'holds no commit record\|neither a checkpoint nor the NVMe directory' "$out"; then
        if [ -f "$t/out/model.safetensors" ]; then
          done=1 # killed while the finished run removed its files: its model was written before
        else
          total_restarts=$((total_restarts + 1)) # killed before the first commit: nothing to resume
          resume=0
          prev=0
        fi
        rm -rf "$t/nvme"
      else
        bad "$name trial $trial segment $seg exited $rc"; tail -5 "$out"; return
      fi
    done
    cmp -s "$ref/model.safetensors" "$t/out/model.safetensors" && ok \
      || bad "$name trial $trial: the final model differs from the uninterrupted run's"
    # every loss printed by any segment is the uninterrupted run's loss at that step
    local wrong
    wrong=$(losses "$t"/seg*.out | sort -u | while read -r k l; do grep -qx "$k $l" "$ref.losses" || echo "step $k loss $l"; done)
    [ -z "$wrong" ] && ok || bad "$name trial $trial: losses differ from the uninterrupted run: $wrong"
    [ "$(ls -A "$t/nvme" 2>/dev/null)" = memwall-run.done ] && ok || bad "$name trial $trial left files: $(ls -A "$t/nvme")"
    # the log: every step once, in order, with the uninterrupted run's values
    [ "$(grep -o '"step":[0-9]*,"loss":[^,]*' "$t/out/log.jsonl")" = "$(grep -o '"step":[0-9]*,"loss":[^,]*' "$ref/log.jsonl")" ] \
      && [ "$(grep -c '"step":' "$t/out/log.jsonl")" -gt 10 ] && ok || bad "$name trial $trial: the log is not the uninterrupted run's"
    # resuming a finished run says so, and changes nothing
    "$cli" train --resume "$t/nvme" >"$t/again.out" 2>&1 && grep -q "finished; nothing to resume" "$t/again.out" \
      && cmp -s "$ref/model.safetensors" "$t/out/model.safetensors" && ok || bad "$name trial $trial: resuming the finished run: $(cat "$t/again.out")"
  done
  echo "$name: $made kills over $trial run(s), each finished bitwise equal to the uninterrupted run"
}

common=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --val-every 0)
# A: the optimizer state (fp32 master + moments) on NVMe, four subgroups, the update overlapped.
part opt 15 "${common[@]}" --steps 40 --optimizer-tier nvme --subgroup-size 10000 --buffer-count 3
# B: the weights streamed from the master on NVMe as well (layer-major, two micro-batches).
part stream 15 "${common[@]}" --steps 30 --offload-params nvme --subgroup-size 4096 --grad-accum 2

echo "cli_train_kill: $total_kills kills (SIGKILL), $total_lost step(s) lost in all (at most the one in flight each), $total_restarts kill(s) before the first commit (started again)"
[ $total_kills -ge 30 ] && ok || bad "only $total_kills kills were made"
rm -rf "$dir"
echo "cli_train_kill: $pass passed, $fail failed"
[ $fail = 0 ]
