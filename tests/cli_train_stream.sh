#!/usr/bin/env bash
# memwall train --offload-params nvme (weights, gradients and optimizer state streamed from
# NVMe a weight unit at a time) gives bitwise the run with everything resident: losses, norms,
# validation losses and the final weights, for accumulation 1, 2 and 8, with and without
# recompute, the blocks' activations kept on NVMe (the default) or recomputed, prefetch depth 0, 1 and 3, layer-major and
# batch-major schedules, subgroups cut inside units (and one subgroup for the
# whole model), the update overlapped with the next forward pass or not; --init-safetensors a unit at a time; a streamed checkpoint resumes bitwise; a --dram-budget below the plan is
# refused before the first step with the numbers, one above it holds (VmHWM <= budget, on a
# model whose resident run would not fit); `memwall plan --stream` gives the trainer's figures, for
# GPT-2 and for a Llama directory (both schedules); bad combinations are usage errors.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
. "$src/tests/lib_ckpt.sh"
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train_stream-$$
rm -rf "$dir" && mkdir -p "$dir"
data="$src/data/kjv_excerpt.txt"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
losses() { grep -o '"step":[0-9]*,"loss":[^,]*\(,"val_loss":[^,]*\)\?\(,"lr":[^,]*,"grad_norm":[^,]*\)\?' "$1"; }
# 3 blocks of width 64 over the byte vocabulary: 160,768 parameters; subgroups of 4096 (one
# page of fp32) cut every unit several times and straddle unit boundaries.
small=(--preset tiny --layers 3 --width 64 --heads 2 --data "$data" --threads 2 --sample-len 0 --batch 2 --seq 32
       --val-every 2 --val-batches 2)
run() { # name, args...: a run whose log and model land in $dir/<name>
  local name=$1; shift
  "$cli" train "$@" --log-json "$dir/$name.jsonl" --out-dir "$dir/$name" >"$dir/$name.out" 2>&1 \
    || { bad "$name failed (exit $?)"; tail -5 "$dir/$name.out"; }
}
same() { # reference, candidate: bitwise the same log and weights
  [ "$(losses "$dir/$1.jsonl" | wc -l)" -ge 2 ] || { bad "$1 logged too little"; return; }
  [ "$(losses "$dir/$1.jsonl")" = "$(losses "$dir/$2.jsonl")" ] && ok \
    || { bad "$2 losses differ from $1"; diff <(losses "$dir/$1.jsonl") <(losses "$dir/$2.jsonl") | head -5; }
  cmp -s "$dir/$1/model.safetensors" "$dir/$2/model.safetensors" && ok || bad "$2 final weights differ from $1"
}

# 1. Streamed == resident, over accumulation, recompute and prefetch depth.
for a in 1 2 8; do
  steps=4; [ $a = 8 ] && steps=2
  for rc in "" --recompute; do
    ref="ref-a$a$rc"
    run "$ref" "${small[@]}" --steps $steps --grad-accum $a $rc --subgroup-size 4096
    for d in 0 1 3; do
      [ $a = 8 ] && [ $d != 1 ] && continue
      run "st-a$a$rc-d$d" "${small[@]}" --steps $steps --grad-accum $a $rc --subgroup-size 4096 \
        --offload-params nvme --prefetch-depth $d --nvme-dir "$dir/nvme"
      same "$ref" "st-a$a$rc-d$d"
    done
  done
done
# The update hands each unit's new weights to the next forward (no read after its write): on by
# default, the same bits as reading them (MEMWALL_STREAM_HANDOFF=0), and some bytes handed over.
MEMWALL_STREAM_HANDOFF=0 run st-a1-nohand "${small[@]}" --steps 4 --subgroup-size 4096 --offload-params nvme \
  --prefetch-depth 1 --nvme-dir "$dir/nvme"
