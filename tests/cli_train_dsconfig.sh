#!/usr/bin/env bash
# memwall train --ds-config: a real DeepSpeed ZeRO-3 + NVMe-offload config file runs a tiny model
# for 2 steps with the file's settings (seen in the JSON log: tokens per step, learning rate,
# clipping, NVMe traffic; and in the printed settings), bitwise the same run as the same settings
# typed as flags; flags given on the command line override the file; broken or unsupported files
# are refused with exit 2 and a message naming the key.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_dsconfig-$$
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
fx="$src/tests/fixtures/ds"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
field() { grep "\"step\":$2," "$1" | grep -o "\"$3\":[^,}]*" | cut -d: -f2; }
losses() { grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$1"; }
common=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --val-every 0 --steps 2)

# 1. The file's settings. Its nvme_path is /local_nvme, as DeepSpeed's docs write it: point it here.
sed "s#/local_nvme#$dir/nvme#" "$fx/zero3_nvme.json" >"$dir/ds.json"
"$cli" train "${common[@]}" --ds-config "$dir/ds.json" --log-json "$dir/f.jsonl" >"$dir/f.out" 2>"$dir/f.err" \
  || { bad "the ZeRO-3 NVMe config did not run"; cat "$dir/f.out" "$dir/f.err"; }
# micro 2 x accumulation 2 x seq 32; lr 0.002 at step 1 of tiny's 2 warm-up steps; clip 1.0 (norm ~2).
[ "$(field "$dir/f.jsonl" 1 tokens)" = 128 ] && ok || bad "tokens per step $(field "$dir/f.jsonl" 1 tokens), want 128"
[ "$(field "$dir/f.jsonl" 1 lr)" = 0.001 ] && ok || bad "lr at step 1 $(field "$dir/f.jsonl" 1 lr), want 0.001"
[ "$(field "$dir/f.jsonl" 1 clipped)" = true ] && ok || bad "gradient_clipping 1.0 did not clip"
[ "$(field "$dir/f.jsonl" 1 nvme_write_bytes)" -gt 0 ] && ok || bad "offload_optimizer nvme wrote nothing to NVMe"
grep -q "AdamW betas 0.9/0.98, eps 1e-06, weight decay 0.01, clip 1$" "$dir/f.out" && ok \
  || { bad "optimizer settings of the file not in effect"; grep AdamW "$dir/f.out"; }
grep -q "on NVMe in $dir/nvme: .*I/O in pieces of 1.00 MiB, 8 in flight, 4 staging buffers" "$dir/f.out" && ok \
  || { bad "NVMe settings of the file not in effect"; grep NVMe "$dir/f.out"; }
grep -q "^ds-config $dir/ds.json: --batch 2 --grad-accum 2 --clip 1 --lr 0.002 .* --zero 3 --optimizer-tier nvme --offload-params nvme" "$dir/f.out" \
  && ok || { bad "the applied settings are not printed"; grep ds-config "$dir/f.out"; }
grep -q "warning: .*zero_optimization.stage3_max_live_parameters: accepted, no effect" "$dir/f.err" && ok \
  || { bad "no warning for a key without effect"; cat "$dir/f.err"; }

# 2. The same settings typed as flags: bitwise the same run.
"$cli" train "${common[@]}" --batch 2 --grad-accum 2 --clip 1 --lr 0.002 --beta1 0.9 --beta2 0.98 --eps 1e-6 \
  --weight-decay 0.01 --zero 3 --optimizer-tier nvme --nvme-dir "$dir/nvme" --buffer-count 4 --subgroup-size 1000000000 \
  --aio-block-size 1048576 --aio-queue-depth 8 --log-json "$dir/t.jsonl" >"$dir/t.out" 2>&1 \
  || { bad "the typed run failed"; cat "$dir/t.out"; }
[ -n "$(losses "$dir/f.jsonl")" ] && [ "$(losses "$dir/f.jsonl")" = "$(losses "$dir/t.jsonl")" ] && ok \
  || { bad "the file's run differs from the typed flags' run"; diff <(losses "$dir/f.jsonl") <(losses "$dir/t.jsonl"); }

# 3. Flags override the file (the file as it is: its /local_nvme replaced by --nvme-dir).
"$cli" train "${common[@]}" --ds-config "$fx/zero3_nvme.json" --nvme-dir "$dir/nv2" --grad-accum 1 --lr 0.004 --clip 0 \
  --log-json "$dir/o.jsonl" >"$dir/o.out" 2>&1 || { bad "the overridden run failed"; cat "$dir/o.out"; }
[ "$(field "$dir/o.jsonl" 1 tokens)" = 64 ] && ok || bad "--grad-accum 1 did not override the file"
[ "$(field "$dir/o.jsonl" 1 lr)" = 0.002 ] && ok || bad "--lr 0.004 did not override the file"
[ "$(field "$dir/o.jsonl" 1 clipped)" = false ] && ok || bad "--clip 0 did not override the file"
grep -q "on NVMe in $dir/nv2" "$dir/o.out" && ok || bad "--nvme-dir did not override nvme_path"
grep -q "overridden by the command line: --grad-accum 2 --clip 1 --lr 0.002 --nvme-dir /local_nvme" "$dir/o.out" && ok \
  || { bad "the overridden settings are not printed"; grep ds-config "$dir/o.out"; }
"$cli" train "${common[@]}" --ds-config "$dir/ds.json" --optimizer-tier dram --offload-params dram --log-json "$dir/d.jsonl" >"$dir/d.out" 2>&1 \
  || { bad "the dram override run failed"; cat "$dir/d.out"; }
[ "$(field "$dir/d.jsonl" 1 nvme_write_bytes)" = 0 ] && ok || bad "--optimizer-tier dram did not override the file"

# 4. Refused: exit 2 with the file and the key named; nothing runs.
expect2() { # expect2 FILE NEEDLE
  "$cli" train "${common[@]}" --ds-config "$1" >"$dir/e.out" 2>&1; local rc=$?
  [ $rc = 2 ] && ok || bad "--ds-config $(basename "$1") exited $rc, want 2"
  grep -q -- "$2" "$dir/e.out" && ok || { bad "--ds-config $(basename "$1"): no '$2' in"; cat "$dir/e.out"; }
  grep -q '^step' "$dir/e.out" && bad "--ds-config $(basename "$1"): trained anyway"
}
expect2 "$fx/fp16.json" "fp16.enabled: true is not supported"
expect2 "$fx/scheduler.json" "scheduler: memwall has its own learning-rate schedule"
expect2 "$fx/bad_json.json" "bad_json.json: not valid JSON"
expect2 "$fx/negative_size.json" "zero_optimization.sub_group_size: -1e+09 is out of range"
expect2 "$fx/lamb.json" 'optimizer.type: "Lamb"'
expect2 "$dir/missing.json" "cannot open the DeepSpeed config"
"$cli" train --help >"$dir/h.out" 2>&1 && grep -q -- "--ds-config FILE" "$dir/h.out" && ok || bad "--help lacks --ds-config"

echo "cli_train_dsconfig: $pass passed, $fail failed"
[ $fail = 0 ]
