#!/usr/bin/env bash
# memwall train with the optimizer state on the NVMe tier (the offload engine): a fixed-seed
# tiny run gives bitwise the losses of the DRAM run (grad-accum 1 and 2, several subgroups);
# resuming an NVMe run from a checkpoint continues bitwise; a too-small --nvme-budget or
# --dram-budget is refused up front (exit 1, with the numbers); a traced NVMe run writes a
# trace that 'memwall report --text' reads with nonzero NVMe read and write bytes.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
. "$src/tests/lib_ckpt.sh"
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_offload-$$
rm -rf "$dir" && mkdir -p "$dir"
data="$src/data/kjv_excerpt.txt"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
losses() { grep -o '"step":[0-9]*,"loss":[^,]*\(,"val_loss":[^,]*\)\?\(,"lr":[^,]*,"grad_norm":[^,]*\)\?' "$1"; }
# 35968 parameters in subgroups of 10000: four subgroups, cut inside tensors.
common=(--preset tiny --data "$data" --threads 2 --sample-len 0 --subgroup-size 10000 --buffer-count 3)
nv=(--optimizer-tier nvme --nvme-dir "$dir/nvme")

# 1. DRAM vs NVMe, grad-accum 1 and 2: bitwise the same losses, norms and validation losses.
for a in 1 2; do
  "$cli" train "${common[@]}" --steps 6 --grad-accum $a --val-every 3 --log-json "$dir/d$a.jsonl" >"$dir/d$a.out" 2>&1 \
    || { bad "dram run (accum $a) failed"; cat "$dir/d$a.out"; }
  "$cli" train "${common[@]}" "${nv[@]}" --steps 6 --grad-accum $a --val-every 3 --log-json "$dir/n$a.jsonl" >"$dir/n$a.out" 2>&1 \
    || { bad "nvme run (accum $a) failed"; cat "$dir/n$a.out"; }
  [ "$(losses "$dir/d$a.jsonl" | grep -c loss)" = 6 ] && ok || bad "dram run (accum $a) logged no 6 steps"
  [ "$(losses "$dir/d$a.jsonl")" = "$(losses "$dir/n$a.jsonl")" ] && ok \
    || { bad "nvme losses differ from dram (accum $a)"; diff <(losses "$dir/d$a.jsonl") <(losses "$dir/n$a.jsonl"); }
done
# Pre-reads between steps (3 buffers of 4 subgroups): the same losses.
"$cli" train "${common[@]}" "${nv[@]}" --steps 6 --grad-accum 1 --val-every 3 --preread on --log-json "$dir/np.jsonl" \
  >"$dir/np.out" 2>&1 || { bad "nvme run with --preread failed"; cat "$dir/np.out"; }
[ "$(losses "$dir/d1.jsonl")" = "$(losses "$dir/np.jsonl")" ] && ok || bad "--preread losses differ from dram"
grep -q '"nvme_read_bytes":[1-9]' "$dir/n1.jsonl" && grep -q '"nvme_write_bytes":[1-9]' "$dir/n1.jsonl" && ok \
  || bad "nvme run logs no NVMe bytes"
grep -q '"nvme_write_bytes":0,' "$dir/d1.jsonl" && ok || bad "dram run logs NVMe writes"
grep -q 'NVMe optim [0-9.]* [KMG]iB' "$dir/n1.out" && grep -q '| NVMe [0-9.]* [KMG]iB ([0-9.]* [kMG]B/s)' "$dir/n1.out" && ok \
  || { bad "nvme progress line lacks tier bytes or NVMe GB/s"; grep '^step' "$dir/n1.out" | head -2; }

# 2. Resume with the NVMe tier: 6 steps with a checkpoint at 3, against the run resumed at 3.
"$cli" train "${common[@]}" "${nv[@]}" --steps 6 --grad-accum 2 --ckpt-every 3 --out-dir "$dir/full" \
  --log-json "$dir/full.jsonl" >"$dir/full.out" 2>&1 || { bad "nvme checkpointed run failed"; cat "$dir/full.out"; }
