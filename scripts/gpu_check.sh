#!/usr/bin/env bash
# scripts/gpu_check.sh — everything memwall does on an NVIDIA GPU, in one command, on a machine lent
# one (docs/gpu.md: what it runs, how long, what to send back). Its figures go to one file,
# $GPU_CHECK_OUT (default build-gpu/gpu_check.txt), each part's full output beside it in
# build-gpu/gpu_check/. Parts, in order:
#   1. build with the CUDA device (-DMEMWALL_CUDA=ON, this GPU's architecture) into build-gpu/;
#   2. the CUDA kernel tests: test_offload_device's variants cuda (the device table on the GPU,
#      every state format element by element against the CPU), cuda_host (the kernels' code on the
#      host) and emu; then the engine's bitwise-equivalence and failure tests with MEMWALL_DEVICE=cuda;
#   3. the update phase of 124M parameters (memwall bench offload, state in DRAM): all-cpu and
#      all-device for every moment format, side by side;
#   4. the hybrid update on GPT-2 124M (memwall train --preset gpt2-124m), optimizer in DRAM and on
#      NVMe, --offload-policy all-cpu, auto and all-device on the CUDA device: the losses and the
#      final checkpoints' state bitwise equal to all-cpu in DRAM (fp32 state: deterministic), the
#      step times and the update counts side by side;
#   5. the Python package's CUDA path: first memwall.torch.offload of CUDA models
#      (python/tests/test_offload_device.py: units NVMe -> pinned staging -> GPU on side streams and
#      gradients back, Llama and Qwen2 against the CPU run, the device memory bounded; its figures
#      into this file), then the rest of the pytest suite, where test_cuda_matches_cpu runs (CUDA
#      parameters through pinned host copies, bitwise against the CPU path),
#      examples/torch_gpt.py on the GPU with memwall's and torch's optimizer, and
#      bench/torch_optim.py (BENCH_ARGS, default --quick: "" runs the full bench, longer than the
#      8 minutes this script is sized for).
# A part that fails is reported (FAIL) and the next one still runs; the exit status is the number
# of failed parts (0: all passed). Knobs: NVCC (default /usr/local/cuda/bin/nvcc, else PATH),
# CUDA_ARCHS (default native), GPU_CHECK_STEPS (training steps, default 4), NVME_DIR (where the
# NVMe runs keep their state, default build-gpu/gpu_check/nvme), BENCH_ARGS; for a dry run of the
# script itself on a machine without a GPU (parts 3 and 4 then drive the emulated accelerator):
# GPU_CHECK_PRESET (default gpt2-124m), GPU_CHECK_PARAMS (default 124439808), GPU_CHECK_PYTHON=0,
# GPU_CHECK_BUILD (the build directory, default build-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
B=${GPU_CHECK_BUILD:-build-gpu}
OUT=$B/gpu_check
FIG=${GPU_CHECK_OUT:-$B/gpu_check.txt}
STEPS=${GPU_CHECK_STEPS:-4}
PRESET=${GPU_CHECK_PRESET:-gpt2-124m}
PARAMS=${GPU_CHECK_PARAMS:-124439808}
NVME_DIR=${NVME_DIR:-$OUT/nvme}
mkdir -p "$OUT" "$(dirname "$FIG")"
: >"$FIG"
t_start=$(date +%s)
fails=0
fig() { printf '%s\n' "$*" | tee -a "$FIG"; }
failed() { fig "FAIL: $*"; fails=$((fails + 1)); }
since() { echo $(( $(date +%s) - $1 )); }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

fig "== memwall gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
gpu=0
if command -v nvidia-smi >/dev/null; then
  q=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1) && gpu=1
  fig "GPU: $q"
  fig "driver's CUDA: $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
else
  fig "GPU: none (no nvidia-smi)"
fi
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
fig "nvcc: ${NVCC:-none} $([ -n "$NVCC" ] && "$NVCC" --version | grep -o 'release [0-9.]*')"
DEV=cuda
[ "$gpu" = 1 ] || { DEV=emu; fig "(no GPU: the engine's tests and parts 3 and 4 drive the emulated accelerator instead, as a dry run)"; }
fig "CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"

