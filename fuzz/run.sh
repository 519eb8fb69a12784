#!/usr/bin/env bash
# fuzz/run.sh BUILD_DIR SECONDS [HARNESS...] — runs each libFuzzer harness for SECONDS on a work
# copy of its committed corpus (fuzz/corpus/<name> is never written), new inputs kept under
# BUILD_DIR/fuzz-work/<name>, crashes under BUILD_DIR/fuzz-crashes/<name>. Prints per harness
# the runs, CPU seconds, coverage (cov = edges, ft = features) and corpus size; exits 1 if any
# crashed or hung, with
# the files to reproduce (and to commit as fuzz/regressions/<name>/ once fixed).
set -uo pipefail
build=${1:?usage: fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}
secs=${2:?usage: fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}
shift 2
build=$(cd "$build" && pwd) || exit 2
src=$(cd "$(dirname "$0")" && pwd)
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in "$src"/fuzz_*.c; do n=$(basename "$f" .c); names+=("${n#fuzz_}"); done
fi
failed=0
printf '%-12s %9s %7s %6s %7s %7s %s\n' harness runs cpu_s cov ft corpus result
TIMEFORMAT='%U %S' # the fuzzer's CPU time (user, system), read back below
for n in "${names[@]}"; do
  bin="$build/fuzz_$n"
  [ -x "$bin" ] || { echo "fuzz/run.sh: $bin not built (make fuzz builds it)" >&2; exit 2; }
  work="$build/fuzz-work/$n"; crashes="$build/fuzz-crashes/$n"
  mkdir -p "$work" "$crashes"
  log="$build/fuzz-work/$n.log"
  # -rss_limit_mb: a loader that allocates what a header claims must refuse it, not try.
  { time (cd "$crashes" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 "$bin" -max_total_time="$secs" \
     -rss_limit_mb=2048 -max_len=65536 -timeout=20 -print_final_stats=1 "$work" "$src/corpus/$n" \
     > "$log" 2>&1) ; } 2> "$log.time"
  rc=$?
  cpu=$(awk '{ printf "%.0f", $1 + $2 }' "$log.time")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  runs=$(echo "$last" | sed -E 's/^#([0-9]+).*/\1/')
  cov=$(echo "$last" | sed -nE 's/.*cov: ([0-9]+).*/\1/p')
  ft=$(echo "$last" | sed -nE 's/.*ft: ([0-9]+).*/\1/p')
  corp=$(echo "$last" | sed -nE 's/.*corp: ([0-9]+).*/\1/p')
  if [ $rc -ne 0 ]; then
    failed=1
    printf '%-12s %9s %7s %6s %7s %7s %s\n' "$n" "$runs" "$cpu" "$cov" "$ft" "$corp" "CRASH (rc $rc, log $log)"
    ls "$crashes" | sed "s|^|    $crashes/|"
  else
    printf '%-12s %9s %7s %6s %7s %7s %s\n' "$n" "$runs" "$cpu" "$cov" "$ft" "$corp" ok
  fi
done
exit $failed
