#!/usr/bin/env bash
# Hugging Face model directories in and out, and `memwall eval`:
# - eval of each Llama-family fixture directory (tests/fixtures/llama: Llama with GQA and a tied
#   head, Qwen2 with q/k/v bias, Llama with llama3 RoPE scaling and an untied head) over the
#   consecutive windows of eval_ids.bin equals transformers' loss (eval_expected.json, written by
#   scripts/gen_eval_fixtures.py) within 1e-4;
# - train --init-hf DIR picks the family from config.json, --save-hf OUT writes config.json and
#   model.safetensors, and OUT evaluates as the trained model (GPT-2 and Llama); --out-dir gets
#   the same two files; a checkpoint evaluates as the directory saved with it (eval --resume);
# - hostile and usage: no config.json, an unknown model_type (named), both or neither model
#   sources, no --data, a --seq beyond the context: a message and exit 1 or 2.
# No Python: the transformers side is the committed fixture (python/tests/test_hf_dirs.py loads
# memwall's output in transformers).
set -u
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
fx="$src/tests/fixtures/llama"
tmp=$(mktemp -d "${MW_BUILD_DIR:-/tmp}/cli_hf.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
expect() { # expect CODE cmd...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" != "$want" ]; then bad "'$*' exited $got, want $want"; head -c 2000 "$tmp/out" "$tmp/err"; fi
}
has() { grep -q -e "$1" -- "$2" || bad "$3: '$1' not in $(head -c 600 -- "$2")"; }
loss_of() { sed -n 's/.*"loss": \([0-9.e+-]*\).*/\1/p' "$1"; }
near() { # near A B TOL WHAT
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }' \
    || bad "$4: $1 vs $2 (tolerance $3)"
}
want() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" "$fx/eval_expected.json"; }

# eval against transformers' figures
for n in llama_gqa_tied qwen2_bias llama3_untied; do
  expect 0 "$cli" eval --init-hf "$fx/$n" --data "$fx/eval_ids.bin" --seq 16 --batch 5 --json
  near "$(loss_of "$tmp/out")" "$(want "$n")" 1e-4 "eval of $n against transformers"
  has '"windows": 249' "$tmp/out" "eval of $n: every whole window"
done

# Llama: train from a directory, save one, evaluate it; the checkpoint evaluates the same
run="$tmp/llama"
mkdir -p "$run"
expect 0 "$cli" train --init-hf "$fx/llama3_untied" --data "$fx/eval_ids.bin" --batch 2 --seq 16 --steps 3 \
  --val-every 0 --sample-len 0 --save-hf "$run/hf" --out-dir "$run/out" --ckpt-every 3
has 'a Hugging Face directory' "$tmp/out" "--save-hf says what it wrote"
for f in config.json model.safetensors; do
  [ -s "$run/hf/$f" ] || bad "--save-hf wrote no $f"
  [ -s "$run/out/$f" ] || bad "--out-dir got no $f"
done
has '"rope_type"' "$run/hf/config.json" "the llama3 scaling is written"
expect 0 "$cli" eval --init-hf "$run/hf" --data "$fx/eval_ids.bin" --seq 16 --json
a=$(loss_of "$tmp/out")
expect 0 "$cli" eval --resume "$run/out/ckpt_00000003.mwck" --data "$fx/eval_ids.bin" --seq 16 --json
near "$(loss_of "$tmp/out")" "$a" 0 "the checkpoint and the saved directory hold the same model"
near "$a" "$(want llama3_untied)" 1 "the trained model evaluates near the start"
[ "$a" != "$(want llama3_untied)" ] || bad "training changed nothing"
# ... and the saved directory trains on (its config.json is read back)
expect 0 "$cli" train --init-hf "$run/hf" --data "$fx/eval_ids.bin" --batch 2 --seq 16 --steps 1 --val-every 0 \
  --sample-len 0

# --tokenizer: the sample is text, the saved directory gets tokenizer.json (and --init-hf of it finds it)
expect 0 "$cli" train --init-hf "$fx/qwen2_bias" --tokenizer "$src/tests/fixtures/tok/qwen2" --data "$fx/eval_ids.bin" \
  --batch 2 --seq 16 --steps 1 --val-every 0 --sample-len 8 --save-hf "$run/q"
cmp -s "$src/tests/fixtures/tok/qwen2/tokenizer.json" "$run/q/tokenizer.json" || bad "--save-hf did not copy the tokenizer"
expect 0 "$cli" train --init-hf "$run/q" --data "$fx/eval_ids.bin" --batch 2 --seq 16 --steps 1 --val-every 0 --sample-len 8
awk '/^sample \(/ { f = 1; next } f && /^----/ { if (++c == 2) exit; next } f' "$tmp/out" >"$tmp/sample"
[ -s "$tmp/sample" ] || bad "no sample printed"
grep -Eq '^[0-9]+( [0-9]+)+$' "$tmp/sample" && bad "the sample was printed as ids, not through the tokenizer"
expect 2 "$cli" train --init-hf "$fx/qwen2_bias" --tokenizer "$tmp/none.json" --data "$fx/eval_ids.bin" --steps 1

# GPT-2 through the same path
g="$tmp/gpt2"
expect 0 "$cli" train --preset demo --steps 2 --val-every 0 --sample-len 0 --save-hf "$g"
has '"model_type":	"gpt2"' "$g/config.json" "GPT-2's config.json"
head -c 20000 "$src/data/kjv_excerpt.txt" >"$tmp/small.txt"
expect 0 "$cli" eval --init-hf "$g" --data "$tmp/small.txt" --seq 64 --batch 8
has 'nats per token over' "$tmp/out" "eval's line names its unit"
expect 0 "$cli" train --init-hf "$g" --steps 1 --val-every 0 --sample-len 0

# hostile and usage
mkdir -p "$tmp/empty" "$tmp/alien"
expect 1 "$cli" eval --init-hf "$tmp/empty" --data "$fx/eval_ids.bin"
has 'not a Hugging Face model directory' "$tmp/err" "a directory without config.json"
printf '{"model_type": "mamba"}' >"$tmp/alien/config.json"
expect 1 "$cli" train --init-hf "$tmp/alien" --steps 1
has 'model_type "mamba" is not one memwall trains' "$tmp/err" "an unknown model_type is named"
printf '{"model_type": 7}' >"$tmp/alien/config.json"
expect 1 "$cli" eval --init-hf "$tmp/alien" --data "$fx/eval_ids.bin"
expect 2 "$cli" eval --data "$fx/eval_ids.bin"
expect 2 "$cli" eval --init-hf "$fx/llama_gqa_tied" --resume x.mwck --data "$fx/eval_ids.bin"
expect 2 "$cli" eval --init-hf "$fx/llama_gqa_tied"
expect 2 "$cli" eval --init-hf "$fx/llama_gqa_tied" --data "$fx/eval_ids.bin" --seq 4096
expect 1 "$cli" eval --init-hf "$fx/llama_gqa_tied" --data "$tmp/small.txt" --seq 16
has "the model's vocabulary is 67" "$tmp/err" "tokens beyond the vocabulary"
expect 2 "$cli" train --init-hf "$fx/llama_gqa_tied" --init-safetensors "$fx/llama_gqa_tied/model.safetensors" --steps 1
exit $fail
