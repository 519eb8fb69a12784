#!/usr/bin/env bash
# The Llama family under data parallelism (issue 24): what tests/mpi_train_cli.sh and
# tests/mpi_train_stream.sh check for GPT-2, for models made with `--init-hf DIR` from the fixtures in
# tests/fixtures/llama (llama_gqa_tied: grouped-query attention and a tied head, so the embedding's
# gradient comes from both ends of the step; llama3_untied: an untied head, which ZeRO-3 gathers with
# the final norm as one unit, and llama3 RoPE; qwen2_bias: q/k/v biases, one key/value head).
#  1. `mpirun -np 2 memwall train --zero S` with global batch B gives the losses, validation losses
#     and gradient norms of 1 rank with global batch B (relative 2e-5, as for GPT-2), for ZeRO 0-3,
#     two micro-steps per step (stages 2-3 reduce every micro-step), tied and untied heads; the
#     optimizer state in DRAM, and for ZeRO-3 on NVMe too. A ZeRO-3 run ends with its memory report
#     and exit 0 (it once failed there, after the last step: the planner's prediction was GPT-2's
#     and refused a model without position rows). Training moved the weights (the last
#     validation loss is not the first).
#  2. For ZeRO 0-3, the run with the weights streamed from NVMe (`--offload-params nvme`, layer-major,
#     the default when weights stream; each rank its own NVMe directory) gives bitwise the losses,
#     validation losses, gradient norms, final model.safetensors and generated sample of the same
#     2-rank run with the weights in DRAM (optimizer on NVMe, same subgroups); accumulation 1 and 2,
#     prefetch depth 0 to 3, with and without --recompute. At accumulation 2 with ZeRO-2/3 the
#     layer-major run sums a unit's micro-batches before its one reduce-scatter (ZeRO-1's order), so
#     it equals the ZeRO-1 run in DRAM bitwise. (Not always ZeRO-0's, which tests/mpi_train_stream.sh
#     uses for GPT-2: ZeRO-0 takes the gradient norm over the whole array, ZeRO 1-3 each rank's owned
#     range then the ranks' sums, and with a tied head those round differently in the last bit.)
#  3. Per-rank checkpoints of a streamed ZeRO-3 Llama run resume bitwise (losses and final model).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib_mpi_train.sh" mpi_train_llama
fx="$MW_SOURCE_DIR/tests/fixtures/llama"
COMMON=(--data "$fx/eval_ids.bin" --batch 4 --seq 16 --steps 4 --val-every 2 --threads 1)
declare -A HF=([u]=llama3_untied [t]=llama_gqa_tied [q]=qwen2_bias)
sample() { sed -n '/^sample (/,/^log:/p' "$1" | grep -v '^log:'; }
vals() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }

# 1. one rank against two, ZeRO 0-3
for f in t u; do
  hf=(--init-hf "$fx/${HF[$f]}")
  run one_$f "$M" train "${hf[@]}" "${COMMON[@]}" --grad-accum 2 --sample-len 0 --log-json one_$f.json || continue
  [ "$(vals one_$f.json | wc -l)" = 3 ] && [ "$(vals one_$f.json | head -1)" != "$(vals one_$f.json | tail -1)" ] \
    || bad "${HF[$f]}: the validation loss did not move: $(vals one_$f.json | tr '\n' ' ')"
  for z in 0 1 2 3; do
    n=two_${f}_z$z
    run $n "${MPI[@]}" "$M" train "${hf[@]}" "${COMMON[@]}" --grad-accum 2 --sample-len 0 --zero $z --log-json $n.json \
      || continue
    grep -q "data parallel: 2 ranks.*ZeRO-$z" $n.out || bad "$n: no 2-rank ZeRO-$z line"
    grep -q '^memwall train: Llama' $n.out || bad "$n: not a Llama model"
    compare one_$f.json $n.json || bad "$n differs from one rank"
  done
  grep -q '^ZeRO-3 weights per rank: peak resident' two_${f}_z3.out && grep -q 'planner predicts' two_${f}_z3.out \
    || bad "${HF[$f]}: the ZeRO-3 run printed no weight memory report"
done
run one_qn "$M" train --init-hf "$fx/qwen2_bias" "${COMMON[@]}" --grad-accum 2 --sample-len 0 --optimizer-tier nvme \
    --nvme-dir "$dir/n1q" --log-json one_qn.json &&
run two_qn "${MPI[@]}" "$M" train --init-hf "$fx/qwen2_bias" "${COMMON[@]}" --grad-accum 2 --sample-len 0 --zero 3 \
    --optimizer-tier nvme --nvme-dir "$dir/n2q.%r" --log-json two_qn.json && {
  compare one_qn.json two_qn.json || bad "qwen2_bias, ZeRO-3, optimizer on NVMe: 2 ranks differ from one"
  [ -d "$dir/n2q.0" ] && [ -d "$dir/n2q.1" ] || bad "qwen2_bias: no per-rank NVMe directories"
}