bash scripts/install-deps.sh >"$OUT/deps.log" 2>&1 || fig "(install-deps.sh failed, see $OUT/deps.log: going on with what is installed)"

# ---------------------------------------------------------------- 1. build
t=$(date +%s)
archs=${CUDA_ARCHS:-native}
[ "$gpu" = 1 ] || archs=${CUDA_ARCHS:-75-real;80-real;90-real;90-virtual} # "native" needs a visible GPU
if [ -z "$NVCC" ]; then
  failed "build: no nvcc (set NVCC=/path/to/nvcc)"
  fig "== gpu_check: $fails part(s) failed, $(since "$t_start") s"
  exit "$fails"
fi
if cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DMEMWALL_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" \
     "-DCMAKE_CUDA_ARCHITECTURES=$archs" >"$OUT/build.log" 2>&1 && cmake --build "$B" -j "$(nproc)" >>"$OUT/build.log" 2>&1; then
  fig "build: ok in $(since "$t") s (CUDA architectures $archs)"
else
  tail -30 "$OUT/build.log"
  failed "build (see $OUT/build.log)"
  fig "== gpu_check: $fails part(s) failed, $(since "$t_start") s"
  exit "$fails"
fi
cli=$B/memwall

# ---------------------------------------------------------------- 2. kernel tests
fig "== CUDA kernel tests (test_offload_device: every state format, ragged sizes, element by element vs the CPU)"
for v in cuda cuda_host emu; do
  t=$(date +%s)
  timeout 600 "$B/test_offload_device" "$v" >"$OUT/test_$v.log" 2>&1
  rc=$?
  summary=$(grep -E 'checks, [0-9]+ failed|^SKIP' "$OUT/test_$v.log" | tail -1)
  if [ $rc = 0 ]; then fig "  $v: PASS ($summary, $(since "$t") s)"
  elif [ $rc = 77 ] && [ "$v" = cuda ] && [ "$gpu" = 0 ]; then fig "  $v: skipped, no GPU ($summary)"
  else grep -m 20 -E 'CHECK|REQUIRE|differs|SKIP' "$OUT/test_$v.log"; failed "  test_offload_device $v: exit $rc ($summary)"; fi
done
# The engine end to end with its accelerator on the GPU: every placement, subgroup size and policy
# bitwise the all-in-DRAM run (test_offload_equiv); I/O failures with half the updates on the
# device, handed back whole (test_offload_fail).
for tname in test_offload_equiv test_offload_fail; do
  [ -x "$B/$tname" ] || continue
  t=$(date +%s)
  MEMWALL_DEVICE=$DEV MW_SOURCE_DIR=$PWD MW_BUILD_DIR=$PWD/$B MW_CLI=$PWD/$cli timeout 600 "$B/$tname" \
    >"$OUT/$tname.log" 2>&1
  rc=$?
  summary=$(grep -E 'checks, [0-9]+ failed|^SKIP' "$OUT/$tname.log" | tail -1)
  if [ $rc = 0 ]; then fig "  $tname (MEMWALL_DEVICE=$DEV): PASS ($summary, $(since "$t") s)"
  else grep -m 20 -E 'CHECK|REQUIRE|differ|FAIL' "$OUT/$tname.log"; failed "  $tname with MEMWALL_DEVICE=$DEV: exit $rc ($summary)"; fi
done

