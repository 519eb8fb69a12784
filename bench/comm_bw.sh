#!/usr/bin/env bash
# Bandwidth of memwall's collectives over 2 ranks on this machine (shared memory), against
# plain blocking MPI calls. Usage: bench/comm_bw.sh [BUILD_DIR] [-- extra memwall_comm_bw args]
#   bench/comm_bw.sh build                      # 256 MiB, one bucket, median of 5
#   bench/comm_bw.sh build -- --buckets 16      # 16 buckets of 16 MiB in flight together
set -euo pipefail
build=${1:-build}
shift || true
[ "${1:-}" = "--" ] && shift
tool="$build/memwall_comm_bw"
[ -x "$tool" ] || { echo "comm_bw.sh: $tool missing (build with MPI: apt install libopenmpi-dev)" >&2; exit 1; }
ranks=${RANKS:-2}
exec mpirun --allow-run-as-root --oversubscribe -np "$ranks" --bind-to none "$tool" "$@"
