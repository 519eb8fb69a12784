#!/usr/bin/env bash
# memwall report over several ranks' traces: %r expands to every rank's file and gives rank 0's
# report plus the Ranks table (text, HTML, ranks.csv) and the communication section; explicit
# paths work in any order; a trace of another run (world_size differs) is a usage error (exit 2)
# naming the file; %r with no rank 0 file exits 1 naming the pattern; a single-rank trace says
# it has no communication.
set -u
cli=${MW_CLI:?}
build=${MW_BUILD_DIR:?}
dir=$build/test-scratch/cli_report_ranks-$$
rm -rf "$dir" && mkdir -p "$dir"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

for r in 0 1; do "$build/test_report" gen 4 "$dir/trace.$r.json" $r 2 || bad "cannot generate rank $r"; done
"$build/test_report" gen 4 "$dir/other.json" 2 3 || bad "cannot generate the other run's trace"
"$build/test_report" gen 4 "$dir/single.json" || bad "cannot generate a single-rank trace"

"$cli" report "$dir/trace.%r.json" -o "$dir/r.html" --csv "$dir/csv" --text >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || { bad "report with %r exited $rc"; cat "$dir/err"; }
grep -q "ranks: 2 traces of world size 2, ZeRO stage 3" "$dir/out" || bad "--text has no ranks table"
grep -Eq "^ +1 .*200.00 MiB" "$dir/out" || bad "rank 1's host peak (200.00 MiB) is not in the table"
grep -q "reduce_scatter 8 calls over 2 ranks" "$dir/out" || bad "--text has no communication section"
grep -q "(rank 0 of 2, ZeRO stage 3)" "$dir/out" || bad "the report is not rank 0's"
[ "$(wc -l < "$dir/csv/ranks.csv")" = 3 ] || bad "ranks.csv does not have 2 ranks"
[ "$(wc -l < "$dir/csv/comm.csv")" = 4 ] || bad "comm.csv does not have reduce_scatter, allgather, all"
grep -q "<h2>Ranks</h2>" "$dir/r.html" || bad "the HTML has no Ranks section"
grep -q "comm allgather" "$dir/r.html" || bad "the HTML timeline has no comm lane"

# Explicit paths, in any order: the same table.
"$cli" report "$dir/trace.1.json" "$dir/trace.0.json" --text >"$dir/out2" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || { bad "report with two paths exited $rc"; cat "$dir/err"; }
grep -q "(rank 0 of 2" "$dir/out2" || bad "two paths in reverse order: not rank 0's report"

# Another run's trace: usage error naming it.
"$cli" report "$dir/trace.0.json" "$dir/trace.1.json" "$dir/other.json" --text >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 2 ] || bad "world_size mismatch exited $rc, want 2"
grep -q "other.json: world_size 3" "$dir/err" || { bad "mismatch: message does not name the file"; cat "$dir/err"; }

# %r without rank 0's file: exit 1, naming the pattern.
"$cli" report "$dir/none.%r.json" --text >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 1 ] || bad "%r with no file exited $rc, want 1"
grep -q "none.%r.json" "$dir/err" || bad "%r with no file: message does not name the pattern"
# %r mixed with other paths: usage error.
"$cli" report "$dir/trace.%r.json" "$dir/single.json" --text >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || bad "%r with other paths exited $rc, want 2"

# A single-rank trace: one line saying there is no communication.
"$cli" report "$dir/single.json" --text >"$dir/out" 2>"$dir/err" || bad "single-rank trace failed"
grep -q "communication: none in this trace" "$dir/out" || bad "single-rank: no 'none' line"
grep -q "^ranks:" "$dir/out" && bad "single trace printed a ranks table"

[ $fail = 0 ] && rm -rf "$dir"
[ $fail = 0 ] && echo "cli_report_ranks: passed" || echo "cli_report_ranks: FAILED"
exit $fail