# ---------------------------------------------------------------- 3. the update phase, per format
fig "== update phase of $PARAMS parameters, state in DRAM (memwall bench offload, MEMWALL_DEVICE=$DEV, median of 2 steps, seconds)"
fig "$(printf '  %-8s %10s %12s %8s  %s' moments all-cpu all-device cpu/dev updates-on-device)"
for mf in fp32 bf16 bf16-sr 8bit; do
  t_cpu=- t_dev=- ndev=-
  for pol in all-cpu all-device; do
    log=$OUT/bench_${mf}_$pol.log
    MEMWALL_DEVICE=$DEV timeout 300 "$cli" bench offload --params "$PARAMS" --subgroup-size 8388608 --tier dram \
      --moments "$mf" --device --policy "$pol" --steps 2 --no-kernel >"$log" 2>&1
    rc=$?
    sec=$(sed -n 's/^update phase *\([0-9.]*\) s.*/\1/p' "$log" | head -1)
    if [ $rc != 0 ] || [ -z "$sec" ]; then
      tail -3 "$log"
      failed "bench offload --moments $mf --policy $pol: exit $rc (see $log)"
      sec=-
    fi
    if [ "$pol" = all-cpu ]; then t_cpu=$sec; else
      t_dev=$sec
      ndev=$(sed -n 's/.*updates *[0-9]* on the CPU, \([0-9]*\) on the.*/\1/p' "$log" | head -1)
    fi
  done
  ratio=$(awk -v a="$t_cpu" -v b="$t_dev" 'BEGIN { if (a != "-" && b != "-" && b > 0) printf "%.2f", a / b; else print "-" }')
  fig "$(printf '  %-8s %10s %12s %8s  %s' "$mf" "$t_cpu" "$t_dev" "$ratio" "${ndev:--}")"
done

# ---------------------------------------------------------------- 4. the hybrid update on GPT-2 124M
. tests/lib_ckpt.sh
fig "== training, $STEPS steps of memwall train --preset $PRESET, the accelerator: MEMWALL_DEVICE=$DEV"
fig "  (bitwise: yes = the losses and the final checkpoint's state equal all-cpu's of the same tier; ref+loss: the"
fig "   nvme reference, whose losses equal dram's; step ms: the median step; total s: the whole command)"
fig "$(printf '  %-5s %-10s %-9s %12s %12s  %s' tier policy bitwise 'step ms' 'total s' 'updates (trace summary)')"
losses() { grep -o '"step":[0-9]*,"loss":[^,]*' "$1"; }
ck_of() { echo "$1/ckpt_$(printf '%08d' "$STEPS").mwck"; }
first=""
for tier in dram nvme; do
  ref="" # the checkpoint records its tier: states are compared within a tier, losses across both
  for pol in all-cpu auto all-device; do
    name=${tier}_$pol
    run=$OUT/train_$name
    rm -rf "$run" "${NVME_DIR:?}/$name"
    args=(train --preset "$PRESET" --steps "$STEPS" --warmup 1 --sample-len 0 --val-every 0 --seed 7 --print-every 1
          --optimizer-tier "$tier" --offload-policy "$pol" --ckpt-every "$STEPS" --out-dir "$run"
          --log-json "$run.jsonl" --trace "$run.trace.json")
    [ "$tier" = nvme ] && args+=(--nvme-dir "$NVME_DIR/$name")
    t=$(date +%s)
    MEMWALL_DEVICE=$DEV timeout 600 "$cli" "${args[@]}" >"$run.log" 2>&1
    rc=$?
    secs=$(since "$t")
    if [ $rc != 0 ] || [ ! -s "$(ck_of "$run")" ]; then
      tail -5 "$run.log"
      failed "train $tier $pol: exit $rc (see $run.log)"
      continue
    fi
    ms=$(grep -o '"ms":[0-9.]*' "$run.jsonl" | cut -d: -f2 | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }')
    upd=$(grep -o 'updates: [^;]*; predicted [^)]*)' "$run.log" | tail -1)
    [ -n "$first" ] || first=$run
    if [ -z "$ref" ]; then
      ref=$run
      same=ref
      [ "$run" = "$first" ] || { [ "$(losses "$first.jsonl")" = "$(losses "$run.jsonl")" ] && same="ref+loss"; } \
        || { same=NO; failed "train $tier $pol: losses differ from ${first##*/}"; }
    elif [ "$(losses "$ref.jsonl")" = "$(losses "$run.jsonl")" ] && ckpt_state_eq "$(ck_of "$ref")" "$(ck_of "$run")"; then
      same=yes
    else
      same=NO
      failed "train $tier $pol: losses or final state differ from ${ref##*/}"
    fi
    fig "$(printf '  %-5s %-10s %-9s %12s %12s  %s' "$tier" "$pol" "$same" "$ms" "$secs" "${upd:--}")"
    [ "$run" = "$ref" ] || rm -rf "$run" # 2 GB a checkpoint
    rm -rf "${NVME_DIR:?}/$name"
  done
  [ -n "$ref" ] && [ "$ref" != "$first" ] && rm -rf "$ref"
