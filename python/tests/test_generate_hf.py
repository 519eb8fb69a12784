"""`memwall generate` against transformers: the greedy continuation of each Llama-family fixture
(tests/fixtures/llama: Llama with GQA and a tied head, Qwen2 with q/k/v bias, llama3 RoPE with an
untied head) equals `generate(do_sample=False)`, token for token. The CLI is the build's (MW_CLI,
set by CTest); the C side of the same check, against memwall's own full forwards, is
tests/test_generate.c."""
import os
import subprocess

import pytest
import torch

transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FX = os.path.join(ROOT, "tests", "fixtures", "llama")
CLI = os.environ.get("MW_CLI")
pytestmark = pytest.mark.skipif(not CLI, reason="MW_CLI (the memwall binary) is set by CTest")

PROMPT = [1, 5, 2, 9]
N = 16


@pytest.mark.parametrize("name", ["llama_gqa_tied", "qwen2_bias", "llama3_untied"])
def test_greedy_equals_transformers(name):
    d = os.path.join(FX, name)
    r = subprocess.run([CLI, "generate", "--init-hf", d, "--prompt-ids", ",".join(map(str, PROMPT)), "--temperature",
                        "0", "--max-new-tokens", str(N), "--ids"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout
    ours = [int(t) for t in r.stdout.split()]
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        out = m.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=N, min_new_tokens=N,
                         eos_token_id=None, pad_token_id=0)
    theirs = out[0, len(PROMPT):].tolist()
    assert ours == theirs, (ours, theirs)


def test_gpt2_greedy_equals_transformers(tmp_path):
    out = str(tmp_path / "hf")
    r = subprocess.run([CLI, "train", "--preset", "demo", "--steps", "2", "--val-every", "0", "--sample-len", "0",
                        "--save-hf", out], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout
    r = subprocess.run([CLI, "generate", "--init-hf", out, "--prompt-ids", "65,110,100,32", "--temperature", "0",
                        "--max-new-tokens", str(N), "--eos", "-1", "--ids"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout
    ours = [int(t) for t in r.stdout.split()]
    m = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        gen = m.generate(torch.tensor([[65, 110, 100, 32]]), do_sample=False, max_new_tokens=N, eos_token_id=None,
                         pad_token_id=0)
    theirs = gen[0, 4:].tolist()
    # memwall stops after the byte tokenizer's end-of-text (256) by default; --eos -1 means that
    # default, so compare up to (and including) a 256 if one came
    k = len(ours)
    assert k >= 1 and ours == theirs[:k], (ours, theirs)
    assert k == N or ours[-1] == 256
