#!/usr/bin/env bash
# Two identical 2-rank runs (ZeRO-3, two micro-steps, deterministic sums) must give bit for
# bit the same losses and final weights.
set -euo pipefail
: "${MW_MPI_TESTS:?}" "${MW_MPIRUN:?}"
dir="$MW_BUILD_DIR/test-scratch/mpi_twice-$$"
mkdir -p "$dir"
for i in 1 2; do
  "$MW_MPIRUN" --allow-run-as-root --oversubscribe -np 2 "$MW_MPI_TESTS/mpi_train" hash "$dir/run$i.txt"
done
cat "$dir/run1.txt"
if ! cmp "$dir/run1.txt" "$dir/run2.txt"; then diff "$dir/run1.txt" "$dir/run2.txt"; exit 1; fi
[ "$(grep -c loss "$dir/run1.txt")" -eq 5 ] || { echo "FAIL: expected 5 steps"; exit 1; }
rm -rf "$dir"
echo "two runs identical"