done
[ -n "$first" ] && rm -rf "$first"

# ---------------------------------------------------------------- 5. the Python package's CUDA path
fig "== Python package: offload of CUDA models, then the suite (CUDA parameters through pinned host copies)"
if [ "${GPU_CHECK_PYTHON:-1}" = 0 ]; then
  fig "  skipped (GPU_CHECK_PYTHON=0)"
elif PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q ./python >"$OUT/pip.log" 2>&1; then
  fig "  $(python3 -c "import torch; print('torch', torch.__version__, 'CUDA available:', torch.cuda.is_available())" 2>&1 | tail -1)"
  # memwall.torch.offload of a CUDA model: every CUDA test must run (a skip on a GPU machine fails).
  t=$(date +%s)
  log=$OUT/pytest_offload_device.log
  : >"$OUT/offload_device.txt"
  MEMWALL_LIB=$B/libmemwall.so PYTHONPATH=python MW_CLI=$cli GPU_CHECK_FIGURES=$OUT/offload_device.txt timeout 600 \
    python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_offload_device.py >"$log" 2>&1
  rc=$?
  res=$(tail -1 "$log")
  if [ $rc = 0 ]; then fig "  offload of CUDA models (test_offload_device.py): $res, $(since "$t") s"
  else tail -15 "$log"; failed "offload of CUDA models (test_offload_device.py): $res (see $log)"; fi
  sed 's/^/    /' "$OUT/offload_device.txt" | tee -a "$FIG"
  if [ "$gpu" = 1 ] && grep -q '^SKIPPED.*test_offload_device' "$log"; then
    grep '^SKIPPED' "$log" | sed 's/^/    /' | tee -a "$FIG"
    failed "offload of CUDA models: CUDA tests skipped on a GPU machine (see $log)"
  fi
  MEMWALL_LIB=$B/libmemwall.so PYTHONPATH=python MW_CLI=$cli timeout 900 \
    python3 -m pytest -q -rs -p no:cacheprovider python/tests --ignore=python/tests/test_offload_device.py \
    >"$OUT/pytest.log" 2>&1
  rc=$?
  res=$(tail -1 "$OUT/pytest.log")
  if [ $rc = 0 ]; then fig "  pytest: $res"; else tail -15 "$OUT/pytest.log"; failed "pytest: $res (see $OUT/pytest.log)"; fi
  grep -E '^SKIPPED' "$OUT/pytest.log" | sed 's/^/    /' | tee -a "$FIG" # on a GPU machine: none of them cuda
  for opt in memwall torch; do
    log=$OUT/torch_gpt_$opt.log
    if timeout 600 python3 examples/torch_gpt.py --device cuda --steps 30 --optimizer "$opt" >"$log" 2>&1; then
      fig "  examples/torch_gpt.py --device cuda --optimizer $opt: $(tail -1 "$log")"
    else
      tail -5 "$log"
      failed "examples/torch_gpt.py --optimizer $opt (see $log)"
    fi
  done
  log=$OUT/torch_optim.log
  if timeout 900 python3 bench/torch_optim.py ${BENCH_ARGS---quick} >"$log" 2>&1; then
    fig "  bench/torch_optim.py ${BENCH_ARGS---quick}:"
    sed 's/^/    /' "$log" | tail -25 | tee -a "$FIG"
  else
    tail -5 "$log"
    failed "bench/torch_optim.py (see $log)"
  fi
else
  tail -5 "$OUT/pip.log"
  failed "pip install ./python (see $OUT/pip.log)"
fi

fig "== gpu_check: $fails part(s) failed, $(since "$t_start") s; figures in $FIG, logs in $OUT"
exit "$fails"