"$cli" train --resume "$dir/full/ckpt_00000003.mwck" --sample-len 0 --nvme-dir "$dir/nvme" --subgroup-size 10000 \
  --log-json "$dir/res.jsonl" --out-dir "$dir/res" >"$dir/res.out" 2>&1 || { bad "nvme resume failed"; cat "$dir/res.out"; }
grep -q 'AdamW in nvme' "$dir/res.out" && ok || bad "resume did not keep the checkpoint's nvme tier"
want=$(losses "$dir/full.jsonl" | grep -E '"step":(4|5|6),')
[ -n "$want" ] && [ "$want" = "$(losses "$dir/res.jsonl")" ] && ok \
  || { bad "resumed nvme losses differ"; diff <(echo "$want") <(losses "$dir/res.jsonl"); }
ckpt_state_eq "$dir/full/ckpt_00000006.mwck" "$dir/res/ckpt_00000006.mwck" && ok || bad "final nvme checkpoints differ"
# The checkpoint holds the state in one format: a DRAM run resumes it bitwise too.
"$cli" train --resume "$dir/full/ckpt_00000003.mwck" --sample-len 0 --optimizer-tier dram \
  --log-json "$dir/resd.jsonl" >"$dir/resd.out" 2>&1 || { bad "dram resume of an nvme checkpoint failed"; cat "$dir/resd.out"; }
[ "$want" = "$(losses "$dir/resd.jsonl")" ] && ok || bad "dram resume of an nvme checkpoint differs"

# 3. Budgets too small: refused before training, exit 1, the tier and the numbers named.
"$cli" train "${common[@]}" "${nv[@]}" --steps 2 --nvme-budget 64K >"$dir/b.out" 2>&1
rc=$?
[ $rc = 1 ] && grep -qi 'nvme' "$dir/b.out" && grep -q 'KiB\|MiB' "$dir/b.out" && ! grep -q '^step' "$dir/b.out" && ok \
  || { bad "--nvme-budget 64K: exit $rc, want 1 with the numbers before any step"; cat "$dir/b.out"; }
"$cli" train "${common[@]}" --steps 2 --dram-budget 1M >"$dir/b2.out" 2>&1
rc=$?
[ $rc = 1 ] && grep -qi 'dram\|host' "$dir/b2.out" && ! grep -q '^step' "$dir/b2.out" && ok \
  || { bad "--dram-budget 1M: exit $rc, want 1"; cat "$dir/b2.out"; }

# 4. A traced NVMe run: the trace loads in 'memwall report --text' with NVMe reads and writes.
"$cli" train "${common[@]}" "${nv[@]}" --steps 3 --val-every 3 --trace "$dir/t.json" >"$dir/t.out" 2>&1 \
  || { bad "traced nvme run failed"; cat "$dir/t.out"; }
[ -s "$dir/t.json" ] && ok || bad "no trace written"
grep -q '"cat":"step"' "$dir/t.json" && grep -q '"name":"forward"' "$dir/t.json" && grep -q '"name":"validation"' "$dir/t.json" \
  && ok || bad "trace lacks step or phase spans"
"$cli" report "$dir/t.json" --text >"$dir/r.txt" 2>&1 && ok || { bad "memwall report --text failed"; cat "$dir/r.txt"; }
python3 - "$dir/t.json" <<'PY' && ok || bad "trace has no NVMe read and write bytes"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
rd = sum(e.get("args", {}).get("bytes", 0) for e in ev if e.get("cat") == "io" and e.get("name") == "read")
wr = sum(e.get("args", {}).get("bytes", 0) for e in ev if e.get("cat") == "io" and e.get("name") == "write")
sys.exit(0 if rd > 0 and wr > 0 else 1)
PY
grep -qi 'nvme' "$dir/r.txt" && ok || { bad "report text names no nvme traffic"; cat "$dir/r.txt"; }

rm -rf "$dir"
echo "cli_train_offload: $pass passed, $fail failed"
[ "$fail" = 0 ]
