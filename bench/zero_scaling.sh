#!/usr/bin/env bash
# Step time and bytes communicated of `memwall train` on 1 rank and on N ranks for ZeRO 0-3,
# side by side in one run, same global batch (N ranks x threads/N each: the same cores).
# Usage: bench/zero_scaling.sh [BUILD_DIR] [-- extra train options]
#   e.g. bench/zero_scaling.sh build -- --preset demo --steps 12 --batch 8
# Prints per configuration: the median step time (steps 3.., warm), tokens/s, and the bytes
# each rank sent per step (mean over ranks) in units of Psi = 4 bytes x parameters.
set -euo pipefail
B=${1:-build}; shift || true
[ "${1:-}" = "--" ] && shift
N=${MW_RANKS:-2}
THREADS=${MW_THREADS:-$(nproc)}
M="$B/memwall"
out=$(mktemp -d)
EXTRA=("$@")
[ ${#EXTRA[@]} -eq 0 ] && EXTRA=(--preset demo --steps 12 --batch 8)
COMMON=("${EXTRA[@]}" --val-every 0 --sample-len 0)
MPI=(mpirun --allow-run-as-root --oversubscribe -x OMPI_MCA_btl_vader_single_copy_mechanism=none -np "$N")
summ() { # log, name, params
  python3 - "$1" "$2" "$3" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
warm = rows[2:] if len(rows) > 3 else rows
ms = statistics.median(r["ms"] for r in warm)
tps = statistics.median(r["tokens_per_s"] for r in warm)
psi = 4 * int(sys.argv[3])
sent = rows[-1].get("comm_sent_mean_bytes", 0)
wait = statistics.median(r.get("comm_wait_s", 0) for r in warm) * 1e3
print(f"{sys.argv[2]:<22} {ms:10.1f} {tps:10.0f} {sent / 1e6:12.2f} {sent / psi:8.3f} {wait:12.1f}   final loss {rows[-1]['loss']:.5f}")
PY
}
"$M" train "${COMMON[@]}" --threads "$THREADS" --log-json "$out/one.json" > "$out/one.out"
params=$(sed -n 's/.*(\([0-9]*\) params.*/\1/p' "$out/one.out" | head -1)
echo "model: $params params (Psi = $((4 * params)) bytes); $N ranks x $((THREADS / N)) threads vs 1 rank x $THREADS threads"
printf '%-22s %10s %10s %12s %8s %12s\n' config "step ms" "tok/s" "sent MB/rank" "in Psi" "comm wait ms"
summ "$out/one.json" "1 rank" "$params"
for z in 0 1 2 3; do
  "${MPI[@]}" "$M" train "${COMMON[@]}" --threads $((THREADS / N > 0 ? THREADS / N : 1)) --zero $z \
      --nvme-dir "$out/nvme.%r" --log-json "$out/z$z.json" > "$out/z$z.out" 2>&1 || { cat "$out/z$z.out"; exit 1; }
  summ "$out/z$z.json" "$N ranks ZeRO-$z" "$params"
done
rm -rf "$out"
