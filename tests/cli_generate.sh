#!/usr/bin/env bash
# `memwall generate` (src/cli/cmd_generate.c; the decoding itself is checked against full forwards
# in tests/test_generate.c):
# - --help names every option; the Llama-family fixture directories (no tokenizer.json) generate
#   ids from --prompt-ids; greedy (--temperature 0) equals --top-k 1 and a tiny --top-p; a seeded
#   sample is the same twice; --eos stops after itself; the context stops with a message;
# - text: a tiny byte-level tokenizer.json (34 ids, within the fixtures' vocabulary) by --tokenizer
#   and as DIR/tokenizer.json; a GPT-2 trained on bytes (vocab 257) decodes with the byte
#   tokenizer, and its checkpoint generates what its saved directory does;
# - usage errors exit 2; a missing directory, a prompt beyond the context or the vocabulary, and
#   --prompt without a tokenizer exit 1 with a message.
set -u
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
fx="$src/tests/fixtures/llama"
tmp=$(mktemp -d "${MW_BUILD_DIR:-/tmp}/cli_generate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
expect() { # expect CODE cmd...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" != "$want" ]; then bad "'$*' exited $got, want $want"; head -c 2000 "$tmp/out" "$tmp/err"; fi
}
has() { grep -q -e "$1" -- "$2" || bad "$3: '$1' not in $(head -c 600 -- "$2")"; }
gen() { "$cli" generate --threads 2 "$@"; }

# --help: every option of the table
expect 0 "$cli" generate --help
for o in init-hf resume prompt prompt-ids max-new-tokens temperature top-k top-p seed tokenizer eos ids threads; do
  has "--$o" "$tmp/out" "--help"
done

# ids from each fixture directory; greedy three ways
for n in llama_gqa_tied qwen2_bias llama3_untied; do
  expect 0 gen --init-hf "$fx/$n" --prompt-ids 1,5,2 --temperature 0 --max-new-tokens 12
  cp "$tmp/out" "$tmp/greedy"
  grep -Eq '^[0-9]+( [0-9]+){11}$' "$tmp/greedy" || bad "$n: 12 ids expected, got $(cat "$tmp/greedy")"
  has 'stop: length' "$tmp/err" "$n: the summary"
  expect 0 gen --init-hf "$fx/$n" --prompt-ids "1 5 2" --top-k 1 --seed 9 --max-new-tokens 12
  cmp -s "$tmp/out" "$tmp/greedy" || bad "$n: --top-k 1 is not greedy"
  expect 0 gen --init-hf "$fx/$n" --prompt-ids 1,5,2 --top-p 0.000001 --seed 9 --max-new-tokens 12
  cmp -s "$tmp/out" "$tmp/greedy" || bad "$n: a tiny --top-p is not greedy"
  expect 0 gen --init-hf "$fx/$n" --prompt-ids 1,5,2 --temperature 0.8 --top-k 20 --top-p 0.95 --seed 7 --max-new-tokens 12
  cp "$tmp/out" "$tmp/s1"
  expect 0 gen --init-hf "$fx/$n" --prompt-ids 1,5,2 --temperature 0.8 --top-k 20 --top-p 0.95 --seed 7 --max-new-tokens 12
  cmp -s "$tmp/out" "$tmp/s1" || bad "$n: a seeded sample differs run to run"
  first=$(cut -d' ' -f1 "$tmp/greedy")
  expect 0 gen --init-hf "$fx/$n" --prompt-ids 1,5,2 --temperature 0 --max-new-tokens 12 --eos "$first"
  [ "$(cat "$tmp/out")" = "$first" ] || bad "$n: --eos $first did not stop after it: $(cat "$tmp/out")"
  has 'stop: eos' "$tmp/err" "$n: the eos stop"
done

# the context (llama_gqa_tied: 32 positions)
expect 0 gen --init-hf "$fx/llama_gqa_tied" --prompt-ids 1,2,3,4 --max-new-tokens 100 --seed 1
has "stopped at the model's context" "$tmp/err" "the context stop is said"
has ' 28 new' "$tmp/err" "prompt + new = context"
ids33=$(seq -s, 1 33)
expect 1 gen --init-hf "$fx/llama_gqa_tied" --prompt-ids "$ids33"
has "the model's context is 32" "$tmp/err" "a prompt beyond the context"

# text through a tiny byte-level BPE tokenizer (ids 0..33; the fixtures have 67 and more)
python_free_tok() {
  printf '%s' '{"version": "1.0", "truncation": null, "padding": null,
 "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false,
   "normalized": false, "special": true}],
 "normalizer": null,
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
 "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
 "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
 "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
   "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
   "vocab": {"<|endoftext|>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "i": 9, "j": 10,
     "k": 11, "l": 12, "m": 13, "n": 14, "o": 15, "p": 16, "q": 17, "r": 18, "s": 19, "t": 20, "u": 21, "v": 22,
     "w": 23, "x": 24, "y": 25, "z": 26, "\u0120": 27, "\u0120h": 28, "\u0120e": 29, "\u0120l": 30, "\u0120o": 31,
     "he": 32, "ll": 33},
   "merges": ["\u0120 h", "\u0120 e", "\u0120 l", "\u0120 o", "h e", "l l"]}}'
}
mkdir -p "$tmp/tok" "$tmp/withtok"
python_free_tok >"$tmp/tok/tokenizer.json"
expect 0 gen --init-hf "$fx/qwen2_bias" --tokenizer "$tmp/tok" --prompt "hello world" --temperature 0 --max-new-tokens 10
[ -s "$tmp/out" ] || bad "no text from --tokenizer"
grep -Eq '^[0-9]+( [0-9]+)+$' "$tmp/out" && bad "text was printed as ids"
has '9 prompt tokens' "$tmp/err" "the prompt went through the tokenizer"
cp "$tmp/out" "$tmp/text1"
cp "$fx/qwen2_bias/config.json" "$fx/qwen2_bias/model.safetensors" "$tmp/tok/tokenizer.json" "$tmp/withtok/"
expect 0 gen --init-hf "$tmp/withtok" --prompt "hello world" --temperature 0 --max-new-tokens 10
cmp -s "$tmp/out" "$tmp/text1" || bad "DIR/tokenizer.json is not the tokenizer --tokenizer names"
expect 0 gen --init-hf "$tmp/withtok" --prompt "hello world" --temperature 0 --max-new-tokens 10 --ids
grep -Eq '^[0-9]+( [0-9]+)*$' "$tmp/out" || bad "--ids printed $(cat "$tmp/out")"
# a tokenizer larger than the model: its ids beyond the vocabulary are refused
expect 1 gen --init-hf "$fx/qwen2_bias" --tokenizer "$src/tests/fixtures/tok/gpt2" --prompt "the end of the world"
has "outside the model's vocabulary" "$tmp/err" "a prompt id beyond the vocabulary"

