#!/usr/bin/env bash
# `memwall tokenize` and `memwall data` command-line contract:
# - tokenize gives HF's ids for the committed fixtures (tests/fixtures/tok, made by
#   scripts/gen_tok_fixtures.py), with --add-special / --split-special / --text / stdin, and
#   --decode gives the text back;
# - data writes llm.c shards: header (magic, version, count) and file size agree, the validation
#   shard comes first in the input and is named *_val_*, documents start with the document token,
#   the shard's tokens are tokenize's; a vocabulary over 65536 ids (a tokenizer.json synthesized
#   here) writes uint32 shards (magic 20240801, version 7) that memwall train reads and refuses
#   for a model whose vocabulary is too small;
# - hostile inputs: missing file, broken JSON, unknown model type, a bad id, a bad JSONL line,
#   shards already there: a message and exit 1; usage errors exit 2.
# No Python: header fields are read with od.
set -u
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
fx="$src/tests/fixtures/tok"
tmp=$(mktemp -d "${MW_BUILD_DIR:-/tmp}/cli_tokenize.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
expect() { # expect CODE cmd...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" != "$want" ]; then bad "'$*' exited $got, want $want"; head -c 2000 "$tmp/out" "$tmp/err"; fi
}
has() { grep -q -e "$1" -- "$2" || bad "$3: '$1' not in $(head -c 600 -- "$2")"; }
hdr() { od -An -t d4 -N 12 "$1" | tr -s ' ' | sed 's/^ //'; } # magic version count
body_ids() { # the tokens of a shard, one line, as tokenize prints them
  local w; [ "$(od -An -t d4 -N 4 "$1" | tr -d ' ')" = 20240801 ] && w=4 || w=2
  od -An -v -t u$w -j 1024 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'
}

# --help lists every option of the table, exit 0; usage errors exit 2.
expect 0 "$cli" tokenize --help
for o in --tokenizer --text --decode --add-special --split-special --skip-special --count --time; do has "$o" "$tmp/out" "tokenize --help"; done
expect 0 "$cli" data --help
for o in --tokenizer --out --name --val-fraction --shard-tokens --doc-token --quiet; do has "$o" "$tmp/out" "data --help"; done
expect 2 "$cli" tokenize "$fx/text.txt"
has "tokenizer" "$tmp/err" "no --tokenizer"
expect 2 "$cli" tokenize --tokenizer "$fx/gpt2" --bogus
expect 2 "$cli" tokenize --tokenizer "$fx/gpt2" --text x "$fx/text.txt"
expect 2 "$cli" data --tokenizer "$fx/gpt2" "$fx/text.txt"
expect 2 "$cli" data --tokenizer "$fx/gpt2" --out "$tmp/o" --val-fraction 1 "$fx/text.txt"
expect 2 "$cli" data --tokenizer "$fx/gpt2" --out "$tmp/o"

# HF's ids, in each mode, for each pattern (GPT-2, Llama-3, Qwen2).
for n in gpt2 llama3 qwen2; do
  expect 0 "$cli" tokenize --tokenizer "$fx/$n" "$fx/text.txt"
  cmp -s "$tmp/out" "$fx/$n/ids.txt" || bad "$n: tokenize ids differ from HF's"
  expect 0 "$cli" tokenize --tokenizer "$fx/$n/tokenizer.json" --add-special - <"$fx/text.txt"
  cmp -s "$tmp/out" "$fx/$n/ids_special.txt" || bad "$n: --add-special (stdin) differs from HF's"
  expect 0 "$cli" tokenize --tokenizer "$fx/$n" --split-special "$fx/text.txt"
  cmp -s "$tmp/out" "$fx/$n/ids_split.txt" || bad "$n: --split-special differs from HF's"
  expect 0 "$cli" tokenize --tokenizer "$fx/$n" --decode "$fx/$n/ids_split.txt"
  cmp -s "$tmp/out" "$fx/$n/normalized.txt" || bad "$n: --decode of the ids is not the text"
  expect 0 "$cli" tokenize --tokenizer "$fx/$n" --count "$fx/text.txt"
  [ "$(cat "$tmp/out")" = "$(wc -w <"$fx/$n/ids.txt" | tr -d ' ')" ] || bad "$n: --count"
done
first_line=$(head -n 1 "$fx/text.txt")
expect 0 "$cli" tokenize --tokenizer "$fx/llama3" --text "$first_line"$'\n'
[ "$(cat "$tmp/out")" = "$(head -n 1 "$fx/llama3/ids_lines.txt")" ] || bad "--text: the first line's ids"
expect 0 "$cli" tokenize --tokenizer "$fx/gpt2" --decode --skip-special --text "0 0 0"
[ -s "$tmp/out" ] && bad "--skip-special left <|endoftext|> in"
expect 0 "$cli" tokenize --tokenizer "$fx/gpt2" --time "$fx/text.txt"
has "MB/s" "$tmp/err" "--time"

# Hostile inputs: a message naming the problem, exit 1.
expect 1 "$cli" tokenize --tokenizer "$tmp/missing.json" --text x
has "missing.json" "$tmp/err" "missing tokenizer file"
mkdir -p "$tmp/empty"
expect 1 "$cli" tokenize --tokenizer "$tmp/empty" --text x
has "tokenizer.json" "$tmp/err" "directory without tokenizer.json"
printf '{"model": {"type": "BPE", "vocab": {' >"$tmp/broken.json"
expect 1 "$cli" tokenize --tokenizer "$tmp/broken.json" --text x
has "not valid JSON" "$tmp/err" "broken JSON"
printf '{"model": {"type": "WordPiece", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "ByteLevel"}}' >"$tmp/wp.json"
expect 1 "$cli" tokenize --tokenizer "$tmp/wp.json" --text x
has "unknown model type 'WordPiece'" "$tmp/err" "unknown model type"
expect 1 "$cli" tokenize --tokenizer "$fx/gpt2" "$tmp/no-input.txt"
has "no-input.txt" "$tmp/err" "missing input"
expect 1 "$cli" tokenize --tokenizer "$fx/gpt2" --decode --text "12 abc"
has "not a token id" "$tmp/err" "--decode of a word"
expect 1 "$cli" tokenize --tokenizer "$fx/gpt2" --decode --text "999999"
has "not in the vocabulary" "$tmp/err" "--decode of an id past the vocabulary"

# memwall data: three documents (two text files and a JSONL of two), a 25% validation split,
# small shards.
mkdir -p "$tmp/in"
head -c 12000 "$fx/text.txt" >"$tmp/in/a.txt"
tail -c 8000 "$fx/text.txt" >"$tmp/in/b.txt"
printf '{"text": "the first JSONL document"}\n\n{"text": "and the second <|begin_of_text|> one", "id": 2}\n' >"$tmp/in/c.jsonl"
expect 0 "$cli" data --tokenizer "$fx/llama3" --out "$tmp/shards" --name corpus --val-fraction 0.25 --shard-tokens 1000 "$tmp/in"
has "4 documents" "$tmp/out" "data summary"
has "wrote $tmp/shards/corpus_val_000000.bin" "$tmp/err" "progress names the shards"
ls "$tmp/shards" >"$tmp/list"
grep -q '^corpus_val_000000.bin$' "$tmp/list" || bad "no corpus_val_000000.bin"
grep -q '^corpus_train_000000.bin$' "$tmp/list" || bad "no corpus_train_000000.bin"
total=0; val=0
for f in "$tmp/shards"/corpus_*.bin; do
  set -- $(hdr "$f")
  [ "$1" = 20240520 ] && [ "$2" = 1 ] || bad "$f: header $1 $2, want 20240520 1 (vocabulary of 2002 ids)"
  [ "$(stat -c %s "$f")" = $((1024 + 2 * $3)) ] || bad "$f: size is not 1024 + 2 x $3"
  [ "$3" -le 1000 ] || bad "$f: $3 tokens, more than --shard-tokens 1000"
  total=$((total + $3)); case "$f" in *_val_*) val=$((val + $3));; esac
