#!/usr/bin/env bash
# A rank that dies mid-run must end the job within bounded time with a clear message, never a
# hang. Rank 1 of mpi_train exits(3) at step 2 while rank 0 waits in a collective:
#  1. default mpirun: Open MPI notices the non-zero exit and kills the job, naming the rank;
#  2. with that turned off (orte_abort_on_non_zero_status 0, as a launcher that does not
#     watch its ranks), rank 0's wait gives up after MW_COMM_TIMEOUT seconds with memwall's
#     message and aborts the job (MPI_Abort).
# Times are bounded relative to the deadline T: case 2 must take at least T (the wait did not
# give up early) and at most case 1's time (start-up, two steps, teardown) + T + 10 s of slack.
set -uo pipefail
: "${MW_MPI_TESTS:?}" "${MW_MPIRUN:?}"
bin="$MW_MPI_TESTS/mpi_train"
fail=0
T=5
elapsed=0
run_case() { # name, min seconds, max seconds, expected text, mpirun options...
  local name=$1 min=$2 max=$3 want=$4; shift 4
  local t0 t1 out rc
  t0=$(date +%s)
  out=$(timeout 120 "$MW_MPIRUN" --allow-run-as-root --oversubscribe "$@" -np 2 "$bin" die 2>&1)
  rc=$?
  t1=$(date +%s)
  echo "== $name: exit $rc after $((t1 - t0)) s"
  echo "$out" | sed 's/^/   | /'
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then echo "FAIL $name: exit status $rc (0 = not noticed, 124 = hang)"; fail=1; fi
  elapsed=$((t1 - t0))
  if [ $elapsed -gt "$max" ]; then echo "FAIL $name: took $elapsed s > $max s"; fail=1; fi
  if [ $elapsed -lt "$min" ]; then echo "FAIL $name: took $elapsed s < $min s"; fail=1; fi
  if ! grep -q -- "$want" <<<"$out"; then echo "FAIL $name: no message matching '$want'"; fail=1; fi
  if grep -q "finished although rank 1 died" <<<"$out"; then echo "FAIL $name: rank 0 went on"; fail=1; fi
}
run_case "mpirun kills the job" 0 60 "Exit code: *3"
base=$elapsed
MW_COMM_TIMEOUT=$T run_case "memwall's wait deadline" $T $((base + T + 10)) \
  "not finished after $T s: another rank probably died" --mca orte_abort_on_non_zero_status 0
exit $fail
