#!/usr/bin/env python3

"""gen_fixtures.py - reference data for memwall's C tests, computed with PyTorch (CPU).

The test suite never needs PyTorch: the fixtures are committed under tests/fixtures/ and
this script only regenerates them. Each subsystem adds one gen_<name>() function and one
entry in GENERATORS; `--only NAME` regenerates just that one.

    python3 scripts/gen_fixtures.py              # all fixtures
    python3 scripts/gen_fixtures.py --only gpt2  # tests/fixtures/gpt2_tiny.bin
    python3 scripts/gen_fixtures.py --only gpt2_hf  # tests/fixtures/gpt2_hf_heads32/ (needs transformers)
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


# ---------------------------------------------------------------------------- gpt2_hf
# A small GPT-2 written by `transformers` itself (save_pretrained: config.json + model.safetensors)
# with a head size of 32, not 64: 2 heads of width 32 that a loader guessing "n_embd / 64" would
# read as 1 head of 64. The loss is what transformers computes (fp32, its own forward) on a fixed
# window; tests/test_gpt2_hf_fixture.c checks memwall's loss within 1e-6 relative.
def gen_gpt2_hf():
    import json
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    L, NH, C, maxT, V = 2, 2, 64, 32, 128
    B, T = 2, 24
    torch.manual_seed(20260403)
    cfg = GPT2Config(n_layer=L, n_head=NH, n_embd=C, n_positions=maxT, vocab_size=V,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     bos_token_id=V - 1, eos_token_id=V - 1)
    model = GPT2LMHeadModel(cfg).float().eval()
    with torch.no_grad():  # GPT-2's init (std 0.02) gives near-uniform logits: widen it
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                p.mul_(5.0)
            elif "ln_" in name and name.endswith("bias"):
                p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(7)
    window = torch.randint(0, V, (B, T + 1), generator=g)
    inputs, targets = window[:, :T], window[:, 1:]
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
        loss32 = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)).item()
        # transformers' own loss (labels are shifted inside): the same numbers by another path.
        hf = model(input_ids=window, labels=window).loss.item()
        model64 = GPT2LMHeadModel(cfg).double().eval()
        model64.load_state_dict(model.state_dict())
        l64 = model64(input_ids=inputs).logits
        loss64 = F.cross_entropy(l64.reshape(-1, V), targets.reshape(-1)).item()
    out = os.path.join(FIXTURES, "gpt2_hf_heads32")
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    with open(os.path.join(out, "expected.txt"), "w") as f:
        f.write("# written by scripts/gen_fixtures.py --only gpt2_hf (transformers %s, torch %s)\n"
                % (transformers.__version__, torch.__version__))
        f.write("B %d\nT %d\n" % (B, T))
        f.write("window %s\n" % " ".join(str(int(x)) for x in window.reshape(-1).tolist()))
        f.write("loss_fp32 %.9g\n" % loss32)
        f.write("loss_hf_labels %.9g\n" % hf)
        f.write("loss_fp64 %.12g\n" % loss64)
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    print("wrote %s: config.json (n_head %d, n_embd %d), model.safetensors, loss fp32 %.7f fp64 %.9f"
          % (os.path.relpath(out, ROOT), saved["n_head"], saved["n_embd"], loss32, loss64))


# ---------------------------------------------------------------------------- optim
def gen_optim():
    import torch
    cases = [
        # name, n, steps, lr, beta1, beta2, eps, weight_decay, grad std, seed
        ("default", 300, 100, 1e-3, 0.9, 0.999, 1e-8, 1e-2, 1.0, 1),
        ("fast", 300, 100, 3e-2, 0.8, 0.95, 1e-6, 0.1, 1e-3, 2),
    ]
    for name, n, steps, lr, b1, b2, eps, wd, gstd, seed in cases:
        g = torch.Generator().manual_seed(seed)
        p0 = torch.randn(n, generator=g, dtype=torch.float32)
        grads = torch.randn(steps, n, generator=g, dtype=torch.float32) * gstd
        p = torch.nn.Parameter(p0.clone())
        opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
        for t in range(steps):
            p.grad = grads[t].clone()
            opt.step()
        st = opt.state[p]
        out = os.path.join(FIXTURES, f"adamw_{name}.bin")
        with open(out, "wb") as f:
            f.write(b"MWFX" + struct.pack("<4I", 1, 1, n, steps))
            f.write(struct.pack("<5d", lr, b1, b2, eps, wd))
            for t in (p0, grads.reshape(-1), p.detach(), st["exp_avg"], st["exp_avg_sq"]):
                vals = t.detach().reshape(-1).tolist()  # no numpy needed
                f.write(struct.pack(f"<{len(vals)}f", *vals))
        print(f"wrote {out} ({os.path.getsize(out)} bytes)")


GENERATORS = {
    "gpt2": gen_gpt2,
    "gpt2_hf": gen_gpt2_hf,
    "optim": gen_optim,
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
