"""memwall's Hugging Face directories in transformers: `memwall train --save-hf DIR` writes a
directory that transformers' from_pretrained loads and that gives the loss `memwall eval` gives
over the same consecutive windows (GPT-2 and the Llama family: Llama with GQA, Qwen2 with q/k/v
bias, llama3 RoPE with an untied head); and a sharded checkpoint transformers writes
(save_pretrained(max_shard_size=...): model.safetensors.index.json and its shards, bf16) evaluates
exactly as the same model saved as one file (GPT-2 and Llama). The CLI is the build's (MW_CLI, set
by CTest)."""
import json
import os
import subprocess

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FX = os.path.join(ROOT, "tests", "fixtures", "llama")
CLI = os.environ.get("MW_CLI")
pytestmark = pytest.mark.skipif(not CLI, reason="MW_CLI (the memwall binary) is set by CTest")


def run(*args):
    r = subprocess.run([CLI, *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout
    return r.stdout


def windows(ids, T):
    nw = (len(ids) - 1) // T
    x = np.stack([ids[i * T:i * T + T] for i in range(nw)])
    y = np.stack([ids[i * T + 1:i * T + T + 1] for i in range(nw)])
    return torch.tensor(x), torch.tensor(y)


def hf_loss(d, ids, T):
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    x, y = windows(ids, T)
    with torch.no_grad():
        lg = torch.cat([m(x[i:i + 16]).logits for i in range(0, len(x), 16)]).double()
    return float(torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)))


def mw_loss(d, data, T):
    return json.loads(run("eval", "--init-hf", d, "--data", data, "--seq", str(T), "--json"))["loss"]


@pytest.mark.parametrize("name", ["llama_gqa_tied", "qwen2_bias", "llama3_untied"])
def test_llama_family_round_trip(tmp_path, name):
    data = os.path.join(FX, "eval_ids.bin")
    out = str(tmp_path / "hf")
    run("train", "--init-hf", os.path.join(FX, name), "--data", data, "--batch", "2", "--seq", "16", "--steps", "2",
        "--val-every", "0", "--sample-len", "0", "--save-hf", out)
    ids = np.frombuffer(open(data, "rb").read()[1024:], dtype=np.uint16).astype(np.int64)
    a, b = mw_loss(out, data, 16), hf_loss(out, ids, 16)
    assert abs(a - b) <= 1e-4, (a, b)
    assert abs(a - mw_loss(os.path.join(FX, name), data, 16)) > 1e-6  # the saved model is the trained one


def test_gpt2_round_trip(tmp_path):
    out = str(tmp_path / "hf")
    run("train", "--preset", "demo", "--steps", "2", "--val-every", "0", "--sample-len", "0", "--save-hf", out)
    text = str(tmp_path / "text.txt")
    with open(os.path.join(ROOT, "data", "kjv_excerpt.txt"), "rb") as f:
        raw = f.read(8000)
    with open(text, "wb") as f:
        f.write(raw)
    # The byte tokenizer: a document's end-of-text (256) first, then the bytes as ids.
    ids = np.concatenate([[256], np.frombuffer(raw, dtype=np.uint8).astype(np.int64)])
    a, b = mw_loss(out, text, 64), hf_loss(out, ids, 64)
    assert abs(a - b) <= 1e-4, (a, b)


def gpt2_bf16():
    torch.manual_seed(20261205)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=257, bos_token_id=256,
                                 eos_token_id=256)
    return transformers.GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_sharded_bf16(tmp_path, family):
    """save_pretrained(max_shard_size=...) in bf16 (model.safetensors.index.json and its shards):
    memwall eval gives the loss of the same model saved as one file, bit for bit, and transformers'
    loss on the sharded directory."""
    if family == "llama":
        m = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(FX, "llama3_untied"), dtype=torch.bfloat16)
        data, T = os.path.join(FX, "eval_ids.bin"), 16
        ids = np.frombuffer(open(data, "rb").read()[1024:], dtype=np.uint16).astype(np.int64)
    else:
        m = gpt2_bf16()
        data, T = str(tmp_path / "text.txt"), 64
        with open(os.path.join(ROOT, "data", "kjv_excerpt.txt"), "rb") as f:
            raw = f.read(6000)
        with open(data, "wb") as f:
            f.write(raw)
        ids = np.concatenate([[256], np.frombuffer(raw, dtype=np.uint8).astype(np.int64)])
    one, sharded = str(tmp_path / "one"), str(tmp_path / "sharded")
    m.save_pretrained(one)
    m.save_pretrained(sharded, max_shard_size="20KB")
    files = sorted(os.listdir(sharded))
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files, files
    assert len([f for f in files if f.endswith(".safetensors")]) >= 3, files
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        assert {v for v in json.load(f)["weight_map"].values()} <= set(files)
    a, b = mw_loss(one, data, T), mw_loss(sharded, data, T)
    assert a == b, (a, b)
    assert abs(b - hf_loss(sharded, ids, T)) <= 1e-4, (b, hf_loss(sharded, ids, T))
