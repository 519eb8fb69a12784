#!/usr/bin/env bash
# memwall report's roofline and weight residency end to end, on the streaming trace that
# test_report_residency builds (it prints the roofline line the report must print, computed
# from its own events): with the trace's NVMe bandwidths; with --nvme-read-bw/--nvme-write-bw
# on a trace without them; without any (the report says how to give them). Bad bandwidths
# (negative, zero, not a number, NaN, infinite, absurdly large) are usage errors: exit 2 with a
# message naming the option. --help names the unit (GB/s = 10^9 bytes/s).
set -u
cli=${MW_CLI:?}
build=${MW_BUILD_DIR:?}
dir=$build/test-scratch/cli_report_roofline-$$
rm -rf "$dir" && mkdir -p "$dir"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

want=$("$build/test_report_residency" gen "$dir/meta.json") || bad "cannot generate the trace"
"$cli" report "$dir/meta.json" --text --csv "$dir/csv" -o "$dir/r.html" >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || { bad "report exited $rc"; cat "$dir/err"; }
grep -qF "$want" "$dir/out" || { bad "the text lacks '$want'"; grep roofline "$dir/out"; }
grep -q "NVMe read 2.50 GB/s (trace metadata), write 1.50 GB/s (trace metadata)" "$dir/out" || bad "bandwidths not named"
grep -q "^weight residency: 4 units" "$dir/out" || bad "no residency summary"
[ "$(wc -l < "$dir/csv/units.csv")" = 5 ] || bad "units.csv does not have 4 units"
head -1 "$dir/csv/steps.csv" | grep -q ",roofline_fraction$" || bad "steps.csv has no roofline_fraction column"
grep -q "<h2>Weight residency</h2>" "$dir/r.html" || bad "the HTML has no residency section"
grep -q "Roofline: 0" "$dir/r.html" || bad "the HTML has no roofline line"

# A trace without bandwidths: the options give them (GB/s), and the line matches the test's figure.
want=$("$build/test_report_residency" gen "$dir/bare.json" 0.4 0.3) || bad "cannot generate the bare trace"
"$cli" report "$dir/bare.json" --text --nvme-read-bw 0.4 --nvme-write-bw 0.3 >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || { bad "report with bandwidths exited $rc"; cat "$dir/err"; }
grep -qF "$want" "$dir/out" || { bad "with options: the text lacks '$want'"; grep roofline "$dir/out"; }
grep -q "NVMe read 0.40 GB/s (option), write 0.30 GB/s (option)" "$dir/out" || { bad "option bandwidths not named"; grep "NVMe read" "$dir/out"; }
"$cli" report "$dir/bare.json" --text >"$dir/out" 2>"$dir/err" || bad "report without bandwidths failed"
grep -q "roofline: unknown: no NVMe read bandwidth" "$dir/out" || bad "no 'unknown' roofline line"
"$cli" report "$dir/bare.json" --text --nvme-read-bw 2 >"$dir/out" 2>"$dir/err" || bad "report with a read bandwidth failed"
grep -q "roofline: unknown: no NVMe write bandwidth" "$dir/out" || bad "read bandwidth alone: no 'unknown' line naming write"

# Bad values: exit 2, a message naming the option.
for v in -1 0 abc nan inf 1e99 ""; do
  for o in read write; do
    "$cli" report "$dir/meta.json" --text --nvme-$o-bw "$v" >"$dir/out" 2>"$dir/err"
    rc=$?
    [ $rc = 2 ] || bad "--nvme-$o-bw '$v' exited $rc, want 2"
    grep -q -- "--nvme-$o-bw" "$dir/err" || { bad "--nvme-$o-bw '$v': message does not name the option"; cat "$dir/err"; }
  done
done
"$cli" report "$dir/meta.json" --text --nvme-read-bw >"$dir/out" 2>"$dir/err"
[ $? = 2 ] || bad "--nvme-read-bw without a value did not exit 2"
"$cli" report --help | grep -q -- "--nvme-read-bw GB/s .*10^9 bytes/s" || bad "--help lacks --nvme-read-bw in GB/s"
"$cli" report --help | grep -q -- "--nvme-write-bw GB/s" || bad "--help lacks --nvme-write-bw"

[ $fail = 0 ] && rm -rf "$dir"
[ $fail = 0 ] && echo "cli_report_roofline: passed" || echo "cli_report_roofline: FAILED"
exit $fail
