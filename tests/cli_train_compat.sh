#!/usr/bin/env bash
# Runs written before memwall kept the run's settings still resume, bitwise: a version-1
# checkpoint and a version-1 commit record (tests/fixtures/v1_run, written by memwall at 9811b24),
# the record's directory moved (the record names it as typed then), are continued by today's
# memwall and end with bitwise the model of an uninterrupted run of today's memwall.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_compat-$$
rm -rf "$dir" && mkdir -p "$dir"
cd "$dir" || exit 1
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
data="$src/data/kjv_excerpt.txt"
A=(--layers 1 --heads 1 --width 8 --context 16 --vocab 257 --batch 2 --seq 8 --steps 4 --warmup 1 --val-every 0
   --sample-len 0 --threads 1 --data "$data")
"$cli" train "${A[@]}" --out-dir ref --log-json ref.jsonl >ref.out 2>&1 || { bad "the uninterrupted run failed"; cat ref.out; }
exact=1
grep -q '^MEMWALL_SANITIZE:BOOL=ON' "${MW_BUILD_DIR:-.}/CMakeCache.txt" 2>/dev/null && exact=0
# same_run OUTDIR LOG: the resumed run ended as the reference did
same_run() {
  if [ $exact = 1 ]; then cmp -s ref/model.safetensors "$1/model.safetensors"; return; fi
  python3 - ref.jsonl "$2" <<'PY'
import json, sys
ref = {l["step"]: l["loss"] for l in map(json.loads, open(sys.argv[1])) if "loss" in l}
got = {l["step"]: l["loss"] for l in map(json.loads, open(sys.argv[2])) if "loss" in l}
sys.exit(0 if got and all(abs(ref[k] - v) <= 1e-4 for k, v in got.items()) else 1)
PY
}
tar xzf "$src/tests/fixtures/v1_run/v1_run.tar.gz" || bad "cannot unpack the fixture"
[ "$(od -An -tu4 -j8 -N4 ck/ckpt_00000002.mwck | tr -d ' ')" = 1 ] && ok || bad "the fixture's checkpoint is not version 1"
grep -q MWRESUM1 nv/memwall-offload.commit && ok || bad "the fixture's record is not version 1"
"$cli" train --resume ck/ckpt_00000002.mwck --data "$data" --out-dir o1 --log-json o1.jsonl >o1.out 2>&1 \
  || { bad "resuming the v1 checkpoint failed"; tail -3 o1.out; }
same_run o1 o1.jsonl && ok || bad "the v1 checkpoint did not resume as the uninterrupted run (exact: $exact)"
mv nv moved
"$cli" train --resume moved --data "$data" --out-dir o2 --log-json o2.jsonl >o2.out 2>&1 || { bad "resuming the v1 record failed"; tail -3 o2.out; }
grep -q "resuming the run in moved from its last committed step" o2.out && ok || bad "the v1 record's resume does not say so"
same_run o2 o2.jsonl && ok || bad "the v1 record did not resume as the uninterrupted run (exact: $exact)"
[ "$(ls -A moved)" = memwall-run.done ] && ok || bad "the finished v1 run left $(ls -A moved)"
cd / && rm -rf "$dir"
echo "cli_train_compat: $pass passed, $fail failed"
[ $fail = 0 ]