# 2. streamed against DRAM weights: fixture, stage, accumulation, prefetch depth, recompute
cases=("u 0 2 0" "u 0 1 3 --recompute" "u 1 1 1" "u 1 2 2" "u 2 2 3" "u 2 1 0 --recompute" "u 3 2 2" "u 3 1 1"
       "u 3 2 0 --recompute" "t 0 2 1" "t 1 2 0" "t 3 2 2" "t 3 1 0 --recompute" "q 1 2 2" "q 2 1 1" "q 3 2 1")
declare -A Z1=([u]=u_z1_a2_d2 [t]=t_z1_a2_d0 [q]=q_z1_a2_d2) # each fixture's ZeRO-1 case at accumulation 2
for c in "${cases[@]}"; do
  set -- $c
  f=$1 z=$2 acc=$3 depth=$4; shift 4
  n="${f}_z${z}_a${acc}_d${depth}${1:+_rc}"
  args=(--init-hf "$fx/${HF[$f]}" "${COMMON[@]}" --sample-len 8 --subgroup-size 2048 --zero "$z" --grad-accum "$acc" "$@")
  run res_$n "${MPI[@]}" "$M" train "${args[@]}" --optimizer-tier nvme --nvme-dir "$dir/nr_$n.%r" \
      --out-dir "out_res_$n" --log-json res_$n.json || continue
  run st_$n "${MPI[@]}" "$M" train "${args[@]}" --offload-params nvme --prefetch-depth $depth \
      --nvme-dir "$dir/ns_$n.%r" --out-dir "out_st_$n" --log-json st_$n.json || continue
  grep -q 'streaming: weights and gradients on NVMe' st_$n.out && grep -q "prefetch depth $depth, schedule layer-major" st_$n.out \
    || bad "$n: the streamed run does not say it streams (layer-major, the default, depth $depth)"
  grep -q 'streaming: weights' res_$n.out && bad "$n: the DRAM run streams"
  if [ $z -ge 1 ]; then grep -q 'each rank reads its own shard and all-gathers' st_$n.out || bad "$n: no shard line"; fi
  [ -d "$dir/ns_$n.0" ] && [ -d "$dir/ns_$n.1" ] || bad "$n: no per-rank NVMe directories"
  grep -q '"nvme_read_bytes":[1-9]' st_$n.json || bad "$n: the streamed run logs no NVMe reads"
  ref=$n
  [ $z -ge 2 ] && [ $acc -gt 1 ] && ref=${Z1[$f]} # ZeRO-1's order of sums and norm (header)
  [ -f res_$ref.json ] || { bad "$n: no reference run $ref"; continue; }
  compare res_$ref.json st_$n.json exact || bad "$n: streamed losses differ from the DRAM run $ref"
  cmp -s out_res_$ref/model.safetensors out_st_$n/model.safetensors \
    && echo "  $n: model.safetensors bitwise equal to $ref in DRAM" || bad "$n: streamed final weights differ from $ref"
  s1=$(sample res_$ref.out) s2=$(sample st_$n.out)
  [ -n "$s1" ] && [ "$s1" = "$s2" ] || bad "$n: generated samples differ: '$s2' against '$s1'"
done

# 3. per-rank checkpoints of a streamed ZeRO-3 run, resumed at step 2
run ck "${MPI[@]}" "$M" train --init-hf "$fx/llama3_untied" "${COMMON[@]}" --sample-len 0 --zero 3 --grad-accum 2 \
    --subgroup-size 2048 --offload-params nvme --nvme-dir "$dir/nck.%r" --out-dir ck --ckpt-every 2 --log-json ck.json && {
  [ -f ck/ckpt_00000002.r0.mwck ] && [ -f ck/ckpt_00000002.r1.mwck ] || bad "no per-rank checkpoints"
  tail -n 2 ck.json > ck_tail.json
  run resume "${MPI[@]}" "$M" train --resume 'ck/ckpt_00000002.r%r.mwck' --offload-params nvme \
      --nvme-dir "$dir/nrs.%r" --out-dir ckr --log-json resume.json \
    && { compare ck_tail.json resume.json exact || bad "resumed streamed Llama run differs from the uninterrupted one"; }
  grep -q 'streaming: weights' resume.out || bad "the resumed run does not stream"
  grep -q '^memwall train: Llama' resume.out || bad "the resumed run is not a Llama model"
  cmp -s ck/model.safetensors ckr/model.safetensors && echo "  resumed at step 2: model.safetensors bitwise equal" \
    || bad "the resumed run's final model differs"
}

cd / && [ $fail = 0 ] && rm -rf "$dir" && echo "PASS"
exit $fail
