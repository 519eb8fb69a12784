#!/usr/bin/env bash
# `memwall bench adam`: help and usage exit codes, the JSON fields, MEMWALL_SIMD forcing a variant.
set -u
cli=${MW_CLI:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
expect() { # expect CODE cmd...
  local want=$1; shift
  "$@" >"$tmp/out" 2>&1; local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: '$*' exited $got, want $want"; cat "$tmp/out"; fail=1; fi
}
expect 0 "$cli" bench adam --help
expect 2 "$cli" bench adam --n 0
expect 2 "$cli" bench adam --format nosuch
expect 2 "$cli" bench adam --threads x
expect 0 "$cli" bench adam --n 5000 --reps 1 --threads 1
grep -q "^fp32 " "$tmp/out" || { echo "FAIL: table has no fp32 row"; cat "$tmp/out"; fail=1; }
for simd in scalar avx2 avx512; do
  MEMWALL_SIMD=$simd "$cli" bench adam --json --n 5000 --reps 1 --threads 2 >"$tmp/j.json" 2>"$tmp/err" || {
    echo "FAIL: bench adam --json (MEMWALL_SIMD=$simd)"; cat "$tmp/err"; fail=1; continue; }
  if ! command -v python3 >/dev/null; then   # no python: check the keys with grep
    for k in format threads params_per_s bytes_per_s limit_bytes_per_s; do
      grep -q "\"$k\":" "$tmp/j.json" || { echo "FAIL: no $k in JSON"; fail=1; }
    done
    continue
  fi
  python3 - "$tmp/j.json" "$simd" <<'PY' || fail=1
import json, sys
rows = json.load(open(sys.argv[1]))
want = {"fp32", "bf16-grad", "fp16-grad", "bf16-moments", "8bit"}
fmts = {r["format"] for r in rows}
assert want <= fmts, f"formats {fmts}"
for r in rows:
    for k in ("format", "threads", "params_per_s", "bytes_per_s", "limit_bytes_per_s"):
        assert k in r, f"missing {k} in {r}"
    assert r["threads"] == 2 and r["params_per_s"] > 0 and r["limit_bytes_per_s"] > 0, r
    assert abs(r["bytes_per_s"] - r["params_per_s"] * r["bytes_per_param"]) <= 1e-3 * r["bytes_per_s"], r
# MEMWALL_SIMD forces the variant (or falls back, with a warning, where the CPU lacks it)
assert rows[0]["simd"] in (sys.argv[2], "scalar", "avx2"), rows[0]["simd"]
PY
done
MEMWALL_SIMD=scalar "$cli" bench adam --json --n 5000 --reps 1 --threads 1 --format fp32 | grep -q '"simd": "scalar"' ||
  { echo "FAIL: MEMWALL_SIMD=scalar not honoured"; fail=1; }
[ $fail = 0 ] && echo "cli_bench_adam: passed" || echo "cli_bench_adam: FAILED"
exit $fail
