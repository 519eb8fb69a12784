#!/usr/bin/env bash
# No run lost (docs/resume.md, "What a resume keeps"): the run is its record.
#  1. A run directory (--out-dir D --nvme-dir D/nvme --log-json D/log.jsonl) stopped mid-run,
#     then copied (cp -a D R) and moved (mv D M): `--resume R/nvme` and `--resume M/nvme` alone
#     finish in place, bitwise the uninterrupted run (model and log), the trace continued (one
#     file, every step), and the original is never touched; a finished run resumed says so.
#  2. A run whose every step is committed (stopped after its last step's commit): the resume
#     writes its outputs ("finishing its outputs").
#  3. Flags given with --resume: allowed (listed), announced (overrides), refused (both values,
#     exit 2, nothing run).
#  4. A checkpoint resumed alone finishes into its run's out-dir.
#  5. Outputs checked before the first step: a second run on a live run's out-dir, --trace and
#     --log-json on one file, the log on the data, a trace in a missing directory, a batch that
#     does not fit in memory: each refused before any step; temporaries of dead runs swept.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_resume-$$
rm -rf "$dir" && mkdir -p "$dir"
cd "$dir" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
steps_losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1"; }
# stop_at S ARGS...: runs memwall train until it has made step S, then SIGINT: a clean stop there
stop_at() {
  local s=$1
  shift
  MEMWALL_TEST_STOP_AT=$s env --default-signal=INT "$cli" train "$@" >stop.out 2>&1 &
  local pid=$!
  for _ in $(seq 600); do case "$(ps -o stat= -p $pid)" in T*) break ;; esac; sleep 0.05; done
  kill -INT $pid
  kill -CONT $pid
  wait $pid
}
args=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --val-every 5 --steps 12
      --optimizer-tier nvme --subgroup-size 10000)

"$cli" train "${args[@]}" --out-dir ref --nvme-dir ref/nvme --log-json ref/log.jsonl >ref.out 2>&1 \
  || { bad "the uninterrupted run failed"; cat ref.out; }

# 1. stopped at step 5, copied and moved
stop_at 5 "${args[@]}" --out-dir D --nvme-dir D/nvme --log-json D/log.jsonl --trace D/trace.json
rc=$?
[ $rc = 130 ] && grep -q "stopped by SIGINT after step 5 of 12; continue with: memwall train --resume D/nvme" stop.out \
  && ok || { bad "the SIGINT stop exited $rc"; cat stop.out; }
cp -a D R
mv D M
snap() { (cd "$1" && find . -type f -exec md5sum {} + | sort -k2); }
before=$(snap M)
"$cli" train --resume R/nvme >r.out 2>&1 || { bad "--resume R/nvme (a copy) failed"; tail -3 r.out; }
[ "$(snap M)" = "$before" ] && ok || bad "resuming the copy touched the original"
cmp -s ref/model.safetensors R/model.safetensors && ok || bad "the copy's final model differs"
[ "$(steps_losses R/log.jsonl)" = "$(steps_losses ref/log.jsonl)" ] && ok || bad "the copy's log differs: $(steps_losses R/log.jsonl | head -3)"
grep -qx 'log: R/log.jsonl' r.out && ok || bad "the copy's log is not in R: $(grep '^log' r.out)"
# the trace continued: the stopped segment's 5 steps and the resumed run's 7 in one file
"$cli" report R/trace.json --text >rep.out 2>&1 && grep -q ", 12 steps (median" rep.out && grep -q '"continued_segments":"1"' R/trace.json \
  && ok || { bad "the copy's trace does not hold the whole run"; head -3 rep.out; }
"$cli" train --resume M/nvme >m.out 2>&1 || { bad "--resume M/nvme (moved) failed"; tail -3 m.out; }
cmp -s ref/model.safetensors M/model.safetensors && ok || bad "the moved run's final model differs"
[ "$(steps_losses M/log.jsonl)" = "$(steps_losses ref/log.jsonl)" ] && ok || bad "the moved run's log differs"
"$cli" train --resume M/nvme >f.out 2>&1
rc=$?
[ $rc = 0 ] && grep -q "^the run in M/nvme finished; nothing to resume" f.out && grep -q "finished all 12 steps" f.out \
  && ok || { bad "resuming a finished run: rc $rc"; cat f.out; }
[ "$(ls -A M/nvme)" = memwall-run.done ] && ok || bad "the finished run left $(ls -A M/nvme)"

# 2. every step committed: stopped after the last but one step, then the resume with --steps 11
stop_at 11 "${args[@]}" --out-dir E --nvme-dir E/nvme --log-json E/log.jsonl
"$cli" train --resume E/nvme --steps 11 >e.out 2>&1 || { bad "the resume of a run with all steps committed failed"; cat e.out; }
grep -q "^  --steps 11 (the run had 12)" e.out && grep -q "all 11 steps of the run were committed before it stopped: finishing its outputs" e.out \
  && [ -f E/model.safetensors ] && ! grep -q '^step ' e.out && ok || { bad "finishing a committed run"; cat e.out; }