same ref-a1 st-a1-nohand
handed() { sed -n 's/.*(handed over by the update instead: \([0-9.]*\) [KMGT]*i*B).*/\1/p' "$dir/$1.out"; }
h1=$(handed st-a1-d1) h0=$(handed st-a1-nohand)
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 0 and float(sys.argv[2]) == 0 else 1)" "${h1:-x}" "${h0:-x}" \
  2>/dev/null && ok || bad "handed over: '$h1' with handoffs (want > 0), '$h0' without (want 0)"
# A --dram-budget with room keeps each step's gradients in DRAM (batch-major, no accumulation) and the
# tied embedding from its lookup to the head: no gradient written to NVMe, the same bits.
run st-keep "${small[@]}" --steps 4 --subgroup-size 4096 --offload-params nvme --schedule batch-major \
  --prefetch-depth 1 --nvme-dir "$dir/nvme" --dram-budget 4GiB
same ref-a1 st-keep
grep -q 'chose: .*gradients kept in DRAM between steps, the tied embedding kept for the head' "$dir/st-keep.out" && ok \
  || bad "a roomy --dram-budget did not keep the gradients: $(grep -m1 chose "$dir/st-keep.out")"
grep -q 'gradients written 0 B' "$dir/st-keep.out" && ! grep -q 'gradients written 0 B' "$dir/st-a1-d1.out" && ok \
  || bad "kept gradients were written to NVMe: $(grep -m1 'gradients written' "$dir/st-keep.out")"
# the schedules: auto above is layer-major for accumulation > 1; batch-major streamed and
# layer-major resident give the same bits too
run st-bm "${small[@]}" --steps 4 --grad-accum 2 --subgroup-size 4096 --offload-params nvme --nvme-dir "$dir/nvme" \
  --schedule batch-major
same ref-a2 st-bm
grep -q 'schedule batch-major' "$dir/st-bm.out" && grep -q 'schedule layer-major' "$dir/st-a2-d1.out" && ok \
  || bad "the schedule in use is not printed"
run lm-res "${small[@]}" --steps 4 --grad-accum 2 --schedule layer-major
same ref-a2 lm-res
# the blocks' activations: kept on NVMe by default when streaming, recomputed when asked
grep -q 'block activations on NVMe' "$dir/st-a2-d1.out" && grep -q 'block activations recomputed' "$dir/st-a2--recompute-d1.out" \
  && grep -q 'block activations on NVMe' "$dir/st-a1-d0.out" && ok || bad "where the activations are is not printed"
run st-a2-rc "${small[@]}" --steps 4 --grad-accum 2 --subgroup-size 4096 --offload-params nvme --nvme-dir "$dir/nvme" \
  --activations recompute
same ref-a2 st-a2-rc
grep -q 'block activations recomputed' "$dir/st-a2-rc.out" && ok || bad "--activations recompute not in effect"
# the update overlapped with the next forward (default) == finished inside its step
run st-sync "${small[@]}" --steps 4 --subgroup-size 4096 --offload-params nvme --nvme-dir "$dir/nvme" --sync-update
same ref-a1 st-sync
run opt-sync "${small[@]}" --steps 4 --subgroup-size 4096 --optimizer-tier nvme --nvme-dir "$dir/nvme" --sync-update
same ref-a1 opt-sync
# the optimizer-only NVMe run is the same too (weights resident, master on NVMe)
run opt-nvme "${small[@]}" --steps 4 --subgroup-size 4096 --optimizer-tier nvme --nvme-dir "$dir/nvme"
same ref-a1 opt-nvme
# one subgroup for the whole model (the default size is larger than the model)
run ref-one "${small[@]}" --steps 3
run st-one "${small[@]}" --steps 3 --offload-params nvme --nvme-dir "$dir/nvme"
same ref-one st-one
grep -q 'streaming: weights and gradients on NVMe' "$dir/st-one.out" && grep -q 'planned DRAM peak' "$dir/st-one.out" \
  && grep -q 'measured peak resident set (VmHWM)' "$dir/st-one.out" && ok || bad "streamed run does not print its plan and peak"
