#!/usr/bin/env bash
# memwall train end to end on the tiny preset: a short run writes a JSON log with the keys;
# the same seed gives bitwise identical losses; a resumed run continues bitwise identically;
# bad options exit 2; corrupt or truncated checkpoints exit 1 with a clear message.
set -u
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} # ctest runs tests side by side on 2 cores
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
dir=${MW_BUILD_DIR:-/tmp}/test-scratch/cli_train-$$
rm -rf "$dir" && mkdir -p "$dir"
data="$src/data/kjv_excerpt.txt"
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
# The loss fields at full precision (%.9g), one line per step: what must repeat bitwise.
losses() { grep -o '"step":[0-9]*,"loss":[^,]*\(,"val_loss":[^,]*\)\?' "$1"; }
common=(--preset tiny --data "$data" --threads 2 --sample-len 0)

# 1. A 3-step run succeeds and logs every key.
if "$cli" train "${common[@]}" --steps 3 --val-every 3 --log-json "$dir/a.jsonl" --sample-len 20 >"$dir/a.out" 2>&1; then
  ok
  n=$(grep -c '"loss"' "$dir/a.jsonl")
  [ "$n" = 3 ] && ok || bad "expected 3 step records, got $n"
  for k in step loss val_loss tokens_per_s ms; do
    grep -q "\"$k\":" "$dir/a.jsonl" && ok || bad "log has no key $k"
  done
  grep '"step":3,' "$dir/a.jsonl" | grep -q '"val_loss":' && ok || bad "step 3 has no val_loss"
  grep -q '^step      3/3 | loss ' "$dir/a.out" && ok || bad "no progress line for step 3"
  grep -q 'tok/s' "$dir/a.out" && grep -q 'DRAM MiB params/grads/optim/acts' "$dir/a.out" && ok || bad "progress line lacks tok/s or tier bytes"
  grep -q '^sample' "$dir/a.out" && ok || bad "no sample printed"
  [ "$(grep -vc '^{"step":[0-9]*,.*}$' "$dir/a.jsonl")" = 0 ] && ok || bad "log lines are not one JSON object each"
else
  bad "3-step run failed"; cat "$dir/a.out"
fi

# 2. The same seed twice: bitwise identical losses; another seed: different ones.
"$cli" train "${common[@]}" --steps 5 --val-every 2 --seed 7 --log-json "$dir/s1.jsonl" >/dev/null 2>&1 || bad "seed run 1 failed"
"$cli" train "${common[@]}" --steps 5 --val-every 2 --seed 7 --log-json "$dir/s2.jsonl" >/dev/null 2>&1 || bad "seed run 2 failed"
"$cli" train "${common[@]}" --steps 5 --val-every 2 --seed 8 --log-json "$dir/s3.jsonl" >/dev/null 2>&1 || bad "seed run 3 failed"
[ "$(losses "$dir/s1.jsonl" | wc -l)" = 5 ] && ok || bad "seed run logged $(losses "$dir/s1.jsonl" | wc -l) steps, want 5"
[ "$(losses "$dir/s1.jsonl")" = "$(losses "$dir/s2.jsonl")" ] && ok || { bad "same seed, different losses"; diff <(losses "$dir/s1.jsonl") <(losses "$dir/s2.jsonl"); }
[ "$(losses "$dir/s1.jsonl")" != "$(losses "$dir/s3.jsonl")" ] && ok || bad "different seeds gave identical losses"

# 3. Resume: 8 steps with grad-accum 2 and checkpoints every 4, against the run resumed at step 4.
"$cli" train "${common[@]}" --steps 8 --grad-accum 2 --val-every 4 --ckpt-every 4 --out-dir "$dir/full" \
    --log-json "$dir/full.jsonl" >"$dir/full.out" 2>&1 || { bad "full run failed"; cat "$dir/full.out"; }