# GPT-2 on bytes: the byte tokenizer; the checkpoint and its saved directory agree
run="$tmp/gpt2"
mkdir -p "$run"
expect 0 "$cli" train --preset demo --steps 2 --val-every 0 --sample-len 0 --save-hf "$run/hf" --out-dir "$run/out" \
  --ckpt-every 2
expect 0 gen --init-hf "$run/hf" --prompt "And God said" --seed 3 --max-new-tokens 24
cp "$tmp/out" "$tmp/g1"
has '12 prompt tokens' "$tmp/err" "bytes: one token per byte"
expect 0 gen --resume "$run/out/ckpt_00000002.mwck" --prompt "And God said" --seed 3 --max-new-tokens 24
cmp -s "$tmp/out" "$tmp/g1" || bad "the checkpoint generates other text than its saved directory"

# usage: exit 2
expect 2 gen --prompt-ids 1
expect 2 gen --init-hf "$fx/qwen2_bias"
expect 2 gen --init-hf "$fx/qwen2_bias" --resume x.mwck --prompt-ids 1
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt a --prompt-ids 1
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt ""
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt-ids 1,x
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt-ids ,
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt-ids 1 --top-p 0
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt-ids 1 --top-p 1.5
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt-ids 1 --temperature -1
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt-ids 1 --max-new-tokens -1
expect 2 gen --init-hf "$fx/qwen2_bias" --prompt-ids 1 --no-such-option
# runtime: exit 1 with a message
expect 1 gen --init-hf "$tmp/missing" --prompt-ids 1
has 'not a Hugging Face model directory' "$tmp/err" "a missing directory"
expect 1 gen --init-hf "$fx/qwen2_bias" --prompt hello
has 'no tokenizer for --prompt' "$tmp/err" "--prompt without a tokenizer"
expect 1 gen --resume "$tmp/missing.mwck" --prompt-ids 1

[ "$fail" = 0 ] && echo "cli_generate: ok"
exit "$fail"
