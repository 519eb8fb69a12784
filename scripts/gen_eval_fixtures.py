#!/usr/bin/env python3
"""Expected `memwall eval` losses for the Llama-family fixture directories (tests/cli_hf.sh).

For each directory under tests/fixtures/llama/ (written by scripts/gen_llama_fixtures.py), the
mean next-token loss that transformers computes over the consecutive windows of
tests/fixtures/llama/eval_ids.bin (an llm.c uint16 shard of 4000 seeded ids < 50): windows of T
tokens predict the next T, every whole window, as `memwall eval --seq T` does. Written to
tests/fixtures/llama/eval_expected.json. Needs torch, numpy and transformers (offline).
"""
import json
import os

import numpy as np
import torch
from transformers import AutoModelForCausalLM

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "llama")
T = 16


def shard():
    ids = np.random.default_rng(20261205).integers(0, 50, size=4000).astype(np.uint16)
    hdr = np.zeros(256, dtype=np.int32)
    hdr[:3] = (20240520, 1, len(ids))
    with open(os.path.join(HERE, "eval_ids.bin"), "wb") as f:
        f.write(hdr.tobytes() + ids.tobytes())
    return ids.astype(np.int64)


def loss(d, ids):
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    nw = (len(ids) - 1) // T
    x = torch.tensor(np.stack([ids[i * T:i * T + T] for i in range(nw)]))
    y = torch.tensor(np.stack([ids[i * T + 1:i * T + T + 1] for i in range(nw)]))
    with torch.no_grad():
        lg = m(x).logits.double()
    l = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))
    return float(l), nw


def main():
    ids = shard()
    out = {"seq": T}
    for name in sorted(os.listdir(HERE)):
        d = os.path.join(HERE, name)
        if os.path.isfile(os.path.join(d, "config.json")):
            out[name], out["windows"] = loss(d, ids)
    with open(os.path.join(HERE, "eval_expected.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(out)


if __name__ == "__main__":
    main()
