#!/usr/bin/env bash
# `memwall bench offload`: small runs with the state in DRAM and on NVMe print JSON with the
# required keys and plausible byte counts; the hybrid schedule, --calibrate and --trace work;
# the NVMe files are removed; the default NVMe directory is private and removed; --policies runs
# every policy side by side (each with its figures, its NVMe subdirectory removed; --control: auto's
# engine and the best's with the same placement, their ratio beside the paired one); usage errors
# exit 2, runtime failures 1.
set -u
cli=${MW_CLI:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_bench_offload.$$
mkdir -p "$dir"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
field() { echo "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }

out=$("$cli" bench offload --params 300000 --subgroup-size 65536 --tier dram --steps 2 --json) || bad "dram run exited $?"
for k in update_s nvme_read_bytes nvme_write_bytes io_wait_s kernel_s; do
  echo "$out" | grep -q "\"$k\"" || bad "dram: '$k' missing in: $out"
done
[ "$(field "$out" nvme_read_bytes)" = 0 ] || bad "dram run read from NVMe: $out"
[ "$(field "$out" subgroups)" = 5 ] || bad "dram: want 5 subgroups: $out"

out=$("$cli" bench offload --params 300000 --subgroup-size 65536 --tier nvme --nvme-dir "$dir/nv" --buffer-count 3 \
      --steps 2 --json) || bad "nvme run exited $?"
# per step: master + 2 moments, fp32, read and written once: 12 B/param, objects padded to 4 KiB
rd=$(field "$out" nvme_read_bytes); wr=$(field "$out" nvme_write_bytes)
[ "$rd" -ge 3600000 ] && [ "$rd" -le 3700000 ] || bad "nvme: read $rd bytes per step, want ~3.6 MB: $out"
[ "$rd" = "$wr" ] || bad "nvme: read $rd != written $wr"
left=$(find "$dir/nv" -type f 2>/dev/null | wc -l)
[ "$left" = 0 ] || bad "bench offload left $left file(s) in the NVMe directory"

out=$("$cli" bench offload --params 300000 --subgroup-size 65536 --tier nvme --nvme-dir "$dir/nv" --device \
      --policy every-2 --steps 1 --calibrate "$dir/profile.json" --trace "$dir/trace.json" --json) || bad "hybrid run exited $?"
[ "$(field "$out" dev_updates)" = 2 ] || bad "every-2 over 5 subgroups: want 2 device updates: $out"
for k in cpu_params_per_s dev_params_per_s link_bytes_per_s; do
  grep -q "\"$k\"" "$dir/profile.json" || bad "profile lacks $k"
done
for k in '"cat":"offload","name":"update"' '"cat":"decision","name":"device"' '"cat":"decision","name":"cpu"' \
         '"cat":"offload","name":"read"' '"cat":"offload","name":"write"' '"from":"host","to":"device"' \
         '"from":"device","to":"host"'; do
  grep -q "$k" "$dir/trace.json" || bad "trace lacks $k events"
done
"$cli" bench offload --params 1000 --tier dram --steps 1 | grep -q "update phase" || bad "text output"

# --policies: one engine per policy, side by side; every policy has a positive median, auto its plan
pols=auto,all-cpu,all-device,every-2,every-4
out=$("$cli" bench offload --params 300000 --subgroup-size 65536 --tier dram --steps 2 --policies $pols --json) ||
  bad "--policies run exited $?"
echo "$out" | python3 -c "
import json, sys
j = json.load(sys.stdin)
p = j['policies']
assert list(p) == '$pols'.split(','), list(p)
for k, v in p.items():
    assert v['update_s'] > 0 and v['steps_run'] == 2 and len(v['update_steps_s']) == 2, (k, v)
assert p['all-cpu']['dev_updates'] == 0 and p['all-device']['cpu_updates'] == 0 and p['every-2']['dev_updates'] == 2
assert 'plan_device_subgroups' in p['auto'] and j['best_fixed'] in p and j['auto_over_best_fixed'] > 0
assert j['auto_over_best_fixed_paired'] > 0
" || bad "--policies JSON: $out"
# --control: auto's engine and the best fixed policy's both with the best's placement, C more rounds
out=$("$cli" bench offload --params 300000 --subgroup-size 65536 --tier dram --steps 2 --control 3 \
      --policies auto,all-cpu,every-2 --json) || bad "--control run exited $?"
echo "$out" | python3 -c "
import json, sys
j = json.load(sys.stdin)
p, b = j['policies'], j['best_fixed']
assert j['control'] == 3 and b in ('all-cpu', 'every-2'), j
assert len(p['auto']['control_steps_s']) == 3 and len(p[b]['control_steps_s']) == 3, p
assert all(t > 0 for t in p['auto']['control_steps_s'] + p[b]['control_steps_s']), p
# the control ran the best's placement on both engines (every-2: 2 of the 5 subgroups on the device)
assert p['auto']['control_dev_updates_steps'] == p[b]['control_dev_updates_steps'] == [p[b]['dev_updates']] * 3, p
r = sorted(x / y for x, y in zip(p['auto']['control_steps_s'], p[b]['control_steps_s']))
# the JSON's step times have 6 decimals (~3 digits at these sizes): the median within 1 %
assert abs(j['engine_offset'] - r[1]) <= 0.01 * r[1] + 1e-4, (j['engine_offset'], r)
c = j['auto_over_best_fixed_paired'] / j['engine_offset']
assert abs(j['auto_over_best_fixed_corrected'] - c) <= 0.01 * c, (j, c)
assert p['auto']['steps_run'] == 2 and 'plan_device_subgroups' in p['auto']
" || bad "--control JSON: $out"
"$cli" bench offload --params 300000 --subgroup-size 65536 --tier dram --steps 1 --control 2 --policies auto,all-cpu |
  grep -q "control (2 rounds, auto's engine with all-cpu's placement)" || bad "--control text output"
"$cli" bench offload --control 2 >/dev/null 2>&1; [ $? = 2 ] || bad "--control without --policies should exit 2"
out=$("$cli" bench offload --params 300000 --subgroup-size 65536 --tier nvme --nvme-dir "$dir/side" --steps 1 \
      --policies auto,every-2) || bad "--policies on nvme exited $?"
echo "$out" | grep -q "auto / best fixed" || bad "--policies text output: $out"
left=$(find "$dir/side" -mindepth 1 2>/dev/null | wc -l)
[ "$left" = 0 ] || bad "--policies left $left file(s) or directories under --nvme-dir: $(find "$dir/side" -mindepth 1)"
"$cli" bench offload --policies auto,sometimes >/dev/null 2>&1; [ $? = 2 ] || bad "a bad policy in --policies should exit 2"
"$cli" bench offload --policies auto,auto >/dev/null 2>&1; [ $? = 2 ] || bad "a repeated policy in --policies should exit 2"
"$cli" bench offload --policies auto --calibrate "$dir/p.json" >/dev/null 2>&1; [ $? = 2 ] ||
  bad "--policies with --calibrate should exit 2"
"$cli" bench offload --policies auto --prune 0.5 >/dev/null 2>&1; [ $? = 2 ] || bad "--prune under 1 should exit 2"

# No --nvme-dir: a fresh private directory under $TMPDIR, removed at the end (never a fixed
# name under a world-writable /tmp).
mkdir -p "$dir/tmp"
TMPDIR="$dir/tmp" "$cli" bench offload --params 100000 --subgroup-size 65536 --tier nvme --steps 1 --no-kernel \
  --json >"$dir/out" 2>&1 || bad "nvme run with the default directory failed: $(cat "$dir/out")"
[ -z "$(ls -A "$dir/tmp")" ] || bad "the default NVMe directory was left behind: $(ls -A "$dir/tmp")"
[ "$(field "$(cat "$dir/out")" nvme_read_bytes)" -gt 0 ] || bad "the default-directory run read nothing from NVMe"
TMPDIR="$dir/missing" "$cli" bench offload --params 1000 --tier nvme --steps 1 >"$dir/out" 2>&1
[ $? = 1 ] && grep -q "private directory" "$dir/out" || bad "an unusable TMPDIR should exit 1 saying so: $(cat "$dir/out")"

"$cli" bench offload --tier tape >/dev/null 2>&1; [ $? = 2 ] || bad "bad --tier should exit 2"
"$cli" bench offload --device --policy sometimes >/dev/null 2>&1; [ $? = 2 ] || bad "bad --policy should exit 2"
"$cli" bench offload --params 1000 --tier nvme --nvme-dir /proc/nonexistent >/dev/null 2>&1; [ $? = 1 ] ||
  bad "unusable --nvme-dir should exit 1"
"$cli" bench offload --params 1000000 --tier nvme --nvme-dir "$dir/nv" --nvme-budget 1M >"$dir/out" 2>&1
[ $? = 1 ] || bad "a too-small --nvme-budget should exit 1"
grep -q "refused" "$dir/out" && grep -q "nvme" "$dir/out" || bad "no refusal message: $(cat "$dir/out")"
rm -rf "$dir"
[ $fail = 0 ] && echo "cli_bench_offload: passed" || echo "cli_bench_offload: failed"
exit $fail