grep -q '"nvme_read_bytes":[1-9]' "$dir/st-one.jsonl" && ok || bad "streamed run logs no NVMe reads"

# 2. A streamed checkpoint resumes bitwise (and equals the resident run's checkpoint).
run full "${small[@]}" --steps 4 --grad-accum 2 --subgroup-size 4096 --offload-params nvme --nvme-dir "$dir/nvme" \
  --ckpt-every 2
"$cli" train --resume "$dir/full/ckpt_00000002.mwck" --sample-len 0 --subgroup-size 4096 --offload-params nvme \
  --nvme-dir "$dir/nvme" --log-json "$dir/res.jsonl" --out-dir "$dir/res" >"$dir/res.out" 2>&1 \
  || { bad "streamed resume failed"; tail -5 "$dir/res.out"; }
want=$(losses "$dir/full.jsonl" | grep -E '"step":(3|4),')
[ -n "$want" ] && [ "$want" = "$(losses "$dir/res.jsonl")" ] && ok || bad "resumed streamed losses differ"
ckpt_state_eq "$dir/full/ckpt_00000004.mwck" "$dir/res/ckpt_00000004.mwck" && ok || bad "resumed streamed checkpoint differs"
cmp -s "$dir/full/model.safetensors" "$dir/ref-a2/model.safetensors" && ok || bad "streamed run's weights differ from resident"

# 3. Budgets. Too small: refused up front, exit 1, with the numbers and what to change.
"$cli" train "${small[@]}" --steps 2 --offload-params nvme --nvme-dir "$dir/nvme" --dram-budget 4M >"$dir/b.out" 2>&1
rc=$?
[ $rc = 1 ] && grep -q 'DRAM budget 4.00 MiB is too small' "$dir/b.out" && grep -q 'needs [0-9.]* MiB' "$dir/b.out" \
  && ! grep -q '^step' "$dir/b.out" && ok || { bad "--dram-budget 4M: exit $rc, want 1 with the numbers"; cat "$dir/b.out"; }
# One that fits holds, on a model (4 blocks of width 1024: 50 M parameters, 201 MB of fp32
# weights, as much again of gradients) whose resident run would not fit in the budget.
big=(--preset tiny --layers 4 --width 1024 --heads 8 --data "$data" --threads 2 --sample-len 0 --batch 1 --seq 32
     --val-every 0 --steps 2 --recompute --offload-params nvme --nvme-dir "$dir/nvme" --subgroup-size 1M
     --buffer-count 4 --prefetch-depth 1 --dram-budget 320M)
"$cli" train "${big[@]}" >"$dir/big.out" 2>&1 || { bad "budgeted streamed run failed"; tail -5 "$dir/big.out"; }
hwm=$(grep -o 'VmHWM) [0-9.]* MiB' "$dir/big.out" | grep -o '[0-9.]*')
params=$(grep -o '(\([0-9]*\) params' "$dir/big.out" | grep -o '[0-9]*')
[ -n "$hwm" ] && awk -v h="$hwm" 'BEGIN { exit !(h <= 320) }' && ok || bad "VmHWM ${hwm:-?} MiB over the 320 MiB budget"
[ -n "$params" ] && [ $((params * 8)) -gt $((320 << 20)) ] && ok || bad "the budget test's model ($params params) would fit resident"
planned=$(grep -o 'planned DRAM peak [0-9.]* MiB' "$dir/big.out" | grep -o '[0-9][0-9.]*')
[ -n "$planned" ] && awk -v h="$hwm" -v p="$planned" 'BEGIN { r = h / p; exit !(r > 0.95 && r < 1.05) }' && ok \
  || bad "measured $hwm MiB vs planned $planned MiB: not within the plan's tolerance"
