# lib_mpi_train.sh — sourced (not a test itself) by the tests/mpi_*.sh scripts that drive
# `mpirun memwall train`: the scratch directory, the launcher, and the helpers they share.
#   source lib_mpi_train.sh NAME   -> M (the binary), dir (fresh, the cwd), MPI (2 ranks), fail=0
#   bad MSG                        -> records a failure
#   run NAME CMD...                -> CMD with its output in NAME.out; on failure prints it, bad
#   compare A B [exact]            -> log-json files A and B: the same steps, and the same losses,
#                                     validation losses and gradient norms (relative 2e-5, or
#                                     bitwise with `exact`); fails on empty logs
: "${MW_MPIRUN:?}" "${MW_BUILD_DIR:?}" "${MW_SOURCE_DIR:?}"
M="$MW_BUILD_DIR/memwall"
dir="$MW_BUILD_DIR/test-scratch/$1-$$"
rm -rf "$dir"; mkdir -p "$dir"
cd "$dir" || exit 1
MPI=("$MW_MPIRUN" --allow-run-as-root --oversubscribe -np 2)
fail=0
bad() { echo "FAIL: $*"; fail=1; }
run() {
  local name=$1; shift
  if ! "$@" > "$name.out" 2>&1; then cat "$name.out"; bad "$name exited non-zero"; return 1; fi
}
compare() {
  python3 - "$@" <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
exact = len(sys.argv) > 3
if len(a) != len(b) or not a:
    sys.exit(f"{sys.argv[2]}: {len(b)} lines, {sys.argv[1]} has {len(a)}")
worst = 0.0
for x, y in zip(a, b):
    if x.get("step") != y.get("step"):
        sys.exit(f"step {x.get('step')} against step {y.get('step')}")
    for k in ("loss", "val_loss", "grad_norm"):
        if (k in x) != (k in y):
            sys.exit(f"step {x.get('step')}: {k} in one log only")
        if k not in x:
            continue
        if exact and x[k] != y[k]:
            sys.exit(f"step {x['step']}: {k} {x[k]!r} != {y[k]!r} (expected bitwise equal)")
        rel = abs(x[k] - y[k]) / max(abs(x[k]), 1e-30)
        worst = max(worst, rel)
        if rel > 2e-5:
            sys.exit(f"step {x['step']}: {k} {x[k]} vs {y[k]}: relative {rel:.2e} > 2e-5")
print(f"  {sys.argv[2]}: {len(b)} lines match {sys.argv[1]} ({'bitwise' if exact else f'worst relative {worst:.1e}'})")
PYEOF
}

# zero3_weights_ok OUT: a ZeRO-3 run's printed weight memory (OUT: its stdout): the peak below 0.85 of
# the whole model (non-owned units are released) and within 5 % of the planner's prediction.
zero3_weights_ok() {
  python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
peak = int(re.search(r"ZeRO-3 weights per rank: peak resident \S+ \S+ \((\d+) bytes", t).group(1))
whole = int(re.search(r"whole model (\d+) bytes", t).group(1))
pred = int(re.search(r"planner predicts \S+ \S+ \((\d+) bytes", t).group(1))
print(f"  measured {peak} bytes, whole model {whole}, planner {pred}: measured/planner {peak / pred:.4f}")
if not peak < 0.85 * whole:
    sys.exit("the peak is not below the whole model: weights are not released")
if abs(peak / pred - 1) > 0.05:
    sys.exit("measured and predicted differ by more than 5%")
PY
}
