#!/usr/bin/env bash
# `memwall bench offload` with its NVMe directory on a ramfs, a file system that refuses O_DIRECT
# and fallocate: it used to leave a 0-byte memwall.0.dat behind on every try and then refuse the
# directory as "the files of a run that did not finish". Now it runs there (buffered, with the
# warnings), twice in a row, and leaves nothing behind. Needs root to mount; skipped (77) otherwise.
set -u
cli=${MW_CLI:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_store_ramfs.$$
mkdir -p "$dir/mnt"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
mounted=0
cleanup() { [ $mounted = 1 ] && umount "$dir/mnt"; rm -rf "$dir"; }
trap cleanup EXIT
if ! mount -t ramfs -o mode=0700 none "$dir/mnt" 2>"$dir/mount.err"; then
  echo "SKIP: cannot mount a ramfs (needs root / CAP_SYS_ADMIN): $(cat "$dir/mount.err")"
  exit 77
fi
mounted=1
[ "$(stat -f -c %T "$dir/mnt")" = ramfs ] || bad "the mount is $(stat -f -c %T "$dir/mnt"), not ramfs"

for run in 1 2; do
  "$cli" bench offload --params 100000 --tier nvme --nvme-dir "$dir/mnt/nv" --steps 2 --json >"$dir/out" 2>"$dir/err"
  rc=$?
  [ $rc = 0 ] || bad "run $run on ramfs exited $rc: $(cat "$dir/err")"
  grep -q '"nvme_read_bytes"' "$dir/out" || bad "run $run: no JSON result: $(cat "$dir/out")"
  grep -q "refuses O_DIRECT" "$dir/err" || bad "run $run: no warning about buffered I/O: $(cat "$dir/err")"
  grep -q "did not finish" "$dir/err" && bad "run $run: told the directory holds an unfinished run: $(cat "$dir/err")"
  left=$(find "$dir/mnt" -type f | wc -l)
  [ "$left" = 0 ] || bad "run $run left $left file(s): $(find "$dir/mnt" -type f -printf '%p (%s bytes) ')"
done
# `memwall bench io` there too: opened once, O_DIRECT refused, the file sized without fallocate.
for run in 1 2; do
  "$cli" bench io --dir "$dir/mnt" --size 4M --json >"$dir/out" 2>"$dir/err" || bad "bench io run $run on ramfs: $(cat "$dir/err")"
  grep -q '"direct":false' "$dir/out" || bad "bench io run $run: not buffered: $(cat "$dir/out")"
  [ -z "$(find "$dir/mnt" -type f)" ] || bad "bench io run $run left $(find "$dir/mnt" -type f)"
done
[ $fail = 0 ] && echo "cli_store_ramfs: passed" || echo "cli_store_ramfs: failed"
exit $fail
