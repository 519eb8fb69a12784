#!/usr/bin/env bash
# Sharded Hugging Face checkpoints (model.safetensors.index.json + shards) through the CLI:
# - eval of tests/fixtures/llama/sharded (llama3_untied sharded by transformers'
#   save_pretrained(max_shard_size="50KB"), scripts/gen_llama_fixtures.py) prints exactly the loss
#   of the unsharded llama3_untied, which is transformers' within 1e-4;
# - generate --init-hf of it continues a prompt (greedy) as the unsharded directory does;
# - train --init-hf of it prints exactly the losses of the unsharded run, resident and with the
#   weights streamed from NVMe (--offload-params nvme: the unit-at-a-time loader);
# - GPT-2: a directory memwall saves, split in 3 by the python-free splitter of
#   tests/test_tensor_source.c: eval and train give exactly the unsharded figures;
# - model.safetensors beside a broken index is what is read (as transformers does);
# - hostile indexes: eval and train exit 1 naming the file and the key (no weight_map, a shard
#   outside the directory, a missing shard, a tensor in a shard that does not hold it, a tensor
#   in two shards), and a directory with neither weights file says so.
set -u
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
build=${MW_BUILD_DIR:?}
fx="$src/tests/fixtures/llama"
tmp=$(mktemp -d "$build/cli_hf_sharded.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
expect() { # expect CODE cmd...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" != "$want" ]; then bad "'$*' exited $got, want $want"; head -c 2000 "$tmp/out" "$tmp/err"; fi
}
has() { grep -q -F -e "$1" -- "$2" || bad "$3: '$1' not in $(head -c 600 -- "$2")"; }
loss_of() { sed -n 's/.*"loss": \([0-9.e+-]*\).*/\1/p' "$1"; }
losses() { grep -o 'step *[0-9]*/[0-9]* | loss [0-9.]*' "$1"; }
want() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" "$fx/eval_expected.json"; }
near() { # near A B TOL WHAT
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }' \
    || bad "$4: $1 vs $2 (tolerance $3)"
}
ev=(--data "$fx/eval_ids.bin" --seq 16 --batch 5 --json)
tr=(--data "$fx/eval_ids.bin" --batch 2 --seq 16 --steps 2 --val-every 0 --sample-len 0)

# Llama: eval and train, sharded = unsharded, to the bit
expect 0 "$cli" eval --init-hf "$fx/llama3_untied" "${ev[@]}"
one=$(loss_of "$tmp/out")
expect 0 "$cli" eval --init-hf "$fx/sharded" "${ev[@]}"
[ -n "$one" ] && [ "$(loss_of "$tmp/out")" = "$one" ] || bad "sharded eval $(loss_of "$tmp/out") != unsharded $one"
near "$(loss_of "$tmp/out")" "$(want llama3_untied)" 1e-4 "sharded eval against transformers"
expect 0 "$cli" generate --init-hf "$fx/llama3_untied" --prompt-ids "1 2 3" --max-new-tokens 6 --temperature 0
head -1 "$tmp/out" >"$tmp/g1"
expect 0 "$cli" generate --init-hf "$fx/sharded" --prompt-ids "1 2 3" --max-new-tokens 6 --temperature 0
head -1 "$tmp/out" >"$tmp/g2"
[ -s "$tmp/g1" ] && cmp -s "$tmp/g1" "$tmp/g2" || bad "generate: sharded $(cat "$tmp/g2") vs $(cat "$tmp/g1")"
for mode in resident stream; do
  x1=(); x2=()
  [ $mode = stream ] && x1=(--offload-params nvme --nvme-dir "$tmp/n1") && x2=(--offload-params nvme --nvme-dir "$tmp/n2")
  expect 0 "$cli" train --init-hf "$fx/llama3_untied" "${tr[@]}" "${x1[@]}"
  losses "$tmp/out" >"$tmp/l1"
  expect 0 "$cli" train --init-hf "$fx/sharded" "${tr[@]}" "${x2[@]}"
  losses "$tmp/out" >"$tmp/l2"
  [ "$(wc -l <"$tmp/l1")" = 2 ] && cmp -s "$tmp/l1" "$tmp/l2" || bad "train $mode: sharded $(cat "$tmp/l2") vs $(cat "$tmp/l1")"
done

