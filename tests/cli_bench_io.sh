#!/usr/bin/env bash
# `memwall bench io`: a small run on both backends prints JSON with the throughput keys and
# removes its file; --trace writes a trace with one event per request; usage errors exit 2.
set -u
cli=${MW_CLI:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_bench_io.$$
mkdir -p "$dir"
fail=0
bad() { echo "FAIL: $*"; fail=1; }
for be in uring threads; do
  out=$("$cli" bench io --dir "$dir" --size 8M --block-size 256K --queue-depth 4 --backend $be --json) ||
    bad "bench io --backend $be exited $?"
  for k in read_bytes_per_s write_bytes_per_s '"queue_depth":4' '"block_size_bytes":262144' "\"backend\":\"$be\""; do
    echo "$out" | grep -q "$k" || bad "--backend $be: '$k' missing in: $out"
  done
done
"$cli" bench io --dir "$dir" --size 4M --block-size 1M --queue-depth 2 | grep -Eq "read: .* [kMG]B/s" || bad "text output has no read rate"
"$cli" bench io --dir "$dir" --size 4M --block-size 1M --queue-depth 2 --trace "$dir/t.json" >/dev/null ||
  bad "bench io --trace failed"
n=$(grep -o '"ph":"X","cat":"io"' "$dir/t.json" | wc -l)
[ "$n" = 8 ] || bad "trace has $n I/O events, want 8 (4 writes + 4 reads)"
left=$(ls "$dir" | grep -c memwall-bench-io)
[ "$left" = 0 ] || bad "bench io left $left data file(s) behind"
"$cli" bench io --size 4M >/dev/null 2>&1; [ $? = 2 ] || bad "missing --dir should exit 2"
"$cli" bench io --dir "$dir" --block-size 1000 >/dev/null 2>&1; [ $? = 2 ] || bad "bad --block-size should exit 2"
"$cli" bench io --dir /proc/nonexistent >/dev/null 2>&1; [ $? = 1 ] || bad "unwritable --dir should exit 1"
"$cli" bench io --trace-cost --json | grep -q trace_ns_per_event || bad "--trace-cost prints no figure"
rm -rf "$dir"
[ $fail = 0 ] && echo "cli_bench_io: passed" || echo "cli_bench_io: failed"
exit $fail
