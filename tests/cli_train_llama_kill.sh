#!/usr/bin/env bash
# Crash-anywhere resume for the Llama family (issue 24; the GPT-2 versions: tests/cli_train_kill.sh,
# tests/cli_train_resume.sh). Models from `--init-hf DIR` (tests/fixtures/llama), trained on its token
# shard; every resumed run is compared with the uninterrupted run of the same arguments.
#  A. --optimizer-tier nvme (llama_gqa_tied: grouped-query attention, tied head) and
#  B. --offload-params nvme (llama3_untied: untied head, llama3 RoPE; layer-major, two micro-batches):
#     first a kill -9 in the middle of the run at a known step (the run stops itself after step S,
#     MEMWALL_TEST_STOP_AT, and is killed while stopped): `memwall train --resume NVME_DIR` alone says
#     it resumes from step S-1 or S (the step in flight when killed runs again), lists the files it
#     resumed from, and finishes; then kills at instants drawn from a fixed seed over the whole run
#     (start-up, steps, their I/O and commits, the final save), each followed by `--resume NVME_DIR`
#     until the run finishes. Every finished run's model.safetensors is bitwise the uninterrupted
#     run's (cmp), every loss any segment printed is the uninterrupted run's loss at that step, the
#     log holds every step once with the uninterrupted run's losses, the NVMe directory keeps only
#     the done marker, and resuming the finished run says it finished and changes nothing.
#  C. Checkpoints (qwen2_bias: q/k/v biases): a run with --ckpt-every 3 killed (-9) after step 7, in
#     DRAM, with the optimizer on NVMe and with the weights streamed: `--resume ckpt_00000006.mwck`
#     finishes into the run's out-dir bitwise (model.safetensors, the log, and the step-12
#     checkpoint's state, tests/lib_ckpt.sh). With NVMe, the killed run's directory still holds its
#     state: resuming the checkpoint into it is refused with a message, into another one it runs.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
fx="$src/tests/fixtures/llama"
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_llama_kill-$$
rm -rf "$dir" && mkdir -p "$dir"
cd "$dir" || exit 1
. "$src/tests/lib_ckpt.sh"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
RANDOM=20250624 # the kill instants: the same every run
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# "step k/N | loss X" lines as "k X"
losses() { sed -n 's/^step *\([0-9]*\)\/[0-9]* | loss \([^ ]*\) .*/\1 \2/p' "$@"; }
# the log's steps with their losses and validation losses, one line each (the step-0 validation included)
steps_losses() { grep -o '^{"step":[0-9]*,"\(loss\|val_loss\)":[^,}]*\(,"val_loss":[^,}]*\)\?' "$1"; }
# wait_stopped PID: until the process has stopped itself (MEMWALL_TEST_STOP_AT) or 30 s went by
wait_stopped() { for _ in $(seq 600); do case "$(ps -o stat= -p "$1")" in T*) return 0 ;; esac; sleep 0.05; done; return 1; }
data=(--data "$fx/eval_ids.bin" --batch 4 --seq 16 --threads 1 --sample-len 0)

total_kills=0 total_lost=0 total_restarts=0