[ -f "$dir/full/ckpt_00000004.mwck" ] && [ -f "$dir/full/ckpt_00000008.mwck" ] && ok || bad "checkpoints missing"
[ -f "$dir/full/model.safetensors" ] && ok || bad "no model.safetensors"
"$cli" train --resume "$dir/full/ckpt_00000004.mwck" --sample-len 0 --log-json "$dir/res.jsonl" --out-dir "$dir/res" \
    >"$dir/res.out" 2>&1 || { bad "resumed run failed"; cat "$dir/res.out"; }
want=$(losses "$dir/full.jsonl" | grep -E '"step":(5|6|7|8),')
got=$(losses "$dir/res.jsonl")
[ -n "$want" ] && [ "$want" = "$got" ] && ok || { bad "resumed losses differ"; diff <(echo "$want") <(echo "$got"); }
# Weights and optimizer state at the end are bitwise the same too.
. "$src/tests/lib_ckpt.sh"
ckpt_state_eq "$dir/full/ckpt_00000008.mwck" "$dir/res/ckpt_00000008.mwck" && ok || bad "final checkpoints differ"
ckpt_state_eq "$dir/full/ckpt_00000008.mwck" "$dir/full/ckpt_00000004.mwck" && bad "the checkpoint comparison cannot fail" || ok

# 3b. --init-safetensors: the weights saved at the end of the full run, loaded into a fresh
# run, give bitwise the validation loss that run logged at its last step.
"$cli" train --preset tiny --data "$data" --threads 2 --sample-len 0 --init-safetensors "$dir/full/model.safetensors" \
    --steps 0 --val-every 1 --log-json "$dir/init.jsonl" >"$dir/init.out" 2>&1 || { bad "--init-safetensors run failed"; cat "$dir/init.out"; }
want=$(grep '"step":8,' "$dir/full.jsonl" | grep -o '"val_loss":[^,]*')
got=$(grep '"step":0,' "$dir/init.jsonl" 2>/dev/null | grep -o '"val_loss":[^,}]*')
[ -n "$want" ] && [ "$want" = "$got" ] && ok || bad "val loss from the saved weights: '$got', want '$want'"
head -c 300 "$dir/full/model.safetensors" >"$dir/cut.safetensors"
expect1st() { "$cli" train --preset tiny --data "$data" --steps 0 --sample-len 0 --init-safetensors "$1" >"$dir/c.out" 2>&1
  local rc=$?; [ $rc = 1 ] && ok || { bad "truncated safetensors exited $rc, want 1"; cat "$dir/c.out"; }; }
expect1st "$dir/cut.safetensors"

# 3c. A model written by transformers (head size 32): the config.json beside it gives the head
# count, the CLI says where each value came from, a --heads that disagrees is refused naming
# both, and without config.json --heads fills the gap. Data: an llm.c shard of tokens < 128.
hf="$src/tests/fixtures/gpt2_hf_heads32/model.safetensors"
python3 - "$dir/hf_train.bin" <<'PY' || bad "cannot write the shard"
import struct, sys
toks = [(i * 37 + i // 7) % 128 for i in range(4000)]
hdr = [20240520, 1, len(toks)] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(toks), *toks))
PY
hfrun=(train --data "$dir/hf_train.bin" --threads 2 --sample-len 0 --steps 0 --seq 16 --batch 2 --val-every 1)
"$cli" "${hfrun[@]}" --init-safetensors "$hf" >"$dir/hf.out" 2>&1 || { bad "transformers model run failed"; cat "$dir/hf.out"; }
grep -q "n_head 2 (config.json)" "$dir/hf.out" && grep -q "n_embd 64 (tensor shapes)" "$dir/hf.out" && ok ||
  { bad "no provenance of the config in the output"; cat "$dir/hf.out"; }
"$cli" "${hfrun[@]}" --init-safetensors "$hf" --heads 4 >"$dir/hf4.out" 2>&1
rc=$?; [ $rc = 1 ] && grep -q "the head count (n_head) is 2 by the config.json but 4 by the command line" "$dir/hf4.out" && ok ||
  { bad "--heads 4 against config.json: rc $rc"; cat "$dir/hf4.out"; }
