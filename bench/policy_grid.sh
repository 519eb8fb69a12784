#!/usr/bin/env bash
# bench/policy_grid.sh — `--offload-policy auto` against the fixed policies on a grid of emulated
# devices (issue 26): the device 0.25x..8x the CPU's update speed, its link 1..64 GB/s, the optimizer
# state in DRAM and on NVMe. Each cell runs `memwall bench offload` with every policy side by side
# (auto, all-cpu, all-device, every-2, every-4) and prints auto's update phase, the best fixed
# policy's, and their ratio; auto is meant to be within 3 % of the best fixed policy in every cell.
#
# Usage: bench/policy_grid.sh [path/to/memwall]
# Settings (environment): PARAMS (33554432), SUBGROUP (2097152: 16 subgroups; steps of tens of ms,
# well above a shared machine's jitter), STEPS (15 timed steps, medians reported: auto's first
# steps try plans and learn), ROUNDS (2: each policy runs this many times per cell, interleaved,
# and its best median counts, so a burst of load from another tenant does not decide a cell),
# SPEEDS ("0.25 1 2 8", x the CPU), LINKS ("1 8 64", GB/s = 10^9 bytes/s), TIERS ("dram nvme"),
# NVME_DIR (a private directory under $TMPDIR by default), OUT (policy_grid.txt, the table).
#
# How the grid is made: the CPU's update rate and the disk's bandwidths come from one calibration
# (`memwall bench offload --calibrate`), the profile every run's cost model starts from; each cell
# then sets the emulated device (MEMWALL_EMU=rate=...,link=...,work=none: its copies and kernels take
# the modelled time and use no host core, as a real accelerator would not; its results are not
# computed, which this benchmark does not look at) and writes the same figures into the profile.
# The cost model corrects whatever the profile gets wrong from the runs' own measurements.
# The "noise" column is the best fixed policy's slowest round over its fastest: on a shared machine
# it says whether a 3 % difference can be resolved in that cell at all.
set -euo pipefail
cli=$(realpath "${1:-build/memwall}")
PARAMS=${PARAMS:-33554432}
SUBGROUP=${SUBGROUP:-2097152}
STEPS=${STEPS:-15}
ROUNDS=${ROUNDS:-2}
SPEEDS=${SPEEDS:-"0.25 1 2 8"}
LINKS=${LINKS:-"1 8 64"}
TIERS=${TIERS:-"dram nvme"}
OUT=${OUT:-policy_grid.txt}
FIXED="all-cpu all-device every-2 every-4"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

work=$(mktemp -d "${TMPDIR:-/tmp}/memwall-policy-grid.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$cli" "$work/memwall" # a rebuild during the grid must not change (or remove) the binary it runs
cli=$work/memwall
nvme_dir=${NVME_DIR:-$work/nvme}
mkdir -p "$nvme_dir"

echo "calibrating (CPU update rate, NVMe bandwidth): $PARAMS parameters" >&2
"$cli" bench offload --params "$PARAMS" --subgroup-size "$SUBGROUP" --tier nvme --nvme-dir "$nvme_dir" --steps 3 \
  --calibrate "$work/base.json" --json >/dev/null
cpu_rate=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['cpu_params_per_s'])" "$work/base.json")

# One cell's profile: the calibration with the emulated device's rate and link.
cell_profile() { # speed link_gbps file
  python3 - "$work/base.json" "$1" "$2" "$3" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
p["dev_params_per_s"] = float(sys.argv[2]) * p["cpu_params_per_s"]
p["link_bytes_per_s"] = float(sys.argv[3]) * 1e9
p["dev_latency_s"] = 0
json.dump(p, open(sys.argv[4], "w"), indent=1)
EOF
}

# One run: its median update phase (s) and, for auto, the device subgroups of its last plan.
run() { # tier policy profile emu
  local out
  out=$(MEMWALL_EMU=$4 "$cli" bench offload --params "$PARAMS" --subgroup-size "$SUBGROUP" --tier "$1" \
        --nvme-dir "$nvme_dir" --device --policy "$2" --profile "$3" --steps "$STEPS" --no-kernel --json)
  echo "$out" | python3 -c "import json,sys; j=json.load(sys.stdin); print(j['update_s'], j['plan_device_subgroups'])"
}

{
printf "policy grid: %s parameters in subgroups of %s, %s timed steps (medians), best of %s rounds; CPU %.3g parameters/s (calibrated)\n" \
  "$PARAMS" "$SUBGROUP" "$STEPS" "$ROUNDS" "$cpu_rate"
printf "%-5s %7s %9s | %10s %12s %-11s %7s %7s | %s\n" tier device "link GB/s" "auto (ms)" "best fixed" "(policy)" ratio \
  noise "auto's plan: device subgroups; fixed policies (ms)"
} | tee "$OUT"
worst=0
for tier in $TIERS; do
  for speed in $SPEEDS; do
    for link in $LINKS; do
      prof="$work/cell.json"
      cell_profile "$speed" "$link" "$prof"
      emu="rate=$(python3 -c "print($speed * $cpu_rate)"),link=$(python3 -c "print($link * 1e9)"),work=none"
      declare -A best=() worst_run=()
      plan=-
      for round in $(seq "$ROUNDS"); do
        for pol in auto $FIXED; do
          read -r t d < <(run "$tier" "$pol" "$prof" "$emu")
          if [ -z "${best[$pol]:-}" ] || python3 -c "import sys; sys.exit(0 if $t < ${best[$pol]} else 1)"; then
            best[$pol]=$t
          fi
          if [ -z "${worst_run[$pol]:-}" ] || python3 -c "import sys; sys.exit(0 if $t > ${worst_run[$pol]} else 1)"; then
            worst_run[$pol]=$t
          fi
          [ "$pol" = auto ] && plan=$d
        done
      done
      fixed_line=""
      bf=""; bp=""
      for pol in $FIXED; do
        fixed_line+=" $pol $(python3 -c "print('%.1f' % (${best[$pol]} * 1e3))")"
        if [ -z "$bf" ] || python3 -c "import sys; sys.exit(0 if ${best[$pol]} < $bf else 1)"; then bf=${best[$pol]}; bp=$pol; fi
      done
      ratio=$(python3 -c "print('%.3f' % (${best[auto]} / $bf))")
      # the machine's noise in this cell: the best fixed policy's slowest round over its fastest
      noise=$(python3 -c "print('%+.1f%%' % (100 * (${worst_run[$bp]} / $bf - 1)))")
      worst=$(python3 -c "print(max($worst, $ratio))")
      printf "%-5s %6sx %9s | %10.1f %12.1f %-11s %7s %7s | %s;%s\n" "$tier" "$speed" "$link" \
        "$(python3 -c "print(${best[auto]} * 1e3)")" "$(python3 -c "print($bf * 1e3)")" "($bp)" "$ratio" "$noise" "$plan" \
        "$fixed_line" | tee -a "$OUT"
      unset best worst_run
    done
  done
done
echo "worst ratio auto / best fixed: $worst (target: <= 1.03)" | tee -a "$OUT"
python3 -c "import sys; sys.exit(0 if $worst <= 1.03 else 1)"