# GPT-2: memwall's directory, split in 3 by the test's splitter
g="$tmp/gpt2"
expect 0 "$cli" train --preset demo --steps 1 --val-every 0 --sample-len 0 --save-hf "$g"
mkdir -p "$tmp/gpt2s"
expect 0 "$build/test_tensor_source" split "$g" "$tmp/gpt2s" 3
[ -s "$tmp/gpt2s/model.safetensors.index.json" ] && [ -s "$tmp/gpt2s/model-00003-of-00003.safetensors" ] \
  || bad "the splitter wrote no sharded directory"
head -c 20000 "$src/data/kjv_excerpt.txt" >"$tmp/small.txt"
expect 0 "$cli" eval --init-hf "$g" --data "$tmp/small.txt" --seq 64 --batch 8 --json
one=$(loss_of "$tmp/out")
expect 0 "$cli" eval --init-hf "$tmp/gpt2s" --data "$tmp/small.txt" --seq 64 --batch 8 --json
[ -n "$one" ] && [ "$(loss_of "$tmp/out")" = "$one" ] || bad "GPT-2 sharded eval $(loss_of "$tmp/out") != $one"
expect 0 "$cli" train --init-hf "$g" --steps 2 --val-every 0 --sample-len 0
losses "$tmp/out" >"$tmp/l1"
expect 0 "$cli" train --init-hf "$tmp/gpt2s" --steps 2 --val-every 0 --sample-len 0
losses "$tmp/out" >"$tmp/l2"
[ "$(wc -l <"$tmp/l1")" = 2 ] && cmp -s "$tmp/l1" "$tmp/l2" || bad "GPT-2 train: sharded $(cat "$tmp/l2") vs $(cat "$tmp/l1")"

# model.safetensors beside a (broken) index wins, as in transformers
h="$tmp/both"
cp -r "$fx/sharded" "$h"
cp "$fx/llama3_untied/model.safetensors" "$h/"
echo 'not json' >"$h/model.safetensors.index.json"
expect 0 "$cli" eval --init-hf "$h" "${ev[@]}"
near "$(loss_of "$tmp/out")" "$(want llama3_untied)" 1e-4 "model.safetensors beside an index"

# hostile indexes: exit 1, the file and the key named (eval and train alike)
idx=model.safetensors.index.json
hostile() { # hostile NAME SED-SCRIPT|- MESSAGE
  local d="$tmp/h-$1"
  rm -rf "$d"; cp -r "$fx/sharded" "$d"
  [ "$2" != - ] && sed -i -e "$2" "$d/$idx"
  [ "$1" = missing ] && rm "$d/model-00002-of-00003.safetensors"
  expect 1 "$cli" eval --init-hf "$d" "${ev[@]}"
  has "$3" "$tmp/err" "eval, $1"
  has "$idx" "$tmp/err" "eval, $1: the index is named"
  expect 1 "$cli" train --init-hf "$d" "${tr[@]}"
  has "$3" "$tmp/err" "train, $1"
}
hostile no-weight-map 's/"weight_map"/"weights"/' 'no "weight_map"'
hostile outside 's|"model-00002-of-00003.safetensors"|"../llama3_untied/model.safetensors"|' "has a '/'"
hostile dotdot 's|"model-00002-of-00003.safetensors"|"..model.safetensors"|' 'has ".."'
hostile missing - 'shard model-00002-of-00003.safetensors'
hostile wrong-shard 's|"model.embed_tokens.weight": "model-00001|"model.embed_tokens.weight": "model-00003|' \
  'puts tensor "model.embed_tokens.weight" in model-00003-of-00003.safetensors, but it is in'
hostile absent 's|"lm_head.weight": "\([^"]*\)"|"lm_head.weight": "\1", "lm_head.bias": "\1"|' \
  'puts tensor "lm_head.bias" in'
d="$tmp/h-two"
rm -rf "$d"; cp -r "$fx/sharded" "$d"
cp "$fx/llama3_untied/model.safetensors" "$d/extra.safetensors"
sed -i 's|"model.norm.weight": "[^"]*"|"model.norm.weight": "extra.safetensors"|' "$d/$idx"
expect 1 "$cli" eval --init-hf "$d" "${ev[@]}"
has 'is in two shards' "$tmp/err" "a tensor in two shards"
mkdir -p "$tmp/none"
cp "$fx/llama3_untied/config.json" "$tmp/none/"
expect 1 "$cli" eval --init-hf "$tmp/none" "${ev[@]}"
has 'neither model.safetensors nor model.safetensors.index.json' "$tmp/err" "a directory without weights"
exit $fail