done
[ "$(ls "$tmp/shards" | wc -l)" -ge 4 ] || bad "only $(ls "$tmp/shards" | wc -l) shards of at most 1000 tokens"
[ "$val" -gt $((total / 8)) ] && [ "$val" -lt $((total / 2)) ] || bad "validation holds $val of $total tokens for --val-fraction 0.25"
# The first document is a.txt: <|begin_of_text|> (id 0), then its ids with special tokens as text.
"$cli" tokenize --tokenizer "$fx/llama3" --split-special "$tmp/in/a.txt" >"$tmp/a.ids"
cat "$tmp/shards"/corpus_val_*.bin >/dev/null
got=$(for f in "$tmp/shards"/corpus_val_*.bin "$tmp/shards"/corpus_train_*.bin; do body_ids "$f"; echo; done | tr -s ' \n' ' ' | cut -d' ' -f1-50)
want=$(echo "0 $(cat "$tmp/a.ids")" | cut -d' ' -f1-50)
[ "$got" = "$want" ] || bad "the shards do not start with <|begin_of_text|> and a.txt's ids: $got / $want"
# The JSONL documents' special token text is encoded as text, not as <|begin_of_text|>.
last=$(body_ids "$(ls "$tmp/shards"/corpus_train_*.bin | tail -n 1)")
"$cli" tokenize --tokenizer "$fx/llama3" --split-special --text "and the second <|begin_of_text|> one" >"$tmp/c2.ids"
case " $last" in *" 0 $(cat "$tmp/c2.ids")") ;; *) bad "the last document is not <|begin_of_text|> + its ids";; esac
# Shards of this name are there already: refused; --val-fraction 0: no validation shard.
expect 1 "$cli" data --tokenizer "$fx/llama3" --out "$tmp/shards" --name corpus "$tmp/in"
has "already holds shards" "$tmp/err" "existing shards"
expect 0 "$cli" data --tokenizer "$fx/gpt2" --out "$tmp/shards" --name g --val-fraction 0 --quiet "$tmp/in/a.txt"
[ -e "$tmp/shards/g_val_000000.bin" ] && bad "--val-fraction 0 wrote a validation shard"
[ "$(body_ids "$tmp/shards/g_train_000000.bin" | cut -d' ' -f1)" = 0 ] || bad "GPT-2 documents start with <|endoftext|> (0)"
expect 2 "$cli" data --tokenizer "$fx/gpt2" --out "$tmp/shards" --name g2 --doc-token "<nope>" "$tmp/in/a.txt"
expect 1 "$cli" data --tokenizer "$fx/gpt2" --out "$tmp/shards" --name interval "$tmp/in/a.txt"
has "contains \"val\"" "$tmp/err" "a name with val"
printf '{"text": "ok"}\n{"txt": "no text"}\n' >"$tmp/bad.jsonl"
expect 1 "$cli" data --tokenizer "$fx/gpt2" --out "$tmp/shards2" "$tmp/bad.jsonl"
has "bad.jsonl line 2" "$tmp/err" "a JSONL line without text"
expect 1 "$cli" data --tokenizer "$tmp/broken.json" --out "$tmp/shards2" "$tmp/in"
has "not valid JSON" "$tmp/err" "data with a broken tokenizer"
expect 1 "$cli" data --tokenizer "$fx/gpt2" --out "$tmp/shards2" "$tmp/nothing-here"
has "nothing-here" "$tmp/err" "missing input"