# 3. flags with --resume
stop_at 4 "${args[@]}" --out-dir F --nvme-dir F/nvme --log-json F/log.jsonl
for bad_flag in "--seed 9:--seed 9 differs from the run's 1337" "--optimizer-tier dram:--optimizer-tier dram differs from the run's nvme" \
                "--batch 2:--batch 2 differs from the run's 4" "--steps 2:--steps 2: the run has already committed 4 steps"; do
  flag=${bad_flag%%:*} msg=${bad_flag#*:}
  # shellcheck disable=SC2086
  "$cli" train --resume F/nvme $flag >x.out 2>&1
  rc=$?
  [ $rc = 2 ] && grep -qF -- "$msg" x.out && ! grep -q '^step ' x.out && ok || { bad "resume with $flag: rc $rc"; cat x.out; }
done
"$cli" train --resume F/nvme --threads 1 --lr 0.0005 --print-every 3 >o.out 2>&1 || { bad "resume with overrides failed"; tail -3 o.out; }
grep -q "^  --threads 1 (the run had 2)" o.out && grep -q "^  --lr 0.0005 overrides the run's 0.001" o.out \
  && ok || { bad "overrides are not listed and announced"; head -8 o.out; }
grep -q 'lr 5.0' o.out && ok || bad "the --lr override was not applied"

# 4. a checkpoint resumed alone: its run's out-dir, log and settings
dargs=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --val-every 0 --steps 8)
"$cli" train "${dargs[@]}" --out-dir dref --log-json dref/log.jsonl >dref.out 2>&1 || bad "the DRAM reference run failed"
stop_at 3 "${dargs[@]}" --out-dir G --log-json G/log.jsonl
[ -f G/ckpt_00000003.mwck ] && grep -q "continue with: memwall train --resume G/ckpt_00000003.mwck" stop.out && ok \
  || { bad "a stopped DRAM run wrote no checkpoint"; cat stop.out; }
"$cli" train --resume G/ckpt_00000003.mwck >g.out 2>&1 || { bad "--resume CKPT alone failed"; tail -3 g.out; }
cmp -s dref/model.safetensors G/model.safetensors && ok || bad "the checkpoint's run did not finish bitwise into its out-dir"
[ "$(steps_losses G/log.jsonl)" = "$(steps_losses dref/log.jsonl)" ] && ok || bad "the checkpoint's run log differs"

# 5. outputs checked before the first step
refused() { # NAME PATTERN ARGS...: exit 1, the pattern, no step run
  local name=$1 pat=$2
  shift 2
  "$cli" train "$@" >y.out 2>&1
  local rc=$?
  [ $rc = 1 ] && grep -q -- "$pat" y.out && ! grep -q '^step ' y.out && ok || { bad "$name: rc $rc"; cat y.out; }
}
MEMWALL_TEST_STOP_AT=1 "$cli" train "${dargs[@]}" --out-dir H >h.out 2>&1 &
hpid=$!
for _ in $(seq 600); do case "$(ps -o stat= -p $hpid)" in T*) break ;; esac; sleep 0.05; done
refused "a second run on a live run's out-dir" "is the out-dir of another run that is still going" "${dargs[@]}" --out-dir H
kill -KILL $hpid; wait $hpid 2>/dev/null
refused "trace and log on one file" "are the same file" "${dargs[@]}" --log-json same.json --trace same.json
cp "$src/data/kjv_excerpt.txt" corpus.txt
refused "the log on the data" "are the same file" "${dargs[@]}" --data corpus.txt --log-json corpus.txt
cmp -s corpus.txt "$src/data/kjv_excerpt.txt" && ok || bad "the data was overwritten"
refused "a trace in a missing directory" "the trace (trace_path) nodir/t.json cannot be written" "${dargs[@]}" --trace nodir/t.json
refused "a batch beyond memory" "available (MemAvailable): lower the micro-batch (batch)" --preset gpt2-124m --batch 100000 --steps 1 \
  --data "$src/data/kjv_excerpt.txt" --vocab 257
mkdir -p J && : >J/model.safetensors.tmp.999999999.0 && : >J/keep.tmp.x
"$cli" train "${dargs[@]}" --steps 1 --out-dir J >j.out 2>&1 || bad "a run on an out-dir with debris failed"
[ ! -e J/model.safetensors.tmp.999999999.0 ] && [ -e J/keep.tmp.x ] && ok || bad "temporaries of dead runs: $(ls -A J)"

cd / && rm -rf "$dir"
echo "cli_train_resume: $pass passed, $fail failed"
[ $fail = 0 ]
