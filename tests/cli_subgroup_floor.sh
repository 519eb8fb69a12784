#!/usr/bin/env bash
# A subgroup size whose padding would dwarf the state is refused before anything is written:
# `memwall train --preset tiny --optimizer-tier nvme --subgroup-size 1` (843 MiB of padded objects
# for 843 KiB of state) exits 1 within seconds, naming the setting, the value and the minimum,
# and leaves the NVMe directory empty; --subgroup-size 1024 trains.
set -u
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_subgroup_floor.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
args=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --val-every 0 --steps 1
      --optimizer-tier nvme)

start=$(date +%s)
timeout 60 "$cli" train "${args[@]}" --subgroup-size 1 --nvme-dir "$dir/nv" >"$dir/out" 2>"$dir/err"
rc=$?
took=$(( $(date +%s) - start ))
[ $rc = 1 ] || bad "--subgroup-size 1 exited $rc, want 1: $(cat "$dir/err")"
[ $took -le 10 ] || bad "--subgroup-size 1 took $took s to be refused"
for want in "subgroup size 1 is too small" "padded to 4096-byte blocks" "843.00 MiB on NVMe" "at least 1024 elements"; do
  grep -qF "$want" "$dir/err" || bad "message lacks '$want': $(cat "$dir/err")"
done
left=$(find "$dir/nv" -type f 2>/dev/null | wc -l)
[ "$left" = 0 ] || bad "the refused run left $left file(s) in the NVMe directory"

timeout 300 "$cli" train "${args[@]}" --subgroup-size 1024 --nvme-dir "$dir/nv" >"$dir/out" 2>"$dir/err" ||
  bad "--subgroup-size 1024 exited $?: $(cat "$dir/err")"
[ $fail = 0 ] && echo "cli_subgroup_floor: passed" || echo "cli_subgroup_floor: failed"
exit $fail