# part NAME STOP_AT KILLS ARGS...: the reference run; trial 1 killed while stopped after step STOP_AT,
# then trials with kills at random instants until KILLS of them were made.
part() {
  local name=$1 stop=$2 kills=$3
  shift 3
  local args=("$@") ref="$dir/$name-ref" t0 t1
  t0=$(now_ms)
  "$cli" train "${args[@]}" --nvme-dir "$ref/nvme" --out-dir "$ref" --log-json "$ref/log.jsonl" >"$ref.out" 2>&1 \
    || { bad "$name: the uninterrupted run failed"; cat "$ref.out"; return; }
  t1=$(now_ms)
  local span=$(( (t1 - t0) * 11 / 10 + 20 )) # ms: kill instants are drawn over the whole run
  echo "$name: the uninterrupted run took $((t1 - t0)) ms; random kills drawn over $span ms"
  grep -q '^memwall train: Llama' "$ref.out" && ok || bad "$name: not a Llama model"
  [ "$(ls -A "$ref/nvme")" = memwall-run.done ] && ok || bad "$name: the finished run left files in its NVMe directory: $(ls -A "$ref/nvme")"
  losses "$ref.out" >"$ref.losses"
  [ "$(wc -l <"$ref.losses")" -gt 10 ] && ok || bad "$name: the uninterrupted run printed $(wc -l <"$ref.losses") losses"
  local made=0 trial=0 stopped=0
  while [ $made -lt $((kills + 1)) ] || [ $trial = 0 ]; do
    trial=$((trial + 1))
    local t="$dir/$name-t$trial" resume=0 done=0 seg=0 prev=0
    rm -rf "$t" && mkdir -p "$t"
    while [ $done = 0 ]; do
      seg=$((seg + 1))
      local out="$t/seg$seg.out" pid rc st k
      if [ $resume = 1 ]; then
        "$cli" train --resume "$t/nvme" >"$out" 2>&1 &
      elif [ $trial = 1 ]; then
        MEMWALL_TEST_STOP_AT=$stop "$cli" train "${args[@]}" --nvme-dir "$t/nvme" --out-dir "$t/out" \
          --log-json "$t/out/log.jsonl" >"$out" 2>&1 &
      else
        "$cli" train "${args[@]}" --nvme-dir "$t/nvme" --out-dir "$t/out" --log-json "$t/out/log.jsonl" >"$out" 2>&1 &
      fi
      pid=$!
      if [ $trial = 1 ] && [ $seg = 1 ]; then # the known instant: stopped after step $stop
        wait_stopped $pid && ok || bad "$name: the run did not stop after step $stop"
        kill -KILL $pid 2>/dev/null
      elif [ $trial -gt 1 ] && [ $made -lt $((kills + 1)) ]; then
        sleep "$(awk -v r=$RANDOM -v s=$span 'BEGIN { printf "%.3f", r / 32767 * s / 1000 }')"
        kill -KILL $pid 2>/dev/null
      fi
      wait $pid
      rc=$?
      # A resume starts from its record's step: at most the step in flight (printed, not yet
      # committed: a step commits once its log line is written) behind what the killed run printed.
      st=$(sed -n 's/^resuming the run in .* from its last committed step, \([0-9]*\) of .*/\1/p' "$out")
      if [ -n "$st" ]; then
        # The files are listed as the resume starts; "resumed from" comes with the run's header, after
        # the model is built: a resume killed before that (no step, no validation, no finish) has
        # not printed it yet.
        grep -q 'found and used: .*memwall-offload.commit' "$out" && grep -q 'found and used: .*memwall-offload.0.dat' "$out" \
          && { grep -q "resumed from $t/nvme at step $st" "$out" || { [ $rc = 137 ] && ! grep -q '^step \|^val \|^all .* committed' "$out"; }; } \
          && ok || bad "$name trial $trial segment $seg does not list the files it resumed from"
        if [ "$st" -ge $((prev - 1)) ] && [ "$st" -le $((prev + 1)) ]; then
          ok
          [ "$st" -lt $prev ] && total_lost=$((total_lost + prev - st))
        else
          bad "$name trial $trial segment $seg resumed at step $st after step $prev was printed"
        fi
        if [ $trial = 1 ] && [ $seg = 2 ]; then
          [ "$st" -ge $((stop - 1)) ] && [ "$st" -le $stop ] && stopped=1 && ok \
            || bad "$name: killed after step $stop, resumed at step $st"
        fi
        prev=$st
      fi
      k=$(losses "$out" | tail -1 | cut -d' ' -f1)
      [ -n "$k" ] && prev=$k
      if [ $rc = 0 ]; then
        done=1 # finished (or killed after the state was retired: the resume says the run finished)
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
    [ "$(steps_losses "$t/out/log.jsonl")" = "$(steps_losses "$ref/log.jsonl")" ] && ok \
      || bad "$name trial $trial: the log is not the uninterrupted run's"
    # resuming a finished run says so, and changes nothing
    "$cli" train --resume "$t/nvme" >"$t/again.out" 2>&1 && grep -q "finished; nothing to resume" "$t/again.out" \
      && cmp -s "$ref/model.safetensors" "$t/out/model.safetensors" && ok || bad "$name trial $trial: resuming the finished run: $(cat "$t/again.out")"
  done
  [ $stopped = 1 ] || bad "$name: the run killed after step $stop was not resumed from there"
  echo "$name: $made kills over $trial run(s), each finished bitwise equal to the uninterrupted run"
}

part opt 20 6 --init-hf "$fx/llama_gqa_tied" "${data[@]}" --steps 40 --val-every 10 --optimizer-tier nvme \
  --subgroup-size 4096 --buffer-count 3
grep -q 'optimizer state (fp32 master + moments, two slots) on NVMe' "$dir/opt-ref.out" && ! grep -q 'streaming: weights' "$dir/opt-ref.out" \
  && ok || bad "part A: the optimizer state is not on NVMe, or the weights stream"
part stream 12 6 --init-hf "$fx/llama3_untied" "${data[@]}" --steps 24 --val-every 8 --offload-params nvme \
  --subgroup-size 4096 --grad-accum 2
