#!/usr/bin/env bash
# One run per NVMe directory: while `memwall train --optimizer-tier nvme` runs, a second one on
# the same --nvme-dir exits 1 naming the first one's pid (and leaves the first undisturbed);
# after the first is killed with SIGKILL its files stay, the next run on the directory is
# refused listing them and saying --resume continues it (exit 1) without touching them, and runs
# once they are removed.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_nvme_dir-$$
rm -rf "$dir" && mkdir -p "$dir"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
common=(--preset tiny --data "$src/data/kjv_excerpt.txt" --threads 1 --sample-len 0 --optimizer-tier nvme
        --nvme-dir "$dir/nvme")

"$cli" train "${common[@]}" --steps 1000000 >"$dir/first.out" 2>&1 &
first=$!
# Wait (at most 60 s) until the first run holds the directory: the lock file names it.
for _ in $(seq 600); do
  [ "$(cat "$dir/nvme/memwall.lock" 2>/dev/null)" = "$first" ] && break
  kill -0 $first 2>/dev/null || break
  sleep 0.1
done
if [ "$(cat "$dir/nvme/memwall.lock" 2>/dev/null)" != "$first" ]; then
  bad "the first run never locked $dir/nvme"; cat "$dir/first.out"
else
  "$cli" train "${common[@]}" --steps 2 >"$dir/second.out" 2>&1
  rc=$?
  [ $rc = 1 ] || bad "a second run on the same --nvme-dir exited $rc, want 1"
  # The message, quoted (docs/train.md "Faults"; the prefix before "store:" says where it failed).
  want="store: directory $dir/nvme is in use by another run (pid $first holds $dir/nvme/memwall.lock): two runs on one directory would overwrite each other's files; wait for it to finish or give this run another directory"
  grep -q "^memwall: .*: $(printf '%s' "$want" | sed 's/[][\.*^$/]/\\&/g')\$" "$dir/second.out" \
    || bad "the refusal is not the documented message naming the first run (pid $first): $(cat "$dir/second.out")"
  echo "second run: $(grep -m1 'in use' "$dir/second.out")"
  kill -0 $first 2>/dev/null || bad "the first run died while the second was refused: $(tail -3 "$dir/first.out")"
fi
# Killed once its first step is committed (the record is there), so that it can be resumed.
for _ in $(seq 600); do
  [ -f "$dir/nvme/memwall-offload.commit" ] && break
  kill -0 $first 2>/dev/null || break
  sleep 0.1
done
kill -KILL $first 2>/dev/null
wait $first 2>/dev/null

# The killed run's store file stays; the next run is refused listing it and leaves it alone.
leftover=$(ls "$dir/nvme"/*.dat 2>/dev/null | head -1)
[ -n "$leftover" ] || bad "the killed run's store file is gone"
if [ -n "$leftover" ]; then
  size=$(stat -c %s "$leftover")
  "$cli" train "${common[@]}" --steps 2 >"$dir/third.out" 2>&1
  rc=$?
  [ $rc = 1 ] || bad "a run on a crashed run's files exited $rc, want 1"
  grep -q "did not finish" "$dir/third.out" && grep -q "$(basename "$leftover")" "$dir/third.out" \
    && grep -q "memwall train --resume $dir/nvme' continues it" "$dir/third.out" \
    || bad "the refusal does not list the crashed run's files: $(cat "$dir/third.out")"
  echo "third run: $(grep -m1 'did not finish' "$dir/third.out")"
  [ -f "$leftover" ] && [ "$(stat -c %s "$leftover")" = "$size" ] || bad "the refused run changed $leftover"
  rm -f "$dir/nvme"/*.dat
  "$cli" train "${common[@]}" --steps 2 >"$dir/fourth.out" 2>&1 || bad "a run after removing the files failed: $(tail -3 "$dir/fourth.out")"
  left=$(ls -A "$dir/nvme" | grep -cvx memwall-run.done)
  [ "$left" = 0 ] || bad "a finished run left $left file(s) besides its done marker in $dir/nvme: $(ls -A "$dir/nvme")"
fi
rm -rf "$dir"
[ $fail = 0 ] && echo "cli_nvme_dir: passed" || echo "cli_nvme_dir: failed"
exit $fail
