#!/usr/bin/env bash
# Output hygiene of `memwall report` and the trace writer:
# - a hostile trace's bytes quoted in a parse error reach the terminal only as printable, escaped
#   text (\x1b, \", \\), bounded;
# - write errors name the real errno: /dev/full as -o, as stdout of --text, as --trace give
#   "No space left on device" (exit 1), and the device stays a device;
# - on a full file system (a 2 MiB tmpfs, filled) the report, the CSV export and the trace fail
#   with ENOSPC and leave no partial file and no temporary; an earlier report there is kept whole.
# The tmpfs part needs root (mount); without it that part is skipped with a note.
set -u
cli=${MW_CLI:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_report_hygiene.$$
mkdir -p "$dir/mnt"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
mounted=0
cleanup() { [ $mounted = 1 ] && umount "$dir/mnt"; rm -rf "$dir"; }
trap cleanup EXIT

"$cli" bench offload --params 100000 --tier dram --steps 2 --trace "$dir/t.json" >/dev/null 2>&1 ||
  { echo "FAIL: cannot make a trace"; exit 1; }

# --- 1. the parse error's snippet: escaped, bounded
printf '{"traceEvents":[] , \033[2J\033]0;pwned\007\000\177\233"\\ tail-that-goes-on-and-on-and-on-and-on-and-on}' \
  >"$dir/hostile.json"
"$cli" report "$dir/hostile.json" -o "$dir/r.html" >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 1 ] || bad "hostile trace: exit $rc, want 1"
python3 - "$dir/err" <<'PY' || fail=1
import sys
b = open(sys.argv[1], 'rb').read()
lines = b.split(b'\n')
bad = [c for c in b if (c < 0x20 and c != 0x0a) or c == 0x7f]
if bad: print("FAIL: control bytes on stderr: %r" % sorted(set(bad))); sys.exit(1)
if not b.endswith(b'\n'): print("FAIL: stderr does not end with a newline"); sys.exit(1)
want = rb'near "\x1b[2J\x1b]0;pwned\x07\x00\x7f\x9b\"\\ tail-that-goes-on-an...'
if want not in b: print("FAIL: escaped snippet %r not in %r" % (want, b)); sys.exit(1)
if any(c >= 0x80 for c in b): print("FAIL: non-ASCII bytes on stderr: %r" % b); sys.exit(1)
PY
[ -e "$dir/r.html" ] && bad "a report was written for a malformed trace"

# --- 2. the real errno: /dev/full
"$cli" report "$dir/t.json" -o /dev/full >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 1 ] && grep -q "No space left on device" "$dir/err" || bad "-o /dev/full: exit $rc: $(cat "$dir/err")"
[ -c /dev/full ] || bad "/dev/full is no longer a character device"
"$cli" report "$dir/t.json" --text >/dev/full 2>"$dir/err"
rc=$?
[ $rc = 1 ] && grep -q "No space left on device" "$dir/err" || bad "--text >/dev/full: exit $rc: $(cat "$dir/err")"
"$cli" bench offload --params 1000 --tier dram --steps 1 --trace /dev/full >"$dir/out" 2>"$dir/err"
rc=$?
[ $rc = 1 ] && grep -q "No space left on device" "$dir/err" || bad "--trace /dev/full: exit $rc: $(cat "$dir/err")"
[ -c /dev/full ] || bad "/dev/full is no longer a character device"
"$cli" report "$dir/t.json" -o /dev/stdout 2>"$dir/err" | grep -q "<!DOCTYPE html>" || bad "-o /dev/stdout: $(cat "$dir/err")"

# --- 3. a full file system: no partial output, no temporary
if ! mount -t tmpfs -o size=2m none "$dir/mnt" 2>"$dir/mount.err"; then
  echo "note: cannot mount a tmpfs (needs root): the full-disk part is not run: $(cat "$dir/mount.err")"
else
  mounted=1
  m=$dir/mnt
  "$cli" report "$dir/t.json" -o "$m/old.html" >/dev/null 2>&1 || bad "cannot write a first report on the tmpfs"
  cp "$m/old.html" "$dir/old.html"
  dd if=/dev/zero of="$m/fill" bs=4k >/dev/null 2>&1 # until the disk is full
  [ "$(df --output=avail "$m" | tail -1 | tr -d ' ')" = 0 ] || bad "the tmpfs is not full: $(df "$m")"
  "$cli" report "$dir/t.json" -o "$m/new.html" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc = 1 ] && grep -q "No space left on device" "$dir/err" || bad "full disk, -o: exit $rc: $(cat "$dir/err")"
  "$cli" report "$dir/t.json" -o "$m/old.html" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc = 1 ] && grep -q "No space left on device" "$dir/err" || bad "full disk, over the old report: exit $rc: $(cat "$dir/err")"
  cmp -s "$m/old.html" "$dir/old.html" || bad "the earlier report was changed by a failed write"
  "$cli" report "$dir/t.json" --csv "$m/csv" --text >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc = 1 ] && grep -q "No space left on device" "$dir/err" || bad "full disk, --csv: exit $rc: $(cat "$dir/err")"
  "$cli" bench offload --params 100000 --tier dram --steps 2 --trace "$m/trace.json" >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc = 1 ] && grep -q "No space left on device" "$dir/err" || bad "full disk, --trace: exit $rc: $(cat "$dir/err")"
  left=$(cd "$m" && find . -type f ! -name fill ! -name old.html | sort | tr '\n' ' ')
  [ -z "$left" ] || bad "partial outputs or temporaries left on the full disk: $left"
  # once there is room again, the same commands succeed
  rm -f "$m/fill"
  "$cli" report "$dir/t.json" -o "$m/new.html" >/dev/null 2>"$dir/err" && grep -q "</html>" "$m/new.html" ||
    bad "with room again, -o failed: $(cat "$dir/err")"
  "$cli" report "$dir/t.json" --csv "$m/csv" --text >/dev/null 2>"$dir/err" && [ -s "$m/csv/steps.csv" ] ||
    bad "with room again, --csv failed: $(cat "$dir/err")"
fi
[ $fail = 0 ] && echo "cli_report_hygiene: passed" || echo "cli_report_hygiene: failed"
exit $fail
