#!/usr/bin/env bash
# A real full disk (docs/train.md, "Faults"), on a small tmpfs mounted for the test (needs root
# with CAP_SYS_ADMIN: skipped, exit 77, where the mount is refused):
#  0. the disk of --out-dir is too full at start for the final model and two checkpoints:
#     refused before the first step (exit 1, the numbers and the option named, nothing written).
#  1. the disk of --out-dir fills up in the middle of a run (another program takes the space the
#     start-up check saw free: the run is stopped after step 1 by MEMWALL_TEST_STOP_AT while the
#     test fills the disk): the checkpoint of step 1 fits, the one of step 2 does not. Exit 1; the message says the disk is full, which directory and how
#     much is free; no temporary file is left; the step-1 checkpoint is intact and named; once
#     space is freed, --resume from it gives bitwise the losses and final checkpoint of a run
#     on a disk with room.
#  2. the disk of --nvme-dir is full at start: refused before any step, by the plan (the state
#     does not fit) or by the store's up-front reservation (file, directory and what is free).
# The NVMe store cannot run out of space mid-run (its files are reserved with fallocate at
# start); a write error there in mid-run is tests/cli_train_faults.sh (MEMWALL_FAULT).
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
unset MEMWALL_FAULT
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_disk_full-$$
rm -rf "$dir" && mkdir -p "$dir/mnt"
mnt="$dir/mnt"
if ! mount -t tmpfs -o size=8m,mode=0700 memwall-test "$mnt" 2>"$dir/mount.err"; then
  echo "SKIP: cannot mount a tmpfs here ($(cat "$dir/mount.err")): a real full disk needs root with CAP_SYS_ADMIN"
  rm -rf "$dir"
  exit 77
fi
trap 'umount "$mnt" 2>/dev/null; rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
losses() { grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$1"; }
args=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 2 --sample-len 0 --subgroup-size 10000
      --optimizer-tier nvme --steps 4)
# Leaves `room` bytes free on the tmpfs (whole pages), the rest taken by one file.
fill_to() {
  rm -f "$mnt/filler"
  local avail; avail=$(df -B1 --output=avail "$mnt" | tail -1)
  fallocate -l $((avail - $1)) "$mnt/filler" || { bad "cannot fill $mnt"; return 1; }
}

# The run on a disk with room: losses and checkpoints to compare with.
"$cli" train "${args[@]}" --ckpt-every 1 --nvme-dir "$dir/ref/nvme" --out-dir "$dir/ref" --log-json "$dir/ref.jsonl" \
  >"$dir/ref.out" 2>&1 || { bad "the run with room failed"; cat "$dir/ref.out"; exit 1; }
csize=$(stat -c %s "$dir/ref/ckpt_00000001.mwck")
pages=$(( (csize + 4095) / 4096 ))

# 0. Room for one and a half checkpoints at start: refused up front.
fill_to $(( pages * 4096 * 3 / 2 / 4096 * 4096 )) || exit 1
run="$mnt/run"
"$cli" train "${args[@]}" --ckpt-every 1 --nvme-dir "$dir/nvme0" --out-dir "$run" --log-json "$dir/full0.jsonl" >"$dir/full0.out" 2>&1
rc=$?
echo "full at start (out-dir): $(grep -m1 '^memwall: checking the outputs failed' "$dir/full0.out")"
[ $rc = 1 ] && ok || bad "a run whose out-dir is too full at start exited $rc, want 1"
grep -qE "^memwall: checking the outputs failed: the out-dir \(out_dir\) $run has [0-9.]+ [KMG]?i?B free; the run needs [0-9.]+ [KMG]?i?B there \(the final model [0-9.]+ [KMG]?i?B, two checkpoints of [0-9.]+ [KMG]?i?B\): free space or choose another out-dir$" \
  "$dir/full0.out" && ok || { bad "the up-front refusal lacks the numbers"; tail -3 "$dir/full0.out"; }
grep -q '^step ' "$dir/full0.out" && bad "a step ran on a disk without room for the outputs" || ok
[ -z "$(ls -A "$run")" ] && [ ! -e "$dir/full0.jsonl" ] && ok || bad "the refused run wrote files: $(ls -A "$run")"
rm -rf "$run" "$dir/nvme0"

# 1. Room at start; after step 1 (and its checkpoint) only one and a half checkpoints' room.
rm -f "$mnt/filler"
MEMWALL_TEST_STOP_AT=1 "$cli" train "${args[@]}" --ckpt-every 1 --nvme-dir "$dir/nvme" --out-dir "$run" \
  --log-json "$dir/full.jsonl" >"$dir/full.out" 2>&1 &
