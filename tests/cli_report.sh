#!/usr/bin/env bash
# memwall report end to end: a synthetic trace -> HTML + CSV + text (exit 0); -o works; a
# truncated or missing trace exits 1 with a message naming the file; no TRACE exits 2. Then the
# HTML is rendered in headless Chromium: no console errors, and a screenshot is produced
# ($MW_BUILD_DIR/report.png, kept as a CI artifact). Chromium missing is a FAILURE (CI installs it
# through scripts/install-deps.sh).
set -u
cli=${MW_CLI:?}
build=${MW_BUILD_DIR:?}
dir=$build/test-scratch/cli_report-$$
rm -rf "$dir" && mkdir -p "$dir"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

"$build/test_report" gen 30 "$dir/trace.json" || bad "cannot generate the synthetic trace"

"$cli" report "$dir/trace.json" -o "$dir/report.html" --csv "$dir/csv" --text >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 0 ] || { bad "report exited $rc"; cat "$dir/err"; }
[ -s "$dir/report.html" ] || bad "-o did not write report.html"
grep -q "overlap fraction" "$dir/out" || bad "--text printed no summary"
grep -q "wrote $dir/report.html" "$dir/out" || bad "the report path is not printed"
[ "$(wc -l < "$dir/csv/steps.csv")" = 31 ] || bad "steps.csv does not have 30 steps"
grep -q "<script" "$dir/report.html" && bad "the report has a script"
grep -Eq "(src|href)=\"(https?:)?//" "$dir/report.html" && bad "the report references the network"

# --text alone prints and writes no HTML (in a directory of its own).
(cd "$dir" && mkdir -p textonly && cd textonly && "$cli" report ../trace.json --text >out 2>&1) || bad "--text alone failed"
[ -e "$dir/textonly/report.html" ] && bad "--text alone wrote report.html"

head -c 100000 "$dir/trace.json" >"$dir/cut.json"
"$cli" report "$dir/cut.json" -o "$dir/cut.html" >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 1 ] || bad "truncated trace exited $rc, want 1"
grep -q "cut.json" "$dir/err" && grep -q "truncated" "$dir/err" || { bad "truncated: message"; cat "$dir/err"; }
"$cli" report "$dir/none.json" >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 1 ] || bad "missing trace exited $rc, want 1"
grep -q "none.json" "$dir/err" || bad "missing: message does not name the file"
"$cli" report >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || bad "no TRACE exited $rc, want 2"
"$cli" report --help | grep -q -- "--output" || bad "--help lacks --output"

# Headless Chromium: renders, no console errors, screenshot.
chrome=""
for c in chromium chromium-browser google-chrome; do command -v "$c" >/dev/null && { chrome=$c; break; }; done
if [ -z "$chrome" ]; then
  bad "chromium is not installed (scripts/install-deps.sh installs it): cannot check the HTML renders"
else
  rm -f "$build/report.png"
  timeout 120 "$chrome" --headless --disable-gpu --no-sandbox --enable-logging=stderr --v=0 \
    --user-data-dir="$dir/chrome" --window-size=1100,4000 --screenshot="$build/report.png" \
    "file://$dir/report.html" >"$dir/chrome.out" 2>"$dir/chrome.err"
  [ -s "$build/report.png" ] || { bad "no screenshot produced"; tail -5 "$dir/chrome.err"; }
  timeout 120 "$chrome" --headless --disable-gpu --no-sandbox --enable-logging=stderr --v=0 \
    --user-data-dir="$dir/chrome" --dump-dom "file://$dir/report.html" >"$dir/dom.html" 2>>"$dir/chrome.err"
  grep -q "Optimizer subgroups" "$dir/dom.html" || bad "the rendered DOM lacks the report's last section"
  if grep -E "Uncaught|ERROR:CONSOLE|CONSOLE\(" "$dir/chrome.err"; then bad "console errors while rendering"; fi
fi
[ $fail = 0 ] && rm -rf "$dir"
[ $fail = 0 ] && echo "cli_report: passed" || echo "cli_report: FAILED"
exit $fail