mkdir -p "$dir/noconf" && cp "$hf" "$dir/noconf/"
"$cli" "${hfrun[@]}" --init-safetensors "$dir/noconf/model.safetensors" --heads 2 >"$dir/hfh.out" 2>&1 &&
  grep -q "n_head 2 (command line)" "$dir/hfh.out" && ok || { bad "--heads filling the head count"; cat "$dir/hfh.out"; }
"$cli" "${hfrun[@]}" --init-safetensors "$dir/noconf/model.safetensors" >"$dir/hfg.out" 2>&1 &&
  grep -q "n_head 1 (guess" "$dir/hfg.out" && grep -q "nothing says the head count" "$dir/hfg.out" && ok ||
  { bad "a guessed head count is not said to be a guess"; cat "$dir/hfg.out"; }

# 4. Bad options exit 2.
expect2() { "$cli" train "$@" >"$dir/u.out" 2>&1; local rc=$?
  [ $rc = 2 ] && ok || { bad "'train $*' exited $rc, want 2"; cat "$dir/u.out"; }; }
expect2 --batch 0
expect2 --preset nope
expect2 --no-such-option
expect2 --steps
expect2 --lr abc
expect2 --optimizer-tier tape --steps 1
expect2 --offload-policy sometimes --steps 1
expect2 --ckpt-every 1 --steps 1
expect2 --preset tiny --seq 65
expect2 --preset tiny --width 30 --heads 4
"$cli" train --help >"$dir/h.out" 2>&1 && grep -q -- "--grad-accum" "$dir/h.out" && ok || bad "--help"

# 5. Corrupt, truncated or foreign checkpoints exit 1 and say what is wrong.
ck="$dir/full/ckpt_00000008.mwck"
expect1() { local want=$1; shift; "$cli" train --sample-len 0 "$@" >"$dir/c.out" 2>&1; local rc=$?
  [ $rc = 1 ] && grep -q "$want" "$dir/c.out" && ok || { bad "'train $*' exited $rc (want 1, message '$want')"; cat "$dir/c.out"; }; }
size=$(stat -c %s "$ck")
cp "$ck" "$dir/flip.mwck"
printf '\x55' | dd of="$dir/flip.mwck" bs=1 seek=$((size / 2)) conv=notrunc status=none
expect1 "corrupt" --resume "$dir/flip.mwck" --steps 9
head -c $((size - 100)) "$ck" >"$dir/trunc.mwck"
expect1 "truncated" --resume "$dir/trunc.mwck"
head -c 500 "$ck" >"$dir/trunc2.mwck"
expect1 "truncated" --resume "$dir/trunc2.mwck"
head -c 5000 /dev/zero >"$dir/zero.mwck"
expect1 "not a memwall checkpoint" --resume "$dir/zero.mwck"
expect1 "No such file" --resume "$dir/none.mwck"
expect1 "No such file" --data "$dir/none.txt"
printf 'tiny' >"$dir/small.txt"
expect1 "no window" --preset tiny --data "$dir/small.txt"
# A data path longer than a checkpoint records (511 bytes) with --ckpt-every: refused before
# training, not cut at the first checkpoint.
long="$dir/$(printf 'd%.0s' $(seq 200))/$(printf 'e%.0s' $(seq 200))/$(printf 'f%.0s' $(seq 200))"
mkdir -p "$long" && cp "$src/data/kjv_excerpt.txt" "$long/data.txt"
expect1 "a checkpoint records at most 511" --preset tiny --data "$long/data.txt" --steps 2 --ckpt-every 1 --out-dir "$dir/lp"
[ ! -e "$dir/lp" ] || ! ls "$dir/lp"/*.mwck >/dev/null 2>&1 && ok || bad "a checkpoint was written with a cut data path"

rm -rf "$dir"
echo "cli_train: $pass passed, $fail failed"
[ $fail = 0 ]
