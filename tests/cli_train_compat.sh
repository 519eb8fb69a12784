#!/usr/bin/env bash
# Runs written before memwall kept the run's settings still resume, bitwise: a version-1
# checkpoint and a version-1 commit record (tests/fixtures/v1_run, written by memwall at 9811b24),
# the record's directory moved (the record names it as typed then), are continued by today's
# memwall and end with the model of an uninterrupted run of today's memwall (bitwise on a CPU that
# computes the fixture's first steps as its writer's did: same_run).
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
# same_run OUTDIR: the resumed run ended with the reference's model: bitwise when this machine computes
# the fixture's first two steps as the one that wrote it did; else within 1e-5 of it, every weight
# (OpenBLAS picks its GEMM kernels by CPU, and the fixture's steps came from another CPU: on an AMD
# EPYC the models were 3.8e-7 apart; a resume that lost the moments or the step moves them by ~1e-4)
same_run() {
  cmp -s ref/model.safetensors "$1/model.safetensors" && return
  python3 - ref/model.safetensors "$1/model.safetensors" <<'PY'
import array, json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        a = array.array("f")
        a.frombytes(b[8 + n + s:8 + n + e])
        out[k] = a
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
d = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)
print("  (not bitwise: the models are %.2g apart)" % d)
sys.exit(0 if d <= 1e-5 and all(len(a[k]) == len(b[k]) for k in a) else 1)
PY
}
tar xzf "$src/tests/fixtures/v1_run/v1_run.tar.gz" || bad "cannot unpack the fixture"
[ "$(od -An -tu4 -j8 -N4 ck/ckpt_00000002.mwck | tr -d ' ')" = 1 ] && ok || bad "the fixture's checkpoint is not version 1"
grep -q MWRESUM1 nv/memwall-offload.commit && ok || bad "the fixture's record is not version 1"
"$cli" train --resume ck/ckpt_00000002.mwck --data "$data" --out-dir o1 --log-json o1.jsonl >o1.out 2>&1 \
  || { bad "resuming the v1 checkpoint failed"; tail -3 o1.out; }
same_run o1 && ok || bad "the v1 checkpoint did not resume as the uninterrupted run"
mv nv moved
"$cli" train --resume moved --data "$data" --out-dir o2 --log-json o2.jsonl >o2.out 2>&1 || { bad "resuming the v1 record failed"; tail -3 o2.out; }
grep -q "resuming the run in moved from its last committed step" o2.out && ok || bad "the v1 record's resume does not say so"
same_run o2 && ok || bad "the v1 record did not resume as the uninterrupted run"
[ "$(ls -A moved)" = memwall-run.done ] && ok || bad "the finished v1 run left $(ls -A moved)"
cd / && rm -rf "$dir"
echo "cli_train_compat: $pass passed, $fail failed"
[ $fail = 0 ]