# the same with the blocks' activations on NVMe (not recomputed), two micro-batches per step
bigk=(--grad-accum 2)
for x in "${big[@]}"; do [ "$x" = --recompute ] || bigk+=("$x"); done
"$cli" train "${bigk[@]}" >"$dir/bigk.out" 2>&1 || { bad "budgeted run with activations on NVMe failed"; tail -5 "$dir/bigk.out"; }
hwm=$(grep -o 'VmHWM) [0-9.]* MiB' "$dir/bigk.out" | grep -o '[0-9.]*')
planned=$(grep -o 'planned DRAM peak [0-9.]* MiB' "$dir/bigk.out" | grep -o '[0-9][0-9.]*')
grep -q 'block activations on NVMe' "$dir/bigk.out" && [ -n "$planned" ] && [ -n "$hwm" ] \
  && awk -v h="$hwm" -v p="$planned" 'BEGIN { r = h / p; exit !(h <= 320 && r > 0.95 && r < 1.05) }' && ok \
  || bad "activations on NVMe: measured ${hwm:-?} MiB vs planned ${planned:-?} MiB (budget 320 MiB)"

# memwall plan --stream describes the same run with the same figures (all but the runtime, which
# each process measures for itself).
cfgj="$dir/config.json"
printf '%s\n' '{"model_type": "gpt2", "n_layer": 4, "n_head": 8, "n_embd": 1024, "n_positions": 32, "n_ctx": 32,' \
  ' "vocab_size": 257, "activation_function": "gelu_new", "tie_word_embeddings": true}' >"$cfgj"
"$cli" plan --model "$cfgj" --stream --micro-batch 1 --seq 32 --recompute full --threads 2 --subgroup-size 1M \
  --buffer-count 4 --prefetch-depth 1 --dram-budget 320M >"$dir/plan.out" 2>&1 || { bad "memwall plan --stream failed"; cat "$dir/plan.out"; }
parts() { grep -o 'activations [0-9.]* [KMG]iB + optimizer staging [0-9.]* [KMG]iB + streamed weights and gradients [0-9.]* [KMG]iB' "$1"; }
[ -n "$(parts "$dir/plan.out")" ] && [ "$(parts "$dir/plan.out")" = "$(parts "$dir/big.out")" ] && ok \
  || { bad "memwall plan --stream differs from the trainer's plan"; parts "$dir/plan.out"; parts "$dir/big.out"; }
grep -q -- '--dram-budget 320.00 MiB: fits' "$dir/plan.out" && ok || bad "plan --stream does not check the budget"
"$cli" plan --model "$cfgj" --stream --micro-batch 1 --seq 32 --dram-budget 1M >"$dir/plan2.out" 2>&1
[ $? = 1 ] && grep -q 'does not fit' "$dir/plan2.out" && ok || bad "plan --stream: a short budget is not reported (exit 1)"
"$cli" plan --model mixtral-8x7b --stream >"$dir/plan3.out" 2>&1
[ $? = 2 ] && grep -q 'mixture of experts is not implemented' "$dir/plan3.out" && ok \
  || bad "plan --stream accepted a model memwall does not train (mixture of experts)"
