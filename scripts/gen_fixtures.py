#!/usr/bin/env python3
"""gen_fixtures.py - reference data for memwall's C tests, computed with PyTorch (CPU).

The test suite never needs PyTorch: the fixtures are committed under tests/fixtures/ and
this script only regenerates them. Each subsystem adds one gen_<name>() function and one
entry in GENERATORS; `--only NAME` regenerates just that one.

    python3 scripts/gen_fixtures.py              # all fixtures
    python3 scripts/gen_fixtures.py --only gpt2  # tests/fixtures/gpt2_tiny.bin
"""
import argparse
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


# ---------------------------------------------------------------------------- gpt2
# A tiny GPT-2 written out by hand (no `transformers` needed), computed in float64 so the
# reference is far more precise than the fp32 C code it checks. Tensor order and layouts are
# memwall's (= Hugging Face's: Conv1D weights stored [in, out]); wte has padded rows (zero).

GPT2_BLOCK = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
              "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
              "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]


def gpt2_tensor_shapes(L, C, maxT, Vp):
    shapes = [("wte.weight", (Vp, C)), ("wpe.weight", (maxT, C))]
    per = [(C,), (C,), (C, 3 * C), (3 * C,), (C, C), (C,), (C,), (C,), (C, 4 * C), (4 * C,),
           (4 * C, C), (C,)]
    for l in range(L):
        shapes += [("h.%d.%s" % (l, n), s) for n, s in zip(GPT2_BLOCK, per)]
    shapes += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return shapes


def gpt2_forward(P, idx, targets, L, NH, C, V):
    B, T = idx.shape
    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    hs = C // NH
    for l in range(L):
        p = lambda n: P["h.%d.%s" % (l, n)]
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps=1e-5)
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps=1e-5)
        h = F.gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
    logits = x @ P["wte.weight"][:V].t()  # tied head; padded rows never predicted
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    return logits, loss


def gen_gpt2():
    L, NH, C, maxT, V, Vp = 2, 4, 48, 32, 97, 128
    B, T = 3, 20  # T < maxT on purpose: exercises the packed (B, T) activation layout
    nsteps, lr, b1, b2, eps, wd = 10, 1e-3, 0.9, 0.999, 1e-8, 0.0
    g = torch.Generator().manual_seed(1234)
    shapes = gpt2_tensor_shapes(L, C, maxT, Vp)
    P = {}
    for name, shape in shapes:
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            t = 0.02 * torch.randn(shape, generator=g)
        else:
            t = 0.1 * torch.randn(shape, generator=g)  # larger than GPT-2's 0.02: a tiny model
        if name == "wte.weight":                        # needs visible logits/gradients
            t[V:] = 0.0
        P[name] = t.float().double().requires_grad_(True)  # fp32 values, fp64 arithmetic
    idx = torch.randint(0, V, (B, T), generator=g)
    tgt = torch.randint(0, V, (B, T), generator=g)

    logits, loss = gpt2_forward(P, idx, tgt, L, NH, C, V)
    loss.backward()
    grads = {n: P[n].grad.detach().clone() for n, _ in shapes}
    params0 = {n: P[n].detach().clone() for n, _ in shapes}

    opt = torch.optim.AdamW([P[n] for n, _ in shapes], lr=lr, betas=(b1, b2), eps=eps,
                            weight_decay=wd)
    losses = []
    for _ in range(nsteps):
        opt.zero_grad()
        _, l_ = gpt2_forward(P, idx, tgt, L, NH, C, V)
        l_.backward()
        losses.append(l_.item())
        opt.step()

    out = bytearray()
    out += b"MWGPT2FX"
    out += struct.pack("<10i", 1, L, NH, C, maxT, V, Vp, B, T, nsteps)
    out += struct.pack("<5f", lr, b1, b2, eps, wd)
    n_params = sum(math.prod(s) for _, s in shapes)
    out += struct.pack("<i", n_params)

    def f32(t):  # little-endian fp32, without needing numpy
        return struct.pack("<%df" % t.numel(), *t.detach().reshape(-1).tolist())

    for n, _ in shapes:
        out += f32(params0[n])
    out += struct.pack("<%di" % (B * T), *idx.reshape(-1).tolist())
    out += struct.pack("<%di" % (B * T), *tgt.reshape(-1).tolist())
    out += f32(logits)
    out += struct.pack("<f", loss.item())
    for n, _ in shapes:
        out += f32(grads[n])
    out += struct.pack("<%df" % nsteps, *losses)
    out += b"END!"
    os.makedirs(FIXTURES, exist_ok=True)
    path = os.path.join(FIXTURES, "gpt2_tiny.bin")
    with open(path, "wb") as f:
        f.write(out)
    print("wrote %s (%d bytes): %d params, loss %.6f, 10 AdamW losses %.6f .. %.6f"
          % (os.path.relpath(path, ROOT), len(out), n_params, loss.item(), losses[0], losses[-1]))


GENERATORS = {
    "gpt2": gen_gpt2,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=sorted(GENERATORS), help="regenerate just this fixture")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, fn in GENERATORS.items():
        if args.only is None or args.only == name:
            fn()
    return 0


if __name__ == "__main__":
    sys.exit(main())
