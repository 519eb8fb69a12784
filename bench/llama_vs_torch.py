#!/usr/bin/env python3
"""The torch side of bench/llama_vs_torch.sh: memwall's training step against transformers'
LlamaForCausalLM on the CPU, same model, same batch, same thread count.

Three modes (the shell script drives them; each runs in its own process):
    --setup DIR    writes DIR/hf (a SmolLM2-135M-shaped LlamaForCausalLM built by transformers from a
                   config, random init, save_pretrained: nothing is downloaded) and DIR/tokens.bin
                   (an llm.c shard, version 1: 256 int32 header {20240520, 1, count}, uint16 ids
                   drawn uniformly from the vocabulary)
    --torch DIR    trains DIR/hf with transformers for --steps steps on windows of DIR/tokens.bin:
                   logits = model(input_ids).logits, loss = mean cross-entropy against the next
                   tokens (the same B x T predictions memwall makes), backward, global-norm clip 1,
                   AdamW (fused=True when this torch has the CPU kernel, else foreach; printed),
                   zero_grad; one JSON line per step {"step", "ms", "loss"} into --log-json
    --summary DIR  of each run's steps after the first --drop: the median step (the figure) and the
                   fastest step (the least disturbed on a loaded machine), per round and the median
                   over the rounds, ms/step each side and memwall's speed-up; the spread of the steps

The torch run sets torch.set_num_threads(threads) and gets OMP_NUM_THREADS from the script, so
both sides use the same number of cores. Attention is attn_implementation="sdpa".
"""
import argparse
import json
import os
import statistics
import struct
import sys
import time

# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M config.json), random weights.
SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
             num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
             rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
             hidden_act="silu", attention_bias=False, mlp_bias=False)


def setup(d, tokens, seed):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(**SHAPE)
    model = LlamaForCausalLM(cfg).float()
    hf = os.path.join(d, "hf")
    model.save_pretrained(hf, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, SHAPE["vocab_size"], (tokens,), generator=g, dtype=torch.int32)
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, tokens
    with open(os.path.join(d, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(ids.numpy().astype("<u2").tobytes())
    print(f"setup: {hf} ({n} parameters), {d}/tokens.bin ({tokens} tokens)")


def load_tokens(path):
    import numpy as np
    with open(path, "rb") as f:
        hdr = struct.unpack("<256i", f.read(1024))
        if hdr[0] != 20240520 or hdr[1] != 1:
            sys.exit(f"{path}: not a version 1 llm.c shard (magic {hdr[0]}, version {hdr[1]})")
        return np.frombuffer(f.read(2 * hdr[2]), dtype="<u2").astype("int64")


def train_torch(d, a):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM.from_pretrained(os.path.join(d, "hf"), attn_implementation="sdpa",
                                             dtype=torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    kw = dict(lr=2e-4, betas=(0.9, 0.95), eps=1e-8)
    try:
        opt = torch.optim.AdamW(groups, fused=True, **kw)
        # fused support is checked at the first step: try it on a throwaway parameter
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.zeros(4)
        torch.optim.AdamW([p], fused=True, **kw).step()
        kind = "fused"
    except (RuntimeError, TypeError) as e:
        print(f"torch: AdamW(fused=True) not available on this CPU ({e}); using foreach", file=sys.stderr)
        opt = torch.optim.AdamW(groups, foreach=True, **kw)
        kind = "foreach"
    toks = torch.from_numpy(load_tokens(os.path.join(d, "tokens.bin")))
    g = torch.Generator().manual_seed(a.seed)
    B, T = a.batch, a.seq
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "adamw": kind,
            "attn": model.config._attn_implementation}
    with open(a.log_json, "w") as log:
        log.write(json.dumps(meta) + "\n")
        for step in range(1, a.steps + 1):
            t0 = time.perf_counter()
            starts = torch.randint(0, toks.numel() - T - 1, (B,), generator=g)
            win = torch.stack([toks[s:s + T + 1] for s in starts.tolist()])
            x, y = win[:, :-1], win[:, 1:]
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            ms = (time.perf_counter() - t0) * 1e3
            log.write(json.dumps({"step": step, "ms": ms, "loss": loss.item()}) + "\n")
            log.flush()
    print(f"torch {meta['torch']}: {a.steps} steps, AdamW {kind}, attention {meta['attn']}, "
          f"{meta['threads']} threads")


def steps_ms(path, drop):
    ms = [json.loads(ln)["ms"] for ln in open(path) if '"ms"' in ln]
    if len(ms) <= drop:
        sys.exit(f"{path}: {len(ms)} steps, need more than --drop {drop}")
    return ms[drop:]


def summary(d, a):
    rounds = a.rounds
    mw = [steps_ms(os.path.join(d, f"memwall.{r}.jsonl"), a.drop) for r in range(1, rounds + 1)]
    pt = [steps_ms(os.path.join(d, f"torch.{r}.jsonl"), a.drop) for r in range(1, rounds + 1)]
    meta = json.loads(open(os.path.join(d, "torch.1.jsonl")).readline())
    med = statistics.median

    def spread(runs):  # (max - min) / median of the steady steps of a run, in percent
        return " ".join(f"{100 * (max(x) - min(x)) / med(x):3.0f}%" for x in runs)

    print(f"SmolLM2-135M shape, batch {a.batch} x seq {a.seq}, {a.threads} threads, {rounds} rounds, steps "
          f"{a.drop + 1}.. of each run; torch {meta['torch']} AdamW {meta['adamw']}, attention {meta['attn']}")
    # The median step of each run is the figure; the fastest step of each run is printed beside it
    # because on a loaded machine it is the one least disturbed by other processes.
    for stat, name in ((med, "median step"), (min, "fastest step")):
        mws, pts = [stat(x) for x in mw], [stat(x) for x in pt]
        q = [b / c for b, c in zip(pts, mws)]
        print(f"{name}:")
        print(f"  {'memwall':8s} ms/step per round: " + " ".join(f"{x:8.1f}" for x in mws) + f" | median {med(mws):8.1f}")
        print(f"  {'torch':8s} ms/step per round: " + " ".join(f"{x:8.1f}" for x in pts) + f" | median {med(pts):8.1f}")
        print("  torch / memwall per round:   " + " ".join(f"{x:8.3f}" for x in q) +
              f" | median {med(q):.3f} (ratio of the medians {med(pts) / med(mws):.3f})")
    print(f"noise, (max - min) / median of the steps of each run: memwall {spread(mw)}; torch {spread(pt)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--setup", metavar="DIR")
    mode.add_argument("--torch", metavar="DIR")
    mode.add_argument("--summary", metavar="DIR")
    ap.add_argument("--tokens", type=int, default=1 << 20, help="--setup: tokens in the shard")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--log-json", help="--torch: one JSON line per step")
    ap.add_argument("--rounds", type=int, default=3, help="--summary: rounds to read")
    ap.add_argument("--drop", type=int, default=2, help="--summary: warm-up steps left out of each run")
    a = ap.parse_args()
    if a.setup:
        os.makedirs(a.setup, exist_ok=True)
        setup(a.setup, a.tokens, a.seed)
    elif a.torch:
        if not a.log_json:
            ap.error("--torch needs --log-json")
        train_torch(a.torch, a)
    else:
        summary(a.summary, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