# ... and for the Llama family: a directory's config.json, planned as the trainer plans it (its
# units and their order from the model table; layer-major with the blocks' activations on NVMe,
# and batch-major)
fx="$MW_SOURCE_DIR/tests/fixtures/llama"
for sched in layer-major batch-major; do
  "$cli" plan --model "$fx/llama3_untied" --stream --micro-batch 2 --seq 16 --grad-accum 2 --threads 2 \
    --subgroup-size 4096 --buffer-count 3 --prefetch-depth 1 --schedule $sched >"$dir/lp_$sched.out" 2>&1 \
    || { bad "plan --stream of a Llama directory failed"; cat "$dir/lp_$sched.out"; }
  "$cli" train --init-hf "$fx/llama3_untied" --data "$fx/eval_ids.bin" --batch 2 --seq 16 --grad-accum 2 --steps 2 \
    --val-every 0 --sample-len 0 --threads 2 --offload-params nvme --subgroup-size 4096 --buffer-count 3 \
    --prefetch-depth 1 --schedule $sched --nvme-dir "$dir/lnv_$sched" >"$dir/lt_$sched.out" 2>&1 \
    || { bad "streamed Llama run failed"; tail -5 "$dir/lt_$sched.out"; }
  [ -n "$(parts "$dir/lp_$sched.out")" ] && [ "$(parts "$dir/lp_$sched.out")" = "$(parts "$dir/lt_$sched.out")" ] && ok \
    || { bad "Llama $sched: memwall plan --stream differs from the trainer's plan"; parts "$dir/lp_$sched.out"; parts "$dir/lt_$sched.out"; }
done

# 4. Usage errors (exit 2) with a message.
"$cli" train "${small[@]}" --steps 1 --offload-params nvme --optimizer-tier dram >"$dir/u1.out" 2>&1
[ $? = 2 ] && grep -q 'need the optimizer state on NVMe (tier nvme)' "$dir/u1.out" && ok || bad "--offload-params nvme with a dram optimizer not refused"
# every conflict of the placement and schedule at once, in one message (src/train/resolve.c)
"$cli" train "${small[@]}" --steps 1 --offload-params nvme --optimizer-tier dram --activations nvme --recompute \
  --aio-block-size 1000 >"$dir/u2.out" 2>&1
[ $? = 2 ] && grep -q 'optimizer state on NVMe' "$dir/u2.out" && grep -q 'recomputation (recompute)' "$dir/u2.out" \
  && grep -q 'multiple of 4096 bytes' "$dir/u2.out" && ok || { bad "not every conflict named"; cat "$dir/u2.out"; }
# a fine-tune from a weights file streams too: the file is verified, then loaded a unit at a time
run init-res "${small[@]}" --steps 3 --grad-accum 2 --init-safetensors "$dir/ref-one/model.safetensors" --seed 7
run init-st "${small[@]}" --steps 3 --grad-accum 2 --init-safetensors "$dir/ref-one/model.safetensors" --seed 7 \
  --subgroup-size 4096 --offload-params nvme --nvme-dir "$dir/nvme"
same init-res init-st
head -c 2000 "$dir/ref-one/model.safetensors" >"$dir/cut.safetensors"
"$cli" train "${small[@]}" --steps 1 --offload-params nvme --nvme-dir "$dir/nvme" \
  --init-safetensors "$dir/cut.safetensors" >"$dir/u2.out" 2>&1
[ $? = 1 ] && grep -q 'cut.safetensors' "$dir/u2.out" && ! grep -q '^step' "$dir/u2.out" && [ -z "$(ls "$dir/nvme" 2>/dev/null | grep dat)" ] \
  && ok || { bad "a cut weights file was not refused before the run (or left store files)"; tail -3 "$dir/u2.out"; }
"$cli" train "${small[@]}" --steps 1 --offload-params nvme --prefetch-depth 9 >"$dir/u3.out" 2>&1
[ $? = 2 ] && ok || bad "--prefetch-depth 9 accepted"
"$cli" train "${small[@]}" --steps 1 --offload-params nvme --schedule batch-major --activations nvme >"$dir/u4.out" 2>&1
[ $? = 2 ] && grep -q 'layer-major' "$dir/u4.out" && ok || bad "--activations nvme with batch-major not refused"
"$cli" train "${small[@]}" --steps 1 --offload-params nvme --activations nvme --recompute >"$dir/u5.out" 2>&1
[ $? = 2 ] && grep -q 'choose one' "$dir/u5.out" && ok || bad "--activations nvme with --recompute not refused"

echo "cli_train_stream: $pass passed, $fail failed"
[ $fail = 0 ] && rm -rf "$dir"
[ $fail = 0 ]
