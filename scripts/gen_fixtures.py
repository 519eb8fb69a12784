#!/usr/bin/env python3
"""Writes the reference fixtures under tests/fixtures/ with PyTorch (run by a developer; the
test suite itself never needs PyTorch). One function per fixture family; --only picks one.

Optimizer fixtures, tests/fixtures/adamw_<name>.bin, little endian, version 1:
  char magic[4] = "MWFX"; u32 version = 1; u32 kind = 1 (AdamW); u32 n; u32 steps;
  f64 lr, beta1, beta2, eps, weight_decay;
  f32 p0[n]; f32 grads[steps][n]; f32 p[n], m[n], v[n]   (state after `steps` steps)
Data: fixed-seed torch.randn; torch.optim.AdamW (single-tensor path, foreach=False).
"""
import argparse
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXDIR = os.path.join(HERE, "..", "tests", "fixtures")


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
        out = os.path.join(FIXDIR, f"adamw_{name}.bin")
        with open(out, "wb") as f:
            f.write(b"MWFX" + struct.pack("<4I", 1, 1, n, steps))
            f.write(struct.pack("<5d", lr, b1, b2, eps, wd))
            for t in (p0, grads.reshape(-1), p.detach(), st["exp_avg"], st["exp_avg_sq"]):
                vals = t.detach().reshape(-1).tolist()  # no numpy needed
                f.write(struct.pack(f"<{len(vals)}f", *vals))
        print(f"wrote {out} ({os.path.getsize(out)} bytes)")


FAMILIES = {"optim": gen_optim}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(FAMILIES), help="generate one fixture family")
    a = ap.parse_args()
    os.makedirs(FIXDIR, exist_ok=True)
    for name, fn in FAMILIES.items():
        if a.only is None or a.only == name:
            fn()
    return 0


if __name__ == "__main__":
    sys.exit(main())
