#!/usr/bin/env bash
# `memwall plan` command-line contract: --json keys present with integer byte sizes, exit 2 on
# an unknown model or a malformed config.json, --help lists the options, and the other modes
# (--estimator, --context, --search, --emit k8s, config files) run.
set -u
cli=${MW_CLI:?}
src=${MW_SOURCE_DIR:?}
tmp=$(mktemp -d "${MW_BUILD_DIR:-/tmp}/cli_plan.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
expect() { # expect CODE cmd...
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local got=$?
  if [ "$got" != "$want" ]; then bad "'$*' exited $got, want $want"; cat "$tmp/out" "$tmp/err"; fi
}
command -v python3 >/dev/null || { echo "FAIL: python3 is needed to read the JSON (scripts/install-deps.sh installs it)"; exit 1; }

# JSON: required keys, sizes are integers.
expect 0 "$cli" plan --model llama-3-70b --gpus 8 --tp 8 --zero 1 --offload-optimizer nvme --context 8192 \
  --batch 4 --estimator deepspeed-zero3 --json
python3 - "$tmp/out" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))
keys = ["model.params_total", "model.params_active", "kv_cache.bytes_per_token", "kv_cache.total",
        "estimator.gpu_bytes", "estimator.cpu_bytes"]
for t in ("gpu", "host", "nvme"):
    for k in ("params", "grads", "optimizer", "activations", "total"):
        keys.append("per_device.%s.%s" % (t, k))
bad = 0
for k in keys:
    v = d
    for p in k.split("."):
        v = v.get(p) if isinstance(v, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        print("FAIL: --json key %s is %r, want a non-negative integer" % (k, v)); bad = 1
if d["model"]["params_total"] != 70553706496: print("FAIL: llama-3-70b total", d["model"]["params_total"]); bad = 1
if d["per_device"]["nvme"]["optimizer"] == 0: print("FAIL: NVMe optimizer offload left nvme.optimizer at 0"); bad = 1
if d["kv_cache"]["bytes_per_token"] != 327680: print("FAIL: kv bytes per token", d["kv_cache"]["bytes_per_token"]); bad = 1
if d["kv_cache"]["total"] != 327680 * 8192 * 4: print("FAIL: kv total"); bad = 1
sys.exit(bad)
PY
# Without --context and --estimator those sections are absent; with a config file it still works.
expect 0 "$cli" plan --model "$src/tests/fixtures/configs/mixtral-8x7b.json" --gpus 8 --ep 8 --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["model"]["params_total"]==46702792704 and "kv_cache" not in d and "estimator" not in d else 1)' "$tmp/out" \
  || bad "config-file JSON"
mkdir -p "$tmp/ckpt" && cp "$src/tests/fixtures/configs/llama-3-8b.json" "$tmp/ckpt/config.json"
expect 0 "$cli" plan --model "$tmp/ckpt" --json
grep -q '"params_total": 8030261248' "$tmp/out" || bad "a checkpoint directory reads its config.json"
expect 0 "$cli" plan --params 7e9 --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["per_device"]["gpu"]["optimizer"]==84000000000 else 1)' "$tmp/out" \
  || bad "--params 7e9: 12 bytes/param of optimizer state"

expect 0 "$cli" plan --model llama-3-70b --gpus 4 --tp 4 --inference --context 32768 --batch 8 --json
python3 -c 'import json,sys; g=json.load(open(sys.argv[1]))["per_device"]["gpu"]; sys.exit(0 if g["grads"]==0 and g["optimizer"]==0 and g["activations"]==0 and g["total"]==g["params"]+20*2**30 else 1)' "$tmp/out" \
  || bad "--inference: weights + KV cache only (20 GiB of KV per GPU)"

# Usage errors exit 2 with a message.
expect 2 "$cli" plan --model no-such-model
grep -q "unknown model 'no-such-model'" "$tmp/err" || bad "unknown model message: $(cat "$tmp/err")"
expect 2 "$cli" plan --model "$src/tests/fixtures/configs/bad-truncated.json"
grep -q "not valid JSON" "$tmp/err" || bad "malformed config message: $(cat "$tmp/err")"
expect 2 "$cli" plan --model "$src/tests/fixtures/configs/bad-missing-key.json"
grep -q "missing required key" "$tmp/err" || bad "missing key message: $(cat "$tmp/err")"
expect 2 "$cli" plan --model "$tmp/does-not-exist.json"
expect 2 "$cli" plan
expect 2 "$cli" plan --model gpt2 --zero 4
expect 2 "$cli" plan --model gpt2 --tp 5
expect 2 "$cli" plan --model gpt2 --offload-params cpu --zero 2
expect 2 "$cli" plan --model gpt2 --recompute sometimes

# Help lists the contract's options.
expect 0 "$cli" plan --help
for o in --model --params --largest-layer --gpus --gpus-per-node --dp --tp --pp --ep --etp --sequence-parallel \
         --zero --offload-optimizer --offload-params --weight-dtype --grad-dtype --master-dtype --moment-dtype \
         --micro-batch --seq --global-batch --interleave --recompute --context --batch --kv-dtype --estimator \
         --zero-init --json --search --emit; do
  grep -q -- "$o" "$tmp/out" || bad "--help does not list $o"
done

# The human table marks what does not fit; --search, --emit k8s, estimators run.
expect 0 "$cli" plan --model llama-3-70b --gpus 8
grep -q "GiB" "$tmp/out" && grep -q "DOES NOT FIT" "$tmp/out" || bad "70B on 8 GPUs without offload should not fit"
expect 0 "$cli" plan --model gpt2 --gpus 1 --gpus-per-node 1
grep -q "DOES NOT FIT" "$tmp/out" && bad "gpt2 on one GPU should fit"
expect 0 "$cli" plan --model llama-2-13b --gpus 8 --search --top 3 --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); l=d["layouts"]; sys.exit(0 if len(l)==3 and l[0]["iter_s"]<=l[1]["iter_s"]<=l[2]["iter_s"] else 1)' "$tmp/out" \
  || bad "--search --json: 3 layouts, fastest first"
expect 0 "$cli" plan --model llama-3-70b --gpus 8 --zero 3 --offload-optimizer nvme --emit k8s
grep -q "ephemeral-storage" "$tmp/out" && grep -q "/dev/shm" "$tmp/out" || bad "--emit k8s block"
expect 0 "$cli" plan --params 2851598336 --largest-layer 32899072 --gpus 8 --zero 3 --offload-optimizer cpu \
  --offload-params cpu --estimator deepspeed-zero3 --zero-init 1 --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["estimator"]; sys.exit(0 if d["cpu_bytes"]==76993155072 and d["gpu_bytes"]==131596288 else 1)' "$tmp/out" \
  || bad "DeepSpeed ZeRO-3 estimator through the CLI (t5-3b, 71.71 GB / 0.12 GB)"
expect 0 "$cli" plan --list-models
grep -qx "deepseek-v3" "$tmp/out" || bad "--list-models"

[ $fail = 0 ] && echo "cli_plan: passed" || echo "cli_plan: FAILED"
exit $fail