pid=$!
for _ in $(seq 600); do case "$(ps -o stat= -p $pid)" in T*) break ;; esac; sleep 0.05; done
[ -f "$run/ckpt_00000001.mwck" ] && ok || bad "the run did not stop after its step-1 checkpoint"
fill_to $(( pages * 4096 / 2 / 4096 * 4096 )) || { kill -CONT $pid; exit 1; }
kill -CONT $pid
wait $pid
rc=$?
msg=$(grep -m1 '^memwall: writing the checkpoint failed: ' "$dir/full.out")
echo "disk full: $msg"
echo "$(grep -m1 '^memwall: the last checkpoint' "$dir/full.out")"
[ $rc = 1 ] && ok || bad "a run whose disk filled up exited $rc, want 1"
echo "$msg" | grep -qE "^memwall: writing the checkpoint failed: writing (checkpoint )?$run/ckpt_00000002\.mwck\.tmp\.[0-9.]+ failed: No space left on device — the disk holding $run is full \([0-9.]+ [KMG]?i?B available there\)$" \
  && ok || { bad "the disk-full message lacks the directory or the free space"; tail -3 "$dir/full.out"; }
grep -qxF "memwall: the last checkpoint, $run/ckpt_00000001.mwck (step 1), is intact: continue with --resume $run/ckpt_00000001.mwck" \
  "$dir/full.out" && ok || bad "no line naming the intact step-1 checkpoint"
[ "$(ls -A "$run")" = "ckpt_00000001.mwck" ] && ok || bad "the failed checkpoint left files: $(ls -A "$run")"
. "$src/tests/lib_ckpt.sh"
ckpt_state_eq "$dir/ref/ckpt_00000001.mwck" "$run/ckpt_00000001.mwck" && ok || bad "the step-1 checkpoint is not the one a run with room wrote"
# Space freed: the NVMe state of the failed run (kept: its last committed step is 2) continues
# with --resume DIR, and the step-1 checkpoint resumes too (into a fresh NVMe directory: the
# failed run's files belong to its own resume).
rm -f "$mnt/filler"
[ -f "$dir/nvme/memwall-offload.commit" ] && ok || bad "the failed run did not keep its NVMe state for --resume DIR"
"$cli" train --resume "$dir/nvme" --sample-len 0 --out-dir "$dir/resdir" --log-json "$dir/resdir.jsonl" \
  >"$dir/resdir.out" 2>&1 || { bad "--resume DIR after freeing space failed"; tail -3 "$dir/resdir.out"; }
want=$(losses "$dir/ref.jsonl" | grep -E '"step":(3|4),')
[ -n "$want" ] && [ "$want" = "$(losses "$dir/resdir.jsonl")" ] && ok \
  || { bad "the losses resumed from the NVMe state differ"; diff <(echo "$want") <(losses "$dir/resdir.jsonl"); }
"$cli" train --resume "$run/ckpt_00000001.mwck" --sample-len 0 --nvme-dir "$dir/nvme2" --out-dir "$run" \
  --log-json "$dir/res.jsonl" >"$dir/res.out" 2>&1 || { bad "the resume after freeing space failed"; tail -3 "$dir/res.out"; }
want=$(losses "$dir/ref.jsonl" | grep -vE '"step":1,')
[ -n "$want" ] && [ "$want" = "$(losses "$dir/res.jsonl")" ] && ok \
  || { bad "the resumed losses differ"; diff <(echo "$want") <(losses "$dir/res.jsonl"); }
ckpt_state_eq "$dir/ref/ckpt_00000004.mwck" "$run/ckpt_00000004.mwck" && ok || bad "the final checkpoint differs"

# 2. The disk of --nvme-dir full at start: refused before any step. With 64 KiB free the plan
# refuses (the state does not fit); with 900 KiB it fits the state (864 KiB) but not the
# store's reservation (the state and one stripe of slack), which fallocate refuses.
rm -rf "$run"
fill_to 65536 || exit 1
"$cli" train "${args[@]}" --nvme-dir "$mnt/nvme" >"$dir/start.out" 2>&1
rc=$?
msg=$(grep -m1 '^memwall: ' "$dir/start.out")
echo "full at start (plan): $msg"
[ $rc = 1 ] && ! grep -q '^step' "$dir/start.out" \
  && echo "$msg" | grep -qE "offload plan refused: the nvme tier needs [0-9.]+ KiB but only 64\.00 KiB is available \(free space in the NVMe directory\)" \
  && ok || { bad "nvme dir full at start: exit $rc, want 1 with the sizes"; cat "$dir/start.out"; }
fill_to $((900 * 1024)) || exit 1
"$cli" train "${args[@]}" --nvme-dir "$mnt/nvme" >"$dir/start2.out" 2>&1
rc=$?
msg=$(grep -m1 '^memwall: ' "$dir/start2.out")
echo "full at start (store): $msg"
[ $rc = 1 ] && ! grep -q '^step' "$dir/start2.out" \
  && echo "$msg" | grep -qE "store: cannot reserve [0-9.]+ [KMG]iB in $mnt/nvme/memwall-offload\.0\.dat: No space left on device — the disk holding $mnt/nvme is full \([0-9.]+ [KMG]?i?B available there\)" \
  && ok || { bad "nvme dir without room for the store: exit $rc, want 1 with the file, the directory and the free space"; cat "$dir/start2.out"; }

echo "cli_disk_full: $pass passed, $fail failed"
[ $fail = 0 ]