# A vocabulary over 65536 ids (synthesized: the 256 byte-level symbols, filler tokens, and
# <|endoftext|> = 70000 added): uint32 shards, version 7.
awk 'BEGIN {
  printf "{\"added_tokens\":[{\"id\":70000,\"content\":\"<|endoftext|>\",\"special\":true}],"
  printf "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
  printf "\"model\":{\"type\":\"BPE\",\"merges\":[\"\\u0120 t\"],\"vocab\":{"
  n = 256
  for (b = 0; b < 256; b++) {
    self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174)
    u = self ? b : n++
    printf "%s\"\\u%04x\":%d", (b ? "," : ""), u, b
  }
  printf ",\"\\u0120t\":256"
  for (i = 257; i < 70000; i++) printf ",\"tok%d\":%d", i, i
  printf "}}}"
}' >"$tmp/big.json"
expect 0 "$cli" tokenize --tokenizer "$tmp/big.json" --text "a t"
[ "$(cat "$tmp/out")" = "97 256" ] || bad "synthesized tokenizer: 'a t' is $(cat "$tmp/out"), want 97 256"
expect 0 "$cli" data --tokenizer "$tmp/big.json" --out "$tmp/wide" --name w --val-fraction 0.5 "$tmp/in/a.txt" "$tmp/in/b.txt"
has "uint32" "$tmp/out" "wide summary"
for f in "$tmp/wide"/w_*.bin; do
  set -- $(hdr "$f")
  [ "$1" = 20240801 ] && [ "$2" = 7 ] || bad "$f: header $1 $2, want 20240801 7 (uint32)"
  [ "$(stat -c %s "$f")" = $((1024 + 4 * $3)) ] || bad "$f: size is not 1024 + 4 x $3"
done
[ -e "$tmp/wide/w_val_000000.bin" ] && [ -e "$tmp/wide/w_train_000000.bin" ] || bad "wide: val and train shards"
[ "$(body_ids "$tmp/wide/w_val_000000.bin" | cut -d' ' -f1)" = 70000 ] || bad "wide: the document token 70000 (> 65535) leads"
# memwall train reads the uint32 shards and refuses a model whose vocabulary cannot hold id 70000.
expect 1 "$cli" train --preset tiny --steps 1 --data "$tmp/wide"
has "70000" "$tmp/err" "train on uint32 shards with too small a vocabulary"

[ $fail = 0 ] && echo "cli_tokenize: all checks passed"
exit $fail