grep -q 'streaming: weights and gradients on NVMe.*schedule layer-major' "$dir/stream-ref.out" && ok \
  || bad "part B: the run does not stream its weights (layer-major)"
echo "cli_train_llama_kill: $total_kills kills (SIGKILL), $total_lost step(s) lost in all (at most the one in flight each), $total_restarts kill(s) before the first commit (started again)"
[ $total_kills -ge 14 ] && ok || bad "only $total_kills kills were made"

# C. a checkpoint resumed after kill -9, three tiers
ck=(--init-hf "$fx/qwen2_bias" "${data[@]}" --steps 12 --val-every 5 --ckpt-every 3 --grad-accum 2 --subgroup-size 2048)
for mode in "dram:--optimizer-tier dram" "opt:--optimizer-tier nvme" "stream:--offload-params nvme"; do
  n=ck_${mode%%:*}
  read -ra m <<<"${mode#*:}"
  "$cli" train "${ck[@]}" "${m[@]}" --nvme-dir "$n-ref/nvme" --out-dir "$n-ref" --log-json "$n-ref/log.jsonl" >"$n-ref.out" 2>&1 \
    || { bad "$n: the uninterrupted run failed"; cat "$n-ref.out"; continue; }
  MEMWALL_TEST_STOP_AT=7 "$cli" train "${ck[@]}" "${m[@]}" --nvme-dir "$n/nvme" --out-dir "$n" --log-json "$n/log.jsonl" >"$n-1.out" 2>&1 &
  pid=$!
  wait_stopped $pid || bad "$n: the run did not stop after step 7"
  kill -KILL $pid
  wait $pid 2>/dev/null
  rc=$?
  [ $rc = 137 ] && [ -f "$n/ckpt_00000006.mwck" ] && [ ! -f "$n/ckpt_00000009.mwck" ] && [ ! -f "$n/model.safetensors" ] && ok \
    || { bad "$n: killed after step 7: exit $rc, want 137 with checkpoints up to step 6 only"; ls "$n"; continue; }
  extra=()
  if [ "$n" != ck_dram ]; then
    "$cli" train --resume "$n/ckpt_00000006.mwck" >"$n-refused.out" 2>&1
    rc=$?
    [ $rc = 1 ] && grep -q "holds the files of a run that did not finish" "$n-refused.out" && ! grep -q '^step' "$n-refused.out" \
      && ok || { bad "$n: resuming the checkpoint into the killed run's NVMe directory: exit $rc"; cat "$n-refused.out"; }
    extra=(--nvme-dir "$n/nvme2")
  fi
  "$cli" train --resume "$n/ckpt_00000006.mwck" "${extra[@]}" >"$n-2.out" 2>&1 \
    || { bad "$n: --resume ckpt_00000006.mwck failed"; tail -5 "$n-2.out"; continue; }
  grep -q "^resuming the run of $n/ckpt_00000006.mwck at step 6 of 12" "$n-2.out" && grep -q "resumed from $n/ckpt_00000006.mwck at step 6" "$n-2.out" \
    && grep -q '^memwall train: Llama' "$n-2.out" && ok || bad "$n: the resume does not say it resumes the checkpoint at step 6"
  [ "$(losses "$n-2.out" | head -1 | cut -d' ' -f1)" = 7 ] && ok || bad "$n: the resumed run does not start at step 7"
  cmp -s "$n-ref/model.safetensors" "$n/model.safetensors" && ok || bad "$n: the final model differs from the uninterrupted run's"
  [ "$(steps_losses "$n/log.jsonl")" = "$(steps_losses "$n-ref/log.jsonl")" ] && [ "$(steps_losses "$n/log.jsonl" | grep -c "\"loss\"")" = 12 ] \
    && ok || bad "$n: the log is not the uninterrupted run's: $(steps_losses "$n/log.jsonl" | tr '\n' ' ')"
  ckpt_state_eq "$n-ref/ckpt_00000012.mwck" "$n/ckpt_00000012.mwck" && ok || bad "$n: the final checkpoints differ"
  ckpt_state_eq "$n-ref/ckpt_00000012.mwck" "$n/ckpt_00000009.mwck" && bad "$n: the checkpoint comparison cannot fail" || ok
done
grep -q 'streaming: weights and gradients on NVMe' ck_stream-2.out && grep -q 'optimizer state .* on NVMe' ck_opt-2.out \
  && ! grep -q 'on NVMe' ck_dram-2.out && ok || bad "part C: the resumed runs do not keep their tiers"

cd / && [ $fail = 0 ] && rm -rf "$dir"
echo "cli_train_llama_kill: $pass passed, $fail failed"
[ $fail = 0 ]
